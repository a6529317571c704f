/* test_scrape.c -- the /metrics scraper: the pure page parser, the report path into the router
 * (health transitions, applied figures, workers gone meanwhile) without a loop, vLLM's token
 * counters (parsing, increases across restarts, the worker's actual figures switching from the
 * scrape to usage without counting a request twice), vLLM's GET /v1/models (base names, aliases,
 * adapters, the bounds) and its 404 for an unknown model, and one real run on a loop against a
 * loopback HTTP server (its /metrics and /v1/models) and a refused port (removed mid-run), which
 * must leave no libuv handle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "core/config.h"
#include "core/router.h"
#include "net/curlm.h"
#include "net/http_server.h"
#include "serve/scrape.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const page =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 3\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.2\n"
    "vllm:gpu_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.4\n"
    "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"500\"} 1.0\n";

static void test_parse(void **state) {
  (void)state;
  kvr_vllm_metrics_t m;
  assert_int_equal(kvr_vllm_parse_metrics(page, strlen(page), 7, &m), 0);
  assert_int_equal(m.at_ms, 7);
  assert_true(m.num_requests_running == 5.0); /* summed across engines */
  assert_true(m.num_requests_waiting == 4.0);
  assert_true(m.kv_cache_usage > 0.2999 && m.kv_cache_usage < 0.3001); /* mean of both names */
  assert_int_equal(m.num_gpu_blocks, 500);
  assert_int_equal(m.block_size, 16);

  /* No geometry, or half of it, is no geometry; a label must match its whole name. */
  const char *half = "vllm:num_requests_waiting 1\n"
                     "vllm:cache_config_info{xblock_size=\"16\",num_gpu_blocks=\"9\"} 1";
  assert_int_equal(kvr_vllm_parse_metrics(half, strlen(half), 8, &m), 0);
  assert_true(m.num_requests_waiting == 1.0);
  assert_true(m.kv_cache_usage == 0.0);
  assert_int_equal(m.num_gpu_blocks, 0);
  assert_int_equal(m.block_size, 0);

  /* Nothing expected: comments, other series, a name that only starts like one. */
  const char *none = "# vllm:num_requests_running 1\n"
                     "vllm:num_requests_running_total 3\n"
                     "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"9\"} 1\n";
  assert_int_equal(kvr_vllm_parse_metrics(none, strlen(none), 9, &m), KVR_EPARSE);
  assert_int_equal(kvr_vllm_parse_metrics("", 0, 9, &m), KVR_EPARSE);

  /* A worker's absurd samples are ignored, cache usage is clamped to [0, 1]: no NaN, infinity or
   * negative reaches the router (issue 37: a NaN cost kept a worker eligible). */
  const char *absurd = "vllm:num_requests_running{engine=\"0\"} NaN\n"
                       "vllm:num_requests_running{engine=\"1\"} 2\n"
                       "vllm:num_requests_running{engine=\"2\"} +Inf\n"
                       "vllm:num_requests_waiting{engine=\"0\"} -1e300\n"
                       "vllm:num_requests_waiting{engine=\"1\"} -Inf\n"
                       "vllm:num_requests_waiting{engine=\"2\"} 1e300\n"
                       "vllm:kv_cache_usage_perc{engine=\"0\"} 7\n"
                       "vllm:kv_cache_usage_perc{engine=\"1\"} NaN\n";
  assert_int_equal(kvr_vllm_parse_metrics(absurd, strlen(absurd), 10, &m), 0);
  assert_true(m.num_requests_running == 2.0);
  assert_true(m.num_requests_waiting == 0.0);
  assert_true(m.kv_cache_usage == 1.0);
  const char *only_nan = "vllm:num_requests_running NaN\nvllm:kv_cache_usage_perc -0.5\n";
  assert_int_equal(kvr_vllm_parse_metrics(only_nan, strlen(only_nan), 11, &m), KVR_EPARSE);
}

typedef struct {
  kvr_config_t cfg;
  kvr_router_t *r;
} fx_t;

static void fx_open(fx_t *f, const char *const *urls, size_t n, uint64_t interval_ms) {
  kvr_config_init(&f->cfg);
  char err[256];
  for (size_t i = 0; i < n; i++)
    assert_int_equal(kvr_config_add_worker(&f->cfg, urls[i], err, sizeof err), 0);
  f->cfg.scrape_interval_ms = interval_ms;
  f->cfg.fail_threshold = 2;
  f->cfg.connect_timeout_ms = 1000;
  f->r = kvr_router_new(&f->cfg, err, sizeof err);
  assert_non_null(f->r);
}

static void fx_close(fx_t *f) {
  kvr_router_free(f->r);
  kvr_config_free(&f->cfg);
}

/* A /metrics page as vLLM's PrometheusStatLogger writes it for `vllm serve --data-parallel-size 2
 * --api-server-count 1` (v1/metrics/loggers.py: every per-engine series labelled engine="R" and
 * model_name, cache_config_info once per engine, counters with _total and _created samples). */
static const char dp_page[] =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 3.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} 1.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 5.0\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} 0.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 0.625\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} 0.125\n"
    "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.\n"
    "# TYPE vllm:prefix_cache_hits_total counter\n"
    "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 480.0\n"
    "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} 32.0\n"
    "# HELP vllm:prefix_cache_hits_created Prefix cache hits, in terms of number of cached "
    "tokens.\n"
    "# TYPE vllm:prefix_cache_hits_created gauge\n"
    "vllm:prefix_cache_hits_created{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} "
    "1.7645e+09\n"
    "vllm:prefix_cache_hits_created{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B\"} "
    "1.7645e+09\n"
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"0\","
    "num_gpu_blocks=\"29000\",prefix_caching_hash_algo=\"sha256\"} 1.0\n"
    "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",engine=\"1\","
    "num_gpu_blocks=\"27000\",prefix_caching_hash_algo=\"sha256\"} 1.0\n";

/* Per engine: each rank reads its own series; the whole page sums them; a page without engine
 * labels gives a rank nothing; the report path applies each rank's engine. */
static void test_parse_engines(void **state) {
  (void)state;
  kvr_vllm_metrics_t m;
  size_t n = sizeof dp_page - 1;
  assert_int_equal(kvr_vllm_parse_metrics_engine(dp_page, n, 1, 0, &m), 0);
  assert_true(m.num_requests_running == 3.0 && m.num_requests_waiting == 5.0);
  assert_true(m.kv_cache_usage == 0.625);
  assert_int_equal(m.num_gpu_blocks, 29000);
  assert_int_equal(m.block_size, 16);
  assert_int_equal(m.counters.v[KVR_VLLM_HITS], 480);
  assert_int_equal(m.engines, 2);
  assert_int_equal(kvr_vllm_parse_metrics_engine(dp_page, n, 1, 1, &m), 0);
  assert_true(m.num_requests_running == 1.0 && m.num_requests_waiting == 0.0);
  assert_true(m.kv_cache_usage == 0.125);
  assert_int_equal(m.num_gpu_blocks, 27000);
  assert_int_equal(m.counters.v[KVR_VLLM_HITS], 32);
  assert_int_equal(kvr_vllm_parse_metrics_engine(dp_page, n, 1, 2, &m), KVR_EPARSE);
  assert_int_equal(kvr_vllm_parse_metrics(dp_page, n, 1, &m), 0);
  assert_true(m.num_requests_running == 4.0 && m.kv_cache_usage == 0.375);
  assert_int_equal(m.counters.v[KVR_VLLM_HITS], 512);
  assert_int_equal(m.engines, 2);
  /* engine="10" is not engine="1"; a label whose name only ends in engine is not it. */
  const char *tricky = "vllm:num_requests_running{engine=\"10\"} 4\n"
                       "vllm:num_requests_running{xengine=\"1\"} 6\n"
                       "vllm:num_requests_running{model_name=\"a}b\",engine=\"1\"} 8\n";
  assert_int_equal(kvr_vllm_parse_metrics_engine(tricky, strlen(tricky), 1, 1, &m), KVR_EPARSE);
  assert_int_equal(kvr_vllm_parse_metrics_engine(tricky, strlen(tricky), 1, 10, &m), 0);
  assert_true(m.num_requests_running == 4.0);
  /* vllm:lora_requests_info is the server's (no engine label): every rank reads it. */
  const char *lora = "vllm:num_requests_running{engine=\"1\"} 2\n"
                     "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql\","
                     "waiting_lora_adapters=\"\"} 100\n";
  assert_int_equal(kvr_vllm_parse_metrics_engine(lora, strlen(lora), 1, 1, &m), 0);
  assert_true(m.lora.present);
  assert_true(kvr_vllm_lora_list_has(m.lora.running, "sql"));
  const char *bare = "vllm:num_requests_running 4\n";
  assert_int_equal(kvr_vllm_parse_metrics_engine(bare, strlen(bare), 1, 0, &m), KVR_EPARSE);
  assert_int_equal(kvr_vllm_parse_metrics(bare, strlen(bare), 1, &m), 0);
  assert_int_equal(m.engines, 0);

  fx_t f;
  kvr_config_init(&f.cfg);
  char err[256];
  assert_int_equal(
      kvr_config_add_worker_spec(&f.cfg, "http://127.0.0.1:1,dp_size=2", err, sizeof err), 0);
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  for (int k = 0; k < 2; k++)
    assert_int_equal(kvr__scrape_report(f.r, f.r->slots[k]->id, true, true, dp_page, n, 9), 0);
  assert_true(f.r->slots[0]->num_requests_waiting == 5.0);
  assert_true(f.r->slots[1]->num_requests_running == 1.0);
  assert_int_equal(f.r->slots[0]->num_gpu_blocks, 29000);
  assert_int_equal(f.r->slots[1]->num_gpu_blocks, 27000);
  fx_close(&f);
}

/* The path every finished probe takes, fed by hand. */
static void test_report_path(void **state) {
  (void)state;
  static const char *const urls[] = {"http://127.0.0.1:1"};
  fx_t f;
  fx_open(&f, urls, 1, 0);
  const kvr_worker_t *w = f.r->slots[0];
  uint32_t id = w->id;
  /* Connection failures count towards DOWN; the page of a failed probe is never read. */
  assert_int_equal(kvr__scrape_report(f.r, id, false, false, NULL, 0, 1), 0);
  assert_int_equal(w->state, KVR_WORKER_UP);
  assert_int_equal(kvr__scrape_report(f.r, id, false, true, page, strlen(page), 2), 0);
  assert_int_equal(w->state, KVR_WORKER_DOWN);
  assert_false(w->metrics_seen);
  /* Reachable but not a 200 (a busy API process): up again, figures still unknown. */
  assert_int_equal(kvr__scrape_report(f.r, id, true, false, "busy", 4, 3), 0);
  assert_int_equal(w->state, KVR_WORKER_UP);
  assert_false(w->metrics_seen);
  /* A 200 page: applied, cache capacity from the geometry (500 x 16 tokens in 16-token blocks). */
  assert_int_equal(kvr__scrape_report(f.r, id, true, true, page, strlen(page), 4), 0);
  assert_true(w->metrics_seen);
  assert_int_equal(w->scraped_at_ms, 4);
  assert_true(w->num_requests_running == 5.0);
  assert_int_equal(w->cache_capacity_blocks, 500);
  assert_int_equal(kvr_cache_index_capacity(f.r->index, 0), 500);
  /* A 200 page with nothing expected: health counts, the last figures stay. */
  kvr__scrape_report(f.r, id, false, false, NULL, 0, 5);
  assert_int_equal(w->consecutive_failures, 1);
  assert_int_equal(kvr__scrape_report(f.r, id, true, true, "x 1\n", 4, 6), KVR_EPARSE);
  assert_int_equal(w->consecutive_failures, 0);
  assert_int_equal(w->scraped_at_ms, 4);
  /* The worker is removed while a probe is out: its report finds nothing. */
  assert_int_equal(kvr_router_drain_worker(f.r, id), 0);
  assert_int_equal(kvr__scrape_report(f.r, id, true, true, page, strlen(page), 7), KVR_ENOENT);
  fx_close(&f);
}

/* ---- vLLM's token counters --------------------------------------------------------------------
 */

/* A page with the counters of two engines, as prometheus_client writes them (_total samples beside
 * _created ones, which are not counters of tokens). */
static const char *counter_page(char *buf, size_t cap, uint64_t hits, uint64_t queries,
                                uint64_t prompt, uint64_t gen) {
  snprintf(buf, cap,
           "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n"
           "# TYPE vllm:prefix_cache_hits_total counter\n"
           "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} %llu.0\n"
           "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 0.0\n"
           "vllm:prefix_cache_hits_created{engine=\"0\",model_name=\"m\"} 1.7e9\n"
           "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} %llu.0\n"
           "vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} %llu.0\n"
           "vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} %llu.0\n",
           (unsigned long long)hits, (unsigned long long)queries, (unsigned long long)prompt,
           (unsigned long long)gen);
  return buf;
}

static void test_parse_counters(void **state) {
  (void)state;
  kvr_vllm_metrics_t m;
  const char *two = "vllm:num_requests_running 1\n"
                    "vllm:prefix_cache_hits_total{engine=\"0\"} 100\n"
                    "vllm:prefix_cache_hits_total{engine=\"1\"} 28\n"
                    "vllm:prefix_cache_hits_created{engine=\"0\"} 1700000000\n"
                    "vllm:gpu_prefix_cache_hits_total{engine=\"0\"} 999\n"
                    "vllm:prefix_cache_queries_total{engine=\"0\"} 1e3\n"
                    "vllm:prompt_tokens_total{engine=\"0\"} NaN\n"
                    "vllm:generation_tokens_total{engine=\"0\"} -4\n";
  assert_int_equal(kvr_vllm_parse_metrics(two, strlen(two), 1, &m), 0);
  assert_int_equal(m.counters.v[KVR_VLLM_HITS], 128); /* summed over engines; not the others */
  assert_int_equal(m.counters.v[KVR_VLLM_QUERIES], 1000);
  /* A value no counter of tokens has (NaN, negative) is absent. */
  assert_int_equal(m.counters.present, (1u << KVR_VLLM_HITS) | (1u << KVR_VLLM_QUERIES));
  /* A page of counters alone is not a load page. */
  const char *alone = "vllm:prefix_cache_hits_total 5\n";
  assert_int_equal(kvr_vllm_parse_metrics(alone, strlen(alone), 1, &m), KVR_EPARSE);
}

static void advance(kvr_vllm_counter_state_t *st, unsigned present, uint64_t h, uint64_t q,
                    uint64_t p, uint64_t g, uint64_t *d) {
  kvr_vllm_counters_t cur = {.v = {h, q, p, g}, .present = present};
  kvr_vllm_counters_advance(st, &cur, d);
}

static void test_counters_advance(void **state) {
  (void)state;
  const unsigned all = (1u << KVR_VLLM_NCOUNTERS) - 1;
  kvr_vllm_counter_state_t st = {0};
  uint64_t d[KVR_VLLM_NCOUNTERS];
  /* The first page is the baseline: what the worker counted before is not ours. */
  advance(&st, all, 50, 100, 100, 7, d);
  assert_int_equal(d[KVR_VLLM_HITS] + d[KVR_VLLM_QUERIES] + d[KVR_VLLM_PROMPT], 0);
  assert_int_equal(st.sum[KVR_VLLM_HITS], 0);
  /* Increases. */
  advance(&st, all, 80, 160, 160, 10, d);
  assert_int_equal(d[KVR_VLLM_HITS], 30);
  assert_int_equal(d[KVR_VLLM_QUERIES], 60);
  assert_int_equal(d[KVR_VLLM_GENERATION], 3);
  /* Restart: hits went back, so every counter counts from zero again: the increase is the new
   * value, even for a counter that is above its last value already (prompt), never negative. */
  assert_false(kvr_vllm_counters_advance(
      &st, &(kvr_vllm_counters_t){.v = {80, 160, 160, 10}, .present = all}, d));
  advance(&st, all, 16, 40, 200, 2, d);
  assert_int_equal(st.resets, 1);
  assert_int_equal(d[KVR_VLLM_HITS], 16);
  assert_int_equal(d[KVR_VLLM_QUERIES], 40);
  assert_int_equal(d[KVR_VLLM_PROMPT], 200);
  assert_int_equal(d[KVR_VLLM_GENERATION], 2);
  assert_int_equal(st.sum[KVR_VLLM_HITS], 30 + 16);
  assert_int_equal(st.sum[KVR_VLLM_PROMPT], 60 + 200);
  /* A counter missing from a page keeps its last value; when it comes back, only its increase
   * since then counts. */
  advance(&st, 1u << KVR_VLLM_HITS, 20, 0, 0, 0, d);
  assert_int_equal(d[KVR_VLLM_HITS], 4);
  assert_int_equal(d[KVR_VLLM_PROMPT], 0);
  assert_int_equal(st.last.v[KVR_VLLM_PROMPT], 200);
  advance(&st, all, 20, 41, 210, 2, d);
  assert_int_equal(d[KVR_VLLM_PROMPT], 10);
  assert_int_equal(d[KVR_VLLM_QUERIES], 1);
  assert_int_equal(st.resets, 1);
}

static uint64_t fake_now_ns;
static uint64_t fake_clock(void *ctx) {
  (void)ctx;
  return fake_now_ns;
}

/* One request to the only worker dispatched at at_ms, its prompt predicted 40% cached. */
static void dispatch_at(fx_t *f, uint64_t at_ms, kvr_router_dispatch_t *d) {
  fake_now_ns = at_ms * 1000000u;
  assert_non_null(kvr_router_on_dispatch(f->r, 0, 100, 0, d));
  d->predicted_cached = 40; /* what a match would have given; read by on_usage only */
}

/* A page of counters taken at at_ms. */
static void scrape_at(fx_t *f, uint64_t at_ms, uint64_t h, uint64_t q, uint64_t p, uint64_t g) {
  char buf[1024];
  fake_now_ns = at_ms * 1000000u;
  counter_page(buf, sizeof buf, h, q, p, g);
  assert_int_equal(
      kvr__scrape_report(f->r, f->r->slots[0]->id, true, true, buf, strlen(buf), at_ms), 0);
}

/* The worker's actual figures: scraped increases until usage shows them, then usage only, with no
 * request counted by both: a page waits until the requests open when it came have ended. */
static void test_actual_sources(void **state) {
  (void)state;
  static const char *const urls[] = {"http://127.0.0.1:1"};
  fx_t f;
  fx_open(&f, urls, 1, 0);
  kvr_router_set_clock(f.r, fake_clock, NULL);
  const kvr_worker_t *w = f.r->slots[0];
  kvr_router_dispatch_t d;
  scrape_at(&f, 1000, 500, 900, 900, 50); /* baseline */
  assert_int_equal(w->actual_cached_tokens_total, 0);
  /* No usage (a stream that did not ask): the scrape fills the figures. */
  dispatch_at(&f, 1100, &d);
  kvr_router_on_usage(f.r, &d, NULL);
  kvr_router_on_end(f.r, &d);
  scrape_at(&f, 1200, 560, 1000, 1000, 58); /* nothing open: committed at once */
  assert_false(w->cached_source.usage);
  assert_false(w->tokens_source.usage);
  assert_int_equal(w->actual_cached_tokens_total, 60);
  assert_int_equal(w->actual_prompt_tokens_total, 100);
  assert_int_equal(w->actual_generation_tokens_total, 8);
  assert_int_equal(f.r->prompt_tokens_total, 100);
  assert_int_equal(w->answers_without_usage_total, 1);
  assert_int_equal(w->window_prompt_estimate, 100); /* the prediction over the same scrapes */
  /* A page that comes while a request is open waits for it. */
  dispatch_at(&f, 1300, &d);
  scrape_at(&f, 1400, 590, 1100, 1100, 62);
  assert_int_equal(w->npending, 1);
  assert_int_equal(w->actual_cached_tokens_total, 60);
  /* Its answer carries usage without details (vLLM without --enable-prompt-tokens-details): the
   * token counts move to usage and count it whole; the page, committed when it ends, adds its
   * hits (the cached tokens stay on the scrape) but not its tokens again. */
  kvr_router_usage_t plain = {.prompt_tokens = 100, .completion_tokens = 8};
  kvr_router_on_usage(f.r, &d, &plain);
  assert_true(w->tokens_source.usage);
  assert_false(w->cached_source.usage);
  assert_int_equal(w->actual_prompt_tokens_total, 200);
  kvr_router_on_end(f.r, &d);
  assert_int_equal(w->npending, 0);
  assert_int_equal(w->actual_cached_tokens_total, 90);
  assert_int_equal(w->actual_prompt_tokens_total, 200);
  assert_int_equal(w->actual_generation_tokens_total, 16);
  assert_int_equal(f.r->prompt_tokens_total, 200);
  /* Details: the cached tokens move to usage the same way. */
  kvr_router_usage_t det = {
      .prompt_tokens = 100, .completion_tokens = 8, .cached_tokens = 64, .has_details = true};
  dispatch_at(&f, 1500, &d);
  scrape_at(&f, 1600, 654, 1200, 1200, 70);
  kvr_router_on_usage(f.r, &d, &det);
  kvr_router_on_end(f.r, &d);
  assert_true(w->cached_source.usage);
  assert_int_equal(w->actual_cached_tokens_total, 90 + 64);
  assert_int_equal(w->actual_prompt_tokens_total, 300);
  /* Later pages add nothing, even after a restart (counted as one). */
  scrape_at(&f, 1700, 10, 20, 20, 1);
  assert_int_equal(w->counters.resets, 1);
  assert_int_equal(w->counters.sum[KVR_VLLM_HITS], 154 + 10);
  assert_int_equal(w->actual_cached_tokens_total, 90 + 64);
  assert_int_equal(w->actual_prompt_tokens_total, 300);
  kvr_router_set_clock(f.r, NULL, NULL);
  fx_close(&f);

  /* A request open across more than KVR_PENDING_PAGES pages: the oldest commit early, and its
   * usage, dispatched before the last committed page, is then left to the scrape. */
  fx_open(&f, urls, 1, 0);
  kvr_router_set_clock(f.r, fake_clock, NULL);
  w = f.r->slots[0];
  scrape_at(&f, 1000, 0, 0, 0, 0);
  dispatch_at(&f, 1001, &d);
  for (uint64_t i = 1; i <= KVR_PENDING_PAGES + 2; i++)
    scrape_at(&f, 1001 + i, 0, 100, 100, i); /* its prompt, then one token a page */
  assert_int_equal(w->npending, KVR_PENDING_PAGES);
  assert_int_equal(w->actual_prompt_tokens_total, 100); /* two pages committed early */
  assert_int_equal(w->actual_generation_tokens_total, 2);
  kvr_router_usage_t whole = {.prompt_tokens = 100, .completion_tokens = KVR_PENDING_PAGES + 2};
  kvr_router_on_usage(f.r, &d, &whole);
  kvr_router_on_end(f.r, &d);
  assert_true(w->tokens_source.usage);
  assert_int_equal(w->actual_prompt_tokens_total, 100); /* not twice */
  assert_int_equal(w->actual_generation_tokens_total, 2);
  kvr_router_set_clock(f.r, NULL, NULL);
  fx_close(&f);
}

/* ---- one real run on a loop -------------------------------------------------------------------
 */

typedef struct {
  uv_loop_t loop;
  uv_timer_t check;
  fx_t f;
  kvr_curlm_t *curlm;
  kvr_scrape_t *scrape;
  kvr_http_server_t *srv;
  int metrics_gets, models_gets;
  int gets_at_removal; /* -1 until the refused worker was removed */
  int server_closed;
  bool timed_out;
  uint64_t deadline_ms;
} loop_fx_t;

static void on_metrics_request(kvr_http_req_t *req, void *data) {
  loop_fx_t *t = data;
  static const char models[] = "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"root\":\"/m\","
                               "\"max_model_len\":4096},{\"id\":\"m-lora\",\"parent\":\"m\"}]}";
  if (strcmp(req->path, "/metrics") == 0) {
    t->metrics_gets++;
    kvr_http_respond(req, 200, "text/plain", NULL, page, strlen(page));
  } else if (strcmp(req->path, "/v1/models") == 0) {
    t->models_gets++;
    kvr_http_respond(req, 200, "application/json", NULL, models, sizeof models - 1);
  } else {
    kvr_http_respond(req, 404, "text/plain", NULL, "no\n", 3);
  }
}

static void on_server_closed(void *data) {
  loop_fx_t *t = data;
  t->server_closed = 1;
}

static void on_check_closed(uv_handle_t *h) {
  (void)h;
}

static void shut_down(loop_fx_t *t) {
  uv_timer_stop(&t->check);
  uv_close((uv_handle_t *)&t->check, on_check_closed);
  kvr_scrape_close(t->scrape);
  kvr_curlm_close(t->curlm);
  kvr_http_server_close(t->srv, on_server_closed, t);
}

/* Once the live worker was scraped and the refused one is DOWN, removes the refused one (its probe
 * may be out) and stops after two more scrapes of the live one, or at the deadline. */
static void on_check(uv_timer_t *h) {
  loop_fx_t *t = h->data;
  const kvr_worker_t *live = t->f.r->slots[0], *dead = t->f.r->slots[1];
  if (t->gets_at_removal < 0 && live->metrics_seen && dead->state == KVR_WORKER_DOWN) {
    t->gets_at_removal = t->metrics_gets;
    assert_int_equal(kvr_router_drain_worker(t->f.r, dead->id), 0);
    assert_null(t->f.r->slots[1]);
  }
  bool done =
      t->gets_at_removal >= 0 && t->metrics_gets >= t->gets_at_removal + 2 && live->models_known;
  t->timed_out = !done && kvr_now_ms() > (double)t->deadline_ms;
  if (done || t->timed_out)
    shut_down(t);
}

static void test_scraper_on_loop(void **state) {
  (void)state;
  loop_fx_t t;
  memset(&t, 0, sizeof t);
  t.gets_at_removal = -1;
  assert_int_equal(uv_loop_init(&t.loop), 0);
  kvr_http_limits_t limits;
  kvr_http_limits_default(&limits);
  t.srv = kvr_http_server_new(&t.loop, &limits, on_metrics_request, &t);
  char err[256];
  assert_int_equal(kvr_http_server_listen(t.srv, "127.0.0.1:0", err, sizeof err), 0);
  char live[64];
  snprintf(live, sizeof live, "http://127.0.0.1:%d", kvr_http_server_port(t.srv));
  const char *const urls[] = {live, "http://127.0.0.1:1"}; /* nothing listens on port 1 */
  fx_open(&t.f, urls, 2, 20);
  t.curlm = kvr_curlm_new(&t.loop);
  assert_non_null(t.curlm);
  t.scrape = kvr_scrape_new(&t.loop, t.curlm, t.f.r);
  assert_non_null(t.scrape);
  t.deadline_ms = (uint64_t)kvr_now_ms() + 10000;
  uv_timer_init(&t.loop, &t.check);
  t.check.data = &t;
  uv_timer_start(&t.check, on_check, 10, 10);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  assert_false(t.timed_out);
  assert_true(t.server_closed);
  const kvr_worker_t *w = t.f.r->slots[0];
  assert_true(w->num_requests_running == 5.0);
  assert_int_equal(w->cache_capacity_blocks, 500);
  assert_int_equal(w->max_model_len, 4096); /* its GET /v1/models: two ids */
  assert_true(kvr_router_worker_serves(w, "m-lora"));
  assert_false(kvr_router_worker_serves(w, "other"));
  assert_null(t.f.r->slots[1]);
  kvr_http_server_free(t.srv);
  assert_int_equal(uv_loop_close(&t.loop), 0);
  fx_close(&t.f);
}

/* Data parallel on a loop: one server, dp_size=2. Its two rank workers share one /metrics probe
 * and one /v1/models probe (the lead's), and each takes its own engine's series. */
static void on_check_dp(uv_timer_t *h) {
  loop_fx_t *t = h->data;
  const kvr_worker_t *a = t->f.r->slots[0], *b = t->f.r->slots[1];
  bool done = a->metrics_seen && b->metrics_seen && a->models_known && b->models_known &&
              t->metrics_gets >= 6;
  t->timed_out = !done && kvr_now_ms() > (double)t->deadline_ms;
  if (done || t->timed_out)
    shut_down(t);
}

static void test_scraper_dp_on_loop(void **state) {
  (void)state;
  loop_fx_t t;
  memset(&t, 0, sizeof t);
  assert_int_equal(uv_loop_init(&t.loop), 0);
  kvr_http_limits_t limits;
  kvr_http_limits_default(&limits);
  t.srv = kvr_http_server_new(&t.loop, &limits, on_metrics_request, &t);
  char err[256];
  assert_int_equal(kvr_http_server_listen(t.srv, "127.0.0.1:0", err, sizeof err), 0);
  char spec[80];
  snprintf(spec, sizeof spec, "http://127.0.0.1:%d,dp_size=2", kvr_http_server_port(t.srv));
  kvr_config_init(&t.f.cfg);
  assert_int_equal(kvr_config_add_worker_spec(&t.f.cfg, spec, err, sizeof err), 0);
  t.f.cfg.scrape_interval_ms = 20;
  t.f.r = kvr_router_new(&t.f.cfg, err, sizeof err);
  assert_non_null(t.f.r);
  t.curlm = kvr_curlm_new(&t.loop);
  t.scrape = kvr_scrape_new(&t.loop, t.curlm, t.f.r);
  uint64_t t0 = (uint64_t)kvr_now_ms();
  t.deadline_ms = t0 + 10000;
  uv_timer_init(&t.loop, &t.check);
  t.check.data = &t;
  uv_timer_start(&t.check, on_check_dp, 10, 10);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  assert_false(t.timed_out);
  const kvr_worker_t *a = t.f.r->slots[0], *b = t.f.r->slots[1];
  assert_true(a->num_requests_running == 2.0 && a->num_requests_waiting == 4.0);
  assert_true(b->num_requests_running == 3.0 && b->num_requests_waiting == 0.0);
  assert_true(a->kv_cache_usage > 0.1999 && a->kv_cache_usage < 0.2001);
  assert_true(b->kv_cache_usage > 0.3999 && b->kv_cache_usage < 0.4001);
  assert_true(kvr_router_worker_serves(b, "m-lora") && !kvr_router_worker_serves(b, "x"));
  assert_int_equal(t.models_gets, 1); /* one list for both ranks (the next is due in 30 s) */
  /* One /metrics GET per tick for the URL, not one per rank: at most one per 20 ms tick, + 1. */
  uint64_t ticks = ((uint64_t)kvr_now_ms() - t0) / 20 + 1;
  assert_true((uint64_t)t.metrics_gets <= ticks + 1);
  kvr_http_server_free(t.srv);
  assert_int_equal(uv_loop_close(&t.loop), 0);
  fx_close(&t.f);
}

/* GET /v1/models as vLLM answers it: the smallest max_model_len over data[]. */
static void test_parse_models(void **state) {
  (void)state;
  const char *vllm = "{\"object\":\"list\",\"data\":[{\"id\":\"a\",\"object\":\"model\","
                     "\"max_model_len\":32768},{\"id\":\"b\",\"max_model_len\":8192}]}";
  uint64_t len = 0;
  assert_int_equal(kvr_vllm_parse_models(vllm, strlen(vllm), &len), 0);
  assert_int_equal(len, 8192);
  const char *bad[] = {"",
                       "not json",
                       "{\"data\":{}}",
                       "{\"data\":[]}",
                       "{\"data\":[{\"id\":\"a\"}]}",
                       "{\"data\":[{\"max_model_len\":0}]}",
                       "{\"data\":[{\"max_model_len\":\"4096\"}]}",
                       "[1,2]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    len = 7;
    assert_int_equal(kvr_vllm_parse_models(bad[i], strlen(bad[i]), &len), KVR_EPARSE);
    assert_int_equal(len, 7);
  }
}

/* A vLLM GET /v1/models with --served-model-name llama-70b llama (two base cards, one root) and
 * --lora-modules sql-lora=/adapters/sql (parent llama-70b, max_model_len null), as
 * openai/engine/protocol.py's ModelCard serializes (nulls kept): every id kept in order with its
 * root, parent and context, each card's JSON as given; a repeated id once. */
static void test_parse_model_list(void **state) {
  (void)state;
  const char *vllm =
      "{\"object\":\"list\",\"data\":["
      "{\"id\":\"llama-70b\",\"object\":\"model\",\"created\":1751443200,\"owned_by\":\"vllm\","
      "\"root\":\"/models/Llama-3.3-70B\",\"parent\":null,\"max_model_len\":131072,"
      "\"permission\":[{\"id\":\"modelperm-9f\",\"object\":\"model_permission\",\"created\":"
      "1751443200,\"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,"
      "\"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,"
      "\"organization\":\"*\",\"group\":null,\"is_blocking\":false}]},"
      "{\"id\":\"llama\",\"object\":\"model\",\"created\":1751443200,\"owned_by\":\"vllm\","
      "\"root\":\"/models/Llama-3.3-70B\",\"parent\":null,\"max_model_len\":131072,"
      "\"permission\":[]},"
      "{\"id\":\"sql-lora\",\"object\":\"model\",\"created\":1751443200,\"owned_by\":\"vllm\","
      "\"root\":\"/adapters/sql\",\"parent\":\"llama-70b\",\"max_model_len\":null,"
      "\"permission\":[]},"
      "{\"id\":\"llama\",\"object\":\"model\",\"max_model_len\":9},"
      "{\"object\":\"model\"},{\"id\":7},{\"id\":\"\"},[1]]}";
  kvr_vllm_models_t m;
  assert_int_equal(kvr_vllm_parse_model_list(vllm, strlen(vllm), &m), 0);
  assert_int_equal(m.n, 3);
  assert_true(m.complete);
  assert_int_equal(m.max_model_len, 131072); /* the repeated llama's 9 is not read */
  assert_string_equal(m.v[0].id, "llama-70b");
  assert_string_equal(m.v[1].id, "llama");
  assert_string_equal(m.v[1].root, m.v[0].root);
  assert_null(m.v[1].parent);
  assert_string_equal(m.v[2].id, "sql-lora");
  assert_string_equal(m.v[2].root, "/adapters/sql");
  assert_string_equal(m.v[2].parent, "llama-70b");
  assert_int_equal(m.v[2].max_model_len, 0);
  assert_non_null(strstr(vllm, m.v[0].card)); /* the card as given, byte for byte */
  assert_non_null(strstr(vllm, m.v[2].card));
  assert_ptr_equal(kvr_vllm_models_find(&m, "sql-lora"), &m.v[2]);
  assert_null(kvr_vllm_models_find(&m, "Llama"));
  assert_null(kvr_vllm_models_find(&m, NULL));
  kvr_vllm_models_free(&m);
  kvr_vllm_models_free(&m); /* twice: empty */
  uint64_t len = 0;
  assert_int_equal(kvr_vllm_parse_models(vllm, strlen(vllm), &len), 0); /* the context alone */
  assert_int_equal(len, 131072);
  /* Bounds: 64 ids kept, the list then incomplete; an id over 256 bytes not kept (incomplete);
   * a card over 2 KiB kept as its four fields. */
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "{\"data\":[");
  for (int i = 0; i < 70; i++)
    kvr_buf_printf(&b, "%s{\"id\":\"m%d\",\"max_model_len\":%d}", i ? "," : "", i, 100 + i);
  kvr_buf_puts(&b, "]}");
  assert_int_equal(kvr_vllm_parse_model_list(b.data, b.len, &m), 0);
  assert_int_equal(m.n, KVR_VLLM_MODELS_MAX);
  assert_false(m.complete);
  assert_string_equal(m.v[63].id, "m63");
  kvr_vllm_models_free(&m);
  kvr_buf_reset(&b);
  kvr_buf_puts(&b, "{\"data\":[{\"id\":\"");
  for (int i = 0; i < 257; i++)
    kvr_buf_puts(&b, "x");
  kvr_buf_puts(&b, "\"},{\"id\":\"big\",\"root\":\"r\",\"max_model_len\":5,\"pad\":\"");
  for (int i = 0; i < 3000; i++)
    kvr_buf_puts(&b, "p");
  kvr_buf_puts(&b, "\"}]}");
  assert_int_equal(kvr_vllm_parse_model_list(b.data, b.len, &m), 0);
  assert_int_equal(m.n, 1);
  assert_false(m.complete);
  assert_string_equal(m.v[0].card, "{\"id\":\"big\",\"object\":\"model\",\"root\":\"r\","
                                   "\"parent\":null,\"max_model_len\":5}");
  kvr_vllm_models_free(&m);
  kvr_buf_free(&b);
  const char *bad[] = {
      "", "not json", "{\"data\":{}}", "{\"data\":[]}", "{\"data\":[{\"id\":1}]}", "[1,2]"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(kvr_vllm_parse_model_list(bad[i], strlen(bad[i]), &m), KVR_EPARSE);
    assert_int_equal(m.n, 0);
    assert_null(m.v);
  }
}

/* vLLM's 404 for a model it does not serve, byte for byte (the entrypoints' serve/engine/
 * serving.py; openai/engine/protocol.py's ErrorResponse: no top-level object, code the status), and
 * the Messages API's shape of it (vLLM's type name). */
static void test_model_not_found(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_vllm_model_not_found(&b, "gpt-4", false);
  assert_string_equal(b.data, "{\"error\":{\"message\":\"The model `gpt-4` does not exist.\","
                              "\"type\":\"NotFoundError\",\"param\":\"model\",\"code\":404}}");
  kvr_buf_reset(&b);
  kvr_vllm_model_not_found(&b, "a\"b", true);
  assert_string_equal(b.data, "{\"type\":\"error\",\"error\":{\"type\":\"NotFoundError\","
                              "\"message\":\"The model `a\\\"b` does not exist.\"}}");
  kvr_buf_free(&b);
}

/* vllm:lora_requests_info as vLLM's loggers.py writes it (one series per label set ever seen,
 * the value the time of its update): the newest series wins wherever it stands on the page; its
 * lists, max_lora, escapes; absent without LoRA; a page of it alone is no load page. */
static void test_parse_lora_info(void **state) {
  (void)state;
  const char *info =
      "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
      "# TYPE vllm:lora_requests_info gauge\n"
      "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"sql-lora,chat\","
      "waiting_lora_adapters=\"x\"} 1.7514432e+09\n"
      "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"chat\","
      "waiting_lora_adapters=\"\"} 1.751443205e+09\n"
      "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\","
      "waiting_lora_adapters=\"\"} 1.751443201e+09\n"
      "vllm:num_requests_running 1\n";
  kvr_vllm_metrics_t m;
  assert_int_equal(kvr_vllm_parse_metrics(info, strlen(info), 1, &m), 0);
  assert_true(m.lora.present);
  assert_false(m.lora.cut);
  assert_int_equal(m.lora.max_lora, 2);
  assert_string_equal(m.lora.running, "chat"); /* the second series: the largest value */
  assert_string_equal(m.lora.waiting, "");
  assert_true(kvr_vllm_lora_list_has(m.lora.running, "chat"));
  assert_false(kvr_vllm_lora_list_has(m.lora.running, "cha"));
  assert_true(kvr_vllm_lora_list_has("sql-lora,chat", "sql-lora"));
  assert_true(kvr_vllm_lora_list_has("sql-lora,chat", "chat"));
  assert_false(kvr_vllm_lora_list_has("sql-lora,chat", ""));
  assert_false(kvr_vllm_lora_list_has("", "chat"));
  assert_true(kvr_vllm_lora_list_has("sql-lora, chat ", "chat"));
  assert_true(kvr_vllm_lora_list_has(" sql-lora,chat", "sql-lora"));
  assert_false(kvr_vllm_lora_list_has("sql-lora, chat", " chat"));
  /* Escaped label values (a name with a quote, a backslash) and labels in another order. */
  const char *esc = "vllm:lora_requests_info{waiting_lora_adapters=\"w\\\\1\","
                    "running_lora_adapters=\"a\\\"b,c\",max_lora=\"4\"} 3\n"
                    "vllm:num_requests_waiting 0\n";
  assert_int_equal(kvr_vllm_parse_metrics(esc, strlen(esc), 1, &m), 0);
  assert_string_equal(m.lora.running, "a\"b,c");
  assert_string_equal(m.lora.waiting, "w\\1");
  assert_int_equal(m.lora.max_lora, 4);
  /* Without LoRA: absent. A page of it alone is not a load page. */
  const char *plain = "vllm:num_requests_running 0\n";
  assert_int_equal(kvr_vllm_parse_metrics(plain, strlen(plain), 1, &m), 0);
  assert_false(m.lora.present);
  const char *alone = "vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a\","
                      "waiting_lora_adapters=\"\"} 5\n";
  assert_int_equal(kvr_vllm_parse_metrics(alone, strlen(alone), 1, &m), KVR_EPARSE);
  /* A series without the adapter labels, or with a value that never closes, is not vLLM's. */
  const char *odd = "vllm:lora_requests_info{max_lora=\"1\"} 9\n"
                    "vllm:lora_requests_info{running_lora_adapters=\"a} 9\n"
                    "vllm:num_requests_running 0\n";
  assert_int_equal(kvr_vllm_parse_metrics(odd, strlen(odd), 1, &m), 0);
  assert_false(m.lora.present);
  /* A running list over KVR_VLLM_LORA_NAMES_MAX: cut after its last whole name. */
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "vllm:lora_requests_info{max_lora=\"64\",running_lora_adapters=\"");
  for (int i = 0; i < 200; i++)
    kvr_buf_printf(&b, "%sad%03d", i ? "," : "", i);
  kvr_buf_puts(&b, "\",waiting_lora_adapters=\"\"} 7\nvllm:num_requests_running 3\n");
  assert_int_equal(kvr_vllm_parse_metrics(b.data, b.len, 1, &m), 0);
  assert_true(m.lora.cut);
  assert_true(strlen(m.lora.running) < KVR_VLLM_LORA_NAMES_MAX);
  assert_true(kvr_vllm_lora_list_has(m.lora.running, "ad000"));
  assert_true(kvr_vllm_lora_list_has(m.lora.running, "ad169")); /* 170 names of 6 bytes fit */
  assert_false(kvr_vllm_lora_list_has(m.lora.running, "ad199"));
  assert_int_equal(m.lora.running[strlen(m.lora.running) - 1], '9'); /* no half name, no comma */
  kvr_buf_free(&b);
}

/* A card the router adds for an adapter it loaded: vLLM's shape, found by id, listed once; the
 * bounds of a list. */
static void test_models_add_adapter(void **state) {
  (void)state;
  kvr_vllm_models_t m = {0};
  assert_int_equal(kvr_vllm_models_add_adapter(&m, "dyn", "/adapters/dyn", "base", 7), 0);
  assert_int_equal(m.n, 1);
  assert_true(m.complete);
  const kvr_vllm_model_t *c = kvr_vllm_models_find(&m, "dyn");
  assert_non_null(c);
  assert_string_equal(c->parent, "base");
  assert_string_equal(c->root, "/adapters/dyn");
  assert_int_equal(c->max_model_len, 0);
  assert_string_equal(c->card, "{\"id\":\"dyn\",\"object\":\"model\",\"created\":7,\"owned_by\":"
                               "\"vllm\",\"root\":\"/adapters/dyn\",\"parent\":\"base\","
                               "\"max_model_len\":null}");
  assert_int_equal(kvr_vllm_models_add_adapter(&m, "dyn", "/elsewhere", "base", 8), 1);
  assert_int_equal(m.n, 1);
  assert_int_equal(kvr_vllm_models_add_adapter(&m, "orphan", "/a", NULL, 8), 0);
  assert_null(kvr_vllm_models_find(&m, "orphan")->parent);
  for (int i = 2; i < KVR_VLLM_MODELS_MAX; i++) {
    char id[16];
    snprintf(id, sizeof id, "a%d", i);
    assert_int_equal(kvr_vllm_models_add_adapter(&m, id, "/p", "base", 1), 0);
  }
  assert_int_equal(kvr_vllm_models_add_adapter(&m, "one-more", "/p", "base", 1), KVR_ELIMIT);
  assert_false(m.complete);
  assert_int_equal(m.n, KVR_VLLM_MODELS_MAX);
  kvr_vllm_models_free(&m);
}

KVR_TEST_MAIN(cmocka_unit_test(test_parse), cmocka_unit_test(test_parse_engines),
              cmocka_unit_test(test_parse_models), cmocka_unit_test(test_parse_lora_info),
              cmocka_unit_test(test_models_add_adapter), cmocka_unit_test(test_parse_model_list),
              cmocka_unit_test(test_model_not_found), cmocka_unit_test(test_parse_counters),
              cmocka_unit_test(test_counters_advance), cmocka_unit_test(test_actual_sources),
              cmocka_unit_test(test_report_path), cmocka_unit_test(test_scraper_on_loop),
              cmocka_unit_test(test_scraper_dp_on_loop))

/* test_router.c -- router state as a pure library: decisions over slots, exact load accounting
 * through the dispatch record, draining and removal, health, applied scrapes, policy switching,
 * counters and their rendering (router_view.c). No loop and no curl multi: the router is built from
 * a config alone, and every event a proxied request or a scrape probe would report is fed in by
 * hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "base/metrics.h"
#include "core/config.h"
#include "core/router.h"
#include "core/router_view.h"
#include "kvr_commit.h" /* generated at build time */
#include "proto/openai.h"
#include "serve/scrape.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  kvr_config_t cfg;
  kvr_router_t *r;
} fx_t;

static void fx_open(fx_t *f, int nworkers, const char *policy) {
  kvr_config_init(&f->cfg);
  char err[256];
  for (int i = 0; i < nworkers; i++) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", 1 + i); /* never contacted */
    assert_int_equal(kvr_config_add_worker(&f->cfg, url, err, sizeof err), 0);
  }
  free(f->cfg.policy);
  f->cfg.policy = strdup(policy);
  f->cfg.scrape_interval_ms = 0;
  f->r = kvr_router_new(&f->cfg, err, sizeof err);
  assert_non_null(f->r);
}

static void fx_close(fx_t *f) {
  kvr_router_free(f->r);
  kvr_config_free(&f->cfg);
}

/* Every worker's load is zero: what was added has been removed. */
static void assert_idle(const kvr_router_t *r) {
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    assert_int_equal(w->inflight, 0);
    assert_int_equal(w->active_tokens, 0);
    assert_int_equal(w->queued_prefill_tokens, 0);
  }
}

/* The metrics text holds exactly this line. */
static void assert_metric(const kvr_router_t *r, const char *line) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_router_view_metrics(r, &b);
  char want[256];
  snprintf(want, sizeof want, "\n%s\n", line);
  if (strstr(b.data, want) == NULL)
    fail_msg("no line '%s' in:\n%s", line, b.data);
  kvr_buf_free(&b);
}

/* Worker id's GET /v1/models answered json, as the scraper reports it. */
static int feed_models(kvr_router_t *r, uint32_t id, const char *json) {
  kvr_vllm_models_t m;
  assert_int_equal(kvr_vllm_parse_model_list(json, strlen(json), &m), 0);
  int rc = kvr_router_on_models(r, id, &m);
  kvr_vllm_models_free(&m);
  return rc;
}

/* A one-card list: model with max_model_len tokens of context. */
static int feed_model(kvr_router_t *r, uint32_t id, const char *model, uint64_t max_model_len) {
  char json[512];
  snprintf(json, sizeof json,
           "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"root\":"
           "\"%s\",\"parent\":null,\"max_model_len\":%llu}]}",
           model, model, (unsigned long long)max_model_len);
  return feed_models(r, id, json);
}

/* The avoid list naming the slots set in mask (the tests name tried slots as a mask). Static
 * storage: valid until the next call. */
static const kvr_router_avoid_t *tried_slots(uint64_t mask) {
  static int slots[64];
  static kvr_router_avoid_t a;
  size_t n = 0;
  for (int i = 0; i < 64; i++)
    if (mask >> i & 1)
      slots[n++] = i;
  a = (kvr_router_avoid_t){slots, n, false, NULL, 0, false};
  return &a;
}

static void test_round_robin_and_tried(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_route_req_t req = {0};
  kvr_decision_t d;
  int seen[3] = {0};
  for (int i = 0; i < 6; i++)
    seen[kvr_router_decide(f.r, &req, 0, true, &d)]++;
  assert_int_equal(seen[0], 2);
  assert_int_equal(seen[1], 2);
  assert_int_equal(seen[2], 2);
  /* All but slot 1 tried: only 1 is left. */
  assert_int_equal(kvr_router_decide(f.r, &req, tried_slots(0x5), true, &d), 1);
  assert_int_equal(kvr_router_decide(f.r, &req, tried_slots(0x7), true, &d), KVR_POLICY_NONE);
  assert_int_equal(f.r->no_worker_total, 1);
  assert_int_equal(f.r->decisions_total[1], 3);
  assert_int_equal(f.r->decision_seconds.count, 8);
  fx_close(&f);
}

/* A look (record false, what /admin/route/explain does) shows the next pick and moves nothing: the
 * real decision after any number of looks is the one it showed. Round robin's cursor and
 * sglang_cache_aware's tie RNG are the state at stake. */
static void test_look_changes_nothing(void **state) {
  (void)state;
  const char *policies[] = {"round_robin", "sglang_cache_aware", "kv_aware"};
  for (size_t k = 0; k < KVR_ARRAY_SIZE(policies); k++) {
    fx_t f;
    fx_open(&f, 3, policies[k]);
    kvr_route_req_t req = {0};
    kvr_decision_t d;
    for (int i = 0; i < 5; i++) {
      int shown = kvr_router_decide(f.r, &req, 0, false, &d);
      for (int look = 0; look < 3; look++)
        assert_int_equal(kvr_router_decide(f.r, &req, 0, false, &d), shown);
      assert_int_equal(kvr_router_decide(f.r, &req, 0, true, &d), shown);
    }
    assert_int_equal(f.r->decision_seconds.count, 5); /* looks are not counted */
    fx_close(&f);
  }
}

static void test_accounting_and_drain(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "least_load");
  const kvr_worker_t *w = f.r->slots[0];
  kvr_router_dispatch_t a, b;
  /* 25 matched blocks of 64 characters are 400 predicted cached tokens: 600 left to prefill. */
  assert_ptr_equal(kvr_router_on_dispatch(f.r, 0, 1000, 25, &a), w);
  assert_ptr_equal(kvr_router_on_dispatch(f.r, 0, 500, 0, &b), w);
  assert_true(a.prefill_alone);
  assert_false(b.prefill_alone);
  assert_int_equal(w->inflight, 2);
  assert_int_equal(w->active_tokens, 1500);
  assert_int_equal(w->queued_prefill_tokens, 1100);
  /* The first request's first token: its 600 prefill tokens leave the queue; it was dispatched
   * alone, so it is a rate sample, and the snapshot's backlog is the 500 still pending at most. */
  a.dispatched_ns = kvr_now_ns() - 60 * 1000000ull;
  kvr_router_on_token(f.r, &a);
  assert_int_equal(w->queued_prefill_tokens, 500);
  assert_int_equal(w->prefill.samples, 1);
  assert_true(w->prefill.rate > 0);
  /* least_load must now avoid worker 0. */
  kvr_route_req_t req = {0};
  kvr_decision_t d;
  assert_int_equal(kvr_router_decide(f.r, &req, 0, false, &d), 1);
  assert_int_equal(d.snaps[0].queued_prefill_tokens, 500);
  assert_true(d.snaps[0].prefill_backlog_tokens >= 50 && d.snaps[0].prefill_backlog_tokens <= 500);
  assert_int_equal(kvr_router_drain_worker(f.r, w->id), 0);
  assert_int_equal(w->state, KVR_WORKER_DRAINING);
  assert_int_equal(kvr_router_decide(f.r, &req, tried_slots(0x2), false, &d), KVR_POLICY_NONE);
  for (int i = 1; i < 10; i++)
    kvr_router_on_token(f.r, &a);
  assert_int_equal(w->active_tokens, 1510);
  kvr_router_on_end(f.r, &a);
  assert_non_null(f.r->slots[0]); /* one request still in flight */
  assert_int_equal(w->inflight, 1);
  assert_int_equal(w->active_tokens, 500);
  assert_int_equal(w->queued_prefill_tokens, 500); /* b never got its first token */
  kvr_router_on_end(f.r, &b);
  assert_null(f.r->slots[0]); /* freed when the last one ended */
  assert_true(kvr_router_has_usable(f.r));
  assert_int_equal(kvr_router_drain_worker(f.r, 0), KVR_ENOENT);
  fx_close(&f);
}

static void test_failures_mark_down(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "round_robin");
  const kvr_worker_t *w = f.r->slots[0];
  kvr_router_on_health(f.r, w->id, false);
  kvr_router_on_health(f.r, w->id, false);
  assert_int_equal(w->state, KVR_WORKER_UP);
  kvr_router_on_health(f.r, w->id, false);
  assert_int_equal(w->state, KVR_WORKER_DOWN);
  assert_false(kvr_router_has_usable(f.r));
  kvr_router_on_health(f.r, w->id, true);
  assert_int_equal(w->state, KVR_WORKER_UP);
  assert_int_equal(w->consecutive_failures, 0);
  assert_int_equal(kvr_router_on_health(f.r, 77, true), KVR_ENOENT);
  fx_close(&f);
}

static void test_policy_switch(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "round_robin");
  char err[512];
  assert_int_not_equal(kvr_router_set_policy(f.r, "bogus", NULL, err, sizeof err), 0);
  assert_non_null(strstr(err, "kv_aware"));
  assert_string_equal(kvr_policy_name(f.r->policy), "round_robin"); /* unchanged on error */
  assert_int_equal(kvr_router_set_policy(f.r, "kv_aware", NULL, err, sizeof err), 0);
  assert_string_equal(kvr_policy_name(f.r->policy), "kv_aware");
  cJSON *p = kvr_router_view_policy(f.r);
  assert_string_equal(cJSON_GetObjectItem(p, "policy")->valuestring, "kv_aware");
  cJSON_Delete(p);
  fx_close(&f);
}

static void test_scrape_parse(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "round_robin");
  const kvr_worker_t *w = f.r->slots[0];
  const char *page =
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7.0\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n"
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n"
      "vllm:num_requests_running_extra{engine=\"0\"} 99\n"
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\",num_gpu_blocks=\"2000\"} 1.0\n";
  kvr_vllm_metrics_t m;
  assert_int_equal(kvr_vllm_parse_metrics(page, strlen(page), 42, &m), 0);
  assert_int_equal(kvr_router_on_scrape(f.r, w->id, &m), 0);
  assert_true(w->num_requests_running == 7.0);
  assert_true(w->num_requests_waiting == 3.0);
  assert_true(w->kv_cache_usage == 0.5);
  assert_int_equal(w->num_gpu_blocks, 2000);
  assert_int_equal(w->block_size, 16);
  assert_int_equal(w->cache_capacity_blocks,
                   2000); /* 16-token GPU blocks = 64-byte router blocks */
  assert_int_equal(w->scraped_at_ms, 42);
  const char *junk = "something_else 1\n";
  assert_int_equal(kvr_vllm_parse_metrics(junk, strlen(junk), 43, &m), KVR_EPARSE);
  fx_close(&f);
}

/* One proxied request's life as the proxy reports it; returns the slot it went to. */
static int run_request(kvr_router_t *r, const kvr_route_req_t *req, uint64_t tried, int tokens,
                       bool usage) {
  kvr_decision_t d;
  int slot = kvr_router_decide(r, req, tried_slots(tried), true, &d);
  if (slot < 0)
    return slot;
  kvr_router_dispatch_t acct;
  const kvr_worker_t *w =
      kvr_router_on_dispatch(r, slot, req->prompt_tokens, d.snaps[slot].matched_blocks, &acct);
  assert_non_null(w);
  kvr_router_on_health(r, w->id, true);
  kvr_router_on_learn(r, &acct, req->blocks, req->nblocks);
  for (int i = 0; i < tokens; i++)
    kvr_router_on_token(r, &acct);
  if (usage) {
    kvr_router_usage_t u = {.prompt_tokens = req->prompt_tokens,
                            .cached_tokens = acct.predicted_cached,
                            .has_details = true};
    kvr_router_on_usage(r, &acct, &u);
  }
  kvr_router_on_end(r, &acct);
  kvr_router_on_end(r, &acct); /* a second end removes nothing */
  assert_false(acct.open);
  return slot;
}

static const uint64_t blocks8[8] = {11, 12, 13, 14, 15, 16, 17, 18};
static const kvr_route_req_t req8 = {
    .blocks = blocks8, .nblocks = 8, .block_chars = 64, .prompt_tokens = 128};

/* Seven client requests over three round-robin workers, as the proxy would report them: three
 * good ones (the first two report usage), one that fails before responding on worker 0 and is
 * retried on worker 1, a client that goes away after the first token (worker 2), a broken stream
 * (worker 0), and one the router rejects itself. */
static void serve_requests(kvr_router_t *r) {
  for (int i = 0; i < 3; i++) {
    kvr_router_on_request(r);
    assert_int_equal(run_request(r, &req8, 0, 5, i < 2), i);
  }
  assert_idle(r);
  assert_int_equal(kvr_cache_index_entries(r->index, 0), 8);

  kvr_router_on_request(r);
  kvr_decision_t d;
  int slot = kvr_router_decide(r, &req8, 0, true, &d);
  assert_int_equal(slot, 0);
  kvr_router_dispatch_t acct;
  kvr_router_on_dispatch(r, slot, req8.prompt_tokens, d.snaps[slot].matched_blocks, &acct);
  assert_int_equal(acct.predicted_cached, 128); /* worker 0 learned all 8 blocks */
  assert_int_equal(acct.prefill_tokens, 0);
  kvr_router_on_worker_error(r, &acct);
  kvr_router_on_health(r, acct.worker_id, false);
  kvr_router_on_retry(r, &acct);
  kvr_router_on_end(r, &acct);
  assert_int_equal(run_request(r, &req8, UINT64_C(1) << slot, 3, false), 1);

  kvr_router_on_request(r);
  assert_int_equal(slot = kvr_router_decide(r, &req8, 0, true, &d), 2);
  kvr_router_on_dispatch(r, slot, 1000, 0, &acct);
  kvr_router_on_token(r, &acct);
  assert_int_equal(r->slots[slot]->active_tokens, 1001);
  kvr_router_on_client_abort(r);
  kvr_router_on_end(r, &acct);

  kvr_router_on_request(r);
  assert_int_equal(slot = kvr_router_decide(r, &req8, 0, true, &d), 0);
  kvr_router_on_dispatch(r, slot, 2000, 0, &acct);
  assert_int_equal(r->slots[slot]->queued_prefill_tokens, 2000);
  kvr_router_on_worker_error(r, &acct);
  kvr_router_on_upstream_failure(r);
  kvr_router_on_end(r, &acct);

  kvr_router_on_request(r);
  kvr_router_on_client_error(r);
  kvr_router_observe_ttfb(r, 0.02);
  kvr_router_observe_duration(r, 0.5);
}

/* Requests stream, fail, retry, abort, without a loop: the load returns to zero exactly and every
 * counter, and its metric line, says what happened. */
static void test_requests_return_to_zero(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  serve_requests(r);
  assert_idle(r);
  assert_int_equal(r->requests_total, 7);
  assert_int_equal(r->client_errors_total, 1);
  assert_int_equal(r->client_aborts_total, 1);
  assert_int_equal(r->upstream_failures_total, 1);
  assert_int_equal(r->ttfb_seconds.count, 1);
  assert_int_equal(r->request_seconds.count, 1);
  const kvr_worker_t *w0 = r->slots[0], *w1 = r->slots[1];
  assert_int_equal(w0->requests_total, 3);
  assert_int_equal(w0->errors_total, 2);
  assert_int_equal(w0->retries_total, 1);
  assert_int_equal(w0->consecutive_failures, 1);
  assert_int_equal(w1->requests_total, 2);
  assert_int_equal(w1->errors_total, 0);
  assert_int_equal(r->slots[2]->requests_total, 2);
  assert_int_equal(w0->prompt_tokens_total, 128 + 128 + 2000);
  assert_int_equal(w0->predicted_cached_tokens_total, 128);
  assert_int_equal(w0->usage_prompt_tokens_total, 128);
  assert_int_equal(w0->usage_cached_tokens_total, 0);
  assert_int_equal(w1->usage_prompt_tokens_total, 128);
  assert_metric(r, "kvrouter_worker_inflight_requests{worker=\"0\",url=\"http://127.0.0.1:1\"} 0");
  assert_metric(r, "kvrouter_worker_active_tokens{worker=\"0\",url=\"http://127.0.0.1:1\"} 0");
  assert_metric(r, "kvrouter_worker_errors_total{worker=\"0\",url=\"http://127.0.0.1:1\"} 2");
  assert_metric(r, "kvrouter_worker_retries_total{worker=\"0\",url=\"http://127.0.0.1:1\"} 1");
  assert_metric(r, "kvrouter_worker_index_blocks{worker=\"0\",url=\"http://127.0.0.1:1\"} 8");
  assert_metric(r, "kvrouter_routing_decisions_total{worker=\"0\"} 3");
  assert_metric(r, "kvrouter_requests_total 7");
  assert_metric(r, "kvrouter_client_errors_total 1");
  assert_metric(r, "kvrouter_client_aborts_total 1");
  assert_metric(r, "kvrouter_upstream_failures_total 1");
  assert_metric(r, "kvrouter_routing_no_worker_total 0");
  assert_metric(r, "kvrouter_time_to_first_byte_seconds_count 1");
  assert_metric(r, "kvrouter_request_duration_seconds_count 1");
  fx_close(&f);
}

/* The cache index grows with the fleet: a worker's slot is a valid index worker from the moment it
 * is added, bounded by its capacity, and a scrape that tells the capacity moves the bound. Nothing
 * is sized ahead: the table grows a bucket at a time as blocks come. */
static void test_index_follows_workers(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  assert_true(kvr_cache_index_workers(r->index) >= 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(kvr_cache_index_capacity(r->index, (size_t)i),
                     r->slots[i]->cache_capacity_blocks);
  kvr_vllm_metrics_t m = {
      .at_ms = kvr_now_ns() / 1000000u, .num_gpu_blocks = 200000, .block_size = 16};
  assert_int_equal(kvr_router_on_scrape(r, r->slots[1]->id, &m), 0);
  assert_int_equal(r->slots[1]->cache_capacity_blocks,
                   kvr_cache_index_capacity_from_vllm(200000, 16, f.cfg.block_chars));
  assert_int_equal(kvr_cache_index_capacity(r->index, 1), r->slots[1]->cache_capacity_blocks);
  char err[256];
  const kvr_worker_t *w = kvr_router_add_worker(r, "http://127.0.0.1:99", err, sizeof err);
  assert_non_null(w);
  assert_true(kvr_cache_index_workers(r->index) >= 4);
  assert_int_equal(kvr_cache_index_capacity(r->index, (size_t)w->slot), w->cache_capacity_blocks);
  fx_close(&f);
}

/* KVR_MAX_WORKERS workers are served, decided over and retried across; one more is refused with a
 * one-line error and counted; a drained worker's slot takes the next. */
static void test_worker_limit(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "round_robin");
  kvr_router_t *r = f.r;
  char err[256], url[64];
  for (int i = 1; i < KVR_MAX_WORKERS; i++) {
    snprintf(url, sizeof url, "http://10.%d.%d.1:8000", i / 256, i % 256);
    if (kvr_router_add_worker(r, url, err, sizeof err) == NULL)
      fail_msg("worker %d: %s", i, err);
  }
  assert_int_equal(r->nslots, KVR_MAX_WORKERS);
  assert_null(kvr_router_add_worker(r, url, err, sizeof err));
  assert_non_null(strstr(err, "already configured")); /* a duplicate is not the limit */
  assert_int_equal(r->workers_refused_total, 0);
  assert_null(kvr_router_add_worker(r, "http://10.255.255.1:8000", err, sizeof err));
  assert_non_null(strstr(err, "too many workers"));
  assert_null(strchr(err, '\n'));
  assert_int_equal(r->workers_refused_total, 1);
  assert_metric(r, "kvrouter_workers_refused_total 1");
  /* Decisions over the whole fleet: round robin walks it, tried slots are skipped. */
  kvr_route_req_t req = {0};
  kvr_decision_t d;
  assert_int_equal(kvr_router_decide(r, &req, NULL, true, &d), 0);
  assert_int_equal(d.nsnaps, KVR_MAX_WORKERS);
  int tried[2] = {1, KVR_MAX_WORKERS - 1};
  kvr_router_avoid_t avoid = {tried, 2, false, NULL, 0, false};
  assert_int_equal(kvr_router_decide(r, &req, &avoid, true, &d), 2);
  /* The last slot drained frees it for the refused URL. */
  assert_int_equal(kvr_router_drain_worker(r, r->slots[KVR_MAX_WORKERS - 1]->id), 0);
  const kvr_worker_t *w = kvr_router_add_worker(r, "http://10.255.255.1:8000", err, sizeof err);
  assert_non_null(w);
  assert_int_equal(w->slot, KVR_MAX_WORKERS - 1);
  fx_close(&f);
}

/* A peer's rows reach their workers by URL whatever their order: the first of two rows for one URL
 * wins, a worker the peer does not list gets nothing from it, a URL no worker serves is ignored. */
static void test_peer_rows_by_url(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  kvr_peer_row_t rows[4] = {
      {.url = "http://127.0.0.1:3", .load = {.inflight = 3}},
      {.url = "http://127.0.0.1:9", .load = {.inflight = 9}},
      {.url = "http://127.0.0.1:1", .load = {.inflight = 1}},
      {.url = "http://127.0.0.1:3", .load = {.inflight = 33}},
  };
  kvr_router_on_peer_load(r, 0, rows, 4);
  assert_int_equal(r->slots[0]->peer[0].inflight, 1);
  assert_int_equal(r->slots[1]->peer[0].inflight, 0);
  assert_true(r->slots[1]->peer[0].at_ms > 0);
  assert_int_equal(r->slots[2]->peer[0].inflight, 3);
  kvr_router_on_peer_load(r, 0, NULL, 0);
  assert_int_equal(r->slots[2]->peer[0].inflight, 0);
  fx_close(&f);
}

/* A scrape with the cache geometry resizes a worker's modelled cache; a reset forgets its blocks;
 * both show in /admin/workers. */
static void test_scrape_and_reset(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  for (int i = 0; i < 3; i++)
    run_request(r, &req8, 0, 1, false);
  kvr_vllm_metrics_t m = {.at_ms = kvr_now_ns() / 1000000u,
                          .num_requests_running = 2,
                          .kv_cache_usage = 0.25,
                          .num_gpu_blocks = 100,
                          .block_size = 16};
  uint32_t id2 = r->slots[2]->id;
  assert_int_equal(kvr_router_on_scrape(r, id2, &m), 0);
  assert_int_equal(r->slots[2]->cache_capacity_blocks, 100);
  assert_int_equal(kvr_cache_index_capacity(r->index, 2), 100);
  assert_true(kvr_router_worker_fresh(r, r->slots[2], m.at_ms));
  assert_false(kvr_router_worker_fresh(r, r->slots[1], m.at_ms));
  uint64_t forgotten = 0;
  assert_int_equal(kvr_router_forget_cache(r, id2, &forgotten), 0);
  assert_int_equal(forgotten, 8);
  assert_int_equal(kvr_cache_index_entries(r->index, 2), 0);
  assert_int_equal(kvr_cache_index_entries(r->index, 1), 8);
  cJSON *ws = kvr_router_view_workers(r);
  cJSON *scraped = cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 2), "scraped");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(scraped, "fresh")));
  assert_int_equal(cJSON_GetObjectItem(scraped, "num_gpu_blocks")->valuedouble, 100);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 2), "index_blocks")->valuedouble, 0);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 0), "in_flight")->valuedouble, 0);
  cJSON_Delete(ws);
  fx_close(&f);
}

/* A worker drains with a request in flight; an idle one is removed at once, and reports for its id
 * are refused; a new worker takes the lowest free slot, a new id and no old cache entries. */
static void test_drain_remove_add(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  for (int i = 0; i < 3; i++)
    run_request(r, &req8, 0, 1, false);
  kvr_decision_t d;
  int slot = kvr_router_decide(r, &req8, tried_slots(0x5), true, &d);
  assert_int_equal(slot, 1);
  kvr_router_dispatch_t acct;
  kvr_router_on_dispatch(r, slot, 64, 0, &acct);
  uint32_t id1 = r->slots[1]->id, id2 = r->slots[2]->id;
  assert_int_equal(kvr_router_drain_worker(r, id1), 0);
  assert_int_equal(kvr_router_drain_worker(r, id2), 0);
  assert_null(r->slots[2]);
  kvr_vllm_metrics_t m = {.at_ms = 1};
  uint64_t forgotten = 0;
  assert_int_equal(kvr_router_on_scrape(r, id2, &m), KVR_ENOENT);
  assert_int_equal(kvr_router_forget_cache(r, id2, &forgotten), KVR_ENOENT);
  assert_int_equal(kvr_router_on_health(r, id2, true), KVR_ENOENT);
  assert_non_null(kvr_router_worker_by_id(r, id1));
  kvr_router_on_token(r, &acct);
  kvr_router_on_end(r, &acct);
  assert_null(kvr_router_worker_by_id(r, id1));
  assert_null(r->slots[1]);
  assert_int_equal(r->nslots, 1);
  char err[256];
  const kvr_worker_t *nw = kvr_router_add_worker(r, "http://127.0.0.1:9", err, sizeof err);
  assert_non_null(nw);
  assert_int_equal(nw->slot, 1);
  assert_int_equal(nw->id, 3);
  assert_int_equal(kvr_cache_index_entries(r->index, 1), 0);
  assert_null(kvr_router_add_worker(r, "http://127.0.0.1:9/", err, sizeof err));
  assert_non_null(strstr(err, "already configured"));
  assert_idle(r);
  fx_close(&f);
}

/* Random interleavings of dispatches, tokens and ends over three workers: at every step each
 * worker's load is the sum of its open records, and it is zero once every record has ended. */
static void test_accounting_invariant_random(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "least_load");
  kvr_router_t *r = f.r;
  enum { N = 32 };
  kvr_router_dispatch_t recs[N];
  memset(recs, 0, sizeof recs);
  uint64_t x = 88172645463325252ull;
  for (int step = 0; step < 20000; step++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    kvr_router_dispatch_t *d = &recs[x % N];
    uint64_t op = (x >> 8) % 4;
    if (!d->open)
      kvr_router_on_dispatch(r, (int)((x >> 16) % 3), (x >> 20) % 5000, (x >> 40) % 100, d);
    else if (op < 3)
      kvr_router_on_token(r, d);
    else
      kvr_router_on_end(r, d);
    for (int s = 0; s < 3; s++) {
      uint64_t inflight = 0, active = 0, queued = 0;
      for (int i = 0; i < N; i++) {
        if (!recs[i].open || recs[i].slot != s)
          continue;
        inflight++;
        active += recs[i].prompt_tokens + recs[i].generated;
        queued += recs[i].prefill_tokens;
      }
      assert_int_equal(r->slots[s]->inflight, inflight);
      assert_int_equal(r->slots[s]->active_tokens, active);
      assert_int_equal(r->slots[s]->queued_prefill_tokens, queued);
    }
  }
  for (int i = 0; i < N; i++)
    kvr_router_on_end(r, &recs[i]);
  assert_idle(r);
  fx_close(&f);
}

static uint64_t fake_clock(void *ctx) {
  return *(const uint64_t *)ctx;
}

/* kvr_router_set_clock: dispatch times, the prefill clock's rate and backlog, and the freshness of
 * scraped figures all follow the injected clock (the virtual cluster's); NULL restores the real
 * one. */
static void test_injected_clock(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "least_load");
  f.cfg.scrape_stale_ms = 1000;
  kvr_router_t *r = f.r;
  uint64_t t = 5000000000ull; /* 5 s: far from the real monotonic clock */
  kvr_router_set_clock(r, fake_clock, &t);
  assert_int_equal(kvr_router_now_ns(r), t);
  kvr_route_req_t req = {0};
  kvr_decision_t d;
  /* A lone 1000-token prefill answered 0.5 s later: 2000 tokens/s. */
  kvr_router_dispatch_t a;
  assert_non_null(kvr_router_on_dispatch(r, 0, 1000, 0, &a));
  assert_int_equal(a.dispatched_ns, 5000000000ull);
  assert_true(a.prefill_alone);
  t += 500000000ull;
  kvr_router_on_token(r, &a);
  const kvr_worker_t *w = r->slots[0];
  assert_int_equal(w->prefill.samples, 1);
  assert_true(fabs(w->prefill.rate - 2000) < 1e-6);
  assert_int_equal(w->queued_prefill_tokens, 0);
  kvr_router_on_end(r, &a);
  /* Two more at 6 s: 1 s of prefill queued, worked off as the clock moves. */
  t = 6000000000ull;
  kvr_router_dispatch_t b, c;
  kvr_router_on_dispatch(r, 0, 1000, 0, &b);
  kvr_router_on_dispatch(r, 0, 1000, 0, &c);
  assert_int_equal(b.dispatched_ns, t);
  assert_int_equal(w->prefill.busy_until_ns, 7000000000ull);
  kvr_router_decide(r, &req, 0, false, &d);
  assert_int_equal(d.snaps[0].queued_prefill_tokens, 2000);
  assert_int_equal(d.snaps[0].prefill_backlog_tokens, 2000);
  t = 6500000000ull;
  kvr_router_decide(r, &req, 0, false, &d);
  assert_int_equal(d.snaps[0].prefill_backlog_tokens, 1000);
  assert_int_equal(kvr_router_worker_backlog(w, t), 1000);
  t = 7500000000ull; /* overdue: the floor, a tenth of what is pending */
  kvr_router_decide(r, &req, 0, false, &d);
  assert_int_equal(d.snaps[0].prefill_backlog_tokens, 200);
  kvr_router_on_end(r, &b);
  kvr_router_on_end(r, &c);
  assert_idle(r);
  /* Scraped figures are fresh for scrape_stale_ms of the injected clock. */
  kvr_vllm_metrics_t m = {.at_ms = t / 1000000u, .num_requests_running = 1};
  assert_int_equal(kvr_router_on_scrape(r, w->id, &m), 0);
  kvr_router_decide(r, &req, 0, false, &d);
  assert_true(d.snaps[0].metrics_fresh);
  t += 1000000000ull;
  kvr_router_decide(r, &req, 0, false, &d);
  assert_true(d.snaps[0].metrics_fresh);
  t += 1000000ull;
  kvr_router_decide(r, &req, 0, false, &d);
  assert_false(d.snaps[0].metrics_fresh);
  /* Back to the real clock. */
  kvr_router_set_clock(r, NULL, NULL);
  uint64_t before = kvr_now_ns(), now = kvr_router_now_ns(r), after = kvr_now_ns();
  assert_true(now >= before && now <= after);
  fx_close(&f);
}

/* ---- issue 18: what the router learns, outlier ejection, the retry budget, admission --------- */

/* One failed (ok false) or successful attempt on slot: dispatch, verdict, end. Returns whether the
 * verdict ejected the worker. */
static bool attempt_on(kvr_router_t *r, int slot, bool ok) {
  kvr_router_dispatch_t d;
  assert_non_null(kvr_router_on_dispatch(r, slot, 100, 0, &d));
  bool ejected = kvr_router_on_result(r, &d, ok);
  kvr_router_on_end(r, &d);
  return ejected;
}

/* A request the worker refused (the proxy reports no learning for a 4xx/5xx) leaves no residue:
 * the index holds what it held before and the load is back to zero. Learning is capped at the
 * worker's max_model_len (GET /v1/models) in blocks: max_model_len * KVR_CHARS_PER_TOKEN /
 * block_chars. */
static void test_learning_refused_and_capped(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "kv_aware");
  kvr_router_t *r = f.r;
  const kvr_worker_t *w = r->slots[0];
  static uint64_t blocks[400];
  for (size_t i = 0; i < 400; i++)
    blocks[i] = 1000 + i;
  kvr_route_req_t req = {.blocks = blocks, .nblocks = 400, .prompt_tokens = 400 * 16};
  /* Refused: dispatched, answered 400, ended, nothing learned. */
  kvr_decision_t d;
  assert_int_equal(kvr_router_decide(r, &req, 0, true, &d), 0);
  kvr_router_dispatch_t a;
  kvr_router_on_dispatch(r, 0, req.prompt_tokens, d.snaps[0].matched_blocks, &a);
  assert_int_equal(w->inflight, 1);
  kvr_router_on_result(r, &a, true); /* a 4xx is no worker failure */
  kvr_router_on_end(r, &a);
  assert_int_equal(kvr_cache_index_entries(r->index, 0), 0);
  assert_idle(r);
  assert_int_equal(w->consecutive_errors, 0);
  /* Unknown context length: no cap but the cache's. */
  assert_true(kvr_router_learn_cap(r, w) == SIZE_MAX);
  /* A 2048-token model: 2048 * 4 / 64 = 128 blocks at most from one request. */
  assert_int_equal(feed_model(r, w->id, "m", 2048), 0);
  assert_int_equal(w->max_model_len, 2048);
  assert_true(w->models_known);
  assert_int_equal(kvr_router_learn_cap(r, w), 128);
  kvr_router_on_dispatch(r, 0, req.prompt_tokens, 0, &a);
  kvr_router_on_learn(r, &a, blocks, 400);
  kvr_router_on_end(r, &a);
  assert_int_equal(kvr_cache_index_entries(r->index, 0), 128);
  /* The leading blocks are the ones kept: a later request matches 128 of them. */
  kvr_router_decide(r, &req, 0, false, &d);
  assert_int_equal(d.snaps[0].matched_blocks, 128);
  assert_metric(r, "kvrouter_worker_max_model_len_tokens{worker=\"0\",url=\"http://127.0.0.1:1\"} "
                   "2048");
  /* A tiny model still learns one block; a worker back from DOWN is asked again. */
  feed_model(r, w->id, "m", 3);
  assert_int_equal(kvr_router_learn_cap(r, w), 1);
  for (int i = 0; i < 3; i++)
    kvr_router_on_health(r, w->id, false);
  kvr_router_on_health(r, w->id, true);
  assert_false(w->models_known);
  assert_int_equal(feed_model(r, 99, "m", 10), KVR_ENOENT);
  fx_close(&f);
}

/* A request that ends before its first token (a 400 for an over-long prompt) also leaves the
 * prefill clock as it found it: the next request's backlog is not inflated by it. */
static void test_refused_prefill_leaves_clock(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "least_load");
  kvr_router_t *r = f.r;
  uint64_t t = 10ull * 1000000000ull;
  kvr_router_set_clock(r, fake_clock, &t);
  const kvr_worker_t *w = r->slots[0];
  kvr_router_dispatch_t a, big, c;
  kvr_router_on_dispatch(r, 0, 1000, 0, &a); /* 1000 tokens in 0.5 s: 2000 tokens/s */
  t += 500000000ull;
  kvr_router_on_token(r, &a);
  kvr_router_on_end(r, &a);
  kvr_router_on_dispatch(r, 0, 2000, 0, &c); /* 1 s of prefill pending */
  uint64_t busy = w->prefill.busy_until_ns;
  kvr_router_on_dispatch(r, 0, 500000, 0, &big); /* a 2 MB prompt: 250 s more */
  assert_true(w->prefill.busy_until_ns > busy + 200ull * 1000000000ull);
  kvr_router_on_end(r, &big); /* answered 400 */
  assert_int_equal(w->prefill.busy_until_ns, busy);
  assert_int_equal(w->queued_prefill_tokens, 2000);
  t += 500000000ull; /* half of c's prefill done */
  assert_int_equal(kvr_router_worker_backlog(w, t), 1000);
  kvr_router_on_end(r, &c);
  assert_idle(r);
  fx_close(&f);
}

/* consecutive_failures failures in a row eject a worker for base * 2^(n-1) (capped); when the time
 * is up one trial goes (half-open): a failure ejects it for twice as long, a success restores it.
 */
static void test_outlier_ejection_backoff_and_trial(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  f.cfg.outlier_consecutive = 3;
  f.cfg.outlier_base_ejection_ms = 1000;
  f.cfg.outlier_max_ejection_ms = 3000;
  f.cfg.outlier_max_percent = 50;
  kvr_router_t *r = f.r;
  uint64_t t = 100ull * 1000000000ull;
  kvr_router_set_clock(r, fake_clock, &t);
  const kvr_worker_t *w = r->slots[0];
  /* A success in between starts the count again. */
  assert_false(attempt_on(r, 0, false));
  assert_false(attempt_on(r, 0, false));
  assert_false(attempt_on(r, 0, true));
  assert_false(attempt_on(r, 0, false));
  assert_false(attempt_on(r, 0, false));
  assert_true(attempt_on(r, 0, false));
  assert_int_equal(w->state, KVR_WORKER_EJECTED);
  assert_int_equal(w->ejections_total, 1);
  assert_int_equal(w->ejected_until_ms, t / 1000000u + 1000);
  assert_true(kvr_router_has_usable(r));
  assert_metric(r, "kvrouter_worker_state{worker=\"0\",state=\"ejected\"} 1");
  assert_metric(r, "kvrouter_worker_state{worker=\"0\",state=\"up\"} 0");
  assert_metric(r, "kvrouter_worker_ejections_total{worker=\"0\",url=\"http://127.0.0.1:1\"} 1");
  /* Ejected: never chosen. */
  kvr_route_req_t req = {0};
  kvr_decision_t d;
  for (int i = 0; i < 6; i++)
    assert_int_not_equal(kvr_router_decide(r, &req, 0, true, &d), 0);
  assert_int_equal(kvr_router_decide(r, &req, tried_slots(6), true, &d), KVR_POLICY_NONE);
  /* Time served: half-open, one trial only. */
  t += 1000ull * 1000000u;
  assert_int_equal(kvr_router_decide(r, &req, tried_slots(6), true, &d), 0);
  kvr_router_dispatch_t trial;
  kvr_router_on_dispatch(r, 0, 10, 0, &trial);
  assert_true(trial.trial);
  assert_true(w->trial_inflight);
  assert_int_equal(kvr_router_decide(r, &req, tried_slots(6), true, &d), KVR_POLICY_NONE);
  /* The trial fails: ejected again for 2 s. */
  assert_true(kvr_router_on_result(r, &trial, false));
  kvr_router_on_end(r, &trial);
  assert_int_equal(w->state, KVR_WORKER_EJECTED);
  assert_int_equal(w->ejected_until_ms, t / 1000000u + 2000);
  /* The next trial ends without a verdict (client gone): the one after may go. */
  t += 2000ull * 1000000u;
  kvr_router_on_dispatch(r, 0, 10, 0, &trial);
  kvr_router_on_end(r, &trial);
  assert_false(w->trial_inflight);
  /* Fails again: 4 s capped at 3 s. */
  kvr_router_on_dispatch(r, 0, 10, 0, &trial);
  assert_true(kvr_router_on_result(r, &trial, false));
  kvr_router_on_end(r, &trial);
  assert_int_equal(w->ejected_until_ms, t / 1000000u + 3000);
  /* A successful trial restores it. */
  t += 3000ull * 1000000u;
  kvr_router_on_dispatch(r, 0, 10, 0, &trial);
  assert_false(kvr_router_on_result(r, &trial, true));
  kvr_router_on_end(r, &trial);
  assert_int_equal(w->state, KVR_WORKER_UP);
  assert_int_equal(w->ejections_total, 3);
  assert_idle(r);
  /* Ejected again soon after: the streak goes on (3 s); after max_ejection_ms clean, the base. */
  for (int i = 0; i < 3; i++)
    attempt_on(r, 0, false);
  assert_int_equal(w->ejected_until_ms, t / 1000000u + 3000);
  t += 3000ull * 1000000u;
  kvr_router_on_dispatch(r, 0, 10, 0, &trial);
  kvr_router_on_result(r, &trial, true);
  kvr_router_on_end(r, &trial);
  t += 3000ull * 1000000u;
  for (int i = 0; i < 3; i++)
    attempt_on(r, 0, false);
  assert_int_equal(w->ejected_until_ms, t / 1000000u + 1000);
  /* 0 consecutive failures: never ejects. */
  f.cfg.outlier_consecutive = 0;
  for (int i = 0; i < 10; i++)
    assert_false(attempt_on(r, 1, false));
  assert_int_equal(r->slots[1]->state, KVR_WORKER_UP);
  fx_close(&f);
}

/* An ejection that would leave no other UP worker, or eject more than max_ejection_percent of the
 * workers, is refused and counted; the worker keeps serving. */
static void test_ejection_keeps_a_worker(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 4, "round_robin");
  f.cfg.outlier_consecutive = 1;
  f.cfg.outlier_max_percent = 50;
  kvr_router_t *r = f.r;
  assert_true(attempt_on(r, 0, false));
  assert_true(attempt_on(r, 1, false));
  assert_false(attempt_on(r, 2, false)); /* a third of four is above 50% */
  assert_int_equal(r->slots[2]->state, KVR_WORKER_UP);
  assert_int_equal(r->ejections_refused_total, 1);
  assert_metric(r, "kvrouter_ejections_refused_total 1");
  fx_close(&f);
  /* One worker: never ejected, whatever the percentage. */
  fx_open(&f, 1, "round_robin");
  f.cfg.outlier_consecutive = 1;
  f.cfg.outlier_max_percent = 100;
  assert_false(attempt_on(f.r, 0, false));
  assert_int_equal(f.r->slots[0]->state, KVR_WORKER_UP);
  /* Two at 100%: the second is the last UP one. */
  fx_close(&f);
  fx_open(&f, 2, "round_robin");
  f.cfg.outlier_consecutive = 1;
  f.cfg.outlier_max_percent = 100;
  assert_true(attempt_on(f.r, 0, false));
  assert_false(attempt_on(f.r, 1, false));
  assert_true(kvr_router_has_usable(f.r));
  fx_close(&f);
}

/* ejected_last_resort (a continuation of a broken stream): worker 0 was ejected while others were
 * UP, then they went down. A decision without the flag finds no worker; with it the ejected worker
 * is chosen, and only when nothing else is usable or it is not in the tried set; the dispatch is
 * its trial and a success restores it. A down worker is never the last resort. */
static void test_ejected_last_resort(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  f.cfg.outlier_consecutive = 1;
  f.cfg.outlier_max_percent = 50;
  f.cfg.fail_threshold = 1;
  kvr_router_t *r = f.r;
  assert_true(attempt_on(r, 0, false));
  assert_int_equal(r->slots[0]->state, KVR_WORKER_EJECTED);
  kvr_route_req_t req = {.prompt_tokens = 10};
  kvr_router_avoid_t plain = {NULL, 0, false, NULL, 0, false};
  kvr_router_avoid_t last = {NULL, 0, false, NULL, 0, true};
  int zero = 0, one = 1;
  kvr_router_avoid_t last_but_0 = {&zero, 1, false, NULL, 0, true};
  kvr_router_avoid_t last_but_1 = {&one, 1, false, NULL, 0, true};
  kvr_decision_t d;
  /* Worker 2 is still UP: the flag changes nothing. */
  kvr_router_on_health(r, r->slots[1]->id, false);
  assert_int_equal(r->slots[1]->state, KVR_WORKER_DOWN);
  assert_int_equal(kvr_router_decide(r, &req, &last, true, &d), 2);
  assert_false(d.snaps[0].usable);
  assert_int_equal(kvr_router_decide(r, &req, &last_but_1, true, &d), 2);
  /* Worker 2 goes down too: only the ejected one is left. */
  kvr_router_on_health(r, r->slots[2]->id, false);
  assert_int_equal(kvr_router_decide(r, &req, &plain, true, &d), KVR_POLICY_NONE);
  assert_int_equal(kvr_router_decide(r, &req, &last_but_0, true, &d), KVR_POLICY_NONE);
  assert_false(d.snaps[1].usable); /* down: never a last resort */
  assert_int_equal(kvr_router_decide(r, &req, &last, true, &d), 0);
  assert_true(d.snaps[0].usable);
  kvr_router_dispatch_t acct;
  kvr_router_on_dispatch(r, 0, req.prompt_tokens, 0, &acct);
  assert_true(acct.trial);
  kvr_router_on_result(r, &acct, true);
  kvr_router_on_end(r, &acct);
  assert_int_equal(r->slots[0]->state, KVR_WORKER_UP); /* the trial restored it */
  assert_int_equal(kvr_router_decide(r, &req, &plain, true, &d), 0);
  fx_close(&f);
}

/* Retries in flight may be budget_percent of the requests in flight, at least min_concurrency. */
static void test_retry_budget(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "round_robin");
  kvr_router_t *r = f.r; /* defaults: 20%, at least 3 */
  for (int i = 0; i < 3; i++)
    assert_true(kvr_router_retry_acquire(r, 10));
  assert_false(kvr_router_retry_acquire(r, 10));
  assert_int_equal(r->retry_budget_refused_total, 1);
  assert_true(kvr_router_retry_acquire(r, 20)); /* 20% of 20 = 4 */
  assert_false(kvr_router_retry_acquire(r, 20));
  kvr_router_retry_release(r);
  assert_true(kvr_router_retry_acquire(r, 20));
  for (int i = 0; i < 4; i++)
    kvr_router_retry_release(r);
  assert_int_equal(r->retries_inflight, 0);
  kvr_router_retry_release(r); /* never below zero */
  assert_int_equal(r->retries_inflight, 0);
  assert_metric(r, "kvrouter_retry_budget_refused_total 2");
  f.cfg.retry_budget_percent = 0;
  f.cfg.retry_min_concurrency = 0;
  assert_false(kvr_router_retry_acquire(r, 1000));
  fx_close(&f);
}

/* The admission bound: full workers, blocked only when every usable untried worker is full. */
static void test_admission_bound(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "round_robin");
  kvr_router_t *r = f.r;
  kvr_router_dispatch_t d[4];
  for (int i = 0; i < 4; i++)
    kvr_router_on_dispatch(r, i % 2, 10, 0, &d[i]);
  assert_false(kvr_router_admission_full(r, 0)); /* off by default */
  assert_false(kvr_router_admission_blocked(r, NULL));
  f.cfg.admission_max_inflight = 2;
  assert_true(kvr_router_admission_full(r, 0));
  assert_true(kvr_router_admission_full(r, 1));
  assert_true(kvr_router_admission_blocked(r, NULL));
  kvr_router_on_end(r, &d[1]);
  assert_true(kvr_router_admission_full(r, 0));
  assert_false(kvr_router_admission_full(r, 1));
  assert_false(kvr_router_admission_blocked(r, NULL));
  assert_true(kvr_router_admission_blocked(r, tried_slots(2))); /* 1 tried: only full ones left */
  /* A first attempt (full set) goes to the worker with room; with it tried, to none. */
  kvr_route_req_t req = {0};
  kvr_decision_t dec;
  kvr_router_avoid_t first = {NULL, 0, true, NULL, 0, false};
  assert_int_equal(kvr_router_decide(r, &req, &first, false, &dec), 1);
  int one = 1;
  first = (kvr_router_avoid_t){&one, 1, true, NULL, 0, false};
  assert_int_equal(kvr_router_decide(r, &req, &first, false, &dec), KVR_POLICY_NONE);
  kvr_router_on_queued(r);
  kvr_router_on_queued(r);
  kvr_router_on_dequeued(r);
  kvr_router_on_admission_reject(r, KVR_ADMISSION_TIMEOUT);
  assert_metric(r, "kvrouter_admission_queue_depth 1");
  assert_metric(r, "kvrouter_admission_queued_total 2");
  assert_metric(r, "kvrouter_admission_rejected_total{reason=\"timeout\"} 1");
  assert_metric(r, "kvrouter_admission_rejected_total{reason=\"queue_full\"} 0");
  kvr_router_on_end(r, &d[0]);
  kvr_router_on_end(r, &d[2]);
  kvr_router_on_end(r, &d[3]);
  assert_idle(r);
  /* No usable worker at all is not "blocked": the request gets its 503 at once. */
  for (int i = 0; i < 3; i++) {
    kvr_router_on_health(r, r->slots[0]->id, false);
    kvr_router_on_health(r, r->slots[1]->id, false);
  }
  assert_false(kvr_router_admission_blocked(r, 0));
  fx_close(&f);
}

/* The family's HELP and TYPE lines are in text, TYPE naming type. */
static void assert_family(const char *text, const char *name, const char *type) {
  char want[256];
  snprintf(want, sizeof want, "# HELP %s ", name);
  if (strstr(text, want) == NULL)
    fail_msg("no HELP for %s", name);
  snprintf(want, sizeof want, "# TYPE %s %s\n", name, type);
  if (strstr(text, want) == NULL)
    fail_msg("no '# TYPE %s %s'", name, type);
}

/* Request errors by reason (all reasons always present), retries exhausted, worker state and
 * scrape age, build info and the process families. */
static void test_metrics_ops_families(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "round_robin");
  kvr_router_t *r = f.r;
  uint64_t t = 10000000000ull; /* 10 s */
  kvr_router_set_clock(r, fake_clock, &t);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_router_view_metrics(r, &b);
  assert_family(b.data, "kvrouter_request_errors_total", "counter");
  assert_family(b.data, "kvrouter_retries_exhausted_total", "counter");
  assert_family(b.data, "kvrouter_worker_state", "gauge");
  assert_family(b.data, "kvrouter_worker_scrape_age_seconds", "gauge");
  assert_family(b.data, "kvrouter_build_info", "gauge");
  assert_family(b.data, "process_start_time_seconds", "gauge");
  assert_family(b.data, "process_cpu_seconds_total", "counter");
  assert_family(b.data, "process_resident_memory_bytes", "gauge");
  assert_family(b.data, "process_open_fds", "gauge");
  assert_family(b.data, "process_max_fds", "gauge");
  /* Never scraped: the family has no sample. */
  assert_null(strstr(b.data, "kvrouter_worker_scrape_age_seconds{"));
  kvr_buf_free(&b);
  static const char *const reasons[] = {"connect",      "first_byte_timeout", "idle_timeout",
                                        "upstream_5xx", "broken_stream",      "no_worker",
                                        "client_error", "client_abort"};
  char line[128];
  for (size_t i = 0; i < KVR_ARRAY_SIZE(reasons); i++) {
    snprintf(line, sizeof line, "kvrouter_request_errors_total{reason=\"%s\"} 0", reasons[i]);
    assert_metric(r, line);
  }
  kvr_router_on_request_error(r, KVR_REQ_ERROR_CONNECT);
  kvr_router_on_request_error(r, KVR_REQ_ERROR_CONNECT);
  kvr_router_on_request_error(r, KVR_REQ_ERROR_IDLE_TIMEOUT);
  kvr_router_on_request_error(r, KVR_REQ_ERROR_COUNT); /* out of range: ignored */
  kvr_router_on_client_error(r);
  kvr_router_on_client_abort(r);
  kvr_router_on_retries_exhausted(r);
  assert_metric(r, "kvrouter_request_errors_total{reason=\"connect\"} 2");
  assert_metric(r, "kvrouter_request_errors_total{reason=\"idle_timeout\"} 1");
  assert_metric(r, "kvrouter_request_errors_total{reason=\"client_error\"} 1");
  assert_metric(r, "kvrouter_request_errors_total{reason=\"client_abort\"} 1");
  assert_metric(r, "kvrouter_request_errors_total{reason=\"no_worker\"} 0");
  assert_metric(r, "kvrouter_retries_exhausted_total 1");
  assert_string_equal(kvr_req_error_name(KVR_REQ_ERROR_COUNT), "unknown");
  /* Worker state: one series per worker and state. */
  const kvr_worker_t *w0 = r->slots[0], *w1 = r->slots[1];
  for (int i = 0; i < 3; i++)
    kvr_router_on_health(r, w1->id, false);
  snprintf(line, sizeof line, "kvrouter_worker_state{worker=\"%s\",state=\"up\"} 1", w0->label);
  assert_metric(r, line);
  snprintf(line, sizeof line, "kvrouter_worker_state{worker=\"%s\",state=\"down\"} 0", w0->label);
  assert_metric(r, line);
  snprintf(line, sizeof line, "kvrouter_worker_state{worker=\"%s\",state=\"draining\"} 0",
           w0->label);
  assert_metric(r, line);
  snprintf(line, sizeof line, "kvrouter_worker_state{worker=\"%s\",state=\"up\"} 0", w1->label);
  assert_metric(r, line);
  snprintf(line, sizeof line, "kvrouter_worker_state{worker=\"%s\",state=\"down\"} 1", w1->label);
  assert_metric(r, line);
  /* Scrape age on the router's clock: scraped at 10 s, shown at 12.5 s. */
  kvr_vllm_metrics_t m = {.at_ms = t / 1000000u};
  assert_int_equal(kvr_router_on_scrape(r, w0->id, &m), 0);
  t += 2500000000ull;
  snprintf(line, sizeof line, "kvrouter_worker_scrape_age_seconds{worker=\"%s\"} 2.5", w0->label);
  assert_metric(r, line);
  kvr_buf_init(&b);
  kvr_router_view_metrics(r, &b);
  snprintf(line, sizeof line, "kvrouter_worker_scrape_age_seconds{worker=\"%s\"}", w1->label);
  assert_null(strstr(b.data, line));
  snprintf(line, sizeof line, "kvrouter_build_info{version=\"%s\",commit=\"%s\"} 1\n", KVR_VERSION,
           KVR_COMMIT);
  assert_non_null(strstr(b.data, line));
  kvr_buf_free(&b);
  fx_close(&f);
}

/* The process families from fixed figures (one sample each, none for an unreadable figure), and
 * this process's own figures. */
static void test_metrics_process(void **state) {
  (void)state;
  kvr_process_stats_t st = {.start_time_s = 1700000000.5,
                            .cpu_seconds = 1.25,
                            .rss_bytes = 4096 * 10,
                            .open_fds = 7,
                            .max_fds = -1};
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_metric_process(&b, &st);
  assert_string_equal(b.data,
                      "# HELP process_start_time_seconds Start time of the process since unix "
                      "epoch in seconds\n"
                      "# TYPE process_start_time_seconds gauge\n"
                      "process_start_time_seconds 1700000000.50\n"
                      "# HELP process_cpu_seconds_total Total user and system CPU time spent in "
                      "seconds\n"
                      "# TYPE process_cpu_seconds_total counter\n"
                      "process_cpu_seconds_total 1.25\n"
                      "# HELP process_resident_memory_bytes Resident memory size in bytes\n"
                      "# TYPE process_resident_memory_bytes gauge\n"
                      "process_resident_memory_bytes 40960\n"
                      "# HELP process_open_fds Number of open file descriptors\n"
                      "# TYPE process_open_fds gauge\n"
                      "process_open_fds 7\n"
                      "# HELP process_max_fds Maximum number of open file descriptors\n"
                      "# TYPE process_max_fds gauge\n");
  kvr_buf_free(&b);
  kvr_process_stats_read(&st);
  assert_true(st.start_time_s > 1e9);
  assert_true(st.cpu_seconds >= 0);
  assert_true(st.rss_bytes > 0);
  assert_true(st.open_fds >= 3);
  assert_true(st.max_fds >= st.open_fds);
}

/* Remembered Responses ids (router_affinity.c): a lookup finds the worker that stored the id,
 * "unknown" for ids never seen, "worker_gone" once the worker is drained away; past the bound the
 * oldest ids are forgotten (and counted) while newer ones stay findable through the table's
 * deletions (backward shift). */
static void test_response_id_affinity(void **state) {
  (void)state;
  fx_t f;
  kvr_config_init(&f.cfg);
  char err[256];
  for (int i = 0; i < 3; i++) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", 1 + i);
    assert_int_equal(kvr_config_add_worker(&f.cfg, url, err, sizeof err), 0);
  }
  f.cfg.scrape_interval_ms = 0;
  f.cfg.response_ids_max = 100;
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  kvr_router_t *r = f.r;
  kvr_router_dispatch_t acct[3];
  for (int s = 0; s < 3; s++) {
    memset(&acct[s], 0, sizeof acct[s]);
    acct[s].worker_id = r->slots[s]->id;
  }
  char id[32];
  for (int i = 0; i < 250; i++) {
    snprintf(id, sizeof id, "resp_%016x", i);
    kvr_router_on_response_id(r, &acct[i % 3], id, strlen(id));
  }
  assert_int_equal(kvr_affinity_size(r->response_ids), 100);
  assert_int_equal(r->response_ids_evicted_total, 150);
  for (int i = 0; i < 250; i++) {
    snprintf(id, sizeof id, "resp_%016x", i);
    int slot = kvr_router_on_response_lookup(r, id, strlen(id), 0);
    if (i < 150)
      assert_int_equal(slot, -1);
    else
      assert_int_equal(slot, i % 3);
  }
  assert_int_equal(r->response_id_lookups_total[KVR_AFFINITY_UNKNOWN], 150);
  assert_int_equal(r->response_id_lookups_total[KVR_AFFINITY_HIT], 100);
  /* The newest placement of an id wins; a drained worker's ids answer "gone". */
  snprintf(id, sizeof id, "resp_%016x", 249); /* on slot 0 */
  kvr_router_on_response_id(r, &acct[1], id, strlen(id));
  assert_int_equal(kvr_router_on_response_lookup(r, id, strlen(id), 0), 1);
  kvr_router_drain_worker(r, r->slots[1]->id);
  assert_int_equal(kvr_router_on_response_lookup(r, id, strlen(id), 0), -1);
  assert_int_equal(r->response_id_lookups_total[KVR_AFFINITY_GONE], 1);
  assert_int_equal(kvr_router_on_response_lookup(r, "", 0, 0), -1);
  fx_close(&f);
}

/* Open sessions (router_affinity.c): a stored response id counts on its worker until its
 * follow-up names it, its window passes or it is evicted; the window is 30 s until a follow-up
 * has been seen, then twice the mean wait from an id to its follow-up. The snapshot carries the
 * count. */
static void test_open_sessions(void **state) {
  (void)state;
  fx_t f;
  kvr_config_init(&f.cfg);
  char err[256];
  for (int i = 0; i < 2; i++) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", 1 + i);
    assert_int_equal(kvr_config_add_worker(&f.cfg, url, err, sizeof err), 0);
  }
  f.cfg.scrape_interval_ms = 0;
  f.cfg.response_ids_max = 8;
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  kvr_router_t *r = f.r;
  uint64_t t = 1000000000ull; /* 1 s */
  kvr_router_set_clock(r, fake_clock, &t);
  kvr_router_dispatch_t acct[2];
  for (int s = 0; s < 2; s++) {
    memset(&acct[s], 0, sizeof acct[s]);
    acct[s].worker_id = r->slots[s]->id;
  }
  /* Three sessions answered on worker 0, one on worker 1. */
  kvr_router_on_response_id(r, &acct[0], "resp_a1", 7);
  kvr_router_on_response_id(r, &acct[0], "resp_b1", 7);
  kvr_router_on_response_id(r, &acct[0], "resp_c1", 7);
  kvr_router_on_response_id(r, &acct[1], "resp_d1", 7);
  assert_int_equal(r->slots[0]->open_sessions, 3);
  assert_int_equal(r->slots[1]->open_sessions, 1);
  kvr_route_req_t req = {.block_chars = 64, .prompt_tokens = 100};
  kvr_decision_t d;
  kvr_router_decide(r, &req, NULL, false, &d);
  assert_int_equal(d.snaps[0].open_sessions, 3);
  assert_int_equal(d.snaps[1].open_sessions, 1);
  /* Session a's next turn comes 4 s later: closed, and the wait learnt (the window is now 8 s);
   * its answer opens it again. An id reported again opens nothing new; reported by another
   * worker, its open session moves there. */
  t += 4000000000ull;
  assert_int_equal(kvr_router_on_response_lookup(r, "resp_a1", 7, t / 1000000u), 0);
  assert_int_equal(r->slots[0]->open_sessions, 2);
  assert_true(fabs(r->response_gap_ms - 4000) < 1e-9);
  assert_int_equal(kvr_router_on_response_lookup(r, "resp_a1", 7, t / 1000000u), 0);
  assert_int_equal(r->slots[0]->open_sessions, 2); /* a GET of it again: nothing left to close */
  kvr_router_on_response_id(r, &acct[0], "resp_a2", 7);
  kvr_router_on_response_id(r, &acct[0], "resp_a2", 7);
  assert_int_equal(r->slots[0]->open_sessions, 3);
  kvr_router_on_response_id(r, &acct[1], "resp_a2", 7);
  assert_int_equal(r->slots[0]->open_sessions, 2);
  assert_int_equal(r->slots[1]->open_sessions, 2);
  kvr_router_on_response_id(r, &acct[0], "resp_a2", 7);
  assert_int_equal(r->slots[0]->open_sessions, 3);
  assert_int_equal(r->slots[1]->open_sessions, 1);
  /* 9 s after the first answers (b1, c1, d1: 8 s window passed), 5 s after a2: only a2 is open. */
  t += 4000000000ull + 1000000ull;
  kvr_router_decide(r, &req, NULL, false, &d);
  assert_int_equal(d.snaps[0].open_sessions, 1);
  assert_int_equal(d.snaps[1].open_sessions, 0);
  /* A follow-up after the window still finds its worker; it has nothing to close. */
  assert_int_equal(kvr_router_on_response_lookup(r, "resp_b1", 7, t / 1000000u), 0);
  assert_int_equal(r->slots[0]->open_sessions, 1);
  /* Past the map's bound the evicted open ids close: 8 new ids on worker 1 push out the rest. */
  char id[16];
  for (int i = 0; i < 8; i++) {
    snprintf(id, sizeof id, "resp_e%d", i);
    kvr_router_on_response_id(r, &acct[1], id, strlen(id));
  }
  assert_int_equal(r->slots[0]->open_sessions, 0);
  assert_int_equal(r->slots[1]->open_sessions, 8);
  /* A drained worker's ids close without it (nothing to decrement). */
  kvr_router_drain_worker(r, r->slots[1]->id);
  t += 60000000000ull;
  kvr_router_decide(r, &req, NULL, false, &d);
  assert_int_equal(d.snaps[0].open_sessions, 0);
  kvr_router_set_clock(r, NULL, NULL);
  fx_close(&f);
}

/* ---- models (issue 35) ------------------------------------------------------------------------
 */

/* A vLLM answer with two --served-model-name aliases of one model (same root) and a LoRA adapter
 * (parent: the first name; max_model_len null), as its GET /v1/models lists them. */
static const char *const LLAMA_LIST =
    "{\"object\":\"list\",\"data\":["
    "{\"id\":\"llama-70b\",\"object\":\"model\",\"created\":1700000001,\"owned_by\":\"vllm\","
    "\"root\":\"/models/Llama-3.3-70B\",\"parent\":null,\"max_model_len\":8192,\"permission\":[{"
    "\"id\":\"modelperm-1\",\"object\":\"model_permission\"}]},"
    "{\"id\":\"llama\",\"object\":\"model\",\"created\":1700000001,\"owned_by\":\"vllm\","
    "\"root\":\"/models/Llama-3.3-70B\",\"parent\":null,\"max_model_len\":8192,\"permission\":[]},"
    "{\"id\":\"sql-lora\",\"object\":\"model\",\"created\":1700000001,\"owned_by\":\"vllm\","
    "\"root\":\"/adapters/sql\",\"parent\":\"llama-70b\",\"max_model_len\":null,\"permission\":[]}"
    "]}";

/* Decides for a request naming model (record true, nothing tried). */
static int decide_model(kvr_router_t *r, const char *model) {
  kvr_route_req_t req = {0};
  kvr_router_avoid_t avoid = {NULL, 0, false, model, 0, false};
  kvr_decision_t d;
  return kvr_router_decide(r, &req, &avoid, true, &d);
}

/* Which workers a request is eligible for: the exact ids their lists hold (aliases and adapters
 * included), any worker whose list is not known (not read yet, or back up after DOWN), every
 * worker for a request naming no model; a name no worker serves is unknown (the proxy's 404) only
 * once every worker's list is known, draining workers aside. The admission bound counts only the
 * workers serving the request's model. */
static void test_models_eligibility(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  const kvr_worker_t *w0 = r->slots[0], *w1 = r->slots[1], *w2 = r->slots[2];
  assert_true(kvr_router_worker_serves(w0, "anything"));
  assert_false(kvr_router_model_unknown(r, "anything"));
  assert_int_equal(feed_models(r, w0->id, LLAMA_LIST), 0);
  assert_int_equal(feed_model(r, w1->id, "qwen-32b", 24704), 0);
  assert_int_equal(w0->models.n, 3);
  assert_int_equal(w0->max_model_len, 8192); /* the adapter's null is no context */
  assert_string_equal(w0->models.v[2].parent, "llama-70b");
  /* an adapter (a card with a parent) keys its blocks with its name in precise mode */
  assert_true(kvr_router_model_is_adapter(r, "sql-lora"));
  assert_false(kvr_router_model_is_adapter(r, "llama-70b"));
  assert_false(kvr_router_model_is_adapter(r, "qwen-32b"));
  assert_false(kvr_router_model_is_adapter(r, "nope"));
  assert_false(kvr_router_model_is_adapter(r, NULL));
  const char *yes[] = {"llama-70b", "llama", "sql-lora", "", NULL};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(yes); i++)
    assert_true(kvr_router_worker_serves(w0, yes[i]));
  const char *no[] = {"qwen-32b", "Llama", "llama ", "/models/Llama-3.3-70B", "llama-70b/sql-lora"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(no); i++)
    assert_false(kvr_router_worker_serves(w0, no[i]));
  /* w2's list is not known: it takes any model, so no name is unknown yet. */
  assert_false(kvr_router_model_unknown(r, "nope"));
  for (int i = 0; i < 4; i++) {
    assert_int_equal(decide_model(r, "nope"), 2);
    int l = decide_model(r, "sql-lora"), q = decide_model(r, "qwen-32b");
    assert_true(l == 0 || l == 2);
    assert_true(q == 1 || q == 2);
  }
  /* Every list known: a name none holds is unknown, a listed one or none is not. */
  assert_int_equal(feed_model(r, w2->id, "qwen-32b", 24704), 0);
  assert_true(kvr_router_model_unknown(r, "nope"));
  assert_false(kvr_router_model_unknown(r, "sql-lora"));
  assert_false(kvr_router_model_unknown(r, ""));
  assert_false(kvr_router_model_unknown(r, NULL));
  assert_int_equal(decide_model(r, "nope"), KVR_POLICY_NONE);
  int seen[3] = {0};
  for (int i = 0; i < 6; i++)
    seen[decide_model(r, "qwen-32b")]++;
  assert_int_equal(seen[0], 0);
  assert_int_equal(seen[1], 3);
  assert_int_equal(seen[2], 3);
  for (int i = 0; i < 3; i++)
    seen[decide_model(r, NULL)]++;
  assert_int_equal(seen[0], 1);
  /* Back up after DOWN (it may have restarted with another model): any model until read again. */
  for (int i = 0; i < 3; i++)
    kvr_router_on_health(r, w1->id, false);
  assert_int_equal(w1->state, KVR_WORKER_DOWN);
  assert_true(kvr_router_model_unknown(r, "nope")); /* a down worker's list still counts */
  kvr_router_on_health(r, w1->id, true);
  assert_false(w1->models_known);
  assert_int_equal(w1->models.n, 1); /* kept for the views */
  assert_true(kvr_router_worker_serves(w1, "nope"));
  assert_false(kvr_router_model_unknown(r, "nope"));
  assert_int_equal(feed_model(r, w1->id, "mistral", 32768), 0);
  assert_true(kvr_router_model_unknown(r, "nope"));
  /* A draining worker's models do not count: qwen-32b was w2's alone. */
  kvr_router_dispatch_t d;
  kvr_router_on_dispatch(r, 2, 10, 0, &d);
  assert_int_equal(kvr_router_drain_worker(r, w2->id), 0);
  assert_true(kvr_router_model_unknown(r, "qwen-32b"));
  kvr_router_on_end(r, &d);
  assert_null(r->slots[2]);
  /* The admission bound looks at the workers serving the model. */
  f.cfg.admission_max_inflight = 1;
  kvr_router_dispatch_t busy;
  kvr_router_on_dispatch(r, 0, 10, 0, &busy);
  kvr_router_avoid_t llama = {.model = "llama"}, mistral = {.model = "mistral"};
  assert_true(kvr_router_admission_blocked(r, &llama));
  assert_false(kvr_router_admission_blocked(r, &mistral));
  assert_false(kvr_router_admission_blocked(r, NULL));
  kvr_router_on_end(r, &busy);
  assert_false(kvr_router_admission_blocked(r, &llama));
  assert_idle(r);
  fx_close(&f);
}

/* The contract over the registry: whatever a policy prefers, it picks among the workers serving
 * the request's model only. Eight workers, the even ones serving A, the odd ones B; the odd ones
 * hold the prompt's blocks and the even ones carry all the load, so every policy would rather
 * pick an odd worker for an A request. Requests name A or B with random tried sets (picks and
 * looks); a request naming no model may go anywhere. */
/* Precise mode tokenizes a prompt on a usable precise worker serving its model, so each model's
 * prompts go through that model's tokenizer (issue 35); a model no precise worker serves is routed
 * on the approximate index (0). */
static void test_models_tokenizer(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "round_robin");
  kvr_router_t *r = f.r;
  const char *url = NULL;
  assert_int_equal(kvr_router_kv_tokenizer(r, "A", &url), 0); /* nobody precise yet */
  for (int i = 0; i < 3; i++) {
    feed_model(r, r->slots[i]->id, i == 2 ? "C" : i ? "B" : "A", 8192);
    kvr_vllm_metrics_t m = {
        .at_ms = kvr_now_ns() / 1000000u, .num_gpu_blocks = 1000, .block_size = 16u << i};
    assert_int_equal(kvr_router_on_scrape(r, r->slots[i]->id, &m), 0);
    if (i < 2)
      kvr_router_on_kv_mode(r, r->slots[i]->id, true, "precise");
  }
  assert_int_equal(kvr_router_kv_tokenizer(r, "B", &url), 32);
  assert_string_equal(url, r->slots[1]->url);
  assert_int_equal(kvr_router_kv_tokenizer(r, "A", &url), 16);
  assert_string_equal(url, r->slots[0]->url);
  assert_int_equal(kvr_router_kv_tokenizer(r, "C", &url), 0);   /* C's worker is not precise */
  assert_int_equal(kvr_router_kv_tokenizer(r, NULL, &url), 16); /* any: the first */
  fx_close(&f);
}

static void test_models_policy_contract(void **state) {
  (void)state;
  static uint64_t blocks[32];
  for (size_t i = 0; i < 32; i++)
    blocks[i] = 0xb10c0000 + i;
  for (size_t k = 0; kvr_policy_registry[k]; k++) {
    fx_t f;
    fx_open(&f, 8, kvr_policy_registry[k]->name);
    kvr_router_t *r = f.r;
    kvr_router_dispatch_t load[8][4];
    for (int i = 0; i < 8; i++) {
      feed_model(r, r->slots[i]->id, i % 2 ? "B" : "A", 8192);
      for (int j = 0; j < 4; j++)
        kvr_router_on_dispatch(r, i, i % 2 ? 1 : 5000, 0, &load[i][j]);
      if (i % 2)
        kvr_router_on_learn(r, &load[i][0], blocks, 32);
      else
        for (int j = 0; j < 3; j++)
          kvr_router_on_end(r, &load[i][j + 1]); /* odd ones keep 4 short, even ones 1 long */
    }
    kvr_route_req_t req = {
        .blocks = blocks, .nblocks = 32, .block_chars = 64, .prompt_tokens = 512};
    uint64_t rng = 42 + k;
    for (int n = 0; n < 200; n++) {
      const char *model = n % 3 == 0 ? "A" : n % 3 == 1 ? "B" : NULL;
      int tried[3], ntried = (int)(kvr_splitmix64(&rng) % 4);
      for (int t = 0; t < ntried; t++)
        tried[t] = (int)(kvr_splitmix64(&rng) % 8);
      kvr_router_avoid_t avoid = {tried, (size_t)ntried, false, model, 0, false};
      kvr_decision_t d;
      int pick = kvr_router_decide(r, &req, &avoid, n % 2 == 0, &d);
      if (pick == KVR_POLICY_NONE) { /* only when every worker of the model was tried */
        assert_non_null(model);
        for (int i = model[0] == 'A' ? 0 : 1; i < 8; i += 2) {
          bool was = false;
          for (int t = 0; t < ntried; t++)
            was |= tried[t] == i;
          assert_true(was);
        }
        continue;
      }
      for (int t = 0; t < ntried; t++)
        assert_int_not_equal(pick, tried[t]);
      if (model)
        assert_int_equal(pick % 2, model[0] == 'A' ? 0 : 1);
      assert_true(kvr_router_worker_serves(r->slots[pick], model));
    }
    for (int i = 0; i < 8; i++)
      for (int j = 0; j < (i % 2 ? 4 : 1); j++)
        kvr_router_on_end(r, &load[i][j]);
    assert_idle(r);
    fx_close(&f);
  }
}

/* The public GET /v1/models: the union over usable workers whose lists are known, each id once
 * with the card of the first worker (slot order) that lists it, vLLM's fields as it gave them. */
static void test_models_union(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 4, "round_robin");
  kvr_router_t *r = f.r;
  kvr_buf_t b = KVR_BUF_INIT;
  assert_int_equal(kvr_router_view_models(r, &b), 0); /* no list known: a worker answers */
  assert_string_equal(b.data, "{\"object\":\"list\",\"data\":[]}");
  kvr_buf_reset(&b);
  const char *other =
      "{\"object\":\"list\",\"data\":[{\"id\":\"llama\",\"object\":\"model\",\"created\":2,"
      "\"owned_by\":\"vllm\",\"root\":\"/elsewhere\",\"parent\":null,\"max_model_len\":4096},"
      "{\"id\":\"qwen-32b\",\"object\":\"model\",\"created\":3,\"owned_by\":\"vllm\",\"root\":"
      "\"Qwen/Qwen3-32B\",\"parent\":null,\"max_model_len\":24704,\"permission\":[]}]}";
  feed_models(r, r->slots[0]->id, LLAMA_LIST);
  feed_models(r, r->slots[1]->id, other);
  feed_model(r, r->slots[2]->id, "mistral", 32768);
  for (int i = 0; i < 3; i++) /* worker 2 is down: not in the union */
    kvr_router_on_health(r, r->slots[2]->id, false);
  /* worker 3's list is unknown: nothing of it */
  assert_int_equal(kvr_router_view_models(r, &b), 2);
  const char *want =
      "{\"object\":\"list\",\"data\":["
      "{\"id\":\"llama-70b\",\"object\":\"model\",\"created\":1700000001,\"owned_by\":\"vllm\","
      "\"root\":\"/models/Llama-3.3-70B\",\"parent\":null,\"max_model_len\":8192,\"permission\":[{"
      "\"id\":\"modelperm-1\",\"object\":\"model_permission\"}]},"
      "{\"id\":\"llama\",\"object\":\"model\",\"created\":1700000001,\"owned_by\":\"vllm\","
      "\"root\":\"/models/"
      "Llama-3.3-70B\",\"parent\":null,\"max_model_len\":8192,\"permission\":[]},"
      "{\"id\":\"sql-lora\",\"object\":\"model\",\"created\":1700000001,\"owned_by\":\"vllm\","
      "\"root\":\"/adapters/"
      "sql\",\"parent\":\"llama-70b\",\"max_model_len\":null,\"permission\":[]},"
      "{\"id\":\"qwen-32b\",\"object\":\"model\",\"created\":3,\"owned_by\":\"vllm\",\"root\":"
      "\"Qwen/Qwen3-32B\",\"parent\":null,\"max_model_len\":24704,\"permission\":[]}]}";
  assert_string_equal(b.data, want);
  /* The admin view lists each worker's ids. */
  cJSON *ws = kvr_router_view_workers(r);
  const cJSON *m0 = cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 0), "models");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(m0, "known")));
  const cJSON *ids = cJSON_GetObjectItem(m0, "ids");
  assert_int_equal(cJSON_GetArraySize(ids), 3);
  const cJSON *lora = cJSON_GetArrayItem(ids, 2);
  assert_string_equal(cJSON_GetObjectItem(lora, "id")->valuestring, "sql-lora");
  assert_string_equal(cJSON_GetObjectItem(lora, "parent")->valuestring, "llama-70b");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(lora, "max_model_len")));
  const cJSON *m3 = cJSON_GetObjectItem(cJSON_GetArrayItem(ws, 3), "models");
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(m3, "known")));
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(m3, "ids")), 0);
  cJSON_Delete(ws);
  kvr_buf_free(&b);
  fx_close(&f);
}

/* The model label on the request, TTFT, ITL and token families: a listed name, other for any other
 * name, none for a request without one; usage tokens under the request's model, scraped counters
 * under the worker's first id; listed models shown at 0 before any request; the model families;
 * at most KVR_MODEL_LABELS_MAX names, and only label-safe ones, get a label of their own. */
static void test_models_metrics(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "round_robin");
  kvr_router_t *r = f.r;
  const kvr_worker_t *w0 = r->slots[0], *w1 = r->slots[1];
  feed_models(r, w0->id, LLAMA_LIST);
  feed_model(r, w1->id, "qwen-32b", 24704);
  assert_metric(r, "kvrouter_time_to_first_token_seconds_count{model=\"qwen-32b\"} 0");
  assert_metric(r, "kvrouter_prompt_tokens_total{model=\"sql-lora\"} 0");
  kvr_router_on_response(r, 200, KVR_ROUTE_CHAT, "0", "llama");
  kvr_router_on_response(r, 200, KVR_ROUTE_CHAT, "0", "sql-lora");
  kvr_router_on_response(r, 200, KVR_ROUTE_CHAT, "0", "sql-lora");
  kvr_router_on_response(r, 404, KVR_ROUTE_CHAT, NULL, "gpt-4");
  kvr_router_on_response(r, 200, KVR_ROUTE_MODELS, NULL, NULL);
  assert_metric(r, "kvrouter_http_requests_total{code=\"200\",route=\"chat_completions\","
                   "worker=\"0\",model=\"llama\"} 1");
  assert_metric(r, "kvrouter_http_requests_total{code=\"200\",route=\"chat_completions\","
                   "worker=\"0\",model=\"sql-lora\"} 2");
  assert_metric(r, "kvrouter_http_requests_total{code=\"404\",route=\"chat_completions\","
                   "worker=\"none\",model=\"other\"} 1");
  assert_metric(r, "kvrouter_http_requests_total{code=\"200\",route=\"models\",worker=\"none\","
                   "model=\"none\"} 1");
  kvr_router_observe_ttft(r, "llama", 0.2);
  kvr_router_observe_itl(r, "llama", 0.01);
  kvr_router_observe_itl(r, "llama", 0.02);
  kvr_router_observe_ttft(r, "gpt-4", 0.3);
  assert_metric(r, "kvrouter_time_to_first_token_seconds_count{model=\"llama\"} 1");
  assert_metric(r, "kvrouter_inter_token_latency_seconds_count{model=\"llama\"} 2");
  assert_metric(r, "kvrouter_time_to_first_token_seconds_count{model=\"other\"} 1");
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_router_view_metrics(r, &b);
  assert_null(strstr(b.data, "{model=\"none\"}")); /* no figure under none yet: not shown */
  kvr_buf_free(&b);
  /* Usage: under the request's model (an adapter is a model of its own). */
  kvr_router_dispatch_t d;
  kvr_router_on_dispatch_model(r, 0, 100, 0, "sql-lora", &d);
  kvr_router_usage_t u = {.prompt_tokens = 100, .completion_tokens = 10};
  kvr_router_on_usage(r, &d, &u);
  kvr_router_on_end(r, &d);
  assert_metric(r, "kvrouter_prompt_tokens_total{model=\"sql-lora\"} 100");
  assert_metric(r, "kvrouter_generation_tokens_total{model=\"sql-lora\"} 10");
  /* A request naming no model: under the name vLLM serves it with, the worker's first id. */
  kvr_router_on_dispatch_model(r, 0, 7, 0, NULL, &d);
  u = (kvr_router_usage_t){.prompt_tokens = 7, .completion_tokens = 1};
  kvr_router_on_usage(r, &d, &u);
  kvr_router_on_end(r, &d);
  assert_metric(r, "kvrouter_prompt_tokens_total{model=\"llama-70b\"} 7");
  /* Scraped counters: under the worker's first id, the model_name vLLM's counters carry. */
  kvr_vllm_metrics_t m = {.at_ms = 1};
  m.counters.present = 1u << KVR_VLLM_PROMPT | 1u << KVR_VLLM_GENERATION;
  kvr_router_on_scrape(r, w1->id, &m); /* the baseline */
  m.counters.v[KVR_VLLM_PROMPT] = 50;
  m.counters.v[KVR_VLLM_GENERATION] = 5;
  kvr_router_on_scrape(r, w1->id, &m);
  assert_metric(r, "kvrouter_prompt_tokens_total{model=\"qwen-32b\"} 50");
  assert_metric(r, "kvrouter_generation_tokens_total{model=\"qwen-32b\"} 5");
  assert_int_equal(r->prompt_tokens_total, 157);
  /* The model families. */
  assert_metric(r, "kvrouter_model_workers{model=\"llama\"} 1");
  assert_metric(r, "kvrouter_model_workers{model=\"qwen-32b\"} 1");
  assert_metric(r, "kvrouter_worker_model_info{model=\"sql-lora\",worker=\"0\"} 1");
  for (int i = 0; i < 3; i++)
    kvr_router_on_health(r, w1->id, false);
  assert_metric(r, "kvrouter_model_workers{model=\"qwen-32b\"} 0");
  /* The label table's bound: 256 listed names (the 4 above included), then other. */
  kvr_buf_t list = KVR_BUF_INIT;
  int next = 0;
  for (int round = 0; round < 6; round++) { /* 6 x 62 new names */
    kvr_buf_reset(&list);
    kvr_buf_puts(&list, "{\"data\":[");
    for (int i = 0; i < KVR_VLLM_MODELS_MAX - 2; i++)
      kvr_buf_printf(&list, "%s{\"id\":\"name-%d\"}", i ? "," : "", next++);
    kvr_buf_puts(&list, ",{\"id\":\"a b\"},{\"id\":\"none\"}]}");
    feed_models(r, w0->id, list.data);
  }
  assert_int_equal(r->nmodel_labels, KVR_MODEL_LABELS_MAX + 2);
  assert_string_equal(kvr_router_model_label(r, "name-0"), "name-0"); /* no longer listed: kept */
  assert_string_equal(kvr_router_model_label(r, "name-251"), "name-251"); /* 4 + 252 = 256 */
  assert_string_equal(kvr_router_model_label(r, "name-252"), "other");
  assert_string_equal(kvr_router_model_label(r, "a b"), "other");
  assert_string_equal(kvr_router_model_label(r, "none"), "other");
  assert_string_equal(kvr_router_model_label(r, ""), "none");
  /* Eligibility is not bounded by the labels: the last list's names are all served. */
  char last[32];
  snprintf(last, sizeof last, "name-%d", next - 1);
  assert_true(kvr_router_worker_serves(w0, last));
  assert_true(kvr_router_worker_serves(w0, "a b"));
  assert_false(kvr_router_worker_serves(w0, "name-0"));
  kvr_buf_free(&list);
  fx_close(&f);
}

/* ---- LoRA adapters (issue 35) -------------------------------------------------------------------
 */

/* Worker id's /metrics page with vllm:lora_requests_info naming running (taken now). */
static void feed_lora_page(kvr_router_t *r, uint32_t id, const char *running) {
  char page[512];
  snprintf(page, sizeof page,
           "vllm:num_requests_running 1\n"
           "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\","
           "waiting_lora_adapters=\"\"} 100\n"
           "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"%s\","
           "waiting_lora_adapters=\"\"} 200\n",
           running);
  kvr_vllm_metrics_t m;
  assert_int_equal(kvr_vllm_parse_metrics(page, strlen(page), kvr_router_now_ns(r) / 1000000u, &m),
                   0);
  assert_int_equal(kvr_router_on_scrape(r, id, &m), 0);
}

/* The adapter state each decision gives the policy: running where the worker's fresh /metrics
 * has it in the batch, loaded where its list holds it, none elsewhere and for base names; kv_aware
 * sends the request to the running worker. */
static void test_lora_adapter_state(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "kv_aware");
  kvr_router_t *r = f.r;
  assert_int_equal(feed_models(r, r->slots[0]->id, LLAMA_LIST), 0);
  assert_int_equal(feed_models(r, r->slots[1]->id, LLAMA_LIST), 0);
  assert_int_equal(feed_model(r, r->slots[2]->id, "llama-70b", 8192), 0);
  feed_lora_page(r, r->slots[1]->id, "other,sql-lora");
  assert_true(r->slots[1]->lora.present);
  assert_string_equal(r->slots[1]->lora.running, "other,sql-lora");
  kvr_route_req_t req = {.prompt_tokens = 100, .block_chars = 64};
  kvr_router_avoid_t avoid = {NULL, 0, false, "sql-lora", 0, false};
  kvr_decision_t d;
  for (int i = 0; i < 5; i++)
    assert_int_equal(kvr_router_decide(r, &req, &avoid, true, &d), 1);
  assert_int_equal(d.snaps[0].adapter, KVR_ADAPTER_LOADED);
  assert_int_equal(d.snaps[1].adapter, KVR_ADAPTER_RUNNING);
  assert_int_equal(d.snaps[2].adapter, KVR_ADAPTER_NONE);
  assert_false(d.snaps[2].usable); /* it does not list the adapter */
  /* A base name: no adapter anywhere, every worker eligible. */
  avoid.model = "llama-70b";
  kvr_router_decide(r, &req, &avoid, false, &d);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(d.snaps[i].adapter, KVR_ADAPTER_NONE);
    assert_true(d.snaps[i].usable);
  }
  /* Stale figures say nothing of the batch: loaded, not running. */
  kvr_vllm_metrics_t stale = {.at_ms = 1};
  stale.lora = r->slots[1]->lora;
  assert_int_equal(kvr_router_on_scrape(r, r->slots[1]->id, &stale), 0);
  avoid.model = "sql-lora";
  kvr_router_decide(r, &req, &avoid, false, &d);
  assert_int_equal(d.snaps[1].adapter, KVR_ADAPTER_LOADED);
  /* A page without the series (LoRA off): nothing running. */
  kvr_vllm_metrics_t plain = {.at_ms = kvr_router_now_ns(r) / 1000000u};
  assert_int_equal(kvr_router_on_scrape(r, r->slots[1]->id, &plain), 0);
  assert_false(r->slots[1]->lora.present);
  fx_close(&f);
}

/* Runtime adapters (--lora-adapter): eligible where listed and on every worker of their base (any
 * worker without a base); a load in progress counts as loaded; a finished one adds the card until
 * the next list; failures add nothing; the counters. Every policy of the registry stays within
 * the eligible workers. */
static void test_lora_runtime_adapters(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 3, "kv_aware");
  kvr_router_t *r = f.r;
  char err[256];
  assert_int_equal(
      kvr_config_add_lora_adapter(
          &f.cfg, "{\"name\":\"dyn\",\"path\":\"/adapters/dyn\",\"base_model_name\":\"llama-70b\"}",
          err, sizeof err),
      0);
  assert_int_equal(kvr_config_add_lora_adapter(&f.cfg, "any=/adapters/any", err, sizeof err), 0);
  const kvr_worker_t *w0 = r->slots[0], *w1 = r->slots[1], *w2 = r->slots[2];
  assert_int_equal(feed_models(r, w0->id, LLAMA_LIST), 0);
  assert_int_equal(feed_model(r, w1->id, "qwen-32b", 24704), 0);
  /* w2's list is not known: it is eligible for anything. */
  assert_false(kvr_router_model_unknown(r, "dyn"));
  assert_null(kvr_router_lora_dynamic(r, "sql-lora"));
  assert_non_null(kvr_router_lora_dynamic(r, "dyn"));
  assert_int_equal(feed_model(r, w2->id, "qwen-32b", 24704), 0);
  assert_false(kvr_router_model_unknown(r, "dyn"));
  assert_false(kvr_router_model_unknown(r, "any"));
  for (int i = 0; i < 6; i++) {
    assert_int_equal(decide_model(r, "dyn"), 0); /* the only llama-70b worker */
    int k = decide_model(r, "any");
    assert_true(k >= 0 && k <= 2);
  }
  assert_non_null(kvr_router_lora_needs_load(r, w0, "dyn"));
  assert_null(kvr_router_lora_needs_load(r, w0, "sql-lora")); /* listed, not runtime */
  assert_null(kvr_router_lora_needs_load(r, w0, "llama-70b"));
  /* Loading "any" on w1: loaded there for decisions while in flight. */
  assert_int_equal(kvr_router_on_lora_load_start(r, w1->url, "any"), 0);
  kvr_route_req_t req = {.prompt_tokens = 100, .block_chars = 64};
  kvr_router_avoid_t avoid = {NULL, 0, false, "any", 0, false};
  kvr_decision_t d;
  for (int i = 0; i < 4; i++)
    assert_int_equal(kvr_router_decide(r, &req, &avoid, true, &d), 1);
  assert_int_equal(d.snaps[0].adapter, KVR_ADAPTER_NONE);
  assert_int_equal(d.snaps[1].adapter, KVR_ADAPTER_LOADED);
  /* It ends "already loaded": the card is added, parent the worker's first base name. */
  const kvr_lora_adapter_t *any = kvr_router_lora_dynamic(r, "any");
  assert_int_equal(kvr_router_on_lora_load_done(r, w1->url, any, KVR_LORA_LOAD_ALREADY_LOADED), 0);
  assert_int_equal(w1->nlora_loading, 0);
  const kvr_vllm_model_t *c = kvr_vllm_models_find(&w1->models, "any");
  assert_non_null(c);
  assert_string_equal(c->parent, "qwen-32b");
  assert_string_equal(c->root, "/adapters/any");
  assert_null(kvr_router_lora_needs_load(r, w1, "any"));
  assert_true(kvr_router_worker_serves(w1, "any"));
  assert_string_equal(kvr_router_model_label(r, "any"), "any");
  /* "dyn" on w0 fails: nothing added, still to load. */
  const kvr_lora_adapter_t *dyn = kvr_router_lora_dynamic(r, "dyn");
  assert_int_equal(kvr_router_on_lora_load_start(r, w0->url, "dyn"), 0);
  assert_int_equal(kvr_router_on_lora_load_done(r, w0->url, dyn, KVR_LORA_LOAD_FAILED), 0);
  assert_non_null(kvr_router_lora_needs_load(r, w0, "dyn"));
  assert_int_equal(kvr_router_on_lora_load_start(r, w0->url, "dyn"), 0);
  assert_int_equal(kvr_router_on_lora_load_done(r, w0->url, dyn, KVR_LORA_LOAD_LOADED), 0);
  assert_string_equal(kvr_vllm_models_find(&w0->models, "dyn")->parent, "llama-70b");
  assert_int_equal(kvr_router_on_lora_load_start(r, "http://127.0.0.1:999", "dyn"), KVR_ENOENT);
  assert_int_equal(
      kvr_router_on_lora_load_done(r, "http://127.0.0.1:999", dyn, KVR_LORA_LOAD_FAILED),
      KVR_ENOENT);
  assert_metric(r, "kvrouter_lora_load_attempts_total 4");
  assert_metric(r, "kvrouter_lora_loads_total{result=\"loaded\"} 1");
  assert_metric(r, "kvrouter_lora_loads_total{result=\"already_loaded\"} 1");
  assert_metric(r, "kvrouter_lora_loads_total{result=\"failed\"} 2");
  /* The data-parallel ranks of one server are workers of one URL: one load marks and lists the
   * adapter on each of them. */
  assert_int_equal(kvr_router_add_workers(r, "http://127.0.0.1:77", 2, NULL, NULL, err, sizeof err),
                   2);
  const kvr_worker_t *rank[2] = {NULL, NULL};
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && strcmp(r->slots[i]->url, "http://127.0.0.1:77") == 0)
      rank[r->slots[i]->dp_rank] = r->slots[i];
  assert_non_null(rank[0]);
  assert_non_null(rank[1]);
  assert_int_equal(kvr_router_on_lora_load_start(r, "http://127.0.0.1:77", "any"), 0);
  assert_int_equal(rank[0]->nlora_loading, 1);
  assert_int_equal(rank[1]->nlora_loading, 1);
  assert_int_equal(
      kvr_router_on_lora_load_done(r, "http://127.0.0.1:77", any, KVR_LORA_LOAD_LOADED), 0);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(rank[k]->nlora_loading, 0);
    assert_null(kvr_router_lora_needs_load(r, rank[k], "any"));
  }
  assert_int_equal(kvr_router_drain_worker(r, rank[0]->id), 0);
  assert_int_equal(kvr_router_drain_worker(r, rank[1]->id), 0);
  /* The next list that does not hold it: to be loaded again. */
  assert_int_equal(feed_model(r, w1->id, "qwen-32b", 24704), 0);
  assert_non_null(kvr_router_lora_needs_load(r, w1, "any"));
  /* Every policy stays within the eligible workers for a runtime adapter with a base. */
  for (size_t k = 0; kvr_policy_registry[k]; k++) {
    assert_int_equal(kvr_router_set_policy(r, kvr_policy_registry[k]->name, NULL, err, sizeof err),
                     0);
    for (int i = 0; i < 20; i++)
      assert_int_equal(decide_model(r, "dyn"), 0);
  }
  fx_close(&f);
}

/* A batch of one STORED block of 4 tokens (engine hash h), naming dp_rank (-1: none); it points
 * into static storage, valid until the next call. */
static void one_block_batch(kvr_kv_batch_t *b, int64_t dp_rank, uint64_t h) {
  static uint32_t toks[4] = {11, 12, 13, 14};
  static uint64_t extra[1];
  static kvr_kv_event_t ev;
  memset(b, 0, sizeof *b);
  memset(&ev, 0, sizeof ev);
  ev.kind = KVR_KV_STORED;
  ev.nhashes = 1;
  ev.ntokens = 4;
  ev.block_size = 4;
  ev.group_idx = -1;
  b->ev = &ev;
  b->nev = 1;
  b->extra = extra;
  b->nhashes = 1;
  b->tokens = toks;
  b->ntokens = 4;
  b->dp_rank = dp_rank;
  static uint64_t hash;
  hash = h;
  b->hashes = &hash;
}

/* Data-parallel ranks (issue 35): one URL with dp_size 3 is three workers, rank 0..2, each with
 * its key, its slot, vLLM's KV-event endpoint of its rank (port + rank; ipc: _dp<rank>), its own
 * stream (a batch of another rank is counted and dropped), its own scraped figures; a URL is
 * served once (whole or by ranks); a whole server whose page shows several engines is flagged. */
static void test_data_parallel(void **state) {
  (void)state;
  fx_t f;
  kvr_config_init(&f.cfg);
  char err[256];
  assert_int_equal(kvr_config_add_worker_spec(&f.cfg,
                                              "http://10.0.0.1:8000,dp_size=3,kv_events=tcp://"
                                              "10.0.0.1:5557,kv_replay=tcp://10.0.0.1:6557",
                                              err, sizeof err),
                   0);
  assert_int_equal(kvr_config_add_worker(&f.cfg, "http://10.0.0.2:8000", err, sizeof err), 0);
  f.cfg.scrape_interval_ms = 0;
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  kvr_router_t *r = f.r;
  assert_int_equal(r->nslots, 4);
  for (int k = 0; k < 3; k++) {
    const kvr_worker_t *w = r->slots[k];
    char key[64], ev[64], rp[64];
    snprintf(key, sizeof key, "http://10.0.0.1:8000#dp=%d", k);
    snprintf(ev, sizeof ev, "tcp://10.0.0.1:%d", 5557 + k);
    snprintf(rp, sizeof rp, "tcp://10.0.0.1:%d", 6557 + k);
    assert_string_equal(w->url, "http://10.0.0.1:8000");
    assert_string_equal(w->key, key);
    assert_int_equal(w->dp_rank, k);
    assert_int_equal(w->dp_size, 3);
    assert_string_equal(w->kv_events, ev);
    assert_string_equal(w->kv_replay, rp);
    assert_ptr_equal(kvr_router_worker_serving(r, key), w);
    assert_ptr_equal(kvr_router_worker_serving_rank(r, "http://10.0.0.1:8000", k), w);
  }
  const kvr_worker_t *whole = r->slots[3];
  assert_int_equal(whole->dp_rank, -1);
  assert_int_equal(whole->dp_size, 0);
  assert_string_equal(whole->key, "http://10.0.0.2:8000");
  assert_null(kvr_router_worker_serving(r, "http://10.0.0.1:8000")); /* ranks only */

  /* A URL is served once: whole or by ranks; a refused add adds nothing. */
  assert_int_equal(
      kvr_router_add_workers(r, "http://10.0.0.1:8000", 0, NULL, NULL, err, sizeof err),
      KVR_EINVAL);
  assert_non_null(strstr(err, "already configured"));
  assert_int_equal(
      kvr_router_add_workers(r, "http://10.0.0.2:8000/", 2, NULL, NULL, err, sizeof err),
      KVR_EINVAL);
  assert_int_equal(
      kvr_router_add_workers(r, "http://10.0.0.3:8000", 2, "tcp://h:65535", NULL, err, sizeof err),
      KVR_EINVAL);
  assert_non_null(strstr(err, "rank 1 would publish on port 65536"));
  assert_int_equal(r->nslots, 4);
  /* ipc endpoints get vLLM's _dp<rank> suffix. */
  assert_int_equal(
      kvr_router_add_workers(r, "http://10.0.0.3:8000", 2, "ipc:///run/ev", NULL, err, sizeof err),
      2);
  assert_string_equal(r->slots[4]->kv_events, "ipc:///run/ev");
  assert_string_equal(r->slots[5]->kv_events, "ipc:///run/ev_dp1");
  assert_null(r->slots[5]->kv_replay);

  /* Each rank's stream feeds its rank: a batch naming another rank is counted and dropped, one
   * naming none (an older publisher) is the stream's. A whole server takes any rank. */
  kvr_kv_batch_t b;
  one_block_batch(&b, 1, 0xb1);
  kvr_router_on_kv_batch(r, r->slots[1]->id, &b);
  assert_int_equal(kvr_kv_index_blocks(r->kv_index, 1), 1);
  one_block_batch(&b, 2, 0xb2);
  kvr_router_on_kv_batch(r, r->slots[1]->id, &b);
  assert_int_equal(kvr_kv_index_blocks(r->kv_index, 1), 1);
  assert_int_equal(kvr_kv_index_blocks(r->kv_index, 2), 0);
  assert_int_equal(r->slots[1]->kv_rank_dropped, 1);
  assert_int_equal(r->kv_rank_dropped_total, 1);
  one_block_batch(&b, -1, 0xb3);
  kvr_router_on_kv_batch(r, r->slots[0]->id, &b);
  assert_int_equal(kvr_kv_index_blocks(r->kv_index, 0), 1);
  one_block_batch(&b, 5, 0xb4);
  kvr_router_on_kv_batch(r, whole->id, &b);
  assert_int_equal(kvr_kv_index_blocks(r->kv_index, 3), 1);
  assert_int_equal(whole->kv_rank_dropped, 0);

  /* Scraped figures: each rank its engine's series of the one page. */
  static const char page[] = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2\n"
                             "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 7\n"
                             "vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 3\n"
                             "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
                             "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.75\n";
  kvr_vllm_metrics_t m;
  for (int k = 0; k < 2; k++) {
    assert_int_equal(kvr_vllm_parse_metrics_engine(page, strlen(page), 100, k, &m), 0);
    assert_int_equal(kvr_router_on_scrape(r, r->slots[k]->id, &m), 0);
  }
  assert_int_equal(kvr_vllm_parse_metrics_engine(page, strlen(page), 100, 2, &m), KVR_EPARSE);
  assert_true(r->slots[0]->num_requests_running == 2.0 && r->slots[0]->kv_cache_usage == 0.25);
  assert_true(r->slots[1]->num_requests_running == 7.0 && r->slots[1]->kv_cache_usage == 0.75);
  assert_true(r->slots[1]->num_requests_waiting == 3.0);
  assert_false(r->slots[2]->metrics_seen); /* no engine="2" series: its own accounting only */
  assert_int_equal(r->slots[1]->engines_seen, 2);
  /* The whole server showing two engines: logged once, shown, not re-shaped. */
  assert_int_equal(kvr_vllm_parse_metrics(page, strlen(page), 100, &m), 0);
  assert_int_equal(kvr_router_on_scrape(r, whole->id, &m), 0);
  assert_true(whole->num_requests_running == 9.0);
  assert_int_equal(whole->engines_seen, 2);
  assert_true(whole->engines_warned);
  assert_int_equal(whole->dp_rank, -1);
  cJSON *ws = kvr_router_view_workers(r);
  cJSON *w3 = cJSON_GetArrayItem(ws, 3), *w1 = cJSON_GetArrayItem(ws, 1);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(w3, "dp_rank")));
  assert_non_null(strstr(cJSON_GetObjectItem(w3, "engines_hint")->valuestring, "dp_size=2"));
  assert_int_equal(cJSON_GetObjectItem(w1, "dp_rank")->valueint, 1);
  assert_int_equal(cJSON_GetObjectItem(w1, "dp_size")->valueint, 3);
  assert_string_equal(cJSON_GetObjectItem(w1, "key")->valuestring, "http://10.0.0.1:8000#dp=1");
  assert_int_equal(
      cJSON_GetObjectItem(cJSON_GetObjectItem(w1, "kv_events"), "rank_dropped")->valueint, 1);
  cJSON_Delete(ws);
  char line[160];
  snprintf(line, sizeof line,
           "kvrouter_worker_data_parallel_rank{worker=\"%s\",url=\"http://10.0.0.1:8000\"} 1",
           r->slots[1]->label);
  assert_metric(r, line);
  snprintf(
      line, sizeof line,
      "kvrouter_worker_kv_events_rank_dropped_total{worker=\"%s\",url=\"http://10.0.0.1:8000\"} "
      "1",
      r->slots[1]->label);
  assert_metric(r, line);

  /* Replicas find a rank by its key: a peer's row for URL#dp=1 is rank 1's load alone, and its
   * synced dispatch lands there; /admin/load lists each rank under its key. */
  kvr_peer_row_t rows[2] = {{.url = "http://10.0.0.1:8000#dp=1", .load = {.inflight = 4}},
                            {.url = "http://10.0.0.1:8000", .load = {.inflight = 9}}};
  kvr_router_on_peer_load(r, 0, rows, 2);
  assert_int_equal(r->slots[0]->peer[0].inflight, 0);
  assert_int_equal(r->slots[1]->peer[0].inflight, 4);
  assert_int_equal(r->slots[2]->peer[0].inflight, 0);
  kvr_router_dispatch_t pd;
  assert_ptr_equal(kvr_router_on_peer_dispatch(r, 0, "http://10.0.0.1:8000#dp=2", 10, 5, &pd),
                   r->slots[2]);
  kvr_router_on_end(r, &pd);
  assert_null(kvr_router_on_peer_dispatch(r, 0, "http://10.0.0.1:8000", 10, 5, &pd));
  cJSON *load = kvr_router_view_load(r);
  cJSON *rows_json = cJSON_GetObjectItem(load, "workers");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(rows_json, 2), "url")->valuestring,
                      "http://10.0.0.1:8000#dp=2");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(rows_json, 3), "url")->valuestring,
                      "http://10.0.0.2:8000");
  cJSON_Delete(load);

  /* Ranks are workers to the policy: a decision picks among the four of them and the others. */
  kvr_route_req_t req;
  memset(&req, 0, sizeof req);
  kvr_decision_t d;
  assert_true(kvr_router_decide(r, &req, NULL, false, &d) >= 0);
  assert_int_equal(d.nsnaps, 6);
  /* A runtime LoRA load on one rank is the server's: every rank of it lists the adapter. */
  kvr_lora_adapter_t sql = {"sql-lora", "/adapters/sql", NULL};
  assert_int_equal(kvr_router_on_lora_load_start(r, r->slots[1]->url, "sql-lora"), 0);
  assert_int_equal(kvr_router_on_lora_load_done(r, r->slots[1]->url, &sql, KVR_LORA_LOAD_LOADED),
                   0);
  for (int k = 0; k < 3; k++)
    assert_non_null(kvr_vllm_models_find(&r->slots[k]->models, "sql-lora"));
  assert_null(kvr_vllm_models_find(&r->slots[3]->models, "sql-lora")); /* another server */
  assert_null(kvr_vllm_models_find(&r->slots[4]->models, "sql-lora"));

  /* A request that failed on rank 0 is retried off its server: never on its ranks 1 and 2. */
  int tried[1] = {0};
  kvr_router_avoid_t avoid = {tried, 1, false, NULL, 0, false};
  for (int i = 0; i < 20; i++) {
    uint64_t blocks[1] = {0x9000u + (uint64_t)i};
    req.blocks = blocks;
    req.nblocks = 1;
    int c = kvr_router_decide(r, &req, &avoid, false, &d);
    assert_true(c >= 3 && c <= 5);
  }
  tried[0] = 3; /* a whole server tried: every rank stays a choice */
  bool rank_chosen = false;
  for (int i = 0; i < 40; i++) {
    uint64_t blocks[1] = {0xa000u + (uint64_t)i};
    req.blocks = blocks;
    req.nblocks = 1;
    int c = kvr_router_decide(r, &req, &avoid, false, &d);
    assert_true(c >= 0 && c != 3);
    rank_chosen |= c <= 2;
  }
  assert_true(rank_chosen);
  req.blocks = NULL;
  req.nblocks = 0;
  fx_close(&f);
}

KVR_TEST_MAIN(
    cmocka_unit_test(test_data_parallel), cmocka_unit_test(test_round_robin_and_tried),
    cmocka_unit_test(test_response_id_affinity), cmocka_unit_test(test_open_sessions),
    cmocka_unit_test(test_look_changes_nothing), cmocka_unit_test(test_accounting_and_drain),
    cmocka_unit_test(test_failures_mark_down), cmocka_unit_test(test_policy_switch),
    cmocka_unit_test(test_scrape_parse), cmocka_unit_test(test_requests_return_to_zero),
    cmocka_unit_test(test_index_follows_workers), cmocka_unit_test(test_worker_limit),
    cmocka_unit_test(test_peer_rows_by_url), cmocka_unit_test(test_scrape_and_reset),
    cmocka_unit_test(test_drain_remove_add), cmocka_unit_test(test_accounting_invariant_random),
    cmocka_unit_test(test_injected_clock), cmocka_unit_test(test_metrics_ops_families),
    cmocka_unit_test(test_metrics_process), cmocka_unit_test(test_learning_refused_and_capped),
    cmocka_unit_test(test_refused_prefill_leaves_clock),
    cmocka_unit_test(test_outlier_ejection_backoff_and_trial),
    cmocka_unit_test(test_ejection_keeps_a_worker), cmocka_unit_test(test_ejected_last_resort),
    cmocka_unit_test(test_retry_budget), cmocka_unit_test(test_admission_bound),
    cmocka_unit_test(test_models_eligibility), cmocka_unit_test(test_models_tokenizer),
    cmocka_unit_test(test_models_policy_contract), cmocka_unit_test(test_models_union),
    cmocka_unit_test(test_models_metrics), cmocka_unit_test(test_lora_adapter_state),
    cmocka_unit_test(test_lora_runtime_adapters))

/* test_scrape.c -- the /metrics scraper: the pure page parser, the report path into the router
 * (health transitions, applied figures, workers gone meanwhile) without a loop, and one real run on
 * a loop against a loopback HTTP server and a refused port (removed mid-run), which must leave no
 * libuv handle. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "src/config.h"
#include "src/curlm.h"
#include "src/http_server.h"
#include "src/kvr.h"
#include "src/router.h"
#include "src/scrape.h"

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
  kvr_router_scrape_t m;
  assert_int_equal(kvr_scrape_parse(page, strlen(page), 7, &m), 0);
  assert_int_equal(m.at_ms, 7);
  assert_true(m.num_requests_running == 5.0); /* summed across engines */
  assert_true(m.num_requests_waiting == 4.0);
  assert_true(m.kv_cache_usage > 0.2999 && m.kv_cache_usage < 0.3001); /* mean of both names */
  assert_int_equal(m.num_gpu_blocks, 500);
  assert_int_equal(m.block_size, 16);

  /* No geometry, or half of it, is no geometry; a label must match its whole name. */
  const char *half = "vllm:num_requests_waiting 1\n"
                     "vllm:cache_config_info{xblock_size=\"16\",num_gpu_blocks=\"9\"} 1";
  assert_int_equal(kvr_scrape_parse(half, strlen(half), 8, &m), 0);
  assert_true(m.num_requests_waiting == 1.0);
  assert_true(m.kv_cache_usage == 0.0);
  assert_int_equal(m.num_gpu_blocks, 0);
  assert_int_equal(m.block_size, 0);

  /* Nothing expected: comments, other series, a name that only starts like one. */
  const char *none = "# vllm:num_requests_running 1\n"
                     "vllm:num_requests_running_total 3\n"
                     "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"9\"} 1\n";
  assert_int_equal(kvr_scrape_parse(none, strlen(none), 9, &m), KVR_EPARSE);
  assert_int_equal(kvr_scrape_parse("", 0, 9, &m), KVR_EPARSE);
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

/* ---- one real run on a loop -------------------------------------------------------------------
 */

typedef struct {
  uv_loop_t loop;
  uv_timer_t check;
  fx_t f;
  kvr_curlm_t *curlm;
  kvr_scrape_t *scrape;
  kvr_http_server_t *srv;
  int metrics_gets;
  int gets_at_removal; /* -1 until the refused worker was removed */
  int server_closed;
  bool timed_out;
  uint64_t deadline_ms;
} loop_fx_t;

static void on_metrics_request(kvr_http_req_t *req, void *data) {
  loop_fx_t *t = data;
  if (strcmp(req->path, "/metrics") == 0) {
    t->metrics_gets++;
    kvr_http_respond(req, 200, "text/plain", NULL, page, strlen(page));
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
  bool done = t->gets_at_removal >= 0 && t->metrics_gets >= t->gets_at_removal + 2;
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
  assert_null(t.f.r->slots[1]);
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
  assert_int_equal(kvr_scrape_parse_models(vllm, strlen(vllm), &len), 0);
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
    assert_int_equal(kvr_scrape_parse_models(bad[i], strlen(bad[i]), &len), KVR_EPARSE);
    assert_int_equal(len, 7);
  }
}

KVR_TEST_MAIN(cmocka_unit_test(test_parse), cmocka_unit_test(test_parse_models),
              cmocka_unit_test(test_report_path), cmocka_unit_test(test_scraper_on_loop))

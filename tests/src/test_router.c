/* test_router.c -- router state: decisions over slots, exact load accounting, draining, policy
 * switching, and parsing of a vLLM /metrics page. Runs a real loop (the router owns a curl multi
 * and a scrape timer) and asserts that closing the router leaves no libuv handle behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "src/kvr.h"
#include "src/router.h"

#include <stdlib.h>

#include <string.h>

typedef struct {
  uv_loop_t loop;
  kvr_config_t cfg;
  kvr_router_t *r;
} fx_t;

static void fx_open(fx_t *f, int nworkers, const char *policy) {
  uv_loop_init(&f->loop);
  kvr_config_init(&f->cfg);
  char err[256];
  for (int i = 0; i < nworkers; i++) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", 1 + i); /* never contacted: scraping is off */
    assert_int_equal(kvr_config_add_worker(&f->cfg, url, err, sizeof err), 0);
  }
  free(f->cfg.policy);
  f->cfg.policy = strdup(policy);
  f->cfg.scrape_interval_ms = 0;
  f->r = kvr_router_new(&f->loop, &f->cfg, err, sizeof err);
  assert_non_null(f->r);
}

static void fx_close(fx_t *f) {
  kvr_router_close(f->r);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  kvr_config_free(&f->cfg);
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
  assert_int_equal(kvr_router_decide(f.r, &req, 0x5, true, &d), 1);
  assert_int_equal(kvr_router_decide(f.r, &req, 0x7, true, &d), KVR_POLICY_NONE);
  assert_int_equal(f.r->no_worker_total, 1);
  fx_close(&f);
}

static void test_accounting_and_drain(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 2, "least_load");
  kvr_worker_t *w = f.r->slots[0];
  kvr_router_worker_begin(w, 1000, 600);
  kvr_router_worker_begin(w, 500, 500);
  assert_int_equal(w->inflight, 2);
  assert_int_equal(w->active_tokens, 1500);
  assert_int_equal(w->queued_prefill_tokens, 1100);
  /* The first request's first token: its 600 prefill tokens leave the queue; it was dispatched
   * alone, so it is a rate sample, and the snapshot's backlog is the 500 still pending at most. */
  kvr_router_worker_prefilled(w, 600, kvr_now_ns() - 60 * 1000000ull, true);
  assert_int_equal(w->queued_prefill_tokens, 500);
  assert_int_equal(w->prefill.samples, 1);
  assert_true(w->prefill.rate > 0);
  /* least_load must now avoid worker 0. */
  kvr_route_req_t req = {0};
  kvr_decision_t d;
  assert_int_equal(kvr_router_decide(f.r, &req, 0, false, &d), 1);
  assert_int_equal(d.snaps[0].queued_prefill_tokens, 500);
  assert_true(d.snaps[0].prefill_backlog_tokens >= 50 && d.snaps[0].prefill_backlog_tokens <= 500);
  kvr_router_drain_worker(f.r, w);
  assert_int_equal(w->state, KVR_WORKER_DRAINING);
  assert_int_equal(kvr_router_decide(f.r, &req, 0x2, false, &d), KVR_POLICY_NONE);
  kvr_router_worker_end(w, 1000, 0, 10);
  assert_non_null(f.r->slots[0]); /* one request still in flight */
  kvr_router_worker_end(w, 500, 500, 0);
  assert_null(f.r->slots[0]); /* freed when the last one ended */
  assert_true(kvr_router_has_usable(f.r));
  fx_close(&f);
}

static void test_failures_mark_down(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "round_robin");
  kvr_worker_t *w = f.r->slots[0];
  kvr_router_worker_result(w, false);
  kvr_router_worker_result(w, false);
  assert_int_equal(w->state, KVR_WORKER_UP);
  kvr_router_worker_result(w, false);
  assert_int_equal(w->state, KVR_WORKER_DOWN);
  assert_false(kvr_router_has_usable(f.r));
  kvr_router_worker_result(w, true);
  assert_int_equal(w->state, KVR_WORKER_UP);
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
  fx_close(&f);
}

static void test_scrape_parse(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f, 1, "round_robin");
  kvr_worker_t *w = f.r->slots[0];
  const char *page =
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7.0\n"
      "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n"
      "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n"
      "vllm:num_requests_running_extra{engine=\"0\"} 99\n"
      "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"fp8\",num_gpu_blocks=\"2000\"} 1.0\n";
  assert_int_equal(kvr_scrape_parse(w, page, strlen(page), 42), 0);
  assert_true(w->num_requests_running == 7.0);
  assert_true(w->num_requests_waiting == 3.0);
  assert_true(w->kv_cache_usage == 0.5);
  assert_int_equal(w->num_gpu_blocks, 2000);
  assert_int_equal(w->block_size, 16);
  assert_int_equal(w->cache_capacity_blocks,
                   2000); /* 16-token GPU blocks = 64-byte router blocks */
  assert_int_equal(w->scraped_at_ms, 42);
  const char *junk = "something_else 1\n";
  assert_int_equal(kvr_scrape_parse(w, junk, strlen(junk), 43), KVR_EPARSE);
  fx_close(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_robin_and_tried), cmocka_unit_test(test_accounting_and_drain),
      cmocka_unit_test(test_failures_mark_down),    cmocka_unit_test(test_policy_switch),
      cmocka_unit_test(test_scrape_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

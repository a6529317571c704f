/* test_stats.c -- percentiles (numpy-linear), level aggregation, SLO verdicts, max load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "base/quantile.h"
#include "bench/loadgen/stats.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define NEAR(a, b) assert_true(fabs((a) - (b)) < 1e-9)

static const kvr_slo_t slo = {1000, 60, 0};

static void test_percentile_linear(void **state) {
  (void)state;
  double v[100];
  for (int i = 0; i < 100; i++)
    v[i] = i + 1;
  NEAR(kvr_quantile(v, 100, 50), 50.5);
  NEAR(kvr_quantile(v, 100, 99), 99.01);
  NEAR(kvr_quantile(v, 100, 0), 1);
  NEAR(kvr_quantile(v, 100, 100), 100);
  NEAR(kvr_quantile(v, 1, 99), 1);
  NEAR(kvr_quantile(v, 0, 99), 0);
  double w[] = {4, 1, 3, 2};
  kvr_dist_t d;
  kvr_stats_dist(w, 4, &d);
  NEAR(d.mean, 2.5);
  NEAR(d.p50, 2.5);
  NEAR(d.max, 4);
  NEAR(d.std, sqrt(1.25));
  NEAR(d.p90, 3.7);
}

static void test_max_overlap(void **state) {
  (void)state;
  double s[] = {0, 1, 2, 10};
  double e[] = {5, 3, 2.5, 11};
  assert_int_equal(kvr_stats_max_overlap(s, e, 4), 3);
  /* Touching intervals do not overlap: the end is counted first. */
  double s2[] = {0, 1};
  double e2[] = {1, 2};
  assert_int_equal(kvr_stats_max_overlap(s2, e2, 2), 1);
  assert_int_equal(kvr_stats_max_overlap(NULL, NULL, 0), 0);
}

static kvr_req_rec_t rec(uint32_t turn, double sent, double ttft, double e2e, uint32_t out,
                         const char *worker) {
  kvr_req_rec_t r;
  memset(&r, 0, sizeof(r));
  r.turn = turn;
  r.ok = true;
  r.status = 200;
  r.sent_s = r.target_s = sent;
  r.ttft_ms = ttft;
  r.e2e_ms = e2e;
  r.output_tokens = out;
  r.tpot_ms = out > 1 ? (e2e - ttft) / (out - 1) : -1;
  r.prompt_tokens = 1000 * turn;
  r.cached_tokens = 500 * turn;
  r.usage_seen = true;
  snprintf(r.worker, sizeof(r.worker), "%s", worker);
  return r;
}

static void test_level_aggregates(void **state) {
  (void)state;
  kvr_level_t *lv = kvr_stats_level_new(2.0, 0);
  /* A warm-up request with absurd figures must not show anywhere. */
  kvr_req_rec_t w = rec(1, 0, 99999, 99999, 2, "w9");
  w.warmup = true;
  kvr_stats_level_add(lv, &w, (double[]){99999}, 1);
  for (int i = 0; i < 10; i++) {
    kvr_req_rec_t r = rec(1 + i % 2, i * 0.5, 100 + i, 600 + i, 11, i < 7 ? "w0" : "w1");
    r.lag_ms = i * 0.1;
    double itl[10];
    for (int k = 0; k < 10; k++)
      itl[k] = 100;
    kvr_stats_level_add(lv, &r, itl, 10);
  }
  kvr_req_rec_t f = rec(1, 5.0, -1, 30, 0, "w1");
  f.ok = false;
  f.status = 500;
  snprintf(f.error, sizeof(f.error), "HTTP 500");
  kvr_stats_level_add(lv, &f, NULL, 0);
  kvr_stats_level_finish(lv, &slo);

  assert_int_equal(lv->nrecs, 12);
  assert_int_equal(lv->measured, 11);
  assert_int_equal(lv->completed, 10);
  assert_int_equal(lv->failed, 1);
  NEAR(lv->ttft.mean, 104.5);
  NEAR(lv->ttft.max, 109);
  NEAR(lv->tpot.p50, 50);
  NEAR(lv->itl.p99, 100);
  assert_int_equal(lv->itl.n, 100);
  assert_int_equal(lv->total_output, 110);
  assert_int_equal(lv->total_input, 15000);
  assert_int_equal(lv->total_cached, 7500);
  /* Sent every 0.5 s, each lasting ~0.6 s: two overlap at most. */
  assert_int_equal(lv->max_concurrent, 2);
  NEAR(lv->duration_s, 4.5 + 0.609);
  NEAR(lv->achieved_rate, 10.0 / 5.0);
  NEAR(lv->scheduled_rate, 10.0 / 5.0); /* sent on schedule */
  NEAR(lv->request_throughput, 10 / lv->duration_s);
  assert_int_equal(lv->nworkers, 2);
  assert_string_equal(lv->workers[0].name, "w0");
  assert_int_equal(lv->workers[0].count, 7);
  assert_int_equal(lv->workers[1].count, 4);
  assert_int_equal(lv->nturns, 2);
  assert_int_equal(lv->turns[1].ttft.n, 5);
  NEAR(lv->turns[1].mean_prompt_tokens, 2000);
  /* One failed request with max_failed_frac 0 fails the level on errors only. */
  assert_false(lv->pass);
  assert_int_equal(lv->fail_mask, KVR_SLO_FAIL_ERRORS);
  kvr_slo_t lenient = {1000, 60, 0.1};
  kvr_stats_level_finish(lv, &lenient);
  assert_true(lv->pass);
  kvr_slo_t strict = {104, 50, 0.1};
  kvr_stats_level_finish(lv, &strict);
  assert_int_equal(lv->fail_mask, KVR_SLO_FAIL_TTFT | KVR_SLO_FAIL_TPOT);
  char names[64];
  kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
  assert_string_equal(names, "TTFT+TPOT");
  kvr_stats_level_free(lv);
}

/* The scheduled rate comes from the target send times, the achieved one from the actual ones: a
 * generator that falls behind shows as achieved < scheduled. */
static void test_scheduled_vs_achieved_rate(void **state) {
  (void)state;
  kvr_level_t *lv = kvr_stats_level_new(2.0, 0);
  for (int i = 0; i < 11; i++) {
    kvr_req_rec_t r = rec(1, i * 0.55, 100, 600, 11, "w0");
    r.target_s = i * 0.5; /* due every 0.5 s, sent every 0.55 s */
    r.lag_ms = (r.sent_s - r.target_s) * 1000;
    kvr_stats_level_add(lv, &r, NULL, 0);
  }
  kvr_stats_level_finish(lv, &slo);
  NEAR(lv->scheduled_rate, 10.0 / 5.0);
  NEAR(lv->achieved_rate, 10.0 / 5.5);
  NEAR(lv->lag.max, 500);
  NEAR(lv->lag.p50, 250);
  kvr_stats_level_free(lv);
  /* One request: no rate either way. */
  lv = kvr_stats_level_new(2.0, 0);
  kvr_req_rec_t r = rec(1, 0, 100, 600, 11, "w0");
  kvr_stats_level_add(lv, &r, NULL, 0);
  kvr_stats_level_finish(lv, &slo);
  assert_true(lv->scheduled_rate == 0 && lv->achieved_rate == 0);
  kvr_stats_level_free(lv);
}

static void test_empty_level_fails_nodata(void **state) {
  (void)state;
  kvr_level_t *lv = kvr_stats_level_new(1.0, 0);
  kvr_stats_level_finish(lv, &slo);
  assert_false(lv->pass);
  assert_true(lv->fail_mask & KVR_SLO_FAIL_NODATA);
  kvr_stats_level_free(lv);
  kvr_stats_level_free(NULL);
}

static kvr_level_t *verdict_level(double rate, double ttft) {
  kvr_level_t *lv = kvr_stats_level_new(rate, 0);
  kvr_req_rec_t r = rec(1, 0, ttft, ttft + 100, 11, "");
  kvr_stats_level_add(lv, &r, NULL, 0);
  kvr_stats_level_finish(lv, &slo);
  return lv;
}

static void test_run_max_load(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  kvr_run_t *run = kvr_stats_results_add_run(res, "phase0", "round_robin", "x");
  assert_true(kvr_stats_run_max_load(run) == 0);
  kvr_stats_run_add(run, verdict_level(4.0, 100)); /* passes, but above a failure */
  kvr_stats_run_add(run, verdict_level(1.0, 100));
  kvr_stats_run_add(run, verdict_level(3.0, 1500)); /* fails */
  kvr_stats_run_add(run, verdict_level(2.0, 999));
  NEAR(kvr_stats_run_max_load(run), 2.0);
  assert_non_null(kvr_stats_run_find(run, 3.0, 0));
  assert_null(kvr_stats_run_find(run, 2.5, 0));
  kvr_stats_set_str(&res->model, "m");
  assert_string_equal(res->model, "m");
  kvr_stats_results_free(res);
  kvr_stats_results_free(NULL);
}

/* A steady-state closed loop: the throughput is over the window of measured sends, since the
 * cool-down requests (not recorded here) keep the users busy after the last one. */
static void test_steady_state_throughput(void **state) {
  (void)state;
  kvr_level_t *lv = kvr_stats_level_new(0, 4);
  lv->steady_state = true;
  for (int i = 0; i < 9; i++) {
    kvr_req_rec_t r = rec(1, i * 1.0, 100, 30000, 11, "w0"); /* one send a second, 30 s each */
    kvr_stats_level_add(lv, &r, NULL, 0);
  }
  kvr_stats_level_finish(lv, &slo);
  NEAR(lv->duration_s, 8.0);
  NEAR(lv->request_throughput, 9 / 8.0);
  NEAR(lv->output_throughput, 99 / 8.0);
  kvr_stats_level_free(lv);
}

KVR_TEST_MAIN(cmocka_unit_test(test_percentile_linear), cmocka_unit_test(test_max_overlap),
              cmocka_unit_test(test_level_aggregates),
              cmocka_unit_test(test_empty_level_fails_nodata), cmocka_unit_test(test_run_max_load),
              cmocka_unit_test(test_scheduled_vs_achieved_rate),
              cmocka_unit_test(test_steady_state_throughput))

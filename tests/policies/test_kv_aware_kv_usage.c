/* test_kv_aware_kv_usage.c -- kv_aware's KV-usage term (issue 34): kv_usage_weight x
 * kv_cache_usage ^ kv_usage_power, from a worker's fresh /metrics. The term is convex so that it
 * counts most where the cache is about to run out (vLLM then preempts and queues: seconds of
 * TTFT) and little at the usage equal workers drift through; these tests pin the formula, the
 * defaults, the parameter's bounds and the decisions that follow: a cached prefix leaves a
 * worker about to run out of KV, and stays on one whose usage merely drifted above the others'.
 * Each decision is also checked against the linear form (kv_usage_power 1, the weight 2048 of the
 * earlier default), which made the opposite choice or the same one for the reason stated. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/kvr.h"
#include "policies/policy.h"
#include "tests/policies/policy_test.h"

static kvr_policy_t *make(const char *params) {
  return kvr_test_policy_make("kv_aware", params, 3);
}

/* n idle, usable workers with fresh metrics (no queue, empty cache) of equal capacity. */
static void fresh_workers(kvr_worker_snap_t *w, size_t n) {
  memset(w, 0, n * sizeof(*w));
  for (size_t i = 0; i < n; i++) {
    w[i].id = (uint32_t)i;
    w[i].usable = true;
    w[i].metrics_fresh = true;
    w[i].cache_capacity_blocks = 21770;
  }
}

/* A 3,700-token prompt (a document and its question) in 232 blocks of 64 characters (16 tokens);
 * worker 0 holds 228 blocks of it (3,648 tokens), the others none. */
static uint64_t doc_blocks[232];
static const kvr_route_req_t doc_req = {.blocks = doc_blocks,
                                        .nblocks = 232,
                                        .block_chars = 64,
                                        .prompt_tokens = 3700,
                                        .max_tokens = 400};

static void doc_fleet(kvr_worker_snap_t *w, const double *usage) {
  fresh_workers(w, 4);
  w[0].matched_blocks = 228;
  for (int i = 0; i < 4; i++) {
    w[i].inflight = 100;
    w[i].active_tokens = 100 * 4000;
    w[i].kv_cache_usage = usage[i];
  }
}

/* The defaults, echoed as GET /admin/policy shows them, and the bounds of the power. */
static void test_defaults_and_bounds(void **state) {
  (void)state;
  kvr_policy_t *p = make(NULL);
  cJSON *out = cJSON_CreateObject();
  p->ops->params(p, out);
  assert_true(cJSON_GetObjectItem(out, "kv_usage_weight")->valuedouble == 8192);
  assert_true(cJSON_GetObjectItem(out, "kv_usage_power")->valuedouble == 4);
  cJSON_Delete(out);
  kvr_policy_destroy(p);

  static const struct {
    const char *params, *err;
  } bad[] = {
      {"{\"kv_usage_power\":0.5}", "params.kv_usage_power: must be >= 1"},
      {"{\"kv_usage_power\":65}", "params.kv_usage_power: must be <= 64"},
      {"{\"kv_usage_power\":\"4\"}", "params.kv_usage_power: must be a number"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    kvr_test_policy_refuses("kv_aware", bad[i].params, bad[i].err);
  kvr_policy_t *frac = make("{\"kv_usage_power\":2.5}"); /* any real power >= 1 */
  kvr_policy_destroy(frac);
}

/* The term is exactly kv_usage_weight x usage ^ kv_usage_power, only with fresh metrics, and
 * power 1 is the linear term. */
static void test_formula(void **state) {
  (void)state;
  kvr_worker_snap_t w[3];
  kvr_policy_score_t s[3];
  kvr_route_req_t req = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 1000, .max_tokens = 100};
  fresh_workers(w, 3);
  w[0].kv_cache_usage = 0.5;
  w[1].kv_cache_usage = 0.9;
  w[2].kv_cache_usage = 0.9;
  w[2].metrics_fresh = false; /* a stale page counts nothing: worker 2 looks empty */
  kvr_policy_t *p = make(NULL);
  assert_int_equal(kvr_policy_select(p, w, 3, &req, NULL, s), 2);
  assert_true(fabs(s[0].cost - (1000 + 8192 * 0.0625)) < 1e-6); /* 0.5^4 */
  assert_true(fabs(s[1].cost - (1000 + 8192 * 0.6561)) < 1e-6); /* 0.9^4 */
  assert_true(fabs(s[2].cost - 1000) < 1e-6);
  kvr_policy_destroy(p);

  kvr_policy_t *lin = make("{\"kv_usage_power\":1,\"kv_usage_weight\":2048}");
  kvr_policy_select(lin, w, 3, &req, NULL, s);
  assert_true(fabs(s[0].cost - (1000 + 2048 * 0.5)) < 1e-6);
  assert_true(fabs(s[1].cost - (1000 + 2048 * 0.9)) < 1e-6);
  kvr_policy_destroy(lin);
}

/* The worker holding the document is at 97% KV usage, about to preempt; the others at 60%. The
 * request goes elsewhere and pays the 3,648 tokens again: 8192 x (0.97^4 - 0.6^4) = 6,191 tokens
 * of cost against them. The linear term (2048 x 0.37 = 758) kept it on the full worker. */
static void test_nearly_full_worker_loses_its_prefix(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  const double usage[4] = {0.97, 0.6, 0.6, 0.6};
  doc_fleet(w, usage);
  kvr_policy_t *p = make(NULL);
  int k = kvr_policy_select(p, w, 4, &doc_req, NULL, s);
  assert_true(k >= 1 && k <= 3);
  assert_true(s[0].cost - s[k].cost > 2000);
  assert_false(s[0].capped); /* the cost moved it, not a bound or the gate */
  kvr_policy_destroy(p);

  kvr_policy_t *lin = make("{\"kv_usage_power\":1,\"kv_usage_weight\":2048}");
  assert_int_equal(kvr_policy_select(lin, w, 4, &doc_req, NULL, s), 0);
  kvr_policy_destroy(lin);
}

/* Equal workers drift: the holder reads 65% where the others read 50%. The document's question
 * stays on the holder: 8192 x (0.65^4 - 0.5^4) = 950 tokens against 3,648 to prefill elsewhere.
 * Low usage counts less than it did (0.3 against 0.1: 66 tokens here, 410 linear). */
static void test_drift_keeps_the_prefix_home(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  const double usage[4] = {0.65, 0.5, 0.5, 0.5};
  doc_fleet(w, usage);
  kvr_policy_t *p = make(NULL);
  assert_int_equal(kvr_policy_select(p, w, 4, &doc_req, NULL, s), 0);
  assert_true(fabs((s[1].cost - s[0].cost) - (3648 - 8192 * (pow(0.65, 4) - pow(0.5, 4)))) < 1e-6);

  const double low[4] = {0.3, 0.1, 0.1, 0.1};
  doc_fleet(w, low);
  assert_int_equal(kvr_policy_select(p, w, 4, &doc_req, NULL, s), 0);
  assert_true(fabs((s[1].cost - s[0].cost) - (3648 - 8192 * (pow(0.3, 4) - pow(0.1, 4)))) < 1e-6);
  kvr_policy_destroy(p);
}

/* With nothing cached anywhere, a nearly full worker is the last choice even when it carries the
 * fewest requests: 8192 x 0.95^4 = 6,673 tokens outweigh 20 requests fewer in flight (2,560 at
 * 128 each plus their decode tokens). */
static void test_full_cache_outweighs_a_lighter_load(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  kvr_route_req_t req = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 2000, .max_tokens = 300};
  fresh_workers(w, 4);
  for (int i = 0; i < 4; i++) {
    w[i].inflight = 60;
    w[i].active_tokens = 60 * 3000;
    w[i].kv_cache_usage = 0.6;
  }
  w[3].inflight = 40;
  w[3].active_tokens = 40 * 3000;
  w[3].kv_cache_usage = 0.95;
  kvr_policy_t *p = make(NULL);
  assert_true(kvr_policy_select(p, w, 4, &req, NULL, s) != 3);
  for (int i = 0; i < 3; i++)
    assert_true(s[3].cost > s[i].cost);
  kvr_policy_destroy(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_and_bounds),
      cmocka_unit_test(test_formula),
      cmocka_unit_test(test_nearly_full_worker_loses_its_prefix),
      cmocka_unit_test(test_drift_keeps_the_prefix_home),
      cmocka_unit_test(test_full_cache_outweighs_a_lighter_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

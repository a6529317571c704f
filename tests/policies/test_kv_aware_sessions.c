/* test_kv_aware_sessions.c -- kv_aware's open-session term (issue 34): session_weight x
 * open_sessions_i, the Responses sessions whose latest answer worker i stored and whose next turn
 * the router will pin there (kvr_worker_snap_t.open_sessions, counted by router_affinity.c). A
 * policy places only a pinned session's first turn, so the term is what lets it see the sessions
 * that are between turns (their client running a tool) and not in flight. These tests pin the
 * parameter's default and bounds, the formula, and the decisions on constructed snapshots: a
 * session start leaves the worker holding its starter when that worker already carries more
 * sessions than the starter's prefill is worth, and stays there when the sessions are even. Each
 * decision is also checked with session_weight 0 (the policy before the term). */
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
  return kvr_test_policy_make("kv_aware", params, 5);
}

/* The study's agentic-responses fleet mid-run: 4 workers with 24 requests in flight each (~1,400
 * router-estimated tokens apiece: a chained turn's new input only), fresh metrics at 30% KV. A
 * session start sends one of the ten shared system prompts and its task, 3,900 tokens in 244
 * blocks of 64 characters; worker 0 holds 240 of them (3,840 tokens), the others none. */
static uint64_t starter_blocks[244];
static const kvr_route_req_t starter = {.blocks = starter_blocks,
                                        .nblocks = 244,
                                        .block_chars = 64,
                                        .prompt_tokens = 3900,
                                        .max_tokens = 512};

static void fleet(kvr_worker_snap_t *w, const uint32_t *open) {
  memset(w, 0, 4 * sizeof(*w));
  for (int i = 0; i < 4; i++) {
    w[i].id = (uint32_t)i;
    w[i].usable = true;
    w[i].metrics_fresh = true;
    w[i].cache_capacity_blocks = 21770;
    w[i].kv_cache_usage = 0.3;
    w[i].inflight = 24;
    w[i].active_tokens = 24 * 1400;
    w[i].open_sessions = open[i];
  }
  w[0].matched_blocks = 240;
}

/* The default, echoed as GET /admin/policy shows it, and the parameter's bounds. */
static void test_defaults_and_bounds(void **state) {
  (void)state;
  kvr_policy_t *p = make(NULL);
  cJSON *out = cJSON_CreateObject();
  p->ops->params(p, out);
  assert_true(cJSON_GetObjectItem(out, "session_weight")->valuedouble == 512);
  cJSON_Delete(out);
  kvr_policy_destroy(p);

  static const struct {
    const char *params, *err;
  } bad[] = {
      {"{\"session_weight\":-1}", "params.session_weight: must be >= 0"},
      {"{\"session_weight\":\"1024\"}", "params.session_weight: must be a number"},
      {"{\"session_weight\":1e13}", "params.session_weight: must be <= 1e+12"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    kvr_test_policy_refuses("kv_aware", bad[i].params, bad[i].err);
}

/* The term is exactly session_weight x open_sessions, added to the rest of the cost; 0 turns it
 * off. */
static void test_formula(void **state) {
  (void)state;
  kvr_worker_snap_t w[3];
  kvr_policy_score_t s[3];
  kvr_route_req_t req = {.block_chars = 64, .prompt_tokens = 1000, .max_tokens = 100};
  memset(w, 0, sizeof w);
  for (int i = 0; i < 3; i++) {
    w[i].usable = true;
    w[i].open_sessions = (uint32_t)(2 - i); /* 2, 1, 0 */
  }
  kvr_policy_t *p = make(NULL);
  assert_int_equal(kvr_policy_select(p, w, 3, &req, NULL, s), 2);
  for (int i = 0; i < 3; i++)
    assert_true(fabs(s[i].cost - (1000 + 512.0 * (2 - i))) < 1e-9);
  kvr_policy_destroy(p);

  kvr_policy_t *off = make("{\"session_weight\":0}");
  kvr_policy_select(off, w, 3, &req, NULL, s);
  for (int i = 0; i < 3; i++)
    assert_true(fabs(s[i].cost - 1000) < 1e-9);
  kvr_policy_destroy(off);
}

/* Worker 0 holds the starter but carries 36 open sessions against 24 elsewhere: 12 x 512 =
 * 6,144 tokens of pinned turns to come, more than the 3,840-token prefill the starter saves. The
 * start goes elsewhere (the cost moved it: nothing is capped). Without the term it stayed on
 * worker 0, whose in-flight count is the same as everyone's. */
static void test_start_leaves_a_worker_full_of_sessions(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  const uint32_t open[4] = {36, 24, 24, 24};
  fleet(w, open);
  kvr_policy_t *p = make(NULL);
  int k = kvr_policy_select(p, w, 4, &starter, NULL, s);
  assert_true(k >= 1 && k <= 3);
  assert_true(s[0].cost - s[k].cost > 2000);
  for (int i = 0; i < 4; i++)
    assert_false(s[i].capped);
  kvr_policy_destroy(p);

  kvr_policy_t *off = make("{\"session_weight\":0}");
  assert_int_equal(kvr_policy_select(off, w, 4, &starter, NULL, s), 0);
  kvr_policy_destroy(off);
}

/* Even sessions: the term adds the same to every worker and the cached starter decides, as
 * before; and six more sessions on worker 0 (3,072 tokens) are still worth less than the
 * starter's prefill. */
static void test_even_sessions_keep_the_prefix(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  const uint32_t even[4] = {24, 24, 24, 24}, six[4] = {30, 24, 24, 24};
  kvr_policy_t *p = make(NULL);
  fleet(w, even);
  assert_int_equal(kvr_policy_select(p, w, 4, &starter, NULL, s), 0);
  fleet(w, six);
  assert_int_equal(kvr_policy_select(p, w, 4, &starter, NULL, s), 0);
  kvr_policy_destroy(p);
}

/* No Responses sessions anywhere (chat, completions, a router without store): the term is 0 on
 * every worker and each cost is the one of session_weight 0. */
static void test_no_sessions_no_change(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4], s0[4];
  const uint32_t none[4] = {0, 0, 0, 0};
  fleet(w, none);
  w[2].inflight = 12;
  kvr_policy_t *p = make(NULL), *off = make("{\"session_weight\":0}");
  int a = kvr_policy_select(p, w, 4, &starter, NULL, s);
  int b = kvr_policy_select(off, w, 4, &starter, NULL, s0);
  assert_int_equal(a, b);
  for (int i = 0; i < 4; i++)
    assert_true(s[i].cost == s0[i].cost);
  kvr_policy_destroy(p);
  kvr_policy_destroy(off);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults_and_bounds),
      cmocka_unit_test(test_formula),
      cmocka_unit_test(test_start_leaves_a_worker_full_of_sessions),
      cmocka_unit_test(test_even_sessions_keep_the_prefix),
      cmocka_unit_test(test_no_sessions_no_change),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

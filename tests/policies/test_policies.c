/* test_policies.c -- the registry, contract tests over every registered policy, each policy's own
 * rules, and simulations of the router's state updates (cache index + load) that check the two
 * failure modes of cache-aware routing: losing a conversation's cache (multi-turn must stay on
 * one worker under kv_aware, and does not under round_robin) and hot spots (one popular prefix
 * under load must not pile onto one worker), plus "no loss against round_robin when nothing is
 * shared". */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/policies/policy_test.h"
#include "tests/test_util.h"

#include "base/kvr.h"
#include "core/cache_index.h"
#include "policies/policy.h"
#include "proto/prompt.h"

static uint64_t rng_state = 1;
static uint64_t rnd(void) {
  return kvr_policy_rand(&rng_state);
}

/* --- registry and parameters ------------------------------------------------------------------ */

static void test_registry(void **state) {
  (void)state;
  char names[256];
  kvr_policy_names(names, sizeof(names));
  assert_string_equal(names, "round_robin, least_load, kv_aware, gie_scorer, sglang_cache_aware, "
                             "dynamo_kv, llmd_precise");
  assert_non_null(kvr_policy_find("kv_aware"));
  assert_null(kvr_policy_find("nope"));
  assert_null(kvr_policy_find(NULL));
  char err[256] = "";
  assert_null(kvr_policy_create("nope", NULL, 1, err, sizeof(err)));
  assert_string_equal(err, "unknown policy 'nope' (valid: round_robin, least_load, kv_aware, "
                           "gie_scorer, sglang_cache_aware, dynamo_kv, llmd_precise)");
  char small[8];
  kvr_policy_names(small, sizeof(small));
  assert_true(strlen(small) < sizeof(small));
  kvr_policy_destroy(NULL);
}

typedef struct {
  const char *policy;
  const char *params;
  const char *err;
} param_case_t;

static void test_param_errors(void **state) {
  (void)state;
  static const param_case_t cases[] = {
      {"kv_aware", "{\"decode_weight\":-1}", "params.decode_weight: must be >= 0"},
      {"kv_aware", "{\"prefill_weight\":\"x\"}", "params.prefill_weight: must be a number"},
      {"kv_aware", "{\"load_weight\":1}",
       "params.load_weight: unknown parameter (valid: prefill_weight, decode_weight, "
       "inflight_weight, waiting_weight, kv_usage_weight, kv_usage_power, balance_epsilon, "
       "balance_slack, prefill_gate_tokens, adapter_affinity, session_weight)"},
      {"kv_aware", "[1]", "params: must be an object"},
      {"round_robin", "{\"x\":1}", "params.x: unknown parameter (valid: none)"},
      {"least_load", "{\"x\":1}", "params.x: unknown parameter (valid: none)"},
      {"gie_scorer", "{\"max_prefix_blocks\":0}", "params.max_prefix_blocks: must be >= 1"},
      {"gie_scorer", "{\"max_prefix_blocks\":2.5}", "params.max_prefix_blocks: must be an integer"},
      {"sglang_cache_aware", "{\"cache_threshold\":1.5}", "params.cache_threshold: must be <= 1"},
      {"sglang_cache_aware", "{\"balance_abs_threshold\":3.5}",
       "params.balance_abs_threshold: must be an integer"},
      {"dynamo_kv", "{\"temperature\":-0.5}", "params.temperature: must be >= 0"},
      {"dynamo_kv", "{\"overlap_score_weight\":-1}", "params.overlap_score_weight: must be >= 0"},
      {"dynamo_kv", "{\"overlap_score_weight\":2e6}",
       "params.overlap_score_weight: must be <= 1e+06"},
      {"dynamo_kv", "{\"router_temperature\":1}",
       "params.router_temperature: unknown parameter (valid: overlap_score_weight, temperature)"},
      {"llmd_precise", "{\"affinity_threshold\":1.2}", "params.affinity_threshold: must be <= 1"},
      {"llmd_precise", "{\"affinity_threshold\":-0.1}", "params.affinity_threshold: must be >= 0"},
      {"llmd_precise", "{\"exploration_probability\":2}",
       "params.exploration_probability: must be <= 1"},
      {"llmd_precise", "{\"max_ttft_penalty_tokens\":-1}",
       "params.max_ttft_penalty_tokens: must be >= 0"},
      {"llmd_precise", "{\"prefix_weight\":-2}", "params.prefix_weight: must be >= 0"},
      {"llmd_precise", "{\"queue_weight\":\"1\"}", "params.queue_weight: must be a number"},
      {"llmd_precise", "{\"maxTTFTPenaltyMs\":5000}",
       "params.maxTTFTPenaltyMs: unknown parameter (valid: prefix_weight, kv_cache_weight, "
       "queue_weight, affinity_threshold, exploration_probability, max_ttft_penalty_tokens)"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cases); i++)
    kvr_test_policy_refuses(cases[i].policy, cases[i].params, cases[i].err);
  /* Valid values are accepted and written back. */
  cJSON *params = cJSON_Parse("{\"decode_weight\":0.25,\"balance_epsilon\":1}");
  char err[256];
  kvr_policy_t *p = kvr_policy_create("kv_aware", params, 1, err, sizeof(err));
  assert_non_null(p);
  cJSON *out = cJSON_CreateObject();
  p->ops->params(p, out);
  assert_true(cJSON_GetObjectItem(out, "decode_weight")->valuedouble == 0.25);
  assert_true(cJSON_GetObjectItem(out, "balance_epsilon")->valuedouble == 1);
  assert_true(cJSON_GetObjectItem(out, "prefill_weight")->valuedouble == 1);
  cJSON_Delete(out);
  cJSON_Delete(params);
  kvr_policy_destroy(p);
}

/* --- contract tests over every registered policy ---------------------------------------------- */

/* A tried set of the indexes set in m (one word: indexes below 64). Static storage: valid until
 * the next call. */
static const kvr_workerset_t *mask(uint64_t m) {
  static uint64_t word;
  static kvr_workerset_t set = {&word, 1};
  word = m;
  return &set;
}

/* The fleet sizes every policy's contract runs at: none, one, one word of the tried set, just past
 * it, and hundreds to a thousand workers (issue 35). */
static const size_t contract_sizes[] = {0, 1, 64, 65, 256, 1024};
#define CONTRACT_MAX 1024

/* A random tried set over n workers into words (KVR_WORKERSET_WORDS(n) of them): empty, a few, a
 * quarter, all but one or all. */
static void random_tried(kvr_workerset_t *set, size_t n) {
  memset(set->words, 0, set->nwords * sizeof(uint64_t));
  unsigned mode = (unsigned)(rnd() % 6);
  size_t keep = n ? (size_t)(rnd() % n) : 0;
  for (size_t i = 0; i < n; i++) {
    bool in = mode == 1   ? rnd() % 8 == 0
              : mode == 2 ? rnd() % 4 == 0
              : mode == 3 ? i != keep
                          : mode == 4;
    if (in)
      kvr_workerset_add(set, i);
  }
}

static void random_snaps(kvr_worker_snap_t *w, size_t n, kvr_route_req_t *req) {
  for (size_t i = 0; i < n; i++) {
    memset(&w[i], 0, sizeof(w[i]));
    w[i].id = (uint32_t)(100 + i);
    w[i].usable = rnd() % 5 != 0;
    w[i].inflight = (uint32_t)(rnd() % 8);
    w[i].active_tokens = rnd() % 50000;
    w[i].queued_prefill_tokens = rnd() % 20000;
    w[i].prefill_backlog_tokens = w[i].queued_prefill_tokens / (1 + rnd() % 4);
    w[i].metrics_fresh = rnd() % 2;
    w[i].num_requests_waiting = (double)(rnd() % 4);
    w[i].num_requests_running = (double)(rnd() % 8);
    w[i].kv_cache_usage = (double)(rnd() % 100) / 100.0;
    w[i].cache_capacity_blocks = rnd() % 3 ? 20000 : 0;
    w[i].cached_blocks = rnd() % 20000;
    w[i].matched_blocks = req->nblocks ? rnd() % (req->nblocks + 1) : 0;
    w[i].adapter = (uint8_t)(rnd() % 3);
  }
}

static void test_contract_all_policies(void **state) {
  (void)state;
  static uint64_t blocks[100];
  for (size_t k = 0; kvr_policy_registry[k]; k++) {
    const kvr_policy_ops_t *ops = kvr_policy_registry[k];
    char err[256];
    kvr_policy_t *a = ops->create(NULL, 42, err, sizeof(err));
    kvr_policy_t *b = kvr_policy_create(ops->name, NULL, 42, err, sizeof(err));
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(kvr_policy_name(a), ops->name);
    assert_non_null(ops->description);

    /* params() writes an object that create() accepts back. */
    cJSON *obj = cJSON_CreateObject();
    ops->params(a, obj);
    kvr_policy_t *c = ops->create(obj, 1, err, sizeof(err));
    assert_non_null(c);
    kvr_policy_destroy(c);
    cJSON_Delete(obj);
    /* Unknown fields are rejected, naming the field. */
    obj = cJSON_Parse("{\"bogus_field\":1}");
    err[0] = '\0';
    assert_null(ops->create(obj, 1, err, sizeof(err)));
    assert_non_null(strstr(err, "params.bogus_field"));
    cJSON_Delete(obj);

    kvr_route_req_t req = {.blocks = blocks,
                           .nblocks = 100,
                           .block_chars = 64,
                           .prompt_tokens = 1600,
                           .max_tokens = 256};
    kvr_worker_snap_t *w = calloc(CONTRACT_MAX, sizeof *w);
    kvr_policy_score_t *scores = calloc(CONTRACT_MAX, sizeof *scores);
    uint64_t words[KVR_WORKERSET_WORDS(CONTRACT_MAX)];
    kvr_workerset_t tried = {words, 0};

    /* 0 workers; 1 worker usable, unusable, tried. */
    assert_int_equal(kvr_policy_select(a, w, 0, &req, NULL, NULL), KVR_POLICY_NONE);
    random_snaps(w, 1, &req);
    w[0].usable = true;
    assert_int_equal(kvr_policy_select(a, w, 1, &req, NULL, scores), 0);
    assert_true(scores[0].eligible);
    assert_int_equal(kvr_policy_select(a, w, 1, &req, mask(1), scores), KVR_POLICY_NONE);
    assert_false(scores[0].eligible);
    w[0].usable = false;
    assert_int_equal(kvr_policy_select(a, w, 1, &req, NULL, NULL), KVR_POLICY_NONE);
    /* A request without blocks (empty or tiny prompt) is routable. */
    kvr_route_req_t empty = {
        .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 3, .max_tokens = 0};
    w[0].usable = true;
    w[0].matched_blocks = 0;
    assert_int_equal(kvr_policy_select(a, w, 1, &empty, NULL, NULL), 0);
    assert_int_equal(kvr_policy_select(a, w, 1, NULL, NULL, NULL), 0);

    /* Random snapshots at every contract size: in range, usable, never tried (a bitset sized to
     * the fleet); NONE only when nothing is eligible; two fresh instances with the same seed
     * agree decision by decision (one with the caller's scores, one without: past 64 workers its
     * local scores are allocated). */
    kvr_policy_destroy(a);
    a = ops->create(NULL, 42, err, sizeof(err));
    assert_non_null(a);
    rng_state = 7;
    for (size_t z = 0; z < KVR_ARRAY_SIZE(contract_sizes); z++) {
      size_t n = contract_sizes[z];
      tried.nwords = KVR_WORKERSET_WORDS(n);
      for (int iter = 0; iter < (n > 64 ? 60 : 400); iter++) {
        random_snaps(w, n, &req);
        random_tried(&tried, n);
        const kvr_workerset_t *t = iter % 7 == 0 ? NULL : &tried;
        bool any = false;
        for (size_t i = 0; i < n; i++)
          any |= kvr_policy_eligible(&w[i], i, t);
        int ra = kvr_policy_select(a, w, n, &req, t, scores);
        int rb = kvr_policy_select(b, w, n, &req, t, NULL);
        if (ra != rb)
          fail_msg("%s: not deterministic at %zu workers, iter %d (%d vs %d)", ops->name, n, iter,
                   ra, rb);
        if (!any) {
          assert_int_equal(ra, KVR_POLICY_NONE);
          continue;
        }
        if (ra < 0 || (size_t)ra >= n)
          fail_msg("%s: out of range %d (n=%zu)", ops->name, ra, n);
        assert_true(w[ra].usable);
        if (kvr_workerset_has(t, (size_t)ra))
          fail_msg("%s: picked tried worker %d of %zu", ops->name, ra, n);
        for (size_t i = 0; i < n; i++) {
          assert_int_equal(scores[i].eligible, kvr_policy_eligible(&w[i], i, t));
          assert_false(isnan(scores[i].cost));
        }
        assert_false(scores[ra].capped);
      }
      /* Everyone tried: nothing to pick, whatever the snapshots say. */
      random_snaps(w, n, &req);
      memset(words, 0xff, sizeof words);
      assert_int_equal(kvr_policy_select(a, w, n, &req, &tried, NULL), KVR_POLICY_NONE);
    }
    kvr_policy_destroy(a);
    kvr_policy_destroy(b);
    free(w);
    free(scores);
  }
}

/* --- each policy's own rules ------------------------------------------------------------------ */

static kvr_policy_t *make(const char *name, const char *params) {
  return kvr_test_policy_make(name, params, 3);
}

static void idle_workers(kvr_worker_snap_t *w, size_t n) {
  memset(w, 0, n * sizeof(*w));
  for (size_t i = 0; i < n; i++) {
    w[i].id = (uint32_t)i;
    w[i].usable = true;
  }
}

static void test_round_robin_and_least_load(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  idle_workers(w, 4);
  kvr_route_req_t req = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 100, .max_tokens = 0};
  kvr_policy_t *rr = make("round_robin", NULL);
  w[2].inflight = 50; /* round robin is load-blind */
  for (int k = 0; k < 8; k++)
    assert_int_equal(kvr_policy_select(rr, w, 4, &req, 0, NULL), k % 4);
  /* It skips tried and unusable workers and keeps its turn. */
  w[1].usable = false;
  assert_int_equal(kvr_policy_select(rr, w, 4, &req, mask(1), NULL), 2);
  assert_int_equal(kvr_policy_select(rr, w, 4, &req, 0, NULL), 3);
  assert_int_equal(kvr_policy_select(rr, w, 4, &req, 0, NULL), 0);
  assert_int_equal(kvr_policy_select(rr, w, 4, &req, 0, NULL), 2);
  kvr_policy_destroy(rr);

  kvr_policy_t *ll = make("least_load", NULL);
  idle_workers(w, 4);
  w[0].inflight = 3;
  w[1].inflight = 1;
  w[2].inflight = 1;
  w[3].inflight = 2;
  w[1].active_tokens = 9000;
  w[2].active_tokens = 100;
  assert_int_equal(kvr_policy_select(ll, w, 4, &req, 0, NULL), 2);
  assert_int_equal(kvr_policy_select(ll, w, 4, &req, mask(1u << 2), NULL), 1);
  /* Exact ties are spread at random. */
  idle_workers(w, 4);
  int seen[4] = {0};
  for (int k = 0; k < 400; k++)
    seen[kvr_policy_select(ll, w, 4, &req, 0, NULL)]++;
  for (int i = 0; i < 4; i++)
    assert_true(seen[i] > 50);
  kvr_policy_destroy(ll);
}

/* Every worker is busy prefilling a long prompt (the no-sharing control at load): the request
 * joins the worker closest to done, even when that worker carries more decode load, because the
 * remaining prefill is what delays its first token. */
static void test_kv_aware_joins_the_prefill_closest_to_done(void **state) {
  (void)state;
  kvr_policy_t *p = make("kv_aware", NULL);
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  kvr_route_req_t req = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 6000, .max_tokens = 800};
  idle_workers(w, 4);
  const uint64_t backlog[4] = {6500, 5200, 900, 4000};
  for (int i = 0; i < 4; i++) {
    w[i].inflight = 12;
    w[i].active_tokens = 12 * 6000;
    w[i].queued_prefill_tokens = 6500; /* the same pending count everywhere */
    w[i].prefill_backlog_tokens = backlog[i];
  }
  w[2].inflight = 15; /* three more decoding sequences than the others */
  w[2].active_tokens = 15 * 6000;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 2);
  assert_true(s[2].cost < s[3].cost && s[3].cost < s[1].cost && s[1].cost < s[0].cost);
  /* The cost counts the backlog, not the pending count. */
  assert_true(fabs((s[0].cost - s[1].cost) - (6500 - 5200)) < 1e-6);
  kvr_policy_destroy(p);
}

static void test_kv_aware_rules(void **state) {
  (void)state;
  kvr_policy_t *p = make("kv_aware", NULL);
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  uint64_t blocks[100] = {0};
  kvr_route_req_t req = {.blocks = blocks,
                         .nblocks = 100,
                         .block_chars = 64,
                         .prompt_tokens = 1700,
                         .max_tokens = 200};

  /* Equal load: the worker holding the prefix wins, and the cost is exactly the formula. */
  idle_workers(w, 4);
  w[2].matched_blocks = 80; /* 80 * 64 / 4 = 1280 tokens cached */
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 2);
  assert_true(fabs(s[2].cost - (1700 - 1280)) < 1e-9);
  assert_true(fabs(s[0].cost - 1700) < 1e-9);

  /* Load outweighs a small match: 10 blocks (160 tokens) do not beat 5,000 queued tokens. */
  w[2].matched_blocks = 10;
  w[2].queued_prefill_tokens = w[2].prefill_backlog_tokens = 5000;
  assert_true(kvr_policy_select(p, w, 4, &req, 0, s) != 2);
  /* ... unless the worker is nearly through them: the backlog is what counts. */
  w[2].prefill_backlog_tokens = 100;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 2);
  w[2].queued_prefill_tokens = w[2].prefill_backlog_tokens = 0;

  /* Bounded load: with a slack of 2, 9 of 12 in flight on worker 2 caps it whatever it holds
   * (limit max(1.5 x 3.25, 3.25 + 2)). */
  kvr_policy_destroy(p);
  p = make("kv_aware", "{\"balance_slack\":2}");
  w[2].matched_blocks = 100;
  w[2].inflight = 9;
  w[0].inflight = 1;
  w[1].inflight = 1;
  w[3].inflight = 1;
  int k = kvr_policy_select(p, w, 4, &req, 0, s);
  assert_true(s[2].capped);
  assert_true(k != 2);
  /* ... but not with a large epsilon and slack. */
  kvr_policy_t *loose = make("kv_aware", "{\"balance_epsilon\":10,\"balance_slack\":100}");
  assert_int_equal(kvr_policy_select(loose, w, 4, &req, 0, s), 2);
  kvr_policy_destroy(loose);

  /* Ties: least in flight first, then random among the equal. */
  idle_workers(w, 4);
  w[0].inflight = 1;
  w[0].active_tokens = 0;
  kvr_policy_t *flat = make("kv_aware", "{\"inflight_weight\":0,\"decode_weight\":0}");
  for (int r = 0; r < 20; r++)
    assert_true(kvr_policy_select(flat, w, 4, &req, 0, NULL) != 0);
  kvr_policy_destroy(flat);

  /* Fresh metrics count: a long vLLM queue and a full KV cache push a worker away. */
  idle_workers(w, 4);
  for (int i = 0; i < 4; i++)
    w[i].matched_blocks = 100;
  w[1].metrics_fresh = true;
  w[1].num_requests_waiting = 0;
  w[1].kv_cache_usage = 0;
  for (int i = 0; i < 4; i++)
    if (i != 1) {
      w[i].metrics_fresh = true;
      w[i].num_requests_waiting = 3;
      w[i].kv_cache_usage = 0.9;
    }
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 1);
  kvr_policy_destroy(p);
}

/* The prefill gate keeps a long conversation on the worker holding its history even when another
 * worker is less loaded, yields to the bounded-load cap, and is off at 0. */
static void test_kv_aware_prefill_gate(void **state) {
  (void)state;
  kvr_policy_t *p = make("kv_aware", NULL); /* prefill_gate_tokens 4096 */
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  uint64_t blocks[2500] = {0};
  /* 40,000 prompt tokens in 2,500 blocks of 16; worker 1 holds 2,400 of them (38,400 tokens). */
  kvr_route_req_t req = {.blocks = blocks,
                         .nblocks = 2500,
                         .block_chars = 64,
                         .prompt_tokens = 40000,
                         .max_tokens = 200};
  idle_workers(w, 4);
  for (int i = 0; i < 4; i++)
    w[i].inflight = 3;
  w[1].matched_blocks = 2400;
  w[1].active_tokens = 6000000; /* a heavy decode load: 60,000 at decode_weight 0.01, far above
                                 * the 38,400 tokens of prefill it saves */
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 1);
  for (int i = 0; i < 4; i++)
    if (i != 1)
      assert_true(s[i].capped);
  /* Without the gate the load moves it (and costs 38,400 tokens of prefill again). */
  kvr_policy_t *off = make("kv_aware", "{\"prefill_gate_tokens\":0}");
  assert_true(kvr_policy_select(off, w, 4, &req, 0, s) != 1);
  kvr_policy_destroy(off);
  /* The bound wins: at the in-flight limit the holder is capped and the gate does not apply
   * (every open worker has more than the gate ahead), so the load decides among the others. */
  w[1].inflight = 30; /* limit max(1.5 x 10, 10 + 8) = 18 */
  int k = kvr_policy_select(p, w, 4, &req, 0, s);
  assert_true(k != 1 && s[1].capped);
  assert_false(s[0].capped || s[2].capped || s[3].capped);
  kvr_policy_destroy(p);
}

/* LoRA adapters: kv_aware prefers the workers running the request's adapter, then those where it
 * is loaded, then those that would load it, within the bounded load (the same as a cached
 * prefix's): a busier running worker wins over idle loaded ones until the bound caps it, and a
 * worker more than balance_slack below the mean stays open. The prefill gate comes first. */
static void test_kv_aware_adapter_affinity(void **state) {
  (void)state;
  kvr_policy_t *p = make("kv_aware", NULL); /* balance_slack 8, epsilon 0.5 */
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  kvr_route_req_t req = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 500, .max_tokens = 50};
  idle_workers(w, 4);
  w[0].adapter = KVR_ADAPTER_NONE;
  w[1].adapter = KVR_ADAPTER_LOADED;
  w[2].adapter = KVR_ADAPTER_RUNNING;
  w[3].adapter = KVR_ADAPTER_LOADED;
  w[2].inflight = 6;
  w[2].active_tokens = 30000; /* busier by far: the cost alone would send it elsewhere */
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 2);
  assert_true(s[0].capped && s[1].capped && s[3].capped);
  /* Not running anywhere: the loaded ones, the cheaper of them. */
  w[2].adapter = KVR_ADAPTER_NONE;
  w[3].active_tokens = 1000;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 1);
  assert_true(s[0].capped && s[2].capped && !s[3].capped);
  /* The bound wins: the running worker at the in-flight limit (max(1.5 x 6, 6 + 8) = 14 with 23
   * in flight over 4) is capped, and the adapter gate then picks among the rest (loaded first). */
  w[2].adapter = KVR_ADAPTER_RUNNING;
  w[2].inflight = 20;
  w[0].inflight = w[1].inflight = w[3].inflight = 1;
  int k = kvr_policy_select(p, w, 4, &req, 0, s);
  assert_true(s[2].capped);
  assert_true(k == 1 || k == 3);
  assert_true(s[0].capped);
  /* Tight bounds (slack 1): the running worker keeps the request while the bound allows... */
  kvr_policy_t *tight = make("kv_aware", "{\"balance_slack\":1,\"balance_epsilon\":2}");
  idle_workers(w, 4);
  w[0].adapter = KVR_ADAPTER_RUNNING;
  assert_int_equal(kvr_policy_select(tight, w, 4, &req, 0, s), 0);
  assert_true(s[1].capped && s[2].capped && s[3].capped);
  /* ...and a worker more than balance_slack below the mean in flight stays open whatever its
   * state: 9 in flight, mean 2.5, limit max(3 x 2.5, 2.5 + 1) = 7.5 keeps worker 0 open, the gate
   * caps workers 1 and 2 (3 >= 1.5) but not the idle worker 3, which is cheaper. */
  w[0].inflight = w[1].inflight = w[2].inflight = 3;
  assert_int_equal(kvr_policy_select(tight, w, 4, &req, 0, s), 3);
  assert_true(!s[0].capped && s[1].capped && s[2].capped && !s[3].capped);
  w[0].inflight = 20; /* 26 in flight, mean 6.75: over max(3 x 6.75, 7.75) = 20.25, capped */
  k = kvr_policy_select(tight, w, 4, &req, 0, s);
  assert_true(s[0].capped && k == 3);
  kvr_policy_destroy(tight);
  /* adapter_affinity 0: the gate is off, the cost alone decides (the idle workers win). */
  kvr_policy_t *off = make("kv_aware", "{\"adapter_affinity\":0}");
  idle_workers(w, 4);
  w[0].adapter = KVR_ADAPTER_RUNNING;
  w[0].inflight = 2;
  k = kvr_policy_select(off, w, 4, &req, 0, s);
  assert_true(k != 0 && !s[1].capped && !s[2].capped && !s[3].capped);
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, s), 0); /* on: the running one */
  kvr_policy_destroy(off);
  /* A base model request (no adapter anywhere) is unchanged: the cost decides. */
  idle_workers(w, 4);
  w[0].inflight = 2;
  assert_true(kvr_policy_select(p, w, 4, &req, 0, s) != 0);
  kvr_policy_destroy(p);
}

/* Every policy of the registry takes a request naming an adapter only among the usable workers
 * the router left it (those listing it or, for a runtime adapter, serving its base): whatever the
 * adapter states, never an unusable worker. */
static void test_adapter_eligibility_all_policies(void **state) {
  (void)state;
  for (size_t k = 0; kvr_policy_registry[k]; k++) {
    kvr_policy_t *p = make(kvr_policy_registry[k]->name, NULL);
    kvr_worker_snap_t w[6];
    kvr_policy_score_t s[6];
    kvr_route_req_t req = {.prompt_tokens = 100, .block_chars = 64};
    uint64_t r = 7 + k;
    for (int n = 0; n < 300; n++) {
      idle_workers(w, 6);
      for (int i = 0; i < 6; i++) {
        w[i].usable = kvr_splitmix64(&r) % 3 != 0;
        w[i].adapter = (uint8_t)(kvr_splitmix64(&r) % 3);
        w[i].inflight = (uint32_t)(kvr_splitmix64(&r) % 20);
        w[i].rank = kvr_splitmix64(&r) | 1;
      }
      int pick = kvr_policy_select(p, w, 6, &req, 0, s);
      bool any = false;
      for (int i = 0; i < 6; i++)
        any |= w[i].usable;
      if (!any) {
        assert_int_equal(pick, KVR_POLICY_NONE);
        continue;
      }
      assert_true(pick >= 0 && pick < 6 && w[pick].usable);
    }
    kvr_policy_destroy(p);
  }
}

/* On a mixed fleet the decode load counts relative to each worker's KV cache. */
static void test_kv_aware_capacity(void **state) {
  (void)state;
  kvr_policy_t *p = make("kv_aware", NULL);
  kvr_worker_snap_t w[2];
  kvr_policy_score_t s[2];
  kvr_route_req_t req = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 1000, .max_tokens = 100};
  idle_workers(w, 2);
  w[0].cache_capacity_blocks = 20000;
  w[1].cache_capacity_blocks = 10000; /* half the cache */
  w[0].active_tokens = 150000;
  w[1].active_tokens = 100000; /* fewer tokens, but a larger share of its cache */
  assert_int_equal(kvr_policy_select(p, w, 2, &req, 0, s), 0);
  /* mean capacity 15000: 150000 x 0.75 against 100000 x 1.5, times decode_weight 0.01 */
  assert_true(fabs((s[1].cost - s[0].cost) - 0.01 * (100000 * 1.5 - 150000 * 0.75)) < 1e-6);
  /* Equal caches: plain tokens. */
  w[1].cache_capacity_blocks = 20000;
  assert_int_equal(kvr_policy_select(p, w, 2, &req, 0, s), 1);
  kvr_policy_destroy(p);
}

static void test_gie_scorer_rules(void **state) {
  (void)state;
  kvr_policy_t *p = make("gie_scorer", NULL);
  kvr_worker_snap_t w[3];
  kvr_policy_score_t s[3];
  uint64_t blocks[300] = {0};
  kvr_route_req_t req = {
      .blocks = blocks, .nblocks = 300, .block_chars = 64, .prompt_tokens = 4800, .max_tokens = 0};
  idle_workers(w, 3);
  for (int i = 0; i < 3; i++)
    w[i].metrics_fresh = true;
  /* Worker 0: full prefix (capped at 256 blocks -> 1.0), queue 4 (worst), KV 50%.
   * Worker 1: half prefix, queue 0 (best), KV 0%.  Worker 2: nothing, queue 2, KV 0%.
   * Scores (3:2:2): w0 = 3*1 + 2*0 + 2*0.5 = 4; w1 = 3*(128/256) + 2*1 + 2*1 = 5.5;
   * w2 = 0 + 2*0.5 + 2 = 3. Costs are 7 - score. */
  w[0].matched_blocks = 300;
  w[0].num_requests_waiting = 4;
  w[0].kv_cache_usage = 0.5;
  w[1].matched_blocks = 128;
  w[1].num_requests_waiting = 0;
  w[2].num_requests_waiting = 2;
  assert_int_equal(kvr_policy_select(p, w, 3, &req, 0, s), 1);
  assert_true(fabs(s[0].cost - 3.0) < 1e-9);
  assert_true(fabs(s[1].cost - 1.5) < 1e-9);
  assert_true(fabs(s[2].cost - 4.0) < 1e-9);
  /* Without fresh metrics the queue is the in-flight count and the KV use is estimated. */
  idle_workers(w, 3);
  w[0].inflight = 5;
  w[0].matched_blocks = 300;
  w[1].inflight = 0;
  w[1].active_tokens = 8000;
  w[1].cache_capacity_blocks = 1000; /* 16,000 tokens: 50% used */
  assert_int_equal(kvr_policy_select(p, w, 3, &req, 0, s), 0);
  assert_true(fabs(s[1].cost - (7 - (0 + 2 * 1 + 2 * 0.5))) < 1e-9);
  kvr_policy_destroy(p);
}

static void test_sglang_rules(void **state) {
  (void)state;
  kvr_policy_t *p = make("sglang_cache_aware", NULL);
  kvr_worker_snap_t w[4];
  uint64_t blocks[100] = {0};
  kvr_route_req_t req = {
      .blocks = blocks, .nblocks = 100, .block_chars = 64, .prompt_tokens = 1600, .max_tokens = 0};
  idle_workers(w, 4);
  /* Balanced, match rate 0.6 > 0.5: the best match. */
  w[3].matched_blocks = 60;
  w[1].matched_blocks = 40;
  w[0].cached_blocks = 5;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, NULL), 3);
  /* Match rate 0.5 is not above the threshold: the smallest tree. */
  w[3].matched_blocks = 50;
  w[1].cached_blocks = 10;
  w[2].cached_blocks = 7;
  w[3].cached_blocks = 9;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, NULL), 0);
  /* Full trees tie (our index is LRU-bounded): the less loaded, not always worker 0. */
  for (int i = 0; i < 4; i++) {
    w[i].cached_blocks = 20000;
    w[i].inflight = (uint32_t)(4 - i % 3);
  }
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, NULL), 2);
  for (int i = 0; i < 4; i++)
    w[i].inflight = 0;
  /* Imbalanced (40 - 5 > 32 and 40 > 1.1 * 5): the least loaded, whatever the match. */
  w[3].matched_blocks = 100;
  w[0].inflight = 40;
  w[1].inflight = 7;
  w[2].inflight = 5;
  w[3].inflight = 20;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, NULL), 2);
  /* 33 over 0 is imbalanced only when the absolute gap exceeds 32. */
  w[0].inflight = 32;
  w[1].inflight = 0;
  assert_int_equal(kvr_policy_select(p, w, 4, &req, 0, NULL), 3);
  kvr_policy_destroy(p);
}

/* --- simulations of the router's state updates ------------------------------------------------ */

#define NW 4

typedef struct sim_s {
  kvr_worker_snap_t w[NW];
  kvr_cache_index_t *idx;
  kvr_policy_t *pol;
  uint64_t routed[NW];
  uint64_t prompt_tokens, matched_tokens, load_ahead;
} sim_t;

typedef struct flight_s {
  bool live;
  int worker;
  int steps_left;
  bool prefilled;
  uint64_t tokens, uncached;
  kvr_prompt_t prompt;
  const char *answer;
} flight_t;

static void sim_init(sim_t *s, const char *policy, uint64_t capacity) {
  memset(s, 0, sizeof(*s));
  idle_workers(s->w, NW);
  s->idx = kvr_cache_index_new(NW, capacity);
  s->pol = make(policy, NULL);
}

static void sim_free(sim_t *s) {
  kvr_cache_index_free(s->idx);
  kvr_policy_destroy(s->pol);
}

/* What the proxy does on a request: match, snapshot, select, then account and index. */
static int sim_route(sim_t *s, flight_t *f) {
  size_t m[NW];
  kvr_cache_index_match(s->idx, f->prompt.blocks, f->prompt.nblocks, m);
  for (int i = 0; i < NW; i++) {
    s->w[i].matched_blocks = m[i];
    s->w[i].cached_blocks = kvr_cache_index_entries(s->idx, (size_t)i);
    s->w[i].cache_capacity_blocks = kvr_cache_index_capacity(s->idx, (size_t)i);
  }
  kvr_route_req_t req;
  kvr_prompt_route_req(&f->prompt, &req);
  int k = kvr_policy_select(s->pol, s->w, NW, &req, 0, NULL);
  assert_true(k >= 0 && k < NW);
  uint64_t p = f->prompt.prompt_tokens;
  uint64_t cached = KVR_MIN(p, m[k] * req.block_chars / 4);
  f->live = true;
  f->worker = k;
  f->tokens = p;
  f->uncached = p - cached;
  f->prefilled = false;
  s->load_ahead += s->w[k].active_tokens;
  s->w[k].inflight++;
  s->w[k].active_tokens += p;
  s->w[k].queued_prefill_tokens += f->uncached;
  s->w[k].prefill_backlog_tokens += f->uncached;
  kvr_cache_index_insert(s->idx, (size_t)k, f->prompt.blocks, f->prompt.nblocks);
  s->routed[k]++;
  s->prompt_tokens += p;
  s->matched_tokens += cached;
  return k;
}

static void sim_prefilled(sim_t *s, flight_t *f) {
  if (f->prefilled)
    return;
  f->prefilled = true;
  s->w[f->worker].queued_prefill_tokens -= f->uncached;
  s->w[f->worker].prefill_backlog_tokens -= f->uncached;
}

/* Completion: the worker caches prompt + answer as the assistant message the next turn carries. */
static void sim_complete(sim_t *s, flight_t *f) {
  sim_prefilled(s, f);
  kvr_worker_snap_t *w = &s->w[f->worker];
  w->inflight--;
  w->active_tokens -= f->tokens;
  if (f->answer) {
    kvr_prompt_extend_answer(&f->prompt, f->answer, strlen(f->answer));
    kvr_cache_index_insert(s->idx, (size_t)f->worker, f->prompt.blocks, f->prompt.nblocks);
  }
  kvr_prompt_free(&f->prompt);
  f->live = false;
}

static const char *const vocab[] = {"cache",   "prefill", "decode", "token",  "worker", "router",
                                    "latency", "batch",   "memory", "GPU",    "model",  "schedule",
                                    "block",   "request", "stream", "prefix", "the",    "a",
                                    "of",      "and",     "to",     "in",     "is",     "that"};

/* Deterministic pseudo-text of about n bytes. */
static char *gen_text(uint64_t seed, size_t n) {
  kvr_buf_t b = KVR_BUF_INIT;
  uint64_t st = seed * 7919 + 17;
  while (b.len < n) {
    kvr_buf_puts(&b, vocab[kvr_policy_rand(&st) % KVR_ARRAY_SIZE(vocab)]);
    kvr_buf_puts(&b, " ");
  }
  return kvr_buf_steal(&b);
}

static void make_prompt(kvr_prompt_t *out, cJSON *body) {
  char err[256];
  int rc = kvr_prompt_from_json(body, KVR_PROMPT_CHAT, 64, out, err, sizeof(err));
  if (rc)
    fail_msg("prompt: %s", err);
}

static cJSON *add_msg(cJSON *msgs, const char *role, const char *content) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", role);
  cJSON_AddStringToObject(m, "content", content);
  cJSON_AddItemToArray(msgs, m);
  return m;
}

#define CONVS 7
#define TURNS 5

/* Runs CONVS concurrent 5-turn conversations (3 shared ~3.5k-token starters, ~800-token answers):
 * each round every conversation sends its next turn, all are in flight together, then all
 * complete. Fills where[c][t]. */
static void run_conversations(sim_t *s, int where[CONVS][TURNS]) {
  char *starters[3], *answers[CONVS][TURNS], *questions[CONVS][TURNS];
  for (int k = 0; k < 3; k++)
    starters[k] = gen_text(1000 + (uint64_t)k, 14000);
  for (int c = 0; c < CONVS; c++)
    for (int t = 0; t < TURNS; t++) {
      answers[c][t] = gen_text(5000 + (uint64_t)(c * TURNS + t), 3200);
      questions[c][t] = gen_text(9000 + (uint64_t)(c * TURNS + t), 150);
    }
  flight_t fl[CONVS];
  memset(fl, 0, sizeof(fl));
  for (int t = 0; t < TURNS; t++) {
    for (int c = 0; c < CONVS; c++) {
      cJSON *body = cJSON_CreateObject();
      cJSON_AddStringToObject(body, "model", "llama");
      cJSON *msgs = cJSON_AddArrayToObject(body, "messages");
      add_msg(msgs, "system", starters[c % 3]);
      for (int j = 0; j < t; j++) {
        add_msg(msgs, "user", questions[c][j]);
        add_msg(msgs, "assistant", answers[c][j]);
      }
      add_msg(msgs, "user", questions[c][t]);
      make_prompt(&fl[c].prompt, body);
      cJSON_Delete(body);
      fl[c].answer = answers[c][t];
      where[c][t] = sim_route(s, &fl[c]);
    }
    for (int c = 0; c < CONVS; c++)
      sim_prefilled(s, &fl[c]);
    for (int c = 0; c < CONVS; c++)
      sim_complete(s, &fl[c]);
  }
  for (int k = 0; k < 3; k++)
    free(starters[k]);
  for (int c = 0; c < CONVS; c++)
    for (int t = 0; t < TURNS; t++) {
      free(answers[c][t]);
      free(questions[c][t]);
    }
}

static void test_multiturn_sticks_under_kv_aware(void **state) {
  (void)state;
  sim_t kv, rr;
  int wkv[CONVS][TURNS], wrr[CONVS][TURNS];
  sim_init(&kv, "kv_aware", 21778);
  sim_init(&rr, "round_robin", 21778);
  run_conversations(&kv, wkv);
  run_conversations(&rr, wrr);
  int used = 0;
  for (int i = 0; i < NW; i++)
    used += kv.routed[i] > 0;
  assert_true(used >= 3); /* conversations are spread over the workers... */
  for (int c = 0; c < CONVS; c++) {
    for (int t = 1; t < TURNS; t++)
      if (wkv[c][t] != wkv[c][0]) /* ...and each one stays on its worker */
        fail_msg("kv_aware: conversation %d moved from worker %d to %d at turn %d", c, wkv[c][0],
                 wkv[c][t], t);
    int moves = 0;
    for (int t = 1; t < TURNS; t++)
      moves += wrr[c][t] != wrr[c][t - 1];
    assert_true(moves >= 3); /* round robin spreads every conversation */
  }
  /* kv_aware hits the cache for most of the prompt; round robin far less. */
  double hit_kv = (double)kv.matched_tokens / (double)kv.prompt_tokens;
  double hit_rr = (double)rr.matched_tokens / (double)rr.prompt_tokens;
  assert_true(hit_kv > 0.6);
  assert_true(hit_kv > 1.5 * hit_rr);
  sim_free(&kv);
  sim_free(&rr);
}

/* One popular prefix (a 4k-token system prompt) with a short unique question per request, one
 * arrival per step, 32 steps per request: ~32 in flight. Each prefill is done by the next arrival,
 * so nothing but the load terms and the bound can stop a cache-greedy policy from sending every
 * request to the first worker that learnt the prefix. */
static void run_hot_prefix(sim_t *s, uint64_t steps) {
  char *sys = gen_text(42, 16000);
  enum { LIVE = 64 };
  flight_t fl[LIVE];
  memset(fl, 0, sizeof(fl));
  uint64_t seq = 0;
  for (uint64_t step = 0; step < steps; step++) {
    for (int k = 0; k < LIVE; k++) {
      if (!fl[k].live)
        continue;
      sim_prefilled(s, &fl[k]);
      if (--fl[k].steps_left == 0)
        sim_complete(s, &fl[k]);
    }
    {
      int k = 0;
      while (fl[k].live)
        k++;
      char *q = gen_text(777 + seq++, 600);
      cJSON *body = cJSON_CreateObject();
      cJSON_AddStringToObject(body, "model", "llama");
      cJSON *msgs = cJSON_AddArrayToObject(body, "messages");
      add_msg(msgs, "system", sys);
      add_msg(msgs, "user", q);
      make_prompt(&fl[k].prompt, body);
      cJSON_Delete(body);
      free(q);
      fl[k].answer = NULL;
      fl[k].steps_left = 32;
      sim_route(s, &fl[k]);
    }
  }
  for (int k = 0; k < LIVE; k++)
    if (fl[k].live)
      sim_complete(s, &fl[k]);
  free(sys);
}

static void test_hot_prefix_spreads(void **state) {
  (void)state;
  sim_t s;
  sim_init(&s, "kv_aware", 21778);
  run_hot_prefix(&s, 400);
  uint64_t total = 0, mx = 0, mn = UINT64_MAX;
  for (int i = 0; i < NW; i++) {
    total += s.routed[i];
    mx = KVR_MAX(mx, s.routed[i]);
    mn = KVR_MIN(mn, s.routed[i]);
  }
  /* No hot spot: no worker over 35%. A worker may stay out of the prefix's rotation at this load
   * (32 in flight): sending it the 4,000-token prefix costs more than the load it would relieve,
   * and the bound (mean + 8 in flight) is not reached; at least three workers share it. */
  int sharing = 0;
  for (int i = 0; i < NW; i++)
    sharing += s.routed[i] * 100 >= total * 15;
  (void)mn;
  if (mx * 100 > total * 35 || sharing < 3)
    fail_msg("hot spot: %llu %llu %llu %llu", (unsigned long long)s.routed[0],
             (unsigned long long)s.routed[1], (unsigned long long)s.routed[2],
             (unsigned long long)s.routed[3]);
  /* And the prefix is still reused: every worker learns it, so most prompt tokens hit. */
  assert_true((double)s.matched_tokens / (double)s.prompt_tokens > 0.8);
  sim_free(&s);
}

/* Unique prompts of very different sizes: nothing to reuse, so kv_aware must balance load at
 * least as well as round robin (measured as the active tokens already on the chosen worker). */
static void run_unique(sim_t *s, uint64_t steps) {
  enum { LIVE = 128 };
  flight_t fl[LIVE];
  memset(fl, 0, sizeof(fl));
  uint64_t seq = 0, st = 99;
  for (uint64_t step = 0; step < steps; step++) {
    for (int k = 0; k < LIVE; k++) {
      if (!fl[k].live)
        continue;
      sim_prefilled(s, &fl[k]);
      if (--fl[k].steps_left <= 0)
        sim_complete(s, &fl[k]);
    }
    for (int a = 0; a < 3; a++) {
      int k = 0;
      while (fl[k].live)
        k++;
      size_t len = 1000 + kvr_policy_rand(&st) % 40000;
      char *q = gen_text(31337 + seq++, len);
      cJSON *body = cJSON_CreateObject();
      cJSON_AddStringToObject(body, "model", "llama");
      add_msg(cJSON_AddArrayToObject(body, "messages"), "user", q);
      make_prompt(&fl[k].prompt, body);
      cJSON_Delete(body);
      free(q);
      fl[k].answer = NULL;
      fl[k].steps_left = 2 + (int)(len / 2000);
      sim_route(s, &fl[k]);
    }
  }
  for (int k = 0; k < LIVE; k++)
    if (fl[k].live)
      sim_complete(s, &fl[k]);
}

static void test_no_loss_when_nothing_shared(void **state) {
  (void)state;
  sim_t kv, rr;
  sim_init(&kv, "kv_aware", 21778);
  sim_init(&rr, "round_robin", 21778);
  run_unique(&kv, 60);
  run_unique(&rr, 60);
  assert_int_equal(kv.prompt_tokens, rr.prompt_tokens);
  assert_true(kv.matched_tokens * 100 < kv.prompt_tokens); /* nothing (meaningful) shared */
  if (kv.load_ahead > rr.load_ahead)
    fail_msg("kv_aware load ahead %llu > round robin %llu", (unsigned long long)kv.load_ahead,
             (unsigned long long)rr.load_ahead);
  sim_free(&kv);
  sim_free(&rr);
}

/* --- dynamo_kv ----------------------------------------------------------------------------------
 */

/* 100 blocks of 64 characters = 16 tokens each, 1,600 prompt tokens. */
static uint64_t dyn_blocks[100];
static const kvr_route_req_t dyn_req = {.blocks = dyn_blocks,
                                        .nblocks = 100,
                                        .block_chars = 64,
                                        .prompt_tokens = 1600,
                                        .max_tokens = 0};

static void test_dynamo_kv_cost(void **state) {
  (void)state;
  kvr_policy_t *p = make("dynamo_kv", "{\"overlap_score_weight\":2}");
  kvr_worker_snap_t w[3];
  kvr_policy_score_t s[3];
  idle_workers(w, 3);
  /* Worker 0: 40 blocks matched (640 tokens), 320 tokens of others' prefill pending, 1,600 active
   * tokens. prefill = (320 + 1600 - 640) / 16 = 80 blocks; decode = 1600 / 16 + 100 = 200 blocks;
   * logit = 2 * 80 + 200 = 360. */
  w[0].matched_blocks = 40;
  w[0].queued_prefill_tokens = 320;
  w[0].prefill_backlog_tokens = 10; /* not Dynamo's input: ignored */
  w[0].active_tokens = 1600;
  w[0].inflight = 9; /* nor these */
  w[0].metrics_fresh = true;
  w[0].num_requests_waiting = 7;
  w[0].kv_cache_usage = 0.9;
  /* Worker 1: idle, nothing matched: 2 * 100 + 100 = 300. */
  /* Worker 2: a match longer than the prompt estimate leaves no prefill (clamped, not negative);
   * 8,000 active tokens are 500 blocks: 2 * 0 + 500 + 100 = 600. */
  w[2].matched_blocks = 150;
  w[2].active_tokens = 8000;
  assert_int_equal(kvr_policy_select(p, w, 3, &dyn_req, 0, s), 1);
  assert_true(fabs(s[0].cost - 360.0) < 1e-9);
  assert_true(fabs(s[1].cost - 300.0) < 1e-9);
  assert_true(fabs(s[2].cost - 600.0) < 1e-9);
  kvr_policy_destroy(p);
  /* The default weight is 1: worker 0 = 80 + 200 = 280, worker 1 = 200. */
  p = make("dynamo_kv", NULL);
  cJSON *out = cJSON_CreateObject();
  p->ops->params(p, out);
  assert_true(cJSON_GetObjectItem(out, "overlap_score_weight")->valuedouble == 1);
  assert_true(cJSON_GetObjectItem(out, "temperature")->valuedouble == 0);
  cJSON_Delete(out);
  assert_int_equal(kvr_policy_select(p, w, 3, &dyn_req, 0, s), 1);
  assert_true(fabs(s[0].cost - 280.0) < 1e-9);
  assert_true(fabs(s[1].cost - 200.0) < 1e-9);
  /* No request features: every worker costs its active blocks. */
  assert_int_equal(kvr_policy_select(p, w, 3, NULL, 0, s), 1);
  assert_true(fabs(s[0].cost - 1920.0) < 1e-9); /* 320 + 1600 tokens at 1 token per block */
  kvr_policy_destroy(p);
}

static void test_dynamo_kv_match_vs_load(void **state) {
  (void)state;
  kvr_policy_t *p = make("dynamo_kv", NULL);
  kvr_worker_snap_t w[4];
  kvr_policy_score_t s[4];
  /* Equal load: the longest match wins. */
  idle_workers(w, 4);
  for (int i = 0; i < 4; i++)
    w[i].active_tokens = 3200;
  w[0].matched_blocks = 10;
  w[1].matched_blocks = 60;
  w[3].matched_blocks = 59;
  assert_int_equal(kvr_policy_select(p, w, 4, &dyn_req, 0, s), 1);
  /* Far more active blocks lose despite a full match: worker 1 holds 300 more blocks than the
   * others (0 + 500 + 100 = 600 against at best 41 + 200 + 100 = 341). */
  w[1].matched_blocks = 100;
  w[1].active_tokens = 8000;
  assert_int_equal(kvr_policy_select(p, w, 4, &dyn_req, 0, s), 3);
  assert_true(fabs(s[1].cost - 600.0) < 1e-9);
  assert_true(fabs(s[3].cost - 341.0) < 1e-9);
  /* Others' pending prefill counts as prefill work ahead of us. */
  w[3].queued_prefill_tokens = 16 * 100;
  assert_int_equal(kvr_policy_select(p, w, 4, &dyn_req, 0, s), 0);
  /* Ineligible or tried workers are never chosen, however cheap. */
  w[0].usable = false;
  assert_int_equal(kvr_policy_select(p, w, 4, &dyn_req, mask(UINT64_C(1) << 2), s), 3);
  assert_false(s[0].eligible);
  assert_false(s[2].eligible);
  assert_int_equal(kvr_policy_select(p, w, 4, &dyn_req, mask(0xF), s), KVR_POLICY_NONE);
  kvr_policy_destroy(p);
}

/* The picks of a fresh dynamo_kv with seed over count selects on w. */
static void dyn_draws(uint64_t seed, const char *params, const kvr_worker_snap_t *w, size_t n,
                      uint64_t tried, int *picks, int count) {
  char err[256];
  cJSON *j = params ? cJSON_Parse(params) : NULL;
  kvr_policy_t *p = kvr_policy_create("dynamo_kv", j, seed, err, sizeof(err));
  cJSON_Delete(j);
  assert_non_null(p);
  for (int k = 0; k < count; k++)
    picks[k] = kvr_policy_select(p, w, n, &dyn_req, mask(tried), NULL);
  kvr_policy_destroy(p);
}

static void test_dynamo_kv_ties(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  idle_workers(w, 4);
  int a[200], b[200], c[200], hits[4] = {0};
  dyn_draws(11, NULL, w, 4, 0, a, 200);
  dyn_draws(11, NULL, w, 4, 0, b, 200);
  dyn_draws(12, NULL, w, 4, 0, c, 200);
  assert_memory_equal(a, b, sizeof(a)); /* same seed, same picks */
  assert_memory_not_equal(a, c, sizeof(a));
  for (int k = 0; k < 200; k++)
    hits[a[k]]++;
  for (int i = 0; i < 4; i++)
    assert_true(hits[i] > 20); /* uniform over the tie: about 50 each */
  /* Dynamo breaks a tie by the smaller radix tree first: our index's cached_blocks. */
  for (int i = 0; i < 4; i++)
    w[i].cached_blocks = 500;
  w[2].cached_blocks = 499;
  dyn_draws(11, NULL, w, 4, 0, a, 50);
  for (int k = 0; k < 50; k++)
    assert_int_equal(a[k], 2);
}

static void test_dynamo_kv_temperature(void **state) {
  (void)state;
  kvr_worker_snap_t w[5];
  idle_workers(w, 5);
  /* Logits 100, 150, 200, 250 (range 150); worker 4 is cheaper still but unusable. */
  w[0].matched_blocks = 100;
  w[1].matched_blocks = 50;
  w[3].active_tokens = 16 * 50;
  w[4].matched_blocks = 100;
  w[4].usable = false;
  enum { N = 4000 };
  static int picks[N];
  int hits[5] = {0};
  dyn_draws(5, "{\"temperature\":1}", w, 5, 0, picks, N);
  for (int k = 0; k < N; k++)
    hits[picks[k]]++;
  assert_int_equal(hits[4], 0);
  /* exp(-(l - 100) / 150): 1, 0.72, 0.51, 0.37 of 2.60 -> about 1,540, 1,100, 790, 570. */
  for (int i = 0; i < 4; i++)
    assert_true(hits[i] > 300);
  assert_true(hits[0] > hits[1] && hits[1] > hits[2] && hits[2] > hits[3]);
  /* A tried worker is skipped and the rest still sampled; same seed, same draws. */
  static int again[N];
  dyn_draws(5, "{\"temperature\":1}", w, 5, 0, again, N);
  assert_memory_equal(picks, again, sizeof(picks));
  dyn_draws(5, "{\"temperature\":1}", w, 5, UINT64_C(1), picks, 400);
  for (int k = 0; k < 400; k++)
    assert_true(picks[k] == 1 || picks[k] == 2 || picks[k] == 3);
  /* A low temperature is close to the argmin; equal logits are sampled uniformly. */
  dyn_draws(5, "{\"temperature\":0.01}", w, 5, 0, picks, 400);
  for (int k = 0; k < 400; k++)
    assert_int_equal(picks[k], 0);
  idle_workers(w, 3);
  memset(hits, 0, sizeof(hits));
  dyn_draws(5, "{\"temperature\":2}", w, 3, 0, picks, 600);
  for (int k = 0; k < 600; k++)
    hits[picks[k]]++;
  for (int i = 0; i < 3; i++)
    assert_true(hits[i] > 120);
}

/* --- llmd_precise -------------------------------------------------------------------------------
 */

/* 100 blocks of 64 characters = 16 tokens each, 1,600 prompt tokens. */
static uint64_t lp_blocks[100];
static const kvr_route_req_t lp_req = {
    .blocks = lp_blocks, .nblocks = 100, .block_chars = 64, .prompt_tokens = 1600, .max_tokens = 0};

/* The guide's profile: 2 * prefix + 1 * (1 - kv usage) + 1 * normalized queue, max wins. */
static void test_llmd_precise_scores(void **state) {
  (void)state;
  kvr_policy_t *p = make("llmd_precise", NULL);
  cJSON *out = cJSON_CreateObject();
  p->ops->params(p, out);
  assert_true(cJSON_GetObjectItem(out, "prefix_weight")->valuedouble == 2);
  assert_true(cJSON_GetObjectItem(out, "kv_cache_weight")->valuedouble == 1);
  assert_true(cJSON_GetObjectItem(out, "queue_weight")->valuedouble == 1);
  assert_true(cJSON_GetObjectItem(out, "affinity_threshold")->valuedouble == 0);
  assert_true(cJSON_GetObjectItem(out, "exploration_probability")->valuedouble == 0.01);
  cJSON_Delete(out);
  kvr_worker_snap_t w[3];
  kvr_policy_score_t s[3];
  idle_workers(w, 3);
  for (int i = 0; i < 3; i++)
    w[i].metrics_fresh = true;
  /* w0: full prefix, KV 90%, queue 4 (worst): 2 + 0.1 + 0 = 2.1, cost 4 - 2.1 = 1.9.
   * w1: half prefix, KV 20%, queue 0 (best): 1 + 0.8 + 1 = 2.8, cost 1.2.
   * w2: no prefix, KV 0%, queue 2: 0 + 1 + 0.5 = 1.5, cost 2.5. */
  w[0].matched_blocks = 100;
  w[0].kv_cache_usage = 0.9;
  w[0].num_requests_waiting = 4;
  w[1].matched_blocks = 50;
  w[1].kv_cache_usage = 0.2;
  w[2].num_requests_waiting = 2;
  w[2].inflight = 30; /* scraped figures are fresh: the router's counts are not used */
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 1);
  assert_true(fabs(s[0].cost - 1.9) < 1e-9);
  assert_true(fabs(s[1].cost - 1.2) < 1e-9);
  assert_true(fabs(s[2].cost - 2.5) < 1e-9);
  for (int i = 0; i < 3; i++)
    assert_false(s[i].capped); /* no affinity gate by default */
  /* A match longer than the request counts as 1. */
  w[0].matched_blocks = 150;
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 1);
  assert_true(fabs(s[0].cost - 1.9) < 1e-9);
  /* Stale metrics: queue = inflight, KV use = active tokens over the modelled capacity. */
  idle_workers(w, 2);
  w[0].inflight = 6;
  w[0].matched_blocks = 100;
  w[1].inflight = 2;
  w[1].active_tokens = 8000;
  w[1].cache_capacity_blocks = 1000; /* 16,000 tokens: 50% used */
  assert_int_equal(kvr_policy_select(p, w, 2, &lp_req, 0, s), 0);
  assert_true(fabs(s[0].cost - (4 - (2 + 1 + 0))) < 1e-9);
  assert_true(fabs(s[1].cost - (4 - (0 + 0.5 + 1))) < 1e-9);
  kvr_policy_destroy(p);
}

/* The affinity gate keeps only workers whose match is at least the threshold; the queue scorer then
 * normalizes over the kept ones, so the least loaded of them wins. */
static void test_llmd_precise_affinity_gate(void **state) {
  (void)state;
  kvr_policy_t *p = make("llmd_precise", "{\"affinity_threshold\":0.8,"
                                         "\"exploration_probability\":0}");
  kvr_worker_snap_t w[5];
  kvr_policy_score_t s[5];
  idle_workers(w, 5);
  /* Matches 0.79, 0.80, 0.95, 1.0, 0; queues (in flight, metrics stale) 0, 5, 4, 9, 0; KV use 0
   * everywhere (capacity unknown). */
  w[0].matched_blocks = 79;
  w[1].matched_blocks = 80;
  w[1].inflight = 5;
  w[2].matched_blocks = 95;
  w[2].inflight = 4;
  w[3].matched_blocks = 100;
  w[3].inflight = 9;
  /* Kept: 1, 2, 3 (>= 0.8). Queue over them: min 4, max 9. w1 = 1.6 + 1 + 4/5 = 3.4,
   * w2 = 1.9 + 1 + 1 = 3.9, w3 = 2 + 1 + 0 = 3. w2 wins: the least loaded among the kept, though
   * w0 and w4 are idler. */
  assert_int_equal(kvr_policy_select(p, w, 5, &lp_req, 0, s), 2);
  assert_true(s[0].capped);
  assert_false(s[1].capped);
  assert_false(s[2].capped);
  assert_false(s[3].capped);
  assert_true(s[4].capped);
  assert_true(fabs(s[1].cost - (4 - 3.4)) < 1e-9);
  assert_true(fabs(s[2].cost - (4 - 3.9)) < 1e-9);
  assert_true(fabs(s[3].cost - (4 - 3.0)) < 1e-9);
  /* The threshold is inclusive: with 2 and 3 tried, w1 (exactly 0.80) is the one sticky candidate
   * and is kept alone, though w0 would outscore it (3.58 against 1.6 + 1 + 0). */
  assert_int_equal(kvr_policy_select(p, w, 5, &lp_req, mask(0xC), s), 1);
  assert_true(s[0].capped && s[4].capped);
  assert_false(s[1].capped);
  /* The same snapshot without the gate (the guide's default): queue over all five, min 0, max 9;
   * the idle w0, just under the threshold, wins: 1.58 + 1 + 1 = 3.58 against w2's
   * 1.9 + 1 + 5/9 = 3.46. */
  kvr_policy_t *open = make("llmd_precise", NULL);
  assert_int_equal(kvr_policy_select(open, w, 5, &lp_req, 0, s), 0);
  assert_false(s[0].capped || s[4].capped);
  /* Tried or unusable sticky workers are not candidates: with 1 tried and 2 unusable, 3 is the
   * only sticky one left and wins. */
  w[2].usable = false;
  assert_int_equal(kvr_policy_select(p, w, 5, &lp_req, mask(UINT64_C(1) << 1), s), 3);
  assert_false(s[1].eligible);
  assert_false(s[2].eligible);
  assert_false(s[1].capped); /* not eligible: not counted as dropped by the filter */
  /* No sticky candidate left (1, 2, 3 tried): the filter keeps w0 and w4, and w0's match wins. */
  assert_int_equal(kvr_policy_select(p, w, 5, &lp_req, mask(0xE), s), 0);
  for (int i = 0; i < 5; i++)
    assert_false(s[i].capped);
  /* No blocks: every match is 0, the filter is a no-op. */
  kvr_route_req_t none = {
      .blocks = NULL, .nblocks = 0, .block_chars = 64, .prompt_tokens = 3, .max_tokens = 0};
  assert_int_not_equal(kvr_policy_select(p, w, 5, &none, 0, s), KVR_POLICY_NONE);
  for (int i = 0; i < 5; i++)
    assert_false(s[i].capped);
  kvr_policy_destroy(open);
  kvr_policy_destroy(p);
}

/* The TTFT load gate: when the best sticky worker's prefill ahead of the first token (backlog +
 * this request's uncached tokens) exceeds the best non-sticky one's by more than the penalty,
 * stickiness is broken and every candidate is scored. */
static void test_llmd_precise_ttft_gate(void **state) {
  (void)state;
  kvr_worker_snap_t w[3];
  kvr_policy_score_t s[3];
  idle_workers(w, 3);
  /* w0 sticky (full match: 0 uncached), backlog 20,000. w1 sticky (90 blocks: 160 uncached),
   * backlog 19,000 -> 19,160, the best sticky. w2 not sticky (1,600 uncached), backlog 0. */
  w[0].matched_blocks = 100;
  w[0].prefill_backlog_tokens = 20000;
  w[0].inflight = 4;
  w[1].matched_blocks = 90;
  w[1].prefill_backlog_tokens = 19000;
  w[1].inflight = 4;
  w[2].inflight = 1;
  /* Penalty 17,560: 19,160 - 1,600 = 17,560 is not more than it, the gate holds: w2 dropped.
   * Queues 4, 4 over the kept: w0 = 2 + 1 + 1 against w1 = 1.8 + 1 + 1. */
  kvr_policy_t *p = make("llmd_precise", "{\"affinity_threshold\":0.8,"
                                         "\"exploration_probability\":0,"
                                         "\"max_ttft_penalty_tokens\":17560}");
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 0);
  assert_true(s[2].capped);
  kvr_policy_destroy(p);
  /* One token less of penalty: the gate breaks and all three are scored (queues 4, 4, 1): w0 =
   * 2 + 1 + 0 = 3 still beats the idle w2 = 0 + 1 + 1 = 2 on its match. */
  p = make("llmd_precise", "{\"affinity_threshold\":0.8,\"exploration_probability\":0,"
                           "\"max_ttft_penalty_tokens\":17559}");
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 0);
  for (int i = 0; i < 3; i++)
    assert_false(s[i].capped);
  /* With a prefix weight of 0.5 the broken gate lets the idle w2 (0 + 1 + 1 = 2) beat w0
   * (0.5 + 1 + 0 = 1.5). */
  kvr_policy_destroy(p);
  p = make("llmd_precise", "{\"affinity_threshold\":0.8,\"exploration_probability\":0,"
                           "\"max_ttft_penalty_tokens\":17559,\"prefix_weight\":0.5}");
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 2);
  kvr_policy_destroy(p);
  /* Same weights, gate holding (penalty 17,560): w2 is out, w0 wins (0.5 + 1 + 1). */
  p = make("llmd_precise", "{\"affinity_threshold\":0.8,\"exploration_probability\":0,"
                           "\"max_ttft_penalty_tokens\":17560,\"prefix_weight\":0.5}");
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 0);
  assert_true(s[2].capped);
  kvr_policy_destroy(p);
  /* Penalty 0 is llm-d's "always stick": no gate however far behind the sticky set is. */
  p = make("llmd_precise", "{\"affinity_threshold\":0.8,\"exploration_probability\":0,"
                           "\"max_ttft_penalty_tokens\":0,\"prefix_weight\":0.5}");
  w[0].prefill_backlog_tokens = w[1].prefill_backlog_tokens = 1000000;
  assert_int_equal(kvr_policy_select(p, w, 3, &lp_req, 0, s), 0);
  assert_true(s[2].capped);
  kvr_policy_destroy(p);
}

/* The picks of a fresh llmd_precise with seed over count selects on w. */
static void lp_draws(uint64_t seed, const char *params, const kvr_worker_snap_t *w, size_t n,
                     int *picks, int count) {
  char err[256];
  cJSON *j = params ? cJSON_Parse(params) : NULL;
  kvr_policy_t *p = kvr_policy_create("llmd_precise", j, seed, err, sizeof(err));
  cJSON_Delete(j);
  assert_non_null(p);
  for (int k = 0; k < count; k++)
    picks[k] = kvr_policy_select(p, w, n, &lp_req, 0, NULL);
  kvr_policy_destroy(p);
}

/* Ties are broken at random from the seed (max-score-picker shuffles); exploration skips the gate
 * with its probability, from the same seeded RNG. */
static void test_llmd_precise_ties_and_exploration(void **state) {
  (void)state;
  kvr_worker_snap_t w[4];
  idle_workers(w, 4);
  int a[200], b[200], c[200], hits[4] = {0};
  lp_draws(21, NULL, w, 4, a, 200);
  lp_draws(21, NULL, w, 4, b, 200);
  lp_draws(22, NULL, w, 4, c, 200);
  assert_memory_equal(a, b, sizeof(a));
  assert_memory_not_equal(a, c, sizeof(a));
  for (int k = 0; k < 200; k++)
    hits[a[k]]++;
  for (int i = 0; i < 4; i++)
    assert_true(hits[i] > 20); /* about 50 each */
  /* Worker 0 sticky but busy, 1..3 idle with no match and a prefix weight of 0.5: the gate keeps
   * w0 except when exploring, and with the gate skipped w0 loses (0.5 + 1 + 0 against 0 + 1 + 1).
   * exploration_probability 0.25: about a quarter of the picks leave w0. */
  w[0].matched_blocks = 100;
  w[0].inflight = 8;
  enum { N = 4000 };
  static int picks[N], again[N];
  const char *params = "{\"affinity_threshold\":0.8,\"exploration_probability\":0.25,"
                       "\"prefix_weight\":0.5}";
  lp_draws(9, params, w, 4, picks, N);
  lp_draws(9, params, w, 4, again, N);
  assert_memory_equal(picks, again, sizeof(picks));
  int away = 0;
  for (int k = 0; k < N; k++)
    away += picks[k] != 0;
  assert_true(away > 800 && away < 1200);
  /* Probability 0: never; 1: always. */
  lp_draws(9, "{\"affinity_threshold\":0.8,\"exploration_probability\":0,\"prefix_weight\":0.5}", w,
           4, picks, 200);
  for (int k = 0; k < 200; k++)
    assert_int_equal(picks[k], 0);
  lp_draws(9, "{\"affinity_threshold\":0.8,\"exploration_probability\":1,\"prefix_weight\":0.5}", w,
           4, picks, 200);
  for (int k = 0; k < 200; k++)
    assert_int_not_equal(picks[k], 0);
}

KVR_TEST_MAIN(
    cmocka_unit_test(test_registry), cmocka_unit_test(test_param_errors),
    cmocka_unit_test(test_contract_all_policies), cmocka_unit_test(test_round_robin_and_least_load),
    cmocka_unit_test(test_kv_aware_rules), cmocka_unit_test(test_kv_aware_prefill_gate),
    cmocka_unit_test(test_kv_aware_capacity), cmocka_unit_test(test_kv_aware_adapter_affinity),
    cmocka_unit_test(test_adapter_eligibility_all_policies),
    cmocka_unit_test(test_kv_aware_joins_the_prefill_closest_to_done),
    cmocka_unit_test(test_gie_scorer_rules), cmocka_unit_test(test_sglang_rules),
    cmocka_unit_test(test_dynamo_kv_cost), cmocka_unit_test(test_dynamo_kv_match_vs_load),
    cmocka_unit_test(test_dynamo_kv_ties), cmocka_unit_test(test_dynamo_kv_temperature),
    cmocka_unit_test(test_llmd_precise_scores), cmocka_unit_test(test_llmd_precise_affinity_gate),
    cmocka_unit_test(test_llmd_precise_ttft_gate),
    cmocka_unit_test(test_llmd_precise_ties_and_exploration),
    cmocka_unit_test(test_multiturn_sticks_under_kv_aware),
    cmocka_unit_test(test_hot_prefix_spreads), cmocka_unit_test(test_no_loss_when_nothing_shared))

/* test_vcluster.c -- the virtual-time cluster (bench/vcluster/) driven by the real load generator
 * on its virtual transport, and the load generator's virtual path on its own (a fake transport).
 *
 * Every level runs a small cluster (2-3 workers of a small engine) on a short multiturn workload
 * in session mode (answers resent), so each test runs in milliseconds of real time:
 *   - determinism: the same options and seed give identical records; another policy or router
 *     seed differs;
 *   - every request of a level completes; the router's load returns to zero after every kind of
 *     level end (seen through least_load's choices: the cluster has no accessor for its router);
 *   - timing: an isolated request times exactly as the engine alone, and the network and router
 *     delays add up hop by hop;
 *   - a closed-loop (concurrency) level in virtual time;
 *   - prefix reuse across turns with kv_aware, spreading with round_robin;
 *   - the policy switch (unknown names, the oracle), the cache reset, idle time, level figures;
 *   - early stop, then another level on the same cluster (stale deferred events ignored);
 *   - a mixed fleet (worker_blocks) and its validation;
 *   - a fleet resized between levels (kvr_vcluster_set_workers: the fleet-sizing search), equal
 *     to a fresh cluster of that size; the fleet search (bench/vcluster/fleet.h) as a state
 *     machine, the answer a run's levels give and the fleet report;
 *   - a body the worker refuses (prompt + max_tokens beyond max_model_len): an HTTP 400 record;
 *   - the load generator's kvr_loadgen_vt_* calls against a hand-made transport: exact virtual
 *     TTFT/E2E/TPOT, an error status, a refused send, a missing callback; the Responses API's
 *     chain (each turn names the id the transport gave the turn before; an answer without an id
 *     fails and ends its conversation);
 *   - the Responses API (agentic sessions chained by previous_response_id): every follow-up
 *     pinned to the worker that stored its previous response, whatever the policy (the oracle
 *     too), reusing that worker's cache; without the pinning a follow-up on another worker is
 *     vLLM's 404 (a failed request) and one that lands right still reuses the cache;
 *     deterministic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "base/quantile.h"
#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/np_random.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "bench/sim/sim_server.h"
#include "bench/vcluster/fleet.h"
#include "bench/vcluster/vcluster.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- fixtures -------------------------------------------------------------------------------- */

/* A small cluster: 3 workers, a 4096-block engine, short contexts. */
static kvr_vcluster_opts_t small_opts(size_t workers) {
  kvr_vcluster_opts_t o;
  kvr_vcluster_opts_default(&o);
  o.workers = workers;
  o.engine.num_gpu_blocks = 4096;
  o.engine.block_size = 16;
  o.engine.max_num_seqs = 64;
  o.engine.max_num_batched_tokens = 2048;
  o.engine.max_model_len = 8192;
  o.output_len_mean = 0;
  o.model = "test-model";
  o.scrape_interval_ms = 200;
  o.scrape_stale_ms = 1000;
  return o;
}

/* Multiturn, session mode (real answers resent): 3 turns, 2 starters, ~250-token prefixes,
 * 16-token answers. */
static kvr_workload_t *small_workload(void) {
  kvr_workload_opts_t w;
  kvr_workload_opts_default(&w);
  w.kind = KVR_WL_MULTITURN;
  w.replay = false;
  w.turns = 3;
  w.starters = 2;
  w.prefix_min_tokens = 200;
  w.prefix_max_tokens = 300;
  w.out_mean = 16;
  w.out_std = 0;
  w.out_min = 16;
  w.out_max = 16;
  w.think_mean_s = 0.2;
  w.seed = 7;
  char err[256] = "";
  kvr_workload_t *wl = kvr_workload_new(&w, err, sizeof(err));
  if (wl == NULL)
    fail_msg("workload: %s", err);
  return wl;
}

static kvr_loadgen_opts_t small_lg(size_t num_prompts) {
  kvr_loadgen_opts_t o;
  kvr_loadgen_opts_default(&o);
  o.model = "test-model";
  o.num_prompts = num_prompts;
  o.request_timeout_s = 0;
  return o;
}

static const kvr_slo_t loose_slo = {60000, 10000, 1};

static kvr_vcluster_t *cluster(const kvr_vcluster_opts_t *o) {
  kvr_log_set_level(KVR_LOG_WARN); /* the router's worker and scrape lines are noise here */
  char err[256] = "";
  kvr_vcluster_t *vc = kvr_vcluster_new(o, err, sizeof(err));
  if (vc == NULL)
    fail_msg("kvr_vcluster_new: %s", err);
  return vc;
}

static kvr_loadgen_t *vgen(kvr_vcluster_t *vc, const kvr_loadgen_opts_t *lo,
                           const kvr_workload_t *wl) {
  kvr_loadgen_vt_t vt;
  kvr_vcluster_transport(vc, &vt);
  char err[256] = "";
  kvr_loadgen_t *lg = kvr_loadgen_new_virtual(lo, wl, &vt, err, sizeof(err));
  if (lg == NULL)
    fail_msg("kvr_loadgen_new_virtual: %s", err);
  return lg;
}

/* One rate level on vc with a fresh generator; the level is the caller's. */
static kvr_level_t *level_on(kvr_vcluster_t *vc, const kvr_loadgen_opts_t *lo,
                             const kvr_workload_t *wl, double rate, uint64_t seed,
                             const kvr_slo_t *slo) {
  kvr_loadgen_t *lg = vgen(vc, lo, wl);
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "t", rate, 0, seed, slo, &lv), 0);
  assert_non_null(lv);
  kvr_loadgen_free(lg);
  return lv;
}

/* Every request of the level (warm-up included) completed whole. */
static void assert_all_ok(const kvr_level_t *lv, size_t measured) {
  assert_false(lv->interrupted);
  assert_false(lv->stopped_early);
  assert_int_equal(lv->measured, measured);
  assert_int_equal(lv->completed, measured);
  assert_int_equal(lv->failed, 0);
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (!r->ok)
      fail_msg("record %zu (conv %llu turn %u) failed: status %d %s", i,
               (unsigned long long)r->conv, r->turn, r->status, r->error);
    assert_int_equal(r->status, 200);
    assert_true(r->usage_seen);
    assert_int_equal(r->output_tokens, 16);
    assert_int_equal(r->chunks, 16);
    assert_true(r->ttft_ms > 0 && r->e2e_ms >= r->ttft_ms);
    assert_true(r->cached_tokens <= r->prompt_tokens);
    assert_true(r->worker[0] != '\0');
  }
}

/* The record a level sent first (the same prompt at the same seed). */
static const kvr_req_rec_t *first_sent(const kvr_level_t *lv) {
  const kvr_req_rec_t *best = NULL;
  for (size_t i = 0; i < lv->nrecs; i++)
    if (best == NULL || lv->recs[i].sent_s < best->sent_s)
      best = &lv->recs[i];
  assert_non_null(best);
  return best;
}

/* Two times the same: bit for bit when tol_ms is 0, else within tol_ms (milliseconds). */
static bool same_time(double x_ms, double y_ms, double tol_ms) {
  return tol_ms == 0 ? memcmp(&x_ms, &y_ms, sizeof(double)) == 0 : fabs(x_ms - y_ms) < tol_ms;
}

/* The same requests, decisions and tokens, and the same times (see same_time). */
static bool same_records(const kvr_level_t *a, const kvr_level_t *b, double tol_ms) {
  if (a->nrecs != b->nrecs)
    return false;
  for (size_t i = 0; i < a->nrecs; i++) {
    const kvr_req_rec_t *x = &a->recs[i], *y = &b->recs[i];
    if (x->conv != y->conv || x->turn != y->turn || x->ok != y->ok ||
        !same_time(x->ttft_ms, y->ttft_ms, tol_ms) || !same_time(x->e2e_ms, y->e2e_ms, tol_ms) ||
        !same_time(x->sent_s * 1e3, y->sent_s * 1e3, tol_ms) ||
        !same_time(x->tpot_ms, y->tpot_ms, tol_ms) || x->cached_tokens != y->cached_tokens ||
        x->prompt_tokens != y->prompt_tokens || strcmp(x->worker, y->worker) != 0)
      return false;
  }
  return true;
}

/* ---- the cluster through the load generator -------------------------------------------------- */

/* Two fresh clusters, same options and seed: identical records, field by field, and the same
 * number of events; a different policy routes differently. */
static void test_determinism(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(3);
  kvr_loadgen_opts_t lo = small_lg(30);
  kvr_level_t *lv[3];
  uint64_t events[2];
  double now[2];
  for (int i = 0; i < 3; i++) {
    kvr_vcluster_t *vc = cluster(&o);
    char err[256];
    if (i == 2)
      assert_int_equal(kvr_vcluster_set_policy(vc, "round_robin", NULL, err, sizeof(err)), 0);
    lv[i] = level_on(vc, &lo, wl, 4, 99, &loose_slo);
    assert_all_ok(lv[i], 30);
    if (i < 2) {
      events[i] = kvr_vcluster_events(vc);
      now[i] = kvr_vcluster_now(vc);
    }
    kvr_vcluster_free(vc);
  }
  assert_true(events[0] > 0 && events[0] == events[1]);
  assert_true(now[0] > 0 && now[0] == now[1]);
  assert_true(same_records(lv[0], lv[1], 0));
  assert_false(same_records(lv[0], lv[2], 0));
  for (int i = 0; i < 3; i++)
    kvr_stats_level_free(lv[i]);
  kvr_workload_free(wl);
}

/* The router's seed does not move requests that have a prompt: least_load's ties (frequent at
 * light load) break by the prompt's rendezvous rank, so the same run with another seed sends every
 * request to the same worker, as a second router replica would. */
static void test_router_seed(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(30);
  kvr_level_t *lv[3];
  uint64_t seeds[3] = {1, 1, 2};
  for (int i = 0; i < 3; i++) {
    kvr_vcluster_opts_t o = small_opts(3);
    o.seed = seeds[i];
    kvr_vcluster_t *vc = cluster(&o);
    char err[256];
    assert_int_equal(kvr_vcluster_set_policy(vc, "least_load", NULL, err, sizeof(err)), 0);
    lv[i] = level_on(vc, &lo, wl, 1, 4, &loose_slo);
    assert_all_ok(lv[i], 30);
    kvr_vcluster_free(vc);
  }
  /* Ties between equally loaded workers break by a rendezvous rank of the prompt, not by the
   * seeded draw, so routers with other seeds (replicas) take the same decisions. */
  assert_true(same_records(lv[0], lv[1], 0));
  assert_true(same_records(lv[0], lv[2], 0));
  for (int i = 0; i < 3; i++)
    kvr_stats_level_free(lv[i]);
  kvr_workload_free(wl);
}

/* kv_aware keeps a conversation where its history is cached: every later turn reuses a prefix.
 * round_robin spreads the requests over every worker. */
static void test_multiturn_reuse_and_spread(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(3);
  kvr_loadgen_opts_t lo = small_lg(36);
  /* kv_aware (the default) */
  kvr_vcluster_t *vc = cluster(&o);
  assert_string_equal(kvr_vcluster_policy(vc), "kv_aware");
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 5, &loose_slo);
  assert_all_ok(lv, 36);
  size_t later = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->turn < 2)
      continue;
    later++;
    if (r->cached_tokens == 0)
      fail_msg("kv_aware: conv %llu turn %u on worker %s found nothing cached",
               (unsigned long long)r->conv, r->turn, r->worker);
  }
  assert_true(later >= 5);
  assert_true(lv->total_cached > 0);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  /* round_robin */
  vc = cluster(&o);
  char err[256];
  assert_int_equal(kvr_vcluster_set_policy(vc, "round_robin", NULL, err, sizeof(err)), 0);
  lv = level_on(vc, &lo, wl, 4, 5, &loose_slo);
  assert_all_ok(lv, 36);
  assert_int_equal(lv->nworkers, 3);
  for (size_t i = 0; i < lv->nworkers; i++)
    assert_true(lv->workers[i].count >= 36 / 3 - 1 && lv->workers[i].count <= 36 / 3 + 1);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* Unknown names are refused with the valid ones named; the oracle is accepted, reported, and
 * routes a whole level. */
static void test_policy_switch(void **state) {
  (void)state;
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_vcluster_t *vc = cluster(&o);
  char err[512] = "";
  assert_int_equal(kvr_vcluster_set_policy(vc, "no_such_policy", NULL, err, sizeof(err)),
                   KVR_EINVAL);
  assert_non_null(strstr(err, "no_such_policy"));
  assert_non_null(strstr(err, "round_robin"));
  assert_non_null(strstr(err, "kv_aware"));
  assert_non_null(strstr(err, KVR_VCLUSTER_ORACLE));
  assert_string_equal(kvr_vcluster_policy(vc), "kv_aware"); /* unchanged */
  assert_int_equal(kvr_vcluster_set_policy(vc, KVR_VCLUSTER_ORACLE, NULL, err, sizeof(err)), 0);
  assert_string_equal(kvr_vcluster_policy(vc), KVR_VCLUSTER_ORACLE);
  /* A failed switch keeps the oracle. */
  assert_int_equal(kvr_vcluster_set_policy(vc, "bogus", NULL, err, sizeof(err)), KVR_EINVAL);
  assert_string_equal(kvr_vcluster_policy(vc), KVR_VCLUSTER_ORACLE);
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(20);
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 3, &loose_slo);
  assert_all_ok(lv, 20);
  kvr_stats_level_free(lv);
  assert_int_equal(kvr_vcluster_set_policy(vc, "round_robin", NULL, err, sizeof(err)), 0);
  assert_string_equal(kvr_vcluster_policy(vc), "round_robin");
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* The same level twice: without a reset the first request finds its prompt cached, after
 * kvr_vcluster_reset_cache it does not. */
static void test_reset_cache(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(3);
  kvr_loadgen_opts_t lo = small_lg(12);
  for (int reset = 0; reset < 2; reset++) {
    kvr_vcluster_t *vc = cluster(&o);
    kvr_level_t *a = level_on(vc, &lo, wl, 4, 11, &loose_slo);
    assert_all_ok(a, 12);
    assert_int_equal(first_sent(a)->cached_tokens, 0); /* cold */
    kvr_vcluster_idle(vc, 5);
    if (reset) {
      char summary[64] = "";
      kvr_vcluster_reset_cache(vc, summary, sizeof(summary));
      assert_string_equal(summary, "3/3 workers reset");
    }
    kvr_level_t *b = level_on(vc, &lo, wl, 4, 11, &loose_slo);
    assert_all_ok(b, 12);
    const kvr_req_rec_t *x = first_sent(a), *y = first_sent(b);
    assert_int_equal(x->conv, y->conv);
    assert_int_equal(x->prompt_tokens, y->prompt_tokens);
    if (reset) {
      assert_int_equal(y->cached_tokens, 0);
      for (size_t i = 0; i < b->nrecs; i++)
        if (b->recs[i].turn == 1 && b->recs[i].sent_s == y->sent_s)
          assert_int_equal(b->recs[i].cached_tokens, 0);
    } else {
      assert_true(y->cached_tokens > 0);
    }
    kvr_stats_level_free(a);
    kvr_stats_level_free(b);
    kvr_vcluster_free(vc);
  }
  kvr_workload_free(wl);
}

/* kvr_vcluster_restart: a level run after another policy's level, on the restarted cluster,
 * gives exactly the records of the same level on a new cluster -- the runner's promise that a
 * level's verdict depends on its policy, load and seed only. The policy and its parameters
 * survive the restart; the oracle too. */
static void test_restart_is_fresh(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(3);
  kvr_loadgen_opts_t lo = small_lg(16);
  char err[256] = "";
  cJSON *params = cJSON_Parse("{\"decode_weight\": 0.5, \"prefill_gate_tokens\": 0}");
  for (int oracle = 0; oracle < 2; oracle++) {
    const char *name = oracle ? KVR_VCLUSTER_ORACLE : "kv_aware";
    kvr_vcluster_t *fresh = cluster(&o);
    assert_int_equal(kvr_vcluster_set_policy(fresh, name, params, err, sizeof(err)), 0);
    kvr_level_t *a = level_on(fresh, &lo, wl, 4, 11, &loose_slo);
    assert_all_ok(a, 16);

    kvr_vcluster_t *vc = cluster(&o);
    assert_int_equal(kvr_vcluster_set_policy(vc, "round_robin", NULL, err, sizeof(err)), 0);
    kvr_level_t *warm = level_on(vc, &lo, wl, 6, 5, &loose_slo); /* other prompts, other state */
    assert_all_ok(warm, 16);
    assert_int_equal(kvr_vcluster_set_policy(vc, name, params, err, sizeof(err)), 0);
    kvr_vcluster_idle(vc, 3);
    assert_int_equal(kvr_vcluster_restart(vc, err, sizeof(err)), 0);
    assert_string_equal(kvr_vcluster_policy(vc), name);
    assert_true(kvr_vcluster_router(vc)->index != NULL);
    kvr_level_t *b = level_on(vc, &lo, wl, 4, 11, &loose_slo);
    assert_all_ok(b, 16);
    assert_true(kvr_vcluster_now(vc) > kvr_vcluster_now(fresh)); /* the clock went on */
    /* The same decisions and tokens; times equal to the nanosecond rounding of event times
     * counted from a later origin. */
    assert_true(same_records(a, b, 1e-4));
    assert_int_equal(kvr_vcluster_restart(vc, err, sizeof(err)), 0); /* twice in a row: fine */
    kvr_stats_level_free(a);
    kvr_stats_level_free(b);
    kvr_stats_level_free(warm);
    kvr_vcluster_free(fresh);
    kvr_vcluster_free(vc);
  }
  cJSON_Delete(params);
  kvr_workload_free(wl);
}

/* A level that stops early on a tight SLO, then a normal level on the same cluster and the same
 * generator: the first level's cancelled requests and deferred calls do not disturb it. */
static void test_early_stop_then_level(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_vcluster_t *vc = cluster(&o);
  kvr_loadgen_opts_t lo = small_lg(40);
  lo.early_stop = true;
  kvr_loadgen_t *lg = vgen(vc, &lo, wl);
  kvr_slo_t tight = {1, 10000, 0}; /* TTFT p99 < 1 ms: no request makes it */
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "tight", 20, 0, 1, &tight, &lv), 0);
  assert_true(lv->stopped_early);
  assert_false(lv->pass);
  assert_false(lv->interrupted);
  assert_true(lv->ttft_over_slo >= 2);
  assert_true(lv->completed < 40);
  double t_stop = kvr_vcluster_now(vc);
  kvr_stats_level_free(lv);
  /* The same generator, the same cluster: a full level at a loose SLO. */
  lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "loose", 4, 0, 2, &loose_slo, &lv), 0);
  assert_all_ok(lv, 40);
  assert_true(lv->pass);
  assert_true(kvr_vcluster_now(vc) > t_stop);
  kvr_stats_level_free(lv);
  /* And a third, after idle time, with a fresh generator. */
  kvr_vcluster_idle(vc, 2);
  lv = level_on(vc, &lo, wl, 4, 3, &loose_slo);
  assert_all_ok(lv, 40);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* A closed-loop level in virtual time: steady state, every measured request completes, the
 * cool-down ones still in flight are cancelled, and a rate level on the same generator follows. */
static void test_concurrency_level(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_vcluster_t *vc = cluster(&o);
  kvr_loadgen_opts_t lo = small_lg(20);
  kvr_loadgen_t *lg = vgen(vc, &lo, wl);
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "users", 0, 6, 1, &loose_slo, &lv), 0);
  assert_true(lv->steady_state);
  assert_int_equal(lv->concurrency, 6);
  assert_int_equal(lv->measured, 20);
  assert_int_equal(lv->completed, 20);
  assert_int_equal(lv->failed, 0);
  assert_true(lv->warmup_requests >= 6); /* each user's first */
  assert_true(lv->max_concurrent <= 6);
  size_t users[6] = {0};
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    assert_true(r->user >= 0 && r->user < 6);
    users[r->user]++;
    if (!r->warmup)
      assert_true(r->ok);
  }
  for (size_t u = 0; u < 6; u++)
    assert_true(users[u] > 0);
  kvr_stats_level_free(lv);
  assert_int_equal(kvr_loadgen_run_level(lg, "rate", 4, 0, 2, &loose_slo, &lv), 0);
  assert_all_ok(lv, 20);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* The delays of a deployment add up hop by hop: an isolated request's first token crosses
 * client->router, router->worker (after the router's own time), worker->router and
 * router->client, so TTFT and E2E grow by exactly 4 net_ms + router_ms. */
static void test_network_delays(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(4);
  kvr_level_t *lv[2];
  for (int i = 0; i < 2; i++) {
    kvr_vcluster_opts_t o = small_opts(2);
    o.net_ms = i ? 10 : 0;
    o.router_ms = i ? 5 : 0;
    kvr_vcluster_t *vc = cluster(&o);
    lv[i] = level_on(vc, &lo, wl, 0.01, 1, &loose_slo); /* ~100 s apart: nothing overlaps */
    assert_all_ok(lv[i], 4);
    kvr_vcluster_free(vc);
  }
  assert_int_equal(lv[0]->nrecs, lv[1]->nrecs);
  for (size_t i = 0; i < lv[0]->nrecs; i++) {
    const kvr_req_rec_t *a = &lv[0]->recs[i], *b = &lv[1]->recs[i];
    assert_int_equal(a->conv, b->conv);
    assert_int_equal(a->turn, b->turn);
    assert_true(a->sent_s == b->sent_s);
    assert_int_equal(a->cached_tokens, b->cached_tokens);
    if (fabs(b->ttft_ms - a->ttft_ms - 45) > 1e-3 || fabs(b->e2e_ms - a->e2e_ms - 45) > 1e-3)
      fail_msg("request %zu: TTFT %.6f -> %.6f ms, E2E %.6f -> %.6f ms: want +45 ms each", i,
               a->ttft_ms, b->ttft_ms, a->e2e_ms, b->e2e_ms);
  }
  kvr_stats_level_free(lv[0]);
  kvr_stats_level_free(lv[1]);
  kvr_workload_free(wl);
}

/* With no network or router delay, the first request of a level on an idle cluster sees exactly
 * the engine alone: its TTFT and E2E are when the engine's steps deliver its first and last
 * tokens (the same body parsed as the worker parses it, the same engine configuration). */
static void test_matches_engine_alone(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  o.net_ms = o.router_ms = 0;
  kvr_vcluster_t *vc = cluster(&o);
  kvr_loadgen_opts_t lo = small_lg(1);
  kvr_level_t *lv = level_on(vc, &lo, wl, 1, 77, &loose_slo);
  assert_all_ok(lv, 1);
  const kvr_req_rec_t *rec = &lv->recs[0];
  assert_int_equal(rec->conv, 0);
  assert_true(rec->sent_s == 0);
  /* The same request to a lone engine. */
  kvr_conv_t conv;
  kvr_workload_conv(wl, 77, 0, &conv);
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_workload_body(&conv, 0, NULL, "test-model", KVR_API_CHAT, true, &body);
  cJSON *j = cJSON_Parse(body.data);
  kvr_sim_completion_t p;
  char err[256];
  assert_int_equal(kvr_sim_server_parse_completion(j, true, "test-model", o.engine.max_model_len,
                                                   &p, err, sizeof(err)),
                   0);
  assert_int_equal(p.prompt.n, rec->prompt_tokens);
  kvr_sim_engine_t *eng = kvr_sim_engine_new(&o.engine);
  kvr_sim_engine_set_now(eng, 0);
  kvr_sim_req_t *q =
      kvr_sim_engine_add(eng, p.prompt.v, (uint32_t)p.prompt.n, 16, KVR_SIM_FINISH_LENGTH, 1, NULL);
  double first = -1, last = -1;
  kvr_sim_step_t st;
  for (int i = 0; i < 10000 && q->state != KVR_SIM_FINISHED; i++) {
    kvr_sim_engine_step(eng, &st);
    for (size_t k = 0; k < st.nevents; k++)
      if (st.events[k].req == q && st.events[k].new_tokens > 0) {
        if (first < 0)
          first = st.deliver_s;
        last = st.deliver_s;
      }
  }
  assert_true(first > 0 && last > first);
  if (fabs(rec->ttft_ms - first * 1e3) > 1e-3 || fabs(rec->e2e_ms - last * 1e3) > 1e-3)
    fail_msg("virtual TTFT %.6f E2E %.6f ms, engine alone %.6f %.6f ms", rec->ttft_ms, rec->e2e_ms,
             first * 1e3, last * 1e3);
  kvr_sim_engine_remove(eng, q);
  kvr_sim_engine_free(eng);
  kvr_sim_toks_free(&p.prompt);
  cJSON_Delete(j);
  kvr_buf_free(&body);
  kvr_workload_conv_free(&conv);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* The router's accounting closes after every kind of level end (whole, stopped early with
 * requests cancelled in flight, interrupted), seen from routing: with least_load every worker
 * with inflight 0 and the fewest active tokens ties and is picked at random, so a worker whose
 * in-flight count or active tokens leaked would never be picked again. (A direct check of
 * inflight, active_tokens and queued_prefill_tokens needs an accessor for the cluster's router.)
 */
static void test_accounting_closes(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(3);
  kvr_vcluster_t *vc = cluster(&o);
  kvr_loadgen_opts_t lo = small_lg(40);
  lo.early_stop = true;
  kvr_loadgen_t *lg = vgen(vc, &lo, wl);
  kvr_slo_t tight = {1, 10000, 0};
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "stop", 40, 0, 1, &tight, &lv), 0);
  assert_true(lv->stopped_early);
  assert_true(lv->cancelled_requests > 0); /* requests cut at every stage of their life */
  kvr_stats_level_free(lv);
  assert_int_equal(kvr_loadgen_run_level(lg, "whole", 8, 0, 2, &loose_slo, &lv), 0);
  assert_all_ok(lv, 40);
  kvr_stats_level_free(lv);
  kvr_vcluster_idle(vc, 10); /* the cancelled requests' aborts reach the workers */
  char err[256];
  assert_int_equal(kvr_vcluster_set_policy(vc, "least_load", NULL, err, sizeof(err)), 0);
  /* Requests one at a time (~0.5 s each, 5 s apart on average). */
  kvr_level_t *seq = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "seq", 0.2, 0, 3, &loose_slo, &seq), 0);
  assert_int_equal(seq->completed, 40);
  assert_int_equal(seq->nworkers, 3);
  for (size_t i = 0; i < seq->nworkers; i++)
    if (seq->workers[i].count < 4)
      fail_msg("least_load sent worker %s only %zu of 40 requests: its load did not return to 0",
               seq->workers[i].name, seq->workers[i].count);
  kvr_stats_level_free(seq);
  kvr_loadgen_free(lg);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* A generator freed after a level that stopped early, then the cluster runs on (idle time, a
 * level with another generator): the first generator's deferred calls still in the event heap
 * must not reach it. */
static void test_generator_freed_before_cluster(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_vcluster_t *vc = cluster(&o);
  kvr_loadgen_opts_t lo = small_lg(40);
  lo.early_stop = true;
  kvr_slo_t tight = {1, 10000, 0};
  kvr_level_t *lv = level_on(vc, &lo, wl, 20, 1, &tight); /* its generator is freed */
  assert_true(lv->stopped_early);
  kvr_stats_level_free(lv);
  kvr_vcluster_idle(vc, 30);
  lo.early_stop = false;
  lv = level_on(vc, &lo, wl, 4, 2, &loose_slo);
  assert_all_ok(lv, 40);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* A mixed fleet: one blocks value per worker, else an error naming the flag. */
/* Precise mode: the engines' KV events reach the router's precise index (through the real
 * encoder and decoder), every decision with a prompt is taken on it, and the router's prediction
 * of cached tokens equals what the engines report; a worker flushed behind the router's back is
 * seen as empty by the precise index once its clear arrives, while the approximate index still
 * believes it holds its blocks. */
static void test_precise_mode(void **state) {
  (void)state;
  kvr_vcluster_opts_t o = small_opts(3);
  o.kv_events = true;
  kvr_vcluster_t *vc = cluster(&o);
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(24);
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 1, &loose_slo);
  assert_all_ok(lv, 24);
  kvr_stats_level_free(lv);
  const kvr_router_t *r = kvr_vcluster_router(vc);
  assert_int_equal(r->kv_routed_approx, 0);
  assert_true(r->kv_routed_precise >= 24);
  uint64_t pred = 0, act = 0, blocks = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    pred += r->slots[i]->usage_predicted_cached_total;
    act += r->slots[i]->usage_cached_tokens_total;
    blocks += kvr_kv_index_blocks(r->kv_index, i);
  }
  assert_true(act > 0 && blocks > 0);
  if (pred != act)
    fail_msg("precise prediction %llu cached tokens, engines reported %llu",
             (unsigned long long)pred, (unsigned long long)act);
  /* flush worker 0 behind the router's back; its clear rides its next step */
  size_t held = kvr_kv_index_blocks(r->kv_index, 0);
  assert_true(held > 0);
  kvr_vcluster_flush_worker(vc, 0);
  lv = level_on(vc, &lo, wl, 4, 2, &loose_slo);
  assert_all_ok(lv, 24);
  kvr_stats_level_free(lv);
  assert_true(kvr_kv_index_stats(r->kv_index, 0)->clears >= 1);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

static void test_mixed_fleet(void **state) {
  (void)state;
  kvr_vcluster_opts_t o = small_opts(3);
  o.worker_blocks[0] = 1000;
  o.worker_blocks[1] = 2000;
  o.nworker_blocks = 2;
  char err[256] = "";
  assert_null(kvr_vcluster_new(&o, err, sizeof(err)));
  assert_string_equal(err, "--worker-blocks: 2 values for 3 workers (give one per worker)");
  o.worker_blocks[2] = 3000;
  o.nworker_blocks = 3;
  kvr_vcluster_t *vc = cluster(&o);
  kvr_buf_t d = KVR_BUF_INIT;
  kvr_vcluster_describe(vc, &d);
  assert_non_null(strstr(d.data, "3 workers"));
  assert_non_null(strstr(d.data, "(KV blocks 1000/2000/3000)"));
  assert_non_null(strstr(d.data, "scrape every 200 ms (stale after 1000 ms)"));
  kvr_buf_free(&d);
  /* A level runs on it. */
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(12);
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 1, &loose_slo);
  assert_all_ok(lv, 12);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
  /* Other option checks. */
  o = small_opts(0);
  assert_null(kvr_vcluster_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--workers"));
  o = small_opts(2);
  o.net_ms = -1;
  assert_null(kvr_vcluster_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--net-ms"));
  o = small_opts(2);
  o.engine.block_size = 0;
  assert_null(kvr_vcluster_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "block_size"));
  kvr_vcluster_free(NULL);
}

/* A prompt + max_tokens beyond the engine's max_model_len: the worker answers 400 and the client
 * records a failed request with that status (first turns take ~270-320 tokens, later turns outgrow
 * a 360-token context). */
static void check_context_overflow(const char *policy) {
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  o.engine.max_model_len = 360;
  kvr_vcluster_t *vc = cluster(&o);
  char err[256];
  assert_int_equal(kvr_vcluster_set_policy(vc, policy, NULL, err, sizeof(err)), 0);
  kvr_loadgen_opts_t lo = small_lg(24);
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 21, &loose_slo);
  size_t bad = 0, ok = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->ok) {
      ok++;
      assert_true(r->prompt_tokens + 16 <= 360);
      continue;
    }
    bad++;
    if (r->status != 400 || strncmp(r->error, "HTTP 400", 8) != 0)
      fail_msg("%s: conv %llu turn %u: status %d error '%s', want HTTP 400", policy,
               (unsigned long long)r->conv, r->turn, r->status, r->error);
    assert_true(r->ttft_ms < 0);
    assert_int_equal(r->chunks, 0);
  }
  assert_true(ok > 0);
  assert_true(bad > 0);
  assert_int_equal(lv->failed + lv->completed, lv->measured);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

static void test_bad_body_is_400(void **state) {
  (void)state;
  check_context_overflow("kv_aware");
  check_context_overflow("round_robin");
  check_context_overflow(KVR_VCLUSTER_ORACLE);
}

/* kvr_vcluster_idle moves the clock by exactly the given time, idle or with requests in flight. */
static void test_idle_advances_clock(void **state) {
  (void)state;
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_vcluster_t *vc = cluster(&o);
  assert_true(kvr_vcluster_now(vc) == 0);
  kvr_vcluster_idle(vc, 1.5);
  assert_true(kvr_vcluster_now(vc) == 1.5);
  uint64_t ev = kvr_vcluster_events(vc);
  assert_true(ev >= 7); /* the scrapes at 0, 0.2, ..., 1.4 s ran (scrape every 200 ms) */
  kvr_vcluster_idle(vc, 0.25);
  assert_true(fabs(kvr_vcluster_now(vc) - 1.75) < 1e-12);
  kvr_vcluster_idle(vc, 0);
  assert_true(fabs(kvr_vcluster_now(vc) - 1.75) < 1e-12);
  /* After a level (its clock somewhere past the last completion). */
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(10);
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 1, &loose_slo);
  assert_all_ok(lv, 10);
  double t = kvr_vcluster_now(vc);
  kvr_vcluster_idle(vc, 30);
  assert_true(fabs(kvr_vcluster_now(vc) - (t + 30)) < 1e-9);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* level_begin/level_end: the workers read, the preemptions of the level only, the KV peak. */
static void test_level_figures(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_loadgen_opts_t lo = small_lg(24);
  /* A roomy cache: no preemption, a small peak. */
  kvr_vcluster_opts_t o = small_opts(3);
  kvr_vcluster_t *vc = cluster(&o);
  kvr_vcluster_level_begin(vc);
  kvr_level_t *lv = level_on(vc, &lo, wl, 4, 1, &loose_slo);
  kvr_vcluster_level_end(vc, lv);
  assert_all_ok(lv, 24);
  assert_int_equal(lv->engine_workers, 3);
  assert_int_equal(lv->preemptions, 0);
  assert_true(lv->kv_usage_peak > 0 && lv->kv_usage_peak < 0.5);
  kvr_vcluster_level_end(vc, NULL); /* accepted */
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  /* One worker with a cache of a few prompts under a burst: preemptions, a high peak. */
  o = small_opts(1);
  o.engine.num_gpu_blocks = 64; /* 1024 tokens: ~3 prompts */
  vc = cluster(&o);
  kvr_vcluster_level_begin(vc);
  lv = level_on(vc, &lo, wl, 200, 1, &loose_slo);
  kvr_vcluster_level_end(vc, lv);
  assert_int_equal(lv->engine_workers, 1);
  assert_true(lv->preemptions > 0);
  assert_true(lv->kv_usage_peak > 0.8 && lv->kv_usage_peak <= 1.0);
  uint64_t first = lv->preemptions;
  kvr_stats_level_free(lv);
  /* The next level counts its own preemptions only, and a level without load has none. */
  kvr_vcluster_level_begin(vc);
  kvr_vcluster_idle(vc, 1);
  kvr_level_t empty = {0};
  kvr_vcluster_level_end(vc, &empty);
  assert_int_equal(empty.preemptions, 0);
  assert_true(empty.kv_usage_peak == 0);
  (void)first;
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* Freeing a cluster with requests in flight (a level interrupted from a deferred call). */
static kvr_loadgen_t *interrupt_target;
static void interrupt_soon(void *arg, uint64_t tag) {
  (void)arg;
  (void)tag;
  kvr_loadgen_interrupt(interrupt_target);
}

static void test_interrupt_and_free_in_flight(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_vcluster_t *vc = cluster(&o);
  kvr_loadgen_opts_t lo = small_lg(40);
  kvr_loadgen_t *lg = vgen(vc, &lo, wl);
  interrupt_target = lg;
  kvr_loadgen_vt_t vt;
  kvr_vcluster_transport(vc, &vt);
  vt.at(vt.ctx, 3000000000ull, interrupt_soon, NULL, 0); /* 3 s into the level */
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "int", 8, 0, 1, &loose_slo, &lv), 0);
  assert_true(lv->interrupted);
  assert_true(lv->completed < 40);
  assert_true(kvr_loadgen_interrupted(lg));
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  kvr_vcluster_free(vc); /* cancelled requests' events still in the heap */
  kvr_workload_free(wl);
}

/* ---- the load generator's virtual path on a hand-made transport ------------------------------ */

/* A fake transport: an event list on a ns clock. A send answers with the configured status; a
 * 200 answer streams 3 tokens 100, 110 and 120 ms after the send, then usage and done. */
typedef struct fake_ev_s {
  uint64_t t, seq;
  void (*fn)(void *arg, uint64_t tag); /* a timer, else a response step */
  void *arg;
  uint64_t tag;
  int req; /* response: the request slot */
  int step;
} fake_ev_t;

typedef struct fake_req_s {
  kvr_loadgen_req_t *r;
  bool cancelled, done;
  char *body; /* kept with resp_ids */
} fake_req_t;

typedef struct fake_s {
  uint64_t now, seq;
  fake_ev_t ev[4096];
  size_t nev;
  fake_req_t reqs[256];
  size_t nreqs;
  bool stopped;
  int status;     /* answer status */
  bool refuse;    /* send returns NULL */
  size_t cancels; /* cancel calls */
  bool resp_ids;  /* Responses: each answer's head names "resp_fake<request slot>"; bodies kept */
  bool no_ids;    /* Responses: answers name no id */
} fake_t;

static uint64_t fake_now(void *ctx) {
  return ((fake_t *)ctx)->now;
}

static void fake_push(fake_t *f, fake_ev_t e) {
  assert_true(f->nev < KVR_ARRAY_SIZE(f->ev));
  e.t = KVR_MAX(e.t, f->now);
  e.seq = f->seq++;
  f->ev[f->nev++] = e;
}

static void fake_at(void *ctx, uint64_t t, void (*fn)(void *, uint64_t), void *arg, uint64_t tag) {
  fake_t *f = ctx;
  assert_true(t >= f->now); /* never in the past */
  fake_push(f, (fake_ev_t){.t = t, .fn = fn, .arg = arg, .tag = tag, .req = -1});
}

static void *fake_send(void *ctx, kvr_loadgen_req_t *r, const char *body, size_t len) {
  fake_t *f = ctx;
  assert_non_null(body);
  assert_true(len > 0 && body[0] == '{');
  assert_non_null(memmem(body, len, "\"stream\":true", 13));
  if (f->refuse)
    return NULL;
  assert_true(f->nreqs < KVR_ARRAY_SIZE(f->reqs));
  size_t i = f->nreqs++;
  f->reqs[i] = (fake_req_t){.r = r};
  if (f->resp_ids || f->no_ids) {
    f->reqs[i].body = malloc(len + 1);
    memcpy(f->reqs[i].body, body, len);
    f->reqs[i].body[len] = '\0';
  }
  fake_push(f, (fake_ev_t){.t = f->now + 10000000u, .req = (int)i, .step = 0});
  return &f->reqs[i];
}

static void fake_cancel(void *ctx, void *handle) {
  fake_t *f = ctx;
  fake_req_t *q = handle;
  assert_false(q->done);
  assert_false(q->cancelled);
  q->cancelled = true;
  f->cancels++;
}

static void fake_step(fake_t *f, fake_ev_t *e) {
  fake_req_t *q = &f->reqs[e->req];
  if (q->cancelled)
    return;
  assert_false(q->done);
  if (e->step == 0) {
    kvr_loadgen_vt_head(q->r, f->status, f->status == 200 ? "w7" : NULL);
    if (f->status != 200) {
      q->done = true;
      kvr_loadgen_vt_done(q->r, NULL);
      return;
    }
    if (f->resp_ids) {
      char id[32];
      snprintf(id, sizeof(id), "resp_fake%04d", e->req);
      kvr_loadgen_vt_response_id(q->r, id);
    }
    fake_push(f, (fake_ev_t){.t = f->now + 90000000u, .req = e->req, .step = 1});
    return;
  }
  kvr_loadgen_vt_token(q->r, "tok ", 4);
  if (e->step < 3) {
    fake_push(f, (fake_ev_t){.t = f->now + 10000000u, .req = e->req, .step = e->step + 1});
    return;
  }
  kvr_loadgen_vt_usage(q->r, 123, 3, 45);
  q->done = true;
  kvr_loadgen_vt_done(q->r, NULL);
}

static void fake_run(void *ctx) {
  fake_t *f = ctx;
  f->stopped = false;
  while (!f->stopped && f->nev > 0) {
    size_t best = 0;
    for (size_t i = 1; i < f->nev; i++)
      if (f->ev[i].t < f->ev[best].t ||
          (f->ev[i].t == f->ev[best].t && f->ev[i].seq < f->ev[best].seq))
        best = i;
    fake_ev_t e = f->ev[best];
    f->ev[best] = f->ev[--f->nev];
    f->now = e.t;
    if (e.fn != NULL)
      e.fn(e.arg, e.tag);
    else
      fake_step(f, &e);
  }
}

static void fake_stop(void *ctx) {
  ((fake_t *)ctx)->stopped = true;
}

static kvr_loadgen_vt_t fake_vt(fake_t *f) {
  return (kvr_loadgen_vt_t){.ctx = f,
                            .now_ns = fake_now,
                            .at = fake_at,
                            .send = fake_send,
                            .cancel = fake_cancel,
                            .run = fake_run,
                            .stop = fake_stop};
}

static kvr_loadgen_t *fake_gen_opts(fake_t *f, const kvr_workload_t *wl,
                                    const kvr_loadgen_opts_t *lo) {
  kvr_loadgen_vt_t vt = fake_vt(f);
  char err[256] = "";
  kvr_loadgen_t *lg = kvr_loadgen_new_virtual(lo, wl, &vt, err, sizeof(err));
  if (lg == NULL)
    fail_msg("%s", err);
  return lg;
}

static kvr_loadgen_t *fake_gen(fake_t *f, const kvr_workload_t *wl, size_t n) {
  kvr_loadgen_opts_t lo = small_lg(n);
  return fake_gen_opts(f, wl, &lo);
}

/* Every figure is virtual time, exactly: TTFT 100 ms, E2E 120 ms, TPOT 10 ms, no lag. */
static void test_vt_exact_times(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  fake_t *f = calloc(1, sizeof(*f));
  f->status = 200;
  f->now = 5000000000ull; /* the clock need not start at 0 */
  kvr_loadgen_t *lg = fake_gen(f, wl, 8);
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 2, 0, 1, &loose_slo, &lv), 0);
  assert_int_equal(lv->measured, 8);
  assert_int_equal(lv->completed, 8);
  assert_int_equal(f->nreqs, 8);
  assert_int_equal(f->cancels, 0);
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    assert_true(r->ok);
    assert_int_equal(r->status, 200);
    assert_string_equal(r->worker, "w7");
    assert_true(fabs(r->ttft_ms - 100) < 1e-9);
    assert_true(fabs(r->e2e_ms - 120) < 1e-9);
    assert_true(fabs(r->tpot_ms - 10) < 1e-9);
    assert_true(r->lag_ms == 0);
    assert_true(r->sent_s == r->target_s);
    assert_int_equal(r->n_itl, 2);
    assert_true(fabs(r->itl_max_ms - 10) < 1e-9);
    assert_int_equal(r->chunks, 3);
    assert_int_equal(r->output_tokens, 3); /* usage wins */
    assert_int_equal(r->prompt_tokens, 123);
    assert_int_equal(r->cached_tokens, 45);
    assert_true(r->transport_ms < 0);
  }
  assert_true(lv->pass);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  free(f);
  kvr_workload_free(wl);
}

/* The send times of a level's records, warm-up or measured, sorted. */
static size_t send_times(const kvr_level_t *lv, bool warmup, double *t) {
  size_t n = 0;
  for (size_t i = 0; i < lv->nrecs; i++)
    if (lv->recs[i].warmup == warmup)
      t[n++] = lv->recs[i].target_s;
  kvr_quantile_sort(t, n);
  return n;
}

/* --arrival-seed: the measured sends follow vllm bench serve's schedule for that seed, whatever
 * the level seed, one schedule gap after the last warm-up send; the warm-up keeps its own gaps. */
static void test_vt_arrival_seed(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  double want[12], got[16], warm[4];
  kvr_np_vllm_schedule(0, 3.0, 1.0, 12, want);
  for (unsigned warmup = 0; warmup <= 3; warmup += 3) {
    for (uint64_t seed = 1; seed <= 2; seed++) {
      fake_t *f = calloc(1, sizeof(*f));
      f->status = 200;
      kvr_loadgen_opts_t lo = small_lg(12);
      lo.arrival_seed = 0;
      lo.warmup = warmup;
      kvr_loadgen_t *lg = fake_gen_opts(f, wl, &lo);
      kvr_level_t *lv = NULL;
      assert_int_equal(kvr_loadgen_run_level(lg, "fake", 3, 0, seed, &loose_slo, &lv), 0);
      assert_int_equal(lv->measured, 12);
      assert_int_equal(send_times(lv, false, got), 12);
      assert_int_equal(send_times(lv, true, warm), warmup);
      double base = warmup ? warm[warmup - 1] : 0;
      for (size_t i = 0; i < 12; i++)
        if (fabs(got[i] - (base + want[i])) > 1e-6)
          fail_msg("warm-up %u seed %llu: send %zu at %.9f s, schedule %.9f s", warmup,
                   (unsigned long long)seed, i, got[i], base + want[i]);
      kvr_stats_level_free(lv);
      kvr_loadgen_free(lg);
      free(f);
    }
  }
  kvr_workload_free(wl);
}

/* An error status is a failed record naming it; a refused send a failed record too. */
static void test_vt_errors(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  fake_t *f = calloc(1, sizeof(*f));
  f->status = 400;
  kvr_loadgen_t *lg = fake_gen(f, wl, 6);
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 2, 0, 1, &loose_slo, &lv), 0);
  assert_true(lv->nrecs > 0);
  assert_int_equal(lv->completed, 0);
  assert_int_equal(lv->failed, lv->measured);
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    assert_false(r->ok);
    assert_int_equal(r->status, 400);
    assert_int_equal(strncmp(r->error, "HTTP 400", 8), 0);
    assert_true(r->ttft_ms < 0);
    assert_true(fabs(r->e2e_ms - 10) < 1e-9); /* the head came 10 ms after the send */
  }
  assert_false(lv->pass);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  memset(f, 0, sizeof(*f));
  f->refuse = true;
  lg = fake_gen(f, wl, 4);
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 2, 0, 1, &loose_slo, &lv), 0);
  assert_true(lv->nrecs > 0);
  assert_int_equal(lv->completed, 0);
  for (size_t i = 0; i < lv->nrecs; i++)
    assert_string_equal(lv->recs[i].error, "the virtual cluster refused the request");
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  free(f);
  kvr_workload_free(wl);
}

/* Early stop through the fake transport: the in-flight requests are cancelled exactly once, and
 * the next level on the same generator runs whole. */
static void test_vt_early_stop_cancels(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  fake_t *f = calloc(1, sizeof(*f));
  f->status = 200;
  kvr_loadgen_opts_t lo = small_lg(40);
  lo.early_stop = true;
  kvr_loadgen_vt_t vt = fake_vt(f);
  char err[256];
  kvr_loadgen_t *lg = kvr_loadgen_new_virtual(&lo, wl, &vt, err, sizeof(err));
  assert_non_null(lg);
  kvr_slo_t tight = {50, 10000, 0}; /* every TTFT is 100 ms */
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 100, 0, 1, &tight, &lv), 0);
  assert_true(lv->stopped_early);
  assert_true(lv->cancelled_requests > 0);
  assert_int_equal(f->cancels, lv->cancelled_requests);
  assert_true(lv->nrecs + lv->cancelled_requests == f->nreqs);
  kvr_stats_level_free(lv);
  size_t before = f->nreqs;
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 100, 0, 2, &loose_slo, &lv), 0);
  assert_false(lv->stopped_early);
  assert_int_equal(lv->completed, 40);
  assert_int_equal(f->nreqs - before, 40);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  free(f);
  kvr_workload_free(wl);
}

/* A small agentic workload for the Responses API: 2 system prompts of 200-300 tokens, 3-4 turns
 * of 50-100-token tool outputs, 16-token answers. */
static kvr_workload_t *responses_workload(void) {
  kvr_workload_opts_t w;
  kvr_workload_opts_default(&w);
  w.kind = KVR_WL_AGENTIC;
  w.api = KVR_API_RESPONSES;
  w.starters = 2;
  w.prefix_min_tokens = 200;
  w.prefix_max_tokens = 300;
  w.agentic_turns_min = 3;
  w.agentic_turns_max = 4;
  w.tool_min_tokens = 50;
  w.tool_max_tokens = 100;
  w.agentic_max_context = 8000;
  w.out_mean = 16;
  w.out_std = 0;
  w.out_min = 16;
  w.out_max = 16;
  w.think_mean_s = 0.2;
  w.seed = 7;
  char err[256] = "";
  kvr_workload_t *wl = kvr_workload_new(&w, err, sizeof(err));
  if (wl == NULL)
    fail_msg("workload: %s", err);
  return wl;
}

/* The record of (conv, turn) in lv, or NULL. */
static const kvr_req_rec_t *rec_of(const kvr_level_t *lv, uint64_t conv, uint32_t turn) {
  for (size_t i = 0; i < lv->nrecs; i++)
    if (lv->recs[i].conv == conv && lv->recs[i].turn == turn)
      return &lv->recs[i];
  return NULL;
}

/* The load generator threads the chain: turn 1 of a conversation names no previous response,
 * every later turn names the id the transport gave its previous turn's answer (request slot =
 * send order = the record's seq), and sends only its new message with store true. An answer
 * naming no id fails (the next turn could not name it) and its conversation goes no further. */
static void test_vt_responses_ids(void **state) {
  (void)state;
  kvr_workload_t *wl = responses_workload();
  fake_t *f = calloc(1, sizeof(*f));
  f->status = 200;
  f->resp_ids = true;
  kvr_loadgen_opts_t lo = small_lg(24);
  lo.api = KVR_API_RESPONSES;
  kvr_loadgen_t *lg = fake_gen_opts(f, wl, &lo);
  kvr_level_t *lv = NULL;
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 2, 0, 1, &loose_slo, &lv), 0);
  assert_int_equal(lv->failed, 0);
  size_t chained = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    const char *body = f->reqs[r->seq].body;
    assert_non_null(strstr(body, "\"store\":true"));
    assert_null(strstr(body, "\"messages\""));
    if (r->turn == 1) {
      assert_null(strstr(body, "previous_response_id"));
      assert_non_null(strstr(body, "Agent system prompt")); /* the prefix opens turn 1's input */
      continue;
    }
    const kvr_req_rec_t *prev = rec_of(lv, r->conv, r->turn - 1);
    assert_non_null(prev);
    char want[64];
    snprintf(want, sizeof(want), "\"previous_response_id\":\"resp_fake%04zu\"", prev->seq);
    if (strstr(body, want) == NULL)
      fail_msg("conv %llu turn %u: %s not in %.200s", (unsigned long long)r->conv, r->turn, want,
               body);
    assert_null(strstr(body, "Agent system prompt")); /* the history is the server's */
    chained++;
  }
  assert_true(chained >= 8);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  for (size_t i = 0; i < f->nreqs; i++)
    free(f->reqs[i].body);
  memset(f, 0, sizeof(*f));
  f->status = 200;
  f->no_ids = true;
  lg = fake_gen_opts(f, wl, &lo);
  assert_int_equal(kvr_loadgen_run_level(lg, "fake", 2, 0, 1, &loose_slo, &lv), 0);
  assert_int_equal(lv->completed, 0);
  for (size_t i = 0; i < lv->nrecs; i++) {
    assert_int_equal(lv->recs[i].turn, 1); /* no chain goes past a turn without an id */
    assert_string_equal(lv->recs[i].error, "the Responses answer named no response id");
  }
  assert_false(lv->pass);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  for (size_t i = 0; i < f->nreqs; i++)
    free(f->reqs[i].body);
  free(f);
  kvr_workload_free(wl);
}

/* Responses chains on the cluster, with the router pinning previous_response_id (proxy.c) under
 * round_robin, kv_aware and the oracle: every request completes, every follow-up runs on the
 * worker of its conversation's first turn and finds the previous prompt cached there (all but
 * its last partial block); the same run again gives the same records. */
static void test_responses_pinned(void **state) {
  (void)state;
  kvr_workload_t *wl = responses_workload();
  kvr_vcluster_opts_t o = small_opts(3);
  o.responses = true;
  kvr_loadgen_opts_t lo = small_lg(30);
  lo.api = KVR_API_RESPONSES;
  const char *policies[] = {"round_robin", "kv_aware", KVR_VCLUSTER_ORACLE, "round_robin"};
  kvr_level_t *lv[4];
  for (int k = 0; k < 4; k++) {
    kvr_vcluster_t *vc = cluster(&o);
    char err[256];
    assert_int_equal(kvr_vcluster_set_policy(vc, policies[k], NULL, err, sizeof(err)), 0);
    lv[k] = level_on(vc, &lo, wl, 3, 11, &loose_slo);
    assert_all_ok(lv[k], 30);
    size_t follow = 0;
    for (size_t i = 0; i < lv[k]->nrecs; i++) {
      const kvr_req_rec_t *r = &lv[k]->recs[i];
      if (r->turn == 1)
        continue;
      const kvr_req_rec_t *first = rec_of(lv[k], r->conv, 1);
      const kvr_req_rec_t *prev = rec_of(lv[k], r->conv, r->turn - 1);
      assert_non_null(first);
      assert_non_null(prev);
      assert_string_equal(r->worker, first->worker);
      assert_true(r->prompt_tokens > prev->prompt_tokens + prev->output_tokens);
      if (r->cached_tokens + o.engine.block_size <= prev->prompt_tokens)
        fail_msg("%s: conv %llu turn %u cached %u of the previous prompt's %u", policies[k],
                 (unsigned long long)r->conv, r->turn, r->cached_tokens, prev->prompt_tokens);
      follow++;
    }
    assert_true(follow >= 10);
    kvr_vcluster_free(vc);
  }
  assert_true(same_records(lv[0], lv[3], 0));
  for (int k = 0; k < 4; k++)
    kvr_stats_level_free(lv[k]);
  kvr_workload_free(wl);
}

/* Without the pinning (no_response_affinity), round_robin sends follow-ups to workers whose
 * store lacks the previous response: vLLM's 404, a failed request that fails the level and ends
 * its conversation; a follow-up that happens to land on the right worker completes and reuses
 * the cache as a pinned one does. */
static void test_responses_unpinned_404(void **state) {
  (void)state;
  kvr_workload_t *wl = responses_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  o.responses = true;
  o.no_response_affinity = true;
  kvr_loadgen_opts_t lo = small_lg(30);
  lo.api = KVR_API_RESPONSES;
  kvr_vcluster_t *vc = cluster(&o);
  char err[256];
  assert_int_equal(kvr_vcluster_set_policy(vc, "round_robin", NULL, err, sizeof(err)), 0);
  const kvr_slo_t no_failures = {60000, 10000, 0}; /* loose times, no failed request allowed */
  kvr_level_t *lv = level_on(vc, &lo, wl, 3, 11, &no_failures);
  size_t missing = 0, right = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->turn == 1) {
      assert_true(r->ok);
      continue;
    }
    const kvr_req_rec_t *first = rec_of(lv, r->conv, 1);
    const kvr_req_rec_t *prev = rec_of(lv, r->conv, r->turn - 1);
    assert_true(prev->ok); /* a conversation stops at its first failure */
    if (r->status == 404) {
      assert_false(r->ok);
      assert_int_equal(strncmp(r->error, "HTTP 404", 8), 0);
      missing++;
      continue;
    }
    assert_true(r->ok);
    assert_string_equal(r->worker, first->worker); /* only its store holds the history */
    assert_true(r->cached_tokens + o.engine.block_size > prev->prompt_tokens);
    right++;
  }
  assert_true(missing >= 3);
  assert_true(right >= 1);
  assert_true(lv->failed > 0);
  assert_false(lv->pass);
  kvr_stats_level_free(lv);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* A transport missing a callback is refused with a reason. */
static void test_vt_new_checks(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  fake_t f = {0};
  kvr_loadgen_opts_t lo = small_lg(4);
  char err[256] = "";
  kvr_loadgen_vt_t vt = fake_vt(&f);
  vt.cancel = NULL;
  assert_null(kvr_loadgen_new_virtual(&lo, wl, &vt, err, sizeof(err)));
  assert_non_null(strstr(err, "transport"));
  assert_null(kvr_loadgen_new_virtual(&lo, wl, NULL, err, sizeof(err)));
  vt = fake_vt(&f);
  lo.num_prompts = 0;
  assert_null(kvr_loadgen_new_virtual(&lo, wl, &vt, err, sizeof(err)));
  kvr_workload_free(wl);
}

/* ---- fleet sizing ---------------------------------------------------------------------------- */

/* kvr_vcluster_set_workers: the next restart makes the new fleet, which routes as a fresh cluster
 * of that size does (the same records); the cluster runs on as it is until then; out of range and
 * a mixed fleet are refused. */
static void test_set_workers(void **state) {
  (void)state;
  kvr_workload_t *wl = small_workload();
  kvr_vcluster_opts_t o = small_opts(2);
  kvr_loadgen_opts_t lo = small_lg(24);
  char err[256] = "";
  for (int oracle = 0; oracle < 2; oracle++) {
    const char *name = oracle ? KVR_VCLUSTER_ORACLE : "round_robin";
    kvr_vcluster_t *vc = cluster(&o);
    assert_int_equal(kvr_vcluster_set_policy(vc, name, NULL, err, sizeof(err)), 0);
    assert_int_equal(kvr_vcluster_set_workers(vc, 0, err, sizeof(err)), KVR_EINVAL);
    assert_int_equal(kvr_vcluster_set_workers(vc, KVR_MAX_WORKERS + 1, err, sizeof(err)),
                     KVR_EINVAL);
    assert_non_null(strstr(err, "out of range"));
    assert_int_equal(kvr_vcluster_set_workers(vc, 5, err, sizeof(err)), 0);
    assert_int_equal(kvr_vcluster_router(vc)->nslots, 2); /* until the restart */
    kvr_level_t *two = level_on(vc, &lo, wl, 4, 11, &loose_slo);
    assert_all_ok(two, 24);
    assert_true(two->nworkers <= 2);
    assert_int_equal(kvr_vcluster_restart(vc, err, sizeof(err)), 0);
    assert_int_equal(kvr_vcluster_router(vc)->nslots, 5);
    assert_string_equal(kvr_vcluster_policy(vc), name);
    kvr_vcluster_level_begin(vc);
    kvr_level_t *five = level_on(vc, &lo, wl, 4, 11, &loose_slo);
    kvr_vcluster_level_end(vc, five);
    assert_all_ok(five, 24);
    assert_int_equal(five->engine_workers, 5);
    if (!oracle)
      assert_int_equal(five->nworkers, 5); /* round_robin reaches every worker of the new fleet */
    /* a fresh cluster of five routes the same requests the same way */
    kvr_vcluster_opts_t o5 = small_opts(5);
    kvr_vcluster_t *fresh = cluster(&o5);
    assert_int_equal(kvr_vcluster_set_policy(fresh, name, NULL, err, sizeof(err)), 0);
    kvr_level_t *ref = level_on(fresh, &lo, wl, 4, 11, &loose_slo);
    assert_true(same_records(ref, five, 1e-4));
    /* and down to one */
    assert_int_equal(kvr_vcluster_set_workers(vc, 1, err, sizeof(err)), 0);
    assert_int_equal(kvr_vcluster_restart(vc, err, sizeof(err)), 0);
    assert_int_equal(kvr_vcluster_router(vc)->nslots, 1);
    kvr_vcluster_level_begin(vc);
    kvr_level_t *one = level_on(vc, &lo, wl, 4, 11, &loose_slo);
    kvr_vcluster_level_end(vc, one);
    assert_all_ok(one, 24);
    assert_int_equal(one->engine_workers, 1);
    assert_int_equal(one->nworkers, 1);
    kvr_buf_t d = KVR_BUF_INIT;
    kvr_vcluster_describe(vc, &d);
    assert_non_null(strstr(d.data, "1 workers of"));
    kvr_buf_free(&d);
    kvr_stats_level_free(two);
    kvr_stats_level_free(five);
    kvr_stats_level_free(ref);
    kvr_stats_level_free(one);
    kvr_vcluster_free(fresh);
    kvr_vcluster_free(vc);
  }
  /* a mixed fleet keeps its size */
  kvr_vcluster_opts_t m = small_opts(2);
  m.worker_blocks[0] = 4096;
  m.worker_blocks[1] = 2048;
  m.nworker_blocks = 2;
  kvr_vcluster_t *vc = cluster(&m);
  assert_int_equal(kvr_vcluster_set_workers(vc, 3, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "mixed fleet"));
  assert_int_equal(kvr_vcluster_set_workers(vc, 2, err, sizeof(err)), 0);
  assert_int_equal(kvr_vcluster_restart(vc, err, sizeof(err)), 0);
  kvr_vcluster_free(vc);
  kvr_workload_free(wl);
}

/* The search against a fleet that passes from need workers on: it ends on need (or with none
 * passed past max), the two fleets around the answer tried, within 2 log2(max) + 2 levels. */
static unsigned fleet_search(unsigned start, unsigned max, unsigned need, int *steps,
                             unsigned *tried, size_t *ntried) {
  kvr_fleet_search_t s;
  kvr_fleet_search_init(&s, start, max);
  *ntried = 0;
  while (!s.done) {
    tried[(*ntried)++] = s.x;
    kvr_fleet_search_feed(&s, s.x >= need);
  }
  *steps = s.steps;
  return s.hi;
}

static void test_fleet_search(void **state) {
  (void)state;
  unsigned tried[80];
  size_t n;
  int steps;
  /* doubling up from a fail, then bisecting */
  assert_int_equal(fleet_search(4, 64, 13, &steps, tried, &n), 13);
  unsigned want13[] = {4, 8, 16, 12, 14, 13};
  assert_int_equal(n, KVR_ARRAY_SIZE(want13));
  assert_memory_equal(tried, want13, sizeof(want13));
  /* halving down from a pass */
  assert_int_equal(fleet_search(8, 64, 3, &steps, tried, &n), 3);
  unsigned want3[] = {8, 4, 2, 3};
  assert_int_equal(n, KVR_ARRAY_SIZE(want3));
  assert_memory_equal(tried, want3, sizeof(want3));
  /* one worker is enough: down to 1 and done */
  assert_int_equal(fleet_search(4, 64, 1, &steps, tried, &n), 1);
  assert_int_equal(n, 3);
  /* never enough: up to the bound and done, nothing passed */
  assert_int_equal(fleet_search(4, 64, 65, &steps, tried, &n), 0);
  assert_int_equal(tried[n - 1], 64);
  assert_int_equal(n, 5); /* 4 8 16 32 64 */
  /* every need, several starts */
  for (unsigned start = 1; start <= 70; start += 3)
    for (unsigned need = 1; need <= 70; need++) {
      unsigned got = fleet_search(start, 64, need, &steps, tried, &n);
      assert_int_equal(got, need <= 64 ? need : 0);
      assert_true(steps <= 16);
      bool below = need == 1 || need > 64;
      for (size_t i = 0; i < n; i++)
        below |= tried[i] == need - 1;
      assert_true(below);
    }
  /* the start is clamped into [1, max] */
  kvr_fleet_search_t s;
  kvr_fleet_search_init(&s, 0, 8);
  assert_int_equal(s.x, 1);
  kvr_fleet_search_init(&s, 100, 8);
  assert_int_equal(s.x, 8);
}

static void add_fleet_level(kvr_run_t *run, size_t workers, bool pass, unsigned fail_mask) {
  kvr_level_t *lv = kvr_stats_level_new(3.9, 0);
  lv->engine_workers = workers;
  lv->pass = pass;
  lv->fail_mask = fail_mask;
  kvr_stats_run_add(run, lv);
}

static kvr_fleet_answer_t answer_of(const kvr_run_t *run, char *text, size_t size) {
  kvr_fleet_answer_t a = kvr_fleet_answer(run);
  kvr_fleet_answer_text(a, text, size);
  return a;
}

/* The answer a run's levels give, in every case the report words differently. */
static void test_fleet_answer(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  char t[32];
  kvr_run_t *none = kvr_stats_results_add_run(res, "none", "round_robin", "");
  assert_int_equal(answer_of(none, t, sizeof(t)).tried, 0);
  assert_string_equal(t, "-");
  add_fleet_level(none, 4, false, KVR_SLO_FAIL_TPOT);
  add_fleet_level(none, 8, false, KVR_SLO_FAIL_TTFT);
  kvr_fleet_answer_t a = answer_of(none, t, sizeof(t));
  assert_true(a.workers == 0 && a.most_failed == 8 && !a.exact);
  assert_string_equal(t, "> 8");
  kvr_run_t *run = kvr_stats_results_add_run(res, "exact", "kv_aware", "");
  add_fleet_level(run, 4, false, KVR_SLO_FAIL_TPOT);
  add_fleet_level(run, 8, true, 0);
  add_fleet_level(run, 6, true, 0);
  answer_of(run, t, sizeof(t));
  assert_string_equal(t, "<= 6"); /* 5 not tried */
  add_fleet_level(run, 5, false, KVR_SLO_FAIL_TPOT);
  a = answer_of(run, t, sizeof(t));
  assert_true(a.workers == 6 && a.exact && a.most_failed == 5 && a.tried == 4);
  assert_string_equal(t, "6");
  kvr_run_t *one = kvr_stats_results_add_run(res, "one", "kv_aware", "");
  add_fleet_level(one, 2, true, 0);
  add_fleet_level(one, 1, true, 0);
  a = answer_of(one, t, sizeof(t));
  assert_true(a.workers == 1 && a.exact && a.most_failed == 0);
  kvr_stats_results_free(res);
}

/* The headline, the summary, the Markdown and the JSON of a two-policy sizing. */
static void test_fleet_report(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  res->slo = (kvr_slo_t){10000, 100, 0};
  kvr_stats_set_str(&res->title, "kvrouter fleet sizing");
  kvr_stats_set_str(&res->workload, "trace:t.jsonl");
  kvr_stats_set_str(&res->virtual_desc, "4 workers");
  kvr_run_t *rr = kvr_stats_results_add_run(res, "round_robin", "round_robin", "rr");
  add_fleet_level(rr, 4, false, KVR_SLO_FAIL_TPOT);
  add_fleet_level(rr, 8, true, 0);
  add_fleet_level(rr, 6, false, KVR_SLO_FAIL_TTFT | KVR_SLO_FAIL_TPOT);
  add_fleet_level(rr, 7, true, 0);
  kvr_run_t *kv = kvr_stats_results_add_run(res, "kv_aware", "kv_aware", "kv");
  add_fleet_level(kv, 7, true, 0);
  add_fleet_level(kv, 4, true, 0);
  add_fleet_level(kv, 2, false, KVR_SLO_FAIL_TPOT);
  add_fleet_level(kv, 3, true, 0);
  kvr_run_t *never = kvr_stats_results_add_run(res, "least_load", "least_load", "ll");
  add_fleet_level(never, 7, false, KVR_SLO_FAIL_TPOT);
  add_fleet_level(never, 14, false, KVR_SLO_FAIL_TPOT);
  kvr_fleet_info_t fi = {.rate = 3.9, .trace_rate = false, .start = 4, .max = 14};
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_fleet_headline(res, &b);
  assert_string_equal(b.data,
                      "kv_aware serves this traffic on 3 workers where round_robin needs 7\n"
                      "least_load needs more than 14 workers for this traffic, where "
                      "round_robin needs 7\n");
  kvr_buf_reset(&b);
  kvr_fleet_summary(res, &fi, &b);
  assert_non_null(strstr(b.data, "trace:t.jsonl at 3.9 req/s, TTFT p99 under 10000 ms, TPOT p99 "
                                 "under 100 ms.\n"));
  assert_non_null(strstr(b.data, "round_robin: 7 workers\n"));
  assert_non_null(strstr(b.data, "least_load: > 14 workers\n"));
  assert_non_null(strstr(b.data, "FAIL: TTFT+TPOT"));
  kvr_buf_reset(&b);
  kvr_fleet_markdown(res, &fi, &b);
  assert_non_null(strstr(b.data, "# kvrouter fleet sizing (virtual time)\n"));
  assert_non_null(strstr(b.data, "**kv_aware serves this traffic on 3 workers where round_robin "
                                 "needs 7.**\n"));
  assert_non_null(strstr(b.data, "| round_robin | 7 | 4 F, 8 P, 6 F, 7 P |\n"));
  assert_non_null(strstr(b.data, "| kv_aware | 3 | 7 P, 4 P, 2 F, 3 P |\n"));
  assert_non_null(strstr(b.data, "| least_load | > 14 | 7 F, 14 F |\n"));
  assert_non_null(strstr(b.data, "## kv_aware\n"));
  assert_non_null(strstr(b.data, "| 3 | 2 | FAIL: TPOT |"));
  kvr_buf_reset(&b);
  kvr_fleet_json(res, &fi, &b);
  cJSON *j = cJSON_Parse(b.data);
  assert_non_null(j);
  cJSON *pols = cJSON_GetObjectItem(j, "policies");
  assert_int_equal(cJSON_GetArraySize(pols), 3);
  cJSON *k = cJSON_GetArrayItem(pols, 1);
  assert_string_equal(cJSON_GetObjectItem(k, "label")->valuestring, "kv_aware");
  assert_int_equal(cJSON_GetObjectItem(k, "workers")->valueint, 3);
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(k, "exact")));
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(k, "levels")), 4);
  cJSON *n = cJSON_GetArrayItem(pols, 2);
  assert_int_equal(cJSON_GetObjectItem(n, "workers")->valueint, 0);
  assert_int_equal(cJSON_GetObjectItem(n, "most_failed")->valueint, 14);
  cJSON_Delete(j);
  /* one run alone */
  kvr_results_t *solo = kvr_stats_results_new();
  kvr_run_t *s = kvr_stats_results_add_run(solo, "kv_aware", "kv_aware", "");
  add_fleet_level(s, 1, true, 0);
  kvr_buf_reset(&b);
  kvr_fleet_headline(solo, &b);
  assert_string_equal(b.data, "kv_aware serves this traffic on 1 worker\n");
  kvr_buf_free(&b);
  kvr_stats_results_free(solo);
  kvr_stats_results_free(res);
}

KVR_TEST_MAIN(cmocka_unit_test(test_determinism), cmocka_unit_test(test_router_seed),
              cmocka_unit_test(test_multiturn_reuse_and_spread),
              cmocka_unit_test(test_policy_switch), cmocka_unit_test(test_reset_cache),
              cmocka_unit_test(test_restart_is_fresh), cmocka_unit_test(test_early_stop_then_level),
              cmocka_unit_test(test_accounting_closes), cmocka_unit_test(test_concurrency_level),
              cmocka_unit_test(test_network_delays), cmocka_unit_test(test_matches_engine_alone),
              cmocka_unit_test(test_generator_freed_before_cluster),
              cmocka_unit_test(test_mixed_fleet), cmocka_unit_test(test_precise_mode),
              cmocka_unit_test(test_bad_body_is_400), cmocka_unit_test(test_idle_advances_clock),
              cmocka_unit_test(test_level_figures),
              cmocka_unit_test(test_interrupt_and_free_in_flight),
              cmocka_unit_test(test_vt_exact_times), cmocka_unit_test(test_vt_arrival_seed),
              cmocka_unit_test(test_vt_errors), cmocka_unit_test(test_vt_early_stop_cancels),
              cmocka_unit_test(test_vt_new_checks), cmocka_unit_test(test_vt_responses_ids),
              cmocka_unit_test(test_responses_pinned),
              cmocka_unit_test(test_responses_unpinned_404), cmocka_unit_test(test_set_workers),
              cmocka_unit_test(test_fleet_search), cmocka_unit_test(test_fleet_answer),
              cmocka_unit_test(test_fleet_report))

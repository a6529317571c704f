/* test_model_fleet.c -- the model fleet (bench/vcluster/model_fleet.h) and the virtual cluster
 * serving it: the description's parse, refusals, GET /v1/models answers and model check; then a
 * small fleet (two base models, adapters, a DP endpoint) under a mix of their traffic in virtual
 * time, where every request lands on a worker serving its model (no 404), adapter requests on
 * workers listing their adapter, and a name no worker serves is the router's own 404. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "bench/vcluster/model_fleet.h"
#include "bench/vcluster/vcluster.h"
#include "proto/vllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kvr_mfleet_t parsed(const char *spec) {
  kvr_mfleet_t f;
  char err[256] = "";
  if (kvr_mfleet_parse(spec, 4096, &f, err, sizeof(err)) != 0)
    fail_msg("'%s': %s", spec, err);
  return f;
}

/* The study's fleet: 16 workers, 13 endpoints, each adapter on 5 of model-b's 6 workers. */
static void test_study_fleet(void **state) {
  (void)state;
  kvr_mfleet_t f = parsed(KVR_MFLEET_STUDY);
  assert_int_equal(f.n, 16);
  assert_int_equal(f.endpoints, 13);
  assert_int_equal(kvr_mfleet_count(&f, "model-a"), 10);
  assert_int_equal(kvr_mfleet_count(&f, "model-b"), 6);
  const char *adapters[] = {"b-sql", "b-chat", "b-code", "b-math"};
  for (size_t i = 0; i < 4; i++)
    assert_int_equal(kvr_mfleet_count(&f, adapters[i]), 5);
  assert_int_equal(kvr_mfleet_count(&f, "b-other"), 0);
  assert_int_equal(kvr_mfleet_count(&f, ""), 0);
  for (size_t i = 0; i < 6; i++) {
    assert_string_equal(f.w[i].model, "model-a");
    assert_int_equal(f.w[i].nadapters, 0);
    assert_int_equal(f.w[i].endpoint, (int)i);
    assert_int_equal(f.w[i].dp_size, 1);
  }
  for (size_t i = 6; i < 12; i++) { /* more adapters listed than --max-loras 2 batches */
    assert_string_equal(f.w[i].model, "model-b");
    assert_int_equal(f.w[i].nadapters, i < 10 ? 3 : 4);
    assert_ptr_equal(f.w[i].adapter_ptrs[1], f.w[i].adapters[1]);
  }
  for (size_t i = 12; i < 16; i++) { /* one endpoint, four ranks */
    assert_string_equal(f.w[i].model, "model-a");
    assert_int_equal(f.w[i].endpoint, 12);
    assert_int_equal(f.w[i].dp_rank, i - 12);
    assert_int_equal(f.w[i].dp_size, 4);
  }
  kvr_buf_t d = KVR_BUF_INIT;
  kvr_mfleet_describe(&f, &d);
  assert_string_equal(d.data, "6 x model-a; 1 x model-b + adapters b-sql, b-chat, b-code; 1 x "
                              "model-b + adapters b-sql, b-chat, b-math; 1 x model-b + adapters "
                              "b-sql, b-code, b-math; 1 x model-b + adapters b-chat, b-code, "
                              "b-math; 2 x model-b + adapters b-sql, b-chat, b-code, b-math; 4 x "
                              "model-a as one DP endpoint of 4 ranks");
  kvr_buf_free(&d);
  kvr_mfleet_free(&f);
  kvr_mfleet_free(&f); /* leaves it empty: twice is fine */
  kvr_mfleet_free(NULL);
}

static void test_refusals(void **state) {
  (void)state;
  static const struct {
    const char *spec, *says;
  } bad[] = {
      {"", "needs N*MODEL"},
      {"a", "is not N*MODEL"},
      {"0*a", "is not N*MODEL"},
      {"2a", "is not N*MODEL"},
      {"2*", "the model must be"},
      {"2*a b", "the model must be"},
      {"2*a;", "a group is empty"},
      {"2*a:", "adapters are 1-63"},
      {"2*a:x+", "adapters are 1-63"},
      {"2*a:x+x", "'x' is named twice"},
      {"2*a:a", "'a' is named twice"},
      {"1*a:b;1*b", "'b' is both a base model and an adapter"},
      {"1*a:q1+q2+q3+q4+q5+q6+q7+q8+q9", "at most 8"},
      {"3*a;2*b", "at most 4 workers in all"},
      {"5*a", "at most 4 workers in all"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    kvr_mfleet_t f;
    char err[256] = "";
    assert_int_equal(kvr_mfleet_parse(bad[i].spec, 4, &f, err, sizeof(err)), KVR_EINVAL);
    assert_int_equal(f.n, 0);
    assert_null(f.w);
    if (strstr(err, bad[i].says) == NULL || strncmp(err, "--model-fleet: ", 15) != 0)
      fail_msg("'%s': '%s' does not say '%s'", bad[i].spec, err, bad[i].says);
  }
  /* a DP group needs its ranks within the bound too */
  kvr_mfleet_t f;
  char err[256];
  assert_int_equal(kvr_mfleet_parse("2*a;3*a@dp", 4, &f, err, sizeof(err)), KVR_EINVAL);
  assert_int_equal(kvr_mfleet_parse("1*a;3*a@dp", 4, &f, err, sizeof(err)), 0);
  assert_int_equal(f.endpoints, 2);
  kvr_mfleet_free(&f);
}

/* Each worker's GET /v1/models reads back through the router's parser as vLLM's cards: the base
 * first with max_model_len, each adapter with its parent and a null max_model_len. */
static void test_models_json(void **state) {
  (void)state;
  kvr_mfleet_t f = parsed("1*m-a;2*m-b:x1+x2");
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_mfleet_models_json(&f, 1, 8192, 1700000000, &b);
  kvr_vllm_models_t m;
  assert_int_equal(kvr_vllm_parse_model_list(b.data, b.len, &m), 0);
  assert_int_equal(m.n, 3);
  assert_true(m.complete);
  assert_string_equal(m.v[0].id, "m-b");
  assert_null(m.v[0].parent);
  assert_string_equal(m.v[0].root, "/models/m-b");
  assert_int_equal(m.v[0].max_model_len, 8192);
  assert_string_equal(m.v[1].id, "x1");
  assert_string_equal(m.v[1].parent, "m-b");
  assert_string_equal(m.v[1].root, "/loras/x1");
  assert_int_equal(m.v[1].max_model_len, 0);
  assert_string_equal(m.v[2].id, "x2");
  assert_int_equal(m.max_model_len, 8192);
  assert_non_null(
      strstr(b.data, "\"object\":\"model\",\"created\":1700000000,\"owned_by\":\"vllm\""));
  kvr_vllm_models_free(&m);
  kvr_mfleet_models_json(&f, 0, 4096, 0, &b);
  assert_int_equal(kvr_vllm_parse_model_list(b.data, b.len, &m), 0);
  assert_int_equal(m.n, 1);
  kvr_vllm_models_free(&m);
  /* vLLM's model check: the base, an adapter (its index), nothing else; no name is the base */
  int32_t lora = 7;
  assert_true(kvr_mfleet_serves(&f.w[2], "m-b", &lora) && lora == -1);
  assert_true(kvr_mfleet_serves(&f.w[2], "x2", &lora) && lora == 1);
  assert_true(kvr_mfleet_serves(&f.w[2], NULL, &lora) && lora == -1);
  assert_true(kvr_mfleet_serves(&f.w[2], "", &lora) && lora == -1);
  assert_false(kvr_mfleet_serves(&f.w[0], "x1", &lora));
  assert_false(kvr_mfleet_serves(&f.w[2], "m-a", &lora));
  kvr_buf_free(&b);
  kvr_mfleet_free(&f);
}

/* ---- the fleet in virtual time --------------------------------------------------------------- */

#define SMALL_FLEET "2*model-a;1*model-b:b-x+b-y;1*model-b:b-y+b-z;1*model-b:b-x+b-z;2*model-a@dp"

static kvr_vcluster_opts_t fleet_opts(void) {
  kvr_vcluster_opts_t o;
  kvr_vcluster_opts_default(&o);
  o.workers = 3; /* the fleet's 7 replace it */
  o.engine.num_gpu_blocks = 4096;
  o.engine.block_size = 16;
  o.engine.max_num_seqs = 64;
  o.engine.max_num_batched_tokens = 2048;
  o.engine.max_model_len = 8192;
  o.output_len_mean = 0;
  o.model = "model-a";
  o.scrape_interval_ms = 200;
  o.scrape_stale_ms = 1000;
  o.model_fleet = SMALL_FLEET;
  o.max_loras = 1; /* two adapters listed, one batched at a time */
  return o;
}

static kvr_workload_t *fleet_workload(void) {
  kvr_workload_opts_t w;
  kvr_workload_opts_default(&w);
  assert_int_equal(kvr_workload_parse_kind("mix:model-a=multiturn@0.4,model-b=documents@0.2,"
                                           "b-x=multiturn@0.2,b-y=documents@0.1,b-z=control@0.1",
                                           &w),
                   0);
  w.turns = 3;
  w.starters = 3;
  w.documents = 6;
  w.prefix_min_tokens = 200;
  w.prefix_max_tokens = 300;
  w.control_min_tokens = 200;
  w.control_max_tokens = 300;
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

/* One level of the mix on a fresh fleet under policy; the caller frees the level. */
static kvr_level_t *fleet_level(const char *policy, kvr_vcluster_mstats_t *ms, double rate) {
  kvr_log_set_level(KVR_LOG_WARN);
  kvr_vcluster_opts_t o = fleet_opts();
  char err[256] = "";
  kvr_vcluster_t *vc = kvr_vcluster_new(&o, err, sizeof(err));
  if (vc == NULL)
    fail_msg("kvr_vcluster_new: %s", err);
  assert_int_equal(kvr_vcluster_set_policy(vc, policy, NULL, err, sizeof(err)), 0);
  kvr_workload_t *wl = fleet_workload();
  kvr_loadgen_opts_t lo;
  kvr_loadgen_opts_default(&lo);
  lo.model = "model-a";
  lo.num_prompts = 150;
  lo.request_timeout_s = 0;
  kvr_loadgen_vt_t vt;
  kvr_vcluster_transport(vc, &vt);
  kvr_loadgen_t *lg = kvr_loadgen_new_virtual(&lo, wl, &vt, err, sizeof(err));
  assert_non_null(lg);
  kvr_slo_t slo = {60000, 10000, 1};
  kvr_level_t *lv = NULL;
  kvr_vcluster_level_begin(vc);
  assert_int_equal(kvr_loadgen_run_level(lg, "t", rate, 0, 3, &slo, &lv), 0);
  kvr_vcluster_level_end(vc, lv);
  kvr_vcluster_mstats(vc, ms);
  /* the router took each worker's list */
  const kvr_router_t *r = kvr_vcluster_router(vc);
  assert_int_equal(r->nslots, 7);
  for (size_t i = 0; i < 7; i++)
    assert_true(r->slots[i]->models_known);
  assert_int_equal(r->slots[2]->models.n, 3);
  /* the DP endpoint's two ranks are two workers of one URL, in rank order */
  assert_int_equal(r->slots[4]->dp_rank, -1);
  assert_int_equal(r->slots[5]->dp_rank, 0);
  assert_int_equal(r->slots[6]->dp_rank, 1);
  assert_int_equal(r->slots[6]->dp_size, 2);
  assert_string_equal(r->slots[5]->url, r->slots[6]->url);
  assert_string_equal(r->slots[6]->key, "http://127.0.0.1:9006#dp=1");
  /* a LoRA worker's scrape carries vllm:lora_requests_info, a base-only worker's none */
  assert_true(r->slots[2]->lora.present);
  assert_int_equal(r->slots[2]->lora.max_lora, 1);
  assert_false(r->slots[0]->lora.present);
  kvr_buf_t d = KVR_BUF_INIT; /* the report's cluster line names the fleet */
  kvr_vcluster_describe(vc, &d);
  assert_non_null(strstr(d.data, "7 workers of `kvrouter sim`'s engine"));
  assert_non_null(strstr(d.data, "; models: 2 x model-a; 1 x model-b + adapters b-x, b-y; "));
  assert_non_null(strstr(d.data, "2 x model-a as one DP endpoint of 2 ranks (LoRA workers: "
                                 "--max-loras 1, adapters of rank 16)"));
  kvr_buf_free(&d);
  kvr_loadgen_free(lg);
  kvr_workload_free(wl);
  kvr_vcluster_free(vc);
  return lv;
}

/* Every request reached a worker serving its model, under every kind of policy and the oracle:
 * no 404, each adapter on a worker listing it; the level's figures say so too. */
static void test_fleet_routes_by_model(void **state) {
  (void)state;
  kvr_mfleet_t f = parsed(SMALL_FLEET);
  const char *policies[] = {"round_robin", "least_load",   "kv_aware",           "gie_scorer",
                            "dynamo_kv",   "llmd_precise", "sglang_cache_aware", "oracle"};
  double running[KVR_ARRAY_SIZE(policies)];
  for (size_t p = 0; p < KVR_ARRAY_SIZE(policies); p++) {
    kvr_vcluster_mstats_t ms;
    kvr_level_t *lv = fleet_level(policies[p], &ms, 4);
    size_t per_part[5] = {0}, adapters = 0;
    const char *parts[] = {"model-a", "model-b", "b-x", "b-y", "b-z"};
    for (size_t i = 0; i < lv->nrecs; i++) {
      const kvr_req_rec_t *rec = &lv->recs[i];
      if (!rec->ok)
        fail_msg("%s: conv %llu turn %u (%s) failed: %d %s", policies[p],
                 (unsigned long long)rec->conv, rec->turn, rec->model, rec->status, rec->error);
      int32_t lora;
      size_t wi = (size_t)atoi(rec->worker);
      assert_true(wi < f.n);
      if (!kvr_mfleet_serves(&f.w[wi], rec->model, &lora))
        fail_msg("%s: a request for %s went to worker %zu (%s)", policies[p], rec->model, wi,
                 f.w[wi].model);
      adapters += lora >= 0;
      for (size_t k = 0; k < 5; k++)
        per_part[k] += strcmp(rec->model, parts[k]) == 0;
    }
    for (size_t k = 0; k < 5; k++) /* every model of the mix was sent */
      assert_true(per_part[k] > 0);
    assert_int_equal(ms.not_served, 0);
    assert_int_equal(ms.requests, lv->nrecs);
    assert_int_equal(ms.adapter_requests, adapters);
    assert_int_equal(ms.adapter_state[KVR_ADAPTER_NONE], 0); /* listed: at least loaded */
    assert_true(lv->models_seen);
    assert_int_equal(lv->models_not_served, 0);
    assert_int_equal(lv->adapter_requests, adapters);
    running[p] = (double)ms.adapter_state[KVR_ADAPTER_RUNNING] / (double)adapters;
    kvr_stats_level_free(lv);
  }
  /* kv_aware sends adapter requests where the adapter is running more often than round robin
   * (at this light load an adapter is often running nowhere: 0.28 against 0.11) */
  if (!(running[2] > 2 * running[0]))
    fail_msg("adapter requests to a worker running the adapter: kv_aware %.2f, round_robin %.2f",
             running[2], running[0]);
  kvr_mfleet_free(&f);
}

/* A name no worker lists is vLLM's 404 from the router itself (proxy.c's model check), and the
 * fleet's own refusals reach kvr_vcluster_new's caller. */
static void test_fleet_unknown_model_and_refusals(void **state) {
  (void)state;
  kvr_log_set_level(KVR_LOG_WARN);
  kvr_vcluster_opts_t o = fleet_opts();
  char err[256] = "";
  kvr_vcluster_t *vc = kvr_vcluster_new(&o, err, sizeof(err));
  assert_non_null(vc);
  kvr_workload_opts_t w;
  kvr_workload_opts_default(&w);
  w.kind = KVR_WL_CONTROL;
  w.control_min_tokens = w.control_max_tokens = 100;
  w.out_mean = w.out_min = w.out_max = 8;
  w.out_std = 0;
  kvr_workload_t *wl = kvr_workload_new(&w, err, sizeof(err));
  kvr_loadgen_opts_t lo;
  kvr_loadgen_opts_default(&lo);
  lo.model = "model-c"; /* served by no worker */
  lo.num_prompts = 5;
  kvr_loadgen_vt_t vt;
  kvr_vcluster_transport(vc, &vt);
  kvr_loadgen_t *lg = kvr_loadgen_new_virtual(&lo, wl, &vt, err, sizeof(err));
  kvr_slo_t slo = {60000, 10000, 1};
  kvr_level_t *lv = NULL;
  kvr_vcluster_level_begin(vc);
  assert_int_equal(kvr_loadgen_run_level(lg, "t", 2, 0, 1, &slo, &lv), 0);
  for (size_t i = 0; i < lv->nrecs; i++) {
    assert_int_equal(lv->recs[i].status, 404);
    assert_string_equal(lv->recs[i].worker, "");
  }
  kvr_vcluster_mstats_t ms;
  kvr_vcluster_mstats(vc, &ms);
  assert_int_equal(ms.requests, 0); /* none reached a worker */
  /* the fleet fixes the cluster's size */
  assert_int_equal(kvr_vcluster_set_workers(vc, 3, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "a model fleet (--model-fleet) keeps its 7 workers"));
  assert_int_equal(kvr_vcluster_set_workers(vc, 7, err, sizeof(err)), 0);
  kvr_stats_level_free(lv);
  kvr_loadgen_free(lg);
  kvr_workload_free(wl);
  kvr_vcluster_free(vc);
  o.model_fleet = "2*a;x";
  assert_null(kvr_vcluster_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--model-fleet: group 'x'"));
  o.model_fleet = "2*a";
  o.nworker_blocks = 3;
  o.worker_blocks[0] = o.worker_blocks[1] = o.worker_blocks[2] = 100;
  assert_null(kvr_vcluster_new(&o, err, sizeof(err)));
  assert_string_equal(err, "--worker-blocks: 3 values for the model fleet's 2 workers");
}

KVR_TEST_MAIN(cmocka_unit_test(test_study_fleet), cmocka_unit_test(test_refusals),
              cmocka_unit_test(test_models_json), cmocka_unit_test(test_fleet_routes_by_model),
              cmocka_unit_test(test_fleet_unknown_model_and_refusals))

/* test_sim_engine.c -- the simulated vLLM engine: prefix-cache hit accounting, LRU eviction order
 * (tail blocks first), preemption by recompute, the per-step token budget with chunked prefill,
 * max_num_seqs, aborts, the cost model's bookkeeping, cache_salt chains (and the salt in the KV
 * events, encoded as vLLM's extra_keys), continued answers (gen_offset) and requests that skip
 * the prefix cache; LoRA: vLLM's max_loras admission rule, the adapter swap cost in virtual
 * time, adapters in the block hashes and the KV events. */
#include "base/kvr.h"
#include "bench/sim/kv_events.h"
#include "bench/sim/sim_engine.h"
#include "bench/sim/sim_tokens.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

/* Prompt ids base, base+1, ...: distinct bases give distinct prompts. */
static uint32_t *prompt_seq(uint32_t base, uint32_t n) {
  uint32_t *p = malloc(n * sizeof(uint32_t));
  for (uint32_t i = 0; i < n; i++)
    p[i] = base + i;
  return p;
}

static kvr_sim_engine_t *small_engine(uint32_t blocks, uint32_t budget, uint32_t seqs) {
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  cfg.num_gpu_blocks = blocks;
  cfg.max_num_batched_tokens = budget;
  cfg.max_num_seqs = seqs;
  cfg.max_model_len = 4096;
  /* The scheduler and cache alone: no API server costs, steps scheduled as they start, canonical
   * tokens (test_frontend_* and test_retok_drift cover those). */
  memset(&cfg.frontend, 0, sizeof(cfg.frontend));
  cfg.retok_drift = 0;
  kvr_sim_engine_t *eng = kvr_sim_engine_new(&cfg);
  assert_non_null(eng);
  return eng;
}

static void run_until_done(kvr_sim_engine_t *eng, kvr_sim_req_t *req) {
  kvr_sim_step_t st;
  for (int i = 0; i < 10000 && req->state != KVR_SIM_FINISHED; i++)
    kvr_sim_engine_step(eng, &st);
  assert_int_equal(req->state, KVR_SIM_FINISHED);
}

static void test_defaults(void **state) {
  kvr_sim_config_t cfg;
  char err[128];
  kvr_sim_config_default(&cfg);
  /* 53.15 GiB / 163,840 B per token / 16 = ~21.7k blocks (WORKLOAD.md) */
  assert_true(cfg.num_gpu_blocks > 21700 && cfg.num_gpu_blocks < 21800);
  assert_int_equal(kvr_sim_config_check(&cfg, err, sizeof(err)), 0);
  cfg.block_size = 0;
  assert_int_equal(kvr_sim_config_check(&cfg, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "block_size"));
  assert_null(kvr_sim_engine_new(&cfg));
  kvr_sim_engine_free(NULL);
  kvr_sim_engine_remove(NULL, NULL);
}

static void test_prefix_hits(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  uint32_t *p = prompt_seq(1000, 64);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, p, 64, 3, KVR_SIM_FINISH_LENGTH, 1, NULL);
  run_until_done(eng, a);
  assert_int_equal(a->num_cached, 0);
  assert_int_equal(a->finish, KVR_SIM_FINISH_LENGTH);
  kvr_sim_stats_t s;
  kvr_sim_engine_stats(eng, &s);
  assert_int_equal(s.prefix_queries, 64);
  assert_int_equal(s.prefix_hits, 0);
  assert_int_equal(s.prompt_tokens, 64);
  assert_int_equal(s.generation_tokens, 3);
  assert_int_equal(s.blocks_used, 0);
  /* 64 prompt + 2 computed outputs = 66 tokens: 4 full blocks hashed and kept after the free */
  assert_int_equal(s.blocks_cached, 4);

  /* same prompt: the last token must be recomputed, so 3 of its 4 blocks hit */
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, p, 64, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(b->num_cached, 48);
  assert_int_equal(st.prefill_tokens, 16);
  assert_true(st.events[0].finished);
  assert_int_equal(b->finish, KVR_SIM_FINISH_STOP);
  kvr_sim_engine_stats(eng, &s);
  assert_int_equal(s.prefix_queries, 128);
  assert_int_equal(s.prefix_hits, 48);

  /* a prompt sharing only the first 20 tokens hits exactly one block */
  uint32_t *q = prompt_seq(1000, 64);
  for (uint32_t i = 20; i < 64; i++)
    q[i] = 7;
  kvr_sim_req_t *c = kvr_sim_engine_add(eng, q, 64, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(c->num_cached, 16);
  /* a generated token sequence continues the hash chain: a prompt equal to a's prompt + its first
   * two outputs hits 4 blocks (64 + 2 - 1 computed tokens -> 4 full blocks) */
  uint32_t ext[67];
  memcpy(ext, a->tokens, 66 * sizeof(uint32_t));
  ext[66] = 5;
  kvr_sim_req_t *d = kvr_sim_engine_add(eng, ext, 67, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(d->num_cached, 64);

  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_remove(eng, d);
  kvr_sim_engine_free(eng);
  free(p);
  free(q);
}

static void test_eviction_order(void **state) {
  /* 8 blocks. A and B each cache 2 blocks then free them tail first; C takes the 4 never-used
   * blocks; D then has to evict, and must take A's blocks (freed before B's) tail first. */
  kvr_sim_engine_t *eng = small_engine(8, 8192, 16);
  uint32_t *pa = prompt_seq(100, 32), *pb = prompt_seq(200, 32), *pc = prompt_seq(300, 64);
  uint32_t *pd = prompt_seq(400, 17);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, pa, 32, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  run_until_done(eng, a);
  int32_t a1 = 1; /* A took blocks 0 and 1, the head of the initial free list */
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, pb, 32, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  run_until_done(eng, b);
  uint64_t ha0 = kvr_sim_block_hash(0, pa, 16), ha1 = kvr_sim_block_hash(ha0, pa + 16, 16);
  uint64_t hb0 = kvr_sim_block_hash(0, pb, 16), hb1 = kvr_sim_block_hash(hb0, pb + 16, 16);
  assert_true(kvr_sim_engine_has_hash(eng, ha0) && kvr_sim_engine_has_hash(eng, ha1));
  assert_true(kvr_sim_engine_has_hash(eng, hb0) && kvr_sim_engine_has_hash(eng, hb1));

  kvr_sim_req_t *c = kvr_sim_engine_add(eng, pc, 64, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(c->state, KVR_SIM_FINISHED);
  /* c's own blocks went to the tail; the head is now A's tail block */
  assert_int_equal(kvr_sim_engine_next_victim(eng), a1);
  kvr_sim_engine_remove(eng, c);

  /* the free list is [a1, a0, b1, b0, c3, c2, c1, c0]: D needs 2 blocks and takes a1 then a0 */
  kvr_sim_req_t *d = kvr_sim_engine_add(eng, pd, 17, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(d->state, KVR_SIM_FINISHED);
  assert_false(kvr_sim_engine_has_hash(eng, ha0));
  assert_false(kvr_sim_engine_has_hash(eng, ha1));
  assert_true(kvr_sim_engine_has_hash(eng, hb0) && kvr_sim_engine_has_hash(eng, hb1));

  /* B's prompt still hits its first block (looked up first: A's would evict B's); A's misses */
  kvr_sim_req_t *b2 = kvr_sim_engine_add(eng, pb, 32, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(b2->num_cached, 16);
  kvr_sim_req_t *a2 = kvr_sim_engine_add(eng, pa, 32, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(a2->num_cached, 0);

  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, d);
  kvr_sim_engine_remove(eng, a2);
  kvr_sim_engine_remove(eng, b2);
  kvr_sim_engine_free(eng);
  free(pa);
  free(pb);
  free(pc);
  free(pd);
}

static void test_preemption(void **state) {
  /* 6 blocks of 16; two requests of 40 prompt + 40 output need 5 blocks each: the later admitted
   * one is preempted when the earlier one grows, and both still produce their exact outputs. */
  kvr_sim_engine_t *eng = small_engine(6, 8192, 16);
  uint32_t *pa = prompt_seq(100, 40), *pb = prompt_seq(900, 40);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, pa, 40, 40, KVR_SIM_FINISH_LENGTH, 11, NULL);
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, pb, 40, 40, KVR_SIM_FINISH_LENGTH, 22, NULL);
  kvr_sim_step_t st;
  uint32_t out_a = 0, out_b = 0, preempt_a = 0, preempt_b = 0;
  for (int i = 0; i < 1000 && kvr_sim_engine_busy(eng); i++) {
    kvr_sim_engine_step(eng, &st);
    for (size_t e = 0; e < st.nevents; e++) {
      kvr_sim_event_t *ev = &st.events[e];
      *(ev->req == a ? &out_a : &out_b) += ev->new_tokens;
      if (ev->preempted)
        (*(ev->req == a ? &preempt_a : &preempt_b))++;
    }
    kvr_sim_stats_t s;
    kvr_sim_engine_stats(eng, &s);
    assert_true(s.blocks_used <= 6);
  }
  assert_int_equal(a->state, KVR_SIM_FINISHED);
  assert_int_equal(b->state, KVR_SIM_FINISHED);
  assert_int_equal(out_a, 40);
  assert_int_equal(out_b, 40);
  assert_int_equal(preempt_a, 0);
  assert_true(preempt_b >= 1);
  assert_int_equal(b->num_preemptions, preempt_b);
  kvr_sim_stats_t s;
  kvr_sim_engine_stats(eng, &s);
  assert_int_equal(s.preemptions, preempt_b);
  assert_int_equal(s.blocks_used, 0);
  /* outputs are the seeded words regardless of the preemption */
  for (uint32_t k = 0; k < 40; k++) {
    assert_int_equal(a->tokens[40 + k], kvr_sim_tokens_word_id(11, k));
    assert_int_equal(b->tokens[40 + k], kvr_sim_tokens_word_id(22, k));
  }
  /* b's prompt tokens were counted once, not once per prefill */
  assert_int_equal(s.prompt_tokens, 80);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_free(eng);
  free(pa);
  free(pb);
}

/* The waiting queue is FCFS with preempted requests in front and no skipping: a new request
 * never overtakes an earlier one, and a small request that would fit waits behind a preempted one
 * that does not (vLLM's order). */
static void test_waiting_order(void **state) {
  /* one slot: a, b, c are admitted in the order they were added */
  kvr_sim_engine_t *eng = small_engine(64, 8192, 1);
  uint32_t *p = prompt_seq(100, 20);
  kvr_sim_req_t *r[3];
  for (int i = 0; i < 3; i++)
    r[i] = kvr_sim_engine_add(eng, p, 20, 2, KVR_SIM_FINISH_LENGTH, (uint64_t)i, NULL);
  for (int i = 0; i < 3; i++) {
    kvr_sim_step_t st;
    kvr_sim_engine_step(eng, &st);
    assert_int_equal(r[i]->state, KVR_SIM_RUNNING);
    for (int j = i + 1; j < 3; j++)
      assert_int_equal(r[j]->state, KVR_SIM_WAITING);
    run_until_done(eng, r[i]);
  }
  for (int i = 0; i < 3; i++)
    kvr_sim_engine_remove(eng, r[i]);
  kvr_sim_engine_free(eng);
  free(p);

  /* 6 blocks: b is preempted when a grows and goes in front of c, which needs 1 block and would
   * fit; c is admitted only once b is running again */
  eng = small_engine(6, 8192, 16);
  uint32_t *pa = prompt_seq(100, 40), *pb = prompt_seq(900, 40), *pc = prompt_seq(500, 10);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, pa, 40, 40, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, pb, 40, 40, KVR_SIM_FINISH_LENGTH, 2, NULL);
  kvr_sim_req_t *c = kvr_sim_engine_add(eng, pc, 10, 1, KVR_SIM_FINISH_STOP, 3, NULL);
  kvr_sim_step_t st;
  bool c_waited_behind_b = false;
  for (int i = 0; i < 1000 && kvr_sim_engine_busy(eng); i++) {
    kvr_sim_engine_step(eng, &st);
    if (b->state == KVR_SIM_WAITING) {
      assert_true(b->num_preemptions >= 1);
      assert_int_equal(c->state, KVR_SIM_WAITING);
      c_waited_behind_b = true;
    }
  }
  assert_true(c_waited_behind_b);
  assert_int_equal(a->state, KVR_SIM_FINISHED);
  assert_int_equal(b->state, KVR_SIM_FINISHED);
  assert_int_equal(c->state, KVR_SIM_FINISHED);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_free(eng);
  free(pa);
  free(pb);
  free(pc);
}

static void test_budget_and_chunked_prefill(void **state) {
  kvr_sim_engine_t *eng = small_engine(256, 100, 16);
  uint32_t *pa = prompt_seq(100, 80), *pb = prompt_seq(300, 80), *pc = prompt_seq(500, 80);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, pa, 80, 10, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, pb, 80, 10, KVR_SIM_FINISH_LENGTH, 2, NULL);
  kvr_sim_req_t *c = kvr_sim_engine_add(eng, pc, 80, 10, KVR_SIM_FINISH_LENGTH, 3, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  /* a fully prefilled (and sampled), b got the 20 left of the budget, c waits */
  assert_int_equal(st.num_seqs, 2);
  assert_int_equal(st.prefill_tokens, 100);
  assert_int_equal(a->num_computed, 80);
  assert_int_equal(a->ntokens, 81);
  assert_int_equal(b->num_computed, 20);
  assert_int_equal(b->ntokens, 80);
  assert_int_equal(c->state, KVR_SIM_WAITING);
  assert_int_equal(st.nevents, 2);
  assert_int_equal(st.events[0].new_tokens, 1);
  assert_int_equal(st.events[1].new_tokens, 0);
  /* step 2: a decodes first (1), b finishes its prompt (60), c gets the remaining 39 */
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(st.num_decode, 1);
  assert_int_equal(st.decode_ctx, 81);
  assert_int_equal(st.prefill_tokens, 99);
  assert_int_equal(b->num_computed, 80);
  assert_int_equal(c->num_computed, 39);
  /* duration is the cost model applied to what was scheduled */
  const kvr_sim_config_t *cfg = kvr_sim_engine_config(eng);
  double expect = kvr_sim_cost_step(&cfg->cost, &st);
  assert_true(st.duration_s == expect);
  /* attention pairs: b's chunk of 60 after 20, c's 39 from 0 */
  assert_true(st.attn_pairs == 60.0 * (20 + 61 / 2.0) + 39.0 * (0 + 40 / 2.0));
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_free(eng);
  free(pa);
  free(pb);
  free(pc);
}

static void test_max_num_seqs_and_abort(void **state) {
  kvr_sim_engine_t *eng = small_engine(256, 8192, 2);
  uint32_t *p1 = prompt_seq(1, 20), *p2 = prompt_seq(100, 20), *p3 = prompt_seq(200, 20);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, p1, 20, 50, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, p2, 20, 50, KVR_SIM_FINISH_LENGTH, 2, NULL);
  kvr_sim_req_t *c = kvr_sim_engine_add(eng, p3, 20, 50, KVR_SIM_FINISH_LENGTH, 3, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  kvr_sim_engine_step(eng, &st);
  kvr_sim_stats_t s;
  kvr_sim_engine_stats(eng, &s);
  assert_int_equal(s.running, 2);
  assert_int_equal(s.waiting, 1);
  assert_int_equal(c->state, KVR_SIM_WAITING);
  assert_true(s.blocks_used >= 4);
  /* aborting a running request frees its slot and its blocks; c is admitted next step */
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(c->state, KVR_SIM_RUNNING);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_stats(eng, &s);
  assert_int_equal(s.blocks_used, 0);
  assert_int_equal(s.running + s.waiting, 0);
  assert_false(kvr_sim_engine_busy(eng));
  /* an idle step costs nothing */
  kvr_sim_engine_step(eng, &st);
  assert_true(st.duration_s == 0.0);
  /* requests that can never fit are refused */
  assert_null(kvr_sim_engine_add(eng, p1, 20, 5000, KVR_SIM_FINISH_LENGTH, 1, NULL));
  assert_null(kvr_sim_engine_add(eng, p1, 0, 5, KVR_SIM_FINISH_LENGTH, 1, NULL));
  kvr_sim_engine_free(eng);
  free(p1);
  free(p2);
  free(p3);
}

/* reset_prefix_cache: an idle cached prompt misses afterwards, a running request's blocks keep
 * their hashes (a later prompt sharing its prefix still hits), cumulative counters are untouched.
 */
static void test_reset_prefix_cache(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  uint32_t *p = prompt_seq(1000, 64);
  uint32_t *q = prompt_seq(5000, 48);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, p, 64, 3, KVR_SIM_FINISH_LENGTH, 1, NULL);
  run_until_done(eng, a);
  uint64_t h0 = kvr_sim_block_hash(0, p, 16);
  assert_true(kvr_sim_engine_has_hash(eng, h0));

  /* r runs (prefilled, decoding) while the reset happens */
  kvr_sim_req_t *r = kvr_sim_engine_add(eng, q, 48, 100, KVR_SIM_FINISH_LENGTH, 2, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(r->state, KVR_SIM_RUNNING);
  kvr_sim_stats_t before, after;
  kvr_sim_engine_stats(eng, &before);
  assert_int_equal(before.blocks_cached, 4); /* a's 4 full blocks, free and hashed */

  uint32_t kept = 99;
  assert_int_equal(kvr_sim_engine_reset_prefix_cache(eng, &kept), 4);
  assert_int_equal(kept, 3); /* r's 3 full prompt blocks */
  kvr_sim_engine_stats(eng, &after);
  assert_int_equal(after.blocks_cached, 0);
  assert_int_equal(after.blocks_used, before.blocks_used);
  assert_int_equal(after.prefix_queries, before.prefix_queries);
  assert_int_equal(after.prefix_hits, before.prefix_hits);
  assert_int_equal(after.preemptions, before.preemptions);
  assert_false(kvr_sim_engine_has_hash(eng, h0));
  assert_true(kvr_sim_engine_has_hash(eng, kvr_sim_block_hash(0, q, 16)));

  /* the same prompt as a is now a miss */
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, p, 64, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  /* r's prompt still hits its 2 blocks the lookup may take (the last token is never a hit) */
  kvr_sim_req_t *c = kvr_sim_engine_add(eng, q, 48, 1, KVR_SIM_FINISH_STOP, 3, NULL);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(b->num_cached, 0);
  assert_int_equal(c->num_cached, 32);
  kvr_sim_engine_stats(eng, &after);
  assert_int_equal(after.prefix_hits, before.prefix_hits + 32);
  assert_int_equal(after.prefix_queries, before.prefix_queries + 64 + 48);

  /* the engine keeps working: r runs to completion on its kept blocks */
  run_until_done(eng, r);
  assert_int_equal(r->ntokens, 148);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_remove(eng, r);
  /* idle: everything cached goes; nothing is held */
  kvr_sim_engine_stats(eng, &before);
  assert_true(before.blocks_cached > 0);
  assert_int_equal(kvr_sim_engine_reset_prefix_cache(eng, &kept), before.blocks_cached);
  assert_int_equal(kept, 0);
  assert_int_equal(kvr_sim_engine_reset_prefix_cache(eng, NULL), 0);
  kvr_sim_engine_free(eng);
  free(p);
  free(q);
}

/* The engine frees requests it still holds when freed (no leak under ASan). */
static void test_free_with_pending(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 1);
  uint32_t *p = prompt_seq(1, 20);
  kvr_sim_engine_add(eng, p, 20, 5, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_engine_add(eng, p, 20, 5, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  kvr_sim_engine_free(eng);
  free(p);
}

/* The cost model is a roofline for the dense layers plus additive attention and overheads. */
static void test_cost_roofline(void **state) {
  kvr_sim_cost_t c = {.weights_ms = 20,
                      .dense_tok_us = 100,
                      .step_ms = 1,
                      .per_seq_ms = 0.5,
                      .decode_ctx_ns = 50,
                      .attn_pair_ns = 2};
  kvr_sim_step_t st;
  memset(&st, 0, sizeof(st));
  assert_true(kvr_sim_cost_step(&c, &st) == 0.0); /* nothing scheduled costs nothing */
  /* 10 decodes of 1,000 context: the weights' floor (10 tokens x 100 us = 1 ms is under it) */
  st.num_seqs = st.num_decode = 10;
  st.decode_ctx = 10000;
  assert_float_equal(kvr_sim_cost_step(&c, &st), 20e-3 + 1e-3 + 5e-3 + 0.5e-3, 1e-12);
  /* a 1,000-token prefill chunk on top: compute bound, 1,010 tokens x 100 us */
  st.num_seqs = 11;
  st.prefill_tokens = 1000;
  st.attn_pairs = 1000.0 * 500.5;
  assert_float_equal(kvr_sim_cost_step(&c, &st),
                     101e-3 + 1e-3 + 5.5e-3 + 0.5e-3 + 1000.0 * 500.5 * 2e-9, 1e-12);
}

static kvr_sim_engine_t *frontend_engine(bool async, double req_ms, double tok_us,
                                         double stream_us) {
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  cfg.num_gpu_blocks = 256;
  cfg.max_model_len = 4096;
  cfg.retok_drift = 0;
  cfg.cost = (kvr_sim_cost_t){.weights_ms = 10};
  cfg.frontend = (kvr_sim_frontend_t){.req_ms = req_ms,
                                      .prompt_tok_us = tok_us,
                                      .stream_tok_us = stream_us,
                                      .async_scheduling = async};
  kvr_sim_engine_t *eng = kvr_sim_engine_new(&cfg);
  assert_non_null(eng);
  return eng;
}

/* The API server: requests are ready after templating and tokenization, one at a time; a step's
 * tokens reach the clients after its output processing, one stream at a time. */
static void test_frontend_delays(void **state) {
  kvr_sim_engine_t *eng = frontend_engine(false, 2.0, 10.0, 100.0);
  uint32_t *p = prompt_seq(1, 100), *q = prompt_seq(500, 100);
  assert_true(kvr_sim_engine_next_start(eng) == HUGE_VAL);
  kvr_sim_engine_set_now(eng, 1.0);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, p, 100, 3, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, q, 100, 3, KVR_SIM_FINISH_LENGTH, 2, NULL);
  assert_float_equal(a->arrival_s, 1.0, 1e-12);
  assert_float_equal(a->ready_s, 1.0 + 2e-3 + 1e-3, 1e-12);
  assert_float_equal(b->ready_s, a->ready_s + 3e-3, 1e-12); /* queued behind a */
  /* idle: the first step starts when a is ready, and admits a alone */
  assert_float_equal(kvr_sim_engine_next_start(eng), a->ready_s, 1e-12);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  assert_float_equal(st.start_s, a->ready_s, 1e-12);
  assert_int_equal(a->state, KVR_SIM_RUNNING);
  assert_int_equal(b->state, KVR_SIM_WAITING);
  assert_int_equal(st.num_out, 1);
  assert_float_equal(st.deliver_s, st.start_s + st.duration_s + 100e-6, 1e-12);
  /* next step: back to back, b (ready during the first) joins: two streams to process */
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(b->state, KVR_SIM_RUNNING);
  assert_int_equal(st.num_out, 2);
  assert_float_equal(st.deliver_s, st.start_s + st.duration_s + 200e-6, 1e-12);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_free(eng);
  free(p);
  free(q);
}

/* Async scheduling: a request that arrives while a step runs is admitted one step later than with
 * synchronous scheduling, and a request that stopped on EOS takes part in one more step. */
static void test_async_scheduling(void **state) {
  for (int async = 0; async <= 1; async++) {
    kvr_sim_engine_t *eng = frontend_engine(async, 0, 0, 0);
    uint32_t *p = prompt_seq(1, 40), *q = prompt_seq(500, 40);
    kvr_sim_req_t *a = kvr_sim_engine_add(eng, p, 40, 4, KVR_SIM_FINISH_STOP, 1, NULL);
    kvr_sim_step_t st;
    kvr_sim_engine_step(eng, &st); /* a's prefill, step 1 */
    kvr_sim_engine_set_now(eng, st.start_s + st.duration_s / 2);
    kvr_sim_req_t *b = kvr_sim_engine_add(eng, q, 40, 1, KVR_SIM_FINISH_LENGTH, 2, NULL);
    kvr_sim_engine_step(eng, &st); /* step 2: sync admits b; async scheduled it at step 1 */
    assert_int_equal(b->state, async ? KVR_SIM_WAITING : KVR_SIM_FINISHED);
    kvr_sim_engine_step(eng, &st);
    assert_int_equal(b->state, KVR_SIM_FINISHED);
    for (int i = 0; i < 10 && a->state != KVR_SIM_FINISHED; i++)
      kvr_sim_engine_step(eng, &st);
    assert_int_equal(a->state, KVR_SIM_FINISHED);
    /* the step after a's EOS: async runs a wasted decode for it, sync has nothing to do */
    assert_int_equal(kvr_sim_engine_busy(eng), async);
    if (async) {
      kvr_sim_engine_step(eng, &st);
      assert_int_equal(st.num_seqs, 1);
      assert_int_equal(st.num_decode, 1);
      assert_int_equal(st.decode_ctx, 44);
      assert_int_equal(st.nevents, 0);
      assert_false(kvr_sim_engine_busy(eng));
    }
    kvr_sim_engine_remove(eng, a);
    kvr_sim_engine_remove(eng, b);
    kvr_sim_engine_free(eng);
    free(p);
    free(q);
  }
}

/* Re-tokenization drift: a non-canonical generated token keeps its text but not its id, so a
 * prompt that resends the answer (as canonical ids) stops hitting at the block holding it. */
static void test_retok_drift(void **state) {
  for (int drift = 0; drift <= 1; drift++) {
    kvr_sim_config_t cfg;
    kvr_sim_config_default(&cfg);
    cfg.num_gpu_blocks = 256;
    cfg.max_model_len = 4096;
    memset(&cfg.frontend, 0, sizeof(cfg.frontend));
    cfg.retok_drift = drift;
    kvr_sim_engine_t *eng = kvr_sim_engine_new(&cfg);
    uint32_t *p = prompt_seq(1, 40);
    kvr_sim_req_t *a = kvr_sim_engine_add(eng, p, 40, 60, KVR_SIM_FINISH_LENGTH, 9, NULL);
    run_until_done(eng, a);
    assert_int_equal(a->num_drifted, drift ? 60 : 0);
    /* the next turn: prompt + the answer as the tokenizer gives it + 10 more tokens */
    uint32_t next[110];
    memcpy(next, p, 40 * sizeof(uint32_t));
    for (uint32_t k = 0; k < 60; k++)
      next[40 + k] = kvr_sim_tokens_word_id(9, k);
    for (uint32_t k = 100; k < 110; k++)
      next[k] = 7000 + k;
    kvr_sim_req_t *b = kvr_sim_engine_add(eng, next, 110, 1, KVR_SIM_FINISH_LENGTH, 3, NULL);
    kvr_sim_step_t st;
    kvr_sim_engine_step(eng, &st);
    /* canonical: every block of the 99 computed tokens (6 blocks); drifted: the prompt's 2 full
     * blocks only (the third holds the first generated token) */
    assert_int_equal(b->num_cached, drift ? 32 : 96);
    kvr_sim_engine_remove(eng, a);
    kvr_sim_engine_remove(eng, b);
    kvr_sim_engine_free(eng);
    free(p);
  }
}

/* Probes p[0..n) and checks that nothing changed: counters, the cache's blocks, the eviction
 * order. */
static kvr_sim_probe_t probe(kvr_sim_engine_t *eng, const uint32_t *p, uint32_t n) {
  kvr_sim_stats_t before, after;
  kvr_sim_engine_stats(eng, &before);
  int32_t victim = kvr_sim_engine_next_victim(eng);
  kvr_sim_probe_t pr;
  memset(&pr, 0xAB, sizeof(pr));
  kvr_sim_engine_probe(eng, p, n, &pr);
  kvr_sim_engine_stats(eng, &after);
  assert_memory_equal(&before, &after, sizeof(before));
  assert_int_equal(kvr_sim_engine_next_victim(eng), victim);
  return pr;
}

/* kvr_sim_engine_probe: the cached prefix as admission would find it (full blocks, never the last
 * token), and without changing the cache: the next admission hits exactly what the probe said. */
static void test_probe_cached(void **state) {
  (void)state;
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  uint32_t *p = prompt_seq(1000, 80);
  kvr_sim_probe_t pr = probe(eng, p, 64);
  assert_int_equal(pr.cached_tokens, 0);
  assert_int_equal(pr.pending_tokens, 0);
  assert_int_equal(pr.running + pr.waiting, 0);
  assert_int_equal(pr.decode_ctx, 0);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, p, 64, 3, KVR_SIM_FINISH_LENGTH, 1, NULL);
  run_until_done(eng, a);
  /* 64 prompt + 2 computed outputs: 4 full blocks cached */
  assert_int_equal(probe(eng, p, 64).cached_tokens, 48); /* the block of the last token: no */
  assert_int_equal(probe(eng, p, 65).cached_tokens, 64); /* 4 full blocks before the last */
  assert_int_equal(probe(eng, a->tokens, 67).cached_tokens, 64);
  assert_int_equal(probe(eng, p, 40).cached_tokens, 32);
  assert_int_equal(probe(eng, p, 17).cached_tokens, 16);
  assert_int_equal(probe(eng, p, 16).cached_tokens, 0);
  assert_int_equal(probe(eng, p, 1).cached_tokens, 0);
  assert_int_equal(probe(eng, p, 0).cached_tokens, 0);
  uint32_t *q = prompt_seq(1000, 64);
  q[20] = 7; /* diverges inside the second block */
  assert_int_equal(probe(eng, q, 64).cached_tokens, 16);
  q[0] = 7;
  assert_int_equal(probe(eng, q, 64).cached_tokens, 0);
  /* Probing many times changed nothing: the admission finds what the probe said. */
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, p, 40, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(b->num_cached, 32);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_free(eng);
  /* Without prefix caching nothing is ever cached. */
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  cfg.num_gpu_blocks = 64;
  cfg.max_model_len = 4096;
  cfg.enable_prefix_caching = false;
  memset(&cfg.frontend, 0, sizeof(cfg.frontend));
  eng = kvr_sim_engine_new(&cfg);
  a = kvr_sim_engine_add(eng, p, 64, 3, KVR_SIM_FINISH_LENGTH, 1, NULL);
  run_until_done(eng, a);
  assert_int_equal(probe(eng, p, 64).cached_tokens, 0);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_free(eng);
  free(p);
  free(q);
}

/* kvr_sim_engine_probe: the queues ahead of a new request. Waiting requests count their whole
 * prompt; a running one its prompt tokens the engine has still to prefill (what the next steps
 * schedule as prefill), a decoding one nothing; decode_ctx sums the running contexts. */
static void test_probe_queues(void **state) {
  (void)state;
  kvr_sim_engine_t *eng = small_engine(64, 32, 16); /* 32 tokens per step: chunked prefill */
  uint32_t *pa = prompt_seq(100, 100), *pb = prompt_seq(300, 50), *pc = prompt_seq(500, 20);
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, pa, 100, 5, KVR_SIM_FINISH_LENGTH, 1, NULL);
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, pb, 50, 5, KVR_SIM_FINISH_LENGTH, 2, NULL);
  kvr_sim_probe_t pr = probe(eng, pc, 20);
  assert_int_equal(pr.waiting, 2);
  assert_int_equal(pr.running, 0);
  assert_int_equal(pr.pending_tokens, 150);
  assert_int_equal(pr.decode_ctx, 0);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st); /* a: 32 of its 100 prompt tokens */
  assert_int_equal(st.prefill_tokens, 32);
  assert_int_equal(a->state, KVR_SIM_RUNNING);
  pr = probe(eng, pc, 20);
  assert_int_equal(pr.running, 1);
  assert_int_equal(pr.waiting, 1);
  assert_int_equal(pr.decode_ctx, a->ntokens);
  /* What the engine will still prefill: run it and count. */
  uint64_t still = 0;
  while (b->state != KVR_SIM_RUNNING || b->num_computed < 50) {
    kvr_sim_engine_step(eng, &st);
    still += st.prefill_tokens;
  }
  assert_int_equal(still, 68 + 50);
  assert_int_equal(pr.pending_tokens, still);
  /* Both decoding now: nothing pending, both contexts read. */
  pr = probe(eng, pc, 20);
  assert_int_equal(pr.pending_tokens, 0);
  assert_int_equal(pr.running, 2);
  assert_int_equal(pr.decode_ctx, (uint64_t)a->ntokens + b->ntokens);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  pr = probe(eng, pc, 20);
  assert_int_equal(pr.running + pr.waiting, 0);
  assert_int_equal(pr.pending_tokens, 0);
  kvr_sim_engine_free(eng);
  free(pa);
  free(pb);
  free(pc);
}

/* The KV event log (vLLM's BlockStored / BlockRemoved / AllBlocksCleared): a run of new blocks is
 * one STORED event with its parent link and tokens; a cached prefix is not stored again; each
 * evicted block is one REMOVED; a partial reset reports REMOVED per dropped block, a full one a
 * single CLEARED; turning the log off logs nothing. */
static void test_kv_events(void **state) {
  kvr_sim_engine_t *eng = small_engine(8, 8192, 16);
  assert_null(kvr_sim_engine_kv_log(eng));
  kvr_sim_engine_kv_events(eng, true);
  uint32_t *pa = prompt_seq(100, 40), *pb = prompt_seq(200, 96);
  /* A: 40 prompt tokens + 1 generated: 2 full blocks cached at prefill */
  kvr_sim_req_t *a = kvr_sim_engine_add(eng, pa, 40, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  run_until_done(eng, a);
  const kvr_sim_kv_log_t *log = kvr_sim_engine_kv_log(eng);
  assert_int_equal(log->nev, 1);
  const kvr_sim_kv_event_t *e = &log->ev[0];
  assert_int_equal(e->kind, KVR_SIM_KV_STORED);
  assert_false(e->has_parent);
  assert_int_equal(e->nhashes, 2);
  uint64_t h0 = kvr_sim_block_hash(0, pa, 16), h1 = kvr_sim_block_hash(h0, pa + 16, 16);
  assert_true(log->hashes[e->hash_off] == h0 && log->hashes[e->hash_off + 1] == h1);
  assert_memory_equal(log->tokens + e->tok_off, pa, 32 * sizeof(uint32_t));
  kvr_sim_engine_kv_log_clear(eng);

  /* A's prompt extended by 20 tokens: blocks 0-1 hit, block 2 (tokens 32..47) and 3 are new and
   * chained to h1 */
  uint32_t *pa2 = prompt_seq(100, 64);
  kvr_sim_req_t *a2 = kvr_sim_engine_add(eng, pa2, 64, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  run_until_done(eng, a2);
  assert_int_equal(log->nev, 1);
  e = &log->ev[0];
  assert_true(e->kind == KVR_SIM_KV_STORED && e->has_parent && e->parent == h1);
  assert_int_equal(e->nhashes, 2);
  assert_memory_equal(log->tokens + e->tok_off, pa2 + 32, 32 * sizeof(uint32_t));
  kvr_sim_engine_kv_log_clear(eng);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, a2);

  /* B needs 6 of the 8 blocks: the free list is [6, 7, 2, 5 (none hashed), 4, 3 (A2's cached
   * blocks 3 and 2), ...], so 2 cached blocks go, each one REMOVED, before B's 6 are STORED */
  kvr_sim_req_t *b = kvr_sim_engine_add(eng, pb, 96, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  run_until_done(eng, b);
  size_t removed = 0, stored = 0;
  for (size_t i = 0; i < log->nev; i++) {
    if (log->ev[i].kind == KVR_SIM_KV_REMOVED) {
      assert_int_equal(log->ev[i].nhashes, 1);
      assert_false(kvr_sim_engine_has_hash(eng, log->hashes[log->ev[i].hash_off]));
      assert_int_equal(stored, 0); /* evictions come first: blocks are taken before hashing */
      removed++;
    } else {
      assert_int_equal(log->ev[i].kind, KVR_SIM_KV_STORED);
      stored += log->ev[i].nhashes;
    }
  }
  assert_int_equal(stored, 6);
  assert_int_equal(removed, 2);
  kvr_sim_engine_kv_log_clear(eng);

  /* partial reset (b is still held: not removed) -> REMOVED per dropped block; full -> CLEARED */
  kvr_sim_req_t *r = kvr_sim_engine_add(eng, pb, 64, 50, KVR_SIM_FINISH_LENGTH, 2, NULL);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  kvr_sim_engine_kv_log_clear(eng);
  uint32_t kept = 0;
  uint32_t dropped = kvr_sim_engine_reset_prefix_cache(eng, &kept);
  assert_true(kept > 0);
  assert_int_equal(log->nev, dropped);
  for (size_t i = 0; i < log->nev; i++)
    assert_int_equal(log->ev[i].kind, KVR_SIM_KV_REMOVED);
  kvr_sim_engine_kv_log_clear(eng);
  kvr_sim_engine_remove(eng, r);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_reset_prefix_cache(eng, &kept);
  assert_int_equal(kept, 0);
  assert_int_equal(log->nev, 1);
  assert_int_equal(log->ev[0].kind, KVR_SIM_KV_CLEARED);

  kvr_sim_engine_kv_events(eng, false);
  assert_null(kvr_sim_engine_kv_log(eng));
  kvr_sim_req_t *c = kvr_sim_engine_add(eng, pa, 40, 1, KVR_SIM_FINISH_STOP, 1, NULL);
  run_until_done(eng, c);
  kvr_sim_engine_kv_events(eng, true);
  assert_int_equal(kvr_sim_engine_kv_log(eng)->nev, 0);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_free(eng);
  free(pa);
  free(pa2);
  free(pb);
}

/* Adds prompt[0..n) salted with salt (NULL: none), runs it to its one token and returns the
 * prefix-cache hit it had at admission; the request is removed. */
static int32_t salted_hit(kvr_sim_engine_t *eng, const uint32_t *prompt, uint32_t n,
                          const char *salt) {
  kvr_sim_add_t a = {.prompt = prompt,
                     .nprompt = n,
                     .max_output = 1,
                     .stop_reason = KVR_SIM_FINISH_STOP,
                     .gen_seed = 1,
                     .salt = salt};
  kvr_sim_req_t *r = kvr_sim_engine_add_ex(eng, &a);
  assert_non_null(r);
  run_until_done(eng, r);
  int32_t hit = r->num_cached;
  kvr_sim_engine_remove(eng, r);
  return hit;
}

/* cache_salt (vLLM's kv_cache_utils.py: an extra key of the first block, every later block
 * chained from it): the same prompt shares blocks only with the same salt; the salted chain's
 * first block hashes from kvr_sim_salt_root(salt) instead of 0; "" is no salt. */
static void test_salt_chains(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  uint32_t *p = prompt_seq(500, 48);
  assert_int_equal(salted_hit(eng, p, 48, NULL), 0);
  assert_int_equal(salted_hit(eng, p, 48, "tenant-a"), 0);  /* salted: another chain */
  assert_int_equal(salted_hit(eng, p, 48, "tenant-a"), 32); /* same salt: hit (not the last) */
  assert_int_equal(salted_hit(eng, p, 48, "tenant-b"), 0);
  assert_int_equal(salted_hit(eng, p, 48, NULL), 32);
  assert_int_equal(salted_hit(eng, p, 48, ""), 32); /* an empty salt is none */
  uint64_t root = kvr_sim_salt_root("tenant-a", 8);
  assert_true(root != 0 && root != kvr_sim_salt_root("tenant-b", 8));
  uint64_t h0 = kvr_sim_block_hash(root, p, 16);
  assert_true(kvr_sim_engine_has_hash(eng, h0));
  assert_true(kvr_sim_engine_has_hash(eng, kvr_sim_block_hash(h0, p + 16, 16)));
  assert_true(kvr_sim_engine_has_hash(eng, kvr_sim_block_hash(0, p, 16)));
  /* the probe (the virtual cluster's oracle) sees the unsalted chain */
  kvr_sim_probe_t pr;
  kvr_sim_engine_probe(eng, p, 48, &pr);
  assert_int_equal(pr.cached_tokens, 32);
  kvr_sim_engine_free(eng);
  free(p);
}

/* The STORED event of a salted chain's first block carries the salt; kvr_kv_encode_batch (map
 * encoding) sends it as that block's extra keys ["<salt>"], nil for every other block; a run that
 * starts later in the chain carries none. */
static void test_salt_kv_events(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  kvr_sim_engine_kv_events(eng, true);
  uint32_t *p = prompt_seq(700, 40), *q = prompt_seq(700, 72);
  assert_int_equal(salted_hit(eng, p, 40, "s1"), 0);
  const kvr_sim_kv_log_t *log = kvr_sim_engine_kv_log(eng);
  assert_int_equal(log->nev, 1);
  const kvr_sim_kv_event_t *e = &log->ev[0];
  assert_int_equal(e->nhashes, 2);
  assert_int_equal(e->salt_len, 2);
  assert_memory_equal(log->salts + e->salt_off, "s1", 2);
  assert_true(log->hashes[e->hash_off] == kvr_sim_block_hash(kvr_sim_salt_root("s1", 2), p, 16));

  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kvr_kv_encode_batch(&sb, log, 16, 1.0, 0, KVR_KV_ENCODING_MAP);
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
  const msgpack_object *ev = &u.data.via.array.ptr[1].via.array.ptr[0];
  const msgpack_object *extra = NULL;
  for (uint32_t i = 0; i < ev->via.map.size; i++) {
    const msgpack_object_kv *kv = &ev->via.map.ptr[i];
    if (kv->key.via.str.size == 10 && memcmp(kv->key.via.str.ptr, "extra_keys", 10) == 0)
      extra = &kv->val;
  }
  assert_non_null(extra);
  assert_int_equal(extra->via.array.size, 2);
  const msgpack_object *k0 = &extra->via.array.ptr[0];
  assert_int_equal(k0->type, MSGPACK_OBJECT_ARRAY);
  assert_int_equal(k0->via.array.size, 1);
  assert_int_equal(k0->via.array.ptr[0].type, MSGPACK_OBJECT_STR);
  assert_memory_equal(k0->via.array.ptr[0].via.str.ptr, "s1", 2);
  assert_int_equal(extra->via.array.ptr[1].type, MSGPACK_OBJECT_NIL);
  msgpack_unpacked_destroy(&u);
  msgpack_sbuffer_destroy(&sb);
  kvr_sim_engine_kv_log_clear(eng);

  /* the same salt, a longer prompt: blocks 0-1 hit, the new run starts at block 2, no salt */
  assert_int_equal(salted_hit(eng, q, 72, "s1"), 32);
  assert_int_equal(log->nev, 1);
  assert_true(log->ev[0].has_parent && log->ev[0].salt_len == 0);
  kvr_sim_engine_free(eng);
  free(p);
  free(q);
}

/* A continued answer (gen_offset k) generates word k, k+1, ... of its seed: the ids the uncut
 * answer had from its k-th token on. */
static void test_gen_offset(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  uint32_t *p = prompt_seq(900, 20);
  kvr_sim_add_t a = {.prompt = p,
                     .nprompt = 20,
                     .max_output = 5,
                     .stop_reason = KVR_SIM_FINISH_LENGTH,
                     .gen_seed = 77,
                     .gen_offset = 3};
  kvr_sim_req_t *r = kvr_sim_engine_add_ex(eng, &a);
  run_until_done(eng, r);
  for (uint32_t k = 0; k < 5; k++)
    assert_int_equal(r->tokens[20 + k], kvr_sim_tokens_word_id(77, 3 + k));
  kvr_sim_engine_remove(eng, r);
  kvr_sim_engine_free(eng);
  free(p);
}

/* skip_prefix_read (vLLM's skip_reading_prefix_cache, set by chat echo): no hit at admission and
 * nothing counted in the prefix-cache counters; its blocks are still cached for others. */
static void test_skip_prefix_read(void **state) {
  kvr_sim_engine_t *eng = small_engine(64, 8192, 16);
  uint32_t *p = prompt_seq(1200, 48);
  assert_int_equal(salted_hit(eng, p, 48, NULL), 0);
  kvr_sim_stats_t before, after;
  kvr_sim_engine_stats(eng, &before);
  kvr_sim_add_t a = {.prompt = p,
                     .nprompt = 48,
                     .max_output = 1,
                     .stop_reason = KVR_SIM_FINISH_STOP,
                     .skip_prefix_read = true};
  kvr_sim_req_t *r = kvr_sim_engine_add_ex(eng, &a);
  run_until_done(eng, r);
  assert_int_equal(r->num_cached, 0);
  kvr_sim_engine_stats(eng, &after);
  assert_int_equal(after.prefix_queries, before.prefix_queries);
  assert_int_equal(after.prefix_hits, before.prefix_hits);
  kvr_sim_engine_remove(eng, r);
  assert_int_equal(salted_hit(eng, p, 48, NULL), 32);
  kvr_sim_engine_free(eng);
  free(p);
}

/* ---- LoRA ---- */

static kvr_sim_engine_t *lora_engine(uint32_t max_loras, uint32_t max_cpu_loras) {
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  cfg.num_gpu_blocks = 256;
  cfg.max_model_len = 4096;
  cfg.max_loras = max_loras;
  cfg.max_cpu_loras = max_cpu_loras;
  memset(&cfg.frontend, 0, sizeof(cfg.frontend));
  cfg.retok_drift = 0;
  kvr_sim_engine_t *eng = kvr_sim_engine_new(&cfg);
  assert_non_null(eng);
  return eng;
}

static const char *const lora_names[] = {NULL, "sql-lora", "fr-lora", "code-lora"};

/* A request for prompt[0..n) under adapter id (0: the base model) of rank 16. */
static kvr_sim_req_t *lora_add(kvr_sim_engine_t *eng, const uint32_t *p, uint32_t n, uint32_t id,
                               uint32_t max_output) {
  kvr_sim_add_t a = {.prompt = p,
                     .nprompt = n,
                     .max_output = max_output,
                     .stop_reason = KVR_SIM_FINISH_LENGTH,
                     .gen_seed = 1,
                     .lora_id = id,
                     .lora_rank = 16,
                     .lora_name = lora_names[id]};
  kvr_sim_req_t *r = kvr_sim_engine_add_ex(eng, &a);
  assert_non_null(r);
  return r;
}

/* vLLM v1's scheduler: with max_loras 1, a waiting request for a second adapter is skipped while
 * the first adapter's requests run; requests behind it for the running adapter (or the base
 * model) are still admitted; it is admitted once no request of the first adapter runs. */
static void test_lora_admission(void **state) {
  (void)state;
  kvr_sim_engine_t *eng = lora_engine(1, 1);
  uint32_t *p = prompt_seq(100, 32);
  kvr_sim_req_t *a = lora_add(eng, p, 32, 1, 4);
  kvr_sim_req_t *b = lora_add(eng, p, 32, 2, 4);
  kvr_sim_req_t *c = lora_add(eng, p, 32, 1, 4);
  kvr_sim_req_t *d = lora_add(eng, p, 32, 0, 4);
  kvr_sim_step_t st;
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(a->state, KVR_SIM_RUNNING);
  assert_int_equal(b->state, KVR_SIM_WAITING);
  assert_int_equal(c->state, KVR_SIM_RUNNING);
  assert_int_equal(d->state, KVR_SIM_RUNNING);
  const kvr_sim_req_t *l[4];
  assert_int_equal(kvr_sim_engine_loras(eng, true, l, 4), 1);
  assert_string_equal(l[0]->lora_name, "sql-lora");
  assert_int_equal(kvr_sim_engine_loras(eng, false, l, 4), 1);
  assert_string_equal(l[0]->lora_name, "fr-lora");
  while (a->state == KVR_SIM_RUNNING || c->state == KVR_SIM_RUNNING) {
    assert_int_equal(b->state, KVR_SIM_WAITING);
    kvr_sim_engine_step(eng, &st);
  }
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(b->state, KVR_SIM_RUNNING);
  run_until_done(eng, b);
  kvr_sim_engine_remove(eng, a);
  kvr_sim_engine_remove(eng, b);
  kvr_sim_engine_remove(eng, c);
  kvr_sim_engine_remove(eng, d);
  /* max_loras 2: both adapters in one batch */
  kvr_sim_engine_free(eng);
  eng = lora_engine(2, 2);
  a = lora_add(eng, p, 32, 1, 4);
  b = lora_add(eng, p, 32, 2, 4);
  c = lora_add(eng, p, 32, 3, 4);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(a->state, KVR_SIM_RUNNING);
  assert_int_equal(b->state, KVR_SIM_RUNNING);
  assert_int_equal(c->state, KVR_SIM_WAITING);
  /* an adapter on an engine without LoRA is refused */
  kvr_sim_engine_t *plain = small_engine(64, 8192, 16);
  kvr_sim_add_t x = {
      .prompt = p, .nprompt = 32, .max_output = 1, .lora_id = 1, .lora_name = "sql-lora"};
  assert_null(kvr_sim_engine_add_ex(plain, &x));
  kvr_sim_engine_free(plain);
  kvr_sim_engine_free(eng);
  free(p);
}

/* The swap cost in virtual time: the first step of an adapter not on the GPU costs its copy into
 * a slot (rank x lora_load_ms_per_rank) and, not in the CPU cache either, its read from disk
 * (rank x lora_disk_ms_per_rank) on top of what the same batch costs for the base model; a
 * preloaded adapter (kvr_sim_engine_lora_add, as POST /v1/load_lora_adapter) costs the copy only;
 * the next steps nothing. With one slot, alternating adapters pays a copy each time. */
static void test_lora_swap_cost(void **state) {
  (void)state;
  kvr_sim_engine_t *eng = lora_engine(1, 2);
  const kvr_sim_cost_t *c = &kvr_sim_engine_config(eng)->cost;
  double load = 16 * c->lora_load_ms_per_rank * 1e-3, disk = 16 * c->lora_disk_ms_per_rank * 1e-3;
  assert_true(load > 0 && disk > load);
  uint32_t *p = prompt_seq(200, 64);
  kvr_sim_step_t base, st;
  kvr_sim_req_t *r = lora_add(eng, p, 64, 0, 2);
  kvr_sim_engine_step(eng, &base);
  assert_int_equal(base.lora_loads, 0);
  assert_true(base.lora_s == 0);
  run_until_done(eng, r);
  kvr_sim_engine_remove(eng, r);
  kvr_sim_engine_reset_prefix_cache(eng, NULL);

  r = lora_add(eng, p, 64, 1, 2);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(st.lora_loads, 1);
  assert_int_equal(st.lora_disk_loads, 1);
  assert_true(fabs(st.lora_s - (load + disk)) < 1e-12);
  assert_true(fabs(st.duration_s - (base.duration_s + load + disk)) < 1e-9);
  assert_true(kvr_sim_engine_lora_on_gpu(eng, 1) && kvr_sim_engine_lora_on_cpu(eng, 1));
  kvr_sim_engine_step(eng, &st); /* its decode: the adapter is in its slot */
  assert_int_equal(st.lora_loads, 0);
  assert_true(st.lora_s == 0);
  run_until_done(eng, r);
  kvr_sim_engine_remove(eng, r);

  /* loaded at runtime (POST /v1/load_lora_adapter): read and activated between steps, its time
   * charged to the next step; the request then finds it in its slot */
  assert_true(fabs(kvr_sim_engine_lora_add(eng, 2, 16, true) - (load + disk)) < 1e-12);
  assert_true(kvr_sim_engine_lora_on_cpu(eng, 2) && kvr_sim_engine_lora_on_gpu(eng, 2));
  assert_true(!kvr_sim_engine_lora_on_gpu(eng, 1)); /* one slot: 1 was swapped out */
  assert_true(kvr_sim_engine_lora_on_cpu(eng, 1));  /* still in the CPU cache (2 entries) */
  r = lora_add(eng, p, 64, 2, 1);
  kvr_sim_engine_step(eng, &st);
  assert_int_equal(st.lora_loads, 0);
  assert_true(fabs(st.lora_s - (load + disk)) < 1e-12);
  assert_true(kvr_sim_engine_lora_add(eng, 2, 16, true) == 0); /* there already: nothing */
  run_until_done(eng, r);
  kvr_sim_engine_remove(eng, r);
  r = lora_add(eng, p, 64, 1, 1);
  kvr_sim_engine_step(eng, &st);
  assert_true(fabs(st.lora_s - load) < 1e-12); /* back from the CPU cache: the copy only */
  run_until_done(eng, r);
  kvr_sim_engine_remove(eng, r);
  /* a third adapter evicts the least recently used one (2) from the CPU cache */
  r = lora_add(eng, p, 64, 3, 1);
  kvr_sim_engine_step(eng, &st);
  assert_true(fabs(st.lora_s - (load + disk)) < 1e-12);
  assert_true(!kvr_sim_engine_lora_on_cpu(eng, 2) && kvr_sim_engine_lora_on_cpu(eng, 1));
  run_until_done(eng, r);
  kvr_sim_engine_remove(eng, r);
  kvr_sim_engine_lora_remove(eng, 3);
  assert_true(!kvr_sim_engine_lora_on_cpu(eng, 3) && !kvr_sim_engine_lora_on_gpu(eng, 3));
  kvr_sim_engine_free(eng);
  free(p);
}

static int32_t lora_hit(kvr_sim_engine_t *eng, const uint32_t *p, uint32_t n, uint32_t id) {
  kvr_sim_req_t *r = lora_add(eng, p, n, id, 1);
  run_until_done(eng, r);
  int32_t hit = r->num_cached;
  kvr_sim_engine_remove(eng, r);
  return hit;
}

/* The adapter's name is an extra key of every block: the same prompt shares blocks only under
 * the same adapter; the hashes are the plain chain's with the name's key mixed in. */
static void test_lora_hashes(void **state) {
  (void)state;
  kvr_sim_engine_t *eng = lora_engine(2, 4);
  uint32_t *p = prompt_seq(300, 48);
  assert_int_equal(lora_hit(eng, p, 48, 0), 0);
  assert_int_equal(lora_hit(eng, p, 48, 1), 0);
  assert_int_equal(lora_hit(eng, p, 48, 2), 0);
  assert_int_equal(lora_hit(eng, p, 48, 1), 32);
  assert_int_equal(lora_hit(eng, p, 48, 2), 32);
  assert_int_equal(lora_hit(eng, p, 48, 0), 32);
  uint64_t key = kvr_sim_lora_key("sql-lora", 8);
  assert_true(key != 0 && key != kvr_sim_lora_key("fr-lora", 7));
  uint64_t h0 = kvr_sim_block_hash(key, p, 16);
  assert_true(kvr_sim_engine_has_hash(eng, h0));
  assert_true(kvr_sim_engine_has_hash(eng, kvr_sim_block_hash(h0 ^ key, p + 16, 16)));
  kvr_sim_engine_free(eng);
  free(p);
}

/* Find key in a msgpack map. */
static const msgpack_object *map_get(const msgpack_object *map, const char *key) {
  for (uint32_t i = 0; i < map->via.map.size; i++) {
    const msgpack_object_kv *kv = &map->via.map.ptr[i];
    if (kv->key.via.str.size == strlen(key) &&
        memcmp(kv->key.via.str.ptr, key, kv->key.via.str.size) == 0)
      return &kv->val;
  }
  return NULL;
}

static void assert_str(const msgpack_object *o, const char *s) {
  assert_int_equal(o->type, MSGPACK_OBJECT_STR);
  assert_int_equal(o->via.str.size, strlen(s));
  assert_memory_equal(o->via.str.ptr, s, strlen(s));
}

/* STORED events of an adapter's request carry lora_id and lora_name and, per block, extra keys
 * [name] ([name, salt] for a salted chain's first block), in the map encoding; the array
 * encoding carries lora_id and lora_name at their places. */
static void test_lora_kv_events(void **state) {
  (void)state;
  kvr_sim_engine_t *eng = lora_engine(1, 1);
  kvr_sim_engine_kv_events(eng, true);
  uint32_t *p = prompt_seq(400, 40);
  kvr_sim_add_t a = {.prompt = p,
                     .nprompt = 40,
                     .max_output = 1,
                     .gen_seed = 1,
                     .salt = "s1",
                     .lora_id = 2,
                     .lora_rank = 8,
                     .lora_name = "fr-lora"};
  kvr_sim_req_t *r = kvr_sim_engine_add_ex(eng, &a);
  run_until_done(eng, r);
  kvr_sim_engine_remove(eng, r);
  const kvr_sim_kv_log_t *log = kvr_sim_engine_kv_log(eng);
  assert_int_equal(log->nev, 1);
  assert_int_equal(log->ev[0].lora_id, 2);
  for (int enc = 0; enc < 2; enc++) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    kvr_kv_encode_batch(&sb, log, 16, 1.0, 0,
                        enc == 0 ? KVR_KV_ENCODING_MAP : KVR_KV_ENCODING_ARRAY);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *ev = &u.data.via.array.ptr[1].via.array.ptr[0];
    if (enc == 0) {
      assert_int_equal(map_get(ev, "lora_id")->via.u64, 2);
      assert_str(map_get(ev, "lora_name"), "fr-lora");
      const msgpack_object *extra = map_get(ev, "extra_keys");
      assert_int_equal(extra->via.array.size, 2);
      const msgpack_object *k0 = &extra->via.array.ptr[0], *k1 = &extra->via.array.ptr[1];
      assert_int_equal(k0->via.array.size, 2);
      assert_str(&k0->via.array.ptr[0], "fr-lora");
      assert_str(&k0->via.array.ptr[1], "s1");
      assert_int_equal(k1->via.array.size, 1);
      assert_str(&k1->via.array.ptr[0], "fr-lora");
    } else {
      assert_int_equal(ev->via.array.ptr[5].via.u64, 2);
      assert_str(&ev->via.array.ptr[7], "fr-lora");
    }
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
  }
  kvr_sim_engine_free(eng);
  free(p);
}

/* Data parallel: each rank's publisher endpoints (vLLM's offset_endpoint_port): a tcp port plus
 * the rank, other transports suffixed _dp<rank>, rank 0 unchanged, a tcp endpoint without a
 * numeric port refused. */
static void test_kv_events_rank_endpoints(void **state) {
  (void)state;
  kvr_kv_events_config_t c;
  char err[256];
  kvr_kv_events_config_default(&c);
  snprintf(c.replay_endpoint, sizeof(c.replay_endpoint), "tcp://127.0.0.1:6000");
  kvr_kv_events_config_t r0 = c, r3 = c;
  assert_int_equal(kvr_kv_events_config_for_rank(&r0, 0, err, sizeof(err)), 0);
  assert_string_equal(r0.endpoint, "tcp://*:5557");
  assert_int_equal(kvr_kv_events_config_for_rank(&r3, 3, err, sizeof(err)), 0);
  assert_string_equal(r3.endpoint, "tcp://*:5560");
  assert_string_equal(r3.replay_endpoint, "tcp://127.0.0.1:6003");
  snprintf(c.endpoint, sizeof(c.endpoint), "inproc://cache");
  c.replay_endpoint[0] = '\0';
  assert_int_equal(kvr_kv_events_config_for_rank(&c, 2, err, sizeof(err)), 0);
  assert_string_equal(c.endpoint, "inproc://cache_dp2");
  assert_string_equal(c.replay_endpoint, "");
  snprintf(c.endpoint, sizeof(c.endpoint), "tcp://host");
  assert_int_not_equal(kvr_kv_events_config_for_rank(&c, 1, err, sizeof(err)), 0);
  assert_non_null(strstr(err, "no numeric port"));
}

KVR_TEST_MAIN(cmocka_unit_test(test_defaults), cmocka_unit_test(test_prefix_hits),
              cmocka_unit_test(test_eviction_order), cmocka_unit_test(test_preemption),
              cmocka_unit_test(test_waiting_order),
              cmocka_unit_test(test_budget_and_chunked_prefill),
              cmocka_unit_test(test_max_num_seqs_and_abort),
              cmocka_unit_test(test_free_with_pending), cmocka_unit_test(test_reset_prefix_cache),
              cmocka_unit_test(test_cost_roofline), cmocka_unit_test(test_frontend_delays),
              cmocka_unit_test(test_async_scheduling), cmocka_unit_test(test_retok_drift),
              cmocka_unit_test(test_probe_cached), cmocka_unit_test(test_probe_queues),
              cmocka_unit_test(test_kv_events), cmocka_unit_test(test_salt_chains),
              cmocka_unit_test(test_salt_kv_events), cmocka_unit_test(test_gen_offset),
              cmocka_unit_test(test_skip_prefix_read), cmocka_unit_test(test_lora_admission),
              cmocka_unit_test(test_lora_swap_cost), cmocka_unit_test(test_lora_hashes),
              cmocka_unit_test(test_lora_kv_events),
              cmocka_unit_test(test_kv_events_rank_endpoints))

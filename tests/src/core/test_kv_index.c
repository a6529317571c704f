/* test_kv_index.c -- src/core/kv_index.c: the precise index built from KV events. Batches are built
 * by hand (kv_decode's output form); the request side uses kvr_kv_chain over the same tokens.
 * Salted and adapter requests: vLLM's BlockStored packed with msgpack-c as its publisher sends it,
 * decoded by kv_decode, matched by kvr_kv_chain_salted with kvr_kv_request_salts. */
#include "base/kvr.h"
#include "core/kv_index.h"

#include <msgpack.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

#define BS 4

static void b_reset(kvr_kv_batch_t *b) {
  b->nev = b->nhashes = b->ntokens = 0;
}

static kvr_kv_event_t *b_event(kvr_kv_batch_t *b, kvr_kv_kind_t kind) {
  b->ev = realloc(b->ev, (b->nev + 1) * sizeof(*b->ev));
  kvr_kv_event_t *e = &b->ev[b->nev++];
  memset(e, 0, sizeof(*e));
  e->kind = kind;
  e->group_idx = -1;
  e->hash_off = (uint32_t)b->nhashes;
  e->tok_off = (uint32_t)b->ntokens;
  e->block_size = BS;
  return e;
}

static void b_hash(kvr_kv_batch_t *b, kvr_kv_event_t *e, uint64_t h) {
  b->hashes = realloc(b->hashes, (b->nhashes + 1) * sizeof(uint64_t));
  b->extra = realloc(b->extra, (b->nhashes + 1) * sizeof(uint64_t));
  b->hashes[b->nhashes] = h;
  b->extra[b->nhashes++] = 0;
  e->nhashes++;
}

/* STORED of blocks [first, first + n) of tokens, engine hashes eh[0..n) */
static kvr_kv_event_t *stored(kvr_kv_batch_t *b, const uint32_t *tokens, size_t first, size_t n,
                              const uint64_t *eh, bool has_parent, uint64_t parent) {
  kvr_kv_event_t *e = b_event(b, KVR_KV_STORED);
  e->has_parent = has_parent;
  e->parent = parent;
  for (size_t i = 0; i < n; i++)
    b_hash(b, e, eh[i]);
  b->tokens = realloc(b->tokens, (b->ntokens + n * BS) * sizeof(uint32_t));
  memcpy(b->tokens + b->ntokens, tokens + first * BS, n * BS * sizeof(uint32_t));
  b->ntokens += n * BS;
  e->ntokens = (uint32_t)(n * BS);
  return e;
}

static void removed(kvr_kv_batch_t *b, uint64_t h) {
  kvr_kv_event_t *e = b_event(b, KVR_KV_REMOVED);
  b_hash(b, e, h);
}

static void test_chain_match_remove_clear(void **state) {
  (void)state;
  kvr_kv_index_t *idx = kvr_kv_index_new(2);
  uint32_t toks[5 * BS];
  for (size_t i = 0; i < KVR_ARRAY_SIZE(toks); i++)
    toks[i] = 1000 + (uint32_t)i;
  uint64_t chain[5];
  assert_int_equal(kvr_kv_chain(toks, KVR_ARRAY_SIZE(toks) - 1, BS, chain), 4); /* full only */
  assert_int_equal(kvr_kv_chain(toks, KVR_ARRAY_SIZE(toks), BS, chain), 5);

  kvr_kv_batch_t b;
  memset(&b, 0, sizeof(b));
  uint64_t eh[5] = {0xa1, 0xa2, 0, 0xa4, 0xa5}; /* engine hash 0 is a valid hash too */
  stored(&b, toks, 0, 2, eh, false, 0);
  stored(&b, toks, 2, 2, eh + 2, true, 0xa2); /* second run chained by the engine's parent */
  kvr_kv_index_apply(idx, 0, &b);
  assert_int_equal(kvr_kv_index_blocks(idx, 0), 4);
  assert_int_equal(kvr_kv_index_block_size(idx, 0), BS);
  assert_int_equal(kvr_kv_index_match(idx, 0, chain, 5), 4);
  assert_int_equal(kvr_kv_index_match(idx, 1, chain, 5), 0); /* the other worker holds nothing */

  /* an orphan run (unknown parent) is skipped */
  b_reset(&b);
  stored(&b, toks, 4, 1, eh + 4, true, 0xdead);
  kvr_kv_index_apply(idx, 0, &b);
  assert_int_equal(kvr_kv_index_stats(idx, 0)->orphan_events, 1);
  assert_int_equal(kvr_kv_index_match(idx, 0, chain, 5), 4);

  /* removing the second block cuts the prefix there; an unknown removal is counted */
  b_reset(&b);
  removed(&b, 0xa2);
  removed(&b, 0x77);
  kvr_kv_index_apply(idx, 0, &b);
  assert_int_equal(kvr_kv_index_match(idx, 0, chain, 5), 1);
  assert_int_equal(kvr_kv_index_blocks(idx, 0), 3);
  const kvr_kv_apply_stats_t *st = kvr_kv_index_stats(idx, 0);
  assert_int_equal(st->stored_blocks, 4);
  assert_int_equal(st->removed_blocks, 1);
  assert_int_equal(st->unknown_removed, 1);

  /* a cleared worker holds nothing; its engine map is gone too (a child is then an orphan) */
  b_reset(&b);
  b_event(&b, KVR_KV_CLEARED);
  stored(&b, toks, 4, 1, eh + 4, true, 0xa4);
  kvr_kv_index_apply(idx, 0, &b);
  assert_int_equal(kvr_kv_index_blocks(idx, 0), 0);
  assert_int_equal(kvr_kv_index_match(idx, 0, chain, 5), 0);
  assert_int_equal(kvr_kv_index_stats(idx, 0)->clears, 1);
  assert_int_equal(kvr_kv_index_stats(idx, 0)->orphan_events, 2);
  kvr_kv_batch_free(&b);
  kvr_kv_index_free(idx);
}

static void test_salts_groups_and_block_size(void **state) {
  (void)state;
  kvr_kv_index_t *idx = kvr_kv_index_new(1);
  uint32_t toks[2 * BS];
  for (size_t i = 0; i < KVR_ARRAY_SIZE(toks); i++)
    toks[i] = 7 + (uint32_t)i;
  uint64_t chain[2];
  kvr_kv_chain(toks, KVR_ARRAY_SIZE(toks), BS, chain);
  kvr_kv_batch_t b;
  memset(&b, 0, sizeof(b));
  /* the same tokens under a LoRA adapter, and with an extra key on block 1: no base match */
  uint64_t e1[2] = {1, 2}, e2[2] = {3, 4};
  stored(&b, toks, 0, 2, e1, false, 0)->lora_salt = 0x1234567;
  kvr_kv_event_t *x = stored(&b, toks, 0, 2, e2, false, 0);
  x->has_extra = true;
  b.extra[x->hash_off + 1] = 0x99;
  kvr_kv_index_apply(idx, 0, &b);
  assert_int_equal(kvr_kv_index_blocks(idx, 0), 4);
  assert_int_equal(kvr_kv_index_match(idx, 0, chain, 2), 1); /* block 0 of e2 is plain */

  /* groups: group 0 is indexed first, group 1's events are skipped (hashes collide across) */
  b_reset(&b);
  uint64_t g0[1] = {10}, g1[1] = {11};
  stored(&b, toks, 0, 1, g0, false, 0)->group_idx = 0;
  stored(&b, toks, 1, 1, g1, false, 0)->group_idx = 1;
  kvr_kv_index_t *gi = kvr_kv_index_new(1);
  kvr_kv_index_apply(gi, 0, &b);
  assert_int_equal(kvr_kv_index_blocks(gi, 0), 1);
  assert_int_equal(kvr_kv_index_stats(gi, 0)->other_group, 1);
  kvr_kv_index_free(gi);

  /* another block size resets the worker */
  b_reset(&b);
  uint64_t big[1] = {20};
  kvr_kv_event_t *e = stored(&b, toks, 0, 1, big, false, 0);
  e->block_size = 2 * BS;
  e->ntokens = 2 * BS;
  b.ntokens = 2 * BS;
  b.tokens = realloc(b.tokens, sizeof(toks));
  memcpy(b.tokens, toks, sizeof(toks));
  kvr_kv_index_apply(idx, 0, &b);
  assert_int_equal(kvr_kv_index_blocks(idx, 0), 1);
  assert_int_equal(kvr_kv_index_block_size(idx, 0), 2 * BS);
  assert_int_equal(kvr_kv_index_stats(idx, 0)->block_size_change, 1);
  kvr_kv_batch_free(&b);
  kvr_kv_index_free(idx);
}

/* The tables against a plain array model: 20,000 random stores and removals of single-block
 * chains (every block a root), with growth and backward-shift deletion exercised throughout. */
static void test_tables_against_model(void **state) {
  (void)state;
  enum { N = 4096, OPS = 20000 };
  kvr_kv_index_t *idx = kvr_kv_index_new(1);
  bool *held = calloc(N, sizeof(bool));
  size_t nheld = 0;
  kvr_kv_batch_t b;
  memset(&b, 0, sizeof(b));
  uint64_t rng = 12345;
  for (int op = 0; op < OPS; op++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t k = (uint32_t)(rng >> 33) % N;
    uint32_t toks[BS] = {k, k + 1, k + 2, k + 3};
    uint64_t eh = (uint64_t)k * 0x100000001ull; /* engine hashes with structure, incl. 0 */
    b_reset(&b);
    if (!held[k]) {
      stored(&b, toks, 0, 1, &eh, false, 0);
      held[k] = true;
      nheld++;
    } else {
      removed(&b, eh);
      held[k] = false;
      nheld--;
    }
    kvr_kv_index_apply(idx, 0, &b);
    assert_int_equal(kvr_kv_index_blocks(idx, 0), nheld);
    if (op % 1000 == 999) {
      for (uint32_t j = 0; j < N; j++) {
        uint32_t t[BS] = {j, j + 1, j + 2, j + 3};
        uint64_t c;
        kvr_kv_chain(t, BS, BS, &c);
        assert_int_equal(kvr_kv_index_match(idx, 0, &c, 1), held[j] ? 1 : 0);
      }
    }
  }
  kvr_kv_batch_free(&b);
  free(held);
  kvr_kv_index_free(idx);
}

static void pack_s(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

/* One EventBatch [ts, [BlockStored], 0] of two blocks of BS tokens (1..8), vLLM's tagged-array
 * form [tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys], the
 * extra keys of a request naming adapter lora (NULL: none) with cache_salt salt (NULL: none). */
static void stored_salted(kvr_kv_batch_t *b, const char *lora, const char *salt) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, 1.0);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_array(&pk, 9);
  pack_s(&pk, "BlockStored");
  msgpack_pack_array(&pk, 2);
  msgpack_pack_uint64(&pk, 0xaa01);
  msgpack_pack_uint64(&pk, 0xaa02);
  msgpack_pack_nil(&pk);
  msgpack_pack_array(&pk, 2 * BS);
  for (uint32_t t = 1; t <= 2 * BS; t++)
    msgpack_pack_uint32(&pk, t);
  msgpack_pack_uint32(&pk, BS);
  if (lora)
    msgpack_pack_uint32(&pk, 1);
  else
    msgpack_pack_nil(&pk);
  msgpack_pack_nil(&pk); /* medium */
  if (lora)
    pack_s(&pk, lora);
  else
    msgpack_pack_nil(&pk);
  msgpack_pack_array(&pk, 2); /* extra_keys, one entry per block */
  for (int blk = 0; blk < 2; blk++) {
    size_t n = (lora != NULL) + (blk == 0 && salt != NULL);
    if (n == 0) {
      msgpack_pack_nil(&pk);
      continue;
    }
    msgpack_pack_array(&pk, n);
    if (lora)
      pack_s(&pk, lora);
    if (blk == 0 && salt)
      pack_s(&pk, salt);
  }
  msgpack_pack_int(&pk, 0);
  char err[128];
  assert_int_equal(kvr_kv_decode_batch(sb.data, sb.size, b, err, sizeof err), 0);
  msgpack_sbuffer_destroy(&sb);
}

/* A request matches exactly the blocks stored under its own adapter and cache_salt: the chain of
 * kvr_kv_request_salts(lora, salt) meets both blocks of an event stored with the same, no block of
 * an event stored with another adapter, salt or none (a different first block breaks the chain). */
static void test_request_salts_match_events(void **state) {
  (void)state;
  const char *loras[] = {NULL, "sql", "chat"}, *salts[] = {NULL, "tenant-a", "tenant-b"};
  uint32_t toks[2 * BS];
  for (uint32_t t = 0; t < 2 * BS; t++)
    toks[t] = t + 1;
  for (size_t sl = 0; sl < 3; sl++)
    for (size_t ss = 0; ss < 3; ss++) {
      kvr_kv_batch_t b;
      memset(&b, 0, sizeof b);
      stored_salted(&b, loras[sl], salts[ss]);
      kvr_kv_index_t *idx = kvr_kv_index_new(1);
      kvr_kv_index_apply(idx, 0, &b);
      assert_int_equal(kvr_kv_index_blocks(idx, 0), 2);
      for (size_t rl = 0; rl < 3; rl++)
        for (size_t rs = 0; rs < 3; rs++) {
          kvr_kv_salts_t k;
          kvr_kv_request_salts(loras[rl], salts[rs], &k);
          uint64_t chain[2];
          assert_int_equal(kvr_kv_chain_salted(toks, 2 * BS, BS, &k, chain), 2);
          size_t want = rl == sl && rs == ss ? 2 : 0;
          assert_int_equal(kvr_kv_index_match(idx, 0, chain, 2), want);
        }
      kvr_kv_salts_t none;
      kvr_kv_request_salts(NULL, NULL, &none);
      assert_true(none.first == 0 && none.rest == 0); /* the plain chain */
      kvr_kv_index_free(idx);
      kvr_kv_batch_free(&b);
    }
}

KVR_TEST_MAIN(cmocka_unit_test(test_chain_match_remove_clear),
              cmocka_unit_test(test_salts_groups_and_block_size),
              cmocka_unit_test(test_tables_against_model),
              cmocka_unit_test(test_request_salts_match_events))

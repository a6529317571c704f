/* fuzz_kv_events.c -- libFuzzer target: a KV-event payload from the network (the msgpack third
 * frame of a vLLM live message or replay reply) through the decoder (src/proto/kv_decode.c) and
 * into the precise index (src/core/kv_index.c), as the router applies it.
 *
 * The input is the payload's exact bytes. Invariants:
 *   - the decode is 0 or -1; after -1 the batch holds no events; deterministic (decoding the same
 *     bytes into a reused batch gives the same events, hashes, tokens and skip counts);
 *   - every kept event is well formed: its hashes and tokens lie inside the batch's arrays, a
 *     BlockStored has blocks x block_size tokens, a block size > 0;
 *   - applying the batch to an index twice from the same start gives the same blocks (the index
 *     is a function of the events); the stored blocks never exceed the stored events' hashes;
 *   - a cleared worker (AllBlocksCleared last) holds nothing; a chain built from a kept
 *     BlockStored without parent (and with distinct hashes: a hash stored twice keeps its newest
 *     content) matches at least its first block right after it is applied.
 */
#include "fuzz_util.h"

#include "core/kv_index.h"
#include "proto/kv_decode.h"

static void check_batch(const kvr_kv_batch_t *b) {
  for (size_t i = 0; i < b->nev; i++) {
    const kvr_kv_event_t *e = &b->ev[i];
    FUZZ_CHECK((size_t)e->hash_off + e->nhashes <= b->nhashes);
    if (e->kind == KVR_KV_STORED) {
      FUZZ_CHECK(e->block_size > 0 && e->nhashes > 0);
      FUZZ_CHECK((uint64_t)e->ntokens == (uint64_t)e->nhashes * e->block_size);
      FUZZ_CHECK((size_t)e->tok_off + e->ntokens <= b->ntokens);
    } else {
      FUZZ_CHECK(e->ntokens == 0);
    }
    if (e->kind == KVR_KV_CLEARED)
      FUZZ_CHECK(e->nhashes == 0);
  }
}

static bool same_batch(const kvr_kv_batch_t *a, const kvr_kv_batch_t *b) {
  return a->nev == b->nev && a->nhashes == b->nhashes && a->ntokens == b->ntokens &&
         a->dp_rank == b->dp_rank && memcmp(a->skipped, b->skipped, sizeof(a->skipped)) == 0 &&
         (a->nev == 0 || memcmp(a->ev, b->ev, a->nev * sizeof(*a->ev)) == 0) &&
         (a->nhashes == 0 || memcmp(a->hashes, b->hashes, a->nhashes * sizeof(uint64_t)) == 0) &&
         (a->ntokens == 0 || memcmp(a->tokens, b->tokens, a->ntokens * sizeof(uint32_t)) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  /* an exact-size copy: a read past the payload is an ASan error */
  uint8_t *buf = malloc(len ? len : 1);
  if (buf == NULL)
    abort();
  if (len)
    memcpy(buf, data, len);
  static kvr_kv_batch_t reused; /* kept across inputs: reuse must not leak old events */
  kvr_kv_batch_t fresh;
  memset(&fresh, 0, sizeof(fresh));
  char err[128];
  int rc = kvr_kv_decode_batch(buf, len, &fresh, err, sizeof(err));
  int rc2 = kvr_kv_decode_batch(buf, len, &reused, err, sizeof(err));
  FUZZ_CHECK(rc == 0 || rc == -1);
  FUZZ_CHECK(rc == rc2);
  if (rc != 0)
    FUZZ_CHECK(fresh.nev == 0);
  FUZZ_CHECK(same_batch(&fresh, &reused));
  check_batch(&fresh);

  if (rc == 0) {
    kvr_kv_index_t *a = kvr_kv_index_new(1), *b = kvr_kv_index_new(1);
    kvr_kv_index_apply(a, 0, &fresh);
    kvr_kv_index_apply(b, 0, &fresh);
    FUZZ_CHECK(kvr_kv_index_blocks(a, 0) == kvr_kv_index_blocks(b, 0));
    size_t stored = 0;
    for (size_t i = 0; i < fresh.nev; i++)
      if (fresh.ev[i].kind == KVR_KV_STORED)
        stored += fresh.ev[i].nhashes;
    FUZZ_CHECK(kvr_kv_index_blocks(a, 0) <= stored);
    if (fresh.nev > 0 && fresh.ev[fresh.nev - 1].kind == KVR_KV_CLEARED)
      FUZZ_CHECK(kvr_kv_index_blocks(a, 0) == 0);
    /* the first kept root run, applied alone to an empty index, is found by its own chain */
    for (size_t i = 0; i < fresh.nev; i++) {
      const kvr_kv_event_t *e = &fresh.ev[i];
      if (e->kind != KVR_KV_STORED || e->has_parent || e->lora_salt || e->has_extra)
        continue;
      /* a hash repeated inside the run: the engine re-stored it and the newest content wins,
       * so the first block is (rightly) not found under it */
      bool distinct = true;
      for (uint32_t u = 0; u < e->nhashes && distinct; u++)
        for (uint32_t v = u + 1; v < e->nhashes && distinct; v++)
          distinct = fresh.hashes[e->hash_off + u] != fresh.hashes[e->hash_off + v];
      if (!distinct)
        break;
      kvr_kv_batch_t one = fresh;
      one.ev = (kvr_kv_event_t *)e;
      one.nev = 1;
      kvr_kv_index_t *c = kvr_kv_index_new(1);
      kvr_kv_index_apply(c, 0, &one);
      uint64_t h;
      FUZZ_CHECK(kvr_kv_chain(fresh.tokens + e->tok_off, e->block_size, e->block_size, &h) == 1);
      FUZZ_CHECK(kvr_kv_index_match(c, 0, &h, 1) == 1);
      kvr_kv_index_free(c);
      break;
    }
    kvr_kv_index_free(a);
    kvr_kv_index_free(b);
  }
  kvr_kv_batch_free(&fresh);
  free(buf);
  return 0;
}

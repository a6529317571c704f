/* test_kv_decode.c -- src/proto/kv_decode.c: vLLM EventBatch payloads, packed here with msgpack-c
 * as vLLM's msgspec encoder packs them, in both encodings and mixed, with every hash form, unknown
 * fields and types, offload media, hybrid groups, LoRA and extra keys, and malformed input. */
#include "proto/kv_decode.h"

#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

typedef struct packer_s {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} packer_t;

static void pk_init(packer_t *p) {
  msgpack_sbuffer_init(&p->sb);
  msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
}

static void str(packer_t *p, const char *s) {
  msgpack_pack_str(&p->pk, strlen(s));
  msgpack_pack_str_body(&p->pk, s, strlen(s));
}

static void u64s(packer_t *p, const uint64_t *v, size_t n) {
  msgpack_pack_array(&p->pk, n);
  for (size_t i = 0; i < n; i++)
    msgpack_pack_uint64(&p->pk, v[i]);
}

static void tokens(packer_t *p, uint32_t first, size_t n) {
  msgpack_pack_array(&p->pk, n);
  for (size_t i = 0; i < n; i++)
    msgpack_pack_uint32(&p->pk, first + (uint32_t)i);
}

/* batch header: [ts, [<nev events follow>], 0] -- the caller packs nev events then the rank */
static void batch_begin(packer_t *p, size_t nev) {
  msgpack_pack_array(&p->pk, 3);
  msgpack_pack_double(&p->pk, 1700000000.5);
  msgpack_pack_array(&p->pk, nev);
}

static int decode(packer_t *p, kvr_kv_batch_t *b) {
  char err[128];
  return kvr_kv_decode_batch(p->sb.data, p->sb.size, b, err, sizeof(err));
}

static void test_map_and_array_mixed(void **state) {
  (void)state;
  packer_t p;
  pk_init(&p);
  uint64_t h[2] = {15760518052499183552ull, 42};
  batch_begin(&p, 4);
  /* map BlockStored, key order shuffled, an unknown key, a future field */
  msgpack_pack_map(&p.pk, 9);
  str(&p, "token_ids");
  tokens(&p, 100, 8);
  str(&p, "type");
  str(&p, "BlockStored");
  str(&p, "block_hashes");
  u64s(&p, h, 2);
  str(&p, "parent_block_hash");
  msgpack_pack_nil(&p.pk);
  str(&p, "block_size");
  msgpack_pack_uint32(&p.pk, 4);
  str(&p, "medium");
  str(&p, "GPU");
  str(&p, "some_future_field");
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_int(&p.pk, 1);
  msgpack_pack_int(&p.pk, 2);
  str(&p, "group_idx");
  msgpack_pack_uint32(&p.pk, 0);
  str(&p, "kv_cache_spec_kind");
  str(&p, "full_attention");
  /* array BlockStored (vLLM 0.23) with a parent as int64 and 2 unknown trailing fields */
  msgpack_pack_array(&p.pk, 13);
  str(&p, "BlockStored");
  u64s(&p, (uint64_t[]){7}, 1);
  msgpack_pack_int64(&p.pk, -2); /* parent as int64 bits */
  tokens(&p, 200, 4);
  msgpack_pack_uint32(&p.pk, 4);
  msgpack_pack_nil(&p.pk); /* lora_id */
  msgpack_pack_nil(&p.pk); /* medium nil = GPU */
  msgpack_pack_nil(&p.pk); /* lora_name */
  msgpack_pack_nil(&p.pk); /* extra_keys */
  msgpack_pack_uint32(&p.pk, 0);
  str(&p, "full_attention");
  msgpack_pack_nil(&p.pk);
  str(&p, "later");
  /* array BlockRemoved with a 32-byte bin hash: the last 8 bytes big-endian */
  msgpack_pack_array(&p.pk, 3);
  str(&p, "BlockRemoved");
  msgpack_pack_array(&p.pk, 1);
  unsigned char bin[32];
  memset(bin, 0xee, sizeof(bin));
  for (int i = 0; i < 8; i++)
    bin[24 + i] = (unsigned char)(i + 1);
  msgpack_pack_bin(&p.pk, sizeof(bin));
  msgpack_pack_bin_body(&p.pk, bin, sizeof(bin));
  str(&p, "GPU");
  /* map AllBlocksCleared */
  msgpack_pack_map(&p.pk, 1);
  str(&p, "type");
  str(&p, "AllBlocksCleared");
  msgpack_pack_uint32(&p.pk, 3); /* data-parallel rank */

  kvr_kv_batch_t b;
  memset(&b, 0, sizeof(b));
  assert_int_equal(decode(&p, &b), 0);
  assert_true(b.ts > 1700000000.4 && b.ts < 1700000000.6);
  assert_int_equal(b.dp_rank, 3);
  assert_int_equal(b.nev, 4);
  const kvr_kv_event_t *e = &b.ev[0];
  assert_int_equal(e->kind, KVR_KV_STORED);
  assert_int_equal(e->nhashes, 2);
  assert_true(b.hashes[e->hash_off] == h[0] && b.hashes[e->hash_off + 1] == 42);
  assert_false(e->has_parent);
  assert_int_equal(e->block_size, 4);
  assert_int_equal(e->ntokens, 8);
  assert_int_equal(b.tokens[e->tok_off + 7], 107);
  assert_int_equal(e->group_idx, 0);
  assert_int_equal(e->lora_salt, 0);
  e = &b.ev[1];
  assert_true(e->kind == KVR_KV_STORED && e->has_parent && e->parent == (uint64_t)-2);
  assert_int_equal(b.tokens[e->tok_off], 200);
  e = &b.ev[2];
  assert_int_equal(e->kind, KVR_KV_REMOVED);
  assert_int_equal(b.hashes[e->hash_off], 0x0102030405060708ull);
  assert_int_equal(b.ev[3].kind, KVR_KV_CLEARED);
  for (int i = 0; i < KVR_KV_SKIP_COUNT; i++)
    assert_int_equal(b.skipped[i], 0);

  /* the batch is reused: a second decode starts from empty */
  assert_int_equal(decode(&p, &b), 0);
  assert_int_equal(b.nev, 4);
  kvr_kv_batch_free(&b);
  msgpack_sbuffer_destroy(&p.sb);
}

static void test_skips_keep_the_batch(void **state) {
  (void)state;
  packer_t p;
  pk_init(&p);
  batch_begin(&p, 7);
  /* 1: CPU offload tier */
  msgpack_pack_map(&p.pk, 5);
  str(&p, "type");
  str(&p, "BlockStored");
  str(&p, "block_hashes");
  u64s(&p, (uint64_t[]){1}, 1);
  str(&p, "token_ids");
  tokens(&p, 0, 4);
  str(&p, "block_size");
  msgpack_pack_uint32(&p.pk, 4);
  str(&p, "medium");
  str(&p, "CPU");
  /* 2: a sliding-window group */
  msgpack_pack_map(&p.pk, 5);
  str(&p, "type");
  str(&p, "BlockStored");
  str(&p, "block_hashes");
  u64s(&p, (uint64_t[]){2}, 1);
  str(&p, "token_ids");
  tokens(&p, 0, 4);
  str(&p, "block_size");
  msgpack_pack_uint32(&p.pk, 4);
  str(&p, "kv_cache_spec_kind");
  str(&p, "sliding_window");
  /* 3: no kind and fewer tokens than blocks x size (a mamba-like group): skipped as a group */
  msgpack_pack_map(&p.pk, 4);
  str(&p, "type");
  str(&p, "BlockStored");
  str(&p, "block_hashes");
  u64s(&p, (uint64_t[]){3, 4}, 2);
  str(&p, "token_ids");
  tokens(&p, 0, 4);
  str(&p, "block_size");
  msgpack_pack_uint32(&p.pk, 4);
  /* 4: an unknown event type */
  msgpack_pack_map(&p.pk, 2);
  str(&p, "type");
  str(&p, "BlockMigrated");
  str(&p, "block_hashes");
  u64s(&p, (uint64_t[]){5}, 1);
  /* 5: malformed: hashes not an array */
  msgpack_pack_array(&p.pk, 3);
  str(&p, "BlockRemoved");
  msgpack_pack_uint32(&p.pk, 9);
  str(&p, "GPU");
  /* 6: malformed: not a map nor an array */
  msgpack_pack_uint32(&p.pk, 17);
  /* 7: a good one after all of these, with a LoRA and extra keys */
  msgpack_pack_map(&p.pk, 6);
  str(&p, "type");
  str(&p, "BlockStored");
  str(&p, "block_hashes");
  u64s(&p, (uint64_t[]){6, 7}, 2);
  str(&p, "token_ids");
  tokens(&p, 0, 8);
  str(&p, "block_size");
  msgpack_pack_uint32(&p.pk, 4);
  str(&p, "lora_name");
  str(&p, "sql-adapter");
  str(&p, "extra_keys");
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_array(&p.pk, 1);
  str(&p, "salt-1");
  msgpack_pack_nil(&p.pk);
  msgpack_pack_nil(&p.pk);

  kvr_kv_batch_t b;
  memset(&b, 0, sizeof(b));
  assert_int_equal(decode(&p, &b), 0);
  assert_int_equal(b.dp_rank, -1);
  assert_int_equal(b.nev, 1);
  assert_int_equal(b.skipped[KVR_KV_SKIP_MEDIUM], 1);
  assert_int_equal(b.skipped[KVR_KV_SKIP_GROUP], 2);
  assert_int_equal(b.skipped[KVR_KV_SKIP_UNKNOWN_TYPE], 1);
  assert_int_equal(b.skipped[KVR_KV_SKIP_MALFORMED], 2);
  const kvr_kv_event_t *e = &b.ev[0];
  assert_int_equal(e->nhashes, 2);
  assert_int_equal(b.hashes[e->hash_off], 6); /* skipped events left nothing behind */
  assert_int_equal(b.ntokens, 8);
  assert_true(e->lora_salt != 0 && e->has_extra);
  assert_true(b.extra[e->hash_off] != 0 && b.extra[e->hash_off + 1] == 0);
  assert_string_equal(kvr_kv_skip_name(KVR_KV_SKIP_GROUP), "group");
  kvr_kv_batch_free(&b);
  msgpack_sbuffer_destroy(&p.sb);
}

static void test_not_a_batch(void **state) {
  (void)state;
  kvr_kv_batch_t b;
  memset(&b, 0, sizeof(b));
  char err[128];
  assert_int_equal(kvr_kv_decode_batch("", 0, &b, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "truncated"));
  packer_t p;
  pk_init(&p);
  msgpack_pack_map(&p.pk, 0);
  assert_int_equal(kvr_kv_decode_batch(p.sb.data, p.sb.size, &b, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "EventBatch"));
  /* containers that claim more elements than the payload has bytes are refused before msgpack-c
   * allocates for them (array32 of 2^32 - 1, map32 inside a batch) */
  assert_int_equal(kvr_kv_decode_batch("\xdd\xff\xff\xff\xff", 5, &b, err, sizeof(err)), -1);
  assert_int_equal(kvr_kv_decode_batch("\x93\xcb\0\0\0\0\0\0\0\0\xdf\x7f\xff\xff\xff\xc0", 15, &b,
                                       err, sizeof(err)),
                   -1);
  /* a batch cut in the middle */
  msgpack_sbuffer_clear(&p.sb);
  batch_begin(&p, 1);
  msgpack_pack_array(&p.pk, 1);
  str(&p, "AllBlocksCleared");
  assert_int_equal(kvr_kv_decode_batch(p.sb.data, p.sb.size - 3, &b, err, sizeof(err)), -1);
  assert_int_equal(b.nev, 0);
  /* the old two-element batch (no rank) */
  msgpack_sbuffer_clear(&p.sb);
  msgpack_pack_array(&p.pk, 2);
  msgpack_pack_double(&p.pk, 1.0);
  msgpack_pack_array(&p.pk, 1);
  msgpack_pack_array(&p.pk, 1);
  str(&p, "AllBlocksCleared");
  assert_int_equal(kvr_kv_decode_batch(p.sb.data, p.sb.size, &b, err, sizeof(err)), 0);
  assert_int_equal(b.nev, 1);
  assert_int_equal(b.dp_rank, -1);
  kvr_kv_batch_free(&b);
  kvr_kv_batch_free(NULL);
  msgpack_sbuffer_destroy(&p.sb);
}

KVR_TEST_MAIN(cmocka_unit_test(test_map_and_array_mixed),
              cmocka_unit_test(test_skips_keep_the_batch), cmocka_unit_test(test_not_a_batch))

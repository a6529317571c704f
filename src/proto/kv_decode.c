/* kv_decode.c -- vLLM KV-cache EventBatch (msgpack) -> kvr_kv_batch_t (see kv_decode.h).
 *
 * msgpack-c unpacks the payload into an object tree (msgpack_unpack_next, one zone per call);
 * each event is read into a fields_t of pointers into that tree (from its map keys or its array
 * positions), then checked and copied into the batch's flat arrays. The tree is freed before
 * returning, so nothing in the batch points into the payload.
 */
#include "proto/kv_decode.h"

#include "base/kvr.h"

#include <msgpack.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static const char *const skip_names[] = {
#define KVR__KV_SKIP_STR(name, str) str,
    KVR_KV_SKIP_MAP(KVR__KV_SKIP_STR)
#undef KVR__KV_SKIP_STR
};

const char *kvr_kv_skip_name(kvr_kv_skip_t r) {
  return (unsigned)r < KVR_KV_SKIP_COUNT ? skip_names[r] : "?";
}

/* The fields of one event, whichever encoding it came in; NULL = absent. */
typedef struct fields_s {
  const msgpack_object *hashes, *parent, *tokens, *block_size, *lora_id, *medium, *lora_name,
      *extra_keys, *group_idx, *kind;
} fields_t;

static bool str_is(const msgpack_object *o, const char *s) {
  size_t n = strlen(s);
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

static bool is_nil(const msgpack_object *o) {
  return o == NULL || o->type == MSGPACK_OBJECT_NIL;
}

/* vLLM's ExternalBlockHash forms: uint64, int64 bits, or bytes whose last 8 are the hash. */
static bool read_hash(const msgpack_object *o, uint64_t *out) {
  const char *p = NULL;
  size_t n = 0;
  switch (o->type) {
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    *out = o->via.u64;
    return true;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    *out = (uint64_t)o->via.i64;
    return true;
  case MSGPACK_OBJECT_BIN:
    p = o->via.bin.ptr;
    n = o->via.bin.size;
    break;
  case MSGPACK_OBJECT_STR:
    p = o->via.str.ptr;
    n = o->via.str.size;
    break;
  default:
    return false;
  }
  if (n == 0)
    return false;
  uint64_t v = 0;
  for (size_t i = n > 8 ? n - 8 : 0; i < n; i++)
    v = v << 8 | (unsigned char)p[i];
  *out = v;
  return true;
}

static uint64_t salt_of_object(const msgpack_object *o) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_object(&pk, *o);
  uint64_t h = XXH3_64bits(sb.data, sb.size) | 1; /* never 0, which means "no salt" */
  msgpack_sbuffer_destroy(&sb);
  return h;
}

/* salt_of_object() of an array of the n strings s, built rather than decoded (the same bytes:
 * msgpack_pack_object packs a decoded array of strings with these calls). */
static uint64_t salt_of_strings(const char *const *s, size_t n) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, n);
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(s[i]);
    msgpack_pack_str(&pk, len);
    msgpack_pack_str_body(&pk, s[i], len);
  }
  uint64_t h = XXH3_64bits(sb.data, sb.size) | 1;
  msgpack_sbuffer_destroy(&sb);
  return h;
}

void kvr_kv_request_salts(const char *lora, const char *cache_salt, kvr_kv_salts_t *out) {
  /* lora_salt as read_event() takes it from lora_name */
  uint64_t l = lora && lora[0] ? XXH3_64bits(lora, strlen(lora)) | 1 : 0;
  const char *keys[2];
  size_t n = 0;
  if (l)
    keys[n++] = lora;
  if (cache_salt && cache_salt[0])
    keys[n++] = cache_salt;
  out->first = l ^ (n ? salt_of_strings(keys, n) : 0);
  out->rest = l ? l ^ salt_of_strings(keys, 1) : 0;
}

/* Reads the event's hashes into the batch (the event's hash_off/nhashes); false = malformed. */
static bool take_hashes(kvr_kv_batch_t *b, kvr_kv_event_t *e, const msgpack_object *arr) {
  if (arr == NULL || arr->type != MSGPACK_OBJECT_ARRAY)
    return false;
  uint32_t n = arr->via.array.size;
  KVR_GROW(b->hashes, b->nhashes, b->hashes_cap, n);
  b->extra = kvr_xrealloc(b->extra, b->hashes_cap * sizeof(*b->extra));
  for (uint32_t i = 0; i < n; i++) {
    if (!read_hash(&arr->via.array.ptr[i], &b->hashes[b->nhashes + i]))
      return false;
    b->extra[b->nhashes + i] = 0;
  }
  e->hash_off = (uint32_t)b->nhashes;
  e->nhashes = n;
  return true;
}

static bool kind_indexable(const msgpack_object *kind) {
  return is_nil(kind) || str_is(kind, "full_attention") || str_is(kind, "mla_attention") ||
         str_is(kind, "sink_full_attention");
}

/* Checks f and appends the event of type kind to b; returns the skip reason or -1 when kept. */
static int add_event(kvr_kv_batch_t *b, kvr_kv_kind_t kind, const fields_t *f) {
  kvr_kv_event_t e;
  memset(&e, 0, sizeof(e));
  e.kind = kind;
  e.group_idx = -1;
  size_t h0 = b->nhashes;
  if (kind == KVR_KV_CLEARED)
    goto keep;
  if (!is_nil(f->medium) && !str_is(f->medium, "GPU"))
    return f->medium->type == MSGPACK_OBJECT_STR ? KVR_KV_SKIP_MEDIUM : KVR_KV_SKIP_MALFORMED;
  if (!is_nil(f->group_idx)) {
    if (f->group_idx->type != MSGPACK_OBJECT_POSITIVE_INTEGER || f->group_idx->via.u64 > INT32_MAX)
      return KVR_KV_SKIP_MALFORMED;
    e.group_idx = (int32_t)f->group_idx->via.u64;
  }
  if (!take_hashes(b, &e, f->hashes))
    return KVR_KV_SKIP_MALFORMED;
  if (kind == KVR_KV_REMOVED)
    goto keep;
  /* STORED */
  if (!is_nil(f->kind) && f->kind->type != MSGPACK_OBJECT_STR)
    return KVR_KV_SKIP_MALFORMED;
  if (!kind_indexable(f->kind))
    return KVR_KV_SKIP_GROUP;
  if (f->block_size == NULL || f->block_size->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
      f->block_size->via.u64 == 0 || f->block_size->via.u64 > 1u << 20)
    return KVR_KV_SKIP_MALFORMED;
  e.block_size = (uint32_t)f->block_size->via.u64;
  if (!is_nil(f->parent)) {
    if (!read_hash(f->parent, &e.parent))
      return KVR_KV_SKIP_MALFORMED;
    e.has_parent = true;
  }
  if (f->tokens == NULL || f->tokens->type != MSGPACK_OBJECT_ARRAY)
    return KVR_KV_SKIP_MALFORMED;
  uint32_t nt = f->tokens->via.array.size;
  /* the group filter's second half: only a group whose tokens are the blocks' tokens */
  if ((uint64_t)nt != (uint64_t)e.nhashes * e.block_size || e.nhashes == 0)
    return is_nil(f->kind) ? KVR_KV_SKIP_GROUP : KVR_KV_SKIP_MALFORMED;
  KVR_GROW(b->tokens, b->ntokens, b->tokens_cap, nt);
  for (uint32_t i = 0; i < nt; i++) {
    const msgpack_object *t = &f->tokens->via.array.ptr[i];
    if (t->type != MSGPACK_OBJECT_POSITIVE_INTEGER || t->via.u64 > UINT32_MAX)
      return KVR_KV_SKIP_MALFORMED;
    b->tokens[b->ntokens + i] = (uint32_t)t->via.u64;
  }
  e.tok_off = (uint32_t)b->ntokens;
  e.ntokens = nt;
  if (f->lora_name && f->lora_name->type == MSGPACK_OBJECT_STR && f->lora_name->via.str.size)
    e.lora_salt = XXH3_64bits(f->lora_name->via.str.ptr, f->lora_name->via.str.size) | 1;
  else if (f->lora_id && f->lora_id->type == MSGPACK_OBJECT_POSITIVE_INTEGER && f->lora_id->via.u64)
    e.lora_salt = XXH3_64bits(&f->lora_id->via.u64, sizeof(uint64_t)) | 1;
  if (!is_nil(f->extra_keys)) {
    if (f->extra_keys->type != MSGPACK_OBJECT_ARRAY)
      return KVR_KV_SKIP_MALFORMED;
    uint32_t nx = f->extra_keys->via.array.size;
    for (uint32_t i = 0; i < nx && i < e.nhashes; i++) {
      const msgpack_object *x = &f->extra_keys->via.array.ptr[i];
      if (!is_nil(x)) {
        b->extra[h0 + i] = salt_of_object(x);
        e.has_extra = true;
      }
    }
  }
  b->ntokens += nt;
keep:
  b->nhashes = h0 + e.nhashes;
  KVR_GROW(b->ev, b->nev, b->ev_cap, 1);
  b->ev[b->nev++] = e;
  return -1;
}

/* Reads one event (map or tagged array) into b or counts why it was skipped. */
static void read_event(kvr_kv_batch_t *b, const msgpack_object *o) {
  fields_t f;
  memset(&f, 0, sizeof(f));
  const msgpack_object *type = NULL;
  if (o->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
      if (k->type != MSGPACK_OBJECT_STR)
        continue; /* unknown keys of any form are ignored */
      if (str_is(k, "type"))
        type = v;
      else if (str_is(k, "block_hashes"))
        f.hashes = v;
      else if (str_is(k, "parent_block_hash"))
        f.parent = v;
      else if (str_is(k, "token_ids"))
        f.tokens = v;
      else if (str_is(k, "block_size"))
        f.block_size = v;
      else if (str_is(k, "lora_id"))
        f.lora_id = v;
      else if (str_is(k, "medium"))
        f.medium = v;
      else if (str_is(k, "lora_name"))
        f.lora_name = v;
      else if (str_is(k, "extra_keys"))
        f.extra_keys = v;
      else if (str_is(k, "group_idx"))
        f.group_idx = v;
      else if (str_is(k, "kv_cache_spec_kind"))
        f.kind = v;
    }
  } else if (o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size > 0) {
    const msgpack_object *a = o->via.array.ptr;
    uint32_t n = o->via.array.size;
    type = &a[0];
#define AT(i) ((i) < n ? &a[i] : NULL)
    if (str_is(type, "BlockStored")) {
      f.hashes = AT(1), f.parent = AT(2), f.tokens = AT(3), f.block_size = AT(4);
      f.lora_id = AT(5), f.medium = AT(6), f.lora_name = AT(7), f.extra_keys = AT(8);
      f.group_idx = AT(9), f.kind = AT(10);
    } else if (str_is(type, "BlockRemoved")) {
      f.hashes = AT(1), f.medium = AT(2), f.group_idx = AT(3);
    }
#undef AT
  }
  int skip;
  if (type == NULL || type->type != MSGPACK_OBJECT_STR)
    skip = KVR_KV_SKIP_MALFORMED;
  else if (str_is(type, "BlockStored"))
    skip = add_event(b, KVR_KV_STORED, &f);
  else if (str_is(type, "BlockRemoved"))
    skip = add_event(b, KVR_KV_REMOVED, &f);
  else if (str_is(type, "AllBlocksCleared"))
    skip = add_event(b, KVR_KV_CLEARED, &f);
  else
    skip = KVR_KV_SKIP_UNKNOWN_TYPE;
  if (skip >= 0)
    b->skipped[skip]++;
}

/* The size of the first msgpack object of p[0..len), or 0 unless every array and map in it
 * declares no more elements than bytes remain. msgpack-c's unpacker allocates a container's element
 * array from its declared count before reading the elements (the C API has no size limit), so a
 * 6-byte "array32 of 2^32 elements" would ask for 96 GiB; each element takes at least one byte, so
 * this walk bounds what the unpacker may allocate by the payload's size. */
size_t kvr_msgpack_object_size(const void *data, size_t len) {
  const unsigned char *p = data;
  size_t i = 0;
  uint64_t items = 1; /* objects still to walk */
  while (items > 0) {
    if (i >= len)
      return 0;
    unsigned b = p[i];
    uint64_t skip = 0, n = 0; /* payload bytes after the header; container elements */
    size_t hdr = 1;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
    } else if ((b & 0xf0) == 0x80) {
      n = 2 * (b & 0x0f);
    } else if ((b & 0xf0) == 0x90) {
      n = b & 0x0f;
    } else if ((b & 0xe0) == 0xa0) {
      skip = b & 0x1f;
    } else {
      static const unsigned char fixed[] = {/* 0xca..0xd8: payload bytes */
                                            4, 8, 1, 2, 4, 8, 1, 2, 4, 8, 2, 3, 5, 9, 17};
      unsigned lenbytes = 0, kind = 0; /* kind: 0 bytes, 1 array, 2 map */
      switch (b) {
      case 0xc4:
      case 0xd9:
        lenbytes = 1;
        break;
      case 0xc5:
      case 0xda:
        lenbytes = 2;
        break;
      case 0xc6:
      case 0xdb:
        lenbytes = 4;
        break;
      case 0xc7:
        lenbytes = 1;
        skip = 1;
        break;
      case 0xc8:
        lenbytes = 2;
        skip = 1;
        break;
      case 0xc9:
        lenbytes = 4;
        skip = 1;
        break;
      case 0xdc:
        lenbytes = 2;
        kind = 1;
        break;
      case 0xdd:
        lenbytes = 4;
        kind = 1;
        break;
      case 0xde:
        lenbytes = 2;
        kind = 2;
        break;
      case 0xdf:
        lenbytes = 4;
        kind = 2;
        break;
      default:
        if (b >= 0xca && b <= 0xd8)
          skip = fixed[b - 0xca];
        else
          return 0; /* 0xc1: never used */
      }
      if (i + 1 + lenbytes > len)
        return 0;
      uint64_t v = 0;
      for (unsigned k = 0; k < lenbytes; k++)
        v = v << 8 | p[i + 1 + k];
      hdr += lenbytes;
      if (kind == 1)
        n = v;
      else if (kind == 2)
        n = 2 * v;
      else
        skip += v;
    }
    if (skip > len - i - hdr)
      return 0;
    i += hdr + (size_t)skip;
    if (n > len - i)
      return 0;
    items = items - 1 + n;
  }
  return i;
}

bool kvr_msgpack_sizes_plausible(const void *data, size_t len) {
  return kvr_msgpack_object_size(data, len) > 0;
}

int kvr_kv_decode_batch(const void *data, size_t len, kvr_kv_batch_t *b, char *err, size_t errlen) {
  b->nev = b->nhashes = b->ntokens = 0;
  memset(b->skipped, 0, sizeof(b->skipped));
  b->ts = 0;
  b->dp_rank = -1;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int rc = -1;
  if (!kvr_msgpack_sizes_plausible(data, len)) {
    snprintf(err, errlen, "not msgpack (truncated, or a container larger than the payload)");
    goto out;
  }
  msgpack_unpack_return ur = msgpack_unpack_next(&u, data, len, &off);
  if (ur != MSGPACK_UNPACK_SUCCESS && ur != MSGPACK_UNPACK_EXTRA_BYTES) {
    snprintf(err, errlen, "not msgpack (%s)",
             ur == MSGPACK_UNPACK_CONTINUE ? "truncated" : "parse error");
    goto out;
  }
  const msgpack_object *o = &u.data;
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 2 ||
      o->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY) {
    snprintf(err, errlen, "not an EventBatch [ts, events, dp_rank?]");
    goto out;
  }
  const msgpack_object *ts = &o->via.array.ptr[0];
  if (ts->type == MSGPACK_OBJECT_FLOAT64 || ts->type == MSGPACK_OBJECT_FLOAT32)
    b->ts = ts->via.f64;
  else if (ts->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
    b->ts = (double)ts->via.u64;
  if (o->via.array.size > 2) {
    const msgpack_object *r = &o->via.array.ptr[2];
    if (r->type == MSGPACK_OBJECT_POSITIVE_INTEGER && r->via.u64 <= INT64_MAX)
      b->dp_rank = (int64_t)r->via.u64;
  }
  const msgpack_object *events = &o->via.array.ptr[1];
  for (uint32_t i = 0; i < events->via.array.size; i++)
    read_event(b, &events->via.array.ptr[i]);
  rc = 0;
out:
  msgpack_unpacked_destroy(&u);
  return rc;
}

void kvr_kv_batch_free(kvr_kv_batch_t *b) {
  if (b == NULL)
    return;
  free(b->ev);
  free(b->hashes);
  free(b->extra);
  free(b->tokens);
  memset(b, 0, sizeof(*b));
}

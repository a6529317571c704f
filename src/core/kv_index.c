/* kv_index.c -- the precise cache index fed by KV events (see kv_index.h).
 *
 * Per worker: map_t eng (engine hash -> own hash) and map_t own (own hash -> reference count), each
 * a flat linear-probing table of u64 keys and values, grown at 1/2 load and shrunk by nothing (an
 * engine's cache has a fixed size, so a worker's tables settle at about twice its block count).
 * Deletion shifts the following cluster back (no tombstones). Key 0 is kept outside the arrays.
 */
#include "core/kv_index.h"

#include "base/kvr.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct map_s {
  uint64_t *keys, *vals; /* cap entries; key 0 = empty slot */
  size_t cap, n;         /* n counts the zero key too */
  bool zero_used;
  uint64_t zero_val;
} map_t;

typedef struct worker_s {
  map_t eng, own;
  uint32_t block_size;
  int32_t group; /* the indexed KV-cache group: -2 = none seen yet, -1 = events carry none */
  kvr_kv_apply_stats_t st;
} worker_t;

struct kvr_kv_index_s {
  worker_t *w;
  size_t nworkers;
};

/* ---- map_t ---- */

static size_t slot_of(const map_t *m, uint64_t k) {
  return (size_t)((k * 0x9e3779b97f4a7c15ull) >> 7) & (m->cap - 1);
}

static uint64_t *map_find(map_t *m, uint64_t k) {
  if (k == 0)
    return m->zero_used ? &m->zero_val : NULL;
  if (m->cap == 0)
    return NULL;
  for (size_t i = slot_of(m, k);; i = (i + 1) & (m->cap - 1)) {
    if (m->keys[i] == k)
      return &m->vals[i];
    if (m->keys[i] == 0)
      return NULL;
  }
}

static void map_put_raw(map_t *m, uint64_t k, uint64_t v) {
  size_t i = slot_of(m, k);
  while (m->keys[i] != 0 && m->keys[i] != k)
    i = (i + 1) & (m->cap - 1);
  if (m->keys[i] == 0)
    m->n++;
  m->keys[i] = k;
  m->vals[i] = v;
}

static void map_grow(map_t *m) {
  map_t old = *m;
  m->cap = old.cap ? old.cap * 2 : 64;
  m->keys = kvr_xcalloc(m->cap, sizeof(uint64_t));
  m->vals = kvr_xcalloc(m->cap, sizeof(uint64_t));
  m->n = m->zero_used;
  for (size_t i = 0; i < old.cap; i++)
    if (old.keys[i] != 0)
      map_put_raw(m, old.keys[i], old.vals[i]);
  free(old.keys);
  free(old.vals);
}

/* The value slot of k, created as 0 when absent. */
static uint64_t *map_upsert(map_t *m, uint64_t k) {
  uint64_t *v = map_find(m, k);
  if (v)
    return v;
  if (k == 0) {
    m->zero_used = true;
    m->zero_val = 0;
    m->n++;
    return &m->zero_val;
  }
  if ((m->n + 1) * 2 > m->cap)
    map_grow(m);
  map_put_raw(m, k, 0);
  return map_find(m, k);
}

static void map_del(map_t *m, uint64_t k) {
  if (k == 0) {
    if (m->zero_used)
      m->n--;
    m->zero_used = false;
    return;
  }
  if (m->cap == 0)
    return;
  size_t mask = m->cap - 1, i = slot_of(m, k);
  while (m->keys[i] != k) {
    if (m->keys[i] == 0)
      return;
    i = (i + 1) & mask;
  }
  /* backward-shift: move each later entry of the cluster into the hole when its home allows */
  size_t hole = i;
  for (size_t j = (i + 1) & mask; m->keys[j] != 0; j = (j + 1) & mask) {
    size_t home = slot_of(m, m->keys[j]);
    if (((j - home) & mask) >= ((j - hole) & mask)) {
      m->keys[hole] = m->keys[j];
      m->vals[hole] = m->vals[j];
      hole = j;
    }
  }
  m->keys[hole] = 0;
  m->vals[hole] = 0;
  m->n--;
}

static void map_clear(map_t *m) {
  if (m->cap) {
    memset(m->keys, 0, m->cap * sizeof(uint64_t));
    memset(m->vals, 0, m->cap * sizeof(uint64_t));
  }
  m->n = 0;
  m->zero_used = false;
}

static void map_free(map_t *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof(*m));
}

/* ---- index ---- */

kvr_kv_index_t *kvr_kv_index_new(size_t nworkers) {
  kvr_kv_index_t *idx = kvr_xcalloc(1, sizeof(*idx));
  idx->w = kvr_xcalloc(nworkers, sizeof(worker_t));
  idx->nworkers = nworkers;
  for (size_t i = 0; i < nworkers; i++)
    idx->w[i].group = -2;
  return idx;
}

void kvr_kv_index_free(kvr_kv_index_t *idx) {
  if (idx == NULL)
    return;
  for (size_t i = 0; i < idx->nworkers; i++) {
    map_free(&idx->w[i].eng);
    map_free(&idx->w[i].own);
  }
  free(idx->w);
  free(idx);
}

static void own_ref(worker_t *w, uint64_t own) {
  ++*map_upsert(&w->own, own);
}

static void own_unref(worker_t *w, uint64_t own) {
  uint64_t *c = map_find(&w->own, own);
  if (c && --*c == 0)
    map_del(&w->own, own);
}

static void clear_worker(worker_t *w) {
  map_clear(&w->eng);
  map_clear(&w->own);
}

void kvr_kv_index_clear(kvr_kv_index_t *idx, size_t w) {
  if (w < idx->nworkers)
    clear_worker(&idx->w[w]);
}

static uint64_t own_hash(const uint32_t *tokens, uint32_t bs, uint64_t seed) {
  return XXH3_64bits_withSeed(tokens, (size_t)bs * sizeof(uint32_t), seed);
}

/* The group rule of the header: the first group seen is indexed, the others skipped. */
static bool group_ok(worker_t *w, const kvr_kv_event_t *e, bool stored) {
  if (w->group == -2 && stored)
    w->group = e->group_idx;
  if (e->group_idx == w->group || (e->group_idx < 0 && !stored) || w->group == -2)
    return true;
  w->st.other_group++;
  return false;
}

static void apply_stored(worker_t *w, const kvr_kv_batch_t *b, const kvr_kv_event_t *e) {
  if (w->block_size != 0 && e->block_size != w->block_size) {
    clear_worker(w); /* another block size: the engine was reconfigured */
    w->st.block_size_change++;
  }
  w->block_size = e->block_size;
  uint64_t parent = 0;
  if (e->has_parent) {
    const uint64_t *p = map_find(&w->eng, e->parent);
    if (p == NULL) {
      w->st.orphan_events++;
      return;
    }
    parent = *p;
  }
  for (uint32_t i = 0; i < e->nhashes; i++) {
    uint64_t salt = e->lora_salt ^ (e->has_extra ? b->extra[e->hash_off + i] : 0);
    uint64_t own =
        own_hash(b->tokens + e->tok_off + (size_t)i * e->block_size, e->block_size, parent ^ salt);
    uint64_t *slot = map_find(&w->eng, b->hashes[e->hash_off + i]);
    if (slot) {
      own_unref(w, *slot); /* the engine re-stored a hash: the newest content wins */
      *slot = own;
    } else {
      *map_upsert(&w->eng, b->hashes[e->hash_off + i]) = own;
    }
    own_ref(w, own);
    parent = own;
  }
  w->st.stored_blocks += e->nhashes;
}

static void apply_removed(worker_t *w, const kvr_kv_batch_t *b, const kvr_kv_event_t *e) {
  for (uint32_t i = 0; i < e->nhashes; i++) {
    uint64_t h = b->hashes[e->hash_off + i];
    const uint64_t *own = map_find(&w->eng, h);
    if (own == NULL) {
      w->st.unknown_removed++;
      continue;
    }
    own_unref(w, *own);
    map_del(&w->eng, h);
    w->st.removed_blocks++;
  }
}

void kvr_kv_index_apply(kvr_kv_index_t *idx, size_t wi, const kvr_kv_batch_t *b) {
  if (wi >= idx->nworkers)
    return;
  worker_t *w = &idx->w[wi];
  for (size_t i = 0; i < b->nev; i++) {
    const kvr_kv_event_t *e = &b->ev[i];
    switch (e->kind) {
    case KVR_KV_STORED:
      if (group_ok(w, e, true))
        apply_stored(w, b, e);
      break;
    case KVR_KV_REMOVED:
      if (group_ok(w, e, false))
        apply_removed(w, b, e);
      break;
    case KVR_KV_CLEARED:
      clear_worker(w);
      w->st.clears++;
      break;
    }
  }
}

size_t kvr_kv_index_blocks(const kvr_kv_index_t *idx, size_t w) {
  return w < idx->nworkers ? idx->w[w].eng.n : 0;
}

uint32_t kvr_kv_index_block_size(const kvr_kv_index_t *idx, size_t w) {
  return w < idx->nworkers ? idx->w[w].block_size : 0;
}

const kvr_kv_apply_stats_t *kvr_kv_index_stats(const kvr_kv_index_t *idx, size_t w) {
  return w < idx->nworkers ? &idx->w[w].st : NULL;
}

size_t kvr_kv_chain_salted(const uint32_t *tokens, size_t n, uint32_t block_size,
                           const kvr_kv_salts_t *salts, uint64_t *out) {
  if (block_size == 0)
    return 0;
  size_t nb = n / block_size;
  uint64_t parent = 0;
  for (size_t i = 0; i < nb; i++) {
    uint64_t salt = salts == NULL ? 0 : i == 0 ? salts->first : salts->rest;
    parent = own_hash(tokens + i * block_size, block_size, parent ^ salt);
    out[i] = parent;
  }
  return nb;
}

size_t kvr_kv_chain(const uint32_t *tokens, size_t n, uint32_t block_size, uint64_t *out) {
  return kvr_kv_chain_salted(tokens, n, block_size, NULL, out);
}

size_t kvr_kv_index_match(const kvr_kv_index_t *idx, size_t wi, const uint64_t *chain, size_t n) {
  if (wi >= idx->nworkers)
    return 0;
  map_t *own = &idx->w[wi].own;
  size_t i = 0;
  while (i < n && map_find(own, chain[i]) != NULL)
    i++;
  return i;
}

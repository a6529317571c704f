/* router_affinity.c -- the router's remembered placements: which worker holds a Responses API
 * response (its id -> that worker), so that a follow-up naming previous_response_id, a GET of the
 * response or its cancel reach the one worker whose in-process store has it (vLLM keeps a stored
 * response in that API server's memory only: ../shared/VLLM-APIS.md section 1).
 *
 * Structs: kvr_affinity_t is a bounded map from the 64-bit hash of a key (XXH3 of the id's bytes:
 * no id string is kept) to a worker id, an open-addressing table with linear probing at most half
 * full, and a ring of the keys in insertion order. Full, the oldest entry is evicted (counted):
 * vLLM itself never evicts, but the router must be bounded; a follow-up whose id was evicted goes
 * where the policy sends it, and that worker tells the client the truth (vLLM's 404 when it does
 * not hold the response). A worker removed or restarted keeps its entries until they are evicted
 * or looked up: a lookup whose worker is gone or unusable answers "none".
 *
 * The same map keeps session keys (OpenAI's prompt_cache_key, or a configured session header):
 * the worker a key last went to, preferred by the next request naming it (a hint the policy weighs
 * against load, not a pin).
 *
 * Flow: the proxy reports each response id it reads (kvr_router_on_response_id) and each dispatch
 * of a keyed request (kvr_router_on_session), and asks before a decision
 * (kvr_router_on_response_lookup, kvr_router_on_session_lookup); all are router writes, so they
 * live in a router*.c file and count their outcomes in the router's own counters.
 */
#define XXH_INLINE_ALL
#include "core/router.h"

#include "base/kvr.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct slot_s {
  uint64_t key; /* 0: empty (a real key of 0 is stored as 1) */
  uint32_t worker_id;
} slot_t;

struct kvr_affinity_s {
  slot_t *table;
  size_t cap; /* power of two, >= 2 * max */
  uint64_t *ring;
  size_t max, head, n; /* ring: the oldest at head, n entries */
};

static uint64_t key_of(const char *id, size_t len) {
  uint64_t k = XXH3_64bits(id, len);
  return k ? k : 1;
}

kvr_affinity_t *kvr_affinity_new(size_t max) {
  kvr_affinity_t *a = kvr_xcalloc(1, sizeof *a);
  a->max = max ? max : 1;
  a->cap = 16;
  while (a->cap < 2 * a->max)
    a->cap *= 2;
  a->table = kvr_xcalloc(a->cap, sizeof *a->table);
  a->ring = kvr_xcalloc(a->max, sizeof *a->ring);
  return a;
}

void kvr_affinity_free(kvr_affinity_t *a) {
  if (a == NULL)
    return;
  free(a->table);
  free(a->ring);
  free(a);
}

size_t kvr_affinity_size(const kvr_affinity_t *a) {
  return a ? a->n : 0;
}

static size_t find(const kvr_affinity_t *a, uint64_t key) {
  size_t i = (size_t)key & (a->cap - 1);
  while (a->table[i].key && a->table[i].key != key)
    i = (i + 1) & (a->cap - 1);
  return i;
}

/* Removes key (linear probing's backward-shift deletion: no tombstones). */
static void erase(kvr_affinity_t *a, uint64_t key) {
  size_t i = find(a, key);
  if (a->table[i].key == 0)
    return;
  size_t j = i;
  for (;;) {
    a->table[i].key = 0;
    for (;;) {
      j = (j + 1) & (a->cap - 1);
      if (a->table[j].key == 0)
        return;
      size_t home = (size_t)a->table[j].key & (a->cap - 1);
      /* j's entry may move to i when its home is not cyclically in (i, j]. */
      if (i <= j ? (home <= i || home > j) : (home <= i && home > j))
        break;
    }
    a->table[i] = a->table[j];
    i = j;
  }
}

/* Records key -> worker; returns true when the oldest entry had to go. */
static bool put(kvr_affinity_t *a, uint64_t key, uint32_t worker_id) {
  size_t i = find(a, key);
  if (a->table[i].key == key) { /* known: the newest placement wins */
    a->table[i].worker_id = worker_id;
    return false;
  }
  bool evicted = false;
  if (a->n == a->max) {
    erase(a, a->ring[a->head]);
    a->head = (a->head + 1) % a->max;
    a->n--;
    evicted = true;
    i = find(a, key);
  }
  a->table[i] = (slot_t){key, worker_id};
  a->ring[(a->head + a->n) % a->max] = key;
  a->n++;
  return evicted;
}

/* Records key -> the dispatch's worker in map a; counts an eviction in *evicted. */
static void record(kvr_affinity_t *a, uint64_t *evicted, const kvr_router_dispatch_t *acct,
                   const char *key, size_t len) {
  if (a == NULL || len == 0 || acct == NULL)
    return;
  if (put(a, key_of(key, len), acct->worker_id))
    (*evicted)++;
}

/* The slot of the worker key maps to in a when it is there and usable, else -1; the result is
 * counted in lookups[]. */
static int lookup(const kvr_router_t *r, const kvr_affinity_t *a, uint64_t *lookups,
                  const char *key, size_t len, uint64_t now_ms) {
  if (a == NULL || len == 0)
    return -1;
  size_t i = find(a, key_of(key, len));
  if (a->table[i].key == 0) {
    lookups[KVR_AFFINITY_UNKNOWN]++;
    return -1;
  }
  const kvr_worker_t *w = kvr_router_worker_by_id(r, a->table[i].worker_id);
  if (w == NULL || !kvr_router_worker_usable(w, now_ms)) {
    lookups[KVR_AFFINITY_GONE]++;
    return -1;
  }
  lookups[KVR_AFFINITY_HIT]++;
  return w->slot;
}

void kvr_router_on_response_id(kvr_router_t *r, const kvr_router_dispatch_t *acct, const char *id,
                               size_t len) {
  record(r->response_ids, &r->response_ids_evicted_total, acct, id, len);
}

int kvr_router_on_response_lookup(kvr_router_t *r, const char *id, size_t len, uint64_t now_ms) {
  return lookup(r, r->response_ids, r->response_id_lookups_total, id, len, now_ms);
}

void kvr_router_on_session(kvr_router_t *r, const kvr_router_dispatch_t *acct, const char *key,
                           size_t len) {
  record(r->session_keys, &r->session_keys_evicted_total, acct, key, len);
}

int kvr_router_on_session_lookup(kvr_router_t *r, const char *key, size_t len, uint64_t now_ms) {
  return lookup(r, r->session_keys, r->session_lookups_total, key, len, now_ms);
}

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
 * Open sessions: a response id also stands for its session's next turn until that turn comes
 * (a lookup naming it), its window passes (open_window_ms: twice the mean wait from an id to its
 * follow-up, learnt from the follow-ups) or it is evicted. kvr_worker_t.open_sessions counts the
 * open ids per worker, the requests the router will pin there while their clients run a tool:
 * policies read it in the snapshot (kv_aware's session_weight). Each slot keeps the time its id
 * opened (open_ms, 0 once closed); the ring is in store order, so the ids past the window are its
 * oldest, and a cursor (aged) walks them once: O(1) amortised per id, plus a scan of the worker
 * slots to find the worker a closing id counted on.
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
  /* Response ids: the router clock's milliseconds (mod 2^32, never 0) when the id was stored,
   * while its session is open (no follow-up yet, inside the window); 0 otherwise. */
  uint32_t open_ms;
} slot_t;

struct kvr_affinity_s {
  slot_t *table;
  size_t cap; /* power of two, >= 2 * max */
  uint64_t *ring;
  size_t max, head, n; /* ring: the oldest at head, n entries */
  size_t aged;         /* ring entries from head already past the open-session window */
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

/* Records key -> worker; returns true when the oldest entry had to go (copied into *gone when
 * gone is not NULL). */
static bool put(kvr_affinity_t *a, uint64_t key, uint32_t worker_id, slot_t *gone) {
  size_t i = find(a, key);
  if (a->table[i].key == key) { /* known: the newest placement wins */
    a->table[i].worker_id = worker_id;
    return false;
  }
  bool evicted = false;
  if (a->n == a->max) {
    size_t g = find(a, a->ring[a->head]);
    if (gone)
      *gone = a->table[g];
    erase(a, a->ring[a->head]);
    a->head = (a->head + 1) % a->max;
    a->n--;
    if (a->aged > 0)
      a->aged--;
    evicted = true;
    i = find(a, key);
  }
  a->table[i] = (slot_t){key, worker_id, 0};
  a->ring[(a->head + a->n) % a->max] = key;
  a->n++;
  return evicted;
}

/* Records key -> the dispatch's worker in map a; counts an eviction in *evicted. */
static void record(kvr_affinity_t *a, uint64_t *evicted, const kvr_router_dispatch_t *acct,
                   const char *key, size_t len) {
  if (a == NULL || len == 0 || acct == NULL)
    return;
  if (put(a, key_of(key, len), acct->worker_id, NULL))
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

/* Closes the open session an entry stands for (its follow-up came, it aged out or was evicted). */
static void session_close(kvr_router_t *r, slot_t *s) {
  if (s->open_ms == 0)
    return;
  s->open_ms = 0;
  kvr_worker_t *w = kvr__router_worker_by_id(r, s->worker_id);
  if (w && w->open_sessions > 0)
    w->open_sessions--;
}

/* How long a stored response id counts as an open session: twice the mean time its sessions'
 * follow-ups have taken to come (response.created to the next turn: the answer's decode plus the
 * client's own time, a tool's run), 30 s until the first follow-up, within 1 s .. 10 min. A
 * session that ended is counted that long after its last answer; one whose next turn comes later
 * is not counted in between (it still goes to its worker). */
static uint32_t open_window_ms(const kvr_router_t *r) {
  if (r->response_gap_ms <= 0)
    return 30000;
  return (uint32_t)KVR_MIN(KVR_MAX(2 * r->response_gap_ms, 1000.0), 600000.0);
}

void kvr__router_sessions_age(kvr_router_t *r, uint64_t now_ms) {
  kvr_affinity_t *a = r->response_ids;
  uint32_t window = open_window_ms(r);
  /* The ring is in store order, so the ids past the window are its oldest; an entry still open
   * and inside the window stops the walk (every one after it is younger). */
  while (a && a->aged < a->n) {
    slot_t *s = &a->table[find(a, a->ring[(a->head + a->aged) % a->max])];
    if (s->open_ms && (uint32_t)now_ms - s->open_ms < window)
      break;
    session_close(r, s);
    a->aged++;
  }
}

void kvr_router_on_response_id(kvr_router_t *r, const kvr_router_dispatch_t *acct, const char *id,
                               size_t len) {
  kvr_affinity_t *a = r->response_ids;
  if (a == NULL || len == 0 || acct == NULL)
    return;
  uint64_t now = kvr_router_now_ns(r) / 1000000u;
  kvr__router_sessions_age(r, now);
  uint64_t key = key_of(id, len);
  slot_t *known = &a->table[find(a, key)];
  if (known->key == key) { /* reported again: the newest worker wins, an open session moves */
    uint32_t open_ms = known->open_ms;
    session_close(r, known);
    known->worker_id = acct->worker_id;
    kvr_worker_t *to = open_ms ? kvr__router_worker_by_id(r, acct->worker_id) : NULL;
    if (to) {
      known->open_ms = open_ms; /* its time stays: the ring holds it where it was first stored */
      to->open_sessions++;
    }
    return;
  }
  slot_t gone = {0};
  if (put(a, key, acct->worker_id, &gone)) {
    r->response_ids_evicted_total++;
    session_close(r, &gone);
  }
  kvr_worker_t *w = kvr__router_worker_by_id(r, acct->worker_id);
  if (w) {
    a->table[find(a, key)].open_ms = (uint32_t)now ? (uint32_t)now : 1;
    w->open_sessions++;
  }
}

int kvr_router_on_response_lookup(kvr_router_t *r, const char *id, size_t len, uint64_t now_ms) {
  int slot = lookup(r, r->response_ids, r->response_id_lookups_total, id, len, now_ms);
  if (r->response_ids == NULL || len == 0)
    return slot;
  slot_t *s = &r->response_ids->table[find(r->response_ids, key_of(id, len))];
  if (s->key && s->open_ms) { /* the session's next turn: learn the gap, close it */
    uint32_t now = (uint32_t)(kvr_router_now_ns(r) / 1000000u);
    double gap = (double)(uint32_t)(now - s->open_ms);
    r->response_gap_ms += r->response_gap_ms > 0 ? (gap - r->response_gap_ms) / 64 : gap;
    session_close(r, s);
  }
  return slot;
}

void kvr_router_on_session(kvr_router_t *r, const kvr_router_dispatch_t *acct, const char *key,
                           size_t len) {
  record(r->session_keys, &r->session_keys_evicted_total, acct, key, len);
}

int kvr_router_on_session_lookup(kvr_router_t *r, const char *key, size_t len, uint64_t now_ms) {
  return lookup(r, r->session_keys, r->session_lookups_total, key, len, now_ms);
}

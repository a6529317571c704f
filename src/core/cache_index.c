/* cache_index.c -- block hash -> workers index with a per-worker LRU bound.
 *
 * Structures (all indexes are uint32, never pointers, so the arrays can be reallocated freely):
 *
 *   slots[]  a bucketized cuckoo table: buckets of 4 slots { hash, mask }, 64 bytes, one cache
 *            line each; mask has bit w set when worker w holds the block, mask == 0 marks an empty
 *            slot (a block nobody holds is deleted at once). A block lives in one of its two
 *            buckets, b1 = hash scaled to the bucket count and b2 = a mix of hash scaled the same
 *            way, so any bucket count works (no power of two) and a lookup reads at most two
 *            cache lines.
 *   heads[]  parallel to slots: first node of the slot's chain (one node per holding worker).
 *   nodes[]  one per (block, worker) entry: { prev, next } in the worker's LRU list, { chain } to
 *            the next node of the same slot, { slot_w } = slot index | worker << 26.
 *            Free nodes are linked through next.
 *   workers[] { mru, lru, count, capacity }.
 *
 *        slots[i] = {h, 0b0101}    heads[i] -> node a (w0) -> node b (w2) -> NIL
 *        worker 0: mru -> ... <-> a <-> ... <- lru
 *
 * Flow: insert walks the request's blocks from last to first; each block is either touched (its
 * node moves to the front of the worker's list) or gets a node, after evicting the worker's tail
 * node when it is at capacity. When the insert will evict, a first pass touches the blocks the
 * worker already holds so the request never evicts its own beginning. A new block takes a free
 * slot of b1 or b2; when both buckets are full it displaces a resident into that resident's other
 * bucket, and so on (a cuckoo walk of at most MAX_KICKS moves, each rewriting the slot field of the
 * moved block's few chain nodes); a walk that finds no room, or a table above MAX_LOAD, grows the
 * table by half. Removing a worker's last hold on a block just empties its slot.
 *
 * match: each worker's blocks are prefix-closed -- a worker that holds a block holds its parent.
 * Blocks enter only as chains from a prompt's first block (kvr_cache_index_insert), touched last to
 * first, so a parent is never less recently used than its child, and LRU eviction takes the child
 * first; a block hash names its whole prefix, so a block has one parent. Hence "worker w holds
 * block i of the request" is true up to w's prefix length and false after it, and match binary-
 * searches it: ~2 + log2(n) lookups (a 64 KiB prompt: ~12, not 1,025), each at most two cache
 * lines of slots[]. An insert that fails at a block (no memory, or the table at 2^26 slots) takes
 * back the deeper blocks it added, so the closure holds. (One path still breaks it: a table that
 * can no longer grow drops a block a failed walk displaced, children included or not; the index is
 * approximate, so that block's descendants are then matched as the search happens to probe them.)
 *
 * Memory: 20 bytes per slot (16 in the bucket, 4 in heads[]) at up to 90% load, 16 bytes per node;
 * the node array grows by half too. kvr_cache_index_reserve() sizes both for a number of blocks.
 *
 * Invariants: mask bit w set <=> exactly one node of worker w is in the slot's chain;
 * workers[w].count == length of w's LRU list <= capacity; nonempty has bit w <=> count > 0; a
 * block's slot is in its b1 or b2 bucket.
 */
#include "core/cache_index.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/kvr.h"
#include "policies/policy.h"

#define NIL UINT32_MAX
#define SLOT_BITS 26
#define SLOT_MASK ((UINT32_C(1) << SLOT_BITS) - 1)
#define MAX_SLOTS (UINT64_C(1) << SLOT_BITS)
#define BUCKET 4
#define MIN_BUCKETS 16
#define MIN_NODES 1024
/* Occupied slots at most MAX_LOAD_PCT% of all. 4-slot buckets with two choices fill to ~97%
 * before cuckoo walks start failing, but the walks grow long well before: in a throwaway test
 * of the rebuild, a full index of 1M blocks evicting and inserting took ~0.5 us per new block at
 * 90% against ~0.8 us at 95% (and ~0.3 us in the linear-probing table this replaced, at 48%).
 * `kvrouter bench routing` ("Index steady state": 1M random blocks in 256-block chains into an
 * index at capacity) measured 0.20-0.21 us per new block at 90% on the 2-core VM of 2026-11-25
 * and 0.44 us on the slower one of 2026-11-28. */
#define MAX_LOAD_PCT 90
#define MAX_KICKS 256

typedef struct slot_s {
  uint64_t hash;
  uint64_t mask;
} slot_t;

typedef struct node_s {
  uint32_t prev, next; /* worker LRU list (prev toward MRU); next links the free list too */
  uint32_t chain;      /* next node holding the same block */
  uint32_t slot_w;     /* slot index | worker << SLOT_BITS */
} node_t;

typedef struct worker_s {
  uint32_t mru, lru;
  uint64_t count;
  uint64_t capacity;
} worker_t;

/* One table: nbuckets * BUCKET slots and their chain heads. */
typedef struct table_s {
  slot_t *slots;
  uint32_t *heads;
  uint64_t nbuckets;
} table_t;

struct kvr_cache_index_s {
  table_t t;
  uint64_t used; /* occupied slots */
  node_t *nodes;
  uint32_t nnodes; /* allocated */
  uint32_t free_head;
  uint64_t entries;
  worker_t workers[KVR_MAX_WORKERS];
  size_t max_workers;
  uint64_t nonempty; /* bit w: worker w holds something */
  uint64_t inserts, evictions;
  uint64_t rng; /* picks the slot a cuckoo walk displaces */
};

static inline uint32_t node_slot(const node_t *n) {
  return n->slot_w & SLOT_MASK;
}
static inline uint32_t node_worker(const node_t *n) {
  return n->slot_w >> SLOT_BITS;
}

/* hash scaled to [0, n) by its high bits (Lemire's multiply-shift: no division, any n). */
static inline uint64_t scale(uint64_t hash, uint64_t n) {
  return (uint64_t)(((unsigned __int128)hash * n) >> 64);
}

/* MurmurHash3's 64-bit finalizer: the second bucket's hash, independent of the first's. */
static inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= UINT64_C(0xff51afd7ed558ccd);
  h ^= h >> 33;
  h *= UINT64_C(0xc4ceb9fe1a85ec53);
  h ^= h >> 33;
  return h;
}

static inline uint64_t bucket1(uint64_t hash, uint64_t nbuckets) {
  return scale(hash, nbuckets);
}

static inline uint64_t bucket2(uint64_t hash, uint64_t nbuckets) {
  uint64_t b1 = scale(hash, nbuckets), b2 = scale(mix(hash), nbuckets);
  return b2 != b1 ? b2 : (b1 + 1 == nbuckets ? 0 : b1 + 1);
}

/* The bucket of hash's two that is not b (b is one of them). */
static inline uint64_t other_bucket(uint64_t hash, uint64_t b, uint64_t nbuckets) {
  uint64_t b1 = bucket1(hash, nbuckets);
  return b1 != b ? b1 : bucket2(hash, nbuckets);
}

/* Returns the slot of hash within bucket b, or NIL. */
static inline uint32_t find_in(const slot_t *slots, uint64_t b, uint64_t hash) {
  const slot_t *s = &slots[b * BUCKET];
  for (uint32_t k = 0; k < BUCKET; k++)
    if (s[k].hash == hash && s[k].mask != 0)
      return (uint32_t)(b * BUCKET + k);
  return NIL;
}

/* Returns the slot holding hash, or NIL. */
static inline uint32_t find_slot(const kvr_cache_index_t *idx, uint64_t hash) {
  uint32_t s = find_in(idx->t.slots, bucket1(hash, idx->t.nbuckets), hash);
  return s != NIL ? s : find_in(idx->t.slots, bucket2(hash, idx->t.nbuckets), hash);
}

/* Returns an empty slot of bucket b, or NIL. */
static inline uint32_t free_in(const slot_t *slots, uint64_t b) {
  const slot_t *s = &slots[b * BUCKET];
  for (uint32_t k = 0; k < BUCKET; k++)
    if (s[k].mask == 0)
      return (uint32_t)(b * BUCKET + k);
  return NIL;
}

static void fix_chain(kvr_cache_index_t *idx, uint32_t slot) {
  for (uint32_t n = idx->t.heads[slot]; n != NIL; n = idx->nodes[n].chain)
    idx->nodes[n].slot_w = slot | (idx->nodes[n].slot_w & ~SLOT_MASK);
}

/* Puts the entry (*e, *head) into table t: a free slot of its first or second bucket, else a
 * cuckoo walk. idx non-NULL: t is the live table, and every moved entry's chain is fixed at once.
 * Returns true when everything has a slot; false after MAX_KICKS moves, with the entry left without
 * a slot in (*e, *head) (its chain nodes still name its old slot). */
static bool cuckoo_put(table_t *t, slot_t *e, uint32_t *head, uint64_t *rng,
                       kvr_cache_index_t *idx) {
  uint64_t b = bucket1(e->hash, t->nbuckets);
  uint32_t s = free_in(t->slots, b);
  if (s == NIL) {
    b = bucket2(e->hash, t->nbuckets);
    s = free_in(t->slots, b);
  }
  for (int kick = 0; s == NIL && kick < MAX_KICKS; kick++) {
    /* Displace a resident of bucket b into its other bucket: one whose other bucket has room
     * when there is one (the walk ends at the next step), else a random one. */
    uint32_t v = (uint32_t)(b * BUCKET + kvr_policy_rand(rng) % BUCKET);
    for (uint32_t k = 0; k < BUCKET; k++) {
      if (free_in(t->slots, other_bucket(t->slots[b * BUCKET + k].hash, b, t->nbuckets)) != NIL) {
        v = (uint32_t)(b * BUCKET + k);
        break;
      }
    }
    slot_t out = t->slots[v];
    uint32_t out_head = t->heads[v];
    t->slots[v] = *e;
    t->heads[v] = *head;
    if (idx != NULL)
      fix_chain(idx, v);
    *e = out;
    *head = out_head;
    b = other_bucket(e->hash, b, t->nbuckets);
    s = free_in(t->slots, b);
  }
  if (s == NIL)
    return false;
  t->slots[s] = *e;
  t->heads[s] = *head;
  if (idx != NULL)
    fix_chain(idx, s);
  return true;
}

/* Allocates a zeroed slot table, each bucket on its own cache line. Large tables are 2 MiB-aligned
 * and advised to use transparent huge pages: a match is ~1,000 random reads over tens of MiB, and
 * with 4 KiB pages most of them would also miss the TLB. */
static slot_t *alloc_slots(uint64_t nslots) {
  size_t bytes = nslots * sizeof(slot_t);
  size_t huge = (size_t)2 << 20;
  size_t align = bytes < huge ? 64 : huge;
  void *p = NULL;
  if (posix_memalign(&p, align, (bytes + align - 1) / align * align) != 0)
    return NULL;
#ifdef MADV_HUGEPAGE
  if (bytes >= huge)
    madvise(p, bytes, MADV_HUGEPAGE); /* advisory: failure only costs speed */
#endif
  memset(p, 0, bytes);
  return p;
}

/* The bucket count a growth by half reaches, capped at MAX_SLOTS; 0 when already at the cap. */
static uint64_t grown(uint64_t nbuckets) {
  uint64_t cap = MAX_SLOTS / BUCKET, next = nbuckets + nbuckets / 2;
  if (nbuckets >= cap)
    return 0;
  return next < cap ? next : cap;
}

/* Rebuilds the table with at least nbuckets buckets, plus the entry (*extra, extra_head) when
 * extra is non-NULL (one a cuckoo walk left without a slot); grows further by half while a walk
 * fails. */
static int resize(kvr_cache_index_t *idx, uint64_t nbuckets, const slot_t *extra,
                  uint32_t extra_head) {
  for (;;) {
    if (nbuckets * BUCKET > MAX_SLOTS)
      return KVR_ELIMIT;
    table_t t = {alloc_slots(nbuckets * BUCKET), malloc(nbuckets * BUCKET * sizeof(uint32_t)),
                 nbuckets};
    if (t.slots == NULL || t.heads == NULL) {
      free(t.slots);
      free(t.heads);
      return KVR_ENOMEM;
    }
    bool ok = true;
    uint64_t old = idx->t.nbuckets * BUCKET;
    for (uint64_t i = 0; ok && i <= old; i++) {
      slot_t e;
      uint32_t head;
      if (i == old) {
        if (extra == NULL)
          break;
        e = *extra;
        head = extra_head;
      } else {
        if (idx->t.slots[i].mask == 0)
          continue;
        e = idx->t.slots[i];
        head = idx->t.heads[i];
      }
      ok = cuckoo_put(&t, &e, &head, &idx->rng, NULL);
    }
    if (!ok) {
      free(t.slots);
      free(t.heads);
      nbuckets = grown(nbuckets);
      if (nbuckets == 0)
        return KVR_ELIMIT;
      continue;
    }
    free(idx->t.slots);
    free(idx->t.heads);
    idx->t = t;
    for (uint64_t i = 0; i < nbuckets * BUCKET; i++)
      if (t.slots[i].mask != 0)
        fix_chain(idx, (uint32_t)i);
    return 0;
  }
}

static void delete_slot_raw(table_t *t, uint32_t i) {
  t->slots[i].mask = 0;
  t->slots[i].hash = 0;
  t->heads[i] = NIL;
}

/* Empties slot i (its block is no longer held). */
static void delete_slot(kvr_cache_index_t *idx, uint32_t i) {
  delete_slot_raw(&idx->t, i);
  idx->used--;
}

static void drop_chain(kvr_cache_index_t *idx, uint32_t head);

/* Gives hash a slot with mask bit (no nodes yet) and returns it, or NIL with *rc set. */
static uint32_t add_slot(kvr_cache_index_t *idx, uint64_t hash, uint64_t bit, int *rc) {
  uint64_t nslots = idx->t.nbuckets * BUCKET;
  if ((idx->used + 1) * 100 > nslots * MAX_LOAD_PCT) {
    uint64_t to = grown(idx->t.nbuckets);
    *rc = to ? resize(idx, to, NULL, NIL) : KVR_ELIMIT;
    if (*rc)
      return NIL;
  }
  slot_t e = {hash, bit};
  uint32_t head = NIL;
  if (!cuckoo_put(&idx->t, &e, &head, &idx->rng, idx)) {
    uint64_t to = grown(idx->t.nbuckets);
    *rc = to ? resize(idx, to, &e, head) : KVR_ELIMIT;
    if (*rc) {
      /* No bigger table: the block the walk left without a slot is forgotten, its entries
       * dropped as evictions. When that is not the new block, the new block (placed, no node
       * yet) leaves its slot too, so every mask bit keeps its node. */
      drop_chain(idx, head);
      if (e.hash != hash) {
        idx->used--;
        delete_slot_raw(&idx->t, find_slot(idx, hash));
      }
      return NIL;
    }
  }
  idx->used++;
  return find_slot(idx, hash);
}

/* Makes the node array at least n long, new nodes on the free list. */
static int grow_nodes(kvr_cache_index_t *idx, uint64_t n) {
  if (n > NIL)
    n = NIL;
  if (n <= idx->nnodes)
    return n == idx->nnodes ? 0 : KVR_ELIMIT;
  node_t *nodes = realloc(idx->nodes, n * sizeof(*nodes));
  if (nodes == NULL)
    return KVR_ENOMEM;
  idx->nodes = nodes;
  for (uint64_t k = idx->nnodes; k < n; k++)
    nodes[k].next = k + 1 < n ? (uint32_t)(k + 1) : idx->free_head;
  idx->free_head = idx->nnodes;
  idx->nnodes = (uint32_t)n;
  return 0;
}

static uint32_t alloc_node(kvr_cache_index_t *idx) {
  if (idx->free_head == NIL) {
    uint64_t n = idx->nnodes ? (uint64_t)idx->nnodes + idx->nnodes / 2 : MIN_NODES;
    if (idx->nnodes == NIL || grow_nodes(idx, n) != 0)
      return NIL;
  }
  uint32_t n = idx->free_head;
  idx->free_head = idx->nodes[n].next;
  return n;
}

static void lru_unlink(kvr_cache_index_t *idx, worker_t *w, uint32_t n) {
  node_t *x = &idx->nodes[n];
  if (x->prev != NIL)
    idx->nodes[x->prev].next = x->next;
  else
    w->mru = x->next;
  if (x->next != NIL)
    idx->nodes[x->next].prev = x->prev;
  else
    w->lru = x->prev;
}

static void lru_push_front(kvr_cache_index_t *idx, worker_t *w, uint32_t n) {
  node_t *x = &idx->nodes[n];
  x->prev = NIL;
  x->next = w->mru;
  if (w->mru != NIL)
    idx->nodes[w->mru].prev = n;
  w->mru = n;
  if (w->lru == NIL)
    w->lru = n;
}

/* Returns node n to the free list and its worker's count (n is out of every list). */
static void free_node(kvr_cache_index_t *idx, uint32_t n, uint32_t wi) {
  worker_t *w = &idx->workers[wi];
  idx->nodes[n].next = idx->free_head;
  idx->free_head = n;
  w->count--;
  idx->entries--;
  if (w->count == 0)
    idx->nonempty &= ~(UINT64_C(1) << wi);
}

/* Removes one entry; empties its slot when no worker holds the block any more. */
static void remove_node(kvr_cache_index_t *idx, uint32_t n) {
  node_t *x = &idx->nodes[n];
  uint32_t slot = node_slot(x);
  uint32_t wi = node_worker(x);
  lru_unlink(idx, &idx->workers[wi], n);
  uint32_t *link = &idx->t.heads[slot];
  while (*link != n)
    link = &idx->nodes[*link].chain;
  *link = x->chain;
  idx->t.slots[slot].mask &= ~(UINT64_C(1) << wi);
  free_node(idx, n, wi);
  if (idx->t.slots[slot].mask == 0)
    delete_slot(idx, slot);
}

/* Drops the entries of a chain whose block lost its slot (their slot fields are stale). */
static void drop_chain(kvr_cache_index_t *idx, uint32_t head) {
  while (head != NIL) {
    uint32_t n = head;
    uint32_t wi = node_worker(&idx->nodes[n]);
    head = idx->nodes[n].chain;
    lru_unlink(idx, &idx->workers[wi], n);
    free_node(idx, n, wi);
    idx->evictions++;
  }
}

static uint32_t find_node(const kvr_cache_index_t *idx, uint32_t slot, uint32_t worker) {
  for (uint32_t n = idx->t.heads[slot]; n != NIL; n = idx->nodes[n].chain)
    if (node_worker(&idx->nodes[n]) == worker)
      return n;
  return NIL;
}

/* The node of (hash, worker), or NIL when the worker does not hold the block. */
static uint32_t node_of(const kvr_cache_index_t *idx, uint64_t hash, uint32_t worker) {
  uint32_t s = find_slot(idx, hash);
  return s == NIL ? NIL : find_node(idx, s, worker);
}

kvr_cache_index_t *kvr_cache_index_new(size_t max_workers, uint64_t default_capacity) {
  if (max_workers == 0 || max_workers > KVR_MAX_WORKERS)
    return NULL;
  kvr_cache_index_t *idx = calloc(1, sizeof(*idx));
  if (idx == NULL)
    return NULL;
  idx->max_workers = max_workers;
  idx->free_head = NIL;
  for (size_t w = 0; w < KVR_MAX_WORKERS; w++) {
    idx->workers[w].mru = idx->workers[w].lru = NIL;
    idx->workers[w].capacity = default_capacity;
  }
  idx->rng = UINT64_C(0x9e3779b97f4a7c15);
  if (resize(idx, MIN_BUCKETS, NULL, NIL) != 0) {
    free(idx);
    return NULL;
  }
  return idx;
}

void kvr_cache_index_free(kvr_cache_index_t *idx) {
  if (idx == NULL)
    return;
  free(idx->t.slots);
  free(idx->t.heads);
  free(idx->nodes);
  free(idx);
}

int kvr_cache_index_set_capacity(kvr_cache_index_t *idx, size_t worker, uint64_t blocks) {
  if (worker >= idx->max_workers)
    return KVR_EINVAL;
  worker_t *w = &idx->workers[worker];
  w->capacity = blocks;
  while (w->count > w->capacity) {
    remove_node(idx, w->lru);
    idx->evictions++;
  }
  return 0;
}

uint64_t kvr_cache_index_capacity(const kvr_cache_index_t *idx, size_t worker) {
  return worker < idx->max_workers ? idx->workers[worker].capacity : 0;
}

static int insert_one(kvr_cache_index_t *idx, uint32_t wi, uint64_t hash) {
  worker_t *w = &idx->workers[wi];
  uint64_t bit = UINT64_C(1) << wi;
  uint32_t slot = find_slot(idx, hash);
  if (slot != NIL && (idx->t.slots[slot].mask & bit)) {
    uint32_t n = find_node(idx, slot, wi);
    lru_unlink(idx, w, n);
    lru_push_front(idx, w, n);
    return 0;
  }
  if (w->capacity == 0)
    return 0;
  if (w->count >= w->capacity) {
    remove_node(idx, w->lru);
    idx->evictions++;
    slot = find_slot(idx, hash); /* the evicted entry may have been the block's last */
  }
  uint32_t n = alloc_node(idx);
  if (n == NIL)
    return KVR_ENOMEM;
  if (slot == NIL) {
    int rc = 0;
    slot = add_slot(idx, hash, bit, &rc);
    if (slot == NIL) {
      idx->nodes[n].next = idx->free_head;
      idx->free_head = n;
      return rc;
    }
  }
  node_t *x = &idx->nodes[n];
  x->slot_w = slot | (wi << SLOT_BITS);
  x->chain = idx->t.heads[slot];
  idx->t.heads[slot] = n;
  idx->t.slots[slot].mask |= bit;
  lru_push_front(idx, w, n);
  w->count++;
  idx->entries++;
  idx->inserts++;
  idx->nonempty |= bit;
  return 0;
}

int kvr_cache_index_insert(kvr_cache_index_t *idx, size_t worker, const uint64_t *blocks,
                           size_t n) {
  if (worker >= idx->max_workers)
    return KVR_EINVAL;
  worker_t *w = &idx->workers[worker];
  /* When new blocks will evict, first touch the blocks the worker already holds -- a prefix of
   * the chain, its blocks being prefix-closed -- so that the request's new deep blocks never push
   * out its own shared beginning. */
  if (w->count + n > w->capacity) {
    size_t held[KVR_MAX_WORKERS];
    kvr_cache_index_match(idx, blocks, n, held);
    if (held[worker] < n && w->count + (n - held[worker]) > w->capacity)
      for (size_t i = held[worker]; i-- > 0;) {
        uint32_t x = node_of(idx, blocks[i], (uint32_t)worker);
        if (x == NIL)
          continue; /* only after a dropped block (see match): nothing to touch */
        lru_unlink(idx, w, x);
        lru_push_front(idx, w, x);
      }
  }
  for (size_t i = n; i-- > 0;) {
    int rc = insert_one(idx, (uint32_t)worker, blocks[i]);
    if (rc) {
      /* Block i failed, so the worker did not hold it, nor (prefix-closed) any block after it:
       * everything it holds of blocks (i, n) came in this call. Taking those out keeps the
       * worker's blocks prefix-closed. */
      for (size_t j = i + 1; j < n; j++) {
        uint32_t x = node_of(idx, blocks[j], (uint32_t)worker);
        if (x != NIL)
          remove_node(idx, x);
      }
      return rc;
    }
  }
  return 0;
}

/* The workers holding hash (0 when none). */
static inline uint64_t holders_of(const kvr_cache_index_t *idx, uint64_t hash) {
  uint32_t s = find_slot(idx, hash);
  return s == NIL ? 0 : idx->t.slots[s].mask;
}

/* Each worker's held blocks are prefix-closed (see the file comment), so "worker w holds block
 * i" is true for i below w's prefix length and false from it on: a binary search per worker
 * finds it. The searches share their probes: each probe's mask narrows every worker whose
 * interval contains it. About log2(n) lookups for a prompt instead of n. */
void kvr_cache_index_match(const kvr_cache_index_t *idx, const uint64_t *blocks, size_t n,
                           size_t *matched) {
  for (size_t w = 0; w < idx->max_workers; w++)
    matched[w] = 0;
  if (n == 0 || idx->nonempty == 0)
    return;
  uint64_t first = holders_of(idx, blocks[0]) & idx->nonempty;
  if (first == 0)
    return;
  uint64_t all = n > 1 ? holders_of(idx, blocks[n - 1]) & first : first;
  for (uint64_t b = all; b; b &= b - 1)
    matched[__builtin_ctzll(b)] = n;
  /* open: prefix length k in [lo, hi], 1 <= k <= n - 1 (block lo - 1 held, block hi not). */
  uint64_t open = first & ~all;
  size_t lo[KVR_MAX_WORKERS], hi[KVR_MAX_WORKERS];
  for (uint64_t b = open; b; b &= b - 1) {
    lo[__builtin_ctzll(b)] = 1;
    hi[__builtin_ctzll(b)] = n - 1;
  }
  while (open) {
    int w = __builtin_ctzll(open);
    if (lo[w] == hi[w]) {
      matched[w] = lo[w];
      open &= open - 1;
      continue;
    }
    size_t mid = lo[w] + (hi[w] - lo[w]) / 2;
    uint64_t held = holders_of(idx, blocks[mid]);
    for (uint64_t b = open; b; b &= b - 1) {
      int v = __builtin_ctzll(b);
      if (lo[v] <= mid && mid < hi[v]) {
        if (held >> v & 1)
          lo[v] = mid + 1;
        else
          hi[v] = mid;
      }
    }
  }
}

int kvr_cache_index_forget_worker(kvr_cache_index_t *idx, size_t worker) {
  if (worker >= idx->max_workers)
    return KVR_EINVAL;
  worker_t *w = &idx->workers[worker];
  while (w->lru != NIL)
    remove_node(idx, w->lru);
  return 0;
}

uint64_t kvr_cache_index_entries(const kvr_cache_index_t *idx, size_t worker) {
  return worker < idx->max_workers ? idx->workers[worker].count : 0;
}

int kvr_cache_index_reserve(kvr_cache_index_t *idx, uint64_t nblocks) {
  if (nblocks > MAX_SLOTS / 100 * MAX_LOAD_PCT)
    return KVR_ELIMIT; /* more than the table can ever hold (and no arithmetic overflows below) */
  uint64_t slots = (nblocks * 100 + MAX_LOAD_PCT - 1) / MAX_LOAD_PCT;
  uint64_t nbuckets = (slots + BUCKET - 1) / BUCKET;
  if (nbuckets > idx->t.nbuckets) {
    int rc = resize(idx, nbuckets, NULL, NIL);
    if (rc)
      return rc;
  }
  return nblocks > idx->nnodes ? grow_nodes(idx, nblocks) : 0;
}

void kvr_cache_index_stats(const kvr_cache_index_t *idx, kvr_cache_index_stats_t *out) {
  memset(out, 0, sizeof(*out));
  out->blocks = idx->used;
  out->entries = idx->entries;
  out->table_slots = idx->t.nbuckets * BUCKET;
  out->node_slots = idx->nnodes;
  out->bytes = sizeof(*idx) + out->table_slots * (sizeof(slot_t) + sizeof(uint32_t)) +
               (uint64_t)idx->nnodes * sizeof(node_t);
  out->bytes_per_entry = idx->entries ? (double)out->bytes / (double)idx->entries : 0;
  out->inserts = idx->inserts;
  out->evictions = idx->evictions;
}

uint64_t kvr_cache_index_capacity_from_vllm(uint64_t num_gpu_blocks, uint64_t block_size_tokens,
                                            size_t block_chars) {
  if (num_gpu_blocks == 0 || block_size_tokens == 0 || block_chars == 0)
    return 0;
  uint64_t chars;
  if (__builtin_mul_overflow(num_gpu_blocks, block_size_tokens, &chars) ||
      __builtin_mul_overflow(chars, (uint64_t)KVR_CHARS_PER_TOKEN, &chars))
    return UINT64_MAX; /* an absurd scrape: unbounded rather than wrapped */
  return chars / block_chars;
}

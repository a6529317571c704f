/* cache_index.c -- block hash -> workers index with a per-worker LRU bound.
 *
 * Structures (all indexes are uint32, never pointers, so the arrays can be reallocated freely):
 *
 *   slots[]  open-addressing table, linear probing, power-of-two size, load <= 0.7:
 *            { hash, mask } where mask has bit w set when worker w holds the block; mask == 0
 *            marks an empty slot (a block nobody holds is deleted at once).
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
 * worker already holds so the request never evicts its own beginning. Removing a worker's last hold
 * on a block deletes the slot with backward-shift deletion (no tombstones), which moves later slots
 * of the cluster back; moved slots rewrite the slot field of their few chain nodes. match reads
 * only slots[] and prefetches ahead, because a 64 KiB prompt is ~1,000 independent lookups in a
 * table far larger than the caches.
 *
 * Invariants: mask bit w set <=> exactly one node of worker w is in the slot's chain;
 * workers[w].count == length of w's LRU list <= capacity; nonempty has bit w <=> count > 0.
 */
#include "cache_index.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kvr.h"
#include "policies/policy.h"

#define NIL UINT32_MAX
#define SLOT_BITS 26
#define SLOT_MASK ((UINT32_C(1) << SLOT_BITS) - 1)
#define MAX_SLOTS (UINT64_C(1) << SLOT_BITS)
#define MIN_SLOTS 1024
#define PREFETCH_AHEAD 12

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

struct kvr_cache_index_s {
  slot_t *slots;
  uint32_t *heads;
  uint64_t nslots; /* power of two */
  uint64_t used;   /* occupied slots */
  node_t *nodes;
  uint32_t nnodes; /* allocated */
  uint32_t free_head;
  uint64_t entries;
  worker_t workers[KVR_MAX_WORKERS];
  size_t max_workers;
  uint64_t nonempty; /* bit w: worker w holds something */
  uint64_t inserts, evictions;
};

static inline uint32_t node_slot(const node_t *n) {
  return n->slot_w & SLOT_MASK;
}
static inline uint32_t node_worker(const node_t *n) {
  return n->slot_w >> SLOT_BITS;
}

/* Returns the slot holding hash, or NIL. */
static inline uint32_t find_slot(const kvr_cache_index_t *idx, uint64_t hash) {
  uint64_t m = idx->nslots - 1;
  for (uint64_t i = hash & m;; i = (i + 1) & m) {
    const slot_t *s = &idx->slots[i];
    if (s->mask == 0)
      return NIL;
    if (s->hash == hash)
      return (uint32_t)i;
  }
}

/* Places an occupied slot's content into a table being rebuilt (no duplicates possible). */
static uint32_t place(slot_t *slots, uint64_t nslots, uint64_t hash) {
  uint64_t m = nslots - 1;
  uint64_t i = hash & m;
  while (slots[i].mask != 0)
    i = (i + 1) & m;
  return (uint32_t)i;
}

static void fix_chain(kvr_cache_index_t *idx, uint32_t slot) {
  for (uint32_t n = idx->heads[slot]; n != NIL; n = idx->nodes[n].chain)
    idx->nodes[n].slot_w = slot | (idx->nodes[n].slot_w & ~SLOT_MASK);
}

/* Allocates a zeroed slot table. Large tables are 2 MiB-aligned and advised to use transparent
 * huge pages: a match is ~1,000 random reads over tens of MiB, and with 4 KiB pages most of them
 * would also miss the TLB. */
static slot_t *alloc_slots(uint64_t nslots) {
  size_t bytes = nslots * sizeof(slot_t);
  size_t huge = (size_t)2 << 20;
  if (bytes < huge)
    return calloc(nslots, sizeof(slot_t));
  void *p = NULL;
  if (posix_memalign(&p, huge, bytes) != 0)
    return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE); /* advisory: failure only costs speed */
#endif
  memset(p, 0, bytes);
  return p;
}

static int resize(kvr_cache_index_t *idx, uint64_t nslots) {
  if (nslots > MAX_SLOTS)
    return KVR_ELIMIT;
  slot_t *slots = alloc_slots(nslots);
  uint32_t *heads = malloc(nslots * sizeof(*heads));
  if (slots == NULL || heads == NULL) {
    free(slots);
    free(heads);
    return KVR_ENOMEM;
  }
  for (uint64_t i = 0; i < idx->nslots; i++) {
    if (idx->slots[i].mask == 0)
      continue;
    uint32_t j = place(slots, nslots, idx->slots[i].hash);
    slots[j] = idx->slots[i];
    heads[j] = idx->heads[i];
  }
  free(idx->slots);
  free(idx->heads);
  idx->slots = slots;
  idx->heads = heads;
  idx->nslots = nslots;
  for (uint64_t i = 0; i < nslots; i++)
    if (slots[i].mask != 0)
      fix_chain(idx, (uint32_t)i);
  return 0;
}

/* Makes room for one more occupied slot. */
static int ensure_slot_room(kvr_cache_index_t *idx) {
  if ((idx->used + 1) * 10 <= idx->nslots * 7)
    return 0;
  return resize(idx, idx->nslots * 2);
}

/* Backward-shift deletion of slot i (linear probing without tombstones). */
static void delete_slot(kvr_cache_index_t *idx, uint32_t i) {
  uint64_t m = idx->nslots - 1;
  uint64_t hole = i;
  for (uint64_t j = (hole + 1) & m; idx->slots[j].mask != 0; j = (j + 1) & m) {
    uint64_t home = idx->slots[j].hash & m;
    /* The entry at j may move into the hole unless its home lies cyclically in (hole, j]. */
    bool home_between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (home_between)
      continue;
    idx->slots[hole] = idx->slots[j];
    idx->heads[hole] = idx->heads[j];
    fix_chain(idx, (uint32_t)hole);
    hole = j;
  }
  idx->slots[hole].mask = 0;
  idx->slots[hole].hash = 0;
  idx->heads[hole] = NIL;
  idx->used--;
}

static uint32_t alloc_node(kvr_cache_index_t *idx) {
  if (idx->free_head == NIL) {
    uint64_t n = idx->nnodes ? (uint64_t)idx->nnodes * 2 : 1024;
    if (n > NIL)
      n = NIL;
    if (n <= idx->nnodes)
      return NIL;
    node_t *nodes = realloc(idx->nodes, n * sizeof(*nodes));
    if (nodes == NULL)
      return NIL;
    idx->nodes = nodes;
    for (uint64_t k = idx->nnodes; k < n; k++)
      nodes[k].next = k + 1 < n ? (uint32_t)(k + 1) : NIL;
    idx->free_head = idx->nnodes;
    idx->nnodes = (uint32_t)n;
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

/* Removes one entry; deletes its slot when no worker holds the block any more. */
static void remove_node(kvr_cache_index_t *idx, uint32_t n) {
  node_t *x = &idx->nodes[n];
  uint32_t slot = node_slot(x);
  uint32_t wi = node_worker(x);
  worker_t *w = &idx->workers[wi];
  lru_unlink(idx, w, n);
  uint32_t *link = &idx->heads[slot];
  while (*link != n)
    link = &idx->nodes[*link].chain;
  *link = x->chain;
  idx->slots[slot].mask &= ~(UINT64_C(1) << wi);
  x->next = idx->free_head;
  idx->free_head = n;
  w->count--;
  idx->entries--;
  if (w->count == 0)
    idx->nonempty &= ~(UINT64_C(1) << wi);
  if (idx->slots[slot].mask == 0)
    delete_slot(idx, slot);
}

static uint32_t find_node(const kvr_cache_index_t *idx, uint32_t slot, uint32_t worker) {
  for (uint32_t n = idx->heads[slot]; n != NIL; n = idx->nodes[n].chain)
    if (node_worker(&idx->nodes[n]) == worker)
      return n;
  return NIL;
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
  if (resize(idx, MIN_SLOTS) != 0) {
    free(idx);
    return NULL;
  }
  return idx;
}

void kvr_cache_index_free(kvr_cache_index_t *idx) {
  if (idx == NULL)
    return;
  free(idx->slots);
  free(idx->heads);
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
  if (slot != NIL && (idx->slots[slot].mask & bit)) {
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
    slot = find_slot(idx, hash); /* deletion may have shifted it */
  }
  if (slot == NIL) {
    int rc = ensure_slot_room(idx);
    if (rc)
      return rc;
    slot = place(idx->slots, idx->nslots, hash);
    idx->slots[slot].hash = hash;
    idx->heads[slot] = NIL;
    idx->used++;
  }
  uint32_t n = alloc_node(idx);
  if (n == NIL) {
    if (idx->slots[slot].mask == 0) {
      idx->slots[slot].mask = 1; /* make it deletable the normal way */
      delete_slot(idx, slot);
    }
    return KVR_ENOMEM;
  }
  node_t *x = &idx->nodes[n];
  x->slot_w = slot | (wi << SLOT_BITS);
  x->chain = idx->heads[slot];
  idx->heads[slot] = n;
  idx->slots[slot].mask |= bit;
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
  uint64_t bit = UINT64_C(1) << worker;
  /* When new blocks will evict, first touch the blocks the worker already holds, so that the
   * request's new deep blocks never push out its own shared beginning. */
  uint64_t missing = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t s = find_slot(idx, blocks[i]);
    missing += s == NIL || !(idx->slots[s].mask & bit);
  }
  if (missing && w->count + missing > w->capacity) {
    for (size_t i = n; i-- > 0;) {
      uint32_t s = find_slot(idx, blocks[i]);
      if (s != NIL && (idx->slots[s].mask & bit)) {
        uint32_t x = find_node(idx, s, (uint32_t)worker);
        lru_unlink(idx, w, x);
        lru_push_front(idx, w, x);
      }
    }
  }
  for (size_t i = n; i-- > 0;) {
    int rc = insert_one(idx, (uint32_t)worker, blocks[i]);
    if (rc)
      return rc;
  }
  return 0;
}

void kvr_cache_index_match(const kvr_cache_index_t *idx, const uint64_t *blocks, size_t n,
                           size_t *matched) {
  for (size_t w = 0; w < idx->max_workers; w++)
    matched[w] = 0;
  uint64_t alive = idx->nonempty;
  uint64_t m = idx->nslots - 1;
  size_t pre = KVR_MIN(n, (size_t)PREFETCH_AHEAD);
  for (size_t i = 0; i < pre; i++)
    __builtin_prefetch(&idx->slots[blocks[i] & m]);
  size_t i = 0;
  for (; i < n && alive; i++) {
    if (i + PREFETCH_AHEAD < n)
      __builtin_prefetch(&idx->slots[blocks[i + PREFETCH_AHEAD] & m]);
    uint32_t s = find_slot(idx, blocks[i]);
    uint64_t holders = s == NIL ? 0 : idx->slots[s].mask;
    uint64_t dropped = alive & ~holders;
    while (dropped) {
      matched[__builtin_ctzll(dropped)] = i;
      dropped &= dropped - 1;
    }
    alive &= holders;
  }
  while (alive) {
    matched[__builtin_ctzll(alive)] = i;
    alive &= alive - 1;
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
  uint64_t want = idx->nslots;
  while (nblocks * 10 > want * 7)
    want *= 2;
  return want == idx->nslots ? 0 : resize(idx, want);
}

void kvr_cache_index_stats(const kvr_cache_index_t *idx, kvr_cache_index_stats_t *out) {
  memset(out, 0, sizeof(*out));
  out->blocks = idx->used;
  out->entries = idx->entries;
  out->table_slots = idx->nslots;
  out->node_slots = idx->nnodes;
  out->bytes = sizeof(*idx) + idx->nslots * (sizeof(slot_t) + sizeof(uint32_t)) +
               (uint64_t)idx->nnodes * sizeof(node_t);
  out->bytes_per_entry = idx->entries ? (double)out->bytes / (double)idx->entries : 0;
  out->inserts = idx->inserts;
  out->evictions = idx->evictions;
}

uint64_t kvr_cache_index_capacity_from_vllm(uint64_t num_gpu_blocks, uint64_t block_size_tokens,
                                            size_t block_chars) {
  if (num_gpu_blocks == 0 || block_size_tokens == 0 || block_chars == 0)
    return 0;
  return num_gpu_blocks * block_size_tokens * KVR_CHARS_PER_TOKEN / block_chars;
}

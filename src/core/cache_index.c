/* cache_index.c -- block hash -> workers index with a per-worker LRU bound, for up to
 * KVR_MAX_WORKERS workers, growing a bucket at a time.
 *
 * Structures (all links are uint32 indexes, never pointers, and nothing ever moves in memory):
 *
 *   table    a bucketized cuckoo table under linear hashing: nbuckets = low + split buckets (low a
 *            power of two, 0 <= split < low) of 4 slots { hash, head, holders }, 16 bytes each, so
 *            a bucket is one 64-byte cache line. Buckets live in 2 MiB chunks of 32,768 through a
 *            directory: growing the table adds a bucket, never copies one. A block lives in one of
 *            its three buckets, b1 = addr(hash), b2 = addr(m) and b3 = addr(m rotated by 32 bits)
 *            with m = mix(hash), where addr(x) = x mod low, or x mod 2 * low when that is below
 *            split (those buckets have been split already).
 *            holders == 0 marks an empty slot (a block nobody holds is deleted at once); otherwise
 *            it is the set of workers holding the block: inline, up to two worker ids (15 bits
 *            each, id + 1, 0 for none), or, with the top bit set, a wide set: a bitset of 2^c words
 *            (c in bits 27..30) at index i (bits 0..26) of class c's pool, for blocks that three
 *            workers or more hold. head is the block's first node.
 *   nodes    one per (block, worker) entry: { prev, next } in the worker's LRU list, { chain } to
 *            the next node holding the same block, the last one's chain being END | the block's
 *            slot (so a node finds its slot at the end of its chain), { worker }. Nodes come in
 *            chunks of 16,384; free ones are linked through next, new ones taken past a high-water
 *            mark, so growing the nodes neither copies nor links them.
 *   pools    per class c, the wide sets of 2^c words, in 32 KiB chunks, free ones linked through
 *            their first word.
 *   workers  { mru, lru, count, capacity }, an array grown with the fleet.
 *
 *        slot {h, head, {w0, w2}}   head -> node a (w0) -> node b (w2) -> END | slot
 *        worker 0: mru -> ... <-> a <-> ... <- lru
 *
 * Flow: insert walks the request's blocks from last to first; each block is either touched (its
 * node moves to the front of the worker's list) or gets a node, after evicting the worker's tail
 * node when it is at capacity. When the insert will evict, a first pass touches the blocks the
 * worker already holds so the request never evicts its own beginning; it keeps their nodes (the
 * `touch` scratch) so that the second pass touches them again without finding them (touch_first
 * says when that is the same). A new block takes a free slot of b1, b2 or b3; when all three are
 * full it displaces a resident into another of that resident's buckets, and so on (a cuckoo walk
 * of at most MAX_KICKS moves, each rewriting the end of the moved block's chain). Removing a
 * worker's last hold on a block empties its slot.
 *
 * Growth (linear hashing, Litwin 1980, over the cuckoo table): before a new block would take the
 * load past MAX_LOAD_PCT, bucket `split` is split: bucket low + split is appended (zeroed memory,
 * a fresh chunk every 32,768 buckets) and the entries of `split` that its new addressing sends
 * there move, at most four, into the empty new bucket; then split advances (low doubles when it
 * reaches low). One split per ~3.6 new blocks, a few slot moves each, keeps the load at 90% as the
 * index grows: no insert rehashes the table, unlike the rebuild-by-half this replaced, whose last
 * rebuild on the way to 10 M blocks stalled one insert for ~0.7 s (`kvrouter bench routing`, the
 * "Index growth" line, policies/README.md). Buckets not yet split draw twice the hash space of
 * split ones; each block's three choices even that out (see bucket3). A walk that still fails
 * splits more buckets and tries again; only a table at its 2^30-slot limit drops the block a failed
 * walk left homeless. New table memory is faulted in 4 KiB at a time as buckets are appended; a
 * chunk is advised to use huge pages once full (chunk_full).
 *
 * match: each worker's blocks are prefix-closed -- a worker that holds a block holds its parent.
 * Blocks enter only as chains from a prompt's first block (kvr_cache_index_insert), touched last to
 * first, so a parent is never less recently used than its child, and LRU eviction takes the child
 * first; a block hash names its whole prefix, so a block has one parent. Hence "worker w holds
 * block i of the request" is true up to w's prefix length and false after it, and match binary-
 * searches it, for every worker holding the first block at once: the probe at the middle of an
 * interval splits the workers searching it into those holding the probed block (their prefix is
 * longer) and the others, in place, as quicksort partitions; ~2 + log2(n) lookups per group of
 * workers with a common prefix (a 64 KiB prompt: ~12, not 1,025), each at most three cache lines of
 * the table plus the line of a wide set. An insert that fails at a block (no memory, or the table
 * at its limit) takes back the deeper blocks it added, so the closure holds. (One path still
 * breaks it: a table that can no longer grow drops a block a failed walk displaced, children
 * included or not; the index is approximate, so that block's descendants are then matched as the
 * search happens to probe them.)
 *
 * Memory: 16 bytes per slot at up to 90% load (17.8 per block) and 16 per node: 33.8 bytes per
 * (block, worker) entry with one holder per block, plus the chunk rounding; a wide set is 8 bytes
 * per 64 worker ids up to its highest holder, shared by its three or more holders. Insert's scratch
 * holds 4 bytes per block of the longest prefix it touched.
 *
 * Invariants: worker w is in a slot's holders <=> exactly one node of worker w is in the slot's
 * chain; the chain ends in END | that slot; workers[w].count == length of w's LRU list <= capacity;
 * a block's slot is in its b1, b2 or b3 bucket; inline holders keep their first field nonzero; a
 * wide set holds three workers or more.
 */
#include "core/cache_index.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/kvr.h"
#include "policies/policy.h"

#define NIL UINT32_MAX
#define END UINT32_C(0x80000000) /* a chain's end: END | slot index */
#define BUCKET 4
#define MIN_BUCKETS 16                /* a power of two: the first `low` */
#define MAX_SLOTS (UINT64_C(1) << 30) /* slot indexes fit below END */
#define CHUNK_BITS 15                 /* buckets per table chunk: 2 MiB of them */
#define CHUNK_BUCKETS (UINT64_C(1) << CHUNK_BITS)
#define NODE_BITS 14 /* nodes per node chunk: 256 KiB */
#define NODE_CHUNK (UINT32_C(1) << NODE_BITS)
#define MAX_NODES (END - 1)
#define POOL_BITS 12   /* words per wide-set pool chunk: 32 KiB */
#define POOL_CLASSES 7 /* 2^0..2^6 words: up to 4,096 workers */
#define HOLD_WIDE UINT32_C(0x80000000)
#define HOLD_ID_MASK UINT32_C(0x7fff) /* an inline field: worker id + 1, 0 for none */
#define HOLD_INDEX_MASK ((UINT32_C(1) << 27) - 1)
/* Occupied slots at most MAX_LOAD_PCT% of all. 4-slot buckets with two choices fill to ~97%
 * before cuckoo walks start failing, but the walks grow long well before: in a throwaway test
 * of the rebuild, a full index of 1M blocks evicting and inserting took ~0.5 us per new block at
 * 90% against ~0.8 us at 95%. `kvrouter bench routing` ("Index steady state": --blocks random
 * blocks in 256-block chains into an index at capacity) gives the cost per new block. */
#define MAX_LOAD_PCT 90
#define MAX_KICKS 256
/* Splits tried after a failed walk before its homeless block is given up. */
#define RETRY_SPLITS 64

_Static_assert(KVR_MAX_WORKERS < HOLD_ID_MASK, "worker id + 1 fits an inline holders field");
_Static_assert(KVR_MAX_WORKERS <= (64 << (POOL_CLASSES - 1)), "the widest class holds every id");

typedef struct slot_s {
  uint64_t hash;
  uint32_t head;    /* first node holding the block, NIL while none */
  uint32_t holders; /* 0: empty slot; see the file comment */
} slot_t;

typedef struct node_s {
  uint32_t prev, next; /* worker LRU list (prev toward MRU); next links the free list too */
  uint32_t chain;      /* next node holding the same block, or END | the block's slot */
  uint32_t worker;
} node_t;

typedef struct worker_s {
  uint32_t mru, lru;
  uint64_t count;
  uint64_t capacity;
} worker_t;

/* One class of wide sets: sets of 2^c words in chunks of 2^POOL_BITS words. */
typedef struct pool_s {
  uint64_t **chunks;
  size_t nchunks, cap;
  uint32_t high; /* sets handed out at least once */
  uint32_t free_head;
  uint64_t live;
} pool_t;

struct kvr_cache_index_s {
  slot_t **chunks; /* table chunks of CHUNK_BUCKETS buckets (directory) */
  size_t nchunks, chunks_cap;
  uint64_t low, split, nbuckets; /* nbuckets == low + split */
  uint64_t used;                 /* occupied slots */
  node_t **node_chunks;
  size_t nnode_chunks, node_chunks_cap;
  uint32_t node_high; /* nodes handed out at least once */
  uint32_t free_head;
  uint64_t entries;
  pool_t pools[POOL_CLASSES];
  worker_t *workers;
  size_t nworkers;
  uint64_t default_capacity;
  uint64_t inserts, evictions, splits, kicks;
  uint64_t rng;     /* picks the slot a cuckoo walk displaces */
  uint32_t *touch;  /* insert's scratch: the nodes its first pass touched, by block */
  size_t touch_cap; /* entries touch has room for */
};

/* ---- table addressing ------------------------------------------------------------------------ */

/* MurmurHash3's 64-bit finalizer: the second bucket's hash, independent of the first's. */
static inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= UINT64_C(0xff51afd7ed558ccd);
  h ^= h >> 33;
  h *= UINT64_C(0xc4ceb9fe1a85ec53);
  h ^= h >> 33;
  return h;
}

/* Linear hashing's address of x: x mod low, or x mod 2 * low for the buckets split already. */
static inline uint64_t addr(const kvr_cache_index_t *idx, uint64_t x) {
  uint64_t a = x & (idx->low - 1);
  return a < idx->split ? x & (2 * idx->low - 1) : a;
}

static inline uint64_t bucket1(const kvr_cache_index_t *idx, uint64_t hash) {
  return addr(idx, hash);
}

static inline uint64_t bucket2(const kvr_cache_index_t *idx, uint64_t hash) {
  return addr(idx, mix(hash));
}

/* The third: the other half of the second's mix. Three choices, not the usual two, because linear
 * hashing leaves the buckets not yet split with twice the hash space of the split ones: with two
 * choices a table whose split pointer stands mid-way needed ~3.5 cuckoo moves per new block in a
 * full index of 10 M blocks (1.3 us per block), with three 0.5 (0.46 us, as the uniform table
 * this replaced). The price is a third cache line for a lookup that misses. */
static inline uint64_t bucket3(const kvr_cache_index_t *idx, uint64_t hash) {
  uint64_t m = mix(hash);
  return addr(idx, m >> 32 | m << 32);
}

/* The three buckets of hash into c. */
static inline void buckets_of(const kvr_cache_index_t *idx, uint64_t hash, uint64_t *c) {
  c[0] = bucket1(idx, hash);
  c[1] = bucket2(idx, hash);
  c[2] = bucket3(idx, hash);
}

static inline slot_t *bucket_at(const kvr_cache_index_t *idx, uint64_t b) {
  return idx->chunks[b >> CHUNK_BITS] + (b & (CHUNK_BUCKETS - 1)) * BUCKET;
}

static inline slot_t *slot_at(const kvr_cache_index_t *idx, uint32_t s) {
  return bucket_at(idx, s / BUCKET) + s % BUCKET;
}

static inline node_t *node_at(const kvr_cache_index_t *idx, uint32_t n) {
  return &idx->node_chunks[n >> NODE_BITS][n & (NODE_CHUNK - 1)];
}

/* Returns the slot of hash within bucket b, or NIL. */
static inline uint32_t find_in(const kvr_cache_index_t *idx, uint64_t b, uint64_t hash) {
  const slot_t *s = bucket_at(idx, b);
  for (uint32_t k = 0; k < BUCKET; k++)
    if (s[k].hash == hash && s[k].holders != 0)
      return (uint32_t)(b * BUCKET + k);
  return NIL;
}

/* Returns the slot holding hash, or NIL. */
static inline uint32_t find_slot(const kvr_cache_index_t *idx, uint64_t hash) {
  uint32_t s = find_in(idx, bucket1(idx, hash), hash);
  if (s != NIL)
    return s;
  s = find_in(idx, bucket2(idx, hash), hash);
  return s != NIL ? s : find_in(idx, bucket3(idx, hash), hash);
}

/* Returns an empty slot of bucket b, or NIL. */
static inline uint32_t free_in(const kvr_cache_index_t *idx, uint64_t b) {
  const slot_t *s = bucket_at(idx, b);
  for (uint32_t k = 0; k < BUCKET; k++)
    if (s[k].holders == 0)
      return (uint32_t)(b * BUCKET + k);
  return NIL;
}

/* Points the end of slot's chain at slot (after the block moved there). */
static void fix_chain(kvr_cache_index_t *idx, uint32_t slot) {
  uint32_t n = slot_at(idx, slot)->head;
  if (n == NIL)
    return;
  while (!(node_at(idx, n)->chain & END))
    n = node_at(idx, n)->chain;
  node_at(idx, n)->chain = END | slot;
}

/* The slot of node n's block: the end of its chain. */
static uint32_t chain_slot(const kvr_cache_index_t *idx, uint32_t n) {
  uint32_t c = node_at(idx, n)->chain;
  while (!(c & END))
    c = node_at(idx, c)->chain;
  return c & ~END;
}

/* ---- memory ---------------------------------------------------------------------------------- */

#define CHUNK_BYTES ((size_t)(CHUNK_BUCKETS * BUCKET * sizeof(slot_t)))

/* A zeroed 2 MiB-aligned table chunk. Its pages come zeroed from the kernel as they are first
 * touched, 4 KiB at a time as splits append buckets (no memset: a chunk costs nothing until
 * buckets land in it, and growth faults in ~1 page per 230 new blocks). */
static slot_t *chunk_new(void) {
  char *p = mmap(NULL, 2 * CHUNK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  char *aligned = (char *)(((uintptr_t)p + CHUNK_BYTES - 1) & ~(uintptr_t)(CHUNK_BYTES - 1));
  if (aligned > p)
    munmap(p, (size_t)(aligned - p));
  if (aligned + CHUNK_BYTES < p + 2 * CHUNK_BYTES)
    munmap(aligned + CHUNK_BYTES, (size_t)(p + 2 * CHUNK_BYTES - (aligned + CHUNK_BYTES)));
  return (slot_t *)aligned;
}

/* A chunk the table has filled is advised to use transparent huge pages: a match is ~12 random
 * reads over tens of MiB, most of which would also miss the TLB with 4 KiB pages. Advised only
 * once full, so that growth never faults in a whole 2 MiB page inside an insert (0.2 ms, and 5 ms
 * on memory a VM's host has not yet given it); khugepaged merges the chunk later, in the
 * background. Advisory: a failure only costs speed. */
static void chunk_full(slot_t *chunk) {
#ifdef MADV_HUGEPAGE
  madvise(chunk, CHUNK_BYTES, MADV_HUGEPAGE);
#else
  (void)chunk;
#endif
}

/* Makes the directory hold table chunks for nbuckets buckets. */
static int table_reserve(kvr_cache_index_t *idx, uint64_t nbuckets) {
  size_t need = (size_t)((nbuckets + CHUNK_BUCKETS - 1) >> CHUNK_BITS);
  while (idx->nchunks < need) {
    if (idx->nchunks == idx->chunks_cap) {
      size_t cap = idx->chunks_cap ? 2 * idx->chunks_cap : 4;
      slot_t **d = realloc(idx->chunks, cap * sizeof *d);
      if (d == NULL)
        return KVR_ENOMEM;
      idx->chunks = d;
      idx->chunks_cap = cap;
    }
    slot_t *c = chunk_new();
    if (c == NULL)
      return KVR_ENOMEM;
    if (idx->nchunks > 0)
      chunk_full(idx->chunks[idx->nchunks - 1]);
    idx->chunks[idx->nchunks++] = c;
  }
  return 0;
}

/* A node from the free list or past the high-water mark (a new chunk every NODE_CHUNK), or NIL. */
static uint32_t alloc_node(kvr_cache_index_t *idx) {
  if (idx->free_head != NIL) {
    uint32_t n = idx->free_head;
    idx->free_head = node_at(idx, n)->next;
    return n;
  }
  if (idx->node_high >= MAX_NODES)
    return NIL;
  if ((idx->node_high >> NODE_BITS) == idx->nnode_chunks) {
    if (idx->nnode_chunks == idx->node_chunks_cap) {
      size_t cap = idx->node_chunks_cap ? 2 * idx->node_chunks_cap : 8;
      node_t **d = realloc(idx->node_chunks, cap * sizeof *d);
      if (d == NULL)
        return NIL;
      idx->node_chunks = d;
      idx->node_chunks_cap = cap;
    }
    node_t *c = malloc(NODE_CHUNK * sizeof(node_t));
    if (c == NULL)
      return NIL;
    idx->node_chunks[idx->nnode_chunks++] = c;
  }
  return idx->node_high++;
}

/* ---- holder sets ----------------------------------------------------------------------------- */

static inline uint32_t hold_class(uint32_t h) {
  return h >> 27 & 0xf;
}

/* The words of wide set h. */
static inline uint64_t *wide_words(const kvr_cache_index_t *idx, uint32_t h) {
  uint32_t c = hold_class(h);
  uint64_t off = (uint64_t)(h & HOLD_INDEX_MASK) << c;
  return idx->pools[c].chunks[off >> POOL_BITS] + (off & ((UINT64_C(1) << POOL_BITS) - 1));
}

/* Whether worker w is in holders h. */
static inline bool holds(const kvr_cache_index_t *idx, uint32_t h, uint32_t w) {
  if (!(h & HOLD_WIDE))
    return (h & HOLD_ID_MASK) == w + 1 || (h >> 15 & HOLD_ID_MASK) == w + 1;
  if (w >= UINT32_C(64) << hold_class(h))
    return false;
  return wide_words(idx, h)[w / 64] >> (w % 64) & 1;
}

/* A zeroed wide set of class c: its holders word, or 0 when out of memory. */
static uint32_t wide_new(kvr_cache_index_t *idx, uint32_t c) {
  pool_t *p = &idx->pools[c];
  uint32_t i;
  if (p->free_head != NIL) {
    i = p->free_head;
    p->free_head = (uint32_t)wide_words(idx, HOLD_WIDE | c << 27 | i)[0];
  } else {
    if (p->high > HOLD_INDEX_MASK)
      return 0;
    uint64_t off = (uint64_t)p->high << c;
    if ((off >> POOL_BITS) == p->nchunks) {
      if (p->nchunks == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 4;
        uint64_t **d = realloc(p->chunks, cap * sizeof *d);
        if (d == NULL)
          return 0;
        p->chunks = d;
        p->cap = cap;
      }
      uint64_t *chunk = malloc(sizeof(uint64_t) << POOL_BITS);
      if (chunk == NULL)
        return 0;
      p->chunks[p->nchunks++] = chunk;
    }
    i = p->high++;
  }
  p->live++;
  uint32_t h = HOLD_WIDE | c << 27 | i;
  memset(wide_words(idx, h), 0, sizeof(uint64_t) << c);
  return h;
}

static void wide_free(kvr_cache_index_t *idx, uint32_t h) {
  pool_t *p = &idx->pools[hold_class(h)];
  wide_words(idx, h)[0] = p->free_head;
  p->free_head = h & HOLD_INDEX_MASK;
  p->live--;
}

/* The class whose sets hold worker ids below 64 * 2^c, for id w. */
static uint32_t class_for(uint32_t w) {
  uint32_t c = 0;
  while ((UINT32_C(64) << c) <= w)
    c++;
  return c;
}

/* A wide set of the class for ids up to max with the bits of ids[0..n) set, or 0. */
static uint32_t wide_with(kvr_cache_index_t *idx, uint32_t max, const uint32_t *ids, size_t n) {
  uint32_t h = wide_new(idx, class_for(max));
  if (h == 0)
    return 0;
  uint64_t *words = wide_words(idx, h);
  for (size_t k = 0; k < n; k++)
    words[ids[k] / 64] |= UINT64_C(1) << (ids[k] % 64);
  return h;
}

/* Adds worker w (not in it) to *h. Returns 0 or KVR_ENOMEM (*h unchanged). */
static int holders_add(kvr_cache_index_t *idx, uint32_t *h, uint32_t w) {
  uint32_t a = *h & HOLD_ID_MASK, b = *h >> 15 & HOLD_ID_MASK;
  if (!(*h & HOLD_WIDE) && a == 0) {
    *h = w + 1;
    return 0;
  }
  if (!(*h & HOLD_WIDE) && b == 0) {
    *h |= (w + 1) << 15;
    return 0;
  }
  if (!(*h & HOLD_WIDE)) { /* a third holder: the pair becomes a bitset */
    uint32_t ids[3] = {a - 1, b - 1, w};
    uint32_t wide = wide_with(idx, KVR_MAX(KVR_MAX(a - 1, b - 1), w), ids, 3);
    if (wide == 0)
      return KVR_ENOMEM;
    *h = wide;
    return 0;
  }
  if (w >= UINT32_C(64) << hold_class(*h)) { /* an id past the set's words: a wider class */
    uint32_t wide = wide_new(idx, class_for(w));
    if (wide == 0)
      return KVR_ENOMEM;
    memcpy(wide_words(idx, wide), wide_words(idx, *h), sizeof(uint64_t) << hold_class(*h));
    wide_free(idx, *h);
    *h = wide;
  }
  wide_words(idx, *h)[w / 64] |= UINT64_C(1) << (w % 64);
  return 0;
}

/* Removes worker w (in it) from *h; a wide set left with two holders or fewer goes back inline.
 */
static void holders_remove(kvr_cache_index_t *idx, uint32_t *h, uint32_t w) {
  if (!(*h & HOLD_WIDE)) {
    uint32_t a = *h & HOLD_ID_MASK, b = *h >> 15 & HOLD_ID_MASK;
    *h = a == w + 1 ? b : a; /* the one left, first */
    return;
  }
  uint64_t *words = wide_words(idx, *h);
  size_t nwords = (size_t)1 << hold_class(*h), left = 0;
  words[w / 64] &= ~(UINT64_C(1) << (w % 64));
  for (size_t k = 0; k < nwords; k++)
    left += (size_t)__builtin_popcountll(words[k]);
  if (left > 2)
    return;
  uint32_t in = 0;
  for (size_t k = 0; k < nwords; k++)
    for (uint64_t x = words[k]; x; x &= x - 1) {
      uint32_t id = (uint32_t)(k * 64 + (size_t)__builtin_ctzll(x)) + 1;
      in = in == 0 ? id : in | id << 15;
    }
  wide_free(idx, *h);
  *h = in;
}

/* Releases what holders h owns (a wide set). */
static void holders_drop(kvr_cache_index_t *idx, uint32_t h) {
  if (h & HOLD_WIDE)
    wide_free(idx, h);
}

/* ---- growth and placement -------------------------------------------------------------------- */

/* Appends bucket low + split and moves into it the entries of bucket split that the new
 * addressing sends there (at most four, into an empty bucket: always room). O(1). */
static int split_one(kvr_cache_index_t *idx) {
  uint64_t nb = idx->nbuckets;
  if ((nb + 1) * BUCKET > MAX_SLOTS)
    return KVR_ELIMIT;
  int rc = table_reserve(idx, nb + 1);
  if (rc)
    return rc;
  uint64_t src = idx->split;
  idx->nbuckets = nb + 1;
  if (++idx->split == idx->low) {
    idx->low *= 2;
    idx->split = 0;
  }
  idx->splits++;
  slot_t *from = bucket_at(idx, src), *to = bucket_at(idx, nb);
  uint32_t k2 = 0;
  for (uint32_t k = 0; k < BUCKET; k++) {
    if (from[k].holders == 0)
      continue;
    uint64_t h = from[k].hash;
    if (bucket1(idx, h) == src || bucket2(idx, h) == src || bucket3(idx, h) == src)
      continue; /* still addressed here */
    to[k2] = from[k];
    memset(&from[k], 0, sizeof from[k]);
    fix_chain(idx, (uint32_t)(nb * BUCKET + k2));
    k2++;
  }
  return 0;
}

/* Puts the entry *e into the table: a free slot of one of its three buckets, else a cuckoo walk
 * (displace a resident into another of its buckets, preferring one with room, where the walk ends;
 * else a random one); every moved entry's chain end follows it. Returns true when everything has
 * a slot; false after MAX_KICKS moves, with the entry left without a slot in *e (its chain still
 * names its old slot). */
static bool cuckoo_put(kvr_cache_index_t *idx, slot_t *e) {
  uint64_t c[3];
  buckets_of(idx, e->hash, c);
  uint64_t b = c[0];
  uint32_t s = NIL;
  for (int i = 0; i < 3 && s == NIL; i++)
    s = free_in(idx, b = c[i]);
  if (s == NIL)
    b = c[kvr_policy_rand(&idx->rng) % 3];
  for (int kick = 0; s == NIL && kick < MAX_KICKS; kick++) {
    /* The resident to displace: one with another bucket that has room, else a random one. */
    slot_t *bk = bucket_at(idx, b);
    uint32_t k = (uint32_t)(kvr_policy_rand(&idx->rng) % BUCKET);
    uint64_t to = NIL;
    for (uint32_t j = 0; j < BUCKET && to == NIL; j++) {
      buckets_of(idx, bk[j].hash, c);
      for (int i = 0; i < 3 && to == NIL; i++)
        if (c[i] != b && free_in(idx, c[i]) != NIL) {
          k = j;
          to = c[i];
        }
    }
    idx->kicks++;
    slot_t out = bk[k];
    bk[k] = *e;
    fix_chain(idx, (uint32_t)(b * BUCKET + k));
    *e = out;
    if (to == NIL) { /* on to a random one of its other buckets */
      buckets_of(idx, e->hash, c);
      to = c[kvr_policy_rand(&idx->rng) % 3];
      for (int i = 0; i < 3 && to == b; i++)
        to = c[i];
    }
    b = to;
    s = free_in(idx, b);
  }
  if (s == NIL)
    return false;
  *slot_at(idx, s) = *e;
  fix_chain(idx, s);
  return true;
}

static void drop_chain(kvr_cache_index_t *idx, uint32_t head);

/* Gives hash a slot holding worker w (no node yet) and returns it, or NIL with *rc set. */
static uint32_t add_slot(kvr_cache_index_t *idx, uint64_t hash, uint32_t w, int *rc) {
  while ((idx->used + 1) * 100 > idx->nbuckets * BUCKET * MAX_LOAD_PCT) {
    *rc = split_one(idx);
    if (*rc)
      return NIL;
  }
  slot_t e = {hash, NIL, w + 1};
  bool placed = cuckoo_put(idx, &e);
  for (int k = 0; !placed && k < RETRY_SPLITS; k++) {
    /* A failed walk: more buckets (their entries spread out), then the homeless entry again. */
    if (split_one(idx) == 0 && split_one(idx) == 0)
      placed = cuckoo_put(idx, &e);
    else
      break;
  }
  if (!placed) {
    /* No bigger table: the block the walk left without a slot is forgotten, its entries dropped
     * as evictions. When that is not the new block, the new block (placed, no node yet) leaves
     * its slot too, so every holder keeps its node. */
    drop_chain(idx, e.head);
    holders_drop(idx, e.holders);
    if (e.hash != hash) {
      idx->used--;
      memset(slot_at(idx, find_slot(idx, hash)), 0, sizeof(slot_t));
    }
    *rc = KVR_ELIMIT;
    return NIL;
  }
  idx->used++;
  return find_slot(idx, hash);
}

/* ---- entries --------------------------------------------------------------------------------- */

static void lru_unlink(kvr_cache_index_t *idx, worker_t *w, uint32_t n) {
  node_t *x = node_at(idx, n);
  if (x->prev != NIL)
    node_at(idx, x->prev)->next = x->next;
  else
    w->mru = x->next;
  if (x->next != NIL)
    node_at(idx, x->next)->prev = x->prev;
  else
    w->lru = x->prev;
}

static void lru_push_front(kvr_cache_index_t *idx, worker_t *w, uint32_t n) {
  node_t *x = node_at(idx, n);
  x->prev = NIL;
  x->next = w->mru;
  if (w->mru != NIL)
    node_at(idx, w->mru)->prev = n;
  w->mru = n;
  if (w->lru == NIL)
    w->lru = n;
}

/* Returns node n to the free list and its worker's count (n is out of every list). */
static void free_node(kvr_cache_index_t *idx, uint32_t n, uint32_t wi) {
  node_at(idx, n)->next = idx->free_head;
  idx->free_head = n;
  idx->workers[wi].count--;
  idx->entries--;
}

/* Removes one entry; empties its slot when no worker holds the block any more. */
static void remove_node(kvr_cache_index_t *idx, uint32_t n) {
  node_t *x = node_at(idx, n);
  uint32_t wi = x->worker, slot = chain_slot(idx, n);
  slot_t *sl = slot_at(idx, slot);
  lru_unlink(idx, &idx->workers[wi], n);
  uint32_t after = x->chain & END ? NIL : x->chain;
  if (sl->head == n) {
    sl->head = after;
  } else {
    uint32_t p = sl->head;
    while (node_at(idx, p)->chain != n)
      p = node_at(idx, p)->chain;
    node_at(idx, p)->chain = x->chain; /* the end moves up when n was the last */
  }
  holders_remove(idx, &sl->holders, wi);
  free_node(idx, n, wi);
  if (sl->holders == 0) {
    memset(sl, 0, sizeof *sl);
    idx->used--;
  }
}

/* Drops the entries of a chain whose block lost its slot (their chain end is stale). */
static void drop_chain(kvr_cache_index_t *idx, uint32_t head) {
  while (head != NIL) {
    uint32_t n = head;
    uint32_t wi = node_at(idx, n)->worker;
    head = node_at(idx, n)->chain & END ? NIL : node_at(idx, n)->chain;
    lru_unlink(idx, &idx->workers[wi], n);
    free_node(idx, n, wi);
    idx->evictions++;
  }
}

static uint32_t find_node(const kvr_cache_index_t *idx, uint32_t slot, uint32_t worker) {
  /* NIL (no nodes) has the END bit too */
  for (uint32_t n = slot_at(idx, slot)->head; !(n & END); n = node_at(idx, n)->chain)
    if (node_at(idx, n)->worker == worker)
      return n;
  return NIL;
}

/* The node of (hash, worker), or NIL when the worker does not hold the block. */
static uint32_t node_of(const kvr_cache_index_t *idx, uint64_t hash, uint32_t worker) {
  uint32_t s = find_slot(idx, hash);
  return s == NIL ? NIL : find_node(idx, s, worker);
}

/* The workers holding hash (0 when none). */
static inline uint32_t holders_of(const kvr_cache_index_t *idx, uint64_t hash) {
  uint32_t s = find_slot(idx, hash);
  return s == NIL ? 0 : slot_at(idx, s)->holders;
}

/* ---- the API --------------------------------------------------------------------------------- */

kvr_cache_index_t *kvr_cache_index_new(size_t workers, uint64_t default_capacity) {
  if (workers == 0 || workers > KVR_MAX_WORKERS)
    return NULL;
  kvr_cache_index_t *idx = calloc(1, sizeof(*idx));
  if (idx == NULL)
    return NULL;
  idx->free_head = NIL;
  for (size_t c = 0; c < POOL_CLASSES; c++)
    idx->pools[c].free_head = NIL;
  idx->default_capacity = default_capacity;
  idx->rng = UINT64_C(0x9e3779b97f4a7c15);
  idx->low = idx->nbuckets = MIN_BUCKETS;
  if (table_reserve(idx, MIN_BUCKETS) != 0 || kvr_cache_index_set_workers(idx, workers) != 0) {
    kvr_cache_index_free(idx);
    return NULL;
  }
  return idx;
}

int kvr_cache_index_set_workers(kvr_cache_index_t *idx, size_t workers) {
  if (workers > KVR_MAX_WORKERS)
    return KVR_EINVAL;
  if (workers <= idx->nworkers)
    return 0;
  worker_t *w = realloc(idx->workers, workers * sizeof *w);
  if (w == NULL)
    return KVR_ENOMEM;
  for (size_t i = idx->nworkers; i < workers; i++)
    w[i] = (worker_t){NIL, NIL, 0, idx->default_capacity};
  idx->workers = w;
  idx->nworkers = workers;
  return 0;
}

size_t kvr_cache_index_workers(const kvr_cache_index_t *idx) {
  return idx->nworkers;
}

void kvr_cache_index_free(kvr_cache_index_t *idx) {
  if (idx == NULL)
    return;
  for (size_t i = 0; i < idx->nchunks; i++)
    munmap(idx->chunks[i], CHUNK_BYTES);
  free(idx->chunks);
  for (size_t i = 0; i < idx->nnode_chunks; i++)
    free(idx->node_chunks[i]);
  free(idx->node_chunks);
  for (size_t c = 0; c < POOL_CLASSES; c++) {
    for (size_t i = 0; i < idx->pools[c].nchunks; i++)
      free(idx->pools[c].chunks[i]);
    free(idx->pools[c].chunks);
  }
  free(idx->workers);
  free(idx->touch);
  free(idx);
}

int kvr_cache_index_set_capacity(kvr_cache_index_t *idx, size_t worker, uint64_t blocks) {
  if (worker >= idx->nworkers)
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
  return worker < idx->nworkers ? idx->workers[worker].capacity : 0;
}

static int insert_one(kvr_cache_index_t *idx, uint32_t wi, uint64_t hash) {
  worker_t *w = &idx->workers[wi];
  uint32_t slot = find_slot(idx, hash);
  if (slot != NIL && holds(idx, slot_at(idx, slot)->holders, wi)) {
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
  int rc = 0;
  if (slot == NIL)
    slot = add_slot(idx, hash, wi, &rc);
  else
    rc = holders_add(idx, &slot_at(idx, slot)->holders, wi);
  if (slot == NIL || rc) {
    node_at(idx, n)->next = idx->free_head;
    idx->free_head = n;
    return rc;
  }
  slot_t *sl = slot_at(idx, slot);
  node_t *x = node_at(idx, n);
  x->worker = wi;
  x->chain = sl->head != NIL ? sl->head : END | slot;
  sl->head = n;
  lru_push_front(idx, w, n);
  w->count++;
  idx->entries++;
  idx->inserts++;
  return 0;
}

/* How many leading blocks of blocks[0..n) worker w holds: the binary search of match for one
 * worker (the same probes, so the same answer). */
static size_t prefix_of(const kvr_cache_index_t *idx, uint32_t w, const uint64_t *blocks,
                        size_t n) {
  if (n == 0 || !holds(idx, holders_of(idx, blocks[0]), w))
    return 0;
  if (n == 1 || holds(idx, holders_of(idx, blocks[n - 1]), w))
    return n;
  size_t lo = 1, hi = n - 1; /* block lo - 1 held, block hi not */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (holds(idx, holders_of(idx, blocks[mid]), w))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* insert's first pass: touches the nodes of blocks[0..held), last to first. Returns them by block
 * (NIL: a block not held, see match) in idx->touch when insert's second pass can use them instead
 * of finding them again, else NULL. It can when n <= the worker's capacity: the touched nodes are
 * then the worker's most recent, and the at most n - held evictions of the second pass, which
 * take its least recent, reach none of them (they would only after all its count - held others),
 * so each is still the node insert_one would find for its block. (An insert that drops a block,
 * a table that can no longer grow, returns before the second pass reaches the touched blocks.) */
static uint32_t *touch_first(kvr_cache_index_t *idx, worker_t *w, uint32_t worker,
                             const uint64_t *blocks, size_t n, size_t held) {
  uint32_t *touched = NULL;
  if (n <= w->capacity && held <= idx->touch_cap)
    touched = idx->touch;
  else if (n <= w->capacity) {
    size_t cap = KVR_MAX(held, 2 * idx->touch_cap);
    uint32_t *t = realloc(idx->touch, cap * sizeof *t);
    if (t != NULL) { /* without it, the second pass finds the nodes again */
      idx->touch = touched = t;
      idx->touch_cap = cap;
    }
  }
  for (size_t i = held; i-- > 0;) {
    uint32_t x = node_of(idx, blocks[i], worker);
    if (touched != NULL)
      touched[i] = x;
    if (x == NIL)
      continue; /* only after a dropped block (see match): nothing to touch */
    lru_unlink(idx, w, x);
    lru_push_front(idx, w, x);
  }
  return touched;
}

int kvr_cache_index_insert(kvr_cache_index_t *idx, size_t worker, const uint64_t *blocks,
                           size_t n) {
  if (worker >= idx->nworkers)
    return KVR_EINVAL;
  worker_t *w = &idx->workers[worker];
  /* When new blocks will evict, first touch the blocks the worker already holds -- a prefix of
   * the chain, its blocks being prefix-closed -- so that the request's new deep blocks never push
   * out its own shared beginning. */
  size_t held = 0;
  uint32_t *touched = NULL; /* the first pass's nodes, by block, when they outlive the second */
  if (w->count + n > w->capacity) {
    held = prefix_of(idx, (uint32_t)worker, blocks, n);
    if (held < n && w->count + (n - held) > w->capacity)
      touched = touch_first(idx, w, (uint32_t)worker, blocks, n, held);
    else
      held = 0;
  }
  for (size_t i = n; i-- > 0;) {
    if (touched != NULL && i < held && touched[i] != NIL) {
      /* insert_one's touch of this node, without finding it again */
      lru_unlink(idx, w, touched[i]);
      lru_push_front(idx, w, touched[i]);
      continue;
    }
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

/* Moves the workers of ws[0..k) holding h to the front; returns how many. */
static size_t partition(const kvr_cache_index_t *idx, uint32_t h, uint32_t *ws, size_t k) {
  size_t j = 0;
  for (size_t i = 0; i < k; i++)
    if (holds(idx, h, ws[i])) {
      uint32_t t = ws[j];
      ws[j++] = ws[i];
      ws[i] = t;
    }
  return j;
}

/* The workers ws[0..k) hold block lo - 1 and not block hi + 1 (their prefix is in [lo, hi]):
 * probes the middle, and goes on with those holding it above it, the others below. Each group's
 * interval is its own (they never overlap), so every worker sees the probes its own binary search
 * would make. Recursion depth <= log2(hi - lo + 1). */
static void search(const kvr_cache_index_t *idx, const uint64_t *blocks, size_t lo, size_t hi,
                   uint32_t *ws, size_t k, size_t *matched) {
  while (k > 0) {
    if (lo == hi) {
      for (size_t i = 0; i < k; i++)
        matched[ws[i]] = lo;
      return;
    }
    size_t mid = lo + (hi - lo) / 2;
    size_t j = partition(idx, holders_of(idx, blocks[mid]), ws, k);
    search(idx, blocks, mid + 1, hi, ws, j, matched);
    ws += j;
    k -= j;
    hi = mid;
  }
}

/* The worker ids of holders h into ids (room for every worker); returns how many. */
static size_t holder_ids(const kvr_cache_index_t *idx, uint32_t h, uint32_t *ids) {
  if (!(h & HOLD_WIDE)) {
    size_t k = 0;
    if (h & HOLD_ID_MASK)
      ids[k++] = (h & HOLD_ID_MASK) - 1;
    if (h >> 15 & HOLD_ID_MASK)
      ids[k++] = (h >> 15 & HOLD_ID_MASK) - 1;
    return k;
  }
  const uint64_t *words = wide_words(idx, h);
  size_t k = 0, nwords = (size_t)1 << hold_class(h);
  for (size_t i = 0; i < nwords; i++)
    for (uint64_t x = words[i]; x; x &= x - 1)
      ids[k++] = (uint32_t)(i * 64 + (size_t)__builtin_ctzll(x));
  return k;
}

/* Each worker's held blocks are prefix-closed (see the file comment), so "worker w holds block
 * i" is true for i below w's prefix length and false from it on: the workers holding the first
 * block are binary-searched together, a probe serving every worker whose interval contains it.
 * About log2(n) lookups for a prompt instead of n. */
void kvr_cache_index_match(const kvr_cache_index_t *idx, const uint64_t *blocks, size_t n,
                           size_t *matched) {
  for (size_t w = 0; w < idx->nworkers; w++)
    matched[w] = 0;
  if (n == 0 || idx->entries == 0)
    return;
  uint32_t first = holders_of(idx, blocks[0]);
  if (first == 0)
    return;
  uint32_t local[256], *ws = local;
  if ((first & HOLD_WIDE) && (size_t)64 << hold_class(first) > KVR_ARRAY_SIZE(local))
    ws = kvr_xmalloc(((size_t)64 << hold_class(first)) * sizeof *ws);
  size_t k = holder_ids(idx, first, ws);
  /* Those holding the last block hold it all; the others' prefix is in [1, n - 1]. */
  size_t all = n > 1 ? partition(idx, holders_of(idx, blocks[n - 1]), ws, k) : k;
  for (size_t i = 0; i < all; i++)
    matched[ws[i]] = n;
  search(idx, blocks, 1, n - 1, ws + all, k - all, matched);
  if (ws != local)
    free(ws);
}

int kvr_cache_index_forget_worker(kvr_cache_index_t *idx, size_t worker) {
  if (worker >= idx->nworkers)
    return KVR_EINVAL;
  worker_t *w = &idx->workers[worker];
  while (w->lru != NIL)
    remove_node(idx, w->lru);
  return 0;
}

uint64_t kvr_cache_index_entries(const kvr_cache_index_t *idx, size_t worker) {
  return worker < idx->nworkers ? idx->workers[worker].count : 0;
}

int kvr_cache_index_reserve(kvr_cache_index_t *idx, uint64_t nblocks) {
  if (nblocks > MAX_SLOTS / 100 * MAX_LOAD_PCT)
    return KVR_ELIMIT; /* more than the table can ever hold (and no arithmetic overflows below) */
  uint64_t slots = (nblocks * 100 + MAX_LOAD_PCT - 1) / MAX_LOAD_PCT;
  uint64_t nbuckets = (slots + BUCKET - 1) / BUCKET;
  if (idx->used != 0 || nbuckets <= idx->nbuckets)
    return 0; /* grows a bucket at a time as blocks come */
  /* Empty: any addressing is valid, so the table takes its final size at once, its pages faulted
   * in here (huge ones where the kernel has them) rather than by the first inserts, whose random
   * writes would touch most of them at once. */
  size_t had = idx->nchunks;
  int rc = table_reserve(idx, nbuckets);
  if (rc)
    return rc;
  for (size_t i = had; i < idx->nchunks; i++) {
    chunk_full(idx->chunks[i]);
    for (size_t off = 0; off < CHUNK_BYTES; off += 4096)
      ((volatile char *)idx->chunks[i])[off] = 0;
  }
  uint64_t low = MIN_BUCKETS;
  while (2 * low <= nbuckets)
    low *= 2;
  idx->low = low;
  idx->split = nbuckets - low;
  idx->nbuckets = nbuckets;
  return 0;
}

void kvr_cache_index_stats(const kvr_cache_index_t *idx, kvr_cache_index_stats_t *out) {
  memset(out, 0, sizeof(*out));
  out->blocks = idx->used;
  out->entries = idx->entries;
  out->table_slots = idx->nbuckets * BUCKET;
  out->node_slots = (uint64_t)idx->nnode_chunks * NODE_CHUNK;
  uint64_t pool_bytes = 0;
  for (size_t c = 0; c < POOL_CLASSES; c++) {
    out->wide_sets += idx->pools[c].live;
    pool_bytes += (uint64_t)idx->pools[c].nchunks * (sizeof(uint64_t) << POOL_BITS) +
                  idx->pools[c].cap * sizeof(uint64_t *);
  }
  out->bytes = sizeof(*idx) + (uint64_t)idx->nchunks * CHUNK_BYTES +
               idx->chunks_cap * sizeof(slot_t *) + out->node_slots * sizeof(node_t) +
               idx->node_chunks_cap * sizeof(node_t *) + pool_bytes +
               idx->nworkers * sizeof(worker_t);
  out->bytes_per_entry = idx->entries ? (double)out->bytes / (double)idx->entries : 0;
  out->inserts = idx->inserts;
  out->evictions = idx->evictions;
  out->splits = idx->splits;
  out->kicks = idx->kicks;
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

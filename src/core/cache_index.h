/* cache_index.h -- which workers probably hold which prefix blocks (approximate mode).
 *
 * The router learns each worker's prefix cache from its own routing decisions: when a worker
 * accepts a prompt (a 2xx answer; and when the response completes, prompt plus answer) it inserts
 * the prompt's block hashes for that worker, at most the worker's context length of them. Per
 * worker the index is bounded by a capacity in blocks with least-recently-used eviction, so the
 * router forgets what the worker itself would have evicted. A worker that restarts or is removed
 * loses its state (kvr_cache_index_forget_worker).
 *
 * Lookups answer, for a request's chained block hashes, how many leading blocks each worker holds
 * (the longest matching prefix); because a block hash names its whole prefix (see prompt.h) and
 * each worker's blocks are prefix-closed, a binary search of about log2(n) exact lookups finds it.
 *
 * Memory: a cuckoo table of 16-byte slots (hash, chain head, holders) kept at most 90% full, and
 * one 16-byte LRU node per (block, worker) entry: about 34 bytes per entry when each block has one
 * holder, fewer when workers share blocks; a block held by three workers or more adds a bitset of
 * its holders (8 bytes per 64 workers). kvr_cache_index_stats() reports the bytes allocated.
 *
 * Growth: the table grows a bucket at a time (linear hashing: one bucket's entries split into a new
 * bucket as the load passes 90%), the nodes and the per-worker state in chunks, so no insert ever
 * rehashes the table; nothing needs sizing beforehand (kvr_cache_index_reserve is a hint for an
 * empty index). Limits: KVR_MAX_WORKERS workers, 2^30 table slots (about 966 million distinct
 * blocks), 2^31-1 entries.
 *
 * Not thread-safe: the router owns one index and uses it from the loop thread.
 */
#ifndef KVR_CACHE_INDEX_H
#define KVR_CACHE_INDEX_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvr_cache_index_s kvr_cache_index_t;

typedef struct kvr_cache_index_stats_s {
  uint64_t blocks;      /* distinct block hashes held by at least one worker */
  uint64_t entries;     /* (block, worker) pairs */
  uint64_t table_slots; /* table slots in use (buckets x 4; the load is blocks / table_slots) */
  uint64_t node_slots;  /* LRU nodes allocated (in use or free) */
  uint64_t wide_sets;   /* blocks whose holders are a bitset (three workers or more) */
  uint64_t bytes; /* bytes allocated by the index (table chunks + nodes + holder sets + workers) */
  double bytes_per_entry; /* bytes / entries (0 when empty) */
  uint64_t inserts;       /* new (block, worker) entries since creation */
  uint64_t evictions;     /* entries evicted at capacity since creation */
  uint64_t splits;        /* buckets the table grew by since creation */
  uint64_t kicks;         /* residents displaced by cuckoo walks since creation */
} kvr_cache_index_stats_t;

/* Creates an index for worker indexes 0..workers-1 (1..KVR_MAX_WORKERS; more come with
 * kvr_cache_index_set_workers), each with capacity default_capacity blocks until set otherwise.
 * Returns NULL on a bad argument or out of memory. The caller owns the result and frees it with
 * kvr_cache_index_free(). */
kvr_cache_index_t *kvr_cache_index_new(size_t workers, uint64_t default_capacity);

/* Makes worker indexes 0..workers-1 valid (the new ones with the default capacity, holding
 * nothing); a count at or below the current one changes nothing. O(new workers). Returns 0,
 * KVR_EINVAL above KVR_MAX_WORKERS or KVR_ENOMEM. */
int kvr_cache_index_set_workers(kvr_cache_index_t *idx, size_t workers);

/* The number of worker indexes (what kvr_cache_index_match writes). */
size_t kvr_cache_index_workers(const kvr_cache_index_t *idx);

/* Frees the index; accepts NULL. */
void kvr_cache_index_free(kvr_cache_index_t *idx);

/* Sets a worker's capacity in blocks (0: the worker caches nothing), evicting its least recently
 * used entries at once if it holds more. Returns 0 or KVR_EINVAL for a bad worker. */
int kvr_cache_index_set_capacity(kvr_cache_index_t *idx, size_t worker, uint64_t blocks);

/* Returns a worker's capacity in blocks (0 for a bad worker). */
uint64_t kvr_cache_index_capacity(const kvr_cache_index_t *idx, size_t worker);

/* Records that worker holds blocks[0..n) (a request's chained hashes, leading block first):
 * existing entries are touched, new ones inserted, and the worker's least recently used entries
 * evicted at capacity. Blocks are touched from the last to the first so that the leading blocks are
 * the most recently used: like vLLM, which frees a finished request's blocks tail first, the index
 * evicts the deep end of a prefix before its shared beginning. With n above the capacity the worker
 * keeps the first `capacity` blocks. Returns 0, KVR_EINVAL for a bad worker, or KVR_ELIMIT when the
 * table would exceed its slot limit (the blocks inserted so far stay). */
int kvr_cache_index_insert(kvr_cache_index_t *idx, size_t worker, const uint64_t *blocks, size_t n);

/* For each worker w < kvr_cache_index_workers(idx) writes into matched[w] how many leading blocks
 * of blocks[0..n) it holds (the longest matching prefix). matched has that many entries. blocks
 * must be a chain (prompt.h: each hash covers every block before it): the answer is found by binary
 * search, which is exact because every worker's blocks are prefix-closed (cache_index.c). Does not
 * touch LRU order: a lookup is not a use (the request may go elsewhere). */
void kvr_cache_index_match(const kvr_cache_index_t *idx, const uint64_t *blocks, size_t n,
                           size_t *matched);

/* Drops every entry of a worker (restart, removal). Returns 0 or KVR_EINVAL. */
int kvr_cache_index_forget_worker(kvr_cache_index_t *idx, size_t worker);

/* Number of blocks a worker holds (0 for a bad worker). */
uint64_t kvr_cache_index_entries(const kvr_cache_index_t *idx, size_t worker);

/* A hint: sizes an empty table for nblocks distinct blocks at once (a nonempty one is left to grow
 * a bucket at a time, which never stalls). Returns 0, KVR_ELIMIT (more blocks than the table can
 * ever hold) or KVR_ENOMEM. */
int kvr_cache_index_reserve(kvr_cache_index_t *idx, uint64_t nblocks);

void kvr_cache_index_stats(const kvr_cache_index_t *idx, kvr_cache_index_stats_t *out);

/* Capacity in router blocks of a vLLM worker from its vllm:cache_config_info labels: num_gpu_blocks
 * blocks of block_size tokens at about 4 bytes of text per token, cut into block_chars-byte router
 * blocks. Returns 0 if any argument is 0. */
uint64_t kvr_cache_index_capacity_from_vllm(uint64_t num_gpu_blocks, uint64_t block_size_tokens,
                                            size_t block_chars);

#endif

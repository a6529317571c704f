/* kv_index.h -- the precise cache index: what each worker's engine says it holds (KV events).
 *
 * Beside the approximate index (cache_index.h, which guesses from what the router routed), this one
 * is fed only by the engines' own events (kv_decode.h -> kvr_kv_index_apply()). Engine block hashes
 * cannot be reproduced outside the engine (vLLM hashes a pickle with a per-process seed), so, as
 * Dynamo and llm-d do, the index keeps them opaque and computes its own content hash per block from
 * the block's token ids, recording engine hash -> own hash per worker so that BlockRemoved and
 * parent links resolve:
 *
 *   own(block) = XXH3_64(token ids of the block as little-endian u32,
 *                        seed = own(parent block) ^ lora salt ^ extra-key salt)      root seed 0
 *
 * A request is looked up by the same chain over its prompt's token ids (kvr_kv_chain(); the ids
 * come from the worker's POST /tokenize), so a match means "the engine holds these exact tokens
 * under this exact prefix". Per worker the index keeps two flat open-addressing tables (no
 * allocation per entry): engine hash -> own hash, and own hash -> reference count (two engine
 * blocks may hold the same content).
 *
 * Apply rules: BlockStored resolves its parent through the engine map (an unknown parent is a
 * broken chain: the event is skipped as "orphan"); BlockRemoved drops each known engine hash (an
 * unknown one is counted, not an error: it may predate the router); AllBlocksCleared empties the
 * worker. KV-cache groups: with several indexable groups only the lowest group index seen in a
 * BlockStored is indexed (hashes do not include the group, so two groups' events would collide).
 */
#ifndef KVR_KV_INDEX_H
#define KVR_KV_INDEX_H

#include "proto/kv_decode.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_kv_index_s kvr_kv_index_t;

/* What applying batches did to a worker (cumulative; the router exports them). */
typedef struct kvr_kv_apply_stats_s {
  uint64_t stored_blocks, removed_blocks, clears;
  uint64_t orphan_events;     /* BlockStored whose parent the worker's map does not know */
  uint64_t unknown_removed;   /* BlockRemoved of an engine hash the map does not know */
  uint64_t other_group;       /* events of a group other than the indexed one */
  uint64_t block_size_change; /* a BlockStored with another block size: the worker was reset */
} kvr_kv_apply_stats_t;

kvr_kv_index_t *kvr_kv_index_new(size_t nworkers);
void kvr_kv_index_free(kvr_kv_index_t *idx); /* accepts NULL */

/* Applies every event of b to worker w, in order. */
void kvr_kv_index_apply(kvr_kv_index_t *idx, size_t w, const kvr_kv_batch_t *b);

/* Forgets everything worker w holds (stats are kept). */
void kvr_kv_index_clear(kvr_kv_index_t *idx, size_t w);

/* Blocks worker w holds (distinct engine hashes) and its block size (0 before any BlockStored). */
size_t kvr_kv_index_blocks(const kvr_kv_index_t *idx, size_t w);
uint32_t kvr_kv_index_block_size(const kvr_kv_index_t *idx, size_t w);
const kvr_kv_apply_stats_t *kvr_kv_index_stats(const kvr_kv_index_t *idx, size_t w);

/* Own hashes of the full blocks of tokens[0..n) (n / block_size of them) into out, which holds at
 * least n / block_size entries; returns how many. Base model, no extra keys. */
size_t kvr_kv_chain(const uint32_t *tokens, size_t n, uint32_t block_size, uint64_t *out);

/* The same for a request whose blocks carry salts (kv_decode.h's kvr_kv_request_salts: an adapter,
 * a cache_salt): block 0 seeded with salts->first, every later block with parent ^ salts->rest, as
 * kvr_kv_index_apply seeds an event's blocks. salts NULL is kvr_kv_chain. */
size_t kvr_kv_chain_salted(const uint32_t *tokens, size_t n, uint32_t block_size,
                           const kvr_kv_salts_t *salts, uint64_t *out);

/* How many leading blocks of chain (own hashes, from kvr_kv_chain with w's block size) worker w
 * holds. */
size_t kvr_kv_index_match(const kvr_kv_index_t *idx, size_t w, const uint64_t *chain, size_t n);

#endif

/* kv_decode.h -- reads one vLLM KV-cache EventBatch (msgpack) into flat arrays the router applies.
 *
 * Pure: bytes in, a kvr_kv_batch_t out; no sockets, no state between batches. The wire format is
 * vLLM's (../shared/KV-EVENTS.md): a batch is [ts, [event, ...], data_parallel_rank?]; each event
 * is a map with "type" (vLLM 0.26) or a tagged array ["BlockStored", field1, ...] (vLLM 0.23),
 * both accepted, even mixed in one batch. Unknown keys, unknown trailing array fields and unknown
 * event types never drop the batch: an event the router cannot use is skipped and counted by
 * reason, the others are kept in order.
 *
 * Normalisation:
 *   - block hashes: msgpack uint64 as is, int64 as its two's-complement bits, bin/str of any
 *     length as its last 8 bytes big-endian (shorter ones zero-extended on the left): the form
 *     vLLM documents for consumers;
 *   - medium nil or "GPU" is the device cache; other media (offload tiers) are skipped;
 *   - KV-cache groups (hybrid models): STORED events of kind full_attention, mla_attention or
 *     sink_full_attention, or without a kind, are kept with their group index (-1 when absent);
 *     other kinds are skipped; a STORED whose token count is not blocks x block_size is skipped;
 *   - lora_name (preferred) or else lora_id, and each block's extra_keys (multimodal ids,
 *     cache_salt), become salts the caller mixes into its own block hash, so blocks of another
 *     adapter or with content the router cannot see never match a plain prompt.
 */
#ifndef KVR_KV_DECODE_H
#define KVR_KV_DECODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { KVR_KV_STORED, KVR_KV_REMOVED, KVR_KV_CLEARED } kvr_kv_kind_t;

/* Why an event was skipped (counted per batch; the router exports the totals). */
#define KVR_KV_SKIP_MAP(XX)                                                                        \
  XX(UNKNOWN_TYPE, "unknown_type") /* a type this router does not know */                          \
  XX(MEDIUM, "medium")             /* not the GPU cache (CPU, disk offload tiers) */               \
  XX(GROUP, "group")               /* a KV-cache group of another kind (sliding window, mamba) */  \
  XX(MALFORMED, "malformed")       /* a field of the wrong type, or tokens != blocks x size */

typedef enum {
#define KVR__KV_SKIP_ENUM(name, str) KVR_KV_SKIP_##name,
  KVR_KV_SKIP_MAP(KVR__KV_SKIP_ENUM)
#undef KVR__KV_SKIP_ENUM
      KVR_KV_SKIP_COUNT
} kvr_kv_skip_t;

const char *kvr_kv_skip_name(kvr_kv_skip_t r);

typedef struct kvr_kv_event_s {
  kvr_kv_kind_t kind;
  uint32_t hash_off, nhashes; /* batch->hashes[hash_off ..]: engine hashes in prefix order */
  bool has_parent;            /* STORED: parent_block_hash given (not nil) */
  uint64_t parent;
  uint32_t tok_off, ntokens; /* STORED: batch->tokens[tok_off ..], nhashes * block_size ids */
  uint32_t block_size;
  int32_t group_idx;  /* -1 when absent */
  uint64_t lora_salt; /* 0: base model; else a hash of lora_name (or lora_id) */
  bool has_extra;     /* STORED: batch->extra[hash_off ..] holds one salt per block (0 = none) */
} kvr_kv_event_t;

typedef struct kvr_kv_batch_s {
  double ts;
  int64_t dp_rank; /* -1 when absent or nil */
  kvr_kv_event_t *ev;
  size_t nev, ev_cap;
  uint64_t *hashes, *extra; /* extra runs parallel to hashes */
  size_t nhashes, hashes_cap;
  uint32_t *tokens;
  size_t ntokens, tokens_cap;
  uint64_t skipped[KVR_KV_SKIP_COUNT];
} kvr_kv_batch_t;

/* The salts a request's blocks carry in vLLM's KV events, as the decoder derives an event's
 * (kvr_kv_event_t.lora_salt ^ the salt of the block's extra_keys entry): vLLM keys every block of
 * a LoRA request with the adapter's name and the first block also with the request's cache_salt
 * (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys; ../shared/VLLM-APIS.md section
 * 7), and its BlockStored carries the name (lora_name) and per block those keys (extra_keys:
 * ["<lora>", "<salt>"] for the first block, ["<lora>"] after it; without an adapter ["<salt>"],
 * then nil). first is block 0's salt, rest every later block's; 0 for none. The precise index's
 * request chain mixes them in (kv_index.h's kvr_kv_chain_salted), so a salted or adapter request
 * matches exactly the blocks its own salt and adapter stored. */
typedef struct kvr_kv_salts_s {
  uint64_t first, rest;
} kvr_kv_salts_t;

/* The salts of a request naming adapter lora (NULL: a base model) with cache_salt (NULL: none). */
void kvr_kv_request_salts(const char *lora, const char *cache_salt, kvr_kv_salts_t *out);

/* Decodes one payload (the third frame of a live message, or of a replay reply) into b, which is
 * reset first and may be reused across calls (its arrays grow as needed). Returns 0, or -1 with a
 * one-line reason in err when the payload is not an EventBatch at all (then b holds no events). */
int kvr_kv_decode_batch(const void *data, size_t len, kvr_kv_batch_t *b, char *err, size_t errlen);

/* Frees b's arrays (b itself is the caller's); accepts a zeroed or NULL b. */
void kvr_kv_batch_free(kvr_kv_batch_t *b);

/* True when every msgpack container in data[0..len) declares no more elements than the bytes left
 * could hold (msgpack-c allocates a container from its declared count before reading it). */
bool kvr_msgpack_sizes_plausible(const void *data, size_t len);

/* The byte length of the first msgpack object of data[0..len) when it passes the same check, else
 * 0: splits a stream of objects sent back to back (peer_sync.c's batched frames). */
size_t kvr_msgpack_object_size(const void *data, size_t len);

/* The counters of one worker's KV-event stream: net/kv_sub.c keeps them, the router shows them
 * (core/router.h: kvr_router_on_kv_stats). */
typedef struct kvr_kv_stream_stats_s {
  uint64_t batches; /* applied (live or replayed) */
  uint64_t events;  /* events in them the decoder kept */
  uint64_t skipped[KVR_KV_SKIP_COUNT];
  uint64_t duplicates; /* replayed batches already applied */
  uint64_t gaps, restarts, replays, replay_failures, resets, decode_errors;
  uint64_t last_seq;
} kvr_kv_stream_stats_t;

#endif

/* tokenize.h -- a request's prompt token ids from a worker's POST /tokenize, with a cache.
 *
 * Precise routing (kv_index.h) matches a request by the token ids the engine will see, which only
 * the engine's tokenizer and chat template give. vLLM serves them: POST /tokenize with the
 * request's chat fields ({"model", "messages", "add_generation_prompt", "tools", "chat_template",
 * "chat_template_kwargs", "continue_final_message", "add_special_tokens"}) or completion prompt
 * ({"model", "prompt", "add_special_tokens"}) answers {"count", "max_model_len", "tokens"}.
 *
 *   request body --kvr_tokenize_body()--> tokenize body (or the ids themselves: a completion
 *                                         prompt given as token ids needs no call)
 *     --cache hit--> ids at once
 *     --miss------> POST WORKER/tokenize on the proxy's curl multi --> ids --> cache --> done(ids)
 *
 * The cache is direct-mapped: the XXH3-64 of the tokenize body picks one of `entries` slots, which
 * keeps the body's hash and length and the ids; a colliding body replaces the slot. An identical
 * prompt (a retry, a resent conversation, the same document) is tokenized once; a conversation's
 * next turn is a new body and is tokenized again (vLLM's /tokenize takes a whole prompt).
 */
#ifndef KVR_TOKENIZE_H
#define KVR_TOKENIZE_H

#include "curlm.h"
#include "openai.h"
#include "policies/policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_tokenizer_s kvr_tokenizer_t;
typedef struct kvr_tokenize_op_s kvr_tokenize_op_t;

/* ok false: no ids (the worker failed, timed out or answered something else). */
typedef void (*kvr_tokenize_cb)(void *data, bool ok, const uint32_t *ids, size_t n);

typedef struct kvr_tokenize_stats_s {
  uint64_t requests, cache_hits, failures;
} kvr_tokenize_stats_t;

kvr_tokenizer_t *kvr_tokenizer_new(kvr_curlm_t *curlm, size_t cache_entries,
                                   uint64_t connect_timeout_ms, uint64_t timeout_ms);
void kvr_tokenizer_free(kvr_tokenizer_t *t); /* ops must be finished or cancelled; accepts NULL */

/* What to send for a request body of route: 1 with the tokenize body in out, 0 with the ids in ids
 * (a completion prompt given as token ids), -1 when the body has no single prompt to tokenize
 * (a batch of prompts, or not JSON). Pure. */
int kvr_tokenize_body(const char *body, size_t len, kvr_route_t route, kvr_buf_t *out,
                      uint32_t **ids, size_t *nids);

/* Reads a /tokenize answer's "tokens" into *ids (malloc'ed). Returns 0 or -1. Pure. */
int kvr_tokenize_parse_answer(const char *text, size_t len, uint32_t **ids, size_t *nids);

/* Gives rr the precise-mode inputs of a prompt of token ids[0..n): the chain of its full blocks
 * of block_size tokens (kv_index.h's kvr_kv_chain), that block size, and the exact prompt token
 * count. Returns the chain rr points to, which the caller frees after the decision. What the
 * proxy, route/explain and the virtual cluster do with the ids a worker's /tokenize gives. */
uint64_t *kvr_tokenize_route_req(const uint32_t *ids, size_t n, uint32_t block_size,
                                 kvr_route_req_t *rr);

/* Starts tokenizing body (a kvr_tokenize_body() result) on worker_url. A cache hit calls done
 * before returning and returns NULL; otherwise returns the op, whose done runs later from the
 * loop. */
kvr_tokenize_op_t *kvr_tokenize(kvr_tokenizer_t *t, const char *worker_url, const kvr_buf_t *body,
                                kvr_tokenize_cb done, void *data);

/* Cancels an op whose done has not run (a client that went away); done will not run. */
void kvr_tokenize_cancel(kvr_tokenize_op_t *op);

const kvr_tokenize_stats_t *kvr_tokenizer_stats(const kvr_tokenizer_t *t);

#endif

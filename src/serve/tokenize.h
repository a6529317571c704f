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
 * prompt (a retry, a resent conversation, the same document) is tokenized once.
 *
 * Shared prefixes (chat): a conversation's next turn is a new body, but its messages begin with the
 * previous turn's. Each tokenized chat body is also kept under a prefix key: the chain of its
 * messages' hashes (seeded with the hash of its other fields: model, tools, template options).
 * A new body's message prefixes are looked up longest first; when one is found whose messages
 * hold at least `prefix_coverage` of the body's message characters, its ids stand for the
 * request's and nothing is tokenized (the ids are a prefix: only the blocks they fill are matched,
 * and the request's prompt tokens stay the router's estimate). This is llm-d's prefix store
 * (llm-d-kv-cache-manager, pkg/tokenization: tokens of the longest cached prefix, full tokenization
 * below an overlap of 0.8) at message granularity, because vLLM's /tokenize gives no character
 * offsets to cut the ids at any other boundary. It assumes what the Llama 3 and ChatML templates
 * do: the rendering of a conversation's first messages, generation prompt included, begins the
 * rendering of the longer conversation. A template that rewrites history (one that drops earlier
 * turns' reasoning, say) breaks it: the prefix ids then match fewer blocks, and precise mode
 * predicts fewer cached tokens than the engine finds, until the body is tokenized whole. Even with
 * such a template the earlier turn's ids end before its answer, whose blocks the engine holds:
 * the prediction runs low (-10% on tests/router/test_precise.py's conversations at coverage 0.6,
 * 8 of 16 calls saved), which is why the store is off unless --tokenize-prefix-coverage is set.
 */
#ifndef KVR_TOKENIZE_H
#define KVR_TOKENIZE_H

#include "net/curlm.h"
#include "policies/policy.h"
#include "proto/kv_decode.h"
#include "proto/openai.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_tokenizer_s kvr_tokenizer_t;
typedef struct kvr_tokenize_op_s kvr_tokenize_op_t;

/* ok false: no ids (the worker failed, timed out or answered something else). prefix: the ids are
 * those of a cached prefix of the prompt, not the whole prompt's. */
typedef void (*kvr_tokenize_cb)(void *data, bool ok, const uint32_t *ids, size_t n, bool prefix);

typedef struct kvr_tokenize_stats_s {
  uint64_t requests, cache_hits, prefix_hits, failures;
} kvr_tokenize_stats_t;

/* A chat tokenize body's message prefixes: keys[i] is the prefix key of messages[0..i], chars[i]
 * the characters of those messages (their JSON). Filled by kvr_tokenize_body(). */
typedef struct kvr_tokenize_prefixes_s {
  uint64_t *keys;
  size_t *chars;
  size_t n;
} kvr_tokenize_prefixes_t;

void kvr_tokenize_prefixes_free(kvr_tokenize_prefixes_t *p);

/* prefix_coverage: the share of a chat body's message characters a cached message prefix must
 * hold to stand for it (0: never). */
kvr_tokenizer_t *kvr_tokenizer_new(kvr_curlm_t *curlm, size_t cache_entries, double prefix_coverage,
                                   uint64_t connect_timeout_ms, uint64_t timeout_ms);
void kvr_tokenizer_free(kvr_tokenizer_t *t); /* ops must be finished or cancelled; accepts NULL */

/* What to send for a request body of route: 1 with the tokenize body in out, 0 with the ids in ids
 * (a completion prompt given as token ids), -1 when the body has no single prompt to tokenize
 * (a batch of prompts, or not JSON). With pre not NULL, a chat body's message prefixes go there
 * (n 0 otherwise; the caller frees them). Pure. */
int kvr_tokenize_body(const char *body, size_t len, kvr_route_t route, kvr_buf_t *out,
                      uint32_t **ids, size_t *nids, kvr_tokenize_prefixes_t *pre);

/* Reads a /tokenize answer's "tokens" into *ids (malloc'ed). Returns 0 or -1. Pure. */
int kvr_tokenize_parse_answer(const char *text, size_t len, uint32_t **ids, size_t *nids);

/* Gives rr the precise-mode inputs of a prompt of token ids[0..n): the chain of its full blocks
 * of block_size tokens with the request's salts (kv_index.h's kvr_kv_chain_salted; salts NULL:
 * none), that block size, and the exact prompt token count. Returns the chain rr points to, which
 * the caller frees after the decision. What the proxy, route/explain and the virtual cluster do
 * with the ids a worker's /tokenize gives. */
uint64_t *kvr_tokenize_route_req(const uint32_t *ids, size_t n, uint32_t block_size,
                                 const kvr_kv_salts_t *salts, kvr_route_req_t *rr);

/* Starts tokenizing body (a kvr_tokenize_body() result, pre its prefixes or NULL) on worker_url.
 * A cache hit (the body, or a message prefix that covers enough of it) calls done before
 * returning and returns NULL; otherwise returns the op, whose done runs later from the loop. */
kvr_tokenize_op_t *kvr_tokenize(kvr_tokenizer_t *t, const char *worker_url, const kvr_buf_t *body,
                                const kvr_tokenize_prefixes_t *pre, kvr_tokenize_cb done,
                                void *data);

/* Cancels an op whose done has not run (a client that went away); done will not run. */
void kvr_tokenize_cancel(kvr_tokenize_op_t *op);

const kvr_tokenize_stats_t *kvr_tokenizer_stats(const kvr_tokenizer_t *t);

#endif

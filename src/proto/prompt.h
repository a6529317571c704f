/* prompt.h -- the routing features of one OpenAI request: model, canonical prompt text, prefix
 * block hashes, token estimates.
 *
 * Canonical text. The prompt is serialized so that the text of turn N of a conversation is an exact
 * byte prefix of the text of turn N+1 (appending a message never changes the bytes of earlier
 * ones):
 *   chat:         for each message  RS role US content            (RS = 0x1e, US = 0x1f)
 *                 content given as an array of parts: the text of each "text" part, in order;
 *                 any other part as GS type US payload (GS = 0x1d; payload = image_url.url or
 *                 input_audio.data or "" ) so different images never look alike;
 *                 "tool_calls" (assistant) and "tool_call_id" (tool) follow as GS + compact JSON;
 *   completions:  a string prompt verbatim; an array of strings joined with RS; an array of token
 *                 ids as decimal numbers each followed by one space; an array of such arrays
 *                 joined with RS.
 *   responses:    "instructions" as a system message, then "input": a string as one user message,
 *                 or its items as chat messages (message items' input_text/output_text parts are
 *                 text; function_call and function_call_output items are GS + compact JSON under
 *                 the assistant and tool roles; reasoning items are left out, as vLLM leaves them
 *                 out of the prompt it stores); a request naming previous_response_id continues a
 *                 history only its worker holds, so its blocks are not computed (chained below)
 *   messages:     "system" (a string, or its text blocks joined with no separator, as vLLM joins
 *                 them) as a system message, then "messages" as chat messages whose content blocks
 *                 are text, or GS type US payload (image source, tool_use/tool_result as compact
 *                 JSON)
 *   so one conversation sent through chat, Responses or Messages gives the same text where vLLM
 *   renders the same prompt (plain text turns).
 * Blocks. The text is cut into blocks of block_chars bytes (default 64, about 16 tokens); only full
 * blocks are hashed. h_0 = XXH3_64(model name, seed 0); h_i = XXH3_64(block_i, seed = h_{i-1}), so
 * a block's hash names the block and its whole prefix, and different models never share blocks.
 * A request's "cache_salt" (chat, completions, responses) enters as vLLM's does, an extra key of
 * the first block carried down the chain: h_0 = XXH3_64(salt, seed = XXH3_64(model)), so requests
 * with different salts (or none) never share a block. "Characters" are bytes of the UTF-8 text.
 *
 * The answer. When a response completes, kvr_prompt_extend_answer() appends the assistant message
 * exactly as the next turn will serialize it (RS "assistant" US answer) and hashes the new full
 * blocks, so the blocks recorded for the worker are the ones the next turn will look up.
 *
 * Ownership: a kvr_prompt_t owns its text, model string and block array; kvr_prompt_free() releases
 * them. The cJSON tree handed in is only read, never kept.
 */
#ifndef KVR_PROMPT_H
#define KVR_PROMPT_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "policies/policy.h"

#define KVR_PROMPT_BLOCK_CHARS_DEFAULT 64
#define KVR_PROMPT_BLOCK_CHARS_MAX 65536

/* Separators of the canonical form (ASCII record/unit/group separators). */
#define KVR_PROMPT_RS '\x1e'
#define KVR_PROMPT_US '\x1f'
#define KVR_PROMPT_GS '\x1d'

typedef enum {
  KVR_PROMPT_CHAT = 0,    /* POST /v1/chat/completions: "messages" */
  KVR_PROMPT_COMPLETIONS, /* POST /v1/completions: "prompt" */
  KVR_PROMPT_RESPONSES,   /* POST /v1/responses: "instructions", "input" */
  KVR_PROMPT_MESSAGES,    /* POST /v1/messages (Anthropic): "system", "messages" */
} kvr_prompt_kind_t;

typedef struct kvr_prompt_s {
  kvr_prompt_kind_t kind;
  char *model;      /* owned, NUL-terminated */
  kvr_buf_t text;   /* owned canonical text (see above) */
  uint64_t *blocks; /* owned: chained hashes of the full blocks of text, leading block first */
  size_t nblocks;
  size_t blocks_cap;
  size_t block_chars;
  uint64_t model_seed;    /* h_0 = XXH3_64(model) */
  uint64_t prompt_tokens; /* estimate: ceil(text bytes / 4), or the number of token ids given */
  uint64_t max_tokens;    /* "max_completion_tokens", "max_tokens" or "max_output_tokens", or 0 */
  bool stream;            /* "stream": true */
  bool salted;            /* a "cache_salt" entered model_seed */
  char *cache_salt; /* that "cache_salt" (owned), or NULL: precise mode's chain takes it too */
  /* Responses: the "previous_response_id" it continues (owned), or NULL. Such a prompt is
   * chained: its history is held by the worker that stored the previous response, so the text
   * here is only the new input and no block is hashed (nblocks 0). */
  char *previous_response_id;
  bool store; /* Responses: "store" (default true) */
  /* "prompt_cache_key" (OpenAI's routing hint for caches; chat, completions, responses): owned,
   * or NULL. The router keeps requests with one key on the worker that served it last. */
  char *cache_key;
  /* On KVR_EINVAL from kvr_prompt_from_json: an OpenAI-style error code
   * ("missing_required_parameter", "invalid_type", "invalid_value") and the offending parameter
   * ("messages[1].content"). */
  const char *err_code;
  char err_param[64];
} kvr_prompt_t;

/* Initializes an empty prompt (safe to free). */
void kvr_prompt_init(kvr_prompt_t *p);

/* Releases what p owns and leaves it empty; accepts NULL. */
void kvr_prompt_free(kvr_prompt_t *p);

/* Extracts the routing features of a request body. body is the parsed JSON body; kind says which
 * endpoint it came to; block_chars is the block size in bytes (1..KVR_PROMPT_BLOCK_CHARS_MAX).
 * out is initialized by the call (any previous content must have been freed).
 * Returns 0, or KVR_EINVAL with an OpenAI-style message in err (e.g. "Missing required parameter:
 * 'messages'.") plus out->err_code and out->err_param set; the proxy answers 400
 * invalid_request_error with them. On error out holds nothing that needs freeing beyond
 * kvr_prompt_free (which is still safe to call). */
int kvr_prompt_from_json(const cJSON *body, kvr_prompt_kind_t kind, size_t block_chars,
                         kvr_prompt_t *out, char *err, size_t errlen);

/* Appends the assistant message the next turn will carry (RS "assistant" US answer) to the
 * canonical text and hashes the new full blocks; blocks already hashed are unchanged. For
 * completions the answer is appended verbatim (the client would send prompt + completion).
 * prompt_tokens is left as it was (it describes the request). Returns 0. */
int kvr_prompt_extend_answer(kvr_prompt_t *p, const char *answer, size_t len);

/* Fills req with views into p (valid while p is alive and unchanged). */
void kvr_prompt_route_req(const kvr_prompt_t *p, kvr_route_req_t *req);

/* h_0 for a model name: XXH3_64(model, seed 0). */
uint64_t kvr_prompt_model_seed(const char *model, size_t len);

/* Hashes the full blocks of text[0..len) chained from seed into out (room for len / block_chars
 * entries); returns the number of blocks written. Exposed for tests and benchmarks. */
size_t kvr_prompt_hash_blocks(const char *text, size_t len, size_t block_chars, uint64_t seed,
                              uint64_t *out);

#endif

/* sim_anthropic.h -- vLLM's Anthropic Messages API (POST /v1/messages, POST
 * /v1/messages/count_tokens) for the simulated worker, pure.
 *
 * vLLM serves it as a chat completion (vllm/entrypoints/anthropic/serving.py,
 * ../shared/VLLM-APIS.md section 2), and so does the sim:
 *
 *   body -> kvr_sim_anthropic_read()   protocol.py AnthropicMessagesRequest /
 *                                      AnthropicCountTokensRequest (pydantic: errors in the OpenAI
 *                                      shape, 400 "Bad Request"), then
 *                                      _convert_anthropic_to_openai_request: "system" (a string,
 *                                      or its text blocks joined with no separator, blocks that
 *                                      start with x-anthropic-billing-header dropped, plus any
 *                                      system-role messages' text) as one system message, then
 *                                      the messages as chat messages
 *        -> (the server renders and runs them as chat; errors from here on in the Anthropic
 *            shape, sim_api.h)
 *        -> kvr_sim_anthropic_reply() or the stream events (message_stream_converter):
 *           message_start, content_block_start, content_block_delta per token,
 *           content_block_stop, message_delta, message_stop; no ping
 *
 * Usage (_build_anthropic_usage): with prompt_tokens_details (the server's
 * --enable-prompt-tokens-details) input_tokens = prompt - cached, cache_read_input_tokens =
 * cached, cache_creation_input_tokens = 0; without, no cache fields. message_start carries the
 * whole prompt as input_tokens and no cache fields (the details ride only on the final usage).
 */
#ifndef KVR_SIM_ANTHROPIC_H
#define KVR_SIM_ANTHROPIC_H

#include "base/buf.h"
#include "sim_api.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_sim_msg_req_s {
  cJSON *messages;    /* the chat messages (owned by the caller once read returns 0) */
  const char *model;  /* borrowed from the body */
  int64_t max_tokens; /* -1 for count_tokens */
  bool stream;
} kvr_sim_msg_req_t;

/* Reads body as a Messages request (count_tokens: a count_tokens request, which has no
 * max_tokens and no stream) and converts it to chat messages. Returns 0, or the status with e
 * filled (400 "Bad Request" for what pydantic rejects; 400 "BadRequestError" for content the
 * sim cannot render, such as images). */
int kvr_sim_anthropic_read(const cJSON *body, bool count_tokens, kvr_sim_msg_req_t *rq,
                           kvr_sim_err_t *e);

/* The figures a reply reports. cached < 0: the server runs without prompt tokens details. */
typedef struct kvr_sim_msg_usage_s {
  uint32_t prompt, output;
  int32_t cached;
} kvr_sim_msg_usage_t;

/* The non-streamed reply: {"id","type":"message","role":"assistant","content":[{"type":"text",
 * "text"}],"model","stop_reason","usage"} (null fields left out, as vLLM's exclude_none). */
void kvr_sim_anthropic_reply(kvr_buf_t *b, const char *id, const char *model, const char *text,
                             size_t len, bool length_stop, const kvr_sim_msg_usage_t *u);

/* Stream events ("event: <name>\ndata: <json>\n\n"): start = message_start and the text block's
 * content_block_start (at the first token); delta = one content_block_delta; end =
 * content_block_stop, message_delta, message_stop. */
void kvr_sim_anthropic_ev_start(kvr_buf_t *b, const char *id, const char *model,
                                uint32_t prompt_tokens);
void kvr_sim_anthropic_ev_delta(kvr_buf_t *b, const char *word, size_t len);
void kvr_sim_anthropic_ev_end(kvr_buf_t *b, bool length_stop, const kvr_sim_msg_usage_t *u);

/* count_tokens' reply: {"input_tokens":n,"context_management":{"original_input_tokens":n}}. */
void kvr_sim_anthropic_count(kvr_buf_t *b, uint32_t n);

#endif

/* openai.h -- what kvrouter knows of the OpenAI HTTP API, as pure functions.
 *
 * The proxy (proxy.c), the admin API's route explain (admin.c) and the load generator
 * (bench/loadgen/loadgen.c) share it; nothing here touches sockets, the loop, libcurl or router
 * state, so every rule is unit-tested on its own (tests/src/proto/test_openai.c).
 *
 *   path            -> kvr_openai_route()             which endpoint
 *   request body    -> kvr_openai_features()          validated prompt features (prompt.h)
 *   response bytes  -> kvr_openai_sse_feed()          complete SSE lines, from chunks of any size
 *   SSE line        -> kvr_openai_sse_data()          the "data:" payload
 *   payload or body -> kvr_openai_parse_scratch()     a cJSON tree in a per-thread arena
 *                   -> kvr_openai_chunk_read()        answer text, reasoning, usage, error
 *   broken stream   -> kvr_openai_stream_error_event() the error event and [DONE] a client gets
 *   any error       -> kvr_openai_error_body()        {"error": {message, type, param, code}}
 *
 * Readers report what they found and change nothing else: counting tokens, keeping answer text and
 * accounting usage is the caller's business.
 */
#ifndef KVR_OPENAI_H
#define KVR_OPENAI_H

#include "base/buf.h"
#include "proto/prompt.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- routes and requests ----------------------------------------------------------------------
 */

/* Route of a request, from its path; the second column is its label on /metrics. */
#define KVR_ROUTE_MAP(XX)                                                                          \
  XX(CHAT, "chat_completions")      /* /v1/chat/completions */                                     \
  XX(COMPLETIONS, "completions")    /* /v1/completions */                                          \
  XX(MODELS, "models")              /* /v1/models */                                               \
  XX(OTHER, "other")                /* anything else: forwarded as is, not routed by prompt */     \
  XX(RESPONSES, "responses")        /* POST /v1/responses (OpenAI's Responses API) */              \
  XX(RESPONSE_ID, "response_by_id") /* /v1/responses/{id}[/cancel]: the worker that stored it */   \
  XX(MESSAGES, "messages")          /* POST /v1/messages (Anthropic's Messages API) */

typedef enum {
#define XX(name, label) KVR_ROUTE_##name,
  KVR_ROUTE_MAP(XX)
#undef XX
      KVR_ROUTE_COUNT
} kvr_route_t;

/* The route of a request path (without the query string): exact matches, and /v1/responses/ID or
 * /v1/responses/ID/cancel (ID one path segment) for KVR_ROUTE_RESPONSE_ID. */
kvr_route_t kvr_openai_route(const char *path);

/* The route's metrics label ("chat_completions"), "other" out of range. */
const char *kvr_openai_route_name(kvr_route_t route);

/* True for the routes whose body carries a prompt the router reads (chat, completions, Responses,
 * Messages). */
bool kvr_openai_route_has_prompt(kvr_route_t route);

/* The response id of a KVR_ROUTE_RESPONSE_ID path, /v1/responses/ID[/cancel]: *id points into
 * path, *len its length. False for other paths. */
bool kvr_openai_response_path_id(const char *path, const char **id, size_t *len);

/* Parses and validates the JSON body[0..len) of a chat (route KVR_ROUTE_CHAT) or completions (any
 * other route) request into prompt features with blocks of block_chars bytes. prompt is
 * initialized by the call. Returns 0 (the caller frees prompt with kvr_prompt_free), or KVR_EINVAL
 * with an OpenAI-style message in err and an error code in *code ("missing_body", "invalid_json",
 * or prompt.h's codes) and prompt left empty; the caller answers 400 invalid_request_error. */
int kvr_openai_features(const char *body, size_t len, kvr_route_t route, size_t block_chars,
                        kvr_prompt_t *prompt, char *err, size_t errlen, const char **code);

/* ---- errors -----------------------------------------------------------------------------------
 */

/* Appends the OpenAI-style error body {"error":{"message":..,"type":..,"param":null,"code":..}}
 * and a newline to out. code may be NULL (JSON null). */
void kvr_openai_error_body(kvr_buf_t *out, const char *message, const char *type, const char *code);

/* Appends what a client reads when a stream breaks after it started: vLLM's shape for an error
 * inside a stream, one data event with the error body (message "upstream worker failed mid-stream:
 * <why>", type server_error, code upstream_stream_broken) and then "data: [DONE]". */
void kvr_openai_stream_error_event(kvr_buf_t *out, const char *why);

/* ---- server-sent events -----------------------------------------------------------------------
 */

/* Receives one complete SSE line without its LF and without one CR before it. line is not
 * NUL-terminated and is valid only during the call (it may point into the caller's chunk). */
typedef void (*kvr_openai_sse_line_cb)(void *data, const char *line, size_t len);

/* An incremental SSE line splitter. Feed it the body as it arrives, in chunks of any size: every
 * complete line is passed to the callback once, in order, and only the unfinished last line is
 * copied (bounded by max_line). Lines longer than max_line bytes (CR included) are dropped whole:
 * the splitter skips to the next LF. Splitting a stream into chunks at any positions gives the
 * same lines as feeding it whole. */
typedef struct kvr_openai_sse_s {
  kvr_buf_t line;  /* owned: the unfinished line carried to the next feed */
  size_t max_line; /* bytes */
  bool overflow;   /* the current line exceeded max_line and is being skipped */
  /* The callback may set stop: the feed returns after that line, with consumed the bytes of its
   * data up to and including that line's LF; every later feed delivers nothing (consumed 0). When
   * no callback stops, consumed is the whole chunk. */
  bool stop;
  size_t consumed;
  /* While the callback runs: where the line it was given begins in the data of this feed, or
   * SIZE_MAX when it began in an earlier feed (so a caller that passes the data through has sent
   * its first bytes already). */
  size_t line_at;
} kvr_openai_sse_t;

/* Initializes an empty splitter for lines of at most max_line bytes. With SIZE_MAX no line is
 * dropped; the caller then bounds what is held with kvr_openai_sse_pending() (the load generator
 * fails a request instead of skipping a line). */
void kvr_openai_sse_init(kvr_openai_sse_t *s, size_t max_line);

/* Splits data[0..len) (continuing the previous feed's unfinished line) and calls cb(cbdata, line,
 * len) for each line it completes. cb must not reset or free s. Returns 0, or KVR_ELIMIT if a line
 * went over max_line during this call (the lines before and after it are still delivered). */
int kvr_openai_sse_feed(kvr_openai_sse_t *s, const char *data, size_t len,
                        kvr_openai_sse_line_cb cb, void *cbdata);

/* Bytes of the unfinished line held for the next feed (0 while a line is being skipped). */
size_t kvr_openai_sse_pending(const kvr_openai_sse_t *s);

/* Forgets the unfinished line (a new response starts); keeps the storage. */
void kvr_openai_sse_reset(kvr_openai_sse_t *s);

/* Releases the storage; s stays usable (as after init). Accepts NULL. */
void kvr_openai_sse_free(kvr_openai_sse_t *s);

/* True if line is a "data:" field; *payload and *plen then give its value after the spaces that
 * follow the colon (a view into line; possibly empty). Every other line (comments, event:, id:,
 * blank) returns false. */
bool kvr_openai_sse_data(const char *line, size_t len, const char **payload, size_t *plen);

/* True if a data payload is the end-of-stream marker "[DONE]". */
bool kvr_openai_sse_done(const char *payload, size_t len);

/* ---- response objects -------------------------------------------------------------------------
 */

/* The largest usage figure believed (2^32 tokens: far above any model's context). */
#define KVR_OPENAI_USAGE_MAX 4294967296ull

/* What one response object says: a streamed chunk (chat.completion.chunk, text_completion) or a
 * whole non-streamed body. Strings point into the cJSON tree it was read from. */
typedef struct kvr_openai_chunk_s {
  /* The answer text of choices[0], NULL when absent or empty: delta.content (chat stream), else
   * message.content (chat body), else text (completions). A chunk with text is a token event. */
  const char *text;
  size_t text_len;
  /* choices[0].delta.reasoning_content, NULL when absent or empty (reasoning models stream their
   * thinking there; it is not part of the answer the next turn resends). */
  const char *reasoning;
  size_t reasoning_len;
  /* usage (the last chunk when stream_options.include_usage, or the whole body). Taken whole or
   * not at all: a figure that is not an integer in [0, KVR_OPENAI_USAGE_MAX], or cached tokens
   * above the prompt's (or without them), leaves every has_* false and sets usage_invalid. */
  bool has_prompt_tokens, has_cached_tokens, has_completion_tokens;
  bool usage_invalid;
  uint64_t prompt_tokens;     /* usage.prompt_tokens */
  uint64_t cached_tokens;     /* usage.prompt_tokens_details.cached_tokens */
  uint64_t completion_tokens; /* usage.completion_tokens */
  /* The "error" member (JSON null included), NULL when absent; error.message when a string. For
   * the Responses and Messages APIs an event or body of "type": "error" sets it too. */
  const cJSON *error;
  const char *error_message;
  /* Responses API: the response's id ("id" of a response body, response.id of the
   * response.created event), NULL when the object names none. */
  const char *response_id;
  /* Chat and completions: choices[0] carries tool-call deltas (delta.tool_calls), or a
   * finish_reason (a string: the answer is complete). */
  bool tool_call, finish;
} kvr_openai_chunk_t;

/* Parses JSON text like cJSON_ParseWithLength, into this thread's scratch arena (see openai.c):
 * no allocation per node or string. The tree is valid until the next kvr_openai_parse_scratch() on
 * the same thread (or kvr_openai_scratch_free()); it must not be given to cJSON_Delete or kept.
 * NULL when s is not one JSON value. For parses whose tree is read and dropped at once. */
const cJSON *kvr_openai_parse_scratch(const char *s, size_t len);

/* Frees this thread's scratch arena (its last tree with it). The next scratch parse makes a new
 * one. */
void kvr_openai_scratch_free(void);

/* Reads obj (any JSON value; only an object has anything to read) into out, which is overwritten.
 * Nothing is allocated: out is valid while obj is. */
void kvr_openai_chunk_read(const cJSON *obj, kvr_openai_chunk_t *out);

#endif

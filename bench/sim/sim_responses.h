/* sim_responses.h -- vLLM's Responses API (POST /v1/responses) for the simulated worker, pure.
 *
 * What vLLM does (vllm/entrypoints/openai/responses/, ../shared/VLLM-APIS.md section 1) and where
 * each part lives here:
 *
 *   body -> kvr_sim_responses_read()        protocol.py ResponsesRequest and its validators
 *        -> kvr_sim_responses_messages()    utils.py construct_input_messages: instructions as a
 *                                           system message, the previous prompt's messages
 *                                           without system ones, the previous output text as
 *                                           assistant messages, the new input's items as chat
 *                                           messages; should_continue_final_message
 *        -> (the server renders them as a chat prompt, so one conversation gives the same ids
 *            through chat and Responses, and runs the engine)
 *        -> kvr_sim_resp_t: the response object (protocol.py ResponsesResponse.from_request), the
 *           stream's events (streaming_events.py, serving.py responses_stream_generator) and
 *           the usage (always with input_tokens_details.cached_tokens)
 *   kvr_sim_rstore_t: vLLM's response_store + msg_store (serving.py), used only when the sim runs
 *   with VLLM_ENABLE_RESPONSES_API_STORE=1, as vLLM.
 *
 * Ownership: a kvr_sim_resp_req_t borrows from the body it was read from. A kvr_sim_resp_t owns its
 * object and messages until they are moved into the store. The store owns its entries.
 */
#ifndef KVR_SIM_RESPONSES_H
#define KVR_SIM_RESPONSES_H

#include "base/buf.h"
#include "base/list.h"
#include "sim_api.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The request fields the sim honours (pointers borrow from the body). */
typedef struct kvr_sim_resp_req_s {
  const cJSON *body;
  const cJSON *input;               /* a string, or an array of items */
  const char *instructions;         /* NULL: none */
  const char *previous_response_id; /* NULL: none */
  const char *request_id;           /* NULL: the server makes "resp_" + 16 hex */
  const char *cache_salt;           /* NULL: none */
  bool store, background, stream, ignore_eos;
  int64_t max_output_tokens; /* -1: not given */
  uint64_t seed;
} kvr_sim_resp_req_t;

/* Reads body as vLLM's ResponsesRequest: the pydantic checks and model validators (400 "Bad
 * Request": types, a missing input, a non-null prompt, background without store, an empty
 * cache_salt). Returns 0 or the status, with e filled. Does not check the model. */
int kvr_sim_responses_read(const cJSON *body, kvr_sim_resp_req_t *rq, kvr_sim_err_t *e);

/* construct_input_messages(): the chat messages of rq's prompt into *out (a new array the caller
 * owns), after prev_messages (the previous response's prompt messages, system ones left out) and
 * prev_output (its "output" items: each message item's text parts as assistant messages), either
 * may be NULL. *continue_final says whether the last input item is an assistant message or
 * reasoning item with status in_progress or incomplete (rendered with continue_final_message).
 * Returns 0, or 400 with e filled (an item the sim cannot render). */
int kvr_sim_responses_messages(const kvr_sim_resp_req_t *rq, const cJSON *prev_messages,
                               const cJSON *prev_output, cJSON **out, bool *continue_final,
                               kvr_sim_err_t *e);

/* One response in flight: its object and the stream's state. */
typedef struct kvr_sim_resp_s {
  cJSON *obj;        /* the response object; status, output and usage change as it runs */
  cJSON *messages;   /* the prompt's messages, kept for the store (vLLM's msg_store) */
  char item_id[24];  /* "msg_" + 16 hex: the output message's id */
  uint64_t seq;      /* the next event's sequence_number */
  bool store;        /* store it when done (store asked for and enabled) */
  bool background;   /* queued: answered at once, run without a client */
  bool item_started; /* the output item's added events went out */
} kvr_sim_resp_t;

/* A response for rq (id: the response id, item_hex: 16 hex digits for the item id), served by
 * model, created at created (Unix seconds), generating at most max_tokens; status "in_progress"
 * (or "queued" for a background one). Takes messages. */
kvr_sim_resp_t *kvr_sim_resp_new(const kvr_sim_resp_req_t *rq, const char *id, const char *item_hex,
                                 const char *model, long long created, int64_t max_tokens,
                                 cJSON *messages);
void kvr_sim_resp_free(kvr_sim_resp_t *r); /* accepts NULL */

/* The response id. */
const char *kvr_sim_resp_id(const kvr_sim_resp_t *r);

/* Sets the finished object: one output message holding text[0..len) (no output when len is 0),
 * status "completed", or "incomplete" with incomplete_details {"reason": "max_output_tokens"}
 * when it stopped at max_tokens, and the usage (input_tokens_details.cached_tokens always set,
 * the per-turn lists empty as vLLM's SimpleContext leaves them). */
void kvr_sim_resp_finish(kvr_sim_resp_t *r, const char *text, size_t len, bool length_stop,
                         uint32_t prompt_tokens, uint32_t cached_tokens, uint32_t output_tokens);

/* Sets obj's "status" (e.g. "cancelled"). */
void kvr_sim_responses_set_status(cJSON *obj, const char *status);
/* obj's "status", or "" */
const char *kvr_sim_responses_status(const cJSON *obj);

/* Appends obj as compact JSON. */
void kvr_sim_responses_print(kvr_buf_t *b, const cJSON *obj);

/* Stream events, "event: <type>\ndata: <json>\n\n" each, sequence numbers from 0, no [DONE]:
 *   begin   response.created, response.in_progress (the object as it is now)
 *   token   the first time response.output_item.added and response.content_part.added; then
 *           response.output_text.delta
 *   end     response.output_text.done, response.content_part.done, response.output_item.done,
 *           response.completed (after kvr_sim_resp_finish) */
void kvr_sim_resp_ev_begin(kvr_buf_t *b, kvr_sim_resp_t *r);
void kvr_sim_resp_ev_token(kvr_buf_t *b, kvr_sim_resp_t *r, const char *word, size_t len);
void kvr_sim_resp_ev_end(kvr_buf_t *b, kvr_sim_resp_t *r, const char *text, size_t len);

/* ---- the store (vLLM's response_store and msg_store) ---- */

typedef struct kvr_sim_stored_s {
  char *id;
  cJSON *obj;      /* the response object GET returns */
  cJSON *messages; /* its prompt's messages: the next turn's history */
  void *running;   /* the server's run of a background response still in progress, or NULL */
  /* A background stream's events (vLLM's event_store): the SSE bytes of every event so far and
   * where each ends; events_done once response.completed went in (or the run was cancelled). */
  bool has_events, events_done;
  kvr_buf_t events;
  size_t *ev_end;
  size_t nev, ev_cap;
  struct kvr_sim_stored_s *hnext;
  kvr_list_t node; /* insertion order, oldest first (evicted first when full) */
} kvr_sim_stored_t;

typedef struct kvr_sim_rstore_s kvr_sim_rstore_t;

/* The bound of a worker's store: `kvrouter sim` (sim_server.c) and the virtual
 * cluster's workers (bench/vcluster) keep at most this many responses. */
#define KVR_SIM_RSTORE_MAX 100000

/* A store of at most max entries (vLLM keeps everything; the sim drops the oldest beyond max). */
kvr_sim_rstore_t *kvr_sim_rstore_new(size_t max);
void kvr_sim_rstore_free(kvr_sim_rstore_t *st); /* accepts NULL */
size_t kvr_sim_rstore_count(const kvr_sim_rstore_t *st);

/* The entry of id, or NULL. */
kvr_sim_stored_t *kvr_sim_rstore_get(const kvr_sim_rstore_t *st, const char *id);

/* Stores obj and messages (taken; messages may be NULL) under id, replacing an entry of the same
 * id (its running pointer is kept). Returns the entry. */
kvr_sim_stored_t *kvr_sim_rstore_put(kvr_sim_rstore_t *st, const char *id, cJSON *obj,
                                     cJSON *messages);

/* Appends whole SSE events (each ending in a blank line, as kvr_sim_resp_ev_* write them) to en's
 * event log; sets has_events. */
void kvr_sim_stored_add_events(kvr_sim_stored_t *en, const char *sse, size_t len);

/* The bytes of en's events from number first (0-based) to the last: *len of them at the returned
 * pointer (valid until the next add). first past the last event: len 0. */
const char *kvr_sim_stored_events_from(const kvr_sim_stored_t *en, size_t first, size_t *len);

#endif

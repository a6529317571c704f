/* sim_responses.c -- vLLM's Responses API for the simulated worker: request, prompt messages,
 * response object, stream events, store (see sim_responses.h).
 *
 * Flow: kvr_sim_responses_read() checks the body as pydantic would; kvr_sim_responses_messages()
 * turns instructions + history + input into chat messages (construct_input_messages and
 * _construct_message_from_response_item of vllm/entrypoints/openai/responses/utils.py); the
 * server renders and runs them; kvr_sim_resp_t keeps the response object (a cJSON tree in
 * ResponsesResponse's field order, the request's echo filled in once) and writes the events.
 *
 * Invariants: a kvr_sim_resp_t's obj always has every ResponsesResponse field; the store's hash
 * chains and its order list hold the same entries; an entry's id is unique.
 */
#include "sim_responses.h"

#include "base/kvr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- reading the request (protocol.py ResponsesRequest) ---- */

static const cJSON *field(const cJSON *body, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
  return cJSON_IsNull(v) ? NULL : v;
}

/* An optional string field; 0, or 400 with e filled. */
static int opt_str(const cJSON *body, const char *name, const char **out, kvr_sim_err_t *e) {
  const cJSON *v = field(body, name);
  if (v == NULL)
    return 0;
  if (!cJSON_IsString(v))
    return kvr_sim_err_validation(e, name, NULL, "string_type", "Input should be a valid string");
  *out = v->valuestring;
  return 0;
}

static int opt_bool(const cJSON *body, const char *name, bool *out, kvr_sim_err_t *e) {
  const cJSON *v = field(body, name);
  if (v == NULL)
    return 0;
  if (!cJSON_IsBool(v))
    return kvr_sim_err_validation(e, name, NULL, "bool_type", "Input should be a valid boolean");
  *out = cJSON_IsTrue(v);
  return 0;
}

static int opt_int(const cJSON *body, const char *name, int64_t *out, kvr_sim_err_t *e) {
  const cJSON *v = field(body, name);
  if (v == NULL)
    return 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
      fabs(v->valuedouble) > 9.2e18)
    return kvr_sim_err_validation(e, name, NULL, "int_type", "Input should be a valid integer");
  *out = (int64_t)v->valuedouble;
  return 0;
}

/* The model validators, in the order pydantic runs ResponsesRequest's "before" validators
 * (last defined first): cache_salt, prompt, background. */
static int validators(const cJSON *body, kvr_sim_resp_req_t *rq, kvr_sim_err_t *e) {
  const cJSON *salt = field(body, "cache_salt");
  if (salt != NULL && (!cJSON_IsString(salt) || salt->valuestring[0] == '\0'))
    return kvr_sim_err_validation(
        e, NULL, "cache_salt", "value_error",
        "Value error, Parameter 'cache_salt' must be a non-empty string if provided.");
  if (salt != NULL)
    rq->cache_salt = salt->valuestring;
  if (field(body, "prompt") != NULL)
    return kvr_sim_err_validation(e, NULL, "prompt", "value_error",
                                  "Value error, prompt template is not supported");
  const cJSON *bg = field(body, "background"), *store = field(body, "store");
  if (cJSON_IsTrue(bg) && store != NULL && cJSON_IsFalse(store))
    return kvr_sim_err_validation(e, NULL, NULL, "value_error",
                                  "Value error, background can only be used when `store` is true");
  return 0;
}

int kvr_sim_responses_read(const cJSON *body, kvr_sim_resp_req_t *rq, kvr_sim_err_t *e) {
  memset(rq, 0, sizeof(*rq));
  rq->body = body;
  rq->store = true; /* the Responses API's default; the server turns it off unless enabled */
  rq->max_output_tokens = -1;
  int64_t seed = 0;
  int rc = 0;
  rq->input = cJSON_GetObjectItemCaseSensitive(body, "input");
  if (rq->input == NULL)
    return kvr_sim_err_validation(e, "input", NULL, "missing", "Field required");
  if (!cJSON_IsString(rq->input) && !cJSON_IsArray(rq->input))
    return kvr_sim_err_validation(e, "input", NULL, "list_type", "Input should be a valid list");
  if ((rc = validators(body, rq, e)) != 0 ||
      (rc = opt_str(body, "instructions", &rq->instructions, e)) != 0 ||
      (rc = opt_str(body, "previous_response_id", &rq->previous_response_id, e)) != 0 ||
      (rc = opt_str(body, "request_id", &rq->request_id, e)) != 0 ||
      (rc = opt_bool(body, "store", &rq->store, e)) != 0 ||
      (rc = opt_bool(body, "background", &rq->background, e)) != 0 ||
      (rc = opt_bool(body, "stream", &rq->stream, e)) != 0 ||
      (rc = opt_bool(body, "ignore_eos", &rq->ignore_eos, e)) != 0 ||
      (rc = opt_int(body, "max_output_tokens", &rq->max_output_tokens, e)) != 0 ||
      (rc = opt_int(body, "seed", &seed, e)) != 0)
    return rc;
  const char *model = NULL;
  if ((rc = opt_str(body, "model", &model, e)) != 0)
    return rc;
  rq->seed = (uint64_t)seed;
  /* SamplingParams: max_tokens must be at least 1 (vllm/sampling_params.py _verify_args) */
  if (field(body, "max_output_tokens") != NULL && rq->max_output_tokens < 1)
    return kvr_sim_err(e, 400, KVR_SIM_ERR_BAD_REQUEST, "max_tokens",
                       "max_tokens must be at least 1, got %lld.",
                       (long long)rq->max_output_tokens);
  return 0;
}

/* ---- the prompt's messages (utils.py construct_input_messages) ---- */

/* The text of a message item's content: a string, or its text parts (input_text, output_text,
 * text) joined as the sim's chat template joins parts (no separator). Other parts (images,
 * files) are beyond the sim: 400. */
static int content_text(const cJSON *content, size_t idx, kvr_buf_t *out, kvr_sim_err_t *e) {
  if (content == NULL || cJSON_IsNull(content))
    return 0;
  if (cJSON_IsString(content)) {
    kvr_buf_puts(out, content->valuestring);
    return 0;
  }
  if (!cJSON_IsArray(content))
    return kvr_sim_err(e, 400, KVR_SIM_ERR_VALIDATION, "input",
                       "input[%zu].content: must be a string or an array of parts", idx);
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    bool is_text = cJSON_IsString(type) && (strcmp(type->valuestring, "input_text") == 0 ||
                                            strcmp(type->valuestring, "output_text") == 0 ||
                                            strcmp(type->valuestring, "text") == 0);
    if (!is_text || !cJSON_IsString(text))
      return kvr_sim_err(e, 400, KVR_SIM_ERR_BAD_REQUEST, "input",
                         "input[%zu].content: kvrouter sim renders text parts only", idx);
    kvr_buf_puts(out, text->valuestring);
  }
  return 0;
}

static const char *str_of(const cJSON *obj, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static cJSON *message(const char *role) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", role);
  return m;
}

/* The last message of msgs when it is an assistant's (vLLM merges items into it), else NULL. */
static cJSON *prev_assistant(cJSON *msgs) {
  cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
  const char *role = str_of(last, "role");
  return role != NULL && strcmp(role, "assistant") == 0 ? last : NULL;
}

/* A function_call item: a tool call of the previous assistant message, or a new one. */
static int item_function_call(cJSON *msgs, const cJSON *item, size_t idx, kvr_sim_err_t *e) {
  const char *call_id = str_of(item, "call_id"), *name = str_of(item, "name");
  const char *args = str_of(item, "arguments");
  if (call_id == NULL || name == NULL || args == NULL)
    return kvr_sim_err(e, 400, KVR_SIM_ERR_VALIDATION, "input",
                       "input[%zu]: a function_call needs call_id, name and arguments", idx);
  cJSON *tc = cJSON_CreateObject();
  cJSON_AddStringToObject(tc, "id", call_id);
  cJSON_AddStringToObject(tc, "type", "function");
  cJSON *fn = cJSON_AddObjectToObject(tc, "function");
  cJSON_AddStringToObject(fn, "name", name);
  cJSON_AddStringToObject(fn, "arguments", args);
  cJSON *prev = prev_assistant(msgs);
  if (prev == NULL) {
    prev = message("assistant");
    cJSON_AddItemToArray(msgs, prev);
  }
  cJSON *calls = cJSON_GetObjectItemCaseSensitive(prev, "tool_calls");
  if (calls == NULL)
    calls = cJSON_AddArrayToObject(prev, "tool_calls");
  cJSON_AddItemToArray(calls, tc);
  return 0;
}

/* The first text of a list of {"text": ...} (reasoning content or summary), or NULL. */
static const char *first_text(const cJSON *list) {
  const cJSON *first = cJSON_GetArrayItem(list, 0);
  return cJSON_IsString(first) ? first->valuestring : str_of(first, "text");
}

/* A reasoning item: the "reasoning" of the previous assistant message (if it has none yet) or a
 * new assistant message. The sim's template renders no reasoning, as Llama's renders none. */
static int item_reasoning(cJSON *msgs, const cJSON *item, kvr_sim_err_t *e) {
  if (field(item, "encrypted_content") != NULL)
    return kvr_sim_err(e, 400, KVR_SIM_ERR_BAD_REQUEST, NULL,
                       "Encrypted content is not supported.");
  const char *text = first_text(cJSON_GetObjectItemCaseSensitive(item, "content"));
  if (text == NULL)
    text = first_text(cJSON_GetObjectItemCaseSensitive(item, "summary"));
  cJSON *prev = prev_assistant(msgs);
  if (prev == NULL || cJSON_GetObjectItemCaseSensitive(prev, "reasoning") != NULL) {
    prev = message("assistant");
    cJSON_AddItemToArray(msgs, prev);
  }
  cJSON_AddStringToObject(prev, "reasoning", text ? text : "");
  return 0;
}

/* An assistant message item: the text of its first content part (vLLM's dict-form assistant
 * message), into the previous assistant message if that has no content yet. */
static void item_assistant(cJSON *msgs, const cJSON *item) {
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
  const char *text = cJSON_IsString(content) ? content->valuestring : NULL;
  if (cJSON_IsArray(content))
    text = first_text(content);
  cJSON *prev = prev_assistant(msgs);
  if (prev == NULL || cJSON_GetObjectItemCaseSensitive(prev, "content") != NULL) {
    prev = message("assistant");
    cJSON_AddItemToArray(msgs, prev);
  }
  cJSON_AddStringToObject(prev, "content", text ? text : "");
}

/* Any other message item (user, system, developer), kept as it is: its content as text. */
static int item_message(cJSON *msgs, const cJSON *item, const char *role, size_t idx,
                        kvr_sim_err_t *e) {
  kvr_buf_t text = KVR_BUF_INIT;
  int rc = content_text(cJSON_GetObjectItemCaseSensitive(item, "content"), idx, &text, e);
  if (rc == 0) {
    cJSON *m = message(role);
    cJSON_AddStringToObject(m, "content", text.data ? text.data : "");
    cJSON_AddItemToArray(msgs, m);
  }
  kvr_buf_free(&text);
  return rc;
}

/* One input item (_construct_message_from_response_item). */
static int append_item(cJSON *msgs, const cJSON *item, size_t idx, kvr_sim_err_t *e) {
  if (!cJSON_IsObject(item))
    return kvr_sim_err(e, 400, KVR_SIM_ERR_VALIDATION, "input",
                       "input[%zu]: an item must be an object", idx);
  const char *type = str_of(item, "type"), *role = str_of(item, "role");
  if (type != NULL && strcmp(type, "function_call") == 0)
    return item_function_call(msgs, item, idx, e);
  if (type != NULL && strcmp(type, "reasoning") == 0)
    return item_reasoning(msgs, item, e);
  if (type != NULL && strcmp(type, "function_call_output") == 0) {
    cJSON *m = message("tool");
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(item, "output");
    cJSON_AddItemToObject(m, "content", out ? cJSON_Duplicate(out, true) : cJSON_CreateNull());
    const char *call_id = str_of(item, "call_id");
    cJSON_AddItemToObject(m, "tool_call_id",
                          call_id ? cJSON_CreateString(call_id) : cJSON_CreateNull());
    cJSON_AddItemToArray(msgs, m);
    return 0;
  }
  if ((type == NULL || strcmp(type, "message") == 0) && role != NULL) {
    if (strcmp(role, "assistant") == 0) {
      item_assistant(msgs, item);
      return 0;
    }
    if (strcmp(role, "user") == 0 || strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)
      return item_message(msgs, item, role, idx, e);
  }
  return kvr_sim_err(e, 400, KVR_SIM_ERR_VALIDATION, "input",
                     "input[%zu]: an item of type '%.40s' is not supported by kvrouter sim", idx,
                     type   ? type
                     : role ? role
                            : "(none)");
}

/* utils.py should_continue_final_message: a partial assistant message or reasoning item last. */
static bool continues_final(const cJSON *input) {
  const cJSON *last =
      cJSON_IsArray(input) ? cJSON_GetArrayItem(input, cJSON_GetArraySize(input) - 1) : NULL;
  if (!cJSON_IsObject(last))
    return false;
  const char *type = str_of(last, "type"), *status = str_of(last, "status");
  if (type == NULL)
    type = "message";
  if (strcmp(type, "message") != 0 && strcmp(type, "reasoning") != 0)
    return false;
  return status != NULL &&
         (strcmp(status, "in_progress") == 0 || strcmp(status, "incomplete") == 0);
}

/* The previous turn: its prompt's messages but system ones, then its output text. */
static void append_history(cJSON *msgs, const cJSON *prev_messages, const cJSON *prev_output) {
  const cJSON *m;
  cJSON_ArrayForEach(m, prev_messages) {
    const char *role = str_of(m, "role");
    if (role == NULL || strcmp(role, "system") != 0)
      cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, true));
  }
  const cJSON *item;
  cJSON_ArrayForEach(item, prev_output) {
    const char *type = str_of(item, "type");
    if (type == NULL || strcmp(type, "message") != 0)
      continue; /* reasoning and tool calls are left out */
    const cJSON *part;
    cJSON_ArrayForEach(part, cJSON_GetObjectItemCaseSensitive(item, "content")) {
      const char *text = str_of(part, "text");
      cJSON *a = message("assistant");
      cJSON_AddStringToObject(a, "content", text ? text : "");
      cJSON_AddItemToArray(msgs, a);
    }
  }
}

int kvr_sim_responses_messages(const kvr_sim_resp_req_t *rq, const cJSON *prev_messages,
                               const cJSON *prev_output, cJSON **out, bool *continue_final,
                               kvr_sim_err_t *e) {
  cJSON *msgs = cJSON_CreateArray();
  *out = NULL;
  *continue_final = false;
  if (rq->instructions != NULL && rq->instructions[0] != '\0') {
    cJSON *sys = message("system");
    cJSON_AddStringToObject(sys, "content", rq->instructions);
    cJSON_AddItemToArray(msgs, sys);
  }
  append_history(msgs, prev_messages, prev_output);
  if (cJSON_IsString(rq->input)) {
    cJSON *u = message("user");
    cJSON_AddStringToObject(u, "content", rq->input->valuestring);
    cJSON_AddItemToArray(msgs, u);
  } else {
    size_t idx = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, rq->input) {
      int rc = append_item(msgs, item, idx++, e);
      if (rc != 0) {
        cJSON_Delete(msgs);
        return rc;
      }
    }
    *continue_final = continues_final(rq->input);
  }
  *out = msgs;
  return 0;
}

/* ---- the response object (protocol.py ResponsesResponse, its fields in order) ---- */

/* The request's value of name (copied), or def when it is absent or null. */
static void echo(cJSON *obj, const cJSON *body, const char *name, cJSON *def) {
  const cJSON *v = field(body, name);
  if (v != NULL) {
    cJSON_AddItemToObject(obj, name, cJSON_Duplicate(v, true));
    cJSON_Delete(def);
  } else {
    cJSON_AddItemToObject(obj, name, def);
  }
}

static cJSON *str_or_null(const char *s) {
  return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

kvr_sim_resp_t *kvr_sim_resp_new(const kvr_sim_resp_req_t *rq, const char *id, const char *item_hex,
                                 const char *model, long long created, int64_t max_tokens,
                                 cJSON *messages) {
  kvr_sim_resp_t *r = kvr_xcalloc(1, sizeof(*r));
  r->messages = messages;
  r->background = rq->background;
  snprintf(r->item_id, sizeof(r->item_id), "msg_%.16s", item_hex);
  const cJSON *body = rq->body;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "id", id);
  cJSON_AddNumberToObject(o, "created_at", (double)created);
  cJSON_AddNullToObject(o, "incomplete_details");
  cJSON_AddItemToObject(o, "instructions", str_or_null(rq->instructions));
  echo(o, body, "metadata", cJSON_CreateNull());
  cJSON_AddStringToObject(o, "model", model);
  cJSON_AddStringToObject(o, "object", "response");
  cJSON_AddArrayToObject(o, "output");
  echo(o, body, "parallel_tool_calls", cJSON_CreateTrue());
  /* vLLM's defaults without a generation config (ResponsesRequest._DEFAULT_SAMPLING_PARAMS) */
  echo(o, body, "temperature", cJSON_CreateNumber(1.0));
  echo(o, body, "tool_choice", cJSON_CreateString("auto"));
  echo(o, body, "tools", cJSON_CreateArray());
  echo(o, body, "top_p", cJSON_CreateNumber(1.0));
  cJSON_AddBoolToObject(o, "background", rq->background);
  cJSON_AddNumberToObject(o, "max_output_tokens", (double)max_tokens);
  echo(o, body, "max_tool_calls", cJSON_CreateNull());
  cJSON_AddItemToObject(o, "previous_response_id", str_or_null(rq->previous_response_id));
  cJSON_AddNullToObject(o, "prompt");
  echo(o, body, "reasoning", cJSON_CreateNull());
  echo(o, body, "service_tier", cJSON_CreateString("auto"));
  cJSON_AddStringToObject(o, "status", rq->background ? "queued" : "in_progress");
  echo(o, body, "text", cJSON_CreateNull());
  cJSON_AddNullToObject(o, "top_logprobs");
  echo(o, body, "truncation", cJSON_CreateString("disabled"));
  cJSON_AddNullToObject(o, "usage");
  echo(o, body, "user", cJSON_CreateNull());
  cJSON_AddNullToObject(o, "input_messages");
  cJSON_AddNullToObject(o, "output_messages");
  r->obj = o;
  return r;
}

void kvr_sim_resp_free(kvr_sim_resp_t *r) {
  if (r == NULL)
    return;
  cJSON_Delete(r->obj);
  cJSON_Delete(r->messages);
  free(r);
}

const char *kvr_sim_resp_id(const kvr_sim_resp_t *r) {
  return str_of(r->obj, "id");
}

void kvr_sim_responses_set_status(cJSON *obj, const char *status) {
  cJSON_ReplaceItemInObjectCaseSensitive(obj, "status", cJSON_CreateString(status));
}

const char *kvr_sim_responses_status(const cJSON *obj) {
  const char *s = str_of(obj, "status");
  return s ? s : "";
}

void kvr_sim_responses_print(kvr_buf_t *b, const cJSON *obj) {
  char *s = cJSON_PrintUnformatted(obj);
  kvr_buf_puts(b, s);
  free(s);
}

/* {"annotations":[],"text":...,"type":"output_text","logprobs":...} (ResponseOutputText) */
static cJSON *text_part(const char *text, size_t len, bool logprobs_list) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddArrayToObject(p, "annotations");
  char *t = kvr_xmalloc(len + 1);
  memcpy(t, text, len);
  t[len] = '\0';
  cJSON_AddStringToObject(p, "text", t);
  free(t);
  cJSON_AddStringToObject(p, "type", "output_text");
  cJSON_AddItemToObject(p, "logprobs", logprobs_list ? cJSON_CreateArray() : cJSON_CreateNull());
  return p;
}

/* ResponseOutputMessage {"id","content","role","status","type"} */
static cJSON *output_message(const char *item_id, cJSON *content, const char *status) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", item_id);
  cJSON_AddItemToObject(m, "content", content);
  cJSON_AddStringToObject(m, "role", "assistant");
  cJSON_AddStringToObject(m, "status", status);
  cJSON_AddStringToObject(m, "type", "message");
  return m;
}

static cJSON *usage(uint32_t prompt, uint32_t cached, uint32_t output) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "input_tokens", prompt);
  cJSON *in = cJSON_AddObjectToObject(u, "input_tokens_details");
  cJSON_AddNumberToObject(in, "cached_tokens", cached);
  cJSON_AddArrayToObject(in, "input_tokens_per_turn");
  cJSON_AddArrayToObject(in, "cached_tokens_per_turn");
  cJSON_AddNumberToObject(u, "output_tokens", output);
  cJSON *out = cJSON_AddObjectToObject(u, "output_tokens_details");
  cJSON_AddNumberToObject(out, "reasoning_tokens", 0);
  cJSON_AddNumberToObject(out, "tool_output_tokens", 0);
  cJSON_AddArrayToObject(out, "output_tokens_per_turn");
  cJSON_AddArrayToObject(out, "tool_output_tokens_per_turn");
  cJSON_AddNumberToObject(u, "total_tokens", (double)prompt + output);
  return u;
}

void kvr_sim_resp_finish(kvr_sim_resp_t *r, const char *text, size_t len, bool length_stop,
                         uint32_t prompt_tokens, uint32_t cached_tokens, uint32_t output_tokens) {
  cJSON *o = r->obj;
  if (length_stop) {
    cJSON *why = cJSON_CreateObject();
    cJSON_AddStringToObject(why, "reason", "max_output_tokens");
    cJSON_ReplaceItemInObjectCaseSensitive(o, "incomplete_details", why);
  }
  cJSON *output = cJSON_CreateArray();
  cJSON *content = cJSON_CreateArray();
  if (len > 0)
    cJSON_AddItemToArray(content, text_part(text, len, false));
  cJSON_AddItemToArray(output, output_message(r->item_id, content, "completed"));
  cJSON_ReplaceItemInObjectCaseSensitive(o, "output", output);
  kvr_sim_responses_set_status(o, length_stop ? "incomplete" : "completed");
  cJSON_ReplaceItemInObjectCaseSensitive(o, "usage",
                                         usage(prompt_tokens, cached_tokens, output_tokens));
}

/* ---- stream events (streaming_events.py; api_router.py's SSE framing) ---- */

/* "event: <type>\ndata: {" ... the caller's fields ..., then ev_close() */
static void ev_open(kvr_buf_t *b, const char *type) {
  kvr_buf_printf(b, "event: %s\ndata: {", type);
}

static void ev_close(kvr_buf_t *b, kvr_sim_resp_t *r, const char *type) {
  kvr_buf_printf(b, "\"sequence_number\":%llu,\"type\":\"%s\"}\n\n", (unsigned long long)r->seq++,
                 type);
}

static void ev_response(kvr_buf_t *b, kvr_sim_resp_t *r, const char *type) {
  ev_open(b, type);
  kvr_buf_puts(b, "\"response\":");
  kvr_sim_responses_print(b, r->obj);
  kvr_buf_puts(b, ",");
  ev_close(b, r, type);
}

static void ev_item(kvr_buf_t *b, kvr_sim_resp_t *r, const char *type, cJSON *item) {
  ev_open(b, type);
  kvr_buf_puts(b, "\"item\":");
  kvr_sim_responses_print(b, item);
  cJSON_Delete(item);
  kvr_buf_puts(b, ",\"output_index\":0,");
  ev_close(b, r, type);
}

static void ev_part(kvr_buf_t *b, kvr_sim_resp_t *r, const char *type, cJSON *part) {
  ev_open(b, type);
  kvr_buf_puts(b, "\"content_index\":0,\"item_id\":");
  kvr_sim_json_str(b, r->item_id);
  kvr_buf_puts(b, ",\"output_index\":0,\"part\":");
  kvr_sim_responses_print(b, part);
  cJSON_Delete(part);
  kvr_buf_puts(b, ",");
  ev_close(b, r, type);
}

void kvr_sim_resp_ev_begin(kvr_buf_t *b, kvr_sim_resp_t *r) {
  ev_response(b, r, "response.created");
  ev_response(b, r, "response.in_progress");
}

void kvr_sim_resp_ev_token(kvr_buf_t *b, kvr_sim_resp_t *r, const char *word, size_t len) {
  if (!r->item_started) {
    /* emit_text_delta_events: the item and its part open with the first delta */
    r->item_started = true;
    ev_item(b, r, "response.output_item.added",
            output_message(r->item_id, cJSON_CreateArray(), "in_progress"));
    ev_part(b, r, "response.content_part.added", text_part("", 0, true));
  }
  ev_open(b, "response.output_text.delta");
  kvr_buf_puts(b, "\"content_index\":0,\"delta\":");
  kvr_buf_json_str(b, word, len);
  kvr_buf_puts(b, ",\"item_id\":");
  kvr_sim_json_str(b, r->item_id);
  kvr_buf_puts(b, ",\"logprobs\":[],\"output_index\":0,");
  ev_close(b, r, "response.output_text.delta");
}

void kvr_sim_resp_ev_end(kvr_buf_t *b, kvr_sim_resp_t *r, const char *text, size_t len) {
  /* emit_text_output_done_events, then the final response */
  ev_open(b, "response.output_text.done");
  kvr_buf_puts(b, "\"content_index\":0,\"item_id\":");
  kvr_sim_json_str(b, r->item_id);
  kvr_buf_puts(b, ",\"logprobs\":[],\"output_index\":0,");
  kvr_buf_printf(b, "\"sequence_number\":%llu,\"text\":", (unsigned long long)r->seq++);
  kvr_buf_json_str(b, text, len);
  kvr_buf_puts(b, ",\"type\":\"response.output_text.done\"}\n\n");
  ev_part(b, r, "response.content_part.done", text_part(text, len, false));
  cJSON *content = cJSON_CreateArray();
  cJSON_AddItemToArray(content, text_part(text, len, false));
  ev_item(b, r, "response.output_item.done", output_message(r->item_id, content, "completed"));
  ev_response(b, r, "response.completed");
}

/* ---- the store ---- */

struct kvr_sim_rstore_s {
  kvr_sim_stored_t **buckets;
  size_t nbuckets; /* a power of two */
  size_t count, max;
  kvr_list_t order; /* kvr_sim_stored_t.node, oldest first */
};

kvr_sim_rstore_t *kvr_sim_rstore_new(size_t max) {
  kvr_sim_rstore_t *st = kvr_xcalloc(1, sizeof(*st));
  st->nbuckets = 1024;
  st->buckets = kvr_xcalloc(st->nbuckets, sizeof(*st->buckets));
  st->max = max > 0 ? max : 1;
  kvr_list_init(&st->order);
  return st;
}

static void entry_free(kvr_sim_stored_t *en) {
  kvr_buf_free(&en->events);
  free(en->ev_end);
  free(en->id);
  cJSON_Delete(en->obj);
  cJSON_Delete(en->messages);
  free(en);
}

void kvr_sim_rstore_free(kvr_sim_rstore_t *st) {
  if (st == NULL)
    return;
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, &st->order) {
    entry_free(KVR_CONTAINER_OF(q, kvr_sim_stored_t, node));
  }
  free(st->buckets);
  free(st);
}

size_t kvr_sim_rstore_count(const kvr_sim_rstore_t *st) {
  return st->count;
}

static size_t bucket_of(const kvr_sim_rstore_t *st, const char *id) {
  return (size_t)XXH3_64bits(id, strlen(id)) & (st->nbuckets - 1);
}

kvr_sim_stored_t *kvr_sim_rstore_get(const kvr_sim_rstore_t *st, const char *id) {
  for (kvr_sim_stored_t *en = st->buckets[bucket_of(st, id)]; en != NULL; en = en->hnext) {
    if (strcmp(en->id, id) == 0)
      return en;
  }
  return NULL;
}

static void unlink_entry(kvr_sim_rstore_t *st, kvr_sim_stored_t *en) {
  kvr_sim_stored_t **link = &st->buckets[bucket_of(st, en->id)];
  while (*link != en)
    link = &(*link)->hnext;
  *link = en->hnext;
  kvr_list_remove(&en->node);
  st->count--;
}

/* Doubles the bucket array once entries outnumber buckets. */
static void grow(kvr_sim_rstore_t *st) {
  if (st->count < st->nbuckets)
    return;
  size_t old_n = st->nbuckets;
  kvr_sim_stored_t **old = st->buckets;
  st->nbuckets *= 2;
  st->buckets = kvr_xcalloc(st->nbuckets, sizeof(*st->buckets));
  for (size_t i = 0; i < old_n; i++) {
    for (kvr_sim_stored_t *en = old[i], *next; en != NULL; en = next) {
      next = en->hnext;
      size_t b = bucket_of(st, en->id);
      en->hnext = st->buckets[b];
      st->buckets[b] = en;
    }
  }
  free(old);
}

kvr_sim_stored_t *kvr_sim_rstore_put(kvr_sim_rstore_t *st, const char *id, cJSON *obj,
                                     cJSON *messages) {
  kvr_sim_stored_t *en = kvr_sim_rstore_get(st, id);
  if (en != NULL) {
    cJSON_Delete(en->obj);
    en->obj = obj;
    if (messages != NULL) {
      cJSON_Delete(en->messages);
      en->messages = messages;
    }
    return en;
  }
  while (st->count >= st->max) {
    kvr_sim_stored_t *oldest = KVR_CONTAINER_OF(st->order.next, kvr_sim_stored_t, node);
    unlink_entry(st, oldest);
    entry_free(oldest);
  }
  en = kvr_xcalloc(1, sizeof(*en));
  en->id = kvr_xstrdup(id);
  en->obj = obj;
  en->messages = messages;
  size_t b = bucket_of(st, id);
  en->hnext = st->buckets[b];
  st->buckets[b] = en;
  kvr_list_insert_tail(&st->order, &en->node);
  st->count++;
  grow(st);
  return en;
}

void kvr_sim_stored_add_events(kvr_sim_stored_t *en, const char *sse, size_t len) {
  en->has_events = true;
  size_t base = en->events.len;
  kvr_buf_append(&en->events, sse, len);
  /* a JSON payload never holds a raw newline, so every "\n\n" ends an event */
  for (size_t i = 1; i < len; i++) {
    if (sse[i] == '\n' && sse[i - 1] == '\n') {
      KVR_GROW(en->ev_end, en->nev, en->ev_cap, 1);
      en->ev_end[en->nev++] = base + i + 1;
    }
  }
}

const char *kvr_sim_stored_events_from(const kvr_sim_stored_t *en, size_t first, size_t *len) {
  if (first >= en->nev) {
    *len = 0;
    return en->events.data;
  }
  size_t start = first == 0 ? 0 : en->ev_end[first - 1];
  *len = en->ev_end[en->nev - 1] - start;
  return en->events.data + start;
}

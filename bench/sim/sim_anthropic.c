/* sim_anthropic.c -- vLLM's Anthropic Messages API for the simulated worker: request checks and
 * the conversion to chat messages, the reply, the stream events (see sim_anthropic.h).
 *
 * Flow: kvr_sim_anthropic_read() checks what AnthropicMessagesRequest's pydantic model checks
 * (model non-empty, messages, max_tokens > 0, roles, block types), then builds the chat messages
 * the way vllm/entrypoints/anthropic/serving.py _convert_system_message and _convert_messages
 * do: system text first, then per message a string content, or its blocks (text parts, tool_use
 * as tool_calls, thinking as reasoning, a user's tool_result as a tool message of its own before
 * it, an assistant's as "Tool result: ..." text). The writers then follow messages_full_converter
 * and message_stream_converter.
 *
 * Invariants: the messages array built has no system-role entry but the first; a read that fails
 * leaves nothing allocated.
 */
#include "sim_anthropic.h"

#include "base/kvr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BILLING_HEADER "x-anthropic-billing-header"

/* ---- checks (protocol.py) ---- */

static const char *const block_types[] = {
    "text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking"};

static int check_blocks(const cJSON *blocks, const char *where, kvr_sim_err_t *e) {
  char loc[64];
  size_t i = 0;
  const cJSON *b;
  cJSON_ArrayForEach(b, blocks) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
    bool known = false;
    for (size_t k = 0; cJSON_IsString(type) && k < KVR_ARRAY_SIZE(block_types); k++)
      known = known || strcmp(type->valuestring, block_types[k]) == 0;
    if (!cJSON_IsObject(b) || !known) {
      snprintf(loc, sizeof(loc), "%s.%zu.type", where, i);
      return kvr_sim_err_validation(e, loc, NULL, "literal_error",
                                    "Input should be 'text', 'image', 'tool_use', 'tool_result', "
                                    "'tool_reference', 'thinking' or 'redacted_thinking'");
    }
    i++;
  }
  return 0;
}

/* A content: a string or a list of blocks. */
static int check_content(const cJSON *content, const char *where, kvr_sim_err_t *e) {
  if (cJSON_IsString(content))
    return 0;
  if (content == NULL)
    return kvr_sim_err_validation(e, where, NULL, "missing", "Field required");
  if (!cJSON_IsArray(content))
    return kvr_sim_err_validation(e, where, NULL, "list_type", "Input should be a valid list");
  return check_blocks(content, where, e);
}

/* AnthropicMessage.role, after normalize_role (ctx and msg become user). */
static const char *role_of(const cJSON *msg) {
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(msg, "role");
  if (!cJSON_IsString(r))
    return NULL;
  const char *s = r->valuestring;
  if (strcmp(s, "ctx") == 0 || strcmp(s, "msg") == 0)
    return "user";
  if (strcmp(s, "user") == 0 || strcmp(s, "assistant") == 0 || strcmp(s, "system") == 0)
    return s;
  return NULL;
}

static int check_messages(const cJSON *messages, kvr_sim_err_t *e) {
  if (messages == NULL)
    return kvr_sim_err_validation(e, "messages", NULL, "missing", "Field required");
  if (!cJSON_IsArray(messages))
    return kvr_sim_err_validation(e, "messages", NULL, "list_type", "Input should be a valid list");
  char loc[64];
  size_t i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    if (role_of(m) == NULL) {
      snprintf(loc, sizeof(loc), "messages.%zu.role", i);
      return kvr_sim_err_validation(e, loc, NULL, "literal_error",
                                    "Input should be 'user', 'assistant' or 'system'");
    }
    snprintf(loc, sizeof(loc), "messages.%zu.content", i);
    int rc = check_content(cJSON_GetObjectItemCaseSensitive(m, "content"), loc, e);
    if (rc != 0)
      return rc;
    i++;
  }
  return 0;
}

/* model (a non-empty string), max_tokens (a positive integer), stream, system. */
static int check_fields(const cJSON *body, bool count_tokens, kvr_sim_msg_req_t *rq,
                        kvr_sim_err_t *e) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
  if (model == NULL)
    return kvr_sim_err_validation(e, "model", NULL, "missing", "Field required");
  if (!cJSON_IsString(model))
    return kvr_sim_err_validation(e, "model", NULL, "string_type",
                                  "Input should be a valid string");
  if (model->valuestring[0] == '\0')
    return kvr_sim_err_validation(e, "model", NULL, "value_error",
                                  "Value error, Model is required");
  rq->model = model->valuestring;
  int rc = check_messages(cJSON_GetObjectItemCaseSensitive(body, "messages"), e);
  if (rc != 0)
    return rc;
  if (!count_tokens) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
    if (mt == NULL)
      return kvr_sim_err_validation(e, "max_tokens", NULL, "missing", "Field required");
    if (!cJSON_IsNumber(mt) || mt->valuedouble != floor(mt->valuedouble) ||
        fabs(mt->valuedouble) > 9.2e18)
      return kvr_sim_err_validation(e, "max_tokens", NULL, "int_type",
                                    "Input should be a valid integer");
    if (mt->valuedouble <= 0)
      return kvr_sim_err_validation(e, "max_tokens", NULL, "value_error",
                                    "Value error, max_tokens must be positive");
    rq->max_tokens = (int64_t)mt->valuedouble;
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(body, "stream");
    if (stream != NULL && !cJSON_IsNull(stream) && !cJSON_IsBool(stream))
      return kvr_sim_err_validation(e, "stream", NULL, "bool_type",
                                    "Input should be a valid boolean");
    rq->stream = cJSON_IsTrue(stream);
  }
  const cJSON *system = cJSON_GetObjectItemCaseSensitive(body, "system");
  if (system != NULL && !cJSON_IsNull(system))
    return check_content(system, "system", e);
  return 0;
}

/* ---- conversion (serving.py _convert_anthropic_to_openai_request) ---- */

static const char *str_of(const cJSON *obj, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The system text of a string or of text blocks, billing-header blocks left out. */
static void system_text(const cJSON *content, kvr_buf_t *out) {
  if (cJSON_IsString(content)) {
    kvr_buf_puts(out, content->valuestring);
    return;
  }
  const cJSON *b;
  cJSON_ArrayForEach(b, content) {
    const char *type = str_of(b, "type"), *text = str_of(b, "text");
    if (type && strcmp(type, "text") == 0 && text && text[0] != '\0' &&
        strncmp(text, BILLING_HEADER, strlen(BILLING_HEADER)) != 0)
      kvr_buf_puts(out, text);
  }
}

/* _convert_system_message: the top-level system, then system-role messages, joined with no
 * separator into one system message (none when all of it is empty). */
static void convert_system(const cJSON *body, cJSON *out) {
  kvr_buf_t text = KVR_BUF_INIT;
  const cJSON *system = cJSON_GetObjectItemCaseSensitive(body, "system");
  if (cJSON_IsString(system) || cJSON_IsArray(system))
    system_text(system, &text);
  const cJSON *m;
  cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(body, "messages")) {
    if (strcmp(role_of(m), "system") == 0)
      system_text(cJSON_GetObjectItemCaseSensitive(m, "content"), &text);
  }
  if (text.len > 0) {
    cJSON *sys = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", text.data);
    cJSON_AddItemToArray(out, sys);
  }
  kvr_buf_free(&text);
}

/* A tool_result's content as text: a string, or its text items joined with "\n". */
static void tool_result_text(const cJSON *content, kvr_buf_t *out) {
  if (cJSON_IsString(content)) {
    kvr_buf_puts(out, content->valuestring);
    return;
  }
  bool first = true;
  const cJSON *item;
  cJSON_ArrayForEach(item, content) {
    const char *type = str_of(item, "type"), *text = str_of(item, "text");
    if (type == NULL || strcmp(type, "text") != 0)
      continue;
    if (!first)
      kvr_buf_puts(out, "\n");
    kvr_buf_puts(out, text ? text : "");
    first = false;
  }
}

/* The parts one message's blocks give: text parts, tool calls, reasoning; a user's tool_result
 * becomes a tool message appended to out at once (before the message itself). */
typedef struct conv_s {
  kvr_buf_t text;    /* the text parts, joined as the sim's template joins parts */
  int ntext;         /* how many text parts */
  cJSON *tool_calls; /* or NULL */
  kvr_buf_t reasoning;
  bool has_reasoning;
} conv_t;

static void tool_use(conv_t *c, const cJSON *block) {
  cJSON *tc = cJSON_CreateObject();
  const char *id = str_of(block, "id"), *name = str_of(block, "name");
  cJSON_AddStringToObject(tc, "id", id ? id : "call_0");
  cJSON_AddStringToObject(tc, "type", "function");
  cJSON *fn = cJSON_AddObjectToObject(tc, "function");
  cJSON_AddStringToObject(fn, "name", name ? name : "");
  const cJSON *input = cJSON_GetObjectItemCaseSensitive(block, "input");
  char *args = cJSON_IsObject(input) ? cJSON_PrintUnformatted(input) : NULL;
  cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
  free(args);
  if (c->tool_calls == NULL)
    c->tool_calls = cJSON_CreateArray();
  cJSON_AddItemToArray(c->tool_calls, tc);
}

static void tool_result(conv_t *c, const cJSON *block, const char *role, cJSON *out) {
  kvr_buf_t text = KVR_BUF_INIT;
  tool_result_text(cJSON_GetObjectItemCaseSensitive(block, "content"), &text);
  if (strcmp(role, "user") == 0) {
    cJSON *tm = cJSON_CreateObject();
    cJSON_AddStringToObject(tm, "role", "tool");
    const char *id = str_of(block, "tool_use_id");
    cJSON_AddStringToObject(tm, "tool_call_id", id ? id : "");
    cJSON_AddStringToObject(tm, "content", text.data ? text.data : "");
    cJSON_AddItemToArray(out, tm);
  } else {
    kvr_buf_puts(&c->text, "Tool result: ");
    kvr_buf_append(&c->text, text.data, text.len);
    c->ntext++;
  }
  kvr_buf_free(&text);
}

/* _convert_block for one block; images are beyond the sim (400). */
static int convert_block(conv_t *c, const cJSON *block, const char *role, cJSON *out,
                         kvr_sim_err_t *e) {
  const char *type = str_of(block, "type"), *text = str_of(block, "text");
  if (strcmp(type, "text") == 0 && text != NULL && text[0] != '\0') {
    kvr_buf_puts(&c->text, text);
    c->ntext++;
  } else if (strcmp(type, "image") == 0) {
    return kvr_sim_err(e, 400, KVR_SIM_ERR_BAD_REQUEST, NULL,
                       "kvrouter sim renders text only: image blocks are not supported");
  } else if (strcmp(type, "thinking") == 0 && str_of(block, "thinking") != NULL) {
    kvr_buf_puts(&c->reasoning, str_of(block, "thinking"));
    c->has_reasoning = true;
  } else if (strcmp(type, "tool_use") == 0) {
    tool_use(c, block);
  } else if (strcmp(type, "tool_result") == 0) {
    tool_result(c, block, role, out);
  }
  return 0; /* redacted_thinking, tool_reference: accepted, nothing rendered */
}

/* One non-system message (_convert_messages, _convert_message_content). */
static int convert_message(const cJSON *msg, cJSON *out, kvr_sim_err_t *e) {
  const char *role = role_of(msg);
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
  cJSON *om = cJSON_CreateObject();
  cJSON_AddStringToObject(om, "role", role);
  if (cJSON_IsString(content)) {
    cJSON_AddStringToObject(om, "content", content->valuestring);
    cJSON_AddItemToArray(out, om);
    return 0;
  }
  conv_t c = {.text = KVR_BUF_INIT, .reasoning = KVR_BUF_INIT};
  const cJSON *block;
  int rc = 0;
  cJSON_ArrayForEach(block, content) {
    if ((rc = convert_block(&c, block, role, out, e)) != 0)
      break;
  }
  if (rc == 0 && c.has_reasoning)
    cJSON_AddStringToObject(om, "reasoning", c.reasoning.data ? c.reasoning.data : "");
  if (rc == 0 && c.tool_calls != NULL) {
    cJSON_AddItemToObject(om, "tool_calls", c.tool_calls);
    c.tool_calls = NULL;
  }
  if (rc == 0 && c.ntext > 0)
    cJSON_AddStringToObject(om, "content", c.text.data);
  /* a user message left without content (only tool results) is not sent */
  bool keep = !(strcmp(role, "user") == 0 && c.ntext == 0);
  if (rc == 0 && keep)
    cJSON_AddItemToArray(out, om);
  else
    cJSON_Delete(om);
  cJSON_Delete(c.tool_calls);
  kvr_buf_free(&c.text);
  kvr_buf_free(&c.reasoning);
  return rc;
}

int kvr_sim_anthropic_read(const cJSON *body, bool count_tokens, kvr_sim_msg_req_t *rq,
                           kvr_sim_err_t *e) {
  memset(rq, 0, sizeof(*rq));
  rq->max_tokens = -1;
  if (!cJSON_IsObject(body))
    return kvr_sim_err_validation(e, NULL, NULL, "model_attributes_type",
                                  "Input should be a valid dictionary or object");
  int rc = check_fields(body, count_tokens, rq, e);
  if (rc != 0)
    return rc;
  cJSON *out = cJSON_CreateArray();
  convert_system(body, out);
  const cJSON *m;
  cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(body, "messages")) {
    if (strcmp(role_of(m), "system") != 0 && (rc = convert_message(m, out, e)) != 0) {
      cJSON_Delete(out);
      return rc;
    }
  }
  rq->messages = out;
  return 0;
}

/* ---- replies (messages_full_converter, message_stream_converter) ---- */

static const char *stop_reason(bool length_stop) {
  return length_stop ? "max_tokens" : "end_turn"; /* stop -> end_turn, length -> max_tokens */
}

static void usage_json(kvr_buf_t *b, const kvr_sim_msg_usage_t *u) {
  if (u->cached < 0) {
    kvr_buf_printf(b, "{\"input_tokens\":%u,\"output_tokens\":%u}", u->prompt, u->output);
    return;
  }
  uint32_t cached = KVR_MIN((uint32_t)u->cached, u->prompt);
  kvr_buf_printf(b,
                 "{\"input_tokens\":%u,\"output_tokens\":%u,\"cache_creation_input_tokens\":0,"
                 "\"cache_read_input_tokens\":%u}",
                 u->prompt - cached, u->output, cached);
}

void kvr_sim_anthropic_reply(kvr_buf_t *b, const char *id, const char *model, const char *text,
                             size_t len, bool length_stop, const kvr_sim_msg_usage_t *u) {
  kvr_buf_puts(b, "{\"id\":");
  kvr_sim_json_str(b, id);
  kvr_buf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"text\","
                  "\"text\":");
  kvr_buf_json_str(b, text ? text : "", len);
  kvr_buf_puts(b, "}],\"model\":");
  kvr_sim_json_str(b, model);
  kvr_buf_printf(b, ",\"stop_reason\":\"%s\",\"usage\":", stop_reason(length_stop));
  usage_json(b, u);
  kvr_buf_puts(b, "}");
}

void kvr_sim_anthropic_ev_start(kvr_buf_t *b, const char *id, const char *model,
                                uint32_t prompt_tokens) {
  kvr_buf_puts(b, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":");
  kvr_sim_json_str(b, id);
  kvr_buf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
  kvr_sim_json_str(b, model);
  kvr_buf_printf(b,
                 ",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%u,"
                 "\"output_tokens\":0}}}\n\n",
                 prompt_tokens);
  kvr_buf_puts(b, "event: content_block_start\ndata: {\"type\":\"content_block_start\","
                  "\"content_block\":{\"type\":\"text\",\"text\":\"\"},\"index\":0}\n\n");
}

void kvr_sim_anthropic_ev_delta(kvr_buf_t *b, const char *word, size_t len) {
  kvr_buf_puts(b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
                  "\"delta\":{\"type\":\"text_delta\",\"text\":");
  kvr_buf_json_str(b, word, len);
  kvr_buf_puts(b, "},\"index\":0}\n\n");
}

void kvr_sim_anthropic_ev_end(kvr_buf_t *b, bool length_stop, const kvr_sim_msg_usage_t *u) {
  kvr_buf_puts(b, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
                  "\"index\":0}\n\n");
  kvr_buf_printf(b,
                 "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
                 "{\"stop_reason\":\"%s\"},\"usage\":",
                 stop_reason(length_stop));
  usage_json(b, u);
  kvr_buf_puts(b, "}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
}

void kvr_sim_anthropic_count(kvr_buf_t *b, uint32_t n) {
  kvr_buf_printf(b, "{\"input_tokens\":%u,\"context_management\":{\"original_input_tokens\":%u}}",
                 n, n);
}

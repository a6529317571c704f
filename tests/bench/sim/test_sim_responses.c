/* test_sim_responses.c -- the simulated worker's Responses API (bench/sim/sim_responses.c), pure:
 * the request checks and their errors in vLLM's shape, construct_input_messages (instructions,
 * history without system messages, the previous output, every item kind and how vLLM merges
 * them), automatic continuation of a partial assistant message, the response object's fields in
 * ResponsesResponse's order, the stream's events and sequence numbers, and the store. No server,
 * no loop. */
#include "base/buf.h"
#include "bench/sim/sim_api.h"
#include "bench/sim/sim_responses.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

/* Reads json; returns the status (the body is kept in *body for the caller to delete). */
static int read_req(const char *json, cJSON **body, kvr_sim_resp_req_t *rq, kvr_sim_err_t *e) {
  *body = cJSON_Parse(json);
  assert_non_null(*body);
  return kvr_sim_responses_read(*body, rq, e);
}

static void expect_read_error(const char *json, const char *type, const char *param,
                              const char *needle) {
  cJSON *body;
  kvr_sim_resp_req_t rq;
  kvr_sim_err_t e;
  int rc = read_req(json, &body, &rq, &e);
  if (rc != 400 || strcmp(e.type, type) != 0 || strcmp(e.param, param) != 0 ||
      strstr(e.message, needle) == NULL)
    fail_msg("%s: got %d %s '%s' \"%s\"", json, rc, e.type, e.param, e.message);
  cJSON_Delete(body);
}

/* Defaults (store true, no max_output_tokens) and the pydantic-level refusals. */
static void test_read(void **state) {
  (void)state;
  cJSON *body;
  kvr_sim_resp_req_t rq;
  kvr_sim_err_t e;
  assert_int_equal(read_req("{\"input\":\"hi\",\"prompt_cache_key\":\"k\",\"cache_salt\":\"s\","
                            "\"request_id\":\"resp_mine\",\"max_output_tokens\":7}",
                            &body, &rq, &e),
                   0);
  assert_true(rq.store && !rq.background && !rq.stream);
  assert_int_equal(rq.max_output_tokens, 7);
  assert_string_equal(rq.cache_salt, "s");
  assert_string_equal(rq.request_id, "resp_mine");
  assert_null(rq.instructions);
  cJSON_Delete(body);
  assert_int_equal(read_req("{\"input\":[],\"store\":false,\"stream\":true}", &body, &rq, &e), 0);
  assert_true(!rq.store && rq.stream && rq.max_output_tokens == -1);
  cJSON_Delete(body);

  expect_read_error("{}", "Bad Request", "body.input", "'missing', 'loc': ('body', 'input')");
  expect_read_error("{\"input\":3}", "Bad Request", "body.input", "valid list");
  expect_read_error("{\"input\":\"x\",\"prompt\":{\"id\":\"p\"}}", "Bad Request", "prompt",
                    "prompt template is not supported");
  expect_read_error("{\"input\":\"x\",\"background\":true,\"store\":false}", "Bad Request", "",
                    "background can only be used when `store` is true");
  expect_read_error("{\"input\":\"x\",\"cache_salt\":\"\"}", "Bad Request", "cache_salt",
                    "Parameter 'cache_salt' must be a non-empty string if provided.");
  expect_read_error("{\"input\":\"x\",\"store\":\"yes\"}", "Bad Request", "body.store",
                    "valid boolean");
  expect_read_error("{\"input\":\"x\",\"max_output_tokens\":1.5}", "Bad Request",
                    "body.max_output_tokens", "valid integer");
  expect_read_error("{\"input\":\"x\",\"max_output_tokens\":0}", "BadRequestError", "max_tokens",
                    "max_tokens must be at least 1, got 0.");
  expect_read_error("{\"input\":\"x\",\"instructions\":5}", "Bad Request", "body.instructions",
                    "valid string");
}

/* construct_input_messages on json's request with an optional previous turn; returns the
 * messages as compact JSON (the caller frees). */
static char *messages_of(const char *json, const char *prev_messages, const char *prev_output,
                         bool *cont) {
  cJSON *body = cJSON_Parse(json), *pm = prev_messages ? cJSON_Parse(prev_messages) : NULL;
  cJSON *po = prev_output ? cJSON_Parse(prev_output) : NULL;
  kvr_sim_resp_req_t rq;
  kvr_sim_err_t e;
  assert_int_equal(kvr_sim_responses_read(body, &rq, &e), 0);
  cJSON *out = NULL;
  bool c = false;
  if (kvr_sim_responses_messages(&rq, pm, po, &out, &c, &e) != 0)
    fail_msg("%s: %s", json, e.message);
  char *s = cJSON_PrintUnformatted(out);
  if (cont)
    *cont = c;
  cJSON_Delete(out);
  cJSON_Delete(body);
  cJSON_Delete(pm);
  cJSON_Delete(po);
  return s;
}

static void expect_messages(const char *json, const char *pm, const char *po, const char *want) {
  char *got = messages_of(json, pm, po, NULL);
  if (strcmp(got, want) != 0)
    fail_msg("%s:\n got  %s\n want %s", json, got, want);
  free(got);
}

/* Instructions first; the previous prompt's messages without system ones; the previous output's
 * message text (reasoning left out); then the new input. */
static void test_messages_history(void **state) {
  (void)state;
  expect_messages("{\"input\":\"Hi\",\"instructions\":\"Be brief.\"}", NULL, NULL,
                  "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                  "{\"role\":\"user\",\"content\":\"Hi\"}]");
  expect_messages("{\"input\":\"Next\",\"instructions\":\"New rules.\"}",
                  "[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                  "{\"role\":\"user\",\"content\":\"Hi\"}]",
                  "[{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]},"
                  "{\"type\":\"message\",\"id\":\"msg_1\",\"role\":\"assistant\","
                  "\"status\":\"completed\",\"content\":[{\"type\":\"output_text\","
                  "\"text\":\"Hello.\",\"annotations\":[]}]}]",
                  "[{\"role\":\"system\",\"content\":\"New rules.\"},"
                  "{\"role\":\"user\",\"content\":\"Hi\"},"
                  "{\"role\":\"assistant\",\"content\":\"Hello.\"},"
                  "{\"role\":\"user\",\"content\":\"Next\"}]");
}

/* Items: message items with text parts (joined), system items kept, function calls merged into
 * the previous assistant message, reasoning as its "reasoning", function call outputs as tool
 * messages, dict-form assistant messages taking their first part's text. */
static void test_messages_items(void **state) {
  (void)state;
  expect_messages(
      "{\"input\":[{\"role\":\"developer\",\"content\":\"Dev.\"},"
      "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
      "\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
      "{\"type\":\"reasoning\",\"id\":\"rs\",\"summary\":[],\"content\":[{\"type\":"
      "\"reasoning_text\",\"text\":\"think\"}]},"
      "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"42\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"first\"},"
      "{\"type\":\"output_text\",\"text\":\"second\"}]}]}",
      NULL, NULL,
      "[{\"role\":\"developer\",\"content\":\"Dev.\"},{\"role\":\"user\",\"content\":\"ab\"},"
      "{\"role\":\"assistant\",\"reasoning\":\"think\",\"tool_calls\":["
      "{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}},"
      "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"content\":\"42\",\"tool_call_id\":\"c1\"},"
      "{\"role\":\"assistant\",\"content\":\"first\"}]");
  /* a reasoning item then an assistant message: one assistant message with both */
  expect_messages("{\"input\":[{\"type\":\"reasoning\",\"summary\":[{\"text\":\"s\"}]},"
                  "{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"done\"}]}",
                  NULL, NULL,
                  "[{\"role\":\"assistant\",\"reasoning\":\"s\",\"content\":\"done\"}]");
  /* what the sim cannot render, or vLLM refuses */
  const char *bad[] = {
      "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}"
      "]}",
      "{\"input\":[{\"type\":\"reasoning\",\"encrypted_content\":\"zz\",\"summary\":[]}]}",
      "{\"input\":[{\"type\":\"web_search_call\"}]}",
      "{\"input\":[\"plain\"]}",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    cJSON *body = cJSON_Parse(bad[i]), *out = NULL;
    kvr_sim_resp_req_t rq;
    kvr_sim_err_t e;
    bool cont;
    assert_int_equal(kvr_sim_responses_read(body, &rq, &e), 0);
    if (kvr_sim_responses_messages(&rq, NULL, NULL, &out, &cont, &e) != 400)
      fail_msg("%s: accepted", bad[i]);
    assert_null(out);
    cJSON_Delete(body);
  }
}

/* should_continue_final_message: an assistant message or reasoning item last, with status
 * in_progress or incomplete. */
static void test_continue_final(void **state) {
  (void)state;
  const struct {
    const char *json;
    bool cont;
  } cases[] = {
      {"{\"input\":\"x\"}", false},
      {"{\"input\":[{\"role\":\"user\",\"content\":\"x\"}]}", false},
      {"{\"input\":[{\"role\":\"assistant\",\"content\":\"x\",\"status\":\"incomplete\"}]}", true},
      {"{\"input\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":\"x\","
       "\"status\":\"in_progress\"}]}",
       true},
      {"{\"input\":[{\"role\":\"assistant\",\"content\":\"x\",\"status\":\"completed\"}]}", false},
      {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"o\","
       "\"status\":\"incomplete\"}]}",
       false},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    bool cont = !cases[i].cont;
    free(messages_of(cases[i].json, NULL, NULL, &cont));
    if (cont != cases[i].cont)
      fail_msg("%s: continue %d", cases[i].json, cont);
  }
}

static const char *const object_keys[] = {"id",
                                          "created_at",
                                          "incomplete_details",
                                          "instructions",
                                          "metadata",
                                          "model",
                                          "object",
                                          "output",
                                          "parallel_tool_calls",
                                          "temperature",
                                          "tool_choice",
                                          "tools",
                                          "top_p",
                                          "background",
                                          "max_output_tokens",
                                          "max_tool_calls",
                                          "previous_response_id",
                                          "prompt",
                                          "reasoning",
                                          "service_tier",
                                          "status",
                                          "text",
                                          "top_logprobs",
                                          "truncation",
                                          "usage",
                                          "user",
                                          "input_messages",
                                          "output_messages"};

/* The object: ResponsesResponse's fields in order, the request's values echoed, then finished:
 * one output message, status and usage (cached tokens always there). */
static void test_object(void **state) {
  (void)state;
  cJSON *body = cJSON_Parse("{\"input\":\"x\",\"instructions\":\"I\",\"metadata\":{\"k\":\"v\"},"
                            "\"temperature\":0.5,\"user\":\"u\",\"previous_response_id\":\"p\"}");
  kvr_sim_resp_req_t rq;
  kvr_sim_err_t e;
  assert_int_equal(kvr_sim_responses_read(body, &rq, &e), 0);
  kvr_sim_resp_t *r =
      kvr_sim_resp_new(&rq, "resp_0123456789abcdef", "fedcba9876543210", "m", 1700000000, 99, NULL);
  assert_string_equal(kvr_sim_resp_id(r), "resp_0123456789abcdef");
  assert_string_equal(r->item_id, "msg_fedcba9876543210");
  size_t i = 0;
  const cJSON *f;
  cJSON_ArrayForEach(f, r->obj) {
    assert_true(i < sizeof(object_keys) / sizeof(object_keys[0]));
    assert_string_equal(f->string, object_keys[i++]);
  }
  assert_int_equal(i, sizeof(object_keys) / sizeof(object_keys[0]));
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_sim_responses_print(&b, r->obj);
  assert_non_null(strstr(b.data, "\"instructions\":\"I\",\"metadata\":{\"k\":\"v\"}"));
  assert_non_null(strstr(b.data, "\"temperature\":0.5,\"tool_choice\":\"auto\",\"tools\":[]"));
  assert_non_null(strstr(b.data, "\"max_output_tokens\":99"));
  assert_non_null(strstr(b.data, "\"previous_response_id\":\"p\""));
  assert_non_null(strstr(b.data, "\"status\":\"in_progress\""));
  assert_non_null(strstr(b.data, "\"usage\":null,\"user\":\"u\""));
  kvr_sim_resp_finish(r, "abc def ", 8, true, 20, 16, 2);
  kvr_buf_reset(&b);
  kvr_sim_responses_print(&b, r->obj);
  assert_non_null(strstr(b.data, "\"incomplete_details\":{\"reason\":\"max_output_tokens\"}"));
  assert_non_null(strstr(
      b.data, "\"output\":[{\"id\":\"msg_fedcba9876543210\",\"content\":[{\"annotations\":[],"
              "\"text\":\"abc def \",\"type\":\"output_text\",\"logprobs\":null}],\"role\":"
              "\"assistant\",\"status\":\"completed\",\"type\":\"message\"}]"));
  assert_non_null(strstr(b.data, "\"status\":\"incomplete\""));
  assert_non_null(strstr(
      b.data, "\"usage\":{\"input_tokens\":20,\"input_tokens_details\":{\"cached_tokens\":16,"
              "\"input_tokens_per_turn\":[],\"cached_tokens_per_turn\":[]},\"output_tokens\":2,"
              "\"output_tokens_details\":{\"reasoning_tokens\":0,\"tool_output_tokens\":0,"
              "\"output_tokens_per_turn\":[],\"tool_output_tokens_per_turn\":[]},"
              "\"total_tokens\":22}"));
  assert_string_equal(kvr_sim_responses_status(r->obj), "incomplete");
  kvr_sim_responses_set_status(r->obj, "cancelled");
  assert_string_equal(kvr_sim_responses_status(r->obj), "cancelled");
  kvr_buf_free(&b);
  kvr_sim_resp_free(r);
  kvr_sim_resp_free(NULL);
  /* a background response starts queued */
  cJSON_Delete(body);
  body = cJSON_Parse("{\"input\":\"x\",\"background\":true}");
  assert_int_equal(kvr_sim_responses_read(body, &rq, &e), 0);
  r = kvr_sim_resp_new(&rq, "resp_1", "0000000000000001", "m", 1, 5, cJSON_CreateArray());
  assert_string_equal(kvr_sim_responses_status(r->obj), "queued");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r->obj, "background")));
  kvr_sim_resp_free(r);
  cJSON_Delete(body);
}

/* The event names of an SSE body, and that each event's sequence_number counts from 0. */
static size_t event_types(const char *sse, char types[][40], size_t max) {
  size_t n = 0;
  const char *p = sse;
  while ((p = strstr(p, "event: ")) != NULL && n < max) {
    p += 7;
    size_t len = strcspn(p, "\n");
    snprintf(types[n], 40, "%.*s", (int)len, p);
    const char *data = strstr(p, "\ndata: ");
    assert_non_null(data);
    const char *end = strstr(data, "\n\n");
    assert_non_null(end);
    size_t jlen = (size_t)(end - data - 7);
    char *json = malloc(jlen + 1);
    memcpy(json, data + 7, jlen);
    json[jlen] = '\0';
    cJSON *ev = cJSON_Parse(json);
    if (ev == NULL)
      fail_msg("event %zu is not JSON: %s", n, json);
    assert_int_equal((int)cJSON_GetObjectItem(ev, "sequence_number")->valuedouble, (int)n);
    assert_string_equal(cJSON_GetObjectItem(ev, "type")->valuestring, types[n]);
    cJSON_Delete(ev);
    free(json);
    n++;
    p = end;
  }
  return n;
}

/* The text event order of a non-Harmony model (VLLM-APIS.md section 1), no [DONE], usage only in
 * response.completed. */
static void test_events(void **state) {
  (void)state;
  cJSON *body = cJSON_Parse("{\"input\":\"x\",\"stream\":true}");
  kvr_sim_resp_req_t rq;
  kvr_sim_err_t e;
  assert_int_equal(kvr_sim_responses_read(body, &rq, &e), 0);
  kvr_sim_resp_t *r = kvr_sim_resp_new(&rq, "resp_s", "00000000000000aa", "m", 1, 5, NULL);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_sim_resp_ev_begin(&b, r);
  kvr_sim_resp_ev_token(&b, r, "abc ", 4);
  kvr_sim_resp_ev_token(&b, r, "def ", 4);
  kvr_sim_resp_finish(r, "abc def ", 8, false, 10, 0, 2);
  kvr_sim_resp_ev_end(&b, r, "abc def ", 8);
  kvr_buf_append(&b, "", 1);
  char types[16][40];
  size_t n = event_types(b.data, types, 16);
  static const char *const want[] = {"response.created",           "response.in_progress",
                                     "response.output_item.added", "response.content_part.added",
                                     "response.output_text.delta", "response.output_text.delta",
                                     "response.output_text.done",  "response.content_part.done",
                                     "response.output_item.done",  "response.completed"};
  assert_int_equal(n, sizeof(want) / sizeof(want[0]));
  for (size_t i = 0; i < n; i++)
    assert_string_equal(types[i], want[i]);
  assert_null(strstr(b.data, "[DONE]"));
  /* usage: null until the last event, which has it */
  const char *completed = strstr(b.data, "event: response.completed");
  const char *usage = strstr(b.data, "\"input_tokens\"");
  assert_true(completed != NULL && usage > completed);
  kvr_buf_free(&b);
  kvr_sim_resp_free(r);
  cJSON_Delete(body);
}

/* The store: put, get, replace (keeping the messages when none are given), eviction of the
 * oldest beyond its size, growth past its first bucket array. */
static void test_store(void **state) {
  (void)state;
  kvr_sim_rstore_t *st = kvr_sim_rstore_new(3);
  assert_null(kvr_sim_rstore_get(st, "a"));
  kvr_sim_stored_t *a = kvr_sim_rstore_put(st, "a", cJSON_CreateString("A1"), cJSON_CreateArray());
  assert_ptr_equal(kvr_sim_rstore_get(st, "a"), a);
  a->running = &a;
  assert_ptr_equal(kvr_sim_rstore_put(st, "a", cJSON_CreateString("A2"), NULL), a);
  assert_string_equal(a->obj->valuestring, "A2");
  assert_true(cJSON_IsArray(a->messages) && a->running == &a);
  kvr_sim_rstore_put(st, "b", cJSON_CreateNull(), NULL);
  kvr_sim_rstore_put(st, "c", cJSON_CreateNull(), NULL);
  kvr_sim_rstore_put(st, "d", cJSON_CreateNull(), NULL);
  assert_int_equal(kvr_sim_rstore_count(st), 3);
  assert_null(kvr_sim_rstore_get(st, "a")); /* the oldest went */
  assert_non_null(kvr_sim_rstore_get(st, "d"));
  kvr_sim_rstore_free(st);
  st = kvr_sim_rstore_new(100000);
  char id[32];
  for (int i = 0; i < 5000; i++) {
    snprintf(id, sizeof(id), "resp_%d", i);
    kvr_sim_rstore_put(st, id, cJSON_CreateNumber(i), NULL);
  }
  for (int i = 0; i < 5000; i += 7) {
    snprintf(id, sizeof(id), "resp_%d", i);
    kvr_sim_stored_t *en = kvr_sim_rstore_get(st, id);
    assert_non_null(en);
    assert_int_equal((int)en->obj->valuedouble, i);
  }
  kvr_sim_rstore_free(st);
  kvr_sim_rstore_free(NULL);
}

/* A background stream's event log (vLLM's event_store): events split at their blank lines, read
 * back from any event on. */
static void test_store_events(void **state) {
  (void)state;
  kvr_sim_rstore_t *st = kvr_sim_rstore_new(10);
  kvr_sim_stored_t *en = kvr_sim_rstore_put(st, "r", cJSON_CreateNull(), NULL);
  size_t len;
  kvr_sim_stored_events_from(en, 0, &len);
  assert_int_equal(len, 0);
  assert_false(en->has_events);
  const char *two = "event: a\ndata: {\"x\":\"a\\n\\nb\"}\n\nevent: b\ndata: {}\n\n";
  kvr_sim_stored_add_events(en, two, strlen(two));
  const char *third = "event: c\ndata: {}\n\n";
  kvr_sim_stored_add_events(en, third, strlen(third));
  assert_true(en->has_events);
  assert_int_equal(en->nev, 3);
  const char *p = kvr_sim_stored_events_from(en, 1, &len);
  assert_int_equal(len, 38);
  assert_memory_equal(p, "event: b\ndata: {}\n\nevent: c\ndata: {}\n\n", 38);
  p = kvr_sim_stored_events_from(en, 0, &len);
  assert_int_equal(len, strlen(two) + strlen(third));
  kvr_sim_stored_events_from(en, 3, &len);
  assert_int_equal(len, 0);
  kvr_sim_rstore_free(st);
}

/* vLLM's error bodies: OpenAI shape with the status as code (param null when unset), Anthropic's
 * shape, pydantic's loc tuples. */
static void test_error_bodies(void **state) {
  (void)state;
  kvr_sim_err_t e;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_sim_err(&e, 404, KVR_SIM_ERR_INVALID, "response_id", "Response with id '%s' not found.",
              "resp_x");
  kvr_sim_err_openai_json(&b, &e);
  kvr_buf_append(&b, "", 1);
  assert_string_equal(b.data, "{\"error\":{\"message\":\"Response with id 'resp_x' not found.\","
                              "\"type\":\"invalid_request_error\",\"param\":\"response_id\","
                              "\"code\":404}}");
  kvr_buf_reset(&b);
  kvr_sim_err(&e, 404, KVR_SIM_ERR_NOT_FOUND, NULL, "The model `x` does not exist.");
  kvr_sim_err_anthropic_json(&b, &e);
  kvr_buf_append(&b, "", 1);
  assert_string_equal(b.data, "{\"type\":\"error\",\"error\":{\"type\":\"NotFoundError\","
                              "\"message\":\"The model `x` does not exist.\"}}");
  kvr_buf_reset(&b);
  kvr_sim_err(&e, 400, KVR_SIM_ERR_BAD_REQUEST, NULL, "m");
  kvr_sim_err_openai_json(&b, &e);
  kvr_buf_append(&b, "", 1);
  assert_non_null(strstr(b.data, "\"param\":null,\"code\":400"));
  kvr_sim_err_validation(&e, "messages.0.role", NULL, "literal_error", "bad");
  assert_string_equal(e.param, "body.messages.0.role");
  assert_non_null(strstr(e.message, "'loc': ('body', 'messages', 0, 'role')"));
  kvr_sim_err_validation(&e, NULL, NULL, "value_error", "v");
  assert_string_equal(e.param, "");
  assert_non_null(strstr(e.message, "'loc': ('body',)"));
  kvr_buf_free(&b);
}

KVR_TEST_MAIN(cmocka_unit_test(test_read), cmocka_unit_test(test_messages_history),
              cmocka_unit_test(test_messages_items), cmocka_unit_test(test_continue_final),
              cmocka_unit_test(test_object), cmocka_unit_test(test_events),
              cmocka_unit_test(test_store), cmocka_unit_test(test_store_events),
              cmocka_unit_test(test_error_bodies))

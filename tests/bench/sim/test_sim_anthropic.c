/* test_sim_anthropic.c -- the simulated worker's Anthropic Messages API
 * (bench/sim/sim_anthropic.c), pure: what pydantic refuses (in the OpenAI shape, as vLLM), the
 * conversion to chat messages (system text joined with no separator, billing-header blocks
 * dropped, system-role messages folded in, tool_use, tool_result, thinking), the reply and the
 * stream events with vLLM's usage (cache fields only with prompt tokens details), count_tokens'
 * reply. No server, no loop. */
#include "base/buf.h"
#include "bench/sim/sim_anthropic.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

#define HEAD "\"model\":\"m\",\"max_tokens\":5,"

static void expect_error(const char *json, bool count, const char *type, const char *param,
                         const char *needle) {
  cJSON *body = cJSON_Parse(json);
  assert_non_null(body);
  kvr_sim_msg_req_t rq;
  kvr_sim_err_t e;
  int rc = kvr_sim_anthropic_read(body, count, &rq, &e);
  if (rc != 400 || strcmp(e.type, type) != 0 || strcmp(e.param, param) != 0 ||
      strstr(e.message, needle) == NULL)
    fail_msg("%s: got %d %s '%s' \"%s\"", json, rc, e.type, e.param, e.message);
  cJSON_Delete(body);
}

/* AnthropicMessagesRequest's required fields and validators, AnthropicMessage's roles and
 * content, the block types; count_tokens needs no max_tokens. */
static void test_read_errors(void **state) {
  (void)state;
  expect_error("{\"messages\":[]}", false, "Bad Request", "body.model", "Field required");
  expect_error("{\"model\":\"\",\"max_tokens\":5,\"messages\":[]}", false, "Bad Request",
               "body.model", "Model is required");
  expect_error("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", false,
               "Bad Request", "body.max_tokens", "'missing', 'loc': ('body', 'max_tokens')");
  expect_error("{\"model\":\"m\",\"max_tokens\":0,\"messages\":[]}", false, "Bad Request",
               "body.max_tokens", "max_tokens must be positive");
  expect_error("{\"model\":\"m\",\"max_tokens\":\"5\",\"messages\":[]}", false, "Bad Request",
               "body.max_tokens", "valid integer");
  expect_error("{" HEAD "\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", false,
               "Bad Request", "body.messages.0.role", "'user', 'assistant' or 'system'");
  expect_error("{" HEAD "\"messages\":[{\"role\":\"user\"}]}", false, "Bad Request",
               "body.messages.0.content", "Field required");
  expect_error("{" HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}",
               false, "Bad Request", "body.messages.0.content.0.type", "'text', 'image'");
  expect_error("{" HEAD "\"messages\":[],\"system\":7}", false, "Bad Request", "body.system",
               "valid list");
  expect_error("{" HEAD "\"messages\":[],\"stream\":\"yes\"}", false, "Bad Request", "body.stream",
               "valid boolean");
  /* images are beyond the sim's renderer */
  expect_error("{" HEAD "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\","
               "\"source\":{\"type\":\"url\",\"url\":\"u\"}}]}]}",
               false, "BadRequestError", "", "image");
  cJSON *body =
      cJSON_Parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}");
  kvr_sim_msg_req_t rq;
  kvr_sim_err_t e;
  assert_int_equal(kvr_sim_anthropic_read(body, true, &rq, &e), 0);
  assert_int_equal(rq.max_tokens, -1);
  assert_string_equal(rq.model, "m");
  cJSON_Delete(rq.messages);
  cJSON_Delete(body);
}

static void expect_chat(const char *json, const char *want, int64_t max_tokens, bool stream) {
  cJSON *body = cJSON_Parse(json);
  assert_non_null(body);
  kvr_sim_msg_req_t rq;
  kvr_sim_err_t e;
  if (kvr_sim_anthropic_read(body, false, &rq, &e) != 0)
    fail_msg("%s: %s", json, e.message);
  char *got = cJSON_PrintUnformatted(rq.messages);
  if (strcmp(got, want) != 0)
    fail_msg("%s:\n got  %s\n want %s", json, got, want);
  assert_int_equal(rq.max_tokens, max_tokens);
  assert_int_equal(rq.stream, stream);
  free(got);
  cJSON_Delete(rq.messages);
  cJSON_Delete(body);
}

/* _convert_anthropic_to_openai_request, as the sim renders it. */
static void test_convert(void **state) {
  (void)state;
  /* system blocks joined with no separator, the billing header dropped, a system-role message's
   * text appended to it; ctx becomes user */
  expect_chat("{" HEAD "\"stream\":true,\"system\":[{\"type\":\"text\",\"text\":"
              "\"x-anthropic-billing-header: cc_version=1; hash=abc\"},{\"type\":\"text\",\"text\":"
              "\"You are \"},{\"type\":\"text\",\"text\":\"terse.\"}],\"messages\":["
              "{\"role\":\"system\",\"content\":\" Really.\"},"
              "{\"role\":\"ctx\",\"content\":\"Hi\"}]}",
              "[{\"role\":\"system\",\"content\":\"You are terse. Really.\"},"
              "{\"role\":\"user\",\"content\":\"Hi\"}]",
              5, true);
  /* blocks: text parts joined, thinking as reasoning, tool_use as tool calls, a user's
   * tool_result as a tool message before the (then empty, so dropped) user message, an
   * assistant's as text */
  expect_chat(
      "{" HEAD "\"system\":\"S\",\"messages\":["
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
      "\"text\":\"b\"}]},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\","
      "\"signature\":\"s\"},{\"type\":\"text\",\"text\":\"Calling.\"},{\"type\":\"tool_use\","
      "\"id\":\"tu1\",\"name\":\"f\",\"input\":{\"q\":1}}]},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"tu1\","
      "\"content\":[{\"type\":\"text\",\"text\":\"r1\"},{\"type\":\"text\",\"text\":\"r2\"}]}]},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_result\",\"content\":\"ok\"},"
      "{\"type\":\"redacted_thinking\",\"data\":\"zz\"}]}]}",
      "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"ab\"},"
      "{\"role\":\"assistant\",\"reasoning\":\"hmm\",\"tool_calls\":[{\"id\":\"tu1\",\"type\":"
      "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"q\\\":1}\"}}],"
      "\"content\":\"Calling.\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"tu1\",\"content\":\"r1\\nr2\"},"
      "{\"role\":\"assistant\",\"content\":\"Tool result: ok\"}]",
      5, false);
  /* an empty system gives no system message; a trailing assistant message stays a message (vLLM
   * never continues it) */
  expect_chat("{" HEAD "\"system\":\"\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
              "{\"role\":\"assistant\",\"content\":\"partial\"}]}",
              "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":"
              "\"partial\"}]",
              5, false);
}

/* The reply and the stream: stop reasons, usage with and without prompt tokens details (then
 * input_tokens = prompt - cached, cache_read_input_tokens = cached, creation 0), message_start's
 * whole prompt, no ping, the event order. */
static void test_replies(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_sim_msg_usage_t plain = {.prompt = 20, .output = 2, .cached = -1};
  kvr_sim_msg_usage_t details = {.prompt = 20, .output = 2, .cached = 16};
  kvr_sim_anthropic_reply(&b, "chatcmpl-1", "m", "ab cd ", 6, false, &plain);
  kvr_buf_append(&b, "", 1);
  assert_string_equal(b.data,
                      "{\"id\":\"chatcmpl-1\",\"type\":\"message\",\"role\":\"assistant\","
                      "\"content\":[{\"type\":\"text\",\"text\":\"ab cd \"}],\"model\":\"m\","
                      "\"stop_reason\":\"end_turn\",\"usage\":{\"input_tokens\":20,"
                      "\"output_tokens\":2}}");
  kvr_buf_reset(&b);
  kvr_sim_anthropic_reply(&b, "chatcmpl-1", "m", "ab cd ", 6, true, &details);
  kvr_buf_append(&b, "", 1);
  assert_non_null(strstr(b.data, "\"stop_reason\":\"max_tokens\",\"usage\":{\"input_tokens\":4,"
                                 "\"output_tokens\":2,\"cache_creation_input_tokens\":0,"
                                 "\"cache_read_input_tokens\":16}}"));
  kvr_buf_reset(&b);
  kvr_sim_anthropic_ev_start(&b, "chatcmpl-2", "m", 20);
  kvr_sim_anthropic_ev_delta(&b, "ab ", 3);
  kvr_sim_anthropic_ev_delta(&b, "cd ", 3);
  kvr_sim_anthropic_ev_end(&b, false, &details);
  kvr_buf_append(&b, "", 1);
  static const char *const order[] = {
      "message_start",      "content_block_start", "content_block_delta", "content_block_delta",
      "content_block_stop", "message_delta",       "message_stop"};
  const char *p = b.data;
  for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
    char want[80];
    snprintf(want, sizeof(want), "event: %s\ndata: {\"type\":\"%s\"", order[i], order[i]);
    assert_true(strncmp(p, want, strlen(want)) == 0);
    p = strstr(p, "\n\n") + 2;
  }
  assert_string_equal(p, "");
  assert_null(strstr(b.data, "ping"));
  assert_non_null(strstr(b.data, "\"usage\":{\"input_tokens\":20,\"output_tokens\":0}}}"));
  assert_non_null(strstr(b.data, "\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{"
                                 "\"input_tokens\":4,\"output_tokens\":2,"
                                 "\"cache_creation_input_tokens\":0,"
                                 "\"cache_read_input_tokens\":16}}"));
  assert_non_null(strstr(b.data, "{\"type\":\"content_block_delta\",\"delta\":{\"type\":"
                                 "\"text_delta\",\"text\":\"ab \"},\"index\":0}"));
  kvr_buf_reset(&b);
  kvr_sim_anthropic_count(&b, 42);
  kvr_buf_append(&b, "", 1);
  assert_string_equal(
      b.data, "{\"input_tokens\":42,\"context_management\":{\"original_input_tokens\":42}}");
  kvr_buf_free(&b);
}

KVR_TEST_MAIN(cmocka_unit_test(test_read_errors), cmocka_unit_test(test_convert),
              cmocka_unit_test(test_replies))

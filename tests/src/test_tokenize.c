/* test_tokenize.c -- src/tokenize.c's pure parts: what a request body becomes for a worker's
 * POST /tokenize (chat fields kept, completion prompts, token-id prompts that need no call,
 * bodies with no single prompt) and how the answer's ids are read. The call itself runs against a
 * real `kvrouter sim` in tests/router/test_precise.py. */
#include "src/buf.h"
#include "src/tokenize.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

static cJSON *body_of(const char *req, kvr_route_t route, int want) {
  kvr_buf_t out = KVR_BUF_INIT;
  uint32_t *ids = NULL;
  size_t n = 0;
  assert_int_equal(kvr_tokenize_body(req, strlen(req), route, &out, &ids, &n), want);
  assert_null(ids);
  cJSON *o = want == 1 ? cJSON_Parse(out.data) : NULL;
  kvr_buf_free(&out);
  return o;
}

static void test_bodies(void **state) {
  (void)state;
  /* chat: the template's fields are kept, sampling fields are not */
  cJSON *o = body_of("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                     "\"tools\":[{\"type\":\"function\"}],\"chat_template_kwargs\":{\"x\":1},"
                     "\"temperature\":0.5,\"max_tokens\":9,\"stream\":true}",
                     KVR_ROUTE_CHAT, 1);
  assert_non_null(cJSON_GetObjectItem(o, "messages"));
  assert_non_null(cJSON_GetObjectItem(o, "tools"));
  assert_non_null(cJSON_GetObjectItem(o, "chat_template_kwargs"));
  assert_string_equal(cJSON_GetObjectItem(o, "model")->valuestring, "m");
  assert_null(cJSON_GetObjectItem(o, "temperature"));
  assert_null(cJSON_GetObjectItem(o, "max_tokens"));
  assert_null(cJSON_GetObjectItem(o, "stream"));
  cJSON_Delete(o);
  /* completions: a string, or a list of one string */
  o = body_of("{\"model\":\"m\",\"prompt\":[\"once\"],\"add_special_tokens\":false}",
              KVR_ROUTE_COMPLETIONS, 1);
  assert_string_equal(cJSON_GetObjectItem(o, "prompt")->valuestring, "once");
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(o, "add_special_tokens")));
  cJSON_Delete(o);
  /* no single prompt: a batch, no messages, not JSON */
  body_of("{\"prompt\":[\"a\",\"b\"]}", KVR_ROUTE_COMPLETIONS, -1);
  body_of("{\"model\":\"m\"}", KVR_ROUTE_CHAT, -1);
  body_of("{nope", KVR_ROUTE_CHAT, -1);
  body_of("{\"prompt\":[1,\"x\"]}", KVR_ROUTE_COMPLETIONS, -1);
  /* token ids: what the engine sees, no call needed */
  kvr_buf_t out = KVR_BUF_INIT;
  uint32_t *ids = NULL;
  size_t n = 0;
  const char *req = "{\"prompt\":[128000,5,4294967295]}";
  assert_int_equal(kvr_tokenize_body(req, strlen(req), KVR_ROUTE_COMPLETIONS, &out, &ids, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(ids[0], 128000);
  assert_int_equal(ids[2], 4294967295u);
  free(ids);
  kvr_buf_free(&out);
}

static void test_answers(void **state) {
  (void)state;
  uint32_t *ids = NULL;
  size_t n = 0;
  const char *a = "{\"count\":3,\"max_model_len\":8192,\"tokens\":[1,2,3],\"token_strs\":null}";
  assert_int_equal(kvr_tokenize_parse_answer(a, strlen(a), &ids, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(ids[1], 2);
  free(ids);
  const char *bad[] = {"{\"tokens\":[1,-2]}", "{\"tokens\":\"x\"}", "{}", "not json",
                       "{\"tokens\":[1.5e12]}"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(kvr_tokenize_parse_answer(bad[i], strlen(bad[i]), &ids, &n), -1);
  const char *empty = "{\"tokens\":[]}";
  assert_int_equal(kvr_tokenize_parse_answer(empty, strlen(empty), &ids, &n), 0);
  assert_int_equal(n, 0);
  free(ids);
}

KVR_TEST_MAIN(cmocka_unit_test(test_bodies), cmocka_unit_test(test_answers))

/* test_tokenize.c -- src/serve/tokenize.c's pure parts: what a request body becomes for a worker's
 * POST /tokenize (chat fields kept, completion prompts, token-id prompts that need no call,
 * bodies with no single prompt), a chat body's message-prefix keys (a conversation's next turn
 * carries the previous turn's keys first; any other field or message changes them), and how the
 * answer's ids are read. The call itself runs against a
 * real `kvrouter sim` in tests/router/test_precise.py. */
#include "base/buf.h"
#include "base/kvr.h"
#include "serve/tokenize.h"

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
  assert_int_equal(kvr_tokenize_body(req, strlen(req), route, &out, &ids, &n, NULL), want);
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
  assert_int_equal(kvr_tokenize_body(req, strlen(req), KVR_ROUTE_COMPLETIONS, &out, &ids, &n, NULL),
                   0);
  assert_int_equal(n, 3);
  assert_int_equal(ids[0], 128000);
  assert_int_equal(ids[2], 4294967295u);
  free(ids);
  kvr_buf_free(&out);
}

/* The message-prefix keys and characters of a chat request. */
static kvr_tokenize_prefixes_t prefixes_of(const char *req) {
  kvr_buf_t out = KVR_BUF_INIT;
  uint32_t *ids = NULL;
  size_t n = 0;
  kvr_tokenize_prefixes_t pre;
  assert_int_equal(kvr_tokenize_body(req, strlen(req), KVR_ROUTE_CHAT, &out, &ids, &n, &pre), 1);
  kvr_buf_free(&out);
  return pre;
}

static void test_prefixes(void **state) {
  (void)state;
  const char *turn1 = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                      "{\"role\":\"user\",\"content\":\"q1\"}],\"max_tokens\":5}";
  const char *turn2 = "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                      "{\"role\":\"user\",\"content\":\"q1\"},{\"role\":\"assistant\","
                      "\"content\":\"a1\"},{\"role\":\"user\",\"content\":\"q2\"}],"
                      "\"temperature\":1}";
  kvr_tokenize_prefixes_t a = prefixes_of(turn1), b = prefixes_of(turn2);
  assert_int_equal(a.n, 2);
  assert_int_equal(b.n, 4);
  /* turn 2 begins with turn 1's messages: the same keys (sampling fields do not count) */
  for (size_t i = 0; i < a.n; i++) {
    assert_true(a.keys[i] == b.keys[i]);
    assert_int_equal(a.chars[i], b.chars[i]);
    assert_true(a.keys[i] != 0);
  }
  assert_true(b.keys[2] != b.keys[1] && b.keys[3] != b.keys[2]);
  assert_true(b.chars[3] > b.chars[2] && b.chars[2] > b.chars[1]);
  /* another model, another template option, or another first message: other keys */
  const char *other[] = {"{\"model\":\"n\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                         "{\"role\":\"user\",\"content\":\"q1\"}]}",
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                         "{\"role\":\"user\",\"content\":\"q1\"}],\"add_generation_prompt\":false}",
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"T\"},"
                         "{\"role\":\"user\",\"content\":\"q1\"}]}"};
  for (size_t k = 0; k < KVR_ARRAY_SIZE(other); k++) {
    kvr_tokenize_prefixes_t c = prefixes_of(other[k]);
    assert_int_equal(c.n, 2);
    assert_true(c.keys[1] != a.keys[1]);
    kvr_tokenize_prefixes_free(&c);
  }
  kvr_tokenize_prefixes_free(&a);
  kvr_tokenize_prefixes_free(&b);
  assert_null(b.keys);
  /* a completion body has no message prefixes */
  kvr_buf_t out = KVR_BUF_INIT;
  uint32_t *ids = NULL;
  size_t n = 0;
  kvr_tokenize_prefixes_t c;
  const char *req = "{\"prompt\":\"x\"}";
  assert_int_equal(kvr_tokenize_body(req, strlen(req), KVR_ROUTE_COMPLETIONS, &out, &ids, &n, &c),
                   1);
  assert_int_equal(c.n, 0);
  kvr_tokenize_prefixes_free(&c);
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

KVR_TEST_MAIN(cmocka_unit_test(test_bodies), cmocka_unit_test(test_prefixes),
              cmocka_unit_test(test_answers))

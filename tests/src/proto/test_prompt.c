/* test_prompt.c -- prompt extraction, canonical form and prefix-block hashes.
 *
 * Golden values were computed once, independently of this code and of libxxhash, by a pure-Python
 * XXH3-64 written from the xxHash specification (Cyan4973/xxHash doc/xxhash_spec.md); the script
 * is reproduced in policies/README.md ("Golden hashes") and run as `python3 xxh3_ref.py`. The
 * script itself was checked against published values (XXH3_64("") = 0x2d06800538d394c2) and
 * against libxxhash on every length path (0..240 bytes, two seeds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "proto/prompt.h"

#define MODEL "meta-llama/Llama-3.3-70B-Instruct"
#define SYS                                                                                        \
  "You are a helpful assistant. Answer briefly and cite the passage you rely on. "                 \
  "You are a helpful assistant. Answer briefly and cite the passage you rely on. "
#define Q1 "What does chunked prefill change in the vLLM scheduler, and why does it matter?"

static cJSON *parse(const char *s) {
  cJSON *j = cJSON_Parse(s);
  assert_non_null(j);
  return j;
}

/* Builds a chat body from (role, content) pairs; NULL-terminated. */
static cJSON *chat_body(const char *model, ...) {
  cJSON *body = cJSON_CreateObject();
  cJSON_AddStringToObject(body, "model", model);
  cJSON *msgs = cJSON_AddArrayToObject(body, "messages");
  va_list ap;
  va_start(ap, model);
  for (;;) {
    const char *role = va_arg(ap, const char *);
    if (role == NULL)
      break;
    const char *content = va_arg(ap, const char *);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
  }
  va_end(ap);
  return body;
}

static void test_golden_chat(void **state) {
  (void)state;
  cJSON *body = chat_body(MODEL, "system", SYS, "user", Q1, NULL);
  kvr_prompt_t p;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(body, KVR_PROMPT_CHAT, 64, &p, err, sizeof(err)), 0);
  assert_int_equal(p.text.len, 249);
  assert_int_equal(p.text.data[0], 0x1e);
  assert_int_equal(p.model_seed, UINT64_C(0x0e0c5476970fbf0f));
  static const uint64_t golden[] = {UINT64_C(0xd00ee768c88e4eb0), UINT64_C(0xaa810efb8bdaaace),
                                    UINT64_C(0xce435fc4cc2b4003)};
  assert_int_equal(p.nblocks, 3);
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(p.blocks[i], golden[i]);
  assert_int_equal(p.prompt_tokens, (249 + 3) / 4);
  kvr_prompt_free(&p);
  cJSON_Delete(body);
}

static void test_golden_completions_block16(void **state) {
  (void)state;
  kvr_buf_t s = KVR_BUF_INIT;
  for (int i = 0; i < 4; i++)
    kvr_buf_puts(&s, "The quick brown fox jumps over the lazy dog. ");
  cJSON *body = cJSON_CreateObject();
  cJSON_AddStringToObject(body, "model", "m");
  cJSON_AddStringToObject(body, "prompt", s.data);
  kvr_prompt_t p;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(body, KVR_PROMPT_COMPLETIONS, 16, &p, err, sizeof(err)), 0);
  assert_int_equal(p.text.len, 180);
  assert_int_equal(p.nblocks, 11);
  static const uint64_t golden[] = {UINT64_C(0xebcc7247f06d094e), UINT64_C(0x0882c1f6adbecdc4),
                                    UINT64_C(0x572d4358bb1aa347), UINT64_C(0xfc3ee115fb3d6f9f),
                                    UINT64_C(0x5b9e6e89204faa87), UINT64_C(0xcaab90865b20ffe0)};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(golden); i++)
    assert_int_equal(p.blocks[i], golden[i]);
  kvr_prompt_free(&p);
  kvr_buf_free(&s);
  cJSON_Delete(body);
}

/* Turn N's blocks are a prefix of turn N+1's, and the answer blocks recorded at completion are
 * exactly the ones the next turn looks up. */
static void test_new_turn_keeps_blocks(void **state) {
  (void)state;
  const char *answer = "Chunked prefill splits a long prompt into pieces that share each step with "
                       "decodes, so a big prefill no longer stalls every running sequence.";
  const char *q2 = "Can you elaborate further on that?";
  cJSON *b1 = chat_body(MODEL, "system", SYS, "user", Q1, NULL);
  cJSON *b2 = chat_body(MODEL, "system", SYS, "user", Q1, "assistant", answer, "user", q2, NULL);
  kvr_prompt_t p1, p2;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(b1, KVR_PROMPT_CHAT, 64, &p1, err, sizeof(err)), 0);
  assert_int_equal(kvr_prompt_from_json(b2, KVR_PROMPT_CHAT, 64, &p2, err, sizeof(err)), 0);
  assert_true(p2.nblocks > p1.nblocks);
  assert_memory_equal(p1.blocks, p2.blocks, p1.nblocks * sizeof(uint64_t));
  assert_memory_equal(p1.text.data, p2.text.data, p1.text.len);

  size_t before = p1.nblocks;
  uint64_t first = p1.blocks[0];
  assert_int_equal(kvr_prompt_extend_answer(&p1, answer, strlen(answer)), 0);
  assert_true(p1.nblocks > before);
  assert_int_equal(p1.blocks[0], first);
  assert_true(p1.nblocks <= p2.nblocks);
  assert_memory_equal(p1.blocks, p2.blocks, p1.nblocks * sizeof(uint64_t));
  assert_int_equal(p1.nblocks, p1.text.len / 64);

  /* Independent recomputation of the chain over the whole extended text. */
  uint64_t *again = calloc(p1.nblocks, sizeof(uint64_t));
  assert_int_equal(kvr_prompt_hash_blocks(p1.text.data, p1.text.len, 64, p1.model_seed, again),
                   p1.nblocks);
  assert_memory_equal(again, p1.blocks, p1.nblocks * sizeof(uint64_t));
  free(again);
  kvr_prompt_free(&p1);
  kvr_prompt_free(&p2);
  cJSON_Delete(b1);
  cJSON_Delete(b2);
}

static void test_content_parts_match_string(void **state) {
  (void)state;
  cJSON *a = chat_body(MODEL, "system", SYS, "user", Q1, NULL);
  char json[1024];
  snprintf(json, sizeof(json),
           "{\"model\":\"%s\",\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\","
           "\"text\":\"%.78s\"},{\"type\":\"text\",\"text\":\"%s\"}]},{\"role\":\"user\","
           "\"content\":\"%s\"}]}",
           MODEL, SYS, SYS + 78, Q1);
  cJSON *b = parse(json);
  kvr_prompt_t pa, pb;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(a, KVR_PROMPT_CHAT, 64, &pa, err, sizeof(err)), 0);
  assert_int_equal(kvr_prompt_from_json(b, KVR_PROMPT_CHAT, 64, &pb, err, sizeof(err)), 0);
  assert_int_equal(pa.text.len, pb.text.len);
  assert_memory_equal(pa.blocks, pb.blocks, pa.nblocks * sizeof(uint64_t));
  kvr_prompt_free(&pa);
  kvr_prompt_free(&pb);
  cJSON_Delete(a);
  cJSON_Delete(b);

  /* Two different images give different blocks even with the same text. */
  const char *img = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                    "\"image_url\",\"image_url\":{\"url\":\"https://example.com/%c.png\"}},{"
                    "\"type\":\"text\",\"text\":\"Describe this picture in great detail please, "
                    "with colours and shapes.\"}]}]}";
  snprintf(json, sizeof(json), img, 'a');
  a = parse(json);
  snprintf(json, sizeof(json), img, 'b');
  b = parse(json);
  assert_int_equal(kvr_prompt_from_json(a, KVR_PROMPT_CHAT, 16, &pa, err, sizeof(err)), 0);
  assert_int_equal(kvr_prompt_from_json(b, KVR_PROMPT_CHAT, 16, &pb, err, sizeof(err)), 0);
  assert_true(pa.nblocks >= 3);
  assert_int_equal(pa.nblocks, pb.nblocks);
  assert_true(pa.blocks[pa.nblocks - 1] != pb.blocks[pb.nblocks - 1]);
  kvr_prompt_free(&pa);
  kvr_prompt_free(&pb);
  cJSON_Delete(a);
  cJSON_Delete(b);
}

static void test_models_never_share(void **state) {
  (void)state;
  cJSON *a = chat_body("model-a", "system", SYS, NULL);
  cJSON *b = chat_body("model-b", "system", SYS, NULL);
  kvr_prompt_t pa, pb;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(a, KVR_PROMPT_CHAT, 64, &pa, err, sizeof(err)), 0);
  assert_int_equal(kvr_prompt_from_json(b, KVR_PROMPT_CHAT, 64, &pb, err, sizeof(err)), 0);
  assert_memory_equal(pa.text.data, pb.text.data, pa.text.len);
  for (size_t i = 0; i < pa.nblocks; i++)
    assert_true(pa.blocks[i] != pb.blocks[i]);
  kvr_prompt_free(&pa);
  kvr_prompt_free(&pb);
  cJSON_Delete(a);
  cJSON_Delete(b);
}

/* p from a completions body (JSON text) at block_chars per block; the body must be accepted. */
static void completions(const char *body, size_t block_chars, kvr_prompt_t *p) {
  char err[256];
  cJSON *j = parse(body);
  assert_int_equal(
      kvr_prompt_from_json(j, KVR_PROMPT_COMPLETIONS, block_chars, p, err, sizeof(err)), 0);
  cJSON_Delete(j);
}

static void test_completions_forms(void **state) {
  (void)state;
  kvr_prompt_t p;
  completions("{\"model\":\"m\",\"prompt\":[\"ab\",\"cd\"],\"max_tokens\":7,\"stream\":true}", 64,
              &p);
  assert_int_equal(p.text.len, 5);
  assert_memory_equal(p.text.data,
                      "ab\x1e"
                      "cd",
                      5);
  assert_int_equal(p.max_tokens, 7);
  assert_true(p.stream);
  assert_int_equal(p.nblocks, 0);
  kvr_prompt_free(&p);

  completions(
      "{\"model\":\"m\",\"prompt\":[1,22,333],\"max_completion_tokens\":9,\"max_tokens\":3}", 4,
      &p);
  assert_string_equal(p.text.data, "1 22 333 ");
  assert_int_equal(p.prompt_tokens, 3);
  assert_int_equal(p.max_tokens, 9);
  assert_false(p.stream);
  assert_int_equal(p.nblocks, 2);
  kvr_prompt_free(&p);

  completions("{\"model\":\"m\",\"prompt\":[[1,2],[3]]}", 64, &p);
  assert_string_equal(p.text.data, "1 2 \x1e"
                                   "3 ");
  assert_int_equal(p.prompt_tokens, 3);
  kvr_prompt_free(&p);

  /* Completions answers append verbatim. */
  completions("{\"model\":\"m\",\"prompt\":\"0123456789\"}", 8, &p);
  assert_int_equal(p.nblocks, 1);
  kvr_prompt_extend_answer(&p, "abcdef", 6);
  assert_string_equal(p.text.data, "0123456789abcdef");
  assert_int_equal(p.nblocks, 2);
  kvr_prompt_free(&p);
}

typedef struct {
  kvr_prompt_kind_t kind;
  const char *body;
  const char *code;
  const char *param;
  const char *message_part;
} bad_case_t;

static void test_errors(void **state) {
  (void)state;
  static const bad_case_t cases[] = {
      {KVR_PROMPT_CHAT, "{\"messages\":[]}", "missing_required_parameter", "model",
       "Missing required parameter: 'model'."},
      {KVR_PROMPT_CHAT, "{\"model\":3,\"messages\":[]}", "invalid_type", "model",
       "Invalid type for 'model': expected a string, but got a number instead."},
      {KVR_PROMPT_CHAT, "{\"model\":\"m\"}", "missing_required_parameter", "messages",
       "'messages'"},
      {KVR_PROMPT_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", "invalid_type", "messages",
       "expected an array, but got a string"},
      {KVR_PROMPT_CHAT, "{\"model\":\"m\",\"messages\":[]}", "empty_array", "messages",
       "empty array"},
      {KVR_PROMPT_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}",
       "missing_required_parameter", "messages[0].role", "'messages[0].role'"},
      {KVR_PROMPT_CHAT,
       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\","
       "\"content\":5}]}",
       "invalid_type", "messages[1].content", "got a number"},
      {KVR_PROMPT_CHAT,
       "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
       "missing_required_parameter", "messages[0].content[0].text", "text"},
      {KVR_PROMPT_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}],\"stream\":\"yes\"}",
       "invalid_type", "stream", "expected a boolean"},
      {KVR_PROMPT_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}],\"max_tokens\":-1}",
       "invalid_value", "max_tokens", "non-negative integer"},
      {KVR_PROMPT_COMPLETIONS, "{\"model\":\"m\"}", "missing_required_parameter", "prompt",
       "'prompt'"},
      {KVR_PROMPT_COMPLETIONS, "{\"model\":\"m\",\"prompt\":{}}", "invalid_type", "prompt",
       "got an object"},
      {KVR_PROMPT_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"a\",2]}", "invalid_type",
       "prompt[1]", "expected a string"},
      {KVR_PROMPT_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,2.5]}", "invalid_value", "prompt",
       "token ids"},
      {KVR_PROMPT_COMPLETIONS, "[1,2]", "invalid_type", "", "expected a JSON object"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cases); i++) {
    cJSON *j = parse(cases[i].body);
    kvr_prompt_t p;
    char err[256] = "";
    int rc = kvr_prompt_from_json(j, cases[i].kind, 64, &p, err, sizeof(err));
    if (rc != KVR_EINVAL || strcmp(p.err_code, cases[i].code) != 0 ||
        strcmp(p.err_param, cases[i].param) != 0 || strstr(err, cases[i].message_part) == NULL)
      fail_msg("case %zu (%s): rc=%d code=%s param=%s err=%s", i, cases[i].body, rc,
               p.err_code ? p.err_code : "(null)", p.err_param, err);
    kvr_prompt_free(&p);
    cJSON_Delete(j);
  }
}

static void test_route_req_view(void **state) {
  (void)state;
  cJSON *b = chat_body(MODEL, "system", SYS, "user", Q1, NULL);
  cJSON_AddNumberToObject(b, "max_tokens", 100);
  kvr_prompt_t p;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(b, KVR_PROMPT_CHAT, 64, &p, err, sizeof(err)), 0);
  kvr_route_req_t req;
  kvr_prompt_route_req(&p, &req);
  assert_ptr_equal(req.blocks, p.blocks);
  assert_int_equal(req.nblocks, 3);
  assert_int_equal(req.block_chars, 64);
  assert_int_equal(req.prompt_tokens, p.prompt_tokens);
  assert_int_equal(req.max_tokens, 100);
  kvr_prompt_free(&p);
  kvr_prompt_free(NULL);
  cJSON_Delete(b);
}

KVR_TEST_MAIN(cmocka_unit_test(test_golden_chat), cmocka_unit_test(test_golden_completions_block16),
              cmocka_unit_test(test_new_turn_keeps_blocks),
              cmocka_unit_test(test_content_parts_match_string),
              cmocka_unit_test(test_models_never_share), cmocka_unit_test(test_completions_forms),
              cmocka_unit_test(test_errors), cmocka_unit_test(test_route_req_view))

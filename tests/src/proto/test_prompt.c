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

/* Issue 36: one conversation through chat, Responses and Messages gives the same canonical text
 * and blocks (plain text turns render the same prompt at vLLM), and each API's answer extends it
 * the same way. */
static void test_same_blocks_across_apis(void **state) {
  (void)state;
  const char *A = "Chunked prefill splits a long prompt into pieces scheduled with decodes.";
  cJSON *chat =
      chat_body(MODEL, "system", SYS, "user", Q1, "assistant", A, "user", "And why?", NULL);
  char body[4096];
  snprintf(
      body, sizeof body,
      "{\"model\":\"%s\",\"instructions\":\"%s\",\"input\":[{\"role\":\"user\",\"content\":\"%s\"},"
      "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\","
      "\"text\":\"%s\"}]},{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":"
      "\"And why?\"}]}]}",
      MODEL, SYS, Q1, A);
  cJSON *resp = parse(body);
  snprintf(
      body, sizeof body,
      "{\"model\":\"%s\",\"max_tokens\":8,\"system\":[{\"type\":\"text\",\"text\":\"%.20s\"},"
      "{\"type\":\"text\",\"text\":\"%s\"}],\"messages\":[{\"role\":\"user\",\"content\":\"%s\"},"
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"%s\"}]},"
      "{\"role\":\"user\",\"content\":\"And why?\"}]}",
      MODEL, SYS, SYS + 20, Q1, A);
  cJSON *msgs = parse(body);
  kvr_prompt_t pc, pr, pm;
  char err[256];
  assert_int_equal(kvr_prompt_from_json(chat, KVR_PROMPT_CHAT, 64, &pc, err, sizeof err), 0);
  assert_int_equal(kvr_prompt_from_json(resp, KVR_PROMPT_RESPONSES, 64, &pr, err, sizeof err), 0);
  assert_int_equal(kvr_prompt_from_json(msgs, KVR_PROMPT_MESSAGES, 64, &pm, err, sizeof err), 0);
  assert_int_equal(pc.text.len, pr.text.len);
  assert_int_equal(pc.text.len, pm.text.len);
  assert_memory_equal(pc.text.data, pr.text.data, pc.text.len);
  assert_memory_equal(pc.text.data, pm.text.data, pc.text.len);
  assert_true(pc.nblocks > 4 && pc.nblocks == pr.nblocks && pc.nblocks == pm.nblocks);
  assert_memory_equal(pc.blocks, pr.blocks, pc.nblocks * sizeof *pc.blocks);
  assert_memory_equal(pc.blocks, pm.blocks, pc.nblocks * sizeof *pc.blocks);
  assert_int_equal(pm.max_tokens, 8);
  kvr_prompt_extend_answer(&pc, "Because.", 8);
  kvr_prompt_extend_answer(&pr, "Because.", 8);
  kvr_prompt_extend_answer(&pm, "Because.", 8);
  assert_memory_equal(pc.text.data, pr.text.data, pc.text.len);
  assert_memory_equal(pc.text.data, pm.text.data, pc.text.len);
  kvr_prompt_free(&pc);
  kvr_prompt_free(&pr);
  kvr_prompt_free(&pm);
  cJSON_Delete(chat);
  cJSON_Delete(resp);
  cJSON_Delete(msgs);
}

/* A Responses request continuing a stored response carries its id and no blocks (the history is
 * the worker's); a string input is one user message; null model is the base model; reasoning items
 * are left out; Messages needs max_tokens and a model. */
static void test_responses_and_messages_forms(void **state) {
  (void)state;
  kvr_prompt_t p;
  char err[256];
  cJSON *b = parse("{\"model\":null,\"input\":\"" Q1 "\",\"previous_response_id\":\"resp_1\","
                   "\"store\":false,\"max_output_tokens\":5}");
  assert_int_equal(kvr_prompt_from_json(b, KVR_PROMPT_RESPONSES, 16, &p, err, sizeof err), 0);
  assert_string_equal(p.previous_response_id, "resp_1");
  assert_false(p.store);
  assert_int_equal(p.nblocks, 0);
  assert_int_equal(p.max_tokens, 5);
  assert_string_equal(p.model, "");
  kvr_prompt_extend_answer(&p, "x", 1);
  assert_int_equal(p.nblocks, 0);
  kvr_prompt_free(&p);
  cJSON_Delete(b);
  b = parse(
      "{\"model\":\"m\",\"input\":[{\"type\":\"reasoning\",\"summary\":[]},{\"role\":\"user\","
      "\"content\":\"hi\"}]}");
  assert_int_equal(kvr_prompt_from_json(b, KVR_PROMPT_RESPONSES, 16, &p, err, sizeof err), 0);
  assert_true(p.store);
  assert_int_equal(p.text.len, strlen("\x1euser\x1fhi"));
  kvr_prompt_free(&p);
  cJSON_Delete(b);
  static const struct {
    const char *body, *param;
    kvr_prompt_kind_t kind;
  } bad[] = {
      {"{\"model\":\"m\"}", "input", KVR_PROMPT_RESPONSES},
      {"{\"model\":\"m\",\"input\":5}", "input", KVR_PROMPT_RESPONSES},
      {"{\"model\":\"m\",\"input\":[{\"role\":\"user\"}]}", "input[0].content",
       KVR_PROMPT_RESPONSES},
      {"{\"model\":\"m\",\"input\":\"x\",\"previous_response_id\":3}", "previous_response_id",
       KVR_PROMPT_RESPONSES},
      {"{\"model\":\"m\",\"messages\":[]}", "max_tokens", KVR_PROMPT_MESSAGES},
      {"{\"model\":\"m\",\"max_tokens\":0,\"messages\":[]}", "max_tokens", KVR_PROMPT_MESSAGES},
      {"{\"model\":\"\",\"max_tokens\":1,\"messages\":[]}", "model", KVR_PROMPT_MESSAGES},
      {"{\"model\":\"m\",\"max_tokens\":1}", "messages", KVR_PROMPT_MESSAGES},
      {"{\"model\":\"m\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\"}]}",
       "messages[0].content", KVR_PROMPT_MESSAGES},
      {"{\"model\":\"m\",\"max_tokens\":1,\"system\":7,\"messages\":[]}", "system",
       KVR_PROMPT_MESSAGES},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    b = parse(bad[i].body);
    if (kvr_prompt_from_json(b, bad[i].kind, 16, &p, err, sizeof err) != KVR_EINVAL ||
        strcmp(p.err_param, bad[i].param) != 0)
      fail_msg("%s: param '%s', want '%s' (%s)", bad[i].body, p.err_param, bad[i].param, err);
    kvr_prompt_free(&p);
    cJSON_Delete(b);
  }
}

/* Issue 35: cache_salt enters the first block's key as vLLM's does, so salted requests match only
 * their own salt's blocks; Messages has no cache_salt (vLLM drops unknown keys there). */
static void test_cache_salt(void **state) {
  (void)state;
  char body[1024];
  kvr_prompt_t a, b, c, d;
  char err[256];
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s%s\"}", MODEL, SYS, SYS);
  cJSON *plain = parse(body);
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s%s\",\"cache_salt\":\"tenant-a\"}",
           MODEL, SYS, SYS);
  cJSON *sa = parse(body);
  snprintf(body, sizeof body, "{\"model\":\"%s\",\"prompt\":\"%s%s\",\"cache_salt\":\"tenant-b\"}",
           MODEL, SYS, SYS);
  cJSON *sb = parse(body);
  assert_int_equal(kvr_prompt_from_json(plain, KVR_PROMPT_COMPLETIONS, 64, &a, err, sizeof err), 0);
  assert_int_equal(kvr_prompt_from_json(sa, KVR_PROMPT_COMPLETIONS, 64, &b, err, sizeof err), 0);
  assert_int_equal(kvr_prompt_from_json(sb, KVR_PROMPT_COMPLETIONS, 64, &c, err, sizeof err), 0);
  assert_int_equal(kvr_prompt_from_json(sa, KVR_PROMPT_COMPLETIONS, 64, &d, err, sizeof err), 0);
  assert_true(a.nblocks == b.nblocks && b.nblocks == c.nblocks && a.nblocks > 2);
  assert_true(b.salted && !a.salted);
  for (size_t i = 0; i < a.nblocks; i++) {
    assert_true(a.blocks[i] != b.blocks[i]);
    assert_true(b.blocks[i] != c.blocks[i]);
    assert_true(b.blocks[i] == d.blocks[i]); /* the same salt: the same blocks */
  }
  kvr_prompt_free(&a);
  kvr_prompt_free(&b);
  kvr_prompt_free(&c);
  kvr_prompt_free(&d);
  cJSON *empty = parse("{\"model\":\"m\",\"prompt\":\"x\",\"cache_salt\":\"\"}");
  assert_int_equal(kvr_prompt_from_json(empty, KVR_PROMPT_COMPLETIONS, 64, &a, err, sizeof err),
                   KVR_EINVAL);
  assert_string_equal(a.err_param, "cache_salt");
  kvr_prompt_free(&a);
  cJSON_Delete(plain);
  cJSON_Delete(sa);
  cJSON_Delete(sb);
  cJSON_Delete(empty);
}

KVR_TEST_MAIN(cmocka_unit_test(test_golden_chat), cmocka_unit_test(test_golden_completions_block16),
              cmocka_unit_test(test_new_turn_keeps_blocks),
              cmocka_unit_test(test_content_parts_match_string),
              cmocka_unit_test(test_models_never_share), cmocka_unit_test(test_completions_forms),
              cmocka_unit_test(test_errors), cmocka_unit_test(test_route_req_view),
              cmocka_unit_test(test_same_blocks_across_apis),
              cmocka_unit_test(test_responses_and_messages_forms),
              cmocka_unit_test(test_cache_salt))

/* test_sim_tokens.c -- the simulated worker's tokenizer: prefix stability, word/id agreement,
 * chat rendering (with continue_final_message), and the multi-turn property (turn 2 carries turn
 * 1's prompt + answer verbatim, so it shares every full block turn 1 cached) checked through the
 * engine, and token ids as libxxhash's XXH32 gives them (the 4-byte chunks' constant-length call).
 */
#include "base/kvr.h"
#include "bench/sim/sim_engine.h"
#include "bench/sim/sim_tokens.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <xxhash.h>

#include "tests/test_util.h"

static void test_encode_prefix_stable(void **state) {
  const char *a = "The quick brown fox jumps over!!"; /* 32 bytes */
  const char *b = " the lazy dog";
  char ab[128];
  snprintf(ab, sizeof(ab), "%s%s", a, b);
  kvr_sim_toks_t ta = {0}, tab = {0}, again = {0};
  kvr_sim_tokens_encode(a, strlen(a), &ta);
  kvr_sim_tokens_encode(ab, strlen(ab), &tab);
  kvr_sim_tokens_encode(ab, strlen(ab), &again);
  assert_int_equal(ta.n, 8);
  assert_int_equal(tab.n, (strlen(ab) + 3) / 4);
  assert_memory_equal(ta.v, tab.v, ta.n * sizeof(uint32_t));
  assert_memory_equal(tab.v, again.v, tab.n * sizeof(uint32_t));
  for (size_t i = 0; i < tab.n; i++)
    assert_true(tab.v[i] < KVR_SIM_VOCAB);
  /* different text, different ids (almost surely, and certainly for these) */
  assert_int_not_equal(kvr_sim_tokens_id("abcd", 4), kvr_sim_tokens_id("abce", 4));
  kvr_sim_toks_free(&ta);
  kvr_sim_toks_free(&tab);
  kvr_sim_toks_free(&again);
  kvr_sim_toks_free(NULL);
}

static void test_words(void **state) {
  char w[4], w2[4];
  for (uint32_t k = 0; k < 200; k++) {
    kvr_sim_tokens_word(42, k, w);
    kvr_sim_tokens_word(42, k, w2);
    assert_memory_equal(w, w2, 4);
    for (int i = 0; i < 3; i++)
      assert_true(w[i] >= 'a' && w[i] <= 'z');
    assert_int_equal(w[3], ' ');
    assert_int_equal(kvr_sim_tokens_word_id(42, k), kvr_sim_tokens_id(w, 4));
  }
  /* different seeds give different texts */
  int same = 0;
  for (uint32_t k = 0; k < 50; k++) {
    kvr_sim_tokens_word(1, k, w);
    kvr_sim_tokens_word(2, k, w2);
    same += memcmp(w, w2, 4) == 0;
  }
  assert_true(same < 10);
}

static cJSON *msg(const char *role, const char *content) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "role", role);
  cJSON_AddStringToObject(m, "content", content);
  return m;
}

static void render(const cJSON *msgs, kvr_sim_toks_t *out) {
  kvr_buf_t b = KVR_BUF_INIT;
  char err[128];
  assert_int_equal(kvr_sim_tokens_render_chat(msgs, &b, err, sizeof(err)), 0);
  assert_int_equal(b.len % 4, 0);
  kvr_sim_tokens_encode(b.data, b.len, out);
  kvr_buf_free(&b);
}

static void test_render_chat_errors(void **state) {
  kvr_buf_t b = KVR_BUF_INIT;
  char err[128];
  cJSON *empty = cJSON_CreateArray();
  assert_int_equal(kvr_sim_tokens_render_chat(empty, &b, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "messages"));
  cJSON_AddItemToArray(empty, msg("wizard", "hi"));
  assert_int_equal(kvr_sim_tokens_render_chat(empty, &b, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "messages[0].role"));
  cJSON_Delete(empty);
  /* content as an array of text parts renders like the string */
  cJSON *parts = cJSON_Parse("[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"ab\"},"
                             "{\"type\":\"text\",\"text\":\"cd\"}]}]");
  cJSON *plain = cJSON_Parse("[{\"role\":\"user\",\"content\":\"abcd\"}]");
  kvr_sim_toks_t t1 = {0}, t2 = {0};
  render(parts, &t1);
  render(plain, &t2);
  assert_int_equal(t1.n, t2.n);
  assert_memory_equal(t1.v, t2.v, t1.n * sizeof(uint32_t));
  kvr_sim_toks_free(&t1);
  kvr_sim_toks_free(&t2);
  cJSON_Delete(parts);
  cJSON_Delete(plain);
  kvr_buf_free(&b);
}

/* Turn 1 runs through the engine; turn 2 resends its answer as the assistant message. */
static void test_followup_hits_turn1_blocks(void **state) {
  const char *doc = "A long shared document about routing requests to vLLM workers by their "
                    "prefix caches, repeated to fill several blocks of sixteen tokens each. ";
  kvr_buf_t docbuf = KVR_BUF_INIT;
  for (int i = 0; i < 8; i++)
    kvr_buf_puts(&docbuf, doc);
  cJSON *msgs = cJSON_CreateArray();
  cJSON_AddItemToArray(msgs, msg("system", "You are helpful."));
  cJSON_AddItemToArray(msgs, msg("user", docbuf.data));
  kvr_sim_toks_t p1 = {0};
  render(msgs, &p1);

  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  cfg.num_gpu_blocks = 512;
  cfg.retok_drift = 0; /* canonical answers: test_drift_stops_the_hit has the other case */
  kvr_sim_engine_t *eng = kvr_sim_engine_new(&cfg);
  uint64_t seed = kvr_sim_tokens_seed(p1.v, p1.n, 7);
  const uint32_t nout = 37;
  kvr_sim_req_t *r1 =
      kvr_sim_engine_add(eng, p1.v, (uint32_t)p1.n, nout, KVR_SIM_FINISH_STOP, seed, NULL);
  assert_non_null(r1);
  kvr_sim_step_t st;
  for (int i = 0; i < 1000 && r1->state != KVR_SIM_FINISHED; i++)
    kvr_sim_engine_step(eng, &st);
  assert_int_equal(r1->state, KVR_SIM_FINISHED);
  assert_int_equal(r1->ntokens, p1.n + nout);

  /* the answer text, as a client would have assembled it from the stream */
  kvr_buf_t answer = KVR_BUF_INIT;
  for (uint32_t k = 0; k < nout; k++) {
    char w[4];
    kvr_sim_tokens_word(seed, k, w);
    kvr_buf_append(&answer, w, 4);
  }
  cJSON_AddItemToArray(msgs, msg("assistant", answer.data));
  cJSON_AddItemToArray(msgs, msg("user", "Can you elaborate further on that?"));
  kvr_sim_toks_t p2 = {0};
  render(msgs, &p2);
  /* turn 2's prompt starts with turn 1's prompt + answer, token for token */
  assert_true(p2.n > r1->ntokens);
  assert_memory_equal(p2.v, r1->tokens, r1->ntokens * sizeof(uint32_t));

  kvr_sim_req_t *r2 = kvr_sim_engine_add(eng, p2.v, (uint32_t)p2.n, 5, KVR_SIM_FINISH_LENGTH,
                                         kvr_sim_tokens_seed(p2.v, p2.n, 7), NULL);
  /* admitted within a few steps (the API server and async scheduling delay it) */
  for (int i = 0; i < 10 && r2->num_cached < 0; i++)
    kvr_sim_engine_step(eng, &st);
  /* every full block whose KV turn 1 computed (all but its last sampled token) is a hit */
  uint32_t expect = ((r1->ntokens - 1) / cfg.block_size) * cfg.block_size;
  assert_int_equal(r2->num_cached, expect);
  assert_true(expect >= p1.n);

  kvr_sim_engine_remove(eng, r1);
  kvr_sim_engine_remove(eng, r2);
  kvr_sim_engine_free(eng);
  kvr_sim_toks_free(&p1);
  kvr_sim_toks_free(&p2);
  kvr_buf_free(&answer);
  kvr_buf_free(&docbuf);
  cJSON_Delete(msgs);
}

/* continue_final_message ends the render right after the final message's content: a partial
 * assistant answer renders as the prompt with its generation prompt followed by the partial text,
 * so the continued request's ids are the uncut request's prompt ids + the answer's first words;
 * final_content_at is where that content starts (4-byte aligned). Any final role works (vLLM's
 * HF path does no role check). */
static void test_render_continue_final(void **state) {
  (void)state;
  cJSON *msgs = cJSON_Parse("[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                            "{\"role\":\"user\",\"content\":\"Name a river.\"}]");
  kvr_buf_t gen = KVR_BUF_INIT, cont = KVR_BUF_INIT, plain = KVR_BUF_INIT;
  char err[128];
  kvr_sim_render_t r = {.generation_prompt = true};
  assert_int_equal(kvr_sim_tokens_render(msgs, &r, &gen, err, sizeof(err)), 0);
  cJSON *partial = cJSON_CreateObject();
  cJSON_AddStringToObject(partial, "role", "assistant");
  cJSON_AddStringToObject(partial, "content", "tup kow ");
  cJSON_AddItemToArray(msgs, partial);
  kvr_sim_render_t rc = {.continue_final = true};
  assert_int_equal(kvr_sim_tokens_render(msgs, &rc, &cont, err, sizeof(err)), 0);
  assert_int_equal(rc.final_content_at, gen.len);
  assert_int_equal(gen.len % KVR_SIM_TOKEN_BYTES, 0);
  assert_int_equal(cont.len, gen.len + 8);
  assert_memory_equal(cont.data, gen.data, gen.len);
  assert_memory_equal(cont.data + gen.len, "tup kow ", 8);
  /* the same messages without continue_final: the message is closed and padded */
  kvr_sim_render_t rp = {.generation_prompt = false};
  assert_int_equal(kvr_sim_tokens_render(msgs, &rp, &plain, err, sizeof(err)), 0);
  assert_true(plain.len > cont.len && plain.data[cont.len] == '\n');
  /* a final user message is continued too: the render stops after its text */
  kvr_buf_t user = KVR_BUF_INIT;
  cJSON_DeleteItemFromArray(msgs, 2);
  kvr_sim_render_t ru = {.continue_final = true};
  assert_int_equal(kvr_sim_tokens_render(msgs, &ru, &user, err, sizeof(err)), 0);
  assert_int_equal(user.len, ru.final_content_at + strlen("Name a river."));
  assert_memory_equal(user.data + ru.final_content_at, "Name a river.", 13);
  cJSON_Delete(msgs);
  kvr_buf_free(&gen);
  kvr_buf_free(&cont);
  kvr_buf_free(&plain);
  kvr_buf_free(&user);
}

/* Every chunk's id is XXH32 of its bytes (seed 0x6b7672) mod the vocabulary: 4-byte chunks of
 * random bytes, of the words, and shorter ones (a prompt's last). */
static void test_ids_are_xxh32(void **state) {
  (void)state;
  uint64_t rng = 99;
  for (int i = 0; i < 1000000; i++) {
    uint64_t r = kvr_splitmix64(&rng);
    char c[4];
    memcpy(c, &r, sizeof c);
    size_t len = i % 10 == 9 ? (size_t)(r >> 40) % 4 : 4;
    assert_int_equal(kvr_sim_tokens_id(c, len), XXH32(c, len, 0x6b7672u) % KVR_SIM_VOCAB);
  }
  for (uint32_t k = 0; k < 10000; k++) {
    char w[KVR_SIM_TOKEN_BYTES];
    kvr_sim_tokens_word(42, k, w);
    assert_int_equal(kvr_sim_tokens_word_id(42, k), XXH32(w, 4, 0x6b7672u) % KVR_SIM_VOCAB);
  }
}

KVR_TEST_MAIN(cmocka_unit_test(test_encode_prefix_stable), cmocka_unit_test(test_words),
              cmocka_unit_test(test_render_continue_final),
              cmocka_unit_test(test_render_chat_errors),
              cmocka_unit_test(test_followup_hits_turn1_blocks),
              cmocka_unit_test(test_ids_are_xxh32))

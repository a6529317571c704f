/* test_sim_server.c -- the simulated worker's request reading, kvr_sim_server_parse_completion():
 * vLLM's defaults (max_tokens: the room left for chat, 16 for completions), the prompt shapes
 * (chat template and text with BOS first, token ids as they are), null fields ignored, and every
 * 400/404 in vLLM's words, checked in the order vLLM checks them; continue_final_message and its
 * errors, cache_salt, and the continuation property of kvr_sim_server_answer() (an answer cut
 * after k words and continued gives the uncut answer's remaining words). No server, no loop. */
#include "base/buf.h"
#include "bench/sim/sim_server.h"
#include "bench/sim/sim_tokens.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

#define MODEL "meta-llama/Llama-3.3-70B-Instruct"
#define MAX_LEN 4096u
#define BOS 128000u /* Llama-3's <|begin_of_text|> */
#define SHAPE "prompt: must be a string, a list with one string, or a list of token ids"

static int parse(const char *json, bool chat, kvr_sim_completion_t *p, char *err, size_t errlen) {
  cJSON *body = cJSON_Parse(json);
  assert_non_null(body);
  err[0] = '\0';
  int rc = kvr_sim_server_parse_completion(body, chat, MODEL, MAX_LEN, p, err, errlen);
  cJSON_Delete(body);
  return rc;
}

/* Parses json expecting success; the caller frees p->prompt. */
static void parse_ok(const char *json, bool chat, kvr_sim_completion_t *p) {
  char err[512];
  int rc = parse(json, chat, p, err, sizeof(err));
  if (rc != 0)
    fail_msg("%s: %d %s", json, rc, err);
}

static void expect_error(const char *json, bool chat, int status, const char *message) {
  kvr_sim_completion_t p;
  char err[512];
  int rc = parse(json, chat, &p, err, sizeof(err));
  kvr_sim_toks_free(&p.prompt);
  if (rc != status || strcmp(err, message) != 0)
    fail_msg("%s: got %d \"%s\", want %d \"%s\"", json, rc, err, status, message);
}

static void test_chat_defaults(void **state) {
  kvr_sim_completion_t p;
  parse_ok("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}",
           true, &p);
  /* BOS, then the rendered template's tokens */
  cJSON *messages = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hello\"}]");
  kvr_buf_t text = KVR_BUF_INIT;
  char err[128];
  assert_int_equal(kvr_sim_tokens_render_chat(messages, &text, err, sizeof(err)), 0);
  kvr_sim_toks_t want = {0};
  kvr_sim_toks_push(&want, BOS);
  kvr_sim_tokens_encode(text.data, text.len, &want);
  assert_int_equal(p.prompt.n, want.n);
  assert_memory_equal(p.prompt.v, want.v, want.n * sizeof(uint32_t));
  assert_false(p.stream || p.include_usage || p.continuous_usage || p.ignore_eos);
  assert_int_equal(p.max_tokens, (int64_t)(MAX_LEN - p.prompt.n)); /* chat: the room left */
  assert_int_equal(p.min_tokens, 0);
  assert_int_equal(p.seed, 0);
  kvr_sim_toks_free(&p.prompt);
  kvr_sim_toks_free(&want);
  kvr_buf_free(&text);
  cJSON_Delete(messages);
}

static void test_chat_fields(void **state) {
  kvr_sim_completion_t p;
  parse_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":7,"
           "\"max_tokens\":40,\"min_tokens\":3,\"seed\":42,\"ignore_eos\":true,\"stream\":true,"
           "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true}}",
           true, &p);
  assert_int_equal(p.max_tokens, 7); /* max_completion_tokens wins over max_tokens */
  assert_int_equal(p.min_tokens, 3);
  assert_int_equal(p.seed, 42);
  assert_true(p.stream && p.include_usage && p.continuous_usage && p.ignore_eos);
  kvr_sim_toks_free(&p.prompt);
  /* null max_completion_tokens falls back to max_tokens */
  parse_ok("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":null,"
           "\"max_tokens\":40}",
           true, &p);
  assert_int_equal(p.max_tokens, 40);
  kvr_sim_toks_free(&p.prompt);
}

static void test_completions_prompts(void **state) {
  kvr_sim_completion_t p, q;
  kvr_sim_toks_t want = {0};
  kvr_sim_toks_push(&want, BOS);
  kvr_sim_tokens_encode("once upon a time", 16, &want);
  parse_ok("{\"prompt\":\"once upon a time\"}", false, &p);
  assert_int_equal(p.prompt.n, want.n);
  assert_memory_equal(p.prompt.v, want.v, want.n * sizeof(uint32_t));
  assert_int_equal(p.max_tokens, 16); /* completions: vLLM's default */
  /* a list of one string is that string */
  parse_ok("{\"prompt\":[\"once upon a time\"]}", false, &q);
  assert_int_equal(q.prompt.n, want.n);
  assert_memory_equal(q.prompt.v, want.v, want.n * sizeof(uint32_t));
  kvr_sim_toks_free(&p.prompt);
  kvr_sim_toks_free(&q.prompt);
  kvr_sim_toks_free(&want);
  /* token ids are taken as they are, without BOS, up to the vocabulary + 256 */
  parse_ok("{\"prompt\":[5,6,128511],\"max_completion_tokens\":7,\"max_tokens\":40}", false, &p);
  assert_int_equal(p.prompt.n, 3);
  assert_int_equal(p.prompt.v[0], 5);
  assert_int_equal(p.prompt.v[2], 128511);
  assert_int_equal(p.max_tokens, 40); /* completions ignore max_completion_tokens */
  kvr_sim_toks_free(&p.prompt);
  /* null means absent */
  parse_ok("{\"prompt\":\"x\",\"model\":null,\"n\":null,\"seed\":null,\"max_tokens\":null,"
           "\"min_tokens\":null,\"stream\":null,\"stream_options\":null}",
           false, &p);
  assert_int_equal(p.max_tokens, 16);
  assert_false(p.stream);
  kvr_sim_toks_free(&p.prompt);
}

static void test_errors(void **state) {
  static const struct {
    const char *json;
    bool chat;
    int status;
    const char *message;
  } cases[] = {
      {"{\"model\":3}", true, 400, "model: Input should be a valid string"},
      {"{\"model\":\"gpt-9\",\"stream\":1}", true, 404, "The model `gpt-9` does not exist."},
      {"{\"stream\":\"yes\"}", true, 400, "stream: Input should be a valid boolean"},
      {"{\"ignore_eos\":1}", false, 400, "ignore_eos: Input should be a valid boolean"},
      {"{\"stream_options\":[]}", true, 400, "stream_options: Input should be a valid dictionary"},
      {"{\"stream_options\":{}}", true, 400,
       "Stream options can only be defined when `stream=True`."},
      {"{\"stream\":true,\"stream_options\":{\"include_usage\":1}}", true, 400,
       "include_usage: Input should be a valid boolean"},
      {"{\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":\"x\"}}", false, 400,
       "continuous_usage_stats: Input should be a valid boolean"},
      {"{\"n\":2,\"max_tokens\":0}", true, 400, "n: kvrouter sim only supports n=1"},
      {"{\"n\":1.5}", true, 400, "n: Input should be a valid integer"},
      {"{\"max_tokens\":0}", true, 400, "max_tokens must be at least 1, got 0."},
      {"{\"max_completion_tokens\":-3,\"max_tokens\":5}", true, 400,
       "max_tokens must be at least 1, got -3."},
      {"{\"max_completion_tokens\":\"a\"}", true, 400,
       "max_completion_tokens: Input should be a valid integer"},
      {"{\"max_tokens\":2.5}", false, 400, "max_tokens: Input should be a valid integer"},
      {"{\"max_tokens\":1e16}", false, 400, "max_tokens: Input should be a valid integer"},
      {"{\"min_tokens\":-1}", true, 400, "min_tokens must be greater than or equal to 0, got -1."},
      {"{\"min_tokens\":9,\"max_tokens\":5}", false, 400,
       "min_tokens must be less than or equal to max_tokens=5, got 9."},
      {"{\"seed\":\"s\"}", true, 400, "seed: Input should be a valid integer"},
      {"{}", true, 400, "messages: Field required"},
      {"{\"prompt\":\"x\"}", true, 400, "messages: Field required"},
      {"{}", false, 400, "prompt: Field required"},
      {"{\"prompt\":{\"a\":1}}", false, 400, SHAPE},
      {"{\"prompt\":[]}", false, 400, SHAPE},
      {"{\"prompt\":[1,-2]}", false, 400, SHAPE},
      {"{\"prompt\":[1,2.5]}", false, 400, SHAPE},
      {"{\"prompt\":[1,128512]}", false, 400, SHAPE},
      {"{\"prompt\":[\"a\",\"b\"]}", false, 400, SHAPE},
      {"{\"prompt\":\"x\",\"max_tokens\":4095}", false, 400,
       "This model's maximum context length is 4096 tokens. However, you requested 4097 tokens "
       "(2 in the messages, 4095 in the completion). Please reduce the length of the messages or "
       "completion."},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    expect_error(cases[i].json, cases[i].chat, cases[i].status, cases[i].message);
  /* a chat rendering error carries the renderer's message */
  kvr_sim_completion_t p;
  char err[512];
  assert_int_equal(parse("{\"messages\":\"hi\"}", true, &p, err, sizeof(err)), 400);
  assert_non_null(strstr(err, "messages"));
  kvr_sim_toks_free(&p.prompt);
}

/* The prompt must leave room for at least one token; prompt + max_tokens must fit exactly. */
static void test_context_length(void **state) {
  kvr_buf_t json = KVR_BUF_INIT;
  kvr_buf_puts(&json, "{\"prompt\":[1");
  for (uint32_t i = 1; i < MAX_LEN; i++)
    kvr_buf_puts(&json, ",1");
  kvr_buf_puts(&json, "]}");
  expect_error(json.data, false, 400,
               "This model's maximum context length is 4096 tokens. However, your request has "
               "4096 input tokens. Please reduce the length of the input messages.");
  kvr_buf_free(&json);
  kvr_sim_completion_t p;
  parse_ok("{\"prompt\":\"x\",\"max_tokens\":4094}", false, &p); /* BOS + 1 + 4094 = 4096 */
  assert_int_equal(p.prompt.n, 2);
  assert_int_equal(p.max_tokens, 4094);
  kvr_sim_toks_free(&p.prompt);
}

/* kvr_sim_server_answer: max_tokens with ignore_eos (or no natural length), else a natural length
 * in [mean/2, 3 mean/2] drawn from the text seed, raised to min_tokens, capped by max_tokens; the
 * word seed mixes the prompt, the worker's seed and the request's. Pure: same input, same answer.
 */
static void test_answer(void **state) {
  (void)state;
  kvr_sim_completion_t p;
  kvr_sim_answer_t a, b;
  parse_ok("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
           "\"max_tokens\":1000,\"ignore_eos\":true}",
           true, &p);
  kvr_sim_server_answer(&p, 3, 100, &a);
  assert_int_equal(a.max_output, 1000);
  assert_int_equal(a.stop_reason, KVR_SIM_FINISH_LENGTH);
  assert_int_equal(a.gen_seed, kvr_sim_tokens_seed(p.prompt.v, p.prompt.n, 3));
  kvr_sim_server_answer(&p, 3, 100, &b);
  assert_memory_equal(&a, &b, sizeof(a));
  kvr_sim_server_answer(&p, 4, 100, &b);
  assert_true(b.gen_seed != a.gen_seed); /* another worker writes other words */
  /* EOS on, no natural length (mean 0): max_tokens. */
  p.ignore_eos = false;
  kvr_sim_server_answer(&p, 3, 0, &a);
  assert_int_equal(a.max_output, 1000);
  assert_int_equal(a.stop_reason, KVR_SIM_FINISH_LENGTH);
  /* EOS on: the natural length, over many seeds within [50, 150] and not always the same. */
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint64_t seed = 0; seed < 200; seed++) {
    kvr_sim_server_answer(&p, seed, 100, &a);
    assert_int_equal(a.gen_seed, kvr_sim_tokens_seed(p.prompt.v, p.prompt.n, seed));
    assert_true(a.max_output >= 50 && a.max_output <= 150);
    assert_int_equal(a.stop_reason, KVR_SIM_FINISH_STOP);
    lo = a.max_output < lo ? a.max_output : lo;
    hi = a.max_output > hi ? a.max_output : hi;
  }
  assert_true(lo < 70 && hi > 130);
  /* The request's seed changes the words. */
  kvr_sim_server_answer(&p, 3, 100, &a);
  p.seed = 77;
  kvr_sim_server_answer(&p, 3, 100, &b);
  assert_int_equal(b.gen_seed, kvr_sim_tokens_seed(p.prompt.v, p.prompt.n, 3 ^ 77));
  assert_true(b.gen_seed != a.gen_seed);
  /* min_tokens raises it; max_tokens caps it (then it is a length stop). */
  p.min_tokens = 400;
  kvr_sim_server_answer(&p, 3, 100, &a);
  assert_int_equal(a.max_output, 400);
  assert_int_equal(a.stop_reason, KVR_SIM_FINISH_STOP);
  p.min_tokens = 0;
  p.max_tokens = 20;
  kvr_sim_server_answer(&p, 3, 100, &a);
  assert_int_equal(a.max_output, 20);
  assert_int_equal(a.stop_reason, KVR_SIM_FINISH_LENGTH);
  p.max_tokens = 1;
  kvr_sim_server_answer(&p, 3, 100, &a);
  assert_int_equal(a.max_output, 1);
  kvr_sim_toks_free(&p.prompt);
}

static int parse_ex(const char *json, bool chat, kvr_sim_completion_t *p, kvr_sim_err_t *e) {
  cJSON *body = cJSON_Parse(json);
  assert_non_null(body);
  int rc = kvr_sim_server_parse_completion_ex(body, chat, MODEL, MAX_LEN, p, e);
  kvr_sim_toks_free(&p->prompt);
  cJSON_Delete(body);
  return rc;
}

/* The checks vLLM's request models run first (pydantic "before" validators: 400 "Bad Request"),
 * transformers' refusal of continue_final_message with the default add_generation_prompt
 * (BadRequestError), cache_salt, and the 404's param. */
static void test_errors_ex(void **state) {
  (void)state;
  static const struct {
    const char *json;
    bool chat;
    int status;
    const char *type, *param, *needle;
  } cases[] = {
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true,"
       "\"add_generation_prompt\":true,\"model\":\"other\"}",
       true, 400, "Bad Request", "",
       "Cannot set both `continue_final_message` and `add_generation_prompt` to True."},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":true}",
       true, 400, "BadRequestError", "",
       "continue_final_message and add_generation_prompt are not compatible."},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"cache_salt\":\"\"}", true, 400,
       "Bad Request", "cache_salt", "Parameter 'cache_salt' must be a non-empty string"},
      {"{\"prompt\":\"x\",\"cache_salt\":7}", false, 400, "Bad Request", "cache_salt",
       "Parameter 'cache_salt' must be a non-empty string"},
      {"{\"prompt\":\"x\",\"model\":\"other\"}", false, 404, "NotFoundError", "model",
       "The model `other` does not exist."},
      {"{\"prompt\":\"x\",\"echo\":1}", false, 400, "BadRequestError", "",
       "echo: Input should be a valid boolean"},
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"continue_final_message\":\"y\"}",
       true, 400, "BadRequestError", "", "continue_final_message: Input should be a valid boolean"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    kvr_sim_completion_t p;
    kvr_sim_err_t e;
    int rc = parse_ex(cases[i].json, cases[i].chat, &p, &e);
    if (rc != cases[i].status || e.status != rc || strcmp(e.type, cases[i].type) != 0 ||
        strcmp(e.param, cases[i].param) != 0 || strstr(e.message, cases[i].needle) == NULL)
      fail_msg("%s: got %d %s '%s' \"%s\"", cases[i].json, rc, e.type, e.param, e.message);
  }
  /* a salt is borrowed from the body; continue_final_message with add_generation_prompt false is
   * fine; echo is read */
  kvr_sim_completion_t p;
  kvr_sim_err_t e;
  cJSON *body = cJSON_Parse("{\"prompt\":\"x\",\"cache_salt\":\"s\",\"echo\":true}");
  assert_int_equal(kvr_sim_server_parse_completion_ex(body, false, MODEL, MAX_LEN, &p, &e), 0);
  assert_string_equal(p.salt, "s");
  assert_true(p.echo);
  assert_int_equal(p.turn_prefix, 0);
  kvr_sim_toks_free(&p.prompt);
  cJSON_Delete(body);
}

/* A worker answering to several names (--served-model-name, LoRA adapters): any of them is
 * accepted, an adapter's index is in p.lora (-1 for the base model), the --model path or another
 * name is vLLM's 404. */
static void test_model_names(void **state) {
  (void)state;
  static const char *const names[] = {"llama", "chat-small"};
  static const char *const loras[] = {"sql-lora", "fr-lora"};
  kvr_sim_models_t m = {.names = names, .nnames = 2, .loras = loras, .nloras = 2};
  static const struct {
    const char *model;
    int status;
    int32_t lora;
  } cases[] = {{"llama", 0, -1},   {"chat-small", 0, -1}, {"fr-lora", 0, 1},
               {"sql-lora", 0, 0}, {MODEL, 404, -1},      {"Llama", 404, -1}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char json[256];
    snprintf(json, sizeof(json), "{\"prompt\":\"x\",\"model\":\"%s\"}", cases[i].model);
    cJSON *body = cJSON_Parse(json);
    kvr_sim_completion_t p;
    kvr_sim_err_t e;
    int rc = kvr_sim_server_parse_completion_in(body, false, &m, MAX_LEN, &p, &e);
    if (rc != cases[i].status || p.lora != cases[i].lora)
      fail_msg("%s: got %d lora %d (%s)", cases[i].model, rc, (int)p.lora, e.message);
    if (rc == 404)
      assert_string_equal(e.type, "NotFoundError");
    kvr_sim_toks_free(&p.prompt);
    cJSON_Delete(body);
  }
  /* no model: the base model */
  cJSON *body = cJSON_Parse("{\"prompt\":\"x\"}");
  kvr_sim_completion_t p;
  kvr_sim_err_t e;
  assert_int_equal(kvr_sim_server_parse_completion_in(body, false, &m, MAX_LEN, &p, &e), 0);
  assert_int_equal(p.lora, -1);
  kvr_sim_toks_free(&p.prompt);
  cJSON_Delete(body);
}

/* The chat body of messages + (when k > 0) the first k words of answer as a continued final
 * assistant message. */
static void continued_body(kvr_buf_t *b, const char *user, const char *answer, uint32_t k,
                           uint32_t max_tokens) {
  kvr_buf_reset(b);
  kvr_buf_printf(b, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}", user);
  if (k > 0)
    kvr_buf_printf(b,
                   ",{\"role\":\"assistant\",\"content\":\"%.*s\"}],\"continue_final_message\":"
                   "true,\"add_generation_prompt\":false",
                   (int)(k * KVR_SIM_TOKEN_BYTES), answer);
  else
    kvr_buf_puts(b, "]");
  kvr_buf_printf(b, ",\"max_tokens\":%u}", max_tokens);
}

/* Continuation: the uncut answer of a chat prompt, cut after k words and sent back as a final
 * assistant message with continue_final_message, gets the same seed, starts at word k, and
 * stops where the uncut one stopped (natural EOS: the same stop; max_tokens: the rest of it). */
static void test_continuation(void **state) {
  (void)state;
  kvr_buf_t json = KVR_BUF_INIT;
  for (uint64_t seed = 0; seed < 40; seed++) {
    char user[32];
    snprintf(user, sizeof(user), "Question number %llu?", (unsigned long long)seed);
    kvr_sim_completion_t p;
    kvr_sim_answer_t full;
    continued_body(&json, user, NULL, 0, 60);
    parse_ok(json.data, true, &p);
    kvr_sim_server_answer(&p, seed, 30, &full);
    uint32_t prompt_n = (uint32_t)p.prompt.n;
    kvr_sim_toks_free(&p.prompt);
    char answer[60 * KVR_SIM_TOKEN_BYTES + 1];
    for (uint32_t i = 0; i < full.max_output; i++)
      kvr_sim_tokens_word(full.gen_seed, i, answer + i * KVR_SIM_TOKEN_BYTES);
    for (uint32_t k = 1; k < full.max_output; k += 3) {
      kvr_sim_answer_t cont;
      continued_body(&json, user, answer, k, 60);
      parse_ok(json.data, true, &p);
      assert_int_equal(p.gen_offset, k);
      assert_int_equal(p.turn_prefix, prompt_n); /* BOS + everything up to the answer */
      assert_int_equal(p.prompt.n, prompt_n + k);
      kvr_sim_server_answer(&p, seed, 30, &cont);
      assert_true(cont.gen_seed == full.gen_seed);
      assert_int_equal(cont.gen_offset, k);
      assert_int_equal(cont.max_output, full.max_output - k);
      assert_int_equal(cont.stop_reason, full.stop_reason);
      kvr_sim_toks_free(&p.prompt);
      /* a max_tokens stop: asking for the rest of it gives the rest of it */
      continued_body(&json, user, answer, k, 60 - k);
      parse_ok(json.data, true, &p);
      p.ignore_eos = true;
      kvr_sim_server_answer(&p, seed, 30, &cont);
      assert_int_equal(cont.max_output, 60 - k);
      kvr_sim_toks_free(&p.prompt);
    }
  }
  kvr_buf_free(&json);
}

KVR_TEST_MAIN(cmocka_unit_test(test_chat_defaults), cmocka_unit_test(test_chat_fields),
              cmocka_unit_test(test_completions_prompts), cmocka_unit_test(test_errors),
              cmocka_unit_test(test_context_length), cmocka_unit_test(test_answer),
              cmocka_unit_test(test_errors_ex), cmocka_unit_test(test_continuation),
              cmocka_unit_test(test_model_names))

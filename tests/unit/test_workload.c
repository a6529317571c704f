/* test_workload.c -- seeded workloads: determinism, sizes, file loaders and request bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvr.h"
#include "workload.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_rng_deterministic_and_bounded(void **state) {
  (void)state;
  kvr_rng_t a, b;
  kvr_workload_rng_seed(&a, 7);
  kvr_workload_rng_seed(&b, 7);
  for (int i = 0; i < 1000; i++) {
    uint64_t x = kvr_workload_rng_u64(&a);
    assert_int_equal(x, kvr_workload_rng_u64(&b));
    uint64_t r = kvr_workload_rng_range(&a, 3, 9);
    kvr_workload_rng_range(&b, 3, 9);
    assert_true(r >= 3 && r <= 9);
    double u = kvr_workload_rng_unit(&a);
    kvr_workload_rng_unit(&b);
    assert_true(u >= 0 && u < 1);
  }
  assert_int_not_equal(kvr_workload_mix(1, 2), kvr_workload_mix(2, 1));
}

static void test_gamma_mean(void **state) {
  (void)state;
  kvr_rng_t r;
  kvr_workload_rng_seed(&r, 99);
  /* Gamma(shape k, scale 1/(rate*k)) has mean 1/rate for every burstiness k. */
  const double shapes[] = {0.5, 1.0, 4.0};
  for (size_t s = 0; s < 3; s++) {
    double sum = 0;
    const int n = 40000;
    for (int i = 0; i < n; i++)
      sum += kvr_workload_rng_gamma(&r, shapes[s], 1.0 / (2.0 * shapes[s]));
    assert_true(fabs(sum / n - 0.5) < 0.02);
  }
}

static void test_text_length_and_determinism(void **state) {
  (void)state;
  kvr_rng_t r1, r2, r3;
  kvr_workload_rng_seed(&r1, 5);
  kvr_workload_rng_seed(&r2, 5);
  kvr_workload_rng_seed(&r3, 6);
  kvr_buf_t a = KVR_BUF_INIT, b = KVR_BUF_INIT, c = KVR_BUF_INIT;
  kvr_workload_text(&r1, 14000, &a);
  kvr_workload_text(&r2, 14000, &b);
  kvr_workload_text(&r3, 14000, &c);
  assert_true(a.len >= 14000 && a.len < 14300);
  assert_string_equal(a.data, b.data);
  assert_true(memcmp(a.data, c.data, 64) != 0);
  assert_null(strchr(a.data, '"'));
  kvr_buf_free(&a);
  kvr_buf_free(&b);
  kvr_buf_free(&c);
}

static void test_multiturn_shape(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  assert_non_null(wl);
  assert_string_equal(kvr_workload_name(wl), "multiturn");
  double out_sum = 0;
  size_t nout = 0;
  const char *starter_of[10] = {0};
  for (uint64_t k = 0; k < 400; k++) {
    kvr_conv_t c, d;
    kvr_workload_conv(wl, 123, k, &c);
    kvr_workload_conv(wl, 123, k, &d);
    assert_int_equal(c.nturns, 5);
    assert_true(c.group >= 0 && c.group < 10);
    size_t plen = strlen(c.prefix);
    assert_true(plen >= 3500 * 4 && plen < 4000 * 4 + 400);
    /* The same group always means the very same starter text. */
    if (starter_of[c.group] == NULL)
      starter_of[c.group] = c.prefix;
    assert_ptr_equal(starter_of[c.group], c.prefix);
    assert_true(c.turns[0].think_s == 0.0);
    for (uint32_t t = 0; t < c.nturns; t++) {
      assert_string_equal(c.turns[t].user, d.turns[t].user);
      assert_int_equal(c.turns[t].max_tokens, d.turns[t].max_tokens);
      assert_true(c.turns[t].max_tokens >= o.out_min && c.turns[t].max_tokens <= o.out_max);
      assert_true(strlen(c.turns[t].user) < 100);
      out_sum += c.turns[t].max_tokens;
      nout++;
    }
    kvr_workload_conv_free(&c);
    kvr_workload_conv_free(&d);
  }
  assert_true(fabs(out_sum / (double)nout - 830) < 30);
  /* Another level seed gives other conversations over the same starters. */
  kvr_conv_t a, b;
  int differ = 0;
  for (uint64_t k = 0; k < 20; k++) {
    kvr_workload_conv(wl, 1, k, &a);
    kvr_workload_conv(wl, 2, k, &b);
    differ += a.group != b.group || a.turns[0].max_tokens != b.turns[0].max_tokens;
    kvr_workload_conv_free(&a);
    kvr_workload_conv_free(&b);
  }
  assert_true(differ > 10);
  kvr_workload_free(wl);
}

/* Replay mode (the default) pre-builds each turn's answer at its max_tokens, deterministically, and
 * leaves every other draw as in session mode; the body of turn t carries answers 1..t-1. */
static void test_multiturn_replay_answers(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_true(o.replay);
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  assert_non_null(wl);
  kvr_workload_opts_t os = o;
  assert_int_equal(kvr_workload_parse_mode("session", &os), 0);
  assert_false(os.replay);
  assert_int_equal(kvr_workload_parse_mode("bogus", &os), KVR_EINVAL);
  kvr_workload_t *ws = kvr_workload_new(&os, err, sizeof(err));
  assert_non_null(ws);
  for (uint64_t k = 0; k < 20; k++) {
    kvr_conv_t c, d, e;
    kvr_workload_conv(wl, 7, k, &c);
    kvr_workload_conv(wl, 7, k, &d);
    kvr_workload_conv(ws, 7, k, &e);
    assert_int_equal(c.group, e.group);
    for (uint32_t t = 0; t < c.nturns; t++) {
      assert_string_equal(c.turns[t].user, e.turns[t].user);
      assert_int_equal(c.turns[t].max_tokens, e.turns[t].max_tokens);
      assert_null(e.turns[t].answer);
      if (t + 1 == c.nturns) {
        assert_null(c.turns[t].answer); /* never resent */
        continue;
      }
      assert_non_null(c.turns[t].answer);
      assert_string_equal(c.turns[t].answer, d.turns[t].answer);
      size_t want = (size_t)c.turns[t].max_tokens * KVR_WORKLOAD_CHARS_PER_TOKEN;
      assert_true(strlen(c.turns[t].answer) >= want && strlen(c.turns[t].answer) < want + 200);
    }
    if (k == 0) {
      const char *answers[5];
      for (uint32_t t = 0; t < 5; t++)
        answers[t] = c.turns[t].answer;
      kvr_buf_t body = KVR_BUF_INIT;
      kvr_workload_body(&c, 3, answers, "m", KVR_API_CHAT, true, &body);
      cJSON *j = cJSON_Parse(body.data);
      assert_non_null(j);
      const cJSON *msgs = cJSON_GetObjectItem(j, "messages");
      assert_int_equal(cJSON_GetArraySize(msgs), 7);
      assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 5), "content")->valuestring,
                          c.turns[2].answer);
      cJSON_Delete(j);
      kvr_buf_free(&body);
    }
    kvr_workload_conv_free(&c);
    kvr_workload_conv_free(&d);
    kvr_workload_conv_free(&e);
  }
  kvr_workload_free(wl);
  kvr_workload_free(ws);
}

static void test_documents_exceed_one_worker(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_DOCUMENTS;
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  assert_non_null(wl);
  /* Distinct documents: ~150 x 3,750 tokens > the ~348k tokens one H200 worker caches. */
  size_t total_chars = 0;
  int seen[150] = {0};
  for (uint64_t k = 0; k < 3000; k++) {
    kvr_conv_t c;
    kvr_workload_conv(wl, 9, k, &c);
    assert_int_equal(c.nturns, 1);
    assert_true(c.group >= 0 && c.group < 150);
    if (!seen[c.group]) {
      seen[c.group] = 1;
      total_chars += strlen(c.prefix);
    }
    kvr_workload_conv_free(&c);
  }
  assert_true(total_chars / 4 > 348000);
  kvr_workload_free(wl);
}

static void test_control_never_shares(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_kind("control", &o), 0);
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  assert_non_null(wl);
  kvr_conv_t c[8];
  for (int i = 0; i < 8; i++) {
    kvr_workload_conv(wl, 3, (uint64_t)i, &c[i]);
    assert_int_equal(c[i].group, -1);
    assert_true(strlen(c[i].prefix) >= 3500 * 4);
  }
  for (int i = 0; i < 8; i++)
    for (int j = i + 1; j < 8; j++)
      assert_true(memcmp(c[i].prefix, c[j].prefix, 32) != 0);
  for (int i = 0; i < 8; i++)
    kvr_workload_conv_free(&c[i]);
  kvr_workload_free(wl);
}

static void test_chat_body_resends_history(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  kvr_conv_t c;
  kvr_workload_conv(wl, 1, 0, &c);
  const char *answers[] = {"first \"answer\"\n", "second answer"};
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_workload_body(&c, 2, answers, "m1", KVR_API_CHAT, true, &body);
  cJSON *j = cJSON_Parse(body.data);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "m1");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "stream")));
  assert_true(cJSON_IsTrue(
      cJSON_GetObjectItem(cJSON_GetObjectItem(j, "stream_options"), "include_usage")));
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "ignore_eos")));
  assert_int_equal(cJSON_GetObjectItem(j, "max_tokens")->valueint, c.turns[2].max_tokens);
  cJSON *msgs = cJSON_GetObjectItem(j, "messages");
  assert_int_equal(cJSON_GetArraySize(msgs), 5);
  const char *u0 = cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 0), "content")->valuestring;
  assert_memory_equal(u0, c.prefix, strlen(c.prefix));
  assert_string_equal(u0 + strlen(c.prefix) + 2, c.turns[0].user);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 1), "role")->valuestring,
                      "assistant");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 1), "content")->valuestring,
                      answers[0]);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 3), "content")->valuestring,
                      answers[1]);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 4), "content")->valuestring,
                      c.turns[2].user);
  cJSON_Delete(j);

  kvr_workload_body(&c, 1, answers, "m1", KVR_API_COMPLETIONS, false, &body);
  j = cJSON_Parse(body.data);
  assert_non_null(j);
  assert_null(cJSON_GetObjectItem(j, "messages"));
  assert_null(cJSON_GetObjectItem(j, "ignore_eos"));
  const char *prompt = cJSON_GetObjectItem(j, "prompt")->valuestring;
  assert_non_null(strstr(prompt, answers[0]));
  assert_non_null(strstr(prompt, c.turns[1].user));
  cJSON_Delete(j);
  kvr_buf_free(&body);
  kvr_workload_conv_free(&c);
  kvr_workload_free(wl);
}

static char *write_tmp(const char *text) {
  char *path = strdup("/tmp/kvr_wl_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

static void test_file_jsonl(void **state) {
  (void)state;
  char *path = write_tmp(
      "{\"system\":\"be brief\",\"turns\":[{\"user\":\"hi\",\"max_tokens\":7},"
      "{\"user\":\"more\",\"think_s\":2.5}]}\n\n"
      "{\"prefix\":\"DOC\",\"turns\":[{\"user\":\"q\"}]}\n");
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  char spec[128];
  snprintf(spec, sizeof(spec), "file:%s", path);
  assert_int_equal(kvr_workload_parse_kind(spec, &o), 0);
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  assert_non_null(wl);
  assert_int_equal(kvr_workload_file_size(wl), 2);
  int found = 0;
  for (uint64_t k = 0; k < 2; k++) {
    kvr_conv_t c;
    kvr_workload_conv(wl, 5, k, &c);
    if (c.nturns == 2) {
      found |= 1;
      assert_string_equal(c.system, "be brief");
      assert_int_equal(c.turns[0].max_tokens, 7);
      assert_int_equal(c.turns[1].max_tokens, 830);
      assert_true(c.turns[1].think_s == 2.5);
    } else {
      found |= 2;
      assert_string_equal(c.prefix, "DOC");
    }
    kvr_workload_conv_free(&c);
  }
  assert_int_equal(found, 3);
  kvr_workload_free(wl);
  unlink(path);
  free(path);

  path = write_tmp("{\"turns\":[{\"user\":\"ok\"}]}\n{\"turns\":[{\"user\":5}]}\n");
  snprintf(spec, sizeof(spec), "file:%s", path);
  kvr_workload_parse_kind(spec, &o);
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, ":2: turns[0]"));
  unlink(path);
  free(path);
}

static void test_file_sharegpt(void **state) {
  (void)state;
  char *path = write_tmp(
      "[{\"id\":\"a\",\"conversations\":[{\"from\":\"human\",\"value\":\"hello\"},"
      "{\"from\":\"gpt\",\"value\":\"0123456789012345678901234567890123456789\"},"
      "{\"from\":\"human\",\"value\":\"again\"}]},"
      "{\"id\":\"empty\",\"conversations\":[{\"from\":\"gpt\",\"value\":\"x\"}]}]");
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_FILE;
  o.path = path;
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  assert_non_null(wl);
  assert_int_equal(kvr_workload_file_size(wl), 1);
  kvr_conv_t c;
  kvr_workload_conv(wl, 1, 0, &c);
  assert_int_equal(c.nturns, 2);
  assert_string_equal(c.turns[0].user, "hello");
  assert_int_equal(c.turns[0].max_tokens, 10); /* 40 chars / 4 */
  kvr_workload_conv_free(&c);
  kvr_workload_free(wl);
  unlink(path);
  free(path);

  o.path = "/nonexistent/kvr.json";
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "/nonexistent/kvr.json"));
  assert_int_equal(kvr_workload_parse_kind("bogus", &o), KVR_EINVAL);
  assert_int_equal(kvr_workload_parse_kind("file:", &o), KVR_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rng_deterministic_and_bounded),
      cmocka_unit_test(test_gamma_mean),
      cmocka_unit_test(test_text_length_and_determinism),
      cmocka_unit_test(test_multiturn_shape),
      cmocka_unit_test(test_multiturn_replay_answers),
      cmocka_unit_test(test_documents_exceed_one_worker),
      cmocka_unit_test(test_control_never_shares),
      cmocka_unit_test(test_chat_body_resends_history),
      cmocka_unit_test(test_file_jsonl),
      cmocka_unit_test(test_file_sharegpt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_workload.c -- seeded workloads: determinism, sizes, file loaders and request bodies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/loadgen/workload.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* a and b have the same starter group, and every turn the same user text and max_tokens. */
static void assert_same_prompts(const kvr_conv_t *a, const kvr_conv_t *b) {
  assert_int_equal(a->group, b->group);
  for (uint32_t t = 0; t < a->nturns; t++) {
    assert_string_equal(a->turns[t].user, b->turns[t].user);
    assert_int_equal(a->turns[t].max_tokens, b->turns[t].max_tokens);
  }
}

/* kvr_workload_new(o), asserted to succeed. */
static kvr_workload_t *new_workload(const kvr_workload_opts_t *o) {
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(o, err, sizeof(err));
  assert_non_null(wl);
  return wl;
}

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
  kvr_workload_t *wl = new_workload(&o);
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
  kvr_workload_t *wl = new_workload(&o);
  kvr_workload_opts_t os = o;
  assert_int_equal(kvr_workload_parse_mode("session", &os), 0);
  assert_false(os.replay);
  assert_int_equal(kvr_workload_parse_mode("bogus", &os), KVR_EINVAL);
  kvr_workload_t *ws = new_workload(&os);
  for (uint64_t k = 0; k < 20; k++) {
    kvr_conv_t c, d, e;
    kvr_workload_conv(wl, 7, k, &c);
    kvr_workload_conv(wl, 7, k, &d);
    kvr_workload_conv(ws, 7, k, &e);
    assert_same_prompts(&c, &e);
    for (uint32_t t = 0; t < c.nturns; t++) {
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
  kvr_workload_t *wl = new_workload(&o);
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
  kvr_workload_t *wl = new_workload(&o);
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
  kvr_workload_t *wl = new_workload(&o);
  kvr_conv_t c;
  kvr_workload_conv(wl, 1, 0, &c);
  const char *answers[] = {"first \"answer\"\n", "second answer"};
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_workload_body(&c, 2, answers, "m1", KVR_API_CHAT, true, &body);
  cJSON *j = cJSON_Parse(body.data);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "m1");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "stream")));
  assert_true(
      cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "stream_options"), "include_usage")));
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
  char *path = write_tmp("{\"system\":\"be brief\",\"turns\":[{\"user\":\"hi\",\"max_tokens\":7},"
                         "{\"user\":\"more\",\"think_s\":2.5}]}\n\n"
                         "{\"prefix\":\"DOC\",\"turns\":[{\"user\":\"q\"}]}\n");
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  char spec[128];
  snprintf(spec, sizeof(spec), "file:%s", path);
  assert_int_equal(kvr_workload_parse_kind(spec, &o), 0);
  kvr_workload_t *wl = new_workload(&o);
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

  char err[256];
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
  char *path =
      write_tmp("[{\"id\":\"a\",\"conversations\":[{\"from\":\"human\",\"value\":\"hello\"},"
                "{\"from\":\"gpt\",\"value\":\"0123456789012345678901234567890123456789\"},"
                "{\"from\":\"human\",\"value\":\"again\"}]},"
                "{\"id\":\"empty\",\"conversations\":[{\"from\":\"gpt\",\"value\":\"x\"}]}]");
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_FILE;
  o.path = path;
  kvr_workload_t *wl = new_workload(&o);
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

  char err[256];
  o.path = "/nonexistent/kvr.json";
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "/nonexistent/kvr.json"));
  assert_int_equal(kvr_workload_parse_kind("bogus", &o), KVR_EINVAL);
  assert_int_equal(kvr_workload_parse_kind("file:", &o), KVR_EINVAL);
}

/* ---- replay sample order, fixed dataset, answer lengths (--replay-order, --replay-dataset,
 * --answer-mean/--answer-std) ---------------------------------------------------------------- */

static kvr_workload_t *sample_workload(unsigned dataset, unsigned turns) {
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_order("sample", &o), 0);
  o.replay_dataset = dataset;
  o.turns = turns;
  kvr_workload_t *wl = new_workload(&o);
  return wl;
}

/* With a dataset of N conversations, every pass of N*turns consecutive arrivals sends each
 * (conversation, turn) prompt exactly once; the order is a pure function of (level seed, k). */
static void test_sample_slot_dataset_passes_are_permutations(void **state) {
  (void)state;
  const unsigned shapes[][2] = {{50, 5}, {7, 5}, {1, 5}, {1, 1}, {6, 4}, {13, 1}, {3, 64}};
  for (size_t s = 0; s < KVR_ARRAY_SIZE(shapes); s++) {
    unsigned n = shapes[s][0], turns = shapes[s][1];
    kvr_workload_t *wl = sample_workload(n, turns);
    uint64_t d = (uint64_t)n * turns;
    unsigned char *seen = calloc(d, 1);
    assert_non_null(seen);
    const uint64_t level_seeds[] = {1, 0xFEEDull, UINT64_MAX};
    for (size_t ls = 0; ls < KVR_ARRAY_SIZE(level_seeds); ls++) {
      for (uint64_t pass = 0; pass < 4; pass++) {
        memset(seen, 0, d);
        for (uint64_t j = 0; j < d; j++) {
          uint64_t k = pass * d + j, conv = UINT64_MAX, conv2 = UINT64_MAX;
          uint32_t turn = UINT32_MAX, turn2 = UINT32_MAX;
          kvr_workload_sample_slot(wl, level_seeds[ls], k, &conv, &turn);
          kvr_workload_sample_slot(wl, level_seeds[ls], k, &conv2, &turn2);
          assert_true(conv == conv2 && turn == turn2); /* pure */
          assert_true(conv < n);
          assert_true(turn < turns);
          seen[conv * turns + turn]++;
        }
        for (uint64_t p = 0; p < d; p++)
          assert_int_equal(seen[p], 1);
      }
    }
    free(seen);
    kvr_workload_free(wl);
  }
}

/* Sequence of prompts (conv * turns + turn) of arrivals [from, from + n) at a level seed. */
static void sample_prompts(const kvr_workload_t *wl, uint64_t level_seed, uint64_t from, size_t n,
                           uint64_t *out) {
  unsigned turns = kvr_workload_opts(wl)->turns;
  for (size_t j = 0; j < n; j++) {
    uint64_t conv;
    uint32_t turn;
    kvr_workload_sample_slot(wl, level_seed, from + j, &conv, &turn);
    out[j] = conv * turns + turn;
  }
}

static void test_sample_slot_dataset_orders_differ(void **state) {
  (void)state;
  kvr_workload_t *wl = sample_workload(50, 5);
  enum { D = 250 };
  uint64_t a[D], b[D], c[D], again[D];
  sample_prompts(wl, 11, 0, D, a);
  sample_prompts(wl, 12, 0, D, b);
  sample_prompts(wl, 11, D, D, c); /* level 11, second pass */
  sample_prompts(wl, 11, 0, D, again);
  assert_memory_equal(a, again, sizeof(a));
  size_t diff_level = 0, diff_pass = 0;
  for (size_t j = 0; j < D; j++) {
    diff_level += a[j] != b[j];
    diff_pass += a[j] != c[j];
  }
  /* Another level, or another pass of the same level, is another order (not just a shift of a
   * few positions). */
  assert_true(diff_level > D / 2);
  assert_true(diff_pass > D / 2);
  kvr_workload_free(wl);
}

/* A shuffled dataset (what `vllm bench serve` sends) has no fixed stride. Three consequences,
 * each of which a random order has with overwhelming probability:
 * - the number of arrivals between turn 0 and turn 1 of a conversation varies between
 *   conversations (a constant gap g sends, under round-robin over W workers, every follow-up to the
 *   previous turn's worker when g % W == 0, and never otherwise);
 * - with turns == W == 4, round-robin worker 0 receives every turn, not one fixed turn;
 * - the share of same-conversation turn pairs that round-robin over 4 workers puts on one worker
 *   (the pairs whose shared prefix is a cache hit) is ~1/4 at every level, not a level's accident.
 * KNOWN FAILURE (reported to the lead): the affine order j -> (a*j + b) mod D has all three
 * defects. */
static void test_sample_slot_dataset_order_has_no_stride(void **state) {
  (void)state;
  enum { N = 50, T = 4, D = N * T };
  kvr_workload_t *wl = sample_workload(N, T);
  for (uint64_t level = 3; level < 7; level++) {
    uint64_t prompts[D];
    sample_prompts(wl, level, 0, D, prompts);
    int64_t pos[D];
    for (size_t j = 0; j < D; j++)
      pos[prompts[j]] = (int64_t)j;
    int64_t gaps[N];
    size_t ngaps = 0;
    for (size_t cv = 0; cv < N; cv++) {
      int64_t g = pos[cv * T + 1] - pos[cv * T];
      size_t i = 0;
      while (i < ngaps && gaps[i] != g)
        i++;
      if (i == ngaps)
        gaps[ngaps++] = g;
    }
    unsigned turns_at_w0 = 0; /* arrivals j with j % 4 == 0 */
    for (size_t j = 0; j < D; j += 4)
      turns_at_w0 |= 1u << (prompts[j] % T);
    print_message("level %llu: %zu distinct turn-0-to-1 gaps over %d conversations, worker-0 "
                  "turns 0x%x\n",
                  (unsigned long long)level, ngaps, N, turns_at_w0);
    assert_true(ngaps > 10);
    assert_int_equal(turns_at_w0, (1u << T) - 1);
  }
  kvr_workload_free(wl);

  enum { N2 = 201, T2 = 5, D2 = N2 * T2 };
  wl = sample_workload(N2, T2);
  int64_t *pos = malloc(D2 * sizeof(*pos));
  assert_non_null(pos);
  for (uint64_t level = 1; level <= 6; level++) {
    for (uint64_t j = 0; j < D2; j++) {
      uint64_t cv;
      uint32_t turn;
      kvr_workload_sample_slot(wl, level, j, &cv, &turn);
      pos[cv * T2 + turn] = (int64_t)j;
    }
    unsigned same = 0, pairs = 0;
    for (size_t cv = 0; cv < N2; cv++)
      for (size_t t = 0; t < T2; t++)
        for (size_t u = t + 1; u < T2; u++, pairs++)
          same += (pos[cv * T2 + t] - pos[cv * T2 + u]) % 4 == 0;
    print_message("level %llu: %u of %u same-conversation turn pairs on one round-robin worker "
                  "(random order: ~1/4)\n",
                  (unsigned long long)level, same, pairs);
    assert_true(same > pairs * 0.18 && same < pairs * 0.32);
  }
  free(pos);
  kvr_workload_free(wl);
}

/* replay_dataset = 0: arrival k opens conversation k (a fresh one), a seeded uniform turn. */
static void test_sample_slot_fresh_conversations(void **state) {
  (void)state;
  kvr_workload_t *wl = sample_workload(0, 5);
  unsigned count[5] = {0};
  size_t differ = 0;
  for (uint64_t k = 0; k < 1000; k++) {
    uint64_t conv, conv2, conv3;
    uint32_t turn, turn2, turn3;
    kvr_workload_sample_slot(wl, 77, k, &conv, &turn);
    kvr_workload_sample_slot(wl, 77, k, &conv2, &turn2);
    kvr_workload_sample_slot(wl, 78, k, &conv3, &turn3);
    assert_true(conv == k && conv2 == k && conv3 == k);
    assert_int_equal(turn, turn2);
    assert_true(turn < 5);
    count[turn]++;
    differ += turn != turn3;
  }
  for (unsigned t = 0; t < 5; t++) {
    print_message("turn %u: %u of 1000\n", t, count[t]);
    assert_true(count[t] > 100 && count[t] < 400); /* expected 200 each */
  }
  /* Another level draws other turns (independent draws would differ 4 times in 5). */
  assert_true(differ > 600);
  /* The conversations are not a dataset: the same as blocks order builds, new at every level. */
  kvr_workload_opts_t ob = *kvr_workload_opts(wl);
  assert_int_equal(kvr_workload_parse_order("blocks", &ob), 0);
  kvr_workload_t *blocks = new_workload(&ob);
  size_t other_level = 0;
  for (uint64_t k = 0; k < 20; k++) {
    kvr_conv_t a, b, c;
    kvr_workload_conv(wl, 5, k, &a);
    kvr_workload_conv(blocks, 5, k, &b);
    kvr_workload_conv(wl, 6, k, &c);
    assert_int_equal(a.id, k);
    assert_int_equal(a.group, b.group);
    for (uint32_t t = 0; t < a.nturns; t++) {
      assert_string_equal(a.turns[t].user, b.turns[t].user);
      assert_int_equal(a.turns[t].max_tokens, b.turns[t].max_tokens);
      if (a.turns[t].answer)
        assert_string_equal(a.turns[t].answer, b.turns[t].answer);
    }
    other_level += strcmp(a.turns[0].answer, c.turns[0].answer) != 0;
    kvr_workload_conv_free(&a);
    kvr_workload_conv_free(&b);
    kvr_workload_conv_free(&c);
  }
  assert_int_equal(other_level, 20);
  kvr_workload_free(blocks);
  kvr_workload_free(wl);
}

static void assert_conv_equal(const kvr_conv_t *a, const kvr_conv_t *b) {
  assert_int_equal(a->group, b->group);
  assert_ptr_equal(a->prefix, b->prefix);
  assert_int_equal(a->nturns, b->nturns);
  for (uint32_t t = 0; t < a->nturns; t++) {
    assert_string_equal(a->turns[t].user, b->turns[t].user);
    assert_int_equal(a->turns[t].max_tokens, b->turns[t].max_tokens);
    assert_true(a->turns[t].think_s == b->turns[t].think_s);
    assert_true((a->turns[t].answer == NULL) == (b->turns[t].answer == NULL));
    if (a->turns[t].answer)
      assert_string_equal(a->turns[t].answer, b->turns[t].answer);
  }
}

/* Dataset mode: the conversation built for arrival k is dataset entry sample_slot(k).conv, the same
 * at every level and in every pass; different entries are different conversations. */
static void test_dataset_conversations_same_at_every_level(void **state) {
  (void)state;
  enum { N = 12, T = 5, D = N * T };
  kvr_workload_t *wl = sample_workload(N, T);
  const uint64_t levels[] = {100, 200};
  /* For each level and dataset entry, the first arrival (over two passes) that maps to it. */
  uint64_t first[2][N];
  for (size_t l = 0; l < 2; l++)
    for (size_t c = 0; c < N; c++)
      first[l][c] = UINT64_MAX;
  kvr_conv_t ref[N];
  for (size_t l = 0; l < 2; l++) {
    for (uint64_t k = 0; k < 2 * D; k++) {
      uint64_t c;
      uint32_t turn;
      kvr_workload_sample_slot(wl, levels[l], k, &c, &turn);
      kvr_conv_t cv;
      kvr_workload_conv(wl, levels[l], k, &cv);
      assert_int_equal(cv.id, k); /* the arrival, as the loadgen counts it */
      assert_int_equal(cv.nturns, T);
      assert_true(turn < cv.nturns);
      if (l == 0 && first[0][c] == UINT64_MAX) {
        ref[c] = cv; /* kept: the dataset entry as level 100 first saw it */
        first[0][c] = k;
        continue;
      }
      if (first[l][c] == UINT64_MAX)
        first[l][c] = k;
      assert_conv_equal(&cv, &ref[c]);
      kvr_workload_conv_free(&cv);
    }
  }
  for (size_t c = 0; c < N; c++)
    assert_true(first[0][c] != UINT64_MAX && first[1][c] != UINT64_MAX);
  /* The two levels reach the entries through different arrivals. */
  size_t moved = 0;
  for (size_t c = 0; c < N; c++)
    moved += first[0][c] != first[1][c];
  assert_true(moved > N / 2);
  /* Distinct entries are distinct conversations (their pre-built answers are unique text). */
  for (size_t i = 0; i < N; i++)
    for (size_t j = i + 1; j < N; j++)
      assert_true(strcmp(ref[i].turns[0].answer, ref[j].turns[0].answer) != 0);
  /* Another workload seed is another dataset. */
  kvr_workload_opts_t o2 = *kvr_workload_opts(wl);
  o2.seed = 43;
  kvr_workload_t *wl2 = new_workload(&o2);
  kvr_conv_t other;
  kvr_workload_conv(wl2, levels[0], first[0][0], &other);
  assert_true(strcmp(other.turns[0].answer, ref[0].turns[0].answer) != 0);
  kvr_workload_conv_free(&other);
  kvr_workload_free(wl2);
  for (size_t c = 0; c < N; c++)
    kvr_workload_conv_free(&ref[c]);
  kvr_workload_free(wl);
}

/* Tokens of a pre-built answer as the simulator counts them (4 characters per token). Text comes
 * in whole sentences, never shorter than asked: the asked length is in (tokens - 60, tokens]. */
static double answer_tokens(const char *a) {
  return (double)strlen(a) / KVR_WORKLOAD_CHARS_PER_TOKEN;
}

#define SENTENCE_TOKENS 60.0 /* at most one sentence of 20 words over the asked length */

static void test_answer_mean_std(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.answer_mean = 1500;
  o.answer_std = 300;
  o.out_min = 64;
  o.out_max = 4096;
  kvr_workload_t *wl = new_workload(&o);
  kvr_workload_opts_t od = o;
  od.answer_mean = od.answer_std = 0;
  kvr_workload_t *wd = new_workload(&od);
  double sum = 0, sum2 = 0, mt_sum = 0, cross = 0;
  size_t n = 0;
  for (uint64_t k = 0; k < 300; k++) {
    kvr_conv_t c, d;
    kvr_workload_conv(wl, 9, k, &c);
    kvr_workload_conv(wd, 9, k, &d);
    /* Only the answers change: starter, user turns and max_tokens are the default workload's. */
    assert_same_prompts(&c, &d);
    for (uint32_t t = 0; t < c.nturns; t++) {
      if (t + 1 == c.nturns) {
        assert_null(c.turns[t].answer);
        continue;
      }
      double x = answer_tokens(c.turns[t].answer);
      assert_true(x >= o.out_min && x < o.out_max + SENTENCE_TOKENS);
      sum += x;
      sum2 += x * x;
      mt_sum += c.turns[t].max_tokens;
      cross += x * c.turns[t].max_tokens;
      n++;
    }
    kvr_workload_conv_free(&c);
    kvr_workload_conv_free(&d);
  }
  double mean = sum / (double)n, sd = sqrt(sum2 / (double)n - mean * mean);
  double mt_mean = mt_sum / (double)n;
  double cov = cross / (double)n - mean * mt_mean;
  print_message("answers: n %zu mean %.1f sd %.1f tokens (asked normal(1500, 300)); max_tokens "
                "mean %.1f; covariance %.1f\n",
                n, mean, sd, mt_mean, cov);
  /* n = 1200: the sample mean's standard error is ~9 tokens; the sentence overshoot adds < 30. */
  assert_true(mean > 1500 - 40 && mean < 1500 + 30 + 40);
  assert_true(sd > 300 * 0.9 && sd < 300 * 1.1);
  /* Independent of max_tokens (~830 tokens): the mean is not pulled towards it, and the correlation
   * with it is small. */
  assert_true(fabs(mt_mean - 830) < 40);
  assert_true(fabs(cov / (sd * 300)) < 0.15);
  kvr_workload_free(wl);
  kvr_workload_free(wd);
}

/* std 0: every answer is exactly answer_mean tokens (up to the end of the last sentence); answers
 * outside [out_min, out_max] are clipped; answer_mean 0 keeps each turn's max_tokens. */
static void test_answer_fixed_and_clipped(void **state) {
  (void)state;
  struct {
    double mean, std;
    unsigned out_min, out_max;
    double want; /* 0: max_tokens of the turn */
  } cases[] = {
      {300, 0, 64, 2048, 300}, {5000, 0, 64, 2048, 2048}, {5000, 500, 64, 2048, 2048},
      {1, 0, 64, 2048, 64},    {1, 500, 100, 2048, -1},   {0, 0, 64, 2048, 0},
      {0, 500, 64, 2048, 0},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cases); i++) {
    kvr_workload_opts_t o;
    kvr_workload_opts_default(&o);
    o.answer_mean = cases[i].mean;
    o.answer_std = cases[i].std;
    o.out_min = cases[i].out_min;
    o.out_max = cases[i].out_max;
    char err[256];
    kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
    assert_non_null(wl);
    size_t at_min = 0, n = 0;
    for (uint64_t k = 0; k < 40; k++) {
      kvr_conv_t c;
      kvr_workload_conv(wl, 1, k, &c);
      for (uint32_t t = 0; t + 1 < c.nturns; t++, n++) {
        double x = answer_tokens(c.turns[t].answer);
        double want = cases[i].want == 0 ? c.turns[t].max_tokens : cases[i].want;
        if (cases[i].want < 0) {
          /* normal(1, 500) clipped below at 100: about half the draws land on the clip. */
          assert_true(x >= o.out_min);
          at_min += x < o.out_min + SENTENCE_TOKENS;
          continue;
        }
        if (!(x >= want && x < want + SENTENCE_TOKENS))
          print_message("case %zu conv %llu turn %u: %.1f tokens, want %.0f\n", i,
                        (unsigned long long)k, t, x, want);
        assert_true(x >= want && x < want + SENTENCE_TOKENS);
      }
      kvr_workload_conv_free(&c);
    }
    if (cases[i].want < 0)
      assert_true(at_min > n / 3 && at_min < n * 3 / 4);
    kvr_workload_free(wl);
  }
}

static void test_parse_order_and_bad_answer_opts(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_false(o.replay_sample); /* blocks by default */
  assert_int_equal(o.replay_dataset, 0);
  assert_true(o.answer_mean == 0 && o.answer_std == 0);
  assert_int_equal(kvr_workload_parse_order("sample", &o), 0);
  assert_true(o.replay_sample);
  const char *bad[] = {"", "Sample", "samples", "block", "blocks ", "random", "sample\n"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    assert_int_equal(kvr_workload_parse_order(bad[i], &o), KVR_EINVAL);
    assert_true(o.replay_sample); /* untouched on error */
  }
  assert_int_equal(kvr_workload_parse_order("blocks", &o), 0);
  assert_false(o.replay_sample);
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    assert_int_equal(kvr_workload_parse_order(bad[i], &o), KVR_EINVAL);
    assert_false(o.replay_sample);
  }

  char err[256];
  const double neg[][2] = {{-1, 0}, {0, -1}, {300, -0.5}, {-300, 50}};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(neg); i++) {
    kvr_workload_opts_t ob;
    kvr_workload_opts_default(&ob);
    ob.answer_mean = neg[i][0];
    ob.answer_std = neg[i][1];
    err[0] = '\0';
    assert_null(kvr_workload_new(&ob, err, sizeof(err)));
    assert_true(err[0] != '\0');
  }
  kvr_workload_opts_t ok;
  kvr_workload_opts_default(&ok);
  ok.answer_mean = 0;
  ok.answer_std = 0;
  kvr_workload_t *wl = new_workload(&ok);
  kvr_workload_free(wl);
}

static void describe(const kvr_workload_opts_t *o, kvr_buf_t *out) {
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(o, err, sizeof(err));
  assert_non_null(wl);
  kvr_buf_reset(out);
  kvr_workload_describe(wl, out);
  kvr_workload_free(wl);
}

static void test_describe_sample_and_dataset(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  describe(&o, &b);
  assert_non_null(strstr(b.data, "blocks of 16"));
  assert_non_null(strstr(b.data, "answers of max_tokens"));
  assert_null(strstr(b.data, "random turn"));

  o.replay_sample = true;
  describe(&o, &b);
  assert_non_null(strstr(b.data, "random turn of its own conversation"));
  assert_null(strstr(b.data, "blocks of"));
  assert_null(strstr(b.data, "dataset of"));

  o.replay_dataset = 7;
  o.answer_mean = 300;
  o.answer_std = 50;
  describe(&o, &b);
  assert_non_null(strstr(b.data, "35 prompts"));
  assert_non_null(strstr(b.data, "fixed dataset of 7 conversations"));
  assert_non_null(strstr(b.data, "normal(300, 50) tokens"));
  assert_null(strstr(b.data, "answers of max_tokens"));
  assert_null(strstr(b.data, "blocks of"));

  /* Session mode has no pre-built answers or replay order to describe; a dataset there is an
   * error, not silently ignored. */
  o.replay = false;
  char err[256];
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--replay-dataset"));
  o.replay_dataset = 0;
  describe(&o, &b);
  assert_non_null(strstr(b.data, "mode session"));
  assert_null(strstr(b.data, "dataset"));
  assert_null(strstr(b.data, "normal(300, 50)"));
  kvr_buf_free(&b);
}

/* Steady-state starts: a pure function of (level seed, user), in range, uniform over the turns
 * (every turn within 10% of its share over 10,000 users), not one fixed pattern across levels. */
static void test_start_turn_uniform_and_deterministic(void **state) {
  (void)state;
  enum { USERS = 10000, TURNS = 5 };
  size_t count[TURNS] = {0};
  size_t same = 0;
  for (uint64_t u = 0; u < USERS; u++) {
    uint32_t t = kvr_workload_start_turn(7, u, TURNS);
    assert_true(t < TURNS);
    assert_int_equal(t, kvr_workload_start_turn(7, u, TURNS));
    count[t]++;
    same += t == kvr_workload_start_turn(8, u, TURNS);
  }
  for (int t = 0; t < TURNS; t++)
    assert_true(fabs((double)count[t] - USERS / TURNS) < 0.1 * USERS / TURNS);
  /* Another level's users start elsewhere: agreement is chance (1 in 5), not identity. */
  assert_true(same < USERS / 4);
  /* Single-turn conversations always start at their only turn. */
  for (uint64_t u = 0; u < 100; u++) {
    assert_int_equal(kvr_workload_start_turn(7, u, 1), 0);
    assert_int_equal(kvr_workload_start_turn(7, u, 0), 0);
  }
}

/* A history observed mid-way: synthetic answers of each turn's max_tokens, deterministic, and
 * rendered into the body of a later turn like streamed ones (session mode has none pre-built). */
static void test_synthetic_history_answers(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_mode("session", &o), 0);
  kvr_workload_t *wl = new_workload(&o);
  kvr_conv_t c;
  kvr_workload_conv(wl, 3, 11, &c);
  char *answers[5] = {NULL};
  for (uint32_t t = 0; t < 4; t++) {
    assert_null(c.turns[t].answer);
    answers[t] = kvr_workload_answer(wl, 3, &c, t);
    char *again = kvr_workload_answer(wl, 3, &c, t);
    assert_string_equal(answers[t], again);
    free(again);
    size_t want = (size_t)c.turns[t].max_tokens * KVR_WORKLOAD_CHARS_PER_TOKEN;
    assert_true(strlen(answers[t]) >= want && strlen(answers[t]) < want + 200);
  }
  assert_string_not_equal(answers[0], answers[1]);
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_workload_body(&c, 4, (const char *const *)answers, "m", KVR_API_CHAT, true, &body);
  cJSON *j = cJSON_Parse(body.data);
  assert_non_null(j);
  const cJSON *msgs = cJSON_GetObjectItem(j, "messages");
  assert_int_equal(cJSON_GetArraySize(msgs), 9);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 7), "content")->valuestring,
                      answers[3]);
  cJSON_Delete(j);
  kvr_buf_free(&body);
  for (uint32_t t = 0; t < 4; t++)
    free(answers[t]);
  kvr_workload_conv_free(&c);
  kvr_workload_free(wl);
}

/* ---- agentic and hot-prefix ---- */

static kvr_workload_t *new_kind(const char *kind, kvr_workload_opts_t *o) {
  kvr_workload_opts_default(o);
  assert_int_equal(kvr_workload_parse_kind(kind, o), 0);
  return new_workload(o);
}

/* Tokens at ~4 characters per token, rounded up (the workload's own count). */
static uint64_t tokens_of(const char *s) {
  return (strlen(s) + 3) / 4;
}

/* The planned context of an agentic conversation: prefix, every user turn, every max_tokens. */
static uint64_t planned_context(const kvr_conv_t *c) {
  uint64_t n = tokens_of(c->prefix) + 1;
  for (uint32_t t = 0; t < c->nturns; t++)
    n += tokens_of(c->turns[t].user) + c->turns[t].max_tokens;
  return n;
}

static void test_parse_new_kinds(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_kind("agentic", &o), 0);
  assert_int_equal(o.kind, KVR_WL_AGENTIC);
  assert_int_equal(kvr_workload_parse_kind("hot-prefix", &o), 0);
  assert_int_equal(o.kind, KVR_WL_HOT_PREFIX);
  const char *bad[] = {"Agentic", "hot_prefix", "hot", "agentic ", "hot-prefix:x"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    assert_int_equal(kvr_workload_parse_kind(bad[i], &o), KVR_EINVAL);
  assert_int_equal(o.kind, KVR_WL_HOT_PREFIX);
}

static void test_agentic_deterministic(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_t *a = new_kind("agentic", &o), *b = new_workload(&o);
  assert_string_equal(kvr_workload_name(a), "agentic");
  for (uint64_t k = 0; k < 5; k++) {
    kvr_conv_t x, y;
    kvr_workload_conv(a, 11, k, &x);
    kvr_workload_conv(b, 11, k, &y);
    assert_int_equal(x.nturns, y.nturns);
    assert_string_equal(x.prefix, y.prefix);
    assert_same_prompts(&x, &y);
    for (uint32_t t = 0; t < x.nturns; t++)
      assert_true(x.turns[t].think_s == y.turns[t].think_s);
    kvr_workload_conv_free(&x);
    kvr_workload_conv_free(&y);
  }
  /* Another workload seed: other system prompts and tool outputs. */
  o.seed = 43;
  kvr_workload_t *c = new_workload(&o);
  kvr_conv_t x, y;
  kvr_workload_conv(a, 11, 0, &x);
  kvr_workload_conv(c, 11, 0, &y);
  assert_true(strcmp(x.prefix, y.prefix) != 0);
  assert_true(strcmp(x.turns[1].user, y.turns[1].user) != 0);
  kvr_workload_conv_free(&x);
  kvr_workload_conv_free(&y);
  kvr_workload_free(a);
  kvr_workload_free(b);
  kvr_workload_free(c);
}

static void test_agentic_turns_tools_and_context(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_t *wl = new_kind("agentic", &o);
  const kvr_workload_opts_t *wo = kvr_workload_opts(wl);
  assert_true(wo->out_mean == 120 && wo->out_std == 60);
  assert_int_equal(wo->out_min, 16);
  assert_int_equal(wo->out_max, 512);
  uint64_t longest = 0;
  double out_sum = 0;
  size_t outs = 0;
  unsigned min_turns = 1000, max_turns = 0;
  for (uint64_t k = 0; k < 200; k++) {
    kvr_conv_t c;
    kvr_workload_conv(wl, 5, k, &c);
    assert_true(c.nturns >= 20 && c.nturns <= 60);
    min_turns = KVR_MIN(min_turns, c.nturns);
    max_turns = KVR_MAX(max_turns, c.nturns);
    assert_true(c.group >= 0 && c.group < 10);
    assert_true(tokens_of(c.prefix) >= 3500 && tokens_of(c.prefix) <= 4001);
    assert_true(c.turns[0].think_s == 0);
    for (uint32_t t = 1; t < c.nturns; t++) {
      size_t len = strlen(c.turns[t].user);
      assert_int_equal(len % 4, 0);
      assert_true(len / 4 >= 500 && len / 4 <= 3000);
      assert_true(strncmp(c.turns[t].user, "Tool output", 11) == 0);
      assert_true(c.turns[t].think_s >= 0);
    }
    for (uint32_t t = 0; t < c.nturns; t++) {
      assert_true(c.turns[t].max_tokens >= 16 && c.turns[t].max_tokens <= 512);
      out_sum += c.turns[t].max_tokens;
      outs++;
    }
    uint64_t ctx = planned_context(&c);
    assert_true(ctx <= 100000);
    longest = KVR_MAX(longest, ctx);
    kvr_workload_conv_free(&c);
  }
  assert_true(longest > 60000);
  assert_true(min_turns < 30 && max_turns > 45); /* the draw spreads over the range */
  assert_true(out_sum / (double)outs > 105 && out_sum / (double)outs < 140);
  kvr_workload_free(wl);
}

static void test_agentic_cap_and_output_flags(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_AGENTIC;
  o.agentic_max_context = 20000;
  o.out_mean = 300; /* an explicit flag is kept, the other output fields take agentic defaults */
  kvr_workload_t *wl = new_workload(&o);
  const kvr_workload_opts_t *wo = kvr_workload_opts(wl);
  assert_true(wo->out_mean == 300 && wo->out_std == 60);
  assert_int_equal(wo->out_max, 512);
  for (uint64_t k = 0; k < 50; k++) {
    kvr_conv_t c;
    kvr_workload_conv(wl, 2, k, &c);
    assert_true(c.nturns >= 1 && c.nturns < 20); /* the cap wins over --agentic-turns-min */
    assert_true(planned_context(&c) <= 20000);
    kvr_workload_conv_free(&c);
  }
  kvr_workload_free(wl);
  /* Other kinds keep the global output defaults. */
  kvr_workload_t *mt = new_kind("multiturn", &o);
  assert_true(kvr_workload_opts(mt)->out_mean == 830);
  kvr_workload_free(mt);
}

/* kvr_workload_new(o) fails with a message naming `needle`. */
static void assert_rejected(const kvr_workload_opts_t *o, const char *needle) {
  char err[256] = "";
  assert_null(kvr_workload_new(o, err, sizeof(err)));
  assert_non_null(strstr(err, needle));
  assert_null(strchr(err, '\n'));
}

static void test_new_kinds_bad_options(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_AGENTIC;
  o.agentic_turns_min = 0;
  assert_rejected(&o, "--agentic-turns-min");
  o.agentic_turns_min = 61;
  assert_rejected(&o, "--agentic-turns-max");
  o.agentic_turns_min = 20;
  o.tool_min_tokens = 4000;
  assert_rejected(&o, "--tool-min-tokens");
  o.tool_min_tokens = 0;
  assert_rejected(&o, "--tool-min-tokens");
  o.tool_min_tokens = 500;
  o.agentic_max_context = 4000;
  assert_rejected(&o, "--agentic-max-context");
  o.agentic_max_context = 100000;
  o.out_min = 600; /* above the agentic default maximum of 512 */
  assert_rejected(&o, "--output-min");
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_HOT_PREFIX;
  const double bad[] = {-0.1, 1.5, NAN};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    o.hot_fraction = bad[i];
    assert_rejected(&o, "--hot-fraction");
  }
  o.hot_fraction = 0; /* both ends are valid */
  kvr_workload_free(new_workload(&o));
  o.hot_fraction = 1;
  kvr_workload_free(new_workload(&o));
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t common_prefix(const char *a, const char *b) {
  size_t n = 0;
  while (a[n] && a[n] == b[n])
    n++;
  return n;
}

static void test_hot_prefix_share_and_cold_unique(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_t *wl = new_kind("hot-prefix", &o);
  assert_string_equal(kvr_workload_name(wl), "hot-prefix");
  const size_t n = 2000;
  const char *hot = NULL;
  char **cold = kvr_xcalloc(n, sizeof(char *));
  size_t nhot = 0, ncold = 0;
  kvr_buf_t body = KVR_BUF_INIT;
  const char *tmpl = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"";
  for (uint64_t k = 0; k < n; k++) {
    kvr_conv_t c, again;
    kvr_workload_conv(wl, 8, k, &c);
    kvr_workload_conv(wl, 8, k, &again);
    assert_string_equal(c.prefix, again.prefix); /* deterministic */
    assert_same_prompts(&c, &again);
    assert_int_equal(c.nturns, 1);
    size_t q = strlen(c.turns[0].user);
    assert_true(q / 4 >= 50 && q / 4 <= 200);
    assert_true(tokens_of(c.prefix) >= 3500 && tokens_of(c.prefix) <= 4001);
    kvr_workload_body(&c, 0, NULL, "m", KVR_API_CHAT, true, &body);
    assert_true(strncmp(body.data, tmpl, strlen(tmpl)) == 0);
    if (c.group == 0) {
      if (hot == NULL)
        hot = c.prefix;
      assert_ptr_equal(c.prefix, hot); /* the one shared text */
      nhot++;
    } else {
      assert_int_equal(c.group, -1);
      cold[ncold++] = kvr_xstrdup(body.data);
    }
    kvr_workload_conv_free(&c);
    kvr_workload_conv_free(&again);
  }
  double share = (double)nhot / (double)n;
  assert_true(share > 0.77 && share < 0.83);
  /* Sorted, the longest shared prefix of any two cold bodies is that of two neighbours: nothing
   * beyond the chat template and a few characters of the random tag (under one 16-token block). */
  qsort(cold, ncold, sizeof(char *), cmp_str);
  for (size_t i = 0; i + 1 < ncold; i++)
    assert_true(common_prefix(cold[i], cold[i + 1]) < strlen(tmpl) + 16);
  for (size_t i = 0; i < ncold; i++) {
    assert_true(common_prefix(cold[i] + strlen(tmpl), hot) < 16);
    free(cold[i]);
  }
  free(cold);
  kvr_buf_free(&body);
  kvr_workload_free(wl);
}

static void test_describe_new_kinds(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  o.kind = KVR_WL_AGENTIC;
  describe(&o, &b);
  assert_non_null(strstr(b.data, "agentic: 10 shared system prompts"));
  assert_non_null(strstr(b.data, "20-60 turns"));
  assert_non_null(strstr(b.data, "within 100000 tokens"));
  assert_non_null(strstr(b.data, "tool outputs of 500-3000 tokens"));
  assert_non_null(strstr(b.data, "normal(120, 60) clipped to [16, 512]"));
  assert_null(strchr(b.data, '\n'));
  o.kind = KVR_WL_HOT_PREFIX;
  describe(&o, &b);
  assert_non_null(strstr(b.data, "hot-prefix: 80% of requests carry one shared prefix"));
  assert_non_null(strstr(b.data, "normal(830, 300)"));
  assert_null(strchr(b.data, '\n'));
  kvr_buf_free(&b);
}

/* ---- the Responses API ---- */

/* The Responses body of an agentic turn: only that turn's message as input (turn 0 the system
 * prompt, a blank line and the task, as the chat form's first user message), the previous id
 * named after the first turn, store true, the turn's max_tokens as max_output_tokens; the same
 * conversation gives the same bytes (seeded), another level seed other text. JSON throughout. */
static void test_responses_body(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_kind("agentic", &o), 0);
  o.api = KVR_API_RESPONSES;
  kvr_workload_t *wl = new_workload(&o), *again = new_workload(&o);
  kvr_conv_t c, d, e;
  kvr_workload_conv(wl, 5, 3, &c);
  kvr_workload_conv(again, 5, 3, &d);
  kvr_workload_conv(wl, 6, 3, &e);
  kvr_buf_t b = KVR_BUF_INIT, b2 = KVR_BUF_INIT, chat = KVR_BUF_INIT;
  for (uint32_t t = 0; t < 3; t++) {
    const char *prev = t == 0 ? NULL : t == 1 ? "resp_0123456789abcdef" : "resp_fedcba9876543210";
    kvr_workload_responses_body(&c, t, prev, "m", true, &b);
    kvr_workload_responses_body(&d, t, prev, "m", true, &b2);
    assert_string_equal(b.data, b2.data); /* deterministic per seed */
    cJSON *j = cJSON_Parse(b.data);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "m");
    const char *input = cJSON_GetObjectItem(j, "input")->valuestring;
    if (t == 0) {
      assert_int_equal(strncmp(input, c.prefix, strlen(c.prefix)), 0);
      assert_int_equal(strncmp(input + strlen(c.prefix), "\n\n", 2), 0);
      assert_null(cJSON_GetObjectItem(j, "previous_response_id"));
    } else {
      assert_string_equal(input, c.turns[t].user); /* the tool output alone */
      assert_string_equal(cJSON_GetObjectItem(j, "previous_response_id")->valuestring, prev);
    }
    if (t == 0)
      assert_string_equal(input + strlen(c.prefix) + 2, c.turns[0].user);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "store")));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "stream")));
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "ignore_eos")));
    assert_int_equal(cJSON_GetObjectItem(j, "max_output_tokens")->valueint, c.turns[t].max_tokens);
    assert_null(cJSON_GetObjectItem(j, "messages"));
    assert_null(cJSON_GetObjectItem(j, "instructions")); /* agentic has no separate system */
    cJSON_Delete(j);
  }
  /* kvr_workload_body with the Responses API: the first turn's body, no history resent. */
  kvr_workload_body(&c, 0, NULL, "m", KVR_API_RESPONSES, true, &chat);
  kvr_workload_responses_body(&c, 0, NULL, "m", true, &b);
  assert_string_equal(chat.data, b.data);
  /* Another level: other tool outputs. */
  kvr_workload_responses_body(&e, 1, "resp_x", "m", true, &b2);
  kvr_workload_responses_body(&c, 1, "resp_x", "m", true, &b);
  assert_string_not_equal(b.data, b2.data);
  /* A system prompt goes as instructions, every turn. */
  c.system = "You are terse.";
  kvr_workload_responses_body(&c, 2, "resp_y", "m", false, &b);
  cJSON *j = cJSON_Parse(b.data);
  assert_string_equal(cJSON_GetObjectItem(j, "instructions")->valuestring, "You are terse.");
  assert_null(cJSON_GetObjectItem(j, "ignore_eos"));
  cJSON_Delete(j);
  c.system = NULL;
  assert_string_equal(kvr_workload_api_path(KVR_API_RESPONSES), "/v1/responses");
  assert_string_equal(kvr_workload_api_name(KVR_API_RESPONSES), "responses");
  assert_string_equal(kvr_workload_api_path(KVR_API_CHAT), "/v1/chat/completions");
  kvr_buf_free(&b);
  kvr_buf_free(&b2);
  kvr_buf_free(&chat);
  kvr_workload_conv_free(&c);
  kvr_workload_conv_free(&d);
  kvr_workload_conv_free(&e);
  kvr_workload_free(wl);
  kvr_workload_free(again);
}

/* The Responses API needs sessions: multiturn's replay (pre-built answers, no ids) and a trace
 * are refused with a line naming the fix; multiturn in session mode is taken. */
static void test_responses_needs_sessions(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o); /* multiturn replay */
  o.api = KVR_API_RESPONSES;
  char err[256] = "";
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--multiturn-mode session"));
  assert_int_equal(kvr_workload_parse_kind("trace:/nonexistent.jsonl", &o), 0);
  err[0] = '\0';
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--api responses"));
  kvr_workload_opts_default(&o);
  o.api = KVR_API_RESPONSES;
  o.replay = false;
  kvr_workload_free(new_workload(&o));
}

/* ---- mix: several models in one traffic ---- */

static void test_mix_parse(void **state) {
  (void)state;
  kvr_wl_mix_part_t parts[KVR_WL_MIX_MAX];
  size_t n = 0;
  char err[256] = "";
  assert_int_equal(kvr_workload_mix_parse("model-a=multiturn@0.6,b-sql=hot-prefix@0.05,"
                                          "b-x=documents@2",
                                          parts, &n, err, sizeof(err)),
                   0);
  assert_int_equal(n, 3);
  assert_string_equal(parts[0].model, "model-a");
  assert_int_equal(parts[0].kind, KVR_WL_MULTITURN);
  assert_true(parts[0].weight == 0.6);
  assert_int_equal(parts[1].kind, KVR_WL_HOT_PREFIX);
  assert_int_equal(parts[2].kind, KVR_WL_DOCUMENTS);
  assert_true(parts[2].weight == 2);
  /* each refusal names what is wrong */
  static const struct {
    const char *spec, *says;
  } bad[] = {
      {"", "needs MODEL=KIND@WEIGHT"},
      {"a=multiturn", "is not MODEL=KIND@WEIGHT"},
      {"a@1", "is not MODEL=KIND@WEIGHT"},
      {"=multiturn@1", "the model must be"},
      {"a=trace:x@1", "is not multiturn, documents"},
      {"a=file:x@1", "is not multiturn, documents"},
      {"a=mix:b=control@1@1", "is not multiturn, documents"},
      {"a=sessions@1", "kind 'sessions'"},
      {"a=control@0", "weight '0' is not a positive number"},
      {"a=control@-1", "is not a positive number"},
      {"a=control@x", "is not a positive number"},
      {"a=control@inf", "is not a positive number"},
      {"a=control@1,a=documents@1", "model 'a' is named twice"},
      {"a=control@1,", "is not MODEL=KIND@WEIGHT"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    err[0] = '\0';
    assert_int_equal(kvr_workload_mix_parse(bad[i].spec, parts, &n, err, sizeof(err)), KVR_EINVAL);
    if (strstr(err, bad[i].says) == NULL)
      fail_msg("'%s': '%s' does not say '%s'", bad[i].spec, err, bad[i].says);
  }
  char many[1024] = "";
  for (int i = 0; i <= KVR_WL_MIX_MAX; i++)
    snprintf(many + strlen(many), sizeof(many) - strlen(many), "%sm%d=control@1", i ? "," : "", i);
  assert_int_equal(kvr_workload_mix_parse(many, parts, &n, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "more than 16 parts"));
  /* the kind's word and the workload's own refusal */
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_kind("mix:a=control@1", &o), 0);
  assert_int_equal(o.kind, KVR_WL_MIX);
  assert_string_equal(o.path, "a=control@1");
  assert_int_equal(kvr_workload_parse_kind("mix:", &o), KVR_EINVAL);
  assert_int_equal(kvr_workload_parse_kind("mix:a=control@x", &o), 0);
  assert_null(kvr_workload_new(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "weight 'x'"));
}

static kvr_workload_t *mix_workload(const char *spec) {
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_kind(spec, &o), 0);
  o.documents = 20;
  o.starters = 4;
  return new_workload(&o);
}

/* Each conversation names its part's model, the parts come in their weights' proportions, a
 * conversation is a pure function of (seed, level seed, k), and models share no text. */
static void test_mix_conversations(void **state) {
  (void)state;
  kvr_workload_t *wl = mix_workload("mix:model-a=multiturn@0.6,model-b=documents@0.2,"
                                    "b-sql=hot-prefix@0.1,b-chat=multiturn@0.1");
  assert_string_equal(kvr_workload_name(wl), "mix");
  size_t np = 0;
  const kvr_wl_mix_part_t *parts = kvr_workload_mix_parts(wl, &np);
  assert_int_equal(np, 4);
  assert_string_equal(parts[3].model, "b-chat");
  size_t count[4] = {0};
  const size_t N = 4000;
  for (uint64_t k = 0; k < N; k++) {
    kvr_conv_t c, d;
    kvr_workload_conv(wl, 99, k, &c);
    kvr_workload_conv(wl, 99, k, &d);
    assert_true(c.part >= 0 && c.part < 4);
    assert_ptr_equal(c.model, parts[c.part].model);
    assert_int_equal(c.part, d.part);
    assert_int_equal(c.nturns, d.nturns);
    assert_same_prompts(&c, &d);
    assert_int_equal(c.nturns, parts[c.part].kind == KVR_WL_MULTITURN ? 5 : 1);
    count[c.part]++;
    kvr_workload_conv_free(&c);
    kvr_workload_conv_free(&d);
  }
  const double want[4] = {0.6, 0.2, 0.1, 0.1};
  for (size_t i = 0; i < 4; i++) /* binomial: 4 standard deviations at N = 4000 is under 0.031 */
    if (fabs((double)count[i] / N - want[i]) > 0.031)
      fail_msg("part %zu: %zu of %zu, want %.2f", i, count[i], N, want[i]);
  /* model-a's and b-chat's multiturn starters come from different pools */
  kvr_conv_t a = {0}, b = {0};
  uint64_t k = 0;
  for (; a.prefix == NULL || b.prefix == NULL; k++) {
    kvr_conv_t c;
    kvr_workload_conv(wl, 5, k, &c);
    if (c.part == 0 && a.prefix == NULL)
      a = c;
    else if (c.part == 3 && b.prefix == NULL)
      b = c;
    else
      kvr_workload_conv_free(&c);
  }
  assert_true(strncmp(a.prefix, b.prefix, 200) != 0);
  /* the body sends the part's model */
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_workload_body(&b, 0, NULL, b.model, KVR_API_CHAT, true, &body);
  assert_non_null(strstr(body.data, "{\"model\":\"b-chat\","));
  kvr_buf_free(&body);
  kvr_workload_conv_free(&a);
  kvr_workload_conv_free(&b);
  /* another level seed draws other parts for the same k, the same one draws them again */
  size_t same = 0;
  for (k = 0; k < 200; k++) {
    kvr_conv_t c, d;
    kvr_workload_conv(wl, 1, k, &c);
    kvr_workload_conv(wl, 2, k, &d);
    same += c.part == d.part;
    kvr_workload_conv_free(&c);
    kvr_workload_conv_free(&d);
  }
  assert_true(same < 160);
  kvr_buf_t desc = KVR_BUF_INIT;
  kvr_workload_describe(wl, &desc);
  assert_non_null(strstr(desc.data, "mix of 4 models"));
  assert_non_null(strstr(desc.data, "; b-sql 10.0% hot-prefix:"));
  kvr_buf_free(&desc);
  kvr_workload_free(wl);
  /* a non-mix conversation names no model of its own */
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  wl = new_workload(&o);
  kvr_conv_t c;
  kvr_workload_conv(wl, 1, 0, &c);
  assert_null(c.model);
  assert_int_equal(c.part, -1);
  kvr_workload_conv_free(&c);
  kvr_workload_free(wl);
}

KVR_TEST_MAIN(cmocka_unit_test(test_rng_deterministic_and_bounded),
              cmocka_unit_test(test_mix_parse), cmocka_unit_test(test_mix_conversations),
              cmocka_unit_test(test_gamma_mean), cmocka_unit_test(test_text_length_and_determinism),
              cmocka_unit_test(test_multiturn_shape),
              cmocka_unit_test(test_multiturn_replay_answers),
              cmocka_unit_test(test_documents_exceed_one_worker),
              cmocka_unit_test(test_control_never_shares),
              cmocka_unit_test(test_chat_body_resends_history), cmocka_unit_test(test_file_jsonl),
              cmocka_unit_test(test_file_sharegpt),
              cmocka_unit_test(test_sample_slot_dataset_passes_are_permutations),
              cmocka_unit_test(test_sample_slot_dataset_orders_differ),
              cmocka_unit_test(test_sample_slot_dataset_order_has_no_stride),
              cmocka_unit_test(test_sample_slot_fresh_conversations),
              cmocka_unit_test(test_dataset_conversations_same_at_every_level),
              cmocka_unit_test(test_answer_mean_std),
              cmocka_unit_test(test_answer_fixed_and_clipped),
              cmocka_unit_test(test_parse_order_and_bad_answer_opts),
              cmocka_unit_test(test_describe_sample_and_dataset),
              cmocka_unit_test(test_start_turn_uniform_and_deterministic),
              cmocka_unit_test(test_synthetic_history_answers),
              cmocka_unit_test(test_parse_new_kinds), cmocka_unit_test(test_agentic_deterministic),
              cmocka_unit_test(test_agentic_turns_tools_and_context),
              cmocka_unit_test(test_agentic_cap_and_output_flags),
              cmocka_unit_test(test_new_kinds_bad_options),
              cmocka_unit_test(test_hot_prefix_share_and_cold_unique),
              cmocka_unit_test(test_describe_new_kinds), cmocka_unit_test(test_responses_body),
              cmocka_unit_test(test_responses_needs_sessions))

/* test_trace_replay.c -- a prefix-hashed trace as a bench workload (bench/loadgen/trace_replay.h):
 * the reader's one-line errors naming file and line, arrival order, window, context and figures,
 * the synthesised text's determinism and lengths (input_length tokens in the trace are
 * input_length prompt tokens at the simulator, chat and completions), and exact sharing: requests
 * with ids [1,2,3] and [1,2,4] carry the same text for exactly two blocks, the simulator's tokens
 * agree for exactly those 1,024 tokens, and the router's 64-byte prefix blocks agree as far as the
 * shared bytes reach and no further. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/loadgen/trace_replay.h"
#include "bench/loadgen/workload.h"
#include "bench/sim/sim_server.h"
#include "bench/sim/sim_tokens.h"
#include "policies/policy.h"
#include "proto/prompt.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MODEL "m"
#define BLOCK 512

static char *write_tmp(const char *text) {
  char *path = strdup("/tmp/kvr_trace_XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

static kvr_trace_replay_opts_t opts_for(const char *path) {
  return (kvr_trace_replay_opts_t){
      .path = path, .block_tokens = BLOCK, .window_end_s = -1, .chat = true};
}

/* Opening text as a trace fails with exactly want (the path prepended when with_path). */
static void assert_open_fails(const char *text, const char *want) {
  char *path = write_tmp(text);
  kvr_trace_replay_opts_t o = opts_for(path);
  char err[256] = "", exp[512];
  assert_null(kvr_trace_replay_open(&o, err, sizeof(err)));
  snprintf(exp, sizeof(exp), "%s%s", path, want);
  assert_string_equal(err, exp);
  unlink(path);
  free(path);
}

#define LINE(ts, in, out, ids)                                                                     \
  "{\"timestamp\": " #ts ", \"input_length\": " #in ", \"output_length\": " #out                   \
  ", \"hash_ids\": " ids "}\n"

static void test_reader_errors_name_file_and_line(void **state) {
  (void)state;
  assert_open_fails(LINE(0, 600, 5, "[1, 2]") "\n" LINE(9, 600, 5, "[1, 3]") "{\"timestamp\": 3,\n",
                    ":4: not a JSON object");
  assert_open_fails(LINE(0, 600, 5, "[1, 2]") "{\"timestamp\": 3, \"input_length\": 4, "
                                              "\"output_length\": 2}\n",
                    ":2: missing field 'hash_ids'");
  assert_open_fails("{\"timestamp\": 3, \"input_length\": -4, \"output_length\": 2, "
                    "\"hash_ids\": [1]}\n",
                    ":1: 'input_length' must be a non-negative integer");
  assert_open_fails(LINE(0, 600, 5, "[1, -2]"), ":1: 'hash_ids[1]' must be a non-negative integer");
  assert_open_fails("\n\n", ": no requests");
  /* Options. */
  char err[256];
  kvr_trace_replay_opts_t o = opts_for("/nonexistent/t.jsonl");
  assert_null(kvr_trace_replay_open(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "/nonexistent/t.jsonl"));
  o.block_tokens = 8;
  assert_null(kvr_trace_replay_open(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "--trace-block-tokens"));
}

/* Three requests, out of order in the file (a capture is written at completion): read by arrival;
 * the window and the context; the figures and the infinite cache. */
static void test_order_window_context_figures(void **state) {
  (void)state;
  char *path = write_tmp(LINE(4000, 1100, 10, "[1, 2, 3]")      /* third to arrive */
                         LINE(0, 1024, 5, "[1, 2]")             /* first */
                         LINE(2000, 1300, 7, "[1, 2, 4]")       /* second */
                         LINE(6000, 200000, 9, "[7, 8, 9, 10]") /* too long for 131072 */
  );
  kvr_trace_replay_opts_t o = opts_for(path);
  o.max_context = 131072;
  char err[256];
  kvr_trace_replay_t *t = kvr_trace_replay_open(&o, err, sizeof(err));
  assert_non_null(t);
  const kvr_trace_stats_t *st = kvr_trace_replay_stats(t);
  assert_int_equal(st->file_requests, 4);
  assert_int_equal(st->requests, 4);
  assert_int_equal(st->over_context, 1);
  assert_int_equal(kvr_trace_replay_count(t), 3);
  assert_int_equal(kvr_trace_replay_input(t, 0), 1024);
  assert_int_equal(kvr_trace_replay_input(t, 1), 1300);
  assert_int_equal(kvr_trace_replay_input(t, 2), 1100);
  assert_true(kvr_trace_replay_arrival_s(t, 1) == 2.0 && kvr_trace_replay_arrival_s(t, 2) == 4.0);
  /* Infinite cache over the window: [1,2] nothing; [1,2,4] 2 of 3 blocks; [1,2,3] 2 of 3; the long
   * one nothing. Blocks 2 + 3 + 3 + 4 = 12, seen 4. */
  assert_int_equal(st->blocks, 12);
  assert_int_equal(st->blocks_seen, 4);
  assert_int_equal(st->tokens_seen, 2 * 1024);
  assert_int_equal(st->shared_none, 2);
  assert_true(fabs(st->span_s - 6.0) < 1e-12 && fabs(st->mean_rate - 0.5) < 1e-12);
  /* The sent ones: span 4 s, rate 0.5 req/s; a level at 2 req/s runs them 4x faster. */
  assert_true(fabs(st->sent_rate - 0.5) < 1e-12);
  assert_true(fabs(kvr_trace_replay_factor(t, 2.0) - 0.25) < 1e-12);
  assert_int_equal(st->sent_tokens_seen, 2 * 1024);
  assert_int_equal(kvr_trace_replay_seen(t, 1), 1024);
  /* No context: everything is sent. */
  assert_int_equal(kvr_trace_replay_set_context(t, 0), 4);
  assert_int_equal(st->over_context, 0);
  kvr_trace_replay_free(t);
  /* A window: [1.5, 5) s keeps the second and third, the level starting at the second. */
  o.window_start_s = 1.5;
  o.window_end_s = 5;
  t = kvr_trace_replay_open(&o, err, sizeof(err));
  assert_non_null(t);
  assert_int_equal(kvr_trace_replay_count(t), 2);
  assert_true(kvr_trace_replay_arrival_s(t, 0) == 0.0 && kvr_trace_replay_arrival_s(t, 1) == 2.0);
  assert_int_equal(kvr_trace_replay_stats(t)->blocks_seen, 2); /* [1,2,3] after [1,2,4] */
  kvr_trace_replay_free(t);
  o.window_start_s = 100;
  o.window_end_s = -1;
  assert_null(kvr_trace_replay_open(&o, err, sizeof(err)));
  assert_non_null(strstr(err, "no request arrives in --trace-window 100:"));
  unlink(path);
  free(path);
}

static void test_window_flag(void **state) {
  (void)state;
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  assert_int_equal(kvr_workload_parse_window("10:20.5", &o), 0);
  assert_true(o.trace_window_start_s == 10 && o.trace_window_end_s == 20.5);
  assert_int_equal(kvr_workload_parse_window("30:", &o), 0);
  assert_true(o.trace_window_start_s == 30 && o.trace_window_end_s < 0);
  const char *bad[] = {"", "10", "20:10", "5:5", "-1:4", "a:b", "1:2x", ":4"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    assert_int_equal(kvr_workload_parse_window(bad[i], &o), KVR_EINVAL);
  assert_int_equal(kvr_workload_parse_kind("trace:x.jsonl", &o), 0);
  assert_int_equal(o.kind, KVR_WL_TRACE);
  assert_string_equal(o.path, "x.jsonl");
  assert_int_equal(kvr_workload_parse_kind("trace:", &o), KVR_EINVAL);
}

static void test_block_text_rule(void **state) {
  (void)state;
  assert_int_equal(KVR_TRACE_REPLAY_CHARS_PER_TOKEN, KVR_SIM_TOKEN_BYTES);
  assert_int_equal(KVR_TRACE_REPLAY_CHARS_PER_TOKEN, KVR_CHARS_PER_TOKEN);
  assert_int_equal(KVR_TRACE_REPLAY_CHARS_PER_TOKEN, KVR_WORKLOAD_CHARS_PER_TOKEN);
  kvr_buf_t a = KVR_BUF_INIT, b = KVR_BUF_INIT;
  /* Deterministic, exact length, and a shorter block is the start of the longer. */
  kvr_trace_replay_block(7, 3, 1234, 2048, &a);
  kvr_trace_replay_block(7, 3, 1234, 2048, &b);
  assert_int_equal(a.len, 2048);
  assert_memory_equal(a.data, b.data, 2048);
  kvr_buf_reset(&b);
  kvr_trace_replay_block(7, 3, 1234, 333, &b);
  assert_int_equal(b.len, 333);
  assert_memory_equal(a.data, b.data, 333);
  /* Printable, no JSON escapes. */
  for (size_t i = 0; i < a.len; i++)
    assert_true(a.data[i] >= ' ' && a.data[i] < 127 && a.data[i] != '"' && a.data[i] != '\\');
  /* Another id: another first token (4 characters), or, when the low 24 bits agree, another
   * second one. The same id at another position or under another seed: the same code (12
   * characters), then other words at once. */
  const struct {
    uint64_t seed, k, id;
    size_t lo, hi; /* the common prefix's bounds */
  } other[] = {{7, 3, 1235, 0, 3},
               {7, 3, 1234 + (1u << 24), 4, 7},
               {7, 4, 1234, KVR_TRACE_REPLAY_ID_CHARS, KVR_TRACE_REPLAY_ID_CHARS + 40},
               {8, 3, 1234, KVR_TRACE_REPLAY_ID_CHARS, KVR_TRACE_REPLAY_ID_CHARS + 40}};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(other); i++) {
    kvr_buf_reset(&b);
    kvr_trace_replay_block(other[i].seed, other[i].k, other[i].id, 2048, &b);
    size_t same = 0;
    while (same < 2048 && a.data[same] == b.data[same])
      same++;
    assert_in_range(same, other[i].lo, other[i].hi);
  }
  kvr_buf_free(&a);
  kvr_buf_free(&b);
}

/* A workload over path with api; asserted to open. */
static kvr_workload_t *trace_workload(const char *path, kvr_api_t api) {
  kvr_workload_opts_t o;
  kvr_workload_opts_default(&o);
  char spec[256];
  snprintf(spec, sizeof(spec), "trace:%s", path);
  assert_int_equal(kvr_workload_parse_kind(spec, &o), 0);
  o.api = api;
  char err[256];
  kvr_workload_t *wl = kvr_workload_new(&o, err, sizeof(err));
  if (wl == NULL)
    fail_msg("%s", err);
  return wl;
}

/* Request k's body as the load generator renders it, parsed as the simulator does: its tokens. */
static void sim_tokens(const kvr_workload_t *wl, uint64_t level_seed, uint64_t k, kvr_api_t api,
                       kvr_sim_toks_t *out, kvr_prompt_t *router) {
  kvr_conv_t c;
  kvr_workload_conv(wl, level_seed, k, &c);
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_workload_body(&c, 0, NULL, MODEL, api, true, &body);
  cJSON *j = cJSON_Parse(body.data);
  assert_non_null(j);
  kvr_sim_completion_t p;
  memset(&p, 0, sizeof(p));
  char err[256];
  assert_int_equal(kvr_sim_server_parse_completion(j, api == KVR_API_CHAT, MODEL, 1u << 20, &p, err,
                                                   sizeof(err)),
                   0);
  assert_int_equal(p.max_tokens, (int64_t)c.turns[0].max_tokens);
  assert_true(p.ignore_eos);
  *out = p.prompt;
  if (router != NULL)
    assert_int_equal(
        kvr_prompt_from_json(j, api == KVR_API_CHAT ? KVR_PROMPT_CHAT : KVR_PROMPT_COMPLETIONS,
                             KVR_PROMPT_BLOCK_CHARS_DEFAULT, router, err, sizeof(err)),
        0);
  cJSON_Delete(j);
  kvr_buf_free(&body);
  kvr_workload_conv_free(&c);
}

/* input_length tokens in the trace are input_length prompt tokens at the simulator (chat and
 * completions, full and partial last blocks, fewer ids than blocks); max_tokens is the output. */
static void test_lengths_at_the_simulator(void **state) {
  (void)state;
  char *path = write_tmp(LINE(0, 13, 1, "[0]") LINE(1, 512, 3, "[1]") LINE(2, 513, 4, "[1, 2]")
                             LINE(3, 2000, 5, "[1, 2, 3, 4]") LINE(4, 5000, 6, "[9]")
                                 LINE(5, 1030, 0, "[1, 2, 3]"));
  const uint64_t want[] = {13, 512, 513, 2000, 5000, 1030};
  for (int api = KVR_API_CHAT; api <= KVR_API_COMPLETIONS; api++) {
    kvr_workload_t *wl = trace_workload(path, (kvr_api_t)api);
    for (uint64_t k = 0; k < KVR_ARRAY_SIZE(want); k++) {
      kvr_sim_toks_t t = {0};
      sim_tokens(wl, 5, k, (kvr_api_t)api, &t, NULL);
      assert_int_equal(t.n, want[k]);
      kvr_sim_toks_free(&t);
    }
    kvr_workload_free(wl);
  }
  unlink(path);
  free(path);
}

static size_t common_tokens(const kvr_sim_toks_t *a, const kvr_sim_toks_t *b) {
  size_t n = 0;
  while (n < a->n && n < b->n && a->v[n] == b->v[n])
    n++;
  return n;
}

static size_t common_blocks(const kvr_prompt_t *a, const kvr_prompt_t *b) {
  size_t n = 0;
  while (n < a->nblocks && n < b->nblocks && a->blocks[n] == b->blocks[n])
    n++;
  return n;
}

/* [1,2,3] and [1,2,4]: two blocks shared, exactly; [5,2,3]: none. Chat and completions. */
static void test_exact_sharing(void **state) {
  (void)state;
  char *path = write_tmp(LINE(0, 1536, 8, "[1, 2, 3]") LINE(1, 1536, 8, "[1, 2, 4]")
                             LINE(2, 1536, 8, "[5, 2, 3]") LINE(3, 1536, 8, "[1, 2, 3]"));
  for (int api = KVR_API_CHAT; api <= KVR_API_COMPLETIONS; api++) {
    bool chat = api == KVR_API_CHAT;
    kvr_workload_t *wl = trace_workload(path, (kvr_api_t)api);
    kvr_sim_toks_t t[4];
    kvr_prompt_t p[4];
    for (int k = 0; k < 4; k++)
      sim_tokens(wl, 11, (uint64_t)k, (kvr_api_t)api, &t[k], &p[k]);
    /* The engine: exactly 2 x 512 tokens in common (template included), then a different token. */
    assert_int_equal(common_tokens(&t[0], &t[1]), 2 * BLOCK);
    /* The same ids: the same prompt. */
    assert_int_equal(common_tokens(&t[0], &t[3]), t[0].n);
    /* A different first id: only the template before the content. */
    assert_int_equal(common_tokens(&t[0], &t[2]),
                     chat ? KVR_TRACE_REPLAY_CHAT_BEFORE : KVR_TRACE_REPLAY_TEXT_BEFORE);
    /* The router: its 64-byte blocks agree as far as the shared bytes reach and no further. Chat's
     * canonical text opens with RS "user" US (6 bytes), completions' is the prompt itself; the
     * content's first two blocks are (2 x 512 - before) tokens of 4 characters. */
    size_t before = chat ? KVR_TRACE_REPLAY_CHAT_BEFORE : KVR_TRACE_REPLAY_TEXT_BEFORE;
    size_t shared_bytes = (chat ? 6 : 0) + (2 * BLOCK - before) * KVR_TRACE_REPLAY_CHARS_PER_TOKEN;
    assert_int_equal(common_blocks(&p[0], &p[1]), shared_bytes / KVR_PROMPT_BLOCK_CHARS_DEFAULT);
    assert_int_equal(common_blocks(&p[0], &p[3]), p[0].nblocks);
    assert_int_equal(common_blocks(&p[0], &p[2]), 0);
    /* The router's prefix of [1,2,3] vs [1,2,4] in tokens: within one router block of the
     * engine's 1,024. */
    size_t router_tokens = common_blocks(&p[0], &p[1]) * KVR_PROMPT_BLOCK_CHARS_DEFAULT /
                           KVR_TRACE_REPLAY_CHARS_PER_TOKEN;
    assert_true(router_tokens <= 2 * BLOCK && router_tokens + 16 >= 2 * BLOCK);
    for (int k = 0; k < 4; k++) {
      kvr_sim_toks_free(&t[k]);
      kvr_prompt_free(&p[k]);
    }
    kvr_workload_free(wl);
  }
  unlink(path);
  free(path);
}

/* The same (seed, level) gives the same text; another level another (fresh caches per level). */
static void test_determinism(void **state) {
  (void)state;
  char *path = write_tmp(LINE(0, 3000, 8, "[1, 2, 3, 4, 5, 6]") LINE(1, 700, 8, "[1, 2]"));
  kvr_workload_t *a = trace_workload(path, KVR_API_CHAT), *b = trace_workload(path, KVR_API_CHAT);
  for (uint64_t k = 0; k < 2; k++) {
    kvr_conv_t x, y, z;
    kvr_workload_conv(a, 3, k, &x);
    kvr_workload_conv(b, 3, k, &y);
    kvr_workload_conv(a, 4, k, &z);
    assert_true(x.raw && x.nturns == 1 && x.turns[0].max_tokens == 8);
    assert_string_equal(x.turns[0].user, y.turns[0].user);
    assert_true(strcmp(x.turns[0].user, z.turns[0].user) != 0);
    kvr_workload_conv_free(&x);
    kvr_workload_conv_free(&y);
    kvr_workload_conv_free(&z);
  }
  /* Request 1 ([1,2], 700 tokens) is the start of request 0 ([1,2,...]): a partial block is the
   * start of the full one. */
  kvr_conv_t x, y;
  kvr_workload_conv(a, 3, 0, &x);
  kvr_workload_conv(a, 3, 1, &y);
  size_t n = strlen(y.turns[0].user);
  assert_int_equal(n, (700 - 9) * 4);
  assert_memory_equal(x.turns[0].user, y.turns[0].user, n);
  kvr_workload_conv_free(&x);
  kvr_workload_conv_free(&y);
  kvr_workload_free(a);
  kvr_workload_free(b);
  unlink(path);
  free(path);
}

KVR_TEST_MAIN(cmocka_unit_test(test_reader_errors_name_file_and_line),
              cmocka_unit_test(test_order_window_context_figures),
              cmocka_unit_test(test_window_flag), cmocka_unit_test(test_block_text_rule),
              cmocka_unit_test(test_lengths_at_the_simulator), cmocka_unit_test(test_exact_sharing),
              cmocka_unit_test(test_determinism))

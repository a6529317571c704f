/* test_trace.c -- one line of a prefix-hashed trace (src/proto/trace.c): the shared Mooncake file's
 * lines read as they are, every malformation refused with its reason, a written line read back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "proto/trace.h"

#include <string.h>

static int parse(const char *line, kvr_trace_rec_t *rec, char *err) {
  return kvr_trace_parse(line, strlen(line), rec, err, 200);
}

static void test_parse_mooncake_line(void **state) {
  (void)state;
  kvr_trace_rec_t r;
  char err[200];
  assert_int_equal(parse("{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, "
                         "\"hash_ids\": [46, 47, 48, 2353, 2354]}\n",
                         &r, err),
                   0);
  assert_true(r.timestamp_ms == 27482.0);
  assert_int_equal(r.input_length, 6955);
  assert_int_equal(r.output_length, 52);
  assert_int_equal(r.nhash, 5);
  assert_int_equal(r.hash_ids[0], 46);
  assert_int_equal(r.hash_ids[4], 2354);
  assert_int_equal(r.tokens, KVR_TRACE_TOKENS_UNSTATED);
  kvr_trace_rec_free(&r);
  /* Other tools' members are ignored; an empty id list and a fractional timestamp are fine. */
  assert_int_equal(parse("{\"timestamp\": 0.5, \"input_length\": 0, \"output_length\": 1, "
                         "\"hash_ids\": [], \"session_id\": \"a\", \"tokens_source\": \"usage\"}",
                         &r, err),
                   0);
  assert_true(r.timestamp_ms == 0.5 && r.nhash == 0 && r.tokens == KVR_TRACE_TOKENS_USAGE);
  kvr_trace_rec_free(&r);
  assert_int_equal(parse("   \r\n", &r, err), KVR_ENOENT);
}

static void test_parse_refusals(void **state) {
  (void)state;
  static const struct {
    const char *line, *why;
  } bad[] = {
      {"[1, 2]", "not a JSON object"},
      {"{\"timestamp\": 1", "not a JSON object"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []} x",
       "not a JSON object"},
      {"{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
       "missing field 'timestamp'"},
      {"{\"timestamp\": 1, \"output_length\": 1, \"hash_ids\": []}",
       "missing field 'input_length'"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"hash_ids\": []}",
       "missing field 'output_length'"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1}", "missing field 'hash_ids'"},
      {"{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}",
       "'timestamp' must be"},
      {"{\"timestamp\": 1, \"input_length\": -5, \"output_length\": 1, \"hash_ids\": []}",
       "'input_length' must be a non-negative integer"},
      {"{\"timestamp\": 1, \"input_length\": 1.5, \"output_length\": 1, \"hash_ids\": []}",
       "'input_length' must be a non-negative integer"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": \"2\", \"hash_ids\": []}",
       "'output_length' must be a non-negative integer"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": {}}",
       "'hash_ids' must be an array"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1, -2]}",
       "'hash_ids[1]' must be a non-negative integer"},
      {"{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1e300]}",
       "'hash_ids[0]' must be a non-negative integer"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    kvr_trace_rec_t r;
    char err[200] = "";
    if (parse(bad[i].line, &r, err) != KVR_EINVAL || strstr(err, bad[i].why) == NULL)
      fail_msg("'%s': got '%s', want '%s'", bad[i].line, err, bad[i].why);
    assert_null(r.hash_ids);
  }
}

static void test_format_round_trip(void **state) {
  (void)state;
  uint64_t ids[] = {0, 1, 7};
  kvr_trace_rec_t w = {.timestamp_ms = 1234.9,
                       .input_length = 1500,
                       .output_length = 20,
                       .hash_ids = ids,
                       .nhash = 3,
                       .tokens = KVR_TRACE_TOKENS_ESTIMATE};
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_trace_format(&b, &w);
  kvr_buf_append(&b, "", 1);
  assert_string_equal(b.data,
                      "{\"timestamp\": 1234, \"input_length\": 1500, \"output_length\": 20, "
                      "\"hash_ids\": [0, 1, 7], \"tokens_source\": \"estimate\"}\n");
  kvr_trace_rec_t r;
  char err[200];
  assert_int_equal(kvr_trace_parse(b.data, b.len - 1, &r, err, sizeof err), 0);
  assert_true(r.timestamp_ms == 1234 && r.input_length == 1500 && r.output_length == 20);
  assert_int_equal(r.nhash, 3);
  assert_int_equal(r.hash_ids[2], 7);
  assert_int_equal(r.tokens, KVR_TRACE_TOKENS_ESTIMATE);
  kvr_trace_rec_free(&r);
  kvr_trace_rec_free(NULL);
  kvr_buf_free(&b);
}

KVR_TEST_MAIN(cmocka_unit_test(test_parse_mooncake_line), cmocka_unit_test(test_parse_refusals),
              cmocka_unit_test(test_format_round_trip))

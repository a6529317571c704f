/* log_test_util.h -- what the log tests do alike (test_log.c for base/log.c, the loop's side in
 * tests/src/net/test_log_batch.c for net/log_batch.c), written once: send the log to a temporary
 * file, read back what it holds, count what it wrote, check the order lines left in. Macros and
 * static inline functions only, as tests/test_util.h (each unit test is its own executable).
 * Include after <cmocka.h>.
 *
 * Flow: f = log_to_tmpfile(); log lines; text = stream_text(f) (the caller frees it) as often as
 * needed, the stream staying open at its end; count_lines(text, needle), assert_in_order(text,
 * first, second); fclose(f). */
#ifndef KVR_TESTS_SRC_BASE_LOG_TEST_UTIL_H
#define KVR_TESTS_SRC_BASE_LOG_TEST_UTIL_H

#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sends log lines, text, info and above, to a new temporary file. */
static inline FILE *log_to_tmpfile(void) {
  FILE *f = tmpfile();
  assert_non_null(f);
  kvr_log_set_stream(f);
  kvr_log_set_level(KVR_LOG_INFO);
  kvr_log_set_format(KVR_LOG_TEXT);
  return f;
}

/* The file's whole content (the stream stays open, positioned at its end). */
static inline char *stream_text(FILE *f) {
  fflush(f);
  long n = ftell(f);
  assert_true(n >= 0);
  char *out = malloc((size_t)n + 1);
  assert_non_null(out);
  rewind(f);
  assert_int_equal(fread(out, 1, (size_t)n, f), (size_t)n);
  out[n] = '\0';
  return out;
}

/* How many times needle stands in s, without overlaps (needle "\n": the lines). */
static inline size_t count_lines(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle))
    n++;
  return n;
}

/* Asserts that first and second both stand in text, first's first occurrence before second's. A
 * macro, so that a failure names the test's line. */
#define assert_in_order(text, first, second)                                                       \
  do {                                                                                             \
    const char *in_order_a_ = strstr((text), (first)), *in_order_b_ = strstr((text), (second));    \
    assert_non_null(in_order_a_);                                                                  \
    assert_non_null(in_order_b_);                                                                  \
    assert_true(in_order_a_ < in_order_b_);                                                        \
  } while (0)

#endif

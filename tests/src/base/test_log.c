/* test_log.c -- the log line formats: text and one JSON object per line, RFC 8259 escaping of the
 * message and component, the one timestamp shape (UTC, milliseconds) both formats carry, and
 * holding (lines wait for a flush, in order, nothing lost; the loop's side is test_log_batch.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/src/base/log_test_util.h"
#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" exactly. */
static void assert_ts_shape(const char *ts, size_t len) {
  static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
  assert_int_equal(len, KVR_LOG_TS_LEN);
  assert_int_equal(sizeof shape - 1, KVR_LOG_TS_LEN);
  for (size_t i = 0; i < len; i++) {
    if (shape[i] == 'd') {
      if (!isdigit((unsigned char)ts[i]))
        fail_msg("'%.*s': position %zu is not a digit", (int)len, ts, i);
    } else if (ts[i] != shape[i]) {
      fail_msg("'%.*s': position %zu is not '%c'", (int)len, ts, i, shape[i]);
    }
  }
}

static void test_timestamp_fixed(void **state) {
  (void)state;
  char ts[64];
  struct timespec t = {.tv_sec = 1795519353, .tv_nsec = 123456789}; /* 2026-11-24T11:22:33 */
  kvr_log_timestamp(ts, sizeof ts, &t);
  assert_string_equal(ts, "2026-11-24T11:22:33.123Z");
  t.tv_nsec = 999999999; /* truncated, never rounded into the next second */
  kvr_log_timestamp(ts, sizeof ts, &t);
  assert_string_equal(ts, "2026-11-24T11:22:33.999Z");
  t.tv_sec++; /* the next second: the cached date and time are not reused */
  t.tv_nsec = 7000000;
  kvr_log_timestamp(ts, sizeof ts, &t);
  assert_string_equal(ts, "2026-11-24T11:22:34.007Z");
  t.tv_sec = 0;
  t.tv_nsec = 5000000;
  kvr_log_timestamp(ts, sizeof ts, &t);
  assert_string_equal(ts, "1970-01-01T00:00:00.005Z");
  /* Too small a buffer: empty, no overflow. */
  char small[KVR_LOG_TS_LEN];
  memset(small, 'x', sizeof small);
  kvr_log_timestamp(small, sizeof small, &t);
  assert_string_equal(small, "");
}

static void test_timestamp_now(void **state) {
  (void)state;
  char ts[64];
  struct timespec before;
  clock_gettime(CLOCK_REALTIME, &before);
  kvr_log_timestamp(ts, sizeof ts, NULL);
  assert_ts_shape(ts, strlen(ts));
  char year[16];
  struct tm tm;
  gmtime_r(&before.tv_sec, &tm);
  snprintf(year, sizeof year, "%04d-", tm.tm_year + 1900);
  assert_memory_equal(ts, year, 5);
}

static void test_text_line(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_log_format_line(&b, KVR_LOG_TEXT, "2026-11-24T11:22:33.123Z", KVR_LOG_WARN, "router",
                      "worker 0 is down");
  assert_string_equal(b.data, "2026-11-24T11:22:33.123Z warn router: worker 0 is down\n");
  kvr_buf_free(&b);
}

static void test_json_line(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_log_format_line(&b, KVR_LOG_JSON, "2026-11-24T11:22:33.123Z", KVR_LOG_INFO, "router",
                      "policy is now kv_aware");
  assert_string_equal(b.data, "{\"ts\":\"2026-11-24T11:22:33.123Z\",\"level\":\"info\","
                              "\"component\":\"router\",\"msg\":\"policy is now kv_aware\"}\n");
  kvr_buf_free(&b);
}

/* Quotes, backslashes, newlines, tabs and the other control characters are escaped so a message
 * can never break the one-object-per-line framing; UTF-8 passes through. */
static void test_json_escaping(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_log_format_line(&b, KVR_LOG_JSON, "2026-11-24T11:22:33.123Z", KVR_LOG_ERROR, "a\"b",
                      "say \"hi\"\\\nnext\r\tbell\x07 esc\x1b del\x7f \xc3\xa9");
  assert_string_equal(b.data,
                      "{\"ts\":\"2026-11-24T11:22:33.123Z\",\"level\":\"error\",\"component\":"
                      "\"a\\\"b\",\"msg\":\"say \\\"hi\\\"\\\\\\nnext\\r\\tbell\\u0007 "
                      "esc\\u001b del\x7f \xc3\xa9\"}\n");
  /* Exactly one newline: the terminator. */
  assert_ptr_equal(strchr(b.data, '\n'), b.data + b.len - 1);
  for (size_t i = 0; i < b.len - 1; i++)
    assert_true((unsigned char)b.data[i] >= 0x20);
  kvr_buf_free(&b);
}

/* kvr_log() end to end: level filter, format switch, one line per call with a fresh timestamp. */
static void test_kvr_log_writes_lines(void **state) {
  (void)state;
  FILE *f = log_to_tmpfile();
  KVR_DEBUG("t", "hidden");
  KVR_INFO("serve", "n=%d", 7);
  kvr_log_set_format(KVR_LOG_JSON);
  KVR_WARN("serve", "quote \" and\nnewline");
  kvr_log_set_stream(NULL);
  kvr_log_set_format(KVR_LOG_TEXT);
  rewind(f);
  char line[512];
  assert_non_null(fgets(line, sizeof line, f));
  assert_ts_shape(line, KVR_LOG_TS_LEN);
  assert_string_equal(line + KVR_LOG_TS_LEN, " info serve: n=7\n");
  assert_non_null(fgets(line, sizeof line, f));
  assert_memory_equal(line, "{\"ts\":\"", 7);
  assert_ts_shape(line + 7, KVR_LOG_TS_LEN);
  assert_string_equal(line + 7 + KVR_LOG_TS_LEN,
                      "\",\"level\":\"warn\",\"component\":\"serve\",\"msg\":\"quote \\\" "
                      "and\\nnewline\"}\n");
  assert_null(fgets(line, sizeof line, f));
  fclose(f);
}

/* Holding without a loop: info lines wait for kvr_log_flush(), in order; a warn line writes what
 * waited before it and itself; kvr_log_hold(false) writes the rest and lines leave at once again.
 */
static void test_hold_and_flush(void **state) {
  (void)state;
  FILE *f = log_to_tmpfile();
  kvr_log_hold(true);
  kvr_log_hold(true); /* a second hold is a no-op */
  KVR_INFO("access", "request 1");
  KVR_INFO("access", "request 2");
  char *text = stream_text(f);
  assert_string_equal(text, "");
  free(text);
  kvr_log_flush();
  text = stream_text(f);
  assert_in_order(text, " info access: request 1\n", " info access: request 2\n");
  free(text);
  KVR_INFO("access", "request 3");
  KVR_WARN("proxy", "worker 1 is down");
  text = stream_text(f);
  assert_in_order(text, "request 3\n", " warn proxy: worker 1 is down\n");
  free(text);
  KVR_INFO("access", "request 4");
  kvr_log_hold(false);
  text = stream_text(f);
  assert_non_null(strstr(text, " info access: request 4\n"));
  free(text);
  KVR_INFO("access", "after");
  text = stream_text(f);
  assert_non_null(strstr(text, " info access: after\n"));
  assert_int_equal(count_lines(text, "\n"), 6);
  free(text);
  kvr_log_set_stream(NULL);
  fclose(f);
}

static void test_parse_format(void **state) {
  (void)state;
  kvr_log_format_t f = KVR_LOG_TEXT;
  assert_int_equal(kvr_log_parse_format("json", &f), 0);
  assert_int_equal(f, KVR_LOG_JSON);
  assert_int_equal(kvr_log_parse_format("text", &f), 0);
  assert_int_equal(f, KVR_LOG_TEXT);
  assert_int_equal(kvr_log_parse_format("JSON", &f), KVR_EINVAL);
  assert_int_equal(kvr_log_parse_format("", &f), KVR_EINVAL);
}

KVR_TEST_MAIN(cmocka_unit_test(test_timestamp_fixed), cmocka_unit_test(test_timestamp_now),
              cmocka_unit_test(test_text_line), cmocka_unit_test(test_json_line),
              cmocka_unit_test(test_json_escaping), cmocka_unit_test(test_kvr_log_writes_lines),
              cmocka_unit_test(test_hold_and_flush), cmocka_unit_test(test_parse_format))

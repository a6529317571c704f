/* test_buf.c -- the byte buffer's JSON string writer (src/base/buf.c kvr_buf_json_str) against a
 * byte-at-a-time reference over random strings dense and sparse in characters to escape, at every
 * length and offset around its 8-byte steps. */
#include "base/buf.h"
#include "base/kvr.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

/* RFC 8259's escapes, one byte at a time. */
static void reference(kvr_buf_t *b, const char *s, size_t len) {
  kvr_buf_append(b, "\"", 1);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"')
      kvr_buf_puts(b, "\\\"");
    else if (c == '\\')
      kvr_buf_puts(b, "\\\\");
    else if (c == '\n')
      kvr_buf_puts(b, "\\n");
    else if (c == '\r')
      kvr_buf_puts(b, "\\r");
    else if (c == '\t')
      kvr_buf_puts(b, "\\t");
    else if (c < 0x20)
      kvr_buf_printf(b, "\\u%04x", c);
    else
      kvr_buf_append(b, &s[i], 1);
  }
  kvr_buf_append(b, "\"", 1);
}

static void test_json_str_matches_reference(void **state) {
  (void)state;
  uint64_t rng = 42;
  char s[80];
  /* one byte in `every` is drawn from the escapes and their neighbours, the rest from all 256 */
  static const unsigned char near[] = {0x00, 0x01, 0x1f, 0x20, 0x21, '"',  '#',  '[',
                                       '\\', ']',  '\n', '\r', '\t', 0x7f, 0x80, 0xff};
  for (int round = 0; round < 200000; round++) {
    size_t len = kvr_splitmix64(&rng) % sizeof(s);
    unsigned every = 1 + (unsigned)(kvr_splitmix64(&rng) % 40);
    for (size_t i = 0; i < len; i++) {
      uint64_t r = kvr_splitmix64(&rng);
      s[i] = (char)(r % every == 0  ? near[(r >> 8) % sizeof(near)]
                    : (r >> 16) % 4 ? 'a' + (r >> 24) % 26
                                    : (r >> 24) & 0xff);
    }
    kvr_buf_t got = KVR_BUF_INIT, want = KVR_BUF_INIT;
    kvr_buf_append(&got, "x", 1);
    kvr_buf_append(&want, "x", 1);
    kvr_buf_json_str(&got, s, len);
    reference(&want, s, len);
    if (got.len != want.len || memcmp(got.data, want.data, got.len + 1) != 0)
      fail_msg("round %d, %zu bytes: %s against %s", round, len, got.data, want.data);
    kvr_buf_free(&got);
    kvr_buf_free(&want);
  }
}

KVR_TEST_MAIN(cmocka_unit_test(test_json_str_matches_reference))

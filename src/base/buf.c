/* buf.c -- growable byte buffer; see buf.h for the ownership rules. */
#include "base/buf.h"

#include "base/kvr.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_buf_init(kvr_buf_t *b) {
  b->data = NULL;
  b->len = 0;
  b->cap = 0;
}

void kvr_buf_free(kvr_buf_t *b) {
  if (b == NULL)
    return;
  free(b->data);
  kvr_buf_init(b);
}

void kvr_buf_reset(kvr_buf_t *b) {
  b->len = 0;
  if (b->data)
    b->data[0] = '\0';
}

void kvr_buf_reserve(kvr_buf_t *b, size_t extra) {
  size_t need = b->len + extra + 1;
  if (need <= b->cap)
    return;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < need)
    cap *= 2;
  b->data = kvr_xrealloc(b->data, cap);
  b->cap = cap;
}

void kvr_buf_append(kvr_buf_t *b, const void *data, size_t len) {
  kvr_buf_reserve(b, len);
  if (len)
    memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
}

void kvr_buf_puts(kvr_buf_t *b, const char *s) {
  kvr_buf_append(b, s, strlen(s));
}

void kvr_buf_vprintf(kvr_buf_t *b, const char *fmt, va_list ap) {
  va_list cp;
  va_copy(cp, ap);
  int n = vsnprintf(NULL, 0, fmt, cp);
  va_end(cp);
  if (n < 0)
    return;
  kvr_buf_reserve(b, (size_t)n);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  b->len += (size_t)n;
}

void kvr_buf_printf(kvr_buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kvr_buf_vprintf(b, fmt, ap);
  va_end(ap);
}

void kvr_buf_consume(kvr_buf_t *b, size_t n) {
  if (n >= b->len) {
    kvr_buf_reset(b);
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  b->data[b->len] = '\0';
}

char *kvr_buf_steal(kvr_buf_t *b) {
  char *p = b->data;
  if (p == NULL)
    p = kvr_xcalloc(1, 1);
  kvr_buf_init(b);
  return p;
}

int kvr_buf_read_file(kvr_buf_t *b, const char *path, size_t max, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
    return KVR_EIO;
  }
  char tmp[65536];
  size_t n;
  int rc = 0;
  while (rc == 0 && (n = fread(tmp, 1, sizeof tmp, f)) > 0) {
    if (b->len + n > max) {
      snprintf(err, errlen, "'%s' is larger than %zu bytes", path, max);
      rc = KVR_ELIMIT;
    } else {
      kvr_buf_append(b, tmp, n);
    }
  }
  if (rc == 0 && ferror(f)) {
    snprintf(err, errlen, "cannot read '%s'", path);
    rc = KVR_EIO;
  }
  fclose(f);
  if (rc != 0)
    kvr_buf_free(b);
  return rc;
}

/* Whether one of the 8 bytes of x needs an escape (below 0x20, '"' or '\\'): the "has a byte
 * less than n" and "has a zero byte" words of Anderson's Bit Twiddling Hacks, exact as yes/no. */
static inline bool escape_in8(uint64_t x) {
  const uint64_t ones = UINT64_C(0x0101010101010101), high = UINT64_C(0x8080808080808080);
  uint64_t q = x ^ (ones * '"'), bs = x ^ (ones * '\\');
  return ((((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((bs - ones) & ~bs)) & high) != 0;
}

void kvr_buf_json_str(kvr_buf_t *b, const char *s, size_t len) {
  static const char hex[] = "0123456789abcdef";
  /* The characters with a two-character escape, and the letter after the backslash for each. */
  static const char short_from[] = "\"\\\n\r\t", short_to[] = "\"\\nrt";
  kvr_buf_reserve(b, len + 2);
  kvr_buf_append(b, "\"", 1);
  size_t start = 0;
  for (size_t i = 0; i < len; i++) {
    /* Runs of 8 bytes with nothing to escape are skipped 8 at a time (prompts are mostly such). */
    uint64_t x;
    while (len - i >= 8 && (memcpy(&x, s + i, 8), !escape_in8(x)))
      i += 8;
    if (i == len)
      break;
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c != '"' && c != '\\')
      continue;
    kvr_buf_append(b, s + start, i - start);
    start = i + 1;
    const char *two = memchr(short_from, c, sizeof(short_from) - 1);
    if (two != NULL) {
      char esc[2] = {'\\', short_to[two - short_from]};
      kvr_buf_append(b, esc, 2);
    } else {
      char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
      kvr_buf_append(b, esc, 6);
    }
  }
  kvr_buf_append(b, s + start, len - start);
  kvr_buf_append(b, "\"", 1);
}

/* kvr.c -- error strings from the KVR_ERRNO_MAP X-macro list, the out-of-memory contract's
 * allocators (kvr.h), clock helpers and the random seed. */
#include "base/kvr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* One row per code of KVR_ERRNO_MAP, then 0: kvr_strerror and kvr_errname read the same table. */
typedef struct err_row_s {
  int code;
  const char *name, *str;
} err_row_t;

#define XX(code, str) {KVR_##code, #code, str},
static const err_row_t err_rows[] = {KVR_ERRNO_MAP(XX){0, "OK", "success"}};
#undef XX

static const err_row_t *err_row(int err) {
  for (size_t i = 0; i < sizeof(err_rows) / sizeof(err_rows[0]); i++)
    if (err_rows[i].code == err)
      return &err_rows[i];
  return NULL;
}

const char *kvr_strerror(int err) {
  const err_row_t *row = err_row(err);
  return row ? row->str : "unknown error";
}

const char *kvr_errname(int err) {
  const err_row_t *row = err_row(err);
  return row ? row->name : "UNKNOWN";
}

uint64_t kvr_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double kvr_now_ms(void) {
  return (double)kvr_now_ns() / 1e6;
}

uint64_t kvr_random_seed(void) {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == (ssize_t)sizeof seed && seed != 0)
    return seed;
  uint64_t mix = kvr_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
  return kvr_splitmix64(&mix);
}

int kvr_parse_u32(const char *s, uint32_t *out) {
  uint64_t v = 0;
  size_t n = 0;
  for (; s[n] >= '0' && s[n] <= '9'; n++) {
    if (n == 10)
      return KVR_EINVAL;
    v = v * 10 + (uint64_t)(s[n] - '0');
  }
  if (n == 0 || s[n] != '\0' || v > UINT32_MAX)
    return KVR_EINVAL;
  *out = (uint32_t)v;
  return 0;
}

void kvr_utc_iso8601(char *buf, size_t size) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void kvr_oom(const char *what, size_t size) {
  fprintf(stderr, "kvrouter: out of memory (%s, %zu bytes)\n", what, size);
  abort();
}

void *kvr_xmalloc(size_t size) {
  void *p = malloc(size ? size : 1);
  if (p == NULL)
    kvr_oom("malloc", size);
  return p;
}

void *kvr_xcalloc(size_t n, size_t size) {
  if (size != 0 && n > SIZE_MAX / size)
    kvr_oom("calloc overflow", SIZE_MAX);
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (p == NULL)
    kvr_oom("calloc", n * size);
  return p;
}

void *kvr_xrealloc(void *p, size_t size) {
  void *q = realloc(p, size ? size : 1);
  if (q == NULL)
    kvr_oom("realloc", size);
  return q;
}

char *kvr_xstrdup(const char *s) {
  if (s == NULL)
    return NULL;
  size_t n = strlen(s) + 1;
  char *d = kvr_xmalloc(n);
  memcpy(d, s, n);
  return d;
}

/* kvr.c -- error strings from the KVR_ERRNO_MAP X-macro list, and clock helpers. */
#include "kvr.h"

#include <time.h>

const char *kvr_strerror(int err) {
  switch (err) {
  case 0:
    return "success";
#define XX(code, str)                                                                              \
  case KVR_##code:                                                                                 \
    return str;
    KVR_ERRNO_MAP(XX)
#undef XX
  default:
    return "unknown error";
  }
}

const char *kvr_errname(int err) {
  switch (err) {
  case 0:
    return "OK";
#define XX(code, str)                                                                              \
  case KVR_##code:                                                                                 \
    return #code;
    KVR_ERRNO_MAP(XX)
#undef XX
  default:
    return "UNKNOWN";
  }
}

uint64_t kvr_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double kvr_now_ms(void) {
  return (double)kvr_now_ns() / 1e6;
}

void kvr_utc_iso8601(char *buf, size_t size) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

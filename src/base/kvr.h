/* kvr.h -- definitions every kvrouter module shares.
 *
 * Error codes: every fallible function returns 0 or a negative KVR_E* code. The codes, and the
 * strings kvr_strerror() gives for them, come from the one X-macro list KVR_ERRNO_MAP so that the
 * two can never drift apart. Foreign errors (errno, libuv, CURLcode, llhttp) are translated at the
 * boundary of the module that calls the foreign library.
 *
 * Out of memory: the one contract, followed everywhere. Allocations whose size is bounded by a
 * configured limit go through kvr_xmalloc()/kvr_xcalloc()/kvr_xrealloc()/kvr_xstrdup(), which never
 * return NULL: on failure they print one line naming the size and abort (as Redis's zmalloc does).
 * A process that cannot allocate a few KiB under its own limits cannot answer anyone correctly, and
 * a NULL check at every call site would be code no test reaches. Sizes that come from the network
 * are bounded by a limit *before* they reach an allocator (STYLE.md), so this is not a way for a
 * client to crash the process. Foreign allocators (cJSON, libcurl, libuv) that return NULL are
 * checked where they are called and handed to kvr_oom().
 *
 * Time: kvr_now_ms()/kvr_now_ns() read CLOCK_MONOTONIC; they are what latency figures are made of.
 */
#ifndef KVR_H
#define KVR_H

#include <stddef.h>
#include <stdint.h>

#define KVR_ERRNO_MAP(XX)                                                                          \
  XX(EINVAL, "invalid argument")                                                                   \
  XX(ENOMEM, "out of memory")                                                                      \
  XX(ERANGE, "value out of range")                                                                 \
  XX(ENOENT, "not found")                                                                          \
  XX(EEXIST, "already exists")                                                                     \
  XX(EPARSE, "malformed input")                                                                    \
  XX(ELIMIT, "configured limit exceeded")                                                          \
  XX(EIO, "input/output error")                                                                    \
  XX(ECLOSED, "connection closed")                                                                 \
  XX(ENOWORKER, "no usable worker")                                                                \
  XX(ETIMEDOUT, "timed out")                                                                       \
  XX(EUPSTREAM, "upstream error")

typedef enum {
  KVR_OK = 0,
#define KVR__ERR_ENUM(code, str) KVR_##code,
  KVR__ERR_FIRST = -100,
  KVR_ERRNO_MAP(KVR__ERR_ENUM)
#undef KVR__ERR_ENUM
} kvr_errno_t;

/* Returns a static string describing a KVR_E* code (or "success" for 0, "unknown error"). */
const char *kvr_strerror(int err);
/* Returns the symbolic name of a KVR_E* code ("EINVAL"), or "UNKNOWN". */
const char *kvr_errname(int err);

/* Allocators that never return NULL (see "Out of memory" above). kvr_xcalloc() also aborts when
 * n * size overflows. kvr_xstrdup(NULL) returns NULL. */
void *kvr_xmalloc(size_t size);
void *kvr_xcalloc(size_t n, size_t size);
void *kvr_xrealloc(void *p, size_t size);

/* Grows the array arr (with n used of cap) to hold need more elements: capacity doubles from 64.
 * Out of memory aborts (kvr_xrealloc). */
#define KVR_GROW(arr, n, cap, need)                                                                \
  do {                                                                                             \
    if ((n) + (need) > (cap)) {                                                                    \
      size_t c_ = (cap) ? (cap) : 64;                                                              \
      while (c_ < (n) + (need))                                                                    \
        c_ *= 2;                                                                                   \
      (arr) = kvr_xrealloc((arr), c_ * sizeof(*(arr)));                                            \
      (cap) = c_;                                                                                  \
    }                                                                                              \
  } while (0)
char *kvr_xstrdup(const char *s);
/* Prints "kvrouter: out of memory (what, N bytes)" and aborts. */
_Noreturn void kvr_oom(const char *what, size_t size);

/* Monotonic clock readings. */
uint64_t kvr_now_ns(void);
double kvr_now_ms(void);

/* splitmix64: every seeded generator of the project (policies' ties, request ids, the bench's
 * workloads) advances its state with this; the state advances on each call. */
static inline uint64_t kvr_splitmix64(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

/* A 64-bit seed from the OS's random source (getrandom(2)), falling back to the clock and the pid
 * mixed together when that fails: request-id generators and the router's instance id. */
uint64_t kvr_random_seed(void);

/* An id as the admin API and its callers write it: 1 to 10 decimal digits, no sign, no blank, at
 * most UINT32_MAX. Returns 0 and *out, or KVR_EINVAL ("4294967296", "-1", "+1", " 1", "1x"). */
int kvr_parse_u32(const char *s, uint32_t *out);

/* Wall-clock time as "2026-11-21T03:04:05Z" into buf (at least 21 bytes). */
void kvr_utc_iso8601(char *buf, size_t size);

#define KVR_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KVR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVR_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVR_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#endif

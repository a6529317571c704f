/* fuzz_util.h -- what the libFuzzer targets in tests/fuzz/ share: an invariant check that stops the
 * run with a message (libFuzzer then saves the input as crash-<sha1>), and a NUL-terminated copy of
 * the input for the readers that take C strings.
 *
 * A target is one LLVMFuzzerTestOneInput() that feeds its input to a real entry point of the
 * router library and checks properties that must hold for every input, not only "no crash":
 * determinism, the same result whatever the split, round trips. ASan and UBSan (the whole build is
 * compiled with them, -DKVR_FUZZ=ON) catch the memory and undefined-behaviour errors.
 */
#ifndef KVR_FUZZ_UTIL_H
#define KVR_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* libFuzzer's entry point: every target defines it. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len);

/* An invariant of the code under test; a failure aborts with where and what. */
#define FUZZ_CHECK(cond)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                 \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* The input as a malloc'd NUL-terminated string (len bytes, which may contain NULs); the caller
 * frees it. */
static inline char *fuzz_strndup(const uint8_t *data, size_t len) {
  char *s = malloc(len + 1);
  if (s == NULL)
    abort();
  if (len)
    memcpy(s, data, len);
  s[len] = '\0';
  return s;
}

/* splitmix64, for chunkings derived from the input (reproducible from the crash file alone). */
static inline uint64_t fuzz_rand(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

/* FNV-1a of the input: the seed of its chunkings. */
static inline uint64_t fuzz_seed(const uint8_t *data, size_t len) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < len; i++)
    h = (h ^ data[i]) * UINT64_C(0x100000001b3);
  return h;
}

#endif

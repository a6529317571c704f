/* test_trace_out.c -- `serve --trace-out` (src/serve/trace_out.c): ids remapped in first-seen
 * order, shared exactly as far as the router's hashed blocks go (an unhashed tail is never
 * shared), one id per trace block of the counted tokens, rotation to FILE.1 with fresh ids and
 * time, and a file that reads back with proto/trace.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "proto/trace.h"
#include "serve/trace_out.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Router blocks of 64 bytes, trace blocks of 32 tokens = 128 bytes = 2 router blocks. */
#define BC 64
#define BT 32

typedef struct {
  char path[64];
  kvr_trace_rec_t recs[16];
  size_t n;
} fx_t;

static void fx_read(fx_t *f, const char *path) {
  FILE *in = fopen(path, "r");
  assert_non_null(in);
  char line[4096], err[200];
  f->n = 0;
  while (fgets(line, sizeof line, in) && f->n < 16)
    assert_int_equal(kvr_trace_parse(line, strlen(line), &f->recs[f->n++], err, sizeof err), 0);
  fclose(in);
}

static void fx_free(fx_t *f) {
  for (size_t i = 0; i < f->n; i++)
    kvr_trace_rec_free(&f->recs[i]);
  f->n = 0;
}

static void ids_are(const kvr_trace_rec_t *r, const uint64_t *want, size_t n) {
  assert_int_equal(r->nhash, n);
  for (size_t i = 0; i < n; i++)
    if (r->hash_ids[i] != want[i])
      fail_msg("id %zu is %llu, want %llu", i, (unsigned long long)r->hash_ids[i],
               (unsigned long long)want[i]);
}

static void test_ids_shared_as_far_as_hashed(void **state) {
  (void)state;
  fx_t f;
  snprintf(f.path, sizeof f.path, "/tmp/kvr_trace_%d.jsonl", (int)getpid());
  char err[200];
  kvr_trace_out_t *t = kvr_trace_out_open(f.path, 0, BC, BT, 1000000000ull, err, sizeof err);
  assert_non_null(t);
  /* A: 6 router blocks (3 trace blocks), ends on a block boundary, usage counted 96 tokens. */
  uint64_t a[] = {11, 12, 13, 14, 15, 16};
  kvr_trace_out_req_t ra = {.arrival_ns = 1500000000ull,
                            .blocks = a,
                            .nblocks = 6,
                            .prompt_chars = 6 * BC,
                            .input_tokens = 96,
                            .output_tokens = 5,
                            .from_usage = true};
  assert_int_equal(kvr_trace_out_write(t, &ra, 2000000000ull), 0);
  /* B: the same first 4 router blocks, then its own; 5 blocks and an unhashed tail of 10 bytes;
   * estimated 83 tokens = 3 trace blocks: the third holds the tail, so it is fresh. */
  uint64_t b[] = {11, 12, 13, 14, 99};
  kvr_trace_out_req_t rb = {.arrival_ns = 1600000000ull,
                            .blocks = b,
                            .nblocks = 5,
                            .prompt_chars = 5 * BC + 10,
                            .input_tokens = 83,
                            .output_tokens = 2};
  assert_int_equal(kvr_trace_out_write(t, &rb, 2000000000ull), 0);
  /* C: the worker counted more tokens than the router hashed: extra trace blocks are fresh. */
  uint64_t c[] = {11, 12};
  kvr_trace_out_req_t rc = {.arrival_ns = 1700000000ull,
                            .blocks = c,
                            .nblocks = 2,
                            .prompt_chars = 2 * BC,
                            .input_tokens = 70,
                            .output_tokens = 1,
                            .from_usage = true};
  assert_int_equal(kvr_trace_out_write(t, &rc, 2000000000ull), 0);
  /* D: a prompt shorter than one router block: one fresh id. */
  kvr_trace_out_req_t rd = {.arrival_ns = 1800000000ull,
                            .nblocks = 0,
                            .prompt_chars = 10,
                            .input_tokens = 3,
                            .output_tokens = 1};
  assert_int_equal(kvr_trace_out_write(t, &rd, 2000000000ull), 0);
  assert_int_equal(kvr_trace_out_lines(t), 4);
  kvr_trace_out_close(t);
  fx_read(&f, f.path);
  assert_int_equal(f.n, 4);
  ids_are(&f.recs[0], (uint64_t[]){0, 1, 2}, 3);
  ids_are(&f.recs[1], (uint64_t[]){0, 1, 3}, 3);
  ids_are(&f.recs[2], (uint64_t[]){0, 4, 5}, 3);
  ids_are(&f.recs[3], (uint64_t[]){6}, 1);
  assert_true(f.recs[0].timestamp_ms == 500 && f.recs[3].timestamp_ms == 800);
  assert_int_equal(f.recs[0].tokens, KVR_TRACE_TOKENS_USAGE);
  assert_int_equal(f.recs[1].tokens, KVR_TRACE_TOKENS_ESTIMATE);
  assert_int_equal(f.recs[1].input_length, 83);
  fx_free(&f);
  unlink(f.path);
}

static void test_rotation(void **state) {
  (void)state;
  fx_t f;
  char rotated[80], err[200];
  snprintf(f.path, sizeof f.path, "/tmp/kvr_trace_rot_%d.jsonl", (int)getpid());
  snprintf(rotated, sizeof rotated, "%s.1", f.path);
  kvr_trace_out_t *t = kvr_trace_out_open(f.path, 150, BC, BT, 0, err, sizeof err);
  assert_non_null(t);
  uint64_t a[] = {21, 22};
  kvr_trace_out_req_t r = {.arrival_ns = 1000000ull,
                           .blocks = a,
                           .nblocks = 2,
                           .prompt_chars = 2 * BC,
                           .input_tokens = 32,
                           .output_tokens = 1};
  /* About 100 bytes a line: the third write finds the file past 150 bytes and rotates. */
  for (int i = 0; i < 3; i++)
    assert_int_equal(kvr_trace_out_write(t, &r, 5000000ull + (uint64_t)i), 0);
  kvr_trace_out_close(t);
  fx_read(&f, rotated);
  size_t old = f.n;
  assert_int_equal(old, 2);
  fx_free(&f);
  fx_read(&f, f.path);
  assert_int_equal(old + f.n, 3);
  /* The new file numbers ids from 0 and times from its own start. */
  ids_are(&f.recs[0], (uint64_t[]){0}, 1);
  assert_true(f.recs[0].timestamp_ms == 0);
  fx_free(&f);
  unlink(f.path);
  unlink(rotated);
  assert_null(kvr_trace_out_open("/nonexistent-dir/x", 0, BC, BT, 0, err, sizeof err));
  assert_non_null(strstr(err, "/nonexistent-dir/x"));
  kvr_trace_out_close(NULL);
}

KVR_TEST_MAIN(cmocka_unit_test(test_ids_shared_as_far_as_hashed), cmocka_unit_test(test_rotation))

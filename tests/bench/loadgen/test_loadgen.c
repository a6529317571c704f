/* test_loadgen.c -- the load generator's pure parts: the steady-state rule that makes each send of
 * a concurrency level warm-up, measured or cool-down (kvr_loadgen_phase). Levels against real
 * servers are tested by tests/router/test_bench_closedloop.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/loadgen/loadgen.h"

/* opts with warmup sends, warmup_s seconds and num_prompts measured requests. */
static kvr_loadgen_opts_t opts(unsigned warmup, double warmup_s, size_t num_prompts) {
  kvr_loadgen_opts_t o;
  kvr_loadgen_opts_default(&o);
  o.warmup = warmup;
  o.warmup_s = warmup_s;
  o.num_prompts = num_prompts;
  return o;
}

static kvr_loadgen_phase_t phase(const kvr_loadgen_opts_t *o, bool first, size_t sent,
                                 double since_s, size_t measured_sent) {
  kvr_loadgen_send_t s = {first, sent, since_s, measured_sent};
  return kvr_loadgen_phase(o, &s);
}

/* Without --warmup/--warmup-s only each user's first request is warm-up. */
static void test_user_first_is_always_warmup(void **state) {
  (void)state;
  kvr_loadgen_opts_t o = opts(0, 0, 10);
  assert_int_equal(phase(&o, true, 0, 0, 0), KVR_LOADGEN_WARMUP);
  /* However late, and even once the measured ones are all sent. */
  assert_int_equal(phase(&o, true, 500, 1e4, 0), KVR_LOADGEN_WARMUP);
  assert_int_equal(phase(&o, true, 500, 1e4, 10), KVR_LOADGEN_WARMUP);
  assert_int_equal(phase(&o, false, 4, 0.5, 0), KVR_LOADGEN_MEASURED);
}

/* --warmup N: the first N sends; --warmup-s S: any send before S simulated seconds. */
static void test_warmup_count_and_time(void **state) {
  (void)state;
  kvr_loadgen_opts_t o = opts(8, 0, 10);
  assert_int_equal(phase(&o, false, 7, 100, 0), KVR_LOADGEN_WARMUP);
  assert_int_equal(phase(&o, false, 8, 100, 0), KVR_LOADGEN_MEASURED);
  o = opts(0, 30, 10);
  assert_int_equal(phase(&o, false, 1000, 29.999, 0), KVR_LOADGEN_WARMUP);
  assert_int_equal(phase(&o, false, 1000, 30, 0), KVR_LOADGEN_MEASURED);
  o = opts(8, 30, 10); /* either rule makes a warm-up */
  assert_int_equal(phase(&o, false, 9, 10, 0), KVR_LOADGEN_WARMUP);
  assert_int_equal(phase(&o, false, 2, 40, 0), KVR_LOADGEN_WARMUP);
  assert_int_equal(phase(&o, false, 9, 40, 0), KVR_LOADGEN_MEASURED);
}

/* The next num_prompts sends are measured, every later one is cool-down. */
static void test_measured_then_cooldown(void **state) {
  (void)state;
  kvr_loadgen_opts_t o = opts(2, 0, 3);
  kvr_loadgen_phase_t want[] = {KVR_LOADGEN_WARMUP,   KVR_LOADGEN_WARMUP,   KVR_LOADGEN_MEASURED,
                                KVR_LOADGEN_MEASURED, KVR_LOADGEN_MEASURED, KVR_LOADGEN_COOLDOWN,
                                KVR_LOADGEN_COOLDOWN};
  size_t measured = 0;
  for (size_t sent = 0; sent < KVR_ARRAY_SIZE(want); sent++) {
    kvr_loadgen_phase_t p = phase(&o, false, sent, (double)sent, measured);
    assert_int_equal(p, want[sent]);
    measured += p == KVR_LOADGEN_MEASURED;
  }
  assert_int_equal(measured, 3);
}

KVR_TEST_MAIN(cmocka_unit_test(test_user_first_is_always_warmup),
              cmocka_unit_test(test_warmup_count_and_time),
              cmocka_unit_test(test_measured_then_cooldown))

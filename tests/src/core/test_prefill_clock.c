/* test_prefill_clock.c -- the per-worker prefill clock (prefill_clock.h): no decay before a rate is
 * measured, rate samples only from lone prefills of useful size, the backlog draining with time,
 * FCFS stacking of dispatches, the reset at each first token, and the floor once overdue. Times are
 * passed in, so nothing here depends on the machine's clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "core/prefill_clock.h"

#define MS 1000000ull /* ns */

static void test_no_rate_means_no_decay(void **state) {
  (void)state;
  kvr_prefill_clock_t c = {0};
  kvr_prefill_clock_dispatch(&c, 7000, 1000 * MS);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 7000, 1000 * MS), 7000);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 7000, 60000 * MS), 7000);
  /* Short or crowded prefills are not samples: fixed step costs or other requests' work would
   * dominate their time. */
  kvr_prefill_clock_first_token(&c, 300, 0, true, 7000, 100 * MS);
  kvr_prefill_clock_first_token(&c, 4000, 0, false, 7000, 400 * MS);
  assert_int_equal(c.samples, 0);
  assert_true(c.rate == 0);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 0, 0), 0);
}

static void test_backlog_drains_at_the_measured_rate(void **state) {
  (void)state;
  kvr_prefill_clock_t c = {0};
  /* 5,000 tokens alone in 500 ms: 10,000 tokens/s. */
  kvr_prefill_clock_dispatch(&c, 5000, 0);
  kvr_prefill_clock_first_token(&c, 5000, 0, true, 0, 500 * MS);
  assert_int_equal(c.samples, 1);
  assert_true(c.rate > 9999 && c.rate < 10001);
  /* 7,000 tokens dispatched at t = 1 s: all ahead at once, half after 350 ms, a tenth floor
   * near and past the expected end. */
  kvr_prefill_clock_dispatch(&c, 7000, 1000 * MS);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 7000, 1000 * MS), 7000);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 7000, 1350 * MS), 3500);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 7000, 1690 * MS), 700);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 7000, 5000 * MS), 700);
  /* A second dispatch at 1.2 s queues behind the first (FCFS): it ends at 1.7 + 0.3 s. */
  kvr_prefill_clock_dispatch(&c, 3000, 1200 * MS);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 10000, 1200 * MS), 8000);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 10000, 1900 * MS), 1000);
  /* The first finished late, at 1.8 s: only the second's 3,000 tokens remain, from then on. */
  kvr_prefill_clock_first_token(&c, 7000, 1000 * MS, true, 3000, 1800 * MS);
  /* The late sample pulled the rate down: 7,000 / 0.8 s = 8,750, EWMA weight 0.2: 9,750. */
  assert_int_equal(c.samples, 2);
  assert_true(c.rate > 9749 && c.rate < 9751);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 3000, 1800 * MS), 3000);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 3000, 1900 * MS), 3000 - 975);
}

static void test_idle_worker_ranks_ahead_of_an_overdue_one(void **state) {
  (void)state;
  kvr_prefill_clock_t c = {0};
  kvr_prefill_clock_first_token(&c, 1000, 0, true, 0, 100 * MS); /* 10,000 tokens/s */
  kvr_prefill_clock_dispatch(&c, 2000, 200 * MS);
  uint64_t overdue = kvr_prefill_clock_backlog(&c, 2000, 10000 * MS);
  assert_true(overdue > 0);
  assert_true(overdue < 2000);
  assert_int_equal(kvr_prefill_clock_backlog(&c, 0, 10000 * MS), 0);
}

KVR_TEST_MAIN(cmocka_unit_test(test_no_rate_means_no_decay),
              cmocka_unit_test(test_backlog_drains_at_the_measured_rate),
              cmocka_unit_test(test_idle_worker_ranks_ahead_of_an_overdue_one))

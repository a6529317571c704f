/* test_quantile.c -- golden values of the one percentile definition (src/quantile.h): numpy's
 * 'linear' method, as np.percentile computes it. Every expected value below is what numpy 1.24
 * (Debian's python3-numpy) printed for np.percentile(x, p), compared exactly: the shortest decimal
 * that round-trips names the very double numpy returned. The first ones are also easy by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "src/quantile.h"

#include <math.h>

#define SAME(got, want) assert_true((got) == (want))

/* By hand: h = (n - 1) p / 100, then interpolate between x[floor h] and the next value. */
static void test_by_hand(void **state) {
  (void)state;
  double four[] = {1, 2, 3, 4};
  SAME(kvr_quantile(four, 4, 50), 2.5);  /* h = 1.5: halfway between 2 and 3 */
  SAME(kvr_quantile(four, 4, 25), 1.75); /* h = 0.75 */
  SAME(kvr_quantile(four, 4, 75), 3.25); /* h = 2.25 */
  SAME(kvr_quantile(four, 4, 90), 3.7);  /* h = 2.7 */
  SAME(kvr_quantile(four, 4, 0), 1);
  SAME(kvr_quantile(four, 4, 100), 4);
  double one[] = {7};
  SAME(kvr_quantile(one, 1, 0), 7);
  SAME(kvr_quantile(one, 1, 50), 7);
  SAME(kvr_quantile(one, 1, 99), 7);
  SAME(kvr_quantile(one, 1, 100), 7);
  SAME(kvr_quantile(NULL, 0, 99), 0);
  /* Out of range clamps to the ends. */
  SAME(kvr_quantile(four, 4, -5), 1);
  SAME(kvr_quantile(four, 4, 150), 4);
  SAME(kvr_quantile(four, 4, NAN), 1);
}

static void test_numpy_1_to_100(void **state) {
  (void)state;
  double v[100];
  for (int i = 0; i < 100; i++)
    v[i] = i + 1;
  SAME(kvr_quantile(v, 100, 0), 1.0);
  SAME(kvr_quantile(v, 100, 50), 50.5);
  SAME(kvr_quantile(v, 100, 90), 90.10000000000001);
  SAME(kvr_quantile(v, 100, 95), 95.05);
  SAME(kvr_quantile(v, 100, 99), 99.01);
  SAME(kvr_quantile(v, 100, 99.9), 99.90100000000001);
  SAME(kvr_quantile(v, 100, 100), 100.0);
  SAME(kvr_quantile(v, 100, 29), 29.709999999999997);
  SAME(kvr_quantile(v, 100, 33.3), 33.967);
}

/* Values of very different sizes: the interpolation from the nearer neighbour matters. */
static void test_numpy_irregular(void **state) {
  (void)state;
  double v[] = {0.1, 0.2, 0.30000000000000004, 1e3, 1e9};
  SAME(kvr_quantile(v, 5, 10), 0.14);
  SAME(kvr_quantile(v, 5, 37.5), 0.25);
  SAME(kvr_quantile(v, 5, 62.5), 500.15);
  SAME(kvr_quantile(v, 5, 87.5), 500000500.0);
  SAME(kvr_quantile(v, 5, 99), 960000040.0);
  SAME(kvr_quantile(v, 5, 99.99), 999600000.3999996);
}

/* numpy computes h as (p / 100) (n - 1): for p = 29 and n = 101 that is 28.999999999999996, not
 * 29, so the result sits a hair below x[29] = 841. kvr_quantile agrees with numpy there too. */
static void test_numpy_rank_rounding(void **state) {
  (void)state;
  double sq[101];
  for (int i = 0; i <= 100; i++)
    sq[i] = (double)(i * i);
  SAME(kvr_quantile(sq, 101, 29), 840.9999999999998);
  SAME(kvr_quantile(sq, 101, 57), 3248.999999999999);
  SAME(kvr_quantile(sq, 101, 58), 3363.999999999999);
  SAME(kvr_quantile(sq, 101, 99), 9801.0);
  size_t lo, hi;
  double frac;
  kvr_quantile_pos(101, 29, &lo, &hi, &frac);
  assert_int_equal(lo, 28);
  assert_int_equal(hi, 29);
  assert_true(frac > 0.999 && frac < 1);
  kvr_quantile_pos(4, 100, &lo, &hi, &frac);
  assert_int_equal(lo, 3);
  assert_int_equal(hi, 3);
  SAME(frac, 0);
}

static void test_u64(void **state) {
  (void)state;
  uint64_t v[] = {100, 200, 300, 1000};
  SAME(kvr_quantile_u64(v, 4, 50), 250.0);
  SAME(kvr_quantile_u64(v, 4, 99), 978.9999999999998);
  SAME(kvr_quantile_u64(v, 4, 100), 1000);
  SAME(kvr_quantile_u64(NULL, 0, 50), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_by_hand),
      cmocka_unit_test(test_numpy_1_to_100),
      cmocka_unit_test(test_numpy_irregular),
      cmocka_unit_test(test_numpy_rank_rounding),
      cmocka_unit_test(test_u64),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

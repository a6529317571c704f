/* test_quantile.c -- golden values of the one percentile definition (src/base/quantile.h): numpy's
 * 'linear' method, as np.percentile computes it. Every expected value below is what numpy 1.24
 * (Debian's python3-numpy) printed for np.percentile(x, p), compared exactly: the shortest decimal
 * that round-trips names the very double numpy returned. The first ones are also easy by hand.
 * kvr_quantile_sort is checked bit for bit against the qsort it replaced. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "base/quantile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SAME(got, want) assert_true((got) == (want))

/* One expected value: kvr_quantile(v, n, p) == want. */
typedef struct {
  double p, want;
} pq_t;

/* Checks every case of cases against kvr_quantile(v, n, ·). */
static void check_cases(const double *v, size_t n, const pq_t *cases, size_t ncases) {
  for (size_t i = 0; i < ncases; i++)
    SAME(kvr_quantile(v, n, cases[i].p), cases[i].want);
}
#define CHECK(v, n, cases) check_cases(v, n, cases, sizeof(cases) / sizeof((cases)[0]))

/* By hand: h = (n - 1) p / 100, then interpolate between x[floor h] and the next value. */
static void test_by_hand(void **state) {
  (void)state;
  double four[] = {1, 2, 3, 4};
  static const pq_t four_cases[] = {
      {50, 2.5},  /* h = 1.5: halfway between 2 and 3 */
      {25, 1.75}, /* h = 0.75 */
      {75, 3.25}, /* h = 2.25 */
      {90, 3.7},  /* h = 2.7 */
      {0, 1},     {100, 4},
  };
  CHECK(four, 4, four_cases);
  double one[] = {7};
  static const pq_t one_cases[] = {{0, 7}, {50, 7}, {99, 7}, {100, 7}};
  CHECK(one, 1, one_cases);
  SAME(kvr_quantile(NULL, 0, 99), 0);
  /* Out of range clamps to the ends. */
  const pq_t out_cases[] = {{-5, 1}, {150, 4}, {NAN, 1}};
  CHECK(four, 4, out_cases);
}

static void test_numpy_1_to_100(void **state) {
  (void)state;
  double v[100];
  for (int i = 0; i < 100; i++)
    v[i] = i + 1;
  static const pq_t cases[] = {
      {0, 1.0},
      {50, 50.5},
      {90, 90.10000000000001},
      {95, 95.05},
      {99, 99.01},
      {99.9, 99.90100000000001},
      {100, 100.0},
      {29, 29.709999999999997},
      {33.3, 33.967},
  };
  CHECK(v, 100, cases);
}

/* Values of very different sizes: the interpolation from the nearer neighbour matters. */
static void test_numpy_irregular(void **state) {
  (void)state;
  double v[] = {0.1, 0.2, 0.30000000000000004, 1e3, 1e9};
  static const pq_t cases[] = {
      {10, 0.14},          {37.5, 0.25},      {62.5, 500.15},
      {87.5, 500000500.0}, {99, 960000040.0}, {99.99, 999600000.3999996},
  };
  CHECK(v, 5, cases);
}

static void test_numpy_rank_rounding(void **state) {
  (void)state;
  double sq[101];
  for (int i = 0; i <= 100; i++)
    sq[i] = (double)(i * i);
  static const pq_t cases[] = {
      {29, 840.9999999999998}, {57, 3248.999999999999}, {58, 3363.999999999999}, {99, 9801.0}};
  CHECK(sq, 101, cases);
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

/* kvr_quantile_sort: ascending, duplicates and signs kept, then read by kvr_quantile. */
static void test_sort(void **state) {
  (void)state;
  double v[] = {3.5, -1, 2, 3.5, 0, -7.25, 2};
  const double want[] = {-7.25, -1, 0, 2, 2, 3.5, 3.5};
  kvr_quantile_sort(v, 7);
  for (size_t i = 0; i < 7; i++)
    assert_true(v[i] == want[i]);
  assert_true(kvr_quantile(v, 7, 50) == 2);
  kvr_quantile_sort(v, 0); /* nothing to do */
}

static int cmp_ref(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* kvr_quantile_sort against what it replaced, qsort by value (glibc's: a stable merge sort), bit
 * for bit: random arrays of every length to 300 and a few long ones, values drawn from small sets
 * (many ties), both zeros, infinities, subnormals and wide random doubles; one in 10 sorted
 * already, one in 50 with a NaN. */
static void test_sort_equals_qsort(void **state) {
  (void)state;
  uint64_t rng = 7;
  static const double pool[] = {0.0,   -0.0,   1.5,      -1.5,      2.0,  1e-310, -1e-310,
                                1e300, -1e300, INFINITY, -INFINITY, 3.25, 7.0,    0.1};
  for (int round = 0; round < 3000; round++) {
    size_t n = round < 2900 ? (size_t)(kvr_splitmix64(&rng) % 300) : 20000 + (size_t)round;
    double *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    for (size_t i = 0; i < n; i++) {
      uint64_t r = kvr_splitmix64(&rng);
      if (r % 3 == 0) {
        a[i] = pool[(r >> 8) % KVR_ARRAY_SIZE(pool)];
      } else if (r % 3 == 1) {
        a[i] = (double)((r >> 8) % 1000) / 8.0 * ((r >> 40) % 2 ? 1 : -1);
      } else {
        uint64_t u = kvr_splitmix64(&rng);
        memcpy(&a[i], &u, sizeof u);
        if (isnan(a[i]))
          a[i] = (double)(u >> 11);
      }
    }
    if (round % 10 == 3) /* sorted already, as the stats' second sort of an array finds it */
      qsort(a, n, sizeof *a, cmp_ref);
    if (n > 0 && round % 50 == 49)
      a[kvr_splitmix64(&rng) % n] = NAN;
    memcpy(b, a, n * sizeof *a);
    kvr_quantile_sort(a, n);
    qsort(b, n, sizeof *b, cmp_ref);
    if (n > 0 && memcmp(a, b, n * sizeof *a) != 0)
      fail_msg("round %d: %zu values sorted differently", round, n);
    free(a);
    free(b);
  }
}

KVR_TEST_MAIN(cmocka_unit_test(test_by_hand), cmocka_unit_test(test_numpy_1_to_100),
              cmocka_unit_test(test_numpy_irregular), cmocka_unit_test(test_numpy_rank_rounding),
              cmocka_unit_test(test_u64), cmocka_unit_test(test_sort),
              cmocka_unit_test(test_sort_equals_qsort))

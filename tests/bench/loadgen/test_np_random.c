/* test_np_random.c -- numpy's legacy stream and vllm bench serve's schedule, against numpy itself.
 *
 * The expected values were printed by numpy 1.24.2 (Debian 12's python3-numpy), e.g.
 *   np.random.seed(0); [np.random.gamma(2.5, 1.0) for _ in range(5)]
 * and the schedule by the lines of vllm/benchmarks/serve.py get_request() (seed, gamma gaps,
 * cumulative sum, scaled so the last is n / rate). Doubles must agree to the last bit or two: a
 * different draw order, seeding or rejection step gives different values, not nearby ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "bench/loadgen/np_random.h"

#include <math.h>

static void same(double got, double want) {
  if (fabs(got - want) > 4e-16 * fabs(want))
    fail_msg("got %.17g, numpy gives %.17g", got, want);
}

static void test_random_sample(void **state) {
  (void)state;
  kvr_np_random_t r;
  kvr_np_random_seed(&r, 0);
  static const double want[] = {0.5488135039273248, 0.7151893663724195, 0.6027633760716439,
                                0.5448831829968969};
  for (size_t i = 0; i < 4; i++)
    same(kvr_np_random_sample(&r), want[i]);
  /* Past the first regeneration of the 624-word state (each double takes two words). */
  kvr_np_random_seed(&r, 0);
  double x = 0;
  for (int i = 0; i < 1000; i++)
    x = kvr_np_random_sample(&r);
  same(x, 0.6771411441114241);
  kvr_np_random_seed(&r, 4294967295u);
  same(kvr_np_random_sample(&r), 0.0976320289940138);
  same(kvr_np_random_sample(&r), 0.9123828453026218);
}

static void test_gamma(void **state) {
  (void)state;
  kvr_np_random_t r;
  static const double g1[] = {1.59174901632622, 2.5118615259316757, 1.8464462916081377,
                              1.5744023046345414};
  kvr_np_random_seed(&r, 0);
  for (size_t i = 0; i < 4; i++)
    same(kvr_np_random_gamma(&r, 1.0, 2.0), g1[i]);
  static const double g03[] = {0.13533681858277738, 0.1849933806609573, 0.057109334869726934,
                               0.06361341880419374};
  kvr_np_random_seed(&r, 0);
  for (size_t i = 0; i < 4; i++)
    same(kvr_np_random_gamma(&r, 0.3, 1.0), g03[i]);
  /* Shape > 1 draws normals in pairs and keeps the second: five draws use the cache. */
  static const double g25[] = {5.93870070324508, 2.8106696416847097, 6.242122324898662,
                               1.0230247220453648, 2.018256337283051};
  kvr_np_random_seed(&r, 0);
  for (size_t i = 0; i < 5; i++)
    same(kvr_np_random_gamma(&r, 2.5, 1.0), g25[i]);
  static const double s7[] = {0.00018846862401596527, 0.06401262465525534, 0.01247819975509855};
  kvr_np_random_seed(&r, 7);
  for (size_t i = 0; i < 3; i++)
    same(kvr_np_random_gamma(&r, 0.3, 1.0), s7[i]);
}

static void test_vllm_schedule(void **state) {
  (void)state;
  double t[300];
  kvr_np_vllm_schedule(0, 2.0, 1.0, 300, t);
  same(t[0], 0.39187162720896873); /* the first request waits its own gap */
  same(t[1], 1.0102651386196373);
  same(t[149], 75.02908159503433);
  same(t[299], 150.0);
  for (size_t i = 1; i < 300; i++)
    assert_true(t[i] >= t[i - 1]);
  /* Poisson at another rate is the same draw scaled: the seed's columns share one schedule. */
  double u[300];
  kvr_np_vllm_schedule(0, 0.5, 1.0, 300, u);
  for (size_t i = 0; i < 300; i++)
    same(u[i], 4.0 * t[i]);
  double b[50];
  kvr_np_vllm_schedule(0, 1.5, 0.3, 50, b);
  same(b[0], 0.32802053001469367);
  same(b[24], 19.730037463427372);
  same(b[49], 33.333333333333336);
}

KVR_TEST_MAIN(cmocka_unit_test(test_random_sample), cmocka_unit_test(test_gamma),
              cmocka_unit_test(test_vllm_schedule))

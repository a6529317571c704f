/* test_monitor.c -- the bench monitor's Prometheus sample reader: sums across label sets, the
 * largest sample, label values holding spaces, names that only share a prefix, absent series. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "bench/loadgen/monitor.h"

#include <string.h>

static const char page[] =
    "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
    "# TYPE vllm:num_preemptions_total counter\n"
    "vllm:num_preemptions_total{engine=\"0\",model_name=\"a b\"} 7\n"
    "vllm:num_preemptions_total{engine=\"1\",model_name=\"a b\"} 5\n"
    "vllm:num_preemptions_total_created{engine=\"0\"} 1.7e9\n"
    "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n"
    "vllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n"
    "vllm:num_requests_running 3";

static void test_prom_value(void **state) {
  (void)state;
  double sum = -1, max = -1;
  size_t n = strlen(page);
  assert_int_equal(kvr_monitor_prom_value(page, n, "vllm:num_preemptions_total", &sum, &max), 2);
  assert_true(sum == 12 && max == 7);
  assert_int_equal(kvr_monitor_prom_value(page, n, "vllm:kv_cache_usage_perc", &sum, &max), 2);
  assert_true(sum == 1.0 && max == 0.75);
  /* the last line has no newline and no labels */
  assert_int_equal(kvr_monitor_prom_value(page, n, "vllm:num_requests_running", &sum, &max), 1);
  assert_true(sum == 3 && max == 3);
  /* absent: the outputs are left alone */
  sum = max = -1;
  assert_int_equal(kvr_monitor_prom_value(page, n, "vllm:gpu_cache_usage_perc", &sum, &max), 0);
  assert_true(sum == -1 && max == -1);
  assert_int_equal(kvr_monitor_prom_value(page, n, "vllm:num_preemptions", &sum, &max), 0);
  assert_int_equal(kvr_monitor_prom_value("", 0, "vllm:num_preemptions_total", &sum, &max), 0);
  /* an optional timestamp after the value is not the value */
  const char ts[] = "vllm:num_preemptions_total{engine=\"0\"} 4 1700000000000\n";
  assert_int_equal(kvr_monitor_prom_value(ts, strlen(ts), "vllm:num_preemptions_total", &sum, &max),
                   1);
  assert_true(sum == 4 && max == 4);
}

KVR_TEST_MAIN(cmocka_unit_test(test_prom_value))

/* test_demo_plan.c -- the demo's plan without a process (bench/run/demo_plan.c): the rules between
 * its options, the preflight of --ab and of the bench options after -- (through the bench's own
 * table and rules, one virtual request), the bench command lines of the real run's twin, whose
 * own list options give way to the caller's, the rate the real run takes from step 1's limits
 * (demo_virtual.c), and the p99 interval of the agreement (demo_agree.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/run/demo.h"
#include "bench/run/demo_int.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static void expect_new_fails(const kvr_demo_opts_t *o, const char *want) {
  kvr_demo_t *d = (kvr_demo_t *)o;
  char err[256] = "";
  assert_int_equal(kvr_demo_new(o, &d, err, sizeof(err)), KVR_EINVAL);
  assert_null(d);
  assert_string_equal(err, want);
}

static void test_rules(void **state) {
  (void)state;
  kvr_demo_opts_t o;
  kvr_demo_opts_default(&o);
  o.worker_blocks[0] = 100;
  o.worker_blocks[1] = 200;
  o.nworker_blocks = 2;
  expect_new_fails(&o, "--worker-blocks: 2 values for 4 workers (give one per worker)");
  kvr_demo_opts_default(&o);
  o.workload = "bursty"; /* a scenario, but not one workload */
  expect_new_fails(&o, "--workload: 'bursty' is not one of multiturn, documents, control, "
                       "agentic, hot-prefix");
  kvr_demo_opts_default(&o);
  kvr_demo_t *d = NULL;
  char err[256] = "";
  assert_int_equal(kvr_demo_new(&o, &d, err, sizeof(err)), 0);
  assert_string_equal(d->warmup_s, "120"); /* multiturn's warm-up in the study */
  assert_string_equal(d->scale_s, "10");
  assert_string_equal(d->scrape_s, "100");
  assert_string_equal(d->stale_s, "500");
  assert_string_equal(d->agree_out, "results/demo/agreement-virtual");
  kvr_demo_free(d);
}

static void expect_preflight(char **extra, int nextra, const char *ab, const char *want) {
  kvr_demo_opts_t o;
  kvr_demo_opts_default(&o);
  o.extra = extra;
  o.nextra = nextra;
  o.ab = ab;
  kvr_demo_t *d = NULL;
  char err[512] = "";
  assert_int_equal(kvr_demo_new(&o, &d, err, sizeof(err)), 0);
  int rc = kvr_demo_preflight(d, err, sizeof(err));
  if (want == NULL) {
    assert_int_equal(rc, 0);
  } else {
    assert_int_equal(rc, KVR_EINVAL);
    assert_true(strncmp(err, want, strlen(want)) == 0);
  }
  kvr_demo_free(d);
}

static void test_preflight(void **state) {
  (void)state;
  expect_preflight(NULL, 0, "round_robin,nope", "--ab: unknown policy 'nope' (valid: ");
  char *ab[] = {"--ab=nope"};
  expect_preflight(ab, 1, "round_robin,kv_aware", "after --: --ab: unknown policy 'nope'");
  char *both[] = {"--rates", "6", "--concurrency", "4"};
  expect_preflight(both, 4, "round_robin,kv_aware",
                   "after --: --concurrency: cannot be combined with --rates");
  char *bogus[] = {"--bogus"};
  expect_preflight(bogus, 1, "round_robin,kv_aware", "after --: --bogus: unknown option");
  char *fine[] = {"--rates", "6", "--ab", "round_robin,least_load", "--labels", "a,b"};
  expect_preflight(fine, 6, "round_robin,kv_aware", NULL);
}

static void join(char **argv, int argc, char *out, size_t size) {
  out[0] = '\0';
  for (int i = 0; i < argc; i++)
    snprintf(out + strlen(out), size - strlen(out), "%s%s", i ? " " : "", argv[i]);
}

static void test_twin_command_line(void **state) {
  (void)state;
  kvr_demo_opts_t o;
  kvr_demo_opts_default(&o);
  o.quick = true;
  kvr_demo_t *d = NULL;
  char err[256] = "", line[2048];
  assert_int_equal(kvr_demo_new(&o, &d, err, sizeof(err)), 0);
  snprintf(d->rates_s, sizeof(d->rates_s), "5.25");
  char *a[160];
  int n = kvr__demo_bench_args(d, true, a, NULL, NULL);
  assert_null(a[n]);
  join(a, n, line, sizeof(line));
  assert_string_equal(line, "bench --virtual --workers 4 --ab round_robin,kv_aware --workload "
                            "multiturn --seed 42 --out results/demo/agreement-virtual --title "
                            "kvrouter demo: the real run's levels in virtual time "
                            "--multiturn-mode session --rates 5.25 --num-prompts 100 --warmup 0 "
                            "--warmup-s 120 --min-level-s 60 --cooldown-s 10");
  kvr_demo_free(d);
  /* The caller's --rates and --ab replace the demo's own: the demo leaves them out. */
  char *extra[] = {"--rates=6", "--ab", "round_robin,least_load"};
  o.extra = extra;
  o.nextra = 3;
  o.quick = false;
  assert_int_equal(kvr_demo_new(&o, &d, err, sizeof(err)), 0);
  n = kvr__demo_bench_args(d, true, a, NULL, NULL);
  join(a, n, line, sizeof(line));
  assert_null(strstr(line, "--rates "));
  assert_null(strstr(line, "round_robin,kv_aware"));
  assert_non_null(strstr(line, "--min-level-s 360 --cooldown-s 10 --rates=6 --ab "
                               "round_robin,least_load"));
  kvr_demo_free(d);
}

/* A run whose step 1 found these limits for round_robin and kv_aware (0: none). */
static void expect_rates(bool quick, double rr, double kv, const char *rates, const char *shown,
                         const char *why) {
  kvr_demo_opts_t o;
  kvr_demo_opts_default(&o);
  o.quick = quick;
  kvr_demo_t *d = NULL;
  char err[256] = "";
  assert_int_equal(kvr_demo_new(&o, &d, err, sizeof(err)), 0);
  d->have_sum = true;
  d->sum.scenarios[0] = "multiturn";
  d->sum.nscenarios = 1;
  d->sum.policies[0] = "round_robin";
  d->sum.policies[1] = "kv_aware";
  d->sum.npolicies = 2;
  d->sum.agg[0][0] = (kvr_study_agg_t){.mean = rr, .min = rr, .max = rr, .n = 1};
  d->sum.agg[0][1] = (kvr_study_agg_t){.mean = kv, .min = kv, .max = kv, .n = 1};
  kvr__demo_pick_rates(d);
  assert_string_equal(d->rates_s, rates);
  assert_string_equal(d->rates_disp, shown);
  assert_non_null(strstr(d->rates_why, why));
  kvr_demo_free(d);
}

static void test_rates(void **state) {
  (void)state;
  /* --quick: halfway, where the 60 s verdicts differ by a margin; the full demo's 360 s levels a
   * quarter of the way from the lower limit, where both queues hold still. */
  expect_rates(true, 5.875, 8.217, "7.046", "7.05", "halfway between");
  expect_rates(false, 5.875, 8.217, "6.4605", "6.46", "a quarter of the way");
  expect_rates(false, 8, 4, "5", "5.00", "a quarter of the way"); /* either order */
  expect_rates(false, 6, 6, "6", "6.00", "the virtual limit of both");
  expect_rates(true, 0, 5.5, "5.5", "5.50", "the one virtual limit found");
  expect_rates(false, 0, 0, "4", "4.00", "a fallback");
}

/* The 95% interval of a quantile by order statistics: ranks n*q -/+ 1.96 sd of a binomial count. */
static void test_q_interval(void **state) {
  (void)state;
  double v[1000], lo, hi;
  for (int i = 0; i < 1000; i++)
    v[i] = i + 1; /* the value of rank r is r */
  kvr__demo_q_interval(v, 1000, 0.99, &lo, &hi);
  assert_true(lo == 983 && hi == 997); /* 990 -/+ 6.17, outwards */
  kvr__demo_q_interval(v, 100, 0.99, &lo, &hi);
  assert_true(lo == 97 && hi == 100); /* clamped to the largest */
  kvr__demo_q_interval(v, 1, 0.99, &lo, &hi);
  assert_true(lo == 1 && hi == 1);
  kvr__demo_q_interval(v, 400, 0.90, &lo, &hi); /* --quick: 360 -/+ 11.76 */
  assert_true(lo == 348 && hi == 372);
}

/* The agreement quantile: p99, p90 under --quick; a level's figure at it. */
static void test_agree_q(void **state) {
  (void)state;
  kvr_demo_opts_t o = {0};
  kvr_demo_t d = {.cli = &o};
  const char *name = NULL;
  assert_true(kvr__demo_agree_q(&d, &name) == 0.99);
  assert_string_equal(name, "p99");
  o.quick = true;
  assert_true(kvr__demo_agree_q(&d, &name) == 0.90);
  assert_string_equal(name, "p90");
  kvr_dist_t s = {.p90 = 40, .p99 = 90};
  assert_true(kvr__demo_stat_at(&s, 0.90) == 40);
  assert_true(kvr__demo_stat_at(&s, 0.99) == 90);
}

/* The note on step 2's CPU: nothing when unread; the demo's run and wait, the cores other work
 * used; a warning only when they waited over KVR__DEMO_CPU_WAIT_WARN of their runnable time. */
static void test_cpu_note(void **state) {
  (void)state;
  kvr_demo_opts_t o = {0};
  kvr_demo_t d = {.cli = &o};
  kvr_buf_t b = KVR_BUF_INIT;
  kvr__demo_cpu_note(&d, &b);
  assert_int_equal(b.len, 0);
  d.cpu_known = true, d.cpu_wall_s = 40, d.cpu_busy_s = 55, d.cpu_run_s = 50, d.cpu_wait_s = 5;
  kvr__demo_cpu_note(&d, &b); /* others: 5 s over 40 s */
  assert_non_null(strstr(b.data, "ran 50.0 s on a core and waited 5.0 s for one (9% of"));
  assert_non_null(strstr(b.data, "other work used 0.12 cores"));
  assert_null(strstr(b.data, "Warning"));
  kvr_buf_free(&b);
  d.cpu_busy_s = 90; /* others: 40 s over 40 s, but the demo waited 9%: no warning */
  kvr__demo_cpu_note(&d, &b);
  assert_non_null(strstr(b.data, "other work used 1.00 cores"));
  assert_null(strstr(b.data, "Warning"));
  kvr_buf_free(&b);
  d.cpu_wait_s = 40; /* 44% of runnable time */
  kvr__demo_cpu_note(&d, &b);
  assert_non_null(strstr(b.data, "(44% of"));
  assert_non_null(strstr(b.data, "Warning: they waited over 40%"));
  kvr_buf_free(&b);
}

KVR_TEST_MAIN(cmocka_unit_test(test_rules), cmocka_unit_test(test_preflight),
              cmocka_unit_test(test_twin_command_line), cmocka_unit_test(test_rates),
              cmocka_unit_test(test_q_interval), cmocka_unit_test(test_agree_q),
              cmocka_unit_test(test_cpu_note))

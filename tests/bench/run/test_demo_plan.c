/* test_demo_plan.c -- the demo's plan without a process (bench/run/demo_plan.c): the rules between
 * its options, the preflight of --ab and of the bench options after -- (through the bench's own
 * table and rules, one virtual request), and the bench command lines of the real run's twin, whose
 * own list options give way to the caller's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/run/demo.h"
#include "bench/run/demo_int.h"

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
                            "--warmup-s 120 --min-level-s 30 --cooldown-s 10");
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
  assert_non_null(strstr(line, "--min-level-s 60 --cooldown-s 10 --rates=6 --ab "
                               "round_robin,least_load"));
  kvr_demo_free(d);
}

KVR_TEST_MAIN(cmocka_unit_test(test_rules), cmocka_unit_test(test_preflight),
              cmocka_unit_test(test_twin_command_line))

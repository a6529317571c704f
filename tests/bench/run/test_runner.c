/* test_runner.c -- the bench's run logic without a server: the defaults, the rules between
 * options and what they derive (--size-fleet's too), run labels, the max-SLO-load search as a state
 * machine (bracket, bisect, rounding, the cap and the floor), and set-up failures that leave no
 * handle open (a trace without a rate of its own under --size-fleet). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/run/runner.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_defaults(void **state) {
  (void)state;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  assert_null(o.lg.model);
  assert_int_equal(o.seed, 42);
  assert_true(o.slo.ttft_p99_ms == 1000 && o.slo.tpot_p99_ms == 60 && o.slo.max_failed_frac == 0);
  assert_true(o.cooldown_s == 30);
  assert_int_equal(o.reset_cache, -1);
  assert_true(o.search_start == 1 && o.search_max == 64 && o.search_res == 0.05);
  assert_string_equal(o.out, "results/bench");
  assert_int_equal(o.lg.num_prompts, 300);
  assert_false(o.size_fleet);
  assert_int_equal(o.size_fleet_max, 64);
}

static void expect_rule(kvr_runner_opts_t *o, const char *want) {
  char err[256] = "";
  assert_int_equal(kvr_runner_opts_check(o, err, sizeof(err)), KVR_EINVAL);
  assert_string_equal(err, want);
}

static void test_rules(void **state) {
  (void)state;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  expect_rule(&o, "no load given: give --rates, --concurrency or --search");
  o.nrates = 1;
  o.nconc = 1;
  expect_rule(&o, "--concurrency: cannot be combined with --rates");
  o.nconc = 0;
  char *ab[] = {"round_robin", "kv_aware"};
  o.ab[0] = ab[0];
  o.ab[1] = ab[1];
  o.nab = 2;
  expect_rule(&o, "--ab: needs --admin URL (or --virtual)");
  o.admin = "http://127.0.0.1:8001";
  o.labels[0] = "one";
  o.nlabels = 1;
  expect_rule(&o, "--labels: needs one label per run (one per --ab policy)");
  o.labels[0] = "a-label-of-sixty-four-characters-which-is-one-more-than-allowed-x";
  expect_rule(&o, "--labels: 'a-label-of-sixty-four-characters-which-is-one-more-than-allowed-x' "
                  "is longer than 63 characters");
  o.nlabels = 0;
  o.nrates = 0;
  o.conc[0] = 8;
  o.nconc = 1;
  o.lg.sessions = true;
  expect_rule(&o, "--sessions: applies to --rates only");
  o.lg.sessions = false;
  o.wl.out_min = 100;
  o.wl.out_max = 99;
  expect_rule(&o, "--output-max: must be >= --output-min");
}

/* --size-fleet: virtual time, one rate (a trace's own by default), a plain fleet of fresh clusters
 * that the search can start from; the rules after it still hold. */
static void test_fleet_rules(void **state) {
  (void)state;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  o.size_fleet = true;
  expect_rule(&o, "--size-fleet: virtual time only (add --virtual)");
  o.virt = true;
  expect_rule(&o,
              "--size-fleet: give --rates R (a trace workload runs at its own rate by default)");
  o.search = true;
  expect_rule(&o, "--size-fleet: it searches worker counts at one rate; --search searches rates "
                  "(give one of them)");
  o.search = false;
  o.conc[0] = 4;
  o.nconc = 1;
  expect_rule(&o, "--size-fleet: runs at a request rate (--rates R, or a trace's own), not "
                  "--concurrency");
  o.nconc = 0;
  o.rates[0] = 1;
  o.rates[1] = 2;
  o.nrates = 2;
  expect_rule(&o, "--size-fleet: takes one rate (--rates R)");
  o.nrates = 1;
  o.vc.nworker_blocks = 4;
  expect_rule(&o, "--size-fleet: a mixed fleet (--worker-blocks) has a fixed size");
  o.vc.nworker_blocks = 0;
  o.keep_cluster = true;
  expect_rule(&o, "--size-fleet: every fleet is a fresh cluster; --keep-cluster does not apply");
  o.keep_cluster = false;
  o.vc.workers = 8;
  o.size_fleet_max = 6;
  expect_rule(&o, "--size-fleet-max: must be at least --workers (the first fleet tried)");
  o.size_fleet_max = 64;
  char err[256];
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  assert_true(o.lg.early_stop); /* a fleet that certainly misses stops early, as a search level */
  o.labels[0] = "a";
  o.labels[1] = "b";
  o.nlabels = 2;
  expect_rule(&o, "--labels: needs one label per run (one)");
  o.nlabels = 0;
  /* a trace needs no rate; its own rules still apply */
  o.nrates = 0;
  assert_int_equal(kvr_workload_parse_kind("trace:t.jsonl", &o.wl), 0);
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  o.lg.burstiness = 0.5;
  expect_rule(&o, "--burstiness: a trace workload keeps the trace's own arrival times (scaled)");
}

static void test_derived(void **state) {
  (void)state;
  kvr_runner_opts_t o;
  char err[256];
  kvr_runner_opts_default(&o);
  o.seed = 7;
  o.search = true;
  o.rates[0] = 3.5;
  o.nrates = 1;
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  assert_int_equal(o.wl.seed, 7);
  assert_true(o.search_start == 3.5);
  assert_true(o.lg.early_stop);
  kvr_runner_opts_default(&o);
  o.search = true;
  o.no_early_stop = true;
  o.conc[0] = 12;
  o.nconc = 1;
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  assert_true(o.search_start == 12);
  assert_false(o.lg.early_stop);
  kvr_runner_opts_default(&o);
  o.rates[0] = 1;
  o.nrates = 1;
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  assert_false(o.lg.early_stop); /* only searches stop early */
}

static void test_labels(void **state) {
  (void)state;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  assert_string_equal(kvr_runner_label(&o, 0), "bench");
  o.ab[0] = "round_robin";
  o.ab[1] = "kv_aware";
  o.nab = 2;
  assert_string_equal(kvr_runner_label(&o, 0), "phase0");
  assert_string_equal(kvr_runner_label(&o, 1), "phase3");
  o.ab[2] = "least_load";
  o.nab = 3;
  assert_string_equal(kvr_runner_label(&o, 2), "least_load");
  o.labels[0] = "a";
  o.labels[1] = "b";
  o.labels[2] = "c";
  o.nlabels = 3;
  assert_string_equal(kvr_runner_label(&o, 1), "b");
}

/* Starts a search (kvr_runner_search_init's arguments) and runs it against a system that passes
 * every load <= capacity; returns the levels run. */
static int search(kvr_runner_search_t *s, double start, double max, double resolution, bool users,
                  double capacity, double *loads) {
  kvr_runner_search_init(s, start, max, resolution, users);
  int n = 0;
  while (!s->done) {
    assert_true(n < 64);
    loads[n++] = s->x;
    kvr_runner_search_feed(s, s->x <= capacity);
  }
  return n;
}

static void test_search_rates(void **state) {
  (void)state;
  kvr_runner_search_t s;
  double loads[64];
  int n = search(&s, 1, 64, 0.05, false, 6.3, loads);
  /* Bracket by doubling: 1, 2, 4, 8 (fail), then bisect between 4 and 8. */
  assert_true(loads[0] == 1 && loads[1] == 2 && loads[2] == 4 && loads[3] == 8 && loads[4] == 6);
  assert_true(s.lo <= 6.3 && s.hi > 6.3 && s.hi - s.lo <= 0.05 + 1e-9);
  for (int i = 0; i < n; i++)
    assert_true(fabs(loads[i] * 1000 - round(loads[i] * 1000)) < 1e-6); /* 0.001 steps */
  /* Down from a failing start: halve until a pass, never below the resolution. */
  search(&s, 10, 64, 0.05, false, 1.2, loads);
  assert_true(loads[0] == 10 && loads[1] == 5 && loads[2] == 2.5 && loads[3] == 1.25);
  assert_true(s.lo <= 1.2 && s.hi > 1.2 && s.hi - s.lo <= 0.05 + 1e-9);
  /* Passing at the cap ends there; failing at the floor ends there. */
  n = search(&s, 16, 64, 0.05, false, 1000, loads);
  assert_true(loads[n - 1] == 64 && s.lo == 64 && isinf(s.hi));
  n = search(&s, 1, 64, 0.05, false, 0.01, loads);
  assert_true(loads[n - 1] == 0.05 && s.lo == 0);
}

static void test_search_users(void **state) {
  (void)state;
  kvr_runner_search_t s;
  double loads[64];
  int n = search(&s, 3, 1000, 0.05, true, 9, loads);
  assert_true(s.lo == 9 && s.hi == 10);
  for (int i = 0; i < n; i++)
    assert_true(loads[i] >= 1 && loads[i] == round(loads[i]));
  kvr_runner_search_init(&s, 0.2, 1000, 0.05, true);
  assert_true(s.x == 1); /* users round to at least 1 */
}

/* Set-up failures return the right class of error, leave *out NULL and no handle open. */
static void test_new_failures(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  char err[512] = "";
  kvr_runner_t *r = (kvr_runner_t *)&o;
  assert_int_equal(kvr_workload_parse_kind("file:/nonexistent/kvr-wl.jsonl", &o.wl), 0);
  assert_int_equal(kvr_runner_new(&loop, &o, &r, err, sizeof(err)), KVR_EINVAL);
  assert_null(r);
  assert_non_null(strstr(err, "/nonexistent/kvr-wl.jsonl"));
  kvr_runner_opts_default(&o);
  o.lg.url = "http://127.0.0.1:1"; /* nothing listens: the model lookup fails */
  int rc = kvr_runner_new(&loop, &o, &r, err, sizeof(err));
  assert_true(rc < 0 && rc != KVR_EINVAL);
  assert_null(r);
  assert_non_null(strstr(err, "no --model given and "));
  /* --size-fleet on a trace whose requests all arrive at once: no rate of its own */
  char path[] = "/tmp/kvr_test_runner_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *lines = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 4, "
                      "\"hash_ids\": [1, 2]}\n{\"timestamp\": 5, \"input_length\": 600, "
                      "\"output_length\": 4, \"hash_ids\": [1, 3]}\n";
  assert_true(write(fd, lines, strlen(lines)) == (ssize_t)strlen(lines));
  close(fd);
  kvr_runner_opts_default(&o);
  o.virt = o.size_fleet = true;
  char spec[64];
  snprintf(spec, sizeof(spec), "trace:%s", path);
  assert_int_equal(kvr_workload_parse_kind(spec, &o.wl), 0);
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  assert_int_equal(kvr_runner_new(&loop, &o, &r, err, sizeof(err)), KVR_EINVAL);
  assert_null(r);
  assert_string_equal(err, "--size-fleet: the trace's requests arrive at one instant (no rate of "
                           "its own): give --rates R");
  unlink(path);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

KVR_TEST_MAIN(cmocka_unit_test(test_defaults), cmocka_unit_test(test_rules),
              cmocka_unit_test(test_derived), cmocka_unit_test(test_labels),
              cmocka_unit_test(test_fleet_rules), cmocka_unit_test(test_search_rates),
              cmocka_unit_test(test_search_users), cmocka_unit_test(test_new_failures))

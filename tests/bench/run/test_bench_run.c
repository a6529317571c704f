/* test_bench_run.c -- the bench's option table and a run from its settings (bench/run/): every
 * study scenario's cell, built as a struct, equals its command line parsed by the bench's table (so
 * the command a cell's report shows runs the same bench); a person's flags after -- replace the
 * cell's; a model fleet refuses --workers, and a study gives the caller's fleet flags only to the
 * scenarios without a fleet of their own; --help is no option inside a library; a bad command line
 * is exit status 2 with the bench's wording; a tiny virtual run hands its results back in memory;
 * and the study starts its cells longest first (kvr_study_order). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "base/log.h"
#include "bench/run/bench_options.h"
#include "bench/run/bench_run.h"
#include "bench/run/runner.h"
#include "bench/vcluster/model_fleet.h"
#include "bench/vcluster/study.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const policies[] = {"round_robin", "kv_aware", "least_load"};

static kvr_study_cell_t cell_of(const kvr_study_scenario_t *sc) {
  return (kvr_study_cell_t){.sc = sc,
                            .seed = 43,
                            .policies = policies,
                            .npolicies = KVR_ARRAY_SIZE(policies),
                            .resolution = 0.05,
                            .out = "results/study/x/seed43",
                            .title = "kvrouter study: x, seed 43",
                            .trace_workload = "trace:t.jsonl",
                            .trace_window = "100:400"};
}

/* Compares a's and b's string lists and strings, then drops them, so that memcmp compares the
 * rest: two structs that started from the same defaults. */
static void same_settings(kvr_runner_opts_t *a, kvr_runner_opts_t *b) {
  assert_int_equal(a->nab, b->nab);
  assert_int_equal(a->nlabels, b->nlabels);
  for (size_t i = 0; i < a->nab; i++)
    assert_string_equal(a->ab[i], b->ab[i]);
  for (size_t i = 0; i < a->nlabels; i++)
    assert_string_equal(a->labels[i], b->labels[i]);
  assert_string_equal(a->out, b->out);
  assert_string_equal(a->title, b->title);
  kvr_bench_options_free(a);
  kvr_bench_options_free(b);
  a->out = b->out = a->title = b->title = NULL;
  assert_memory_equal(a, b, sizeof(*a));
}

static void test_cell_words_parse_to_cell_opts(void **state) {
  (void)state;
  size_t n = 0;
  for (const kvr_study_scenario_t *sc = kvr_study_scenarios; sc->name; sc++, n++) {
    kvr_study_cell_t c = cell_of(sc);
    kvr_runner_opts_t built, parsed;
    kvr_runner_opts_default(&built);
    kvr_study_cell_opts(&c, &built);
    kvr_study_words_t w;
    kvr_study_cell_words(&c, &w);
    assert_string_equal(w.argv[0], "bench");
    assert_null(w.argv[w.argc]);
    kvr_runner_opts_default(&parsed);
    char err[256] = "";
    assert_int_equal(kvr_bench_options_parse(&parsed, w.argc, w.argv, err, sizeof(err)), 0);
    assert_true(built.virt && built.quiet);
    assert_true(sc->fleet ? built.size_fleet && !built.search : built.search && !built.size_fleet);
    same_settings(&built, &parsed);
  }
  assert_int_equal(n, 12);
  /* The scenario's own settings landed (not only the shared plan). */
  const kvr_study_scenario_t *mixed = kvr_study_scenario("mixed-fleet");
  kvr_study_cell_t c = cell_of(mixed);
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  kvr_study_cell_opts(&c, &o);
  assert_int_equal(o.vc.nworker_blocks, 4);
  assert_int_equal(o.vc.worker_blocks[3], 10885);
  assert_int_equal(o.wl.kind, KVR_WL_DOCUMENTS);
  assert_true(o.lg.warmup_s == 60);
  kvr_bench_options_free(&o);
  /* model-fleet's: the model fleet and the mix of its models' traffic */
  c = cell_of(kvr_study_scenario("model-fleet"));
  kvr_runner_opts_default(&o);
  kvr_study_cell_opts(&c, &o);
  assert_string_equal(o.vc.model_fleet, KVR_MFLEET_STUDY);
  assert_int_equal(o.wl.kind, KVR_WL_MIX);
  assert_non_null(strstr(o.wl.path, "model-a=multiturn@0.6,"));
  kvr_bench_options_free(&o);
  /* A trace scenario's: the study's trace and window, the preset's workers, the long SLO. */
  c = cell_of(kvr_study_scenario("trace-fleet"));
  kvr_runner_opts_default(&o);
  kvr_study_cell_opts(&c, &o);
  assert_int_equal(o.wl.kind, KVR_WL_TRACE);
  assert_string_equal(o.wl.path, "t.jsonl");
  assert_true(o.wl.trace_window_start_s == 100 && o.wl.trace_window_end_s == 400);
  assert_int_equal(o.vc.engine.num_gpu_blocks, 26674); /* llama-3.1-8b-h100 */
  assert_true(o.slo.ttft_p99_ms == 10000 && o.slo.tpot_p99_ms == 100);
  assert_true(o.size_fleet && !o.search);
  char err[256] = "";
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), 0);
  kvr_bench_options_free(&o);
}

/* The words are the command line the study showed before it built structs. */
static void test_cell_words(void **state) {
  (void)state;
  kvr_study_cell_t c = cell_of(kvr_study_scenario("bursty"));
  char *extra[] = {"--workers", "2"};
  c.extra = extra;
  c.nextra = 2;
  kvr_study_words_t w;
  kvr_study_cell_words(&c, &w);
  char line[2048] = "";
  for (int i = 0; i < w.argc; i++)
    snprintf(line + strlen(line), sizeof(line) - strlen(line), "%s%s", i ? " " : "", w.argv[i]);
  assert_string_equal(line, "bench --virtual --ab round_robin,kv_aware,least_load --labels "
                            "round_robin,kv_aware,least_load --seed 43 --search --search-start 2 "
                            "--search-resolution 0.05 --num-prompts 100 --warmup 0 --min-level-s "
                            "60 --cooldown-s 10 --quiet --out results/study/x/seed43 --title "
                            "kvrouter study: x, seed 43 --workload multiturn --multiturn-mode "
                            "session --warmup-s 120 --burstiness 0.3 --workers 2");
  /* a trace scenario: no --num-prompts or --min-level-s (a trace level sends the trace once) */
  c = cell_of(kvr_study_scenario("trace"));
  c.nextra = 0;
  kvr_study_cell_words(&c, &w);
  line[0] = '\0';
  for (int i = 0; i < w.argc; i++)
    snprintf(line + strlen(line), sizeof(line) - strlen(line), "%s%s", i ? " " : "", w.argv[i]);
  assert_string_equal(line, "bench --virtual --ab round_robin,kv_aware,least_load --labels "
                            "round_robin,kv_aware,least_load --seed 43 --search --search-start 2 "
                            "--search-resolution 0.05 --warmup 0 --cooldown-s 10 --quiet --out "
                            "results/study/x/seed43 --title kvrouter study: x, seed 43 --workload "
                            "trace:t.jsonl --trace-window 100:400 --preset llama-3.1-8b-h100 "
                            "--slo-ttft-ms 10000 --slo-tpot-ms 100 --warmup-s 0");
}

/* A person's flags after -- go over the cell's: a scalar replaces, a list replaces the cell's. */
static void test_extra_flags_replace(void **state) {
  (void)state;
  kvr_study_cell_t c = cell_of(kvr_study_scenario("mixed-fleet"));
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  kvr_study_cell_opts(&c, &o);
  char *argv[] = {"bench", "--warmup-s", "30", "--worker-blocks", "5,6", "--ab", "least_load"};
  char err[256] = "";
  assert_int_equal(kvr_bench_options_parse(&o, 7, argv, err, sizeof(err)), 0);
  assert_true(o.lg.warmup_s == 30);
  assert_int_equal(o.vc.nworker_blocks, 2);
  assert_int_equal(o.vc.worker_blocks[0], 5);
  assert_int_equal(o.nab, 1);
  assert_string_equal(o.ab[0], "least_load");
  assert_int_equal(o.nlabels, 3); /* the cell's labels stay: the rules then refuse them */
  assert_int_equal(kvr_runner_opts_check(&o, err, sizeof(err)), KVR_EINVAL);
  assert_string_equal(err, "--labels: needs one label per run (one per --ab policy)");
  kvr_bench_options_free(&o);
}

/* A model fleet sets its own workers: --workers beside it is refused by name, after -- on a study
 * cell as on a command line, instead of being dropped without a word. */
static void test_model_fleet_refuses_workers(void **state) {
  (void)state;
  kvr_study_cell_t c = cell_of(kvr_study_scenario("model-fleet"));
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  kvr_study_cell_opts(&c, &o);
  char *argv[] = {"bench", "--workers", "8"};
  char cerr[256] = "";
  assert_int_equal(kvr_bench_options_parse(&o, 3, argv, cerr, sizeof(cerr)), KVR_EINVAL);
  assert_string_equal(cerr, "--workers: a model fleet (--model-fleet) sets its own workers; leave "
                            "--workers out");
  kvr_bench_options_free(&o);
  kvr_bench_io_t io = {0};
  kvr_results_t *res = NULL;
  char err[256] = "";
  char *line[] = {"bench", "--virtual", "--model-fleet", "2*m", "--workers", "3", "--rates", "1"};
  assert_int_equal(kvr_bench_run_argv(8, line, &io, &res, err, sizeof(err)), 2);
  assert_null(res);
  assert_string_equal(err, "kvrouter bench: --workers: a model fleet (--model-fleet) sets its own "
                           "workers; leave --workers out");
}

/* What each cell of a study got after its own settings (recorded by a run function that runs
 * nothing): the fleet flags reach the scenarios without a fleet of their own, extra every one. */
static char seen[KVR_STUDY_MAX][256];

static int record_cell(const kvr_study_cell_t *c, kvr_results_t **out, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  *out = NULL;
  size_t i = 0;
  while (i + 1 < KVR_STUDY_MAX && seen[i][0] != '\0')
    i++;
  size_t k = (size_t)snprintf(seen[i], sizeof(seen[i]), "%s:", c->sc->name);
  for (int a = 0; a < c->nextra && k < sizeof(seen[i]); a++)
    k += (size_t)snprintf(seen[i] + k, sizeof(seen[i]) - k, " %s", c->extra[a]);
  return 0;
}

static void test_study_fleet_flags_skip_own_fleets(void **state) {
  (void)state;
  char dir[] = "/tmp/kvr_test_study_fleet_XXXXXX";
  assert_non_null(mkdtemp(dir));
  memset(seen, 0, sizeof(seen));
  char *fleet[] = {"--workers", "8"};
  char *extra[] = {"--scrape-interval-ms", "4000"};
  kvr_study_opts_t o;
  kvr_study_opts_default(&o);
  o.scenarios[o.nscenarios++] = "multiturn";
  o.scenarios[o.nscenarios++] = "mixed-fleet";
  o.scenarios[o.nscenarios++] = "model-fleet";
  o.policies[o.npolicies++] = "round_robin";
  o.seeds = 1;
  o.jobs = 1;
  o.quiet = true;
  o.out = dir;
  o.fleet = fleet;
  o.nfleet = 2;
  o.extra = extra;
  o.nextra = 2;
  FILE *sink = fopen("/dev/null", "w");
  assert_non_null(sink);
  char err[256] = "";
  kvr_study_run(&o, record_cell, sink, NULL, err, sizeof(err));
  fclose(sink);
  const char *want[] = {"multiturn: --workers 8 --scrape-interval-ms 4000",
                        "mixed-fleet: --scrape-interval-ms 4000",
                        "model-fleet: --scrape-interval-ms 4000"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(want); i++) {
    bool found = false;
    for (size_t j = 0; j < KVR_STUDY_MAX; j++)
      found = found || strcmp(seen[j], want[i]) == 0;
    assert_true(found);
  }
  char rm[160];
  snprintf(rm, sizeof(rm), "rm -rf '%s'", dir);
  assert_int_equal(system(rm), 0);
}

static void test_help_is_no_option_here(void **state) {
  (void)state;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  char *argv[] = {"bench", "--rates", "2", "--help"};
  char err[256] = "";
  assert_int_equal(kvr_bench_options_parse(&o, 4, argv, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "--help"));
  kvr_bench_options_free(&o);
}

static void test_run_argv_rejects(void **state) {
  (void)state;
  kvr_bench_io_t io = {0};
  kvr_results_t *res = (kvr_results_t *)&io;
  char err[256] = "";
  char *bogus[] = {"bench", "--virtual", "--rates", "2", "--bogus"};
  assert_int_equal(kvr_bench_run_argv(5, bogus, &io, &res, err, sizeof(err)), 2);
  assert_null(res);
  assert_string_equal(err, "kvrouter bench: --bogus: unknown option (see kvrouter bench --help)");
  char *rule[] = {"bench", "--virtual", "--rates", "2", "--concurrency", "4"};
  assert_int_equal(kvr_bench_run_argv(6, rule, &io, &res, err, sizeof(err)), 2);
  assert_string_equal(err, "kvrouter bench: --concurrency: cannot be combined with --rates");
}

/* A few virtual requests: the report is written and the results come back in memory. */
static void test_virtual_run_results(void **state) {
  (void)state;
  char dir[] = "/tmp/kvr_test_bench_run_XXXXXX";
  assert_non_null(mkdtemp(dir));
  kvr_log_set_level(KVR_LOG_WARN);
  char *argv[] = {"bench",         "--virtual", "--workers", "2",
                  "--rates",       "2,4",       "--ab",      "round_robin,kv_aware",
                  "--num-prompts", "6",         "--warmup",  "0",
                  "--cooldown-s",  "0",         "--out",     dir};
  kvr_bench_io_t io = {0};
  kvr_results_t *res = NULL;
  char err[256] = "";
  assert_int_equal(kvr_bench_run_argv(KVR_ARRAY_SIZE(argv), argv, &io, &res, err, sizeof(err)), 0);
  assert_non_null(res);
  assert_int_equal(res->nruns, 2);
  assert_string_equal(res->runs[1].label, "phase3");
  assert_string_equal(res->runs[1].policy, "kv_aware");
  assert_int_equal(res->runs[0].nlevels, 2);
  assert_true(res->runs[0].levels[1]->rate == 4);
  kvr_stats_results_free(res);
  char path[128];
  snprintf(path, sizeof(path), "%s/report.md", dir);
  assert_int_equal(access(path, F_OK), 0);
  char rm[160];
  snprintf(rm, sizeof(rm), "rm -rf '%s'", dir);
  assert_int_equal(system(rm), 0);
}

/* The study's cells start costliest first, ties in table then seed order: every built-in
 * scenario over 3 seeds, then three made-up ones with a tie. */
static void test_study_order_longest_first(void **state) {
  (void)state;
  const kvr_study_scenario_t *scs[KVR_STUDY_MAX] = {NULL};
  size_t nscs = 0;
  for (const kvr_study_scenario_t *sc = kvr_study_scenarios; sc->name; sc++) {
    assert_true(sc->cost_s > 0); /* every scenario has its measured cost */
    scs[nscs++] = sc;
  }
  size_t order[KVR_STUDY_MAX * 3];
  kvr_study_order(scs, nscs, 3, order);
  bool taken[KVR_STUDY_MAX * 3] = {false};
  for (size_t i = 0; i < nscs * 3; i++) {
    assert_true(order[i] < nscs * 3 && !taken[order[i]]);
    taken[order[i]] = true;
    if (i == 0)
      continue;
    double prev = scs[order[i - 1] / 3]->cost_s, cur = scs[order[i] / 3]->cost_s;
    assert_true(prev > cur || (prev == cur && order[i - 1] < order[i]));
  }
  assert_string_equal(scs[order[0] / 3]->name, "trace"); /* the costliest today */
  kvr_study_scenario_t a = {.name = "a", .cost_s = 1}, b = {.name = "b", .cost_s = 5},
                       c = {.name = "c", .cost_s = 1};
  const kvr_study_scenario_t *abc[] = {&a, &b, &c};
  size_t o2[6];
  kvr_study_order(abc, 3, 2, o2);
  size_t want[6] = {2, 3, 0, 1, 4, 5}; /* b's two seeds, then a's, then c's */
  assert_memory_equal(o2, want, sizeof(want));
}

KVR_TEST_MAIN(cmocka_unit_test(test_cell_words_parse_to_cell_opts),
              cmocka_unit_test(test_cell_words), cmocka_unit_test(test_extra_flags_replace),
              cmocka_unit_test(test_model_fleet_refuses_workers),
              cmocka_unit_test(test_study_fleet_flags_skip_own_fleets),
              cmocka_unit_test(test_help_is_no_option_here),
              cmocka_unit_test(test_run_argv_rejects), cmocka_unit_test(test_virtual_run_results),
              cmocka_unit_test(test_study_order_longest_first))

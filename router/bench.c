/* bench.c -- `kvrouter bench`, `kvrouter bench routing` and `kvrouter bench study`: argv, signals,
 * exit codes and wiring.
 *
 * `kvrouter bench`: the option engine (src/base/cli.h) fills a kvr_runner_opts_t from the bench's
 * tables (bench/run/bench_options.h: kvrouter's flags and `vllm bench serve`'s spellings;
 * kvr_runner_opts_default() holds the defaults --help prints),
 * kvr_runner_opts_check() applies the rules between flags, and kvr_bench_run() (bench/run/
 * bench_run.h) runs the labels and levels on a private uv loop and writes the report. Outside
 * virtual time SIGINT/SIGTERM set a flag the run reads: the current level stops, the report of
 * what finished is still written and the exit status is 130.
 *
 * `kvrouter bench routing`: the routing-decision micro-benchmark (bench/routing/route_bench.h),
 * its options through the same engine. `kvrouter bench study`: the policy study
 * (bench/vcluster/study.h), its cells run by kvr_bench_run_study().
 */

#include "commands.h"

#include "base/buf.h"
#include "base/cli.h"
#include "base/kvr.h"
#include "base/log.h"
#include "bench/report/report.h"
#include "bench/routing/route_bench.h"
#include "bench/run/bench_options.h"
#include "bench/run/bench_run.h"
#include "bench/run/runner.h"
#include "bench/vcluster/study.h"
#include "policies/policy.h"
#include "proto/prompt.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- `kvrouter bench routing` options ---- */

#define R(field) KVR_CLI_FIELD(kvr_route_bench_opts_t, field)

static const kvr_cli_opt_t route_options[] = {
    {KVR_CLI_UINT, "prompt-kib", R(prompt_kib), .arg = "N", KVR_CLI_RANGE(1, 16384),
     .help = "size of the synthetic chat prompt in KiB"},
    {KVR_CLI_LIST, "workers", KVR_CLI_ARRAY(kvr_route_bench_opts_t, workers, nworkers),
     .arg = "N[,N...]", .elem = KVR_CLI_UINT, KVR_CLI_RANGE(1, KVR_MAX_WORKERS),
     .help = "numbers of workers, one run per value and --blocks value (e.g. 4,64,256)"},
    {KVR_CLI_LIST, "blocks", KVR_CLI_ARRAY(kvr_route_bench_opts_t, blocks, nblocks),
     .arg = "N[,N...]", .elem = KVR_CLI_UINT, KVR_CLI_MIN(1),
     .help = "blocks pre-indexed over the workers (at least one per worker; e.g. "
             "1000000,10000000)"},
    {KVR_CLI_UINT, "decisions", R(decisions), .arg = "N", KVR_CLI_MIN(1),
     .help = "timed decisions"},
    {KVR_CLI_UINT, "block-chars", R(block_chars), .arg = "N",
     KVR_CLI_RANGE(1, KVR_PROMPT_BLOCK_CHARS_MAX), .help = "block size in bytes"},
    {KVR_CLI_STR, "policy", R(policy), .arg = "NAME", .flags = KVR_CLI_NONEMPTY,
     .help = "policy to time (see the list below)"},
};

static const kvr_cli_cmd_t route_cmd = {
    .name = "bench routing",
    .usage = "[options]",
    .about = "Times what one routing decision costs on the loop thread: prompt features and\n"
             "hashing, cache-index match, policy select (warm and cold caches), plus JSON parse,\n"
             "index insert, steady state and growth, and bytes per entry; one run per --workers\n"
             "and --blocks value. Prints Markdown tables (see policies/README.md).",
    .opts = route_options,
    .nopts = KVR_ARRAY_SIZE(route_options),
    .epilog = kvr_policy_print_names,
};

static int route_bench_main(int argc, char **argv) {
  kvr_route_bench_opts_t o;
  kvr_route_bench_opts_default(&o);
  int rc = kvr_cli_main(&route_cmd, &o, argc, argv, NULL);
  if (rc != KVR_CLI_CONTINUE)
    return rc;
  if (kvr_policy_find(o.policy) == NULL) {
    char names[256];
    kvr_policy_names(names, sizeof(names));
    return kvr_cli_fail(&route_cmd, "--policy: unknown policy '%s' (valid: %s)", o.policy, names);
  }
  for (size_t w = 0; w < o.nworkers; w++)
    for (size_t b = 0; b < o.nblocks; b++)
      if (o.blocks[b] < o.workers[w]) /* each worker's share is its index capacity */
        return kvr_cli_fail(&route_cmd, "--blocks: at least one per worker (%zu), got %llu",
                            o.workers[w], (unsigned long long)o.blocks[b]);
  return kvr_route_bench_run(&o);
}

/* ---- `kvrouter bench` ---- */

static volatile sig_atomic_t g_stop; /* the signal that asked to stop, 0 until one did */

static void on_signal(int sig) {
  g_stop = sig;
}

static void catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* The command line as the report shows it: pasted back into a shell, it runs the same bench. */
static char *join_argv(int argc, char **argv) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_shell_join(argc, argv, &b);
  return kvr_buf_steal(&b);
}

void kvr_bench_raise_fd_limit(void) {
  /* 1,000 concurrent streams need more descriptors than the usual soft limit of 1,024. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static int check_and_run(kvr_runner_opts_t *o, int argc, char **argv) {
  char err[512];
  if (kvr_runner_opts_check(o, err, sizeof(err)) != 0)
    return kvr_cli_fail(&kvr_bench_options_cmd, "%s", err);
  o->lg.progress = o->quiet ? NULL : stderr;
  o->lg.progress_tty = isatty(STDERR_FILENO);
  char *cmd = join_argv(argc, argv);
  o->command = cmd;
  kvr_bench_raise_fd_limit();
  if (o->virt)
    kvr_log_set_level(KVR_LOG_WARN); /* the virtual router's worker and scrape lines are noise */
  /* Virtual time never runs the loop, so a signal would wait for the end: the default action
   * (the process ends, no report) is the honest one for a run of seconds. */
  if (!o->virt)
    catch_signals();
  kvr_bench_io_t io = {.summary = stdout, .errors = stderr, .stop = o->virt ? NULL : &g_stop};
  int status = kvr_bench_run(o, &io, NULL, err, sizeof(err));
  free(cmd);
  return status;
}

/* ---- `kvrouter bench study` ---- */

#define S(field) KVR_CLI_FIELD(kvr_study_opts_t, field)

static const kvr_cli_opt_t study_options[] = {
    {KVR_CLI_LIST, "scenarios", KVR_CLI_ARRAY(kvr_study_opts_t, scenarios, nscenarios),
     .arg = "LIST", .elem = KVR_CLI_STR,
     .help =
         "scenarios (default all: multiturn, documents, control, agentic, hot-prefix, bursty, "
         "mixed-fleet, agentic-responses, agentic-responses-no-id-affinity, model-fleet, trace, "
         "trace-fleet)"},
    {KVR_CLI_LIST, "policies", KVR_CLI_ARRAY(kvr_study_opts_t, policies, npolicies), .arg = "LIST",
     .elem = KVR_CLI_STR,
     .help = "policies, the first the baseline (default every policy, then the oracle)"},
    {KVR_CLI_UINT, "seeds", S(seeds), .arg = "N", KVR_CLI_RANGE(1, 100),
     .help = "seeds per scenario: --seed, --seed + 1, ..."},
    {KVR_CLI_UINT, "seed", S(seed), .arg = "N", .help = "the first seed"},
    {KVR_CLI_UINT, "jobs", S(jobs), .arg = "N", KVR_CLI_RANGE(0, 64),
     .help = "cells run at once, one thread each; 0 = one per core"},
    {KVR_CLI_DOUBLE, "search-resolution", S(resolution), .arg = "R", KVR_CLI_GT(0),
     .help = "max-SLO-rate search resolution, req/s"},
    {KVR_CLI_STR, "out", S(out), .arg = "DIR", .help = "results folder"},
    {KVR_CLI_SWITCH, "quiet", S(quiet), .set = 1, .help = "no line per finished cell"},
    {KVR_CLI_STR, "trace", S(trace), .arg = "FILE",
     .help = "the trace scenarios' prefix-hashed trace (trace: max SLO-compliant rate; "
             "trace-fleet: workers needed at its own rate); left out of the default set, with a "
             "line saying so, when FILE cannot be read"},
    {KVR_CLI_STR, "trace-window", S(trace_window), .arg = "START_S:END_S",
     .help = "the window of the trace they replay (trace seconds; END_S may be left out)"},
};

static void print_study_epilog(FILE *out) {
  fputs(
      "\nEverything after -- goes to every cell's kvrouter bench --virtual after the study's own\n"
      "flags (later flags win), e.g. kvrouter bench study -- --scrape-interval-ms 4000\n",
      out);
}

static const kvr_cli_cmd_t study_cmd = {
    .name = "bench study",
    .usage = "[options] [-- BENCH-OPTIONS...]",
    .about = "Every policy on every scenario over several seeds in virtual time (kvrouter bench\n"
             "--virtual --search per scenario and seed, run in parallel), summed up in one table:\n"
             "each policy's mean max SLO-compliant rate with its spread, and kv_aware's ratio to\n"
             "round_robin, to the best reference policy and to the oracle; trace-fleet: the\n"
             "workers each policy needs for the trace at its own rate (--size-fleet).",
    .opts = study_options,
    .nopts = KVR_ARRAY_SIZE(study_options),
    .epilog = print_study_epilog,
};

static int study_main(int argc, char **argv) {
  kvr_study_opts_t o;
  kvr_study_opts_default(&o);
  o.trace = KVR_STUDY_TRACE;
  o.trace_window = KVR_STUDY_TRACE_WINDOW;
  int rest;
  int rc = kvr_cli_main(&study_cmd, &o, argc, argv, &rest);
  if (rc == KVR_CLI_CONTINUE) {
    o.extra = argv + rest;
    o.nextra = argc - rest;
    kvr_log_set_level(KVR_LOG_WARN);
    char err[768];
    rc = kvr_bench_run_study(&o, stdout, NULL, err, sizeof(err));
    if (rc == 2)
      rc = kvr_cli_fail(&study_cmd, "%s", err);
    else if (rc != 0)
      fprintf(stderr, "kvrouter bench study: %s\n", err);
  }
  kvr_cli_free(&study_cmd, &o);
  return rc;
}

int kvr_bench_main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "routing") == 0)
    return route_bench_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "study") == 0)
    return study_main(argc - 1, argv + 1);
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  int rc = kvr_bench_options_main(&o, argc, argv);
  if (rc == KVR_CLI_CONTINUE)
    rc = check_and_run(&o, argc, argv);
  kvr_bench_options_free(&o);
  return rc;
}

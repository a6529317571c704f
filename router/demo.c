/* demo.c -- `kvrouter demo`: argv, signals, exit codes and wiring of the demo's three steps
 * (bench/run/demo.h): the policy study in virtual time, its multiturn verdict confirmed in real
 * time on simulated workers and a router this binary starts on 127.0.0.1, and the agreement of the
 * two.
 *
 * Flow: the option table below fills a kvr_demo_opts_t (the options after -- go to the bench) ->
 * kvr_demo_new() and kvr_demo_preflight() check them (status 2, one line) -> this binary's path
 * (the children are `EXE sim` and `EXE serve`) -> step 1 -> SIGINT/SIGTERM caught -> step 2 ->
 * default actions restored -> step 3.
 *
 * Signals: only step 2 catches them. Its handler sets a flag that aborts the children's start or
 * stops the current level (the bench writes a partial report); the children are stopped as usual,
 * step 3 is skipped and the exit status is 130. Steps 1 and 3 are pure computation with no child
 * alive, so Ctrl-C there ends the demo the default way.
 */

#include "commands.h"

#include "base/cli.h"
#include "base/kvr.h"
#include "bench/run/demo.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define F(field) KVR_CLI_FIELD(kvr_demo_opts_t, field)

static const kvr_cli_opt_t options[] = {
    {KVR_CLI_SWITCH, "quick", F(quick), .set = 1,
     .help = "a short run for CI, under a minute: the virtual study of round_robin and kv_aware "
             "on multiturn only, then the real run at the rate halfway between their two limits, "
             "60 s per level (its p99s are then known to about 20%)"},
    {KVR_CLI_STR, "out", F(out), .arg = "DIR", .help = "results folder"},
    {KVR_CLI_UINT, "workers", F(workers), .arg = "N", KVR_CLI_RANGE(1, KVR_DEMO_MAX_WORKERS),
     .help = "simulated workers (real and virtual)"},
    {KVR_CLI_DOUBLE, "time-scale", F(scale), .arg = "N", KVR_CLI_GT(0), .flags = KVR_CLI_NODEFAULT,
     .help = "simulator speed-up of the real run (default 10)"},
    {KVR_CLI_UINT, "seed", F(seed), .arg = "N", .help = "workload seed (the study's first seed)"},
    {KVR_CLI_UINT, "seeds", F(seeds), .arg = "N", KVR_CLI_RANGE(1, 100),
     .help = "virtual study: seeds per scenario (each adds the study's time again)"},
    {KVR_CLI_STR, "workload", F(workload), .arg = "W",
     .help = "the real run's workload, a study scenario's name (multiturn runs in session mode: "
             "answers resent)"},
    {KVR_CLI_STR, "ab", F(ab), .arg = "LIST", .help = "policies the real run compares"},
    {KVR_CLI_STR, "labels", F(labels), .arg = "LIST",
     .help = "their labels (default phase0,phase3 for two policies)"},
    {KVR_CLI_LIST, "worker-blocks", KVR_CLI_ARRAY(kvr_demo_opts_t, worker_blocks, nworker_blocks),
     .arg = "LIST", .elem = KVR_CLI_UINT, KVR_CLI_RANGE(1, 1 << 30),
     .help = "KV cache blocks of each worker, one per worker (a mixed fleet, e.g. "
             "21770,21770,21770,10885); default the sim's 21770 each"},
};

static void print_passthrough(FILE *out) {
  fputs("\nEverything after -- goes to the real run's kvrouter bench (and its virtual twin in\n"
        "step 3) after the demo's own options (later options win), e.g. kvrouter demo -- --rates "
        "6;\nthe caller's --rates, --ab or --labels replace the demo's.\n",
        out);
}

static const kvr_cli_cmd_t demo_cmd = {
    .name = "demo",
    .usage = "[options] [-- BENCH-OPTIONS...]",
    .about =
        "1. Virtual: every policy on every workload in virtual time (kvrouter bench study, one\n"
        "   seed): each policy's max SLO-compliant rate, printed as a table.\n"
        "2. Real: starts N (4) simulated vLLM workers and the router on 127.0.0.1 and runs\n"
        "   round_robin (phase0) vs kv_aware (phase3) on multiturn with the simulators' clock\n"
        "   sped up, at one rate between the limits step 1 found for the two policies, 360 s\n"
        "   (simulated) per level.\n"
        "3. Agreement: the same levels again in virtual time; real vs virtual TTFT/TPOT p99 and\n"
        "   SLO verdicts, and the headline, printed and written to DIR/AGREEMENT.md.\n"
        "Stops everything it started (also on Ctrl-C). About 3 minutes on 2 cores of its own;\n"
        "--quick under one.",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
    .epilog = print_passthrough,
};

/* ---- signals ---- */

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

/* ---- wiring ---- */

/* The three steps; signals are caught around the real one alone. */
static int run_steps(kvr_demo_t *d, const char *exe) {
  int rc = kvr_demo_virtual(d);
  if (rc != 0)
    return rc;
  kvr_bench_raise_fd_limit();
  g_stop = 0;
  catch_signals();
  rc = kvr_demo_real(d, exe, &g_stop);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  return rc != 0 ? rc : kvr_demo_agree(d);
}

/* The checks, this binary's path, then the steps. */
static int run(const kvr_demo_opts_t *o) {
  kvr_demo_t *d = NULL;
  char err[768];
  if (kvr_demo_new(o, &d, err, sizeof(err)) != 0)
    return kvr_cli_fail(&demo_cmd, "%s", err);
  int rc;
  char exe[4096];
  ssize_t n;
  if (kvr_demo_preflight(d, err, sizeof(err)) != 0) {
    rc = kvr_cli_fail(&demo_cmd, "%s", err);
  } else if ((n = readlink("/proc/self/exe", exe, sizeof(exe) - 1)) <= 0) {
    fprintf(stderr, "kvrouter demo: cannot find my own binary: %s\n", strerror(errno));
    rc = 1;
  } else {
    exe[n] = '\0';
    rc = run_steps(d, exe);
  }
  kvr_demo_free(d);
  return rc;
}

int kvr_demo_main(int argc, char **argv) {
  kvr_demo_opts_t o;
  kvr_demo_opts_default(&o);
  int rest;
  int rc = kvr_cli_main(&demo_cmd, &o, argc, argv, &rest);
  if (rc != KVR_CLI_CONTINUE)
    return rc;
  if (argc - rest > KVR_DEMO_MAX_EXTRA)
    return kvr_cli_fail(&demo_cmd, "--: at most %d bench options after it", KVR_DEMO_MAX_EXTRA);
  o.extra = argv + rest;
  o.nextra = argc - rest;
  return run(&o);
}

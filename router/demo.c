/* demo.c -- `kvrouter demo`: a whole A/B on one machine, started and stopped by one command.
 *
 * Structs: demo_cli_t is the command line (the option table below); demo_t is one run: this
 * binary's path, the folders, and the child processes (bench/demo/procs.h) it started.
 *
 * Flow: pick free loopback ports -> `kvrouter sim --time-scale N` per worker and `kvrouter serve`
 * in front of them as children (this very binary, /proc/self/exe; output to OUT/logs/) -> poll
 * each /health -> kvr_bench_main(--ab round_robin,kv_aware ...) in this process -> SIGTERM every
 * child by PID, SIGKILL after a grace period, reap -> the bench printed the summary.
 *
 * Invariants: every child started is stopped before kvr_demo_main() returns, on every path. The
 * children also get PR_SET_PDEATHSIG, so they go away even if the demo itself is killed. Ctrl-C
 * while the children start aborts the start; during the benchmark it stops the current level (the
 * bench writes a partial report), and then the children are stopped as usual.
 */

#include "commands.h"

#include "bench/demo/procs.h"
#include "src/cli.h"
#include "src/kvr.h"

#include <curl/curl.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_WORKERS 16
#define MAX_EXTRA 32 /* options after -- */
#define STOP_GRACE_MS 5000

typedef struct demo_cli_s {
  bool quick;
  const char *out;
  unsigned workers;
  double scale; /* 0: 10, or 20 with --quick */
  uint64_t seed;
  const char *workload, *ab, *labels;
  unsigned worker_blocks[MAX_WORKERS]; /* --worker-blocks: KV blocks per worker (a mixed fleet) */
  size_t nworker_blocks;
} demo_cli_t;

#define F(field) KVR_CLI_FIELD(demo_cli_t, field)

static const kvr_cli_opt_t options[] = {
    {KVR_CLI_SWITCH, "quick", F(quick), .set = 1,
     .help = "a short run (three rates, 60 prompts each) for CI: under a minute"},
    {KVR_CLI_STR, "out", F(out), .arg = "DIR", .help = "results folder"},
    {KVR_CLI_UINT, "workers", F(workers), .arg = "N", KVR_CLI_RANGE(1, MAX_WORKERS),
     .help = "simulated workers"},
    {KVR_CLI_DOUBLE, "time-scale", F(scale), .arg = "N", KVR_CLI_GT(0), .flags = KVR_CLI_NODEFAULT,
     .help = "simulator speed-up (default 10; 20 with --quick)"},
    {KVR_CLI_UINT, "seed", F(seed), .arg = "N", .help = "workload seed"},
    {KVR_CLI_STR, "workload", F(workload), .arg = "W",
     .help = "bench workload (multiturn runs in session mode: answers resent)"},
    {KVR_CLI_STR, "ab", F(ab), .arg = "LIST", .help = "policies to compare"},
    {KVR_CLI_STR, "labels", F(labels), .arg = "LIST",
     .help = "their labels (default phase0,phase3 for two policies)"},
    {KVR_CLI_LIST, "worker-blocks", KVR_CLI_ARRAY(demo_cli_t, worker_blocks, nworker_blocks),
     .arg = "LIST", .elem = KVR_CLI_UINT, KVR_CLI_RANGE(1, 1 << 30),
     .help = "KV cache blocks of each worker, one per worker (a mixed fleet, e.g. "
             "21770,21770,21770,10885); default the sim's 21770 each"},
};

static void print_passthrough(FILE *out) {
  fputs("\nEverything after -- goes to kvrouter bench after the demo's own options (later options\n"
        "win), e.g. kvrouter demo -- --num-prompts 100\n",
        out);
}

static const kvr_cli_cmd_t demo_cmd = {
    .name = "demo",
    .usage = "[options] [-- BENCH-OPTIONS...]",
    .about =
        "Starts N (4) simulated vLLM workers and the router on 127.0.0.1, runs the round-robin\n"
        "(phase0) vs KV-aware (phase3) A/B on the multiturn workload with the simulators' "
        "clock\nsped up, writes the report into DIR (results/demo), prints the max "
        "SLO-compliant rate\nper phase and the gain, and stops everything it started (also "
        "on Ctrl-C).",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
    .epilog = print_passthrough,
};

typedef struct demo_s {
  const demo_cli_t *cli;
  char exe[4096], logs[4200];
  char scale_s[32], seed_s[32];
  kvr_proc_t kids[MAX_WORKERS + 1]; /* the workers, then the router */
  size_t nkids;
  int admin_port;
} demo_t;

/* ---- signals ---- */

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
  (void)sig;
  g_interrupted = 1;
}

static void install_handler(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* ---- set-up ---- */

/* This binary's path and OUT/logs (created with its parents). */
static int prepare(demo_t *d) {
  ssize_t n = readlink("/proc/self/exe", d->exe, sizeof(d->exe) - 1);
  if (n <= 0) {
    fprintf(stderr, "kvrouter demo: cannot find my own binary: %s\n", strerror(errno));
    return 1;
  }
  d->exe[n] = '\0';
  const char *out = d->cli->out;
  snprintf(d->logs, sizeof(d->logs), "%s/logs", out);
  char dir[4300];
  snprintf(dir, sizeof(dir), "%s", out);
  for (char *p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(dir, 0755);
      *p = '/';
    }
  mkdir(out, 0755);
  if (mkdir(d->logs, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "kvrouter demo: %s: %s\n", d->logs, strerror(errno));
    return 1;
  }
  return 0;
}

static int spawn(demo_t *d, kvr_proc_t *c, char **args, const char *log_name) {
  char log_path[4300], err[4400];
  snprintf(log_path, sizeof(log_path), "%s/%s", d->logs, log_name);
  if (c->port < 0 || kvr_procs_spawn(c, d->exe, args, log_path, err, sizeof(err)) != 0) {
    if (c->port >= 0)
      fprintf(stderr, "kvrouter demo: %s\n", err);
    return 1;
  }
  return 0;
}

static int start_workers(demo_t *d) {
  for (unsigned w = 0; w < d->cli->workers; w++) {
    kvr_proc_t *c = &d->kids[d->nkids];
    c->port = kvr_procs_free_port();
    snprintf(c->name, sizeof(c->name), "worker %u", w);
    char listen[64], seed_s[32], log_name[64];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", c->port);
    snprintf(seed_s, sizeof(seed_s), "%u", w);
    snprintf(log_name, sizeof(log_name), "worker-%u.log", w);
    char blocks[32];
    char *args[] = {d->exe, "sim", "--listen", listen, "--time-scale", d->scale_s, "--seed",
                    seed_s, NULL,  NULL,       NULL};
    if (d->cli->nworker_blocks > 0) {
      snprintf(blocks, sizeof(blocks), "%u", d->cli->worker_blocks[w]);
      args[8] = "--num-gpu-blocks";
      args[9] = blocks;
    }
    if (spawn(d, c, args, log_name) != 0)
      return 1;
    fprintf(stderr, "kvrouter demo: started %s pid %d on 127.0.0.1:%d\n", c->name, (int)c->pid,
            c->port);
    d->nkids++;
  }
  return 0;
}

static int start_router(demo_t *d) {
  kvr_proc_t *c = &d->kids[d->nkids];
  d->admin_port = kvr_procs_free_port();
  c->port = kvr_procs_free_port();
  snprintf(c->name, sizeof(c->name), "router");
  char listen[64], admin[64], urls[MAX_WORKERS][64];
  snprintf(listen, sizeof(listen), "127.0.0.1:%d", c->port);
  snprintf(admin, sizeof(admin), "127.0.0.1:%d", d->admin_port);
  char *args[2 * MAX_WORKERS + 16];
  size_t k = 0;
  args[k++] = d->exe;
  args[k++] = "serve";
  for (size_t w = 0; w < d->nkids; w++) {
    snprintf(urls[w], sizeof(urls[w]), "http://127.0.0.1:%d", d->kids[w].port);
    args[k++] = "--worker";
    args[k++] = urls[w];
  }
  /* The simulators run time_scale times faster than real time, so the router's default 1 s
   * scrape would see metrics 4-10 simulated seconds old. 100 ms keeps them within about one
   * simulated second at scale 10; the GIE endpoint picker refreshes every 50 ms by default, so
   * gie_scorer is not judged on metrics older than its own deployments see. */
  char *rest[] = {"--listen",     listen,  "--admin-listen",       admin, "--policy", "round_robin",
                  "--access-log", "false", "--scrape-interval-ms", "100", NULL};
  memcpy(&args[k], rest, sizeof(rest));
  if (d->admin_port < 0 || spawn(d, c, args, "router.log") != 0)
    return 1;
  fprintf(stderr, "kvrouter demo: started router pid %d on 127.0.0.1:%d (admin %d)\n", (int)c->pid,
          c->port, d->admin_port);
  d->nkids++;
  return 0;
}

static int wait_healthy(demo_t *d) {
  for (size_t i = 0; i < d->nkids; i++) {
    kvr_proc_t *c = &d->kids[i];
    kvr_procs_health_t h = kvr_procs_wait_health(c, 15, &g_interrupted);
    if (h == KVR_PROCS_HEALTHY)
      continue;
    if (h == KVR_PROCS_EXITED)
      fprintf(stderr, "kvrouter demo: %s exited during start-up (see its log)\n", c->name);
    if (!g_interrupted)
      fprintf(stderr, "kvrouter demo: %s on port %d never became healthy (logs in %s)\n", c->name,
              c->port, d->logs);
    return g_interrupted ? 130 : 1;
  }
  return 0;
}

/* ---- the benchmark ---- */

/* True when the caller's extra options give flag ("--rates 2" or "--rates=2"). The bench's option
 * engine appends a repeated list option to the first one, so the demo leaves out each of its own
 * list options that the caller gives: the caller's replaces it, as `demo --help` promises. */
static bool extra_has(char **extra, int nextra, const char *flag) {
  size_t n = strlen(flag);
  for (int i = 0; i < nextra; i++)
    if (strncmp(extra[i], flag, n) == 0 && (extra[i][n] == '\0' || extra[i][n] == '='))
      return true;
  return false;
}

/* The level plan: three paired rates with --quick, else the max-SLO-rate search; with the caller's
 * own --rates or --concurrency (own_load) neither. */
static int plan_args(const demo_t *d, bool own_load, char **a) {
  int k = 0;
  if (d->cli->quick && own_load) {
    char *quick[] = {"--num-prompts", "60", "--cooldown-s", "5"};
    memcpy(a, quick, sizeof(quick));
    return KVR_ARRAY_SIZE(quick);
  }
  if (d->cli->quick) {
    /* Three paired rates: enough for every table of the report, well under a minute. */
    char *quick[] = {"--rates", "4,8,12", "--num-prompts", "60", "--cooldown-s", "5"};
    memcpy(a, quick, sizeof(quick));
    return KVR_ARRAY_SIZE(quick);
  }
  /* The max-SLO-rate search per phase, paired at the baseline's max rate. */
  if (!own_load)
    a[k++] = "--search";
  /* Levels must outlast a response (~35 s simulated) several times or they measure a burst, not a
   * capacity; multi-turn sessions (5 turns of ~36 s) also need ~2 minutes to reach their steady
   * turn mix: 120 s of warm-up, then at least 60 s (200 prompts) measured. 0.5 req/s (~5% of the
   * max rates here) keeps the whole demo under 5 minutes on 2 cores: at 0.25 it took 303 s (15
   * levels), each further bisection step costs ~20 s. */
  char *search[] = {"--search-start", "6",  "--num-prompts",       "200", "--warmup-s",   "120",
                    "--min-level-s",  "60", "--search-resolution", "0.5", "--cooldown-s", "10"};
  memcpy(a + k, search, sizeof(search));
  return k + (int)KVR_ARRAY_SIZE(search);
}

/* The bench's argv: the A/B against the router, the plan, then the caller's extra options. */
static int bench_args(const demo_t *d, char **extra, int nextra, char **a, char *url,
                      char *admin_url) {
  const demo_cli_t *cli = d->cli;
  snprintf(url, 64, "http://127.0.0.1:%d", d->kids[d->nkids - 1].port);
  snprintf(admin_url, 64, "http://127.0.0.1:%d", d->admin_port);
  int k = 0;
  char *head[] = {"bench", "--url", url, "--admin", admin_url};
  memcpy(a, head, sizeof(head));
  k += KVR_ARRAY_SIZE(head);
  if (!extra_has(extra, nextra, "--ab")) {
    a[k++] = "--ab";
    a[k++] = (char *)cli->ab;
  }
  if (cli->labels && !extra_has(extra, nextra, "--labels")) {
    a[k++] = "--labels";
    a[k++] = (char *)cli->labels;
  }
  char *run[] = {"--workload", (char *)cli->workload, "--time-scale", (char *)d->scale_s,
                 "--seed",     (char *)d->seed_s,     "--out",        (char *)cli->out};
  memcpy(a + k, run, sizeof(run));
  k += KVR_ARRAY_SIZE(run);
  a[k++] = "--title";
  a[k++] = cli->quick ? "kvrouter demo (quick): round-robin vs KV-aware routing"
                      : "kvrouter demo: round-robin vs KV-aware routing";
  /* The caller's --rates/--concurrency replace the demo's plan. */
  bool own_load = extra_has(extra, nextra, "--rates") || extra_has(extra, nextra, "--concurrency");
  if (strcmp(cli->workload, "multiturn") == 0) {
    /* The multiturn: every turn resends the answer actually streamed back. */
    a[k++] = "--multiturn-mode";
    a[k++] = "session";
  }
  k += plan_args(d, own_load, a + k);
  for (int i = 0; i < nextra; i++)
    a[k++] = extra[i];
  a[k] = NULL;
  return k;
}

static int run_bench(demo_t *d, char **extra, int nextra) {
  char url[64], admin_url[64], *a[96];
  int n = bench_args(d, extra, nextra, a, url, admin_url);
  fprintf(stderr, "kvrouter demo: running the A/B (simulated time x%s)\n", d->scale_s);
  int rc = kvr_bench_main(n, a);
  install_handler(); /* libuv restored the default handlers when the bench closed its own */
  return g_interrupted && rc == 0 ? 130 : rc;
}

static int run(demo_t *d, char **extra, int nextra) {
  if (prepare(d) != 0)
    return 1;
  curl_global_init(CURL_GLOBAL_DEFAULT);
  g_interrupted = 0;
  install_handler();
  int rc = start_workers(d);
  if (rc == 0)
    rc = start_router(d);
  if (rc == 0)
    rc = wait_healthy(d);
  if (rc == 0 && !g_interrupted)
    rc = run_bench(d, extra, nextra);
  fprintf(stderr, "kvrouter demo: stopping %zu processes\n", d->nkids);
  kvr_procs_stop_all(d->kids, d->nkids, STOP_GRACE_MS);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (rc == 0)
    printf("Demo done: report in %s/report.md, charts in %s/report.html\n", d->cli->out,
           d->cli->out);
  return rc;
}

int kvr_demo_main(int argc, char **argv) {
  demo_cli_t cli = {.out = "results/demo",
                    .workers = 4,
                    .seed = 42,
                    .workload = "multiturn",
                    .ab = "round_robin,kv_aware"};
  int rest;
  int rc = kvr_cli_main(&demo_cmd, &cli, argc, argv, &rest);
  if (rc != KVR_CLI_CONTINUE)
    return rc;
  if (argc - rest > MAX_EXTRA)
    return kvr_cli_fail(&demo_cmd, "--: at most %d bench options after it", MAX_EXTRA);
  if (cli.nworker_blocks > 0 && cli.nworker_blocks != cli.workers)
    return kvr_cli_fail(&demo_cmd,
                        "--worker-blocks: %zu values for %u workers (give one per worker)",
                        cli.nworker_blocks, cli.workers);
  if (cli.scale == 0)
    cli.scale = cli.quick ? 20 : 10;
  demo_t d;
  memset(&d, 0, sizeof(d));
  d.cli = &cli;
  snprintf(d.scale_s, sizeof(d.scale_s), "%g", cli.scale);
  snprintf(d.seed_s, sizeof(d.seed_s), "%llu", (unsigned long long)cli.seed);
  return run(&d, argv + rest, argc - rest);
}

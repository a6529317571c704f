/* demo_real.c -- the demo's step 2: real processes on 127.0.0.1 and the A/B against them (demo.h).
 *
 * Flow: `EXE sim --time-scale N` per worker, all at once, and then `EXE serve` in front of them as
 * children (this very binary; output to OUT/logs/), each listening on 127.0.0.1 port 0, so the
 * kernel gives each its own free port, which the child prints and the demo reads from its log (a
 * port picked by the demo and released before the child bound it could go to two children) -> poll
 * each /health -> the bench's command
 * line (kvr__demo_bench_args) run in this process by kvr_bench_run_argv() at the rates step 1
 * picked (no search: too slow in real time), its summary into OUT/real/bench-summary.txt, its
 * report into OUT/real/, its results kept in memory -> the CPU every process ran and waited for
 * (kvr_procs_cpu: a warning when the step shared the cores) -> every child stopped by PID (SIGTERM,
 * SIGKILL after a grace period, reaped) -> the levels into the demo's table (real_levels).
 *
 * Scrape interval: both sides see the same simulated interval, the one of a real deployment. The
 * virtual cluster scrapes at `kvrouter serve`'s defaults (every 1 s, stale after 5 s, simulated);
 * the real router here is started with --scrape-interval-ms 1000/N and --scrape-stale-ms 5000/N
 * (real ms), which at time scale N are the same 1 s and 5 s simulated. The other way round (the
 * virtual study scraping every N s simulated) would make the study, which is the demo's headline,
 * describe a router that sees 10-20 s old metrics, which no deployment runs.
 *
 * Invariants: every child started is stopped before kvr_demo_real() returns, on every path; the
 * children also get PR_SET_PDEATHSIG (bench/demo/procs.h), so they go away even if the demo itself
 * is killed. The caller's stop flag aborts the start or stops the current level (the bench writes
 * a partial report); the status is then 130. Only 127.0.0.1 is ever listened on.
 */
#include "demo_int.h"

#include "base/kvr.h"
#include "base/quantile.h"
#include "bench_run.h"

#include <curl/curl.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STOP_GRACE_MS 5000

/* ---- the children ---- */

/* A child's log file: OUT/logs/NAME. */
static void log_path(const kvr_demo_t *d, const char *log_name, char *path, size_t len) {
  snprintf(path, len, "%s/%s", d->logs, log_name);
}

/* Starts the child c (counted in d->nkids at once, so that it is stopped on every path). */
static int spawn(kvr_demo_t *d, const char *exe, kvr_proc_t *c, char **args, const char *log_name) {
  char path[4300], err[4400];
  log_path(d, log_name, path, sizeof(path));
  if (kvr_procs_spawn(c, exe, args, path, err, sizeof(err)) != 0) {
    fprintf(stderr, "kvrouter demo: %s\n", err);
    return 1;
  }
  d->nkids++;
  return 0;
}

/* A wait that did not succeed, in one line; its status (130 when stopped, else 1). */
static int start_failed(const kvr_demo_t *d, const kvr_proc_t *c, kvr_procs_wait_t w,
                        const char *what, volatile sig_atomic_t *stop) {
  if (w == KVR_PROCS_EXITED)
    fprintf(stderr, "kvrouter demo: %s exited during start-up (see its log in %s)\n", c->name,
            d->logs);
  else if (!*stop)
    fprintf(stderr, "kvrouter demo: %s never %s (logs in %s)\n", c->name, what, d->logs);
  return *stop ? 130 : 1;
}

/* Reads the ports the child c printed on the line of its log holding needle: the first one after
 * each key (the router: "(port " twice, its own and its admin port). */
static int read_ports(kvr_demo_t *d, kvr_proc_t *c, const char *log_name, const char *needle,
                      const char *key, int *ports, size_t nports, volatile sig_atomic_t *stop) {
  char path[4300], line[512];
  log_path(d, log_name, path, sizeof(path));
  kvr_procs_wait_t w = kvr_procs_wait_line(c, path, needle, line, sizeof(line), 15, stop);
  if (w != KVR_PROCS_READY)
    return start_failed(d, c, w, "said which port it listens on", stop);
  if (kvr_procs_ports(line, key, ports, nports) != nports) {
    fprintf(stderr, "kvrouter demo: %s: no port in its line '%s'\n", c->name, line);
    return 1;
  }
  return 0;
}

/* `EXE sim` on 127.0.0.1, port 0: the kernel picks a free port, the sim prints it. */
static int spawn_worker(kvr_demo_t *d, const char *exe, unsigned w) {
  kvr_proc_t *c = &d->kids[d->nkids];
  snprintf(c->name, sizeof(c->name), "worker %u", w);
  char seed_s[32], log_name[64], blocks[32];
  snprintf(seed_s, sizeof(seed_s), "%u", w);
  snprintf(log_name, sizeof(log_name), "worker-%u.log", w);
  /* --enable-prompt-tokens-details: the demo's bench reports per-request cached tokens, as an
   * operator who wants them starts vLLM. */
  char *args[] = {(char *)exe,   "sim",          "--listen",
                  "127.0.0.1:0", "--time-scale", d->scale_s,
                  "--seed",      seed_s,         "--enable-prompt-tokens-details",
                  NULL,          NULL,           NULL};
  if (d->cli->nworker_blocks > 0) {
    snprintf(blocks, sizeof(blocks), "%u", d->cli->worker_blocks[w]);
    args[9] = "--num-gpu-blocks";
    args[10] = blocks;
  }
  return spawn(d, exe, c, args, log_name);
}

/* The port worker w printed ("sim listening on 127.0.0.1:PORT ..."). */
static int worker_port(kvr_demo_t *d, unsigned w, volatile sig_atomic_t *stop) {
  kvr_proc_t *c = &d->kids[w];
  char log_name[64];
  snprintf(log_name, sizeof(log_name), "worker-%u.log", w);
  int rc = read_ports(d, c, log_name, "sim listening on ", "127.0.0.1:", &c->port, 1, stop);
  if (rc != 0)
    return rc;
  fprintf(stderr, "kvrouter demo: started %s pid %d on 127.0.0.1:%d\n", c->name, (int)c->pid,
          c->port);
  return 0;
}

/* `EXE serve` in front of the workers, its two listeners on port 0; their ports from its log
 * ("listening on 127.0.0.1:0 (port N), admin on 127.0.0.1:0 (port M)"). */
static int start_router(kvr_demo_t *d, const char *exe, volatile sig_atomic_t *stop) {
  kvr_proc_t *c = &d->kids[d->nkids];
  snprintf(c->name, sizeof(c->name), "router");
  char urls[KVR_DEMO_MAX_WORKERS][64];
  char *args[2 * KVR_DEMO_MAX_WORKERS + 16];
  size_t k = 0;
  args[k++] = (char *)exe;
  args[k++] = "serve";
  for (size_t w = 0; w < d->nkids; w++) {
    snprintf(urls[w], sizeof(urls[w]), "http://127.0.0.1:%d", d->kids[w].port);
    args[k++] = "--worker";
    args[k++] = urls[w];
  }
  /* The scrape at serve's default in simulated time (see the header). */
  char *rest[] = {"--listen",
                  "127.0.0.1:0",
                  "--admin-listen",
                  "127.0.0.1:0",
                  "--policy",
                  "round_robin",
                  "--access-log",
                  "false",
                  "--scrape-interval-ms",
                  d->scrape_s,
                  "--scrape-stale-ms",
                  d->stale_s,
                  NULL};
  memcpy(&args[k], rest, sizeof(rest));
  if (spawn(d, exe, c, args, "router.log") != 0)
    return 1;
  int ports[2];
  int rc = read_ports(d, c, "router.log", " listening on ", "(port ", ports, 2, stop);
  if (rc != 0)
    return rc;
  c->port = ports[0];
  d->admin_port = ports[1];
  fprintf(stderr, "kvrouter demo: started router pid %d on 127.0.0.1:%d (admin %d)\n", (int)c->pid,
          c->port, d->admin_port);
  return 0;
}

static int wait_healthy(kvr_demo_t *d, volatile sig_atomic_t *stop) {
  for (size_t i = 0; i < d->nkids; i++) {
    kvr_proc_t *c = &d->kids[i];
    kvr_procs_wait_t h = kvr_procs_wait_health(c, 15, stop);
    if (h != KVR_PROCS_READY)
      return start_failed(d, c, h, "answered GET /health", stop);
  }
  return 0;
}

/* Every worker started at once, then their ports read, then the router in front of them. */
static int start_all(kvr_demo_t *d, const char *exe, volatile sig_atomic_t *stop) {
  for (unsigned w = 0; w < d->cli->workers; w++)
    if (spawn_worker(d, exe, w) != 0)
      return 1;
  for (unsigned w = 0; w < d->cli->workers; w++) {
    int rc = worker_port(d, w, stop);
    if (rc != 0)
      return rc;
  }
  int rc = start_router(d, exe, stop);
  return rc != 0 ? rc : wait_healthy(d, stop);
}

/* ---- the A/B ---- */

/* Removes the .json files of DIR/results, so that the folder holds this run's levels only. */
static void clear_results(const char *dir) {
  char path[4400];
  snprintf(path, sizeof(path), "%s/results", dir);
  DIR *dp = opendir(path);
  if (dp == NULL)
    return;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n > 5 && strcmp(e->d_name + n - 5, ".json") == 0) {
      char f[4700];
      snprintf(f, sizeof(f), "%s/%s", path, e->d_name);
      unlink(f);
    }
  }
  closedir(dp);
}

/* The 95% intervals of the level's TTFT and TPOT at quantile q over its measured requests. */
static void real_intervals(kvr__demo_lvl_t *l, const kvr_level_t *lv, double q) {
  double *ttft = kvr_xmalloc((lv->nrecs + 1) * sizeof(double));
  double *tpot = kvr_xmalloc((lv->nrecs + 1) * sizeof(double));
  size_t nttft = 0, ntpot = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok)
      continue;
    if (r->ttft_ms >= 0)
      ttft[nttft++] = r->ttft_ms;
    if (r->tpot_ms >= 0)
      tpot[ntpot++] = r->tpot_ms;
  }
  kvr_quantile_sort(ttft, nttft);
  kvr_quantile_sort(tpot, ntpot);
  if (nttft > 0)
    kvr__demo_q_interval(ttft, nttft, q, &l->real_ttft_lo, &l->real_ttft_hi);
  if (ntpot > 0)
    kvr__demo_q_interval(tpot, ntpot, q, &l->real_tpot_lo, &l->real_tpot_hi);
  free(ttft);
  free(tpot);
}

/* One rate level of the real run into the demo's table: its agreement quantiles, verdict, turns. */
static void real_level(kvr_demo_t *d, const kvr_run_t *run, const kvr_level_t *lv) {
  kvr__demo_lvl_t *l = kvr__demo_level(d, run->label, lv->rate, true);
  if (l == NULL)
    return;
  l->real = true;
  snprintf(l->policy, sizeof(l->policy), "%s", run->policy);
  l->real_ttft = kvr__demo_stat_at(&lv->ttft, kvr__demo_agree_q(d, NULL));
  l->real_tpot = kvr__demo_stat_at(&lv->tpot, kvr__demo_agree_q(d, NULL));
  l->real_pass = lv->pass;
  l->real_interrupted = lv->interrupted;
  char failing[40] = "";
  if (!lv->pass)
    kvr_stats_fail_names(lv->fail_mask, failing, sizeof(failing));
  snprintf(l->real_fail, sizeof(l->real_fail), "%s", failing);
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup)
      continue;
    l->real_n++;
    l->real_later += r->turn >= 2;
    l->real_max_turn = r->turn > l->real_max_turn ? r->turn : l->real_max_turn;
  }
  real_intervals(l, lv, kvr__demo_agree_q(d, NULL));
}

/* The real run's rate levels (a concurrency level has no rate to pair with its twin's). */
static void real_levels(kvr_demo_t *d, const kvr_results_t *res) {
  for (size_t r = 0; res && r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      if (res->runs[r].levels[i]->concurrency == 0)
        real_level(d, &res->runs[r], res->runs[r].levels[i]);
}

static int run_bench(kvr_demo_t *d, volatile sig_atomic_t *stop) {
  char url[64], admin_url[64], *a[160];
  int n = kvr__demo_bench_args(d, false, a, url, admin_url);
  fprintf(stderr, "kvrouter demo: step 2/3: running the A/B (simulated time x%s) at %s req/s\n",
          d->scale_s, kvr__demo_extra_has(d, "--rates") ? "the caller's" : d->rates_disp);
  clear_results(d->real_out);
  /* The bench's summary would bound each limit as if the few rates were a search; the demo
   * prints its own lines from the levels (step 3), the bench's go to a file. */
  char path[4400];
  snprintf(path, sizeof(path), "%s/bench-summary.txt", d->real_out);
  fflush(stdout);
  FILE *summary = fopen(path, "w");
  kvr_bench_io_t io = {
      .summary = summary ? summary : stdout, .errors = stderr, .progress = stderr, .stop = stop};
  kvr_results_t *res = NULL;
  char err[512];
  int rc = kvr_bench_run_argv(n, a, &io, &res, err, sizeof(err));
  if (summary != NULL)
    fclose(summary);
  real_levels(d, res);
  kvr_stats_results_free(res);
  return *stop && rc == 0 ? 130 : rc;
}

/* CPU so far: the machine's busy time, and this process's and every child's time on a core and
 * waiting for one; false when some figure cannot be read. */
static bool cpu_now(const kvr_demo_t *d, double *busy, double *run, double *wait) {
  double r, w;
  if (kvr_procs_machine_busy(busy) != 0 || kvr_procs_cpu(0, run, wait) != 0)
    return false;
  for (size_t i = 0; i < d->nkids; i++) {
    if (d->kids[i].pid <= 0 || kvr_procs_cpu(d->kids[i].pid, &r, &w) != 0)
      return false;
    *run += r, *wait += w;
  }
  return true;
}

void kvr__demo_cpu_note(const kvr_demo_t *d, kvr_buf_t *b) {
  double all = d->cpu_run_s + d->cpu_wait_s;
  if (!d->cpu_known || all <= 0 || d->cpu_wall_s <= 0)
    return;
  double others = fmax(0, d->cpu_busy_s - d->cpu_run_s) / d->cpu_wall_s;
  kvr_buf_printf(b,
                 "Over the A/B's %.0f s the demo's processes ran %.1f s on a core and waited %.1f "
                 "s for one (%.0f%% of their runnable time); the machine's other work used %.2f "
                 "cores on average (/proc/PID/schedstat, /proc/stat).\n",
                 d->cpu_wall_s, d->cpu_run_s, d->cpu_wait_s, d->cpu_wait_s / all * 100, others);
  if (d->cpu_wait_s / all > KVR__DEMO_CPU_WAIT_WARN)
    kvr_buf_printf(b,
                   "Warning: they waited over %.0f%%: other work shared the cores, real latencies "
                   "include the waits, and real and virtual time need not agree; run the demo on "
                   "cores it has to itself.\n",
                   KVR__DEMO_CPU_WAIT_WARN * 100);
}

/* The step's header: the policies, the workload and the load. */
static void print_header(const kvr_demo_t *d) {
  char abv[512] = "the caller's policies";
  if (!kvr__demo_extra_has(d, "--ab")) {
    size_t k = 0;
    for (const char *c = d->cli->ab; *c && k + 5 < sizeof(abv); c++)
      k += (size_t)snprintf(abv + k, sizeof(abv) - k, "%s", *c == ',' ? " vs " : (char[]){*c, 0});
  }
  if (kvr__demo_extra_has(d, "--rates") || kvr__demo_extra_has(d, "--concurrency"))
    printf("\n== Step 2/3: real time: %s on %s at the caller's load (after --) ==\n", abv,
           d->cli->workload);
  else
    printf("\n== Step 2/3: real time: %s on %s at %s req/s (%s) ==\n", abv, d->cli->workload,
           d->rates_disp, d->rates_why);
  fflush(stdout);
}

int kvr_demo_real(kvr_demo_t *d, const char *exe, volatile sig_atomic_t *stop) {
  print_header(d);
  double t1 = kvr__demo_now();
  curl_global_init(CURL_GLOBAL_DEFAULT);
  int rc = start_all(d, exe, stop);
  double busy0 = 0, run0 = 0, wait0 = 0, wall0 = kvr__demo_now();
  bool cpu0 = false;
  if (rc == 0 && !*stop) {
    cpu0 = cpu_now(d, &busy0, &run0, &wait0);
    rc = run_bench(d, stop);
  }
  double busy1, run1, wait1;
  d->cpu_known = cpu0 && cpu_now(d, &busy1, &run1, &wait1);
  if (d->cpu_known) {
    d->cpu_busy_s = busy1 - busy0, d->cpu_run_s = run1 - run0, d->cpu_wait_s = wait1 - wait0;
    d->cpu_wall_s = kvr__demo_now() - wall0;
  }
  fprintf(stderr, "kvrouter demo: stopping %zu processes\n", d->nkids);
  kvr_procs_stop_all(d->kids, d->nkids, STOP_GRACE_MS);
  if (*stop && rc == 0)
    rc = 130;
  printf("Step 2 took %.0f s; its report: %s/report.md\n", kvr__demo_now() - t1, d->real_out);
  kvr_buf_t note = KVR_BUF_INIT;
  kvr__demo_cpu_note(d, &note);
  if (note.len)
    fputs(note.data, stdout);
  kvr_buf_free(&note);
  return rc;
}

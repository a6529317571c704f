/* demo_plan.c -- the demo's set-up, its bench command lines and the preflight (demo.h).
 *
 * Structs: kvr_demo_t (demo_int.h), made by kvr_demo_new() from the options: every figure the
 * steps pass on as text ("%g" of the time scale, the seed, the workers, the scrape intervals) is
 * formatted once here, so the real run and its virtual twin get the same words.
 *
 * Flow: kvr_demo_new() (rules, strings, folder names) -> kvr_demo_preflight() (policies; the
 * twin's command line run for one request in virtual time through kvr_bench_run_argv, which
 * parses it with the bench's own table and rules) -> the steps (demo_virtual.c, demo_real.c,
 * demo_agree.c) take their command lines from kvr__demo_bench_args().
 *
 * The bench command lines (kvr__demo_bench_args) are the ones a person would type to run the same
 * bench, and what each report shows as its command: the demo's plan first, then the caller's
 * options after --. The option engine appends a repeated list option to the first one, so the demo
 * leaves out each of its own list options (--ab, --labels, --rates) that the caller gives: the
 * caller's replaces it, as `demo --help` promises.
 *
 * Plan: the study's own (bench/vcluster/study.c: --num-prompts 100 --warmup 0 --cooldown-s 10,
 * the scenario's --warmup-s, 120 s for multiturn) with a measured window per mode, the real run and
 * its twin alike: --quick the study's 60 s, so its level is one the search ran in virtual time; the
 * full demo 360 s (about 2,300 requests a level on multiturn; two levels, 110 s at time scale 10).
 * Why that long: a p99 is a level's few worst requests, and in closed-loop sessions which requests
 * those are depends on the order of arrivals, which the real run's timing jitter changes. The same
 * 60 s level run again in virtual time with the network delay moved by under a millisecond moves
 * its TTFT p99 by up to 17% (multiturn at 6.46 and 7.05 req/s, 4 workers; TPOT p99 by up to 9%);
 * at 360 s by up to 6%. The real run and its twin agree within 10% only where the figure itself
 * holds still (demo_virtual.c picks a rate where it does).
 */
#include "demo_int.h"

#include "base/kvr.h"
#include "base/log.h"
#include "bench_run.h"
#include "policies/policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kvr_demo_opts_default(kvr_demo_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->out = "results/demo";
  o->workers = 4;
  o->seed = 42;
  o->seeds = 1;
  o->workload = "multiturn";
  o->ab = "round_robin,kv_aware";
}

double kvr__demo_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* ---- set-up ---- */

static int check(const kvr_demo_opts_t *o, const kvr_study_scenario_t *sc, char *err,
                 size_t errlen) {
  if (o->nworker_blocks > 0 && o->nworker_blocks != o->workers) {
    snprintf(err, errlen, "--worker-blocks: %zu values for %u workers (give one per worker)",
             o->nworker_blocks, o->workers);
    return KVR_EINVAL;
  }
  if (sc == NULL || strcmp(sc->name, "bursty") == 0 || strcmp(sc->name, "mixed-fleet") == 0) {
    snprintf(err, errlen,
             "--workload: '%s' is not one of multiturn, documents, control, agentic, hot-prefix",
             o->workload);
    return KVR_EINVAL;
  }
  return 0;
}

/* The words every step passes on, formatted once. */
static void format(kvr_demo_t *d, const kvr_study_scenario_t *sc) {
  const kvr_demo_opts_t *o = d->cli;
  /* 10 for --quick too: at 20 (and at 15 while another job kept both cores busy) the load
   * generator's send lag (p99 up to 30 ms real, 0.3-0.6 s simulated) broke kv_aware's TTFT SLO in
   * real time. At 10 the real step takes 1.2 cores of 2 (the router 0.55, the load generator 0.4,
   * each simulator 0.06), its processes wait under 0.3 ms on average to run and at most 5 ms
   * (perf sched), and its TTFT and TPOT p50 and p90 agree with virtual time within 3%, as long as
   * nothing else takes the cores (shared with busy sessions, its processes waited 30-60% of their
   * time to run and TTFT p99 came out 1.5 to 10 times virtual). */
  double scale = o->scale == 0 ? 10 : o->scale;
  snprintf(d->warmup_s, sizeof(d->warmup_s), "%g", sc->warmup_s);
  snprintf(d->scale_s, sizeof(d->scale_s), "%g", scale);
  snprintf(d->seed_s, sizeof(d->seed_s), "%llu", (unsigned long long)o->seed);
  snprintf(d->workers_s, sizeof(d->workers_s), "%u", o->workers);
  size_t k = 0;
  for (size_t i = 0; i < o->nworker_blocks && k < sizeof(d->blocks_s); i++)
    k += (size_t)snprintf(d->blocks_s + k, sizeof(d->blocks_s) - k, "%s%u", i ? "," : "",
                          o->worker_blocks[i]);
  /* The simulators run `scale` times faster than real time: 1000/N ms real (stale after 5000/N)
   * is serve's default scrape in simulated time, the interval of the virtual cluster. */
  snprintf(d->scrape_s, sizeof(d->scrape_s), "%.0f", fmax(1, round(1000 / scale)));
  snprintf(d->stale_s, sizeof(d->stale_s), "%.0f", fmax(1, round(5000 / scale)));
  snprintf(d->logs, sizeof(d->logs), "%s/logs", o->out);
  snprintf(d->virt_out, sizeof(d->virt_out), "%s/virtual", o->out);
  snprintf(d->real_out, sizeof(d->real_out), "%s/real", o->out);
  snprintf(d->agree_out, sizeof(d->agree_out), "%s/agreement-virtual", o->out);
}

int kvr_demo_new(const kvr_demo_opts_t *o, kvr_demo_t **out, char *err, size_t errlen) {
  *out = NULL;
  const kvr_study_scenario_t *sc = kvr_study_scenario(o->workload);
  if (check(o, sc, err, errlen) != 0)
    return KVR_EINVAL;
  kvr_demo_t *d = kvr_xcalloc(1, sizeof(*d));
  d->cli = o;
  d->t0 = kvr__demo_now();
  format(d, sc);
  *out = d;
  return 0;
}

void kvr_demo_free(kvr_demo_t *d) {
  free(d);
}

/* ---- the bench's command lines ---- */

bool kvr__demo_extra_has(const kvr_demo_t *d, const char *flag) {
  size_t n = strlen(flag);
  for (int i = 0; i < d->cli->nextra; i++) {
    const char *a = d->cli->extra[i];
    if (strncmp(a, flag, n) == 0 && (a[n] == '\0' || a[n] == '='))
      return true;
  }
  return false;
}

int kvr__demo_cluster_args(kvr_demo_t *d, char **a) {
  int k = 0;
  a[k++] = "--workers";
  a[k++] = d->workers_s;
  if (d->cli->nworker_blocks > 0) {
    a[k++] = "--worker-blocks";
    a[k++] = d->blocks_s;
  }
  return k;
}

/* Where the run goes: the cluster (virtual) or the children, with the real run's time scale. */
static int target_args(kvr_demo_t *d, bool virt, char **a, char *url, char *admin_url) {
  int k = 0;
  if (virt) {
    a[k++] = "--virtual";
    return k + kvr__demo_cluster_args(d, a + k);
  }
  snprintf(url, 64, "http://127.0.0.1:%d", d->kids[d->nkids - 1].port);
  snprintf(admin_url, 64, "http://127.0.0.1:%d", d->admin_port);
  char *head[] = {"--url", url, "--admin", admin_url, "--time-scale", d->scale_s};
  memcpy(a, head, sizeof(head));
  return (int)KVR_ARRAY_SIZE(head);
}

/* The run's policies, workload, seed, folder, title and session mode. */
static int run_args(kvr_demo_t *d, bool virt, char **a) {
  const kvr_demo_opts_t *cli = d->cli;
  int k = 0;
  if (!kvr__demo_extra_has(d, "--ab")) {
    a[k++] = "--ab";
    a[k++] = (char *)cli->ab;
  }
  if (cli->labels && !kvr__demo_extra_has(d, "--labels")) {
    a[k++] = "--labels";
    a[k++] = (char *)cli->labels;
  }
  char *run[] = {"--workload", (char *)cli->workload,
                 "--seed",     d->seed_s,
                 "--out",      virt ? d->agree_out : d->real_out};
  memcpy(a + k, run, sizeof(run));
  k += (int)KVR_ARRAY_SIZE(run);
  a[k++] = "--title";
  a[k++] = virt         ? "kvrouter demo: the real run's levels in virtual time"
           : cli->quick ? "kvrouter demo (quick): round-robin vs KV-aware routing, real time"
                        : "kvrouter demo: round-robin vs KV-aware routing, real time";
  if (strcmp(cli->workload, "multiturn") == 0) {
    /* The multiturn: every turn resends the answer actually streamed back. */
    a[k++] = "--multiturn-mode";
    a[k++] = "session";
  }
  return k;
}

int kvr__demo_bench_args(kvr_demo_t *d, bool virt, char **a, char *url, char *admin_url) {
  int k = 0;
  a[k++] = "bench";
  k += target_args(d, virt, a + k, url, admin_url);
  k += run_args(d, virt, a + k);
  /* The caller's --rates/--concurrency replace the demo's. */
  if (!kvr__demo_extra_has(d, "--rates") && !kvr__demo_extra_has(d, "--concurrency")) {
    a[k++] = "--rates";
    a[k++] = d->rates_s;
  }
  /* The study's plan, 360 s measured per level in the full demo (see the header). */
  char *plan[] = {"--num-prompts", "100",       "--warmup",      "0",
                  "--warmup-s",    d->warmup_s, "--min-level-s", d->cli->quick ? "60" : "360",
                  "--cooldown-s",  "10"};
  memcpy(a + k, plan, sizeof(plan));
  k += (int)KVR_ARRAY_SIZE(plan);
  for (int i = 0; i < d->cli->nextra; i++)
    a[k++] = d->cli->extra[i];
  a[k] = NULL;
  return k;
}

/* ---- the preflight ---- */

/* flag's list of policies: every name one the router knows, else KVR_EINVAL with err. */
static int check_policies(const char *flag, const char *list, char *err, size_t errlen) {
  char tmp[1024], *save = NULL;
  snprintf(tmp, sizeof(tmp), "%s", list);
  for (char *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save))
    if (kvr_policy_find(t) == NULL) {
      char names[512];
      kvr_policy_names(names, sizeof(names));
      snprintf(err, errlen, "%s: unknown policy '%s' (valid: %s)", flag, t, names);
      return KVR_EINVAL;
    }
  return 0;
}

static int preflight_policies(const kvr_demo_t *d, char *err, size_t errlen) {
  const kvr_demo_opts_t *o = d->cli;
  int rc = check_policies("--ab", o->ab, err, errlen);
  for (int i = 0; rc == 0 && i < o->nextra; i++) {
    if (strcmp(o->extra[i], "--ab") == 0 && i + 1 < o->nextra)
      rc = check_policies("after --: --ab", o->extra[i + 1], err, errlen);
    else if (strncmp(o->extra[i], "--ab=", 5) == 0)
      rc = check_policies("after --: --ab", o->extra[i] + 5, err, errlen);
  }
  return rc;
}

int kvr_demo_preflight(kvr_demo_t *d, char *err, size_t errlen) {
  int rc = preflight_policies(d, err, errlen);
  if (rc != 0 || d->cli->nextra == 0)
    return rc;
  char *a[160];
  snprintf(d->rates_s, sizeof(d->rates_s), "1"); /* step 1 sets the real ones */
  int n = kvr__demo_bench_args(d, true, a, NULL, NULL);
  char *one[] = {"--num-prompts", "1",
                 "--warmup",      "0",
                 "--warmup-s",    "0",
                 "--min-level-s", "0",
                 "--cooldown-s",  "0",
                 "--out",         "/dev/null/kvrouter-demo-preflight"}; /* nothing written */
  memcpy(a + n, one, sizeof(one));
  n += (int)KVR_ARRAY_SIZE(one);
  a[n] = NULL;
  kvr_log_level_t level = kvr_log_get_level();
  kvr_log_set_level(KVR_LOG_ERROR);
  kvr_results_t *res = NULL;
  char e[512] = "";
  kvr_bench_io_t io = {0};
  rc = kvr_bench_run_argv(n, a, &io, &res, e, sizeof(e));
  kvr_log_set_level(level);
  kvr_stats_results_free(res);
  if (rc != 2)
    return 0;
  const char *why = strncmp(e, "kvrouter bench: ", 16) == 0 ? e + 16 : e;
  snprintf(err, errlen, "after --: %s", why);
  return KVR_EINVAL;
}

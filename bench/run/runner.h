/* runner.h -- one `kvrouter bench` run: labels, level plans, the max-SLO-rate search, the report.
 *
 * kvr_runner_opts_t is the bench's whole command line (router/bench.c fills it through the option
 * engine). A kvr_runner_t owns the workload, the load generator, the monitor and the results of
 * one run on the caller's loop; the caller owns the loop and the signal handles, and calls
 * kvr_runner_interrupt() from its signal callback.
 *
 * Flow of kvr_runner_run(), for each label (each --ab policy, or one run): PUT /admin/policy,
 * prefix-cache reset, cooldown after a switch -> levels (the --rates/--concurrency list, or the
 * search: bracket up/down by doubling from a start load, then bisect until the gap between the last
 * pass and the first fail is <= the resolution). Around each level the monitor reads the workers'
 * preemption counters and KV cache usage, so every level shows which limit it hit.
 * kvr_runner_report() then writes the report files and prints the summary.
 *
 * Fair A/B: the labels replay identical prompts, so without a reset a later label would find the
 * earlier label's prompts in the workers' prefix caches. reset_cache (on by default with --ab)
 * empties them (and the router's cache index) before each label.
 *
 * Virtual time (--virtual): the same flow against a kvr_vcluster_t in the same process instead of
 * an HTTP endpoint: the load generator runs on its virtual transport, the policy switch, the cache
 * reset and the level's engine figures go to the cluster directly, and cooldowns pass in virtual
 * time. No --url or --admin is needed.
 *
 * Invariants: a level's trace is seeded by (seed, load), so two labels at the same load send the
 * identical requests (a paired comparison); later labels start their search at the baseline's max
 * load so the detailed comparison always has a paired level. Durations given in the options
 * (cooldown, think time) are simulated seconds, divided by time_scale for the real wait.
 */
#ifndef KVR_RUNNER_H
#define KVR_RUNNER_H

#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "bench/vcluster/vcluster.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#define KVR_RUNNER_MAX_LIST 64

typedef struct kvr_runner_opts_s {
  kvr_loadgen_opts_t lg;  /* lg.progress: progress lines (the runner's too), NULL = quiet */
  kvr_workload_opts_t wl; /* wl.seed is set from seed by kvr_runner_opts_check() */
  double rates[KVR_RUNNER_MAX_LIST]; /* request rates, simulated req/s */
  size_t nrates;
  unsigned conc[KVR_RUNNER_MAX_LIST]; /* closed-loop users instead */
  size_t nconc;
  bool search;        /* find the max SLO-compliant load */
  bool no_early_stop; /* run every search level to its end */
  double search_start, search_max, search_res;
  char *ab[KVR_RUNNER_MAX_LIST]; /* policies, one run each (needs admin); owned by the caller */
  size_t nab;
  char *labels[KVR_RUNNER_MAX_LIST]; /* run labels (one per run), < 64 characters */
  size_t nlabels;
  /* --policy-params LABEL=JSON: the policy parameters of one run (borrowed strings, checked). */
  const char *params[KVR_RUNNER_MAX_LIST];
  size_t nparams;
  const char *admin; /* the router's admin URL, or NULL */
  const char *out;   /* results folder */
  const char *title; /* report title, NULL for the default */
  uint64_t seed;
  kvr_slo_t slo;
  double cooldown_s;
  int reset_cache;        /* -1: default (on with --ab), 0: off, 1: on */
  bool quiet;             /* no progress output */
  const char *command;    /* the command line, for the report */
  bool virt;              /* --virtual: run against a cluster in virtual time (bench/vcluster/) */
  bool keep_cluster;      /* virtual: each level on the cluster the previous one left (caches,
                           * learned rates), as a server run at one rate after another; default:
                           * each level on a fresh cluster (kvr_vcluster_restart) */
  kvr_vcluster_opts_t vc; /* that cluster */
} kvr_runner_opts_t;

/* Adds one --policy-params value, "LABEL=JSON" (text is borrowed). Returns 0 or KVR_EINVAL with
 * err ("needs LABEL={...}", "not a JSON object", too many). */
int kvr_runner_add_params(kvr_runner_opts_t *opts, const char *text, char *err, size_t errlen);

/* Fills opts with the bench's defaults (model NULL: asked from the endpoint; seed 42; SLO TTFT p99
 * 1000 ms, TPOT p99 60 ms; cooldown 30 s; search 1..64 by 0.05; out results/bench). */
void kvr_runner_opts_default(kvr_runner_opts_t *opts);

/* Checks the rules between options ("--ab: needs --admin URL") and derives the dependent ones
 * (workload seed, search start from the first listed load, early stop). Returns 0 or KVR_EINVAL
 * with one line "--flag: what is wrong" in err. */
int kvr_runner_opts_check(kvr_runner_opts_t *opts, char *err, size_t errlen);

/* The label of run i: --labels, else phase0/phase3 for two policies, the policy, or "bench". */
const char *kvr_runner_label(const kvr_runner_opts_t *opts, size_t i);

typedef struct kvr_runner_s kvr_runner_t;

/* Sets up a run on loop: workload, load generator, monitor, and the model (GET /v1/models when
 * opts->lg.model is NULL). opts is borrowed and must outlive the runner. Returns 0 with *out, or
 * KVR_EINVAL (options the workload or load generator reject: a usage error) or another negative
 * code (monitor, model lookup) with one line in err and *out NULL. */
int kvr_runner_new(uv_loop_t *loop, kvr_runner_opts_t *opts, kvr_runner_t **out, char *err,
                   size_t errlen);

/* Runs every label. Returns 0 (also when interrupted: see kvr_runner_interrupted()) or a negative
 * code with one line in err when a policy switch failed (the labels before it are kept). */
int kvr_runner_run(kvr_runner_t *r, char *err, size_t errlen);

/* Writes the report into opts->out and prints the summary and the report's path to out. Returns 0
 * or a negative code with one line in err. */
int kvr_runner_report(kvr_runner_t *r, FILE *out, char *err, size_t errlen);

/* Stops the current level or cooldown; later levels do not start. Safe from a uv signal callback
 * on the runner's loop. */
void kvr_runner_interrupt(kvr_runner_t *r);
bool kvr_runner_interrupted(const kvr_runner_t *r);

/* Hands the results over to the caller (who frees them with kvr_stats_results_free); the runner
 * keeps none afterwards (call after kvr_runner_report). */
kvr_results_t *kvr_runner_take_results(kvr_runner_t *r);

/* True when the run is in virtual time (--virtual). */
bool kvr_runner_virtual(const kvr_runner_t *r);

/* Frees the runner (runs the loop until the load generator's handles are closed; the caller runs
 * it once more for the monitor's). Accepts NULL. */
void kvr_runner_free(kvr_runner_t *r);

/* The max-SLO-load search as a pure state machine: x is the load to run next; feed the level's
 * outcome; done when the bracket is within the resolution, the cap passes, the floor fails or after
 * 64 levels. Rates are rounded to 0.001, user counts to integers >= 1. */
typedef struct kvr_runner_search_s {
  double x;      /* the next load */
  double lo, hi; /* highest pass (0: none yet), lowest fail (INFINITY: none yet) */
  double max, res, floor;
  bool conc, done;
  int steps;
} kvr_runner_search_t;

void kvr_runner_search_init(kvr_runner_search_t *s, double start, double max, double res,
                            bool conc);
void kvr_runner_search_feed(kvr_runner_search_t *s, bool pass);

#endif

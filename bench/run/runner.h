/* runner.h -- one `kvrouter bench` run: labels, level plans, the max-SLO-rate search, the report.
 *
 * kvr_runner_opts_t (runner_types.h) is the bench's whole command line: bench_options.c's table
 * fills it from argv through the option engine, the policy study from structs
 * (bench/vcluster/study.h). A kvr_runner_t owns the workload, the load generator, the monitor and
 * the results of one run on the caller's loop; the caller owns the loop and the signal handles, and
 * calls kvr_runner_interrupt() from its signal callback.
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
 * Fleet sizing (--size-fleet, virtual time only): each label's levels run one rate (a trace's own
 * mean rate, or --rates R) on fleets of different sizes, chosen by kvr_fleet_search_t
 * (bench/vcluster/fleet.h: from --workers, doubling while a fleet fails, halving while one passes,
 * bisecting to adjacent fleets, at most --size-fleet-max); each level's cluster is resized
 * (kvr_vcluster_set_workers) and restarted fresh, so every fleet meets the same requests. Later
 * labels start from the baseline's answer. The report is fleet.h's (report.md, fleet.json, one
 * JSON per fleet) instead of the rate report.
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
#include "runner_types.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

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

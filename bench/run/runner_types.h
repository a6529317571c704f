/* runner_types.h -- kvr_runner_opts_t, the settings of one bench run, without the runner's
 * functions (runner.h).
 *
 * Types only, so that a folder which builds runs without running them (the policy study,
 * bench/vcluster/study.h, fills one per cell) includes the settings and nothing of the runner.
 * Every field is a flag of `kvrouter bench` (bench_options.c's table fills them from argv and
 * kvr_runner_opts_default() holds their defaults); kvr_runner_opts_check() (runner.h) applies the
 * rules between them. String list items (ab, labels) are heap copies the option engine frees
 * (kvr_bench_options_free()); the other strings are borrowed.
 */
#ifndef KVR_RUNNER_TYPES_H
#define KVR_RUNNER_TYPES_H

#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "bench/vcluster/vcluster.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
  char *ab[KVR_RUNNER_MAX_LIST]; /* policies, one run each (needs admin); heap copies */
  size_t nab;
  char *labels[KVR_RUNNER_MAX_LIST]; /* run labels (one per run), < 64 characters; heap copies */
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

  /* --size-fleet (virtual only): per label, the smallest fleet that serves one rate (a trace's own,
   * or rates[0]) within the SLOs, searched over worker counts from vc.workers up to
   * size_fleet_max (bench/vcluster/fleet.h). */
  bool size_fleet;
  unsigned size_fleet_max;
} kvr_runner_opts_t;

#endif

/* study.h -- `kvrouter bench study`: every policy on every scenario over several seeds, in virtual
 * time, in parallel, summed up in one table.
 *
 * A scenario is a named set of bench flags (a workload and what makes it itself: session mode,
 * burstiness, a mixed fleet). A cell is one (scenario, seed): one `kvrouter bench --virtual --ab
 * POLICIES --search` run, whose own report lands in OUT/<scenario>/seed<N>/. The study runs the
 * cells on `jobs` threads (each cell is a separate cluster, load generator and router: nothing is
 * shared but the read-only policy registry), then writes OUT/STUDY.md and OUT/study.json: per
 * scenario and policy the mean max SLO-compliant rate over the seeds with its min and max, and
 * kv_aware's ratio to round_robin, to the best reference policy and to the oracle.
 *
 * The bench itself stays in router/bench.c (its option table): the study calls back into it with
 * each cell's argv (kvr_study_run_fn).
 */
#ifndef KVR_STUDY_H
#define KVR_STUDY_H

#include "base/buf.h"
#include "bench/report/report_types.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define KVR_STUDY_MAX 32

/* One scenario: its name and the bench flags that make it (NULL-terminated). */
typedef struct kvr_study_scenario_s {
  const char *name;
  const char *about; /* one line for the report */
  const char *const *args;
} kvr_study_scenario_t;

/* The built-in scenarios, NULL-name-terminated: multiturn, documents, control, agentic, hot-prefix,
 * bursty (multiturn at burstiness 0.3), mixed-fleet (documents with one worker at half the KV). */
extern const kvr_study_scenario_t kvr_study_scenarios[];
const kvr_study_scenario_t *kvr_study_scenario(const char *name);

typedef struct kvr_study_opts_s {
  const char *scenarios[KVR_STUDY_MAX]; /* names; none = all */
  size_t nscenarios;
  const char *policies[KVR_STUDY_MAX]; /* none = every registered policy, then the oracle */
  size_t npolicies;
  unsigned seeds; /* seeds per scenario: --seed, --seed + 1, ... */
  unsigned long long seed;
  unsigned jobs;     /* threads; 0 = the machine's cores */
  double resolution; /* search resolution, req/s */
  const char *out;
  char **extra; /* bench flags after --, appended to every cell's (later flags win) */
  int nextra;
  bool quiet;
} kvr_study_opts_t;

void kvr_study_opts_default(kvr_study_opts_t *o);

/* Runs one cell: the bench with argv (argv[0] "bench"), its report written as usual; *out gets its
 * results (the caller frees them with kvr_stats_results_free), NULL on failure. Returns 0 or an
 * exit status with one line in err. Called from several threads at once. */
typedef int (*kvr_study_run_fn)(int argc, char **argv, kvr_results_t **out, char *err,
                                size_t errlen);

/* One policy on one scenario over the seeds. */
typedef struct kvr_study_agg_s {
  double mean, min, max; /* max SLO-compliant rate, req/s */
  bool lower;            /* some seed found no limit: the mean is a lower bound */
  size_t n;              /* seeds that ran */
} kvr_study_agg_t;

/* What a study found, for a caller that goes on from it (the demo). */
typedef struct kvr_study_summary_s {
  const char *scenarios[KVR_STUDY_MAX]; /* names, in run order */
  size_t nscenarios;
  const char *policies[KVR_STUDY_MAX];
  size_t npolicies;
  kvr_study_agg_t agg[KVR_STUDY_MAX][KVR_STUDY_MAX]; /* [scenario][policy] */
  double seconds;
} kvr_study_summary_t;

/* Runs the study and writes its files; prints the table (and, unless quiet, a line per finished
 * cell) to out; fills *sum when not NULL. Returns 0, 1 when a cell failed (the others still
 * count), or 2 on bad options with one line in err. */
int kvr_study_run(const kvr_study_opts_t *o, kvr_study_run_fn run, FILE *out,
                  kvr_study_summary_t *sum, char *err, size_t errlen);

#endif

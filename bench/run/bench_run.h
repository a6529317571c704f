/* bench_run.h -- one `kvrouter bench` run from its settings to its report, for every caller: the
 * binary's `kvrouter bench`, each cell of the policy study, the demo's real run and its virtual
 * twin.
 *
 * kvr_bench_run() takes a checked kvr_runner_opts_t, runs its labels and levels on a private uv
 * loop in the calling thread (runner.h), writes the report into o->out and can hand the results
 * back in memory. A caller that catches SIGINT/SIGTERM passes its handler's flag (io->stop): it is
 * read every 50 ms while the levels run, and once set the current level stops and the report of
 * what finished is still written. kvr_bench_run_argv() is the same run from a command line a
 * person could type (the demo's): the bench's own table and rules first. kvr_bench_run_study() is
 * the policy study (bench/vcluster/study.h) with its cells run here, each from its struct.
 *
 * Exit statuses, the binary's: 0, 1 a run-time failure, 2 options the bench rejects, 130 stopped.
 */
#ifndef KVR_BENCH_RUN_H
#define KVR_BENCH_RUN_H

#include "bench/loadgen/stats.h"
#include "bench/vcluster/study.h"
#include "runner_types.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>

/* Where a run's words go and what stops it; every member may be NULL. */
typedef struct kvr_bench_io_s {
  FILE *summary;  /* the summary and the report's path (kvr_runner_report); NULL: dropped */
  FILE *errors;   /* each error as one line "kvrouter bench: ..."; NULL: only err has the last */
  FILE *progress; /* kvr_bench_run_argv(): the progress lines unless --quiet; NULL: none */
  volatile sig_atomic_t *stop; /* set by the caller's signal handler (to the signal number):
                                * stops the current level; NULL or virtual time: not read */
} kvr_bench_io_t;

/* Runs o (checked: kvr_runner_opts_check) and writes its report. o->lg.progress and o->command
 * are the caller's. Returns the exit status with the last error in err; *results (results not
 * NULL) gets the results, the caller's to free with kvr_stats_results_free, or NULL when the run
 * could not be set up. */
int kvr_bench_run(kvr_runner_opts_t *o, const kvr_bench_io_t *io, kvr_results_t **results,
                  char *err, size_t errlen);

/* The bench of a command line: argv[0] "bench", then its flags. Parses them over the defaults,
 * checks them, sets the report's command line from argv and runs as kvr_bench_run(). A bad flag
 * is status 2 with "kvrouter bench: --flag: what is wrong" in err (and on io->errors). */
int kvr_bench_run_argv(int argc, char **argv, const kvr_bench_io_t *io, kvr_results_t **results,
                       char *err, size_t errlen);

/* The policy study: kvr_study_run() with each cell's bench run here (virtual time, nothing
 * printed but the study's own lines). Returns as kvr_study_run(). */
int kvr_bench_run_study(const kvr_study_opts_t *o, FILE *out, kvr_study_summary_t *sum, char *err,
                        size_t errlen);

#endif

/* bench.h -- `kvrouter bench`: the load generator's command line, levels, search and A/B runs.
 *
 * kvr_bench_main() parses argv (argv[0] is "bench"), builds the workload, runs every label (an A/B
 * label switches the router's policy through the admin API first) over the given rates or
 * concurrency levels or the max-SLO-rate search, and writes the report (report.h) into --out.
 * Ctrl-C (SIGINT/SIGTERM) stops the current level, and the report of what finished is still
 * written.
 */
#ifndef KVR_BENCH_H
#define KVR_BENCH_H

/* Runs `kvrouter bench`. Returns 0 on success, 2 on a bad command line (one-line error on stderr),
 * 1 on a run-time failure, 130 when interrupted (partial report written). */
int kvr_bench_main(int argc, char **argv);

#endif

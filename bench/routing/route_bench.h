/* route_bench.h -- the routing micro-benchmark (prompt hashing, cache-index match, policy select,
 * index insert and growth).
 *
 * Run as `kvrouter bench routing [options]`: router/bench.c parses the options into
 * kvr_route_bench_opts_t; see policies/README.md.
 */
#ifndef KVR_ROUTE_BENCH_H
#define KVR_ROUTE_BENCH_H

#include <stddef.h>
#include <stdint.h>

/* Most values of --workers and of --blocks (every pair of them is one run). */
#define KVR_ROUTE_BENCH_MAX_LIST 8

typedef struct kvr_route_bench_opts_s {
  size_t prompt_kib;                         /* size of the synthetic chat prompt, 1..16384 (64) */
  size_t workers[KVR_ROUTE_BENCH_MAX_LIST];  /* numbers of workers, 1..KVR_MAX_WORKERS (4) */
  size_t nworkers;                           /* items in workers */
  uint64_t blocks[KVR_ROUTE_BENCH_MAX_LIST]; /* blocks pre-indexed over the workers (1000000) */
  size_t nblocks;                            /* items in blocks */
  size_t decisions;                          /* timed decisions, >= 1 (20000) */
  size_t block_chars; /* block size in bytes, 1..KVR_PROMPT_BLOCK_CHARS_MAX (64) */
  const char *policy; /* policy to time, a registered name (kv_aware) */
} kvr_route_bench_opts_t;

/* Fills opts with the defaults above. */
void kvr_route_bench_opts_default(kvr_route_bench_opts_t *opts);

/* Runs the benchmark once per (workers, blocks) pair of valid opts (router/bench.c checks them),
 * workers outermost, and prints a Markdown section per run, then a summary table of every run, to
 * stdout. Returns 0, or 1 when a set-up step fails (with a line on stderr). */
int kvr_route_bench_run(const kvr_route_bench_opts_t *opts);

#endif

/* route_bench.h -- the routing micro-benchmark (prompt hashing, cache-index match, policy select).
 *
 * Run as `kvrouter bench routing [options]` (router/bench.c); see policies/README.md.
 */
#ifndef KVR_ROUTE_BENCH_H
#define KVR_ROUTE_BENCH_H

/* Entry point; argv[0] is the subcommand name. Options:
 *   --prompt-kib N     size of the synthetic chat prompt (default 64)
 *   --workers N        number of workers (default 4)
 *   --blocks N         blocks pre-indexed over the workers (default 1000000)
 *   --decisions N      timed decisions (default 20000)
 *   --policy NAME      policy to time (default kv_aware)
 *   --block-chars N    block size in bytes (default 64)
 * Prints a Markdown table to stdout. Returns 0, or 2 on a usage error. */
int kvr_route_bench_main(int argc, char **argv);

#endif

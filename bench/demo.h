/* demo.h -- `kvrouter demo`: 4 simulated workers + the router on loopback, the round-robin vs
 * KV-aware A/B on the multiturn workload, the report, a summary, and everything stopped again.
 */
#ifndef KVR_DEMO_H
#define KVR_DEMO_H

/* Runs `kvrouter demo` (argv[0] is "demo"). Starts `kvrouter sim` x N and `kvrouter serve` as child
 * processes of this same binary on free 127.0.0.1 ports, waits for their /health, runs
 * kvr_bench_main() with --ab round_robin,kv_aware, then stops every child by PID (also after
 * Ctrl-C). Returns 0, 2 on a bad command line, 1 on failure, 130 when interrupted. */
int kvr_demo_main(int argc, char **argv);

#endif

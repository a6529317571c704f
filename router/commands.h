/* commands.h -- the subcommands of the kvrouter binary, one file each in router/.
 *
 * Each entry takes argv with argv[0] = the subcommand's name and returns the process exit status:
 * 0 on success, 2 on a bad command line, 1 on a run-time failure, 130 when interrupted. Every
 * subcommand parses through the one option engine (src/base/cli.h) over its own option table: -h,
 * --help and --version print to stdout and return 0 wherever they stand; a bad flag or value is
 * one line on stderr, "kvrouter CMD: --flag: what is wrong", and 2. main.c's table is the only
 * caller.
 */
#ifndef KVR_COMMANDS_H
#define KVR_COMMANDS_H

#include <stddef.h>

/* router/serve.c: the router in front of OpenAI-compatible (vLLM) workers, until SIGINT/SIGTERM. */
int kvr_serve_main(int argc, char **argv);

/* router/sim.c: a simulated vLLM worker (see bench/sim/README.md or --help); --print-costs and
 * --calibrate print figures (bench/sim/sim_calibrate.h) and return without listening. */
int kvr_sim_main(int argc, char **argv);

/* router/bench.c: the load generator: levels, the max-SLO-rate search and A/B runs over the
 * router's admin API, and the report written into --out (bench/run/runner.h). Ctrl-C stops the
 * current level and the report of what finished is still written. `kvrouter bench routing` is the
 * routing-decision micro-benchmark (bench/routing/). */
int kvr_bench_main(int argc, char **argv);

/* router/bench.c: raises the soft limit of open files to the hard limit (1,000 concurrent streams
 * need more descriptors than the usual 1,024); for the demo's real run too. */
void kvr_bench_raise_fd_limit(void);

/* router/demo.c: the demo's steps (bench/run/demo.h): the virtual study, `kvrouter sim` x N and
 * `kvrouter serve` as child processes of this same binary on free 127.0.0.1 ports with the
 * round_robin vs kv_aware A/B against them in this process, the same levels in virtual time and
 * their agreement; every child stopped by PID (also after Ctrl-C). */
int kvr_demo_main(int argc, char **argv);

#endif

/* demo.h -- `kvrouter demo`: the policy study in virtual time, then its verdict confirmed in real
 * time on simulated workers and a router started on 127.0.0.1, then the same levels again in
 * virtual time and the agreement of the two.
 *
 * kvr_demo_opts_t is the demo's command line (router/demo.c fills it through the option engine).
 * A kvr_demo_t is one run of it; its steps are separate calls so that the binary can catch
 * SIGINT/SIGTERM around the real step alone (steps 1 and 3 are pure computation, which Ctrl-C
 * ends the default way):
 *
 *   kvr_demo_new()        the rules between options; the run's strings and folders' names
 *   kvr_demo_preflight()  --ab and the bench options after -- checked before the minutes of step 1
 *   kvr_demo_virtual()    step 1: the study (bench_run.h's kvr_bench_run_study), the real rates
 *   kvr_demo_real()       step 2: `EXE sim` x N and `EXE serve` as children, the A/B in this
 *                         process (its results kept in memory), every child stopped by PID
 *   kvr_demo_agree()      step 3: the real levels again in virtual time; OUT/AGREEMENT.md
 *
 * Output: the step headers, the study's table and the agreement to stdout, progress lines and
 * errors ("kvrouter demo: ...") to stderr; files under opts->out (virtual/, real/, logs/,
 * agreement-virtual/, AGREEMENT.md). Statuses are the binary's: 0, 1 a failure, 2 a usage error
 * (step 1's study refused its options), 130 stopped.
 */
#ifndef KVR_DEMO_H
#define KVR_DEMO_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_DEMO_MAX_WORKERS 16
#define KVR_DEMO_MAX_EXTRA 32 /* bench options after -- */

typedef struct kvr_demo_opts_s {
  bool quick; /* the virtual study of round_robin and kv_aware on the workload only, one rate */
  const char *out;
  unsigned workers;
  double scale; /* the real run's time scale; 0: 10 */
  uint64_t seed;
  unsigned seeds; /* step 1's seeds per scenario */
  const char *workload, *ab, *labels;
  unsigned worker_blocks[KVR_DEMO_MAX_WORKERS]; /* KV blocks per worker (a mixed fleet) */
  size_t nworker_blocks;
  char **extra; /* the bench options after -- (borrowed), at most KVR_DEMO_MAX_EXTRA */
  int nextra;
} kvr_demo_opts_t;

/* The defaults --help prints: out results/demo, 4 workers, seed 42, one seed, multiturn,
 * round_robin vs kv_aware. */
void kvr_demo_opts_default(kvr_demo_opts_t *o);

typedef struct kvr_demo_s kvr_demo_t;

/* Checks the rules between options (one --worker-blocks value per worker; the workload one of the
 * study's single-workload scenarios) and sets up a run. o is borrowed for the run's life. Returns
 * 0 with *out, or KVR_EINVAL with one line "--flag: what is wrong" in err and *out NULL. */
int kvr_demo_new(const kvr_demo_opts_t *o, kvr_demo_t **out, char *err, size_t errlen);

/* Checks --ab's policies and the bench options after -- through the bench's own parser and rules
 * (the twin's command line, one request per level in virtual time, nothing written). Returns 0 or
 * KVR_EINVAL with one line in err ("after --: --rates: ..."). */
int kvr_demo_preflight(kvr_demo_t *d, char *err, size_t errlen);

/* Step 1: creates the folders, runs the study and picks the real run's rates. Returns 0 or the
 * exit status (1 the folders, 2 the study refused its options). */
int kvr_demo_virtual(kvr_demo_t *d);

/* Step 2: starts `exe sim` per worker and `exe serve` (exe: this binary's path) on 127.0.0.1, each
 * on a port the kernel picks for it (port 0; the demo reads it from the child's log), waits for
 * their health, runs the A/B with its report in OUT/real/ (summary in
 * bench-summary.txt) and keeps its levels, then stops every child by PID, on every path. *stop is
 * the caller's signal flag: set, it aborts the start or stops the current level (status 130).
 * Returns the exit status. */
int kvr_demo_real(kvr_demo_t *d, const char *exe, volatile sig_atomic_t *stop);

/* Step 3: the real run's levels again in virtual time, the agreement table and the headline,
 * printed and written to OUT/AGREEMENT.md. Returns the exit status. */
int kvr_demo_agree(kvr_demo_t *d);

/* Frees the run (its children are stopped by kvr_demo_real). Accepts NULL. */
void kvr_demo_free(kvr_demo_t *d);

#endif

/* demo_int.h -- internals shared by the demo's files (demo_plan.c, demo_virtual.c, demo_real.c,
 * demo_agree.c); not part of the API (demo.h).
 *
 * kvr_demo_t is one run: its options, the folders, the child processes (bench/demo/procs.h) it
 * started, what the virtual study found and the rates the real run confirms; kvr__demo_lvl_t is
 * one level (a policy at a rate) as the real run and its virtual twin measured it, filled from
 * each run's results in memory.
 */
#ifndef KVR_DEMO_INT_H
#define KVR_DEMO_INT_H

#include "base/buf.h"
#include "bench/demo/procs.h"
#include "bench/loadgen/stats.h"
#include "bench/vcluster/study.h"
#include "demo.h"

#include <stdbool.h>
#include <stddef.h>

#define KVR__DEMO_MAX_LEVELS 64

/* One level of the real run and its virtual twin. */
typedef struct kvr__demo_lvl_s {
  char label[64], policy[64];
  double rate;
  bool real, virt; /* measured by each */
  double real_ttft, real_tpot, virt_ttft, virt_tpot;
  bool real_pass, virt_pass, real_interrupted;
  char real_fail[48], virt_fail[48];
  size_t real_n, real_later; /* measured requests; of them at turn >= 2 */
  unsigned real_max_turn;
  /* the figures are each level's agreement quantile (kvr__demo_agree_q: p99, --quick p90) */
  /* the real quantiles' 95% intervals (kvr__demo_q_interval); 0 when not measured */
  double real_ttft_lo, real_ttft_hi, real_tpot_lo, real_tpot_hi;
} kvr__demo_lvl_t;

struct kvr_demo_s {
  const kvr_demo_opts_t *cli;
  double t0; /* when the run began (monotonic s) */
  char logs[4200], virt_out[4200], real_out[4200], agree_out[4200];
  char scale_s[32], seed_s[32], workers_s[32], blocks_s[256], scrape_s[32], stale_s[32];
  char warmup_s[32];                         /* the scenario's --warmup-s */
  kvr_proc_t kids[KVR_DEMO_MAX_WORKERS + 1]; /* the workers, then the router */
  size_t nkids;
  int admin_port;
  /* step 1 */
  kvr_study_summary_t sum;
  bool have_sum;
  /* step 2: the rates, "%g" each (the same text goes to the real and the virtual run) */
  char rates_s[256], rates_disp[256];
  const char *rates_why;
  kvr__demo_lvl_t lv[KVR__DEMO_MAX_LEVELS];
  size_t nlv;
  /* over step 2's A/B (cpu_wall_s): the seconds the machine's cores were busy, the demo's
   * processes (this one and the children) ran and waited for a core (kvr_procs_cpu); cpu_known
   * false when unread */
  double cpu_wall_s, cpu_busy_s, cpu_run_s, cpu_wait_s;
  bool cpu_known;
};

/* The share of their runnable time step 2's processes may wait for a core before the demo warns
 * that real time measured the machine's other work too (kvr__demo_cpu_note). Six processes on 2
 * cores wait for each other: 29-30% while they had priority over the other work and real TTFT and
 * TPOT p90 agreed with virtual time within 6%; without it, 49% (TTFT p90 +10%) and 62% (+49%)
 * (`kvrouter demo --quick` with and without an autogroup nice of -20, beside other sessions'
 * builds, 2026-11-29). */
#define KVR__DEMO_CPU_WAIT_WARN 0.40

/* One line on how long step 2's processes waited for a core, and a warning above
 * KVR__DEMO_CPU_WAIT_WARN; nothing when it was not read. */
void kvr__demo_cpu_note(const kvr_demo_t *d, kvr_buf_t *b);

/* Monotonic seconds. */
double kvr__demo_now(void);

/* True when the caller's options after -- give flag ("--rates 2" or "--rates=2"). */
bool kvr__demo_extra_has(const kvr_demo_t *d, const char *flag);

/* The cluster's shape for a virtual run: "--workers N" and, with a mixed fleet, "--worker-blocks
 * LIST" into a (4 slots). Returns the count. */
int kvr__demo_cluster_args(kvr_demo_t *d, char **a);

/* The bench's command line for the real run (virt false: against the children, url and admin_url
 * 64 bytes each) or its virtual twin, the caller's options after -- last; argv needs 160 slots.
 * Returns argc. */
int kvr__demo_bench_args(kvr_demo_t *d, bool virt, char **argv, char *url, char *admin_url);

/* Step 1's figure for policy on the real run's workload, or NULL. */
const kvr_study_agg_t *kvr__demo_virtual_agg(const kvr_demo_t *d, const char *policy);

/* Step 1's limits of round_robin and kv_aware on the workload -> d->rates_s, rates_disp and
 * rates_why: the rate the real run and its twin measure (demo_virtual.c). */
void kvr__demo_pick_rates(kvr_demo_t *d);

/* The 95% interval of the q-quantile (0 < q < 1) of v[0..n-1] (sorted ascending; n > 0) by order
 * statistics: the values of the ranks n*q -/+ 1.96 sd of a binomial count, clamped to the sample.
 */
void kvr__demo_q_interval(const double *v, size_t n, double q, double *lo, double *hi);

/* The quantile the agreement compares, real against virtual: 0.99, or 0.90 under --quick (its 60 s
 * levels do not hold a p99 still: demo_plan.c); *name "p99" or "p90". */
double kvr__demo_agree_q(const kvr_demo_t *d, const char **name);

/* A level's TTFT or TPOT at the agreement quantile q (0.99 or 0.90). */
double kvr__demo_stat_at(const kvr_dist_t *s, double q);

/* The level of label at rate, added when add is true and it is new; NULL when full or absent. */
kvr__demo_lvl_t *kvr__demo_level(kvr_demo_t *d, const char *label, double rate, bool add);

#endif

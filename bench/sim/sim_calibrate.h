/* sim_calibrate.h -- offline tools that drive the simulated engine in virtual time, without HTTP.
 *
 *   kvr_sim_calibrate_print_costs()  the cost model's sanity figures (`kvrouter sim
 * --print-costs`): decode steps at 1..96 sequences of 6k context, cold 3.5k and 7k prefills, a
 * cached follow-up turn; kvr_sim_calibrate_run()          the multi-turn workload of WORKLOAD.md
 * (10 shared ~3.5-4k-token starters, 5-turn conversations resending their answers, Poisson
 * arrivals) at several request rates, one row of TTFT/TPOT/ITL percentiles per rate as the load
 * generator would measure them (`kvrouter sim --calibrate`). It is how the cost defaults were tuned
 * (bench/results/calibration/REPORT.md).
 *
 * Both are pure functions of their inputs: the same configuration and options print the same
 * bytes.
 */
#ifndef KVR_SIM_CALIBRATE_H
#define KVR_SIM_CALIBRATE_H

#include "sim_engine.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVR_SIM_CALIBRATE_MAX_RATES 64

typedef struct kvr_sim_calibrate_opts_s {
  double rates[KVR_SIM_CALIBRATE_MAX_RATES]; /* request rates (simulated req/s), each > 0 */
  size_t nrates;                             /* default 0.5,1,1.5,2,2.5,3 */
  uint32_t requests;                         /* Poisson requests per rate, default 300 */
  uint32_t output_mean; /* output tokens uniform over [N/2, 3N/2], default 500 */
  uint32_t answer_mean; /* the history carries a dataset answer of U[N/2, 3N/2] tokens instead of
                         * the generated one; 0 = resend the generated answer; default 900 */
  uint64_t seed;        /* arrivals and lengths; `kvrouter sim --seed` */
} kvr_sim_calibrate_opts_t;

void kvr_sim_calibrate_opts_default(kvr_sim_calibrate_opts_t *opts);

/* Prints the cost model's sanity figures for cfg to out. */
void kvr_sim_calibrate_print_costs(FILE *out, const kvr_sim_config_t *cfg);

/* Prints the header and one row per rate of opts (the engine configured by cfg) to out. */
void kvr_sim_calibrate_run(FILE *out, const kvr_sim_config_t *cfg,
                           const kvr_sim_calibrate_opts_t *opts);

/* Simulates opts->requests requests at `rate` (> 0) and prints their row to out. */
void kvr_sim_calibrate_rate(FILE *out, const kvr_sim_config_t *cfg,
                            const kvr_sim_calibrate_opts_t *opts, double rate);

#endif

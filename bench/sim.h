/* sim.h -- entry point of the `kvrouter sim` subcommand (a simulated vLLM worker). */
#ifndef KVR_SIM_H
#define KVR_SIM_H

/* Runs `kvrouter sim` with argv[0] = "sim": parses flags (see bench/SIM.md or --help), serves until
 * SIGINT/SIGTERM, returns the process exit status (0 on a clean stop, 2 on a bad flag, 1 on a
 * startup failure). --print-costs and --calibrate print figures and return without listening. */
int kvr_sim_main(int argc, char **argv);

#endif

/* np_random.h -- numpy's legacy random stream (np.random.seed / np.random.gamma), bit for bit, and
 * the arrival schedule `vllm bench serve --seed S` draws from it.
 *
 * Why: `vllm bench serve` seeds numpy's global RandomState with --seed (default 0) and draws every
 * inter-arrival gap of a rate from it, so every run of a given seed, at every rate and on every
 * server configuration, sends on the same schedule scaled by 1/rate (shared/seeds/002's seven
 * columns are one arrival draw). A calibration against such a run replays that schedule exactly
 * instead of drawing its own; `kvrouter bench --arrival-seed S` does so (bench/loadgen/loadgen.c).
 *
 * What is numpy's here (numpy 1.24, numpy/random/src/mt19937 and
 * src/legacy/legacy-distributions.c): MT19937 seeded by init_genrand(seed) (RandomState.seed(int)),
 * doubles from two 32-bit outputs (a >> 5, b >> 6: 53 bits), the legacy polar-method normal with
 * its cached second value, and legacy_standard_gamma: -log(1 - U) for shape 1, a rejection method
 * on U and an exponential below 1, Marsaglia-Tsang on the legacy normal above 1. No C library
 * packages numpy's streams (GSL's MT19937 seeds 0 as 4357, and its gamma sampler differs), so the
 * few lines are written here and checked against numpy's own output
 * (tests/bench/loadgen/test_np_random.c).
 */
#ifndef KVR_NP_RANDOM_H
#define KVR_NP_RANDOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_np_random_s {
  uint32_t key[624];
  int pos;
  bool has_gauss; /* the polar method makes two normals; the second is kept for the next call */
  double gauss;
} kvr_np_random_t;

/* np.random.seed(seed) for an integer seed in [0, 2^32). */
void kvr_np_random_seed(kvr_np_random_t *r, uint32_t seed);

/* np.random.random_sample(): a double in [0, 1). */
double kvr_np_random_sample(kvr_np_random_t *r);

/* np.random.gamma(shape, scale) with shape > 0. */
double kvr_np_random_gamma(kvr_np_random_t *r, double shape, double scale);

/* The send offsets, in seconds from the benchmark's start, of n requests as `vllm bench serve
 * --seed seed --request-rate rate --burstiness burstiness` schedules them (vllm/benchmarks/serve.py
 * get_request): gaps gamma(burstiness, 1 / (rate * burstiness)) drawn in order, summed, then all
 * scaled so the last is n / rate. The first request waits its own gap. out holds n values. */
void kvr_np_vllm_schedule(uint32_t seed, double rate, double burstiness, size_t n, double *out);

#endif

/* np_random.c -- numpy's legacy RandomState stream and vllm bench serve's arrival schedule (see
 * np_random.h for why and what is numpy's). */
#include "bench/loadgen/np_random.h"

#include <math.h>

#define MT_N 624
#define MT_M 397
#define MT_MATRIX_A 0x9908b0dfu
#define MT_UPPER 0x80000000u
#define MT_LOWER 0x7fffffffu

void kvr_np_random_seed(kvr_np_random_t *r, uint32_t seed) {
  for (int i = 0; i < MT_N; i++) {
    r->key[i] = seed;
    seed = 1812433253u * (seed ^ (seed >> 30)) + (uint32_t)i + 1u;
  }
  r->pos = MT_N;
  r->has_gauss = false;
  r->gauss = 0;
}

static uint32_t mix(uint32_t a, uint32_t b, uint32_t m) {
  uint32_t y = (a & MT_UPPER) | (b & MT_LOWER);
  return m ^ (y >> 1) ^ ((0u - (y & 1u)) & MT_MATRIX_A);
}

static void regenerate(kvr_np_random_t *r) {
  uint32_t *k = r->key;
  int i = 0;
  for (; i < MT_N - MT_M; i++)
    k[i] = mix(k[i], k[i + 1], k[i + MT_M]);
  for (; i < MT_N - 1; i++)
    k[i] = mix(k[i], k[i + 1], k[i + MT_M - MT_N]);
  k[MT_N - 1] = mix(k[MT_N - 1], k[0], k[MT_M - 1]);
  r->pos = 0;
}

static uint32_t next32(kvr_np_random_t *r) {
  if (r->pos == MT_N)
    regenerate(r);
  uint32_t y = r->key[r->pos++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

double kvr_np_random_sample(kvr_np_random_t *r) {
  uint32_t a = next32(r) >> 5, b = next32(r) >> 6;
  return ((double)a * 67108864.0 + (double)b) / 9007199254740992.0;
}

static double standard_exponential(kvr_np_random_t *r) {
  return -log(1.0 - kvr_np_random_sample(r));
}

static double gauss(kvr_np_random_t *r) {
  if (r->has_gauss) {
    r->has_gauss = false;
    return r->gauss;
  }
  double x1, x2, r2;
  do {
    x1 = 2.0 * kvr_np_random_sample(r) - 1.0;
    x2 = 2.0 * kvr_np_random_sample(r) - 1.0;
    r2 = x1 * x1 + x2 * x2;
  } while (r2 >= 1.0 || r2 == 0.0);
  double f = sqrt(-2.0 * log(r2) / r2);
  r->gauss = f * x1;
  r->has_gauss = true;
  return f * x2;
}

/* numpy's legacy_standard_gamma, step for step. The Marsaglia-Tsang branch has the shape of
 * kvr_workload_rng_gamma's (workload.c), but the draws must come from this stream, in numpy's order
 * and with numpy's normals, to give numpy's values, so the two are not shared. */
static double standard_gamma(kvr_np_random_t *r, double shape) {
  if (shape == 1.0)
    return standard_exponential(r);
  if (shape < 1.0) {
    for (;;) {
      double u = kvr_np_random_sample(r), v = standard_exponential(r);
      if (u <= 1.0 - shape) {
        double x = pow(u, 1.0 / shape);
        if (x <= v)
          return x;
      } else {
        double y = -log((1.0 - u) / shape);
        double x = pow(1.0 - shape + shape * y, 1.0 / shape);
        if (x <= v + y)
          return x;
      }
    }
  }
  double b = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * b);
  for (;;) {
    double x, v;
    do {
      x = gauss(r);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    double u = kvr_np_random_sample(r);
    if (u < 1.0 - 0.0331 * (x * x) * (x * x))
      return b * v;
    if (log(u) < 0.5 * x * x + b * (1.0 - v + log(v)))
      return b * v;
  }
}

double kvr_np_random_gamma(kvr_np_random_t *r, double shape, double scale) {
  return scale * standard_gamma(r, shape);
}

void kvr_np_vllm_schedule(uint32_t seed, double rate, double burstiness, size_t n, double *out) {
  if (n == 0)
    return;
  kvr_np_random_t r;
  kvr_np_random_seed(&r, seed);
  double theta = 1.0 / (rate * burstiness);
  for (size_t i = 0; i < n; i++)
    out[i] = kvr_np_random_gamma(&r, burstiness, theta) + (i ? out[i - 1] : 0.0);
  if (out[n - 1] != 0) {
    double factor = ((double)n / rate) / out[n - 1];
    for (size_t i = 0; i < n; i++)
      out[i] *= factor;
  }
}

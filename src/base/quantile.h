/* quantile.h -- the percentile definition kvrouter's products share (one place, one test).
 *
 * numpy's default, method 'linear' (Hyndman and Fan's type 7), which `vllm bench serve` reports
 * through np.percentile: for sorted x[0..n-1] and p in [0, 100],
 *
 *   h = (n - 1) p / 100,   result = x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h])
 *
 * so p50 of an even count is the mean of the middle two, p0 the minimum, p100 the maximum, and a
 * single value is every percentile of itself. The arithmetic follows numpy's order (q = p / 100,
 * h = q (n - 1); the interpolation measured from the nearer neighbour), so results equal
 * np.percentile(x, p) to the last bit, not just to rounding.
 */
#ifndef KVR_QUANTILE_H
#define KVR_QUANTILE_H

#include <stddef.h>
#include <stdint.h>

/* Where percentile p of n sorted values falls: between x[*lo] and x[*hi] (hi = lo + 1, or lo when
 * h reaches the last value) at fraction *frac of the way. p is clamped to [0, 100] (NaN counts as
 * 0). n must be > 0. */
void kvr_quantile_pos(size_t n, double p, size_t *lo, size_t *hi, double *frac);

/* Percentile p (0..100) of sorted[0..n-1]; 0 when n == 0. */
double kvr_quantile(const double *sorted, size_t n, double p);

/* The same of sorted unsigned integers (e.g. nanosecond timings), as a double. */
double kvr_quantile_u64(const uint64_t *sorted, size_t n, double p);

/* Sorts v[0..n-1] ascending, ready for kvr_quantile(): what a stable sort by value (glibc's
 * qsort) gives, equal values in their order, -0 and +0 equal (quantile.c says how). */
void kvr_quantile_sort(double *v, size_t n);

#endif

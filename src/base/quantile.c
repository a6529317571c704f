/* quantile.c -- percentiles by numpy's 'linear' method (see quantile.h for the definition).
 *
 * kvr_quantile_pos() holds the definition: where the percentile falls between two ranks. The typed
 * readers only interpolate, with numpy's lerp: a + (b - a) t below t = 0.5, b - (b - a)(1 - t) from
 * there, which is exact at both ends and equal to numpy's result bit for bit.
 *
 * Pure arithmetic: no allocation, no state; the caller sorts, with kvr_quantile_sort() for doubles.
 */
#include "base/quantile.h"

#include <math.h>
#include <stdlib.h>

void kvr_quantile_pos(size_t n, double p, size_t *lo, size_t *hi, double *frac) {
  double q = p > 0 ? (p < 100 ? p : 100) / 100.0 : 0;
  double h = q * (double)(n - 1);
  double f = floor(h);
  if (f >= (double)(n - 1)) {
    *lo = *hi = n - 1;
    *frac = 0;
    return;
  }
  *lo = (size_t)f;
  *hi = *lo + 1;
  *frac = h - f;
}

static double lerp(double a, double b, double t) {
  double d = b - a;
  return t < 0.5 ? a + d * t : b - d * (1 - t);
}

static double at_double(const void *sorted, size_t i) {
  return ((const double *)sorted)[i];
}

static double at_u64(const void *sorted, size_t i) {
  return (double)((const uint64_t *)sorted)[i];
}

/* The one reader behind both typed entry points: at() reads element i of sorted as a double. */
static double quantile_at(const void *sorted, size_t n, double p,
                          double (*at)(const void *, size_t)) {
  if (n == 0)
    return 0;
  size_t lo, hi;
  double t;
  kvr_quantile_pos(n, p, &lo, &hi, &t);
  return lerp(at(sorted, lo), at(sorted, hi), t);
}

double kvr_quantile(const double *sorted, size_t n, double p) {
  return quantile_at(sorted, n, p, at_double);
}

double kvr_quantile_u64(const uint64_t *sorted, size_t n, double p) {
  return quantile_at(sorted, n, p, at_u64);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void kvr_quantile_sort(double *v, size_t n) {
  qsort(v, n, sizeof(*v), cmp_double);
}

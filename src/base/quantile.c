/* quantile.c -- percentiles by numpy's 'linear' method (see quantile.h for the definition).
 *
 * kvr_quantile_pos() holds the definition: where the percentile falls between two ranks. The typed
 * readers only interpolate, with numpy's lerp: a + (b - a) t below t = 0.5, b - (b - a)(1 - t) from
 * there, which is exact at both ends and equal to numpy's result bit for bit.
 *
 * Pure arithmetic: no state; the caller sorts, with kvr_quantile_sort() for doubles.
 *
 * kvr_quantile_sort() gives what qsort with cmp_double gave (glibc's qsort is a stable merge sort:
 * equal values keep their order), faster: a double's bits, negatives flipped, compare as unsigned
 * integers in its order, so an LSD radix sort of those keys (8 passes of a byte, the passes whose
 * byte is the same in every key skipped) sorts the values. Equal keys are equal bits, so their
 * order cannot show, except for the zeros: -0 and +0 tie in cmp_double, so both take +0's key and
 * the zeros are written back in their first order, as the stable sort leaves them. An array with a
 * NaN (which ties with everything there) still goes to qsort; short ones to an insertion sort.
 */
#include "base/quantile.h"

#include "base/kvr.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* Below this many values, an insertion sort (stable, as qsort's merge sort). */
#define SORT_SMALL 32

/* The key of x: unsigned integer order is cmp_double's order; both zeros have +0's key. */
static inline uint64_t key_of(double x) {
  uint64_t u;
  if (x == 0)
    x = 0.0;
  memcpy(&u, &x, sizeof u);
  return u >> 63 ? ~u : u | UINT64_C(1) << 63;
}

static inline double value_of(uint64_t k) {
  uint64_t u = k >> 63 ? k & ~(UINT64_C(1) << 63) : ~k;
  double x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* LSD radix sort of k[0..n) (tmp: n more), a byte a pass; returns where the sorted keys are. */
static uint64_t *radix_sort(uint64_t *k, uint64_t *tmp, size_t n) {
  for (unsigned shift = 0; shift < 64; shift += 8) {
    size_t count[256] = {0};
    for (size_t i = 0; i < n; i++)
      count[k[i] >> shift & 0xff]++;
    if (count[k[0] >> shift & 0xff] == n)
      continue; /* the same byte in every key: this pass would change nothing */
    size_t pos = 0;
    for (size_t b = 0; b < 256; b++) {
      size_t c = count[b];
      count[b] = pos;
      pos += c;
    }
    for (size_t i = 0; i < n; i++)
      tmp[count[k[i] >> shift & 0xff]++] = k[i];
    uint64_t *t = k;
    k = tmp;
    tmp = t;
  }
  return k;
}

void kvr_quantile_sort(double *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (isnan(v[i])) {
      qsort(v, n, sizeof(*v), cmp_double);
      return;
    }
  size_t run = 1;
  while (run < n && !(v[run - 1] > v[run]))
    run++;
  if (run >= n)
    return; /* sorted already (the stats sort some arrays twice): a stable sort moves nothing */
  if (n < SORT_SMALL) {
    for (size_t i = 1; i < n; i++) {
      double x = v[i];
      size_t j = i;
      for (; j > 0 && v[j - 1] > x; j--)
        v[j] = v[j - 1];
      v[j] = x;
    }
    return;
  }
  uint64_t *k = kvr_xmalloc(2 * n * sizeof *k);
  size_t zeros = 0;
  for (size_t i = 0; i < n; i++) {
    k[i] = key_of(v[i]);
    zeros += v[i] == 0;
  }
  /* the zeros in their order, as signs: written back over the sorted run of zeros */
  unsigned char *neg = zeros ? kvr_xmalloc(zeros) : NULL;
  for (size_t i = 0, z = 0; i < n && z < zeros; i++)
    if (v[i] == 0)
      neg[z++] = (unsigned char)signbit(v[i]);
  const uint64_t *sorted = radix_sort(k, k + n, n);
  for (size_t i = 0, z = 0; i < n; i++) {
    v[i] = value_of(sorted[i]);
    if (v[i] == 0 && neg[z++])
      v[i] = -0.0;
  }
  free(neg);
  free(k);
}

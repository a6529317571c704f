/* metrics.c -- Prometheus text exposition helpers; see metrics.h. */
#include "metrics.h"

#include "kvr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double kvr_hist_latency_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 300.0};
const size_t kvr_hist_latency_nbuckets =
    sizeof kvr_hist_latency_buckets / sizeof kvr_hist_latency_buckets[0];
const double kvr_hist_fast_buckets[] = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5,
                                        1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2};
const size_t kvr_hist_fast_nbuckets =
    sizeof kvr_hist_fast_buckets / sizeof kvr_hist_fast_buckets[0];

void kvr_hist_init(kvr_hist_t *h, const double *bounds, size_t nbounds) {
  memset(h, 0, sizeof *h);
  h->bounds = bounds;
  h->nbounds = nbounds < KVR_HIST_MAX_BUCKETS ? nbounds : KVR_HIST_MAX_BUCKETS - 1;
}

void kvr_hist_observe(kvr_hist_t *h, double v) {
  size_t i = 0;
  while (i < h->nbounds && v > h->bounds[i])
    i++;
  h->counts[i]++;
  h->sum += v;
  h->count++;
}

void kvr_metric_family(kvr_buf_t *out, const char *name, const char *type, const char *help) {
  kvr_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void print_value(kvr_buf_t *out, double v) {
  if (isinf(v))
    kvr_buf_puts(out, v > 0 ? "+Inf" : "-Inf");
  else if (v == (double)(int64_t)v && fabs(v) < 1e15)
    kvr_buf_printf(out, "%lld", (long long)v);
  else
    kvr_buf_printf(out, "%.9g", v);
}

void kvr_metric_sample(kvr_buf_t *out, const char *name, const char *labels, double value) {
  kvr_buf_puts(out, name);
  if (labels && *labels)
    kvr_buf_printf(out, "{%s}", labels);
  kvr_buf_puts(out, " ");
  print_value(out, value);
  kvr_buf_puts(out, "\n");
}

void kvr_metric_hist(kvr_buf_t *out, const char *name, const char *labels, const kvr_hist_t *h) {
  uint64_t cum = 0;
  const char *sep = labels && *labels ? "," : "";
  for (size_t i = 0; i <= h->nbounds; i++) {
    cum += h->counts[i];
    kvr_buf_printf(out, "%s_bucket{%s%sle=\"", name, labels ? labels : "", sep);
    if (i == h->nbounds)
      kvr_buf_puts(out, "+Inf");
    else
      kvr_buf_printf(out, "%g", h->bounds[i]);
    kvr_buf_printf(out, "\"} %llu\n", (unsigned long long)cum);
  }
  char n2[160];
  snprintf(n2, sizeof n2, "%s_sum", name);
  kvr_metric_sample(out, n2, labels, h->sum);
  snprintf(n2, sizeof n2, "%s_count", name);
  kvr_metric_sample(out, n2, labels, (double)h->count);
}

void kvr_metric_histogram(kvr_buf_t *out, const char *name, const char *help, const char *labels,
                          const kvr_hist_t *h) {
  kvr_metric_family(out, name, "histogram", help);
  kvr_metric_hist(out, name, labels, h);
}

void kvr_metric_escape(kvr_buf_t *out, const char *value) {
  for (const char *p = value; *p; p++) {
    if (*p == '\\')
      kvr_buf_puts(out, "\\\\");
    else if (*p == '"')
      kvr_buf_puts(out, "\\\"");
    else if (*p == '\n')
      kvr_buf_puts(out, "\\n");
    else
      kvr_buf_append(out, p, 1);
  }
}

/* ---- reading scraped pages ------------------------------------------------------------------- */

bool kvr_metric_line_is(const char *line, const char *end, const char *name) {
  size_t n = strlen(name);
  return (size_t)(end - line) > n && memcmp(line, name, n) == 0 &&
         (line[n] == '{' || line[n] == ' ');
}

int kvr_metric_line_value(const char *line, const char *end, double *out) {
  const char *sp = line;
  int depth = 0;
  while (sp < end && (depth > 0 || (*sp != ' ' && *sp != '\t'))) {
    if (*sp == '{')
      depth++;
    else if (*sp == '}')
      depth--;
    else if (*sp == '"' && depth > 0) { /* skip quoted label values, which may hold spaces */
      sp++;
      while (sp < end && *sp != '"') {
        if (*sp == '\\')
          sp++;
        sp++;
      }
    }
    sp++;
  }
  if (sp >= end)
    return -1;
  char num[64];
  size_t n = KVR_MIN((size_t)(end - sp), sizeof num - 1);
  memcpy(num, sp, n);
  num[n] = '\0';
  char *e;
  *out = strtod(num, &e);
  return e == num ? -1 : 0;
}

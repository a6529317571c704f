/* metrics.c -- Prometheus text exposition helpers; see metrics.h. */
#include "base/metrics.h"

#include "base/kvr.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

const double kvr_hist_latency_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,  0.08,
                                           0.1,   0.25,  0.5,  0.75, 1.0,  2.5,   5.0,
                                           7.5,   10.0,  20.0, 40.0, 80.0, 160.0, 300.0};
const size_t kvr_hist_latency_nbuckets =
    sizeof kvr_hist_latency_buckets / sizeof kvr_hist_latency_buckets[0];
const double kvr_hist_fast_buckets[] = {1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5,
                                        1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2};
const size_t kvr_hist_fast_nbuckets =
    sizeof kvr_hist_fast_buckets / sizeof kvr_hist_fast_buckets[0];
/* vLLM's vllm:inter_token_latency_seconds bounds, with 1 ms and 5 ms below them: a router sees
 * tokens that arrive in one network read as nearly simultaneous. */
const double kvr_hist_itl_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                       0.15,  0.2,   0.3,  0.4,   0.5,  0.75,  1.0,
                                       2.5,   5.0,   7.5,  10.0,  20.0, 40.0,  80.0};
const size_t kvr_hist_itl_nbuckets = sizeof(kvr_hist_itl_buckets) / sizeof(kvr_hist_itl_buckets[0]);
const double kvr_hist_call_buckets[] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
                                        5e-2, 0.1,    0.25, 0.5,  1.0,    2.5,  5.0};
const size_t kvr_hist_call_nbuckets =
    sizeof(kvr_hist_call_buckets) / sizeof(kvr_hist_call_buckets[0]);

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

/* ---- process collector --------------------------------------------------------------------------
 */

/* Seconds since the epoch at which this process started, or -1. */
static double process_start_time(void) {
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "r");
  if (f == NULL)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* The command name (field 2) is in parentheses and may hold spaces: count from the last ')'. */
  char *p = strrchr(buf, ')');
  if (p == NULL)
    return -1;
  p++;
  unsigned long long start_ticks = 0;
  for (int field = 3; field <= 22; field++) {
    while (*p == ' ')
      p++;
    if (*p == '\0')
      return -1;
    if (field == 22)
      start_ticks = strtoull(p, NULL, 10);
    while (*p && *p != ' ')
      p++;
  }
  f = fopen("/proc/stat", "r");
  if (f == NULL)
    return -1;
  char line[256];
  double btime = -1;
  unsigned long long bt;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "btime %llu", &bt) == 1) {
      btime = (double)bt;
      break;
    }
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  if (btime < 0 || hz <= 0)
    return -1;
  return btime + (double)start_ticks / (double)hz;
}

static double process_rss(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  int ok = f && fscanf(f, "%llu %llu", &size, &resident) == 2;
  if (f)
    fclose(f);
  long page = sysconf(_SC_PAGESIZE);
  if (ok && page > 0)
    return (double)resident * (double)page;
  struct rusage ru; /* fallback: the peak, in KiB on Linux */
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    return (double)ru.ru_maxrss * 1024.0;
  return -1;
}

static double process_open_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL)
    return -1;
  double n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n; /* the directory's own descriptor included, as Prometheus' collectors count it */
}

void kvr_process_stats_read(kvr_process_stats_t *st) {
  st->start_time_s = process_start_time();
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    st->cpu_seconds = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                      (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
  else
    st->cpu_seconds = -1;
  st->rss_bytes = process_rss();
  st->open_fds = process_open_fds();
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
    st->max_fds = rl.rlim_cur == RLIM_INFINITY ? INFINITY : (double)rl.rlim_cur;
  else
    st->max_fds = -1;
}

static void process_family(kvr_buf_t *out, const char *name, const char *type, const char *help,
                           double value) {
  kvr_metric_family(out, name, type, help);
  if (value >= 0)
    kvr_metric_sample(out, name, NULL, value);
}

void kvr_metric_process(kvr_buf_t *out, const kvr_process_stats_t *st) {
  /* Printed with its clock ticks (1/100 s): the usual 9 significant digits would round an epoch
   * time to 100 s. */
  kvr_metric_family(out, "process_start_time_seconds", "gauge",
                    "Start time of the process since unix epoch in seconds");
  if (st->start_time_s >= 0)
    kvr_buf_printf(out, "process_start_time_seconds %.2f\n", st->start_time_s);
  process_family(out, "process_cpu_seconds_total", "counter",
                 "Total user and system CPU time spent in seconds", st->cpu_seconds);
  process_family(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes",
                 st->rss_bytes);
  process_family(out, "process_open_fds", "gauge", "Number of open file descriptors", st->open_fds);
  process_family(out, "process_max_fds", "gauge", "Maximum number of open file descriptors",
                 st->max_fds);
}

/* metrics.h -- Prometheus text exposition helpers: histograms and sample lines.
 *
 * A kvr_hist_t is a fixed set of cumulative-on-output buckets (upper bounds in the metric's unit)
 * plus sum and count, as Prometheus' client libraries keep them. Rendering follows the text
 * exposition format 0.0.4: one HELP and TYPE line per family, then the samples; label values are
 * escaped (backslash, quote, newline). Reading: kvr_metric_line_is()/kvr_metric_line_value() take
 * one sample line of a scraped page apart (the router's worker scrape, the bench's monitor).
 */
#ifndef KVR_METRICS_H
#define KVR_METRICS_H

#include "base/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_HIST_MAX_BUCKETS 32

typedef struct kvr_hist_s {
  const double *bounds; /* static array of nbounds increasing upper bounds; +Inf is implicit */
  size_t nbounds;
  uint64_t counts[KVR_HIST_MAX_BUCKETS]; /* non-cumulative per bucket; [nbounds] is +Inf */
  double sum;
  uint64_t count;
} kvr_hist_t;

/* Bucket sets in seconds. */
extern const double kvr_hist_latency_buckets[]; /* 1 ms .. 300 s, for request durations */
extern const size_t kvr_hist_latency_nbuckets;
extern const double kvr_hist_fast_buckets[]; /* 1 us .. 10 ms, for routing decisions */
extern const size_t kvr_hist_fast_nbuckets;
extern const double kvr_hist_itl_buckets[]; /* 1 ms .. 80 s, vLLM's inter-token latency bounds */
extern const size_t kvr_hist_itl_nbuckets;
extern const double kvr_hist_call_buckets[]; /* 100 us .. 5 s, for calls on the request path */
extern const size_t kvr_hist_call_nbuckets;

void kvr_hist_init(kvr_hist_t *h, const double *bounds, size_t nbounds);
void kvr_hist_observe(kvr_hist_t *h, double v);

/* Writes "# HELP name help\n# TYPE name type\n". */
void kvr_metric_family(kvr_buf_t *out, const char *name, const char *type, const char *help);
/* Writes one sample line: name{labels} value. labels is preformatted ("a=\"b\"") or NULL. */
void kvr_metric_sample(kvr_buf_t *out, const char *name, const char *labels, double value);
/* Writes the _bucket, _sum and _count samples of h with the given extra labels (or NULL). */
void kvr_metric_hist(kvr_buf_t *out, const char *name, const char *labels, const kvr_hist_t *h);
/* Writes a whole histogram family: its HELP and TYPE lines, then kvr_metric_hist(name, labels, h).
 */
void kvr_metric_histogram(kvr_buf_t *out, const char *name, const char *help, const char *labels,
                          const kvr_hist_t *h);
/* Appends a label value escaped for the text format (no quotes added). */
void kvr_metric_escape(kvr_buf_t *out, const char *value);

/* This process's figures for the standard process_* families (the names Prometheus' client
 * libraries' process collectors use). A figure below 0 could not be read: its family is written
 * with no sample. */
typedef struct kvr_process_stats_s {
  double start_time_s; /* since the Unix epoch (/proc/self/stat starttime + /proc/stat btime) */
  double cpu_seconds;  /* user + system (getrusage) */
  double rss_bytes;    /* resident set (/proc/self/statm) */
  double open_fds;     /* entries of /proc/self/fd */
  double max_fds;      /* RLIMIT_NOFILE soft limit */
} kvr_process_stats_t;

/* Fills st for the calling process. */
void kvr_process_stats_read(kvr_process_stats_t *st);
/* Writes the process_start_time_seconds, process_cpu_seconds_total, process_resident_memory_bytes,
 * process_open_fds and process_max_fds families from st. */
void kvr_metric_process(kvr_buf_t *out, const kvr_process_stats_t *st);

/* Whether the sample line [line, end) is of metric `name`: the name followed by '{' or ' '. */
bool kvr_metric_line_is(const char *line, const char *end, const char *name);
/* Reads the value that follows the name and label set of the sample line [line, end) (quoted label
 * values may hold spaces and escapes; an optional timestamp after the value is ignored). Returns 0,
 * or -1 when the line has no number there. */
int kvr_metric_line_value(const char *line, const char *end, double *out);

#endif

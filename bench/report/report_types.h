/* report_types.h -- the types of the report's analysis, without its functions: a run's max
 * SLO-compliant load and how much of it is known (kvr_report_cap_t), and a capacity ratio against
 * the baseline with its bound (kvr_report_gain_t).
 *
 * Types only (the HAProxy -t.h habit), so that report_int.h and a folder that only carries these
 * figures (bench/vcluster/study.h) include them without the report's API; report.h includes this
 * and declares the functions that compute them. The figures are defined over the results of
 * bench/loadgen/stats.h.
 */
#ifndef KVR_REPORT_TYPES_H
#define KVR_REPORT_TYPES_H

#include "bench/loadgen/stats.h"

#include <stdbool.h>

/* A run's max SLO-compliant load (kvr_stats_run_max_load) and how much of it is known. */
typedef struct kvr_report_cap_s {
  double load; /* highest passing load below the lowest failing one; 0 when none passed */
  bool ran;    /* some level ran to its end or stopped early (not every one interrupted) */
  bool found;  /* a level at a higher load failed, so the limit lies between load and it; false:
                * every level tried passed and load is only a lower bound */
} kvr_report_cap_t;

/* How a capacity ratio against the baseline is known. */
typedef enum kvr_report_bound_e {
  KVR_REPORT_EXACT,    /* both limits found: the ratio as measured */
  KVR_REPORT_AT_LEAST, /* only the run's limit is a lower bound: the ratio is at least this */
  KVR_REPORT_AT_MOST,  /* only the baseline's limit is a lower bound: the ratio is at most this */
  KVR_REPORT_UNKNOWN,  /* both limits are lower bounds, or a run has no level: no ratio */
  KVR_REPORT_NO_BASE,  /* the baseline passed at no load it tried: no ratio */
} kvr_report_bound_t;

typedef struct kvr_report_gain_s {
  double ratio; /* cap.load / base.load; 0 when base.load is 0 */
  kvr_report_bound_t bound;
} kvr_report_gain_t;

#endif

/* report.c -- the report's analysis of the results, as data: how far each run's max SLO-compliant
 * load is known (found, or only bounded below), capacity ratios and their bounds, which label
 * certainly wins, whether a level kept to its schedule; and the shared views: loads and their
 * formatting, the metric tables the Markdown, HTML and charts share, the worker names at a load and
 * the load the detailed comparison uses.
 *
 * The report is split by format: this file (what every format reads), report_sections.c (the
 * sections, written once as format-neutral blocks), report_verdicts.c (every concluding sentence,
 * and the plain-text summary), report_doc.c (the block writer), report_md.c (Markdown),
 * report_html.c (the HTML page with its SVG charts), report_json.c (per-level JSON and per-request
 * JSONL), report_files.c (the files).
 *
 * Structs: kvr__metric_t (report_int.h) -- a title, a printf format, an accessor and a validity
 * test per figure; everything else is read from kvr_results_t / kvr_run_t / kvr_level_t (stats.h).
 *
 * Invariants: "load" is a request rate (req/s of turn arrivals, or conversation starts/s in
 * sessions mode) or, in concurrency mode, a number of users; runs[0] is the baseline. Nothing here
 * allocates except kvr__all_loads(), whose array the caller frees.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"
#include "base/quantile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double kvr__load_of(const kvr_level_t *lv) {
  return lv->concurrency ? (double)lv->concurrency : lv->rate;
}

const kvr_level_t *kvr__find_load(const kvr_run_t *run, double load) {
  for (size_t i = 0; i < run->nlevels; i++)
    if (fabs(kvr__load_of(run->levels[i]) - load) < 1e-9)
      return run->levels[i];
  return NULL;
}

size_t kvr__worker_names(const kvr_results_t *res, double dl,
                         char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX]) {
  size_t nnames = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_level_t *lv = kvr__find_load(&res->runs[r], dl);
    for (size_t w = 0; lv && w < lv->nworkers; w++) {
      size_t k = 0;
      while (k < nnames && strcmp(names[k], lv->workers[w].name) != 0)
        k++;
      if (k == nnames && nnames < KVR_STATS_MAX_WORKERS)
        snprintf(names[nnames++], KVR_WORKER_NAME_MAX, "%s", lv->workers[w].name);
    }
  }
  return nnames;
}

size_t kvr__worker_count(const kvr_level_t *lv, const char *name) {
  for (size_t w = 0; lv && w < lv->nworkers; w++)
    if (strcmp(lv->workers[w].name, name) == 0)
      return lv->workers[w].count;
  return 0;
}

double *kvr__all_loads(const kvr_results_t *res, size_t *n) {
  size_t total = 0;
  for (size_t r = 0; r < res->nruns; r++)
    total += res->runs[r].nlevels;
  double *v = kvr_xmalloc((total ? total : 1) * sizeof(double));
  size_t k = 0;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      v[k++] = kvr__load_of(res->runs[r].levels[i]);
  kvr_quantile_sort(v, k);
  size_t u = 0;
  for (size_t i = 0; i < k; i++)
    if (u == 0 || fabs(v[i] - v[u - 1]) > 1e-9)
      v[u++] = v[i];
  *n = u;
  return v;
}

void kvr__fmt_load(const kvr_results_t *res, double load, char *buf, size_t size) {
  if (res->concurrency_mode)
    snprintf(buf, size, "%.0f", load);
  else if (fabs(load * 100 - round(load * 100)) < 1e-6)
    snprintf(buf, size, "%.2f", load);
  else
    snprintf(buf, size, "%.3f", load);
}

const char *kvr__load_header(const kvr_results_t *res) {
  return res->concurrency_mode ? "Users" : "Rate";
}

const char *kvr__load_unit(const kvr_results_t *res) {
  return res->concurrency_mode ? "users" : (res->sessions ? "conv/s" : "RPS");
}

void kvr__fmt_pct_change(double base, double v, char *buf, size_t size) {
  if (base > 0)
    snprintf(buf, size, "%+.0f%%", (v / base - 1.0) * 100.0);
  else
    snprintf(buf, size, KVR__DASH);
}

void kvr__fmt_cap(const kvr_results_t *res, kvr_report_cap_t cap, bool with_unit, char *buf,
                  size_t size) {
  char a[32];
  kvr__fmt_load(res, cap.load, a, sizeof(a));
  if (!cap.ran)
    snprintf(buf, size, KVR__DASH);
  else
    snprintf(buf, size, "%s%s%s%s", cap.found ? "" : "at least ", a, with_unit ? " " : "",
             with_unit ? kvr__load_unit(res) : "");
}

void kvr__fmt_gain(kvr_report_gain_t g, char *buf, size_t size) {
  double pct = (g.ratio - 1.0) * 100.0;
  switch (g.bound) {
  case KVR_REPORT_EXACT:
    snprintf(buf, size, "%+.0f%%", pct);
    break;
  case KVR_REPORT_AT_LEAST:
    snprintf(buf, size, "at least %+.0f%%", pct);
    break;
  case KVR_REPORT_AT_MOST:
    snprintf(buf, size, "at most %+.0f%%", pct);
    break;
  case KVR_REPORT_UNKNOWN:
    snprintf(buf, size, "unknown");
    break;
  case KVR_REPORT_NO_BASE:
    snprintf(buf, size, KVR__DASH);
    break;
  }
}

void kvr__run_name(const kvr_run_t *run, char *buf, size_t size) {
  if (run->policy[0] && strcmp(run->policy, run->label) != 0)
    snprintf(buf, size, "%s (%s)", run->label, run->policy);
  else
    snprintf(buf, size, "%s", run->label);
}

void kvr_report_title(const kvr_results_t *res, kvr_buf_t *out) {
  kvr_buf_puts(out, res->title ? res->title : "kvrouter Benchmark Report");
  if (res->virtual_desc)
    kvr_buf_puts(out, " (virtual time)");
}

bool kvr__passed_any(const kvr_run_t *run) {
  for (size_t i = 0; i < run->nlevels; i++)
    if (run->levels[i]->pass && !run->levels[i]->interrupted)
      return true;
  return false;
}

bool kvr__detail_load(const kvr_results_t *res, double *load, bool *passed) {
  if (res->nruns == 0 || res->runs[0].nlevels == 0)
    return false;
  double m = kvr_stats_run_max_load(&res->runs[0]);
  *passed = m > 0;
  if (m > 0) {
    *load = m;
    return true;
  }
  double lo = INFINITY;
  for (size_t i = 0; i < res->runs[0].nlevels; i++)
    lo = fmin(lo, kvr__load_of(res->runs[0].levels[i]));
  *load = lo;
  return true;
}

bool kvr__detail_workers(const kvr_results_t *res, double *load,
                         char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX], size_t *nnames) {
  bool passed;
  if (!kvr__detail_load(res, load, &passed))
    return false;
  *nnames = kvr__worker_names(res, *load, names);
  return true;
}

/* ---- the analysis ---------------------------------------------------------------------------- */

kvr_report_cap_t kvr_report_cap(const kvr_run_t *run) {
  kvr_report_cap_t c = {kvr_stats_run_max_load(run), false, false};
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    c.ran |= !lv->interrupted;
    c.found |= !lv->interrupted && !lv->pass; /* the lowest failure bounds the max from above */
  }
  return c;
}

kvr_report_gain_t kvr_report_gain(kvr_report_cap_t base, kvr_report_cap_t cap) {
  kvr_report_gain_t g = {base.load > 0 ? cap.load / base.load : 0, KVR_REPORT_UNKNOWN};
  if (!base.ran || !cap.ran)
    g.bound = KVR_REPORT_UNKNOWN;
  else if (base.found && base.load <= 0)
    g.bound = KVR_REPORT_NO_BASE;
  else if (base.found || (cap.found && cap.load <= 0)) /* passing nowhere is -100% of anything */
    g.bound = cap.found ? KVR_REPORT_EXACT : KVR_REPORT_AT_LEAST;
  else
    g.bound = cap.found ? KVR_REPORT_AT_MOST : KVR_REPORT_UNKNOWN;
  return g;
}

int kvr_report_cmp(kvr_report_cap_t a, kvr_report_cap_t b) {
  bool above = a.load > b.load + 1e-9, below = a.load < b.load - 1e-9;
  if (!a.ran || !b.ran)
    return KVR_REPORT_CMP_UNKNOWN;
  if (a.found && b.found)
    return above ? 1 : below ? -1 : 0;
  if (a.found && !b.found) /* b is at least b.load */
    return below ? -1 : KVR_REPORT_CMP_UNKNOWN;
  if (!a.found && b.found) /* a is at least a.load */
    return above ? 1 : KVR_REPORT_CMP_UNKNOWN;
  return KVR_REPORT_CMP_UNKNOWN;
}

bool kvr_report_winner(const kvr_results_t *res, size_t r) {
  if (r == 0 || r >= res->nruns)
    return false;
  kvr_report_cap_t c = kvr_report_cap(&res->runs[r]);
  if (kvr_report_cmp(c, kvr_report_cap(&res->runs[0])) != 1)
    return false;
  for (size_t s = 1; s < res->nruns; s++) {
    int k = s == r ? 0 : kvr_report_cmp(c, kvr_report_cap(&res->runs[s]));
    if (k != 0 && k != 1)
      return false;
  }
  return true;
}

bool kvr_report_on_schedule(const kvr_level_t *lv, bool *lag_ok, bool *rate_ok) {
  *lag_ok = lv->lag.n == 0 || lv->lag.p99 < KVR_REPORT_LAG_P99_MAX_MS;
  *rate_ok = !(lv->scheduled_rate > 0 && lv->achieved_rate > 0) ||
             fabs(lv->achieved_rate / lv->scheduled_rate - 1) <= KVR_REPORT_RATE_TOL;
  return *lag_ok && *rate_ok;
}

/* ---- metrics --------------------------------------------------------------------------------- */

bool kvr__has_data(const kvr_level_t *lv) {
  return lv->completed > 0;
}
static bool has_tpot(const kvr_level_t *lv) {
  return lv->tpot.n > 0;
}
static bool has_itl(const kvr_level_t *lv) {
  return lv->itl.n > 0;
}
static bool has_usage(const kvr_level_t *lv) {
  return lv->usage_requests > 0 && lv->total_input > 0;
}
static bool always(const kvr_level_t *lv) {
  (void)lv;
  return true;
}
static bool has_measured(const kvr_level_t *lv) {
  return lv->measured > 0;
}
bool kvr__has_engine(const kvr_level_t *lv) {
  return lv->engine_workers > 0;
}

#define GETTER(name, expr)                                                                         \
  static double name(const kvr_level_t *lv) {                                                      \
    return (expr);                                                                                 \
  }
GETTER(g_ttft_p50, lv->ttft.p50)
GETTER(g_ttft_p90, lv->ttft.p90)
GETTER(g_ttft_p95, lv->ttft.p95)
GETTER(g_ttft_p99, lv->ttft.p99)
GETTER(g_ttft_mean, lv->ttft.mean)
GETTER(g_tpot_p50, lv->tpot.p50)
GETTER(g_tpot_p95, lv->tpot.p95)
GETTER(g_tpot_p99, lv->tpot.p99)
GETTER(g_tpot_mean, lv->tpot.mean)
GETTER(g_itl_p50, lv->itl.p50)
GETTER(g_itl_p99, lv->itl.p99)
GETTER(g_e2e_p50, lv->e2e.p50)
GETTER(g_e2e_p99, lv->e2e.p99)
GETTER(g_out_tps, lv->output_throughput)
GETTER(g_req_tps, lv->request_throughput)
GETTER(g_maxconc, (double)lv->max_concurrent)
GETTER(g_cached_pct,
       lv->total_input ? 100.0 * (double)lv->total_cached / (double)lv->total_input : 0)
GETTER(g_achieved, lv->achieved_rate)
GETTER(g_completed, (double)lv->completed)
GETTER(g_failed, (double)lv->failed)
GETTER(g_lag_p99, lv->lag.p99)
GETTER(g_in_mean, lv->completed ? (double)lv->total_input / (double)lv->completed : 0)
GETTER(g_out_mean, lv->completed ? (double)lv->total_output / (double)lv->completed : 0)
GETTER(g_preempt, (double)lv->preemptions)
GETTER(g_kv_peak, 100.0 * lv->kv_usage_peak)
#undef GETTER

#define COUNTER(name, expr)                                                                        \
  static size_t name(const kvr_level_t *lv) {                                                      \
    return (expr);                                                                                 \
  }
COUNTER(n_ttft, lv->ttft.n)
COUNTER(n_tpot, lv->tpot.n)
COUNTER(n_completed, lv->completed)
COUNTER(n_measured, lv->measured)
COUNTER(n_usage, lv->usage_requests)
#undef COUNTER

const kvr__metric_t kvr__per_load_metrics[] = {
    {"TTFT p99 (ms)", "%.0f", g_ttft_p99, kvr__has_data, n_ttft},
    {"TPOT p99 (ms)", "%.0f", g_tpot_p99, has_tpot, n_tpot},
    {"Output Throughput (tok/s)", "%.0f", g_out_tps, kvr__has_data, n_completed},
    {"Request Throughput (req/s)", "%.2f", g_req_tps, kvr__has_data, n_completed},
    {"Max Concurrent Requests", "%.0f", g_maxconc, has_measured, n_measured},
    {"Cached Tokens (% of prompt tokens)", "%.0f%%", g_cached_pct, has_usage, n_usage},
};
const size_t kvr__n_per_load_metrics = KVR_ARRAY_SIZE(kvr__per_load_metrics);

const kvr__metric_t kvr__achieved_metric = {"Achieved Rate (req/s)", "%.2f", g_achieved,
                                            has_measured, n_measured};

const kvr__metric_t kvr__engine_metrics[] = {
    {"Preemptions (KV cache full)", "%.0f", g_preempt, kvr__has_engine, NULL},
    {"KV Cache Usage Peak", "%.0f%%", g_kv_peak, kvr__has_engine, NULL},
};
const size_t kvr__n_engine_metrics = KVR_ARRAY_SIZE(kvr__engine_metrics);

const kvr__metric_t kvr__detail_metrics[] = {
    {"TTFT mean (ms)", "%.0f", g_ttft_mean, kvr__has_data, n_ttft},
    {"TTFT p50 (ms)", "%.0f", g_ttft_p50, kvr__has_data, n_ttft},
    {"TTFT p90 (ms)", "%.0f", g_ttft_p90, kvr__has_data, n_ttft},
    {"TTFT p95 (ms)", "%.0f", g_ttft_p95, kvr__has_data, n_ttft},
    {"TTFT p99 (ms)", "%.0f", g_ttft_p99, kvr__has_data, n_ttft},
    {"TPOT mean (ms)", "%.1f", g_tpot_mean, has_tpot, n_tpot},
    {"TPOT p50 (ms)", "%.1f", g_tpot_p50, has_tpot, n_tpot},
    {"TPOT p95 (ms)", "%.1f", g_tpot_p95, has_tpot, n_tpot},
    {"TPOT p99 (ms)", "%.1f", g_tpot_p99, has_tpot, n_tpot},
    {"ITL p50 (ms)", "%.1f", g_itl_p50, has_itl, NULL},
    {"ITL p99 (ms)", "%.1f", g_itl_p99, has_itl, NULL},
    {"E2E p50 (ms)", "%.0f", g_e2e_p50, kvr__has_data, n_completed},
    {"E2E p99 (ms)", "%.0f", g_e2e_p99, kvr__has_data, n_completed},
    {"Max Concurrent", "%.0f", g_maxconc, has_measured, n_measured},
    {"Output tok/s", "%.0f", g_out_tps, kvr__has_data, n_completed},
    {"Request throughput (req/s)", "%.2f", g_req_tps, kvr__has_data, n_completed},
    {"Mean input tokens", "%.0f", g_in_mean, has_usage, n_completed},
    {"Mean output tokens", "%.0f", g_out_mean, kvr__has_data, n_completed},
    {"Cached tokens (% of prompt)", "%.0f%%", g_cached_pct, has_usage, n_usage},
    {"Achieved rate (req/s)", "%.2f", g_achieved, has_measured, n_measured},
    {"Send lag p99 (real ms)", "%.2f", g_lag_p99, has_measured, n_measured},
    {"Completed", "%.0f", g_completed, always, NULL},
    {"Failed", "%.0f", g_failed, always, NULL},
    {"Preemptions", "%.0f", g_preempt, kvr__has_engine, NULL},
    {"KV cache usage peak", "%.0f%%", g_kv_peak, kvr__has_engine, NULL},
};
const size_t kvr__n_detail_metrics = KVR_ARRAY_SIZE(kvr__detail_metrics);

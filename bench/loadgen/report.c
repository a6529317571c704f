/* report.c -- renders collected benchmark results as Markdown, JSON, JSONL and HTML with SVG
 * charts.
 *
 * Structs: none of its own beyond small tables of metric accessors (metric_t) and chart series
 * (series_t); everything is read from kvr_results_t / kvr_run_t / kvr_level_t (stats.h).
 *
 * Flow: kvr_report_write() -> kvr_report_markdown(), kvr_report_html(), kvr_report_level_json() per
 * level, kvr_report_jsonl() per level -> files in the results folder. Each renderer appends to a
 * kvr_buf_t and is a pure function of its input, so tests assert on the text without any I/O.
 *
 * Invariants: "load" is a request rate (req/s of turn arrivals, or conversation starts/s in
 * sessions mode) or, in concurrency mode, a number of users; tables have one row per load any run
 * measured and show an em dash where a run has no level there. runs[0] is the baseline.
 */
#include "report.h"

#include "src/kvr.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define DASH "\xe2\x80\x94" /* em dash, as in the team's reports */

static double load_of(const kvr_level_t *lv) {
  return lv->concurrency ? (double)lv->concurrency : lv->rate;
}

static const kvr_level_t *find_load(const kvr_run_t *run, double load) {
  for (size_t i = 0; i < run->nlevels; i++)
    if (fabs(load_of(run->levels[i]) - load) < 1e-9)
      return run->levels[i];
  return NULL;
}

/* The distinct worker names (x-kvrouter-worker) seen at load dl across all runs, in first-seen
 * order, for the per-worker share table and chart. */
static size_t worker_names(const kvr_results_t *res, double dl,
                           char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX]) {
  size_t nnames = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_level_t *lv = find_load(&res->runs[r], dl);
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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorted distinct loads over all runs; caller frees. */
static double *all_loads(const kvr_results_t *res, size_t *n) {
  size_t total = 0;
  for (size_t r = 0; r < res->nruns; r++)
    total += res->runs[r].nlevels;
  double *v = malloc((total ? total : 1) * sizeof(double));
  if (v == NULL)
    abort();
  size_t k = 0;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      v[k++] = load_of(res->runs[r].levels[i]);
  qsort(v, k, sizeof(double), cmp_double);
  size_t u = 0;
  for (size_t i = 0; i < k; i++)
    if (u == 0 || fabs(v[i] - v[u - 1]) > 1e-9)
      v[u++] = v[i];
  *n = u;
  return v;
}

static void fmt_load(const kvr_results_t *res, double load, char *buf, size_t size) {
  if (res->concurrency_mode)
    snprintf(buf, size, "%.0f", load);
  else if (fabs(load * 100 - round(load * 100)) < 1e-6)
    snprintf(buf, size, "%.2f", load);
  else
    snprintf(buf, size, "%.3f", load);
}

static const char *load_header(const kvr_results_t *res) {
  return res->concurrency_mode ? "Users" : "Rate";
}

static const char *load_unit(const kvr_results_t *res) {
  return res->concurrency_mode ? "users" : (res->sessions ? "conv/s" : "RPS");
}

/* ---- metrics --------------------------------------------------------------------------------- */

typedef struct metric_s {
  const char *title;
  const char *fmt;
  double (*get)(const kvr_level_t *);
  bool (*valid)(const kvr_level_t *);
} metric_t;

static bool has_data(const kvr_level_t *lv) {
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
static bool has_engine(const kvr_level_t *lv) {
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

static const metric_t per_load_metrics[] = {
    {"TTFT p99 (ms)", "%.0f", g_ttft_p99, has_data},
    {"TPOT p99 (ms)", "%.0f", g_tpot_p99, has_tpot},
    {"Output Throughput (tok/s)", "%.0f", g_out_tps, has_data},
    {"Request Throughput (req/s)", "%.2f", g_req_tps, has_data},
    {"Max Concurrent Requests", "%.0f", g_maxconc, has_measured},
    {"Cached Tokens (% of prompt tokens)", "%.0f%%", g_cached_pct, has_usage},
};

/* Which limit a level hit: shown when some level has the workers' engine counters. */
static const metric_t engine_metrics[] = {
    {"Preemptions (KV cache full)", "%.0f", g_preempt, has_engine},
    {"KV Cache Usage Peak", "%.0f%%", g_kv_peak, has_engine},
};

static const metric_t detail_metrics[] = {
    {"TTFT mean (ms)", "%.0f", g_ttft_mean, has_data},
    {"TTFT p50 (ms)", "%.0f", g_ttft_p50, has_data},
    {"TTFT p90 (ms)", "%.0f", g_ttft_p90, has_data},
    {"TTFT p95 (ms)", "%.0f", g_ttft_p95, has_data},
    {"TTFT p99 (ms)", "%.0f", g_ttft_p99, has_data},
    {"TPOT mean (ms)", "%.1f", g_tpot_mean, has_tpot},
    {"TPOT p50 (ms)", "%.1f", g_tpot_p50, has_tpot},
    {"TPOT p95 (ms)", "%.1f", g_tpot_p95, has_tpot},
    {"TPOT p99 (ms)", "%.1f", g_tpot_p99, has_tpot},
    {"ITL p50 (ms)", "%.1f", g_itl_p50, has_itl},
    {"ITL p99 (ms)", "%.1f", g_itl_p99, has_itl},
    {"E2E p50 (ms)", "%.0f", g_e2e_p50, has_data},
    {"E2E p99 (ms)", "%.0f", g_e2e_p99, has_data},
    {"Max Concurrent", "%.0f", g_maxconc, has_measured},
    {"Output tok/s", "%.0f", g_out_tps, has_data},
    {"Request throughput (req/s)", "%.2f", g_req_tps, has_data},
    {"Mean input tokens", "%.0f", g_in_mean, has_usage},
    {"Mean output tokens", "%.0f", g_out_mean, has_data},
    {"Cached tokens (% of prompt)", "%.0f%%", g_cached_pct, has_usage},
    {"Achieved rate (req/s)", "%.2f", g_achieved, has_measured},
    {"Send lag p99 (real ms)", "%.2f", g_lag_p99, has_measured},
    {"Completed", "%.0f", g_completed, always},
    {"Failed", "%.0f", g_failed, always},
    {"Preemptions", "%.0f", g_preempt, has_engine},
    {"KV cache usage peak", "%.0f%%", g_kv_peak, has_engine},
};

static void cell(kvr_buf_t *out, const metric_t *m, const kvr_level_t *lv) {
  if (lv == NULL) {
    kvr_buf_puts(out, " " DASH " |");
  } else if (!m->valid(lv)) {
    kvr_buf_puts(out, lv->stopped_early ? " stopped early |" : " n/a |");
  } else {
    char tmp[64];
    snprintf(tmp, sizeof(tmp), m->fmt, m->get(lv));
    kvr_buf_printf(out, " %s |", tmp);
  }
}

static void table_header(const kvr_results_t *res, kvr_buf_t *out, const char *first, bool right) {
  kvr_buf_printf(out, "| %s |", first);
  for (size_t r = 0; r < res->nruns; r++)
    kvr_buf_printf(out, " %s |", res->runs[r].label);
  kvr_buf_puts(out, right ? "\n|-----:|" : "\n|--------|");
  for (size_t r = 0; r < res->nruns; r++)
    kvr_buf_puts(out, right ? "--------:|" : "--------|");
  kvr_buf_puts(out, "\n");
}

static void metric_table(const kvr_results_t *res, const metric_t *m, const double *loads,
                         size_t nloads, kvr_buf_t *out) {
  kvr_buf_printf(out, "## Results " DASH " %s\n\n", m->title);
  table_header(res, out, load_header(res), true);
  for (size_t i = 0; i < nloads; i++) {
    char l[32];
    fmt_load(res, loads[i], l, sizeof(l));
    kvr_buf_printf(out, "| %s |", l);
    for (size_t r = 0; r < res->nruns; r++)
      cell(out, m, find_load(&res->runs[r], loads[i]));
    kvr_buf_puts(out, "\n");
  }
  kvr_buf_puts(out, "\n");
}

static void verdict(const kvr_level_t *lv, char *buf, size_t size) {
  if (lv->pass) {
    snprintf(buf, size, "PASS%s", lv->interrupted ? " (partial)" : "");
    return;
  }
  char names[40];
  kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
  snprintf(buf, size, "FAIL (%s)%s", names,
           lv->interrupted     ? " (partial)"
           : lv->stopped_early ? " (stopped early)"
                               : "");
}

/* The load the detailed comparison uses: the baseline's max SLO-compliant load, or when nothing
 * passed, the lowest load the baseline measured. Returns false when the baseline has no levels. */
static bool detail_load(const kvr_results_t *res, double *load, bool *passed) {
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
    lo = fmin(lo, load_of(res->runs[0].levels[i]));
  *load = lo;
  return true;
}

static void fmt_pct_change(double base, double v, char *buf, size_t size) {
  if (base > 0)
    snprintf(buf, size, "%+.0f%%", (v / base - 1.0) * 100.0);
  else
    snprintf(buf, size, DASH);
}

/* Label of the first failing level of a run and its failing SLOs; false when nothing failed. */
static bool first_failure(const kvr_run_t *run, double *load, unsigned *mask) {
  const kvr_level_t *best = NULL;
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    if (!lv->pass && !lv->interrupted && (best == NULL || load_of(lv) < load_of(best)))
      best = lv;
  }
  if (best == NULL)
    return false;
  *load = load_of(best);
  *mask = best->fail_mask;
  return true;
}

static void observations(const kvr_results_t *res, kvr_buf_t *out) {
  int n = 1;
  double base = kvr_stats_run_max_load(&res->runs[0]);
  const char *unit = load_unit(res);
  char a[32], b[32];

  /* 1. Capacity. */
  if (res->nruns > 1) {
    size_t best = 1;
    for (size_t r = 2; r < res->nruns; r++)
      if (kvr_stats_run_max_load(&res->runs[r]) > kvr_stats_run_max_load(&res->runs[best]))
        best = r;
    double bm = kvr_stats_run_max_load(&res->runs[best]);
    fmt_load(res, base, a, sizeof(a));
    fmt_load(res, bm, b, sizeof(b));
    if (bm > base && base > 0)
      kvr_buf_printf(out,
                     "%d. **`%s` raises the max SLO-compliant load from %s to %s %s (%+.0f%%) over "
                     "`%s`.** On this workload it serves %.0f%% more traffic within the SLOs.\n\n",
                     n++, res->runs[best].label, a, b, unit, (bm / base - 1) * 100,
                     res->runs[0].label, (bm / base - 1) * 100);
    else if (bm > base)
      kvr_buf_printf(out,
                     "%d. **`%s` passes the SLOs up to %s %s where `%s` passes at no measured "
                     "load.**\n\n",
                     n++, res->runs[best].label, b, unit, res->runs[0].label);
    else
      kvr_buf_printf(out,
                     "%d. **No configuration raised the max SLO-compliant load above `%s`'s %s "
                     "%s.**\n\n",
                     n++, res->runs[0].label, a, unit);
  }

  /* 2. Binding constraint per run. */
  for (size_t r = 0; r < res->nruns; r++) {
    double fl;
    unsigned mask;
    char names[64];
    if (first_failure(&res->runs[r], &fl, &mask)) {
      kvr_stats_fail_names(mask, names, sizeof(names));
      fmt_load(res, fl, a, sizeof(a));
      kvr_buf_printf(
          out, "%d. **%s binds first for `%s`.** Its first failing load is %s %s (FAIL (%s)).\n\n",
          n++, names, res->runs[r].label, a, unit, names);
    } else if (res->runs[r].nlevels > 0) {
      kvr_buf_printf(out,
                     "%d. **`%s` passed every measured load.** Its limit lies above the "
                     "highest load measured.\n\n",
                     n++, res->runs[r].label);
    }
  }

  /* 3. Latency at the baseline's max load. */
  double dl;
  bool passed;
  if (res->nruns > 1 && detail_load(res, &dl, &passed)) {
    const kvr_level_t *b0 = find_load(&res->runs[0], dl);
    fmt_load(res, dl, a, sizeof(a));
    for (size_t r = 1; r < res->nruns && b0 && has_data(b0); r++) {
      const kvr_level_t *lv = find_load(&res->runs[r], dl);
      if (lv == NULL || !has_data(lv))
        continue;
      char t1[16], t2[16];
      fmt_pct_change(b0->ttft.p99, lv->ttft.p99, t1, sizeof(t1));
      fmt_pct_change(b0->tpot.p99, lv->tpot.p99, t2, sizeof(t2));
      kvr_buf_printf(out,
                     "%d. **At %s %s, `%s` changes TTFT p99 by %s (%.0f -> %.0f ms) and TPOT p99 "
                     "by %s (%.1f -> %.1f ms) against `%s`.**\n\n",
                     n++, a, unit, res->runs[r].label, t1, b0->ttft.p99, lv->ttft.p99, t2,
                     b0->tpot.p99, lv->tpot.p99, res->runs[0].label);
    }
  }

  /* 4. Cache reuse over every level of each run. */
  bool any_usage = false;
  for (size_t r = 0; r < res->nruns; r++) {
    uint64_t in = 0, cached = 0;
    size_t usage = 0;
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      in += res->runs[r].levels[i]->total_input;
      cached += res->runs[r].levels[i]->total_cached;
      usage += res->runs[r].levels[i]->usage_requests;
    }
    if (usage > 0 && in > 0) {
      any_usage = true;
      kvr_buf_printf(out,
                     "%d. **`%s`: %.1f%% of prompt tokens were served from the KV cache** (%llu of "
                     "%llu over all levels, from usage.prompt_tokens_details.cached_tokens).\n\n",
                     n++, res->runs[r].label, 100.0 * (double)cached / (double)in,
                     (unsigned long long)cached, (unsigned long long)in);
    }
  }
  if (!any_usage)
    kvr_buf_printf(out, "%d. **The server reported no usage**, so cached tokens are not known.\n\n",
                   n++);

  /* 5. Worker balance at the detail load. */
  if (detail_load(res, &dl, &passed)) {
    fmt_load(res, dl, a, sizeof(a));
    for (size_t r = 0; r < res->nruns; r++) {
      const kvr_level_t *lv = find_load(&res->runs[r], dl);
      if (lv == NULL || lv->measured == 0)
        continue;
      size_t named = 0, mx = 0, mn = SIZE_MAX, total = 0;
      for (size_t w = 0; w < lv->nworkers; w++) {
        if (lv->workers[w].name[0] == '\0')
          continue;
        named++;
        total += lv->workers[w].count;
        mx = KVR_MAX(mx, lv->workers[w].count);
        mn = KVR_MIN(mn, lv->workers[w].count);
      }
      if (named == 0)
        kvr_buf_printf(out,
                       "%d. **`%s` responses carried no x-kvrouter-worker header** (not behind "
                       "kvrouter), so placement is unknown.\n\n",
                       n++, res->runs[r].label);
      else
        kvr_buf_printf(out,
                       "%d. **`%s` spread requests over %zu workers at %s %s**: the busiest took "
                       "%.0f%%, the least busy %.0f%% (even would be %.0f%%).\n\n",
                       n++, res->runs[r].label, named, a, unit, 100.0 * (double)mx / (double)total,
                       100.0 * (double)mn / (double)total, 100.0 / (double)named);
    }
  }

  /* 6. Load generator fidelity and failures. */
  double worst_lag = 0, worst_ratio = INFINITY;
  size_t failed = 0;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      worst_lag = fmax(worst_lag, lv->lag.p99);
      failed += lv->failed;
      /* A level cut short measured too few sends for a meaningful rate. */
      if (!res->concurrency_mode && lv->rate > 0 && lv->achieved_rate > 0 && !lv->stopped_early &&
          !lv->interrupted)
        worst_ratio = fmin(worst_ratio, lv->achieved_rate / lv->rate);
    }
  if (!res->concurrency_mode && isfinite(worst_ratio))
    kvr_buf_printf(out,
                   "%d. **The load generator kept to its schedule:** worst send lag p99 %.2f ms "
                   "(real time); achieved rate was at least %.0f%% of target at every level run "
                   "to its end.\n\n",
                   n++, worst_lag, 100.0 * worst_ratio);
  if (failed > 0)
    kvr_buf_printf(out, "%d. **%zu requests failed** across all levels; see requests.jsonl.\n\n",
                   n++, failed);
}

void kvr_report_markdown(const kvr_results_t *res, kvr_buf_t *out) {
  size_t nloads = 0;
  double *loads = all_loads(res, &nloads);
  const char *unit = load_unit(res);
  char a[32];

  kvr_buf_printf(out, "# %s\n\n", res->title ? res->title : "kvrouter Benchmark Report");
  kvr_buf_printf(out, "**Generated:** %s\n\n", res->generated ? res->generated : "");

  bool reset = res->cache_reset != NULL;
  kvr_buf_printf(out,
                 "## Configuration\n\n| # | Label | Policy | Description |%s\n"
                 "|:-:|-------|--------|-------------|%s\n",
                 reset ? " Prefix Cache Reset |" : "", reset ? "--------------------|" : "");
  for (size_t r = 0; r < res->nruns; r++) {
    kvr_buf_printf(out, "| %zu | %s%s | %s | %s |", r, res->runs[r].label,
                   r == 0 ? " (baseline)" : "", res->runs[r].policy[0] ? res->runs[r].policy : DASH,
                   res->runs[r].description[0] ? res->runs[r].description : DASH);
    if (reset)
      kvr_buf_printf(out, " %s |", res->runs[r].cache_reset[0] ? res->runs[r].cache_reset : DASH);
    kvr_buf_puts(out, "\n");
  }
  kvr_buf_puts(out, "\n");
  if (reset)
    kvr_buf_printf(out, "Prefix caches were reset %s, so every run starts cold.\n\n",
                   res->cache_reset);
  else if (res->nruns > 1)
    kvr_buf_puts(out, "Prefix caches were **not** reset between runs: later runs may find the "
                      "earlier runs' identical prompts still cached.\n\n");

  kvr_buf_printf(out,
                 "## SLO Targets\n\n| Metric | Target |\n|--------|--------|\n"
                 "| TTFT p99 | < %.0fms |\n| TPOT p99 | < %.0fms |\n",
                 res->slo.ttft_p99_ms, res->slo.tpot_p99_ms);
  if (res->slo.max_failed_frac > 0)
    kvr_buf_printf(out, "| Failed requests | <= %.1f%% |\n", res->slo.max_failed_frac * 100);
  else
    kvr_buf_puts(out, "| Failed requests | 0 |\n");
  kvr_buf_puts(out, "\n");

  for (size_t m = 0; m < KVR_ARRAY_SIZE(per_load_metrics); m++)
    metric_table(res, &per_load_metrics[m], loads, nloads, out);
  if (!res->concurrency_mode) {
    static const metric_t achieved = {"Achieved Rate (req/s)", "%.2f", g_achieved, has_measured};
    metric_table(res, &achieved, loads, nloads, out);
  }
  bool engine = false;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      engine |= has_engine(res->runs[r].levels[i]);
  if (engine)
    for (size_t m = 0; m < KVR_ARRAY_SIZE(engine_metrics); m++)
      metric_table(res, &engine_metrics[m], loads, nloads, out);

  /* SLO compliance matrix. */
  kvr_buf_printf(out,
                 "## SLO Compliance Matrix\n\nPASS = TTFT p99 < %.0fms AND TPOT p99 < %.0fms AND "
                 "failed requests %s\n\n",
                 res->slo.ttft_p99_ms, res->slo.tpot_p99_ms,
                 res->slo.max_failed_frac > 0 ? "within the allowance" : "= 0");
  table_header(res, out, load_header(res), false);
  for (size_t i = 0; i < nloads; i++) {
    fmt_load(res, loads[i], a, sizeof(a));
    kvr_buf_printf(out, "| %s |", a);
    for (size_t r = 0; r < res->nruns; r++) {
      const kvr_level_t *lv = find_load(&res->runs[r], loads[i]);
      char v[96];
      if (lv)
        verdict(lv, v, sizeof(v));
      else
        snprintf(v, sizeof(v), DASH);
      kvr_buf_printf(out, " %s |", v);
    }
    kvr_buf_puts(out, "\n");
  }
  kvr_buf_puts(out, "\n");
  bool stopped = false;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      stopped |= res->runs[r].levels[i]->stopped_early;
  if (stopped)
    kvr_buf_printf(out,
                   "\"Stopped early\": the search ended the level once so many measured requests "
                   "had a TTFT of %.0f ms or more that its TTFT p99 could no longer pass; its "
                   "figures in the tables above cover the requests that had finished by then.\n\n",
                   res->slo.ttft_p99_ms);

  /* Winner identification. */
  double base = res->nruns ? kvr_stats_run_max_load(&res->runs[0]) : 0;
  double best = 0;
  for (size_t r = 1; r < res->nruns; r++)
    best = fmax(best, kvr_stats_run_max_load(&res->runs[r]));
  kvr_buf_printf(out,
                 "## Winner Identification\n\n| Label | Max SLO-Compliant %s | Capacity vs "
                 "Baseline |\n|-------|:----------------------:|:--------------------:|\n",
                 load_header(res));
  for (size_t r = 0; r < res->nruns; r++) {
    double m = kvr_stats_run_max_load(&res->runs[r]);
    char cap[32];
    if (r == 0)
      snprintf(cap, sizeof(cap), DASH);
    else
      fmt_pct_change(base, m, cap, sizeof(cap));
    fmt_load(res, m, a, sizeof(a));
    bool winner = r > 0 && best > base && m == best; /* a tie with the baseline wins nothing */
    kvr_buf_printf(out, "| %s%s | %s | %s |\n", res->runs[r].label, winner ? " **WINNER**" : "", a,
                   cap);
  }
  kvr_buf_puts(out, "\n");
  if (res->nruns > 1) {
    if (best > base) {
      kvr_buf_puts(out, "**");
      bool first = true;
      for (size_t r = 1; r < res->nruns; r++)
        if (kvr_stats_run_max_load(&res->runs[r]) == best) {
          kvr_buf_printf(out, "%s%s", first ? "" : ", ", res->runs[r].label);
          first = false;
        }
      char b[32];
      fmt_load(res, base, a, sizeof(a));
      fmt_load(res, best, b, sizeof(b));
      if (base > 0)
        kvr_buf_printf(
            out, " improved max SLO-compliant load over baseline: %s -> %s %s (%+.0f%%).**\n\n", a,
            b, unit, (best / base - 1) * 100);
      else
        kvr_buf_printf(out, " passed up to %s %s; the baseline passed at no measured load.**\n\n",
                       b, unit);
    } else {
      kvr_buf_puts(out, "**No configuration improved over baseline.**\n\n");
    }
  }

  /* Detailed comparison. */
  double dl;
  bool passed;
  if (detail_load(res, &dl, &passed)) {
    fmt_load(res, dl, a, sizeof(a));
    if (passed)
      kvr_buf_printf(out, "## Detailed Comparison at Baseline Max %s (%s %s)\n\n", load_header(res),
                     a, unit);
    else
      kvr_buf_printf(out,
                     "## Detailed Comparison at Baseline's Lowest %s (%s %s; no load passed)\n\n",
                     load_header(res), a, unit);
    table_header(res, out, "Metric", false);
    bool engine_at = false;
    for (size_t r = 0; r < res->nruns; r++) {
      const kvr_level_t *lv = find_load(&res->runs[r], dl);
      engine_at |= lv && has_engine(lv);
    }
    for (size_t m = 0; m < KVR_ARRAY_SIZE(detail_metrics); m++) {
      if (detail_metrics[m].valid == has_engine && !engine_at)
        continue; /* no worker /metrics were read (e.g. a router without --admin) */
      kvr_buf_printf(out, "| %s |", detail_metrics[m].title);
      for (size_t r = 0; r < res->nruns; r++)
        cell(out, &detail_metrics[m], find_load(&res->runs[r], dl));
      kvr_buf_puts(out, "\n");
    }
    kvr_buf_puts(out, "\n");

    /* Per-turn TTFT. */
    size_t maxturn = 0;
    for (size_t r = 0; r < res->nruns; r++) {
      const kvr_level_t *lv = find_load(&res->runs[r], dl);
      if (lv)
        maxturn = KVR_MAX(maxturn, lv->nturns);
    }
    if (maxturn > 0) {
      kvr_buf_printf(
          out,
          "## Per-Turn TTFT at %s %s\n\nTTFT p50 / p99 (ms), mean prompt tokens, share of "
          "them cached.\n\n",
          a, unit);
      table_header(res, out, "Turn", false);
      for (size_t t = 0; t < maxturn; t++) {
        kvr_buf_printf(out, "| %zu |", t + 1);
        for (size_t r = 0; r < res->nruns; r++) {
          const kvr_level_t *lv = find_load(&res->runs[r], dl);
          if (lv == NULL || t >= lv->nturns || lv->turns[t].ttft.n == 0) {
            kvr_buf_puts(out, " " DASH " |");
            continue;
          }
          const kvr_turn_stats_t *ts = &lv->turns[t];
          kvr_buf_printf(out, " %.0f / %.0f, %.0f tok", ts->ttft.p50, ts->ttft.p99,
                         ts->mean_prompt_tokens);
          if (ts->mean_prompt_tokens > 0)
            kvr_buf_printf(out, ", %.0f%% cached",
                           100.0 * ts->mean_cached_tokens / ts->mean_prompt_tokens);
          kvr_buf_puts(out, " |");
        }
        kvr_buf_puts(out, "\n");
      }
      kvr_buf_puts(out, "\n");
    }

    /* Worker share. */
    char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX];
    size_t nnames = worker_names(res, dl, names);
    if (nnames > 0) {
      kvr_buf_printf(
          out, "## Worker Share at %s %s\n\nRequests per worker (x-kvrouter-worker).\n\n", a, unit);
      table_header(res, out, "Worker", false);
      for (size_t k = 0; k < nnames; k++) {
        kvr_buf_printf(out, "| %s |", names[k][0] ? names[k] : "(no header)");
        for (size_t r = 0; r < res->nruns; r++) {
          const kvr_level_t *lv = find_load(&res->runs[r], dl);
          size_t c = 0;
          for (size_t w = 0; lv && w < lv->nworkers; w++)
            if (strcmp(lv->workers[w].name, names[k]) == 0)
              c = lv->workers[w].count;
          if (lv == NULL || lv->measured == 0)
            kvr_buf_puts(out, " " DASH " |");
          else
            kvr_buf_printf(out, " %zu (%.0f%%) |", c, 100.0 * (double)c / (double)lv->measured);
        }
        kvr_buf_puts(out, "\n");
      }
      kvr_buf_puts(out, "\n");
    }
  }

  if (res->nruns > 0) {
    kvr_buf_puts(out, "## Key Observations\n\n");
    observations(res, out);
  }

  /* Workload parameters. */
  kvr_buf_puts(out, "## Workload Parameters\n\n| Parameter | Value |\n|-----------|-------|\n");
  kvr_buf_puts(out, "| Tool | `kvrouter bench` (open-loop, libuv + libcurl) |\n");
  kvr_buf_printf(out, "| Endpoint | %s (%s API) |\n", res->url ? res->url : "",
                 res->api ? res->api : "chat");
  kvr_buf_printf(out, "| Model | %s |\n", res->model ? res->model : "");
  kvr_buf_printf(out, "| Dataset | %s |\n",
                 res->workload_desc ? res->workload_desc : (res->workload ? res->workload : ""));
  kvr_buf_printf(out, "| Prompts per %s | %zu |\n", res->concurrency_mode ? "Level" : "Rate",
                 res->num_prompts);
  kvr_buf_printf(out, "| %s | ", res->concurrency_mode ? "Concurrency Levels" : "Request Rates");
  for (size_t i = 0; i < nloads; i++) {
    fmt_load(res, loads[i], a, sizeof(a));
    kvr_buf_printf(out, "%s%s", i ? ", " : "", a);
  }
  kvr_buf_printf(out, " %s |\n", unit);
  if (res->concurrency_mode)
    kvr_buf_puts(out,
                 "| Load | N closed-loop users, each running its conversations turn after turn "
                 "with think time |\n");
  else if (res->sessions)
    kvr_buf_puts(out, "| Rate Meaning | conversation starts per second; later turns follow their "
                      "predecessor after think time |\n");
  else
    kvr_buf_puts(out, "| Rate Meaning | requests per second of turn arrivals (one arrival = one "
                      "request): each arrival sends the next eligible turn of an open conversation "
                      "(eligible = previous turn done + think time), else starts a new "
                      "conversation; comparable with `vllm bench serve --request-rate` |\n");
  if (!res->concurrency_mode)
    kvr_buf_printf(out, "| Arrival Distribution | %s (burstiness=%.1f) |\n",
                   res->burstiness == 1.0 ? "Poisson" : "Gamma", res->burstiness);
  kvr_buf_printf(out, "| Warm-up | first %u requests of each level, excluded from metrics |\n",
                 res->warmup);
  kvr_buf_printf(out, "| Cooldown Between Levels | %.0fs |\n", res->cooldown_s);
  kvr_buf_printf(out, "| Prefix Cache Reset | %s |\n",
                 res->cache_reset ? res->cache_reset : "none");
  kvr_buf_printf(out,
                 "| Time Scale | %g (durations are reported in simulated time: the simulator's "
                 "engine time x scale, the rest of TTFT and E2E (client, router, loopback) at 1x; "
                 "send lag in real time) |\n",
                 res->time_scale);
  kvr_buf_printf(out, "| Seed | %llu |\n", (unsigned long long)res->seed);
  if (res->command)
    kvr_buf_printf(out, "| Command | `%s` |\n", res->command);
  free(loads);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static void add_dist(cJSON *o, const char *name, const kvr_dist_t *d) {
  char k[48];
  snprintf(k, sizeof(k), "mean_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->mean);
  snprintf(k, sizeof(k), "median_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->p50);
  snprintf(k, sizeof(k), "std_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->std);
  snprintf(k, sizeof(k), "p50_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->p50);
  snprintf(k, sizeof(k), "p90_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->p90);
  snprintf(k, sizeof(k), "p95_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->p95);
  snprintf(k, sizeof(k), "p99_%s_ms", name);
  cJSON_AddNumberToObject(o, k, d->p99);
}

static cJSON *dist_obj(const kvr_dist_t *d) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "n", (double)d->n);
  cJSON_AddNumberToObject(o, "mean", d->mean);
  cJSON_AddNumberToObject(o, "p50", d->p50);
  cJSON_AddNumberToObject(o, "p90", d->p90);
  cJSON_AddNumberToObject(o, "p95", d->p95);
  cJSON_AddNumberToObject(o, "p99", d->p99);
  cJSON_AddNumberToObject(o, "max", d->max);
  return o;
}

void kvr_report_level_json(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                           kvr_buf_t *out) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "date", res->generated ? res->generated : "");
  cJSON_AddStringToObject(
      o, "backend", res->api && strcmp(res->api, "completions") == 0 ? "openai" : "openai-chat");
  cJSON_AddStringToObject(o, "label", run->label);
  cJSON_AddStringToObject(o, "model_id", res->model ? res->model : "");
  cJSON_AddNumberToObject(o, "num_prompts", (double)lv->nrecs);
  if (lv->concurrency) {
    cJSON_AddStringToObject(o, "request_rate", "inf");
    cJSON_AddNumberToObject(o, "max_concurrency", lv->concurrency);
  } else {
    cJSON_AddNumberToObject(o, "request_rate", lv->rate);
    cJSON_AddNullToObject(o, "max_concurrency");
  }
  cJSON_AddNumberToObject(o, "burstiness", res->burstiness);
  cJSON_AddNumberToObject(o, "duration", lv->duration_s);
  cJSON_AddNumberToObject(o, "completed", (double)lv->completed);
  cJSON_AddNumberToObject(o, "failed", (double)lv->failed);
  cJSON_AddNumberToObject(o, "total_input_tokens", (double)lv->total_input);
  cJSON_AddNumberToObject(o, "total_output_tokens", (double)lv->total_output);
  cJSON_AddNumberToObject(o, "request_throughput", lv->request_throughput);
  cJSON_AddNumberToObject(o, "output_throughput", lv->output_throughput);
  cJSON_AddNumberToObject(o, "total_token_throughput", lv->total_token_throughput);
  cJSON_AddNumberToObject(o, "max_concurrent_requests", lv->max_concurrent);
  add_dist(o, "ttft", &lv->ttft);
  add_dist(o, "tpot", &lv->tpot);
  add_dist(o, "itl", &lv->itl);
  add_dist(o, "e2el", &lv->e2e);
  cJSON *in = cJSON_AddArrayToObject(o, "input_lens");
  cJSON *outl = cJSON_AddArrayToObject(o, "output_lens");
  cJSON *ttfts = cJSON_AddArrayToObject(o, "ttfts");
  cJSON *errs = cJSON_AddArrayToObject(o, "errors");
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup)
      continue;
    cJSON_AddItemToArray(in, cJSON_CreateNumber(r->prompt_tokens));
    cJSON_AddItemToArray(outl, cJSON_CreateNumber(r->output_tokens));
    cJSON_AddItemToArray(ttfts, cJSON_CreateNumber(r->ttft_ms >= 0 ? r->ttft_ms / 1000.0 : 0));
    cJSON_AddItemToArray(errs, cJSON_CreateString(r->error));
  }

  cJSON *k = cJSON_AddObjectToObject(o, "kvrouter");
  cJSON_AddStringToObject(k, "policy", run->policy);
  cJSON_AddStringToObject(k, "workload", res->workload ? res->workload : "");
  cJSON_AddStringToObject(k, "rate_meaning",
                          res->concurrency_mode ? "users"
                          : res->sessions       ? "conversation starts per second"
                                                : "turn arrivals per second");
  cJSON_AddNumberToObject(k, "time_scale", res->time_scale);
  cJSON_AddNumberToObject(k, "seed", (double)res->seed);
  cJSON_AddNumberToObject(k, "warmup_requests", res->warmup);
  cJSON_AddNumberToObject(k, "measured_requests", (double)lv->measured);
  cJSON_AddNumberToObject(k, "achieved_rate", lv->achieved_rate);
  cJSON_AddItemToObject(k, "send_lag_real_ms", dist_obj(&lv->lag));
  cJSON_AddItemToObject(k, "ttft_transport_real_ms", dist_obj(&lv->transport));
  cJSON_AddNumberToObject(k, "total_cached_tokens", (double)lv->total_cached);
  cJSON_AddNumberToObject(k, "requests_with_usage", (double)lv->usage_requests);
  cJSON_AddBoolToObject(k, "interrupted", lv->interrupted);
  char failing[40];
  kvr_stats_fail_names(lv->fail_mask, failing, sizeof(failing));
  cJSON_AddBoolToObject(k, "slo_pass", lv->pass);
  cJSON_AddStringToObject(k, "slo_failing", lv->pass ? "" : failing);
  cJSON_AddBoolToObject(k, "stopped_early", lv->stopped_early);
  cJSON_AddNumberToObject(k, "ttft_over_slo_when_stopped", (double)lv->ttft_over_slo);
  /* Which limit the level hit, from the workers' /metrics (null when none could be read). */
  if (lv->engine_workers) {
    cJSON_AddNumberToObject(k, "preemptions", (double)lv->preemptions);
    cJSON_AddNumberToObject(k, "kv_cache_usage_peak", lv->kv_usage_peak);
  } else {
    cJSON_AddNullToObject(k, "preemptions");
    cJSON_AddNullToObject(k, "kv_cache_usage_peak");
  }
  cJSON_AddNumberToObject(k, "engine_metrics_workers", (double)lv->engine_workers);
  if (run->cache_reset[0])
    cJSON_AddStringToObject(k, "prefix_cache_reset", run->cache_reset);
  else
    cJSON_AddNullToObject(k, "prefix_cache_reset");
  cJSON *ws = cJSON_AddObjectToObject(k, "worker_share");
  for (size_t w = 0; w < lv->nworkers; w++)
    cJSON_AddNumberToObject(ws, lv->workers[w].name[0] ? lv->workers[w].name : "(none)",
                            (double)lv->workers[w].count);
  cJSON *turns = cJSON_AddArrayToObject(k, "per_turn");
  for (size_t t = 0; t < lv->nturns; t++) {
    cJSON *to = cJSON_CreateObject();
    cJSON_AddNumberToObject(to, "turn", lv->turns[t].turn);
    cJSON_AddItemToObject(to, "ttft_ms", dist_obj(&lv->turns[t].ttft));
    cJSON_AddNumberToObject(to, "mean_prompt_tokens", lv->turns[t].mean_prompt_tokens);
    cJSON_AddNumberToObject(to, "mean_cached_tokens", lv->turns[t].mean_cached_tokens);
    cJSON_AddItemToArray(turns, to);
  }
  cJSON *slo = cJSON_AddObjectToObject(k, "slo");
  cJSON_AddNumberToObject(slo, "ttft_p99_ms", res->slo.ttft_p99_ms);
  cJSON_AddNumberToObject(slo, "tpot_p99_ms", res->slo.tpot_p99_ms);
  cJSON_AddBoolToObject(slo, "pass", lv->pass);
  char names[64];
  kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
  cJSON_AddStringToObject(slo, "failed", names);

  char *s = cJSON_PrintUnformatted(o);
  if (s == NULL)
    abort();
  kvr_buf_puts(out, s);
  kvr_buf_puts(out, "\n");
  cJSON_free(s);
  cJSON_Delete(o);
}

void kvr_report_jsonl(const kvr_run_t *run, const kvr_level_t *lv, kvr_buf_t *out) {
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    kvr_buf_puts(out, "{\"label\":");
    kvr_buf_json_str(out, run->label, strlen(run->label));
    if (lv->concurrency)
      kvr_buf_printf(out, ",\"concurrency\":%u", lv->concurrency);
    else
      kvr_buf_printf(out, ",\"rate\":%.6g", lv->rate);
    kvr_buf_printf(out,
                   ",\"conversation\":%llu,\"turn\":%u,\"warmup\":%s,\"ok\":%s,\"status\":%d,"
                   "\"target_s\":%.6f,\"sent_s\":%.6f,\"lag_ms\":%.4f,\"ttft_ms\":%.3f,"
                   "\"transport_ms\":%.3f,\"tpot_ms\":%.3f,\"e2e_ms\":%.3f,\"itl_count\":%u,"
                   "\"itl_mean_ms\":%.3f,\"itl_max_ms\":%.3f,\"output_tokens\":%u,\"chunks\":%u,"
                   "\"prompt_tokens\":%u,\"cached_tokens\":%u,\"usage\":%s,\"worker\":",
                   (unsigned long long)r->conv, r->turn, r->warmup ? "true" : "false",
                   r->ok ? "true" : "false", r->status, r->target_s, r->sent_s, r->lag_ms,
                   r->ttft_ms, r->transport_ms, r->tpot_ms, r->e2e_ms, r->n_itl, r->itl_mean_ms,
                   r->itl_max_ms, r->output_tokens, r->chunks, r->prompt_tokens, r->cached_tokens,
                   r->usage_seen ? "true" : "false");
    kvr_buf_json_str(out, r->worker, strlen(r->worker));
    kvr_buf_puts(out, ",\"error\":");
    kvr_buf_json_str(out, r->error, strlen(r->error));
    kvr_buf_puts(out, "}\n");
  }
}

void kvr_report_summary(const kvr_results_t *res, kvr_buf_t *out) {
  double base = res->nruns ? kvr_stats_run_max_load(&res->runs[0]) : 0;
  char a[32];
  kvr_buf_printf(out, "Max SLO-compliant %s (TTFT p99 < %.0f ms, TPOT p99 < %.0f ms):\n",
                 res->concurrency_mode ? "concurrency" : "rate", res->slo.ttft_p99_ms,
                 res->slo.tpot_p99_ms);
  for (size_t r = 0; r < res->nruns; r++) {
    double m = kvr_stats_run_max_load(&res->runs[r]);
    fmt_load(res, m, a, sizeof(a));
    kvr_buf_printf(out, "  %-24s %8s %s", res->runs[r].label, a, load_unit(res));
    if (r > 0 && base > 0)
      kvr_buf_printf(out, "  (%+.0f%% vs %s)", (m / base - 1) * 100, res->runs[0].label);
    else if (r > 0)
      kvr_buf_printf(out, "  (baseline passed at no load)");
    kvr_buf_puts(out, "\n");
  }
}

/* ---- HTML + SVG ------------------------------------------------------------------------------ */

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

static void html_esc(kvr_buf_t *out, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '&':
      kvr_buf_puts(out, "&amp;");
      break;
    case '<':
      kvr_buf_puts(out, "&lt;");
      break;
    case '>':
      kvr_buf_puts(out, "&gt;");
      break;
    case '"':
      kvr_buf_puts(out, "&quot;");
      break;
    default:
      kvr_buf_append(out, s, 1);
    }
  }
}

/* A "nice" axis maximum: 1, 2, 2.5 or 5 times a power of ten at or above v. */
static double nice_max(double v) {
  if (v <= 0)
    return 1;
  double p = pow(10, floor(log10(v)));
  static const double steps[] = {1, 2, 2.5, 5, 10};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(steps); i++)
    if (steps[i] * p >= v)
      return steps[i] * p;
  return 10 * p;
}

#define CW 640
#define CH 360
#define ML 70
#define MR 150
#define MT 40
#define MB 50

static void line_chart(const kvr_results_t *res, kvr_buf_t *out, const char *id, const char *title,
                       const char *ylabel, const metric_t *m, double slo) {
  size_t nloads = 0;
  double *loads = all_loads(res, &nloads);
  double xmax = 0, ymax = slo > 0 ? slo * 1.1 : 0;
  for (size_t i = 0; i < nloads; i++)
    xmax = fmax(xmax, loads[i]);
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      if (m->valid(res->runs[r].levels[i]))
        ymax = fmax(ymax, m->get(res->runs[r].levels[i]));
  xmax = nice_max(xmax);
  ymax = nice_max(ymax);
  double pw = CW - ML - MR, ph = CH - MT - MB;
#define X(v) (ML + (v) / xmax * pw)
#define Y(v) (MT + ph - (v) / ymax * ph)
  kvr_buf_printf(out,
                 "<figure><svg class=\"chart\" id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
                 "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n"
                 "<title>%s</title>\n<text x=\"%d\" y=\"22\" class=\"title\">%s</text>\n",
                 id, CW, CH, CW, CH, title, ML, title);
  /* Axes, grid and ticks. */
  for (int t = 0; t <= 5; t++) {
    double yv = ymax * t / 5, xv = xmax * t / 5;
    kvr_buf_printf(out,
                   "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                   ML, Y(yv), ML + pw, Y(yv), ML - 6, Y(yv) + 4, yv);
    kvr_buf_printf(out,
                   "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                   X(xv), MT + ph + 18, xv);
  }
  kvr_buf_printf(out,
                 "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%.1f\"/>"
                 "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                 ML, MT, ML, MT + ph, ML, MT + ph, ML + pw, MT + ph);
  kvr_buf_printf(out,
                 "<text class=\"label\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s (%s)</text>\n"
                 "<text class=\"label\" transform=\"translate(16 %.1f) rotate(-90)\" "
                 "text-anchor=\"middle\">%s</text>\n",
                 ML + pw / 2, CH - 10, res->concurrency_mode ? "users" : "target rate",
                 load_unit(res), MT + ph / 2, ylabel);
  if (slo > 0)
    kvr_buf_printf(
        out,
        "<line class=\"slo\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"#d00\" stroke-dasharray=\"6 4\"/>"
        "<text class=\"slo-label\" x=\"%.1f\" y=\"%.1f\" fill=\"#d00\">SLO %g ms</text>\n",
        ML, Y(slo), ML + pw, Y(slo), ML + pw - 80, Y(slo) - 5, slo);
  /* One polyline per run. */
  for (size_t r = 0; r < res->nruns; r++) {
    const char *color = palette[r % KVR_ARRAY_SIZE(palette)];
    kvr_buf_printf(out, "<g class=\"series\" data-label=\"");
    html_esc(out, res->runs[r].label);
    kvr_buf_printf(out, "\"><polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                   color);
    for (size_t i = 0; i < nloads; i++) {
      const kvr_level_t *lv = find_load(&res->runs[r], loads[i]);
      if (lv && m->valid(lv))
        kvr_buf_printf(out, "%.1f,%.1f ", X(loads[i]), Y(fmin(m->get(lv), ymax)));
    }
    kvr_buf_puts(out, "\"/>");
    for (size_t i = 0; i < nloads; i++) {
      const kvr_level_t *lv = find_load(&res->runs[r], loads[i]);
      if (lv && m->valid(lv))
        kvr_buf_printf(out,
                       "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%g: %.1f</title>"
                       "</circle>",
                       X(loads[i]), Y(fmin(m->get(lv), ymax)), color, loads[i], m->get(lv));
    }
    kvr_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text class=\"legend\" x=\"%.1f\" y=\"%.1f\">",
                   ML + pw + 16, MT + 20.0 * (double)r, color, ML + pw + 34,
                   MT + 20.0 * (double)r + 10);
    html_esc(out, res->runs[r].label);
    kvr_buf_puts(out, "</text></g>\n");
  }
  kvr_buf_puts(out, "</svg></figure>\n");
#undef X
#undef Y
  free(loads);
}

static void share_chart(const kvr_results_t *res, kvr_buf_t *out) {
  double dl;
  bool passed;
  if (!detail_load(res, &dl, &passed))
    return;
  char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX];
  size_t nnames = worker_names(res, dl, names);
  char a[32];
  fmt_load(res, dl, a, sizeof(a));
  double pw = CW - ML - MR, ph = CH - MT - MB;
  kvr_buf_printf(
      out,
      "<figure><svg class=\"chart\" id=\"worker-share\" "
      "xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d "
      "%d\" role=\"img\">\n<title>Share of requests per worker at %s %s</title>\n"
      "<text x=\"%d\" y=\"22\" class=\"title\">Share of requests per worker at %s %s</text>\n",
      CW, CH, CW, CH, a, load_unit(res), ML, a, load_unit(res));
  for (int t = 0; t <= 4; t++) {
    double y = MT + ph - ph * t / 4.0;
    kvr_buf_printf(out,
                   "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                   ML, y, ML + pw, y, ML - 6, y + 4, t * 25);
  }
  size_t groups = res->nruns ? res->nruns : 1;
  double gw = pw / (double)groups;
  double bw = nnames ? (gw * 0.8) / (double)nnames : 0;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_level_t *lv = find_load(&res->runs[r], dl);
    double gx = ML + gw * (double)r + gw * 0.1;
    for (size_t k = 0; lv && lv->measured && k < nnames; k++) {
      size_t c = 0;
      for (size_t w = 0; w < lv->nworkers; w++)
        if (strcmp(lv->workers[w].name, names[k]) == 0)
          c = lv->workers[w].count;
      double share = (double)c / (double)lv->measured;
      kvr_buf_printf(out,
                     "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                     "fill=\"%s\"><title>",
                     gx + bw * (double)k, MT + ph - share * ph, bw * 0.9, share * ph,
                     palette[k % KVR_ARRAY_SIZE(palette)]);
      html_esc(out, names[k][0] ? names[k] : "(no header)");
      kvr_buf_printf(out, ": %.1f%%</title></rect>\n", share * 100);
    }
    kvr_buf_printf(out, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                   ML + gw * (double)r + gw / 2, MT + ph + 18);
    html_esc(out, res->runs[r].label);
    kvr_buf_puts(out, "</text>\n");
  }
  for (size_t k = 0; k < nnames; k++) {
    kvr_buf_printf(out,
                   "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text class=\"legend\" x=\"%.1f\" y=\"%.1f\">",
                   ML + pw + 16, MT + 20.0 * (double)k, palette[k % KVR_ARRAY_SIZE(palette)],
                   ML + pw + 34, MT + 20.0 * (double)k + 10);
    html_esc(out, names[k][0] ? names[k] : "(no header)");
    kvr_buf_puts(out, "</text>\n");
  }
  kvr_buf_printf(out, "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ML,
                 MT + ph, ML + pw, MT + ph);
  kvr_buf_puts(out, "</svg></figure>\n");
}

/* Renders the Markdown's pipe tables as HTML tables, headings as <h2>, paragraphs as <p>. */
static void md_to_html(const char *md, kvr_buf_t *out) {
  const char *p = md;
  bool in_table = false;
  int row = 0;
  while (*p) {
    const char *eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char *line = strndup(p, len);
    if (line == NULL)
      abort();
    if (line[0] == '|') {
      if (!in_table) {
        kvr_buf_puts(out, "<table>\n");
        in_table = true;
        row = 0;
      }
      if (row != 1) { /* row 1 is the alignment row */
        kvr_buf_puts(out, "<tr>");
        char *save = NULL;
        for (char *c = strtok_r(line + 1, "|", &save); c; c = strtok_r(NULL, "|", &save)) {
          while (*c == ' ')
            c++;
          size_t cl = strlen(c);
          while (cl && c[cl - 1] == ' ')
            c[--cl] = '\0';
          kvr_buf_puts(out, row == 0 ? "<th>" : "<td>");
          html_esc(out, c);
          kvr_buf_puts(out, row == 0 ? "</th>" : "</td>");
        }
        kvr_buf_puts(out, "</tr>\n");
      }
      row++;
    } else {
      if (in_table) {
        kvr_buf_puts(out, "</table>\n");
        in_table = false;
      }
      if (strncmp(line, "## ", 3) == 0) {
        kvr_buf_puts(out, "<h2>");
        html_esc(out, line + 3);
        kvr_buf_puts(out, "</h2>\n");
      } else if (strncmp(line, "# ", 2) == 0) {
        /* The page has its own <h1>. */
      } else if (line[0] != '\0') {
        kvr_buf_puts(out, "<p>");
        html_esc(out, line);
        kvr_buf_puts(out, "</p>\n");
      }
    }
    free(line);
    p += len;
    if (*p == '\n')
      p++;
  }
  if (in_table)
    kvr_buf_puts(out, "</table>\n");
}

void kvr_report_html(const kvr_results_t *res, kvr_buf_t *out) {
  const char *title = res->title ? res->title : "kvrouter Benchmark Report";
  kvr_buf_puts(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
  html_esc(out, title);
  kvr_buf_puts(out,
               "</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;"
               "color:#222}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid "
               "#ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}figure{display:inline-"
               "block;margin:0.5em}svg .grid{stroke:#eee}svg .axis{stroke:#444}svg text{font-size:"
               "12px}svg .title{font-size:14px;font-weight:bold}</style></head><body>\n<h1>");
  html_esc(out, title);
  kvr_buf_puts(out, "</h1>\n<p>Generated ");
  html_esc(out, res->generated ? res->generated : "");
  kvr_buf_puts(out, "</p>\n<h2>Charts</h2>\n");
  line_chart(res, out, "ttft-p99", "TTFT p99 vs load", "TTFT p99 (ms)", &per_load_metrics[0],
             res->slo.ttft_p99_ms);
  line_chart(res, out, "tpot-p99", "TPOT p99 vs load", "TPOT p99 (ms)", &per_load_metrics[1],
             res->slo.tpot_p99_ms);
  line_chart(res, out, "throughput", "Output throughput vs load", "output tok/s",
             &per_load_metrics[2], -1);
  share_chart(res, out);
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  md_to_html(md.data ? md.data : "", out);
  kvr_buf_free(&md);
  kvr_buf_puts(out, "</body></html>\n");
}

/* ---- files ----------------------------------------------------------------------------------- */

static int mkdir_p(const char *dir, char *err, size_t errlen) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s", dir);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
      return KVR_EIO;
    }
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
    return KVR_EIO;
  }
  return 0;
}

static int write_file(const char *path, const kvr_buf_t *b, char *err, size_t errlen) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return KVR_EIO;
  }
  size_t w = b->len ? fwrite(b->data, 1, b->len, f) : 0;
  int rc = fclose(f);
  if (w != b->len || rc != 0) {
    snprintf(err, errlen, "%s: write failed", path);
    return KVR_EIO;
  }
  return 0;
}

/* A label made safe for a file name. */
static void safe_name(const char *s, char *out, size_t size) {
  size_t i = 0;
  for (; *s && i + 1 < size; s++)
    out[i++] = (char)((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                              (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'
                          ? *s
                          : '_');
  out[i] = '\0';
}

int kvr_report_write(const kvr_results_t *res, const char *dir, char *err, size_t errlen) {
  char path[4096];
  int rc = mkdir_p(dir, err, errlen);
  if (rc != 0)
    return rc;
  snprintf(path, sizeof(path), "%s/results", dir);
  if ((rc = mkdir_p(path, err, errlen)) != 0)
    return rc;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_markdown(res, &b);
  snprintf(path, sizeof(path), "%s/report.md", dir);
  rc = write_file(path, &b, err, errlen);
  kvr_buf_reset(&b);
  if (rc == 0) {
    kvr_report_html(res, &b);
    snprintf(path, sizeof(path), "%s/report.html", dir);
    rc = write_file(path, &b, err, errlen);
    kvr_buf_reset(&b);
  }
  for (size_t r = 0; rc == 0 && r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      kvr_report_jsonl(&res->runs[r], res->runs[r].levels[i], &b);
  if (rc == 0) {
    snprintf(path, sizeof(path), "%s/requests.jsonl", dir);
    rc = write_file(path, &b, err, errlen);
  }
  for (size_t r = 0; rc == 0 && r < res->nruns; r++) {
    for (size_t i = 0; rc == 0 && i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      char label[128], load[32];
      safe_name(res->runs[r].label, label, sizeof(label));
      fmt_load(res, load_of(lv), load, sizeof(load));
      kvr_buf_reset(&b);
      kvr_report_level_json(res, &res->runs[r], lv, &b);
      snprintf(path, sizeof(path), "%s/results/%s_%s%s.json", dir, label,
               lv->concurrency ? "c" : "rate", load);
      rc = write_file(path, &b, err, errlen);
    }
  }
  kvr_buf_free(&b);
  return rc;
}

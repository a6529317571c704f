/* report_sections.c -- what the report says: its sections, written once as format-neutral blocks
 * (report_int.h) that report_md.c and report_html.c render, and the plain-text summary.
 *
 * Sections, in order (the team's report form, shared/seeds/002_*.txt): head (title, generation
 * time); configuration (labels, policies, prefix-cache resets); SLO targets; one table per metric
 * by load and label; the SLO compliance matrix; winner identification; the detailed comparison at
 * the baseline's max SLO-compliant load, with per-turn TTFT and worker share there; key
 * observations computed from the data; workload parameters.
 *
 * Structs: none of its own; tables take their rows from the metric tables of report.c.
 *
 * Invariants: tables have one row per load any run measured and an em dash where a run has no
 * level there; each text opens and closes its own inline marks.
 */
#include "report_int.h"

#include "src/kvr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B KVR__STRONG
#define C KVR__CODE
#define DASH KVR__DASH

/* Opens a table whose columns are first then one per run; the rule goes into rule (the caller
 * frees it after kvr__doc_table_end()). */
static void run_table(const kvr_results_t *res, kvr__doc_t *d, const char *first, bool right,
                      kvr_buf_t *rule) {
  kvr_buf_reset(rule);
  kvr_buf_puts(rule, right ? "|-----:|" : "|--------|");
  for (size_t r = 0; r < res->nruns; r++)
    kvr_buf_puts(rule, right ? "--------:|" : "--------|");
  kvr__doc_table(d, rule->data);
  kvr__doc_cell(d, "%s", first);
  for (size_t r = 0; r < res->nruns; r++)
    kvr__doc_cell(d, "%s", res->runs[r].label);
  kvr__doc_row_end(d);
}

/* One figure of a level: an em dash without a level, "n/a" (or "stopped early") without data. */
static void metric_cell(kvr__doc_t *d, const kvr__metric_t *m, const kvr_level_t *lv) {
  if (lv == NULL) {
    kvr__doc_cell(d, DASH);
  } else if (!m->valid(lv)) {
    kvr__doc_cell(d, "%s", lv->stopped_early ? "stopped early" : "n/a");
  } else {
    char tmp[64];
    snprintf(tmp, sizeof(tmp), m->fmt, m->get(lv));
    kvr__doc_cell(d, "%s", tmp);
  }
}

static void metric_table(const kvr_results_t *res, const kvr__metric_t *m, const double *loads,
                         size_t nloads, kvr__doc_t *d) {
  kvr_buf_t rule = KVR_BUF_INIT;
  kvr__doc_h(d, 2, "Results " DASH " %s", m->title);
  run_table(res, d, kvr__load_header(res), true, &rule);
  for (size_t i = 0; i < nloads; i++) {
    char l[32];
    kvr__fmt_load(res, loads[i], l, sizeof(l));
    kvr__doc_cell(d, "%s", l);
    for (size_t r = 0; r < res->nruns; r++)
      metric_cell(d, m, kvr__find_load(&res->runs[r], loads[i]));
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  kvr_buf_free(&rule);
}

/* ---- head, configuration, SLOs --------------------------------------------------------------- */

void kvr__report_head(const kvr_results_t *res, kvr__doc_t *d) {
  kvr__doc_h(d, 1, "%s", res->title ? res->title : "kvrouter Benchmark Report");
  kvr__doc_p(d, B "Generated:" B " %s", res->generated ? res->generated : "");
}

static void config_reset_sentence(const kvr_results_t *res, kvr__doc_t *d) {
  if (res->cache_reset != NULL)
    kvr__doc_p(d, "Prefix caches were reset %s, so every run starts cold.", res->cache_reset);
  else if (res->nruns > 1)
    kvr__doc_p(d, "Prefix caches were " B "not" B " reset between runs: later runs may find the "
                  "earlier runs' identical prompts still cached.");
}

static void section_config(const kvr_results_t *res, kvr__doc_t *d) {
  bool reset = res->cache_reset != NULL;
  kvr__doc_h(d, 2, "Configuration");
  kvr__doc_table(d, reset ? "|:-:|-------|--------|-------------|--------------------|"
                          : "|:-:|-------|--------|-------------|");
  kvr__doc_cell(d, "#");
  kvr__doc_cell(d, "Label");
  kvr__doc_cell(d, "Policy");
  kvr__doc_cell(d, "Description");
  if (reset)
    kvr__doc_cell(d, "Prefix Cache Reset");
  kvr__doc_row_end(d);
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_run_t *run = &res->runs[r];
    kvr__doc_cell(d, "%zu", r);
    kvr__doc_cell(d, "%s%s", run->label, r == 0 ? " (baseline)" : "");
    kvr__doc_cell(d, "%s", run->policy[0] ? run->policy : DASH);
    kvr__doc_cell(d, "%s", run->description[0] ? run->description : DASH);
    if (reset)
      kvr__doc_cell(d, "%s", run->cache_reset[0] ? run->cache_reset : DASH);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  config_reset_sentence(res, d);
}

static void section_slo(const kvr_results_t *res, kvr__doc_t *d) {
  kvr__doc_h(d, 2, "SLO Targets");
  kvr__doc_table(d, "|--------|--------|");
  kvr__doc_cell(d, "Metric");
  kvr__doc_cell(d, "Target");
  kvr__doc_row_end(d);
  kvr__doc_cell(d, "TTFT p99");
  kvr__doc_cell(d, "< %.0fms", res->slo.ttft_p99_ms);
  kvr__doc_row_end(d);
  kvr__doc_cell(d, "TPOT p99");
  kvr__doc_cell(d, "< %.0fms", res->slo.tpot_p99_ms);
  kvr__doc_row_end(d);
  kvr__doc_cell(d, "Failed requests");
  if (res->slo.max_failed_frac > 0)
    kvr__doc_cell(d, "<= %.1f%%", res->slo.max_failed_frac * 100);
  else
    kvr__doc_cell(d, "0");
  kvr__doc_row_end(d);
  kvr__doc_table_end(d);
}

static void section_metrics(const kvr_results_t *res, const double *loads, size_t nloads,
                            kvr__doc_t *d) {
  for (size_t m = 0; m < kvr__n_per_load_metrics; m++)
    metric_table(res, &kvr__per_load_metrics[m], loads, nloads, d);
  if (!res->concurrency_mode)
    metric_table(res, &kvr__achieved_metric, loads, nloads, d);
  bool engine = false;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      engine |= kvr__has_engine(res->runs[r].levels[i]);
  if (engine)
    for (size_t m = 0; m < kvr__n_engine_metrics; m++)
      metric_table(res, &kvr__engine_metrics[m], loads, nloads, d);
}

/* ---- SLO compliance matrix ------------------------------------------------------------------- */

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

static void section_matrix(const kvr_results_t *res, const double *loads, size_t nloads,
                           kvr__doc_t *d) {
  kvr_buf_t rule = KVR_BUF_INIT;
  kvr__doc_h(d, 2, "SLO Compliance Matrix");
  kvr__doc_p(d, "PASS = TTFT p99 < %.0fms AND TPOT p99 < %.0fms AND failed requests %s",
             res->slo.ttft_p99_ms, res->slo.tpot_p99_ms,
             res->slo.max_failed_frac > 0 ? "within the allowance" : "= 0");
  run_table(res, d, kvr__load_header(res), false, &rule);
  bool stopped = false;
  for (size_t i = 0; i < nloads; i++) {
    char a[32], v[96];
    kvr__fmt_load(res, loads[i], a, sizeof(a));
    kvr__doc_cell(d, "%s", a);
    for (size_t r = 0; r < res->nruns; r++) {
      const kvr_level_t *lv = kvr__find_load(&res->runs[r], loads[i]);
      if (lv)
        verdict(lv, v, sizeof(v));
      else
        snprintf(v, sizeof(v), DASH);
      stopped |= lv && lv->stopped_early;
      kvr__doc_cell(d, "%s", v);
    }
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  kvr_buf_free(&rule);
  if (stopped)
    kvr__doc_p(d,
               "\"Stopped early\": the search ended the level once so many measured requests "
               "had a TTFT of %.0f ms or more that its TTFT p99 could no longer pass; its "
               "figures in the tables above cover the requests that had finished by then.",
               res->slo.ttft_p99_ms);
}

/* ---- winner identification ------------------------------------------------------------------- */

static void winner_sentence(const kvr_results_t *res, double base, double best, kvr__doc_t *d) {
  if (!(best > base)) {
    kvr__doc_p(d, B "No configuration improved over baseline." B);
    return;
  }
  char a[32], b[32];
  kvr__doc_printf(d, B);
  bool first = true;
  for (size_t r = 1; r < res->nruns; r++)
    if (kvr_stats_run_max_load(&res->runs[r]) == best) {
      kvr__doc_printf(d, "%s%s", first ? "" : ", ", res->runs[r].label);
      first = false;
    }
  kvr__fmt_load(res, base, a, sizeof(a));
  kvr__fmt_load(res, best, b, sizeof(b));
  if (base > 0)
    kvr__doc_printf(d, " improved max SLO-compliant load over baseline: %s -> %s %s (%+.0f%%).", a,
                    b, kvr__load_unit(res), (best / base - 1) * 100);
  else
    kvr__doc_printf(d, " passed up to %s %s; the baseline passed at no measured load.", b,
                    kvr__load_unit(res));
  kvr__doc_printf(d, B);
  kvr__doc_p_end(d);
}

static void section_winner(const kvr_results_t *res, kvr__doc_t *d) {
  double base = res->nruns ? kvr_stats_run_max_load(&res->runs[0]) : 0;
  double best = 0;
  for (size_t r = 1; r < res->nruns; r++)
    best = fmax(best, kvr_stats_run_max_load(&res->runs[r]));
  kvr__doc_h(d, 2, "Winner Identification");
  kvr__doc_table(d, "|-------|:----------------------:|:--------------------:|");
  kvr__doc_cell(d, "Label");
  kvr__doc_cell(d, "Max SLO-Compliant %s", kvr__load_header(res));
  kvr__doc_cell(d, "Capacity vs Baseline");
  kvr__doc_row_end(d);
  for (size_t r = 0; r < res->nruns; r++) {
    double m = kvr_stats_run_max_load(&res->runs[r]);
    char cap[32], a[32];
    if (r == 0)
      snprintf(cap, sizeof(cap), DASH);
    else
      kvr__fmt_pct_change(base, m, cap, sizeof(cap));
    kvr__fmt_load(res, m, a, sizeof(a));
    bool winner = r > 0 && best > base && m == best; /* a tie with the baseline wins nothing */
    kvr__doc_cell(d, "%s%s", res->runs[r].label, winner ? " " B "WINNER" B : "");
    kvr__doc_cell(d, "%s", a);
    kvr__doc_cell(d, "%s", cap);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  if (res->nruns > 1)
    winner_sentence(res, base, best, d);
}

/* ---- detailed comparison, per-turn TTFT, worker share ---------------------------------------- */

static void detail_table(const kvr_results_t *res, double dl, kvr__doc_t *d) {
  kvr_buf_t rule = KVR_BUF_INIT;
  run_table(res, d, "Metric", false, &rule);
  bool engine_at = false;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_level_t *lv = kvr__find_load(&res->runs[r], dl);
    engine_at |= lv && kvr__has_engine(lv);
  }
  for (size_t m = 0; m < kvr__n_detail_metrics; m++) {
    const kvr__metric_t *mt = &kvr__detail_metrics[m];
    if (mt->valid == kvr__has_engine && !engine_at)
      continue; /* no worker /metrics were read (e.g. a router without --admin) */
    kvr__doc_cell(d, "%s", mt->title);
    for (size_t r = 0; r < res->nruns; r++)
      metric_cell(d, mt, kvr__find_load(&res->runs[r], dl));
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  kvr_buf_free(&rule);
}

static void turn_cell(kvr__doc_t *d, const kvr_level_t *lv, size_t t) {
  if (lv == NULL || t >= lv->nturns || lv->turns[t].ttft.n == 0) {
    kvr__doc_cell(d, DASH);
    return;
  }
  const kvr_turn_stats_t *ts = &lv->turns[t];
  char cached[32] = "";
  if (ts->mean_prompt_tokens > 0)
    snprintf(cached, sizeof(cached), ", %.0f%% cached",
             100.0 * ts->mean_cached_tokens / ts->mean_prompt_tokens);
  kvr__doc_cell(d, "%.0f / %.0f, %.0f tok%s", ts->ttft.p50, ts->ttft.p99, ts->mean_prompt_tokens,
                cached);
}

static void turn_table(const kvr_results_t *res, double dl, const char *a, kvr__doc_t *d) {
  size_t maxturn = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_level_t *lv = kvr__find_load(&res->runs[r], dl);
    if (lv)
      maxturn = KVR_MAX(maxturn, lv->nturns);
  }
  if (maxturn == 0)
    return;
  kvr_buf_t rule = KVR_BUF_INIT;
  kvr__doc_h(d, 2, "Per-Turn TTFT at %s %s", a, kvr__load_unit(res));
  kvr__doc_p(d, "TTFT p50 / p99 (ms), mean prompt tokens, share of them cached.");
  run_table(res, d, "Turn", false, &rule);
  for (size_t t = 0; t < maxturn; t++) {
    kvr__doc_cell(d, "%zu", t + 1);
    for (size_t r = 0; r < res->nruns; r++)
      turn_cell(d, kvr__find_load(&res->runs[r], dl), t);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  kvr_buf_free(&rule);
}

static void share_table(const kvr_results_t *res, double dl, const char *a, kvr__doc_t *d) {
  char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX];
  size_t nnames = kvr__worker_names(res, dl, names);
  if (nnames == 0)
    return;
  kvr_buf_t rule = KVR_BUF_INIT;
  kvr__doc_h(d, 2, "Worker Share at %s %s", a, kvr__load_unit(res));
  kvr__doc_p(d, "Requests per worker (x-kvrouter-worker).");
  run_table(res, d, "Worker", false, &rule);
  for (size_t k = 0; k < nnames; k++) {
    kvr__doc_cell(d, "%s", names[k][0] ? names[k] : "(no header)");
    for (size_t r = 0; r < res->nruns; r++) {
      const kvr_level_t *lv = kvr__find_load(&res->runs[r], dl);
      size_t c = kvr__worker_count(lv, names[k]);
      if (lv == NULL || lv->measured == 0)
        kvr__doc_cell(d, DASH);
      else
        kvr__doc_cell(d, "%zu (%.0f%%)", c, 100.0 * (double)c / (double)lv->measured);
    }
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  kvr_buf_free(&rule);
}

static void section_detail(const kvr_results_t *res, kvr__doc_t *d) {
  double dl;
  bool passed;
  if (!kvr__detail_load(res, &dl, &passed))
    return;
  char a[32];
  kvr__fmt_load(res, dl, a, sizeof(a));
  if (passed)
    kvr__doc_h(d, 2, "Detailed Comparison at Baseline Max %s (%s %s)", kvr__load_header(res), a,
               kvr__load_unit(res));
  else
    kvr__doc_h(d, 2, "Detailed Comparison at Baseline's Lowest %s (%s %s; no load passed)",
               kvr__load_header(res), a, kvr__load_unit(res));
  detail_table(res, dl, d);
  turn_table(res, dl, a, d);
  share_table(res, dl, a, d);
}

/* ---- key observations ------------------------------------------------------------------------ */

/* The first failing level of a run (lowest load, not interrupted) and its failing SLOs; false
 * when nothing failed. */
static bool first_failure(const kvr_run_t *run, double *load, unsigned *mask) {
  const kvr_level_t *best = NULL;
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    if (!lv->pass && !lv->interrupted && (best == NULL || kvr__load_of(lv) < kvr__load_of(best)))
      best = lv;
  }
  if (best == NULL)
    return false;
  *load = kvr__load_of(best);
  *mask = best->fail_mask;
  return true;
}

static void obs_capacity(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  if (res->nruns < 2)
    return;
  double base = kvr_stats_run_max_load(&res->runs[0]);
  const char *unit = kvr__load_unit(res);
  size_t best = 1;
  for (size_t r = 2; r < res->nruns; r++)
    if (kvr_stats_run_max_load(&res->runs[r]) > kvr_stats_run_max_load(&res->runs[best]))
      best = r;
  double bm = kvr_stats_run_max_load(&res->runs[best]);
  char a[32], b[32];
  kvr__fmt_load(res, base, a, sizeof(a));
  kvr__fmt_load(res, bm, b, sizeof(b));
  if (bm > base && base > 0)
    kvr__doc_p(d,
               "%d. " B C "%s" C " raises the max SLO-compliant load from %s to %s %s (%+.0f%%) "
               "over " C "%s" C "." B " On this workload it serves %.0f%% more traffic within the "
               "SLOs.",
               (*n)++, res->runs[best].label, a, b, unit, (bm / base - 1) * 100, res->runs[0].label,
               (bm / base - 1) * 100);
  else if (bm > base)
    kvr__doc_p(d,
               "%d. " B C "%s" C " passes the SLOs up to %s %s where " C "%s" C " passes at no "
               "measured load." B,
               (*n)++, res->runs[best].label, b, unit, res->runs[0].label);
  else
    kvr__doc_p(d,
               "%d. " B "No configuration raised the max SLO-compliant load above " C "%s" C
               "'s %s %s." B,
               (*n)++, res->runs[0].label, a, unit);
}

static void obs_binding(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  for (size_t r = 0; r < res->nruns; r++) {
    double fl;
    unsigned mask;
    char names[64], a[32];
    if (first_failure(&res->runs[r], &fl, &mask)) {
      kvr_stats_fail_names(mask, names, sizeof(names));
      kvr__fmt_load(res, fl, a, sizeof(a));
      kvr__doc_p(d,
                 "%d. " B "%s binds first for " C "%s" C "." B
                 " Its first failing load is %s %s (FAIL (%s)).",
                 (*n)++, names, res->runs[r].label, a, kvr__load_unit(res), names);
    } else if (res->runs[r].nlevels > 0) {
      kvr__doc_p(d,
                 "%d. " B C "%s" C " passed every measured load." B
                 " Its limit lies above the highest load measured.",
                 (*n)++, res->runs[r].label);
    }
  }
}

static void obs_latency(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  double dl;
  bool passed;
  if (res->nruns < 2 || !kvr__detail_load(res, &dl, &passed))
    return;
  const kvr_level_t *b0 = kvr__find_load(&res->runs[0], dl);
  char a[32];
  kvr__fmt_load(res, dl, a, sizeof(a));
  for (size_t r = 1; r < res->nruns && b0 && kvr__has_data(b0); r++) {
    const kvr_level_t *lv = kvr__find_load(&res->runs[r], dl);
    if (lv == NULL || !kvr__has_data(lv))
      continue;
    char t1[16], t2[16];
    kvr__fmt_pct_change(b0->ttft.p99, lv->ttft.p99, t1, sizeof(t1));
    kvr__fmt_pct_change(b0->tpot.p99, lv->tpot.p99, t2, sizeof(t2));
    kvr__doc_p(d,
               "%d. " B "At %s %s, " C "%s" C " changes TTFT p99 by %s (%.0f -> %.0f ms) and "
               "TPOT p99 by %s (%.1f -> %.1f ms) against " C "%s" C "." B,
               (*n)++, a, kvr__load_unit(res), res->runs[r].label, t1, b0->ttft.p99, lv->ttft.p99,
               t2, b0->tpot.p99, lv->tpot.p99, res->runs[0].label);
  }
}

static void obs_cache(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  bool any_usage = false;
  for (size_t r = 0; r < res->nruns; r++) {
    uint64_t in = 0, cached = 0;
    size_t usage = 0;
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      in += res->runs[r].levels[i]->total_input;
      cached += res->runs[r].levels[i]->total_cached;
      usage += res->runs[r].levels[i]->usage_requests;
    }
    if (usage == 0 || in == 0)
      continue;
    any_usage = true;
    kvr__doc_p(d,
               "%d. " B C "%s" C ": %.1f%% of prompt tokens were served from the KV cache" B
               " (%llu of %llu over all levels, from usage.prompt_tokens_details.cached_tokens).",
               (*n)++, res->runs[r].label, 100.0 * (double)cached / (double)in,
               (unsigned long long)cached, (unsigned long long)in);
  }
  if (!any_usage)
    kvr__doc_p(d, "%d. " B "The server reported no usage" B ", so cached tokens are not known.",
               (*n)++);
}

static void obs_balance_run(const kvr_results_t *res, const kvr_run_t *run, double dl, int *n,
                            kvr__doc_t *d) {
  const kvr_level_t *lv = kvr__find_load(run, dl);
  if (lv == NULL || lv->measured == 0)
    return;
  size_t named = 0, mx = 0, mn = SIZE_MAX, total = 0;
  for (size_t w = 0; w < lv->nworkers; w++) {
    if (lv->workers[w].name[0] == '\0')
      continue;
    named++;
    total += lv->workers[w].count;
    mx = KVR_MAX(mx, lv->workers[w].count);
    mn = KVR_MIN(mn, lv->workers[w].count);
  }
  char a[32];
  kvr__fmt_load(res, dl, a, sizeof(a));
  if (named == 0)
    kvr__doc_p(d,
               "%d. " B C "%s" C " responses carried no x-kvrouter-worker header" B
               " (not behind kvrouter), so placement is unknown.",
               (*n)++, run->label);
  else
    kvr__doc_p(d,
               "%d. " B C "%s" C " spread requests over %zu workers at %s %s" B
               ": the busiest took %.0f%%, the least busy %.0f%% (even would be %.0f%%).",
               (*n)++, run->label, named, a, kvr__load_unit(res),
               100.0 * (double)mx / (double)total, 100.0 * (double)mn / (double)total,
               100.0 / (double)named);
}

static void obs_balance(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  double dl;
  bool passed;
  if (!kvr__detail_load(res, &dl, &passed))
    return;
  for (size_t r = 0; r < res->nruns; r++)
    obs_balance_run(res, &res->runs[r], dl, n, d);
}

static void obs_schedule(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  double worst_lag = 0, worst_ratio = INFINITY;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      worst_lag = fmax(worst_lag, lv->lag.p99);
      /* A level cut short measured too few sends for a meaningful rate. */
      if (!res->concurrency_mode && lv->rate > 0 && lv->achieved_rate > 0 && !lv->stopped_early &&
          !lv->interrupted)
        worst_ratio = fmin(worst_ratio, lv->achieved_rate / lv->rate);
    }
  if (!res->concurrency_mode && isfinite(worst_ratio))
    kvr__doc_p(d,
               "%d. " B "The load generator kept to its schedule:" B
               " worst send lag p99 %.2f ms (real time); achieved rate was at least %.0f%% of "
               "target at every level run to its end.",
               (*n)++, worst_lag, 100.0 * worst_ratio);
}

static void obs_failed(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  size_t failed = 0;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      failed += res->runs[r].levels[i]->failed;
  if (failed > 0)
    kvr__doc_p(d, "%d. " B "%zu requests failed" B " across all levels; see requests.jsonl.",
               (*n)++, failed);
}

static void section_observations(const kvr_results_t *res, kvr__doc_t *d) {
  if (res->nruns == 0)
    return;
  int n = 1;
  kvr__doc_h(d, 2, "Key Observations");
  obs_capacity(res, &n, d);
  obs_binding(res, &n, d);
  obs_latency(res, &n, d);
  obs_cache(res, &n, d);
  obs_balance(res, &n, d);
  obs_schedule(res, &n, d);
  obs_failed(res, &n, d);
}

/* ---- workload parameters --------------------------------------------------------------------- */

static void param(kvr__doc_t *d, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void param(kvr__doc_t *d, const char *name, const char *fmt, ...) {
  kvr_buf_t v = KVR_BUF_INIT;
  va_list ap;
  va_start(ap, fmt);
  kvr_buf_vprintf(&v, fmt, ap);
  va_end(ap);
  kvr__doc_cell(d, "%s", name);
  kvr__doc_cell(d, "%s", v.data ? v.data : "");
  kvr__doc_row_end(d);
  kvr_buf_free(&v);
}

static const char *rate_meaning(const kvr_results_t *res) {
  if (res->sessions)
    return "conversation starts per second; later turns follow their predecessor after think "
           "time";
  return "requests per second of turn arrivals (one arrival = one request): each arrival sends "
         "the next eligible turn of an open conversation (eligible = previous turn done + think "
         "time), else starts a new conversation; comparable with " C
         "vllm bench serve --request-rate" C;
}

static void param_loads(const kvr_results_t *res, const double *loads, size_t nloads,
                        kvr__doc_t *d) {
  kvr_buf_t v = KVR_BUF_INIT;
  for (size_t i = 0; i < nloads; i++) {
    char a[32];
    kvr__fmt_load(res, loads[i], a, sizeof(a));
    kvr_buf_printf(&v, "%s%s", i ? ", " : "", a);
  }
  kvr__doc_cell(d, "%s", res->concurrency_mode ? "Concurrency Levels" : "Request Rates");
  kvr__doc_cell(d, "%s %s", v.data ? v.data : "", kvr__load_unit(res));
  kvr__doc_row_end(d);
  kvr_buf_free(&v);
}

static void section_workload(const kvr_results_t *res, const double *loads, size_t nloads,
                             kvr__doc_t *d) {
  kvr__doc_h(d, 2, "Workload Parameters");
  kvr__doc_table(d, "|-----------|-------|");
  param(d, "Parameter", "Value");
  param(d, "Tool", C "kvrouter bench" C " (open-loop, libuv + libcurl)");
  param(d, "Endpoint", "%s (%s API)", res->url ? res->url : "", res->api ? res->api : "chat");
  param(d, "Model", "%s", res->model ? res->model : "");
  param(d, "Dataset", "%s",
        res->workload_desc ? res->workload_desc : (res->workload ? res->workload : ""));
  param(d, res->concurrency_mode ? "Prompts per Level" : "Prompts per Rate", "%zu",
        res->num_prompts);
  param_loads(res, loads, nloads, d);
  if (res->concurrency_mode)
    param(d, "Load",
          "N closed-loop users, each running its conversations turn after turn with think time");
  else
    param(d, "Rate Meaning", "%s", rate_meaning(res));
  if (!res->concurrency_mode)
    param(d, "Arrival Distribution", "%s (burstiness=%.1f)",
          res->burstiness == 1.0 ? "Poisson" : "Gamma", res->burstiness);
  param(d, "Warm-up", "first %u requests of each level, excluded from metrics", res->warmup);
  param(d, "Cooldown Between Levels", "%.0fs", res->cooldown_s);
  param(d, "Prefix Cache Reset", "%s", res->cache_reset ? res->cache_reset : "none");
  param(d, "Time Scale",
        "%g (durations are reported in simulated time: the simulator's engine time x scale, the "
        "rest of TTFT and E2E (client, router, loopback) at 1x; send lag in real time)",
        res->time_scale);
  param(d, "Seed", "%llu", (unsigned long long)res->seed);
  if (res->command)
    param(d, "Command", C "%s" C, res->command);
  kvr__doc_table_end(d);
}

void kvr__report_body(const kvr_results_t *res, kvr__doc_t *d) {
  size_t nloads = 0;
  double *loads = kvr__all_loads(res, &nloads);
  section_config(res, d);
  section_slo(res, d);
  section_metrics(res, loads, nloads, d);
  section_matrix(res, loads, nloads, d);
  section_winner(res, d);
  section_detail(res, d);
  section_observations(res, d);
  section_workload(res, loads, nloads, d);
  free(loads);
}

/* ---- the plain-text summary ------------------------------------------------------------------ */

void kvr_report_summary(const kvr_results_t *res, kvr_buf_t *out) {
  double base = res->nruns ? kvr_stats_run_max_load(&res->runs[0]) : 0;
  char a[32];
  kvr_buf_printf(out, "Max SLO-compliant %s (TTFT p99 < %.0f ms, TPOT p99 < %.0f ms):\n",
                 res->concurrency_mode ? "concurrency" : "rate", res->slo.ttft_p99_ms,
                 res->slo.tpot_p99_ms);
  for (size_t r = 0; r < res->nruns; r++) {
    double m = kvr_stats_run_max_load(&res->runs[r]);
    kvr__fmt_load(res, m, a, sizeof(a));
    kvr_buf_printf(out, "  %-24s %8s %s", res->runs[r].label, a, kvr__load_unit(res));
    if (r > 0 && base > 0)
      kvr_buf_printf(out, "  (%+.0f%% vs %s)", (m / base - 1) * 100, res->runs[0].label);
    else if (r > 0)
      kvr_buf_printf(out, "  (baseline passed at no load)");
    kvr_buf_puts(out, "\n");
  }
}

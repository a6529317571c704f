/* report_sections.c -- the report's sections, written once as format-neutral blocks
 * (report_int.h) that report_md.c and report_html.c render: headings, tables and the sentences that
 * only describe. Every sentence that concludes something comes from report_verdicts.c.
 *
 * Sections, in order (the team's report form, shared/seeds/002_*.txt): head (title, suffixed
 * "(virtual time)" for a virtual-time run, the summary paragraph of report_verdicts.c, generation
 * time); configuration (labels, policies, prefix-cache resets, the virtual clock); a trace
 * workload's own figures beside each run's cached share (report_trace.c); SLO targets; one
 * table per metric by load and label; the SLO compliance matrix; winner identification; the
 * detailed comparison at the baseline's max SLO-compliant load, with per-turn TTFT and worker share
 * there; key observations computed from the data; workload parameters.
 *
 * Structs: none of its own; tables take their rows from the metric tables of report.c.
 *
 * Invariants: tables have one row per load any run measured and an em dash where a run has no
 * level there; each text opens and closes its own inline marks.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B KVR__STRONG
#define C KVR__CODE
#define DASH KVR__DASH

/* Opens a table whose columns are first then one per run. */
static void run_table(const kvr_results_t *res, kvr__doc_t *d, const char *first, bool right) {
  kvr_buf_t rule = KVR_BUF_INIT;
  kvr_buf_puts(&rule, right ? "|-----:|" : "|--------|");
  for (size_t r = 0; r < res->nruns; r++)
    kvr_buf_puts(&rule, right ? "--------:|" : "--------|");
  kvr__doc_table(d, rule.data);
  kvr_buf_free(&rule);
  kvr__doc_cell(d, "%s", first);
  for (size_t r = 0; r < res->nruns; r++)
    kvr__doc_cell(d, "%s", res->runs[r].label);
  kvr__doc_row_end(d);
}

/* A section about one load a (in the results' load unit): the heading "<title> at <a> <unit>", a
 * paragraph, and a run table whose first column is first. */
static void load_section(const kvr_results_t *res, kvr__doc_t *d, const char *title, const char *a,
                         const char *para, const char *first) {
  kvr__doc_h(d, 2, "%s at %s %s", title, a, kvr__load_unit(res));
  kvr__doc_p(d, "%s", para);
  run_table(res, d, first, false);
}

/* One figure of a level: an em dash without a level, "n/a" (or "stopped early") without data;
 * with_n appends " (n=N)", the measured requests behind it, when the metric counts them. */
static void metric_cell(kvr__doc_t *d, const kvr__metric_t *m, const kvr_level_t *lv, bool with_n) {
  if (lv == NULL) {
    kvr__doc_cell(d, DASH);
  } else if (!m->valid(lv)) {
    kvr__doc_cell(d, "%s", lv->stopped_early ? "stopped early" : "n/a");
  } else {
    char tmp[64];
    snprintf(tmp, sizeof(tmp), m->fmt, m->get(lv));
    if (with_n && m->count)
      kvr__doc_cell(d, "%s (n=%zu)", tmp, m->count(lv));
    else
      kvr__doc_cell(d, "%s", tmp);
  }
}

/* A figure by load and label; note: the first of them, which says what n is. */
static void metric_table(const kvr_results_t *res, const kvr__metric_t *m, const double *loads,
                         size_t nloads, bool note, kvr__doc_t *d) {
  kvr__doc_h(d, 2, "Results " DASH " %s", m->title);
  if (note)
    kvr__doc_p(d, "n: the measured requests behind each figure (warm-up and cool-down requests "
                  "excluded; TTFT counts those with a first token, TPOT those with two or more "
                  "output tokens, throughput the completed ones).");
  run_table(res, d, kvr__load_header(res), true);
  for (size_t i = 0; i < nloads; i++) {
    char l[32];
    kvr__fmt_load(res, loads[i], l, sizeof(l));
    kvr__doc_cell(d, "%s", l);
    for (size_t r = 0; r < res->nruns; r++)
      metric_cell(d, m, kvr__find_load(&res->runs[r], loads[i]), true);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
}

/* ---- head, configuration, SLOs --------------------------------------------------------------- */

void kvr__report_head(const kvr_results_t *res, kvr__doc_t *d) {
  kvr_buf_t title = KVR_BUF_INIT;
  kvr_report_title(res, &title);
  kvr__doc_h(d, 1, "%s", title.data);
  kvr_buf_free(&title);
  kvr__verdict_summary(res, d);
  kvr__doc_p(d, B "Generated:" B " %s", res->generated ? res->generated : "");
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
  if (res->virtual_desc)
    kvr__doc_p(d, "Clock: virtual time " DASH " %s", res->virtual_desc);
  kvr__verdict_reset(res, d);
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
    metric_table(res, &kvr__per_load_metrics[m], loads, nloads, m == 0, d);
  if (!res->concurrency_mode)
    metric_table(res, &kvr__achieved_metric, loads, nloads, false, d);
  bool engine = false;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      engine |= kvr__has_engine(res->runs[r].levels[i]);
  if (engine)
    for (size_t m = 0; m < kvr__n_engine_metrics; m++)
      metric_table(res, &kvr__engine_metrics[m], loads, nloads, false, d);
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
  kvr__doc_h(d, 2, "SLO Compliance Matrix");
  kvr__doc_p(d, "PASS = TTFT p99 < %.0fms AND TPOT p99 < %.0fms AND failed requests %s",
             res->slo.ttft_p99_ms, res->slo.tpot_p99_ms,
             res->slo.max_failed_frac > 0 ? "within the allowance" : "= 0");
  run_table(res, d, kvr__load_header(res), false);
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
  if (stopped)
    kvr__doc_p(d,
               "\"Stopped early\": the search ended the level once so many measured requests "
               "had a TTFT of %.0f ms or more that its TTFT p99 could no longer pass; its "
               "figures in the tables above cover the requests that had finished by then.",
               res->slo.ttft_p99_ms);
}

/* ---- winner identification ------------------------------------------------------------------- */

static void section_winner(const kvr_results_t *res, kvr__doc_t *d) {
  kvr_report_cap_t base = res->nruns ? kvr_report_cap(&res->runs[0]) : (kvr_report_cap_t){0};
  kvr__doc_h(d, 2, "Winner Identification");
  kvr__doc_table(d, "|-------|:----------------------:|:--------------------:|");
  kvr__doc_cell(d, "Label");
  kvr__doc_cell(d, "Max SLO-Compliant %s", kvr__load_header(res));
  kvr__doc_cell(d, "Capacity vs Baseline");
  kvr__doc_row_end(d);
  for (size_t r = 0; r < res->nruns; r++) {
    kvr_report_cap_t c = kvr_report_cap(&res->runs[r]);
    char cap[48], gain[48];
    kvr__fmt_cap(res, c, false, cap, sizeof(cap));
    if (r == 0)
      snprintf(gain, sizeof(gain), DASH);
    else
      kvr__fmt_gain(kvr_report_gain(base, c), gain, sizeof(gain));
    bool winner = kvr_report_winner(res, r);
    kvr__doc_cell(d, "%s%s", res->runs[r].label, winner ? " " B "WINNER" B : "");
    kvr__doc_cell(d, "%s", cap);
    kvr__doc_cell(d, "%s", gain);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
  if (res->nruns > 1)
    kvr__verdict_winner(res, d);
}

/* ---- detailed comparison, per-turn TTFT, worker share ---------------------------------------- */

static void detail_table(const kvr_results_t *res, double dl, kvr__doc_t *d) {
  run_table(res, d, "Metric", false);
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
      metric_cell(d, mt, kvr__find_load(&res->runs[r], dl), false);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
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
  load_section(res, d, "Per-Turn TTFT", a,
               "TTFT p50 / p99 (ms), mean prompt tokens, share of them cached.", "Turn");
  for (size_t t = 0; t < maxturn; t++) {
    kvr__doc_cell(d, "%zu", t + 1);
    for (size_t r = 0; r < res->nruns; r++)
      turn_cell(d, kvr__find_load(&res->runs[r], dl), t);
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
}

static void share_table(const kvr_results_t *res, double dl, const char *a, kvr__doc_t *d) {
  char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX];
  size_t nnames = kvr__worker_names(res, dl, names);
  if (nnames == 0)
    return;
  load_section(res, d, "Worker Share", a, "Requests per worker (x-kvrouter-worker).", "Worker");
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
}

static void section_detail(const kvr_results_t *res, kvr__doc_t *d) {
  double dl;
  bool passed;
  if (!kvr__detail_load(res, &dl, &passed))
    return;
  char a[32];
  kvr__fmt_load(res, dl, a, sizeof(a));
  if (passed && kvr_report_cap(&res->runs[0]).found)
    kvr__doc_h(d, 2, "Detailed Comparison at Baseline Max %s (%s %s)", kvr__load_header(res), a,
               kvr__load_unit(res));
  else if (passed) /* every level passed: the highest is not its max */
    kvr__doc_h(d, 2,
               "Detailed Comparison at Baseline's Highest Passing %s (%s %s; every level "
               "passed, so its max was not found)",
               kvr__load_header(res), a, kvr__load_unit(res));
  else
    kvr__doc_h(d, 2, "Detailed Comparison at Baseline's Lowest %s (%s %s; no load %spassed)",
               kvr__load_header(res), a, kvr__load_unit(res),
               kvr__passed_any(&res->runs[0]) ? "below its first failure " : "");
  detail_table(res, dl, d);
  turn_table(res, dl, a, d);
  share_table(res, dl, a, d);
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
  if (res->trace)
    return "requests per second of the trace: a level sends the trace's requests (its window's) "
           "from the first at the trace's own arrival times, compressed or stretched by one "
           "factor so that their mean rate is the level's; comparable with " C
           "vllm bench serve --request-rate" C " on a trace";
  if (res->sessions)
    return "conversation starts per second; later turns follow their predecessor after think "
           "time";
  if (res->replay)
    return "requests per second of turn arrivals (one arrival = one request): arrival i sends a "
           "pre-assigned (conversation, turn) of the replayed conversations whether or not that "
           "conversation's previous turn has finished; comparable with " C
           "vllm bench serve --request-rate" C;
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

typedef enum { COUNT_MEASURED, COUNT_WARMUP, COUNT_COOLDOWN } count_t;

/* The smallest and largest count over the levels that ran to their end (interrupted ones sent
 * less), of measured requests, or warm-up or cool-down sends; false when no level ran to its
 * end. */
static bool level_counts(const kvr_results_t *res, count_t what, size_t *lo, size_t *hi) {
  bool any = false;
  *lo = SIZE_MAX, *hi = 0;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      if (lv->interrupted || (what == COUNT_MEASURED && lv->stopped_early))
        continue;
      size_t k = what == COUNT_WARMUP     ? lv->warmup_requests
                 : what == COUNT_COOLDOWN ? lv->cooldown_requests
                                          : lv->measured;
      *lo = KVR_MIN(*lo, k);
      *hi = KVR_MAX(*hi, k);
      any = true;
    }
  return any;
}

/* The prompts asked for per level and, when levels measured another count (--min-level-s raises
 * it with the rate), what they measured. */
static void param_prompts(const kvr_results_t *res, kvr__doc_t *d) {
  const char *name = res->concurrency_mode ? "Prompts per Level" : "Prompts per Rate";
  size_t lo, hi;
  if (res->trace) {
    param(d, name,
          "the trace's %zu requests that fit the workers' context, every level (" C
          "--num-prompts" C " does not apply)",
          res->trace->sent);
    return;
  }
  if (!level_counts(res, COUNT_MEASURED, &lo, &hi) ||
      (lo == res->num_prompts && hi == res->num_prompts))
    param(d, name, "%zu", res->num_prompts);
  else if (lo == hi)
    param(d, name, "%zu asked, %zu measured at every level run to its end", res->num_prompts, lo);
  else
    param(d, name, "%zu asked, %zu-%zu measured per level run to its end", res->num_prompts, lo,
          hi);
}

/* "N" or "N-M" requests per level. */
static void fmt_range(size_t lo, size_t hi, char *buf, size_t size) {
  if (lo == hi)
    snprintf(buf, size, "%zu", lo);
  else
    snprintf(buf, size, "%zu-%zu", lo, hi);
}

/* Concurrency levels: steady state's warm-up and cool-down, as the levels sent them. */
static void param_steady(const kvr_results_t *res, kvr__doc_t *d) {
  size_t lo, hi, clo, chi;
  char w[48], c[48];
  if (!level_counts(res, COUNT_WARMUP, &lo, &hi) || !level_counts(res, COUNT_COOLDOWN, &clo, &chi))
    lo = hi = clo = chi = 0;
  fmt_range(lo, hi, w, sizeof(w));
  fmt_range(clo, chi, c, sizeof(c));
  char first[48] = "";
  if (res->warmup > 0)
    snprintf(first, sizeof(first), ", the first %u sent", res->warmup);
  param(d, "Warm-up / Cool-down",
        "measured in steady state: %s warm-up requests per level (each user's first, whose "
        "history is cold%s, and any sent within " C "--warmup-s" C
        "), then the measured ones, then %s cool-down requests sent while those finished "
        "(all excluded from metrics; those still in flight at the end were cancelled)",
        w, first, c);
}

/* The warm-up requests the levels actually sent (--warmup-s raises them with the rate). */
static void param_warmup(const kvr_results_t *res, kvr__doc_t *d) {
  size_t lo, hi;
  if (res->concurrency_mode) {
    param_steady(res, d);
    return;
  }
  if (!level_counts(res, COUNT_WARMUP, &lo, &hi))
    lo = hi = res->warmup;
  if (lo == hi)
    param(d, "Warm-up", "first %zu requests of each level, excluded from metrics", lo);
  else
    param(d, "Warm-up", "first %zu-%zu requests of each level (by level), excluded from metrics",
          lo, hi);
}

static void section_workload(const kvr_results_t *res, const double *loads, size_t nloads,
                             kvr__doc_t *d) {
  kvr__doc_h(d, 2, "Workload Parameters");
  kvr__doc_table(d, "|-----------|-------|");
  param(d, "Parameter", "Value");
  param(d, "Tool", C "kvrouter bench" C " (%s, libuv + libcurl)",
        res->concurrency_mode ? "closed-loop users" : "open-loop");
  param(d, "Endpoint", "%s (%s API)", res->url ? res->url : "", res->api ? res->api : "chat");
  param(d, "Model", "%s", res->model ? res->model : "");
  param(d, "Dataset", "%s",
        res->workload_desc ? res->workload_desc : (res->workload ? res->workload : ""));
  param_prompts(res, d);
  param_loads(res, loads, nloads, d);
  if (res->concurrency_mode)
    param(d, "Load",
          "N closed-loop users, each running its conversations turn after turn with think time, "
          "observed in steady state: each user's first conversation starts at a uniformly drawn "
          "turn with a synthetic history, and the users keep sending until every measured "
          "request completed");
  else
    param(d, "Rate Meaning", "%s", rate_meaning(res));
  if (res->trace)
    param(d, "Arrival Distribution", "the trace's own arrival times, scaled to each rate");
  else if (!res->concurrency_mode)
    param(d, "Arrival Distribution", "%s (burstiness=%.1f)",
          res->burstiness == 1.0 ? "Poisson" : "Gamma", res->burstiness);
  param_warmup(res, d);
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
  kvr__report_trace(res, d);
  section_slo(res, d);
  section_metrics(res, loads, nloads, d);
  section_matrix(res, loads, nloads, d);
  section_winner(res, d);
  section_detail(res, d);
  kvr__verdict_observations(res, d);
  section_workload(res, loads, nloads, d);
  free(loads);
}

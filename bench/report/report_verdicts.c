/* report_verdicts.c -- every sentence of the report that concludes something: the opening summary,
 * whether runs started cold, which label wins, the key observations, and the plain-text summary.
 *
 * Rule: each verdict is computed from the results (through the analysis of report.c: capacities
 * and whether their limits were found, gains and their bounds, the certain winner, the schedule
 * check), states the threshold it applies, and says the opposite -- or that it is not known --
 * when the data say so. In particular:
 *   - a max SLO-compliant load with no failing level above it is "at least" that load, and a
 *     ratio built on it is "at least", "at most" or unknown, never a bare figure;
 *   - "every run starts cold" needs every run's reset confirmed by every worker
 *     (kvr_run_t.cache_reset_outcome); otherwise the runs that did not are named;
 *   - "kept to its schedule" needs every level's send lag p99 under KVR_REPORT_LAG_P99_MAX_MS and
 *     achieved rate within KVR_REPORT_RATE_TOL of its scheduled rate; otherwise the levels that
 *     missed are named with their figures.
 *
 * Structs: none of its own. Sentences go to a kvr__doc_t (report_int.h) with inline marks, so the
 * Markdown and the HTML carry the same words.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define B KVR__STRONG
#define C KVR__CODE

#define SCHEDULE_NAMED_MAX 8 /* levels named in the schedule verdict; the rest are counted */

/* ---- prefix-cache resets --------------------------------------------------------------------- */

/* Names the runs that did not start cold and why; returns how many did. */
static size_t not_cold_runs(const kvr_results_t *res, kvr__doc_t *d) {
  size_t k = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_run_t *run = &res->runs[r];
    if (run->cache_reset_outcome == KVR_CACHE_RESET_ALL)
      continue;
    kvr__doc_printf(d, "%s", k++ ? "; " : " ");
    if (run->cache_reset_outcome == KVR_CACHE_RESET_FAILED)
      kvr__doc_printf(d,
                      "the reset before " C "%s" C " failed (%s), so " C "%s" C
                      " did not start from reset caches (a worker whose reset failed kept what "
                      "it had cached)",
                      run->label, run->cache_reset[0] ? run->cache_reset : "no reason given",
                      run->label);
    else
      kvr__doc_printf(d,
                      "the outcome of the reset before " C "%s" C " was not recorded, so whether "
                      "it started cold is not known",
                      run->label);
  }
  return k;
}

void kvr__verdict_reset(const kvr_results_t *res, kvr__doc_t *d) {
  if (res->cache_reset == NULL) {
    if (res->nruns > 1)
      kvr__doc_p(d, "Prefix caches were " B "not" B " reset between runs: later runs may find the "
                    "earlier runs' identical prompts still cached.");
    return;
  }
  size_t cold = 0, failed = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    cold += res->runs[r].cache_reset_outcome == KVR_CACHE_RESET_ALL;
    failed += res->runs[r].cache_reset_outcome == KVR_CACHE_RESET_FAILED;
  }
  if (cold == res->nruns) {
    kvr__doc_p(d,
               "Prefix caches were reset %s, and every worker confirmed its reset before every "
               "run, so every run starts cold.",
               res->cache_reset);
    return;
  }
  kvr__doc_printf(d, "Prefix caches were reset %s, but " B "%s" B ":", res->cache_reset,
                  failed ? "not every run started cold"
                         : "whether every run started cold is not known");
  not_cold_runs(res, d);
  for (size_t r = 0, k = 0; r < res->nruns; r++)
    if (res->runs[r].cache_reset_outcome == KVR_CACHE_RESET_ALL)
      kvr__doc_printf(d, "%s" C "%s" C, k++ ? ", " : "; ", res->runs[r].label);
  if (cold > 0)
    kvr__doc_printf(d, " started cold (every worker confirmed its reset)");
  kvr__doc_printf(d, ".");
  kvr__doc_p_end(d);
}

/* ---- capacity: winner and observation -------------------------------------------------------- */

/* The runs whose limit was not found, "`X` passed every level tried (at least 12.00 RPS); `Y` ran
 * no level to its end". */
static void unfound_list(const kvr_results_t *res, kvr__doc_t *d) {
  size_t k = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    kvr_report_cap_t c = kvr_report_cap(&res->runs[r]);
    char cap[48];
    if (c.found)
      continue;
    kvr__fmt_cap(res, c, true, cap, sizeof(cap));
    if (c.ran)
      kvr__doc_printf(d, "%s" C "%s" C " passed every level tried (%s)", k++ ? "; " : "",
                      res->runs[r].label, cap);
    else
      kvr__doc_printf(d, "%s" C "%s" C " ran no level to its end", k++ ? "; " : "",
                      res->runs[r].label);
  }
}

/* How the other runs compare with the baseline: certainly above (*up), not known (*unknown). */
static void count_vs_base(const kvr_results_t *res, size_t *up, size_t *unknown, size_t *win) {
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]);
  *up = *unknown = 0;
  *win = res->nruns;
  for (size_t r = res->nruns; r-- > 1;) {
    int k = kvr_report_cmp(kvr_report_cap(&res->runs[r]), base);
    *up += k == 1;
    *unknown += k == KVR_REPORT_CMP_UNKNOWN;
    if (kvr_report_winner(res, r))
      *win = r; /* the first winner */
  }
}

static void not_known_tail(const kvr_results_t *res, kvr__doc_t *d) {
  unfound_list(res, d);
  kvr__doc_printf(d, ". A max is known only once a higher level fails: measure higher loads (or "
                     "use " C "--search" C ").");
}

static void winners_sentence(const kvr_results_t *res, size_t w, kvr__doc_t *d) {
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]), cw = kvr_report_cap(&res->runs[w]);
  kvr_report_gain_t g = kvr_report_gain(base, cw);
  char a[48], b[48], gain[48];
  kvr__doc_printf(d, B);
  for (size_t r = w, k = 0; r < res->nruns; r++)
    if (kvr_report_winner(res, r))
      kvr__doc_printf(d, "%s%s", k++ ? ", " : "", res->runs[r].label);
  kvr__fmt_load(res, base.load, a, sizeof(a));
  kvr__fmt_cap(res, cw, true, b, sizeof(b));
  kvr__fmt_gain(g, gain, sizeof(gain));
  if (g.bound == KVR_REPORT_NO_BASE)
    kvr__doc_printf(d, " passed up to %s; the baseline passed at no measured load%s.", b,
                    kvr__passed_any(&res->runs[0]) ? " below its first failure" : "");
  else
    kvr__doc_printf(d, " improved max SLO-compliant load over baseline: %s -> %s (%s).", a, b,
                    gain);
  kvr__doc_printf(d, B);
  kvr__doc_p_end(d);
}

void kvr__verdict_winner(const kvr_results_t *res, kvr__doc_t *d) {
  size_t up, unknown, w;
  count_vs_base(res, &up, &unknown, &w);
  if (w < res->nruns) {
    winners_sentence(res, w, d);
  } else if (up == 0 && unknown == 0) {
    kvr__doc_p(d, B "No configuration improved over baseline." B);
  } else {
    kvr__doc_printf(
        d, B "Which configuration has the highest max SLO-compliant load is not known:" B " ");
    not_known_tail(res, d);
    kvr__doc_p_end(d);
  }
}

/* ---- the opening summary --------------------------------------------------------------------- */

/* "`phase3` (kv_aware)": the run's label as code, then its policy when that says more. */
static void summary_name(const kvr_run_t *run, kvr__doc_t *d) {
  kvr__doc_printf(d, C "%s" C, run->label);
  if (run->policy[0] && strcmp(run->policy, run->label) != 0)
    kvr__doc_printf(d, " (%s)", run->policy);
}

/* The winners (kvr_report_winner) from the first, w, on: one name, or "a and b", "a, b and c". */
static void summary_winners(const kvr_results_t *res, size_t w, kvr__doc_t *d) {
  size_t nw = 0, k = 0;
  for (size_t r = w; r < res->nruns; r++)
    nw += kvr_report_winner(res, r);
  for (size_t r = w; r < res->nruns; r++) {
    if (!kvr_report_winner(res, r))
      continue;
    kvr__doc_printf(d, "%s", k == 0 ? "" : k + 1 == nw ? " and " : ", ");
    summary_name(&res->runs[r], d);
    k++;
  }
  kvr__doc_printf(d, " %s", nw > 1 ? "share" : "has");
}

static void summary_winner(const kvr_results_t *res, size_t w, kvr__doc_t *d) {
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]), cw = kvr_report_cap(&res->runs[w]);
  kvr_report_gain_t g = kvr_report_gain(base, cw);
  char a[48], b[48], gain[48];
  kvr__fmt_cap(res, base, true, a, sizeof(a));
  kvr__fmt_cap(res, cw, true, b, sizeof(b));
  kvr__fmt_gain(g, gain, sizeof(gain));
  summary_winners(res, w, d);
  kvr__doc_printf(d, " the highest max SLO-compliant load, " B "%s" B, b);
  if (g.bound == KVR_REPORT_NO_BASE) {
    kvr__doc_printf(d, ", while the baseline ");
    summary_name(&res->runs[0], d);
    kvr__doc_printf(d, " passed at no measured load%s, so there is no ratio.",
                    kvr__passed_any(&res->runs[0]) ? " below its first failure" : "");
    return;
  }
  kvr__doc_printf(d, ", against %s for the baseline ", a);
  summary_name(&res->runs[0], d);
  kvr__doc_printf(d, ": " B "%s" B ".", gain);
  /* A certain winner is above a found baseline limit: the gain is exact or at least. */
  if (g.bound == KVR_REPORT_EXACT)
    kvr__doc_printf(d, " Both limits were found (a higher load failed), so the gain is exact.");
  else
    kvr__doc_printf(d, " It passed every level tried, so its own limit was not found and the gain "
                       "is a lower bound: measure higher loads to find it.");
}

void kvr__verdict_summary(const kvr_results_t *res, kvr__doc_t *d) {
  if (res->nruns == 0)
    return;
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]);
  char a[48];
  kvr__fmt_cap(res, base, true, a, sizeof(a));
  kvr__doc_printf(d, B "Summary:" B " ");
  if (res->nruns == 1) {
    summary_name(&res->runs[0], d);
    if (!base.ran)
      kvr__doc_printf(d, " ran no level to its end, so its max SLO-compliant load is not known.");
    else if (base.load <= 0)
      kvr__doc_printf(d, " passed the SLOs at no measured load%s.",
                      kvr__passed_any(&res->runs[0]) ? " below its first failure" : "");
    else
      kvr__doc_printf(d, " has a max SLO-compliant load of " B "%s" B "%s.", a,
                      base.found ? " (a higher load failed, so this is its limit)"
                                 : " (every level tried passed, so this is a lower bound)");
    kvr__doc_p_end(d);
    return;
  }
  size_t up, unknown, w;
  count_vs_base(res, &up, &unknown, &w);
  if (w < res->nruns) {
    summary_winner(res, w, d);
  } else if (up == 0 && unknown == 0) {
    kvr__doc_printf(d, "no configuration beat the baseline ");
    summary_name(&res->runs[0], d);
    kvr__doc_printf(d,
                    ": its max SLO-compliant load is " B "%s" B
                    " and every other one's is the same or lower.",
                    a);
  } else {
    kvr__doc_printf(d, "which configuration has the highest max SLO-compliant load is " B
                       "not known" B ": ");
    not_known_tail(res, d);
  }
  kvr__doc_printf(d,
                  " (Max SLO-compliant load: the highest load at which TTFT p99 < %.0f ms and "
                  "TPOT p99 < %.0f ms.)",
                  res->slo.ttft_p99_ms, res->slo.tpot_p99_ms);
  kvr__doc_p_end(d);
}

static void obs_capacity_winner(const kvr_results_t *res, size_t w, int *n, kvr__doc_t *d) {
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]), cw = kvr_report_cap(&res->runs[w]);
  kvr_report_gain_t g = kvr_report_gain(base, cw);
  const char *lw = res->runs[w].label, *l0 = res->runs[0].label, *unit = kvr__load_unit(res);
  char a[48], b[48];
  kvr__fmt_load(res, base.load, a, sizeof(a));
  kvr__fmt_load(res, cw.load, b, sizeof(b));
  double pct = (g.ratio - 1) * 100;
  if (g.bound == KVR_REPORT_NO_BASE) {
    kvr__fmt_cap(res, cw, true, b, sizeof(b));
    kvr__doc_p(d,
               "%d. " B C "%s" C " passes the SLOs up to %s where " C "%s" C
               " passes at no measured load%s." B,
               (*n)++, lw, b, l0, kvr__passed_any(&res->runs[0]) ? " below its first failure" : "");
  } else if (g.bound == KVR_REPORT_EXACT) {
    kvr__doc_p(d,
               "%d. " B C "%s" C " raises the max SLO-compliant load from %s to %s %s (%+.0f%%) "
               "over " C "%s" C "." B " On this workload it serves %.0f%% more traffic within the "
               "SLOs.",
               (*n)++, lw, a, b, unit, pct, l0, pct);
  } else { /* only the winner's limit is a lower bound */
    kvr__doc_p(d,
               "%d. " B C "%s" C " raises the max SLO-compliant load from %s to at least %s %s "
               "(at least %+.0f%%) over " C "%s" C "." B " It passed every level tried, so its own "
               "limit was not found: on this workload it serves at least %.0f%% more traffic "
               "within the SLOs.",
               (*n)++, lw, a, b, unit, pct, l0, pct);
  }
}

static void obs_capacity(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  if (res->nruns < 2)
    return;
  size_t up, unknown, w;
  count_vs_base(res, &up, &unknown, &w);
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]);
  const char *l0 = res->runs[0].label;
  char a[48];
  kvr__fmt_cap(res, base, true, a, sizeof(a));
  if (w < res->nruns) {
    obs_capacity_winner(res, w, n, d);
  } else if (up == 0 && unknown == 0 && base.found) {
    kvr__doc_p(
        d, "%d. " B "No configuration raised the max SLO-compliant load above " C "%s" C "'s %s." B,
        (*n)++, l0, a);
  } else if (up == 0 && unknown == 0) {
    kvr__doc_p(d,
               "%d. " B "No configuration reached " C "%s" C "'s max SLO-compliant load:" B
               " every other one failed below the highest load " C "%s" C
               " tried, and it passed every level tried (%s).",
               (*n)++, l0, l0, a);
  } else {
    kvr__doc_printf(d,
                    "%d. " B "Whether any configuration raises the max SLO-compliant load above " C
                    "%s" C "'s is not known:" B " ",
                    (*n)++, l0);
    not_known_tail(res, d);
    kvr__doc_p_end(d);
  }
}

/* ---- binding constraint, latency, cache, balance --------------------------------------------- */

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

static void obs_binding_run(const kvr_results_t *res, const kvr_run_t *run, int *n, kvr__doc_t *d) {
  double fl;
  unsigned mask;
  char names[64], a[32];
  bool interrupted = false;
  for (size_t i = 0; i < run->nlevels; i++)
    interrupted |= run->levels[i]->interrupted;
  if (first_failure(run, &fl, &mask)) {
    kvr_stats_fail_names(mask, names, sizeof(names));
    kvr__fmt_load(res, fl, a, sizeof(a));
    kvr__doc_p(d,
               "%d. " B "%s binds first for " C "%s" C "." B
               " Its first failing load is %s %s (FAIL (%s)).",
               (*n)++, names, run->label, a, kvr__load_unit(res), names);
  } else if (run->nlevels > 0 && !interrupted) {
    kvr__doc_p(d,
               "%d. " B C "%s" C " passed every measured load." B
               " Its limit lies above the highest load measured.",
               (*n)++, run->label);
  } else if (run->nlevels > 0) {
    kvr__doc_p(d,
               "%d. " B C "%s" C " failed no level it ran to its end." B
               " Its interrupted levels cover only the requests finished before the stop, so they "
               "bound nothing.",
               (*n)++, run->label);
  }
}

static void obs_binding(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  for (size_t r = 0; r < res->nruns; r++)
    obs_binding_run(res, &res->runs[r], n, d);
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

/* Placement of one run at load dl over the named workers seen there in any run (a worker another
 * label used and this one never did counts as taking none). */
static void obs_balance_run(const kvr_results_t *res, const kvr_run_t *run, double dl,
                            char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX], size_t nnames,
                            int *n, kvr__doc_t *d) {
  const kvr_level_t *lv = kvr__find_load(run, dl);
  if (lv == NULL || lv->measured == 0)
    return;
  size_t seen = 0, used = 0, idle = 0, mx = 0, mn = SIZE_MAX, total = 0;
  for (size_t k = 0; k < nnames; k++) {
    if (names[k][0] == '\0')
      continue;
    size_t c = kvr__worker_count(lv, names[k]);
    seen++;
    used += c > 0;
    idle += c == 0;
    total += c;
    mx = KVR_MAX(mx, c);
    mn = KVR_MIN(mn, c);
  }
  char a[32];
  kvr__fmt_load(res, dl, a, sizeof(a));
  if (used == 0)
    kvr__doc_p(d,
               "%d. " B C "%s" C " responses carried no x-kvrouter-worker header" B
               " (not behind kvrouter), so placement is unknown.",
               (*n)++, run->label);
  else if (idle == 0)
    kvr__doc_p(d,
               "%d. " B C "%s" C " spread requests over %zu workers at %s %s" B
               ": the busiest took %.0f%%, the least busy %.0f%% (even would be %.0f%%).",
               (*n)++, run->label, used, a, kvr__load_unit(res), 100.0 * (double)mx / (double)total,
               100.0 * (double)mn / (double)total, 100.0 / (double)seen);
  else
    kvr__doc_p(d,
               "%d. " B C "%s" C " spread requests over %zu of the %zu workers seen at %s %s" B
               ": the busiest took %.0f%%, %zu took none (even would be %.0f%%).",
               (*n)++, run->label, used, seen, a, kvr__load_unit(res),
               100.0 * (double)mx / (double)total, idle, 100.0 / (double)seen);
}

static void obs_balance(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  double dl;
  char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX];
  size_t nnames;
  if (!kvr__detail_workers(res, &dl, names, &nnames))
    return;
  for (size_t r = 0; r < res->nruns; r++)
    obs_balance_run(res, &res->runs[r], dl, names, nnames, n, d);
}

/* ---- the load generator's schedule ----------------------------------------------------------- */

/* "`phase3` at 9.38 RPS: send lag p99 33.0 ms, achieved 8.90 req/s vs 9.40 scheduled (-5.3%)" */
static void missed_level(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                         bool lag_ok, bool rate_ok, kvr__doc_t *d) {
  char a[32];
  kvr__fmt_load(res, kvr__load_of(lv), a, sizeof(a));
  kvr__doc_printf(d, C "%s" C " at %s %s:", run->label, a, kvr__load_unit(res));
  if (!lag_ok)
    kvr__doc_printf(d, " send lag p99 %.1f ms", lv->lag.p99);
  if (!rate_ok)
    kvr__doc_printf(d, "%s achieved %.2f req/s vs %.2f scheduled (%+.1f%%)", lag_ok ? "" : ",",
                    lv->achieved_rate, lv->scheduled_rate,
                    (lv->achieved_rate / lv->scheduled_rate - 1) * 100);
}

/* Names up to SCHEDULE_NAMED_MAX of the missed levels, then counts the rest. */
static void missed_levels(const kvr_results_t *res, size_t missed, kvr__doc_t *d) {
  size_t named = 0;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      bool lag_ok, rate_ok;
      if (lv->lag.n == 0 || kvr_report_on_schedule(lv, &lag_ok, &rate_ok) ||
          named == SCHEDULE_NAMED_MAX)
        continue;
      kvr__doc_printf(d, "%s", named++ ? "; " : "");
      missed_level(res, &res->runs[r], lv, lag_ok, rate_ok, d);
    }
  if (missed > named)
    kvr__doc_printf(d, "; and %zu more", missed - named);
}

static void obs_schedule(const kvr_results_t *res, int *n, kvr__doc_t *d) {
  size_t checked = 0, missed = 0;
  double worst_lag = 0, worst_dev = 0;
  if (res->concurrency_mode)
    return; /* closed-loop users have no schedule */
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      bool lag_ok, rate_ok;
      if (lv->lag.n == 0)
        continue;
      checked++;
      missed += !kvr_report_on_schedule(lv, &lag_ok, &rate_ok);
      worst_lag = fmax(worst_lag, lv->lag.p99);
      if (lv->scheduled_rate > 0 && lv->achieved_rate > 0)
        worst_dev = fmax(worst_dev, fabs(lv->achieved_rate / lv->scheduled_rate - 1));
    }
  if (checked == 0)
    return;
  if (missed == 0) {
    kvr__doc_p(d,
               "%d. " B "The load generator kept to its schedule:" B " at every level the send "
               "lag p99 was under %.0f ms (real time; worst %.2f ms) and the achieved rate within "
               "%.0f%% of the rate the level's arrival times ask for (worst %.1f%% off).",
               (*n)++, KVR_REPORT_LAG_P99_MAX_MS, worst_lag, KVR_REPORT_RATE_TOL * 100,
               worst_dev * 100);
    return;
  }
  kvr__doc_printf(d,
                  "%d. " B "The load generator missed its schedule at %zu of %zu levels" B
                  " (it keeps to it when the send lag p99 is under %.0f ms, real time, and the "
                  "achieved rate within %.0f%% of the rate the level's arrival times ask for): ",
                  (*n)++, missed, checked, KVR_REPORT_LAG_P99_MAX_MS, KVR_REPORT_RATE_TOL * 100);
  missed_levels(res, missed, d);
  kvr__doc_printf(d, ". At those levels requests went out later than the workload asked, so the "
                     "offered load was not the one intended.");
  kvr__doc_p_end(d);
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

void kvr__verdict_observations(const kvr_results_t *res, kvr__doc_t *d) {
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

/* ---- the plain-text summary ------------------------------------------------------------------ */

/* What follows a run's "LABEL LOAD UNIT": its gain vs the baseline and how far both are known. */
static void summary_tail(const kvr_results_t *res, size_t r, kvr_buf_t *out) {
  kvr_report_cap_t base = kvr_report_cap(&res->runs[0]), c = kvr_report_cap(&res->runs[r]);
  kvr_report_gain_t g = kvr_report_gain(base, c);
  const char *l0 = res->runs[0].label;
  double pct = (g.ratio - 1) * 100;
  if (r == 0 && c.ran && !c.found)
    kvr_buf_puts(out, "  (at least: every level tried passed)");
  else if (r == 0 && !c.ran)
    kvr_buf_puts(out, "  (no level ran to its end)");
  if (r == 0)
    return;
  if (g.bound == KVR_REPORT_NO_BASE)
    kvr_buf_puts(out, "  (baseline passed at no load)");
  else if (!base.ran || !c.ran)
    kvr_buf_printf(out, "  (not known: %s ran no level to its end)",
                   c.ran ? l0 : res->runs[r].label);
  else if (g.bound == KVR_REPORT_UNKNOWN) {
    kvr_buf_puts(out, "  (no ratio: both passed every level tried, so neither limit was found)");
    return;
  } else
    kvr_buf_printf(out, "  (%+.0f%% vs %s)", pct, l0);
  if (g.bound == KVR_REPORT_NO_BASE && !c.found)
    kvr_buf_puts(out, " at least: every level tried passed");
  else if (g.bound == KVR_REPORT_AT_LEAST)
    kvr_buf_printf(out, " at least: %s passed every level tried", res->runs[r].label);
  else if (g.bound == KVR_REPORT_AT_MOST)
    kvr_buf_printf(out, " at most: %s passed every level tried", l0);
}

void kvr_report_summary(const kvr_results_t *res, kvr_buf_t *out) {
  char a[32];
  kvr_buf_printf(out, "Max SLO-compliant %s (TTFT p99 < %.0f ms, TPOT p99 < %.0f ms):\n",
                 res->concurrency_mode ? "concurrency" : "rate", res->slo.ttft_p99_ms,
                 res->slo.tpot_p99_ms);
  for (size_t r = 0; r < res->nruns; r++) {
    kvr__fmt_load(res, kvr_stats_run_max_load(&res->runs[r]), a, sizeof(a));
    kvr_buf_printf(out, "  %-24s %8s %s", res->runs[r].label, a, kvr__load_unit(res));
    summary_tail(res, r, out);
    kvr_buf_puts(out, "\n");
  }
}

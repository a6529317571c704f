/* demo_agree.c -- the demo's step 3: the real run's levels again in virtual time, and how the two
 * agree (demo.h).
 *
 * Flow: the twin's command line (kvr__demo_bench_args: the same --rates, seed and plan, so the
 * same traces) run in virtual time by kvr_bench_run_argv(), its results in memory -> each level
 * beside its real one (kvr__demo_level: one row per label and rate) -> the table: per policy and
 * rate real vs virtual TTFT and TPOT at the agreement quantile (p99; --quick p90:
 * kvr__demo_agree_q) and the SLO verdict (always the p99 SLOs) -> the headline: kv_aware vs
 * round_robin on the workload, virtual (step 1) and real (step 2), each limit bounded as the levels
 * know it ("at least R" when every level tried passed; no ratio printed as "+0%") -> printed and
 * written to OUT/AGREEMENT.md.
 */
#include "demo_int.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "bench_run.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr__demo_q_interval(const double *v, size_t n, double q, double *lo, double *hi) {
  double k = q * (double)n, half = 1.96 * sqrt(k * (1 - q));
  double rlo = fmax(1, floor(k - half)), rhi = fmin((double)n, ceil(k + half));
  *lo = v[(size_t)rlo - 1];
  *hi = v[(size_t)rhi - 1];
}

double kvr__demo_agree_q(const kvr_demo_t *d, const char **name) {
  if (name)
    *name = d->cli->quick ? "p90" : "p99";
  return d->cli->quick ? 0.90 : 0.99;
}

double kvr__demo_stat_at(const kvr_dist_t *s, double q) {
  return q < 0.95 ? s->p90 : s->p99;
}

kvr__demo_lvl_t *kvr__demo_level(kvr_demo_t *d, const char *label, double rate, bool add) {
  for (size_t i = 0; i < d->nlv; i++)
    if (strcmp(d->lv[i].label, label) == 0 && fabs(d->lv[i].rate - rate) <= 1e-9 * fmax(1, rate))
      return &d->lv[i];
  if (!add || d->nlv == KVR__DEMO_MAX_LEVELS)
    return NULL;
  kvr__demo_lvl_t *l = &d->lv[d->nlv++];
  memset(l, 0, sizeof(*l));
  snprintf(l->label, sizeof(l->label), "%s", label);
  l->rate = rate;
  return l;
}

/* The twin's levels beside the real ones. */
static void twin_levels(kvr_demo_t *d, const kvr_results_t *res) {
  for (size_t r = 0; res && r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      kvr__demo_lvl_t *l = kvr__demo_level(d, res->runs[r].label, lv->rate, true);
      if (l == NULL)
        continue;
      l->virt = true;
      if (!l->policy[0])
        snprintf(l->policy, sizeof(l->policy), "%s", res->runs[r].policy);
      l->virt_ttft = kvr__demo_stat_at(&lv->ttft, kvr__demo_agree_q(d, NULL));
      l->virt_tpot = kvr__demo_stat_at(&lv->tpot, kvr__demo_agree_q(d, NULL));
      l->virt_pass = lv->pass;
      kvr_stats_fail_names(lv->fail_mask, l->virt_fail, sizeof(l->virt_fail));
    }
}

static int run_twin(kvr_demo_t *d) {
  char *a[160];
  int n = kvr__demo_bench_args(d, true, a, NULL, NULL);
  fprintf(stderr, "kvrouter demo: step 3/3: the same levels in virtual time\n");
  kvr_log_level_t level = kvr_log_get_level();
  kvr_log_set_level(KVR_LOG_WARN);
  kvr_results_t *res = NULL;
  char err[512] = "";
  kvr_bench_io_t io = {0};
  int rc = kvr_bench_run_argv(n, a, &io, &res, err, sizeof(err));
  kvr_log_set_level(level);
  if (rc != 0)
    fprintf(stderr, "kvrouter demo: step 3: %s\n", err[0] ? err : "the virtual run failed");
  twin_levels(d, res);
  kvr_stats_results_free(res);
  return rc;
}

static int cmp_level(const void *pa, const void *pb) {
  const kvr__demo_lvl_t *a = pa, *b = pb;
  int c = strcmp(a->label, b->label);
  return c ? c : (a->rate > b->rate) - (a->rate < b->rate);
}

/* One table cell: the figure in ms with `decimals`, or "-" when that run has no such level. */
static void put_ms(kvr_buf_t *b, bool have, double ms, int decimals) {
  if (have)
    kvr_buf_printf(b, " %.*f ms |", decimals, ms);
  else
    kvr_buf_puts(b, " - |");
}

static void put_diff(kvr_buf_t *b, double real, double virt) {
  if (isnan(real) || isnan(virt) || virt <= 0)
    kvr_buf_puts(b, " - |");
  else if (fabs(real / virt - 1) < 0.0005)
    kvr_buf_puts(b, " 0.0% |");
  else
    kvr_buf_printf(b, " %+.1f%% |", (real / virt - 1) * 100);
}

static void put_verdict(kvr_buf_t *b, bool pass, const char *fail) {
  if (pass)
    kvr_buf_puts(b, " PASS |");
  else
    kvr_buf_printf(b, " FAIL (%s) |", fail[0] ? fail : "?");
}

/* A policy's real limit as its levels bound it: lo = the highest passing rate below the lowest
 * failing one (0: none), hi = that failing rate (INFINITY: every level passed). */
typedef struct bounds_s {
  size_t n;
  double lo, hi;
} bounds_t;

static bounds_t real_bounds(const kvr_demo_t *d, const char *policy) {
  bounds_t r = {0, 0, INFINITY};
  for (size_t i = 0; i < d->nlv; i++)
    if (d->lv[i].real && !d->lv[i].real_interrupted && strcmp(d->lv[i].policy, policy) == 0) {
      r.n++;
      if (!d->lv[i].real_pass)
        r.hi = fmin(r.hi, d->lv[i].rate);
    }
  for (size_t i = 0; i < d->nlv; i++)
    if (d->lv[i].real && !d->lv[i].real_interrupted && strcmp(d->lv[i].policy, policy) == 0 &&
        d->lv[i].real_pass && d->lv[i].rate < r.hi)
      r.lo = fmax(r.lo, d->lv[i].rate);
  return r;
}

static void put_bounds(kvr_buf_t *b, const char *policy, bounds_t r) {
  if (r.n == 0)
    kvr_buf_printf(b, "%s not run", policy);
  else if (isinf(r.hi))
    kvr_buf_printf(b, "%s at least %.2f req/s (passed every rate tried)", policy, r.lo);
  else if (r.lo <= 0)
    kvr_buf_printf(b, "%s below %.2f req/s (failed every rate tried)", policy, r.hi);
  else
    kvr_buf_printf(b, "%s between %.2f and %.2f req/s", policy, r.lo, r.hi);
}

static void put_agg(kvr_buf_t *b, const char *policy, const kvr_study_agg_t *a) {
  if (a->mean <= 0)
    kvr_buf_printf(b, "%s passed at no rate tried", policy);
  else
    kvr_buf_printf(b, "%s %s%.2f req/s", policy, a->lower ? "at least " : "", a->mean);
}

/* The headline: kv_aware vs round_robin, virtual (step 1) and real (step 2), each bounded as its
 * levels know it. A gain is printed only when both limits bound it and it rounds to a change. */
static void headline(const kvr_demo_t *d, kvr_buf_t *b) {
  const char *w = d->cli->workload;
  kvr_buf_printf(b, "Headline, kv_aware vs round_robin on %s (max SLO-compliant rate):\n\n", w);
  const kvr_study_agg_t *rr = kvr__demo_virtual_agg(d, "round_robin"),
                        *kv = kvr__demo_virtual_agg(d, "kv_aware");
  kvr_buf_puts(b, "- virtual (step 1): ");
  if (rr == NULL || kv == NULL) {
    kvr_buf_puts(b, "not measured (step 1 ran no such pair on this workload).\n");
  } else {
    put_agg(b, "kv_aware", kv);
    kvr_buf_puts(b, " vs ");
    put_agg(b, "round_robin", rr);
    double pct = rr->mean > 0 ? (kv->mean / rr->mean - 1) * 100 : NAN;
    if (isnan(pct))
      kvr_buf_puts(b, ": no ratio (round_robin has no limit to divide by)");
    else if (kv->lower && rr->lower)
      kvr_buf_puts(b, ": no ratio (neither limit was found)");
    else if (fabs(pct) < 0.5)
      kvr_buf_printf(b, kv->lower || rr->lower ? ": not known which is higher"
                                               : ": no difference at this resolution");
    else
      kvr_buf_printf(b, ": %s%+.0f%%", kv->lower ? "at least " : rr->lower ? "at most " : "", pct);
    kvr_buf_printf(b, " (%zu seed%s).\n", kv->n, kv->n == 1 ? "" : "s");
  }
  bounds_t rb = real_bounds(d, "round_robin"), kb = real_bounds(d, "kv_aware");
  kvr_buf_puts(b, "- real (step 2): ");
  if (rb.n == 0 || kb.n == 0) {
    kvr_buf_puts(b,
                 "not measured (the real run did not complete both round_robin and kv_aware).\n");
    return;
  }
  put_bounds(b, "kv_aware", kb);
  kvr_buf_puts(b, "; ");
  put_bounds(b, "round_robin", rb);
  if (kb.lo > 0 && kb.lo >= rb.hi)
    kvr_buf_printf(b,
                   ": kv_aware's limit is higher (it passed %.2f req/s, where round_robin "
                   "failed).\n",
                   kb.lo);
  else if (rb.lo > 0 && rb.lo >= kb.hi)
    kvr_buf_printf(b,
                   ": round_robin's limit is higher (it passed %.2f req/s, where kv_aware "
                   "failed).\n",
                   rb.lo);
  else
    kvr_buf_puts(b, ": these levels do not tell which limit is higher.\n");
}

/* "st", "nd", "rd" or "th" after k. */
static const char *ordinal(size_t k) {
  if (k % 100 >= 11 && k % 100 <= 13)
    return "th";
  return k % 10 == 1 ? "st" : k % 10 == 2 ? "nd" : k % 10 == 3 ? "rd" : "th";
}

/* How far the real quantiles could move with other requests being the worst: the widest 95%
 * interval of any real level, below and above its figure. */
static void resolution(const kvr_demo_t *d, kvr_buf_t *b) {
  const char *qn;
  double q = kvr__demo_agree_q(d, &qn);
  double t[2] = {0, 0}, p[2] = {0, 0};
  size_t n = SIZE_MAX;
  for (size_t i = 0; i < d->nlv; i++) {
    const kvr__demo_lvl_t *l = &d->lv[i];
    if (!l->real || l->real_ttft <= 0 || l->real_tpot <= 0)
      continue;
    t[0] = fmax(t[0], 1 - l->real_ttft_lo / l->real_ttft);
    t[1] = fmax(t[1], l->real_ttft_hi / l->real_ttft - 1);
    p[0] = fmax(p[0], 1 - l->real_tpot_lo / l->real_tpot);
    p[1] = fmax(p[1], l->real_tpot_hi / l->real_tpot - 1);
    n = KVR_MIN(n, l->real_n);
  }
  if (n == SIZE_MAX)
    return;
  size_t worst = (size_t)llround((1 - q) * (double)n);
  worst = KVR_MAX(worst, (size_t)1);
  kvr_buf_printf(b,
                 "Each %s here is of %zu requests or more, about their %zu%s worst: over the "
                 "real run's own requests its 95%% interval (order statistics) reaches "
                 "-%.0f%%/+%.0f%% of the TTFT %s and -%.0f%%/+%.0f%% of the TPOT %s at the "
                 "widest level, and a difference inside that is which requests happened to be "
                 "the worst.\n",
                 qn, n, worst, ordinal(worst), t[0] * 100, t[1] * 100, qn, p[0] * 100, p[1] * 100,
                 qn);
  if (d->cli->quick)
    kvr_buf_puts(b, "--quick compares p90s: its levels are 60 s, and a 60 s level's p99, its few "
                    "worst requests, moves by up to 17% in virtual time alone when the network "
                    "delay moves by under a millisecond (which requests arrive in which order "
                    "changes: bench/run/demo_plan.c). The full demo's 360 s levels compare "
                    "p99s.\n");
}

static void agreement(kvr_demo_t *d, bool twin_ok, bool own_rates, kvr_buf_t *b) {
  qsort(d->lv, d->nlv, sizeof(kvr__demo_lvl_t), cmp_level);
  kvr_buf_printf(b,
                 "Real (time scale %s, %s workers on 127.0.0.1) vs virtual time, the same "
                 "levels (",
                 d->scale_s, d->workers_s);
  if (own_rates)
    kvr_buf_puts(b, "the caller's load");
  else
    kvr_buf_printf(b, "%s req/s: %s", d->rates_disp, d->rates_why);
  kvr_buf_printf(b, "; seed %s):\n\n", d->seed_s);
  const char *qn;
  kvr__demo_agree_q(d, &qn);
  kvr_buf_printf(b,
                 "| label | policy | rate | TTFT %s real | TTFT %s virtual | diff | TPOT %s "
                 "real | TPOT %s virtual | diff | real | virtual | turns >= 2 (real) |\n"
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|\n",
                 qn, qn, qn, qn);
  size_t both = 0, same = 0;
  kvr_buf_t differ = KVR_BUF_INIT;
  for (size_t i = 0; i < d->nlv; i++) {
    const kvr__demo_lvl_t *l = &d->lv[i];
    kvr_buf_printf(b, "| %s | %s | %.2f |", l->label, l->policy, l->rate);
    put_ms(b, l->real, l->real_ttft, 0);
    put_ms(b, l->virt, l->virt_ttft, 0);
    put_diff(b, l->real ? l->real_ttft : NAN, l->virt ? l->virt_ttft : NAN);
    put_ms(b, l->real, l->real_tpot, 1);
    put_ms(b, l->virt, l->virt_tpot, 1);
    put_diff(b, l->real ? l->real_tpot : NAN, l->virt ? l->virt_tpot : NAN);
    if (l->real)
      put_verdict(b, l->real_pass, l->real_interrupted ? "interrupted" : l->real_fail);
    else
      kvr_buf_puts(b, " - |");
    if (l->virt)
      put_verdict(b, l->virt_pass, l->virt_fail);
    else
      kvr_buf_puts(b, " - |");
    if (l->real && l->real_n)
      kvr_buf_printf(b, " %.0f%% of %zu (up to turn %u) |\n",
                     100.0 * (double)l->real_later / (double)l->real_n, l->real_n,
                     l->real_max_turn);
    else
      kvr_buf_puts(b, " - |\n");
    if (l->real && l->virt && !l->real_interrupted) {
      both++;
      if (l->real_pass == l->virt_pass)
        same++;
      else
        kvr_buf_printf(&differ, "%s%s at %.2f (real %s, virtual %s)", differ.len ? ", " : "",
                       l->policy, l->rate, l->real_pass ? "PASS" : "FAIL",
                       l->virt_pass ? "PASS" : "FAIL");
    }
  }
  kvr_buf_puts(b, "\nDiff: real / virtual - 1. ");
  if (both == 0)
    kvr_buf_printf(b, "No level was measured by both%s, so there is no agreement to report.\n",
                   twin_ok ? "" : " (the virtual run failed)");
  else if (same == both)
    kvr_buf_printf(b, "The virtual verdicts match the real ones at each of the %zu levels.\n",
                   both);
  else
    kvr_buf_printf(b,
                   "The virtual verdicts match the real ones at %zu of %zu levels; they differ "
                   "for %s.\n",
                   same, both, differ.data);
  kvr_buf_free(&differ);
  resolution(d, b);
  kvr__demo_cpu_note(d, b);
  kvr_buf_puts(b, "\n");
  headline(d, b);
}

static int write_agreement(kvr_demo_t *d, const kvr_buf_t *b) {
  char path[4400];
  snprintf(path, sizeof(path), "%s/AGREEMENT.md", d->cli->out);
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "kvrouter demo: %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(f,
          "# kvrouter demo: real vs virtual time\n\n%s\nFiles: virtual study %s/STUDY.md, real "
          "report %s/report.md, its virtual twin %s/report.md.\n",
          b->data, d->virt_out, d->real_out, d->agree_out);
  return fclose(f) == 0 ? 0 : 1;
}

int kvr_demo_agree(kvr_demo_t *d) {
  printf("\n== Step 3/3: agreement ==\n\n");
  fflush(stdout);
  int rc = run_twin(d);
  kvr_buf_t b = KVR_BUF_INIT;
  agreement(d, rc == 0,
            kvr__demo_extra_has(d, "--rates") || kvr__demo_extra_has(d, "--concurrency"), &b);
  fputs(b.data, stdout);
  int wrc = write_agreement(d, &b);
  kvr_buf_free(&b);
  printf("\nDemo done in %.0f s: %s/AGREEMENT.md; virtual study %s/STUDY.md; real report "
         "%s/report.md (charts report.html)\n",
         kvr__demo_now() - d->t0, d->cli->out, d->virt_out, d->real_out);
  return rc ? 1 : wrc;
}

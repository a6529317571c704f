/* fleet.c -- fleet sizing: the search over fleet sizes, the answer a run's levels give, the report.
 *
 * Structs: kvr_fleet_search_t (the search, fleet.h), kvr_fleet_answer_t (a run's answer),
 * kvr_fleet_info_t (the rate and bounds the report states). Nothing here owns memory beyond the
 * caller's buffers.
 *
 * Flow: the runner (bench/run/runner.c) runs kvr_fleet_search_t level by level; then
 * kvr_fleet_write() renders report.md (kvr_fleet_markdown), fleet.json (kvr_fleet_json), each
 * level's JSON (kvr_report_level_json, named by its fleet instead of its rate, which every level
 * shares) and requests.jsonl, and the runner prints kvr_fleet_summary(). Every figure is read
 * from the results: a level's fleet is its engine_workers, which the virtual cluster writes.
 *
 * Invariants: a run's levels are rendered in the order they ran ("step"), the answer is the
 * smallest passing fleet whatever the order; the sentences say "more than" or "at most" when the
 * levels do not pin the answer.
 */
#include "fleet.h"

#include "base/kvr.h"
#include "bench/report/report.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the search ------------------------------------------------------------------------------ */

void kvr_fleet_search_init(kvr_fleet_search_t *s, unsigned start, unsigned max) {
  memset(s, 0, sizeof(*s));
  s->max = max ? max : 1;
  s->x = KVR_MIN(KVR_MAX(start, 1u), s->max);
}

/* Bracket (double up from a fail, halve down from a pass) then bisect to adjacent fleets. */
void kvr_fleet_search_feed(kvr_fleet_search_t *s, bool pass) {
  unsigned x = s->x;
  if (pass)
    s->hi = s->hi ? KVR_MIN(s->hi, x) : x;
  else
    s->lo = KVR_MAX(s->lo, x);
  if (s->hi == 0) {
    s->done = x >= s->max; /* fails with the largest fleet */
    x = KVR_MIN(x * 2, s->max);
  } else if (s->lo == 0) {
    s->done = x <= 1; /* one worker serves it */
    x = KVR_MAX(x / 2, 1u);
  } else {
    s->done = s->hi <= s->lo + 1;
    x = s->lo + (s->hi - s->lo) / 2;
  }
  s->done |= ++s->steps >= 64;
  if (!s->done)
    s->x = x;
}

/* ---- a run's answer -------------------------------------------------------------------------- */

static const kvr_level_t *at_fleet(const kvr_run_t *run, unsigned workers) {
  for (size_t i = 0; i < run->nlevels; i++)
    if (run->levels[i]->engine_workers == workers)
      return run->levels[i];
  return NULL;
}

kvr_fleet_answer_t kvr_fleet_answer(const kvr_run_t *run) {
  kvr_fleet_answer_t a = {0, false, 0, run->nlevels};
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    unsigned w = (unsigned)lv->engine_workers;
    if (lv->pass && (a.workers == 0 || w < a.workers))
      a.workers = w;
    if (!lv->pass)
      a.most_failed = KVR_MAX(a.most_failed, w);
  }
  if (a.workers > 0) {
    const kvr_level_t *below = at_fleet(run, a.workers - 1);
    a.exact = a.workers == 1 || (below != NULL && !below->pass);
  }
  return a;
}

void kvr_fleet_answer_text(kvr_fleet_answer_t a, char *buf, size_t size) {
  if (a.tried == 0)
    snprintf(buf, size, "-");
  else if (a.workers == 0)
    snprintf(buf, size, "> %u", a.most_failed);
  else
    snprintf(buf, size, "%s%u", a.exact ? "" : "<= ", a.workers);
}

/* ---- sentences and tables -------------------------------------------------------------------- */

/* "6", "at most 6", "more than 64"; with unit, "... workers". */
static void fleet_words(kvr_fleet_answer_t a, bool unit, char *buf, size_t size) {
  unsigned n = a.workers ? a.workers : a.most_failed;
  snprintf(buf, size, "%s%u%s",
           a.workers == 0 ? "more than "
           : a.exact      ? ""
                          : "at most ",
           n,
           !unit            ? ""
           : a.workers == 1 ? " worker"
                            : " workers");
}

void kvr_fleet_headline(const kvr_results_t *res, kvr_buf_t *out) {
  if (res->nruns == 0)
    return;
  kvr_fleet_answer_t base = kvr_fleet_answer(&res->runs[0]);
  const char *bl = res->runs[0].label;
  char bw[64], bn[64], w[64];
  fleet_words(base, true, bw, sizeof(bw));
  fleet_words(base, false, bn, sizeof(bn));
  if (res->nruns == 1)
    kvr_buf_printf(out, base.workers ? "%s serves this traffic on %s\n" : "%s needs %s\n", bl, bw);
  for (size_t r = 1; r < res->nruns; r++) {
    kvr_fleet_answer_t a = kvr_fleet_answer(&res->runs[r]);
    fleet_words(a, true, w, sizeof(w));
    kvr_buf_printf(out,
                   a.workers ? "%s serves this traffic on %s where %s needs %s\n"
                             : "%s needs %s for this traffic, where %s needs %s\n",
                   res->runs[r].label, w, bl, bn);
  }
}

/* The traffic every fleet ran, as one sentence without its final stop. */
static void traffic(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out) {
  const kvr_trace_stats_t *t = res->trace;
  if (t != NULL)
    kvr_buf_printf(out, "the trace %s (%zu requests sent over %.0f s%s) at %s%.3g req/s", t->file,
                   t->sent, t->sent_span_s, t->windowed ? ", a window of it" : "",
                   fi->trace_rate ? "its own " : "", fi->rate);
  else
    kvr_buf_printf(out, "%s at %.3g req/s", res->workload ? res->workload : "the workload",
                   fi->rate);
  kvr_buf_printf(out, ", TTFT p99 under %g ms, TPOT p99 under %g ms", res->slo.ttft_p99_ms,
                 res->slo.tpot_p99_ms);
  if (res->slo.max_failed_frac > 0)
    kvr_buf_printf(out, ", at most %g%% failed", 100 * res->slo.max_failed_frac);
}

static void verdict(const kvr_level_t *lv, char *buf, size_t size) {
  char names[64];
  kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
  if (lv->pass)
    snprintf(buf, size, "pass");
  else
    snprintf(buf, size, "FAIL: %s%s", names, lv->stopped_early ? " (stopped early)" : "");
}

static double cached_share(const kvr_level_t *lv) {
  return lv->total_input ? (double)lv->total_cached / (double)lv->total_input : 0;
}

/* One run's table: a row per level in the order tried. md: Markdown pipes, else aligned text. */
static void run_table(const kvr_run_t *run, bool md, kvr_buf_t *out) {
  if (md)
    kvr_buf_puts(out, "| step | workers | verdict | TTFT p99 ms | TPOT p99 ms | completed | "
                      "failed | cached | preemptions | KV peak |\n"
                      "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  else
    kvr_buf_printf(out, "  %4s %7s  %-34s %11s %11s %9s %7s %7s\n", "step", "workers", "verdict",
                   "TTFT p99 ms", "TPOT p99 ms", "completed", "failed", "cached");
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    char v[96];
    verdict(lv, v, sizeof(v));
    if (md)
      kvr_buf_printf(out, "| %zu | %zu | %s | %.0f | %.1f | %zu | %zu | %.1f%% | %llu | %.0f%% |\n",
                     i + 1, lv->engine_workers, v, lv->ttft.p99, lv->tpot.p99, lv->completed,
                     lv->failed, 100 * cached_share(lv), (unsigned long long)lv->preemptions,
                     100 * lv->kv_usage_peak);
    else
      kvr_buf_printf(out, "  %4zu %7zu  %-34s %11.0f %11.1f %9zu %7zu %6.1f%%\n", i + 1,
                     lv->engine_workers, v, lv->ttft.p99, lv->tpot.p99, lv->completed, lv->failed,
                     100 * cached_share(lv));
  }
}

static void search_words(const kvr_fleet_info_t *fi, kvr_buf_t *out) {
  kvr_buf_printf(out,
                 "the search starts at %u worker%s, doubles the fleet while it fails (at most "
                 "%u), halves it while it passes, then bisects until the largest failing and the "
                 "smallest passing fleet are adjacent; every fleet is a fresh cluster at the same "
                 "rate and seed, so every fleet meets the same requests",
                 fi->start, fi->start == 1 ? "" : "s", fi->max);
}

void kvr_fleet_summary(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out) {
  kvr_buf_puts(out, "Fleet sizing (virtual time): ");
  traffic(res, fi, out);
  kvr_buf_puts(out, ".\n");
  kvr_fleet_headline(res, out);
  for (size_t r = 0; r < res->nruns; r++) {
    char a[32];
    kvr_fleet_answer_text(kvr_fleet_answer(&res->runs[r]), a, sizeof(a));
    kvr_buf_printf(out, "%s: %s workers\n", res->runs[r].label, a);
    run_table(&res->runs[r], false, out);
  }
}

void kvr_fleet_markdown(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out) {
  kvr_buf_puts(out, "# ");
  kvr_report_title(res, out);
  kvr_buf_puts(out, "\n\n");
  kvr_buf_t head = KVR_BUF_INIT;
  kvr_fleet_headline(res, &head);
  for (char *line = head.data; line != NULL && *line;) {
    char *nl = strchr(line, '\n');
    kvr_buf_printf(out, "**%.*s.**\n", (int)(nl ? nl - line : (long)strlen(line)), line);
    line = nl ? nl + 1 : NULL;
  }
  kvr_buf_free(&head);
  kvr_buf_puts(out, "\nPer policy, the smallest number of workers that serves ");
  traffic(res, fi, out);
  kvr_buf_puts(out, ": ");
  search_words(fi, out);
  kvr_buf_puts(out, ".\n\n| policy | workers needed | fleets tried (P pass, F fail) |\n"
                    "|---|---:|---|\n");
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_run_t *run = &res->runs[r];
    char a[32];
    kvr_fleet_answer_text(kvr_fleet_answer(run), a, sizeof(a));
    kvr_buf_printf(out, "| %s | %s |", run->label, a);
    for (size_t i = 0; i < run->nlevels; i++)
      kvr_buf_printf(out, "%s%zu %s", i ? ", " : " ", run->levels[i]->engine_workers,
                     run->levels[i]->pass ? "P" : "F");
    kvr_buf_puts(out, " |\n");
  }
  kvr_buf_printf(out, "\n- Command: `%s`\n- Generated: %s\n", res->command ? res->command : "",
                 res->generated ? res->generated : "");
  if (res->virtual_desc)
    kvr_buf_printf(out, "- Clock: virtual; the first fleet: %s\n", res->virtual_desc);
  if (res->workload_desc)
    kvr_buf_printf(out, "- Workload: %s\n", res->workload_desc);
  const kvr_trace_stats_t *t = res->trace;
  if (t != NULL)
    kvr_buf_printf(
        out,
        "- Trace: %s, %zu requests in the window, %zu sent (%zu over the workers' "
        "context of %llu tokens); an infinite cache holds %.1f%% of the sent input "
        "tokens\n",
        t->file, t->requests, t->sent, t->over_context, (unsigned long long)t->max_context,
        t->sent_input_tokens ? 100.0 * (double)t->sent_tokens_seen / (double)t->sent_input_tokens
                             : 0.0);
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_run_t *run = &res->runs[r];
    kvr_buf_printf(out, "\n## %s\n\n%s; levels in the order tried.\n\n", run->label,
                   run->description);
    run_table(run, true, out);
  }
  kvr_buf_puts(out, "\nEach level's figures: results/<label>_w<workers>.json; every request: "
                    "requests.jsonl.\n");
}

void kvr_fleet_json(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out) {
  kvr_buf_printf(out,
                 "{\"virtual\":true,\"rate\":%.6g,\"trace_rate\":%s,\"start\":%u,\"max\":%u,"
                 "\"slo\":{\"ttft_p99_ms\":%g,\"tpot_p99_ms\":%g,\"max_failed_frac\":%g},"
                 "\"seed\":%llu,\"policies\":[",
                 fi->rate, fi->trace_rate ? "true" : "false", fi->start, fi->max,
                 res->slo.ttft_p99_ms, res->slo.tpot_p99_ms, res->slo.max_failed_frac,
                 (unsigned long long)res->seed);
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_run_t *run = &res->runs[r];
    kvr_fleet_answer_t a = kvr_fleet_answer(run);
    kvr_buf_printf(out,
                   "%s{\"label\":\"%s\",\"policy\":\"%s\",\"workers\":%u,\"exact\":%s,"
                   "\"most_failed\":%u,\"levels\":[",
                   r ? "," : "", run->label, run->policy, a.workers, a.exact ? "true" : "false",
                   a.most_failed);
    for (size_t i = 0; i < run->nlevels; i++) {
      const kvr_level_t *lv = run->levels[i];
      char names[64];
      kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
      kvr_buf_printf(out,
                     "%s{\"workers\":%zu,\"pass\":%s,\"failing\":\"%s\",\"stopped_early\":%s,"
                     "\"ttft_p99_ms\":%.3f,\"tpot_p99_ms\":%.3f,\"completed\":%zu,\"failed\":%zu,"
                     "\"cached_share\":%.4f}",
                     i ? "," : "", lv->engine_workers, lv->pass ? "true" : "false", names,
                     lv->stopped_early ? "true" : "false", lv->ttft.p99, lv->tpot.p99,
                     lv->completed, lv->failed, cached_share(lv));
    }
    kvr_buf_puts(out, "]}");
  }
  kvr_buf_puts(out, "]}\n");
}

/* ---- files ----------------------------------------------------------------------------------- */

/* A label made safe for a file name (as the report's own files do). */
static void safe_name(const char *s, char *out, size_t size) {
  size_t i = 0;
  for (; *s && i + 1 < size; s++)
    out[i++] = (char)((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                              (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'
                          ? *s
                          : '_');
  out[i] = '\0';
}

static int write_into(const char *dir, const char *name, const kvr_buf_t *b, char *err,
                      size_t errlen) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  return kvr_report_write_file(path, b, err, errlen);
}

int kvr_fleet_write(const kvr_results_t *res, const kvr_fleet_info_t *fi, const char *dir,
                    char *err, size_t errlen) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/results", dir);
  int rc = kvr_report_mkdir_p(path, err, errlen);
  kvr_buf_t b = KVR_BUF_INIT;
  if (rc == 0) {
    kvr_fleet_markdown(res, fi, &b);
    rc = write_into(dir, "report.md", &b, err, errlen);
  }
  if (rc == 0) {
    kvr_buf_reset(&b);
    kvr_fleet_json(res, fi, &b);
    rc = write_into(dir, "fleet.json", &b, err, errlen);
  }
  if (rc == 0) {
    kvr_buf_reset(&b);
    for (size_t r = 0; r < res->nruns; r++)
      for (size_t i = 0; i < res->runs[r].nlevels; i++)
        kvr_report_jsonl(&res->runs[r], res->runs[r].levels[i], &b);
    rc = write_into(dir, "requests.jsonl", &b, err, errlen);
  }
  for (size_t r = 0; rc == 0 && r < res->nruns; r++)
    for (size_t i = 0; rc == 0 && i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      char label[128], name[256];
      safe_name(res->runs[r].label, label, sizeof(label));
      kvr_buf_reset(&b);
      kvr_report_level_json(res, &res->runs[r], lv, &b);
      snprintf(name, sizeof(name), "results/%s_w%zu.json", label, lv->engine_workers);
      rc = write_into(dir, name, &b, err, errlen);
    }
  kvr_buf_free(&b);
  return rc;
}

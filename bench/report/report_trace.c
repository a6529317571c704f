/* report_trace.c -- the report's trace section: a trace workload's own figures (requests, span,
 * mean rate, input and output lengths, the hit rate of an infinite cache, the requests held back
 * by the workers' context) beside the cached share each run achieved.
 *
 * Written once as format-neutral blocks (report_int.h), like report_sections.c, which calls it
 * after the configuration when res->trace is set; kvr__trace_json() gives the same figures to each
 * level's results JSON.
 *
 * Structs: none of its own; the figures are kvr_trace_stats_t (bench/loadgen/stats.h), filled from
 * the trace file by bench/loadgen/trace_replay.c.
 *
 * Invariants: every share names what it is a share of (blocks, input tokens, the sent requests);
 * the infinite cache is the ceiling a policy's cached share is read against: the same requests, in
 * the same order, on one cache that never evicts and never misses what an earlier request carried.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define B KVR__STRONG
#define C KVR__CODE
#define DASH KVR__DASH

/* 100 * a / b, 0 when b is 0. */
static double pct(uint64_t a, uint64_t b) {
  return b ? 100.0 * (double)a / (double)b : 0;
}

/* "12,345": thousands separated, as the report's prose writes counts. */
static void fmt_count(double v, char *buf, size_t size) {
  char digits[32];
  snprintf(digits, sizeof(digits), "%.0f", v < 0 ? 0 : v);
  size_t n = strlen(digits), o = 0;
  for (size_t i = 0; i < n && o + 2 < size; i++) {
    if (i > 0 && (n - i) % 3 == 0)
      buf[o++] = ',';
    buf[o++] = digits[i];
  }
  buf[o] = '\0';
}

static void row(kvr__doc_t *d, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void row(kvr__doc_t *d, const char *name, const char *fmt, ...) {
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

/* "mean 15,325, p50 9,000, p99 90,000, max 191,378" */
static void fmt_dist(const kvr_dist_t *dd, char *buf, size_t size) {
  char m[32], p50[32], p99[32], mx[32];
  fmt_count(dd->mean, m, sizeof(m));
  fmt_count(dd->p50, p50, sizeof(p50));
  fmt_count(dd->p99, p99, sizeof(p99));
  fmt_count(dd->max, mx, sizeof(mx));
  snprintf(buf, size, "mean %s, p50 %s, p99 %s, max %s", m, p50, p99, mx);
}

static void figures(const kvr_trace_stats_t *t, kvr__doc_t *d) {
  char a[64], b[64], c[160];
  kvr__doc_table(d, "|--------|-------|");
  row(d, "Figure", "The trace");
  fmt_count((double)t->file_requests, a, sizeof(a));
  row(d, "File", C "%s" C " (%s requests)", t->file, a);
  if (!t->windowed)
    row(d, "Window", "the whole trace");
  else if (t->window_end_s >= 0)
    row(d, "Window", "requests arriving in [%g, %g) s", t->window_start_s, t->window_end_s);
  else
    row(d, "Window", "requests arriving from %g s on", t->window_start_s);
  fmt_count((double)t->requests, a, sizeof(a));
  fmt_count(t->span_s, b, sizeof(b));
  row(d, "Requests", "%s over %s s: mean rate %.2f req/s", a, b, t->mean_rate);
  fmt_dist(&t->input, c, sizeof(c));
  row(d, "Input tokens per request", "%s", c);
  fmt_dist(&t->output, c, sizeof(c));
  row(d, "Output tokens per request", "%s", c);
  fmt_count((double)t->blocks, a, sizeof(a));
  row(d, "Hash blocks", "%s of %u tokens", a, t->block_tokens);
  row(d, "Infinite-cache hit rate",
      "%.1f%% of blocks seen earlier in the trace (%.1f%% of input tokens)",
      pct(t->blocks_seen, t->blocks), pct(t->tokens_seen, t->input_tokens));
  fmt_count(t->shared.p50, a, sizeof(a));
  fmt_count(t->shared.p90, b, sizeof(b));
  fmt_count(t->shared.max, c, sizeof(c));
  row(d, "Shared prefix per request",
      "none for %.0f%% of requests; p50 %s, p90 %s, max %s tokens seen earlier",
      t->requests ? 100.0 * (double)t->shared_none / (double)t->requests : 0, a, b, c);
  if (t->max_context) {
    fmt_count((double)t->max_context, a, sizeof(a));
    row(d, "Longer than the workers' context",
        "%zu request%s (input + output over %s tokens): counted here, not sent", t->over_context,
        t->over_context == 1 ? "" : "s", a);
  } else {
    row(d, "Longer than the workers' context",
        "not known (the endpoint gave no max_model_len): every request is sent");
  }
  fmt_count((double)t->sent, a, sizeof(a));
  fmt_count(t->sent_span_s, b, sizeof(b));
  row(d, "Sent at every level",
      "%s request%s over %s s (%.2f req/s: the rate each level compresses or stretches to its "
      "own); an infinite cache holds %.1f%% of their input tokens",
      a, t->sent == 1 ? "" : "s", b, t->sent_rate, pct(t->sent_tokens_seen, t->sent_input_tokens));
  kvr__doc_table_end(d);
}

static double cached_pct(const kvr_level_t *lv) {
  return pct(lv->total_cached, lv->total_input);
}

/* The run's level the comparison reads: at its max SLO-compliant load, else its lowest load. */
static const kvr_level_t *run_level(const kvr_run_t *run) {
  kvr_report_cap_t cap = kvr_report_cap(run);
  const kvr_level_t *at = cap.load > 0 ? kvr__find_load(run, cap.load) : NULL;
  if (at != NULL)
    return at;
  for (size_t i = 0; i < run->nlevels; i++)
    if (run->levels[i]->usage_requests > 0 && (at == NULL || run->levels[i]->rate < at->rate))
      at = run->levels[i];
  return at;
}

static void cached_table(const kvr_results_t *res, kvr__doc_t *d) {
  const kvr_trace_stats_t *t = res->trace;
  double ideal = pct(t->sent_tokens_seen, t->sent_input_tokens);
  kvr__doc_table(d, "|-----|------:|-----:|-----:|------:|");
  kvr__doc_cell(d, "Run");
  kvr__doc_cell(d, "Rate (RPS)");
  kvr__doc_cell(d, "Cached tokens (%% of prompt)");
  kvr__doc_cell(d, "Lowest-highest over its levels");
  kvr__doc_cell(d, "Share of the infinite cache's %.1f%%", ideal);
  kvr__doc_row_end(d);
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_run_t *run = &res->runs[r];
    char name[160];
    kvr__run_name(run, name, sizeof(name));
    const kvr_level_t *at = run_level(run);
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < run->nlevels; i++)
      if (run->levels[i]->usage_requests > 0) {
        lo = fmin(lo, cached_pct(run->levels[i]));
        hi = fmax(hi, cached_pct(run->levels[i]));
      }
    kvr__doc_cell(d, "%s", name);
    if (at == NULL || at->usage_requests == 0) {
      kvr__doc_cell(d, DASH);
      kvr__doc_cell(d, DASH);
      kvr__doc_cell(d, DASH);
      kvr__doc_cell(d, DASH);
    } else {
      char load[32];
      kvr__fmt_load(res, at->rate, load, sizeof(load));
      kvr__doc_cell(d, "%s", load);
      kvr__doc_cell(d, "%.1f%%", cached_pct(at));
      kvr__doc_cell(d, "%.1f-%.1f%%", lo, hi);
      if (ideal > 0)
        kvr__doc_cell(d, "%.0f%%", 100.0 * cached_pct(at) / ideal);
      else
        kvr__doc_cell(d, DASH);
    }
    kvr__doc_row_end(d);
  }
  kvr__doc_table_end(d);
}

void kvr__report_trace(const kvr_results_t *res, kvr__doc_t *d) {
  const kvr_trace_stats_t *t = res->trace;
  if (t == NULL)
    return;
  kvr__doc_h(d, 2, "Trace");
  kvr__doc_p(d,
             "The workload replays the prefix-hashed trace " C "%s" C
             ": every request's prompt is synthesised from its hash ids (block k from its id and "
             "position alone, %u tokens of text per id) so that two requests share exactly the "
             "leading blocks their id lists share, with the trace's input and output lengths; a "
             "level sends the window's requests from the first, at the trace's own arrival "
             "times compressed or stretched to the level's rate. The trace's own figures:",
             t->file, t->block_tokens);
  figures(t, d);
  kvr__doc_p(d,
             "Cached share against the infinite cache: each run's cached prompt tokens (the "
             "workers' usage) at its max SLO-compliant rate (its lowest rate when none passed), "
             "read against what one cache that never evicts would hold of the same requests "
             "(the sent ones, blocks seen in an earlier sent request). Warm-up requests, when "
             "any, and failed ones are outside the run's figure but inside the infinite cache's.");
  cached_table(res, d);
}

void kvr__trace_json(cJSON *k, const kvr_results_t *res, const kvr_level_t *lv) {
  const kvr_trace_stats_t *t = res->trace;
  if (t == NULL) {
    cJSON_AddNullToObject(k, "trace");
    return;
  }
  cJSON *o = cJSON_AddObjectToObject(k, "trace");
  cJSON_AddStringToObject(o, "file", t->file);
  cJSON_AddNumberToObject(o, "block_tokens", t->block_tokens);
  if (t->windowed) {
    cJSON_AddNumberToObject(o, "window_start_s", t->window_start_s);
    if (t->window_end_s >= 0)
      cJSON_AddNumberToObject(o, "window_end_s", t->window_end_s);
    else
      cJSON_AddNullToObject(o, "window_end_s");
  }
  cJSON_AddNumberToObject(o, "file_requests", (double)t->file_requests);
  cJSON_AddNumberToObject(o, "requests", (double)t->requests);
  cJSON_AddNumberToObject(o, "span_s", t->span_s);
  cJSON_AddNumberToObject(o, "mean_rate", t->mean_rate);
  cJSON_AddNumberToObject(o, "input_mean", t->input.mean);
  cJSON_AddNumberToObject(o, "input_max", t->input.max);
  cJSON_AddNumberToObject(o, "output_mean", t->output.mean);
  cJSON_AddNumberToObject(o, "output_max", t->output.max);
  cJSON_AddNumberToObject(o, "blocks", (double)t->blocks);
  cJSON_AddNumberToObject(o, "infinite_cache_block_share",
                          t->blocks ? (double)t->blocks_seen / (double)t->blocks : 0);
  cJSON_AddNumberToObject(o, "infinite_cache_token_share",
                          t->input_tokens ? (double)t->tokens_seen / (double)t->input_tokens : 0);
  cJSON_AddNumberToObject(o, "max_context", (double)t->max_context);
  cJSON_AddNumberToObject(o, "over_context", (double)t->over_context);
  cJSON_AddNumberToObject(o, "sent", (double)t->sent);
  cJSON_AddNumberToObject(o, "sent_rate", t->sent_rate);
  cJSON_AddNumberToObject(
      o, "sent_infinite_cache_token_share",
      t->sent_input_tokens ? (double)t->sent_tokens_seen / (double)t->sent_input_tokens : 0);
  /* This level's cached share, to be read against the line above. */
  if (lv->total_input)
    cJSON_AddNumberToObject(o, "cached_token_share",
                            (double)lv->total_cached / (double)lv->total_input);
  else
    cJSON_AddNullToObject(o, "cached_token_share");
}

/* report_json.c -- the machine-readable results: one JSON object per level, keyed like
 * `vllm bench serve --save-result` (vllm_head, request_arrays, vllm_tail), plus a "kvrouter"
 * object with the figures vllm does not have; the file name vllm gives that object
 * (kvr__vllm_result_name); and one JSON line per request.
 *
 * Structs: none of its own; cJSON objects are built from a kvr_level_t and freed after printing.
 *
 * Invariants: every vllm key present has vllm's meaning and JSON type (a float is written with a
 * decimal point, as Python's json writes one), in vllm's order; a --save-result file differs from
 * vllm's only by keys vllm would write with other flags (the percentiles and metrics of kvrouter's
 * defaults: --metric-percentiles 50,90,95,99 --percentile-metrics ttft,tpot,itl,e2el) and by the
 * per-request arrays kept without --save-detailed (input_lens, output_lens, ttfts, start_times,
 * errors); itls and generated_texts, which need every token, are written with --save-detailed
 * only. Warm-up and cool-down requests are left out of the per-level arrays (and of the kvrouter
 * object's cached_lens, e2els, tpots, turns, all aligned: entry i of each is the same measured
 * request, in send order, as vllm keeps its dispatch order) and kept, flagged, in the JSONL
 * (completion order); the engine figures are null when no worker's /metrics was read.
 *
 * Source of the vllm keys and their meaning: vllm/benchmarks/serve.py (calculate_metrics(),
 * benchmark()'s result dict, main_async()'s result_json, compute_result_filename()) in
 * vllm-project/vllm at commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Python's str() of a float (its shortest repr): "4.0", "0.5", "1e-05", "inf". */
static void py_float(double x, char *buf, size_t size) {
  if (!isfinite(x)) {
    snprintf(buf, size, "%s", isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
    return;
  }
  char e[40];
  int prec = 1;
  for (; prec < 17; prec++) {
    snprintf(e, sizeof(e), "%.*e", prec - 1, x);
    if (strtod(e, NULL) == x)
      break;
  }
  snprintf(e, sizeof(e), "%.*e", prec - 1, x);
  char *ep = strchr(e, 'e');
  int exp = atoi(ep + 1);
  if (exp < -4 || exp >= 16) {
    snprintf(buf, size, "%.*se%c%02d", (int)(ep - e), e, exp < 0 ? '-' : '+', abs(exp));
    return;
  }
  int decimals = prec - 1 - exp;
  if (decimals > 0)
    snprintf(buf, size, "%.*f", decimals, x);
  else
    snprintf(buf, size, "%.0f.0", x);
}

/* A JSON float as Python's json writes one (never an integer literal), so vllm's float keys stay
 * floats to a reader. Not finite: null. */
static cJSON *float_item(double x) {
  char b[48];
  if (!isfinite(x))
    return cJSON_CreateNull();
  py_float(x, b, sizeof(b));
  return cJSON_CreateRaw(b);
}

static void add_float(cJSON *o, const char *key, double x) {
  cJSON_AddItemToObject(o, key, float_item(x));
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

/* vllm's request_goodput: completed measured requests meeting every goodput SLO, per second of the
 * measured window (duration). vllm's SLOs are --goodput ttft:MS tpot:MS e2el:MS, a request being
 * good when each figure is <= its SLO, with TPOT 0 under 2 output tokens; without --goodput they
 * are kvrouter's TTFT and TPOT SLO thresholds (an unset one, <= 0, is left out). A completed
 * request with no first token cannot show its TTFT met and is not counted. -1 (written null) when
 * no SLO is set, as vllm writes None without --goodput, or when the window is empty. */
static double request_goodput(const kvr_slo_t *slo, const kvr_level_t *lv) {
  const kvr_result_opts_t *g = &lv->result;
  double ttft = g->goodput ? g->goodput_ms[0] : (slo->ttft_p99_ms > 0 ? slo->ttft_p99_ms : -1);
  double tpot = g->goodput ? g->goodput_ms[1] : (slo->tpot_p99_ms > 0 ? slo->tpot_p99_ms : -1);
  double e2el = g->goodput ? g->goodput_ms[2] : -1;
  if ((ttft < 0 && tpot < 0 && e2el < 0) || lv->duration_s <= 0)
    return -1;
  size_t good = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok)
      continue;
    if (ttft >= 0 && !(r->ttft_ms >= 0 && r->ttft_ms <= ttft))
      continue;
    if (tpot >= 0 && (r->tpot_ms >= 0 ? r->tpot_ms : 0) > tpot)
      continue;
    if (e2el >= 0 && r->e2e_ms > e2el)
      continue;
    good++;
  }
  return (double)good / lv->duration_s;
}

/* vllm's max_output_tokens_per_s: the most output tokens that arrived within one 1-s bucket, the
 * buckets counted from the earliest send of a completed measured request (report seconds).
 * vllm places each token (each streamed chunk) from the request's start, TTFT and ITLs; so does
 * this with --save-detailed, which keeps every ITL. Otherwise the records keep an ITL count, mean
 * and max only, so this places a request's first token at sent + TTFT, exactly, and spreads its
 * other output_tokens - 1 evenly up to sent + E2E: the figure vllm would get were each request's
 * ITLs equal, an estimate otherwise. 0 when no measured request completed, as vllm. */
static double max_output_tokens_per_s(const kvr_level_t *lv) {
  double t0 = 0, t1 = 0;
  bool any = false;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok)
      continue;
    double end = r->sent_s + r->e2e_ms / 1000.0;
    if (!any || r->sent_s < t0)
      t0 = r->sent_s;
    if (!any || end > t1)
      t1 = end;
    any = true;
  }
  if (!any || !(t1 >= t0))
    return 0;
  size_t nb = (size_t)ceil(t1 - t0) + 1;
  uint64_t *bucket = kvr_xcalloc(nb, sizeof(*bucket));
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok || r->ttft_ms < 0 || r->output_tokens == 0)
      continue;
    double first = r->sent_s + r->ttft_ms / 1000.0, last = r->sent_s + r->e2e_ms / 1000.0;
    if (r->itl_ms != NULL) {
      double t = first;
      for (uint32_t k = 0; k <= r->n_itl; k++) {
        t += k > 0 ? r->itl_ms[k - 1] / 1000.0 : 0;
        if (t - t0 >= 0 && t - t0 < (double)nb)
          bucket[(size_t)(t - t0)]++;
      }
      continue;
    }
    double step = r->output_tokens > 1 ? (last - first) / (r->output_tokens - 1) : 0;
    for (uint32_t k = 0; k < r->output_tokens; k++) {
      double off = first + k * step - t0;
      if (off >= 0 && off < (double)nb)
        bucket[(size_t)off]++;
    }
  }
  uint64_t peak = 0;
  for (size_t b = 0; b < nb; b++)
    if (bucket[b] > peak)
      peak = bucket[b];
  free(bucket);
  return (double)peak;
}

void kvr__vllm_date(const kvr_results_t *res, char *buf, size_t size) {
  struct tm tm;
  memset(&tm, 0, sizeof(tm));
  time_t t = time(NULL);
  if (res->generated != NULL && sscanf(res->generated, "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon,
                                       &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec) == 6) {
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    t = timegm(&tm); /* generated is UTC; vllm writes its local time */
  }
  localtime_r(&t, &tm);
  strftime(buf, size, "%Y%m%d-%H%M%S", &tm);
}

/* vllm's --backend: as given, else the one that sends this API. */
static const char *backend_name(const kvr_results_t *res, const kvr_level_t *lv) {
  if (lv->result.backend != NULL)
    return lv->result.backend;
  return res->api && strcmp(res->api, "completions") == 0 ? "openai" : "openai-chat";
}

/* vllm's max_concurrency: the in-flight cap, or the users of a closed loop (at most that many in
 * flight); 0 = none (null). */
static unsigned level_max_concurrency(const kvr_level_t *lv) {
  if (lv->concurrency && lv->max_concurrency)
    return KVR_MIN(lv->concurrency, lv->max_concurrency);
  return lv->concurrency ? lv->concurrency : lv->max_concurrency;
}

/* vllm's request_rate is its --request-rate: "inf" when every request may go at once (its
 * default, a closed loop's users, a trace at its own times), else the level's rate. */
static bool rate_inf(const kvr_level_t *lv) {
  return lv->concurrency || lv->self_timed || isinf(lv->rate);
}

void kvr__vllm_result_name(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                           char *buf, size_t size) {
  /* compute_result_filename(): {label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json,
   * label defaulting to the backend (kvrouter's default run label, "bench", stands for none). */
  const char *label =
      res->nruns == 1 && strcmp(run->label, "bench") == 0 ? backend_name(res, lv) : run->label;
  char rate[48], conc[32], date[32];
  if (rate_inf(lv))
    snprintf(rate, sizeof(rate), "inf");
  else
    py_float(lv->rate, rate, sizeof(rate));
  unsigned mc = level_max_concurrency(lv);
  if (mc)
    snprintf(conc, sizeof(conc), "-concurrency%u", mc);
  else
    conc[0] = '\0';
  const char *model = res->model ? res->model : "";
  const char *base = strrchr(model, '/');
  kvr__vllm_date(res, date, sizeof(date));
  snprintf(buf, size, "%s-%sqps%s-%s-%s.json", label, rate, conc, base ? base + 1 : model, date);
}

/* --metadata KEY=VALUE pairs, as vllm adds them: string keys after num_prompts. */
static void add_metadata(cJSON *o, const char *md) {
  for (const char *p = md; *p;) {
    size_t n = strcspn(p, "\n");
    const char *eq = memchr(p, '=', n);
    if (eq != NULL) {
      char key[256], val[512];
      snprintf(key, sizeof(key), "%.*s", (int)(eq - p), p);
      snprintf(val, sizeof(val), "%.*s", (int)(n - (size_t)(eq - p) - 1), eq + 1);
      cJSON_DeleteItemFromObjectCaseSensitive(o, key);
      cJSON_AddStringToObject(o, key, val);
    }
    p += n + (p[n] == '\n');
  }
}

/* The keys main_async() writes before the benchmark's result, then the result's figures up to its
 * per-request arrays, with vllm's meaning and types. */
static void vllm_head(cJSON *o, const kvr_results_t *res, const kvr_run_t *run,
                      const kvr_level_t *lv) {
  const char *backend = backend_name(res, lv);
  char date[32];
  kvr__vllm_date(res, date, sizeof(date));
  cJSON_AddStringToObject(o, "date", date);
  /* vllm writes its --backend under both names ("endpoint_type" for backward compatibility). */
  cJSON_AddStringToObject(o, "endpoint_type", backend);
  cJSON_AddStringToObject(o, "backend", backend);
  cJSON_AddStringToObject(o, "label", run->label);
  cJSON_AddStringToObject(o, "model_id", res->model ? res->model : "");
  /* vllm's tokenizer defaults to the model; kvrouter counts tokens from usage, with no tokenizer
   * of its own, so the model name is the tokenizer it stands for. */
  if (res->model)
    cJSON_AddStringToObject(o, "tokenizer_id", res->model);
  else
    cJSON_AddNullToObject(o, "tokenizer_id");
  /* vllm's --num-prompts: the requests of the benchmark, each one an entry of the arrays */
  cJSON_AddNumberToObject(o, "num_prompts", (double)lv->measured);
  add_metadata(o, lv->result.metadata);
  if (rate_inf(lv))
    cJSON_AddStringToObject(o, "request_rate", "inf");
  else
    add_float(o, "request_rate", lv->rate);
  add_float(o, "burstiness", res->burstiness);
  unsigned mc = level_max_concurrency(lv);
  if (mc)
    cJSON_AddNumberToObject(o, "max_concurrency", mc);
  else
    cJSON_AddNullToObject(o, "max_concurrency");
  add_float(o, "duration", lv->duration_s);
  cJSON_AddNumberToObject(o, "completed", (double)lv->completed);
  cJSON_AddNumberToObject(o, "failed", (double)lv->failed);
  cJSON_AddNumberToObject(o, "total_input_tokens", (double)lv->total_input);
  cJSON_AddNumberToObject(o, "total_output_tokens", (double)lv->total_output);
  add_float(o, "request_throughput", lv->request_throughput);
  double goodput = request_goodput(&res->slo, lv);
  if (goodput >= 0)
    add_float(o, "request_goodput", goodput);
  else
    cJSON_AddNullToObject(o, "request_goodput");
  add_float(o, "output_throughput", lv->output_throughput);
  add_float(o, "total_token_throughput", lv->total_token_throughput);
}

/* The level send_order() sorts (qsort has no context), one per thread: `kvrouter bench study`
 * writes its cells' reports from several threads at once, and a shared pointer let one cell's
 * sort read another's records (a segfault when two agentic-responses cells ended together). */
static _Thread_local const kvr_level_t *g_sort_lv;

static int cmp_seq(const void *a, const void *b) {
  const kvr_req_rec_t *x = &g_sort_lv->recs[*(const size_t *)a];
  const kvr_req_rec_t *y = &g_sort_lv->recs[*(const size_t *)b];
  if (x->seq != y->seq)
    return x->seq < y->seq ? -1 : 1;
  return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* The measured records of lv in send order (vllm's arrays follow its dispatch order): an owned
 * array of *n indices into lv->recs. */
static size_t *send_order(const kvr_level_t *lv, size_t *n) {
  size_t *idx = kvr_xmalloc((lv->nrecs ? lv->nrecs : 1) * sizeof(size_t));
  *n = 0;
  for (size_t i = 0; i < lv->nrecs; i++)
    if (!lv->recs[i].warmup)
      idx[(*n)++] = i;
  g_sort_lv = lv;
  qsort(idx, *n, sizeof(size_t), cmp_seq);
  g_sort_lv = NULL;
  return idx;
}

/* vllm's per-request arrays in o (seconds, as vllm writes them; ttfts and latencies 0 when the
 * request failed or had no token, output_lens 0 when it failed, as vllm's defaults; start_times
 * from the level's start where vllm's are perf_counter() readings: only differences compare;
 * queue_times the wait from its arrival to its send: a --max-concurrency slot) and, aligned with
 * them, the ones vllm lacks in k (cached tokens, E2E and TPOT in ms, TPOT -1 under 2 tokens,
 * 1-based turn); measured requests only, in send order. itls and generated_texts with
 * --save-detailed only, as vllm. */
static void request_arrays(cJSON *o, cJSON *k, const kvr_level_t *lv) {
  bool detailed = lv->result.save_detailed;
  cJSON *in = cJSON_AddArrayToObject(o, "input_lens");
  cJSON *outl = cJSON_AddArrayToObject(o, "output_lens");
  cJSON *ttfts = cJSON_AddArrayToObject(o, "ttfts");
  cJSON *itls = detailed ? cJSON_AddArrayToObject(o, "itls") : NULL;
  cJSON *lats = cJSON_AddArrayToObject(o, "latencies");
  cJSON *starts = cJSON_AddArrayToObject(o, "start_times");
  cJSON *queues = cJSON_AddArrayToObject(o, "queue_times");
  cJSON *texts = detailed ? cJSON_AddArrayToObject(o, "generated_texts") : NULL;
  cJSON *errs = cJSON_AddArrayToObject(o, "errors");
  cJSON *cached = cJSON_AddArrayToObject(k, "cached_lens");
  cJSON *e2els = cJSON_AddArrayToObject(k, "e2els");
  cJSON *tpots = cJSON_AddArrayToObject(k, "tpots");
  cJSON *turns = cJSON_AddArrayToObject(k, "turns");
  size_t n;
  size_t *idx = send_order(lv, &n);
  for (size_t j = 0; j < n; j++) {
    const kvr_req_rec_t *r = &lv->recs[idx[j]];
    cJSON_AddItemToArray(in, cJSON_CreateNumber(r->prompt_tokens));
    cJSON_AddItemToArray(outl, cJSON_CreateNumber(r->ok ? r->output_tokens : 0));
    cJSON_AddItemToArray(ttfts, float_item(r->ttft_ms >= 0 ? r->ttft_ms / 1000.0 : 0));
    if (itls != NULL) {
      cJSON *one = cJSON_CreateArray();
      for (uint32_t t = 0; r->itl_ms != NULL && t < r->n_itl; t++)
        cJSON_AddItemToArray(one, float_item(r->itl_ms[t] / 1000.0));
      cJSON_AddItemToArray(itls, one);
    }
    cJSON_AddItemToArray(lats, float_item(r->ok ? r->e2e_ms / 1000.0 : 0));
    cJSON_AddItemToArray(starts, float_item(r->sent_s));
    cJSON_AddItemToArray(queues, float_item(fmax(0, r->sent_s - r->arrival_s)));
    if (texts != NULL)
      cJSON_AddItemToArray(texts, cJSON_CreateString(r->text ? r->text : ""));
    cJSON_AddItemToArray(errs, cJSON_CreateString(r->error));
    cJSON_AddItemToArray(cached, cJSON_CreateNumber(r->cached_tokens));
    cJSON_AddItemToArray(e2els, cJSON_CreateNumber(r->e2e_ms));
    cJSON_AddItemToArray(tpots, cJSON_CreateNumber(r->tpot_ms >= 0 ? r->tpot_ms : -1));
    cJSON_AddItemToArray(turns, cJSON_CreateNumber(r->turn));
  }
  free(idx);
}

/* vllm's max_concurrent_requests: its sweep over the successful requests' [send, send + E2E). */
static unsigned max_concurrent_ok(const kvr_level_t *lv) {
  double *st = kvr_xmalloc((lv->nrecs ? lv->nrecs : 1) * sizeof(double));
  double *en = kvr_xmalloc((lv->nrecs ? lv->nrecs : 1) * sizeof(double));
  size_t n = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok)
      continue;
    /* to the nanosecond: a send at the instant another request ended (virtual time) is no
     * overlap, whatever the rounding of the sum */
    st[n] = round(r->sent_s * 1e9);
    en[n++] = round((r->sent_s + r->e2e_ms / 1000.0) * 1e9);
  }
  unsigned m = kvr_stats_max_overlap(st, en, n);
  free(st);
  free(en);
  return m;
}

/* The figures vllm writes after its arrays, then per selected metric mean, median, std and each
 * percentile (process_one_metric(): "p" + str(int(p)) when whole, else str(p)); the two queue
 * metrics only with a concurrency cap, the second not at rate inf, as vllm. */
static void vllm_tail(cJSON *o, const kvr_level_t *lv) {
  static const char *const names[KVR_METRIC_COUNT] = {
      "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"};
  add_float(o, "max_output_tokens_per_s", max_output_tokens_per_s(lv));
  cJSON_AddNumberToObject(o, "max_concurrent_requests", max_concurrent_ok(lv));
  add_float(o, "rtfx", 0.0); /* vllm's inverse real-time factor of audio input: none here */
  unsigned metrics = kvr_result_metrics(&lv->result);
  const double *pct;
  size_t npct = kvr_result_pcts(&lv->result, &pct);
  bool capped = level_max_concurrency(lv) > 0;
  for (size_t m = 0; m < KVR_METRIC_COUNT; m++) {
    if (!(metrics & 1u << m) || (m == KVR_METRIC_QUEUE && !capped) ||
        (m == KVR_METRIC_E2EL_QUEUE && (!capped || rate_inf(lv))))
      continue;
    const kvr_vstat_t *s = &lv->vstat[m];
    char key[96], p[48];
    snprintf(key, sizeof(key), "mean_%s_ms", names[m]);
    add_float(o, key, s->mean);
    snprintf(key, sizeof(key), "median_%s_ms", names[m]);
    add_float(o, key, s->median);
    snprintf(key, sizeof(key), "std_%s_ms", names[m]);
    add_float(o, key, s->std);
    for (size_t i = 0; i < npct; i++) {
      if (pct[i] == floor(pct[i]))
        snprintf(p, sizeof(p), "%.0f", pct[i]);
      else
        py_float(pct[i], p, sizeof(p));
      snprintf(key, sizeof(key), "p%s_%s_ms", p, names[m]);
      add_float(o, key, s->pct[i]);
    }
  }
}

/* What the run was: policy, workload, rate meaning, time scale, seed, requests. */
static void run_keys(cJSON *k, const kvr_results_t *res, const kvr_run_t *run,
                     const kvr_level_t *lv) {
  cJSON_AddStringToObject(k, "policy", run->policy);
  cJSON_AddStringToObject(k, "workload", res->workload ? res->workload : "");
  cJSON_AddStringToObject(k, "rate_meaning",
                          res->concurrency_mode ? "users"
                          : res->sessions       ? "conversation starts per second"
                          : res->trace          ? "trace requests per second (its arrivals, scaled)"
                                                : "turn arrivals per second");
  cJSON_AddNumberToObject(k, "time_scale", res->time_scale);
  cJSON_AddNumberToObject(k, "seed", (double)res->seed);
  /* A virtual-time run: the cluster was simulated on a virtual clock (one line on it). */
  cJSON_AddBoolToObject(k, "virtual", res->virtual_desc != NULL);
  if (res->virtual_desc)
    cJSON_AddStringToObject(k, "virtual_desc", res->virtual_desc);
  /* Concurrency levels are measured in steady state (bench/loadgen/loadgen.h). */
  cJSON_AddBoolToObject(k, "steady_state", lv->steady_state);
  cJSON_AddNumberToObject(k, "warmup_requests", (double)lv->warmup_requests);
  cJSON_AddNumberToObject(k, "cooldown_requests", (double)lv->cooldown_requests);
  cJSON_AddNumberToObject(k, "cancelled_requests", (double)lv->cancelled_requests);
  cJSON_AddNumberToObject(k, "measured_requests", (double)lv->measured);
  cJSON_AddNumberToObject(k, "achieved_rate", lv->achieved_rate);
  cJSON_AddNumberToObject(k, "scheduled_rate", lv->scheduled_rate);
  cJSON_AddItemToObject(k, "send_lag_real_ms", dist_obj(&lv->lag));
  cJSON_AddItemToObject(k, "ttft_transport_real_ms", dist_obj(&lv->transport));
  cJSON_AddNumberToObject(k, "total_cached_tokens", (double)lv->total_cached);
  cJSON_AddNumberToObject(k, "requests_with_usage", (double)lv->usage_requests);
  cJSON_AddBoolToObject(k, "interrupted", lv->interrupted);
  /* A trace at its own times (vllm's --self-timed: request_rate is "inf"); the level's rate. */
  cJSON_AddBoolToObject(k, "self_timed", lv->self_timed);
  if (isfinite(lv->rate) && !lv->concurrency)
    cJSON_AddNumberToObject(k, "rate", lv->rate);
  else
    cJSON_AddNullToObject(k, "rate");
}

/* The level's SLO verdict, the engine figures that say which limit it hit, the cache reset. */
static void verdict_keys(cJSON *k, const kvr_run_t *run, const kvr_level_t *lv) {
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
  /* A model fleet (virtual time): 404s for a model the worker does not serve, adapter placement */
  if (lv->models_seen) {
    cJSON *mf = cJSON_AddObjectToObject(k, "model_fleet");
    cJSON_AddNumberToObject(mf, "requests", (double)lv->models_requests);
    cJSON_AddNumberToObject(mf, "not_served_404", (double)lv->models_not_served);
    cJSON_AddNumberToObject(mf, "adapter_requests", (double)lv->adapter_requests);
    cJSON_AddNumberToObject(mf, "adapter_running", (double)lv->adapter_state[2]);
    cJSON_AddNumberToObject(mf, "adapter_loaded", (double)lv->adapter_state[1]);
    cJSON_AddNumberToObject(mf, "adapter_none", (double)lv->adapter_state[0]);
  }
  /* The router's predicted against the workers' reported cached prompt tokens (null: unknown).
   * gap = (predicted - reported) / reported. */
  if (lv->router_cached_seen) {
    cJSON *rc = cJSON_AddObjectToObject(k, "router_cached");
    cJSON_AddNumberToObject(rc, "predicted_tokens", (double)lv->router_predicted_cached);
    cJSON_AddNumberToObject(rc, "reported_tokens", (double)lv->router_reported_cached);
    if (lv->router_reported_cached)
      cJSON_AddNumberToObject(
          rc, "gap",
          ((double)lv->router_predicted_cached - (double)lv->router_reported_cached) /
              (double)lv->router_reported_cached);
    else
      cJSON_AddNullToObject(rc, "gap");
  } else {
    cJSON_AddNullToObject(k, "router_cached");
  }
  if (run->cache_reset[0])
    cJSON_AddStringToObject(k, "prefix_cache_reset", run->cache_reset);
  else
    cJSON_AddNullToObject(k, "prefix_cache_reset");
  /* true: every worker confirmed the reset; false: some did not; null: not tried or not recorded */
  if (run->cache_reset_outcome == KVR_CACHE_RESET_UNKNOWN)
    cJSON_AddNullToObject(k, "prefix_cache_reset_complete");
  else
    cJSON_AddBoolToObject(k, "prefix_cache_reset_complete",
                          run->cache_reset_outcome == KVR_CACHE_RESET_ALL);
}

/* Worker share, per-turn TTFT and the SLO targets. */
static void extra_lists(cJSON *k, const kvr_results_t *res, const kvr_level_t *lv) {
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
}

void kvr_report_level_json(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                           kvr_buf_t *out) {
  cJSON *o = cJSON_CreateObject();
  vllm_head(o, res, run, lv);
  cJSON *k = cJSON_CreateObject();
  request_arrays(o, k, lv);
  vllm_tail(o, lv);
  cJSON_AddItemToObject(o, "kvrouter", k);
  run_keys(k, res, run, lv);
  verdict_keys(k, run, lv);
  extra_lists(k, res, lv);
  kvr__trace_json(k, res, lv);
  char *s = cJSON_PrintUnformatted(o);
  if (s == NULL)
    kvr_oom("cJSON_PrintUnformatted", 0);
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
      kvr_buf_printf(out, ",\"concurrency\":%u,\"user\":%d", lv->concurrency, (int)r->user);
    else if (isfinite(lv->rate))
      kvr_buf_printf(out, ",\"rate\":%.6g", lv->rate);
    else
      kvr_buf_puts(out, ",\"rate\":\"inf\""); /* as vllm writes its request_rate */
    kvr_buf_printf(
        out,
        ",\"seq\":%llu,\"conversation\":%llu,\"turn\":%u,\"warmup\":%s,\"cooldown\":%s,\"ok\":%s,"
        "\"status\":%d,"
        "\"target_s\":%.6f,\"sent_s\":%.6f,\"lag_ms\":%.4f,\"ttft_ms\":%.3f,"
        "\"transport_ms\":%.3f,\"tpot_ms\":%.3f,\"e2e_ms\":%.3f,\"itl_count\":%u,"
        "\"itl_mean_ms\":%.3f,\"itl_max_ms\":%.3f,\"output_tokens\":%u,\"chunks\":%u,"
        "\"prompt_tokens\":%u,\"cached_tokens\":%u,\"usage\":%s,\"worker\":",
        (unsigned long long)r->seq, (unsigned long long)r->conv, r->turn,
        r->warmup ? "true" : "false", r->cooldown ? "true" : "false", r->ok ? "true" : "false",
        r->status, r->target_s, r->sent_s, r->lag_ms, r->ttft_ms, r->transport_ms, r->tpot_ms,
        r->e2e_ms, r->n_itl, r->itl_mean_ms, r->itl_max_ms, r->output_tokens, r->chunks,
        r->prompt_tokens, r->cached_tokens, r->usage_seen ? "true" : "false");
    kvr_buf_json_str(out, r->worker, strlen(r->worker));
    if (r->model[0] != '\0') { /* a mix workload's model */
      kvr_buf_puts(out, ",\"model\":");
      kvr_buf_json_str(out, r->model, strlen(r->model));
    }
    kvr_buf_puts(out, ",\"error\":");
    kvr_buf_json_str(out, r->error, strlen(r->error));
    kvr_buf_puts(out, "}\n");
  }
}

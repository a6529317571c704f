/* report_json.c -- the machine-readable results: one JSON object per level, keyed like
 * `vllm bench serve --save-result` where the meaning matches, plus a "kvrouter" object with the
 * figures vllm does not have; and one JSON line per request.
 *
 * Structs: none of its own; cJSON objects are built from a kvr_level_t and freed after printing.
 *
 * Invariants: warm-up and cool-down requests are left out of the per-level arrays (input_lens,
 * ttfts, latencies, start_times, ... and the kvrouter object's cached_lens, e2els, tpots, turns,
 * all aligned: entry i of each is the same measured request, in completion order as the JSONL,
 * where vllm's follow its sends: start_times gives that order) and kept, flagged, in the JSONL;
 * the engine figures are null when no worker's /metrics was read; a vllm key whose figure the
 * records cannot give (itls, generated_texts) is null, never made up.
 *
 * Source of the vllm keys and their meaning: vllm/benchmarks/serve.py (calculate_metrics(),
 * benchmark()'s result dict, main_async()'s result_json) in vllm-project/vllm.
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

/* The "<stat>_<name>_ms" keys add_dist() writes, in order, and the field each one reads. */
static const struct {
  const char *stat;
  size_t off;
} dist_keys[] = {
    {"mean", offsetof(kvr_dist_t, mean)}, {"median", offsetof(kvr_dist_t, p50)},
    {"std", offsetof(kvr_dist_t, std)},   {"p50", offsetof(kvr_dist_t, p50)},
    {"p90", offsetof(kvr_dist_t, p90)},   {"p95", offsetof(kvr_dist_t, p95)},
    {"p99", offsetof(kvr_dist_t, p99)},
};

static void add_dist(cJSON *o, const char *name, const kvr_dist_t *d) {
  char k[48];
  for (size_t i = 0; i < KVR_ARRAY_SIZE(dist_keys); i++) {
    snprintf(k, sizeof(k), "%s_%s_ms", dist_keys[i].stat, name);
    cJSON_AddNumberToObject(o, k,
                            *(const double *)(const void *)((const char *)d + dist_keys[i].off));
  }
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
 * measured window (duration). vllm's SLOs are --goodput ttft:MS tpot:MS, a request being good when
 * each figure is <= its SLO, with TPOT 0 under 2 output tokens; kvrouter's are its TTFT and TPOT
 * SLO thresholds (an unset one, <= 0, is left out). A completed request with no first token cannot
 * show its TTFT met and is not counted. -1 (written null) when neither SLO is set, as vllm writes
 * None without --goodput, or when the window is empty. */
static double request_goodput(const kvr_slo_t *slo, const kvr_level_t *lv) {
  if ((slo->ttft_p99_ms <= 0 && slo->tpot_p99_ms <= 0) || lv->duration_s <= 0)
    return -1;
  size_t good = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok)
      continue;
    if (slo->ttft_p99_ms > 0 && !(r->ttft_ms >= 0 && r->ttft_ms <= slo->ttft_p99_ms))
      continue;
    double tpot = r->tpot_ms >= 0 ? r->tpot_ms : 0;
    if (slo->tpot_p99_ms > 0 && tpot > slo->tpot_p99_ms)
      continue;
    good++;
  }
  return (double)good / lv->duration_s;
}

/* vllm's max_output_tokens_per_s: the most output tokens that arrived within one 1-s bucket, the
 * buckets counted from the earliest send of a completed measured request (report seconds).
 * vllm places each token from the request's start, TTFT and ITLs. The records keep no per-token
 * timestamps (an ITL count, mean and max only), so this places a request's first token at
 * sent + TTFT, exactly, and spreads its other output_tokens - 1 evenly up to sent + E2E: the
 * figure vllm would get were each request's ITLs equal, an estimate otherwise. 0 when no measured
 * request completed, as vllm. */
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

/* The keys `vllm bench serve --save-result` writes, with its meaning. */
static void vllm_keys(cJSON *o, const kvr_results_t *res, const kvr_run_t *run,
                      const kvr_level_t *lv) {
  const char *backend = res->api && strcmp(res->api, "completions") == 0 ? "openai" : "openai-chat";
  cJSON_AddStringToObject(o, "date", res->generated ? res->generated : "");
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
  double goodput = request_goodput(&res->slo, lv);
  if (goodput >= 0)
    cJSON_AddNumberToObject(o, "request_goodput", goodput);
  else
    cJSON_AddNullToObject(o, "request_goodput");
  cJSON_AddNumberToObject(o, "output_throughput", lv->output_throughput);
  cJSON_AddNumberToObject(o, "total_token_throughput", lv->total_token_throughput);
  cJSON_AddNumberToObject(o, "max_output_tokens_per_s", max_output_tokens_per_s(lv));
  cJSON_AddNumberToObject(o, "max_concurrent_requests", lv->max_concurrent);
  add_dist(o, "ttft", &lv->ttft);
  add_dist(o, "tpot", &lv->tpot);
  add_dist(o, "itl", &lv->itl);
  add_dist(o, "e2el", &lv->e2e);
}

/* vllm's per-request arrays in o (its --save-detailed ones: seconds, as vllm writes them; ttfts and
 * latencies 0 when the request failed or had no token, as vllm's defaults; start_times from the
 * level's start where vllm's are perf_counter() readings: only differences compare) and, aligned
 * with them, the ones vllm lacks in k (cached tokens, E2E and TPOT in ms, TPOT -1 under 2 tokens,
 * 1-based turn); measured requests only, in completion order (the JSONL's). itls and
 * generated_texts are null: a record keeps its ITL count, mean and max, not each gap, and no
 * generated text. */
static void request_arrays(cJSON *o, cJSON *k, const kvr_level_t *lv) {
  cJSON *in = cJSON_AddArrayToObject(o, "input_lens");
  cJSON *outl = cJSON_AddArrayToObject(o, "output_lens");
  cJSON *ttfts = cJSON_AddArrayToObject(o, "ttfts");
  cJSON_AddNullToObject(o, "itls");
  cJSON *lats = cJSON_AddArrayToObject(o, "latencies");
  cJSON *starts = cJSON_AddArrayToObject(o, "start_times");
  cJSON_AddNullToObject(o, "generated_texts");
  cJSON *errs = cJSON_AddArrayToObject(o, "errors");
  cJSON *cached = cJSON_AddArrayToObject(k, "cached_lens");
  cJSON *e2els = cJSON_AddArrayToObject(k, "e2els");
  cJSON *tpots = cJSON_AddArrayToObject(k, "tpots");
  cJSON *turns = cJSON_AddArrayToObject(k, "turns");
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup)
      continue;
    cJSON_AddItemToArray(in, cJSON_CreateNumber(r->prompt_tokens));
    cJSON_AddItemToArray(outl, cJSON_CreateNumber(r->output_tokens));
    cJSON_AddItemToArray(ttfts, cJSON_CreateNumber(r->ttft_ms >= 0 ? r->ttft_ms / 1000.0 : 0));
    cJSON_AddItemToArray(lats, cJSON_CreateNumber(r->ok ? r->e2e_ms / 1000.0 : 0));
    cJSON_AddItemToArray(starts, cJSON_CreateNumber(r->sent_s));
    cJSON_AddItemToArray(errs, cJSON_CreateString(r->error));
    cJSON_AddItemToArray(cached, cJSON_CreateNumber(r->cached_tokens));
    cJSON_AddItemToArray(e2els, cJSON_CreateNumber(r->e2e_ms));
    cJSON_AddItemToArray(tpots, cJSON_CreateNumber(r->tpot_ms >= 0 ? r->tpot_ms : -1));
    cJSON_AddItemToArray(turns, cJSON_CreateNumber(r->turn));
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
  vllm_keys(o, res, run, lv);
  cJSON *k = cJSON_CreateObject();
  request_arrays(o, k, lv);
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
    else
      kvr_buf_printf(out, ",\"rate\":%.6g", lv->rate);
    kvr_buf_printf(out,
                   ",\"conversation\":%llu,\"turn\":%u,\"warmup\":%s,\"cooldown\":%s,\"ok\":%s,"
                   "\"status\":%d,"
                   "\"target_s\":%.6f,\"sent_s\":%.6f,\"lag_ms\":%.4f,\"ttft_ms\":%.3f,"
                   "\"transport_ms\":%.3f,\"tpot_ms\":%.3f,\"e2e_ms\":%.3f,\"itl_count\":%u,"
                   "\"itl_mean_ms\":%.3f,\"itl_max_ms\":%.3f,\"output_tokens\":%u,\"chunks\":%u,"
                   "\"prompt_tokens\":%u,\"cached_tokens\":%u,\"usage\":%s,\"worker\":",
                   (unsigned long long)r->conv, r->turn, r->warmup ? "true" : "false",
                   r->cooldown ? "true" : "false", r->ok ? "true" : "false", r->status, r->target_s,
                   r->sent_s, r->lag_ms, r->ttft_ms, r->transport_ms, r->tpot_ms, r->e2e_ms,
                   r->n_itl, r->itl_mean_ms, r->itl_max_ms, r->output_tokens, r->chunks,
                   r->prompt_tokens, r->cached_tokens, r->usage_seen ? "true" : "false");
    kvr_buf_json_str(out, r->worker, strlen(r->worker));
    kvr_buf_puts(out, ",\"error\":");
    kvr_buf_json_str(out, r->error, strlen(r->error));
    kvr_buf_puts(out, "}\n");
  }
}

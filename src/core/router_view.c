/* router_view.c -- the Prometheus text and the admin JSON of the router's state (router_view.h).
 *
 * Reads only, through const pointers: the router module (router.c) is the one writer of what is
 * shown here. The per-worker metric families are one table (worker_families): name, type, help and
 * where the figure is, a field of kvr_worker_t (by offset and type) or a function computing it;
 * kvr_router_view_metrics() prints the table, then the worker state and actual-figure source
 * families, then the routing-decision families, then the request families (kvrouter_http_
 * requests_total and the TTFT, ITL and token families by model label: router.h's
 * kvr_model_label_t), then the model families, in that fixed order. The predicted-vs-actual
 * fractions follow the worker's cached-token source (window_source()). kvr_router_view_models()
 * renders the public GET /v1/models: the union of the usable workers' lists.
 */
#include "core/router_view.h"

#include "core/config.h"
#include "proto/openai.h"

#include <stddef.h>

#include "base/kvr.h"
#include "base/metrics.h"
#include "kvr_commit.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- per-worker metric families ---------------------------------------------------------------
 */

/* A worker family's value is a field of kvr_worker_t read at an offset (most of them), or computed.
 */
typedef enum { FIELD_U64, FIELD_U32, FIELD_DOUBLE, FIELD_FN } field_kind_t;

typedef double (*worker_field_fn)(const kvr_router_t *r, const kvr_worker_t *w);

static double ratio(uint64_t part, uint64_t whole) {
  return whole ? (double)part / (double)whole : 0;
}

static double f_backlog(const kvr_router_t *r, const kvr_worker_t *w) {
  return (double)kvr_router_worker_backlog(w, kvr_router_now_ns(r));
}
static double f_dp_rank(const kvr_router_t *r, const kvr_worker_t *w) {
  (void)r;
  return w->dp_rank;
}
static double f_up(const kvr_router_t *r, const kvr_worker_t *w) {
  return w->state == KVR_WORKER_UP;
}
/* The predicted-vs-actual comparison follows the cached-token source: over the answers that
 * reported usage, or (scrape source, once two pages with counters came) over the same scrapes:
 * the requests dispatched between the first and the last page with counters, against the
 * increases of vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total between them. */
static bool window_source(const kvr_worker_t *w) {
  return !w->cached_source.usage && w->counters.last.present != 0;
}
static double f_pred_frac(const kvr_router_t *r, const kvr_worker_t *w) {
  if (window_source(w))
    return ratio(w->window_predicted_cached, w->window_prompt_estimate);
  return ratio(w->usage_predicted_cached_total, w->usage_prompt_tokens_total);
}
static double f_act_frac(const kvr_router_t *r, const kvr_worker_t *w) {
  if (window_source(w))
    return ratio(w->counters.sum[KVR_VLLM_HITS], w->counters.sum[KVR_VLLM_QUERIES]);
  return ratio(w->usage_cached_tokens_total, w->usage_prompt_tokens_total);
}
static double f_vllm_hits(const kvr_router_t *r, const kvr_worker_t *w) {
  return (double)w->counters.sum[KVR_VLLM_HITS];
}
static double f_vllm_queries(const kvr_router_t *r, const kvr_worker_t *w) {
  return (double)w->counters.sum[KVR_VLLM_QUERIES];
}
static double f_vllm_prompt(const kvr_router_t *r, const kvr_worker_t *w) {
  return (double)w->counters.sum[KVR_VLLM_PROMPT];
}
static double f_vllm_generation(const kvr_router_t *r, const kvr_worker_t *w) {
  return (double)w->counters.sum[KVR_VLLM_GENERATION];
}
static double f_index(const kvr_router_t *r, const kvr_worker_t *w) {
  return (double)kvr_cache_index_entries(r->index, (size_t)w->slot);
}

typedef struct worker_family_s {
  const char *name, *type, *help;
  field_kind_t kind;
  size_t off;         /* FIELD_U64, FIELD_U32, FIELD_DOUBLE: offsetof the field in kvr_worker_t */
  worker_field_fn fn; /* FIELD_FN */
} worker_family_t;

#define U64(member) FIELD_U64, offsetof(kvr_worker_t, member), NULL
#define U32(member) FIELD_U32, offsetof(kvr_worker_t, member), NULL
#define DBL(member) FIELD_DOUBLE, offsetof(kvr_worker_t, member), NULL
#define FN(fn) FIELD_FN, 0, fn

static const worker_family_t worker_families[] = {
    {"kvrouter_worker_up", "gauge", "1 if the worker takes new requests", FN(f_up)},
    {"kvrouter_worker_requests_total", "counter", "Requests sent to the worker (retries included)",
     U64(requests_total)},
    {"kvrouter_worker_errors_total", "counter",
     "Requests to the worker that failed (connect, timeout, 5xx, broken stream)",
     U64(errors_total)},
    {"kvrouter_worker_retries_total", "counter",
     "Requests retried on another worker after this one failed before responding",
     U64(retries_total)},
    {"kvrouter_worker_inflight_requests", "gauge",
     "Requests the router has outstanding on the worker", U32(inflight)},
    {"kvrouter_worker_active_tokens", "gauge",
     "Router estimate of prompt plus generated tokens of in-flight requests", U64(active_tokens)},
    {"kvrouter_worker_queued_prefill_tokens", "gauge",
     "Router estimate of uncached prompt tokens not yet answered", U64(queued_prefill_tokens)},
    {"kvrouter_worker_prefill_backlog_tokens", "gauge",
     "Router estimate of the queued prefill tokens the worker has not reached yet, "
     "from its measured prefill rate",
     FN(f_backlog)},
    {"kvrouter_worker_prefill_rate_tokens_per_second", "gauge",
     "Prefill rate measured from requests dispatched to an idle prefill queue "
     "(EWMA; 0 until measured)",
     DBL(prefill.rate)},
    {"kvrouter_worker_prompt_tokens_total", "counter",
     "Estimated prompt tokens routed to the worker", U64(prompt_tokens_total)},
    {"kvrouter_worker_predicted_cached_tokens_total", "counter",
     "Prompt tokens the cache index predicted the worker already held",
     U64(predicted_cached_tokens_total)},
    {"kvrouter_worker_usage_prompt_tokens_total", "counter",
     "usage.prompt_tokens of responses that reported usage", U64(usage_prompt_tokens_total)},
    {"kvrouter_worker_usage_predicted_cached_tokens_total", "counter",
     "Predicted cached tokens of the requests whose responses reported "
     "usage.prompt_tokens_details",
     U64(usage_predicted_cached_total)},
    {"kvrouter_worker_usage_cached_tokens_total", "counter",
     "usage.prompt_tokens_details.cached_tokens reported by the worker",
     U64(usage_cached_tokens_total)},
    {"kvrouter_worker_predicted_cached_fraction", "gauge",
     "Predicted cached share of prompt tokens: over the answers that reported usage, or with the "
     "scrape source over the requests dispatched between the first and the last scrape of "
     "vLLM's counters",
     FN(f_pred_frac)},
    {"kvrouter_worker_actual_cached_fraction", "gauge",
     "Actual cached share of prompt tokens: from usage, or with the scrape source "
     "vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total increases over the same "
     "scrapes",
     FN(f_act_frac)},
    {"kvrouter_worker_actual_cached_tokens_total", "counter",
     "Cached prompt tokens of the worker: usage.prompt_tokens_details.cached_tokens, or the "
     "increase of vllm:prefix_cache_hits_total while its answers show no details "
     "(kvrouter_worker_cached_tokens_source)",
     U64(actual_cached_tokens_total)},
    {"kvrouter_worker_actual_prompt_tokens_total", "counter",
     "Prompt tokens of the worker: usage.prompt_tokens, or the increase of "
     "vllm:prompt_tokens_total while its answers carry no usage "
     "(kvrouter_worker_token_counts_source)",
     U64(actual_prompt_tokens_total)},
    {"kvrouter_worker_actual_generation_tokens_total", "counter",
     "Generated tokens of the worker: usage.completion_tokens, or the increase of "
     "vllm:generation_tokens_total while its answers carry no usage",
     U64(actual_generation_tokens_total)},
    {"kvrouter_worker_answers_without_usage_total", "counter",
     "2xx completion answers of the worker that carried no usage (streams without "
     "stream_options.include_usage)",
     U64(answers_without_usage_total)},
    {"kvrouter_worker_vllm_prefix_cache_hits_total", "counter",
     "Increase of the worker's vllm:prefix_cache_hits_total (tokens) since the router first "
     "scraped it",
     FN(f_vllm_hits)},
    {"kvrouter_worker_vllm_prefix_cache_queries_total", "counter",
     "Increase of the worker's vllm:prefix_cache_queries_total (tokens) since the router first "
     "scraped it",
     FN(f_vllm_queries)},
    {"kvrouter_worker_vllm_prompt_tokens_total", "counter",
     "Increase of the worker's vllm:prompt_tokens_total since the router first scraped it",
     FN(f_vllm_prompt)},
    {"kvrouter_worker_vllm_generation_tokens_total", "counter",
     "Increase of the worker's vllm:generation_tokens_total since the router first scraped it",
     FN(f_vllm_generation)},
    {"kvrouter_worker_vllm_resets_total", "counter",
     "Scrapes on which the worker's vLLM counters went back (a restart; counted again from their "
     "new values)",
     U64(counters.resets)},
    {"kvrouter_worker_scrape_window_predicted_cached_tokens_total", "counter",
     "Predicted cached tokens of the requests dispatched between the first and the last scrape of "
     "the worker's vLLM counters",
     U64(window_predicted_cached)},
    {"kvrouter_worker_scrape_window_prompt_tokens_total", "counter",
     "Estimated prompt tokens of the requests dispatched between the first and the last scrape "
     "of the worker's vLLM counters",
     U64(window_prompt_estimate)},
    {"kvrouter_worker_index_blocks", "gauge",
     "Prefix blocks the cache index believes the worker holds", FN(f_index)},
    {"kvrouter_worker_cache_capacity_blocks", "gauge",
     "Capacity of the worker's modelled KV cache in router blocks", U64(cache_capacity_blocks)},
    {"kvrouter_worker_num_requests_running", "gauge",
     "vllm:num_requests_running last scraped from the worker", DBL(num_requests_running)},
    {"kvrouter_worker_num_requests_waiting", "gauge",
     "vllm:num_requests_waiting last scraped from the worker", DBL(num_requests_waiting)},
    {"kvrouter_worker_kv_cache_usage_perc", "gauge",
     "vllm:kv_cache_usage_perc last scraped from the worker (0-1)", DBL(kv_cache_usage)},
    {"kvrouter_worker_ejections_total", "counter",
     "Times the worker was ejected by outlier detection (consecutive 5xx, timeouts, connect "
     "failures)",
     U64(ejections_total)},
    {"kvrouter_worker_max_model_len_tokens", "gauge",
     "Context length of the worker's model from GET /v1/models (0 until known); the cache index "
     "learns at most this many tokens of one request",
     U64(max_model_len)},
    {"kvrouter_worker_data_parallel_rank", "gauge",
     "The vLLM data-parallel rank the worker is (--worker URL,dp_size=N: its requests carry "
     "X-data-parallel-rank), -1 for a worker that is a whole server",
     FN(f_dp_rank)},
    {"kvrouter_worker_engines_seen", "gauge",
     "Distinct engine labels on the worker's last /metrics page (several on a worker configured "
     "without dp_size: one server with data-parallel ranks served as one worker)",
     U32(engines_seen)},
    {"kvrouter_worker_kv_events_rank_dropped_total", "counter",
     "KV-event batches on a rank's stream naming another data-parallel rank, dropped",
     U64(kv_rank_dropped)},
};

#undef U64
#undef U32
#undef DBL
#undef FN

static double family_value(const worker_family_t *f, const kvr_router_t *r, const kvr_worker_t *w) {
  const char *field = (const char *)w + f->off;
  switch (f->kind) {
  case FIELD_U64:
    return (double)*(const uint64_t *)field;
  case FIELD_U32:
    return *(const uint32_t *)field;
  case FIELD_DOUBLE:
    return *(const double *)field;
  default:
    return f->fn(r, w);
  }
}

static void worker_labels(kvr_buf_t *l, const kvr_worker_t *w) {
  kvr_buf_reset(l);
  kvr_buf_printf(l, "worker=\"%s\",url=\"", w->label);
  kvr_metric_escape(l, w->url);
  kvr_buf_puts(l, "\"");
}

static void worker_family(const kvr_router_t *r, kvr_buf_t *out, const worker_family_t *f) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, f->name, f->type, f->help);
  for (size_t i = 0; i < r->nslots; i++) {
    if (r->slots[i] == NULL)
      continue;
    worker_labels(&l, r->slots[i]);
    kvr_metric_sample(out, f->name, l.data, family_value(f, r, r->slots[i]));
  }
  kvr_buf_free(&l);
}

/* kvrouter_worker_state: one series per worker and state, 1 for the state the worker is in, so a
 * query or alert can select a state by label. */
static void worker_state_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  static const kvr_worker_state_t states[] = {
#define XX(name, str) KVR_WORKER_##name,
      KVR_WORKER_STATE_MAP(XX)
#undef XX
  };
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(
      out, "kvrouter_worker_state", "gauge",
      "1 for the state the worker is in (up, down, draining, ejected), 0 for the others");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    for (size_t k = 0; k < KVR_ARRAY_SIZE(states); k++) {
      kvr_buf_reset(&l);
      kvr_buf_printf(&l, "worker=\"%s\",state=\"%s\"", w->label, kvr_worker_state_name(states[k]));
      kvr_metric_sample(out, "kvrouter_worker_state", l.data, w->state == states[k]);
    }
  }
  uint64_t now_ms = kvr_router_now_ns(r) / 1000000u;
  kvr_metric_family(out, "kvrouter_worker_scrape_age_seconds", "gauge",
                    "Age of the worker's last scraped /metrics figures (no sample until the first "
                    "scrape)");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || !w->metrics_seen)
      continue;
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "worker=\"%s\"", w->label);
    double age = now_ms > w->scraped_at_ms ? (double)(now_ms - w->scraped_at_ms) / 1e3 : 0;
    kvr_metric_sample(out, "kvrouter_worker_scrape_age_seconds", l.data, age);
  }
  kvr_buf_free(&l);
}

/* kvrouter_worker_cached_tokens_source and kvrouter_worker_token_counts_source: one series per
 * worker and source (usage, scrape), 1 for the source the worker's actual figures come from. */
static void source_family(const kvr_router_t *r, kvr_buf_t *out, const char *name, const char *help,
                          size_t off) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, name, "gauge", help);
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    bool usage = ((const kvr_count_source_t *)((const char *)w + off))->usage;
    for (int k = 0; k < 2; k++) {
      kvr_buf_reset(&l);
      kvr_buf_printf(&l, "worker=\"%s\",source=\"%s\"", w->label, k ? "scrape" : "usage");
      kvr_metric_sample(out, name, l.data, usage == (k == 0));
    }
  }
  kvr_buf_free(&l);
}

static void source_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  source_family(r, out, "kvrouter_worker_cached_tokens_source",
                "1 for where the worker's actual cached tokens come from: usage (its answers "
                "carry prompt_tokens_details) or scrape (vllm:prefix_cache_hits_total)",
                offsetof(kvr_worker_t, cached_source));
  source_family(r, out, "kvrouter_worker_token_counts_source",
                "1 for where the worker's actual prompt and generated tokens come from: usage or "
                "scrape (vllm:prompt_tokens_total, vllm:generation_tokens_total)",
                offsetof(kvr_worker_t, tokens_source));
}

/* ---- router-wide families ---------------------------------------------------------------------
 */

static void routing_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, "kvrouter_routing_decisions_total", "counter",
                    "Routing decisions by chosen worker");
  for (size_t i = 0; i < r->nslots; i++) {
    if (r->slots[i] == NULL)
      continue;
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "worker=\"%s\"", r->slots[i]->label);
    kvr_metric_sample(out, "kvrouter_routing_decisions_total", l.data,
                      (double)r->decisions_total[i]);
  }
  kvr_metric_family(out, "kvrouter_routing_decisions_by_policy_total", "counter",
                    "Routing decisions taken by each policy");
  for (size_t i = 0; kvr_policy_registry[i] && i < 16; i++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "policy=\"%s\"", kvr_policy_registry[i]->name);
    kvr_metric_sample(out, "kvrouter_routing_decisions_by_policy_total", l.data,
                      (double)r->decisions_by_policy[i]);
  }
  kvr_metric_family(out, "kvrouter_routing_no_worker_total", "counter",
                    "Requests for which no usable worker was left (503 or 502)");
  kvr_metric_sample(out, "kvrouter_routing_no_worker_total", NULL, (double)r->no_worker_total);
  kvr_metric_histogram(out, "kvrouter_routing_decision_seconds",
                       "Time to take one routing decision (index match plus policy)", NULL,
                       &r->decision_seconds);
  kvr_metric_family(out, "kvrouter_policy_info", "gauge", "The active routing policy");
  kvr_buf_reset(&l);
  kvr_buf_printf(&l, "policy=\"%s\"", kvr_policy_name(r->policy));
  kvr_metric_sample(out, "kvrouter_policy_info", l.data, 1);
  kvr_buf_free(&l);
}

/* One counter family with a single unlabelled sample. */
static void counter(kvr_buf_t *out, const char *name, const char *help, uint64_t value) {
  kvr_metric_family(out, name, "counter", help);
  kvr_metric_sample(out, name, NULL, (double)value);
}

/* The admission bound's queue (exported whether the bound is on or off). */
static void admission_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  static const char *const reasons[] = KVR_ADMISSION_REJECT_NAMES;
  kvr_metric_family(out, "kvrouter_admission_queue_depth", "gauge",
                    "Requests waiting in the admission queue");
  kvr_metric_sample(out, "kvrouter_admission_queue_depth", NULL, (double)r->admission_queue_depth);
  counter(out, "kvrouter_admission_queued_total", "Requests that waited in the admission queue",
          r->admission_queued_total);
  kvr_metric_family(out, "kvrouter_admission_rejected_total", "counter",
                    "Requests answered 503 by the admission bound, by reason");
  kvr_buf_t l = KVR_BUF_INIT;
  for (size_t i = 0; i < KVR_ARRAY_SIZE(reasons); i++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "reason=\"%s\"", reasons[i]);
    kvr_metric_sample(out, "kvrouter_admission_rejected_total", l.data,
                      (double)r->admission_rejected_total[i]);
  }
  kvr_buf_free(&l);
}

static void request_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  counter(out, "kvrouter_requests_total", "Client requests received (probes excepted)",
          r->requests_total);
  kvr_metric_family(out, "kvrouter_probe_requests_total", "counter",
                    "GET/HEAD /health and /livez probes on the public listener (not in "
                    "kvrouter_requests_total)");
  kvr_metric_sample(out, "kvrouter_probe_requests_total", "path=\"/health\"",
                    (double)r->probe_requests_total[KVR_PROBE_HEALTH]);
  kvr_metric_sample(out, "kvrouter_probe_requests_total", "path=\"/livez\"",
                    (double)r->probe_requests_total[KVR_PROBE_LIVEZ]);
  counter(out, "kvrouter_client_errors_total", "Requests the router rejected itself (4xx)",
          r->client_errors_total);
  counter(out, "kvrouter_client_aborts_total",
          "Requests whose client disconnected before the response ended", r->client_aborts_total);
  counter(out, "kvrouter_upstream_failures_total",
          "Proxied requests that ended in 502/504 or a broken stream", r->upstream_failures_total);
  kvr_metric_family(out, "kvrouter_request_errors_total", "counter",
                    "Client requests that ended in an error, by reason (every reason is exported)");
  kvr_buf_t l = KVR_BUF_INIT;
  for (int e = 0; e < KVR_REQ_ERROR_COUNT; e++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "reason=\"%s\"", kvr_req_error_name((kvr_req_error_t)e));
    kvr_metric_sample(out, "kvrouter_request_errors_total", l.data,
                      (double)r->request_errors_total[e]);
  }
  kvr_metric_family(out, "kvrouter_upstream_response_errors_total", "counter",
                    "Worker answers refused with a 502 because their head broke HTTP (RFC "
                    "9110/9112), by reason (every reason is exported)");
  for (int e = KVR_HTTP_RESP_OK + 1; e < KVR_HTTP_RESP_ERR_COUNT; e++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "reason=\"%s\"", kvr_http_resp_err_name((kvr_http_resp_err_t)e));
    kvr_metric_sample(out, "kvrouter_upstream_response_errors_total", l.data,
                      (double)r->upstream_response_errors_total[e]);
  }
  kvr_metric_family(out, "kvrouter_response_ids", "gauge",
                    "Responses API ids remembered with the worker that stored them");
  kvr_metric_sample(out, "kvrouter_response_ids", NULL, (double)kvr_affinity_size(r->response_ids));
  counter(out, "kvrouter_response_ids_evicted_total",
          "Responses API ids forgotten to stay within --response-ids-max (a follow-up naming one "
          "is routed by the policy)",
          r->response_ids_evicted_total);
  kvr_metric_family(out, "kvrouter_session_keys", "gauge",
                    "Session keys (prompt_cache_key, --session-header) remembered with the worker "
                    "that served them last");
  kvr_metric_sample(out, "kvrouter_session_keys", NULL, (double)kvr_affinity_size(r->session_keys));
  counter(out, "kvrouter_session_keys_evicted_total",
          "Session keys forgotten to stay within --session-keys-max",
          r->session_keys_evicted_total);
  static const char *const lookup[] = {"hit", "unknown", "worker_gone"};
  kvr_metric_family(out, "kvrouter_response_id_lookups_total", "counter",
                    "Requests naming a response id (previous_response_id, GET or cancel of a "
                    "response) by what the router knew: hit (sent to the worker that stored it), "
                    "unknown, worker_gone (removed or not usable)");
  for (int i = 0; i < KVR_AFFINITY_RESULTS; i++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "result=\"%s\"", lookup[i]);
    kvr_metric_sample(out, "kvrouter_response_id_lookups_total", l.data,
                      (double)r->response_id_lookups_total[i]);
  }
  counter(out, "kvrouter_lora_load_attempts_total",
          "POST /v1/load_lora_adapter calls the router started (--lora-adapter: a request for "
          "an adapter its chosen worker did not list; concurrent requests share one)",
          r->lora_load_attempts_total);
  kvr_metric_family(out, "kvrouter_lora_loads_total", "counter",
                    "Runtime LoRA loads ended, by result: loaded (200), already_loaded (vLLM's "
                    "400 'has already been loaded', as good), failed (any other answer or none: "
                    "the waiting requests got a 502)");
  for (int i = 0; i < KVR_LORA_LOAD_RESULTS; i++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "result=\"%s\"", kvr_lora_load_result_name((kvr_lora_load_result_t)i));
    kvr_metric_sample(out, "kvrouter_lora_loads_total", l.data, (double)r->lora_loads_total[i]);
  }
  kvr_metric_family(out, "kvrouter_session_lookups_total", "counter",
                    "Requests naming a session key by what the router knew: hit (its last worker "
                    "preferred), unknown, worker_gone");
  for (int i = 0; i < KVR_AFFINITY_RESULTS; i++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "result=\"%s\"", lookup[i]);
    kvr_metric_sample(out, "kvrouter_session_lookups_total", l.data,
                      (double)r->session_lookups_total[i]);
  }
  kvr_buf_free(&l);
  counter(
      out, "kvrouter_usage_rejected_total",
      "Worker answers whose usage figures were refused (not integers in [0, 2^32], cached above "
      "prompt, or above the worker's context): counted as answers without usage",
      r->usage_rejected_total);
  counter(out, "kvrouter_workers_refused_total",
          "Workers not added because the router already serves KVR_MAX_WORKERS (4096): from the "
          "static list, POST /admin/workers or discovery",
          r->workers_refused_total);
  counter(out, "kvrouter_retries_exhausted_total",
          "Requests that failed before any response byte with no attempt or other worker left "
          "to retry on",
          r->retries_exhausted_total);
  counter(out, "kvrouter_retry_budget_refused_total",
          "Retries not made because the retry budget was spent (the error went to the client)",
          r->retry_budget_refused_total);
  counter(out, "kvrouter_ejections_refused_total",
          "Ejections not made: they would have left no other usable worker or ejected more than "
          "max_ejection_percent of the workers",
          r->ejections_refused_total);
  admission_metrics(r, out);
  kvr_metric_histogram(out, "kvrouter_request_duration_seconds",
                       "Proxied request duration, request received to response end", NULL,
                       &r->request_seconds);
  kvr_metric_histogram(out, "kvrouter_time_to_first_byte_seconds",
                       "Request received to first response byte from the worker", NULL,
                       &r->ttfb_seconds);
}

/* The build: version (CMakeLists.txt) and commit (generated/kvr_commit.h, written at every build by
 * deploy/kvr_commit.cmake; "unknown" when the build had neither git nor -DKVR_COMMIT). */

static void build_metrics(kvr_buf_t *out) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, "kvrouter_build_info", "gauge",
                    "Always 1; the labels name the kvrouter version and commit");
  kvr_buf_puts(&l, "version=\"");
  kvr_metric_escape(&l, KVR_VERSION);
  kvr_buf_puts(&l, "\",commit=\"");
  kvr_metric_escape(&l, KVR_COMMIT);
  kvr_buf_puts(&l, "\"");
  kvr_metric_sample(out, "kvrouter_build_info", l.data, 1);
  kvr_buf_free(&l);
}

/* ---- KV events (precise mode) ---- */

typedef struct kv_counter_s {
  const char *name, *help;
  size_t off; /* offsetof in kvr_kv_stream_stats_t */
} kv_counter_t;

static const kv_counter_t kv_counters[] = {
    {"kvrouter_kv_events_batches_total", "KV-event batches applied to the worker's precise index",
     offsetof(kvr_kv_stream_stats_t, batches)},
    {"kvrouter_kv_events_total",
     "KV events in the applied batches (BlockStored, BlockRemoved, "
     "AllBlocksCleared) the decoder kept",
     offsetof(kvr_kv_stream_stats_t, events)},
    {"kvrouter_kv_events_replays_total", "Replay requests sent to the worker's replay socket",
     offsetof(kvr_kv_stream_stats_t, replays)},
    {"kvrouter_kv_events_replay_failures_total",
     "Replays that did not recover the missing batches (evicted, not answered)",
     offsetof(kvr_kv_stream_stats_t, replay_failures)},
    {"kvrouter_kv_events_gaps_total", "Sequence gaps seen on the live stream",
     offsetof(kvr_kv_stream_stats_t, gaps)},
    {"kvrouter_kv_events_publisher_restarts_total",
     "Sequence numbers going back (the engine's publisher restarted)",
     offsetof(kvr_kv_stream_stats_t, restarts)},
    {"kvrouter_kv_events_resets_total",
     "Times the worker's precise index was cleared because its stream was incomplete",
     offsetof(kvr_kv_stream_stats_t, resets)},
    {"kvrouter_kv_events_duplicates_total", "Replayed batches already applied (dropped)",
     offsetof(kvr_kv_stream_stats_t, duplicates)},
};

typedef struct kv_skip_row_s {
  const char *reason;
  uint64_t v;
} kv_skip_row_t;

static void kv_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  kvr_buf_t l = KVR_BUF_INIT;
  for (size_t k = 0; k < KVR_ARRAY_SIZE(kv_counters); k++) {
    kvr_metric_family(out, kv_counters[k].name, "counter", kv_counters[k].help);
    for (size_t i = 0; i < r->nslots; i++) {
      const kvr_worker_t *w = r->slots[i];
      if (w == NULL || w->kv_events == NULL)
        continue;
      kvr_buf_reset(&l);
      kvr_buf_printf(&l, "worker=\"%s\"", w->label);
      const uint64_t *v = (const uint64_t *)((const char *)&w->kv_stats + kv_counters[k].off);
      kvr_metric_sample(out, kv_counters[k].name, l.data, (double)*v);
    }
  }
  /* events skipped: the decoder's reasons and the index's own */
  kvr_metric_family(out, "kvrouter_kv_events_skipped_total", "counter",
                    "KV events not applied, by reason: unknown_type, medium (an offload tier), "
                    "group (another KV-cache group), malformed, orphan (unknown parent), "
                    "unknown_block (a removal of a block never stored), decode_error (batches)");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || w->kv_events == NULL)
      continue;
    const kvr_kv_apply_stats_t *ap = kvr_kv_index_stats(r->kv_index, (size_t)w->slot);
    kv_skip_row_t rows[KVR_KV_SKIP_COUNT + 4];
    size_t n = 0;
    for (int k = 0; k < KVR_KV_SKIP_COUNT; k++)
      rows[n++] = (kv_skip_row_t){kvr_kv_skip_name((kvr_kv_skip_t)k), w->kv_stats.skipped[k]};
    rows[n++] = (kv_skip_row_t){"orphan", ap ? ap->orphan_events : 0};
    rows[n++] = (kv_skip_row_t){"unknown_block", ap ? ap->unknown_removed : 0};
    rows[n++] = (kv_skip_row_t){"other_group", ap ? ap->other_group : 0};
    rows[n++] = (kv_skip_row_t){"decode_error", w->kv_stats.decode_errors};
    for (size_t k = 0; k < n; k++) {
      kvr_buf_reset(&l);
      kvr_buf_printf(&l, "worker=\"%s\",reason=\"%s\"", w->label, rows[k].reason);
      kvr_metric_sample(out, "kvrouter_kv_events_skipped_total", l.data, (double)rows[k].v);
    }
  }
  kvr_metric_family(out, "kvrouter_worker_kv_index_mode", "gauge",
                    "1 for the index the worker is routed on: precise (its engine's KV events) "
                    "or approximate (the router's own model), with the reason when approximate");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || w->kv_events == NULL)
      continue;
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "worker=\"%s\",mode=\"%s\"", w->label, w->kv_mode);
    kvr_metric_sample(out, "kvrouter_worker_kv_index_mode", l.data, 1);
  }
  kvr_metric_family(out, "kvrouter_worker_kv_index_blocks", "gauge",
                    "Blocks the worker's engine reported holding (precise index)");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || w->kv_events == NULL)
      continue;
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "worker=\"%s\"", w->label);
    kvr_metric_sample(out, "kvrouter_worker_kv_index_blocks", l.data,
                      (double)kvr_kv_index_blocks(r->kv_index, (size_t)w->slot));
  }
  kvr_metric_family(out, "kvrouter_routing_index_decisions_total", "counter",
                    "Routing decisions with a prompt, by the index at least one worker was "
                    "matched on (precise: token ids and KV events)");
  kvr_metric_sample(out, "kvrouter_routing_index_decisions_total", "index=\"precise\"",
                    (double)r->kv_routed_precise);
  kvr_metric_sample(out, "kvrouter_routing_index_decisions_total", "index=\"approximate\"",
                    (double)r->kv_routed_approx);
  static const char *const tok[] = {"called", "cached", "failed", "prefix"};
  kvr_metric_family(out, "kvrouter_tokenize_requests_total", "counter",
                    "Prompts tokenized for precise routing, by result: called (a worker's POST "
                    "/tokenize), cached (the same prompt seen before), failed (routed "
                    "approximately), prefix (an earlier turn of the conversation, tokenized "
                    "before, stood for it: --tokenize-prefix-coverage)");
  for (size_t k = 0; k < KVR_ARRAY_SIZE(tok); k++) {
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "result=\"%s\"", tok[k]);
    kvr_metric_sample(out, "kvrouter_tokenize_requests_total", l.data,
                      (double)r->tokenize_total[k]);
  }
  kvr_metric_histogram(out, "kvrouter_tokenize_duration_seconds",
                       "Time tokenization added before the routing decision (precise mode)", NULL,
                       &r->tokenize_seconds);
  kvr_buf_free(&l);
}

/* ---- replicas ---- */

/* l := the label peer="URL" of peer p (escaped); returns l's text. */
static const char *peer_label(kvr_buf_t *l, const kvr_config_t *cfg, size_t p) {
  kvr_buf_reset(l);
  kvr_buf_puts(l, "peer=\"");
  kvr_metric_escape(l, cfg->peers[p]);
  kvr_buf_puts(l, "\"");
  return l->data;
}

static void peer_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  const kvr_config_t *cfg = r->cfg;
  uint64_t now = kvr_router_now_ns(r) / 1000000u;
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(
      out, "kvrouter_peer_polls_total", "counter",
      "GET /admin/load polls of each peer replica, by result (ok, error, self: the address is "
      "this replica's own, ignored)");
  for (size_t p = 0; p < cfg->npeers && p < KVR_MAX_PEERS; p++) {
    static const char *const results[] = {"ok", "error", "self"};
    for (int k = 0; k < 3; k++) {
      peer_label(&l, cfg, p);
      kvr_buf_printf(&l, ",result=\"%s\"", results[k]);
      kvr_metric_sample(out, "kvrouter_peer_polls_total", l.data,
                        (double)r->peer_polls_total[p][k]);
    }
  }
  kvr_metric_family(out, "kvrouter_peer_up", "gauge",
                    "1 while the peer's last load is fresh (within --peer-stale-ms)");
  for (size_t p = 0; p < cfg->npeers && p < KVR_MAX_PEERS; p++) {
    bool up = r->peer_ok_ms[p] && now <= r->peer_ok_ms[p] + cfg->peer_stale_ms;
    kvr_metric_sample(out, "kvrouter_peer_up", peer_label(&l, cfg, p), up);
  }
  kvr_metric_family(out, "kvrouter_peer_sync_live", "gauge",
                    "1 while the peer's announced requests make up its load (--peer-sync-listen; "
                    "0: its polled figures)");
  for (size_t p = 0; p < cfg->npeers && p < KVR_MAX_PEERS; p++)
    kvr_metric_sample(out, "kvrouter_peer_sync_live", peer_label(&l, cfg, p), r->peer_sync_live[p]);
  kvr_metric_family(out, "kvrouter_peer_sync_messages_total", "counter",
                    "Sync messages received from the peer");
  for (size_t p = 0; p < cfg->npeers && p < KVR_MAX_PEERS; p++)
    kvr_metric_sample(out, "kvrouter_peer_sync_messages_total", peer_label(&l, cfg, p),
                      (double)r->peer_sync_messages_total[p]);
  kvr_metric_family(out, "kvrouter_peer_sync_gaps_total", "counter",
                    "Sequence gaps in the peer's sync messages (repaired by its next snapshot)");
  for (size_t p = 0; p < cfg->npeers && p < KVR_MAX_PEERS; p++)
    kvr_metric_sample(out, "kvrouter_peer_sync_gaps_total", peer_label(&l, cfg, p),
                      (double)r->peer_sync_gaps_total[p]);
  kvr_metric_family(out, "kvrouter_peer_sync_published_total", "counter",
                    "Sync messages this replica published (its requests and snapshots)");
  kvr_metric_sample(out, "kvrouter_peer_sync_published_total", NULL,
                    (double)r->sync_published_total);
  kvr_metric_family(out, "kvrouter_peer_sync_skipped_total", "counter",
                    "Sync messages skipped: undecodable, or from an instance no peer poll named");
  kvr_metric_sample(out, "kvrouter_peer_sync_skipped_total", NULL, (double)r->sync_skipped_total);
  kvr_metric_family(out, "kvrouter_worker_peer_inflight_requests", "gauge",
                    "Requests the peer replicas reported in flight on the worker (fresh ones)");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    kvr_peer_load_t sum;
    kvr_router_peer_load(r, w, now, &sum);
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "worker=\"%s\"", w->label);
    kvr_metric_sample(out, "kvrouter_worker_peer_inflight_requests", l.data, sum.inflight);
  }
  kvr_buf_free(&l);
}

/* ---- models ---- */

/* The model labels to show in the per-model families: the names some worker lists now (its list
 * known, draining workers aside) and every label with figures, so a listed model has its series
 * (at 0) before its first request. */
static void labels_shown(const kvr_router_t *r, bool *shown) {
  for (size_t k = 0; k < r->nmodel_labels; k++) {
    const kvr_model_label_t *m = &r->model_labels[k];
    shown[k] = m->ttft_seconds.count || m->itl_seconds.count || m->prompt_tokens_total ||
               m->generation_tokens_total;
  }
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || !w->models_known || w->state == KVR_WORKER_DRAINING)
      continue;
    for (size_t j = 0; j < w->models.n; j++)
      shown[w->labels[j]] = true;
  }
}

static void model_label(kvr_buf_t *l, const kvr_router_t *r, size_t k) {
  kvr_buf_reset(l);
  kvr_buf_puts(l, "model=\"");
  kvr_metric_escape(l, r->model_labels[k].name);
  kvr_buf_puts(l, "\"");
}

/* kvrouter_model_workers (usable workers listing each listed name) and kvrouter_worker_model_info
 * (one series per worker and id it lists; ids without a label of their own are left out). */
static void model_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  uint64_t now = kvr_router_now_ns(r) / 1000000u;
  size_t n = r->nmodel_labels;
  uint32_t usable[KVR_MODEL_LABELS_MAX + 2] = {0};
  bool listed[KVR_MODEL_LABELS_MAX + 2] = {false};
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, "kvrouter_worker_model_info", "gauge",
                    "1 for each model id (base name, alias, LoRA adapter) the worker's GET "
                    "/v1/models listed when last read");
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || w->state == KVR_WORKER_DRAINING)
      continue;
    bool up = w->models_known && kvr_router_worker_usable(w, now);
    for (size_t j = 0; j < w->models.n; j++) {
      uint16_t k = w->labels[j];
      if (k <= KVR_MODEL_LABEL_NONE || k >= n)
        continue;
      listed[k] = true;
      usable[k] += up;
      model_label(&l, r, k);
      kvr_buf_printf(&l, ",worker=\"%s\"", w->label);
      kvr_metric_sample(out, "kvrouter_worker_model_info", l.data, 1);
    }
  }
  kvr_metric_family(out, "kvrouter_model_workers", "gauge",
                    "Usable workers whose GET /v1/models lists the model (one series per model a "
                    "worker lists); 0: requests for it wait for a worker or fail with 503");
  for (size_t k = KVR_MODEL_LABEL_NONE + 1; k < n; k++)
    if (listed[k]) {
      model_label(&l, r, k);
      kvr_metric_sample(out, "kvrouter_model_workers", l.data, usable[k]);
    }
  kvr_buf_free(&l);
}

/* ---- responses and token streams ---- */

static void response_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, "kvrouter_http_requests_total", "counter",
                    "Responses sent on the public listener by status code, route "
                    "(chat_completions, completions, responses, response_by_id, messages, models, "
                    "other), worker (\"none\": answered by the router itself) and model (a name "
                    "the workers list, other, or none: the request named no model); probes "
                    "excepted");
  for (size_t i = 0; i < r->nresponses; i++) {
    const kvr_response_count_t *e = &r->responses[i];
    kvr_buf_reset(&l);
    kvr_buf_printf(&l, "code=\"%d\",route=\"%s\",worker=\"%s\",model=\"", e->code,
                   kvr_openai_route_name((kvr_route_t)e->route), e->worker);
    kvr_metric_escape(&l, r->model_labels[e->model].name);
    kvr_buf_puts(&l, "\"");
    kvr_metric_sample(out, "kvrouter_http_requests_total", l.data, (double)e->count);
  }
  bool shown[KVR_MODEL_LABELS_MAX + 2];
  labels_shown(r, shown);
  kvr_metric_family(out, "kvrouter_time_to_first_token_seconds", "histogram",
                    "Streaming answers: request arrival to the first token event sent to the "
                    "client, by model");
  for (size_t k = 0; k < r->nmodel_labels; k++)
    if (shown[k]) {
      model_label(&l, r, k);
      kvr_metric_hist(out, "kvrouter_time_to_first_token_seconds", l.data,
                      &r->model_labels[k].ttft_seconds);
    }
  kvr_metric_family(out, "kvrouter_inter_token_latency_seconds", "histogram",
                    "Streaming answers: time between token events sent to the client (0-ish "
                    "for events that arrived in one read), by model");
  for (size_t k = 0; k < r->nmodel_labels; k++)
    if (shown[k]) {
      model_label(&l, r, k);
      kvr_metric_hist(out, "kvrouter_inter_token_latency_seconds", l.data,
                      &r->model_labels[k].itl_seconds);
    }
  kvr_metric_family(out, "kvrouter_prompt_tokens_total", "counter",
                    "Prompt tokens processed by the workers, by model: the sum of "
                    "kvrouter_worker_actual_prompt_tokens (usage: the request's model, or the "
                    "worker's first listed model for a request naming none; scraped "
                    "vllm:prompt_tokens_total: the worker's first listed model)");
  for (size_t k = 0; k < r->nmodel_labels; k++)
    if (shown[k]) {
      model_label(&l, r, k);
      kvr_metric_sample(out, "kvrouter_prompt_tokens_total", l.data,
                        (double)r->model_labels[k].prompt_tokens_total);
    }
  kvr_metric_family(out, "kvrouter_generation_tokens_total", "counter",
                    "Generated tokens of the workers, by model: the sum of "
                    "kvrouter_worker_actual_generation_tokens (usage: the request's model, or "
                    "the worker's first listed model for a request naming none; scraped "
                    "vllm:generation_tokens_total: the worker's first listed model)");
  for (size_t k = 0; k < r->nmodel_labels; k++)
    if (shown[k]) {
      model_label(&l, r, k);
      kvr_metric_sample(out, "kvrouter_generation_tokens_total", l.data,
                        (double)r->model_labels[k].generation_tokens_total);
    }
  kvr_buf_free(&l);
}

static void metrics_with(const kvr_router_t *r, const kvr_process_stats_t *proc, kvr_buf_t *out) {
  for (size_t i = 0; i < KVR_ARRAY_SIZE(worker_families); i++)
    worker_family(r, out, &worker_families[i]);
  worker_state_metrics(r, out);
  source_metrics(r, out);
  routing_metrics(r, out);
  request_metrics(r, out);
  response_metrics(r, out);
  model_metrics(r, out);
  kv_metrics(r, out);
  peer_metrics(r, out);
  build_metrics(out);
  kvr_metric_process(out, proc);
}

void kvr_router_view_metrics(const kvr_router_t *r, kvr_buf_t *out) {
  kvr_process_stats_t proc;
  kvr_process_stats_read(&proc);
  metrics_with(r, &proc, out);
}

/* ---- admin JSON -------------------------------------------------------------------------------
 */

/* The "scraped" object of one worker. */
static void scraped_json(const kvr_router_t *r, const kvr_worker_t *w, uint64_t now, cJSON *m) {
  cJSON_AddBoolToObject(m, "fresh", kvr_router_worker_fresh(r, w, now));
  if (!w->metrics_seen)
    return;
  cJSON_AddNumberToObject(m, "age_ms", (double)(now - w->scraped_at_ms));
  cJSON_AddNumberToObject(m, "num_requests_running", w->num_requests_running);
  cJSON_AddNumberToObject(m, "num_requests_waiting", w->num_requests_waiting);
  cJSON_AddNumberToObject(m, "kv_cache_usage_perc", w->kv_cache_usage);
  if (w->num_gpu_blocks) {
    cJSON_AddNumberToObject(m, "num_gpu_blocks", (double)w->num_gpu_blocks);
    cJSON_AddNumberToObject(m, "block_size", (double)w->block_size);
  }
}

/* The "cached_tokens", "token_counts" and "vllm_counters" objects of one worker: its actual
 * figures, their sources and the prediction they are compared with (router.c: "Actual cached
 * tokens and token counts"). */
static void actual_json(const kvr_router_t *r, const kvr_worker_t *w, cJSON *o) {
  cJSON *c = cJSON_AddObjectToObject(o, "cached_tokens");
  cJSON_AddStringToObject(c, "source", w->cached_source.usage ? "usage" : "scrape");
  cJSON_AddNumberToObject(c, "actual", (double)w->actual_cached_tokens_total);
  cJSON_AddStringToObject(c, "fraction_window", window_source(w) ? "scrapes" : "usage");
  cJSON_AddNumberToObject(c, "predicted_fraction", f_pred_frac(r, w));
  cJSON_AddNumberToObject(c, "actual_fraction", f_act_frac(r, w));
  cJSON *t = cJSON_AddObjectToObject(o, "token_counts");
  cJSON_AddStringToObject(t, "source", w->tokens_source.usage ? "usage" : "scrape");
  cJSON_AddNumberToObject(t, "prompt", (double)w->actual_prompt_tokens_total);
  cJSON_AddNumberToObject(t, "generation", (double)w->actual_generation_tokens_total);
  cJSON_AddNumberToObject(t, "answers_without_usage", (double)w->answers_without_usage_total);
  if (w->counters.last.present == 0) {
    cJSON_AddNullToObject(o, "vllm_counters");
    return;
  }
  static const char *const keys[] = {"prefix_cache_hits", "prefix_cache_queries", "prompt_tokens",
                                     "generation_tokens"};
  cJSON *v = cJSON_AddObjectToObject(o, "vllm_counters");
  for (int i = 0; i < KVR_VLLM_NCOUNTERS; i++)
    cJSON_AddNumberToObject(v, keys[i], (double)w->counters.sum[i]);
  cJSON_AddNumberToObject(v, "resets", (double)w->counters.resets);
  cJSON_AddNumberToObject(v, "window_predicted_cached_tokens", (double)w->window_predicted_cached);
  cJSON_AddNumberToObject(v, "window_prompt_tokens_estimate", (double)w->window_prompt_estimate);
}

/* The "outlier" object of one worker: its failures in a row and its ejection, if any. */
static void outlier_json(const kvr_worker_t *w, uint64_t now, cJSON *o) {
  cJSON_AddNumberToObject(o, "consecutive_errors", (double)w->consecutive_errors);
  cJSON_AddNumberToObject(o, "ejections_total", (double)w->ejections_total);
  cJSON_AddNumberToObject(o, "ejections_in_a_row", w->ejection_streak);
  bool ejected = w->state == KVR_WORKER_EJECTED;
  cJSON_AddNumberToObject(o, "ejection_remaining_ms",
                          ejected && w->ejected_until_ms > now ? (double)(w->ejected_until_ms - now)
                                                               : 0);
  cJSON_AddBoolToObject(o, "half_open", ejected && now >= w->ejected_until_ms);
  cJSON_AddBoolToObject(o, "trial_in_flight", w->trial_inflight);
}

/* The "cached" object of one worker: the predicted-vs-actual cached prompt tokens (the
 * kvrouter_worker_*prompt_tokens_total and *cached* counters). The usage_* figures cover only the
 * responses that reported usage, so usage_predicted_cached_tokens / usage_prompt_tokens and
 * usage_cached_tokens / usage_prompt_tokens compare like with like. */
static void cached_json(const kvr_worker_t *w, cJSON *c) {
  cJSON_AddNumberToObject(c, "prompt_tokens", (double)w->prompt_tokens_total);
  cJSON_AddNumberToObject(c, "predicted_cached_tokens", (double)w->predicted_cached_tokens_total);
  cJSON_AddNumberToObject(c, "usage_prompt_tokens", (double)w->usage_prompt_tokens_total);
  cJSON_AddNumberToObject(c, "usage_predicted_cached_tokens",
                          (double)w->usage_predicted_cached_total);
  cJSON_AddNumberToObject(c, "usage_cached_tokens", (double)w->usage_cached_tokens_total);
}

/* Adds a ','-joined list of names as an array of strings. */
static void names_json(cJSON *o, const char *key, const char *list) {
  cJSON *arr = cJSON_AddArrayToObject(o, key);
  for (const char *p = list; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *q = p;
    size_t n = len;
    while (n > 0 && *q == ' ') /* as kvr_vllm_lora_list_has reads an item */
      q++, n--;
    while (n > 0 && q[n - 1] == ' ')
      n--;
    char *name = kvr_xcalloc(1, n + 1);
    memcpy(name, q, n);
    cJSON_AddItemToArray(arr, cJSON_CreateString(name));
    free(name);
    p = comma ? comma + 1 : p + len;
  }
}

/* The models object's "lora": vllm:lora_requests_info as last scraped (null when the page had
 * none: LoRA off) and the adapters the router is loading there now. */
static void lora_json(const kvr_worker_t *w, cJSON *o) {
  cJSON *l = cJSON_AddObjectToObject(o, "lora");
  cJSON *loading = cJSON_AddArrayToObject(l, "loading");
  for (size_t i = 0; i < w->nlora_loading; i++)
    cJSON_AddItemToArray(loading, cJSON_CreateString(w->lora_loading[i]));
  if (!w->lora.present) {
    cJSON_AddNullToObject(l, "max_lora");
    cJSON_AddNullToObject(l, "running");
    cJSON_AddNullToObject(l, "waiting");
    return;
  }
  cJSON_AddNumberToObject(l, "max_lora", w->lora.max_lora);
  names_json(l, "running", w->lora.running);
  names_json(l, "waiting", w->lora.waiting);
  cJSON_AddBoolToObject(l, "cut", w->lora.cut);
}

/* The "models" object of one worker: its GET /v1/models list as last read. */
static void models_json(const kvr_worker_t *w, uint64_t now, cJSON *o) {
  cJSON_AddBoolToObject(o, "known", w->models_known);
  cJSON_AddBoolToObject(o, "complete", w->models.complete || w->models.n == 0);
  if (w->models_at_ms)
    cJSON_AddNumberToObject(o, "age_ms",
                            now > w->models_at_ms ? (double)(now - w->models_at_ms) : 0);
  else
    cJSON_AddNullToObject(o, "age_ms");
  lora_json(w, o);
  cJSON *arr = cJSON_AddArrayToObject(o, "ids");
  for (size_t i = 0; i < w->models.n; i++) {
    const kvr_vllm_model_t *m = &w->models.v[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "id", m->id);
    if (m->root)
      cJSON_AddStringToObject(e, "root", m->root);
    else
      cJSON_AddNullToObject(e, "root");
    if (m->parent)
      cJSON_AddStringToObject(e, "parent", m->parent);
    else
      cJSON_AddNullToObject(e, "parent");
    if (m->max_model_len)
      cJSON_AddNumberToObject(e, "max_model_len", (double)m->max_model_len);
    else
      cJSON_AddNullToObject(e, "max_model_len");
    cJSON_AddItemToArray(arr, e);
  }
}

/* The worker's data-parallel rank (null for a whole server), its size, and the engines its /metrics
 * showed, with a hint when a whole server's page showed several. */
static void dp_json(const kvr_worker_t *w, cJSON *o) {
  if (w->dp_rank >= 0) {
    cJSON_AddNumberToObject(o, "dp_rank", w->dp_rank);
    cJSON_AddNumberToObject(o, "dp_size", w->dp_size);
  } else {
    cJSON_AddNullToObject(o, "dp_rank");
    cJSON_AddNullToObject(o, "dp_size");
  }
  cJSON_AddStringToObject(o, "key", w->key);
  cJSON_AddNumberToObject(o, "engines_seen", w->engines_seen);
  if (w->dp_rank < 0 && w->engines_seen > 1) {
    char hint[200];
    snprintf(hint, sizeof hint,
             "its /metrics shows %u engines: give dp_size=%u to route to each data-parallel rank",
             w->engines_seen, w->engines_seen);
    cJSON_AddStringToObject(o, "engines_hint", hint);
  }
}

static cJSON *worker_json(const kvr_router_t *r, const kvr_worker_t *w, uint64_t now) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "id", w->id);
  cJSON_AddStringToObject(o, "url", w->url);
  dp_json(w, o);
  cJSON_AddStringToObject(o, "state", kvr_worker_state_name(w->state));
  cJSON_AddNumberToObject(o, "in_flight", w->inflight);
  kvr_peer_load_t peers;
  kvr_router_peer_load(r, w, now, &peers);
  cJSON_AddNumberToObject(o, "peer_in_flight", peers.inflight);
  cJSON_AddNumberToObject(o, "requests_total", (double)w->requests_total);
  cJSON_AddNumberToObject(o, "errors_total", (double)w->errors_total);
  cJSON_AddNumberToObject(o, "active_tokens", (double)w->active_tokens);
  cJSON_AddNumberToObject(o, "queued_prefill_tokens", (double)w->queued_prefill_tokens);
  cJSON_AddNumberToObject(o, "prefill_backlog_tokens",
                          (double)kvr_router_worker_backlog(w, kvr_router_now_ns(r)));
  cJSON_AddNumberToObject(o, "prefill_rate_tokens_per_second", w->prefill.rate);
  cJSON_AddNumberToObject(o, "open_sessions", w->open_sessions);
  cJSON_AddNumberToObject(o, "index_blocks",
                          (double)kvr_cache_index_entries(r->index, (size_t)w->slot));
  cJSON_AddNumberToObject(o, "cache_capacity_blocks", (double)w->cache_capacity_blocks);
  if (w->max_model_len)
    cJSON_AddNumberToObject(o, "max_model_len", (double)w->max_model_len);
  else
    cJSON_AddNullToObject(o, "max_model_len");
  cJSON_AddNumberToObject(o, "learn_cap_blocks",
                          w->max_model_len ? (double)kvr_router_learn_cap(r, w) : -1);
  models_json(w, now, cJSON_AddObjectToObject(o, "models"));
  cJSON_AddNumberToObject(o, "decisions_total", (double)r->decisions_total[w->slot]);
  cached_json(w, cJSON_AddObjectToObject(o, "cached"));
  outlier_json(w, now, cJSON_AddObjectToObject(o, "outlier"));
  if (w->kv_events) {
    cJSON *kv = cJSON_AddObjectToObject(o, "kv_events");
    cJSON_AddStringToObject(kv, "endpoint", w->kv_events);
    if (w->kv_replay)
      cJSON_AddStringToObject(kv, "replay_endpoint", w->kv_replay);
    else
      cJSON_AddNullToObject(kv, "replay_endpoint");
    cJSON_AddStringToObject(kv, "index", w->kv_precise ? "precise" : "approximate");
    cJSON_AddStringToObject(kv, "mode", w->kv_mode);
    cJSON_AddNumberToObject(kv, "blocks",
                            (double)kvr_kv_index_blocks(r->kv_index, (size_t)w->slot));
    cJSON_AddNumberToObject(kv, "block_size",
                            kvr_kv_index_block_size(r->kv_index, (size_t)w->slot));
    cJSON_AddNumberToObject(kv, "batches", (double)w->kv_stats.batches);
    cJSON_AddNumberToObject(kv, "last_seq", (double)w->kv_stats.last_seq);
    cJSON_AddNumberToObject(kv, "resets", (double)w->kv_stats.resets);
    cJSON_AddNumberToObject(kv, "rank_dropped", (double)w->kv_rank_dropped);
  } else {
    cJSON_AddNullToObject(o, "kv_events");
  }
  scraped_json(r, w, now, cJSON_AddObjectToObject(o, "scraped"));
  actual_json(r, w, o);
  return o;
}

cJSON *kvr_router_view_worker(const kvr_router_t *r, const kvr_worker_t *w) {
  return worker_json(r, w, kvr_router_now_ns(r) / 1000000u);
}

cJSON *kvr_router_view_workers(const kvr_router_t *r) {
  cJSON *arr = cJSON_CreateArray();
  uint64_t now = kvr_router_now_ns(r) / 1000000u;
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] != NULL)
      cJSON_AddItemToArray(arr, worker_json(r, r->slots[i], now));
  return arr;
}

cJSON *kvr_router_view_policy(const kvr_router_t *r) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "policy", kvr_policy_name(r->policy));
  cJSON *params = cJSON_AddObjectToObject(o, "params");
  if (r->policy->ops->params)
    r->policy->ops->params(r->policy, params);
  cJSON *avail = cJSON_AddArrayToObject(o, "available");
  for (size_t i = 0; kvr_policy_registry[i]; i++) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "name", kvr_policy_registry[i]->name);
    cJSON_AddStringToObject(p, "description", kvr_policy_registry[i]->description);
    cJSON_AddItemToArray(avail, p);
  }
  cJSON *dec = cJSON_AddObjectToObject(o, "decisions_by_policy");
  for (size_t i = 0; kvr_policy_registry[i] && i < KVR_ARRAY_SIZE(r->decisions_by_policy); i++)
    cJSON_AddNumberToObject(dec, kvr_policy_registry[i]->name, (double)r->decisions_by_policy[i]);
  return o;
}

cJSON *kvr_router_view_cache_index(const kvr_router_t *r) {
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(r->index, &st);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddNumberToObject(o, "blocks", (double)st.blocks);
  cJSON_AddNumberToObject(o, "entries", (double)st.entries);
  cJSON_AddNumberToObject(o, "bytes", (double)st.bytes);
  cJSON_AddNumberToObject(o, "inserts", (double)st.inserts);
  cJSON_AddNumberToObject(o, "evictions", (double)st.evictions);
  return o;
}

cJSON *kvr_router_view_load(const kvr_router_t *r) {
  cJSON *o = cJSON_CreateObject();
  char inst[24];
  snprintf(inst, sizeof inst, "%016llx", (unsigned long long)r->instance);
  cJSON_AddStringToObject(o, "instance", inst);
  if (r->sync_port)
    cJSON_AddNumberToObject(o, "sync_port", r->sync_port);
  cJSON *arr = cJSON_AddArrayToObject(o, "workers");
  uint64_t now_ns = kvr_router_now_ns(r);
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "url", w->key); /* what a peer finds the worker by */
    cJSON_AddNumberToObject(e, "in_flight", w->inflight);
    cJSON_AddNumberToObject(e, "active_tokens", (double)w->active_tokens);
    cJSON_AddNumberToObject(e, "queued_prefill_tokens", (double)w->queued_prefill_tokens);
    cJSON_AddNumberToObject(e, "prefill_backlog_tokens",
                            (double)kvr_router_worker_backlog(w, now_ns));
    if (w->metrics_seen) {
      uint64_t now_ms = now_ns / 1000000u;
      cJSON *m = cJSON_AddObjectToObject(e, "scraped");
      cJSON_AddNumberToObject(m, "age_ms",
                              now_ms > w->scraped_at_ms ? (double)(now_ms - w->scraped_at_ms) : 0);
      cJSON_AddNumberToObject(m, "num_requests_running", w->num_requests_running);
      cJSON_AddNumberToObject(m, "num_requests_waiting", w->num_requests_waiting);
      cJSON_AddNumberToObject(m, "kv_cache_usage_perc", w->kv_cache_usage);
    }
    cJSON_AddItemToArray(arr, e);
  }
  return o;
}

/* A small set of id hashes (open addressing, a power of two of slots, 0 = empty): the ids already
 * in the union. */
typedef struct id_set_s {
  uint64_t *h;
  const char **id;
  size_t mask;
} id_set_t;

/* Adds id; false when it was there already. */
static bool id_set_add(id_set_t *s, const char *id) {
  uint64_t h = XXH3_64bits(id, strlen(id)) | 1;
  for (size_t i = h & s->mask;; i = (i + 1) & s->mask) {
    if (s->h[i] == 0) {
      s->h[i] = h;
      s->id[i] = id;
      return true;
    }
    if (s->h[i] == h && strcmp(s->id[i], id) == 0)
      return false;
  }
}

size_t kvr_router_view_models(const kvr_router_t *r, kvr_buf_t *out) {
  uint64_t now = kvr_router_now_ns(r) / 1000000u;
  size_t cards = 0, workers = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w && w->models_known && kvr_router_worker_usable(w, now))
      cards += w->models.n;
  }
  size_t cap = 16;
  while (cap < 2 * cards)
    cap *= 2;
  id_set_t set = {kvr_xcalloc(cap, sizeof(uint64_t)), kvr_xcalloc(cap, sizeof(char *)), cap - 1};
  kvr_buf_puts(out, "{\"object\":\"list\",\"data\":[");
  bool first = true;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || !w->models_known || !kvr_router_worker_usable(w, now))
      continue;
    workers++;
    for (size_t j = 0; j < w->models.n; j++) {
      if (!id_set_add(&set, w->models.v[j].id))
        continue; /* listed by an earlier worker: its card stands */
      kvr_buf_puts(out, first ? "" : ",");
      kvr_buf_puts(out, w->models.v[j].card);
      first = false;
    }
  }
  kvr_buf_puts(out, "]}"); /* no newline: one worker's list comes out as vLLM's own bytes */
  free(set.h);
  free(set.id);
  return workers;
}

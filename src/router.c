/* router.c -- workers, policy, cache index and counters of `kvrouter serve` (see router.h).
 *
 * Decision flow (kvr_router_decide):
 *   request blocks --kvr_cache_index_match--> matched blocks per slot
 *   worker fields + matched blocks ----------> kvr_worker_snap_t[] (one per slot, empty slots
 * unusable) snapshots + route req + tried -----------> policy->select() --> slot The decision is
 * timed with the monotonic clock for the routing-decision latency histogram.
 *
 * Worker removal: kvr_router_drain_worker() marks a worker DRAINING; the last request to finish on
 * it (kvr_router_worker_end) or the drain call itself when nothing is in flight frees it, after the
 * cache index forgot its slot and its scrape probe was cancelled.
 */
#include "router.h"

#include "kvr.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>

const char *kvr_worker_state_name(kvr_worker_state_t s) {
  switch (s) {
#define XX(name, str)                                                                              \
  case KVR_WORKER_##name:                                                                          \
    return str;
    KVR_WORKER_STATE_MAP(XX)
#undef XX
  }
  return "unknown";
}

static uint64_t now_ms(void) {
  return kvr_now_ns() / 1000000u;
}

kvr_worker_t *kvr_router_add_worker(kvr_router_t *r, const char *url, char *err, size_t errlen) {
  char norm[512];
  if (kvr_worker_url_check(url, norm, sizeof norm, err, errlen) != 0)
    return NULL;
  int slot = -1;
  for (int i = 0; i < KVR_MAX_WORKERS; i++) {
    if (r->slots[i] && strcmp(r->slots[i]->url, norm) == 0 &&
        r->slots[i]->state != KVR_WORKER_DRAINING) {
      snprintf(err, errlen, "worker %s is already configured (id %u)", norm, r->slots[i]->id);
      return NULL;
    }
    if (r->slots[i] == NULL && slot < 0)
      slot = i;
  }
  if (slot < 0) {
    snprintf(err, errlen, "too many workers (at most %d)", KVR_MAX_WORKERS);
    return NULL;
  }
  kvr_worker_t *w = calloc(1, sizeof *w);
  if (w == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  w->router = r;
  w->id = r->next_id++;
  w->slot = slot;
  w->url = strdup(norm);
  snprintf(w->label, sizeof w->label, "%u", w->id);
  w->state = KVR_WORKER_UP;
  w->added_ms = now_ms();
  w->cache_capacity_blocks = r->cfg->cache_capacity_blocks;
  kvr_cache_index_set_capacity(r->index, slot, w->cache_capacity_blocks);
  r->slots[slot] = w;
  if ((size_t)slot + 1 > r->nslots)
    r->nslots = (size_t)slot + 1;
  r->decisions_total[slot] = 0;
  KVR_INFO("router", "worker %u added: %s", w->id, w->url);
  return w;
}

static void worker_free(kvr_router_t *r, kvr_worker_t *w) {
  kvr_scrape_cancel(r, w);
  kvr_cache_index_forget_worker(r->index, w->slot);
  r->slots[w->slot] = NULL;
  while (r->nslots > 0 && r->slots[r->nslots - 1] == NULL)
    r->nslots--;
  KVR_INFO("router", "worker %u removed: %s", w->id, w->url);
  free(w->url);
  free(w);
}

void kvr_router_drain_worker(kvr_router_t *r, kvr_worker_t *w) {
  w->state = KVR_WORKER_DRAINING;
  KVR_INFO("router", "worker %u draining (%u in flight)", w->id, w->inflight);
  if (w->inflight == 0)
    worker_free(r, w);
}

kvr_worker_t *kvr_router_worker_by_id(kvr_router_t *r, uint32_t id) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->id == id)
      return r->slots[i];
  return NULL;
}

bool kvr_router_has_usable(const kvr_router_t *r) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->state == KVR_WORKER_UP)
      return true;
  return false;
}

int kvr_router_set_policy(kvr_router_t *r, const char *name, const cJSON *params, char *err,
                          size_t errlen) {
  kvr_policy_t *p = kvr_policy_create(name, params, r->cfg->seed, err, errlen);
  if (p == NULL)
    return KVR_EINVAL;
  kvr_policy_destroy(r->policy);
  cJSON_Delete(r->policy_params);
  r->policy = p;
  r->policy_params = params ? cJSON_Duplicate(params, 1) : NULL;
  r->policy_generation++;
  KVR_INFO("router", "policy is now %s", name);
  return 0;
}

static size_t policy_index(const kvr_policy_t *p) {
  for (size_t i = 0; kvr_policy_registry[i]; i++)
    if (kvr_policy_registry[i] == p->ops)
      return i < 16 ? i : 15;
  return 15;
}

/* The part of w's queued prefill it has probably not reached yet (prefill_clock.h). */
static uint64_t worker_backlog(const kvr_worker_t *w, uint64_t now_ns) {
  return kvr_prefill_clock_backlog(&w->prefill, w->queued_prefill_tokens, now_ns);
}

int kvr_router_decide(kvr_router_t *r, const kvr_route_req_t *req, uint64_t tried, bool record,
                      kvr_decision_t *d) {
  uint64_t t0 = kvr_now_ns();
  size_t matched[KVR_MAX_WORKERS] = {0};
  if (req->nblocks)
    kvr_cache_index_match(r->index, req->blocks, req->nblocks, matched);
  uint64_t now = now_ms();
  d->nsnaps = r->nslots;
  for (size_t i = 0; i < r->nslots; i++) {
    kvr_worker_snap_t *s = &d->snaps[i];
    kvr_worker_t *w = r->slots[i];
    memset(s, 0, sizeof *s);
    if (w == NULL)
      continue;
    s->id = w->id;
    s->usable = w->state == KVR_WORKER_UP;
    s->inflight = w->inflight;
    s->active_tokens = w->active_tokens;
    s->queued_prefill_tokens = w->queued_prefill_tokens;
    s->prefill_backlog_tokens = worker_backlog(w, t0);
    s->metrics_fresh = w->metrics_seen && now - w->scraped_at_ms <= r->cfg->scrape_stale_ms;
    s->num_requests_running = w->num_requests_running;
    s->num_requests_waiting = w->num_requests_waiting;
    s->kv_cache_usage = w->kv_cache_usage;
    s->cache_capacity_blocks = w->cache_capacity_blocks;
    s->matched_blocks = matched[i];
    s->cached_blocks = kvr_cache_index_entries(r->index, i);
  }
  d->chosen = kvr_policy_select(r->policy, d->snaps, d->nsnaps, req, tried, d->scores);
  d->seconds = (double)(kvr_now_ns() - t0) / 1e9;
  if (record) {
    kvr_hist_observe(&r->decision_seconds, d->seconds);
    r->decisions_by_policy[policy_index(r->policy)]++;
    if (d->chosen >= 0)
      r->decisions_total[d->chosen]++;
    else
      r->no_worker_total++;
  }
  return d->chosen;
}

void kvr_router_worker_begin(kvr_worker_t *w, uint64_t prompt_tokens, uint64_t prefill_tokens) {
  w->inflight++;
  w->requests_total++;
  w->active_tokens += prompt_tokens;
  w->queued_prefill_tokens += prefill_tokens;
  kvr_prefill_clock_dispatch(&w->prefill, prefill_tokens, kvr_now_ns());
}

void kvr_router_worker_prefilled(kvr_worker_t *w, uint64_t prefill_tokens, uint64_t dispatched_ns,
                                 bool alone) {
  w->queued_prefill_tokens -= KVR_MIN(w->queued_prefill_tokens, prefill_tokens);
  kvr_prefill_clock_first_token(&w->prefill, prefill_tokens, dispatched_ns, alone,
                                w->queued_prefill_tokens, kvr_now_ns());
}

void kvr_router_worker_end(kvr_worker_t *w, uint64_t prompt_tokens, uint64_t prefill_left,
                           uint64_t generated) {
  /* Contributions are subtracted exactly as they were added, so these never underflow; the clamps
   * guard the invariant in release builds should a caller break it. */
  w->inflight = w->inflight ? w->inflight - 1 : 0;
  uint64_t tok = prompt_tokens + generated;
  w->active_tokens = w->active_tokens >= tok ? w->active_tokens - tok : 0;
  w->queued_prefill_tokens =
      w->queued_prefill_tokens >= prefill_left ? w->queued_prefill_tokens - prefill_left : 0;
  if (w->state == KVR_WORKER_DRAINING && w->inflight == 0)
    worker_free(w->router, w);
}

void kvr_router_worker_result(kvr_worker_t *w, bool connect_ok) {
  if (connect_ok) {
    if (w->state == KVR_WORKER_DOWN)
      KVR_INFO("router", "worker %u is up again", w->id);
    w->consecutive_failures = 0;
    if (w->state == KVR_WORKER_DOWN)
      w->state = KVR_WORKER_UP;
    return;
  }
  w->consecutive_failures++;
  if (w->state == KVR_WORKER_UP && w->consecutive_failures >= w->router->cfg->fail_threshold) {
    w->state = KVR_WORKER_DOWN;
    KVR_WARN("router", "worker %u (%s) marked down after %llu failures", w->id, w->url,
             (unsigned long long)w->consecutive_failures);
  }
}

kvr_router_t *kvr_router_new(uv_loop_t *loop, kvr_config_t *cfg, char *err, size_t errlen) {
  kvr_router_t *r = calloc(1, sizeof *r);
  if (r == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  r->loop = loop;
  r->cfg = cfg;
  kvr_hist_init(&r->decision_seconds, kvr_hist_fast_buckets, kvr_hist_fast_nbuckets);
  kvr_hist_init(&r->request_seconds, kvr_hist_latency_buckets, kvr_hist_latency_nbuckets);
  kvr_hist_init(&r->ttfb_seconds, kvr_hist_latency_buckets, kvr_hist_latency_nbuckets);
  r->index = kvr_cache_index_new(KVR_MAX_WORKERS, cfg->cache_capacity_blocks);
  r->curlm = kvr_curlm_new(loop);
  if (r->index == NULL || r->curlm == NULL) {
    snprintf(err, errlen, "cannot initialize the cache index or libcurl");
    kvr_cache_index_free(r->index);
    kvr_curlm_close(r->curlm);
    free(r);
    return NULL;
  }
  if (kvr_router_set_policy(r, cfg->policy, cfg->policy_params, err, errlen) != 0)
    goto fail;
  for (size_t i = 0; i < cfg->nworkers; i++)
    if (kvr_router_add_worker(r, cfg->workers[i], err, errlen) == NULL)
      goto fail;
  uv_timer_init(loop, &r->scrape_timer);
  r->scrape_timer.data = r;
  kvr_scrape_start(r);
  return r;
fail:
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++)
    if (r->slots[i])
      worker_free(r, r->slots[i]);
  kvr_policy_destroy(r->policy);
  cJSON_Delete(r->policy_params);
  kvr_cache_index_free(r->index);
  kvr_curlm_close(r->curlm);
  free(r);
  return NULL;
}

static void on_scrape_timer_close(uv_handle_t *h) {
  kvr_router_t *r = h->data;
  free(r);
}

void kvr_router_close(kvr_router_t *r) {
  if (r == NULL || r->closing)
    return;
  r->closing = true;
  kvr_scrape_stop(r);
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++)
    if (r->slots[i])
      worker_free(r, r->slots[i]);
  kvr_policy_destroy(r->policy);
  r->policy = NULL;
  cJSON_Delete(r->policy_params);
  kvr_cache_index_free(r->index);
  kvr_curlm_close(r->curlm);
  uv_close((uv_handle_t *)&r->scrape_timer, on_scrape_timer_close);
}

/* ---- exposition --------------------------------------------------------------------------------
 */

static void worker_labels(kvr_buf_t *l, const kvr_worker_t *w) {
  kvr_buf_reset(l);
  kvr_buf_printf(l, "worker=\"%s\",url=\"", w->label);
  kvr_metric_escape(l, w->url);
  kvr_buf_puts(l, "\"");
}

typedef double (*worker_field_fn)(const kvr_worker_t *w);

static void worker_family(kvr_router_t *r, kvr_buf_t *out, const char *name, const char *type,
                          const char *help, worker_field_fn fn) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_metric_family(out, name, type, help);
  for (size_t i = 0; i < r->nslots; i++) {
    if (r->slots[i] == NULL)
      continue;
    worker_labels(&l, r->slots[i]);
    kvr_metric_sample(out, name, l.data, fn(r->slots[i]));
  }
  kvr_buf_free(&l);
}

static double f_requests(const kvr_worker_t *w) {
  return (double)w->requests_total;
}
static double f_errors(const kvr_worker_t *w) {
  return (double)w->errors_total;
}
static double f_retries(const kvr_worker_t *w) {
  return (double)w->retries_total;
}
static double f_inflight(const kvr_worker_t *w) {
  return w->inflight;
}
static double f_active(const kvr_worker_t *w) {
  return (double)w->active_tokens;
}
static double f_prefill(const kvr_worker_t *w) {
  return (double)w->queued_prefill_tokens;
}
static double f_backlog(const kvr_worker_t *w) {
  return (double)worker_backlog(w, kvr_now_ns());
}
static double f_prefill_rate(const kvr_worker_t *w) {
  return w->prefill.rate;
}
static double f_up(const kvr_worker_t *w) {
  return w->state == KVR_WORKER_UP;
}
static double f_prompt(const kvr_worker_t *w) {
  return (double)w->prompt_tokens_total;
}
static double f_pred(const kvr_worker_t *w) {
  return (double)w->predicted_cached_tokens_total;
}
static double f_uprompt(const kvr_worker_t *w) {
  return (double)w->usage_prompt_tokens_total;
}
static double f_upred(const kvr_worker_t *w) {
  return (double)w->usage_predicted_cached_total;
}
static double f_ucached(const kvr_worker_t *w) {
  return (double)w->usage_cached_tokens_total;
}
static double f_pred_frac(const kvr_worker_t *w) {
  return w->usage_prompt_tokens_total
             ? (double)w->usage_predicted_cached_total / (double)w->usage_prompt_tokens_total
             : 0;
}
static double f_act_frac(const kvr_worker_t *w) {
  return w->usage_prompt_tokens_total
             ? (double)w->usage_cached_tokens_total / (double)w->usage_prompt_tokens_total
             : 0;
}
static double f_index(const kvr_worker_t *w) {
  return (double)kvr_cache_index_entries(w->router->index, w->slot);
}
static double f_capacity(const kvr_worker_t *w) {
  return (double)w->cache_capacity_blocks;
}
static double f_running(const kvr_worker_t *w) {
  return w->num_requests_running;
}
static double f_waiting(const kvr_worker_t *w) {
  return w->num_requests_waiting;
}
static double f_kvuse(const kvr_worker_t *w) {
  return w->kv_cache_usage;
}

void kvr_router_metrics(kvr_router_t *r, kvr_buf_t *out) {
  worker_family(r, out, "kvrouter_worker_up", "gauge", "1 if the worker takes new requests", f_up);
  worker_family(r, out, "kvrouter_worker_requests_total", "counter",
                "Requests sent to the worker (retries included)", f_requests);
  worker_family(r, out, "kvrouter_worker_errors_total", "counter",
                "Requests to the worker that failed (connect, timeout, 5xx, broken stream)",
                f_errors);
  worker_family(r, out, "kvrouter_worker_retries_total", "counter",
                "Requests retried on another worker after this one failed before responding",
                f_retries);
  worker_family(r, out, "kvrouter_worker_inflight_requests", "gauge",
                "Requests the router has outstanding on the worker", f_inflight);
  worker_family(r, out, "kvrouter_worker_active_tokens", "gauge",
                "Router estimate of prompt plus generated tokens of in-flight requests", f_active);
  worker_family(r, out, "kvrouter_worker_queued_prefill_tokens", "gauge",
                "Router estimate of uncached prompt tokens not yet answered", f_prefill);
  worker_family(r, out, "kvrouter_worker_prefill_backlog_tokens", "gauge",
                "Router estimate of the queued prefill tokens the worker has not reached yet, "
                "from its measured prefill rate",
                f_backlog);
  worker_family(r, out, "kvrouter_worker_prefill_rate_tokens_per_second", "gauge",
                "Prefill rate measured from requests dispatched to an idle prefill queue "
                "(EWMA; 0 until measured)",
                f_prefill_rate);
  worker_family(r, out, "kvrouter_worker_prompt_tokens_total", "counter",
                "Estimated prompt tokens routed to the worker", f_prompt);
  worker_family(r, out, "kvrouter_worker_predicted_cached_tokens_total", "counter",
                "Prompt tokens the cache index predicted the worker already held", f_pred);
  worker_family(r, out, "kvrouter_worker_usage_prompt_tokens_total", "counter",
                "usage.prompt_tokens of responses that reported usage", f_uprompt);
  worker_family(r, out, "kvrouter_worker_usage_predicted_cached_tokens_total", "counter",
                "Predicted cached tokens of the requests whose responses reported usage", f_upred);
  worker_family(r, out, "kvrouter_worker_usage_cached_tokens_total", "counter",
                "usage.prompt_tokens_details.cached_tokens reported by the worker", f_ucached);
  worker_family(r, out, "kvrouter_worker_predicted_cached_fraction", "gauge",
                "Predicted cached share of prompt tokens, over responses that reported usage",
                f_pred_frac);
  worker_family(r, out, "kvrouter_worker_actual_cached_fraction", "gauge",
                "Cached share of prompt tokens the worker reported in usage", f_act_frac);
  worker_family(r, out, "kvrouter_worker_index_blocks", "gauge",
                "Prefix blocks the cache index believes the worker holds", f_index);
  worker_family(r, out, "kvrouter_worker_cache_capacity_blocks", "gauge",
                "Capacity of the worker's modelled KV cache in router blocks", f_capacity);
  worker_family(r, out, "kvrouter_worker_num_requests_running", "gauge",
                "vllm:num_requests_running last scraped from the worker", f_running);
  worker_family(r, out, "kvrouter_worker_num_requests_waiting", "gauge",
                "vllm:num_requests_waiting last scraped from the worker", f_waiting);
  worker_family(r, out, "kvrouter_worker_kv_cache_usage_perc", "gauge",
                "vllm:kv_cache_usage_perc last scraped from the worker (0-1)", f_kvuse);

  kvr_metric_family(out, "kvrouter_routing_decisions_total", "counter",
                    "Routing decisions by policy and chosen worker");
  kvr_buf_t l = KVR_BUF_INIT;
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
  kvr_metric_family(out, "kvrouter_routing_decision_seconds", "histogram",
                    "Time to take one routing decision (index match plus policy)");
  kvr_metric_hist(out, "kvrouter_routing_decision_seconds", NULL, &r->decision_seconds);
  kvr_metric_family(out, "kvrouter_policy_info", "gauge", "The active routing policy");
  kvr_buf_reset(&l);
  kvr_buf_printf(&l, "policy=\"%s\"", kvr_policy_name(r->policy));
  kvr_metric_sample(out, "kvrouter_policy_info", l.data, 1);
  kvr_metric_family(out, "kvrouter_requests_total", "counter", "Client requests received");
  kvr_metric_sample(out, "kvrouter_requests_total", NULL, (double)r->requests_total);
  kvr_metric_family(out, "kvrouter_client_errors_total", "counter",
                    "Requests the router rejected itself (4xx)");
  kvr_metric_sample(out, "kvrouter_client_errors_total", NULL, (double)r->client_errors_total);
  kvr_metric_family(out, "kvrouter_client_aborts_total", "counter",
                    "Requests whose client disconnected before the response ended");
  kvr_metric_sample(out, "kvrouter_client_aborts_total", NULL, (double)r->client_aborts_total);
  kvr_metric_family(out, "kvrouter_upstream_failures_total", "counter",
                    "Proxied requests that ended in 502/504 or a broken stream");
  kvr_metric_sample(out, "kvrouter_upstream_failures_total", NULL,
                    (double)r->upstream_failures_total);
  kvr_metric_family(out, "kvrouter_request_duration_seconds", "histogram",
                    "Proxied request duration, request received to response end");
  kvr_metric_hist(out, "kvrouter_request_duration_seconds", NULL, &r->request_seconds);
  kvr_metric_family(out, "kvrouter_time_to_first_byte_seconds", "histogram",
                    "Request received to first response byte from the worker");
  kvr_metric_hist(out, "kvrouter_time_to_first_byte_seconds", NULL, &r->ttfb_seconds);
  kvr_buf_free(&l);
}

cJSON *kvr_router_workers_json(kvr_router_t *r) {
  cJSON *arr = cJSON_CreateArray();
  uint64_t now = now_ms();
  for (size_t i = 0; i < r->nslots; i++) {
    kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", w->id);
    cJSON_AddStringToObject(o, "url", w->url);
    cJSON_AddStringToObject(o, "state", kvr_worker_state_name(w->state));
    cJSON_AddNumberToObject(o, "in_flight", w->inflight);
    cJSON_AddNumberToObject(o, "requests_total", (double)w->requests_total);
    cJSON_AddNumberToObject(o, "errors_total", (double)w->errors_total);
    cJSON_AddNumberToObject(o, "active_tokens", (double)w->active_tokens);
    cJSON_AddNumberToObject(o, "queued_prefill_tokens", (double)w->queued_prefill_tokens);
    cJSON_AddNumberToObject(o, "prefill_backlog_tokens", (double)worker_backlog(w, kvr_now_ns()));
    cJSON_AddNumberToObject(o, "prefill_rate_tokens_per_second", w->prefill.rate);
    cJSON_AddNumberToObject(o, "index_blocks", (double)kvr_cache_index_entries(r->index, w->slot));
    cJSON_AddNumberToObject(o, "cache_capacity_blocks", (double)w->cache_capacity_blocks);
    cJSON *m = cJSON_AddObjectToObject(o, "scraped");
    bool fresh = w->metrics_seen && now - w->scraped_at_ms <= r->cfg->scrape_stale_ms;
    cJSON_AddBoolToObject(m, "fresh", fresh);
    if (w->metrics_seen) {
      cJSON_AddNumberToObject(m, "age_ms", (double)(now - w->scraped_at_ms));
      cJSON_AddNumberToObject(m, "num_requests_running", w->num_requests_running);
      cJSON_AddNumberToObject(m, "num_requests_waiting", w->num_requests_waiting);
      cJSON_AddNumberToObject(m, "kv_cache_usage_perc", w->kv_cache_usage);
      if (w->num_gpu_blocks) {
        cJSON_AddNumberToObject(m, "num_gpu_blocks", (double)w->num_gpu_blocks);
        cJSON_AddNumberToObject(m, "block_size", (double)w->block_size);
      }
    }
    cJSON_AddItemToArray(arr, o);
  }
  return arr;
}

cJSON *kvr_router_policy_json(kvr_router_t *r) {
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
  return o;
}

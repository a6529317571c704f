/* scrape.c -- periodic GET /metrics of every worker, on serve's loop and curl multi (scrape.h).
 *
 * Every scrape_interval_ms the timer starts one probe per worker that has none in flight. A probe
 * is a libcurl GET of URL/metrics whose body is collected (bounded at 4 MiB) and parsed for the
 * series the policies read: vllm:num_requests_running, vllm:num_requests_waiting,
 * vllm:kv_cache_usage_perc (0..1), vllm:cache_config_info{block_size=..., num_gpu_blocks=...}
 * Samples of one name are summed across label sets (several engines behind one server). The page
 * also gives vLLM's token counters (vllm:prefix_cache_hits_total, vllm:prefix_cache_queries_total,
 * vllm:prompt_tokens_total, vllm:generation_tokens_total, router.h's KVR_VLLM_COUNTER_MAP): the
 * router turns their increases from page to page into the worker's actual cached and token figures
 * when its answers carry no usage (kvr_vllm_counters_advance, then router.c).
 *
 * The probe doubles as the health check: a worker that answers anything is reachable (a DOWN worker
 * comes back UP), a connection failure counts towards the fail threshold. With scraping disabled
 * (interval 0) the timer still runs once a second, probing only DOWN workers so they can recover.
 * When vllm:cache_config_info is present the router resizes the worker's modelled cache.
 *
 * Beside it, every worker gets a GET /v1/models probe (one at a time): at once when added, every
 * MODELS_REFRESH_MS after an answer, MODELS_RETRY_MS after a failed one, and at once again when it
 * comes back up (it may have restarted with other models; the router takes requests for any model
 * on it until its list is read again). vLLM lists the ids it answers to (base names, aliases,
 * LoRA adapters with their parent) and each base's max_model_len; the router keeps the list
 * (kvr_router_on_models): which requests the worker is eligible for, the model metric labels,
 * the public GET /v1/models union, and the context that caps what the cache index learns from one
 * request. A failed refresh keeps the list read before. With scraping disabled the workers get no
 * /v1/models probe either: every worker then takes every model and the learn cap is the cache's.
 *
 * Data-parallel ranks (router.h): the workers of one URL's ranks share one API server, so they
 * share its probes: the first rank in slot order (the lead) is probed, once per tick as any
 * worker, and its answer is reported to every rank of the URL: health to each, and each its own
 * engine's figures from the one /metrics page (the engine="R" series, kvr_vllm_parse_metrics_
 * engine; a rank the page has no series for keeps the router's own accounting), and the one
 * /v1/models list to each. One scrape per URL, not one per rank.
 *
 * Structs: kvr_scrape_t holds the timer and probes[slot], at most one probe per worker slot, each
 * tagged with the id of the worker it was started for. Flow: tick -> probe_start (curl easy on the
 * multi) -> on_probe_done -> kvr__scrape_report -> kvr_router_on_health / kvr_router_on_scrape.
 * Invariant: probes[i] is non-NULL exactly while its easy handle is in the multi; a probe whose
 * worker is gone (id no longer in slot i) is cancelled at the next tick, outside curl callbacks.
 */
#include "serve/scrape.h"

#include "base/kvr.h"
#include "base/log.h"
#include "base/metrics.h"
#include "core/config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SCRAPE_MAX_BYTES (4u << 20)
#define MODELS_RETRY_MS 10000   /* after a failed GET /v1/models */
#define MODELS_REFRESH_MS 30000 /* after an answer: adapters come and go at runtime */

typedef enum { PROBE_METRICS, PROBE_MODELS } probe_kind_t;

typedef struct probe_s {
  kvr_scrape_t *s;
  probe_kind_t kind;
  uint32_t id; /* the worker it was started for */
  int slot;
  CURL *easy;
  kvr_buf_t body;
  char url[600];
  char base[520]; /* the worker's URL: a data-parallel lead's answer goes to each rank of it */
  bool dp;        /* started for a data-parallel lead */
} probe_t;

struct kvr_scrape_s {
  uv_timer_t timer;
  kvr_curlm_t *curlm;                       /* not owned */
  kvr_router_t *r;                          /* not owned; read, and reported to */
  probe_t *probes[KVR_MAX_WORKERS];         /* GET /metrics */
  probe_t *models[KVR_MAX_WORKERS];         /* GET /v1/models */
  uint64_t models_next_ms[KVR_MAX_WORKERS]; /* no models probe before this */
  bool models_were_known[KVR_MAX_WORKERS];  /* the list was known at the last tick */
  uint64_t models_for[KVR_MAX_WORKERS];     /* id + 1 of the worker the schedule is for, 0: none */
};

static void probe_free(probe_t *p) {
  curl_easy_cleanup(p->easy);
  kvr_buf_free(&p->body);
  free(p);
}

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  probe_t *p = ud;
  size_t len = size * n;
  if (p->body.len + len > SCRAPE_MAX_BYTES)
    return 0; /* too large: abort the transfer */
  kvr_buf_append(&p->body, data, len);
  return len;
}

int kvr__scrape_report(kvr_router_t *r, uint32_t id, bool reachable, bool ok, const char *page,
                       size_t len, uint64_t now_ms) {
  int rc = kvr_router_on_health(r, id, reachable);
  if (rc != 0 || !reachable || !ok)
    return rc;
  const kvr_worker_t *w = kvr_router_worker_by_id(r, id);
  kvr_vllm_metrics_t m;
  rc = kvr_vllm_parse_metrics_engine(page ? page : "", len, now_ms, w ? w->dp_rank : -1, &m);
  return rc != 0 ? rc : kvr_router_on_scrape(r, id, &m);
}

/* The ids of the live data-parallel ranks of url (at most KVR_MAX_WORKERS); their number. */
static size_t ranks_of(const kvr_router_t *r, const char *url, uint32_t *ids) {
  size_t n = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w && w->dp_rank >= 0 && w->state != KVR_WORKER_DRAINING && strcmp(w->url, url) == 0)
      ids[n++] = w->id;
  }
  return n;
}

/* ---- probes -----------------------------------------------------------------------------------
 */

/* A /v1/models answer: the worker's list and the next refresh, or a later retry. */
static void models_done(probe_t *p, CURLcode result, long status) {
  kvr_vllm_models_t list;
  uint64_t now = kvr_now_ns() / 1000000u;
  p->s->models[p->slot] = NULL;
  const char *text = p->body.data ? p->body.data : "";
  if (result == CURLE_OK && status == 200 &&
      kvr_vllm_parse_model_list(text, p->body.len, &list) == 0) {
    kvr_router_on_models(p->s->r, p->id, &list);
    kvr_vllm_models_free(&list);
    uint32_t ids[KVR_MAX_WORKERS];
    size_t n = p->dp ? ranks_of(p->s->r, p->base, ids) : 0;
    for (size_t k = 0; k < n; k++) /* the lead's list is every rank's: one server */
      if (ids[k] != p->id && kvr_vllm_parse_model_list(text, p->body.len, &list) == 0) {
        kvr_router_on_models(p->s->r, ids[k], &list);
        kvr_vllm_models_free(&list);
      }
    p->s->models_next_ms[p->slot] = now + MODELS_REFRESH_MS;
  } else {
    KVR_DEBUG("scrape", "worker %u: GET /v1/models listed no model (status %ld, %s)", p->id, status,
              curl_easy_strerror(result));
    p->s->models_next_ms[p->slot] = now + MODELS_RETRY_MS;
  }
  probe_free(p);
}

static void on_probe_done(CURL *easy, CURLcode result, void *data) {
  probe_t *p = data;
  long status = 0;
  if (p->kind == PROBE_MODELS) {
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
    models_done(p, result, status);
    return;
  }
  p->s->probes[p->slot] = NULL;
  curl_off_t connect_us = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(easy, CURLINFO_CONNECT_TIME_T, &connect_us);
  /* Reachable is what health means: a slow or failing /metrics (busy API process) leaves the
   * worker up with stale figures; only a failure to connect counts towards DOWN. */
  bool reachable = result == CURLE_OK || status > 0 || connect_us > 0;
  if (!reachable && kvr_router_worker_by_id(p->s->r, p->id) != NULL)
    KVR_DEBUG("scrape", "worker %u: %s", p->id, curl_easy_strerror(result));
  uint64_t now_ms = kvr_now_ns() / 1000000u;
  bool ok = result == CURLE_OK && status == 200;
  kvr__scrape_report(p->s->r, p->id, reachable, ok, p->body.data, p->body.len, now_ms);
  uint32_t ids[KVR_MAX_WORKERS];
  size_t n = p->dp ? ranks_of(p->s->r, p->base, ids) : 0;
  for (size_t k = 0; k < n; k++) /* the other ranks behind the same server */
    if (ids[k] != p->id)
      kvr__scrape_report(p->s->r, ids[k], reachable, ok, p->body.data, p->body.len, now_ms);
  probe_free(p);
}

static void probe_start(kvr_scrape_t *s, const kvr_worker_t *w, probe_kind_t kind) {
  const kvr_config_t *cfg = s->r->cfg;
  probe_t *p = kvr_xcalloc(1, sizeof *p);
  p->s = s;
  p->kind = kind;
  p->id = w->id;
  p->slot = w->slot;
  snprintf(p->url, sizeof p->url, "%s%s", w->url, kind == PROBE_MODELS ? "/v1/models" : "/metrics");
  snprintf(p->base, sizeof p->base, "%s", w->url);
  p->dp = w->dp_rank >= 0;
  uint64_t timeout = KVR_MAX(2 * cfg->scrape_interval_ms, (uint64_t)5000);
  p->easy = kvr_curl_easy_new(p->url, (long)cfg->connect_timeout_ms, (long)timeout, on_body, p);
  if (kvr_curlm_add(s->curlm, p->easy, on_probe_done, p) != 0) {
    probe_free(p);
    return;
  }
  (kind == PROBE_MODELS ? s->models : s->probes)[p->slot] = p;
}

static void probe_cancel(kvr_scrape_t *s, probe_t **pp) {
  probe_t *p = *pp;
  if (p == NULL)
    return;
  kvr_curlm_cancel(s->curlm, p->easy);
  probe_free(p);
  *pp = NULL;
}

/* Starts a /v1/models probe of w when one is due: its first, a refresh, a retry, or at once when
 * its list became unknown since the last tick (it came back up). */
static void models_tick(kvr_scrape_t *s, const kvr_worker_t *w, uint64_t now_ms) {
  size_t i = (size_t)w->slot;
  if (s->models_for[i] != (uint64_t)w->id + 1) { /* a new worker in the slot: ask it at once */
    s->models_for[i] = (uint64_t)w->id + 1;
    s->models_next_ms[i] = 0;
    s->models_were_known[i] = false;
  }
  if (s->models_were_known[i] && !w->models_known)
    s->models_next_ms[i] = 0;
  s->models_were_known[i] = w->models_known;
  if (s->r->cfg->scrape_interval_ms == 0 || s->models[i] || now_ms < s->models_next_ms[i] ||
      w->state == KVR_WORKER_DOWN || w->state == KVR_WORKER_DRAINING)
    return;
  probe_start(s, w, PROBE_MODELS);
}

/* Marks the data-parallel ranks of w's URL after w's slot: w, the lead, is probed for them. */
static void cover_ranks(const kvr_router_t *r, const kvr_worker_t *w, bool *covered) {
  for (size_t j = (size_t)w->slot + 1; j < r->nslots; j++) {
    const kvr_worker_t *o = r->slots[j];
    if (o && o->dp_rank >= 0 && strcmp(o->url, w->url) == 0)
      covered[j] = true;
  }
}

static void on_tick(uv_timer_t *t) {
  kvr_scrape_t *s = t->data;
  const kvr_router_t *r = s->r;
  uint64_t now_ms = kvr_now_ns() / 1000000u;
  static bool covered[KVR_MAX_WORKERS]; /* ranks probed through their lead (one loop: static) */
  memset(covered, 0, sizeof covered);
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++) {
    const kvr_worker_t *w = i < r->nslots ? r->slots[i] : NULL;
    if (w && covered[i]) { /* a rank whose lead is probed: no probe of its own */
      probe_cancel(s, &s->probes[i]);
      probe_cancel(s, &s->models[i]);
      s->models_for[i] = 0;
      continue;
    }
    if (w && w->dp_rank >= 0 && w->state != KVR_WORKER_DRAINING)
      cover_ranks(r, w, covered);
    if (s->probes[i] && (w == NULL || s->probes[i]->id != w->id))
      probe_cancel(s, &s->probes[i]); /* its worker was removed */
    if (s->models[i] && (w == NULL || s->models[i]->id != w->id)) {
      probe_cancel(s, &s->models[i]);
      s->models_next_ms[i] = 0; /* the slot's next worker is asked at once */
    }
    if (w != NULL) {
      models_tick(s, w, now_ms);
    } else {
      s->models_next_ms[i] = 0;
      s->models_were_known[i] = false;
      s->models_for[i] = 0;
    }
    if (w == NULL || s->probes[i] || w->state == KVR_WORKER_DRAINING)
      continue;
    if (r->cfg->scrape_interval_ms == 0 && w->state != KVR_WORKER_DOWN)
      continue;
    probe_start(s, w, PROBE_METRICS);
  }
}

kvr_scrape_t *kvr_scrape_new(uv_loop_t *loop, kvr_curlm_t *curlm, kvr_router_t *r) {
  kvr_scrape_t *s = kvr_xcalloc(1, sizeof *s);
  s->curlm = curlm;
  s->r = r;
  uv_timer_init(loop, &s->timer);
  s->timer.data = s;
  uint64_t interval = r->cfg->scrape_interval_ms;
  uint64_t period = interval ? interval : 1000;
  uv_timer_start(&s->timer, on_tick, interval ? 0 : period, period);
  return s;
}

static void on_timer_closed(uv_handle_t *h) {
  free(h->data);
}

void kvr_scrape_close(kvr_scrape_t *s) {
  if (s == NULL)
    return;
  uv_timer_stop(&s->timer);
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++) {
    probe_cancel(s, &s->probes[i]);
    probe_cancel(s, &s->models[i]);
  }
  uv_close((uv_handle_t *)&s->timer, on_timer_closed);
}

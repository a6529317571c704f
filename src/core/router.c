/* router.c -- workers, policy, cache index and counters of `kvrouter serve` (see router.h).
 *
 * The one writer of router and worker state. Every other module reports what happened through a
 * call here; nothing in this file knows about loops, sockets or curl, so the whole of it runs in a
 * unit test with a config and nothing else.
 *
 * Decision flow (kvr_router_decide):
 *   request blocks --kvr_cache_index_match--> matched blocks per slot
 *   token-block chain --kvr_kv_index_match---> on precise workers (their KV-event stream is
 *                                              complete), the matched blocks instead
 *   worker fields + peers' load + matched ----> kvr_worker_snap_t[] (one per slot, empty slots
 *                                              and workers not serving the request's model
 *                                              unusable; rank: the rendezvous tie-break)
 *   snapshots + route req + tried set -------> policy->select() --> slot
 * The tried set is built per decision from the caller's short list of tried slots (and the
 * workers at the admission bound on a first attempt) in the router's scratch, a bitset sized to
 * the slots; the snapshots and scores live in that scratch too (grown with the slots, so a
 * decision costs O(workers in use), never O(KVR_MAX_WORKERS)). The decision is timed with the
 * monotonic clock for the routing-decision latency histogram.
 *
 * A request's load on its worker (the accounting invariant: what on_dispatch adds, on_end removes):
 *   on_dispatch  inflight += 1, active_tokens += prompt, queued_prefill_tokens += prefill;
 *                the record d gets prompt, prefill, generated = 0, open
 *   on_token     active_tokens += 1 and d.generated += 1; the first token also moves d.prefill
 *                out of queued_prefill_tokens and sets d.prefill = 0
 *   on_end       inflight -= 1, active_tokens -= d.prompt + d.generated,
 *                queued_prefill_tokens -= d.prefill; d closed
 * These three functions are the only writers of those three worker fields, and each changes the
 * worker and the record together, so at every moment the worker's load is the sum of its open
 * records. The clamps in on_end only guard release builds against a broken caller.
 *
 * Worker removal: kvr_router_drain_worker() marks a worker DRAINING; the last request to end on it
 * (kvr_router_on_end) or the drain call itself when nothing is in flight frees it, after the cache
 * index forgot its slot. A scrape probe or admin call still in flight for it finds its id gone.
 *
 * Worker states: UP -> DOWN (fail_threshold connection failures, kvr_router_on_health) -> UP (a
 * probe reached it); UP -> EJECTED (outlier_consecutive failed attempts, kvr_router_on_result)
 * -> half-open when ejected_until_ms has passed (kvr_router_worker_usable: one trial, marked by
 * trial_inflight and the record's trial flag) -> UP on a successful trial, EJECTED again on a
 * failed one; any -> DRAINING (admin). The cache index learns only through kvr_router_on_learn,
 * capped at the worker's max_model_len (kvr_router_learn_cap); the proxy calls it for 2xx answers
 * only. The retry budget (retries_inflight) and the admission counters are router-wide.
 *
 * Actual cached tokens and token counts: a default vLLM sends usage only in non-streamed answers
 * and in streams that ask (stream_options.include_usage), and usage.prompt_tokens_details only
 * with --enable-prompt-tokens-details (then only when cached_tokens is not 0). Its /metrics always
 * has vllm:prefix_cache_hits_total and the token counters. Each worker has two sources of actual
 * figures, the cached tokens (cached_source) and the prompt and generated tokens (tokens_source),
 * and each is exactly one of:
 *   scrape  (the start) the counters' increases from page to page (kvr_vllm_counters_advance:
 *           counted from the first page the router saw; a restart counts from the new values);
 *   usage   from the first answer whose usage shows the figure (details for the cached tokens, any
 *           usage for the tokens) on for good: that answer's and later ones' usage. The counters'
 *           increases are no longer added.
 * A page's increases are not added at once: the page waits (pending[], oldest first) until every
 * request in flight on the worker when it came has ended (kvr_router_on_end counts them down),
 * then is committed, in order; committed_ns is the last committed page's time (0: none yet; the
 * first page, the baseline, has no increases but waits too). At the switch, the
 * pages still pending are dropped for that figure, and usage counts the requests dispatched after
 * committed_ns (cut_ns): every request whose tokens a committed page may hold had ended, without
 * usage, before that page was committed, so nothing is counted twice. Exact when every answer
 * carries usage (the first answer, whose pages were still pending, counts whole); with mixed
 * answers, the tokens of answers without usage in the dropped pages are missed (once per worker).
 * More than KVR_PENDING_PAGES pending pages (a request open that long) commit the oldest early:
 * still never counted twice (the cut moves past the requests it holds), possibly missed. In usage
 * mode a streamed answer without usage adds nothing (answers_without_usage_total counts them).
 * The scraped counters also count requests that did not come through this router (other replicas,
 * direct clients): scrape figures are the worker's, usage figures this router's.
 */
#include "core/router.h"

#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

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

static uint64_t real_clock(void *ctx) {
  (void)ctx;
  return kvr_now_ns();
}

void kvr_router_set_clock(kvr_router_t *r, uint64_t (*clock)(void *ctx), void *ctx) {
  r->clock = clock ? clock : real_clock;
  r->clock_ctx = clock ? ctx : NULL;
}

uint64_t kvr_router_now_ns(const kvr_router_t *r) {
  return r->clock(r->clock_ctx);
}

static uint64_t now_ms(const kvr_router_t *r) {
  return kvr_router_now_ns(r) / 1000000u;
}

kvr_worker_t *kvr__router_worker_by_id(kvr_router_t *r, uint32_t id) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->id == id)
      return r->slots[i];
  return NULL;
}

/* The worker an open dispatch record is accounted on (alive while the record is open). */
static kvr_worker_t *record_worker(kvr_router_t *r, const kvr_router_dispatch_t *d) {
  if (!d->open || d->slot < 0 || d->slot >= KVR_MAX_WORKERS)
    return NULL;
  kvr_worker_t *w = r->slots[d->slot];
  /* a peer's synced request may outlive its worker, whose slot a new worker may then take */
  return w && w->id == d->worker_id ? w : NULL;
}

/* ---- workers ----------------------------------------------------------------------------------
 */

void kvr_router_worker_key(char *out, size_t outlen, const char *url, int32_t rank) {
  if (rank < 0)
    snprintf(out, outlen, "%s", url);
  else
    snprintf(out, outlen, "%s#dp=%d", url, (int)rank);
}

/* A live (not draining) worker with this URL, or NULL: a URL is served whole or by ranks, once. */
static const kvr_worker_t *url_taken(const kvr_router_t *r, const char *url) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->state != KVR_WORKER_DRAINING &&
        strcmp(r->slots[i]->url, url) == 0)
      return r->slots[i];
  return NULL;
}

/* The first free slot at or after from, or -1. */
static int free_slot_from(const kvr_router_t *r, int from) {
  for (int i = from; i < KVR_MAX_WORKERS; i++)
    if (r->slots[i] == NULL)
      return i;
  return -1;
}

/* A new worker of url (normalized) in the free slot, rank and size as kvr_worker_t says. */
static kvr_worker_t *worker_new(kvr_router_t *r, int slot, const char *url, int32_t rank,
                                uint32_t size) {
  kvr_worker_t *w = kvr_xcalloc(1, sizeof *w);
  char key[600];
  w->url = kvr_xstrdup(url);
  kvr_router_worker_key(key, sizeof key, url, rank);
  w->key = kvr_xstrdup(key);
  w->dp_rank = rank;
  w->dp_size = size;
  w->id = r->next_id++;
  w->slot = slot;
  snprintf(w->label, sizeof w->label, "%u", w->id);
  w->state = KVR_WORKER_UP;
  w->added_ms = now_ms(r);
  w->cache_capacity_blocks = r->cfg->cache_capacity_blocks;
  kvr_cache_index_set_capacity(r->index, (size_t)slot, w->cache_capacity_blocks);
  kvr_kv_index_clear(r->kv_index, (size_t)slot);
  snprintf(w->kv_mode, sizeof w->kv_mode, "off");
  r->slots[slot] = w;
  if ((size_t)slot + 1 > r->nslots)
    r->nslots = (size_t)slot + 1;
  r->decisions_total[slot] = 0;
  if (rank < 0)
    KVR_INFO("router", "worker %u added: %s", w->id, w->url);
  else
    KVR_INFO("router", "worker %u added: %s data-parallel rank %d of %u", w->id, w->url, (int)rank,
             size);
  return w;
}

int kvr_router_add_workers(kvr_router_t *r, const char *url, uint32_t dp_size, const char *events,
                           const char *replay, char *err, size_t errlen) {
  char norm[512], ev[600], rp[600];
  if (kvr_url_worker(url, norm, sizeof norm, err, errlen) != 0)
    return KVR_EINVAL;
  if (dp_size > KVR_DP_SIZE_MAX) {
    snprintf(err, errlen, "worker %s: dp_size must be 1..%d", norm, KVR_DP_SIZE_MAX);
    return KVR_EINVAL;
  }
  const kvr_worker_t *old = url_taken(r, norm);
  if (old) {
    snprintf(err, errlen, "worker %s is already configured (id %u)", norm, old->id);
    return KVR_EINVAL;
  }
  uint32_t n = dp_size ? dp_size : 1;
  for (uint32_t k = 0; events && k < n; k++) /* every rank's endpoint, before adding any */
    if (kvr_url_kv_endpoint_rank(events, k, ev, sizeof ev, err, errlen) != 0 ||
        (replay && kvr_url_kv_endpoint_rank(replay, k, rp, sizeof rp, err, errlen) != 0))
      return KVR_EINVAL;
  int slots[KVR_DP_SIZE_MAX], slot = -1;
  for (uint32_t k = 0; k < n; k++) {
    slot = free_slot_from(r, slot + 1);
    if (slot < 0) {
      r->workers_refused_total++;
      snprintf(err, errlen,
               "too many workers: this router serves at most %d (KVR_MAX_WORKERS)%s; drain one "
               "first",
               KVR_MAX_WORKERS, n > 1 ? " and this URL needs one per data-parallel rank" : "");
      return KVR_ELIMIT;
    }
    slots[k] = slot;
  }
  /* The cache index grows its per-worker state with the fleet (and its table with the blocks, a
   * bucket at a time: nothing is sized ahead, so no rehash ever stalls the loop). */
  if (kvr_cache_index_set_workers(r->index, (size_t)slots[n - 1] + 1) != 0) {
    snprintf(err, errlen, "cannot grow the cache index to %d workers", slots[n - 1] + 1);
    return KVR_ENOMEM;
  }
  for (uint32_t k = 0; k < n; k++) {
    kvr_worker_t *w = worker_new(r, slots[k], norm, dp_size ? (int32_t)k : -1, dp_size);
    if (events) {
      kvr_url_kv_endpoint_rank(events, k, ev, sizeof ev, err, errlen);
      if (replay)
        kvr_url_kv_endpoint_rank(replay, k, rp, sizeof rp, err, errlen);
      kvr_router_set_worker_kv(r, w->id, ev, replay ? rp : NULL);
    }
  }
  return (int)n;
}

const kvr_worker_t *kvr_router_add_worker(kvr_router_t *r, const char *url, char *err,
                                          size_t errlen) {
  int n = kvr_router_add_workers(r, url, 0, NULL, NULL, err, errlen);
  if (n <= 0)
    return NULL;
  char norm[512];
  kvr_url_worker(url, norm, sizeof norm, err, errlen);
  return kvr_router_worker_serving(r, norm);
}

static void worker_free(kvr_router_t *r, kvr_worker_t *w) {
  kvr_cache_index_forget_worker(r->index, (size_t)w->slot);
  kvr_kv_index_clear(r->kv_index, (size_t)w->slot);
  free(w->kv_events);
  free(w->kv_replay);
  kvr_vllm_models_free(&w->models);
  free(w->labels);
  for (size_t i = 0; i < w->nlora_loading; i++)
    free(w->lora_loading[i]);
  free(w->lora_loading);
  r->slots[w->slot] = NULL;
  while (r->nslots > 0 && r->slots[r->nslots - 1] == NULL)
    r->nslots--;
  KVR_INFO("router", "worker %u removed: %s", w->id, w->key);
  free(w->url);
  free(w->key);
  free(w);
}

int kvr_router_drain_worker(kvr_router_t *r, uint32_t id) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return KVR_ENOENT;
  w->state = KVR_WORKER_DRAINING;
  KVR_INFO("router", "worker %u draining (%u in flight)", w->id, w->inflight);
  if (w->inflight == 0)
    worker_free(r, w);
  return 0;
}

const kvr_worker_t *kvr_router_worker_by_id(const kvr_router_t *r, uint32_t id) {
  return kvr__router_worker_by_id((kvr_router_t *)r, id); /* read only: handed back const */
}

static kvr_worker_t *worker_serving(const kvr_router_t *r, const char *key) {
  for (size_t i = 0; i < r->nslots; i++) {
    kvr_worker_t *w = r->slots[i];
    if (w && w->state != KVR_WORKER_DRAINING && strcmp(w->key, key) == 0)
      return w;
  }
  return NULL;
}

const kvr_worker_t *kvr_router_worker_serving(const kvr_router_t *r, const char *key) {
  return worker_serving(r, key);
}

const kvr_worker_t *kvr_router_worker_serving_rank(const kvr_router_t *r, const char *url,
                                                   int32_t rank) {
  char key[600];
  kvr_router_worker_key(key, sizeof key, url, rank);
  return worker_serving(r, key);
}

bool kvr_router_has_usable(const kvr_router_t *r) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->state == KVR_WORKER_UP)
      return true;
  return false;
}

bool kvr_router_worker_usable(const kvr_worker_t *w, uint64_t now_ms) {
  if (w->state == KVR_WORKER_UP)
    return true;
  return w->state == KVR_WORKER_EJECTED && now_ms >= w->ejected_until_ms && !w->trial_inflight;
}

uint64_t kvr_router_worker_backlog(const kvr_worker_t *w, uint64_t now_ns) {
  return kvr_prefill_clock_backlog(&w->prefill, w->queued_prefill_tokens, now_ns);
}

/* Prefill tokens in the worker's clock: its own plus every synced peer's. */
static uint64_t pending_all(const kvr_worker_t *w) {
  uint64_t n = w->queued_prefill_tokens;
  for (size_t p = 0; p < KVR_MAX_PEERS; p++)
    n += w->synced[p].queued_prefill_tokens;
  return n;
}

bool kvr_router_worker_fresh(const kvr_router_t *r, const kvr_worker_t *w, uint64_t at_ms) {
  return w->metrics_seen && at_ms - w->scraped_at_ms <= r->cfg->scrape_stale_ms;
}

int kvr_router_set_policy(kvr_router_t *r, const char *name, const cJSON *params, char *err,
                          size_t errlen) {
  kvr_policy_t *p = kvr_policy_create(name, params, r->cfg->seed, err, errlen);
  if (p == NULL)
    return KVR_EINVAL;
  kvr_policy_destroy(r->policy);
  r->policy = p;
  KVR_INFO("router", "policy is now %s", name);
  return 0;
}

/* ---- model labels -------------------------------------------------------------------------------
 */

static uint64_t name_hash(const char *name) {
  return XXH3_64bits(name, strlen(name));
}

/* Adds a label for name (the caller checked it is new and there is room); returns its index. */
static uint16_t label_add(kvr_router_t *r, const char *name) {
  KVR_GROW(r->model_labels, r->nmodel_labels, r->model_labels_cap, 1);
  kvr_model_label_t *l = &r->model_labels[r->nmodel_labels];
  memset(l, 0, sizeof *l);
  l->name = kvr_xstrdup(name);
  l->hash = name_hash(name);
  kvr_hist_init(&l->ttft_seconds, kvr_hist_latency_buckets, kvr_hist_latency_nbuckets);
  kvr_hist_init(&l->itl_seconds, kvr_hist_itl_buckets, kvr_hist_itl_nbuckets);
  return (uint16_t)r->nmodel_labels++;
}

/* The label index of a listed name, or -1 when it has none. */
static int label_find(const kvr_router_t *r, const char *name) {
  uint64_t h = name_hash(name);
  for (size_t i = KVR_MODEL_LABEL_NONE + 1; i < r->nmodel_labels; i++)
    if (r->model_labels[i].hash == h && strcmp(r->model_labels[i].name, name) == 0)
      return (int)i;
  return -1;
}

/* The label of a request naming model: none, its listed name, or other. */
static uint16_t label_of(const kvr_router_t *r, const char *model) {
  if (model == NULL || model[0] == '\0')
    return KVR_MODEL_LABEL_NONE;
  int i = label_find(r, model);
  return i < 0 ? KVR_MODEL_LABEL_OTHER : (uint16_t)i;
}

/* A name that may be a label value and an access-log field as it is: printable ASCII, no space,
 * quote or backslash, and not one of the two fixed labels. */
static bool label_safe(const char *name) {
  if (strcmp(name, "other") == 0 || strcmp(name, "none") == 0)
    return false;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++)
    if (*p <= ' ' || *p > '~' || *p == '"' || *p == '\\')
      return false;
  return true;
}

/* The label of a name a worker lists, entered when new and there is room; other otherwise. */
static uint16_t label_listed(kvr_router_t *r, const char *name) {
  int i = label_find(r, name);
  if (i >= 0)
    return (uint16_t)i;
  if (!label_safe(name))
    return KVR_MODEL_LABEL_OTHER;
  if (r->nmodel_labels >= KVR_MODEL_LABELS_MAX + 2) {
    if (!r->model_labels_full_warned)
      KVR_WARN("router",
               "more than %d model names listed by the workers: further ones are counted under "
               "model=\"other\" in the metrics",
               KVR_MODEL_LABELS_MAX);
    r->model_labels_full_warned = true;
    return KVR_MODEL_LABEL_OTHER;
  }
  return label_add(r, name);
}

const char *kvr_router_model_label(const kvr_router_t *r, const char *model) {
  return r->model_labels[label_of(r, model)].name;
}

/* kvr_router_worker_serves with model's hash (kvr_vllm_model_hash) computed once by a caller that
 * asks every worker. */
static bool serves(const kvr_worker_t *w, const char *model, uint64_t hash) {
  if (model == NULL || model[0] == '\0' || !w->models_known || !w->models.complete)
    return true;
  return kvr_vllm_models_find_hash(&w->models, model, hash) != NULL;
}

static uint64_t model_hash(const char *model) {
  return model ? kvr_vllm_model_hash(model) : 0;
}

/* ---- LoRA adapters ------------------------------------------------------------------------------
 */

const kvr_lora_adapter_t *kvr_router_lora_dynamic(const kvr_router_t *r, const char *model) {
  for (size_t i = 0; model && model[0] && i < r->cfg->nlora_adapters; i++)
    if (strcmp(r->cfg->lora_adapters[i].name, model) == 0)
      return &r->cfg->lora_adapters[i];
  return NULL;
}

/* The model a request names, looked up once for a pass over the workers: its hash and, when the
 * router may load it (kvr_router_lora_dynamic), the adapter and its base's hash. */
typedef struct want_s {
  const char *model;
  uint64_t hash;
  const kvr_lora_adapter_t *dyn;
  uint64_t base_hash;
} want_t;

static want_t want_of(const kvr_router_t *r, const char *model) {
  want_t m = {model, model_hash(model), kvr_router_lora_dynamic(r, model), 0};
  if (m.dyn && m.dyn->base)
    m.base_hash = model_hash(m.dyn->base);
  return m;
}

/* Whether w may take the request: it serves the model, or the router may load the adapter on it
 * (it serves the adapter's base; any worker when the adapter names none). */
static bool eligible(const kvr_worker_t *w, const want_t *m) {
  if (serves(w, m->model, m->hash))
    return true;
  return m->dyn && (m->dyn->base == NULL || serves(w, m->dyn->base, m->base_hash));
}

static bool lora_loading(const kvr_worker_t *w, const char *name) {
  for (size_t i = 0; i < w->nlora_loading; i++)
    if (strcmp(w->lora_loading[i], name) == 0)
      return true;
  return false;
}

/* kvr_adapter_state_t of the request's model on w: running when w's fresh /metrics has it in the
 * batch, loaded when w lists it or the router is loading it there, else none (and none for a
 * base model name, which every eligible worker lists alike). */
static uint8_t adapter_state(const kvr_worker_t *w, const want_t *m, bool fresh) {
  if (m->model == NULL || m->model[0] == '\0')
    return KVR_ADAPTER_NONE;
  const kvr_vllm_model_t *card = kvr_vllm_models_find_hash(&w->models, m->model, m->hash);
  if (card && card->parent == NULL && m->dyn == NULL)
    return KVR_ADAPTER_NONE;
  if (fresh && w->lora.present && kvr_vllm_lora_list_has(w->lora.running, m->model))
    return KVR_ADAPTER_RUNNING;
  return card || lora_loading(w, m->model) ? KVR_ADAPTER_LOADED : KVR_ADAPTER_NONE;
}

const kvr_lora_adapter_t *kvr_router_lora_needs_load(const kvr_router_t *r, const kvr_worker_t *w,
                                                     const char *model) {
  const kvr_lora_adapter_t *a = kvr_router_lora_dynamic(r, model);
  return a && kvr_vllm_models_find(&w->models, model) == NULL ? a : NULL;
}

/* ---- lifecycle --------------------------------------------------------------------------------
 */

kvr_router_t *kvr_router_new(const kvr_config_t *cfg, char *err, size_t errlen) {
  kvr_router_t *r = kvr_xcalloc(1, sizeof *r);
  r->cfg = cfg;
  r->clock = real_clock;
  kvr_hist_init(&r->decision_seconds, kvr_hist_fast_buckets, kvr_hist_fast_nbuckets);
  kvr_hist_init(&r->request_seconds, kvr_hist_latency_buckets, kvr_hist_latency_nbuckets);
  kvr_hist_init(&r->ttfb_seconds, kvr_hist_latency_buckets, kvr_hist_latency_nbuckets);
  kvr_hist_init(&r->tokenize_seconds, kvr_hist_call_buckets, kvr_hist_call_nbuckets);
  label_add(r, "other");                                         /* KVR_MODEL_LABEL_OTHER */
  label_add(r, "none");                                          /* KVR_MODEL_LABEL_NONE */
  r->index = kvr_cache_index_new(1, cfg->cache_capacity_blocks); /* grows with the workers */
  if (r->index == NULL) {
    snprintf(err, errlen, "cannot create the cache index");
    free(r);
    return NULL;
  }
  r->kv_index = kvr_kv_index_new(KVR_MAX_WORKERS);
  r->response_ids = kvr_affinity_new(cfg->response_ids_max);
  r->session_keys = kvr_affinity_new(cfg->session_keys_max);
  r->instance = kvr_random_seed() | 1;
  if (kvr_router_set_policy(r, cfg->policy, cfg->policy_params, err, errlen) != 0)
    goto fail;
  for (size_t i = 0; i < cfg->nworkers; i++) {
    uint32_t dp = cfg->worker_dp_size ? cfg->worker_dp_size[i] : 0;
    const char *ev = cfg->worker_kv_events ? cfg->worker_kv_events[i] : NULL;
    if (kvr_router_add_workers(r, cfg->workers[i], dp, ev, ev ? cfg->worker_kv_replay[i] : NULL,
                               err, errlen) < 0)
      goto fail;
  }
  return r;
fail:
  kvr_router_free(r);
  return NULL;
}

void kvr_router_free(kvr_router_t *r) {
  if (r == NULL)
    return;
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++)
    if (r->slots[i])
      worker_free(r, r->slots[i]);
  kvr_policy_destroy(r->policy);
  kvr_cache_index_free(r->index);
  kvr_kv_index_free(r->kv_index);
  kvr_affinity_free(r->response_ids);
  kvr_affinity_free(r->session_keys);
  free(r->responses);
  for (size_t i = 0; i < r->nmodel_labels; i++)
    free(r->model_labels[i].name);
  free(r->model_labels);
  free(r->snaps);
  free(r->scores);
  free(r->matched);
  free(r->tried_words);
  free(r);
}

/* ---- decisions --------------------------------------------------------------------------------
 */

static size_t policy_index(const kvr_policy_t *p) {
  for (size_t i = 0; kvr_policy_registry[i]; i++)
    if (kvr_policy_registry[i] == p->ops)
      return i < 16 ? i : 15;
  return 15;
}

static void snapshot(const kvr_router_t *r, const kvr_worker_t *w, size_t matched, uint64_t now_ns,
                     kvr_worker_snap_t *s) {
  kvr_peer_load_t peers;
  kvr_router_peer_load(r, w, now_ns / 1000000u, &peers);
  s->id = w->id;
  s->usable = kvr_router_worker_usable(w, now_ns / 1000000u);
  /* the load is the cluster's: this replica's own plus what its peers reported recently */
  s->inflight = w->inflight + peers.inflight;
  s->active_tokens = w->active_tokens + peers.active_tokens;
  s->queued_prefill_tokens = w->queued_prefill_tokens + peers.queued_prefill_tokens;
  /* the clock holds this replica's prefill and its synced peers' (polled peers add their own) */
  uint64_t pending = w->queued_prefill_tokens + peers.synced_prefill_tokens;
  s->prefill_backlog_tokens =
      kvr_prefill_clock_backlog(&w->prefill, pending, now_ns) + peers.prefill_backlog_tokens;
  s->metrics_fresh = kvr_router_worker_fresh(r, w, now_ns / 1000000u);
  s->num_requests_running = w->num_requests_running;
  s->num_requests_waiting = w->num_requests_waiting;
  s->kv_cache_usage = w->kv_cache_usage;
  s->cache_capacity_blocks = w->cache_capacity_blocks;
  s->matched_blocks = matched;
  s->open_sessions = w->open_sessions;
  s->cached_blocks = kvr_cache_index_entries(r->index, (size_t)w->slot);
}

/* A precise worker's match: the leading token blocks its engine holds, in the approximate index's
 * block units (the unit policies read), at most the request's blocks. False (matched untouched)
 * when the worker is not precise or the request has no ids of that block size. */
static bool precise_match(const kvr_router_t *r, const kvr_worker_t *w, const kvr_route_req_t *req,
                          size_t *matched) {
  uint32_t bs = kvr_kv_index_block_size(r->kv_index, (size_t)w->slot);
  if (!w->kv_precise || req->kv_chain == NULL || req->kv_block_size == 0 ||
      (bs != 0 && bs != req->kv_block_size))
    return false;
  if (bs == 0) { /* nothing stored since the stream began: the engine holds nothing */
    *matched = 0;
    return true;
  }
  size_t n = kvr_kv_index_match(r->kv_index, (size_t)w->slot, req->kv_chain, req->kv_nchain);
  uint64_t tokens = (uint64_t)n * req->kv_block_size;
  uint64_t blocks = tokens * KVR_CHARS_PER_TOKEN / r->cfg->block_chars;
  *matched = (size_t)KVR_MIN(blocks, (uint64_t)req->nblocks);
  return true;
}

/* Makes the decision scratch hold n slots (doubling, so a growing fleet reallocates it a few
 * times). */
static void scratch_reserve(kvr_router_t *r, size_t n) {
  if (n <= r->scratch_cap)
    return;
  size_t cap = KVR_MAX(n, 2 * r->scratch_cap);
  cap = KVR_MAX(cap, (size_t)8);
  r->snaps = kvr_xrealloc(r->snaps, cap * sizeof *r->snaps);
  r->scores = kvr_xrealloc(r->scores, cap * sizeof *r->scores);
  r->matched = kvr_xrealloc(r->matched, cap * sizeof *r->matched);
  r->tried_words = kvr_xrealloc(r->tried_words, KVR_WORKERSET_WORDS(cap) * sizeof(uint64_t));
  r->scratch_cap = cap;
}

/* Adds to set the other data-parallel ranks of the rank in slot: they share its API server, so a
 * request that failed on one rank is not retried (nor a broken stream continued) on another. */
static void add_sibling_ranks(const kvr_router_t *r, kvr_workerset_t *set, size_t slot) {
  const kvr_worker_t *w = r->slots[slot];
  if (w == NULL || w->dp_rank < 0)
    return;
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->dp_rank >= 0 && strcmp(r->slots[i]->url, w->url) == 0)
      kvr_workerset_add(set, i);
}

/* The policy's tried set for avoid, in the scratch: its tried slots (with the other ranks of a
 * tried data-parallel server), and with full the workers at the admission bound. */
static kvr_workerset_t tried_set(kvr_router_t *r, const kvr_router_avoid_t *avoid) {
  kvr_workerset_t set = {r->tried_words, KVR_WORKERSET_WORDS(r->nslots)};
  memset(set.words, 0, set.nwords * sizeof(uint64_t));
  if (avoid == NULL)
    return set;
  for (size_t k = 0; k < avoid->ntried; k++)
    if (avoid->tried[k] >= 0 && (size_t)avoid->tried[k] < r->nslots) {
      kvr_workerset_add(&set, (size_t)avoid->tried[k]);
      add_sibling_ranks(r, &set, (size_t)avoid->tried[k]);
    }
  for (size_t i = 0; avoid->full && i < r->nslots; i++)
    if (kvr_router_admission_full(r, i))
      kvr_workerset_add(&set, i);
  return set;
}

/* kvr_router_avoid_t.ejected_last_resort: when no snapshot outside tried is usable, the ejected
 * workers serving the request's model become usable in d's snapshots (only there). */
static void ejected_last_resort(const kvr_router_t *r, kvr_decision_t *d,
                                const kvr_workerset_t *tried, const want_t *want) {
  for (size_t i = 0; i < d->nsnaps; i++)
    if (kvr_policy_eligible(&d->snaps[i], i, tried))
      return;
  for (size_t i = 0; i < d->nsnaps; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w != NULL && w->state == KVR_WORKER_EJECTED && eligible(w, want))
      d->snaps[i].usable = true;
  }
}

int kvr_router_decide(kvr_router_t *r, const kvr_route_req_t *req, const kvr_router_avoid_t *avoid,
                      bool record, kvr_decision_t *d) {
  uint64_t t0 = kvr_router_now_ns(r), wall0 = kvr_now_ns();
  scratch_reserve(r, KVR_MAX(r->nslots, kvr_cache_index_workers(r->index)));
  size_t *matched = r->matched;
  memset(matched, 0, r->nslots * sizeof *matched);
  if (req->nblocks)
    kvr_cache_index_match(r->index, req->blocks, req->nblocks, matched);
  kvr_workerset_t tried = tried_set(r, avoid);
  d->snaps = r->snaps;
  d->scores = r->scores;
  d->nsnaps = r->nslots;
  bool any_precise = false;
  kvr__router_sessions_age(r, t0 / 1000000u);
  want_t want = want_of(r, avoid ? avoid->model : NULL);
  for (size_t i = 0; i < r->nslots; i++) {
    memset(&d->snaps[i], 0, sizeof d->snaps[i]);
    if (r->slots[i] == NULL)
      continue;
    bool precise = precise_match(r, r->slots[i], req, &matched[i]);
    if (avoid && avoid->prefer_plus1 == (int)i + 1 && matched[i] < req->nblocks)
      matched[i] = req->nblocks; /* the session's worker: as if it held the whole prompt */
    snapshot(r, r->slots[i], matched[i], t0, &d->snaps[i]);
    d->snaps[i].precise = precise;
    if (!eligible(r->slots[i], &want))
      d->snaps[i].usable = false; /* another model: the policy never sees it as a choice */
    d->snaps[i].adapter = adapter_state(r->slots[i], &want, d->snaps[i].metrics_fresh);
    /* rendezvous rank for the last tie-break: the same worker order for a prompt on every replica,
     * keyed by its last block (the most specific prefix), so distinct prompts spread evenly */
    if (req->nblocks)
      d->snaps[i].rank = XXH3_64bits_withSeed(r->slots[i]->key, strlen(r->slots[i]->key),
                                              req->blocks[req->nblocks - 1]) |
                         1;
    any_precise |= precise;
  }
  if (avoid && avoid->ejected_last_resort)
    ejected_last_resort(r, d, &tried, &want);
  if (record && req->nblocks) {
    if (any_precise)
      r->kv_routed_precise++;
    else
      r->kv_routed_approx++;
  }
  /* A look (record false) must not move the policy on: no cursor step, no RNG draw. */
  d->chosen = record ? kvr_policy_select(r->policy, d->snaps, d->nsnaps, req, &tried, d->scores)
                     : kvr_policy_peek(r->policy, d->snaps, d->nsnaps, req, &tried, d->scores);
  d->seconds = (double)(kvr_now_ns() - wall0) / 1e9; /* the decision's own cost: real time */
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

/* ---- one request's life on a worker: the accounting invariant ----------------------------------
 */

uint64_t kvr_router_predicted_cached(const kvr_router_t *r, size_t matched_blocks,
                                     uint64_t prompt_tokens) {
  uint64_t cached = (uint64_t)matched_blocks * r->cfg->block_chars / KVR_CHARS_PER_TOKEN;
  return KVR_MIN(cached, prompt_tokens);
}

const kvr_worker_t *kvr_router_on_dispatch(kvr_router_t *r, int slot, uint64_t prompt_tokens,
                                           size_t matched_blocks, kvr_router_dispatch_t *d) {
  return kvr_router_on_dispatch_model(r, slot, prompt_tokens, matched_blocks, NULL, d);
}

const kvr_worker_t *kvr_router_on_dispatch_model(kvr_router_t *r, int slot, uint64_t prompt_tokens,
                                                 size_t matched_blocks, const char *model,
                                                 kvr_router_dispatch_t *d) {
  memset(d, 0, sizeof *d);
  kvr_worker_t *w = slot >= 0 && slot < KVR_MAX_WORKERS ? r->slots[slot] : NULL;
  if (w == NULL)
    return NULL;
  d->open = true;
  d->model = label_of(r, model);
  if (d->model == KVR_MODEL_LABEL_NONE && w->models_known)
    d->model = w->base_label; /* vLLM serves a request without a model with its first name */
  d->worker_id = w->id;
  d->slot = slot;
  d->prompt_tokens = prompt_tokens;
  d->predicted_cached = kvr_router_predicted_cached(r, matched_blocks, prompt_tokens);
  d->prefill_tokens = prompt_tokens - d->predicted_cached;
  d->prefill_alone = pending_all(w) == 0;
  d->dispatched_ns = kvr_router_now_ns(r);
  d->id = ++r->dispatch_ids;
  if (w->state == KVR_WORKER_EJECTED) {
    /* Half-open: this request is the one trial; no other goes until it has a verdict. */
    d->trial = true;
    w->trial_inflight = true;
  }
  w->inflight++;
  w->active_tokens += d->prompt_tokens;
  w->queued_prefill_tokens += d->prefill_tokens;
  kvr_prefill_clock_dispatch(&w->prefill, d->prefill_tokens, d->dispatched_ns);
  w->requests_total++;
  w->prompt_tokens_total += d->prompt_tokens;
  w->predicted_cached_tokens_total += d->predicted_cached;
  if (r->sync_hook)
    r->sync_hook(r->sync_ctx, KVR_SYNC_DISPATCH, d, w);
  return w;
}

const kvr_worker_t *kvr_router_on_peer_dispatch(kvr_router_t *r, size_t peer, const char *url,
                                                uint64_t prompt_tokens, uint64_t prefill_tokens,
                                                kvr_router_dispatch_t *d) {
  memset(d, 0, sizeof *d);
  kvr_worker_t *w = peer < KVR_MAX_PEERS ? worker_serving(r, url) : NULL;
  if (w == NULL)
    return NULL;
  d->open = true;
  d->worker_id = w->id;
  d->slot = w->slot;
  d->peer_plus1 = (uint8_t)(peer + 1);
  d->prompt_tokens = prompt_tokens;
  d->prefill_tokens = KVR_MIN(prefill_tokens, prompt_tokens);
  d->dispatched_ns = kvr_router_now_ns(r);
  kvr_peer_load_t *l = &w->synced[peer];
  l->inflight++;
  l->active_tokens += d->prompt_tokens;
  l->queued_prefill_tokens += d->prefill_tokens;
  kvr_prefill_clock_dispatch(&w->prefill, d->prefill_tokens, d->dispatched_ns);
  return w;
}
void kvr_router_on_token(kvr_router_t *r, kvr_router_dispatch_t *d) {
  kvr_worker_t *w = record_worker(r, d);
  if (w == NULL)
    return;
  kvr_peer_load_t *l = d->peer_plus1 ? &w->synced[d->peer_plus1 - 1] : NULL;
  if (d->generated == 0) {
    /* First token: the prompt has been prefilled. */
    uint64_t *q = l ? &l->queued_prefill_tokens : &w->queued_prefill_tokens;
    *q -= KVR_MIN(*q, d->prefill_tokens);
    kvr_prefill_clock_first_token(&w->prefill, d->prefill_tokens, d->dispatched_ns,
                                  d->prefill_alone, pending_all(w), kvr_router_now_ns(r));
    d->prefill_tokens = 0;
    if (l == NULL && r->sync_hook)
      r->sync_hook(r->sync_ctx, KVR_SYNC_FIRST_TOKEN, d, w);
  }
  d->generated++;
  if (l)
    l->active_tokens++;
  else
    w->active_tokens++;
}

static void pages_on_end(kvr_router_t *r, kvr_worker_t *w, const kvr_router_dispatch_t *d);

void kvr_router_on_end(kvr_router_t *r, kvr_router_dispatch_t *d) {
  kvr_worker_t *w = record_worker(r, d);
  d->open = false;
  if (w == NULL)
    return;
  uint64_t tok = d->prompt_tokens + d->generated;
  if (d->peer_plus1) { /* a peer's synced request: its own figures, the shared clock */
    kvr_peer_load_t *l = &w->synced[d->peer_plus1 - 1];
    l->inflight = l->inflight ? l->inflight - 1 : 0;
    l->active_tokens = l->active_tokens >= tok ? l->active_tokens - tok : 0;
    l->queued_prefill_tokens -= KVR_MIN(l->queued_prefill_tokens, d->prefill_tokens);
    if (d->prefill_tokens)
      kvr_prefill_clock_cancel(&w->prefill, d->prefill_tokens, kvr_router_now_ns(r));
    d->prefill_tokens = 0;
    return;
  }
  if (r->sync_hook)
    r->sync_hook(r->sync_ctx, KVR_SYNC_END, d, w);
  w->inflight = w->inflight ? w->inflight - 1 : 0;
  w->active_tokens = w->active_tokens >= tok ? w->active_tokens - tok : 0;
  w->queued_prefill_tokens = w->queued_prefill_tokens >= d->prefill_tokens
                                 ? w->queued_prefill_tokens - d->prefill_tokens
                                 : 0;
  if (d->prefill_tokens) /* ended before its first token: its prefill leaves the clock too */
    kvr_prefill_clock_cancel(&w->prefill, d->prefill_tokens, kvr_router_now_ns(r));
  d->prefill_tokens = 0;
  if (d->trial) /* ended without a verdict (client gone): the next request may try */
    w->trial_inflight = false;
  d->trial = false;
  pages_on_end(r, w, d);
  if (w->state == KVR_WORKER_DRAINING && w->inflight == 0)
    worker_free(r, w);
}

size_t kvr_router_learn_cap(const kvr_router_t *r, const kvr_worker_t *w) {
  if (w->max_model_len == 0)
    return SIZE_MAX;
  uint64_t blocks = w->max_model_len * KVR_CHARS_PER_TOKEN / r->cfg->block_chars;
  return blocks ? (size_t)KVR_MIN(blocks, (uint64_t)SIZE_MAX) : 1;
}

void kvr_router_on_learn(kvr_router_t *r, const kvr_router_dispatch_t *d, const uint64_t *blocks,
                         size_t n) {
  const kvr_worker_t *w = record_worker(r, d);
  if (w != NULL)
    kvr_cache_index_insert(r->index, (size_t)d->slot, blocks,
                           KVR_MIN(n, kvr_router_learn_cap(r, w)));
}

/* The workers' actual prompt and generated tokens: w's, the router's and its model label's. */
static void count_tokens(kvr_router_t *r, kvr_worker_t *w, uint16_t label, uint64_t prompt,
                         uint64_t generation) {
  w->actual_prompt_tokens_total += prompt;
  w->actual_generation_tokens_total += generation;
  r->prompt_tokens_total += prompt;
  r->generation_tokens_total += generation;
  if (label < r->nmodel_labels) {
    r->model_labels[label].prompt_tokens_total += prompt;
    r->model_labels[label].generation_tokens_total += generation;
  }
}

/* The first answer showing a figure in its usage moves src to usage: cut at the last page the
 * scrape counted, if any. */
static void source_to_usage(kvr_count_source_t *src, const kvr_worker_t *w, const char *what) {
  if (src->usage)
    return;
  src->usage = true;
  src->cut_ns = w->committed_ns;
  KVR_INFO("router", "worker %u: %s from usage from now on (answers showed it)", w->id, what);
}

/* Whether an answer to d counts in src: usage mode, and d dispatched after the cut. */
static bool source_counts(const kvr_count_source_t *src, const kvr_router_dispatch_t *d) {
  return src->usage && (src->cut_ns == 0 || d->dispatched_ns > src->cut_ns);
}

void kvr_router_on_usage(kvr_router_t *r, const kvr_router_dispatch_t *d,
                         const kvr_router_usage_t *u) {
  kvr_worker_t *w = record_worker(r, d);
  if (w == NULL)
    return;
  if (u == NULL) {
    w->answers_without_usage_total++;
    return;
  }
  w->usage_prompt_tokens_total += u->prompt_tokens;
  if (u->has_details) { /* the prediction is compared over the answers that say what was cached */
    w->usage_cached_tokens_total += u->cached_tokens;
    w->usage_predicted_cached_total += KVR_MIN(d->predicted_cached, u->prompt_tokens);
  }
  if (u->has_details)
    source_to_usage(&w->cached_source, w, "cached tokens");
  source_to_usage(&w->tokens_source, w, "token counts");
  if (source_counts(&w->cached_source, d))
    w->actual_cached_tokens_total += u->cached_tokens;
  if (source_counts(&w->tokens_source, d))
    count_tokens(r, w, d->model, u->prompt_tokens, u->completion_tokens);
}

/* ---- outlier ejection ------------------------------------------------------------------------ */

/* Whether ejecting w keeps another UP worker and stays within max_ejection_percent. */
static bool may_eject(const kvr_router_t *r, const kvr_worker_t *w) {
  uint64_t members = 0, ejected = 0, other_up = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *x = r->slots[i];
    if (x == NULL || x->state == KVR_WORKER_DRAINING)
      continue;
    members++;
    ejected += x->state == KVR_WORKER_EJECTED && x != w;
    other_up += x->state == KVR_WORKER_UP && x != w;
  }
  return other_up > 0 && (ejected + 1) * 100 <= r->cfg->outlier_max_percent * members;
}

/* Ejects w (UP, or EJECTED after a failed trial) for its next backoff, or counts a refusal. */
static bool eject(kvr_router_t *r, kvr_worker_t *w) {
  uint64_t now = now_ms(r);
  if (!may_eject(r, w)) {
    r->ejections_refused_total++;
    KVR_WARN("router",
             "worker %u (%s) failing (%llu in a row) but not ejected: it would leave "
             "too few usable workers",
             w->id, w->url, (unsigned long long)w->consecutive_errors);
    if (w->state == KVR_WORKER_EJECTED)
      w->state = KVR_WORKER_UP; /* a failed trial with nothing else left: keep serving */
    return false;
  }
  if (w->state == KVR_WORKER_UP && now - w->restored_ms >= r->cfg->outlier_max_ejection_ms)
    w->ejection_streak = 0; /* clean for long enough: start again at the base */
  uint64_t ms = r->cfg->outlier_base_ejection_ms;
  for (uint32_t i = 0; i < w->ejection_streak && ms < r->cfg->outlier_max_ejection_ms; i++)
    ms *= 2;
  ms = KVR_MIN(ms, r->cfg->outlier_max_ejection_ms);
  w->ejection_streak++;
  w->ejections_total++;
  w->ejected_until_ms = now + ms;
  w->consecutive_errors = 0;
  w->state = KVR_WORKER_EJECTED;
  KVR_WARN("router", "worker %u (%s) ejected for %llu ms (ejection %u in a row)", w->id, w->url,
           (unsigned long long)ms, w->ejection_streak);
  return true;
}

bool kvr_router_on_result(kvr_router_t *r, kvr_router_dispatch_t *d, bool ok) {
  kvr_worker_t *w = record_worker(r, d);
  if (w == NULL)
    return false;
  bool trial = d->trial;
  if (trial) {
    w->trial_inflight = false;
    d->trial = false;
  }
  if (ok) {
    w->consecutive_errors = 0;
    if (trial && w->state == KVR_WORKER_EJECTED) {
      w->state = KVR_WORKER_UP;
      w->restored_ms = now_ms(r);
      KVR_INFO("router", "worker %u (%s) restored after a successful trial", w->id, w->url);
    }
    return false;
  }
  w->consecutive_errors++;
  if (trial && w->state == KVR_WORKER_EJECTED)
    return eject(r, w);
  if (w->state == KVR_WORKER_UP && r->cfg->outlier_consecutive > 0 &&
      w->consecutive_errors >= r->cfg->outlier_consecutive)
    return eject(r, w);
  return false;
}

void kvr_router_on_worker_error(kvr_router_t *r, const kvr_router_dispatch_t *d) {
  kvr_worker_t *w = record_worker(r, d);
  if (w)
    w->errors_total++;
}

void kvr_router_on_retry(kvr_router_t *r, const kvr_router_dispatch_t *d) {
  kvr_worker_t *w = record_worker(r, d);
  if (w)
    w->retries_total++;
}

/* ---- health and scraped figures ----------------------------------------------------------------
 */

int kvr_router_on_health(kvr_router_t *r, uint32_t id, bool reachable) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return KVR_ENOENT;
  if (reachable) {
    if (w->state == KVR_WORKER_DOWN) {
      KVR_INFO("router", "worker %u is up again", w->id);
      w->state = KVR_WORKER_UP;
      w->models_known = false; /* it may have restarted with another model */
    }
    w->consecutive_failures = 0;
    return 0;
  }
  w->consecutive_failures++;
  if (w->state == KVR_WORKER_UP && w->consecutive_failures >= r->cfg->fail_threshold) {
    w->state = KVR_WORKER_DOWN;
    KVR_WARN("router", "worker %u (%s) marked down after %llu failures", w->id, w->url,
             (unsigned long long)w->consecutive_failures);
  }
  return 0;
}

/* Adds the oldest pending page's increases to the figures still in scrape mode. */
static void commit_page(kvr_router_t *r, kvr_worker_t *w) {
  const kvr_pending_page_t *p = &w->pending[0];
  if (!w->cached_source.usage)
    w->actual_cached_tokens_total += p->delta[KVR_VLLM_HITS];
  if (!w->tokens_source.usage) /* vLLM's counters carry its first served name: the base label */
    count_tokens(r, w, w->base_label, p->delta[KVR_VLLM_PROMPT], p->delta[KVR_VLLM_GENERATION]);
  w->committed_ns = p->at_ns;
  w->npending--;
  memmove(&w->pending[0], &w->pending[1], w->npending * sizeof(w->pending[0]));
}

/* Commits the pending pages, oldest first, while no request they wait for is open. */
static void commit_ready(kvr_router_t *r, kvr_worker_t *w) {
  while (w->npending > 0 && w->pending[0].open == 0)
    commit_page(r, w);
}

/* A page's vLLM counters: their increases wait as a pending page (the first page, the baseline,
 * with none: requests open across it are still whole for usage until it commits), and the window
 * of the prediction moves on to this page. */
static void apply_counters(kvr_router_t *r, kvr_worker_t *w, const kvr_vllm_metrics_t *m) {
  if (m->counters.present == 0)
    return;
  bool first = w->counters.last.present == 0;
  uint64_t d[KVR_VLLM_NCOUNTERS];
  if (kvr_vllm_counters_advance(&w->counters, &m->counters, d))
    KVR_WARN("scrape",
             "worker %u: vLLM's token counters went back (restarted): counting again "
             "from their new values",
             w->id);
  if (!first) {
    w->window_predicted_cached += w->predicted_cached_tokens_total - w->mark_predicted;
    w->window_prompt_estimate += w->prompt_tokens_total - w->mark_prompt;
  }
  if (w->npending == KVR_PENDING_PAGES)
    commit_page(r, w); /* a request open that long: commit early (see the header comment) */
  kvr_pending_page_t *p = &w->pending[w->npending++];
  p->at_ns = kvr_router_now_ns(r);
  memcpy(p->delta, d, sizeof(p->delta)); /* the first page's are 0: it is the baseline */
  p->open = w->inflight;
  w->mark_predicted = w->predicted_cached_tokens_total;
  w->mark_prompt = w->prompt_tokens_total;
  commit_ready(r, w);
}

/* d ends on w: the pending pages that came while it was open wait for one request fewer. */
static void pages_on_end(kvr_router_t *r, kvr_worker_t *w, const kvr_router_dispatch_t *d) {
  for (uint32_t i = 0; i < w->npending; i++)
    if (w->pending[i].at_ns >= d->dispatched_ns && w->pending[i].open > 0)
      w->pending[i].open--;
  commit_ready(r, w);
}

int kvr_router_on_scrape(kvr_router_t *r, uint32_t id, const kvr_vllm_metrics_t *m) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return KVR_ENOENT;
  w->engines_seen = m->engines;
  if (w->dp_rank < 0 && m->engines > 1 && !w->engines_warned) {
    w->engines_warned = true;
    KVR_WARN("scrape",
             "worker %u (%s): its /metrics shows %u engines (data-parallel ranks) served as one "
             "worker; give --worker %s,dp_size=%u to route to each rank",
             w->id, w->url, m->engines, w->url, m->engines);
  }
  apply_counters(r, w, m);
  w->lora = m->lora;
  w->num_requests_running = m->num_requests_running;
  w->num_requests_waiting = m->num_requests_waiting;
  w->kv_cache_usage = m->kv_cache_usage;
  w->metrics_seen = true;
  w->scraped_at_ms = m->at_ms;
  if (r->sync_hook)
    r->sync_hook(r->sync_ctx, KVR_SYNC_SCRAPE, NULL, w);
  if (m->num_gpu_blocks == 0 || m->block_size == 0)
    return 0;
  w->num_gpu_blocks = m->num_gpu_blocks;
  w->block_size = m->block_size;
  uint64_t cap =
      kvr_cache_index_capacity_from_vllm(m->num_gpu_blocks, m->block_size, r->cfg->block_chars);
  if (cap != w->cache_capacity_blocks) {
    w->cache_capacity_blocks = cap;
    kvr_cache_index_set_capacity(r->index, (size_t)w->slot, cap);
    KVR_INFO("scrape", "worker %u: cache capacity %llu blocks (%llu GPU blocks of %llu tokens)",
             w->id, (unsigned long long)cap, (unsigned long long)m->num_gpu_blocks,
             (unsigned long long)m->block_size);
  }
  return 0;
}

int kvr_router_on_peer_scrape(kvr_router_t *r, const char *url, double running, double waiting,
                              double kv_cache_usage) {
  kvr_worker_t *w = worker_serving(r, url);
  if (w == NULL)
    return KVR_ENOENT;
  w->num_requests_running = running;
  w->num_requests_waiting = waiting;
  w->kv_cache_usage = kv_cache_usage;
  w->metrics_seen = true;
  w->scraped_at_ms = now_ms(r);
  return 0;
}

/* Whether lists a and b hold the same ids in the same order. */
static bool same_ids(const kvr_vllm_models_t *a, const kvr_vllm_models_t *b) {
  if (a->n != b->n || a->complete != b->complete)
    return false;
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->v[i].id, b->v[i].id) != 0)
      return false;
  return true;
}

/* One line naming w's ids (at most about 400 bytes of them). */
static void log_models(const kvr_worker_t *w) {
  kvr_buf_t b = KVR_BUF_INIT;
  for (size_t i = 0; i < w->models.n; i++) {
    const kvr_vllm_model_t *m = &w->models.v[i];
    if (b.len >= 400) {
      kvr_buf_printf(&b, ", ... (%zu more)", w->models.n - i);
      break;
    }
    kvr_buf_printf(&b, "%s%s", i ? ", " : "", m->id);
    if (m->parent)
      kvr_buf_printf(&b, " (adapter of %s)", m->parent);
  }
  KVR_INFO("scrape", "worker %u serves %zu model id%s%s: %s; max_model_len %llu tokens", w->id,
           w->models.n, w->models.n == 1 ? "" : "s",
           w->models.complete ? "" : " (list cut: it takes requests for any model)",
           b.data ? b.data : "", (unsigned long long)w->max_model_len);
  kvr_buf_free(&b);
}

int kvr_router_on_models(kvr_router_t *r, uint32_t id, kvr_vllm_models_t *m) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return KVR_ENOENT;
  bool changed = !same_ids(&w->models, m) || w->max_model_len != m->max_model_len;
  kvr_vllm_models_free(&w->models);
  w->models = *m;
  memset(m, 0, sizeof *m);
  free(w->labels);
  w->labels = kvr_xcalloc(w->models.n ? w->models.n : 1, sizeof *w->labels);
  for (size_t i = 0; i < w->models.n; i++)
    w->labels[i] = label_listed(r, w->models.v[i].id);
  w->base_label = w->models.n ? w->labels[0] : KVR_MODEL_LABEL_OTHER;
  w->max_model_len = w->models.max_model_len;
  w->models_known = true;
  w->models_at_ms = now_ms(r);
  if (changed)
    log_models(w);
  return 0;
}

const char *kvr_lora_load_result_name(kvr_lora_load_result_t res) {
  static const char *const names[] = {
#define XX(name, str) str,
      KVR_LORA_LOAD_RESULT_MAP(XX)
#undef XX
  };
  return (unsigned)res < KVR_LORA_LOAD_RESULTS ? names[res] : "failed";
}

/* Whether w is a live (not draining) worker of the API server at url: every data-parallel rank
 * of one `vllm serve` is a worker of its own, and they share its adapters. */
static bool of_server(const kvr_worker_t *w, const char *url) {
  return w && w->state != KVR_WORKER_DRAINING && strcmp(w->url, url) == 0;
}

int kvr_router_on_lora_load_start(kvr_router_t *r, const char *url, const char *name) {
  r->lora_load_attempts_total++;
  int rc = KVR_ENOENT;
  for (size_t i = 0; i < r->nslots; i++) {
    kvr_worker_t *w = r->slots[i];
    if (!of_server(w, url))
      continue;
    w->lora_loading =
        kvr_xrealloc(w->lora_loading, (w->nlora_loading + 1) * sizeof *w->lora_loading);
    w->lora_loading[w->nlora_loading++] = kvr_xstrdup(name);
    rc = 0;
  }
  return rc;
}

/* The id vLLM gives an adapter loaded without base_model_name as its parent: its first served
 * name (models/serving.py), the first base card of w's list; NULL while none is known. */
static const char *first_base(const kvr_worker_t *w) {
  for (size_t i = 0; i < w->models.n; i++)
    if (w->models.v[i].parent == NULL)
      return w->models.v[i].id;
  return NULL;
}

/* The card of adapter a, loaded on w (res: loaded, or already loaded), added to w's list until the
 * next GET /v1/models read replaces it. */
static void add_loaded_adapter(kvr_router_t *r, kvr_worker_t *w, const kvr_lora_adapter_t *a,
                               kvr_lora_load_result_t res) {
  const char *parent = a->base ? a->base : first_base(w);
  if (kvr_vllm_models_add_adapter(&w->models, a->name, a->path, parent, (uint64_t)time(NULL)) != 0)
    return; /* listed already, or the list is full (it then takes any model) */
  w->labels = kvr_xrealloc(w->labels, w->models.n * sizeof *w->labels);
  w->labels[w->models.n - 1] = label_listed(r, a->name);
  KVR_INFO("router", "worker %u: LoRA adapter %s %s (path %s)", w->id, a->name,
           res == KVR_LORA_LOAD_LOADED ? "loaded" : "was loaded already", a->path);
}

/* One worker of the server: the load of a ended with res (see kvr_router_on_lora_load_done). */
static void lora_done(kvr_router_t *r, kvr_worker_t *w, const kvr_lora_adapter_t *a,
                      kvr_lora_load_result_t res) {
  for (size_t i = 0; i < w->nlora_loading; i++)
    if (strcmp(w->lora_loading[i], a->name) == 0) {
      free(w->lora_loading[i]);
      w->lora_loading[i] = w->lora_loading[--w->nlora_loading];
      break;
    }
  if (res != KVR_LORA_LOAD_FAILED)
    add_loaded_adapter(r, w, a, res);
}

/* Every live worker of the server: a data-parallel server loads an adapter into every engine
 * (vLLM's DP client calls add_lora on each, v1/engine/core_client.py), so each rank lists it. */
int kvr_router_on_lora_load_done(kvr_router_t *r, const char *url, const kvr_lora_adapter_t *a,
                                 kvr_lora_load_result_t res) {
  r->lora_loads_total[(unsigned)res < KVR_LORA_LOAD_RESULTS ? res : KVR_LORA_LOAD_FAILED]++;
  int rc = KVR_ENOENT;
  for (size_t i = 0; i < r->nslots; i++)
    if (of_server(r->slots[i], url)) {
      lora_done(r, r->slots[i], a, res);
      rc = 0;
    }
  return rc;
}

bool kvr_router_worker_serves(const kvr_worker_t *w, const char *model) {
  return serves(w, model, model_hash(model));
}

bool kvr_router_model_unknown(const kvr_router_t *r, const char *model) {
  if (model == NULL || model[0] == '\0')
    return false;
  bool any = false;
  want_t want = want_of(r, model);
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || w->state == KVR_WORKER_DRAINING)
      continue;
    if (eligible(w, &want))
      return false;
    any = true;
  }
  return any;
}

int kvr_router_forget_cache(kvr_router_t *r, uint32_t id, uint64_t *forgotten) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return KVR_ENOENT;
  *forgotten = kvr_cache_index_entries(r->index, (size_t)w->slot);
  kvr_cache_index_forget_worker(r->index, (size_t)w->slot);
  return 0;
}

/* ---- router-wide events ------------------------------------------------------------------------
 */

void kvr_router_on_request(kvr_router_t *r) {
  r->requests_total++;
}

void kvr_router_on_probe(kvr_router_t *r, kvr_probe_t probe) {
  if ((unsigned)probe < KVR_ARRAY_SIZE(r->probe_requests_total))
    r->probe_requests_total[probe]++;
}

void kvr_router_on_client_error(kvr_router_t *r) {
  r->client_errors_total++;
  r->request_errors_total[KVR_REQ_ERROR_CLIENT_ERROR]++;
}

void kvr_router_on_client_abort(kvr_router_t *r) {
  r->client_aborts_total++;
  r->request_errors_total[KVR_REQ_ERROR_CLIENT_ABORT]++;
}

const char *kvr_req_error_name(kvr_req_error_t e) {
  static const char *const names[] = {
#define XX(name, str) str,
      KVR_REQ_ERROR_MAP(XX)
#undef XX
  };
  return (unsigned)e < KVR_ARRAY_SIZE(names) ? names[e] : "unknown";
}

void kvr_router_on_request_error(kvr_router_t *r, kvr_req_error_t e) {
  if ((unsigned)e < KVR_REQ_ERROR_COUNT)
    r->request_errors_total[e]++;
}

void kvr_router_on_retries_exhausted(kvr_router_t *r) {
  r->retries_exhausted_total++;
}

void kvr_router_on_upstream_response_error(kvr_router_t *r, kvr_http_resp_err_t e) {
  if (e != KVR_HTTP_RESP_OK && (unsigned)e < KVR_HTTP_RESP_ERR_COUNT)
    r->upstream_response_errors_total[e]++;
}

void kvr_router_on_usage_rejected(kvr_router_t *r) {
  r->usage_rejected_total++;
}

void kvr_router_on_upstream_failure(kvr_router_t *r) {
  r->upstream_failures_total++;
}

void kvr_router_observe_ttfb(kvr_router_t *r, double seconds) {
  kvr_hist_observe(&r->ttfb_seconds, seconds);
}

void kvr_router_observe_duration(kvr_router_t *r, double seconds) {
  kvr_hist_observe(&r->request_seconds, seconds);
}

void kvr_router_on_response(kvr_router_t *r, int code, int route, const char *worker,
                            const char *model) {
  const char *wl = worker && *worker ? worker : "none";
  uint16_t label = label_of(r, model);
  for (size_t i = 0; i < r->nresponses; i++) {
    kvr_response_count_t *e = &r->responses[i];
    if (e->code == code && e->route == route && e->model == label && strcmp(e->worker, wl) == 0) {
      e->count++;
      return;
    }
  }
  KVR_GROW(r->responses, r->nresponses, r->responses_cap, 1);
  kvr_response_count_t *e = &r->responses[r->nresponses++];
  memset(e, 0, sizeof *e);
  e->code = code;
  e->route = route;
  e->model = label;
  snprintf(e->worker, sizeof e->worker, "%s", wl);
  e->count = 1;
}

void kvr_router_observe_ttft(kvr_router_t *r, const char *model, double seconds) {
  kvr_hist_observe(&r->model_labels[label_of(r, model)].ttft_seconds, seconds);
}

void kvr_router_observe_itl(kvr_router_t *r, const char *model, double seconds) {
  kvr_hist_observe(&r->model_labels[label_of(r, model)].itl_seconds, seconds);
}

/* ---- retry budget and admission bound ------------------------------------------------------- */

bool kvr_router_retry_acquire(kvr_router_t *r, uint64_t requests_inflight) {
  uint64_t budget = requests_inflight * r->cfg->retry_budget_percent / 100;
  if (r->retries_inflight < KVR_MAX(budget, r->cfg->retry_min_concurrency)) {
    r->retries_inflight++;
    return true;
  }
  r->retry_budget_refused_total++;
  return false;
}

void kvr_router_retry_release(kvr_router_t *r) {
  if (r->retries_inflight > 0)
    r->retries_inflight--;
}

bool kvr_router_admission_full(const kvr_router_t *r, size_t slot) {
  uint64_t max = r->cfg->admission_max_inflight;
  return max && slot < r->nslots && r->slots[slot] && r->slots[slot]->inflight >= max;
}

/* Whether slot is one of avoid's tried slots. */
static bool avoided(const kvr_router_avoid_t *avoid, size_t slot) {
  for (size_t k = 0; avoid && k < avoid->ntried; k++)
    if (avoid->tried[k] >= 0 && (size_t)avoid->tried[k] == slot)
      return true;
  return false;
}

bool kvr_router_admission_blocked(const kvr_router_t *r, const kvr_router_avoid_t *avoid) {
  if (r->cfg->admission_max_inflight == 0)
    return false;
  uint64_t now = now_ms(r);
  bool usable = false;
  want_t want = want_of(r, avoid ? avoid->model : NULL);
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL || avoided(avoid, i) || !kvr_router_worker_usable(w, now) || !eligible(w, &want))
      continue;
    if (!kvr_router_admission_full(r, i))
      return false; /* a usable worker has room */
    usable = true;
  }
  return usable;
}

void kvr_router_on_queued(kvr_router_t *r) {
  r->admission_queue_depth++;
  r->admission_queued_total++;
}

void kvr_router_on_dequeued(kvr_router_t *r) {
  if (r->admission_queue_depth > 0)
    r->admission_queue_depth--;
}

void kvr_router_on_admission_reject(kvr_router_t *r, kvr_admission_reject_t why) {
  if ((unsigned)why < KVR_ARRAY_SIZE(r->admission_rejected_total))
    r->admission_rejected_total[why]++;
}

/* ---- KV events (precise mode) ------------------------------------------------------------------
 */

int kvr_router_set_worker_kv(kvr_router_t *r, uint32_t id, const char *events, const char *replay) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return KVR_ENOENT;
  free(w->kv_events);
  free(w->kv_replay);
  w->kv_events = kvr_xstrdup(events);
  w->kv_replay = kvr_xstrdup(replay);
  w->kv_precise = false;
  kvr_kv_index_clear(r->kv_index, (size_t)w->slot);
  snprintf(w->kv_mode, sizeof w->kv_mode, "%s", events ? "waiting" : "off");
  return 0;
}

void kvr_router_on_kv_batch(kvr_router_t *r, uint32_t id, const kvr_kv_batch_t *b) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return;
  /* vLLM's rank R publishes on its own endpoint (port + R) and always names itself: a batch of
   * another rank on a rank's stream is no part of this worker's cache. */
  if (w->dp_rank >= 0 && b->dp_rank >= 0 && b->dp_rank != w->dp_rank) {
    if (w->kv_rank_dropped++ == 0)
      KVR_WARN("router",
               "worker %u (%s): a KV-event batch of data-parallel rank %lld dropped "
               "(counted in kvrouter_kv_events_rank_dropped_total)",
               w->id, w->key, (long long)b->dp_rank);
    r->kv_rank_dropped_total++;
    return;
  }
  kvr_kv_index_apply(r->kv_index, (size_t)w->slot, b);
}

void kvr_router_on_kv_reset(kvr_router_t *r, uint32_t id) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w)
    kvr_kv_index_clear(r->kv_index, (size_t)w->slot);
}

void kvr_router_on_kv_mode(kvr_router_t *r, uint32_t id, bool precise, const char *mode) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w == NULL)
    return;
  if (w->kv_precise != precise)
    KVR_INFO("router", "worker %u: routed on the %s index%s%s%s", w->id,
             precise ? "precise (KV events)" : "approximate", precise ? "" : " (",
             precise ? "" : mode, precise ? "" : ")");
  w->kv_precise = precise;
  snprintf(w->kv_mode, sizeof w->kv_mode, "%s", precise ? "precise" : mode);
}

void kvr_router_observe_tokenize(kvr_router_t *r, kvr_tokenize_result_t res, double seconds) {
  if ((unsigned)res < KVR_ARRAY_SIZE(r->tokenize_total))
    r->tokenize_total[res]++;
  if (res != KVR_TOKENIZE_FAILED)
    kvr_hist_observe(&r->tokenize_seconds, seconds);
}

void kvr_router_on_kv_stats(kvr_router_t *r, uint32_t id, const kvr_kv_stream_stats_t *st) {
  kvr_worker_t *w = kvr__router_worker_by_id(r, id);
  if (w)
    w->kv_stats = *st;
}

bool kvr_router_model_is_adapter(const kvr_router_t *r, const char *model) {
  if (model == NULL || model[0] == '\0')
    return false;
  if (kvr_router_lora_dynamic(r, model) != NULL)
    return true;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    const kvr_vllm_model_t *card = w ? kvr_vllm_models_find(&w->models, model) : NULL;
    if (card != NULL)
      return card->parent != NULL;
  }
  return false;
}

void kvr_router_kv_salts(const kvr_router_t *r, const char *model, const char *cache_salt,
                         kvr_kv_salts_t *out) {
  kvr_kv_request_salts(kvr_router_model_is_adapter(r, model) ? model : NULL, cache_salt, out);
}

uint32_t kvr_router_kv_tokenizer(const kvr_router_t *r, const char *model, const char **url) {
  uint64_t now = now_ms(r);
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w && w->kv_precise && kvr_router_worker_usable(w, now) &&
        kvr_router_worker_serves(w, model)) {
      /* the events' block size, or before any BlockStored the one vllm:cache_config_info gave */
      uint32_t bs = kvr_kv_index_block_size(r->kv_index, (size_t)w->slot);
      if (bs == 0)
        bs = (uint32_t)w->block_size;
      if (bs == 0)
        continue;
      *url = w->url;
      return bs;
    }
  }
  return 0;
}

/* ---- replicas ----------------------------------------------------------------------------------
 */

/* Orders rows by URL, then by their place in the answer, so the first of duplicates comes first.
 */
static int cmp_row(const void *a, const void *b) {
  const kvr_peer_row_t *x = *(const kvr_peer_row_t *const *)a,
                       *y = *(const kvr_peer_row_t *const *)b;
  int c = strcmp(x->url, y->url);
  return c ? c : (x < y ? -1 : x > y);
}

/* The first row of sorted[0..n) with url, or NULL. */
static const kvr_peer_row_t *find_row(const kvr_peer_row_t *const *sorted, size_t n,
                                      const char *url) {
  size_t lo = 0, hi = n; /* lower bound */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(sorted[mid]->url, url) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && strcmp(sorted[lo]->url, url) == 0 ? sorted[lo] : NULL;
}

void kvr_router_on_peer_load(kvr_router_t *r, size_t peer, const kvr_peer_row_t *rows, size_t n) {
  if (peer >= KVR_MAX_PEERS)
    return;
  uint64_t now = now_ms(r);
  r->peer_polls_total[peer][0]++;
  r->peer_ok_ms[peer] = now;
  /* Each worker finds its row by binary search: a peer lists up to KVR_MAX_WORKERS rows, and a
   * scan per worker would be ~16 M string compares at 4,096 workers on every poll. */
  const kvr_peer_row_t **sorted = kvr_xmalloc((n ? n : 1) * sizeof *sorted);
  for (size_t k = 0; k < n; k++)
    sorted[k] = &rows[k];
  qsort(sorted, n, sizeof *sorted, cmp_row);
  for (size_t i = 0; i < r->nslots; i++) {
    kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    memset(&w->peer[peer], 0, sizeof w->peer[peer]);
    w->peer[peer].at_ms = now; /* listed or not, the peer has nothing else on it */
    const kvr_peer_row_t *row = find_row(sorted, n, w->key);
    if (row == NULL)
      continue;
    w->peer[peer] = row->load;
    w->peer[peer].at_ms = now;
    uint64_t taken = now > row->scrape_age_ms ? now - row->scrape_age_ms : 0;
    if (row->has_scrape && (!w->metrics_seen || taken > w->scraped_at_ms)) {
      w->num_requests_running = row->num_requests_running;
      w->num_requests_waiting = row->num_requests_waiting;
      w->kv_cache_usage = row->kv_cache_usage;
      w->scraped_at_ms = taken;
      w->metrics_seen = true;
    }
  }
  free(sorted);
}

void kvr_router_on_peer_error(kvr_router_t *r, size_t peer) {
  if (peer < KVR_MAX_PEERS)
    r->peer_polls_total[peer][1]++;
}

void kvr_router_on_peer_self(kvr_router_t *r, size_t peer) {
  if (peer < KVR_MAX_PEERS)
    r->peer_polls_total[peer][2]++;
}

void kvr_router_peer_load(const kvr_router_t *r, const kvr_worker_t *w, uint64_t now_ms,
                          kvr_peer_load_t *sum) {
  memset(sum, 0, sizeof *sum);
  for (size_t p = 0; p < r->cfg->npeers && p < KVR_MAX_PEERS; p++) {
    if (r->peer_sync_live[p]) { /* what p announced, request by request */
      const kvr_peer_load_t *l = &w->synced[p];
      sum->inflight += l->inflight;
      sum->active_tokens += l->active_tokens;
      sum->queued_prefill_tokens += l->queued_prefill_tokens;
      sum->synced_prefill_tokens += l->queued_prefill_tokens; /* in w's clock */
      continue;
    }
    const kvr_peer_load_t *l = &w->peer[p];
    if (l->at_ms == 0 || now_ms > l->at_ms + r->cfg->peer_stale_ms)
      continue;
    sum->inflight += l->inflight;
    sum->active_tokens += l->active_tokens;
    sum->queued_prefill_tokens += l->queued_prefill_tokens;
    sum->prefill_backlog_tokens += l->prefill_backlog_tokens;
  }
}

/* ---- replica sync's reports -------------------------------------------------------------------
 */

void kvr_router_set_sync(kvr_router_t *r, kvr_router_sync_hook_t hook, void *ctx, uint32_t port) {
  r->sync_hook = hook;
  r->sync_ctx = hook ? ctx : NULL;
  r->sync_port = hook ? port : 0;
}

void kvr_router_on_peer_hello(kvr_router_t *r, size_t p, uint64_t instance, uint32_t sync_port) {
  if (p >= KVR_MAX_PEERS)
    return;
  r->peer_instance[p] = instance;
  r->peer_sync_port[p] = sync_port;
}

void kvr_router_on_peer_sync_live(kvr_router_t *r, size_t p, bool live) {
  if (p < KVR_MAX_PEERS)
    r->peer_sync_live[p] = live;
}

void kvr_router_on_peer_sync_message(kvr_router_t *r, size_t p, bool gap) {
  if (p >= KVR_MAX_PEERS)
    return;
  r->peer_sync_messages_total[p]++;
  if (gap)
    r->peer_sync_gaps_total[p]++;
}

void kvr_router_on_sync_published(kvr_router_t *r) {
  r->sync_published_total++;
}

void kvr_router_on_sync_skipped(kvr_router_t *r) {
  r->sync_skipped_total++;
}

/* router.h -- the state of `kvrouter serve`: workers, the active policy, the cache index, counters.
 *
 * A pure library: no loop, no sockets, no curl. kvr_router_t is owned by serve.c and read by the
 * public proxy (proxy.c), the admin API (admin.c), the /metrics scraper (scrape.c) and the views
 * (router_view.c), which all run on one libuv loop, so no locking. This module is the only writer
 * of worker and router state: the others report events through the kvr_router_on_* calls below and
 * read the structs through const pointers (the fields are visible for reading, never for writing).
 *
 * Workers live in slots 0..KVR_MAX_WORKERS-1 (4,096: a worker beyond is refused with a one-line
 * error and counted, kvrouter_workers_refused_total). A worker's slot is its index in policy
 * snapshots, in the tried set and in the cache index, so it never changes while the worker exists;
 * a removed worker's slot is reused only after its in-flight requests have finished and its cache
 * state has been forgotten. What a decision needs per slot (snapshots, scores, matches, the tried
 * set) is the router's scratch, grown with the highest slot in use, not sized by the bound. The id
 * shown to operators is stable and never reused; whoever may outlive a worker (a scrape probe, an
 * admin fan-out call) holds its id, not a pointer.
 *
 * Load accounting is exact, and lives in router.c alone: kvr_router_on_dispatch() adds a request's
 * contribution to its worker (1 in-flight, its estimated prompt tokens, its uncached prefill
 * tokens) and writes what it added into a kvr_router_dispatch_t the caller holds; every later
 * change (the first token ends the prefill, each generated token) updates the worker and that
 * record together; kvr_router_on_end() removes exactly what the record says, however the request
 * ended, and closes the record, so a second call removes nothing. Nothing else a request does is
 * left on the worker: the cache index learns only what the proxy reports through
 * kvr_router_on_learn(), which it does only for a 2xx answer (never for a 4xx or 5xx).
 *
 * Outlier ejection (Envoy's outlier detection, consecutive-failure flavour): the proxy reports
 * each attempt's verdict with kvr_router_on_result() (a 5xx answer, a first-byte timeout or a
 * failed transfer is a failure; any other answer a success). outlier_consecutive failures in a
 * row eject an UP worker for base_ejection_ms * 2^(n-1), capped at max_ejection_ms, n being its
 * ejections in a row (n starts again at 1 once it has stayed clean for max_ejection_ms). When the
 * time is up the worker is half-open: still EJECTED, but usable for exactly one request (the
 * trial, marked in its dispatch record); a success restores it to UP, a failure ejects it again
 * for twice as long. An ejection is refused (and counted) when it would leave no other UP worker
 * or eject more than max_ejection_percent of the workers: the router keeps sending to a bad worker
 * rather than to no worker at all.
 *
 * Retry budget (Envoy's and Linkerd's): kvr_router_retry_acquire() allows a retry while retries
 * in flight stay under budget_percent of the requests in flight, or under min_concurrency.
 *
 * Models: each worker keeps the ids its GET /v1/models lists (at most KVR_VLLM_MODELS_MAX,
 * kvr_router_on_models). A request naming a model is eligible only for the workers that list that
 * exact id (kvr_router_worker_serves; the decision marks the others unusable, the admission bound
 * looks at these only); a worker whose list is not known yet, or not complete, is eligible for
 * any model. A name no worker serves gets vLLM's 404 from the proxy (kvr_router_model_unknown).
 * The listed names are also the values of the `model` metric label (kvr_model_label_t).
 *
 * LoRA adapters: an adapter is an id of its own in a worker's list (its card's parent names the
 * base). Each worker's /metrics gives vllm:lora_requests_info (the adapters in its batch now,
 * kvr_router_on_scrape), and a decision tells the policy, per worker, whether the request's
 * adapter is running there, loaded (listed, or being loaded by the router) or neither
 * (kvr_worker_snap_t.adapter). An adapter of cfg->lora_adapters (--lora-adapter: the router may
 * load it) is eligible on the workers listing it and on every worker serving its base
 * (kvr_router_lora_dynamic): when the chosen worker does not list it, serve/lora.c asks the worker
 * to load it first, reporting kvr_router_on_lora_load_start / _done; a load that succeeded (or
 * that the worker answered "already loaded") adds the adapter's card to the worker's list until
 * the next GET /v1/models read replaces the list.
 *
 * Data-parallel ranks: vLLM's `serve --data-parallel-size N --api-server-count 1` puts N engines
 * behind one URL. kvr_router_add_workers(url, dp_size N) makes N workers of it, rank 0..N-1, each
 * with its own slot, load, cache index, KV-event stream (vLLM's port + rank) and scraped figures
 * (the engine="R" series of the URL's one /metrics page). The proxy sends each request to the URL
 * with X-data-parallel-rank: its worker's rank. Ranks share the URL, never the key ("URL#dp=R"),
 * so replicas and reload tell them apart. A worker added without dp_size is the whole server.

 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include "base/metrics.h"
#include "core/cache_index.h"
#include "core/kv_index.h"
#include "core/prefill_clock.h"
#include "policies/policy.h"
#include "proto/http_headers.h" /* kvr_http_resp_err_t */
#include "proto/kv_decode.h"    /* kvr_kv_stream_stats_t */
#include "proto/vllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_config_s kvr_config_t;             /* config.h */
typedef struct kvr_lora_adapter_s kvr_lora_adapter_t; /* config.h */

#define KVR_WORKER_STATE_MAP(XX)                                                                   \
  XX(UP, "up")                                                                                     \
  XX(DOWN, "down")                                                                                 \
  XX(DRAINING, "draining")                                                                         \
  XX(EJECTED, "ejected")

typedef enum {
#define XX(name, str) KVR_WORKER_##name,
  KVR_WORKER_STATE_MAP(XX)
#undef XX
} kvr_worker_state_t;

const char *kvr_worker_state_name(kvr_worker_state_t s);

typedef struct kvr_router_s kvr_router_t;

/* Why a client request ended in an error (kvrouter_request_errors_total{reason}): a fixed set, so
 * every reason is exported (0 when none) and the label's cardinality is bounded. */
#define KVR_REQ_ERROR_MAP(XX)                                                                      \
  XX(CONNECT, "connect")                                                                           \
  XX(FIRST_BYTE_TIMEOUT, "first_byte_timeout")                                                     \
  XX(IDLE_TIMEOUT, "idle_timeout")                                                                 \
  XX(UPSTREAM_5XX, "upstream_5xx")                                                                 \
  XX(BROKEN_STREAM, "broken_stream")                                                               \
  XX(UPSTREAM_PROTOCOL, "upstream_protocol")                                                       \
  XX(NO_WORKER, "no_worker")                                                                       \
  XX(OVERLOADED, "overloaded")                                                                     \
  XX(CLIENT_ERROR, "client_error")                                                                 \
  XX(CLIENT_ABORT, "client_abort")

typedef enum {
#define XX(name, str) KVR_REQ_ERROR_##name,
  KVR_REQ_ERROR_MAP(XX)
#undef XX
      KVR_REQ_ERROR_COUNT
} kvr_req_error_t;

const char *kvr_req_error_name(kvr_req_error_t e);

/* One kvrouter_http_requests_total series. */
typedef struct kvr_response_count_s {
  int code;
  int route;       /* kvr_route_t */
  char worker[16]; /* the worker's label, or "none" (answered by the router itself) */
  uint16_t model;  /* its model label (kvr_model_label_t index) */
  uint64_t count;
} kvr_response_count_t;

/* Model labels: the `model` label of the request, token, TTFT and ITL families. A label is a name
 * some worker's GET /v1/models listed (entered when first listed, kept for the process's life so
 * its series never vanish), "other" for any other name a request gives, "none" for a request that
 * names no model (GET /v1/models, a response by id, the routes the router does not read, a
 * Responses request without one). At most KVR_MODEL_LABELS_MAX listed names get a label (later
 * ones count as "other", with one warning), and only names of printable ASCII without quote or
 * backslash (they also go into the access log), so the cardinality is bounded by what the workers
 * list. */
#define KVR_MODEL_LABELS_MAX 256
#define KVR_MODEL_LABEL_OTHER 0
#define KVR_MODEL_LABEL_NONE 1
typedef struct kvr_model_label_s {
  char *name;    /* owned */
  uint64_t hash; /* XXH3 of name: the lookup compares it first */
  kvr_hist_t ttft_seconds, itl_seconds;
  uint64_t prompt_tokens_total, generation_tokens_total;
} kvr_model_label_t;

/* The remembered placements' map (router_affinity.c) and what a lookup found. */
typedef struct kvr_affinity_s kvr_affinity_t;
typedef enum {
  KVR_AFFINITY_HIT = 0, /* the worker that holds it, usable */
  KVR_AFFINITY_UNKNOWN, /* never seen, or evicted */
  KVR_AFFINITY_GONE,    /* its worker was removed or is not usable now */
  KVR_AFFINITY_RESULTS
} kvr_affinity_result_t;

/* Where a worker's actual figures come from (see "Actual cached tokens and token counts" in
 * router.c): the scraped counters until an answer of the worker shows the figure in its usage,
 * then usage, for the requests dispatched after the last page the scrape committed (cut_ns). */
typedef struct kvr_count_source_s {
  bool usage;
  uint64_t cut_ns; /* usage counts requests dispatched after this (kvr_router_now_ns() time) */
} kvr_count_source_t;

/* A page of counters not yet added to the actual figures: it waits until every request that was
 * in flight on the worker when it came has ended (open == 0), so that an answer whose usage could
 * still move a figure to usage finds its tokens in no committed page. */
#define KVR_PENDING_PAGES 32
typedef struct kvr_pending_page_s {
  uint64_t at_ns; /* kvr_router_now_ns() when the page was applied */
  uint64_t delta[KVR_VLLM_NCOUNTERS];
  uint32_t open; /* requests dispatched before at_ns still in flight */
} kvr_pending_page_t;

/* What one peer replica has in flight on a worker (its GET /admin/load), and when it said so. */
typedef struct kvr_peer_load_s {
  uint32_t inflight;
  uint64_t active_tokens, queued_prefill_tokens, prefill_backlog_tokens;
  uint64_t
      synced_prefill_tokens; /* in sums: synced peers' prefill, already in the worker's clock */
  uint64_t at_ms;            /* 0: never */
} kvr_peer_load_t;

/* One worker. Owned by its router (slots[slot]); read-only outside router.c. */
typedef struct kvr_worker_s {
  uint32_t id;    /* stable, shown in the admin API and the x-kvrouter-worker header */
  int slot;       /* index in snapshots, tried masks and the cache index */
  char *url;      /* owned, normalized base URL without trailing slash */
  char label[16]; /* id as text for metric labels and headers */
  /* Data parallel (vLLM's --data-parallel-size N behind one API server; see "Data-parallel
   * ranks" above): the engine this worker is (its requests carry X-data-parallel-rank: dp_rank)
   * and N; -1 and 0 for a worker that is a whole server. key (owned) names the worker among those
   * sharing its URL: the URL itself, or "URL#dp=R"; replicas and reload find workers by it. */
  int32_t dp_rank;
  uint32_t dp_size;
  char *key;
  /* Engines its last /metrics page showed (distinct engine="R" labels, 0 without any); on a worker
   * configured without dp_size, more than one is logged once (engines_warned) and shown. */
  uint32_t engines_seen;
  bool engines_warned;
  kvr_worker_state_t state;
  /* Load the router tracks itself (see the header comment). */
  uint32_t inflight;
  uint64_t active_tokens;
  uint64_t queued_prefill_tokens;
  /* Responses sessions whose next turn will be pinned here (router_affinity.c, the only writer) */
  uint32_t open_sessions;
  kvr_prefill_clock_t
      prefill; /* how much of queued_prefill_tokens is still ahead (prefill_clock.h) */
  /* Counters. */
  uint64_t requests_total, errors_total, retries_total;
  uint64_t prompt_tokens_total, predicted_cached_tokens_total;
  uint64_t usage_prompt_tokens_total, usage_predicted_cached_total, usage_cached_tokens_total;
  uint64_t answers_without_usage_total; /* 2xx completions whose answer carried no usage */
  /* Actual figures from usage or the scraped counters (kvr_count_source_t). */
  kvr_count_source_t cached_source, tokens_source;
  uint64_t actual_cached_tokens_total, actual_prompt_tokens_total, actual_generation_tokens_total;
  /* vLLM's counters and the router's prediction over the same scrapes: window_* sum the predicted
   * cached and estimated prompt tokens of the requests dispatched between the first and the last
   * page with counters (mark_*: the totals at the last such page). */
  kvr_vllm_counter_state_t counters;
  kvr_pending_page_t pending[KVR_PENDING_PAGES]; /* oldest first */
  uint32_t npending;
  uint64_t committed_ns; /* at_ns of the last committed page; 0: none yet */
  uint64_t window_predicted_cached, window_prompt_estimate, mark_predicted, mark_prompt;
  uint64_t consecutive_failures; /* connection failures in a row (health: DOWN) */
  uint64_t added_ms;
  /* Outlier ejection (see the header comment). */
  uint64_t consecutive_errors; /* failed attempts in a row (kvr_router_on_result) */
  uint64_t ejections_total;
  uint32_t ejection_streak;  /* ejections in a row: the next one lasts base * 2^streak */
  uint64_t ejected_until_ms; /* while EJECTED: when the half-open trial may go */
  uint64_t restored_ms;      /* when it last became UP after an ejection */
  bool trial_inflight;       /* the half-open trial request is in flight */
  /* From the worker's GET /v1/models (kvr_router_on_models, read again every 30 s): the ids it
   * answers to (base names, aliases, LoRA adapters), the smallest max_model_len (0 until known),
   * each id's model label (labels[i] for models.v[i]) and the label its scraped token counters
   * count under (its first id, the name vLLM's own counters carry). While models_known is false
   * (not read yet, or back up after DOWN: it may have restarted with another model) the worker
   * takes requests for any model; the last list stays for the views. */
  kvr_vllm_models_t models;
  uint16_t *labels;
  uint16_t base_label;
  uint64_t max_model_len;
  bool models_known;
  uint64_t models_at_ms; /* when the list was last read */
  /* LoRA: the newest vllm:lora_requests_info of its /metrics (kvr_router_on_scrape; present false
   * when the last page had none), and the adapters the router is loading on it now
   * (kvr_router_on_lora_load_start .. _done; owned names). */
  kvr_vllm_lora_info_t lora;
  char **lora_loading;
  size_t nlora_loading;
  /* From the worker's /metrics (kvr_router_on_scrape). */
  bool metrics_seen;
  uint64_t scraped_at_ms;
  double num_requests_running, num_requests_waiting, kv_cache_usage;
  uint64_t num_gpu_blocks, block_size;
  uint64_t cache_capacity_blocks; /* in router blocks */
  /* KV events (precise mode): the engine's endpoints, or NULL; kv_precise while its stream is
   * complete (kvr_router_on_kv_mode), kv_mode the reason when not. */
  char *kv_events, *kv_replay;
  bool kv_precise;
  char kv_mode[24];
  kvr_kv_stream_stats_t kv_stats; /* the stream's counters (kvr_router_on_kv_stats) */
  uint64_t kv_rank_dropped;       /* batches naming another data-parallel rank, dropped */
  /* Replicas: the load each peer reported for this worker (kvr_router_on_peer_load); the
   * snapshot adds the fresh ones to the router's own figures. */
  kvr_peer_load_t peer[KVR_MAX_PEERS];
  /* Replicas with --peer-sync: what each peer's synced requests put on this worker (in flight,
   * prompt tokens, prefill tokens before their first token; kvr_router_on_peer_dispatch). Their
   * prefill is in the shared prefill clock above. Used instead of peer[p] while p's sync is live.
   */
  kvr_peer_load_t synced[KVR_MAX_PEERS];
} kvr_worker_t;

/* A dispatch the router reports to its sync hook (peer_sync.h publishes them to the peers). */
typedef enum {
  KVR_SYNC_DISPATCH,
  KVR_SYNC_FIRST_TOKEN,
  KVR_SYNC_END,
  KVR_SYNC_SCRAPE /* this replica scraped the worker (d is NULL) */
} kvr_sync_event_t;
struct kvr_router_dispatch_s;
typedef void (*kvr_router_sync_hook_t)(void *ctx, kvr_sync_event_t ev,
                                       const struct kvr_router_dispatch_s *d,
                                       const kvr_worker_t *w);

/* Read-only outside router.c. */
struct kvr_router_s {
  const kvr_config_t *cfg; /* owned by serve.c, outlives the router */
  kvr_worker_t *slots[KVR_MAX_WORKERS];
  size_t nslots; /* highest used slot + 1 */
  uint32_t next_id;
  kvr_policy_t *policy;     /* owned; replaced whole by kvr_router_set_policy() */
  kvr_cache_index_t *index; /* owned */
  kvr_kv_index_t *kv_index; /* owned: the precise index, fed by KV events */
  uint64_t kv_routed_precise, kv_routed_approx; /* decisions with / without token ids */
  uint64_t kv_rank_dropped_total; /* KV batches of a rank their stream's worker is not */
  kvr_hist_t tokenize_seconds;    /* POST /tokenize round trips (precise mode) */
  uint64_t peer_polls_total[KVR_MAX_PEERS][3]; /* [peer][0 ok, 1 error, 2 self] */
  uint64_t instance; /* random per process: tells a replica its own answer in a peer list */
  uint64_t peer_ok_ms[KVR_MAX_PEERS]; /* last good answer of each peer */
  /* Replica sync (peer_sync.h): while peer_sync_live[p], peer p's load is the requests it
   * announced (workers' synced[p]), not its polled figures. The hook hears this router's own
   * dispatches; dispatch_ids numbers them. */
  bool peer_sync_live[KVR_MAX_PEERS];
  uint64_t peer_instance[KVR_MAX_PEERS];  /* from p's last /admin/load answer (0: unknown) */
  uint32_t peer_sync_port[KVR_MAX_PEERS]; /* p's advertised sync port (0: none) */
  uint32_t sync_port;                     /* this replica's, advertised in /admin/load (0: off) */
  uint64_t peer_sync_messages_total[KVR_MAX_PEERS], peer_sync_gaps_total[KVR_MAX_PEERS];
  uint64_t sync_published_total, sync_skipped_total; /* skipped: undecodable or unknown sender */
  kvr_router_sync_hook_t sync_hook;
  void *sync_ctx;
  uint64_t dispatch_ids;
  uint64_t tokenize_total[4]; /* by kvr_tokenize_result_t */
  /* Router-wide metrics. */
  kvr_hist_t decision_seconds;
  kvr_hist_t request_seconds;
  kvr_hist_t ttfb_seconds;
  uint64_t decisions_total[KVR_MAX_WORKERS];
  uint64_t workers_refused_total; /* workers not added: every slot was taken */
  uint64_t decisions_by_policy[16];
  uint64_t no_worker_total;
  uint64_t client_errors_total; /* 4xx answered by the router itself */
  /* Responses by status code, route and worker (kvr_router_on_response); a flat list, as the
   * combinations seen stay few (codes x 4 routes x workers). */
  kvr_response_count_t *responses;
  size_t nresponses, responses_cap;
  /* Per model label (index 0 "other", 1 "none", then the listed names): the streaming TTFT and
   * ITL histograms and the workers' actual token figures; nmodel_labels in use. */
  kvr_model_label_t *model_labels;
  size_t nmodel_labels, model_labels_cap;
  bool model_labels_full_warned;
  uint64_t prompt_tokens_total, generation_tokens_total; /* the workers' actual_* figures */
  uint64_t client_aborts_total;                          /* clients that went away mid-request */
  uint64_t upstream_failures_total;
  uint64_t request_errors_total[KVR_REQ_ERROR_COUNT]; /* by kvr_req_error_t, one per request */
  uint64_t retries_exhausted_total; /* failed before responding, and no attempt or worker left */
  /* Worker answers refused at the boundary: response heads that break HTTP (by reason), and
   * usage figures no worker can mean (the answer then counts as one without usage). */
  uint64_t upstream_response_errors_total[KVR_HTTP_RESP_ERR_COUNT];
  uint64_t usage_rejected_total;
  /* Remembered placements (router_affinity.c): Responses API response id -> worker. */
  kvr_affinity_t *response_ids;
  uint64_t response_ids_evicted_total;
  double response_gap_ms; /* mean (EWMA, 1/64) wait from a stored response id to its follow-up */
  uint64_t response_id_lookups_total[KVR_AFFINITY_RESULTS];
  /* Session keys (prompt_cache_key, --session-header) -> the worker that served them last. */
  kvr_affinity_t *session_keys;
  uint64_t session_keys_evicted_total;
  uint64_t session_lookups_total[KVR_AFFINITY_RESULTS];
  uint64_t retries_inflight; /* retried requests still in flight (the retry budget) */
  uint64_t retry_budget_refused_total;
  uint64_t ejections_refused_total; /* ejections not done: last usable worker or percent cap */
  /* Admission bound (proxy.c's queue, counted here). */
  uint64_t admission_queue_depth;
  uint64_t admission_queued_total;
  uint64_t admission_rejected_total[2]; /* by kvr_admission_reject_t */
  uint64_t requests_total;              /* client requests, probes excepted */
  /* Runtime LoRA loads (kvr_router_on_lora_load_*): POSTs started, and their ends by
   * kvr_lora_load_result_t. */
  uint64_t lora_load_attempts_total;
  uint64_t lora_loads_total[3];
  uint64_t probe_requests_total[2]; /* GET/HEAD probes, by kvr_probe_t (not in requests_total) */
  /* kvr_router_decide's scratch for scratch_cap slots (grown to nslots when a decision needs it):
   * the snapshots and scores a kvr_decision_t points at, the index's matches, the tried set's
   * words. */
  kvr_worker_snap_t *snaps;
  kvr_policy_score_t *scores;
  size_t *matched;
  uint64_t *tried_words;
  size_t scratch_cap;
  /* The clock every time the router keeps (dispatch, first token, freshness) is read from:
   * kvr_now_ns() unless kvr_router_set_clock() gave another (the virtual-time cluster's). */
  uint64_t (*clock)(void *ctx);
  void *clock_ctx;
};

/* ---- lifecycle and workers ------------------------------------------------------------------- */

/* Creates the router from cfg (which must outlive it): policy, cache index, workers. Needs no loop.
 * Returns NULL with a one-line reason in err. */
kvr_router_t *kvr_router_new(const kvr_config_t *cfg, char *err, size_t errlen);

/* Makes the router read time from clock(ctx) (nanoseconds, never decreasing) instead of
 * kvr_now_ns(): `kvrouter bench --virtual` runs the router on its discrete-event clock. Call it
 * right after kvr_router_new(); clock NULL restores the real one. */
void kvr_router_set_clock(kvr_router_t *r, uint64_t (*clock)(void *ctx), void *ctx);

/* The router's current time in nanoseconds (its clock). */
uint64_t kvr_router_now_ns(const kvr_router_t *r);

/* Frees the router and every worker at once. Requests dispatched through it must have ended, and
 * nothing may report to it afterwards (close the scraper first). Accepts NULL. */
void kvr_router_free(kvr_router_t *r);

/* Adds a worker by URL; returns it (owned by r) or NULL with err: a bad URL, one already served,
 * or every one of the KVR_MAX_WORKERS slots taken ("too many workers: ...", counted in
 * workers_refused_total). */
const kvr_worker_t *kvr_router_add_worker(kvr_router_t *r, const char *url, char *err,
                                          size_t errlen);

/* Adds the workers of one vLLM server: one (dp_size 0) or one per data-parallel rank 0..dp_size-1
 * (dp_size 1..KVR_DP_SIZE_MAX, config.h), each with its KV-event endpoints when events is given
 * (rank R's are events' and replay's with vLLM's rank offset, kvr_url_kv_endpoint_rank). All or
 * nothing: returns how many were added, or a negative code with err (a bad URL or endpoint, the
 * URL already served, or not enough free slots), having added none. */
int kvr_router_add_workers(kvr_router_t *r, const char *url, uint32_t dp_size, const char *events,
                           const char *replay, char *err, size_t errlen);

/* The key of url's worker of data-parallel rank `rank` (-1: a whole server): url, or "url#dp=R".
 * url must already be normalized (kvr_url_worker). */
void kvr_router_worker_key(char *out, size_t outlen, const char *url, int32_t rank);

/* Marks worker id draining: no new requests; it is freed when its in-flight count reaches 0, at
 * once if nothing is in flight. Returns 0 or KVR_ENOENT. */
int kvr_router_drain_worker(kvr_router_t *r, uint32_t id);

/* Finds a worker by id; NULL if none. */
const kvr_worker_t *kvr_router_worker_by_id(const kvr_router_t *r, uint32_t id);
/* The worker whose key is key (a whole server's is its normalized URL, a rank's
 * kvr_router_worker_key's), draining ones excepted, or NULL. */
const kvr_worker_t *kvr_router_worker_serving(const kvr_router_t *r, const char *key);
/* The same for url's rank (-1: the whole server). */
const kvr_worker_t *kvr_router_worker_serving_rank(const kvr_router_t *r, const char *url,
                                                   int32_t rank);

/* True while at least one worker can take requests. */
bool kvr_router_has_usable(const kvr_router_t *r);

/* The part of w's queued prefill it has probably not reached yet at now_ns (prefill_clock.h). */
uint64_t kvr_router_worker_backlog(const kvr_worker_t *w, uint64_t now_ns);

/* Whether w's scraped figures are recent enough to use at at_ms (kvr_router_now_ns() / 1e6). */
bool kvr_router_worker_fresh(const kvr_router_t *r, const kvr_worker_t *w, uint64_t at_ms);

/* Replaces the policy (new requests use it at once; in-flight ones are unaffected). Returns 0 or
 * KVR_EINVAL with err naming the valid policies or the bad parameter. */
int kvr_router_set_policy(kvr_router_t *r, const char *name, const cJSON *params, char *err,
                          size_t errlen);

/* ---- decisions ------------------------------------------------------------------------------- */

/* One routing decision's inputs and outputs (also what /admin/route/explain prints). snaps and
 * scores have nsnaps entries (one per slot) in the router's scratch: valid until its next
 * decision. */
typedef struct kvr_decision_s {
  kvr_worker_snap_t *snaps;
  kvr_policy_score_t *scores;
  size_t nsnaps;
  int chosen; /* slot or KVR_POLICY_NONE */
  double seconds;
} kvr_decision_t;

/* What a decision leaves out besides unusable workers: the slots this request already tried (a
 * short list, one per attempt), with full the workers at the admission bound (a first attempt),
 * and the workers that do not serve model (kvr_router_worker_serves). The router turns the first
 * two into the policy's tried set (kvr_workerset_t, sized to the slots) and marks the last
 * unusable in the snapshots, so a policy sees only the workers serving the request's model.
 * ejected_last_resort: when no worker outside the tried set is usable, the ejected ones serving
 * model count as usable for this decision (not the down or draining ones): outlier ejection is a
 * guess from past failures, and may_eject's "never the last usable one" no longer holds once the
 * workers it left went down. The proxy sets it for a continuation of a broken stream, whose client
 * holds part of the answer; dispatching to an ejected worker makes the request its trial. */
typedef struct kvr_router_avoid_s {
  const int *tried; /* slots; out-of-range ones are ignored */
  size_t ntried;
  bool full;
  const char *model; /* the request's "model"; NULL or "": any worker */
  int prefer_plus1;  /* slot + 1 of the worker its session key last went to (0: none): its match
                        counts as the whole prompt, so the policy keeps the session there unless
                        load outweighs it, as it would a cached prefix */
  bool ejected_last_resort;
} kvr_router_avoid_t;

/* Builds snapshots (including the cache-index match of req's blocks) and runs the policy. record
 * true is a real decision: counted in the metrics, and the policy's state moves on (round robin's
 * cursor, the tie-breaking RNG); false is a look (route/explain) that changes nothing. avoid (NULL:
 * nothing) names the slots the policy must not pick. */
int kvr_router_decide(kvr_router_t *r, const kvr_route_req_t *req, const kvr_router_avoid_t *avoid,
                      bool record, kvr_decision_t *d);

/* ---- KV events (precise mode) -----------------------------------------------------------------
 */

/* Sets worker id's KV-event endpoints (copied; NULL clears). Returns 0 or KVR_ENOENT. */
int kvr_router_set_worker_kv(kvr_router_t *r, uint32_t id, const char *events, const char *replay);
/* A batch of worker id's events: applied to its precise index. A batch naming a data-parallel rank
 * other than a rank worker's own (vLLM's third element, kvr_kv_batch_t.dp_rank) is counted
 * (kv_rank_dropped) and dropped; a whole server's worker takes any rank. */
void kvr_router_on_kv_batch(kvr_router_t *r, uint32_t id, const kvr_kv_batch_t *b);
/* Its stream lost batches: the precise index forgets the worker. */
void kvr_router_on_kv_reset(kvr_router_t *r, uint32_t id);
/* Whether worker id's stream is complete (precise) and, when not, why (net/kv_sub.h's names). */
void kvr_router_on_kv_mode(kvr_router_t *r, uint32_t id, bool precise, const char *mode);

typedef enum {
  KVR_TOKENIZE_CALLED,
  KVR_TOKENIZE_CACHED,
  KVR_TOKENIZE_FAILED,
  KVR_TOKENIZE_PREFIX /* a cached earlier turn's ids stood for the prompt */
} kvr_tokenize_result_t;
/* One request's tokenization for precise routing: seconds it added before the decision. */
void kvr_router_observe_tokenize(kvr_router_t *r, kvr_tokenize_result_t res, double seconds);
/* The latest counters of worker id's stream (copied). */
void kvr_router_on_kv_stats(kvr_router_t *r, uint32_t id, const kvr_kv_stream_stats_t *st);
/* The block size of the precise workers and the URL of a usable one serving model (NULL or "":
 * any; kvr_router_worker_serves) to tokenize on, so a prompt is tokenized by its own model's
 * tokenizer; 0 when no usable worker serving it is precise (then the request is routed on the
 * approximate index alone). */
uint32_t kvr_router_kv_tokenizer(const kvr_router_t *r, const char *model, const char **url);

/* Whether model names a LoRA adapter rather than a base model (a card with a parent in some
 * worker's list, or an adapter of cfg->lora_adapters): vLLM keys such a request's blocks, and its
 * KV events, with the name (kv_decode.h's kvr_kv_request_salts). */
bool kvr_router_model_is_adapter(const kvr_router_t *r, const char *model);
/* The salts vLLM mixes into the blocks of a request for model with cache_salt (NULL: none): the
 * adapter's name when model is one (kvr_router_model_is_adapter), and the cache_salt
 * (kvr_kv_request_salts). */
void kvr_router_kv_salts(const kvr_router_t *r, const char *model, const char *cache_salt,
                         kvr_kv_salts_t *out);

/* ---- replicas ----------------------------------------------------------------------------------
 */

/* One row of a peer's GET /admin/load. */
typedef struct kvr_peer_row_s {
  const char *url;
  kvr_peer_load_t load;
  /* The peer's last scrape of the worker, when it has one: adopted when fresher than ours, so
   * replicas weigh the same engine figures. */
  bool has_scrape;
  uint64_t scrape_age_ms;
  double num_requests_running, num_requests_waiting, kv_cache_usage;
} kvr_peer_row_t;

/* Replica sync's reports (serve/peer_sync.c, serve/peers.c), so that this module stays the only
 * writer of the router's state:
 *   set_sync         attaches (hook non-NULL) or detaches the dispatch/first-token/end/scrape hook
 *                    and this replica's advertised sync port (0: none)
 *   on_peer_hello    peer p's /admin/load named its instance and sync port (0: none)
 *   on_peer_sync_live  p's announced requests are (not) its load now
 *   on_peer_sync_message  one message from p arrived; gap: its sequence skipped some
 *   on_sync_published / on_sync_skipped  one message sent / one received that was dropped
 * p out of range is ignored. */
void kvr_router_set_sync(kvr_router_t *r, kvr_router_sync_hook_t hook, void *ctx, uint32_t port);
void kvr_router_on_peer_hello(kvr_router_t *r, size_t p, uint64_t instance, uint32_t sync_port);
void kvr_router_on_peer_sync_live(kvr_router_t *r, size_t p, bool live);
void kvr_router_on_peer_sync_message(kvr_router_t *r, size_t p, bool gap);
void kvr_router_on_sync_published(kvr_router_t *r);
void kvr_router_on_sync_skipped(kvr_router_t *r);
/* Peer `peer` (index in cfg->peers) answered with rows: each worker found by URL gets its figures
 * (stamped now); a worker the peer did not list gets none from it. */
void kvr_router_on_peer_load(kvr_router_t *r, size_t peer, const kvr_peer_row_t *rows, size_t n);
/* Peer `peer` did not answer (its figures age out by themselves). */
void kvr_router_on_peer_error(kvr_router_t *r, size_t peer);
/* Peer `peer` is this replica itself (its answer carried our instance): ignored. */
void kvr_router_on_peer_self(kvr_router_t *r, size_t peer);
/* The fresh peer load on w summed into *sum (inflight and token figures). */
void kvr_router_peer_load(const kvr_router_t *r, const kvr_worker_t *w, uint64_t now_ms,
                          kvr_peer_load_t *sum);

/* The prompt tokens a worker probably holds: matched_blocks * block_chars / KVR_CHARS_PER_TOKEN,
 * at most prompt_tokens. What kvr_router_on_dispatch() records and route/explain shows. */
uint64_t kvr_router_predicted_cached(const kvr_router_t *r, size_t matched_blocks,
                                     uint64_t prompt_tokens);

/* ---- one request's life on a worker ---------------------------------------------------------- */

/* What one dispatched request added to its worker. Written by kvr_router_on_dispatch() into the
 * caller's storage; the caller holds it until kvr_router_on_end() and never writes it (tests may
 * age dispatched_ns). */
typedef struct kvr_router_dispatch_s {
  bool open;                 /* contributions are on the worker; cleared by kvr_router_on_end */
  uint32_t worker_id;        /* the worker it went to */
  int slot;                  /* that worker's slot (stable while open) */
  bool prefill_alone;        /* no other prefill was pending on the worker (a rate sample) */
  bool trial;                /* the half-open trial of an ejected worker */
  uint64_t dispatched_ns;    /* kvr_router_now_ns() at dispatch */
  uint64_t prompt_tokens;    /* added to active_tokens at dispatch */
  uint64_t predicted_cached; /* prompt tokens the cache index predicted the worker held */
  uint64_t prefill_tokens;   /* added to queued_prefill_tokens; 0 once the first token came */
  uint64_t generated;        /* tokens added to active_tokens since dispatch */
  uint64_t id;               /* numbers this router's dispatches (replica sync) */
  uint8_t peer_plus1;        /* 0: this router's request; p + 1: peer p's synced request */
  uint16_t model;            /* the request's model label: its usage tokens count under it */
} kvr_router_dispatch_t;

/* Replica sync: peer p announced a request of prompt_tokens, prefill_tokens of them uncached, on
 * the worker with this URL. Adds it to the worker's synced[p] and prefill clock (no counters, no
 * rate sample) and fills *d, which kvr_router_on_token (its first token only matters) and
 * kvr_router_on_end then take as for an own request. NULL (d closed) when no worker serves the URL
 * (a draining one does not count: it takes no new requests). */
const kvr_worker_t *kvr_router_on_peer_dispatch(kvr_router_t *r, size_t peer, const char *url,
                                                uint64_t prompt_tokens, uint64_t prefill_tokens,
                                                kvr_router_dispatch_t *d);

/* Dispatches a request of prompt_tokens (estimated) to the worker in slot, of which the cache index
 * matched matched_blocks leading blocks (kvr_decision_t.snaps[slot].matched_blocks): the predicted
 * cached tokens are those blocks' tokens (block_chars / KVR_CHARS_PER_TOKEN each, at most
 * prompt_tokens), the rest is prefill. Adds 1 in-flight, prompt_tokens and the prefill tokens to
 * the worker, counts the request and its tokens, and fills *d with what was added. Returns the
 * worker (valid while d is open), or NULL when slot holds no worker (d is left closed). */
const kvr_worker_t *kvr_router_on_dispatch(kvr_router_t *r, int slot, uint64_t prompt_tokens,
                                           size_t matched_blocks, kvr_router_dispatch_t *d);
/* kvr_router_on_dispatch for a request naming model (NULL or "": none): d also carries its model
 * label, under which kvr_router_on_usage counts its tokens (for a request naming none, the label of
 * the worker's first id, the name vLLM serves it with, once its list is known). */
const kvr_worker_t *kvr_router_on_dispatch_model(kvr_router_t *r, int slot, uint64_t prompt_tokens,
                                                 size_t matched_blocks, const char *model,
                                                 kvr_router_dispatch_t *d);

/* One generated token of d streamed back: adds it to the worker's active tokens. The first one
 * also ends d's prefill (its prefill tokens leave the queue) and, when d was dispatched alone, is
 * a prefill-rate sample (time since dispatched_ns). No-op on a closed d. */
void kvr_router_on_token(kvr_router_t *r, kvr_router_dispatch_t *d);

/* The worker of d now holds blocks[0..n) (its prompt when it answers, prompt plus answer when the
 * response completes): teaches the cache index. No-op on a closed d. */
void kvr_router_on_learn(kvr_router_t *r, const kvr_router_dispatch_t *d, const uint64_t *blocks,
                         size_t n);

/* The usage object of an answer. */
typedef struct kvr_router_usage_s {
  uint64_t prompt_tokens, completion_tokens;
  uint64_t cached_tokens; /* usage.prompt_tokens_details.cached_tokens, 0 when absent */
  bool has_details;       /* prompt_tokens_details.cached_tokens was there */
} kvr_router_usage_t;

/* The 2xx answer to d ended with usage u, or without any (u NULL: a stream the client did not ask
 * usage for). Counts u beside d's prediction and feeds the worker's actual cached and token
 * figures (router.c: "Actual cached tokens and token counts"). No-op on a closed d. */
void kvr_router_on_usage(kvr_router_t *r, const kvr_router_dispatch_t *d,
                         const kvr_router_usage_t *u);

/* The verdict of d's attempt for outlier detection: ok false for a 5xx answer, a first-byte
 * timeout or a failed transfer, true for any other answer. Failures in a row eject the worker (see
 * the header comment); the verdict of a half-open trial restores or re-ejects it. Returns true
 * when this call ejected the worker. No-op (false) on a closed d. */
bool kvr_router_on_result(kvr_router_t *r, kvr_router_dispatch_t *d, bool ok);

/* The request of d failed on its worker (connect, timeout, 5xx, broken stream). No-op if closed. */
void kvr_router_on_worker_error(kvr_router_t *r, const kvr_router_dispatch_t *d);

/* The request of d is retried on another worker. No-op if closed. */
void kvr_router_on_retry(kvr_router_t *r, const kvr_router_dispatch_t *d);

/* The request of d ended, however it ended: removes exactly what d says it added (1 in-flight, its
 * prompt and generated tokens, the prefill tokens still queued) and closes d. A draining worker
 * whose last request this was is freed (its pointer is invalid afterwards). No-op if closed. */
void kvr_router_on_end(kvr_router_t *r, kvr_router_dispatch_t *d);

/* ---- health and scraped figures -------------------------------------------------------------- */

/* Connection-level result of talking to worker id (a proxied request or a /metrics probe):
 * reachable resets the consecutive failures and brings a DOWN worker back UP; unreachable counts
 * one towards DOWN at the configured threshold. Returns 0 or KVR_ENOENT (worker gone meanwhile). */
int kvr_router_on_health(kvr_router_t *r, uint32_t id, bool reachable);

/* Worker id's GET /v1/models answered with the list m (proto/vllm.h): the router takes its cards
 * (m is left empty, the caller frees it as usual) as the ids the worker serves, gives each listed
 * name a model label, and keeps the smallest max_model_len, beyond which kvr_router_on_learn()
 * never teaches the index. Returns 0 or KVR_ENOENT (m untouched). */
int kvr_router_on_models(kvr_router_t *r, uint32_t id, kvr_vllm_models_t *m);

/* The adapter of cfg->lora_adapters named model (one the router may load at runtime), or NULL. */
const kvr_lora_adapter_t *kvr_router_lora_dynamic(const kvr_router_t *r, const char *model);

/* Whether the request naming model, sent to w, must first load its adapter there: model is one of
 * cfg->lora_adapters and w's list does not hold it (a list not read yet counts as not holding it:
 * the worker answers "already loaded" when it does). Returns the adapter or NULL. */
const kvr_lora_adapter_t *kvr_router_lora_needs_load(const kvr_router_t *r, const kvr_worker_t *w,
                                                     const char *model);

/* How a runtime load ended (kvrouter_lora_loads_total{result}). */
#define KVR_LORA_LOAD_RESULT_MAP(XX)                                                               \
  XX(LOADED, "loaded")                 /* 200 */                                                   \
  XX(ALREADY_LOADED, "already_loaded") /* vLLM's 400 "has already been loaded" */                  \
  XX(FAILED, "failed")                 /* any other answer, or none */

typedef enum {
#define XX(name, str) KVR_LORA_LOAD_##name,
  KVR_LORA_LOAD_RESULT_MAP(XX)
#undef XX
      KVR_LORA_LOAD_RESULTS
} kvr_lora_load_result_t;

const char *kvr_lora_load_result_name(kvr_lora_load_result_t res);

/* serve/lora.c started POST /v1/load_lora_adapter of adapter name on the vLLM server at url (a
 * worker's url: every data-parallel rank of that server is a worker of its own, and they share its
 * adapters): counted, and the adapter counts as loaded on each of those workers for decisions
 * until _done. Returns 0, or KVR_ENOENT when no live worker has that url. */
int kvr_router_on_lora_load_start(kvr_router_t *r, const char *url, const char *name);
/* That load ended with res: counted; LOADED or ALREADY_LOADED add a's card to the list of every
 * live worker of url (kvr_vllm_models_add_adapter: parent a->base, else the worker's first id) so
 * requests naming it are routed there, until the next GET /v1/models read. Returns 0 or
 * KVR_ENOENT (no such worker any more; still counted). */
int kvr_router_on_lora_load_done(kvr_router_t *r, const char *url, const kvr_lora_adapter_t *a,
                                 kvr_lora_load_result_t res);

/* Whether w takes a request naming model: always for NULL or "" (vLLM serves its first base name)
 * and while w's list is not known or not complete; else when the list holds the id exactly, as
 * vLLM compares (aliases and LoRA adapters are ids of their own). */
bool kvr_router_worker_serves(const kvr_worker_t *w, const char *model);

/* True when a request naming model must get vLLM's 404 from the router itself: model is a name,
 * the router has workers (draining ones aside) and none of them serves it. */
bool kvr_router_model_unknown(const kvr_router_t *r, const char *model);

/* The model label of a request naming model (NULL or "": "none"; see KVR_MODEL_LABELS_MAX):
 * the listed name, "other" or "none". Valid while r lives. */
const char *kvr_router_model_label(const kvr_router_t *r, const char *model);

/* The most blocks the index learns for w: max_model_len tokens' worth (block_chars /
 * KVR_CHARS_PER_TOKEN tokens a block, at least 1), or SIZE_MAX while max_model_len is unknown. */
size_t kvr_router_learn_cap(const kvr_router_t *r, const kvr_worker_t *w);

/* True while w can take a new request at now_ms: UP, or EJECTED with its time served and no trial
 * in flight (half-open). */
bool kvr_router_worker_usable(const kvr_worker_t *w, uint64_t now_ms);

/* Applies a parsed page to worker id: its scraped figures and, when the page gave the cache
 * geometry, its cache capacity in router blocks (the cache index is resized to match). Returns 0
 * or KVR_ENOENT (worker gone meanwhile). */
int kvr_router_on_scrape(kvr_router_t *r, uint32_t id, const kvr_vllm_metrics_t *m);

/* Replica sync: a peer just scraped the worker with this URL (running, waiting, KV usage 0..1):
 * adopted as this replica's latest scrape, so replicas weigh the same engine figures. Returns 0 or
 * KVR_ENOENT (no such worker). */
int kvr_router_on_peer_scrape(kvr_router_t *r, const char *url, double running, double waiting,
                              double kv_cache_usage);

/* Forgets every cache-index entry of worker id (its prefix cache was reset); *forgotten gets how
 * many there were. Returns 0 or KVR_ENOENT. */
int kvr_router_forget_cache(kvr_router_t *r, uint32_t id, uint64_t *forgotten);

/* ---- router-wide events ---------------------------------------------------------------------- */

void kvr_router_on_request(kvr_router_t *r);          /* a client request arrived */
void kvr_router_on_client_error(kvr_router_t *r);     /* the router answered 4xx itself */
void kvr_router_on_client_abort(kvr_router_t *r);     /* a client went away mid-request */
void kvr_router_on_upstream_failure(kvr_router_t *r); /* 502/504 or a broken stream */
/* A request ended in error for reason e (client_error and client_abort are counted by the two calls
 * above; the proxy reports the others). */
void kvr_router_on_request_error(kvr_router_t *r, kvr_req_error_t e);
/* A request failed before any response byte and could not be retried (attempts used up, or no
 * other worker left). */
void kvr_router_on_retries_exhausted(kvr_router_t *r);

/* A worker's response head broke HTTP (proto/http_headers.h's reason; OK is ignored), or its usage
 * figures were refused (proto/openai.h: usage_invalid, or above the worker's context). */
void kvr_router_on_upstream_response_error(kvr_router_t *r, kvr_http_resp_err_t e);
void kvr_router_on_usage_rejected(kvr_router_t *r);

/* ---- remembered placements (router_affinity.c) ------------------------------------------------
 *
 * A Responses API response lives in the memory of the worker that produced it (vLLM's store):
 * the proxy reports each response id with the dispatch it came from, and before routing a
 * follow-up (previous_response_id), a GET of the response or its cancel, asks which slot holds it:
 * the slot when its worker is still there and usable, else -1 (the request is routed as any
 * other, and that worker tells the client the truth). At most cfg->response_ids_max ids are kept,
 * the oldest evicted first (kvrouter_response_ids_evicted_total). */
kvr_affinity_t *kvr_affinity_new(size_t max);
void kvr_affinity_free(kvr_affinity_t *a);
size_t kvr_affinity_size(const kvr_affinity_t *a);
void kvr_router_on_response_id(kvr_router_t *r, const kvr_router_dispatch_t *acct, const char *id,
                               size_t len);
int kvr_router_on_response_lookup(kvr_router_t *r, const char *id, size_t len, uint64_t now_ms);
/* Closes the open sessions (kvr_worker_t.open_sessions) whose window has passed at now_ms (the
 * router's clock); kvr_router_decide calls it before taking the snapshots. */
void kvr__router_sessions_age(kvr_router_t *r, uint64_t now_ms);
/* The mutable worker of id, or NULL when it is gone (router*.c only: they write worker state). */
kvr_worker_t *kvr__router_worker_by_id(kvr_router_t *r, uint32_t id);

/* Session keys: a request naming one (prompt_cache_key, or the --session-header value) prefers
 * the worker the key last went to (kvr_router_avoid_t.prefer_plus1), within the policy's load
 * bounds; each dispatch records where the key went. At most cfg->session_keys_max keys, the
 * oldest forgotten first. Same results as the response ids' lookups. */
void kvr_router_on_session(kvr_router_t *r, const kvr_router_dispatch_t *acct, const char *key,
                           size_t len);
int kvr_router_on_session_lookup(kvr_router_t *r, const char *key, size_t len, uint64_t now_ms);
/* The public listener's probes, counted apart from requests (kvrouter_probe_requests_total). */
typedef enum { KVR_PROBE_HEALTH = 0, KVR_PROBE_LIVEZ = 1 } kvr_probe_t;
void kvr_router_on_probe(kvr_router_t *r, kvr_probe_t probe);
/* The retry budget: true (and one more retry in flight) when a retry is allowed with
 * requests_inflight client requests in flight; false counts a refusal. Every true is paired with
 * one kvr_router_retry_release() when that request ends. */
bool kvr_router_retry_acquire(kvr_router_t *r, uint64_t requests_inflight);
void kvr_router_retry_release(kvr_router_t *r);

/* ---- admission bound (proxy.c's queue; cfg->admission_max_inflight, 0 = off) ------------------
 */

/* True when the bound is on and the worker in slot has admission_max_inflight requests in flight
 * or more. */
bool kvr_router_admission_full(const kvr_router_t *r, size_t slot);

/* True when the bound is on, some worker outside avoid's tried slots (NULL: none; its full flag is
 * not read) is usable, and every such worker is full: a new request must wait. */
bool kvr_router_admission_blocked(const kvr_router_t *r, const kvr_router_avoid_t *avoid);

typedef enum { KVR_ADMISSION_QUEUE_FULL = 0, KVR_ADMISSION_TIMEOUT = 1 } kvr_admission_reject_t;
#define KVR_ADMISSION_REJECT_NAMES                                                                 \
  { "queue_full", "timeout" }

void kvr_router_on_queued(kvr_router_t *r);   /* a request entered the admission queue */
void kvr_router_on_dequeued(kvr_router_t *r); /* it left the queue (admitted, expired or gone) */
void kvr_router_on_admission_reject(kvr_router_t *r, kvr_admission_reject_t why); /* 503 */

/* Seconds from request received to the first response byte from a worker. */
void kvr_router_observe_ttfb(kvr_router_t *r, double seconds);
/* Seconds from request received to response end (proxied requests). */
void kvr_router_observe_duration(kvr_router_t *r, double seconds);
/* A response sent to a client: its status, route (kvr_route_t), worker label (NULL: none) and the
 * model the request named (NULL: none; counted under its model label). */
void kvr_router_on_response(kvr_router_t *r, int code, int route, const char *worker,
                            const char *model);
/* Streaming token events as the client receives them: the first one's delay after the request
 * arrived, and the gap to the previous one, under the model label of the model the request
 * named. */
void kvr_router_observe_ttft(kvr_router_t *r, const char *model, double seconds);
void kvr_router_observe_itl(kvr_router_t *r, const char *model, double seconds);

#endif

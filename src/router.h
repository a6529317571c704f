/* router.h -- the state of `kvrouter serve`: workers, the active policy, the cache index, counters.
 *
 * kvr_router_t is owned by serve.c and shared by the public proxy (proxy.c), the admin API
 * (admin.c) and the /metrics scraper (scrape.c). Everything runs on one libuv loop, so no locking.
 *
 * Workers live in slots 0..KVR_MAX_WORKERS-1. A worker's slot is its index in policy snapshots, in
 * the `tried` mask and in the cache index, so it never changes while the worker exists; a removed
 * worker's slot is reused only after its in-flight requests have finished and its cache state has
 * been forgotten. The id shown to operators is stable and never reused.
 *
 * Load accounting is exact: every proxied request adds its contribution (1 in-flight, its estimated
 * prompt tokens, its uncached prefill tokens, then each generated token) to its worker on dispatch
 * and removes exactly what it added when it ends, however it ends.
 */
#ifndef KVR_ROUTER_H
#define KVR_ROUTER_H

#include "cache_index.h"
#include "config.h"
#include "curlm.h"
#include "metrics.h"
#include "policies/policy.h"
#include "prefill_clock.h"
#include "prompt.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define KVR_WORKER_STATE_MAP(XX)                                                                   \
  XX(UP, "up")                                                                                     \
  XX(DOWN, "down")                                                                                 \
  XX(DRAINING, "draining")

typedef enum {
#define XX(name, str) KVR_WORKER_##name,
  KVR_WORKER_STATE_MAP(XX)
#undef XX
} kvr_worker_state_t;

const char *kvr_worker_state_name(kvr_worker_state_t s);

typedef struct kvr_router_s kvr_router_t;

typedef struct kvr_worker_s {
  kvr_router_t *router;
  uint32_t id;    /* stable, shown in the admin API and the x-kvrouter-worker header */
  int slot;       /* index in snapshots, tried masks and the cache index */
  char *url;      /* owned, normalized base URL without trailing slash */
  char label[16]; /* id as text for metric labels and headers */
  kvr_worker_state_t state;
  /* Load the router tracks itself. */
  uint32_t inflight;
  uint64_t active_tokens;
  uint64_t queued_prefill_tokens;
  kvr_prefill_clock_t
      prefill; /* how much of queued_prefill_tokens is still ahead (prefill_clock.h) */
  /* Counters. */
  uint64_t requests_total, errors_total, retries_total;
  uint64_t prompt_tokens_total, predicted_cached_tokens_total;
  uint64_t usage_prompt_tokens_total, usage_predicted_cached_total, usage_cached_tokens_total;
  uint64_t consecutive_failures;
  uint64_t added_ms;
  /* From the worker's /metrics (scrape.c). */
  bool metrics_seen;
  uint64_t scraped_at_ms;
  double num_requests_running, num_requests_waiting, kv_cache_usage;
  uint64_t num_gpu_blocks, block_size;
  uint64_t cache_capacity_blocks; /* in router blocks */
  void *scrape;                   /* scrape.c's in-flight probe, NULL when idle */
} kvr_worker_t;

struct kvr_router_s {
  uv_loop_t *loop;
  kvr_config_t *cfg;  /* owned by serve.c, outlives the router */
  kvr_curlm_t *curlm; /* owned */
  kvr_worker_t *slots[KVR_MAX_WORKERS];
  size_t nslots; /* highest used slot + 1 */
  uint32_t next_id;
  kvr_policy_t *policy; /* owned; replaced whole by kvr_router_set_policy() */
  cJSON *policy_params; /* owned copy of the params the policy was created from, or NULL */
  uint64_t policy_generation;
  kvr_cache_index_t *index; /* owned */
  uv_timer_t scrape_timer;
  bool closing;
  /* Router-wide metrics. */
  kvr_hist_t decision_seconds;
  kvr_hist_t request_seconds;
  kvr_hist_t ttfb_seconds;
  uint64_t decisions_total[KVR_MAX_WORKERS];
  uint64_t decisions_by_policy[16];
  uint64_t no_worker_total;
  uint64_t client_errors_total; /* 4xx answered by the router itself */
  uint64_t client_aborts_total; /* clients that went away mid-request */
  uint64_t upstream_failures_total;
  uint64_t requests_total;
};

/* Creates the router from cfg: workers, policy, index, curl multi, and starts the scraper.
 * Returns NULL with a one-line reason in err. */
kvr_router_t *kvr_router_new(uv_loop_t *loop, kvr_config_t *cfg, char *err, size_t errlen);

/* Stops timers and transfers; closes uv handles. The router is freed once the loop has run the
 * close callbacks. Proxied requests must have been finished first. */
void kvr_router_close(kvr_router_t *r);

/* Adds a worker by URL; returns it or NULL with err. */
kvr_worker_t *kvr_router_add_worker(kvr_router_t *r, const char *url, char *err, size_t errlen);

/* Marks a worker draining: no new requests; it is removed when its in-flight count reaches 0. */
void kvr_router_drain_worker(kvr_router_t *r, kvr_worker_t *w);

/* Finds a worker by id; NULL if none. */
kvr_worker_t *kvr_router_worker_by_id(kvr_router_t *r, uint32_t id);

/* True while at least one worker can take requests. */
bool kvr_router_has_usable(const kvr_router_t *r);

/* Replaces the policy (new requests use it at once; in-flight ones are unaffected). Returns 0 or
 * KVR_EINVAL with err naming the valid policies or the bad parameter. */
int kvr_router_set_policy(kvr_router_t *r, const char *name, const cJSON *params, char *err,
                          size_t errlen);

/* One routing decision's inputs and outputs (also what /admin/route/explain prints). */
typedef struct kvr_decision_s {
  kvr_worker_snap_t snaps[KVR_MAX_WORKERS];
  kvr_policy_score_t scores[KVR_MAX_WORKERS];
  size_t nsnaps;
  int chosen; /* slot or KVR_POLICY_NONE */
  double seconds;
} kvr_decision_t;

/* Builds snapshots (including the cache-index match of req's blocks), runs the policy, and records
 * the decision in the metrics when record is true. tried masks slots already attempted. */
int kvr_router_decide(kvr_router_t *r, const kvr_route_req_t *req, uint64_t tried, bool record,
                      kvr_decision_t *d);

/* Load accounting; see the header comment. */
void kvr_router_worker_begin(kvr_worker_t *w, uint64_t prompt_tokens, uint64_t prefill_tokens);
void kvr_router_worker_end(kvr_worker_t *w, uint64_t prompt_tokens, uint64_t prefill_left,
                           uint64_t generated);
/* A streamed request's first token arrived: its prefill_tokens are no longer queued, and its
 * time since dispatched_ns (kvr_now_ns()) is a prefill-rate sample when it was dispatched alone
 * (no prefill pending on w then). */
void kvr_router_worker_prefilled(kvr_worker_t *w, uint64_t prefill_tokens, uint64_t dispatched_ns,
                                 bool alone);

/* Connection-level outcome of a request to w: resets or counts consecutive failures (DOWN at the
 * configured threshold). */
void kvr_router_worker_result(kvr_worker_t *w, bool connect_ok);

/* Writes the admin /metrics text. */
void kvr_router_metrics(kvr_router_t *r, kvr_buf_t *out);

/* Writes the JSON of GET /admin/workers and GET /admin/policy. */
cJSON *kvr_router_workers_json(kvr_router_t *r);
cJSON *kvr_router_policy_json(kvr_router_t *r);

/* Starts the periodic /metrics scrape of every worker (scrape.c). */
void kvr_scrape_start(kvr_router_t *r);
void kvr_scrape_stop(kvr_router_t *r);
/* Cancels the in-flight probe of one worker (before the worker is freed). */
void kvr_scrape_cancel(kvr_router_t *r, kvr_worker_t *w);
/* Parses the Prometheus text of a vLLM /metrics page into w's scraped fields. Returns 0 or
 * KVR_EPARSE when none of the expected series is present. Exposed for tests. */
int kvr_scrape_parse(kvr_worker_t *w, const char *text, size_t len, uint64_t now_ms);

#endif

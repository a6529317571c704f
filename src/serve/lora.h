/* lora.h -- loading a LoRA adapter on a vLLM server at runtime, once per server and adapter.
 *
 * With --lora-adapter NAME=PATH the operator says the workers run with
 * VLLM_ALLOW_RUNTIME_LORA_UPDATING and may load that adapter: a request naming it, routed to a
 * worker whose GET /v1/models does not list it (kvr_router_lora_needs_load), waits here while the
 * router asks that worker POST /v1/load_lora_adapter {"lora_name", "lora_path"} (vLLM's
 * serve/lora/api_router.py, models/serving.py load_lora_adapter), then goes on.
 *
 *   proxy: kvr_lora_load(l, worker, adapter, wait)
 *     -> an op of (the worker's URL, adapter name) in flight? join its waiters (the data-parallel
 *        ranks of one vLLM server are workers of one URL and share its adapters: one load)
 *     -> else a new op: kvr_router_on_lora_load_start, POST on the curl multi
 *   transfer done -> result: 200 loaded; 400 whose message says "has already been loaded"
 *                    already_loaded (as good: it is there); anything else failed, with the
 *                    worker's status and message (vLLM's error JSON, either shape, or the body)
 *     -> kvr_router_on_lora_load_done (counts; a success adds the adapter's card to the worker's
 *        list, so the next requests are routed there without a load)
 *     -> every waiter's callback, in arrival order.
 *
 * Structs: kvr_lora_t (owned by the proxy) holds the ops in flight; an op owns copies of the
 * adapter's name and path, its easy handle, its body and its answer (bounded at 64 KiB), and a
 * list of waiters. A kvr_lora_wait_t is embedded in its owner (the proxied request), which may
 * leave at any time with kvr_lora_cancel (the op goes on: the adapter is still worth having).
 * Invariant: an op is in l->ops exactly while its transfer is in the multi; its server is named
 * by URL, never by worker pointer (a worker removed meanwhile is simply not found by the router).
 */
#ifndef KVR_LORA_H
#define KVR_LORA_H

#include "base/list.h"
#include "core/config.h"
#include "core/router.h"
#include "net/curlm.h"

#include <stdbool.h>

typedef struct kvr_lora_s kvr_lora_t;
typedef struct kvr_lora_wait_s kvr_lora_wait_t;

/* How a load ended, for the waiters: res, and for a failure the worker's HTTP status (0: no
 * answer) and a one-line reason (the worker's message or curl's error). */
typedef struct kvr_lora_outcome_s {
  kvr_lora_load_result_t res;
  long status;
  const char *reason; /* valid during the callback */
} kvr_lora_outcome_t;

typedef void (*kvr_lora_cb)(kvr_lora_wait_t *wait, const kvr_lora_outcome_t *o);

/* One request waiting for a load; embedded in its owner, zeroed before first use. */
struct kvr_lora_wait_s {
  kvr_list_t node; /* in its op's waiters while waiting */
  bool waiting;
  kvr_lora_cb cb;
};

/* Creates the loader on curlm (which must outlive it), reporting to r. timeout_ms bounds each
 * POST (connect_ms its connection). */
kvr_lora_t *kvr_lora_new(kvr_curlm_t *curlm, kvr_router_t *r, long connect_ms, long timeout_ms);

/* Cancels every load in flight (their waiters' callbacks are not called: cancel them first) and
 * frees l. Accepts NULL. */
void kvr_lora_free(kvr_lora_t *l);

/* Makes wait wait for adapter a on worker w: joins the load in flight there, or starts one.
 * Returns 0, and wait->cb(wait, outcome) is called once when the load ends (from the loop, never
 * inside this call) unless kvr_lora_cancel(wait) comes first; or KVR_EIO when the POST could not
 * be started (the callback is then never called). */
int kvr_lora_load(kvr_lora_t *l, const kvr_worker_t *w, const kvr_lora_adapter_t *a,
                  kvr_lora_wait_t *wait);

/* Takes wait out of its load (no callback follows); no-op when it is not waiting. */
void kvr_lora_cancel(kvr_lora_wait_t *wait);

/* Loads in flight now. */
size_t kvr_lora_inflight(const kvr_lora_t *l);

#endif

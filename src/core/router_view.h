/* router_view.h -- read-only renderings of the router's state: Prometheus text and admin JSON.
 *
 * Each function reads the router through a const pointer and writes a fresh rendering the caller
 * owns; none changes any state, so a view can be taken at any moment, as often as wanted.
 */
#ifndef KVR_ROUTER_VIEW_H
#define KVR_ROUTER_VIEW_H

#include "base/buf.h"
#include "core/router.h"

#include <cjson/cJSON.h>

/* Appends the router's part of the admin GET /metrics text (exposition format 0.0.4) to out: the
 * worker, routing, request, KV-event and peer families, the build and the process. The serve layer
 * adds its own modules' families after it (serve/admin.c's renderer table). */
void kvr_router_view_metrics(const kvr_router_t *r, kvr_buf_t *out);

/* The JSON array of GET /admin/workers (one object per worker); the caller owns it. */
cJSON *kvr_router_view_workers(const kvr_router_t *r);

/* One worker's object of that array (what POST and DELETE /admin/workers answer with); the caller
 * owns it. */
cJSON *kvr_router_view_worker(const kvr_router_t *r, const kvr_worker_t *w);

/* The JSON object of GET /admin/policy: the active policy, its effective parameters, the
 * available policies and the routing decisions each has taken; the caller owns it. */
cJSON *kvr_router_view_policy(const kvr_router_t *r);

/* The approximate cache index's totals (distinct blocks, (block, worker) entries, bytes, inserts,
 * evictions) for GET /admin/workers' "cache_index"; the caller owns it. */
cJSON *kvr_router_view_cache_index(const kvr_router_t *r);

/* This replica's own per-worker load, keyed by URL (GET /admin/load, read by its peers). */
cJSON *kvr_router_view_load(const kvr_router_t *r);

/* The body of GET /v1/models on the public listener, appended to out: {"object":"list","data":
 * [...]} with the union of the cards the usable workers listed (their lists known), each id once,
 * its card as the first worker in slot order gave it (vLLM's fields kept), compact as vLLM writes
 * it. Returns the number of workers whose lists went in; with 0 the body lists nothing and the
 * caller may ask a worker. */
size_t kvr_router_view_models(const kvr_router_t *r, kvr_buf_t *out);

#endif

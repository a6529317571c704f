/* admin.h -- the operators' listener: workers, policy, route explanation, metrics.
 *
 * Routes (JSON in and out, errors OpenAI-style; one route table, http_route.h, so HEAD works
 * wherever GET does, another method on a known path is a 405 with Allow, any other path a 404):
 *   GET    /admin/workers          every worker: URL, state, in-flight, totals, errors, scraped
 *                                  load, predicted vs actual cached tokens; and the cache index's
 *                                  totals ("cache_index")
 *   POST   /admin/workers          {"url": "http://host:port"} adds a worker (201)
 *   DELETE /admin/workers/{id}     drains a worker: no new requests, in-flight ones finish (202)
 *   GET    /admin/policy           the active policy, its effective parameters, the choices
 *   PUT    /admin/policy           {"policy": NAME, "params": {...}} switches or retunes (200)
 *   POST   /admin/route/explain    an OpenAI request body; answers each worker's matched blocks,
 *                                  load figures and cost, and the choice, without sending anything
 *   POST   /admin/reset_prefix_cache
 *                                  POST WORKER/reset_prefix_cache to every worker (vLLM's dev-mode
 *                                  endpoint) and forget the cache index entries of each worker that
 *                                  answered 2xx; answers 200 with {"reset", "failed", "workers":
 *                                  [{id, url, state, ok, status, error, index_blocks_forgotten}]}
 *                                  once every worker answered or timed out (10 s). A failing worker
 *                                  (a vLLM without VLLM_SERVER_DEV_MODE=1 answers 404) is reported,
 *                                  its index entries kept.
 *   GET    /metrics                Prometheus text exposition
 *   GET    /health                 200 {"status":"ok"} while a worker is usable, else 503
 *                                  {"status":"unavailable"} (public /health also counts workers)
 *   GET    /dashboard, /           the live dashboard page (dashboard.h), served without a token
 *
 * Authentication: with a token (--admin-token-file, cfg->admin_token) every call but GET /health
 * and the dashboard page (static HTML that asks for the token and sends it on its own calls)
 * needs "Authorization: Bearer TOKEN" (scheme in any case, token compared in constant time); with
 * --admin-open-reads GET and HEAD need none. A missing or wrong token is a 401 with
 * WWW-Authenticate: Bearer and an OpenAI-style authentication_error/invalid_api_key body, checked
 * before any route runs, so the call changes nothing. Without a token nothing is checked.
 */
#ifndef KVR_ADMIN_H
#define KVR_ADMIN_H

#include "core/router.h"
#include "net/curlm.h"
#include "net/http_server.h"
#include "serve/proxy.h"
#include "serve/trace_out.h"

typedef struct kvr_admin_s kvr_admin_t;

/* Creates the admin API over r, whose POST /admin/reset_prefix_cache fan-out runs on curlm (both
 * must outlive it). Never returns NULL (out of memory aborts, kvr.h). */
kvr_admin_t *kvr_admin_new(kvr_router_t *r, kvr_curlm_t *curlm);

/* GET /metrics also shows the public proxy's counters (not owned; NULL: none). */
void kvr_admin_set_proxy(kvr_admin_t *a, const kvr_proxy_t *p);

/* GET /metrics also shows t's counters (--trace-out; not owned; NULL: none). */
void kvr_admin_set_trace(kvr_admin_t *a, const kvr_trace_out_t *t);
/* Frees the admin API; its listener must be closed (no fan-out left). Accepts NULL. */
void kvr_admin_free(kvr_admin_t *a);

/* kvr_http_request_cb of the admin listener; data is the kvr_admin_t. */
void kvr_admin_on_request(kvr_http_req_t *req, void *data);

#endif

/* proxy.h -- the public OpenAI-compatible listener's request handler (reverse proxy to workers).
 *
 * kvr_proxy_t owns the list of proxied requests in flight, so that shutdown can abort them. It is
 * the `data` of the public kvr_http_server_t's on_request callback (kvr_proxy_on_request). It runs
 * its timers on the loop and its upstream transfers on the curl multi it is given, and reports
 * every change of router state (load, errors, health, counters) through the router's calls.
 */
#ifndef KVR_PROXY_H
#define KVR_PROXY_H

#include "core/config.h"
#include "core/router.h"
#include "net/curlm.h"
#include "net/http_server.h"
#include "proto/prompt.h"
#include "serve/trace_out.h"

#include <uv.h>

typedef struct kvr_proxy_s kvr_proxy_t;

/* Creates the proxy: request timers on loop, upstream transfers on curlm, routing and accounting
 * by r (all three must outlive it). Never returns NULL (out of memory aborts, kvr.h). */
kvr_proxy_t *kvr_proxy_new(uv_loop_t *loop, kvr_router_t *r, kvr_curlm_t *curlm);
/* Frees the proxy; every request must have ended (kvr_proxy_active() == 0). Accepts NULL. */
void kvr_proxy_free(kvr_proxy_t *p);

/* From now on every request that completes with a 2xx answer and a prompt the router read is
 * written to t (serve/trace_out.h; not owned, must outlive the proxy; NULL stops it). */
void kvr_proxy_set_trace(kvr_proxy_t *p, kvr_trace_out_t *t);

/* kvr_http_request_cb of the public listener; data is the kvr_proxy_t. */
void kvr_proxy_on_request(kvr_http_req_t *req, void *data);

/* Appends the proxy's own families to a /metrics page (kvrouter_stream_resumes_total). */
void kvr_proxy_metrics(const kvr_proxy_t *p, kvr_buf_t *out);

/* Proxied requests still in flight. */
size_t kvr_proxy_active(const kvr_proxy_t *p);

/* Aborts every proxied request (shutdown): transfers are cancelled, clients get 503 or a broken-
 * stream error event. */
void kvr_proxy_abort_all(kvr_proxy_t *p);

#endif

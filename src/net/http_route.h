/* http_route.h -- the one HTTP route table: path + allowed methods -> handler, with 404 and 405.
 *
 * The proxy, the admin API and the simulated worker each declare a const table of routes and hand
 * every request to kvr_http_route_dispatch(). A path that no route names is a 404; a path that some
 * route names, but not with this method, is a 405 whose Allow header lists every method the table
 * accepts on that path (RFC 9110 15.5.6 requires it). HEAD is accepted wherever GET is. The error
 * body follows the server's dialect: OpenAI-style `{"error": {...}}` for kvrouter's own listeners,
 * FastAPI's `{"detail": "Not Found"}` for the simulated vLLM worker (what vLLM answers).
 *
 * A route path ending in '*' is a prefix; the handler then receives the rest of the path in `tail`
 * ("" for exact routes). The most specific path decides: when any exact route names the path, only
 * the exact routes of that path are considered (a wrong method there is a 405, even if a prefix
 * route would accept it); otherwise the prefix routes are tried in table order.
 */
#ifndef KVR_HTTP_ROUTE_H
#define KVR_HTTP_ROUTE_H

#include "net/http_server.h"

#include <llhttp.h>
#include <stddef.h>
#include <stdint.h>

/* Bit of one llhttp method in a route's method set: KVR_HTTP_M(GET) | KVR_HTTP_M(POST). */
#define KVR_HTTP_M(name) (UINT64_C(1) << HTTP_##name)
/* Every method (a pass-through route). */
#define KVR_HTTP_M_ANY UINT64_MAX

typedef void (*kvr_http_route_cb)(kvr_http_req_t *req, void *data, const char *tail);

typedef struct kvr_http_route_s {
  const char *path; /* exact path, or a prefix when it ends with '*' */
  uint64_t methods; /* KVR_HTTP_M() bits; GET implies HEAD */
  kvr_http_route_cb handler;
} kvr_http_route_t;

typedef enum { KVR_HTTP_DIALECT_OPENAI, KVR_HTTP_DIALECT_FASTAPI } kvr_http_dialect_t;

/* Finds the route for (path, method). Returns it, with *tail set to the part of path after a
 * prefix route; or NULL with *status 404 (no route names path) or 405 (allow receives the accepted
 * methods, "GET, HEAD, POST", NUL-terminated, truncated to allow_len). Pure: no I/O. */
const kvr_http_route_t *kvr_http_route_find(const kvr_http_route_t *table, size_t n,
                                            const char *path, int method, const char **tail,
                                            int *status, char *allow, size_t allow_len);

/* Finds the route of req and calls its handler with data, or answers 404/405 (with Allow) in the
 * given dialect. Returns 0 when a handler ran, else the status answered; req has then been
 * finished (and freed, http_server.h), so a caller that logs the rejected request from req does
 * so before, with kvr_http_route_find(). */
int kvr_http_route_dispatch(const kvr_http_route_t *table, size_t n, kvr_http_req_t *req,
                            void *data, kvr_http_dialect_t dialect);

#endif

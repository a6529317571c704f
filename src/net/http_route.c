/* http_route.c -- route lookup and the 404/405 answers; see http_route.h.
 *
 * The table is small (under 20 routes) and const, so linear scans are both the simplest and the
 * fastest lookup: the exact routes first, then, only when no exact route names the path, the prefix
 * routes in table order. The Allow list comes from the methods met on the path during the scan.
 */
#include "net/http_route.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Matches path against a route path; sets *tail for prefix routes. */
static bool path_matches(const char *route, const char *path, const char **tail) {
  size_t n = strlen(route);
  if (n > 0 && route[n - 1] == '*') {
    if (strncmp(route, path, n - 1) != 0)
      return false;
    *tail = path + n - 1;
    return true;
  }
  *tail = "";
  return strcmp(route, path) == 0;
}

static bool method_allowed(uint64_t methods, int method) {
  if (method < 0 || method >= 64)
    return methods == KVR_HTTP_M_ANY;
  if (method == HTTP_HEAD && (methods & KVR_HTTP_M(GET)))
    return true;
  return (methods >> method) & 1;
}

/* The methods a set accepts, in llhttp's order, "GET, HEAD, POST". */
static void allow_list(uint64_t methods, char *out, size_t len) {
  size_t used = 0;
  out[0] = '\0';
  if (methods & KVR_HTTP_M(GET))
    methods |= KVR_HTTP_M(HEAD);
  for (int m = 0; m < 64 && used < len; m++) {
    if (!((methods >> m) & 1))
      continue;
    int w = snprintf(out + used, len - used, "%s%s", used ? ", " : "",
                     llhttp_method_name((llhttp_method_t)m));
    used += w > 0 ? (size_t)w : 0;
  }
}

/* Scans the exact (prefix = false) or the prefix routes; returns the first that accepts method, or
 * NULL with *on_path holding the methods of the routes that name path. */
static const kvr_http_route_t *scan(const kvr_http_route_t *table, size_t n, bool prefix,
                                    const char *path, int method, const char **tail,
                                    uint64_t *on_path) {
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(table[i].path);
    bool is_prefix = len > 0 && table[i].path[len - 1] == '*';
    const char *t;
    if (is_prefix != prefix || !path_matches(table[i].path, path, &t))
      continue;
    if (method_allowed(table[i].methods, method)) {
      *tail = t;
      return &table[i];
    }
    *on_path |= table[i].methods;
  }
  return NULL;
}

const kvr_http_route_t *kvr_http_route_find(const kvr_http_route_t *table, size_t n,
                                            const char *path, int method, const char **tail,
                                            int *status, char *allow, size_t allow_len) {
  uint64_t on_path = 0;
  const kvr_http_route_t *rt = scan(table, n, false, path, method, tail, &on_path);
  if (rt == NULL && on_path == 0)
    rt = scan(table, n, true, path, method, tail, &on_path);
  *status = rt ? 0 : on_path ? 405 : 404;
  if (rt == NULL && allow_len > 0)
    allow_list(on_path, allow, allow_len);
  return rt;
}

static void reject(kvr_http_req_t *req, int status, const char *allow, kvr_http_dialect_t dialect) {
  char hdr[160] = "";
  if (status == 405)
    snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
  if (dialect == KVR_HTTP_DIALECT_FASTAPI) {
    const char *body =
        status == 405 ? "{\"detail\":\"Method Not Allowed\"}" : "{\"detail\":\"Not Found\"}";
    kvr_http_respond(req, status, "application/json", hdr[0] ? hdr : NULL, body, strlen(body));
  } else if (status == 405) {
    kvr_http_error_h(req, 405, hdr, NULL, "method_not_allowed",
                     "%s is not allowed on %s (allowed: %s)", req->method_str, req->path, allow);
  } else {
    kvr_http_error(req, 404, NULL, "not_found", "no route for %s %s", req->method_str, req->path);
  }
}

int kvr_http_route_dispatch(const kvr_http_route_t *table, size_t n, kvr_http_req_t *req,
                            void *data, kvr_http_dialect_t dialect) {
  const char *tail;
  int status;
  char allow[128];
  const kvr_http_route_t *rt =
      kvr_http_route_find(table, n, req->path, req->method, &tail, &status, allow, sizeof allow);
  if (rt == NULL) {
    reject(req, status, allow, dialect);
    return status;
  }
  rt->handler(req, data, tail);
  return 0;
}

/* dashboard.h -- the live dashboard page of the admin listener.
 *
 * Routes (answered before the admin token is checked: the page is the same static HTML for everyone
 * and holds no router data; it asks for the token itself and sends it with every admin call it
 * makes, so a browser can open it without a bearer header):
 *   GET  /dashboard   the page (text/html), a strict Content-Security-Policy with a fresh nonce
 *   GET  /            302 to /dashboard
 * Another method on these paths is a 405 with Allow.
 *
 * The page (src/serve/dashboard.html, compiled in by CMakeLists.txt) polls GET /admin/workers and
 * GET /admin/policy every second and switches the policy with PUT /admin/policy, nothing else: no
 * external script, style, font or image. Its inline <style> and <script> run only because they
 * carry the response's nonce (CSP 'nonce-...'); any other inline or external code is refused.
 */
#ifndef KVR_DASHBOARD_H
#define KVR_DASHBOARD_H

#include "base/buf.h"
#include "net/http_server.h"

#include <stdbool.h>
#include <stddef.h>

/* The placeholder src/serve/dashboard.html carries where the response's nonce goes. */
#define KVR_DASHBOARD_NONCE_MARK "{{nonce}}"
/* A nonce: 128 random bits as 32 lowercase hex digits (hex is valid CSP base64-value syntax). */
#define KVR_DASHBOARD_NONCE_LEN 32

/* True when path is one the dashboard answers ("/" and "/dashboard"). */
bool kvr_dashboard_owns(const char *path);

/* Answers a request whose path kvr_dashboard_owns(): the page, the redirect, or a 405. */
void kvr_dashboard_on_request(kvr_http_req_t *req);

/* Renders the page for nonce (KVR_DASHBOARD_NONCE_LEN characters): appends the HTML with every
 * KVR_DASHBOARD_NONCE_MARK replaced by nonce to body, and the response's extra header lines
 * ("Name: value\r\n", the CSP among them) to headers. Pure: no I/O, same output for the same
 * nonce. */
void kvr_dashboard_render(const char *nonce, kvr_buf_t *body, kvr_buf_t *headers);

#endif

/* dashboard.c -- the admin listener's live dashboard page (see dashboard.h for the routes).
 *
 * The page is src/serve/dashboard.html, kept as an editable HTML file and compiled in as the byte
 * array kvr__dashboard_html[] (CMakeLists.txt writes it into the build tree's
 * generated/dashboard_html.c whenever the HTML changes). Each GET renders it afresh: a nonce of 128
 * bits from the OS's random source (uv_random) replaces every "{{nonce}}" of the page (its one
 * <style> and one <script>) and goes into the Content-Security-Policy header, which allows nothing
 * else:
 *
 *   default-src 'none'              no source of any kind unless named below
 *   script-src 'nonce-N'            the page's own inline script only
 *   style-src 'nonce-N'             the page's own inline style element only
 *   connect-src 'self'              fetch() to the admin listener itself (its JSON endpoints)
 *   img-src data:                   the page's empty data: favicon (else browsers ask for
 *                                   /favicon.ico, a 401 or 404 in the console); no other image
 *   base-uri 'none'; form-action 'none'; frame-ancestors 'none'
 *
 * So an external script, font, style or image cannot load even if a worker URL shown in the page
 * were crafted to look like markup (the page writes data with textContent, never as HTML). The
 * response is not cached (a nonce must not be reused) and carries nosniff and no-referrer.
 *
 * State: none; the page reads the router only through the admin API, with the token its user
 * typed (admin.c checks it), so serving the page bypasses no authentication.
 */
#include "serve/dashboard.h"

#include "base/kvr.h"
#include "base/log.h"
#include "net/http_route.h"

#include <stdio.h>
#include <string.h>
#include <uv.h>

/* generated/dashboard_html.c (CMakeLists.txt): src/serve/dashboard.html, byte for byte. */
extern const unsigned char kvr__dashboard_html[];
extern const size_t kvr__dashboard_html_len;

void kvr_dashboard_render(const char *nonce, kvr_buf_t *body, kvr_buf_t *headers) {
  const char *p = (const char *)kvr__dashboard_html;
  const char *end = p + kvr__dashboard_html_len;
  const size_t mlen = strlen(KVR_DASHBOARD_NONCE_MARK);
  kvr_buf_reserve(body, kvr__dashboard_html_len);
  for (;;) {
    const char *m = memmem(p, (size_t)(end - p), KVR_DASHBOARD_NONCE_MARK, mlen);
    if (m == NULL)
      break;
    kvr_buf_append(body, p, (size_t)(m - p));
    kvr_buf_append(body, nonce, KVR_DASHBOARD_NONCE_LEN);
    p = m + mlen;
  }
  kvr_buf_append(body, p, (size_t)(end - p));
  kvr_buf_printf(headers,
                 "Content-Security-Policy: default-src 'none'; script-src 'nonce-%.*s'; "
                 "style-src 'nonce-%.*s'; connect-src 'self'; img-src data:; base-uri 'none'; "
                 "form-action 'none'; frame-ancestors 'none'\r\n",
                 KVR_DASHBOARD_NONCE_LEN, nonce, KVR_DASHBOARD_NONCE_LEN, nonce);
  kvr_buf_puts(headers, "Cache-Control: no-store\r\n"
                        "X-Content-Type-Options: nosniff\r\n"
                        "Referrer-Policy: no-referrer\r\n");
}

static void page_get(kvr_http_req_t *req, void *data, const char *tail) {
  (void)data;
  (void)tail;
  unsigned char raw[KVR_DASHBOARD_NONCE_LEN / 2];
  int rc = uv_random(NULL, NULL, raw, sizeof raw, 0, NULL);
  if (rc != 0) {
    /* No weaker nonce instead: a guessable one would let injected script run. */
    KVR_ERROR("admin", "dashboard: no random bytes for the CSP nonce: %s", uv_strerror(rc));
    kvr_http_error(req, 500, NULL, NULL, "no random bytes for the page's nonce: %s",
                   uv_strerror(rc));
    return;
  }
  char nonce[KVR_DASHBOARD_NONCE_LEN + 1];
  for (size_t i = 0; i < sizeof raw; i++)
    snprintf(nonce + 2 * i, 3, "%02x", raw[i]);
  kvr_buf_t body = KVR_BUF_INIT, headers = KVR_BUF_INIT;
  kvr_dashboard_render(nonce, &body, &headers);
  kvr_http_respond(req, 200, "text/html; charset=utf-8", headers.data, body.data, body.len);
  kvr_buf_free(&body);
  kvr_buf_free(&headers);
}

static void root_get(kvr_http_req_t *req, void *data, const char *tail) {
  (void)data;
  (void)tail;
  kvr_http_respond(req, 302, NULL, "Location: /dashboard\r\n", NULL, 0);
}

static const kvr_http_route_t routes[] = {
    {"/dashboard", KVR_HTTP_M(GET), page_get},
    {"/", KVR_HTTP_M(GET), root_get},
};

bool kvr_dashboard_owns(const char *path) {
  for (size_t i = 0; i < KVR_ARRAY_SIZE(routes); i++)
    if (strcmp(path, routes[i].path) == 0)
      return true;
  return false;
}

void kvr_dashboard_on_request(kvr_http_req_t *req) {
  kvr_http_route_dispatch(routes, KVR_ARRAY_SIZE(routes), req, NULL, KVR_HTTP_DIALECT_OPENAI);
}

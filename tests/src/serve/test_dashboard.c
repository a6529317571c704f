/* test_dashboard.c -- the dashboard page as served (src/serve/dashboard.c over the compiled-in
 * src/serve/dashboard.html): every nonce placeholder replaced, the one inline style and script
 * carrying the nonce, no URL to another host anywhere in the page, no external source (src=, url(),
 * @import, a link other than the empty data: favicon), and a CSP header that names the nonce and
 * allows no external or unsafe-inline source. The HTTP side (status, content type, headers on the
 * wire) and the page's behaviour in a browser are tests/router/test_dashboard.py. */
#include "serve/dashboard.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include <cmocka.h>

#include "tests/test_util.h"

#define NONCE_A "0123456789abcdef0123456789abcdef"
#define NONCE_B "fedcba9876543210fedcba9876543210"

static size_t count(const char *hay, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + strlen(needle), needle))
    n++;
  return n;
}

/* Case-insensitive count, for markup and URL schemes. */
static size_t icount(const char *hay, const char *needle) {
  size_t n = 0, len = strlen(needle);
  for (const char *p = hay; *p; p++)
    n += strncasecmp(p, needle, len) == 0;
  return n;
}

static void render(const char *nonce, kvr_buf_t *body, kvr_buf_t *headers) {
  kvr_buf_init(body);
  kvr_buf_init(headers);
  kvr_dashboard_render(nonce, body, headers);
  assert_true(body->len > 1000);
  assert_int_equal(strlen(body->data), body->len); /* text, no NUL inside */
}

static void test_nonce_on_inline_code_only(void **state) {
  kvr_buf_t b, h;
  render(NONCE_A, &b, &h);
  assert_int_equal(count(b.data, KVR_DASHBOARD_NONCE_MARK), 0);
  assert_int_equal(icount(b.data, "<script"), 1);
  assert_int_equal(icount(b.data, "<style"), 1);
  assert_int_equal(count(b.data, "<script nonce=\"" NONCE_A "\">"), 1);
  assert_int_equal(count(b.data, "<style nonce=\"" NONCE_A "\">"), 1);
  assert_int_equal(count(b.data, NONCE_A), 2);
  kvr_buf_free(&b);
  kvr_buf_free(&h);
}

static void test_no_external_source(void **state) {
  kvr_buf_t b, h;
  render(NONCE_A, &b, &h);
  assert_int_equal(icount(b.data, "http://"), 0);
  assert_int_equal(icount(b.data, "https://"), 0);
  assert_int_equal(icount(b.data, "//"), count(b.data, "// ")); /* only JS comments, no //host */
  assert_int_equal(icount(b.data, " src="), 0);
  assert_int_equal(icount(b.data, "url("), 0);
  assert_int_equal(icount(b.data, "@import"), 0);
  assert_int_equal(icount(b.data, "@font-face"), 0);
  assert_int_equal(icount(b.data, "<link"), 1);
  assert_int_equal(count(b.data, "<link rel=\"icon\" href=\"data:,\">"), 1);
  assert_int_equal(icount(b.data, "href="), 1);
  /* it talks to its own admin API only, by absolute path */
  assert_true(count(b.data, "fetch(\"/admin/") + count(b.data, "getJSON(\"/admin/") >= 3);
  kvr_buf_free(&b);
  kvr_buf_free(&h);
}

static void test_csp_header(void **state) {
  kvr_buf_t b, h;
  render(NONCE_A, &b, &h);
  const char *csp = strstr(h.data, "Content-Security-Policy: ");
  assert_non_null(csp);
  const char *eol = strstr(csp, "\r\n");
  assert_non_null(eol);
  char line[512];
  assert_true((size_t)(eol - csp) < sizeof line);
  memcpy(line, csp, (size_t)(eol - csp));
  line[eol - csp] = '\0';
  assert_non_null(strstr(line, "default-src 'none';"));
  assert_non_null(strstr(line, "script-src 'nonce-" NONCE_A "';"));
  assert_non_null(strstr(line, "style-src 'nonce-" NONCE_A "';"));
  assert_non_null(strstr(line, "connect-src 'self';"));
  assert_non_null(strstr(line, "frame-ancestors 'none'"));
  assert_null(strstr(line, "unsafe"));
  assert_null(strstr(line, "http"));
  assert_null(strstr(line, "*"));
  assert_non_null(strstr(line, "img-src data:;")); /* the empty favicon, nothing else */
  assert_non_null(strstr(h.data, "Cache-Control: no-store\r\n"));
  assert_non_null(strstr(h.data, "X-Content-Type-Options: nosniff\r\n"));
  /* header lines only: each ends in CRLF, no blank line that would end the head early */
  assert_int_equal(h.data[h.len - 2], '\r');
  assert_int_equal(h.data[h.len - 1], '\n');
  assert_null(strstr(h.data, "\r\n\r\n"));
  kvr_buf_free(&b);
  kvr_buf_free(&h);
}

/* Two renders differ in their nonces only. */
static void test_nonce_is_the_only_difference(void **state) {
  kvr_buf_t a, ha, b, hb;
  render(NONCE_A, &a, &ha);
  render(NONCE_B, &b, &hb);
  assert_int_equal(a.len, b.len);
  assert_int_equal(ha.len, hb.len);
  size_t diff = 0;
  for (size_t i = 0; i < a.len; i++)
    diff += a.data[i] != b.data[i];
  assert_true(diff > 0 && diff <= 2 * strlen(NONCE_A));
  assert_null(strstr(b.data, NONCE_A));
  assert_null(strstr(hb.data, NONCE_A));
  kvr_buf_free(&a);
  kvr_buf_free(&ha);
  kvr_buf_free(&b);
  kvr_buf_free(&hb);
}

KVR_TEST_MAIN(cmocka_unit_test(test_nonce_on_inline_code_only),
              cmocka_unit_test(test_no_external_source), cmocka_unit_test(test_csp_header),
              cmocka_unit_test(test_nonce_is_the_only_difference))

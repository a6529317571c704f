/* test_http_headers.c -- the proxy's header rules (src/proto/http_headers.c), one case per rule.
 *
 * Request side: the exact lines kvr_http_headers_upstream() hands over for a request that carries
 * every kind of header the proxy must drop or rewrite (hop-by-hop, the names listed in Connection,
 * Host, Content-Length, Expect, Accept-Encoding, X-Forwarded-For, empty values, CR/LF), with names
 * in mixed case and Connection token lists separated by commas, spaces and tabs.
 * Response side: kvr_http_headers_response_field() on each kind of field (trimming, the dropped
 * names, Content-Length and HEAD, Connection's names, text/event-stream detection, malformed
 * lines) and kvr_http_headers_drop_named() on a complete head, including a Connection field that
 * comes after the headers it names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "proto/http_headers.h"

#include <stdio.h>
#include <string.h>

/* ---- request side -----------------------------------------------------------------------------
 */

static void test_hop_by_hop(void **state) {
  (void)state;
  static const char *const hop[] = {"Connection",
                                    "keep-alive",
                                    "TE",
                                    "Trailer",
                                    "trailers",
                                    "Transfer-Encoding",
                                    "UPGRADE",
                                    "Proxy-Connection",
                                    "proxy-authenticate",
                                    "Proxy-Authorization",
                                    "Proxy-Anything-Else",
                                    "PROXY-"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(hop); i++)
    assert_true(kvr_http_headers_hop_by_hop(hop[i]));
  static const char *const end_to_end[] = {"Content-Type", "Authorization", "Host",
                                           "X-Proxy",      "Keep-Alives",   "TEX",
                                           "Trailer-X",    "Proxy",         ""};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(end_to_end); i++)
    assert_false(kvr_http_headers_hop_by_hop(end_to_end[i]));
}

static void test_has_ctl(void **state) {
  (void)state;
  assert_false(kvr_http_headers_has_ctl(""));
  assert_false(kvr_http_headers_has_ctl("a b\tc"));
  assert_true(kvr_http_headers_has_ctl("a\rb"));
  assert_true(kvr_http_headers_has_ctl("a\n"));
  assert_true(kvr_http_headers_has_ctl("\r\n"));
}

#define H(n, v)                                                                                    \
  { (char *)(n), (char *)(v) }

static void test_connection_names(void **state) {
  (void)state;
  kvr_http_header_t h[] = {
      H("Content-Type", "application/json"),
      H("CONNECTION", "keep-alive,X-One , x-two\tX-Three,,  ,x-four"),
      H("connection", "Upgrade"),
  };
  size_t n = KVR_ARRAY_SIZE(h);
  static const char *const named[] = {"keep-alive", "x-one",  "X-ONE",  "X-Two",
                                      "x-three",    "X-Four", "upgrade"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(named); i++)
    assert_true(kvr_http_headers_connection_names(h, n, named[i]));
  static const char *const not_named[] = {"x-on", "x-one2", "content-type", "connection", ""};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(not_named); i++)
    assert_false(kvr_http_headers_connection_names(h, n, not_named[i]));
  /* No Connection header at all, and an empty one. */
  assert_false(kvr_http_headers_connection_names(h, 1, "content-type"));
  kvr_http_header_t empty[] = {H("Connection", "")};
  assert_false(kvr_http_headers_connection_names(empty, 1, "x"));
}

static void collect(void *data, const char *line) {
  kvr_buf_t *b = data;
  kvr_buf_puts(b, line);
  kvr_buf_puts(b, "|");
}

static char *upstream(const kvr_http_header_t *h, size_t n, const char *peer, kvr_buf_t *out) {
  kvr_buf_reset(out);
  kvr_http_headers_upstream(h, n, peer, collect, out);
  return out->data;
}

static void test_upstream_every_rule(void **state) {
  (void)state;
  kvr_http_header_t h[] = {
      H("Host", "router:8000"),
      H("User-Agent", "curl/8"),
      H("content-length", "12"),
      H("Expect", "100-continue"),
      H("Accept-Encoding", "gzip, br"),
      H("Connection", "keep-alive, X-Hop-Secret  x-hop-other"),
      H("X-HOP-SECRET", "s"),
      H("x-hop-other", "o"),
      H("Keep-Alive", "timeout=5"),
      H("te", "trailers"),
      H("Trailer", "X-Checksum"),
      H("Transfer-Encoding", "chunked"),
      H("Upgrade", "websocket"),
      H("Proxy-Authorization", "Basic eA=="),
      H("Proxy-Whatever", "1"),
      H("Authorization", "Bearer k"),
      H("Content-Type", "application/json"),
      H("X-Empty", ""),
      H("X-Bad", "a\r\nInjected: 1"),
      H("X-Bad\n", "v"),
      H("X-Forwarded-For", "10.0.0.1"),
      H("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
      H("ACCEPT", "text/event-stream"),
  };
  kvr_buf_t out = KVR_BUF_INIT;
  assert_string_equal(upstream(h, KVR_ARRAY_SIZE(h), "127.0.0.1", &out),
                      "User-Agent: curl/8|Authorization: Bearer k|Content-Type: application/json|"
                      "X-Empty;|ACCEPT: text/event-stream|"
                      "X-Forwarded-For: 10.0.0.2, 10.0.0.3, 127.0.0.1|");
  kvr_buf_free(&out);
}

static void test_upstream_forwarded_for(void **state) {
  (void)state;
  kvr_buf_t out = KVR_BUF_INIT;
  /* No headers at all: only X-Forwarded-For, from the peer (even an unknown, empty one). */
  assert_string_equal(upstream(NULL, 0, "::1", &out), "X-Forwarded-For: ::1|");
  assert_string_equal(upstream(NULL, 0, "", &out), "X-Forwarded-For: |");
  /* A client value with CR or LF is not extended: the peer replaces it. */
  kvr_http_header_t bad[] = {H("X-Forwarded-For", "1.1.1.1\r\nX: y")};
  assert_string_equal(upstream(bad, 1, "127.0.0.1", &out), "X-Forwarded-For: 127.0.0.1|");
  /* X-Forwarded-For named by Connection is hop-by-hop: dropped, and not extended. */
  kvr_http_header_t named[] = {H("Connection", "x-forwarded-for"), H("X-Forwarded-For", "1.1.1.1")};
  assert_string_equal(upstream(named, 2, "127.0.0.1", &out), "X-Forwarded-For: 127.0.0.1|");
  /* Case of the name does not matter; the value is kept verbatim. */
  kvr_http_header_t mixed[] = {H("X-FORWARDED-FOR", "203.0.113.7")};
  assert_string_equal(upstream(mixed, 1, "127.0.0.1", &out),
                      "X-Forwarded-For: 203.0.113.7, 127.0.0.1|");
  kvr_buf_free(&out);
}

/* ---- response side ----------------------------------------------------------------------------
 */

typedef struct {
  kvr_buf_t kept, tokens;
} head_t;

static bool field(head_t *h, const char *line, bool head_req) {
  return kvr_http_headers_response_field(&h->kept, &h->tokens, line, strlen(line), head_req);
}

static void head_free(head_t *h) {
  kvr_buf_free(&h->kept);
  kvr_buf_free(&h->tokens);
}

#define KEPT(h) ((h)->kept.data ? (h)->kept.data : "")
#define TOKENS(h) ((h)->tokens.data ? (h)->tokens.data : "")

static void test_response_field_rules(void **state) {
  (void)state;
  head_t h = {KVR_BUF_INIT, KVR_BUF_INIT};
  /* Kept, value trimmed: leading spaces and tabs, trailing CR, LF and spaces (not tabs). */
  assert_false(field(&h, "Content-Type: application/json\r\n", false));
  assert_false(field(&h, "X-Request-Id: \t abc  \r\n", false));
  assert_false(field(&h, "x-tab:v\t\r\n", false));
  assert_false(field(&h, "X-Empty:\r\n", false));
  assert_false(field(&h, "X-No-Crlf: 1", false));
  /* Dropped: hop-by-hop, Date, X-Kvrouter-Worker, Content-Length (not HEAD). */
  static const char *const dropped[] = {
      "Connection: close\r\n",
      "Keep-Alive: timeout=5\r\n",
      "TE: trailers\r\n",
      "Trailer: X-Sum\r\n",
      "Transfer-Encoding: chunked\r\n",
      "Upgrade: h2c\r\n",
      "Proxy-Authenticate: Basic\r\n",
      "proxy-x: 1\r\n",
      "DATE: Mon, 1 Jan 2024\r\n",
      "X-KVROUTER-WORKER: w9\r\n",
      "content-length: 42\r\n",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(dropped); i++)
    assert_false(field(&h, dropped[i], false));
  assert_string_equal(KEPT(&h), "Content-Type: application/json\r\nX-Request-Id: abc\r\n"
                                "x-tab: v\t\r\nX-Empty: \r\nX-No-Crlf: 1\r\n");
  /* Malformed lines are ignored: no colon, empty name, a name of 128 bytes or more. */
  kvr_buf_reset(&h.kept);
  assert_false(field(&h, "no colon here\r\n", false));
  assert_false(field(&h, ": no name\r\n", false));
  char line[200];
  snprintf(line, sizeof line, "%0128d: v\r\n", 0);
  assert_false(field(&h, line, false));
  assert_false(field(&h, "", false));
  assert_int_equal(h.kept.len, 0);
  snprintf(line, sizeof line, "%0127d: v\r\n", 0);
  field(&h, line, false);
  assert_int_equal(h.kept.len, 127 + 5);
  head_free(&h);
}

static void test_response_content_length_head(void **state) {
  (void)state;
  head_t h = {KVR_BUF_INIT, KVR_BUF_INIT};
  field(&h, "Content-Length: 42\r\n", true);
  assert_string_equal(KEPT(&h), "Content-Length: 42\r\n");
  kvr_buf_reset(&h.kept);
  field(&h, "Content-Length: 42\r\n", false);
  assert_string_equal(KEPT(&h), "");
  head_free(&h);
}

static void test_response_event_stream(void **state) {
  (void)state;
  head_t h = {KVR_BUF_INIT, KVR_BUF_INIT};
  assert_true(field(&h, "Content-Type: text/event-stream\r\n", false));
  assert_true(field(&h, "content-type:text/event-stream; charset=utf-8\r\n", false));
  assert_true(field(&h, "CONTENT-TYPE:   TEXT/EVENT-STREAM\r\n", false));
  assert_false(field(&h, "Content-Type: text/event-strea\r\n", false));
  assert_false(field(&h, "Content-Type: application/json\r\n", false));
  assert_false(field(&h, "X-Type: text/event-stream\r\n", false));
  /* The field itself is passed on. */
  assert_non_null(strstr(KEPT(&h), "CONTENT-TYPE: TEXT/EVENT-STREAM\r\n"));
  head_free(&h);
}

static void test_response_connection_tokens(void **state) {
  (void)state;
  head_t h = {KVR_BUF_INIT, KVR_BUF_INIT};
  field(&h, "Connection: Keep-Alive, X-Foo ,x-BAR\r\n", false);
  assert_string_equal(TOKENS(&h), ",keep-alive,x-foo,x-bar,");
  /* A second Connection field appends; tabs and spaces inside are removed. */
  field(&h, "connection:\tX-Baz\t, Close\r\n", false);
  assert_string_equal(TOKENS(&h), ",keep-alive,x-foo,x-bar,x-baz,close,");
  assert_string_equal(KEPT(&h), "");
  head_free(&h);
}

static void test_drop_named(void **state) {
  (void)state;
  head_t h = {KVR_BUF_INIT, KVR_BUF_INIT};
  /* Named headers come before and after the Connection field that names them. */
  field(&h, "X-Foo: 1\r\n", false);
  field(&h, "Content-Type: application/json\r\n", false);
  field(&h, "x-foo: 2\r\n", false);
  field(&h, "Connection: close, X-FOO,x-bar\r\n", false);
  field(&h, "X-Bar: 3\r\n", false);
  field(&h, "X-Foobar: 4\r\n", false);
  field(&h, "X-Fo: 5\r\n", false);
  kvr_http_headers_drop_named(&h.kept, &h.tokens);
  assert_string_equal(KEPT(&h), "Content-Type: application/json\r\nX-Foobar: 4\r\nX-Fo: 5\r\n");
  head_free(&h);

  /* Without a Connection field nothing is dropped; an empty block stays empty. */
  head_t e = {KVR_BUF_INIT, KVR_BUF_INIT};
  field(&e, "X-Foo: 1\r\n", false);
  kvr_http_headers_drop_named(&e.kept, &e.tokens);
  assert_string_equal(KEPT(&e), "X-Foo: 1\r\n");
  kvr_buf_reset(&e.kept);
  field(&e, "Connection: x-foo\r\n", false);
  kvr_http_headers_drop_named(&e.kept, &e.tokens);
  assert_int_equal(e.kept.len, 0);
  head_free(&e);

  /* A block built by hand: a last line without LF is handled; names of 120 bytes or more are
   * never dropped. */
  kvr_buf_t kept = KVR_BUF_INIT, tokens = KVR_BUF_INIT;
  char longname[121];
  memset(longname, 'a', 120);
  longname[120] = '\0';
  kvr_buf_printf(&kept, "A: 1\r\n%s: 2\r\nB: 3", longname);
  kvr_buf_printf(&tokens, ",a,b,%s,", longname);
  kvr_http_headers_drop_named(&kept, &tokens);
  assert_int_equal(kept.len, 120 + 5);
  assert_memory_equal(kept.data, longname, 120);
  kvr_buf_free(&kept);
  kvr_buf_free(&tokens);
}

/* The worker's status line (issue 37): HTTP/1.x or HTTP/2 as libcurl writes it, 3 digits, an
 * optional reason without control bytes; 101 and codes outside 100..599 refused. */
static void test_resp_status(void **state) {
  (void)state;
  static const struct {
    const char *line;
    kvr_http_resp_err_t want;
    int status;
  } rows[] = {
      {"HTTP/1.1 200 OK\r\n", KVR_HTTP_RESP_OK, 200},
      {"HTTP/1.0 404 Not Found\n", KVR_HTTP_RESP_OK, 404},
      {"HTTP/2 200 \r\n", KVR_HTTP_RESP_OK, 200},
      {"HTTP/1.1 204\r\n", KVR_HTTP_RESP_OK, 204},
      {"HTTP/1.1 100 Continue\r\n", KVR_HTTP_RESP_OK, 100},
      {"HTTP/1.1 103 Early Hints\r\n", KVR_HTTP_RESP_OK, 103},
      {"HTTP/1.1 101 Switching Protocols\r\n", KVR_HTTP_RESP_SWITCHING, 101},
      {"HTTP/1.1 099 Low\r\n", KVR_HTTP_RESP_STATUS_CODE, 99},
      {"HTTP/1.1 600 High\r\n", KVR_HTTP_RESP_STATUS_CODE, 600},
      {"HTTP/1.1 999 x\r\n", KVR_HTTP_RESP_STATUS_CODE, 999},
      {"HTTP/1.1 abc OK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
      {"HTTP/1.1 20 OK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
      {"HTTP/1.1 2000 OK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
      {"HTTP/1.1 200 O\rK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
      {"HTTP/1.1  200 OK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
      {"ICY 200 OK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
      {"HTTP/x 200 OK\r\n", KVR_HTTP_RESP_STATUS_LINE, 0},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(rows); i++) {
    kvr_http_resp_check_t st;
    kvr_http_resp_err_t e = kvr_http_resp_status(&st, rows[i].line, strlen(rows[i].line));
    if (e != rows[i].want || (rows[i].status && st.status != rows[i].status))
      fail_msg("'%s': %s (%d), want %s", rows[i].line, kvr_http_resp_err_name(e), st.status,
               kvr_http_resp_err_name(rows[i].want));
  }
}

/* Field lines: token names, no control byte but HTAB in values (a bare CR is how a header was
 * smuggled past the filter), no obs-fold, one consistent Content-Length, TE with CL at the end. */
static void test_resp_fields(void **state) {
  (void)state;
  static const struct {
    const char *line;
    kvr_http_resp_err_t want;
  } rows[] = {
      {"Content-Type: application/json\r\n", KVR_HTTP_RESP_OK},
      {"X-Tab:\tvalue\twith tabs\r\n", KVR_HTTP_RESP_OK},
      {"X-Obs: caf\xc3\xa9\r\n", KVR_HTTP_RESP_OK},
      {"X-Empty:\r\n", KVR_HTTP_RESP_OK},
      {"X-A: a\rTransfer-Encoding: chunked\r\n", KVR_HTTP_RESP_HEADER_VALUE},
      {"X-A: a\rSet-Cookie: evil=1\n", KVR_HTTP_RESP_HEADER_VALUE},
      {"X-A: a\r\r\n", KVR_HTTP_RESP_HEADER_VALUE},
      {"X-A: a\x01b\r\n", KVR_HTTP_RESP_HEADER_VALUE},
      {"X-A: a\x7f\r\n", KVR_HTTP_RESP_HEADER_VALUE},
      {" folded continuation\r\n", KVR_HTTP_RESP_OBS_FOLD},
      {"\tfolded\r\n", KVR_HTTP_RESP_OBS_FOLD},
      {"Bad Name: x\r\n", KVR_HTTP_RESP_HEADER_NAME},
      {"X(y): z\r\n", KVR_HTTP_RESP_HEADER_NAME},
      {": x\r\n", KVR_HTTP_RESP_HEADER_NAME},
      {"NoColon\r\n", KVR_HTTP_RESP_HEADER_NAME},
      {"X-A : x\r\n", KVR_HTTP_RESP_HEADER_NAME},
      {"Content-Length: 12x\r\n", KVR_HTTP_RESP_CONTENT_LENGTH},
      {"Content-Length: -1\r\n", KVR_HTTP_RESP_CONTENT_LENGTH},
      {"Content-Length: \r\n", KVR_HTTP_RESP_CONTENT_LENGTH},
      {"Content-Length: 99999999999999999999999\r\n", KVR_HTTP_RESP_CONTENT_LENGTH},
      {"Content-Length: 5, 6\r\n", KVR_HTTP_RESP_CONTENT_LENGTH},
      {"Content-Length: 5, 5\r\n", KVR_HTTP_RESP_OK},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(rows); i++) {
    kvr_http_resp_check_t st = {0};
    kvr_http_resp_err_t e = kvr_http_resp_field(&st, rows[i].line, strlen(rows[i].line));
    if (e != rows[i].want)
      fail_msg("'%s': %s, want %s", rows[i].line, kvr_http_resp_err_name(e),
               kvr_http_resp_err_name(rows[i].want));
  }
  /* Two Content-Length fields: equal is one length, different is a conflict (RFC 9112 6.3). */
  kvr_http_resp_check_t st;
  assert_int_equal(kvr_http_resp_status(&st, "HTTP/1.1 200 OK\r\n", 17), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "Content-Length: 5\r\n", 19), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "content-length: 5\r\n", 19), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "Content-Length: 7\r\n", 19),
                   KVR_HTTP_RESP_CONTENT_LENGTH);
  assert_int_equal(kvr_http_resp_end(&st), KVR_HTTP_RESP_OK);
  /* Transfer-Encoding with Content-Length, in either order: refused when the head ends. */
  assert_int_equal(kvr_http_resp_status(&st, "HTTP/1.1 200 OK\r\n", 17), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "Transfer-Encoding: chunked\r\n", 28),
                   KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_end(&st), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "Content-Length: 3\r\n", 19), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_end(&st), KVR_HTTP_RESP_TE_AND_CL);
  /* A new status line forgets the previous head (after an interim 1xx). */
  assert_int_equal(kvr_http_resp_status(&st, "HTTP/1.1 200 OK\r\n", 17), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_end(&st), KVR_HTTP_RESP_OK);
  /* An empty Content-Length after a valid one is still refused (found by fuzz_http_response). */
  assert_int_equal(kvr_http_resp_status(&st, "HTTP/1.1 200 OK\r\n", 17), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "Content-Length: 2, 2\r\n", 22), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "Content-Length: \r\n", 18),
                   KVR_HTTP_RESP_CONTENT_LENGTH);
  assert_int_equal(kvr_http_resp_field(&st, "Content-Length: ,\r\n", 19),
                   KVR_HTTP_RESP_CONTENT_LENGTH);
  /* The head's size is bounded: KVR_HTTP_RESP_FIELDS_MAX fields pass, one more does not. */
  assert_int_equal(kvr_http_resp_status(&st, "HTTP/1.1 200 OK\r\n", 17), KVR_HTTP_RESP_OK);
  for (unsigned i = 0; i < KVR_HTTP_RESP_FIELDS_MAX; i++)
    assert_int_equal(kvr_http_resp_field(&st, "X-A: 1\r\n", 8), KVR_HTTP_RESP_OK);
  assert_int_equal(kvr_http_resp_field(&st, "X-A: 1\r\n", 8), KVR_HTTP_RESP_HEAD_SIZE);
  char big[1024];
  memset(big, 'v', sizeof big);
  memcpy(big, "X-B: ", 5);
  assert_int_equal(kvr_http_resp_status(&st, "HTTP/1.1 200 OK\r\n", 17), KVR_HTTP_RESP_OK);
  kvr_http_resp_err_t e = KVR_HTTP_RESP_OK;
  unsigned n = 0;
  while (e == KVR_HTTP_RESP_OK && n < 100)
    e = kvr_http_resp_field(&st, big, sizeof big), n++;
  assert_int_equal(e, KVR_HTTP_RESP_HEAD_SIZE);
  assert_int_equal(n, KVR_HTTP_RESP_HEAD_MAX / sizeof big); /* 64 fields of 1 KiB + the status */
  assert_string_equal(kvr_http_resp_err_name(KVR_HTTP_RESP_TE_AND_CL), "te_and_cl");
  assert_string_equal(kvr_http_resp_err_name(KVR_HTTP_RESP_ERR_COUNT), "unknown");
}

KVR_TEST_MAIN(cmocka_unit_test(test_hop_by_hop), cmocka_unit_test(test_has_ctl),
              cmocka_unit_test(test_connection_names), cmocka_unit_test(test_upstream_every_rule),
              cmocka_unit_test(test_upstream_forwarded_for),
              cmocka_unit_test(test_response_field_rules),
              cmocka_unit_test(test_response_content_length_head),
              cmocka_unit_test(test_response_event_stream),
              cmocka_unit_test(test_response_connection_tokens), cmocka_unit_test(test_drop_named),
              cmocka_unit_test(test_resp_status), cmocka_unit_test(test_resp_fields))

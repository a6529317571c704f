/* test_http_parse.c -- the socket-free request parser (src/proto/http_parse.c) and its strictness
 * rules.
 *
 * One table of raw requests, each with the verdict it must get: accepted (how many requests, and
 * what each looked like) or rejected (status and error code). Every entry is fed whole, one byte at
 * a time, and in two pieces cut at every position, the way a client's TCP segments may arrive;
 * all ways must give the same verdict, and none may leave the parser waiting in the middle of a
 * request (a client left hanging). The pure rules (Host value grammar, Transfer-Encoding list) get
 * tables of their own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "proto/http_parse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a parser made of some bytes. */
typedef struct {
  int status; /* 0 when every request was accepted */
  char code[64];
  int nreq;           /* requests completed (before any rejection) */
  bool waiting;       /* all bytes fed, and the parser is in the middle of a request */
  char summary[1024]; /* "METHOD target HTTP/x.y headers=N body=..." per request */
} outcome_t;

static void outcome_add(outcome_t *o, const kvr_http_req_t *req) {
  size_t n = strlen(o->summary);
  snprintf(o->summary + n, sizeof o->summary - n, "%s %s HTTP/%d.%d headers=%zu body=%.*s|",
           req->method_str, req->target, req->http_major, req->http_minor, req->nheaders,
           (int)req->body.len, req->body.data ? req->body.data : "");
  o->nreq++;
}

/* Feeds data[0..len) in pieces ending at cuts[0..ncuts) and at len, handling events as the
 * listener does: HEAD -> feed again (even with no bytes), DONE -> take, REJECT -> stop. */
static outcome_t run_cuts(const char *data, size_t len, const size_t *cuts, size_t ncuts,
                          const kvr_http_limits_t *lim) {
  kvr_http_parse_t *p = kvr_http_parse_new(lim);
  kvr_buf_t in = KVR_BUF_INIT;
  outcome_t o = {0};
  size_t from = 0;
  for (size_t i = 0; i <= ncuts && o.status == 0; i++) {
    size_t to = i < ncuts ? cuts[i] : len;
    kvr_buf_append(&in, data + from, to - from);
    from = to;
    bool again = false;
    while ((in.len || again) && o.status == 0) {
      size_t used;
      kvr_http_parse_event_t ev = kvr_http_parse_feed(p, in.data, in.len, &used);
      assert_true(used <= in.len);
      kvr_buf_consume(&in, used);
      again = ev == KVR_HTTP_PARSE_HEAD;
      if (ev == KVR_HTTP_PARSE_DONE) {
        kvr_http_req_t *req = kvr_http_parse_take(p);
        assert_non_null(req);
        outcome_add(&o, req);
        kvr_http_parse_req_free(req);
      } else if (ev == KVR_HTTP_PARSE_REJECT) {
        const kvr_http_rejection_t *r = kvr_http_parse_rejection(p);
        assert_non_null(r);
        o.status = r->status;
        snprintf(o.code, sizeof o.code, "%s", r->code);
        assert_true(r->message && r->message[0]);
      } else if (ev == KVR_HTTP_PARSE_MORE) {
        assert_int_equal(in.len, 0);
      }
    }
  }
  o.waiting = o.status == 0 && kvr_http_parse_phase(p) != KVR_HTTP_PHASE_IDLE;
  kvr_buf_free(&in);
  kvr_http_parse_free(p);
  return o;
}

static outcome_t run_whole(const char *data, size_t len, const kvr_http_limits_t *lim) {
  return run_cuts(data, len, NULL, 0, lim);
}

typedef struct {
  const char *req;
  int status;       /* 0: accepted */
  const char *code; /* for rejections */
  int nreq;         /* requests accepted (before a rejection, if any) */
} case_t;

#define H11 " HTTP/1.1\r\nHost: a\r\n"
static const case_t cases[] = {
    /* accepted */
    {"GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nX-A:  v  \r\n\r\n", 0, NULL, 1},
    {"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 5\r\n\r\nhello", 0,
     NULL, 1},
    {"POST /c HTTP/1.1\r\nHost: [::1]:80\r\nTransfer-Encoding: chunked\r\n\r\n"
     "3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n",
     0, NULL, 1},
    {"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked \r\n\r\n1\r\nz\r\n0\r\n\r\n", 0,
     NULL, 1},
    {"GET /1" H11 "\r\nGET /2" H11 "\r\nPOST /3" H11 "Content-Length: 2\r\n\r\nok", 0, NULL, 3},
    {"GET /old HTTP/1.0\r\n\r\n", 0, NULL, 1},
    {"GET / HTTP/1.1\r\nHost:\r\n\r\n", 0, NULL, 1}, /* RFC 9112 3.2: empty when no authority */
    {"GET / HTTP/1.1\r\nHost: [v1.fe80::a+en1]:8080\r\n\r\n", 0, NULL, 1},
    {"GET / HTTP/1.1\r\nHost: xn--bcher-kva.example%2D:\r\n\r\n", 0, NULL, 1},
    /* Host (RFC 9112 3.2) */
    {"GET / HTTP/1.1\r\n\r\n", 400, "missing_host", 0},
    /* A repeated singleton the router reads (issue 37): refused, not guessed. */
    {"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\r\nauthorization: Bearer y\r\n\r\n", 400,
     "duplicate_header", 0},
    {"POST / HTTP/1.1\r\nHost: a\r\nContent-Type: a/b\r\nContent-Type: c/d\r\n"
     "Content-Length: 0\r\n\r\n",
     400, "duplicate_header", 0},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-Request-Id: 1\r\nX-Request-ID: 2\r\n\r\n", 400,
     "duplicate_header", 0},
    {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: a\r\nHOST: b\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", 400, "invalid_host", 0},
    {"GET / HTTP/1.1\r\nHost: caf\xc3\xa9\r\n\r\n", 400, "invalid_host", 0},
    {"GET /ok" H11 "\r\nGET /no HTTP/1.1\r\n\r\n", 400, "missing_host", 1},
    /* Transfer-Encoding (RFC 9112 6.1, 6.3, 7) */
    {"POST /" H11 "Transfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: x-foo\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: gzip\r\n\r\n", 400, "invalid_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: chunked, gzip\r\n\r\n", 400, "invalid_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: chunked, \r\n\r\n0\r\n\r\n", 400, "invalid_transfer_encoding",
     0},
    {"POST /" H11 "Transfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n", 400, "invalid_transfer_encoding",
     0},
    {"POST /" H11 "Transfer-Encoding: gzip,,chunked\r\n\r\n0\r\n\r\n", 400,
     "invalid_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
     "invalid_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: chunked;q=1\r\n\r\n0\r\n\r\n", 400,
     "invalid_transfer_encoding", 0},
    {"POST /" H11 "Transfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n0\r\n\r\n", 400, NULL, 0},
    {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
     "invalid_transfer_encoding", 0},
    /* versions (RFC 9110 15.6.6) and the request line */
    {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505, "http_version_not_supported", 0},
    {"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505, "http_version_not_supported", 0},
    {"GET / HTTP/0.9\r\n\r\n", 505, "http_version_not_supported", 0},
    {"GET / HTTP/3.0\r\n\r\n", 505, "http_version_not_supported", 0},
    {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "http_version_not_supported", 0},
    {"GET /\r\n", 400, "missing_http_version", 0},
    {"GET /\n", 400, "missing_http_version", 0},
    {"GET /\r\n\r\n", 400, "missing_http_version", 0},
    {"GET / HTTP/1.a\r\n\r\n", 400, "bad_request", 0},
    {"GET / HTTP/11.1\r\n\r\n", 400, "bad_request", 0},
    {"GET / FTP/1.1\r\n\r\n", 400, "bad_request", 0},
    {"GARBAGE\r\n\r\n", 400, "bad_request", 0},
    /* request target: visible ASCII only */
    {"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "invalid_request_target", 0},
    {"GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400, "invalid_request_target", 0},
    {"GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n", 400, NULL, 0},
    /* obs-fold (RFC 9112 5.2) in headers and trailers */
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n", 400, "obsolete_line_folding", 0},
    {"GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n\t two\r\n\r\n", 400, "obsolete_line_folding", 0},
    {"POST /" H11 "Transfer-Encoding: chunked\r\n\r\n0\r\nX-T: a\r\n b\r\n\r\n", 400,
     "obsolete_line_folding", 0},
    /* chunk sizes: answered when the size line ends, not when the body would */
    {"POST /" H11 "Transfer-Encoding: chunked\r\n\r\n100000000\r\n", 400, "invalid_chunk_size", 0},
    {"POST /" H11 "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n", 400,
     "invalid_chunk_size", 0},
    {"POST /" H11 "Transfer-Encoding: chunked\r\n\r\n800001\r\n", 413, "body_too_large", 0},
    {"POST /" H11 "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "invalid_chunk_size", 0},
    /* the limits and refusals kept from before */
    {"POST /" H11 "Content-Length: 9000000000\r\n\r\n", 413, "body_too_large", 0},
    {"POST /" H11 "Content-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400, NULL, 0},
    {"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 405, "method_not_allowed", 0},
    {"GET /" H11 "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 501, "upgrade_not_supported",
     0},
    {"GET /" H11 "Bad Name: v\r\n\r\n", 400, NULL, 0},
};

static void check_outcome(const case_t *c, const outcome_t *o, const char *how) {
  if (o->status != c->status || o->nreq != c->nreq || o->waiting ||
      (c->code && strcmp(o->code, c->code) != 0))
    fail_msg("%s: %s\n  want status %d code %s nreq %d; got %d %s nreq %d waiting %d", how, c->req,
             c->status, c->code ? c->code : "-", c->nreq, o->status, o->code, o->nreq, o->waiting);
}

static void test_table_whole(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    outcome_t o = run_whole(cases[i].req, strlen(cases[i].req), NULL);
    check_outcome(&cases[i], &o, "whole");
  }
}

/* The same verdict byte by byte and for every cut into two pieces. */
static void test_table_every_split(void **state) {
  (void)state;
  size_t *cuts = malloc(4096 * sizeof *cuts);
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const char *r = cases[i].req;
    size_t len = strlen(r);
    assert_true(len < 4096);
    outcome_t whole = run_whole(r, len, NULL);
    for (size_t k = 1; k < len; k++)
      cuts[k - 1] = k;
    outcome_t bytes = run_cuts(r, len, cuts, len ? len - 1 : 0, NULL);
    check_outcome(&cases[i], &bytes, "byte by byte");
    assert_string_equal(bytes.summary, whole.summary);
    for (size_t k = 1; k < len; k++) {
      outcome_t two = run_cuts(r, len, &k, 1, NULL);
      check_outcome(&cases[i], &two, "two pieces");
      assert_string_equal(two.summary, whole.summary);
    }
  }
  free(cuts);
}

/* What an accepted request looks like: trimmed values, trailers dropped, body reassembled. */
static void test_accepted_request_fields(void **state) {
  (void)state;
  static const char r[] = "POST /c?x=1 HTTP/1.1\r\nHost: a\r\nX-A:  v w \t\r\n"
                          "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n"
                          "X-Trailer: t\r\n\r\n";
  kvr_http_parse_t *p = kvr_http_parse_new(NULL);
  size_t used, off = 0;
  assert_int_equal(kvr_http_parse_phase(p), KVR_HTTP_PHASE_IDLE);
  assert_int_equal(kvr_http_parse_feed(p, r, sizeof r - 1, &used), KVR_HTTP_PARSE_HEAD);
  off += used;
  assert_int_equal(kvr_http_parse_phase(p), KVR_HTTP_PHASE_BODY);
  assert_memory_equal(r + off - 4, "\r\n\r\n", 4); /* stopped at the end of the head */
  assert_null(kvr_http_parse_take(p));             /* not complete yet */
  assert_int_equal(kvr_http_parse_feed(p, r + off, sizeof r - 1 - off, &used), KVR_HTTP_PARSE_DONE);
  off += used;
  assert_int_equal(off, sizeof r - 1);
  kvr_http_req_t *req = kvr_http_parse_take(p);
  assert_non_null(req);
  assert_string_equal(req->method_str, "POST");
  assert_string_equal(req->target, "/c?x=1");
  assert_string_equal(req->path, "/c");
  assert_string_equal(req->query, "x=1");
  assert_int_equal(req->http_minor, 1);
  assert_int_equal(req->nheaders, 3); /* Host, X-A, Transfer-Encoding: not the trailer */
  assert_string_equal(req->headers[1].value, "v w");
  assert_int_equal(req->body.len, 5);
  assert_memory_equal(req->body.data, "abcde", 5);
  assert_int_equal(kvr_http_parse_phase(p), KVR_HTTP_PHASE_IDLE);
  assert_null(kvr_http_parse_rejection(p));
  kvr_http_parse_req_free(req);
  kvr_http_parse_free(p);
}

/* After a rejection the parser stays failed, and a half-parsed request is freed with it. */
static void test_rejection_is_final(void **state) {
  (void)state;
  kvr_http_parse_t *p = kvr_http_parse_new(NULL);
  size_t used;
  const char *r = "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n";
  assert_int_equal(kvr_http_parse_feed(p, r, strlen(r), &used), KVR_HTTP_PARSE_REJECT);
  assert_non_null(kvr_http_parse_current(p)); /* its headers, for the x-request-id */
  assert_int_equal(kvr_http_parse_phase(p), KVR_HTTP_PHASE_FAILED);
  assert_int_equal(kvr_http_parse_feed(p, "GET / HTTP/1.1\r\n", 16, &used), KVR_HTTP_PARSE_REJECT);
  assert_int_equal(used, 0);
  assert_int_equal(kvr_http_parse_rejection(p)->status, 400);
  kvr_http_parse_free(p);

  /* A request cut off in its body is freed with the parser (ASan checks the leak). */
  p = kvr_http_parse_new(NULL);
  r = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc";
  assert_int_equal(kvr_http_parse_feed(p, r, strlen(r), &used), KVR_HTTP_PARSE_HEAD);
  assert_int_equal(kvr_http_parse_feed(p, r + used, strlen(r) - used, &used), KVR_HTTP_PARSE_MORE);
  assert_int_equal(kvr_http_parse_phase(p), KVR_HTTP_PHASE_BODY);
  kvr_http_parse_free(p);
}

/* A body with a Content-Length is stored in the one buffer reserved at the end of the head: it is
 * not regrown (its data pointer does not move) however the 400 KiB arrive, and it is whole. */
static void test_body_reserved_from_content_length(void **state) {
  (void)state;
  enum { N = 409600 };
  char head[128];
  int hl =
      snprintf(head, sizeof head, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", N);
  char *body = malloc(N);
  assert_non_null(body);
  for (size_t i = 0; i < N; i++)
    body[i] = (char)('a' + i % 26);
  kvr_http_parse_t *p = kvr_http_parse_new(NULL);
  size_t used;
  assert_int_equal(kvr_http_parse_feed(p, head, (size_t)hl, &used), KVR_HTTP_PARSE_HEAD);
  const kvr_http_req_t *cur = kvr_http_parse_current(p);
  assert_true(cur->body.cap > N);
  const char *data = cur->body.data;
  for (size_t off = 0; off < N;) {
    size_t n = off + 16384 < N ? 16384 : N - off;
    kvr_http_parse_event_t ev = kvr_http_parse_feed(p, body + off, n, &used);
    assert_int_equal(used, n);
    off += n;
    assert_int_equal(ev, off == N ? KVR_HTTP_PARSE_DONE : KVR_HTTP_PARSE_MORE);
    assert_ptr_equal(kvr_http_parse_current(p)->body.data, data);
  }
  kvr_http_req_t *req = kvr_http_parse_take(p);
  assert_non_null(req);
  assert_int_equal(req->body.len, N);
  assert_memory_equal(req->body.data, body, N);
  kvr_http_parse_req_free(req);
  kvr_http_parse_free(p);
  free(body);
}

/* The configured limits: target length, header bytes and count, body. */
static void test_limits(void **state) {
  (void)state;
  kvr_http_limits_t lim;
  kvr_http_limits_default(&lim);
  assert_int_equal(lim.body_timeout_ms, 60000);
  lim.max_url = 8;
  lim.max_header_fields = 2;
  lim.max_body = 4;
  static const struct {
    const char *req;
    int status;
  } t[] = {
      {"GET /12345678 HTTP/1.1\r\nHost: a\r\n\r\n", 414},
      {"GET /1234567 HTTP/1.1\r\nHost: a\r\n\r\n", 0},
      {"GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n", 431},
      {"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", 413},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\n", 413},
      {"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n", 0},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    outcome_t o = run_whole(t[i].req, strlen(t[i].req), &lim);
    if (o.status != t[i].status || o.waiting)
      fail_msg("%s: want %d, got %d (waiting %d)", t[i].req, t[i].status, o.status, o.waiting);
  }
}

static void test_host_ok(void **state) {
  (void)state;
  static const char *ok[] = {"a",
                             "example.com",
                             "example.com:8080",
                             "127.0.0.1:80",
                             "[::1]",
                             "[::1]:8000",
                             "[2001:db8::7]",
                             "[::ffff:1.2.3.4]",
                             "[v7.a:b]",
                             "",
                             "a:",
                             ":80",
                             "%41b",
                             "a!$&'()*+,;=",
                             "x_y~z-1.2"};
  static const char *bad[] = {"a b",   "a/b",       "[::1",        "[::g]", "::1",  "a:80x",
                              "a@b",   "[::1]x",    "%4",          "%zz",   "[]",   "[v.a]",
                              "[v1.]", "[1.2.3.4]", "caf\xc3\xa9", "a:1:2", "a\"b", "[::1]:a"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
    if (!kvr_http_parse_host_ok(ok[i]))
      fail_msg("host '%s' should be valid", ok[i]);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (kvr_http_parse_host_ok(bad[i]))
      fail_msg("host '%s' should be invalid", bad[i]);
  assert_false(kvr_http_parse_host_ok(NULL));
}

static void test_te_check(void **state) {
  (void)state;
  static const struct {
    const char *v[3];
    size_t n;
    int status;
  } t[] = {
      {{"chunked"}, 1, 0},
      {{" CHUNKED\t"}, 1, 0},
      {{"identity, chunked"}, 1, 501},
      {{"gzip", "chunked"}, 2, 501},
      {{"deflate, x-foo ; a=b, chunked"}, 1, 501},
      {{"gzip"}, 1, 400},
      {{"identity"}, 1, 400},
      {{"chunked", "gzip"}, 2, 400},
      {{"chunked, chunked"}, 1, 400},
      {{"chunked", ""}, 2, 400},
      {{"gzip, , chunked"}, 1, 400},
      {{"chunked;x=1"}, 1, 400},
      {{"g(zip, chunked"}, 1, 400},
      {{""}, 1, 400},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    kvr_http_rejection_t r = {0};
    int rc = kvr_http_parse_te_check(t[i].v, t[i].n, &r);
    int got = rc == 0 ? 0 : r.status;
    if (got != t[i].status)
      fail_msg("TE case %zu ('%s'...): want %d, got %d", i, t[i].v[0], t[i].status, got);
    if (rc != 0)
      assert_true(r.code != NULL && r.message != NULL);
  }
}

KVR_TEST_MAIN(cmocka_unit_test(test_table_whole), cmocka_unit_test(test_table_every_split),
              cmocka_unit_test(test_accepted_request_fields),
              cmocka_unit_test(test_rejection_is_final), cmocka_unit_test(test_limits),
              cmocka_unit_test(test_body_reserved_from_content_length),
              cmocka_unit_test(test_host_ok), cmocka_unit_test(test_te_check))

/* test_http_server.c -- the HTTP/1.1 server glue (src/net/http_server.c) over real loopback
 * sockets.
 *
 * The server runs on a libuv loop in the test thread; a client thread speaks raw HTTP with
 * blocking sockets, so each case controls exactly which bytes arrive when:
 *   - a pipelined pair of requests split at every byte position (the llhttp glue must reassemble
 *     method, target, query, headers and body whatever the split); three pipelined behind one
 *     the handler holds (the bytes read with it wait, then are parsed in order);
 *   - each limit and rejection (414, 431 by size and count, 413 before the body, 400 for TE+CL and
 *     duplicate Content-Length, 501 Upgrade, 405 CONNECT, 408 slow headers, 400 garbage);
 *   - the HTTP/1.1 strictness rules (Host, Transfer-Encoding, version, request line, target,
 *     obs-fold, chunk size): exact status at once, JSON error, x-request-id, Connection: close,
 *     then the server closes while the client still holds its side open;
 *   - the body deadline (408 for a body trickled in too slowly in total) and the idle limit;
 *   - chunked request bodies, streamed chunked responses, HTTP/1.0 framing;
 *   - a client that disconnects while its request is held gets on_close called once;
 *   - request ids: which client values are kept, the generator's format and uniqueness, and the
 *     x-request-id header on plain, error and streamed responses once the handler assigned one.
 * Every case ends by closing the server and asserting uv_loop_close() == 0 (no leaked handle).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "net/http_server.h"
#include "proto/url.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
  uv_loop_t loop;
  kvr_http_server_t *srv;
  int port;
  /* Client side, run in a thread. */
  const char *parts[16];
  size_t part_len[16];
  int nparts;
  int pause_us;
  bool close_early; /* close the socket right after sending */
  bool keep_open;   /* no half-close after sending: the server alone decides when to answer */
  kvr_buf_t response;
  bool eof;          /* the server closed the connection (recv returned 0) */
  double elapsed_ms; /* from connect to the end of the answer */
  pthread_t thread;
  uv_async_t done_async;
  /* Handler observations. */
  int requests;
  int closes;
  kvr_http_req_t *held; /* a request the handler keeps (stream / close tests) */
  bool stream_mode;
  bool big_mode; /* the handler streams big_len bytes of pattern in chunks larger than the socket
                  * takes at once */
  bool hold_mode;
  bool rid_mode; /* the handler assigns a request id (kvr_http_request_id_assign) first */
  uint64_t rid_state;
  bool defer_mode;          /* the handler answers from a timer, 2 ms later, so the requests
                             * pipelined behind the one it holds wait unparsed */
  kvr_http_req_t *deferred; /* the request defer mode holds */
  uv_timer_t defer_timer;
} ctx_t;

/* Byte k of the big-mode body: a pattern with period 251 (prime), so a lost, repeated or swapped
 * run of bytes shows. */
static char big_byte(size_t k) {
  return (char)('a' + k % 251 % 26);
}

/* The echo answer: method, path, query, the x-a header and the body. */
static void echo(kvr_http_req_t *req) {
  kvr_buf_t b = KVR_BUF_INIT;
  const char *xa = kvr_http_header(req, "x-a");
  kvr_buf_printf(&b, "%s %s q=%s xa=%s body=", req->method_str, req->path, req->query,
                 xa ? xa : "-");
  kvr_buf_append(&b, req->body.data, req->body.len);
  kvr_http_respond(req, 200, "text/plain", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

static void on_defer_timer(uv_timer_t *t) {
  ctx_t *c = t->data;
  kvr_http_req_t *req = c->deferred;
  c->deferred = NULL;
  echo(req);
}

static void on_request(kvr_http_req_t *req, void *data) {
  ctx_t *c = data;
  c->requests++;
  if (c->defer_mode) {
    assert_null(c->deferred); /* one request at a time: the next waits for this one's answer */
    c->deferred = req;
    uv_timer_start(&c->defer_timer, on_defer_timer, 2, 0);
    return;
  }
  if (c->rid_mode) {
    kvr_http_request_id_assign(req, &c->rid_state);
    if (strcmp(req->path, "/err") == 0) {
      kvr_http_error_h(req, 503, "Retry-After: 1\r\n", NULL, "busy", "%s", "busy");
      return;
    }
  }
  if (c->hold_mode) {
    c->held = req;
    req->data = c;
    req->on_close = NULL;
    return;
  }
  if (c->big_mode) {
    kvr_http_start(req, 200, "Content-Type: application/octet-stream\r\n");
    static const size_t sizes[] = {3u << 20, 1, 5u << 20, 7};
    size_t at = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      char *chunk = malloc(sizes[i]);
      for (size_t k = 0; k < sizes[i]; k++)
        chunk[k] = big_byte(at + k);
      assert_int_equal(kvr_http_write(req, chunk, sizes[i]), 0);
      free(chunk); /* the server copied what the socket did not take */
      at += sizes[i];
    }
    kvr_http_finish(req);
    return;
  }
  if (c->stream_mode) {
    c->held = req;
    kvr_http_start(req, 200, "Content-Type: text/event-stream\r\n");
    kvr_http_write(req, "data: 1\n\n", 9);
    kvr_http_write(req, "data: 2\n\n", 9);
    kvr_http_finish(req);
    c->held = NULL;
    return;
  }
  echo(req);
}

static void on_held_close(kvr_http_req_t *req) {
  ctx_t *c = req->data;
  c->closes++;
  c->held = NULL;
  kvr_http_finish(req);
}

static void *client_main(void *arg) {
  ctx_t *c = arg;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  uint64_t t0 = kvr_now_ns();
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    for (int i = 0; i < c->nparts; i++) {
      size_t off = 0;
      while (off < c->part_len[i]) {
        ssize_t n = send(fd, c->parts[i] + off, c->part_len[i] - off, MSG_NOSIGNAL);
        if (n <= 0)
          break;
        off += (size_t)n;
      }
      if (c->pause_us)
        usleep((useconds_t)c->pause_us);
    }
    if (!c->close_early) {
      if (!c->keep_open)
        shutdown(fd, SHUT_WR);
      char buf[4096];
      ssize_t n;
      struct timeval tv = {.tv_sec = 5};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
        kvr_buf_append(&c->response, buf, (size_t)n);
      c->eof = n == 0;
    }
  }
  c->elapsed_ms = (double)(kvr_now_ns() - t0) / 1e6;
  close(fd);
  uv_async_send(&c->done_async);
  return NULL;
}

static void on_done_async(uv_async_t *a) {
  ctx_t *c = a->data;
  uv_stop(&c->loop);
}

static void on_server_closed(void *data) {
  (void)data;
}

static void ctx_start(ctx_t *c, const kvr_http_limits_t *lim) {
  uv_loop_init(&c->loop);
  kvr_buf_init(&c->response);
  c->srv = kvr_http_server_new(&c->loop, lim, on_request, c);
  char err[128];
  assert_int_equal(kvr_http_server_listen(c->srv, "127.0.0.1:0", err, sizeof err), 0);
  c->port = kvr_http_server_port(c->srv);
  assert_true(c->port > 0);
  uv_async_init(&c->loop, &c->done_async, on_done_async);
  c->done_async.data = c;
  uv_timer_init(&c->loop, &c->defer_timer);
  c->defer_timer.data = c;
}

/* Runs the client to completion, then tears everything down and checks for leaked handles. */
static void ctx_run_and_close(ctx_t *c) {
  pthread_create(&c->thread, NULL, client_main, c);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  pthread_join(c->thread, NULL);
  /* Let close callbacks and pending writes settle. */
  for (int i = 0; i < 20; i++)
    uv_run(&c->loop, UV_RUN_NOWAIT);
  if (c->held && !c->held->finished)
    kvr_http_finish(c->held);
  kvr_http_server_close(c->srv, on_server_closed, c);
  uv_close((uv_handle_t *)&c->done_async, NULL);
  uv_close((uv_handle_t *)&c->defer_timer, NULL);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&c->loop), 0);
  kvr_http_server_free(c->srv);
}

static void run_simple(ctx_t *c, const char *req, size_t len, const kvr_http_limits_t *lim) {
  ctx_start(c, lim);
  c->parts[0] = req;
  c->part_len[0] = len;
  c->nparts = 1;
  ctx_run_and_close(c);
}

static int status_of(const kvr_buf_t *resp) {
  if (resp->len < 12 || strncmp(resp->data, "HTTP/1.", 7) != 0)
    return -1;
  return atoi(resp->data + 9);
}

static void test_split_every_byte(void **state) {
  (void)state;
  static const char req[] = "POST /v1/echo?x=1 HTTP/1.1\r\nHost: a\r\nX-A: hello world\r\n"
                            "Content-Length: 5\r\n\r\nabcde"
                            "GET /two HTTP/1.1\r\nHost: a\r\n\r\n";
  size_t len = sizeof req - 1;
  for (size_t k = 1; k < len; k++) {
    ctx_t c = {0};
    ctx_start(&c, NULL);
    c.parts[0] = req;
    c.part_len[0] = k;
    c.parts[1] = req + k;
    c.part_len[1] = len - k;
    c.nparts = 2;
    c.pause_us = 300;
    ctx_run_and_close(&c);
    assert_int_equal(c.requests, 2);
    const char *first = strstr(c.response.data, "POST /v1/echo q=x=1 xa=hello world body=abcde");
    const char *second = strstr(c.response.data, "GET /two q= xa=- body=");
    assert_non_null(first);
    assert_non_null(second);
    assert_true(first < second); /* pipelined responses in request order */
    kvr_buf_free(&c.response);
  }
}

/* Three requests pipelined in one send while the handler answers each later: the bytes that came
 * with the first (the others' heads and bodies, one body larger than a read) wait unparsed until
 * it is finished, then are parsed in order. Sent whole, and in 1,000-byte parts. */
static void test_pipelined_behind_held_request(void **state) {
  (void)state;
  static const size_t lens[3] = {3000, 70000, 5};
  kvr_buf_t wire = KVR_BUF_INIT, bodies[3];
  for (size_t i = 0; i < 3; i++) {
    kvr_buf_init(&bodies[i]);
    for (size_t k = 0; k < lens[i]; k++)
      kvr_buf_append(&bodies[i], &(char){(char)('a' + (k * 7 + i) % 26)}, 1);
    kvr_buf_printf(&wire, "POST /r%zu HTTP/1.1\r\nHost: a\r\nContent-Length: %zu\r\n%s\r\n", i,
                   lens[i], i == 2 ? "Connection: close\r\n" : "");
    kvr_buf_append(&wire, bodies[i].data, bodies[i].len);
  }
  for (int split = 0; split < 2; split++) {
    ctx_t c = {0};
    ctx_start(&c, NULL);
    c.defer_mode = true;
    c.keep_open = true;
    size_t part = split ? 1000 : wire.len;
    for (size_t off = 0; off < wire.len; off += part) {
      if (c.nparts == 16) { /* the rest in the last part */
        c.part_len[15] = wire.len - (size_t)(c.parts[15] - wire.data);
        break;
      }
      c.parts[c.nparts] = wire.data + off;
      c.part_len[c.nparts++] = KVR_MIN(part, wire.len - off);
    }
    ctx_run_and_close(&c);
    assert_int_equal(c.requests, 3);
    assert_true(c.eof);
    assert_non_null(c.response.data);
    const char *at = c.response.data;
    for (size_t i = 0; i < 3; i++) {
      char head[64];
      snprintf(head, sizeof head, "POST /r%zu q= xa=- body=", i);
      at = strstr(at, head);
      assert_non_null(at); /* every answer, in request order */
      at += strlen(head);
      assert_true((size_t)(c.response.data + c.response.len - at) >= lens[i]);
      assert_memory_equal(at, bodies[i].data, lens[i]);
      at += lens[i];
    }
    kvr_buf_free(&c.response);
  }
  for (size_t i = 0; i < 3; i++)
    kvr_buf_free(&bodies[i]);
  kvr_buf_free(&wire);
}

static void expect_status(const char *req, const kvr_http_limits_t *lim, int status,
                          const char *code) {
  ctx_t c = {0};
  run_simple(&c, req, strlen(req), lim);
  assert_int_equal(status_of(&c.response), status);
  assert_non_null(strstr(c.response.data, "\"error\""));
  assert_non_null(strstr(c.response.data, "Connection: close"));
  if (code)
    assert_non_null(strstr(c.response.data, code));
  assert_int_equal(c.requests, 0);
  kvr_buf_free(&c.response);
}

/* big := head, n copies of unit, tail: a request with one part over its limit. */
static void oversized(kvr_buf_t *big, const char *head, const char *unit, int n, const char *tail) {
  kvr_buf_reset(big);
  kvr_buf_puts(big, head);
  for (int i = 0; i < n; i++)
    kvr_buf_puts(big, unit);
  kvr_buf_puts(big, tail);
}

static void test_rejections(void **state) {
  (void)state;
  kvr_http_limits_t lim;
  kvr_http_limits_default(&lim);
  kvr_buf_t big = KVR_BUF_INIT;
  oversized(&big, "GET /", "a", 9000, " HTTP/1.1\r\nHost: a\r\n\r\n");
  expect_status(big.data, &lim, 414, "uri_too_long");
  oversized(&big, "GET / HTTP/1.1\r\nHost: a\r\nX-Big: ", "b", 33000, "\r\n\r\n");
  expect_status(big.data, &lim, 431, "headers_too_large");

  kvr_buf_reset(&big);
  kvr_buf_puts(&big, "GET / HTTP/1.1\r\n");
  for (int i = 0; i < 101; i++)
    kvr_buf_printf(&big, "X-H%d: v\r\n", i);
  kvr_buf_puts(&big, "\r\n");
  expect_status(big.data, &lim, 431, "too_many_headers");
  kvr_buf_free(&big);

  expect_status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9000000000\r\n\r\n", &lim, 413,
                "body_too_large");
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: "
                "chunked\r\n\r\n0\r\n\r\n",
                &lim, 400, NULL);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
                &lim, 400, NULL);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
                &lim, 501, "upgrade_not_supported");
  expect_status("CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n", &lim, 405, "method_not_allowed");
  expect_status("GARBAGE\r\n\r\n", &lim, 400, NULL);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nX-Bad: a\rb\r\n\r\n", &lim, 400, NULL);

  lim.max_body = 10;
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                "8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n",
                &lim, 413, "body_too_large");
}

static void test_header_timeout(void **state) {
  (void)state;
  kvr_http_limits_t lim;
  kvr_http_limits_default(&lim);
  lim.header_timeout_ms = 150;
  ctx_t c = {0};
  ctx_start(&c, &lim);
  c.parts[0] = "GET / HTTP/1.1\r\nHost: a\r\n";
  c.part_len[0] = strlen(c.parts[0]);
  c.parts[1] = "X-Late: 1\r\n\r\n";
  c.part_len[1] = strlen(c.parts[1]);
  c.nparts = 2;
  c.pause_us = 500000;
  ctx_run_and_close(&c);
  assert_int_equal(status_of(&c.response), 408);
  assert_int_equal(c.requests, 0);
  kvr_buf_free(&c.response);
}

/* The answer of a fresh server to req (NUL-terminated), streamed if stream; the caller frees it. */
static kvr_buf_t answer(const char *req, bool stream) {
  ctx_t c = {0};
  c.stream_mode = stream;
  run_simple(&c, req, strlen(req), NULL);
  return c.response;
}

static void test_chunked_request_and_stream(void **state) {
  (void)state;
  kvr_buf_t r = answer("POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                       false);
  assert_int_equal(status_of(&r), 200);
  assert_non_null(strstr(r.data, "body=abcde"));
  kvr_buf_free(&r);

  r = answer("GET /s HTTP/1.1\r\nHost: a\r\n\r\n", true);
  assert_non_null(strstr(r.data, "Transfer-Encoding: chunked"));
  assert_non_null(strstr(r.data, "9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"));
  kvr_buf_free(&r);

  r = answer("GET /s HTTP/1.0\r\n\r\n", true);
  assert_int_equal(strncmp(r.data, "HTTP/1.0 200", 12), 0);
  assert_null(strstr(r.data, "chunked"));
  assert_non_null(strstr(r.data, "\r\n\r\ndata: 1\n\ndata: 2\n\n"));
  kvr_buf_free(&r);
}

/* Responses larger than the socket takes at once: the direct vectored write takes part of a
 * chunk's buffers (size line, payload, CRLF; the held head before the first), the server copies
 * the rest and later writes queue behind it. The client must read the exact bytes, framing
 * included, chunked (HTTP/1.1) and raw (HTTP/1.0). */
static void test_big_writes_partial(void **state) {
  (void)state;
  const size_t total = (3u << 20) + 1 + (5u << 20) + 7;
  for (int minor = 1; minor >= 0; minor--) {
    /* The client keeps its side open (a half-close is a disconnect, see on_read) and asks for
     * Connection: close, so the end of the data is the server's close. */
    ctx_t c = {0};
    c.big_mode = true;
    c.keep_open = true;
    const char *req = minor ? "GET /big HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
                            : "GET /big HTTP/1.0\r\n\r\n";
    run_simple(&c, req, strlen(req), NULL);
    assert_true(c.eof);
    const char *body = strstr(c.response.data, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    size_t left = c.response.len - (size_t)(body - c.response.data), at = 0;
    if (minor) { /* chunked: size line, payload, CRLF ... then the last chunk */
      for (;;) {
        char *end;
        size_t n = strtoul(body, &end, 16);
        assert_memory_equal(end, "\r\n", 2);
        left -= (size_t)(end + 2 - body);
        body = end + 2;
        if (n == 0)
          break;
        assert_true(left >= n + 2);
        for (size_t k = 0; k < n; k++)
          if (body[k] != big_byte(at + k))
            fail_msg("byte %zu of the body: '%c', want '%c'", at + k, body[k], big_byte(at + k));
        assert_memory_equal(body + n, "\r\n", 2);
        at += n;
        body += n + 2;
        left -= n + 2;
      }
      assert_int_equal(left, 2); /* the final CRLF */
    } else {
      for (size_t k = 0; k < left; k++)
        if (body[k] != big_byte(k))
          fail_msg("byte %zu of the body: '%c', want '%c'", k, body[k], big_byte(k));
      at = left;
    }
    assert_int_equal(at, total);
    kvr_buf_free(&c.response);
  }
}

/* The strictness rules over a real socket: the client sends the bytes and keeps its side open, so
 * only the server can end the exchange. Each must get its exact status at once, as a JSON error
 * with x-request-id and Connection: close, and then the server closes (the client reads EOF). A
 * request the parser would wait on (HTTP/0.9 line, huge chunk size) shows up as a missing EOF. */
typedef struct {
  const char *req;
  int status;
  const char *code;
} strict_case_t;

#define SH " HTTP/1.1\r\nHost: a\r\n"
static const strict_case_t strict_cases[] = {
    {"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400, "invalid_host"},
    {"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n", 400, "missing_host"},
    {"GET / HTTP/1.1\r\nHost: exa mple\r\n\r\n", 400, "invalid_host"},
    {"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400, "invalid_host"},
    {"POST /" SH "Transfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_encoding"},
    {"POST /" SH "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_encoding"},
    {"POST /" SH "Transfer-Encoding: x-foo\r\n\r\n", 400, "invalid_transfer_encoding"},
    {"POST /" SH "Transfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n", 400, "invalid_transfer_encoding"},
    {"POST /" SH "Transfer-Encoding: chunked, \r\n\r\n0\r\n\r\n", 400, "invalid_transfer_encoding"},
    {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400,
     "invalid_transfer_encoding"},
    {"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505, "http_version_not_supported"},
    {"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505, "http_version_not_supported"},
    {"GET / HTTP/0.9\r\n\r\n", 505, "http_version_not_supported"},
    {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "http_version_not_supported"},
    {"GET /\r\n", 400, "missing_http_version"},
    {"GET /\r\n\r\n", 400, "missing_http_version"},
    {"GET / HTTP/1.x\r\nHost: a\r\n\r\n", 400, "bad_request"},
    {"POST /" SH "Transfer-Encoding: chunked\r\n\r\n100000000\r\n", 400, "invalid_chunk_size"},
    {"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400, "invalid_request_target"},
    {"GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400, "invalid_request_target"},
    {"GET /" SH "X-A: one\r\n two\r\n\r\n", 400, "obsolete_line_folding"},
    {"POST /" SH "Transfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nX-T: a\r\n\tb\r\n\r\n", 400,
     "obsolete_line_folding"},
};

static void expect_strict(const char *req, int status, const char *code, const char *rid) {
  ctx_t c = {0};
  c.keep_open = true;
  run_simple(&c, req, strlen(req), NULL);
  const char *r = c.response.data ? c.response.data : "";
  if (status_of(&c.response) != status || !c.eof || c.elapsed_ms > 2000)
    fail_msg("%s\n  want %d and close at once; got '%.40s' eof=%d after %.0f ms", req, status, r,
             c.eof, c.elapsed_ms);
  const char *end = strstr(r, "\r\n\r\n");
  assert_non_null(end);
  const char *conn = strstr(r, "Connection: close\r\n");
  assert_true(conn != NULL && conn < end);
  const char *xr = strstr(r, "x-request-id: ");
  assert_true(xr != NULL && xr < end);
  if (rid)
    assert_memory_equal(xr + 14, rid, strlen(rid));
  assert_non_null(strstr(end, "{\"error\":{"));
  char want[96];
  snprintf(want, sizeof want, "\"code\":\"%s\"", code);
  if (strstr(end, want) == NULL)
    fail_msg("%s\n  want %s in '%s'", req, want, end);
  assert_int_equal(c.requests, 0);
  kvr_buf_free(&c.response);
}

static void test_strict_rejections_socket(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof strict_cases / sizeof *strict_cases; i++)
    expect_strict(strict_cases[i].req, strict_cases[i].status, strict_cases[i].code, NULL);
  /* The client's request id is kept on a rejection once its headers got that far. */
  expect_strict("GET / HTTP/1.1\r\nX-Request-Id: strict-7\r\nHost: a\r\nHost: b\r\n\r\n", 400,
                "invalid_host", "strict-7");
  /* HTTP/1.0 may leave Host out. */
  kvr_buf_t r = answer("GET /old HTTP/1.0\r\n\r\n", false);
  assert_int_equal(strncmp(r.data, "HTTP/1.0 200", 12), 0);
  kvr_buf_free(&r);
}

/* A body trickled in, each byte within the idle limit, still gets 408 once body_timeout_ms has
 * passed since the headers; a body that stops gets 408 after the idle limit. */
static void test_body_deadline(void **state) {
  (void)state;
  kvr_http_limits_t lim;
  kvr_http_limits_default(&lim);
  lim.header_timeout_ms = 400;
  lim.body_timeout_ms = 600;
  ctx_t c = {0};
  c.keep_open = true;
  ctx_start(&c, &lim);
  c.parts[0] = "POST /slow HTTP/1.1\r\nHost: a\r\nContent-Length: 20\r\n\r\n";
  c.part_len[0] = strlen(c.parts[0]);
  for (int i = 1; i < 12; i++) {
    c.parts[i] = "x";
    c.part_len[i] = 1;
  }
  c.nparts = 12;
  c.pause_us = 150000;
  ctx_run_and_close(&c);
  assert_int_equal(status_of(&c.response), 408);
  assert_non_null(strstr(c.response.data, "not complete 600 ms after the headers"));
  assert_non_null(strstr(c.response.data, "Connection: close"));
  assert_true(c.eof);
  assert_int_equal(c.requests, 0);
  kvr_buf_free(&c.response);

  lim.body_timeout_ms = 60000;
  lim.header_timeout_ms = 200;
  ctx_t d = {0};
  d.keep_open = true;
  ctx_start(&d, &lim);
  d.parts[0] = "POST /stall HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab";
  d.part_len[0] = strlen(d.parts[0]);
  d.nparts = 1;
  ctx_run_and_close(&d);
  assert_int_equal(status_of(&d.response), 408);
  assert_non_null(strstr(d.response.data, "request body not received in time"));
  assert_true(d.eof);
  assert_true(d.elapsed_ms < 2000);
  kvr_buf_free(&d.response);
}

static void on_hold_request(kvr_http_req_t *req, void *data) {
  ctx_t *c = data;
  c->requests++;
  c->held = req;
  req->data = c;
  req->on_close = on_held_close;
}

static void test_client_close_calls_on_close(void **state) {
  (void)state;
  ctx_t c = {0};
  uv_loop_init(&c.loop);
  kvr_buf_init(&c.response);
  c.srv = kvr_http_server_new(&c.loop, NULL, on_hold_request, &c);
  char err[128];
  assert_int_equal(kvr_http_server_listen(c.srv, "127.0.0.1:0", err, sizeof err), 0);
  c.port = kvr_http_server_port(c.srv);
  uv_async_init(&c.loop, &c.done_async, on_done_async);
  c.done_async.data = &c;
  c.parts[0] = "GET /hold HTTP/1.1\r\nHost: a\r\n\r\n";
  c.part_len[0] = strlen(c.parts[0]);
  c.nparts = 1;
  c.pause_us = 100000;
  c.close_early = true;
  pthread_create(&c.thread, NULL, client_main, &c);
  uv_run(&c.loop, UV_RUN_DEFAULT);
  pthread_join(c.thread, NULL);
  for (int i = 0; i < 50 && c.closes == 0; i++) {
    uv_run(&c.loop, UV_RUN_NOWAIT);
    usleep(2000);
  }
  assert_int_equal(c.requests, 1);
  assert_int_equal(c.closes, 1);
  kvr_http_server_close(c.srv, on_server_closed, &c);
  uv_close((uv_handle_t *)&c.done_async, NULL);
  uv_run(&c.loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&c.loop), 0);
  kvr_http_server_free(c.srv);
}

static void test_request_id_ok(void **state) {
  (void)state;
  assert_true(kvr_http_request_id_ok("abc-123"));
  assert_true(kvr_http_request_id_ok("req_01HZX:9/+=~!"));
  assert_false(kvr_http_request_id_ok(NULL));
  assert_false(kvr_http_request_id_ok(""));
  assert_false(kvr_http_request_id_ok("has space"));
  assert_false(kvr_http_request_id_ok("tab\there"));
  assert_false(kvr_http_request_id_ok("caf\xc3\xa9")); /* not ASCII */
  assert_false(kvr_http_request_id_ok("del\x7f"));
  char id[KVR_HTTP_REQUEST_ID_MAX + 2];
  memset(id, 'a', sizeof id);
  id[KVR_HTTP_REQUEST_ID_MAX] = '\0';
  assert_true(kvr_http_request_id_ok(id)); /* 128 characters: kept */
  id[KVR_HTTP_REQUEST_ID_MAX] = 'a';
  id[KVR_HTTP_REQUEST_ID_MAX + 1] = '\0';
  assert_false(kvr_http_request_id_ok(id)); /* 129: replaced */
}

static bool all_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return s[n] == '\0';
}

static void test_request_id_gen_and_assign(void **state) {
  (void)state;
  enum { N = 1000 };
  static char ids[N][KVR_HTTP_REQUEST_ID_GEN_LEN + 1];
  uint64_t st = kvr_random_seed();
  for (int i = 0; i < N; i++) {
    kvr_http_request_id_gen(&st, ids[i], sizeof ids[i]);
    assert_int_equal(strlen(ids[i]), KVR_HTTP_REQUEST_ID_GEN_LEN);
    assert_true(all_hex(ids[i], KVR_HTTP_REQUEST_ID_GEN_LEN));
    for (int j = 0; j < i; j++)
      assert_string_not_equal(ids[i], ids[j]);
  }
  /* The same seed gives the same sequence; two seeds from the OS differ. */
  uint64_t a = 42, b = 42;
  char x[KVR_HTTP_REQUEST_ID_GEN_LEN + 1], y[KVR_HTTP_REQUEST_ID_GEN_LEN + 1];
  kvr_http_request_id_gen(&a, x, sizeof x);
  kvr_http_request_id_gen(&b, y, sizeof y);
  assert_string_equal(x, y);
  assert_true(kvr_random_seed() != kvr_random_seed());
  /* Too small an output buffer gets "" rather than a truncated id. */
  char small[8] = "zz";
  kvr_http_request_id_gen(&a, small, sizeof small);
  assert_string_equal(small, "");

  /* assign: the client's sane value is kept, anything else replaced by a generated id. */
  kvr_http_header_t hs[1] = {{.name = "X-Request-Id", .value = "client-7"}};
  kvr_http_req_t req = {.headers = hs, .nheaders = 1};
  assert_true(kvr_http_request_id_assign(&req, &st));
  assert_string_equal(req.request_id, "client-7");
  hs[0].value = "bad id";
  assert_false(kvr_http_request_id_assign(&req, &st));
  assert_true(all_hex(req.request_id, KVR_HTTP_REQUEST_ID_GEN_LEN));
  req.nheaders = 0;
  assert_false(kvr_http_request_id_assign(&req, &st));
  assert_true(all_hex(req.request_id, KVR_HTTP_REQUEST_ID_GEN_LEN));
}

/* Every response head of a request with an id carries x-request-id: plain, error, streamed. */
static void test_request_id_header_on_responses(void **state) {
  (void)state;
  static const char req[] = "GET /a HTTP/1.1\r\nHost: a\r\nX-Request-Id: abc-1\r\n\r\n"
                            "GET /err HTTP/1.1\r\nHost: a\r\nX-Request-Id: abc-2\r\n\r\n"
                            "GET /b HTTP/1.1\r\nHost: a\r\nX-Request-Id: has space\r\n\r\n";
  ctx_t c = {0};
  c.rid_mode = true;
  c.rid_state = 7;
  run_simple(&c, req, sizeof req - 1, NULL);
  assert_int_equal(c.requests, 3);
  /* The three answers in order: 200 (id kept), 503 error (id kept), 200 (id generated). */
  const char *h1 = c.response.data;
  const char *h2 = strstr(h1 + 1, "HTTP/1.1 503");
  assert_non_null(h2);
  const char *h3 = strstr(h2 + 1, "HTTP/1.1 200");
  assert_non_null(h3);
  const char *r1 = strstr(h1, "x-request-id: abc-1\r\n");
  const char *r2 = strstr(h1, "x-request-id: abc-2\r\n");
  const char *r3 = strstr(h3, "x-request-id: ");
  assert_true(r1 != NULL && r1 < h2);
  assert_true(r2 != NULL && r2 > h2 && r2 < h3);
  assert_non_null(r3);
  char got[KVR_HTTP_REQUEST_ID_GEN_LEN + 1];
  memcpy(got, r3 + 14, KVR_HTTP_REQUEST_ID_GEN_LEN);
  got[KVR_HTTP_REQUEST_ID_GEN_LEN] = '\0';
  assert_true(all_hex(got, KVR_HTTP_REQUEST_ID_GEN_LEN));
  assert_memory_equal(r3 + 14 + KVR_HTTP_REQUEST_ID_GEN_LEN, "\r\n", 2);
  assert_non_null(strstr(h2, "Retry-After: 1\r\n"));
  kvr_buf_free(&c.response);

  /* A streamed response too. */
  static const char sreq[] = "GET /s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
  ctx_t s = {0};
  s.rid_mode = true;
  s.stream_mode = true;
  s.rid_state = 9;
  run_simple(&s, sreq, sizeof sreq - 1, NULL);
  const char *h = strstr(s.response.data, "x-request-id: ");
  assert_non_null(h);
  assert_true(h < strstr(s.response.data, "\r\n\r\n"));
  kvr_buf_free(&s.response);

  /* Without an assigned id no header is added (the admin API, the simulated worker). */
  ctx_t n = {0};
  run_simple(&n, sreq, sizeof sreq - 1, NULL);
  assert_null(strstr(n.response.data, "x-request-id"));
  kvr_buf_free(&n.response);
}

static void test_parse_hostport(void **state) {
  (void)state;
  struct sockaddr_storage ss;
  assert_int_equal(kvr_url_hostport("127.0.0.1:8000", &ss), 0);
  assert_int_equal(ss.ss_family, AF_INET);
  assert_int_equal(kvr_url_hostport("[::1]:80", &ss), 0);
  assert_int_equal(ss.ss_family, AF_INET6);
  assert_int_equal(kvr_url_hostport("localhost:1", &ss), 0);
  assert_int_not_equal(kvr_url_hostport("127.0.0.1", &ss), 0);
  assert_int_not_equal(kvr_url_hostport("127.0.0.1:99999", &ss), 0);
  assert_int_not_equal(kvr_url_hostport("127.0.0.1:x", &ss), 0);
  assert_int_not_equal(kvr_url_hostport("nothost:80", &ss), 0);
}

KVR_TEST_MAIN(cmocka_unit_test(test_parse_hostport), cmocka_unit_test(test_split_every_byte),
              cmocka_unit_test(test_pipelined_behind_held_request),
              cmocka_unit_test(test_rejections), cmocka_unit_test(test_header_timeout),
              cmocka_unit_test(test_chunked_request_and_stream),
              cmocka_unit_test(test_big_writes_partial),
              cmocka_unit_test(test_strict_rejections_socket), cmocka_unit_test(test_body_deadline),
              cmocka_unit_test(test_client_close_calls_on_close),
              cmocka_unit_test(test_request_id_ok),
              cmocka_unit_test(test_request_id_gen_and_assign),
              cmocka_unit_test(test_request_id_header_on_responses))

/* http_server.c -- HTTP/1.1 listener and client connections on libuv; requests parsed by
 * http_parse.c (llhttp plus the strictness rules).
 *
 * Structures:
 *   kvr_http_server_t  one listening socket, the list of its connections, the limits, the handler.
 *   kvr_http_conn_t    one accepted client: its uv_tcp_t and uv_timer_t (embedded), its request
 *                      parser (kvr_http_parse_t, which owns the request being parsed), the bytes
 *                      read and not yet parsed (inbuf) and the request held by the handler
 *                      (active). At most one request is active.
 *   kvr_http_req_t     one request: parsed head, buffered body, response state (see the header).
 *
 * Connection states and the bytes through them:
 *
 *   socket --read--> slab --kvr_http_parse_feed--> HEAD (timers, 100 Continue) ... DONE
 *                     |  (parsed in place when inbuf is empty)                    |
 *                     +--> inbuf: what a read brought past the request handed on  v
 *                          (a pipelined one), or bytes read while one is active   active
 *   REJECT: JSON error + Connection: close, then close                            |
 *   handler: kvr_http_start/_write/_finish --> uv_write                           |
 *   kvr_http_finish(): active = NULL, the next pipelined request from inbuf <-----+
 *
 * Every rejection the parser reports is answered at once and the connection closed after the
 * write; the parser never leaves a malformed request waiting for bytes that will not come.
 *
 * While a request is active the connection keeps reading (so a client that goes away is noticed at
 * once and the handler's upstream work can be aborted) but stops parsing; unparsed bytes are
 * bounded by KVR_HTTP_INBUF_MAX, past which reading stops until the active request finishes.
 *
 * Lifetime: a connection holds one reference per open uv handle (tcp, timer) and one for the active
 * request. It is freed when the count drops to zero, so the handler's req stays valid after the
 * client disconnects until kvr_http_finish(). on_close is called from the tcp handle's close
 * callback, i.e. always from the loop, never synchronously inside a kvr_http_* call.
 *
 * Timers: one per connection, reused: header timeout from the first byte of a request (or accept)
 * to the end of its headers (408); while the body streams in, whichever is nearer of the idle
 * limit (header_timeout_ms since the last bytes) and the total body deadline (body_timeout_ms
 * since the end of the headers), both 408; keep-alive idle timeout between requests (silent
 * close).
 */
#include "net/http_server.h"

#include "base/kvr.h"
#include "base/list.h"
#include "base/log.h"
#include "proto/http_parse.h"
#include "proto/openai.h"
#include "proto/url.h"

#include <assert.h>
#include <errno.h>
#include <llhttp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#define KVR_HTTP_INBUF_MAX (256 * 1024)

typedef enum { TIMER_NONE, TIMER_HEADERS, TIMER_BODY, TIMER_KEEPALIVE, TIMER_LINGER } timer_kind_t;

/* After a response that closes the connection, keep reading (and discarding) for this long after
 * our FIN, so that unread request bytes do not make the kernel reset the connection and destroy the
 * response before the client reads it (the "lingering close" of Apache and nginx). */
#define KVR_HTTP_LINGER_MS 2000

struct kvr_http_server_s {
  uv_loop_t *loop;
  uv_tcp_t listener;
  bool listener_open;
  kvr_http_limits_t limits;
  kvr_http_request_cb on_request;
  void *data;
  kvr_list_t conns; /* open connections (kvr_http_conn_t.node), newest first */
  size_t nconns;    /* their number */
  bool closing;
  void (*close_done)(void *);
  void *close_data;
  int port;
  bool log_rejects;
  bool reuse_port;    /* SO_REUSEPORT on the listener */
  uint64_t rid_state; /* request ids of the requests the server rejects itself */
  size_t body_bytes;  /* sum of conn->charged: bodies of requests still being received */
};

struct kvr_http_conn_s {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_shutdown_t shutdown;
  kvr_http_server_t *srv;
  kvr_list_t node;         /* in srv->conns from accept until the tcp handle has closed */
  kvr_http_parse_t *parse; /* the requests' bytes -> kvr_http_req_t or a rejection; owned */
  kvr_buf_t inbuf;
  kvr_http_req_t *active; /* with the handler; released by kvr_http_finish() */
  kvr_buf_t head; /* a streamed response's head, held until its first body bytes (one write) */
  size_t pending_write;
  int refs;
  size_t charged;            /* bytes of the request being received counted in srv->body_bytes */
  uint64_t body_deadline_ns; /* end of headers + body_timeout_ms; 0 when none */
  bool body_deadline_hit;    /* the armed TIMER_BODY is the total deadline, not the idle one */
  timer_kind_t timer_kind;
  bool closing;
  bool reading;
  bool close_after_write;
  bool in_process;
  bool got_bytes;
  bool lingering;
};

typedef struct {
  uv_write_t req;
  kvr_http_conn_t *conn;
  size_t len;
  char data[];
} write_req_t;

static void process(kvr_http_conn_t *conn);
static void conn_close(kvr_http_conn_t *conn);
static void send_error_and_close(kvr_http_conn_t *conn, int status, const char *code,
                                 const char *msg);

const char *kvr_http_reason(int status) {
  switch (status) {
  case 100:
    return "Continue";
  case 200:
    return "OK";
  case 201:
    return "Created";
  case 202:
    return "Accepted";
  case 204:
    return "No Content";
  case 302:
    return "Found";
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 403:
    return "Forbidden";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 408:
    return "Request Timeout";
  case 409:
    return "Conflict";
  case 411:
    return "Length Required";
  case 413:
    return "Content Too Large";
  case 414:
    return "URI Too Long";
  case 415:
    return "Unsupported Media Type";
  case 422:
    return "Unprocessable Content";
  case 429:
    return "Too Many Requests";
  case 431:
    return "Request Header Fields Too Large";
  case 500:
    return "Internal Server Error";
  case 501:
    return "Not Implemented";
  case 502:
    return "Bad Gateway";
  case 503:
    return "Service Unavailable";
  case 504:
    return "Gateway Timeout";
  case 505:
    return "HTTP Version Not Supported";
  default:
    return status < 400 ? "OK" : "Error";
  }
}

const char *kvr_http_error_type(int status) {
  if (status == 404)
    return "not_found_error";
  if (status == 503)
    return "service_unavailable";
  if (status == 504)
    return "timeout_error";
  if (status >= 400 && status < 500)
    return "invalid_request_error";
  return "server_error";
}

/* ---- requests ----------------------------------------------------------------------------------
 */

/* The client's address as text ("" if unknown). */
static void peer_name(kvr_http_conn_t *conn, char *out, size_t len) {
  struct sockaddr_storage ss;
  int sl = sizeof ss;
  out[0] = '\0';
  if (uv_tcp_getpeername(&conn->tcp, (struct sockaddr *)&ss, &sl) != 0)
    return;
  if (ss.ss_family == AF_INET6)
    uv_ip6_name((struct sockaddr_in6 *)&ss, out, len);
  else
    uv_ip4_name((struct sockaddr_in *)&ss, out, len);
}

static void req_free(kvr_http_req_t *req) {
  kvr_http_parse_req_free(req);
}

const char *kvr_http_header(const kvr_http_req_t *req, const char *name) {
  for (size_t i = 0; i < req->nheaders; i++)
    if (strcasecmp(req->headers[i].name, name) == 0)
      return req->headers[i].value;
  return NULL;
}

/* ---- connection lifetime -----------------------------------------------------------------------
 */

static void conn_unref(kvr_http_conn_t *conn) {
  if (--conn->refs > 0)
    return;
  kvr_http_server_t *srv = conn->srv;
  kvr_http_parse_free(conn->parse);
  kvr_buf_free(&conn->inbuf);
  kvr_buf_free(&conn->head);
  free(conn);
  if (srv->closing && srv->nconns == 0 && !srv->listener_open && srv->close_done) {
    void (*done)(void *) = srv->close_done;
    srv->close_done = NULL;
    done(srv->close_data);
  }
}

static void on_timer_close(uv_handle_t *h) {
  conn_unref(h->data);
}

static void on_tcp_close(uv_handle_t *h) {
  kvr_http_conn_t *conn = h->data;
  kvr_http_server_t *srv = conn->srv;
  kvr_list_remove(&conn->node);
  srv->nconns--;
  kvr_http_req_t *req = conn->active;
  if (req && !req->finished && req->on_close) {
    kvr_http_req_cb cb = req->on_close;
    req->on_close = NULL;
    cb(req);
  }
  conn_unref(conn);
}

/* Starts closing the connection. Safe to call more than once and from any callback: the handler is
 * told through on_close from the close callback. */
static void conn_close(kvr_http_conn_t *conn) {
  if (conn->closing)
    return;
  conn->closing = true;
  conn->srv->body_bytes -= conn->charged;
  conn->charged = 0;
  if (conn->active)
    conn->active->closed = true;
  uv_close((uv_handle_t *)&conn->timer, on_timer_close);
  uv_close((uv_handle_t *)&conn->tcp, on_tcp_close);
}

static void on_timer(uv_timer_t *t) {
  kvr_http_conn_t *conn = t->data;
  timer_kind_t kind = conn->timer_kind;
  conn->timer_kind = TIMER_NONE;
  if (kind == TIMER_KEEPALIVE || kind == TIMER_LINGER ||
      (kind == TIMER_HEADERS && !conn->got_bytes)) {
    conn_close(conn);
    return;
  }
  if (conn->active)
    return; /* the request is complete; the handler owns the connection now */
  char msg[128];
  if (kind == TIMER_HEADERS)
    snprintf(msg, sizeof msg, "request headers not received in time");
  else if (conn->body_deadline_hit)
    snprintf(msg, sizeof msg, "request body not complete %llu ms after the headers",
             (unsigned long long)conn->srv->limits.body_timeout_ms);
  else
    snprintf(msg, sizeof msg, "request body not received in time");
  send_error_and_close(conn, 408, "request_timeout", msg);
}

static void timer_arm(kvr_http_conn_t *conn, timer_kind_t kind, uint64_t ms) {
  if (conn->closing)
    return;
  conn->timer_kind = kind;
  if (ms == 0) {
    uv_timer_stop(&conn->timer);
    return;
  }
  uv_timer_start(&conn->timer, on_timer, ms, 0);
}

static void timer_stop(kvr_http_conn_t *conn) {
  conn->timer_kind = TIMER_NONE;
  if (!conn->closing)
    uv_timer_stop(&conn->timer);
}

/* ---- writing -----------------------------------------------------------------------------------
 */

static void read_control(kvr_http_conn_t *conn);

static void on_shutdown(uv_shutdown_t *sreq, int status) {
  kvr_http_conn_t *conn = sreq->data;
  if (status < 0)
    conn_close(conn);
  else
    timer_arm(conn, TIMER_LINGER, KVR_HTTP_LINGER_MS);
  conn_unref(conn);
}

static void maybe_close_after_write(kvr_http_conn_t *conn) {
  if (!conn->close_after_write || conn->pending_write || conn->active || conn->closing ||
      conn->lingering)
    return;
  conn->lingering = true;
  conn->shutdown.data = conn;
  if (uv_shutdown(&conn->shutdown, (uv_stream_t *)&conn->tcp, on_shutdown) != 0) {
    conn_close(conn);
    return;
  }
  conn->refs++;
  read_control(conn); /* keep draining until the client's EOF or the linger timer */
}

static void on_write(uv_write_t *w, int status) {
  write_req_t *wr = (write_req_t *)w;
  kvr_http_conn_t *conn = wr->conn;
  conn->pending_write -= wr->len;
  free(wr);
  if (status < 0) {
    conn_close(conn);
  } else if (conn->pending_write == 0) {
    kvr_http_req_t *req = conn->active;
    if (req && req->on_drain && !conn->closing)
      req->on_drain(req);
    maybe_close_after_write(conn);
  }
  conn_unref(conn);
}

/* Queues buffers on the socket, in order: tries one direct vectored write first (no copy when the
 * socket takes everything, the usual case), copies what is left into one queued write. */
static int conn_writev(kvr_http_conn_t *conn, uv_buf_t *bufs, unsigned nbufs) {
  if (conn->closing)
    return KVR_ECLOSED;
  size_t len = 0;
  for (unsigned i = 0; i < nbufs; i++)
    len += bufs[i].len;
  if (len == 0)
    return 0;
  size_t skip = 0; /* bytes the direct write took */
  if (conn->pending_write == 0) {
    int n = uv_try_write((uv_stream_t *)&conn->tcp, bufs, nbufs);
    if (n == (int)len)
      return 0;
    if (n > 0) {
      skip = (size_t)n;
    } else if (n != UV_EAGAIN && n != UV_ENOSYS) {
      conn_close(conn);
      return KVR_ECLOSED;
    }
  }
  len -= skip;
  write_req_t *wr = kvr_xmalloc(sizeof *wr + len);
  size_t at = 0;
  for (unsigned i = 0; i < nbufs; i++) {
    size_t from = KVR_MIN(skip, (size_t)bufs[i].len);
    skip -= from;
    if (bufs[i].len > from) /* a zero-length buffer may have a NULL base */
      memcpy(wr->data + at, bufs[i].base + from, bufs[i].len - from);
    at += bufs[i].len - from;
  }
  wr->conn = conn;
  wr->len = len;
  uv_buf_t b = uv_buf_init(wr->data, (unsigned)len);
  if (uv_write(&wr->req, (uv_stream_t *)&conn->tcp, &b, 1, on_write) != 0) {
    free(wr);
    conn_close(conn);
    return KVR_ECLOSED;
  }
  conn->pending_write += len;
  conn->refs++;
  return 0;
}

static int conn_write(kvr_http_conn_t *conn, const void *data, size_t len) {
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
  return conn_writev(conn, &b, 1);
}

size_t kvr_http_pending(const kvr_http_req_t *req) {
  return req->conn->pending_write;
}

void kvr_http_error_body(kvr_buf_t *out, const char *message, const char *type, const char *code) {
  kvr_openai_error_body(out, message, type, code);
}

/* Sends an error on a connection that has no active request (parser-level rejections). */
static void send_error_and_close_h(kvr_http_conn_t *conn, int status, const char *extra,
                                   const char *code, const char *msg);

static void send_error_and_close(kvr_http_conn_t *conn, int status, const char *code,
                                 const char *msg) {
  send_error_and_close_h(conn, status, "", code, msg);
}

/* Like send_error_and_close() with extra header lines ("Retry-After: 1\r\n"). */
static void send_error_and_close_h(kvr_http_conn_t *conn, int status, const char *extra,
                                   const char *code, const char *msg) {
  kvr_buf_t body = KVR_BUF_INIT, head = KVR_BUF_INIT;
  kvr_http_error_body(&body, msg, kvr_http_error_type(status), code);
  /* Like a handled request's: the client's sane x-request-id if its headers got that far. */
  char rid[KVR_HTTP_REQUEST_ID_MAX + 1];
  const kvr_http_req_t *cur = kvr_http_parse_current(conn->parse);
  const char *given = cur ? kvr_http_header(cur, "x-request-id") : NULL;
  if (kvr_http_request_id_ok(given))
    snprintf(rid, sizeof rid, "%s", given);
  else
    kvr_http_request_id_gen(&conn->srv->rid_state, rid, sizeof rid);
  kvr_buf_printf(&head,
                 "HTTP/1.1 %d %s\r\nx-request-id: %s\r\n%sContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                 status, kvr_http_reason(status), rid, extra, body.len);
  kvr_buf_append(&head, body.data, body.len);
  if (conn->srv->log_rejects) {
    char peer[64];
    peer_name(conn, peer, sizeof peer);
    kvr_log(KVR_LOG_INFO, "access",
            "method=- path=- status=%d outcome=rejected code=%s client=%s request_id=%s", status,
            code ? code : "-", peer[0] ? peer : "-", rid);
  }
  if (conn_write(conn, head.data, head.len) == 0) {
    conn->close_after_write = true;
    timer_stop(conn);
    maybe_close_after_write(conn);
  }
  kvr_buf_free(&head);
  kvr_buf_free(&body);
}

static bool conn_keeps_alive(const kvr_http_req_t *req) {
  return req->keep_alive && !req->conn->srv->closing && !req->conn->close_after_write;
}

static void head_begin(kvr_buf_t *h, kvr_http_req_t *req, int status) {
  kvr_buf_printf(h, "HTTP/1.%d %d %s\r\n", req->http_minor == 0 ? 0 : 1, status,
                 kvr_http_reason(status));
  if (req->request_id[0])
    kvr_buf_printf(h, "x-request-id: %s\r\n", req->request_id);
}

int kvr_http_start(kvr_http_req_t *req, int status, const char *headers) {
  if (req->started)
    return KVR_EINVAL;
  req->started = true;
  req->status = status;
  if (req->closed)
    return KVR_ECLOSED;
  kvr_buf_t h = KVR_BUF_INIT;
  head_begin(&h, req, status);
  if (headers)
    kvr_buf_puts(&h, headers);
  if (status < 200 || status == 204 || status == 304) {
    /* No body may follow: no framing either; writes are refused (req->finished stays false). */
    if (!conn_keeps_alive(req) || req->http_minor == 0) {
      kvr_buf_puts(&h, "Connection: close\r\n");
      req->conn->close_after_write = true;
    }
    req->chunked = false;
    req->no_body = true;
  } else if (req->http_minor >= 1 && req->http_major == 1) {
    req->chunked = true;
    kvr_buf_puts(&h, "Transfer-Encoding: chunked\r\n");
    if (!conn_keeps_alive(req)) {
      kvr_buf_puts(&h, "Connection: close\r\n");
      req->conn->close_after_write = true;
    }
  } else {
    /* HTTP/1.0 has no chunked framing: the end of the body is the end of the connection. */
    kvr_buf_puts(&h, "Connection: close\r\n");
    req->conn->close_after_write = true;
  }
  kvr_buf_puts(&h, "\r\n");
  /* Held until the first body bytes or the end, so the head and the first event of a stream
   * leave in one write (one packet) instead of two. */
  kvr_buf_reset(&req->conn->head);
  kvr_buf_append(&req->conn->head, h.data, h.len);
  kvr_buf_free(&h);
  return 0;
}

/* Writes a held response head (if any) and then bufs[1..nbufs), in one vectored write; bufs[0] is
 * the head's place. */
static int write_with_head(kvr_http_conn_t *conn, uv_buf_t *bufs, unsigned nbufs) {
  if (conn->head.len == 0)
    return conn_writev(conn, bufs + 1, nbufs - 1);
  bufs[0] = uv_buf_init(conn->head.data, (unsigned)conn->head.len);
  int rc = conn_writev(conn, bufs, nbufs);
  kvr_buf_reset(&conn->head);
  return rc;
}

int kvr_http_write(kvr_http_req_t *req, const void *data, size_t len) {
  if (req->closed || req->conn->closing)
    return KVR_ECLOSED;
  if (!req->started || req->finished || req->no_body)
    return KVR_EINVAL;
  if (len == 0)
    return 0;
  req->bytes_sent += len;
  uv_buf_t bufs[4];
  if (!req->chunked) {
    bufs[1] = uv_buf_init((char *)data, (unsigned)len);
    return write_with_head(req->conn, bufs, 2);
  }
  /* A chunk's size line, payload and CRLF leave in one write (one packet), without a copy. */
  char hdr[24];
  int n = snprintf(hdr, sizeof hdr, "%zx\r\n", len);
  bufs[1] = uv_buf_init(hdr, (unsigned)n);
  bufs[2] = uv_buf_init((char *)data, (unsigned)len);
  bufs[3] = uv_buf_init("\r\n", 2);
  return write_with_head(req->conn, bufs, 4);
}

/* True when a "Name: value\r\n" header block has a Content-Length line. */
static bool has_content_length(const char *headers) {
  for (const char *p = headers; p && *p;) {
    if (strncasecmp(p, "content-length:", 15) == 0)
      return true;
    p = strstr(p, "\r\n");
    if (p)
      p += 2;
  }
  return false;
}

void kvr_http_respond(kvr_http_req_t *req, int status, const char *content_type,
                      const char *extra_headers, const void *body, size_t len) {
  if (req->started) {
    kvr_http_finish(req);
    return;
  }
  req->started = true;
  req->status = status;
  if (!req->closed) {
    kvr_buf_t h = KVR_BUF_INIT;
    head_begin(&h, req, status);
    if (content_type)
      kvr_buf_printf(&h, "Content-Type: %s\r\n", content_type);
    if (extra_headers)
      kvr_buf_puts(&h, extra_headers);
    /* 1xx, 204 and 304 carry no body and no Content-Length (RFC 9110 8.6, 15.3.5). A HEAD
     * answer whose caller already gave the GET body's Content-Length (a proxied HEAD) keeps it. */
    bool no_body = status < 200 || status == 204 || status == 304;
    if (no_body)
      len = 0;
    else if (!(req->method == HTTP_HEAD && has_content_length(extra_headers)))
      kvr_buf_printf(&h, "Content-Length: %zu\r\n", len);
    if (!conn_keeps_alive(req) || req->http_minor == 0) {
      if (req->http_minor == 0 && conn_keeps_alive(req))
        kvr_buf_puts(&h, "Connection: keep-alive\r\n");
      else {
        kvr_buf_puts(&h, "Connection: close\r\n");
        req->conn->close_after_write = true;
      }
    }
    kvr_buf_puts(&h, "\r\n");
    req->bytes_sent = len;
    uv_buf_t bufs[2] = {uv_buf_init(h.data, (unsigned)h.len),
                        uv_buf_init((char *)body, req->method != HTTP_HEAD ? (unsigned)len : 0)};
    conn_writev(req->conn, bufs, 2); /* head and body in one write, the body not copied */
    kvr_buf_free(&h);
  }
  kvr_http_finish(req);
}

static void verror(kvr_http_req_t *req, int status, const char *extra, const char *type,
                   const char *code, const char *fmt, va_list ap) {
  kvr_buf_t msg = KVR_BUF_INIT, body = KVR_BUF_INIT;
  kvr_buf_vprintf(&msg, fmt, ap);
  kvr_http_error_body(&body, msg.data ? msg.data : "", type ? type : kvr_http_error_type(status),
                      code);
  kvr_http_respond(req, status, "application/json", extra, body.data, body.len);
  kvr_buf_free(&msg);
  kvr_buf_free(&body);
}

void kvr_http_error(kvr_http_req_t *req, int status, const char *type, const char *code,
                    const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(req, status, NULL, type, code, fmt, ap);
  va_end(ap);
}

void kvr_http_error_h(kvr_http_req_t *req, int status, const char *extra_headers, const char *type,
                      const char *code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  verror(req, status, extra_headers, type, code, fmt, ap);
  va_end(ap);
}

void kvr_http_finish(kvr_http_req_t *req) {
  if (req->finished)
    return;
  if (!req->started) {
    kvr_http_error(req, 500, NULL, "no_response", "the handler produced no response");
    return; /* kvr_http_error() finished it */
  }
  req->finished = true;
  kvr_http_conn_t *conn = req->conn;
  if (!req->closed) {
    uv_buf_t bufs[2];
    bufs[1] = req->chunked ? uv_buf_init("0\r\n\r\n", 5) : uv_buf_init("", 0);
    write_with_head(conn, bufs, 2);
  }
  kvr_buf_reset(&conn->head);
  conn->active = NULL;
  req_free(req);
  if (conn->closing) {
    conn_unref(conn);
    return;
  }
  conn->refs--; /* cannot reach zero: the tcp and timer handles are still open */
  if (conn->close_after_write) {
    maybe_close_after_write(conn);
    return;
  }
  if (!conn->in_process)
    process(conn);
}

void kvr_http_abort(kvr_http_req_t *req) {
  if (req->finished)
    return;
  kvr_http_conn_t *conn = req->conn;
  req->started = true;
  req->finished = true;
  conn->active = NULL;
  req_free(req);
  kvr_buf_reset(&conn->head);
  conn_close(conn);
  conn_unref(conn);
}

/* ---- request ids ------------------------------------------------------------------------------
 */

bool kvr_http_request_id_ok(const char *v) {
  if (v == NULL || *v == '\0')
    return false;
  size_t n = 0;
  for (const unsigned char *s = (const unsigned char *)v; *s; s++, n++)
    if (*s < 0x21 || *s > 0x7e || n >= KVR_HTTP_REQUEST_ID_MAX)
      return false;
  return true;
}

void kvr_http_request_id_gen(uint64_t *state, char *out, size_t outlen) {
  if (outlen <= KVR_HTTP_REQUEST_ID_GEN_LEN) {
    if (outlen)
      out[0] = '\0';
    return;
  }
  uint64_t hi = kvr_splitmix64(state), lo = kvr_splitmix64(state);
  snprintf(out, outlen, "%016llx%016llx", (unsigned long long)hi, (unsigned long long)lo);
}

bool kvr_http_request_id_assign(kvr_http_req_t *req, uint64_t *state) {
  const char *v = kvr_http_header(req, "x-request-id");
  if (kvr_http_request_id_ok(v)) {
    snprintf(req->request_id, sizeof req->request_id, "%s", v);
    return true;
  }
  kvr_http_request_id_gen(state, req->request_id, sizeof req->request_id);
  return false;
}

/* ---- parsing (http_parse.c) and dispatch --------------------------------------------------------
 */

/* Arms the body timer: the idle limit (header_timeout_ms) or what is left of the total body
 * deadline (body_timeout_ms from the end of the headers), whichever comes first. */
static void body_timer_arm(kvr_http_conn_t *conn) {
  uint64_t ms = conn->srv->limits.header_timeout_ms;
  conn->body_deadline_hit = false;
  if (conn->body_deadline_ns) {
    uint64_t now = kvr_now_ns();
    uint64_t left =
        conn->body_deadline_ns > now ? (conn->body_deadline_ns - now + 999999) / 1000000 : 1;
    if (ms == 0 || left <= ms) {
      ms = left;
      conn->body_deadline_hit = true;
    }
  }
  timer_arm(conn, TIMER_BODY, ms);
}

/* The head of a request passed every rule: the body deadline starts, and a client waiting for
 * 100 Continue gets it. */
static void on_head(kvr_http_conn_t *conn) {
  const kvr_http_limits_t *lim = &conn->srv->limits;
  const kvr_http_req_t *req = kvr_http_parse_current(conn->parse);
  /* A limit too large to add to the clock (over ~290 years) means none. */
  bool limited = lim->body_timeout_ms && lim->body_timeout_ms < UINT64_MAX / 4000000;
  conn->body_deadline_ns = limited ? kvr_now_ns() + lim->body_timeout_ms * 1000000 : 0;
  body_timer_arm(conn);
  const char *expect = kvr_http_header(req, "expect");
  if (expect && strcasecmp(expect, "100-continue") == 0 && req->http_minor >= 1)
    conn_write(conn, "HTTP/1.1 100 Continue\r\n\r\n", 25);
}

static void dispatch(kvr_http_conn_t *conn) {
  kvr_http_req_t *req = kvr_http_parse_take(conn->parse);
  req->conn = conn;
  peer_name(conn, req->peer, sizeof req->peer);
  conn->active = req;
  conn->refs++;
  conn->body_deadline_ns = 0;
  timer_stop(conn);
  kvr_http_server_t *srv = conn->srv;
  srv->on_request(req, srv->data);
}

/* The listener's budget for bodies still being received (limits.max_body_buffer): the request
 * being parsed is charged what its body holds (the parser reserves a declared Content-Length at
 * the head, a chunked body grows); a complete request is handed to its handler and no longer
 * counts. Returns false, after answering 503 with Retry-After and closing, when the budget is
 * spent: the bytes are freed with the connection at once, and a client retrying later finds room.
 */
static bool charge_body(kvr_http_conn_t *conn) {
  kvr_http_server_t *srv = conn->srv;
  const kvr_http_req_t *cur = kvr_http_parse_current(conn->parse);
  size_t now = cur && kvr_http_parse_phase(conn->parse) == KVR_HTTP_PHASE_BODY ? cur->body.cap : 0;
  srv->body_bytes = srv->body_bytes - conn->charged + now;
  conn->charged = now;
  if (srv->limits.max_body_buffer == 0 || srv->body_bytes <= srv->limits.max_body_buffer)
    return true;
  KVR_WARN("http", "request bodies being received hold %zu bytes, over the %zu-byte budget: 503",
           srv->body_bytes, srv->limits.max_body_buffer);
  send_error_and_close_h(conn, 503, "Retry-After: 1\r\n", "server_busy",
                         "the server holds too many request bodies; retry later");
  srv->body_bytes -= conn->charged;
  conn->charged = 0;
  return false;
}

/* Parses bytes and dispatches complete requests, one at a time: the bytes of one read in place
 * (in, len; only when inbuf is empty) or, with in NULL, those buffered in inbuf. What is not
 * parsed when a request goes to its handler is kept in inbuf (a pipelined request), so a read's
 * bytes are copied once, into the request's body, not first into inbuf and then moved within it.
 * Every rejection the parser reports is answered and closes the connection; nothing is left
 * waiting. */
static void process_bytes(kvr_http_conn_t *conn, const char *in, size_t len) {
  assert(in == NULL || conn->inbuf.len == 0); /* a read's bytes never overtake buffered ones */
  conn->in_process = true;
  bool after_head = false; /* the parser may complete a body-less request without more bytes */
  while (!conn->closing && conn->active == NULL && !conn->close_after_write &&
         ((in ? len : conn->inbuf.len) || after_head)) {
    after_head = false;
    kvr_http_parse_phase_t before = kvr_http_parse_phase(conn->parse);
    size_t used;
    kvr_http_parse_event_t ev =
        in ? kvr_http_parse_feed(conn->parse, in, len, &used)
           : kvr_http_parse_feed(conn->parse, conn->inbuf.data, conn->inbuf.len, &used);
    if (in) {
      in += used;
      len -= used;
    } else {
      kvr_buf_consume(&conn->inbuf, used);
    }
    kvr_http_parse_phase_t phase = kvr_http_parse_phase(conn->parse);
    if (before == KVR_HTTP_PHASE_IDLE && phase != KVR_HTTP_PHASE_IDLE) {
      conn->got_bytes = true; /* a request began: its headers are due within header_timeout_ms */
      timer_arm(conn, TIMER_HEADERS, conn->srv->limits.header_timeout_ms);
    }
    if (ev != KVR_HTTP_PARSE_REJECT && !charge_body(conn))
      break;
    if (ev == KVR_HTTP_PARSE_HEAD) {
      on_head(conn);
      after_head = true;
    } else if (ev == KVR_HTTP_PARSE_DONE) {
      dispatch(conn); /* loops on only if the handler already finished the request */
    } else if (ev == KVR_HTTP_PARSE_REJECT) {
      const kvr_http_rejection_t *r = kvr_http_parse_rejection(conn->parse);
      send_error_and_close(conn, r->status, r->code, r->message);
    } else if (phase == KVR_HTTP_PHASE_BODY && used) {
      body_timer_arm(conn); /* body bytes arrived: the idle limit starts again */
    }
  }
  if (in && len && !conn->closing && !conn->close_after_write)
    kvr_buf_append(&conn->inbuf, in, len);
  conn->in_process = false;
  if (!conn->closing && conn->active == NULL && !conn->close_after_write && conn->inbuf.len == 0 &&
      kvr_http_parse_phase(conn->parse) == KVR_HTTP_PHASE_IDLE)
    timer_arm(conn, TIMER_KEEPALIVE, conn->srv->limits.keepalive_timeout_ms);
  read_control(conn);
}

static void process(kvr_http_conn_t *conn) {
  process_bytes(conn, NULL, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  static char slab[64 * 1024];
  (void)h;
  (void)suggested;
  /* The loop is single-threaded and on_read parses or copies out at once, so one static slab
   * serves all. */
  buf->base = slab;
  buf->len = sizeof slab;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  kvr_http_conn_t *conn = s->data;
  if (nread < 0) {
    /* EOF or error: the client is gone. A half-close (shutdown(SHUT_WR) after the request, rare
     * for HTTP clients) is taken as a disconnect too, as vLLM's own server takes it: the worker
     * stops generating for a client that may never read the answer. */
    conn_close(conn);
    return;
  }
  if (nread == 0)
    return;
  if (conn->close_after_write)
    return; /* answering with an error; anything more the client sends is dropped */
  if (conn->active == NULL && conn->inbuf.len == 0) {
    process_bytes(conn, buf->base, (size_t)nread); /* parsed in the slab, nothing buffered first */
    return;
  }
  kvr_buf_append(&conn->inbuf, buf->base, (size_t)nread);
  if (conn->active == NULL)
    process(conn);
  else
    read_control(conn);
}

/* Reads while there is room for unparsed bytes, so a pipelining client cannot grow inbuf without
 * bound while a request is with its handler. */
static void read_control(kvr_http_conn_t *conn) {
  if (conn->closing)
    return;
  bool want = conn->close_after_write || conn->inbuf.len < KVR_HTTP_INBUF_MAX;
  if (want && !conn->reading) {
    if (uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read) == 0)
      conn->reading = true;
  } else if (!want && conn->reading) {
    uv_read_stop((uv_stream_t *)&conn->tcp);
    conn->reading = false;
  }
}

/* ---- listener ----------------------------------------------------------------------------------
 */

/* Connections refused by the process (accept failures: EMFILE, ENFILE...) and by the limit
 * (max_connections), over every listener of the process: counted, and logged once per episode (the
 * first refusal after a connection was taken), so a flood neither goes unseen nor floods the log.
 */
static uint64_t g_refused[2];
static bool g_refusing[2];

static void refused(int why, const char *what) {
  g_refused[why]++;
  if (!g_refusing[why])
    KVR_WARN("http", "refusing new connections: %s (logged once until a connection is taken)",
             what);
  g_refusing[why] = true;
}

uint64_t kvr_http_refused_total(bool by_limit) {
  return g_refused[by_limit];
}

/* The open-file limit must hold max_connections clients beside the workers' connections: raised
 * to the hard limit when the soft one is lower, and a warning when even that is too low (libuv
 * then resets new clients silently: its EMFILE trick accepts and closes them). */
static void fd_limit_check(const kvr_http_server_t *srv) {
  struct rlimit rl;
  rlim_t want = (rlim_t)srv->limits.max_connections + 256;
  if (srv->limits.max_connections == 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
    return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want)
    KVR_WARN("http",
             "the open-file limit (%llu) is below max_connections (%zu) + 256: clients past it "
             "are reset by the OS limit, not answered 503; raise it (systemd LimitNOFILE=)",
             (unsigned long long)rl.rlim_cur, srv->limits.max_connections);
}

static void on_connection(uv_stream_t *ls, int status) {
  kvr_http_server_t *srv = ls->data;
  if (status < 0) {
    refused(0, uv_strerror(status));
    return;
  }
  kvr_http_conn_t *conn = kvr_xcalloc(1, sizeof *conn);
  conn->srv = srv;
  conn->parse = kvr_http_parse_new(&srv->limits);
  uv_tcp_init(srv->loop, &conn->tcp);
  uv_timer_init(srv->loop, &conn->timer);
  conn->tcp.data = conn;
  conn->timer.data = conn;
  conn->refs = 2;
  kvr_list_insert_head(&srv->conns, &conn->node);
  srv->nconns++;
  if (uv_accept(ls, (uv_stream_t *)&conn->tcp) != 0) {
    conn_close(conn);
    return;
  }
  uv_tcp_nodelay(&conn->tcp, 1);
  if (srv->limits.max_connections && srv->nconns > srv->limits.max_connections) {
    refused(1, "max_connections reached (503)");
    send_error_and_close(conn, 503, "too_many_connections", "connection limit reached");
    return;
  }
  g_refusing[0] = g_refusing[1] = false;
  timer_arm(conn, TIMER_HEADERS, srv->limits.header_timeout_ms);
  read_control(conn);
}

kvr_http_server_t *kvr_http_server_new(uv_loop_t *loop, const kvr_http_limits_t *limits,
                                       kvr_http_request_cb on_request, void *data) {
  kvr_http_server_t *srv = kvr_xcalloc(1, sizeof *srv);
  srv->loop = loop;
  if (limits)
    srv->limits = *limits;
  else
    kvr_http_limits_default(&srv->limits);
  srv->on_request = on_request;
  srv->data = data;
  srv->port = -1;
  srv->rid_state = kvr_random_seed();
  kvr_list_init(&srv->conns);
  return srv;
}

int kvr_http_server_listen(kvr_http_server_t *srv, const char *hostport, char *errbuf,
                           size_t errlen) {
  struct sockaddr_storage ss;
  if (kvr_url_hostport(hostport, &ss) != 0) {
    snprintf(errbuf, errlen, "invalid listen address '%s' (expected HOST:PORT)", hostport);
    return KVR_EINVAL;
  }
  /* With reuse_port the socket is made now (libuv 1.44 has no UV_TCP_REUSEPORT) so that the option
   * is set before the bind. */
  int rc = uv_tcp_init_ex(srv->loop, &srv->listener, srv->reuse_port ? ss.ss_family : AF_UNSPEC);
  if (rc != 0) {
    snprintf(errbuf, errlen, "cannot listen on %s: %s", hostport, uv_strerror(rc));
    return KVR_EIO;
  }
  srv->listener.data = srv;
  srv->listener_open = true;
  uv_os_fd_t fd;
  int one = 1;
  if (srv->reuse_port && (uv_fileno((uv_handle_t *)&srv->listener, &fd) != 0 ||
                          setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0))
    rc = uv_translate_sys_error(errno);
  if (rc == 0)
    rc = uv_tcp_bind(&srv->listener, (struct sockaddr *)&ss, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&srv->listener, 511, on_connection);
  if (rc != 0) {
    snprintf(errbuf, errlen, "cannot listen on %s: %s", hostport, uv_strerror(rc));
    srv->listener_open = false;
    uv_close((uv_handle_t *)&srv->listener, NULL);
    return KVR_EIO;
  }
  fd_limit_check(srv);
  struct sockaddr_storage bound;
  int len = sizeof bound;
  if (uv_tcp_getsockname(&srv->listener, (struct sockaddr *)&bound, &len) == 0)
    srv->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                  : ((struct sockaddr_in *)&bound)->sin_port);
  return 0;
}

void kvr_http_server_reuse_port(kvr_http_server_t *srv, bool on) {
  srv->reuse_port = on;
}

void kvr_http_server_log_rejects(kvr_http_server_t *srv, bool on) {
  srv->log_rejects = on;
}

int kvr_http_server_port(const kvr_http_server_t *srv) {
  return srv->port;
}

size_t kvr_http_server_connections(const kvr_http_server_t *srv) {
  return srv->nconns;
}

static void on_listener_close(uv_handle_t *h) {
  kvr_http_server_t *srv = h->data;
  srv->listener_open = false;
  if (srv->nconns == 0 && srv->close_done) {
    void (*done)(void *) = srv->close_done;
    srv->close_done = NULL;
    done(srv->close_data);
  }
}

void kvr_http_server_close(kvr_http_server_t *srv, void (*done)(void *data), void *data) {
  srv->closing = true;
  srv->close_done = done;
  srv->close_data = data;
  /* Idle connections go now; busy ones close when their active request finishes. Closing only
   * starts here: a connection leaves the list in its tcp handle's close callback. */
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, &srv->conns) {
    kvr_http_conn_t *c = KVR_CONTAINER_OF(q, kvr_http_conn_t, node);
    if (c->active == NULL && c->pending_write == 0 && !c->lingering) {
      conn_close(c);
    } else {
      /* Busy, or a finished response still flushing: close once it has been written. */
      c->close_after_write = true;
      maybe_close_after_write(c);
    }
  }
  if (srv->listener_open && !uv_is_closing((uv_handle_t *)&srv->listener)) {
    uv_close((uv_handle_t *)&srv->listener, on_listener_close);
  } else if (srv->nconns == 0 && srv->close_done) {
    srv->close_done = NULL;
    done(data);
  }
}

void kvr_http_server_free(kvr_http_server_t *srv) {
  free(srv);
}

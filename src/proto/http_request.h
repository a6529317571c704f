/* http_request.h -- the type of one HTTP request as the parser builds it and handlers hold it
 * (types only: the parser in proto/http_parse.c fills it without a socket, net/http_server.c owns
 * its connection and its response state, handlers in serve/ read it).
 *
 * kvr_http_req_t is created by kvr_http_parse (method, target, headers, body), handed to the
 * server, which sets conn and peer, and then to a handler, which holds one reference until it
 * finishes the response (net/http_server.h says how).
 */
#ifndef KVR_HTTP_REQUEST_H
#define KVR_HTTP_REQUEST_H

#include "base/buf.h"
#include "proto/http_headers.h" /* kvr_http_header_t */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_http_conn_s kvr_http_conn_t;
typedef struct kvr_http_req_s kvr_http_req_t;

/* Longest request id accepted from a client (x-request-id); longer ones are replaced. */
#define KVR_HTTP_REQUEST_ID_MAX 128
/* Length of a generated request id: 32 lower-case hex digits (128 bits). */
#define KVR_HTTP_REQUEST_ID_GEN_LEN 32

typedef void (*kvr_http_request_cb)(kvr_http_req_t *req, void *data);
typedef void (*kvr_http_req_cb)(kvr_http_req_t *req);

struct kvr_http_req_s {
  kvr_http_conn_t *conn;  /* owner; do not touch */
  int method;             /* llhttp_method_t (HTTP_GET, HTTP_POST, ...) */
  const char *method_str; /* "GET" */
  char *target;           /* full request-target as received, NUL-terminated */
  char *path;             /* target without query string, NUL-terminated */
  const char *query;      /* points into target after '?', or "" */
  kvr_http_header_t *headers;
  size_t nheaders;
  kvr_buf_t body; /* complete request body (bounded by max_body) */
  int http_major, http_minor;
  bool keep_alive;   /* what the client asked for; the response may still close */
  char peer[64];     /* client address as text, for X-Forwarded-For and logs */
  uint64_t start_ns; /* when the first byte of this request was read */

  /* Set by the handler. */
  void *data;
  kvr_http_req_cb on_close; /* client went away before kvr_http_finish(); called once */
  kvr_http_req_cb on_drain; /* the write queue emptied after kvr_http_pending() was > 0 */
  /* When non-empty (kvr_http_request_id_assign()), every response head sent for req carries
   * "x-request-id: <it>" (kvr_http_respond(), kvr_http_error*(), kvr_http_start()). */
  char request_id[KVR_HTTP_REQUEST_ID_MAX + 1];

  /* Response state, read-only for handlers. */
  int status;          /* status sent, 0 before kvr_http_start() */
  uint64_t bytes_sent; /* body bytes passed to kvr_http_write() */
  bool closed;         /* the client connection is gone */
  bool started, finished;
  bool chunked;
  bool no_body; /* the status forbids a body (1xx, 204, 304) */
};

#endif

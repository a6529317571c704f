/* http_parse.h -- HTTP/1.1 request parsing without sockets: bytes in, requests or a rejection out.
 *
 * One kvr_http_parse_t parses the requests of one client connection. It drives llhttp (every
 * lenient flag off except the version table, which it enforces itself, see below) and applies the
 * limits of kvr_http_limits_t and the strictness rules of RFC 9110/9112 that llhttp 8 leaves to its
 * user. The caller feeds bytes and gets one event at a time:
 *
 *   feed(bytes) -> MORE    every byte consumed, the request is not complete yet
 *               -> HEAD    the head of the current request passed every rule (body may follow)
 *               -> DONE    the request is complete: kvr_http_parse_take() hands it over
 *               -> REJECT  the bytes are refused: kvr_http_parse_rejection() says how to answer
 *                          (status, code, message); the caller answers and closes the connection
 *
 * What is refused, and with which status (besides the limits: 413, 414, 431):
 *   request line without an HTTP version, or not "METHOD SP target SP HTTP/D.D" -> 400
 *   a version other than HTTP/1.0 and HTTP/1.1 (HTTP/0.9, 1.2, 2.0...)          -> 505
 *   a request target with a byte outside visible ASCII (0x21-0x7E)              -> 400
 *   a second Authorization, Proxy-Authorization, Content-Type or X-Request-Id    -> 400
 *   HTTP/1.1 without Host, any request with two Host fields, a Host value that
 *   is not uri-host[:port] (RFC 3986 reg-name, IPv4 or IP-literal)              -> 400
 *   Transfer-Encoding on HTTP/1.0, with Content-Length, with an empty list
 *   element, or whose final coding is not a bare "chunked" (or chunked twice)  -> 400
 *   any other coding before the final chunked (gzip, identity, x-foo...)        -> 501
 *   obs-fold (a line starting with SP/HTAB) in the header or trailer section    -> 400
 *   a chunk size over 32 bits (400) or over what remains of max_body (413), as
 *   soon as the chunk-size line is complete
 *   CONNECT -> 405, Upgrade -> 501, any other llhttp error -> 400
 *
 * Trailer fields are validated and counted against the header limits, then dropped: they are never
 * merged into the request's headers (RFC 9110 6.5.1).
 *
 * The verdict does not depend on how the bytes are split between feeds (the fuzz target
 * tests/fuzz/fuzz_http_request.c checks it). Ownership: the parser owns the request being parsed;
 * kvr_http_parse_take() passes it to the caller, who frees it with kvr_http_parse_req_free()
 * (http_server.c fills in its conn and peer). The parser never calls the clock except to stamp
 * req->start_ns, and never touches a socket.
 */
#ifndef KVR_HTTP_PARSE_H
#define KVR_HTTP_PARSE_H

#include "proto/http_limits.h"
#include "proto/http_request.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct kvr_http_parse_s kvr_http_parse_t;

typedef enum {
  KVR_HTTP_PARSE_MORE = 0,
  KVR_HTTP_PARSE_HEAD,
  KVR_HTTP_PARSE_DONE,
  KVR_HTTP_PARSE_REJECT,
} kvr_http_parse_event_t;

/* Where the parser is within a request. */
typedef enum {
  KVR_HTTP_PHASE_IDLE = 0, /* between requests: no byte of the next one seen */
  KVR_HTTP_PHASE_HEAD,     /* request line and header section */
  KVR_HTTP_PHASE_BODY,     /* after HEAD, until DONE */
  KVR_HTTP_PHASE_FAILED,   /* after REJECT; feeding more returns REJECT again */
} kvr_http_parse_phase_t;

/* How to answer a rejected request: an HTTP status (400..505), an OpenAI-style error code and a
 * one-line message. The strings live as long as the parser. */
typedef struct kvr_http_rejection_s {
  int status;
  const char *code;
  const char *message;
} kvr_http_rejection_t;

/* A parser for one connection, enforcing limits (copied; NULL = kvr_http_limits_default()).
 * Never returns NULL. */
kvr_http_parse_t *kvr_http_parse_new(const kvr_http_limits_t *limits);

/* Frees the parser and the request it is parsing, if any. Accepts NULL. */
void kvr_http_parse_free(kvr_http_parse_t *p);

/* Parses up to len bytes of data and stops at the first event. *used gets the number of bytes
 * consumed (len for MORE; up to the end of the head for HEAD, of the request for DONE); feed the
 * rest again after handling the event. After DONE, take the request before feeding again. */
kvr_http_parse_event_t kvr_http_parse_feed(kvr_http_parse_t *p, const char *data, size_t len,
                                           size_t *used);

/* The phase the parser is in (changes only inside kvr_http_parse_feed/_take). */
kvr_http_parse_phase_t kvr_http_parse_phase(const kvr_http_parse_t *p);

/* The request being parsed (head fields filled in as they arrive), or NULL between requests. Used
 * to read a rejected request's x-request-id. */
const kvr_http_req_t *kvr_http_parse_current(const kvr_http_parse_t *p);

/* After DONE: hands the complete request to the caller (who frees it with
 * kvr_http_parse_req_free) and makes the parser ready for the next one. NULL at any other time. */
kvr_http_req_t *kvr_http_parse_take(kvr_http_parse_t *p);

/* After REJECT: the answer to send. */
const kvr_http_rejection_t *kvr_http_parse_rejection(const kvr_http_parse_t *p);

/* Frees a request made by the parser (headers, target, path, body). Accepts NULL. */
void kvr_http_parse_req_free(kvr_http_req_t *req);

/* ---- the rules, pure, exported for unit tests */

/* True when v (a Host field value, OWS already removed) is uri-host [ ":" port ] of RFC 3986:
 * reg-name (unreserved / pct-encoded / sub-delims, possibly empty), IPv4 (a reg-name in form) or
 * IP-literal ("[" IPv6address or IPvFuture "]"), port = *DIGIT. */
bool kvr_http_parse_host_ok(const char *v);

/* Checks the Transfer-Encoding field values vals[0..n) (n >= 1) taken together as one list.
 * Returns 0 when the list is exactly "chunked" (any case, OWS around), else fills *out with 400
 * (empty element, bad token, chunked not final, chunked with parameters or twice) or 501 (another
 * coding before the final chunked) and returns -1. */
int kvr_http_parse_te_check(const char *const *vals, size_t n, kvr_http_rejection_t *out);

#endif

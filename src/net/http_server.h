/* http_server.h -- the HTTP/1.1 server side of kvrouter: listener, client connections, requests.
 *
 * One kvr_http_server_t listens on one address (public API, admin API, or a simulated worker) and
 * owns its client connections. Each connection's bytes go through the request parser
 * (http_parse.h: llhttp plus the RFC 9110/9112 rules llhttp leaves out). The limits are enforced
 * before anything is allocated for them:
 *
 *   request line > max_url        -> 414      headers > max_header_bytes/fields -> 431
 *   Content-Length > max_body     -> 413      malformed / TE+CL / dup CL       -> 400
 *   Upgrade                       -> 501      CONNECT                          -> 405
 *   HTTP version not 1.0 or 1.1   -> 505      no version in the request line   -> 400
 *   Host missing (1.1), twice, or not host[:port]                              -> 400
 *   Transfer-Encoding not ending in chunked, empty element, on HTTP/1.0        -> 400
 *   a coding other than chunked (gzip, identity, ...)                           -> 501
 *   target byte outside 0x21-0x7e, obs-fold, chunk size over 32 bits          -> 400
 *   headers not complete by header_timeout_ms, body idle for header_timeout_ms
 *   or not complete body_timeout_ms after the headers                          -> 408
 *
 * and answers those itself with an OpenAI-style JSON error, then closes the connection. Those
 * answers carry x-request-id: the client's when its headers got that far and it is sane
 * (kvr_http_request_id_ok()), else a generated one, on every listener.
 *
 * Flow of a request:
 *
 *   bytes -> http_parse (llhttp) -> kvr_http_req_t (method, path, headers, buffered body)
 *         -> on_request(req) handler, once the whole body has arrived
 *         -> handler answers with kvr_http_respond()/kvr_http_error() (one shot), or streams with
 *            kvr_http_start() + kvr_http_write()* + kvr_http_finish()
 *
 * Pipelining: requests on one connection are answered strictly in order. While a request is with
 * its handler the connection stops reading; the next pipelined request is parsed from the buffered
 * bytes once the current one is finished.
 *
 * Ownership and lifetime: the handler holds exactly one reference to req from on_request until it
 * calls kvr_http_finish() (kvr_http_respond()/kvr_http_error() call it for you). req stays valid
 * until then even if the client went away: in that case req->on_close (if set) is called once, from
 * the loop (never from inside kvr_http_write()), and further writes fail with KVR_ECLOSED. The
 * connection is freed after both the socket is closed and no request is held.
 *
 * Back-pressure: kvr_http_write() queues bytes on the socket; kvr_http_pending() tells how many are
 * still unwritten. A handler that wants to stop producing sets req->on_drain and is called once the
 * queue falls to zero.
 */
#ifndef KVR_HTTP_SERVER_H
#define KVR_HTTP_SERVER_H

#include "base/buf.h"
#include "proto/http_limits.h"
#include "proto/http_request.h" /* kvr_http_req_t */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct kvr_http_server_s kvr_http_server_t;

/* Creates a server on loop; on_request is called for every complete request with data. Never
 * returns NULL (out of memory aborts, kvr.h). Nothing listens until kvr_http_server_listen(). */
kvr_http_server_t *kvr_http_server_new(uv_loop_t *loop, const kvr_http_limits_t *limits,
                                       kvr_http_request_cb on_request, void *data);

/* Binds and listens on "HOST:PORT" ("127.0.0.1:0" picks a free port, "[::1]:8000" for IPv6).
 * Returns 0 or a negative KVR_E* code; errbuf gets a one-line reason. */
int kvr_http_server_listen(kvr_http_server_t *srv, const char *hostport, char *errbuf,
                           size_t errlen);

/* When on, requests the server rejects itself (400/405/408/413/414/431/501/505 before any handler)
 * are logged as one "access" line each, like handled requests. */
void kvr_http_server_log_rejects(kvr_http_server_t *srv, bool on);

/* Before kvr_http_server_listen(): open the listener with SO_REUSEPORT, so that other processes
 * listening on the same address with it share the port (Linux spreads new connections over them
 * by a hash of the 4-tuple). */
void kvr_http_server_reuse_port(kvr_http_server_t *srv, bool on);

/* The port actually bound (useful after listening on port 0), or -1. */
int kvr_http_server_port(const kvr_http_server_t *srv);

/* Stops accepting, closes idle connections, and lets active requests finish; calls done(data)
 * from the loop when every connection is gone and the server may be freed. */
void kvr_http_server_close(kvr_http_server_t *srv, void (*done)(void *data), void *data);

/* Frees a closed server (after done fired). Accepts NULL. */
void kvr_http_server_free(kvr_http_server_t *srv);

/* New connections refused in this process: by_limit, those answered 503 at max_connections;
 * otherwise those the OS refused to accept (EMFILE, ENFILE). Each episode is logged once. */
uint64_t kvr_http_refused_total(bool by_limit);

/* Number of open client connections and of requests held by handlers. */
size_t kvr_http_server_connections(const kvr_http_server_t *srv);

/* Case-insensitive header lookup; returns the first value or NULL. */
const char *kvr_http_header(const kvr_http_req_t *req, const char *name);

/* Sends a complete response with Content-Length and finishes the request. extra_headers is either
 * NULL or a block of "Name: value\r\n" lines. content_type may be NULL (no Content-Type). */
void kvr_http_respond(kvr_http_req_t *req, int status, const char *content_type,
                      const char *extra_headers, const void *body, size_t len);

/* Sends an OpenAI-style error {"error":{"message","type","code"}} and finishes the request. code
 * may be NULL (JSON null); type defaults from the status (invalid_request_error, server_error,
 * ...). */
void kvr_http_error(kvr_http_req_t *req, int status, const char *type, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Like kvr_http_error() but also adds extra_headers (e.g. "Retry-After: 1\r\n"). */
void kvr_http_error_h(kvr_http_req_t *req, int status, const char *extra_headers, const char *type,
                      const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Builds the OpenAI-style error body into out (no HTTP framing): kvr_openai_error_body(), which
 * owns the format. */
void kvr_http_error_body(kvr_buf_t *out, const char *message, const char *type, const char *code);

/* Default error "type" for a status: 4xx invalid_request_error, 404 not_found_error,
 * 503 service_unavailable, others server_error. */
const char *kvr_http_error_type(int status);

/* Reason phrase for a status code ("Bad Request"). */
const char *kvr_http_reason(int status);

/* Starts a streamed response: status line, the given header block ("Name: value\r\n"...; may be
 * NULL), and Transfer-Encoding: chunked (HTTP/1.1) or connection-close framing (HTTP/1.0). Returns
 * 0 or KVR_ECLOSED. Must not be called twice. */
int kvr_http_start(kvr_http_req_t *req, int status, const char *headers);

/* Queues body bytes of a streamed response (one chunk). Returns 0 or KVR_ECLOSED. Never calls the
 * request's callbacks synchronously. */
int kvr_http_write(kvr_http_req_t *req, const void *data, size_t len);

/* Bytes queued on the client socket and not yet written. */
size_t kvr_http_pending(const kvr_http_req_t *req);

/* Ends the response (terminating chunk if chunked) and releases the handler's reference. If the
 * response was never started, a 500 error is sent. */
void kvr_http_finish(kvr_http_req_t *req);

/* Releases the handler's reference and closes the connection without a clean end, so the client's
 * HTTP framing shows the body as truncated (used when a body already started cannot be completed).
 */
void kvr_http_abort(kvr_http_req_t *req);

/* ---- request ids (pure) */

/* True when v is acceptable as a request id taken from a client: 1..KVR_HTTP_REQUEST_ID_MAX
 * characters, each printable ASCII other than space (0x21-0x7e), so it is safe in a header and in
 * a logfmt line. */
bool kvr_http_request_id_ok(const char *v);

/* Writes a new request id into out (KVR_HTTP_REQUEST_ID_GEN_LEN hex digits + NUL; outlen must be
 * larger) from the generator state *state (splitmix64; advanced twice). Seed the state from
 * kvr_random_seed() (base/kvr.h). */
void kvr_http_request_id_gen(uint64_t *state, char *out, size_t outlen);

/* Sets req->request_id: the client's x-request-id when kvr_http_request_id_ok(), else a new one
 * from *state. Returns true when the client's was kept. */
bool kvr_http_request_id_assign(kvr_http_req_t *req, uint64_t *state);

#endif

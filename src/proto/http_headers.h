/* http_headers.h -- HTTP header semantics of a reverse proxy: what is forwarded, what is dropped.
 *
 * Pure functions over header names, values and "Name: value\r\n" blocks; no sockets, no loop, no
 * libcurl. The proxy (proxy.c) calls them on both sides of a transfer:
 *
 *   client request headers  -> kvr_http_headers_upstream()      -> lines for the worker
 *   worker response fields  -> kvr_http_headers_response_field() -> kept block + Connection names
 *   end of the response head -> kvr_http_headers_drop_named()     -> kept block for the client
 *
 * Hop-by-hop headers (RFC 9110 7.6.1) are never forwarded in either direction: Connection and every
 * header it names, Keep-Alive, TE, Trailer(s), Transfer-Encoding, Upgrade, and Proxy-*. Header
 * names compare case-insensitively (ASCII) everywhere.
 */
#ifndef KVR_HTTP_HEADERS_H
#define KVR_HTTP_HEADERS_H

#include "base/buf.h"

#include <stdbool.h>
#include <stddef.h>

/* One request header field as the listener received it. */
typedef struct kvr_http_header_s {
  char *name; /* owned by the request, NUL-terminated */
  char *value;
} kvr_http_header_t;

/* True if name is a hop-by-hop header by itself: Connection, Keep-Alive, TE, Trailer, Trailers,
 * Transfer-Encoding, Upgrade, or any name starting with "Proxy-". */
bool kvr_http_headers_hop_by_hop(const char *name);

/* True if name is listed in a Connection header among the n headers (those are hop-by-hop too).
 * A Connection value is a list of tokens separated by commas, spaces or tabs, in any mix. */
bool kvr_http_headers_connection_names(const kvr_http_header_t *headers, size_t n,
                                       const char *name);

/* True if s contains a CR or LF (a value that would split a header line). */
bool kvr_http_headers_has_ctl(const char *s);

/* Receives one header line for the upstream request (NUL-terminated, valid during the call). */
typedef void (*kvr_http_headers_line_cb)(void *data, const char *line);

/* Calls cb once per line of the request headers to send to a worker, in the client's order, then
 * once for X-Forwarded-For. Dropped: hop-by-hop headers and those Connection names, Host and
 * Content-Length (the upstream client sets them), Expect (the body is already buffered),
 * Accept-Encoding (the proxy reads the answer, so it must not be compressed), and any header with a
 * CR or LF. Lines are in the form libcurl's header list takes: "Name: value", or "Name;" for an
 * empty value (a bare "Name:" would remove the header instead). X-Forwarded-For is the client's
 * last X-Forwarded-For value with ", <peer>" appended, or just the peer. */
void kvr_http_headers_upstream(const kvr_http_header_t *headers, size_t n, const char *peer,
                               kvr_http_headers_line_cb cb, void *data);

/* Filters one header field line of a worker's response ("Name: value", with or without its CRLF).
 * The value is trimmed (leading spaces and tabs, trailing CR, LF and spaces). A Connection field
 * adds its names to conn_tokens, lower case and without blanks, as ",a,b," (appended to across
 * fields). Kept fields are appended to kept as "Name: value\r\n"; dropped are the hop-by-hop ones,
 * Date, X-Kvrouter-Worker (the proxy adds its own when configured), and Content-Length unless
 * head_req (the router frames bodies itself; a HEAD answer's length describes the GET body, RFC
 * 9110 9.3.2). Lines without a colon, or whose name is empty or 128 bytes or longer, are ignored.
 * Returns true for a Content-Type that starts with text/event-stream (any case). */
bool kvr_http_headers_response_field(kvr_buf_t *kept, kvr_buf_t *conn_tokens, const char *line,
                                     size_t len, bool head_req);

/* Removes from kept (a block of "Name: value\r\n" lines) every line whose name is in conn_tokens
 * (as built by kvr_http_headers_response_field; nothing happens when it is empty). Names of 120
 * bytes or more are never removed. Call it once the head is complete: Connection may come after
 * the headers it names. */
void kvr_http_headers_drop_named(kvr_buf_t *kept, const kvr_buf_t *conn_tokens);

/* ---- the worker's response head, checked (RFC 9110 / RFC 9112) --------------------------------
 *
 * Every line of a worker's head passes through here before anything of it reaches a client, so a
 * worker (or whatever sits on the path to it) cannot smuggle a header or a second message past the
 * filters above by bytes a client's parser reads differently from libcurl's (which splits lines at
 * LF only). A verdict other than OK makes the answer a 502 and the connection is not reused. */
#define KVR_HTTP_RESP_ERR_MAP(XX)                                                                  \
  XX(OK, "ok")                                                                                     \
  XX(STATUS_LINE, "status_line")       /* not "HTTP/D[.D] SP 3DIGIT [SP reason]" */                \
  XX(STATUS_CODE, "status_code")       /* a status below 100 or above 599 */                       \
  XX(SWITCHING, "switching")           /* 101: the router never asks a worker to switch */         \
  XX(INTERIM_ONLY, "interim_only")     /* the answer ended after a 1xx, without a final status */  \
  XX(HEADER_NAME, "header_name")       /* a field name that is empty or not a token */             \
  XX(HEADER_VALUE, "header_value")     /* a control byte other than HTAB in a value (a bare CR) */ \
  XX(OBS_FOLD, "obs_fold")             /* a line starting with SP or HTAB */                       \
  XX(CONTENT_LENGTH, "content_length") /* not digits, or two that differ */                        \
  XX(TE_AND_CL, "te_and_cl")           /* Transfer-Encoding and Content-Length together */         \
  XX(HEAD_SIZE, "head_size") /* over KVR_HTTP_RESP_HEAD_MAX bytes or _FIELDS_MAX fields */         \
  XX(MALFORMED, "malformed") /* a head libcurl refused first (NUL, no HTTP status) */

typedef enum {
#define XX(name, str) KVR_HTTP_RESP_##name,
  KVR_HTTP_RESP_ERR_MAP(XX)
#undef XX
      KVR_HTTP_RESP_ERR_COUNT
} kvr_http_resp_err_t;

/* The largest head a worker may send: vLLM's are a few hundred bytes; a client's is bounded at
 * 32 KiB by default (kvr_http_limits_t). */
#define KVR_HTTP_RESP_HEAD_MAX (64u * 1024u)
#define KVR_HTTP_RESP_FIELDS_MAX 200u

/* "content_length" for KVR_HTTP_RESP_CONTENT_LENGTH; "unknown" out of range. */
const char *kvr_http_resp_err_name(kvr_http_resp_err_t e);

/* The state of one response head being checked; zero it (or let kvr_http_resp_status() reset it)
 * at each status line. */
typedef struct kvr_http_resp_check_s {
  int status; /* the last status line's code, 0 before one */
  bool have_cl, have_te;
  unsigned long long cl; /* the Content-Length, when have_cl */
  size_t bytes, fields;  /* of this head so far (status line included) */
} kvr_http_resp_check_t;

/* A status line (with or without its CRLF): sets st->status and forgets the previous head's
 * fields. OK for 100..599 except 101; a 1xx other than 101 is an interim head to consume. */
kvr_http_resp_err_t kvr_http_resp_status(kvr_http_resp_check_t *st, const char *line, size_t len);

/* One field line (with or without its CRLF, exactly one trailing CRLF or LF is stripped). */
kvr_http_resp_err_t kvr_http_resp_field(kvr_http_resp_check_t *st, const char *line, size_t len);

/* The blank line that ends a head: the checks that need the whole head (TE with CL). */
kvr_http_resp_err_t kvr_http_resp_end(const kvr_http_resp_check_t *st);

#endif

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

#endif

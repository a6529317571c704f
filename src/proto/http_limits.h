/* http_limits.h -- the limits a kvrouter HTTP listener enforces, as plain data.
 *
 * Apart from http_server.h so that configuration (config.h) and the router core can carry them
 * without pulling in the listener and libuv. kvr_http_limits_default() is implemented by the
 * request parser (http_parse.c), which enforces the size limits; the listener (http_server.c)
 * enforces the timeouts and the connection count.
 */
#ifndef KVR_HTTP_LIMITS_H
#define KVR_HTTP_LIMITS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvr_http_limits_s {
  size_t max_url;                /* request-target bytes; default 8192 */
  size_t max_header_bytes;       /* all header names+values; default 32768 */
  size_t max_header_fields;      /* default 100 */
  size_t max_body;               /* default 8 MiB */
  uint64_t header_timeout_ms;    /* first byte to end of headers, and the longest pause while a
                                    body streams in; default 10000 */
  uint64_t body_timeout_ms;      /* end of headers to end of body, in total (a body trickled in
                                    slower than this gets 408); default 60000; 0 = no limit */
  uint64_t keepalive_timeout_ms; /* idle between requests; default 75000 */
  size_t max_connections;        /* default 4096; 0 = unlimited; over it new clients get 503 and
                                    close */
  size_t max_body_buffer; /* bytes allocated for request bodies still being received, over every
                             connection of a listener; a request that would go over gets 503
                             with Retry-After and the connection closes; default 256 MiB; 0 =
                             unlimited */
} kvr_http_limits_t;

/* Fills limits with the defaults above. */
void kvr_http_limits_default(kvr_http_limits_t *limits);

#endif

/* url.h -- every URL and host:port rule of the router, in one place (pure: no socket, no loop).
 *
 * The router is given addresses in four forms, and each is checked and normalised once, here:
 *   worker URLs     http(s)://HOST[:PORT]      --worker, the config file, POST /admin/workers,
 *                                              discovered addresses, peers' worker lists
 *   the --discover URL  http(s)://NAME:PORT    a DNS name whose addresses are the workers
 *   KV-event endpoints  tcp://HOST:PORT | ipc://PATH   a worker's ZMQ publisher and replay socket
 *   listen addresses    HOST:PORT | [V6]:PORT  --listen, --admin-listen, --peer-sync-listen
 * A worker URL's normal form is what identifies the worker: two spellings of one endpoint give
 * one normal form. URL syntax is libcurl's URL API (curl_url), not a parser of our own.
 */
#ifndef KVR_URL_H
#define KVR_URL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Checks a worker URL with libcurl's URL parser: http:// or https://, a host, an optional port in
 * 1..65535, no user info, no path beyond "/", no query or fragment. On success writes the
 * normalized form "scheme://host[:port]" (scheme and host as libcurl gives them, no trailing
 * slash; an IPv6 zone id kept as "[addr%25zone]") into out; else KVR_EINVAL with one line naming
 * the URL in err. Refused besides: an empty authority ("http:///x", which libcurl reads as host
 * x) and a host ending in a dot ("127.0.0.1." would be a second worker beside "127.0.0.1"). */
int kvr_url_worker(const char *url, char *out, size_t outlen, char *err, size_t errlen);

/* The target of --discover URL: scheme ("http"/"https"), host and port. */
typedef struct kvr_url_target_s {
  char scheme[8];
  char host[256]; /* as in the URL, without IPv6 brackets */
  int port;
} kvr_url_target_t;

/* Parses a --discover URL: http:// or https://, a host, an explicit port (there is no default:
 * vLLM listens where it is told), no path, query or user info. Returns 0 or KVR_EINVAL with one
 * line naming the URL in err. */
int kvr_url_discovery(const char *url, kvr_url_target_t *t, char *err, size_t errlen);

/* A KV-event endpoint the router connects to: tcp://HOST:PORT (no wildcard) or ipc://PATH. */
int kvr_url_kv_endpoint(const char *ep, char *err, size_t errlen);

/* The endpoint data-parallel rank `rank` of an engine publishes on, given the one configured for
 * the server (vLLM's ZmqEventPublisher.offset_endpoint_port, vllm/distributed/kv_events.py): rank 0
 * keeps it, tcp://HOST:PORT becomes tcp://HOST:(PORT + rank), ipc://PATH becomes
 * ipc://PATH_dp<rank> (recent vLLM's and kvrouter sim's naming; older vLLM suffixed only inproc://
 * endpoints, leaving N engines one ipc path they cannot all bind). ep must pass
 * kvr_url_kv_endpoint. Returns 0, or KVR_EINVAL with err when the port would pass 65535 or out is
 * too small. */
int kvr_url_kv_endpoint_rank(const char *ep, uint32_t rank, char *out, size_t outlen, char *err,
                             size_t errlen);

/* Parses "HOST:PORT" / "[V6]:PORT" into a sockaddr_storage. Returns 0 or KVR_EINVAL. */
int kvr_url_hostport(const char *hostport, struct sockaddr_storage *out);

#endif

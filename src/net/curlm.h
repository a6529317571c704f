/* curlm.h -- libcurl's multi-socket API driven by a libuv loop (the upstream client side).
 *
 * One kvr_curlm_t wraps one CURLM. As in curl's docs/examples/multi-uv.c it keeps one uv_timer_t
 * for curl's timeout and one uv_poll_t per socket curl asks to watch. Connections to the same host
 * are kept alive and reused by curl's connection cache.
 *
 * A transfer is an easy handle the caller configures (URL, headers, write callback...) and then
 * hands over with kvr_curlm_add(). When curl reports it finished, the easy handle is removed from
 * the multi *before* done() is called, so done() may free or reuse it. If kvr_curlm_add() fails,
 * done() is never called.
 *
 * Cancelling: kvr_curlm_cancel() removes a transfer at once; done() is not called afterwards. It
 * must not be called from inside one of curl's own callbacks (write/header/read) for that handle:
 * from there, return an error from the callback instead (curl then finishes the transfer with an
 * error and done() fires).
 */
#ifndef KVR_CURLM_H
#define KVR_CURLM_H

#include <curl/curl.h>
#include <uv.h>

/* CURLOPT_MAXAGE_CONN of every transfer (set by kvr_curlm_add()): a pooled connection idle for
 * more than this many whole seconds, i.e. for 4 s or more, is closed rather than reused; below the
 * 5 s keep-alive of vLLM's HTTP server. */
#define KVR_CURL_MAX_IDLE_S 3L

typedef struct kvr_curlm_s kvr_curlm_t;

/* Called once per finished transfer with curl's result; easy is no longer in the multi. */
typedef void (*kvr_curlm_done_cb)(CURL *easy, CURLcode result, void *data);

/* Creates the multi on loop. Returns NULL when curl cannot be initialised (out of memory aborts,
 * kvr.h). Calls curl_global_init() once per process. */
kvr_curlm_t *kvr_curlm_new(uv_loop_t *loop);

/* Adds a configured easy handle. Returns 0, or KVR_EIO if curl refused it and KVR_ECLOSED after
 * kvr_curlm_close() (done is never called then). Sets CURLOPT_PRIVATE, CURLOPT_MAXAGE_CONN and the
 * open/close socket callbacks (CURLOPT_OPENSOCKETFUNCTION, CURLOPT_CLOSESOCKETFUNCTION and their
 * data: each connection's poll handle lives as long as its socket); callers must not set those. An
 * easy handle may be added again after its done() or kvr_curlm_cancel(). */
int kvr_curlm_add(kvr_curlm_t *m, CURL *easy, kvr_curlm_done_cb done, void *data);

/* Removes a transfer that has not finished; done() is not called for it. Not from curl callbacks.
 */
void kvr_curlm_cancel(kvr_curlm_t *m, CURL *easy);

/* Number of transfers added and not yet finished or cancelled. */
size_t kvr_curlm_active(const kvr_curlm_t *m);

/* Cancels every remaining transfer (without done callbacks), closes the uv handles and frees m once
 * they are closed. The loop must run afterwards for the close callbacks. Accepts NULL. */
void kvr_curlm_close(kvr_curlm_t *m);

/* The one easy-handle setup of kvrouter (proxy, scraper, admin fan-out, load generator, monitor,
 * demo): a new handle for url with the options every transfer shares: no signals (we are
 * single-threaded on a loop), HTTP/1.1 over http or https (verified against the system's CAs or
 * kvr_curl_set_ca_file()'s), TCP_NODELAY, the given connect and
 * total timeouts in ms (0 = none), and the body delivered to write(data) (NULL: discarded).
 * The caller adds what its transfer needs (method, body, headers, header callback). Never returns
 * NULL (out of memory aborts, kvr.h). */
CURL *kvr_curl_easy_new(const char *url, long connect_timeout_ms, long timeout_ms,
                        curl_write_callback write, void *data);

/* Sets the CA bundle (PEM file) that verifies https:// peers of every later kvr_curl_easy_new()
 * handle (CURLOPT_CAINFO); NULL restores libcurl's default. Process-wide: `serve` sets it once at
 * start from --worker-ca-file. */
void kvr_curl_set_ca_file(const char *path);

/* curl_slist_append() under the out-of-memory contract (kvr.h): returns the list with line (copied)
 * appended, never NULL. l may be NULL (a new list). */
struct curl_slist *kvr_curl_slist_append(struct curl_slist *l, const char *line);

/* Sets max total connections and max per host (0 = unlimited). */
void kvr_curlm_set_limits(kvr_curlm_t *m, long max_total, long max_per_host);

#endif

/* discovery.h -- workers found by resolving a DNS name (a Kubernetes headless Service)
 * periodically.
 *
 * `--discover http://vllm-workers.llm.svc.cluster.local:8000` names one host and one port. The
 * host is resolved with uv_getaddrinfo() (libuv's thread pool: the loop never blocks) every
 * --discover-interval-ms; each address of the answer, IPv4 or IPv6, becomes the worker
 * "SCHEME://ADDR:PORT" ("http://[fd00::5]:8000" for IPv6), with, when --discover-kv-events-port
 * (and --discover-kv-replay-port) are given, the KV-event endpoints tcp://ADDR:N derived from the
 * same address. The worker URL holds the address, so libcurl sends "Host: ADDR:PORT"; the name is
 * not kept (vLLM ignores Host; an https:// worker's certificate must then name the pod's address).
 *
 * Each answer is compared with the discovered set (kvr_discovery_diff(), a pure function):
 *   - an address that is new is added as a worker through kvr_router_add_worker(), the call the
 *     admin API and the SIGHUP reload use;
 *   - an address that is gone is drained through kvr_router_drain_worker() (no new requests, its
 *     requests in flight finish, then the router frees it), unless the static worker list names the
 *     same URL;
 *   - an error or an empty answer keeps the set as it is (a DNS hiccup never removes every worker),
 *     logs one line and counts in kvrouter_discovery_resolutions_total{result="error"|"empty"}.
 * Static --worker entries and admin-added workers live beside the discovered ones; a discovered
 * address that is already served (a static worker with the same URL) is not added twice.
 *
 * At start the router serves with the static workers alone (none at all is allowed with
 * --discover): /health answers 503 until the name resolves. With an interval of 0 the name is
 * resolved until the first answer with addresses (retrying every second after an error or an
 * empty answer), then never again.
 *
 * Lifetime: kvr_discovery_new() on the loop, kvr_discovery_apply() after each SIGHUP reload (the
 * live configuration may have changed or removed the discovery settings), kvr_discovery_close()
 * before the router is freed; the object frees itself once its timer is closed and no resolution
 * is in flight (a getaddrinfo running in the thread pool cannot be stopped, only waited for).
 */
#ifndef KVR_DISCOVERY_H
#define KVR_DISCOVERY_H

#include "base/buf.h"
#include "core/config.h"
#include "core/router.h"

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <uv.h>

/* Most addresses of one answer that are considered (the rest are ignored, with a warning). */
#define KVR_DISCOVERY_MAX_ADDRS 256

/* ---- pure parts (unit-tested) ------------------------------------------------------------------
 */

/* What an answer changes: indexes into the answer (adds) and into the current set (removes). */
typedef struct kvr_discovery_diff_s {
  size_t *adds; /* caller's array of at least nanswer entries */
  size_t nadds;
  size_t *removes; /* caller's array of at least ncur entries */
  size_t nremoves;
} kvr_discovery_diff_t;

/* Compares the current set cur[0..ncur) (distinct strings) with an answer ans[0..nans) (may hold
 * duplicates, in any order): adds are the first occurrence of each answer entry not in cur,
 * removes the cur entries not in the answer. An empty answer (nans == 0) changes nothing: no adds,
 * no removes. Order-insensitive: the same sets give the same adds and removes. */
void kvr_discovery_diff(const char *const *cur, size_t ncur, const char *const *ans, size_t nans,
                        kvr_discovery_diff_t *d);

/* Writes addr (AF_INET or AF_INET6; its port is ignored) as a URL host: "10.0.0.5" or
 * "[fd00::5]". Returns 0 or KVR_EINVAL (another family, or out too small). */
int kvr_discovery_addr_host(const struct sockaddr *addr, char *out, size_t outlen);

/* ---- the resolver on the loop ------------------------------------------------------------------
 */

typedef struct kvr_discovery_s kvr_discovery_t;

/* Creates the discovery of cfg (which must outlive it, and may be changed by a reload) feeding r,
 * and resolves at once when cfg->discover_url is set. Never returns NULL (out of memory aborts). */
kvr_discovery_t *kvr_discovery_new(uv_loop_t *loop, kvr_router_t *r, const kvr_config_t *cfg);

/* Brings the discovery to cfg's settings after a reload: a new name or port resolves at once (the
 * old set stays until the new name answers); no name any more drains every discovered worker the
 * static list does not name; changed KV-event ports are set on the discovered workers. */
void kvr_discovery_apply(kvr_discovery_t *d);

/* Whether url is in the discovered set (the reload keeps such workers). d may be NULL. */
bool kvr_discovery_has(const kvr_discovery_t *d, const char *url);

/* Stops resolving; frees d once its timer is closed and a resolution in flight has returned, its
 * answer ignored. The router is not touched any more from this call on. Accepts NULL. */
void kvr_discovery_close(kvr_discovery_t *d);

/* Appends kvrouter_discovery_resolutions_total{result} and kvrouter_discovery_workers (process-
 * wide, like the reload counters: one `serve` per process). */
void kvr_discovery_metrics(kvr_buf_t *out);

#endif

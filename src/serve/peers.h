/* peers.h -- the load other router replicas put on the workers (--peer), read on serve's loop.
 *
 * Several `kvrouter serve` replicas in front of the same workers each see only the requests they
 * routed. With precise mode they share the cache state (every replica reads the engines' events);
 * this shares the load: every peer_interval_ms each replica reads each peer's GET /admin/load
 * (that peer's own in-flight requests and token figures per worker, keyed by worker URL, with the
 * admin bearer token when one is configured) and reports it to its router
 * (kvr_router_on_peer_load), whose snapshots add the figures fresher than peer_stale_ms to its own.
 * Each row also carries the peer's last scrape of the worker, adopted when fresher than this
 * replica's own, so replicas weigh the same engine figures.
 * No external store: a peer that stops answering simply ages out. Every replica may be given the
 * same list, itself included: /admin/load carries a random per-process instance id, and a replica
 * that reads its own id ignores that address.
 *
 *   timer -> GET PEER/admin/load (curl multi) -> JSON rows -> kvr_router_on_peer_load
 */
#ifndef KVR_PEERS_H
#define KVR_PEERS_H

#include "core/router.h"
#include "net/curlm.h"

#include <uv.h>

typedef struct kvr_peers_s kvr_peers_t;

/* Starts polling cfg's peers (none: nothing runs). r and its cfg outlive it. Never NULL. */
kvr_peers_t *kvr_peers_new(uv_loop_t *loop, kvr_curlm_t *curlm, kvr_router_t *r);

/* Cancels the polls in flight (outside curl callbacks) and closes the timer; the memory goes once
 * it closed. Accepts NULL. */
void kvr_peers_close(kvr_peers_t *p);

/* Parses a GET /admin/load answer into rows (urls point into *json_out, which the caller frees
 * with cJSON_Delete) and the answering replica's instance (0 when absent). Returns the row count,
 * or -1. Pure. */
int kvr_peers_parse(const char *text, size_t len, kvr_peer_row_t *rows, size_t max,
                    uint64_t *instance, void **json_out);

#endif

/* kv_feed.h -- feeds the router's precise index from every worker's KV-event stream.
 *
 * One kvr_kv_sub_t (kv_sub.h) per worker that has a kv_events endpoint, on one ZMQ context:
 *
 *   worker's PUB --kv_sub--> batch --kvr_router_on_kv_batch--> router's kv_index (that slot)
 *                       \--> reset --kvr_router_on_kv_reset + on_kv_mode(false, reason)
 *   every 250 ms: reconcile the subs with the router's workers (added by config, admin or reload;
 *                 removed; endpoints changed) and push each stream's mode and counters to the
 *                 router (kvr_router_on_kv_mode, kvr_router_on_kv_stats), which the admin view
 *                 and /metrics read.
 *
 * The router stays the one owner of routing state; this module only owns sockets and timers.
 */
#ifndef KVR_KV_FEED_H
#define KVR_KV_FEED_H

#include "core/router.h"

#include <uv.h>

typedef struct kvr_kv_feed_s kvr_kv_feed_t;

/* Starts on loop for r's workers (r and its cfg outlive the feed). Never NULL. */
kvr_kv_feed_t *kvr_kv_feed_new(uv_loop_t *loop, kvr_router_t *r);

/* Closes every stream and the timer; the memory goes once the handles closed (the loop must run).
 * Accepts NULL. */
void kvr_kv_feed_close(kvr_kv_feed_t *f);

#endif

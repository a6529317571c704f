/* peer_sync.h -- replicas announce every request they route to each other, as it happens.
 *
 * Polling a peer's GET /admin/load (peers.h) gives its load as it was up to peer_interval_ms ago;
 * two replicas then weigh the same worker differently by a whole request's prefill, and pick
 * different workers for the same request (bench/results/replicas: 75% agreement). With
 * --peer-sync-listen each replica publishes its own requests' lifecycle on a ZMQ PUB socket, and
 * subscribes to every peer's, so each replica carries its peers' in-flight requests in its own
 * accounting (router.h: kvr_worker_t.synced[p] and the shared prefill clock) within a loopback
 * or pod-network hop, as NVIDIA Dynamo's router replicas share their active sequences.
 *
 *   router dispatch / first token / end (kvr_router_t.sync_hook)
 *     -> own table + PUB: D [1, instance, seq, id, worker url, prompt tokens, prefill tokens]
 *                         F [2, instance, seq, id]   (first token: its prefill is done)
 *                         E [3, instance, seq, id]   (ended, however)
 *   scrape of a worker -> PUB: C [4, instance, seq, url, running, waiting, kv usage]
 *                         (adopted by the peers: replicas weigh the same engine figures, not
 *                         each its own scrape taken at another moment)
 *   every peer_interval_ms -> PUB: S [0, instance, seq, [[id, url, prompt, prefill], ...]]
 *                         (the whole open set: a late joiner or a gap is repaired by the next one)
 *   SUB (connected to each peer's advertised sync port, learned by its /admin/load poll)
 *     -> peer p = the peer whose instance sent it -> kvr_router_on_peer_dispatch / on_token /
 *        on_end on p's records; p becomes live at its first snapshot (router peer_sync_live[p]:
 *        its polled figures are then not used), and is dropped (records ended, back to polled
 *        figures) when silent for peer_stale_ms or when its instance changes (a restart).
 *
 * Messages are msgpack arrays, sent back to back in one ZMQ frame per loop iteration (no topic):
 * what the iteration's requests published leaves together at the next one, so the ZMQ I/O thread
 * wakes once per iteration, not once per message. Unknown kinds, a wrong shape or an unknown
 * instance are counted and skipped; a frame whose rest cannot be split is counted once and
 * dropped; a sequence gap is counted and left to the next snapshot.
 */
#ifndef KVR_PEER_SYNC_H
#define KVR_PEER_SYNC_H

#include "core/router.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef enum {
  KVR_SYNC_MSG_SNAPSHOT = 0,
  KVR_SYNC_MSG_DISPATCH = 1,
  KVR_SYNC_MSG_FIRST = 2,
  KVR_SYNC_MSG_END = 3,
  KVR_SYNC_MSG_SCRAPE = 4
} kvr_sync_kind_t;

typedef struct kvr_sync_entry_s {
  uint64_t id, prompt_tokens, prefill_tokens; /* prefill 0: the first token came */
  const char *url;                            /* into the message's storage */
} kvr_sync_entry_t;

/* One decoded message; entries (a snapshot's, or the one of a dispatch) point into priv. */
typedef struct kvr_sync_msg_s {
  kvr_sync_kind_t kind;
  uint64_t instance, seq, id;
  /* a scrape's: the worker and its figures */
  const char *url;
  double running, waiting, kv_cache_usage;
  kvr_sync_entry_t *entries;
  size_t nentries;
  void *priv;
} kvr_sync_msg_t;

/* Decodes one message; 0, or -1 with a one-line reason (msg left empty). Pure. */
int kvr_peer_sync_decode(const void *data, size_t len, kvr_sync_msg_t *msg, char *err,
                         size_t errlen);
void kvr_peer_sync_msg_free(kvr_sync_msg_t *msg);

/* Encodes a message into *out (malloc'd, *outlen bytes). Pure. */
void kvr_peer_sync_encode(const kvr_sync_msg_t *msg, void **out, size_t *outlen);

typedef struct kvr_peer_sync_s kvr_peer_sync_t;

/* Starts the replica sync of r when its config has a peer_sync_listen endpoint: binds the PUB
 * socket (port advertised in /admin/load), hooks the router, and ticks every peer_interval_ms.
 * loop NULL: no sockets and no timer (tests drive kvr_peer_sync_receive / _tick). Returns NULL
 * when sync is off; on a bind failure, NULL with err set. */
kvr_peer_sync_t *kvr_peer_sync_new(uv_loop_t *loop, kvr_router_t *r, char *err, size_t errlen);

/* One frame from a peer (what the SUB socket hands over): one or more messages back to back. */
void kvr_peer_sync_receive(kvr_peer_sync_t *s, const void *data, size_t len);

/* The periodic work: connect to newly learned peers, drop silent ones, publish a snapshot. */
void kvr_peer_sync_tick(kvr_peer_sync_t *s);

/* With loop NULL, every message this replica would publish goes to fn instead, one frame per
 * message (tests). */
void kvr_peer_sync_set_sink(kvr_peer_sync_t *s, void (*fn)(void *ctx, const void *, size_t),
                            void *ctx);

/* Ends every synced record, unhooks the router, closes the sockets. Accepts NULL. */
void kvr_peer_sync_close(kvr_peer_sync_t *s);

#endif

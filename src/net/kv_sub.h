/* kv_sub.h -- one worker's KV-event stream: a ZMQ SUB (and a replay DEALER) on the libuv loop.
 *
 * Flow: engine PUB --3 frames--> SUB (uv_poll on ZMQ_FD, drained while ZMQ_EVENTS has POLLIN)
 *         -> sequence check -> kv_decode -> on_batch(batch) (the router applies it to the worker's
 *            precise index)
 *       a gap or a missing history -> DEALER ["", start] -> replay replies, then the live
 *            messages held meanwhile -> on_batch ...; what cannot be recovered -> on_reset()
 *            (the router clears the worker's precise index) and a fallback period.
 *
 * Sequence rules (vLLM's publisher, ../shared/KV-EVENTS.md): one sequence number per batch from 0
 * per publisher process; live delivery is in order, so on the live socket
 *   seq == last + 1   apply
 *   seq >  last + 1   a gap: replay from last + 1 (or, without a replay endpoint, reset)
 *   seq <= last       the publisher restarted: reset, then treat seq as a first message
 *   first message     seq 0: the whole history is here; seq > 0: replay from 0 (or reset)
 * and on replay replies (at least once) seq <= last is dropped; a reply stream that starts after
 * the requested start, or an empty one for a start the live stream already passed, means the
 * batches were evicted from the publisher's buffer: reset. A replay that does not end within
 * replay_timeout_ms is abandoned: reset. Both reply forms are accepted: ["", topic, seq, payload]
 * (vLLM 0.26) and ["", seq, payload], each stream ended by seq 2^64-1.
 *
 * First contact: with a replay endpoint the stream asks for everything from seq 0 as soon as it
 * opens (re-asked every replay_timeout_ms until answered, e.g. while the engine starts): batches
 * bring the engine's history, an empty answer says it has none (a fresh engine) -- complete
 * either way. Without one it waits for seq 0, or takes a later first batch as NO_HISTORY.
 *
 * Mode (kvr_kv_sub_mode): PRECISE once the stream is known complete (from seq 0, or recovered by
 * replay); otherwise FALLBACK, with a reason, until refill_ms after the last reset (the engine's
 * cache refills with blocks the events then report) -- the router uses its approximate index for
 * that worker meanwhile. A stream with no message yet is FALLBACK ("waiting").
 */
#ifndef KVR_KV_SUB_H
#define KVR_KV_SUB_H

#include "proto/kv_decode.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define KVR_KV_FALLBACK_MAP(XX)                                                                    \
  XX(NONE, "none")                     /* precise */                                               \
  XX(WAITING, "waiting")               /* no message yet */                                        \
  XX(NO_HISTORY, "no_history")         /* joined a running publisher without replay */             \
  XX(GAP, "gap")                       /* batches lost and not replayed */                         \
  XX(EVICTED, "evicted")               /* the replay buffer no longer had them */                  \
  XX(REPLAY_TIMEOUT, "replay_timeout") /* the replay socket did not answer */                      \
  XX(RESTART, "restart")               /* the publisher restarted mid-history */                   \
  XX(DECODE, "decode_error")           /* a batch that was not an EventBatch */

typedef enum {
#define KVR__KV_FB_ENUM(name, str) KVR_KV_FALLBACK_##name,
  KVR_KV_FALLBACK_MAP(KVR__KV_FB_ENUM)
#undef KVR__KV_FB_ENUM
      KVR_KV_FALLBACK_COUNT
} kvr_kv_fallback_t;

const char *kvr_kv_fallback_name(kvr_kv_fallback_t f);

typedef struct kvr_kv_sub_opts_s {
  const char *endpoint;        /* the engine's PUB, e.g. tcp://10.0.0.5:5557 (connected) */
  const char *replay_endpoint; /* its replay ROUTER, or NULL */
  const char *topic;           /* subscription prefix; NULL or "" = every topic */
  uint64_t replay_timeout_ms;  /* 0 = 2000 */
  uint64_t refill_ms;          /* fallback period after a reset; 0 = 30000 */
  size_t max_held;             /* live batches held during a replay; 0 = 10000 */
} kvr_kv_sub_opts_t;

typedef struct kvr_kv_sub_s kvr_kv_sub_t;

/* on_batch: apply b (valid during the call only); on_reset: forget everything the worker held. */
typedef struct kvr_kv_sub_cbs_s {
  void (*on_batch)(void *data, const kvr_kv_batch_t *b);
  void (*on_reset)(void *data);
  void *data;
} kvr_kv_sub_cbs_t;

/* Opens the sockets on zmq_ctx (shared, the caller's) and starts reading on loop. NULL with a
 * one-line reason in err for a bad endpoint. */
kvr_kv_sub_t *kvr_kv_sub_new(uv_loop_t *loop, void *zmq_ctx, const kvr_kv_sub_opts_t *opts,
                             const kvr_kv_sub_cbs_t *cbs, char *err, size_t errlen);

/* Closes the sockets; no callback runs after this; the memory goes once the handles closed. */
void kvr_kv_sub_close(kvr_kv_sub_t *s); /* accepts NULL */

/* NONE while precise, else why not (now_ms on the monotonic clock). */
kvr_kv_fallback_t kvr_kv_sub_mode(const kvr_kv_sub_t *s, uint64_t now_ms);
const kvr_kv_stream_stats_t *kvr_kv_sub_stats(const kvr_kv_sub_t *s);
bool kvr_kv_sub_replaying(const kvr_kv_sub_t *s);

#endif

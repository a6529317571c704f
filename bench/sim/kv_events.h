/* kv_events.h -- the simulated worker's KV-cache event publisher, on vLLM's wire format.
 *
 * What vLLM does with `--kv-events-config` (vllm/distributed/kv_events.py, summarised in
 * ../shared/KV-EVENTS.md), for `kvrouter sim`:
 *
 *   engine step -> kvr_sim_engine_kv_log() (sim_engine.h: STORED / REMOVED / CLEARED in order)
 *     -> kvr_kv_encode_batch(): one msgpack EventBatch [ts, [event...], data_parallel_rank]
 *     -> kvr_kv_pub_publish(): ZMQ PUB, 3 frames: topic, 8-byte big-endian sequence, payload;
 *        the batch is kept in a ring of buffer_steps batches for replay
 *   replay (optional ROUTER socket on replay_endpoint, polled on the libuv loop through ZMQ_FD):
 *     DEALER sends ["", start_seq] -> every kept batch with seq >= start_seq, then an end marker.
 *
 * Two wire generations, one switch (kvr_kv_encoding_t):
 *   MAP   (vLLM since mid-2026): events are msgpack maps {"type": "BlockStored", ...}; replay
 *         replies are ["", topic, seq, payload], ended by ["", "", 0xFFFFFFFFFFFFFFFF, ""].
 *   ARRAY (vLLM up to about 0.23): events are tagged arrays ["BlockStored", hashes, parent,
 *         token_ids, block_size, lora_id, medium, lora_name]; replay replies are ["", seq,
 * payload], ended by ["", 0xFFFFFFFFFFFFFFFF, ""].
 *
 * Sockets follow vLLM's rule: the PUB binds when the endpoint holds "*", "::", or is ipc:// or
 * inproc://, and connects otherwise (so a consumer may bind and let engines connect). The replay
 * socket always binds. Sequence numbers count from 0 per publisher (a restarted sim starts again).
 */
#ifndef KVR_SIM_KV_EVENTS_H
#define KVR_SIM_KV_EVENTS_H

#include "sim_engine.h"

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define KVR_KV_ENDPOINT_MAX 256

/* vLLM's KVEventsConfig keys (vllm/config/kv_events.py), with vLLM's defaults. */
typedef struct kvr_kv_events_config_s {
  bool enable_kv_cache_events;               /* false */
  char publisher[16];                        /* "null" or "zmq"; "zmq" once events are enabled */
  char endpoint[KVR_KV_ENDPOINT_MAX];        /* TCP on every interface, port 5557 */
  char replay_endpoint[KVR_KV_ENDPOINT_MAX]; /* "" = no replay socket */
  uint32_t buffer_steps;                     /* 10000 batches kept for replay */
  int hwm;                                   /* 100000: the PUB socket's send high-water mark */
  uint32_t max_queue_size;                   /* 100000 (vLLM's publisher queue; accepted) */
  char topic[KVR_KV_ENDPOINT_MAX];           /* "" */
} kvr_kv_events_config_t;

typedef enum { KVR_KV_ENCODING_MAP, KVR_KV_ENCODING_ARRAY } kvr_kv_encoding_t;

void kvr_kv_events_config_default(kvr_kv_events_config_t *cfg);

/* Parses vLLM's --kv-events-config JSON onto cfg (defaults first). Unknown keys, wrong types and
 * out-of-range values are errors, as vLLM's config validation makes them. Returns 0, or -1 with a
 * one-line reason in err. */
int kvr_kv_events_config_parse(kvr_kv_events_config_t *cfg, const char *json, char *err,
                               size_t errlen);

/* True when cfg asks for a ZMQ publisher (enabled and publisher "zmq"). */
bool kvr_kv_events_config_active(const kvr_kv_events_config_t *cfg);

/* Appends one EventBatch holding every event of log to sb (block_size from the engine). */
void kvr_kv_encode_batch(msgpack_sbuffer *sb, const kvr_sim_kv_log_t *log, uint32_t block_size,
                         double ts, int dp_rank, kvr_kv_encoding_t enc);

/* cfg moved to data-parallel rank `rank`, as vLLM's ZmqEventPublisher.offset_endpoint_port does
 * for the endpoint and the replay endpoint (vllm/distributed/kv_events.py): a tcp:// port plus
 * the rank, an inproc:// (and, here, an ipc://) endpoint suffixed "_dp<rank>"; rank 0 unchanged.
 * Returns 0, or KVR_EINVAL with err when a tcp endpoint has no numeric port or the result is too
 * long. */
int kvr_kv_events_config_for_rank(kvr_kv_events_config_t *cfg, uint32_t rank, char *err,
                                  size_t errlen);

typedef struct kvr_kv_pub_s kvr_kv_pub_t;

/* Opens the PUB (and the replay ROUTER, polled on loop) as cfg says. NULL with err on failure
 * (bad endpoint, address in use). */
kvr_kv_pub_t *kvr_kv_pub_new(uv_loop_t *loop, const kvr_kv_events_config_t *cfg,
                             kvr_kv_encoding_t enc, char *err, size_t errlen);

/* The data-parallel rank every batch carries as its third element (default 0). */
void kvr_kv_pub_set_dp_rank(kvr_kv_pub_t *pub, int rank);

/* Publishes log as one batch when it holds any event (vLLM sends nothing for an empty step). */
void kvr_kv_pub_publish(kvr_kv_pub_t *pub, const kvr_sim_kv_log_t *log, uint32_t block_size);

/* Batches published so far (the next sequence number). */
uint64_t kvr_kv_pub_published(const kvr_kv_pub_t *pub);

/* Stops polling and closes the sockets; the pub is freed once its poll handle has closed, and
 * then done(data) is called from the loop (at once when there is no handle). Accepts NULL (done
 * is then not called). */
void kvr_kv_pub_close(kvr_kv_pub_t *pub, void (*done)(void *data), void *data);

#endif

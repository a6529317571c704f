/* kv_events.c -- vLLM's KV-cache event wire format for the simulated worker (see kv_events.h).
 *
 * Three parts, in the order data flows:
 *   config   kvr_kv_events_config_parse(): vLLM's --kv-events-config JSON (cJSON) -> the struct.
 *   encode   kvr_kv_encode_batch(): an engine step's event log -> one msgpack EventBatch
 *            (msgpack-c's packer), in the map or the array encoding.
 *   publish  kvr_kv_pub_t: the PUB socket (3 frames per batch), a ring of the last buffer_steps
 *            batches, and the replay ROUTER socket, read on the libuv loop: ZMQ_FD is
 *            edge-triggered, so every wake-up (and every send on the socket) drains it while
 *            ZMQ_EVENTS says ZMQ_POLLIN.
 *
 * Field choices, per vLLM's BlockStored / BlockRemoved (vllm/distributed/kv_events.py): fields
 * without a default are always sent (block_hashes, parent_block_hash, token_ids, block_size,
 * lora_id, medium, lora_name: the adapter's id and name for a LoRA request, else nil); the map
 * encoding also carries what a plain full-attention engine of vLLM 0.26 sets (extra_keys per
 * block: nil, or the adapter's name in every block and the cache salt in a salted chain's first
 * block, e.g. ["<lora>", "<salt>"]; group_idx 0, kv_cache_spec_kind "full_attention"), the array
 * encoding stops at lora_name, as vLLM 0.23 did (so it carries no salt). Engine hashes are
 * the sim's XXH3 chain values, sent as msgpack uint64 as vLLM sends its 64-bit block hashes.
 */
#include "kv_events.h"

#include "base/kvr.h"
#include "base/log.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define END_SEQ UINT64_MAX

/* ---- config ---- */

void kvr_kv_events_config_default(kvr_kv_events_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->publisher, sizeof(cfg->publisher), "null");
  snprintf(cfg->endpoint, sizeof(cfg->endpoint), "tcp://*:5557");
  cfg->buffer_steps = 10000;
  cfg->hwm = 100000;
  cfg->max_queue_size = 100000;
}

static int copy_str(char *dst, size_t cap, const cJSON *v, const char *key, char *err,
                    size_t errlen) {
  if (!cJSON_IsString(v) && !cJSON_IsNull(v)) {
    snprintf(err, errlen, "kv-events-config: \"%s\" must be a string", key);
    return -1;
  }
  const char *s = cJSON_IsString(v) ? v->valuestring : "";
  if (strlen(s) >= cap) {
    snprintf(err, errlen, "kv-events-config: \"%s\" is longer than %zu bytes", key, cap - 1);
    return -1;
  }
  snprintf(dst, cap, "%s", s);
  return 0;
}

static int get_uint(uint64_t *out, const cJSON *v, const char *key, uint64_t min, uint64_t max,
                    char *err, size_t errlen) {
  if (!cJSON_IsNumber(v) || v->valuedouble != (double)(uint64_t)v->valuedouble ||
      v->valuedouble < (double)min || v->valuedouble > (double)max) {
    snprintf(err, errlen, "kv-events-config: \"%s\" must be an integer in [%llu, %llu]", key,
             (unsigned long long)min, (unsigned long long)max);
    return -1;
  }
  *out = (uint64_t)v->valuedouble;
  return 0;
}

int kvr_kv_events_config_parse(kvr_kv_events_config_t *cfg, const char *json, char *err,
                               size_t errlen) {
  kvr_kv_events_config_default(cfg);
  cJSON *root = cJSON_Parse(json);
  if (root == NULL || !cJSON_IsObject(root)) {
    snprintf(err, errlen, "kv-events-config: not a JSON object");
    cJSON_Delete(root);
    return -1;
  }
  bool publisher_set = false;
  int rc = 0;
  uint64_t u = 0;
  for (const cJSON *v = root->child; v != NULL && rc == 0; v = v->next) {
    const char *k = v->string;
    if (strcmp(k, "enable_kv_cache_events") == 0) {
      if (!cJSON_IsBool(v)) {
        snprintf(err, errlen, "kv-events-config: \"%s\" must be true or false", k);
        rc = -1;
      }
      cfg->enable_kv_cache_events = cJSON_IsTrue(v);
    } else if (strcmp(k, "publisher") == 0) {
      rc = copy_str(cfg->publisher, sizeof(cfg->publisher), v, k, err, errlen);
      if (rc == 0 && strcmp(cfg->publisher, "null") != 0 && strcmp(cfg->publisher, "zmq") != 0) {
        snprintf(err, errlen, "kv-events-config: publisher \"%s\" unknown (null, zmq)",
                 cfg->publisher);
        rc = -1;
      }
      publisher_set = true;
    } else if (strcmp(k, "endpoint") == 0) {
      rc = copy_str(cfg->endpoint, sizeof(cfg->endpoint), v, k, err, errlen);
    } else if (strcmp(k, "replay_endpoint") == 0) {
      rc = copy_str(cfg->replay_endpoint, sizeof(cfg->replay_endpoint), v, k, err, errlen);
    } else if (strcmp(k, "topic") == 0) {
      rc = copy_str(cfg->topic, sizeof(cfg->topic), v, k, err, errlen);
    } else if (strcmp(k, "buffer_steps") == 0) {
      rc = get_uint(&u, v, k, 1, 10000000, err, errlen);
      cfg->buffer_steps = (uint32_t)u;
    } else if (strcmp(k, "hwm") == 0) {
      rc = get_uint(&u, v, k, 0, INT32_MAX, err, errlen);
      cfg->hwm = (int)u;
    } else if (strcmp(k, "max_queue_size") == 0) {
      rc = get_uint(&u, v, k, 1, UINT32_MAX, err, errlen);
      cfg->max_queue_size = (uint32_t)u;
    } else {
      snprintf(err, errlen, "kv-events-config: unknown key \"%s\"", k);
      rc = -1;
    }
  }
  cJSON_Delete(root);
  /* vLLM: enabling events without naming a publisher selects "zmq". */
  if (rc == 0 && cfg->enable_kv_cache_events && !publisher_set)
    snprintf(cfg->publisher, sizeof(cfg->publisher), "zmq");
  if (rc == 0 && kvr_kv_events_config_active(cfg) && cfg->endpoint[0] == '\0') {
    snprintf(err, errlen, "kv-events-config: \"endpoint\" is empty");
    rc = -1;
  }
  return rc;
}

bool kvr_kv_events_config_active(const kvr_kv_events_config_t *cfg) {
  return cfg->enable_kv_cache_events && strcmp(cfg->publisher, "zmq") == 0;
}

/* ---- encode ---- */

static void pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void pack_hashes(msgpack_packer *pk, const kvr_sim_kv_log_t *log,
                        const kvr_sim_kv_event_t *e) {
  msgpack_pack_array(pk, e->nhashes);
  for (uint32_t i = 0; i < e->nhashes; i++)
    msgpack_pack_uint64(pk, log->hashes[e->hash_off + i]);
}

static void pack_tokens(msgpack_packer *pk, const kvr_sim_kv_log_t *log,
                        const kvr_sim_kv_event_t *e, uint32_t block_size) {
  size_t n = (size_t)e->nhashes * block_size;
  msgpack_pack_array(pk, n);
  for (size_t i = 0; i < n; i++)
    msgpack_pack_uint32(pk, log->tokens[e->tok_off + i]);
}

static void pack_parent(msgpack_packer *pk, const kvr_sim_kv_event_t *e) {
  if (e->has_parent)
    msgpack_pack_uint64(pk, e->parent);
  else
    msgpack_pack_nil(pk);
}

static void pack_logstr(msgpack_packer *pk, const kvr_sim_kv_log_t *log, uint32_t off,
                        uint32_t len) {
  msgpack_pack_str(pk, len);
  msgpack_pack_str_body(pk, log->salts + off, len);
}

/* One entry per block, the block's extra keys (vllm/v1/core/kv_cache_utils.py
 * generate_block_hash_extra_keys): the LoRA adapter's name in every block of an adapter's
 * request, then the cache salt only in the block with start_token_idx 0; nil when there are
 * none; a tuple, an array on the wire. */
static void pack_extra_keys(msgpack_packer *pk, const kvr_sim_kv_log_t *log,
                            const kvr_sim_kv_event_t *e) {
  msgpack_pack_array(pk, e->nhashes);
  for (uint32_t i = 0; i < e->nhashes; i++) {
    bool salt = i == 0 && e->salt_len > 0, lora = e->lora_len > 0;
    if (!salt && !lora) {
      msgpack_pack_nil(pk);
      continue;
    }
    msgpack_pack_array(pk, (size_t)salt + (size_t)lora);
    if (lora)
      pack_logstr(pk, log, e->lora_off, e->lora_len);
    if (salt)
      pack_logstr(pk, log, e->salt_off, e->salt_len);
  }
}

/* BlockStored's lora_id (the adapter's lora_int_id, vllm/v1/core/block_pool.py) and lora_name:
 * nil for the base model. */
static void pack_lora(msgpack_packer *pk, const kvr_sim_kv_log_t *log, const kvr_sim_kv_event_t *e,
                      bool name) {
  if (e->lora_len == 0)
    msgpack_pack_nil(pk);
  else if (name)
    pack_logstr(pk, log, e->lora_off, e->lora_len);
  else
    msgpack_pack_uint32(pk, e->lora_id);
}

static void pack_event_map(msgpack_packer *pk, const kvr_sim_kv_log_t *log,
                           const kvr_sim_kv_event_t *e, uint32_t block_size) {
  switch (e->kind) {
  case KVR_SIM_KV_STORED:
    msgpack_pack_map(pk, 11);
    pack_str(pk, "type");
    pack_str(pk, "BlockStored");
    pack_str(pk, "block_hashes");
    pack_hashes(pk, log, e);
    pack_str(pk, "parent_block_hash");
    pack_parent(pk, e);
    pack_str(pk, "token_ids");
    pack_tokens(pk, log, e, block_size);
    pack_str(pk, "block_size");
    msgpack_pack_uint32(pk, block_size);
    pack_str(pk, "lora_id");
    pack_lora(pk, log, e, false);
    pack_str(pk, "medium");
    pack_str(pk, "GPU");
    pack_str(pk, "lora_name");
    pack_lora(pk, log, e, true);
    pack_str(pk, "extra_keys");
    pack_extra_keys(pk, log, e);
    pack_str(pk, "group_idx");
    msgpack_pack_uint32(pk, 0);
    pack_str(pk, "kv_cache_spec_kind");
    pack_str(pk, "full_attention");
    break;
  case KVR_SIM_KV_REMOVED:
    msgpack_pack_map(pk, 4);
    pack_str(pk, "type");
    pack_str(pk, "BlockRemoved");
    pack_str(pk, "block_hashes");
    pack_hashes(pk, log, e);
    pack_str(pk, "medium");
    pack_str(pk, "GPU");
    pack_str(pk, "group_idx");
    msgpack_pack_uint32(pk, 0);
    break;
  case KVR_SIM_KV_CLEARED:
    msgpack_pack_map(pk, 1);
    pack_str(pk, "type");
    pack_str(pk, "AllBlocksCleared");
    break;
  }
}

static void pack_event_array(msgpack_packer *pk, const kvr_sim_kv_log_t *log,
                             const kvr_sim_kv_event_t *e, uint32_t block_size) {
  switch (e->kind) {
  case KVR_SIM_KV_STORED:
    msgpack_pack_array(pk, 8);
    pack_str(pk, "BlockStored");
    pack_hashes(pk, log, e);
    pack_parent(pk, e);
    pack_tokens(pk, log, e, block_size);
    msgpack_pack_uint32(pk, block_size);
    pack_lora(pk, log, e, false); /* lora_id */
    pack_str(pk, "GPU");          /* medium */
    pack_lora(pk, log, e, true);  /* lora_name */
    break;
  case KVR_SIM_KV_REMOVED:
    msgpack_pack_array(pk, 3);
    pack_str(pk, "BlockRemoved");
    pack_hashes(pk, log, e);
    pack_str(pk, "GPU");
    break;
  case KVR_SIM_KV_CLEARED:
    msgpack_pack_array(pk, 1);
    pack_str(pk, "AllBlocksCleared");
    break;
  }
}

void kvr_kv_encode_batch(msgpack_sbuffer *sb, const kvr_sim_kv_log_t *log, uint32_t block_size,
                         double ts, int dp_rank, kvr_kv_encoding_t enc) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, ts);
  msgpack_pack_array(&pk, log->nev);
  for (size_t i = 0; i < log->nev; i++) {
    if (enc == KVR_KV_ENCODING_MAP)
      pack_event_map(&pk, log, &log->ev[i], block_size);
    else
      pack_event_array(&pk, log, &log->ev[i], block_size);
  }
  msgpack_pack_int(&pk, dp_rank);
}

/* ---- publish ---- */

typedef struct kept_s {
  uint64_t seq;
  char *data;
  size_t len;
} kept_t;

struct kvr_kv_pub_s {
  kvr_kv_events_config_t cfg;
  kvr_kv_encoding_t enc;
  void *ctx;
  void *pub;
  void *replay; /* NULL without replay_endpoint */
  uv_poll_t poll;
  bool polling;
  uint64_t next_seq;
  int dp_rank;  /* the batches' third element */
  kept_t *ring; /* buffer_steps entries; ring[seq % buffer_steps] */
  msgpack_sbuffer sb;
  void (*done)(void *data); /* kvr_kv_pub_close's */
  void *done_data;
};

static void be64(unsigned char out[8], uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    out[i] = (unsigned char)(v & 0xff);
    v >>= 8;
  }
}

/* vLLM's rule (ZmqEventPublisher): bind for wildcard hosts and local transports, else connect. */
static bool endpoint_binds(const char *ep) {
  return strchr(ep, '*') != NULL || strstr(ep, "::") != NULL || strncmp(ep, "ipc://", 6) == 0 ||
         strncmp(ep, "inproc://", 9) == 0;
}

static int send_frames(void *sock, const void *const *parts, const size_t *lens, int n) {
  for (int i = 0; i < n; i++) {
    if (zmq_send(sock, parts[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
      return -1;
  }
  return 0;
}

/* One replay request: [identity, "", start_seq (8 bytes)] -> the kept batches from start_seq. */
static void replay_answer(kvr_kv_pub_t *p, const zmq_msg_t *id, uint64_t start) {
  uint64_t oldest = p->next_seq > p->cfg.buffer_steps ? p->next_seq - p->cfg.buffer_steps : 0;
  unsigned char seqb[8];
  const void *parts[5];
  size_t lens[5];
  parts[0] = zmq_msg_data((zmq_msg_t *)id);
  lens[0] = zmq_msg_size(id);
  parts[1] = "";
  lens[1] = 0;
  bool map = p->enc == KVR_KV_ENCODING_MAP;
  for (uint64_t s = start > oldest ? start : oldest; s < p->next_seq; s++) {
    const kept_t *k = &p->ring[s % p->cfg.buffer_steps];
    be64(seqb, k->seq);
    int n = 2;
    if (map) {
      parts[n] = p->cfg.topic;
      lens[n++] = strlen(p->cfg.topic);
    }
    parts[n] = seqb;
    lens[n++] = 8;
    parts[n] = k->data;
    lens[n++] = k->len;
    if (send_frames(p->replay, parts, lens, n) != 0) {
      KVR_WARN("sim", "kv events: replay send failed: %s", zmq_strerror(zmq_errno()));
      return;
    }
  }
  be64(seqb, END_SEQ);
  int n = 2;
  if (map) {
    parts[n] = "";
    lens[n++] = 0;
  }
  parts[n] = seqb;
  lens[n++] = 8;
  parts[n] = "";
  lens[n++] = 0;
  if (send_frames(p->replay, parts, lens, n) != 0)
    KVR_WARN("sim", "kv events: replay send failed: %s", zmq_strerror(zmq_errno()));
}

/* Reads every pending replay request (frames: identity, "", 8-byte start). Malformed requests
 * are dropped with a warning; a request with more frames is read to its end first. */
static void replay_drain(kvr_kv_pub_t *p) {
  for (;;) {
    int events = 0;
    size_t elen = sizeof(events);
    if (zmq_getsockopt(p->replay, ZMQ_EVENTS, &events, &elen) != 0 || !(events & ZMQ_POLLIN))
      return;
    zmq_msg_t frames[3];
    int n = 0, more = 0;
    do {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, p->replay, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        break;
      }
      more = zmq_msg_more(&m);
      if (n < 3)
        frames[n++] = m;
      else
        zmq_msg_close(&m);
    } while (more);
    if (n == 3 && zmq_msg_size(&frames[1]) == 0 && zmq_msg_size(&frames[2]) == 8) {
      const unsigned char *b = zmq_msg_data(&frames[2]);
      uint64_t start = 0;
      for (int i = 0; i < 8; i++)
        start = start << 8 | b[i];
      replay_answer(p, &frames[0], start);
    } else if (n > 0) {
      KVR_WARN("sim", "kv events: malformed replay request (%d frames) dropped", n);
    }
    for (int i = 0; i < n; i++)
      zmq_msg_close(&frames[i]);
  }
}

static void on_replay_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  replay_drain(h->data);
}

kvr_kv_pub_t *kvr_kv_pub_new(uv_loop_t *loop, const kvr_kv_events_config_t *cfg,
                             kvr_kv_encoding_t enc, char *err, size_t errlen) {
  kvr_kv_pub_t *p = kvr_xcalloc(1, sizeof(*p));
  p->cfg = *cfg;
  p->enc = enc;
  p->ctx = zmq_ctx_new();
  p->pub = zmq_socket(p->ctx, ZMQ_PUB);
  int hwm = cfg->hwm, linger = 0;
  zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
  zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof(linger));
  int rc = endpoint_binds(cfg->endpoint) ? zmq_bind(p->pub, cfg->endpoint)
                                         : zmq_connect(p->pub, cfg->endpoint);
  if (rc != 0) {
    snprintf(err, errlen, "kv events: %s %s: %s",
             endpoint_binds(cfg->endpoint) ? "bind" : "connect", cfg->endpoint,
             zmq_strerror(zmq_errno()));
    goto fail;
  }
  if (cfg->replay_endpoint[0] != '\0') {
    p->replay = zmq_socket(p->ctx, ZMQ_ROUTER);
    int unlimited = 0;
    zmq_setsockopt(p->replay, ZMQ_SNDHWM, &unlimited, sizeof(unlimited));
    zmq_setsockopt(p->replay, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(p->replay, cfg->replay_endpoint) != 0) {
      snprintf(err, errlen, "kv events: bind %s: %s", cfg->replay_endpoint,
               zmq_strerror(zmq_errno()));
      goto fail;
    }
    int fd = -1;
    size_t fdlen = sizeof(fd);
    zmq_getsockopt(p->replay, ZMQ_FD, &fd, &fdlen);
    uv_poll_init(loop, &p->poll, fd);
    p->poll.data = p;
    uv_poll_start(&p->poll, UV_READABLE, on_replay_poll);
    p->polling = true;
  }
  p->ring = kvr_xcalloc(cfg->buffer_steps, sizeof(*p->ring));
  msgpack_sbuffer_init(&p->sb);
  return p;
fail:
  if (p->replay)
    zmq_close(p->replay);
  zmq_close(p->pub);
  zmq_ctx_term(p->ctx);
  free(p);
  return NULL;
}

void kvr_kv_pub_publish(kvr_kv_pub_t *p, const kvr_sim_kv_log_t *log, uint32_t block_size) {
  if (p == NULL || log == NULL || log->nev == 0)
    return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  msgpack_sbuffer_clear(&p->sb);
  kvr_kv_encode_batch(&p->sb, log, block_size, (double)ts.tv_sec + ts.tv_nsec * 1e-9, p->dp_rank,
                      p->enc);
  uint64_t seq = p->next_seq++;
  unsigned char seqb[8];
  be64(seqb, seq);
  const void *parts[3] = {p->cfg.topic, seqb, p->sb.data};
  size_t lens[3] = {strlen(p->cfg.topic), 8, p->sb.size};
  /* PUB never blocks: past the high-water mark ZMQ drops, and a consumer sees the gap. */
  if (send_frames(p->pub, parts, lens, 3) != 0)
    KVR_WARN("sim", "kv events: publish seq %llu failed: %s", (unsigned long long)seq,
             zmq_strerror(zmq_errno()));
  kept_t *k = &p->ring[seq % p->cfg.buffer_steps];
  k->seq = seq;
  k->data = kvr_xrealloc(k->data, p->sb.size ? p->sb.size : 1);
  memcpy(k->data, p->sb.data, p->sb.size);
  k->len = p->sb.size;
  if (p->replay)
    replay_drain(p); /* a send may have consumed the fd's edge */
}

void kvr_kv_pub_set_dp_rank(kvr_kv_pub_t *p, int rank) {
  p->dp_rank = rank;
}

/* One endpoint moved to rank (see kvr_kv_events_config_for_rank). */
static int endpoint_for_rank(char *ep, uint32_t rank, char *err, size_t errlen) {
  if (rank == 0 || ep[0] == '\0')
    return 0;
  char out[KVR_KV_ENDPOINT_MAX];
  int n;
  if (strncmp(ep, "tcp://", 6) == 0) {
    const char *colon = strrchr(ep, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon[1] == '\0' || *end != '\0' || port < 0 ||
        port + (long)rank > 65535) {
      snprintf(err, errlen, "endpoint %s: no numeric port to offset by the rank %u", ep, rank);
      return KVR_EINVAL;
    }
    n = snprintf(out, sizeof(out), "%.*s:%ld", (int)(colon - ep), ep, port + (long)rank);
  } else {
    n = snprintf(out, sizeof(out), "%s_dp%u", ep, rank);
  }
  if (n < 0 || (size_t)n >= sizeof(out)) {
    snprintf(err, errlen, "endpoint %s: too long with the rank %u", ep, rank);
    return KVR_EINVAL;
  }
  memcpy(ep, out, (size_t)n + 1);
  return 0;
}

int kvr_kv_events_config_for_rank(kvr_kv_events_config_t *cfg, uint32_t rank, char *err,
                                  size_t errlen) {
  if (endpoint_for_rank(cfg->endpoint, rank, err, errlen) != 0 ||
      endpoint_for_rank(cfg->replay_endpoint, rank, err, errlen) != 0)
    return KVR_EINVAL;
  return 0;
}

uint64_t kvr_kv_pub_published(const kvr_kv_pub_t *p) {
  return p ? p->next_seq : 0;
}

static void pub_free(kvr_kv_pub_t *p) {
  void (*done)(void *) = p->done;
  void *data = p->done_data;
  for (uint32_t i = 0; i < p->cfg.buffer_steps; i++)
    free(p->ring[i].data);
  free(p->ring);
  msgpack_sbuffer_destroy(&p->sb);
  free(p);
  if (done)
    done(data);
}

static void on_poll_close(uv_handle_t *h) {
  pub_free(h->data);
}

void kvr_kv_pub_close(kvr_kv_pub_t *p, void (*done)(void *data), void *data) {
  if (p == NULL)
    return;
  p->done = done;
  p->done_data = data;
  if (p->polling)
    uv_poll_stop(&p->poll); /* before its fd goes away with the socket */
  if (p->replay)
    zmq_close(p->replay);
  zmq_close(p->pub);
  zmq_ctx_term(p->ctx);
  if (p->polling)
    uv_close((uv_handle_t *)&p->poll, on_poll_close);
  else
    pub_free(p);
}

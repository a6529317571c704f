/* fuzz_peer_sync.c -- libFuzzer target: replica sync messages from the network
 * (src/serve/peer_sync.c) through the decoder and into a router's synced load, as a replica applies
 * its peer's.
 *
 * The input is a sequence of messages, each a 2-byte big-endian length and that many bytes.
 * Invariants:
 *   - the decode is 0 or -1; after -1 the message holds nothing; a decoded message encodes and
 *     decodes again to the same fields (kind, instance, seq, id, entries);
 *   - applying the messages never moves the router's own load (only its workers' synced[0]);
 *   - whatever came before, an empty snapshot from the peer's current instance leaves no synced
 *     load on any worker: in flight, tokens, queued prefill and the prefill backlog all zero.
 */
#include "fuzz_util.h"

#include "base/log.h"
#include "core/config.h"
#include "core/router.h"
#include "serve/peer_sync.h"

static void check_roundtrip(const kvr_sync_msg_t *m) {
  void *buf = NULL;
  size_t len = 0;
  kvr_peer_sync_encode(m, &buf, &len);
  kvr_sync_msg_t again;
  char err[160];
  FUZZ_CHECK(kvr_peer_sync_decode(buf, len, &again, err, sizeof err) == 0);
  FUZZ_CHECK(again.kind == m->kind && again.instance == m->instance && again.seq == m->seq &&
             again.nentries == m->nentries);
  if (m->kind != KVR_SYNC_MSG_SNAPSHOT)
    FUZZ_CHECK(again.id == m->id);
  for (size_t i = 0; i < m->nentries; i++)
    FUZZ_CHECK(again.entries[i].id == m->entries[i].id &&
               strcmp(again.entries[i].url, m->entries[i].url) == 0 &&
               again.entries[i].prompt_tokens == m->entries[i].prompt_tokens &&
               again.entries[i].prefill_tokens == m->entries[i].prefill_tokens);
  kvr_peer_sync_msg_free(&again);
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  kvr_log_set_level(KVR_LOG_OFF); /* a router per input: no lines about its workers */
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  char err[256];
  /* the workers fuzzed URLs most often name: a short one and a loopback one */
  if (kvr_config_add_worker(&cfg, "http://w", err, sizeof err) != 0 ||
      kvr_config_add_worker(&cfg, "http://127.0.0.1:1", err, sizeof err) != 0)
    abort();
  cfg.scrape_interval_ms = 0;
  cfg.peers = calloc(1, sizeof(char *));
  cfg.peers[0] = strdup("http://127.0.0.1:9");
  cfg.npeers = 1;
  cfg.peer_sync_listen = strdup("tcp://127.0.0.1:0");
  kvr_router_t *r = kvr_router_new(&cfg, err, sizeof err);
  FUZZ_CHECK(r != NULL);
  kvr_peer_sync_t *s = kvr_peer_sync_new(NULL, r, err, sizeof err);
  FUZZ_CHECK(s != NULL);
  uint64_t last_instance = 0;
  for (size_t off = 0; off + 2 <= len;) {
    size_t n = (size_t)data[off] << 8 | data[off + 1];
    off += 2;
    if (n > len - off)
      n = len - off;
    uint8_t *msg = malloc(n ? n : 1); /* exact size: a read past it is an ASan error */
    if (msg == NULL)
      abort();
    if (n)
      memcpy(msg, data + off, n);
    off += n;
    kvr_sync_msg_t m;
    if (kvr_peer_sync_decode(msg, n, &m, err, sizeof err) == 0) {
      check_roundtrip(&m);
      if (m.instance != r->instance) { /* as if the peer's poll had named it */
        r->peer_instance[0] = m.instance;
        last_instance = m.instance;
      }
      kvr_peer_sync_msg_free(&m);
    } else {
      FUZZ_CHECK(m.entries == NULL && m.nentries == 0);
    }
    kvr_peer_sync_receive(s, msg, n);
    free(msg);
    for (size_t i = 0; i < r->nslots; i++)
      FUZZ_CHECK(r->slots[i]->inflight == 0 && r->slots[i]->active_tokens == 0 &&
                 r->slots[i]->queued_prefill_tokens == 0);
  }
  if (last_instance) {
    kvr_sync_msg_t empty = {
        .kind = KVR_SYNC_MSG_SNAPSHOT, .instance = last_instance, .seq = UINT64_MAX};
    void *buf = NULL;
    size_t blen = 0;
    kvr_peer_sync_encode(&empty, &buf, &blen);
    kvr_peer_sync_receive(s, buf, blen);
    free(buf);
    kvr_route_req_t req = {0};
    kvr_decision_t *d = calloc(1, sizeof *d);
    kvr_router_decide(r, &req, 0, false, d);
    for (size_t i = 0; i < r->nslots; i++) {
      const kvr_peer_load_t *l = &r->slots[i]->synced[0];
      FUZZ_CHECK(l->inflight == 0 && l->active_tokens == 0 && l->queued_prefill_tokens == 0);
      FUZZ_CHECK(d->snaps[i].inflight == 0 && d->snaps[i].prefill_backlog_tokens == 0);
    }
    free(d);
  }
  kvr_peer_sync_close(s);
  kvr_router_free(r);
  kvr_config_free(&cfg);
  return 0;
}

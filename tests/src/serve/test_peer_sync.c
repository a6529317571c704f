/* test_peer_sync.c -- replica sync without sockets: the message codec (round trips, every bad
 * shape refused), and two real routers whose sync objects are wired back to back (what one
 * publishes, the other receives): a peer's dispatch, first token and end move the other's view of
 * the worker exactly; a peer's scrape is adopted (and not echoed); a replica counts nothing of a
 * peer before its first snapshot; a lost message is counted as a gap and repaired by the next
 * snapshot; a silent peer is dropped after peer_stale_ms (back to polled figures, its load gone); a
 * restarted peer (new instance) loses its old records. Time is the routers' injectable clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "core/config.h"
#include "core/router.h"
#include "serve/peer_sync.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- codec ---- */

static void roundtrip(const kvr_sync_msg_t *m) {
  void *buf = NULL;
  size_t len = 0;
  kvr_peer_sync_encode(m, &buf, &len);
  kvr_sync_msg_t got;
  char err[160];
  assert_int_equal(kvr_peer_sync_decode(buf, len, &got, err, sizeof err), 0);
  assert_int_equal(got.kind, m->kind);
  assert_true(got.instance == m->instance);
  assert_true(got.seq == m->seq);
  if (m->kind == KVR_SYNC_MSG_FIRST || m->kind == KVR_SYNC_MSG_END)
    assert_true(got.id == m->id);
  assert_int_equal(got.nentries, m->nentries);
  if (m->kind == KVR_SYNC_MSG_SCRAPE) {
    assert_string_equal(got.url, m->url);
    assert_true(got.running == m->running && got.waiting == m->waiting &&
                got.kv_cache_usage == m->kv_cache_usage);
  }
  for (size_t i = 0; i < m->nentries; i++) {
    assert_true(got.entries[i].id == m->entries[i].id);
    assert_string_equal(got.entries[i].url, m->entries[i].url);
    assert_true(got.entries[i].prompt_tokens == m->entries[i].prompt_tokens);
    assert_true(got.entries[i].prefill_tokens == m->entries[i].prefill_tokens);
  }
  kvr_peer_sync_msg_free(&got);
  free(buf);
}

static void test_codec_roundtrip(void **state) {
  (void)state;
  kvr_sync_entry_t es[3] = {{7, 1000, 800, "http://10.0.0.1:8000"},
                            {8, 5, 0, "http://[::1]:8001"},
                            {UINT64_MAX, UINT64_MAX, 1, "http://w"}};
  kvr_sync_msg_t snap = {
      .kind = KVR_SYNC_MSG_SNAPSHOT, .instance = 0xabc, .seq = 1, .entries = es, .nentries = 3};
  roundtrip(&snap);
  kvr_sync_msg_t empty = {.kind = KVR_SYNC_MSG_SNAPSHOT, .instance = 1, .seq = 2};
  roundtrip(&empty);
  kvr_sync_msg_t d = {.kind = KVR_SYNC_MSG_DISPATCH,
                      .instance = 1,
                      .seq = 3,
                      .id = 7,
                      .entries = es,
                      .nentries = 1};
  roundtrip(&d);
  kvr_sync_msg_t f = {.kind = KVR_SYNC_MSG_FIRST, .instance = 1, .seq = 4, .id = 9};
  roundtrip(&f);
  kvr_sync_msg_t e = {.kind = KVR_SYNC_MSG_END, .instance = 1, .seq = 5, .id = 9};
  roundtrip(&e);
  kvr_sync_msg_t c = {.kind = KVR_SYNC_MSG_SCRAPE,
                      .instance = 1,
                      .seq = 6,
                      .url = "http://w:1",
                      .running = 3,
                      .waiting = 0.5,
                      .kv_cache_usage = 0.25};
  roundtrip(&c);
}

static void assert_refused(const void *data, size_t len) {
  kvr_sync_msg_t m;
  char err[160] = "";
  assert_int_equal(kvr_peer_sync_decode(data, len, &m, err, sizeof err), -1);
  assert_true(err[0] != '\0');
  assert_null(m.entries);
}

static void test_codec_refuses(void **state) {
  (void)state;
  assert_refused("", 0);
  assert_refused("\xc1", 1);                                      /* never used */
  assert_refused("\x93\x01\x01\x01", 4);                          /* 3 elements */
  assert_refused("\x94\x04\x01\x01\x01", 5);                      /* kind 4 */
  assert_refused("\x94\x02\x01\x01\xa1x", 6);                     /* first token without an id */
  assert_refused("\x94\x00\x01\x01\x05", 5);                      /* snapshot without its list */
  assert_refused("\x94\x00\x01\x01\x91\x01", 6);                  /* entry not an array */
  assert_refused("\x94\x00\x01\x01\x91\x94\x01\xa0\x01\x01", 10); /* empty url */
  assert_refused("\x97\x01\x01\x01\x01\xa1x\x01", 8);             /* dispatch cut short */
  assert_refused("\x94\x00\x01\x01\xdd\xff\xff\xff\xff", 9);      /* 4G entries in 9 bytes */
  /* every truncation of a good message is refused, none read past the end */
  kvr_sync_entry_t es[1] = {{7, 1000, 800, "http://10.0.0.1:8000"}};
  kvr_sync_msg_t snap = {
      .kind = KVR_SYNC_MSG_SNAPSHOT, .instance = 3, .seq = 9, .entries = es, .nentries = 1};
  void *buf = NULL;
  size_t len = 0;
  kvr_peer_sync_encode(&snap, &buf, &len);
  for (size_t cut = 0; cut < len; cut++) {
    void *copy = malloc(cut ? cut : 1);
    memcpy(copy, buf, cut);
    assert_refused(copy, cut);
    free(copy);
  }
  free(buf);
}

/* ---- two replicas back to back ---- */

static uint64_t fake_ns;
static uint64_t fake_clock(void *ctx) {
  (void)ctx;
  return fake_ns;
}

typedef struct {
  kvr_config_t cfg;
  kvr_router_t *r;
  kvr_peer_sync_t *s;
} replica_t;

typedef struct {
  replica_t a, b; /* b publishes, a receives (and the other way round) */
  int drop_next;  /* messages of b's to lose */
} pair_t;

static void open_replica(replica_t *x, const char *peer) {
  kvr_config_init(&x->cfg);
  char err[256];
  for (int i = 0; i < 2; i++) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", 1 + i); /* never contacted */
    assert_int_equal(kvr_config_add_worker(&x->cfg, url, err, sizeof err), 0);
  }
  x->cfg.scrape_interval_ms = 0;
  x->cfg.peers = calloc(1, sizeof(char *));
  x->cfg.peers[0] = strdup(peer);
  x->cfg.npeers = 1;
  x->cfg.peer_sync_listen = strdup("tcp://127.0.0.1:0");
  x->r = kvr_router_new(&x->cfg, err, sizeof err);
  assert_non_null(x->r);
  kvr_router_set_clock(x->r, fake_clock, NULL);
  x->s = kvr_peer_sync_new(NULL, x->r, err, sizeof err);
  assert_non_null(x->s);
}

static void close_replica(replica_t *x) {
  kvr_peer_sync_close(x->s);
  kvr_router_free(x->r);
  kvr_config_free(&x->cfg);
}

static void b_to_a(void *ctx, const void *data, size_t len) {
  pair_t *p = ctx;
  if (p->drop_next > 0) {
    p->drop_next--;
    return;
  }
  kvr_peer_sync_receive(p->a.s, data, len);
}

static void a_to_b(void *ctx, const void *data, size_t len) {
  pair_t *p = ctx;
  kvr_peer_sync_receive(p->b.s, data, len);
}

static pair_t *pair_open(void) {
  pair_t *p = calloc(1, sizeof *p);
  fake_ns = 1000000000ull;
  open_replica(&p->a, "http://127.0.0.1:9002");
  open_replica(&p->b, "http://127.0.0.1:9001");
  /* what each one's /admin/load poll of the other would have told it */
  p->a.r->peer_instance[0] = p->b.r->instance;
  p->b.r->peer_instance[0] = p->a.r->instance;
  kvr_peer_sync_set_sink(p->b.s, b_to_a, p);
  kvr_peer_sync_set_sink(p->a.s, a_to_b, p);
  return p;
}

static void pair_close(pair_t *p) {
  close_replica(&p->a);
  close_replica(&p->b);
  free(p);
}

/* A's view of its worker in slot 0 (the cluster's load as A's decisions see it). */
static kvr_worker_snap_t view(kvr_router_t *r, int slot) {
  kvr_route_req_t req = {0};
  kvr_decision_t *d = calloc(1, sizeof *d);
  kvr_router_decide(r, &req, 0, false, d);
  kvr_worker_snap_t s = d->snaps[slot];
  free(d);
  return s;
}

/* A pair whose b is live on a with one request of b's, d, in flight on worker 0. */
static pair_t *pair_with_one_request(kvr_router_dispatch_t *d) {
  pair_t *p = pair_open();
  kvr_peer_sync_tick(p->b.s);
  assert_non_null(kvr_router_on_dispatch(p->b.r, 0, 100, 0, d));
  assert_int_equal(view(p->a.r, 0).inflight, 1);
  return p;
}

static void test_dispatch_first_end(void **state) {
  (void)state;
  pair_t *p = pair_open();
  kvr_router_dispatch_t d1;
  /* before b's first snapshot, a counts nothing of b's */
  assert_non_null(kvr_router_on_dispatch(p->b.r, 0, 1000, 0, &d1));
  assert_false(p->a.r->peer_sync_live[0]);
  assert_int_equal(view(p->a.r, 0).inflight, 0);
  /* the snapshot brings the open request in */
  kvr_peer_sync_tick(p->b.s);
  assert_true(p->a.r->peer_sync_live[0]);
  kvr_worker_snap_t s = view(p->a.r, 0);
  assert_int_equal(s.inflight, 1);
  assert_int_equal(s.active_tokens, 1000);
  assert_int_equal(s.queued_prefill_tokens, 1000);
  assert_true(s.prefill_backlog_tokens > 0);
  /* a second request, announced as it is dispatched */
  kvr_router_dispatch_t d2;
  assert_non_null(kvr_router_on_dispatch(p->b.r, 1, 300, 0, &d2));
  assert_int_equal(view(p->a.r, 1).inflight, 1);
  assert_int_equal(view(p->a.r, 1).queued_prefill_tokens, 300);
  /* first token: the prefill leaves a's view too */
  fake_ns += 50000000ull;
  kvr_router_on_token(p->b.r, &d1);
  s = view(p->a.r, 0);
  assert_int_equal(s.queued_prefill_tokens, 0);
  assert_int_equal(s.prefill_backlog_tokens, 0);
  assert_int_equal(s.active_tokens, 1001);
  /* end: nothing left of it; a's own figures were never touched */
  kvr_router_on_end(p->b.r, &d1);
  kvr_router_on_end(p->b.r, &d2);
  assert_int_equal(view(p->a.r, 0).inflight, 0);
  assert_int_equal(view(p->a.r, 1).inflight, 0);
  assert_int_equal(view(p->a.r, 0).active_tokens, 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(p->a.r->slots[i]->inflight, 0);
    assert_int_equal(p->a.r->slots[i]->synced[0].inflight, 0);
  }
  assert_true(p->a.r->peer_sync_messages_total[0] >= 6);
  assert_int_equal(p->a.r->peer_sync_gaps_total[0], 0);
  /* and a's own requests reach b the same way */
  kvr_peer_sync_tick(p->a.s);
  kvr_router_dispatch_t d3;
  assert_non_null(kvr_router_on_dispatch(p->a.r, 1, 200, 0, &d3));
  assert_int_equal(view(p->b.r, 1).inflight, 1);
  assert_int_equal(view(p->a.r, 1).inflight, 1); /* its own, counted once */
  kvr_router_on_end(p->a.r, &d3);
  assert_int_equal(view(p->b.r, 1).inflight, 0);
  pair_close(p);
}

static void test_scrape_adopted(void **state) {
  (void)state;
  pair_t *p = pair_open();
  kvr_vllm_metrics_t m = {.at_ms = fake_ns / 1000000u,
                          .num_requests_running = 5,
                          .num_requests_waiting = 2,
                          .kv_cache_usage = 0.5};
  assert_int_equal(kvr_router_on_scrape(p->b.r, p->b.r->slots[1]->id, &m), 0);
  const kvr_worker_t *w = p->a.r->slots[1];
  assert_true(w->metrics_seen);
  assert_true(w->num_requests_running == 5 && w->num_requests_waiting == 2 &&
              w->kv_cache_usage == 0.5);
  assert_true(view(p->a.r, 1).metrics_fresh);
  assert_false(p->a.r->slots[0]->metrics_seen); /* the other worker untouched */
  /* adopting is not scraping: nothing goes back to b */
  uint64_t published = p->a.r->sync_published_total;
  assert_int_equal(kvr_router_on_peer_scrape(p->a.r, "http://127.0.0.1:2", 1, 1, 0.1), 0);
  assert_true(p->a.r->sync_published_total == published);
  assert_int_equal(kvr_router_on_peer_scrape(p->a.r, "http://nowhere", 1, 1, 0.1), KVR_ENOENT);
  pair_close(p);
}

static void test_gap_repaired_by_snapshot(void **state) {
  (void)state;
  kvr_router_dispatch_t d1, d2;
  pair_t *p = pair_with_one_request(&d1);
  p->drop_next = 1; /* the end of d1 is lost */
  kvr_router_on_end(p->b.r, &d1);
  assert_int_equal(view(p->a.r, 0).inflight, 1);
  p->drop_next = 1; /* and the dispatch of d2 */
  assert_non_null(kvr_router_on_dispatch(p->b.r, 1, 100, 0, &d2));
  assert_int_equal(view(p->a.r, 1).inflight, 0);
  kvr_peer_sync_tick(p->b.s); /* the snapshot lists d2 only */
  assert_int_equal(p->a.r->peer_sync_gaps_total[0], 1);
  assert_int_equal(view(p->a.r, 0).inflight, 0);
  assert_int_equal(view(p->a.r, 1).inflight, 1);
  kvr_router_on_end(p->b.r, &d2);
  assert_int_equal(view(p->a.r, 1).inflight, 0);
  pair_close(p);
}

static void test_silent_peer_dropped(void **state) {
  (void)state;
  kvr_router_dispatch_t d1;
  pair_t *p = pair_with_one_request(&d1);
  fake_ns += (p->a.cfg.peer_stale_ms + 1) * 1000000ull;
  p->drop_next = 1000; /* b goes silent */
  kvr_peer_sync_tick(p->a.s);
  assert_false(p->a.r->peer_sync_live[0]);
  assert_int_equal(p->a.r->slots[0]->synced[0].inflight, 0);
  assert_int_equal(view(p->a.r, 0).inflight, 0);
  assert_int_equal(view(p->a.r, 0).prefill_backlog_tokens, 0);
  kvr_router_on_end(p->b.r, &d1);
  pair_close(p);
}

static void test_restart_drops_old_records(void **state) {
  (void)state;
  kvr_router_dispatch_t d1;
  pair_t *p = pair_with_one_request(&d1);
  /* b restarts: a new instance, which a's poll learns; its first snapshot lists nothing */
  p->b.r->instance ^= 0x10;
  p->a.r->peer_instance[0] = p->b.r->instance;
  kvr_peer_sync_tick(p->b.s); /* still lists d1 under the new instance: counted once */
  assert_int_equal(view(p->a.r, 0).inflight, 1);
  kvr_router_on_end(p->b.r, &d1);
  kvr_peer_sync_tick(p->b.s);
  assert_int_equal(view(p->a.r, 0).inflight, 0);
  /* a message from an instance no poll named is skipped */
  uint64_t skipped = p->a.r->sync_skipped_total;
  p->b.r->instance ^= 0x20;
  kvr_peer_sync_tick(p->b.s);
  assert_true(p->a.r->sync_skipped_total == skipped + 1);
  pair_close(p);
}

static void collect(void *ctx, const void *data, size_t len) {
  kvr_buf_append(ctx, data, len);
}

/* A frame of several messages back to back (what a loop iteration publishes) does what the
 * messages one by one do; a frame whose tail cannot be split keeps the messages before it and is
 * counted skipped once. */
static void test_batched_frame(void **state) {
  (void)state;
  pair_t *p = pair_open();
  kvr_buf_t frame = KVR_BUF_INIT;
  kvr_peer_sync_set_sink(p->b.s, collect, &frame);
  kvr_peer_sync_tick(p->b.s); /* snapshot */
  kvr_router_dispatch_t d1, d2;
  assert_non_null(kvr_router_on_dispatch(p->b.r, 0, 1000, 0, &d1));
  assert_non_null(kvr_router_on_dispatch(p->b.r, 1, 300, 0, &d2));
  kvr_router_on_end(p->b.r, &d2);
  assert_false(p->a.r->peer_sync_live[0]); /* nothing delivered yet */
  uint64_t skipped = p->a.r->sync_skipped_total;
  kvr_peer_sync_receive(p->a.s, frame.data, frame.len);
  assert_true(p->a.r->peer_sync_live[0]);
  assert_int_equal(p->a.r->peer_sync_messages_total[0], 4);
  assert_int_equal(p->a.r->peer_sync_gaps_total[0], 0);
  assert_int_equal(view(p->a.r, 0).inflight, 1);
  assert_int_equal(view(p->a.r, 0).active_tokens, 1000);
  assert_int_equal(view(p->a.r, 1).inflight, 0);
  assert_int_equal(p->a.r->sync_skipped_total, skipped);
  /* the end of d1 and a torn message after it, in one frame */
  kvr_buf_reset(&frame);
  kvr_router_on_end(p->b.r, &d1);
  size_t whole = frame.len;
  kvr_buf_append(&frame, "\x94\x03", 2); /* an array of 4 with 1 element */
  kvr_peer_sync_receive(p->a.s, frame.data, frame.len);
  assert_true(whole > 0);
  assert_int_equal(view(p->a.r, 0).inflight, 0);
  assert_int_equal(p->a.r->sync_skipped_total, skipped + 1);
  kvr_buf_free(&frame);
  pair_close(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codec_roundtrip),
      cmocka_unit_test(test_codec_refuses),
      cmocka_unit_test(test_batched_frame),
      cmocka_unit_test(test_dispatch_first_end),
      cmocka_unit_test(test_gap_repaired_by_snapshot),
      cmocka_unit_test(test_silent_peer_dropped),
      cmocka_unit_test(test_restart_drops_old_records),
      cmocka_unit_test(test_scrape_adopted),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_kv_sub.c -- src/net/kv_sub.c against real ZMQ sockets (inproc, one context): a PUB and a
 * ROUTER played by the test stand for the engine, batches are packed with msgpack-c. Checked: a
 * complete stream, a gap recovered by replay (both reply forms), a gap without replay, a
 * publisher restart, a late join recovered from seq 0, an evicted replay buffer, a replay that
 * never answers, a payload that is not a batch, and the refill period. */
#include "base/kvr.h"
#include "net/kv_sub.h"

#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <uv.h>
#include <zmq.h>

#include <cmocka.h>

#include "tests/test_util.h"

typedef struct fixture_s {
  uv_loop_t loop;
  void *ctx, *pub, *router;
  kvr_kv_sub_t *sub;
  int batches, resets;
  uint64_t cleared_events; /* AllBlocksCleared events seen: one per batch, tags the seq */
  char ep[64], rep[64];
} fixture_t;

static int counter;

static void on_batch(void *data, const kvr_kv_batch_t *b) {
  fixture_t *f = data;
  f->batches++;
  f->cleared_events += b->nev;
}

static void on_reset(void *data) {
  ((fixture_t *)data)->resets++;
}

static void pump(fixture_t *f, int ms) {
  for (int i = 0; i < ms; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* Runs the loop until nothing has changed for 20 ms (at most 2 s): deliveries on a loaded machine
 * are waited for, not assumed. */
static void settle(fixture_t *f) {
  uint64_t last = 0;
  int quiet = 0;
  for (int i = 0; i < 2000 && quiet < 20; i++) {
    const kvr_kv_stream_stats_t *st = kvr_kv_sub_stats(f->sub);
    uint64_t now = (uint64_t)f->batches * 1000003u + (uint64_t)f->resets * 7919u + st->replays +
                   st->decode_errors * 31u + st->duplicates * 131u;
    quiet = now == last ? quiet + 1 : 0;
    last = now;
    pump(f, 1);
  }
}

static uint64_t replay_request(fixture_t *f, zmq_msg_t *id);
static void replay_reply(fixture_t *f, zmq_msg_t *id, uint64_t from, uint64_t to, bool new_form);

static void setup(fixture_t *f, bool replay, uint64_t refill_ms) {
  memset(f, 0, sizeof(*f));
  uv_loop_init(&f->loop);
  f->ctx = zmq_ctx_new();
  counter++;
  snprintf(f->ep, sizeof(f->ep), "inproc://kv-%d", counter);
  snprintf(f->rep, sizeof(f->rep), "inproc://kv-replay-%d", counter);
  f->pub = zmq_socket(f->ctx, ZMQ_PUB);
  assert_int_equal(zmq_bind(f->pub, f->ep), 0);
  if (replay) {
    f->router = zmq_socket(f->ctx, ZMQ_ROUTER);
    assert_int_equal(zmq_bind(f->router, f->rep), 0);
  }
  kvr_kv_sub_opts_t o = {.endpoint = f->ep,
                         .replay_endpoint = replay ? f->rep : NULL,
                         .replay_timeout_ms = 500,
                         .refill_ms = refill_ms};
  kvr_kv_sub_cbs_t cbs = {on_batch, on_reset, f};
  char err[128];
  f->sub = kvr_kv_sub_new(&f->loop, f->ctx, &o, &cbs, err, sizeof(err));
  assert_non_null(f->sub);
  pump(f, 30); /* the subscription reaches the PUB */
}

/* Answers the stream's first-contact request (replay from 0) with an empty history. */
static void fresh_engine(fixture_t *f) {
  zmq_msg_t id;
  assert_int_equal(replay_request(f, &id), 0);
  replay_reply(f, &id, 0, 0, true);
  assert_int_equal(kvr_kv_sub_mode(f->sub, (uint64_t)kvr_now_ms()), KVR_KV_FALLBACK_NONE);
}

static void teardown(fixture_t *f) {
  kvr_kv_sub_close(f->sub);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  zmq_close(f->pub);
  if (f->router)
    zmq_close(f->router);
  zmq_ctx_term(f->ctx);
  assert_int_equal(uv_loop_close(&f->loop), 0);
}

/* A batch of one AllBlocksCleared event: enough to count what was applied. */
static void payload(msgpack_sbuffer *sb) {
  msgpack_sbuffer_init(sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, 1.0);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_str(&pk, 16);
  msgpack_pack_str_body(&pk, "AllBlocksCleared", 16);
  msgpack_pack_int(&pk, 0);
}

static void be64(unsigned char b[8], uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8)
    b[i] = (unsigned char)v;
}

static void publish(fixture_t *f, uint64_t seq) {
  msgpack_sbuffer sb;
  payload(&sb);
  unsigned char b[8];
  be64(b, seq);
  zmq_send(f->pub, "t", 1, ZMQ_SNDMORE);
  zmq_send(f->pub, b, 8, ZMQ_SNDMORE);
  zmq_send(f->pub, sb.data, sb.size, 0);
  msgpack_sbuffer_destroy(&sb);
  settle(f);
}

/* Reads one replay request; returns its start seq and keeps the identity frame in id. */
static uint64_t replay_request(fixture_t *f, zmq_msg_t *id) {
  for (int i = 0; i < 200; i++) {
    zmq_msg_init(id);
    if (zmq_msg_recv(id, f->router, ZMQ_DONTWAIT) >= 0) {
      char delim[8], start[8];
      assert_int_equal(zmq_recv(f->router, delim, sizeof(delim), 0), 0);
      assert_int_equal(zmq_recv(f->router, start, sizeof(start), 0), 8);
      uint64_t v = 0;
      for (int k = 0; k < 8; k++)
        v = v << 8 | (unsigned char)start[k];
      return v;
    }
    zmq_msg_close(id);
    pump(f, 1);
  }
  fail_msg("no replay request");
  return 0;
}

/* Sends seqs [from, to) in the new (with topic) or old form, then the end marker. */
static void replay_reply(fixture_t *f, zmq_msg_t *id, uint64_t from, uint64_t to, bool new_form) {
  msgpack_sbuffer sb;
  payload(&sb);
  unsigned char b[8];
  for (uint64_t s = from; s <= to; s++) {
    bool end = s == to;
    be64(b, end ? UINT64_MAX : s);
    zmq_send(f->router, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE);
    zmq_send(f->router, "", 0, ZMQ_SNDMORE);
    if (new_form)
      zmq_send(f->router, end ? "" : "t", end ? 0 : 1, ZMQ_SNDMORE);
    zmq_send(f->router, b, 8, ZMQ_SNDMORE);
    zmq_send(f->router, end ? "" : sb.data, end ? 0 : sb.size, 0);
  }
  msgpack_sbuffer_destroy(&sb);
  zmq_msg_close(id);
  settle(f);
}

static uint64_t now_ms(void) {
  return (uint64_t)kvr_now_ms();
}

static void test_complete_stream_and_gap_replay(void **state) {
  (void)state;
  fixture_t f;
  setup(&f, true, 50);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_WAITING);
  fresh_engine(&f); /* the first-contact probe finds no history: complete at once */
  publish(&f, 0);
  publish(&f, 1);
  assert_int_equal(f.batches, 2);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NONE);
  /* 2 and 3 lost: 4 arrives, the sub asks for 2.. and holds 4 */
  publish(&f, 4);
  assert_true(kvr_kv_sub_replaying(f.sub));
  zmq_msg_t id;
  assert_int_equal(replay_request(&f, &id), 2);
  replay_reply(&f, &id, 2, 4, true); /* 2, 3 then the end */
  assert_false(kvr_kv_sub_replaying(f.sub));
  assert_int_equal(f.batches, 5);
  assert_int_equal(f.resets, 0);
  const kvr_kv_stream_stats_t *st = kvr_kv_sub_stats(f.sub);
  assert_int_equal(st->gaps, 1);
  assert_int_equal(st->replays, 2); /* the first-contact probe and this one */
  assert_int_equal(st->last_seq, 4);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NONE);

  /* another gap, replayed with duplicates in the old form */
  publish(&f, 7);
  assert_int_equal(replay_request(&f, &id), 5);
  replay_reply(&f, &id, 3, 7, false); /* 3, 4 are duplicates; 5, 6 new */
  assert_int_equal(f.batches, 8);
  assert_int_equal(st->duplicates, 2);
  assert_int_equal(f.resets, 0);

  /* the publisher restarts: seq 0 again -> reset, then complete from 0 */
  publish(&f, 0);
  assert_int_equal(f.resets, 1);
  assert_int_equal(st->restarts, 1);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NONE);
  teardown(&f);
}

static void test_late_join_and_evicted(void **state) {
  (void)state;
  fixture_t f;
  setup(&f, true, 40);
  /* the router starts after the engine published 0..4: the first-contact replay brings them */
  zmq_msg_t id;
  assert_int_equal(replay_request(&f, &id), 0);
  replay_reply(&f, &id, 0, 5, true);
  assert_int_equal(f.batches, 5);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NONE);
  publish(&f, 5);
  assert_int_equal(f.batches, 6);
  assert_int_equal(f.resets, 0);
  teardown(&f);

  /* the engine's buffer starts at 7: evicted: reset, fallback until refill, then precise */
  setup(&f, true, 400);
  assert_int_equal(replay_request(&f, &id), 0);
  replay_reply(&f, &id, 7, 9, true);
  assert_int_equal(f.resets, 1);
  assert_int_equal(f.batches, 2);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_EVICTED);
  publish(&f, 9);
  assert_int_equal(f.batches, 3);
  pump(&f, 500);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NONE);
  teardown(&f);

  /* the first-contact probe is asked again until the engine answers */
  setup(&f, true, 40);
  assert_int_equal(replay_request(&f, &id), 0);
  zmq_msg_close(&id);
  pump(&f, 600); /* past the 500 ms replay timeout */
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_WAITING);
  assert_int_equal(f.resets, 0);
  assert_int_equal(replay_request(&f, &id), 0);
  replay_reply(&f, &id, 0, 0, false);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NONE);
  teardown(&f);

  /* a gap whose replay is empty: evicted */
  setup(&f, true, 40);
  fresh_engine(&f);
  publish(&f, 0);
  publish(&f, 3);
  assert_int_equal(replay_request(&f, &id), 1);
  replay_reply(&f, &id, 3, 3, true); /* only the end marker */
  assert_int_equal(f.resets, 1);
  assert_int_equal(f.batches, 2);
  assert_int_equal(kvr_kv_sub_stats(f.sub)->replay_failures, 1);
  teardown(&f);
}

static void test_no_replay_timeout_and_garbage(void **state) {
  (void)state;
  fixture_t f;
  /* without a replay endpoint: a late join and a gap each reset (a refill period far longer than
   * the checks take, so a loaded machine cannot end a fallback before it is read) */
  setup(&f, false, 5000);
  publish(&f, 3);
  assert_int_equal(f.resets, 1);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_NO_HISTORY);
  publish(&f, 4);
  publish(&f, 6);
  assert_int_equal(f.resets, 2);
  assert_int_equal(f.batches, 3);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_GAP);
  /* a payload that is not a batch */
  unsigned char b[8];
  be64(b, 7);
  zmq_send(f.pub, "t", 1, ZMQ_SNDMORE);
  zmq_send(f.pub, b, 8, ZMQ_SNDMORE);
  zmq_send(f.pub, "\xc1", 1, 0);
  settle(&f);
  assert_int_equal(f.resets, 3);
  assert_int_equal(kvr_kv_sub_stats(f.sub)->decode_errors, 1);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_DECODE);
  teardown(&f);

  /* a replay socket that stops answering: reset after the timeout, the held batch applied */
  setup(&f, true, 1000);
  fresh_engine(&f);
  publish(&f, 0);
  publish(&f, 2);
  zmq_msg_t id;
  assert_int_equal(replay_request(&f, &id), 1);
  zmq_msg_close(&id);
  pump(&f, 700);
  assert_false(kvr_kv_sub_replaying(f.sub));
  assert_int_equal(f.resets, 1);
  assert_int_equal(f.batches, 2);
  assert_int_equal(kvr_kv_sub_mode(f.sub, now_ms()), KVR_KV_FALLBACK_REPLAY_TIMEOUT);
  publish(&f, 3);
  assert_int_equal(f.batches, 3);
  assert_string_equal(kvr_kv_fallback_name(KVR_KV_FALLBACK_REPLAY_TIMEOUT), "replay_timeout");
  teardown(&f);
}

KVR_TEST_MAIN(cmocka_unit_test(test_complete_stream_and_gap_replay),
              cmocka_unit_test(test_late_join_and_evicted),
              cmocka_unit_test(test_no_replay_timeout_and_garbage))

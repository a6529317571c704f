/* test_kv_feed.c -- serve/kv_feed.c on a loop against real ZMQ publishers standing for the engines
 * of one `vllm serve --data-parallel-size 2` (issue 35): the router is configured with
 * `--worker URL,dp_size=2,kv_events=ipc://PATH`, so the feed opens one subscription per rank, on
 * rank 0's PATH and rank 1's PATH_dp1 (vLLM's ZmqEventPublisher.offset_endpoint_port,
 * vllm/distributed/kv_events.py). The test binds one PUB per rank and publishes EventBatches
 * [ts, [BlockStored], data_parallel_rank] packed with msgpack-c. Checked: each rank's batches reach
 * that rank's worker's precise index and no other; a batch naming another rank on a rank's stream
 * is counted and dropped; the feed's counters reach the router; no libuv handle is left. */
#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "core/router.h"
#include "serve/kv_feed.h"

#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

#include <cmocka.h>

#include "tests/test_util.h"

typedef struct {
  uv_loop_t loop;
  kvr_config_t cfg;
  kvr_router_t *r;
  kvr_kv_feed_t *feed;
  void *ctx, *pub[2];
  uint64_t seq[2];
  char path[64];
} fx_t;

static void pump(fx_t *f, int ms) {
  for (int i = 0; i < ms; i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* One EventBatch: a BlockStored of one 4-token block (engine hash h), naming rank. */
static void batch(msgpack_sbuffer *sb, uint64_t h, int rank) {
  msgpack_sbuffer_init(sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 3);
  msgpack_pack_double(&pk, 1.0);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 5);
  msgpack_pack_str_with_body(&pk, "type", 4);
  msgpack_pack_str_with_body(&pk, "BlockStored", 11);
  msgpack_pack_str_with_body(&pk, "block_hashes", 12);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_uint64(&pk, h);
  msgpack_pack_str_with_body(&pk, "parent_block_hash", 17);
  msgpack_pack_nil(&pk);
  msgpack_pack_str_with_body(&pk, "token_ids", 9);
  msgpack_pack_array(&pk, 4);
  for (int i = 0; i < 4; i++)
    msgpack_pack_int(&pk, 100 + (int)(h % 97) + i);
  msgpack_pack_str_with_body(&pk, "block_size", 10);
  msgpack_pack_int(&pk, 4);
  msgpack_pack_int(&pk, rank);
}

/* Publishes one batch on rank pub's socket (topic "", the next seq of that publisher). */
static void publish(fx_t *f, int pub, uint64_t h, int rank) {
  msgpack_sbuffer sb;
  batch(&sb, h, rank);
  unsigned char b[8];
  uint64_t v = f->seq[pub]++;
  for (int i = 7; i >= 0; i--, v >>= 8)
    b[i] = (unsigned char)v;
  zmq_send(f->pub[pub], "", 0, ZMQ_SNDMORE);
  zmq_send(f->pub[pub], b, 8, ZMQ_SNDMORE);
  zmq_send(f->pub[pub], sb.data, sb.size, 0);
  msgpack_sbuffer_destroy(&sb);
}

static const kvr_worker_t *rank(fx_t *f, int k) {
  return f->r->slots[k];
}

/* What the router has taken from rank pub's stream: blocks in its index plus batches dropped. */
static uint64_t taken(fx_t *f, int pub) {
  return kvr_kv_index_blocks(f->r->kv_index, (size_t)pub) + rank(f, pub)->kv_rank_dropped;
}

/* Publishes (h, rank r) on pub until the router took it (the first ones may go before the
 * subscription has joined: ZMQ's slow joiner; the same block again changes nothing), at most 3 s.
 */
static void publish_until_taken(fx_t *f, int pub, uint64_t h, int r) {
  uint64_t before = taken(f, pub);
  for (int i = 0; i < 300; i++) {
    publish(f, pub, h, r);
    pump(f, 10);
    if (taken(f, pub) > before)
      return;
  }
  fail_msg("rank %d's stream never delivered", pub);
}

static void test_streams_by_rank(void **state) {
  (void)state;
  kvr_log_set_level(KVR_LOG_WARN);
  fx_t f;
  memset(&f, 0, sizeof f);
  assert_int_equal(uv_loop_init(&f.loop), 0);
  snprintf(f.path, sizeof f.path, "/tmp/kvr-test-kv-feed-%d", (int)getpid());
  char spec[160], err[256], ep[80];
  snprintf(spec, sizeof spec, "http://127.0.0.1:1,dp_size=2,kv_events=ipc://%s", f.path);
  kvr_config_init(&f.cfg);
  assert_int_equal(kvr_config_add_worker_spec(&f.cfg, spec, err, sizeof err), 0);
  f.cfg.scrape_interval_ms = 0;
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  f.ctx = zmq_ctx_new();
  for (int k = 0; k < 2; k++) {
    f.pub[k] = zmq_socket(f.ctx, ZMQ_PUB);
    snprintf(ep, sizeof ep, k ? "ipc://%s_dp%d" : "ipc://%s", f.path, k);
    assert_string_equal(rank(&f, k)->kv_events, ep);
    assert_int_equal(zmq_bind(f.pub[k], ep), 0);
  }
  f.feed = kvr_kv_feed_new(&f.loop, f.r); /* one subscription per rank's endpoint */
  pump(&f, 50);

  /* Rank 0's batches reach rank 0's index only. */
  publish_until_taken(&f, 0, 0xa0, 0);
  pump(&f, 300); /* the feed's 250 ms tick pushes the stream counters */
  assert_int_equal(kvr_kv_index_blocks(f.r->kv_index, 0), 1);
  assert_int_equal(kvr_kv_index_blocks(f.r->kv_index, 1), 0);
  /* On rank 1's stream: a batch naming rank 0 is counted and dropped, its own applied. */
  publish_until_taken(&f, 1, 0xb0, 0);
  assert_int_equal(rank(&f, 1)->kv_rank_dropped, 1);
  assert_int_equal(kvr_kv_index_blocks(f.r->kv_index, 1), 0);
  assert_int_equal(kvr_kv_index_blocks(f.r->kv_index, 0), 1);
  publish_until_taken(&f, 1, 0xb1, 1);
  assert_int_equal(kvr_kv_index_blocks(f.r->kv_index, 1), 1);
  assert_int_equal(rank(&f, 1)->kv_rank_dropped, 1);
  assert_int_equal(f.r->kv_rank_dropped_total, 1);
  pump(&f, 300);
  assert_true(rank(&f, 0)->kv_stats.batches >= 1);
  assert_true(rank(&f, 1)->kv_stats.batches >= 2); /* the stream delivered both; one dropped */

  kvr_kv_feed_close(f.feed);
  uv_run(&f.loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f.loop), 0);
  for (int k = 0; k < 2; k++)
    zmq_close(f.pub[k]);
  zmq_ctx_term(f.ctx);
  kvr_router_free(f.r);
  kvr_config_free(&f.cfg);
  unlink(f.path);
  snprintf(ep, sizeof ep, "%s_dp1", f.path);
  unlink(ep);
  kvr_log_set_level(KVR_LOG_INFO);
}

KVR_TEST_MAIN(cmocka_unit_test(test_streams_by_rank))

/* test_cache_index.c -- the block -> workers index: matching, LRU eviction at capacity, worker
 * removal, a randomized comparison against a naive reference model (arrays with use stamps) on
 * hashes crafted to share their first bucket, which exercises cuckoo walks and bucket splits, the
 * same with hundreds of workers sharing blocks (holder sets inline and wide), a table filled to
 * its maximum load, and growth a bucket at a time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "core/cache_index.h"
#include "policies/policy.h"

static void chain(uint64_t *out, size_t n, uint64_t base) {
  for (size_t i = 0; i < n; i++)
    out[i] = base * 1000 + i + 1;
}

static void test_match_longest_prefix(void **state) {
  (void)state;
  kvr_cache_index_t *idx = kvr_cache_index_new(4, 1000);
  assert_non_null(idx);
  uint64_t a[11];
  chain(a, 10, 1);
  a[10] = 99999;
  assert_int_equal(kvr_cache_index_insert(idx, 0, a, 10), 0);
  assert_int_equal(kvr_cache_index_insert(idx, 1, a, 5), 0);
  size_t m[4];
  kvr_cache_index_match(idx, a, 11, m);
  assert_int_equal(m[0], 10);
  assert_int_equal(m[1], 5);
  assert_int_equal(m[2], 0);
  assert_int_equal(m[3], 0);
  /* A request that shares the first two blocks, then goes its own way (chained hashes: every
   * later block differs too). */
  uint64_t b[4] = {a[0], a[1], 424242, 424243};
  kvr_cache_index_match(idx, b, 4, m);
  assert_int_equal(m[0], 2);
  assert_int_equal(m[1], 2);
  kvr_cache_index_match(idx, a, 0, m);
  assert_int_equal(m[0], 0);
  assert_int_equal(kvr_cache_index_entries(idx, 0), 10);
  assert_int_equal(kvr_cache_index_entries(idx, 1), 5);
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.blocks, 10);
  assert_int_equal(st.entries, 15);
  assert_true(st.bytes_per_entry > 0);
  /* Re-inserting is a touch, not a new entry. */
  assert_int_equal(kvr_cache_index_insert(idx, 0, a, 10), 0);
  assert_int_equal(kvr_cache_index_entries(idx, 0), 10);
  kvr_cache_index_free(idx);
  kvr_cache_index_free(NULL);
}

static void test_eviction_at_capacity(void **state) {
  (void)state;
  kvr_cache_index_t *idx = kvr_cache_index_new(2, 8);
  uint64_t a[5], b[5];
  chain(a, 5, 1);
  chain(b, 5, 2);
  size_t m[2];
  kvr_cache_index_insert(idx, 0, a, 5);
  kvr_cache_index_insert(idx, 0, b, 5);
  assert_int_equal(kvr_cache_index_entries(idx, 0), 8);
  /* a was used least recently and loses its deep end first. */
  kvr_cache_index_match(idx, a, 5, m);
  assert_int_equal(m[0], 3);
  kvr_cache_index_match(idx, b, 5, m);
  assert_int_equal(m[0], 5);
  /* Using a again makes b the least recently used. */
  kvr_cache_index_insert(idx, 0, a, 5);
  kvr_cache_index_match(idx, a, 5, m);
  assert_int_equal(m[0], 5);
  kvr_cache_index_match(idx, b, 5, m);
  assert_int_equal(m[0], 3);
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.evictions, 4);
  assert_int_equal(st.entries, 8);
  assert_int_equal(st.blocks, 8);

  /* A prompt longer than the capacity keeps its first `capacity` blocks. */
  uint64_t c[20];
  chain(c, 20, 3);
  kvr_cache_index_set_capacity(idx, 1, 6);
  kvr_cache_index_insert(idx, 1, c, 20);
  kvr_cache_index_match(idx, c, 20, m);
  assert_int_equal(m[1], 6);
  assert_int_equal(kvr_cache_index_entries(idx, 1), 6);

  /* Shrinking the capacity evicts at once; capacity 0 holds nothing. */
  kvr_cache_index_set_capacity(idx, 1, 2);
  assert_int_equal(kvr_cache_index_entries(idx, 1), 2);
  kvr_cache_index_match(idx, c, 20, m);
  assert_int_equal(m[1], 2);
  kvr_cache_index_set_capacity(idx, 1, 0);
  kvr_cache_index_insert(idx, 1, c, 20);
  assert_int_equal(kvr_cache_index_entries(idx, 1), 0);
  assert_int_equal(kvr_cache_index_capacity(idx, 1), 0);
  assert_int_equal(kvr_cache_index_capacity(idx, 0), 8);
  kvr_cache_index_free(idx);
}

static void test_forget_worker(void **state) {
  (void)state;
  kvr_cache_index_t *idx = kvr_cache_index_new(3, 100);
  uint64_t a[30];
  chain(a, 30, 7);
  kvr_cache_index_insert(idx, 0, a, 30);
  kvr_cache_index_insert(idx, 2, a, 10);
  assert_int_equal(kvr_cache_index_forget_worker(idx, 0), 0);
  size_t m[3];
  kvr_cache_index_match(idx, a, 30, m);
  assert_int_equal(m[0], 0);
  assert_int_equal(m[2], 10);
  assert_int_equal(kvr_cache_index_entries(idx, 0), 0);
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.blocks, 10);
  assert_int_equal(st.entries, 10);
  /* The worker can learn again afterwards. */
  kvr_cache_index_insert(idx, 0, a, 4);
  kvr_cache_index_match(idx, a, 30, m);
  assert_int_equal(m[0], 4);
  kvr_cache_index_free(idx);
}

static void test_bad_arguments(void **state) {
  (void)state;
  assert_null(kvr_cache_index_new(0, 10));
  assert_null(kvr_cache_index_new(KVR_MAX_WORKERS + 1, 10));
  kvr_cache_index_t *idx = kvr_cache_index_new(KVR_MAX_WORKERS, 10);
  assert_non_null(idx);
  uint64_t a[3] = {1, 2, 3};
  assert_int_equal(kvr_cache_index_insert(idx, KVR_MAX_WORKERS, a, 3), KVR_EINVAL);
  assert_int_equal(kvr_cache_index_set_capacity(idx, KVR_MAX_WORKERS, 3), KVR_EINVAL);
  assert_int_equal(kvr_cache_index_forget_worker(idx, KVR_MAX_WORKERS), KVR_EINVAL);
  assert_int_equal(kvr_cache_index_entries(idx, KVR_MAX_WORKERS), 0);
  /* The highest worker index works (a wide holder set's last bit). */
  assert_int_equal(kvr_cache_index_insert(idx, KVR_MAX_WORKERS - 1, a, 3), 0);
  size_t m[KVR_MAX_WORKERS];
  kvr_cache_index_match(idx, a, 3, m);
  assert_int_equal(m[KVR_MAX_WORKERS - 1], 3);
  assert_int_equal(m[0], 0);
  /* More blocks than 2^30 slots can hold: refused before any arithmetic or allocation. */
  assert_int_equal(kvr_cache_index_reserve(idx, UINT64_MAX), KVR_ELIMIT);
  assert_int_equal(kvr_cache_index_reserve(idx, UINT64_C(1) << 30), KVR_ELIMIT);
  /* A nonempty index is left to grow by itself. */
  assert_int_equal(kvr_cache_index_reserve(idx, 1000000), 0);
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_true(st.table_slots < 100000); /* nothing was reserved */
  kvr_cache_index_free(idx);
}

static void test_capacity_from_vllm(void **state) {
  (void)state;
  /* The workload's H200: 53.15 GiB of FP8 KV at 163,840 bytes per token = ~348k tokens =
   * 21,778 vLLM blocks of 16 tokens = 21,778 router blocks of 64 bytes (16 tokens). */
  assert_int_equal(kvr_cache_index_capacity_from_vllm(21778, 16, 64), 21778);
  assert_int_equal(kvr_cache_index_capacity_from_vllm(1000, 16, 128), 500);
  /* A scrape whose product overflows reads as unbounded, not as a wrapped small number. */
  assert_true(kvr_cache_index_capacity_from_vllm(UINT64_MAX / 8, 16, 64) == UINT64_MAX);
  assert_int_equal(kvr_cache_index_capacity_from_vllm(0, 16, 64), 0);
  assert_int_equal(kvr_cache_index_capacity_from_vllm(10, 0, 64), 0);
}

/* --- randomized comparison with a naive model ------------------------------------------------- */

#define RW 4
#define RCAP 40

typedef struct {
  uint64_t hash[RCAP];
  uint64_t stamp[RCAP];
  size_t n;
  size_t cap;
} ref_worker_t;

static uint64_t ref_clock;

static long ref_find(const ref_worker_t *w, uint64_t h) {
  for (size_t i = 0; i < w->n; i++)
    if (w->hash[i] == h)
      return (long)i;
  return -1;
}

static void ref_insert(ref_worker_t *w, const uint64_t *b, size_t n) {
  size_t missing = 0;
  for (size_t k = 0; k < n; k++)
    missing += ref_find(w, b[k]) < 0;
  if (missing && w->n + missing > w->cap)
    for (size_t k = n; k-- > 0;) {
      long i = ref_find(w, b[k]);
      if (i >= 0)
        w->stamp[i] = ++ref_clock;
    }
  for (size_t k = n; k-- > 0;) {
    long i = ref_find(w, b[k]);
    if (i >= 0) {
      w->stamp[i] = ++ref_clock;
      continue;
    }
    if (w->cap == 0)
      continue;
    if (w->n >= w->cap) {
      size_t old = 0;
      for (size_t j = 1; j < w->n; j++)
        if (w->stamp[j] < w->stamp[old])
          old = j;
      w->hash[old] = w->hash[w->n - 1];
      w->stamp[old] = w->stamp[w->n - 1];
      w->n--;
    }
    w->hash[w->n] = b[k];
    w->stamp[w->n] = ++ref_clock;
    w->n++;
  }
}

static size_t ref_match(const ref_worker_t *w, const uint64_t *b, size_t n) {
  size_t i = 0;
  while (i < n && ref_find(w, b[i]) >= 0)
    i++;
  return i;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

/* Hashes from a small universe whose low bits (which pick the first bucket) fall in 9 classes,
 * so first buckets overflow, blocks live in their second bucket and cuckoo walks displace them.
 */
static uint64_t collide_hash(uint64_t k) {
  return (k << 32) | (k % 9);
}

/* Writes the first n blocks of a chain of the tree of prompts: one of 6 roots, then from block
 * `split` on, branch 1 or 2 goes its own way (branch 0 stays on the trunk). Every block has one
 * parent, as chained hashes make them: a branch block's key names its root, branch, split and
 * depth. */
static void chain_of(uint64_t *b, size_t n, uint64_t root, uint64_t branch, uint64_t split) {
  for (size_t i = 0; i < n; i++)
    b[i] =
        collide_hash(root * 4096 + (branch == 0 || i < split ? 0 : (branch * 16 + split) * 16) + i);
}

/* The randomized comparison over the index's workers ids[0..RW) (of nworkers): inserts of chains
 * from the tree, capacity changes and forgets against the model, every answer checked. */
static void random_vs_reference(const size_t *ids, size_t nworkers, uint64_t seed, int every) {
  kvr_cache_index_t *idx = kvr_cache_index_new(nworkers, RCAP);
  ref_worker_t ref[RW];
  memset(ref, 0, sizeof(ref));
  for (size_t w = 0; w < RW; w++)
    ref[w].cap = RCAP;
  size_t *m = calloc(nworkers, sizeof *m);
  for (int op = 0; op < 20000; op++) {
    uint64_t r = rng_next(&seed);
    size_t w = r % RW;
    size_t n = 1 + (r >> 8) % 12;
    uint64_t b[12];
    chain_of(b, n, (r >> 16) % 6, (r >> 24) % 3, (r >> 44) % 13);
    switch ((r >> 32) % 10) {
    case 0:
      if ((r >> 40) % 20 == 0) {
        kvr_cache_index_forget_worker(idx, ids[w]);
        ref[w].n = 0;
      }
      break;
    case 1: {
      size_t cap = (r >> 40) % (RCAP + 1);
      kvr_cache_index_set_capacity(idx, ids[w], cap);
      ref[w].cap = cap;
      while (ref[w].n > cap) { /* evict LRU in the model */
        size_t old = 0;
        for (size_t j = 1; j < ref[w].n; j++)
          if (ref[w].stamp[j] < ref[w].stamp[old])
            old = j;
        ref[w].hash[old] = ref[w].hash[ref[w].n - 1];
        ref[w].stamp[old] = ref[w].stamp[ref[w].n - 1];
        ref[w].n--;
      }
      break;
    }
    default:
      assert_int_equal(kvr_cache_index_insert(idx, ids[w], b, n), 0);
      ref_insert(&ref[w], b, n);
    }
    kvr_cache_index_match(idx, b, n, m);
    for (size_t k = 0; k < RW; k++) {
      if (m[ids[k]] != ref_match(&ref[k], b, n))
        fail_msg("op %d worker %zu: index %zu, model %zu", op, ids[k], m[ids[k]],
                 ref_match(&ref[k], b, n));
      assert_int_equal(kvr_cache_index_entries(idx, ids[k]), ref[k].n);
    }
    /* The longest chain of another root and branch: the binary search against the model's walk. */
    uint64_t q[12], qr = rng_next(&seed);
    chain_of(q, 12, qr % 6, qr / 6 % 3, qr / 18 % 13);
    kvr_cache_index_match(idx, q, 12, m);
    for (size_t k = 0; k < RW; k++)
      if (m[ids[k]] != ref_match(&ref[k], q, 12))
        fail_msg("op %d worker %zu: index %zu, model %zu (query)", op, ids[k], m[ids[k]],
                 ref_match(&ref[k], q, 12));
    if (op % every == 0) /* full membership, block by block */
      for (uint64_t key = 0; key < 6 * 4096; key++) {
        uint64_t h = collide_hash(key);
        kvr_cache_index_match(idx, &h, 1, m);
        for (size_t k = 0; k < RW; k++)
          if (m[ids[k]] != (ref_find(&ref[k], h) >= 0))
            fail_msg("op %d worker %zu key %llu: index %zu", op, ids[k], (unsigned long long)key,
                     m[ids[k]]);
      }
  }
  /* Every block the model holds is found, one by one. */
  for (size_t k = 0; k < RW; k++)
    for (size_t i = 0; i < ref[k].n; i++) {
      kvr_cache_index_match(idx, &ref[k].hash[i], 1, m);
      assert_int_equal(m[ids[k]], 1);
    }
  free(m);
  kvr_cache_index_free(idx);
}

static void test_random_vs_reference(void **state) {
  (void)state;
  static const size_t ids[RW] = {0, 1, 2, 3};
  random_vs_reference(ids, RW, 12345, 50);
}

/* The same with RW workers of a fleet of KVR_MAX_WORKERS, ids spread so that blocks they share
 * are held inline (two workers) and in wide sets of every class, which grow (an id past the set's
 * words) and shrink back inline as holders leave. */
static void test_random_vs_reference_wide(void **state) {
  (void)state;
  static const size_t ids[RW] = {5, 700, 800, KVR_MAX_WORKERS - 1};
  random_vs_reference(ids, KVR_MAX_WORKERS, 777, 1000);
  static const size_t low[RW] = {63, 64, 65, 200};
  random_vs_reference(low, 256, 4242, 250);
}

/* Hundreds of workers holding the same prefix to different depths (a popular system prompt, then
 * each its own conversation): match gives each its own length, found by shared probes. */
static void test_many_workers_share_a_prefix(void **state) {
  (void)state;
  enum { W = 1024, N = 600 };
  kvr_cache_index_t *idx = kvr_cache_index_new(W, 100000);
  uint64_t *b = malloc(N * sizeof *b);
  for (size_t i = 0; i < N; i++)
    b[i] = rng_next(&(uint64_t){i + 1});
  for (size_t w = 0; w < W; w += 3) /* a third of them, each to its own depth */
    assert_int_equal(kvr_cache_index_insert(idx, w, b, 1 + (w * 7) % N), 0);
  size_t *m = calloc(W, sizeof *m);
  kvr_cache_index_match(idx, b, N, m);
  for (size_t w = 0; w < W; w++)
    if (m[w] != (w % 3 == 0 ? 1 + (w * 7) % N : 0))
      fail_msg("worker %zu: matched %zu", w, m[w]);
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_true(st.wide_sets > 0);
  for (size_t w = 0; w < W; w += 3)
    assert_int_equal(kvr_cache_index_forget_worker(idx, w), 0);
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.blocks, 0);
  assert_int_equal(st.wide_sets, 0);
  free(m);
  free(b);
  kvr_cache_index_free(idx);
}

/* An index never sized grows a bucket at a time past several doublings and table chunks (32,768
 * buckets each): the load stays at 90% or less, every block is found, and the workers added on
 * the way (kvr_cache_index_set_workers) start empty with the default capacity. */
static void test_growth_by_splits(void **state) {
  (void)state;
  enum { N = 300000 };
  kvr_cache_index_t *idx = kvr_cache_index_new(1, N);
  uint64_t *b = malloc(N * sizeof *b);
  uint64_t s = 5;
  for (size_t i = 0; i < N; i++)
    b[i] = rng_next(&s);
  size_t m[8];
  for (size_t i = 0; i < N; i += 250) {
    size_t w = (i / 250) % 8;
    assert_int_equal(kvr_cache_index_set_workers(idx, w + 1), 0);
    assert_int_equal(kvr_cache_index_insert(idx, w, b + i, 250), 0);
    kvr_cache_index_stats_t st;
    kvr_cache_index_stats(idx, &st);
    assert_true(st.blocks * 100 <= st.table_slots * 90);
  }
  assert_int_equal(kvr_cache_index_workers(idx), 8);
  assert_int_equal(kvr_cache_index_set_workers(idx, 4), 0); /* never shrinks */
  assert_int_equal(kvr_cache_index_workers(idx), 8);
  assert_int_equal(kvr_cache_index_set_workers(idx, KVR_MAX_WORKERS + 1), KVR_EINVAL);
  for (size_t i = 0; i < N; i++) {
    kvr_cache_index_match(idx, &b[i], 1, m);
    if (m[(i / 250) % 8] != 1)
      fail_msg("block %zu lost", i);
  }
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_true(st.splits > 0);
  assert_true(st.table_slots > 4 * 32768); /* past the first table chunk */
  assert_true(st.bytes_per_entry < 40);
  free(b);
  kvr_cache_index_free(idx);
}

/* Growth past the initial table, then shrinking everything away, leaves a consistent index. */
static void test_growth_and_drain(void **state) {
  (void)state;
  kvr_cache_index_t *idx = kvr_cache_index_new(4, 100000);
  uint64_t *b = malloc(50000 * sizeof(uint64_t));
  uint64_t s = 99;
  for (size_t i = 0; i < 50000; i++)
    b[i] = rng_next(&s);
  for (size_t w = 0; w < 4; w++)
    assert_int_equal(kvr_cache_index_insert(idx, w, b + w * 10000, 20000), 0);
  size_t m[4];
  kvr_cache_index_match(idx, b + 10000, 10000, m);
  assert_int_equal(m[0], 10000);
  assert_int_equal(m[1], 10000);
  assert_int_equal(m[2], 0);
  kvr_cache_index_stats_t st;
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.blocks, 50000);
  assert_int_equal(st.entries, 80000);
  assert_true(st.blocks * 100 <= st.table_slots * 90); /* load <= 90% */
  assert_true(st.node_slots >= st.entries);
  for (size_t w = 0; w < 4; w++)
    kvr_cache_index_forget_worker(idx, w);
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.blocks, 0);
  assert_int_equal(st.entries, 0);
  /* Empty again: a reserve sizes the table at once; nodes still come as entries do. */
  uint64_t nodes = st.node_slots;
  assert_int_equal(kvr_cache_index_reserve(idx, 200000), 0);
  kvr_cache_index_stats(idx, &st);
  assert_true(st.table_slots * 90 >= 200000 * 100);
  assert_int_equal(st.node_slots, nodes);
  free(b);
  kvr_cache_index_free(idx);
}

/* A table reserved for n blocks takes n random blocks without growing (90% load at most) and
 * finds every one of them, spread over workers; then each worker's capacity shrinks to half
 * and exactly the most recently used half of each worker's blocks is still found. Nodes are
 * allocated as entries come, one chunk of 16,384 at a time. */
static void test_full_reserved_table(void **state) {
  (void)state;
  enum { N = 60000, W = 3 };
  kvr_cache_index_t *idx = kvr_cache_index_new(W, N);
  assert_int_equal(kvr_cache_index_reserve(idx, N), 0);
  kvr_cache_index_stats_t before, st;
  kvr_cache_index_stats(idx, &before);
  uint64_t *b = malloc(N * sizeof(uint64_t));
  uint64_t s = 7;
  for (size_t i = 0; i < N; i++)
    b[i] = rng_next(&s);
  for (size_t i = 0; i < N; i++) /* one block at a time: worker i % W, in order */
    assert_int_equal(kvr_cache_index_insert(idx, i % W, &b[i], 1), 0);
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.table_slots, before.table_slots); /* no growth */
  assert_int_equal(before.node_slots, 0);
  assert_true(st.node_slots >= N && st.node_slots < N + 16384);
  assert_int_equal(st.blocks, N);
  assert_true(st.blocks * 100 > st.table_slots * 89); /* filled past 89% */
  size_t m[W];
  for (size_t i = 0; i < N; i++) {
    kvr_cache_index_match(idx, &b[i], 1, m);
    for (size_t w = 0; w < W; w++)
      if (m[w] != (w == i % W))
        fail_msg("block %zu worker %zu: matched %zu", i, w, m[w]);
  }
  for (size_t w = 0; w < W; w++)
    assert_int_equal(kvr_cache_index_set_capacity(idx, w, N / W / 2), 0);
  for (size_t i = 0; i < N; i++) {
    kvr_cache_index_match(idx, &b[i], 1, m);
    assert_int_equal(m[i % W], i >= N / 2); /* each worker kept its later half */
  }
  kvr_cache_index_stats(idx, &st);
  assert_int_equal(st.blocks, N / 2);
  free(b);
  kvr_cache_index_free(idx);
}

KVR_TEST_MAIN(cmocka_unit_test(test_match_longest_prefix),
              cmocka_unit_test(test_eviction_at_capacity), cmocka_unit_test(test_forget_worker),
              cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_capacity_from_vllm),
              cmocka_unit_test(test_random_vs_reference),
              cmocka_unit_test(test_random_vs_reference_wide),
              cmocka_unit_test(test_many_workers_share_a_prefix),
              cmocka_unit_test(test_growth_by_splits), cmocka_unit_test(test_growth_and_drain),
              cmocka_unit_test(test_full_reserved_table))

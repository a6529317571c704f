/* route_bench.c -- the routing micro-benchmark: what one routing decision costs on the loop thread.
 *
 * Setup: K synthetic multi-turn chat bodies of --prompt-kib KiB each (a long system prompt then
 * user/assistant turns), serialized to JSON; a cache index holding --blocks blocks spread over
 * --workers workers (random 256-block chains, round robin over workers), plus every benchmark
 * prompt fully on one worker and half on another, so matching walks the whole prompt (the worst
 * case: a long conversation's next turn).
 *
 * Timed per decision with kvr_now_ns(): (1) prompt features from the parsed tree (canonical text
 * + XXH3 block hashes), (2) cache-index match, (3) snapshot fill + policy select; the sum is the
 * decision. JSON parsing (cJSON_Parse of the body) is timed separately because the proxy parses
 * once for everything. Two passes: "warm" (prompts cycle, caches as they fall) and "cold" (a 64 MiB
 * buffer is streamed through the caches before each decision, untimed). Index insert (what the
 * proxy does after the pick) is timed too. Memory per (block, worker) entry comes from the index's
 * own allocation figures.
 *
 * Two index costs outside a decision, after the memory figures are taken: (4) steady state:
 * --blocks more new random blocks into the full index, which evicts as many (each worker at its
 * capacity, give or take the last chain of the fill), the cost per new block; (5) growth: a second
 * index created unsized, as one is before the router learns its workers' capacities, filled with
 * the same --blocks blocks; its rehashes happen inside single inserts, so the longest insert is
 * about the stall a router would see on its loop if it did not size the index (src/core/router.c
 * index_provision).
 *
 * Output: a Markdown table on stdout.
 */
#include "route_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/kvr.h"
#include "base/quantile.h"
#include "core/cache_index.h"
#include "policies/policy.h"
#include "proto/prompt.h"

#define NPROMPTS 16
#define FLUSH_BYTES (64u << 20)

typedef struct series_s {
  uint64_t *ns;
  size_t n;
} series_t;

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Percentile p (0..100) of the sorted series in microseconds, by the one definition every product
 * uses (src/base/quantile.h: numpy's linear interpolation). */
static double pct(const series_t *s, double p) {
  return kvr_quantile_u64(s->ns, s->n, p) / 1000.0;
}

static double mean_us(const series_t *s) {
  double sum = 0;
  for (size_t i = 0; i < s->n; i++)
    sum += (double)s->ns[i];
  return s->n ? sum / (double)s->n / 1000.0 : 0;
}

static void row(const char *what, series_t *s) {
  qsort(s->ns, s->n, sizeof(uint64_t), cmp_u64);
  printf("| %s | %zu | %.1f | %.1f | %.1f | %.0f |\n", what, s->n, pct(s, 50), pct(s, 99),
         mean_us(s), mean_us(s) > 0 ? 1e6 / mean_us(s) : 0);
}

static const char *const words[] = {"the",     "prefix", "cache",  "of",     "a",       "worker",
                                    "holds",   "blocks", "tokens", "and",    "decode",  "steps",
                                    "prefill", "chunk",  "GPU",    "memory", "latency", "is",
                                    "bound",   "by",     "batch",  "size",   "router",  "model"};

static void gen_text(kvr_buf_t *b, uint64_t *st, size_t n) {
  size_t end = b->len + n;
  while (b->len < end) {
    kvr_buf_puts(b, words[kvr_policy_rand(st) % KVR_ARRAY_SIZE(words)]);
    kvr_buf_puts(b, " ");
  }
}

/* A chat body of about kib KiB: a quarter system prompt, then 4 KiB user/assistant turns. */
static char *make_body(size_t kib, uint64_t seed) {
  uint64_t st = seed;
  size_t total = kib * 1024;
  cJSON *body = cJSON_CreateObject();
  cJSON_AddStringToObject(body, "model", "meta-llama/Llama-3.3-70B-Instruct");
  cJSON_AddNumberToObject(body, "max_tokens", 1024);
  cJSON_AddBoolToObject(body, "stream", 1);
  cJSON *msgs = cJSON_AddArrayToObject(body, "messages");
  size_t used = 0;
  for (int k = 0; used < total; k++) {
    kvr_buf_t t = KVR_BUF_INIT;
    size_t want = k == 0 ? total / 4 : KVR_MIN((size_t)4096, total - used);
    gen_text(&t, &st, want);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", k == 0 ? "system" : (k % 2 ? "user" : "assistant"));
    cJSON_AddStringToObject(m, "content", t.data);
    cJSON_AddItemToArray(msgs, m);
    used += t.len;
    kvr_buf_free(&t);
  }
  char *s = cJSON_PrintUnformatted(body);
  cJSON_Delete(body);
  return s;
}

void kvr_route_bench_opts_default(kvr_route_bench_opts_t *o) {
  o->prompt_kib = 64;
  o->workers = 4;
  o->blocks = 1000000;
  o->decisions = 20000;
  o->block_chars = KVR_PROMPT_BLOCK_CHARS_DEFAULT;
  o->policy = "kv_aware";
}

/* One run: the inputs every pass shares and the series it fills. rb_free() releases all of it. */
typedef struct rb_s {
  kvr_route_bench_opts_t o;
  char *bodies[NPROMPTS];
  cJSON *trees[NPROMPTS];
  kvr_cache_index_t *idx;
  kvr_policy_t *pol;
  kvr_worker_snap_t snaps[KVR_MAX_WORKERS];
  uint64_t per_worker;                /* index capacity per worker, in blocks */
  size_t prompt_blocks, prompt_bytes; /* of one benchmark prompt */
  uint64_t fill_ns, warm_ns;          /* index fill; the whole warm loop */
  uint64_t steady_ns;                 /* --blocks new blocks into the full index */
  uint64_t grow_ns, grow_max_ns;      /* unsized fill: whole, and its longest single insert */
  size_t grow_slow;                   /* unsized fill: inserts that took over 1 ms */
  uint64_t grow_slots, grow_blocks;   /* unsized fill: table slots and blocks at the end */
  kvr_cache_index_stats_t cs;         /* the full index, before (4) */
  series_t parse, ins;                /* JSON parse; index insert after the pick */
  series_t warm[4], cold[4];          /* hash, match, select, decision */
} rb_t;

enum { S_HASH, S_MATCH, S_SELECT, S_TOTAL };

/* One timed decision; adds its parts to the four series of s at index i. */
static int decide(rb_t *rb, const cJSON *tree, size_t i, series_t *s) {
  const kvr_route_bench_opts_t *o = &rb->o;
  kvr_prompt_t p;
  char err[256];
  size_t matched[KVR_MAX_WORKERS];
  uint64_t t0 = kvr_now_ns();
  if (kvr_prompt_from_json(tree, KVR_PROMPT_CHAT, o->block_chars, &p, err, sizeof(err)) != 0) {
    fprintf(stderr, "route bench: %s\n", err);
    return -1;
  }
  uint64_t t1 = kvr_now_ns();
  kvr_cache_index_match(rb->idx, p.blocks, p.nblocks, matched);
  uint64_t t2 = kvr_now_ns();
  for (size_t w = 0; w < o->workers; w++) {
    rb->snaps[w].matched_blocks = matched[w];
    rb->snaps[w].cached_blocks = kvr_cache_index_entries(rb->idx, w);
  }
  kvr_route_req_t req;
  kvr_prompt_route_req(&p, &req);
  int k = kvr_policy_select(rb->pol, rb->snaps, o->workers, &req, 0, NULL);
  uint64_t t3 = kvr_now_ns();
  kvr_prompt_free(&p);
  if (k < 0)
    return -1;
  s[S_HASH].ns[i] = t1 - t0;
  s[S_MATCH].ns[i] = t2 - t1;
  s[S_SELECT].ns[i] = t3 - t2;
  s[S_TOTAL].ns[i] = t3 - t0;
  return 0;
}

static void alloc_series(series_t *s, size_t n) {
  s->ns = kvr_xcalloc(n, sizeof(uint64_t));
  s->n = n;
}

static void rb_free(rb_t *rb) {
  free(rb->parse.ns);
  free(rb->ins.ns);
  for (size_t k = 0; k < 4; k++) {
    free(rb->warm[k].ns);
    free(rb->cold[k].ns);
  }
  kvr_policy_destroy(rb->pol);
  kvr_cache_index_free(rb->idx);
  for (size_t k = 0; k < NPROMPTS; k++) {
    cJSON_Delete(rb->trees[k]);
    cJSON_free(rb->bodies[k]);
  }
}

/* Random chains of 256 blocks (the last one shorter), nblocks in all, into idx round robin over
 * the workers, each insert timed; returns the total and the longest in *max_ns, the count over
 * 1 ms in *slow. */
static uint64_t insert_chains(kvr_cache_index_t *idx, size_t workers, uint64_t nblocks,
                              uint64_t seed, uint64_t *max_ns, size_t *slow) {
  uint64_t st = seed, chain[256], total = 0;
  *max_ns = 0;
  *slow = 0;
  for (uint64_t done = 0, c = 0; done < nblocks; c++) {
    size_t n = (size_t)KVR_MIN((uint64_t)256, nblocks - done);
    for (size_t i = 0; i < n; i++)
      chain[i] = kvr_policy_rand(&st);
    uint64_t t0 = kvr_now_ns();
    kvr_cache_index_insert(idx, c % workers, chain, n);
    uint64_t dt = kvr_now_ns() - t0;
    total += dt;
    *max_ns = KVR_MAX(*max_ns, dt);
    *slow += dt > 1000000;
    done += n;
  }
  return total;
}

/* The index at capacity, as a router's is once its workers' caches have filled: each worker
 * holds o.blocks / W blocks at most, the index is sized for that (kvr_cache_index_reserve, as the
 * router does from its workers' capacities), o.blocks random blocks in 256-block chains go round
 * robin over the workers, then each benchmark prompt fully on worker k % W and its first half on
 * worker (k + 1) % W (evicting the oldest chains), so matching searches the whole prompt. */
static int fill_index(rb_t *rb) {
  const kvr_route_bench_opts_t *o = &rb->o;
  rb->per_worker = o->blocks / o->workers;
  rb->idx = kvr_cache_index_new(o->workers, rb->per_worker);
  if (rb->idx == NULL || kvr_cache_index_reserve(rb->idx, rb->per_worker * o->workers) != 0) {
    fprintf(stderr, "route bench: cannot allocate the index\n");
    return -1;
  }
  uint64_t max_ns, t0 = kvr_now_ns();
  size_t slow;
  insert_chains(rb->idx, o->workers, o->blocks, 7, &max_ns, &slow);
  rb->fill_ns = kvr_now_ns() - t0; /* the whole fill, drawing the blocks included, as before */
  for (size_t k = 0; k < NPROMPTS; k++) {
    kvr_prompt_t p;
    char err[256];
    if (kvr_prompt_from_json(rb->trees[k], KVR_PROMPT_CHAT, o->block_chars, &p, err, sizeof(err))) {
      fprintf(stderr, "route bench: %s\n", err);
      return -1;
    }
    kvr_cache_index_insert(rb->idx, k % o->workers, p.blocks, p.nblocks);
    if (o->workers > 1)
      kvr_cache_index_insert(rb->idx, (k + 1) % o->workers, p.blocks, p.nblocks / 2);
    rb->prompt_blocks = p.nblocks;
    rb->prompt_bytes = p.text.len;
    kvr_prompt_free(&p);
  }
  return 0;
}

/* Bodies, their trees, the index, the policy and the workers' snapshots (uneven loads). */
static int setup(rb_t *rb) {
  for (size_t k = 0; k < NPROMPTS; k++) {
    rb->bodies[k] = make_body(rb->o.prompt_kib, 1000 + k);
    rb->trees[k] = cJSON_Parse(rb->bodies[k]);
  }
  if (fill_index(rb) != 0)
    return -1;
  char err[256];
  rb->pol = kvr_policy_create(rb->o.policy, NULL, 1, err, sizeof(err));
  if (rb->pol == NULL) {
    fprintf(stderr, "route bench: %s\n", err);
    return -1;
  }
  for (size_t w = 0; w < rb->o.workers; w++) {
    rb->snaps[w].id = (uint32_t)w;
    rb->snaps[w].usable = true;
    rb->snaps[w].inflight = (uint32_t)(w % 3);
    rb->snaps[w].active_tokens = 4000 * (w % 3);
    rb->snaps[w].cache_capacity_blocks = rb->per_worker;
  }
  return 0;
}

/* JSON parsing, timed apart because the proxy parses once for everything. */
static void time_parse(rb_t *rb) {
  alloc_series(&rb->parse, KVR_MIN(rb->o.decisions, (size_t)2000));
  for (size_t i = 0; i < rb->parse.n; i++) {
    uint64_t t0 = kvr_now_ns();
    cJSON *j = cJSON_Parse(rb->bodies[i % NPROMPTS]);
    rb->parse.ns[i] = kvr_now_ns() - t0;
    cJSON_Delete(j);
  }
}

/* n decisions into s[4]; with flush, a 64 MiB buffer is read (untimed) before each one so the
 * index and the prompt start out of the CPU caches. */
static int time_pass(rb_t *rb, series_t *s, size_t n, const unsigned char *flush) {
  for (size_t k = 0; k < 4; k++)
    alloc_series(&s[k], n);
  volatile uint64_t sink = 0;
  for (size_t i = 0; i < n; i++) {
    if (flush) {
      /* Read (not write) through the buffer so no dirty lines are left to write back. */
      uint64_t sum = 0;
      for (size_t off = 0; off < FLUSH_BYTES; off += 64)
        sum += flush[off];
      sink += sum;
    }
    if (decide(rb, rb->trees[i % NPROMPTS], i, s) != 0)
      return -1;
  }
  return 0;
}

/* Insert (touch) of a routed prompt, as the proxy does after the pick. */
static void time_insert(rb_t *rb) {
  alloc_series(&rb->ins, KVR_MIN(rb->o.decisions, (size_t)2000));
  for (size_t i = 0; i < rb->ins.n; i++) {
    kvr_prompt_t p;
    char err[256];
    kvr_prompt_from_json(rb->trees[i % NPROMPTS], KVR_PROMPT_CHAT, rb->o.block_chars, &p, err,
                         sizeof(err));
    uint64_t t0 = kvr_now_ns();
    kvr_cache_index_insert(rb->idx, (i % NPROMPTS) % rb->o.workers, p.blocks, p.nblocks);
    rb->ins.ns[i] = kvr_now_ns() - t0;
    kvr_prompt_free(&p);
  }
}

/* (4) and (5) of the header: steady-state inserts into the full index, then an unsized index
 * filled from empty. */
static int time_index_costs(rb_t *rb) {
  uint64_t max_ns;
  size_t slow;
  rb->steady_ns = insert_chains(rb->idx, rb->o.workers, rb->o.blocks, 11, &max_ns, &slow);
  kvr_cache_index_t *grow = kvr_cache_index_new(rb->o.workers, rb->per_worker);
  if (grow == NULL) {
    fprintf(stderr, "route bench: cannot allocate the index\n");
    return -1;
  }
  rb->grow_ns =
      insert_chains(grow, rb->o.workers, rb->o.blocks, 7, &rb->grow_max_ns, &rb->grow_slow);
  kvr_cache_index_stats_t cs;
  kvr_cache_index_stats(grow, &cs);
  rb->grow_slots = cs.table_slots;
  rb->grow_blocks = cs.blocks;
  kvr_cache_index_free(grow);
  return 0;
}

static void print_report(rb_t *rb) {
  const kvr_route_bench_opts_t *o = &rb->o;
  static const char *const parts[4] = {"prompt features + hashing", "index match", "policy select",
                                       "decision (hash + match + select)"};
  const kvr_cache_index_stats_t cs = rb->cs;
  printf("## Routing decision cost (policy %s)\n\n", o->policy);
  printf("Prompt: %zu bytes canonical (%zu KiB body), %zu blocks of %zu bytes; %zu workers; "
         "index: %llu blocks, %llu (block, worker) entries.\n\n",
         rb->prompt_bytes, o->prompt_kib, rb->prompt_blocks, o->block_chars, o->workers,
         (unsigned long long)cs.blocks, (unsigned long long)cs.entries);
  printf("| step | n | p50 us | p99 us | mean us | per second |\n|---|---:|---:|---:|---:|---:|\n");
  row("JSON parse (cJSON, separate)", &rb->parse);
  char what[64];
  for (size_t k = 0; k < 4; k++) {
    snprintf(what, sizeof what, "warm: %s", parts[k]);
    row(what, &rb->warm[k]);
  }
  for (size_t k = 0; k < 4; k++) {
    snprintf(what, sizeof what, "cold: %s", parts[k]);
    row(what, &rb->cold[k]);
  }
  row("index insert/touch after the pick", &rb->ins);
  printf("\nThroughput: %.0f decisions/s on one core (warm loop, %zu decisions in %.1f ms).\n",
         (double)o->decisions / ((double)rb->warm_ns / 1e9), o->decisions,
         (double)rb->warm_ns / 1e6);
  printf("Index fill: %llu blocks in %.1f ms (sized beforehand, as the router sizes it).\n",
         (unsigned long long)o->blocks, (double)rb->fill_ns / 1e6);
  printf("Index steady state: %llu more new blocks into the full index, evicting as many, in "
         "%.1f ms = %.2f us per new block.\n",
         (unsigned long long)o->blocks, (double)rb->steady_ns / 1e6,
         (double)rb->steady_ns / 1e3 / (double)KVR_MAX(o->blocks, (uint64_t)1));
  printf("Index growth (not sized beforehand): %llu blocks in %.1f ms, ending with %llu blocks in "
         "%llu table slots; longest single insert (256 blocks and any rehash they set off) %.1f "
         "ms; %zu inserts over 1 ms.\n",
         (unsigned long long)o->blocks, (double)rb->grow_ns / 1e6,
         (unsigned long long)rb->grow_blocks, (unsigned long long)rb->grow_slots,
         (double)rb->grow_max_ns / 1e6, rb->grow_slow);
  printf("Index memory: %llu bytes allocated (%llu table slots x 20 B, %llu nodes x 16 B) for "
         "%llu (block, worker) entries, %.1f%% of the capacity it is sized for = %.1f bytes per "
         "(block, worker) entry.\n",
         (unsigned long long)cs.bytes, (unsigned long long)cs.table_slots,
         (unsigned long long)cs.node_slots, (unsigned long long)cs.entries,
         100.0 * (double)cs.entries / (double)(rb->per_worker * o->workers), cs.bytes_per_entry);
}

int kvr_route_bench_run(const kvr_route_bench_opts_t *opts) {
  rb_t rb;
  memset(&rb, 0, sizeof rb);
  rb.o = *opts;
  int rc = setup(&rb);
  if (rc == 0) {
    time_parse(&rb);
    uint64_t t0 = kvr_now_ns();
    rc = time_pass(&rb, rb.warm, rb.o.decisions, NULL);
    rb.warm_ns = kvr_now_ns() - t0;
  }
  if (rc == 0) {
    unsigned char *flush = kvr_xmalloc(FLUSH_BYTES);
    memset(flush, 1, FLUSH_BYTES);
    rc = time_pass(&rb, rb.cold, KVR_MIN(rb.o.decisions, (size_t)300), flush);
    free(flush);
  }
  if (rc == 0) {
    time_insert(&rb);
    kvr_cache_index_stats(rb.idx, &rb.cs);
    rc = time_index_costs(&rb);
  }
  if (rc == 0)
    print_report(&rb);
  rb_free(&rb);
  return rc == 0 ? 0 : 1;
}

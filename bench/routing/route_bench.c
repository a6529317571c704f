/* route_bench.c -- the routing micro-benchmark: what one routing decision costs on the loop thread,
 * and what the cache index costs to fill, to keep full and to grow, at a given fleet size.
 *
 * Runs: one per (--workers, --blocks) pair (each option takes a list), workers outermost. Setup of
 * a run: K synthetic multi-turn chat bodies of --prompt-kib KiB each (a long system prompt then
 * user/assistant turns), serialized to JSON; a cache index holding --blocks blocks spread over the
 * workers (random 256-block chains, round robin over workers), plus every benchmark prompt fully
 * on one worker and half on another, so matching walks the whole prompt (the worst case: a long
 * conversation's next turn).
 *
 * Timed per decision with kvr_now_ns(): (1) prompt features from the parsed tree (canonical text
 * + XXH3 block hashes), (2) cache-index match, (3) snapshot fill (each worker's match and cached
 * blocks) + policy select over every worker; the sum is the decision. JSON parsing (cJSON_Parse of
 * the body) is timed separately because the proxy parses once for everything. Two passes: "warm"
 * (prompts cycle, caches as they fall) and "cold" (a 64 MiB buffer is streamed through the caches
 * before each decision, untimed). Index insert (what the proxy does after the pick: the routed
 * prompt's blocks, mostly held already) is timed too. Memory per (block, worker) entry comes from
 * the index's own allocation figures.
 *
 * Two index costs outside a decision, after the memory figures are taken: (4) steady state:
 * --blocks more new random blocks into the full index in 256-block chains, which evicts as many
 * (each worker at its capacity, give or take the last chain of the fill), each insert timed; (5)
 * growth: a second index created unsized, as one is before the router learns its workers'
 * capacities, filled with the same --blocks blocks, each insert timed: the table grows a bucket
 * at a time inside those inserts, so the longest one is the worst stall growth puts on the loop
 * (before issue 35 a rebuild by half: 73 ms at 1 M blocks, 0.7 s at 10 M). Each insert of (4) and
 * (5) is bracketed, untimed, by getrusage: an insert over 1 ms is counted as preempted when the
 * thread was switched out during it (another process), else as faulting in pages when it took
 * page faults (memory a VM's host has not backed yet can cost milliseconds a page), so the
 * machine's stalls are told apart from the index's.
 *
 * Output: a Markdown section per run, then a summary table of every run, and the process's peak
 * RSS.
 */
#include "route_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

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

/* Inserts over 1 ms: all of them, those during which the thread was preempted (the machine's
 * doing, not the index's), and of the others those that faulted in new pages (on a VM whose host
 * backs guest memory lazily, a page of memory never used since boot can take milliseconds). */
typedef struct slow_s {
  size_t n, preempted, faulted;
} slow_t;

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
  printf("| %s | %zu | %.1f | %.1f | %.1f | %.1f | %.0f |\n", what, s->n, pct(s, 50), pct(s, 99),
         s->n ? (double)s->ns[s->n - 1] / 1000.0 : 0, mean_us(s),
         mean_us(s) > 0 ? 1e6 / mean_us(s) : 0);
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
  memset(o, 0, sizeof *o);
  o->prompt_kib = 64;
  o->workers[0] = 4;
  o->nworkers = 1;
  o->blocks[0] = 1000000;
  o->nblocks = 1;
  o->decisions = 20000;
  o->block_chars = KVR_PROMPT_BLOCK_CHARS_DEFAULT;
  o->policy = "kv_aware";
}

/* One run: the inputs every pass shares and the series it fills. rb_free() releases all of it. */
typedef struct rb_s {
  const kvr_route_bench_opts_t *o;
  size_t workers;
  uint64_t blocks;
  char *bodies[NPROMPTS];
  cJSON *trees[NPROMPTS];
  kvr_cache_index_t *idx;
  kvr_policy_t *pol;
  kvr_worker_snap_t *snaps;           /* one per worker */
  kvr_policy_score_t *scores;         /* one per worker, as the router hands the policy */
  size_t *matched;                    /* one per worker */
  uint64_t per_worker;                /* index capacity per worker, in blocks */
  size_t prompt_blocks, prompt_bytes; /* of one benchmark prompt */
  uint64_t fill_ns, warm_ns;          /* index fill; the whole warm loop */
  uint64_t steady_ns;                 /* --blocks new blocks into the full index */
  uint64_t grow_ns;                   /* unsized fill, whole */
  slow_t steady_slow, grow_slow;      /* inserts of (4) and (5) that took over 1 ms */
  kvr_cache_index_stats_t cs;         /* the full index, before (4) */
  kvr_cache_index_stats_t ss;         /* the full index after (4) */
  kvr_cache_index_stats_t gs;         /* the grown index at the end of (5) */
  series_t parse, ins;                /* JSON parse; index insert after the pick */
  series_t steady, grow;              /* each 256-block insert of (4) and of (5) */
  series_t warm[4], cold[4];          /* hash, match, select, decision */
} rb_t;

enum { S_HASH, S_MATCH, S_SELECT, S_TOTAL };

/* One timed decision; adds its parts to the four series of s at index i. */
static int decide(rb_t *rb, const cJSON *tree, size_t i, series_t *s) {
  kvr_prompt_t p;
  char err[256];
  uint64_t t0 = kvr_now_ns();
  if (kvr_prompt_from_json(tree, KVR_PROMPT_CHAT, rb->o->block_chars, &p, err, sizeof(err)) != 0) {
    fprintf(stderr, "route bench: %s\n", err);
    return -1;
  }
  uint64_t t1 = kvr_now_ns();
  kvr_cache_index_match(rb->idx, p.blocks, p.nblocks, rb->matched);
  uint64_t t2 = kvr_now_ns();
  for (size_t w = 0; w < rb->workers; w++) {
    rb->snaps[w].matched_blocks = rb->matched[w];
    rb->snaps[w].cached_blocks = kvr_cache_index_entries(rb->idx, w);
  }
  kvr_route_req_t req;
  kvr_prompt_route_req(&p, &req);
  int k = kvr_policy_select(rb->pol, rb->snaps, rb->workers, &req, NULL, rb->scores);
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
  s->ns = kvr_xcalloc(n ? n : 1, sizeof(uint64_t));
  s->n = n;
}

static void rb_free(rb_t *rb) {
  free(rb->parse.ns);
  free(rb->ins.ns);
  free(rb->steady.ns);
  free(rb->grow.ns);
  for (size_t k = 0; k < 4; k++) {
    free(rb->warm[k].ns);
    free(rb->cold[k].ns);
  }
  kvr_policy_destroy(rb->pol);
  kvr_cache_index_free(rb->idx);
  free(rb->snaps);
  free(rb->scores);
  free(rb->matched);
  for (size_t k = 0; k < NPROMPTS; k++) {
    cJSON_Delete(rb->trees[k]);
    cJSON_free(rb->bodies[k]);
  }
}

/* This thread's involuntary context switches (another process took the core) and page faults
 * so far. */
static void thread_usage(long *preempted, long *faults) {
  struct rusage ru;
#ifdef RUSAGE_THREAD
  int rc = getrusage(RUSAGE_THREAD, &ru);
#else
  int rc = getrusage(RUSAGE_SELF, &ru);
#endif
  *preempted = rc == 0 ? ru.ru_nivcsw : 0;
  *faults = rc == 0 ? ru.ru_minflt + ru.ru_majflt : 0;
}

/* Random chains of 256 blocks (the last one shorter), nblocks in all, into idx round robin over
 * the workers, each insert timed into s (ceil(nblocks / 256) entries) when s is not NULL, and
 * bracketed by getrusage (untimed) for the preemptions; returns the total. */
static uint64_t insert_chains(kvr_cache_index_t *idx, size_t workers, uint64_t nblocks,
                              uint64_t seed, series_t *s, slow_t *slow) {
  uint64_t st = seed, chain[256], total = 0;
  memset(slow, 0, sizeof *slow);
  for (uint64_t done = 0, c = 0; done < nblocks; c++) {
    size_t n = (size_t)KVR_MIN((uint64_t)256, nblocks - done);
    for (size_t i = 0; i < n; i++)
      chain[i] = kvr_policy_rand(&st);
    long p0 = 0, f0 = 0, p1, f1;
    if (s)
      thread_usage(&p0, &f0);
    uint64_t t0 = kvr_now_ns();
    kvr_cache_index_insert(idx, c % workers, chain, n);
    uint64_t dt = kvr_now_ns() - t0;
    total += dt;
    if (s) {
      s->ns[c] = dt;
      if (dt > 1000000) {
        thread_usage(&p1, &f1);
        slow->n++;
        slow->preempted += p1 != p0;
        slow->faulted += p1 == p0 && f1 != f0;
      }
    }
    done += n;
  }
  return total;
}

static size_t nchains(uint64_t nblocks) {
  return (size_t)((nblocks + 255) / 256);
}

/* The index at capacity, as a router's is once its workers' caches have filled: each worker
 * holds blocks / W blocks at most, the index is sized for that (kvr_cache_index_reserve: the
 * table at its final size at once, as an empty one may be), the blocks go in random 256-block
 * chains round robin over the workers, then each benchmark prompt fully on worker k % W and its
 * first half on worker (k + 1) % W (evicting the oldest chains), so matching searches the whole
 * prompt. */
static int fill_index(rb_t *rb) {
  rb->per_worker = rb->blocks / rb->workers;
  rb->idx = kvr_cache_index_new(rb->workers, rb->per_worker);
  if (rb->idx == NULL || kvr_cache_index_reserve(rb->idx, rb->per_worker * rb->workers) != 0) {
    fprintf(stderr, "route bench: cannot allocate the index\n");
    return -1;
  }
  uint64_t t0 = kvr_now_ns();
  slow_t slow;
  insert_chains(rb->idx, rb->workers, rb->blocks, 7, NULL, &slow);
  rb->fill_ns = kvr_now_ns() - t0; /* the whole fill, drawing the blocks included, as before */
  for (size_t k = 0; k < NPROMPTS; k++) {
    kvr_prompt_t p;
    char err[256];
    if (kvr_prompt_from_json(rb->trees[k], KVR_PROMPT_CHAT, rb->o->block_chars, &p, err,
                             sizeof(err))) {
      fprintf(stderr, "route bench: %s\n", err);
      return -1;
    }
    kvr_cache_index_insert(rb->idx, k % rb->workers, p.blocks, p.nblocks);
    if (rb->workers > 1)
      kvr_cache_index_insert(rb->idx, (k + 1) % rb->workers, p.blocks, p.nblocks / 2);
    rb->prompt_blocks = p.nblocks;
    rb->prompt_bytes = p.text.len;
    kvr_prompt_free(&p);
  }
  return 0;
}

/* Bodies, their trees, the index, the policy and the workers' snapshots (uneven loads). */
static int setup(rb_t *rb) {
  for (size_t k = 0; k < NPROMPTS; k++) {
    rb->bodies[k] = make_body(rb->o->prompt_kib, 1000 + k);
    rb->trees[k] = cJSON_Parse(rb->bodies[k]);
  }
  rb->snaps = kvr_xcalloc(rb->workers, sizeof *rb->snaps);
  rb->scores = kvr_xcalloc(rb->workers, sizeof *rb->scores);
  rb->matched = kvr_xcalloc(rb->workers, sizeof *rb->matched);
  if (fill_index(rb) != 0)
    return -1;
  char err[256];
  rb->pol = kvr_policy_create(rb->o->policy, NULL, 1, err, sizeof(err));
  if (rb->pol == NULL) {
    fprintf(stderr, "route bench: %s\n", err);
    return -1;
  }
  for (size_t w = 0; w < rb->workers; w++) {
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
  alloc_series(&rb->parse, KVR_MIN(rb->o->decisions, (size_t)2000));
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
  alloc_series(&rb->ins, KVR_MIN(rb->o->decisions, (size_t)2000));
  for (size_t i = 0; i < rb->ins.n; i++) {
    kvr_prompt_t p;
    char err[256];
    kvr_prompt_from_json(rb->trees[i % NPROMPTS], KVR_PROMPT_CHAT, rb->o->block_chars, &p, err,
                         sizeof(err));
    uint64_t t0 = kvr_now_ns();
    kvr_cache_index_insert(rb->idx, (i % NPROMPTS) % rb->workers, p.blocks, p.nblocks);
    rb->ins.ns[i] = kvr_now_ns() - t0;
    kvr_prompt_free(&p);
  }
}

/* (4) and (5) of the header: steady-state inserts into the full index, then an unsized index
 * filled from empty. */
static int time_index_costs(rb_t *rb) {
  alloc_series(&rb->steady, nchains(rb->blocks));
  rb->steady_ns =
      insert_chains(rb->idx, rb->workers, rb->blocks, 11, &rb->steady, &rb->steady_slow);
  kvr_cache_index_stats(rb->idx, &rb->ss);
  kvr_cache_index_t *grow = kvr_cache_index_new(rb->workers, rb->per_worker);
  if (grow == NULL) {
    fprintf(stderr, "route bench: cannot allocate the index\n");
    return -1;
  }
  alloc_series(&rb->grow, nchains(rb->blocks));
  rb->grow_ns = insert_chains(grow, rb->workers, rb->blocks, 7, &rb->grow, &rb->grow_slow);
  kvr_cache_index_stats(grow, &rb->gs);
  kvr_cache_index_free(grow);
  return 0;
}

/* The figures of one run the summary keeps. */
typedef struct summary_s {
  size_t workers;
  uint64_t blocks, entries;
  double warm_p99, cold_p99, cold_match_p99, cold_select_p99; /* us */
  double ins_p50, ins_p99, ins_max;                           /* us */
  double steady_p50, steady_p99, steady_max;                  /* us, per 256-block insert */
  double bytes_per_entry, index_mib;
  double grow_p99_us, grow_max_ms, grow_bytes_per_entry;
  slow_t grow_slow;
} summary_t;

static double max_us(const series_t *s) {
  return s->n ? (double)s->ns[s->n - 1] / 1000.0 : 0; /* sorted */
}

static void print_report(rb_t *rb, summary_t *sum) {
  const kvr_route_bench_opts_t *o = rb->o;
  static const char *const parts[4] = {"prompt features + hashing", "index match",
                                       "snapshots + policy select",
                                       "decision (hash + match + select)"};
  const kvr_cache_index_stats_t cs = rb->cs;
  printf("## Routing decision cost (policy %s, %zu workers, %llu blocks)\n\n", o->policy,
         rb->workers, (unsigned long long)rb->blocks);
  printf("Prompt: %zu bytes canonical (%zu KiB body), %zu blocks of %zu bytes; %zu workers; "
         "index: %llu blocks, %llu (block, worker) entries.\n\n",
         rb->prompt_bytes, o->prompt_kib, rb->prompt_blocks, o->block_chars, rb->workers,
         (unsigned long long)cs.blocks, (unsigned long long)cs.entries);
  printf("| step | n | p50 us | p99 us | max us | mean us | per second |\n"
         "|---|---:|---:|---:|---:|---:|---:|\n");
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
  row("index: 256 new blocks into the full index", &rb->steady);
  row("index: 256 new blocks while it grows", &rb->grow);
  printf("\nThroughput: %.0f decisions/s on one core (warm loop, %zu decisions in %.1f ms).\n",
         (double)o->decisions / ((double)rb->warm_ns / 1e9), o->decisions,
         (double)rb->warm_ns / 1e6);
  printf("Index fill: %llu blocks in %.1f ms (the table sized beforehand).\n",
         (unsigned long long)rb->blocks, (double)rb->fill_ns / 1e6);
  printf("Index steady state: %llu more new blocks into the full index, evicting as many, in "
         "%.1f ms = %.2f us per new block; longest insert of 256 %.1f us; %zu inserts over 1 ms "
         "(%zu of them preempted, %zu faulting in pages); %.2f cuckoo moves per new block.\n",
         (unsigned long long)rb->blocks, (double)rb->steady_ns / 1e6,
         (double)rb->steady_ns / 1e3 / (double)KVR_MAX(rb->blocks, (uint64_t)1),
         max_us(&rb->steady), rb->steady_slow.n, rb->steady_slow.preempted, rb->steady_slow.faulted,
         (double)(rb->ss.kicks - rb->cs.kicks) / (double)KVR_MAX(rb->blocks, (uint64_t)1));
  printf("Index growth (not sized beforehand): %llu blocks in %.1f ms, ending with %llu blocks in "
         "%llu table slots after %llu bucket splits; longest single insert (256 blocks and the "
         "splits they set off) %.3f ms; %zu inserts over 1 ms (%zu of them preempted, %zu faulting "
         "in pages); %.1f bytes per (block, worker) entry at the end; %.2f cuckoo moves per new "
         "block.\n",
         (unsigned long long)rb->blocks, (double)rb->grow_ns / 1e6,
         (unsigned long long)rb->gs.blocks, (unsigned long long)rb->gs.table_slots,
         (unsigned long long)rb->gs.splits, max_us(&rb->grow) / 1e3, rb->grow_slow.n,
         rb->grow_slow.preempted, rb->grow_slow.faulted, rb->gs.bytes_per_entry,
         (double)rb->gs.kicks / (double)KVR_MAX(rb->blocks, (uint64_t)1));
  printf("Index memory: %llu bytes allocated (%llu table slots x 16 B in 2 MiB chunks, %llu nodes "
         "x 16 B, %llu wide holder sets) for %llu (block, worker) entries, %.1f%% of the capacity "
         "it is sized for = %.1f bytes per (block, worker) entry.\n\n",
         (unsigned long long)cs.bytes, (unsigned long long)cs.table_slots,
         (unsigned long long)cs.node_slots, (unsigned long long)cs.wide_sets,
         (unsigned long long)cs.entries,
         100.0 * (double)cs.entries / (double)(rb->per_worker * rb->workers), cs.bytes_per_entry);
  *sum = (summary_t){
      .workers = rb->workers,
      .blocks = rb->blocks,
      .entries = cs.entries,
      .warm_p99 = pct(&rb->warm[S_TOTAL], 99),
      .cold_p99 = pct(&rb->cold[S_TOTAL], 99),
      .cold_match_p99 = pct(&rb->cold[S_MATCH], 99),
      .cold_select_p99 = pct(&rb->cold[S_SELECT], 99),
      .ins_p50 = pct(&rb->ins, 50),
      .ins_p99 = pct(&rb->ins, 99),
      .ins_max = max_us(&rb->ins),
      .steady_p50 = pct(&rb->steady, 50),
      .steady_p99 = pct(&rb->steady, 99),
      .steady_max = max_us(&rb->steady),
      .bytes_per_entry = cs.bytes_per_entry,
      .index_mib = (double)cs.bytes / (1 << 20),
      .grow_p99_us = pct(&rb->grow, 99),
      .grow_max_ms = max_us(&rb->grow) / 1e3,
      .grow_bytes_per_entry = rb->gs.bytes_per_entry,
      .grow_slow = rb->grow_slow,
  };
}

static int run_one(const kvr_route_bench_opts_t *o, size_t workers, uint64_t blocks,
                   summary_t *sum) {
  rb_t rb;
  memset(&rb, 0, sizeof rb);
  rb.o = o;
  rb.workers = workers;
  rb.blocks = blocks;
  int rc = setup(&rb);
  if (rc == 0) {
    time_parse(&rb);
    uint64_t t0 = kvr_now_ns();
    rc = time_pass(&rb, rb.warm, o->decisions, NULL);
    rb.warm_ns = kvr_now_ns() - t0;
  }
  if (rc == 0) {
    unsigned char *flush = kvr_xmalloc(FLUSH_BYTES);
    memset(flush, 1, FLUSH_BYTES);
    rc = time_pass(&rb, rb.cold, KVR_MIN(o->decisions, (size_t)300), flush);
    free(flush);
  }
  if (rc == 0) {
    time_insert(&rb);
    kvr_cache_index_stats(rb.idx, &rb.cs);
    rc = time_index_costs(&rb);
  }
  if (rc == 0)
    print_report(&rb, sum);
  rb_free(&rb);
  return rc;
}

static void print_summary(const summary_t *sums, size_t n) {
  printf("## Summary (policy, prompt and decisions as above; times in us unless marked)\n\n");
  printf("| workers | blocks | warm decision p99 | cold decision p99 | cold match p99 | cold "
         "select p99 | insert after pick p50 / p99 / max | 256 new blocks, full index p50 / p99 / "
         "max | bytes per entry | index MiB | growth: longest insert ms | growth: inserts over "
         "1 ms (preempted, faulting) | growth: bytes per entry |\n");
  printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < n; i++) {
    const summary_t *s = &sums[i];
    printf("| %zu | %llu | %.1f | %.1f | %.1f | %.1f | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | "
           "%.1f | %.1f | %.3f | %zu (%zu, %zu) | %.1f |\n",
           s->workers, (unsigned long long)s->blocks, s->warm_p99, s->cold_p99, s->cold_match_p99,
           s->cold_select_p99, s->ins_p50, s->ins_p99, s->ins_max, s->steady_p50, s->steady_p99,
           s->steady_max, s->bytes_per_entry, s->index_mib, s->grow_max_ms, s->grow_slow.n,
           s->grow_slow.preempted, s->grow_slow.faulted, s->grow_bytes_per_entry);
  }
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) == 0)
    printf("\nPeak RSS of the process: %.0f MiB (the largest run's index, plus the second index of "
           "its growth line while both lived, the prompts and a 64 MiB cache-flush buffer).\n",
           (double)ru.ru_maxrss / 1024.0);
}

int kvr_route_bench_run(const kvr_route_bench_opts_t *opts) {
  size_t nruns = opts->nworkers * opts->nblocks;
  summary_t *sums = kvr_xcalloc(nruns ? nruns : 1, sizeof *sums);
  int rc = 0;
  size_t k = 0;
  for (size_t w = 0; w < opts->nworkers && rc == 0; w++)
    for (size_t b = 0; b < opts->nblocks && rc == 0; b++) {
      rc = run_one(opts, opts->workers[w], opts->blocks[b], &sums[k]);
      fflush(stdout);
      k += rc == 0;
    }
  if (rc == 0)
    print_summary(sums, k);
  free(sums);
  return rc == 0 ? 0 : 1;
}

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
 * Output: a Markdown table on stdout.
 */
#include "route_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policies/policy.h"
#include "src/buf.h"
#include "src/cache_index.h"
#include "src/kvr.h"
#include "src/prompt.h"
#include "src/quantile.h"

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
 * uses (src/quantile.h: numpy's linear interpolation). */
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

/* One timed decision; adds its parts to the series at index i. */
static int decide(const cJSON *tree, const kvr_route_bench_opts_t *o, kvr_cache_index_t *idx,
                  kvr_policy_t *pol, kvr_worker_snap_t *snaps, size_t i, series_t *hash,
                  series_t *match, series_t *select, series_t *total) {
  kvr_prompt_t p;
  char err[256];
  size_t matched[KVR_MAX_WORKERS];
  uint64_t t0 = kvr_now_ns();
  if (kvr_prompt_from_json(tree, KVR_PROMPT_CHAT, o->block_chars, &p, err, sizeof(err)) != 0) {
    fprintf(stderr, "route bench: %s\n", err);
    return -1;
  }
  uint64_t t1 = kvr_now_ns();
  kvr_cache_index_match(idx, p.blocks, p.nblocks, matched);
  uint64_t t2 = kvr_now_ns();
  for (size_t w = 0; w < o->workers; w++) {
    snaps[w].matched_blocks = matched[w];
    snaps[w].cached_blocks = kvr_cache_index_entries(idx, w);
  }
  kvr_route_req_t req;
  kvr_prompt_route_req(&p, &req);
  int k = kvr_policy_select(pol, snaps, o->workers, &req, 0, NULL);
  uint64_t t3 = kvr_now_ns();
  kvr_prompt_free(&p);
  if (k < 0)
    return -1;
  hash->ns[i] = t1 - t0;
  match->ns[i] = t2 - t1;
  select->ns[i] = t3 - t2;
  total->ns[i] = t3 - t0;
  return 0;
}

static void alloc_series(series_t *s, size_t n) {
  s->ns = calloc(n, sizeof(uint64_t));
  s->n = n;
  if (s->ns == NULL) {
    fprintf(stderr, "route bench: out of memory\n");
    abort();
  }
}

int kvr_route_bench_run(const kvr_route_bench_opts_t *opts) {
  const kvr_route_bench_opts_t o = *opts;
  /* Bodies and their parsed trees. */
  char *bodies[NPROMPTS];
  cJSON *trees[NPROMPTS];
  for (size_t k = 0; k < NPROMPTS; k++) {
    bodies[k] = make_body(o.prompt_kib, 1000 + k);
    trees[k] = cJSON_Parse(bodies[k]);
  }

  /* The index: o.blocks random blocks, then each prompt on worker k % W (full) and its first half
   * on worker (k + 1) % W. */
  uint64_t per_worker = o.blocks / o.workers + 2 * NPROMPTS * (o.prompt_kib * 1024 / o.block_chars);
  kvr_cache_index_t *idx = kvr_cache_index_new(o.workers, per_worker);
  if (idx == NULL || kvr_cache_index_reserve(idx, o.blocks + per_worker) != 0) {
    fprintf(stderr, "route bench: cannot allocate the index\n");
    return 1;
  }
  uint64_t st = 7, chain[256];
  uint64_t t_fill = kvr_now_ns();
  for (uint64_t done = 0, c = 0; done < o.blocks; c++) {
    size_t n = (size_t)KVR_MIN((uint64_t)256, o.blocks - done);
    for (size_t i = 0; i < n; i++)
      chain[i] = kvr_policy_rand(&st);
    kvr_cache_index_insert(idx, c % o.workers, chain, n);
    done += n;
  }
  t_fill = kvr_now_ns() - t_fill;
  size_t prompt_blocks = 0, prompt_bytes = 0;
  for (size_t k = 0; k < NPROMPTS; k++) {
    kvr_prompt_t p;
    char err[256];
    if (kvr_prompt_from_json(trees[k], KVR_PROMPT_CHAT, o.block_chars, &p, err, sizeof(err))) {
      fprintf(stderr, "route bench: %s\n", err);
      return 1;
    }
    kvr_cache_index_insert(idx, k % o.workers, p.blocks, p.nblocks);
    if (o.workers > 1)
      kvr_cache_index_insert(idx, (k + 1) % o.workers, p.blocks, p.nblocks / 2);
    prompt_blocks = p.nblocks;
    prompt_bytes = p.text.len;
    kvr_prompt_free(&p);
  }

  char err[256];
  kvr_policy_t *pol = kvr_policy_create(o.policy, NULL, 1, err, sizeof(err));
  if (pol == NULL) {
    fprintf(stderr, "route bench: %s\n", err);
    return 1;
  }
  kvr_worker_snap_t snaps[KVR_MAX_WORKERS];
  memset(snaps, 0, sizeof(snaps));
  for (size_t w = 0; w < o.workers; w++) {
    snaps[w].id = (uint32_t)w;
    snaps[w].usable = true;
    snaps[w].inflight = (uint32_t)(w % 3);
    snaps[w].active_tokens = 4000 * (w % 3);
    snaps[w].cache_capacity_blocks = per_worker;
  }

  /* JSON parse, separately. */
  size_t nparse = KVR_MIN(o.decisions, (size_t)2000);
  series_t parse;
  alloc_series(&parse, nparse);
  for (size_t i = 0; i < nparse; i++) {
    uint64_t t0 = kvr_now_ns();
    cJSON *j = cJSON_Parse(bodies[i % NPROMPTS]);
    parse.ns[i] = kvr_now_ns() - t0;
    cJSON_Delete(j);
  }

  /* Warm pass. */
  series_t hash, match, sel, total;
  alloc_series(&hash, o.decisions);
  alloc_series(&match, o.decisions);
  alloc_series(&sel, o.decisions);
  alloc_series(&total, o.decisions);
  uint64_t t_loop = kvr_now_ns();
  for (size_t i = 0; i < o.decisions; i++)
    if (decide(trees[i % NPROMPTS], &o, idx, pol, snaps, i, &hash, &match, &sel, &total))
      return 1;
  t_loop = kvr_now_ns() - t_loop;

  /* Cold pass: caches flushed before each decision. */
  size_t ncold = KVR_MIN(o.decisions, (size_t)300);
  series_t chash, cmatch, csel, ctotal;
  alloc_series(&chash, ncold);
  alloc_series(&cmatch, ncold);
  alloc_series(&csel, ncold);
  alloc_series(&ctotal, ncold);
  unsigned char *flush = malloc(FLUSH_BYTES);
  if (flush)
    memset(flush, 1, FLUSH_BYTES);
  volatile uint64_t sink = 0;
  for (size_t i = 0; flush && i < ncold; i++) {
    /* Read (not write) through the buffer so no dirty lines are left to write back. */
    uint64_t sum = 0;
    for (size_t off = 0; off < FLUSH_BYTES; off += 64)
      sum += flush[off];
    sink += sum;
    if (decide(trees[i % NPROMPTS], &o, idx, pol, snaps, i, &chash, &cmatch, &csel, &ctotal))
      return 1;
  }
  free(flush);

  /* Insert (touch) of a routed prompt, as the proxy does after the pick. */
  series_t ins;
  size_t nins = KVR_MIN(o.decisions, (size_t)2000);
  alloc_series(&ins, nins);
  for (size_t i = 0; i < nins; i++) {
    kvr_prompt_t p;
    kvr_prompt_from_json(trees[i % NPROMPTS], KVR_PROMPT_CHAT, o.block_chars, &p, err, sizeof(err));
    uint64_t t0 = kvr_now_ns();
    kvr_cache_index_insert(idx, (i % NPROMPTS) % o.workers, p.blocks, p.nblocks);
    ins.ns[i] = kvr_now_ns() - t0;
    kvr_prompt_free(&p);
  }

  kvr_cache_index_stats_t cs;
  kvr_cache_index_stats(idx, &cs);
  printf("## Routing decision cost (policy %s)\n\n", o.policy);
  printf("Prompt: %zu bytes canonical (%zu KiB body), %zu blocks of %zu bytes; %zu workers; "
         "index: %llu blocks, %llu (block, worker) entries.\n\n",
         prompt_bytes, o.prompt_kib, prompt_blocks, o.block_chars, o.workers,
         (unsigned long long)cs.blocks, (unsigned long long)cs.entries);
  printf("| step | n | p50 us | p99 us | mean us | per second |\n|---|---:|---:|---:|---:|---:|\n");
  row("JSON parse (cJSON, separate)", &parse);
  row("warm: prompt features + hashing", &hash);
  row("warm: index match", &match);
  row("warm: policy select", &sel);
  row("warm: decision (hash + match + select)", &total);
  row("cold: prompt features + hashing", &chash);
  row("cold: index match", &cmatch);
  row("cold: policy select", &csel);
  row("cold: decision (hash + match + select)", &ctotal);
  row("index insert/touch after the pick", &ins);
  printf("\nThroughput: %.0f decisions/s on one core (warm loop, %zu decisions in %.1f ms).\n",
         (double)o.decisions / ((double)t_loop / 1e9), o.decisions, (double)t_loop / 1e6);
  printf("Index fill: %llu blocks in %.1f ms.\n", (unsigned long long)o.blocks,
         (double)t_fill / 1e6);
  printf("Index memory: %llu bytes allocated (%llu table slots x 20 B, %llu nodes x 16 B) = "
         "%.1f bytes per (block, worker) entry.\n",
         (unsigned long long)cs.bytes, (unsigned long long)cs.table_slots,
         (unsigned long long)cs.node_slots, cs.bytes_per_entry);

  free(parse.ns);
  free(hash.ns);
  free(match.ns);
  free(sel.ns);
  free(total.ns);
  free(chash.ns);
  free(cmatch.ns);
  free(csel.ns);
  free(ctotal.ns);
  free(ins.ns);
  kvr_policy_destroy(pol);
  kvr_cache_index_free(idx);
  for (size_t k = 0; k < NPROMPTS; k++) {
    cJSON_Delete(trees[k]);
    cJSON_free(bodies[k]);
  }
  return 0;
}

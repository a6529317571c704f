/* sim_engine.c -- the simulated vLLM V1 engine: KV block pool with prefix caching, FCFS scheduler
 * with chunked prefill and recompute preemption, and the step cost model. See sim_engine.h.
 *
 * Structs:
 *   block_t        one KV block: reference count, chained hash, links in the hash chain of its
 *                  bucket and in the free list. Blocks live in one array indexed by block id.
 *   kvr_sim_engine_t  the block array, the hash buckets (hash -> block id, chained through
 *                  block_t.hnext), the free list (doubly linked through fprev/fnext, head = next to
 *                  evict), the running array (admission order) and the waiting queue (a kvr_list_t
 *                  of kvr_sim_req_t.wnode: new requests at its tail, preempted ones at its front).
 *
 * Flow of kvr_sim_engine_step(), one function per step, building a batch_t:
 *   1. schedule_running(): running requests in order, each taking min(remaining tokens, budget);
 *      if its blocks cannot be allocated, preempt the last running request and retry (maybe
 *      preempting itself);
 *   2. admit_waiting(), if nobody was preempted: waiting requests in order while budget, blocks
 *      and max_num_seqs allow, after looking their prefix up in the cache;
 *   3. run_batch(): cost the batch; advance num_computed; a request whose tokens are all computed
 *      samples one token; one that has max_output tokens finishes and frees its blocks. Finished
 *      requests then leave the running array.
 *
 * Invariants: a block with ref > 0 is never in the free list; a block in the free list has ref 0;
 * a hashed block is in exactly one bucket chain and no two hashed blocks share a hash; a request's
 * first nhashed blocks are full; the blocks a request holds cover its num_computed tokens (plus
 * the ones scheduled this step). A request is in the waiting list exactly while its state is
 * KVR_SIM_WAITING, and nwaiting is that list's length. Every waiting request fits in the cache on
 * its own (checked at add), so an idle engine can always admit its queue head.
 *
 * Block hashes are libxxhash's XXH3 inlined (XXH_INLINE_ALL, the same function): a block is 64
 * bytes of token ids, and a call per block cost about as much as the hash.
 */
#define XXH_INLINE_ALL
#include "sim_engine.h"

#include "base/kvr.h"
#include "sim_tokens.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct block_s {
  uint64_t hash;
  int32_t ref;
  int32_t hnext;        /* next block in the same hash bucket */
  int32_t fprev, fnext; /* free list links */
  bool hashed;
  bool in_free;
} block_t;

typedef struct sched_s {
  kvr_sim_req_t *req;
  uint32_t num_new;
} sched_t;

#define LORA_IDS_MAX 1024 /* max_loras at most (kvr_sim_config_check) */

/* A set of at most cap adapters, least recently used evicted first (vLLM's LRU adapter caches). */
typedef struct lora_set_s {
  uint32_t *ids;
  uint64_t *used; /* the engine's lora_clock at its last use */
  uint32_t n, cap;
} lora_set_t;

static int lora_find(const lora_set_t *s, uint32_t id) {
  for (uint32_t i = 0; i < s->n; i++) {
    if (s->ids[i] == id)
      return (int)i;
  }
  return -1;
}

/* Marks id used at stamp; adds it when it was not there, evicting the least recently used one
 * from a full set (its id into *evicted, else 0). Returns true when it was not there. */
static bool lora_touch(lora_set_t *s, uint32_t id, uint64_t stamp, uint32_t *evicted) {
  int i = lora_find(s, id);
  *evicted = 0;
  if (i >= 0) {
    s->used[i] = stamp;
    return false;
  }
  if (s->n == s->cap) {
    uint32_t lru = 0;
    for (uint32_t k = 1; k < s->n; k++) {
      if (s->used[k] < s->used[lru])
        lru = k;
    }
    *evicted = s->ids[lru];
    s->ids[lru] = s->ids[s->n - 1];
    s->used[lru] = s->used[s->n - 1];
    s->n--;
  }
  s->ids[s->n] = id;
  s->used[s->n++] = stamp;
  return true;
}

static void lora_drop(lora_set_t *s, uint32_t id) {
  int i = lora_find(s, id);
  if (i < 0)
    return;
  s->ids[i] = s->ids[s->n - 1];
  s->used[i] = s->used[s->n - 1];
  s->n--;
}

static void lora_set_init(lora_set_t *s, uint32_t cap) {
  s->cap = cap;
  s->n = 0;
  s->ids = cap ? kvr_xcalloc(cap, sizeof(*s->ids)) : NULL;
  s->used = cap ? kvr_xcalloc(cap, sizeof(*s->used)) : NULL;
}

static void lora_set_free(lora_set_t *s) {
  free(s->ids);
  free(s->used);
}

/* The batch one step is building: the token budget left, how many requests are in eng->sched,
 * and whether a request was preempted (vLLM then admits nobody in that step). */
typedef struct batch_s {
  uint32_t budget;
  uint32_t nsched;
  bool preempted;
} batch_t;

struct kvr_sim_engine_s {
  kvr_sim_config_t cfg;
  block_t *blocks;
  int32_t *buckets;
  uint32_t bucket_mask;
  int32_t free_head, free_tail;
  uint32_t nfree;
  uint32_t nfree_hashed; /* free blocks still holding a hash (evictable cache) */
  kvr_sim_req_t **running;
  uint32_t nrunning;
  kvr_list_t waiting;      /* kvr_sim_req_t.wnode, FCFS: admitted from the front */
  uint32_t nwaiting;       /* its length, kept for the stats */
  sched_t *sched;          /* this step's scheduled requests, max_num_seqs entries */
  kvr_sim_event_t *events; /* this step's events, 2 * max_num_seqs + 1 entries */
  int32_t *scratch;        /* prefix lookup result, max_model_len / block_size + 1 entries */
  kvr_sim_stats_t stats;
  uint64_t next_id;
  /* simulated time */
  double now_s;        /* arrival time of the requests added next (kvr_sim_engine_set_now) */
  double end_s;        /* end of the last step */
  double last_start_s; /* start of the last step (async scheduling's admission cut-off) */
  double fe_free_s;    /* when the API server has worked off what it was given so far */
  double step_delay_s; /* kvr_sim_engine_set_step_delay */
  /* async scheduling: requests that stopped on EOS in the last step take part in the next one */
  uint32_t nextra;
  uint64_t extra_ctx;
  /* KV events (kvr_sim_engine_kv_events); kv_on false: nothing is logged */
  bool kv_on;
  kvr_sim_kv_log_t kv;
  /* LoRA (cfg.max_loras > 0): the adapters in the GPU slots and in the CPU cache, each an LRU
   * set (lora_set_t) */
  lora_set_t gpu_loras, cpu_loras;
  uint64_t lora_clock;   /* stamps the sets' uses */
  double lora_pending_s; /* charged adapter loads, spent before the next step */
};

void kvr_sim_config_default(kvr_sim_config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  /* 53.15 GiB of FP8 KV / 163,840 bytes per token / 16 tokens per block */
  cfg->num_gpu_blocks = (uint32_t)(53.15 * 1024 * 1024 * 1024 / 163840.0 / 16);
  cfg->block_size = 16;
  cfg->max_num_seqs = 1024;
  cfg->max_num_batched_tokens = 8192;
  cfg->max_model_len = 131072;
  cfg->enable_prefix_caching = true;
  /* bench/sim/README.md ("Cost model") reads each term as a fraction of one H200 serving
   * Llama-3.3-70B FP8, and says where each default comes from. */
  cfg->cost.weights_ms = 20.0;
  cfg->cost.dense_tok_us = 110.0;
  cfg->cost.step_ms = 1.0;
  cfg->cost.per_seq_ms = 0.03;
  cfg->cost.decode_ctx_ns = 55.0;
  cfg->cost.attn_pair_ns = 2.5;
  /* a Llama-70B adapter: 8,192,000 B per unit of rank over 50 GB/s and 2 GB/s (sim_preset.h) */
  cfg->cost.lora_load_ms_per_rank = 0.164;
  cfg->cost.lora_disk_ms_per_rank = 4.1;
  cfg->frontend.req_ms = 2.0;
  cfg->frontend.prompt_tok_us = 1.1;
  cfg->frontend.stream_tok_us = 40.0;
  cfg->frontend.async_scheduling = true;
  cfg->retok_drift = 0.001;
}

int kvr_sim_config_check(const kvr_sim_config_t *cfg, char *err, size_t errlen) {
#define CHECK(cond, field, msg)                                                                    \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      snprintf(err, errlen, "%s: %s", field, msg);                                                 \
      return KVR_EINVAL;                                                                           \
    }                                                                                              \
  } while (0)
  CHECK(cfg->block_size >= 1 && cfg->block_size <= 4096, "block_size", "must be in [1, 4096]");
  CHECK(cfg->num_gpu_blocks >= 1 && cfg->num_gpu_blocks <= (1u << 30), "num_gpu_blocks",
        "must be in [1, 2^30]");
  CHECK(cfg->max_num_seqs >= 1 && cfg->max_num_seqs <= 65536, "max_num_seqs",
        "must be in [1, 65536]");
  CHECK(cfg->max_num_batched_tokens >= 1, "max_num_batched_tokens", "must be >= 1");
  CHECK(cfg->max_model_len >= 2 && cfg->max_model_len <= (1u << 24), "max_model_len",
        "must be in [2, 2^24]");
  CHECK(cfg->cost.weights_ms >= 0, "cost.weights_ms", "must be >= 0");
  CHECK(cfg->cost.dense_tok_us >= 0, "cost.dense_tok_us", "must be >= 0");
  CHECK(cfg->cost.step_ms >= 0, "cost.step_ms", "must be >= 0");
  CHECK(cfg->cost.per_seq_ms >= 0, "cost.per_seq_ms", "must be >= 0");
  CHECK(cfg->cost.decode_ctx_ns >= 0, "cost.decode_ctx_ns", "must be >= 0");
  CHECK(cfg->cost.attn_pair_ns >= 0, "cost.attn_pair_ns", "must be >= 0");
  CHECK(cfg->cost.lora_load_ms_per_rank >= 0, "cost.lora_load_ms_per_rank", "must be >= 0");
  CHECK(cfg->cost.lora_disk_ms_per_rank >= 0, "cost.lora_disk_ms_per_rank", "must be >= 0");
  CHECK(cfg->max_loras <= 1024, "max_loras", "must be in [1, 1024]");
  if (cfg->max_loras > 0) {
    /* vllm/config/lora.py _validate_lora_config */
    CHECK(cfg->max_cpu_loras <= 65536, "max_cpu_loras", "must be at most 65536");
    if (cfg->max_cpu_loras < cfg->max_loras) {
      snprintf(err, errlen, "max_cpu_loras: max_cpu_loras (%u) must be >= max_loras (%u)",
               cfg->max_cpu_loras, cfg->max_loras);
      return KVR_EINVAL;
    }
  }
  CHECK(cfg->frontend.req_ms >= 0, "frontend.req_ms", "must be >= 0");
  CHECK(cfg->frontend.prompt_tok_us >= 0, "frontend.prompt_tok_us", "must be >= 0");
  CHECK(cfg->frontend.stream_tok_us >= 0, "frontend.stream_tok_us", "must be >= 0");
  CHECK(cfg->retok_drift >= 0 && cfg->retok_drift <= 1, "retok_drift", "must be in [0, 1]");
#undef CHECK
  return 0;
}

double kvr_sim_cost_step(const kvr_sim_cost_t *c, const kvr_sim_step_t *st) {
  if (st->num_seqs == 0)
    return 0.0;
  /* The dense layers are bound by reading the weights or by computing every scheduled token,
   * whichever takes longer (a roofline); attention and overheads add to it. */
  double tokens = (double)st->prefill_tokens + (double)st->num_decode;
  double dense = fmax(c->weights_ms * 1e-3, c->dense_tok_us * 1e-6 * tokens);
  return dense + c->step_ms * 1e-3 + c->per_seq_ms * 1e-3 * st->num_seqs +
         c->decode_ctx_ns * 1e-9 * (double)st->decode_ctx +
         c->attn_pair_ns * 1e-9 * st->attn_pairs + st->lora_s;
}

uint64_t kvr_sim_block_hash(uint64_t parent, const uint32_t *tokens, uint32_t block_size) {
  return XXH3_64bits_withSeed(tokens, block_size * sizeof(*tokens), parent);
}

/* A block's hash with the request's adapter key (0: none, the plain chained hash). */
static uint64_t block_hash(uint64_t parent, const uint32_t *tokens, uint32_t block_size,
                           uint64_t lora_key) {
  return kvr_sim_block_hash(parent ^ lora_key, tokens, block_size);
}

uint64_t kvr_sim_lora_key(const char *name, size_t len) {
  return XXH3_64bits_withSeed(name, len, 0x6c6f7261u /* "lora" */) | 1u;
}

/* ---- free list: head is the least recently freed block, evicted first ---- */

static void free_push_tail(kvr_sim_engine_t *eng, int32_t id) {
  block_t *b = &eng->blocks[id];
  b->fprev = eng->free_tail;
  b->fnext = -1;
  if (eng->free_tail >= 0)
    eng->blocks[eng->free_tail].fnext = id;
  else
    eng->free_head = id;
  eng->free_tail = id;
  b->in_free = true;
  eng->nfree++;
  eng->nfree_hashed += b->hashed;
}

static void free_remove(kvr_sim_engine_t *eng, int32_t id) {
  block_t *b = &eng->blocks[id];
  if (b->fprev >= 0)
    eng->blocks[b->fprev].fnext = b->fnext;
  else
    eng->free_head = b->fnext;
  if (b->fnext >= 0)
    eng->blocks[b->fnext].fprev = b->fprev;
  else
    eng->free_tail = b->fprev;
  b->fprev = b->fnext = -1;
  b->in_free = false;
  eng->nfree--;
  eng->nfree_hashed -= b->hashed;
}

/* ---- hash index: chained buckets through block_t.hnext ---- */

static int32_t hash_find(const kvr_sim_engine_t *eng, uint64_t h) {
  for (int32_t id = eng->buckets[h & eng->bucket_mask]; id >= 0; id = eng->blocks[id].hnext) {
    if (eng->blocks[id].hash == h)
      return id;
  }
  return -1;
}

static void hash_insert(kvr_sim_engine_t *eng, int32_t id, uint64_t h) {
  block_t *b = &eng->blocks[id];
  uint32_t slot = (uint32_t)(h & eng->bucket_mask);
  b->hash = h;
  b->hashed = true;
  b->hnext = eng->buckets[slot];
  eng->buckets[slot] = id;
}

static void hash_remove(kvr_sim_engine_t *eng, int32_t id) {
  block_t *b = &eng->blocks[id];
  int32_t *link = &eng->buckets[b->hash & eng->bucket_mask];
  while (*link != id)
    link = &eng->blocks[*link].hnext;
  *link = b->hnext;
  b->hnext = -1;
  b->hashed = false;
  b->hash = 0;
}

/* ---- KV event log ---- */

static kvr_sim_kv_event_t *kv_event_new(kvr_sim_engine_t *eng, kvr_sim_kv_kind_t kind) {
  kvr_sim_kv_log_t *l = &eng->kv;
  KVR_GROW(l->ev, l->nev, l->ev_cap, 1);
  kvr_sim_kv_event_t *e = &l->ev[l->nev++];
  memset(e, 0, sizeof(*e));
  e->kind = kind;
  e->hash_off = (uint32_t)l->nhashes;
  e->tok_off = (uint32_t)l->ntokens;
  return e;
}

static void kv_push_hash(kvr_sim_engine_t *eng, uint64_t h) {
  kvr_sim_kv_log_t *l = &eng->kv;
  KVR_GROW(l->hashes, l->nhashes, l->hashes_cap, 1);
  l->hashes[l->nhashes++] = h;
  l->ev[l->nev - 1].nhashes++;
}

/* One REMOVED event per evicted block, as vLLM's _maybe_evict_cached_block. */
static void kv_removed(kvr_sim_engine_t *eng, uint64_t h) {
  if (!eng->kv_on)
    return;
  kv_event_new(eng, KVR_SIM_KV_REMOVED);
  kv_push_hash(eng, h);
}

/* Appends a newly cached block to the last event, a STORED one while *open, else starts one. */
/* Copies s into the log's string pool; *off and *len say where. */
static void kv_string(kvr_sim_kv_log_t *l, const char *s, uint32_t *off, uint32_t *len) {
  size_t n = strlen(s);
  KVR_GROW(l->salts, l->nsalts, l->salts_cap, n);
  memcpy(l->salts + l->nsalts, s, n);
  *off = (uint32_t)l->nsalts;
  *len = (uint32_t)n;
  l->nsalts += n;
}

static void kv_stored(kvr_sim_engine_t *eng, bool *open, bool has_parent, uint64_t parent,
                      uint64_t h, const uint32_t *tokens, const kvr_sim_req_t *req) {
  if (!eng->kv_on)
    return;
  kvr_sim_kv_log_t *l = &eng->kv;
  if (!*open) {
    kvr_sim_kv_event_t *e = kv_event_new(eng, KVR_SIM_KV_STORED);
    e->has_parent = has_parent;
    e->parent = has_parent ? parent : 0;
    /* the chain's first block: vLLM's extra keys carry the salt in plain text */
    if (!has_parent && req->salt != NULL)
      kv_string(l, req->salt, &e->salt_off, &e->salt_len);
    if (req->lora_name != NULL) {
      kv_string(l, req->lora_name, &e->lora_off, &e->lora_len);
      e->lora_id = req->lora_id;
    }
    *open = true;
  }
  kv_push_hash(eng, h);
  uint32_t bs = eng->cfg.block_size;
  KVR_GROW(l->tokens, l->ntokens, l->tokens_cap, bs);
  memcpy(l->tokens + l->ntokens, tokens, bs * sizeof(*tokens));
  l->ntokens += bs;
}

void kvr_sim_engine_kv_events(kvr_sim_engine_t *eng, bool on) {
  eng->kv_on = on;
  kvr_sim_engine_kv_log_clear(eng);
}

const kvr_sim_kv_log_t *kvr_sim_engine_kv_log(const kvr_sim_engine_t *eng) {
  return eng->kv_on ? &eng->kv : NULL;
}

void kvr_sim_engine_kv_log_clear(kvr_sim_engine_t *eng) {
  eng->kv.nev = eng->kv.nhashes = eng->kv.ntokens = eng->kv.nsalts = 0;
}

/* Takes the least recently freed block, evicting its cached hash. Caller checked nfree > 0. */
static int32_t block_take(kvr_sim_engine_t *eng) {
  int32_t id = eng->free_head;
  free_remove(eng, id);
  if (eng->blocks[id].hashed) {
    kv_removed(eng, eng->blocks[id].hash);
    hash_remove(eng, id);
  }
  eng->blocks[id].ref = 1;
  return id;
}

static void block_release(kvr_sim_engine_t *eng, int32_t id) {
  if (--eng->blocks[id].ref == 0)
    free_push_tail(eng, id);
}

/* ---- engine lifetime ---- */

kvr_sim_engine_t *kvr_sim_engine_new(const kvr_sim_config_t *cfg) {
  char err[128];
  if (kvr_sim_config_check(cfg, err, sizeof(err)) != 0)
    return NULL;
  kvr_sim_engine_t *eng = kvr_xcalloc(1, sizeof(*eng));
  eng->cfg = *cfg;
  uint32_t nb = cfg->num_gpu_blocks;
  eng->blocks = kvr_xcalloc(nb, sizeof(block_t));
  uint32_t nbuckets = 1;
  while (nbuckets < nb)
    nbuckets <<= 1;
  eng->buckets = kvr_xcalloc(nbuckets, sizeof(int32_t));
  eng->bucket_mask = nbuckets - 1;
  for (uint32_t i = 0; i < nbuckets; i++)
    eng->buckets[i] = -1;
  eng->free_head = eng->free_tail = -1;
  kvr_list_init(&eng->waiting);
  for (uint32_t i = 0; i < nb; i++) {
    eng->blocks[i].hnext = -1;
    free_push_tail(eng, (int32_t)i);
  }
  eng->running = kvr_xcalloc(cfg->max_num_seqs, sizeof(*eng->running));
  eng->sched = kvr_xcalloc(cfg->max_num_seqs, sizeof(*eng->sched));
  eng->events = kvr_xcalloc(2 * (size_t)cfg->max_num_seqs + 1, sizeof(*eng->events));
  eng->scratch = kvr_xcalloc(cfg->max_model_len / cfg->block_size + 1, sizeof(int32_t));
  eng->next_id = 1;
  lora_set_init(&eng->gpu_loras, cfg->max_loras);
  lora_set_init(&eng->cpu_loras, cfg->max_loras ? cfg->max_cpu_loras : 0);
  return eng;
}

static void req_free_mem(kvr_sim_req_t *req) {
  free(req->salt);
  free(req->lora_name);
  free(req->tokens);
  free(req->blocks);
  free(req);
}

void kvr_sim_engine_free(kvr_sim_engine_t *eng) {
  if (eng == NULL)
    return;
  /* Requests still queued belong to callers that never removed them; the engine was their last
   * reference holder, so it frees them rather than leak. */
  for (uint32_t i = 0; i < eng->nrunning; i++)
    req_free_mem(eng->running[i]);
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, &eng->waiting) {
    req_free_mem(KVR_CONTAINER_OF(q, kvr_sim_req_t, wnode));
  }
  free(eng->blocks);
  free(eng->buckets);
  free(eng->running);
  free(eng->sched);
  free(eng->events);
  free(eng->scratch);
  free(eng->kv.ev);
  free(eng->kv.hashes);
  free(eng->kv.tokens);
  free(eng->kv.salts);
  lora_set_free(&eng->gpu_loras);
  lora_set_free(&eng->cpu_loras);
  free(eng);
}

const kvr_sim_config_t *kvr_sim_engine_config(const kvr_sim_engine_t *eng) {
  return &eng->cfg;
}

bool kvr_sim_engine_busy(const kvr_sim_engine_t *eng) {
  return eng->nrunning > 0 || eng->nwaiting > 0 || eng->nextra > 0;
}

bool kvr_sim_engine_has_hash(const kvr_sim_engine_t *eng, uint64_t hash) {
  return hash_find(eng, hash) >= 0;
}

int32_t kvr_sim_engine_next_victim(const kvr_sim_engine_t *eng) {
  return eng->free_head;
}

void kvr_sim_engine_stats(const kvr_sim_engine_t *eng, kvr_sim_stats_t *out) {
  *out = eng->stats;
  out->running = eng->nrunning;
  out->waiting = eng->nwaiting;
  out->blocks_used = eng->cfg.num_gpu_blocks - eng->nfree;
  out->blocks_cached = eng->nfree_hashed;
}

uint32_t kvr_sim_engine_reset_prefix_cache(kvr_sim_engine_t *eng, uint32_t *kept) {
  uint32_t dropped = 0, held = 0;
  for (uint32_t id = 0; id < eng->cfg.num_gpu_blocks; id++)
    held += eng->blocks[id].hashed && eng->blocks[id].ref > 0;
  /* vLLM resets only when no block is in use and then reports AllBlocksCleared; a partial reset
   * (the sim's own, see the header) reports each block it drops. */
  if (eng->kv_on && held == 0)
    kv_event_new(eng, KVR_SIM_KV_CLEARED);
  for (uint32_t id = 0; id < eng->cfg.num_gpu_blocks; id++) {
    block_t *b = &eng->blocks[id];
    if (!b->hashed || b->ref > 0)
      continue;
    if (held > 0)
      kv_removed(eng, b->hash);
    hash_remove(eng, (int32_t)id);
    dropped++;
  }
  /* Every free block had ref 0, so none of them is hashed any more. */
  eng->nfree_hashed = 0;
  if (kept)
    *kept = held;
  return dropped;
}

/* ---- queues ---- */

/* Queues req as waiting: at the back (a new request) or at the front (a preempted one). */
static void wait_push(kvr_sim_engine_t *eng, kvr_sim_req_t *req, bool front) {
  if (front)
    kvr_list_insert_head(&eng->waiting, &req->wnode);
  else
    kvr_list_insert_tail(&eng->waiting, &req->wnode);
  req->state = KVR_SIM_WAITING;
  eng->nwaiting++;
}

static void wait_unlink(kvr_sim_engine_t *eng, kvr_sim_req_t *req) {
  kvr_list_remove(&req->wnode);
  eng->nwaiting--;
}

/* The request admission would try next, or NULL when none waits. */
static kvr_sim_req_t *wait_front(const kvr_sim_engine_t *eng) {
  if (kvr_list_empty(&eng->waiting))
    return NULL;
  return KVR_CONTAINER_OF(eng->waiting.next, kvr_sim_req_t, wnode);
}

static void req_free_blocks(kvr_sim_engine_t *eng, kvr_sim_req_t *req) {
  /* Tail first, as vLLM does: the tail of a sequence is the least likely to be shared, so it
   * should be evicted before the head. */
  for (uint32_t i = req->nblocks; i > 0; i--)
    block_release(eng, req->blocks[i - 1]);
  req->nblocks = 0;
  req->nhashed = 0;
  req->last_hash = req->salt_root; /* the parent of the chain's first block */
}

uint64_t kvr_sim_salt_root(const char *salt, size_t len) {
  return XXH3_64bits_withSeed(salt, len, 0x73616c74u /* "salt" */) | 1u;
}

kvr_sim_req_t *kvr_sim_engine_add(kvr_sim_engine_t *eng, const uint32_t *prompt, uint32_t nprompt,
                                  uint32_t max_output, kvr_sim_finish_t stop_reason,
                                  uint64_t gen_seed, void *data) {
  kvr_sim_add_t a = {.prompt = prompt,
                     .nprompt = nprompt,
                     .max_output = max_output,
                     .stop_reason = stop_reason,
                     .gen_seed = gen_seed,
                     .data = data};
  return kvr_sim_engine_add_ex(eng, &a);
}

kvr_sim_req_t *kvr_sim_engine_add_ex(kvr_sim_engine_t *eng, const kvr_sim_add_t *a) {
  const kvr_sim_config_t *cfg = &eng->cfg;
  uint32_t nprompt = a->nprompt, max_output = a->max_output;
  if (nprompt == 0 || max_output == 0 || nprompt > cfg->max_model_len ||
      max_output > cfg->max_model_len - nprompt)
    return NULL;
  uint64_t need_blocks = ((uint64_t)nprompt + max_output + cfg->block_size - 1) / cfg->block_size;
  if (need_blocks > cfg->num_gpu_blocks)
    return NULL;
  if (a->lora_id != 0 && (cfg->max_loras == 0 || a->lora_name == NULL || a->lora_name[0] == 0))
    return NULL;
  kvr_sim_req_t *req = kvr_xcalloc(1, sizeof(*req));
  req->id = eng->next_id++;
  req->data = a->data;
  req->tokens_cap = nprompt + KVR_MIN(max_output, 1024u);
  req->tokens = kvr_xcalloc(req->tokens_cap, sizeof(uint32_t));
  memcpy(req->tokens, a->prompt, nprompt * sizeof(uint32_t));
  req->ntokens = req->num_prompt = nprompt;
  req->max_output = max_output;
  req->stop_reason = a->stop_reason;
  req->gen_seed = a->gen_seed;
  req->gen_offset = a->gen_offset;
  if (a->salt != NULL && a->salt[0] != '\0') {
    req->salt = kvr_xstrdup(a->salt);
    req->salt_root = kvr_sim_salt_root(a->salt, strlen(a->salt));
  }
  req->last_hash = req->salt_root;
  req->skip_prefix_read = a->skip_prefix_read;
  if (a->lora_id != 0) {
    req->lora_id = a->lora_id;
    req->lora_rank = KVR_MAX(a->lora_rank, 1u);
    req->lora_name = kvr_xstrdup(a->lora_name);
    req->lora_key = kvr_sim_lora_key(a->lora_name, strlen(a->lora_name));
  }
  req->num_cached = -1;
  /* The API server templates and tokenizes it before the scheduler sees it, one request or
   * step's output at a time. */
  const kvr_sim_frontend_t *fe = &cfg->frontend;
  double prep = fe->req_ms * 1e-3 + fe->prompt_tok_us * 1e-6 * nprompt;
  req->arrival_s = eng->now_s;
  req->ready_s = prep > 0 ? fmax(eng->now_s, eng->fe_free_s) + prep : eng->now_s;
  if (prep > 0)
    eng->fe_free_s = req->ready_s;
  wait_push(eng, req, false);
  return req;
}

static void running_remove(kvr_sim_engine_t *eng, kvr_sim_req_t *req) {
  for (uint32_t i = 0; i < eng->nrunning; i++) {
    if (eng->running[i] == req) {
      memmove(&eng->running[i], &eng->running[i + 1],
              (eng->nrunning - i - 1) * sizeof(*eng->running));
      eng->nrunning--;
      return;
    }
  }
}

void kvr_sim_engine_remove(kvr_sim_engine_t *eng, kvr_sim_req_t *req) {
  if (req == NULL)
    return;
  if (req->state == KVR_SIM_WAITING) {
    wait_unlink(eng, req);
  } else if (req->state == KVR_SIM_RUNNING) {
    running_remove(eng, req);
  }
  req_free_blocks(eng, req);
  req_free_mem(req);
}

/* ---- scheduling ---- */

/* Looks the full blocks of tokens[0..n) up in the cache (the chain starting from root: 0, or a
 * salt's root), stopping at the first miss; the last token is never a hit (it must be computed to
 * sample). Writes the hit blocks' ids into ids when it is not NULL; returns the number of hit
 * blocks. */
static uint32_t cached_blocks(const kvr_sim_engine_t *eng, const uint32_t *tokens, uint32_t n,
                              uint64_t root, uint64_t lora_key, int32_t *ids) {
  uint32_t bs = eng->cfg.block_size;
  uint32_t max_blocks = n > 0 ? (n - 1) / bs : 0;
  uint64_t parent = root;
  uint32_t hits = 0;
  for (; hits < max_blocks; hits++) {
    uint64_t h = block_hash(parent, tokens + (size_t)hits * bs, bs, lora_key);
    int32_t id = hash_find(eng, h);
    if (id < 0)
      break;
    if (ids)
      ids[hits] = id;
    parent = h;
  }
  return hits;
}

/* req's hit blocks into eng->scratch; returns their number. */
static uint32_t prefix_lookup(kvr_sim_engine_t *eng, const kvr_sim_req_t *req) {
  return cached_blocks(eng, req->tokens, req->ntokens, req->salt_root, req->lora_key, eng->scratch);
}

/* The tokens of prompt[0..n) the prefix cache holds now, as the scheduler will find them. */
static uint32_t cached_prefix(const kvr_sim_engine_t *eng, const uint32_t *prompt, uint32_t n,
                              uint64_t root, uint64_t lora_key) {
  if (!eng->cfg.enable_prefix_caching)
    return 0;
  return cached_blocks(eng, prompt, n, root, lora_key, NULL) * eng->cfg.block_size;
}

void kvr_sim_engine_probe(const kvr_sim_engine_t *eng, const uint32_t *prompt, uint32_t n,
                          kvr_sim_probe_t *out) {
  memset(out, 0, sizeof(*out));
  out->cached_tokens = cached_prefix(eng, prompt, n, 0, 0);
  for (uint32_t i = 0; i < eng->nrunning; i++) {
    const kvr_sim_req_t *r = eng->running[i];
    /* Still to compute: all of it while prefilling; a decoding request's last (sampled) token is
     * computed by its next decode, which is not prefill. */
    uint32_t left = r->ntokens - KVR_MIN(r->ntokens, r->num_computed);
    if (r->ntokens > r->num_prompt && left > 0)
      left--;
    out->pending_tokens += left;
    out->decode_ctx += r->ntokens;
  }
  out->running = eng->nrunning;
  for (const kvr_list_t *q = eng->waiting.next; q != &eng->waiting; q = q->next) {
    const kvr_sim_req_t *r = KVR_CONTAINER_OF(q, kvr_sim_req_t, wnode);
    /* A waiting request's prefix hit is taken when it is scheduled: what it will prefill is what
     * the cache does not hold now (a preempted request's computed tokens went with its blocks). */
    uint32_t done =
        KVR_MAX(r->num_computed, r->skip_prefix_read ? 0
                                                     : cached_prefix(eng, r->tokens, r->ntokens,
                                                                     r->salt_root, r->lora_key));
    out->pending_tokens += r->ntokens - KVR_MIN(r->ntokens, done);
    out->waiting++;
  }
}

/* Hashes the request's blocks that are full of known tokens, up to upto tokens. A block whose hash
 * is already cached elsewhere stays unhashed (a duplicate) but the chain continues. */
static void cache_full_blocks(kvr_sim_engine_t *eng, kvr_sim_req_t *req, uint32_t upto) {
  if (!eng->cfg.enable_prefix_caching)
    return;
  uint32_t bs = eng->cfg.block_size;
  uint32_t full = KVR_MIN(upto, req->ntokens) / bs;
  full = KVR_MIN(full, req->nblocks);
  bool open = false; /* the log's last event is this run's STORED event */
  for (uint32_t i = req->nhashed; i < full; i++) {
    const uint32_t *toks = req->tokens + (size_t)i * bs;
    uint64_t h = block_hash(req->last_hash, toks, bs, req->lora_key);
    int32_t id = req->blocks[i];
    if (!eng->blocks[id].hashed && hash_find(eng, h) < 0) {
      hash_insert(eng, id, h);
      kv_stored(eng, &open, i > 0, req->last_hash, h, toks, req);
    } else {
      open = false; /* a duplicate breaks the run: the next new block starts an event */
    }
    req->last_hash = h;
  }
  if (full > req->nhashed)
    req->nhashed = full;
}

static void req_reserve_blocks(kvr_sim_req_t *req, uint32_t n) {
  if (n <= req->blocks_cap)
    return;
  uint32_t cap = req->blocks_cap ? req->blocks_cap : 16;
  while (cap < n)
    cap *= 2;
  req->blocks = kvr_xrealloc(req->blocks, cap * sizeof(int32_t));
  req->blocks_cap = cap;
}

/* Gives req blocks for num_new more tokens after its num_computed ones, first taking the nhits
 * prefix-hit blocks in eng->scratch (admission only). Returns false, changing nothing, when the
 * free list cannot supply them. */
static bool allocate_slots(kvr_sim_engine_t *eng, kvr_sim_req_t *req, uint32_t num_new,
                           uint32_t nhits) {
  uint32_t bs = eng->cfg.block_size;
  uint32_t total = (req->num_computed + num_new + bs - 1) / bs;
  uint32_t have = req->nblocks + nhits;
  uint32_t need = total > have ? total - have : 0;
  uint32_t evictable_hits = 0;
  for (uint32_t i = 0; i < nhits; i++)
    evictable_hits += eng->blocks[eng->scratch[i]].ref == 0;
  if (need + evictable_hits > eng->nfree)
    return false;
  req_reserve_blocks(req, KVR_MAX(total, have));
  uint64_t parent = 0;
  for (uint32_t i = 0; i < nhits; i++) {
    int32_t id = eng->scratch[i];
    if (eng->blocks[id].ref++ == 0)
      free_remove(eng, id);
    req->blocks[req->nblocks++] = id;
    parent = eng->blocks[id].hash;
  }
  if (nhits > 0) {
    req->nhashed = nhits;
    req->last_hash = parent;
  }
  for (uint32_t i = 0; i < need; i++)
    req->blocks[req->nblocks++] = block_take(eng);
  cache_full_blocks(eng, req, req->num_computed + num_new);
  return true;
}

static kvr_sim_event_t *event_add(kvr_sim_engine_t *eng, kvr_sim_step_t *out, kvr_sim_req_t *req) {
  kvr_sim_event_t *ev = &out->events[out->nevents++];
  memset(ev, 0, sizeof(*ev));
  ev->req = req;
  return ev;
}

static void preempt(kvr_sim_engine_t *eng, kvr_sim_step_t *out, kvr_sim_req_t *req) {
  req_free_blocks(eng, req);
  req->num_computed = 0;
  req->num_preemptions++;
  eng->stats.preemptions++;
  wait_push(eng, req, true);
  event_add(eng, out, req)->preempted = true;
}

/* Whether generated token k of the request with this seed is non-canonical (a pure function, so a
 * repeated request drifts at the same places). */
static bool drifts(double p, uint64_t gen_seed, uint32_t k) {
  if (p <= 0)
    return false;
  uint64_t h = kvr_sim_tokens_mix(gen_seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)k + 1)));
  return (double)(h >> 11) * 0x1.0p-53 < p;
}

/* Appends generated token k: the id of word k, or, when it drifts, another id for the same text
 * (what the next turn's tokenizer will not reproduce). */
static void req_append_token(const kvr_sim_engine_t *eng, kvr_sim_req_t *req) {
  if (req->ntokens == req->tokens_cap) {
    uint32_t cap = req->tokens_cap * 2;
    req->tokens = kvr_xrealloc(req->tokens, cap * sizeof(uint32_t));
    req->tokens_cap = cap;
  }
  uint32_t k = req->gen_offset + (req->ntokens - req->num_prompt);
  uint32_t id = kvr_sim_tokens_word_id(req->gen_seed, k);
  if (drifts(eng->cfg.retok_drift, req->gen_seed, k)) {
    id = (id + 1) % KVR_SIM_VOCAB;
    req->num_drifted++;
  }
  req->tokens[req->ntokens++] = id;
}

/* ---- one step: schedule running, admit waiting, execute ---- */

/* Puts req in this step's batch for num_new tokens, charged to the budget. */
static void batch_add(kvr_sim_engine_t *eng, batch_t *b, kvr_sim_req_t *req, uint32_t num_new) {
  eng->sched[b->nsched++] = (sched_t){req, num_new};
  b->budget -= num_new;
}

/* Gives the running request req blocks for num_new more tokens, preempting the most recently
 * admitted running request until they fit. Returns false when req itself had to be preempted. */
static bool allocate_or_preempt(kvr_sim_engine_t *eng, kvr_sim_step_t *out, batch_t *b,
                                kvr_sim_req_t *req, uint32_t num_new) {
  while (!allocate_slots(eng, req, num_new, 0)) {
    kvr_sim_req_t *victim = eng->running[--eng->nrunning];
    preempt(eng, out, victim);
    b->preempted = true;
    if (victim == req)
      return false;
  }
  return true;
}

/* Step 1: running requests in admission order, each taking min(tokens left, budget), until the
 * budget is spent or a request had to preempt itself. A victim is always behind req in the
 * running array, so no request already in the batch is ever preempted. */
static void schedule_running(kvr_sim_engine_t *eng, kvr_sim_step_t *out, batch_t *b) {
  for (uint32_t i = 0; i < eng->nrunning && b->budget > 0; i++) {
    kvr_sim_req_t *req = eng->running[i];
    uint32_t num_new = KVR_MIN(req->ntokens - req->num_computed, b->budget);
    if (num_new == 0)
      continue;
    if (!allocate_or_preempt(eng, out, b, req, num_new))
      return;
    batch_add(eng, b, req, num_new);
  }
}

/* Admits the waiting request req with what is left of the budget, after looking its prefix up in
 * the cache. Returns false, leaving it waiting with num_computed 0, when its blocks do not fit. */
static bool admit(kvr_sim_engine_t *eng, batch_t *b, kvr_sim_req_t *req) {
  const kvr_sim_config_t *cfg = &eng->cfg;
  /* vLLM's get_computed_blocks skips a request with skip_reading_prefix_cache entirely: no
   * lookup, nothing counted (vllm/v1/core/kv_cache_manager.py). */
  bool lookup = cfg->enable_prefix_caching && !req->skip_prefix_read;
  uint32_t nhits = 0;
  if (lookup)
    nhits = prefix_lookup(eng, req);
  req->num_computed = nhits * cfg->block_size;
  uint32_t num_new = KVR_MIN(req->ntokens - req->num_computed, b->budget);
  if (!allocate_slots(eng, req, num_new, nhits)) {
    req->num_computed = 0;
    return false; /* retried next step; the lookup is counted once, when it admits */
  }
  if (lookup) {
    eng->stats.prefix_queries += req->ntokens;
    eng->stats.prefix_hits += (uint64_t)nhits * cfg->block_size;
  }
  if (req->num_cached < 0)
    req->num_cached = (int32_t)(nhits * cfg->block_size);
  wait_unlink(eng, req);
  req->state = KVR_SIM_RUNNING;
  eng->running[eng->nrunning++] = req;
  batch_add(eng, b, req, num_new);
  return true;
}

/* The distinct adapters of this step's batch so far into ids (at most LORA_IDS_MAX, the largest
 * max_loras; running requests not scheduled this step are not counted, as in vLLM, so the
 * running set may briefly hold more); returns how many (vLLM's scheduled_loras, built from the
 * scheduled running requests). */
static uint32_t batch_loras(const kvr_sim_engine_t *eng, const batch_t *b, uint32_t *ids) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < b->nsched; i++) {
    uint32_t id = eng->sched[i].req->lora_id, k = 0;
    while (k < n && ids[k] != id)
      k++;
    if (id != 0 && k == n && n < LORA_IDS_MAX)
      ids[n++] = id;
  }
  return n;
}

/* Whether adding req keeps the batch within max_loras adapters (nloras of them in ids). */
static bool lora_fits(const kvr_sim_engine_t *eng, const kvr_sim_req_t *req, const uint32_t *ids,
                      uint32_t nloras) {
  if (req->lora_id == 0 || nloras < eng->cfg.max_loras)
    return true;
  for (uint32_t k = 0; k < nloras; k++) {
    if (ids[k] == req->lora_id)
      return true;
  }
  return false;
}

/* Step 2: admits waiting requests in queue order while budget, max_num_seqs and blocks allow; the
 * first request that does not fit, or was not ready for the scheduler by cutoff, stops admission
 * (FCFS). A request whose adapter would exceed max_loras is skipped and keeps its place, as
 * vLLM's scheduler skips it (step_skipped_waiting, put back in front in order). */
static void admit_waiting(kvr_sim_engine_t *eng, batch_t *b, double cutoff) {
  uint32_t ids[LORA_IDS_MAX];
  uint32_t nloras = eng->cfg.max_loras ? batch_loras(eng, b, ids) : 0;
  kvr_list_t *q = eng->waiting.next;
  while (q != &eng->waiting && b->budget > 0 && eng->nrunning < eng->cfg.max_num_seqs) {
    kvr_sim_req_t *req = KVR_CONTAINER_OF(q, kvr_sim_req_t, wnode);
    q = q->next; /* admit() unlinks req */
    if (req->ready_s > cutoff)
      return;
    if (!lora_fits(eng, req, ids, nloras))
      continue;
    if (!admit(eng, b, req))
      return;
    if (req->lora_id != 0) {
      uint32_t k = 0;
      while (k < nloras && ids[k] != req->lora_id)
        k++;
      if (k == nloras && nloras < LORA_IDS_MAX)
        ids[nloras++] = req->lora_id;
    }
  }
}

/* Adds n scheduled tokens of req (before they are computed) to the step's cost figures: a decode
 * (one token after its whole context) reads that context; a prefill chunk computes n tokens whose
 * causal attention also spans the num_computed tokens before them. */
static void cost_add(kvr_sim_step_t *out, const kvr_sim_req_t *req, uint32_t n) {
  bool decode = n == 1 && req->ntokens > req->num_prompt && req->num_computed + 1 == req->ntokens;
  if (decode) {
    out->num_decode++;
    out->decode_ctx += req->ntokens;
  } else {
    out->prefill_tokens += n;
    out->attn_pairs += (double)n * ((double)req->num_computed + (double)(n + 1) / 2.0);
  }
}

/* req has all its tokens computed: it samples one token, and finishes (its blocks freed) once it
 * has max_output of them. */
static void sample(kvr_sim_engine_t *eng, kvr_sim_req_t *req, kvr_sim_event_t *ev) {
  if (req->ntokens == req->num_prompt)
    eng->stats.prompt_tokens += req->num_prompt;
  req_append_token(eng, req);
  ev->new_tokens = 1;
  eng->stats.generation_tokens++;
  if (req->ntokens - req->num_prompt >= req->max_output) {
    req->finish = req->stop_reason;
    req->state = KVR_SIM_FINISHED;
    req_free_blocks(eng, req);
    ev->finished = true;
    /* Async scheduling scheduled the next step before this EOS was known: the request takes
     * part in it for nothing. A length stop is known ahead and is not (vLLM PR #27922). */
    if (eng->cfg.frontend.async_scheduling && req->stop_reason == KVR_SIM_FINISH_STOP) {
      eng->nextra++;
      eng->extra_ctx += req->ntokens;
    }
  }
}

/* Puts adapter id in the CPU cache (an adapter it evicts leaves its GPU slot too: vLLM's
 * remove_adapter deactivates it). Returns true when it had to be read from disk. */
static bool lora_cpu(kvr_sim_engine_t *eng, uint32_t id) {
  uint32_t evicted;
  bool miss = lora_touch(&eng->cpu_loras, id, ++eng->lora_clock, &evicted);
  if (evicted != 0)
    lora_drop(&eng->gpu_loras, evicted);
  return miss;
}

/* The time to bring adapter id (rank) into a GPU slot, reading it from disk first when it is not
 * in the CPU cache; both caches are updated. n_load and n_disk count what happened. */
static double lora_bring(kvr_sim_engine_t *eng, uint32_t id, uint32_t rank, uint32_t *n_load,
                         uint32_t *n_disk) {
  const kvr_sim_cost_t *c = &eng->cfg.cost;
  uint32_t evicted;
  bool disk = lora_cpu(eng, id);
  if (!lora_touch(&eng->gpu_loras, id, ++eng->lora_clock, &evicted))
    return 0;
  double s = c->lora_load_ms_per_rank * 1e-3 * rank;
  (*n_load)++;
  if (disk) {
    (*n_disk)++;
    s += c->lora_disk_ms_per_rank * 1e-3 * rank;
  }
  return s;
}

/* Before the batch runs, every adapter it needs gets a GPU slot (vLLM's set_active_adapters in
 * the model runner, ahead of the forward pass): one not in a slot is copied in from the CPU
 * cache, and read from disk first when it is not there either. The time goes into the step. */
static void lora_activate(kvr_sim_engine_t *eng, kvr_sim_step_t *out, const batch_t *b) {
  out->lora_s = eng->lora_pending_s; /* loads asked for between steps (kvr_sim_engine_lora_add) */
  eng->lora_pending_s = 0;
  for (uint32_t i = 0; i < b->nsched; i++) {
    const kvr_sim_req_t *req = eng->sched[i].req;
    if (req->lora_id != 0)
      out->lora_s +=
          lora_bring(eng, req->lora_id, req->lora_rank, &out->lora_loads, &out->lora_disk_loads);
  }
}

double kvr_sim_engine_lora_add(kvr_sim_engine_t *eng, uint32_t lora_id, uint32_t rank,
                               bool charge) {
  if (eng->cfg.max_loras == 0 || lora_id == 0)
    return 0;
  uint32_t n_load = 0, n_disk = 0;
  double s = lora_bring(eng, lora_id, KVR_MAX(rank, 1u), &n_load, &n_disk);
  if (charge)
    eng->lora_pending_s += s;
  return s;
}

void kvr_sim_engine_lora_remove(kvr_sim_engine_t *eng, uint32_t lora_id) {
  lora_drop(&eng->gpu_loras, lora_id);
  lora_drop(&eng->cpu_loras, lora_id);
}

bool kvr_sim_engine_lora_on_gpu(const kvr_sim_engine_t *eng, uint32_t lora_id) {
  return lora_find(&eng->gpu_loras, lora_id) >= 0;
}

bool kvr_sim_engine_lora_on_cpu(const kvr_sim_engine_t *eng, uint32_t lora_id) {
  return lora_find(&eng->cpu_loras, lora_id) >= 0;
}

/* Adds req's adapter to reqs[0..*n) unless one of its requests is there (n counts all of them,
 * up to cap kept). */
static void lora_list_add(const kvr_sim_req_t *req, const kvr_sim_req_t **reqs, size_t cap,
                          size_t *n, uint32_t *seen, size_t *nseen) {
  if (req->lora_id == 0)
    return;
  for (size_t k = 0; k < *nseen; k++) {
    if (seen[k] == req->lora_id)
      return;
  }
  if (*nseen < 1024)
    seen[(*nseen)++] = req->lora_id;
  if (*n < cap)
    reqs[*n] = req;
  (*n)++;
}

size_t kvr_sim_engine_loras(const kvr_sim_engine_t *eng, bool running, const kvr_sim_req_t **reqs,
                            size_t cap) {
  uint32_t seen[1024];
  size_t n = 0, nseen = 0;
  if (running) {
    for (uint32_t i = 0; i < eng->nrunning; i++)
      lora_list_add(eng->running[i], reqs, cap, &n, seen, &nseen);
    return n;
  }
  for (const kvr_list_t *q = eng->waiting.next; q != &eng->waiting; q = q->next)
    lora_list_add(KVR_CONTAINER_OF(q, kvr_sim_req_t, wnode), reqs, cap, &n, seen, &nseen);
  return n;
}

/* Step 3: "executes" the batch in order: cost, advance num_computed, one event each, sample. */
static void run_batch(kvr_sim_engine_t *eng, kvr_sim_step_t *out, uint32_t nsched) {
  for (uint32_t i = 0; i < nsched; i++) {
    kvr_sim_req_t *req = eng->sched[i].req;
    uint32_t n = eng->sched[i].num_new;
    cost_add(out, req, n);
    req->num_computed += n;
    kvr_sim_event_t *ev = event_add(eng, out, req);
    if (req->num_computed < req->ntokens)
      continue; /* prefill chunk, more to come */
    sample(eng, req, ev);
    out->num_out++;
  }
}

/* Drops the requests that finished this step from the running array, keeping the order. */
static void running_compact(kvr_sim_engine_t *eng) {
  uint32_t kept = 0;
  for (uint32_t i = 0; i < eng->nrunning; i++) {
    if (eng->running[i]->state == KVR_SIM_RUNNING)
      eng->running[kept++] = eng->running[i];
  }
  eng->nrunning = kept;
}

void kvr_sim_engine_set_now(kvr_sim_engine_t *eng, double now_s) {
  eng->now_s = fmax(eng->now_s, now_s);
}

void kvr_sim_engine_skip_to(kvr_sim_engine_t *eng, double t_s) {
  kvr_sim_engine_set_now(eng, t_s);
  eng->end_s = fmax(eng->end_s, t_s);
  eng->fe_free_s = fmax(eng->fe_free_s, t_s);
}

void kvr_sim_engine_set_step_delay(kvr_sim_engine_t *eng, double seconds) {
  eng->step_delay_s = seconds > 0 ? seconds : 0;
}

/* Whether the engine is mid-run: the last step left requests running (or an async extra step),
 * so the next step follows it back to back. */
static bool engine_running(const kvr_sim_engine_t *eng) {
  return eng->nrunning > 0 || eng->nextra > 0;
}

double kvr_sim_engine_next_start(const kvr_sim_engine_t *eng) {
  if (engine_running(eng))
    return eng->end_s;
  const kvr_sim_req_t *head = wait_front(eng);
  return head ? fmax(eng->end_s, head->ready_s) : HUGE_VAL;
}

/* Async scheduling's extra step: last step's EOS requests take a decode slot each, for nothing. */
static void add_extra(kvr_sim_engine_t *eng, kvr_sim_step_t *out, batch_t *b) {
  uint32_t n = KVR_MIN(eng->nextra, b->budget);
  b->budget -= n;
  out->num_seqs += n;
  out->num_decode += n;
  out->decode_ctx += eng->extra_ctx;
  eng->nextra = 0;
  eng->extra_ctx = 0;
}

int kvr_sim_engine_step(kvr_sim_engine_t *eng, kvr_sim_step_t *out) {
  memset(out, 0, sizeof(*out));
  out->events = eng->events;
  bool running = engine_running(eng);
  double start = kvr_sim_engine_next_start(eng);
  if (start == HUGE_VAL)
    start = eng->end_s;
  /* Synchronous scheduling (or an idle engine) schedules this step when it starts; async
   * scheduling scheduled it when the previous one started. */
  double cutoff = running && eng->cfg.frontend.async_scheduling ? eng->last_start_s : start;
  batch_t b = {.budget = eng->cfg.max_num_batched_tokens};
  add_extra(eng, out, &b);
  schedule_running(eng, out, &b);
  if (!b.preempted) /* vLLM admits nothing in a step that had to preempt */
    admit_waiting(eng, &b, cutoff);
  if (eng->cfg.max_loras > 0)
    lora_activate(eng, out, &b);
  run_batch(eng, out, b.nsched);
  out->num_seqs += b.nsched;
  out->num_tokens = out->prefill_tokens + out->num_decode;
  running_compact(eng);
  out->start_s = start;
  out->duration_s = kvr_sim_cost_step(&eng->cfg.cost, out);
  if (out->num_seqs > 0)
    out->duration_s += eng->step_delay_s;
  /* The API server turns this step's tokens into stream chunks after what it already has. */
  double end = start + out->duration_s;
  double post = eng->cfg.frontend.stream_tok_us * 1e-6 * out->num_out;
  out->deliver_s = post > 0 ? fmax(end, eng->fe_free_s) + post : end;
  if (post > 0)
    eng->fe_free_s = out->deliver_s;
  eng->last_start_s = start;
  eng->end_s = end;
  if (out->num_seqs > 0)
    eng->stats.steps++;
  return 0;
}

/* sim_engine.h -- a discrete-time model of one vLLM V1 engine (scheduler + KV cache + step cost).
 *
 * Pure: no libuv, no HTTP, no clock. Requests go in as token arrays; kvr_sim_engine_step() runs one
 * engine iteration (schedule, "execute", sample) and returns how long that iteration takes on the
 * modelled GPU plus what happened to each request (tokens emitted, finished, preempted). The caller
 * (sim_server.c, or a test, or the calibration driver) decides when simulated time passes.
 *
 * Model, following vLLM V1's scheduler and KV cache manager:
 *   - KV cache of num_gpu_blocks blocks of block_size tokens. A full block is hashed by chaining
 *     (hash of the parent block, its tokens) over prompt and generated tokens; a hashed block
 *     is found by later requests with the same prefix (prefix caching). Freed blocks keep their
 *     hash in an LRU free list and are evicted oldest first when a new block is needed; a
 *     request's blocks are freed tail first, so its tail blocks are evicted before its head.
 *   - Continuous batching: each step has a budget of max_num_batched_tokens. Running requests
 *     are served first in arrival order (a decode costs 1 token; a partially prefilled prompt
 *     takes what the budget allows), then waiting requests are admitted in FCFS order, up to
 *     max_num_seqs running, their prompt prefilled in chunks (chunked prefill).
 *   - When a running request needs a block and none is free, the most recently admitted running
 *     request is preempted (recompute): its blocks are freed and it goes back to the front of
 *     the waiting queue with its generated tokens, to be prefilled again (mostly from the
 *     prefix cache).
 *   - The waiting queue is one kvr_list_t (src/base/list.h) linked through kvr_sim_req_t.wnode, in
 * the order vLLM's scheduler sees it: kvr_sim_engine_add() appends, a preempted request is put in
 *     front (of several preempted in one step, the earliest admitted ends up first), and admission
 *     takes the front request only, stopping at the first one that does not fit (no skipping).
 *   - Step time (bench/sim/README.md reads every term as a fraction of the H200):
 *       max(weights, dense_tok * scheduled tokens)        the dense layers: memory or compute bound
 *       + step + per_seq * seqs                            per-step and per-sequence overheads
 *       + decode_ctx * (context tokens of the decoding sequences)            KV reads of decode
 *       + attn_pair * (query x key pairs of the prefill chunks' causal attention).
 *   - Outside the GPU (kvr_sim_frontend_t), vLLM's API server is one FIFO server in simulated
 *     time: a request is tokenized and templated before the scheduler sees it (ready_s), and a
 *     step's tokens reach the clients after that step's output processing (deliver_s). With async
 *     scheduling the scheduler runs one step ahead: a request that became ready while step N ran
 *     is admitted in step N+2 (in N+1 when the engine was idle), and a request that stopped on EOS
 *     takes part in one more (wasted) step.
 *   - cache_salt (vLLM's kv_cache_utils.py: the salt is an extra key of the block with
 *     start_token_idx 0 only, and every later block chains from it): a salted request's chain
 *     starts from kvr_sim_salt_root(salt) instead of 0, so requests with different salts (or
 *     none) share no block; the STORED event of a salted chain's first block carries the salt.
 *   - LoRA (max_loras > 0, vLLM's --enable-lora): a request may name an adapter (lora_id, its
 *     name and rank). Admission follows vLLM v1's scheduler (vllm/v1/core/sched/scheduler.py,
 *     schedule(): "Check that adding the request still respects the max_loras constraint"): the
 *     adapters of the running requests scheduled this step, plus those admitted so far, form
 *     scheduled_loras; a waiting request whose adapter would make it more than max_loras is
 *     skipped (it keeps its place; requests behind it may still be admitted), unlike a request
 *     that does not fit, which stops admission. The GPU holds max_loras adapter slots and the
 *     CPU max_cpu_loras adapters, both LRU (vllm/lora/worker_manager.py
 *     LRUCacheWorkerLoRAManager, vllm/lora/model_manager.py LRUCacheLoRAModelManager): a step
 *     whose batch needs an adapter not in a GPU slot first copies it in, lora_load_ms_per_rank x
 *     rank, and before that reads it from disk when it is not in the CPU cache either,
 *     lora_disk_ms_per_rank x rank (kvr_sim_step_t.lora_s; the terms, sim_preset.c's
 *     kvr_sim_preset_lora_costs, are the adapter's bytes over PCIe and over a disk). The
 *     adapter's name is an extra key of every block's hash (kv_cache_utils.py
 *     generate_block_hash_extra_keys: lora_name first), so adapters never share blocks with each
 *     other or with the base model, and STORED events carry lora_id, lora_name and per-block
 *     extra_keys [name] ([name, salt] for a salted chain's first block).
 *   - Re-tokenization: a generated token is "non-canonical" with probability retok_drift, i.e.
 *     its id differs from the id the tokenizer gives its text, so when the next turn resends the
 *     answer as text the prefix-cache hit stops at the block holding it.
 *   - Time: the engine keeps its own simulated clock. kvr_sim_engine_set_now() stamps arrivals;
 *     each step starts where the previous one ended (or, idle, when the first waiting request is
 *     ready) and kvr_sim_engine_next_start() says when that is.
 *
 * Ownership: kvr_sim_engine_add() returns a request the caller owns: it stays valid until the
 * caller calls kvr_sim_engine_remove() (which aborts it first if it is still waiting or running).
 * Events returned by kvr_sim_engine_step() point at requests and stay valid until the next step or
 * remove.
 */
#ifndef KVR_SIM_ENGINE_H
#define KVR_SIM_ENGINE_H

#include "base/list.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_sim_engine_s kvr_sim_engine_t;
typedef struct kvr_sim_req_s kvr_sim_req_t;

/* Cost model of one engine step; see bench/sim/README.md for where the defaults come from. */
typedef struct kvr_sim_cost_s {
  double weights_ms;    /* per step: the dense layers' memory floor (every FP8 weight read once) */
  double dense_tok_us;  /* per scheduled token (prefill or decode): the dense layers' compute */
  double step_ms;       /* per step: what CUDA graphs and async scheduling do not hide */
  double per_seq_ms;    /* per scheduled sequence: sampling, logits, input preparation */
  double decode_ctx_ns; /* per context token of each decoding sequence: KV reads */
  double attn_pair_ns;  /* per (query, key) pair of prefill attention: the quadratic term */
  /* LoRA adapter swaps, per unit of the adapter's rank (see above); charged only in a step
   * that needs an adapter not in a GPU slot */
  double lora_load_ms_per_rank; /* CPU -> GPU slot (PCIe) */
  double lora_disk_ms_per_rank; /* disk -> CPU cache, for an adapter not in it */
} kvr_sim_cost_t;

/* vLLM outside the GPU step: its API server process and its scheduler's pipelining. */
typedef struct kvr_sim_frontend_s {
  double req_ms;         /* per request: HTTP, validation, chat template, scheduling */
  double prompt_tok_us;  /* per prompt token: tokenization */
  double stream_tok_us;  /* per streamed token: detokenization, chunk JSON, SSE write */
  bool async_scheduling; /* vLLM's default: the scheduler runs one step ahead (see above) */
} kvr_sim_frontend_t;

struct kvr_sim_preset_s; /* bench/sim/sim_preset.h */

typedef struct kvr_sim_config_s {
  /* The (model, GPU) pair the hardware terms below were set from by `--preset` (sim_preset.h);
   * NULL: the defaults, which are the preset llama-3.3-70b-fp8-h200. The engine never reads it;
   * --print-costs and the metrics' cache_dtype label do. */
  const struct kvr_sim_preset_s *preset;
  uint32_t num_gpu_blocks;         /* default 21770: 53.15 GiB / (163,840 B/token * 16) */
  uint32_t block_size;             /* tokens per block; default 16 */
  uint32_t max_num_seqs;           /* default 1024 */
  uint32_t max_num_batched_tokens; /* per-step token budget; default 8192 */
  uint32_t max_model_len;          /* prompt + output limit; default 131072 */
  uint32_t max_loras;              /* LoRA: adapters per batch (GPU slots); 0 = LoRA off */
  uint32_t max_cpu_loras;          /* LoRA: adapters in the CPU cache; >= max_loras */
  bool enable_prefix_caching;      /* default true */
  double retok_drift;              /* per generated token: P(its id is non-canonical), see above */
  kvr_sim_cost_t cost;
  kvr_sim_frontend_t frontend;
} kvr_sim_config_t;

typedef enum {
  KVR_SIM_WAITING = 0,
  KVR_SIM_RUNNING,
  KVR_SIM_FINISHED,
  KVR_SIM_ABORTED
} kvr_sim_state_t;

typedef enum {
  KVR_SIM_FINISH_NONE = 0,
  KVR_SIM_FINISH_STOP,
  KVR_SIM_FINISH_LENGTH
} kvr_sim_finish_t;

/* A request. Fields are read-only for the caller except data. */
struct kvr_sim_req_s {
  uint64_t id;      /* assigned by the engine, increasing */
  void *data;       /* caller's */
  uint32_t *tokens; /* prompt then generated ids; owned */
  uint32_t ntokens; /* prompt + generated so far */
  uint32_t tokens_cap;
  uint32_t num_prompt;
  uint32_t max_output;          /* the request finishes when it has generated this many tokens */
  kvr_sim_finish_t stop_reason; /* what reaching max_output means: STOP (eos) or LENGTH */
  uint64_t gen_seed;            /* seed of the generated words (kvr_sim_tokens_word_id) */
  uint32_t gen_offset;          /* generated token k is word gen_offset + k of gen_seed */
  char *salt;                   /* cache_salt (owned, NUL-terminated) or NULL */
  uint64_t salt_root;           /* kvr_sim_salt_root(salt), 0 without one: block 0's parent */
  bool skip_prefix_read;        /* vLLM's skip_reading_prefix_cache (chat echo): no lookup */
  uint32_t lora_id;             /* the adapter's lora_int_id (> 0), 0: the base model */
  uint32_t lora_rank;           /* its rank (the swap cost's size) */
  char *lora_name;              /* its name (owned), NULL without one */
  uint64_t lora_key;            /* kvr_sim_lora_key(lora_name), 0 without: mixed into every hash */
  double arrival_s;             /* simulated time it was added */
  double ready_s;               /* when the API server handed it to the scheduler */
  uint32_t num_drifted;         /* generated tokens whose id is non-canonical */
  uint32_t num_computed;        /* tokens whose KV is in the cache (computed or prefix hit) */
  int32_t num_cached;           /* prefix-cache hit tokens at first admission; -1 before */
  uint32_t num_preemptions;
  kvr_sim_state_t state;
  kvr_sim_finish_t finish;
  /* block table: block ids; nhashed of them are full and hashed in the cache */
  int32_t *blocks;
  uint32_t nblocks, blocks_cap, nhashed;
  uint64_t last_hash; /* hash of block nhashed-1 (chain parent) */
  kvr_list_t wnode;   /* in the engine's waiting queue exactly while state is KVR_SIM_WAITING */
};

typedef struct kvr_sim_event_s {
  kvr_sim_req_t *req;
  uint32_t new_tokens; /* tokens generated in this step (0 or 1) */
  bool finished;       /* req->finish says why; its blocks are already freed */
  bool preempted;      /* req went back to the waiting queue */
} kvr_sim_event_t;

typedef struct kvr_sim_step_s {
  double start_s;      /* simulated time the step starts */
  double duration_s;   /* simulated time this step takes; 0 when nothing was scheduled */
  double deliver_s;    /* when its tokens reach the clients: end + output processing */
  uint32_t num_tokens; /* dense-layer tokens: prefill_tokens + num_decode */
  uint32_t num_out;    /* requests that got a token (streamed chunks) */
  uint32_t num_seqs;   /* sequences scheduled (an async EOS request's wasted step included) */
  uint32_t num_decode; /* of which decoding */
  uint32_t prefill_tokens;
  uint64_t decode_ctx; /* sum of the decoding sequences' context lengths */
  double attn_pairs;
  uint32_t lora_loads;      /* adapters copied into a GPU slot before this step */
  uint32_t lora_disk_loads; /* of which read from disk first (not in the CPU cache) */
  double lora_s;            /* the time those took, part of duration_s */
  kvr_sim_event_t *events;  /* owned by the engine; valid until the next step */
  size_t nevents;
} kvr_sim_step_t;

/* Cumulative counters, as vLLM exports them. */
typedef struct kvr_sim_stats_s {
  uint64_t prefix_queries; /* tokens looked up in the prefix cache */
  uint64_t prefix_hits;    /* of which found */
  uint64_t preemptions;
  uint64_t prompt_tokens; /* prompt tokens of requests whose prefill completed */
  uint64_t generation_tokens;
  uint64_t steps;
  uint32_t running, waiting;
  uint32_t blocks_used;   /* blocks referenced by a request */
  uint32_t blocks_cached; /* free blocks still holding a hash */
} kvr_sim_stats_t;

/* Fills cfg with the defaults (Llama-70B FP8 on one H200). */
void kvr_sim_config_default(kvr_sim_config_t *cfg);

/* Checks a configuration; returns 0 or KVR_EINVAL with the offending field named in err. */
int kvr_sim_config_check(const kvr_sim_config_t *cfg, char *err, size_t errlen);

/* The modelled duration (seconds) of a step with these contents (num_seqs, num_decode,
 * prefill_tokens, decode_ctx, attn_pairs; the other fields are ignored); the cost model alone. */
double kvr_sim_cost_step(const kvr_sim_cost_t *cost, const kvr_sim_step_t *contents);

/* Creates an engine (copies cfg). Returns NULL on a bad config or out of memory. */
kvr_sim_engine_t *kvr_sim_engine_new(const kvr_sim_config_t *cfg);
void kvr_sim_engine_free(kvr_sim_engine_t *eng); /* accepts NULL; frees requests it still holds */

/* Adds a request at the back of the waiting queue. prompt is copied. max_output >= 1 generated
 * tokens; reaching it finishes the request with stop_reason. Returns the request (owned by the
 * caller, see above) or NULL if nprompt is 0 or prompt + max_output exceed max_model_len. */
kvr_sim_req_t *kvr_sim_engine_add(kvr_sim_engine_t *eng, const uint32_t *prompt, uint32_t nprompt,
                                  uint32_t max_output, kvr_sim_finish_t stop_reason,
                                  uint64_t gen_seed, void *data);

/* Everything kvr_sim_engine_add_ex() takes; zero-initialise and set what applies. */
typedef struct kvr_sim_add_s {
  const uint32_t *prompt; /* copied */
  uint32_t nprompt;
  uint32_t max_output;
  kvr_sim_finish_t stop_reason;
  uint64_t gen_seed;
  uint32_t gen_offset;   /* the first generated token is word gen_offset (a continued answer) */
  const char *salt;      /* cache_salt, copied; NULL or "" = none */
  bool skip_prefix_read; /* no prefix-cache lookup at admission (and none counted) */
  uint32_t lora_id;      /* an adapter (needs max_loras > 0): its lora_int_id > 0; 0 = none */
  uint32_t lora_rank;    /* its rank, >= 1 */
  const char *lora_name; /* its name, copied: the hashes' and events' extra key */
  void *data;
} kvr_sim_add_t;

/* kvr_sim_engine_add() with every option. NULL also for an adapter on an engine without LoRA. */
kvr_sim_req_t *kvr_sim_engine_add_ex(kvr_sim_engine_t *eng, const kvr_sim_add_t *a);

/* The extra key an adapter's name puts into every block hash: nonzero. */
uint64_t kvr_sim_lora_key(const char *name, size_t len);

/* Loads adapter lora_id of rank as vLLM's add_lora does (POST /v1/load_lora_adapter, and
 * --lora-modules at startup: LRUCacheWorkerLoRAManager.add_adapter reads it into the CPU cache
 * unless it is there, then activates it in a GPU slot), each cache evicting its least recently
 * used adapter when full. Returns the seconds that takes (the swap cost terms); with charge, the
 * engine core spends them before its next step (vLLM runs the utility call between steps), so
 * they are added to that step's lora_s; startup loads are not charged. Unload
 * (kvr_sim_engine_lora_remove) drops it from both caches. No-ops without LoRA. */
double kvr_sim_engine_lora_add(kvr_sim_engine_t *eng, uint32_t lora_id, uint32_t rank, bool charge);
void kvr_sim_engine_lora_remove(kvr_sim_engine_t *eng, uint32_t lora_id);
/* Whether lora_id is in a GPU slot / in the CPU cache (tests, --print-costs). */
bool kvr_sim_engine_lora_on_gpu(const kvr_sim_engine_t *eng, uint32_t lora_id);
bool kvr_sim_engine_lora_on_cpu(const kvr_sim_engine_t *eng, uint32_t lora_id);

/* The distinct adapters of the running (running true) or waiting requests, in the order of the
 * first such request: up to cap of them into reqs (one request of each, whose lora_name and
 * lora_id the caller reads). Returns how many there are. */
size_t kvr_sim_engine_loras(const kvr_sim_engine_t *eng, bool running, const kvr_sim_req_t **reqs,
                            size_t cap);

/* The parent hash of a chain's first block for requests salted with salt[0..len): nonzero, so it
 * never equals the unsalted chain's 0. */
uint64_t kvr_sim_salt_root(const char *salt, size_t len);

/* Aborts req if it is waiting or running (frees its blocks) and frees it. Accepts NULL. */
void kvr_sim_engine_remove(kvr_sim_engine_t *eng, kvr_sim_req_t *req);

/* True when some request is waiting or running (or an async extra step is due): a step would do
 * something. */
bool kvr_sim_engine_busy(const kvr_sim_engine_t *eng);

/* Sets the simulated time (seconds) at which the requests added next arrive; never moves back. */
void kvr_sim_engine_set_now(kvr_sim_engine_t *eng, double now_s);

/* Moves the engine's clock forward to t_s (a caller that fell behind real time): the next step
 * starts, and the API server is free, no earlier than t_s. */
void kvr_sim_engine_skip_to(kvr_sim_engine_t *eng, double t_s);

/* When the next step starts (simulated seconds): the end of the previous step while requests run,
 * else when the first waiting request is ready; HUGE_VAL when nothing waits or runs. */
double kvr_sim_engine_next_start(const kvr_sim_engine_t *eng);

/* Extra simulated seconds added to every step from now on (the sim's `slow` fault); 0 = none. */
void kvr_sim_engine_set_step_delay(kvr_sim_engine_t *eng, double seconds);

/* Runs one iteration, starting at kvr_sim_engine_next_start(). out describes it (events valid
 * until the next call). Returns 0. */
int kvr_sim_engine_step(kvr_sim_engine_t *eng, kvr_sim_step_t *out);

void kvr_sim_engine_stats(const kvr_sim_engine_t *eng, kvr_sim_stats_t *out);
const kvr_sim_config_t *kvr_sim_engine_config(const kvr_sim_engine_t *eng);

/* ---- KV-cache events (vLLM's --kv-events-config), off by default ----
 *
 * When on, the engine logs its block lifecycle in the order it happens, as vLLM's block pool
 * reports it (vllm/v1/core/block_pool.py): a run of blocks newly cached by one request in one call
 * is one STORED event (engine hashes in prefix order, the parent block's hash unless the run starts
 * the chain, the runs' token ids); a cached block evicted to make room is one REMOVED event per
 * block; a reset that leaves no block cached is one CLEARED event (a partial reset, which vLLM
 * refuses, is the REMOVED events of what it dropped). Preemption frees blocks but keeps their
 * hashes, so it logs nothing, as in vLLM. The caller (sim_server.c) takes the log after each step
 * and publishes it (kv_events.c), then clears it. */
typedef enum { KVR_SIM_KV_STORED, KVR_SIM_KV_REMOVED, KVR_SIM_KV_CLEARED } kvr_sim_kv_kind_t;

typedef struct kvr_sim_kv_event_s {
  kvr_sim_kv_kind_t kind;
  /* STORED: > 0 when hashes[0] is the first block of a chain salted with log->salts[salt_off ..
   * salt_off + salt_len) (vLLM then sends extra_keys [["<salt>"], nil, ...]) */
  uint32_t salt_off, salt_len;
  /* STORED: the adapter of the blocks, log->salts[lora_off .. lora_off + lora_len), lora_len 0
   * without one (vLLM: lora_id and lora_name set, each block's extra keys start with the name) */
  uint32_t lora_off, lora_len;
  uint32_t lora_id;
  bool has_parent;   /* STORED: false when the run starts at the chain's first block */
  uint64_t parent;   /* STORED: engine hash of the block before hashes[0] */
  uint32_t hash_off; /* hashes are log->hashes[hash_off .. hash_off + nhashes) */
  uint32_t nhashes;
  uint32_t tok_off; /* STORED: nhashes * block_size token ids from log->tokens[tok_off] */
} kvr_sim_kv_event_t;

typedef struct kvr_sim_kv_log_s {
  kvr_sim_kv_event_t *ev;
  size_t nev, ev_cap;
  uint64_t *hashes;
  size_t nhashes, hashes_cap;
  uint32_t *tokens;
  size_t ntokens, tokens_cap;
  char *salts; /* the salts STORED events refer to */
  size_t nsalts, salts_cap;
} kvr_sim_kv_log_t;

/* Turns the event log on or off (off drops what it holds). */
void kvr_sim_engine_kv_events(kvr_sim_engine_t *eng, bool on);
/* The events logged since the last clear; NULL when events are off. */
const kvr_sim_kv_log_t *kvr_sim_engine_kv_log(const kvr_sim_engine_t *eng);
void kvr_sim_engine_kv_log_clear(kvr_sim_engine_t *eng);

/* Resets the prefix cache, as vLLM's POST /reset_prefix_cache: every cached block no request holds
 * (a free block still carrying its hash) loses its hash, so a later identical prompt misses.
 * Blocks held by running requests keep theirs; vLLM's own block pool refuses the whole reset
 * while any block is in use (answering 409 or, in older versions, 200 without resetting); the sim
 * resets what it can, so a bench never sees a silent no-op. Free blocks keep their
 * place in the eviction order; cumulative counters (prefix queries and hits, preemptions) are
 * not touched. Writes into *kept (when not NULL) how many hashed blocks in use kept their hash.
 * Returns the number of hashes dropped. Call between steps (the sim server's loop always is). */
uint32_t kvr_sim_engine_reset_prefix_cache(kvr_sim_engine_t *eng, uint32_t *kept);

/* What an observer who could see inside the engine knows before sending it a prompt (the virtual
 * cluster's oracle): how many of the prompt's tokens the prefix cache holds now, and the work
 * queued ahead of it. */
typedef struct kvr_sim_probe_s {
  uint32_t cached_tokens;  /* leading prompt tokens in full cached blocks (never the last token) */
  uint64_t pending_tokens; /* prompt (and recomputed) tokens of waiting and running requests not
                            * computed yet; a waiting request's less the prefix the cache holds
                            * now, which its scheduling will hit */
  uint32_t running, waiting;
  uint64_t decode_ctx; /* context tokens of the running requests (what one decode step reads) */
} kvr_sim_probe_t;

/* Fills out for prompt[0..n) without changing anything (no LRU touch, no counter); unsalted. */
void kvr_sim_engine_probe(const kvr_sim_engine_t *eng, const uint32_t *prompt, uint32_t n,
                          kvr_sim_probe_t *out);

/* Test hooks: whether the block holding the given chained hash is cached, and the block id the next
 * allocation would take (the eviction candidate), or -1 when none is free. */
bool kvr_sim_engine_has_hash(const kvr_sim_engine_t *eng, uint64_t hash);
int32_t kvr_sim_engine_next_victim(const kvr_sim_engine_t *eng);

/* Chained hash of a full block: parent is the previous block's hash (or 0 for the first). */
uint64_t kvr_sim_block_hash(uint64_t parent, const uint32_t *tokens, uint32_t block_size);

#endif

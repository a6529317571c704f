/* policy.h -- the one interface every routing policy implements.
 *
 * A policy is a pure function of read-only state: it sees a snapshot of the workers (load figures
 * the router tracks itself, figures scraped from each worker's /metrics, and how many of this
 * request's prefix blocks the cache index believes each worker still holds) plus the request's
 * routing features, and returns the index of the worker to use or KVR_POLICY_NONE. It never touches
 * sockets, libuv or HTTP, so every policy is testable without a loop. A request naming a LoRA
 * adapter also gets, per worker, where that adapter stands there (kvr_adapter_state_t); which
 * workers may serve the request at all (those listing the model, or serving the base of an
 * adapter the router may load) is the router's choice, seen as usable.
 *
 * A policy object is an ops table (kvr_policy_ops_t, const, one per policy file) plus a derived
 * struct whose first member is `kvr_policy_t super` (h2o's balancer pattern). It may keep private
 * mutable state of its own (a round-robin cursor, a seeded RNG) but nothing shared.
 *
 * The registry (policy.c) is an explicit static table: no constructor self-registration, because
 * the linker drops unreferenced objects from static libraries.
 *
 * Retries: `tried` is the set of worker indexes already attempted for this request (a bitset sized
 * to the fleet, kvr_workerset_t; NULL when none); a policy must never return one of them (h2o's
 * select(..., tried)).
 *
 * Fleet size: at most KVR_MAX_WORKERS workers. Nothing in a policy is sized by it (a select is
 * O(nworkers) with no fixed array); the bound is the router's (its slots, the cache index's worker
 * field) and is enforced where workers come from: the static list, POST /admin/workers and
 * discovery (src/serve/README.md, "Limits").
 */
#ifndef KVR_POLICY_H
#define KVR_POLICY_H

#include "base/kvr.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define KVR_POLICY_NONE (-1)
/* The most workers one router serves (slots 0..KVR_MAX_WORKERS-1). */
#define KVR_MAX_WORKERS 4096
#define KVR_MAX_PEERS 8 /* other router replicas whose load one replica reads (--peer) */

typedef struct kvr_policy_s kvr_policy_t;
typedef struct kvr_policy_ops_s kvr_policy_ops_t;

/* A set of worker indexes as a bitset sized to the fleet: index i is in the set when bit i % 64 of
 * words[i / 64] is set; an index at or past 64 * nwords is not in it. Its owner sizes and frees
 * words (KVR_WORKERSET_WORDS(n) words hold indexes below n). Where a function takes a const
 * kvr_workerset_t *, NULL is the empty set. */
typedef struct kvr_workerset_s {
  uint64_t *words;
  size_t nwords;
} kvr_workerset_t;

#define KVR_WORKERSET_WORDS(n) (((size_t)(n) + 63) / 64)

/* Whether index i is in s (false for s NULL). */
static inline bool kvr_workerset_has(const kvr_workerset_t *s, size_t i) {
  return s != NULL && i / 64 < s->nwords && (s->words[i / 64] >> (i % 64) & 1);
}

/* Adds index i to s; i must be below 64 * s->nwords. */
static inline void kvr_workerset_add(kvr_workerset_t *s, size_t i) {
  s->words[i / 64] |= UINT64_C(1) << (i % 64);
}

/* Where a request's LoRA adapter stands on a worker (kvr_worker_snap_t.adapter): running (in the
 * batch now: vllm:lora_requests_info's running_lora_adapters, fresh), loaded (the worker's
 * GET /v1/models lists it, or the router is loading it there) or none (not an adapter request, a
 * base model name, or a worker that would have to load it first). */
typedef enum {
  KVR_ADAPTER_NONE = 0,
  KVR_ADAPTER_LOADED = 1,
  KVR_ADAPTER_RUNNING = 2
} kvr_adapter_state_t;

/* What the router knows about one worker at decision time. */
typedef struct kvr_worker_snap_s {
  uint32_t id;            /* stable worker id (admin API), not the index */
  bool usable;            /* up and not draining; a policy never picks an unusable worker */
  uint32_t inflight;      /* requests the router has outstanding on this worker (exact) */
  uint64_t active_tokens; /* router estimate: prompt + generated tokens of in-flight requests */
  uint64_t queued_prefill_tokens; /* router estimate: uncached prompt tokens not yet answered */
  /* Router estimate: of queued_prefill_tokens, those the worker has probably not prefilled yet,
   * from its measured prefill rate and the time since dispatch (prefill_clock.h); equal to
   * queued_prefill_tokens until the rate is measured. */
  uint64_t prefill_backlog_tokens;
  /* Router count: Responses sessions whose latest answer this worker stored and whose next turn
   * (previous_response_id naming it) has not come yet, within a window of twice the usual wait
   * for it (router_affinity.c): turns the router will pin here, whatever the policy says. */
  uint32_t open_sessions;
  /* Scraped from the worker's /metrics; valid only when metrics_fresh. */
  bool metrics_fresh;
  double num_requests_running;
  double num_requests_waiting;
  double kv_cache_usage;          /* 0..1 */
  uint64_t cache_capacity_blocks; /* router's model of the worker's KV capacity, in router blocks */
  uint64_t
      cached_blocks; /* blocks the cache index holds for this worker (kvr_cache_index_entries) */
  /* Filled per request from the cache index: how many of the request's leading blocks this worker
   * probably holds (longest matching prefix, in blocks). For a worker in precise mode it comes
   * from the engine's own KV events: the matched tokens, expressed in these blocks. */
  size_t matched_blocks;
  bool precise; /* matched_blocks came from the engine's events */
  /* kvr_adapter_state_t of the request's model on this worker (NONE for a base model request). */
  uint8_t adapter;
  /* The last tie-break (kvr_policy_pick_lowest): a rendezvous rank of this worker for this
   * request, from the worker's URL and the prompt's last block, the same on every router
   * replica; 0 when the request has no prompt block (then ties are drawn at random). */
  uint64_t rank;
} kvr_worker_snap_t;

/* Characters of prompt text per token: the router's one estimate wherever it has text but no token
 * ids (prompt tokens, tokens in matched blocks, cache capacity in blocks). Llama-family BPE
 * tokenizers average about 4 bytes of English text per token. */
#define KVR_CHARS_PER_TOKEN 4

/* Routing features of one request (see prompt.h for how they are derived). */
typedef struct kvr_route_req_s {
  const uint64_t *blocks; /* chained prefix-block hashes, leading block first; may be NULL */
  size_t nblocks;
  size_t block_chars;     /* characters per block (tokens ~= chars / KVR_CHARS_PER_TOKEN) */
  uint64_t prompt_tokens; /* estimated prompt tokens (exact when the ids are known) */
  uint64_t max_tokens;    /* requested output bound, 0 if unknown */
  /* Precise mode (kv_index.h): own hashes of the prompt's full token blocks of kv_block_size
   * tokens, from the engine's own tokenization; NULL when not tokenized. The router matches them
   * on workers whose event stream is healthy and reports the match in matched_blocks' units. */
  const uint64_t *kv_chain;
  size_t kv_nchain;
  uint32_t kv_block_size;
} kvr_route_req_t;

/* Per-worker line of a decision's explanation (POST /admin/route/explain). */
typedef struct kvr_policy_score_s {
  double cost;   /* policy's score for this worker (lower is better unless the policy says so) */
  bool eligible; /* usable and not tried */
  /* Eligible but excluded: by a load bound (kv_aware's bounded load) or a filter (llmd_precise's
   * prefix-affinity gate). */
  bool capped;
} kvr_policy_score_t;

struct kvr_policy_ops_s {
  const char *name;        /* registry key, e.g. "kv_aware" */
  const char *description; /* one line for --help and GET /admin/policy */
  /* Creates an instance from params (a JSON object or NULL for defaults). On a bad parameter
   * returns NULL and writes "params.<field>: <reason>" into err. seed makes any randomness
   * reproducible. */
  kvr_policy_t *(*create)(const cJSON *params, uint64_t seed, char *err, size_t errlen);
  /* Picks a worker index in [0, nworkers) that is usable and not in tried (NULL: none tried), or
   * KVR_POLICY_NONE. scores, if not NULL, has nworkers entries and receives each worker's score.
   */
  int (*select)(kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t nworkers,
                const kvr_route_req_t *req, const kvr_workerset_t *tried,
                kvr_policy_score_t *scores);
  /* Adds the instance's effective parameters to obj (for GET /admin/policy). */
  void (*params)(const kvr_policy_t *p, cJSON *obj);
  void (*destroy)(kvr_policy_t *p);
  size_t size; /* bytes of an instance, which is flat (no owned pointers): kvr_policy_peek copies */
};

struct kvr_policy_s {
  const kvr_policy_ops_t *ops;
};

/* The static registry, in display order; NULL-terminated. */
extern const kvr_policy_ops_t *const kvr_policy_registry[];

/* Looks a policy up by name; NULL if unknown. */
const kvr_policy_ops_t *kvr_policy_find(const char *name);

/* Writes "round_robin, least_load, ..." into buf. */
void kvr_policy_names(char *buf, size_t len);
/* Prints "\npolicies: round_robin, least_load, ...\n" to out (the --help epilog of the commands
 * that take a policy name). */
void kvr_policy_print_names(FILE *out);

/* Creates a policy by name: returns NULL and a one-line err naming the valid choices or the bad
 * field. */
kvr_policy_t *kvr_policy_create(const char *name, const cJSON *params, uint64_t seed, char *err,
                                size_t errlen);

/* Convenience wrappers over the ops table. destroy accepts NULL. */
int kvr_policy_select(kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t nworkers,
                      const kvr_route_req_t *req, const kvr_workerset_t *tried,
                      kvr_policy_score_t *scores);
/* The pick and scores select would give now, without changing p: round robin's cursor and the
 * tie-breaking RNG stay where they are (select runs on a copy). For a look such as
 * /admin/route/explain. */
int kvr_policy_peek(const kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t nworkers,
                    const kvr_route_req_t *req, const kvr_workerset_t *tried,
                    kvr_policy_score_t *scores);
void kvr_policy_destroy(kvr_policy_t *p);
const char *kvr_policy_name(const kvr_policy_t *p);

/* Helpers shared by policies. */
static inline bool kvr_policy_eligible(const kvr_worker_snap_t *w, size_t i,
                                       const kvr_workerset_t *tried) {
  return w->usable && !kvr_workerset_has(tried, i);
}

/* The policies' seeded RNG (base/kvr.h's splitmix64; state advances on each call). */
static inline uint64_t kvr_policy_rand(uint64_t *state) {
  return kvr_splitmix64(state);
}

/* One numeric parameter of a policy (policy.c validates a params object against a table of them).
 */
typedef struct kvr_policy_param_s {
  const char *name;
  double *value;   /* holds the default on entry, the parsed value on success */
  double min, max; /* inclusive bounds */
  bool integer;
} kvr_policy_param_t;

/* Validates params (NULL or a JSON object) against spec: every field must be listed, a number,
 * within bounds, and integral when required. Returns 0, or KVR_EINVAL with err set to
 * "params.<field>: <reason>" (an unknown field lists the valid ones). */
int kvr_policy_parse_params(const cJSON *params, const kvr_policy_param_t *spec, size_t n,
                            char *err, size_t errlen);
/* Adds every parameter of spec with its current value to obj. */
void kvr_policy_params_to_json(const kvr_policy_param_t *spec, size_t n, cJSON *obj);

/* --- cross-file internals: what every policy's create, select, params and destroy do alike --- */

/* One numeric parameter of a policy, described once: the double it lands in (an offset into the
 * policy's derived struct), its default and its bounds. */
typedef struct kvr__policy_field_s {
  const char *name; /* NULL ends a list of fields */
  size_t offset;    /* offsetof(derived struct, the double member) */
  double def;       /* the value when params do not name it */
  double min, max;
  bool integer;
} kvr__policy_field_t;

#define KVR__POLICY_MAX_FIELDS 16

/* What kvr__policy_new needs to make an instance of one policy. rng_offset is where the derived
 * struct keeps its uint64_t RNG, seeded at create; 0 when it has none (offset 0 is super). */
typedef struct kvr__policy_class_s {
  size_t size; /* sizeof the derived struct (kvr_policy_t super first) */
  size_t rng_offset;
  const kvr__policy_field_t *fields; /* at most KVR__POLICY_MAX_FIELDS, then one with name NULL */
} kvr__policy_class_t;

/* A policy's own part of select: workers and s have n entries, s is never NULL
 * and s[i].eligible (usable, not tried) and s[i].capped (false) are already set. Fills s[i].cost
 * (and may cap) and returns the pick or KVR_POLICY_NONE. */
typedef int (*kvr__policy_pick_fn)(kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t n,
                                   const kvr_route_req_t *req, kvr_policy_score_t *s);

/* Allocates a zeroed instance of cls with super.ops = ops, seeds its RNG, sets every field to its
 * default and then to params (validated as kvr_policy_parse_params does). Returns the instance, or
 * NULL with err set on a bad parameter. */
kvr_policy_t *kvr__policy_new(const kvr_policy_ops_t *ops, const kvr__policy_class_t *cls,
                              const cJSON *params, uint64_t seed, char *err, size_t errlen);
/* The ops select of every policy: gives pick a scores array (a local one when scores is NULL: on
 * the stack up to 64 workers, else allocated) with eligibility filled in, and returns what pick
 * returns. */
int kvr__policy_select(kvr__policy_pick_fn pick, kvr_policy_t *p, const kvr_worker_snap_t *workers,
                       size_t nworkers, const kvr_route_req_t *req, const kvr_workerset_t *tried,
                       kvr_policy_score_t *scores);
/* Adds every field of cls with its current value in p to obj (the ops params). */
void kvr__policy_echo(const kvr__policy_class_t *cls, const kvr_policy_t *p, cJSON *obj);
/* Frees an instance made by kvr__policy_new (the ops destroy). */
void kvr__policy_free(kvr_policy_t *p);

/* A policy lists its parameters once, as an X-macro of X(name, default, min, max, integer)
 * entries: KVR__POLICY_MEMBER makes each a double member of the derived struct, and
 * KVR__POLICY_DEFINE makes each a kvr__policy_field_t (the JSON key is the member's name). A
 * policy without parameters passes KVR__POLICY_NO_PARAMS. */
#define KVR__POLICY_MEMBER(name_, def_, min_, max_, integer_) double name_;
#define KVR__POLICY_FIELD(name_, def_, min_, max_, integer_)                                       \
  {#name_, offsetof(kvr__policy_self_t, name_), def_, min_, max_, integer_},
#define KVR__POLICY_NO_PARAMS(X)

/* Defines the ops table kvr__policy_<name_> of a policy whose instances are type_ structs with
 * the RNG at rng_offset_ (0 for none) and the parameters params_ (an X-macro as above): create,
 * select, params and destroy are the shared ones above around the policy's own pick_. */
#define KVR__POLICY_DEFINE(name_, description_, type_, rng_offset_, params_, pick_)                \
  extern const kvr_policy_ops_t kvr__policy_##name_;                                               \
  static const kvr__policy_class_t *name_##_class(void) {                                          \
    typedef type_ kvr__policy_self_t;                                                              \
    static const kvr__policy_field_t fields[] = {params_(KVR__POLICY_FIELD){NULL, 0, 0, 0, 0, 0}}; \
    static const kvr__policy_class_t cls = {sizeof(kvr__policy_self_t), rng_offset_, fields};      \
    return &cls;                                                                                   \
  }                                                                                                \
  static kvr_policy_t *name_##_create(const cJSON *params, uint64_t seed, char *err,               \
                                      size_t errlen) {                                             \
    return kvr__policy_new(&kvr__policy_##name_, name_##_class(), params, seed, err, errlen);      \
  }                                                                                                \
  static int name_##_select(kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t nworkers,    \
                            const kvr_route_req_t *req, const kvr_workerset_t *tried,              \
                            kvr_policy_score_t *scores) {                                          \
    return kvr__policy_select(pick_, p, workers, nworkers, req, tried, scores);                    \
  }                                                                                                \
  static void name_##_params(const kvr_policy_t *p, cJSON *obj) {                                  \
    kvr__policy_echo(name_##_class(), p, obj);                                                     \
  }                                                                                                \
  const kvr_policy_ops_t kvr__policy_##name_ = {                                                   \
      .name = #name_,                                                                              \
      .description = description_,                                                                 \
      .create = name_##_create,                                                                    \
      .select = name_##_select,                                                                    \
      .params = name_##_params,                                                                    \
      .destroy = kvr__policy_free,                                                                 \
      .size = sizeof(type_),                                                                       \
  }

/* How kvr_policy_pick_lowest() orders workers whose costs tie, before the rendezvous rank (or,
 * without one, the random draw). */
typedef enum {
  KVR_POLICY_TIES_RANDOM = 0, /* uniformly at random */
  KVR_POLICY_TIES_LOAD,       /* the lower inflight, then the lower active_tokens */
  KVR_POLICY_TIES_SMALL_CACHE /* the fewer cached_blocks (Dynamo's smaller radix tree) */
} kvr_policy_ties_t;

/* Among scores[i].eligible && !scores[i].capped picks the lowest cost; ties (within 1e-9
 * relative) are ordered by ties, then by the higher rendezvous rank (workers[i].rank, set by the
 * router from the worker's URL and the prompt's last block, so every replica breaks a tie the
 * same way); ties left (no rank: no prompt block) are broken uniformly at random with rng. Returns
 * KVR_POLICY_NONE when nothing qualifies. */
int kvr_policy_pick_lowest(const kvr_worker_snap_t *workers, size_t nworkers,
                           const kvr_policy_score_t *scores, kvr_policy_ties_t ties, uint64_t *rng);

#endif

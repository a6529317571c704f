/* vcluster.h -- a whole cluster in virtual time: N simulated vLLM engines behind the real router
 * core, on one discrete-event clock, driven by the real load generator (`kvrouter bench
 * --virtual`).
 *
 * What runs is the code of a real deployment, not a model of it:
 *   - the load generator (bench/loadgen/loadgen.c) with its virtual transport (loadgen.h): the same
 *     workload, arrivals, sessions, steady state, early stop and records as an HTTP run;
 *   - the router core (src/core/router.h) and policies: for each request kvr_openai_features() on
 *     the body, kvr_router_decide(), kvr_router_on_dispatch(), kvr_router_on_learn() of the prompt
 *     when the worker answers, kvr_router_on_token() per streamed token, kvr_router_on_usage() and
 *     the learning of the answer at the end, kvr_router_on_end(), and kvr_router_on_scrape() from
 *     each worker's figures every scrape interval -- the calls proxy.c and scrape.c make, in the
 *     order they make them, on the router's clock set to the virtual one (kvr_router_set_clock);
 *   - each worker is the engine `kvrouter sim` runs (bench/sim/sim_engine.h) behind the request
 *     handling sim_server.c does: kvr_sim_server_parse_completion() on the body,
 *     kvr_sim_server_answer() for the answer, and the same step loop (deliver the previous step's
 *     tokens at its deliver_s, reap cancelled requests, compute the next step); for the Responses
 *     API (opts.responses) sim_server.c's responses_prepare (kvr_sim_responses_read, the store
 *     lookup and its 404, kvr_sim_responses_messages, the chat rendering) and its store.
 * What a real deployment adds is explicit: the one-way network delay of each hop (client-router,
 * router-worker), the router's own time per request, and the scrape interval and staleness (the
 * router configuration's). Tokens of one engine step reach the router one hop after the worker
 * emits them, and the client one hop later.
 *
 * Structs: kvr_vcluster_t owns the event heap, the engines, the router and its configuration;
 * vreq_t (vcluster.c) is one request from send to its last event.
 *
 * Determinism: events at the same instant run in the order they were scheduled, every random
 * choice is seeded, and nothing reads a real clock, so a run is a pure function of its options.
 */
#ifndef KVR_VCLUSTER_H
#define KVR_VCLUSTER_H

#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/stats.h"
#include "bench/sim/sim_engine.h"
#include "core/router.h"
#include "policies/policy.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The name under which the virtual cluster routes with the engines' true state (see
 * kvr_vcluster_set_policy); not a router policy: only virtual time can see inside the engines. */
#define KVR_VCLUSTER_ORACLE "oracle"

typedef struct kvr_vcluster_opts_s {
  size_t workers;                          /* 1..KVR_MAX_WORKERS */
  kvr_sim_config_t engine;                 /* every worker's engine (kvrouter sim's flags) */
  unsigned worker_blocks[KVR_MAX_WORKERS]; /* per worker KV blocks (a mixed fleet), or none: */
  size_t nworker_blocks;                   /* 0 (every worker engine.num_gpu_blocks) or workers */
  uint32_t output_len_mean;                /* the sims' natural answer length (EOS on) */
  const char *model;                       /* the served model name */
  bool chat;                               /* the API: chat or completions */
  /* The Responses API (POST /v1/responses, its prompts rendered as chat): each worker keeps the
   * responses it made in a store of its own, bounded as the sim's (KVR_SIM_RSTORE_MAX), as
   * `kvrouter sim` does with VLLM_ENABLE_RESPONSES_API_STORE=1; a follow-up naming a
   * previous_response_id its worker does not hold is vLLM's 404. The router learns each answer's
   * id with its worker and sends a follow-up there before any policy decides, as proxy.c does
   * for every policy and the oracle (kvr_router_on_response_id / _lookup). */
  bool responses;
  /* Responses: a router without that pinning (it neither learns nor looks up ids): a follow-up
   * goes where the policy sends it, as behind a router that does not read previous_response_id.
   * What `kvrouter serve` does not do; the case that shows what the pinning is worth. */
  bool no_response_affinity;
  /* Delays of a real deployment, simulated ms. */
  double net_ms;    /* one hop, one way: client-router and router-worker */
  double router_ms; /* the router's own work per request, before it forwards */
  /* The router: block_chars, scrape interval and staleness, cache capacity, policy seed. */
  size_t block_chars;
  uint64_t scrape_interval_ms; /* 0: never scraped */
  uint64_t scrape_stale_ms;
  uint64_t seed;
  /* Precise mode (README "Precise mode"): every engine publishes its KV events, which reach the
   * router net_ms after the step that made them, encoded and decoded on vLLM's wire format
   * (bench/sim/kv_events.h, src/proto/kv_decode.h); requests are tokenized at the router (what the
   * worker's POST /tokenize answers) and take tokenize_ms more before they are forwarded. */
  bool kv_events;
  double tokenize_ms;
  /* > 0: every this many simulated seconds one worker (in turn) has its prefix cache emptied
   * behind the router's back (kvr_vcluster_flush_worker): the case built to break the guess. */
  double flush_every_s;
  /* The oracle weighs a worker's predicted TTFT and decode step against these (the run's SLO). */
  double slo_ttft_s, slo_tpot_s;
  /* Workers serving given models (bench/vcluster/model_fleet.h's spec, NULL: every worker serves
   * `model`): the fleet's size replaces `workers`; each worker's GET /v1/models (base, adapters)
   * reaches the router through kvr_router_on_models as scrape.c's probe gives it, its LoRA state
   * through each scrape's vllm:lora_requests_info; a request naming a model the worker does not
   * serve is vLLM's 404 there (counted: kvr_vcluster_mstats_t). */
  const char *model_fleet;
  /* A model fleet's workers listing adapters run with vLLM's --enable-lora --max-loras L (0: 1,
   * vLLM's default; --max-cpu-loras L), their adapters of rank KVR_MFLEET_LORA_RANK loaded at
   * start; a step that needs an adapter not in a GPU slot pays h1's swap cost. */
  uint32_t max_loras;
} kvr_vcluster_opts_t;

/* What a model fleet's requests met, from the cluster's start or kvr_vcluster_level_begin. */
typedef struct kvr_vcluster_mstats_s {
  uint64_t requests;         /* requests that reached a worker */
  uint64_t not_served;       /* of which named a model the worker does not serve: vLLM's 404 */
  uint64_t adapter_requests; /* requests naming a LoRA adapter the router dispatched */
  uint64_t adapter_state[3]; /* by the adapter's state on the chosen worker as the decision saw it
                              * (kvr_adapter_state_t: none, loaded, running) */
} kvr_vcluster_mstats_t;

/* Defaults: 4 workers of the sim's default engine, chat, net 0.1 ms, router 0.05 ms, the router
 * defaults of `kvrouter serve` (64-character blocks, scrape every 1 s, stale after 5 s, seed 1),
 * and the bench's SLO (TTFT 1 s, TPOT 60 ms). */
void kvr_vcluster_opts_default(kvr_vcluster_opts_t *opts);

typedef struct kvr_vcluster_s kvr_vcluster_t;

/* Creates the cluster (opts copied, strings too) with policy "kv_aware" (serve's default). Returns
 * NULL with a one-line reason in err. */
kvr_vcluster_t *kvr_vcluster_new(const kvr_vcluster_opts_t *opts, char *err, size_t errlen);
void kvr_vcluster_free(kvr_vcluster_t *vc); /* accepts NULL; in-flight requests are dropped */

/* The load generator's transport on this cluster (loadgen.h): its clock, sends and loop. */
void kvr_vcluster_transport(kvr_vcluster_t *vc, kvr_loadgen_vt_t *out);

/* Routes new requests with policy name (params may be NULL), as PUT /admin/policy does, or with
 * the oracle (KVR_VCLUSTER_ORACLE). Returns 0 or KVR_EINVAL with err. */
int kvr_vcluster_set_policy(kvr_vcluster_t *vc, const char *name, const cJSON *params, char *err,
                            size_t errlen);

/* The cluster's router (read-only: its workers, indexes and counters); kvr_vcluster_restart
 * replaces it, so the pointer is good until the next restart. */
const kvr_router_t *kvr_vcluster_router(const kvr_vcluster_t *vc);

/* Empties worker wi's prefix cache behind the router's back (an operator's reset on the engine, a
 * restart): the approximate index does not learn it; in precise mode the engine's events say so.
 * The case that breaks the router's guess. */
void kvr_vcluster_flush_worker(kvr_vcluster_t *vc, size_t wi);

/* Empties every engine's prefix cache and the router's cache index, as POST
 * /admin/reset_prefix_cache does; writes "N/N workers reset" into summary. */
void kvr_vcluster_reset_cache(kvr_vcluster_t *vc, char *summary, size_t size);

/* Starts the cluster afresh, as a run's first level finds it: lets the requests still in flight
 * finish, then replaces the engines and the router (index, load accounting, learned prefill rates,
 * scrapes) by new ones made from the same options, with the policy and parameters last set. The
 * clock and the load generator's timers go on. The runner calls it before every level of a
 * virtual run, so that a level's verdict depends on its policy, load and seed only, not on the
 * levels run before it (the search's path) or the policies run before it (the A/B's order).
 * Returns 0, or KVR_EINVAL with err. */
int kvr_vcluster_restart(kvr_vcluster_t *vc, char *err, size_t errlen);

/* Sets the fleet of the next kvr_vcluster_restart to workers engines (the fleet-sizing search,
 * `kvrouter bench --virtual --size-fleet`): the restart makes that many engines, all of the
 * options' engine, and a router with that many workers; the cluster runs on as it is until then.
 * Returns 0, or KVR_EINVAL with err (out of 1..KVR_MAX_WORKERS, or a mixed fleet, whose
 * --worker-blocks fix its size, or a model fleet, whose groups do). */
int kvr_vcluster_set_workers(kvr_vcluster_t *vc, size_t workers, char *err, size_t errlen);

/* Lets seconds of virtual time pass (the runner's cooldown): whatever is still in flight runs on.
 */
void kvr_vcluster_idle(kvr_vcluster_t *vc, double seconds);

/* Around a level, as the bench's monitor reads /metrics: level_begin notes the engines'
 * preemption counters and starts tracking the KV cache usage peak; level_end writes
 * lv->engine_workers, lv->preemptions and lv->kv_usage_peak. */
void kvr_vcluster_level_begin(kvr_vcluster_t *vc);
void kvr_vcluster_level_end(kvr_vcluster_t *vc, kvr_level_t *lv);

/* The name of the policy routing now. */
const char *kvr_vcluster_policy(const kvr_vcluster_t *vc);

/* The current virtual time, seconds, and how many events have run (for the report). */
double kvr_vcluster_now(const kvr_vcluster_t *vc);
uint64_t kvr_vcluster_events(const kvr_vcluster_t *vc);

/* The model fleet's counters since the last kvr_vcluster_level_begin (zeros without a fleet). */
void kvr_vcluster_mstats(const kvr_vcluster_t *vc, kvr_vcluster_mstats_t *out);

/* One line describing the cluster (workers, KV sizes, delays, scrape, seed) for the report. */
void kvr_vcluster_describe(const kvr_vcluster_t *vc, kvr_buf_t *out);

#endif

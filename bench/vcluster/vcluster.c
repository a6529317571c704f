/* vcluster.c -- the virtual-time cluster: an event heap, the engines' step loops, the router calls.
 *
 * Structs: ev_t, one scheduled event (a binary min-heap ordered by time, then by the order they
 * were scheduled); vreq_t, one request from the client's send to its last event, reference
 * counted (the client until its done or cancel, every event naming it, the engine while it holds
 * it); batch_t, the tokens one engine step delivered, travelling to the router and then the
 * client; worker_t, one engine with its step loop state.
 *
 * Flow of a request (each arrow one event, each hop net_s later; see vcluster.h):
 *
 *   send -> ROUTER_IN: kvr_router_on_request, kvr_openai_features (400 on a bad body), decide
 *           (503 when no worker) or the oracle's pick, kvr_router_on_dispatch
 *        -> WORKER_IN (router_s + net_s): kvr_sim_server_parse_completion, kvr_sim_server_answer,
 *           kvr_sim_engine_add, kick the worker's step loop; the SSE head goes back
 *        -> ROUTER_HEAD: kvr_router_on_health, learn the prompt -> CLIENT_HEAD: kvr_loadgen_vt_head
 *   STEP (the worker's loop, as sim_server.c's on_step): deliver the previous step's tokens into
 *        a batch -> reap requests whose client went away -> kvr_sim_engine_step -> next STEP at
 *        the new step's deliver_s
 *        -> ROUTER_TOKENS: kvr_router_on_token per token; on a request's last: usage, learn
 *           prompt + answer, kvr_router_on_end
 *        -> CLIENT_TOKENS: kvr_loadgen_vt_token per token; on the last: usage, kvr_loadgen_vt_done
 *   cancel -> ROUTER_ABORT: kvr_router_on_client_abort, kvr_router_on_end -> WORKER_ABORT: the
 *           request is marked gone and reaped at the worker's next STEP.
 *   SCRAPE every scrape interval: each engine's running, waiting, KV usage and geometry ->
 *          kvr_router_on_scrape (what scrape.c parses from the sim's /metrics).
 *
 * The Responses API (opts.responses), as proxy.c and sim_server.c serve it:
 *   ROUTER_IN   kvr_openai_features on the route; a follow-up naming previous_response_id is
 *               pinned to the worker kvr_router_on_response_lookup names (proxy.c pin_response):
 *               no decide, no oracle, dispatched with 0 matched blocks (attempt()); an id it does
 *               not know goes where the policy (or the oracle) sends it
 *   WORKER_IN   responses_prepare (sim_server.c's): read the body, the model, the previous
 *               response from this worker's store (vLLM's 404 when it is not there), instructions
 *               + the stored prompt's messages + its output + the new input rendered as chat; a
 *               response object with its id ("resp_" + 16 hex, unique in the run)
 *   ROUTER_HEAD the response.created event comes with the head: kvr_router_on_response_id
 *   CLIENT_HEAD the client reads the id (kvr_loadgen_vt_response_id) for its next turn
 *   STEP        the last token: the response is finished and stored in the worker's store
 *               (responses_store: the object and its prompt's messages, the next turn's history)
 *   With opts.no_response_affinity the router neither learns nor looks up ids.
 *
 * A model fleet (opts.model_fleet, model_fleet.h): at build() each worker's GET /v1/models answer
 * (kvr_mfleet_models_json) is parsed as scrape.c parses it and given to kvr_router_on_models, so
 * the router's eligibility is what it would be in front of those vLLM servers; WORKER_IN checks
 * the request's model as vLLM does (kvr_sim_server_parse_completion_in with the worker's names
 * and adapters: another name is its 404, counted in mstats.not_served); ROUTER_IN counts each
 * adapter request by the adapter's state on the chosen worker as the decision saw it.
 */
#include "vcluster.h"
#include "model_fleet.h"

#include "base/kvr.h"
#include "bench/sim/kv_events.h"
#include "bench/sim/sim_responses.h"
#include "bench/sim/sim_server.h"
#include "bench/sim/sim_tokens.h"
#include "core/config.h"
#include "core/router.h"
#include "proto/kv_decode.h"
#include "proto/openai.h"
#include "proto/prompt.h"
#include "serve/tokenize.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
  EV_TIMER = 0,
  EV_ROUTER_IN,
  EV_WORKER_IN,
  EV_ROUTER_HEAD,
  EV_CLIENT_HEAD,
  EV_CLIENT_ERROR,
  EV_STEP,
  EV_ROUTER_TOKENS,
  EV_CLIENT_TOKENS,
  EV_ROUTER_ABORT,
  EV_WORKER_ABORT,
  EV_SCRAPE,
  EV_KV_BATCH,
  EV_FLUSH,
} ev_kind_t;

/* One engine step's KV events on their way to the router, as the wire carries them. */
typedef struct kv_msg_s {
  size_t w;
  size_t len;
  char data[];
} kv_msg_t;

typedef struct ev_s {
  uint64_t t, seq;
  ev_kind_t kind;
  void *p;      /* vreq_t, batch_t or the timer's arg */
  size_t w;     /* worker (STEP) */
  uint64_t tag; /* timer tag; CLIENT_ERROR: the status */
  void (*fn)(void *arg, uint64_t tag);
} ev_t;

typedef struct vreq_s {
  kvr_loadgen_req_t *lgr; /* the client's request; NULL once done or cancelled */
  int refs;
  kvr_list_t node; /* in vc->live until the last reference goes */
  char *body;
  size_t len;
  /* The router's side, as proxy.c keeps it. */
  kvr_prompt_t prompt;
  bool has_prompt;
  kvr_router_dispatch_t acct;
  kvr_buf_t answer; /* streamed text, learnt with the prompt at the end */
  int slot;         /* the worker, -1 before dispatch */
  /* The worker's side, as sim_server.c's stream_t. */
  kvr_sim_req_t *ereq;
  bool gone; /* the client went away: reaped at the worker's next step */
  uint64_t gen_seed;
  uint32_t max_output, sent, prompt_tokens, cached;
  /* Responses: the worker's response (owned until it goes to the store) and its id. */
  kvr_sim_resp_t *resp;
  bool length_stop;
  char resp_id[24];
} vreq_t;

typedef struct out_s {
  vreq_t *q;
  char word[KVR_SIM_TOKEN_BYTES];
  bool final;
  bool client_done; /* the client's reference goes with the batch's */
} out_t;

typedef struct batch_s {
  size_t n;
  out_t items[];
} batch_t;

typedef struct worker_s {
  kvr_sim_engine_t *eng;
  uint32_t blocks; /* its KV cache */
  bool active;     /* a STEP event is pending */
  bool have_step;
  kvr_sim_step_t step;
  uint64_t due;
  vreq_t **gone; /* to reap at the next step */
  size_t ngone, capgone;
  uint64_t preempt_base;
  kvr_sim_rstore_t *store; /* Responses: the responses this worker made (opts.responses) */
} worker_t;

struct kvr_vcluster_s {
  kvr_vcluster_opts_t o;
  kvr_kv_batch_t kv_batch; /* precise mode: decode scratch */
  uint64_t flushes;        /* EV_FLUSH events so far (the next worker to flush) */
  char *model;
  kvr_config_t cfg;
  kvr_router_t *router;
  kvr_policy_t
      *oracle; /* kv_aware deciding on the engines' true state, or NULL (see oracle_pick) */
  worker_t w[KVR_MAX_WORKERS];
  ev_t *heap;
  size_t nheap, capheap;
  uint64_t now, seq, events;
  bool stopped;
  kvr_list_t live; /* every vreq_t not freed yet */
  char *policy;    /* the last kvr_vcluster_set_policy's name and parameters (NULL: none), */
  cJSON *params;   /* set again on the new router of kvr_vcluster_restart */
  size_t resize;   /* kvr_vcluster_set_workers: the fleet of the next restart (0: unchanged) */
  double kv_peak;
  uint64_t pred_base, rep_base; /* the router's cached-token counters at the level's start */
  uint64_t resp_ids;            /* Responses: ids made so far (never reset: unique in the run) */
  kvr_mfleet_t fleet;           /* opts.model_fleet parsed (fleet.n 0: none) */
  char *fleet_spec;             /* owned copy of opts.model_fleet */
  kvr_vcluster_mstats_t mstats;
};

void kvr_vcluster_opts_default(kvr_vcluster_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->workers = 4;
  /* The workers and the router start from the defaults of `kvrouter sim` and `kvrouter serve`. */
  kvr_sim_server_opts_t sim;
  kvr_sim_server_opts_default(&sim);
  o->engine = sim.engine;
  o->output_len_mean = sim.output_len_mean;
  o->model = sim.model;
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  o->block_chars = cfg.block_chars;
  o->scrape_interval_ms = cfg.scrape_interval_ms;
  o->scrape_stale_ms = cfg.scrape_stale_ms;
  o->seed = cfg.seed;
  kvr_config_free(&cfg);
  o->chat = true;
  o->net_ms = 0.1;
  o->router_ms = 0.05;
  o->tokenize_ms = 1.0; /* a loopback POST /tokenize of a few thousand tokens */
  o->slo_ttft_s = 1.0;
  o->slo_tpot_s = 0.060;
}

/* ---- the event heap -------------------------------------------------------------------------- */

static bool ev_before(const ev_t *a, const ev_t *b) {
  return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

/* Into the heap as it is (its time and sequence number already set). */
static void heap_insert(kvr_vcluster_t *vc, ev_t ev) {
  if (vc->nheap == vc->capheap) {
    vc->capheap = vc->capheap ? vc->capheap * 2 : 1024;
    vc->heap = kvr_xrealloc(vc->heap, vc->capheap * sizeof(ev_t));
  }
  size_t i = vc->nheap++;
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!ev_before(&ev, &vc->heap[parent]))
      break;
    vc->heap[i] = vc->heap[parent];
    i = parent;
  }
  vc->heap[i] = ev;
}

static void push(kvr_vcluster_t *vc, ev_t ev) {
  ev.t = KVR_MAX(ev.t, vc->now);
  ev.seq = vc->seq++;
  heap_insert(vc, ev);
}

static ev_t pop(kvr_vcluster_t *vc) {
  ev_t top = vc->heap[0], last = vc->heap[--vc->nheap];
  size_t i = 0, n = vc->nheap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n)
      break;
    if (c + 1 < n && ev_before(&vc->heap[c + 1], &vc->heap[c]))
      c++;
    if (!ev_before(&vc->heap[c], &last))
      break;
    vc->heap[i] = vc->heap[c];
    i = c;
  }
  if (n > 0)
    vc->heap[i] = last;
  return top;
}

#define NET(vc) ((vc)->o.net_ms * 1e-3)
#define ROUTER(vc) ((vc)->o.router_ms * 1e-3)

static uint64_t ns_of(double s) {
  return s <= 0 ? 0 : (uint64_t)llround(s * 1e9);
}

static double secs(uint64_t ns) {
  return (double)ns / 1e9;
}

static void push_q(kvr_vcluster_t *vc, ev_kind_t kind, uint64_t t, vreq_t *q, uint64_t tag) {
  q->refs++;
  push(vc, (ev_t){.t = t, .kind = kind, .p = q, .tag = tag});
}

/* ---- requests -------------------------------------------------------------------------------- */

static void vreq_free(vreq_t *q) {
  kvr_list_remove(&q->node);
  kvr_sim_resp_free(q->resp);
  kvr_prompt_free(&q->prompt);
  kvr_buf_free(&q->answer);
  free(q->body);
  free(q);
}

/* Gives up n references at once (a caller done with several must not touch q between them). */
static void release(vreq_t *q, int n) {
  q->refs -= n;
  if (q->refs == 0)
    vreq_free(q);
}

static void drop(vreq_t *q) {
  release(q, 1);
}

static kvr_worker_t const *slot_worker(const kvr_vcluster_t *vc, int slot) {
  return slot >= 0 ? vc->router->slots[slot] : NULL;
}

/* The router answered the request itself (400, 503): the client hears it one hop later. */
static void client_error(kvr_vcluster_t *vc, vreq_t *q, int status) {
  push_q(vc, EV_CLIENT_ERROR, vc->now + ns_of(NET(vc)), q, (uint64_t)status);
}

/* A Responses body as sim_server.c's handle_responses and responses_prepare read it, the store
 * on (VLLM_ENABLE_RESPONSES_API_STORE=1): the request, the model (vLLM's _check_model: absent,
 * null or the served name, else 404), the previous response from store (NULL: a worker holding
 * none; vLLM's 404 when it is not there), construct_input_messages rendered as chat (a partial
 * assistant item last is continued), the context check and max_tokens. With resp != NULL, the
 * response object too (id: its id), owning the prompt's messages. 0 or vLLM's status; the
 * caller frees p->prompt either way. */
static bool serves(const kvr_vcluster_t *vc, int wi, const char *model);

static int parse_responses(const kvr_vcluster_t *vc, int wi, cJSON *body,
                           const kvr_sim_rstore_t *store, kvr_sim_completion_t *p, const char *id,
                           kvr_sim_resp_t **resp) {
  kvr_sim_err_t e;
  kvr_sim_resp_req_t rq;
  cJSON *messages = NULL;
  memset(p, 0, sizeof(*p));
  p->lora = -1;
  int rc = kvr_sim_responses_read(body, &rq, &e);
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
  if (rc == 0 && model != NULL && !cJSON_IsNull(model))
    rc = !cJSON_IsString(model) ? 400 : !serves(vc, wi, model->valuestring) ? 404 : 0;
  if (rc == 0 && wi >= 0 && vc->fleet.n > 0 && cJSON_IsString(model))
    kvr_mfleet_serves(&vc->fleet.w[wi], model->valuestring, &p->lora);
  const kvr_sim_stored_t *prev = NULL;
  if (rc == 0 && rq.previous_response_id != NULL &&
      (store == NULL || (prev = kvr_sim_rstore_get(store, rq.previous_response_id)) == NULL))
    rc = 404; /* "Response with id '...' not found." */
  bool cont = false;
  if (rc == 0)
    rc = kvr_sim_responses_messages(
        &rq, prev ? prev->messages : NULL,
        prev ? cJSON_GetObjectItemCaseSensitive(prev->obj, "output") : NULL, &messages, &cont, &e);
  kvr_sim_render_t r = {.generation_prompt = !cont, .continue_final = cont};
  if (rc == 0 && kvr_sim_server_chat_prompt(messages, &r, p, e.message, sizeof(e.message)) != 0)
    rc = 400;
  uint32_t max_len = vc->o.engine.max_model_len;
  if (rc == 0 && p->prompt.n >= max_len)
    rc = 400; /* "The engine prompt length N exceeds the max_model_len M." */
  if (rc != 0) {
    cJSON_Delete(messages);
    return rc;
  }
  int64_t room = (int64_t)(max_len - p->prompt.n);
  p->max_tokens = rq.max_output_tokens > 0 ? KVR_MIN(rq.max_output_tokens, room) : room;
  p->stream = rq.stream;
  p->ignore_eos = rq.ignore_eos;
  p->seed = rq.seed;
  if (resp == NULL) {
    cJSON_Delete(messages);
    return 0;
  }
  /* The item id: 16 hex digits from the response's own (the sim draws both from its counter). */
  char item[17];
  snprintf(item, sizeof(item), "%.16s", id + 5);
  *resp = kvr_sim_resp_new(&rq, id, item, vc->model, (long long)(vc->now / 1000000000u),
                           p->max_tokens, messages);
  (*resp)->store = rq.store;
  return 0;
}

/* Whether worker wi answers a request naming model (wi < 0: some worker of the fleet does):
 * without a model fleet, the one served name (absent or empty: the base, as vLLM). */
static bool serves(const kvr_vcluster_t *vc, int wi, const char *model) {
  int32_t lora;
  if (vc->fleet.n == 0)
    return model == NULL || model[0] == '\0' || strcmp(model, vc->model) == 0;
  if (wi >= 0)
    return kvr_mfleet_serves(&vc->fleet.w[wi], model, &lora);
  return model == NULL || model[0] == '\0' || kvr_mfleet_count(&vc->fleet, model) > 0;
}

/* The worker of the fleet that reads a body for wi < 0 (the oracle, precise mode's /tokenize):
 * the first serving its model, else 0. */
static int reader(const kvr_vcluster_t *vc, const cJSON *body) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(body, "model");
  for (size_t i = 0; i < vc->fleet.n; i++)
    if (serves(vc, (int)i, cJSON_IsString(m) ? m->valuestring : NULL))
      return (int)i;
  return 0;
}

/* A completion body as worker wi reads it: sim_server.c's read_completion with the names it
 * answers to (a model fleet: its base and adapters, kvr_sim_server_parse_completion_in). */
static int parse_completion(const kvr_vcluster_t *vc, int wi, const cJSON *body,
                            kvr_sim_completion_t *p) {
  char err[256];
  if (vc->fleet.n == 0)
    return kvr_sim_server_parse_completion(body, vc->o.chat, vc->model, vc->o.engine.max_model_len,
                                           p, err, sizeof(err));
  const kvr_mfleet_worker_t *w = &vc->fleet.w[wi < 0 ? reader(vc, body) : wi];
  const char *names[1] = {w->model};
  kvr_sim_models_t models = {
      .names = names, .nnames = 1, .loras = w->adapter_ptrs, .nloras = w->nadapters};
  kvr_sim_err_t e;
  return kvr_sim_server_parse_completion_in(body, vc->o.chat, &models, vc->o.engine.max_model_len,
                                            p, &e);
}

/* The body as worker wi reads it (wi < 0: a worker serving its model; sim_server.c's
 * read_completion, or for the Responses API parse_responses with the worker's store; store NULL:
 * a worker holding no response): 0, or vLLM's status (400, 404). The caller frees p->prompt
 * either way. */
static int parse_body_at(const kvr_vcluster_t *vc, const vreq_t *q, int wi,
                         const kvr_sim_rstore_t *store, kvr_sim_completion_t *p, const char *id,
                         kvr_sim_resp_t **resp) {
  cJSON *body = cJSON_ParseWithLength(q->body, q->len);
  int status = 400;
  if (body == NULL)
    memset(p, 0, sizeof(*p));
  else if (vc->o.responses)
    status = parse_responses(vc, wi, body, store, p, id, resp);
  else
    status = parse_completion(vc, wi, body, p);
  cJSON_Delete(body);
  return status;
}

static int parse_body(const kvr_vcluster_t *vc, const vreq_t *q, kvr_sim_completion_t *p) {
  return parse_body_at(vc, q, -1, NULL, p, NULL, NULL);
}

/* The oracle: kv_aware's choice made on the engines' true state instead of the router's estimates.
 * Each worker's snapshot gets, from kvr_sim_engine_probe on the prompt's token ids as the engine
 * will see them, the prefix it really caches (in router blocks), the prompt tokens really queued
 * for prefill, the context really decoding, the requests really running and waiting and the KV
 * usage now -- what no router can see. So the gap between kv_aware and the oracle is what the
 * router's imperfect view (learnt index, estimated backlog, scraped figures seconds old) costs. */
static int oracle_pick(kvr_vcluster_t *vc, const vreq_t *q, const kvr_route_req_t *rreq,
                       kvr_decision_t *d) {
  /* A Responses follow-up whose id the router does not know: its prompt is a history only one
   * worker's store holds, which the oracle cannot render either; the router's pick stands. */
  if (q->prompt.previous_response_id != NULL)
    return KVR_POLICY_NONE;
  kvr_sim_completion_t p;
  int status = parse_body(vc, q, &p);
  if (status != 0) {
    kvr_sim_toks_free(&p.prompt);
    return KVR_POLICY_NONE;
  }
  /* The prompt's true length, in the engine's tokens, and in router blocks of that many tokens:
   * kv_aware's uncached = prompt - matched is then the engine's own count (the router's estimate
   * of chars / KVR_CHARS_PER_TOKEN can be off either way). */
  kvr_route_req_t truth = *rreq;
  truth.prompt_tokens = p.prompt.n;
  size_t nblocks =
      (p.prompt.n * KVR_CHARS_PER_TOKEN + vc->cfg.block_chars - 1) / vc->cfg.block_chars;
  for (size_t i = 0; i < d->nsnaps; i++) {
    kvr_worker_snap_t *s = &d->snaps[i];
    if (vc->router->slots[i] == NULL)
      continue;
    kvr_sim_probe_t pr;
    kvr_sim_engine_probe(vc->w[i].eng, p.prompt.v, (uint32_t)p.prompt.n, &pr);
    kvr_sim_stats_t st;
    kvr_sim_engine_stats(vc->w[i].eng, &st);
    /* The engine computes a step when it starts: the prefill of the step still running in
     * virtual time is not done yet, whatever the engine's counters say. */
    const worker_t *w = &vc->w[i];
    double end = w->step.start_s + w->step.duration_s, now = secs(vc->now);
    if (w->have_step && end > now && w->step.duration_s > 0)
      pr.pending_tokens +=
          (uint64_t)((double)w->step.prefill_tokens * (end - now) / w->step.duration_s);
    size_t blocks = (size_t)pr.cached_tokens * KVR_CHARS_PER_TOKEN / vc->cfg.block_chars;
    s->matched_blocks = KVR_MIN(blocks, nblocks);
    s->prefill_backlog_tokens = s->queued_prefill_tokens = pr.pending_tokens;
    s->active_tokens = pr.decode_ctx;
    s->inflight = pr.running + pr.waiting;
    s->num_requests_running = pr.running;
    s->num_requests_waiting = pr.waiting;
    s->kv_cache_usage = (double)st.blocks_used / (double)vc->w[i].blocks;
    s->metrics_fresh = true;
  }
  kvr_sim_toks_free(&p.prompt);
  return kvr_policy_select(vc->oracle, d->snaps, d->nsnaps, &truth, 0, d->scores);
}

/* Precise mode: the prompt's token ids as the worker's POST /tokenize gives them (the same parse
 * the worker serves the request with) and their block chain into rreq, as proxy.c's tokenize().
 * Returns the chain (the caller frees it after the decision), NULL for a body no engine takes. */
static uint64_t *tokenize(kvr_vcluster_t *vc, const vreq_t *q, kvr_route_req_t *rreq) {
  cJSON *body = cJSON_ParseWithLength(q->body, q->len);
  kvr_sim_completion_t p;
  memset(&p, 0, sizeof(p));
  uint64_t *chain = NULL;
  if (body != NULL && parse_completion(vc, -1, body, &p) == 0)
    chain = kvr_tokenize_route_req(p.prompt.v, p.prompt.n, vc->o.engine.block_size,
                                   NULL /* no cache_salt or adapter salts modelled here */, rreq);
  kvr_sim_toks_free(&p.prompt);
  cJSON_Delete(body);
  return chain;
}

/* Whether model names a LoRA adapter some worker of the fleet lists. */
static bool is_adapter(const kvr_vcluster_t *vc, const char *model) {
  int32_t lora;
  if (model == NULL)
    return false;
  for (size_t i = 0; i < vc->fleet.n; i++)
    if (kvr_mfleet_serves(&vc->fleet.w[i], model, &lora) && lora >= 0)
      return true;
  return false;
}

/* The request reached the router: what proxy.c's on_proxied and attempt() do. */
static void router_in(kvr_vcluster_t *vc, vreq_t *q) {
  if (q->lgr == NULL)
    return; /* cancelled on the way */
  kvr_router_t *r = vc->router;
  kvr_router_on_request(r);
  char err[256];
  const char *code = NULL;
  kvr_route_t route = vc->o.responses ? KVR_ROUTE_RESPONSES
                      : vc->o.chat    ? KVR_ROUTE_CHAT
                                      : KVR_ROUTE_COMPLETIONS;
  if (kvr_openai_features(q->body, q->len, route, vc->cfg.block_chars, &q->prompt, err, sizeof(err),
                          &code) != 0) {
    kvr_router_on_client_error(r);
    client_error(vc, q, 400);
    return;
  }
  q->has_prompt = true;
  /* proxy.c's model check: a name no worker lists is vLLM's 404 from the router itself */
  if (vc->fleet.n > 0 && kvr_router_model_unknown(r, q->prompt.model)) {
    client_error(vc, q, 404);
    return;
  }
  /* proxy.c's pin_response and attempt(): the worker that stored the named response, before and
   * instead of any policy (the oracle too); dispatched with no matched blocks. */
  const char *prev = q->prompt.previous_response_id;
  int pin = prev && !vc->o.no_response_affinity
                ? kvr_router_on_response_lookup(r, prev, strlen(prev), vc->now / 1000000u)
                : -1;
  if (pin >= 0) {
    q->slot = pin;
    kvr_router_on_dispatch(r, pin, q->prompt.prompt_tokens, 0, &q->acct);
    push_q(vc, EV_WORKER_IN, vc->now + ns_of(ROUTER(vc) + NET(vc)), q, 0);
    return;
  }
  kvr_route_req_t rreq;
  kvr_prompt_route_req(&q->prompt, &rreq);
  /* precise mode tokenizes chat and completions only, as proxy.c does */
  uint64_t *chain = vc->o.kv_events && !vc->o.responses ? tokenize(vc, q, &rreq) : NULL;
  kvr_decision_t d;
  /* proxy.c's attempt(): never a worker that does not serve the request's model */
  kvr_router_avoid_t avoid = {.model = q->prompt.model};
  int slot = kvr_router_decide(r, &rreq, &avoid, vc->oracle == NULL, &d);
  free(chain);
  if (vc->oracle != NULL && slot >= 0) {
    /* A body no engine would take keeps the router's pick: that worker answers its 400. */
    int truth = oracle_pick(vc, q, &rreq, &d);
    slot = truth >= 0 ? truth : slot;
  }
  if (slot < 0) {
    client_error(vc, q, 503);
    return;
  }
  q->slot = slot;
  if (vc->fleet.n > 0 && is_adapter(vc, q->prompt.model)) {
    vc->mstats.adapter_requests++;
    vc->mstats
        .adapter_state[d.snaps[slot].adapter <= KVR_ADAPTER_RUNNING ? d.snaps[slot].adapter : 0]++;
  }
  kvr_router_on_dispatch(r, slot, q->prompt.prompt_tokens, d.snaps[slot].matched_blocks, &q->acct);
  /* the /tokenize round trip (precise mode, chat and completions) */
  double tok_s = vc->o.kv_events && !vc->o.responses ? vc->o.tokenize_ms * 1e-3 : 0;
  push_q(vc, EV_WORKER_IN, vc->now + ns_of(ROUTER(vc) + NET(vc) + tok_s), q, 0);
}

static void kick(kvr_vcluster_t *vc, size_t wi) {
  worker_t *w = &vc->w[wi];
  if (w->active)
    return;
  w->active = true;
  w->have_step = false;
  w->due = KVR_MAX(ns_of(kvr_sim_engine_next_start(w->eng)), vc->now);
  push(vc, (ev_t){.t = w->due, .kind = EV_STEP, .w = wi});
}

/* The request reached its worker: what sim_server.c's handle_completion does. */
static void worker_in(kvr_vcluster_t *vc, vreq_t *q) {
  if (q->gone)
    return;
  worker_t *w = &vc->w[q->slot];
  kvr_sim_completion_t p;
  if (vc->o.responses) /* sim_server.c's random_hex: "resp_" + 16 hex, unique in the run */
    snprintf(q->resp_id, sizeof(q->resp_id), "resp_%016llx",
             (unsigned long long)kvr_sim_tokens_mix(vc->o.seed ^ ++vc->resp_ids));
  int status =
      parse_body_at(vc, q, q->slot, w->store, &p, q->resp_id, vc->o.responses ? &q->resp : NULL);
  vc->mstats.requests++;
  if (status == 404 && vc->fleet.n > 0)
    vc->mstats.not_served++; /* what the router should never do: count it */
  if (status == 0) {
    kvr_sim_answer_t a;
    kvr_sim_server_answer(&p, (uint64_t)q->slot, vc->o.output_len_mean, &a);
    q->gen_seed = a.gen_seed;
    q->max_output = a.max_output;
    q->prompt_tokens = (uint32_t)p.prompt.n;
    kvr_sim_engine_set_now(w->eng, secs(vc->now));
    q->length_stop = a.stop_reason == KVR_SIM_FINISH_LENGTH;
    kvr_sim_add_t add = {.prompt = p.prompt.v,
                         .nprompt = (uint32_t)p.prompt.n,
                         .max_output = a.max_output,
                         .stop_reason = a.stop_reason,
                         .gen_seed = a.gen_seed,
                         .data = q};
    const kvr_mfleet_worker_t *fw = vc->fleet.n > 0 ? &vc->fleet.w[q->slot] : NULL;
    if (fw != NULL && p.lora >= 0 && (size_t)p.lora < fw->nadapters) {
      /* sim_server.c: the adapter's lora_int_id (1.. in the order the worker lists them), its
       * rank and name (every block hash's extra key) */
      add.lora_id = (uint32_t)p.lora + 1;
      add.lora_rank = KVR_MFLEET_LORA_RANK;
      add.lora_name = fw->adapters[p.lora];
    }
    q->ereq = kvr_sim_engine_add_ex(w->eng, &add);
    if (q->ereq == NULL)
      status = 400;
  }
  kvr_sim_toks_free(&p.prompt);
  if (status != 0) {
    /* The worker answered an error: the router passes it on and ends the request. */
    push_q(vc, EV_ROUTER_HEAD, vc->now + ns_of(NET(vc)), q, (uint64_t)status);
    return;
  }
  q->refs++; /* the engine's */
  push_q(vc, EV_ROUTER_HEAD, vc->now + ns_of(NET(vc)), q, 200);
  kick(vc, (size_t)q->slot);
}

/* The worker's response head reached the router: proxy.c's on_header (reachable, learn the
 * prompt) or, for an error status, its transfer_succeeded (a worker error, the request ends). */
static void router_head(kvr_vcluster_t *vc, vreq_t *q, int status) {
  kvr_router_t *r = vc->router;
  if (!q->acct.open)
    return;
  kvr_router_on_health(r, q->acct.worker_id, true);
  if (status != 200) {
    if (status >= 500)
      kvr_router_on_worker_error(r, &q->acct);
    kvr_router_on_end(r, &q->acct);
    client_error(vc, q, status);
    return;
  }
  if (q->has_prompt)
    kvr_router_on_learn(r, &q->acct, q->prompt.blocks, q->prompt.nblocks);
  /* proxy.c's take_response_id: the response.created event names the id it stored under (a
   * "store": false request's is stored nowhere, and not kept) */
  if (q->resp_id[0] != '\0' && !vc->o.no_response_affinity && (!q->has_prompt || q->prompt.store))
    kvr_router_on_response_id(r, &q->acct, q->resp_id, strlen(q->resp_id));
  push_q(vc, EV_CLIENT_HEAD, vc->now + ns_of(NET(vc)), q, 0);
}

/* sim_server.c's responses_done + responses_store at a Responses answer's last token: the object
 * gets the answer's text (the words the engine generated), status and usage, and goes with its
 * prompt's messages into the worker's store, where the next turn's previous_response_id finds
 * it. */
static void responses_store(worker_t *w, vreq_t *q) {
  kvr_sim_resp_t *resp = q->resp;
  q->resp = NULL;
  kvr_buf_t text = KVR_BUF_INIT;
  char word[KVR_SIM_TOKEN_BYTES];
  for (uint32_t k = 0; k < q->max_output; k++) {
    kvr_sim_tokens_word(q->gen_seed, k, word);
    kvr_buf_append(&text, word, sizeof(word));
  }
  kvr_sim_resp_finish(resp, text.data, text.len, q->length_stop, q->prompt_tokens, q->cached,
                      q->max_output);
  if (resp->store) {
    kvr_sim_rstore_put(w->store, kvr_sim_resp_id(resp), cJSON_Duplicate(resp->obj, true),
                       resp->messages);
    resp->messages = NULL;
  }
  kvr_buf_free(&text);
  kvr_sim_resp_free(resp);
}

/* sim_server.c's deliver + stream_emit: one token per event of the step, into a batch. */
static batch_t *deliver(kvr_vcluster_t *vc, worker_t *w, const kvr_sim_step_t *st) {
  batch_t *b = NULL;
  for (size_t i = 0; i < st->nevents; i++) {
    const kvr_sim_event_t *ev = &st->events[i];
    vreq_t *q = ev->req->data;
    if (q == NULL || q->gone || ev->new_tokens == 0)
      continue;
    if (b == NULL) {
      b = kvr_xmalloc(sizeof(batch_t) + st->nevents * sizeof(out_t));
      b->n = 0;
    }
    if (q->sent == 0 && q->ereq->num_cached > 0)
      q->cached = (uint32_t)q->ereq->num_cached;
    out_t *o = &b->items[b->n++];
    o->q = q;
    o->client_done = false;
    q->refs++;
    kvr_sim_tokens_word(q->gen_seed, q->sent, o->word);
    o->final = ++q->sent >= q->max_output;
    if (o->final && q->resp != NULL)
      responses_store(w, q);
    if (o->final) {
      kvr_sim_engine_remove(w->eng, q->ereq);
      q->ereq = NULL;
      drop(q); /* the engine's */
    }
  }
  (void)vc;
  return b;
}

static void reap(worker_t *w) {
  for (size_t i = 0; i < w->ngone; i++) {
    vreq_t *q = w->gone[i];
    int n = 1; /* the gone list's */
    if (q->ereq != NULL) {
      kvr_sim_engine_remove(w->eng, q->ereq);
      q->ereq = NULL;
      n++; /* the engine's */
    }
    release(q, n);
  }
  w->ngone = 0;
}

/* Precise mode: the step's KV events leave the engine as vLLM sends them (one msgpack EventBatch,
 * what sim_server.c publishes at the same moment) and reach the router net_ms later. */
static void publish_kv(kvr_vcluster_t *vc, size_t wi) {
  const kvr_sim_kv_log_t *log = kvr_sim_engine_kv_log(vc->w[wi].eng);
  if (log == NULL || log->nev == 0)
    return;
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  kvr_kv_encode_batch(&sb, log, vc->o.engine.block_size, (double)vc->now / 1e9, 0,
                      KVR_KV_ENCODING_MAP);
  kv_msg_t *m = kvr_xmalloc(sizeof(*m) + sb.size);
  m->w = wi;
  m->len = sb.size;
  memcpy(m->data, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  kvr_sim_engine_kv_log_clear(vc->w[wi].eng);
  push(vc, (ev_t){.t = vc->now + ns_of(NET(vc)), .kind = EV_KV_BATCH, .p = m});
}

/* The batch reached the router: kv_sub.c's decode and kv_feed.c's apply. */
static void kv_batch_in(kvr_vcluster_t *vc, kv_msg_t *m) {
  char err[128];
  kvr_router_t *r = vc->router;
  if (kvr_kv_decode_batch(m->data, m->len, &vc->kv_batch, err, sizeof(err)) == 0 &&
      r->slots[m->w] != NULL)
    kvr_router_on_kv_batch(r, r->slots[m->w]->id, &vc->kv_batch);
  free(m);
}

/* sim_server.c's on_step in virtual time. */
static void step(kvr_vcluster_t *vc, size_t wi) {
  worker_t *w = &vc->w[wi];
  if (w->have_step) {
    batch_t *b = deliver(vc, w, &w->step);
    if (b != NULL)
      push(vc, (ev_t){.t = vc->now + ns_of(NET(vc)), .kind = EV_ROUTER_TOKENS, .p = b});
    publish_kv(vc, wi);
  }
  w->have_step = false;
  reap(w);
  if (!kvr_sim_engine_busy(w->eng)) {
    w->active = false;
    return;
  }
  kvr_sim_engine_step(w->eng, &w->step);
  w->have_step = true;
  kvr_sim_stats_t st;
  kvr_sim_engine_stats(w->eng, &st);
  vc->kv_peak = fmax(vc->kv_peak, (double)st.blocks_used / (double)w->blocks);
  uint64_t due = ns_of(w->step.deliver_s);
  if (w->step.num_seqs == 0 || due <= w->due)
    due = w->due + 100000; /* nothing was scheduled: look again in 0.1 ms */
  w->due = due;
  push(vc, (ev_t){.t = due, .kind = EV_STEP, .w = wi});
}

/* The tokens of one step reached the router: proxy.c's sse_line, then learn() and the end. */
static void router_tokens(kvr_vcluster_t *vc, batch_t *b) {
  kvr_router_t *r = vc->router;
  for (size_t i = 0; i < b->n; i++) {
    vreq_t *q = b->items[i].q;
    if (!q->acct.open)
      continue;
    kvr_router_on_token(r, &q->acct);
    kvr_buf_append(&q->answer, b->items[i].word, KVR_SIM_TOKEN_BYTES);
    if (!b->items[i].final)
      continue;
    /* The modelled workers report usage with its details, as vLLM started with
     * --enable-prompt-tokens-details does (what the cluster's cached figures are read from). */
    kvr_router_usage_t u = {.prompt_tokens = q->prompt_tokens,
                            .completion_tokens = q->acct.generated,
                            .cached_tokens = q->cached,
                            .has_details = true};
    kvr_router_on_usage(r, &q->acct, &u);
    if (q->has_prompt) {
      kvr_prompt_extend_answer(&q->prompt, q->answer.data, q->answer.len);
      kvr_router_on_learn(r, &q->acct, q->prompt.blocks, q->prompt.nblocks);
    }
    kvr_router_on_end(r, &q->acct);
  }
  push(vc, (ev_t){.t = vc->now + ns_of(NET(vc)), .kind = EV_CLIENT_TOKENS, .p = b});
}

static void client_tokens(kvr_vcluster_t *vc, batch_t *b) {
  (void)vc;
  for (size_t i = 0; i < b->n; i++) {
    vreq_t *q = b->items[i].q;
    if (q->lgr != NULL) {
      kvr_loadgen_vt_token(q->lgr, b->items[i].word, KVR_SIM_TOKEN_BYTES);
      if (b->items[i].final) {
        kvr_loadgen_req_t *lgr = q->lgr;
        q->lgr = NULL;
        kvr_loadgen_vt_usage(lgr, q->prompt_tokens, q->max_output, q->cached);
        kvr_loadgen_vt_done(lgr, NULL);
        b->items[i].client_done = true;
      }
    }
  }
  for (size_t i = 0; i < b->n; i++) /* the batch's, and the client's when it ended here */
    release(b->items[i].q, 1 + b->items[i].client_done);
  free(b);
}

/* The router's own answer reached the client; returns the references to give up with the
 * event's (1: the client's, when this ended it). */
static int client_error_in(vreq_t *q, int status) {
  if (q->lgr == NULL)
    return 0;
  kvr_loadgen_req_t *lgr = q->lgr;
  q->lgr = NULL;
  kvr_loadgen_vt_head(lgr, status, NULL);
  kvr_loadgen_vt_done(lgr, NULL);
  return 1;
}

static void router_abort(kvr_vcluster_t *vc, vreq_t *q) {
  if (!q->acct.open)
    return;
  kvr_router_on_client_abort(vc->router);
  kvr_router_on_end(vc->router, &q->acct);
  push_q(vc, EV_WORKER_ABORT, vc->now + ns_of(NET(vc)), q, 0);
}

static void worker_abort(kvr_vcluster_t *vc, vreq_t *q) {
  if (q->gone)
    return;
  q->gone = true;
  if (q->ereq == NULL)
    return;
  worker_t *w = &vc->w[q->slot];
  if (w->ngone == w->capgone) {
    w->capgone = w->capgone ? w->capgone * 2 : 64;
    w->gone = kvr_xrealloc(w->gone, w->capgone * sizeof(vreq_t *));
  }
  w->gone[w->ngone++] = q;
  q->refs++;
  if (!w->active)
    reap(w);
}

/* The adapters of worker wi's running or waiting requests, names joined by ',' (sim_server.c's
 * lora_names_of), cut after the last whole name that fits. */
static void lora_names(const kvr_vcluster_t *vc, size_t wi, bool running, char *out, size_t size) {
  const kvr_sim_req_t *reqs[KVR_MFLEET_ADAPTERS_MAX];
  size_t n = KVR_MIN(kvr_sim_engine_loras(vc->w[wi].eng, running, reqs, KVR_MFLEET_ADAPTERS_MAX),
                     (size_t)KVR_MFLEET_ADAPTERS_MAX);
  size_t k = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(reqs[i]->lora_name) + (i > 0);
    if (k + len >= size)
      break;
    k += (size_t)snprintf(out + k, size - k, "%s%s", i ? "," : "", reqs[i]->lora_name);
  }
}

/* vllm:lora_requests_info of a LoRA worker as scrape.c reads it (kvr_vllm_parse_metrics): the
 * newest series, max_lora, the running and waiting adapters (sim_server.c's lora_info_update). */
static void scrape_lora(const kvr_vcluster_t *vc, size_t wi, kvr_vllm_lora_info_t *li) {
  li->present = true;
  li->updated = secs(vc->now);
  li->max_lora = vc->o.max_loras ? vc->o.max_loras : 1;
  lora_names(vc, wi, true, li->running, sizeof(li->running));
  lora_names(vc, wi, false, li->waiting, sizeof(li->waiting));
}

/* What scrape.c reads from each sim's /metrics, straight from the engines. */
static void scrape(kvr_vcluster_t *vc) {
  for (size_t i = 0; i < vc->o.workers; i++) {
    const kvr_worker_t *rw = vc->router->slots[i];
    if (rw == NULL)
      continue;
    kvr_sim_stats_t st;
    kvr_sim_engine_stats(vc->w[i].eng, &st);
    kvr_vllm_metrics_t m = {
        .at_ms = vc->now / 1000000u,
        .num_requests_running = st.running,
        .num_requests_waiting = st.waiting,
        .kv_cache_usage = (double)st.blocks_used / (double)vc->w[i].blocks,
        .num_gpu_blocks = vc->w[i].blocks,
        .block_size = vc->o.engine.block_size,
    };
    if (vc->fleet.n > 0 && vc->fleet.w[i].nadapters > 0)
      scrape_lora(vc, i, &m.lora);
    kvr_router_on_scrape(vc->router, rw->id, &m);
  }
  push(vc, (ev_t){.t = vc->now + vc->o.scrape_interval_ms * 1000000u, .kind = EV_SCRAPE});
}

static void dispatch(kvr_vcluster_t *vc, ev_t *ev) {
  vreq_t *q = ev->p;
  int refs = 1; /* the event's */
  switch (ev->kind) {
  case EV_TIMER:
    if (ev->fn != NULL) /* NULL: its generator was freed (vt_forget) */
      ev->fn(ev->p, ev->tag);
    return;
  case EV_STEP:
    step(vc, ev->w);
    return;
  case EV_ROUTER_TOKENS:
    router_tokens(vc, ev->p);
    return;
  case EV_CLIENT_TOKENS:
    client_tokens(vc, ev->p);
    return;
  case EV_SCRAPE:
    scrape(vc);
    return;
  case EV_KV_BATCH:
    kv_batch_in(vc, ev->p);
    return;
  case EV_FLUSH:
    /* an idle engine holds the clear until its next step, as vLLM's does */
    kvr_vcluster_flush_worker(vc, vc->flushes++ % vc->o.workers);
    push(vc, (ev_t){.t = vc->now + ns_of(vc->o.flush_every_s), .kind = EV_FLUSH});
    return;
  case EV_ROUTER_IN:
    router_in(vc, q);
    break;
  case EV_WORKER_IN:
    worker_in(vc, q);
    break;
  case EV_ROUTER_HEAD:
    router_head(vc, q, (int)ev->tag);
    break;
  case EV_CLIENT_HEAD:
    if (q->lgr != NULL) {
      kvr_loadgen_vt_head(q->lgr, 200,
                          slot_worker(vc, q->slot) ? slot_worker(vc, q->slot)->label : NULL);
      if (q->resp_id[0] != '\0') /* the response.created event */
        kvr_loadgen_vt_response_id(q->lgr, q->resp_id);
    }
    break;
  case EV_CLIENT_ERROR:
    refs += client_error_in(q, (int)ev->tag);
    break;
  case EV_ROUTER_ABORT:
    router_abort(vc, q);
    break;
  case EV_WORKER_ABORT:
    worker_abort(vc, q);
    break;
  }
  release(q, refs);
}

/* ---- the load generator's transport ---------------------------------------------------------- */

/* The earliest event: the clock moves to it and it runs. */
static void run_next(kvr_vcluster_t *vc) {
  ev_t ev = pop(vc);
  vc->now = ev.t;
  vc->events++;
  dispatch(vc, &ev);
}

static uint64_t vt_now(void *ctx) {
  return ((kvr_vcluster_t *)ctx)->now;
}

static void vt_at(void *ctx, uint64_t t, void (*fn)(void *, uint64_t), void *arg, uint64_t tag) {
  push(ctx, (ev_t){.t = t, .kind = EV_TIMER, .fn = fn, .p = arg, .tag = tag});
}

static void *vt_send(void *ctx, kvr_loadgen_req_t *r, const char *body, size_t len) {
  kvr_vcluster_t *vc = ctx;
  vreq_t *q = kvr_xcalloc(1, sizeof(*q));
  q->lgr = r;
  q->refs = 1; /* the client's */
  q->body = kvr_xmalloc(len + 1);
  memcpy(q->body, body, len);
  q->body[len] = '\0';
  q->len = len;
  q->slot = -1;
  kvr_prompt_init(&q->prompt);
  kvr_list_insert_head(&vc->live, &q->node);
  push_q(vc, EV_ROUTER_IN, vc->now + ns_of(NET(vc)), q, 0);
  return q;
}

static void vt_cancel(void *ctx, void *handle) {
  kvr_vcluster_t *vc = ctx;
  vreq_t *q = handle;
  if (q->lgr == NULL)
    return;
  q->lgr = NULL;
  push_q(vc, EV_ROUTER_ABORT, vc->now + ns_of(NET(vc)), q, 0);
  drop(q); /* the client's */
}

static void vt_run(void *ctx) {
  kvr_vcluster_t *vc = ctx;
  vc->stopped = false;
  while (!vc->stopped && vc->nheap > 0) {
    run_next(vc);
  }
}

/* The generator arg is going away: its calls still in the heap must not reach it. */
static void vt_forget(void *ctx, void *arg) {
  kvr_vcluster_t *vc = ctx;
  for (size_t i = 0; i < vc->nheap; i++)
    if (vc->heap[i].kind == EV_TIMER && vc->heap[i].p == arg)
      vc->heap[i].fn = NULL;
}

static void vt_stop(void *ctx) {
  ((kvr_vcluster_t *)ctx)->stopped = true;
}

void kvr_vcluster_transport(kvr_vcluster_t *vc, kvr_loadgen_vt_t *out) {
  *out = (kvr_loadgen_vt_t){.ctx = vc,
                            .now_ns = vt_now,
                            .at = vt_at,
                            .send = vt_send,
                            .cancel = vt_cancel,
                            .run = vt_run,
                            .stop = vt_stop,
                            .forget = vt_forget};
}

/* ---- lifecycle and operations ---------------------------------------------------------------- */

/* A model fleet: each worker's GET /v1/models, as scrape.c's probe reads it when the worker is
 * added (kvr_vllm_parse_model_list, kvr_router_on_models). 0 or -1 with err. */
static int feed_models(kvr_vcluster_t *vc, char *err, size_t errlen) {
  kvr_buf_t b = KVR_BUF_INIT;
  int rc = 0;
  for (size_t i = 0; i < vc->fleet.n && rc == 0; i++) {
    kvr_mfleet_models_json(&vc->fleet, i, vc->o.engine.max_model_len,
                           (long long)(vc->now / 1000000000u), &b);
    kvr_vllm_models_t m;
    if (kvr_vllm_parse_model_list(b.data, b.len, &m) != 0 ||
        kvr_router_on_models(vc->router, vc->router->slots[i]->id, &m) != 0) {
      snprintf(err, errlen, "worker %zu: its model list was not taken", i);
      rc = -1;
    }
    kvr_vllm_models_free(&m);
  }
  kvr_buf_free(&b);
  return rc;
}

/* Makes the router and the engines from vc->cfg and vc->o, as at start, and schedules the scrape
 * and flush loops from now. Returns 0, or -1 with err. */
static int build(kvr_vcluster_t *vc, char *err, size_t errlen) {
  const kvr_vcluster_opts_t *o = &vc->o;
  vc->router = kvr_router_new(&vc->cfg, err, errlen);
  if (vc->router == NULL)
    return -1;
  kvr_router_set_clock(vc->router, vt_now, vc);
  for (size_t i = 0; i < o->workers; i++) {
    kvr_sim_config_t ec = o->engine;
    if (o->nworker_blocks > 0)
      ec.num_gpu_blocks = o->worker_blocks[i];
    bool lora = vc->fleet.n > 0 && vc->fleet.w[i].nadapters > 0;
    if (lora) { /* vLLM's --enable-lora --max-loras L (--max-cpu-loras defaults to it) */
      ec.max_loras = o->max_loras ? o->max_loras : 1;
      ec.max_cpu_loras = KVR_MAX(ec.max_cpu_loras, ec.max_loras);
    }
    vc->w[i] =
        (worker_t){.blocks = ec.num_gpu_blocks, .gone = vc->w[i].gone, .capgone = vc->w[i].capgone};
    vc->w[i].eng = kvr_sim_engine_new(&ec);
    if (o->responses)
      vc->w[i].store = kvr_sim_rstore_new(KVR_SIM_RSTORE_MAX);
    if (vc->w[i].eng == NULL) {
      snprintf(err, errlen, "worker %zu: invalid engine configuration", i);
      return -1;
    }
    /* --lora-modules at startup: each adapter read into the CPU cache and activated, uncharged
     * (sim_server.c's startup loads; vLLM's LRUCacheWorkerLoRAManager) */
    for (size_t k = 0; lora && k < vc->fleet.w[i].nadapters; k++)
      kvr_sim_engine_lora_add(vc->w[i].eng, (uint32_t)k + 1, KVR_MFLEET_LORA_RANK, false);
  }
  if (vc->fleet.n > 0 && feed_models(vc, err, errlen) != 0)
    return -1;
  if (o->kv_events) {
    /* every engine's history is known from its start: precise from the first request */
    for (size_t i = 0; i < o->workers; i++) {
      kvr_sim_engine_kv_events(vc->w[i].eng, true);
      kvr_router_on_kv_mode(vc->router, vc->router->slots[i]->id, true, "precise");
    }
  }
  if (o->scrape_interval_ms > 0)
    push(vc, (ev_t){.t = vc->now, .kind = EV_SCRAPE});
  if (o->flush_every_s > 0)
    push(vc, (ev_t){.t = vc->now + ns_of(o->flush_every_s), .kind = EV_FLUSH});
  return 0;
}

/* The router's configuration for vc->o: serve's defaults, the options' block size, scrapes and
 * seed, and one worker URL per worker (a name: never contacted). Returns 0 or -1 with err. */
static int make_config(kvr_vcluster_t *vc, char *err, size_t errlen) {
  const kvr_vcluster_opts_t *o = &vc->o;
  kvr_config_init(&vc->cfg);
  vc->cfg.block_chars = o->block_chars;
  vc->cfg.scrape_interval_ms = o->scrape_interval_ms;
  vc->cfg.scrape_stale_ms = o->scrape_stale_ms;
  vc->cfg.seed = o->seed;
  vc->cfg.access_log = false;
  free(vc->cfg.policy);
  vc->cfg.policy = kvr_xstrdup("kv_aware"); /* serve's default */
  for (size_t i = 0; i < o->workers; i++) {
    char url[96];
    if (vc->fleet.n == 0) {
      snprintf(url, sizeof(url), "http://127.0.0.1:%zu", 9001 + i);
    } else {
      /* a model fleet: one URL per endpoint; a DP endpoint's ranks are its dp_size workers, in
       * rank order, as `kvrouter serve --worker URL,dp_size=N` makes them */
      const kvr_mfleet_worker_t *w = &vc->fleet.w[i];
      if (w->dp_rank > 0)
        continue;
      snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9001 + w->endpoint);
      if (w->dp_size > 1)
        snprintf(url + strlen(url), sizeof(url) - strlen(url), ",dp_size=%u", w->dp_size);
    }
    if (kvr_config_add_worker_spec(&vc->cfg, url, err, errlen) != 0)
      return -1;
  }
  return 0;
}

/* opts.model_fleet: parsed, its size the cluster's. 0 or -1 with err. */
static int use_fleet(kvr_vcluster_t *vc, char *err, size_t errlen) {
  if (kvr_mfleet_parse(vc->o.model_fleet, KVR_MAX_WORKERS, &vc->fleet, err, errlen) != 0)
    return -1;
  if (vc->o.nworker_blocks != 0 && vc->o.nworker_blocks != vc->fleet.n) {
    snprintf(err, errlen, "--worker-blocks: %zu values for the model fleet's %zu workers",
             vc->o.nworker_blocks, vc->fleet.n);
    return -1;
  }
  vc->fleet_spec = kvr_xstrdup(vc->o.model_fleet);
  vc->o.model_fleet = vc->fleet_spec;
  vc->o.workers = vc->fleet.n;
  return 0;
}

kvr_vcluster_t *kvr_vcluster_new(const kvr_vcluster_opts_t *o, char *err, size_t errlen) {
  if (o->workers < 1 || o->workers > KVR_MAX_WORKERS) {
    snprintf(err, errlen, "--workers: %zu is out of range 1..%d", o->workers, KVR_MAX_WORKERS);
    return NULL;
  }
  if (!(o->net_ms >= 0) || !(o->router_ms >= 0)) {
    snprintf(err, errlen, "--net-ms, --router-ms: must be >= 0");
    return NULL;
  }
  if (o->nworker_blocks != 0 && o->nworker_blocks != o->workers) {
    snprintf(err, errlen, "--worker-blocks: %zu values for %zu workers (give one per worker)",
             o->nworker_blocks, o->workers);
    return NULL;
  }
  if (kvr_sim_config_check(&o->engine, err, errlen) != 0)
    return NULL;
  kvr_vcluster_t *vc = kvr_xcalloc(1, sizeof(*vc));
  kvr_list_init(&vc->live);
  vc->o = *o;
  vc->model = kvr_xstrdup(o->model ? o->model : "default");
  vc->o.model = vc->model;
  if (o->model_fleet != NULL && use_fleet(vc, err, errlen) != 0)
    goto fail;
  if (make_config(vc, err, errlen) != 0 || build(vc, err, errlen) != 0)
    goto fail;
  return vc;
fail:
  kvr_vcluster_free(vc);
  return NULL;
}

void kvr_vcluster_free(kvr_vcluster_t *vc) {
  if (vc == NULL)
    return;
  /* Whatever is still in flight goes at once: the batches in the heap, the engines (with the
   * requests they hold) and every request not freed yet. */
  for (size_t i = 0; i < vc->nheap; i++)
    if (vc->heap[i].kind == EV_ROUTER_TOKENS || vc->heap[i].kind == EV_CLIENT_TOKENS ||
        vc->heap[i].kind == EV_KV_BATCH)
      free(vc->heap[i].p);
  for (size_t i = 0; i < vc->o.workers; i++) {
    free(vc->w[i].gone);
    kvr_sim_engine_free(vc->w[i].eng);
    kvr_sim_rstore_free(vc->w[i].store);
  }
  kvr_kv_batch_free(&vc->kv_batch);
  while (!kvr_list_empty(&vc->live))
    vreq_free(KVR_CONTAINER_OF(vc->live.next, vreq_t, node));
  free(vc->heap);
  kvr_router_free(vc->router);
  kvr_policy_destroy(vc->oracle);
  kvr_config_free(&vc->cfg);
  free(vc->policy);
  cJSON_Delete(vc->params);
  free(vc->model);
  kvr_mfleet_free(&vc->fleet);
  free(vc->fleet_spec);
  free(vc);
}

static void remember_policy(kvr_vcluster_t *vc, const char *name, const cJSON *params) {
  char *copy = kvr_xstrdup(name); /* name may be vc->policy itself */
  free(vc->policy);
  vc->policy = copy;
  cJSON_Delete(vc->params);
  vc->params = params ? cJSON_Duplicate(params, true) : NULL;
}

int kvr_vcluster_set_policy(kvr_vcluster_t *vc, const char *name, const cJSON *params, char *err,
                            size_t errlen) {
  if (name != NULL && strcmp(name, KVR_VCLUSTER_ORACLE) == 0) {
    /* The router keeps kv_aware for its bookkeeping; the oracle's instance decides. */
    kvr_policy_t *p = kvr_policy_create("kv_aware", params, vc->o.seed, err, errlen);
    if (p == NULL)
      return KVR_EINVAL;
    kvr_policy_destroy(vc->oracle);
    vc->oracle = p;
    int rc = kvr_router_set_policy(vc->router, "kv_aware", params, err, errlen);
    if (rc == 0)
      remember_policy(vc, KVR_VCLUSTER_ORACLE, params);
    return rc;
  }
  int rc = kvr_router_set_policy(vc->router, name, params, err, errlen);
  if (rc == 0) {
    kvr_policy_destroy(vc->oracle);
    vc->oracle = NULL;
    remember_policy(vc, kvr_policy_name(vc->router->policy), params);
  } else if (name != NULL && kvr_policy_find(name) == NULL) {
    char names[512];
    kvr_policy_names(names, sizeof(names));
    snprintf(err, errlen, "unknown policy '%s' (valid: %s, %s)", name, names, KVR_VCLUSTER_ORACLE);
  }
  return rc;
}

const kvr_router_t *kvr_vcluster_router(const kvr_vcluster_t *vc) {
  return vc->router;
}

void kvr_vcluster_flush_worker(kvr_vcluster_t *vc, size_t wi) {
  if (wi < vc->o.workers)
    kvr_sim_engine_reset_prefix_cache(vc->w[wi].eng, NULL);
}

void kvr_vcluster_reset_cache(kvr_vcluster_t *vc, char *summary, size_t size) {
  for (size_t i = 0; i < vc->o.workers; i++) {
    kvr_sim_engine_reset_prefix_cache(vc->w[i].eng, NULL);
    uint64_t forgotten = 0;
    if (vc->router->slots[i])
      kvr_router_forget_cache(vc->router, vc->router->slots[i]->id, &forgotten);
  }
  snprintf(summary, size, "%zu/%zu workers reset", vc->o.workers, vc->o.workers);
}

int kvr_vcluster_set_workers(kvr_vcluster_t *vc, size_t workers, char *err, size_t errlen) {
  if (workers < 1 || workers > KVR_MAX_WORKERS) {
    snprintf(err, errlen, "%zu workers: out of range 1..%d", workers, KVR_MAX_WORKERS);
    return KVR_EINVAL;
  }
  if (vc->o.nworker_blocks != 0 && workers != vc->o.workers) {
    snprintf(err, errlen, "a mixed fleet (--worker-blocks) keeps its %zu workers", vc->o.workers);
    return KVR_EINVAL;
  }
  if (vc->fleet.n != 0 && workers != vc->o.workers) {
    snprintf(err, errlen, "a model fleet (--model-fleet) keeps its %zu workers", vc->o.workers);
    return KVR_EINVAL;
  }
  vc->resize = workers;
  return 0;
}

/* Between the old engines and build(): the fleet kvr_vcluster_set_workers asked for, with the
 * router's worker list made anew (the workers past a smaller fleet lose their reap lists). */
static int resize(kvr_vcluster_t *vc, char *err, size_t errlen) {
  size_t n = vc->resize;
  vc->resize = 0;
  if (n == 0 || n == vc->o.workers)
    return 0;
  for (size_t i = n; i < vc->o.workers; i++) {
    free(vc->w[i].gone);
    kvr_sim_rstore_free(vc->w[i].store);
    vc->w[i] = (worker_t){0};
  }
  vc->o.workers = n;
  kvr_config_free(&vc->cfg);
  return make_config(vc, err, errlen);
}

int kvr_vcluster_restart(kvr_vcluster_t *vc, char *err, size_t errlen) {
  /* Let what is in flight finish (a request the client cancelled is reaped at its engine's next
   * step), bounded: a level ends with every request answered or cancelled. */
  uint64_t until = vc->now + ns_of(3600);
  while (!kvr_list_empty(&vc->live) && vc->nheap > 0 && vc->heap[0].t <= until) {
    run_next(vc);
  }
  if (!kvr_list_empty(&vc->live)) {
    snprintf(err, errlen, "requests still in flight an hour (virtual) after the level");
    return KVR_EINVAL;
  }
  /* Keep the load generator's timers; the rest (steps, scrapes, flushes, KV batches) belonged to
   * the engines and router about to go. */
  ev_t *keep = kvr_xmalloc((vc->nheap ? vc->nheap : 1) * sizeof(ev_t));
  size_t nkeep = 0;
  for (size_t i = 0; i < vc->nheap; i++)
    if (vc->heap[i].kind == EV_TIMER)
      keep[nkeep++] = vc->heap[i];
    else if (vc->heap[i].kind == EV_KV_BATCH || vc->heap[i].kind == EV_ROUTER_TOKENS ||
             vc->heap[i].kind == EV_CLIENT_TOKENS)
      free(vc->heap[i].p);
  vc->nheap = 0;
  for (size_t i = 0; i < nkeep; i++)
    heap_insert(vc, keep[i]); /* their times and order as they were */
  free(keep);
  for (size_t i = 0; i < vc->o.workers; i++) {
    kvr_sim_engine_free(vc->w[i].eng);
    vc->w[i].eng = NULL; /* build() makes each worker anew, its response store too */
    kvr_sim_rstore_free(vc->w[i].store);
    vc->w[i].store = NULL;
  }
  kvr_router_free(vc->router);
  vc->router = NULL;
  kvr_policy_destroy(vc->oracle);
  vc->oracle = NULL;
  if (resize(vc, err, errlen) != 0 || build(vc, err, errlen) != 0)
    return KVR_EINVAL;
  if (vc->policy == NULL)
    return 0;
  char *name = kvr_xstrdup(vc->policy);
  cJSON *params = vc->params ? cJSON_Duplicate(vc->params, true) : NULL;
  int rc = kvr_vcluster_set_policy(vc, name, params, err, errlen);
  cJSON_Delete(params);
  free(name);
  return rc;
}

void kvr_vcluster_idle(kvr_vcluster_t *vc, double seconds) {
  uint64_t until = vc->now + ns_of(seconds);
  while (vc->nheap > 0 && vc->heap[0].t <= until) {
    run_next(vc);
  }
  vc->now = until;
}

/* The router's usage counters summed over its workers: predicted and reported cached tokens. */
static void router_cached(const kvr_vcluster_t *vc, uint64_t *pred, uint64_t *rep) {
  *pred = *rep = 0;
  const kvr_router_t *r = vc->router;
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i]) {
      *pred += r->slots[i]->usage_predicted_cached_total;
      *rep += r->slots[i]->usage_cached_tokens_total;
    }
}

void kvr_vcluster_level_begin(kvr_vcluster_t *vc) {
  for (size_t i = 0; i < vc->o.workers; i++) {
    kvr_sim_stats_t st;
    kvr_sim_engine_stats(vc->w[i].eng, &st);
    vc->w[i].preempt_base = st.preemptions;
  }
  vc->kv_peak = 0;
  router_cached(vc, &vc->pred_base, &vc->rep_base);
  memset(&vc->mstats, 0, sizeof(vc->mstats));
}

void kvr_vcluster_mstats(const kvr_vcluster_t *vc, kvr_vcluster_mstats_t *out) {
  *out = vc->mstats;
}

void kvr_vcluster_level_end(kvr_vcluster_t *vc, kvr_level_t *lv) {
  if (lv == NULL)
    return;
  uint64_t pre = 0;
  for (size_t i = 0; i < vc->o.workers; i++) {
    kvr_sim_stats_t st;
    kvr_sim_engine_stats(vc->w[i].eng, &st);
    pre += st.preemptions - vc->w[i].preempt_base;
  }
  lv->engine_workers = vc->o.workers;
  lv->preemptions = pre;
  lv->kv_usage_peak = vc->kv_peak;
  uint64_t pred, rep;
  router_cached(vc, &pred, &rep);
  lv->router_cached_seen = true;
  lv->router_predicted_cached = pred - vc->pred_base;
  lv->router_reported_cached = rep - vc->rep_base;
  if (vc->fleet.n > 0) {
    lv->models_seen = true;
    lv->models_requests = vc->mstats.requests;
    lv->models_not_served = vc->mstats.not_served;
    lv->adapter_requests = vc->mstats.adapter_requests;
    for (size_t i = 0; i < 3; i++)
      lv->adapter_state[i] = vc->mstats.adapter_state[i];
  }
}

const char *kvr_vcluster_policy(const kvr_vcluster_t *vc) {
  return vc->oracle != NULL ? KVR_VCLUSTER_ORACLE : kvr_policy_name(vc->router->policy);
}

double kvr_vcluster_now(const kvr_vcluster_t *vc) {
  return secs(vc->now);
}

uint64_t kvr_vcluster_events(const kvr_vcluster_t *vc) {
  return vc->events;
}

void kvr_vcluster_describe(const kvr_vcluster_t *vc, kvr_buf_t *out) {
  kvr_buf_printf(out, "%zu workers of `kvrouter sim`'s engine (KV blocks", vc->o.workers);
  for (size_t i = 0; i < vc->o.workers; i++)
    kvr_buf_printf(out, "%s%u", i ? "/" : " ", vc->w[i].blocks);
  kvr_buf_printf(out,
                 ") behind the router core on one discrete-event clock; network %.3g ms per hop, "
                 "router %.3g ms per request, scrape every %llu ms (stale after %llu ms)",
                 vc->o.net_ms, vc->o.router_ms, (unsigned long long)vc->o.scrape_interval_ms,
                 (unsigned long long)vc->o.scrape_stale_ms);
  if (vc->fleet.n > 0) { /* a model fleet: who serves what */
    kvr_buf_puts(out, "; models: ");
    kvr_mfleet_describe(&vc->fleet, out);
    kvr_buf_printf(out, " (LoRA workers: --max-loras %u, adapters of rank %d)",
                   vc->o.max_loras ? vc->o.max_loras : 1, KVR_MFLEET_LORA_RANK);
  }
}

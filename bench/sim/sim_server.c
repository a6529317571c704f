/* sim_server.c -- the simulated vLLM worker's HTTP front: vLLM's OpenAI API over the pure engine.
 *
 * Structs:
 *   kvr_sim_server_t  the engines, the listener(s), the list of live streams, the current fault,
 *                     the served names and LoRA adapters, the Responses store and the clients
 *                     reading background streams.
 *   engine_t          one data-parallel engine: the simulated engine, its step clock (a timerfd
 *                     and its uv_poll_t), its KV-event publisher, the Prometheus figures vLLM
 *                     exports for it, the load balancer's counts.
 *   stream_t          one completion request: its HTTP request (until finished or aborted), its
 *                     engine request, its response framing (api_t: chat, completions, Responses or
 *                     Messages; streamed or not), its timestamps. Owned by the server's stream
 *                     list. A background Responses run is a stream without a client (detached):
 *                     its result goes to the store, its events (streamed) to the store's log.
 *   sub_t             a client reading a background stream's events from the store's log.
 *
 * Flow:
 *
 *   POST -> read_completion: kvr_sim_server_parse_completion (pure; 400/404 as vLLM), error fault
 *        (POST /v1/responses: kvr_sim_responses_read, responses_prepare (the store switch, the
 *         previous response, construct_input_messages); POST /v1/messages: messages_prepare
 *         (kvr_sim_anthropic_read); both render their messages as chat:
 *         kvr_sim_server_chat_prompt)
 *        -> pick_engine: X-data-parallel-rank (400 out of range) or lb_pick (Responses: lb_pick)
 *        -> stream_new: answer (seed, first word, length), id, SSE head
 *        -> stream_begin: hang fault | disconnect fault | fixed-latency timer
 *                         | kvr_sim_engine_set_now + kvr_sim_engine_add_ex -> engine_kick (idle:
 *                           arm the clock for when the API server hands the request over)
 *
 *   an engine's step clock fires (at most one armed per engine; none when it is idle):
 *     deliver the events of the step whose tokens are due (one SSE chunk or event per token in
 *     the stream's API, the ending events: finish_reason, usage, [DONE] or response.completed or
 *     message_stop) -> reap streams whose client went away (their engine request is removed,
 *     freeing slot and blocks) -> kvr_sim_engine_step() (the next step, which in simulated time
 *     started when the previous one ended) -> re-arm the timer for that step's deliver_s (its end
 *     plus the API server's output processing), divided by time_scale and scheduled against an
 *     absolute due time so rounding never drifts.
 *
 * Engine state is only changed at step boundaries: a client that disconnects while a step is in
 * flight is marked gone and reaped at the next tick, because that step's events still point at its
 * engine request (each engine reaps its own streams). Streams outside the engine (fixed-latency
 * mode, hung by the fault) have their own timer or none and are freed at once.
 *
 * Times reported (metrics) are simulated time: wall-clock intervals multiplied by time_scale.
 *
 * Invariants: a stream with http == NULL has been finished or aborted (or is detached) and will
 * get no more writes; every stream in the engine has ereq->data == stream; a store entry's running
 * points at a live detached stream or is NULL; a sub_t's request is open until its log is done;
 * pending_closes counts handles and listeners being closed, and done fires only when it is zero
 * after kvr_sim_server_close().
 */
#include "sim_server.h"

#include "base/kvr.h"
#include "base/list.h"
#include "base/log.h"
#include "base/metrics.h"
#include "net/http_route.h"
#include "net/http_server.h"
#include "sim_anthropic.h"
#include "sim_preset.h"
#include "sim_responses.h"
#include "sim_tokens.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <llhttp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BOS_TOKEN 128000u /* Llama-3's <|begin_of_text|>, prepended to text prompts */
#define LAG_RESET_NS (50 * 1000000ull)

/* vLLM's bucket bounds for its three latency histograms (vllm/v1/metrics/loggers.py). */
static const double ttft_buckets[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                      0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                      20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                     0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double e2e_buckets[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                     5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                     60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

typedef struct stream_s stream_t;

/* One data-parallel engine (vLLM's EngineCore of rank `rank`): the simulated engine, its clock
 * (a timerfd watched by a uv_poll_t: at most one step computed and not yet delivered), its KV
 * event publisher, the figures /metrics reports for it with engine="rank", and the load
 * balancer's view of its queue. Owned by kvr_sim_server_t.engines. */
typedef struct engine_s {
  kvr_sim_server_t *srv;
  uint32_t rank;
  kvr_sim_engine_t *eng;
  int step_fd;         /* timerfd of the engine clock (nanosecond precision) */
  uv_poll_t step_poll; /* watches step_fd */
  bool timer_active;   /* the engine clock is armed or its callback running */
  bool have_step;      /* step holds events not yet delivered */
  kvr_sim_step_t step;
  uint64_t due_ns;
  kvr_kv_pub_t *kv_pub; /* KV-event publisher, NULL when events are off */
  /* figures for /metrics beyond the engine's counters */
  kvr_hist_t ttft, itl, e2e;
  uint64_t finished_stop, finished_length, finished_abort;
  uint64_t fixed_prompt_tokens, fixed_generation_tokens;
  size_t nfixed, nhung;
  /* the API server's copy of (waiting, running), refreshed every 100 ms (simulated) and bumped
   * by each request it sends (vllm/v1/engine/core_client.py, get_core_engine_for_request) */
  uint32_t lb_waiting, lb_running;
} engine_t;

/* The API a stream answers in. */
typedef enum { API_CHAT, API_COMPLETIONS, API_RESPONSES, API_MESSAGES } api_t;

struct stream_s {
  kvr_sim_server_t *srv;
  kvr_http_req_t *http; /* NULL once finished or aborted */
  engine_t *e;          /* the data-parallel engine serving it */
  kvr_sim_req_t *ereq;  /* engine request; NULL in fixed-latency mode or when hung */
  kvr_list_t node;      /* in srv->streams until stream_destroy() */
  uv_timer_t timer;     /* fixed-latency mode only */
  bool has_timer;
  api_t api;
  bool chat; /* ids and chunks of a chat completion (chat and Messages) */
  bool stream, include_usage, continuous_usage;
  bool detached; /* a background response: no client, the store gets the result */
  bool gone;     /* the client went away; reaped at the next step boundary */
  bool hung;     /* held by the hang fault */
  uint32_t prompt_tokens, cached_tokens, max_output, sent;
  kvr_sim_finish_t stop_reason;
  uint64_t gen_seed;
  uint32_t gen_offset;       /* word number of the first token (a continued answer) */
  uint32_t disconnect_after; /* UINT32_MAX: never */
  uint64_t arrival_ns, last_ns, due_ns;
  kvr_buf_t prefix;     /* 'data: {"id":...,"model":...,' shared by every chunk */
  kvr_buf_t text;       /* the answer so far, for non-streamed responses (and Responses streams) */
  kvr_buf_t echo;       /* "echo": text that goes out before the answer */
  kvr_sim_resp_t *resp; /* API_RESPONSES: the response (owned) */
  char *model;          /* the reply's "model": the first served name or the adapter's (owned) */
  int32_t lora;         /* index in srv->loras, -1: the base model */
  char id[48];
};

static void subs_notify(kvr_sim_server_t *srv, const char *id);

typedef struct retire_s {
  kvr_sim_server_t *srv;
  kvr_http_server_t *http;
} retire_t;

struct kvr_sim_server_s {
  uv_loop_t *loop;
  kvr_sim_server_opts_t opts;
  char *listen, *admin_listen, *model; /* owned copies of the opts strings; model: --model */
  char **names;                        /* the served names (owned), names[0] the reply's */
  size_t nnames;
  kvr_sim_models_t models; /* names, and the adapters' names (loras' own strings) */
  kvr_sim_loras_t loras;   /* the LoRA adapters (sim_lora.h); empty without LoRA */
  bool lora_on;            /* engine max_loras >= 1 */
  bool lora_runtime;       /* VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load/unload routes exist */
  char bound[160];         /* main listener's "HOST:PORT" as bound, to listen again */
  int port;                /* its port, also while refusing */
  engine_t *engines;       /* --data-parallel-size of them, engines[r].rank == r */
  uint32_t ndp;
  double lb_stamp_s; /* simulated time the load balancer's counts were last refreshed */
  kvr_http_limits_t limits;
  kvr_http_server_t *http, *admin;
  uv_timer_t refuse_timer;
  double late_ns; /* moving average of how late timers fire after their due time */
  kvr_sim_fault_t fault;
  kvr_list_t streams; /* live streams (stream_t.node), newest first */
  size_t nstreams, ngone;
  uint64_t rng, ids;
  uint64_t id_salt; /* random per process: ids are unique across sims whatever their seeds, as
                       vLLM's uuid4-based ids are (vllm/utils random_uuid) */
  bool closing;
  int pending_closes;
  void (*done)(void *data);
  void *done_data;
  kvr_buf_t scratch;
  bool store_enabled;      /* VLLM_ENABLE_RESPONSES_API_STORE=1 */
  kvr_sim_rstore_t *store; /* the Responses store (empty unless enabled) */
  kvr_list_t subs;         /* sub_t.node: clients of background streams' events */
};

/* A client reading a background response's events (the POST that started it, or a GET
 * ?stream=true): sent what the store's event log holds from event `next` on, and more as the run
 * adds them; finished once the log is done. Owned by srv->subs. */
typedef struct sub_s {
  kvr_list_t node;
  kvr_http_req_t *req;
  char *id;    /* the response's id (looked up again each time: the store may drop it) */
  size_t next; /* the next event to send */
} sub_t;

/* ---- options and faults ---- */

static const char *const fault_names[] = {
#define XX(name, str) str,
    KVR_SIM_FAULT_MAP(XX)
#undef XX
};

const char *kvr_sim_fault_mode_name(kvr_sim_fault_mode_t mode) {
  return mode < KVR_SIM_FAULT_COUNT ? fault_names[mode] : "unknown";
}

int kvr_sim_fault_parse_mode(const char *s, kvr_sim_fault_mode_t *out) {
  for (int i = 0; i < KVR_SIM_FAULT_COUNT; i++) {
    if (strcmp(s, fault_names[i]) == 0) {
      *out = (kvr_sim_fault_mode_t)i;
      return 0;
    }
  }
  return KVR_EINVAL;
}

void kvr_sim_fault_default(kvr_sim_fault_t *fault, kvr_sim_fault_mode_t mode) {
  memset(fault, 0, sizeof(*fault));
  fault->mode = mode;
  fault->status = 500;
  fault->rate = 1.0;
  fault->after_tokens = 0;
  fault->delay_ms = 100.0;
  fault->duration_ms = 0.0;
}

void kvr_sim_server_opts_default(kvr_sim_server_opts_t *opts) {
  memset(opts, 0, sizeof(*opts));
  kvr_sim_config_default(&opts->engine);
  opts->listen = "127.0.0.1:8000";
  opts->admin_listen = NULL;
  opts->model = "meta-llama/Llama-3.3-70B-Instruct";
  opts->time_scale = 1.0;
  opts->seed = 0;
  opts->output_len_mean = 830;
  opts->fixed_ttft_ms = -1;
  opts->fixed_itl_ms = -1;
  kvr_sim_fault_default(&opts->fault, KVR_SIM_FAULT_NONE);
  kvr_kv_events_config_default(&opts->kv_events);
  opts->kv_encoding = KVR_KV_ENCODING_MAP;
  opts->max_lora_rank = 16;
  opts->data_parallel_size = 1;
}

static double sim_seconds(const kvr_sim_server_t *srv, uint64_t wall_ns) {
  return (double)wall_ns * 1e-9 * srv->opts.time_scale;
}

/* Wall-clock nanoseconds of t simulated seconds (an instant, the inverse of sim_seconds, or a
 * duration); HUGE_VAL (never) gives UINT64_MAX. */
static uint64_t wall_ns_of_sim_s(const kvr_sim_server_t *srv, double t) {
  double ns = t * 1e9 / srv->opts.time_scale;
  return ns < 1.8e19 ? (uint64_t)ns : UINT64_MAX;
}

static uint64_t wall_ns_of_sim_ms(const kvr_sim_server_t *srv, double sim_ms) {
  return wall_ns_of_sim_s(srv, sim_ms * 1e-3);
}

static double rng_uniform(kvr_sim_server_t *srv) {
  return (double)(kvr_sim_tokens_mix(srv->opts.seed ^ kvr_sim_tokens_mix(++srv->rng)) >> 11) *
         0x1.0p-53;
}

/* ---- streams: chunks and endings ---- */

/* The usage object, as vLLM's OpenAI server writes it: prompt_tokens_details only when the server
 * runs with --enable-prompt-tokens-details (vLLM's _make_prompt_tokens_details() in
 * vllm/entrypoints/openai/chat_completion/serving.py returns None without it, and None fields are
 * left out), then with cached_tokens even when 0 (older vLLM left it out at 0; the router copes
 * with both). */
static void usage_json(kvr_buf_t *b, const stream_t *s) {
  kvr_buf_printf(b, "{\"prompt_tokens\":%u,\"total_tokens\":%u,\"completion_tokens\":%u",
                 s->prompt_tokens, s->prompt_tokens + s->sent, s->sent);
  if (s->srv->opts.enable_prompt_tokens_details)
    kvr_buf_printf(b, ",\"prompt_tokens_details\":{\"cached_tokens\":%u}", s->cached_tokens);
  kvr_buf_puts(b, "}");
}

static const char *finish_name(kvr_sim_finish_t f) {
  return f == KVR_SIM_FINISH_STOP ? "stop" : "length";
}

/* Appends the SSE chunk carrying text (a token's word, or what echo sends before it); final adds
 * finish_reason. The first chunk (first) carries the role (chat) and "kvr_sim_engine_us": the
 * wall-clock microseconds from the whole request having been read to this chunk, the part of the
 * client's TTFT the time scale compresses (the load generator scales only that part; clients of
 * the OpenAI API ignore unknown keys). */
static void chunk_token(kvr_buf_t *b, const stream_t *s, const char *text, size_t len, bool first,
                        bool final, uint64_t now) {
  kvr_buf_append(b, s->prefix.data, s->prefix.len);
  if (first)
    kvr_buf_printf(b, "\"kvr_sim_engine_us\":%llu,",
                   (unsigned long long)((now - s->arrival_ns) / 1000u));
  if (s->chat) {
    kvr_buf_puts(b, "\"choices\":[{\"index\":0,\"delta\":{");
    if (first)
      kvr_buf_puts(b, "\"role\":\"assistant\",");
    kvr_buf_puts(b, "\"content\":");
    kvr_buf_json_str(b, text, len);
    kvr_buf_puts(b, "},\"logprobs\":null,\"finish_reason\":");
  } else {
    kvr_buf_puts(b, "\"choices\":[{\"index\":0,\"text\":");
    kvr_buf_json_str(b, text, len);
    kvr_buf_puts(b, ",\"logprobs\":null,\"finish_reason\":");
  }
  if (final)
    kvr_buf_printf(b, "\"%s\",\"stop_reason\":null}]", finish_name(s->stop_reason));
  else
    kvr_buf_puts(b, s->chat ? "null}]" : "null,\"stop_reason\":null}]");
  if (s->continuous_usage) {
    kvr_buf_puts(b, ",\"usage\":");
    usage_json(b, s);
  }
  kvr_buf_puts(b, "}\n\n");
}

static void stream_release(stream_t *s, bool abort_conn) {
  if (s->http == NULL)
    return;
  kvr_http_req_t *req = s->http;
  s->http = NULL;
  req->data = NULL;
  req->on_close = NULL;
  if (abort_conn)
    kvr_http_abort(req);
  else
    kvr_http_finish(req);
}

static void stream_free_mem(stream_t *s) {
  kvr_buf_free(&s->prefix);
  kvr_buf_free(&s->text);
  kvr_buf_free(&s->echo);
  kvr_sim_resp_free(s->resp);
  free(s->model);
  free(s);
}

static void on_stream_timer_close(uv_handle_t *h) {
  stream_t *s = h->data;
  kvr_sim_server_t *srv = s->srv;
  stream_free_mem(s);
  srv->pending_closes--;
  if (srv->closing && srv->pending_closes == 0 && srv->done) {
    void (*done)(void *) = srv->done;
    srv->done = NULL;
    done(srv->done_data);
  }
}

/* Unlinks and frees s (its HTTP request must have been released). */
static void stream_destroy(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  stream_release(s, true);
  kvr_list_remove(&s->node);
  srv->nstreams--;
  if (s->gone)
    srv->ngone--;
  if (s->hung)
    s->e->nhung--;
  if (s->ereq) {
    kvr_sim_engine_remove(s->e->eng, s->ereq);
    s->ereq = NULL;
  }
  if (s->detached) {
    /* a background run ends (done, cancelled or refused): its store entry no longer points at
     * it, and its event log is closed, which ends the streams reading it */
    kvr_sim_stored_t *en = kvr_sim_rstore_get(srv->store, kvr_sim_resp_id(s->resp));
    if (en != NULL && en->running == s)
      en->running = NULL;
    if (en != NULL && en->has_events && !en->events_done) {
      en->events_done = true;
      subs_notify(srv, en->id);
    }
  }
  if (s->has_timer) {
    s->e->nfixed--;
    srv->pending_closes++;
    uv_close((uv_handle_t *)&s->timer, on_stream_timer_close);
    return;
  }
  stream_free_mem(s);
}

/* The client went away or the fault closed it: count the abort and free what it holds, now or at
 * the next step boundary when the in-flight step's events may still point at it. */
static void stream_gone(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  if (s->gone)
    return;
  s->gone = true;
  srv->ngone++;
  s->e->finished_abort++;
  stream_release(s, true);
  if (s->has_timer)
    uv_timer_stop(&s->timer);
  if (s->ereq == NULL || !s->e->have_step)
    stream_destroy(s);
}

static void on_req_close(kvr_http_req_t *req) {
  stream_t *s = req->data;
  if (s != NULL)
    stream_gone(s);
}

/* The chat.completion / text_completion object of the whole answer (echo first). */
static void full_completion(kvr_buf_t *b, const stream_t *s) {
  const char *fin = finish_name(s->stop_reason);
  kvr_buf_t all = KVR_BUF_INIT;
  kvr_buf_append(&all, s->echo.data, s->echo.len);
  kvr_buf_append(&all, s->text.data, s->text.len);
  /* the chunk prefix minus its "data: " is the response's id/object/created/model head */
  kvr_buf_puts(b, "{\"id\":\"");
  kvr_buf_puts(b, s->id);
  kvr_buf_printf(b, "\",\"object\":\"%s\",\"created\":%lld,\"model\":",
                 s->chat ? "chat.completion" : "text_completion", (long long)time(NULL));
  kvr_buf_json_str(b, s->model, strlen(s->model));
  if (s->chat) {
    kvr_buf_puts(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
    kvr_buf_json_str(b, all.data ? all.data : "", all.len);
    kvr_buf_printf(b,
                   ",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":\"%s\","
                   "\"stop_reason\":null}],\"usage\":",
                   fin);
    usage_json(b, s);
    kvr_buf_puts(b, ",\"prompt_logprobs\":null}");
  } else {
    kvr_buf_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
    kvr_buf_json_str(b, all.data ? all.data : "", all.len);
    kvr_buf_printf(b,
                   ",\"logprobs\":null,\"finish_reason\":\"%s\",\"stop_reason\":null,"
                   "\"prompt_logprobs\":null}],\"usage\":",
                   fin);
    usage_json(b, s);
    kvr_buf_puts(b, "}");
  }
  kvr_buf_free(&all);
}

/* The usage a Messages reply reports (cached -1: no prompt tokens details, as vLLM without
 * --enable-prompt-tokens-details). */
static kvr_sim_msg_usage_t msg_usage(const stream_t *s) {
  kvr_sim_msg_usage_t u = {.prompt = s->prompt_tokens, .output = s->sent, .cached = -1};
  if (s->srv->opts.enable_prompt_tokens_details)
    u.cached = (int32_t)s->cached_tokens;
  return u;
}

/* A Responses answer is done: its object gets output, status and usage (responses_done), then
 * goes to the store when it is stored (responses_store), unless a cancel got there first, as
 * vLLM's responses_full_generator checks. */
static void responses_done(stream_t *s) {
  kvr_sim_resp_finish(s->resp, s->text.data, s->text.len, s->stop_reason == KVR_SIM_FINISH_LENGTH,
                      s->prompt_tokens, s->cached_tokens, s->sent);
}

static void responses_store(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  kvr_sim_resp_t *r = s->resp;
  if (!r->store)
    return;
  kvr_sim_stored_t *en = kvr_sim_rstore_get(srv->store, kvr_sim_resp_id(r));
  if (en != NULL && strcmp(kvr_sim_responses_status(en->obj), "cancelled") == 0)
    return;
  kvr_sim_rstore_put(srv->store, kvr_sim_resp_id(r), cJSON_Duplicate(r->obj, true), r->messages);
  r->messages = NULL;
}

/* Sends the non-streamed response with the whole answer (a background one only updates the
 * store). */
static void respond_full(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  if (s->api == API_RESPONSES) {
    responses_done(s);
    kvr_sim_responses_print(b, s->resp->obj);
    responses_store(s);
  } else if (s->api == API_MESSAGES) {
    kvr_sim_msg_usage_t u = msg_usage(s);
    kvr_sim_anthropic_reply(b, s->id, s->model, s->text.data, s->text.len,
                            s->stop_reason == KVR_SIM_FINISH_LENGTH, &u);
  } else {
    full_completion(b, s);
  }
  kvr_http_req_t *req = s->http;
  if (req == NULL)
    return; /* detached */
  s->http = NULL;
  req->data = NULL;
  req->on_close = NULL;
  kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
}

/* Appends to b what a streamed chat or completion sends for word: the echo (chat: a chunk of its
 * own before the first token; completions: with the first token's text), the token's chunk, and
 * after the last token the usage chunk and [DONE]. */
static void emit_completion(kvr_buf_t *b, stream_t *s, const char *word, bool first, bool final,
                            uint64_t now) {
  if (first && s->echo.len > 0 && s->chat) {
    chunk_token(b, s, s->echo.data, s->echo.len, true, false, now);
    first = false;
  }
  if (first && s->echo.len > 0) {
    kvr_buf_append(&s->echo, word, KVR_SIM_TOKEN_BYTES);
    chunk_token(b, s, s->echo.data, s->echo.len, true, final, now);
  } else {
    chunk_token(b, s, word, KVR_SIM_TOKEN_BYTES, first, final, now);
  }
  if (!final)
    return;
  if (s->include_usage) {
    kvr_buf_append(b, s->prefix.data, s->prefix.len);
    kvr_buf_puts(b, "\"choices\":[],\"usage\":");
    usage_json(b, s);
    kvr_buf_puts(b, "}\n\n");
  }
  kvr_buf_puts(b, "data: [DONE]\n\n");
}

/* The same for the Responses and Messages streams (their events, sim_responses.h and
 * sim_anthropic.h). */
static void emit_events(kvr_buf_t *b, stream_t *s, const char *word, bool first, bool final) {
  if (s->api == API_RESPONSES) {
    kvr_sim_resp_ev_token(b, s->resp, word, KVR_SIM_TOKEN_BYTES);
    if (final) {
      responses_done(s);
      kvr_sim_resp_ev_end(b, s->resp, s->text.data, s->text.len);
      responses_store(s);
    }
    return;
  }
  if (first)
    kvr_sim_anthropic_ev_start(b, s->id, s->model, s->prompt_tokens);
  kvr_sim_anthropic_ev_delta(b, word, KVR_SIM_TOKEN_BYTES);
  if (final) {
    kvr_sim_msg_usage_t u = msg_usage(s);
    kvr_sim_anthropic_ev_end(b, s->stop_reason == KVR_SIM_FINISH_LENGTH, &u);
  }
}

/* A background stream's events go to its store entry's log and on to the clients reading it;
 * the last ones close the log. */
static void background_events(stream_t *s, const kvr_buf_t *b, bool final) {
  kvr_sim_server_t *srv = s->srv;
  const char *id = kvr_sim_resp_id(s->resp);
  kvr_sim_stored_t *en = kvr_sim_rstore_get(srv->store, id);
  if (en != NULL) {
    kvr_sim_stored_add_events(en, b->data, b->len);
    en->events_done = final;
  }
  subs_notify(srv, id);
}

/* Delivers the stream's next token; returns true when the stream has ended (and may be freed). */
static bool stream_emit(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  uint64_t now = kvr_now_ns();
  if (s->sent >= s->disconnect_after) {
    stream_gone(s);
    return true;
  }
  if (s->sent == 0)
    kvr_hist_observe(&s->e->ttft, sim_seconds(srv, now - s->arrival_ns));
  else
    kvr_hist_observe(&s->e->itl, sim_seconds(srv, now - s->last_ns));
  s->last_ns = now;
  if (s->ereq != NULL && s->ereq->num_cached > 0)
    s->cached_tokens = (uint32_t)s->ereq->num_cached;
  char word[KVR_SIM_TOKEN_BYTES];
  kvr_sim_tokens_word(s->gen_seed, s->gen_offset + s->sent, word);
  bool first = s->sent == 0;
  s->sent++;
  bool final = s->sent >= s->max_output;
  if (s->ereq == NULL)
    s->e->fixed_generation_tokens++;
  if (!s->stream || s->api == API_RESPONSES)
    kvr_buf_append(&s->text, word, sizeof(word));
  if (!s->stream) {
    if (!final)
      return false;
  } else {
    kvr_buf_t *b = &srv->scratch;
    kvr_buf_reset(b);
    if (s->api == API_CHAT || s->api == API_COMPLETIONS)
      emit_completion(b, s, word, first, final, now);
    else
      emit_events(b, s, word, first, final);
    if (s->detached)
      background_events(s, b, final);
    else
      kvr_http_write(s->http, b->data, b->len);
    if (!final)
      return false;
  }
  kvr_hist_observe(&s->e->e2e, sim_seconds(srv, now - s->arrival_ns));
  if (s->stop_reason == KVR_SIM_FINISH_STOP)
    s->e->finished_stop++;
  else
    s->e->finished_length++;
  if (s->stream)
    stream_release(s, false);
  else
    respond_full(s);
  return true;
}

/* ---- the engine clock ---- */

/* Fixed-latency streams use libuv timers, which have millisecond resolution and run off a coarse
 * clock, so they fire on average about a millisecond after the time asked for. They are armed
 * against an absolute due time, and the average lateness observed so far is subtracted from the
 * wait: errors stay below a millisecond and do not accumulate. */
static void timer_arm(kvr_sim_server_t *srv, uv_timer_t *t, uv_timer_cb cb, uint64_t due_ns) {
  uv_update_time(srv->loop);
  double wait_ns = (double)due_ns - (double)kvr_now_ns() - srv->late_ns;
  uv_timer_start(t, cb, wait_ns > 0 ? (uint64_t)(wait_ns / 1e6 + 0.5) : 0, 0);
}

static void timer_fired(kvr_sim_server_t *srv, uint64_t due_ns) {
  double late = (double)kvr_now_ns() - (double)due_ns;
  if (late > -2e6 && late < 5e6)
    srv->late_ns = 0.95 * srv->late_ns + 0.05 * late;
}

static void on_step(uv_poll_t *p, int status, int events);

/* The engine clock is a timerfd armed at an absolute CLOCK_MONOTONIC time (the clock kvr_now_ns()
 * reads), watched by one uv_poll_t: steps of 2 ms at --time-scale 10 keep their exact length,
 * which libuv's millisecond timers could not give. */
static void step_clock_arm(engine_t *e, uint64_t due_ns) {
  struct itimerspec its;
  memset(&its, 0, sizeof(its));
  due_ns = KVR_MAX(due_ns, 1u); /* 0 would disarm; a time in the past fires at once */
  its.it_value.tv_sec = (time_t)(due_ns / 1000000000u);
  its.it_value.tv_nsec = (long)(due_ns % 1000000000u);
  timerfd_settime(e->step_fd, TFD_TIMER_ABSTIME, &its, NULL);
  uv_poll_start(&e->step_poll, UV_READABLE, on_step);
}

static void engine_kick(engine_t *e) {
  kvr_sim_server_t *srv = e->srv;
  if (e->timer_active || srv->closing)
    return;
  e->timer_active = true;
  e->have_step = false;
  /* Idle: the first step starts when the API server has handed the request over. */
  e->due_ns = KVR_MAX(wall_ns_of_sim_s(srv, kvr_sim_engine_next_start(e->eng)), kvr_now_ns());
  step_clock_arm(e, e->due_ns);
}

/* Frees the streams of engine e whose client went away (at e's step boundary: no step of e holds
 * events pointing at them). */
static void reap_gone(engine_t *e) {
  kvr_sim_server_t *srv = e->srv;
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, &srv->streams) {
    if (srv->ngone == 0)
      break;
    stream_t *s = KVR_CONTAINER_OF(q, stream_t, node);
    if (s->gone && s->e == e)
      stream_destroy(s);
  }
}

static void deliver(kvr_sim_server_t *srv, const kvr_sim_step_t *st) {
  for (size_t i = 0; i < st->nevents; i++) {
    const kvr_sim_event_t *ev = &st->events[i];
    stream_t *s = ev->req->data;
    if (s == NULL || s->gone || ev->new_tokens == 0)
      continue;
    if (stream_emit(s) && !s->gone)
      stream_destroy(s);
  }
}

/* Sends what engine e logged since its last batch (nothing when events are off). */
static void publish_kv_events(engine_t *e) {
  if (e->kv_pub == NULL)
    return;
  kvr_kv_pub_publish(e->kv_pub, kvr_sim_engine_kv_log(e->eng), e->srv->opts.engine.block_size);
  kvr_sim_engine_kv_log_clear(e->eng);
}

/* The adapters of the engine's running or waiting requests, names joined by "," (vLLM's
 * IterationStats running_lora_adapters / waiting_lora_adapters keys). */
static void lora_names_of(const engine_t *e, bool running, kvr_buf_t *out) {
  const kvr_sim_req_t *reqs[64];
  size_t n = KVR_MIN(kvr_sim_engine_loras(e->eng, running, reqs, 64), (size_t)64);
  kvr_buf_reset(out);
  kvr_buf_puts(out, "");
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      kvr_buf_puts(out, ",");
    kvr_buf_puts(out, reqs[i]->lora_name);
  }
}

/* vllm:lora_requests_info is set to the time at every step's stats (loggers.py record(), once per
 * engine: with data parallelism each engine's record sets it with that engine's adapters). */
static void lora_info_update(engine_t *e) {
  kvr_sim_server_t *srv = e->srv;
  if (!srv->lora_on)
    return;
  kvr_buf_t running = KVR_BUF_INIT, waiting = KVR_BUF_INIT;
  lora_names_of(e, true, &running);
  lora_names_of(e, false, &waiting);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  kvr_sim_loras_info_set(&srv->loras, srv->opts.engine.max_loras, waiting.data, running.data,
                         (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
  kvr_buf_free(&running);
  kvr_buf_free(&waiting);
}

static void on_step(uv_poll_t *p, int status, int events) {
  engine_t *e = p->data;
  kvr_sim_server_t *srv = e->srv;
  uint64_t expirations;
  (void)events;
  if (read(e->step_fd, &expirations, sizeof(expirations)) < 0 && status == 0)
    return; /* spurious wake-up: not expired yet */
  uv_poll_stop(p);
  if (e->have_step) {
    deliver(srv, &e->step);
    publish_kv_events(e);
    lora_info_update(e);
  }
  e->have_step = false;
  reap_gone(e);
  if (!kvr_sim_engine_busy(e->eng)) {
    e->timer_active = false;
    return;
  }
  uint64_t now = kvr_now_ns();
  if (wall_ns_of_sim_s(srv, kvr_sim_engine_next_start(e->eng)) + LAG_RESET_NS < now)
    kvr_sim_engine_skip_to(e->eng, sim_seconds(srv, now)); /* fell behind: do not burst */
  /* The step is computed now, as it starts in simulated time (its admission cut-off is in the
   * past, so nothing that arrives meanwhile could have joined it); its tokens go out when the
   * API server has processed them. */
  kvr_sim_engine_step(e->eng, &e->step);
  e->have_step = true;
  uint64_t due = wall_ns_of_sim_s(srv, e->step.deliver_s);
  if (e->step.num_seqs == 0 || due <= e->due_ns)
    due = e->due_ns + 100000; /* nothing was scheduled: look again in 0.1 ms */
  e->due_ns = due;
  step_clock_arm(e, e->due_ns);
}

/* Fixed-latency mode: each stream has its own timer, first token at ttft, then one every itl. */
static void on_fixed_timer(uv_timer_t *t) {
  stream_t *s = t->data;
  kvr_sim_server_t *srv = s->srv;
  timer_fired(srv, s->due_ns);
  if (stream_emit(s)) {
    if (!s->gone)
      stream_destroy(s);
    return;
  }
  double itl = srv->opts.fixed_itl_ms;
  if (srv->fault.mode == KVR_SIM_FAULT_SLOW)
    itl += srv->fault.delay_ms;
  s->due_ns += wall_ns_of_sim_ms(srv, itl);
  timer_arm(srv, t, on_fixed_timer, s->due_ns);
}

/* ---- request parsing (pure: a JSON body in, a kvr_sim_completion_t or vLLM's error out) ---- */

#define PROMPT_SHAPE "prompt: must be a string, a list with one string, or a list of token ids"

static int get_int(const cJSON *body, const char *name, int64_t *out, char *err, size_t errlen) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
  if (v == NULL || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
      fabs(v->valuedouble) > 1e15) {
    snprintf(err, errlen, "%s: Input should be a valid integer", name);
    return KVR_EINVAL;
  }
  *out = (int64_t)v->valuedouble;
  return 1;
}

static int get_bool(const cJSON *obj, const char *name, bool *out, char *err, size_t errlen) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  if (v == NULL || cJSON_IsNull(v))
    return 0;
  if (!cJSON_IsBool(v)) {
    snprintf(err, errlen, "%s: Input should be a valid boolean", name);
    return KVR_EINVAL;
  }
  *out = cJSON_IsTrue(v);
  return 1;
}

/* "model": absent or null (the base model), a served name, or an adapter's name (*lora its
 * index, else -1); another name is vLLM's 404 (OpenAIServing._check_model: the base model paths'
 * names, then the LoRA requests' lora_name, vllm/entrypoints/openai/engine/serving.py). */
static int parse_model(const cJSON *body, const kvr_sim_models_t *m, int32_t *lora, char *err,
                       size_t errlen) {
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
  *lora = -1;
  if (model == NULL || cJSON_IsNull(model))
    return 0;
  if (!cJSON_IsString(model)) {
    snprintf(err, errlen, "model: Input should be a valid string");
    return 400;
  }
  for (size_t i = 0; i < m->nnames; i++) {
    if (strcmp(model->valuestring, m->names[i]) == 0)
      return 0;
  }
  for (size_t i = 0; i < m->nloras; i++) {
    if (strcmp(model->valuestring, m->loras[i]) == 0) {
      *lora = (int32_t)i;
      return 0;
    }
  }
  snprintf(err, errlen, "The model `%.200s` does not exist.", model->valuestring);
  return 404;
}

/* "stream", "ignore_eos", and "stream_options" (allowed with stream=true only). */
static int parse_stream_flags(const cJSON *body, kvr_sim_completion_t *p, char *err,
                              size_t errlen) {
  if (get_bool(body, "stream", &p->stream, err, errlen) < 0 ||
      get_bool(body, "ignore_eos", &p->ignore_eos, err, errlen) < 0)
    return 400;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
  if (so == NULL || cJSON_IsNull(so))
    return 0;
  if (!cJSON_IsObject(so)) {
    snprintf(err, errlen, "stream_options: Input should be a valid dictionary");
    return 400;
  }
  if (!p->stream) {
    snprintf(err, errlen, "Stream options can only be defined when `stream=True`.");
    return 400;
  }
  if (get_bool(so, "include_usage", &p->include_usage, err, errlen) < 0 ||
      get_bool(so, "continuous_usage_stats", &p->continuous_usage, err, errlen) < 0)
    return 400;
  return 0;
}

/* "n" (1 only), "max_completion_tokens" (chat, before "max_tokens"), "max_tokens", "min_tokens"
 * and "seed": integers, with the bounds vLLM checks between them. */
static int parse_lengths(const cJSON *body, bool chat, kvr_sim_completion_t *p, char *err,
                         size_t errlen) {
  int64_t n = 1, seed = 0;
  if (get_int(body, "n", &n, err, errlen) < 0)
    return 400;
  if (n != 1) {
    snprintf(err, errlen, "n: kvrouter sim only supports n=1");
    return 400;
  }
  int rc = chat ? get_int(body, "max_completion_tokens", &p->max_tokens, err, errlen) : 0;
  if (rc == 0)
    rc = get_int(body, "max_tokens", &p->max_tokens, err, errlen);
  if (rc < 0 || get_int(body, "min_tokens", &p->min_tokens, err, errlen) < 0 ||
      get_int(body, "seed", &seed, err, errlen) < 0)
    return 400;
  if (rc > 0 && p->max_tokens < 1) {
    snprintf(err, errlen, "max_tokens must be at least 1, got %lld.", (long long)p->max_tokens);
    return 400;
  }
  if (p->min_tokens < 0) {
    snprintf(err, errlen, "min_tokens must be greater than or equal to 0, got %lld.",
             (long long)p->min_tokens);
    return 400;
  }
  if (p->max_tokens > 0 && p->min_tokens > p->max_tokens) {
    snprintf(err, errlen, "min_tokens must be less than or equal to max_tokens=%lld, got %lld.",
             (long long)p->max_tokens, (long long)p->min_tokens);
    return 400;
  }
  p->seed = (uint64_t)seed;
  return 0;
}

int kvr_sim_server_chat_prompt(const cJSON *messages, kvr_sim_render_t *r, kvr_sim_completion_t *p,
                               char *err, size_t errlen) {
  kvr_buf_t text = KVR_BUF_INIT;
  if (kvr_sim_tokens_render(messages, r, &text, err, errlen) != 0) {
    kvr_buf_free(&text);
    return 400;
  }
  kvr_sim_toks_push(&p->prompt, BOS_TOKEN);
  kvr_sim_tokens_encode(text.data, text.len, &p->prompt);
  kvr_buf_free(&text);
  if (r->continue_final) {
    /* the answer started right after the final message's header: BOS + that many 4-byte chunks;
     * the words already in its content come before the ones it generates now */
    p->turn_prefix = (uint32_t)(1 + r->final_content_at / KVR_SIM_TOKEN_BYTES);
    p->gen_offset = (uint32_t)p->prompt.n - p->turn_prefix;
  }
  return 0;
}

/* Chat: "messages" rendered with the template of sim_tokens.h, BOS first, as
 * add_generation_prompt and continue_final_message say. With continue_final_message vLLM hands
 * the tokenizer add_generation_prompt as well (its default, true, unless the request says false:
 * chat_completion/protocol.py build_chat_params), and transformers' apply_chat_template refuses
 * the pair; vLLM turns the template error into a 400 (renderers/hf.py). */
static int parse_chat_prompt(const cJSON *body, kvr_sim_completion_t *p, char *err, size_t errlen) {
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
  if (messages == NULL) {
    snprintf(err, errlen, "messages: Field required");
    return 400;
  }
  if (p->continue_final_message && p->add_generation_prompt) {
    snprintf(err, errlen,
             "continue_final_message and add_generation_prompt are not compatible. Use "
             "continue_final_message when you want the model to continue the final message, and "
             "add_generation_prompt when you want to add a header that will prompt it to start a "
             "new assistant message instead.");
    return 400;
  }
  kvr_sim_render_t r = {.generation_prompt = p->add_generation_prompt,
                        .continue_final = p->continue_final_message};
  return kvr_sim_server_chat_prompt(messages, &r, p, err, errlen);
}

/* A non-empty array of token ids in [0, vocabulary + 256), taken as they are (no BOS). */
static int parse_token_ids(const cJSON *prompt, kvr_sim_completion_t *p, char *err, size_t errlen) {
  const cJSON *id;
  cJSON_ArrayForEach(id, prompt) {
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= KVR_SIM_VOCAB + 256 ||
        id->valuedouble != floor(id->valuedouble)) {
      snprintf(err, errlen, PROMPT_SHAPE);
      return 400;
    }
    kvr_sim_toks_push(&p->prompt, (uint32_t)id->valuedouble);
  }
  return 0;
}

/* Completions: "prompt" as a string (or a list of one string), BOS first, or as token ids. */
static int parse_text_prompt(const cJSON *body, kvr_sim_completion_t *p, char *err, size_t errlen) {
  const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
  if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1 &&
      cJSON_IsString(cJSON_GetArrayItem(prompt, 0)))
    prompt = cJSON_GetArrayItem(prompt, 0);
  if (cJSON_IsString(prompt)) {
    kvr_sim_toks_push(&p->prompt, BOS_TOKEN);
    kvr_sim_tokens_encode(prompt->valuestring, strlen(prompt->valuestring), &p->prompt);
    return 0;
  }
  if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) > 0)
    return parse_token_ids(prompt, p, err, errlen);
  snprintf(err, errlen, "%s", prompt ? PROMPT_SHAPE : "prompt: Field required");
  return 400;
}

/* The prompt must leave room in max_len; a missing max_tokens becomes vLLM's default (chat: all
 * the room left, completions: 16), and prompt + max_tokens must fit. */
static int fit_context(uint32_t max_len, bool chat, kvr_sim_completion_t *p, char *err,
                       size_t errlen) {
  if (p->prompt.n >= max_len) {
    snprintf(err, errlen,
             "This model's maximum context length is %u tokens. However, your request has %zu "
             "input tokens. Please reduce the length of the input messages.",
             max_len, p->prompt.n);
    return 400;
  }
  if (p->max_tokens < 0)
    p->max_tokens = chat ? (int64_t)(max_len - p->prompt.n) : 16;
  if ((uint64_t)p->prompt.n + (uint64_t)p->max_tokens > max_len) {
    snprintf(err, errlen,
             "This model's maximum context length is %u tokens. However, you requested %llu "
             "tokens (%zu in the messages, %lld in the completion). Please reduce the length of "
             "the messages or completion.",
             max_len, (unsigned long long)(p->prompt.n + (uint64_t)p->max_tokens), p->prompt.n,
             (long long)p->max_tokens);
    return 400;
  }
  return 0;
}

/* The request models' "before" validators, which pydantic runs ahead of everything else: chat's
 * check_generation_prompt (both flags true) and check_cache_salt_support (chat and completions:
 * chat_completion/protocol.py, completion/protocol.py). 400 "Bad Request" (e filled) or 0. */
static int parse_validators(const cJSON *body, bool chat, kvr_sim_completion_t *p,
                            kvr_sim_err_t *e) {
  const cJSON *cont = cJSON_GetObjectItemCaseSensitive(body, "continue_final_message");
  const cJSON *gen = cJSON_GetObjectItemCaseSensitive(body, "add_generation_prompt");
  if (chat && cJSON_IsTrue(cont) && cJSON_IsTrue(gen))
    return kvr_sim_err_validation(e, NULL, NULL, "value_error",
                                  "Value error, Cannot set both `continue_final_message` and "
                                  "`add_generation_prompt` to True.");
  const cJSON *salt = cJSON_GetObjectItemCaseSensitive(body, "cache_salt");
  if (salt != NULL && !cJSON_IsNull(salt) &&
      (!cJSON_IsString(salt) || salt->valuestring[0] == '\0'))
    return kvr_sim_err_validation(
        e, NULL, "cache_salt", "value_error",
        "Value error, Parameter 'cache_salt' must be a non-empty string if provided.");
  p->salt = cJSON_IsString(salt) ? salt->valuestring : NULL;
  return 0;
}

/* Chat's add_generation_prompt (default true), continue_final_message and echo; completions'
 * echo. */
static int parse_render_flags(const cJSON *body, bool chat, kvr_sim_completion_t *p, char *err,
                              size_t errlen) {
  p->add_generation_prompt = true;
  if (get_bool(body, "echo", &p->echo, err, errlen) < 0)
    return 400;
  if (chat &&
      (get_bool(body, "add_generation_prompt", &p->add_generation_prompt, err, errlen) < 0 ||
       get_bool(body, "continue_final_message", &p->continue_final_message, err, errlen) < 0))
    return 400;
  return 0;
}

int kvr_sim_server_parse_completion_ex(const cJSON *body, bool chat, const char *model,
                                       uint32_t max_model_len, kvr_sim_completion_t *p,
                                       kvr_sim_err_t *e) {
  kvr_sim_models_t m = {.names = &model, .nnames = 1};
  return kvr_sim_server_parse_completion_in(body, chat, &m, max_model_len, p, e);
}

int kvr_sim_server_parse_completion_in(const cJSON *body, bool chat, const kvr_sim_models_t *models,
                                       uint32_t max_model_len, kvr_sim_completion_t *p,
                                       kvr_sim_err_t *e) {
  memset(p, 0, sizeof(*p));
  p->lora = -1;
  p->max_tokens = -1;
  char *err = e->message;
  size_t errlen = sizeof(e->message);
  err[0] = '\0';
  int status = parse_validators(body, chat, p, e);
  if (status != 0)
    return status;
  status = parse_model(body, models, &p->lora, err, errlen);
  if (status == 404)
    return kvr_sim_err_kind(e, 404, KVR_SIM_ERR_NOT_FOUND, "model");
  if (status == 0)
    status = parse_stream_flags(body, p, err, errlen);
  if (status == 0)
    status = parse_lengths(body, chat, p, err, errlen);
  if (status == 0)
    status = parse_render_flags(body, chat, p, err, errlen);
  if (status == 0)
    status =
        chat ? parse_chat_prompt(body, p, err, errlen) : parse_text_prompt(body, p, err, errlen);
  if (status == 0)
    status = fit_context(max_model_len, chat, p, err, errlen);
  return kvr_sim_err_kind(e, status, KVR_SIM_ERR_BAD_REQUEST, NULL);
}

int kvr_sim_server_parse_completion(const cJSON *body, bool chat, const char *model,
                                    uint32_t max_model_len, kvr_sim_completion_t *p, char *err,
                                    size_t errlen) {
  kvr_sim_err_t e;
  int status = kvr_sim_server_parse_completion_ex(body, chat, model, max_model_len, p, &e);
  snprintf(err, errlen, "%s", status != 0 ? e.message : "");
  return status;
}

/* ---- completions: from a request to a stream ---- */

/* Answers req with e, in the OpenAI shape (vLLM's ErrorResponse, code = status) or in the
 * Anthropic one. */
static void respond_error(kvr_http_req_t *req, const kvr_sim_err_t *e, bool anthropic) {
  kvr_buf_t b = KVR_BUF_INIT;
  if (anthropic)
    kvr_sim_err_anthropic_json(&b, e);
  else
    kvr_sim_err_openai_json(&b, e);
  kvr_http_respond(req, e->status, "application/json", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

/* The request's JSON object, or NULL with e filled: a body that is not JSON, or not an object, is
 * what pydantic refuses before any field (400 "Bad Request"); with json_only, a Content-Type other
 * than application/json too (vLLM's validate_json_request on the Responses and Messages routes). */
static cJSON *read_json(kvr_http_req_t *req, bool json_only, kvr_sim_err_t *e) {
  const char *ct = kvr_http_header(req, "content-type");
  size_t n = ct ? strcspn(ct, ";") : 0;
  while (n > 0 && ct[n - 1] == ' ')
    n--;
  if (json_only && (ct == NULL || n != 16 || strncasecmp(ct, "application/json", 16) != 0)) {
    kvr_sim_err(
        e, 400, KVR_SIM_ERR_VALIDATION, NULL,
        "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed");
    return NULL;
  }
  cJSON *body = cJSON_ParseWithLength(req->body.data ? req->body.data : "", req->body.len);
  if (body == NULL || !cJSON_IsObject(body)) {
    kvr_sim_err_validation(e, NULL, NULL, body ? "model_attributes_type" : "json_invalid",
                           body ? "Input should be a valid dictionary or object to extract fields "
                                  "from"
                                : "JSON decode error: Request body is not a valid JSON object");
    cJSON_Delete(body);
    return NULL;
  }
  return body;
}

/* The error fault: answers req (in the API's error shape) for its rate of requests. */
static bool fault_fails(kvr_sim_server_t *srv, kvr_http_req_t *req, bool anthropic) {
  if (srv->fault.mode != KVR_SIM_FAULT_ERROR || rng_uniform(srv) >= srv->fault.rate)
    return false;
  kvr_sim_err_t e;
  kvr_sim_err(&e, srv->fault.status, kvr_http_error_type(srv->fault.status), NULL,
              "simulated fault (kvrouter sim)");
  respond_error(req, &e, anthropic);
  return true;
}

/* ---- data parallel: which engine serves a request ---- */

/* The engine the API server's load balancer picks (vllm/v1/engine/core_client.py,
 * DPLBAsyncMPClient.get_core_engine_for_request): the lowest waiting * 4 + running, the first
 * rank on a tie (one API server: its client index 0 starts the scan), over counts the DP
 * coordinator refreshes about every 100 ms, which the client bumps (waiting + 1) for each request
 * it sends meanwhile. The sim refreshes them from the engines every 100 simulated ms. */
static engine_t *lb_pick(kvr_sim_server_t *srv) {
  double now = sim_seconds(srv, kvr_now_ns());
  if (now - srv->lb_stamp_s >= 0.1 || srv->lb_stamp_s == 0) {
    for (uint32_t r = 0; r < srv->ndp; r++) {
      kvr_sim_stats_t st;
      kvr_sim_engine_stats(srv->engines[r].eng, &st);
      srv->engines[r].lb_waiting = st.waiting;
      srv->engines[r].lb_running = st.running;
    }
    srv->lb_stamp_s = now;
  }
  engine_t *best = &srv->engines[0];
  uint64_t min = UINT64_MAX;
  for (uint32_t r = 0; r < srv->ndp; r++) {
    engine_t *e = &srv->engines[r];
    uint64_t score = (uint64_t)e->lb_waiting * 4 + e->lb_running;
    if (score < min) {
      min = score;
      best = e;
    }
  }
  best->lb_waiting++;
  return best;
}

/* Python's int() of a header value: optional whitespace and sign, decimal digits (an underscore
 * between two digits allowed). Returns false for anything else (vLLM then ignores the header). */
static bool py_int(const char *s, long long *out) {
  while (*s == ' ' || *s == '\t')
    s++;
  bool neg = *s == '-';
  if (*s == '+' || *s == '-')
    s++;
  long long v = 0;
  int digits = 0;
  for (; *s; s++) {
    if (*s >= '0' && *s <= '9') {
      if (v > 1000000000000LL)
        return false;
      v = v * 10 + (*s - '0');
      digits++;
    } else if (*s == '_' && digits > 0 && s[1] >= '0' && s[1] <= '9') {
      continue;
    } else {
      break;
    }
  }
  while (*s == ' ' || *s == '\t')
    s++;
  if (digits == 0 || *s != '\0')
    return false;
  *out = neg ? -v : v;
  return true;
}

/* The engine for a chat, completions or Messages request: the one X-data-parallel-rank names
 * (OpenAIServing._get_data_parallel_rank, vllm/entrypoints/openai/engine/serving.py: a value
 * int() cannot read is ignored), else lb_pick. A rank outside [0, n) is the ValueError of
 * vllm/v1/engine/input_processor.py, which the serving layer answers 400 BadRequestError
 * (vllm/entrypoints/serve/utils/error_response.py: ValueError). Returns 0 or 400 with e filled. */
static int pick_engine(kvr_sim_server_t *srv, kvr_http_req_t *req, engine_t **out,
                       kvr_sim_err_t *e) {
  const char *h = kvr_http_header(req, "x-data-parallel-rank");
  long long rank;
  if (h == NULL || !py_int(h, &rank)) {
    *out = lb_pick(srv);
    return 0;
  }
  if (rank < 0 || rank >= (long long)srv->ndp)
    return kvr_sim_err(e, 400, KVR_SIM_ERR_BAD_REQUEST, NULL,
                       "data_parallel_rank %lld is out of range [0, %u).", rank, srv->ndp);
  *out = &srv->engines[rank];
  return 0;
}

/* Reads a completion request's body into *p. Returns the body (which p borrows from; the caller
 * deletes it), or NULL when the request was answered instead: 400/404 as vLLM for a bad body, or
 * the error fault's status (p then holds nothing to free). */
static cJSON *read_completion(kvr_sim_server_t *srv, kvr_http_req_t *req, bool chat,
                              kvr_sim_completion_t *p, engine_t **eng) {
  kvr_sim_err_t e;
  cJSON *body = read_json(req, false, &e);
  if (body == NULL) {
    respond_error(req, &e, false);
    return NULL;
  }
  int status = kvr_sim_server_parse_completion_in(body, chat, &srv->models,
                                                  srv->opts.engine.max_model_len, p, &e);
  if (status == 0)
    status = pick_engine(srv, req, eng, &e);
  if (status != 0 || fault_fails(srv, req, false)) {
    if (status != 0)
      respond_error(req, &e, false);
    kvr_sim_toks_free(&p->prompt);
    cJSON_Delete(body);
    return NULL;
  }
  return body;
}

/* What "echo" sends before the answer (completion/serving.py, chat_completion/serving.py):
 * completions, the text prompt (a token-id prompt echoes nothing: the sim cannot detokenize);
 * chat, the final message's content when the reply's role (assistant) wrote it. */
static void echo_text(const cJSON *body, bool chat, kvr_buf_t *out) {
  if (!chat) {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1)
      prompt = cJSON_GetArrayItem(prompt, 0);
    if (cJSON_IsString(prompt))
      kvr_buf_puts(out, prompt->valuestring);
    return;
  }
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
  const cJSON *last = cJSON_GetArrayItem(messages, cJSON_GetArraySize(messages) - 1);
  const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
  if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant") != 0)
    return;
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(last, "content");
  if (cJSON_IsString(content)) {
    kvr_buf_puts(out, content->valuestring);
    return;
  }
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (cJSON_IsString(text))
      kvr_buf_puts(out, text->valuestring);
  }
}

void kvr_sim_server_answer(const kvr_sim_completion_t *p, uint64_t server_seed,
                           uint32_t output_len_mean, kvr_sim_answer_t *out) {
  memset(out, 0, sizeof(*out));
  size_t prefix =
      p->turn_prefix > 0 && p->turn_prefix <= p->prompt.n ? p->turn_prefix : p->prompt.n;
  out->gen_seed = kvr_sim_tokens_seed(p->prompt.v, prefix, server_seed ^ p->seed);
  out->gen_offset = p->gen_offset;
  uint32_t maxt = (uint32_t)p->max_tokens, mean = output_len_mean;
  uint32_t target = maxt;
  if (!p->ignore_eos && mean > 0) {
    uint32_t eos = mean / 2 + (uint32_t)(kvr_sim_tokens_mix(out->gen_seed) % (mean + 1));
    /* a continued answer already holds gen_offset of its words: what is left of it */
    eos = eos > p->gen_offset ? eos - p->gen_offset : 1;
    eos = KVR_MAX(eos, (uint32_t)p->min_tokens);
    target = KVR_MAX(KVR_MIN(eos, maxt), 1u);
  }
  out->max_output = target;
  out->stop_reason = target < maxt ? KVR_SIM_FINISH_STOP : KVR_SIM_FINISH_LENGTH;
}

/* 16 lowercase hex digits from the worker's seed and a counter (vLLM's random_uuid(): the low 64
 * bits of a uuid4), deterministic for a seed. */
static void random_hex(kvr_sim_server_t *srv, char out[17]) {
  uint64_t v = kvr_sim_tokens_mix(srv->id_salt ^ srv->opts.seed ^ kvr_sim_tokens_mix(++srv->ids));
  snprintf(out, 17, "%016llx", (unsigned long long)v);
}

/* Gives s its response id (a per-process random salt, the seed and a counter, mixed) and the
 * 'data: {"id":...,
 * "model":...,' prefix every chunk starts with. */
static void stream_name(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  uint64_t idn = kvr_sim_tokens_mix(srv->id_salt ^ srv->opts.seed ^ kvr_sim_tokens_mix(++srv->ids));
  snprintf(s->id, sizeof(s->id), "%s-%016llx%016llx", s->chat ? "chatcmpl" : "cmpl",
           (unsigned long long)idn, (unsigned long long)kvr_sim_tokens_mix(idn));
  kvr_buf_printf(&s->prefix,
                 "data: {\"id\":\"%s\",\"object\":\"%s\",\"created\":%lld,\"model\":", s->id,
                 s->chat ? "chat.completion.chunk" : "text_completion", (long long)time(NULL));
  kvr_buf_json_str(&s->prefix, s->model, strlen(s->model));
  kvr_buf_puts(&s->prefix, ",");
}

/* A new stream answering req (NULL: a background response, detached) in api with p: in srv's
 * list, attached to req (whose close makes it gone); a streamed response's head is sent at once.
 */
static stream_t *stream_new(kvr_sim_server_t *srv, engine_t *eng, kvr_http_req_t *req, api_t api,
                            const kvr_sim_completion_t *p) {
  stream_t *s = kvr_xcalloc(1, sizeof(*s));
  s->srv = srv;
  s->e = eng;
  s->http = req;
  s->api = api;
  s->chat = api == API_CHAT || api == API_MESSAGES;
  s->stream = p->stream;
  s->detached = req == NULL;
  s->lora = p->lora;
  /* the reply's model: the adapter's name, else the first served name (OpenAIServingModels
   * .model_name(lora_request), vllm/entrypoints/openai/models/serving.py) */
  s->model = kvr_xstrdup(p->lora >= 0 ? srv->models.loras[p->lora] : srv->names[0]);
  /* vLLM's should_include_usage(): the server's --enable-force-include-usage adds the final usage
   * chunk to every stream; per-chunk usage needs the final one too. */
  bool completion = api == API_CHAT || api == API_COMPLETIONS;
  s->include_usage =
      completion && s->stream && (p->include_usage || srv->opts.enable_force_include_usage);
  s->continuous_usage = s->include_usage && p->continuous_usage;
  s->arrival_ns = kvr_now_ns();
  s->prompt_tokens = (uint32_t)p->prompt.n;
  kvr_sim_answer_t a;
  kvr_sim_server_answer(p, srv->opts.seed, srv->opts.output_len_mean, &a);
  s->gen_seed = a.gen_seed;
  s->gen_offset = a.gen_offset;
  s->max_output = a.max_output;
  s->stop_reason = a.stop_reason;
  s->disconnect_after = srv->fault.mode == KVR_SIM_FAULT_DISCONNECT && req != NULL
                            ? srv->fault.after_tokens
                            : UINT32_MAX;
  stream_name(s);
  kvr_list_insert_head(&srv->streams, &s->node);
  srv->nstreams++;
  if (req == NULL)
    return s;
  req->data = s;
  req->on_close = on_req_close;
  if (s->stream)
    kvr_http_start(req, 200, "Content-Type: text/event-stream; charset=utf-8\r\n");
  return s;
}

/* Fixed-latency mode: s gets its own timer, first token at fixed_ttft_ms (simulated). */
static void stream_start_fixed(stream_t *s) {
  kvr_sim_server_t *srv = s->srv;
  uv_timer_init(srv->loop, &s->timer);
  s->timer.data = s;
  s->has_timer = true;
  s->e->nfixed++;
  s->due_ns = s->arrival_ns + wall_ns_of_sim_ms(srv, srv->opts.fixed_ttft_ms);
  timer_arm(srv, &s->timer, on_fixed_timer, s->due_ns);
}

/* Queues s's prompt in the engine and makes sure the engine clock runs. A chat echo reads no
 * prefix cache (vLLM: echo sets prompt_logprobs, and then skip_reading_prefix_cache). */
static void stream_start_engine(stream_t *s, const kvr_sim_completion_t *p) {
  kvr_sim_server_t *srv = s->srv;
  kvr_sim_engine_set_now(s->e->eng, sim_seconds(srv, kvr_now_ns()));
  kvr_sim_add_t a = {.prompt = p->prompt.v,
                     .nprompt = (uint32_t)p->prompt.n,
                     .max_output = s->max_output,
                     .stop_reason = s->stop_reason,
                     .gen_seed = s->gen_seed,
                     .gen_offset = s->gen_offset,
                     .salt = p->salt,
                     .skip_prefix_read = p->echo && s->api == API_CHAT,
                     .data = s};
  if (p->lora >= 0) {
    const kvr_sim_lora_t *l = &srv->loras.v[p->lora];
    a.lora_id = l->id;
    a.lora_rank = l->rank;
    a.lora_name = l->name;
  }
  s->ereq = kvr_sim_engine_add_ex(s->e->eng, &a);
  if (s->ereq == NULL) {
    /* only possible when the KV cache is smaller than max_model_len (tiny test configs) */
    stream_release(s, true);
    stream_destroy(s);
    return;
  }
  engine_kick(s->e);
}

/* Sets s going: held by the hang fault, closed at once by the disconnect fault with
 * after_tokens 0, on its own timer in fixed-latency mode, else through the engine. s may be
 * freed when it returns. */
static void stream_begin(stream_t *s, const kvr_sim_completion_t *p) {
  kvr_sim_server_t *srv = s->srv;
  if (srv->fault.mode == KVR_SIM_FAULT_HANG) {
    s->hung = true;
    s->e->nhung++;
    return; /* held until the client goes away or the server closes */
  }
  if (s->disconnect_after == 0) {
    stream_gone(s);
    return;
  }
  if (srv->opts.fixed_ttft_ms >= 0) {
    s->e->fixed_prompt_tokens += p->prompt.n;
    stream_start_fixed(s);
    return;
  }
  stream_start_engine(s, p);
}

static void handle_completion(kvr_sim_server_t *srv, kvr_http_req_t *req, bool chat) {
  kvr_sim_completion_t p;
  engine_t *eng = NULL;
  cJSON *body = read_completion(srv, req, chat, &p, &eng);
  if (body == NULL)
    return;
  stream_t *s = stream_new(srv, eng, req, chat ? API_CHAT : API_COMPLETIONS, &p);
  if (p.echo)
    echo_text(body, chat, &s->echo);
  stream_begin(s, &p);
  kvr_sim_toks_free(&p.prompt); /* the engine keeps its own copy */
  cJSON_Delete(body);           /* p.salt pointed into it; the engine copied it */
}

/* ---- the Responses API (sim_responses.h; vllm/entrypoints/openai/responses/serving.py) ---- */

/* vLLM's _check_model: absent or null, a served name or an adapter (*lora); else 404
 * NotFoundError. */
static int check_model(kvr_sim_server_t *srv, const cJSON *body, int32_t *lora, kvr_sim_err_t *e) {
  char err[300];
  int status = parse_model(body, &srv->models, lora, err, sizeof(err));
  if (status != 0)
    return kvr_sim_err(e, status, status == 404 ? KVR_SIM_ERR_NOT_FOUND : KVR_SIM_ERR_VALIDATION,
                       "model", "%s", err);
  return 0;
}

static int not_found(kvr_sim_err_t *e, const char *id) {
  return kvr_sim_err(e, 404, KVR_SIM_ERR_INVALID, "response_id",
                     "Response with id '%.300s' not found.", id);
}

/* _create_responses up to the engine: the model, the store switch, the previous response, the
 * prompt (construct_input_messages rendered as chat; a partial assistant message last is
 * continued) and its length. Fills *messages (owned by the caller) and p. 0 or the status. */
static int responses_prepare(kvr_sim_server_t *srv, kvr_sim_resp_req_t *rq, cJSON **messages,
                             kvr_sim_completion_t *p, kvr_sim_err_t *e) {
  int32_t lora;
  int rc = check_model(srv, rq->body, &lora, e);
  if (rc != 0)
    return rc;
  if (rq->store && !srv->store_enabled && rq->background)
    return kvr_sim_err(e, 400, KVR_SIM_ERR_INVALID, "background",
                       "This vLLM engine does not support `store=True` and therefore does not "
                       "support the background mode. To enable these features, set the "
                       "environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching "
                       "the vLLM server.");
  if (!srv->store_enabled)
    rq->store = false; /* silently, as vLLM */
  const kvr_sim_stored_t *prev = NULL;
  if (rq->previous_response_id != NULL &&
      (prev = kvr_sim_rstore_get(srv->store, rq->previous_response_id)) == NULL)
    return not_found(e, rq->previous_response_id);
  bool cont = false;
  rc = kvr_sim_responses_messages(
      rq, prev ? prev->messages : NULL,
      prev ? cJSON_GetObjectItemCaseSensitive(prev->obj, "output") : NULL, messages, &cont, e);
  if (rc != 0)
    return rc;
  memset(p, 0, sizeof(*p));
  p->lora = lora;
  kvr_sim_render_t r = {.generation_prompt = !cont, .continue_final = cont};
  if (kvr_sim_server_chat_prompt(*messages, &r, p, e->message, sizeof(e->message)) != 0)
    return kvr_sim_err_kind(e, 400, KVR_SIM_ERR_BAD_REQUEST, NULL);
  uint32_t max_len = srv->opts.engine.max_model_len;
  if (p->prompt.n >= max_len)
    return kvr_sim_err(e, 400, KVR_SIM_ERR_INVALID, "input",
                       "The engine prompt length %zu exceeds the max_model_len %u. Please reduce "
                       "prompt.",
                       p->prompt.n, max_len);
  int64_t room = (int64_t)(max_len - p->prompt.n);
  p->max_tokens = rq->max_output_tokens > 0 ? KVR_MIN(rq->max_output_tokens, room) : room;
  p->stream = rq->stream;
  p->ignore_eos = rq->ignore_eos;
  p->seed = rq->seed;
  p->salt = rq->cache_salt;
  return 0;
}

/* ---- background streams' readers (sub_t) ---- */

static void sub_free(sub_t *sub) {
  kvr_list_remove(&sub->node);
  free(sub->id);
  free(sub);
}

static void on_sub_close(kvr_http_req_t *req) {
  sub_t *sub = req->data;
  req->data = NULL;
  req->on_close = NULL;
  kvr_http_abort(req);
  sub_free(sub);
}

/* Sends sub the events of en it has not had (none when en is gone); finishes it once the log is
 * done. */
static void sub_flush(sub_t *sub, const kvr_sim_stored_t *en) {
  if (en != NULL && sub->next < en->nev) {
    size_t len;
    const char *p = kvr_sim_stored_events_from(en, sub->next, &len);
    kvr_http_write(sub->req, p, len);
    sub->next = en->nev;
  }
  if (en == NULL || en->events_done) {
    kvr_http_req_t *req = sub->req;
    req->data = NULL;
    req->on_close = NULL;
    kvr_http_finish(req);
    sub_free(sub);
  }
}

static void subs_notify(kvr_sim_server_t *srv, const char *id) {
  const kvr_sim_stored_t *en = kvr_sim_rstore_get(srv->store, id);
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, &srv->subs) {
    sub_t *sub = KVR_CONTAINER_OF(q, sub_t, node);
    if (strcmp(sub->id, id) == 0)
      sub_flush(sub, en);
  }
}

/* req reads en's events from event number first on (vLLM's responses_background_stream_generator:
 * starting_after + 1, or 0). */
static void sub_add(kvr_sim_server_t *srv, kvr_http_req_t *req, const kvr_sim_stored_t *en,
                    size_t first) {
  sub_t *sub = kvr_xcalloc(1, sizeof(*sub));
  sub->req = req;
  sub->id = kvr_xstrdup(en->id);
  sub->next = first;
  kvr_list_insert_tail(&srv->subs, &sub->node);
  req->data = sub;
  req->on_close = on_sub_close;
  kvr_http_start(req, 200, "Content-Type: text/event-stream; charset=utf-8\r\n");
  sub_flush(sub, en);
}

/* Runs a background response (serving.py _run_background_request[_stream]): stored at once as
 * "queued" with its prompt's messages, then generated without a client into the store. Not
 * streamed, the POST gets the queued object; streamed, its events go to the store's log and the
 * POST reads them from the first (response.created, the response "in_progress"). */
static void responses_background(kvr_sim_server_t *srv, kvr_http_req_t *req, kvr_sim_resp_t *r,
                                 const kvr_sim_completion_t *p) {
  kvr_sim_stored_t *en = kvr_sim_rstore_put(srv->store, kvr_sim_resp_id(r),
                                            cJSON_Duplicate(r->obj, true), r->messages);
  r->messages = NULL;
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  stream_t *s = stream_new(srv, lb_pick(srv), NULL, API_RESPONSES, p);
  s->resp = r;
  en->running = s;
  if (p->stream) {
    kvr_sim_responses_set_status(r->obj, "in_progress");
    kvr_sim_resp_ev_begin(b, r);
    kvr_sim_stored_add_events(en, b->data, b->len);
    sub_add(srv, req, en, 0);
  } else {
    kvr_sim_responses_print(b, r->obj);
    kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
  }
  stream_begin(s, p);
}

/* POST /v1/responses */
static void handle_responses(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  kvr_sim_err_t e;
  kvr_sim_resp_req_t rq;
  kvr_sim_completion_t p;
  memset(&p, 0, sizeof(p));
  cJSON *messages = NULL;
  cJSON *body = read_json(req, true, &e);
  int rc = body ? kvr_sim_responses_read(body, &rq, &e) : 400;
  if (rc == 0)
    rc = responses_prepare(srv, &rq, &messages, &p, &e);
  if (rc != 0 || fault_fails(srv, req, false)) {
    if (rc != 0)
      respond_error(req, &e, false);
    cJSON_Delete(messages);
    kvr_sim_toks_free(&p.prompt);
    cJSON_Delete(body);
    return;
  }
  char id[24], item[17];
  random_hex(srv, id + 5);
  memcpy(id, "resp_", 5);
  random_hex(srv, item);
  const char *model = p.lora >= 0 ? srv->models.loras[p.lora] : srv->names[0];
  kvr_sim_resp_t *r = kvr_sim_resp_new(&rq, rq.request_id ? rq.request_id : id, item, model,
                                       (long long)time(NULL), p.max_tokens, messages);
  r->store = rq.store;
  if (rq.background) {
    responses_background(srv, req, r, &p);
  } else {
    /* /v1/responses does not read X-data-parallel-rank (../shared/VLLM-APIS.md section 6) */
    stream_t *s = stream_new(srv, lb_pick(srv), req, API_RESPONSES, &p);
    s->resp = r;
    if (s->stream) {
      kvr_buf_t *b = &srv->scratch;
      kvr_buf_reset(b);
      kvr_sim_resp_ev_begin(b, r);
      kvr_http_write(req, b->data, b->len);
    }
    stream_begin(s, &p);
  }
  kvr_sim_toks_free(&p.prompt);
  cJSON_Delete(body);
}

/* FastAPI's 404 and 405 for a path under /v1/responses/ no route names. */
static void respond_fastapi(kvr_http_req_t *req, int status, const char *allow) {
  char hdr[64] = "";
  if (allow != NULL)
    snprintf(hdr, sizeof(hdr), "Allow: %s\r\n", allow);
  const char *body =
      status == 405 ? "{\"detail\":\"Method Not Allowed\"}" : "{\"detail\":\"Not Found\"}";
  kvr_http_respond(req, status, "application/json", hdr[0] ? hdr : NULL, body, strlen(body));
}

/* POST /v1/responses/{id}/cancel: only a queued or running background response can be
 * cancelled (its run is aborted); anything else is vLLM's 400. */
static void responses_cancel(kvr_sim_server_t *srv, kvr_http_req_t *req, kvr_sim_stored_t *en) {
  const char *status = kvr_sim_responses_status(en->obj);
  if (strcmp(status, "queued") != 0 && strcmp(status, "in_progress") != 0) {
    kvr_sim_err_t e;
    kvr_sim_err(&e, 400, KVR_SIM_ERR_INVALID, "response_id",
                "Cannot cancel a synchronous response.");
    respond_error(req, &e, false);
    return;
  }
  kvr_sim_responses_set_status(en->obj, "cancelled");
  stream_t *s = en->running;
  en->running = NULL;
  if (s != NULL)
    stream_gone(s); /* aborted in the engine at the next step boundary */
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  kvr_sim_responses_print(b, en->obj);
  kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
}

/* The value of name=... in a query string, or NULL (*len its length). */
static const char *query_value(const char *query, const char *name, size_t *len) {
  size_t n = strlen(name);
  for (const char *p = query; p != NULL && *p != '\0';) {
    size_t plen = strcspn(p, "&");
    if (plen > n && strncmp(p, name, n) == 0 && p[n] == '=') {
      *len = plen - n - 1;
      return p + n + 1;
    }
    p += plen + (p[plen] == '&');
  }
  return NULL;
}

/* FastAPI's bool query parameter: true, 1, yes, on (any case). */
static bool query_flag(const char *query, const char *name) {
  size_t len;
  const char *v = query_value(query, name, &len);
  static const char *const yes[] = {"true", "1", "yes", "on"};
  for (size_t i = 0; v != NULL && i < KVR_ARRAY_SIZE(yes); i++) {
    if (len == strlen(yes[i]) && strncasecmp(v, yes[i], len) == 0)
      return true;
  }
  return false;
}

static long long query_int(const char *query, const char *name, long long def) {
  size_t len;
  const char *v = query_value(query, name, &len);
  if (v == NULL || len == 0 || len > 18)
    return def;
  char buf[20];
  memcpy(buf, v, len);
  buf[len] = '\0';
  char *end;
  long long x = strtoll(buf, &end, 10);
  return *end == '\0' ? x : def;
}

/* GET /v1/responses/{id} and POST /v1/responses/{id}/cancel. GET ?stream=true[&starting_after=N]
 * replays a background stream's events after event N and follows the run to its end; a response
 * without them is vLLM's "Unknown response_id" (400 here: vLLM raises it inside the stream). */
static void handle_responses_id(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  const char *slash = strchr(tail, '/');
  bool cancel = slash != NULL && strcmp(slash, "/cancel") == 0;
  if (tail[0] == '\0' || slash == tail || (slash != NULL && !cancel)) {
    respond_fastapi(req, 404, NULL);
    return;
  }
  if (cancel ? req->method != HTTP_POST : req->method != HTTP_GET && req->method != HTTP_HEAD) {
    respond_fastapi(req, 405, cancel ? "POST" : "GET");
    return;
  }
  size_t n = slash ? (size_t)(slash - tail) : strlen(tail);
  char *id = kvr_xmalloc(n + 1);
  memcpy(id, tail, n);
  id[n] = '\0';
  kvr_sim_err_t e;
  kvr_sim_stored_t *en = kvr_sim_rstore_get(srv->store, id);
  if (en == NULL) {
    not_found(&e, id);
    respond_error(req, &e, false);
  } else if (cancel) {
    responses_cancel(srv, req, en);
  } else if (query_flag(req->query, "stream")) {
    long long after = query_int(req->query, "starting_after", -1);
    if (en->has_events) {
      sub_add(srv, req, en, after < 0 ? 0 : (size_t)after + 1);
    } else {
      kvr_sim_err(&e, 400, KVR_SIM_ERR_BAD_REQUEST, "response_id", "Unknown response_id: %s", id);
      respond_error(req, &e, false);
    }
  } else {
    kvr_buf_t *b = &srv->scratch;
    kvr_buf_reset(b);
    kvr_sim_responses_print(b, en->obj);
    kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
  }
  free(id);
}

/* ---- the Anthropic Messages API (sim_anthropic.h; vllm/entrypoints/anthropic/) ---- */

/* A Messages (or count_tokens) request up to its prompt: the body's checks (OpenAI-shaped
 * errors), then as a chat completion (Anthropic-shaped errors from the model check on). Returns
 * 0, or the status with e filled and *anthropic saying which shape. */
static int messages_prepare(kvr_sim_server_t *srv, kvr_http_req_t *req, bool count,
                            kvr_sim_completion_t *p, kvr_sim_msg_req_t *mq, bool *anthropic,
                            kvr_sim_err_t *e) {
  memset(p, 0, sizeof(*p));
  p->lora = -1;
  memset(mq, 0, sizeof(*mq));
  *anthropic = false;
  cJSON *body = read_json(req, true, e);
  int rc = body ? kvr_sim_anthropic_read(body, count, mq, e) : 400;
  if (rc == 0) {
    *anthropic = true;
    rc = check_model(srv, body, &p->lora, e);
  }
  if (rc == 0) {
    kvr_sim_render_t r = {.generation_prompt = true};
    if (kvr_sim_server_chat_prompt(mq->messages, &r, p, e->message, sizeof(e->message)) != 0)
      rc = kvr_sim_err_kind(e, 400, KVR_SIM_ERR_BAD_REQUEST, NULL);
  }
  if (rc == 0 && !count) {
    p->max_tokens = mq->max_tokens;
    p->stream = mq->stream;
    rc = fit_context(srv->opts.engine.max_model_len, true, p, e->message, sizeof(e->message));
    if (rc != 0)
      kvr_sim_err_kind(e, rc, KVR_SIM_ERR_BAD_REQUEST, NULL);
  }
  cJSON_Delete(body); /* mq->model pointed into it: not used past here */
  return rc;
}

/* POST /v1/messages */
static void handle_messages(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  kvr_sim_completion_t p;
  kvr_sim_msg_req_t mq;
  kvr_sim_err_t e;
  bool anthropic;
  engine_t *eng = NULL;
  int rc = messages_prepare(srv, req, false, &p, &mq, &anthropic, &e);
  cJSON_Delete(mq.messages);
  if (rc == 0)
    rc = pick_engine(srv, req, &eng, &e);
  if (rc != 0 || fault_fails(srv, req, true)) {
    if (rc != 0)
      respond_error(req, &e, anthropic);
    kvr_sim_toks_free(&p.prompt);
    return;
  }
  stream_t *s = stream_new(srv, eng, req, API_MESSAGES, &p);
  stream_begin(s, &p);
  kvr_sim_toks_free(&p.prompt);
}

/* POST /v1/messages/count_tokens: the rendered prompt's length (with the generation prompt). */
static void handle_count_tokens(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  kvr_sim_completion_t p;
  kvr_sim_msg_req_t mq;
  kvr_sim_err_t e;
  bool anthropic;
  int rc = messages_prepare(srv, req, true, &p, &mq, &anthropic, &e);
  cJSON_Delete(mq.messages);
  if (rc != 0) {
    respond_error(req, &e, anthropic);
  } else {
    kvr_buf_t *b = &srv->scratch;
    kvr_buf_reset(b);
    kvr_sim_anthropic_count(b, (uint32_t)p.prompt.n);
    kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
  }
  kvr_sim_toks_free(&p.prompt);
}

/* ---- other endpoints ---- */

/* GET /v1/models, as OpenAIServingModels.show_available_models: one base card per served name
 * (root --model, parent null, max_model_len), then one per LoRA adapter (root its path, parent
 * its base model name, max_model_len null). */
static void handle_models(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  long long created = (long long)time(NULL);
  kvr_buf_puts(b, "{\"object\":\"list\",\"data\":[");
  for (size_t i = 0; i < srv->nnames; i++) {
    if (i > 0)
      kvr_buf_puts(b, ",");
    kvr_sim_model_card(b, srv->names[i], srv->model, NULL, srv->opts.engine.max_model_len, created);
  }
  for (size_t i = 0; i < srv->loras.n; i++) {
    const kvr_sim_lora_t *l = &srv->loras.v[i];
    kvr_buf_puts(b, ",");
    kvr_sim_model_card(b, l->name, l->path, l->base ? l->base : srv->names[0], 0, created);
  }
  kvr_buf_puts(b, "]}");
  kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
}

/* POST /tokenize, as vLLM's serving_tokenization: {"model"?, "prompt", "add_special_tokens"
 * (true)} or {"model"?, "messages", "add_generation_prompt" (true), "continue_final_message"
 * (false), "add_special_tokens" (false)}
 * -> {"count", "max_model_len", "tokens", "token_strs": null}. The ids are exactly those a
 * completion with the same prompt is served with (BOS first: Llama-3's template starts with it, a
 * text prompt gets it as a special token), so a router can hash the blocks the engine caches. */
static void handle_tokenize(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  char err[512];
  cJSON *body = cJSON_ParseWithLength(req->body.data ? req->body.data : "", req->body.len);
  if (body == NULL || !cJSON_IsObject(body)) {
    cJSON_Delete(body);
    kvr_http_error(req, 400, "BadRequestError", NULL, "Request body is not a valid JSON object");
    return;
  }
  kvr_sim_completion_t p;
  memset(&p, 0, sizeof(p));
  int32_t lora;
  int status = parse_model(body, &srv->models, &lora, err, sizeof(err));
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
  const cJSON *gen = cJSON_GetObjectItemCaseSensitive(body, "add_generation_prompt");
  const cJSON *special = cJSON_GetObjectItemCaseSensitive(body, "add_special_tokens");
  if (status == 0 && ((gen && !cJSON_IsBool(gen)) || (special && !cJSON_IsBool(special)))) {
    snprintf(err, sizeof(err), "%s: Input should be a valid boolean",
             gen && !cJSON_IsBool(gen) ? "add_generation_prompt" : "add_special_tokens");
    status = 400;
  }
  const cJSON *cont = cJSON_GetObjectItemCaseSensitive(body, "continue_final_message");
  if (status == 0 && messages != NULL && cont != NULL && !cJSON_IsBool(cont)) {
    snprintf(err, sizeof(err), "continue_final_message: Input should be a valid boolean");
    status = 400;
  }
  if (status == 0 && messages != NULL && cJSON_IsTrue(cont) && (gen == NULL || cJSON_IsTrue(gen))) {
    /* both true: the request model's validator; continue with the default true: transformers */
    snprintf(err, sizeof(err), "%s",
             gen ? "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                 : "continue_final_message and add_generation_prompt are not compatible.");
    status = 400;
  }
  if (status == 0 && messages != NULL) {
    kvr_buf_t text = KVR_BUF_INIT;
    kvr_sim_render_t r = {.generation_prompt = gen == NULL || cJSON_IsTrue(gen),
                          .continue_final = cJSON_IsTrue(cont)};
    if (kvr_sim_tokens_render(messages, &r, &text, err, sizeof(err)) != 0) {
      status = 400;
    } else {
      kvr_sim_toks_push(&p.prompt, BOS_TOKEN); /* the chat template's own <|begin_of_text|> */
      if (cJSON_IsTrue(special))
        kvr_sim_toks_push(&p.prompt, BOS_TOKEN); /* as vLLM: a second BOS when asked for */
      kvr_sim_tokens_encode(text.data, text.len, &p.prompt);
    }
    kvr_buf_free(&text);
  } else if (status == 0) {
    status = parse_text_prompt(body, &p, err, sizeof(err));
    if (status == 0 && cJSON_IsFalse(special) && p.prompt.n > 0 && p.prompt.v[0] == BOS_TOKEN &&
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(body, "prompt"))) {
      memmove(p.prompt.v, p.prompt.v + 1, (p.prompt.n - 1) * sizeof(uint32_t));
      p.prompt.n--;
    }
  }
  cJSON_Delete(body);
  if (status != 0) {
    kvr_sim_toks_free(&p.prompt);
    kvr_http_error(req, status, status == 404 ? "NotFoundError" : "BadRequestError", NULL, "%s",
                   err);
    return;
  }
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  kvr_buf_printf(b, "{\"count\":%zu,\"max_model_len\":%u,\"tokens\":[", p.prompt.n,
                 srv->opts.engine.max_model_len);
  for (size_t i = 0; i < p.prompt.n; i++)
    kvr_buf_printf(b, i ? ",%u" : "%u", p.prompt.v[i]);
  kvr_buf_puts(b, "],\"token_strs\":null}");
  kvr_sim_toks_free(&p.prompt);
  kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
}

/* Every engine's labels, engine="R",model_name="<first served name>" (vLLM's per-engine label
 * values, vllm/v1/metrics/loggers.py), in rank order, each NUL-terminated one after the other. */
static void engine_labels(const kvr_sim_server_t *srv, kvr_buf_t *out) {
  for (uint32_t r = 0; r < srv->ndp; r++) {
    kvr_buf_printf(out, "engine=\"%u\",model_name=\"", r);
    kvr_metric_escape(out, srv->names[0]);
    kvr_buf_puts(out, "\"");
    kvr_buf_append(out, "", 1);
  }
}

/* A family of one gauge or counter, one sample per engine: value(engine, its stats). */
typedef double (*engine_value_fn)(const engine_t *e, const kvr_sim_stats_t *st);

static void metric_per_engine(kvr_buf_t *b, const kvr_sim_server_t *srv, const char *labels,
                              const kvr_sim_stats_t *st, const char *name, const char *type,
                              const char *help, engine_value_fn value) {
  kvr_metric_family(b, name, type, help);
  const char *l = labels;
  for (uint32_t r = 0; r < srv->ndp; r++, l += strlen(l) + 1)
    kvr_metric_sample(b, name, l, value(&srv->engines[r], &st[r]));
}

/* Requests outside the engine (fixed-latency mode, hung by the fault) count as running, and their
 * tokens count too. */
static double v_running(const engine_t *e, const kvr_sim_stats_t *st) {
  return (double)(st->running + e->nfixed + e->nhung);
}
static double v_waiting(const engine_t *e, const kvr_sim_stats_t *st) {
  (void)e;
  return st->waiting;
}
static double v_usage(const engine_t *e, const kvr_sim_stats_t *st) {
  return (double)st->blocks_used / (double)e->srv->opts.engine.num_gpu_blocks;
}
static double v_queries(const engine_t *e, const kvr_sim_stats_t *st) {
  (void)e;
  return (double)st->prefix_queries;
}
static double v_hits(const engine_t *e, const kvr_sim_stats_t *st) {
  (void)e;
  return (double)st->prefix_hits;
}
static double v_preemptions(const engine_t *e, const kvr_sim_stats_t *st) {
  (void)e;
  return (double)st->preemptions;
}
static double v_prompt(const engine_t *e, const kvr_sim_stats_t *st) {
  return (double)(st->prompt_tokens + e->fixed_prompt_tokens);
}
static double v_generation(const engine_t *e, const kvr_sim_stats_t *st) {
  return (double)(st->generation_tokens + e->fixed_generation_tokens);
}

/* The engines' gauges and counters. */
static void metrics_engine(kvr_buf_t *b, const kvr_sim_server_t *srv, const kvr_sim_stats_t *st,
                           const char *labels) {
  metric_per_engine(b, srv, labels, st, "vllm:num_requests_running", "gauge",
                    "Number of requests in model execution batches.", v_running);
  metric_per_engine(b, srv, labels, st, "vllm:num_requests_waiting", "gauge",
                    "Number of requests waiting to be processed.", v_waiting);
  metric_per_engine(b, srv, labels, st, "vllm:kv_cache_usage_perc", "gauge",
                    "KV-cache usage. 1 means 100 percent usage.", v_usage);
  metric_per_engine(b, srv, labels, st, "vllm:prefix_cache_queries_total", "counter",
                    "Prefix cache queries, in terms of number of queried tokens.", v_queries);
  metric_per_engine(b, srv, labels, st, "vllm:prefix_cache_hits_total", "counter",
                    "Prefix cache hits, in terms of number of cached tokens.", v_hits);
  metric_per_engine(b, srv, labels, st, "vllm:num_preemptions_total", "counter",
                    "Cumulative number of preemption from the engine.", v_preemptions);
  metric_per_engine(b, srv, labels, st, "vllm:prompt_tokens_total", "counter",
                    "Number of prefill tokens processed.", v_prompt);
  metric_per_engine(b, srv, labels, st, "vllm:generation_tokens_total", "counter",
                    "Number of generation tokens processed.", v_generation);
}

/* vllm:request_success_total by finished_reason, and vllm:cache_config_info, one sample per
 * engine (loggers.py log_metrics_info: the cache config's labels with engine="R", no model_name;
 * cache_dtype: "fp8", or "auto", vLLM's default, for a preset whose KV cache is the model's
 * BF16); l2 is scratch. */
static void metrics_requests_and_config(kvr_buf_t *b, const kvr_sim_server_t *srv,
                                        const char *labels, kvr_buf_t *l2) {
  const kvr_sim_config_t *cfg = &srv->opts.engine;
  kvr_metric_family(b, "vllm:request_success_total", "counter",
                    "Count of successfully processed requests.");
  const char *reasons[] = {"stop", "length", "abort"};
  const char *l = labels;
  for (uint32_t r = 0; r < srv->ndp; r++, l += strlen(l) + 1) {
    const engine_t *e = &srv->engines[r];
    uint64_t counts[] = {e->finished_stop, e->finished_length, e->finished_abort};
    for (int i = 0; i < 3; i++) {
      kvr_buf_reset(l2);
      kvr_buf_printf(l2, "%s,finished_reason=\"%s\"", l, reasons[i]);
      kvr_metric_sample(b, "vllm:request_success_total", l2->data, (double)counts[i]);
    }
  }
  kvr_metric_family(b, "vllm:cache_config_info", "gauge",
                    "Information of the LLMEngine CacheConfig");
  for (uint32_t r = 0; r < srv->ndp; r++) {
    kvr_buf_reset(l2);
    kvr_buf_printf(
        l2,
        "block_size=\"%u\",cache_dtype=\"%s\",enable_prefix_caching=\"%s\",engine=\"%u\","
        "gpu_memory_utilization=\"0.9\",num_cpu_blocks=\"None\",num_gpu_blocks=\"%u\"",
        cfg->block_size, kvr_sim_preset_of(cfg)->model->kv_bytes == 1 ? "fp8" : "auto",
        cfg->enable_prefix_caching ? "True" : "False", r, cfg->num_gpu_blocks);
    kvr_metric_sample(b, "vllm:cache_config_info", l2->data, 1.0);
  }
}

/* The three latency histograms, in simulated seconds, one per engine. */
static void metrics_latency(kvr_buf_t *b, const kvr_sim_server_t *srv, const char *labels) {
  static const struct {
    const char *name, *help;
    size_t off;
  } h[] = {{"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            offsetof(engine_t, ttft)},
           {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            offsetof(engine_t, itl)},
           {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
            offsetof(engine_t, e2e)}};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(h); i++) {
    kvr_metric_family(b, h[i].name, "histogram", h[i].help);
    const char *l = labels;
    for (uint32_t r = 0; r < srv->ndp; r++, l += strlen(l) + 1)
      kvr_metric_hist(b, h[i].name, l,
                      (const kvr_hist_t *)((const char *)&srv->engines[r] + h[i].off));
  }
}

/* GET /metrics: the figures vLLM exports, in its names, labels and order. */
static void handle_metrics(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  kvr_sim_stats_t *st = kvr_xcalloc(srv->ndp, sizeof(*st));
  for (uint32_t r = 0; r < srv->ndp; r++)
    kvr_sim_engine_stats(srv->engines[r].eng, &st[r]);
  kvr_buf_t labels = KVR_BUF_INIT, l2 = KVR_BUF_INIT;
  engine_labels(srv, &labels);
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  metrics_engine(b, srv, st, labels.data);
  metrics_requests_and_config(b, srv, labels.data, &l2);
  metrics_latency(b, srv, labels.data);
  if (srv->lora_on)
    kvr_sim_loras_info_write(b, &srv->loras);
  free(st);
  kvr_buf_free(&labels);
  kvr_buf_free(&l2);
  kvr_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b->data, b->len);
}

static void fault_json(kvr_sim_server_t *srv, kvr_buf_t *b) {
  const kvr_sim_fault_t *f = &srv->fault;
  kvr_buf_printf(b,
                 "{\"mode\":\"%s\",\"status\":%d,\"rate\":%g,\"after_tokens\":%u,"
                 "\"delay_ms\":%g,\"duration_ms\":%g,\"listening\":%s}",
                 kvr_sim_fault_mode_name(f->mode), f->status, f->rate, f->after_tokens, f->delay_ms,
                 f->duration_ms, srv->http ? "true" : "false");
}

static void on_retired(void *data) {
  retire_t *r = data;
  kvr_sim_server_t *srv = r->srv;
  kvr_http_server_free(r->http);
  free(r);
  srv->pending_closes--;
  if (srv->closing && srv->pending_closes == 0 && srv->done) {
    void (*done)(void *) = srv->done;
    srv->done = NULL;
    done(srv->done_data);
  }
}

static void retire_http(kvr_sim_server_t *srv, kvr_http_server_t *http) {
  retire_t *r = kvr_xmalloc(sizeof(*r));
  r->srv = srv;
  r->http = http;
  srv->pending_closes++;
  kvr_http_server_close(http, on_retired, r);
}

static void on_request(kvr_http_req_t *req, void *data);

static int listen_main(kvr_sim_server_t *srv, const char *hostport, char *err, size_t errlen) {
  srv->http = kvr_http_server_new(srv->loop, &srv->limits, on_request, srv);
  int rc = kvr_http_server_listen(srv->http, hostport, err, errlen);
  if (rc != 0) {
    kvr_http_server_t *h = srv->http;
    srv->http = NULL;
    retire_http(srv, h);
  }
  return rc;
}

static void refuse_end(kvr_sim_server_t *srv);

static void on_refuse_timer(uv_timer_t *t) {
  kvr_sim_server_t *srv = t->data;
  if (srv->fault.mode == KVR_SIM_FAULT_REFUSE)
    kvr_sim_fault_default(&srv->fault, KVR_SIM_FAULT_NONE);
  refuse_end(srv);
}

static void refuse_end(kvr_sim_server_t *srv) {
  uv_timer_stop(&srv->refuse_timer);
  if (srv->http != NULL || srv->closing)
    return;
  char err[256];
  if (listen_main(srv, srv->bound, err, sizeof(err)) != 0) {
    KVR_WARN("sim", "listening again on %s failed (%s); retrying", srv->bound, err);
    uv_timer_start(&srv->refuse_timer, on_refuse_timer, 100, 0);
  }
}

static void apply_fault(kvr_sim_server_t *srv, const kvr_sim_fault_t *f) {
  srv->fault = *f;
  for (uint32_t r = 0; r < srv->ndp; r++)
    kvr_sim_engine_set_step_delay(srv->engines[r].eng,
                                  f->mode == KVR_SIM_FAULT_SLOW ? f->delay_ms * 1e-3 : 0.0);
  if (f->mode == KVR_SIM_FAULT_REFUSE) {
    if (srv->http != NULL) {
      kvr_http_server_t *h = srv->http;
      srv->http = NULL;
      retire_http(srv, h);
    }
    uv_timer_stop(&srv->refuse_timer);
    if (f->duration_ms > 0)
      uv_timer_start(&srv->refuse_timer, on_refuse_timer, (uint64_t)f->duration_ms, 0);
  } else {
    refuse_end(srv);
  }
}

static void handle_fault(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  if (req->method == HTTP_POST) {
    cJSON *body = cJSON_ParseWithLength(req->body.data ? req->body.data : "", req->body.len);
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(body, "mode");
    kvr_sim_fault_t f;
    kvr_sim_fault_mode_t m;
    if (!cJSON_IsString(mode) || kvr_sim_fault_parse_mode(mode->valuestring, &m) != 0) {
      cJSON_Delete(body);
      kvr_http_error(req, 400, "BadRequestError", NULL,
                     "mode: must be one of none, error, hang, disconnect, slow, refuse");
      return;
    }
    kvr_sim_fault_default(&f, m);
    const struct {
      const char *name;
      double min, max;
    } fields[] = {{"status", 100, 599},
                  {"rate", 0, 1},
                  {"after_tokens", 0, 1e9},
                  {"delay_ms", 0, 1e7},
                  {"duration_ms", 0, 1e9}};
    double vals[5] = {f.status, f.rate, f.after_tokens, f.delay_ms, f.duration_ms};
    for (size_t i = 0; i < KVR_ARRAY_SIZE(fields); i++) {
      const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, fields[i].name);
      if (v == NULL)
        continue;
      if (!cJSON_IsNumber(v) || v->valuedouble < fields[i].min || v->valuedouble > fields[i].max) {
        cJSON_Delete(body);
        kvr_http_error(req, 400, "BadRequestError", NULL, "%s: must be a number in [%g, %g]",
                       fields[i].name, fields[i].min, fields[i].max);
        return;
      }
      vals[i] = v->valuedouble;
    }
    cJSON_Delete(body);
    f.status = (int)vals[0];
    f.rate = vals[1];
    f.after_tokens = (uint32_t)vals[2];
    f.delay_ms = vals[3];
    f.duration_ms = vals[4];
    KVR_INFO("sim", "fault mode %s", kvr_sim_fault_mode_name(f.mode));
    apply_fault(srv, &f);
  }
  kvr_buf_t *b = &srv->scratch;
  kvr_buf_reset(b);
  fault_json(srv, b);
  kvr_http_respond(req, 200, "application/json", NULL, b->data, b->len);
}

/* POST /reset_prefix_cache, vLLM's dev-mode endpoint: 200 with an empty body. Free cached blocks
 * lose their hash at once (the engine is never mid-step here: steps run inside the timer
 * callback); blocks of requests still running keep theirs. vLLM's reset_running_requests=true
 * (preempt everything first) is not modelled and answered 501 rather than silently ignored. */
static void handle_reset_prefix_cache(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  if (strstr(req->query, "reset_running_requests=true") ||
      strstr(req->query, "reset_running_requests=1")) {
    static const char body[] =
        "{\"detail\":\"reset_running_requests is not modelled by kvrouter sim\"}";
    kvr_http_respond(req, 501, "application/json", NULL, body, sizeof(body) - 1);
    return;
  }
  /* every engine (vllm/v1/engine/core_client.py: the reset is sent to all of them) */
  uint32_t kept = 0, dropped = 0;
  for (uint32_t r = 0; r < srv->ndp; r++) {
    uint32_t k = 0;
    dropped += kvr_sim_engine_reset_prefix_cache(srv->engines[r].eng, &k);
    kept += k;
  }
  KVR_INFO("sim", "prefix cache reset: %u cached blocks dropped, %u in use kept", dropped, kept);
  kvr_http_respond(req, 200, NULL, NULL, "", 0);
}

/* ---- LoRA adapters at runtime (vllm/entrypoints/serve/lora/api_router.py) ---- */

static void models_sync(kvr_sim_server_t *srv) {
  srv->models.loras = srv->loras.names;
  srv->models.nloras = srv->loras.n;
}

/* Loads (name, path) into the table and the engine (charge: its time goes into the next step).
 * 0 or the status with e filled. */
static int lora_load(kvr_sim_server_t *srv, const char *name, const char *path, const char *base,
                     bool inplace, bool charge, kvr_sim_err_t *e) {
  if (!srv->lora_on)
    return kvr_sim_err(e, 500, "InternalServerError", NULL,
                       "LoRA is not enabled. Use --enable-lora to enable LoRA.");
  bool existed = kvr_sim_loras_find(&srv->loras, name ? name : "") != NULL;
  kvr_sim_lora_t *l;
  int rc = kvr_sim_loras_load(&srv->loras, name, path, base, inplace,
                              (const char *const *)srv->names, srv->nnames, &l, e);
  if (rc != 0)
    return rc;
  models_sync(srv);
  /* every engine loads it (vLLM's add_lora goes to each engine core) */
  for (uint32_t r = 0; r < srv->ndp; r++) {
    if (existed) /* in place: its weights are read again */
      kvr_sim_engine_lora_remove(srv->engines[r].eng, l->id);
    kvr_sim_engine_lora_add(srv->engines[r].eng, l->id, l->rank, charge);
  }
  KVR_INFO("sim", "Loaded new LoRA adapter: name '%s', path '%s' (id %u, rank %u)", l->name,
           l->path, l->id, l->rank);
  return 0;
}

/* The route is there only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (else FastAPI's 404), and takes
 * POST only, with Content-Type application/json (validate_json_request, a dependency of both
 * routes) and a JSON object. Returns it, or NULL when req was answered. */
static cJSON *lora_route_body(kvr_sim_server_t *srv, kvr_http_req_t *req) {
  if (!srv->lora_runtime) {
    respond_fastapi(req, 404, NULL);
    return NULL;
  }
  if (req->method != HTTP_POST) {
    respond_fastapi(req, 405, "POST");
    return NULL;
  }
  kvr_sim_err_t e;
  cJSON *body = read_json(req, true, &e);
  if (body == NULL)
    respond_error(req, &e, false);
  return body;
}

/* A required string field of a LoRA request (pydantic: missing, or not a string: 400). */
static int lora_field(const cJSON *body, const char *name, const char **out, kvr_sim_err_t *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, name);
  if (v == NULL)
    return kvr_sim_err_validation(e, name, NULL, "missing", "Field required");
  if (!cJSON_IsString(v))
    return kvr_sim_err_validation(e, name, NULL, "string_type", "Input should be a valid string");
  *out = v->valuestring;
  return 0;
}

/* 200 with vLLM's plain-text success line (FastAPI's Response(content=...): no media type). */
static void lora_success(kvr_http_req_t *req, const char *name, const char *what) {
  char msg[600];
  int n = snprintf(msg, sizeof(msg), "Success: LoRA adapter '%.500s' %s successfully.", name, what);
  kvr_http_respond(req, 200, NULL, NULL, msg, (size_t)KVR_MIN(n, (int)sizeof(msg) - 1));
}

/* POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"?} */
static void handle_load_lora(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  cJSON *body = lora_route_body(srv, req);
  if (body == NULL)
    return;
  kvr_sim_err_t e;
  const char *name = NULL, *path = NULL;
  bool inplace = false;
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "load_inplace");
  int rc = lora_field(body, "lora_name", &name, &e);
  if (rc == 0)
    rc = lora_field(body, "lora_path", &path, &e);
  if (rc == 0 && in != NULL && !cJSON_IsBool(in))
    rc = kvr_sim_err_validation(&e, "load_inplace", NULL, "bool_type",
                                "Input should be a valid boolean");
  inplace = cJSON_IsTrue(in);
  if (rc == 0)
    rc = lora_load(srv, name, path, NULL, inplace, true, &e);
  if (rc != 0)
    respond_error(req, &e, false);
  else
    lora_success(req, name, "added");
  cJSON_Delete(body);
}

/* POST /v1/unload_lora_adapter {"lora_name"}: forgotten by the API server and the engine (its
 * caches); requests already running with it finish with it. */
static void handle_unload_lora(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_sim_server_t *srv = data;
  (void)tail;
  cJSON *body = lora_route_body(srv, req);
  if (body == NULL)
    return;
  kvr_sim_err_t e;
  const char *name = NULL;
  uint32_t id = 0;
  int rc = lora_field(body, "lora_name", &name, &e);
  if (rc == 0)
    rc = kvr_sim_loras_unload(&srv->loras, name, &id, &e);
  if (rc != 0) {
    respond_error(req, &e, false);
  } else {
    models_sync(srv);
    for (uint32_t r = 0; r < srv->ndp; r++)
      kvr_sim_engine_lora_remove(srv->engines[r].eng, id);
    KVR_INFO("sim", "Removed LoRA adapter: name '%s'", name);
    lora_success(req, name, "removed");
  }
  cJSON_Delete(body);
}

static void handle_chat(kvr_http_req_t *req, void *data, const char *tail) {
  (void)tail;
  handle_completion(data, req, true);
}

static void handle_completions(kvr_http_req_t *req, void *data, const char *tail) {
  (void)tail;
  handle_completion(data, req, false);
}

static void handle_health(kvr_http_req_t *req, void *data, const char *tail) {
  (void)data;
  (void)tail;
  kvr_http_respond(req, 200, NULL, NULL, "", 0);
}

/* vLLM's routes; 404 and 405 (with Allow) answer in FastAPI's words, as vLLM does. */
static const kvr_http_route_t routes[] = {
    {"/v1/chat/completions", KVR_HTTP_M(POST), handle_chat},
    {"/v1/completions", KVR_HTTP_M(POST), handle_completions},
    {"/v1/responses", KVR_HTTP_M(POST), handle_responses},
    {"/v1/responses/*", KVR_HTTP_M_ANY, handle_responses_id}, /* its own 404/405 */
    {"/v1/messages", KVR_HTTP_M(POST), handle_messages},
    {"/v1/messages/count_tokens", KVR_HTTP_M(POST), handle_count_tokens},
    {"/health", KVR_HTTP_M(GET), handle_health},
    {"/v1/models", KVR_HTTP_M(GET), handle_models},
    {"/metrics", KVR_HTTP_M(GET), handle_metrics},
    {"/reset_prefix_cache", KVR_HTTP_M(POST), handle_reset_prefix_cache},
    {"/v1/load_lora_adapter", KVR_HTTP_M_ANY, handle_load_lora},     /* its own 404/405 */
    {"/v1/unload_lora_adapter", KVR_HTTP_M_ANY, handle_unload_lora}, /* its own 404/405 */
    {"/tokenize", KVR_HTTP_M(POST), handle_tokenize},
    {"/sim/fault", KVR_HTTP_M(GET) | KVR_HTTP_M(POST), handle_fault},
};

static void on_request(kvr_http_req_t *req, void *data) {
  kvr_sim_server_t *srv = data;
  if (srv->closing) {
    kvr_http_error(req, 503, NULL, NULL, "server is shutting down");
    return;
  }
  kvr_http_route_dispatch(routes, KVR_ARRAY_SIZE(routes), req, srv, KVR_HTTP_DIALECT_FASTAPI);
}

/* ---- lifetime ---- */

/* vllm/envs.py: VLLM_ENABLE_RESPONSES_API_STORE is bool(int(value)), default "0"; the sim reads
 * anything but a nonzero integer as off. */
static bool store_env(const char *v) {
  if (v == NULL || v[0] == '\0')
    return false;
  char *end;
  long n = strtol(v, &end, 10);
  return *end == '\0' && n != 0;
}

/* Frees the engines (their fds and poll handles already closed, or never made). */
static void engines_free(kvr_sim_server_t *srv) {
  for (uint32_t r = 0; r < srv->ndp; r++) {
    kvr_sim_engine_free(srv->engines[r].eng);
  }
  free(srv->engines);
  srv->engines = NULL;
  srv->ndp = 0;
}

/* vllm/envs.py: VLLM_ALLOW_RUNTIME_LORA_UPDATING is on when, stripped and lowercased, it is "1" or
 * "true". */
static bool runtime_lora_env(const char *v) {
  if (v == NULL)
    return false;
  while (*v == ' ' || *v == '\t' || *v == '\n')
    v++;
  size_t n = strlen(v);
  while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\n'))
    n--;
  return (n == 1 && v[0] == '1') || (n == 4 && strncasecmp(v, "true", 4) == 0);
}

/* --lora-modules, loaded before the server starts (vLLM's init_static_loras: one that fails
 * aborts the start with its message). */
static int load_static_loras(kvr_sim_server_t *srv, char *err, size_t errlen) {
  for (size_t i = 0; i < srv->opts.nlora_modules; i++) {
    const kvr_sim_lora_module_t *m = &srv->opts.lora_modules[i];
    kvr_sim_err_t e;
    if (lora_load(srv, m->name, m->path, m->base_model_name, false, false, &e) != 0) {
      snprintf(err, errlen, "lora-modules: %s", e.message);
      return KVR_EINVAL;
    }
  }
  srv->opts.lora_modules = NULL; /* the caller's: not kept */
  srv->opts.nlora_modules = 0;
  return 0;
}

/* Creates the n data-parallel engines (each a copy of cfg, its histograms, its timerfd; the poll
 * handles are initialised by the caller). 0, or -1 (errno set) when a timerfd cannot be made. */
static int engines_new(kvr_sim_server_t *srv, const kvr_sim_config_t *cfg, uint32_t n) {
  srv->engines = kvr_xcalloc(n, sizeof(*srv->engines));
  srv->ndp = n;
  for (uint32_t r = 0; r < n; r++) {
    engine_t *e = &srv->engines[r];
    e->srv = srv;
    e->rank = r;
    e->step_fd = -1;
    e->eng = kvr_sim_engine_new(cfg); /* cfg was checked: only out of memory fails, and aborts */
    kvr_hist_init(&e->ttft, ttft_buckets, KVR_ARRAY_SIZE(ttft_buckets));
    kvr_hist_init(&e->itl, itl_buckets, KVR_ARRAY_SIZE(itl_buckets));
    kvr_hist_init(&e->e2e, e2e_buckets, KVR_ARRAY_SIZE(e2e_buckets));
    e->step_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (e->step_fd < 0) {
      int saved = errno;
      for (uint32_t k = 0; k < r; k++)
        close(srv->engines[k].step_fd);
      srv->engines[r].step_fd = -1;
      engines_free(srv);
      errno = saved;
      return -1;
    }
  }
  return 0;
}

static void names_free(kvr_sim_server_t *srv) {
  for (size_t i = 0; i < srv->nnames; i++)
    free(srv->names[i]);
  free(srv->names);
}

kvr_sim_server_t *kvr_sim_server_new(uv_loop_t *loop, const kvr_sim_server_opts_t *opts, char *err,
                                     size_t errlen) {
  if (!(opts->time_scale > 0) || opts->time_scale > 1e6) {
    snprintf(err, errlen, "time_scale: must be in (0, 1e6]");
    return NULL;
  }
  kvr_sim_config_t cfg = opts->engine;
  if (kvr_sim_config_check(&cfg, err, errlen) != 0)
    return NULL;
  /* vLLM refuses to start when max_model_len does not fit the cache; the sim shrinks it instead so
   * that tiny caches stay usable in tests. */
  uint64_t cache_tokens = (uint64_t)cfg.num_gpu_blocks * cfg.block_size;
  if (cfg.max_model_len > cache_tokens)
    cfg.max_model_len = (uint32_t)KVR_MAX(cache_tokens, 2u);
  if (opts->data_parallel_size < 1 || opts->data_parallel_size > KVR_SIM_DP_MAX) {
    snprintf(err, errlen, "data_parallel_size: must be in [1, %d]", KVR_SIM_DP_MAX);
    return NULL;
  }
  kvr_sim_server_t *srv = kvr_xcalloc(1, sizeof(*srv));
  srv->port = -1;
  kvr_list_init(&srv->streams);
  kvr_list_init(&srv->subs);
  if (engines_new(srv, &cfg, opts->data_parallel_size) != 0) {
    free(srv);
    snprintf(err, errlen, "timerfd: %s", strerror(errno));
    return NULL;
  }
  srv->loop = loop;
  srv->id_salt = kvr_random_seed();
  srv->opts = *opts;
  srv->opts.engine = cfg;
  srv->listen = kvr_xstrdup(opts->listen);
  srv->admin_listen = kvr_xstrdup(opts->admin_listen);
  srv->model = kvr_xstrdup(opts->model);
  srv->opts.listen = srv->listen;
  srv->opts.admin_listen = srv->admin_listen;
  srv->opts.model = srv->model;
  /* vLLM: served_model_name defaults to the model (vllm/config/model.py) */
  srv->nnames = opts->nserved > 0 ? opts->nserved : 1;
  srv->names = kvr_xcalloc(srv->nnames, sizeof(*srv->names));
  for (size_t i = 0; i < srv->nnames; i++)
    srv->names[i] = kvr_xstrdup(opts->nserved > 0 ? opts->served_names[i] : opts->model);
  srv->opts.served_names = (const char *const *)srv->names;
  srv->opts.nserved = srv->nnames;
  srv->models.names = (const char *const *)srv->names;
  srv->models.nnames = srv->nnames;
  srv->lora_on = cfg.max_loras > 0;
  srv->lora_runtime = runtime_lora_env(getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"));
  kvr_sim_loras_init(&srv->loras, opts->max_lora_rank);
  models_sync(srv);
  if (load_static_loras(srv, err, errlen) != 0) {
    engines_free(srv);
    kvr_sim_loras_free(&srv->loras);
    free(srv->listen);
    free(srv->admin_listen);
    free(srv->model);
    names_free(srv);
    free(srv);
    return NULL;
  }
  kvr_http_limits_default(&srv->limits);
  srv->limits.max_body = 64 * 1024 * 1024;
  for (uint32_t r = 0; r < srv->ndp; r++) {
    /* a timerfd (made by engines_new) is always a valid fd for epoll */
    if (uv_poll_init(loop, &srv->engines[r].step_poll, srv->engines[r].step_fd) != 0)
      kvr_oom("uv_poll_init of a timerfd", 0);
    srv->engines[r].step_poll.data = &srv->engines[r];
  }
  srv->store_enabled = store_env(getenv("VLLM_ENABLE_RESPONSES_API_STORE"));
  srv->store = kvr_sim_rstore_new(KVR_SIM_RSTORE_MAX);
  uv_timer_init(loop, &srv->refuse_timer);
  srv->refuse_timer.data = srv;
  kvr_sim_fault_default(&srv->fault, KVR_SIM_FAULT_NONE);
  return srv;
}

int kvr_sim_server_start(kvr_sim_server_t *srv, char *err, size_t errlen) {
  int rc = listen_main(srv, srv->listen, err, errlen);
  if (rc != 0)
    return rc;
  /* remember the bound port so that the refuse fault can listen again on the same one */
  const char *colon = strrchr(srv->listen, ':');
  int hostlen = colon ? (int)(colon - srv->listen) : 0;
  srv->port = kvr_http_server_port(srv->http);
  snprintf(srv->bound, sizeof(srv->bound), "%.*s:%d", hostlen, srv->listen, srv->port);
  if (srv->admin_listen) {
    srv->admin = kvr_http_server_new(srv->loop, &srv->limits, on_request, srv);
    rc = kvr_http_server_listen(srv->admin, srv->admin_listen, err, errlen);
    if (rc != 0)
      return rc;
  }
  /* one publisher per engine, on the endpoints moved to its rank (vLLM's EventPublisherFactory
   * with data_parallel_rank), each batch carrying the rank */
  for (uint32_t r = 0; kvr_kv_events_config_active(&srv->opts.kv_events) && r < srv->ndp; r++) {
    engine_t *e = &srv->engines[r];
    kvr_kv_events_config_t kc = srv->opts.kv_events;
    if (kvr_kv_events_config_for_rank(&kc, r, err, errlen) != 0)
      return KVR_EINVAL;
    e->kv_pub = kvr_kv_pub_new(srv->loop, &kc, srv->opts.kv_encoding, err, errlen);
    if (e->kv_pub == NULL)
      return KVR_EINVAL;
    kvr_kv_pub_set_dp_rank(e->kv_pub, (int)r);
    kvr_sim_engine_kv_events(e->eng, true);
  }
  if (srv->opts.fault.mode != KVR_SIM_FAULT_NONE)
    apply_fault(srv, &srv->opts.fault);
  return 0;
}

int kvr_sim_server_port(const kvr_sim_server_t *srv) {
  return srv->port;
}

int kvr_sim_server_admin_port(const kvr_sim_server_t *srv) {
  return srv->admin ? kvr_http_server_port(srv->admin) : -1;
}

static void on_handle_close(uv_handle_t *h) {
  kvr_sim_server_t *srv = h->data;
  srv->pending_closes--;
  if (srv->closing && srv->pending_closes == 0 && srv->done) {
    void (*done)(void *) = srv->done;
    srv->done = NULL;
    done(srv->done_data);
  }
}

static void on_step_poll_close(uv_handle_t *h) {
  engine_t *e = h->data;
  close(e->step_fd);
  e->step_fd = -1;
  uv_handle_t sh = {.data = e->srv};
  on_handle_close(&sh);
}

static void on_kv_pub_closed(void *data) {
  uv_handle_t h = {.data = data};
  on_handle_close(&h);
}

void kvr_sim_server_close(kvr_sim_server_t *srv, void (*done)(void *data), void *data) {
  srv->closing = true;
  srv->done = done;
  srv->done_data = data;
  srv->pending_closes++; /* held until the end of this function */
  for (uint32_t r = 0; r < srv->ndp; r++)
    srv->engines[r].have_step = false;
  while (!kvr_list_empty(&srv->streams)) {
    stream_t *s = KVR_CONTAINER_OF(srv->streams.next, stream_t, node);
    stream_release(s, true);
    stream_destroy(s);
  }
  while (!kvr_list_empty(&srv->subs)) {
    sub_t *sub = KVR_CONTAINER_OF(srv->subs.next, sub_t, node);
    sub->req->data = NULL;
    sub->req->on_close = NULL;
    kvr_http_abort(sub->req);
    sub_free(sub);
  }
  for (uint32_t r = 0; r < srv->ndp; r++) {
    engine_t *e = &srv->engines[r];
    if (e->kv_pub) {
      srv->pending_closes++;
      kvr_kv_pub_close(e->kv_pub, on_kv_pub_closed, srv);
      e->kv_pub = NULL;
    }
    srv->pending_closes++;
    uv_close((uv_handle_t *)&e->step_poll, on_step_poll_close);
  }
  srv->pending_closes++;
  uv_close((uv_handle_t *)&srv->refuse_timer, on_handle_close);
  if (srv->http) {
    retire_http(srv, srv->http);
    srv->http = NULL;
  }
  if (srv->admin) {
    retire_http(srv, srv->admin);
    srv->admin = NULL;
  }
  srv->pending_closes--;
  if (srv->pending_closes == 0 && srv->done) {
    srv->done = NULL;
    done(data);
  }
}

void kvr_sim_server_free(kvr_sim_server_t *srv) {
  if (srv == NULL)
    return;
  engines_free(srv);
  kvr_sim_rstore_free(srv->store);
  free(srv->listen);
  free(srv->admin_listen);
  free(srv->model);
  names_free(srv);
  kvr_sim_loras_free(&srv->loras);
  kvr_buf_free(&srv->scratch);
  free(srv);
}

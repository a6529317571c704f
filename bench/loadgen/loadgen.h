/* loadgen.h -- the open-loop load generator of `kvrouter bench` (libuv + libcurl on one loop).
 *
 * One kvr_loadgen_t drives one OpenAI-compatible endpoint (the router, one worker or a vLLM server)
 * with streaming chat, completions or Responses requests built by workload.h (Responses: each
 * turn names the id the previous turn's answer carried, kept per conversation), and measures each
 * one into a kvr_req_rec_t (stats.h). Transfers go through kvr_curlm_t (src/net/curlm.h) on the
 * caller's loop.
 *
 * Load modes of kvr_loadgen_run_level():
 *   rate > 0, !sessions   open loop: arrivals at `rate` req/s (gamma gaps, shape = burstiness;
 *                         Poisson at 1). Each arrival sends the next *eligible* turn of an open
 *                         conversation (eligible = previous turn done + think time), oldest first,
 *                         else the first turn of a new conversation. So "rate" is requests/s of
 * turn arrivals, the figure `vllm bench serve --request-rate` means. rate > 0, replay (multiturn
 * with opts.replay, the default): the seed's `vllm bench serve` shape. Arrival i sends a
 * pre-assigned (conversation, turn) whose prompt is the full history with pre-built answers,
 * without waiting for anything: blocks of replay_width conversations send turn 1 of each, then turn
 * 2, ..., so turn t+1 follows turn t replay_width requests later and every level has the full,
 * uniform turn mix. With opts.replay_sample
 *                         (--replay-order sample) arrival i is instead a uniformly random turn of
 *                         a conversation of its own: a dataset of prompts sampled at random, only
 *                         the starters shared (the calibration shape).
 *   rate > 0, sessions    arrivals start conversations; later turns follow their predecessor.
 *   concurrency > 0       N closed-loop users, each running conversations turn after turn
 *                         (always as sessions: the answers streamed back are resent), measured
 *                         in steady state, as a fleet of N users chatting continuously would be
 *                         observed (see "Steady state" below).
 * A rate level sends warmup + num_prompts requests (warmup raised to rate * warmup_s); the first
 * `warmup` are flagged and not measured.
 *
 * Steady state (concurrency levels; bench/loadgen/README.md has the why):
 *   start     user u's first conversation starts at turn kvr_workload_start_turn(level_seed, u,
 *             nturns) (uniform over the turns), its earlier turns carrying synthetic answers of
 *             their max_tokens (kvr_workload_answer): a user observed mid-conversation. Later
 *             conversations start at turn 1. Single-turn conversations are unaffected.
 *   warm-up   a send is warm-up when it is its user's first (its history is cold), one of the
 *             first `warmup` sends, or sent before warmup_s simulated seconds since the level
 *             start (kvr_loadgen_phase). The next num_prompts sends are measured.
 *   drain     after the last measured send the users keep sending (cool-down: flagged warmup and
 *             cooldown, excluded from every metric) until every measured request completed; then
 *             nothing more is sent and the excluded requests still in flight are cancelled (not
 *             recorded, not failures), so every measured request ran at N users' load.
 *
 * Time scale N (matches `kvrouter sim --time-scale N`): a target rate R (simulated) is sent at R*N
 * real req/s, think times are divided by N, and measured durations are multiplied by N, so every
 * figure is in simulated time. Send lag stays in real time: it measures the generator itself.
 *
 * Scheduling precision (bench/results/ACCURACY.md has the measurements): the next request is
 * prepared (body rendered, easy handle set up) right after the previous send, so a send is only the
 * handover to curl. On Linux a timerfd with an absolute deadline wakes the loop 500 us before the
 * arrival and the generator waits on the clock for the exact instant (holding the loop at most
 * that long), which absorbs a wake-up delayed by a batch of stream events; elsewhere a uv timer
 * wakes it up to 1 ms early and re-arms with 0 ms until then. Send lag = handed to curl - due.
 */
#ifndef KVR_LOADGEN_H
#define KVR_LOADGEN_H

#include "stats.h"
#include "workload.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <uv.h>

#define KVR_LOADGEN_MAX_URLS 16 /* endpoints in one --url list */

typedef struct kvr_loadgen_s kvr_loadgen_t;

typedef struct kvr_loadgen_opts_s {
  const char *url;     /* http://HOST:PORT[/v1/chat/completions]; the API path is added if absent. A
                        * comma-separated list: requests alternate between the endpoints in turn
                        * (at most KVR_LOADGEN_MAX_URLS), as a Service spreads them over replicas */
  char *url_owned;     /* the heap copy url points to when the option parser composed it (vllm's
                        * --base-url/--host/--port/--endpoint); kvr_bench_options_free() frees it */
  const char *model;   /* NULL: ask GET /v1/models (kvr_monitor_fetch_model) */
  const char *api_key; /* sent as "Authorization: Bearer" when not NULL */
  kvr_api_t api;
  bool ignore_eos;      /* add "ignore_eos": true so outputs run to max_tokens (vLLM, the sim) */
  double time_scale;    /* >= 1e-6; 1 = real time */
  double burstiness;    /* gamma shape; 1 = Poisson */
  int64_t arrival_seed; /* rate mode: >= 0 sends the measured requests on the schedule of
                         * `vllm bench serve --seed arrival_seed` (np_random.h), after the warm-up
                         * ones; -1 = gaps from the level seed */
  bool sessions;        /* rate = conversation starts/s */
  unsigned warmup;      /* requests per level excluded from metrics (the first sends) */
  double warmup_s;      /* rate mode: at least rate * warmup_s warm-up requests (simulated s), so
                         * the measured part starts once the system has filled up; concurrency
                         * mode: every send in the first warmup_s simulated seconds is warm-up */
  double min_level_s;   /* rate mode: at least rate * min_level_s measured requests (simulated
                         * s): a level must last several response times to measure capacity */
  size_t num_prompts;   /* measured requests per level */
  bool trace_first;     /* a trace level sends only its first warmup + num_prompts requests (vllm's
                         * --num-prompts over a timed_trace); false: the whole trace (window) */
  double self_timed;    /* > 0: a trace level of rate 0 sends each request at its timestamp (the
                         * file's unit, ms) times this many seconds from the first, as `vllm bench
                         * serve --self-timed --timed-trace-sec-multiplier` (0.001: the trace's own
                         * pace); its level rate is then the requests' mean rate */
  unsigned max_concurrency; /* at most this many requests in flight (vllm's --max-concurrency): an
                             * arrival finding them all busy waits, first come first served, its
                             * wait counted in its send lag; 0 = no cap */
  kvr_result_opts_t result; /* how each level's vllm-compatible JSON is written (stats.h) */
  double request_timeout_s; /* real seconds per request; 0 = none */
  bool early_stop;          /* end a level as soon as its TTFT p99 is certain to miss the SLO (see
                             * kvr_loadgen_run_level); for searches, where only pass/fail counts */
  FILE *progress;           /* progress lines go here; NULL = silent */
  bool progress_tty;        /* rewrite one line with \r instead of printing plain lines */
} kvr_loadgen_opts_t;

/* What a send of a concurrency level is (the steady-state rule above). */
typedef enum {
  KVR_LOADGEN_WARMUP = 0, /* excluded: cold history or the system still filling up */
  KVR_LOADGEN_MEASURED,
  KVR_LOADGEN_COOLDOWN, /* excluded: keeps the load at N users until the measured ones finish */
} kvr_loadgen_phase_t;

/* One send of a concurrency level as kvr_loadgen_phase() sees it. */
typedef struct kvr_loadgen_send_s {
  bool user_first;      /* its user's first request of the level */
  size_t sent;          /* requests of the level sent before it */
  double since_s;       /* simulated seconds from the level start to the send */
  size_t measured_sent; /* measured requests sent before it */
} kvr_loadgen_send_t;

/* The phase of send s under opts (warmup, warmup_s, num_prompts): warm-up when s is its user's
 * first, one of the first opts->warmup sends or sent before opts->warmup_s; else measured while
 * fewer than opts->num_prompts were; else cool-down. Pure. */
kvr_loadgen_phase_t kvr_loadgen_phase(const kvr_loadgen_opts_t *opts, const kvr_loadgen_send_t *s);

/* Fills opts with defaults (chat, ignore_eos, time scale 1, Poisson, 300 prompts, no warm-up). */
void kvr_loadgen_opts_default(kvr_loadgen_opts_t *opts);

/* Creates a load generator on loop for workload wl (borrowed; must outlive the generator). Strings
 * in opts are copied. Returns NULL with a reason in err. */
kvr_loadgen_t *kvr_loadgen_new(uv_loop_t *loop, const kvr_loadgen_opts_t *opts,
                               const kvr_workload_t *wl, char *err, size_t errlen);

/* ---- the virtual transport (`kvrouter bench --virtual`) ---------------------------------------
 *
 * The same generator (workload, arrivals, sessions, steady state, early stop, records) can run
 * against a cluster in virtual time instead of an HTTP endpoint: the transport owns the clock and
 * the event loop, takes each request body, and reports back through the kvr_loadgen_vt_* calls
 * below, which do what the HTTP path's curl callbacks do. Time scale is 1 (virtual time is
 * simulated time). Requests are one kvr_loadgen_req_t each, owned by the generator. */
typedef struct kvr_loadgen_req_s kvr_loadgen_req_t;

typedef struct kvr_loadgen_vt_s {
  void *ctx;
  uint64_t (*now_ns)(void *ctx); /* the virtual clock, ns */
  /* Calls fn(arg, tag) from the loop at time t_ns (never earlier than now); no cancel: the
   * generator ignores stale calls by their tag. */
  void (*at)(void *ctx, uint64_t t_ns, void (*fn)(void *arg, uint64_t tag), void *arg,
             uint64_t tag);
  /* Sends r's body (copied) now; returns the transport's handle, or NULL when it cannot. Its
   * answer comes later, from the loop, as kvr_loadgen_vt_head/token/usage, then exactly one
   * kvr_loadgen_vt_done, unless cancelled first. */
  void *(*send)(void *ctx, kvr_loadgen_req_t *r, const char *body, size_t len);
  void (*cancel)(void *ctx, void *handle); /* no callback for it afterwards */
  void (*run)(void *ctx);                  /* runs the loop until stop() */
  void (*stop)(void *ctx);
  /* The generator arg is being freed: drop its calls still pending (kvr_loadgen_free calls it). */
  void (*forget)(void *ctx, void *arg);
} kvr_loadgen_vt_t;

/* A generator on a virtual transport (vt copied; wl borrowed). Returns NULL with err. */
kvr_loadgen_t *kvr_loadgen_new_virtual(const kvr_loadgen_opts_t *opts, const kvr_workload_t *wl,
                                       const kvr_loadgen_vt_t *vt, char *err, size_t errlen);

/* The response head: HTTP status and the x-kvrouter-worker value (NULL if none). */
void kvr_loadgen_vt_head(kvr_loadgen_req_t *r, int status, const char *worker);
/* One streamed token whose text is text[0..len). */
void kvr_loadgen_vt_token(kvr_loadgen_req_t *r, const char *text, size_t len);
/* Responses API: the answer's id (its response.created event), which the conversation's next
 * turn names as previous_response_id. */
void kvr_loadgen_vt_response_id(kvr_loadgen_req_t *r, const char *id);
/* The final usage chunk. */
void kvr_loadgen_vt_usage(kvr_loadgen_req_t *r, uint32_t prompt_tokens, uint32_t completion_tokens,
                          uint32_t cached_tokens);
/* The response ended: error NULL when it arrived whole, else why it failed. r is freed. */
void kvr_loadgen_vt_done(kvr_loadgen_req_t *r, const char *error);

/* Closes the curl multi and the generator's handles, runs the loop until they are closed and frees
 * lg. Accepts NULL. */
void kvr_loadgen_free(kvr_loadgen_t *lg);

/* Runs one level to completion on the loop (returns when every request finished, in a concurrency
 * level when every measured one did, or at once after kvr_loadgen_interrupt()). Exactly one of
 * rate (report req/s; INFINITY: every arrival at the level's start, as vllm's default
 * --request-rate inf) and concurrency is > 0, except a trace level with opts.self_timed, whose
 * rate 0 means the trace's own times. The level's trace is a pure function of level_seed
 * (in a concurrency level, up to which user sends next: that follows the completions). label names
 * the run in progress lines. On success *out is a finished level (SLO-checked against slo) owned by
 * the caller. Returns 0 or KVR_EINVAL. With opts.early_stop the level ends (in-flight requests
 * cancelled, not recorded) once so many measured requests have had a first token at or over
 * slo->ttft_p99_ms that the level's TTFT p99 would miss the SLO whatever the rest do (even if the
 * failures the SLO allows were among them); the level is then marked stopped_early and fails on
 * TTFT. */
int kvr_loadgen_run_level(kvr_loadgen_t *lg, const char *label, double rate, unsigned concurrency,
                          uint64_t level_seed, const kvr_slo_t *slo, kvr_level_t **out);

/* Uses model (copied) in the requests from now on. */
void kvr_loadgen_set_model(kvr_loadgen_t *lg, const char *model);

/* Waits real_seconds on the loop (cooldown); returns early after kvr_loadgen_interrupt(). */
void kvr_loadgen_sleep(kvr_loadgen_t *lg, double real_seconds);

/* Stops the running level or sleep: cancels in-flight transfers (their requests are not recorded),
 * marks the level interrupted. Safe from a uv signal callback on the same loop; not from curl's own
 * callbacks. Sticky: later levels return at once. */
void kvr_loadgen_interrupt(kvr_loadgen_t *lg);
bool kvr_loadgen_interrupted(const kvr_loadgen_t *lg);

#endif

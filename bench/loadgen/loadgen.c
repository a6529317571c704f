/* loadgen.c -- the open-loop engine of `kvrouter bench`: schedules, sends, streams and measures.
 *
 * Two transports, one generator: over HTTP (libcurl on the caller's libuv loop, the clock
 * uv_hrtime) or over a virtual transport (kvr_loadgen_vt_t, loadgen.h: a cluster in virtual time
 * owns the clock and the loop, takes each body and answers through kvr_loadgen_vt_head/token/
 * usage/done). Everything below the transport -- conversations, arrivals, steady state, early stop,
 * records -- is the same code; the HTTP-only parts are the easy handles, the SSE scan and the
 * timerfd, and each place that differs tests lg->virt.
 *
 * Structs:
 *   kvr_loadgen_t  options, the workload (borrowed), the kvr_curlm_t, one scheduler timer (`tick`),
 *                  one progress timer, one `drain` timer that ends a concurrency level, and the
 *                  state of the level being run.
 *   conv_t         one open conversation of the level: the kvr_conv_t from the workload, the
 *                  answers streamed so far (or synthetic ones for a history it starts in the middle
 *                  of), the next turn and when it becomes eligible.
 *   req_t          one request: its easy handle, body, SSE splitter, streamed answer (kept
 *                  only when a later turn resends it), ITL samples and the kvr_req_rec_t being
 *                  filled. At most one is prepared ahead of its send (lg->ready).
 *
 * Flow of a level:
 *
 *   run_level -> build arrival schedule (gamma gaps from level_seed, or vllm bench serve's schedule
 *                for --arrival-seed: np_random.h) -> arm tick -> uv_run
 *   timerfd (or tick): send every due arrival / eligible turn: the prepared req_t -> kvr_curlm_add;
 *         re-arm for the next arrival; prepare the request it will send (prepare_next)
 *   curl header cb: status, x-kvrouter-worker
 *   curl write cb: SSE lines (src/proto/openai.h's splitter) -> "data:" payloads -> token chunks
 *                  by a scan (scan_token), anything else by cJSON and kvr_openai_chunk_read() ->
 *                  tokens, usage, errors
 *   curl done cb: finish record -> kvr_stats_level_add -> conversation's next turn becomes eligible
 *                 after think time -> schedule()
 *   rate: sent == total and nothing in flight -> uv_stop -> kvr_stats_level_finish -> return level
 *   concurrency (steady state, loadgen.h): every user starts mid-conversation (conv_steady_start);
 *         each send is warm-up, measured or cool-down (classify); the last measured completion
 *         halts sending and arms `drain` -> on_drained cancels the excluded requests in flight
 *         -> uv_stop
 *
 * Invariants: every req_t is lg->ready (prepared, not handed to curl) or on the in-flight list
 * from kvr_curlm_add until its done callback (or an interrupt cancels it); a conv_t has at most
 * one request in flight, except in replay mode where turns are pre-assigned to arrivals and
 * answers are pre-built (nothing in the conversation changes when a request finishes); requests
 * are sent only from schedule() (the timerfd or tick, or after a transfer's done callback), never
 * inside curl's own callbacks. Durations recorded are real durations times the time scale; lag
 * stays real. Only the engine's share is compressed by a time-scaled simulator, so when the first
 * chunk carries the simulator's "kvr_sim_engine_us" the rest of the TTFT (client, router and
 * loopback: transport_ms) is counted once, at 1x, in TTFT and E2E; TPOT and ITL are unaffected.
 */
#include "loadgen.h"
#include "np_random.h"
#include "trace_replay.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/list.h"
#include "base/quantile.h"
#include "net/curlm.h"
#include "proto/openai.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/timerfd.h>
#endif

#define MAX_SSE_LINE ((size_t)1 << 20)
#define MAX_ANSWER ((size_t)4 << 20)
#define MAX_ERROR_BODY 2048

typedef struct kvr_loadgen_req_s req_t;

typedef struct conv_s {
  kvr_conv_t conv;
  char **answers;       /* nturns entries, owned */
  uint32_t next_turn;   /* 0-based turn to send next */
  uint64_t eligible_ns; /* when next_turn may be sent (valid while waiting) */
  bool waiting;         /* next_turn is due to be sent and not in flight */
  bool dead;            /* finished or abandoned after a failure */
  bool user_first;      /* its next send is its user's first request of the level */
  char *prev_id;        /* Responses API: the id of the last answered turn (owned), which the
                         * next turn names as previous_response_id; NULL before the first */
  unsigned user;        /* concurrency mode: the user running it */
} conv_t;

struct kvr_loadgen_req_s {
  kvr_loadgen_t *lg;
  conv_t *cv;
  uint32_t turn;
  CURL *easy; /* HTTP transport */
  void *vh;   /* virtual transport: its handle, from kvr_loadgen_vt_t.send */
  struct curl_slist *headers;
  kvr_buf_t body, answer, errbody;
  kvr_buf_t text;       /* --save-detailed: the generated text of a measured request */
  kvr_openai_sse_t sse; /* the response's SSE lines (see on_write for the bound) */
  double *itls;
  size_t nitl, capitl;
  uint64_t sent_ns, first_ns, last_ns;
  uint64_t engine_ns; /* the simulator's engine share of the TTFT, wall ns; 0 if not reported */
  bool stream_error;
  bool keep_answer; /* the streamed text is resent by a later turn (session mode) */
  char *resp_id;    /* Responses API: the answer's id (response.created), owned, or NULL */
  kvr_req_rec_t rec;
  kvr_list_t node; /* in lg->inflight from kvr_curlm_add until done or cancelled */
};

struct kvr_loadgen_s {
  uv_loop_t *loop; /* NULL for a virtual transport */
  bool virt;       /* the virtual transport (vt) instead of libuv and curl */
  kvr_loadgen_vt_t vt;
  uint64_t wake_gen; /* virtual: the current wake-up's generation (older ones are stale) */
  uint64_t level_no; /* levels started; a deferred call of an earlier level is stale */
  kvr_loadgen_opts_t o;
  char *url, *model, *api_key;
  char *urls[KVR_LOADGEN_MAX_URLS]; /* the endpoints requests alternate between (urls[0] == url) */
  size_t nurls;
  uint64_t url_next; /* requests prepared: the next one goes to urls[url_next % nurls] */
  const kvr_workload_t *wl;
  kvr_curlm_t *curlm;
  uv_timer_t tick, progress, sleeper;
  uv_timer_t drain; /* ends a concurrency level from the loop once its measured requests are done */
  int tfd;          /* Linux: timerfd waking the loop SEND_EARLY_NS before the next send
                     * (hrtimer precision); -1 elsewhere (`tick` then wakes up to 1 ms early
                     * and re-arms with 0 ms until the send) */
  uv_poll_t tfd_poll;
  int open_handles;
  bool interrupted;
  bool running; /* uv_run is in progress for a level or a sleep */

  /* Level state. */
  kvr_level_t *lv;
  const char *label;
  double rate;     /* report req/s */
  bool self_timed; /* a trace at its own times (opts.self_timed): rate is their mean rate */
  unsigned concurrency;
  uint64_t level_seed;
  uint64_t start_ns;
  uint64_t *arrivals; /* rate mode: real ns offsets from start_ns */
  size_t total, sent, done, failed, next_arrival;
  double stop_ttft_ms; /* early stop: the TTFT SLO (simulated ms); 0 = never stop early */
  size_t ttft_over,
      ttft_over_stop; /* measured first tokens at or over it; how many end the level */
  bool stopped_early;
  uint64_t next_conv;
  conv_t *spare;  /* the next new conversation, generated ahead of its send; owned */
  req_t *ready;   /* the next request, body rendered and easy handle set up ahead of its
                   * send time (for ready->cv, turn ready->turn); owned, not in flight */
  conv_t **convs; /* every conversation opened this level, owned */
  size_t nconvs, capconvs;
  kvr_list_t inflight; /* requests handed to curl (req_t.node), newest first */
  size_t ninflight;    /* their number */
  uint64_t last_progress_ns;
  size_t progress_len;
  unsigned warmup;  /* warm-up requests of this level */
  bool replay;      /* this level replays pre-built conversations (see replay_slot) */
  bool halted;      /* nothing more is sent: early stop, or a concurrency level's measured requests
                     * all completed */
  bool cap_held;    /* a due send waits for a --max-concurrency slot */
  uint64_t slot_ns; /* the last completion: when a slot last freed */
  size_t msent, mdone;          /* measured requests sent, and finished (ok or not) */
  size_t nwarm, ncool, ncancel; /* warm-up and cool-down sends; cancelled in-flight requests */
};

void kvr_loadgen_opts_default(kvr_loadgen_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->url = "http://127.0.0.1:8000";
  o->model = "default";
  o->api = KVR_API_CHAT;
  o->ignore_eos = true;
  o->time_scale = 1;
  o->burstiness = 1;
  o->arrival_seed = -1;
  o->num_prompts = 300;
  o->request_timeout_s = 600;
}

static double scale(const kvr_loadgen_t *lg) {
  return lg->o.time_scale;
}

/* The generator's clock: CLOCK_MONOTONIC (uv_hrtime), or the virtual transport's. */
static uint64_t now_ns(const kvr_loadgen_t *lg) {
  return lg->virt ? lg->vt.now_ns(lg->vt.ctx) : uv_hrtime();
}

/* Virtual transport: what a deferred call (kvr_loadgen_vt_t.at) does; its tag is kind | gen << 2.
 */
enum { VT_WAKE = 0, VT_STOP_EARLY = 1, VT_DRAINED = 2 };
static void vt_fire(void *arg, uint64_t tag);

/* Runs fn from the loop soon, outside the transport's own callbacks (cancelling there is not
 * allowed). */
static void defer(kvr_loadgen_t *lg, uv_timer_t *t, uv_timer_cb fn, int kind) {
  if (lg->virt)
    lg->vt.at(lg->vt.ctx, now_ns(lg), vt_fire, lg, (uint64_t)kind | lg->level_no << 2);
  else
    uv_timer_start(t, fn, 0, 0);
}

static void on_handle_closed(uv_handle_t *h) {
  kvr_loadgen_t *lg = h->data;
  lg->open_handles--;
}

/* Every element of a comma-separated endpoint list is an http(s) URL. */
static bool urls_ok(const char *list) {
  size_t n = 0;
  for (const char *p = list;; n++) {
    if (strncmp(p, "http://", 7) != 0 && strncmp(p, "https://", 8) != 0)
      return false;
    const char *comma = strchr(p, ',');
    if (comma == NULL)
      return n < KVR_LOADGEN_MAX_URLS;
    p = comma + 1;
  }
}

kvr_loadgen_t *kvr_loadgen_new(uv_loop_t *loop, const kvr_loadgen_opts_t *o,
                               const kvr_workload_t *wl, char *err, size_t errlen) {
  if (o->url == NULL || !urls_ok(o->url) || !(o->time_scale >= 1e-6) || !(o->burstiness > 0) ||
      o->num_prompts == 0) {
    snprintf(err, errlen,
             "loadgen: need an http(s) URL, a model, time scale > 0, burstiness > 0 "
             "and at least one prompt");
    return NULL;
  }
  kvr_loadgen_t *lg = kvr_xcalloc(1, sizeof(*lg));
  lg->loop = loop;
  lg->o = *o;
  lg->wl = wl;
  kvr_list_init(&lg->inflight);
  /* The endpoints (a comma-separated list: requests alternate between them, as a Service spreads
   * them over router replicas): keep a full /v1/... path, else add the API's. */
  for (const char *p = o->url; *p && lg->nurls < KVR_LOADGEN_MAX_URLS;) {
    const char *comma = strchr(p, ',');
    size_t n = comma ? (size_t)(comma - p) : strlen(p);
    kvr_buf_t u = KVR_BUF_INIT;
    kvr_buf_append(&u, p, n);
    while (u.len > 0 && u.data[u.len - 1] == '/')
      u.data[--u.len] = '\0';
    if (u.len < 8 || strstr(u.data + 8, "/v1/") == NULL)
      kvr_buf_puts(&u, kvr_workload_api_path(o->api));
    lg->urls[lg->nurls++] = kvr_buf_steal(&u);
    p = comma ? comma + 1 : p + n;
  }
  lg->url = lg->urls[0];
  lg->model = kvr_xstrdup(o->model ? o->model : "default");
  lg->api_key = kvr_xstrdup(o->api_key);
  lg->curlm = kvr_curlm_new(loop);
  if (lg->curlm == NULL) {
    snprintf(err, errlen, "loadgen: curl multi init failed");
    for (size_t i = 0; i < lg->nurls; i++)
      free(lg->urls[i]);
    free(lg->model);
    free(lg->api_key);
    free(lg);
    return NULL;
  }
  uv_timer_init(loop, &lg->tick);
  uv_timer_init(loop, &lg->progress);
  uv_timer_init(loop, &lg->sleeper);
  uv_timer_init(loop, &lg->drain);
  lg->tick.data = lg->progress.data = lg->sleeper.data = lg->drain.data = lg;
  lg->open_handles = 4;
  lg->tfd = -1;
#ifdef __linux__
  /* uv_hrtime() reads CLOCK_MONOTONIC, so a send time is directly an absolute timerfd deadline. */
  int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd >= 0) {
    if (uv_poll_init(loop, &lg->tfd_poll, fd) == 0) {
      lg->tfd = fd;
      lg->tfd_poll.data = lg;
      lg->open_handles++;
    } else {
      close(fd);
    }
  }
#endif
  return lg;
}

kvr_loadgen_t *kvr_loadgen_new_virtual(const kvr_loadgen_opts_t *o, const kvr_workload_t *wl,
                                       const kvr_loadgen_vt_t *vt, char *err, size_t errlen) {
  if (!(o->burstiness > 0) || o->num_prompts == 0 || vt == NULL || vt->now_ns == NULL ||
      vt->at == NULL || vt->send == NULL || vt->cancel == NULL || vt->run == NULL ||
      vt->stop == NULL) {
    snprintf(err, errlen, "loadgen: need burstiness > 0, at least one prompt and a transport");
    return NULL;
  }
  kvr_loadgen_t *lg = kvr_xcalloc(1, sizeof(*lg));
  lg->virt = true;
  lg->vt = *vt;
  lg->o = *o;
  lg->o.time_scale = 1; /* virtual time is simulated time */
  lg->wl = wl;
  kvr_list_init(&lg->inflight);
  lg->url = kvr_xstrdup(o->url ? o->url : "virtual");
  lg->model = kvr_xstrdup(o->model ? o->model : "default");
  lg->api_key = kvr_xstrdup(o->api_key);
  lg->tfd = -1;
  lg->sleeper.data = lg; /* on_stop_early reads it */
  return lg;
}

void kvr_loadgen_free(kvr_loadgen_t *lg) {
  if (lg == NULL)
    return;
  if (lg->virt) {
    if (lg->vt.forget != NULL)
      lg->vt.forget(lg->vt.ctx, lg);
    free(lg->url);
    free(lg->model);
    free(lg->api_key);
    free(lg);
    return;
  }
  kvr_curlm_close(lg->curlm);
  uv_close((uv_handle_t *)&lg->tick, on_handle_closed);
  uv_close((uv_handle_t *)&lg->progress, on_handle_closed);
  uv_close((uv_handle_t *)&lg->sleeper, on_handle_closed);
  uv_close((uv_handle_t *)&lg->drain, on_handle_closed);
  if (lg->tfd >= 0)
    uv_close((uv_handle_t *)&lg->tfd_poll, on_handle_closed);
  /* Bounded: the handles and curl's sockets close within a few loop iterations. */
  for (int i = 0; i < 1000 && lg->open_handles > 0; i++)
    uv_run(lg->loop, UV_RUN_NOWAIT);
  uv_run(lg->loop, UV_RUN_NOWAIT);
  if (lg->tfd >= 0)
    close(lg->tfd);                      /* after its poll handle closed */
  for (size_t i = 1; i < lg->nurls; i++) /* urls[0] is url */
    free(lg->urls[i]);
  free(lg->url);
  free(lg->model);
  free(lg->api_key);
  free(lg);
}

bool kvr_loadgen_interrupted(const kvr_loadgen_t *lg) {
  return lg->interrupted;
}

/* ---- requests -------------------------------------------------------------------------------- */

static void req_free(req_t *r) {
  if (r == NULL)
    return;
  if (r->easy)
    curl_easy_cleanup(r->easy);
  curl_slist_free_all(r->headers);
  kvr_buf_free(&r->body);
  kvr_openai_sse_free(&r->sse);
  kvr_buf_free(&r->answer);
  kvr_buf_free(&r->errbody);
  kvr_buf_free(&r->text);
  free(r->resp_id);
  free(r->itls);
  free(r);
}

static void inflight_remove(kvr_loadgen_t *lg, req_t *r) {
  kvr_list_remove(&r->node);
  lg->ninflight--;
}

static void set_error(req_t *r, const char *msg) {
  if (r->rec.error[0] != '\0')
    return;
  size_t n = KVR_MIN(strlen(msg), sizeof(r->rec.error) - 1);
  memcpy(r->rec.error, msg, n);
  r->rec.error[n] = '\0';
}

/* The transport share of the request's real TTFT, wall ns: all of it but the engine's share the
 * simulator reported in its first chunk; -1 when none was reported (vLLM) or no token came. */
static double transport_ns(const req_t *r) {
  if (r->first_ns == 0)
    return -1;
  double ttft_real = (double)(r->first_ns - r->sent_ns), eng = (double)r->engine_ns;
  return eng > 0 && eng <= ttft_real ? ttft_real - eng : -1;
}

/* The real time from the send to until_ns in simulated ms. Transport is not sped up by the
 * simulator, so it is not stretched either: transport + the rest x scale (TTFT, E2E). */
static double sim_ms(const req_t *r, uint64_t until_ns) {
  double real = (double)(until_ns - r->sent_ns), tr = fmax(transport_ns(r), 0);
  return (tr + (real - tr) * scale(r->lg)) / 1e6;
}

static void on_stop_early(uv_timer_t *t);

static void on_token(req_t *r, uint64_t now) {
  r->rec.chunks++;
  if (r->first_ns == 0) {
    r->first_ns = now;
    kvr_loadgen_t *lg = r->lg;
    if (lg->stop_ttft_ms > 0 && !r->rec.warmup && sim_ms(r, now) >= lg->stop_ttft_ms &&
        ++lg->ttft_over == lg->ttft_over_stop)
      defer(lg, &lg->sleeper, on_stop_early, VT_STOP_EARLY); /* cancel from the loop */
  } else {
    if (r->nitl == r->capitl) {
      r->capitl = r->capitl ? r->capitl * 2 : 256;
      r->itls = kvr_xrealloc(r->itls, r->capitl * sizeof(double));
    }
    r->itls[r->nitl++] = (double)(now - r->last_ns) / 1e6 * scale(r->lg);
  }
  r->last_ns = now;
}

/* A token's text: resent by a later turn (session mode), or kept for vllm's generated_texts. */
static void keep_text(req_t *r, const char *text, size_t len) {
  if (r->keep_answer && r->answer.len + len <= MAX_ANSWER)
    kvr_buf_append(&r->answer, text, len);
  if (r->lg->o.result.save_detailed && !r->rec.warmup && r->text.len + len <= MAX_ANSWER)
    kvr_buf_append(&r->text, text, len);
}

static const char *find(const char *hay, size_t n, const char *needle, size_t nl) {
  return memmem(hay, n, needle, nl);
}
#define FIND(hay, n, lit) find((hay), (n), (lit), sizeof(lit) - 1)

/* The common chunk cheaply: a token chunk of one choice whose text has no escapes and which carries
 * no usage and no error, e.g. {...,"choices":[{"index":0,"delta":{"content":"tok"},...}]}. Sets the
 * token's raw text and returns true; returns false for anything else (role chunk, empty or escaped
 * text, usage, error, reasoning_content, several choices...), which on_event() then parses with
 * cJSON. Keys and quotes inside JSON string values are escaped, so an unescaped `"content":"` can
 * only be a key: the scan never misreads a string value as structure. */
static bool scan_token(const char *d, size_t n, kvr_api_t api, const char **text, size_t *tlen) {
  if (FIND(d, n, "\"usage\"") || FIND(d, n, "\"error\""))
    return false;
  const char *ch = FIND(d, n, "\"choices\":[");
  if (ch == NULL)
    return false;
  const char *p;
  size_t kl;
  if (api == KVR_API_CHAT) {
    const char *delta = FIND(ch, n - (size_t)(ch - d), "\"delta\":{");
    if (delta == NULL)
      return false;
    static const char key[] = "\"content\":\"";
    kl = sizeof(key) - 1;
    p = find(delta, n - (size_t)(delta - d), key, kl);
    if (p != NULL && memchr(delta, '}', (size_t)(p - delta)) != NULL)
      return false; /* not provably inside the delta object */
  } else {
    static const char key[] = "\"text\":\"";
    kl = sizeof(key) - 1;
    p = find(ch, n - (size_t)(ch - d), key, kl);
  }
  if (p == NULL)
    return false;
  const char *v = p + kl, *end = d + n;
  const char *q = memchr(v, '"', (size_t)(end - v));
  if (q == NULL || q == v || memchr(v, '\\', (size_t)(q - v)) != NULL)
    return false;
  /* One choice only: a second text key means n > 1 (vllm bench reads choices[0]). */
  if (find(q, (size_t)(end - q), p, kl) != NULL || FIND(q, (size_t)(end - q), "\"index\":1"))
    return false;
  *text = v;
  *tlen = (size_t)(q - v);
  return true;
}

/* One SSE "data:" payload. */
static void on_event(req_t *r, const char *data, size_t len, uint64_t now) {
  if (kvr_openai_sse_done(data, len))
    return;
  const char *tok;
  size_t tl;
  if (r->first_ns == 0) {
    static const char key[] = "\"kvr_sim_engine_us\":";
    const char *k = FIND(data, len, key);
    if (k != NULL) { /* digits parsed within len: the payload is not NUL-terminated */
      uint64_t us = 0;
      for (const char *d = k + sizeof(key) - 1; d < data + len && *d >= '0' && *d <= '9'; d++)
        us = KVR_MIN(us * 10 + (uint64_t)(*d - '0'), (uint64_t)UINT32_MAX);
      r->engine_ns = us * 1000u;
    }
  }
  if (scan_token(data, len, r->lg->o.api, &tok, &tl)) {
    on_token(r, now);
    keep_text(r, tok, tl);
    return;
  }
  cJSON *j = cJSON_ParseWithLength(data, len);
  if (j == NULL) {
    r->stream_error = true;
    set_error(r, "malformed SSE JSON");
    return;
  }
  kvr_openai_chunk_t c;
  kvr_openai_chunk_read(j, &c);
  if (c.response_id != NULL && r->resp_id == NULL) /* response.created: what the next turn names */
    r->resp_id = kvr_xstrdup(c.response_id);
  if (c.error && !cJSON_IsNull(c.error)) {
    r->stream_error = true;
    set_error(r, c.error_message ? c.error_message : "error event in stream");
  }
  /* A token is answer text or, from a reasoning model, reasoning text. */
  const char *text = c.text ? c.text : c.reasoning;
  size_t n = c.text ? c.text_len : c.reasoning_len;
  if (text != NULL) {
    on_token(r, now);
    if (c.text != NULL)
      keep_text(r, text, n);
    else if (r->keep_answer && r->answer.len + n <= MAX_ANSWER)
      kvr_buf_append(&r->answer, text, n);
  }
  if (c.has_prompt_tokens)
    r->rec.prompt_tokens = (uint32_t)c.prompt_tokens;
  if (c.has_completion_tokens) {
    r->rec.output_tokens = (uint32_t)c.completion_tokens;
    r->rec.usage_seen = true;
  }
  if (c.has_cached_tokens)
    r->rec.cached_tokens = (uint32_t)c.cached_tokens;
  cJSON_Delete(j);
}

/* What on_line() needs besides the line: the request and the instant of the curl delivery. */
typedef struct feed_s {
  req_t *r;
  uint64_t now;
} feed_t;

/* One complete SSE line (kvr_openai_sse_line_cb); only "data:" lines matter. */
static void on_line(void *data, const char *line, size_t len) {
  feed_t *f = data;
  const char *payload;
  size_t plen;
  if (kvr_openai_sse_data(line, len, &payload, &plen))
    on_event(f->r, payload, plen, f->now);
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *userdata) {
  req_t *r = userdata;
  size_t n = size * nmemb;
  if (r->rec.status != 200) {
    if (r->errbody.len < MAX_ERROR_BODY)
      kvr_buf_append(&r->errbody, ptr, KVR_MIN(n, MAX_ERROR_BODY - r->errbody.len));
    return n;
  }
  /* Every event of one delivery arrived at the same instant. Lines complete in ptr are read in
   * place; only a line cut by the end of the delivery is copied (see src/proto/openai.c). */
  feed_t f = {r, now_ns(r->lg)};
  kvr_openai_sse_feed(&r->sse, ptr, n, on_line, &f);
  /* The bound: a request fails when more than MAX_SSE_LINE bytes of an unfinished line are held
   * after a delivery (the splitter itself drops no line: it was set up without a bound). */
  if (kvr_openai_sse_pending(&r->sse) > MAX_SSE_LINE) {
    set_error(r, "SSE line too long");
    return 0; /* curl ends the transfer with CURLE_WRITE_ERROR */
  }
  return n;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *userdata) {
  req_t *r = userdata;
  size_t n = size * nmemb;
  if (n > 5 && memcmp(ptr, "HTTP/", 5) == 0) {
    const char *sp = memchr(ptr, ' ', n);
    if (sp)
      r->rec.status = atoi(sp + 1);
    r->rec.worker[0] = '\0';
    return n;
  }
  static const char name[] = "x-kvrouter-worker:";
  if (n > sizeof(name) - 1 && strncasecmp(ptr, name, sizeof(name) - 1) == 0) {
    const char *v = ptr + sizeof(name) - 1;
    size_t vl = n - (sizeof(name) - 1);
    while (vl > 0 && (*v == ' ' || *v == '\t'))
      v++, vl--;
    while (vl > 0 && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
      vl--;
    vl = KVR_MIN(vl, sizeof(r->rec.worker) - 1);
    memcpy(r->rec.worker, v, vl);
    r->rec.worker[vl] = '\0';
  }
  return n;
}

static void schedule(kvr_loadgen_t *lg);
static void on_drained(uv_timer_t *t);

/* A concurrency level's measured requests have all completed: send nothing more, and end the level
 * from the loop (the cancels must not run inside curl's done processing). */
static void level_drained(kvr_loadgen_t *lg) {
  lg->halted = true;
  defer(lg, &lg->drain, on_drained, VT_DRAINED);
}

/* Whether the level may send more: not halted and, in rate mode, not all its arrivals sent. */
static bool may_send(const kvr_loadgen_t *lg) {
  return !lg->halted && (lg->concurrency > 0 || lg->sent < lg->total);
}

/* Whether a send now stays within --max-concurrency (an arrival over it waits for a completion,
 * which calls schedule() again). */
static bool below_cap(const kvr_loadgen_t *lg) {
  return lg->o.max_concurrency == 0 || lg->ninflight < lg->o.max_concurrency;
}

/* When a send due at due_ns was to go: due_ns, or the instant a slot freed if it waited for one
 * (held: schedule() found a due send over the cap last time). */
static uint64_t cap_target(const kvr_loadgen_t *lg, bool held, uint64_t due_ns) {
  return held && lg->slot_ns > due_ns ? lg->slot_ns : due_ns;
}

/* Ends a conversation's current turn: store the answer, make the next turn eligible or close it. */
static void conv_advance(kvr_loadgen_t *lg, conv_t *cv, req_t *r, bool ok, uint64_t now) {
  if (lg->replay)
    return; /* the schedule and the pre-built answers fix every turn: nothing to advance */
  if (!ok) {
    cv->dead = true; /* without the answer the history cannot be resent faithfully */
    return;
  }
  free(cv->answers[r->turn]); /* a pre-built answer (replay workload) gives way to the real one */
  cv->answers[r->turn] = kvr_buf_steal(&r->answer);
  if (cv->answers[r->turn] == NULL)
    cv->answers[r->turn] = kvr_xstrdup("");
  if (r->resp_id != NULL) { /* the Responses API: the next turn names this answer */
    free(cv->prev_id);
    cv->prev_id = r->resp_id;
    r->resp_id = NULL;
  }
  cv->next_turn = r->turn + 1;
  if (cv->next_turn >= cv->conv.nturns) {
    cv->dead = true;
    return;
  }
  double think = cv->conv.turns[cv->next_turn].think_s / scale(lg);
  cv->eligible_ns = now + (uint64_t)(think * 1e9);
  cv->waiting = true;
}

/* Completes r's record once its transfer ended; transport_error is NULL when the response arrived
 * whole (its status and stream then decide), else why the transfer failed. */
static void finish_request(kvr_loadgen_t *lg, req_t *r, const char *transport_error) {
  uint64_t now = now_ns(lg);
  kvr_req_rec_t *rec = &r->rec;
  double s = scale(lg);
  rec->ok = transport_error == NULL && rec->status == 200 && !r->stream_error && rec->chunks > 0;
  if (transport_error != NULL)
    set_error(r, transport_error);
  else if (rec->status != 200) {
    char msg[160];
    snprintf(msg, sizeof(msg), "HTTP %d: %.120s", rec->status,
             r->errbody.data ? r->errbody.data : "");
    set_error(r, msg);
  } else if (rec->chunks == 0)
    set_error(r, "stream carried no tokens");
  if (rec->ok && lg->o.api == KVR_API_RESPONSES && r->resp_id == NULL) {
    rec->ok = false; /* the chain cannot go on: the next turn has no id to name */
    set_error(r, "the Responses answer named no response id");
  }
  if (!rec->usage_seen)
    rec->output_tokens = rec->chunks;
  rec->sent_s = (double)(r->sent_ns - lg->start_ns) / 1e9 * s;
  /* Failed requests convert the same way (a first token may have come before the failure). */
  double tr = transport_ns(r);
  rec->transport_ms = tr >= 0 ? tr / 1e6 : -1;
  rec->ttft_ms = r->first_ns ? sim_ms(r, r->first_ns) : -1;
  if (rec->ok) {
    rec->e2e_ms = sim_ms(r, r->last_ns);
    rec->tpot_ms = rec->output_tokens > 1
                       ? (rec->e2e_ms - rec->ttft_ms) / (double)(rec->output_tokens - 1)
                       : -1;
  } else {
    rec->e2e_ms = sim_ms(r, now);
    rec->tpot_ms = -1;
  }
  rec->n_itl = (uint32_t)r->nitl;
  double sum = 0, mx = 0;
  for (size_t i = 0; i < r->nitl; i++) {
    sum += r->itls[i];
    mx = fmax(mx, r->itls[i]);
  }
  rec->itl_mean_ms = r->nitl ? sum / (double)r->nitl : 0;
  rec->itl_max_ms = mx;
  if (lg->o.result.save_detailed && !rec->warmup)
    rec->text = r->text.data ? kvr_buf_steal(&r->text) : kvr_xstrdup("");
  kvr_stats_level_add(lg->lv, rec, r->itls, r->nitl);
  rec->text = NULL; /* the level's now */
  lg->done++;
  lg->slot_ns = now;
  if (!rec->ok && !rec->warmup)
    lg->failed++;
  conv_advance(lg, r->cv, r, rec->ok, now);
  if (!rec->warmup && ++lg->mdone == lg->o.num_prompts && lg->concurrency > 0)
    level_drained(lg);
}

static void on_done(CURL *easy, CURLcode result, void *data) {
  req_t *r = data;
  kvr_loadgen_t *lg = r->lg;
  inflight_remove(lg, r);
  long code = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
  if (code)
    r->rec.status = (int)code;
  finish_request(lg, r, result == CURLE_OK ? NULL : curl_easy_strerror(result));
  req_free(r);
  schedule(lg);
}

static conv_t *conv_make(kvr_loadgen_t *lg) {
  conv_t *cv = kvr_xcalloc(1, sizeof(*cv));
  kvr_workload_conv(lg->wl, lg->level_seed, lg->next_conv++, &cv->conv);
  cv->answers = kvr_xcalloc(cv->conv.nturns, sizeof(char *));
  for (uint32_t t = 0; t < cv->conv.nturns; t++)
    if (cv->conv.turns[t].answer)
      cv->answers[t] = kvr_xstrdup(cv->conv.turns[t].answer);
  return cv;
}

/* Opens the level's next conversation. Generating one can take a while (unique control text), so
 * the next one is made ahead of time, after the send (see schedule()), off the send path. */
static conv_t *conv_open(kvr_loadgen_t *lg, unsigned user) {
  conv_t *cv = lg->spare ? lg->spare : conv_make(lg);
  lg->spare = NULL;
  cv->user = user;
  if (lg->nconvs == lg->capconvs) {
    lg->capconvs = lg->capconvs ? lg->capconvs * 2 : 64;
    lg->convs = kvr_xrealloc(lg->convs, lg->capconvs * sizeof(*lg->convs));
  }
  lg->convs[lg->nconvs++] = cv;
  return cv;
}

/* A user's first conversation of a concurrency level, as observed mid-way: it starts at a turn
 * drawn uniformly from its turns (by level seed and user), the turns before it carrying synthetic
 * answers of their max_tokens (pre-built answers of a replay workload are kept). Its first send is
 * the user's first request, always warm-up: that history is in no cache yet. */
static void conv_steady_start(kvr_loadgen_t *lg, conv_t *cv) {
  /* A Responses chain cannot be joined mid-way: its history is a stored response no one made. */
  uint32_t start = lg->o.api == KVR_API_RESPONSES
                       ? 0
                       : kvr_workload_start_turn(lg->level_seed, cv->user, cv->conv.nturns);
  for (uint32_t t = 0; t < start; t++)
    if (cv->answers[t] == NULL)
      cv->answers[t] = kvr_workload_answer(lg->wl, lg->level_seed, &cv->conv, t);
  cv->next_turn = start;
  cv->user_first = true;
}

static void conv_free(conv_t *cv) {
  for (uint32_t t = 0; t < cv->conv.nturns; t++)
    free(cv->answers[t]);
  free(cv->answers);
  free(cv->prev_id);
  kvr_workload_conv_free(&cv->conv);
  free(cv);
}

/* Builds turn `turn` of cv as a request ready to hand to curl: body rendered, easy handle and
 * headers set, ITL array sized for the turn's max_tokens. Nothing here depends on the send time, so
 * it runs ahead of the send (see prepare_next()). */
static req_t *req_prepare(kvr_loadgen_t *lg, conv_t *cv, uint32_t turn) {
  req_t *r = kvr_xcalloc(1, sizeof(*r));
  r->lg = lg;
  r->cv = cv;
  r->turn = turn;
  /* The Responses API resends no answer: the worker's store holds the history. */
  r->keep_answer = !lg->replay && turn + 1 < cv->conv.nturns && lg->o.api != KVR_API_RESPONSES;
  r->rec.conv = cv->conv.id;
  r->rec.turn = r->turn + 1;
  if (cv->conv.model != NULL)
    snprintf(r->rec.model, sizeof(r->rec.model), "%s", cv->conv.model);
  r->rec.ttft_ms = r->rec.tpot_ms = r->rec.transport_ms = -1;
  kvr_openai_sse_init(&r->sse, SIZE_MAX);
  r->capitl = cv->conv.turns[turn].max_tokens > 1 ? cv->conv.turns[turn].max_tokens - 1 : 1;
  r->itls = kvr_xmalloc(r->capitl * sizeof(double));
  /* a mix's conversation names its part's model; the others send --model */
  const char *model = cv->conv.model ? cv->conv.model : lg->model;
  if (lg->o.api == KVR_API_RESPONSES)
    kvr_workload_responses_body(&cv->conv, r->turn, turn > 0 ? cv->prev_id : NULL, model,
                                lg->o.ignore_eos, &r->body);
  else
    kvr_workload_body(&cv->conv, r->turn, (const char *const *)cv->answers, model, lg->o.api,
                      lg->o.ignore_eos, &r->body);
  if (lg->virt)
    return r; /* the virtual transport takes the body as it is */
  long timeout_ms = lg->o.request_timeout_s > 0 ? (long)(lg->o.request_timeout_s * 1000) : 0;
  r->easy =
      kvr_curl_easy_new(lg->urls[lg->url_next++ % lg->nurls], 10000L, timeout_ms, on_write, r);
  /* The benchmarked endpoint may be a TLS one (kvr_curl_easy_new allows plain http only). */
  curl_easy_setopt(r->easy, CURLOPT_PROTOCOLS_STR, "http,https");
  r->headers = kvr_curl_slist_append(r->headers, "Content-Type: application/json");
  r->headers = kvr_curl_slist_append(r->headers, "Accept: text/event-stream");
  r->headers = kvr_curl_slist_append(r->headers, "Expect:");
  if (lg->api_key) {
    char auth[512];
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", lg->api_key);
    r->headers = kvr_curl_slist_append(r->headers, auth);
  }
  curl_easy_setopt(r->easy, CURLOPT_HTTPHEADER, r->headers);
  curl_easy_setopt(r->easy, CURLOPT_POSTFIELDS, r->body.data);
  curl_easy_setopt(r->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->body.len);
  curl_easy_setopt(r->easy, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(r->easy, CURLOPT_HEADERDATA, r);
  return r;
}

kvr_loadgen_phase_t kvr_loadgen_phase(const kvr_loadgen_opts_t *o, const kvr_loadgen_send_t *s) {
  if (s->user_first || s->sent < o->warmup || s->since_s < o->warmup_s)
    return KVR_LOADGEN_WARMUP;
  return s->measured_sent < o->num_prompts ? KVR_LOADGEN_MEASURED : KVR_LOADGEN_COOLDOWN;
}

/* Flags r, sent now (r->sent_ns) from cv, as warm-up, measured or cool-down, and counts it. */
static void classify(kvr_loadgen_t *lg, req_t *r, conv_t *cv) {
  r->rec.user = lg->concurrency > 0 ? (int32_t)cv->user : -1;
  if (lg->concurrency == 0) {
    r->rec.warmup = lg->sent < lg->warmup;
  } else {
    kvr_loadgen_send_t snd = {cv->user_first, lg->sent,
                              (double)(r->sent_ns - lg->start_ns) / 1e9 * scale(lg), lg->msent};
    kvr_loadgen_phase_t ph = kvr_loadgen_phase(&lg->o, &snd);
    r->rec.warmup = ph != KVR_LOADGEN_MEASURED;
    r->rec.cooldown = ph == KVR_LOADGEN_COOLDOWN;
    cv->user_first = false;
  }
  if (!r->rec.warmup)
    lg->msent++;
  else if (r->rec.cooldown)
    lg->ncool++;
  else
    lg->nwarm++;
}

/* Sends turn cv->next_turn now; due_ns is when it arrived (vllm's queue time counts from there),
 * target_ns when it was to be sent: due_ns, or later when it waited for a --max-concurrency slot
 * (for the lag, which measures the generator itself). The request prepared ahead is used when it is
 * this one, else it is built now (and the lag shows the cost). */
static void send_turn(kvr_loadgen_t *lg, conv_t *cv, uint64_t due_ns, uint64_t target_ns) {
  req_t *r;
  if (lg->ready != NULL && lg->ready->cv == cv && lg->ready->turn == cv->next_turn) {
    r = lg->ready;
    lg->ready = NULL;
  } else {
    r = req_prepare(lg, cv, cv->next_turn);
  }
  cv->waiting = false;
  /* The send instant: the request is handed to curl right after this (send lag = this - due). */
  r->sent_ns = now_ns(lg);
  classify(lg, r, cv);
  r->rec.seq = lg->sent++;
  r->rec.target_s = (double)(target_ns - lg->start_ns) / 1e9 * scale(lg);
  r->rec.arrival_s = (double)(due_ns - lg->start_ns) / 1e9 * scale(lg);
  r->rec.lag_ms = r->sent_ns > target_ns ? (double)(r->sent_ns - target_ns) / 1e6 : 0;
  if (lg->virt) {
    r->vh = lg->vt.send(lg->vt.ctx, r, r->body.data, r->body.len);
    kvr_buf_free(&r->body); /* the transport copied what it needs */
    if (r->vh == NULL) {
      finish_request(lg, r, "the virtual cluster refused the request");
      req_free(r);
      return;
    }
  } else if (kvr_curlm_add(lg->curlm, r->easy, on_done, r) != 0) {
    finish_request(lg, r, "curl refused the transfer");
    req_free(r);
    return;
  }
  kvr_list_insert_head(&lg->inflight, &r->node);
  lg->ninflight++;
  if (cv->conv.raw) {
    /* A trace request is sent once and its body holds the prompt: the conversation's copy (tens of
     * kilobytes, thousands per level) is not kept until the level ends. */
    free(cv->conv.turns[0].user);
    cv->conv.turns[0].user = NULL;
  }
}

/* The waiting conversation whose next turn became eligible first, NULL if none is due by now. */
static conv_t *earliest_waiting(kvr_loadgen_t *lg, uint64_t *when) {
  conv_t *best = NULL;
  for (size_t i = 0; i < lg->nconvs; i++) {
    conv_t *cv = lg->convs[i];
    if (cv->waiting && !cv->dead && (best == NULL || cv->eligible_ns < best->eligible_ns))
      best = cv;
  }
  if (best && when)
    *when = best->eligible_ns;
  return best;
}

static void arm(kvr_loadgen_t *lg, uint64_t due_ns, uint64_t now);
static void disarm(kvr_loadgen_t *lg);
static void on_tick(uv_timer_t *t);
static void replay_slot(const kvr_loadgen_t *lg, size_t i, uint64_t *k, uint32_t *turn);

/* Prepares the request the next arrival will most likely send, so that at its send time only the
 * handover to curl is left: in replay mode the next arrival's pre-assigned (conversation, turn),
 * in the other rate modes the first turn of the next new conversation (a follow-up that became
 * eligible meanwhile is built at its send instead). Concurrency mode has no send times. */
static void prepare_next(kvr_loadgen_t *lg) {
  if (lg->ready != NULL || !may_send(lg) || lg->rate <= 0 || lg->interrupted)
    return;
  if (lg->spare == NULL)
    lg->spare = conv_make(lg);
  conv_t *cv = lg->spare;
  uint32_t turn = 0;
  if (lg->replay) {
    if (lg->next_arrival >= lg->total)
      return;
    uint64_t k;
    replay_slot(lg, lg->next_arrival, &k, &turn);
    if (turn > 0 && k < lg->nconvs)
      cv = lg->convs[k]; /* mirrors schedule(): else the arrival opens the spare */
    turn = KVR_MIN(turn, cv->conv.nturns - 1);
  }
  lg->ready = req_prepare(lg, cv, turn);
}

/* Replay order: blocks of W = replay_width conversations; a block sends turn 1 of its W
 * conversations, then turn 2 of the same W, and so on, each round in its own seeded random order
 * (as `vllm bench serve` sends a shuffled dataset: no fixed stride that a round-robin router could
 * align with). So turn t+1 of a conversation follows turn t about W requests later (1..2W-1; time
 * for turn t's prefill to land in a cache), and every full block carries each turn equally.
 * Conversations are opened in order of their first turn, so lg->convs[j] is the j-th opened.
 * With opts.replay_sample, arrival i is instead a random turn of a conversation of its own. */
static void replay_slot(const kvr_loadgen_t *lg, size_t i, uint64_t *k, uint32_t *turn) {
  const kvr_workload_opts_t *o = kvr_workload_opts(lg->wl);
  if (o->replay_sample) {
    /* Sample order: arrival i opens conversation i of the level (see kvr_workload_sample_slot). */
    uint64_t conv;
    kvr_workload_sample_slot(lg->wl, lg->level_seed, i, &conv, turn);
    *k = UINT64_MAX; /* a new conversation */
    return;
  }
  size_t w = o->replay_width, block = w * o->turns;
  size_t b = i / block, in = i % block, pos = in % w;
  *turn = (uint32_t)(in / w);
  /* Position pos of round (b, turn) -> conversation: a seeded Fisher-Yates permutation of 0..w-1
   * (w is small, recomputing it per send is cheap). Round 0 is the identity: conversations open in
   * index order, so the j-th opened is conversation b*w + j. */
  size_t c = pos;
  if (*turn > 0) {
    size_t perm[256];
    size_t m = KVR_MIN(w, KVR_ARRAY_SIZE(perm));
    for (size_t j = 0; j < m; j++)
      perm[j] = j;
    kvr_rng_t r;
    kvr_workload_rng_seed(
        &r, kvr_workload_mix(kvr_workload_mix(lg->level_seed, 0x5E0), b * 64 + *turn));
    for (size_t j = m - 1; j > 0; j--) {
      size_t x = (size_t)kvr_workload_rng_range(&r, 0, j);
      size_t t = perm[j];
      perm[j] = perm[x];
      perm[x] = t;
    }
    c = pos < m ? perm[pos] : pos;
  }
  *k = (uint64_t)(b * w + c);
}

/* How early the loop wakes up for an arrival. The wake-up is late whenever it falls inside a batch
 * of stream events the loop is working through (~10 us each, hundreds of microseconds with 1,000
 * streams); waking this much early and then waiting on the clock in place absorbs that, at the
 * cost of holding the loop for at most this long per send: at 100 req/s at most 5% of the time,
 * during which arriving chunks are timestamped up to 0.5 ms late. Measured against 250 us and
 * against spinning through the loop for the last millisecond (bench/results/ACCURACY.md): 500 us
 * had the lowest send lag p99 (0.17-0.30 ms vs 0.39-0.54 ms with 1,000 streams). */
#define SEND_EARLY_NS 500000u

static uint64_t send_early(const kvr_loadgen_t *lg) {
  return lg->virt ? 0 : SEND_EARLY_NS;
}

/* True when an arrival due at `due` is to be sent now: it is due, or due within SEND_EARLY_NS, in
 * which case this waits on the clock until the instant (*now is updated). */
static bool due_now(const kvr_loadgen_t *lg, uint64_t due, uint64_t *now) {
  if (due <= *now)
    return true;
  if (lg->virt || due - *now > SEND_EARLY_NS)
    return false; /* virtual time: woken exactly at the instant */
  while ((*now = uv_hrtime()) < due) {
  }
  return true;
}

/* Sends whatever is due and re-arms the tick for the next event; stops the loop when the level is
 * complete. Only ever called from the tick or after a request finished. */
static void schedule(kvr_loadgen_t *lg) {
  if (lg->lv == NULL || lg->interrupted)
    return;
  uint64_t now = now_ns(lg);
  uint64_t next_due = UINT64_MAX;
  bool held = lg->cap_held; /* the last call left a due send waiting for a slot */
  lg->cap_held = false;
  if (lg->replay) {
    /* Replay: arrival i sends the pre-assigned turn of its conversation, done or not. */
    while (may_send(lg) && lg->next_arrival < lg->total) {
      uint64_t due = lg->start_ns + lg->arrivals[lg->next_arrival];
      if (!due_now(lg, due, &now)) {
        next_due = due - send_early(lg);
        break;
      }
      if (!below_cap(lg)) {
        lg->cap_held = true;
        break;
      }
      uint64_t k;
      uint32_t turn;
      replay_slot(lg, lg->next_arrival, &k, &turn);
      conv_t *cv = turn == 0 || k >= lg->nconvs ? conv_open(lg, 0) : lg->convs[k];
      cv->next_turn = KVR_MIN(turn, cv->conv.nturns - 1);
      lg->next_arrival++;
      send_turn(lg, cv, due, cap_target(lg, held, due));
    }
  } else if (lg->rate > 0 && !lg->o.sessions) {
    /* Turn arrivals: each due arrival takes the oldest eligible follow-up, else a new conversation.
     */
    while (may_send(lg) && lg->next_arrival < lg->total) {
      uint64_t due = lg->start_ns + lg->arrivals[lg->next_arrival];
      if (!due_now(lg, due, &now)) {
        next_due = due - send_early(lg);
        break;
      }
      if (!below_cap(lg)) {
        lg->cap_held = true;
        break;
      }
      uint64_t when = 0;
      conv_t *cv = earliest_waiting(lg, &when);
      if (cv == NULL || when > now)
        cv = conv_open(lg, 0);
      lg->next_arrival++;
      send_turn(lg, cv, due, cap_target(lg, held, due));
    }
  } else {
    if (lg->rate > 0) {
      /* Sessions: arrivals open conversations; eligible follow-ups go out on their own. */
      while (lg->next_arrival < lg->total && may_send(lg)) {
        uint64_t due = lg->start_ns + lg->arrivals[lg->next_arrival];
        if (!due_now(lg, due, &now)) {
          next_due = due - send_early(lg);
          break;
        }
        if (!below_cap(lg)) {
          lg->cap_held = true;
          break;
        }
        lg->next_arrival++;
        send_turn(lg, conv_open(lg, 0), due, cap_target(lg, held, due));
      }
    }
    uint64_t when = 0;
    conv_t *cv;
    while (may_send(lg) && (cv = earliest_waiting(lg, &when)) != NULL) {
      if (when > now) {
        next_due = KVR_MIN(next_due, when);
        break;
      }
      if (!below_cap(lg)) {
        lg->cap_held = true;
        break;
      }
      send_turn(lg, cv, when, cap_target(lg, held, when));
    }
    if (lg->concurrency > 0) {
      /* Closed loop: a user whose conversation ended starts the next one at once. */
      for (size_t i = 0; i < lg->nconvs && may_send(lg) && below_cap(lg); i++) {
        conv_t *old = lg->convs[i];
        if (!old->dead || old->user == UINT32_MAX)
          continue;
        unsigned user = old->user;
        old->user = UINT32_MAX; /* hand the user over exactly once */
        send_turn(lg, conv_open(lg, user), now, now);
      }
    }
  }
  if (!may_send(lg) && lg->ninflight == 0) {
    disarm(lg);
    if (lg->virt)
      lg->vt.stop(lg->vt.ctx);
    else
      uv_stop(lg->loop);
    return;
  }
  /* Arm first: preparing the next request takes tens of microseconds and must not delay the wake-up
   * (the deadline is absolute, so the time spent here does not shift it). */
  if (may_send(lg) && next_due != UINT64_MAX)
    arm(lg, next_due, now_ns(lg));
  else
    disarm(lg);
  if (lg->spare == NULL && may_send(lg))
    lg->spare = conv_make(lg);
  prepare_next(lg);
}

static void on_timerfd(uv_poll_t *p, int status, int events) {
  kvr_loadgen_t *lg = p->data;
  (void)events;
  uint64_t expirations;
  if (status == 0 && read(lg->tfd, &expirations, sizeof(expirations)) < 0) {
    /* EAGAIN: re-armed since it became readable; schedule() below looks at the clock anyway */
  }
  schedule(lg);
}

/* Wakes the loop at due_ns. With a timerfd the kernel wakes it at that instant (hrtimer precision)
 * and schedule() runs from the poll callback: no spinning. Without, the ms-grained uv timer wakes
 * it up to 1 ms early and re-arms with 0 ms (the loop keeps polling I/O) until the instant. */
static void arm(kvr_loadgen_t *lg, uint64_t due_ns, uint64_t now) {
  if (lg->virt) {
    lg->wake_gen++;
    lg->vt.at(lg->vt.ctx, KVR_MAX(due_ns, now), vt_fire, lg, VT_WAKE | lg->wake_gen << 2);
    return;
  }
#ifdef __linux__
  if (lg->tfd >= 0) {
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = (time_t)(due_ns / 1000000000u);
    its.it_value.tv_nsec = (long)(due_ns % 1000000000u);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
      its.it_value.tv_nsec = 1; /* zero would disarm */
    timerfd_settime(lg->tfd, TFD_TIMER_ABSTIME, &its, NULL);
    if (!uv_is_active((uv_handle_t *)&lg->tfd_poll))
      uv_poll_start(&lg->tfd_poll, UV_READABLE, on_timerfd);
    return;
  }
#endif
  uint64_t delta_ms = due_ns > now ? (due_ns - now) / 1000000 : 0;
  uv_timer_start(&lg->tick, on_tick, delta_ms > 1 ? delta_ms - 1 : 0, 0);
}

static void disarm(kvr_loadgen_t *lg) {
  if (lg->virt) {
    lg->wake_gen++; /* the pending wake-up goes stale */
    return;
  }
  uv_timer_stop(&lg->tick);
#ifdef __linux__
  if (lg->tfd >= 0) {
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    timerfd_settime(lg->tfd, 0, &its, NULL);
    uv_poll_stop(&lg->tfd_poll);
  }
#endif
}

static void on_tick(uv_timer_t *t) {
  schedule(t->data);
}

/* ---- progress -------------------------------------------------------------------------------- */

static double running_p99(const kvr_level_t *lv, bool tpot) {
  size_t n = 0;
  double *v = kvr_xmalloc(lv->nrecs * sizeof(double));
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    double x = tpot ? r->tpot_ms : r->ttft_ms;
    if (r->ok && !r->warmup && x >= 0)
      v[n++] = x;
  }
  kvr_dist_t d;
  kvr_stats_dist(v, n, &d);
  free(v);
  return d.p99;
}

static void print_progress(kvr_loadgen_t *lg, bool final) {
  FILE *f = lg->o.progress;
  if (f == NULL || lg->lv == NULL)
    return;
  uint64_t now = now_ns(lg);
  double elapsed = (double)(now - lg->start_ns) / 1e9;
  double left = 0;
  if (lg->rate > 0 && lg->total > 0 && !lg->o.sessions) {
    double last = (double)lg->arrivals[lg->total - 1] / 1e9;
    left = fmax(0, last - elapsed);
  } else if (lg->concurrency > 0 && lg->mdone > 0) {
    left = elapsed / (double)lg->mdone * (double)(lg->o.num_prompts - lg->mdone);
  } else if (lg->concurrency == 0 && lg->done > 0) {
    left = elapsed / (double)lg->done * (double)(lg->total - lg->done);
  }
  char load[48], sent[64];
  if (lg->concurrency) {
    snprintf(load, sizeof(load), "%u users", lg->concurrency);
    snprintf(sent, sizeof(sent), "%zu (measured %zu/%zu)", lg->sent, lg->msent, lg->o.num_prompts);
  } else {
    snprintf(load, sizeof(load), "%.3g %s", lg->rate, lg->o.sessions ? "conv/s" : "req/s");
    snprintf(sent, sizeof(sent), "%zu/%zu", lg->sent, lg->total);
  }
  char line[256];
  int n = snprintf(line, sizeof(line),
                   "[%s %s] sent %s done %zu inflight %zu errors %zu | TTFT p99 %.0f ms TPOT "
                   "p99 %.1f ms | %.0fs left",
                   lg->label ? lg->label : "", load, sent, lg->done, lg->ninflight, lg->failed,
                   running_p99(lg->lv, false), running_p99(lg->lv, true), final ? 0.0 : left);
  if (lg->o.progress_tty) {
    fprintf(f, "\r%s", line);
    for (size_t i = (size_t)n; i < lg->progress_len; i++)
      fputc(' ', f);
    lg->progress_len = (size_t)n;
    if (final) {
      fputc('\n', f);
      lg->progress_len = 0;
    }
  } else {
    fprintf(f, "%s\n", line);
  }
  fflush(f);
}

static void on_progress(uv_timer_t *t) {
  kvr_loadgen_t *lg = t->data;
  uint64_t now = uv_hrtime();
  /* Printing sorts every record for the running p99s (a millisecond or more at 10k records): never
   * right before a send; the next tick prints instead. */
  if (lg->rate > 0 && lg->next_arrival < lg->total &&
      lg->start_ns + lg->arrivals[lg->next_arrival] < now + 5000000)
    return;
  /* A terminal line is rewritten every second; plain lines every 10 s keep logs short. */
  if (lg->o.progress_tty || now - lg->last_progress_ns >= 10000000000ull) {
    lg->last_progress_ns = now;
    print_progress(lg, false);
  }
}

/* ---- levels ---------------------------------------------------------------------------------- */

/* Resets the level state for a level at rate or concurrency; returns the measured requests planned
 * (at least num_prompts; rate mode raises it with --min-level-s). */
static size_t level_reset(kvr_loadgen_t *lg, double rate, unsigned concurrency,
                          const kvr_slo_t *slo) {
  lg->rate = rate;
  lg->concurrency = concurrency;
  lg->warmup = lg->o.warmup;
  size_t measured = lg->o.num_prompts;
  if (rate > 0 && isfinite(rate)) { /* at rate inf everything is sent at once: no time to fill */
    lg->warmup = (unsigned)KVR_MAX((double)lg->warmup, ceil(rate * lg->o.warmup_s));
    measured = (size_t)KVR_MAX((double)measured, ceil(rate * lg->o.min_level_s));
  }
  const kvr_trace_replay_t *tr = kvr_workload_trace(lg->wl);
  if (tr != NULL && rate > 0) {
    /* A trace level sends the trace (its window) once, from its first request: the warm-up ones
     * first, every other one measured (with trace_first only the first num_prompts of those, as
     * vllm's --num-prompts truncates a timed_trace); --min-level-s does not apply. */
    size_t n = kvr_trace_replay_count(tr);
    lg->warmup = (unsigned)KVR_MIN((size_t)lg->warmup, n > 0 ? n - 1 : 0);
    measured = n - lg->warmup;
    if (lg->o.trace_first)
      measured = KVR_MIN(measured, lg->o.num_prompts);
  }
  /* Concurrency mode: the plan (its sends are not counted against it; see may_send()). */
  lg->total = lg->warmup + measured;
  lg->sent = lg->done = lg->failed = lg->next_arrival = 0;
  lg->msent = lg->mdone = lg->nwarm = lg->ncool = lg->ncancel = 0;
  lg->halted = lg->cap_held = false;
  lg->slot_ns = 0;
  /* p99 = s[lo] + (s[hi] - s[lo]) * frac over the n completed (src/base/quantile.h): it misses once
   * n - lo values are at or over the SLO. n - lo grows with n, so n = measured is the safe count,
   * plus the failures the SLO tolerates (they could be the slow ones and drop out). */
  lg->stop_ttft_ms = lg->o.early_stop ? slo->ttft_p99_ms : 0;
  lg->ttft_over = 0;
  size_t lo = 0, hi = 0;
  double frac = 0;
  if (measured > 0)
    kvr_quantile_pos(measured, 99, &lo, &hi, &frac);
  lg->ttft_over_stop = measured - lo + (size_t)floor(slo->max_failed_frac * (double)measured);
  lg->stopped_early = false;
  lg->next_conv = 0;
  lg->arrivals = NULL;
  const kvr_workload_opts_t *wo = kvr_workload_opts(lg->wl);
  lg->replay = rate > 0 && !lg->o.sessions && wo->kind == KVR_WL_MULTITURN && wo->replay;
  return measured;
}

/* Rate mode: the arrival schedule, gamma gaps with mean 1/real_rate (vllm's burstiness: shape k,
 * scale 1/(rate*k)). With an arrival seed the measured requests follow the schedule `vllm bench
 * serve --seed S` draws for them at this rate, after the warm-up sends. */
static void build_arrivals(kvr_loadgen_t *lg) {
  double real_rate = lg->rate * scale(lg);
  lg->arrivals = kvr_xmalloc((lg->total ? lg->total : 1) * sizeof(uint64_t));
  const kvr_trace_replay_t *tr = kvr_workload_trace(lg->wl);
  if (tr != NULL) {
    /* The trace's own arrivals, compressed or stretched to the rate (trace_replay.h), or at their
     * own times (self-timed: file units, ms, to seconds); all at once in the trace (no span to
     * scale): 1/rate apart. */
    double f = lg->self_timed ? 1000.0 * lg->o.self_timed : kvr_trace_replay_factor(tr, lg->rate);
    for (size_t i = 0; i < lg->total; i++)
      lg->arrivals[i] = (uint64_t)llround(
          (f > 0 ? kvr_trace_replay_arrival_s(tr, i) * f : (double)i / lg->rate) / scale(lg) * 1e9);
    return;
  }
  if (isinf(lg->rate)) { /* vllm's --request-rate inf: every request at once */
    memset(lg->arrivals, 0, (lg->total ? lg->total : 1) * sizeof(uint64_t));
    return;
  }
  kvr_rng_t rng;
  kvr_workload_rng_seed(&rng, kvr_workload_mix(lg->level_seed, 0xA77));
  size_t own = lg->o.arrival_seed >= 0 ? lg->warmup : lg->total;
  double t = 0;
  for (size_t i = 0; i < own; i++) {
    lg->arrivals[i] = (uint64_t)(t * 1e9);
    t += kvr_workload_rng_gamma(&rng, lg->o.burstiness, 1.0 / (real_rate * lg->o.burstiness));
  }
  if (own == lg->total)
    return;
  /* The first measured send waits the schedule's first gap after the last warm-up send, as vllm's
   * first send waits it after the start. */
  double base = own > 0 ? (double)lg->arrivals[own - 1] / 1e9 : 0;
  size_t n = lg->total - own;
  double *v = kvr_xmalloc(n * sizeof(*v));
  kvr_np_vllm_schedule((uint32_t)lg->o.arrival_seed, lg->rate, lg->o.burstiness, n, v);
  for (size_t i = 0; i < n; i++)
    lg->arrivals[own + i] = (uint64_t)((base + v[i] / scale(lg)) * 1e9);
  free(v);
}

/* Frees the level's conversations, prepared request and arrivals; hands lv its counts. */
static void level_cleanup(kvr_loadgen_t *lg, kvr_level_t *lv, const kvr_slo_t *slo) {
  lv->interrupted = lg->interrupted;
  lv->stopped_early = lg->stopped_early;
  lv->ttft_over_slo = lg->ttft_over;
  lv->steady_state = lg->concurrency > 0;
  lv->warmup_requests = lg->nwarm;
  lv->cooldown_requests = lg->ncool;
  lv->cancelled_requests = lg->ncancel;
  kvr_stats_level_finish(lv, slo);
  for (size_t i = 0; i < lg->nconvs; i++)
    conv_free(lg->convs[i]);
  req_free(lg->ready); /* prepared, never handed to curl */
  lg->ready = NULL;
  if (lg->spare)
    conv_free(lg->spare);
  lg->spare = NULL;
  free(lg->convs);
  lg->convs = NULL;
  lg->nconvs = lg->capconvs = 0;
  free(lg->arrivals);
  lg->arrivals = NULL;
}

/* A self-timed trace level's rate: the mean rate of its sends, (n - 1) / span (INFINITY when they
 * all go at once), from the trace's mean rate and the time factor; build_arrivals() refines it. */
static double self_timed_rate(const kvr_loadgen_t *lg) {
  const kvr_trace_stats_t *st = kvr_trace_replay_stats(kvr_workload_trace(lg->wl));
  return st->sent_rate > 0 ? st->sent_rate / (1000.0 * lg->o.self_timed) : INFINITY;
}

int kvr_loadgen_run_level(kvr_loadgen_t *lg, const char *label, double rate, unsigned concurrency,
                          uint64_t level_seed, const kvr_slo_t *slo, kvr_level_t **out) {
  *out = NULL;
  lg->self_timed =
      rate == 0 && concurrency == 0 && lg->o.self_timed > 0 && kvr_workload_trace(lg->wl) != NULL;
  if (lg->self_timed)
    rate = self_timed_rate(lg);
  if ((rate > 0) == (concurrency > 0) || !(rate >= 0))
    return KVR_EINVAL;
  kvr_level_t *lv = kvr_stats_level_new(rate, concurrency);
  lv->result = lg->o.result;
  lv->max_concurrency = lg->o.max_concurrency;
  lv->self_timed = lg->self_timed;
  lg->lv = lv;
  lg->label = label;
  lg->level_seed = level_seed;
  size_t measured = level_reset(lg, rate, concurrency, slo);
  if (rate > 0)
    build_arrivals(lg);
  if (lg->self_timed && lg->total > 1 && lg->arrivals[lg->total - 1] > 0)
    lv->rate = lg->rate =
        (double)(lg->total - 1) / ((double)lg->arrivals[lg->total - 1] / 1e9 * scale(lg));
  /* Measured records keep their ITLs: size for the longest outputs so none is copied mid-level.
   * A concurrency level also records each user's first request and some cool-down ones. */
  const kvr_workload_opts_t *wo = kvr_workload_opts(lg->wl);
  const kvr_trace_replay_t *tr = kvr_workload_trace(lg->wl);
  kvr_stats_level_reserve(lv, lg->total + 2 * (size_t)concurrency,
                          tr ? (size_t)kvr_trace_replay_stats(tr)->sent_output_tokens
                             : measured * KVR_MAX(wo->out_max, 1u));
  lg->start_ns = now_ns(lg);
  lg->level_no++;
  lg->last_progress_ns = lg->start_ns;
  if (lg->o.progress && !lg->o.progress_tty) {
    if (concurrency)
      fprintf(lg->o.progress,
              "[%s] level start: users %u, %zu measured requests in steady state (warm-up: each "
              "user's first request and the first %u)\n",
              label ? label : "", concurrency, measured, lg->warmup);
    else
      fprintf(lg->o.progress, "[%s] level start: rate %.3g, %zu requests (%u warm-up)\n",
              label ? label : "", rate, lg->total, lg->warmup);
    fflush(lg->o.progress);
  }
  /* Closed loop: every user starts mid-conversation at once (see conv_steady_start). */
  for (unsigned u = 0; u < concurrency && may_send(lg); u++) {
    conv_t *cv = conv_open(lg, u);
    conv_steady_start(lg, cv);
    if (below_cap(lg)) {
      send_turn(lg, cv, lg->start_ns, lg->start_ns);
    } else { /* over --max-concurrency: it waits for a slot (schedule()) */
      cv->eligible_ns = lg->start_ns;
      cv->waiting = true;
    }
  }
  if (lg->o.progress && !lg->virt)
    uv_timer_start(&lg->progress, on_progress, 1000, 1000);
  if (!lg->interrupted) {
    schedule(lg);
    if (may_send(lg) || lg->ninflight > 0) {
      lg->running = true;
      if (lg->virt)
        lg->vt.run(lg->vt.ctx);
      else
        uv_run(lg->loop, UV_RUN_DEFAULT);
      lg->running = false;
    }
  }
  disarm(lg);
  if (!lg->virt) {
    uv_timer_stop(&lg->progress);
    uv_timer_stop(&lg->drain);
  }
  print_progress(lg, true);
  level_cleanup(lg, lv, slo);
  lg->lv = NULL;
  *out = lv;
  return 0;
}

/* Cancels every transfer in flight (not recorded) and leaves the level's uv_run. */
static void stop_level(kvr_loadgen_t *lg) {
  while (!kvr_list_empty(&lg->inflight)) {
    req_t *r = KVR_CONTAINER_OF(lg->inflight.next, req_t, node);
    inflight_remove(lg, r);
    if (lg->virt)
      lg->vt.cancel(lg->vt.ctx, r->vh);
    else
      kvr_curlm_cancel(lg->curlm, r->easy);
    req_free(r);
    lg->ncancel++;
  }
  disarm(lg);
  if (lg->virt) {
    if (lg->running)
      lg->vt.stop(lg->vt.ctx);
    return;
  }
  uv_timer_stop(&lg->sleeper);
  uv_timer_stop(&lg->drain);
  if (lg->running)
    uv_stop(lg->loop);
}

/* The level's TTFT p99 has certainly missed the SLO: nothing the rest could do changes that. */
static void on_stop_early(uv_timer_t *t) {
  kvr_loadgen_t *lg = t->data;
  if (lg->lv == NULL || lg->interrupted)
    return;
  lg->stopped_early = true;
  lg->halted = true; /* nothing more is sent */
  stop_level(lg);
}

/* A concurrency level's measured requests all completed (level_drained): the excluded requests
 * still in flight are cancelled as a client closing its connections would (not recorded). */
static void on_drained(uv_timer_t *t) {
  kvr_loadgen_t *lg = t->data;
  if (lg->lv != NULL)
    stop_level(lg);
}

void kvr_loadgen_interrupt(kvr_loadgen_t *lg) {
  lg->interrupted = true;
  lg->halted = true;
  stop_level(lg);
}

static void on_sleep_done(uv_timer_t *t) {
  kvr_loadgen_t *lg = t->data;
  uv_stop(lg->loop);
}

void kvr_loadgen_sleep(kvr_loadgen_t *lg, double real_seconds) {
  if (lg->interrupted || real_seconds <= 0 || lg->virt)
    return; /* virtual: nothing runs between levels, so there is nothing to wait for */
  uv_timer_start(&lg->sleeper, on_sleep_done, (uint64_t)(real_seconds * 1000), 0);
  lg->running = true;
  uv_run(lg->loop, UV_RUN_DEFAULT);
  lg->running = false;
  uv_timer_stop(&lg->sleeper);
}

void kvr_loadgen_set_model(kvr_loadgen_t *lg, const char *model) {
  char *m = kvr_xstrdup(model);
  free(lg->model);
  lg->model = m;
}

/* ---- the virtual transport's side ------------------------------------------------------------ */

static void vt_fire(void *arg, uint64_t tag) {
  kvr_loadgen_t *lg = arg;
  switch ((int)(tag & 3)) {
  case VT_WAKE:
    if (tag >> 2 == lg->wake_gen)
      schedule(lg);
    break;
  case VT_STOP_EARLY:
    if (tag >> 2 == lg->level_no)
      on_stop_early(&lg->sleeper);
    break;
  default:
    if (tag >> 2 == lg->level_no && lg->lv != NULL)
      stop_level(lg);
    break;
  }
}

void kvr_loadgen_vt_head(kvr_loadgen_req_t *r, int status, const char *worker) {
  r->rec.status = status;
  snprintf(r->rec.worker, sizeof(r->rec.worker), "%s", worker ? worker : "");
}

void kvr_loadgen_vt_token(kvr_loadgen_req_t *r, const char *text, size_t len) {
  on_token(r, now_ns(r->lg));
  keep_text(r, text, len);
}

void kvr_loadgen_vt_response_id(kvr_loadgen_req_t *r, const char *id) {
  if (id != NULL && r->resp_id == NULL)
    r->resp_id = kvr_xstrdup(id);
}

void kvr_loadgen_vt_usage(kvr_loadgen_req_t *r, uint32_t prompt_tokens, uint32_t completion_tokens,
                          uint32_t cached_tokens) {
  r->rec.prompt_tokens = prompt_tokens;
  r->rec.output_tokens = completion_tokens;
  r->rec.cached_tokens = cached_tokens;
  r->rec.usage_seen = true;
}

void kvr_loadgen_vt_done(kvr_loadgen_req_t *r, const char *error) {
  kvr_loadgen_t *lg = r->lg;
  inflight_remove(lg, r);
  finish_request(lg, r, error);
  req_free(r);
  schedule(lg);
}

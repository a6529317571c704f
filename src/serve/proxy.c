/* proxy.c -- forwards client requests to workers and streams the answers back.
 *
 * One px_t per proxied request. Its life:
 *
 *   client request (kvr_http_req_t, body complete)
 *     -> validate route and JSON, extract prompt features (openai.c, prompt.c); a model no
 *        worker serves is vLLM's 404 from the router (unknown_model())
 *     -> precise mode, when a usable worker's KV-event stream is complete: the prompt's token ids
 *        from a worker's POST /tokenize (tokenize.c, cached) and their block chain into the
 *        route request (see tokenize()); a failed call routes on the approximate index
 *     -> admission bound, when on: waits in proxy->queue while every usable worker has
 *        admission_max_inflight in flight, or 503 (see admit() and pump())
 *     -> kvr_router_decide(): cache-index match + policy -> worker slot, among the workers serving
 *        the request's model (and, for an adapter of --lora-adapter, its base's workers)
 *     -> a LoRA adapter the chosen worker does not list yet (kvr_router_lora_needs_load): the
 *        request waits for the worker's POST /v1/load_lora_adapter (lora.c, one per worker and
 *        adapter however many requests wait); a failed load is a 502 lora_load_failed in the
 *        API's shape, no retry
 *     -> attempt: a curl easy handle on the proxy's multi; load accounting begins on the worker
 *          (kvr_router_on_dispatch fills px->acct with what it added)
 *          header callback: status and headers collected (filtered by http_headers.c); first byte
 *                           stops the first-byte timer
 *          write callback:  SSE responses are written to the client as they arrive (one chunk per
 *                           curl delivery, no buffering) and read line by line on the way
 *                           (openai.c's splitter: tokens, usage); other bodies are held (bounded by
 *                           response_buffer_max, then streamed) so a failure is still a clean 502
 *          end of a 2xx head: the cache index learns the prompt (a 4xx/5xx teaches nothing)
 *     -> transfer done: 2xx and complete -> finish the client response, teach the cache index the
 *                       prompt plus the generated answer; the attempt's outlier verdict
 *                       (kvr_router_on_result: a 5xx, a first-byte timeout or a failed transfer
 *                       is a failure);
 *                       failure before any response byte -> one retry on another worker (not
 *                       in px->tried) if the retry budget allows (kvr_router_retry_acquire), then
 *                       502; first-byte timeout -> 504; failure mid-stream -> an SSE error
 *                       event and a clean end (SSE) or a truncated body (other)
 *     -> load accounting ends (kvr_router_on_end removes exactly what px->acct says was added),
 *        access-log line, px freed after its timer handle has closed.
 * Every change of router or worker state goes through a kvr_router_on_* call (router.h).
 *
 * Back-pressure: when more than HIGH_WATER bytes wait on the client socket the write callback
 * returns CURL_WRITEFUNC_PAUSE (the data is redelivered later) and the client's on_drain resumes
 * the transfer with curl_easy_pause(CURLPAUSE_CONT), so a slow reader holds at most about
 * HIGH_WATER + one curl buffer per request.
 *
 * Request ids: kvr_proxy_on_request() gives every request one (the client's x-request-id when it
 * is sane, else 32 generated hex digits, kvr_http_request_id_assign()). http_server.c puts it on
 * every response head the request gets (proxied answers, local answers, 4xx/5xx error bodies); it
 * is sent to the worker as x-request-id (replacing the client's), the worker's own x-request-id
 * response header is dropped (the client gets exactly one), and the access-log line carries it.
 *
 * Probes: GET/HEAD /health (readiness: a usable worker) and /livez (liveness: the loop runs) count
 * in kvrouter_probe_requests_total only: not in kvrouter_requests_total, the duration histograms or
 * the access log, so a probe every few seconds neither floods the log nor skews the figures.
 *
 * Client disconnect: the request's on_close cancels the transfer at once (curl closes the upstream
 * connection, which makes vLLM abort the generation). on_close and timers run from the loop, never
 * inside curl callbacks, so removing the easy handle there is allowed.
 */
#include "serve/proxy.h"

#include "core/config.h"
#include "core/router_view.h"
#include "serve/lora.h"
#include "serve/tokenize.h"

#include "base/kvr.h"
#include "base/list.h"
#include "base/log.h"
#include "base/metrics.h"
#include "net/http_route.h"
#include "proto/http_headers.h"
#include "proto/json_guard.h"
#include "proto/openai.h"

#include <llhttp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define HIGH_WATER (256u * 1024u)
#define ANSWER_MAX (1u << 20)   /* answer text kept for the cache index */
#define SSE_LINE_MAX (1u << 20) /* longer SSE lines are passed through but not inspected */
#define MAX_ATTEMPTS 2
#define RESUME_LIMIT 6 /* --resume-max's bound: tried[] holds MAX_ATTEMPTS + RESUME_LIMIT slots */
/* Idle configured easy handles kept for the next attempts (see upstream_transfer()). */
#define EASY_POOL_MAX 256
/* A /tokenize call not answered within this is given up: the request is routed approximately. */
#define TOKENIZE_TIMEOUT_MS 5000

typedef struct px_s px_t;

/* What happened when a stream broke after its client got tokens (kvrouter_stream_resumes_total). */
#define RESUME_RESULT_MAP(XX)                                                                      \
  XX(RESUMED, "resumed")             /* continued on another worker */                             \
  XX(FINISHED, "finished")           /* its finish_reason had been sent: ended with [DONE] */      \
  XX(NOT_RESUMABLE, "not_resumable") /* a tool call, n > 1, echo, a token-id prompt, off... */     \
  XX(REFUSED, "refused")             /* --resume-max continuations already made */                 \
  XX(NO_WORKER, "no_worker")         /* no other worker could take the continuation */

typedef enum {
#define XX(name, label) RESUME_##name,
  RESUME_RESULT_MAP(XX)
#undef XX
      RESUME_RESULTS
} resume_result_t;

struct kvr_proxy_s {
  uv_loop_t *loop;    /* not owned; request timers */
  kvr_curlm_t *curlm; /* not owned; upstream transfers */
  kvr_router_t *r;
  kvr_list_t pxs;             /* in-flight requests (px_t.node), newest first */
  size_t active;              /* their number */
  kvr_list_t queue;           /* admission queue (px_t.qnode), oldest first; see admit() */
  bool pumping;               /* pump() is running (it may end requests, which call it again) */
  uint64_t rid_state;         /* request-id generator (kvr_http_request_id_gen) */
  kvr_tokenizer_t *tokenizer; /* precise mode's POST /tokenize calls and their cache */
  kvr_lora_t *lora;           /* runtime LoRA loads (--lora-adapter) */
  kvr_trace_out_t *trace;     /* --trace-out, not owned, or NULL */
  uint64_t resumes[RESUME_RESULTS];

  /* Idle upstream easy handles with the options every attempt shares (upstream_transfer()). */
  CURL *easy_pool[EASY_POOL_MAX];
  size_t neasy_pool;
  kvr_buf_t hdr_lines; /* upstream_headers()'s scratch: the lines, NUL after each */
  size_t nhdr_lines;
  int32_t hdr_dp_rank; /* upstream_headers()'s worker's data-parallel rank, -1: a whole server */
};

typedef enum { TM_NONE, TM_FIRST_BYTE, TM_IDLE, TM_QUEUE } tm_kind_t;

struct px_s {
  kvr_proxy_t *proxy;
  kvr_router_t *r;
  kvr_list_t node;     /* in proxy->pxs from the first attempt until px_end() */
  kvr_list_t qnode;    /* in proxy->queue while queued */
  bool queued;         /* waiting for admission (no attempt yet) */
  bool retrying;       /* holds one retry of the retry budget until px_end() */
  kvr_http_req_t *req; /* NULL once finished */
  kvr_prompt_t prompt;
  bool has_prompt;
  bool prompt_cut;       /* the body held U+0000: routed by load, nothing learned (guard_body()) */
  int pin_slot;          /* the worker that stored the response this request names, or -1 */
  int prefer_slot;       /* the worker its session key last went to, or -1 (session_hint()) */
  kvr_buf_t session_key; /* "model" US key, or empty: no key */
  /* Resuming a broken stream (resume_stream()): the continuations started, the token events and
   * answer bytes the client got (answer holds them while answer_full is false), what makes a
   * stream not resumable, the first stream's id every spliced chunk takes, the continuation's
   * request body, and the token events sent before the current continuation began. */
  int resumes;
  uint64_t tokens_out, tokens_prior;
  /* Which workers a continuation avoids: the slots tried[avoid_from..attempts), the attempts since
   * the latest break, that is since the last attempt that sent the client a token and then broke
   * (resume_stream() moves it; an attempt's first token count is tokens_at_begin). Workers tried
   * before that are left to the router's health and ejection state, as any request's are. */
  int avoid_from;
  uint64_t tokens_at_begin;
  bool answer_full, tool_call_seen, finish_seen, resume_bad;
  bool client_sse; /* the client's response is an event stream (sse is the current attempt's) */
  const char *break_why, *break_outcome; /* why the stream last broke (static strings, or
                                          * error_why) */
  /* The worker sent a 5xx error event inside a stream the router can continue
   * (error_event_breaks()): the event is held back, the transfer aborted and the answer resumed;
   * error_why says so, with the worker's message. */
  bool error_break;
  size_t error_line_at; /* where the held-back event began in the body chunk being fed */
  char error_why[200];
  /* Why a broken stream was not continued (resume_stream()), or empty: its error event says so
   * after why it broke (broken_stream()). */
  char not_resumed[112];
  char first_id[96];
  kvr_buf_t resume_body;
  kvr_route_req_t rreq;
  /* Precise mode: the prompt's token-block chain (rreq.kv_chain points here) and the tokenize
   * call in flight before the decision. */
  uint64_t *kv_chain;
  uint32_t tok_block_size;
  kvr_kv_salts_t kv_salts; /* its adapter's and cache_salt's, as vLLM's events carry them */
  kvr_tokenize_op_t *tok_op;
  bool tok_sync;             /* inside kvr_tokenize(): a cache hit answers before it returns */
  kvr_lora_wait_t lora_wait; /* waiting for its adapter's load on the chosen worker */
  uint64_t tok_t0_ns;
  /* Current attempt. */
  const kvr_worker_t *w; /* valid while acct is open */
  CURL *easy;
  struct curl_slist *hdrs;
  kvr_buf_t url;
  bool transfer_active;
  bool paused;
  int attempts;
  /* The slots of the attempts so far (attempts of them): at most MAX_ATTEMPTS (the first and its
   * retry before any byte reached the client) plus one per continuation (resume_max <=
   * RESUME_LIMIT); resume_stream() refuses a continuation that would not fit. */
  int tried[MAX_ATTEMPTS + RESUME_LIMIT];
  kvr_req_error_t retried_error; /* why the attempt that was retried failed */
  kvr_router_dispatch_t acct;    /* what the current attempt added to w; open while accounted */
  /* Response. */
  int status;
  kvr_http_resp_check_t resp_check; /* the head being read, checked line by line */
  kvr_http_resp_err_t resp_err;     /* why the head was refused (OK: it was not) */
  kvr_buf_t resp_headers;           /* filtered "Name: value\r\n" lines for the client */
  kvr_buf_t conn_tokens;            /* ",a,b," names listed in the response's Connection header */
  bool got_byte;
  bool sse;
  bool head_req;  /* a HEAD request: the answer's Content-Length describes the GET body */
  bool streaming; /* client response started and body bytes go straight through */
  kvr_buf_t body; /* held non-SSE body */
  kvr_openai_sse_t sse_lines; /* SSE line splitter (lines over SSE_LINE_MAX are not inspected) */
  kvr_buf_t answer;
  bool usage_seen;
  kvr_router_usage_t usage; /* the last usage object of the answer */
  kvr_route_t route;        /* for kvrouter_http_requests_total */
  uint64_t last_token_ns;   /* the previous token event (TTFT, then inter-token latency) */
  bool mid_stream_error;
  /* Timing and outcome. */
  uv_timer_t timer;
  tm_kind_t tm;
  uint64_t idle_from_ms;  /* loop time of the last upstream data (TM_IDLE counts from it) */
  uint64_t idle_armed_ms; /* the idle timeout the running TM_IDLE timer was set for */
  uint64_t t_start_ns, t_first_byte_ns;
  uint64_t bytes_out;
  const char *outcome;
  int final_status;
  char worker_label[16];
  int32_t worker_dp_rank; /* the last attempt's worker's data-parallel rank, -1: none */
};

static void attempt(px_t *px);
static void px_end(px_t *px);

static void resume_count(px_t *px, resume_result_t r) {
  px->proxy->resumes[r]++;
}

void kvr_proxy_metrics(const kvr_proxy_t *p, kvr_buf_t *out) {
  static const char *const names[] = {
#define XX(name, label) label,
      RESUME_RESULT_MAP(XX)
#undef XX
  };
  kvr_metric_family(out, "kvrouter_stream_resumes_total", "counter",
                    "Streams broken after their client got tokens, by what followed: resumed "
                    "(continued on another worker), finished (every token had been sent), "
                    "not_resumable, refused (--resume-max reached), no_worker");
  for (int i = 0; i < RESUME_RESULTS; i++) {
    char l[48];
    snprintf(l, sizeof l, "result=\"%s\"", names[i]);
    kvr_metric_sample(out, "kvrouter_stream_resumes_total", l, (double)p->resumes[i]);
  }
}

kvr_proxy_t *kvr_proxy_new(uv_loop_t *loop, kvr_router_t *r, kvr_curlm_t *curlm) {
  kvr_proxy_t *p = kvr_xcalloc(1, sizeof *p);
  p->loop = loop;
  p->curlm = curlm;
  p->r = r;
  p->rid_state = kvr_random_seed();
  kvr_list_init(&p->pxs);
  kvr_list_init(&p->queue);
  p->tokenizer =
      kvr_tokenizer_new(curlm, r->cfg->tokenize_cache_entries, r->cfg->tokenize_prefix_coverage,
                        r->cfg->connect_timeout_ms, TOKENIZE_TIMEOUT_MS);
  p->lora =
      kvr_lora_new(curlm, r, (long)r->cfg->connect_timeout_ms, (long)r->cfg->first_byte_timeout_ms);
  return p;
}

void kvr_proxy_set_trace(kvr_proxy_t *p, kvr_trace_out_t *t) {
  p->trace = t;
}

void kvr_proxy_free(kvr_proxy_t *p) {
  if (p) {
    kvr_tokenizer_free(p->tokenizer);
    kvr_lora_free(p->lora);
    while (p->neasy_pool > 0)
      curl_easy_cleanup(p->easy_pool[--p->neasy_pool]);
    kvr_buf_free(&p->hdr_lines);
  }
  free(p);
}

size_t kvr_proxy_active(const kvr_proxy_t *p) {
  return p->active;
}

static void timer_set(px_t *px, tm_kind_t kind, uint64_t ms);

/* The idle timeout counts again from now. Lazily: the running TM_IDLE timer is left alone (a
 * stream's every event would otherwise stop and start it); when it fires early it re-arms for
 * what is left (on_timer). */
static void idle_restart(px_t *px) {
  uint64_t idle = px->r->cfg->idle_timeout_ms;
  px->idle_from_ms = uv_now(px->proxy->loop);
  if (px->tm != TM_IDLE || idle < px->idle_armed_ms) { /* not running, or a reload shortened it */
    timer_set(px, TM_IDLE, idle);
    px->idle_armed_ms = idle;
  }
}

/* ---- response side: curl callbacks
 * --------------------------------------------------------------- */

/* The header block the client gets: the worker's filtered headers, and which worker answered. */
static void client_headers(const px_t *px, kvr_buf_t *h) {
  kvr_buf_append(h, px->resp_headers.data, px->resp_headers.len);
  if (px->r->cfg->worker_header && px->w)
    kvr_buf_printf(h, "x-kvrouter-worker: %s\r\n", px->w->label);
}

static void start_client_response(px_t *px) {
  kvr_buf_t h = KVR_BUF_INIT;
  client_headers(px, &h);
  kvr_http_start(px->req, px->status, h.data);
  kvr_buf_free(&h);
  px->streaming = true;
  px->client_sse = px->sse;
}

/* Learning from routing: a worker that accepted the request (a 2xx head: vLLM validates the
 * request, context length and model included, before it answers one) will prefill the prompt and
 * hold its blocks. Recorded at the end of that head, so a request in flight already attracts its
 * followers (kv_aware's match); an attempt that failed to connect or was answered 4xx/5xx teaches
 * the index nothing. The router caps what is learned at the worker's max_model_len. */
static void learn_dispatch(px_t *px) {
  if (px->has_prompt && !px->prompt_cut && px->w && px->status >= 200 && px->status < 300)
    kvr_router_on_learn(px->r, &px->acct, px->prompt.blocks, px->prompt.nblocks);
}

/* True for a header line (with or without CRLF) named name (lower case). */
static bool is_named_line(const char *line, size_t len, const char *name) {
  size_t n = strlen(name);
  return len > n && strncasecmp(line, name, n) == 0 &&
         (line[n] == ':' || line[n] == ';' || line[n] == ' ' || line[n] == '\t');
}

/* True for a header line (with or without CRLF) named x-request-id. */
static bool is_request_id_line(const char *line, size_t len) {
  return is_named_line(line, len, "x-request-id");
}

/* A line of the worker's head broke HTTP: counted, and the transfer is aborted (returning 0 from
 * the header callback), so libcurl closes that connection instead of reusing it, and
 * transfer_failed() answers 502 before any byte of the head reached the client. */
static size_t refuse_head(px_t *px, kvr_http_resp_err_t e) {
  px->resp_err = e;
  kvr_router_on_upstream_response_error(px->r, e);
  KVR_WARN("proxy", "worker %s: invalid response head (%s); answering 502", px->worker_label,
           kvr_http_resp_err_name(e));
  return 0;
}

static size_t on_header(char *data, size_t size, size_t n, void *ud) {
  px_t *px = ud;
  size_t len = size * n;
  kvr_http_resp_err_t e;
  if (!px->got_byte) {
    /* The worker answered: it is reachable, and from now on a failure is not retried. The
     * first-byte timer keeps running until the first body byte, because vLLM sends its SSE head
     * before the request has been scheduled and prefilled. */
    px->got_byte = true;
    kvr_router_on_health(px->r, px->w->id, true);
  }
  if (px->status == 0 || (px->status < 200 && px->resp_check.status == 0)) {
    /* Status line: a new response head (the first, or the one after an interim 1xx head, which
     * is consumed here and never forwarded). */
    if ((e = kvr_http_resp_status(&px->resp_check, data, len)) != KVR_HTTP_RESP_OK)
      return refuse_head(px, e);
    px->status = px->resp_check.status;
    kvr_buf_reset(&px->resp_headers);
    kvr_buf_reset(&px->conn_tokens);
    px->sse = false;
    return len;
  }
  if ((len == 1 && data[0] == '\n') || (len == 2 && data[0] == '\r' && data[1] == '\n')) {
    /* blank line: end of a head */
    if ((e = kvr_http_resp_end(&px->resp_check)) != KVR_HTTP_RESP_OK)
      return refuse_head(px, e);
    if (px->resumes > 0 && px->status >= 200 && (px->status != 200 || !px->sse)) {
      /* A continuation answered with an error or a plain body: nothing of it may reach the
       * client's stream (transfer_failed() tries the next worker or ends the stream). */
      px->resume_bad = true;
      return 0;
    }
    if (px->status < 200)
      px->resp_check.status = 0; /* an interim head ended: a status line comes next */
    if (px->status >= 200) {
      kvr_http_headers_drop_named(&px->resp_headers, &px->conn_tokens);
      learn_dispatch(px);
    }
    return len;
  }
  if ((e = kvr_http_resp_field(&px->resp_check, data, len)) != KVR_HTTP_RESP_OK)
    return refuse_head(px, e);
  if (is_request_id_line(data, len))
    return len; /* the client gets the router's x-request-id (the same id, sent upstream) */
  if (kvr_http_headers_response_field(&px->resp_headers, &px->conn_tokens, data, len, px->head_req))
    px->sse = true;
  return len;
}

/* A Responses answer names its id (its body, or the response.created event): the worker it came
 * from holds it now (when the worker stores responses), so the router remembers where it is. A
 * request with "store": false is stored nowhere (vLLM answers 404 for its id on every worker):
 * its id is not kept, nor counted as an open session whose next turn would come back here. */
static void take_response_id(px_t *px, const kvr_openai_chunk_t *c) {
  if (c->response_id && px->route == KVR_ROUTE_RESPONSES && px->acct.open && px->status >= 200 &&
      px->status < 300 && (!px->has_prompt || px->prompt.store))
    kvr_router_on_response_id(px->r, &px->acct, c->response_id, strlen(c->response_id));
}

/* Keeps the usage figures of a response object (streaming chunk or whole body). */
static void take_usage(px_t *px, const kvr_openai_chunk_t *c) {
  /* Refused figures (openai.h: not integers in [0, 2^32], cached above prompt) or a total above
   * the worker's context (vLLM never answers one): the answer counts as one without usage. */
  uint64_t ctx = px->w ? px->w->max_model_len : 0;
  if (c->usage_invalid ||
      (c->has_prompt_tokens && ctx &&
       c->prompt_tokens + (c->has_completion_tokens ? c->completion_tokens : 0) > ctx)) {
    kvr_router_on_usage_rejected(px->r);
    px->usage_seen = false;
    return;
  }
  if (c->has_prompt_tokens) {
    px->usage_seen = true;
    px->usage.prompt_tokens = c->prompt_tokens;
    px->usage.has_details = c->has_cached_tokens;
    px->usage.cached_tokens = c->has_cached_tokens ? c->cached_tokens : 0;
    px->usage.completion_tokens = c->has_completion_tokens ? c->completion_tokens : 0;
  }
}

/* The "model" the request names (NULL: none, or a body the router does not read): the workers it
 * is eligible for, and its model label in the metrics and the access log. */
static const char *px_model(const px_t *px) {
  return px->has_prompt ? px->prompt.model : NULL;
}

/* A token event reached the client's stream: the first one's delay since the request arrived,
 * then the gaps between them. */
static void token_timing(px_t *px) {
  uint64_t now = kvr_now_ns();
  if (px->last_token_ns == 0)
    kvr_router_observe_ttft(px->r, px_model(px), (double)(now - px->t_start_ns) / 1e9);
  else
    kvr_router_observe_itl(px->r, px_model(px), (double)(now - px->last_token_ns) / 1e9);
  px->last_token_ns = now;
}

/* Appends the generated text of one choice; true if there was some (a token event). */
static bool take_text(px_t *px, const kvr_openai_chunk_t *c) {
  if (c->text == NULL)
    return false;
  if (!px->answer_full && px->answer.len + c->text_len <= ANSWER_MAX)
    kvr_buf_append(&px->answer, c->text, c->text_len);
  else
    px->answer_full = true; /* what the client got is no longer all here: never resumed */
  return true;
}

/* One complete SSE line (kvr_openai_sse_line_cb): "data: {...}" events carry tokens and, at the
 * end, usage. */
/* A continuation's chunk as the client's one stream must show it (resume_stream()): the first
 * stream's id; usage whose completion tokens count what the client got before (the continuation's
 * prompt held those tokens, so they leave its prompt count); the continuation's opening role chunk
 * dropped (the client had one). Writes the rewritten "data:" line, or nothing for a dropped one. */
static void splice_chunk(px_t *px, const char *p, size_t plen) {
  cJSON *obj = cJSON_ParseWithLength(p, plen); /* a normal tree: it is edited and printed */
  if (obj == NULL) {
    kvr_http_write(px->req, "data: ", 6);
    kvr_http_write(px->req, p, plen);
    kvr_http_write(px->req, "\n", 1);
    return;
  }
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(obj, "choices");
  const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  const cJSON *delta = cJSON_IsObject(c0) ? cJSON_GetObjectItemCaseSensitive(c0, "delta") : NULL;
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
  if (cJSON_GetObjectItemCaseSensitive(delta, "role") &&
      (content == NULL || (cJSON_IsString(content) && content->valuestring[0] == '\0')) &&
      !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c0, "finish_reason"))) {
    cJSON_Delete(obj); /* the role chunk: the client's stream opened with its own */
    return;
  }
  if (px->first_id[0])
    cJSON_ReplaceItemInObjectCaseSensitive(obj, "id", cJSON_CreateString(px->first_id));
  cJSON *u = cJSON_GetObjectItemCaseSensitive(obj, "usage");
  const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
  if (cJSON_IsNumber(pt) && cJSON_IsNumber(ct)) {
    double before = (double)px->tokens_prior, prompt = pt->valuedouble - before;
    double completion = ct->valuedouble + before;
    prompt = prompt < 0 ? 0 : prompt;
    cJSON_ReplaceItemInObjectCaseSensitive(u, "prompt_tokens", cJSON_CreateNumber(prompt));
    cJSON_ReplaceItemInObjectCaseSensitive(u, "completion_tokens", cJSON_CreateNumber(completion));
    if (cJSON_GetObjectItemCaseSensitive(u, "total_tokens"))
      cJSON_ReplaceItemInObjectCaseSensitive(u, "total_tokens",
                                             cJSON_CreateNumber(prompt + completion));
  }
  char *s = cJSON_PrintUnformatted(obj);
  if (s == NULL)
    kvr_oom("cJSON_PrintUnformatted", 0);
  kvr_http_write(px->req, "data: ", 6);
  kvr_http_write(px->req, s, strlen(s));
  kvr_http_write(px->req, "\n", 1);
  cJSON_free(s);
  cJSON_Delete(obj);
}

/* One SSE line of a continuation (px->resumes > 0): the lines are written one by one (the raw
 * bytes are not), data lines through splice_chunk(). */
static void spliced_line(px_t *px, const char *line, size_t len, const char *p, size_t plen,
                         bool data) {
  if (!data) {
    kvr_http_write(px->req, line, len);
    kvr_http_write(px->req, "\n", 1);
  } else if (kvr_openai_sse_done(p, plen) || plen == 0 || *p != '{') {
    kvr_http_write(px->req, line, len);
    kvr_http_write(px->req, "\n", 1);
  } else {
    splice_chunk(px, p, plen);
  }
}

/* A chat or completions stream's error event (vLLM: data: {"error": {...}} and then [DONE], when
 * the engine fails while generating: serve/utils/error_response.py gives anything but a
 * validation error code 500) that the router can continue from instead: a server error (code >=
 * 500), a stream resume_stream() could continue (the switch on, no tool call in flight, the
 * answer so far held, a prompt read), and the event begun in this body chunk, so none of it has
 * reached the client. A 4xx event (the request itself is at fault, another worker would say the
 * same) or one that cannot be held back is passed through as the worker sent it. */
static bool error_event_breaks(px_t *px, const kvr_openai_chunk_t *c) {
  const cJSON *code = cJSON_GetObjectItemCaseSensitive(c->error, "code");
  if (!cJSON_IsObject(c->error) || !cJSON_IsNumber(code) || code->valuedouble < 500 ||
      !px->r->cfg->resume_streams || !px->client_sse || !px->has_prompt || px->tool_call_seen ||
      px->answer_full || (px->route != KVR_ROUTE_CHAT && px->route != KVR_ROUTE_COMPLETIONS) ||
      px->sse_lines.line_at == SIZE_MAX)
    return false;
  px->error_break = true;
  px->error_line_at = px->sse_lines.line_at;
  snprintf(px->error_why, sizeof px->error_why, "the worker sent an error event mid-stream (%.*s)",
           120, c->error_message ? c->error_message : "no message");
  return true;
}

static void sse_line(void *data, const char *line, size_t len) {
  px_t *px = data;
  const char *p = NULL;
  size_t plen = 0;
  bool is_data = kvr_openai_sse_data(line, len, &p, &plen);
  const cJSON *obj = NULL; /* the payload's tree: no per-node allocation; not deleted */
  kvr_openai_chunk_t c;
  if (is_data && plen > 0 && *p == '{' && (obj = kvr_openai_parse_scratch(p, plen)) != NULL) {
    kvr_openai_chunk_read(obj, &c);
    if (c.error && error_event_breaks(px, &c)) {
      px->sse_lines.stop = true; /* on_body() holds it back and aborts the transfer */
      return;
    }
  }
  if (px->resumes > 0)
    spliced_line(px, line, len, p, plen, is_data);
  if (!is_data)
    return;
  if (kvr_openai_sse_done(p, plen)) {
    /* The end of the answer: nothing a worker sends after it is forwarded or learned. */
    px->sse_lines.stop = true;
    return;
  }
  if (obj == NULL)
    return;
  take_response_id(px, &c);
  if (px->first_id[0] == '\0') {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(obj, "id");
    if (cJSON_IsString(id))
      snprintf(px->first_id, sizeof px->first_id, "%s", id->valuestring);
  }
  px->tool_call_seen |= c.tool_call;
  px->finish_seen |= c.finish;
  if (take_text(px, &c)) {
    px->tokens_out++;
    kvr_router_on_token(px->r, &px->acct); /* the first one also ends the prefill */
    token_timing(px);
  }
  take_usage(px, &c);
  if (c.error)
    px->mid_stream_error = true;
}

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  px_t *px = ud;
  size_t len = size * n;
  if (px->req == NULL || px->req->closed)
    return 0; /* the client is gone: abort (curl reports a write error) */
  if (px->streaming && kvr_http_pending(px->req) > HIGH_WATER) {
    /* Not consumed: curl delivers it again after unpausing. The idle timer stops meanwhile: the
     * worker is not silent, the client is slow. */
    px->paused = true;
    timer_set(px, TM_NONE, 0);
    return CURL_WRITEFUNC_PAUSE;
  }
  if (px->t_first_byte_ns == 0) {
    px->t_first_byte_ns = kvr_now_ns();
    kvr_router_observe_ttfb(px->r, (double)(px->t_first_byte_ns - px->t_start_ns) / 1e9);
  }
  idle_restart(px);
  if (px->sse) {
    if (!px->streaming)
      start_client_response(px);
    if (px->sse_lines.stop)
      return len; /* after data: [DONE]: dropped */
    kvr_openai_sse_feed(&px->sse_lines, data, len, sse_line, px);
    size_t upto = px->error_break ? px->error_line_at : px->sse_lines.consumed;
    if (px->resumes == 0) /* a continuation's lines were written by sse_line, rewritten */
      kvr_http_write(px->req, data, upto);
    if (px->error_break) {
      px->bytes_out += upto;
      return 0; /* curl ends the transfer (a write error): transfer_failed() resumes */
    }
    if (px->sse_lines.stop)
      kvr_http_write(px->req, "\n", 1); /* the blank line that ends the [DONE] event */
    px->bytes_out += upto + px->sse_lines.stop;
    return len;
  }
  if (px->streaming) {
    kvr_http_write(px->req, data, len);
    px->bytes_out += len;
    return len;
  }
  kvr_buf_append(&px->body, data, len);
  if (px->body.len > px->r->cfg->response_buffer_max) {
    /* Too large to hold: stream from here on (a later failure shows as a truncated body). */
    start_client_response(px);
    kvr_http_write(px->req, px->body.data, px->body.len);
    px->bytes_out += px->body.len;
    kvr_buf_free(&px->body);
  }
  return len;
}

static void on_client_drain(kvr_http_req_t *req) {
  px_t *px = req->data;
  if (px && px->paused && px->transfer_active) {
    px->paused = false;
    idle_restart(px);
    curl_easy_pause(px->easy, CURLPAUSE_CONT);
  }
}

/* ---- ending
 * -------------------------------------------------------------------------------------- */

static void account_end(px_t *px) {
  if (!px->acct.open)
    return;
  px->w = NULL; /* the worker may be freed now if it was draining */
  kvr_router_on_end(px->r, &px->acct);
}

/* Ends the attempt's transfer. Its easy handle, out of the multi now, goes back to the proxy's
 * pool without the pointers into px and its request, unless the transfer was cancelled while paused
 * (curl may still hold the paused data) or the pool is full. */
static void transfer_release(px_t *px) {
  if (px->easy) {
    kvr_proxy_t *p = px->proxy;
    if (px->transfer_active)
      kvr_curlm_cancel(p->curlm, px->easy);
    if (!px->paused && p->neasy_pool < EASY_POOL_MAX) {
      curl_easy_setopt(px->easy, CURLOPT_HTTPHEADER, NULL);
      curl_easy_setopt(px->easy, CURLOPT_POSTFIELDS, NULL);
      curl_easy_setopt(px->easy, CURLOPT_WRITEDATA, NULL);
      curl_easy_setopt(px->easy, CURLOPT_HEADERDATA, NULL);
      p->easy_pool[p->neasy_pool++] = px->easy;
    } else {
      curl_easy_cleanup(px->easy);
    }
    px->easy = NULL;
  }
  free(px->hdrs); /* one block: upstream_headers() */
  px->hdrs = NULL;
  px->transfer_active = false;
  px->paused = false;
}

static void on_timer_closed(uv_handle_t *h) {
  px_t *px = h->data;
  kvr_prompt_free(&px->prompt);
  free(px->kv_chain);
  kvr_buf_free(&px->resp_headers);
  kvr_buf_free(&px->body);
  kvr_openai_sse_free(&px->sse_lines);
  kvr_buf_free(&px->answer);
  kvr_buf_free(&px->resume_body);
  kvr_buf_free(&px->session_key);
  kvr_buf_free(&px->url);
  kvr_buf_free(&px->conn_tokens);
  free(px);
}

static void access_log(px_t *px, const kvr_http_req_t *req) {
  if (!px->r->cfg->access_log)
    return;
  uint64_t now = kvr_now_ns();
  double total = (double)(now - px->t_start_ns) / 1e6;
  double ttfb = px->t_first_byte_ns ? (double)(px->t_first_byte_ns - px->t_start_ns) / 1e6 : -1;
  char rank[16] = "-";
  if (px->worker_label[0] && px->worker_dp_rank >= 0)
    snprintf(rank, sizeof rank, "%d", (int)px->worker_dp_rank);
  kvr_log(KVR_LOG_INFO, "access",
          "method=%s path=%s status=%d worker=%s model=%s dp_rank=%s policy=%s bytes=%llu "
          "ttfb_ms=%.1f total_ms=%.1f attempts=%d outcome=%s client=%s request_id=%s",
          req->method_str, req->path, px->final_status,
          px->worker_label[0] ? px->worker_label : "-", kvr_router_model_label(px->r, px_model(px)),
          rank, kvr_policy_name(px->r->policy), (unsigned long long)px->bytes_out, ttfb, total,
          px->attempts, px->outcome ? px->outcome : "ok", req->peer,
          req->request_id[0] ? req->request_id : "-");
}

/* Hands the client request back from px (which must not touch it again), writing the access-log
 * line and the duration sample for the status about to be sent. */
static kvr_http_req_t *detach(px_t *px, int status) {
  kvr_http_req_t *req = px->req;
  px->req = NULL;
  req->data = NULL;
  req->on_close = NULL;
  req->on_drain = NULL;
  px->final_status = status;
  access_log(px, req);
  kvr_router_observe_duration(px->r, (double)(kvr_now_ns() - px->t_start_ns) / 1e9);
  kvr_router_on_response(px->r, status, px->route, px->worker_label, px_model(px));
  return req;
}

static void pump(kvr_proxy_t *p);

/* Takes px out of the admission queue (it is admitted, expired or gone). */
static void unqueue(px_t *px) {
  if (!px->queued)
    return;
  px->queued = false;
  kvr_list_remove(&px->qnode);
  kvr_router_on_dequeued(px->r);
}

/* Ends the client side (if still held) and frees px once its timer has closed. */
static void px_end(px_t *px) {
  kvr_lora_cancel(&px->lora_wait);
  kvr_tokenize_cancel(px->tok_op);
  px->tok_op = NULL;
  transfer_release(px);
  account_end(px);
  unqueue(px);
  if (px->retrying)
    kvr_router_retry_release(px->r);
  px->retrying = false;
  /* 499 (nginx's "client closed request") keeps client aborts out of 5xx counts in the log. */
  if (px->req)
    kvr_http_finish(detach(px, px->req->closed ? 499 : px->req->status ? px->req->status : 500));
  kvr_list_remove(&px->node);
  px->proxy->active--;
  uv_close((uv_handle_t *)&px->timer, on_timer_closed);
  pump(px->proxy); /* a worker may have room now */
}

/* Anthropic's error type for a status (its documented names: invalid_request_error,
 * not_found_error, request_too_large, rate_limit_error, api_error, overloaded_error). */
static const char *anthropic_type(int status) {
  switch (status) {
  case 401:
    return "authentication_error";
  case 403:
    return "permission_error";
  case 404:
    return "not_found_error";
  case 413:
    return "request_too_large";
  case 429:
    return "rate_limit_error";
  case 503:
  case 529:
    return "overloaded_error";
  default:
    return status < 500 ? "invalid_request_error" : "api_error";
  }
}

/* An error the router answers itself, in the shape of the API the client speaks: Anthropic's
 * {"type":"error","error":{"type","message"}} on /v1/messages, OpenAI's elsewhere (kvr_http_error;
 * type NULL: from the status). Finishes req. extra: header lines or "". */
static void api_error(kvr_http_req_t *req, kvr_route_t route, int status, const char *extra,
                      const char *type, const char *code, const char *message) {
  if (route != KVR_ROUTE_MESSAGES) {
    kvr_http_error_h(req, status, extra, type, code, "%s", message);
    return;
  }
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "{\"type\":\"error\",\"error\":{\"type\":");
  const char *t = anthropic_type(status);
  kvr_buf_json_str(&b, t, strlen(t));
  kvr_buf_puts(&b, ",\"message\":");
  kvr_buf_json_str(&b, message, strlen(message));
  kvr_buf_puts(&b, "}}\n");
  kvr_http_respond(req, status, "application/json", extra, b.data, b.len);
  kvr_buf_free(&b);
}

static void fail(px_t *px, int status, const char *code, const char *outcome, const char *fmt,
                 const char *detail) {
  kvr_router_t *r = px->r;
  px->outcome = outcome;
  if (status == 502 || status == 504)
    kvr_router_on_upstream_failure(r);
  if (px->req && !px->req->started) {
    char extra[64] = "", msg[512];
    if (status == 503)
      snprintf(extra, sizeof extra, "Retry-After: %llu\r\n",
               (unsigned long long)r->cfg->retry_after_s);
    snprintf(msg, sizeof msg, fmt, detail);
    api_error(detach(px, status), px->route, status, extra, NULL, code, msg);
  }
}

/* Client-visible end of a response whose transfer broke after the client response started. */
static void broken_stream(px_t *px, const char *why) {
  char full[320];
  if (px->not_resumed[0]) {
    snprintf(full, sizeof full, "%s; %s", why, px->not_resumed);
    why = full;
  }
  if (px->client_sse) {
    /* The API's own shape for an error inside a stream: vLLM's error event then [DONE] (chat,
     * completions); an "error" event (Responses, Messages: vLLM's anthropic stream converter). */
    kvr_buf_t ev = KVR_BUF_INIT;
    char msg[360];
    snprintf(msg, sizeof msg, "upstream worker failed mid-stream: %s", why);
    if (px->route == KVR_ROUTE_MESSAGES) {
      kvr_buf_puts(&ev, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
                        "\"api_error\",\"message\":");
      kvr_buf_json_str(&ev, msg, strlen(msg));
      kvr_buf_puts(&ev, "}}\n\n");
    } else if (px->route == KVR_ROUTE_RESPONSES) {
      kvr_buf_puts(&ev, "event: error\ndata: {\"type\":\"error\",\"code\":"
                        "\"upstream_stream_broken\",\"param\":null,\"message\":");
      kvr_buf_json_str(&ev, msg, strlen(msg));
      kvr_buf_puts(&ev, "}\n\n");
    } else {
      kvr_openai_stream_error_event(&ev, why);
    }
    kvr_http_write(px->req, ev.data, ev.len);
    kvr_buf_free(&ev);
  } else {
    /* No way to signal an error inside a plain body: close without the final chunk so the client
     * sees a truncated message rather than a complete one. */
    kvr_http_abort(detach(px, px->req->status));
  }
}

static bool retryable(CURLcode rc) {
  return rc == CURLE_COULDNT_CONNECT || rc == CURLE_GOT_NOTHING || rc == CURLE_RECV_ERROR ||
         rc == CURLE_SEND_ERROR || rc == CURLE_OPERATION_TIMEDOUT ||
         rc == CURLE_COULDNT_RESOLVE_HOST;
}

/* The worker's head broke HTTP (refuse_head(), or a transfer that ended after an interim head):
 * never retried (the worker answered, and may have acted on the request), a 502 in OpenAI's
 * shape when nothing reached the client yet; the head being refused, nothing of it has. */
static void protocol_failure(px_t *px) {
  kvr_router_on_request_error(px->r, KVR_REQ_ERROR_UPSTREAM_PROTOCOL);
  if (!px->streaming) {
    fail(px, 502, "upstream_protocol_error", "worker_protocol",
         "upstream worker sent an invalid HTTP response (%s)",
         kvr_http_resp_err_name(px->resp_err));
  } else {
    px->outcome = "broken_stream";
    kvr_router_on_upstream_failure(px->r);
    broken_stream(px, "upstream worker sent an invalid HTTP response");
  }
  px_end(px);
}

/* Records what the response taught: the worker now holds prompt + answer; usage vs prediction. */
/* The request as a trace line (--trace-out), before learn() extends the prompt with the answer:
 * the worker's usage when it gave one, else the router's estimates (prompt bytes / 4, answer
 * bytes / 4, at least one token). */
static void trace_request(px_t *px) {
  const kvr_prompt_t *pr = &px->prompt;
  bool usage = px->usage_seen;
  uint64_t out = usage ? px->usage.completion_tokens
                       : (px->answer.len + KVR_CHARS_PER_TOKEN - 1) / KVR_CHARS_PER_TOKEN;
  kvr_trace_out_req_t t = {.arrival_ns = px->t_start_ns,
                           .blocks = pr->blocks,
                           .nblocks = pr->nblocks,
                           .prompt_chars = pr->text.len,
                           .input_tokens = usage ? px->usage.prompt_tokens : pr->prompt_tokens,
                           .output_tokens = out ? out : 1,
                           .from_usage = usage};
  kvr_trace_out_write(px->proxy->trace, &t, kvr_now_ns());
}

static void learn(px_t *px) {
  const kvr_worker_t *w = px->w;
  if (!px->has_prompt || w == NULL)
    return;
  bool ok = px->status >= 200 && px->status < 300 && !px->mid_stream_error;
  if (ok && px->proxy->trace)
    trace_request(px);
  if (px->usage_seen)
    kvr_router_on_usage(px->r, &px->acct, &px->usage);
  else if (ok)
    kvr_router_on_usage(px->r, &px->acct, NULL); /* a stream that did not ask for usage */
  if (px->answer.len && ok && !px->prompt_cut) {
    kvr_prompt_extend_answer(&px->prompt, px->answer.data, px->answer.len);
    kvr_router_on_learn(px->r, &px->acct, px->prompt.blocks, px->prompt.nblocks);
  }
}

/* Usage and answer text of a held (non-SSE) body, for learning. */
static void read_held_body(px_t *px) {
  const cJSON *obj = kvr_openai_parse_scratch(px->body.data, px->body.len); /* not deleted */
  if (obj == NULL)
    return;
  kvr_openai_chunk_t c;
  kvr_openai_chunk_read(obj, &c);
  take_response_id(px, &c);
  take_text(px, &c);
  take_usage(px, &c);
}

/* The transfer completed: learn from it and finish the client's response. */
static void transfer_succeeded(px_t *px) {
  kvr_router_t *r = px->r;
  if (px->status < 200) { /* only interim heads (or none): no answer at all */
    px->resp_err = KVR_HTTP_RESP_INTERIM_ONLY;
    kvr_router_on_upstream_response_error(r, px->resp_err);
    kvr_router_on_worker_error(r, &px->acct);
    kvr_router_on_result(r, &px->acct, false);
    protocol_failure(px);
    return;
  }
  if (!px->sse && px->body.len && px->has_prompt)
    read_held_body(px);
  if (px->status >= 500) {
    kvr_router_on_worker_error(r, &px->acct);
    kvr_router_on_request_error(r, KVR_REQ_ERROR_UPSTREAM_5XX);
  }
  kvr_router_on_result(r, &px->acct, px->status < 500);
  learn(px);
  if (!px->streaming) {
    kvr_buf_t h = KVR_BUF_INIT;
    client_headers(px, &h);
    px->bytes_out = px->body.len;
    kvr_http_respond(detach(px, px->status), px->status, NULL, h.data, px->body.data, px->body.len);
    kvr_buf_free(&h);
  }
  if (px->mid_stream_error)
    px->outcome = "worker_stream_error";
  px_end(px);
}

/* "Never connected": refused, unresolvable, or a connect timeout (curl reports that as
 * CURLE_OPERATION_TIMEDOUT with no connect time). Safe to retry, and counts towards DOWN. */
static bool never_connected(const px_t *px, CURL *easy, CURLcode rc) {
  curl_off_t connect_us = 0;
  curl_easy_getinfo(easy, CURLINFO_CONNECT_TIME_T, &connect_us);
  return !px->got_byte && (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
                           (rc == CURLE_OPERATION_TIMEDOUT && connect_us == 0));
}

/* The retry budget: the first retry of px takes one retry slot until px ends. */
static bool retry_allowed(px_t *px) {
  if (px->retrying)
    return true;
  if (!kvr_router_retry_acquire(px->r, px->proxy->active)) {
    KVR_WARN("proxy", "retry refused by the retry budget (%llu retries in flight)",
             (unsigned long long)px->r->retries_inflight);
    return false;
  }
  px->retrying = true;
  return true;
}

/* The continuation's request (resume_stream()): the client's body with what it got so far. Chat:
 * the messages plus {"role":"assistant","content": the text so far}, continue_final_message true
 * and add_generation_prompt false, as vLLM continues an assistant message
 * (../shared/VLLM-APIS.md section 3); completions: the prompt (a string) plus the text so far.
 * max_tokens and max_completion_tokens lose the token events already sent. False when the request
 * cannot be continued this way (n > 1, echo, logprobs, a prompt of token ids or several prompts,
 * nothing left of max_tokens). */
static bool continuation_body(px_t *px) {
  cJSON *b = cJSON_ParseWithLength(px->req->body.data, px->req->body.len);
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(b, "n");
  bool ok = cJSON_IsObject(b) &&
            (n == NULL || cJSON_IsNull(n) || (cJSON_IsNumber(n) && n->valuedouble == 1)) &&
            !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "echo")) &&
            !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(b, "logprobs")) &&
            !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(b, "logprobs"));
  static const char *const limits[] = {"max_tokens", "max_completion_tokens"};
  for (size_t i = 0; ok && i < KVR_ARRAY_SIZE(limits); i++) {
    cJSON *m = cJSON_GetObjectItemCaseSensitive(b, limits[i]);
    if (!cJSON_IsNumber(m))
      continue;
    double left = m->valuedouble - (double)px->tokens_out;
    ok = left >= 1;
    if (ok)
      cJSON_SetNumberValue(m, left);
  }
  if (ok && px->route == KVR_ROUTE_CHAT) {
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(b, "messages");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddItemToObject(m, "content", cJSON_CreateStringReference(""));
    ok = cJSON_IsArray(msgs);
    if (ok) {
      kvr_buf_t text = KVR_BUF_INIT;
      kvr_buf_append(&text, px->answer.data ? px->answer.data : "", px->answer.len);
      kvr_buf_append(&text, "", 1);
      cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(text.data));
      kvr_buf_free(&text);
      cJSON_AddItemToArray(msgs, m);
      cJSON_DeleteItemFromObjectCaseSensitive(b, "continue_final_message");
      cJSON_DeleteItemFromObjectCaseSensitive(b, "add_generation_prompt");
      cJSON_AddBoolToObject(b, "continue_final_message", 1);
      cJSON_AddBoolToObject(b, "add_generation_prompt", 0);
    } else {
      cJSON_Delete(m);
    }
  } else if (ok) {
    cJSON *prompt = cJSON_GetObjectItemCaseSensitive(b, "prompt");
    ok = cJSON_IsString(prompt);
    if (ok) {
      kvr_buf_t text = KVR_BUF_INIT;
      kvr_buf_puts(&text, prompt->valuestring);
      kvr_buf_append(&text, px->answer.data ? px->answer.data : "", px->answer.len);
      kvr_buf_append(&text, "", 1);
      cJSON_ReplaceItemInObjectCaseSensitive(b, "prompt", cJSON_CreateString(text.data));
      kvr_buf_free(&text);
    }
  }
  char *s = ok ? cJSON_PrintUnformatted(b) : NULL;
  cJSON_Delete(b);
  if (s == NULL)
    return false;
  kvr_buf_reset(&px->resume_body);
  kvr_buf_puts(&px->resume_body, s);
  cJSON_free(s);
  return true;
}

/* A stream broke after its client got part of the answer (a reset, a killed worker, an idle
 * timeout, a continuation's first-byte timeout). When the client is still there, the answer
 * continues on another worker and its chunks are spliced into the same stream (splice_chunk()): one
 * id, one role chunk, usage that adds up, the last finish_reason and [DONE]. True when that started
 * (or the stream had already finished and is closed cleanly); false leaves the caller to end it
 * with an error event. */
static bool resume_stream(px_t *px, const char *why, const char *outcome) {
  kvr_router_t *r = px->r;
  px->break_why = why;
  px->break_outcome = outcome;
  if (px->req == NULL || px->req->closed || !px->client_sse || !px->has_prompt)
    return false;
  if (px->finish_seen) { /* every token was sent; only usage or [DONE] was lost */
    if (!px->sse_lines.stop || px->error_break) /* a held-back error event: no [DONE] sent */
      kvr_http_write(px->req, "data: [DONE]\n\n", 14);
    resume_count(px, RESUME_FINISHED);
    px->outcome = "finished_before_break";
    px_end(px);
    return true;
  }
  const char *no = NULL;
  if (!r->cfg->resume_streams)
    no = "--resume-streams is off";
  else if (px->tool_call_seen)
    no = "a tool call's arguments were streaming";
  else if (px->answer_full || (px->route != KVR_ROUTE_CHAT && px->route != KVR_ROUTE_COMPLETIONS) ||
           !continuation_body(px))
    no = "this request cannot be continued (n, echo, logprobs, a token-id prompt, its API...)";
  if (no != NULL) {
    resume_count(px, RESUME_NOT_RESUMABLE);
    snprintf(px->not_resumed, sizeof px->not_resumed, "not continued: %s", no);
    return false;
  }
  /* Bounded per request, like Dynamo's migration limit, and not by the retry budget: the client
   * holds part of the answer, so a refused continuation saves the cluster nothing (the client
   * sends the whole request again: its prefill and every token) and loses the answer, while each
   * continuation costs one prefill of the prompt and the text so far. */
  if ((uint64_t)px->resumes >= r->cfg->resume_max ||
      px->attempts >= (int)KVR_ARRAY_SIZE(px->tried)) {
    resume_count(px, RESUME_REFUSED);
    snprintf(px->not_resumed, sizeof px->not_resumed,
             "not continued: %d continuations, the most one stream may have (--resume-max)",
             px->resumes);
    return false;
  }
  KVR_WARN("proxy", "worker %s broke a stream after %llu tokens; continuing it elsewhere",
           px->worker_label, (unsigned long long)px->tokens_out);
  /* A break after this attempt sent tokens starts a new window: the continuation avoids only the
   * worker that broke it. One that failed before sending any keeps the window (every worker that
   * failed since the client last got a token stays avoided), so the loop moves on. */
  if (px->tokens_out > px->tokens_at_begin)
    px->avoid_from = px->attempts - 1;
  px->resumes++;
  px->tokens_prior = px->tokens_out;
  px->resume_bad = false;
  px->error_break = false;
  transfer_release(px);
  account_end(px);
  resume_count(px, RESUME_RESUMED);
  px->outcome = "resumed";
  attempt(px);
  return true;
}

/* Sends px's request whole to another worker: its attempt failed before any of the answer reached
 * the client (transfer_failed(), or the first-byte timeout) and the caller checked the bounds
 * (MAX_ATTEMPTS, the retry budget). reason is why, for the error a failed retry reports. */
static void retry_elsewhere(px_t *px, kvr_req_error_t reason) {
  px->retried_error = reason;
  if (px->w)
    kvr_router_on_retry(px->r, &px->acct);
  transfer_release(px);
  account_end(px);
  attempt(px);
}

/* The transfer failed while the client is still there. */
static void transfer_failed(px_t *px, CURL *easy, CURLcode rc) {
  kvr_router_t *r = px->r;
  const char *why = px->error_break ? px->error_why : curl_easy_strerror(rc);
  const kvr_worker_t *w = px->w;
  if (w)
    kvr_router_on_worker_error(r, &px->acct);
  bool unreached = never_connected(px, easy, rc);
  if (w && unreached)
    kvr_router_on_health(r, w->id, false);
  kvr_router_on_result(r, &px->acct, false);
  w = px->w; /* still valid: the record is open */
  /* A failure after connecting but before any response byte is retried too (the worker never
   * answered), except a timeout, which would double the wait. So is a held (non-streamed) answer
   * of a generation route whose body broke: nothing of it reached the client, and generating it
   * again elsewhere is the whole effect of the request. */
  bool held_broke = px->got_byte && !px->streaming && px->has_prompt &&
                    (retryable(rc) || rc == CURLE_PARTIAL_FILE) && rc != CURLE_OPERATION_TIMEDOUT;
  bool can_retry =
      (!px->got_byte && (unreached || (retryable(rc) && rc != CURLE_OPERATION_TIMEDOUT))) ||
      held_broke;
  /* Before any response byte the worker was not reached or dropped the connection unanswered. */
  kvr_req_error_t reason = px->got_byte ? KVR_REQ_ERROR_BROKEN_STREAM : KVR_REQ_ERROR_CONNECT;
  /* A head the checker never saw: libcurl refused it first (no HTTP status line, a NUL byte,
   * an empty Content-Length), or the worker closed after interim heads. */
  if (px->resp_err == KVR_HTTP_RESP_OK && !unreached &&
      (rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_WEIRD_SERVER_REPLY ||
       (px->status > 0 && px->status < 200))) {
    px->resp_err =
        px->status > 0 && px->status < 200 ? KVR_HTTP_RESP_INTERIM_ONLY : KVR_HTTP_RESP_MALFORMED;
    kvr_router_on_upstream_response_error(r, px->resp_err);
  }
  if (px->resp_err != KVR_HTTP_RESP_OK) {
    protocol_failure(px);
    return;
  }
  if (px->streaming) { /* the client got part of the answer: continue it, or end it */
    kvr_router_on_request_error(r, KVR_REQ_ERROR_BROKEN_STREAM);
    /* why: curl_easy_strerror's static string, or px->error_why */
    if (resume_stream(px, why, px->error_break ? "worker_stream_error" : "broken_stream"))
      return;
    px->outcome = px->error_break ? "worker_stream_error" : "broken_stream";
    kvr_router_on_upstream_failure(r);
    broken_stream(px, why);
    px_end(px);
    return;
  }
  if (can_retry && px->attempts < MAX_ATTEMPTS && retry_allowed(px)) {
    KVR_WARN("proxy", "worker %s failed %s (%s); retrying elsewhere", w ? w->label : "-",
             held_broke ? "mid-answer, before any byte reached the client" : "before responding",
             why);
    retry_elsewhere(px, reason);
    return;
  }
  if (can_retry)
    kvr_router_on_retries_exhausted(r);
  kvr_router_on_request_error(r, reason);
  if (!px->streaming) {
    fail(px, 502, "upstream_error", "worker_failed", "upstream worker failed: %s", why);
  } else {
    px->outcome = "broken_stream";
    kvr_router_on_upstream_failure(r);
    broken_stream(px, why);
  }
  px_end(px);
}

static void on_done(CURL *easy, CURLcode rc, void *data) {
  px_t *px = data;
  px->transfer_active = false;
  timer_set(px, TM_NONE, 0);
  if (rc == CURLE_OK) {
    transfer_succeeded(px);
  } else if (px->req == NULL || px->req->closed) {
    /* A client that went away is not the worker's fault. */
    px->outcome = "client_closed";
    kvr_router_on_client_abort(px->r);
    px_end(px);
  } else {
    transfer_failed(px, easy, rc);
  }
}

/* ---- admission bound
 * -----------------------------------------------------------------------------
 *
 * Off unless admission_max_inflight > 0. A new request goes straight to attempt() while some
 * usable worker serving its model has fewer than max_inflight requests in flight once the queued
 * requests that can go have gone; otherwise it waits in proxy->queue (at most
 * admission_queue_limit) with a TM_QUEUE timer of admission_max_wait_ms. Whenever a request ends,
 * pump() walks the queue oldest first and admits each request some worker serving its model has
 * room for: first come, first served among the requests that compete for the same workers, while a
 * request for a model whose workers have room never waits behind one for another model's full
 * workers. A full queue or an expired wait answers 503 with Retry-After; a client that goes away
 * while queued is taken out by px_end() (on_client_close). Retries skip the bound: their request
 * was admitted already and its slot on the failed worker is free again.
 */

static void attempt(px_t *px);

static void reject_overloaded(px_t *px, kvr_admission_reject_t why) {
  unqueue(px);
  kvr_router_on_admission_reject(px->r, why);
  kvr_router_on_request_error(px->r, KVR_REQ_ERROR_OVERLOADED);
  fail(px, 503, "server_overloaded", why == KVR_ADMISSION_TIMEOUT ? "queue_timeout" : "queue_full",
       "%s",
       why == KVR_ADMISSION_TIMEOUT
           ? "the server is overloaded: the request waited too long for a worker; retry later"
           : "the server is overloaded: too many requests are waiting; retry later");
  px_end(px);
}

/* Whether px must wait: every usable worker serving its model is at the admission bound. */
static bool admission_blocked(const px_t *px) {
  kvr_router_avoid_t serving = {.model = px_model(px)};
  return kvr_router_admission_blocked(px->r, &serving);
}

/* A new request: attempted now, queued, or refused with 503 when the queue is full. The queued
 * requests that can go go first (pump()): whatever is still queued then is waiting for full
 * workers, so px goes now exactly when a worker serving its model has room. */
static void admit(px_t *px) {
  kvr_proxy_t *p = px->proxy;
  kvr_router_t *r = px->r;
  if (r->cfg->admission_max_inflight == 0) {
    attempt(px);
    return;
  }
  if (!kvr_list_empty(&p->queue))
    pump(p);
  if (!admission_blocked(px)) {
    attempt(px);
    return;
  }
  if (r->admission_queue_depth >= r->cfg->admission_queue_limit) {
    reject_overloaded(px, KVR_ADMISSION_QUEUE_FULL);
    return;
  }
  px->queued = true;
  kvr_list_insert_tail(&p->queue, &px->qnode);
  kvr_router_on_queued(r);
  timer_set(px, TM_QUEUE, r->cfg->admission_max_wait_ms);
}

/* Whether model (NULL: any) is among the n models of blocked (found waiting for full workers). */
static bool model_blocked(const char *const *blocked, size_t n, const char *model) {
  for (size_t i = 0; i < n; i++)
    if ((blocked[i] == NULL) == (model == NULL) && (model == NULL || !strcmp(blocked[i], model)))
      return true;
  return false;
}

/* Admits queued requests, oldest first, each that some worker serving its model has room for.
 * Admitting only fills workers, so a model found blocked stays blocked for the rest of the walk
 * (remembered for up to PUMP_MODELS of them), and a blocked request for any model (no "model")
 * means every worker is full: the walk ends. */
#define PUMP_MODELS 16
static void pump(kvr_proxy_t *p) {
  if (p->pumping)
    return;
  p->pumping = true;
  const char *blocked[PUMP_MODELS];
  size_t nblocked = 0;
  kvr_list_t *n = p->queue.next;
  while (n != &p->queue) {
    px_t *px = KVR_CONTAINER_OF(n, px_t, qnode);
    n = n->next;
    const char *model = px_model(px);
    if (model != NULL && model[0] == '\0')
      model = NULL;
    if (model_blocked(blocked, nblocked, model))
      continue;
    if (admission_blocked(px)) {
      if (model == NULL)
        break;
      if (nblocked < PUMP_MODELS)
        blocked[nblocked++] = model;
      continue;
    }
    unqueue(px);
    timer_set(px, TM_NONE, 0);
    attempt(px);
  }
  p->pumping = false;
}

/* ---- timers -------------------------------------------------------------------------------------
 */

/* The first-byte timeout fired and nothing of the answer reached the client: the request goes
 * whole to another worker, as one whose worker failed before answering does (transfer_failed()),
 * within the same bounds (MAX_ATTEMPTS, the retry budget); the timeout starts again there. Not a
 * request pinned to the worker that stored the response it names (no other worker holds it: its
 * 504 says the truth), nor a continuation (px->streaming: resume_stream() moves those on). */
static bool first_byte_retry(px_t *px) {
  if (px->got_byte || px->streaming || px->pin_slot >= 0 || px->attempts >= MAX_ATTEMPTS ||
      !retry_allowed(px))
    return false;
  KVR_WARN("proxy", "worker %s did not start responding in time; retrying elsewhere",
           px->w ? px->w->label : "-");
  retry_elsewhere(px, KVR_REQ_ERROR_FIRST_BYTE_TIMEOUT);
  return true;
}

static void on_timer(uv_timer_t *t) {
  px_t *px = t->data;
  tm_kind_t kind = px->tm;
  if (kind == TM_IDLE) {
    uint64_t idle = px->r->cfg->idle_timeout_ms,
             silent = uv_now(px->proxy->loop) - px->idle_from_ms;
    if (silent < idle) { /* data came since the timer was set: wait for what is left */
      uv_timer_start(&px->timer, on_timer, idle - silent, 0);
      px->idle_armed_ms = idle;
      return;
    }
  }
  px->tm = TM_NONE;
  if (kind == TM_QUEUE) {
    if (px->queued)
      reject_overloaded(px, KVR_ADMISSION_TIMEOUT);
    return;
  }
  if (!px->transfer_active)
    return;
  /* Outside curl callbacks: the handle may be removed here. */
  kvr_curlm_cancel(px->proxy->curlm, px->easy);
  px->transfer_active = false;
  if (px->w)
    kvr_router_on_worker_error(px->r, &px->acct);
  if (kind == TM_FIRST_BYTE && !px->got_byte && px->w)
    kvr_router_on_health(px->r, px->w->id, false); /* accepted but never answered */
  if (kind == TM_FIRST_BYTE)
    kvr_router_on_result(px->r, &px->acct, false);
  if (kind == TM_FIRST_BYTE && first_byte_retry(px))
    return;
  kvr_router_on_request_error(px->r, kind == TM_FIRST_BYTE ? KVR_REQ_ERROR_FIRST_BYTE_TIMEOUT
                                                           : KVR_REQ_ERROR_IDLE_TIMEOUT);
  if (!px->streaming) {
    fail(px, 504, "upstream_timeout", "worker_timeout", "%s",
         kind == TM_FIRST_BYTE ? "upstream worker did not start responding in time"
                               : "upstream worker stalled while responding");
  } else {
    /* The client has part of the answer: a silent stream (idle), or a continuation whose worker
     * never started answering (first byte; e.g. a hung worker), is continued elsewhere. */
    const char *why = kind == TM_IDLE
                          ? "no data within the idle timeout"
                          : "the continuation's worker did not start responding in time";
    const char *outcome = kind == TM_IDLE ? "stream_idle_timeout" : "stream_first_byte_timeout";
    if (kind == TM_IDLE)
      kvr_router_on_result(px->r, &px->acct, false);
    if (resume_stream(px, why, outcome))
      return;
    kvr_router_on_upstream_failure(px->r);
    px->outcome = outcome;
    broken_stream(px, why);
  }
  px_end(px);
}

static void timer_set(px_t *px, tm_kind_t kind, uint64_t ms) {
  px->tm = kind;
  if (kind == TM_NONE)
    uv_timer_stop(&px->timer);
  else
    uv_timer_start(&px->timer, on_timer, ms, 0);
}

static void on_client_close(kvr_http_req_t *req) {
  px_t *px = req->data;
  if (px == NULL)
    return;
  kvr_router_on_client_abort(px->r);
  px->outcome = "client_closed";
  /* Cancelling closes the upstream connection at once, so the worker aborts the generation. */
  timer_set(px, TM_NONE, 0);
  px_end(px);
}

/* ---- request side ------------------------------------------------------------------------------
 */

static void add_upstream_line(kvr_proxy_t *p, const char *line) {
  kvr_buf_append(&p->hdr_lines, line, strlen(line) + 1);
  p->nhdr_lines++;
}

static void on_upstream_line(void *data, const char *line) {
  kvr_proxy_t *p = data;
  size_t len = strlen(line);
  if (is_request_id_line(line, len))
    return; /* replaced by the request's id below */
  if (p->hdr_dp_rank >= 0 && is_named_line(line, len, "x-data-parallel-rank"))
    return; /* the router chose the rank: replaced below */
  add_upstream_line(p, line);
}

/* The header lines for the worker as one curl_slist in a single allocation (the nodes, then the
 * text they point into), freed with free() by transfer_release(): curl only reads the list, and a
 * node and a copy per line (curl_slist_append) were two allocations per line per request. */
static struct curl_slist *upstream_headers(kvr_proxy_t *p, const kvr_http_req_t *req,
                                           const kvr_worker_t *w) {
  kvr_buf_reset(&p->hdr_lines);
  p->nhdr_lines = 0;
  p->hdr_dp_rank = w->dp_rank;
  kvr_http_headers_upstream(req->headers, req->nheaders, req->peer, on_upstream_line, p);
  if (req->request_id[0]) {
    char line[sizeof req->request_id + 16];
    snprintf(line, sizeof line, "x-request-id: %s", req->request_id);
    add_upstream_line(p, line);
  }
  /* A data-parallel rank's request names its engine (vLLM's _get_data_parallel_rank, read by
   * chat, completions and messages; /v1/responses ignores it: vLLM picks the engine there). */
  if (w->dp_rank >= 0) {
    char line[48];
    snprintf(line, sizeof line, "X-data-parallel-rank: %d", (int)w->dp_rank);
    add_upstream_line(p, line);
  }
  /* A bare "Expect:" stops curl from adding "Expect: 100-continue" to large bodies. */
  add_upstream_line(p, "Expect:");
  size_t n = p->nhdr_lines, nodes = n * sizeof(struct curl_slist);
  struct curl_slist *l = kvr_xmalloc(nodes + p->hdr_lines.len);
  char *text = (char *)l + nodes;
  memcpy(text, p->hdr_lines.data, p->hdr_lines.len);
  for (size_t i = 0; i < n; i++) {
    l[i].data = text;
    l[i].next = i + 1 < n ? &l[i + 1] : NULL;
    text += strlen(text) + 1;
  }
  return l;
}

/* No worker can take the request: 503 before any attempt, else 502 (the attempt failed). */
static void no_worker(px_t *px) {
  if (px->streaming) { /* a continuation found no worker: the stream ends with an error event */
    char why[160];
    snprintf(why, sizeof why, "%s; no other worker could continue the answer",
             px->break_why ? px->break_why : "the worker's stream broke");
    resume_count(px, RESUME_NO_WORKER);
    kvr_router_on_upstream_failure(px->r);
    px->outcome = px->break_outcome ? px->break_outcome : "broken_stream";
    broken_stream(px, why);
    px_end(px);
    return;
  }
  if (px->attempts == 0) {
    kvr_router_on_request_error(px->r, KVR_REQ_ERROR_NO_WORKER);
    fail(px, 503, "no_worker_available", "no_worker", "%s",
         "no usable worker is available; retry later");
  } else {
    /* The retry found no other worker: the request failed for the retried attempt's reason. */
    kvr_router_on_retries_exhausted(px->r);
    kvr_router_on_request_error(px->r, px->retried_error);
    if (px->retried_error == KVR_REQ_ERROR_FIRST_BYTE_TIMEOUT)
      fail(px, 504, "upstream_timeout", "worker_timeout", "%s",
           "upstream worker did not start responding in time and no other worker could take the "
           "request");
    else
      fail(px, 502, "upstream_error", "worker_failed", "%s",
           "upstream worker failed and no other worker could take the request");
  }
  px_end(px);
}

/* Points px at the worker of slot for a new attempt and forgets the previous attempt's answer. */
static void attempt_begin(px_t *px, int slot) {
  const kvr_worker_t *w = px->r->slots[slot];
  px->w = w;
  px->tried[px->attempts++] = slot; /* fits: see px_t.tried */
  px->tokens_at_begin = px->tokens_out;
  snprintf(px->worker_label, sizeof px->worker_label, "%s", w->label);
  px->worker_dp_rank = w->dp_rank;
  px->got_byte = false;
  px->status = 0;
  px->resp_err = KVR_HTTP_RESP_OK;
  memset(&px->resp_check, 0, sizeof px->resp_check);
  px->sse = false;
  kvr_buf_reset(&px->resp_headers);
  kvr_buf_reset(&px->body);
  kvr_openai_sse_reset(&px->sse_lines);
  if (px->resumes == 0) /* a continuation keeps what the client got: it is its prompt's end */
    kvr_buf_reset(&px->answer);
}

/* The client's method and body, as curl sends them. A pooled handle still has the method of its
 * previous request: that is cleared first (POSTFIELDS NULL makes curl's method POST, which HTTPGET
 * then sets back to GET without NOBODY or upload). */
static void upstream_method(CURL *e, const kvr_http_req_t *req, const kvr_buf_t *body) {
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, NULL);
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)-1);
  curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, NULL);
  curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  if (req->method == HTTP_GET) {
    /* set above */
  } else if (req->method == HTTP_HEAD) {
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else {
    if (req->method != HTTP_POST)
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method_str);
    if (req->method == HTTP_POST || body->len) {
      curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body->len);
      curl_easy_setopt(e, CURLOPT_POSTFIELDS, body->data ? body->data : "");
    }
  }
}

/* The easy handle of the current attempt: the client's request to px->w (px owns it until
 * transfer_release()). A handle from the proxy's pool keeps the options every attempt shares
 * (kvr_curl_easy_new()'s, the callbacks, PATH_AS_IS...); only this request's are set here. The
 * connection itself comes from the multi's pool either way. */
static CURL *upstream_transfer(px_t *px) {
  kvr_proxy_t *p = px->proxy;
  kvr_http_req_t *req = px->req;
  kvr_buf_reset(&px->url);
  kvr_buf_puts(&px->url, px->w->url);
  kvr_buf_puts(&px->url, req->target);
  CURL *e;
  if (p->neasy_pool > 0) {
    e = p->easy_pool[--p->neasy_pool];
    curl_easy_setopt(e, CURLOPT_URL, px->url.data);
  } else {
    e = kvr_curl_easy_new(px->url.data, 0, 0, on_body, NULL);
    /* The target was validated (no dot segments); curl must not normalise it into another path. */
    curl_easy_setopt(e, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
  }
  /* Per attempt: a reload may change the connect timeout (0 is curl's default, 300 s). */
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)px->r->cfg->connect_timeout_ms);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, px);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, px);
  px->hdrs = upstream_headers(p, req, px->w);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, px->hdrs);
  upstream_method(e, req, px->resumes > 0 ? &px->resume_body : &req->body);
  return e;
}

/* Starts the transfer of px's current attempt (its worker chosen and accounted). */
static void attempt_send(px_t *px) {
  px->easy = upstream_transfer(px);
  if (kvr_curlm_add(px->proxy->curlm, px->easy, on_done, px) != 0) {
    fail(px, 502, "upstream_error", "internal", "%s", "cannot start an upstream transfer");
    px_end(px);
    return;
  }
  px->transfer_active = true;
  timer_set(px, TM_FIRST_BYTE, px->r->cfg->first_byte_timeout_ms);
}

/* px's adapter could not be loaded on its worker: a 502 lora_load_failed in the API's shape, or,
 * for a continuation of a broken stream (its client has tokens already), the stream's error
 * event; then px ends. */
static void lora_failed(px_t *px, const char *msg) {
  kvr_router_on_request_error(px->r, KVR_REQ_ERROR_UPSTREAM_5XX);
  if (px->streaming) {
    char why[600];
    snprintf(why, sizeof why, "%s; continuing elsewhere: %s",
             px->break_why ? px->break_why : "the worker's stream broke", msg);
    kvr_router_on_upstream_failure(px->r);
    px->outcome = "lora_load_failed";
    broken_stream(px, why);
  } else {
    fail(px, 502, "lora_load_failed", "lora_load_failed", "%s", msg);
  }
  px_end(px);
}

/* The load of px's adapter on its worker ended (lora.c): the request goes on, or gets a 502 in
 * its API's shape naming the adapter, the worker and the worker's answer (a continuation of a
 * broken stream, whose client has tokens already, ends with the stream's error event instead). */
static void on_lora_loaded(kvr_lora_wait_t *wait, const kvr_lora_outcome_t *o) {
  px_t *px = KVR_CONTAINER_OF(wait, px_t, lora_wait);
  if (o->res != KVR_LORA_LOAD_FAILED) {
    attempt_send(px);
    return;
  }
  char msg[480];
  snprintf(msg, sizeof msg, "LoRA adapter '%.100s' could not be loaded on worker %s: %s%ld: %s",
           px_model(px), px->worker_label, o->status ? "HTTP " : "no answer ", o->status,
           o->reason);
  lora_failed(px, msg);
}

/* Routes px to a worker it has not tried and starts the transfer, or answers 503/502. */
static void attempt(px_t *px) {
  kvr_router_t *r = px->r;
  kvr_decision_t d;
  /* Never a worker this request tried (a continuation: since the latest break, see
   * px_t.avoid_from) or one that does not serve its model; a first attempt also avoids workers at
   * the admission bound (admit() saw one with room). A continuation takes an ejected worker when
   * nothing else is left (kvr_router_avoid_t.ejected_last_resort). */
  kvr_router_avoid_t avoid = {px->tried + px->avoid_from,
                              (size_t)(px->attempts - px->avoid_from),
                              px->attempts == 0,
                              px_model(px),
                              px->attempts == 0 ? px->prefer_slot + 1 : 0,
                              px->resumes > 0};
  int pin = px->attempts == 0 ? px->pin_slot : -1;
  int slot = pin >= 0 ? pin : kvr_router_decide(r, &px->rreq, &avoid, true, &d);
  if (slot < 0) {
    no_worker(px);
    return;
  }
  attempt_begin(px, slot);
  uint64_t prompt_tokens = px->has_prompt ? px->prompt.prompt_tokens : 0;
  kvr_router_on_dispatch_model(r, slot, prompt_tokens, pin >= 0 ? 0 : d.snaps[slot].matched_blocks,
                               px_model(px), &px->acct);
  if (px->session_key.len) /* the key's worker is now this one */
    kvr_router_on_session(r, &px->acct, px->session_key.data, px->session_key.len);
  const kvr_lora_adapter_t *a = kvr_router_lora_needs_load(r, px->w, px_model(px));
  if (a == NULL) {
    attempt_send(px);
    return;
  }
  px->lora_wait.cb = on_lora_loaded;
  if (kvr_lora_load(px->proxy->lora, px->w, a, &px->lora_wait) != 0)
    lora_failed(px, "cannot start loading the request's LoRA adapter");
}

/* The access-log line of a request naming model (NULL: none) the router answers itself (no
 * worker involved). */
static void local_log_model(kvr_router_t *r, const kvr_http_req_t *req, int status,
                            const char *outcome, const char *model) {
  if (status >= 400 && status < 500)
    kvr_router_on_client_error(r);
  kvr_router_on_response(r, status, kvr_openai_route(req->path), NULL, model);
  if (!r->cfg->access_log)
    return;
  kvr_log(KVR_LOG_INFO, "access",
          "method=%s path=%s status=%d worker=- model=%s dp_rank=- policy=%s bytes=0 "
          "ttfb_ms=-1.0 total_ms=%.1f attempts=0 outcome=%s client=%s request_id=%s",
          req->method_str, req->path, status, kvr_router_model_label(r, model),
          kvr_policy_name(r->policy), (double)(kvr_now_ns() - req->start_ns) / 1e6, outcome,
          req->peer, req->request_id[0] ? req->request_id : "-");
}

static void local_log(kvr_router_t *r, const kvr_http_req_t *req, int status, const char *outcome) {
  local_log_model(r, req, status, outcome, NULL);
}

/* A request naming a model no worker serves (kvr_router_model_unknown: every worker's GET
 * /v1/models is known and none lists it): vLLM's own 404, in the API's shape, from the router
 * without contacting a worker (access-log outcome unknown_model). */
static void unknown_model(kvr_router_t *r, kvr_http_req_t *req, kvr_route_t route,
                          const char *model) {
  kvr_buf_t b = KVR_BUF_INIT;
  local_log_model(r, req, 404, "unknown_model", model);
  kvr_vllm_model_not_found(&b, model, route == KVR_ROUTE_MESSAGES);
  kvr_http_respond(req, 404, "application/json", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

/* True for targets curl or the worker could resolve to another path: dot segments (plain or
 * percent-encoded) and backslashes. Only /v1/... and /health are public. */
static bool unsafe_path(const char *p) {
  for (const char *s = p; *s; s++) {
    if (*s == '\\')
      return true;
    if (*s == '%' && s[1] == '2' && (s[2] == 'e' || s[2] == 'E'))
      return true;
    if (*s == '/' && s[1] == '.' &&
        (s[2] == '/' || s[2] == '\0' || (s[2] == '.' && (s[3] == '/' || s[3] == '\0'))))
      return true;
  }
  return false;
}

/* GET /health (readiness): 200 while some worker is usable, else 503. A probe: not logged, not in
 * the request metrics (kvr_proxy_on_request counted it as a probe). */
static void on_health(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_router_t *r = ((kvr_proxy_t *)data)->r;
  (void)tail;
  size_t usable = 0, total = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    if (r->slots[i] == NULL)
      continue;
    total++;
    usable += r->slots[i]->state == KVR_WORKER_UP;
  }
  char body[128];
  int n =
      snprintf(body, sizeof body, "{\"status\":\"%s\",\"usable_workers\":%zu,\"workers\":%zu}\n",
               usable ? "ok" : "unavailable", usable, total);
  kvr_http_respond(req, usable ? 200 : 503, "application/json", NULL, body, (size_t)n);
}

/* GET /livez (liveness): 200 whenever the loop runs to answer it, whatever the workers. A probe,
 * like /health. */
static void on_livez(kvr_http_req_t *req, void *data, const char *tail) {
  static const char body[] = "{\"status\":\"alive\"}\n";
  (void)data;
  (void)tail;
  kvr_http_respond(req, 200, "application/json", NULL, body, sizeof body - 1);
}

/* Every /v1/ request the table lets through: proxied to a worker. */
/* ---- precise mode: the prompt's token ids before the decision ---------------------------------
 */

/* The chain of ids[0..n) for the precise index; the request's prompt tokens become exact. */
static void set_ids(px_t *px, const uint32_t *ids, size_t n, bool prefix) {
  uint64_t estimate = px->rreq.prompt_tokens;
  free(px->kv_chain);
  px->kv_chain = kvr_tokenize_route_req(ids, n, px->tok_block_size, &px->kv_salts, &px->rreq);
  if (prefix) /* a cached prefix's ids: the prompt is longer; keep the estimate */
    px->rreq.prompt_tokens = KVR_MAX(estimate, (uint64_t)n);
}

static void on_tokenized(void *data, bool ok, const uint32_t *ids, size_t n, bool prefix) {
  px_t *px = data;
  double secs = (double)(kvr_now_ns() - px->tok_t0_ns) / 1e9;
  kvr_router_observe_tokenize(px->r,
                              !ok            ? KVR_TOKENIZE_FAILED
                              : prefix       ? KVR_TOKENIZE_PREFIX
                              : px->tok_sync ? KVR_TOKENIZE_CACHED
                                             : KVR_TOKENIZE_CALLED,
                              secs);
  if (ok)
    set_ids(px, ids, n, prefix);
  if (px->tok_sync)
    return; /* answered inside kvr_tokenize(): the caller goes on */
  px->tok_op = NULL;
  admit(px);
}

/* Starts tokenizing px's prompt when some usable worker is in precise mode. True when the answer
 * comes later (on_tokenized admits px then); false when px may be admitted now (ids known, or
 * precise mode not available for it). */
static bool tokenize(px_t *px, kvr_route_t route) {
  const char *url = NULL;
  uint32_t bs = kvr_router_kv_tokenizer(px->r, px_model(px), &url);
  if (bs == 0)
    return false;
  px->tok_block_size = bs;
  kvr_router_kv_salts(px->r, px_model(px), px->prompt.cache_salt, &px->kv_salts);
  kvr_buf_t body = KVR_BUF_INIT;
  uint32_t *ids = NULL;
  size_t n = 0;
  kvr_tokenize_prefixes_t pre;
  int k = kvr_tokenize_body(px->req->body.data, px->req->body.len, route, &body, &ids, &n, &pre);
  if (k == 0)
    set_ids(px, ids, n, false); /* a prompt given as token ids */
  free(ids);
  if (k != 1) {
    kvr_tokenize_prefixes_free(&pre);
    kvr_buf_free(&body);
    return false;
  }
  px->tok_t0_ns = kvr_now_ns();
  px->tok_sync = true;
  px->tok_op = kvr_tokenize(px->proxy->tokenizer, url, &body, &pre, on_tokenized, px);
  px->tok_sync = false;
  kvr_tokenize_prefixes_free(&pre);
  kvr_buf_free(&body);
  return px->tok_op != NULL;
}

/* A request that names a stored response (a Responses follow-up's previous_response_id, or a GET
 * or cancel of /v1/responses/ID) goes to the worker that stored it when the router knows it
 * (kvr_router_on_response_lookup); otherwise the policy decides, and that worker answers with the
 * truth (vLLM's 404 for a response it does not hold). */
static void pin_response(px_t *px, kvr_route_t route) {
  const char *id = NULL;
  size_t len = 0;
  if (route == KVR_ROUTE_RESPONSES && px->has_prompt && px->prompt.previous_response_id) {
    id = px->prompt.previous_response_id;
    len = strlen(id);
  } else if (route != KVR_ROUTE_RESPONSE_ID ||
             !kvr_openai_response_path_id(px->req->path, &id, &len)) {
    return;
  }
  px->pin_slot = kvr_router_on_response_lookup(px->r, id, len, kvr_router_now_ns(px->r) / 1000000u);
}

/* A session key: the --session-header value when configured and sent, else the body's
 * prompt_cache_key; scoped by model ("model" US key), so one key in two models is two sessions.
 * The worker it last went to is preferred (kvr_router_avoid_t.prefer_plus1): the policy weighs it
 * as a worker holding the whole prompt, so load can still move the session. */
static void session_hint(px_t *px) {
  px->prefer_slot = -1;
  const char *hdr = px->r->cfg->session_header;
  const char *key = hdr ? kvr_http_header(px->req, hdr) : NULL;
  if ((key == NULL || key[0] == '\0') && px->has_prompt)
    key = px->prompt.cache_key;
  if (key == NULL || key[0] == '\0')
    return;
  const char *model = px_model(px) ? px_model(px) : "";
  kvr_buf_puts(&px->session_key, model);
  kvr_buf_append(&px->session_key, "\x1f", 1);
  kvr_buf_puts(&px->session_key, key);
  px->prefer_slot = kvr_router_on_session_lookup(px->r, px->session_key.data, px->session_key.len,
                                                 kvr_router_now_ns(px->r) / 1000000u);
}

/* The context a prompt must fit: the largest max_model_len of the workers (GET /v1/models), or 0
 * while some worker's is unknown (the configured bound then applies). */
static uint64_t guard_context(const kvr_router_t *r) {
  uint64_t most = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    if (!w->models_known || w->max_model_len == 0)
      return 0;
    most = KVR_MAX(most, w->max_model_len);
  }
  return most;
}

/* The body guard (proto/json_guard.h) before any tree is built: one linear pass refuses what vLLM
 * would refuse (invalid JSON, raw control characters, trailing data, a prompt over the context)
 * and what the router will not parse on its loop (too deep, too many values, keys, messages or
 * parts), and duplicate keys, which the router and vLLM would read differently. False when the
 * client was answered (400 or 413 in OpenAI's shape). */
static bool guard_body(kvr_router_t *r, kvr_http_req_t *req, kvr_route_t route, bool *has_nul) {
  kvr_json_guard_limits_t lim = r->cfg->body_guard;
  uint64_t ctx = guard_context(r);
  if (ctx)
    lim.max_prompt_tokens = ctx;
  lim.seed = r->instance;
  kvr_json_guard_verdict_t v;
  kvr_json_guard_kind_t kind = route == KVR_ROUTE_CHAT          ? KVR_JSON_GUARD_CHAT
                               : route == KVR_ROUTE_COMPLETIONS ? KVR_JSON_GUARD_COMPLETIONS
                                                                : KVR_JSON_GUARD_ANY;
  if (kvr_json_guard_check(req->body.data, req->body.len, kind, &lim, &v) == 0) {
    *has_nul = v.has_nul;
    return true;
  }
  local_log(r, req, v.status, "invalid_request");
  api_error(req, route, v.status, "", "invalid_request_error", v.code, v.message);
  return false;
}

static void on_proxied(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_proxy_t *p = data;
  kvr_router_t *r = p->r;
  kvr_route_t route = kvr_openai_route(req->path);
  (void)tail;
  bool has_nul = false;
  if (kvr_openai_route_has_prompt(route) && !guard_body(r, req, route, &has_nul))
    return;
  px_t *px = kvr_xcalloc(1, sizeof *px);
  px->proxy = p;
  px->r = r;
  px->t_start_ns = req->start_ns;
  px->route = route;
  kvr_prompt_init(&px->prompt);
  kvr_openai_sse_init(&px->sse_lines, SSE_LINE_MAX);
  px->pin_slot = -1;
  if (kvr_openai_route_has_prompt(route)) {
    char err[256];
    const char *code = NULL;
    if (kvr_openai_features(req->body.data, req->body.len, route, r->cfg->block_chars, &px->prompt,
                            err, sizeof err, &code) != 0) {
      free(px);
      local_log(r, req, 400, "invalid_request");
      api_error(req, route, 400, "", "invalid_request_error", code, err);
      return;
    }
    if (kvr_router_model_unknown(r, px->prompt.model)) {
      unknown_model(r, req, route, px->prompt.model);
      kvr_prompt_free(&px->prompt);
      free(px);
      return;
    }
    px->has_prompt = true;
    if (has_nul) {
      /* cJSON's strings end at U+0000, which vLLM keeps: the router's text, blocks and /tokenize
       * call would describe a prompt the worker never sees. Route it by load alone and learn
       * nothing from it, rather than plant blocks no worker holds. */
      px->prompt.nblocks = 0;
      px->prompt_cut = true;
    }
    kvr_prompt_route_req(&px->prompt, &px->rreq);
  }
  px->req = req;
  px->head_req = req->method == HTTP_HEAD;
  req->data = px;
  req->on_close = on_client_close;
  req->on_drain = on_client_drain;
  uv_timer_init(p->loop, &px->timer);
  px->timer.data = px;
  kvr_list_insert_head(&p->pxs, &px->node);
  p->active++;
  pin_response(px, route);
  session_hint(px);
  if (px->has_prompt && !px->prompt_cut &&
      (route == KVR_ROUTE_CHAT || route == KVR_ROUTE_COMPLETIONS) && tokenize(px, route))
    return; /* admitted when the ids arrive */
  admit(px);
}

/* GET /v1/models: the union of the usable workers' lists (kvr_router_view_models: each id once,
 * its card as the first worker gave it), answered by the router; while no usable worker's list is
 * known yet (just started, scraping off) one worker answers, as any proxied request. */
static void on_models(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_proxy_t *p = data;
  kvr_buf_t b = KVR_BUF_INIT;
  if (kvr_router_view_models(p->r, &b) == 0) {
    kvr_buf_free(&b);
    on_proxied(req, data, tail);
    return;
  }
  local_log(p->r, req, 200, "ok");
  kvr_http_respond(req, 200, "application/json", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

/* The public routes. The exact routes decide their paths (a wrong method there is a 405 with
 * Allow); every other /v1/ path passes through to a worker whatever its method. */
static const kvr_http_route_t routes[] = {
    {"/health", KVR_HTTP_M(GET), on_health},
    {"/livez", KVR_HTTP_M(GET), on_livez},
    {"/v1/chat/completions", KVR_HTTP_M(POST), on_proxied},
    {"/v1/completions", KVR_HTTP_M(POST), on_proxied},
    {"/v1/models", KVR_HTTP_M(GET), on_models},
    {"/v1/*", KVR_HTTP_M_ANY, on_proxied},
};

/* A readiness or liveness probe (GET or HEAD, exact path): *probe says which. Other methods on
 * those paths are ordinary (405) requests. */
static bool is_probe(const kvr_http_req_t *req, kvr_probe_t *probe) {
  if (req->method != HTTP_GET && req->method != HTTP_HEAD)
    return false;
  if (strcmp(req->path, "/health") == 0)
    *probe = KVR_PROBE_HEALTH;
  else if (strcmp(req->path, "/livez") == 0)
    *probe = KVR_PROBE_LIVEZ;
  else
    return false;
  return true;
}

void kvr_proxy_on_request(kvr_http_req_t *req, void *data) {
  kvr_proxy_t *p = data;
  kvr_http_request_id_assign(req, &p->rid_state);
  kvr_probe_t probe;
  if (is_probe(req, &probe)) {
    kvr_router_on_probe(p->r, probe);
    kvr_http_route_dispatch(routes, KVR_ARRAY_SIZE(routes), req, p, KVR_HTTP_DIALECT_OPENAI);
    return;
  }
  kvr_router_on_request(p->r);
  if (unsafe_path(req->path)) {
    local_log(p->r, req, 400, "rejected");
    kvr_http_error(req, 400, NULL, "invalid_path", "%s",
                   "dot segments and backslashes are not allowed in the path");
    return;
  }
  /* A 404 or 405 is logged before it is answered: answering finishes req, which frees it, so the
   * status kvr_http_route_dispatch() returns comes too late for the log line. */
  const char *tail;
  int status;
  char allow[128];
  if (kvr_http_route_find(routes, KVR_ARRAY_SIZE(routes), req->path, req->method, &tail, &status,
                          allow, sizeof allow) == NULL)
    local_log(p->r, req, status, "rejected");
  kvr_http_route_dispatch(routes, KVR_ARRAY_SIZE(routes), req, p, KVR_HTTP_DIALECT_OPENAI);
}

void kvr_proxy_abort_all(kvr_proxy_t *p) {
  p->pumping = true; /* nothing queued is admitted any more: everything ends here */
  while (!kvr_list_empty(&p->pxs)) {
    px_t *px = KVR_CONTAINER_OF(p->pxs.next, px_t, node);
    timer_set(px, TM_NONE, 0);
    if (px->req && !px->req->started)
      fail(px, 503, "shutting_down", "shutdown", "%s", "the router is shutting down");
    else if (px->req && px->streaming)
      broken_stream(px, "the router is shutting down");
    px->outcome = "shutdown";
    px_end(px);
  }
}

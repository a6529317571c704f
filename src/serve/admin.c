/* admin.c -- the admin API handlers (see admin.h for the routes).
 *
 * Every handler but one answers synchronously from the router's state, so the admin listener stays
 * responsive while the public one is saturated. Policy switches replace the router's policy object
 * whole (router.c); requests already routed keep their worker.
 *
 * The exception is POST /admin/reset_prefix_cache, a fan-out: a reset_op_t holds the admin request
 * and one reset_call_t per worker, each a libcurl POST WORKER/reset_prefix_cache on the curl
 * multi serve.c gave kvr_admin_new() (as scrape.c's probes), but one per server for the
 * data-parallel ranks of one URL (vLLM resets every engine at once): the other ranks' calls share
 * their first rank's answer. Each answer is recorded as it arrives;
 * a worker that answered 2xx also has its entries in the cache index forgotten, so the index keeps
 * modelling what the workers hold. When the last call is done the summary is sent and the op freed.
 * Calls hold worker ids, not pointers, because a worker may be removed while its call is in flight.
 * The op lives at most the calls' timeout; the admin listener's shutdown waits for it (it holds the
 * request), and the router and the curl multi close only after that, so both outlive every call.
 *
 * State: the handlers change the router only through its calls (add, drain, set policy, forget a
 * worker's cache entries); everything they show is read from it or rendered by router_view.c.
 */
#include "serve/admin.h"

#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "core/router_view.h"
#include "net/http_route.h"
#include "policies/policy.h"
#include "proto/openai.h"
#include "serve/dashboard.h"
#include "serve/discovery.h"
#include "serve/reload.h"
#include "serve/tokenize.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct kvr_admin_s {
  kvr_router_t *r;              /* not owned */
  kvr_curlm_t *curlm;           /* not owned; the reset fan-out's transfers */
  kvr_tokenizer_t *tokenizer;   /* route/explain's /tokenize calls in precise mode */
  const kvr_trace_out_t *trace; /* --trace-out's counters, not owned, or NULL */
  const kvr_proxy_t *proxy;     /* the public proxy's counters, not owned, or NULL */
};

void kvr_admin_set_proxy(kvr_admin_t *a, const kvr_proxy_t *p) {
  a->proxy = p;
}

void kvr_admin_set_trace(kvr_admin_t *a, const kvr_trace_out_t *t) {
  a->trace = t;
}

kvr_admin_t *kvr_admin_new(kvr_router_t *r, kvr_curlm_t *curlm) {
  kvr_admin_t *a = kvr_xcalloc(1, sizeof *a);
  a->r = r;
  a->curlm = curlm;
  a->tokenizer = kvr_tokenizer_new(curlm, 256, r->cfg->tokenize_prefix_coverage,
                                   r->cfg->connect_timeout_ms, 5000);
  return a;
}

void kvr_admin_free(kvr_admin_t *a) {
  if (a)
    kvr_tokenizer_free(a->tokenizer);
  free(a);
}

static void send_json(kvr_http_req_t *req, int status, cJSON *obj) {
  char *text = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  if (text == NULL)
    kvr_oom("cJSON_PrintUnformatted", 0);
  size_t n = strlen(text);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_append(&b, text, n);
  kvr_buf_puts(&b, "\n");
  free(text);
  kvr_http_respond(req, status, "application/json", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

static cJSON *parse_body(kvr_http_req_t *req) {
  cJSON *body = req->body.len ? cJSON_ParseWithLength(req->body.data, req->body.len) : NULL;
  if (body == NULL || !cJSON_IsObject(body)) {
    cJSON_Delete(body);
    kvr_http_error(req, 400, NULL, "invalid_json", "%s", "the request body must be a JSON object");
    return NULL;
  }
  return body;
}

/* One worker's view (built alone: building the whole list to pick one out cost 0.2 s a DELETE,
 * and a 256-rank POST one such list per rank, at 4,096 workers). */
static cJSON *worker_json(kvr_router_t *r, const kvr_worker_t *w) {
  return w ? kvr_router_view_worker(r, w) : cJSON_CreateObject();
}

static void workers_post(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_router_t *r = ((kvr_admin_t *)data)->r;
  (void)tail;
  cJSON *body = parse_body(req);
  if (body == NULL)
    return;
  const cJSON *url = cJSON_GetObjectItemCaseSensitive(body, "url");
  if (!cJSON_IsString(url)) {
    cJSON_Delete(body);
    kvr_http_error(req, 400, NULL, "missing_required_parameter", "%s",
                   "url: required, a worker base URL like http://127.0.0.1:9001");
    return;
  }
  char err[256];
  const cJSON *ev = cJSON_GetObjectItemCaseSensitive(body, "kv_events");
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(body, "kv_replay");
  const cJSON *dp = cJSON_GetObjectItemCaseSensitive(body, "dp_size");
  const char *bad = NULL;
  if ((ev && !cJSON_IsString(ev) && !cJSON_IsNull(ev)) ||
      (rp && !cJSON_IsString(rp) && !cJSON_IsNull(rp)))
    bad = "kv_events and kv_replay must be strings";
  else if (cJSON_IsString(rp) && !cJSON_IsString(ev))
    bad = "kv_replay needs kv_events";
  else if (dp && !cJSON_IsNull(dp) &&
           (!cJSON_IsNumber(dp) || dp->valuedouble < 1 || dp->valuedouble > KVR_DP_SIZE_MAX ||
            dp->valuedouble != (double)(uint32_t)dp->valuedouble))
    bad = "dp_size must be a whole number of data-parallel ranks, 1..256";
  else if ((cJSON_IsString(ev) && kvr_url_kv_endpoint(ev->valuestring, err, sizeof err) != 0) ||
           (cJSON_IsString(rp) && kvr_url_kv_endpoint(rp->valuestring, err, sizeof err) != 0))
    bad = err;
  if (bad) {
    char msg[300];
    snprintf(msg, sizeof msg, "%s", bad);
    cJSON_Delete(body);
    kvr_http_error(req, 400, NULL, "invalid_value", "%s", msg);
    return;
  }
  uint32_t dp_size = cJSON_IsNumber(dp) ? (uint32_t)dp->valuedouble : 0;
  char norm[512];
  int n = kvr_router_add_workers(r, url->valuestring, dp_size,
                                 cJSON_IsString(ev) ? ev->valuestring : NULL,
                                 cJSON_IsString(rp) ? rp->valuestring : NULL, err, sizeof err);
  if (n > 0)
    kvr_url_worker(url->valuestring, norm, sizeof norm, err, sizeof err);
  cJSON_Delete(body);
  if (n == KVR_ELIMIT) { /* every slot taken (KVR_MAX_WORKERS) */
    kvr_http_error(req, 400, NULL, "too_many_workers", "%s", err);
    return;
  }
  if (n <= 0) {
    kvr_http_error(req, 400, NULL, "invalid_value", "%s%s", strncmp(err, "KV", 2) ? "url: " : "",
                   err);
    return;
  }
  if (dp_size == 0) {
    send_json(req, 201, worker_json(r, kvr_router_worker_serving(r, norm)));
    return;
  }
  /* A data-parallel server: one worker per rank, in rank order. */
  cJSON *o = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(o, "workers");
  for (uint32_t k = 0; k < dp_size; k++)
    cJSON_AddItemToArray(arr, worker_json(r, kvr_router_worker_serving_rank(r, norm, (int32_t)k)));
  send_json(req, 201, o);
}

/* DELETE /admin/workers/{id}: idtext is the route's tail. */
static void workers_delete(kvr_http_req_t *req, void *data, const char *idtext) {
  kvr_router_t *r = ((kvr_admin_t *)data)->r;
  uint32_t id;
  if (kvr_parse_u32(idtext, &id) != 0) {
    kvr_http_error(req, 400, NULL, "invalid_value",
                   "worker id '%.40s': want a decimal number of 1 to 10 digits, at most %u", idtext,
                   UINT32_MAX);
    return;
  }
  const kvr_worker_t *w = kvr_router_worker_by_id(r, id);
  if (w == NULL) {
    kvr_http_error(req, 404, NULL, "worker_not_found", "no worker with id '%s'", idtext);
    return;
  }
  cJSON *o = worker_json(r, w);
  cJSON_ReplaceItemInObjectCaseSensitive(o, "state", cJSON_CreateString("draining"));
  kvr_router_drain_worker(r, w->id); /* may free w when nothing is in flight */
  send_json(req, 202, o);
}

static void policy_put(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_router_t *r = ((kvr_admin_t *)data)->r;
  (void)tail;
  cJSON *body = parse_body(req);
  if (body == NULL)
    return;
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(body, "policy");
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(body, "params");
  char names[256];
  kvr_policy_names(names, sizeof names);
  for (const cJSON *it = body->child; it; it = it->next) {
    if (strcmp(it->string, "policy") != 0 && strcmp(it->string, "params") != 0) {
      kvr_http_error(req, 400, NULL, "unknown_parameter",
                     "%s: unknown field (expected \"policy\" and \"params\")", it->string);
      cJSON_Delete(body);
      return;
    }
  }
  if (name != NULL && !cJSON_IsString(name)) {
    kvr_http_error(req, 400, NULL, "invalid_type", "policy: must be a string, one of: %s", names);
    cJSON_Delete(body);
    return;
  }
  if (params != NULL && !cJSON_IsObject(params) && !cJSON_IsNull(params)) {
    kvr_http_error(req, 400, NULL, "invalid_type", "%s", "params: must be an object");
    cJSON_Delete(body);
    return;
  }
  if (name == NULL && params == NULL) {
    kvr_http_error(req, 400, NULL, "missing_required_parameter", "policy: required, one of: %s",
                   names);
    cJSON_Delete(body);
    return;
  }
  const char *pname = name ? name->valuestring : kvr_policy_name(r->policy);
  char err[512];
  if (kvr_router_set_policy(r, pname, cJSON_IsObject(params) ? params : NULL, err, sizeof err) !=
      0) {
    kvr_http_error(req, 400, NULL, "invalid_value", "%s", err);
    cJSON_Delete(body);
    return;
  }
  cJSON_Delete(body);
  send_json(req, 200, kvr_router_view_policy(r));
}

/* POST /admin/route/explain: the decision the proxy would take for this body, without taking it.
 * Like the proxy, when a worker is in precise mode the prompt is first tokenized by a worker
 * (explain_t waits for it; a client that leaves cancels the call), so the explanation shows the
 * precise matches the real decision would use. Only the workers serving the body's model are
 * eligible (each worker's serves_model and models say why; for an adapter of --lora-adapter also
 * its base's workers, lora_load true where the adapter would be loaded first), adapter is where
 * the request's LoRA adapter stands on each (running, loaded, none); unknown_model says the proxy
 * would answer vLLM's 404 itself. */
typedef struct explain_s {
  kvr_admin_t *a;
  kvr_http_req_t *req;
  kvr_prompt_t prompt;
  kvr_route_req_t rr;
  uint64_t *chain;
  uint32_t bs;
  bool tokenized, sync;
  bool tokenized_prefix; /* the ids were a cached earlier turn's */
  kvr_tokenize_op_t *op;
} explain_t;

static void explain_free(explain_t *x) {
  kvr_prompt_free(&x->prompt);
  free(x->chain);
  free(x);
}

static void explain_ids(explain_t *x, const uint32_t *ids, size_t n, bool prefix) {
  uint64_t estimate = x->rr.prompt_tokens;
  free(x->chain);
  kvr_kv_salts_t salts;
  kvr_router_kv_salts(x->a->r, x->prompt.model, x->prompt.cache_salt, &salts);
  x->chain = kvr_tokenize_route_req(ids, n, x->bs, &salts, &x->rr);
  if (prefix) /* a cached prefix's ids: the prompt is longer than they are */
    x->rr.prompt_tokens = KVR_MAX(estimate, (uint64_t)n);
  x->tokenized = true;
  x->tokenized_prefix = prefix;
}

static void explain_answer(explain_t *x) {
  kvr_router_t *r = x->a->r;
  kvr_http_req_t *req = x->req;
  req->data = NULL;
  req->on_close = NULL;
  kvr_decision_t *d = kvr_xmalloc(sizeof *d);
  const char *model = x->prompt.model;
  kvr_router_avoid_t serving = {.model = model};
  int chosen = kvr_router_decide(r, &x->rr, &serving, false, d);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "policy", kvr_policy_name(r->policy));
  cJSON_AddStringToObject(o, "model", model ? model : "");
  cJSON_AddStringToObject(o, "model_label", kvr_router_model_label(r, model));
  cJSON_AddBoolToObject(o, "unknown_model", kvr_router_model_unknown(r, model));
  cJSON_AddNumberToObject(o, "prompt_chars", (double)x->prompt.text.len);
  cJSON_AddNumberToObject(o, "prompt_tokens_estimate", (double)x->prompt.prompt_tokens);
  cJSON_AddBoolToObject(o, "tokenized", x->tokenized);
  if (x->tokenized) {
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)x->rr.prompt_tokens);
    cJSON_AddBoolToObject(o, "tokenized_prefix", x->tokenized_prefix);
  }
  cJSON_AddNumberToObject(o, "blocks", (double)x->prompt.nblocks);
  cJSON_AddNumberToObject(o, "block_chars", (double)r->cfg->block_chars);
  cJSON_AddNumberToObject(o, "decision_us", d->seconds * 1e6);
  if (chosen >= 0) {
    cJSON *c = cJSON_AddObjectToObject(o, "choice");
    cJSON_AddNumberToObject(c, "worker", r->slots[chosen]->id);
    cJSON_AddStringToObject(c, "url", r->slots[chosen]->url);
    if (r->slots[chosen]->dp_rank >= 0)
      cJSON_AddNumberToObject(c, "dp_rank", r->slots[chosen]->dp_rank);
    else
      cJSON_AddNullToObject(c, "dp_rank");
  } else {
    cJSON_AddNullToObject(o, "choice");
  }
  cJSON *arr = cJSON_AddArrayToObject(o, "workers");
  for (size_t i = 0; i < d->nsnaps; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    const kvr_worker_snap_t *s = &d->snaps[i];
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "id", w->id);
    cJSON_AddStringToObject(e, "url", w->url);
    if (w->dp_rank >= 0)
      cJSON_AddNumberToObject(e, "dp_rank", w->dp_rank);
    else
      cJSON_AddNullToObject(e, "dp_rank");
    cJSON_AddStringToObject(e, "state", kvr_worker_state_name(w->state));
    cJSON_AddBoolToObject(e, "serves_model", kvr_router_worker_serves(w, model));
    static const char *const adapter[] = {"none", "loaded", "running"};
    cJSON_AddStringToObject(e, "adapter", adapter[s->adapter <= 2 ? s->adapter : 0]);
    cJSON_AddBoolToObject(e, "lora_load", kvr_router_lora_needs_load(r, w, model) != NULL);
    if (w->models_known) {
      cJSON *ids = cJSON_AddArrayToObject(e, "models");
      for (size_t k = 0; k < w->models.n; k++)
        cJSON_AddItemToArray(ids, cJSON_CreateString(w->models.v[k].id));
    } else {
      cJSON_AddNullToObject(e, "models"); /* not known: eligible for any model */
    }
    cJSON_AddStringToObject(e, "index", s->precise ? "precise" : "approximate");
    cJSON_AddNumberToObject(e, "matched_blocks", (double)s->matched_blocks);
    cJSON_AddNumberToObject(
        e, "predicted_cached_tokens",
        (double)kvr_router_predicted_cached(r, s->matched_blocks, x->rr.prompt_tokens));
    cJSON_AddNumberToObject(e, "in_flight", s->inflight);
    cJSON_AddNumberToObject(e, "active_tokens", (double)s->active_tokens);
    cJSON_AddNumberToObject(e, "queued_prefill_tokens", (double)s->queued_prefill_tokens);
    cJSON_AddNumberToObject(e, "prefill_backlog_tokens", (double)s->prefill_backlog_tokens);
    cJSON_AddNumberToObject(e, "open_sessions", s->open_sessions);
    cJSON_AddBoolToObject(e, "metrics_fresh", s->metrics_fresh);
    cJSON_AddNumberToObject(e, "num_requests_running", s->num_requests_running);
    cJSON_AddNumberToObject(e, "num_requests_waiting", s->num_requests_waiting);
    cJSON_AddNumberToObject(e, "kv_cache_usage_perc", s->kv_cache_usage);
    cJSON_AddBoolToObject(e, "eligible", d->scores[i].eligible);
    cJSON_AddBoolToObject(e, "capped", d->scores[i].capped);
    cJSON_AddNumberToObject(e, "cost", d->scores[i].cost);
    cJSON_AddBoolToObject(e, "chosen", (int)i == chosen);
    cJSON_AddItemToArray(arr, e);
  }
  free(d);
  explain_free(x);
  send_json(req, 200, o);
}

static void on_explain_tokenized(void *data, bool ok, const uint32_t *ids, size_t n, bool prefix) {
  explain_t *x = data;
  if (ok)
    explain_ids(x, ids, n, prefix);
  if (x->sync)
    return;
  x->op = NULL;
  explain_answer(x);
}

static void on_explain_close(kvr_http_req_t *req) {
  explain_t *x = req->data;
  if (x == NULL)
    return;
  kvr_tokenize_cancel(x->op);
  req->data = NULL;
  explain_free(x);
  kvr_http_finish(req);
}

static void explain(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  kvr_router_t *r = a->r;
  (void)tail;
  /* Which endpoint the body is for: ?endpoint=completions, else by the presence of "prompt". */
  kvr_route_t route = KVR_ROUTE_CHAT;
  if (strstr(req->query, "endpoint=completions"))
    route = KVR_ROUTE_COMPLETIONS;
  else if (req->body.len && memmem(req->body.data, req->body.len, "\"prompt\"", 8) &&
           !memmem(req->body.data, req->body.len, "\"messages\"", 10))
    route = KVR_ROUTE_COMPLETIONS;
  explain_t *x = kvr_xcalloc(1, sizeof *x);
  x->a = a;
  x->req = req;
  char err[256];
  const char *code = NULL;
  if (kvr_openai_features(req->body.data, req->body.len, route, r->cfg->block_chars, &x->prompt,
                          err, sizeof err, &code) != 0) {
    free(x);
    kvr_http_error(req, 400, "invalid_request_error", code, "%s", err);
    return;
  }
  kvr_prompt_route_req(&x->prompt, &x->rr);
  const char *url = NULL;
  x->bs = kvr_router_kv_tokenizer(r, x->prompt.model, &url);
  if (x->bs) {
    kvr_buf_t body = KVR_BUF_INIT;
    uint32_t *ids = NULL;
    size_t n = 0;
    kvr_tokenize_prefixes_t pre;
    int k = kvr_tokenize_body(req->body.data, req->body.len, route, &body, &ids, &n, &pre);
    if (k == 0)
      explain_ids(x, ids, n, false);
    free(ids);
    if (k == 1) {
      req->data = x;
      req->on_close = on_explain_close;
      x->sync = true;
      x->op = kvr_tokenize(a->tokenizer, url, &body, &pre, on_explain_tokenized, x);
      x->sync = false;
    }
    kvr_tokenize_prefixes_free(&pre);
    kvr_buf_free(&body);
    if (x->op)
      return; /* answered when the ids arrive */
  }
  explain_answer(x);
}

/* ---- POST /admin/reset_prefix_cache -----------------------------------------------------------
 */

#define RESET_TIMEOUT_MS 10000L
#define RESET_MAX_BODY 512

typedef struct reset_op_s reset_op_t;

typedef struct reset_call_s {
  reset_op_t *op;
  CURL *easy;
  uint32_t worker_id;
  char url[600];
  kvr_worker_state_t state; /* when the reset started */
  kvr_buf_t body;           /* the worker's answer, first RESET_MAX_BODY bytes */
  long status;              /* HTTP status, 0 when none arrived */
  CURLcode result;
  uint64_t forgotten; /* index entries forgotten after a 2xx */
  int lead;           /* a data-parallel rank's: the call index of its URL's one POST, else -1 */
} reset_call_t;

struct reset_op_s {
  kvr_router_t *r;
  kvr_http_req_t *req;
  size_t ncalls, pending;
  reset_call_t calls[]; /* one per worker at the start: r->nslots of them allocated */
};

static size_t on_reset_body(char *data, size_t size, size_t n, void *ud) {
  reset_call_t *c = ud;
  size_t len = size * n;
  if (c->body.len < RESET_MAX_BODY)
    kvr_buf_append(&c->body, data, KVR_MIN(len, RESET_MAX_BODY - c->body.len));
  return len;
}

static void reset_reply(reset_op_t *op) {
  cJSON *o = cJSON_CreateObject();
  cJSON *arr = cJSON_AddArrayToObject(o, "workers");
  size_t ok = 0;
  for (size_t i = 0; i < op->ncalls; i++) {
    reset_call_t *c = &op->calls[i];
    bool good = c->result == CURLE_OK && c->status >= 200 && c->status <= 299;
    ok += good;
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "id", c->worker_id);
    cJSON_AddStringToObject(x, "url", c->url);
    cJSON_AddStringToObject(x, "state", kvr_worker_state_name(c->state));
    cJSON_AddBoolToObject(x, "ok", good);
    if (c->status > 0)
      cJSON_AddNumberToObject(x, "status", (double)c->status);
    else
      cJSON_AddNullToObject(x, "status");
    if (good) {
      cJSON_AddNullToObject(x, "error");
    } else {
      kvr_buf_t e = KVR_BUF_INIT;
      if (c->result != CURLE_OK)
        kvr_buf_puts(&e, curl_easy_strerror(c->result));
      else
        kvr_buf_printf(&e, "HTTP %ld: %.*s", c->status, (int)c->body.len,
                       c->body.data ? c->body.data : "");
      cJSON_AddStringToObject(x, "error", e.data ? e.data : "");
      kvr_buf_free(&e);
    }
    cJSON_AddNumberToObject(x, "index_blocks_forgotten", (double)c->forgotten);
    cJSON_AddItemToArray(arr, x);
    if (c->easy)
      curl_easy_cleanup(c->easy);
    kvr_buf_free(&c->body);
  }
  cJSON_AddNumberToObject(o, "reset", (double)ok);
  cJSON_AddNumberToObject(o, "failed", (double)(op->ncalls - ok));
  KVR_INFO("admin", "prefix cache reset: %zu of %zu workers reset", ok, op->ncalls);
  send_json(op->req, 200, o);
  free(op);
}

static void on_reset_done(CURL *easy, CURLcode result, void *data) {
  reset_call_t *c = data;
  reset_op_t *op = c->op;
  c->result = result;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &c->status);
  if (result == CURLE_OK && c->status >= 200 && c->status <= 299) {
    kvr_router_forget_cache(op->r, c->worker_id, &c->forgotten);
  }
  /* The other ranks of the URL: vLLM's reset reaches every engine of the server (its
   * core_client.py), so they share this answer and forget their index entries with it. */
  for (size_t i = 0; i < op->ncalls; i++) {
    reset_call_t *rank = &op->calls[i];
    if (rank->lead < 0 || &op->calls[rank->lead] != c)
      continue;
    rank->result = result;
    rank->status = c->status;
    kvr_buf_append(&rank->body, c->body.data ? c->body.data : "", c->body.len);
    if (result == CURLE_OK && c->status >= 200 && c->status <= 299)
      kvr_router_forget_cache(op->r, rank->worker_id, &rank->forgotten);
  }
  if (--op->pending == 0)
    reset_reply(op);
}

/* The call index of an earlier data-parallel rank of w's URL among calls[0..n), or -1. */
static int reset_lead(const reset_call_t *calls, size_t n, const kvr_router_t *r,
                      const kvr_worker_t *w) {
  if (w->dp_rank < 0)
    return -1;
  for (size_t i = 0; i < n; i++) {
    const kvr_worker_t *o = kvr_router_worker_by_id(r, calls[i].worker_id);
    if (calls[i].lead < 0 && o && o->dp_rank >= 0 && strcmp(calls[i].url, w->url) == 0)
      return (int)i;
  }
  return -1;
}

static void reset_prefix_cache(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  kvr_router_t *r = a->r;
  (void)tail;
  reset_op_t *op = kvr_xcalloc(1, sizeof *op + r->nslots * sizeof op->calls[0]);
  op->r = r;
  op->req = req;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    reset_call_t *c = &op->calls[op->ncalls++];
    c->op = op;
    c->worker_id = w->id;
    c->state = w->state;
    snprintf(c->url, sizeof c->url, "%s", w->url);
    c->lead = reset_lead(op->calls, op->ncalls - 1, r, w);
    if (c->lead >= 0)
      continue; /* one POST per server: its first rank's */
    char url[640];
    snprintf(url, sizeof url, "%s/reset_prefix_cache", w->url);
    c->easy = kvr_curl_easy_new(url, (long)r->cfg->connect_timeout_ms, RESET_TIMEOUT_MS,
                                on_reset_body, c);
    curl_easy_setopt(c->easy, CURLOPT_POST, 1L);
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE, 0L);
    op->pending++;
    if (kvr_curlm_add(a->curlm, c->easy, on_reset_done, c) != 0) {
      op->pending--;
      c->result = CURLE_FAILED_INIT;
    }
  }
  /* kvr_curlm_add never completes a transfer synchronously, so no call has finished yet. */
  if (op->pending == 0)
    reset_reply(op);
}

/* ---- routes -----------------------------------------------------------------------------------
 */

/* GET /metrics is assembled from one renderer per module that owns counters: the router's state
 * (core/router_view.c), then the modules of this process that keep their own (reload, discovery).
 */
typedef void (*metrics_renderer_fn)(const kvr_admin_t *a, kvr_buf_t *out);

static void render_router(const kvr_admin_t *a, kvr_buf_t *out) {
  kvr_router_view_metrics(a->r, out);
}
static void render_reload(const kvr_admin_t *a, kvr_buf_t *out) {
  kvr_reload_metrics(out);
}
static void render_discovery(const kvr_admin_t *a, kvr_buf_t *out) {
  kvr_discovery_metrics(out);
}
static void render_listeners(const kvr_admin_t *a, kvr_buf_t *out) {
  kvr_metric_family(out, "kvrouter_connections_refused_total", "counter",
                    "Client connections refused: by the connection limit (answered 503), or by "
                    "the operating system (accept failed: EMFILE, ENFILE)");
  kvr_metric_sample(out, "kvrouter_connections_refused_total", "reason=\"limit\"",
                    (double)kvr_http_refused_total(true));
  kvr_metric_sample(out, "kvrouter_connections_refused_total", "reason=\"accept\"",
                    (double)kvr_http_refused_total(false));
}

static void render_trace(const kvr_admin_t *a, kvr_buf_t *out) {
  if (a->trace == NULL)
    return;
  kvr_metric_family(out, "kvrouter_trace_lines_total", "counter",
                    "Requests written to the --trace-out file (completed 2xx answers)");
  kvr_metric_sample(out, "kvrouter_trace_lines_total", NULL, (double)kvr_trace_out_lines(a->trace));
  kvr_metric_family(out, "kvrouter_trace_write_errors_total", "counter",
                    "Trace lines lost because the file could not be written");
  kvr_metric_sample(out, "kvrouter_trace_write_errors_total", NULL,
                    (double)kvr_trace_out_errors(a->trace));
}

static void render_proxy(const kvr_admin_t *a, kvr_buf_t *out) {
  if (a->proxy)
    kvr_proxy_metrics(a->proxy, out);
}

static const metrics_renderer_fn metrics_renderers[] = {
    render_router, render_reload, render_discovery, render_listeners, render_trace, render_proxy};

static void metrics_get(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  (void)tail;
  kvr_buf_t b = KVR_BUF_INIT;
  for (size_t i = 0; i < KVR_ARRAY_SIZE(metrics_renderers); i++)
    metrics_renderers[i](a, &b);
  kvr_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

static void health_get(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  (void)tail;
  bool ok = kvr_router_has_usable(a->r);
  const char *body = ok ? "{\"status\":\"ok\"}\n" : "{\"status\":\"unavailable\"}\n";
  kvr_http_respond(req, ok ? 200 : 503, "application/json", NULL, body, strlen(body));
}

static void workers_get(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  (void)tail;
  cJSON *o = cJSON_CreateObject();
  cJSON_AddItemToObject(o, "workers", kvr_router_view_workers(a->r));
  cJSON_AddItemToObject(o, "cache_index", kvr_router_view_cache_index(a->r));
  send_json(req, 200, o);
}

/* GET /admin/load: this replica's own load per worker (no peer figures in it), what its peers
 * add to their view (peers.h). Workers are keyed by URL: ids differ between replicas. */
static void load_get(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  (void)tail;
  send_json(req, 200, kvr_router_view_load(a->r));
}

static void policy_get(kvr_http_req_t *req, void *data, const char *tail) {
  kvr_admin_t *a = data;
  (void)tail;
  send_json(req, 200, kvr_router_view_policy(a->r));
}

/* The admin routes (admin.h); a known path with another method is a 405 with Allow. */
static const kvr_http_route_t routes[] = {
    {"/metrics", KVR_HTTP_M(GET), metrics_get},
    {"/health", KVR_HTTP_M(GET), health_get},
    {"/admin/workers", KVR_HTTP_M(GET), workers_get},
    {"/admin/load", KVR_HTTP_M(GET), load_get},
    {"/admin/workers", KVR_HTTP_M(POST), workers_post},
    {"/admin/workers/*", KVR_HTTP_M(DELETE), workers_delete},
    {"/admin/policy", KVR_HTTP_M(GET), policy_get},
    {"/admin/policy", KVR_HTTP_M(PUT), policy_put},
    {"/admin/route/explain", KVR_HTTP_M(POST), explain},
    {"/admin/reset_prefix_cache", KVR_HTTP_M(POST), reset_prefix_cache},
};

/* ---- authentication ---------------------------------------------------------------------------
 */

/* Compares the presented token with the configured one in time that depends only on their
 * lengths' maximum, not on where they first differ. */
static bool token_equal(const char *given, size_t glen, const char *want) {
  size_t wlen = strlen(want);
  size_t n = glen > wlen ? glen : wlen;
  unsigned diff = (unsigned)(glen ^ wlen) | (glen == 0);
  for (size_t i = 0; i < n; i++) {
    unsigned char a = i < glen ? (unsigned char)given[i] : 0;
    unsigned char b = i < wlen ? (unsigned char)want[i] : 0;
    diff |= (unsigned)(a ^ b);
  }
  return diff == 0;
}

/* True if the request carries "Authorization: Bearer <token>" with the configured token. */
static bool authorized(const kvr_http_req_t *req, const char *token) {
  const char *v = kvr_http_header(req, "authorization");
  if (v == NULL)
    return false;
  while (*v == ' ' || *v == '\t')
    v++;
  if (strncasecmp(v, "bearer", 6) != 0 || (v[6] != ' ' && v[6] != '\t'))
    return false;
  v += 6;
  while (*v == ' ' || *v == '\t')
    v++;
  size_t n = strlen(v);
  while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
    n--;
  return token_equal(v, n, token);
}

/* Paths that stay open for probes whatever the token. */
static bool probe_path(const char *path) {
  return strcmp(path, "/health") == 0;
}

void kvr_admin_on_request(kvr_http_req_t *req, void *data) {
  kvr_admin_t *a = data;
  const kvr_config_t *cfg = a->r->cfg;
  if (kvr_dashboard_owns(req->path)) { /* static page, no data: it asks for the token itself */
    kvr_dashboard_on_request(req);
    return;
  }
  if (cfg->admin_token != NULL && !probe_path(req->path)) {
    bool read = req->method == HTTP_GET || req->method == HTTP_HEAD;
    if (!(read && cfg->admin_open_reads) && !authorized(req, cfg->admin_token)) {
      KVR_WARN("admin", "unauthorized %s %s from %s: %s", req->method_str, req->path, req->peer,
               kvr_http_header(req, "authorization") ? "wrong token" : "no token");
      kvr_http_error_h(req, 401, "WWW-Authenticate: Bearer realm=\"kvrouter-admin\"\r\n",
                       "authentication_error", "invalid_api_key", "%s",
                       "the admin API needs 'Authorization: Bearer TOKEN' with the token of "
                       "--admin-token-file");
      return;
    }
  }
  kvr_http_route_dispatch(routes, KVR_ARRAY_SIZE(routes), req, data, KVR_HTTP_DIALECT_OPENAI);
}

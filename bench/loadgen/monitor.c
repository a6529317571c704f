/* monitor.c -- prefix-cache resets and engine counters for `kvrouter bench` (see monitor.h).
 *
 * Structs:
 *   kvr_monitor_t  its curl multi, the poll timer, the targets of the current level, the list of
 *                  live calls.
 *   target_t       one worker: base URL, counters read at the level's start, the last value read,
 *                  the peak KV usage, and its poll in flight (at most one).
 *   call_t         one HTTP transfer: its easy handle, the collected body (bounded), status and
 *                  result. A sync call belongs to the synchronous operation that started it, which
 *                  reads and frees it; a poll call is parsed and freed by its done callback.
 *
 * Flow of a synchronous operation: start its calls (sync_pending counts them), run the loop until
 * the last one is done (its callback calls uv_stop), read the results, free the calls. Polls that
 * are still in flight when a level ends are cancelled first, so the end figures come from one read
 * of every target taken after the load stopped.
 *
 * Invariants: every call_t is in m->calls until freed; kvr_curlm_cancel() is only used outside
 * curl's callbacks; a target's poll pointer is cleared when its call ends or is cancelled.
 */
#include "monitor.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/list.h"
#include "base/metrics.h"
#include "net/curlm.h"
#include "proto/vllm.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MON_MAX_TARGETS 64
#define MON_TIMEOUT_MS 5000L
#define MON_RESET_TIMEOUT_MS 20000L /* the router waits up to 10 s per worker */
#define MON_METRICS_MAX ((size_t)4 << 20)
#define MON_JSON_MAX ((size_t)1 << 20)

typedef struct call_s call_t;

typedef struct target_s {
  char url[512]; /* base URL, no trailing slash */
  bool have_begin, have_last;
  double preempt_begin, preempt_last;
  bool kv_seen;
  double kv_peak;
  call_t *poll;
} target_t;

struct call_s {
  kvr_monitor_t *m;
  CURL *easy;
  kvr_list_t node; /* in m->calls until freed */
  int target;      /* poll calls: index in m->targets; -1 otherwise */
  bool sync;
  bool done;
  kvr_buf_t body;
  struct curl_slist *headers; /* calls with a JSON body */
  size_t max;
  long status;
  CURLcode result;
};

struct kvr_monitor_s {
  uv_loop_t *loop;
  kvr_curlm_t *curlm;
  char *admin; /* admin base URL or NULL */
  char *url;   /* the benchmarked endpoint */
  char *base;  /* the endpoint's scheme://host:port */
  uint64_t poll_ms;
  uv_timer_t poll;
  target_t targets[MON_MAX_TARGETS];
  size_t ntargets;
  kvr_list_t calls; /* live calls (call_t.node), newest first */
  size_t sync_pending;
  bool in_sync;
  /* the router's cached-token counters at the level's start (admin /metrics) */
  bool router_have_begin;
  double router_pred_begin, router_rep_begin;
};

/* ---- calls ----------------------------------------------------------------------------------- */

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  call_t *c = ud;
  size_t len = size * n;
  if (c->body.len + len > c->max)
    return 0; /* too large: curl ends the transfer with an error */
  kvr_buf_append(&c->body, data, len);
  return len;
}

static void call_free(call_t *c) {
  kvr_list_remove(&c->node);
  curl_easy_cleanup(c->easy);
  curl_slist_free_all(c->headers);
  kvr_buf_free(&c->body);
  free(c);
}

static bool page_read(target_t *t, const call_t *c);

static void on_call_done(CURL *easy, CURLcode result, void *data) {
  call_t *c = data;
  kvr_monitor_t *m = c->m;
  c->result = result;
  c->done = true;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &c->status);
  if (c->sync) {
    if (--m->sync_pending == 0 && m->in_sync)
      uv_stop(m->loop);
    return;
  }
  target_t *t = &m->targets[c->target];
  t->poll = NULL;
  page_read(t, c);
  call_free(c);
}

/* Starts a transfer of method on url with an optional JSON body (copied); returns the call or NULL
 * when curl refused it. */
static call_t *call_start(kvr_monitor_t *m, const char *method, const char *url, const char *json,
                          bool sync, int target, size_t max, long timeout_ms) {
  call_t *c = kvr_xcalloc(1, sizeof(*c));
  c->m = m;
  c->target = target;
  c->sync = sync;
  c->max = max;
  c->easy = kvr_curl_easy_new(url, 2000L, timeout_ms, on_body, c);
  /* Targets follow the benchmarked endpoint, which may be a TLS one. */
  curl_easy_setopt(c->easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (strcmp(method, "GET") != 0) {
    curl_easy_setopt(c->easy, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE, json ? (long)strlen(json) : 0L);
    curl_easy_setopt(c->easy, CURLOPT_COPYPOSTFIELDS, json ? json : "");
  }
  if (json) {
    c->headers = kvr_curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER, c->headers);
  }
  kvr_list_insert_head(&m->calls, &c->node);
  if (kvr_curlm_add(m->curlm, c->easy, on_call_done, c) != 0) {
    call_free(c);
    return NULL;
  }
  if (sync)
    m->sync_pending++;
  return c;
}

/* Runs the loop until every sync call has finished. */
static void run_sync(kvr_monitor_t *m) {
  m->in_sync = true;
  while (m->sync_pending > 0)
    uv_run(m->loop, UV_RUN_DEFAULT);
  m->in_sync = false;
}

static bool call_ok(const call_t *c) {
  return c && c->result == CURLE_OK && c->status >= 200 && c->status <= 299;
}

/* One line describing a failed call: transport error or "HTTP 404: body". */
static void call_error(const call_t *c, char *buf, size_t size) {
  if (c == NULL)
    snprintf(buf, size, "curl refused the transfer");
  else if (c->result != CURLE_OK)
    snprintf(buf, size, "%s", curl_easy_strerror(c->result));
  else
    snprintf(buf, size, "HTTP %ld: %.120s", c->status, c->body.data ? c->body.data : "");
  for (char *p = buf; *p; p++)
    if (*p == '\n' || *p == '\r')
      *p = ' ';
}

/* Writes "METHOD URL: reason" of a failed call into err; returns KVR_EIO (transport) or
 * KVR_EUPSTREAM (an HTTP error status). */
static int call_failed(const call_t *c, const char *method, const char *url, char *err,
                       size_t errlen) {
  char why[200];
  call_error(c, why, sizeof(why));
  snprintf(err, errlen, "%s %s: %s", method, url, why);
  return c && c->result == CURLE_OK ? KVR_EUPSTREAM : KVR_EIO;
}

/* ---- lifetime -------------------------------------------------------------------------------- */

/* "http://h:p/v1/chat/completions" -> "http://h:p"; NULL when there is no scheme. */
static char *base_of(const char *url) {
  const char *s = strstr(url, "://");
  if (s == NULL)
    return NULL;
  const char *slash = strchr(s + 3, '/');
  size_t n = slash ? (size_t)(slash - url) : strlen(url);
  char *b = kvr_xmalloc(n + 1);
  memcpy(b, url, n);
  b[n] = '\0';
  return b;
}

static char *trim_slash(const char *url) {
  char *b = kvr_xstrdup(url);
  size_t n = strlen(b);
  while (n > 0 && b[n - 1] == '/')
    b[--n] = '\0';
  return b;
}

kvr_monitor_t *kvr_monitor_new(uv_loop_t *loop, const char *admin_url, const char *url,
                               uint64_t poll_ms) {
  char *base = url ? base_of(url) : NULL;
  if (base == NULL)
    return NULL;
  kvr_monitor_t *m = kvr_xcalloc(1, sizeof(*m));
  m->loop = loop;
  kvr_list_init(&m->calls);
  m->base = base;
  m->url = trim_slash(url);
  m->admin = admin_url ? trim_slash(admin_url) : NULL;
  m->poll_ms = KVR_MAX(poll_ms, (uint64_t)50);
  m->curlm = kvr_curlm_new(loop);
  if (m->curlm == NULL) {
    free(m->base);
    free(m->url);
    free(m->admin);
    free(m);
    return NULL;
  }
  uv_timer_init(loop, &m->poll);
  m->poll.data = m;
  return m;
}

static void on_poll_closed(uv_handle_t *h) {
  kvr_monitor_t *m = h->data;
  free(m->base);
  free(m->url);
  free(m->admin);
  free(m);
}

void kvr_monitor_free(kvr_monitor_t *m) {
  if (m == NULL)
    return;
  uv_timer_stop(&m->poll);
  while (!kvr_list_empty(&m->calls)) {
    call_t *c = KVR_CONTAINER_OF(m->calls.next, call_t, node);
    kvr_curlm_cancel(m->curlm, c->easy);
    call_free(c);
  }
  kvr_curlm_close(m->curlm);
  uv_close((uv_handle_t *)&m->poll, on_poll_closed);
}

/* ---- Prometheus text ------------------------------------------------------------------------- */

size_t kvr_monitor_prom_value(const char *text, size_t len, const char *name, double *sum,
                              double *max) {
  size_t found = 0;
  double s = 0, mx = -INFINITY;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      eol = end;
    double v;
    if (kvr_metric_line_is(p, eol, name) && kvr_metric_line_value(p, eol, &v) == 0 && isfinite(v)) {
      s += v;
      mx = fmax(mx, v);
      found++;
    }
    p = eol + 1;
  }
  if (found) {
    *sum = s;
    *max = mx;
  }
  return found;
}

/* Records one /metrics page of target t: the preemption counter and the KV usage peak. Returns
 * whether the page carried the preemption counter. */
static bool page_read(target_t *t, const call_t *c) {
  if (!call_ok(c) || c->body.data == NULL)
    return false;
  double sum, max;
  if (kvr_monitor_prom_value(c->body.data, c->body.len, "vllm:kv_cache_usage_perc", &sum, &max) ||
      kvr_monitor_prom_value(c->body.data, c->body.len, "vllm:gpu_cache_usage_perc", &sum, &max)) {
    t->kv_peak = t->kv_seen ? fmax(t->kv_peak, max) : max;
    t->kv_seen = true;
  }
  if (kvr_monitor_prom_value(c->body.data, c->body.len, "vllm:num_preemptions_total", &sum, &max) ==
      0)
    return false;
  t->preempt_last = sum;
  t->have_last = true;
  return true;
}

static void metrics_url(const target_t *t, char *buf, size_t size) {
  snprintf(buf, size, "%s/metrics", t->url);
}

static void on_poll_timer(uv_timer_t *timer) {
  kvr_monitor_t *m = timer->data;
  char url[600];
  for (size_t i = 0; i < m->ntargets; i++) {
    target_t *t = &m->targets[i];
    if (t->poll)
      continue;
    metrics_url(t, url, sizeof(url));
    t->poll = call_start(m, "GET", url, NULL, false, (int)i, MON_METRICS_MAX, MON_TIMEOUT_MS);
  }
}

static void cancel_polls(kvr_monitor_t *m) {
  uv_timer_stop(&m->poll);
  for (size_t i = 0; i < m->ntargets; i++) {
    target_t *t = &m->targets[i];
    if (t->poll) {
      kvr_curlm_cancel(m->curlm, t->poll->easy);
      call_free(t->poll);
      t->poll = NULL;
    }
  }
}

/* Reads every target's /metrics once, synchronously. */
static void read_all(kvr_monitor_t *m, bool begin) {
  call_t *calls[MON_MAX_TARGETS] = {0};
  char url[600];
  for (size_t i = 0; i < m->ntargets; i++) {
    metrics_url(&m->targets[i], url, sizeof(url));
    calls[i] = call_start(m, "GET", url, NULL, true, -1, MON_METRICS_MAX, MON_TIMEOUT_MS);
  }
  run_sync(m);
  for (size_t i = 0; i < m->ntargets; i++) {
    target_t *t = &m->targets[i];
    if (begin) {
      t->have_last = t->kv_seen = false;
      t->have_begin = page_read(t, calls[i]);
      t->preempt_begin = t->preempt_last;
    } else if (!page_read(t, calls[i])) {
      t->have_last = false; /* no end figure: this worker is left out */
    }
    if (calls[i])
      call_free(calls[i]);
  }
}

/* The targets of a level: the router's workers, or the endpoint's own server. */
static void find_targets(kvr_monitor_t *m) {
  m->ntargets = 0;
  if (m->admin == NULL) {
    snprintf(m->targets[0].url, sizeof(m->targets[0].url), "%s", m->base);
    m->ntargets = 1;
    return;
  }
  char url[600];
  snprintf(url, sizeof(url), "%s/admin/workers", m->admin);
  call_t *c = call_start(m, "GET", url, NULL, true, -1, MON_JSON_MAX, MON_TIMEOUT_MS);
  run_sync(m);
  cJSON *j = call_ok(c) ? cJSON_ParseWithLength(c->body.data, c->body.len) : NULL;
  const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "workers");
  const cJSON *w;
  cJSON_ArrayForEach(w, ws) {
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(w, "url");
    if (!cJSON_IsString(u) || m->ntargets == MON_MAX_TARGETS)
      continue;
    target_t *t = &m->targets[m->ntargets++];
    memset(t, 0, sizeof(*t));
    snprintf(t->url, sizeof(t->url), "%s", u->valuestring);
  }
  cJSON_Delete(j);
  if (c)
    call_free(c);
}

/* The router's predicted and reported cached prompt tokens, summed over its workers, from its
 * admin /metrics (kvrouter_worker_usage_*); false without an admin URL or an answer. */
static bool router_cached(kvr_monitor_t *m, double *pred, double *rep) {
  if (m->admin == NULL)
    return false;
  char url[600];
  snprintf(url, sizeof(url), "%s/metrics", m->admin);
  call_t *c = call_start(m, "GET", url, NULL, true, -1, MON_METRICS_MAX, MON_TIMEOUT_MS);
  run_sync(m);
  double max;
  bool ok = call_ok(c) && c->body.data &&
            kvr_monitor_prom_value(c->body.data, c->body.len,
                                   "kvrouter_worker_usage_predicted_cached_tokens_total", pred,
                                   &max) > 0 &&
            kvr_monitor_prom_value(c->body.data, c->body.len,
                                   "kvrouter_worker_usage_cached_tokens_total", rep, &max) > 0;
  if (c)
    call_free(c);
  return ok;
}

void kvr_monitor_level_begin(kvr_monitor_t *m) {
  cancel_polls(m);
  find_targets(m);
  m->router_have_begin = router_cached(m, &m->router_pred_begin, &m->router_rep_begin);
  read_all(m, true);
  uv_timer_start(&m->poll, on_poll_timer, m->poll_ms, m->poll_ms);
}

void kvr_monitor_level_end(kvr_monitor_t *m, kvr_level_t *lv) {
  cancel_polls(m);
  if (lv == NULL)
    return;
  read_all(m, false);
  double pred, rep;
  lv->router_cached_seen = false;
  if (m->router_have_begin && router_cached(m, &pred, &rep) && pred >= m->router_pred_begin &&
      rep >= m->router_rep_begin) { /* a router restarted meanwhile: unknown */
    lv->router_cached_seen = true;
    lv->router_predicted_cached = (uint64_t)llround(pred - m->router_pred_begin);
    lv->router_reported_cached = (uint64_t)llround(rep - m->router_rep_begin);
  }
  lv->engine_workers = 0;
  lv->preemptions = 0;
  lv->kv_usage_peak = 0;
  for (size_t i = 0; i < m->ntargets; i++) {
    const target_t *t = &m->targets[i];
    if (t->kv_seen)
      lv->kv_usage_peak = fmax(lv->kv_usage_peak, t->kv_peak);
    if (!t->have_begin || !t->have_last)
      continue;
    lv->engine_workers++;
    /* A counter that went down means the worker restarted: all of its count is new. */
    double d =
        t->preempt_last >= t->preempt_begin ? t->preempt_last - t->preempt_begin : t->preempt_last;
    lv->preemptions += (uint64_t)llround(d);
  }
}

/* ---- reset ----------------------------------------------------------------------------------- */

static int reset_summary_admin(const call_t *c, char *summary, size_t size) {
  cJSON *j = cJSON_ParseWithLength(c->body.data ? c->body.data : "", c->body.len);
  const cJSON *ws = cJSON_GetObjectItemCaseSensitive(j, "workers");
  if (!cJSON_IsArray(ws)) {
    cJSON_Delete(j);
    snprintf(summary, size, "router answered without a workers list");
    return KVR_EUPSTREAM;
  }
  int total = cJSON_GetArraySize(ws), ok = 0;
  kvr_buf_t fails = KVR_BUF_INIT;
  const cJSON *w;
  cJSON_ArrayForEach(w, ws) {
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(w, "ok"))) {
      ok++;
      continue;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(w, "id");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(w, "error");
    kvr_buf_printf(&fails, "; worker %d: %.80s", cJSON_IsNumber(id) ? id->valueint : -1,
                   cJSON_IsString(err) ? err->valuestring : "failed");
  }
  snprintf(summary, size, "%d/%d workers reset and the router's cache index cleared%s", ok, total,
           fails.data ? fails.data : "");
  for (char *p = summary; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '|')
      *p = ' ';
  kvr_buf_free(&fails);
  cJSON_Delete(j);
  return ok == total ? 0 : KVR_EUPSTREAM;
}

int kvr_monitor_reset_cache(kvr_monitor_t *m, char *summary, size_t size) {
  char url[600];
  cancel_polls(m);
  snprintf(url, sizeof(url), "%s%s", m->admin ? m->admin : m->base,
           m->admin ? "/admin/reset_prefix_cache" : "/reset_prefix_cache");
  call_t *c = call_start(m, "POST", url, NULL, true, -1, MON_JSON_MAX, MON_RESET_TIMEOUT_MS);
  run_sync(m);
  int rc;
  if (!call_ok(c)) {
    char why[400];
    rc = call_failed(c, "POST", url, why, sizeof(why));
    snprintf(summary, size, "failed: %s", why);
    for (char *p = summary; *p; p++)
      if (*p == '|')
        *p = ' ';
  } else if (m->admin) {
    rc = reset_summary_admin(c, summary, size);
  } else {
    snprintf(summary, size, "worker reset (POST %s: HTTP %ld)", url, c->status);
    rc = 0;
  }
  if (c)
    call_free(c);
  return rc;
}

/* ---- policy and model ------------------------------------------------------------------------ */

int kvr_monitor_set_policy(kvr_monitor_t *m, const char *policy, const char *params, char *err,
                           size_t errlen) {
  if (m->admin == NULL) {
    snprintf(err, errlen, "no admin URL to switch the policy through");
    return KVR_EINVAL;
  }
  char url[600];
  snprintf(url, sizeof(url), "%s/admin/policy", m->admin);
  kvr_buf_t body = KVR_BUF_INIT;
  kvr_buf_puts(&body, "{\"policy\":");
  kvr_buf_json_str(&body, policy, strlen(policy));
  if (params != NULL) {
    kvr_buf_puts(&body, ",\"params\":");
    kvr_buf_puts(&body, params);
  }
  kvr_buf_puts(&body, "}");
  call_t *c = call_start(m, "PUT", url, body.data, true, -1, MON_JSON_MAX, MON_TIMEOUT_MS);
  kvr_buf_free(&body);
  run_sync(m);
  int rc = call_ok(c) ? 0 : call_failed(c, "PUT", url, err, errlen);
  if (c)
    call_free(c);
  return rc;
}

/* GET /v1/models at the benchmarked endpoint's /v1 root, run to its end; url gets its URL. */
static call_t *get_models(kvr_monitor_t *m, char url[600]) {
  const char *v1 = strstr(m->url, "/v1/");
  int root = v1 ? (int)(v1 - m->url) : (int)strlen(m->base);
  snprintf(url, 600, "%.*s/v1/models", root, m->url);
  call_t *c = call_start(m, "GET", url, NULL, true, -1, MON_JSON_MAX, MON_TIMEOUT_MS);
  run_sync(m);
  return c;
}

int kvr_monitor_fetch_max_model_len(kvr_monitor_t *m, uint64_t *max_model_len, char *err,
                                    size_t errlen) {
  char url[600];
  call_t *c = get_models(m, url);
  int rc;
  if (!call_ok(c)) {
    rc = call_failed(c, "GET", url, err, errlen);
  } else {
    rc = kvr_vllm_parse_models(c->body.data ? c->body.data : "", c->body.len, max_model_len);
    if (rc != 0)
      snprintf(err, errlen, "GET %s: no max_model_len in the answer", url);
  }
  if (c)
    call_free(c);
  return rc;
}

int kvr_monitor_fetch_model(kvr_monitor_t *m, char *model, size_t size, char *err, size_t errlen) {
  /* The models list lives at the same /v1 root as the benchmarked endpoint. */
  char url[600];
  call_t *c = get_models(m, url);
  int rc;
  if (!call_ok(c)) {
    rc = call_failed(c, "GET", url, err, errlen);
  } else {
    cJSON *j = cJSON_ParseWithLength(c->body.data ? c->body.data : "", c->body.len);
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(j, "data");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(data, 0), "id");
    if (cJSON_IsArray(data) && cJSON_IsString(id) && strlen(id->valuestring) < size) {
      snprintf(model, size, "%s", id->valuestring);
      rc = 0;
    } else {
      snprintf(err, errlen, "GET %s: no data[0].id in the answer", url);
      rc = KVR_EPARSE;
    }
    cJSON_Delete(j);
  }
  if (c)
    call_free(c);
  return rc;
}

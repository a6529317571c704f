/* scrape.c -- periodic GET /metrics of every worker, on serve's loop and curl multi (scrape.h).
 *
 * Every scrape_interval_ms the timer starts one probe per worker that has none in flight. A probe
 * is a libcurl GET of URL/metrics whose body is collected (bounded at 4 MiB) and parsed for the
 * series the policies read: vllm:num_requests_running, vllm:num_requests_waiting,
 * vllm:kv_cache_usage_perc (0..1), vllm:cache_config_info{block_size=..., num_gpu_blocks=...}
 * Samples of one name are summed across label sets (several engines behind one server).
 *
 * The probe doubles as the health check: a worker that answers anything is reachable (a DOWN worker
 * comes back UP), a connection failure counts towards the fail threshold. With scraping disabled
 * (interval 0) the timer still runs once a second, probing only DOWN workers so they can recover.
 * When vllm:cache_config_info is present the router resizes the worker's modelled cache.
 *
 * Structs: kvr_scrape_t holds the timer and probes[slot], at most one probe per worker slot, each
 * tagged with the id of the worker it was started for. Flow: tick -> probe_start (curl easy on the
 * multi) -> on_probe_done -> kvr__scrape_report -> kvr_router_on_health / kvr_router_on_scrape.
 * Invariant: probes[i] is non-NULL exactly while its easy handle is in the multi; a probe whose
 * worker is gone (id no longer in slot i) is cancelled at the next tick, outside curl callbacks.
 */
#include "scrape.h"

#include "config.h"
#include "kvr.h"
#include "log.h"
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#define SCRAPE_MAX_BYTES (4u << 20)

typedef struct probe_s {
  kvr_scrape_t *s;
  uint32_t id; /* the worker it was started for */
  int slot;
  CURL *easy;
  kvr_buf_t body;
  char url[600];
} probe_t;

struct kvr_scrape_s {
  uv_timer_t timer;
  kvr_curlm_t *curlm; /* not owned */
  kvr_router_t *r;    /* not owned; read, and reported to */
  probe_t *probes[KVR_MAX_WORKERS];
};

static void probe_free(probe_t *p) {
  curl_easy_cleanup(p->easy);
  kvr_buf_free(&p->body);
  free(p);
}

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  probe_t *p = ud;
  size_t len = size * n;
  if (p->body.len + len > SCRAPE_MAX_BYTES)
    return 0; /* too large: abort the transfer */
  kvr_buf_append(&p->body, data, len);
  return len;
}

/* ---- parsing ----------------------------------------------------------------------------------
 */

static uint64_t label_u64(const char *line, const char *end, const char *label) {
  char key[64];
  snprintf(key, sizeof key, "%s=\"", label);
  const char *p = line;
  size_t klen = strlen(key);
  while (p + klen < end) {
    const char *hit = memmem(p, (size_t)(end - p), key, klen);
    if (hit == NULL)
      return 0;
    /* Must be a whole label name: preceded by '{' or ','. */
    if (hit > line && (hit[-1] == '{' || hit[-1] == ',')) {
      /* The value is read from a copy bounded by its closing quote and the line's end: the page
       * need not be NUL-terminated, and the next line is not part of the value. A value no
       * integer can hold (NaN, 1e30, negative) counts as absent. */
      const char *v = hit + klen;
      char num[32];
      size_t n = 0;
      while (v + n < end && v[n] != '"' && n < sizeof num - 1)
        n++;
      memcpy(num, v, n);
      num[n] = '\0';
      double d = strtod(num, NULL);
      return d > 0 && d <= 9007199254740992.0 ? (uint64_t)d : 0;
    }
    p = hit + klen;
  }
  return 0;
}

/* Adds one sample line [p, eol) to *m; returns 1 when it is one of the expected load series. */
static int parse_line(const char *p, const char *eol, kvr_router_scrape_t *m, int *nusage) {
  double v;
  if (kvr_metric_line_is(p, eol, "vllm:num_requests_running") &&
      kvr_metric_line_value(p, eol, &v) == 0) {
    m->num_requests_running += v;
    return 1;
  }
  if (kvr_metric_line_is(p, eol, "vllm:num_requests_waiting") &&
      kvr_metric_line_value(p, eol, &v) == 0) {
    m->num_requests_waiting += v;
    return 1;
  }
  if ((kvr_metric_line_is(p, eol, "vllm:kv_cache_usage_perc") ||
       kvr_metric_line_is(p, eol, "vllm:gpu_cache_usage_perc")) &&
      kvr_metric_line_value(p, eol, &v) == 0) {
    m->kv_cache_usage += v;
    (*nusage)++;
    return 1;
  }
  if (kvr_metric_line_is(p, eol, "vllm:cache_config_info")) {
    m->num_gpu_blocks = label_u64(p, eol, "num_gpu_blocks");
    m->block_size = label_u64(p, eol, "block_size");
  }
  return 0;
}

int kvr_scrape_parse(const char *text, size_t len, uint64_t now_ms, kvr_router_scrape_t *out) {
  kvr_router_scrape_t m = {.at_ms = now_ms};
  int nusage = 0, found = 0;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      eol = end;
    if (*p != '#' && eol > p)
      found += parse_line(p, eol, &m, &nusage);
    p = eol + 1;
  }
  if (found == 0)
    return KVR_EPARSE;
  m.kv_cache_usage = nusage ? m.kv_cache_usage / nusage : 0;
  if (m.num_gpu_blocks == 0 || m.block_size == 0)
    m.num_gpu_blocks = m.block_size = 0;
  *out = m;
  return 0;
}

int kvr__scrape_report(kvr_router_t *r, uint32_t id, bool reachable, bool ok, const char *page,
                       size_t len, uint64_t now_ms) {
  int rc = kvr_router_on_health(r, id, reachable);
  if (rc != 0 || !reachable || !ok)
    return rc;
  kvr_router_scrape_t m;
  rc = kvr_scrape_parse(page ? page : "", len, now_ms, &m);
  return rc != 0 ? rc : kvr_router_on_scrape(r, id, &m);
}

/* ---- probes -----------------------------------------------------------------------------------
 */

static void on_probe_done(CURL *easy, CURLcode result, void *data) {
  probe_t *p = data;
  p->s->probes[p->slot] = NULL;
  long status = 0;
  curl_off_t connect_us = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(easy, CURLINFO_CONNECT_TIME_T, &connect_us);
  /* Reachable is what health means: a slow or failing /metrics (busy API process) leaves the
   * worker up with stale figures; only a failure to connect counts towards DOWN. */
  bool reachable = result == CURLE_OK || status > 0 || connect_us > 0;
  if (!reachable && kvr_router_worker_by_id(p->s->r, p->id) != NULL)
    KVR_DEBUG("scrape", "worker %u: %s", p->id, curl_easy_strerror(result));
  kvr__scrape_report(p->s->r, p->id, reachable, result == CURLE_OK && status == 200, p->body.data,
                     p->body.len, kvr_now_ns() / 1000000u);
  probe_free(p);
}

static void probe_start(kvr_scrape_t *s, const kvr_worker_t *w) {
  const kvr_config_t *cfg = s->r->cfg;
  probe_t *p = kvr_xcalloc(1, sizeof *p);
  p->s = s;
  p->id = w->id;
  p->slot = w->slot;
  snprintf(p->url, sizeof p->url, "%s/metrics", w->url);
  uint64_t timeout = KVR_MAX(2 * cfg->scrape_interval_ms, (uint64_t)5000);
  p->easy = kvr_curl_easy_new(p->url, (long)cfg->connect_timeout_ms, (long)timeout, on_body, p);
  if (kvr_curlm_add(s->curlm, p->easy, on_probe_done, p) != 0) {
    probe_free(p);
    return;
  }
  s->probes[p->slot] = p;
}

static void probe_cancel(kvr_scrape_t *s, size_t slot) {
  probe_t *p = s->probes[slot];
  if (p == NULL)
    return;
  kvr_curlm_cancel(s->curlm, p->easy);
  probe_free(p);
  s->probes[slot] = NULL;
}

static void on_tick(uv_timer_t *t) {
  kvr_scrape_t *s = t->data;
  const kvr_router_t *r = s->r;
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++) {
    const kvr_worker_t *w = i < r->nslots ? r->slots[i] : NULL;
    if (s->probes[i] && (w == NULL || s->probes[i]->id != w->id))
      probe_cancel(s, i); /* its worker was removed */
    if (w == NULL || s->probes[i] || w->state == KVR_WORKER_DRAINING)
      continue;
    if (r->cfg->scrape_interval_ms == 0 && w->state != KVR_WORKER_DOWN)
      continue;
    probe_start(s, w);
  }
}

kvr_scrape_t *kvr_scrape_new(uv_loop_t *loop, kvr_curlm_t *curlm, kvr_router_t *r) {
  kvr_scrape_t *s = kvr_xcalloc(1, sizeof *s);
  s->curlm = curlm;
  s->r = r;
  uv_timer_init(loop, &s->timer);
  s->timer.data = s;
  uint64_t interval = r->cfg->scrape_interval_ms;
  uint64_t period = interval ? interval : 1000;
  uv_timer_start(&s->timer, on_tick, interval ? 0 : period, period);
  return s;
}

static void on_timer_closed(uv_handle_t *h) {
  free(h->data);
}

void kvr_scrape_close(kvr_scrape_t *s) {
  if (s == NULL)
    return;
  uv_timer_stop(&s->timer);
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++)
    probe_cancel(s, i);
  uv_close((uv_handle_t *)&s->timer, on_timer_closed);
}

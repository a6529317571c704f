/* peers.c -- polls each peer replica's GET /admin/load (see peers.h).
 *
 * poll_t: one per peer while its request is in flight (at most one per peer, so a slow peer
 * never piles requests up); its easy handle, the answer bounded at 1 MiB, and the header list.
 */
#include "serve/peers.h"

#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#define ANSWER_MAX (1u << 20)

typedef struct poll_s {
  kvr_peers_t *p;
  size_t peer;
  CURL *easy;
  struct curl_slist *hdrs;
  kvr_buf_t body;
} poll_t;

struct kvr_peers_s {
  uv_timer_t timer;
  kvr_curlm_t *curlm;
  kvr_router_t *r;
  poll_t *polls[KVR_MAX_PEERS];
  bool failing[KVR_MAX_PEERS]; /* logged once per outage */
};

int kvr_peers_parse(const char *text, size_t len, kvr_peer_row_t *rows, size_t max,
                    uint64_t *instance, void **json_out) {
  cJSON *o = cJSON_ParseWithLength(text ? text : "", len);
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "workers");
  const cJSON *inst = cJSON_GetObjectItemCaseSensitive(o, "instance");
  *json_out = o;
  *instance = cJSON_IsString(inst) ? strtoull(inst->valuestring, NULL, 16) : 0;
  if (!cJSON_IsArray(arr))
    return -1;
  size_t n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    const cJSON *url = cJSON_GetObjectItemCaseSensitive(e, "url");
    if (!cJSON_IsString(url) || n == max)
      continue;
    kvr_peer_row_t *row = &rows[n++];
    memset(row, 0, sizeof *row);
    row->url = url->valuestring;
    static const char *const keys[] = {"in_flight", "active_tokens", "queued_prefill_tokens",
                                       "prefill_backlog_tokens"};
    double v[4] = {0};
    for (int k = 0; k < 4; k++) {
      const cJSON *x = cJSON_GetObjectItemCaseSensitive(e, keys[k]);
      v[k] = cJSON_IsNumber(x) && x->valuedouble > 0 && x->valuedouble < 1e15 ? x->valuedouble : 0;
    }
    const cJSON *sc = cJSON_GetObjectItemCaseSensitive(e, "scraped");
    if (cJSON_IsObject(sc)) {
      const cJSON *age = cJSON_GetObjectItemCaseSensitive(sc, "age_ms");
      const cJSON *run = cJSON_GetObjectItemCaseSensitive(sc, "num_requests_running");
      const cJSON *wait = cJSON_GetObjectItemCaseSensitive(sc, "num_requests_waiting");
      const cJSON *kv = cJSON_GetObjectItemCaseSensitive(sc, "kv_cache_usage_perc");
      if (cJSON_IsNumber(age) && age->valuedouble >= 0 && age->valuedouble < 1e12 &&
          cJSON_IsNumber(run) && cJSON_IsNumber(wait) && cJSON_IsNumber(kv)) {
        row->has_scrape = true;
        row->scrape_age_ms = (uint64_t)age->valuedouble;
        row->num_requests_running = run->valuedouble;
        row->num_requests_waiting = wait->valuedouble;
        row->kv_cache_usage = kv->valuedouble;
      }
    }
    row->load.inflight = (uint32_t)KVR_MIN(v[0], (double)UINT32_MAX);
    row->load.active_tokens = (uint64_t)v[1];
    row->load.queued_prefill_tokens = (uint64_t)v[2];
    row->load.prefill_backlog_tokens = (uint64_t)v[3];
  }
  return (int)n;
}

static void poll_free(poll_t *q) {
  curl_easy_cleanup(q->easy);
  curl_slist_free_all(q->hdrs);
  kvr_buf_free(&q->body);
  free(q);
}

static size_t on_body(char *data, size_t size, size_t n, void *ud) {
  poll_t *q = ud;
  if (q->body.len + size * n > ANSWER_MAX)
    return 0;
  kvr_buf_append(&q->body, data, size * n);
  return size * n;
}

static void on_done(CURL *easy, CURLcode rc, void *data) {
  poll_t *q = data;
  kvr_peers_t *p = q->p;
  p->polls[q->peer] = NULL;
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  /* A peer serves at most KVR_MAX_WORKERS workers: rows for all of them, on the heap (4,096 rows
   * are ~400 KiB). */
  kvr_peer_row_t *rows = kvr_xmalloc(KVR_MAX_WORKERS * sizeof *rows);
  void *json = NULL;
  uint64_t instance = 0;
  int n = rc == CURLE_OK && status == 200
              ? kvr_peers_parse(q->body.data, q->body.len, rows, KVR_MAX_WORKERS, &instance, &json)
              : -1;
  const char *url = p->r->cfg->peers[q->peer];
  if (n >= 0 && instance == p->r->instance) {
    /* our own address in the list (one peer list for every replica): never count ourselves */
    kvr_router_on_peer_self(p->r, q->peer);
  } else if (n < 0) {
    kvr_router_on_peer_error(p->r, q->peer);
    if (!p->failing[q->peer])
      KVR_WARN("peers", "peer %s: no load (%s, HTTP %ld); its figures age out", url,
               rc == CURLE_OK ? "bad answer" : curl_easy_strerror(rc), status);
    p->failing[q->peer] = true;
  } else {
    if (p->failing[q->peer])
      KVR_INFO("peers", "peer %s answers again", url);
    p->failing[q->peer] = false;
    /* who answers, and where it announces its requests (peer_sync.h) */
    const cJSON *port = cJSON_GetObjectItemCaseSensitive(json, "sync_port");
    kvr_router_on_peer_hello(p->r, q->peer, instance,
                             cJSON_IsNumber(port) && port->valuedouble >= 1 &&
                                     port->valuedouble <= 65535
                                 ? (uint32_t)port->valuedouble
                                 : 0);
    kvr_router_on_peer_load(p->r, q->peer, rows, (size_t)n);
  }
  cJSON_Delete(json);
  free(rows);
  poll_free(q);
}

static void on_tick(uv_timer_t *t) {
  kvr_peers_t *p = t->data;
  const kvr_config_t *cfg = p->r->cfg;
  for (size_t i = 0; i < cfg->npeers && i < KVR_MAX_PEERS; i++) {
    if (p->polls[i])
      continue;
    poll_t *q = kvr_xcalloc(1, sizeof *q);
    q->p = p;
    q->peer = i;
    kvr_buf_t url = KVR_BUF_INIT;
    kvr_buf_printf(&url, "%s/admin/load", cfg->peers[i]);
    uint64_t budget = KVR_MAX(cfg->peer_interval_ms * 4, (uint64_t)500);
    q->easy = kvr_curl_easy_new(url.data, (long)cfg->connect_timeout_ms, (long)budget, on_body, q);
    kvr_buf_free(&url);
    if (cfg->admin_token) {
      kvr_buf_t h = KVR_BUF_INIT;
      kvr_buf_printf(&h, "Authorization: Bearer %s", cfg->admin_token);
      q->hdrs = kvr_curl_slist_append(NULL, h.data);
      memset(h.data, 0, h.len); /* no copy of the secret left behind */
      kvr_buf_free(&h);
      curl_easy_setopt(q->easy, CURLOPT_HTTPHEADER, q->hdrs);
    }
    if (kvr_curlm_add(p->curlm, q->easy, on_done, q) != 0) {
      poll_free(q);
      continue;
    }
    p->polls[i] = q;
  }
}

kvr_peers_t *kvr_peers_new(uv_loop_t *loop, kvr_curlm_t *curlm, kvr_router_t *r) {
  kvr_peers_t *p = kvr_xcalloc(1, sizeof *p);
  p->curlm = curlm;
  p->r = r;
  uv_timer_init(loop, &p->timer);
  p->timer.data = p;
  if (r->cfg->npeers > 0) {
    uv_timer_start(&p->timer, on_tick, 0, r->cfg->peer_interval_ms);
    KVR_INFO("peers", "reading the load of %zu peer replica(s) every %llu ms", r->cfg->npeers,
             (unsigned long long)r->cfg->peer_interval_ms);
  }
  return p;
}

static void on_closed(uv_handle_t *h) {
  free(h->data);
}

void kvr_peers_close(kvr_peers_t *p) {
  if (p == NULL)
    return;
  for (size_t i = 0; i < KVR_MAX_PEERS; i++) {
    if (p->polls[i]) {
      kvr_curlm_cancel(p->curlm, p->polls[i]->easy);
      poll_free(p->polls[i]);
      p->polls[i] = NULL;
    }
  }
  uv_timer_stop(&p->timer);
  uv_close((uv_handle_t *)&p->timer, on_closed);
}

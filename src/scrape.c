/* scrape.c -- periodic GET /metrics of every worker, on the router's loop and curl multi.
 *
 * Every scrape_interval_ms a timer starts one probe per worker that has none in flight. A probe is
 * a libcurl GET of URL/metrics whose body is collected (bounded at 4 MiB) and parsed for the series
 * the policies read:
 *   vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (0..1),
 *   vllm:cache_config_info{block_size=..., num_gpu_blocks=...}
 * Samples of one name are summed across label sets (several engines behind one server).
 *
 * The probe doubles as the health check: a worker that answers anything is reachable (a DOWN worker
 * comes back UP), a connection failure counts towards the fail threshold. With scraping disabled
 * (interval 0) the timer still runs once a second, probing only DOWN workers so they can recover.
 *
 * When vllm:cache_config_info is present the worker's cache capacity in router blocks becomes
 * num_gpu_blocks * block_size tokens / (block_chars / 4 tokens per block), and the cache index is
 * resized to match.
 */
#include "router.h"

#include "kvr.h"
#include "log.h"
#include "metrics.h"

#include <stdlib.h>
#include <string.h>

#define SCRAPE_MAX_BYTES (4u << 20)

typedef struct probe_s {
  kvr_router_t *r;
  kvr_worker_t *w;
  CURL *easy;
  kvr_buf_t body;
  char url[600];
} probe_t;

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
      double v = strtod(hit + klen, NULL);
      return v > 0 ? (uint64_t)v : 0;
    }
    p = hit + klen;
  }
  return 0;
}

int kvr_scrape_parse(kvr_worker_t *w, const char *text, size_t len, uint64_t now_ms) {
  double running = 0, waiting = 0, usage = 0;
  int nusage = 0, found = 0;
  uint64_t gpu_blocks = 0, block_size = 0;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      eol = end;
    double v;
    if (*p != '#' && eol > p) {
      if (kvr_metric_line_is(p, eol, "vllm:num_requests_running") &&
          kvr_metric_line_value(p, eol, &v) == 0) {
        running += v;
        found++;
      } else if (kvr_metric_line_is(p, eol, "vllm:num_requests_waiting") &&
                 kvr_metric_line_value(p, eol, &v) == 0) {
        waiting += v;
        found++;
      } else if ((kvr_metric_line_is(p, eol, "vllm:kv_cache_usage_perc") ||
                  kvr_metric_line_is(p, eol, "vllm:gpu_cache_usage_perc")) &&
                 kvr_metric_line_value(p, eol, &v) == 0) {
        usage += v;
        nusage++;
        found++;
      } else if (kvr_metric_line_is(p, eol, "vllm:cache_config_info")) {
        gpu_blocks = label_u64(p, eol, "num_gpu_blocks");
        block_size = label_u64(p, eol, "block_size");
      }
    }
    p = eol + 1;
  }
  if (found == 0)
    return KVR_EPARSE;
  w->num_requests_running = running;
  w->num_requests_waiting = waiting;
  w->kv_cache_usage = nusage ? usage / nusage : 0;
  w->metrics_seen = true;
  w->scraped_at_ms = now_ms;
  if (gpu_blocks && block_size) {
    w->num_gpu_blocks = gpu_blocks;
    w->block_size = block_size;
    uint64_t cap =
        kvr_cache_index_capacity_from_vllm(gpu_blocks, block_size, w->router->cfg->block_chars);
    if (cap != w->cache_capacity_blocks) {
      w->cache_capacity_blocks = cap;
      kvr_cache_index_set_capacity(w->router->index, w->slot, cap);
      KVR_INFO("scrape", "worker %u: cache capacity %llu blocks (%llu GPU blocks of %llu tokens)",
               w->id, (unsigned long long)cap, (unsigned long long)gpu_blocks,
               (unsigned long long)block_size);
    }
  }
  return 0;
}

static void on_probe_done(CURL *easy, CURLcode result, void *data) {
  probe_t *p = data;
  kvr_worker_t *w = p->w;
  w->scrape = NULL;
  long status = 0;
  curl_off_t connect_us = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(easy, CURLINFO_CONNECT_TIME_T, &connect_us);
  /* Reachable is what health means: a slow or failing /metrics (busy API process) leaves the
   * worker up with stale figures; only a failure to connect counts towards DOWN. */
  if (result == CURLE_OK || status > 0 || connect_us > 0) {
    kvr_router_worker_result(w, true);
    if (result == CURLE_OK && status == 200)
      kvr_scrape_parse(w, p->body.data ? p->body.data : "", p->body.len, kvr_now_ns() / 1000000u);
  } else {
    KVR_DEBUG("scrape", "worker %u: %s", w->id, curl_easy_strerror(result));
    kvr_router_worker_result(w, false);
  }
  probe_free(p);
}

static void probe_start(kvr_router_t *r, kvr_worker_t *w) {
  probe_t *p = calloc(1, sizeof *p);
  if (p == NULL)
    return;
  p->r = r;
  p->w = w;
  p->easy = curl_easy_init();
  if (p->easy == NULL) {
    free(p);
    return;
  }
  snprintf(p->url, sizeof p->url, "%s/metrics", w->url);
  uint64_t timeout = KVR_MAX(2 * r->cfg->scrape_interval_ms, (uint64_t)5000);
  curl_easy_setopt(p->easy, CURLOPT_URL, p->url);
  curl_easy_setopt(p->easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(p->easy, CURLOPT_TIMEOUT_MS, (long)timeout);
  curl_easy_setopt(p->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)r->cfg->connect_timeout_ms);
  curl_easy_setopt(p->easy, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(p->easy, CURLOPT_WRITEDATA, p);
  if (kvr_curlm_add(r->curlm, p->easy, on_probe_done, p) != 0) {
    probe_free(p);
    return;
  }
  w->scrape = p;
}

static void on_scrape_timer(uv_timer_t *t) {
  kvr_router_t *r = t->data;
  for (size_t i = 0; i < r->nslots; i++) {
    kvr_worker_t *w = r->slots[i];
    if (w == NULL || w->scrape || w->state == KVR_WORKER_DRAINING)
      continue;
    if (r->cfg->scrape_interval_ms == 0 && w->state != KVR_WORKER_DOWN)
      continue;
    probe_start(r, w);
  }
}

void kvr_scrape_start(kvr_router_t *r) {
  uint64_t period = r->cfg->scrape_interval_ms ? r->cfg->scrape_interval_ms : 1000;
  uv_timer_start(&r->scrape_timer, on_scrape_timer, r->cfg->scrape_interval_ms ? 0 : period,
                 period);
}

void kvr_scrape_stop(kvr_router_t *r) {
  uv_timer_stop(&r->scrape_timer);
}

void kvr_scrape_cancel(kvr_router_t *r, kvr_worker_t *w) {
  probe_t *p = w->scrape;
  if (p == NULL)
    return;
  kvr_curlm_cancel(r->curlm, p->easy);
  probe_free(p);
  w->scrape = NULL;
}

/* discovery.c -- workers from a DNS name re-resolved on a timer (discovery.h).
 *
 * kvr_discovery_t holds a copy of the settings it runs with (URL, target, interval, KV ports), the
 * discovered set (normalized worker URLs, owned strings) and one uv_getaddrinfo_t, at most one
 * resolution in flight. Flow: resolve() -> (thread pool) -> on_resolved(): the answer's addresses
 * become normalized URLs, kvr_discovery_diff() against the set, drains and adds through the
 * router, then the timer is armed for the next resolution (a one-shot timer per round, so two
 * resolutions never overlap however slow DNS is). A reload that changes the name bumps `gen`: an
 * answer of the old name that arrives later is dropped and the new name resolved at once.
 *
 * Invariants: every URL in the set is either served by a worker this module added or named by the
 * static list (or was drained by an operator since); the set never holds the same URL twice; after
 * kvr_discovery_close() the router is never touched.
 */
#include "serve/discovery.h"

#include "base/kvr.h"
#include "base/log.h"
#include "base/metrics.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* After a failed or empty answer with --discover-interval-ms 0: retry this soon. */
#define RETRY_ONCE_MS 1000

typedef enum { RES_OK, RES_ERROR, RES_EMPTY } result_t;
static const char *const result_names[] = {"ok", "error", "empty"};

static uint64_t resolutions_total[3]; /* by result_t */
static size_t discovered_workers;     /* the set's size, of the live discovery */

struct kvr_discovery_s {
  uv_loop_t *loop;
  kvr_router_t *r;
  const kvr_config_t *cfg;
  uv_timer_t timer;
  uv_getaddrinfo_t req;
  bool resolving;    /* req is in flight */
  unsigned req_gen;  /* gen when req was started */
  unsigned gen;      /* bumped when the name changes */
  bool closing;      /* kvr_discovery_close() was called */
  bool timer_closed; /* its close callback ran */
  bool answered;     /* an answer with addresses came (interval 0: stop resolving) */
  int last_result;   /* result_t of the previous answer, -1 before the first */
  char *url;         /* the --discover URL in force, owned, or NULL */
  kvr_url_target_t t;
  uint64_t interval_ms, events_port, replay_port;
  uint32_t dp_size; /* --discover-dp-size: ranks per address for addresses added from now on */
  char *set[KVR_DISCOVERY_MAX_ADDRS]; /* discovered worker URLs, owned */
  size_t nset;
};

/* ---- pure parts ------------------------------------------------------------------------------ */

static bool in_list(const char *const *list, size_t n, const char *s) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(list[i], s) == 0)
      return true;
  return false;
}

void kvr_discovery_diff(const char *const *cur, size_t ncur, const char *const *ans, size_t nans,
                        kvr_discovery_diff_t *d) {
  d->nadds = d->nremoves = 0;
  if (nans == 0)
    return; /* an empty answer is a hiccup, never "every worker is gone" */
  for (size_t i = 0; i < nans; i++)
    if (!in_list(cur, ncur, ans[i]) && !in_list(ans, i, ans[i]))
      d->adds[d->nadds++] = i;
  for (size_t i = 0; i < ncur; i++)
    if (!in_list(ans, nans, cur[i]))
      d->removes[d->nremoves++] = i;
}

int kvr_discovery_addr_host(const struct sockaddr *addr, char *out, size_t outlen) {
  char text[INET6_ADDRSTRLEN];
  int n;
  if (addr->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) == NULL)
      return KVR_EINVAL;
    n = snprintf(out, outlen, "%s", text);
  } else if (addr->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)addr;
    if (inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text) == NULL)
      return KVR_EINVAL;
    n = snprintf(out, outlen, "[%s]", text);
  } else {
    return KVR_EINVAL;
  }
  return (n < 0 || (size_t)n >= outlen) ? KVR_EINVAL : 0;
}

/* ---- the router side ------------------------------------------------------------------------- */

static bool str_eq(const char *a, const char *b) {
  return (a == NULL || b == NULL) ? a == b : strcmp(a, b) == 0;
}

/* Whether the static list (the live configuration's workers) names url. */
static bool static_worker(const kvr_discovery_t *d, const char *url) {
  for (size_t i = 0; i < d->cfg->nworkers; i++)
    if (strcmp(d->cfg->workers[i], url) == 0)
      return true;
  return false;
}

/* The KV-event endpoint of port on url's host (tcp://ADDR:PORT), or NULL when port is 0. */
static char *endpoint_of(const char *url, uint64_t port) {
  if (port == 0)
    return NULL;
  const char *host = strstr(url, "://") + 3;
  const char *close = host[0] == '[' ? strchr(host, ']') : NULL;
  const char *colon = strrchr(close ? close : host, ':');
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_printf(&b, "tcp://%.*s:%llu", (int)(colon - host), host, (unsigned long long)port);
  return kvr_buf_steal(&b);
}

/* The live (not draining) worker of url after slot `after` (-1: from the start): the whole server
 * or one of its data-parallel ranks; NULL when none is left. */
static const kvr_worker_t *next_of_url(const kvr_router_t *r, const char *url, int after) {
  for (size_t i = (size_t)(after + 1); i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w && w->state != KVR_WORKER_DRAINING && strcmp(w->url, url) == 0)
      return w;
  }
  return NULL;
}

/* Sets the derived KV-event endpoints on the discovered url's workers (each data-parallel rank
 * on vLLM's port + rank), unless static. */
static void set_kv(kvr_discovery_t *d, const char *url) {
  if (static_worker(d, url))
    return;
  char *ev = endpoint_of(url, d->events_port);
  char *rp = ev ? endpoint_of(url, d->replay_port) : NULL;
  for (const kvr_worker_t *w = next_of_url(d->r, url, -1); w; w = next_of_url(d->r, url, w->slot)) {
    char evr[600], rpr[600], err[256];
    uint32_t rank = w->dp_rank > 0 ? (uint32_t)w->dp_rank : 0;
    const char *e = ev && kvr_url_kv_endpoint_rank(ev, rank, evr, sizeof evr, err, sizeof err) == 0
                        ? evr
                        : NULL;
    const char *p =
        e && rp && kvr_url_kv_endpoint_rank(rp, rank, rpr, sizeof rpr, err, sizeof err) == 0 ? rpr
                                                                                             : NULL;
    if (!str_eq(w->kv_events, e) || !str_eq(w->kv_replay, p))
      kvr_router_set_worker_kv(d->r, w->id, e, p);
  }
  free(ev);
  free(rp);
}

/* Removes set[i]: drains its workers (every rank) unless the static list names it. */
static void drop(kvr_discovery_t *d, size_t i) {
  const char *url = d->set[i];
  if (!static_worker(d, url)) {
    const kvr_worker_t *w;
    while ((w = next_of_url(d->r, url, -1)) != NULL) {
      KVR_INFO("discovery", "%s is gone from %s: draining worker %u", url, d->t.host, w->id);
      kvr_router_drain_worker(d->r, w->id);
    }
  }
  free(d->set[i]);
  d->set[i] = d->set[--d->nset];
}

/* Adds url to the set, and as a worker unless one already serves it. */
static void add(kvr_discovery_t *d, const char *url) {
  if (d->nset >= KVR_DISCOVERY_MAX_ADDRS)
    return;
  if (next_of_url(d->r, url, -1) == NULL) {
    char err[256];
    int n = kvr_router_add_workers(d->r, url, d->dp_size, NULL, NULL, err, sizeof err);
    if (n <= 0) { /* not in the set: tried again at the next answer */
      KVR_ERROR("discovery", "worker %s from %s not added: %s", url, d->t.host, err);
      return;
    }
    KVR_INFO("discovery", "%s appeared in %s: worker %u%s", url, d->t.host,
             next_of_url(d->r, url, -1)->id, n > 1 ? " and its other data-parallel ranks" : "");
  }
  d->set[d->nset++] = kvr_xstrdup(url);
  set_kv(d, url);
}

static void apply_answer(kvr_discovery_t *d, char **ans, size_t nans) {
  size_t adds[KVR_DISCOVERY_MAX_ADDRS], removes[KVR_DISCOVERY_MAX_ADDRS];
  kvr_discovery_diff_t diff = {.adds = adds, .removes = removes};
  kvr_discovery_diff((const char *const *)d->set, d->nset, (const char *const *)ans, nans, &diff);
  /* removes index the set, which drop() reorders: remove by URL, from a copy of the names */
  char *gone[KVR_DISCOVERY_MAX_ADDRS];
  for (size_t i = 0; i < diff.nremoves; i++)
    gone[i] = kvr_xstrdup(d->set[removes[i]]);
  for (size_t i = 0; i < diff.nremoves; i++) {
    for (size_t j = 0; j < d->nset; j++)
      if (strcmp(d->set[j], gone[i]) == 0) {
        drop(d, j);
        break;
      }
    free(gone[i]);
  }
  for (size_t i = 0; i < diff.nadds; i++)
    add(d, ans[adds[i]]);
  discovered_workers = d->nset;
}

/* The answer's addresses as normalized worker URLs (owned by ans[]); returns their number. */
static size_t answer_urls(const kvr_discovery_t *d, const struct addrinfo *res, char **ans) {
  size_t n = 0;
  for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    char host[INET6_ADDRSTRLEN + 2], url[512], norm[512], err[256];
    if (kvr_discovery_addr_host(ai->ai_addr, host, sizeof host) != 0)
      continue;
    if (n == KVR_DISCOVERY_MAX_ADDRS) {
      KVR_WARN("discovery", "%s: more than %d addresses, the rest ignored", d->t.host,
               KVR_DISCOVERY_MAX_ADDRS);
      break;
    }
    snprintf(url, sizeof url, "%s://%s:%d", d->t.scheme, host, d->t.port);
    if (kvr_url_worker(url, norm, sizeof norm, err, sizeof err) == 0)
      ans[n++] = kvr_xstrdup(norm);
  }
  return n;
}

/* ---- resolving ------------------------------------------------------------------------------- */

static void resolve(kvr_discovery_t *d);

static void on_timer(uv_timer_t *t) {
  resolve(t->data);
}

/* Counts one answer and logs it when its kind differs from the previous one's (one line per
 * episode, not one per round of an outage). */
static void note(kvr_discovery_t *d, result_t res, const char *what) {
  resolutions_total[res]++;
  if (res == RES_OK && d->last_result == RES_OK)
    return;
  if (res == RES_OK)
    KVR_INFO("discovery", "%s: %s", d->t.host, what);
  else if (d->last_result != (int)res)
    KVR_WARN("discovery", "%s: %s; keeping the %zu discovered workers", d->t.host, what, d->nset);
  d->last_result = (int)res;
}

static void schedule(kvr_discovery_t *d) {
  if (d->url == NULL || d->closing)
    return;
  if (d->interval_ms > 0)
    uv_timer_start(&d->timer, on_timer, d->interval_ms, 0);
  else if (!d->answered)
    uv_timer_start(&d->timer, on_timer, RETRY_ONCE_MS, 0);
}

static void maybe_free(kvr_discovery_t *d) {
  if (!d->closing || !d->timer_closed || d->resolving)
    return;
  for (size_t i = 0; i < d->nset; i++)
    free(d->set[i]);
  free(d->url);
  free(d);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  kvr_discovery_t *d = req->data;
  d->resolving = false;
  if (d->closing || d->req_gen != d->gen) {
    uv_freeaddrinfo(res);
    if (d->closing)
      maybe_free(d);
    else
      resolve(d); /* the name changed meanwhile: this answer is not its */
    return;
  }
  char *ans[KVR_DISCOVERY_MAX_ADDRS];
  size_t nans = status == 0 ? answer_urls(d, res, ans) : 0;
  uv_freeaddrinfo(res);
  char what[320];
  if (status < 0) {
    snprintf(what, sizeof what, "DNS resolution failed: %s", uv_strerror(status));
    note(d, RES_ERROR, what);
  } else if (nans == 0) {
    note(d, RES_EMPTY, "DNS answer has no IPv4 or IPv6 address");
  } else {
    apply_answer(d, ans, nans);
    d->answered = true;
    snprintf(what, sizeof what, "resolved to %zu addresses, %zu workers discovered", nans, d->nset);
    note(d, RES_OK, what);
  }
  for (size_t i = 0; i < nans; i++)
    free(ans[i]);
  schedule(d);
}

static void resolve(kvr_discovery_t *d) {
  if (d->url == NULL || d->closing || d->resolving)
    return; /* a resolution in flight of an older name resolves again when it returns */
  uv_timer_stop(&d->timer);
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC; /* IPv4 and IPv6 */
  hints.ai_socktype = SOCK_STREAM;
  d->req.data = d;
  d->req_gen = d->gen;
  int rc = uv_getaddrinfo(d->loop, &d->req, on_resolved, d->t.host, NULL, &hints);
  if (rc == 0) {
    d->resolving = true;
    return;
  }
  char what[320];
  snprintf(what, sizeof what, "DNS resolution not started: %s", uv_strerror(rc));
  note(d, RES_ERROR, what);
  schedule(d);
}

/* ---- lifetime -------------------------------------------------------------------------------- */

/* Takes the live configuration's discovery settings; returns whether the name or port changed. */
static bool take_settings(kvr_discovery_t *d) {
  const kvr_config_t *c = d->cfg;
  bool changed = !str_eq(d->url, c->discover_url);
  if (changed) {
    free(d->url);
    d->url = c->discover_url ? kvr_xstrdup(c->discover_url) : NULL;
    char err[256];
    if (d->url && kvr_url_discovery(d->url, &d->t, err, sizeof err) != 0) {
      KVR_ERROR("discovery", "%s", err); /* the config parser checked it: not expected */
      free(d->url);
      d->url = NULL;
    }
    d->gen++;
    d->answered = false;
    d->last_result = -1;
  }
  d->interval_ms = c->discover_interval_ms;
  d->events_port = c->discover_kv_events_port;
  d->replay_port = c->discover_kv_replay_port;
  d->dp_size = (uint32_t)c->discover_dp_size;
  return changed;
}

kvr_discovery_t *kvr_discovery_new(uv_loop_t *loop, kvr_router_t *r, const kvr_config_t *cfg) {
  kvr_discovery_t *d = kvr_xcalloc(1, sizeof *d);
  d->loop = loop;
  d->r = r;
  d->cfg = cfg;
  d->last_result = -1;
  uv_timer_init(loop, &d->timer);
  d->timer.data = d;
  take_settings(d);
  discovered_workers = 0;
  if (d->url) {
    KVR_INFO("discovery", "workers from %s (%s://%s:%d), every %llu ms", d->url, d->t.scheme,
             d->t.host, d->t.port, (unsigned long long)d->interval_ms);
    resolve(d);
  }
  return d;
}

void kvr_discovery_apply(kvr_discovery_t *d) {
  if (d == NULL || d->closing)
    return;
  uint64_t interval = d->interval_ms, ev = d->events_port, rp = d->replay_port;
  if (take_settings(d)) {
    uv_timer_stop(&d->timer);
    if (d->url == NULL) {
      KVR_INFO("discovery", "discovery removed: draining the %zu discovered workers", d->nset);
      while (d->nset > 0)
        drop(d, d->nset - 1);
      discovered_workers = 0;
      return;
    }
    KVR_INFO("discovery",
             "discovery now %s: resolving (the %zu discovered workers stay until it "
             "answers)",
             d->url, d->nset);
    resolve(d);
    return;
  }
  if (d->url && interval != d->interval_ms && !d->resolving) {
    uv_timer_stop(&d->timer);
    schedule(d);
  }
  if (ev != d->events_port || rp != d->replay_port)
    for (size_t i = 0; i < d->nset; i++)
      set_kv(d, d->set[i]);
}

bool kvr_discovery_has(const kvr_discovery_t *d, const char *url) {
  return d != NULL && in_list((const char *const *)d->set, d->nset, url);
}

static void on_timer_closed(uv_handle_t *h) {
  kvr_discovery_t *d = h->data;
  d->timer_closed = true;
  maybe_free(d);
}

void kvr_discovery_close(kvr_discovery_t *d) {
  if (d == NULL)
    return;
  d->closing = true;
  if (d->resolving)
    uv_cancel((uv_req_t *)&d->req); /* fails when already running: then on_resolved waits */
  uv_timer_stop(&d->timer);
  uv_close((uv_handle_t *)&d->timer, on_timer_closed);
}

void kvr_discovery_metrics(kvr_buf_t *out) {
  kvr_metric_family(out, "kvrouter_discovery_resolutions_total", "counter",
                    "DNS resolutions of the --discover name, by result (error and empty keep the "
                    "discovered workers)");
  char labels[32];
  for (size_t i = 0; i < KVR_ARRAY_SIZE(result_names); i++) {
    snprintf(labels, sizeof labels, "result=\"%s\"", result_names[i]);
    kvr_metric_sample(out, "kvrouter_discovery_resolutions_total", labels,
                      (double)resolutions_total[i]);
  }
  kvr_metric_family(out, "kvrouter_discovery_workers", "gauge",
                    "Worker addresses discovered from the --discover name");
  kvr_metric_sample(out, "kvrouter_discovery_workers", NULL, (double)discovered_workers);
}

/* kv_feed.c -- one KV-event stream per worker, reconciled with the router's workers (kv_feed.h).
 *
 * streams[] holds one entry per open stream: the worker id it feeds and the endpoints it was opened
 * with (a worker whose endpoints change gets a new stream). The ZMQ context is created with the
 * first stream and terminated at close, after every socket is closed.
 */
#include "serve/kv_feed.h"

#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "net/kv_sub.h"

#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define TICK_MS 250

typedef struct stream_s {
  kvr_kv_feed_t *f;
  uint32_t worker_id;
  char *events, *replay;
  kvr_kv_sub_t *sub;
  bool seen; /* reconcile mark */
} stream_t;

struct kvr_kv_feed_s {
  uv_loop_t *loop;
  kvr_router_t *r;
  void *ctx;
  uv_timer_t timer;
  stream_t *streams[KVR_MAX_WORKERS];
  size_t nstreams;
};

static void on_batch(void *data, const kvr_kv_batch_t *b) {
  stream_t *s = data;
  kvr_router_on_kv_batch(s->f->r, s->worker_id, b);
}

static void on_reset(void *data) {
  stream_t *s = data;
  kvr_router_on_kv_reset(s->f->r, s->worker_id);
  /* route this worker on the approximate index from now on, not only from the next tick */
  kvr_router_on_kv_mode(s->f->r, s->worker_id, false, "reset");
}

static void stream_close(stream_t *s) {
  kvr_kv_sub_close(s->sub);
  free(s->events);
  free(s->replay);
  free(s);
}

static bool same(const char *a, const char *b) {
  return (a == NULL && b == NULL) || (a && b && strcmp(a, b) == 0);
}

static void open_stream(kvr_kv_feed_t *f, const kvr_worker_t *w) {
  if (f->ctx == NULL)
    f->ctx = zmq_ctx_new();
  const kvr_config_t *cfg = f->r->cfg;
  stream_t *s = kvr_xcalloc(1, sizeof(*s));
  s->f = f;
  s->worker_id = w->id;
  s->events = kvr_xstrdup(w->kv_events);
  s->replay = kvr_xstrdup(w->kv_replay);
  kvr_kv_sub_opts_t o = {.endpoint = s->events,
                         .replay_endpoint = s->replay,
                         .topic = cfg->kv_events_topic,
                         .replay_timeout_ms = cfg->kv_events_replay_timeout_ms,
                         .refill_ms = cfg->kv_events_refill_ms};
  kvr_kv_sub_cbs_t cbs = {on_batch, on_reset, s};
  char err[256];
  s->sub = kvr_kv_sub_new(f->loop, f->ctx, &o, &cbs, err, sizeof(err));
  if (s->sub == NULL) {
    KVR_WARN("kv", "worker %u: %s", w->id, err);
    kvr_router_on_kv_mode(f->r, w->id, false, "connect_failed");
    free(s->events);
    free(s->replay);
    free(s);
    return;
  }
  KVR_INFO("kv", "worker %u: reading KV events from %s%s%s", w->id, s->events,
           s->replay ? ", replay " : "", s->replay ? s->replay : "");
  f->streams[f->nstreams++] = s;
}

/* Opens, re-opens and closes streams to match the router's workers; pushes modes and counters. */
static void reconcile(kvr_kv_feed_t *f) {
  kvr_router_t *r = f->r;
  for (size_t i = 0; i < f->nstreams; i++)
    f->streams[i]->seen = false;
  for (size_t slot = 0; slot < r->nslots; slot++) {
    const kvr_worker_t *w = r->slots[slot];
    if (w == NULL || w->kv_events == NULL)
      continue;
    stream_t *s = NULL;
    for (size_t i = 0; i < f->nstreams && s == NULL; i++)
      if (f->streams[i]->worker_id == w->id && same(f->streams[i]->events, w->kv_events) &&
          same(f->streams[i]->replay, w->kv_replay))
        s = f->streams[i];
    if (s == NULL && f->nstreams < KVR_MAX_WORKERS) {
      open_stream(f, w);
      s = f->nstreams ? f->streams[f->nstreams - 1] : NULL;
      if (s == NULL || s->worker_id != w->id)
        continue;
    }
    if (s == NULL)
      continue;
    s->seen = true;
    kvr_kv_fallback_t m = kvr_kv_sub_mode(s->sub, (uint64_t)kvr_now_ms());
    kvr_router_on_kv_mode(r, w->id, m == KVR_KV_FALLBACK_NONE, kvr_kv_fallback_name(m));
    kvr_router_on_kv_stats(r, w->id, kvr_kv_sub_stats(s->sub));
  }
  for (size_t i = 0; i < f->nstreams;) {
    if (f->streams[i]->seen) {
      i++;
      continue;
    }
    stream_close(f->streams[i]);
    f->streams[i] = f->streams[--f->nstreams];
  }
}

static void on_tick(uv_timer_t *t) {
  reconcile(t->data);
}

kvr_kv_feed_t *kvr_kv_feed_new(uv_loop_t *loop, kvr_router_t *r) {
  kvr_kv_feed_t *f = kvr_xcalloc(1, sizeof(*f));
  f->loop = loop;
  f->r = r;
  uv_timer_init(loop, &f->timer);
  f->timer.data = f;
  reconcile(f);
  uv_timer_start(&f->timer, on_tick, TICK_MS, TICK_MS);
  return f;
}

static void on_timer_closed(uv_handle_t *h) {
  free(h->data);
}

void kvr_kv_feed_close(kvr_kv_feed_t *f) {
  if (f == NULL)
    return;
  for (size_t i = 0; i < f->nstreams; i++)
    stream_close(f->streams[i]);
  f->nstreams = 0;
  if (f->ctx)
    zmq_ctx_term(f->ctx); /* every socket is closed (linger 0): returns at once */
  f->ctx = NULL;
  uv_timer_stop(&f->timer);
  uv_close((uv_handle_t *)&f->timer, on_timer_closed);
}

/* peer_sync.c -- replicas announce their requests to each other (see peer_sync.h).
 *
 * State: one open-addressing table of records keyed by (owner, id): owner 0 is this replica (what
 * its snapshots list: worker id, prompt and prefill tokens), owner p + 1 is peer p (the router
 * dispatch record its load lives in). Per peer: the instance its records came from, the last
 * sequence number, when it was last heard, whether a snapshot made it live. Sockets: one PUB bound
 * at cfg->peer_sync_listen, one SUB connected to every peer's advertised port, each woken through
 * ZMQ_FD by a uv_poll_t (edge-triggered: every wake-up drains until ZMQ_EVENTS has no POLLIN).
 */
#include "serve/peer_sync.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "proto/kv_decode.h"

#include <curl/curl.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* ---- messages ---------------------------------------------------------------------------------
 */

typedef struct priv_s {
  msgpack_unpacked u;
  char **urls; /* NUL-terminated copies of the entries' urls */
  size_t nurls;
} priv_t;

static bool get_u64(const msgpack_object *o, uint64_t *v) {
  if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return false;
  *v = o->via.u64;
  return true;
}

static bool get_f64(const msgpack_object *o, double *v) {
  if (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32)
    *v = o->via.f64;
  else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
    *v = (double)o->via.u64;
  else
    return false;
  return *v >= 0 && *v < 1e15; /* NaN fails too */
}

static const char *dup_str(priv_t *p, const msgpack_object *o) {
  if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size > 4096 ||
      memchr(o->via.str.ptr, '\0', o->via.str.size) != NULL) /* no URL holds a NUL */
    return NULL;
  char *s = kvr_xmalloc(o->via.str.size + 1);
  memcpy(s, o->via.str.ptr, o->via.str.size);
  s[o->via.str.size] = '\0';
  p->urls[p->nurls++] = s;
  return s;
}

/* [id, url, prompt, prefill] from a[0..4) */
static bool get_entry(priv_t *p, const msgpack_object *a, kvr_sync_entry_t *e) {
  return get_u64(&a[0], &e->id) && (e->url = dup_str(p, &a[1])) != NULL &&
         get_u64(&a[2], &e->prompt_tokens) && get_u64(&a[3], &e->prefill_tokens);
}

int kvr_peer_sync_decode(const void *data, size_t len, kvr_sync_msg_t *msg, char *err,
                         size_t errlen) {
  memset(msg, 0, sizeof *msg);
  if (!kvr_msgpack_sizes_plausible(data, len)) {
    snprintf(err, errlen, "not msgpack (truncated, or a container larger than the payload)");
    return -1;
  }
  priv_t *p = kvr_xcalloc(1, sizeof *p);
  msgpack_unpacked_init(&p->u);
  msg->priv = p;
  size_t off = 0;
  msgpack_unpack_return ur = msgpack_unpack_next(&p->u, data, len, &off);
  const msgpack_object *o = &p->u.data;
  uint64_t kind = 0;
  if ((ur != MSGPACK_UNPACK_SUCCESS && ur != MSGPACK_UNPACK_EXTRA_BYTES) ||
      o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 4 ||
      !get_u64(&o->via.array.ptr[0], &kind) || kind > KVR_SYNC_MSG_SCRAPE ||
      !get_u64(&o->via.array.ptr[1], &msg->instance) || !get_u64(&o->via.array.ptr[2], &msg->seq)) {
    snprintf(err, errlen, "not a sync message [kind, instance, seq, ...]");
    goto fail;
  }
  msg->kind = (kvr_sync_kind_t)kind;
  const msgpack_object *a = o->via.array.ptr;
  if (kind == KVR_SYNC_MSG_SNAPSHOT) {
    if (a[3].type != MSGPACK_OBJECT_ARRAY) {
      snprintf(err, errlen, "snapshot without its list");
      goto fail;
    }
    size_t n = a[3].via.array.size;
    msg->entries = kvr_xcalloc(n ? n : 1, sizeof *msg->entries);
    p->urls = kvr_xcalloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
      const msgpack_object *e = &a[3].via.array.ptr[i];
      if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size < 4 ||
          !get_entry(p, e->via.array.ptr, &msg->entries[msg->nentries])) {
        snprintf(err, errlen, "snapshot entry %zu is not [id, url, prompt, prefill]", i);
        goto fail;
      }
      msg->nentries++;
    }
  } else if (kind == KVR_SYNC_MSG_DISPATCH) {
    msg->entries = kvr_xcalloc(1, sizeof *msg->entries);
    p->urls = kvr_xcalloc(1, sizeof(char *));
    if (o->via.array.size < 7 || !get_entry(p, &a[3], &msg->entries[0])) {
      snprintf(err, errlen, "dispatch is not [1, instance, seq, id, url, prompt, prefill]");
      goto fail;
    }
    msg->nentries = 1;
    msg->id = msg->entries[0].id;
  } else if (kind == KVR_SYNC_MSG_SCRAPE) {
    p->urls = kvr_xcalloc(1, sizeof(char *));
    if (o->via.array.size < 7 || (msg->url = dup_str(p, &a[3])) == NULL ||
        !get_f64(&a[4], &msg->running) || !get_f64(&a[5], &msg->waiting) ||
        !get_f64(&a[6], &msg->kv_cache_usage) || msg->kv_cache_usage > 1) {
      snprintf(err, errlen, "scrape is not [4, instance, seq, url, running, waiting, kv usage]");
      goto fail;
    }
  } else if (!get_u64(&a[3], &msg->id)) {
    snprintf(err, errlen, "message without a request id");
    goto fail;
  }
  return 0;
fail:
  kvr_peer_sync_msg_free(msg);
  return -1;
}

void kvr_peer_sync_msg_free(kvr_sync_msg_t *msg) {
  priv_t *p = msg->priv;
  if (p) {
    msgpack_unpacked_destroy(&p->u);
    for (size_t i = 0; i < p->nurls; i++)
      free(p->urls[i]);
    free(p->urls);
    free(p);
  }
  free(msg->entries);
  memset(msg, 0, sizeof *msg);
}

static void pack_entry(msgpack_packer *pk, const kvr_sync_entry_t *e) {
  size_t ulen = e->url ? strlen(e->url) : 0;
  msgpack_pack_uint64(pk, e->id);
  msgpack_pack_str(pk, ulen);
  msgpack_pack_str_body(pk, e->url ? e->url : "", ulen);
  msgpack_pack_uint64(pk, e->prompt_tokens);
  msgpack_pack_uint64(pk, e->prefill_tokens);
}

void kvr_peer_sync_encode(const kvr_sync_msg_t *msg, void **out, size_t *outlen) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  bool dispatch = msg->kind == KVR_SYNC_MSG_DISPATCH, scrape = msg->kind == KVR_SYNC_MSG_SCRAPE;
  msgpack_pack_array(&pk, dispatch || scrape ? 7 : 4);
  msgpack_pack_uint64(&pk, (uint64_t)msg->kind);
  msgpack_pack_uint64(&pk, msg->instance);
  msgpack_pack_uint64(&pk, msg->seq);
  if (msg->kind == KVR_SYNC_MSG_SNAPSHOT) {
    msgpack_pack_array(&pk, msg->nentries);
    for (size_t i = 0; i < msg->nentries; i++) {
      msgpack_pack_array(&pk, 4);
      pack_entry(&pk, &msg->entries[i]);
    }
  } else if (dispatch) {
    pack_entry(&pk, &msg->entries[0]);
  } else if (scrape) {
    size_t ulen = msg->url ? strlen(msg->url) : 0;
    msgpack_pack_str(&pk, ulen);
    msgpack_pack_str_body(&pk, msg->url ? msg->url : "", ulen);
    msgpack_pack_double(&pk, msg->running);
    msgpack_pack_double(&pk, msg->waiting);
    msgpack_pack_double(&pk, msg->kv_cache_usage);
  } else {
    msgpack_pack_uint64(&pk, msg->id);
  }
  *out = sb.data; /* msgpack's sbuffer is malloc'd: the caller frees it */
  *outlen = sb.size;
}

/* ---- records ----------------------------------------------------------------------------------
 */

typedef struct rec_s {
  bool used;
  uint8_t owner; /* 0: ours; p + 1: peer p's */
  bool mark;     /* reconcile: listed in the snapshot being applied */
  uint64_t id;
  /* ours */
  uint32_t worker_id;
  uint64_t prompt_tokens, prefill_tokens;
  /* a peer's */
  kvr_router_dispatch_t d;
} rec_t;

struct kvr_peer_sync_s {
  kvr_router_t *r;
  uv_loop_t *loop;
  void *ctx, *pub, *sub;
  uv_poll_t sub_poll;
  uv_timer_t timer;
  uv_timer_t flush_timer; /* sends the frame of queued messages (publish) */
  kvr_buf_t out;          /* that frame: msgpack messages back to back */
  int open_handles;
  bool closing;
  uint64_t seq;
  rec_t *tab;
  size_t cap, n;
  /* per peer */
  uint64_t inst[KVR_MAX_PEERS]; /* the instance p's records came from */
  bool have_seq[KVR_MAX_PEERS];
  uint64_t last_seq[KVR_MAX_PEERS], heard_ms[KVR_MAX_PEERS];
  char *connected[KVR_MAX_PEERS]; /* the endpoint the SUB socket is connected to for p */
  void (*sink)(void *ctx, const void *, size_t);
  void *sink_ctx;
};

static size_t slot_of(const kvr_peer_sync_t *s, uint8_t owner, uint64_t id) {
  uint64_t h = (id ^ ((uint64_t)owner << 56)) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 20) & (s->cap - 1);
}

static rec_t *find(kvr_peer_sync_t *s, uint8_t owner, uint64_t id) {
  for (size_t i = slot_of(s, owner, id);; i = (i + 1) & (s->cap - 1)) {
    rec_t *e = &s->tab[i];
    if (!e->used)
      return NULL;
    if (e->owner == owner && e->id == id)
      return e;
  }
}

static rec_t *insert(kvr_peer_sync_t *s, uint8_t owner, uint64_t id);

static void grow(kvr_peer_sync_t *s) {
  rec_t *old = s->tab;
  size_t ocap = s->cap;
  s->cap *= 2;
  s->tab = kvr_xcalloc(s->cap, sizeof *s->tab);
  s->n = 0;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].used)
      *insert(s, old[i].owner, old[i].id) = old[i];
  free(old);
}

/* A new zeroed record (the caller fills it); the key must not be present. */
static rec_t *insert(kvr_peer_sync_t *s, uint8_t owner, uint64_t id) {
  if ((s->n + 1) * 2 > s->cap)
    grow(s);
  size_t i = slot_of(s, owner, id);
  while (s->tab[i].used)
    i = (i + 1) & (s->cap - 1);
  rec_t *e = &s->tab[i];
  memset(e, 0, sizeof *e);
  e->used = true;
  e->owner = owner;
  e->id = id;
  s->n++;
  return e;
}

/* Removes e (backward-shift deletion keeps every probe chain whole). */
static void erase(kvr_peer_sync_t *s, rec_t *e) {
  size_t i = (size_t)(e - s->tab);
  s->tab[i].used = false;
  s->n--;
  for (size_t j = (i + 1) & (s->cap - 1); s->tab[j].used; j = (j + 1) & (s->cap - 1)) {
    size_t home = slot_of(s, s->tab[j].owner, s->tab[j].id);
    /* move j back to i when its home is not in the cyclic range (i, j] */
    bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (!in_range) {
      s->tab[i] = s->tab[j];
      s->tab[j].used = false;
      i = j;
    }
  }
}

/* Ends a peer record's load on its worker and forgets it. */
static void end_peer_rec(kvr_peer_sync_t *s, rec_t *e) {
  kvr_router_on_end(s->r, &e->d);
  erase(s, e);
}

/* Drops everything peer p announced: its load goes back to polled figures. */
static void drop_peer(kvr_peer_sync_t *s, size_t p) {
  for (size_t i = 0; i < s->cap;) {
    rec_t *e = &s->tab[i];
    if (e->used && e->owner == p + 1)
      end_peer_rec(s, e); /* backward shift may bring another record into i: look again */
    else
      i++;
  }
  kvr_router_on_peer_sync_live(s->r, p, false);
  s->have_seq[p] = false;
  s->inst[p] = 0;
}

/* ---- publishing -------------------------------------------------------------------------------
 */

/* The frame of the messages queued so far goes out as one ZMQ message. */
static void flush(kvr_peer_sync_t *s) {
  if (s->out.len == 0)
    return;
  if (s->sink)
    s->sink(s->sink_ctx, s->out.data, s->out.len);
  else if (s->pub)
    zmq_send(s->pub, s->out.data, s->out.len, ZMQ_DONTWAIT); /* no subscriber, or too slow */
  s->out.len = 0;
}

static void on_flush(uv_timer_t *t) {
  flush(t->data);
}

/* Queues m in the current frame. Every message a loop iteration's callbacks publish leaves in one
 * frame at the next iteration (a 0 ms timer): a ZMQ send wakes its I/O thread, and one wake-up per
 * message cost as much CPU as the request itself (bench/results/fastpath/2cores). A frame is sent
 * at once past 64 KiB, and at once when there is no loop (tests). */
static void publish(kvr_peer_sync_t *s, kvr_sync_msg_t *m) {
  m->instance = s->r->instance;
  m->seq = ++s->seq;
  void *buf = NULL;
  size_t len = 0;
  kvr_peer_sync_encode(m, &buf, &len);
  bool first = s->out.len == 0;
  kvr_buf_append(&s->out, buf, len);
  free(buf);
  kvr_router_on_sync_published(s->r);
  if (s->loop == NULL || s->out.len >= 65536)
    flush(s);
  else if (first)
    uv_timer_start(&s->flush_timer, on_flush, 0, 0);
}

static void on_router_event(void *ctx, kvr_sync_event_t ev, const kvr_router_dispatch_t *d,
                            const kvr_worker_t *w) {
  kvr_peer_sync_t *s = ctx;
  kvr_sync_msg_t m = {0};
  if (ev == KVR_SYNC_SCRAPE) {
    m.kind = KVR_SYNC_MSG_SCRAPE;
    m.url = w->key;
    m.running = w->num_requests_running;
    m.waiting = w->num_requests_waiting;
    m.kv_cache_usage = w->kv_cache_usage;
    publish(s, &m);
    return;
  }
  kvr_sync_entry_t e = {d->id, d->prompt_tokens, d->prefill_tokens, w->key};
  m.id = d->id;
  rec_t *rec = find(s, 0, d->id);
  switch (ev) {
  case KVR_SYNC_DISPATCH:
    if (rec == NULL)
      rec = insert(s, 0, d->id);
    rec->worker_id = w->id;
    rec->prompt_tokens = d->prompt_tokens;
    rec->prefill_tokens = d->prefill_tokens;
    m.kind = KVR_SYNC_MSG_DISPATCH;
    m.entries = &e;
    m.nentries = 1;
    break;
  case KVR_SYNC_FIRST_TOKEN:
    if (rec)
      rec->prefill_tokens = 0;
    m.kind = KVR_SYNC_MSG_FIRST;
    break;
  case KVR_SYNC_END:
    if (rec)
      erase(s, rec);
    m.kind = KVR_SYNC_MSG_END;
    break;
  case KVR_SYNC_SCRAPE:
    break;
  }
  publish(s, &m);
}

static void publish_snapshot(kvr_peer_sync_t *s) {
  kvr_sync_entry_t *es = kvr_xcalloc(s->n ? s->n : 1, sizeof *es);
  size_t n = 0;
  for (size_t i = 0; i < s->cap; i++) {
    const rec_t *e = &s->tab[i];
    if (!e->used || e->owner != 0)
      continue;
    const kvr_worker_t *w = kvr_router_worker_by_id(s->r, e->worker_id);
    if (w == NULL)
      continue;
    es[n++] = (kvr_sync_entry_t){e->id, e->prompt_tokens, e->prefill_tokens, w->key};
  }
  kvr_sync_msg_t m = {.kind = KVR_SYNC_MSG_SNAPSHOT, .entries = es, .nentries = n};
  publish(s, &m);
  free(es);
}

/* ---- receiving --------------------------------------------------------------------------------
 */

static uint64_t now_ms(const kvr_peer_sync_t *s) {
  return kvr_router_now_ns(s->r) / 1000000u;
}

static void add_peer_rec(kvr_peer_sync_t *s, size_t p, const kvr_sync_entry_t *en) {
  rec_t *e = insert(s, (uint8_t)(p + 1), en->id);
  /* a snapshot entry past its first token lists prefill 0: its prompt is in, nothing ahead */
  if (kvr_router_on_peer_dispatch(s->r, p, en->url, en->prompt_tokens, en->prefill_tokens, &e->d) ==
      NULL)
    erase(s, e); /* a worker this replica does not have */
  else
    e->mark = true;
}

static void apply_snapshot(kvr_peer_sync_t *s, size_t p, const kvr_sync_msg_t *m) {
  uint8_t owner = (uint8_t)(p + 1);
  for (size_t i = 0; i < s->cap; i++)
    if (s->tab[i].used && s->tab[i].owner == owner)
      s->tab[i].mark = false;
  for (size_t k = 0; k < m->nentries; k++) {
    const kvr_sync_entry_t *en = &m->entries[k];
    rec_t *e = find(s, owner, en->id);
    if (e == NULL) {
      add_peer_rec(s, p, en);
      continue;
    }
    e->mark = true;
    if (en->prefill_tokens == 0 && e->d.generated == 0) /* its first token: missed */
      kvr_router_on_token(s->r, &e->d);
  }
  for (size_t i = 0; i < s->cap;) { /* what the peer no longer lists has ended */
    rec_t *e = &s->tab[i];
    if (e->used && e->owner == owner && !e->mark)
      end_peer_rec(s, e);
    else
      i++;
  }
  kvr_router_on_peer_sync_live(s->r, p, true);
}

static void receive_one(kvr_peer_sync_t *s, const void *data, size_t len) {
  kvr_sync_msg_t m;
  char err[160];
  if (kvr_peer_sync_decode(data, len, &m, err, sizeof err) != 0) {
    kvr_router_on_sync_skipped(s->r);
    return;
  }
  kvr_router_t *r = s->r;
  size_t p = KVR_MAX_PEERS;
  for (size_t i = 0; i < r->cfg->npeers && i < KVR_MAX_PEERS; i++)
    if (r->peer_instance[i] == m.instance && m.instance != r->instance)
      p = i;
  if (p == KVR_MAX_PEERS) { /* not (yet) a known peer: its /admin/load answer names it */
    kvr_router_on_sync_skipped(r);
    kvr_peer_sync_msg_free(&m);
    return;
  }
  if (s->inst[p] != m.instance) { /* first contact, or the peer restarted */
    drop_peer(s, p);
    s->inst[p] = m.instance;
  }
  /* a gap: the next snapshot repairs what was lost */
  kvr_router_on_peer_sync_message(r, p, s->have_seq[p] && m.seq != s->last_seq[p] + 1);
  s->have_seq[p] = true;
  s->last_seq[p] = m.seq;
  s->heard_ms[p] = now_ms(s);
  uint8_t owner = (uint8_t)(p + 1);
  rec_t *e;
  if (m.kind == KVR_SYNC_MSG_SNAPSHOT) {
    apply_snapshot(s, p, &m);
  } else if (m.kind == KVR_SYNC_MSG_SCRAPE) {
    kvr_router_on_peer_scrape(r, m.url, m.running, m.waiting, m.kv_cache_usage);
  } else if (!r->peer_sync_live[p]) {
    /* before the first snapshot the peer's load is its polled figures: nothing to adjust */
  } else if (m.kind == KVR_SYNC_MSG_DISPATCH) {
    if (find(s, owner, m.id) == NULL)
      add_peer_rec(s, p, &m.entries[0]);
  } else if ((e = find(s, owner, m.id)) != NULL) {
    if (m.kind == KVR_SYNC_MSG_FIRST && e->d.generated == 0)
      kvr_router_on_token(r, &e->d);
    else if (m.kind == KVR_SYNC_MSG_END)
      end_peer_rec(s, e);
  }
  kvr_peer_sync_msg_free(&m);
}

void kvr_peer_sync_receive(kvr_peer_sync_t *s, const void *data, size_t len) {
  const char *p = data;
  size_t off = 0;
  while (off < len) {
    size_t n = kvr_msgpack_object_size(p + off, len - off);
    if (n == 0) { /* the rest cannot be split into messages: counted once, dropped */
      kvr_router_on_sync_skipped(s->r);
      return;
    }
    receive_one(s, p + off, n);
    off += n;
  }
}

/* ---- sockets and the tick ---------------------------------------------------------------------
 */

static bool readable(void *sock) {
  int ev = 0;
  size_t len = sizeof(ev);
  return sock && zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN);
}

static void drain(kvr_peer_sync_t *s) {
  for (int rounds = 0; rounds < 100000 && !s->closing && readable(s->sub); rounds++) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s->sub, ZMQ_DONTWAIT) >= 0)
      kvr_peer_sync_receive(s, zmq_msg_data(&m), zmq_msg_size(&m));
    zmq_msg_close(&m);
  }
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain(h->data);
}

/* tcp://HOST:PORT of peer p's sync socket: its admin URL's host, its advertised port. */
static char *peer_endpoint(const kvr_router_t *r, size_t p) {
  CURLU *u = curl_url();
  char *host = NULL, *ep = NULL;
  if (curl_url_set(u, CURLUPART_URL, r->cfg->peers[p], 0) == CURLUE_OK &&
      curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK) {
    size_t n = strlen(host) + 32;
    ep = kvr_xmalloc(n);
    snprintf(ep, n, "tcp://%s:%u", host, (unsigned)r->peer_sync_port[p]);
  }
  curl_free(host);
  curl_url_cleanup(u);
  return ep;
}

void kvr_peer_sync_tick(kvr_peer_sync_t *s) {
  kvr_router_t *r = s->r;
  uint64_t now = now_ms(s);
  for (size_t p = 0; p < r->cfg->npeers && p < KVR_MAX_PEERS; p++) {
    if (r->peer_sync_live[p] && now > s->heard_ms[p] + r->cfg->peer_stale_ms) {
      KVR_WARN("peers", "peer %s: no sync for %llu ms; back to its polled load", r->cfg->peers[p],
               (unsigned long long)r->cfg->peer_stale_ms);
      drop_peer(s, p);
    }
    if (s->sub == NULL || r->peer_sync_port[p] == 0 || r->peer_instance[p] == r->instance)
      continue;
    char *ep = peer_endpoint(r, p);
    if (ep && (s->connected[p] == NULL || strcmp(ep, s->connected[p]) != 0)) {
      if (s->connected[p])
        zmq_disconnect(s->sub, s->connected[p]);
      free(s->connected[p]);
      s->connected[p] = NULL;
      if (zmq_connect(s->sub, ep) == 0) {
        KVR_INFO("peers", "peer %s: sync from %s", r->cfg->peers[p], ep);
        s->connected[p] = ep;
        ep = NULL;
      } else {
        KVR_WARN("peers", "peer %s: sync connect %s: %s", r->cfg->peers[p], ep,
                 zmq_strerror(zmq_errno()));
      }
    }
    free(ep);
  }
  publish_snapshot(s);
  drain(s);
}

static void on_tick(uv_timer_t *t) {
  kvr_peer_sync_tick(t->data);
}

kvr_peer_sync_t *kvr_peer_sync_new(uv_loop_t *loop, kvr_router_t *r, char *err, size_t errlen) {
  err[0] = '\0';
  if (r->cfg->peer_sync_listen == NULL)
    return NULL;
  kvr_peer_sync_t *s = kvr_xcalloc(1, sizeof *s);
  s->r = r;
  s->loop = loop;
  s->cap = 256;
  s->tab = kvr_xcalloc(s->cap, sizeof *s->tab);
  uint32_t port = 0; /* the bound sync port, advertised in /admin/load */
  if (loop) {
    s->ctx = zmq_ctx_new();
    s->pub = zmq_socket(s->ctx, ZMQ_PUB);
    s->sub = zmq_socket(s->ctx, ZMQ_SUB);
    int linger = 0;
    zmq_setsockopt(s->pub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->sub, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, "", 0);
    char last[256];
    size_t lastlen = sizeof last;
    const char *colon;
    if (zmq_bind(s->pub, r->cfg->peer_sync_listen) != 0 ||
        zmq_getsockopt(s->pub, ZMQ_LAST_ENDPOINT, last, &lastlen) != 0 ||
        (colon = strrchr(last, ':')) == NULL) {
      snprintf(err, errlen, "peer sync: bind %s: %s", r->cfg->peer_sync_listen,
               zmq_strerror(zmq_errno()));
      zmq_close(s->pub);
      zmq_close(s->sub);
      zmq_ctx_term(s->ctx);
      free(s->tab);
      free(s);
      return NULL;
    }
    port = (uint32_t)strtoul(colon + 1, NULL, 10);
    int fd = -1;
    size_t fdlen = sizeof fd;
    zmq_getsockopt(s->sub, ZMQ_FD, &fd, &fdlen);
    uv_poll_init(loop, &s->sub_poll, fd);
    s->sub_poll.data = s;
    uv_poll_start(&s->sub_poll, UV_READABLE, on_poll);
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    uv_timer_start(&s->timer, on_tick, r->cfg->peer_interval_ms, r->cfg->peer_interval_ms);
    uv_timer_init(loop, &s->flush_timer);
    s->flush_timer.data = s;
    s->open_handles = 3;
    KVR_INFO("peers", "announcing this replica's requests on %s (port %u)", last, (unsigned)port);
  }
  kvr_router_set_sync(r, on_router_event, s, port);
  return s;
}

void kvr_peer_sync_set_sink(kvr_peer_sync_t *s, void (*fn)(void *ctx, const void *, size_t),
                            void *ctx) {
  s->sink = fn;
  s->sink_ctx = ctx;
}

static void sync_free(kvr_peer_sync_t *s) {
  for (size_t p = 0; p < KVR_MAX_PEERS; p++)
    free(s->connected[p]);
  if (s->ctx)
    zmq_ctx_term(s->ctx); /* every socket is closed (linger 0): returns at once */
  kvr_buf_free(&s->out);
  free(s->tab);
  free(s);
}

static void on_closed(uv_handle_t *h) {
  kvr_peer_sync_t *s = h->data;
  if (--s->open_handles == 0)
    sync_free(s);
}

void kvr_peer_sync_close(kvr_peer_sync_t *s) {
  if (s == NULL || s->closing)
    return;
  s->closing = true;
  kvr_router_set_sync(s->r, NULL, NULL, 0);
  for (size_t p = 0; p < KVR_MAX_PEERS; p++)
    if (s->inst[p] || s->r->peer_sync_live[p])
      drop_peer(s, p);
  if (s->loop == NULL) {
    sync_free(s);
    return;
  }
  uv_poll_stop(&s->sub_poll);
  flush(s); /* what this iteration queued */
  zmq_close(s->sub);
  zmq_close(s->pub);
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->sub_poll, on_closed);
  uv_close((uv_handle_t *)&s->timer, on_closed);
  uv_close((uv_handle_t *)&s->flush_timer, on_closed);
}

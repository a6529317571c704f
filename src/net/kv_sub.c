/* kv_sub.c -- one worker's KV-event stream on the libuv loop (see kv_sub.h).
 *
 * Handles: two uv_poll_t on the sockets' ZMQ_FD (SUB, and DEALER once a replay was asked) and one
 * uv_timer_t (the replay deadline). ZMQ_FD only says "look at ZMQ_EVENTS", edge-triggered, and
 * any call on a socket may consume the edge, so every wake-up and every send ends in drain(),
 * which reads both sockets until neither has ZMQ_POLLIN.
 *
 * State: have_last/last (the newest batch applied), replaying (a request is out: live batches are
 * held in `held`, a ring of copies, and applied after the reply stream ends), fallback/reset_ms
 * (why the stream is not complete and since when). Every path that gives up on completeness goes
 * through reset(): on_reset() to the router, fallback reason, reset time.
 */
#include "net/kv_sub.h"

#include "base/kvr.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define END_SEQ UINT64_MAX

static const char *const fallback_names[] = {
#define KVR__KV_FB_STR(name, str) str,
    KVR_KV_FALLBACK_MAP(KVR__KV_FB_STR)
#undef KVR__KV_FB_STR
};

const char *kvr_kv_fallback_name(kvr_kv_fallback_t f) {
  return (unsigned)f < KVR_KV_FALLBACK_COUNT ? fallback_names[f] : "?";
}

typedef struct held_s {
  uint64_t seq;
  void *data;
  size_t len;
} held_t;

struct kvr_kv_sub_s {
  uv_loop_t *loop;
  kvr_kv_sub_opts_t opts;
  char *endpoint, *replay_endpoint, *topic;
  kvr_kv_sub_cbs_t cbs;
  void *sub, *dealer;
  uv_poll_t sub_poll, dealer_poll;
  uv_timer_t timer;
  bool closing;
  int open_handles;
  /* sequence state */
  bool have_last;
  uint64_t last;
  bool replaying;
  uint64_t replay_start;
  bool replay_got_any;
  held_t *held;
  size_t nheld, held_head;
  /* completeness */
  kvr_kv_fallback_t fallback;
  uint64_t reset_ms;
  kvr_kv_batch_t batch; /* decode scratch, reused */
  kvr_kv_stream_stats_t st;
};

static void drain(kvr_kv_sub_t *s);

static void reset(kvr_kv_sub_t *s, kvr_kv_fallback_t why) {
  s->st.resets++;
  s->fallback = why;
  s->reset_ms = (uint64_t)kvr_now_ms();
  KVR_WARN("kv", "%s: events incomplete (%s): worker's precise index cleared", s->endpoint,
           kvr_kv_fallback_name(why));
  if (s->cbs.on_reset)
    s->cbs.on_reset(s->cbs.data);
}

/* Decodes and applies one batch; last moves to seq. A payload that is not a batch loses its events:
 * the stream is no longer complete. */
static void apply(kvr_kv_sub_t *s, uint64_t seq, const void *data, size_t len) {
  char err[128];
  s->have_last = true;
  s->last = seq;
  s->st.last_seq = seq;
  if (kvr_kv_decode_batch(data, len, &s->batch, err, sizeof(err)) != 0) {
    s->st.decode_errors++;
    KVR_WARN("kv", "%s: batch %llu: %s", s->endpoint, (unsigned long long)seq, err);
    reset(s, KVR_KV_FALLBACK_DECODE);
    return;
  }
  s->st.batches++;
  s->st.events += s->batch.nev;
  for (int i = 0; i < KVR_KV_SKIP_COUNT; i++)
    s->st.skipped[i] += s->batch.skipped[i];
  if (s->cbs.on_batch)
    s->cbs.on_batch(s->cbs.data, &s->batch);
}

/* ---- replay ---- */

static void held_clear(kvr_kv_sub_t *s) {
  for (size_t i = 0; i < s->nheld; i++)
    free(s->held[(s->held_head + i) % s->opts.max_held].data);
  s->nheld = s->held_head = 0;
}

static void hold(kvr_kv_sub_t *s, uint64_t seq, const void *data, size_t len);
static void on_live(kvr_kv_sub_t *s, uint64_t seq, const void *data, size_t len);
static void start_replay(kvr_kv_sub_t *s, uint64_t from);

/* The reply stream ended (ok) or was abandoned: leave replay mode, decide whether the history is
 * still complete, then apply the live batches held meanwhile in order (one of them may start a
 * new replay: the rest are then held again). */
static void replay_done(kvr_kv_sub_t *s, bool ok) {
  uv_timer_stop(&s->timer);
  s->replaying = false;
  if (!s->have_last && s->fallback == KVR_KV_FALLBACK_WAITING && s->nheld == 0) {
    /* the first-contact probe: an empty answer means the publisher has sent nothing yet (a fresh
     * engine, an empty cache): the history is complete. No answer: it may not be up yet; ask
     * again (the live stream's first batch also settles it). */
    if (ok) {
      s->fallback = KVR_KV_FALLBACK_NONE;
      s->have_last = s->replay_got_any;
    } else {
      start_replay(s, 0);
    }
    return;
  }
  bool evicted = ok && !s->replay_got_any && s->nheld > 0 &&
                 (!s->have_last || s->last + 1 < s->held[s->held_head].seq);
  if (!ok || evicted) {
    s->st.replay_failures++;
    s->have_last = false;
    reset(s, ok ? KVR_KV_FALLBACK_EVICTED : KVR_KV_FALLBACK_REPLAY_TIMEOUT);
  }
  size_t n = s->nheld, head = s->held_head;
  held_t *copy = kvr_xcalloc(n ? n : 1, sizeof(held_t));
  for (size_t i = 0; i < n; i++)
    copy[i] = s->held[(head + i) % s->opts.max_held];
  s->nheld = s->held_head = 0;
  for (size_t i = 0; i < n; i++) {
    if (s->replaying)
      hold(s, copy[i].seq, copy[i].data, copy[i].len);
    else if (s->have_last && copy[i].seq <= s->last)
      s->st.duplicates++; /* the replay already brought it */
    else
      on_live(s, copy[i].seq, copy[i].data, copy[i].len);
    free(copy[i].data);
  }
  free(copy);
}

static void on_replay_timer(uv_timer_t *t) {
  kvr_kv_sub_t *s = t->data;
  KVR_WARN("kv", "%s: replay from %llu not answered in %llu ms", s->endpoint,
           (unsigned long long)s->replay_start, (unsigned long long)s->opts.replay_timeout_ms);
  replay_done(s, false);
  drain(s);
}

static void on_poll(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  drain(p->data);
}

static void start_replay(kvr_kv_sub_t *s, uint64_t from) {
  s->st.replays++;
  s->replaying = true;
  s->replay_start = from;
  s->replay_got_any = false;
  unsigned char b[8];
  for (int i = 7; i >= 0; i--)
    b[i] = (unsigned char)(from >> (8 * (7 - i)));
  if (zmq_send(s->dealer, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
      zmq_send(s->dealer, b, 8, ZMQ_DONTWAIT) < 0) {
    KVR_WARN("kv", "%s: replay request failed: %s", s->replay_endpoint, zmq_strerror(zmq_errno()));
    replay_done(s, false);
    return;
  }
  uv_timer_start(&s->timer, on_replay_timer, s->opts.replay_timeout_ms, 0);
}

static void hold(kvr_kv_sub_t *s, uint64_t seq, const void *data, size_t len) {
  if (s->nheld == s->opts.max_held) {
    /* the replay is too slow for the live rate: give up on it (the held ones are applied after
     * the reset), then take this one as live */
    replay_done(s, false);
    on_live(s, seq, data, len);
    return;
  }
  held_t *h = &s->held[(s->held_head + s->nheld++) % s->opts.max_held];
  h->seq = seq;
  h->len = len;
  h->data = kvr_xmalloc(len ? len : 1);
  memcpy(h->data, data, len);
}

/* One live batch, by the rules of the header. */
static void on_live(kvr_kv_sub_t *s, uint64_t seq, const void *data, size_t len) {
  if (s->replaying) {
    hold(s, seq, data, len);
    return;
  }
  if (s->have_last && seq <= s->last) {
    s->st.restarts++;
    s->have_last = false;
    reset(s, KVR_KV_FALLBACK_RESTART);
  }
  if (!s->have_last) {
    bool first_contact =
        s->fallback == KVR_KV_FALLBACK_WAITING || s->fallback == KVR_KV_FALLBACK_RESTART;
    if (seq == 0) {
      s->fallback = KVR_KV_FALLBACK_NONE; /* a publisher's whole history, from its start */
      apply(s, seq, data, len);
    } else if (first_contact && s->dealer) {
      hold(s, seq, data, len); /* ask for what came before */
      start_replay(s, 0);
    } else {
      if (s->fallback == KVR_KV_FALLBACK_WAITING)
        reset(s, KVR_KV_FALLBACK_NO_HISTORY);
      apply(s, seq, data, len); /* after a reset: the stream starts again here */
    }
    return;
  }
  if (seq == s->last + 1) {
    apply(s, seq, data, len);
    return;
  }
  s->st.gaps++;
  if (s->dealer) {
    hold(s, seq, data, len);
    start_replay(s, s->last + 1);
  } else {
    reset(s, KVR_KV_FALLBACK_GAP);
    apply(s, seq, data, len);
  }
}

/* One reply of the replay stream: frames after the DEALER's empty delimiter. */
static void on_reply(kvr_kv_sub_t *s, zmq_msg_t *f, int n) {
  /* ["", topic, seq, payload] or ["", seq, payload] */
  int seq_at = n == 4 ? 2 : n == 3 ? 1 : -1;
  if (!s->replaying || seq_at < 0 || zmq_msg_size(&f[seq_at]) != 8) {
    KVR_WARN("kv", "%s: unexpected replay message (%d frames) ignored", s->replay_endpoint, n);
    return;
  }
  const unsigned char *b = zmq_msg_data(&f[seq_at]);
  uint64_t seq = 0;
  for (int i = 0; i < 8; i++)
    seq = seq << 8 | b[i];
  if (seq == END_SEQ) {
    replay_done(s, true);
    return;
  }
  if (!s->replay_got_any && seq > s->replay_start) {
    s->st.replay_failures++;
    s->have_last = false;
    reset(s, KVR_KV_FALLBACK_EVICTED);
  }
  s->replay_got_any = true;
  if (s->have_last && seq <= s->last) {
    s->st.duplicates++;
    return;
  }
  if (!s->have_last && seq == 0)
    s->fallback = KVR_KV_FALLBACK_NONE; /* joined late, but the buffer still had everything */
  apply(s, seq, zmq_msg_data(&f[seq_at + 1]), zmq_msg_size(&f[seq_at + 1]));
}

/* Reads one multipart message into f (at most 4 frames kept); returns the frame count, 0 if
 * none was waiting. */
static int recv_multi(void *sock, zmq_msg_t f[4]) {
  int n = 0, more = 0;
  do {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      break;
    }
    more = zmq_msg_more(&m);
    if (n < 4)
      f[n++] = m;
    else {
      zmq_msg_close(&m);
      n = 5; /* too many frames: reported as such */
    }
  } while (more);
  return n;
}

static bool readable(void *sock) {
  int ev = 0;
  size_t len = sizeof(ev);
  return sock && zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &len) == 0 && (ev & ZMQ_POLLIN);
}

static void drain(kvr_kv_sub_t *s) {
  for (int rounds = 0; rounds < 100000 && !s->closing; rounds++) {
    zmq_msg_t f[4];
    if (readable(s->sub)) {
      int n = recv_multi(s->sub, f);
      if (n == 3 && zmq_msg_size(&f[1]) == 8) {
        const unsigned char *b = zmq_msg_data(&f[1]);
        uint64_t seq = 0;
        for (int i = 0; i < 8; i++)
          seq = seq << 8 | b[i];
        on_live(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]));
      } else if (n > 0) {
        KVR_WARN("kv", "%s: message of %d frames ignored (want topic, seq, payload)", s->endpoint,
                 n);
      }
      for (int i = 0; i < n && i < 4; i++)
        zmq_msg_close(&f[i]);
      continue;
    }
    if (readable(s->dealer)) {
      int n = recv_multi(s->dealer, f);
      if (n >= 3 && n <= 4 && zmq_msg_size(&f[0]) == 0)
        on_reply(s, f, n);
      else if (n > 0)
        KVR_WARN("kv", "%s: replay message of %d frames ignored", s->replay_endpoint, n);
      for (int i = 0; i < n && i < 4; i++)
        zmq_msg_close(&f[i]);
      continue;
    }
    return;
  }
}

/* ---- lifetime ---- */

static int open_socket(kvr_kv_sub_t *s, void *ctx, int type, const char *ep, void **out,
                       uv_poll_t *poll, char *err, size_t errlen) {
  void *sock = zmq_socket(ctx, type);
  int linger = 0;
  zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
  int ipv6 = 1; /* tcp://[ADDR]:PORT endpoints too (discovered IPv6 workers); IPv4 still works */
  zmq_setsockopt(sock, ZMQ_IPV6, &ipv6, sizeof(ipv6));
  if (type == ZMQ_SUB) {
    const char *t = s->topic ? s->topic : "";
    zmq_setsockopt(sock, ZMQ_SUBSCRIBE, t, strlen(t));
  }
  if (zmq_connect(sock, ep) != 0) {
    snprintf(err, errlen, "kv events: connect %s: %s", ep, zmq_strerror(zmq_errno()));
    zmq_close(sock);
    return -1;
  }
  int fd = -1;
  size_t fdlen = sizeof(fd);
  zmq_getsockopt(sock, ZMQ_FD, &fd, &fdlen);
  uv_poll_init(s->loop, poll, fd);
  poll->data = s;
  uv_poll_start(poll, UV_READABLE, on_poll);
  s->open_handles++;
  *out = sock;
  return 0;
}

kvr_kv_sub_t *kvr_kv_sub_new(uv_loop_t *loop, void *zmq_ctx, const kvr_kv_sub_opts_t *opts,
                             const kvr_kv_sub_cbs_t *cbs, char *err, size_t errlen) {
  kvr_kv_sub_t *s = kvr_xcalloc(1, sizeof(*s));
  s->loop = loop;
  s->opts = *opts;
  if (s->opts.replay_timeout_ms == 0)
    s->opts.replay_timeout_ms = 2000;
  if (s->opts.refill_ms == 0)
    s->opts.refill_ms = 30000;
  if (s->opts.max_held == 0)
    s->opts.max_held = 10000;
  s->endpoint = kvr_xstrdup(opts->endpoint);
  s->replay_endpoint = kvr_xstrdup(opts->replay_endpoint);
  s->topic = kvr_xstrdup(opts->topic);
  s->cbs = *cbs;
  s->fallback = KVR_KV_FALLBACK_WAITING;
  s->held = kvr_xcalloc(s->opts.max_held, sizeof(held_t));
  uv_timer_init(loop, &s->timer);
  s->timer.data = s;
  s->open_handles = 1;
  if (open_socket(s, zmq_ctx, ZMQ_SUB, s->endpoint, &s->sub, &s->sub_poll, err, errlen) != 0 ||
      (s->replay_endpoint && open_socket(s, zmq_ctx, ZMQ_DEALER, s->replay_endpoint, &s->dealer,
                                         &s->dealer_poll, err, errlen) != 0)) {
    kvr_kv_sub_close(s);
    return NULL;
  }
  /* ZMQ runs a socket's pending commands (here: sending the subscription) only inside calls on
   * it, and ZMQ_FD signals edges only: look once now, before any wake-up. */
  (void)readable(s->sub);
  (void)readable(s->dealer);
  /* With a replay socket, ask for the whole history at once: it brings what the engine cached
   * before the router started, or says there is none. */
  if (s->dealer)
    start_replay(s, 0);
  return s;
}

static void sub_free(kvr_kv_sub_t *s) {
  held_clear(s);
  free(s->held);
  kvr_kv_batch_free(&s->batch);
  free(s->endpoint);
  free(s->replay_endpoint);
  free(s->topic);
  free(s);
}

static void on_handle_closed(uv_handle_t *h) {
  kvr_kv_sub_t *s = h->data;
  if (--s->open_handles == 0)
    sub_free(s);
}

void kvr_kv_sub_close(kvr_kv_sub_t *s) {
  if (s == NULL || s->closing)
    return;
  s->closing = true;
  uv_timer_stop(&s->timer);
  uv_close((uv_handle_t *)&s->timer, on_handle_closed);
  if (s->sub) {
    uv_poll_stop(&s->sub_poll);
    zmq_close(s->sub);
    uv_close((uv_handle_t *)&s->sub_poll, on_handle_closed);
  }
  if (s->dealer) {
    uv_poll_stop(&s->dealer_poll);
    zmq_close(s->dealer);
    uv_close((uv_handle_t *)&s->dealer_poll, on_handle_closed);
  }
}

kvr_kv_fallback_t kvr_kv_sub_mode(const kvr_kv_sub_t *s, uint64_t now_ms) {
  if (s->fallback == KVR_KV_FALLBACK_NONE || s->fallback == KVR_KV_FALLBACK_WAITING)
    return s->fallback;
  if (s->replaying || now_ms < s->reset_ms + s->opts.refill_ms)
    return s->fallback;
  return KVR_KV_FALLBACK_NONE;
}

const kvr_kv_stream_stats_t *kvr_kv_sub_stats(const kvr_kv_sub_t *s) {
  return &s->st;
}

bool kvr_kv_sub_replaying(const kvr_kv_sub_t *s) {
  return s->replaying;
}

/* curlm.c -- libcurl multi-socket API on a libuv loop (after curl's docs/examples/multi-uv.c).
 *
 * Structures:
 *   kvr_curlm_t    the CURLM, one uv_timer_t for curl's timeout, the count of active transfers.
 *   sock_ctx_t     one uv_poll_t per socket curl wants watched (CURLMOPT_SOCKETFUNCTION), attached
 *                  to the socket with curl_multi_assign() and freed in the poll's close callback.
 *                  Sockets of connections (CURLOPT_OPENSOCKETFUNCTION / CLOSESOCKETFUNCTION, set
 *                  on every transfer) keep theirs for the connection's whole life, in m->fds by
 *                  descriptor: curl removes a pooled socket after every transfer
 *                  (CURL_POLL_REMOVE) and forgets its curl_multi_assign() pointer; the next
 *                  transfer on the same connection finds the context in m->fds again, so the poll
 *                  handle is created (an epoll probe and FIONBIO) once per connection and its epoll
 *                  registration stays (readable) while the connection idles in the pool, the
 *                  handle unreferenced (uv_unref) so that idle connections never keep the loop
 *                  running.
 *   xfer_t         per easy handle: the done callback and its data, reached through
 * CURLOPT_PRIVATE.
 *
 * Flow: curl tells us which sockets and events to watch and when to time out; libuv tells us when a
 * socket is ready or the timer fired; we call curl_multi_socket_action() and then drain
 * curl_multi_info_read() for finished transfers, removing each from the multi before calling its
 * done callback (so the callback may free the easy handle).
 *
 * Invariant: an easy handle is removed from the multi exactly once: by check_done() when curl says
 * it finished, or by kvr_curlm_cancel(). Never inside a curl callback (curl forbids that).
 *
 * Invariant: a poll handle never outlives its descriptor. A connection socket is opened by
 * on_open_socket() (its context goes into m->fds) and closed only by on_close_socket(), which
 * closes the poll handle and then the descriptor (libuv allows closing the fd right after
 * uv_close()), so a descriptor number curl or the loop reuses afterwards never meets a stale
 * handle. Other sockets curl asks us to watch (the threaded resolver's socketpair) are closed by
 * curl itself, always after CURL_POLL_REMOVE: their context is closed at that REMOVE, as before.
 * An idle pooled socket that turns readable (the server closed it, or sent something unasked) has
 * its poll stopped (level-triggered epoll would report it on every loop turn); curl sees the dead
 * connection itself at its next reuse check and closes it through on_close_socket().
 */
#include "net/curlm.h"

#include "base/kvr.h"
#include "base/list.h"
#include "base/log.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct sock_ctx_s sock_ctx_t;
typedef struct xfer_s xfer_t;

struct kvr_curlm_s {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  size_t active;
  kvr_list_t xfers; /* transfers in the multi (xfer_t.node), so close can detach them */
  kvr_list_t socks; /* sockets with a poll handle (sock_ctx_t.node), so close can stop any left */
  sock_ctx_t **fds; /* by descriptor: contexts of the sockets on_open_socket() opened */
  size_t nfds;      /* entries of fds */
  int closing_handles; /* uv close callbacks still to run */
  bool closing;
};

struct sock_ctx_s {
  uv_poll_t poll;
  curl_socket_t fd;
  kvr_curlm_t *m;
  kvr_list_t node; /* in m->socks while poll is initialised and not closing */
  bool has_poll;   /* poll initialised (the first time curl asked to watch the socket) */
  bool owned;      /* opened by on_open_socket(): in m->fds until on_close_socket() */
  bool pooled;     /* curl removed it (CURL_POLL_REMOVE): no transfer uses it now */
  int events;      /* UV_READABLE/UV_WRITABLE the poll is started with, 0 when stopped */
};

struct xfer_s {
  kvr_curlm_done_cb done;
  void *data;
  CURL *easy;
  kvr_list_t node; /* in m->xfers while in the multi */
};

static void check_done(kvr_curlm_t *m) {
  CURLMsg *msg;
  int left;
  while ((msg = curl_multi_info_read(m->multi, &left)) != NULL) {
    if (msg->msg != CURLMSG_DONE)
      continue;
    CURL *easy = msg->easy_handle;
    CURLcode result = msg->data.result;
    xfer_t *x = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    curl_multi_remove_handle(m->multi, easy);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
    m->active--;
    if (x) {
      kvr_list_remove(&x->node);
      kvr_curlm_done_cb done = x->done;
      void *data = x->data;
      free(x);
      if (done)
        done(easy, result, data);
    }
  }
}

static void poll_set(sock_ctx_t *ctx, int events);

static void on_poll(uv_poll_t *p, int status, int events) {
  sock_ctx_t *ctx = p->data;
  kvr_curlm_t *m = ctx->m;
  if (ctx->pooled) {
    /* Idle in curl's pool: curl is not watching it and will check it before any reuse. */
    poll_set(ctx, 0);
    return;
  }
  int flags = 0;
  if (status < 0)
    flags = CURL_CSELECT_ERR;
  if (events & UV_READABLE)
    flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE)
    flags |= CURL_CSELECT_OUT;
  int running;
  curl_multi_socket_action(m->multi, ctx->fd, flags, &running);
  check_done(m);
}

static void on_timeout(uv_timer_t *t) {
  kvr_curlm_t *m = t->data;
  int running;
  curl_multi_socket_action(m->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  check_done(m);
}

/* CURLMOPT_TIMERFUNCTION: -1 deletes the timer, 0 means "call socket_action soon". */
static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp) {
  kvr_curlm_t *m = userp;
  (void)multi;
  if (timeout_ms < 0)
    uv_timer_stop(&m->timer);
  else
    uv_timer_start(&m->timer, on_timeout, (uint64_t)(timeout_ms == 0 ? 0 : timeout_ms), 0);
  return 0;
}

/* m is freed once it is closing and no uv close callback is pending: every close is counted,
 * whenever it was started, so no callback can run after the free. */
static void maybe_free(kvr_curlm_t *m) {
  if (m->closing && m->closing_handles == 0)
    free(m);
}

static void on_sock_close(uv_handle_t *h) {
  sock_ctx_t *ctx = h->data;
  kvr_curlm_t *m = ctx->m;
  free(ctx);
  m->closing_handles--;
  maybe_free(m);
}

/* Closes ctx's poll handle (ctx is freed in the close callback), or frees ctx if it has none. */
static void sock_close(kvr_curlm_t *m, sock_ctx_t *ctx) {
  if (!ctx->has_poll) {
    free(ctx);
    return;
  }
  kvr_list_remove(&ctx->node);
  ctx->has_poll = false;
  m->closing_handles++;
  uv_close((uv_handle_t *)&ctx->poll, on_sock_close); /* stops the poll too */
}

/* Starts the poll with events, or stops it (0); libuv changes the epoll registration only when
 * events differ from what it has. */
static void poll_set(sock_ctx_t *ctx, int events) {
  if (events == ctx->events)
    return;
  ctx->events = events;
  if (events == 0)
    uv_poll_stop(&ctx->poll);
  else
    uv_poll_start(&ctx->poll, events, on_poll);
}

/* The context of a connection socket on_open_socket() opened, or NULL. */
static sock_ctx_t *owned_ctx(const kvr_curlm_t *m, curl_socket_t s) {
  return s >= 0 && (size_t)s < m->nfds ? m->fds[s] : NULL;
}

/* CURLOPT_OPENSOCKETFUNCTION: a connection's socket, as curl would open it, remembered in m->fds so
 * its poll handle can outlive the transfers that use it. */
static curl_socket_t on_open_socket(void *clientp, curlsocktype purpose,
                                    struct curl_sockaddr *address) {
  kvr_curlm_t *m = clientp;
  (void)purpose;
  curl_socket_t s = socket(address->family, address->socktype, address->protocol);
  if (s == CURL_SOCKET_BAD)
    return s;
  if ((size_t)s >= m->nfds) {
    size_t n = m->nfds ? m->nfds : 64;
    while (n <= (size_t)s)
      n *= 2;
    m->fds = kvr_xrealloc(m->fds, n * sizeof *m->fds);
    memset(m->fds + m->nfds, 0, (n - m->nfds) * sizeof *m->fds);
    m->nfds = n;
  }
  if (m->fds[s] != NULL) {
    /* Only if curl closed a connection without on_close_socket(): never seen, but a handle left
     * on this number would watch the new socket. */
    KVR_WARN("curl", "socket %d reopened without being closed through curl's callback", (int)s);
    sock_close(m, m->fds[s]);
  }
  sock_ctx_t *ctx = kvr_xcalloc(1, sizeof *ctx);
  ctx->fd = s;
  ctx->m = m;
  ctx->owned = true;
  m->fds[s] = ctx;
  return s;
}

/* CURLOPT_CLOSESOCKETFUNCTION: curl is done with a connection (after CURL_POLL_REMOVE if it was
 * watched). The poll handle is closed before the descriptor, as libuv requires. */
static int on_close_socket(void *clientp, curl_socket_t s) {
  kvr_curlm_t *m = clientp;
  sock_ctx_t *ctx = owned_ctx(m, s);
  if (ctx) {
    m->fds[s] = NULL;
    sock_close(m, ctx);
  }
  return close(s);
}

/* CURLMOPT_SOCKETFUNCTION: start, change or stop watching one socket. */
static int on_curl_socket(CURL *easy, curl_socket_t s, int action, void *userp, void *socketp) {
  kvr_curlm_t *m = userp;
  sock_ctx_t *ctx = socketp;
  (void)easy;
  if (action == CURL_POLL_REMOVE) {
    if (ctx == NULL)
      return 0;
    curl_multi_assign(m->multi, s, NULL);
    if (!ctx->owned) {
      sock_close(m, ctx); /* curl closes this one itself, right after */
      return 0;
    }
    /* A pooled connection: keep the poll, readable only (an idle socket is always writable), so
     * the next transfer on it usually changes nothing. */
    ctx->pooled = true;
    poll_set(ctx, ctx->events & UV_READABLE);
    uv_unref((uv_handle_t *)&ctx->poll); /* an idle connection does not keep the loop running */
    return 0;
  }
  if (ctx == NULL)
    ctx = owned_ctx(m, s);
  if (ctx == NULL) {
    ctx = kvr_xcalloc(1, sizeof *ctx);
    ctx->fd = s;
    ctx->m = m;
  }
  if (!ctx->has_poll) {
    if (uv_poll_init_socket(m->loop, &ctx->poll, s) != 0) {
      if (!ctx->owned)
        free(ctx);
      return -1;
    }
    ctx->poll.data = ctx;
    ctx->has_poll = true;
    ctx->events = 0;
    kvr_list_insert_head(&m->socks, &ctx->node);
  }
  ctx->pooled = false;
  uv_ref((uv_handle_t *)&ctx->poll);
  curl_multi_assign(m->multi, s, ctx);
  int events = 0;
  if (action == CURL_POLL_IN || action == CURL_POLL_INOUT)
    events |= UV_READABLE;
  if (action == CURL_POLL_OUT || action == CURL_POLL_INOUT)
    events |= UV_WRITABLE;
  poll_set(ctx, events);
  return 0;
}

kvr_curlm_t *kvr_curlm_new(uv_loop_t *loop) {
  static bool global_init;
  if (!global_init) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      return NULL;
    global_init = true;
  }
  kvr_curlm_t *m = kvr_xcalloc(1, sizeof *m);
  m->loop = loop;
  kvr_list_init(&m->xfers);
  kvr_list_init(&m->socks);
  m->multi = curl_multi_init();
  if (m->multi == NULL) {
    free(m);
    return NULL;
  }
  uv_timer_init(loop, &m->timer);
  m->timer.data = m;
  curl_multi_setopt(m->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
  curl_multi_setopt(m->multi, CURLMOPT_SOCKETDATA, m);
  curl_multi_setopt(m->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
  curl_multi_setopt(m->multi, CURLMOPT_TIMERDATA, m);
  /* Keep enough idle connections to every worker for the concurrency a router sees. */
  curl_multi_setopt(m->multi, CURLMOPT_MAXCONNECTS, 1024L);
  return m;
}

void kvr_curlm_set_limits(kvr_curlm_t *m, long max_total, long max_per_host) {
  curl_multi_setopt(m->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, max_total);
  curl_multi_setopt(m->multi, CURLMOPT_MAX_HOST_CONNECTIONS, max_per_host);
}

int kvr_curlm_add(kvr_curlm_t *m, CURL *easy, kvr_curlm_done_cb done, void *data) {
  if (m->closing)
    return KVR_ECLOSED;
  xfer_t *x = kvr_xmalloc(sizeof *x);
  x->done = done;
  x->data = data;
  x->easy = easy;
  curl_easy_setopt(easy, CURLOPT_PRIVATE, (char *)x);
  /* Never reuse a connection that sat idle long enough for the server to be closing it: a request
   * written into a connection the server closes at that instant fails with a send error (seen
   * once in 46,440 bench requests against the router's 75 s keep-alive), and vLLM's uvicorn
   * closes idle connections after 5 s. */
  curl_easy_setopt(easy, CURLOPT_MAXAGE_CONN, KVR_CURL_MAX_IDLE_S);
  /* Connection sockets go through m (sock_ctx_t): their poll handles live as long as they do. */
  curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
  curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, m);
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
  curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, m);
  if (curl_multi_add_handle(m->multi, easy) != CURLM_OK) {
    curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
    free(x);
    return KVR_EIO;
  }
  kvr_list_insert_head(&m->xfers, &x->node);
  m->active++;
  return 0;
}

void kvr_curlm_cancel(kvr_curlm_t *m, CURL *easy) {
  xfer_t *x = NULL;
  curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
  if (x == NULL)
    return; /* not ours, or already finished */
  curl_multi_remove_handle(m->multi, easy);
  curl_easy_setopt(easy, CURLOPT_PRIVATE, NULL);
  kvr_list_remove(&x->node);
  free(x);
  m->active--;
}

size_t kvr_curlm_active(const kvr_curlm_t *m) {
  return m->active;
}

static void on_close_handle(uv_handle_t *h) {
  kvr_curlm_t *m = h->data;
  m->closing_handles--;
  maybe_free(m);
}

void kvr_curlm_close(kvr_curlm_t *m) {
  if (m == NULL || m->closing)
    return;
  m->closing = true;
  m->closing_handles++; /* the timer */
  /* Easy handles still attached belong to their callers: detach them without callbacks. Cleaning up
   * the multi closes its cached connections, reported through CURL_POLL_REMOVE; any socket curl
   * did not report is stopped here. */
  while (!kvr_list_empty(&m->xfers))
    kvr_curlm_cancel(m, KVR_CONTAINER_OF(m->xfers.next, xfer_t, node)->easy);
  curl_multi_cleanup(m->multi);
  m->multi = NULL;
  /* curl closed the connections it opened (on_close_socket); any left is not ours to close. */
  for (size_t i = 0; i < m->nfds; i++) {
    sock_ctx_t *ctx = m->fds[i];
    m->fds[i] = NULL;
    if (ctx)
      sock_close(m, ctx);
  }
  while (!kvr_list_empty(&m->socks))
    sock_close(m, KVR_CONTAINER_OF(m->socks.next, sock_ctx_t, node));
  free(m->fds);
  m->fds = NULL;
  m->nfds = 0;
  uv_close((uv_handle_t *)&m->timer, on_close_handle);
}

static size_t discard(char *ptr, size_t size, size_t nmemb, void *data) {
  (void)ptr;
  (void)data;
  return size * nmemb;
}

/* The CA bundle of https:// transfers (kvr_curl_set_ca_file()), or NULL: libcurl's default. */
static char *ca_file;

void kvr_curl_set_ca_file(const char *path) {
  free(ca_file);
  ca_file = path ? kvr_xstrdup(path) : NULL;
}

CURL *kvr_curl_easy_new(const char *url, long connect_timeout_ms, long timeout_ms,
                        curl_write_callback write, void *data) {
  CURL *e = curl_easy_init();
  if (e == NULL)
    kvr_oom("curl_easy_init", 0);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https"); /* workers may be https:// */
  /* Workers, peers and tokenizers are reached directly: "" disables proxies, so http_proxy,
   * HTTPS_PROXY or ALL_PROXY in the router's environment (common in pods with an egress proxy)
   * never sends worker traffic through one, and libcurl skips its environment lookups on every
   * transfer. */
  curl_easy_setopt(e, CURLOPT_PROXY, "");
  if (ca_file != NULL)
    curl_easy_setopt(e, CURLOPT_CAINFO, ca_file);
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  if (connect_timeout_ms > 0)
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms);
  if (timeout_ms > 0)
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, write ? write : discard);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, data);
  return e;
}

struct curl_slist *kvr_curl_slist_append(struct curl_slist *l, const char *line) {
  struct curl_slist *n = curl_slist_append(l, line);
  if (n == NULL)
    kvr_oom("curl_slist_append", strlen(line));
  return n;
}

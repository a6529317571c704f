/* test_curlm.c -- src/net/curlm.c (libcurl's multi-socket API on a libuv loop) against a real HTTP
 * server (src/net/http_server.c) on 127.0.0.1, both on the test thread's loop.
 *
 * The server answers every request with "<METHOD> <body bytes> <target>" (no body for HEAD). The
 * cases check what the per-connection poll handles must get right:
 *   - kept-alive connections: many transfers in a row reuse one connection and all succeed;
 *   - descriptor reuse: transfers that close their connection ("Connection: close") open the next
 *     one on the descriptor just freed, and each still gets its answer (a poll handle left on the
 *     old socket would watch the new one, or be double-registered);
 *   - concurrent transfers over several connections, then all of them again on the pool;
 *   - a pooled connection the server closes while idle: the loop does not spin on the readable
 *     socket, and the next transfer to a new server works;
 *   - an idle pooled connection keeps its poll handle, unreferenced (it must not keep a finished
 *     client's uv_run() going);
 *   - kvr_curlm_close() with connections in the pool: every handle closes (uv_loop_close() == 0;
 *     ASan runs check nothing leaks).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "net/curlm.h"
#include "net/http_server.h"

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uv_loop_t loop;
  kvr_http_server_t *srv;
  int port;
  kvr_curlm_t *m;
  int requests; /* seen by the server */
  bool srv_closed;
} env_t;

typedef struct {
  env_t *env;
  kvr_buf_t body;
  struct curl_slist *hdrs;
  CURLcode rc;
  long status;
  curl_off_t connects; /* CURLINFO_NUM_CONNECTS: 0 when a pooled connection was reused */
  bool done;
} xfer_t;

static void on_request(kvr_http_req_t *req, void *data) {
  env_t *env = data;
  env->requests++;
  char out[512];
  int n = snprintf(out, sizeof out, "%s %zu %s", req->method_str, req->body.len, req->target);
  kvr_http_respond(req, 200, "text/plain", NULL, out, (size_t)n);
}

static void srv_start(env_t *env) {
  kvr_http_limits_t lim;
  kvr_http_limits_default(&lim);
  env->srv = kvr_http_server_new(&env->loop, &lim, on_request, env);
  char err[256];
  assert_int_equal(kvr_http_server_listen(env->srv, "127.0.0.1:0", err, sizeof err), 0);
  env->port = kvr_http_server_port(env->srv);
  env->srv_closed = false;
}

static void on_srv_closed(void *data) {
  ((env_t *)data)->srv_closed = true;
}

static void srv_stop(env_t *env) {
  kvr_http_server_close(env->srv, on_srv_closed, env);
  while (!env->srv_closed)
    uv_run(&env->loop, UV_RUN_ONCE);
  kvr_http_server_free(env->srv);
  env->srv = NULL;
}

static void env_init(env_t *env) {
  memset(env, 0, sizeof *env);
  assert_int_equal(uv_loop_init(&env->loop), 0);
  srv_start(env);
  env->m = kvr_curlm_new(&env->loop);
  assert_non_null(env->m);
}

static void env_free(env_t *env) {
  kvr_curlm_close(env->m);
  if (env->srv)
    srv_stop(env);
  uv_run(&env->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&env->loop), 0);
}

static size_t on_write(char *ptr, size_t size, size_t n, void *data) {
  kvr_buf_append(&((xfer_t *)data)->body, ptr, size * n);
  return size * n;
}

static void on_done(CURL *easy, CURLcode rc, void *data) {
  xfer_t *x = data;
  x->rc = rc;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &x->status);
  curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &x->connects);
  curl_easy_cleanup(easy);
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
  x->done = true;
}

/* Starts a POST of body (or a GET when body is NULL) to target; close asks for Connection: close.
 */
static void xfer_start(env_t *env, xfer_t *x, const char *target, const char *body, bool close) {
  memset(x, 0, sizeof *x);
  x->env = env;
  char url[256];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", env->port, target);
  CURL *e = kvr_curl_easy_new(url, 2000, 5000, on_write, x);
  if (body) {
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
  }
  if (close) {
    x->hdrs = kvr_curl_slist_append(NULL, "Connection: close");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
  }
  assert_int_equal(kvr_curlm_add(env->m, e, on_done, x), 0);
}

static void xfer_wait(env_t *env, xfer_t *xs, size_t n) {
  for (;;) {
    size_t done = 0;
    for (size_t i = 0; i < n; i++)
      done += xs[i].done;
    if (done == n)
      break;
    uv_run(&env->loop, UV_RUN_ONCE);
  }
}

/* Checks a finished transfer's answer; returns its CURLINFO_NUM_CONNECTS. */
static long xfer_check(xfer_t *x, const char *want) {
  assert_int_equal(x->rc, CURLE_OK);
  assert_int_equal(x->status, 200);
  kvr_buf_append(&x->body, "", 1);
  assert_string_equal(x->body.data, want);
  kvr_buf_free(&x->body);
  return (long)x->connects;
}

/* uv_walk(): counts poll handles, [0] all, [1] those that keep the loop alive (active and
 * referenced). */
static void count_polls(uv_handle_t *h, void *arg) {
  int *n = arg;
  if (h->type != UV_POLL || uv_is_closing(h))
    return;
  n[0]++;
  if (uv_is_active(h) && uv_has_ref(h))
    n[1]++;
}

static void test_keepalive_reuse(void **state) {
  (void)state;
  env_t env;
  env_init(&env);
  for (int i = 0; i < 50; i++) {
    xfer_t x;
    char target[32], want[64];
    snprintf(target, sizeof target, "/ka/%d", i);
    xfer_start(&env, &x, target, i % 2 ? "{\"n\":1}" : NULL, false);
    xfer_wait(&env, &x, 1);
    snprintf(want, sizeof want, "%s %d %s", i % 2 ? "POST" : "GET", i % 2 ? 7 : 0, target);
    /* One connection for all of them: the first opens it, the others reuse it. */
    assert_int_equal(xfer_check(&x, want), i == 0 ? 1 : 0);
  }
  assert_int_equal(env.requests, 50);
  assert_int_equal(kvr_curlm_active(env.m), 0);
  /* The idle pooled connection keeps its poll handle (still watching, for a server close), but
   * unreferenced: it must not keep uv_run() of a finished client (bench, monitor) running. */
  int polls[2] = {0, 0};
  uv_walk(&env.loop, count_polls, polls);
  assert_int_equal(polls[0], 1);
  assert_int_equal(polls[1], 0);
  env_free(&env);
}

static void test_descriptor_reuse(void **state) {
  (void)state;
  env_t env;
  env_init(&env);
  /* Alternate closing and kept-alive transfers: every closed connection frees its descriptor and
   * the next socket usually gets the same number. */
  for (int i = 0; i < 40; i++) {
    xfer_t x;
    char want[64];
    bool close = i % 3 != 2;
    xfer_start(&env, &x, "/fd", "abc", close);
    xfer_wait(&env, &x, 1);
    snprintf(want, sizeof want, "POST 3 /fd");
    long connects = xfer_check(&x, want);
    /* After a closing transfer the next one must connect again. */
    if (i > 0 && (i - 1) % 3 != 2)
      assert_int_equal(connects, 1);
  }
  assert_int_equal(env.requests, 40);
  env_free(&env);
}

static void test_concurrent(void **state) {
  (void)state;
  env_t env;
  env_init(&env);
  enum { N = 8 };
  for (int round = 0; round < 3; round++) {
    xfer_t xs[N];
    for (int i = 0; i < N; i++) {
      char target[32];
      snprintf(target, sizeof target, "/c/%d", i);
      xfer_start(&env, &xs[i], target, "xy", round == 2 && i % 2);
    }
    xfer_wait(&env, xs, N);
    long connects = 0;
    for (int i = 0; i < N; i++) {
      char want[64];
      snprintf(want, sizeof want, "POST 2 /c/%d", i);
      connects += xfer_check(&xs[i], want);
    }
    /* The first round opens the pool; the second runs on it (8 idle connections). */
    if (round == 1)
      assert_int_equal(connects, 0);
  }
  assert_int_equal(env.requests, 3 * N);
  env_free(&env);
}

static void on_tick(uv_timer_t *t) {
  *(bool *)t->data = true;
}

static void test_server_closes_idle(void **state) {
  (void)state;
  env_t env;
  env_init(&env);
  xfer_t x;
  xfer_start(&env, &x, "/a", NULL, false);
  xfer_wait(&env, &x, 1);
  xfer_check(&x, "GET 0 /a");
  /* The server closes the idle pooled connection: it turns readable (EOF) in the pool. */
  srv_stop(&env);
  bool fired = false;
  uv_timer_t t;
  uv_timer_init(&env.loop, &t);
  t.data = &fired;
  uv_timer_start(&t, on_tick, 100, 0);
  int turns = 0;
  while (!fired) {
    uv_run(&env.loop, UV_RUN_ONCE);
    turns++;
  }
  /* A readable socket left watched would wake the loop on every turn (thousands in 100 ms). */
  assert_true(turns < 20);
  uv_close((uv_handle_t *)&t, NULL);
  /* A new server: the next transfer works (curl drops the dead connection on its own). */
  srv_start(&env);
  xfer_start(&env, &x, "/b", "z", false);
  xfer_wait(&env, &x, 1);
  assert_int_equal(xfer_check(&x, "POST 1 /b"), 1);
  env_free(&env);
}

KVR_TEST_MAIN(cmocka_unit_test(test_keepalive_reuse), cmocka_unit_test(test_descriptor_reuse),
              cmocka_unit_test(test_concurrent), cmocka_unit_test(test_server_closes_idle))

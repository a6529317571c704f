/* test_listeners.c -- the route tables of the public listener (proxy.c) and the admin listener
 * (admin.c) over real loopback sockets.
 *
 * Both listeners dispatch through src/net/http_route.h: a known path with another method is a 405
 * that carries Allow, an unknown path a 404, and HEAD is accepted wherever GET is. The public
 * listener also answers dot segments with a 400 before any lookup and counts every 4xx it answers
 * itself (client_errors_total). No case reaches a worker: the one configured worker is never
 * contacted.
 *
 * As in test_http_server.c, the servers run on a libuv loop in the test thread and a client thread
 * sends one raw request and reads the answer until the server closes. The fixture ends by closing
 * everything and asserting uv_loop_close() == 0.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "core/config.h"
#include "core/router.h"
#include "net/curlm.h"
#include "net/http_server.h"
#include "serve/admin.h"
#include "serve/proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
  uv_loop_t loop;
  uv_async_t done;
  kvr_config_t cfg;
  kvr_router_t *r;
  kvr_curlm_t *curlm;
  kvr_proxy_t *proxy;
  kvr_admin_t *admin;
  kvr_http_server_t *pub, *adm;
  /* The exchange in progress. */
  int port;
  const char *request;
  kvr_buf_t response;
} fx_t;

static void *client_main(void *arg) {
  fx_t *f = arg;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    send(fd, f->request, strlen(f->request), MSG_NOSIGNAL);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0)
      kvr_buf_append(&f->response, buf, (size_t)n);
  }
  close(fd);
  uv_async_send(&f->done);
  return NULL;
}

static void on_done(uv_async_t *a) {
  uv_stop(a->loop);
}

static void on_closed(void *data) {
  (void)data;
}

static kvr_http_server_t *listen_on(fx_t *f, kvr_http_request_cb cb, void *data) {
  kvr_http_server_t *srv = kvr_http_server_new(&f->loop, NULL, cb, data);
  char err[128];
  assert_int_equal(kvr_http_server_listen(srv, "127.0.0.1:0", err, sizeof err), 0);
  return srv;
}

static void fx_open(fx_t *f) {
  memset(f, 0, sizeof *f);
  uv_loop_init(&f->loop);
  uv_async_init(&f->loop, &f->done, on_done);
  kvr_config_init(&f->cfg);
  char err[256];
  assert_int_equal(kvr_config_add_worker(&f->cfg, "http://127.0.0.1:1", err, sizeof err), 0);
  f->cfg.scrape_interval_ms = 0;
  f->cfg.access_log = false;
  f->r = kvr_router_new(&f->cfg, err, sizeof err);
  assert_non_null(f->r);
  f->curlm = kvr_curlm_new(&f->loop);
  assert_non_null(f->curlm);
  f->proxy = kvr_proxy_new(&f->loop, f->r, f->curlm);
  f->admin = kvr_admin_new(f->r, f->curlm);
  f->pub = listen_on(f, kvr_proxy_on_request, f->proxy);
  f->adm = listen_on(f, kvr_admin_on_request, f->admin);
}

static void fx_close(fx_t *f) {
  kvr_http_server_close(f->pub, on_closed, NULL);
  kvr_http_server_close(f->adm, on_closed, NULL);
  kvr_curlm_close(f->curlm);
  uv_close((uv_handle_t *)&f->done, NULL);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  kvr_http_server_free(f->pub);
  kvr_http_server_free(f->adm);
  kvr_admin_free(f->admin);
  kvr_proxy_free(f->proxy);
  kvr_router_free(f->r);
  kvr_config_free(&f->cfg);
}

/* Sends "METHOD PATH" to srv and checks the status and that every needle is in the answer
 * ("Allow: ..." names a header line, anything else a part of the body). */
static void expect(fx_t *f, kvr_http_server_t *srv, const char *method, const char *path,
                   int status, const char *needle1, const char *needle2) {
  char req[256];
  snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", method, path);
  f->port = kvr_http_server_port(srv);
  f->request = req;
  kvr_buf_init(&f->response);
  pthread_t t;
  pthread_create(&t, NULL, client_main, f);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  pthread_join(t, NULL);
  const char *resp = f->response.data ? f->response.data : "";
  if (strncmp(resp, "HTTP/1.1 ", 9) != 0 || atoi(resp + 9) != status)
    fail_msg("%s %s: expected %d, got:\n%s", method, path, status, resp);
  const char *needles[] = {needle1, needle2};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(needles); i++)
    if (needles[i] && strstr(resp, needles[i]) == NULL)
      fail_msg("%s %s: no '%s' in:\n%s", method, path, needles[i], resp);
  if (status != 405 && strstr(resp, "Allow:"))
    fail_msg("%s %s: Allow outside a 405:\n%s", method, path, resp);
  kvr_buf_free(&f->response);
}

static void test_public_routes(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f);
  expect(&f, f.pub, "PUT", "/health", 405, "\r\nAllow: GET, HEAD\r\n",
         "PUT is not allowed on /health (allowed: GET, HEAD)");
  expect(&f, f.pub, "GET", "/v1/chat/completions", 405, "\r\nAllow: POST\r\n",
         "\"method_not_allowed\"");
  expect(&f, f.pub, "DELETE", "/v1/completions", 405, "\r\nAllow: POST\r\n", NULL);
  expect(&f, f.pub, "POST", "/v1/models", 405, "\r\nAllow: GET, HEAD\r\n", NULL);
  expect(&f, f.pub, "GET", "/nope", 404, "no route for GET /nope", "\"not_found\"");
  expect(&f, f.pub, "GET", "/v1", 404, NULL, NULL);
  expect(&f, f.pub, "GET", "/v1/../admin/workers", 400, "\"invalid_path\"", NULL);
  expect(&f, f.pub, "GET", "/v1/%2e%2e/x", 400, "\"invalid_path\"", NULL);
  /* The router's own 4xx answers are counted (local_log runs before the answer). */
  assert_int_equal(f.r->client_errors_total, 8);
  expect(&f, f.pub, "HEAD", "/health", 200, NULL, NULL);
  expect(&f, f.pub, "GET", "/health", 200, "\"usable_workers\":1", NULL);
  /* The two probes count apart from requests (proxy.c: kvr_router_on_probe). */
  assert_int_equal(f.r->requests_total, 8);
  assert_int_equal(f.r->probe_requests_total[KVR_PROBE_HEALTH], 2);
  fx_close(&f);
}

static void test_admin_routes(void **state) {
  (void)state;
  fx_t f;
  fx_open(&f);
  expect(&f, f.adm, "PATCH", "/admin/workers", 405, "\r\nAllow: GET, HEAD, POST\r\n",
         "PATCH is not allowed on /admin/workers (allowed: GET, HEAD, POST)");
  expect(&f, f.adm, "GET", "/admin/workers/1", 405, "\r\nAllow: DELETE\r\n", NULL);
  expect(&f, f.adm, "POST", "/admin/policy", 405, "\r\nAllow: GET, HEAD, PUT\r\n", NULL);
  expect(&f, f.adm, "GET", "/admin/reset_prefix_cache", 405, "\r\nAllow: POST\r\n", NULL);
  expect(&f, f.adm, "POST", "/metrics", 405, "\r\nAllow: GET, HEAD\r\n", NULL);
  expect(&f, f.adm, "GET", "/admin/nothing", 404, "no route for GET /admin/nothing", NULL);
  expect(&f, f.adm, "DELETE", "/admin/workers/99", 404, "\"worker_not_found\"", NULL);
  expect(&f, f.adm, "HEAD", "/metrics", 200, NULL, NULL);
  expect(&f, f.adm, "GET", "/admin/policy", 200, "\"policy\"", NULL);
  expect(&f, f.adm, "GET", "/admin/workers", 200, "\"workers\"", NULL);
  fx_close(&f);
}

KVR_TEST_MAIN(cmocka_unit_test(test_public_routes), cmocka_unit_test(test_admin_routes))

/* test_discovery.c -- worker discovery from a DNS name (src/serve/discovery.c).
 *
 * The pure parts first: kvr_discovery_diff() (adds, removes, duplicates in an answer, an empty
 * answer keeps the set, order-insensitivity, IPv4 and IPv6 URLs), the address-to-host formatting
 * and the --discover URL and flag checks. Then the resolver on a real libuv loop with a real
 * router, resolving address literals (getaddrinfo answers them without any DNS traffic): workers
 * added with their derived KV-event endpoints, a gone address drained when the answer changes,
 * resolved once with an interval of 0, the set kept through a resolution error (a name
 * glibc refuses locally: a 64-octet label), drained when the discovery is removed, kept by a SIGHUP
 * reload whose list does not name them; every handle closed (uv_loop_close() == 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "core/router.h"
#include "serve/discovery.h"
#include "serve/reload.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the diff ---------------------------------------------------------------------------------
 */

typedef struct {
  size_t adds[32], removes[32];
  kvr_discovery_diff_t d;
} diff_fx_t;

static void run_diff(diff_fx_t *f, const char *const *cur, size_t ncur, const char *const *ans,
                     size_t nans) {
  f->d.adds = f->adds;
  f->d.removes = f->removes;
  kvr_discovery_diff(cur, ncur, ans, nans, &f->d);
}

static void test_diff_adds_and_removes(void **state) {
  (void)state;
  const char *cur[] = {"http://10.0.0.1:8000", "http://10.0.0.2:8000"};
  const char *ans[] = {"http://10.0.0.2:8000", "http://10.0.0.3:8000"};
  diff_fx_t f;
  run_diff(&f, cur, 2, ans, 2);
  assert_int_equal(f.d.nadds, 1);
  assert_string_equal(ans[f.adds[0]], "http://10.0.0.3:8000");
  assert_int_equal(f.d.nremoves, 1);
  assert_string_equal(cur[f.removes[0]], "http://10.0.0.1:8000");
}

static void test_diff_from_nothing_and_same(void **state) {
  (void)state;
  const char *ans[] = {"http://10.0.0.1:8000", "http://10.0.0.2:8000"};
  diff_fx_t f;
  run_diff(&f, NULL, 0, ans, 2);
  assert_int_equal(f.d.nadds, 2);
  assert_int_equal(f.adds[0], 0);
  assert_int_equal(f.adds[1], 1);
  assert_int_equal(f.d.nremoves, 0);
  run_diff(&f, ans, 2, ans, 2); /* the same answer again changes nothing */
  assert_int_equal(f.d.nadds, 0);
  assert_int_equal(f.d.nremoves, 0);
}

static void test_diff_duplicates_in_answer(void **state) {
  (void)state;
  /* getaddrinfo repeats an address once per socket type or A record copy */
  const char *ans[] = {"http://10.0.0.1:8000", "http://10.0.0.1:8000", "http://10.0.0.2:8000",
                       "http://10.0.0.1:8000"};
  diff_fx_t f;
  run_diff(&f, NULL, 0, ans, 4);
  assert_int_equal(f.d.nadds, 2);
  assert_string_equal(ans[f.adds[0]], "http://10.0.0.1:8000");
  assert_string_equal(ans[f.adds[1]], "http://10.0.0.2:8000");
  const char *cur[] = {"http://10.0.0.1:8000"};
  run_diff(&f, cur, 1, ans, 4);
  assert_int_equal(f.d.nadds, 1);
  assert_string_equal(ans[f.adds[0]], "http://10.0.0.2:8000");
  assert_int_equal(f.d.nremoves, 0);
}

static void test_diff_empty_answer_keeps_set(void **state) {
  (void)state;
  const char *cur[] = {"http://10.0.0.1:8000", "http://[fd00::1]:8000"};
  diff_fx_t f;
  f.d.nadds = f.d.nremoves = 99;
  run_diff(&f, cur, 2, NULL, 0);
  assert_int_equal(f.d.nadds, 0);
  assert_int_equal(f.d.nremoves, 0);
}

static void test_diff_every_address_replaced(void **state) {
  (void)state;
  /* a non-empty answer with none of the current addresses removes them all: a real rollout */
  const char *cur[] = {"http://10.0.0.1:8000", "http://10.0.0.2:8000"};
  const char *ans[] = {"http://10.0.0.9:8000"};
  diff_fx_t f;
  run_diff(&f, cur, 2, ans, 1);
  assert_int_equal(f.d.nadds, 1);
  assert_int_equal(f.d.nremoves, 2);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void test_diff_order_insensitive(void **state) {
  (void)state;
  const char *cur1[] = {"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.4:8000"};
  const char *cur2[] = {"http://10.0.0.4:8000", "http://10.0.0.1:8000", "http://10.0.0.2:8000"};
  const char *ans1[] = {"http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://10.0.0.5:8000"};
  const char *ans2[] = {"http://10.0.0.5:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"};
  diff_fx_t a, b;
  run_diff(&a, cur1, 3, ans1, 3);
  run_diff(&b, cur2, 3, ans2, 3);
  assert_int_equal(a.d.nadds, 2);
  assert_int_equal(a.d.nremoves, 2);
  const char *va[4], *vb[4];
  for (size_t i = 0; i < 2; i++) {
    va[i] = ans1[a.adds[i]];
    vb[i] = ans2[b.adds[i]];
    va[2 + i] = cur1[a.removes[i]];
    vb[2 + i] = cur2[b.removes[i]];
  }
  qsort(va, 2, sizeof va[0], cmp_str);
  qsort(vb, 2, sizeof vb[0], cmp_str);
  qsort(va + 2, 2, sizeof va[0], cmp_str);
  qsort(vb + 2, 2, sizeof vb[0], cmp_str);
  for (size_t i = 0; i < 4; i++)
    assert_string_equal(va[i], vb[i]);
  assert_string_equal(va[0], "http://10.0.0.3:8000");
  assert_string_equal(va[1], "http://10.0.0.5:8000");
  assert_string_equal(va[2], "http://10.0.0.1:8000");
  assert_string_equal(va[3], "http://10.0.0.4:8000");
}

static void test_diff_v4_and_v6(void **state) {
  (void)state;
  const char *cur[] = {"http://10.0.0.1:8000", "http://[fd00::1]:8000"};
  const char *ans[] = {"http://[fd00::1]:8000", "http://[fd00::2]:8000", "http://10.0.0.1:8000"};
  diff_fx_t f;
  run_diff(&f, cur, 2, ans, 3);
  assert_int_equal(f.d.nadds, 1);
  assert_string_equal(ans[f.adds[0]], "http://[fd00::2]:8000");
  assert_int_equal(f.d.nremoves, 0);
  const char *ans2[] = {"http://10.0.0.1:8000"};
  run_diff(&f, cur, 2, ans2, 1);
  assert_int_equal(f.d.nremoves, 1);
  assert_string_equal(cur[f.removes[0]], "http://[fd00::1]:8000");
}

/* ---- addresses and URLs -----------------------------------------------------------------------
 */

static void test_addr_host(void **state) {
  (void)state;
  struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(80)};
  inet_pton(AF_INET, "10.1.2.3", &in.sin_addr);
  struct sockaddr_in6 in6 = {.sin6_family = AF_INET6};
  inet_pton(AF_INET6, "FD00:0:0:0::5", &in6.sin6_addr);
  char out[64];
  assert_int_equal(kvr_discovery_addr_host((struct sockaddr *)&in, out, sizeof out), 0);
  assert_string_equal(out, "10.1.2.3");
  assert_int_equal(kvr_discovery_addr_host((struct sockaddr *)&in6, out, sizeof out), 0);
  assert_string_equal(out, "[fd00::5]");
  char small[6];
  assert_int_equal(kvr_discovery_addr_host((struct sockaddr *)&in6, small, sizeof small),
                   KVR_EINVAL);
  struct sockaddr un = {.sa_family = AF_UNIX};
  assert_int_equal(kvr_discovery_addr_host(&un, out, sizeof out), KVR_EINVAL);
}

static void test_parse_url(void **state) {
  (void)state;
  kvr_url_target_t t;
  char err[256];
  assert_int_equal(
      kvr_url_discovery("http://vllm-workers.llm.svc.cluster.local:8000", &t, err, 256), 0);
  assert_string_equal(t.scheme, "http");
  assert_string_equal(t.host, "vllm-workers.llm.svc.cluster.local");
  assert_int_equal(t.port, 8000);
  assert_int_equal(kvr_url_discovery("https://[::1]:8443/", &t, err, sizeof err), 0);
  assert_string_equal(t.scheme, "https");
  assert_string_equal(t.host, "::1");
  assert_int_equal(t.port, 8443);
  const char *bad[] = {"ftp://h:1",        "http://h",        "http://h:0",  "http://h:99999",
                       "http://h:8000/v1", "http://u@h:8000", "h:8000",      "http://:8000",
                       "http://h:8000?x",  "http://[::1]",    "http://h:abc"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    err[0] = '\0';
    assert_int_equal(kvr_url_discovery(bad[i], &t, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, bad[i])); /* the message names the URL */
  }
  assert_int_equal(kvr_url_discovery("http://h", &t, err, sizeof err), KVR_EINVAL);
  assert_non_null(strstr(err, "needs a port"));
}

static int parse(kvr_config_t *cfg, char *err, int argc, ...) {
  char *argv[16] = {"serve"};
  va_list ap;
  va_start(ap, argc);
  for (int i = 1; i < argc; i++)
    argv[i] = va_arg(ap, char *);
  va_end(ap);
  kvr_config_init(cfg);
  FILE *devnull = fopen("/dev/null", "w");
  int rc = kvr_config_parse_args(cfg, argc, argv, devnull, err, 512);
  fclose(devnull);
  return rc;
}

static void test_config_flags(void **state) {
  (void)state;
  kvr_config_t cfg;
  char err[512];
  assert_int_equal(parse(&cfg, err, 3, "--discover", "http://workers.example:8000"), 0);
  assert_string_equal(cfg.discover_url, "http://workers.example:8000");
  assert_int_equal(cfg.discover_interval_ms, 5000);
  assert_int_equal(cfg.nworkers, 0); /* discovery alone is enough */
  kvr_config_free(&cfg);
  assert_int_equal(parse(&cfg, err, 9, "--discover", "http://w:8000", "--discover-interval-ms", "0",
                         "--discover-kv-events-port", "5557", "--discover-kv-replay-port", "5558"),
                   0);
  assert_int_equal(cfg.discover_interval_ms, 0);
  assert_int_equal(cfg.discover_kv_events_port, 5557);
  assert_int_equal(cfg.discover_kv_replay_port, 5558);
  kvr_config_free(&cfg);
  struct {
    int argc;
    const char *a1, *a2, *a3, *a4, *want;
  } bad[] = {
      {3, "--discover", "ftp://w:8000", NULL, NULL, "--discover: "},
      {3, "--discover", "http://w", NULL, NULL, "needs a port"},
      {5, "--discover", "http://w:8000", "--discover-interval-ms", "-1", "--discover-interval-ms"},
      {5, "--discover", "http://w:8000", "--discover-interval-ms", "abc", "--discover-interval-ms"},
      {5, "--discover", "http://w:8000", "--discover-kv-events-port", "70000",
       "--discover-kv-events-port"},
      {5, "--discover", "http://w:8000", "--discover-kv-replay-port", "5558",
       "needs --discover-kv-events-port"},
      {1, NULL, NULL, NULL, NULL, "--discover URL"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    err[0] = '\0';
    int rc = parse(&cfg, err, bad[i].argc, bad[i].a1, bad[i].a2, bad[i].a3, bad[i].a4);
    assert_true(rc < 0);
    assert_non_null(strstr(err, bad[i].want));
    assert_null(strchr(err, '\n'));
    kvr_config_free(&cfg);
  }
}

static void test_config_json(void **state) {
  (void)state;
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  char err[512];
  const char *j = "{\"discovery\": {\"url\": \"http://[::1]:8000\", \"interval_ms\": 200, "
                  "\"kv_events_port\": 5557, \"kv_replay_port\": 5558}}";
  assert_int_equal(kvr_config_apply_json(&cfg, j, strlen(j), "c.json", err, sizeof err), 0);
  assert_string_equal(cfg.discover_url, "http://[::1]:8000");
  assert_int_equal(cfg.discover_interval_ms, 200);
  assert_int_equal(cfg.discover_kv_events_port, 5557);
  assert_int_equal(cfg.discover_kv_replay_port, 5558);
  assert_int_equal(kvr_config_validate(&cfg, err, sizeof err), 0);
  const char *b = "{\"discovery\": {\"url\": \"http://w\"}}";
  assert_int_equal(kvr_config_apply_json(&cfg, b, strlen(b), "c.json", err, sizeof err),
                   KVR_EINVAL);
  assert_non_null(strstr(err, "discovery.url"));
  kvr_config_free(&cfg);
}

/* ---- on a loop --------------------------------------------------------------------------------
 */

typedef struct {
  uv_loop_t loop;
  kvr_config_t cfg;
  kvr_router_t *r;
  kvr_discovery_t *d;
} loop_fx_t;

static void loop_open(loop_fx_t *f, const char *url, uint64_t interval_ms) {
  kvr_log_set_level(KVR_LOG_WARN);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  kvr_config_init(&f->cfg);
  f->cfg.discover_url = url ? kvr_xstrdup(url) : NULL;
  f->cfg.discover_interval_ms = interval_ms;
  char err[256];
  f->r = kvr_router_new(&f->cfg, err, sizeof err);
  assert_non_null(f->r);
  f->d = kvr_discovery_new(&f->loop, f->r, &f->cfg);
}

static void loop_close(loop_fx_t *f) {
  kvr_discovery_close(f->d);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  kvr_router_free(f->r);
  kvr_config_free(&f->cfg);
}

static size_t count_workers(const kvr_router_t *r, bool draining_too) {
  size_t n = 0;
  for (size_t i = 0; i < r->nslots; i++)
    n += r->slots[i] && (draining_too || r->slots[i]->state != KVR_WORKER_DRAINING);
  return n;
}

static const kvr_worker_t *find(const kvr_router_t *r, const char *url) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && strcmp(r->slots[i]->url, url) == 0)
      return r->slots[i];
  return NULL;
}

/* Runs the loop until pred holds (or ~5 s pass); returns whether it holds. */
static bool run_until(loop_fx_t *f, bool (*pred)(loop_fx_t *)) {
  for (int i = 0; i < 500 && !pred(f); i++) {
    uv_run(&f->loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  return pred(f);
}

static bool has_one(loop_fx_t *f) {
  return count_workers(f->r, false) == 1;
}

static bool has_none(loop_fx_t *f) {
  return count_workers(f->r, true) == 0;
}

static double metric(const char *name, const char *labels) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_discovery_metrics(&b);
  char line[160];
  snprintf(line, sizeof line, "\n%s%s%s%s ", name, labels ? "{" : "", labels ? labels : "",
           labels ? "}" : "");
  const char *p = strstr(b.data, line);
  double v = p ? strtod(p + strlen(line), NULL) : -1;
  kvr_buf_free(&b);
  return v;
}

static void test_loop_v6_literal_with_kv_ports(void **state) {
  (void)state;
  loop_fx_t f;
  kvr_config_init(&f.cfg);
  kvr_log_set_level(KVR_LOG_WARN);
  assert_int_equal(uv_loop_init(&f.loop), 0);
  f.cfg.discover_url = kvr_xstrdup("http://[::1]:18000");
  f.cfg.discover_interval_ms = 50;
  f.cfg.discover_kv_events_port = 5557;
  f.cfg.discover_kv_replay_port = 5558;
  char err[256];
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  double ok0 = metric("kvrouter_discovery_resolutions_total", "result=\"ok\"");
  f.d = kvr_discovery_new(&f.loop, f.r, &f.cfg);
  assert_true(run_until(&f, has_one));
  const kvr_worker_t *w = find(f.r, "http://[::1]:18000");
  assert_non_null(w);
  assert_string_equal(w->kv_events, "tcp://[::1]:5557");
  assert_string_equal(w->kv_replay, "tcp://[::1]:5558");
  assert_true(kvr_discovery_has(f.d, "http://[::1]:18000"));
  assert_true(metric("kvrouter_discovery_resolutions_total", "result=\"ok\"") >= ok0 + 1);
  assert_int_equal(metric("kvrouter_discovery_workers", NULL), 1);
  /* a reload turning the KV ports off clears the endpoints */
  f.cfg.discover_kv_events_port = f.cfg.discover_kv_replay_port = 0;
  kvr_discovery_apply(f.d);
  assert_null(w->kv_events);
  assert_null(w->kv_replay);
  loop_close(&f);
}

static void test_loop_error_keeps_then_removed_drains(void **state) {
  (void)state;
  loop_fx_t f;
  loop_open(&f, "http://127.0.0.1:18001", 20);
  assert_true(run_until(&f, has_one));
  uint32_t id = find(f.r, "http://127.0.0.1:18001")->id;
  /* a name the resolver refuses without any DNS traffic (a label longer than 63 octets) */
  char bad[128];
  snprintf(bad, sizeof bad, "http://%s.invalid:18001",
           "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
  double err0 = metric("kvrouter_discovery_resolutions_total", "result=\"error\"");
  free(f.cfg.discover_url);
  f.cfg.discover_url = kvr_xstrdup(bad);
  kvr_discovery_apply(f.d);
  for (int i = 0;
       i < 300 && metric("kvrouter_discovery_resolutions_total", "result=\"error\"") < err0 + 3;
       i++) {
    uv_run(&f.loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  /* several failed rounds later the worker is still there, UP */
  assert_true(metric("kvrouter_discovery_resolutions_total", "result=\"error\"") >= err0 + 3);
  const kvr_worker_t *w = kvr_router_worker_by_id(f.r, id);
  assert_non_null(w);
  assert_int_equal(w->state, KVR_WORKER_UP);
  assert_int_equal(metric("kvrouter_discovery_workers", NULL), 1);
  /* the discovery removed by a reload: its worker is drained, and freed (nothing in flight) */
  free(f.cfg.discover_url);
  f.cfg.discover_url = NULL;
  kvr_discovery_apply(f.d);
  assert_null(kvr_router_worker_by_id(f.r, id));
  assert_true(has_none(&f));
  assert_int_equal(metric("kvrouter_discovery_workers", NULL), 0);
  loop_close(&f);
}

static bool only_second(loop_fx_t *f) {
  return count_workers(f->r, true) == 1 && find(f->r, "http://127.0.0.2:18003") != NULL;
}

static void test_loop_new_answer_drains_gone_address(void **state) {
  (void)state;
  loop_fx_t f;
  loop_open(&f, "http://127.0.0.1:18003", 20);
  assert_true(run_until(&f, has_one));
  uint32_t first = find(f.r, "http://127.0.0.1:18003")->id;
  /* the name now answers another address: the diff adds it and drains the gone one (freed at
   * once: nothing in flight), without a moment with no worker */
  free(f.cfg.discover_url);
  f.cfg.discover_url = kvr_xstrdup("http://127.0.0.2:18003");
  kvr_discovery_apply(f.d);
  assert_non_null(kvr_router_worker_by_id(f.r, first)); /* kept until the new name answers */
  assert_true(run_until(&f, only_second));
  assert_null(kvr_router_worker_by_id(f.r, first));
  assert_false(kvr_discovery_has(f.d, "http://127.0.0.1:18003"));
  assert_true(kvr_discovery_has(f.d, "http://127.0.0.2:18003"));
  loop_close(&f);
}

static void test_loop_static_worker_not_duplicated_nor_drained(void **state) {
  (void)state;
  loop_fx_t f;
  assert_int_equal(uv_loop_init(&f.loop), 0);
  kvr_config_init(&f.cfg);
  char err[256];
  assert_int_equal(kvr_config_add_worker(&f.cfg, "http://127.0.0.1:18002", err, sizeof err), 0);
  f.cfg.discover_url = kvr_xstrdup("http://127.0.0.1:18002");
  f.cfg.discover_interval_ms = 0; /* once */
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  uint32_t id = find(f.r, "http://127.0.0.1:18002")->id;
  f.d = kvr_discovery_new(&f.loop, f.r, &f.cfg);
  for (int i = 0; i < 300 && !kvr_discovery_has(f.d, "http://127.0.0.1:18002"); i++) {
    uv_run(&f.loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  assert_true(kvr_discovery_has(f.d, "http://127.0.0.1:18002"));
  assert_int_equal(count_workers(f.r, true), 1); /* the static one, not a second */
  /* interval 0: answered once, never resolved again */
  double ok = metric("kvrouter_discovery_resolutions_total", "result=\"ok\"");
  for (int i = 0; i < 20; i++) {
    uv_run(&f.loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  assert_true(metric("kvrouter_discovery_resolutions_total", "result=\"ok\"") == ok);
  free(f.cfg.discover_url);
  f.cfg.discover_url = NULL;
  kvr_discovery_apply(f.d);
  assert_non_null(kvr_router_worker_by_id(f.r, id)); /* static: stays */
  assert_int_equal(kvr_router_worker_by_id(f.r, id)->state, KVR_WORKER_UP);
  loop_close(&f);
}

static bool has_two(loop_fx_t *f) {
  return count_workers(f->r, false) == 2;
}

/* --discover-dp-size: each address is one worker per rank, rank R's KV ports N + R; ports turned
 * off clear every rank's; the discovery removed drains every rank. */
static void test_loop_dp_ranks(void **state) {
  (void)state;
  loop_fx_t f;
  kvr_config_init(&f.cfg);
  kvr_log_set_level(KVR_LOG_WARN);
  assert_int_equal(uv_loop_init(&f.loop), 0);
  f.cfg.discover_url = kvr_xstrdup("http://127.0.0.1:18020");
  f.cfg.discover_interval_ms = 50;
  f.cfg.discover_kv_events_port = 5557;
  f.cfg.discover_kv_replay_port = 6557;
  f.cfg.discover_dp_size = 2;
  char err[256];
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  f.d = kvr_discovery_new(&f.loop, f.r, &f.cfg);
  assert_true(run_until(&f, has_two));
  for (int k = 0; k < 2; k++) {
    const kvr_worker_t *w = kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:18020", k);
    assert_non_null(w);
    assert_int_equal(w->dp_size, 2);
    char ev[40], rp[40];
    snprintf(ev, sizeof ev, "tcp://127.0.0.1:%d", 5557 + k);
    snprintf(rp, sizeof rp, "tcp://127.0.0.1:%d", 6557 + k);
    assert_string_equal(w->kv_events, ev);
    assert_string_equal(w->kv_replay, rp);
  }
  assert_int_equal(metric("kvrouter_discovery_workers", NULL), 1); /* one address */
  f.cfg.discover_kv_events_port = f.cfg.discover_kv_replay_port = 0;
  kvr_discovery_apply(f.d);
  for (int k = 0; k < 2; k++)
    assert_null(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:18020", k)->kv_events);
  free(f.cfg.discover_url);
  f.cfg.discover_url = NULL;
  kvr_discovery_apply(f.d);
  assert_int_equal(count_workers(f.r, true), 0);
  loop_close(&f);
}

static void test_reload_keeps_discovered(void **state) {
  (void)state;
  char path[64];
  snprintf(path, sizeof path, "/tmp/kvr-test-discovery-%d.json", (int)getpid());
  FILE *fh = fopen(path, "w");
  assert_non_null(fh);
  fputs("{\"workers\": [\"http://127.0.0.1:18010\"], \"discovery\": {\"url\": "
        "\"http://127.0.0.1:18011\", \"interval_ms\": 20}}",
        fh);
  fclose(fh);
  char *argv[] = {"serve", "--config", path};
  loop_fx_t f;
  kvr_log_set_level(KVR_LOG_WARN);
  assert_int_equal(uv_loop_init(&f.loop), 0);
  kvr_config_init(&f.cfg);
  char err[512];
  FILE *devnull = fopen("/dev/null", "w");
  assert_int_equal(kvr_config_parse_args(&f.cfg, 3, argv, devnull, err, sizeof err), 0);
  fclose(devnull);
  f.r = kvr_router_new(&f.cfg, err, sizeof err);
  assert_non_null(f.r);
  f.d = kvr_discovery_new(&f.loop, f.r, &f.cfg);
  for (int i = 0; i < 300 && count_workers(f.r, false) < 2; i++) {
    uv_run(&f.loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  assert_int_equal(count_workers(f.r, false), 2);
  /* the same file again: the discovered worker is not in "workers" but stays */
  assert_int_equal(kvr_reload_apply(&f.cfg, f.r, f.d, 3, argv, err, sizeof err), 0);
  kvr_discovery_apply(f.d);
  assert_int_equal(count_workers(f.r, false), 2);
  /* the discovery taken out of the file: its worker goes, the static one stays */
  fh = fopen(path, "w");
  fputs("{\"workers\": [\"http://127.0.0.1:18010\"]}", fh);
  fclose(fh);
  assert_int_equal(kvr_reload_apply(&f.cfg, f.r, f.d, 3, argv, err, sizeof err), 0);
  assert_null(f.cfg.discover_url);
  kvr_discovery_apply(f.d);
  assert_int_equal(count_workers(f.r, true), 1);
  assert_non_null(find(f.r, "http://127.0.0.1:18010"));
  unlink(path);
  loop_close(&f);
}

KVR_TEST_MAIN(cmocka_unit_test(test_diff_adds_and_removes),
              cmocka_unit_test(test_diff_from_nothing_and_same),
              cmocka_unit_test(test_diff_duplicates_in_answer),
              cmocka_unit_test(test_diff_empty_answer_keeps_set),
              cmocka_unit_test(test_diff_every_address_replaced),
              cmocka_unit_test(test_diff_order_insensitive), cmocka_unit_test(test_diff_v4_and_v6),
              cmocka_unit_test(test_addr_host), cmocka_unit_test(test_parse_url),
              cmocka_unit_test(test_config_flags), cmocka_unit_test(test_config_json),
              cmocka_unit_test(test_loop_v6_literal_with_kv_ports),
              cmocka_unit_test(test_loop_error_keeps_then_removed_drains),
              cmocka_unit_test(test_loop_new_answer_drains_gone_address),
              cmocka_unit_test(test_loop_static_worker_not_duplicated_nor_drained),
              cmocka_unit_test(test_loop_dp_ranks), cmocka_unit_test(test_reload_keeps_discovered))

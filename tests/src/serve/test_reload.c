/* test_reload.c -- SIGHUP reload (src/serve/reload.c) without a loop: a router built from a config
 * file, the file rewritten, kvr_reload_apply() over the same argv; then the router's workers and
 * policy, the live settings, the settings left for a restart and the reload counters are checked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "core/router.h"
#include "serve/reload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
  char path[64];
  char *argv[3];
  kvr_config_t cfg;
  kvr_router_t *r;
} fx_t;

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void fx_open(fx_t *f, const char *json) {
  snprintf(f->path, sizeof f->path, "/tmp/kvr-test-reload-%d.json", (int)getpid());
  write_file(f->path, json);
  f->argv[0] = "serve";
  f->argv[1] = "--config";
  f->argv[2] = f->path;
  char err[512];
  kvr_config_init(&f->cfg);
  FILE *devnull = fopen("/dev/null", "w");
  assert_int_equal(kvr_config_parse_args(&f->cfg, 3, f->argv, devnull, err, sizeof err), 0);
  fclose(devnull);
  f->r = kvr_router_new(&f->cfg, err, sizeof err);
  assert_non_null(f->r);
}

static void fx_close(fx_t *f) {
  kvr_router_free(f->r);
  kvr_config_free(&f->cfg);
  unlink(f->path);
}

static int reload(fx_t *f, const char *json, char *err, size_t errlen) {
  write_file(f->path, json);
  return kvr_reload_apply(&f->cfg, f->r, NULL, 3, f->argv, err, errlen);
}

/* The id of the non-draining worker serving url, or -1. */
static long served(const kvr_router_t *r, const char *url) {
  for (size_t i = 0; i < r->nslots; i++)
    if (r->slots[i] && r->slots[i]->state != KVR_WORKER_DRAINING &&
        strcmp(r->slots[i]->url, url) == 0)
      return r->slots[i]->id;
  return -1;
}

static size_t count_workers(const kvr_router_t *r) {
  size_t n = 0;
  for (size_t i = 0; i < r->nslots; i++)
    n += r->slots[i] != NULL;
  return n;
}

/* The kvrouter_config_reloads_total sample of result. */
static uint64_t reload_count(const char *result) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_reload_metrics(&b);
  char key[64];
  snprintf(key, sizeof key, "{result=\"%s\"} ", result);
  const char *at = strstr(b.data, key);
  assert_non_null(at);
  uint64_t v = strtoull(at + strlen(key), NULL, 10);
  kvr_buf_free(&b);
  return v;
}

static void assert_counts(uint64_t success, uint64_t failure) {
  assert_int_equal(reload_count("success"), success);
  assert_int_equal(reload_count("failure"), failure);
}

static void test_config_path(void **state) {
  (void)state;
  char *a[] = {"serve", "--worker", "http://h:1", "--config", "a.json", "--config=b.json"};
  assert_string_equal(kvr_reload_config_path(6, a), "b.json");
  assert_string_equal(kvr_reload_config_path(5, a), "a.json");
  assert_null(kvr_reload_config_path(3, a));
  char *b[] = {"serve", "--config"};
  assert_null(kvr_reload_config_path(2, b));
}

/* Policy, workers (kept, added, drained while a request is in flight), live and restart-only
 * settings; counters; the same file twice keeps the policy instance. */
static void test_apply(void **state) {
  (void)state;
  kvr_log_set_level(KVR_LOG_OFF);
  fx_t f;
  fx_open(&f, "{\"workers\": [\"http://127.0.0.1:9001\", \"http://127.0.0.1:9002\"],"
              " \"policy\": \"round_robin\", \"timeouts\": {\"idle_ms\": 60000}}");
  long keep = served(f.r, "http://127.0.0.1:9001");
  long gone = served(f.r, "http://127.0.0.1:9002");
  assert_true(keep >= 0 && gone >= 0);
  /* One request in flight on the worker that leaves the list. */
  kvr_router_dispatch_t d;
  const kvr_worker_t *gw = kvr_router_worker_by_id(f.r, (uint32_t)gone);
  assert_non_null(kvr_router_on_dispatch(f.r, gw->slot, 10, 0, &d));
  char err[512] = "";
  assert_int_equal(reload(&f,
                          "{\"workers\": [\"http://127.0.0.1:9001\", \"http://127.0.0.1:9003/\"],"
                          " \"policy\": \"kv_aware\", \"policy_params\": {\"balance_slack\": 3},"
                          " \"timeouts\": {\"idle_ms\": 5000, \"client_body_ms\": 5},"
                          " \"log_level\": \"off\", \"outlier\": {\"consecutive_failures\": 2},"
                          " \"retry\": {\"budget_percent\": 50},"
                          " \"admission\": {\"max_inflight\": 7, \"max_wait_ms\": 900},"
                          " \"cache\": {\"block_chars\": 128}, \"listen\": \"127.0.0.1:1\"}",
                          err, sizeof err),
                   0);
  assert_string_equal(kvr_policy_name(f.r->policy), "kv_aware");
  assert_int_equal(served(f.r, "http://127.0.0.1:9001"), keep); /* same worker, same id */
  assert_true(served(f.r, "http://127.0.0.1:9003") > gone);
  assert_int_equal(served(f.r, "http://127.0.0.1:9002"), -1);
  gw = kvr_router_worker_by_id(f.r, (uint32_t)gone);
  assert_non_null(gw); /* draining until its request ends */
  assert_int_equal(gw->state, KVR_WORKER_DRAINING);
  kvr_router_on_end(f.r, &d);
  assert_null(kvr_router_worker_by_id(f.r, (uint32_t)gone));
  assert_int_equal(count_workers(f.r), 2);
  /* Live settings changed, restart-only ones did not. */
  assert_int_equal(f.cfg.idle_timeout_ms, 5000);
  assert_string_equal(f.cfg.log_level, "off");
  assert_int_equal(f.cfg.outlier_consecutive, 2);
  assert_int_equal(f.cfg.retry_budget_percent, 50);
  assert_int_equal(f.cfg.admission_max_inflight, 7);
  assert_int_equal(f.cfg.admission_max_wait_ms, 900);
  assert_int_equal(f.cfg.limits.body_timeout_ms, 60000); /* the listener copied it: restart */
  assert_int_equal(f.cfg.block_chars, 64);
  assert_string_equal(f.cfg.listen, "0.0.0.0:8000");
  assert_int_equal(f.cfg.nworkers, 2);
  assert_string_equal(f.cfg.workers[1], "http://127.0.0.1:9003");
  assert_string_equal(f.cfg.policy, "kv_aware");
  assert_counts(1, 0);
  /* The same file again: nothing changes, the policy instance stays. */
  const kvr_policy_t *p = f.r->policy;
  assert_int_equal(reload(&f,
                          "{\"workers\": [\"http://127.0.0.1:9001\", \"http://127.0.0.1:9003\"],"
                          " \"policy\": \"kv_aware\", \"policy_params\": {\"balance_slack\": 3},"
                          " \"timeouts\": {\"idle_ms\": 5000}, \"log_level\": \"off\"}",
                          err, sizeof err),
                   0);
  assert_ptr_equal(f.r->policy, p);
  /* A new seed re-creates the policy. */
  assert_int_equal(reload(&f,
                          "{\"workers\": [\"http://127.0.0.1:9001\", \"http://127.0.0.1:9003\"],"
                          " \"policy\": \"kv_aware\", \"policy_params\": {\"balance_slack\": 3},"
                          " \"seed\": 9, \"log_level\": \"off\"}",
                          err, sizeof err),
                   0);
  assert_int_equal(f.cfg.seed, 9);
  assert_int_equal(f.cfg.idle_timeout_ms, 120000); /* back to the default: not in the file */
  assert_counts(3, 0);
  fx_close(&f);
  kvr_log_set_level(KVR_LOG_INFO);
}

/* The kv_events endpoint of url's rank (-1: the whole server), or "" when it has none. */
static const char *rank_events(const kvr_router_t *r, const char *url, int rank) {
  const kvr_worker_t *w = kvr_router_worker_serving_rank(r, url, rank);
  assert_non_null(w);
  return w->kv_events ? w->kv_events : "";
}

/* Data-parallel entries: kept with their ids while listed alike, KV endpoints changed on every
 * rank, another number of ranks (or none) drains the old ranks and adds the new ones. */
static void test_dp_workers(void **state) {
  (void)state;
  kvr_log_set_level(KVR_LOG_OFF);
  fx_t f;
  const char *two = "{\"workers\": [{\"url\": \"http://127.0.0.1:9001\", \"dp_size\": 2, "
                    "\"kv_events\": \"tcp://127.0.0.1:5557\"}, \"http://127.0.0.1:9002\"]}";
  fx_open(&f, two);
  assert_int_equal(count_workers(f.r), 3);
  uint32_t r0 = kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 0)->id;
  uint32_t r1 = kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 1)->id;
  assert_string_equal(rank_events(f.r, "http://127.0.0.1:9001", 1), "tcp://127.0.0.1:5558");
  char err[512] = "";
  assert_int_equal(reload(&f, two, err, sizeof err), 0); /* the same: the same workers */
  assert_int_equal(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 0)->id, r0);
  assert_int_equal(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 1)->id, r1);
  assert_int_equal(reload(&f,
                          "{\"workers\": [{\"url\": \"http://127.0.0.1:9001\", \"dp_size\": 2, "
                          "\"kv_events\": \"tcp://127.0.0.1:7000\"}, \"http://127.0.0.1:9002\"]}",
                          err, sizeof err),
                   0);
  assert_int_equal(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 1)->id, r1);
  assert_string_equal(rank_events(f.r, "http://127.0.0.1:9001", 0), "tcp://127.0.0.1:7000");
  assert_string_equal(rank_events(f.r, "http://127.0.0.1:9001", 1), "tcp://127.0.0.1:7001");
  /* Three ranks now: the two are drained (nothing in flight: gone), three added. */
  assert_int_equal(reload(&f,
                          "{\"workers\": [{\"url\": \"http://127.0.0.1:9001\", \"dp_size\": 3}, "
                          "\"http://127.0.0.1:9002\"]}",
                          err, sizeof err),
                   0);
  assert_null(kvr_router_worker_by_id(f.r, r0));
  assert_null(kvr_router_worker_by_id(f.r, r1));
  assert_int_equal(count_workers(f.r), 4);
  assert_non_null(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 2));
  assert_string_equal(rank_events(f.r, "http://127.0.0.1:9001", 2), "");
  /* The whole server again: one worker. */
  assert_int_equal(reload(&f,
                          "{\"workers\": [\"http://127.0.0.1:9001\", \"http://127.0.0.1:9002\"]}",
                          err, sizeof err),
                   0);
  assert_int_equal(count_workers(f.r), 2);
  assert_non_null(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", -1));
  assert_null(kvr_router_worker_serving_rank(f.r, "http://127.0.0.1:9001", 0));
  assert_int_equal(f.cfg.worker_dp_size[0], 0);
  fx_close(&f);
  kvr_log_set_level(KVR_LOG_INFO);
}

/* Every kind of bad file changes nothing and is counted as a failure with one line. */
static void test_bad_files_change_nothing(void **state) {
  (void)state;
  kvr_log_set_level(KVR_LOG_OFF);
  fx_t f;
  fx_open(&f, "{\"workers\": [\"http://127.0.0.1:9001\"], \"policy\": \"least_load\"}");
  uint64_t s0 = reload_count("success"), f0 = reload_count("failure");
  const kvr_policy_t *p = f.r->policy;
  long id = served(f.r, "http://127.0.0.1:9001");
  static const struct {
    const char *json, *msg;
  } cases[] = {
      {"{\"workers\": [\"http://127.0.0.1:9002\"],\n \"policy\": 1,, }", "line 2, column"},
      {"{\"workers\": [\"http://127.0.0.1:9002\"], \"policy\": \"nope\"}", "unknown policy"},
      {"{\"workers\": [\"http://127.0.0.1:9002\"], \"policy\": \"kv_aware\","
       " \"policy_params\": {\"bogus\": 1}}",
       "policy_params of kv_aware: params.bogus"},
      {"{\"workers\": [\"ftp://127.0.0.1:9002\"]}", "ftp://127.0.0.1:9002"},
      {"{\"workers\": [], \"policy\": \"kv_aware\"}", "worker"},
      {"{\"workers\": [\"http://127.0.0.1:9002\"], \"no_such_key\": 1}", "no_such_key"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cases); i++) {
    char err[512] = "";
    assert_int_not_equal(reload(&f, cases[i].json, err, sizeof err), 0);
    if (strstr(err, cases[i].msg) == NULL)
      fail_msg("case %zu: '%s' does not mention '%s'", i, err, cases[i].msg);
    assert_null(strchr(err, '\n'));
    assert_ptr_equal(f.r->policy, p);
    assert_int_equal(served(f.r, "http://127.0.0.1:9001"), id);
    assert_int_equal(served(f.r, "http://127.0.0.1:9002"), -1);
    assert_int_equal(count_workers(f.r), 1);
    assert_string_equal(f.cfg.policy, "least_load");
    assert_int_equal(f.cfg.nworkers, 1);
  }
  assert_counts(s0, f0 + KVR_ARRAY_SIZE(cases));
  fx_close(&f);
  kvr_log_set_level(KVR_LOG_INFO);
}

/* lora_adapters is read at each request: a reload swaps the list whole (the router's next
 * decision sees it), the same list changes nothing, a bad entry changes nothing. */
static void test_lora_adapters(void **state) {
  (void)state;
  kvr_log_set_level(KVR_LOG_OFF);
  fx_t f;
  fx_open(&f, "{\"workers\": [\"http://127.0.0.1:9001\"], \"lora_adapters\": [\"a=/p/a\"]}");
  assert_non_null(kvr_router_lora_dynamic(f.r, "a"));
  char err[512] = "";
  const char *two = "{\"workers\": [\"http://127.0.0.1:9001\"], \"lora_adapters\": [\"a=/p/a2\","
                    " {\"name\": \"b\", \"path\": \"/p/b\", \"base_model_name\": \"m\"}]}";
  assert_int_equal(reload(&f, two, err, sizeof err), 0);
  assert_int_equal(f.cfg.nlora_adapters, 2);
  assert_string_equal(kvr_router_lora_dynamic(f.r, "a")->path, "/p/a2");
  assert_string_equal(kvr_router_lora_dynamic(f.r, "b")->base, "m");
  const kvr_lora_adapter_t *was = f.cfg.lora_adapters;
  assert_int_equal(reload(&f, two, err, sizeof err), 0);
  assert_ptr_equal(f.cfg.lora_adapters, was); /* unchanged: not swapped */
  assert_int_not_equal(reload(&f,
                              "{\"workers\": [\"http://127.0.0.1:9001\"],"
                              " \"lora_adapters\": [\"a=/p,x\"]}",
                              err, sizeof err),
                       0);
  assert_non_null(strstr(err, "want NAME=PATH"));
  assert_int_equal(f.cfg.nlora_adapters, 2);
  assert_int_equal(reload(&f, "{\"workers\": [\"http://127.0.0.1:9001\"]}", err, sizeof err), 0);
  assert_int_equal(f.cfg.nlora_adapters, 0);
  assert_null(kvr_router_lora_dynamic(f.r, "a"));
  fx_close(&f);
  kvr_log_set_level(KVR_LOG_INFO);
}

KVR_TEST_MAIN(cmocka_unit_test(test_config_path), cmocka_unit_test(test_apply),
              cmocka_unit_test(test_dp_workers), cmocka_unit_test(test_bad_files_change_nothing),
              cmocka_unit_test(test_lora_adapters))

/* fuzz_config.c -- libFuzzer target: a `kvrouter serve --config FILE.json` document
 * (src/core/config.c over the option engine src/base/cli.c) and the policy parameters it may carry,
 * applied to every policy of the registry (policies/policy.c kvr_policy_create, as --policy-params,
 * the config's "policy_params" and PUT /admin/policy's "params" all are).
 *
 * The input is the JSON text. Invariants:
 *   - kvr_config_apply_json returns 0 or KVR_EINVAL with a message naming the source (not checked:
 *     that it is one line; an unknown key's control characters are escaped, but a value holding a
 *     raw LF, which cJSON accepts, may still be echoed in the message);
 *     the outcome (code, message, resulting settings) is deterministic;
 *   - a document that applied cleanly applies again onto its own result with no change (every
 *     setting replaces, never accumulates: "workers" replaces the list), and kvr_config_validate
 *     answers 0 or KVR_EINVAL with a message;
 *   - `serve --policy-params TEXT` is accepted exactly when TEXT is a JSON object, which then is
 *     the config's policy_params;
 *   - for every policy and every candidate params object (the document itself, its
 *     "policy_params"), create either fails with "params..." in err, or succeeds and then: the
 *     echoed parameters hold the value given for each field, creating from the echo gives the same
 *     echo, and select picks an eligible worker (or none) and agrees with peek.
 */
#include "fuzz_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "policies/policy.h"

#include <cjson/cJSON.h>

#define SOURCE "fuzz.json"

/* Every setting of cfg as text, to compare two configs. */
static void describe(const kvr_config_t *c, kvr_buf_t *out) {
  kvr_buf_printf(out, "%s|%s|%s|%s|%s|%s|%s|%s|", c->listen, c->admin_listen, c->policy,
                 c->log_level, c->log_format, c->admin_token_file ? c->admin_token_file : "-",
                 c->admin_token ? c->admin_token : "-",
                 c->worker_ca_file ? c->worker_ca_file : "-");
  for (size_t i = 0; i < c->nworkers; i++)
    kvr_buf_printf(out, "w=%s,%u|", c->workers[i], c->worker_dp_size ? c->worker_dp_size[i] : 0);
  const kvr_http_limits_t *l = &c->limits;
  kvr_buf_printf(out, "%zu %zu %zu %zu %llu %llu %zu|", l->max_url, l->max_header_bytes,
                 l->max_header_fields, l->max_body, (unsigned long long)l->header_timeout_ms,
                 (unsigned long long)l->keepalive_timeout_ms, l->max_connections);
  uint64_t u[] = {c->connect_timeout_ms,    c->first_byte_timeout_ms, c->idle_timeout_ms,
                  c->retry_after_s,         c->response_buffer_max,   c->block_chars,
                  c->cache_capacity_blocks, c->scrape_interval_ms,    c->scrape_stale_ms,
                  c->fail_threshold,        c->shutdown_grace_ms,     c->seed};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(u); i++)
    kvr_buf_printf(out, "%llu ", (unsigned long long)u[i]);
  kvr_buf_printf(out, "%d%d%d|", c->worker_header, c->access_log, c->admin_open_reads);
  if (c->policy_params) {
    char *p = cJSON_PrintUnformatted(c->policy_params);
    FUZZ_CHECK(p != NULL);
    kvr_buf_puts(out, p);
    cJSON_free(p);
  }
}

static int apply(kvr_config_t *cfg, const char *json, size_t len, char *err, size_t errlen) {
  err[0] = '\0';
  int rc = kvr_config_apply_json(cfg, json, len, SOURCE, err, errlen);
  FUZZ_CHECK(rc == 0 || rc == KVR_EINVAL);
  if (rc != 0)
    FUZZ_CHECK(strncmp(err, SOURCE ": ", strlen(SOURCE ": ")) == 0);
  return rc;
}

/* The value params gives field name, the last one when repeated (cJSON keeps duplicate keys; the
 * policy parser assigns them in order). */
static const cJSON *last_item(const cJSON *params, const char *name) {
  const cJSON *hit = NULL, *it;
  cJSON_ArrayForEach(it, params) {
    if (it->string && strcmp(it->string, name) == 0)
      hit = it;
  }
  return hit;
}

static cJSON *echo(const kvr_policy_t *p) {
  cJSON *o = cJSON_CreateObject();
  FUZZ_CHECK(o != NULL);
  p->ops->params(p, o);
  return o;
}

/* select and peek over a small fixed cluster and the echoed parameters' round trip. */
static void check_policy(kvr_policy_t *p, const cJSON *params, uint64_t seed) {
  cJSON *e = echo(p);
  const cJSON *it;
  cJSON_ArrayForEach(it, e) {
    FUZZ_CHECK(cJSON_IsNumber(it));
    const cJSON *given = cJSON_IsObject(params) ? last_item(params, it->string) : NULL;
    if (given)
      FUZZ_CHECK(given->valuedouble == it->valuedouble);
  }
  char err[512];
  kvr_policy_t *q = kvr_policy_create(p->ops->name, e, seed, err, sizeof err);
  FUZZ_CHECK(q != NULL);
  cJSON *e2 = echo(q);
  FUZZ_CHECK(cJSON_Compare(e, e2, true));
  cJSON_Delete(e2);
  cJSON_Delete(e);
  kvr_policy_destroy(q);

  static const uint64_t blocks[] = {11, 22, 33, 44};
  kvr_worker_snap_t w[4] = {
      {.id = 1, .usable = true, .inflight = 3, .active_tokens = 900, .matched_blocks = 2},
      {.id = 2,
       .usable = true,
       .metrics_fresh = true,
       .num_requests_running = 1,
       .kv_cache_usage = 0.5,
       .cache_capacity_blocks = 100,
       .cached_blocks = 40},
      {.id = 3, .usable = false, .matched_blocks = 4},
      {.id = 4,
       .usable = true,
       .queued_prefill_tokens = 500,
       .prefill_backlog_tokens = 200,
       .matched_blocks = 4},
  };
  kvr_route_req_t req = {
      .blocks = blocks, .nblocks = 4, .block_chars = 64, .prompt_tokens = 64, .max_tokens = 16};
  for (uint64_t word = 0; word < 4; word++) {
    kvr_workerset_t tried = {&word, 1};
    kvr_policy_score_t s1[4], s2[4];
    int peek = kvr_policy_peek(p, w, 4, &req, &tried, s1);
    int pick = kvr_policy_select(p, w, 4, &req, &tried, s2);
    FUZZ_CHECK(peek == pick);
    FUZZ_CHECK(pick == KVR_POLICY_NONE || (pick >= 0 && pick < 4));
    if (pick >= 0)
      FUZZ_CHECK(kvr_policy_eligible(&w[pick], (size_t)pick, &tried) && s2[pick].eligible);
  }
}

static void check_params(const cJSON *params, uint64_t seed) {
  for (size_t i = 0; kvr_policy_registry[i] != NULL; i++) {
    char err[512] = "";
    kvr_policy_t *p =
        kvr_policy_create(kvr_policy_registry[i]->name, params, seed, err, sizeof err);
    if (p == NULL) {
      FUZZ_CHECK(strncmp(err, "params", 6) == 0);
      continue;
    }
    check_policy(p, params, seed);
    kvr_policy_destroy(p);
  }
}

/* The input as `serve --worker URL --policy-params TEXT`: accepted exactly when TEXT is a JSON
 * object, which then is the config's policy_params. */
static void check_flag(const uint8_t *data, size_t len) {
  char *text = fuzz_strndup(data, len);
  char *argv[] = {"serve", "--worker", "http://127.0.0.1:9001", "--policy-params", text, NULL};
  kvr_config_t c;
  kvr_config_init(&c);
  char err[512] = "";
  int rc = kvr_config_parse_args(&c, 5, argv, stdout, err, sizeof err);
  cJSON *want = cJSON_Parse(text);
  if (cJSON_IsObject(want)) {
    FUZZ_CHECK(rc == 0);
    FUZZ_CHECK(c.policy_params != NULL);
    /* Printed, not cJSON_Compare: that looks duplicate keys up by name and finds the first. */
    char *a = cJSON_PrintUnformatted(c.policy_params), *b = cJSON_PrintUnformatted(want);
    FUZZ_CHECK(a != NULL && b != NULL && strcmp(a, b) == 0);
    cJSON_free(a);
    cJSON_free(b);
  } else {
    FUZZ_CHECK(rc == KVR_EINVAL && strstr(err, "policy-params") != NULL);
  }
  cJSON_Delete(want);
  kvr_config_free(&c);
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  kvr_log_set_level(KVR_LOG_OFF);
  const char *json = (const char *)data;
  char err1[512], err2[512];
  kvr_config_t a, b;
  kvr_config_init(&a);
  kvr_config_init(&b);
  int rc = apply(&a, json, len, err1, sizeof err1);
  FUZZ_CHECK(apply(&b, json, len, err2, sizeof err2) == rc);
  FUZZ_CHECK(strcmp(err1, err2) == 0);
  kvr_buf_t da = KVR_BUF_INIT, db = KVR_BUF_INIT;
  describe(&a, &da);
  describe(&b, &db);
  FUZZ_CHECK(da.len == db.len && memcmp(da.data, db.data, da.len) == 0);
  if (rc == 0) {
    FUZZ_CHECK(apply(&b, json, len, err2, sizeof err2) == 0); /* idempotent */
    kvr_buf_reset(&db);
    describe(&b, &db);
    FUZZ_CHECK(da.len == db.len && memcmp(da.data, db.data, da.len) == 0);
    int v = kvr_config_validate(&a, err1, sizeof err1);
    FUZZ_CHECK(v == 0 || (v == KVR_EINVAL && err1[0] != '\0'));
    if (a.policy_params)
      check_params(a.policy_params, a.seed);
  }
  /* The document itself as a params object (what a bad --policy-params or admin body could be). */
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (root != NULL)
    check_params(root, 1);
  cJSON_Delete(root);
  check_flag(data, len);
  kvr_buf_free(&da);
  kvr_buf_free(&db);
  kvr_config_free(&a);
  kvr_config_free(&b);
  return 0;
}

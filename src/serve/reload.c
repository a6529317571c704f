/* reload.c -- SIGHUP reload of `kvrouter serve`'s settings (reload.h).
 *
 * Flow of kvr_reload_apply(): parse argv again into a fresh kvr_config_t `next` (the parser reads
 * the --config file and validates), create the candidate policy (checks its parameters) and check
 * that the worker slots suffice; only then change anything. The settings are described by two
 * tables, scalars and strings, each entry with its JSON key and whether it is read live: a live
 * one is copied (scalars) or swapped (strings) from next into the live configuration, the others
 * are compared and, when they differ, logged as needing a restart. Then the workers and the policy
 * go through the router's calls. `next` ends up holding what live no longer needs and is freed.
 *
 * Invariant: the router's cfg pointer keeps pointing at the same live struct; every pointer it
 * holds is either unchanged or swapped in one step on the loop thread, so no reader ever sees a
 * half-applied field.
 */
#include "serve/reload.h"

#include "base/kvr.h"
#include "base/log.h"
#include "base/metrics.h"
#include "serve/discovery.h"

#include <stdio.h>
#include <string.h>

static uint64_t reloads_total[2]; /* [0] success, [1] failure */

/* ---- the settings ------------------------------------------------------------------------------
 */

typedef enum { K_U64, K_U32, K_SIZE, K_BOOL, K_DBL } scalar_kind_t;

typedef struct {
  const char *key; /* the JSON key, as the config file names it */
  scalar_kind_t kind;
  size_t off; /* offsetof in kvr_config_t */
  bool live;  /* read by its users at each use: safe to change at runtime */
} scalar_t;

#define SC(key, kind, field, live)                                                                 \
  { key, kind, offsetof(kvr_config_t, field), live }

static const scalar_t scalars[] = {
    SC("timeouts.connect_ms", K_U64, connect_timeout_ms, true),
    SC("timeouts.first_byte_ms", K_U64, first_byte_timeout_ms, true),
    SC("timeouts.idle_ms", K_U64, idle_timeout_ms, true),
    SC("retry_after_s", K_U64, retry_after_s, true),
    SC("resume.streams", K_BOOL, resume_streams, true),
    SC("resume.max_per_request", K_U64, resume_max, true),
    /* The body guard reads these at each request (proxy.c). */
    SC("limits.max_json_depth", K_U32, body_guard.max_depth, true),
    SC("limits.max_json_values", K_U64, body_guard.max_nodes, true),
    SC("limits.max_json_open_keys", K_U64, body_guard.max_open_keys, true),
    SC("limits.max_messages", K_U64, body_guard.max_messages, true),
    SC("limits.max_content_parts", K_U64, body_guard.max_parts, true),
    SC("limits.max_prompt_token_ids", K_U64, body_guard.max_prompt_tokens, true),
    SC("limits.response_buffer_bytes", K_SIZE, response_buffer_max, true),
    SC("health.fail_threshold", K_U64, fail_threshold, true),
    SC("metrics_scrape.stale_ms", K_U64, scrape_stale_ms, true),
    SC("worker_header", K_BOOL, worker_header, true),
    SC("access_log", K_BOOL, access_log, true),
    SC("shutdown_grace_ms", K_U64, shutdown_grace_ms, true),
    SC("seed", K_U64, seed, true),
    /* The router reads these at each decision, result and retry; the proxy at each admission. */
    SC("outlier.consecutive_failures", K_U64, outlier_consecutive, true),
    SC("outlier.base_ejection_ms", K_U64, outlier_base_ejection_ms, true),
    SC("outlier.max_ejection_ms", K_U64, outlier_max_ejection_ms, true),
    SC("outlier.max_ejection_percent", K_U64, outlier_max_percent, true),
    SC("retry.budget_percent", K_U64, retry_budget_percent, true),
    SC("retry.min_concurrency", K_U64, retry_min_concurrency, true),
    SC("admission.max_inflight", K_U64, admission_max_inflight, true),
    SC("admission.queue_limit", K_U64, admission_queue_limit, true),
    SC("admission.max_wait_ms", K_U64, admission_max_wait_ms, true),
    /* Read by the peers' polls at each tick and the router at each snapshot. */
    SC("peer.stale_ms", K_U64, peer_stale_ms, true),
    /* Taken by the discovery at kvr_discovery_apply(), right after the reload. */
    SC("discovery.interval_ms", K_U64, discover_interval_ms, true),
    SC("discovery.kv_events_port", K_U64, discover_kv_events_port, true),
    SC("discovery.kv_replay_port", K_U64, discover_kv_replay_port, true),
    SC("discovery.dp_size", K_U64, discover_dp_size, true),
    /* Copied by each KV-event stream and the tokenizer when they are created. */
    SC("kv_events.refill_ms", K_U64, kv_events_refill_ms, false),
    SC("kv_events.replay_timeout_ms", K_U64, kv_events_replay_timeout_ms, false),
    SC("kv_events.tokenize_cache_entries", K_SIZE, tokenize_cache_entries, false),
    SC("kv_events.tokenize_prefix_coverage", K_DBL, tokenize_prefix_coverage, false),
    SC("peer.interval_ms", K_U64, peer_interval_ms, false),
    /* The listener copied these when it was created. */
    SC("timeouts.client_header_ms", K_U64, limits.header_timeout_ms, false),
    SC("timeouts.client_body_ms", K_U64, limits.body_timeout_ms, false),
    SC("timeouts.client_keepalive_ms", K_U64, limits.keepalive_timeout_ms, false),
    SC("limits.max_body_bytes", K_SIZE, limits.max_body, false),
    SC("limits.max_url_bytes", K_SIZE, limits.max_url, false),
    SC("limits.max_header_bytes", K_SIZE, limits.max_header_bytes, false),
    SC("limits.max_header_fields", K_SIZE, limits.max_header_fields, false),
    SC("limits.max_connections", K_SIZE, limits.max_connections, false),
    SC("limits.max_body_buffer_bytes", K_SIZE, limits.max_body_buffer, false),
    /* The trace file is opened with these at start. */
    SC("trace.max_bytes", K_U64, trace_out_max_bytes, false),
    /* The router sizes its response-id map at start. */
    SC("limits.response_ids_max", K_SIZE, response_ids_max, false),
    SC("session.keys_max", K_SIZE, session_keys_max, false),
    SC("trace.block_tokens", K_SIZE, trace_block_tokens, false),
    /* The cache index is sized and hashed with these. */
    SC("cache.block_chars", K_SIZE, block_chars, false),
    SC("cache.capacity_blocks", K_U64, cache_capacity_blocks, false),
    /* The scrape timer's period is set when it starts. */
    SC("metrics_scrape.interval_ms", K_U64, scrape_interval_ms, false),
    SC("admin_open_reads", K_BOOL, admin_open_reads, false),
    SC("reuse_port", K_BOOL, reuse_port, false),
};

typedef struct {
  const char *key;
  size_t off;
  bool live;
  bool secret; /* never logged */
} string_t;

#define ST(key, field, live, secret)                                                               \
  { key, offsetof(kvr_config_t, field), live, secret }

static const string_t strings[] = {
    ST("log_level", log_level, true, false),
    ST("log_format", log_format, true, false),
    ST("discovery.url", discover_url, true, false),
    ST("listen", listen, false, false),
    ST("admin_listen", admin_listen, false, false),
    ST("admin_token_file", admin_token_file, false, false),
    ST("the admin token", admin_token, false, true),
    ST("worker_ca_file", worker_ca_file, false, false),
    ST("trace.out", trace_out, false, false),
    ST("session.header", session_header, true, false),
    ST("kv_events.topic", kv_events_topic, false, false),
    ST("peer.sync_listen", peer_sync_listen, false, false),
};

static uint64_t scalar_get(const kvr_config_t *c, const scalar_t *s) {
  const char *p = (const char *)c + s->off;
  switch (s->kind) {
  case K_U64:
    return *(const uint64_t *)p;
  case K_U32:
    return *(const uint32_t *)p;
  case K_SIZE:
    return *(const size_t *)p;
  case K_BOOL:
    return *(const bool *)p;
  case K_DBL: { /* compared by value bits, printed by scalar_text */
    uint64_t bits;
    memcpy(&bits, p, sizeof bits);
    return bits;
  }
  }
  return 0;
}

/* A scalar's value as the log shows it. */
static const char *scalar_text(const scalar_t *s, uint64_t v, char *buf, size_t size) {
  double d;
  memcpy(&d, &v, sizeof d);
  if (s->kind == K_DBL)
    snprintf(buf, size, "%g", d);
  else
    snprintf(buf, size, "%llu", (unsigned long long)v);
  return buf;
}

static void scalar_copy(kvr_config_t *dst, const kvr_config_t *src, const scalar_t *s) {
  size_t size = s->kind == K_U64    ? sizeof(uint64_t)
                : s->kind == K_U32  ? sizeof(uint32_t)
                : s->kind == K_SIZE ? sizeof(size_t)
                : s->kind == K_DBL  ? sizeof(double)
                                    : sizeof(bool);
  memcpy((char *)dst + s->off, (const char *)src + s->off, size);
}

static char **string_at(kvr_config_t *c, const string_t *s) {
  return (char **)((char *)c + s->off);
}

static bool str_eq(const char *a, const char *b) {
  return (a == NULL || b == NULL) ? a == b : strcmp(a, b) == 0;
}

/* Copies or swaps every changed setting of next into live (live ones) or logs it (the others).
 * Adds to *applied and *restart. */
static void apply_settings(kvr_config_t *live, kvr_config_t *next, int *applied, int *restart) {
  for (size_t i = 0; i < KVR_ARRAY_SIZE(scalars); i++) {
    const scalar_t *s = &scalars[i];
    uint64_t was = scalar_get(live, s), now = scalar_get(next, s);
    if (was == now)
      continue;
    char a[32], b[32];
    if (s->live) {
      scalar_copy(live, next, s);
      KVR_INFO("reload", "%s: %s -> %s", s->key, scalar_text(s, was, a, sizeof a),
               scalar_text(s, now, b, sizeof b));
      (*applied)++;
    } else {
      KVR_WARN("reload", "%s: %s -> %s needs restart, left at %s", s->key,
               scalar_text(s, was, a, sizeof a), scalar_text(s, now, b, sizeof b),
               scalar_text(s, was, a, sizeof a));
      (*restart)++;
    }
  }
  for (size_t i = 0; i < KVR_ARRAY_SIZE(strings); i++) {
    const string_t *s = &strings[i];
    char **was = string_at(live, s), **now = string_at(next, s);
    if (str_eq(*was, *now))
      continue;
    if (s->secret) {
      KVR_WARN("reload", "%s changed: needs restart, the old one stays in force", s->key);
      (*restart)++;
    } else if (s->live) {
      KVR_INFO("reload", "%s: %s -> %s", s->key, *was ? *was : "(none)", *now ? *now : "(none)");
      char *t = *was;
      *was = *now;
      *now = t;
      (*applied)++;
    } else {
      KVR_WARN("reload", "%s: %s -> %s needs restart, left unchanged", s->key,
               *was ? *was : "(none)", *now ? *now : "(none)");
      (*restart)++;
    }
  }
  kvr_log_level_t lvl;
  if (kvr_log_parse_level(live->log_level, &lvl) == 0)
    kvr_log_set_level(lvl);
  kvr_log_format_t fmt;
  if (kvr_log_parse_format(live->log_format, &fmt) == 0)
    kvr_log_set_format(fmt);
}

/* ---- workers -----------------------------------------------------------------------------------
 */

static uint32_t dp_of(const kvr_config_t *c, size_t i) {
  return c->worker_dp_size ? c->worker_dp_size[i] : 0;
}

/* Whether c lists w's URL with w's shape (a whole server, or the same number of ranks). */
static bool listed(const kvr_config_t *c, const kvr_worker_t *w) {
  for (size_t i = 0; i < c->nworkers; i++)
    if (strcmp(c->workers[i], w->url) == 0 && dp_of(c, i) == w->dp_size)
      return true;
  return false;
}

/* Whether worker w stays: the new list names it, or the discovery found it (the discovery itself
 * drains what it found once its settings or its answers say so). */
static bool kept(const kvr_config_t *c, const kvr_discovery_t *disc, const kvr_worker_t *w) {
  return listed(c, w) || kvr_discovery_has(disc, w->url);
}

/* Whether the router serves c's i-th entry in its shape (its first rank stands for all). */
static bool served(const kvr_router_t *r, const kvr_config_t *c, size_t i) {
  uint32_t dp = dp_of(c, i);
  const kvr_worker_t *w = kvr_router_worker_serving_rank(r, c->workers[i], dp ? 0 : -1);
  return w != NULL && w->dp_size == dp;
}

/* Checks that the workers to add find free slots once the ones to drain that have nothing in
 * flight are freed. Returns 0 or KVR_ELIMIT with err. */
static int check_slots(const kvr_router_t *r, const kvr_config_t *next, const kvr_discovery_t *disc,
                       char *err, size_t errlen) {
  size_t free_slots = 0, adds = 0;
  for (size_t i = 0; i < KVR_MAX_WORKERS; i++) {
    const kvr_worker_t *w = i < r->nslots ? r->slots[i] : NULL;
    if (w == NULL || (w->state != KVR_WORKER_DRAINING && w->inflight == 0 && !kept(next, disc, w)))
      free_slots++;
  }
  for (size_t i = 0; i < next->nworkers; i++)
    if (!served(r, next, i))
      adds += dp_of(next, i) ? dp_of(next, i) : 1;
  if (adds <= free_slots)
    return 0;
  snprintf(err, errlen,
           "workers: %zu new workers but only %zu free slots (a draining worker keeps its slot "
           "until its requests end; at most %d workers)",
           adds, free_slots, KVR_MAX_WORKERS);
  return KVR_ELIMIT;
}

/* Sets next's i-th entry's KV-event endpoints on its workers where they differ (each rank on
 * vLLM's port + rank). Adds to *applied. */
static void apply_kv(const kvr_config_t *next, size_t i, kvr_router_t *r, int *applied) {
  uint32_t dp = dp_of(next, i);
  const char *ev = next->worker_kv_events[i], *rp = next->worker_kv_replay[i];
  for (uint32_t k = 0; k < (dp ? dp : 1); k++) {
    const kvr_worker_t *w =
        kvr_router_worker_serving_rank(r, next->workers[i], dp ? (int32_t)k : -1);
    char evr[600], rpr[600], err[256];
    const char *e =
        ev && kvr_url_kv_endpoint_rank(ev, k, evr, sizeof evr, err, sizeof err) == 0 ? evr : NULL;
    const char *p =
        e && rp && kvr_url_kv_endpoint_rank(rp, k, rpr, sizeof rpr, err, sizeof err) == 0 ? rpr
                                                                                          : NULL;
    if (w && (!str_eq(w->kv_events, e) || !str_eq(w->kv_replay, p))) {
      KVR_INFO("reload", "worker %u: KV events %s", w->id, e ? e : "off");
      kvr_router_set_worker_kv(r, w->id, e, p);
      (*applied)++;
    }
  }
}

/* Drains the served workers next does not list (or lists in another shape: a whole server that
 * became data-parallel ranks, another number of ranks), adds the listed ones not served, then
 * makes next's list the live one. Adds to *applied. */
static void apply_workers(kvr_config_t *live, kvr_config_t *next, kvr_router_t *r,
                          const kvr_discovery_t *disc, int *applied) {
  uint32_t drain[KVR_MAX_WORKERS];
  size_t ndrain = 0;
  for (size_t i = 0; i < r->nslots; i++) {
    const kvr_worker_t *w = r->slots[i];
    if (w && w->state != KVR_WORKER_DRAINING && !kept(next, disc, w))
      drain[ndrain++] = w->id;
  }
  for (size_t i = 0; i < ndrain; i++) {
    KVR_INFO("reload", "worker %u is not in the config any more: draining", drain[i]);
    kvr_router_drain_worker(r, drain[i]);
    (*applied)++;
  }
  char err[256];
  for (size_t i = 0; i < next->nworkers; i++) {
    if (served(r, next, i))
      continue;
    int n =
        kvr_router_add_workers(r, next->workers[i], dp_of(next, i), NULL, NULL, err, sizeof err);
    if (n <= 0)
      KVR_ERROR("reload", "worker %s not added: %s", next->workers[i], err);
    else
      (*applied) += n;
  }
  /* KV-event endpoints: set on new workers, changed on kept ones whose config changed them */
  for (size_t i = 0; i < next->nworkers; i++)
    apply_kv(next, i, r, applied);
  char **t = live->workers, **te = live->worker_kv_events, **tr = live->worker_kv_replay;
  uint32_t *td = live->worker_dp_size;
  size_t n = live->nworkers;
  live->workers = next->workers;
  live->worker_kv_events = next->worker_kv_events;
  live->worker_kv_replay = next->worker_kv_replay;
  live->worker_dp_size = next->worker_dp_size;
  live->nworkers = next->nworkers;
  next->workers = t;
  next->worker_kv_events = te;
  next->worker_kv_replay = tr;
  next->worker_dp_size = td;
  next->nworkers = n;
}

/* The runtime-loadable LoRA adapters (lora_adapters) are read at each request: a changed list is
 * swapped in whole (a load in flight keeps its own copy of its adapter). */
static bool lora_same(const kvr_lora_adapter_t *a, const kvr_lora_adapter_t *b) {
  return strcmp(a->name, b->name) == 0 && strcmp(a->path, b->path) == 0 && str_eq(a->base, b->base);
}

static void apply_lora_adapters(kvr_config_t *live, kvr_config_t *next, int *applied) {
  bool same = live->nlora_adapters == next->nlora_adapters;
  for (size_t i = 0; same && i < live->nlora_adapters; i++)
    same = lora_same(&live->lora_adapters[i], &next->lora_adapters[i]);
  if (same)
    return;
  KVR_INFO("reload", "lora_adapters: %zu -> %zu adapters", live->nlora_adapters,
           next->nlora_adapters);
  kvr_lora_adapter_t *t = live->lora_adapters;
  size_t n = live->nlora_adapters;
  live->lora_adapters = next->lora_adapters;
  live->nlora_adapters = next->nlora_adapters;
  next->lora_adapters = t;
  next->nlora_adapters = n;
  (*applied)++;
}

/* The peer list is read when the poll timer starts: a change needs a restart. */
static void check_peers(const kvr_config_t *live, const kvr_config_t *next, int *restart) {
  bool same = live->npeers == next->npeers;
  for (size_t i = 0; same && i < live->npeers; i++)
    same = strcmp(live->peers[i], next->peers[i]) == 0;
  if (!same) {
    KVR_WARN("reload", "peers changed: needs restart, the old list stays in force");
    (*restart)++;
  }
}

/* ---- policy ------------------------------------------------------------------------------------
 */

/* Whether cand is the same policy as cur with the same effective parameters. */
static bool same_policy(const kvr_policy_t *cur, const kvr_policy_t *cand) {
  if (strcmp(kvr_policy_name(cur), kvr_policy_name(cand)) != 0)
    return false;
  cJSON *a = cJSON_CreateObject(), *b = cJSON_CreateObject();
  cur->ops->params(cur, a);
  cand->ops->params(cand, b);
  bool same = cJSON_Compare(a, b, true);
  cJSON_Delete(a);
  cJSON_Delete(b);
  return same;
}

/* Installs next's policy when it differs from the active one or the seed changed; then makes
 * next's policy settings the live ones. Cannot fail: the candidate was created from the same
 * settings. */
static void apply_policy(kvr_config_t *live, kvr_config_t *next, kvr_router_t *r,
                         const kvr_policy_t *cand, bool seed_changed, int *applied) {
  char err[256];
  if (seed_changed || !same_policy(r->policy, cand)) {
    if (kvr_router_set_policy(r, next->policy, next->policy_params, err, sizeof err) != 0)
      KVR_ERROR("reload", "policy %s not installed: %s", next->policy, err);
    else
      (*applied)++;
  }
  char *p = live->policy;
  live->policy = next->policy;
  next->policy = p;
  cJSON *pp = live->policy_params;
  live->policy_params = next->policy_params;
  next->policy_params = pp;
}

/* ---- entry points ------------------------------------------------------------------------------
 */

const char *kvr_reload_config_path(int argc, char **argv) {
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
      path = argv[++i];
    else if (strncmp(argv[i], "--config=", 9) == 0)
      path = argv[i] + 9;
  }
  return path;
}

/* Parses and checks everything; on success *next holds the settings and *cand their policy. */
static int prepare(kvr_config_t *next, kvr_policy_t **cand, const kvr_router_t *r,
                   const kvr_discovery_t *disc, int argc, char **argv, char *err, size_t errlen) {
  kvr_config_init(next);
  FILE *devnull = fopen("/dev/null", "w");
  int rc = kvr_config_parse_args(next, argc, argv, devnull ? devnull : stdout, err, errlen);
  if (devnull)
    fclose(devnull);
  if (rc > 0) {
    snprintf(err, errlen, "the command line asks for --help or --version");
    return KVR_EINVAL;
  }
  if (rc < 0)
    return rc;
  char perr[512];
  *cand = kvr_policy_create(next->policy, next->policy_params, next->seed, perr, sizeof perr);
  if (*cand == NULL) {
    snprintf(err, errlen, "policy_params of %s: %s", next->policy, perr);
    return KVR_EINVAL;
  }
  return check_slots(r, next, disc, err, errlen);
}

int kvr_reload_apply(kvr_config_t *live, kvr_router_t *r, const kvr_discovery_t *disc, int argc,
                     char **argv, char *err, size_t errlen) {
  kvr_config_t next;
  kvr_policy_t *cand = NULL;
  int rc = prepare(&next, &cand, r, disc, argc, argv, err, errlen);
  if (rc != 0) {
    kvr_policy_destroy(cand);
    kvr_config_free(&next);
    reloads_total[1]++;
    return rc;
  }
  int applied = 0, restart = 0;
  bool seed_changed = next.seed != live->seed;
  apply_settings(live, &next, &applied, &restart);
  check_peers(live, &next, &restart);
  apply_lora_adapters(live, &next, &applied);
  apply_workers(live, &next, r, disc, &applied);
  apply_policy(live, &next, r, cand, seed_changed, &applied);
  kvr_policy_destroy(cand);
  kvr_config_free(&next);
  reloads_total[0]++;
  KVR_INFO("reload", "config reloaded: %d changes applied, %d need a restart", applied, restart);
  return 0;
}

void kvr_reload_metrics(kvr_buf_t *out) {
  kvr_metric_family(out, "kvrouter_config_reloads_total", "counter",
                    "Configuration reloads (SIGHUP), by result; a failed one changed nothing");
  kvr_metric_sample(out, "kvrouter_config_reloads_total", "result=\"success\"",
                    (double)reloads_total[0]);
  kvr_metric_sample(out, "kvrouter_config_reloads_total", "result=\"failure\"",
                    (double)reloads_total[1]);
}

/* config.c -- `kvrouter serve` settings: the serve table of the option engine (cli.h).
 *
 * Each entry of `options` names a command-line flag, the JSON path of the same setting in the
 * config file, its kind and range, where it lives in kvr_config_t and one line of help; the engine
 * parses flags and JSON keys through the same setters, and --help prints every default from a
 * freshly initialized kvr_config_t, so the two spellings of a setting can never disagree on
 * validation and the help can never disagree with the defaults. Four settings need code of their
 * own (custom setters below): --worker (a validated list: the first --worker on the command line
 * replaces the file's list; --lora-adapter alike), --policy-params (a JSON object),
 * --listen/--admin-listen (HOST:PORT) and --config (the file, applied before every flag so flags
 * override it wherever they stand). Cross-field rules are kvr_config_validate()'s.
 */
#include "core/config.h"

#include "base/buf.h"
#include "proto/http_parse.h" /* kvr_http_limits_default */
#include "proto/trace.h"
#include "proto/url.h"

#include "base/cli.h"
#include "base/kvr.h"
#include "policies/policy.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void clear_workers(kvr_config_t *cfg) {
  for (size_t i = 0; i < cfg->nworkers; i++) {
    free(cfg->workers[i]);
    free(cfg->worker_kv_events[i]);
    free(cfg->worker_kv_replay[i]);
  }
  cfg->nworkers = 0;
}

void kvr_config_free(kvr_config_t *cfg) {
  if (cfg == NULL)
    return;
  free(cfg->listen);
  free(cfg->admin_listen);
  free(cfg->policy);
  free(cfg->log_level);
  free(cfg->log_format);
  free(cfg->admin_token_file);
  if (cfg->admin_token != NULL) /* no copy of the secret left in freed memory */
    memset(cfg->admin_token, 0, strlen(cfg->admin_token));
  free(cfg->admin_token);
  free(cfg->worker_ca_file);
  free(cfg->trace_out);
  free(cfg->session_header);
  free(cfg->discover_url);
  clear_workers(cfg);
  free(cfg->workers);
  free(cfg->worker_kv_events);
  free(cfg->worker_kv_replay);
  free(cfg->worker_dp_size);
  free(cfg->kv_events_topic);
  free(cfg->peer_sync_listen);
  for (size_t i = 0; i < cfg->npeers; i++)
    free(cfg->peers[i]);
  free(cfg->peers);
  cJSON_Delete(cfg->policy_params);
  kvr_config_clear_lora_adapters(cfg);
  memset(cfg, 0, sizeof *cfg);
}

int kvr_config_add_worker(kvr_config_t *cfg, const char *url, char *err, size_t errlen) {
  char norm[512];
  if (kvr_url_worker(url, norm, sizeof norm, err, errlen) != 0)
    return KVR_EINVAL;
  for (size_t i = 0; i < cfg->nworkers; i++) {
    if (strcmp(cfg->workers[i], norm) == 0) {
      snprintf(err, errlen, "worker %s is listed twice", norm);
      return KVR_EINVAL;
    }
  }
  if (cfg->nworkers >= KVR_MAX_WORKERS) {
    snprintf(err, errlen, "too many workers: this router serves at most %d (KVR_MAX_WORKERS)",
             KVR_MAX_WORKERS);
    return KVR_ELIMIT;
  }
  size_t n = cfg->nworkers + 1;
  cfg->workers = kvr_xrealloc(cfg->workers, n * sizeof *cfg->workers);
  cfg->worker_kv_events = kvr_xrealloc(cfg->worker_kv_events, n * sizeof(char *));
  cfg->worker_kv_replay = kvr_xrealloc(cfg->worker_kv_replay, n * sizeof(char *));
  cfg->worker_dp_size = kvr_xrealloc(cfg->worker_dp_size, n * sizeof *cfg->worker_dp_size);
  cfg->workers[cfg->nworkers] = kvr_xstrdup(norm);
  cfg->worker_kv_events[cfg->nworkers] = NULL;
  cfg->worker_kv_replay[cfg->nworkers] = NULL;
  cfg->worker_dp_size[cfg->nworkers] = 0;
  cfg->nworkers++;
  return 0;
}

/* dp_size's text: 1..KVR_DP_SIZE_MAX in decimal. */
static int parse_dp_size(const char *text, uint32_t *out, char *err, size_t errlen) {
  char *end = NULL;
  unsigned long v = strtoul(text, &end, 10);
  if (text[0] < '0' || text[0] > '9' || *end != '\0' || v < 1 || v > KVR_DP_SIZE_MAX) {
    snprintf(err, errlen, "worker: dp_size '%.40s' must be 1..%d", text, KVR_DP_SIZE_MAX);
    return KVR_EINVAL;
  }
  *out = (uint32_t)v;
  return 0;
}

/* The JSON object form of a worker; its fields into *url, *events, *replay (owned), *dp. */
static int worker_object(const char *spec, char **url, char **events, char **replay, uint32_t *dp,
                         char *err, size_t errlen) {
  cJSON *o = cJSON_Parse(spec);
  for (const cJSON *it = o ? o->child : NULL; it; it = it->next) {
    bool num = strcmp(it->string, "dp_size") == 0;
    bool known = num || strcmp(it->string, "url") == 0 || strcmp(it->string, "kv_events") == 0 ||
                 strcmp(it->string, "kv_replay") == 0;
    if (!known || (num ? !cJSON_IsNumber(it) : !cJSON_IsString(it))) {
      snprintf(err, errlen,
               "worker: %s \"%.60s\" (want \"url\", \"kv_events\", \"kv_replay\" strings, "
               "\"dp_size\" a number)",
               known ? "wrong type for" : "unknown key", it->string);
      cJSON_Delete(o);
      return KVR_EINVAL;
    }
    if (num) {
      double d = it->valuedouble;
      if (d != (double)(uint32_t)d) {
        snprintf(err, errlen, "worker: dp_size must be 1..%d", KVR_DP_SIZE_MAX);
        cJSON_Delete(o);
        return KVR_EINVAL;
      }
      char text[16];
      snprintf(text, sizeof text, "%u", (uint32_t)d);
      if (parse_dp_size(text, dp, err, errlen) != 0) {
        cJSON_Delete(o);
        return KVR_EINVAL;
      }
    }
  }
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "url");
  if (!cJSON_IsString(u)) {
    snprintf(err, errlen, "worker: an object needs \"url\"");
    cJSON_Delete(o);
    return KVR_EINVAL;
  }
  *url = kvr_xstrdup(u->valuestring);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "kv_events");
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "kv_replay");
  *events = cJSON_IsString(e) ? kvr_xstrdup(e->valuestring) : NULL;
  *replay = cJSON_IsString(r) ? kvr_xstrdup(r->valuestring) : NULL;
  cJSON_Delete(o);
  return 0;
}

/* The --worker form "URL[,kv_events=EP][,kv_replay=EP][,dp_size=N]". */
static int worker_words(const char *spec, char **url, char **events, char **replay, uint32_t *dp,
                        char *err, size_t errlen) {
  char *copy = kvr_xstrdup(spec), *save = NULL;
  int rc = 0;
  for (char *tok = strtok_r(copy, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
    if (*url == NULL) {
      *url = kvr_xstrdup(tok);
    } else if (strncmp(tok, "kv_events=", 10) == 0 && *events == NULL) {
      *events = kvr_xstrdup(tok + 10);
    } else if (strncmp(tok, "kv_replay=", 10) == 0 && *replay == NULL) {
      *replay = kvr_xstrdup(tok + 10);
    } else if (strncmp(tok, "dp_size=", 8) == 0 && *dp == 0) {
      rc = parse_dp_size(tok + 8, dp, err, errlen);
    } else {
      snprintf(err, errlen,
               "worker '%.200s': unknown or repeated option '%.60s' (kv_events=, kv_replay=, "
               "dp_size=)",
               spec, tok);
      rc = KVR_EINVAL;
    }
  }
  free(copy);
  if (rc == 0 && *url == NULL) {
    snprintf(err, errlen, "worker: empty");
    rc = KVR_EINVAL;
  }
  return rc;
}

/* Every rank's endpoint of ep is one the router can connect to. */
static int check_rank_endpoints(const char *ep, uint32_t dp, char *err, size_t errlen) {
  char ranked[600];
  if (kvr_url_kv_endpoint(ep, err, errlen) != 0)
    return KVR_EINVAL;
  return dp > 1 ? kvr_url_kv_endpoint_rank(ep, dp - 1, ranked, sizeof ranked, err, errlen) : 0;
}

/* "URL[,kv_events=EP][,kv_replay=EP][,dp_size=N]" or {"url": URL, "kv_events": EP, ...}. */
int kvr_config_add_worker_spec(kvr_config_t *cfg, const char *spec, char *err, size_t errlen) {
  char *url = NULL, *events = NULL, *replay = NULL;
  uint32_t dp = 0;
  int rc = spec[0] == '{' ? worker_object(spec, &url, &events, &replay, &dp, err, errlen)
                          : worker_words(spec, &url, &events, &replay, &dp, err, errlen);
  if (rc != 0)
    goto out;
  rc = KVR_EINVAL;
  if (replay && !events) {
    snprintf(err, errlen, "worker %.200s: kv_replay needs kv_events", url);
    goto out;
  }
  if ((events && check_rank_endpoints(events, dp, err, errlen) != 0) ||
      (replay && check_rank_endpoints(replay, dp, err, errlen) != 0))
    goto out;
  rc = kvr_config_add_worker(cfg, url, err, errlen);
  if (rc == 0) {
    cfg->worker_kv_events[cfg->nworkers - 1] = events;
    cfg->worker_kv_replay[cfg->nworkers - 1] = replay;
    cfg->worker_dp_size[cfg->nworkers - 1] = dp;
    events = replay = NULL;
  }
out:
  free(url);
  free(events);
  free(replay);
  return rc;
}

void kvr_config_clear_lora_adapters(kvr_config_t *cfg) {
  for (size_t i = 0; i < cfg->nlora_adapters; i++) {
    free(cfg->lora_adapters[i].name);
    free(cfg->lora_adapters[i].path);
    free(cfg->lora_adapters[i].base);
  }
  free(cfg->lora_adapters);
  cfg->lora_adapters = NULL;
  cfg->nlora_adapters = 0;
}

/* The JSON form of an adapter spec into *a (strings copied). */
static int lora_adapter_json(const char *spec, kvr_lora_adapter_t *a, char *err, size_t errlen) {
  cJSON *o = cJSON_Parse(spec);
  if (!cJSON_IsObject(o)) {
    snprintf(err, errlen, "lora adapter: not a JSON object: %.80s", spec);
    cJSON_Delete(o);
    return KVR_EINVAL;
  }
  for (const cJSON *it = o->child; it; it = it->next) {
    bool known = strcmp(it->string, "name") == 0 || strcmp(it->string, "path") == 0 ||
                 strcmp(it->string, "base_model_name") == 0;
    if (!known || !cJSON_IsString(it)) {
      snprintf(err, errlen,
               "lora adapter: %s \"%.60s\" (want \"name\", \"path\", \"base_model_name\" "
               "strings)",
               known ? "non-string" : "unknown key", it->string);
      cJSON_Delete(o);
      return KVR_EINVAL;
    }
  }
  const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, "name");
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "path");
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(o, "base_model_name");
  a->name = n ? kvr_xstrdup(n->valuestring) : NULL;
  a->path = p ? kvr_xstrdup(p->valuestring) : NULL;
  a->base = b && b->valuestring[0] ? kvr_xstrdup(b->valuestring) : NULL;
  cJSON_Delete(o);
  return 0;
}

int kvr_config_add_lora_adapter(kvr_config_t *cfg, const char *spec, char *err, size_t errlen) {
  kvr_lora_adapter_t a = {0};
  if (spec[0] == '{') {
    if (lora_adapter_json(spec, &a, err, errlen) != 0)
      return KVR_EINVAL;
  } else {
    /* vLLM's rule (cli_args.py): an item with '=' and no ',' is NAME=PATH */
    const char *eq = strchr(spec, '=');
    if (eq == NULL || strchr(spec, ',') != NULL) {
      snprintf(err, errlen, "lora adapter '%.200s': want NAME=PATH or a JSON object", spec);
      return KVR_EINVAL;
    }
    a.name = kvr_xcalloc(1, (size_t)(eq - spec) + 1);
    memcpy(a.name, spec, (size_t)(eq - spec));
    a.path = kvr_xstrdup(eq + 1);
  }
  int rc = KVR_EINVAL;
  if (a.name == NULL || a.name[0] == '\0' || a.path == NULL || a.path[0] == '\0') {
    snprintf(err, errlen, "lora adapter '%.200s': needs a name and a path", spec);
    goto out;
  }
  if (strlen(a.name) > 256 || strlen(a.path) > 4096 || (a.base && strlen(a.base) > 256)) {
    snprintf(err, errlen, "lora adapter '%.60s': a name over 256 bytes or a path over 4096", spec);
    goto out;
  }
  for (size_t i = 0; i < cfg->nlora_adapters; i++)
    if (strcmp(cfg->lora_adapters[i].name, a.name) == 0) {
      snprintf(err, errlen, "lora adapter %.200s is listed twice", a.name);
      goto out;
    }
  cfg->lora_adapters =
      kvr_xrealloc(cfg->lora_adapters, (cfg->nlora_adapters + 1) * sizeof *cfg->lora_adapters);
  cfg->lora_adapters[cfg->nlora_adapters++] = a;
  return 0;
out:
  free(a.name);
  free(a.path);
  free(a.base);
  return rc;
}

/* ---- the settings that need code of their own ---- */

/* --worker / "workers": the first on a command line (or of the file's array) replaces the list. */
static int set_worker(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                      size_t errlen) {
  (void)o;
  if (nth == 0)
    clear_workers(base);
  return kvr_config_add_worker_spec(base, text, err, errlen);
}

/* --lora-adapter / "lora_adapters": the first replaces the list, as --worker does. */
static int set_lora_adapter(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                            char *err, size_t errlen) {
  (void)o;
  if (nth == 0)
    kvr_config_clear_lora_adapters(base);
  return kvr_config_add_lora_adapter(base, text, err, errlen);
}

/* --peer / "peers": another replica's admin base URL; the first replaces the list. */
static int set_peer(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                    size_t errlen) {
  kvr_config_t *cfg = base;
  (void)o;
  if (nth == 0) {
    for (size_t i = 0; i < cfg->npeers; i++)
      free(cfg->peers[i]);
    cfg->npeers = 0;
  }
  char norm[512];
  if (kvr_url_worker(text, norm, sizeof norm, err, errlen) != 0)
    return KVR_EINVAL;
  if (cfg->npeers >= KVR_MAX_PEERS) {
    snprintf(err, errlen, "too many peers (at most %d)", KVR_MAX_PEERS);
    return KVR_ELIMIT;
  }
  cfg->peers = kvr_xrealloc(cfg->peers, (cfg->npeers + 1) * sizeof(char *));
  cfg->peers[cfg->npeers++] = kvr_xstrdup(norm);
  return 0;
}

static int set_policy_params(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                             char *err, size_t errlen) {
  kvr_config_t *cfg = base;
  (void)o;
  (void)nth;
  cJSON *p = cJSON_Parse(text);
  if (p == NULL || !cJSON_IsObject(p)) {
    cJSON_Delete(p);
    snprintf(err, errlen, "not a JSON object");
    return KVR_EINVAL;
  }
  cJSON_Delete(cfg->policy_params);
  cfg->policy_params = p;
  return 0;
}

static int set_addr(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                    size_t errlen) {
  (void)nth;
  struct sockaddr_storage ss;
  if (kvr_url_hostport(text, &ss) != 0) {
    snprintf(err, errlen, "'%s' is not HOST:PORT", text);
    return KVR_EINVAL;
  }
  char **dst = (char **)((char *)base + o->off);
  free(*dst);
  *dst = kvr_xstrdup(text);
  return 0;
}

static void show_addr(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  const char *const *s = (const char *const *)((const char *)base + o->off);
  snprintf(buf, len, "%s", *s ? *s : "");
}

/* --discover URL: checked here (http(s), a host, a port), resolved by discovery.c. */
static int set_discover(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                        char *err, size_t errlen) {
  (void)nth;
  kvr_url_target_t t;
  if (kvr_url_discovery(text, &t, err, errlen) != 0)
    return KVR_EINVAL;
  char **dst = (char **)((char *)base + o->off);
  free(*dst);
  *dst = kvr_xstrdup(text);
  return 0;
}

/* --config FILE.json: read and applied before the other flags. */
static int set_config_file(const kvr_cli_opt_t *o, void *base, const char *path, unsigned nth,
                           char *err, size_t errlen) {
  (void)o;
  (void)nth;
  kvr_buf_t b = KVR_BUF_INIT;
  if (kvr_buf_read_file(&b, path, 1u << 24, err, errlen) != 0)
    return KVR_EINVAL;
  int rc = kvr_config_apply_json(base, b.data ? b.data : "", b.len, path, err, errlen);
  kvr_buf_free(&b);
  return rc;
}

/* ---- the table ---- */

#define F(field) KVR_CLI_FIELD(kvr_config_t, field)

static const char *const log_levels[] = {"debug", "info", "warn", "error", "off", NULL};
static const char *const log_formats[] = {"text", "json", NULL};

static const kvr_cli_opt_t options[] = {
    {KVR_CLI_CUSTOM, "worker", .arg = "URL[,kv_events=EP[,kv_replay=EP]][,dp_size=N]",
     .json = "workers", .flags = KVR_CLI_JSON_LIST | KVR_CLI_JSON_RAW,
     .help = "a worker base URL (http://HOST:PORT or https://HOST:PORT), optionally with its "
             "vLLM KV-event endpoints (tcp://HOST:PORT) for precise routing, and dp_size=N for "
             "one API server in front of N data-parallel ranks (N workers, one per rank); repeat "
             "for each (JSON: a URL string or {\"url\", \"kv_events\", \"kv_replay\", "
             "\"dp_size\"})",
     .parse = set_worker},
    {KVR_CLI_CUSTOM, "discover", F(discover_url), .arg = "URL", .json = "discovery.url",
     .flags = KVR_CLI_NODEFAULT,
     .help = "find the workers by resolving a DNS name (a Kubernetes headless Service, e.g. "
             "http://vllm-workers.llm.svc.cluster.local:8000): every IPv4/IPv6 address becomes "
             "the worker http://ADDR:PORT (Host: ADDR:PORT), a new address is added, a gone one "
             "drained; an error or empty answer keeps the workers; beside --worker; default: none",
     .parse = set_discover, .show = show_addr},
    {KVR_CLI_UINT, "discover-interval-ms", F(discover_interval_ms), .arg = "MS",
     .json = "discovery.interval_ms", KVR_CLI_RANGE(0, 86400000),
     .help = "how often the --discover name is resolved again; 0 = only until it first answers"},
    {KVR_CLI_UINT, "discover-kv-events-port", F(discover_kv_events_port), .arg = "PORT",
     .json = "discovery.kv_events_port", KVR_CLI_RANGE(1, 65535), .flags = KVR_CLI_NODEFAULT,
     .help = "each discovered worker's KV-event endpoint is tcp://ADDR:PORT (precise mode); "
             "default: none"},
    {KVR_CLI_UINT, "discover-kv-replay-port", F(discover_kv_replay_port), .arg = "PORT",
     .json = "discovery.kv_replay_port", KVR_CLI_RANGE(1, 65535), .flags = KVR_CLI_NODEFAULT,
     .help = "each discovered worker's KV-event replay endpoint is tcp://ADDR:PORT (needs "
             "--discover-kv-events-port); default: none"},
    {KVR_CLI_UINT, "discover-dp-size", F(discover_dp_size), .arg = "N", .json = "discovery.dp_size",
     KVR_CLI_RANGE(1, KVR_DP_SIZE_MAX), .flags = KVR_CLI_NODEFAULT,
     .help = "each discovered address is one vLLM API server in front of N data-parallel ranks "
             "(--data-parallel-size N): N workers, one per rank; default: one engine"},
    {KVR_CLI_CUSTOM, "config", .arg = "FILE.json", .flags = KVR_CLI_EARLY,
     .help = "read settings from a JSON file (keys as in JSON: below); flags override it",
     .parse = set_config_file},
    {KVR_CLI_CUSTOM, "policy-params", .arg = "JSON", .json = "policy_params",
     .flags = KVR_CLI_JSON_RAW, .help = "parameters of the policy as a JSON object",
     .parse = set_policy_params},
    {KVR_CLI_CUSTOM, "listen", F(listen), .arg = "HOST:PORT", .json = "listen",
     .help = "public OpenAI-compatible listener", .parse = set_addr, .show = show_addr},
    {KVR_CLI_BOOL, "reuse-port", F(reuse_port), .json = "reuse_port",
     .help = "open the public listener with SO_REUSEPORT, so that several kvrouter processes on "
             "one host share its port and the kernel spreads new connections over them (a way "
             "past one core: run one per core, synced with --peer-sync-listen and --peer; each "
             "keeps its own --admin-listen)"},
    {KVR_CLI_CUSTOM, "admin-listen", F(admin_listen), .arg = "HOST:PORT", .json = "admin_listen",
     .help = "operators' admin API listener (keep it off the public network)", .parse = set_addr,
     .show = show_addr},
    {KVR_CLI_STR, "policy", F(policy), .arg = "NAME", .json = "policy",
     .flags = KVR_CLI_OWNED | KVR_CLI_NONEMPTY, .help = "routing policy (see the list below)"},
    {KVR_CLI_UINT, "connect-timeout-ms", F(connect_timeout_ms), .arg = "MS",
     .json = "timeouts.connect_ms", .help = "TCP connect to a worker"},
    {KVR_CLI_UINT, "first-byte-timeout-ms", F(first_byte_timeout_ms), .arg = "MS",
     .json = "timeouts.first_byte_ms",
     .help = "request sent to a worker -> first response byte (queued long prefills)"},
    {KVR_CLI_UINT, "idle-timeout-ms", F(idle_timeout_ms), .arg = "MS", .json = "timeouts.idle_ms",
     .help = "longest silence inside a streaming response"},
    {KVR_CLI_UINT, "header-timeout-ms", F(limits.header_timeout_ms), .arg = "MS",
     .json = "timeouts.client_header_ms",
     .help = "client must send its request headers (and each body piece) within this (408)"},
    {KVR_CLI_UINT, "body-timeout-ms", F(limits.body_timeout_ms), .arg = "MS",
     .json = "timeouts.client_body_ms",
     .help = "client must send the whole request body within this after its headers (408); 0 = "
             "no limit"},
    {KVR_CLI_UINT, "keepalive-timeout-ms", F(limits.keepalive_timeout_ms), .arg = "MS",
     .json = "timeouts.client_keepalive_ms", .help = "idle client connection is closed after this"},
    {KVR_CLI_UINT, "max-body-bytes", F(limits.max_body), .arg = "N",
     .json = "limits.max_body_bytes", .help = "largest request body accepted (413 above)"},
    {KVR_CLI_UINT, "max-url-bytes", F(limits.max_url), .arg = "N", .json = "limits.max_url_bytes",
     .help = "longest request target (414 above)"},
    {KVR_CLI_UINT, "max-header-bytes", F(limits.max_header_bytes), .arg = "N",
     .json = "limits.max_header_bytes", .help = "total request header bytes (431 above)"},
    {KVR_CLI_UINT, "max-header-fields", F(limits.max_header_fields), .arg = "N",
     .json = "limits.max_header_fields", .help = "request header fields (431 above)"},
    {KVR_CLI_UINT, "max-connections", F(limits.max_connections), .arg = "N",
     .json = "limits.max_connections",
     .help = "client connections at once, 0 = unlimited (503 above)"},
    {KVR_CLI_UINT, "max-body-buffer-bytes", F(limits.max_body_buffer), .arg = "N",
     .json = "limits.max_body_buffer_bytes",
     .help = "request body bytes held for requests still arriving, over all connections; a "
             "request that would go over gets 503 with Retry-After, 0 = unlimited"},
    {KVR_CLI_UINT, "max-json-depth", F(body_guard.max_depth), .arg = "N",
     .json = "limits.max_json_depth", KVR_CLI_RANGE(1, 100000),
     .help = "nesting depth of a chat or completions body (400 nesting_too_deep above)"},
    {KVR_CLI_UINT, "max-json-values", F(body_guard.max_nodes), .arg = "N",
     .json = "limits.max_json_values", KVR_CLI_RANGE(1, UINT32_MAX),
     .help = "JSON values in one chat or completions body, checked before it is parsed (413)"},
    {KVR_CLI_UINT, "max-json-open-keys", F(body_guard.max_open_keys), .arg = "N",
     .json = "limits.max_json_open_keys", KVR_CLI_RANGE(1, UINT32_MAX),
     .help = "keys of the JSON objects open at once (the duplicate-key check's memory; 413)"},
    {KVR_CLI_UINT, "max-messages", F(body_guard.max_messages), .arg = "N",
     .json = "limits.max_messages", KVR_CLI_RANGE(1, UINT32_MAX),
     .help = "elements of a chat request's messages (413 above)"},
    {KVR_CLI_UINT, "max-content-parts", F(body_guard.max_parts), .arg = "N",
     .json = "limits.max_content_parts", KVR_CLI_RANGE(1, UINT32_MAX),
     .help = "content parts of one chat message (413 above)"},
    {KVR_CLI_UINT, "max-prompt-token-ids", F(body_guard.max_prompt_tokens), .arg = "N",
     .json = "limits.max_prompt_token_ids", KVR_CLI_RANGE(1, UINT32_MAX),
     .help = "token ids in one completions prompt while some worker's max_model_len is unknown "
             "(then the largest max_model_len of the workers; 400 context_length_exceeded)"},
    {KVR_CLI_BOOL, "resume-streams", F(resume_streams), .json = "resume.streams",
     .help = "when a chat or completions stream breaks after the client got tokens, continue the "
             "answer on another worker and splice it into the same stream"},
    {KVR_CLI_UINT, "resume-max", F(resume_max), .arg = "N", .json = "resume.max_per_request",
     KVR_CLI_RANGE(0, 6),
     .help = "continuations of one stream at most (not bounded by the retry budget: a "
             "refused one would lose an answer its client already has part of)"},
    {KVR_CLI_STR, "session-header", F(session_header), .arg = "NAME", .json = "session.header",
     .flags = KVR_CLI_OWNED | KVR_CLI_NONEMPTY | KVR_CLI_NODEFAULT,
     .help = "a request header whose value keys a session (like prompt_cache_key): the next "
             "request with the key prefers the worker that served it last; default: none"},
    {KVR_CLI_CUSTOM, "lora-adapter", .arg = "NAME=PATH", .json = "lora_adapters",
     .flags = KVR_CLI_JSON_LIST | KVR_CLI_JSON_RAW,
     .help = "a LoRA adapter the workers may load at runtime (they run with "
             "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1): a request naming it that no worker lists goes "
             "to a worker serving its base, which the router first asks to POST "
             "/v1/load_lora_adapter; repeat for each (vLLM's --lora-modules forms: NAME=PATH or "
             "{\"name\", \"path\", \"base_model_name\"}; without a base, any worker may load "
             "it)",
     .parse = set_lora_adapter},
    {KVR_CLI_UINT, "session-keys-max", F(session_keys_max), .arg = "N", .json = "session.keys_max",
     KVR_CLI_RANGE(1, 1u << 26),
     .help = "session keys remembered with their last worker; the oldest is forgotten first"},
    {KVR_CLI_UINT, "response-ids-max", F(response_ids_max), .arg = "N",
     .json = "limits.response_ids_max", KVR_CLI_RANGE(1, 1u << 26),
     .help = "Responses API ids remembered with the worker that stored them (previous_response_id, "
             "GET and cancel go there); the oldest is forgotten first"},
    {KVR_CLI_UINT, "response-buffer-bytes", F(response_buffer_max), .arg = "N",
     .json = "limits.response_buffer_bytes",
     .help = "non-streaming responses are held whole up to this, so a failure is a clean 502"},
    {KVR_CLI_UINT, "retry-after-s", F(retry_after_s), .arg = "S", .json = "retry_after_s",
     .help = "Retry-After sent with 503 when no worker is usable"},
    {KVR_CLI_UINT, "block-chars", F(block_chars), .arg = "N", .json = "cache.block_chars",
     .help = "prefix block size in prompt characters (~16 tokens)"},
    {KVR_CLI_UINT, "cache-capacity-blocks", F(cache_capacity_blocks), .arg = "N",
     .json = "cache.capacity_blocks",
     .help = "per-worker KV capacity in blocks until the worker's vllm:cache_config_info says "
             "otherwise"},
    {KVR_CLI_UINT, "scrape-interval-ms", F(scrape_interval_ms), .arg = "MS",
     .json = "metrics_scrape.interval_ms",
     .help = "how often each worker's /metrics is read, 0 = never"},
    {KVR_CLI_CUSTOM, "peer", .arg = "URL", .json = "peers", .flags = KVR_CLI_JSON_LIST,
     .help = "another kvrouter replica's admin base URL (http://HOST:PORT); its per-worker load "
             "(GET /admin/load) is added to this replica's view; repeat for each",
     .parse = set_peer},
    {KVR_CLI_UINT, "peer-interval-ms", F(peer_interval_ms), .arg = "MS", .json = "peer.interval_ms",
     KVR_CLI_RANGE(10, 60000), .help = "how often each peer's load is read"},
    {KVR_CLI_UINT, "peer-stale-ms", F(peer_stale_ms), .arg = "MS", .json = "peer.stale_ms",
     KVR_CLI_RANGE(10, 600000), .help = "a peer's load older than this is ignored"},
    {KVR_CLI_STR, "peer-sync-listen", F(peer_sync_listen), .arg = "ENDPOINT",
     .json = "peer.sync_listen", .flags = KVR_CLI_OWNED,
     .help = "announce each request this replica routes to its peers as it happens, on this ZMQ "
             "endpoint (tcp://0.0.0.0:8002; port advertised in /admin/load), and read theirs: "
             "replicas then weigh the same load (off: peers' polled load only)"},
    {KVR_CLI_UINT, "kv-events-refill-ms", F(kv_events_refill_ms), .arg = "MS",
     .json = "kv_events.refill_ms", KVR_CLI_RANGE(1, 86400000),
     .help = "after a worker's event stream lost batches it could not replay, route that worker "
             "on the approximate index this long while its cache refills"},
    {KVR_CLI_UINT, "kv-events-replay-timeout-ms", F(kv_events_replay_timeout_ms), .arg = "MS",
     .json = "kv_events.replay_timeout_ms", KVR_CLI_RANGE(1, 600000),
     .help = "a replay request not answered within this is abandoned (the worker is reset)"},
    {KVR_CLI_STR, "kv-events-topic", F(kv_events_topic), .arg = "PREFIX", .json = "kv_events.topic",
     .flags = KVR_CLI_OWNED, .help = "subscribe to topics starting with this (\"\" = all)"},
    {KVR_CLI_UINT, "tokenize-cache-entries", F(tokenize_cache_entries), .arg = "N",
     .json = "kv_events.tokenize_cache_entries", KVR_CLI_RANGE(0, 10000000),
     .help = "precise mode: /tokenize answers kept (an identical prompt is not tokenized again); "
             "0 = no cache"},
    {KVR_CLI_DOUBLE, "tokenize-prefix-coverage", F(tokenize_prefix_coverage), .arg = "F",
     .json = "kv_events.tokenize_prefix_coverage", KVR_CLI_RANGE(0, 1),
     .help =
         "precise mode, chat: a conversation's earlier turn, tokenized before, stands for its "
         "next one (not tokenized again) when its messages hold at least this share of the "
         "new one's characters; its ids then match the blocks they fill (llm-d's prefix "
         "store, at message granularity; llm-d uses 0.8); 0 = always tokenize whole (the default: "
         "the earlier turn's ids miss the blocks of its answer, so the prediction runs "
         "low)"},
    {KVR_CLI_UINT, "scrape-stale-ms", F(scrape_stale_ms), .arg = "MS",
     .json = "metrics_scrape.stale_ms", .help = "scraped figures older than this are ignored"},
    {KVR_CLI_UINT, "fail-threshold", F(fail_threshold), .arg = "N", .json = "health.fail_threshold",
     .help = "consecutive connection failures that mark a worker down"},
    {KVR_CLI_UINT, "outlier-consecutive-failures", F(outlier_consecutive), .arg = "N",
     .json = "outlier.consecutive_failures",
     .help = "5xx answers, first-byte timeouts or connect failures in a row that eject a worker, "
             "0 = never eject"},
    {KVR_CLI_UINT, "outlier-base-ejection-ms", F(outlier_base_ejection_ms), .arg = "MS",
     .json = "outlier.base_ejection_ms", KVR_CLI_RANGE(1, 86400000),
     .help = "first ejection's length; each ejection in a row doubles it"},
    {KVR_CLI_UINT, "outlier-max-ejection-ms", F(outlier_max_ejection_ms), .arg = "MS",
     .json = "outlier.max_ejection_ms", KVR_CLI_RANGE(1, 86400000),
     .help = "longest ejection (and how long a worker must stay clean to start again at the base)"},
    {KVR_CLI_UINT, "outlier-max-ejection-percent", F(outlier_max_percent), .arg = "PCT",
     .json = "outlier.max_ejection_percent", KVR_CLI_RANGE(0, 100),
     .help = "at most this share of the workers is ejected at once, and never the last usable one"},
    {KVR_CLI_UINT, "retry-budget-percent", F(retry_budget_percent), .arg = "PCT",
     .json = "retry.budget_percent", KVR_CLI_RANGE(0, 100),
     .help = "retries in flight may be this share of the requests in flight (above: no retry)"},
    {KVR_CLI_UINT, "retry-min-concurrency", F(retry_min_concurrency), .arg = "N",
     .json = "retry.min_concurrency",
     .help = "retries in flight always allowed, whatever the budget"},
    {KVR_CLI_UINT, "admission-max-inflight", F(admission_max_inflight), .arg = "N",
     .json = "admission.max_inflight",
     .help = "requests in flight per worker; when every worker serving a request's model has "
             "this many, it waits in a queue, first come first served per model (0 = no bound)"},
    {KVR_CLI_UINT, "admission-queue-limit", F(admission_queue_limit), .arg = "N",
     .json = "admission.queue_limit", KVR_CLI_RANGE(0, 1000000),
     .help = "requests waiting at most; above, 503 with Retry-After"},
    {KVR_CLI_UINT, "admission-max-wait-ms", F(admission_max_wait_ms), .arg = "MS",
     .json = "admission.max_wait_ms", KVR_CLI_RANGE(1, 3600000),
     .help = "longest wait in the admission queue; then 503 with Retry-After"},
    {KVR_CLI_BOOL, "worker-header", F(worker_header), .json = "worker_header",
     .help = "add x-kvrouter-worker (the serving worker's id) to responses"},
    {KVR_CLI_BOOL, "access-log", F(access_log), .json = "access_log",
     .help = "one line per request on stderr"},
    {KVR_CLI_STR, "log-level", F(log_level), .arg = "LEVEL", .json = "log_level",
     .flags = KVR_CLI_OWNED, .names = log_levels, .help = "debug, info, warn, error, off"},
    {KVR_CLI_STR, "log-format", F(log_format), .arg = "FORMAT", .json = "log_format",
     .flags = KVR_CLI_OWNED, .names = log_formats,
     .help = "text (\"TIME LEVEL COMPONENT: MSG\") or json (one object per line: ts, level, "
             "component, msg); timestamps are UTC with milliseconds"},
    {KVR_CLI_UINT, "shutdown-grace-ms", F(shutdown_grace_ms), .arg = "MS",
     .json = "shutdown_grace_ms", KVR_CLI_RANGE(0, 3600000),
     .help = "at SIGTERM/SIGINT, requests in flight get this long to finish before they are "
             "aborted (0 = abort at once)"},
    {KVR_CLI_UINT, "seed", F(seed), .arg = "N", .json = "seed",
     .help = "seed of the policies' random draws (ties of requests with a prompt break by a "
             "rendezvous rank instead, the same on every replica)"},
    {KVR_CLI_STR, "admin-token-file", F(admin_token_file), .arg = "FILE",
     .json = "admin_token_file", .flags = KVR_CLI_OWNED | KVR_CLI_NONEMPTY | KVR_CLI_NODEFAULT,
     .help = "file holding the admin API's bearer token (16+ characters); when set, admin calls "
             "need 'Authorization: Bearer TOKEN' (/health excepted); default: no authentication"},
    {KVR_CLI_BOOL, "admin-open-reads", F(admin_open_reads), .json = "admin_open_reads",
     .help = "with --admin-token-file, GET/HEAD admin calls (and /metrics) need no token"},
    {KVR_CLI_STR, "worker-ca-file", F(worker_ca_file), .arg = "FILE", .json = "worker_ca_file",
     .flags = KVR_CLI_OWNED | KVR_CLI_NONEMPTY | KVR_CLI_NODEFAULT,
     .help = "CA bundle (PEM) that verifies https:// workers; default: the system's"},
    {KVR_CLI_STR, "trace-out", F(trace_out), .arg = "FILE", .json = "trace.out",
     .flags = KVR_CLI_OWNED | KVR_CLI_NONEMPTY | KVR_CLI_NODEFAULT,
     .help = "write every completed request as a line of a prefix-hashed trace (Mooncake's "
             "format: arrival, tokens, block ids; never any text or hash); default: none"},
    {KVR_CLI_UINT, "trace-out-max-bytes", F(trace_out_max_bytes), .arg = "N",
     .json = "trace.max_bytes",
     .help = "past this the trace file becomes FILE.1 and a new one starts, 0 = never"},
    {KVR_CLI_UINT, "trace-block-tokens", F(trace_block_tokens), .arg = "N",
     .json = "trace.block_tokens", KVR_CLI_RANGE(1, 1048576),
     .help = "tokens one trace block id stands for"},
};

/* KVR_MAX_WORKERS as text, for --help. */
#define WORKER_CAP_TEXT2(n) #n
#define WORKER_CAP_TEXT(n) WORKER_CAP_TEXT2(n)

static const kvr_cli_cmd_t serve_cmd = {
    .name = "serve",
    .usage = "--worker URL [--worker URL ...] [--discover URL] [options]",
    .about = "Runs the KV-cache-aware reverse proxy in front of OpenAI-compatible (vLLM) workers.\n"
             "Settings come from defaults, then --config FILE.json, then flags.\n"
             "Limit: at most " WORKER_CAP_TEXT(
                 KVR_MAX_WORKERS) " workers (KVR_MAX_WORKERS), the "
                                  "--worker list, POST /admin/workers and\n"
                                  "discovery together; one more is refused with a one-line error "
                                  "(counted in\n"
                                  "kvrouter_workers_refused_total).",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
    .epilog = kvr_policy_print_names,
};

/* The defaults --help shows are read from here: the two cannot disagree. Limits not in the table
 * keep the server's defaults. */
void kvr_config_init(kvr_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  kvr_http_limits_default(&cfg->limits);
  cfg->listen = kvr_xstrdup("0.0.0.0:8000");
  cfg->admin_listen = kvr_xstrdup("127.0.0.1:8001");
  cfg->policy = kvr_xstrdup("kv_aware");
  cfg->connect_timeout_ms = 2000;
  cfg->first_byte_timeout_ms = 300000;
  cfg->idle_timeout_ms = 120000;
  cfg->response_buffer_max = 16u << 20;
  cfg->trace_out_max_bytes = 256u << 20;
  cfg->trace_block_tokens = KVR_TRACE_BLOCK_TOKENS_DEFAULT;
  cfg->response_ids_max = 65536;
  cfg->session_keys_max = 65536;
  cfg->resume_streams = true;
  cfg->resume_max = 2;
  kvr_json_guard_limits_default(&cfg->body_guard);
  cfg->retry_after_s = 1;
  cfg->block_chars = 64;
  cfg->cache_capacity_blocks = 21766;
  cfg->discover_interval_ms = 5000;
  cfg->scrape_interval_ms = 1000;
  cfg->peer_interval_ms = 200;
  cfg->peer_stale_ms = 1000;
  cfg->kv_events_refill_ms = 30000;
  cfg->kv_events_replay_timeout_ms = 2000;
  cfg->kv_events_topic = kvr_xstrdup("");
  cfg->tokenize_cache_entries = 4096;
  /* Off: exact ids for every prompt. llm-d's default is 0.8 (defaultMinPrefixOverlapRatio); the
   * prefix ids miss the previous answer's blocks (tests/router/test_precise.py measures it). */
  cfg->tokenize_prefix_coverage = 0;
  cfg->scrape_stale_ms = 5000;
  cfg->fail_threshold = 3;
  cfg->outlier_consecutive = 5;
  cfg->outlier_base_ejection_ms = 30000;
  cfg->outlier_max_ejection_ms = 300000;
  cfg->outlier_max_percent = 50;
  cfg->retry_budget_percent = 20;
  cfg->retry_min_concurrency = 3;
  cfg->admission_max_inflight = 0;
  cfg->admission_queue_limit = 256;
  cfg->admission_max_wait_ms = 10000;
  cfg->worker_header = true;
  cfg->access_log = true;
  cfg->log_level = kvr_xstrdup("info");
  cfg->log_format = kvr_xstrdup("text");
  cfg->shutdown_grace_ms = 10000;
  cfg->seed = 1;
}

int kvr_config_apply_json(kvr_config_t *cfg, const char *json, size_t len, const char *source,
                          char *err, size_t errlen) {
  return kvr_cli_apply_json(&serve_cmd, cfg, json, len, source, err, errlen);
}

void kvr_config_usage(FILE *out) {
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  kvr_cli_help(&serve_cmd, &cfg, out);
  kvr_config_free(&cfg);
}

int kvr_config_parse_args(kvr_config_t *cfg, int argc, char **argv, FILE *out, char *err,
                          size_t errlen) {
  int rc = kvr_cli_parse(&serve_cmd, cfg, argc, argv, NULL, out, err, errlen);
  if (rc != 0)
    return rc;
  rc = kvr_config_validate(cfg, err, errlen);
  if (rc != 0)
    return rc;
  return kvr_config_load_admin_token(cfg, err, errlen);
}

int kvr_config_load_admin_token(kvr_config_t *cfg, char *err, size_t errlen) {
  if (cfg->admin_token_file == NULL)
    return 0;
  const char *path = cfg->admin_token_file;
  kvr_buf_t b = KVR_BUF_INIT;
  char why[256];
  if (kvr_buf_read_file(&b, path, 4096, why, sizeof why) != 0) {
    snprintf(err, errlen, "--admin-token-file: %s", why);
    return KVR_EINVAL;
  }
  size_t lo = 0, hi = b.len;
  while (lo < hi && isspace((unsigned char)b.data[lo]))
    lo++;
  while (hi > lo && isspace((unsigned char)b.data[hi - 1]))
    hi--;
  int rc = 0;
  if (hi == lo) {
    snprintf(err, errlen, "--admin-token-file: '%s' is empty (it must hold one bearer token)",
             path);
    rc = KVR_EINVAL;
  } else if (hi - lo < KVR_ADMIN_TOKEN_MIN) {
    snprintf(err, errlen,
             "--admin-token-file: the token in '%s' is %zu characters, shorter than %d", path,
             hi - lo, KVR_ADMIN_TOKEN_MIN);
    rc = KVR_EINVAL;
  } else {
    for (size_t i = lo; i < hi; i++) {
      unsigned char c = (unsigned char)b.data[i];
      if (c <= ' ' || c >= 0x7f) {
        snprintf(err, errlen,
                 "--admin-token-file: '%s' must hold one token of printable ASCII characters "
                 "without blanks",
                 path);
        rc = KVR_EINVAL;
        break;
      }
    }
  }
  if (rc == 0) {
    free(cfg->admin_token);
    cfg->admin_token = kvr_xmalloc(hi - lo + 1);
    memcpy(cfg->admin_token, b.data + lo, hi - lo);
    cfg->admin_token[hi - lo] = '\0';
  }
  if (b.data != NULL)
    memset(b.data, 0, b.len);
  kvr_buf_free(&b);
  return rc;
}

bool kvr_config_admin_on_loopback(const kvr_config_t *cfg) {
  struct sockaddr_storage ss;
  if (kvr_url_hostport(cfg->admin_listen, &ss) != 0)
    return false;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
  }
  return false;
}

int kvr_config_validate(const kvr_config_t *cfg, char *err, size_t errlen) {
  if (cfg->nworkers == 0 && cfg->discover_url == NULL) {
    snprintf(err, errlen, "no workers: give at least one --worker URL or --discover URL");
    return KVR_EINVAL;
  }
  size_t expanded = 0;
  for (size_t i = 0; i < cfg->nworkers; i++)
    expanded += cfg->worker_dp_size && cfg->worker_dp_size[i] ? cfg->worker_dp_size[i] : 1;
  if (expanded > KVR_MAX_WORKERS) {
    snprintf(err, errlen,
             "too many workers: the --worker list makes %zu (data-parallel ranks counted), this "
             "router serves at most %d (KVR_MAX_WORKERS)",
             expanded, KVR_MAX_WORKERS);
    return KVR_ELIMIT;
  }
  uint64_t top_port = KVR_MAX(cfg->discover_kv_events_port, cfg->discover_kv_replay_port);
  if (cfg->discover_dp_size > 1 && top_port != 0 && top_port + cfg->discover_dp_size - 1 > 65535) {
    snprintf(err, errlen, "--discover-dp-size: rank %llu's KV-event port would pass 65535",
             (unsigned long long)(cfg->discover_dp_size - 1));
    return KVR_EINVAL;
  }
  if (cfg->discover_kv_replay_port != 0 && cfg->discover_kv_events_port == 0) {
    snprintf(err, errlen, "--discover-kv-replay-port: needs --discover-kv-events-port");
    return KVR_EINVAL;
  }
  size_t llen = strlen(cfg->listen);
  bool ephemeral = llen >= 2 && strcmp(cfg->listen + llen - 2, ":0") == 0;
  if (strcmp(cfg->listen, cfg->admin_listen) == 0 && !ephemeral) {
    snprintf(err, errlen, "--admin-listen: must differ from --listen (%s)", cfg->listen);
    return KVR_EINVAL;
  }
  if (kvr_policy_find(cfg->policy) == NULL) {
    char names[256];
    kvr_policy_names(names, sizeof names);
    snprintf(err, errlen, "--policy: unknown policy '%s' (valid: %s)", cfg->policy, names);
    return KVR_EINVAL;
  }
  if (cfg->block_chars < 8 || cfg->block_chars > 4096) {
    snprintf(err, errlen, "--block-chars: must be between 8 and 4096");
    return KVR_EINVAL;
  }
  if (cfg->first_byte_timeout_ms == 0 || cfg->connect_timeout_ms == 0 ||
      cfg->idle_timeout_ms == 0) {
    snprintf(err, errlen, "timeouts: connect, first byte and idle timeouts must be positive");
    return KVR_EINVAL;
  }
  if (cfg->limits.max_body == 0) {
    snprintf(err, errlen, "--max-body-bytes: must be positive");
    return KVR_EINVAL;
  }
  if (cfg->outlier_max_ejection_ms < cfg->outlier_base_ejection_ms) {
    snprintf(err, errlen, "--outlier-max-ejection-ms: must be >= --outlier-base-ejection-ms (%llu)",
             (unsigned long long)cfg->outlier_base_ejection_ms);
    return KVR_EINVAL;
  }
  if (cfg->worker_ca_file != NULL) {
    FILE *f = fopen(cfg->worker_ca_file, "rb");
    if (f == NULL) {
      snprintf(err, errlen, "--worker-ca-file: cannot open '%s': %s", cfg->worker_ca_file,
               strerror(errno));
      return KVR_EINVAL;
    }
    fclose(f);
  }
  return 0;
}

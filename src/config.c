/* config.c -- `kvrouter serve` settings: one table drives the flags, the JSON keys and --help.
 *
 * Each entry of `options` names a command-line flag, the JSON path of the same setting in the
 * config file, its type, where it lives in kvr_config_t, its default (as text: kvr_config_init()
 * parses it and --help prints it) and one line of help. Parsing a flag and parsing a JSON key go
 * through the same set_value(), so the two spellings of a setting can never disagree on validation.
 * `worker` (a list) and `policy_params` (an object) are the only special cases.
 */
#include "config.h"

#include "kvr.h"
#include "policies/policy.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_STR, T_U64, T_SIZE, T_BOOL, T_ADDR, T_LOGLEVEL } opt_type_t;

typedef struct {
  const char *flag;  /* without the leading "--" */
  const char *jpath; /* dotted JSON path */
  opt_type_t type;
  size_t offset;
  const char *defval;
  const char *help;
} opt_t;

#define OFF(field) offsetof(kvr_config_t, field)
#define LOFF(field) (offsetof(kvr_config_t, limits) + offsetof(kvr_http_limits_t, field))

static const opt_t options[] = {
    {"listen", "listen", T_ADDR, OFF(listen), "0.0.0.0:8000", "public OpenAI-compatible listener"},
    {"admin-listen", "admin_listen", T_ADDR, OFF(admin_listen), "127.0.0.1:8001",
     "operators' admin API listener (keep it off the public network)"},
    {"policy", "policy", T_STR, OFF(policy), "kv_aware", "routing policy (see --help list below)"},
    {"connect-timeout-ms", "timeouts.connect_ms", T_U64, OFF(connect_timeout_ms), "2000",
     "TCP connect to a worker"},
    {"first-byte-timeout-ms", "timeouts.first_byte_ms", T_U64, OFF(first_byte_timeout_ms), "300000",
     "request sent to a worker -> first response byte (queued long prefills)"},
    {"idle-timeout-ms", "timeouts.idle_ms", T_U64, OFF(idle_timeout_ms), "120000",
     "longest silence inside a streaming response"},
    {"header-timeout-ms", "timeouts.client_header_ms", T_U64, LOFF(header_timeout_ms), "10000",
     "client must send its request headers (and each body piece) within this (408)"},
    {"keepalive-timeout-ms", "timeouts.client_keepalive_ms", T_U64, LOFF(keepalive_timeout_ms),
     "75000", "idle client connection is closed after this"},
    {"max-body-bytes", "limits.max_body_bytes", T_SIZE, LOFF(max_body), "8388608",
     "largest request body accepted (413 above)"},
    {"max-url-bytes", "limits.max_url_bytes", T_SIZE, LOFF(max_url), "8192",
     "longest request target (414 above)"},
    {"max-header-bytes", "limits.max_header_bytes", T_SIZE, LOFF(max_header_bytes), "32768",
     "total request header bytes (431 above)"},
    {"max-header-fields", "limits.max_header_fields", T_SIZE, LOFF(max_header_fields), "100",
     "request header fields (431 above)"},
    {"max-connections", "limits.max_connections", T_SIZE, LOFF(max_connections), "0",
     "client connections at once, 0 = unlimited (503 above)"},
    {"response-buffer-bytes", "limits.response_buffer_bytes", T_SIZE, OFF(response_buffer_max),
     "16777216", "non-streaming responses are held whole up to this, so a failure is a clean 502"},
    {"retry-after-s", "retry_after_s", T_U64, OFF(retry_after_s), "1",
     "Retry-After sent with 503 when no worker is usable"},
    {"block-chars", "cache.block_chars", T_SIZE, OFF(block_chars), "64",
     "prefix block size in prompt characters (~16 tokens)"},
    {"cache-capacity-blocks", "cache.capacity_blocks", T_U64, OFF(cache_capacity_blocks), "21766",
     "per-worker KV capacity in blocks until the worker's vllm:cache_config_info says otherwise"},
    {"scrape-interval-ms", "metrics_scrape.interval_ms", T_U64, OFF(scrape_interval_ms), "1000",
     "how often each worker's /metrics is read, 0 = never"},
    {"scrape-stale-ms", "metrics_scrape.stale_ms", T_U64, OFF(scrape_stale_ms), "5000",
     "scraped figures older than this are ignored"},
    {"fail-threshold", "health.fail_threshold", T_U64, OFF(fail_threshold), "3",
     "consecutive connection failures that mark a worker down"},
    {"worker-header", "worker_header", T_BOOL, OFF(worker_header), "true",
     "add x-kvrouter-worker (the serving worker's id) to responses"},
    {"access-log", "access_log", T_BOOL, OFF(access_log), "true", "one line per request on stderr"},
    {"log-level", "log_level", T_LOGLEVEL, OFF(log_level), "info", "debug, info, warn, error, off"},
    {"seed", "seed", T_U64, OFF(seed), "1", "seed of the policies' tie-breaking randomness"},
};

void kvr_config_free(kvr_config_t *cfg) {
  if (cfg == NULL)
    return;
  free(cfg->listen);
  free(cfg->admin_listen);
  free(cfg->policy);
  free(cfg->log_level);
  for (size_t i = 0; i < cfg->nworkers; i++)
    free(cfg->workers[i]);
  free(cfg->workers);
  cJSON_Delete(cfg->policy_params);
  memset(cfg, 0, sizeof *cfg);
}

int kvr_worker_url_check(const char *url, char *out, size_t outlen, char *err, size_t errlen) {
  if (strncmp(url, "http://", 7) != 0) {
    snprintf(err, errlen, "worker URL '%s' must start with http://", url);
    return KVR_EINVAL;
  }
  const char *host = url + 7;
  size_t n = strlen(host);
  while (n > 0 && host[n - 1] == '/')
    n--;
  if (n == 0 || memchr(host, '/', n) || memchr(host, '?', n) || memchr(host, '#', n) ||
      memchr(host, '@', n)) {
    snprintf(err, errlen, "worker URL '%s' must be http://HOST[:PORT] with no path", url);
    return KVR_EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)host[i];
    if (c <= ' ' || c >= 0x7f) {
      snprintf(err, errlen, "worker URL '%s' contains an invalid character", url);
      return KVR_EINVAL;
    }
  }
  if (n + 8 > outlen) {
    snprintf(err, errlen, "worker URL '%s' is too long", url);
    return KVR_EINVAL;
  }
  memcpy(out, url, 7 + n);
  out[7 + n] = '\0';
  return 0;
}

int kvr_config_add_worker(kvr_config_t *cfg, const char *url, char *err, size_t errlen) {
  char norm[512];
  if (kvr_worker_url_check(url, norm, sizeof norm, err, errlen) != 0)
    return KVR_EINVAL;
  for (size_t i = 0; i < cfg->nworkers; i++) {
    if (strcmp(cfg->workers[i], norm) == 0) {
      snprintf(err, errlen, "worker %s is listed twice", norm);
      return KVR_EINVAL;
    }
  }
  if (cfg->nworkers >= KVR_MAX_WORKERS) {
    snprintf(err, errlen, "too many workers (at most %d)", KVR_MAX_WORKERS);
    return KVR_ELIMIT;
  }
  char **w = realloc(cfg->workers, (cfg->nworkers + 1) * sizeof *w);
  if (w == NULL)
    return KVR_ENOMEM;
  cfg->workers = w;
  cfg->workers[cfg->nworkers++] = strdup(norm);
  return 0;
}

static int parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s == '\0' || *s == '-')
    return KVR_EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end != '\0')
    return KVR_EINVAL;
  *out = v;
  return 0;
}

/* Stores text into the option's field after validating it; `what` names the flag or JSON path. */
static int set_value(kvr_config_t *cfg, const opt_t *o, const char *text, const char *what,
                     char *err, size_t errlen) {
  char *base = (char *)cfg + o->offset;
  uint64_t v;
  struct sockaddr_storage ss;
  switch (o->type) {
  case T_STR:
  case T_ADDR:
  case T_LOGLEVEL:
    if (o->type == T_ADDR && kvr_parse_hostport(text, &ss) != 0) {
      snprintf(err, errlen, "%s: '%s' is not HOST:PORT", what, text);
      return KVR_EINVAL;
    }
    if (o->type == T_LOGLEVEL) {
      if (strcmp(text, "debug") && strcmp(text, "info") && strcmp(text, "warn") &&
          strcmp(text, "error") && strcmp(text, "off")) {
        snprintf(err, errlen, "%s: '%s' is not one of debug, info, warn, error, off", what, text);
        return KVR_EINVAL;
      }
    }
    if (o->type == T_STR && *text == '\0') {
      snprintf(err, errlen, "%s: must not be empty", what);
      return KVR_EINVAL;
    }
    free(*(char **)base);
    *(char **)base = strdup(text);
    return 0;
  case T_U64:
  case T_SIZE:
    if (parse_u64(text, &v) != 0) {
      snprintf(err, errlen, "%s: '%s' is not a non-negative integer", what, text);
      return KVR_EINVAL;
    }
    if (o->type == T_U64)
      *(uint64_t *)base = v;
    else
      *(size_t *)base = (size_t)v;
    return 0;
  case T_BOOL:
    if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0 || strcmp(text, "on") == 0)
      *(bool *)base = true;
    else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0 || strcmp(text, "off") == 0)
      *(bool *)base = false;
    else {
      snprintf(err, errlen, "%s: '%s' is not true or false", what, text);
      return KVR_EINVAL;
    }
    return 0;
  }
  return KVR_EINVAL;
}

/* The defaults are the table's own texts, parsed like a flag: --help can never show one value
 * while the program starts with another. Limits not in the table keep the server's defaults. */
void kvr_config_init(kvr_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  kvr_http_limits_default(&cfg->limits);
  char err[160];
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
    if (set_value(cfg, &options[i], options[i].defval, options[i].flag, err, sizeof err) != 0) {
      fprintf(stderr, "kvrouter: bad built-in default: %s\n", err);
      abort();
    }
}

static const cJSON *json_path(const cJSON *root, const char *path) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *node = root;
  for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok; tok = strtok_r(NULL, ".", &save)) {
    if (!cJSON_IsObject(node))
      return NULL;
    node = cJSON_GetObjectItemCaseSensitive(node, tok);
    if (node == NULL)
      return NULL;
  }
  return node;
}

/* Rejects keys the table does not know, so a typo in a config file is an error, not a silent
 * default. */
static int check_unknown_keys(const cJSON *obj, const char *prefix, const char *source, char *err,
                              size_t errlen) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    char path[160];
    snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", it->string);
    if (strcmp(path, "workers") == 0 || strcmp(path, "policy_params") == 0)
      continue;
    bool known = false, is_prefix = false;
    size_t plen = strlen(path);
    for (size_t i = 0; i < KVR_ARRAY_SIZE(options); i++) {
      if (strcmp(options[i].jpath, path) == 0)
        known = true;
      else if (strncmp(options[i].jpath, path, plen) == 0 && options[i].jpath[plen] == '.')
        is_prefix = true;
    }
    if (known)
      continue;
    if (is_prefix && cJSON_IsObject(it)) {
      if (check_unknown_keys(it, path, source, err, errlen) != 0)
        return KVR_EINVAL;
      continue;
    }
    snprintf(err, errlen, "%s: %s: unknown setting", source, path);
    return KVR_EINVAL;
  }
  return 0;
}

int kvr_config_apply_json(kvr_config_t *cfg, const char *json, size_t len, const char *source,
                          char *err, size_t errlen) {
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (root == NULL || !cJSON_IsObject(root)) {
    snprintf(err, errlen, "%s: not a JSON object", source);
    cJSON_Delete(root);
    return KVR_EINVAL;
  }
  int rc = check_unknown_keys(root, "", source, err, errlen);
  for (size_t i = 0; rc == 0 && i < KVR_ARRAY_SIZE(options); i++) {
    const opt_t *o = &options[i];
    const cJSON *v = json_path(root, o->jpath);
    if (v == NULL)
      continue;
    char what[200], text[64];
    snprintf(what, sizeof what, "%s: %s", source, o->jpath);
    const char *s = NULL;
    if (cJSON_IsString(v)) {
      s = v->valuestring;
      if (o->type == T_U64 || o->type == T_SIZE || o->type == T_BOOL) {
        snprintf(err, errlen, "%s: must be a %s, not a string", what,
                 o->type == T_BOOL ? "boolean" : "number");
        rc = KVR_EINVAL;
        break;
      }
    } else if (cJSON_IsBool(v) && o->type == T_BOOL) {
      s = cJSON_IsTrue(v) ? "true" : "false";
    } else if (cJSON_IsNumber(v) && (o->type == T_U64 || o->type == T_SIZE)) {
      if (v->valuedouble < 0 || v->valuedouble != (double)(uint64_t)v->valuedouble) {
        snprintf(err, errlen, "%s: must be a non-negative integer", what);
        rc = KVR_EINVAL;
        break;
      }
      snprintf(text, sizeof text, "%llu", (unsigned long long)v->valuedouble);
      s = text;
    } else {
      snprintf(err, errlen, "%s: wrong type", what);
      rc = KVR_EINVAL;
      break;
    }
    rc = set_value(cfg, o, s, what, err, errlen);
  }
  const cJSON *workers = cJSON_GetObjectItemCaseSensitive(root, "workers");
  if (rc == 0 && workers) {
    if (!cJSON_IsArray(workers)) {
      snprintf(err, errlen, "%s: workers: must be an array of URLs", source);
      rc = KVR_EINVAL;
    }
    int idx = 0;
    for (const cJSON *w = workers->child; rc == 0 && w; w = w->next, idx++) {
      if (!cJSON_IsString(w)) {
        snprintf(err, errlen, "%s: workers[%d]: must be a URL string", source, idx);
        rc = KVR_EINVAL;
        break;
      }
      char e2[300];
      if (kvr_config_add_worker(cfg, w->valuestring, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "%s: workers[%d]: %s", source, idx, e2);
        rc = KVR_EINVAL;
      }
    }
  }
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(root, "policy_params");
  if (rc == 0 && params) {
    if (!cJSON_IsObject(params)) {
      snprintf(err, errlen, "%s: policy_params: must be an object", source);
      rc = KVR_EINVAL;
    } else {
      cJSON_Delete(cfg->policy_params);
      cfg->policy_params = cJSON_Duplicate(params, 1);
    }
  }
  cJSON_Delete(root);
  return rc;
}

static int load_file(kvr_config_t *cfg, const char *path, char *err, size_t errlen) {
  kvr_buf_t b = KVR_BUF_INIT;
  char e2[400];
  if (kvr_buf_read_file(&b, path, 1u << 24, e2, sizeof e2) != 0) {
    snprintf(err, errlen, "--config: %s", e2);
    return KVR_EINVAL;
  }
  int rc = kvr_config_apply_json(cfg, b.data ? b.data : "", b.len, path, err, errlen);
  kvr_buf_free(&b);
  return rc;
}

void kvr_config_usage(FILE *out) {
  char names[256];
  kvr_policy_names(names, sizeof names);
  fprintf(out,
          "usage: kvrouter serve --worker URL [--worker URL ...] [options]\n"
          "\n"
          "Runs the KV-cache-aware reverse proxy in front of OpenAI-compatible (vLLM) workers.\n"
          "Settings come from defaults, then --config FILE.json, then flags.\n"
          "\n"
          "  --worker URL                 a worker base URL (http://HOST:PORT); repeat for each\n"
          "                               (JSON: \"workers\": [URL, ...])\n"
          "  --config FILE.json           read settings from a JSON file (keys in parentheses)\n"
          "  --policy-params JSON         parameters of the policy as a JSON object\n"
          "                               (JSON: \"policy_params\": {...})\n");
  for (size_t i = 0; i < KVR_ARRAY_SIZE(options); i++) {
    const opt_t *o = &options[i];
    char flag[64];
    snprintf(flag, sizeof flag, "--%s %s", o->flag,
             o->type == T_BOOL                         ? "BOOL"
             : (o->type == T_U64 || o->type == T_SIZE) ? "N"
                                                       : "VALUE");
    fprintf(out, "  %-28s %s (default %s; JSON: %s)\n", flag, o->help, o->defval, o->jpath);
  }
  fprintf(out, "  -h, --help                   this text\n\npolicies: %s\n", names);
}

static const opt_t *find_flag(const char *name) {
  for (size_t i = 0; i < KVR_ARRAY_SIZE(options); i++)
    if (strcmp(options[i].flag, name) == 0)
      return &options[i];
  return NULL;
}

int kvr_config_parse_args(kvr_config_t *cfg, int argc, char **argv, FILE *out, char *err,
                          size_t errlen) {
  /* First pass: --help and --config, so flags override the file wherever they stand. */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      kvr_config_usage(out);
      return 1;
    }
    if (strcmp(argv[i], "--config") == 0 || strncmp(argv[i], "--config=", 9) == 0) {
      const char *path = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
      if (path == NULL) {
        snprintf(err, errlen, "--config: missing file name");
        return KVR_EINVAL;
      }
      if (load_file(cfg, path, err, errlen) != 0)
        return KVR_EINVAL;
    }
  }
  bool cli_workers = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0) {
      snprintf(err, errlen, "unexpected argument '%s' (see kvrouter serve --help)", a);
      return KVR_EINVAL;
    }
    char name[64];
    const char *val = NULL;
    const char *eq = strchr(a + 2, '=');
    size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
    if (nlen >= sizeof name) {
      snprintf(err, errlen, "unknown option '%s' (see kvrouter serve --help)", a);
      return KVR_EINVAL;
    }
    memcpy(name, a + 2, nlen);
    name[nlen] = '\0';
    if (eq)
      val = eq + 1;
    bool known = strcmp(name, "config") == 0 || strcmp(name, "worker") == 0 ||
                 strcmp(name, "policy-params") == 0 || find_flag(name) != NULL;
    if (!known) {
      snprintf(err, errlen, "unknown option '--%s' (see kvrouter serve --help)", name);
      return KVR_EINVAL;
    }
    if (val == NULL) {
      if (i + 1 >= argc) {
        snprintf(err, errlen, "--%s: missing value", name);
        return KVR_EINVAL;
      }
      val = argv[++i];
    }
    if (strcmp(name, "config") == 0)
      continue;
    if (strcmp(name, "worker") == 0) {
      if (!cli_workers) {
        /* Workers on the command line replace the file's list rather than adding to it. */
        for (size_t k = 0; k < cfg->nworkers; k++)
          free(cfg->workers[k]);
        cfg->nworkers = 0;
        cli_workers = true;
      }
      char e2[300];
      if (kvr_config_add_worker(cfg, val, e2, sizeof e2) != 0) {
        snprintf(err, errlen, "--worker: %s", e2);
        return KVR_EINVAL;
      }
      continue;
    }
    if (strcmp(name, "policy-params") == 0) {
      cJSON *p = cJSON_Parse(val);
      if (p == NULL || !cJSON_IsObject(p)) {
        cJSON_Delete(p);
        snprintf(err, errlen, "--policy-params: not a JSON object");
        return KVR_EINVAL;
      }
      cJSON_Delete(cfg->policy_params);
      cfg->policy_params = p;
      continue;
    }
    char what[80];
    snprintf(what, sizeof what, "--%s", name);
    if (set_value(cfg, find_flag(name), val, what, err, errlen) != 0)
      return KVR_EINVAL;
  }
  return kvr_config_validate(cfg, err, errlen);
}

int kvr_config_validate(const kvr_config_t *cfg, char *err, size_t errlen) {
  if (cfg->nworkers == 0) {
    snprintf(err, errlen, "no workers: give at least one --worker URL");
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
  return 0;
}

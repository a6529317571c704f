/* config.h -- settings of `kvrouter serve`, from the command line and an optional JSON file.
 *
 * Precedence: defaults < --config FILE.json < command-line flags. Every error names the offending
 * flag or JSON path in one line ("config.json: timeouts.first_byte_ms: must be a positive
 * integer"). The reference of every key, with defaults, is kvr_config_usage() (printed by `serve
 * --help`) and the README's configuration section; both come from the same option table in
 * config.c (the engine is cli.h, shared by every subcommand).
 */
#ifndef KVR_CONFIG_H
#define KVR_CONFIG_H

#include "proto/http_limits.h"
#include "proto/json_guard.h"
#include "proto/url.h" /* worker URLs, endpoints, host:port */

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* A LoRA adapter the router may load on a worker at runtime (--lora-adapter, "lora_adapters"; the
 * workers run with VLLM_ALLOW_RUNTIME_LORA_UPDATING): a request naming it that no worker lists
 * goes to a worker serving its base, which is first asked to POST /v1/load_lora_adapter. */
typedef struct kvr_lora_adapter_s {
  char *name; /* owned: the model id requests name (vLLM's lora_name) */
  char *path; /* owned: vLLM's lora_path, as the workers see it */
  char *base; /* owned: the base model whose workers may load it (base_model_name); NULL: any */
} kvr_lora_adapter_t;

/* The most data-parallel ranks one worker URL may stand for (--worker URL,dp_size=N). */
#define KVR_DP_SIZE_MAX 256

typedef struct kvr_config_s {
  char *listen;            /* public OpenAI-compatible listener, default 0.0.0.0:8000 */
  char *admin_listen;      /* operators' listener, default 127.0.0.1:8001 */
  char **workers;          /* worker base URLs ("http://127.0.0.1:9001"), owned */
  char **worker_kv_events; /* per worker: its KV-event PUB endpoint (tcp://HOST:PORT) or NULL */
  char **worker_kv_replay; /* per worker: its replay endpoint or NULL */
  /* per worker: 0, one engine; N, vLLM's --data-parallel-size N behind one API server, which the
   * router serves as N workers sharing the URL, one per rank (dp_size=N, router.h) */
  uint32_t *worker_dp_size;
  size_t nworkers;
  /* Discovery (discovery.h): workers are the addresses of a DNS name, re-resolved. */
  char *discover_url;               /* --discover http(s)://NAME:PORT, or NULL */
  uint64_t discover_interval_ms;    /* re-resolution period, default 5000; 0 = until answered */
  uint64_t discover_kv_events_port; /* tcp://ADDR:N for each discovered worker, 0 = none */
  uint64_t discover_kv_replay_port; /* its replay endpoint, 0 = none */
  uint64_t discover_dp_size;        /* each discovered address is N data-parallel ranks, 0 = none */
  char *policy;                     /* default "kv_aware" */
  cJSON *policy_params;             /* owned JSON object or NULL */
  kvr_http_limits_t limits;
  uint64_t connect_timeout_ms;    /* TCP connect to a worker, default 2000 */
  uint64_t first_byte_timeout_ms; /* request sent -> first response byte, default 300000 */
  uint64_t idle_timeout_ms;       /* gap between response bytes, default 120000 */
  uint64_t retry_after_s;         /* Retry-After on 503, default 1 */
  size_t response_buffer_max;     /* non-streaming bodies buffered up to this, default 16 MiB */
  size_t block_chars;             /* prefix block size in characters, default 64 */
  uint64_t
      cache_capacity_blocks; /* per worker, before /metrics tells; default from 21,766 GPU blocks */
  uint64_t scrape_interval_ms; /* /metrics scrape period, default 1000; 0 disables */
  char **peers;                /* other replicas' admin base URLs (--peer), owned */
  size_t npeers;
  uint64_t peer_interval_ms;    /* how often each peer's GET /admin/load is read, default 200 */
  uint64_t peer_stale_ms;       /* a peer's figures older than this are ignored, default 1000 */
  char *peer_sync_listen;       /* ZMQ endpoint announcing our requests to peers (peer_sync.h) */
  uint64_t kv_events_refill_ms; /* approximate index after a lost stream, default 30000 */
  uint64_t kv_events_replay_timeout_ms; /* a replay's deadline, default 2000 */
  char *kv_events_topic;                /* subscription prefix, default "" (every topic) */
  size_t tokenize_cache_entries;        /* /tokenize answers kept for precise mode, default 4096 */
  double tokenize_prefix_coverage;      /* a cached earlier turn stands for a chat prompt; 0: off */
  uint64_t scrape_stale_ms;             /* scraped data older than this is ignored, default 5000 */
  uint64_t fail_threshold; /* consecutive connect failures before a worker is DOWN, default 3 */
  /* Outlier ejection (router.c): consecutive 5xx answers, first-byte timeouts or connect failures
   * of proxied requests eject a worker for base * 2^(n-1) ms (n: its ejections in a row), capped.
   */
  uint64_t outlier_consecutive;      /* failures in a row that eject, default 5; 0 = never eject */
  uint64_t outlier_base_ejection_ms; /* first ejection's length, default 30000 */
  uint64_t outlier_max_ejection_ms;  /* longest ejection, default 300000 */
  uint64_t outlier_max_percent;      /* at most this % of the workers ejected at once, default 50 */
  /* Retry budget (router.c): a retry is allowed while retries in flight stay under budget_percent
   * of the requests in flight, or under min_concurrency. */
  uint64_t retry_budget_percent;  /* default 20 */
  uint64_t retry_min_concurrency; /* default 3 */
  /* Admission bound (proxy.c): 0 = off (default). */
  uint64_t admission_max_inflight; /* requests in flight per worker before new ones queue */
  uint64_t admission_queue_limit;  /* queued requests at most, default 256 (503 above) */
  uint64_t admission_max_wait_ms;  /* longest wait in the queue, default 10000 (then 503) */
  bool worker_header;              /* add x-kvrouter-worker to responses, default true */
  bool reuse_port;  /* SO_REUSEPORT on the public listener: several processes share one port */
  bool access_log;  /* default true */
  char *log_level;  /* default "info" */
  char *log_format; /* "text" or "json", default "text" */
  uint64_t shutdown_grace_ms;   /* in-flight requests' time to finish at SIGTERM, default 10000 */
  uint64_t seed;                /* policy randomness, default 1 */
  char *admin_token_file;       /* --admin-token-file: the admin API's bearer token, or NULL */
  char *admin_token;            /* its token, read by kvr_config_load_admin_token(); NULL: open */
  bool admin_open_reads;        /* GET/HEAD on the admin API need no token, default false */
  char *worker_ca_file;         /* CA bundle for https:// workers (CURLOPT_CAINFO), or NULL */
  char *trace_out;              /* --trace-out FILE: live traffic as a trace (serve/trace_out.h) */
  uint64_t trace_out_max_bytes; /* rotated to FILE.1 past this, default 256 MiB, 0 = never */
  size_t trace_block_tokens;    /* tokens a trace hash id stands for, default 512 */
  size_t response_ids_max;      /* Responses API ids remembered with their worker, default 65536 */
  size_t session_keys_max;      /* session keys remembered with their last worker, default 65536 */
  char *session_header;         /* a request header whose value is a session key, or NULL */
  bool resume_streams; /* continue a stream broken mid-answer on another worker, default on */
  uint64_t resume_max; /* continuations per request, default 2 (at most 6) */
  kvr_json_guard_limits_t body_guard; /* what one chat/completions body may hold (json_guard.h) */
  kvr_lora_adapter_t *lora_adapters;  /* owned; adapters loaded on demand (--lora-adapter) */
  size_t nlora_adapters;
} kvr_config_t;

/* Shortest admin token accepted. */
#define KVR_ADMIN_TOKEN_MIN 16

void kvr_config_init(kvr_config_t *cfg);
void kvr_config_free(kvr_config_t *cfg);

/* Parses `serve` arguments (argv[0] is "serve") through the option engine (cli.h), loading
 * --config first wherever it appears, then checks kvr_config_validate(). Returns 0, 1 if --help or
 * --version was printed to out, or a negative code with a one-line message in err. Then reads
 * --admin-token-file (kvr_config_load_admin_token()). */
int kvr_config_parse_args(kvr_config_t *cfg, int argc, char **argv, FILE *out, char *err,
                          size_t errlen);

/* Applies a JSON config document. source names it in messages. Returns 0 or KVR_EINVAL + err. */
int kvr_config_apply_json(kvr_config_t *cfg, const char *json, size_t len, const char *source,
                          char *err, size_t errlen);

/* Checks what one flag's own range cannot: at least one worker or --discover, a replay port only
 * with an events port, a known policy, the listeners
 * differ, block_chars in 8..4096, positive timeouts and body limit, a readable --worker-ca-file.
 * Returns 0 or KVR_EINVAL + err.
 */
int kvr_config_validate(const kvr_config_t *cfg, char *err, size_t errlen);

/* Reads cfg->admin_token_file (when set) into cfg->admin_token: one token, surrounding whitespace
 * stripped, at least KVR_ADMIN_TOKEN_MIN characters, no blanks or control characters inside.
 * Returns 0 or KVR_EINVAL with one line naming --admin-token-file in err. Called by
 * kvr_config_parse_args() after kvr_config_validate(). */
int kvr_config_load_admin_token(kvr_config_t *cfg, char *err, size_t errlen);

/* True if the admin listener's address is a loopback one (127.0.0.0/8, ::1, localhost). */
bool kvr_config_admin_on_loopback(const kvr_config_t *cfg);

/* Adds a worker URL (validated by kvr_url_worker()). Returns 0, KVR_EINVAL
 * (bad URL) or KVR_ELIMIT (more than KVR_MAX_WORKERS), with err.
 */
int kvr_config_add_worker(kvr_config_t *cfg, const char *url, char *err, size_t errlen);

/* Adds a worker from its spec: "URL[,kv_events=EP][,kv_replay=EP][,dp_size=N]" (the --worker
 * form) or the JSON object text {"url": URL, "kv_events": EP, "kv_replay": EP, "dp_size": N} (the
 * config file's form). dp_size is 1..KVR_DP_SIZE_MAX; with kv_events, every rank's endpoint
 * (kvr_url_kv_endpoint_rank) must be a valid one. */
int kvr_config_add_worker_spec(kvr_config_t *cfg, const char *spec, char *err, size_t errlen);

/* Adds a runtime-loadable LoRA adapter from its spec, vLLM's --lora-modules forms: "NAME=PATH" or
 * a JSON object {"name": ..., "path": ..., "base_model_name": ...} (base optional). Returns 0 or
 * KVR_EINVAL with a one-line err (empty or repeated name, unknown key, a name over 256 bytes). */
int kvr_config_add_lora_adapter(kvr_config_t *cfg, const char *spec, char *err, size_t errlen);
/* Frees every adapter of cfg's list and leaves it empty. */
void kvr_config_clear_lora_adapters(kvr_config_t *cfg);

/* Prints `serve --help`. */
void kvr_config_usage(FILE *out);

#endif

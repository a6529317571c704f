/* stats.h -- per-request records, per-level aggregation and SLO checks for `kvrouter bench`.
 *
 * Definitions follow `vllm bench serve`:
 *   TTFT  request sent -> first chunk carrying a token
 *   ITL   gap between successive token-carrying chunks
 *   TPOT  (E2E - TTFT) / (output_tokens - 1), per request with at least 2 output tokens
 *   E2E   request sent -> last token
 * Percentiles interpolate linearly between closest ranks (numpy's default, as vllm uses):
 * kvr_quantile() of src/base/quantile.h, the definition kvrouter's products share.
 *
 * All durations in records and levels are in report time: real time multiplied by the time scale
 * (see bench/loadgen/README.md), except send lag, which measures the load generator itself and
 * stays in real ms.
 *
 * Ownership: a kvr_results_t owns its runs, a run owns its levels, a level owns its records. The
 * report writer only reads them; it never needs a network or a loop.
 */
#ifndef KVR_STATS_H
#define KVR_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_WORKER_NAME_MAX 48
#define KVR_STATS_MAX_WORKERS 64
#define KVR_STATS_MAX_TURNS 64

/* The metrics `vllm bench serve --percentile-metrics` names, in the order its result lists them
 * (ttft, tpot, itl, e2el, client_queue_time, e2el_including_client_queue). */
typedef enum {
  KVR_METRIC_TTFT = 0,
  KVR_METRIC_TPOT,
  KVR_METRIC_ITL,
  KVR_METRIC_E2EL,
  KVR_METRIC_QUEUE, /* client_queue_time: an arrival's wait for a free --max-concurrency slot */
  KVR_METRIC_E2EL_QUEUE, /* e2el_including_client_queue: E2E plus that wait */
  KVR_METRIC_COUNT
} kvr_metric_t;

#define KVR_RESULT_MAX_PCT 16 /* percentiles one result lists per metric */
#define KVR_RESULT_METADATA_MAX 512

/* How a level's vllm-compatible result JSON is written (report_json.c, report_files.c): the
 * settings `vllm bench serve` takes for its --save-result file, from bench_options.c's vllm
 * spellings. Zeroed = kvrouter's defaults. Strings are borrowed (argv). */
typedef struct kvr_result_opts_s {
  unsigned metrics;               /* bit 1u << kvr_metric_t per --percentile-metrics name; 0 =
                                   * kvrouter's default: ttft, tpot, itl, e2el */
  double pct[KVR_RESULT_MAX_PCT]; /* --metric-percentiles; npct 0 = kvrouter's 50, 90, 95, 99 */
  size_t npct;
  bool goodput;         /* --goodput given: request_goodput counts by goodput_ms, else by the SLO
                         * thresholds (kvr_slo_t) */
  double goodput_ms[3]; /* ttft, tpot, e2el thresholds, ms; < 0 = not given */
  const char *backend;  /* --backend as the JSON names it; NULL = "openai" / "openai-chat" by API */
  bool save_result;     /* write each level also as vllm names its file (report_files.c) */
  bool append_result;   /* ... appended to that file, one JSON document a line */
  bool save_detailed;   /* keep every ITL and the generated text of each measured request */
  const char *result_dir;                 /* NULL = the current directory */
  const char *result_filename;            /* NULL = vllm's name */
  char metadata[KVR_RESULT_METADATA_MAX]; /* --metadata KEY=VALUE pairs, one a line */
} kvr_result_opts_t;

/* The metrics written when opts->metrics is 0, and the percentiles when opts->npct is 0. */
unsigned kvr_result_metrics(const kvr_result_opts_t *opts);
size_t kvr_result_pcts(const kvr_result_opts_t *opts, const double **pct);

/* vllm's figures of one metric over a level's completed measured requests (ms): np.mean,
 * np.median, np.std (population) and np.percentile (linear) of each opts percentile; 0 when there
 * are none, as vllm's `np.mean(x or 0)`. */
typedef struct kvr_vstat_s {
  size_t n;
  double mean, median, std;
  double pct[KVR_RESULT_MAX_PCT];
} kvr_vstat_t;

/* One request as the load generator saw it. */
typedef struct kvr_req_rec_s {
  uint64_t seq;        /* its send within the level, from 0: the order vllm's arrays keep */
  uint64_t conv;       /* conversation index within the level */
  uint32_t turn;       /* 1-based */
  bool warmup;         /* excluded from every metric (warm-up, or cool-down below) */
  bool cooldown;       /* concurrency mode: sent after the last measured request, to keep the
                        * load at N users until it completed (warmup is set too) */
  int32_t user;        /* concurrency mode: the user (0..N-1) who sent it; -1 in rate mode */
  bool ok;             /* HTTP 200 and a complete stream */
  int status;          /* HTTP status, 0 if none arrived */
  double target_s;     /* scheduled send time since level start, report seconds: its arrival, or
                        * when a --max-concurrency slot freed if it waited for one */
  double arrival_s;    /* its arrival since level start, report seconds (vllm's queue time, the
                        * wait for a slot, is sent_s - arrival_s) */
  double sent_s;       /* actual send time since level start, report seconds */
  double lag_ms;       /* actual - scheduled, real ms (0 in concurrency mode) */
  double ttft_ms;      /* < 0 when no token arrived */
  double transport_ms; /* TTFT outside the simulator's engine, real ms; < 0 if not reported */
  double e2e_ms;
  double tpot_ms; /* < 0 when output_tokens < 2 */
  uint32_t n_itl; /* ITL samples this request produced */
  double itl_mean_ms, itl_max_ms;
  uint32_t output_tokens; /* usage.completion_tokens, else content-bearing chunks */
  uint32_t chunks;        /* content-bearing chunks */
  uint32_t prompt_tokens; /* usage.prompt_tokens, 0 if absent */
  uint32_t cached_tokens; /* usage.prompt_tokens_details.cached_tokens, 0 if absent */
  bool usage_seen;
  char worker[KVR_WORKER_NAME_MAX]; /* x-kvrouter-worker response header, "" if absent */
  char model[64];  /* the "model" a mix workload's conversation sent ("" otherwise: --model) */
  char error[128]; /* "" when ok */
  /* --save-detailed, measured requests only (else NULL); owned by the level once added. */
  double *itl_ms; /* its n_itl ITLs in order, report ms */
  char *text;     /* the text it generated */
} kvr_req_rec_t;

typedef struct kvr_dist_s {
  size_t n;
  double mean, std, p50, p90, p95, p99, max;
} kvr_dist_t;

typedef struct kvr_slo_s {
  double ttft_p99_ms;     /* pass when TTFT p99 < this (1000) */
  double tpot_p99_ms;     /* pass when TPOT p99 < this (60) */
  double max_failed_frac; /* pass when failed <= this fraction of measured requests (0) */
} kvr_slo_t;

/* Bits of kvr_level_t.fail_mask: which SLO a level missed. */
#define KVR_SLO_FAIL_TTFT 1u
#define KVR_SLO_FAIL_TPOT 2u
#define KVR_SLO_FAIL_ERRORS 4u
#define KVR_SLO_FAIL_NODATA 8u

typedef struct kvr_worker_share_s {
  char name[KVR_WORKER_NAME_MAX]; /* "" = no header */
  size_t count;
} kvr_worker_share_t;

typedef struct kvr_turn_stats_s {
  uint32_t turn;
  kvr_dist_t ttft;
  double mean_prompt_tokens, mean_cached_tokens;
} kvr_turn_stats_t;

/* One load level (one rate or one concurrency) of one run. */
typedef struct kvr_level_s {
  double rate;          /* target rate in report req/s; 0 in concurrency mode */
  unsigned concurrency; /* users in concurrency mode; 0 in rate mode */
  bool interrupted;     /* stopped early (Ctrl-C): figures cover what finished */
  bool stopped_early;   /* ended once its TTFT p99 certainly missed the SLO (kvr_loadgen early
                         * stop): fails on TTFT; figures cover the requests finished by then */
  size_t ttft_over_slo; /* measured first tokens at or over the TTFT SLO when it stopped */

  /* How the level was measured (set by the load generator, see loadgen.h). */
  bool steady_state;         /* concurrency mode: measured in steady state */
  size_t warmup_requests;    /* warm-up requests sent (cancelled ones included) */
  size_t cooldown_requests;  /* cool-down requests sent (cancelled ones included) */
  size_t cancelled_requests; /* excluded requests still in flight when the level ended, cancelled
                              * and not recorded (and any an interrupt or early stop cut) */

  /* Filled by kvr_stats_level_finish(). */
  double duration_s; /* first measured send -> last measured completion (steady state: -> last
                      * measured send), report seconds */
  size_t measured;   /* non-warm-up requests */
  size_t completed, failed;
  kvr_dist_t ttft, tpot, itl, e2e, lag;
  kvr_dist_t transport; /* TTFT outside the simulator's engine, real ms; n = 0 if not reported */
  double request_throughput, output_throughput, total_token_throughput;
  double achieved_rate;  /* measured sends per report second over the send window */
  double scheduled_rate; /* the same over their scheduled (target) send times: the rate the load
                          * generator was asked for by this level's seeded arrivals */
  unsigned max_concurrent;
  uint64_t total_input, total_output, total_cached;
  size_t usage_requests;       /* completed requests whose stream carried usage */
  kvr_worker_share_t *workers; /* owned, sorted by name */
  size_t nworkers;
  kvr_turn_stats_t *turns; /* owned, by turn */
  size_t nturns;
  bool pass;
  unsigned fail_mask;

  /* Engine figures scraped from the workers' /metrics around the level (bench/loadgen/monitor.c):
   * which limit a level hit (KV cache: preemptions, usage near 1; compute: neither). */
  size_t engine_workers; /* workers whose /metrics was read before and after; 0 = unknown */
  uint64_t preemptions;  /* increase of vllm:num_preemptions_total over the level, all workers */
  double kv_usage_peak;  /* highest vllm:kv_cache_usage_perc (0-1) seen on any worker */
  /* A model fleet in virtual time (bench/vcluster/model_fleet.h; models_seen false: none): the
   * requests that reached a worker, those it answered vLLM's 404 for a model it does not serve
   * (the router should send none), and the adapter requests by the adapter's state on the chosen
   * worker as the decision saw it (none, loaded, running: kvr_adapter_state_t). */
  bool models_seen;
  uint64_t models_requests, models_not_served;
  uint64_t adapter_requests, adapter_state[3];
  /* The router's cache prediction over the level (its admin /metrics in a real run, its counters
   * in virtual time): prompt tokens it predicted cached, and those the workers' usage reported
   * cached, over the requests whose answer carried usage. router_cached_seen false: unknown. */
  bool router_cached_seen;
  uint64_t router_predicted_cached, router_reported_cached;

  /* How it was sent and is written (the load generator's settings). */
  unsigned max_concurrency;            /* in-flight cap (--max-concurrency); 0 = none */
  bool self_timed;                     /* a trace at its own times (rate: their mean rate) */
  kvr_result_opts_t result;            /* its vllm-compatible JSON */
  kvr_vstat_t vstat[KVR_METRIC_COUNT]; /* vllm's figures per metric (kvr_stats_level_finish) */

  kvr_req_rec_t *recs; /* owned, in completion order */
  size_t nrecs, caprecs;
  double *itls; /* owned ITL samples until finish (then freed); reservoir when full */
  size_t nitls, capitls;
  uint64_t itl_seen; /* samples offered, for the reservoir */
  uint64_t itl_rng;
} kvr_level_t;

/* Creates an empty level for a target rate (rate mode) or a number of users (concurrency mode). */
kvr_level_t *kvr_stats_level_new(double rate, unsigned concurrency);
void kvr_stats_level_free(kvr_level_t *lv); /* accepts NULL */

/* Cap on stored ITL samples per level; past it a uniform reservoir sample is kept. */
#define KVR_STATS_ITL_CAP ((size_t)4 << 20)

/* Sizes the record and ITL arrays for about nrecs records and nitls samples (ITLs capped at
 * KVR_STATS_ITL_CAP), so that adding them while a level runs never copies a large array: a
 * multi-megabyte realloc in a transfer's done callback would stall the load generator's loop. */
void kvr_stats_level_reserve(kvr_level_t *lv, size_t nrecs, size_t nitls);

/* Copies rec into the level and adds its ITL samples (report ms) unless it is a warm-up request.
 * The level takes rec->text; with lv->result.save_detailed it keeps a measured request's ITLs
 * (rec->itl_ms). */
void kvr_stats_level_add(kvr_level_t *lv, const kvr_req_rec_t *rec, const double *itls, size_t n);

/* Computes every aggregate from the records (vstat by lv->result's percentiles) and checks slo;
 * frees the ITL samples. May be called again after more records were added. */
void kvr_stats_level_finish(kvr_level_t *lv, const kvr_slo_t *slo);

/* Fills d from values (sorted in place); percentiles by kvr_quantile() (src/base/quantile.h). */
void kvr_stats_dist(double *values, size_t n, kvr_dist_t *d);
/* Peak number of overlapping [start, end] intervals (ends before starts at equal times). */
unsigned kvr_stats_max_overlap(const double *start, const double *end, size_t n);

/* "TTFT", "TPOT", "TTFT+TPOT", "errors", "TTFT+errors", "no data"... into buf; "" when mask == 0.
 */
void kvr_stats_fail_names(unsigned mask, char *buf, size_t size);

/* What the prefix-cache reset before a run achieved. The report says a run started cold only on
 * KVR_CACHE_RESET_ALL; the bench carries on after a failed reset. */
typedef enum kvr_cache_reset_e {
  KVR_CACHE_RESET_UNKNOWN = 0, /* no reset was tried, or its outcome was not recorded */
  KVR_CACHE_RESET_ALL,         /* every worker reset its prefix cache (and the router its index) */
  KVR_CACHE_RESET_FAILED,      /* the call or some worker failed: that worker kept its cache */
} kvr_cache_reset_t;

/* A run: one label (one policy / configuration) over a list of levels. */
typedef struct kvr_run_s {
  char label[64];
  char policy[64]; /* policy set through the admin API, "" if none */
  char description[256];
  kvr_level_t **levels; /* owned, in the order they ran */
  size_t nlevels;
  bool searched;         /* levels came from the max-SLO-rate search */
  char cache_reset[192]; /* outcome of the prefix-cache reset before this run, "" if none */
  kvr_cache_reset_t cache_reset_outcome; /* what that reset achieved (filled by the bench) */
} kvr_run_t;

/* Appends a level (ownership moves to run). */
void kvr_stats_run_add(kvr_run_t *run, kvr_level_t *lv);
/* Finds the level with this rate (within 1e-9) or concurrency, NULL if none. */
const kvr_level_t *kvr_stats_run_find(const kvr_run_t *run, double rate, unsigned concurrency);
/* Max SLO-compliant load: the highest passing rate (or concurrency) below the lowest failing one;
 * 0 when none passes. */
double kvr_stats_run_max_load(const kvr_run_t *run);

/* A trace workload's own figures (bench/loadgen/trace_replay.h), which the report states beside
 * each policy's: the window's requests as the file has them, and the requests a level sends (the
 * window's less those longer than the workers' context, which are counted here and never sent).
 * "Seen earlier" is the infinite cache: a request's leading hash blocks whose whole prefix an
 * earlier request (by arrival) of the same set carried. */
typedef struct kvr_trace_stats_s {
  char file[128];                      /* the file's name, without its folder */
  unsigned block_tokens;               /* the tokens one hash id stands for */
  bool windowed;                       /* --trace-window was given */
  double window_start_s, window_end_s; /* that window, trace seconds (end < 0: to the end) */
  size_t file_requests;                /* requests in the file */
  size_t requests;                     /* requests in the window */
  double span_s;                       /* the window's first to last arrival, trace seconds */
  double mean_rate;                    /* (requests - 1) / span_s, req/s; 0 when span_s is 0 */
  kvr_dist_t input, output;            /* tokens per request (the window's) */
  uint64_t blocks, blocks_seen;        /* hash blocks, and those seen earlier */
  uint64_t input_tokens, tokens_seen;  /* input tokens, and those of blocks seen earlier */
  kvr_dist_t shared;                   /* per request: input tokens of its blocks seen earlier */
  size_t shared_none;                  /* requests none of whose blocks was seen earlier */
  uint64_t max_context;                /* the workers' context (input + output); 0: not known */
  size_t over_context;                 /* requests longer than it: never sent */
  size_t sent;                         /* requests each level sends */
  double sent_span_s, sent_rate;       /* their span and mean rate: the rate a level scales */
  uint64_t sent_input_tokens, sent_output_tokens;
  uint64_t sent_tokens_seen; /* input tokens seen earlier among the sent requests only */
} kvr_trace_stats_t;

typedef struct kvr_results_s {
  /* Configuration, for the report. Strings owned. */
  char *title;
  char *generated; /* UTC ISO-8601 */
  char *url;
  char *model;
  char *api;      /* "chat" or "completions" */
  char *workload; /* name */
  char *workload_desc;
  char *command;      /* the command line */
  char *virtual_desc; /* NULL for a real run; else one line describing the virtual-time cluster
                       * (workers, delays, seed) */
  bool concurrency_mode;
  bool sessions; /* rate = conversation starts/s instead of turn arrivals/s */
  bool replay;   /* multiturn replay: arrival i sends a pre-assigned (conversation, turn) whether
                  * or not that conversation's previous turn has finished */
  size_t num_prompts;
  unsigned warmup;
  double cooldown_s;
  double burstiness;
  double time_scale;
  uint64_t seed;
  kvr_slo_t slo;
  const char *cache_reset; /* how prefix caches were reset before each run (static text), or NULL */
  kvr_trace_stats_t *trace; /* owned: a trace workload's own figures; NULL for other workloads */
  kvr_run_t *runs;          /* owned; runs[0] is the baseline */
  size_t nruns;
} kvr_results_t;

kvr_results_t *kvr_stats_results_new(void);
/* Adds a run with label/policy/description and returns it (owned by res; the pointer stays valid
 * until the next kvr_stats_results_add_run()). */
kvr_run_t *kvr_stats_results_add_run(kvr_results_t *res, const char *label, const char *policy,
                                     const char *description);
void kvr_stats_results_free(kvr_results_t *res); /* accepts NULL */
/* Replaces *field with a copy of value (NULL allowed). */
void kvr_stats_set_str(char **field, const char *value);

#endif

/* vllm.h -- vLLM's own formats, as the router reads them (pure: no socket, no clock).
 *
 * What a vLLM server publishes and kvrouter consumes: the Prometheus text of GET /metrics (load
 * series, the cache geometry, the cumulative token counters; names from vLLM's
 * vllm/v1/metrics/loggers.py), and the model list of GET /v1/models (max_model_len per model,
 * vllm/entrypoints/openai/serving_models.py). serve/scrape.c fetches the pages; the router
 * (core/router.c) applies the parsed figures; the counters' page-to-page arithmetic lives here so
 * that a worker restart is read the same way everywhere.
 */
#ifndef KVR_VLLM_H
#define KVR_VLLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* vLLM's cumulative token counters, as one /metrics page gives them (each summed over its label
 * sets, e.g. one per engine): the prefix cache's hits and queries in tokens, prompt and generated
 * tokens. Names from vLLM's vllm/v1/metrics/loggers.py (Counter "vllm:prefix_cache_hits" and so
 * on; prometheus_client exposes a Counter with the _total suffix). */
#define KVR_VLLM_COUNTER_MAP(XX)                                                                   \
  XX(HITS, "vllm:prefix_cache_hits_total")                                                         \
  XX(QUERIES, "vllm:prefix_cache_queries_total")                                                   \
  XX(PROMPT, "vllm:prompt_tokens_total")                                                           \
  XX(GENERATION, "vllm:generation_tokens_total")

typedef enum {
#define KVR__VLLM_COUNTER_ENUM(name, str) KVR_VLLM_##name,
  KVR_VLLM_COUNTER_MAP(KVR__VLLM_COUNTER_ENUM)
#undef KVR__VLLM_COUNTER_ENUM
      KVR_VLLM_NCOUNTERS
} kvr_vllm_counter_t;

typedef struct kvr_vllm_counters_s {
  uint64_t v[KVR_VLLM_NCOUNTERS];
  unsigned present; /* bit (1u << i): counter i was on the page */
} kvr_vllm_counters_t;

/* Those counters followed across the pages of one worker (kvr_vllm_counters_advance):
 * the last page's values and the increases summed since the router first saw them. */
typedef struct kvr_vllm_counter_state_s {
  kvr_vllm_counters_t last; /* last.present is 0 until a page carried one of them */
  uint64_t sum[KVR_VLLM_NCOUNTERS];
  uint64_t resets; /* pages on which a counter went back: the worker restarted */
} kvr_vllm_counter_state_t;

/* One parsed vLLM /metrics page (kvr_vllm_parse_metrics). */
typedef struct kvr_vllm_metrics_s {
  uint64_t at_ms; /* when it was taken, the caller's clock, in ms */
  double num_requests_running, num_requests_waiting;
  double kv_cache_usage;               /* 0..1 */
  uint64_t num_gpu_blocks, block_size; /* vllm:cache_config_info, 0 when absent */
  kvr_vllm_counters_t counters;        /* vLLM's token counters on the page */
} kvr_vllm_metrics_t;

/* Parses the Prometheus text of a vLLM /metrics page taken at now_ms into *out: samples of one name
 * are summed across label sets (several engines behind one server), the cache usage is their mean.
 * A load sample that is not finite, negative or above 1e15 is ignored (a worker's NaN or -1e300
 * never reaches a policy), a cache usage above 1 counts as 1. Returns 0, or KVR_EPARSE when none of
 * the expected series is present (*out is then unusable). */
int kvr_vllm_parse_metrics(const char *text, size_t len, uint64_t now_ms, kvr_vllm_metrics_t *out);

/* Follows one worker's vLLM counters from page to page: st holds the last page's values, cur is the
 * new page's. For each counter on both pages, delta[i] gets its increase; when any counter on both
 * pages went down, the worker restarted (a counter never decreases otherwise): every counter then
 * counts from zero again, so its increase is its whole new value (Prometheus' rate() reads a reset
 * the same way), and st->resets is counted. A counter first seen on this page only sets its
 * baseline (increase 0); one missing from it keeps its last value. Adds the increases to st->sum
 * and returns whether the page was a reset. Pure; no negative increase is ever reported. */
bool kvr_vllm_counters_advance(kvr_vllm_counter_state_t *st, const kvr_vllm_counters_t *cur,
                               uint64_t delta[KVR_VLLM_NCOUNTERS]);

/* Parses a GET /v1/models answer: *max_model_len gets the smallest positive max_model_len of the
 * objects in "data" (vLLM gives one per model it serves). Returns 0, or KVR_EPARSE when the text is
 * not such a list or no model gives one. */
int kvr_vllm_parse_models(const char *text, size_t len, uint64_t *max_model_len);

#endif

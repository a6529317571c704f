/* vllm.h -- vLLM's own formats, as the router reads them (pure: no socket, no clock).
 *
 * What a vLLM server publishes and kvrouter consumes: the Prometheus text of GET /metrics (load
 * series, the cache geometry, the cumulative token counters; names from vLLM's
 * vllm/v1/metrics/loggers.py), the model list of GET /v1/models (the ids a worker answers to, base
 * names, aliases and LoRA adapters, with max_model_len per model), and the 404 vLLM answers for a
 * model it does not serve; with LoRA, vllm:lora_requests_info (the adapters each server is running)
 * and the cards of runtime-loaded adapters. serve/scrape.c fetches the pages; the router
 * (core/router.c) applies the parsed figures; the counters' page-to-page arithmetic lives here so
 * that a worker restart is read the same way everywhere.
 */
#ifndef KVR_VLLM_H
#define KVR_VLLM_H

#include "base/buf.h"

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

/* vllm:lora_requests_info, present only when the server runs with --enable-lora (vLLM's
 * vllm/v1/metrics/loggers.py, LoRA requests info gauge): its labels max_lora (--max-loras),
 * running_lora_adapters and waiting_lora_adapters (adapter names joined by ',', "" when none);
 * the value is the Unix time of the last update. Every new label combination starts a series of
 * its own and the old ones stay on the page, so the series with the largest value is the current
 * one. Names are kept up to KVR_VLLM_LORA_NAMES_MAX bytes of the joined list; a longer list is
 * cut after its last whole name (cut true). */
#define KVR_VLLM_LORA_NAMES_MAX 1024
typedef struct kvr_vllm_lora_info_s {
  bool present;      /* the page had the series */
  bool cut;          /* a list was longer than KVR_VLLM_LORA_NAMES_MAX: names are missing */
  double updated;    /* the chosen series' value */
  uint32_t max_lora; /* 0 when the label is absent */
  char running[KVR_VLLM_LORA_NAMES_MAX]; /* "a,b" */
  char waiting[KVR_VLLM_LORA_NAMES_MAX];
} kvr_vllm_lora_info_t;

/* Whether the ','-joined list names name exactly (a whole item; spaces around an item are not part
 * of it: vLLM writes "a,b", the gateway protocol's example "a, b"). */
bool kvr_vllm_lora_list_has(const char *list, const char *name);

/* One parsed vLLM /metrics page (kvr_vllm_parse_metrics). */
typedef struct kvr_vllm_metrics_s {
  uint64_t at_ms; /* when it was taken, the caller's clock, in ms */
  double num_requests_running, num_requests_waiting;
  double kv_cache_usage;               /* 0..1 */
  uint64_t num_gpu_blocks, block_size; /* vllm:cache_config_info, 0 when absent */
  kvr_vllm_counters_t counters;        /* vLLM's token counters on the page */
  kvr_vllm_lora_info_t lora;           /* vllm:lora_requests_info, the newest series */
  uint32_t engines; /* distinct engine="R" labels on the page (R 0..63), 0 when none */

} kvr_vllm_metrics_t;

/* Parses the Prometheus text of a vLLM /metrics page taken at now_ms into *out: samples of one name
 * are summed across label sets (several engines behind one server), the cache usage is their mean.
 * A load sample that is not finite, negative or above 1e15 is ignored (a worker's NaN or -1e300
 * never reaches a policy), a cache usage above 1 counts as 1. Returns 0, or KVR_EPARSE when none of
 * the expected series is present (*out is then unusable). */
int kvr_vllm_parse_metrics(const char *text, size_t len, uint64_t now_ms, kvr_vllm_metrics_t *out);

/* The same for one engine of a data-parallel server (vLLM labels every per-engine series with
 * engine="R", the rank as a string: v1/metrics/loggers.py): only the samples labelled
 * engine="<engine>" count (a page without engine labels gives a rank nothing: the router then
 * keeps to its own accounting for it), and vllm:lora_requests_info, which has no engine label (the
 * API server's, shared by its ranks); engine -1 reads every sample, as kvr_vllm_parse_metrics.
 * out->engines counts the page's engines either way. KVR_EPARSE when that engine has none of the
 * load series. */
int kvr_vllm_parse_metrics_engine(const char *text, size_t len, uint64_t now_ms, int engine,
                                  kvr_vllm_metrics_t *out);

/* Follows one worker's vLLM counters from page to page: st holds the last page's values, cur is the
 * new page's. For each counter on both pages, delta[i] gets its increase; when any counter on both
 * pages went down, the worker restarted (a counter never decreases otherwise): every counter then
 * counts from zero again, so its increase is its whole new value (Prometheus' rate() reads a reset
 * the same way), and st->resets is counted. A counter first seen on this page only sets its
 * baseline (increase 0); one missing from it keeps its last value. Adds the increases to st->sum
 * and returns whether the page was a reset. Pure; no negative increase is ever reported. */
bool kvr_vllm_counters_advance(kvr_vllm_counter_state_t *st, const kvr_vllm_counters_t *cur,
                               uint64_t delta[KVR_VLLM_NCOUNTERS]);

/* ---- GET /v1/models ---------------------------------------------------------------------------
 *
 * vLLM lists what one server answers to (show_available_models in its entrypoints'
 * models/serving.py, the ModelCard of openai/engine/protocol.py): one card per
 * --served-model-name, all with the same root (the --model path), parent null and max_model_len
 * set; then one card per LoRA adapter, id the adapter's name, root its path, parent the base it
 * applies to, max_model_len null. A request's "model" must equal one of these ids exactly (an
 * empty or absent one selects the first base name). The first card's id is also the model_name
 * label of the server's own /metrics. */

#define KVR_VLLM_MODELS_MAX 64       /* ids kept per worker; a longer list is kept incomplete */
#define KVR_VLLM_MODEL_ID_MAX 256    /* longest id, root or parent kept, in bytes */
#define KVR_VLLM_MODEL_CARD_MAX 2048 /* longest card kept whole for the union, in bytes of JSON */

/* One card of a worker's list. */
typedef struct kvr_vllm_model_s {
  char *id;               /* owned */
  uint64_t hash;          /* kvr_vllm_model_hash(id): lookups compare it first */
  char *root;             /* owned, or NULL (absent, null or over KVR_VLLM_MODEL_ID_MAX) */
  char *parent;           /* owned: the base a LoRA adapter applies to; NULL for a base model */
  uint64_t max_model_len; /* 0 when absent or null (adapters) */
  char *card;             /* owned: the card as compact JSON, its fields as the worker gave them */
} kvr_vllm_model_t;

/* A worker's list (kvr_vllm_parse_model_list); owns its cards. */
typedef struct kvr_vllm_models_s {
  kvr_vllm_model_t *v;
  size_t n;
  /* False when a card with a string id was not kept (beyond KVR_VLLM_MODELS_MAX, an id longer than
   * KVR_VLLM_MODEL_ID_MAX): the list then does not prove that the worker lacks a model. */
  bool complete;
  uint64_t max_model_len; /* the smallest positive max_model_len of the cards, 0 when none */
} kvr_vllm_models_t;

/* Parses a GET /v1/models answer into *out (initialized by the call; free it with
 * kvr_vllm_models_free): the cards of "data" in order, each kept with its id, root, parent,
 * max_model_len and its JSON (a card over KVR_VLLM_MODEL_CARD_MAX bytes is kept as the four
 * fields alone). A card without a string id is skipped, a repeated id kept once. Returns 0, or
 * KVR_EPARSE (out empty) when the text is not {"data": [...]} or no card has an id. */
int kvr_vllm_parse_model_list(const char *text, size_t len, kvr_vllm_models_t *out);

/* The context of a GET /v1/models answer alone: *max_model_len gets the smallest positive
 * max_model_len of its cards (what the load generator needs). Returns 0, or KVR_EPARSE when the
 * text is not such a list or no card gives one (*max_model_len untouched). */
int kvr_vllm_parse_models(const char *text, size_t len, uint64_t *max_model_len);

/* Adds a card to m as vLLM lists a LoRA adapter it loaded at runtime (models/serving.py: id the
 * adapter's name, root its path, parent its base, max_model_len null, with object, created and
 * owned_by), for a router that has just loaded it (POST /v1/load_lora_adapter answered) and does
 * not wait for the next list. m may be empty (never read). Returns 0, 1 when m already lists id
 * (unchanged), KVR_ELIMIT when m holds KVR_VLLM_MODELS_MAX cards or a string is over
 * KVR_VLLM_MODEL_ID_MAX (m marked incomplete). */
int kvr_vllm_models_add_adapter(kvr_vllm_models_t *m, const char *id, const char *root,
                                const char *parent, uint64_t created_s);

/* Releases the cards of m and leaves it empty; accepts NULL. */
void kvr_vllm_models_free(kvr_vllm_models_t *m);

/* The card of m whose id is model (exact, as vLLM compares), or NULL. */
const kvr_vllm_model_t *kvr_vllm_models_find(const kvr_vllm_models_t *m, const char *model);
/* The same with hash = kvr_vllm_model_hash(model), for a caller that looks one name up in many
 * lists (a decision over the workers). */
const kvr_vllm_model_t *kvr_vllm_models_find_hash(const kvr_vllm_models_t *m, const char *model,
                                                  uint64_t hash);
uint64_t kvr_vllm_model_hash(const char *model);

/* Appends vLLM's answer to a request naming a model the server does not serve (status 404;
 * the entrypoints' serve/engine/serving.py): OpenAI's error shape
 * {"error":{"message":"The model `X` does not exist.","type":"NotFoundError","param":"model",
 * "code":404}}, or with anthropic the Messages API's {"type":"error","error":{"type":
 * "NotFoundError","message":...}} (vLLM's type name, as its anthropic/serving.py translates it),
 * byte for byte as vLLM writes them (compact, no newline after). */
void kvr_vllm_model_not_found(kvr_buf_t *out, const char *model, bool anthropic);

#endif

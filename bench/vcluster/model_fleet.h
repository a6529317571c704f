/* model_fleet.h -- which models each virtual worker serves (`kvrouter bench --virtual
 * --model-fleet SPEC`): base models, LoRA adapters and data-parallel endpoints.
 *
 * A fleet is groups joined by ';', each "N*MODEL[:ADAPTER+ADAPTER...][@dp]":
 *   - N workers serving base model MODEL (vLLM's --served-model-name MODEL),
 *   - each listing the adapters named after ':' (vLLM's --enable-lora --lora-modules NAME=PATH:
 *     cards with parent MODEL in GET /v1/models),
 *   - with "@dp", the N workers are the N ranks of one data-parallel endpoint (vLLM's
 *     --data-parallel-size N behind one API server): one GET /v1/models answer for all of them,
 *     one engine per rank, each with its own KV cache and batch (dense models run every DP engine
 *     on its own: v1/engine/core.py), addressed by the router one rank at a time (the
 *     X-data-parallel-rank header, openai/engine/serving.py _get_data_parallel_rank).
 * e.g. "6*model-a;3*model-b:b-sql+b-chat;3*model-b:b-code+b-math;4*model-a@dp".
 *
 * kvr_mfleet_t is what the virtual cluster builds its workers from: per worker its base model, its
 * adapters (their parent is the base), and its endpoint and rank. kvr_mfleet_models_json() writes
 * worker i's GET /v1/models answer as vLLM writes it (what the router's scrape reads and feeds to
 * kvr_router_on_models); kvr_mfleet_serves() is vLLM's model check on a request (another name is
 * its 404). Pure: no engine, no router.
 */
#ifndef KVR_MODEL_FLEET_H
#define KVR_MODEL_FLEET_H

#include "base/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_MFLEET_NAME_MAX 64 /* longest model or adapter name, bytes, with the NUL */
#define KVR_MFLEET_ADAPTERS_MAX 8
/* Every adapter's rank (adapter_config.json's r): vLLM's default --max-lora-rank, the usual r. */
#define KVR_MFLEET_LORA_RANK 16

/* The fleet of issue 35's study scenario (model-fleet): 16 workers, two base models. model-a on 6
 * workers and on one DP endpoint of 4 ranks; model-b on 6 workers with four adapters: four
 * workers list three of them (each set of three once), two list all four, so each adapter is on
 * 5 of the 6 and every worker lists more adapters than it batches at once (--max-loras 2): an
 * adapter request on a worker whose batch holds two others waits or swaps, which is where the
 * router's knowledge of the running adapters pays. */
#define KVR_MFLEET_STUDY                                                                           \
  "6*model-a;1*model-b:b-sql+b-chat+b-code;1*model-b:b-sql+b-chat+b-math;"                         \
  "1*model-b:b-sql+b-code+b-math;1*model-b:b-chat+b-code+b-math;"                                  \
  "2*model-b:b-sql+b-chat+b-code+b-math;4*model-a@dp"

typedef struct kvr_mfleet_worker_s {
  char model[KVR_MFLEET_NAME_MAX];                             /* the base model it serves */
  char adapters[KVR_MFLEET_ADAPTERS_MAX][KVR_MFLEET_NAME_MAX]; /* LoRA adapters it lists */
  size_t nadapters;
  /* adapters[i], for kvr_sim_models_t: into this struct, so a copy of it must not outlive f */
  const char *adapter_ptrs[KVR_MFLEET_ADAPTERS_MAX];
  int endpoint;              /* the endpoint it answers on (workers of one "@dp" group share one) */
  unsigned dp_rank, dp_size; /* its rank on that endpoint and the endpoint's ranks (1: no DP) */
} kvr_mfleet_worker_t;

typedef struct kvr_mfleet_s {
  kvr_mfleet_worker_t *w; /* owned */
  size_t n;
  size_t endpoints; /* distinct endpoints (a DP group counts once) */
} kvr_mfleet_t;

/* Parses spec into *f (initialized by the call; free with kvr_mfleet_free). At most max_workers
 * workers in all. Returns 0, or KVR_EINVAL with a one-line reason naming the group in err (f
 * empty). */
int kvr_mfleet_parse(const char *spec, size_t max_workers, kvr_mfleet_t *f, char *err,
                     size_t errlen);
void kvr_mfleet_free(kvr_mfleet_t *f); /* accepts NULL; leaves f empty */

/* Worker wi's GET /v1/models answer as vLLM gives it (models/serving.py show_available_models,
 * the ModelCard of openai/engine/protocol.py): the base card (id the model, root its path,
 * parent null, max_model_len), then one card per adapter (root its path, parent the base,
 * max_model_len null). out is reset first. */
void kvr_mfleet_models_json(const kvr_mfleet_t *f, size_t wi, uint32_t max_model_len,
                            long long created, kvr_buf_t *out);

/* Whether worker w answers a request naming model (NULL or "": its base, as vLLM's), and with
 * which adapter (*lora: the index in w->adapters, -1 the base). */
bool kvr_mfleet_serves(const kvr_mfleet_worker_t *w, const char *model, int32_t *lora);

/* How many workers serve model (its base, or listing it as an adapter). */
size_t kvr_mfleet_count(const kvr_mfleet_t *f, const char *model);

/* One line: the groups as the report shows them ("6 x model-a; 1 x model-b + b-sql, b-chat;
 * ... ; 4 x model-a as one DP endpoint of 4 ranks"). */
void kvr_mfleet_describe(const kvr_mfleet_t *f, kvr_buf_t *out);

#endif

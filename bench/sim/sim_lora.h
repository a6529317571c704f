/* sim_lora.h -- the simulated worker's LoRA adapters, as vLLM's OpenAIServingModels keeps them.
 *
 * A kvr_sim_loras_t is the adapters a worker serves (vllm/entrypoints/openai/models/serving.py:
 * lora_requests, lora_id_counter): each adapter's name (a model name of its own), path, base model
 * name, lora_int_id (1, 2, ... in load order, kept by an in-place reload) and rank. Adapters come
 * from --lora-modules at startup and, with VLLM_ALLOW_RUNTIME_LORA_UPDATING, from POST
 * /v1/load_lora_adapter; POST /v1/unload_lora_adapter forgets one. Loading reads the adapter's
 * folder as vLLM's PEFTHelper.from_local_dir does: <path>/adapter_config.json must exist (else
 * vLLM's 404 "Loading lora <name> failed: No adapter found for <path>") and its "r" is the rank,
 * which must not exceed --max-lora-rank (else the 500 vLLM answers with validate_legal's
 * message). The engine side (its CPU cache and GPU slots, the swap cost) is the caller's:
 * sim_server.c calls kvr_sim_engine_lora_add/remove with the id and rank given here.
 *
 * It also keeps vllm:lora_requests_info (vllm/v1/metrics/loggers.py): a gauge with the labels
 * max_lora, waiting_lora_adapters and running_lora_adapters (names joined by ","), set to the
 * Unix time at every update; prometheus_client keeps every label combination it was ever set
 * with, so each combination is a series of its own that keeps its last value (the newest 1024
 * kept here).
 *
 * Pure: no loop, no HTTP. Strings are owned by the table.
 */
#ifndef KVR_SIM_LORA_H
#define KVR_SIM_LORA_H

#include "base/buf.h"
#include "sim_api.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One --lora-modules item: name=path, or the JSON object {"name","path","base_model_name"?}. */
typedef struct kvr_sim_lora_module_s {
  const char *name, *path, *base_model_name; /* base_model_name NULL when not given */
} kvr_sim_lora_module_t;

typedef struct kvr_sim_lora_s {
  char *name, *path;
  char *base; /* base_model_name when it names a served name, else NULL (the first is the parent) */
  uint32_t id, rank;
} kvr_sim_lora_t;

typedef struct kvr_sim_lora_series_s {
  char *labels; /* max_lora="..",waiting_lora_adapters="..",running_lora_adapters=".." */
  double value; /* Unix time of its last update */
} kvr_sim_lora_series_t;

typedef struct kvr_sim_loras_s {
  kvr_sim_lora_t *v;
  size_t n, cap;
  const char **names; /* v[i].name, kept in step (kvr_sim_models_t.loras) */
  uint32_t last_id;   /* lora_id_counter */
  uint32_t max_lora_rank;
  kvr_sim_lora_series_t *series;
  size_t nseries, series_cap;
} kvr_sim_loras_t;

/* vLLM's allowed --max-lora-rank values (vllm/config/lora.py MaxLoRARanks). */
bool kvr_sim_lora_rank_allowed(uint32_t rank);

/* Parses one --lora-modules word as vllm/entrypoints/openai/cli_args.py's LoRAParserAction: with
 * '=' and no ',' it is name=path, else a JSON object with "name" and "path" strings and an
 * optional "base_model_name". The strings are malloc'd into *out (kvr_sim_lora_module_free).
 * Returns 0 or KVR_EINVAL with one line in err. */
int kvr_sim_lora_module_parse(const char *text, kvr_sim_lora_module_t *out, char *err,
                              size_t errlen);
void kvr_sim_lora_module_free(kvr_sim_lora_module_t *m);

void kvr_sim_loras_init(kvr_sim_loras_t *t, uint32_t max_lora_rank);
void kvr_sim_loras_free(kvr_sim_loras_t *t);

/* The adapter named name, or NULL. */
kvr_sim_lora_t *kvr_sim_loras_find(const kvr_sim_loras_t *t, const char *name);

/* vLLM's load_lora_adapter for (name, path): empty fields are 400 InvalidUserInput "Both
 * 'lora_name' and 'lora_path' must be provided.", a loaded name without inplace 400 "... has
 * already been loaded ...", then the folder is read (404 / 500 as above). base_model_name is kept
 * when it is one of base_names. On success *out is the adapter (new, or the reloaded one with its
 * id) and 0 is returned; else the status with e filled. */
int kvr_sim_loras_load(kvr_sim_loras_t *t, const char *name, const char *path,
                       const char *base_model_name, bool inplace, const char *const *base_names,
                       size_t nbase, kvr_sim_lora_t **out, kvr_sim_err_t *e);

/* vLLM's unload_lora_adapter: "" is 400 InvalidUserInput, an unknown name 404 NotFoundError "The
 * lora adapter '<n>' cannot be found."; else it is forgotten, its id in *id, and 0 returned. */
int kvr_sim_loras_unload(kvr_sim_loras_t *t, const char *name, uint32_t *id, kvr_sim_err_t *e);

/* Sets vllm:lora_requests_info{max_lora, waiting, running} to now (Unix seconds). */
void kvr_sim_loras_info_set(kvr_sim_loras_t *t, uint32_t max_lora, const char *waiting,
                            const char *running, double now);
/* Appends the family (HELP, TYPE, every series). */
void kvr_sim_loras_info_write(kvr_buf_t *b, const kvr_sim_loras_t *t);

#endif

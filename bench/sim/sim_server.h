/* sim_server.h -- the simulated vLLM worker's HTTP side: vLLM's OpenAI API, /metrics, fault modes.
 *
 * A kvr_sim_server_t owns data_parallel_size kvr_sim_engine_t (one unless --data-parallel-size)
 * and drives each from its own clock: run a step, wait its simulated duration divided by
 * time_scale, deliver the tokens that step produced to the streams, run the next step. An idle
 * engine has no clock armed. A request goes to the engine X-data-parallel-rank names (chat,
 * completions, Messages), else to the least loaded one (vLLM's waiting*4 + running); /metrics
 * has one sample per engine (engine="R"), each engine publishes its own KV events (rank R on the
 * endpoint's port + R), and /reset_prefix_cache, the slow fault and LoRA loads reach them all.
 *
 * Endpoints (as vLLM's OpenAI server): POST /v1/chat/completions, POST /v1/completions,
 * POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel (sim_responses.h),
 * POST /v1/messages, POST /v1/messages/count_tokens (sim_anthropic.h), GET /v1/models,
 * GET /health, GET /metrics, POST /tokenize (the ids a completion is served with),
 * POST /v1/load_lora_adapter and /v1/unload_lora_adapter (with VLLM_ALLOW_RUNTIME_LORA_UPDATING;
 * the adapters are sim_lora.h's table, each a model name of its own),
 * POST /reset_prefix_cache (vLLM's dev-mode endpoint: cached blocks no running request holds
 * lose their hash); and the admin path GET/POST /sim/fault. Responses and Messages requests are
 * rendered with the chat template, so a conversation gives the same prompt ids through any of
 * the three APIs and hits the same cached blocks.
 *
 * Answers are a pure function of (the prompt up to the answer's start, the word's position in
 * the answer, the seeds): a chat answer cut after k words and sent back as a final assistant
 * message with continue_final_message continues with exactly the words the uncut answer had from
 * word k on, and stops where it stopped.
 *
 * The Responses store is on only when the environment holds VLLM_ENABLE_RESPONSES_API_STORE=1
 * at kvr_sim_server_new(), as vLLM reads it (vllm/envs.py).
 *
 * KV-cache events: with opts.kv_events enabled, each step's block lifecycle (sim_engine.h's event
 * log) is published as one vLLM EventBatch (kv_events.h) when that step's tokens are delivered, the
 * moment vLLM's scheduler publishes them (update_from_output); a reset's AllBlocksCleared waits
 * for the next step, as in vLLM, where an idle engine holds its pending events.
 */
#ifndef KVR_SIM_SERVER_H
#define KVR_SIM_SERVER_H

#include "kv_events.h"
#include "sim_api.h"
#include "sim_engine.h"
#include "sim_lora.h"
#include "sim_tokens.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* Fault modes, switchable by flag and at runtime through POST /sim/fault. */
#define KVR_SIM_FAULT_MAP(XX)                                                                      \
  XX(NONE, "none")             /* normal operation */                                              \
  XX(ERROR, "error")           /* answer completions with `status` (500) for a `rate` fraction */  \
  XX(HANG, "hang")             /* accept completions, never produce a first token */               \
  XX(DISCONNECT, "disconnect") /* close the connection after `after_tokens` tokens */              \
  XX(SLOW, "slow")             /* add `delay_ms` (simulated) to every token */                     \
  XX(REFUSE, "refuse")         /* stop listening for `duration_ms` wall-clock ms (0: until reset) */

typedef enum {
#define KVR__SIM_FAULT_ENUM(name, str) KVR_SIM_FAULT_##name,
  KVR_SIM_FAULT_MAP(KVR__SIM_FAULT_ENUM)
#undef KVR__SIM_FAULT_ENUM
      KVR_SIM_FAULT_COUNT
} kvr_sim_fault_mode_t;

typedef struct kvr_sim_fault_s {
  kvr_sim_fault_mode_t mode;
  int status;            /* ERROR: HTTP status, default 500 */
  double rate;           /* ERROR: fraction of requests that fail, default 1 */
  uint32_t after_tokens; /* DISCONNECT: tokens sent before the close, default 0 */
  double delay_ms;       /* SLOW: extra simulated ms per token, default 100 */
  double duration_ms;    /* REFUSE: wall-clock ms before listening again; 0 = until reset */
} kvr_sim_fault_t;

typedef struct kvr_sim_server_opts_s {
  kvr_sim_config_t engine;
  const char *listen;       /* "HOST:PORT"; default 127.0.0.1:8000 */
  const char *admin_listen; /* optional second listener (same API), reachable while refusing */
  const char *model;        /* vLLM's --model: the base model's path, root of its cards */
  /* vLLM's --served-model-name NAME [NAME ...] (vllm/entrypoints/openai/cli_args.py, nargs '+'):
   * the base model's names, every one a card of GET /v1/models and a name requests may give; the
   * first is the reply's and the metrics' model_name. NULL (nserved 0): model alone, as vLLM. */
  const char *const *served_names;
  size_t nserved;
  /* LoRA (vLLM's --enable-lora): on when engine.max_loras >= 1 (--max-loras; engine.max_cpu_loras
   * --max-cpu-loras). lora_modules (--lora-modules) are loaded by kvr_sim_server_new, which
   * fails with vLLM's message when one cannot be; an adapter's rank may not exceed max_lora_rank
   * (--max-lora-rank, 16). POST /v1/load_lora_adapter and /v1/unload_lora_adapter exist only when
   * the environment holds VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 or true at kvr_sim_server_new. */
  const kvr_sim_lora_module_t *lora_modules;
  size_t nlora_modules;
  uint32_t max_lora_rank;
  /* vLLM's --data-parallel-size (1): that many engines (each with engine's config) behind the one
   * API server; see "Data parallel" above. */
  uint32_t data_parallel_size;
  double time_scale;        /* > 0; simulated durations are divided by it */
  uint64_t seed;            /* seeds generated text and the error-rate coin */
  uint32_t output_len_mean; /* natural answer length (EOS) when ignore_eos is off; 0 = never EOS */
  double fixed_ttft_ms;     /* >= 0: bypass the engine: first token after this (simulated) ... */
  double fixed_itl_ms;      /* ... and then one token every fixed_itl_ms; < 0 = off */
  kvr_sim_fault_t fault;    /* initial fault */
  /* vLLM's --kv-events-config (kv_events.h); events are published only when it enables "zmq" */
  kvr_kv_events_config_t kv_events;
  kvr_kv_encoding_t kv_encoding; /* map (vLLM 0.26) or array (vLLM 0.23) */
  /* vLLM's --enable-prompt-tokens-details (default off, as in vLLM): usage carries
   * prompt_tokens_details.cached_tokens. */
  bool enable_prompt_tokens_details;
  /* vLLM's --enable-force-include-usage (default off): every streamed answer ends with a usage
   * chunk, as if the request had asked with stream_options.include_usage. */
  bool enable_force_include_usage;
} kvr_sim_server_opts_t;

#define KVR_SIM_DP_MAX 64 /* --data-parallel-size at most */

typedef struct kvr_sim_server_s kvr_sim_server_t;

/* Defaults: engine defaults, 127.0.0.1:8000, model "meta-llama/Llama-3.3-70B-Instruct", scale 1,
 * seed 0, output_len_mean 830, fixed latency off, no fault. */
void kvr_sim_server_opts_default(kvr_sim_server_opts_t *opts);
void kvr_sim_fault_default(kvr_sim_fault_t *fault, kvr_sim_fault_mode_t mode);

/* "none" -> KVR_SIM_FAULT_NONE...; returns 0 or KVR_EINVAL. */
int kvr_sim_fault_parse_mode(const char *s, kvr_sim_fault_mode_t *out);
const char *kvr_sim_fault_mode_name(kvr_sim_fault_mode_t mode);

/* A completion request's fields the sim honours, as kvr_sim_server_parse_completion() reads them.
 */
typedef struct kvr_sim_completion_s {
  kvr_sim_toks_t prompt; /* token ids; a text or chat prompt starts with BOS. Owned */
  bool stream, include_usage, continuous_usage, ignore_eos;
  bool echo; /* "echo": chat echoes a final assistant message, completions the prompt */
  /* chat: vLLM's add_generation_prompt (default true) and continue_final_message (false) */
  bool add_generation_prompt, continue_final_message;
  int64_t max_tokens; /* >= 1: as given, else vLLM's default (chat: the room left; else 16) */
  int64_t min_tokens; /* 0 when not given */
  uint64_t seed;      /* 0 when not given */
  /* The answer's words are seeded by prompt[0..turn_prefix) (0: the whole prompt) and start at
   * word gen_offset: with continue_final_message, the prompt up to the continued message's
   * content and the tokens of that content. */
  uint32_t turn_prefix, gen_offset;
  const char *salt; /* "cache_salt": borrowed from the body (valid while it is), NULL: none */
  int32_t lora;     /* the model named a LoRA adapter: its index in kvr_sim_models_t.loras; -1 */
} kvr_sim_completion_t;

/* The names a worker answers to, as vLLM's OpenAIServingModels holds them
 * (vllm/entrypoints/openai/models/serving.py): the base model's served names (the first is the
 * base model's reply name) and the LoRA adapters' names. */
typedef struct kvr_sim_models_s {
  const char *const *names;
  size_t nnames; /* >= 1 */
  const char *const *loras;
  size_t nloras;
} kvr_sim_models_t;

/* Reads body, the JSON object of POST /v1/chat/completions (chat) or POST /v1/completions, as
 * vLLM's OpenAI server does for a worker serving model with max_model_len tokens of context. Pure:
 * no server, no loop. Returns 0, or the status vLLM answers (400; 404 for another model) with
 * its message in err. Either way the caller frees p->prompt with kvr_sim_toks_free(). */
int kvr_sim_server_parse_completion(const cJSON *body, bool chat, const char *model,
                                    uint32_t max_model_len, kvr_sim_completion_t *p, char *err,
                                    size_t errlen);

/* The same, with the whole error as vLLM answers it (type, param) in e. Besides the checks above:
 * chat's continue_final_message with add_generation_prompt both set is pydantic's 400 ("Bad
 * Request"), continue_final_message with the default add_generation_prompt is transformers'
 * "not compatible" 400 (BadRequestError); an empty or non-string cache_salt is a 400. */
int kvr_sim_server_parse_completion_ex(const cJSON *body, bool chat, const char *model,
                                       uint32_t max_model_len, kvr_sim_completion_t *p,
                                       kvr_sim_err_t *e);

/* The same for a worker answering to every name in models: "model" may be any served name or
 * adapter (p->lora says which adapter); another is vLLM's 404 model-not-found. */
int kvr_sim_server_parse_completion_in(const cJSON *body, bool chat, const kvr_sim_models_t *models,
                                       uint32_t max_model_len, kvr_sim_completion_t *p,
                                       kvr_sim_err_t *e);

/* Renders messages as the chat template does (r: generation prompt, continue_final_message) into
 * p->prompt (BOS first) and sets p->turn_prefix and p->gen_offset for a continued final message.
 * Returns 0 or 400 with the reason in err. */
int kvr_sim_server_chat_prompt(const cJSON *messages, kvr_sim_render_t *r, kvr_sim_completion_t *p,
                               char *err, size_t errlen);

/* How a worker answers one parsed completion: the seed of its generated words, its length and why
 * it ends. */
typedef struct kvr_sim_answer_s {
  /* kvr_sim_tokens_seed(prompt[0..turn_prefix), server seed ^ request seed) */
  uint64_t gen_seed;
  uint32_t gen_offset;          /* the first word generated is word gen_offset */
  uint32_t max_output;          /* tokens it generates */
  kvr_sim_finish_t stop_reason; /* STOP (the natural length came first) or LENGTH (max_tokens) */
} kvr_sim_answer_t;

/* The answer to p from a worker seeded server_seed whose natural answers (EOS on) average
 * output_len_mean tokens: max_tokens, or with EOS on (ignore_eos off, a mean set) the natural
 * length, U[mean/2, 3 mean/2] drawn from the text seed, less the gen_offset words a continued
 * answer already has (at least 1), at least min_tokens, within [1, max_tokens]. Pure: what the
 * server does per request and `kvrouter bench --virtual` too. */
void kvr_sim_server_answer(const kvr_sim_completion_t *p, uint64_t server_seed,
                           uint32_t output_len_mean, kvr_sim_answer_t *out);

/* Creates the server and its engine on loop (opts and its strings are copied). Returns NULL with a
 * reason in err when the engine configuration is invalid. */
kvr_sim_server_t *kvr_sim_server_new(uv_loop_t *loop, const kvr_sim_server_opts_t *opts, char *err,
                                     size_t errlen);

/* Starts listening (and applies the initial fault). Returns 0 or a negative KVR_E* code with a
 * reason in err. */
int kvr_sim_server_start(kvr_sim_server_t *srv, char *err, size_t errlen);

/* The bound port of the main listener (after start, kept while the refuse fault holds), or -1. */
int kvr_sim_server_port(const kvr_sim_server_t *srv);
int kvr_sim_server_admin_port(const kvr_sim_server_t *srv);

/* Aborts every request in flight, stops the engine and the listeners; done(data) is called from the
 * loop once every handle is closed and the server may be freed. */
void kvr_sim_server_close(kvr_sim_server_t *srv, void (*done)(void *data), void *data);

/* Frees a closed server. Accepts NULL. */
void kvr_sim_server_free(kvr_sim_server_t *srv);

#endif

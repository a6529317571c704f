/* sim_preset.h -- the workers the traffic runs on: (model, GPU) presets for the simulated engine.
 *
 * The engine's cost terms (kvr_sim_cost_t) were fitted to one pair, Llama-3.3-70B FP8 on one H200,
 * against the seeds' measurements (bench/sim/README.md, "Cost model"). Each fitted term is a
 * hardware rate reached at some fraction of the H200's peak: the weights' read at a fraction of
 * its HBM bandwidth, the dense layers' FLOPs at a fraction of its dense peak, the KV reads at a
 * fraction of HBM, prefill attention at a fraction of the dense peak. kvr_sim_preset_fractions()
 * computes those four fractions from kvr_sim_config_default()'s terms and the reference pair's
 * architecture; a preset for another pair DERIVES its terms by applying the same fractions to that
 * model's architecture (parameters, layers, hidden size, KV heads, head dim, dtypes: bytes of
 * weights, bytes of KV per token, FLOPs per token and per attention pair) on that GPU's
 * published HBM bandwidth, dense peak and memory. The KV cache a preset gets is what vLLM's
 * default gpu_memory_utilization (0.9) leaves after the weights; max_model_len is the model's
 * max_position_embeddings (vLLM's default), or less when the cache holds less. Derived presets are
 * derived, not measured against a real run.
 *
 * The reference preset (llama-3.3-70b-fp8-h200) IS today's defaults (kvr_sim_config_default(),
 * which the seeds were fitted with); its derivation is printed beside it for comparison. A pair
 * that does not fit on one GPU (the sim models one engine, tensor parallelism 1) is refused with a
 * one-line reason.
 *
 * Flags: KVR_SIM_PRESET_CLI_ROW(E) is the `--preset NAME` row of the option engine
 * (src/base/cli.h), in the engine's shared rows (bench/run/engine_options.h), so `kvrouter sim` and
 * `kvrouter bench
 * --virtual` take it alike. It is applied before every other flag (KVR_CLI_EARLY), so explicit
 * --num-gpu-blocks, --cost-* or --max-model-len win wherever they stand. An unknown name is a
 * one-line error listing the names (exit 2).
 */
#ifndef KVR_SIM_PRESET_H
#define KVR_SIM_PRESET_H

#include "base/cli.h"
#include "sim_engine.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A model's architecture, from its config.json, and the dtypes it is served in. */
typedef struct kvr_sim_model_s {
  const char *name; /* Hugging Face id */
  uint32_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
  bool tied;                        /* tie_word_embeddings */
  uint32_t max_position_embeddings; /* what vLLM takes as max_model_len by default */
  uint32_t weight_bytes;            /* per weight of the layers' linear maps: 1 FP8, 2 BF16 */
  uint32_t kv_bytes;                /* per K or V element in the cache: 1 FP8, 2 BF16 */
} kvr_sim_model_t;

/* A GPU's datasheet figures (dense, without sparsity). */
typedef struct kvr_sim_gpu_s {
  const char *name;
  double hbm_bytes_s; /* HBM bandwidth, bytes/s */
  double bf16_flops;  /* dense BF16 tensor FLOP/s */
  double fp8_flops;   /* dense FP8 tensor FLOP/s; 0: no FP8 tensor cores */
  double mem_bytes;   /* HBM capacity, bytes (the datasheet's GB, 10^9) */
} kvr_sim_gpu_t;

typedef struct kvr_sim_preset_s {
  const char *name;
  const kvr_sim_model_t *model;
  const kvr_sim_gpu_t *gpu;
  bool fitted; /* its terms are kvr_sim_config_default()'s (the fit); else derived */
} kvr_sim_preset_t;

/* The fractions of the reference GPU's peaks the fitted terms run at. */
typedef struct kvr_sim_fractions_s {
  double weights; /* of HBM bandwidth: the weights read once per step */
  double dense;   /* of the dense peak: the layers' FLOPs per token */
  double kv;      /* of HBM bandwidth: a decoding sequence's KV read */
  double attn;    /* of the dense peak: one query-key pair of prefill attention */
} kvr_sim_fractions_t;

/* What a preset's architecture implies on its GPU. */
typedef struct kvr_sim_derived_s {
  double params;         /* all parameters (norms left out: < 0.01%) */
  double layer_params;   /* the decoder layers' linear maps */
  double weights_stored; /* bytes in HBM: layers at weight_bytes, embeddings and LM head BF16 */
  double weights_read;   /* bytes read per step: the layers and the LM head (not the embeddings) */
  double dense_flops;    /* per token through the layers: 2 x layer_params (no LM head) */
  double kv_bytes;       /* per token: layers x kv_heads x head_dim x (K and V) x kv_bytes */
  double attn_flops;     /* per query-key pair: 2 x 2 x head_dim x heads x layers (QK and PV) */
  double dense_peak;     /* FLOP/s: FP8 when the weights are FP8, else BF16 */
  double attn_peak;      /* FLOP/s: FP8 when the KV cache is FP8, else BF16 */
  kvr_sim_cost_t cost;   /* the four hardware terms at the fractions, to 3 significant digits;
                          * step_ms and per_seq_ms the defaults (CPU and launch time) */
  double kv_mem;         /* 0.9 x mem_bytes - weights_stored (<= 0: does not fit) */
  uint32_t num_gpu_blocks; /* kv_mem / (kv_bytes x block_size), 0 when it does not fit */
  uint32_t max_model_len;  /* min(max_position_embeddings, num_gpu_blocks x block_size) */
} kvr_sim_derived_t;

/* LoRA adapter swaps (sim_engine.h, kvr_sim_cost_t.lora_*_per_rank). An adapter of rank r holds
 * A (r x in) and B (out x r) for the attention projections q, k, v and o of every layer, in BF16
 * (vLLM's lora_dtype "auto" is the model's dtype, vllm/config/lora.py; an FP8 checkpoint still
 * computes in BF16): r x layers x (4 hidden + 2 heads x head_dim + 2 kv_heads x head_dim) x 2
 * bytes, 8.19 MB per unit of rank for a Llama-70B (131 MB at rank 16). A GPU slot is filled over
 * PCIe Gen5 x16 (64 GB/s a direction, ~50 achieved by pinned copies), a CPU-cache miss is read
 * from an NVMe disk first (~2 GB/s, safetensors read whole): documented constants, the same for
 * every preset. */
#define KVR_SIM_LORA_PCIE_BYTES_S 50e9
#define KVR_SIM_LORA_DISK_BYTES_S 2e9
#define KVR_SIM_LORA_DTYPE_BYTES 2

/* Bytes per unit of rank of an adapter on model m, as above. */
double kvr_sim_preset_lora_bytes_per_rank(const kvr_sim_model_t *m);

/* vLLM's default gpu_memory_utilization (vllm/config/cache.py, CacheConfig). */
#define KVR_SIM_GPU_MEMORY_UTILIZATION 0.9

/* The presets, one list: id, name, model and GPU (tables in sim_preset.c), fitted (its terms are
 * kvr_sim_config_default()'s) or derived. The first is the default, the fitted pair. */
#define KVR_SIM_PRESET_MAP(X)                                                                      \
  X(LLAMA33_70B_FP8_H200, "llama-3.3-70b-fp8-h200", llama33_70b_fp8, h200, true)                   \
  X(LLAMA31_8B_H100, "llama-3.1-8b-h100", llama31_8b, h100, false)                                 \
  X(QWEN3_32B_H100, "qwen3-32b-h100", qwen3_32b, h100, false)                                      \
  X(LLAMA31_70B_A100_80GB, "llama-3.1-70b-a100-80gb", llama31_70b, a100_80gb, false)

#define KVR__SIM_PRESET_ID(id, str, model, gpu, fitted) KVR_SIM_PRESET_##id,
typedef enum { KVR_SIM_PRESET_MAP(KVR__SIM_PRESET_ID) KVR_SIM_PRESET_COUNT } kvr_sim_preset_id_t;
#undef KVR__SIM_PRESET_ID

/* The presets, in the list's order; kvr_sim_preset_default() is the first. */
size_t kvr_sim_preset_count(void);
const kvr_sim_preset_t *kvr_sim_preset_at(size_t i);
const kvr_sim_preset_t *kvr_sim_preset_default(void);
/* The preset named name, or NULL. */
const kvr_sim_preset_t *kvr_sim_preset_find(const char *name);
/* cfg's preset: cfg->preset, or the default when none was given. */
const kvr_sim_preset_t *kvr_sim_preset_of(const kvr_sim_config_t *cfg);

/* The fractions the default preset's fitted terms (kvr_sim_config_default()) run at. */
void kvr_sim_preset_fractions(kvr_sim_fractions_t *out);

/* Derives p's quantities and terms for blocks of block_size tokens (> 0). */
void kvr_sim_preset_derive(const kvr_sim_preset_t *p, uint32_t block_size, kvr_sim_derived_t *out);

/* 0 when p runs on one GPU; else KVR_EINVAL with one line in err saying why (e.g. "weights 141 GB
 * > 80 GB of HBM"). */
int kvr_sim_preset_check(const kvr_sim_preset_t *p, char *err, size_t errlen);

/* Sets cfg's preset, cost terms, num_gpu_blocks and max_model_len from the preset named name (the
 * fitted one: kvr_sim_config_default()'s; a derived one: kvr_sim_preset_derive() for cfg's
 * block_size). Other fields are untouched. Returns 0, or KVR_EINVAL with one line in err: an
 * unknown name (listing the names) or a pair that does not fit (why); cfg is then unchanged. */
int kvr_sim_preset_apply(kvr_sim_config_t *cfg, const char *name, char *err, size_t errlen);

/* The preset's lines of `--print-costs`: what it is, its architecture's quantities, its KV cache,
 * and the fractions and the derivation (for the fitted preset, the derivation for comparison). */
void kvr_sim_preset_print(FILE *out, const kvr_sim_config_t *cfg);

/* The option engine's callbacks of the row below (o->off points at kvr_sim_config_t.preset). */
int kvr_sim_preset_cli_parse(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                             char *err, size_t errlen);
void kvr_sim_preset_cli_show(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len);

/* `--preset NAME`; E(field) gives the KVR_CLI_FIELD of kvr_sim_config_t's field in the table's
 * base struct (as KVR_ENGINE_CLI_ROWS's E). */
#define KVR__SIM_PRESET_HELP_NAME(id, str, model, gpu, fitted) str ", "
#define KVR_SIM_PRESET_CLI_ROW(E)                                                                  \
  {                                                                                                \
    KVR_CLI_CUSTOM, "preset", E(preset),                                                           \
        .arg = "NAME", .flags = KVR_CLI_EARLY, .parse = kvr_sim_preset_cli_parse,                  \
        .show = kvr_sim_preset_cli_show,                                                           \
        .help = "the (model, GPU) pair the engine models, one of " KVR_SIM_PRESET_MAP(             \
            KVR__SIM_PRESET_HELP_NAME) "each described by --print-costs (bench/sim/README.md, "    \
                                       "Presets); sets the cost terms, --num-gpu-blocks and "      \
                                       "--max-model-len, which flags given too still override"     \
  }

#endif

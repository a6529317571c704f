/* sim_preset.c -- (model, GPU) presets: architecture and datasheet figures, the fit's fractions,
 * the terms each pair derives, `--preset` and its lines of --print-costs.
 *
 * Structs: static constants, one per model (config.json facts) and per GPU (datasheet facts), and
 * presets[] (a model on a GPU), built from KVR_SIM_PRESET_MAP; bench/sim/README.md ("Presets")
 * cites the source of every figure. Nothing is allocated.
 *
 * Flow: quantities() turns an architecture into bytes and FLOPs; kvr_sim_preset_fractions() divides
 * the reference pair's quantities by kvr_sim_config_default()'s terms (the fit) and its GPU's
 * peaks; kvr_sim_preset_derive() divides another pair's quantities by the same fractions of its own
 * GPU's peaks and sizes its KV cache from the memory the weights leave at gpu_memory_utilization
 * 0.9.
 *
 * Invariants: the derivation applied to the reference pair gives back the fitted terms (the
 * fractions are defined by them), so the fitted preset and its derivation can only differ in the KV
 * cache, where the fit used the seed's measured 53.15 GiB; a derived term is rounded to 3
 * significant digits, the precision of the fitted ones.
 */
#include "sim_preset.h"

#include "base/kvr.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* config.json of each model (bench/sim/README.md, "Presets", cites them). Norm weights are left
 * out; Qwen3's per-head q/k norms too. */
static const kvr_sim_model_t llama33_70b_fp8 = {
    .name = "meta-llama/Llama-3.3-70B-Instruct",
    .hidden = 8192,
    .intermediate = 28672,
    .layers = 80,
    .heads = 64,
    .kv_heads = 8,
    .head_dim = 128,
    .vocab = 128256,
    .tied = false,
    .max_position_embeddings = 131072,
    .weight_bytes = 1, /* FP8 linear layers; the checkpoint keeps lm_head in BF16 */
    .kv_bytes = 1,     /* FP8 KV cache */
};

static const kvr_sim_model_t llama31_8b = {
    .name = "meta-llama/Llama-3.1-8B-Instruct",
    .hidden = 4096,
    .intermediate = 14336,
    .layers = 32,
    .heads = 32,
    .kv_heads = 8,
    .head_dim = 128,
    .vocab = 128256,
    .tied = false,
    .max_position_embeddings = 131072,
    .weight_bytes = 2,
    .kv_bytes = 2,
};

static const kvr_sim_model_t qwen3_32b = {
    .name = "Qwen/Qwen3-32B",
    .hidden = 5120,
    .intermediate = 25600,
    .layers = 64,
    .heads = 64,
    .kv_heads = 8,
    .head_dim = 128,
    .vocab = 151936,
    .tied = false,
    .max_position_embeddings = 40960,
    .weight_bytes = 2,
    .kv_bytes = 2,
};

static const kvr_sim_model_t llama31_70b = {
    .name = "meta-llama/Llama-3.1-70B-Instruct",
    .hidden = 8192,
    .intermediate = 28672,
    .layers = 80,
    .heads = 64,
    .kv_heads = 8,
    .head_dim = 128,
    .vocab = 128256,
    .tied = false,
    .max_position_embeddings = 131072,
    .weight_bytes = 2,
    .kv_bytes = 2,
};

/* NVIDIA's datasheets, dense (the sparse figures halved). */
static const kvr_sim_gpu_t h200 = {"H200 SXM", 4.8e12, 989e12, 1979e12, 141e9};
static const kvr_sim_gpu_t h100 = {"H100 SXM", 3.35e12, 989e12, 1979e12, 80e9};
static const kvr_sim_gpu_t a100_80gb = {"A100 80GB SXM", 2.039e12, 312e12, 0, 80e9};

#define PRESET_ROW(id, str, model, gpu, fitted) [KVR_SIM_PRESET_##id] = {str, &model, &gpu, fitted},
static const kvr_sim_preset_t presets[KVR_SIM_PRESET_COUNT] = {KVR_SIM_PRESET_MAP(PRESET_ROW)};

size_t kvr_sim_preset_count(void) {
  return KVR_SIM_PRESET_COUNT;
}

const kvr_sim_preset_t *kvr_sim_preset_at(size_t i) {
  return i < KVR_SIM_PRESET_COUNT ? &presets[i] : NULL;
}

const kvr_sim_preset_t *kvr_sim_preset_default(void) {
  return &presets[0];
}

const kvr_sim_preset_t *kvr_sim_preset_find(const char *name) {
  for (size_t i = 0; i < KVR_SIM_PRESET_COUNT; i++)
    if (strcmp(presets[i].name, name) == 0)
      return &presets[i];
  return NULL;
}

const kvr_sim_preset_t *kvr_sim_preset_of(const kvr_sim_config_t *cfg) {
  return cfg->preset ? cfg->preset : kvr_sim_preset_default();
}

/* ---- derivation ---- */

/* The architecture's bytes and FLOPs (every field of d but the cost, the cache and the length). */
static void quantities(const kvr_sim_preset_t *p, kvr_sim_derived_t *d) {
  const kvr_sim_model_t *m = p->model;
  double h = m->hidden, qdim = (double)m->heads * m->head_dim,
         kvdim = (double)m->kv_heads * m->head_dim;
  double per_layer = h * qdim + 2 * h * kvdim + qdim * h + 3 * h * m->intermediate;
  double emb = (double)m->vocab * h;
  memset(d, 0, sizeof(*d));
  d->layer_params = per_layer * m->layers;
  d->params = d->layer_params + emb * (m->tied ? 1 : 2);
  d->weights_stored = d->layer_params * m->weight_bytes + emb * (m->tied ? 1 : 2) * 2;
  d->weights_read = d->layer_params * m->weight_bytes + emb * 2; /* the LM head, BF16 */
  d->dense_flops = 2 * d->layer_params;
  d->kv_bytes = (double)m->layers * kvdim * 2 * m->kv_bytes;
  d->attn_flops = 2.0 * 2.0 * m->head_dim * m->heads * m->layers;
  d->dense_peak = m->weight_bytes == 1 ? p->gpu->fp8_flops : p->gpu->bf16_flops;
  d->attn_peak = m->kv_bytes == 1 ? p->gpu->fp8_flops : p->gpu->bf16_flops;
}

void kvr_sim_preset_fractions(kvr_sim_fractions_t *out) {
  const kvr_sim_preset_t *ref = kvr_sim_preset_default();
  kvr_sim_config_t fit;
  kvr_sim_derived_t q;
  kvr_sim_config_default(&fit);
  quantities(ref, &q);
  out->weights = q.weights_read / (fit.cost.weights_ms * 1e-3) / ref->gpu->hbm_bytes_s;
  out->dense = q.dense_flops / (fit.cost.dense_tok_us * 1e-6) / q.dense_peak;
  out->kv = q.kv_bytes / (fit.cost.decode_ctx_ns * 1e-9) / ref->gpu->hbm_bytes_s;
  out->attn = q.attn_flops / (fit.cost.attn_pair_ns * 1e-9) / q.attn_peak;
}

/* amount / (fraction x rate) in units of scale (1e3: ms), to 3 significant digits; 0 without a
 * rate (a GPU without the dtype's tensor cores: kvr_sim_preset_check() refuses it). */
static double term(double amount, double fraction, double rate, double scale) {
  if (!(rate > 0))
    return 0;
  char buf[32];
  snprintf(buf, sizeof(buf), "%.3g", amount / (fraction * rate) * scale);
  return strtod(buf, NULL);
}

double kvr_sim_preset_lora_bytes_per_rank(const kvr_sim_model_t *m) {
  double q = (double)m->heads * m->head_dim, kv = (double)m->kv_heads * m->head_dim;
  return (double)m->layers * (4.0 * m->hidden + 2.0 * q + 2.0 * kv) * KVR_SIM_LORA_DTYPE_BYTES;
}

void kvr_sim_preset_derive(const kvr_sim_preset_t *p, uint32_t block_size, kvr_sim_derived_t *out) {
  kvr_sim_fractions_t f;
  kvr_sim_config_t fit;
  kvr_sim_preset_fractions(&f);
  kvr_sim_config_default(&fit);
  quantities(p, out);
  double hbm = p->gpu->hbm_bytes_s;
  out->cost = fit.cost; /* step_ms, per_seq_ms: CPU and launch time, not the GPU's */
  out->cost.weights_ms = term(out->weights_read, f.weights, hbm, 1e3);
  out->cost.dense_tok_us = term(out->dense_flops, f.dense, out->dense_peak, 1e6);
  out->cost.decode_ctx_ns = term(out->kv_bytes, f.kv, hbm, 1e9);
  out->cost.attn_pair_ns = term(out->attn_flops, f.attn, out->attn_peak, 1e9);
  double lora = kvr_sim_preset_lora_bytes_per_rank(p->model);
  out->cost.lora_load_ms_per_rank = term(lora, 1.0, KVR_SIM_LORA_PCIE_BYTES_S, 1e3);
  out->cost.lora_disk_ms_per_rank = term(lora, 1.0, KVR_SIM_LORA_DISK_BYTES_S, 1e3);
  out->kv_mem = KVR_SIM_GPU_MEMORY_UTILIZATION * p->gpu->mem_bytes - out->weights_stored;
  uint32_t bs = block_size ? block_size : 16;
  double blocks = out->kv_mem > 0 ? floor(out->kv_mem / (out->kv_bytes * bs)) : 0;
  out->num_gpu_blocks = (uint32_t)fmin(blocks, (double)(1u << 30));
  uint64_t tokens = (uint64_t)out->num_gpu_blocks * bs;
  out->max_model_len = (uint32_t)KVR_MIN((uint64_t)p->model->max_position_embeddings, tokens);
}

static const char *dtype(uint32_t bytes) {
  return bytes == 1 ? "FP8" : "BF16";
}

int kvr_sim_preset_check(const kvr_sim_preset_t *p, char *err, size_t errlen) {
  const kvr_sim_model_t *m = p->model;
  kvr_sim_derived_t d;
  kvr_sim_preset_derive(p, 16, &d);
  if (!(d.dense_peak > 0 && d.attn_peak > 0)) {
    snprintf(err, errlen, "%s: the %s has no FP8 tensor cores for %s's FP8 %s", p->name,
             p->gpu->name, m->name, m->weight_bytes == 1 ? "weights" : "KV cache");
    return KVR_EINVAL;
  }
  if (d.weights_stored > p->gpu->mem_bytes) {
    snprintf(err, errlen,
             "%s: weights %.0f GB > %.0f GB: %s in %s does not fit on one %s (tensor parallelism "
             "1, the one engine the sim models)",
             p->name, d.weights_stored / 1e9, p->gpu->mem_bytes / 1e9, m->name,
             dtype(m->weight_bytes), p->gpu->name);
    return KVR_EINVAL;
  }
  if (d.num_gpu_blocks == 0) {
    snprintf(err, errlen, "%s: weights %.0f GB leave no KV cache in %.2g x %.0f GB", p->name,
             d.weights_stored / 1e9, KVR_SIM_GPU_MEMORY_UTILIZATION, p->gpu->mem_bytes / 1e9);
    return KVR_EINVAL;
  }
  return 0;
}

int kvr_sim_preset_apply(kvr_sim_config_t *cfg, const char *name, char *err, size_t errlen) {
  const kvr_sim_preset_t *p = kvr_sim_preset_find(name);
  if (p == NULL) {
    size_t k = (size_t)snprintf(err, errlen, "'%s' is not one of", name);
    for (size_t i = 0; i < KVR_SIM_PRESET_COUNT && k < errlen; i++)
      k += (size_t)snprintf(err + k, errlen - k, "%s %s", i ? "," : "", presets[i].name);
    return KVR_EINVAL;
  }
  if (kvr_sim_preset_check(p, err, errlen) != 0)
    return KVR_EINVAL;
  if (p->fitted) {
    kvr_sim_config_t fit;
    kvr_sim_config_default(&fit);
    cfg->cost = fit.cost;
    cfg->num_gpu_blocks = fit.num_gpu_blocks;
    cfg->max_model_len = fit.max_model_len;
  } else {
    kvr_sim_derived_t d;
    kvr_sim_preset_derive(p, cfg->block_size, &d);
    cfg->cost = d.cost;
    cfg->num_gpu_blocks = d.num_gpu_blocks;
    cfg->max_model_len = d.max_model_len;
  }
  cfg->preset = p;
  return 0;
}

/* ---- --print-costs ---- */

/* n with thousands separators ("163,840"). */
static const char *grouped(double n, char *buf, size_t len) {
  char digits[32];
  snprintf(digits, sizeof(digits), "%.0f", n);
  size_t nd = strlen(digits), k = 0;
  for (size_t i = 0; i < nd && k + 2 < len; i++) {
    if (i > 0 && (nd - i) % 3 == 0)
      buf[k++] = ',';
    buf[k++] = digits[i];
  }
  buf[k] = '\0';
  return buf;
}

static void print_what(FILE *out, const kvr_sim_config_t *cfg, const kvr_sim_preset_t *p,
                       const kvr_sim_derived_t *d) {
  const kvr_sim_model_t *m = p->model;
  char kv[32];
  fprintf(out,
          "preset %s%s: %s, %s weights, %s KV cache, on one %s (%.3g TB/s HBM, %.0f TFLOP/s dense "
          "%s, %.0f GB); %s\n",
          p->name, cfg->preset ? "" : " (the default)", m->name, dtype(m->weight_bytes),
          dtype(m->kv_bytes), p->gpu->name, p->gpu->hbm_bytes_s / 1e12, d->dense_peak / 1e12,
          dtype(m->weight_bytes), p->gpu->mem_bytes / 1e9,
          p->fitted ? "terms fitted to the seeds' measurements"
                    : "terms derived with the fit's fractions, not measured against a real run");
  fprintf(out,
          "architecture: %.2f B parameters (%.2f B in the layers), %.2f GB of weights in HBM, "
          "%.2f GB read per step, %s B of KV per token, %.1f GFLOP per token in the layers, "
          "%.3f MFLOP per attention pair\n",
          d->params / 1e9, d->layer_params / 1e9, d->weights_stored / 1e9, d->weights_read / 1e9,
          grouped(d->kv_bytes, kv, sizeof(kv)), d->dense_flops / 1e9, d->attn_flops / 1e6);
}

/* What each of cfg's terms (flags may have changed them) implies on the preset's GPU: the bytes or
 * FLOPs the term moves, the rate that takes, and that rate as a fraction of the peak. */
static void print_hardware(FILE *out, const kvr_sim_config_t *cfg, const kvr_sim_preset_t *p,
                           const kvr_sim_derived_t *d) {
  const kvr_sim_cost_t *c = &cfg->cost;
  const char *dense = dtype(p->model->weight_bytes), *attn = dtype(p->model->kv_bytes);
  double hbm = p->gpu->hbm_bytes_s;
  char kv[32];
  if (c->weights_ms > 0) {
    double rate = d->weights_read / (c->weights_ms * 1e-3);
    fprintf(out, "weights_ms %g: %.1f GB read at %.2f TB/s = %.1f%% of HBM peak\n", c->weights_ms,
            d->weights_read / 1e9, rate / 1e12, 100 * rate / hbm);
  }
  if (c->dense_tok_us > 0) {
    double rate = d->dense_flops / (c->dense_tok_us * 1e-6);
    fprintf(out, "dense_tok_us %g: %.1f GFLOP at %.2f PFLOP/s = %.1f%% of %s dense peak\n",
            c->dense_tok_us, d->dense_flops / 1e9, rate / 1e15, 100 * rate / d->dense_peak, dense);
  }
  if (c->decode_ctx_ns > 0) {
    double rate = d->kv_bytes / (c->decode_ctx_ns * 1e-9);
    fprintf(out, "decode_ctx_ns %g: %s B at %.2f TB/s = %.1f%% of HBM peak\n", c->decode_ctx_ns,
            grouped(d->kv_bytes, kv, sizeof(kv)), rate / 1e12, 100 * rate / hbm);
  }
  if (c->attn_pair_ns > 0) {
    double rate = d->attn_flops / (c->attn_pair_ns * 1e-9);
    fprintf(out, "attn_pair_ns %g: %.3f MFLOP at %.2f PFLOP/s = %.1f%% of %s dense peak\n",
            c->attn_pair_ns, d->attn_flops / 1e6, rate / 1e15, 100 * rate / d->attn_peak, attn);
  }
}

void kvr_sim_preset_print(FILE *out, const kvr_sim_config_t *cfg) {
  const kvr_sim_preset_t *p = kvr_sim_preset_of(cfg);
  kvr_sim_derived_t d;
  kvr_sim_fractions_t f;
  kvr_sim_config_t fit;
  kvr_sim_preset_derive(p, cfg->block_size, &d);
  kvr_sim_preset_fractions(&f);
  kvr_sim_config_default(&fit);
  print_what(out, cfg, p, &d);
  fprintf(out,
          "fractions of the peaks the fit runs at (H200): weights %.1f%% of HBM, dense layers "
          "%.1f%% of the dense peak, KV reads %.1f%% of HBM, prefill attention %.1f%% of the dense "
          "peak\n",
          100 * f.weights, 100 * f.dense, 100 * f.kv, 100 * f.attn);
  fprintf(out,
          "%s: weights_ms=%g dense_tok_us=%g decode_ctx_ns=%g attn_pair_ns=%g; kv cache %.2g x "
          "%.0f GB - %.2f GB of weights = %.2f GB = %u blocks",
          p->fitted ? "derivation for comparison" : "derived", d.cost.weights_ms,
          d.cost.dense_tok_us, d.cost.decode_ctx_ns, d.cost.attn_pair_ns,
          KVR_SIM_GPU_MEMORY_UTILIZATION, p->gpu->mem_bytes / 1e9, d.weights_stored / 1e9,
          d.kv_mem / 1e9, d.num_gpu_blocks);
  if (p->fitted)
    fprintf(out, " (the fit: %u, the seed's vLLM's 53.15 GiB)", fit.num_gpu_blocks);
  if (d.max_model_len < p->model->max_position_embeddings)
    fprintf(out,
            "; max_model_len %u: config.json's %u needs more KV than the cache holds (vLLM "
            "refuses to start with it and estimates %u)\n",
            d.max_model_len, p->model->max_position_embeddings, d.max_model_len);
  else
    fprintf(out, "; max_model_len %u (config.json max_position_embeddings)\n", d.max_model_len);
  print_hardware(out, cfg, p, &d);
}

/* ---- --preset ---- */

int kvr_sim_preset_cli_parse(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                             char *err, size_t errlen) {
  (void)nth;
  kvr_sim_config_t *cfg =
      (kvr_sim_config_t *)((char *)base + o->off - offsetof(kvr_sim_config_t, preset));
  return kvr_sim_preset_apply(cfg, text, err, errlen);
}

void kvr_sim_preset_cli_show(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  const kvr_sim_preset_t *const *p = (const void *)((const char *)base + o->off);
  snprintf(buf, len, "%s", (*p ? *p : kvr_sim_preset_default())->name);
}

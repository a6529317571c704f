/* test_sim_preset.c -- the (model, GPU) presets of bench/sim/sim_preset.h: the fit's fractions
 * from the default terms, each preset's derived quantities and terms against values computed by
 * hand from config.json and the datasheets, the fitted preset equal to today's defaults, the pair
 * that does not fit refused with its reason, and `--preset` in the engine's shared option rows
 * (bench/run/engine_options.h): applied before the other flags, an unknown name one line listing
 * the names, exit status 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/run/engine_options.h"
#include "bench/sim/sim_calibrate.h"
#include "bench/sim/sim_preset.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

/* The reference pair, Llama-3.3-70B (hidden 8192, intermediate 28672, 80 layers, 64 heads, 8 KV
 * heads of 128, vocabulary 128256): per layer 8192 x 8192 (q) + 2 x 8192 x 1024 (k, v) + 8192 x
 * 8192 (o) + 3 x 8192 x 28672 (gate, up, down) = 855,638,016 parameters; 80 layers 68,451,041,280;
 * embeddings and LM head 128256 x 8192 = 1,050,673,152 each. */
#define L70 68451041280.0
#define E70 1050673152.0

static void test_fractions_come_from_the_default_terms(void **state) {
  (void)state;
  kvr_sim_fractions_t f;
  kvr_sim_preset_fractions(&f);
  /* weights: FP8 layers + BF16 LM head = 68,451,041,280 + 2 x 1,050,673,152 = 70,552,387,584 B in
   * 20 ms = 3.5276 TB/s of the H200's 4.8 */
  assert_near(f.weights, (L70 + 2 * E70) / 20e-3 / 4.8e12, 1e-12);
  assert_near(f.weights, 0.734920704, 1e-9);
  /* dense: 2 x 68,451,041,280 FLOP in 110 us of the 1,979 TFLOP/s FP8 peak */
  assert_near(f.dense, 0.628885491, 1e-9);
  /* KV: 80 x 8 x 128 x 2 x 1 = 163,840 B in 55 ns of 4.8 TB/s */
  assert_near(f.kv, 163840 / 55e-9 / 4.8e12, 1e-12);
  assert_near(f.kv, 0.620606061, 1e-9);
  /* attention: 2 x 2 x 128 x 64 x 80 = 2,621,440 FLOP in 2.5 ns of 1,979 TFLOP/s */
  assert_near(f.attn, 0.529851440, 1e-9);
}

static void test_names_and_lookup(void **state) {
  (void)state;
  const char *want[] = {"llama-3.3-70b-fp8-h200", "llama-3.1-8b-h100", "qwen3-32b-h100",
                        "llama-3.1-70b-a100-80gb"};
  assert_int_equal(kvr_sim_preset_count(), 4);
  for (size_t i = 0; i < 4; i++) {
    assert_string_equal(kvr_sim_preset_at(i)->name, want[i]);
    assert_ptr_equal(kvr_sim_preset_find(want[i]), kvr_sim_preset_at(i));
  }
  assert_null(kvr_sim_preset_at(4));
  assert_null(kvr_sim_preset_find("llama-3.1-8b"));
  assert_ptr_equal(kvr_sim_preset_default(), kvr_sim_preset_at(0));
  assert_true(kvr_sim_preset_default()->fitted);
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  assert_null(cfg.preset);
  assert_ptr_equal(kvr_sim_preset_of(&cfg), kvr_sim_preset_default());
}

/* The fitted preset IS today's defaults; its derivation reproduces the four terms (they define
 * the fractions) and differs only in the cache, sized from the datasheet instead of the seed's
 * measured 53.15 GiB. */
static void test_h200_preset_is_the_defaults(void **state) {
  (void)state;
  kvr_sim_config_t def, cfg;
  char err[256];
  kvr_sim_config_default(&def);
  kvr_sim_config_default(&cfg);
  assert_int_equal(kvr_sim_preset_apply(&cfg, "llama-3.3-70b-fp8-h200", err, sizeof(err)), 0);
  assert_ptr_equal(cfg.preset, kvr_sim_preset_default());
  cfg.preset = NULL;
  assert_memory_equal(&cfg, &def, sizeof(cfg));
  assert_true(def.cost.weights_ms == 20 && def.cost.dense_tok_us == 110 &&
              def.cost.decode_ctx_ns == 55 && def.cost.attn_pair_ns == 2.5);
  assert_int_equal(def.num_gpu_blocks, 21770);
  assert_int_equal(def.max_model_len, 131072);

  kvr_sim_derived_t d;
  kvr_sim_preset_derive(kvr_sim_preset_default(), 16, &d);
  assert_near(d.layer_params, L70, 0.5);
  assert_near(d.params, L70 + 2 * E70, 0.5); /* 70.55 B */
  assert_near(d.weights_read, L70 + 2 * E70, 0.5);
  assert_near(d.weights_stored, L70 + 4 * E70, 0.5); /* 72.65 GB: BF16 embeddings and LM head */
  assert_near(d.dense_flops, 2 * L70, 1);
  assert_near(d.kv_bytes, 163840, 0);
  assert_near(d.attn_flops, 2621440, 0);
  assert_true(d.dense_peak == 1979e12 && d.attn_peak == 1979e12);
  assert_true(d.cost.weights_ms == 20 && d.cost.dense_tok_us == 110 && d.cost.decode_ctx_ns == 55 &&
              d.cost.attn_pair_ns == 2.5);
  /* LoRA: 80 x (4 x 8192 + 2 x 8192 + 2 x 1024) x 2 B = 8,192,000 B per unit of rank, over
   * 50 GB/s and 2 GB/s: the defaults' swap terms */
  assert_near(kvr_sim_preset_lora_bytes_per_rank(kvr_sim_preset_default()->model), 8192000, 0);
  assert_true(d.cost.lora_load_ms_per_rank == def.cost.lora_load_ms_per_rank &&
              d.cost.lora_disk_ms_per_rank == def.cost.lora_disk_ms_per_rank);
  assert_true(def.cost.lora_load_ms_per_rank == 0.164 && def.cost.lora_disk_ms_per_rank == 4.1);
  assert_true(d.cost.step_ms == def.cost.step_ms && d.cost.per_seq_ms == def.cost.per_seq_ms);
  /* 0.9 x 141e9 - 72,653,733,888 = 54,246,266,112 B / (163,840 x 16) = 20,693.6 */
  assert_near(d.kv_mem, 54246266112.0, 1);
  assert_int_equal(d.num_gpu_blocks, 20693);
  assert_int_equal(d.max_model_len, 131072);
}

/* Llama-3.1-8B (hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads of 128, vocabulary
 * 128256) in BF16 on one H100 SXM (3.35 TB/s, 989 TFLOP/s dense BF16, 80 GB). Per layer 4096 x
 * 4096 x 2 + 2 x 4096 x 1024 + 3 x 4096 x 14336 = 218,103,808; 32 layers 6,979,321,856; embeddings
 * and LM head 525,336,576 each. */
static void test_llama_8b_h100(void **state) {
  (void)state;
  kvr_sim_derived_t d;
  kvr_sim_preset_derive(kvr_sim_preset_find("llama-3.1-8b-h100"), 16, &d);
  assert_near(d.layer_params, 6979321856.0, 0.5);
  assert_near(d.params, 8029995008.0, 0.5);
  assert_near(d.weights_stored, 16059990016.0, 0.5); /* 8.03 B x 2 */
  assert_near(d.weights_read, 15009316864.0, 0.5);   /* layers + LM head, x 2 */
  assert_near(d.dense_flops, 13958643712.0, 1);
  assert_near(d.kv_bytes, 131072, 0);   /* 32 x 8 x 128 x 2 x 2 */
  assert_near(d.attn_flops, 524288, 0); /* 4 x 128 x 32 x 32 */
  assert_true(d.dense_peak == 989e12 && d.attn_peak == 989e12);
  /* LoRA: 32 x (4 x 4096 + 2 x 4096 + 2 x 1024) x 2 = 1,703,936 B per unit of rank: 0.0341 ms
   * over 50 GB/s, 0.852 ms over 2 GB/s */
  assert_true(d.cost.lora_load_ms_per_rank == 0.0341 && d.cost.lora_disk_ms_per_rank == 0.852);
  /* 15.009 GB / (0.73492 x 3.35 TB/s) = 6.096 ms; 13.959 GFLOP / (0.62889 x 989 TFLOP/s) =
   * 22.44 us; 131,072 B / (0.62061 x 3.35 TB/s) = 63.04 ns; 524,288 / (0.52985 x 989e12) = 1.0005
   * ns */
  assert_true(d.cost.weights_ms == 6.1);
  assert_true(d.cost.dense_tok_us == 22.4);
  assert_true(d.cost.decode_ctx_ns == 63);
  assert_true(d.cost.attn_pair_ns == 1);
  assert_true(d.cost.step_ms == 1 && d.cost.per_seq_ms == 0.03);
  /* 72e9 - 16,059,990,016 = 55,940,009,984 B / 2,097,152 B per block = 26,674.6 */
  assert_near(d.kv_mem, 55940009984.0, 1);
  assert_int_equal(d.num_gpu_blocks, 26674);
  assert_int_equal(d.max_model_len, 131072);
}

/* Qwen3-32B (hidden 5120, intermediate 25600, 64 layers, 64 heads and 8 KV heads of 128: q is
 * 5120 -> 8192, vocabulary 151936) in BF16 on one H100 SXM. Per layer 5120 x 8192 x 2 + 2 x 5120 x
 * 1024 + 3 x 5120 x 25600 = 487,587,840; 64 layers 31,205,621,760; embeddings 777,912,320. */
static void test_qwen3_32b_h100(void **state) {
  (void)state;
  kvr_sim_derived_t d;
  kvr_sim_preset_derive(kvr_sim_preset_find("qwen3-32b-h100"), 16, &d);
  assert_near(d.layer_params, 31205621760.0, 0.5);
  assert_near(d.params, 32761446400.0, 0.5); /* "32.8B" */
  assert_near(d.weights_stored, 65522892800.0, 0.5);
  assert_near(d.weights_read, 63967068160.0, 0.5);
  assert_near(d.dense_flops, 62411243520.0, 1);
  assert_near(d.kv_bytes, 262144, 0);    /* 64 x 8 x 128 x 2 x 2 */
  assert_near(d.attn_flops, 2097152, 0); /* 4 x 128 x 64 x 64 */
  /* 63.967 GB / 2.462 TB/s = 25.98 ms; 62.41 GFLOP / 622.0 TFLOP/s = 100.3 us; 262,144 B /
   * 2.079 TB/s = 126.1 ns; 2,097,152 / 524.0 TFLOP/s = 4.002 ns */
  assert_true(d.cost.weights_ms == 26);
  assert_true(d.cost.dense_tok_us == 100);
  assert_true(d.cost.decode_ctx_ns == 126);
  assert_true(d.cost.attn_pair_ns == 4);
  /* 72e9 - 65,522,892,800 = 6,477,107,200 B / 4,194,304 B per block = 1,544.3 blocks = 24,704
   * tokens: less than config.json's 40,960, which vLLM would refuse to start with */
  assert_near(d.kv_mem, 6477107200.0, 1);
  assert_int_equal(d.num_gpu_blocks, 1544);
  assert_int_equal(d.max_model_len, 24704);
  /* the cache follows the block size (32 tokens: 772 blocks of 32) */
  kvr_sim_preset_derive(kvr_sim_preset_find("qwen3-32b-h100"), 32, &d);
  assert_int_equal(d.num_gpu_blocks, 772);
  assert_int_equal(d.max_model_len, 24704);
}

static void test_apply_derived(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  char err[256];
  kvr_sim_config_default(&cfg);
  cfg.max_num_seqs = 7; /* not the preset's */
  assert_int_equal(kvr_sim_preset_apply(&cfg, "qwen3-32b-h100", err, sizeof(err)), 0);
  assert_string_equal(cfg.preset->name, "qwen3-32b-h100");
  assert_string_equal(cfg.preset->model->name, "Qwen/Qwen3-32B");
  assert_true(cfg.cost.weights_ms == 26 && cfg.cost.dense_tok_us == 100 &&
              cfg.cost.decode_ctx_ns == 126 && cfg.cost.attn_pair_ns == 4);
  assert_int_equal(cfg.num_gpu_blocks, 1544);
  assert_int_equal(cfg.max_model_len, 24704);
  assert_int_equal(cfg.max_num_seqs, 7);
  assert_int_equal(cfg.block_size, 16);
  assert_int_equal(kvr_sim_config_check(&cfg, err, sizeof(err)), 0);
  /* another preset replaces it whole, the fitted one too */
  assert_int_equal(kvr_sim_preset_apply(&cfg, "llama-3.1-8b-h100", err, sizeof(err)), 0);
  assert_int_equal(cfg.num_gpu_blocks, 26674);
  assert_int_equal(cfg.max_model_len, 131072);
  assert_int_equal(kvr_sim_preset_apply(&cfg, "llama-3.3-70b-fp8-h200", err, sizeof(err)), 0);
  assert_true(cfg.cost.weights_ms == 20 && cfg.cost.dense_tok_us == 110);
  assert_int_equal(cfg.num_gpu_blocks, 21770);
}

/* Llama-3.1-70B in BF16 is 70.55 B x 2 = 141.1 GB: more than the A100's 80 GB at TP 1. */
static void test_a100_refused(void **state) {
  (void)state;
  kvr_sim_config_t cfg, def;
  char err[256];
  const kvr_sim_preset_t *p = kvr_sim_preset_find("llama-3.1-70b-a100-80gb");
  assert_non_null(p);
  kvr_sim_derived_t d;
  kvr_sim_preset_derive(p, 16, &d);
  assert_near(d.weights_stored, 2 * (L70 + 2 * E70), 1);
  assert_int_equal(d.num_gpu_blocks, 0);
  assert_int_equal(kvr_sim_preset_check(p, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "llama-3.1-70b-a100-80gb: weights 141 GB > 80 GB"));
  assert_non_null(strstr(err, "does not fit on one A100 80GB SXM (tensor parallelism 1"));
  assert_null(strchr(err, '\n'));
  kvr_sim_config_default(&cfg);
  kvr_sim_config_default(&def);
  assert_int_equal(kvr_sim_preset_apply(&cfg, p->name, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "weights 141 GB > 80 GB"));
  assert_memory_equal(&cfg, &def, sizeof(cfg)); /* unchanged */
  for (size_t i = 0; i < kvr_sim_preset_count(); i++)
    assert_int_equal(kvr_sim_preset_check(kvr_sim_preset_at(i), err, sizeof(err)),
                     i == 3 ? KVR_EINVAL : 0);
}

/* ---- the flag, through the engine's shared rows ---- */

#define E(field) KVR_CLI_FIELD(kvr_sim_config_t, field)
static const kvr_cli_opt_t rows[] = {KVR_ENGINE_CLI_ROWS(E)};
static const kvr_cli_cmd_t cmd = {
    .name = "sim", .usage = "", .opts = rows, .nopts = KVR_ARRAY_SIZE(rows)};

static int parse(kvr_sim_config_t *cfg, char *err, size_t errlen, int argc, char **argv) {
  kvr_sim_config_default(cfg);
  return kvr_cli_parse(&cmd, cfg, argc, argv, NULL, stdout, err, errlen);
}

static void test_flag_before_the_others(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  char err[512];
  /* the preset is applied first: an explicit flag wins wherever it stands */
  char *a[] = {"sim",      "--num-gpu-blocks",  "100",
               "--preset", "llama-3.1-8b-h100", "--cost-dense-tok-us=30"};
  assert_int_equal(parse(&cfg, err, sizeof(err), 6, a), 0);
  assert_string_equal(cfg.preset->name, "llama-3.1-8b-h100");
  assert_int_equal(cfg.num_gpu_blocks, 100);
  assert_true(cfg.cost.dense_tok_us == 30);
  assert_true(cfg.cost.weights_ms == 6.1 && cfg.cost.decode_ctx_ns == 63);
  assert_int_equal(cfg.max_model_len, 131072);
  /* the last --preset wins */
  char *b[] = {"sim", "--preset=qwen3-32b-h100", "--preset", "llama-3.3-70b-fp8-h200"};
  assert_int_equal(parse(&cfg, err, sizeof(err), 4, b), 0);
  assert_int_equal(cfg.num_gpu_blocks, 21770);
  /* --help shows the default's name */
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kvr_sim_config_default(&cfg);
  kvr_cli_help(&cmd, &cfg, f);
  fclose(f);
  assert_non_null(strstr(text, "--preset NAME"));
  assert_non_null(strstr(text, "(default llama-3.3-70b-fp8-h200)"));
  assert_non_null(strstr(text, "one of llama-3.3-70b-fp8-h200, llama-3.1-8b-h100,"));
  free(text);
}

static void test_flag_errors(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  char err[512];
  char *a[] = {"sim", "--preset", "llama-3.1-8b"};
  assert_int_equal(parse(&cfg, err, sizeof(err), 3, a), KVR_EINVAL);
  assert_string_equal(err, "--preset: 'llama-3.1-8b' is not one of llama-3.3-70b-fp8-h200, "
                           "llama-3.1-8b-h100, qwen3-32b-h100, llama-3.1-70b-a100-80gb");
  char *b[] = {"sim", "--preset", "llama-3.1-70b-a100-80gb"};
  assert_int_equal(parse(&cfg, err, sizeof(err), 3, b), KVR_EINVAL);
  assert_true(strncmp(err, "--preset: llama-3.1-70b-a100-80gb: weights 141 GB > 80 GB", 57) == 0);
  assert_null(strchr(err, '\n'));
  /* as a subcommand runs it: one line on stderr, exit status 2 */
  kvr_sim_config_default(&cfg);
  assert_int_equal(kvr_cli_main(&cmd, &cfg, 3, a, NULL), 2);
  assert_int_equal(kvr_cli_main(&cmd, &cfg, 3, b, NULL), 2);
}

/* ---- --print-costs ---- */

static char *capture_costs(const kvr_sim_config_t *cfg) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kvr_sim_calibrate_print_costs(f, cfg);
  fclose(f);
  return text;
}

static void test_print_costs_of_a_preset(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  char err[256];
  kvr_sim_config_default(&cfg);
  assert_int_equal(kvr_sim_preset_apply(&cfg, "llama-3.1-8b-h100", err, sizeof(err)), 0);
  char *text = capture_costs(&cfg);
  assert_true(strncmp(text,
                      "cost model: weights_ms=6.1 dense_tok_us=22.4 step_ms=1 per_seq_ms=0.03 "
                      "decode_ctx_ns=63 attn_pair_ns=1\n",
                      93) == 0);
  assert_non_null(strstr(text, "kv cache: 26674 blocks x 16 tokens = 426784 tokens\n"));
  assert_non_null(strstr(text, "preset llama-3.1-8b-h100: meta-llama/Llama-3.1-8B-Instruct, BF16 "
                               "weights, BF16 KV cache, on one H100 SXM (3.35 TB/s HBM, 989 "
                               "TFLOP/s dense BF16, 80 GB); terms derived"));
  assert_non_null(strstr(text, "not measured against a real run\n"));
  assert_non_null(strstr(text, "architecture: 8.03 B parameters (6.98 B in the layers), 16.06 GB "
                               "of weights in HBM, 15.01 GB read per step, 131,072 B of KV per "
                               "token, 14.0 GFLOP per token in the layers, 0.524 MFLOP per "
                               "attention pair\n"));
  assert_non_null(strstr(text, "derived: weights_ms=6.1 dense_tok_us=22.4 decode_ctx_ns=63 "
                               "attn_pair_ns=1; kv cache 0.9 x 80 GB - 16.06 GB of weights = "
                               "55.94 GB = 26674 blocks; max_model_len 131072 (config.json "
                               "max_position_embeddings)\n"));
  /* 15.009 GB in 6.1 ms = 2.46 TB/s = 73.4% of 3.35 */
  assert_non_null(strstr(text, "weights_ms 6.1: 15.0 GB read at 2.46 TB/s = 73.4% of HBM peak\n"));
  assert_non_null(strstr(text, "decode_ctx_ns 63: 131,072 B at 2.08 TB/s = 62.1% of HBM peak\n"));
  assert_non_null(strstr(text, "of BF16 dense peak\n"));
  free(text);
  /* Qwen3-32B: the cache holds less than config.json's length */
  assert_int_equal(kvr_sim_preset_apply(&cfg, "qwen3-32b-h100", err, sizeof(err)), 0);
  text = capture_costs(&cfg);
  assert_non_null(strstr(text,
                         "; max_model_len 24704: config.json's 40960 needs more KV than the "
                         "cache holds (vLLM refuses to start with it and estimates 24704)\n"));
  free(text);
  /* the fitted preset prints its derivation for comparison */
  assert_int_equal(kvr_sim_preset_apply(&cfg, "llama-3.3-70b-fp8-h200", err, sizeof(err)), 0);
  text = capture_costs(&cfg);
  assert_non_null(strstr(text, "derivation for comparison: weights_ms=20 dense_tok_us=110 "
                               "decode_ctx_ns=55 attn_pair_ns=2.5; kv cache 0.9 x 141 GB - 72.65 "
                               "GB of weights = 54.25 GB = 20693 blocks (the fit: 21770, the "
                               "seed's vLLM's 53.15 GiB)"));
  free(text);
}

KVR_TEST_MAIN(cmocka_unit_test(test_fractions_come_from_the_default_terms),
              cmocka_unit_test(test_names_and_lookup),
              cmocka_unit_test(test_h200_preset_is_the_defaults),
              cmocka_unit_test(test_llama_8b_h100), cmocka_unit_test(test_qwen3_32b_h100),
              cmocka_unit_test(test_apply_derived), cmocka_unit_test(test_a100_refused),
              cmocka_unit_test(test_flag_before_the_others), cmocka_unit_test(test_flag_errors),
              cmocka_unit_test(test_print_costs_of_a_preset))

/* test_sim_calibrate.c -- the offline tools of `kvrouter sim`: the cost figures, and calibration
 * rows that are a pure function of (engine config, options, rate), with a golden row taken from
 * the command (percentiles by src/base/quantile.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "bench/sim/sim_calibrate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The printed figures as a string (freed by the caller). */
static char *capture_costs(const kvr_sim_config_t *cfg) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kvr_sim_calibrate_print_costs(f, cfg);
  fclose(f);
  return text;
}

static char *capture_rate(const kvr_sim_config_t *cfg, const kvr_sim_calibrate_opts_t *o,
                          double rate) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kvr_sim_calibrate_rate(f, cfg, o, rate);
  fclose(f);
  return text;
}

static size_t count_lines(const char *s) {
  size_t n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

static void test_print_costs(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  char *text = capture_costs(&cfg);
  assert_int_equal(count_lines(text), 25);
  /* the LoRA swap line (sim_preset.h): 8.19 MB per unit of rank over 50 and 2 GB/s */
  assert_non_null(strstr(text, "lora swap: lora_load_ms_per_rank=0.164 lora_disk_ms_per_rank=4.1 "
                               "(an adapter is 8.19 MB per unit of rank"));
  assert_non_null(strstr(text, "rank 16 (131 MB): 2.62 ms into a GPU slot from the CPU cache, "
                               "65.6 ms more when read from disk first\n"));
  assert_non_null(strstr(text, "cost model: weights_ms=20 dense_tok_us=110 step_ms=1 "
                               "per_seq_ms=0.03 decode_ctx_ns=55 attn_pair_ns=2.5\n"));
  assert_non_null(strstr(text, "frontend: req_ms=2 prompt_tok_us=1.1 stream_tok_us=40 "
                               "async_scheduling=on; retok_drift=0.001\n"));
  assert_non_null(strstr(text, "kv cache: 21770 blocks x 16 tokens = 348320 tokens\n"));
  /* the preset (sim_preset.h: the default, fitted) and every term's hardware reading: 70.55 GB of
   * weights read (FP8 layers, BF16 LM head), 136.9 GFLOP and 163,840 B per token, 2.62 MFLOP per
   * attention pair */
  assert_non_null(strstr(text, "preset llama-3.3-70b-fp8-h200 (the default): "
                               "meta-llama/Llama-3.3-70B-Instruct, FP8 weights, FP8 KV cache, on "
                               "one H200 SXM (4.8 TB/s HBM, 1979 TFLOP/s dense FP8, 141 GB)"));
  assert_non_null(strstr(text, "weights_ms 20: 70.6 GB read at 3.53 TB/s = 73.5% of HBM peak\n"));
  assert_non_null(
      strstr(text, "dense_tok_us 110: 136.9 GFLOP at 1.24 PFLOP/s = 62.9% of FP8 dense peak\n"));
  assert_non_null(strstr(text, "decode_ctx_ns 55: 163,840 B at 2.98 TB/s = 62.1% of HBM peak\n"));
  assert_non_null(
      strstr(text, "attn_pair_ns 2.5: 2.621 MFLOP at 1.05 PFLOP/s = 53.0% of FP8 dense peak\n"));
  /* 1 x 6000 ctx: 20 + 1 + 0.03 + 0.33 ms */
  assert_non_null(strstr(text, "decode step,   1 seqs x 6000 ctx:   21.4 ms"));
  assert_non_null(strstr(text, "turn-5 prefill, 7000 tokens with its 3750-token starter cached:"));
  assert_non_null(strstr(text, "cold prefill 3500 tokens (alone):"));
  assert_non_null(strstr(text, "cached follow-up, 20 new tokens after 4080 cached:"));
  free(text);
  /* The figures follow the configuration. */
  cfg.cost.weights_ms = 10;
  text = capture_costs(&cfg);
  assert_non_null(strstr(text, "weights_ms=10 "));
  free(text);
}

static void test_rate_is_deterministic(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  kvr_sim_calibrate_opts_t o;
  kvr_sim_calibrate_opts_default(&o);
  o.requests = 60;
  char *a = capture_rate(&cfg, &o, 1.0);
  char *b = capture_rate(&cfg, &o, 1.0);
  assert_string_equal(a, b);
  /* `kvrouter sim --calibrate --cal-requests 60 --cal-rates 1` with the 2026-11-24 cost model
   * (roofline, API server, async scheduling, drift; KV reads 55 ns, dense 110 us per token). */
  assert_string_equal(a, " 1.00    60   4516   500  73.1%  10.7   23     182    1714    26.5"
                         "    33.2    24.7    99.2    395     0\n");
  free(b);
  o.seed = 3;
  b = capture_rate(&cfg, &o, 1.0);
  assert_string_not_equal(a, b);
  free(a);
  free(b);
  /* Generated answers resent: the rows have the same shape, prefixes are still cached. */
  o.answer_mean = 0;
  o.requests = 40;
  a = capture_rate(&cfg, &o, 2.0);
  unsigned reqs;
  double rate, cached;
  assert_int_equal(sscanf(a, "%lf %u %*f %*f %lf%%", &rate, &reqs, &cached), 3);
  assert_true(rate == 2.0 && reqs == 40 && cached > 10);
  free(a);
}

static void test_run_prints_header_and_rows(void **state) {
  (void)state;
  kvr_sim_config_t cfg;
  kvr_sim_config_default(&cfg);
  kvr_sim_calibrate_opts_t o;
  kvr_sim_calibrate_opts_default(&o);
  assert_int_equal(o.nrates, 6);
  assert_true(o.rates[0] == 0.5 && o.rates[5] == 3);
  assert_int_equal(o.requests, 300);
  o.requests = 20;
  o.nrates = 2;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  kvr_sim_calibrate_run(f, &cfg, &o);
  fclose(f);
  assert_int_equal(count_lines(text), 4);
  assert_true(strncmp(text, "multi-turn workload in virtual time: 20 Poisson requests", 56) == 0);
  assert_non_null(strstr(text, "output U[250,750] tokens; history answers: dataset, mean 900\n"));
  assert_non_null(strstr(text, "\n rate  reqs  in_avg"));
  assert_non_null(strstr(text, "\n 0.50    20 "));
  assert_non_null(strstr(text, "\n 1.00    20 "));
  free(text);
}

KVR_TEST_MAIN(cmocka_unit_test(test_print_costs), cmocka_unit_test(test_rate_is_deterministic),
              cmocka_unit_test(test_run_prints_header_and_rows))

/* engine_options.h -- the flags of the simulated vLLM engine, one list for every subcommand that
 * runs one: `kvrouter sim` (router/sim.c, over kvr_sim_server_opts_t.engine) and `kvrouter bench
 * --virtual` (bench_options.c, over kvr_vcluster_opts_t.engine), so a virtual cluster takes exactly
 * the flags a real sim does.
 *
 * KVR_ENGINE_CLI_ROWS(E) expands to option-engine rows (src/base/cli.h); E(field) must give the
 * KVR_CLI_FIELD of kvr_sim_config_t's field inside the table's base struct.
 */
#ifndef KVR_ENGINE_OPTIONS_H
#define KVR_ENGINE_OPTIONS_H

#include "base/cli.h"
#include "bench/sim/sim_preset.h"

#define KVR_ENGINE_CLI_ROWS(E)                                                                      \
  KVR_SIM_PRESET_CLI_ROW(E),                                                                        \
      {KVR_CLI_UINT,                                                                                \
       "num-gpu-blocks",                                                                            \
       E(num_gpu_blocks),                                                                           \
       .arg = "N",                                                                                  \
       KVR_CLI_RANGE(1, 1 << 30),                                                                   \
       .help = "KV cache blocks: 53.15 GiB / 163,840 B per token / 16 tokens per block"},           \
      {KVR_CLI_UINT, "block-size",           E(block_size),                                         \
       .arg = "N",   KVR_CLI_RANGE(1, 4096), .help = "tokens per KV block"},                        \
      {KVR_CLI_UINT, "max-num-seqs",          E(max_num_seqs),                                      \
       .arg = "N",   KVR_CLI_RANGE(1, 65536), .help = "max running requests"},                      \
      {KVR_CLI_UINT, "max-num-batched-tokens", E(max_num_batched_tokens),                           \
       .arg = "N",   KVR_CLI_MIN(1),           .help = "token budget per engine step"},             \
      {KVR_CLI_UINT, "max-model-len",           E(max_model_len),                                   \
       .arg = "N",   KVR_CLI_RANGE(2, 1 << 24), .help = "prompt + output limit"},                   \
      {KVR_CLI_SWITCH, "no-enable-prefix-caching", E(enable_prefix_caching), .set = 0,              \
       .help = "disable prefix caching"},                                                           \
      {KVR_CLI_DOUBLE,                                                                              \
       "cost-weights-ms",                                                                           \
       E(cost.weights_ms),                                                                          \
       .arg = "N",                                                                                  \
       KVR_CLI_MIN(0),                                                                              \
       .help = "step cost: the dense layers' memory floor, ms per step (weights read once)"},       \
      {KVR_CLI_DOUBLE,                                                                              \
       "cost-dense-tok-us",                                                                         \
       E(cost.dense_tok_us),                                                                        \
       .arg = "N",                                                                                  \
       KVR_CLI_MIN(0),                                                                              \
       .help = "step cost: the dense layers' compute, us per scheduled token"},                     \
      {KVR_CLI_DOUBLE, "cost-step-ms", E(cost.step_ms),                                             \
       .arg = "N",     KVR_CLI_MIN(0), .help = "step cost: fixed ms per step outside the kernels"}, \
      {KVR_CLI_DOUBLE, "cost-per-seq-ms", E(cost.per_seq_ms),                                       \
       .arg = "N",     KVR_CLI_MIN(0),    .help = "step cost: ms per scheduled sequence"},          \
      {KVR_CLI_DOUBLE,        "cost-decode-ctx-ns",                                                 \
       E(cost.decode_ctx_ns), .arg = "N",                                                           \
       KVR_CLI_MIN(0),        .help = "step cost: ns per context token of each decoding sequence"}, \
      {KVR_CLI_DOUBLE,       "cost-attn-pair-ns",                                                   \
       E(cost.attn_pair_ns), .arg = "N",                                                            \
       KVR_CLI_MIN(0),       .help = "step cost: ns per query-key pair of prefill attention"},      \
      {KVR_CLI_DOUBLE,                                                                              \
       "frontend-req-ms",                                                                           \
       E(frontend.req_ms),                                                                          \
       .arg = "N",                                                                                  \
       KVR_CLI_MIN(0),                                                                              \
       .help = "API server: ms per request (HTTP, validation, chat template, scheduling)"},         \
      {KVR_CLI_DOUBLE,                                                                              \
       "frontend-prompt-tok-us",                                                                    \
       E(frontend.prompt_tok_us),                                                                   \
       .arg = "N",                                                                                  \
       KVR_CLI_MIN(0),                                                                              \
       .help = "API server: us per prompt token (tokenization)"},                                   \
      {KVR_CLI_DOUBLE,                                                                              \
       "frontend-stream-tok-us",                                                                    \
       E(frontend.stream_tok_us),                                                                   \
       .arg = "N",                                                                                  \
       KVR_CLI_MIN(0),                                                                              \
       .help = "API server: us per streamed token (detokenization, chunk JSON, SSE write)"},        \
      {KVR_CLI_SWITCH, "no-async-scheduling", E(frontend.async_scheduling), .set = 0,               \
       .help = "schedule each step when it starts (vLLM's default schedules one step ahead)"},      \
  {                                                                                                 \
    KVR_CLI_DOUBLE, "retok-drift", E(retok_drift),                                                  \
        .arg = "P", KVR_CLI_RANGE(0, 1),                                                            \
        .help = "probability per generated token that re-tokenizing its text gives another id"      \
  }

#endif

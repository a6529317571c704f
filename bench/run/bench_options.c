/* bench_options.c -- the option table of `kvrouter bench`: every flag, where it lands in a
 * kvr_runner_opts_t (runner_types.h), its range and its line of --help.
 *
 * Structs: none of its own; the table's rows point at kvr_runner_opts_t fields, two custom rows
 * (--workload, --policy-params) parse into them through the workload's and the runner's own
 * parsers, and the engine's flags (--num-gpu-blocks, --cost-*, ...) come from engine_options.h,
 * the list `kvrouter sim` takes too, so a virtual cluster takes exactly a real sim's flags.
 *
 * Flow: kvr_cli_main() or kvr_bench_options_parse() walks argv through the table; list items that
 * are strings are the engine's heap copies until kvr_bench_options_free().
 */
#include "bench_options.h"

#include "base/kvr.h"
#include "engine_options.h"
#include "policies/policy.h"
#include "runner.h"

#include <stdio.h>
#include <string.h>

static int set_workload(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                        char *err, size_t errlen) {
  (void)o;
  (void)nth;
  if (kvr_workload_parse_kind(text, &((kvr_runner_opts_t *)base)->wl) == 0)
    return 0;
  snprintf(err, errlen,
           "'%s' is not one of multiturn, documents, control, agentic, hot-prefix, file:PATH, "
           "trace:FILE",
           text);
  return KVR_EINVAL;
}

static int set_params(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                      size_t errlen) {
  (void)o;
  (void)nth;
  return kvr_runner_add_params(base, text, err, errlen);
}

static void show_workload(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  static const char *const kinds[] = {
      "multiturn", "documents", "control", "file:", "agentic", "hot-prefix", "trace:"};
  const kvr_workload_opts_t *wl = &((const kvr_runner_opts_t *)base)->wl;
  (void)o;
  bool path = wl->kind == KVR_WL_FILE || wl->kind == KVR_WL_TRACE;
  snprintf(buf, len, "%s%s", kinds[wl->kind], path && wl->path ? wl->path : "");
}

static int set_window(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                      size_t errlen) {
  (void)o;
  (void)nth;
  if (kvr_workload_parse_window(text, &((kvr_runner_opts_t *)base)->wl) == 0)
    return 0;
  snprintf(err, errlen,
           "'%s' is not START_S:END_S (trace seconds, 0 <= START_S < END_S; END_S may be left out)",
           text);
  return KVR_EINVAL;
}

static void show_window(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  const kvr_workload_opts_t *wl = &((const kvr_runner_opts_t *)base)->wl;
  (void)o;
  if (wl->trace_window_end_s >= 0)
    snprintf(buf, len, "%g:%g", wl->trace_window_start_s, wl->trace_window_end_s);
  else
    snprintf(buf, len, "%g:", wl->trace_window_start_s);
}

#define F(field) KVR_CLI_FIELD(kvr_runner_opts_t, field)
#define E(field) F(vc.engine.field)

static const char *const api_names[] = {"chat", "completions", NULL};
static const char *const mode_names[] = {"session", "replay", NULL};
static const char *const order_names[] = {"blocks", "sample", NULL};

static const kvr_cli_opt_t options[] = {
    KVR_CLI_HEADING("Target and requests"),
    {KVR_CLI_STR, "url", F(lg.url), .arg = "URL",
     .help = "endpoint, e.g. http://127.0.0.1:8000 (the API path is added if absent); a "
             "comma-separated list of up to 16: requests alternate between them, as a Service "
             "spreads them over router replicas"},
    {KVR_CLI_STR, "model", F(lg.model), .arg = "NAME",
     .help = "model field of requests (default: the first of GET /v1/models)"},
    {KVR_CLI_ENUM, "api", F(lg.api), .names = api_names, .help = "streaming chat or completions"},
    {KVR_CLI_STR, "api-key", F(lg.api_key), .arg = "KEY",
     .help = "sent as Authorization: Bearer KEY"},
    {KVR_CLI_SWITCH, "no-ignore-eos", F(lg.ignore_eos), .set = 0,
     .help = "do not send \"ignore_eos\": true"},
    {KVR_CLI_DOUBLE, "request-timeout-s", F(lg.request_timeout_s), .arg = "S", KVR_CLI_MIN(0),
     .help = "per request, real seconds; 0 = none"},
    KVR_CLI_HEADING("Workload"),
    {KVR_CLI_CUSTOM, "workload", .arg = "W", .parse = set_workload, .show = show_workload,
     .help = "multiturn | documents | control | agentic | hot-prefix | file:PATH | trace:FILE (a "
             "prefix-hashed trace: timestamp, input_length, output_length, hash_ids per line)"},
    {KVR_CLI_UINT, "trace-block-tokens", F(wl.trace_block_tokens), .arg = "N",
     KVR_CLI_RANGE(16, 1 << 20),
     .help = "trace: the tokens one hash id stands for (the format's 512)"},
    {KVR_CLI_CUSTOM, "trace-window", .arg = "START_S:END_S", .parse = set_window,
     .show = show_window,
     .help = "trace: replay only the requests arriving in [START_S, END_S) trace seconds (END_S "
             "left out: to the end); a level starts at the window's first request"},
    {KVR_CLI_UINT, "turns", F(wl.turns), .arg = "N", KVR_CLI_RANGE(1, 64),
     .help = "multiturn: turns per conversation"},
    {KVR_CLI_UINT, "starters", F(wl.starters), .arg = "N", KVR_CLI_RANGE(1, 100000),
     .help = "multiturn: shared conversation starters; agentic: shared system prompts"},
    {KVR_CLI_UINT, "documents", F(wl.documents), .arg = "N", KVR_CLI_RANGE(1, 1000000),
     .help = "documents: distinct documents"},
    {KVR_CLI_UINT, "questions", F(wl.questions), .arg = "N", KVR_CLI_RANGE(1, 1000),
     .help = "documents: questions per document"},
    {KVR_CLI_UINT, "agentic-turns-min", F(wl.agentic_turns_min), .arg = "N",
     KVR_CLI_RANGE(1, 10000), .help = "agentic: fewest turns per conversation (uniform draw)"},
    {KVR_CLI_UINT, "agentic-turns-max", F(wl.agentic_turns_max), .arg = "N",
     KVR_CLI_RANGE(1, 10000), .help = "agentic: most turns per conversation"},
    {KVR_CLI_UINT, "tool-min-tokens", F(wl.tool_min_tokens), .arg = "T", KVR_CLI_RANGE(1, 1000000),
     .help = "agentic: smallest tool output (user turns 2..)"},
    {KVR_CLI_UINT, "tool-max-tokens", F(wl.tool_max_tokens), .arg = "T", KVR_CLI_RANGE(1, 1000000),
     .help = "agentic: largest tool output"},
    {KVR_CLI_UINT, "agentic-max-context", F(wl.agentic_max_context), .arg = "T",
     KVR_CLI_RANGE(1, 100000000),
     .help = "agentic: a conversation's turns are capped so prefix + user turns + max_tokens "
             "stay within T tokens (keep under the target's max_model_len)"},
    {KVR_CLI_DOUBLE, "hot-fraction", F(wl.hot_fraction), .arg = "F", KVR_CLI_RANGE(0, 1),
     .help = "hot-prefix: share of requests carrying the one shared prefix"},
    {KVR_CLI_DOUBLE, "output-mean", F(wl.out_mean), .arg = "T", KVR_CLI_MIN(1),
     .help = "output tokens per turn: mean of a normal clipped to [--output-min, --output-max] "
             "(agentic: a flag left at its default becomes normal(120, 60) in [16, 512])"},
    {KVR_CLI_DOUBLE, "output-std", F(wl.out_std), .arg = "T", KVR_CLI_MIN(0),
     .help = "output tokens per turn: standard deviation"},
    {KVR_CLI_UINT, "output-min", F(wl.out_min), .arg = "T", KVR_CLI_RANGE(1, 1000000),
     .help = "output tokens per turn: at least"},
    {KVR_CLI_UINT, "output-max", F(wl.out_max), .arg = "T", KVR_CLI_RANGE(1, 1000000),
     .help = "output tokens per turn: at most"},
    {KVR_CLI_ENUM, "multiturn-mode", F(wl.replay), .names = mode_names,
     .help = "replay: pre-built conversations, any turn sent at its arrival (the seed's vllm "
             "bench serve shape); session: closed-loop conversations resending the streamed "
             "answers after think time"},
    {KVR_CLI_UINT, "replay-width", F(wl.replay_width), .arg = "N", KVR_CLI_RANGE(1, 256),
     .help = "replay: conversations interleaved per block"},
    {KVR_CLI_ENUM, "replay-order", F(wl.replay_sample), .names = order_names,
     .help = "replay: blocks, or sample: each arrival a random turn of its own conversation (a "
             "dataset sampled at random; calibration)"},
    {KVR_CLI_UINT, "replay-dataset", F(wl.replay_dataset), .arg = "N", KVR_CLI_RANGE(0, 1000000),
     .help = "replay sample: draw from one fixed dataset of N conversations (the same at every "
             "level); 0 = a fresh one per arrival"},
    {KVR_CLI_DOUBLE, "answer-mean", F(wl.answer_mean), .arg = "T", KVR_CLI_MIN(0),
     .help = "replay: tokens of the pre-built answers in the history; 0 = each turn's max_tokens"},
    {KVR_CLI_DOUBLE, "answer-std", F(wl.answer_std), .arg = "T", KVR_CLI_MIN(0),
     .help = "replay: standard deviation of those answers' tokens"},
    {KVR_CLI_DOUBLE, "think-s", F(wl.think_mean_s), .arg = "S", KVR_CLI_MIN(0),
     .help = "session, agentic: mean think time between turns, simulated seconds"},
    {KVR_CLI_UINT, "seed", F(seed), .arg = "N", .help = "seed of everything random"},
    KVR_CLI_HEADING("Load"),
    {KVR_CLI_LIST, "rates", KVR_CLI_ARRAY(kvr_runner_opts_t, rates, nrates), .arg = "LIST",
     .elem = KVR_CLI_DOUBLE, KVR_CLI_GT(0),
     .help = "request rates in req/s, e.g. 0.5,1,2 (simulated time)"},
    {KVR_CLI_LIST, "concurrency", KVR_CLI_ARRAY(kvr_runner_opts_t, conc, nconc), .arg = "LIST",
     .elem = KVR_CLI_UINT, KVR_CLI_RANGE(1, 100000),
     .help = "closed-loop users instead, e.g. 8,16,32, measured in steady state (users start "
             "mid-conversation; each user's first request is warm-up; users keep sending until "
             "every measured request completed)"},
    {KVR_CLI_SWITCH, "sessions", F(lg.sessions), .set = 1,
     .help = "rates are conversation starts/s (default: turn arrivals/s)"},
    {KVR_CLI_DOUBLE, "burstiness", F(lg.burstiness), .arg = "B", KVR_CLI_GT(0),
     .help = "gamma shape of inter-arrival gaps (1 = Poisson)"},
    {KVR_CLI_INT, "arrival-seed", F(lg.arrival_seed), .arg = "S", KVR_CLI_RANGE(-1, 4294967295.0),
     .help = "rates: send the measured requests on the schedule `vllm bench serve --seed S` "
             "draws (numpy's stream; its default seed is 0), to compare with its results on "
             "the same arrivals; -1 = gaps from --seed"},
    {KVR_CLI_UINT, "num-prompts", F(lg.num_prompts), .arg = "N", KVR_CLI_RANGE(1, 10000000),
     .help = "measured requests per level"},
    {KVR_CLI_UINT, "warmup", F(lg.warmup), .arg = "N", KVR_CLI_RANGE(0, 1000000),
     .help = "the first N requests of each level are warm-up, not measured (with --concurrency "
             "each user's first request is too)"},
    {KVR_CLI_DOUBLE, "warmup-s", F(lg.warmup_s), .arg = "S", KVR_CLI_RANGE(0, 1e5),
     .help = "rates: at least rate*S warm-up requests; concurrency: every request sent in the "
             "first S s is warm-up (simulated s)"},
    {KVR_CLI_DOUBLE, "min-level-s", F(lg.min_level_s), .arg = "S", KVR_CLI_RANGE(0, 1e5),
     .help = "rates: at least rate*S measured requests (simulated s)"},
    {KVR_CLI_DOUBLE, "cooldown-s", F(cooldown_s), .arg = "S", KVR_CLI_MIN(0),
     .help = "pause between levels and after a policy switch (simulated s)"},
    {KVR_CLI_SWITCH, "search", F(search), .set = 1,
     .help = "find the max SLO-compliant rate (bracket, then bisect)"},
    {KVR_CLI_DOUBLE, "search-start", F(search_start), .arg = "R", KVR_CLI_GT(0),
     .help = "search: first load (the first of --rates/--concurrency when given)"},
    {KVR_CLI_DOUBLE, "search-max", F(search_max), .arg = "R", KVR_CLI_GT(0),
     .help = "search: highest load"},
    {KVR_CLI_DOUBLE, "search-resolution", F(search_res), .arg = "R", KVR_CLI_GT(0),
     .help = "search: stop when the last pass and the first fail are this close"},
    {KVR_CLI_SWITCH, "no-early-stop", F(no_early_stop), .set = 1,
     .help = "run every search level to its end, even once its TTFT p99 has certainly missed "
             "the SLO (by default it stops there)"},
    {KVR_CLI_DOUBLE, "time-scale", F(lg.time_scale), .arg = "N", KVR_CLI_GT(0),
     .help = "target runs N times faster than real time (kvrouter sim)"},
    KVR_CLI_HEADING("SLOs"),
    {KVR_CLI_DOUBLE, "slo-ttft-ms", F(slo.ttft_p99_ms), .arg = "MS", KVR_CLI_GT(0),
     .help = "TTFT p99 target"},
    {KVR_CLI_DOUBLE, "slo-tpot-ms", F(slo.tpot_p99_ms), .arg = "MS", KVR_CLI_GT(0),
     .help = "TPOT p99 target"},
    {KVR_CLI_DOUBLE, "max-failed-frac", F(slo.max_failed_frac), .arg = "F", KVR_CLI_RANGE(0, 1),
     .help = "allowed failed share per level"},
    KVR_CLI_HEADING("A/B"),
    {KVR_CLI_LIST, "ab", KVR_CLI_ARRAY(kvr_runner_opts_t, ab, nab), .arg = "LIST",
     .elem = KVR_CLI_STR, .help = "policies, e.g. round_robin,kv_aware; needs --admin"},
    {KVR_CLI_STR, "admin", F(admin), .arg = "URL",
     .help = "router admin listener, e.g. http://127.0.0.1:8001"},
    {KVR_CLI_LIST, "labels", KVR_CLI_ARRAY(kvr_runner_opts_t, labels, nlabels), .arg = "LIST",
     .elem = KVR_CLI_STR, .help = "run labels (default phase0,phase3 for two policies)"},
    {KVR_CLI_CUSTOM, "policy-params", .arg = "LABEL=JSON", .parse = set_params,
     .help = "parameters of the run labelled LABEL's policy, e.g. phase3='{\"decode_weight\":0.2}' "
             "(repeatable; sent with its PUT /admin/policy)"},
    {KVR_CLI_SWITCH, "reset-cache", F(reset_cache), .set = 1,
     .help = "empty the prefix caches before each label: POST ADMIN/admin/reset_prefix_cache "
             "(every worker and the router's index), or URL/reset_prefix_cache without --admin "
             "(one worker; vLLM needs VLLM_SERVER_DEV_MODE=1). Default on with --ab"},
    {KVR_CLI_SWITCH, "no-reset-cache", F(reset_cache), .set = 0,
     .help = "keep the caches warm across labels"},
    KVR_CLI_HEADING("Output"),
    {KVR_CLI_STR, "out", F(out), .arg = "DIR", .help = "results folder"},
    {KVR_CLI_STR, "title", F(title), .arg = "TEXT", .help = "report title"},
    {KVR_CLI_SWITCH, "quiet", F(quiet), .set = 1, .help = "no progress output"},
    KVR_CLI_HEADING("Virtual time (--virtual: no --url, --admin or running servers)"),
    {KVR_CLI_SWITCH, "virtual", F(virt), .set = 1,
     .help = "run in this process on a discrete-event clock: N simulated engines (kvrouter sim's) "
             "behind the router core and policies (kvrouter serve's); same flags, same report, "
             "marked virtual; deterministic for a --seed"},
    {KVR_CLI_UINT, "workers", F(vc.workers), .arg = "N", KVR_CLI_RANGE(1, KVR_MAX_WORKERS),
     .help = "virtual: simulated workers"},
    {KVR_CLI_SWITCH, "keep-cluster", F(keep_cluster), .set = 1,
     .help = "virtual: run each level on the cluster the previous level left (its caches and "
             "learned rates), as one server swept from rate to rate is; by default every level "
             "starts on a fresh cluster, so its verdict depends only on policy, load and seed"},
    {KVR_CLI_LIST, "worker-blocks",
     KVR_CLI_ARRAY(kvr_runner_opts_t, vc.worker_blocks, vc.nworker_blocks), .arg = "LIST",
     .elem = KVR_CLI_UINT, KVR_CLI_RANGE(1, 1 << 30),
     .help = "virtual: KV blocks of each worker (one per worker: a mixed fleet)"},
    {KVR_CLI_DOUBLE, "net-ms", F(vc.net_ms), .arg = "MS", KVR_CLI_RANGE(0, 1e4),
     .help = "virtual: one-way network delay per hop (client-router, router-worker)"},
    {KVR_CLI_DOUBLE, "router-ms", F(vc.router_ms), .arg = "MS", KVR_CLI_RANGE(0, 1e4),
     .help = "virtual: the router's own time per request before it forwards"},
    {KVR_CLI_UINT, "scrape-interval-ms", F(vc.scrape_interval_ms), .arg = "MS",
     KVR_CLI_RANGE(0, 3600000), .help = "virtual: the router's /metrics scrape period; 0 = none"},
    {KVR_CLI_UINT, "scrape-stale-ms", F(vc.scrape_stale_ms), .arg = "MS", KVR_CLI_RANGE(1, 3600000),
     .help = "virtual: scraped figures older than this are ignored"},
    {KVR_CLI_UINT, "block-chars", F(vc.block_chars), .arg = "N", KVR_CLI_RANGE(8, 4096),
     .help = "virtual: the router's prefix block size in characters"},
    {KVR_CLI_UINT, "router-seed", F(vc.seed), .arg = "N",
     .help = "virtual: the router's policy randomness"},
    {KVR_CLI_SWITCH, "kv-events", F(vc.kv_events), .set = 1,
     .help = "virtual: precise mode: the engines publish vLLM KV events the router reads, and "
             "prompts are tokenized at the router"},
    {KVR_CLI_DOUBLE, "tokenize-ms", F(vc.tokenize_ms), .arg = "MS", KVR_CLI_RANGE(0, 1e4),
     .help = "virtual, precise mode: what the /tokenize round trip adds before forwarding"},
    {KVR_CLI_DOUBLE, "flush-every-s", F(vc.flush_every_s), .arg = "S", KVR_CLI_RANGE(0, 1e6),
     .help = "virtual: every S simulated seconds one worker's prefix cache is emptied behind the "
             "router's back (0 = never): the case that breaks the approximate index"},
    {KVR_CLI_UINT, "output-len-mean", F(vc.output_len_mean), .arg = "N",
     .help = "virtual: the sims' natural answer length with --no-ignore-eos (as kvrouter sim)"},
    KVR_ENGINE_CLI_ROWS(E),
};

const kvr_cli_cmd_t kvr_bench_options_cmd = {
    .name = "bench",
    .usage = "--url URL [options]",
    .about = "Open-loop load generator for OpenAI-compatible endpoints (the router, one worker,\n"
             "vLLM). `kvrouter bench routing --help`: the routing-decision micro-benchmark.",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
};

int kvr_bench_options_parse(kvr_runner_opts_t *o, int argc, char **argv, char *err, size_t errlen) {
  /* The engine prints --help or --version where it finds them; here they are not asked of a
   * person, so what it prints is dropped and the flag is an error. */
  FILE *sink = fopen("/dev/null", "w");
  int rc =
      kvr_cli_parse(&kvr_bench_options_cmd, o, argc, argv, NULL, sink ? sink : stderr, err, errlen);
  if (sink != NULL)
    fclose(sink);
  if (rc != KVR_CLI_EXIT)
    return rc;
  snprintf(err, errlen, "--help, --version: not here (see kvrouter bench --help)");
  return KVR_EINVAL;
}

void kvr_bench_options_free(kvr_runner_opts_t *o) {
  kvr_cli_free(&kvr_bench_options_cmd, o);
}

/* bench_options.c -- the option table of `kvrouter bench`: every flag, where it lands in a
 * kvr_runner_opts_t (runner_types.h), its range and its line of --help; and `vllm bench serve`'s
 * spellings of the same settings (the second half of the file).
 *
 * Structs: none of its own; the table's rows point at kvr_runner_opts_t fields, two custom rows
 * (--workload, --policy-params) parse into them through the workload's and the runner's own
 * parsers, and the engine's flags (--num-gpu-blocks, --cost-*, ...) come from engine_options.h,
 * the list `kvrouter sim` takes too, so a virtual cluster takes exactly a real sim's flags.
 *
 * Flow: kvr_bench_options_main() or kvr_bench_options_parse() sorts argv into kvrouter's flags and
 * vllm's (split()), walks the first through this table and the second through vllm_options, then
 * turns vllm's into settings (vllm_apply()); list items that are strings, and a URL composed from
 * vllm's parts, are heap copies until kvr_bench_options_free().
 */
#include "bench_options.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "bench/loadgen/trace_replay.h"
#include "engine_options.h"
#include "policies/policy.h"
#include "runner.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_workload(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                        char *err, size_t errlen) {
  (void)o;
  (void)nth;
  if (kvr_workload_parse_kind(text, &((kvr_runner_opts_t *)base)->wl) == 0)
    return 0;
  snprintf(err, errlen,
           "'%s' is not one of multiturn, documents, control, agentic, hot-prefix, file:PATH, "
           "sharegpt:PATH, trace:FILE, mix:SPEC",
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
      "multiturn", "documents", "control", "file:", "agentic", "hot-prefix", "trace:", "mix:"};
  const kvr_workload_opts_t *wl = &((const kvr_runner_opts_t *)base)->wl;
  (void)o;
  bool path = wl->kind == KVR_WL_FILE || wl->kind == KVR_WL_TRACE || wl->kind == KVR_WL_MIX;
  snprintf(buf, len, "%s%s", wl->sharegpt_vllm ? "sharegpt:" : kinds[wl->kind],
           path && wl->path ? wl->path : "");
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

static const char *const api_names[] = {"chat", "completions", "responses", NULL};
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
    {KVR_CLI_ENUM, "api", F(lg.api), .names = api_names,
     .help = "streaming chat, completions or responses (the Responses API: each turn names the "
             "previous answer's id and sends only its new message; sessions only)"},
    {KVR_CLI_STR, "api-key", F(lg.api_key), .arg = "KEY",
     .help = "sent as Authorization: Bearer KEY"},
    {KVR_CLI_SWITCH, "no-ignore-eos", F(lg.ignore_eos), .set = 0,
     .help = "do not send \"ignore_eos\": true"},
    {KVR_CLI_DOUBLE, "request-timeout-s", F(lg.request_timeout_s), .arg = "S", KVR_CLI_MIN(0),
     .help = "per request, real seconds; 0 = none"},
    KVR_CLI_HEADING("Workload"),
    {KVR_CLI_CUSTOM, "workload", .arg = "W", .parse = set_workload, .show = show_workload,
     .help =
         "multiturn | documents | control | agentic | hot-prefix | file:PATH | sharegpt:PATH (a "
         "ShareGPT file sampled as vllm bench serve does: the first message of each entry, "
         "single-turn) | trace:FILE (a prefix-hashed trace: timestamp, input_length, "
         "output_length, hash_ids per line) | mix:MODEL=KIND@WEIGHT[,...] (several models: each "
         "conversation sends its part's model, each part its own text pool, as sessions)"},
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
    {KVR_CLI_SWITCH, "size-fleet", F(size_fleet), .set = 1,
     .help = "virtual time only: per policy, the smallest fleet that serves the load within the "
             "SLOs (a trace at its own rate, or --rates R): from --workers, double while a fleet "
             "fails, halve while one passes, bisect to adjacent fleets; each a fresh cluster"},
    {KVR_CLI_UINT, "size-fleet-max", F(size_fleet_max), .arg = "N",
     KVR_CLI_RANGE(1, KVR_MAX_WORKERS), .help = "--size-fleet: the largest fleet tried"},
    {KVR_CLI_SWITCH, "keep-cluster", F(keep_cluster), .set = 1,
     .help = "virtual: run each level on the cluster the previous level left (its caches and "
             "learned rates), as one server swept from rate to rate is; by default every level "
             "starts on a fresh cluster, so its verdict depends only on policy, load and seed"},
    {KVR_CLI_LIST, "worker-blocks",
     KVR_CLI_ARRAY(kvr_runner_opts_t, vc.worker_blocks, vc.nworker_blocks), .arg = "LIST",
     .elem = KVR_CLI_UINT, KVR_CLI_RANGE(1, 1 << 30),
     .help = "virtual: KV blocks of each worker (one per worker: a mixed fleet)"},
    {KVR_CLI_STR, "model-fleet", F(vc.model_fleet), .arg = "SPEC",
     .help =
         "virtual: workers serving given models, N*MODEL[:ADAPTER+...][@dp] groups joined by "
         "';' (bench/vcluster/README.md): each worker's GET /v1/models and LoRA state reach the "
         "router; a request for a model a worker does not serve is vLLM's 404 there; the "
         "fleet's size replaces --workers"},
    {KVR_CLI_UINT, "max-loras", F(vc.max_loras), .arg = "L", KVR_CLI_RANGE(1, 1024),
     .help = "virtual, --model-fleet: adapters a LoRA worker batches at once and keeps on the GPU "
             "(vLLM's --max-loras, default 1; --max-cpu-loras the same)"},
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
    {KVR_CLI_SWITCH, "no-response-affinity", F(vc.no_response_affinity), .set = 1,
     .help = "virtual, --api responses: a router that does not send a previous_response_id to the "
             "worker that stored it (kvrouter serve always does): each turn goes where the policy "
             "sends it, and a worker without the response answers vLLM's 404"},
    {KVR_CLI_UINT, "output-len-mean", F(vc.output_len_mean), .arg = "N",
     .help = "virtual: the sims' natural answer length with --no-ignore-eos (as kvrouter sim)"},
    KVR_ENGINE_CLI_ROWS(E),
};

static void print_vllm_help(FILE *out);

const kvr_cli_cmd_t kvr_bench_options_cmd = {
    .name = "bench",
    .usage = "--url URL [options]",
    .about = "Open-loop load generator for OpenAI-compatible endpoints (the router, one worker,\n"
             "vLLM). `kvrouter bench routing --help`: the routing-decision micro-benchmark.",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
    .epilog = print_vllm_help,
};

/* ---- `vllm bench serve`'s spellings -----------------------------------------------------------
 *
 * So that a `vllm bench serve` command line carries over, its flags that have a kvrouter meaning
 * are accepted as vllm spells them (vllm/benchmarks/serve.py add_cli_args, datasets.py
 * add_dataset_parser; bench/loadgen/README.md maps each one). They are a second table,
 * vllm_options, filling a vllm_args_t as argparse fills its Namespace; vllm_apply() then turns
 * them into the kvrouter settings they mean, with vllm's defaults where a vllm dataset is asked
 * for (--dataset-name: 1,000 prompts, OpenAI completions, its rate). A vllm flag kvrouter has no
 * equivalent of is refused by name with why (refused[]), never ignored.
 *
 * split() sorts a command line into the two tables' words, so the spellings can be mixed in any
 * order; vllm's nargs flags (--goodput KEY:MS KEY:MS, --metadata K=V K=V) have their values joined
 * into one word there, the only thing the option engine could not read. A setting given in both
 * spellings (--request-rate and --rates) is an error. The flags kvrouter already spells as vllm
 * does (--model, --seed, --num-prompts, --burstiness) are kvrouter's rows.
 */

typedef struct vllm_args_s {
  const char *request_rate, *dataset_name, *dataset_path, *backend, *endpoint, *base_url, *host;
  const char *label, *goodput, *percentile_metrics, *metric_percentiles, *metadata;
  const char *result_dir, *result_filename;
  const char *tt_label[4]; /* --timed-trace-label-{timestamp,input-length,output-length,hash-ids} */
  unsigned max_concurrency, num_warmups, port, chunk, sharegpt_output_len, output_len;
  unsigned ready_timeout;
  double sec_mult;
  bool self_timed, no_oversample, disable_shuffle, save_result, save_detailed, append_result;
  bool disable_tqdm, ignore_eos;
} vllm_args_t;

#define V(field) KVR_CLI_FIELD(vllm_args_t, field)

static const kvr_cli_opt_t vllm_options[] = {
    {KVR_CLI_STR, "request-rate", V(request_rate), .arg = "R|inf",
     .help = "= --rates R, one level; inf: every request at the start (vllm's default with "
             "--dataset-name sharegpt)"},
    {KVR_CLI_UINT, "max-concurrency", V(max_concurrency), .arg = "N", KVR_CLI_RANGE(1, 1000000),
     .help = "at most N requests in flight: an arrival finding N waits for one to finish (its "
             "wait: the JSON's queue_times); a cap of the load generator, no kvrouter twin"},
    {KVR_CLI_STR, "dataset-name", V(dataset_name), .arg = "NAME",
     .help = "sharegpt (= --workload sharegpt:PATH) or timed_trace (= --workload trace:PATH "
             "--trace-block-tokens 16 at its own times); either brings vllm's defaults: "
             "--num-prompts 1000, --api completions, its rate"},
    {KVR_CLI_STR, "dataset-path", V(dataset_path), .arg = "PATH", .flags = KVR_CLI_NONEMPTY,
     .help = "the --dataset-name file"},
    {KVR_CLI_UINT, "num-warmups", V(num_warmups), .arg = "N", KVR_CLI_RANGE(0, 1000000),
     .help = "= --warmup N (the first N requests, not measured)"},
    {KVR_CLI_UINT, "sharegpt-output-len", V(sharegpt_output_len), .arg = "N",
     KVR_CLI_RANGE(1, 1000000), .help = "sharegpt: max_tokens of every prompt"},
    {KVR_CLI_UINT, "output-len", V(output_len), .arg = "N", KVR_CLI_RANGE(1, 1000000),
     .help = "sharegpt: = --sharegpt-output-len"},
    {KVR_CLI_SWITCH, "no-oversample", V(no_oversample), .set = 1,
     .help = "timed_trace: accepted (a trace is never sent more than once)"},
    {KVR_CLI_SWITCH, "disable-shuffle", V(disable_shuffle), .set = 1,
     .help = "timed_trace: accepted (a trace keeps its order)"},
    {KVR_CLI_UINT, "timed-trace-chunk-hash-size", V(chunk), .arg = "N",
     KVR_CLI_RANGE(KVR_TRACE_REPLAY_MIN_BLOCK, 1 << 20), .help = "= --trace-block-tokens N"},
    {KVR_CLI_DOUBLE, "timed-trace-sec-multiplier", V(sec_mult), .arg = "M", KVR_CLI_GT(0),
     .help = "a trace at its own times: request i at timestamp x M seconds (0.001 for the "
             "format's milliseconds: its real pace; vllm's default 1); no --rates"},
    {KVR_CLI_STR, "timed-trace-label-timestamp", V(tt_label[0]), .arg = "NAME",
     .help = "accepted as timestamp, the format's own field name"},
    {KVR_CLI_STR, "timed-trace-label-input-length", V(tt_label[1]), .arg = "NAME",
     .help = "accepted as input_length"},
    {KVR_CLI_STR, "timed-trace-label-output-length", V(tt_label[2]), .arg = "NAME",
     .help = "accepted as output_length"},
    {KVR_CLI_STR, "timed-trace-label-hash-ids", V(tt_label[3]), .arg = "NAME",
     .help = "accepted as hash_ids"},
    {KVR_CLI_SWITCH, "self-timed", V(self_timed), .set = 1,
     .help = "timed_trace: at its own times (vllm's default there)"},
    {KVR_CLI_STR, "goodput", V(goodput), .arg = "KEY:MS...",
     .help = "request_goodput counts the completed requests within every threshold (ttft, tpot, "
             "e2el, ms), instead of within --slo-ttft-ms and --slo-tpot-ms"},
    {KVR_CLI_STR, "percentile-metrics", V(percentile_metrics), .arg = "LIST",
     .help = "the JSON's metrics, of ttft, tpot, itl, e2el, client_queue_time, "
             "e2el_including_client_queue (kvrouter's default: ttft,tpot,itl,e2el)"},
    {KVR_CLI_STR, "metric-percentiles", V(metric_percentiles), .arg = "LIST",
     .help = "the JSON's percentiles, e.g. 50,99.9 (kvrouter's default: 50,90,95,99)"},
    {KVR_CLI_SWITCH, "save-result", V(save_result), .set = 1,
     .help = "also write each level's JSON as vllm names it: "
             "LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json"},
    {KVR_CLI_SWITCH, "append-result", V(append_result), .set = 1,
     .help = "... appended to that file, one JSON document a line"},
    {KVR_CLI_SWITCH, "save-detailed", V(save_detailed), .set = 1,
     .help = "the JSON also lists each request's ITLs (itls) and text (generated_texts)"},
    {KVR_CLI_STR, "result-dir", V(result_dir), .arg = "DIR", .flags = KVR_CLI_NONEMPTY,
     .help = "the folder of --save-result's file (default: the current one)"},
    {KVR_CLI_STR, "result-filename", V(result_filename), .arg = "NAME", .flags = KVR_CLI_NONEMPTY,
     .help = "--save-result's file name (several levels: one JSON document a line)"},
    {KVR_CLI_STR, "metadata", V(metadata), .arg = "KEY=VALUE...",
     .help = "string keys added to each level's JSON"},
    {KVR_CLI_STR, "backend", V(backend), .arg = "NAME",
     .help = "openai or vllm (= --api completions), openai-chat (= --api chat)"},
    {KVR_CLI_STR, "endpoint", V(endpoint), .arg = "PATH",
     .help = "/v1/completions or /v1/chat/completions: the API, and the URL's path"},
    {KVR_CLI_STR, "base-url", V(base_url), .arg = "URL", .flags = KVR_CLI_NONEMPTY,
     .help = "= --url URL (with --endpoint's path)"},
    {KVR_CLI_STR, "host", V(host), .arg = "HOST", .flags = KVR_CLI_NONEMPTY,
     .help = "= --url http://HOST:PORT (vllm's defaults 127.0.0.1 and 8000)"},
    {KVR_CLI_UINT, "port", V(port), .arg = "PORT", KVR_CLI_RANGE(1, 65535), .help = "see --host"},
    {KVR_CLI_STR, "label", V(label), .arg = "NAME", .flags = KVR_CLI_NONEMPTY,
     .help = "= --labels NAME"},
    {KVR_CLI_SWITCH, "ignore-eos", V(ignore_eos), .set = 1,
     .help = "send \"ignore_eos\": true (kvrouter's default, not vllm's for sharegpt)"},
    {KVR_CLI_SWITCH, "disable-tqdm", V(disable_tqdm), .set = 1, .help = "= --quiet"},
    {KVR_CLI_UINT, "ready-check-timeout-sec", V(ready_timeout), .arg = "S",
     .help = "accepted as 0 (vllm's default): no wait for the endpoint"},
};

static const kvr_cli_cmd_t vllm_cmd = {
    .name = "bench",
    .usage = "",
    .about = "",
    .opts = vllm_options,
    .nopts = KVR_ARRAY_SIZE(vllm_options),
};

/* vllm's flags with no kvrouter equivalent, and why (a name ending in '-' covers a prefix). */
static const struct {
  const char *name, *why;
} refused[] = {
    {"tokenizer", "kvrouter bench has no tokenizer: it counts the server's usage tokens"},
    {"tokenizer-mode", "kvrouter bench has no tokenizer"},
    {"skip-tokenizer-init", "kvrouter bench has no tokenizer"},
    {"trust-remote-code", "kvrouter bench loads no model code"},
    {"served-model-name", "the name sent is --model"},
    {"temperature", "kvrouter bench sends no sampling parameters (the server's defaults)"},
    {"top-p", "kvrouter bench sends no sampling parameters"},
    {"top-k", "kvrouter bench sends no sampling parameters"},
    {"min-p", "kvrouter bench sends no sampling parameters"},
    {"frequency-penalty", "kvrouter bench sends no sampling parameters"},
    {"presence-penalty", "kvrouter bench sends no sampling parameters"},
    {"repetition-penalty", "kvrouter bench sends no sampling parameters"},
    {"use-beam-search", "kvrouter bench sends no sampling parameters"},
    {"logprobs", "kvrouter bench asks for no logprobs"},
    {"extra-body", "kvrouter bench adds nothing to its request bodies"},
    {"chat-template-kwargs", "kvrouter bench renders no chat template"},
    {"skip-chat-template", "kvrouter bench renders no chat template"},
    {"enable-multimodal-chat", "kvrouter bench sends text only"},
    {"header", "kvrouter bench sends no extra headers (--api-key: Authorization)"},
    {"request-id-prefix", "kvrouter bench sends no x-request-id"},
    {"lora-modules", "kvrouter bench sends no LoRA names"},
    {"lora-assignment", "kvrouter bench sends no LoRA names"},
    {"ramp-up-strategy", "no ramp-up: give the rates as levels (--rates) or --search"},
    {"ramp-up-start-rps", "no ramp-up: give the rates as levels (--rates) or --search"},
    {"ramp-up-end-rps", "no ramp-up: give the rates as levels (--rates) or --search"},
    {"probe-request-rate", "kvrouter bench sends no probe requests"},
    {"profile", "kvrouter bench starts no profiler"},
    {"insecure", "kvrouter bench always verifies TLS"},
    {"plot-timeline", "kvrouter bench writes its own report (report.md, report.html)"},
    {"timeline-itl-thresholds", "kvrouter bench writes its own report"},
    {"plot-dataset-stats", "kvrouter bench writes its own report"},
    {"input-len", "it sets vllm's random datasets' lengths; kvrouter bench has none"},
    {"no-self-timed", "a trace is sent at its own times or scaled to --rates, never at vllm's "
                      "Poisson rate over its prompts"},
    {"no-stream", "it loads vllm's HuggingFace datasets"},
    {"random-", "a flag of vllm's random datasets, which kvrouter bench does not have"},
    {"no-reranker", "a flag of vllm's random-rerank dataset"},
    {"sonnet-", "a flag of vllm's sonnet dataset"},
    {"hf-", "a flag of vllm's HuggingFace datasets"},
    {"custom-", "a flag of vllm's custom datasets (kvrouter's JSONL: --workload file:PATH)"},
    {"spec-bench-", "a flag of vllm's spec_bench dataset"},
    {"speed-bench-", "a flag of vllm's speed_bench dataset"},
    {"blazedit-", "a flag of vllm's blazedit dataset"},
    {"asr-", "a flag of vllm's ASR datasets"},
    {"bfcl-", "a flag of vllm's BFCL dataset"},
    {"prefix-repetition-", "a flag of vllm's prefix_repetition dataset"},
};

/* Why vllm flag name (without "--", len bytes) is refused, or NULL. */
static const char *refusal(const char *name, size_t len) {
  for (size_t i = 0; i < KVR_ARRAY_SIZE(refused); i++) {
    size_t n = strlen(refused[i].name);
    bool prefix = refused[i].name[n - 1] == '-';
    if ((prefix ? len > n : len == n) && strncmp(name, refused[i].name, n) == 0)
      return refused[i].why;
  }
  return NULL;
}

/* The row of cmd a word "--name[=value]" names, or NULL. */
static const kvr_cli_opt_t *row_of(const kvr_cli_cmd_t *cmd, const char *word) {
  if (strncmp(word, "--", 2) != 0)
    return NULL;
  const char *name = word + 2;
  size_t len = strcspn(name, "=");
  for (size_t i = 0; i < cmd->nopts; i++) {
    const kvr_cli_opt_t *o = &cmd->opts[i];
    if (o->kind != KVR_CLI_SECTION && strlen(o->name) == len && strncmp(o->name, name, len) == 0)
      return o;
  }
  return NULL;
}

/* A command line sorted into kvrouter's words and vllm's (argv[0] first in each); seen[] marks the
 * rows given. joined holds the nargs values split() made. */
typedef struct split_s {
  char **kargv, **vargv;
  int kargc, vargc;
  bool kseen[KVR_CLI_MAX_OPTS], vseen[KVR_CLI_MAX_OPTS];
  char *joined[8];
  size_t njoined;
} split_t;

static void split_free(split_t *sp) {
  free(sp->kargv);
  free(sp->vargv);
  for (size_t i = 0; i < sp->njoined; i++)
    free(sp->joined[i]);
}

/* A word argparse would read as an option, not as a value of --goodput or --metadata. */
static bool option_like(const char *w) {
  return w[0] == '-' && !isdigit((unsigned char)w[1]) && w[1] != '.';
}

/* vllm's --goodput and --metadata take every following word that is no option: joined, one word. */
static int join_values(split_t *sp, int argc, char **argv, int i) {
  int j = i + 1;
  kvr_buf_t b = KVR_BUF_INIT;
  for (; j < argc && !option_like(argv[j]) && sp->njoined < KVR_ARRAY_SIZE(sp->joined); j++)
    kvr_buf_printf(&b, "%s%s", b.len ? " " : "", argv[j]);
  if (j > i + 1) {
    sp->joined[sp->njoined] = kvr_buf_steal(&b);
    sp->vargv[sp->vargc++] = sp->joined[sp->njoined++];
  }
  kvr_buf_free(&b);
  return j - 1;
}

static bool nargs_row(const kvr_cli_opt_t *r) {
  return strcmp(r->name, "goodput") == 0 || strcmp(r->name, "metadata") == 0;
}

static int split(int argc, char **argv, split_t *sp, char *err, size_t errlen) {
  memset(sp, 0, sizeof(*sp));
  sp->kargv = kvr_xcalloc((size_t)argc + 1, sizeof(char *));
  sp->vargv = kvr_xcalloc((size_t)argc + 1, sizeof(char *));
  sp->kargv[sp->kargc++] = sp->vargv[sp->vargc++] = argc > 0 ? argv[0] : "bench";
  bool help = false; /* -h, --help and --version win wherever they stand (src/base/cli.h) */
  for (int i = 1; i < argc; i++)
    help |= strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 ||
            strcmp(argv[i], "--version") == 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_value = strchr(a, '=') != NULL;
    const kvr_cli_opt_t *r = row_of(&vllm_cmd, a);
    if (r != NULL) {
      sp->vseen[r - vllm_options] = true;
      sp->vargv[sp->vargc++] = argv[i];
      if (r->kind != KVR_CLI_SWITCH && !has_value && nargs_row(r))
        i = join_values(sp, argc, argv, i);
      else if (r->kind != KVR_CLI_SWITCH && !has_value && i + 1 < argc)
        sp->vargv[sp->vargc++] = argv[++i];
      continue;
    }
    r = row_of(&kvr_bench_options_cmd, a);
    const char *why =
        r == NULL && !help && strncmp(a, "--", 2) == 0 ? refusal(a + 2, strcspn(a + 2, "=")) : NULL;
    if (why != NULL) {
      snprintf(err, errlen, "%.*s: a vllm bench serve flag with no kvrouter equivalent: %s",
               (int)strcspn(a, "="), a, why);
      return KVR_EINVAL;
    }
    if (r != NULL)
      sp->kseen[r - options] = true;
    sp->kargv[sp->kargc++] = argv[i];
    if (r != NULL && r->kind != KVR_CLI_SWITCH && !has_value && i + 1 < argc)
      sp->kargv[sp->kargc++] = argv[++i];
  }
  return 0;
}

/* Whether the kvrouter flag (kvr) or the vllm flag name was given. */
static bool given(const split_t *sp, bool kvr, const char *name) {
  const kvr_cli_cmd_t *cmd = kvr ? &kvr_bench_options_cmd : &vllm_cmd;
  for (size_t i = 0; i < cmd->nopts; i++)
    if (cmd->opts[i].kind != KVR_CLI_SECTION && strcmp(cmd->opts[i].name, name) == 0)
      return kvr ? sp->kseen[i] : sp->vseen[i];
  return false;
}

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    snprintf(err, errlen, __VA_ARGS__);                                                            \
    return KVR_EINVAL;                                                                             \
  } while (0)

/* A setting given in both spellings is an error: which one was meant? */
static int twins(const split_t *sp, char *err, size_t errlen) {
  static const char *const pairs[][2] = {
      {"request-rate", "rates"},
      {"request-rate", "concurrency"},
      {"num-warmups", "warmup"},
      {"label", "labels"},
      {"dataset-name", "workload"},
      {"dataset-path", "workload"},
      {"base-url", "url"},
      {"host", "url"},
      {"port", "url"},
      {"endpoint", "url"},
      {"backend", "api"},
      {"endpoint", "api"},
      {"ignore-eos", "no-ignore-eos"},
      {"timed-trace-chunk-hash-size", "trace-block-tokens"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(pairs); i++)
    if (given(sp, false, pairs[i][0]) && given(sp, true, pairs[i][1]))
      FAIL("--%s: the setting --%s gives too; give one of them", pairs[i][0], pairs[i][1]);
  return 0;
}

/* vllm's float() of a rate: a number > 0, or inf. */
static int parse_rate(const char *text, double *out) {
  char *end;
  double r = strtod(text, &end);
  if (end == text || *end != '\0' || !(r > 0) || isnan(r))
    return KVR_EINVAL;
  *out = r;
  return 0;
}

/* The API of vllm's --backend and --endpoint into *api: 0 completions, 1 chat, -1 none given. */
static int vllm_api(const vllm_args_t *v, int *api, char *err, size_t errlen) {
  int b = -1, e = -1;
  if (v->backend != NULL) {
    if (strcmp(v->backend, "openai") == 0 || strcmp(v->backend, "vllm") == 0)
      b = 0;
    else if (strcmp(v->backend, "openai-chat") == 0)
      b = 1;
    else
      FAIL("--backend: '%s' has no kvrouter equivalent (openai and vllm: OpenAI completions; "
           "openai-chat: chat)",
           v->backend);
  }
  if (v->endpoint != NULL) {
    if (strcmp(v->endpoint, "/v1/completions") == 0)
      e = 0;
    else if (strcmp(v->endpoint, "/v1/chat/completions") == 0)
      e = 1;
    else
      FAIL("--endpoint: '%s' is neither /v1/completions nor /v1/chat/completions", v->endpoint);
  }
  if (b >= 0 && e >= 0 && b != e)
    FAIL("--endpoint: %s is not the API of --backend %s", v->endpoint, v->backend);
  *api = b >= 0 ? b : e;
  return 0;
}

/* vllm's defaults where a vllm dataset is asked for and kvrouter's differ, unless the flag is
 * given in either spelling: its backend (openai: completions), 1,000 prompts, ShareGPT at rate inf
 * without ignore_eos (vllm sets it for its random datasets and timed_trace only). */
static void vllm_defaults(kvr_runner_opts_t *o, const vllm_args_t *v, const split_t *sp, int api) {
  if (v->dataset_name == NULL)
    return;
  if (api < 0 && !given(sp, true, "api"))
    o->lg.api = KVR_API_COMPLETIONS;
  if (!given(sp, true, "num-prompts"))
    o->lg.num_prompts = 1000;
  if (o->wl.kind != KVR_WL_FILE)
    return;
  if (!o->nrates && !o->nconc && !o->search) {
    o->rates[0] = INFINITY;
    o->nrates = 1;
  }
  if (!given(sp, true, "no-ignore-eos"))
    o->lg.ignore_eos = v->ignore_eos;
}

/* --base-url, --host, --port and --endpoint as kvrouter's --url (a heap copy in o->lg). */
static int vllm_url(kvr_runner_opts_t *o, const vllm_args_t *v, char *err, size_t errlen) {
  if (v->base_url == NULL && v->host == NULL && v->port == 0 && v->endpoint == NULL)
    return 0;
  if (v->base_url != NULL && (v->host != NULL || v->port != 0))
    FAIL("--%s: vllm ignores it beside --base-url; give one of them", v->host ? "host" : "port");
  kvr_buf_t b = KVR_BUF_INIT;
  if (v->base_url != NULL) {
    kvr_buf_puts(&b, v->base_url);
  } else {
    const char *h = v->host ? v->host : "127.0.0.1";
    bool v6 = strchr(h, ':') != NULL && h[0] != '[';
    kvr_buf_printf(&b, "http://%s%s%s:%u", v6 ? "[" : "", h, v6 ? "]" : "",
                   v->port ? v->port : 8000u);
  }
  while (b.len > 0 && b.data[b.len - 1] == '/')
    b.data[--b.len] = '\0';
  if (v->endpoint != NULL)
    kvr_buf_puts(&b, v->endpoint);
  free(o->lg.url_owned);
  o->lg.url = o->lg.url_owned = kvr_buf_steal(&b);
  return 0;
}

/* --dataset-name, --dataset-path and the dataset flags. */
static int vllm_dataset(kvr_runner_opts_t *o, const vllm_args_t *v, const split_t *sp, char *err,
                        size_t errlen) {
  const char *n = v->dataset_name;
  bool sharegpt = n && strcmp(n, "sharegpt") == 0, tt = n && strcmp(n, "timed_trace") == 0;
  if (n != NULL && !sharegpt && !tt)
    FAIL("--dataset-name: '%s' is a vllm dataset kvrouter bench does not have (it takes sharegpt "
         "and timed_trace; its own workloads: --workload)",
         n);
  if (n != NULL && v->dataset_path == NULL)
    FAIL("--dataset-name: %s needs --dataset-path", n);
  if (n == NULL && v->dataset_path != NULL)
    FAIL("--dataset-path: needs --dataset-name sharegpt or timed_trace");
  if (n != NULL) {
    o->wl.kind = tt ? KVR_WL_TRACE : KVR_WL_FILE;
    o->wl.path = v->dataset_path;
    o->wl.sharegpt_vllm = sharegpt;
  }
  unsigned out = v->output_len ? v->output_len : v->sharegpt_output_len;
  if (out && !(o->wl.kind == KVR_WL_FILE && o->wl.sharegpt_vllm))
    FAIL("--%s: applies to --dataset-name sharegpt (--workload sharegpt:PATH) here",
         v->output_len ? "output-len" : "sharegpt-output-len");
  o->wl.sharegpt_output_len = out;
  if ((v->no_oversample || v->disable_shuffle) && !tt)
    FAIL("--%s: kvrouter bench walks a ShareGPT file from a seeded offset per level, around when "
         "it runs out; vllm's order and count cannot be kept",
         v->no_oversample ? "no-oversample" : "disable-shuffle");
  return 0;
}

/* The --timed-trace-* flags and --self-timed. */
static int vllm_trace(kvr_runner_opts_t *o, const vllm_args_t *v, const split_t *sp, char *err,
                      size_t errlen) {
  static const char *const fields[] = {"timestamp", "input_length", "output_length", "hash_ids"};
  static const char *const flags[] = {"timestamp", "input-length", "output-length", "hash-ids"};
  bool trace = o->wl.kind == KVR_WL_TRACE;
  bool tt = v->dataset_name && strcmp(v->dataset_name, "timed_trace") == 0;
  for (size_t i = 0; i < 4; i++) {
    if (v->tt_label[i] != NULL && strcmp(v->tt_label[i], fields[i]) != 0)
      FAIL("--timed-trace-label-%s: kvrouter reads the format's own field names (timestamp, "
           "input_length, output_length, hash_ids), not '%s'",
           flags[i], v->tt_label[i]);
    if (v->tt_label[i] != NULL && !trace)
      FAIL("--timed-trace-label-%s: needs a trace (--dataset-name timed_trace)", flags[i]);
  }
  if ((v->chunk || v->sec_mult > 0) && !trace)
    FAIL("--%s: needs a trace (--dataset-name timed_trace or --workload trace:FILE)",
         v->chunk ? "timed-trace-chunk-hash-size" : "timed-trace-sec-multiplier");
  if (v->self_timed && !tt)
    FAIL("--self-timed: applies to --dataset-name timed_trace only");
  if (v->chunk)
    o->wl.trace_block_tokens = v->chunk;
  else if (tt && !given(sp, true, "trace-block-tokens"))
    o->wl.trace_block_tokens = 16; /* vllm's default chunk */
  bool load = o->nrates || o->nconc || o->search;
  if (tt && v->request_rate != NULL)
    FAIL("--request-rate: vllm ignores it over a timed_trace (its own times, --self-timed); "
         "kvrouter bench scales a trace to a rate with --rates");
  if ((v->sec_mult > 0 || v->self_timed) && load)
    FAIL("--%s: a trace at its own times takes no --rates, --concurrency or --search",
         v->self_timed ? "self-timed" : "timed-trace-sec-multiplier");
  if (trace && !load && (tt || v->sec_mult > 0)) {
    o->lg.self_timed = v->sec_mult > 0 ? v->sec_mult : 1.0;
    o->rates[0] = 0; /* the level: the trace's own times (kvr_loadgen_run_level) */
    o->nrates = 1;
  }
  o->lg.trace_first = trace && (tt || given(sp, true, "num-prompts"));
  return 0;
}

/* --percentile-metrics and --metric-percentiles. */
static int vllm_percentiles(kvr_result_opts_t *r, const vllm_args_t *v, char *err, size_t errlen) {
  static const char *const names[KVR_METRIC_COUNT] = {
      "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"};
  char buf[512];
  if (v->percentile_metrics != NULL) {
    snprintf(buf, sizeof(buf), "%s", v->percentile_metrics);
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
      size_t m = 0;
      while (m < KVR_METRIC_COUNT && strcmp(t, names[m]) != 0)
        m++;
      if (m == KVR_METRIC_COUNT)
        FAIL("--percentile-metrics: '%s' is not one of ttft, tpot, itl, e2el, client_queue_time, "
             "e2el_including_client_queue",
             t);
      r->metrics |= 1u << m;
    }
  }
  if (v->metric_percentiles != NULL) {
    snprintf(buf, sizeof(buf), "%s", v->metric_percentiles);
    char *save = NULL, *end;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      double p = strtod(t, &end);
      while (*end == ' ')
        end++;
      if (end == t || *end != '\0' || !(p >= 0 && p <= 100))
        FAIL("--metric-percentiles: '%s' is not a percentile in [0, 100]", t);
      if (r->npct == KVR_RESULT_MAX_PCT)
        FAIL("--metric-percentiles: at most %d", KVR_RESULT_MAX_PCT);
      r->pct[r->npct++] = p;
    }
  }
  return 0;
}

/* --goodput KEY:MS [KEY:MS...] (vllm's parse_goodput and check_goodput_args). */
static int vllm_goodput(kvr_result_opts_t *r, const char *text, char *err, size_t errlen) {
  static const char *const keys[] = {"ttft", "tpot", "e2el"};
  char buf[512], *save = NULL, *end;
  snprintf(buf, sizeof(buf), "%s", text);
  r->goodput = true;
  r->goodput_ms[0] = r->goodput_ms[1] = r->goodput_ms[2] = -1;
  for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
    char *colon = strchr(t, ':');
    double ms = colon ? strtod(colon + 1, &end) : 0;
    if (colon == NULL || strchr(colon + 1, ':') || end == colon + 1 || *end != '\0')
      FAIL("--goodput: '%s' is not KEY:VALUE (a metric name and milliseconds)", t);
    *colon = '\0';
    size_t k = 0;
    while (k < 3 && strcmp(t, keys[k]) != 0)
      k++;
    if (k == 3)
      FAIL("--goodput: '%s' is not one of ttft, tpot, e2el", t);
    if (!(ms >= 0))
      FAIL("--goodput: %s: the value must be >= 0 ms", t);
    r->goodput_ms[k] = ms;
  }
  return 0;
}

/* The result file flags and --metadata. */
static int vllm_result(kvr_result_opts_t *r, const vllm_args_t *v, char *err, size_t errlen) {
  if (v->goodput != NULL && vllm_goodput(r, v->goodput, err, errlen) != 0)
    return KVR_EINVAL;
  if (vllm_percentiles(r, v, err, errlen) != 0)
    return KVR_EINVAL;
  if ((v->result_dir || v->result_filename) && !v->save_result && !v->append_result)
    FAIL("--%s: vllm writes no file without --save-result or --append-result",
         v->result_dir ? "result-dir" : "result-filename");
  r->save_result = v->save_result;
  r->append_result = v->append_result;
  r->save_detailed = v->save_detailed;
  r->result_dir = v->result_dir;
  r->result_filename = v->result_filename;
  r->backend = v->backend;
  if (v->metadata == NULL)
    return 0;
  char buf[KVR_RESULT_METADATA_MAX], *save = NULL;
  snprintf(buf, sizeof(buf), "%s", v->metadata);
  size_t len = 0;
  for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
    if (strchr(t, '=') == NULL || t[0] == '=')
      FAIL("--metadata: '%s' is not KEY=VALUE", t);
    int w = snprintf(r->metadata + len, sizeof(r->metadata) - len, "%s\n", t);
    if (w < 0 || (size_t)w >= sizeof(r->metadata) - len)
      FAIL("--metadata: more than %d characters", KVR_RESULT_METADATA_MAX - 1);
    len += (size_t)w;
  }
  return 0;
}

/* Everything vllm's flags mean, applied over the kvrouter settings in o. */
static int vllm_apply(kvr_runner_opts_t *o, const vllm_args_t *v, const split_t *sp, char *err,
                      size_t errlen) {
  if (twins(sp, err, errlen) != 0)
    return KVR_EINVAL;
  if (v->request_rate != NULL) {
    if (parse_rate(v->request_rate, &o->rates[0]) != 0)
      FAIL("--request-rate: '%s' is not a rate > 0 or inf", v->request_rate);
    o->nrates = 1;
  }
  if (v->ready_timeout != 0)
    FAIL(
        "--ready-check-timeout-sec: kvrouter bench does not wait for the endpoint (vllm's default, "
        "0, is accepted)");
  if (given(sp, false, "max-concurrency"))
    o->lg.max_concurrency = v->max_concurrency;
  if (given(sp, false, "num-warmups"))
    o->lg.warmup = v->num_warmups;
  if (vllm_dataset(o, v, sp, err, errlen) != 0 || vllm_trace(o, v, sp, err, errlen) != 0)
    return KVR_EINVAL;
  int api;
  if (vllm_api(v, &api, err, errlen) != 0)
    return KVR_EINVAL;
  if (api >= 0)
    o->lg.api = api == 1 ? KVR_API_CHAT : KVR_API_COMPLETIONS;
  vllm_defaults(o, v, sp, api);
  if (v->ignore_eos)
    o->lg.ignore_eos = true;
  if (vllm_url(o, v, err, errlen) != 0)
    return KVR_EINVAL;
  if (v->label != NULL && strlen(v->label) >= sizeof(((kvr_run_t *)0)->label))
    FAIL("--label: '%s' is longer than 63 characters", v->label);
  if (v->label != NULL) {
    o->labels[0] = kvr_xstrdup(v->label);
    o->nlabels = 1;
  }
  if (v->disable_tqdm)
    o->quiet = true;
  return vllm_result(&o->lg.result, v, err, errlen);
}

#undef FAIL

/* Parses argv into o through both tables. Returns 0, KVR_CLI_EXIT (help or version printed to out)
 * or KVR_EINVAL with one line in err. */
/* A model fleet (--model-fleet) sets its workers from its spec: --workers given beside it would be
 * dropped without a word, so it is an error, whether the spec came before it on this command line
 * or from a study cell's scenario. (--worker-blocks applies: one value per worker of the fleet.) */
static int fleet_conflicts(const kvr_runner_opts_t *o, const split_t *sp, char *err,
                           size_t errlen) {
  if (o->vc.model_fleet == NULL || !given(sp, true, "workers"))
    return 0;
  snprintf(err, errlen,
           "--workers: a model fleet (--model-fleet) sets its own workers; leave --workers out");
  return KVR_EINVAL;
}

static int parse_all(kvr_runner_opts_t *o, int argc, char **argv, FILE *out, char *err,
                     size_t errlen) {
  split_t sp;
  int rc = split(argc, argv, &sp, err, errlen);
  if (rc == 0)
    rc = kvr_cli_parse(&kvr_bench_options_cmd, o, sp.kargc, sp.kargv, NULL, out, err, errlen);
  if (rc == 0) {
    vllm_args_t v;
    memset(&v, 0, sizeof(v));
    rc = kvr_cli_parse(&vllm_cmd, &v, sp.vargc, sp.vargv, NULL, out, err, errlen);
    if (rc == 0)
      rc = vllm_apply(o, &v, &sp, err, errlen);
  }
  if (rc == 0)
    rc = fleet_conflicts(o, &sp, err, errlen);
  split_free(&sp);
  return rc;
}

/* Prints s wrapped at 100 columns, indented by 6. */
static void print_wrapped(FILE *out, const char *s) {
  size_t col = 0;
  while (*s) {
    while (*s == ' ')
      s++;
    size_t w = strcspn(s, " ");
    if (col > 0 && 6 + col + 1 + w > 100) {
      fputc('\n', out);
      col = 0;
    }
    fprintf(out, "%s%.*s", col ? " " : "      ", (int)w, s);
    col += (col ? 1 : 0) + w;
    s += w;
  }
  fputc('\n', out);
}

static void print_vllm_help(FILE *out) {
  fputs(
      "\nvllm bench serve's spellings (bench/loadgen/README.md maps every flag; the ones with no\n"
      "kvrouter equivalent are refused by name):\n",
      out);
  for (size_t i = 0; i < KVR_ARRAY_SIZE(vllm_options); i++) {
    const kvr_cli_opt_t *r = &vllm_options[i];
    fprintf(out, "  --%s%s%s\n", r->name, r->arg ? " " : "", r->arg ? r->arg : "");
    print_wrapped(out, r->help);
  }
}

int kvr_bench_options_main(kvr_runner_opts_t *o, int argc, char **argv) {
  char err[1024];
  int rc = parse_all(o, argc, argv, stdout, err, sizeof(err));
  if (rc == KVR_CLI_EXIT) {
    fflush(stdout);
    return 0;
  }
  return rc != 0 ? kvr_cli_fail(&kvr_bench_options_cmd, "%s", err) : KVR_CLI_CONTINUE;
}

int kvr_bench_options_parse(kvr_runner_opts_t *o, int argc, char **argv, char *err, size_t errlen) {
  /* The engine prints --help or --version where it finds them; here they are not asked of a
   * person, so what it prints is dropped and the flag is an error. */
  FILE *sink = fopen("/dev/null", "w");
  int rc = parse_all(o, argc, argv, sink ? sink : stderr, err, errlen);
  if (sink != NULL)
    fclose(sink);
  if (rc != KVR_CLI_EXIT)
    return rc;
  snprintf(err, errlen, "--help, --version: not here (see kvrouter bench --help)");
  return KVR_EINVAL;
}

void kvr_bench_options_free(kvr_runner_opts_t *o) {
  kvr_cli_free(&kvr_bench_options_cmd, o);
  free(o->lg.url_owned);
  o->lg.url_owned = NULL;
}

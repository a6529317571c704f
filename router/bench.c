/* bench.c -- `kvrouter bench` and `kvrouter bench routing`: option tables, signals and wiring.
 *
 * `kvrouter bench`: the option engine (src/base/cli.h) fills a kvr_runner_opts_t from the table
 * below (kvr_runner_opts_default() holds the defaults --help prints), kvr_runner_opts_check()
 * applies the rules between flags, then a kvr_runner_t (bench/run/runner.h) runs the labels and
 * levels on a private uv loop and writes the report. SIGINT/SIGTERM stop the current level; the
 * report of what finished is still written and the exit status is 130.
 *
 * `kvrouter bench routing`: the routing-decision micro-benchmark (bench/routing/route_bench.h),
 * its options through the same engine.
 */

#include "commands.h"
#include "engine_options.h"

#include "base/buf.h"
#include "base/cli.h"
#include "base/kvr.h"
#include "base/log.h"
#include "bench/report/report.h"
#include "bench/routing/route_bench.h"
#include "bench/run/runner.h"
#include "bench/vcluster/study.h"
#include "policies/policy.h"
#include "proto/prompt.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

/* ---- `kvrouter bench` options ---- */

static int set_workload(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                        char *err, size_t errlen) {
  (void)o;
  (void)nth;
  if (kvr_workload_parse_kind(text, &((kvr_runner_opts_t *)base)->wl) == 0)
    return 0;
  snprintf(err, errlen,
           "'%s' is not one of multiturn, documents, control, agentic, hot-prefix, file:PATH",
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
  static const char *const kinds[] = {"multiturn", "documents", "control",
                                      "file:",     "agentic",   "hot-prefix"};
  const kvr_workload_opts_t *wl = &((const kvr_runner_opts_t *)base)->wl;
  (void)o;
  snprintf(buf, len, "%s%s", kinds[wl->kind], wl->kind == KVR_WL_FILE ? wl->path : "");
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
     .help = "multiturn | documents | control | agentic | hot-prefix | file:PATH"},
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

static const kvr_cli_cmd_t bench_cmd = {
    .name = "bench",
    .usage = "--url URL [options]",
    .about = "Open-loop load generator for OpenAI-compatible endpoints (the router, one worker,\n"
             "vLLM). `kvrouter bench routing --help`: the routing-decision micro-benchmark.",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
};

/* ---- `kvrouter bench routing` options ---- */

#define R(field) KVR_CLI_FIELD(kvr_route_bench_opts_t, field)

static const kvr_cli_opt_t route_options[] = {
    {KVR_CLI_UINT, "prompt-kib", R(prompt_kib), .arg = "N", KVR_CLI_RANGE(1, 16384),
     .help = "size of the synthetic chat prompt in KiB"},
    {KVR_CLI_UINT, "workers", R(workers), .arg = "N", KVR_CLI_RANGE(1, KVR_MAX_WORKERS),
     .help = "number of workers"},
    {KVR_CLI_UINT, "blocks", R(blocks), .arg = "N",
     .help = "blocks pre-indexed over the workers (at least one per worker)"},
    {KVR_CLI_UINT, "decisions", R(decisions), .arg = "N", KVR_CLI_MIN(1),
     .help = "timed decisions"},
    {KVR_CLI_UINT, "block-chars", R(block_chars), .arg = "N",
     KVR_CLI_RANGE(1, KVR_PROMPT_BLOCK_CHARS_MAX), .help = "block size in bytes"},
    {KVR_CLI_STR, "policy", R(policy), .arg = "NAME", .flags = KVR_CLI_NONEMPTY,
     .help = "policy to time (see the list below)"},
};

static const kvr_cli_cmd_t route_cmd = {
    .name = "bench routing",
    .usage = "[options]",
    .about = "Times what one routing decision costs on the loop thread: prompt features and\n"
             "hashing, cache-index match, policy select (warm and cold caches), plus JSON parse\n"
             "and index insert. Prints a Markdown table (see policies/README.md).",
    .opts = route_options,
    .nopts = KVR_ARRAY_SIZE(route_options),
    .epilog = kvr_policy_print_names,
};

static int route_bench_main(int argc, char **argv) {
  kvr_route_bench_opts_t o;
  kvr_route_bench_opts_default(&o);
  int rc = kvr_cli_main(&route_cmd, &o, argc, argv, NULL);
  if (rc != KVR_CLI_CONTINUE)
    return rc;
  if (kvr_policy_find(o.policy) == NULL) {
    char names[256];
    kvr_policy_names(names, sizeof(names));
    return kvr_cli_fail(&route_cmd, "--policy: unknown policy '%s' (valid: %s)", o.policy, names);
  }
  if (o.blocks < o.workers) /* each worker's share is its index capacity */
    return kvr_cli_fail(&route_cmd, "--blocks: at least one per worker (%zu), got %llu", o.workers,
                        (unsigned long long)o.blocks);
  return kvr_route_bench_run(&o);
}

/* ---- running ---- */

static void on_signal(uv_signal_t *s, int signum) {
  fprintf(stderr, "\nkvrouter bench: signal %d, stopping (a partial report is written)\n", signum);
  kvr_runner_interrupt(s->data);
}

/* The labels and the report, with Ctrl-C stopping the current level. Returns the exit status. */
static int run_labels(uv_loop_t *loop, kvr_runner_t *r) {
  /* Virtual time never runs the loop, so a signal would wait for the end: the default action
   * (the process ends, no report) is the honest one for a run of seconds. */
  bool catch_signals = !kvr_runner_virtual(r);
  uv_signal_t sigint, sigterm;
  uv_signal_init(loop, &sigint);
  uv_signal_init(loop, &sigterm);
  sigint.data = sigterm.data = r;
  if (catch_signals) {
    uv_signal_start(&sigint, on_signal, SIGINT);
    uv_signal_start(&sigterm, on_signal, SIGTERM);
  }
  char err[512];
  int status = 0;
  if (kvr_runner_run(r, err, sizeof(err)) != 0) {
    fprintf(stderr, "kvrouter bench: %s\n", err);
    status = 1;
  }
  if (kvr_runner_interrupted(r))
    status = 130;
  if (kvr_runner_report(r, stdout, err, sizeof(err)) != 0) {
    fprintf(stderr, "kvrouter bench: %s\n", err);
    status = status ? status : 1;
  }
  uv_close((uv_handle_t *)&sigint, NULL);
  uv_close((uv_handle_t *)&sigterm, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  return status;
}

/* A private loop around one runner; every way out frees what was set up. */
static int run(kvr_runner_opts_t *o) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  kvr_runner_t *r = NULL;
  char err[512];
  int rc = kvr_runner_new(&loop, o, &r, err, sizeof(err));
  int status = rc == 0 ? 0 : rc == KVR_EINVAL ? 2 : 1;
  if (rc != 0)
    fprintf(stderr, "kvrouter bench: %s\n", err);
  else
    status = run_labels(&loop, r);
  kvr_runner_free(r);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0)
    fprintf(stderr, "kvrouter bench: warning: loop handles left open\n");
  return status;
}

/* The command line as the report shows it: pasted back into a shell, it runs the same bench. */
static char *join_argv(int argc, char **argv) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_shell_join(argc, argv, &b);
  return kvr_buf_steal(&b);
}

static void raise_fd_limit(void) {
  /* 1,000 concurrent streams need more descriptors than the usual soft limit of 1,024. */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static int check_and_run(kvr_runner_opts_t *o, int argc, char **argv) {
  char err[512];
  if (kvr_runner_opts_check(o, err, sizeof(err)) != 0)
    return kvr_cli_fail(&bench_cmd, "%s", err);
  o->lg.progress = o->quiet ? NULL : stderr;
  o->lg.progress_tty = isatty(STDERR_FILENO);
  char *cmd = join_argv(argc, argv);
  o->command = cmd;
  raise_fd_limit();
  if (o->virt)
    kvr_log_set_level(KVR_LOG_WARN); /* the virtual router's worker and scrape lines are noise */
  int status = run(o);
  free(cmd);
  return status;
}

/* ---- `kvrouter bench study` ---- */

#define S(field) KVR_CLI_FIELD(kvr_study_opts_t, field)

static const kvr_cli_opt_t study_options[] = {
    {KVR_CLI_LIST, "scenarios", KVR_CLI_ARRAY(kvr_study_opts_t, scenarios, nscenarios),
     .arg = "LIST", .elem = KVR_CLI_STR,
     .help = "scenarios (default all: multiturn, documents, control, agentic, hot-prefix, bursty, "
             "mixed-fleet)"},
    {KVR_CLI_LIST, "policies", KVR_CLI_ARRAY(kvr_study_opts_t, policies, npolicies), .arg = "LIST",
     .elem = KVR_CLI_STR,
     .help = "policies, the first the baseline (default every policy, then the oracle)"},
    {KVR_CLI_UINT, "seeds", S(seeds), .arg = "N", KVR_CLI_RANGE(1, 100),
     .help = "seeds per scenario: --seed, --seed + 1, ..."},
    {KVR_CLI_UINT, "seed", S(seed), .arg = "N", .help = "the first seed"},
    {KVR_CLI_UINT, "jobs", S(jobs), .arg = "N", KVR_CLI_RANGE(0, 64),
     .help = "cells run at once, one thread each; 0 = one per core"},
    {KVR_CLI_DOUBLE, "search-resolution", S(resolution), .arg = "R", KVR_CLI_GT(0),
     .help = "max-SLO-rate search resolution, req/s"},
    {KVR_CLI_STR, "out", S(out), .arg = "DIR", .help = "results folder"},
    {KVR_CLI_SWITCH, "quiet", S(quiet), .set = 1, .help = "no line per finished cell"},
};

static void print_study_epilog(FILE *out) {
  fputs(
      "\nEverything after -- goes to every cell's kvrouter bench --virtual after the study's own\n"
      "flags (later flags win), e.g. kvrouter bench study -- --scrape-interval-ms 4000\n",
      out);
}

static const kvr_cli_cmd_t study_cmd = {
    .name = "bench study",
    .usage = "[options] [-- BENCH-OPTIONS...]",
    .about = "Every policy on every scenario over several seeds in virtual time (kvrouter bench\n"
             "--virtual --search per scenario and seed, run in parallel), summed up in one table:\n"
             "each policy's mean max SLO-compliant rate with its spread, and kv_aware's ratio to\n"
             "round_robin, to the best reference policy and to the oracle.",
    .opts = study_options,
    .nopts = KVR_ARRAY_SIZE(study_options),
    .epilog = print_study_epilog,
};

int kvr_bench_study_cell(int argc, char **argv, kvr_results_t **out, char *err, size_t errlen) {
  *out = NULL;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  char perr[512];
  int rest = 0;
  int rc = kvr_cli_parse(&bench_cmd, &o, argc, argv, NULL, NULL, perr, sizeof(perr));
  (void)rest;
  if (rc == 0 && kvr_runner_opts_check(&o, perr, sizeof(perr)) != 0)
    rc = KVR_EINVAL;
  if (rc != 0) {
    snprintf(err, errlen, "kvrouter bench: %s", perr);
    kvr_cli_free(&bench_cmd, &o);
    return 2;
  }
  char *cmd = join_argv(argc, argv);
  o.command = cmd;
  o.lg.progress = NULL;
  uv_loop_t loop;
  uv_loop_init(&loop);
  kvr_runner_t *r = NULL;
  int status = 0;
  if ((rc = kvr_runner_new(&loop, &o, &r, perr, sizeof(perr))) != 0 ||
      (rc = kvr_runner_run(r, perr, sizeof(perr))) != 0) {
    snprintf(err, errlen, "%s", perr);
    status = rc == KVR_EINVAL ? 2 : 1;
  }
  FILE *devnull = fopen("/dev/null", "w");
  if (r != NULL && kvr_runner_report(r, devnull ? devnull : stdout, perr, sizeof(perr)) != 0) {
    snprintf(err, errlen, "%s", perr);
    status = status ? status : 1;
  }
  if (devnull)
    fclose(devnull);
  if (r != NULL)
    *out = kvr_runner_take_results(r);
  kvr_runner_free(r);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  free(cmd);
  kvr_cli_free(&bench_cmd, &o);
  return status;
}

static int study_main(int argc, char **argv) {
  kvr_study_opts_t o;
  kvr_study_opts_default(&o);
  int rest;
  int rc = kvr_cli_main(&study_cmd, &o, argc, argv, &rest);
  if (rc == KVR_CLI_CONTINUE) {
    o.extra = argv + rest;
    o.nextra = argc - rest;
    kvr_log_set_level(KVR_LOG_WARN);
    char err[768];
    rc = kvr_study_run(&o, kvr_bench_study_cell, stdout, NULL, err, sizeof(err));
    if (rc == 2)
      rc = kvr_cli_fail(&study_cmd, "%s", err);
    else if (rc != 0)
      fprintf(stderr, "kvrouter bench study: %s\n", err);
  }
  kvr_cli_free(&study_cmd, &o);
  return rc;
}

int kvr_bench_main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "routing") == 0)
    return route_bench_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "study") == 0)
    return study_main(argc - 1, argv + 1);
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  int rc = kvr_cli_main(&bench_cmd, &o, argc, argv, NULL);
  if (rc == KVR_CLI_CONTINUE)
    rc = check_and_run(&o, argc, argv);
  kvr_cli_free(&bench_cmd, &o);
  return rc;
}

/* sim.c -- `kvrouter sim`: the option table, signals and the loop around kvr_sim_server_t.
 *
 * The flags are one table of the option engine (src/base/cli.h) over sim_cli_t, which holds the
 * server's options (kvr_sim_server_opts_default() fills them, and --help prints those defaults),
 * the offline tools' options and the log level. After parsing: --print-costs and --calibrate run
 * the offline tools of bench/sim/sim_calibrate.h and return without listening; otherwise the
 * server listens until SIGINT/SIGTERM. A bad flag or value is one line on stderr naming it and exit
 * status 2.
 */

#include "commands.h"

#include "base/cli.h"
#include "base/kvr.h"
#include "base/log.h"
#include "bench/run/engine_options.h"
#include "bench/sim/sim_calibrate.h"
#include "bench/sim/sim_engine.h"
#include "bench/sim/sim_server.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define SERVED_MAX 64 /* --served-model-name values kept */
#define LORA_MODULES_MAX 64

typedef struct sim_cli_s {
  kvr_sim_server_opts_t opts;
  const char *served[SERVED_MAX]; /* --served-model-name words, into argv (every occurrence) */
  size_t nserved;
  kvr_sim_lora_module_t lora_modules[LORA_MODULES_MAX]; /* --lora-modules (every occurrence) */
  size_t nlora_modules;
  bool enable_lora;
  uint32_t max_loras, max_cpu_loras; /* max_cpu_loras 0: max_loras */
  uint32_t api_server_count;         /* accepted; the sim is one API server */
  kvr_sim_calibrate_opts_t cal;
  bool print_costs, calibrate;
  kvr_log_level_t log_level;
  const char *kv_events_config; /* vLLM's --kv-events-config JSON, parsed by check() */
} sim_cli_t;

/* --served-model-name: each word after the flag is one name (argv is expanded first, see
 * expand_nargs, which also counts the words of occurrences before the last: argparse keeps only
 * the last occurrence's list, and kvr_sim_main drops the others). */
static int set_served(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                      size_t errlen) {
  sim_cli_t *cli = base;
  (void)o;
  (void)nth;
  if (text[0] == '\0') {
    snprintf(err, errlen, "a name must not be empty");
    return KVR_EINVAL;
  }
  if (cli->nserved == SERVED_MAX) {
    snprintf(err, errlen, "at most %d names", SERVED_MAX);
    return KVR_EINVAL;
  }
  cli->served[cli->nserved++] = text;
  return 0;
}

/* --lora-modules: one adapter per word (sim_lora.h's kvr_sim_lora_module_parse). */
static int set_lora_module(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                           char *err, size_t errlen) {
  sim_cli_t *cli = base;
  (void)o;
  (void)nth;
  if (cli->nlora_modules == LORA_MODULES_MAX) {
    snprintf(err, errlen, "at most %d adapters", LORA_MODULES_MAX);
    return KVR_EINVAL;
  }
  kvr_sim_lora_module_t m;
  if (kvr_sim_lora_module_parse(text, &m, err, errlen) != 0)
    return KVR_EINVAL;
  cli->lora_modules[cli->nlora_modules++] = m;
  return 0;
}

#define F(field) KVR_CLI_FIELD(sim_cli_t, field)
#define E(field) F(opts.engine.field)
#define FAULT_NAME(name, str) str,

static const char *const fault_names[] = {KVR_SIM_FAULT_MAP(FAULT_NAME) NULL};
static const char *const log_names[] = {"debug", "info", "warn", "error", "off", NULL};
static const char *const encoding_names[] = {"map", "array", NULL}; /* kvr_kv_encoding_t order */

static const kvr_cli_opt_t options[] = {
    {KVR_CLI_STR, "listen", F(opts.listen), .arg = "HOST:PORT",
     .help = "HOST:PORT to serve on; port 0 picks one"},
    {KVR_CLI_STR, "admin-listen", F(opts.admin_listen), .arg = "HOST:PORT",
     .help = "optional second HOST:PORT serving the same API, reachable during the refuse fault"},
    {KVR_CLI_STR, "model", F(opts.model), .arg = "NAME",
     .help = "the model (vLLM's --model): its path is the root of the base model's cards, and its "
             "name when --served-model-name is not given"},
    {KVR_CLI_CUSTOM, "served-model-name", .arg = "NAME [NAME ...]", .parse = set_served,
     .flags = KVR_CLI_NODEFAULT,
     .help = "vLLM's flag: the names the base model is served under, each a card of "
             "GET /v1/models and a name requests may give; the first is the replies' and the "
             "metrics' model name (default: --model)"},
    {KVR_CLI_SWITCH, "enable-lora", F(enable_lora), .set = 1,
     .help = "vLLM's flag: serve LoRA adapters (bench/sim/README.md, LoRA)"},
    {KVR_CLI_CUSTOM, "lora-modules", .arg = "ITEM [ITEM ...]", .parse = set_lora_module,
     .flags = KVR_CLI_NODEFAULT,
     .help = "vLLM's flag: adapters loaded at start, each name=path or "
             "'{\"name\":..,\"path\":..,\"base_model_name\":..}'; path is a folder with an "
             "adapter_config.json (its \"r\" is the rank); needs --enable-lora"},
    {KVR_CLI_UINT, "max-loras", F(max_loras), .arg = "N", KVR_CLI_RANGE(1, 1024),
     .help = "vLLM's flag: the most adapters in one batch (GPU slots)"},
    {KVR_CLI_UINT, "max-cpu-loras", F(max_cpu_loras), .arg = "N", KVR_CLI_RANGE(1, 65536),
     .flags = KVR_CLI_NODEFAULT,
     .help = "vLLM's flag: adapters kept in CPU memory, >= --max-loras (default: --max-loras)"},
    {KVR_CLI_UINT, "max-lora-rank", F(opts.max_lora_rank), .arg = "N",
     .help = "vLLM's flag: the largest adapter rank, one of 1, 8, 16, 32, 64, 128, 256, 320, "
             "512"},
    {KVR_CLI_UINT, "data-parallel-size", F(opts.data_parallel_size), .arg = "N",
     KVR_CLI_RANGE(1, KVR_SIM_DP_MAX),
     .help = "vLLM's flag (also -dp): N engines behind the one API server; X-data-parallel-rank "
             "pins a request to one (bench/sim/README.md, Data parallel)"},
    {KVR_CLI_UINT, "api-server-count", F(api_server_count), .arg = "N", KVR_CLI_RANGE(1, 1024),
     .flags = KVR_CLI_NODEFAULT,
     .help = "vLLM's flag (also -asc): accepted; the sim is always one API server in front of "
             "every engine"},
    {KVR_CLI_DOUBLE, "time-scale", F(opts.time_scale), .arg = "N", KVR_CLI_GT(0), KVR_CLI_MAX(1e6),
     .help = "run N times faster than real time; metrics report simulated time"},
    {KVR_CLI_UINT, "seed", F(opts.seed), .arg = "N",
     .help = "seed of generated text, ids and the error-rate coin"},
    KVR_ENGINE_CLI_ROWS(E),
    {KVR_CLI_UINT, "output-len-mean", F(opts.output_len_mean), .arg = "N",
     .help = "mean natural answer length when ignore_eos is off: EOS after U[N/2, 3N/2] tokens; "
             "0 = run to max_tokens"},
    {KVR_CLI_DOUBLE, "fixed-ttft-ms", F(opts.fixed_ttft_ms), .arg = "N", .flags = KVR_CLI_NODEFAULT,
     .help = "bypass the engine: first token after X simulated ms (needs --fixed-itl-ms)"},
    {KVR_CLI_DOUBLE, "fixed-itl-ms", F(opts.fixed_itl_ms), .arg = "N", .flags = KVR_CLI_NODEFAULT,
     .help = "bypass the engine: then one token every Y ms"},
    {KVR_CLI_ENUM, "fault", F(opts.fault.mode), .arg = "MODE", .names = fault_names,
     .help = "initial fault: none, error, hang, disconnect, slow, refuse"},
    {KVR_CLI_INT, "fault-status", F(opts.fault.status), .arg = "N", KVR_CLI_RANGE(100, 599),
     .help = "error fault: HTTP status"},
    {KVR_CLI_DOUBLE, "fault-rate", F(opts.fault.rate), .arg = "N", KVR_CLI_RANGE(0, 1),
     .help = "error fault: fraction of requests failed"},
    {KVR_CLI_UINT, "fault-after-tokens", F(opts.fault.after_tokens), .arg = "N",
     .help = "disconnect fault: tokens before the close"},
    {KVR_CLI_DOUBLE, "fault-delay-ms", F(opts.fault.delay_ms), .arg = "N", KVR_CLI_MIN(0),
     .help = "slow fault: extra simulated ms per token"},
    {KVR_CLI_DOUBLE, "fault-duration-ms", F(opts.fault.duration_ms), .arg = "N", KVR_CLI_MIN(0),
     .help = "refuse fault: wall-clock ms before listening again; 0 = until POST /sim/fault"},
    {KVR_CLI_STR, "kv-events-config", F(kv_events_config), .arg = "JSON",
     .help = "publish KV-cache events as vLLM does, with vLLM's keys, e.g. "
             "'{\"enable_kv_cache_events\":true,\"endpoint\":\"tcp://*:5557\","
             "\"replay_endpoint\":\"tcp://*:5558\"}' (bench/sim/README.md)"},
    {KVR_CLI_ENUM, "kv-events-encoding", F(opts.kv_encoding), .arg = "ENC", .names = encoding_names,
     .help = "map (vLLM 0.26: map events, replay replies with the topic) or array (vLLM 0.23)"},
    {KVR_CLI_SWITCH, "enable-prompt-tokens-details", F(opts.enable_prompt_tokens_details), .set = 1,
     .help = "vLLM's flag: usage carries prompt_tokens_details.cached_tokens; off by default, as "
             "in vLLM"},
    {KVR_CLI_SWITCH, "enable-force-include-usage", F(opts.enable_force_include_usage), .set = 1,
     .help = "vLLM's flag: every stream ends with a usage chunk, asked for or not "
             "(stream_options.include_usage); off by default, as in vLLM"},
    {KVR_CLI_ENUM, "log-level", F(log_level), .arg = "LEVEL", .names = log_names,
     .help = "debug, info, warn, error, off"},
    {KVR_CLI_SWITCH, "print-costs", F(print_costs), .set = 1,
     .help = "print the cost model's sanity figures and exit"},
    {KVR_CLI_SWITCH, "calibrate", F(calibrate), .set = 1,
     .help = "simulate the multi-turn workload offline at --cal-rates and print latency "
             "percentiles"},
    {KVR_CLI_LIST, "cal-rates", KVR_CLI_ARRAY(sim_cli_t, cal.rates, cal.nrates), .arg = "LIST",
     .elem = KVR_CLI_DOUBLE, KVR_CLI_GT(0), .help = "calibrate: comma-separated request rates"},
    {KVR_CLI_UINT, "cal-requests", F(cal.requests), .arg = "N",
     .help = "calibrate: requests per rate"},
    {KVR_CLI_UINT, "cal-output-mean", F(cal.output_mean), .arg = "N",
     .help = "calibrate: mean output tokens, uniform over [N/2, 3N/2]"},
    {KVR_CLI_UINT, "cal-answer-mean", F(cal.answer_mean), .arg = "N",
     .help = "calibrate: the history carries a dataset answer of U[N/2, 3N/2] tokens instead of "
             "the generated one, as with a pre-recorded multi-turn dataset; 0 = resend the "
             "generated answer"},
};

static const kvr_cli_cmd_t sim_cmd = {
    .name = "sim",
    .usage = "[options]",
    .about = "A simulated vLLM worker (Llama-70B FP8 on one H200). Serves vLLM's OpenAI API\n"
             "(/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /v1/models,\n"
             "/health, /metrics, /tokenize, POST /reset_prefix_cache, LoRA adapters with\n"
             "--enable-lora, data parallel with -dp) and POST|GET /sim/fault; see\n"
             "bench/sim/README.md.",
    .opts = options,
    .nopts = KVR_ARRAY_SIZE(options),
};

/* ---- serving ---- */

typedef struct run_s {
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  kvr_sim_server_t *srv;
} run_t;

static void on_server_closed(void *data) {
  (void)data;
}

static void on_signal(uv_signal_t *sig, int signum) {
  run_t *run = sig->data;
  KVR_INFO("sim", "signal %d: shutting down", signum);
  uv_close((uv_handle_t *)&run->sigint, NULL);
  uv_close((uv_handle_t *)&run->sigterm, NULL);
  kvr_sim_server_close(run->srv, on_server_closed, run);
}

static void on_walk_close(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static void print_banner(const sim_cli_t *cli, const kvr_sim_server_t *srv) {
  const char *colon = strrchr(cli->opts.listen, ':');
  int hostlen = colon ? (int)(colon - cli->opts.listen) : 0;
  fprintf(stderr, "sim listening on %.*s:%d", hostlen, cli->opts.listen, kvr_sim_server_port(srv));
  if (kvr_sim_server_admin_port(srv) > 0)
    fprintf(stderr, " (admin port %d)", kvr_sim_server_admin_port(srv));
  if (cli->opts.data_parallel_size > 1)
    fprintf(stderr, " data_parallel_size=%u", cli->opts.data_parallel_size);
  fprintf(stderr, " model=%s time_scale=%g num_gpu_blocks=%u\n",
          cli->opts.nserved > 0 ? cli->opts.served_names[0] : cli->opts.model, cli->opts.time_scale,
          cli->opts.engine.num_gpu_blocks);
}

/* Frees the server, closes what is left and the loop; returns the exit status. */
static int finish(run_t *run) {
  kvr_sim_server_free(run->srv);
  uv_walk(&run->loop, on_walk_close, NULL);
  uv_run(&run->loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(&run->loop);
  if (rc != 0) {
    fprintf(stderr, "kvrouter sim: loop not closed cleanly: %s\n", uv_strerror(rc));
    return 1;
  }
  return 0;
}

static int serve(const sim_cli_t *cli) {
  run_t run;
  char err[256];
  memset(&run, 0, sizeof(run));
  uv_loop_init(&run.loop);
  run.srv = kvr_sim_server_new(&run.loop, &cli->opts, err, sizeof(err));
  if (run.srv == NULL) {
    fprintf(stderr, "kvrouter sim: %s\n", err);
    uv_loop_close(&run.loop);
    return 2;
  }
  if (kvr_sim_server_start(run.srv, err, sizeof(err)) != 0) {
    fprintf(stderr, "kvrouter sim: listen: %s\n", err);
    kvr_sim_server_close(run.srv, on_server_closed, NULL);
    uv_run(&run.loop, UV_RUN_DEFAULT);
    finish(&run);
    return 1;
  }
  uv_signal_init(&run.loop, &run.sigint);
  uv_signal_init(&run.loop, &run.sigterm);
  run.sigint.data = run.sigterm.data = &run;
  uv_signal_start(&run.sigint, on_signal, SIGINT);
  uv_signal_start(&run.sigterm, on_signal, SIGTERM);
  print_banner(cli, run.srv);
  uv_run(&run.loop, UV_RUN_DEFAULT);
  return finish(&run);
}

/* The rules between flags; the engine's own ranges are in the table (kvr_sim_config_check() is
 * the engine's last word, its field named as the flag). */
static int check(sim_cli_t *cli) {
  kvr_sim_server_opts_t *o = &cli->opts;
  char err[256];
  if (kvr_sim_config_check(&o->engine, err, sizeof(err)) != 0) {
    for (char *c = err; *c && *c != ':'; c++)
      if (*c == '_' || *c == '.')
        *c = '-';
    return kvr_cli_fail(&sim_cmd, "--%s", err);
  }
  if ((o->fixed_ttft_ms >= 0) != (o->fixed_itl_ms >= 0))
    return kvr_cli_fail(&sim_cmd, "%s: needs %s (give both or neither)",
                        o->fixed_ttft_ms >= 0 ? "--fixed-ttft-ms" : "--fixed-itl-ms",
                        o->fixed_ttft_ms >= 0 ? "--fixed-itl-ms" : "--fixed-ttft-ms");
  if (!kvr_sim_lora_rank_allowed(o->max_lora_rank))
    return kvr_cli_fail(&sim_cmd,
                        "--max-lora-rank: %u is not one of 1, 8, 16, 32, 64, 128, 256, 320, 512",
                        o->max_lora_rank);
  if (cli->enable_lora) {
    o->engine.max_loras = cli->max_loras;
    o->engine.max_cpu_loras = cli->max_cpu_loras ? cli->max_cpu_loras : cli->max_loras;
    if (o->engine.max_cpu_loras < o->engine.max_loras) /* vllm/config/lora.py */
      return kvr_cli_fail(&sim_cmd, "--max-cpu-loras: max_cpu_loras (%u) must be >= max_loras (%u)",
                          o->engine.max_cpu_loras, o->engine.max_loras);
  } else if (o->nlora_modules > 0) {
    return kvr_cli_fail(&sim_cmd, "--lora-modules: needs --enable-lora");
  }
  if (cli->kv_events_config &&
      kvr_kv_events_config_parse(&o->kv_events, cli->kv_events_config, err, sizeof(err)) != 0)
    return kvr_cli_fail(&sim_cmd, "--%s", err);
  return 0;
}

/* vLLM's flags that take several words (argparse nargs '+': every word up to the next option) and
 * its short spellings (-dp N or -dp=N), rewritten into what the option engine reads:
 * `--served-model-name a b` becomes `--served-model-name a --served-model-name b`. Returns a new
 * argv (the caller frees the array, not the strings, which stay argv's) and its length in *n. */
static const char *const nargs_flags[] = {"--served-model-name", "--lora-modules"};
static const char *const short_flags[][2] = {{"-dp", "--data-parallel-size"},
                                             {"-asc", "--api-server-count"}};

static char **expand_nargs(int argc, char **argv, int *n, size_t *skip) {
  char **out = kvr_xcalloc((size_t)argc * 2 + 1, sizeof(*out));
  int k = 0;
  size_t words[KVR_ARRAY_SIZE(nargs_flags)] = {0};
  for (int i = 0; i < argc; i++) {
    const char *flag = argv[i], *value = NULL;
    for (size_t s = 0; i > 0 && s < KVR_ARRAY_SIZE(short_flags); s++) {
      size_t len = strlen(short_flags[s][0]);
      if (strncmp(argv[i], short_flags[s][0], len) != 0)
        continue;
      if (argv[i][len] == '\0' || argv[i][len] == '=') { /* -dp N or -dp=N, as argparse */
        flag = short_flags[s][1];
        value = argv[i][len] == '=' ? argv[i] + len + 1 : NULL;
      }
    }
    out[k++] = (char *)flag;
    if (value != NULL)
      out[k++] = (char *)value;
    for (size_t f = 0; i > 0 && f < KVR_ARRAY_SIZE(nargs_flags); f++) {
      if (strcmp(argv[i], nargs_flags[f]) != 0)
        continue;
      skip[f] = words[f];
      for (int first = 1; i + 1 < argc && argv[i + 1][0] != '-'; first = 0) {
        if (!first)
          out[k++] = (char *)nargs_flags[f];
        out[k++] = argv[++i];
        words[f]++;
      }
    }
  }
  *n = k;
  return out;
}

int kvr_sim_main(int argc0, char **argv0) {
  sim_cli_t cli;
  memset(&cli, 0, sizeof(cli));
  kvr_sim_server_opts_default(&cli.opts);
  kvr_sim_calibrate_opts_default(&cli.cal);
  cli.log_level = KVR_LOG_INFO;
  cli.max_loras = 1; /* vllm/config/lora.py */
  int argc;
  size_t skip[KVR_ARRAY_SIZE(nargs_flags)] = {0};
  char **argv = expand_nargs(argc0, argv0, &argc, skip);
  int rc = kvr_cli_main(&sim_cmd, &cli, argc, argv, NULL);
  free(argv);
  /* argparse keeps the last occurrence's list of a nargs flag */
  skip[0] = KVR_MIN(skip[0], cli.nserved);
  cli.opts.served_names = cli.served + skip[0];
  cli.opts.nserved = cli.nserved - skip[0];
  skip[1] = KVR_MIN(skip[1], cli.nlora_modules);
  cli.opts.lora_modules = cli.lora_modules + skip[1];
  cli.opts.nlora_modules = cli.nlora_modules - skip[1];
  if (rc == KVR_CLI_CONTINUE && (rc = check(&cli)) == 0) {
    kvr_log_set_level(cli.log_level);
    cli.cal.seed = cli.opts.seed;
    if (cli.print_costs)
      kvr_sim_calibrate_print_costs(stdout, &cli.opts.engine);
    else if (cli.calibrate)
      kvr_sim_calibrate_run(stdout, &cli.opts.engine, &cli.cal);
    else
      rc = serve(&cli);
  }
  kvr_cli_free(&sim_cmd, &cli);
  for (size_t i = 0; i < cli.nlora_modules; i++)
    kvr_sim_lora_module_free(&cli.lora_modules[i]);
  return rc;
}

/* sim.c -- `kvrouter sim`: flags, signals and the loop around kvr_sim_server_t, plus two
 * offline tools that drive the engine in virtual time without any HTTP:
 *
 *   --print-costs   the cost model's sanity figures (decode steps at 1/16/64 sequences of 6k
 *                   context, cold 3.5k and 7k prefills, a cached follow-up turn);
 *   --calibrate     the multi-turn workload of WORKLOAD.md (10 shared ~3.5-4k-token starters,
 *                   5-turn conversations resending their answers, Poisson conversation starts)
 *                   at several request rates, printing TTFT/TPOT/ITL percentiles as the load
 *                   generator would measure them. It is how the cost defaults were tuned.
 *
 * Flags are one table (flag name, kind, destination, help) used both to parse and to print --help,
 * so the two cannot drift. A bad flag or value is one line on stderr naming it and exit status 2.
 */

#include "commands.h"

#include "bench/sim/sim_engine.h"
#include "bench/sim/sim_server.h"
#include "bench/sim/sim_tokens.h"
#include "src/kvr.h"
#include "src/log.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef enum { F_U32, F_U64, F_DBL, F_STR, F_FLAG, F_FAULT, F_LOG } flag_kind_t;

typedef struct flag_s {
  const char *name;
  flag_kind_t kind;
  void *dst;
  const char *help;
} flag_t;

typedef struct cli_s {
  kvr_sim_server_opts_t opts;
  bool help, print_costs, calibrate, no_prefix_caching;
  const char *cal_rates;
  uint32_t cal_requests, cal_output_mean, cal_answer_mean;
  kvr_log_level_t log_level;
} cli_t;

static int parse_value(const flag_t *f, const char *v) {
  char *end = NULL;
  errno = 0;
  switch (f->kind) {
  case F_U32: {
    unsigned long long x = strtoull(v, &end, 10);
    if (*v == '-' || *v == '\0' || *end != '\0' || errno != 0 || x > UINT32_MAX)
      return KVR_EINVAL;
    *(uint32_t *)f->dst = (uint32_t)x;
    return 0;
  }
  case F_U64: {
    unsigned long long x = strtoull(v, &end, 10);
    if (*v == '-' || *v == '\0' || *end != '\0' || errno != 0)
      return KVR_EINVAL;
    *(uint64_t *)f->dst = x;
    return 0;
  }
  case F_DBL: {
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || errno != 0 || !isfinite(x))
      return KVR_EINVAL;
    *(double *)f->dst = x;
    return 0;
  }
  case F_STR:
    *(const char **)f->dst = v;
    return 0;
  case F_FAULT:
    return kvr_sim_fault_parse_mode(v, (kvr_sim_fault_mode_t *)f->dst);
  case F_LOG:
    return kvr_log_parse_level(v, (kvr_log_level_t *)f->dst);
  case F_FLAG:
    break;
  }
  return KVR_EINVAL;
}

/* A flag's current value as text, for "(default ...)" in --help; "" when it has none to show (a
 * switch, an unset string, the -1 of an option that is off). */
static void flag_value(const flag_t *f, char *buf, size_t len) {
  buf[0] = '\0';
  switch (f->kind) {
  case F_U32:
    snprintf(buf, len, "%u", *(const uint32_t *)f->dst);
    break;
  case F_U64:
    snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)f->dst);
    break;
  case F_DBL:
    if (*(const double *)f->dst >= 0)
      snprintf(buf, len, "%g", *(const double *)f->dst);
    break;
  case F_STR:
    if (*(const char *const *)f->dst != NULL)
      snprintf(buf, len, "%s", *(const char *const *)f->dst);
    break;
  default:
    break;
  }
}

/* defaults[i] is flags[i]'s value before the command line was parsed: the help derives every
 * default from the structures' initializers (kvr_sim_server_opts_default and the ones above),
 * so the two cannot disagree. */
static void usage(FILE *out, const flag_t *flags, size_t n, char (*defaults)[64]) {
  fprintf(out,
          "usage: kvrouter sim [flags]\n"
          "A simulated vLLM worker (Llama-70B FP8 on one H200). Serves vLLM's OpenAI API\n"
          "(/v1/chat/completions, /v1/completions, /v1/models, /health, /metrics,\n"
          "POST /reset_prefix_cache) and POST|GET /sim/fault; see bench/sim/README.md. Flags:\n");
  for (size_t i = 0; i < n; i++) {
    const char *arg = flags[i].kind == F_FLAG ? "" : flags[i].kind == F_STR ? " STR" : " N";
    if (flags[i].kind == F_FAULT)
      arg = " MODE";
    if (flags[i].kind == F_LOG)
      arg = " LEVEL";
    fprintf(out, "  --%s%s\n      %s", flags[i].name, arg, flags[i].help);
    if (defaults[i][0] != '\0')
      fprintf(out, " (default %s)", defaults[i]);
    fputc('\n', out);
  }
}

/* ---- --print-costs ---- */

static void print_costs(const kvr_sim_config_t *cfg) {
  const kvr_sim_cost_t *c = &cfg->cost;
  printf("cost model: fixed_ms=%g per_seq_ms=%g prefill_tok_us=%g decode_ctx_ns=%g "
         "attn_pair_ns=%g\n",
         c->fixed_ms, c->per_seq_ms, c->prefill_tok_us, c->decode_ctx_ns, c->attn_pair_ns);
  printf("kv cache: %u blocks x %u tokens = %llu tokens\n", cfg->num_gpu_blocks, cfg->block_size,
         (unsigned long long)cfg->num_gpu_blocks * cfg->block_size);
  const uint32_t seqs[] = {1, 16, 32, 64, 96};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(seqs); i++) {
    double d = kvr_sim_cost_step(c, seqs[i], 0, (uint64_t)seqs[i] * 6000, 0);
    printf("decode step, %2u seqs x 6000 ctx: %6.1f ms  (%.0f output tok/s)\n", seqs[i], d * 1e3,
           seqs[i] / d);
  }
  const uint32_t cold[] = {3500, 7000};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cold); i++) {
    double n = cold[i];
    double d = kvr_sim_cost_step(c, 1, cold[i], 0, n * (n + 1) / 2);
    printf("cold prefill %u tokens (alone): %6.1f ms\n", cold[i], d * 1e3);
  }
  /* turn 2 of a conversation: 4,100-token prompt of which 4,080 are cached */
  double d = kvr_sim_cost_step(c, 1, 20, 0, 20.0 * (4080 + 21 / 2.0));
  printf("cached follow-up, 20 new tokens after 4080 cached: %6.1f ms\n", d * 1e3);
  d = kvr_sim_cost_step(c, 1, 7000, 0, 7000.0 * 7001 / 2) +
      kvr_sim_cost_step(c, 32, 0, 32ull * 6000, 0) - kvr_sim_cost_step(c, 1, 0, 0, 0);
  printf("7000-token prefill step with 32 decodes of 6000 ctx: %6.1f ms\n", d * 1e3);
}

/* ---- --calibrate: the multi-turn workload in virtual time ---- */

typedef struct conv_s {
  uint32_t turn;      /* turns sent so far */
  kvr_sim_toks_t ctx; /* the conversation so far: starter, follow-ups, answers */
} conv_t;

typedef struct creq_s {
  uint32_t conv;
  double arrival, first, last;
  uint32_t ntok, ninput, ncached;
  double max_itl;
} creq_t;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) {
  if (n == 0)
    return 0;
  qsort(v, n, sizeof(double), cmp_double);
  size_t i = (size_t)ceil(p / 100.0 * (double)n);
  return v[i > 0 ? i - 1 : 0];
}

static double exp_draw(uint64_t *state, double rate) {
  double u = (double)((kvr_sim_tokens_mix(++*state) >> 11) + 1) * 0x1.0p-53;
  return -log(u) / rate;
}

/* Appends a pseudo-random run of n token ids determined by key. */
static void push_ids(kvr_sim_toks_t *t, uint64_t key, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    kvr_sim_toks_push(t, (uint32_t)(kvr_sim_tokens_mix(key * 1000003u + i) % 128000u));
}

static void calibrate_rate(const kvr_sim_config_t *cfg, double rate, uint32_t nreq,
                           uint32_t out_mean, uint32_t answer_mean, uint64_t seed) {
  kvr_sim_engine_t *eng = kvr_sim_engine_new(cfg);
  /* Requests arrive as a Poisson process at `rate`. Each arrival is the next turn of a conversation
   * whose previous turn has finished (oldest first), or the first turn of a new conversation when
   * none is ready: many users chatting, each resending the whole history with the answer. */
  conv_t *convs = calloc(nreq, sizeof(*convs));
  uint32_t *ready = calloc(nreq, sizeof(uint32_t));
  uint32_t ready_head = 0, ready_tail = 0, nconv = 0;
  creq_t *reqs = calloc(nreq, sizeof(*reqs));
  double *arrivals = calloc(nreq, sizeof(double));
  double *itls = NULL;
  size_t nitl = 0, citl = 0;
  uint64_t rs = seed * 7919 + (uint64_t)(rate * 1000);
  double t = 0;
  for (uint32_t i = 0; i < nreq; i++) {
    t += exp_draw(&rs, rate);
    arrivals[i] = t;
  }
  uint32_t sent = 0, done = 0, running_max = 0;
  double now = 0, conc_area = 0;
  while (done < nreq) {
    for (; sent < nreq && arrivals[sent] <= now; sent++) {
      uint32_t c;
      if (ready_head < ready_tail) {
        c = ready[ready_head++];
      } else {
        c = nconv++;
        uint32_t starter = c % 10;
        kvr_sim_toks_push(&convs[c].ctx, 128000u);
        push_ids(&convs[c].ctx, 1 + starter, 3500 + (starter * 53) % 500);
      }
      conv_t *cv = &convs[c];
      push_ids(&cv->ctx, 0x10000000ull + c * 16 + cv->turn, 20); /* the user's follow-up */
      uint32_t out =
          out_mean / 2 + (uint32_t)(kvr_sim_tokens_mix(rs++) % (out_mean + 1)); /* U[m/2, 3m/2] */
      creq_t *r = &reqs[sent];
      r->conv = c;
      r->arrival = arrivals[sent];
      r->ninput = (uint32_t)cv->ctx.n;
      kvr_sim_engine_add(eng, cv->ctx.v, (uint32_t)cv->ctx.n, out, KVR_SIM_FINISH_LENGTH,
                         kvr_sim_tokens_mix(sent), r);
      cv->turn++;
    }
    if (!kvr_sim_engine_busy(eng)) {
      now = arrivals[sent];
      continue;
    }
    kvr_sim_stats_t st;
    kvr_sim_engine_stats(eng, &st);
    uint32_t inflight = st.running + st.waiting;
    running_max = KVR_MAX(running_max, inflight);
    kvr_sim_step_t step;
    kvr_sim_engine_step(eng, &step);
    conc_area += inflight * step.duration_s;
    now += step.duration_s;
    for (size_t i = 0; i < step.nevents; i++) {
      kvr_sim_event_t *ev = &step.events[i];
      creq_t *r = ev->req->data;
      if (ev->new_tokens == 0)
        continue;
      if (r->ntok == 0) {
        r->first = now;
        r->ncached = (uint32_t)KVR_MAX(ev->req->num_cached, 0);
      } else {
        if (nitl == citl) {
          citl = citl ? citl * 2 : 65536;
          itls = realloc(itls, citl * sizeof(double));
        }
        itls[nitl++] = now - r->last;
      }
      r->last = now;
      r->ntok++;
      if (ev->finished) {
        conv_t *cv = &convs[r->conv];
        cv->ctx.n = 0;
        /* the history resent next turn: the generated answer, or a dataset's reference answer */
        uint32_t keep = answer_mean ? ev->req->num_prompt : ev->req->ntokens;
        for (uint32_t k = 0; k < keep; k++)
          kvr_sim_toks_push(&cv->ctx, ev->req->tokens[k]);
        if (answer_mean)
          push_ids(&cv->ctx, 0x20000000ull + r->conv * 16 + cv->turn,
                   answer_mean / 2 + (uint32_t)(kvr_sim_tokens_mix(rs++) % (answer_mean + 1)));
        if (cv->turn < 5)
          ready[ready_tail++] = r->conv;
        kvr_sim_engine_remove(eng, ev->req);
        done++;
      }
    }
  }
  size_t n = done;
  double *ttft = malloc(n * sizeof(double)), *tpot = malloc(n * sizeof(double));
  double in_sum = 0, out_sum = 0, cached_sum = 0, first_arrival = INFINITY, last_end = 0;
  for (size_t i = 0; i < n; i++) {
    ttft[i] = reqs[i].first - reqs[i].arrival;
    tpot[i] = reqs[i].ntok > 1 ? (reqs[i].last - reqs[i].first) / (reqs[i].ntok - 1) : 0;
    in_sum += reqs[i].ninput;
    out_sum += reqs[i].ntok;
    cached_sum += reqs[i].ncached;
    first_arrival = fmin(first_arrival, reqs[i].arrival);
    last_end = fmax(last_end, reqs[i].last);
  }
  kvr_sim_stats_t st;
  kvr_sim_engine_stats(eng, &st);
  double span = last_end - first_arrival;
  printf(
      "%5.2f %5zu %6.0f %5.0f %5.1f%% %5.1f %4u %7.0f %7.0f %7.1f %7.1f %7.1f %7.1f %6.0f %5llu\n",
      rate, n, in_sum / n, out_sum / n, 100 * cached_sum / in_sum, conc_area / span, running_max,
      pct(ttft, n, 50) * 1e3, pct(ttft, n, 99) * 1e3, pct(tpot, n, 50) * 1e3,
      pct(tpot, n, 99) * 1e3, pct(itls, nitl, 50) * 1e3, pct(itls, nitl, 99) * 1e3, out_sum / span,
      (unsigned long long)st.preemptions);
  for (uint32_t c = 0; c < nconv; c++)
    kvr_sim_toks_free(&convs[c].ctx);
  free(convs);
  free(ready);
  free(reqs);
  free(arrivals);
  free(itls);
  free(ttft);
  free(tpot);
  kvr_sim_engine_free(eng);
}

static int calibrate(const cli_t *cli) {
  printf(
      "multi-turn workload in virtual time: %u Poisson requests per rate, each the next turn of a "
      "finished conversation (5 turns over 10 shared 3.5-4k-token starters) or a new one; output "
      "U[%u,%u] tokens; history answers: %s %u\n",
      cli->cal_requests, cli->cal_output_mean / 2, cli->cal_output_mean * 3 / 2,
      cli->cal_answer_mean ? "dataset, mean" : "generated", cli->cal_answer_mean);
  printf(" rate  reqs  in_avg out_avg cached conc  max ttft50 ttft99  tpot50  tpot99   itl50   "
         "itl99  tok/s preempt\n");
  const char *p = cli->cal_rates;
  while (*p) {
    char *end;
    double rate = strtod(p, &end);
    if (end == p || rate <= 0) {
      fprintf(stderr, "kvrouter sim: --cal-rates: bad list '%s'\n", cli->cal_rates);
      return 2;
    }
    calibrate_rate(&cli->opts.engine, rate, cli->cal_requests, cli->cal_output_mean,
                   cli->cal_answer_mean, cli->opts.seed);
    fflush(stdout);
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

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

static int serve(const cli_t *cli) {
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
  int rc = kvr_sim_server_start(run.srv, err, sizeof(err));
  if (rc != 0) {
    fprintf(stderr, "kvrouter sim: listen: %s\n", err);
    kvr_sim_server_close(run.srv, on_server_closed, NULL);
    uv_run(&run.loop, UV_RUN_DEFAULT);
    kvr_sim_server_free(run.srv);
    uv_loop_close(&run.loop);
    return 1;
  }
  uv_signal_init(&run.loop, &run.sigint);
  uv_signal_init(&run.loop, &run.sigterm);
  run.sigint.data = run.sigterm.data = &run;
  uv_signal_start(&run.sigint, on_signal, SIGINT);
  uv_signal_start(&run.sigterm, on_signal, SIGTERM);
  const char *colon = strrchr(cli->opts.listen, ':');
  int hostlen = colon ? (int)(colon - cli->opts.listen) : 0;
  fprintf(stderr, "sim listening on %.*s:%d", hostlen, cli->opts.listen,
          kvr_sim_server_port(run.srv));
  if (kvr_sim_server_admin_port(run.srv) > 0)
    fprintf(stderr, " (admin port %d)", kvr_sim_server_admin_port(run.srv));
  fprintf(stderr, " model=%s time_scale=%g num_gpu_blocks=%u\n", cli->opts.model,
          cli->opts.time_scale, cli->opts.engine.num_gpu_blocks);
  uv_run(&run.loop, UV_RUN_DEFAULT);
  kvr_sim_server_free(run.srv);
  uv_walk(&run.loop, on_walk_close, NULL);
  uv_run(&run.loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&run.loop);
  if (rc != 0) {
    fprintf(stderr, "kvrouter sim: loop not closed cleanly: %s\n", uv_strerror(rc));
    return 1;
  }
  return 0;
}

int kvr_sim_main(int argc, char **argv) {
  cli_t cli;
  memset(&cli, 0, sizeof(cli));
  kvr_sim_server_opts_default(&cli.opts);
  cli.cal_rates = "0.5,1,1.5,2,2.5,3";
  cli.cal_requests = 300;
  cli.cal_output_mean = 500;
  cli.cal_answer_mean = 900;
  cli.log_level = KVR_LOG_INFO;
  kvr_sim_config_t *e = &cli.opts.engine;
  kvr_sim_fault_t *f = &cli.opts.fault;
  uint32_t fault_status = 500;
  const flag_t flags[] = {
      {"listen", F_STR, &cli.opts.listen, "HOST:PORT to serve on; port 0 picks one"},
      {"admin-listen", F_STR, &cli.opts.admin_listen,
       "optional second HOST:PORT serving the same API, reachable during the refuse fault"},
      {"model", F_STR, &cli.opts.model, "served model name"},
      {"time-scale", F_DBL, &cli.opts.time_scale,
       "run N times faster than real time; metrics report simulated time"},
      {"seed", F_U64, &cli.opts.seed, "seed of generated text, ids and the error-rate coin"},
      {"num-gpu-blocks", F_U32, &e->num_gpu_blocks,
       "KV cache blocks: 53.15 GiB / 163,840 B per token / 16 tokens per block"},
      {"block-size", F_U32, &e->block_size, "tokens per KV block"},
      {"max-num-seqs", F_U32, &e->max_num_seqs, "max running requests"},
      {"max-num-batched-tokens", F_U32, &e->max_num_batched_tokens, "token budget per engine step"},
      {"max-model-len", F_U32, &e->max_model_len, "prompt + output limit"},
      {"no-enable-prefix-caching", F_FLAG, &cli.no_prefix_caching, "disable prefix caching"},
      {"output-len-mean", F_U32, &cli.opts.output_len_mean,
       "mean natural answer length when ignore_eos is off: EOS after U[N/2, 3N/2] tokens; 0 = "
       "run to max_tokens"},
      {"cost-fixed-ms", F_DBL, &e->cost.fixed_ms, "step cost: fixed ms per step"},
      {"cost-per-seq-ms", F_DBL, &e->cost.per_seq_ms, "step cost: ms per scheduled sequence"},
      {"cost-prefill-tok-us", F_DBL, &e->cost.prefill_tok_us, "step cost: us per prefilled token"},
      {"cost-decode-ctx-ns", F_DBL, &e->cost.decode_ctx_ns,
       "step cost: ns per context token of each decoding sequence"},
      {"cost-attn-pair-ns", F_DBL, &e->cost.attn_pair_ns,
       "step cost: ns per query-key pair of prefill attention"},
      {"fixed-ttft-ms", F_DBL, &cli.opts.fixed_ttft_ms,
       "bypass the engine: first token after X simulated ms (needs --fixed-itl-ms)"},
      {"fixed-itl-ms", F_DBL, &cli.opts.fixed_itl_ms,
       "bypass the engine: then one token every Y ms"},
      {"fault", F_FAULT, &f->mode, "initial fault: none, error, hang, disconnect, slow, refuse"},
      {"fault-status", F_U32, &fault_status, "error fault: HTTP status"},
      {"fault-rate", F_DBL, &f->rate, "error fault: fraction of requests failed"},
      {"fault-after-tokens", F_U32, &f->after_tokens, "disconnect fault: tokens before the close"},
      {"fault-delay-ms", F_DBL, &f->delay_ms, "slow fault: extra simulated ms per token"},
      {"fault-duration-ms", F_DBL, &f->duration_ms,
       "refuse fault: wall-clock ms before listening again; 0 = until POST /sim/fault"},
      {"log-level", F_LOG, &cli.log_level, "debug, info, warn, error, off (default info)"},
      {"print-costs", F_FLAG, &cli.print_costs, "print the cost model's sanity figures and exit"},
      {"calibrate", F_FLAG, &cli.calibrate,
       "simulate the multi-turn workload offline at --cal-rates and print latency percentiles"},
      {"cal-rates", F_STR, &cli.cal_rates, "calibrate: comma-separated request rates"},
      {"cal-requests", F_U32, &cli.cal_requests, "calibrate: requests per rate"},
      {"cal-output-mean", F_U32, &cli.cal_output_mean,
       "calibrate: mean output tokens, uniform over [N/2, 3N/2]"},
      {"cal-answer-mean", F_U32, &cli.cal_answer_mean,
       "calibrate: the history carries a dataset answer of U[N/2, 3N/2] tokens instead of the "
       "generated one, as with a pre-recorded multi-turn dataset; 0 = resend the generated answer"},
      {"help", F_FLAG, &cli.help, "this text"},
  };
  char defaults[KVR_ARRAY_SIZE(flags)][64];
  for (size_t k = 0; k < KVR_ARRAY_SIZE(flags); k++)
    flag_value(&flags[k], defaults[k], sizeof(defaults[k]));
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "kvrouter sim: unexpected argument '%s' (see --help)\n", a);
      return 2;
    }
    a += 2;
    const char *eq = strchr(a, '=');
    size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
    const flag_t *fl = NULL;
    for (size_t k = 0; k < KVR_ARRAY_SIZE(flags); k++) {
      if (strlen(flags[k].name) == nlen && strncmp(flags[k].name, a, nlen) == 0)
        fl = &flags[k];
    }
    if (fl == NULL) {
      fprintf(stderr, "kvrouter sim: unknown flag --%.*s (see --help)\n", (int)nlen, a);
      return 2;
    }
    if (fl->kind == F_FLAG) {
      if (eq) {
        fprintf(stderr, "kvrouter sim: --%s takes no value\n", fl->name);
        return 2;
      }
      *(bool *)fl->dst = true;
      continue;
    }
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (v == NULL) {
      fprintf(stderr, "kvrouter sim: --%s needs a value\n", fl->name);
      return 2;
    }
    if (parse_value(fl, v) != 0) {
      fprintf(stderr, "kvrouter sim: --%s: invalid value '%s'\n", fl->name, v);
      return 2;
    }
  }
  if (cli.help) {
    usage(stdout, flags, KVR_ARRAY_SIZE(flags), defaults);
    return 0;
  }
  f->status = (int)KVR_MIN(fault_status, 1000u);
  kvr_log_set_level(cli.log_level);
  e->enable_prefix_caching = !cli.no_prefix_caching;
  char err[256];
  if (kvr_sim_config_check(e, err, sizeof(err)) != 0) {
    /* name the flag, not the struct field */
    char flag[256];
    snprintf(flag, sizeof(flag), "%s", err);
    for (char *c = flag; *c && *c != ':'; c++)
      if (*c == '_' || *c == '.')
        *c = '-';
    fprintf(stderr, "kvrouter sim: --%s\n", flag);
    return 2;
  }
  if (!(cli.opts.time_scale > 0) || cli.opts.time_scale > 1e6) {
    fprintf(stderr, "kvrouter sim: --time-scale: must be in (0, 1e6]\n");
    return 2;
  }
  if ((cli.opts.fixed_ttft_ms >= 0) != (cli.opts.fixed_itl_ms >= 0)) {
    fprintf(stderr, "kvrouter sim: --fixed-ttft-ms and --fixed-itl-ms go together\n");
    return 2;
  }
  if (f->rate < 0 || f->rate > 1 || f->status < 100 || f->status > 599 || f->delay_ms < 0 ||
      f->duration_ms < 0) {
    fprintf(stderr, "kvrouter sim: --fault-*: rate in [0,1], status in [100,599], delays >= 0\n");
    return 2;
  }
  if (cli.print_costs) {
    print_costs(e);
    return 0;
  }
  if (cli.calibrate)
    return calibrate(&cli);
  return serve(&cli);
}

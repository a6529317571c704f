/* sim_calibrate.c -- the simulated engine driven in virtual time: cost figures and calibration.
 *
 * Calibration of one rate (cal_t holds its state): requests arrive as a Poisson process at the
 * rate. Each arrival is the next turn of a conversation whose previous turn has finished (oldest
 * first, the `ready` queue), or the first turn of a new conversation when none is ready: many users
 * chatting, each resending the whole history with the answer. The loop handles events in time
 * order: an arrival due before the engine's next step start (kvr_sim_engine_next_start()) is added,
 * stamped with its time; otherwise the step runs, and its first tokens, inter-token gaps and
 * finishes are recorded at the time the clients would see them (the step's deliver_s). Finished
 * requests extend their conversation's history (the generated answer, or a dataset's answer of
 * answer_mean tokens) and queue it for its next turn, up to 5 turns.
 *
 * Invariants: every random draw comes from one counter-based stream (`rs`, splitmix via
 * kvr_sim_tokens_mix) in a fixed order, so a row is a pure function of (cfg, opts, rate).
 */
#include "sim_calibrate.h"

#include "base/kvr.h"
#include "base/quantile.h"
#include "sim_preset.h"
#include "sim_tokens.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CAL_TURNS 5
#define CAL_STARTERS 10

void kvr_sim_calibrate_opts_default(kvr_sim_calibrate_opts_t *opts) {
  static const double rates[] = {0.5, 1, 1.5, 2, 2.5, 3};
  memset(opts, 0, sizeof(*opts));
  memcpy(opts->rates, rates, sizeof(rates));
  opts->nrates = KVR_ARRAY_SIZE(rates);
  opts->requests = 300;
  opts->output_mean = 500;
  opts->answer_mean = 900;
}

/* ---- --print-costs ---- */

/* The modelled time of a step holding decodes of the given contexts and one prefill chunk of n
 * tokens after cached ones. */
static double step_ms(const kvr_sim_cost_t *c, uint32_t decodes, uint64_t ctx, uint32_t n,
                      uint32_t cached) {
  kvr_sim_step_t st;
  memset(&st, 0, sizeof(st));
  st.num_seqs = decodes + (n > 0);
  st.num_decode = decodes;
  st.decode_ctx = (uint64_t)decodes * ctx;
  st.prefill_tokens = n;
  st.attn_pairs = (double)n * ((double)cached + (double)(n + 1) / 2.0);
  return kvr_sim_cost_step(c, &st) * 1e3;
}

static void print_decode_steps(FILE *out, const kvr_sim_cost_t *c) {
  const uint32_t seqs[] = {1, 16, 32, 64, 96, 128};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(seqs); i++) {
    double d = step_ms(c, seqs[i], 6000, 0, 0);
    fprintf(out, "decode step, %3u seqs x 6000 ctx: %6.1f ms  (%.0f output tok/s)\n", seqs[i], d,
            seqs[i] / d * 1e3);
  }
}

static void print_prefills(FILE *out, const kvr_sim_cost_t *c) {
  const uint32_t cold[] = {3500, 7000};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cold); i++)
    fprintf(out, "cold prefill %u tokens (alone): %6.1f ms\n", cold[i],
            step_ms(c, 0, 0, cold[i], 0));
  /* WORKLOAD.md: "a ~7,000-token prefill takes 400-500 ms"; at turn 5 the ~3,750-token starter is
   * cached (the conversation's own earlier turns may be too; this is the cold-est case). */
  fprintf(out, "turn-5 prefill, 7000 tokens with its 3750-token starter cached: %6.1f ms\n",
          step_ms(c, 0, 0, 3250, 3750));
  fprintf(out, "cached follow-up, 20 new tokens after 4080 cached: %6.1f ms\n",
          step_ms(c, 0, 0, 20, 4080));
  fprintf(out, "7000-token prefill step with 32 decodes of 6000 ctx: %6.1f ms\n",
          step_ms(c, 32, 6000, 7000, 0));
}

/* The LoRA swap terms (sim_engine.h, sim_preset.h): what an adapter weighs on the preset's model
 * and what bringing one of rank 16 into a GPU slot adds to the step that needs it. */
static void print_lora(FILE *out, const kvr_sim_config_t *cfg) {
  const kvr_sim_cost_t *c = &cfg->cost;
  double bytes = kvr_sim_preset_lora_bytes_per_rank(kvr_sim_preset_of(cfg)->model);
  fprintf(out,
          "lora swap: lora_load_ms_per_rank=%g lora_disk_ms_per_rank=%g (an adapter is %.2f MB "
          "per unit of rank in BF16: A and B of q, k, v, o in every layer; %.0f GB/s PCIe, %.0f "
          "GB/s disk); rank 16 (%.0f MB): %.2f ms into a GPU slot from the CPU cache, %.1f ms "
          "more when read from disk first\n",
          c->lora_load_ms_per_rank, c->lora_disk_ms_per_rank, bytes / 1e6,
          KVR_SIM_LORA_PCIE_BYTES_S / 1e9, KVR_SIM_LORA_DISK_BYTES_S / 1e9, 16 * bytes / 1e6,
          16 * c->lora_load_ms_per_rank, 16 * c->lora_disk_ms_per_rank);
}

void kvr_sim_calibrate_print_costs(FILE *out, const kvr_sim_config_t *cfg) {
  const kvr_sim_cost_t *c = &cfg->cost;
  const kvr_sim_frontend_t *f = &cfg->frontend;
  fprintf(out,
          "cost model: weights_ms=%g dense_tok_us=%g step_ms=%g per_seq_ms=%g decode_ctx_ns=%g "
          "attn_pair_ns=%g\n",
          c->weights_ms, c->dense_tok_us, c->step_ms, c->per_seq_ms, c->decode_ctx_ns,
          c->attn_pair_ns);
  fprintf(out,
          "frontend: req_ms=%g prompt_tok_us=%g stream_tok_us=%g async_scheduling=%s; "
          "retok_drift=%g\n",
          f->req_ms, f->prompt_tok_us, f->stream_tok_us, f->async_scheduling ? "on" : "off",
          cfg->retok_drift);
  fprintf(out, "kv cache: %u blocks x %u tokens = %llu tokens\n", cfg->num_gpu_blocks,
          cfg->block_size, (unsigned long long)cfg->num_gpu_blocks * cfg->block_size);
  kvr_sim_preset_print(out, cfg); /* what the terms are on the preset's hardware */
  print_decode_steps(out, c);
  print_prefills(out, c);
  fprintf(out, "request overhead before scheduling, 6000-token prompt: %.1f ms\n",
          f->req_ms + f->prompt_tok_us * 6000 * 1e-3);
  fprintf(out, "output processing of a step with 100 streams: %.1f ms\n",
          f->stream_tok_us * 100 * 1e-3);
  print_lora(out, cfg);
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
} creq_t;

typedef struct cal_s {
  const kvr_sim_calibrate_opts_t *o;
  kvr_sim_engine_t *eng;
  conv_t *convs;   /* nconv started, at most o->requests */
  uint32_t *ready; /* conversations whose last turn finished, oldest first */
  uint32_t ready_head, ready_tail, nconv;
  creq_t *reqs;     /* one per request, in arrival order */
  double *arrivals; /* arrival times, increasing */
  double *itls;     /* every inter-token gap */
  size_t nitl, citl;
  uint64_t rs; /* the random stream */
  uint32_t sent, done, running_max;
  double now, conc_area;
} cal_t;

/* Sorts v and returns its percentile p by the definition every product shares
 * (src/base/quantile.h). */
static double pct(double *v, size_t n, double p) {
  kvr_quantile_sort(v, n);
  return kvr_quantile(v, n, p);
}

static double exp_draw(uint64_t *state, double rate) {
  double u = (double)((kvr_sim_tokens_mix(++*state) >> 11) + 1) * 0x1.0p-53;
  return -log(u) / rate;
}

/* Uniform over [mean/2, 3*mean/2]. */
static uint32_t uniform_around(cal_t *c, uint32_t mean) {
  return mean / 2 + (uint32_t)(kvr_sim_tokens_mix(c->rs++) % (mean + 1));
}

/* Appends a pseudo-random run of n token ids determined by key. */
static void push_ids(kvr_sim_toks_t *t, uint64_t key, uint32_t n) {
  for (uint32_t i = 0; i < n; i++)
    kvr_sim_toks_push(t, (uint32_t)(kvr_sim_tokens_mix(key * 1000003u + i) % 128000u));
}

static void cal_init(cal_t *c, const kvr_sim_config_t *cfg, const kvr_sim_calibrate_opts_t *o,
                     double rate) {
  uint32_t n = o->requests;
  memset(c, 0, sizeof(*c));
  c->o = o;
  c->eng = kvr_sim_engine_new(cfg);
  c->convs = calloc(n, sizeof(*c->convs));
  c->ready = calloc(n, sizeof(uint32_t));
  c->reqs = calloc(n, sizeof(*c->reqs));
  c->arrivals = calloc(n, sizeof(double));
  c->rs = o->seed * 7919 + (uint64_t)(rate * 1000);
  double t = 0;
  for (uint32_t i = 0; i < n; i++) {
    t += exp_draw(&c->rs, rate);
    c->arrivals[i] = t;
  }
}

static void cal_free(cal_t *c) {
  for (uint32_t k = 0; k < c->nconv; k++)
    kvr_sim_toks_free(&c->convs[k].ctx);
  free(c->convs);
  free(c->ready);
  free(c->reqs);
  free(c->arrivals);
  free(c->itls);
  kvr_sim_engine_free(c->eng);
}

/* The conversation the next arrival continues: the oldest ready one, else a new one. */
static uint32_t cal_next_conv(cal_t *c) {
  if (c->ready_head < c->ready_tail)
    return c->ready[c->ready_head++];
  uint32_t k = c->nconv++;
  uint32_t starter = k % CAL_STARTERS;
  kvr_sim_toks_push(&c->convs[k].ctx, 128000u);
  push_ids(&c->convs[k].ctx, 1 + starter, 3500 + (starter * 53) % 500);
  return k;
}

/* Adds every request that has arrived by now to the engine, stamped with its arrival time. */
static void cal_send_due(cal_t *c) {
  for (; c->sent < c->o->requests && c->arrivals[c->sent] <= c->now; c->sent++) {
    kvr_sim_engine_set_now(c->eng, c->arrivals[c->sent]);
    uint32_t k = cal_next_conv(c);
    conv_t *cv = &c->convs[k];
    push_ids(&cv->ctx, 0x10000000ull + k * 16 + cv->turn, 20); /* the user's follow-up */
    uint32_t out = uniform_around(c, c->o->output_mean);
    creq_t *r = &c->reqs[c->sent];
    r->conv = k;
    r->arrival = c->arrivals[c->sent];
    r->ninput = (uint32_t)cv->ctx.n;
    kvr_sim_engine_add(c->eng, cv->ctx.v, (uint32_t)cv->ctx.n, out, KVR_SIM_FINISH_LENGTH,
                       kvr_sim_tokens_mix(c->sent), r);
    cv->turn++;
  }
}

static void cal_token(cal_t *c, const kvr_sim_event_t *ev, creq_t *r) {
  if (r->ntok == 0) {
    r->first = c->now;
    r->ncached = (uint32_t)KVR_MAX(ev->req->num_cached, 0);
  } else {
    if (c->nitl == c->citl) {
      c->citl = c->citl ? c->citl * 2 : 65536;
      c->itls = realloc(c->itls, c->citl * sizeof(double));
    }
    c->itls[c->nitl++] = c->now - r->last;
  }
  r->last = c->now;
  r->ntok++;
}

/* A finished turn: its history is resent next turn (the generated answer, or a dataset's). */
static void cal_finish(cal_t *c, const kvr_sim_event_t *ev, const creq_t *r) {
  conv_t *cv = &c->convs[r->conv];
  uint32_t answer_mean = c->o->answer_mean;
  cv->ctx.n = 0;
  uint32_t keep = answer_mean ? ev->req->num_prompt : ev->req->ntokens;
  for (uint32_t k = 0; k < keep; k++)
    kvr_sim_toks_push(&cv->ctx, ev->req->tokens[k]);
  if (answer_mean)
    push_ids(&cv->ctx, 0x20000000ull + r->conv * 16 + cv->turn, uniform_around(c, answer_mean));
  if (cv->turn < CAL_TURNS)
    c->ready[c->ready_tail++] = r->conv;
  kvr_sim_engine_remove(c->eng, ev->req);
  c->done++;
}

static void cal_step(cal_t *c) {
  kvr_sim_stats_t st;
  kvr_sim_engine_stats(c->eng, &st);
  uint32_t inflight = st.running + st.waiting;
  c->running_max = KVR_MAX(c->running_max, inflight);
  kvr_sim_step_t step;
  kvr_sim_engine_step(c->eng, &step);
  c->conc_area += inflight * step.duration_s;
  c->now = step.deliver_s; /* the clients see this step's tokens then */
  for (size_t i = 0; i < step.nevents; i++) {
    kvr_sim_event_t *ev = &step.events[i];
    creq_t *r = ev->req->data;
    if (ev->new_tokens == 0)
      continue;
    cal_token(c, ev, r);
    if (ev->finished)
      cal_finish(c, ev, r);
  }
}

static void cal_print(cal_t *c, FILE *out, double rate) {
  size_t n = c->done;
  double *ttft = malloc(n * sizeof(double)), *tpot = malloc(n * sizeof(double));
  double in_sum = 0, out_sum = 0, cached_sum = 0, first_arrival = INFINITY, last_end = 0;
  for (size_t i = 0; i < n; i++) {
    const creq_t *r = &c->reqs[i];
    ttft[i] = r->first - r->arrival;
    tpot[i] = r->ntok > 1 ? (r->last - r->first) / (r->ntok - 1) : 0;
    in_sum += r->ninput;
    out_sum += r->ntok;
    cached_sum += r->ncached;
    first_arrival = fmin(first_arrival, r->arrival);
    last_end = fmax(last_end, r->last);
  }
  kvr_sim_stats_t st;
  kvr_sim_engine_stats(c->eng, &st);
  double span = last_end - first_arrival;
  fprintf(out,
          "%5.2f %5zu %6.0f %5.0f %5.1f%% %5.1f %4u %7.0f %7.0f %7.1f %7.1f %7.1f %7.1f %6.0f "
          "%5llu\n",
          rate, n, in_sum / n, out_sum / n, 100 * cached_sum / in_sum, c->conc_area / span,
          c->running_max, pct(ttft, n, 50) * 1e3, pct(ttft, n, 99) * 1e3, pct(tpot, n, 50) * 1e3,
          pct(tpot, n, 99) * 1e3, pct(c->itls, c->nitl, 50) * 1e3, pct(c->itls, c->nitl, 99) * 1e3,
          out_sum / span, (unsigned long long)st.preemptions);
  free(ttft);
  free(tpot);
}

void kvr_sim_calibrate_rate(FILE *out, const kvr_sim_config_t *cfg,
                            const kvr_sim_calibrate_opts_t *opts, double rate) {
  cal_t c;
  cal_init(&c, cfg, opts, rate);
  while (c.done < opts->requests) {
    /* Discrete events in time order: arrivals up to the next step's start, then that step. */
    double next = kvr_sim_engine_next_start(c.eng);
    if (c.sent < opts->requests && c.arrivals[c.sent] <= next) {
      c.now = c.arrivals[c.sent];
      cal_send_due(&c);
    } else {
      cal_step(&c);
    }
  }
  cal_print(&c, out, rate);
  cal_free(&c);
}

void kvr_sim_calibrate_run(FILE *out, const kvr_sim_config_t *cfg,
                           const kvr_sim_calibrate_opts_t *opts) {
  fprintf(out,
          "multi-turn workload in virtual time: %u Poisson requests per rate, each the next turn "
          "of a finished conversation (5 turns over 10 shared 3.5-4k-token starters) or a new "
          "one; output U[%u,%u] tokens; history answers: %s %u\n",
          opts->requests, opts->output_mean / 2, opts->output_mean * 3 / 2,
          opts->answer_mean ? "dataset, mean" : "generated", opts->answer_mean);
  fprintf(out, " rate  reqs  in_avg out_avg cached conc  max ttft50 ttft99  tpot50  tpot99   "
               "itl50   itl99  tok/s preempt\n");
  for (size_t i = 0; i < opts->nrates; i++) {
    kvr_sim_calibrate_rate(out, cfg, opts, opts->rates[i]);
    fflush(out);
  }
}

/* study.c -- `kvrouter bench study`: cells on a thread pool, then the table.
 *
 * Flow: kvr_study_run() checks the names (and the trace) -> one kvr_study_cell_t per (scenario,
 * seed) -> `jobs` threads take cells from a shared counter, longest first (kvr_study_order, by
 * each scenario's measured cost_s: a long cell started last would run alone at the end), and
 * run each through the caller's kvr_study_run_fn (a whole virtual bench whose settings
 * kvr_study_cell_opts() makes, its command line kvr_study_cell_words(): its report lands in the
 * cell's folder) -> each cell's per-policy max SLO-compliant load (kvr_report_cap), or for a fleet
 * scenario its fleet (kvr_fleet_answer), is kept -> the tables (mean, min, max over the seeds; "at
 * least" when some seed found no limit) and the ratios are written as STUDY.md and study.json and
 * printed: the rate scenarios' table, then the fleet scenarios'.
 *
 * Invariants: cells share nothing but this file's read-only tables and the caller's run function;
 * a cell's results are written only by the thread that ran it, and read after every thread joined.
 */
#include "study.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "bench/loadgen/workload.h"
#include "bench/report/report.h"
#include "bench/sim/sim_preset.h"
#include "bench/vcluster/fleet.h"
#include "bench/vcluster/model_fleet.h"
#include "bench/vcluster/vcluster.h"
#include "policies/policy.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The trace scenarios' workers and SLO: a model whose many KV blocks hold long prompts (26,674
 * blocks of 16 tokens each on an H100) and a long-context SLO (the Mooncake trace's p99 prompt, 66k
 * tokens, alone takes ~3 s to prefill there): bench/loadgen/README.md, Traces. */
#define TRACE_PRESET "llama-3.1-8b-h100"
#define TRACE_TTFT_MS 10000
#define TRACE_TPOT_MS 100

/* What a cell of each scenario costs, seconds: the mean of its three cells' "seconds" in the
 * study.json of the whole study on two free cores at 6d67ad6 (`/usr/bin/time build/kvrouter bench
 * study --quiet --trace ../shared/traces/mooncake_synthetic_trace.jsonl`, 10 min 25 s:
 * bench/results/study/NOTES.md). The hot paths made faster since cut the scenarios' costs by
 * different shares, so the order may be a little off; only kvr_study_order reads them, and an
 * order that is off only delays when a cell starts, never what it finds. */
#define COST_MULTITURN 30.2
#define COST_DOCUMENTS 32.6
#define COST_CONTROL 3.7
#define COST_AGENTIC 17.0
#define COST_HOT_PREFIX 16.9
#define COST_BURSTY 27.1
#define COST_MIXED_FLEET 18.6
#define COST_AGENTIC_RESPONSES 37.3
#define COST_NO_ID_AFFINITY 2.6
#define COST_MODEL_FLEET 61.8
#define COST_TRACE 91.2
#define COST_TRACE_FLEET 62.9

/* mixed-fleet: four sims, the last with half the KV cache. */
static const unsigned mixed_blocks[] = {21770, 21770, 21770, 10885};

const kvr_study_scenario_t kvr_study_scenarios[] = {
    {"multiturn", "multiturn sessions resending the streamed answers", "multiturn", .session = true,
     .warmup_s = 120, .cost_s = COST_MULTITURN},
    {"documents", "150 long documents, 4 questions each", "documents", .warmup_s = 60,
     .cost_s = COST_DOCUMENTS},
    {"control", "unique prompts: nothing to reuse", "control", .warmup_s = 60,
     .cost_s = COST_CONTROL},
    /* 300 measured requests, not 100: a level of 100 holds ten-odd turns of ten-odd sessions, and
     * its p99 (the second-worst TTFT) swung the policies' ranking from seed to seed. */
    {"agentic",
     "20-60 turn tool-using sessions growing past 60k tokens (300 measured requests per level)",
     "agentic", .warmup_s = 300, .num_prompts = 300, .cost_s = COST_AGENTIC},
    {"hot-prefix", "one system prompt in 80% of the requests", "hot-prefix", .warmup_s = 60,
     .cost_s = COST_HOT_PREFIX},
    {"bursty", "multiturn sessions with bursty arrivals (gamma shape 0.3)", "multiturn",
     .session = true, .warmup_s = 120, .burstiness = 0.3, .cost_s = COST_BURSTY},
    {"mixed-fleet", "documents on 4 workers, one with half the KV cache", "documents",
     .warmup_s = 60, .worker_blocks = mixed_blocks, .nworker_blocks = KVR_ARRAY_SIZE(mixed_blocks),
     .cost_s = COST_MIXED_FLEET},
    /* An agent on a Responses server: each turn sends its new message only (the tool output) and
     * names the previous answer's id; the history is the store of the worker that made it. Shape
     * from ../shared/WORKLOAD.md: 3,500-4,000-token system prompts shared by the sessions (its
     * starters), tool outputs of 250-1,250 tokens so that a turn adds ~870 tokens with its
     * ~120-token answer (its turns grow ~875 tokens: inputs 3.5k, 4.1k, 5.0k, 6.1k, 7.0k), 5-15
     * turns, the context capped at its input p95 under load (12,700 tokens); answers are the
     * agentic kind's short tool calls. 300 measured requests per level, as agentic. */
    {"agentic-responses",
     "agentic sessions on the Responses API: 5-15 turns, each sending only its 250-1,250-token "
     "tool output and the previous answer's id (store true), to 12,700 tokens of context; the "
     "router pins each follow-up to the worker that stored its previous response, for every "
     "policy and the oracle, as kvrouter serve does (300 measured requests per level)",
     "agentic", .warmup_s = 120, .num_prompts = 300, .turns_min = 5, .turns_max = 15,
     .tool_min = 250, .tool_max = 1250, .max_context = 12700, .responses = true,
     .cost_s = COST_AGENTIC_RESPONSES},
    {"agentic-responses-no-id-affinity",
     "agentic-responses through a router that does not pin previous_response_id: a follow-up goes "
     "where the policy sends it, and a worker that did not store the response answers vLLM's 404 "
     "(a failed request)",
     "agentic", .warmup_s = 120, .num_prompts = 300, .turns_min = 5, .turns_max = 15,
     .tool_min = 250, .tool_max = 1250, .max_context = 12700, .responses = true,
     .no_response_affinity = true, .cost_s = COST_NO_ID_AFFINITY},
    /* Issue 35: the fleet of KVR_MFLEET_STUDY (model_fleet.h) and traffic for each of its models
     * in proportion to the workers serving it (model-a 10 of 16 workers, 60%; model-b and its
     * adapters 6, 40%), each model with a prefix structure of its own: model-a's chat sessions,
     * model-b's documents, and per adapter a task of its own (a shared SQL schema prompt, chat
     * sessions, code files asked about, one-off maths questions). */
    {"model-fleet",
     "16 workers: model-a on 6 and on a 4-rank DP endpoint, model-b on 6 with four LoRA adapters "
     "(three or four listed per worker, each on 5, --max-loras 2); 60% model-a multiturn "
     "sessions, 20% model-b documents, 5% each b-sql hot-prefix, b-chat multiturn, b-code "
     "documents, b-math control",
     "mix:model-a=multiturn@0.6,model-b=documents@0.2,b-sql=hot-prefix@0.05,"
     "b-chat=multiturn@0.05,b-code=documents@0.05,b-math=control@0.05",
     .warmup_s = 120, .model_fleet = KVR_MFLEET_STUDY, .max_loras = 2, .cost_s = COST_MODEL_FLEET},
    /* The trace's arrivals are its own, scaled to the level's rate (no jitter): the seed moves only
     * the synthesised text, hence the router's block hashes and so the policies' tie-breaks. */
    {"trace",
     "the study's trace (its own arrival times scaled to each rate, no jitter; the seed changes "
     "the synthesised text, so the router's block hashes and tie-breaks) on 4 Llama-3.1-8B/H100 "
     "workers, TTFT p99 < 10 s, TPOT p99 < 100 ms",
     NULL, .trace = true, .preset = TRACE_PRESET, .slo_ttft_ms = TRACE_TTFT_MS,
     .slo_tpot_ms = TRACE_TPOT_MS, .cost_s = COST_TRACE},
    {"trace-fleet",
     "the study's trace at its own rate: the fewest Llama-3.1-8B/H100 workers that serve it within "
     "TTFT p99 < 10 s, TPOT p99 < 100 ms",
     NULL, .trace = true, .preset = TRACE_PRESET, .slo_ttft_ms = TRACE_TTFT_MS,
     .slo_tpot_ms = TRACE_TPOT_MS, .fleet = true, .cost_s = COST_TRACE_FLEET},
    {.name = NULL},
};

const kvr_study_scenario_t *kvr_study_scenario(const char *name) {
  for (const kvr_study_scenario_t *s = kvr_study_scenarios; s->name; s++)
    if (strcmp(s->name, name) == 0)
      return s;
  return NULL;
}

void kvr_study_opts_default(kvr_study_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->seeds = 3;
  o->seed = 42;
  o->resolution = 0.05;
  o->out = "results/study";
}

/* ---- a cell's bench ------------------------------------------------------------------------- */

/* The level plan every cell shares: --num-prompts, --warmup, --min-level-s, --cooldown-s; the
 * search starts at 2 req/s. */
#define CELL_PROMPTS 100
#define CELL_MIN_LEVEL_S 60
#define CELL_COOLDOWN_S 10
#define CELL_SEARCH_START 2
#define STR_(x) #x
#define STR(x) STR_(x) /* a plan figure as its command-line word */

static void scenario_opts(const kvr_study_cell_t *c, kvr_runner_opts_t *o) {
  const kvr_study_scenario_t *sc = c->sc;
  kvr_workload_parse_kind(sc->trace ? c->trace_workload : sc->workload, &o->wl);
  if (sc->trace && c->trace_window != NULL)
    kvr_workload_parse_window(c->trace_window, &o->wl);
  char err[256];
  if (sc->preset != NULL)
    kvr_sim_preset_apply(&o->vc.engine, sc->preset, err, sizeof(err)); /* built in: it fits */
  if (sc->slo_ttft_ms > 0)
    o->slo.ttft_p99_ms = sc->slo_ttft_ms;
  if (sc->slo_tpot_ms > 0)
    o->slo.tpot_p99_ms = sc->slo_tpot_ms;
  if (sc->session)
    o->wl.replay = false;
  o->lg.warmup_s = sc->warmup_s;
  if (sc->num_prompts)
    o->lg.num_prompts = sc->num_prompts;
  if (sc->burstiness > 0)
    o->lg.burstiness = sc->burstiness;
  for (size_t i = 0; i < sc->nworker_blocks && i < KVR_ARRAY_SIZE(o->vc.worker_blocks); i++)
    o->vc.worker_blocks[i] = sc->worker_blocks[i];
  if (sc->nworker_blocks)
    o->vc.nworker_blocks = KVR_MIN(sc->nworker_blocks, KVR_ARRAY_SIZE(o->vc.worker_blocks));
  if (sc->turns_min)
    o->wl.agentic_turns_min = sc->turns_min;
  if (sc->turns_max)
    o->wl.agentic_turns_max = sc->turns_max;
  if (sc->tool_min)
    o->wl.tool_min_tokens = sc->tool_min;
  if (sc->tool_max)
    o->wl.tool_max_tokens = sc->tool_max;
  if (sc->max_context)
    o->wl.agentic_max_context = sc->max_context;
  if (sc->responses)
    o->lg.api = KVR_API_RESPONSES;
  if (sc->no_response_affinity)
    o->vc.no_response_affinity = true;
  if (sc->model_fleet)
    o->vc.model_fleet = sc->model_fleet;
  if (sc->max_loras)
    o->vc.max_loras = sc->max_loras;
}

void kvr_study_cell_opts(const kvr_study_cell_t *c, kvr_runner_opts_t *o) {
  o->virt = true;
  for (size_t p = 0; p < c->npolicies && p < KVR_RUNNER_MAX_LIST; p++) {
    o->ab[o->nab++] = kvr_xstrdup(c->policies[p]);
    o->labels[o->nlabels++] = kvr_xstrdup(c->policies[p]);
  }
  o->seed = c->seed;
  if (c->sc->fleet) {
    o->size_fleet = true;
  } else {
    o->search = true;
    o->search_start = CELL_SEARCH_START;
    o->search_res = c->resolution;
  }
  /* a trace level sends the trace once: --num-prompts and --min-level-s do not apply */
  if (!c->sc->trace)
    o->lg.num_prompts = CELL_PROMPTS;
  o->lg.warmup = 0;
  if (!c->sc->trace)
    o->lg.min_level_s = CELL_MIN_LEVEL_S;
  o->cooldown_s = CELL_COOLDOWN_S;
  o->quiet = true;
  o->out = c->out;
  o->title = c->title;
  scenario_opts(c, o);
}

static void word(kvr_study_words_t *w, const char *a) {
  if (w->argc < KVR_STUDY_WORDS_MAX - 1)
    w->argv[w->argc++] = (char *)a;
  w->argv[w->argc] = NULL;
}

static void word2(kvr_study_words_t *w, const char *flag, const char *value) {
  word(w, flag);
  word(w, value);
}

/* The scenario's flags, in the order scenario_opts() sets them. */
static void scenario_words(const kvr_study_cell_t *c, kvr_study_words_t *w) {
  const kvr_study_scenario_t *sc = c->sc;
  word2(w, "--workload", sc->trace ? c->trace_workload : sc->workload);
  if (sc->trace && c->trace_window != NULL)
    word2(w, "--trace-window", c->trace_window);
  if (sc->preset != NULL)
    word2(w, "--preset", sc->preset);
  if (sc->slo_ttft_ms > 0) {
    snprintf(w->slo_ttft, sizeof(w->slo_ttft), "%g", sc->slo_ttft_ms);
    word2(w, "--slo-ttft-ms", w->slo_ttft);
  }
  if (sc->slo_tpot_ms > 0) {
    snprintf(w->slo_tpot, sizeof(w->slo_tpot), "%g", sc->slo_tpot_ms);
    word2(w, "--slo-tpot-ms", w->slo_tpot);
  }
  if (sc->session)
    word2(w, "--multiturn-mode", "session");
  snprintf(w->warmup, sizeof(w->warmup), "%g", sc->warmup_s);
  word2(w, "--warmup-s", w->warmup);
  if (sc->num_prompts) {
    snprintf(w->prompts, sizeof(w->prompts), "%u", sc->num_prompts);
    word2(w, "--num-prompts", w->prompts);
  }
  if (sc->burstiness > 0) {
    snprintf(w->burst, sizeof(w->burst), "%g", sc->burstiness);
    word2(w, "--burstiness", w->burst);
  }
  size_t k = 0;
  for (size_t i = 0; i < sc->nworker_blocks && k < sizeof(w->blocks); i++)
    k += (size_t)snprintf(w->blocks + k, sizeof(w->blocks) - k, "%s%u", i ? "," : "",
                          sc->worker_blocks[i]);
  if (sc->nworker_blocks)
    word2(w, "--worker-blocks", w->blocks);
  const char *shape_flags[5] = {"--agentic-turns-min", "--agentic-turns-max", "--tool-min-tokens",
                                "--tool-max-tokens", "--agentic-max-context"};
  unsigned shape[5] = {sc->turns_min, sc->turns_max, sc->tool_min, sc->tool_max, sc->max_context};
  for (size_t i = 0; i < 5; i++)
    if (shape[i]) {
      snprintf(w->shape[i], sizeof(w->shape[i]), "%u", shape[i]);
      word2(w, shape_flags[i], w->shape[i]);
    }
  if (sc->responses)
    word2(w, "--api", "responses");
  if (sc->no_response_affinity)
    word(w, "--no-response-affinity");
  if (sc->model_fleet)
    word2(w, "--model-fleet", sc->model_fleet);
  if (sc->max_loras) {
    snprintf(w->loras, sizeof(w->loras), "%u", sc->max_loras);
    word2(w, "--max-loras", w->loras);
  }
}

void kvr_study_cell_words(const kvr_study_cell_t *c, kvr_study_words_t *w) {
  w->argc = 0;
  size_t k = 0;
  w->ab[0] = '\0';
  for (size_t p = 0; p < c->npolicies && k < sizeof(w->ab); p++)
    k += (size_t)snprintf(w->ab + k, sizeof(w->ab) - k, "%s%s", p ? "," : "", c->policies[p]);
  snprintf(w->seed, sizeof(w->seed), "%llu", c->seed);
  snprintf(w->res, sizeof(w->res), "%.15g", c->resolution);
  word2(w, "bench", "--virtual");
  word2(w, "--ab", w->ab);
  word2(w, "--labels", w->ab);
  word2(w, "--seed", w->seed);
  if (c->sc->fleet) {
    word(w, "--size-fleet");
  } else {
    word2(w, "--search", "--search-start");
    word(w, STR(CELL_SEARCH_START));
    word2(w, "--search-resolution", w->res);
  }
  if (!c->sc->trace)
    word2(w, "--num-prompts", STR(CELL_PROMPTS));
  word2(w, "--warmup", "0");
  if (!c->sc->trace)
    word2(w, "--min-level-s", STR(CELL_MIN_LEVEL_S));
  word2(w, "--cooldown-s", STR(CELL_COOLDOWN_S));
  word(w, "--quiet");
  word2(w, "--out", c->out);
  word2(w, "--title", c->title);
  scenario_words(c, w);
  for (int i = 0; i < c->nextra; i++)
    word(w, c->extra[i]);
}

/* ---- cells ----------------------------------------------------------------------------------- */

typedef struct cell_s {
  kvr_study_cell_t c;
  char out[1024], title[256], trace[1100];
  kvr_report_cap_t caps[KVR_STUDY_MAX];
  kvr_fleet_answer_t fleets[KVR_STUDY_MAX]; /* a fleet scenario's answers */
  char **extra; /* the caller's fleet flags where they apply, then its extra flags (owned) */
  int status;
  char err[512];
  double seconds;
} cell_t;

typedef struct study_s {
  const kvr_study_opts_t *o;
  kvr_study_run_fn run;
  const char *policies[KVR_STUDY_MAX];
  size_t npolicies;
  const kvr_study_scenario_t *scs[KVR_STUDY_MAX];
  size_t nscs;
  cell_t *cells;
  size_t *order; /* the cells in the order the threads take them */
  size_t ncells, next, ndone;
  const char *trace_note; /* why the default set left the trace scenarios out, or NULL */
  char note[1300];
  pthread_mutex_t mu;
  FILE *progress;
  unsigned jobs; /* threads */
} study_t;

static void cell_init(study_t *st, cell_t *cell, const kvr_study_scenario_t *sc,
                      unsigned long long seed) {
  const kvr_study_opts_t *o = st->o;
  snprintf(cell->out, sizeof(cell->out), "%s/%s/seed%llu", o->out, sc->name, seed);
  snprintf(cell->title, sizeof(cell->title), "kvrouter study: %s, seed %llu", sc->name, seed);
  snprintf(cell->trace, sizeof(cell->trace), "trace:%s", o->trace ? o->trace : "");
  /* A scenario with a fleet of its own (mixed-fleet's KV caches, model-fleet's models) keeps it:
   * the caller's --workers/--worker-blocks are for the others. */
  int nfleet = sc->nworker_blocks || sc->model_fleet ? 0 : o->nfleet;
  cell->extra = kvr_xcalloc((size_t)(nfleet + o->nextra) + 1, sizeof(char *));
  for (int i = 0; i < nfleet; i++)
    cell->extra[i] = o->fleet[i];
  for (int i = 0; i < o->nextra; i++)
    cell->extra[nfleet + i] = o->extra[i];
  cell->c = (kvr_study_cell_t){.sc = sc,
                               .seed = seed,
                               .policies = st->policies,
                               .npolicies = st->npolicies,
                               .resolution = o->resolution,
                               .out = cell->out,
                               .title = cell->title,
                               .extra = cell->extra,
                               .nextra = nfleet + o->nextra,
                               .trace_workload = cell->trace,
                               .trace_window = o->trace_window};
}

static void cell_run(study_t *st, cell_t *cell) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  kvr_results_t *res = NULL;
  cell->status = st->run(&cell->c, &res, cell->err, sizeof(cell->err));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  cell->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  for (size_t p = 0; res && p < st->npolicies && p < res->nruns; p++) {
    cell->caps[p] = kvr_report_cap(&res->runs[p]);
    cell->fleets[p] = kvr_fleet_answer(&res->runs[p]);
  }
  if (res && res->nruns < st->npolicies && cell->status == 0) {
    cell->status = 1;
    snprintf(cell->err, sizeof(cell->err), "ran %zu of %zu policies", res->nruns, st->npolicies);
  }
  kvr_stats_results_free(res);
}

static void *worker(void *arg) {
  study_t *st = arg;
  for (;;) {
    pthread_mutex_lock(&st->mu);
    size_t i = st->next < st->ncells ? st->next++ : SIZE_MAX;
    pthread_mutex_unlock(&st->mu);
    if (i == SIZE_MAX)
      return NULL;
    cell_t *c = &st->cells[st->order[i]];
    cell_run(st, c);
    pthread_mutex_lock(&st->mu);
    st->ndone++;
    if (st->progress) {
      fprintf(st->progress, "[study %zu/%zu] %s seed %llu: %s in %.1f s\n", st->ndone, st->ncells,
              c->c.sc->name, c->c.seed, c->status ? c->err : "done", c->seconds);
      fflush(st->progress);
    }
    pthread_mutex_unlock(&st->mu);
  }
}

/* ---- the table ------------------------------------------------------------------------------- */

typedef kvr_study_agg_t agg_t;

/* A cell's figure for policy p: its max SLO-compliant rate, or (a fleet scenario) the workers it
 * needs, the largest fleet tried + 1 when none passed. False when the policy did not run. */
static bool cell_figure(const study_t *st, const cell_t *c, size_t p, double *x, bool *lower) {
  if (c->status != 0)
    return false;
  if (c->c.sc->fleet) {
    const kvr_fleet_answer_t *f = &c->fleets[p];
    if (f->tried == 0)
      return false;
    *lower = f->workers == 0;
    *x = f->workers ? (double)f->workers : (double)f->most_failed + 1;
    return true;
  }
  if (!c->caps[p].ran)
    return false;
  *x = c->caps[p].load;
  *lower = !c->caps[p].found;
  return true;
}

static agg_t aggregate(const study_t *st, size_t sc, size_t p) {
  agg_t a = {0, INFINITY, 0, false, 0};
  for (size_t s = 0; s < st->o->seeds; s++) {
    const cell_t *c = &st->cells[sc * st->o->seeds + s];
    double x;
    bool lower;
    if (!cell_figure(st, c, p, &x, &lower))
      continue;
    a.mean += x;
    a.min = fmin(a.min, x);
    a.max = fmax(a.max, x);
    a.lower |= lower;
    a.n++;
  }
  if (a.n)
    a.mean /= (double)a.n;
  else
    a.min = 0;
  return a;
}

static bool is_reference(const char *name) {
  return strcmp(name, "kv_aware") != 0 && strcmp(name, "round_robin") != 0 &&
         strcmp(name, "least_load") != 0 && strcmp(name, KVR_VCLUSTER_ORACLE) != 0;
}

static int policy_index(const study_t *st, const char *name) {
  for (size_t p = 0; p < st->npolicies; p++)
    if (strcmp(st->policies[p], name) == 0)
      return (int)p;
  return -1;
}

static void ratio_cell(kvr_buf_t *b, agg_t num, agg_t den) {
  if (num.n == 0 || den.n == 0 || den.mean <= 0) {
    kvr_buf_puts(b, " - |");
    return;
  }
  /* A lower-bound numerator makes the ratio a lower bound; a lower-bound denominator an upper. */
  const char *mark = num.lower && !den.lower ? ">= " : !num.lower && den.lower ? "<= " : "";
  kvr_buf_printf(b, " %s%.2fx%s |", mark, num.mean / den.mean,
                 num.lower && den.lower ? " (both bounds)" : "");
}

/* The table's head: the policies, then kv_aware's three ratios (a fleet table: the other's
 * workers over kv_aware's, fewer being better). */
static void table_head(const study_t *st, bool fleet, kvr_buf_t *b) {
  kvr_buf_puts(b, "| scenario |");
  for (size_t p = 0; p < st->npolicies; p++)
    kvr_buf_printf(b, " %s |", st->policies[p]);
  kvr_buf_puts(b,
               fleet ? " round_robin / kv_aware | best reference / kv_aware | oracle / kv_aware |"
                     : " kv_aware / round_robin | kv_aware / best reference | kv_aware / oracle |");
  kvr_buf_puts(b, "\n|---|");
  for (size_t p = 0; p < st->npolicies + 3; p++)
    kvr_buf_puts(b, "---:|");
  kvr_buf_puts(b, "\n");
}

/* Scenario s's row: each policy's mean [min-max] and kv_aware's ratios. A rate row's best
 * reference has the highest rate and the ratios are kv_aware's over the other's; a fleet row's has
 * the fewest workers and the ratios are the other's over kv_aware's: above 1, kv_aware needs fewer.
 */
static void table_row(const study_t *st, size_t s, kvr_buf_t *b) {
  const kvr_study_opts_t *o = st->o;
  bool fleet = st->scs[s]->fleet;
  const char *fmt = fleet ? " %s%.2f [%.0f-%.0f] |" : " %s%.2f [%.2f-%.2f] |";
  kvr_buf_printf(b, "| %s |", st->scs[s]->name);
  int best = -1;
  agg_t bestv = {0};
  for (size_t p = 0; p < st->npolicies; p++) {
    agg_t a = aggregate(st, s, p);
    if (a.n == 0)
      kvr_buf_puts(b, " - |");
    else if (o->seeds == 1)
      kvr_buf_printf(b, fleet ? " %s%.0f |" : " %s%.2f |", a.lower ? ">= " : "", a.mean);
    else
      kvr_buf_printf(b, fmt, a.lower ? ">= " : "", a.mean, a.min, a.max);
    bool better = fleet ? a.mean < bestv.mean : a.mean > bestv.mean;
    if (is_reference(st->policies[p]) && a.n && (best < 0 || better)) {
      best = (int)p;
      bestv = a;
    }
  }
  int kv = policy_index(st, "kv_aware"), rr = policy_index(st, "round_robin"),
      orc = policy_index(st, KVR_VCLUSTER_ORACLE);
  agg_t none = {0};
  agg_t kva = kv >= 0 ? aggregate(st, s, (size_t)kv) : none;
  agg_t rra = rr >= 0 ? aggregate(st, s, (size_t)rr) : none;
  agg_t orca = orc >= 0 ? aggregate(st, s, (size_t)orc) : none;
  agg_t bra = best >= 0 ? bestv : none;
  ratio_cell(b, fleet ? rra : kva, fleet ? kva : rra);
  size_t mark = b->len;
  ratio_cell(b, fleet ? bra : kva, fleet ? kva : bra);
  if (best >= 0 && b->len > mark + 2) {
    b->len -= 2; /* " |" */
    b->data[b->len] = '\0';
    kvr_buf_printf(b, " (%s) |", st->policies[best]);
  }
  ratio_cell(b, fleet ? orca : kva, fleet ? kva : orca);
  kvr_buf_puts(b, "\n");
}

static bool any_fleet(const study_t *st) {
  for (size_t s = 0; s < st->nscs; s++)
    if (st->scs[s]->fleet)
      return true;
  return false;
}

static void render_md(const study_t *st, double seconds, kvr_buf_t *b) {
  const kvr_study_opts_t *o = st->o;
  kvr_buf_printf(b, "# kvrouter policy study (virtual time)\n\n");
  /* One seed (the demo's study) has no spread to show: its limits stand alone. */
  char what[256];
  if (o->seeds == 1)
    snprintf(what, sizeof(what), "seed %llu; \">=\" marks a limit that was not found", o->seed);
  else
    snprintf(what, sizeof(what),
             "the mean over %u seeds (%llu..%llu), with the lowest and highest seed in brackets; "
             "\">=\" marks a mean with some seed whose limit was not found",
             o->seeds, o->seed, o->seed + o->seeds - 1);
  kvr_buf_printf(b,
                 "Max SLO-compliant rate (req/s) per policy, %s (every level it tried passed). "
                 "Search resolution %g req/s. %zu cell%s on %u threads took %.1f s.\n\n",
                 what, o->resolution, st->ncells, st->ncells == 1 ? "" : "s", st->jobs, seconds);
  table_head(st, false, b);
  for (size_t s = 0; s < st->nscs; s++)
    if (!st->scs[s]->fleet)
      table_row(st, s, b);
  if (any_fleet(st)) {
    kvr_buf_printf(b,
                   "\n## Fleet sizing\n\nWorkers needed per policy: the smallest fleet that "
                   "serves the scenario's traffic within its SLOs (`--size-fleet`: from --workers, "
                   "4, doubling while a fleet fails, at most %d, halving while one passes, then "
                   "bisecting to adjacent fleets), %s (no fleet tried served it; the figure is "
                   "the largest tried + 1). Fewer is better: each ratio is the other policy's "
                   "workers over kv_aware's.\n\n",
                   KVR_FLEET_MAX_DEFAULT, what);
    table_head(st, true, b);
    for (size_t s = 0; s < st->nscs; s++)
      if (st->scs[s]->fleet)
        table_row(st, s, b);
  }
  if (st->trace_note != NULL)
    kvr_buf_printf(b, "\n%s\n", st->trace_note);
  kvr_buf_puts(b, "\n## Scenarios\n\n");
  for (size_t s = 0; s < st->nscs; s++) {
    kvr_study_words_t w;
    kvr_study_cell_words(&st->cells[s * o->seeds].c, &w);
    kvr_buf_printf(b, "- **%s**: %s. First seed's command: `kvrouter", st->scs[s]->name,
                   st->scs[s]->about);
    for (int i = 0; i < w.argc; i++)
      kvr_buf_printf(b, " %s", w.argv[i]);
    kvr_buf_puts(b, "`\n");
  }
  kvr_buf_puts(b, "\nEach cell's own report: <scenario>/seed<N>/report.md.\n");
}

static void render_json(const study_t *st, double seconds, kvr_buf_t *b) {
  const kvr_study_opts_t *o = st->o;
  kvr_buf_printf(b,
                 "{\"virtual\":true,\"seeds\":%u,\"first_seed\":%llu,\"resolution\":%g,"
                 "\"seconds\":%.3f,\"threads\":%u,\"policies\":[",
                 o->seeds, o->seed, o->resolution, seconds, st->jobs);
  for (size_t p = 0; p < st->npolicies; p++)
    kvr_buf_printf(b, "%s\"%s\"", p ? "," : "", st->policies[p]);
  kvr_buf_puts(b, "],\"scenarios\":[");
  for (size_t s = 0; s < st->nscs; s++) {
    bool fleet = st->scs[s]->fleet;
    kvr_buf_printf(b, "%s{\"name\":\"%s\",%s\"cells\":[", s ? "," : "", st->scs[s]->name,
                   fleet ? "\"fleet\":true," : "");
    for (size_t k = 0; k < o->seeds; k++) {
      const cell_t *c = &st->cells[s * o->seeds + k];
      kvr_buf_printf(b, "%s{\"seed\":%llu,\"status\":%d,\"seconds\":%.3f,\"%s\":{", k ? "," : "",
                     c->c.seed, c->status, c->seconds, fleet ? "workers" : "max_rate");
      for (size_t p = 0; p < st->npolicies; p++)
        if (fleet)
          kvr_buf_printf(b, "%s\"%s\":{\"workers\":%u,\"exact\":%s,\"most_failed\":%u}",
                         p ? "," : "", st->policies[p], c->fleets[p].workers,
                         c->fleets[p].exact ? "true" : "false", c->fleets[p].most_failed);
        else
          kvr_buf_printf(b, "%s\"%s\":{\"rate\":%g,\"found\":%s,\"ran\":%s}", p ? "," : "",
                         st->policies[p], c->caps[p].load, c->caps[p].found ? "true" : "false",
                         c->caps[p].ran ? "true" : "false");
      kvr_buf_puts(b, "}}");
    }
    kvr_buf_puts(b, "],\"mean\":{");
    for (size_t p = 0; p < st->npolicies; p++) {
      agg_t a = aggregate(st, s, p);
      kvr_buf_printf(b, "%s\"%s\":{\"mean\":%g,\"min\":%g,\"max\":%g,\"lower_bound\":%s,\"n\":%zu}",
                     p ? "," : "", st->policies[p], a.mean, a.min, a.max,
                     a.lower ? "true" : "false", a.n);
    }
    kvr_buf_puts(b, "}}");
  }
  kvr_buf_puts(b, "]}\n");
}

/* DIR/NAME from b; 0 or nonzero with the reason in err. */
static int write_in(const char *dir, const char *name, const kvr_buf_t *b, char *err,
                    size_t errlen) {
  char path[1200];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  return kvr_report_write_file(path, b, err, errlen);
}

/* ---- the run --------------------------------------------------------------------------------- */

void kvr_study_order(const kvr_study_scenario_t *const *scs, size_t nscs, unsigned seeds,
                     size_t *order) {
  size_t n = nscs * seeds;
  for (size_t i = 0; i < n; i++) { /* insertion sort: stable, and a study has few cells */
    size_t j = i;
    double cost = scs[i / seeds]->cost_s;
    for (; j > 0 && scs[order[j - 1] / seeds]->cost_s < cost; j--)
      order[j] = order[j - 1];
    order[j] = i;
  }
}

/* The trace scenarios' trace: 0 when it can be read and its window is well formed, else 2 with
 * one line in err. */
static int check_trace(const kvr_study_opts_t *o, char *err, size_t errlen) {
  kvr_workload_opts_t wl;
  if (o->trace == NULL || *o->trace == '\0') {
    snprintf(err, errlen, "--scenarios: the trace scenarios replay a trace: give --trace FILE");
    return 2;
  }
  if (access(o->trace, R_OK) != 0) {
    snprintf(err, errlen, "--trace: cannot read %s", o->trace);
    return 2;
  }
  if (o->trace_window != NULL && kvr_workload_parse_window(o->trace_window, &wl) != 0) {
    snprintf(err, errlen, "--trace-window: '%s' is not START_S:END_S", o->trace_window);
    return 2;
  }
  return 0;
}

/* Every scenario; the trace scenarios when the trace is there, else a note that says why not. */
static int default_scenarios(study_t *st, char *err, size_t errlen) {
  const kvr_study_opts_t *o = st->o;
  bool traced = o->trace != NULL && *o->trace != '\0';
  if (traced && access(o->trace, R_OK) != 0) {
    traced = false;
    snprintf(st->note, sizeof(st->note),
             "The trace scenarios were not run: %s cannot be read (kvrouter bench study --trace "
             "FILE).",
             o->trace);
    st->trace_note = st->note;
  }
  if (traced && check_trace(o, err, errlen) != 0)
    return 2;
  for (const kvr_study_scenario_t *s = kvr_study_scenarios; s->name; s++)
    if (traced || !s->trace)
      st->scs[st->nscs++] = s;
  return 0;
}

static int check(study_t *st, char *err, size_t errlen) {
  const kvr_study_opts_t *o = st->o;
  if (o->nscenarios == 0 && default_scenarios(st, err, errlen) != 0)
    return 2;
  for (size_t i = 0; i < o->nscenarios; i++) {
    const kvr_study_scenario_t *s = kvr_study_scenario(o->scenarios[i]);
    if (s == NULL) {
      kvr_buf_t names = KVR_BUF_INIT;
      for (const kvr_study_scenario_t *t = kvr_study_scenarios; t->name; t++)
        kvr_buf_printf(&names, "%s%s", names.len ? ", " : "", t->name);
      snprintf(err, errlen, "--scenarios: unknown scenario '%s' (valid: %s)", o->scenarios[i],
               names.data);
      kvr_buf_free(&names);
      return 2;
    }
    if (s->trace && check_trace(o, err, errlen) != 0)
      return 2;
    st->scs[st->nscs++] = s;
  }
  if (o->npolicies == 0) {
    for (size_t i = 0; kvr_policy_registry[i] && st->npolicies < KVR_STUDY_MAX - 1; i++)
      st->policies[st->npolicies++] = kvr_policy_registry[i]->name;
    st->policies[st->npolicies++] = KVR_VCLUSTER_ORACLE;
  }
  for (size_t i = 0; i < o->npolicies; i++) {
    if (strcmp(o->policies[i], KVR_VCLUSTER_ORACLE) != 0 &&
        kvr_policy_find(o->policies[i]) == NULL) {
      char names[512];
      kvr_policy_names(names, sizeof(names));
      snprintf(err, errlen, "--policies: unknown policy '%s' (valid: %s, %s)", o->policies[i],
               names, KVR_VCLUSTER_ORACLE);
      return 2;
    }
    st->policies[st->npolicies++] = o->policies[i];
  }
  return 0;
}

int kvr_study_run(const kvr_study_opts_t *o, kvr_study_run_fn run, FILE *out,
                  kvr_study_summary_t *sum, char *err, size_t errlen) {
  study_t st = {.o = o, .run = run, .progress = o->quiet ? NULL : stderr};
  int rc = check(&st, err, errlen);
  if (rc != 0)
    return rc;
  char e2[600];
  if (kvr_report_mkdir_p(o->out, e2, sizeof(e2)) != 0) {
    snprintf(err, errlen, "--out: cannot create %s (%s)", o->out, e2);
    return 1;
  }
  st.ncells = st.nscs * o->seeds;
  st.cells = kvr_xcalloc(st.ncells, sizeof(cell_t));
  st.order = kvr_xcalloc(st.ncells, sizeof(size_t));
  for (size_t s = 0; s < st.nscs; s++)
    for (unsigned k = 0; k < o->seeds; k++)
      cell_init(&st, &st.cells[s * o->seeds + k], st.scs[s], o->seed + k);
  kvr_study_order(st.scs, st.nscs, o->seeds, st.order);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  st.jobs = o->jobs ? o->jobs : cores > 0 ? (unsigned)cores : 1;
  pthread_mutex_init(&st.mu, NULL);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pthread_t th[64];
  unsigned nth = KVR_MIN(st.jobs, 64u);
  for (unsigned i = 0; i < nth; i++)
    pthread_create(&th[i], NULL, worker, &st);
  for (unsigned i = 0; i < nth; i++)
    pthread_join(th[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  pthread_mutex_destroy(&st.mu);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  if (sum != NULL) {
    memset(sum, 0, sizeof(*sum));
    sum->seconds = seconds;
    sum->nscenarios = st.nscs;
    sum->npolicies = st.npolicies;
    for (size_t p = 0; p < st.npolicies; p++)
      sum->policies[p] = st.policies[p];
    for (size_t s = 0; s < st.nscs; s++) {
      sum->scenarios[s] = st.scs[s]->name;
      sum->fleet[s] = st.scs[s]->fleet;
      for (size_t p = 0; p < st.npolicies; p++)
        sum->agg[s][p] = aggregate(&st, s, p);
    }
  }
  kvr_buf_t md = KVR_BUF_INIT, js = KVR_BUF_INIT;
  render_md(&st, seconds, &md);
  render_json(&st, seconds, &js);
  rc = write_in(o->out, "STUDY.md", &md, err, errlen) ||
       write_in(o->out, "study.json", &js, err, errlen);
  fputs(md.data, out);
  fprintf(out, "\nStudy: %s/STUDY.md (study.json beside it)\n", o->out);
  int failed = 0;
  for (size_t i = 0; i < st.ncells; i++)
    if (st.cells[i].status != 0) {
      if (!failed)
        snprintf(err, errlen, "%s seed %llu: %s", st.cells[i].c.sc->name, st.cells[i].c.seed,
                 st.cells[i].err);
      failed++;
    }
  kvr_buf_free(&md);
  kvr_buf_free(&js);
  for (size_t i = 0; i < st.ncells; i++)
    free(st.cells[i].extra);
  free(st.order);
  free(st.cells);
  return rc ? 1 : failed ? 1 : 0;
}

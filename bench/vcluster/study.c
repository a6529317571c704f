/* study.c -- `kvrouter bench study`: cells on a thread pool, then the table.
 *
 * Flow: kvr_study_run() checks the names -> one kvr_study_cell_t per (scenario, seed) -> `jobs`
 * threads take cells in order from a shared counter and run each through the caller's
 * kvr_study_run_fn (a whole virtual bench whose settings kvr_study_cell_opts() makes, its command
 * line kvr_study_cell_words(): its report lands in the cell's folder) -> each cell's
 * per-policy max SLO-compliant load (kvr_report_cap) is kept -> the table (mean, min, max over the
 * seeds; "at least" when some seed found no limit) and the ratios are written as STUDY.md and
 * study.json and printed.
 *
 * Invariants: cells share nothing but this file's read-only tables and the caller's run function;
 * a cell's results are written only by the thread that ran it, and read after every thread joined.
 */
#include "study.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "bench/loadgen/workload.h"
#include "bench/report/report.h"
#include "bench/vcluster/vcluster.h"
#include "policies/policy.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* mixed-fleet: four sims, the last with half the KV cache. */
static const unsigned mixed_blocks[] = {21770, 21770, 21770, 10885};

const kvr_study_scenario_t kvr_study_scenarios[] = {
    {"multiturn", "multiturn sessions resending the streamed answers", "multiturn", .session = true,
     .warmup_s = 120},
    {"documents", "150 long documents, 4 questions each", "documents", .warmup_s = 60},
    {"control", "unique prompts: nothing to reuse", "control", .warmup_s = 60},
    /* 300 measured requests, not 100: a level of 100 holds ten-odd turns of ten-odd sessions, and
     * its p99 (the second-worst TTFT) swung the policies' ranking from seed to seed. */
    {"agentic",
     "20-60 turn tool-using sessions growing past 60k tokens (300 measured requests per level)",
     "agentic", .warmup_s = 300, .num_prompts = 300},
    {"hot-prefix", "one system prompt in 80% of the requests", "hot-prefix", .warmup_s = 60},
    {"bursty", "multiturn sessions with bursty arrivals (gamma shape 0.3)", "multiturn",
     .session = true, .warmup_s = 120, .burstiness = 0.3},
    {"mixed-fleet", "documents on 4 workers, one with half the KV cache", "documents",
     .warmup_s = 60, .worker_blocks = mixed_blocks, .nworker_blocks = KVR_ARRAY_SIZE(mixed_blocks)},
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

static void scenario_opts(const kvr_study_scenario_t *sc, kvr_runner_opts_t *o) {
  kvr_workload_parse_kind(sc->workload, &o->wl);
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
}

void kvr_study_cell_opts(const kvr_study_cell_t *c, kvr_runner_opts_t *o) {
  o->virt = true;
  for (size_t p = 0; p < c->npolicies && p < KVR_RUNNER_MAX_LIST; p++) {
    o->ab[o->nab++] = kvr_xstrdup(c->policies[p]);
    o->labels[o->nlabels++] = kvr_xstrdup(c->policies[p]);
  }
  o->seed = c->seed;
  o->search = true;
  o->search_start = CELL_SEARCH_START;
  o->search_res = c->resolution;
  o->lg.num_prompts = CELL_PROMPTS;
  o->lg.warmup = 0;
  o->lg.min_level_s = CELL_MIN_LEVEL_S;
  o->cooldown_s = CELL_COOLDOWN_S;
  o->quiet = true;
  o->out = c->out;
  o->title = c->title;
  scenario_opts(c->sc, o);
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
static void scenario_words(const kvr_study_scenario_t *sc, kvr_study_words_t *w) {
  word2(w, "--workload", sc->workload);
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
  word2(w, "--search", "--search-start");
  word(w, STR(CELL_SEARCH_START));
  word2(w, "--search-resolution", w->res);
  word2(w, "--num-prompts", STR(CELL_PROMPTS));
  word2(w, "--warmup", "0");
  word2(w, "--min-level-s", STR(CELL_MIN_LEVEL_S));
  word2(w, "--cooldown-s", STR(CELL_COOLDOWN_S));
  word(w, "--quiet");
  word2(w, "--out", c->out);
  word2(w, "--title", c->title);
  scenario_words(c->sc, w);
  for (int i = 0; i < c->nextra; i++)
    word(w, c->extra[i]);
}

/* ---- cells ----------------------------------------------------------------------------------- */

typedef struct cell_s {
  kvr_study_cell_t c;
  char out[1024], title[256];
  kvr_report_cap_t caps[KVR_STUDY_MAX];
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
  size_t ncells, next, ndone;
  pthread_mutex_t mu;
  FILE *progress;
  unsigned jobs; /* threads */
} study_t;

static void cell_init(study_t *st, cell_t *cell, const kvr_study_scenario_t *sc,
                      unsigned long long seed) {
  const kvr_study_opts_t *o = st->o;
  snprintf(cell->out, sizeof(cell->out), "%s/%s/seed%llu", o->out, sc->name, seed);
  snprintf(cell->title, sizeof(cell->title), "kvrouter study: %s, seed %llu", sc->name, seed);
  cell->c = (kvr_study_cell_t){.sc = sc,
                               .seed = seed,
                               .policies = st->policies,
                               .npolicies = st->npolicies,
                               .resolution = o->resolution,
                               .out = cell->out,
                               .title = cell->title,
                               .extra = o->extra,
                               .nextra = o->nextra};
}

static void cell_run(study_t *st, cell_t *cell) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  kvr_results_t *res = NULL;
  cell->status = st->run(&cell->c, &res, cell->err, sizeof(cell->err));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  cell->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  for (size_t p = 0; res && p < st->npolicies && p < res->nruns; p++)
    cell->caps[p] = kvr_report_cap(&res->runs[p]);
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
    cell_t *c = &st->cells[i];
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

static agg_t aggregate(const study_t *st, size_t sc, size_t p) {
  agg_t a = {0, INFINITY, 0, false, 0};
  for (size_t s = 0; s < st->o->seeds; s++) {
    const cell_t *c = &st->cells[sc * st->o->seeds + s];
    if (c->status != 0 || !c->caps[p].ran)
      continue;
    double x = c->caps[p].load;
    a.mean += x;
    a.min = fmin(a.min, x);
    a.max = fmax(a.max, x);
    a.lower |= !c->caps[p].found;
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
  kvr_buf_puts(b, "| scenario |");
  for (size_t p = 0; p < st->npolicies; p++)
    kvr_buf_printf(b, " %s |", st->policies[p]);
  kvr_buf_puts(b,
               " kv_aware / round_robin | kv_aware / best reference | kv_aware / oracle |\n|---|");
  for (size_t p = 0; p < st->npolicies + 3; p++)
    kvr_buf_puts(b, "---:|");
  kvr_buf_puts(b, "\n");
  int kv = policy_index(st, "kv_aware"), rr = policy_index(st, "round_robin"),
      orc = policy_index(st, KVR_VCLUSTER_ORACLE);
  for (size_t s = 0; s < st->nscs; s++) {
    kvr_buf_printf(b, "| %s |", st->scs[s]->name);
    int best = -1;
    agg_t bestv = {0};
    for (size_t p = 0; p < st->npolicies; p++) {
      agg_t a = aggregate(st, s, p);
      if (a.n == 0)
        kvr_buf_puts(b, " - |");
      else if (o->seeds == 1)
        kvr_buf_printf(b, " %s%.2f |", a.lower ? ">= " : "", a.mean);
      else
        kvr_buf_printf(b, " %s%.2f [%.2f-%.2f] |", a.lower ? ">= " : "", a.mean, a.min, a.max);
      if (is_reference(st->policies[p]) && a.n && (best < 0 || a.mean > bestv.mean)) {
        best = (int)p;
        bestv = a;
      }
    }
    agg_t kva = kv >= 0 ? aggregate(st, s, (size_t)kv) : (agg_t){0};
    agg_t none = {0};
    ratio_cell(b, kva, rr >= 0 ? aggregate(st, s, (size_t)rr) : none);
    size_t mark = b->len;
    ratio_cell(b, kva, best >= 0 ? bestv : none);
    if (best >= 0 && b->len > mark + 2) {
      b->len -= 2; /* " |" */
      b->data[b->len] = '\0';
      kvr_buf_printf(b, " (%s) |", st->policies[best]);
    }
    ratio_cell(b, kva, orc >= 0 ? aggregate(st, s, (size_t)orc) : none);
    kvr_buf_puts(b, "\n");
  }
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
    kvr_buf_printf(b, "%s{\"name\":\"%s\",\"cells\":[", s ? "," : "", st->scs[s]->name);
    for (size_t k = 0; k < o->seeds; k++) {
      const cell_t *c = &st->cells[s * o->seeds + k];
      kvr_buf_printf(b, "%s{\"seed\":%llu,\"status\":%d,\"seconds\":%.3f,\"max_rate\":{",
                     k ? "," : "", c->c.seed, c->status, c->seconds);
      for (size_t p = 0; p < st->npolicies; p++)
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

static int check(study_t *st, char *err, size_t errlen) {
  const kvr_study_opts_t *o = st->o;
  if (o->nscenarios == 0) {
    for (const kvr_study_scenario_t *s = kvr_study_scenarios; s->name; s++)
      st->scs[st->nscs++] = s;
  }
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
  for (size_t s = 0; s < st.nscs; s++)
    for (unsigned k = 0; k < o->seeds; k++) {
      cell_init(&st, &st.cells[s * o->seeds + k], st.scs[s], o->seed + k);
    }
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
  free(st.cells);
  return rc ? 1 : failed ? 1 : 0;
}

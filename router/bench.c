/* bench.c -- `kvrouter bench`: command line, level plans, max-SLO-rate search, A/B runs.
 *
 * Structs: cfg_t holds the parsed command line (strings point into argv or static defaults). The
 * run itself is a kvr_loadgen_t on a private uv loop, filling a kvr_results_t that the report
 * writer turns into files.
 *
 * Flow: parse -> workload -> loadgen + monitor -> for each label: [PUT /admin/policy, prefix-cache
 * reset, cooldown] -> levels (the list, or search: bracket up/down by doubling from a start rate,
 * then bisect until the gap between the last pass and the first fail is <= the resolution) ->
 * report -> summary on stdout. Around each level the monitor (monitor.h) reads the workers'
 * preemption counters and KV cache usage, so every level shows which limit it hit.
 *
 * Fair A/B: the labels replay identical prompts, so without a reset a later label would find the
 * earlier label's prompts in the workers' prefix caches. --reset-cache (on by default with --ab)
 * empties them (and the router's cache index) before each label.
 *
 * Invariants: a level's trace is seeded by (seed, load), so two labels at the same load send the
 * identical requests (a paired comparison); later labels start their search at the baseline's max
 * load so the detailed comparison always has a paired level. Durations given on the command line
 * (cooldown, think time) are simulated seconds, divided by --time-scale for the real wait.
 */

#include "commands.h"

#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/monitor.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "bench/routing/route_bench.h"
#include "src/kvr.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#define MAX_LIST 64
#define MAX_OWNED 16

typedef struct cfg_s {
  kvr_loadgen_opts_t lg;
  kvr_workload_opts_t wl;
  double rates[MAX_LIST];
  size_t nrates;
  unsigned conc[MAX_LIST];
  size_t nconc;
  bool search;
  bool no_early_stop;
  double search_start, search_max, search_res;
  char *ab[MAX_LIST];
  size_t nab;
  char *labels[MAX_LIST];
  size_t nlabels;
  const char *admin;
  const char *out;
  const char *title;
  uint64_t seed;
  kvr_slo_t slo;
  double cooldown_s;
  int reset_cache; /* -1: default (on with --ab), 0: off, 1: on */
  bool quiet;
} cfg_t;

static void usage(FILE *f) {
  fputs(
      "usage: kvrouter bench --url URL [options]\n"
      "\n"
      "Open-loop load generator for OpenAI-compatible endpoints (the router, one worker, vLLM).\n"
      "\n"
      "Target and requests:\n"
      "  --url URL              endpoint, e.g. http://127.0.0.1:8000 (API path added if absent)\n"
      "  --model NAME           model field of requests (default: first of GET /v1/models)\n"
      "  --api chat|completions streaming chat (default) or completions\n"
      "  --api-key KEY          sent as Authorization: Bearer KEY\n"
      "  --no-ignore-eos        do not send \"ignore_eos\": true\n"
      "  --request-timeout-s S  per request, real seconds (default 600; 0 = none)\n"
      "Workload:\n"
      "  --workload W           multiturn (default) | documents | control | file:PATH\n"
      "  --turns N --starters N --documents N --questions N\n"
      "  --output-mean T --output-std T --output-min T --output-max T   output tokens per turn\n"
      "  --multiturn-mode M     replay (default): pre-built conversations, any turn sent at its\n"
      "                         arrival (the seed's vllm bench serve shape); session: closed-loop\n"
      "                         conversations resending the streamed answers after think time\n"
      "  --replay-width N       replay: conversations interleaved per block (default 16)\n"
      "  --replay-order O       replay: blocks (default) | sample: each arrival a random turn of\n"
      "                         its own conversation (a dataset sampled at random; calibration)\n"
      "  --replay-dataset N     replay sample: draw from one fixed dataset of N conversations\n"
      "                         (the same at every level; default 0 = a fresh one per arrival)\n"
      "  --answer-mean T --answer-std T   replay: tokens of the pre-built answers in the history\n"
      "                         (default: each turn's max_tokens)\n"
      "  --think-s S            mean think time between turns (session mode, default 1)\n"
      "  --seed N               seed of everything random (default 42)\n"
      "Load:\n"
      "  --rates LIST           request rates in req/s, e.g. 0.5,1,2 (simulated time)\n"
      "  --concurrency LIST     closed-loop users instead, e.g. 8,16,32\n"
      "  --sessions             rates are conversation starts/s (default: turn arrivals/s)\n"
      "  --burstiness B         gamma shape of inter-arrival gaps (1 = Poisson)\n"
      "  --num-prompts N        measured requests per level (default 300)\n"
      "  --warmup N             extra requests at the start of each level, not measured\n"
      "  --warmup-s S           rates: at least rate*S warm-up requests (simulated s)\n"
      "  --min-level-s S        rates: at least rate*S measured requests (simulated s)\n"
      "  --cooldown-s S         pause between levels and after a policy switch (default 30)\n"
      "  --search               find the max SLO-compliant rate (bracket, then bisect)\n"
      "  --search-start R --search-max R --search-resolution R   (defaults 1, 64, 0.05)\n"
      "  --no-early-stop        run every search level to its end, even once its TTFT p99\n"
      "                         has certainly missed the SLO (by default it stops there)\n"
      "  --time-scale N         target runs N times faster than real time (kvrouter sim)\n"
      "SLOs:\n"
      "  --slo-ttft-ms MS       TTFT p99 target (default 1000)\n"
      "  --slo-tpot-ms MS       TPOT p99 target (default 60)\n"
      "  --max-failed-frac F    allowed failed share per level (default 0)\n"
      "A/B:\n"
      "  --ab LIST              policies, e.g. round_robin,kv_aware; needs --admin\n"
      "  --admin URL            router admin listener, e.g. http://127.0.0.1:8001\n"
      "  --labels LIST          run labels (default phase0,phase3 for two policies)\n"
      "  --reset-cache          empty the prefix caches before each label: POST\n"
      "                         ADMIN/admin/reset_prefix_cache (every worker and the router's\n"
      "                         index), or URL/reset_prefix_cache without --admin (one worker;\n"
      "                         vLLM needs VLLM_SERVER_DEV_MODE=1). Default on with --ab\n"
      "  --no-reset-cache       keep the caches warm across labels\n"
      "Output:\n"
      "  --out DIR              results folder (default results/bench)\n"
      "  --title TEXT           report title\n"
      "  --quiet                no progress output\n"
      "  --help                 this text\n",
      f);
}

static int bad(const char *fmt, const char *a, const char *b) {
  fprintf(stderr, "kvrouter bench: ");
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, " (see kvrouter bench --help)\n");
  return 2;
}

static bool parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end != '\0' || !isfinite(v))
    return false;
  *out = v;
  return true;
}

static bool parse_uint(const char *s, unsigned long long max, unsigned long long *out) {
  char *end;
  errno = 0;
  if (*s == '-')
    return false;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end != '\0' || v > max)
    return false;
  *out = v;
  return true;
}

/* Splits a comma list in place into items; returns the count or -1 when too long/empty item. */
static int split(char *s, char **items) {
  int n = 0;
  char *save = NULL;
  for (char *t = strtok_r(s, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (n == MAX_LIST)
      return -1;
    items[n++] = t;
  }
  return n;
}

typedef enum { T_STR, T_DOUBLE, T_UINT, T_FLAG } opt_type_t;

static int parse_args(int argc, char **argv, cfg_t *c, char **owned, size_t *nowned) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strncmp(arg, "--", 2) != 0)
      return bad("unexpected argument '%s'%s", arg, "");
    char name[64];
    const char *val = NULL;
    const char *eq = strchr(arg, '=');
    if (eq) {
      snprintf(name, sizeof(name), "%.*s", (int)(eq - arg - 2), arg + 2);
      val = eq + 1;
    } else {
      snprintf(name, sizeof(name), "%s", arg + 2);
    }
    /* Flags without a value. */
    static const char *const flags[] = {"help",  "search",      "sessions",       "no-ignore-eos",
                                        "quiet", "reset-cache", "no-reset-cache", "no-early-stop"};
    bool is_flag = false;
    for (size_t f = 0; f < KVR_ARRAY_SIZE(flags); f++)
      is_flag |= strcmp(name, flags[f]) == 0;
    if (is_flag) {
      if (val)
        return bad("option '--%s' takes no value%s", name, "");
      if (strcmp(name, "help") == 0) {
        usage(stdout);
        return -1;
      }
      if (strcmp(name, "search") == 0)
        c->search = true;
      else if (strcmp(name, "sessions") == 0)
        c->lg.sessions = true;
      else if (strcmp(name, "no-ignore-eos") == 0)
        c->lg.ignore_eos = false;
      else if (strcmp(name, "reset-cache") == 0)
        c->reset_cache = 1;
      else if (strcmp(name, "no-reset-cache") == 0)
        c->reset_cache = 0;
      else if (strcmp(name, "no-early-stop") == 0)
        c->no_early_stop = true;
      else
        c->quiet = true;
      continue;
    }
    static const char *const valued[] = {"url",
                                         "model",
                                         "api-key",
                                         "api",
                                         "workload",
                                         "rates",
                                         "concurrency",
                                         "ab",
                                         "labels",
                                         "num-prompts",
                                         "warmup",
                                         "warmup-s",
                                         "min-level-s",
                                         "seed",
                                         "turns",
                                         "starters",
                                         "documents",
                                         "questions",
                                         "output-min",
                                         "output-max",
                                         "output-mean",
                                         "output-std",
                                         "think-s",
                                         "burstiness",
                                         "multiturn-mode",
                                         "replay-width",
                                         "replay-order",
                                         "replay-dataset",
                                         "answer-mean",
                                         "answer-std",
                                         "time-scale",
                                         "request-timeout-s",
                                         "cooldown-s",
                                         "slo-ttft-ms",
                                         "slo-tpot-ms",
                                         "max-failed-frac",
                                         "search-start",
                                         "search-max",
                                         "search-resolution",
                                         "admin",
                                         "out",
                                         "title"};
    bool known = false;
    for (size_t f = 0; f < KVR_ARRAY_SIZE(valued); f++)
      known |= strcmp(name, valued[f]) == 0;
    if (!known)
      return bad("unknown option '--%s'%s", name, "");
    if (val == NULL) {
      if (i + 1 >= argc)
        return bad("option '--%s' needs a value%s", name, "");
      val = argv[++i];
    }
    double d;
    unsigned long long u;
#define DBL(field, cond)                                                                           \
  do {                                                                                             \
    if (!parse_double(val, &d) || !(cond))                                                         \
      return bad("bad value '%s' for --%s", val, name);                                            \
    field = d;                                                                                     \
  } while (0)
#define UINT(field, max, minv)                                                                     \
  do {                                                                                             \
    if (!parse_uint(val, max, &u) || u + 1 < (minv) + 1ull)                                        \
      return bad("bad value '%s' for --%s", val, name);                                            \
    field = u;                                                                                     \
  } while (0)
    if (strcmp(name, "url") == 0)
      c->lg.url = val;
    else if (strcmp(name, "model") == 0)
      c->lg.model = val;
    else if (strcmp(name, "api-key") == 0)
      c->lg.api_key = val;
    else if (strcmp(name, "api") == 0) {
      if (strcmp(val, "chat") == 0)
        c->lg.api = KVR_API_CHAT;
      else if (strcmp(val, "completions") == 0)
        c->lg.api = KVR_API_COMPLETIONS;
      else
        return bad("bad value '%s' for --%s (chat or completions)", val, name);
    } else if (strcmp(name, "workload") == 0) {
      if (kvr_workload_parse_kind(val, &c->wl) != 0)
        return bad("bad value '%s' for --%s (multiturn, documents, control, file:PATH)", val, name);
    } else if (strcmp(name, "rates") == 0 || strcmp(name, "concurrency") == 0 ||
               strcmp(name, "ab") == 0 || strcmp(name, "labels") == 0) {
      /* List arguments are split in place in a copy, so argv stays untouched. */
      if (*nowned == MAX_OWNED)
        return bad("too many list options%s%s", "", "");
      char *copy = strdup(val);
      if (copy == NULL)
        abort();
      owned[(*nowned)++] = copy;
      char *items[MAX_LIST];
      int n = split(copy, items);
      if (n <= 0)
        return bad("bad list '%s' for --%s", val, name);
      for (int k = 0; k < n; k++) {
        if (name[0] == 'r') {
          if (!parse_double(items[k], &d) || !(d > 0))
            return bad("bad rate '%s' in --%s", items[k], name);
          c->rates[k] = d;
        } else if (name[0] == 'c') {
          if (!parse_uint(items[k], 100000, &u) || u == 0)
            return bad("bad user count '%s' in --%s", items[k], name);
          c->conc[k] = (unsigned)u;
        } else if (name[0] == 'a') {
          c->ab[k] = items[k];
        } else {
          if (strlen(items[k]) >= 64)
            return bad("label '%s' longer than 63 characters%s", items[k], "");
          c->labels[k] = items[k];
        }
      }
      if (name[0] == 'r')
        c->nrates = (size_t)n;
      else if (name[0] == 'c')
        c->nconc = (size_t)n;
      else if (name[0] == 'a')
        c->nab = (size_t)n;
      else
        c->nlabels = (size_t)n;
    } else if (strcmp(name, "num-prompts") == 0)
      UINT(c->lg.num_prompts, 10000000, 1);
    else if (strcmp(name, "warmup") == 0)
      UINT(c->lg.warmup, 1000000, 0);
    else if (strcmp(name, "warmup-s") == 0)
      DBL(c->lg.warmup_s, d >= 0 && d <= 1e5);
    else if (strcmp(name, "min-level-s") == 0)
      DBL(c->lg.min_level_s, d >= 0 && d <= 1e5);
    else if (strcmp(name, "seed") == 0)
      UINT(c->seed, ~0ull, 0);
    else if (strcmp(name, "turns") == 0)
      UINT(c->wl.turns, 64, 1);
    else if (strcmp(name, "starters") == 0)
      UINT(c->wl.starters, 100000, 1);
    else if (strcmp(name, "documents") == 0)
      UINT(c->wl.documents, 1000000, 1);
    else if (strcmp(name, "questions") == 0)
      UINT(c->wl.questions, 1000, 1);
    else if (strcmp(name, "output-min") == 0)
      UINT(c->wl.out_min, 1000000, 1);
    else if (strcmp(name, "output-max") == 0)
      UINT(c->wl.out_max, 1000000, 1);
    else if (strcmp(name, "output-mean") == 0)
      DBL(c->wl.out_mean, d >= 1);
    else if (strcmp(name, "output-std") == 0)
      DBL(c->wl.out_std, d >= 0);
    else if (strcmp(name, "multiturn-mode") == 0) {
      if (kvr_workload_parse_mode(val, &c->wl) != 0)
        return bad("bad value '%s' for --%s (replay or session)", val, name);
    } else if (strcmp(name, "replay-order") == 0) {
      if (kvr_workload_parse_order(val, &c->wl) != 0)
        return bad("bad value '%s' for --%s (blocks or sample)", val, name);
    } else if (strcmp(name, "replay-width") == 0)
      UINT(c->wl.replay_width, 256, 1);
    else if (strcmp(name, "replay-dataset") == 0)
      UINT(c->wl.replay_dataset, 1000000, 0);
    else if (strcmp(name, "answer-mean") == 0)
      DBL(c->wl.answer_mean, d >= 0);
    else if (strcmp(name, "answer-std") == 0)
      DBL(c->wl.answer_std, d >= 0);
    else if (strcmp(name, "think-s") == 0)
      DBL(c->wl.think_mean_s, d >= 0);
    else if (strcmp(name, "burstiness") == 0)
      DBL(c->lg.burstiness, d > 0);
    else if (strcmp(name, "time-scale") == 0)
      DBL(c->lg.time_scale, d > 0);
    else if (strcmp(name, "request-timeout-s") == 0)
      DBL(c->lg.request_timeout_s, d >= 0);
    else if (strcmp(name, "cooldown-s") == 0)
      DBL(c->cooldown_s, d >= 0);
    else if (strcmp(name, "slo-ttft-ms") == 0)
      DBL(c->slo.ttft_p99_ms, d > 0);
    else if (strcmp(name, "slo-tpot-ms") == 0)
      DBL(c->slo.tpot_p99_ms, d > 0);
    else if (strcmp(name, "max-failed-frac") == 0)
      DBL(c->slo.max_failed_frac, d >= 0 && d <= 1);
    else if (strcmp(name, "search-start") == 0)
      DBL(c->search_start, d > 0);
    else if (strcmp(name, "search-max") == 0)
      DBL(c->search_max, d > 0);
    else if (strcmp(name, "search-resolution") == 0)
      DBL(c->search_res, d > 0);
    else if (strcmp(name, "admin") == 0)
      c->admin = val;
    else if (strcmp(name, "out") == 0)
      c->out = val;
    else if (strcmp(name, "title") == 0)
      c->title = val;
    else
      return bad("unknown option '--%s'%s", name, "");
#undef DBL
#undef UINT
  }
  if (c->nrates && c->nconc)
    return bad("--rates and --concurrency are exclusive%s%s", "", "");
  if (c->nab && c->admin == NULL)
    return bad("--ab needs --admin URL%s%s", "", "");
  size_t nruns = c->nab ? c->nab : 1;
  if (c->nlabels && c->nlabels != nruns)
    return bad("--labels needs one label per run (%s)%s", c->nab ? "one per --ab policy" : "one",
               "");
  if (!c->search && !c->nrates && !c->nconc)
    return bad("give --rates, --concurrency or --search%s%s", "", "");
  if (c->lg.sessions && c->nconc)
    return bad("--sessions applies to --rates only%s%s", "", "");
  if (c->wl.out_max < c->wl.out_min)
    return bad("--output-max must be >= --output-min%s%s", "", "");
  return 0;
}

/* ---- running --------------------------------------------------------------------------------- */

typedef struct bench_s {
  cfg_t *c;
  uv_loop_t loop;
  uv_signal_t sigint, sigterm;
  kvr_loadgen_t *lg;
  kvr_monitor_t *mon;
  kvr_results_t *res;
} bench_t;

static void on_signal(uv_signal_t *s, int signum) {
  bench_t *b = s->data;
  fprintf(stderr, "\nkvrouter bench: signal %d, stopping (a partial report is written)\n", signum);
  kvr_loadgen_interrupt(b->lg);
}

static uint64_t level_seed(const cfg_t *c, double load) {
  return kvr_workload_mix(c->seed, (uint64_t)llround(load * 1e6));
}

static void cooldown(bench_t *b) {
  kvr_loadgen_sleep(b->lg, b->c->cooldown_s / b->c->lg.time_scale);
}

/* Runs one level and appends it to run; returns it (owned by run) or NULL when interrupted before
 * anything ran. */
static const kvr_level_t *run_one(bench_t *b, kvr_run_t *run, double load, bool first) {
  const cfg_t *c = b->c;
  if (kvr_loadgen_interrupted(b->lg))
    return NULL;
  if (!first)
    cooldown(b);
  if (kvr_loadgen_interrupted(b->lg))
    return NULL;
  bool conc = c->nconc > 0;
  kvr_level_t *lv = NULL;
  kvr_monitor_level_begin(b->mon);
  if (kvr_loadgen_run_level(b->lg, run->label, conc ? 0 : load, conc ? (unsigned)load : 0,
                            level_seed(c, load), &c->slo, &lv) != 0) {
    kvr_monitor_level_end(b->mon, NULL);
    return NULL;
  }
  kvr_monitor_level_end(b->mon, lv);
  kvr_stats_run_add(run, lv);
  if (!c->quiet) {
    char names[64], engine[96];
    kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
    if (lv->engine_workers)
      snprintf(engine, sizeof(engine), "  preemptions %llu  KV peak %.0f%%",
               (unsigned long long)lv->preemptions, 100.0 * lv->kv_usage_peak);
    else
      snprintf(engine, sizeof(engine), "  preemptions n/a");
    const char *what = conc ? "users" : "rate";
    if (lv->stopped_early)
      fprintf(stderr, "[%s] %s %g: FAIL  stopped early: %zu measured TTFTs of %.0f ms or more%s\n",
              run->label, what, load, lv->ttft_over_slo, c->slo.ttft_p99_ms, engine);
    else
      fprintf(stderr,
              "[%s] %s %g: %s  TTFT p99 %.0f ms  TPOT p99 %.1f ms  %zu ok %zu failed  "
              "out %.0f tok/s  lag p99 %.3f ms%s\n",
              run->label, what, load, lv->pass ? "PASS" : "FAIL", lv->ttft.p99, lv->tpot.p99,
              lv->completed, lv->failed, lv->output_throughput, lv->lag.p99, engine);
    if (!lv->pass && !lv->stopped_early)
      fprintf(stderr, "[%s]   failing: %s\n", run->label, names);
  }
  return lv;
}

/* Bracket (double up from a pass, halve down from a fail) then bisect to the resolution. */
static void search(bench_t *b, kvr_run_t *run, double start, bool *first) {
  const cfg_t *c = b->c;
  bool conc = c->nconc > 0;
  double res = conc ? 1.0 : c->search_res;
  double lo = 0, hi = INFINITY, x = start;
  const double floor_load = conc ? 1.0 : res;
  for (int steps = 0; steps < 64; steps++) {
    if (conc)
      x = fmax(1.0, round(x));
    else
      x = round(x * 1000.0) / 1000.0;
    const kvr_level_t *lv = kvr_stats_run_find(run, conc ? 0 : x, conc ? (unsigned)x : 0);
    if (lv == NULL) {
      lv = run_one(b, run, x, *first);
      *first = false;
      if (lv == NULL || lv->interrupted)
        return;
    }
    if (lv->pass)
      lo = fmax(lo, x);
    else
      hi = fmin(hi, x);
    if (isinf(hi)) {
      if (x >= c->search_max)
        return; /* passes at the cap */
      x = fmin(x * 2, c->search_max);
    } else if (lo == 0) {
      if (x <= floor_load)
        return; /* fails even at the lowest load */
      x = fmax(x / 2, floor_load);
    } else {
      if (hi - lo <= res + 1e-9)
        return;
      x = (lo + hi) / 2;
    }
  }
}

static char *join_argv(int argc, char **argv) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "kvrouter");
  for (int i = 0; i < argc; i++) {
    kvr_buf_puts(&b, " ");
    kvr_buf_puts(&b, argv[i]);
  }
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

int kvr_bench_main(int argc, char **argv) {
  /* `kvrouter bench routing` is the routing-decision micro-benchmark (bench/routing/). */
  if (argc > 1 && strcmp(argv[1], "routing") == 0)
    return kvr_route_bench_main(argc - 1, argv + 1);
  cfg_t c;
  memset(&c, 0, sizeof(c));
  kvr_loadgen_opts_default(&c.lg);
  c.lg.model = NULL;
  kvr_workload_opts_default(&c.wl);
  c.seed = 42;
  c.slo = (kvr_slo_t){1000, 60, 0};
  c.cooldown_s = 30;
  c.reset_cache = -1;
  c.search_start = 1;
  c.search_max = 64;
  c.search_res = 0.05;
  c.out = "results/bench";
  char *owned[MAX_OWNED];
  size_t nowned = 0;
  int rc = parse_args(argc, argv, &c, owned, &nowned);
  if (rc != 0) {
    for (size_t i = 0; i < nowned; i++)
      free(owned[i]);
    return rc < 0 ? 0 : rc;
  }
  c.wl.seed = c.seed;
  if (c.search && c.nrates)
    c.search_start = c.rates[0];
  if (c.search && c.nconc)
    c.search_start = c.conc[0];
  else if (c.search && !c.nrates && !c.nconc)
    c.nrates = 0;
  raise_fd_limit();

  /* Every way out after this point goes through `done`, which frees what was set up. */
  char err[512];
  int exit_code = 0;
  kvr_results_t *res = NULL;
  bench_t b;
  memset(&b, 0, sizeof(b));
  b.c = &c;
  uv_loop_init(&b.loop);
  kvr_workload_t *wl = kvr_workload_new(&c.wl, err, sizeof(err));
  if (wl == NULL) {
    fprintf(stderr, "kvrouter bench: %s\n", err);
    exit_code = 2;
    goto done;
  }
  c.lg.early_stop = c.search && !c.no_early_stop;
  c.lg.progress = c.quiet ? NULL : stderr;
  c.lg.progress_tty = isatty(STDERR_FILENO);
  b.lg = kvr_loadgen_new(&b.loop, &c.lg, wl, err, sizeof(err));
  if (b.lg == NULL) {
    fprintf(stderr, "kvrouter bench: %s\n", err);
    exit_code = 2;
    goto done;
  }
  b.mon = kvr_monitor_new(&b.loop, c.admin, c.lg.url, 200);
  if (b.mon == NULL) {
    fprintf(stderr, "kvrouter bench: cannot set up the metrics monitor for %s\n", c.lg.url);
    exit_code = 1;
    goto done;
  }
  char model[256];
  if (c.lg.model == NULL) {
    if (kvr_monitor_fetch_model(b.mon, model, sizeof(model), err, sizeof(err)) != 0) {
      fprintf(stderr, "kvrouter bench: no --model given and %s\n", err);
      exit_code = 1;
      goto done;
    }
    c.lg.model = model;
    kvr_loadgen_set_model(b.lg, model);
  }
  bool reset = c.reset_cache < 0 ? c.nab > 0 : c.reset_cache == 1;
  uv_signal_init(&b.loop, &b.sigint);
  uv_signal_init(&b.loop, &b.sigterm);
  b.sigint.data = b.sigterm.data = &b;
  uv_signal_start(&b.sigint, on_signal, SIGINT);
  uv_signal_start(&b.sigterm, on_signal, SIGTERM);

  res = kvr_stats_results_new();
  b.res = res;
  char now[32];
  kvr_utc_iso8601(now, sizeof(now));
  kvr_stats_set_str(&res->generated, now);
  kvr_stats_set_str(&res->title, c.title ? c.title
                                 : c.nab ? "kvrouter A/B Benchmark Report"
                                         : "kvrouter Benchmark Report");
  kvr_stats_set_str(&res->url, c.lg.url);
  kvr_stats_set_str(&res->model, c.lg.model);
  kvr_stats_set_str(&res->api, c.lg.api == KVR_API_CHAT ? "chat" : "completions");
  kvr_stats_set_str(&res->workload, kvr_workload_name(wl));
  kvr_buf_t desc = KVR_BUF_INIT;
  kvr_workload_describe(wl, &desc);
  kvr_stats_set_str(&res->workload_desc, desc.data);
  kvr_buf_free(&desc);
  char *cmd = join_argv(argc, argv);
  kvr_stats_set_str(&res->command, cmd);
  free(cmd);
  res->concurrency_mode = c.nconc > 0;
  res->sessions = c.lg.sessions;
  res->num_prompts = c.lg.num_prompts;
  res->warmup = c.lg.warmup;
  res->cooldown_s = c.cooldown_s;
  res->burstiness = c.lg.burstiness;
  res->time_scale = c.lg.time_scale;
  res->seed = c.seed;
  res->slo = c.slo;
  if (reset)
    res->cache_reset = c.admin ? "before each run: POST /admin/reset_prefix_cache (every worker's "
                                 "prefix cache and the router's cache index)"
                               : "before each run: POST /reset_prefix_cache on the endpoint";

  size_t nruns = c.nab ? c.nab : 1;
  bool first_level = true;
  for (size_t r = 0; r < nruns && !kvr_loadgen_interrupted(b.lg); r++) {
    const char *policy = c.nab ? c.ab[r] : NULL;
    const char *label = c.nlabels    ? c.labels[r]
                        : c.nab == 2 ? (r == 0 ? "phase0" : "phase3")
                        : c.nab      ? c.ab[r]
                                     : "bench";
    char d[256];
    if (policy)
      snprintf(d, sizeof(d), "router policy `%s` (PUT /admin/policy) at %s", policy, c.lg.url);
    else
      snprintf(d, sizeof(d), "endpoint %s", c.lg.url);
    kvr_run_t *run = kvr_stats_results_add_run(res, label, policy, d);
    if (policy) {
      if (kvr_monitor_set_policy(b.mon, policy, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvrouter bench: switching policy to %s: %s\n", policy, err);
        exit_code = 1;
        break;
      }
      if (!c.quiet)
        fprintf(stderr, "[%s] policy set to %s\n", label, policy);
    }
    if (reset) {
      /* Not fatal: a worker that cannot reset (vLLM without dev mode) is named in the report. */
      int rrc = kvr_monitor_reset_cache(b.mon, run->cache_reset, sizeof(run->cache_reset));
      if (!c.quiet)
        fprintf(stderr, "[%s] prefix cache reset: %s%s\n", label, rrc ? "INCOMPLETE: " : "",
                run->cache_reset);
    }
    if (policy && r > 0) {
      cooldown(&b);
      first_level = true; /* the cooldown after the switch replaces the one before the level */
    }
    if (c.search) {
      run->searched = true;
      double start = c.search_start;
      double base = r > 0 ? kvr_stats_run_max_load(&res->runs[0]) : 0;
      if (base > 0)
        start = base;
      search(&b, run, start, &first_level);
    } else {
      size_t n = c.nconc ? c.nconc : c.nrates;
      for (size_t i = 0; i < n; i++) {
        if (run_one(&b, run, c.nconc ? (double)c.conc[i] : c.rates[i], first_level) == NULL)
          break;
        first_level = false;
      }
    }
  }
  if (kvr_loadgen_interrupted(b.lg))
    exit_code = 130;

  if (kvr_report_write(res, c.out, err, sizeof(err)) != 0) {
    fprintf(stderr, "kvrouter bench: writing the report: %s\n", err);
    exit_code = exit_code ? exit_code : 1;
  } else {
    kvr_buf_t sum = KVR_BUF_INIT;
    kvr_report_summary(res, &sum);
    fputs(sum.data ? sum.data : "", stdout);
    printf("Report: %s/report.md (HTML %s/report.html)\n", c.out, c.out);
    fflush(stdout);
    kvr_buf_free(&sum);
  }

  uv_close((uv_handle_t *)&b.sigint, NULL);
  uv_close((uv_handle_t *)&b.sigterm, NULL);
done:
  kvr_monitor_free(b.mon);
  kvr_loadgen_free(b.lg);
  uv_run(&b.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&b.loop) != 0)
    fprintf(stderr, "kvrouter bench: warning: loop handles left open\n");
  kvr_stats_results_free(res);
  kvr_workload_free(wl);
  for (size_t i = 0; i < nowned; i++)
    free(owned[i]);
  return exit_code;
}

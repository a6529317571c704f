/* runner.c -- one `kvrouter bench` run: labels, level plans, the max-SLO-rate search, the report.
 *
 * Structs: kvr_runner_t owns the workload, the load generator, the monitor and the results; the
 * options and the loop are the caller's. first_level is true while no level has run since the
 * start or a policy switch (whose cooldown replaces the one before a level).
 *
 * Flow: kvr_runner_new() (workload -> load generator -> monitor -> model -> results header) ->
 * kvr_runner_run(): run_label() per label [policy switch, cache reset, cooldown] -> run_list() or
 * run_search(), each level through run_level() (monitor around kvr_loadgen_run_level(), progress
 * line) -> kvr_runner_report(). The search itself is kvr_runner_search_t, a pure state machine
 * (unit-tested without a server); run_search() only feeds it levels, reusing a level the run
 * already has at that load. With --virtual the load generator, the policy switch, the cache reset
 * and the level figures go to a kvr_vcluster_t instead of HTTP and the monitor (runner.h).
 * --size-fleet: run_fleet() instead, the fleet search (bench/vcluster/fleet.h) fed levels at one
 * rate on resized clusters, reusing a level the run already has for that fleet; fleet_report()
 * writes fleet.h's report instead of the rate report.
 */
#include "runner.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "bench/loadgen/monitor.h"
#include "bench/loadgen/trace_replay.h"
#include "bench/report/report.h"
#include "bench/vcluster/fleet.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kvr_runner_s {
  kvr_runner_opts_t *o;
  uv_loop_t *loop;
  kvr_workload_t *wl;
  kvr_loadgen_t *lg;
  kvr_monitor_t *mon; /* NULL in virtual time */
  kvr_vcluster_t *vc; /* --virtual only */
  kvr_results_t *res;
  bool reset;             /* empty the prefix caches before each label */
  bool first_level;       /* no cooldown before the next level */
  char model[256];        /* the model GET /v1/models named, when none was given */
  kvr_fleet_info_t fleet; /* --size-fleet: its rate and bounds */
};

void kvr_runner_opts_default(kvr_runner_opts_t *o) {
  memset(o, 0, sizeof(*o));
  kvr_loadgen_opts_default(&o->lg);
  o->lg.model = NULL;
  kvr_workload_opts_default(&o->wl);
  o->seed = 42;
  o->slo = (kvr_slo_t){1000, 60, 0};
  o->cooldown_s = 30;
  o->reset_cache = -1;
  o->search_start = 1;
  o->search_max = 64;
  o->search_res = 0.05;
  o->out = "results/bench";
  kvr_vcluster_opts_default(&o->vc);
  o->size_fleet_max = KVR_FLEET_MAX_DEFAULT;
}

/* The --policy-params text of the run labelled label, or NULL. */
static const char *run_params(const kvr_runner_opts_t *o, const char *label) {
  size_t n = strlen(label);
  for (size_t i = 0; i < o->nparams; i++)
    if (strncmp(o->params[i], label, n) == 0 && o->params[i][n] == '=')
      return o->params[i] + n + 1;
  return NULL;
}

/* A trace workload's arrivals are the trace's own, one request each: the flags that shape arrivals
 * or turn them into users do not apply. NULL when none is given. */
static const char *trace_rules(const kvr_runner_opts_t *o) {
  if (o->nconc)
    return "--concurrency: a trace workload runs at request rates (--rates or --search): its "
           "arrivals are the trace's own, scaled to each rate";
  if (o->lg.sessions)
    return "--sessions: a trace's requests are single-turn; its rates are request arrivals";
  if (o->lg.burstiness != 1.0)
    return "--burstiness: a trace workload keeps the trace's own arrival times (scaled)";
  if (o->lg.arrival_seed >= 0)
    return "--arrival-seed: a trace workload keeps the trace's own arrival times (scaled)";
  return NULL;
}

/* --size-fleet searches worker counts at one rate, in virtual time only; the rules below it
 * (labels, trace rules) are checked after it. NULL when they hold. */
static const char *fleet_rules(const kvr_runner_opts_t *o) {
  if (!o->virt)
    return "--size-fleet: virtual time only (add --virtual)";
  if (o->search)
    return "--size-fleet: it searches worker counts at one rate; --search searches rates (give "
           "one of them)";
  if (o->nconc)
    return "--size-fleet: runs at a request rate (--rates R, or a trace's own), not --concurrency";
  if (o->nrates > 1)
    return "--size-fleet: takes one rate (--rates R)";
  if (o->nrates == 0 && o->wl.kind != KVR_WL_TRACE)
    return "--size-fleet: give --rates R (a trace workload runs at its own rate by default)";
  if (o->vc.nworker_blocks)
    return "--size-fleet: a mixed fleet (--worker-blocks) has a fixed size";
  if (o->vc.model_fleet)
    return "--size-fleet: a model fleet (--model-fleet) has a fixed size";
  if (o->keep_cluster)
    return "--size-fleet: every fleet is a fresh cluster; --keep-cluster does not apply";
  if (o->size_fleet_max < o->vc.workers)
    return "--size-fleet-max: must be at least --workers (the first fleet tried)";
  return NULL;
}

/* The rules between the other flags; NULL when they hold. */
static const char *load_rules(const kvr_runner_opts_t *o) {
  if (o->nrates && o->nconc)
    return "--concurrency: cannot be combined with --rates";
  if (o->nab && o->admin == NULL && !o->virt)
    return "--ab: needs --admin URL (or --virtual)";
  if (o->nlabels && o->nlabels != (o->nab ? o->nab : 1))
    return o->nab ? "--labels: needs one label per run (one per --ab policy)"
                  : "--labels: needs one label per run (one)";
  if (o->vc.no_response_affinity && (!o->virt || o->lg.api != KVR_API_RESPONSES))
    return "--no-response-affinity: virtual time with --api responses only (a router that does "
           "not pin previous_response_id)";
  if (o->vc.max_loras && !o->vc.model_fleet)
    return "--max-loras: applies to a model fleet's LoRA workers (--model-fleet)";
  if (o->vc.model_fleet && !o->virt)
    return "--model-fleet: virtual time only (add --virtual; a real router reads each worker's "
           "models from its GET /v1/models)";
  if (!o->search && !o->nrates && !o->nconc && !o->size_fleet)
    return "no load given: give --rates, --concurrency or --search";
  if (o->lg.sessions && o->nconc)
    return "--sessions: applies to --rates only";
  if (o->wl.out_max < o->wl.out_min)
    return "--output-max: must be >= --output-min";
  if (o->wl.kind == KVR_WL_TRACE)
    return trace_rules(o);
  return NULL;
}

static int rules(const kvr_runner_opts_t *o, char *err, size_t errlen) {
  const char *e = o->size_fleet ? fleet_rules(o) : NULL;
  if (e == NULL)
    e = load_rules(o);
  if (e != NULL)
    snprintf(err, errlen, "%s", e);
  return e ? KVR_EINVAL : 0;
}

int kvr_runner_opts_check(kvr_runner_opts_t *o, char *err, size_t errlen) {
  for (size_t i = 0; i < o->nlabels; i++)
    if (strlen(o->labels[i]) >= 64) {
      snprintf(err, errlen, "--labels: '%s' is longer than 63 characters", o->labels[i]);
      return KVR_EINVAL;
    }
  if (rules(o, err, errlen) != 0)
    return KVR_EINVAL;
  size_t nruns = o->nab ? o->nab : 1;
  for (size_t p = 0; p < o->nparams; p++) {
    bool found = false;
    for (size_t i = 0; i < nruns && !found; i++)
      found = run_params(o, kvr_runner_label(o, i)) == strchr(o->params[p], '=') + 1;
    if (!found) {
      snprintf(err, errlen, "--policy-params: '%.*s' is not the label of a run",
               (int)(strchr(o->params[p], '=') - o->params[p]), o->params[p]);
      return KVR_EINVAL;
    }
  }
  o->wl.seed = o->seed;
  o->wl.api = o->lg.api;
  if (o->search && o->nrates)
    o->search_start = o->rates[0];
  if (o->search && o->nconc)
    o->search_start = o->conc[0];
  o->lg.early_stop = (o->search || o->size_fleet) && !o->no_early_stop;
  return 0;
}

const char *kvr_runner_label(const kvr_runner_opts_t *o, size_t i) {
  if (o->nlabels)
    return o->labels[i];
  if (o->nab == 2)
    return i == 0 ? "phase0" : "phase3";
  return o->nab ? o->ab[i] : "bench";
}

/* ---- the search ---- */

static double search_round(const kvr_runner_search_t *s, double x) {
  return s->conc ? fmax(1.0, round(x)) : round(x * 1000.0) / 1000.0;
}

void kvr_runner_search_init(kvr_runner_search_t *s, double start, double max, double res,
                            bool conc) {
  memset(s, 0, sizeof(*s));
  s->conc = conc;
  s->max = max;
  s->res = conc ? 1.0 : res;
  s->floor = conc ? 1.0 : res;
  s->hi = INFINITY;
  s->x = search_round(s, start);
}

/* Bracket (double up from a pass, halve down from a fail) then bisect to the resolution. */
void kvr_runner_search_feed(kvr_runner_search_t *s, bool pass) {
  double x = s->x;
  if (pass)
    s->lo = fmax(s->lo, x);
  else
    s->hi = fmin(s->hi, x);
  if (isinf(s->hi)) {
    s->done = x >= s->max; /* passes at the cap */
    x = fmin(x * 2, s->max);
  } else if (s->lo == 0) {
    s->done = x <= s->floor; /* fails even at the lowest load */
    x = fmax(x / 2, s->floor);
  } else {
    s->done = s->hi - s->lo <= s->res + 1e-9;
    x = (s->lo + s->hi) / 2;
  }
  s->done |= ++s->steps >= 64;
  if (!s->done)
    s->x = search_round(s, x);
}

/* ---- levels ---- */

static uint64_t level_seed(const kvr_runner_opts_t *o, double load) {
  return kvr_workload_mix(o->seed, (uint64_t)llround(load * 1e6));
}

static void cooldown(kvr_runner_t *r) {
  if (r->vc != NULL)
    kvr_vcluster_idle(r->vc, r->o->cooldown_s);
  else
    kvr_loadgen_sleep(r->lg, r->o->cooldown_s / r->o->lg.time_scale);
}

/* The monitor's calls, or the virtual cluster's. */
static int level_begin(kvr_runner_t *r) {
  if (r->vc == NULL) {
    kvr_monitor_level_begin(r->mon);
    return 0;
  }
  /* Virtual time: every level on a cluster as fresh as the first level's (vcluster.h), unless the
   * run models one long-lived server (--keep-cluster: a calibration against a real rate sweep). */
  char err[256];
  if (!r->o->keep_cluster && kvr_vcluster_restart(r->vc, err, sizeof(err)) != 0) {
    fprintf(stderr, "kvrouter bench: virtual cluster: %s\n", err);
    return -1;
  }
  kvr_vcluster_level_begin(r->vc);
  return 0;
}

static void level_end(kvr_runner_t *r, kvr_level_t *lv) {
  if (r->vc != NULL)
    kvr_vcluster_level_end(r->vc, lv);
  else
    kvr_monitor_level_end(r->mon, lv);
}

static void print_level(const kvr_runner_t *r, const kvr_run_t *run, const kvr_level_t *lv,
                        double load) {
  FILE *f = r->o->lg.progress;
  char names[64], engine[96];
  kvr_stats_fail_names(lv->fail_mask, names, sizeof(names));
  if (lv->engine_workers)
    snprintf(engine, sizeof(engine), "  preemptions %llu  KV peak %.0f%%",
             (unsigned long long)lv->preemptions, 100.0 * lv->kv_usage_peak);
  else
    snprintf(engine, sizeof(engine), "  preemptions n/a");
  const char *what = r->o->nconc > 0 ? "users" : "rate";
  char fleet[32] = "";
  if (r->o->size_fleet)
    snprintf(fleet, sizeof(fleet), " on %zu workers", lv->engine_workers);
  if (lv->stopped_early)
    fprintf(f, "[%s] %s %g%s: FAIL  stopped early: %zu measured TTFTs of %.0f ms or more%s\n",
            run->label, what, load, fleet, lv->ttft_over_slo, r->o->slo.ttft_p99_ms, engine);
  else
    fprintf(f,
            "[%s] %s %g%s: %s  TTFT p99 %.0f ms  TPOT p99 %.1f ms  %zu ok %zu failed  "
            "out %.0f tok/s  lag p99 %.3f ms%s\n",
            run->label, what, load, fleet, lv->pass ? "PASS" : "FAIL", lv->ttft.p99, lv->tpot.p99,
            lv->completed, lv->failed, lv->output_throughput, lv->lag.p99, engine);
  if (!lv->pass && !lv->stopped_early)
    fprintf(f, "[%s]   failing: %s\n", run->label, names);
}

/* Runs one level (after a cooldown unless it is the first) and appends it to run; returns it
 * (owned by run) or NULL when interrupted before anything ran. */
static const kvr_level_t *run_level(kvr_runner_t *r, kvr_run_t *run, double load) {
  const kvr_runner_opts_t *o = r->o;
  if (kvr_loadgen_interrupted(r->lg))
    return NULL;
  if (!r->first_level)
    cooldown(r);
  if (kvr_loadgen_interrupted(r->lg))
    return NULL;
  bool conc = o->nconc > 0;
  kvr_level_t *lv = NULL;
  if (level_begin(r) != 0)
    return NULL;
  if (kvr_loadgen_run_level(r->lg, run->label, conc ? 0 : load, conc ? (unsigned)load : 0,
                            level_seed(o, load), &o->slo, &lv) != 0) {
    level_end(r, NULL);
    return NULL;
  }
  level_end(r, lv);
  kvr_stats_run_add(run, lv);
  if (o->lg.progress != NULL)
    print_level(r, run, lv, load);
  return lv;
}

static void run_search(kvr_runner_t *r, kvr_run_t *run, double start) {
  const kvr_runner_opts_t *o = r->o;
  bool conc = o->nconc > 0;
  kvr_runner_search_t s;
  kvr_runner_search_init(&s, start, o->search_max, o->search_res, conc);
  while (!s.done) {
    const kvr_level_t *lv = kvr_stats_run_find(run, conc ? 0 : s.x, conc ? (unsigned)s.x : 0);
    if (lv == NULL) {
      lv = run_level(r, run, s.x);
      r->first_level = false;
      if (lv == NULL || lv->interrupted)
        return;
    }
    kvr_runner_search_feed(&s, lv->pass);
  }
}

/* Fleet sizing: one level per fleet at the sizing's rate, each on a fresh cluster of that many
 * workers (the restart every virtual level begins with), fed to the search (fleet.h). */
static void run_fleet(kvr_runner_t *r, kvr_run_t *run, unsigned start) {
  kvr_fleet_search_t s;
  kvr_fleet_search_init(&s, start, r->o->size_fleet_max);
  while (!s.done) {
    const kvr_level_t *lv = NULL;
    for (size_t i = 0; i < run->nlevels && lv == NULL; i++)
      if (run->levels[i]->engine_workers == s.x)
        lv = run->levels[i];
    if (lv == NULL) {
      char err[256];
      if (kvr_vcluster_set_workers(r->vc, s.x, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvrouter bench: virtual cluster: %s\n", err);
        return;
      }
      lv = run_level(r, run, r->fleet.rate);
      r->first_level = false;
      if (lv == NULL || lv->interrupted)
        return;
    }
    kvr_fleet_search_feed(&s, lv->pass);
  }
}

static void run_list(kvr_runner_t *r, kvr_run_t *run) {
  const kvr_runner_opts_t *o = r->o;
  size_t n = o->nconc ? o->nconc : o->nrates;
  for (size_t i = 0; i < n; i++) {
    if (run_level(r, run, o->nconc ? (double)o->conc[i] : o->rates[i]) == NULL)
      return;
    r->first_level = false;
  }
}

/* ---- labels ---- */

int kvr_runner_add_params(kvr_runner_opts_t *o, const char *text, char *err, size_t errlen) {
  const char *eq = strchr(text, '=');
  if (eq == NULL || eq == text) {
    snprintf(err, errlen, "'%s' needs the form LABEL={...}", text);
    return KVR_EINVAL;
  }
  cJSON *j = cJSON_Parse(eq + 1);
  bool obj = cJSON_IsObject(j);
  cJSON_Delete(j);
  if (!obj) {
    snprintf(err, errlen, "'%s': the parameters are not a JSON object", eq + 1);
    return KVR_EINVAL;
  }
  if (o->nparams == KVR_RUNNER_MAX_LIST) {
    snprintf(err, errlen, "at most %d given", KVR_RUNNER_MAX_LIST);
    return KVR_EINVAL;
  }
  o->params[o->nparams++] = text;
  return 0;
}

/* Switches the router's policy and empties the prefix caches before label i's levels. */
static int prepare_label(kvr_runner_t *r, kvr_run_t *run, const char *policy, char *err,
                         size_t errlen) {
  FILE *f = r->o->lg.progress;
  if (policy) {
    char e2[400];
    const char *params = run_params(r->o, run->label);
    cJSON *pj = params ? cJSON_Parse(params) : NULL;
    int rc = r->vc ? kvr_vcluster_set_policy(r->vc, policy, pj, e2, sizeof(e2))
                   : kvr_monitor_set_policy(r->mon, policy, params, e2, sizeof(e2));
    cJSON_Delete(pj);
    if (rc != 0) {
      snprintf(err, errlen, "switching policy to %s: %s", policy, e2);
      return KVR_EUPSTREAM;
    }
    if (f)
      fprintf(f, "[%s] policy set to %s\n", run->label, policy);
  }
  if (r->reset) {
    /* Not fatal: a worker that cannot reset (vLLM without dev mode) is named in the report. */
    int rc = 0;
    if (r->vc != NULL)
      kvr_vcluster_reset_cache(r->vc, run->cache_reset, sizeof(run->cache_reset));
    else
      rc = kvr_monitor_reset_cache(r->mon, run->cache_reset, sizeof(run->cache_reset));
    run->cache_reset_outcome = rc == 0 ? KVR_CACHE_RESET_ALL : KVR_CACHE_RESET_FAILED;
    if (f)
      fprintf(f, "[%s] prefix cache reset: %s%s\n", run->label, rc ? "INCOMPLETE: " : "",
              run->cache_reset);
  }
  return 0;
}

static int run_label(kvr_runner_t *r, size_t i, char *err, size_t errlen) {
  const kvr_runner_opts_t *o = r->o;
  const char *policy = o->nab ? o->ab[i] : NULL;
  char d[256];
  if (r->vc)
    snprintf(d, sizeof(d), "router policy `%s` in virtual time",
             policy ? policy : kvr_vcluster_policy(r->vc));
  else if (policy)
    snprintf(d, sizeof(d), "router policy `%s` (PUT /admin/policy) at %s", policy, o->lg.url);
  else
    snprintf(d, sizeof(d), "endpoint %s", o->lg.url);
  kvr_run_t *run = kvr_stats_results_add_run(r->res, kvr_runner_label(o, i), policy, d);
  if (prepare_label(r, run, policy, err, errlen) != 0)
    return KVR_EUPSTREAM;
  if (policy && i > 0) {
    cooldown(r);
    r->first_level = true; /* the cooldown after the switch replaces the one before the level */
  }
  if (o->size_fleet) {
    /* later labels start where the baseline's answer lies: the comparison's fleet is run first */
    unsigned base = i > 0 ? kvr_fleet_answer(&r->res->runs[0]).workers : 0;
    run_fleet(r, run, base > 0 ? base : (unsigned)o->vc.workers);
    return 0;
  }
  if (!o->search) {
    run_list(r, run);
    return 0;
  }
  run->searched = true;
  double base = i > 0 ? kvr_stats_run_max_load(&r->res->runs[0]) : 0;
  run_search(r, run, base > 0 ? base : o->search_start);
  return 0;
}

int kvr_runner_run(kvr_runner_t *r, char *err, size_t errlen) {
  size_t nruns = r->o->nab ? r->o->nab : 1;
  r->first_level = true;
  for (size_t i = 0; i < nruns && !kvr_loadgen_interrupted(r->lg); i++)
    if (run_label(r, i, err, errlen) != 0)
      return KVR_EUPSTREAM;
  return 0;
}

/* ---- set-up, report, teardown ---- */

/* The report's description of the run, from the options and the workload. */
static void results_header(kvr_runner_t *r) {
  const kvr_runner_opts_t *o = r->o;
  kvr_results_t *res = r->res;
  char now[32];
  kvr_utc_iso8601(now, sizeof(now));
  kvr_stats_set_str(&res->generated, now);
  kvr_stats_set_str(&res->title, o->title        ? o->title
                                 : o->size_fleet ? "kvrouter fleet sizing"
                                 : o->nab        ? "kvrouter A/B Benchmark Report"
                                                 : "kvrouter Benchmark Report");
  kvr_stats_set_str(&res->url, o->lg.url);
  kvr_stats_set_str(&res->model, o->lg.model);
  kvr_stats_set_str(&res->api, kvr_workload_api_name(o->lg.api));
  kvr_stats_set_str(&res->workload, kvr_workload_name(r->wl));
  kvr_buf_t desc = KVR_BUF_INIT;
  kvr_workload_describe(r->wl, &desc);
  kvr_stats_set_str(&res->workload_desc, desc.data);
  kvr_buf_free(&desc);
  kvr_stats_set_str(&res->command, o->command);
  res->concurrency_mode = o->nconc > 0;
  res->sessions = o->lg.sessions;
  /* The same test as the load generator's (loadgen.c: a multiturn replay in rate mode). */
  const kvr_workload_opts_t *wo = kvr_workload_opts(r->wl);
  res->replay = !o->lg.sessions && wo->kind == KVR_WL_MULTITURN && wo->replay;
  res->num_prompts = o->lg.num_prompts;
  const kvr_trace_replay_t *tr = kvr_workload_trace(r->wl);
  if (tr != NULL) {
    res->trace = kvr_xmalloc(sizeof(*res->trace));
    *res->trace = *kvr_trace_replay_stats(tr);
  }
  res->warmup = o->lg.warmup;
  res->cooldown_s = o->cooldown_s;
  res->burstiness = o->lg.burstiness;
  res->time_scale = o->lg.time_scale;
  res->seed = o->seed;
  res->slo = o->slo;
  if (r->reset && r->vc)
    res->cache_reset = "before each run: every engine's prefix cache and the router's cache index "
                       "(virtual time)";
  else if (r->reset)
    res->cache_reset = o->admin ? "before each run: POST /admin/reset_prefix_cache (every worker's "
                                  "prefix cache and the router's cache index)"
                                : "before each run: POST /reset_prefix_cache on the endpoint";
}

/* Asks the endpoint for its model when none was given. */
static int find_model(kvr_runner_t *r, char *err, size_t errlen) {
  if (r->o->lg.model != NULL)
    return 0;
  char e2[400];
  int rc = kvr_monitor_fetch_model(r->mon, r->model, sizeof(r->model), e2, sizeof(e2));
  if (rc != 0) {
    snprintf(err, errlen, "no --model given and %s", e2);
    return rc == KVR_EINVAL ? KVR_EIO : rc;
  }
  r->o->lg.model = r->model;
  kvr_loadgen_set_model(r->lg, r->model);
  return 0;
}

/* --size-fleet: the rate every fleet runs at, the trace's own mean rate unless --rates gives one.
 */
static int fleet_rate(kvr_runner_t *r, char *err, size_t errlen) {
  const kvr_runner_opts_t *o = r->o;
  if (!o->size_fleet)
    return 0;
  const kvr_trace_replay_t *tr = kvr_workload_trace(r->wl);
  r->fleet = (kvr_fleet_info_t){.rate = o->nrates ? o->rates[0] : 0,
                                .trace_rate = o->nrates == 0,
                                .start = (unsigned)o->vc.workers,
                                .max = o->size_fleet_max};
  if (o->nrates == 0 && tr != NULL)
    r->fleet.rate = kvr_trace_replay_stats(tr)->sent_rate;
  if (r->fleet.rate > 0)
    return 0;
  snprintf(err, errlen,
           "--size-fleet: the trace's requests arrive at one instant (no rate of "
           "its own): give --rates R");
  return KVR_EINVAL;
}

/* Virtual time: the cluster, and the load generator on its transport. */
static int setup_virtual(kvr_runner_t *r, char *err, size_t errlen) {
  kvr_runner_opts_t *o = r->o;
  o->vc.chat = o->lg.api != KVR_API_COMPLETIONS; /* Responses prompts are rendered as chat */
  o->vc.responses = o->lg.api == KVR_API_RESPONSES;
  o->vc.slo_ttft_s = o->slo.ttft_p99_ms / 1e3;
  o->vc.slo_tpot_s = o->slo.tpot_p99_ms / 1e3;
  if (o->lg.model == NULL)
    o->lg.model = o->vc.model;
  o->vc.model = o->lg.model;
  o->lg.time_scale = 1;
  o->lg.url = "virtual";
  if ((r->vc = kvr_vcluster_new(&o->vc, err, errlen)) == NULL)
    return KVR_EINVAL;
  kvr_loadgen_vt_t vt;
  kvr_vcluster_transport(r->vc, &vt);
  if ((r->lg = kvr_loadgen_new_virtual(&o->lg, r->wl, &vt, err, errlen)) == NULL)
    return KVR_EINVAL;
  r->reset = o->reset_cache < 0 ? o->nab > 0 : o->reset_cache == 1;
  r->res = kvr_stats_results_new();
  results_header(r);
  kvr_buf_t desc = KVR_BUF_INIT;
  kvr_vcluster_describe(r->vc, &desc);
  kvr_buf_printf(&desc, "; seed %llu", (unsigned long long)o->seed);
  kvr_stats_set_str(&r->res->virtual_desc, desc.data);
  kvr_buf_free(&desc);
  return fleet_rate(r, err, errlen);
}

/* The context of the virtual workers: the engine's max_model_len, or less when a worker's whole KV
 * cache holds fewer tokens (a request that long could never run). */
static uint64_t virtual_context(const kvr_vcluster_opts_t *vc) {
  uint64_t ctx = vc->engine.max_model_len;
  for (size_t i = 0; i < (vc->nworker_blocks ? vc->nworker_blocks : 1); i++) {
    uint64_t blocks = vc->nworker_blocks ? vc->worker_blocks[i] : vc->engine.num_gpu_blocks;
    ctx = KVR_MIN(ctx, blocks * vc->engine.block_size);
  }
  return ctx;
}

/* A trace workload once the workers' context is known: at least one request must fit it. */
static int trace_fits(kvr_runner_t *r, char *err, size_t errlen) {
  const kvr_trace_replay_t *tr = kvr_workload_trace(r->wl);
  if (tr == NULL || kvr_trace_replay_count(tr) > 0)
    return 0;
  const kvr_trace_stats_t *st = kvr_trace_replay_stats(tr);
  snprintf(err, errlen,
           "%s: none of the %zu requests fits the workers' context of %llu tokens (input + "
           "output)",
           r->o->wl.path, st->requests, (unsigned long long)st->max_context);
  return KVR_EINVAL;
}

/* A real endpoint's context for a trace workload: GET /v1/models's max_model_len; when it gives
 * none, nothing is held back (requests over the server's limit fail as it answers them). */
static int real_context(kvr_runner_t *r, char *err, size_t errlen) {
  if (kvr_workload_trace(r->wl) == NULL)
    return 0;
  uint64_t ctx = 0;
  char e2[400];
  if (kvr_monitor_fetch_max_model_len(r->mon, &ctx, e2, sizeof(e2)) != 0) {
    ctx = 0;
    if (r->o->lg.progress)
      fprintf(r->o->lg.progress, "trace: the workers' context is not known (%s): all sent\n", e2);
  }
  kvr_workload_set_max_context(r->wl, ctx);
  return trace_fits(r, err, errlen);
}

static int setup(kvr_runner_t *r, char *err, size_t errlen) {
  kvr_runner_opts_t *o = r->o;
  if (o->virt && o->wl.kind == KVR_WL_TRACE)
    o->wl.max_context = virtual_context(&o->vc);
  if ((r->wl = kvr_workload_new(&o->wl, err, errlen)) == NULL)
    return KVR_EINVAL;
  if (trace_fits(r, err, errlen) != 0)
    return KVR_EINVAL;
  if (o->virt)
    return setup_virtual(r, err, errlen);
  if ((r->lg = kvr_loadgen_new(r->loop, &o->lg, r->wl, err, errlen)) == NULL)
    return KVR_EINVAL;
  /* the monitor reads the first endpoint (the model list; without --admin, its /metrics) */
  char first[512];
  snprintf(first, sizeof first, "%.*s", (int)strcspn(o->lg.url, ","), o->lg.url);
  if ((r->mon = kvr_monitor_new(r->loop, o->admin, first, 200)) == NULL) {
    snprintf(err, errlen, "cannot set up the metrics monitor for %s", first);
    return KVR_EIO;
  }
  int rc = find_model(r, err, errlen);
  if (rc != 0)
    return rc;
  if ((rc = real_context(r, err, errlen)) != 0)
    return rc;
  r->reset = o->reset_cache < 0 ? o->nab > 0 : o->reset_cache == 1;
  r->res = kvr_stats_results_new();
  results_header(r);
  return 0;
}

int kvr_runner_new(uv_loop_t *loop, kvr_runner_opts_t *opts, kvr_runner_t **out, char *err,
                   size_t errlen) {
  kvr_runner_t *r = kvr_xcalloc(1, sizeof(*r));
  *out = NULL;
  r->o = opts;
  r->loop = loop;
  int rc = setup(r, err, errlen);
  if (rc != 0) {
    kvr_runner_free(r);
    return rc;
  }
  *out = r;
  return 0;
}

/* --size-fleet's report (fleet.h): its own files and summary. */
static int fleet_report(kvr_runner_t *r, FILE *out, char *err, size_t errlen) {
  char e2[400];
  if (kvr_fleet_write(r->res, &r->fleet, r->o->out, e2, sizeof(e2)) != 0) {
    snprintf(err, errlen, "writing the report: %s", e2);
    return KVR_EIO;
  }
  kvr_buf_t sum = KVR_BUF_INIT;
  kvr_fleet_summary(r->res, &r->fleet, &sum);
  fputs(sum.data ? sum.data : "", out);
  fprintf(out, "Report: %s/report.md (fleet.json beside it)\n", r->o->out);
  fflush(out);
  kvr_buf_free(&sum);
  return 0;
}

int kvr_runner_report(kvr_runner_t *r, FILE *out, char *err, size_t errlen) {
  if (r->o->size_fleet)
    return fleet_report(r, out, err, errlen);
  char e2[400];
  if (kvr_report_write(r->res, r->o->out, e2, sizeof(e2)) != 0) {
    snprintf(err, errlen, "writing the report: %s", e2);
    return KVR_EIO;
  }
  kvr_buf_t sum = KVR_BUF_INIT;
  kvr_report_summary(r->res, &sum);
  fputs(sum.data ? sum.data : "", out);
  fprintf(out, "Report: %s/report.md (HTML %s/report.html)\n", r->o->out, r->o->out);
  fflush(out);
  kvr_buf_free(&sum);
  return 0;
}

void kvr_runner_interrupt(kvr_runner_t *r) {
  kvr_loadgen_interrupt(r->lg);
}

kvr_results_t *kvr_runner_take_results(kvr_runner_t *r) {
  kvr_results_t *res = r->res;
  r->res = NULL;
  return res;
}

bool kvr_runner_virtual(const kvr_runner_t *r) {
  return r->vc != NULL;
}

bool kvr_runner_interrupted(const kvr_runner_t *r) {
  return kvr_loadgen_interrupted(r->lg);
}

void kvr_runner_free(kvr_runner_t *r) {
  if (r == NULL)
    return;
  kvr_monitor_free(r->mon);
  kvr_loadgen_free(r->lg);
  kvr_vcluster_free(r->vc);
  kvr_stats_results_free(r->res);
  kvr_workload_free(r->wl);
  free(r);
}

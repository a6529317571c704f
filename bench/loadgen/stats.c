/* stats.c -- percentiles, per-level aggregation and SLO verdicts for `kvrouter bench`.
 *
 * Percentiles are src/base/quantile.h's (numpy's 'linear' method, as vllm reports them), the
 * definition kvrouter's products share.
 *
 * Structs (see stats.h): kvr_level_t collects kvr_req_rec_t records and ITL samples while a level
 * runs; kvr_stats_level_finish() turns them into kvr_dist_t figures, throughput, peak concurrency,
 * worker shares and per-turn TTFT, and decides pass/fail against a kvr_slo_t. kvr_run_t and
 * kvr_results_t group levels by label for the report.
 *
 * Flow: load generator -> kvr_stats_level_add() per finished request -> kvr_stats_level_finish()
 * once the level is over -> kvr_stats_run_add() -> report.
 *
 * Invariants: warm-up records (and cool-down ones, flagged warmup too) are stored (for the JSONL)
 * but never counted; ITL samples are bounded
 * by KVR_STATS_ITL_CAP per level (a seeded uniform reservoir past it) and freed at finish, so
 * memory per level is records plus at most the cap.
 */
#include "stats.h"

#include "base/kvr.h"
#include "base/quantile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_stats_dist(double *v, size_t n, kvr_dist_t *d) {
  memset(d, 0, sizeof(*d));
  d->n = n;
  if (n == 0)
    return;
  kvr_quantile_sort(v, n);
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += v[i];
  d->mean = sum / (double)n;
  double ss = 0;
  for (size_t i = 0; i < n; i++)
    ss += (v[i] - d->mean) * (v[i] - d->mean);
  d->std = sqrt(ss / (double)n);
  d->p50 = kvr_quantile(v, n, 50);
  d->p90 = kvr_quantile(v, n, 90);
  d->p95 = kvr_quantile(v, n, 95);
  d->p99 = kvr_quantile(v, n, 99);
  d->max = v[n - 1];
}

typedef struct edge_s {
  double t;
  int delta;
} edge_t;

static int cmp_edge(const void *a, const void *b) {
  const edge_t *x = a, *y = b;
  if (x->t != y->t)
    return (x->t > y->t) - (x->t < y->t);
  return x->delta - y->delta; /* -1 (end) before +1 (start) */
}

unsigned kvr_stats_max_overlap(const double *start, const double *end, size_t n) {
  if (n == 0)
    return 0;
  edge_t *e = kvr_xrealloc(NULL, 2 * n * sizeof(*e));
  for (size_t i = 0; i < n; i++) {
    e[2 * i] = (edge_t){start[i], +1};
    e[2 * i + 1] = (edge_t){end[i], -1};
  }
  qsort(e, 2 * n, sizeof(*e), cmp_edge);
  int cur = 0, best = 0;
  for (size_t i = 0; i < 2 * n; i++) {
    cur += e[i].delta;
    if (cur > best)
      best = cur;
  }
  free(e);
  return (unsigned)best;
}

void kvr_stats_fail_names(unsigned mask, char *buf, size_t size) {
  static const struct {
    unsigned bit;
    const char *name;
  } names[] = {{KVR_SLO_FAIL_NODATA, "no data"},
               {KVR_SLO_FAIL_TTFT, "TTFT"},
               {KVR_SLO_FAIL_TPOT, "TPOT"},
               {KVR_SLO_FAIL_ERRORS, "errors"}};
  size_t len = 0;
  if (size)
    buf[0] = '\0';
  for (size_t i = 0; i < KVR_ARRAY_SIZE(names); i++) {
    if (!(mask & names[i].bit))
      continue;
    int w = snprintf(buf + len, size > len ? size - len : 0, "%s%s", len ? "+" : "", names[i].name);
    if (w > 0)
      len += (size_t)w;
    if (len >= size)
      break;
  }
}

kvr_level_t *kvr_stats_level_new(double rate, unsigned concurrency) {
  kvr_level_t *lv = kvr_xcalloc(1, sizeof(*lv));
  lv->rate = rate;
  lv->concurrency = concurrency;
  lv->itl_rng = 0x1234567u ^ (isfinite(rate) ? (uint64_t)(rate * 1000.0) : 0) ^ concurrency;
  return lv;
}

void kvr_stats_level_free(kvr_level_t *lv) {
  if (lv == NULL)
    return;
  for (size_t i = 0; i < lv->nrecs; i++) {
    free(lv->recs[i].itl_ms);
    free(lv->recs[i].text);
  }
  free(lv->recs);
  free(lv->itls);
  free(lv->workers);
  free(lv->turns);
  free(lv);
}

static uint64_t next_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void kvr_stats_level_reserve(kvr_level_t *lv, size_t nrecs, size_t nitls) {
  if (nrecs > lv->caprecs) {
    lv->caprecs = nrecs;
    lv->recs = kvr_xrealloc(lv->recs, lv->caprecs * sizeof(*lv->recs));
  }
  nitls = nitls < KVR_STATS_ITL_CAP ? nitls : KVR_STATS_ITL_CAP;
  if (nitls > lv->capitls) {
    lv->capitls = nitls;
    lv->itls = kvr_xrealloc(lv->itls, lv->capitls * sizeof(double));
  }
}

void kvr_stats_level_add(kvr_level_t *lv, const kvr_req_rec_t *rec, const double *itls, size_t n) {
  if (lv->nrecs == lv->caprecs) {
    lv->caprecs = lv->caprecs ? lv->caprecs * 2 : 256;
    lv->recs = kvr_xrealloc(lv->recs, lv->caprecs * sizeof(*lv->recs));
  }
  kvr_req_rec_t *r = &lv->recs[lv->nrecs++];
  *r = *rec;
  r->itl_ms = NULL;
  if (r->warmup) {
    free(r->text);
    r->text = NULL;
  } else if (lv->result.save_detailed && n > 0) {
    r->itl_ms = kvr_xmalloc(n * sizeof(double));
    memcpy(r->itl_ms, itls, n * sizeof(double));
  }
  if (rec->warmup || !rec->ok)
    return;
  for (size_t i = 0; i < n; i++) {
    lv->itl_seen++;
    if (lv->nitls < KVR_STATS_ITL_CAP) {
      if (lv->nitls == lv->capitls) {
        lv->capitls = lv->capitls ? lv->capitls * 2 : 4096;
        lv->itls = kvr_xrealloc(lv->itls, lv->capitls * sizeof(double));
      }
      lv->itls[lv->nitls++] = itls[i];
    } else {
      uint64_t j = next_rand(&lv->itl_rng) % lv->itl_seen;
      if (j < KVR_STATS_ITL_CAP)
        lv->itls[j] = itls[i];
    }
  }
}

static int cmp_worker(const void *a, const void *b) {
  return strcmp(((const kvr_worker_share_t *)a)->name, ((const kvr_worker_share_t *)b)->name);
}

/* Scratch columns of one level's measured records, filled in one pass by collect(). */
typedef struct cols_s {
  double *ttft, *tpot, *e2e, *lag, *transport, *start, *end;
  size_t nttft, ntpot, ne2e, nlag, ntransport, nint;
  double first_send, last_send, last_end; /* report seconds since level start */
  double first_target, last_target;       /* scheduled send times, report seconds */
  uint32_t max_turn;
} cols_t;

static void cols_init(cols_t *c, size_t n) {
  memset(c, 0, sizeof(*c));
  double **cols[] = {&c->ttft, &c->tpot, &c->e2e, &c->lag, &c->transport, &c->start, &c->end};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cols); i++)
    *cols[i] = kvr_xrealloc(NULL, n * sizeof(double));
  c->first_send = c->first_target = INFINITY;
  c->last_send = c->last_end = c->last_target = -INFINITY;
}

static void cols_free(cols_t *c) {
  double *cols[] = {c->ttft, c->tpot, c->e2e, c->lag, c->transport, c->start, c->end};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cols); i++)
    free(cols[i]);
}

static void reset_aggregates(kvr_level_t *lv) {
  lv->measured = lv->completed = lv->failed = 0;
  lv->total_input = lv->total_output = lv->total_cached = 0;
  lv->usage_requests = 0;
  free(lv->workers);
  lv->workers = NULL;
  lv->nworkers = 0;
  free(lv->turns);
  lv->turns = NULL;
  lv->nturns = 0;
}

/* Worker share counts every measured request the router placed, failed or not. */
static void count_worker(kvr_level_t *lv, const char *name) {
  size_t w = 0;
  while (w < lv->nworkers && strcmp(lv->workers[w].name, name) != 0)
    w++;
  if (w == lv->nworkers && lv->nworkers < KVR_STATS_MAX_WORKERS) {
    lv->workers = kvr_xrealloc(lv->workers, (lv->nworkers + 1) * sizeof(*lv->workers));
    memset(&lv->workers[w], 0, sizeof(lv->workers[w]));
    snprintf(lv->workers[w].name, sizeof(lv->workers[w].name), "%s", name);
    lv->nworkers++;
  }
  if (w < lv->nworkers)
    lv->workers[w].count++;
}

/* Send times, lag and worker of a measured request, failed or not. */
static void collect_sent(kvr_level_t *lv, const kvr_req_rec_t *r, cols_t *c) {
  lv->measured++;
  c->lag[c->nlag++] = r->lag_ms;
  double end = r->sent_s + (r->e2e_ms > 0 ? r->e2e_ms / 1000.0 : 0);
  c->start[c->nint] = r->sent_s;
  c->end[c->nint++] = end;
  c->first_send = fmin(c->first_send, r->sent_s);
  c->last_send = fmax(c->last_send, r->sent_s);
  c->last_end = fmax(c->last_end, end);
  c->first_target = fmin(c->first_target, r->target_s);
  c->last_target = fmax(c->last_target, r->target_s);
  count_worker(lv, r->worker);
}

/* Tokens and latencies of a completed measured request. */
static void collect_ok(kvr_level_t *lv, const kvr_req_rec_t *r, cols_t *c) {
  lv->completed++;
  lv->total_input += r->prompt_tokens;
  lv->total_output += r->output_tokens;
  lv->total_cached += r->cached_tokens;
  lv->usage_requests += r->usage_seen;
  if (r->ttft_ms >= 0)
    c->ttft[c->nttft++] = r->ttft_ms;
  if (r->transport_ms >= 0)
    c->transport[c->ntransport++] = r->transport_ms;
  if (r->tpot_ms >= 0)
    c->tpot[c->ntpot++] = r->tpot_ms;
  c->e2e[c->ne2e++] = r->e2e_ms;
  if (r->turn > c->max_turn)
    c->max_turn = KVR_MIN(r->turn, KVR_STATS_MAX_TURNS);
}

static void collect(kvr_level_t *lv, cols_t *c) {
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup)
      continue;
    collect_sent(lv, r, c);
    if (r->ok)
      collect_ok(lv, r, c);
    else
      lv->failed++;
  }
  if (lv->nworkers > 1)
    qsort(lv->workers, lv->nworkers, sizeof(*lv->workers), cmp_worker);
}

/* Per-turn TTFT and token figures over the completed measured requests of turns 1..max_turn. */
static void per_turn(kvr_level_t *lv, uint32_t max_turn) {
  if (max_turn == 0)
    return;
  lv->turns = kvr_xcalloc(max_turn, sizeof(*lv->turns));
  lv->nturns = max_turn;
  double *tv = kvr_xrealloc(NULL, lv->nrecs * sizeof(double));
  for (uint32_t t = 1; t <= max_turn; t++) {
    size_t k = 0;
    double sp = 0, sc = 0;
    for (size_t i = 0; i < lv->nrecs; i++) {
      const kvr_req_rec_t *r = &lv->recs[i];
      if (r->warmup || !r->ok || r->turn != t)
        continue;
      if (r->ttft_ms >= 0)
        tv[k++] = r->ttft_ms;
      sp += r->prompt_tokens;
      sc += r->cached_tokens;
    }
    kvr_turn_stats_t *ts = &lv->turns[t - 1];
    ts->turn = t;
    kvr_stats_dist(tv, k, &ts->ttft);
    ts->mean_prompt_tokens = k ? sp / (double)k : 0;
    ts->mean_cached_tokens = k ? sc / (double)k : 0;
  }
  free(tv);
}

/* Duration, throughputs, the achieved and scheduled send rates and the peak concurrency. */
static void rates(kvr_level_t *lv, const cols_t *c) {
  lv->max_concurrent = kvr_stats_max_overlap(c->start, c->end, c->nint);
  /* A steady-state closed loop keeps every user busy through its cool-down, so its throughput is
   * the window of measured sends (a request goes out as one completes); up to the last measured
   * end, the tail would count as idle what the cool-down requests fill. */
  double end = lv->steady_state && c->last_send > c->first_send ? c->last_send : c->last_end;
  lv->duration_s = lv->measured ? end - c->first_send : 0;
  if (lv->duration_s > 0) {
    lv->request_throughput = (double)lv->completed / lv->duration_s;
    lv->output_throughput = (double)lv->total_output / lv->duration_s;
    lv->total_token_throughput = (double)(lv->total_input + lv->total_output) / lv->duration_s;
  } else {
    lv->request_throughput = lv->output_throughput = lv->total_token_throughput = 0;
  }
  lv->achieved_rate = lv->measured > 1 && c->last_send > c->first_send
                          ? (double)(lv->measured - 1) / (c->last_send - c->first_send)
                          : 0;
  lv->scheduled_rate = lv->measured > 1 && c->last_target > c->first_target
                           ? (double)(lv->measured - 1) / (c->last_target - c->first_target)
                           : 0;
}

static void slo_verdict(kvr_level_t *lv, const kvr_slo_t *slo) {
  lv->fail_mask = 0;
  if (lv->completed == 0 && !lv->stopped_early)
    lv->fail_mask |= KVR_SLO_FAIL_NODATA;
  else {
    if (!(lv->ttft.p99 < slo->ttft_p99_ms))
      lv->fail_mask |= KVR_SLO_FAIL_TTFT;
    if (lv->tpot.n > 0 && !(lv->tpot.p99 < slo->tpot_p99_ms))
      lv->fail_mask |= KVR_SLO_FAIL_TPOT;
  }
  if (lv->stopped_early)
    lv->fail_mask |= KVR_SLO_FAIL_TTFT; /* certain, though the slow ones never finished */
  if ((double)lv->failed > slo->max_failed_frac * (double)lv->measured)
    lv->fail_mask |= KVR_SLO_FAIL_ERRORS;
  lv->pass = lv->fail_mask == 0;
}

unsigned kvr_result_metrics(const kvr_result_opts_t *o) {
  return o->metrics ? o->metrics
                    : 1u << KVR_METRIC_TTFT | 1u << KVR_METRIC_TPOT | 1u << KVR_METRIC_ITL |
                          1u << KVR_METRIC_E2EL;
}

size_t kvr_result_pcts(const kvr_result_opts_t *o, const double **pct) {
  static const double def[] = {50, 90, 95, 99};
  *pct = o->npct ? o->pct : def;
  return o->npct ? o->npct : KVR_ARRAY_SIZE(def);
}

/* vllm's mean, median, std and percentiles of v (sorted in place). */
static void vstat(double *v, size_t n, const kvr_result_opts_t *o, kvr_vstat_t *s) {
  kvr_dist_t d;
  kvr_stats_dist(v, n, &d);
  memset(s, 0, sizeof(*s));
  s->n = n;
  s->mean = d.mean;
  s->median = d.p50;
  s->std = d.std;
  const double *pct;
  size_t np = kvr_result_pcts(o, &pct);
  for (size_t i = 0; i < np && n > 0; i++)
    s->pct[i] = kvr_quantile(v, n, pct[i]);
}

/* The client-side queueing vllm reports with --max-concurrency, per completed measured request:
 * its wait from arrival (due) to send, and that plus its E2E (ms). */
static void queue_vstats(kvr_level_t *lv) {
  double *q = kvr_xrealloc(NULL, (lv->nrecs ? lv->nrecs : 1) * sizeof(double));
  double *qe = kvr_xrealloc(NULL, (lv->nrecs ? lv->nrecs : 1) * sizeof(double));
  size_t n = 0;
  for (size_t i = 0; i < lv->nrecs; i++) {
    const kvr_req_rec_t *r = &lv->recs[i];
    if (r->warmup || !r->ok)
      continue;
    q[n] = fmax(0, r->sent_s - r->arrival_s) * 1000.0;
    qe[n] = r->e2e_ms + q[n];
    n++;
  }
  vstat(q, n, &lv->result, &lv->vstat[KVR_METRIC_QUEUE]);
  vstat(qe, n, &lv->result, &lv->vstat[KVR_METRIC_E2EL_QUEUE]);
  free(q);
  free(qe);
}

void kvr_stats_level_finish(kvr_level_t *lv, const kvr_slo_t *slo) {
  cols_t c;
  cols_init(&c, lv->nrecs);
  reset_aggregates(lv);
  collect(lv, &c);
  per_turn(lv, c.max_turn);
  kvr_stats_dist(c.ttft, c.nttft, &lv->ttft);
  kvr_stats_dist(c.tpot, c.ntpot, &lv->tpot);
  kvr_stats_dist(c.e2e, c.ne2e, &lv->e2e);
  kvr_stats_dist(c.lag, c.nlag, &lv->lag);
  kvr_stats_dist(c.transport, c.ntransport, &lv->transport);
  vstat(c.ttft, c.nttft, &lv->result, &lv->vstat[KVR_METRIC_TTFT]);
  vstat(c.tpot, c.ntpot, &lv->result, &lv->vstat[KVR_METRIC_TPOT]);
  vstat(c.e2e, c.ne2e, &lv->result, &lv->vstat[KVR_METRIC_E2EL]);
  queue_vstats(lv);
  if (lv->itls != NULL) {
    kvr_stats_dist(lv->itls, lv->nitls, &lv->itl);
    vstat(lv->itls, lv->nitls, &lv->result, &lv->vstat[KVR_METRIC_ITL]);
    free(lv->itls);
    lv->itls = NULL;
    lv->nitls = lv->capitls = 0;
  }
  rates(lv, &c);
  slo_verdict(lv, slo);
  cols_free(&c);
}

void kvr_stats_run_add(kvr_run_t *run, kvr_level_t *lv) {
  run->levels = kvr_xrealloc(run->levels, (run->nlevels + 1) * sizeof(*run->levels));
  run->levels[run->nlevels++] = lv;
}

const kvr_level_t *kvr_stats_run_find(const kvr_run_t *run, double rate, unsigned concurrency) {
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    if (fabs(lv->rate - rate) < 1e-9 && lv->concurrency == concurrency)
      return lv;
  }
  return NULL;
}

static double load_of(const kvr_level_t *lv) {
  return lv->concurrency ? (double)lv->concurrency : lv->rate;
}

double kvr_stats_run_max_load(const kvr_run_t *run) {
  double lowest_fail = INFINITY;
  bool failed = false;
  for (size_t i = 0; i < run->nlevels; i++)
    if (!run->levels[i]->pass && !run->levels[i]->interrupted) {
      lowest_fail = fmin(lowest_fail, load_of(run->levels[i]));
      failed = true;
    }
  double best = 0;
  for (size_t i = 0; i < run->nlevels; i++) {
    const kvr_level_t *lv = run->levels[i];
    /* (a level at rate inf, vllm's default, passes below no failure) */
    if (lv->pass && !lv->interrupted && (!failed || load_of(lv) < lowest_fail))
      best = fmax(best, load_of(lv));
  }
  return best;
}

kvr_results_t *kvr_stats_results_new(void) {
  kvr_results_t *res = kvr_xcalloc(1, sizeof(*res));
  res->slo.ttft_p99_ms = 1000;
  res->slo.tpot_p99_ms = 60;
  res->time_scale = 1;
  res->burstiness = 1;
  return res;
}

void kvr_stats_set_str(char **field, const char *value) {
  free(*field);
  *field = kvr_xstrdup(value);
}

kvr_run_t *kvr_stats_results_add_run(kvr_results_t *res, const char *label, const char *policy,
                                     const char *description) {
  res->runs = kvr_xrealloc(res->runs, (res->nruns + 1) * sizeof(*res->runs));
  kvr_run_t *run = &res->runs[res->nruns++];
  memset(run, 0, sizeof(*run));
  snprintf(run->label, sizeof(run->label), "%s", label ? label : "");
  snprintf(run->policy, sizeof(run->policy), "%s", policy ? policy : "");
  snprintf(run->description, sizeof(run->description), "%s", description ? description : "");
  return run;
}

void kvr_stats_results_free(kvr_results_t *res) {
  if (res == NULL)
    return;
  for (size_t i = 0; i < res->nruns; i++) {
    for (size_t j = 0; j < res->runs[i].nlevels; j++)
      kvr_stats_level_free(res->runs[i].levels[j]);
    free(res->runs[i].levels);
  }
  free(res->runs);
  free(res->title);
  free(res->generated);
  free(res->url);
  free(res->model);
  free(res->api);
  free(res->workload);
  free(res->workload_desc);
  free(res->command);
  free(res->virtual_desc);
  free(res->trace);
  free(res);
}

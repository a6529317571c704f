/* kv_aware.c -- the default policy: the lowest estimated cost of serving this request, where the
 * cost weighs the prompt tokens a worker would have to prefill against the load it already carries,
 * under a bounded-load rule that keeps one popular prefix from making a hot spot.
 *
 * Cost of worker i, in prefill-token equivalents:
 *
 *   matched_i  = min(prompt_tokens, matched_blocks_i * block_chars / KVR_CHARS_PER_TOKEN)
 *   uncached_i = prompt_tokens - matched_i
 *   ahead_i    = prefill_backlog_tokens_i + uncached_i                  (prefill before our first
 * token) cost_i     = prefill_weight  * ahead_i
 *              + decode_weight   * active_tokens_i * C / C_i         (decode batch we join,
 * relative to the worker's KV cache)
 *              + inflight_weight * inflight_i                        (per-sequence overhead)
 *              + session_weight  * open_sessions_i                   (pinned turns to come)
 *              + [metrics fresh]  waiting_weight  * num_requests_waiting_i
 *                               + kv_usage_weight * kv_cache_usage_i ^ kv_usage_power
 *
 * C_i is the worker's cache capacity (cache_capacity_blocks, from its /metrics) and C the mean over
 * the eligible workers: on equal workers the factor is 1; on a mixed fleet the same decode tokens
 * weigh more on a smaller cache, which they fill sooner.
 *
 * Open sessions (open_sessions_i, router_affinity.c): Responses sessions whose latest answer
 * worker i stored (store, previous_response_id) and whose next turn has not come yet. The router
 * pins that turn to i whatever any policy says, so each is a request on its way there: its new
 * input to prefill (an agent's tool output, ~750-900 tokens in ../shared/WORKLOAD.md's per-turn
 * growth) and a place in the batch, which inflight_i cannot see while the client runs its tool.
 * It arrives later (after the current answer's decode and the tool), so session_weight 512 counts
 * about half of that; 256 to 2048 gave the same limits within their noise
 * (bench/results/study/NOTES.md, "Open sessions"). Without the term a session-starting request
 * saw only the requests in flight, and a worker whose sessions were between turns looked light;
 * since a policy places only a session's first turn, that imbalance lasted the session. No
 * Responses sessions, no term: 0 everywhere.
 *
 * KV usage counts convexly (kv_usage_power 4, kv_usage_weight 8192): what KV usage costs is the
 * cache running out -- vLLM then preempts running requests and queues new ones, seconds of TTFT --
 * so the term is large near full (5,375 tokens at 0.9, 8,192 at 1: about two prefills of a
 * 4k-token document, so a worker about to run out stops attracting requests for their cached
 * prefix) and small below (512 at 0.5, 66 at 0.3). The linear term it replaces (2048 x usage)
 * was at most half such a prefill: on a mixed fleet it kept sending documents to the small
 * worker as it filled. The usage is scraped once a second, so one figure steers every request
 * until the next scrape; between 0.5 and 0.7 a 0.1 step moves the cost by 550-905 tokens (205
 * linear), still well under a cached document.
 *
 * Prefill gate: a worker whose ahead_i exceeds the lowest eligible ahead by more than
 * prefill_gate_tokens is out, whatever the rest of its cost: a long conversation whose history one
 * worker holds stays there instead of being moved for a load difference and paying its whole
 * prefill again (tens of thousands of tokens, seconds of TTFT), while a prefix shorter than the
 * gate (a popular system prompt) still spreads by load. 4096 tokens is about 0.4 s of prefill on
 * the simulated H200 (bench/sim/README.md); set it near what the TTFT SLO allows for prefill on
 * your hardware, or 0 to turn the gate off. The bounded-load cap below wins over the gate, and the
 * gate never shuts out a worker running more than balance_slack requests below the mean (a popular
 * prefix would otherwise starve it).
 *
 * Bounded load (consistent hashing with bounded loads, Mirrokni et al. 2018, as in HAProxy's
 * hash-balance-factor): with F requests in flight over the n eligible workers, a worker is capped
 * (not choosable) when inflight_i + 1 > max((1 + balance_epsilon) * (F + 1) / n,
 * (F + 1) / n + balance_slack). The slack keeps affinity at low load, where one or two requests of
 * imbalance are no hot spot; the epsilon term bounds the share of any worker under load. At least
 * one eligible worker is always under the limit (the minimum is at most the mean).
 *
 * LoRA adapters (kvr_worker_snap_t.adapter), after the prefill gate and like it: among the
 * workers still open, those where the request's adapter is running (in the batch now) are
 * preferred to those where it is merely loaded, and those to workers that would load it first;
 * a less ready worker stays open only while it runs more than balance_slack requests below the
 * mean in flight. An adapter running on one worker thus keeps its requests there until the
 * bounded load caps it (so a hot adapter spreads, and its next workers learn it), exactly as a
 * cached prefix does; among equally ready workers the cost decides. The prefill gate comes first:
 * a worker holding this request's prefix under this adapter (the index's blocks are keyed by the
 * model name, prompt.h) has served the adapter, so it is loaded there too. adapter_affinity 0 turns
 * the adapter gate off (the cost alone decides among the workers the router made eligible).
 *
 * prefill_backlog_tokens is the part of the worker's queued prefill it has probably not reached yet
 * (prefill_clock.h): when every worker is busy prefilling, the request joins the one closest to
 * done, not the one that happens to carry the least decode load.
 *
 * Lowest cost wins; ties go to the fewer in flight, then fewer active tokens, then random (seeded).
 * With no shared prefixes every uncached_i is equal and the cost orders workers by load, so the
 * policy degrades to least-loaded rather than below round-robin.
 *
 * Defaults: chosen in virtual time with bench/scripts/study/tune.py against every reference policy
 * on the seven scenarios of `kvrouter bench study` (3 seeds each); policies/README.md has the
 * table.
 *
 * State: the parameters and the RNG for ties. Scores: cost_i as above, capped per the bound.
 */
#include <math.h>
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

/* The parameters: X(name, default, min, max, integer), each a double member below. */
#define KV_PARAMS(X)                                                                               \
  X(prefill_weight, 1.0, 0, 1e9, false)                                                            \
  X(decode_weight, 0.01, 0, 1e9, false)                                                            \
  X(inflight_weight, 128, 0, 1e12, false)                                                          \
  X(waiting_weight, 512, 0, 1e12, false)                                                           \
  X(kv_usage_weight, 8192, 0, 1e12, false)                                                         \
  X(kv_usage_power, 4, 1, 64, false)                                                               \
  X(balance_epsilon, 0.5, 0, 1e6, false)                                                           \
  X(balance_slack, 8, 0, 1e9, false)                                                               \
  X(prefill_gate_tokens, 4096, 0, 1e12, false)                                                     \
  X(adapter_affinity, 1, 0, 1, true)                                                               \
  X(session_weight, 512, 0, 1e12, false)

typedef struct kv_s {
  kvr_policy_t super;
  uint64_t rng;
  KV_PARAMS(KVR__POLICY_MEMBER)
} kv_t;

/* The prompt tokens w would prefill: those its matched blocks do not cover. */
static double uncached_tokens(const kvr_worker_snap_t *w, uint64_t prompt, size_t block_chars) {
  double matched = (double)w->matched_blocks * (double)block_chars / KVR_CHARS_PER_TOKEN;
  return (double)prompt - KVR_MIN(matched, (double)prompt);
}

/* ahead_i of the file comment: the prefill before this request's first token on w. */
static double ahead(const kvr_worker_snap_t *w, uint64_t prompt, size_t block_chars) {
  return (double)w->prefill_backlog_tokens + uncached_tokens(w, prompt, block_chars);
}

static int kv_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                   const kvr_route_req_t *req, kvr_policy_score_t *s) {
  kv_t *p = (kv_t *)base;
  uint64_t prompt = req ? req->prompt_tokens : 0;
  size_t block_chars = req ? req->block_chars : 0;

  /* A worker's decode load counts relative to its KV cache: on a mixed fleet the same tokens
   * fill a small cache sooner. Equal caches: a factor of 1. */
  double cap_sum = 0;
  size_t ncap = 0;
  for (size_t i = 0; i < n; i++)
    if (s[i].eligible && workers[i].cache_capacity_blocks > 0) {
      cap_sum += (double)workers[i].cache_capacity_blocks;
      ncap++;
    }
  double cap_mean = ncap ? cap_sum / (double)ncap : 0;

  size_t neligible = 0;
  double inflight_sum = 0;
  for (size_t i = 0; i < n; i++) {
    const kvr_worker_snap_t *w = &workers[i];
    double uncached = uncached_tokens(w, prompt, block_chars);
    double rel = cap_mean > 0 && w->cache_capacity_blocks > 0
                     ? cap_mean / (double)w->cache_capacity_blocks
                     : 1;
    double cost = p->prefill_weight * ((double)w->prefill_backlog_tokens + uncached) +
                  p->decode_weight * (double)w->active_tokens * rel +
                  p->inflight_weight * (double)w->inflight +
                  p->session_weight * (double)w->open_sessions;
    if (w->metrics_fresh)
      cost += p->waiting_weight * w->num_requests_waiting +
              p->kv_usage_weight * pow(w->kv_cache_usage, p->kv_usage_power);
    s[i].cost = cost;
    if (s[i].eligible) {
      neligible++;
      inflight_sum += w->inflight;
    }
  }
  if (neligible == 0)
    return KVR_POLICY_NONE;

  double mean = (inflight_sum + 1) / (double)neligible;
  double limit = KVR_MAX((1 + p->balance_epsilon) * mean, mean + p->balance_slack);
  size_t open = 0;
  double ahead_min = INFINITY; /* over the workers the bound leaves open */
  for (size_t i = 0; i < n; i++) {
    if (!s[i].eligible)
      continue;
    s[i].capped = (double)workers[i].inflight + 1 > limit;
    if (!s[i].capped)
      ahead_min = fmin(ahead_min, ahead(&workers[i], prompt, block_chars));
    open += !s[i].capped;
  }
  /* The prefill gate, among the workers the bound left open (the bound wins: a worker it capped
   * never keeps a request here): while one of them would start the first token within the gate,
   * those with more prefill ahead are out -- except a worker more than balance_slack below the
   * mean in flight, mirror of the bound, so a popular prefix cannot starve a worker of requests
   * (and of the chance to learn it). */
  for (size_t i = 0; i < n && p->prefill_gate_tokens > 0 && ahead_min <= p->prefill_gate_tokens;
       i++)
    if (s[i].eligible && !s[i].capped &&
        ahead(&workers[i], prompt, block_chars) > p->prefill_gate_tokens &&
        (double)workers[i].inflight >= mean - p->balance_slack) {
      s[i].capped = true;
      open--;
    }
  /* The adapter gate, among the workers the bound and the prefill gate left open (see above). */
  uint8_t ready = KVR_ADAPTER_NONE;
  for (size_t i = 0; i < n; i++)
    if (s[i].eligible && !s[i].capped && workers[i].adapter > ready)
      ready = workers[i].adapter;
  for (size_t i = 0; i < n && ready != KVR_ADAPTER_NONE && p->adapter_affinity > 0; i++)
    if (s[i].eligible && !s[i].capped && workers[i].adapter < ready &&
        (double)workers[i].inflight >= mean - p->balance_slack) {
      s[i].capped = true;
      open--;
    }
  if (open == 0) /* cannot happen (min <= mean, and the gate keeps its best), but never refuse */
    for (size_t i = 0; i < n; i++)
      s[i].capped = false;
  return kvr_policy_pick_lowest(workers, n, s, KVR_POLICY_TIES_LOAD, &p->rng);
}

KVR__POLICY_DEFINE(
    kv_aware, "lowest prefill-plus-load cost from the cache index, with bounded load (default)",
    kv_t, offsetof(kv_t, rng), KV_PARAMS, kv_pick);

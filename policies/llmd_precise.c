/* llmd_precise.c -- reference policy: llm-d's "precise prefix-cache aware routing" well-lit path,
 * on our state, with llm-d's prefix-cache affinity filter as an opt-in stage in front.
 *
 * Sources:
 *   llm-d/llm-d guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml
 *     (the EPP config the guide ships; guides/precise-prefix-cache-aware/README.md documents it as
 *     "the precise scorer's default weight is 2.0, paired 1:1 with kv-cache-utilization and queue
 *     scorers"): decode-filter, precise-prefix-cache-scorer weight 2.0,
 *     kv-cache-utilization-scorer weight 1.0, queue-scorer weight 1.0, max-score-picker.
 *   llm-d/llm-d-inference-scheduler, under pkg/epp/framework/plugins/scheduling/:
 *     scorer/preciseprefixcache/utils.go (absoluteScoredPods): prefix score = min(1, longest
 *       resident prefix in blocks / request blocks), 0 when the request has no blocks;
 *     scorer/kvcacheutilization/kvcache_utilization.go: kv score = 1 - KV-cache usage;
 *     scorer/queuedepth/queue.go: queue score = (max - q) / (max - min) over the candidates
 *       (q = waiting queue size), 1.0 when all are equal;
 *     picker/maxscore/README.md: highest weighted sum wins, ties at random (shuffle, then sort);
 *     filter/prefixcacheaffinity/plugin.go + README.md (prefix-cache-affinity-filter, defaults
 *       affinityThreshold 0.80, explorationProbability 0.01, maxTTFTPenaltyMs 5000): no-op when
 *       there is at most one candidate or the threshold is <= 0; with probability
 *       explorationProbability keep everyone; else sticky = candidates with prefix score >=
 *       threshold, none sticky -> keep everyone; if maxTTFTPenaltyMs > 0, some are not sticky and
 *       best predicted TTFT among sticky - best among the others > maxTTFTPenaltyMs -> keep
 *       everyone (stickiness broken); else keep only the sticky ones. The guide does not ship this
 *       filter; llm-d composes it at 0.80 in config/charts/epplib/templates/_config.yaml of the
 *       scheduler repo (predicted-latency profile). Hence affinity_threshold defaults to 0 (off,
 *       the guide as shipped) and {"affinity_threshold":0.8} adds it.
 *
 * llm-d, per candidate kept by the filters (higher is better):
 *   score = 2 * prefix + 1 * (1 - kv_usage) + 1 * queue_norm
 *
 * Our adaptation (tokens per block b = block_chars / KVR_CHARS_PER_TOKEN):
 *   prefix      = min(matched_blocks, nblocks) / nblocks. llm-d's index is fed by vLLM's KV events
 *                 (exact block hashes of tokenized prompts); ours is learned from routing (LRU per
 *                 worker) over character blocks, so "precise" becomes our cache index's estimate.
 *   kv_usage    = scraped kv_cache_usage when metrics_fresh, else active_tokens over the modelled
 *                 capacity (cache_capacity_blocks * b), 0 when unknown (as gie_scorer).
 *   q           = scraped num_requests_waiting when metrics_fresh, else the router's inflight.
 *   TTFT gate   = our snapshot has no TTFT predictor and no prefill rate, so predicted TTFT is
 *                 measured in tokens of prefill ahead of the request's first token:
 *                 prefill_backlog_tokens (uncached prompt tokens in flight the worker has not
 *                 prefilled yet) + this request's uncached tokens (prompt_tokens -
 * min(prompt_tokens, matched_blocks * b)); the penalty is max_ttft_penalty_tokens (default 16384,
 * our choice, not a conversion of llm-d's 5000 ms). llm-d skips the gate when no prediction exists;
 * ours always exists. decode-filter (P/D roles) is a no-op: every worker here serves both phases.
 * Candidates are the eligible workers (usable, not tried); the filter, the queue normalization and
 * the pick run over them only. Exploration and ties draw from the policy's seeded RNG, not Go's.
 *
 * State: the parameters and the RNG. Scores: cost = (sum of weights) - weighted score, lower is
 * better; capped marks an eligible worker the affinity filter dropped.
 */
#include <math.h>
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

/* The parameters: X(name, default, min, max, integer), each a double member below. */
#define LP_PARAMS(X)                                                                               \
  X(prefix_weight, 2, 0, 1e6, false)                                                               \
  X(kv_cache_weight, 1, 0, 1e6, false)                                                             \
  X(queue_weight, 1, 0, 1e6, false)                                                                \
  X(affinity_threshold, 0, 0, 1, false)                                                            \
  X(exploration_probability, 0.01, 0, 1, false)                                                    \
  X(max_ttft_penalty_tokens, 16384, 0, 1e12, false)

typedef struct lp_s {
  kvr_policy_t super;
  uint64_t rng;
  LP_PARAMS(KVR__POLICY_MEMBER)
} lp_t;

static double lp_tokens_per_block(const kvr_route_req_t *req) {
  return req && req->block_chars ? (double)req->block_chars / KVR_CHARS_PER_TOKEN : 1;
}

/* The precise scorer's absolute normalization: resident leading blocks over request blocks. */
static double lp_prefix(const kvr_worker_snap_t *w, const kvr_route_req_t *req) {
  if (req == NULL || req->nblocks == 0)
    return 0;
  return (double)KVR_MIN(w->matched_blocks, req->nblocks) / (double)req->nblocks;
}

static double lp_queue(const kvr_worker_snap_t *w) {
  return w->metrics_fresh ? w->num_requests_waiting : (double)w->inflight;
}

static double lp_kv_usage(const kvr_worker_snap_t *w, const kvr_route_req_t *req) {
  if (w->metrics_fresh)
    return w->kv_cache_usage;
  double cap_tokens = (double)w->cache_capacity_blocks * lp_tokens_per_block(req);
  if (cap_tokens <= 0)
    return 0;
  return KVR_MIN(1.0, (double)w->active_tokens / cap_tokens);
}

/* Our stand-in for predicted TTFT, in tokens (see the header). */
static double lp_ttft_tokens(const kvr_worker_snap_t *w, const kvr_route_req_t *req) {
  double prompt = req ? (double)req->prompt_tokens : 0;
  double cached = (double)w->matched_blocks * lp_tokens_per_block(req);
  return (double)w->prefill_backlog_tokens + prompt - KVR_MIN(cached, prompt);
}

/* The prefix-cache affinity filter: caps the eligible workers it drops. */
static void lp_affinity(lp_t *p, const kvr_worker_snap_t *workers, size_t n,
                        const kvr_route_req_t *req, kvr_policy_score_t *s) {
  size_t candidates = 0, sticky = 0;
  for (size_t i = 0; i < n; i++)
    candidates += s[i].eligible;
  if (candidates <= 1 || p->affinity_threshold <= 0)
    return;
  /* Exploration: Go's rand.Float64() < p, here a uniform draw in [0, 1) from the seeded RNG. */
  double u = (double)(kvr_policy_rand(&p->rng) >> 11) * 0x1.0p-53;
  if (u < p->exploration_probability)
    return;
  double best_sticky = INFINITY, best_other = INFINITY;
  for (size_t i = 0; i < n; i++) {
    if (!s[i].eligible)
      continue;
    double ttft = lp_ttft_tokens(&workers[i], req);
    if (lp_prefix(&workers[i], req) >= p->affinity_threshold) {
      sticky++;
      best_sticky = KVR_MIN(best_sticky, ttft);
    } else {
      best_other = KVR_MIN(best_other, ttft);
    }
  }
  if (sticky == 0)
    return;
  /* TTFT load gate: the sticky set is too far behind the best of the rest. */
  if (p->max_ttft_penalty_tokens > 0 && sticky < candidates &&
      best_sticky - best_other > p->max_ttft_penalty_tokens)
    return;
  for (size_t i = 0; i < n; i++)
    if (s[i].eligible && lp_prefix(&workers[i], req) < p->affinity_threshold)
      s[i].capped = true;
}

static int lp_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                   const kvr_route_req_t *req, kvr_policy_score_t *s) {
  lp_t *p = (lp_t *)base;
  lp_affinity(p, workers, n, req, s);
  /* The queue scorer normalizes over the candidates the filter kept. */
  double qmin = 0, qmax = 0;
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    if (!s[i].eligible || s[i].capped)
      continue;
    double q = lp_queue(&workers[i]);
    qmin = any ? KVR_MIN(qmin, q) : q;
    qmax = any ? KVR_MAX(qmax, q) : q;
    any = true;
  }
  double wsum = p->prefix_weight + p->kv_cache_weight + p->queue_weight;
  for (size_t i = 0; i < n; i++) {
    const kvr_worker_snap_t *w = &workers[i];
    double queue = 0;
    if (s[i].eligible) /* a dropped worker's queue is clamped into the kept range, for explain */
      queue = qmax == qmin ? 1.0 : KVR_MAX(0.0, KVR_MIN(1.0, (qmax - lp_queue(w)) / (qmax - qmin)));
    double score = p->prefix_weight * lp_prefix(w, req) +
                   p->kv_cache_weight * (1.0 - lp_kv_usage(w, req)) + p->queue_weight * queue;
    s[i].cost = wsum - score;
  }
  return kvr_policy_pick_lowest(workers, n, s, KVR_POLICY_TIES_RANDOM, &p->rng);
}

KVR__POLICY_DEFINE(llmd_precise,
                   "reference: llm-d precise prefix-cache routing (prefix 2 : kv 1 : queue 1, "
                   "optional affinity gate)",
                   lp_t, offsetof(lp_t, rng), LP_PARAMS, lp_pick);

/* gie_scorer.c -- reference policy: the weighted scorers of the Gateway API Inference Extension's
 * endpoint picker (also llm-d's inference scheduler default profile), on our state.
 *
 * Sources (kubernetes-sigs/gateway-api-inference-extension):
 *   pkg/epp/config/loader/defaults.go         default profile: queue-scorer weight 2,
 *                                             kv-cache-utilization-scorer weight 2,
 *                                             prefix-cache-scorer weight 3, max-score picker
 *   .../plugins/multi/prefix/plugin.go        prefix score = matched blocks / total blocks, blocks
 *                                             of 64 characters, at most 256 blocks considered,
 *                                             first hash seeded by the model name
 *   .../plugins/scorer/queue.go               queue score = (max - q) / (max - min) over the
 *                                             candidates, 1.0 when all are equal (q = waiting
 *                                             queue size)
 *   .../plugins/scorer/kvcache_utilization.go kv score = 1 - KV-cache utilization
 *   .../plugins/picker/max_score_picker.go    highest total wins, ties at random
 *
 * Our adaptation: the prefix match comes from our cache index (same approximate, routing-learned
 * model as GIE's LRU indexer). When a worker's scraped metrics are not fresh, its queue size falls
 * back to the router's in-flight count and its KV utilization to active_tokens over the modelled
 * capacity (0 when unknown), so the policy still works without /metrics.
 *
 * Scores: cost = (sum of weights) - weighted score, so lower is better like every other policy.
 */
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

/* The parameters: X(name, default, min, max, integer), each a double member below. */
#define GIE_PARAMS(X)                                                                              \
  X(prefix_weight, 3, 0, 1e6, false)                                                               \
  X(queue_weight, 2, 0, 1e6, false)                                                                \
  X(kv_cache_weight, 2, 0, 1e6, false)                                                             \
  X(max_prefix_blocks, 256, 1, 1e9, true)

typedef struct gie_s {
  kvr_policy_t super;
  uint64_t rng;
  GIE_PARAMS(KVR__POLICY_MEMBER)
} gie_t;

static double queue_size(const kvr_worker_snap_t *w) {
  return w->metrics_fresh ? w->num_requests_waiting : (double)w->inflight;
}

static double kv_usage(const kvr_worker_snap_t *w, size_t block_chars) {
  if (w->metrics_fresh)
    return w->kv_cache_usage;
  double cap_tokens = (double)w->cache_capacity_blocks * (double)block_chars / KVR_CHARS_PER_TOKEN;
  if (cap_tokens <= 0)
    return 0;
  return KVR_MIN(1.0, (double)w->active_tokens / cap_tokens);
}

static int gie_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                    const kvr_route_req_t *req, kvr_policy_score_t *s) {
  gie_t *p = (gie_t *)base;
  size_t max_blocks = (size_t)p->max_prefix_blocks;
  size_t total = req ? KVR_MIN(req->nblocks, max_blocks) : 0;
  size_t block_chars = req ? req->block_chars : 0;

  /* The queue scorer normalizes over the candidates, so find their min and max first. */
  double qmin = 0, qmax = 0;
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    if (!s[i].eligible)
      continue;
    double q = queue_size(&workers[i]);
    qmin = any ? KVR_MIN(qmin, q) : q;
    qmax = any ? KVR_MAX(qmax, q) : q;
    any = true;
  }
  double wsum = p->prefix_weight + p->queue_weight + p->kv_cache_weight;
  for (size_t i = 0; i < n; i++) {
    const kvr_worker_snap_t *w = &workers[i];
    double prefix = total ? (double)KVR_MIN(w->matched_blocks, total) / (double)total : 0;
    double queue = qmax == qmin ? 1.0 : (qmax - queue_size(w)) / (qmax - qmin);
    if (!s[i].eligible)
      queue = 0;
    double kv = 1.0 - kv_usage(w, block_chars);
    double score = p->prefix_weight * prefix + p->queue_weight * queue + p->kv_cache_weight * kv;
    s[i].cost = wsum - score;
  }
  return kvr_policy_pick_lowest(workers, n, s, KVR_POLICY_TIES_RANDOM, &p->rng);
}

KVR__POLICY_DEFINE(gie_scorer,
                   "reference: Gateway API Inference Extension / llm-d weighted scorers (3:2:2)",
                   gie_t, offsetof(gie_t, rng), GIE_PARAMS, gie_pick);

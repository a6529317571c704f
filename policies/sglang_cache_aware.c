/* sglang_cache_aware.c -- reference policy: SGLang router's cache_aware policy, on our state.
 *
 * Source: sgl-project/sglang sgl-router/src/policies/cache_aware.rs (algorithm) and
 * sgl-router/src/policies/mod.rs (CacheAwareConfig defaults: cache_threshold 0.5,
 * balance_abs_threshold 32, balance_rel_threshold 1.1).
 *
 * Algorithm, with load = requests in flight:
 *   1. The system is imbalanced when max_load - min_load > balance_abs_threshold AND
 *      max_load > balance_rel_threshold * min_load. Then: the least loaded worker.
 *   2. Otherwise find the worker with the longest prefix match; match rate = matched / prompt
 *      length. If rate > cache_threshold: that worker.
 *   3. Else the worker with the smallest cache tree ("most available cache capacity").
 *
 * Our adaptation: SGLang's approximate radix tree over characters is replaced by our cache index
 * (same idea: learned from routing, LRU-bounded), so match rate = matched_blocks / nblocks and tree
 * size = cached_blocks. SGLang computes min/max load over all workers; we use the eligible ones
 * (usable, not tried) so a drained worker does not force balancing mode. Ties, which SGLang leaves
 * to iteration order, go to the lowest index, except two that go to the least loaded (then lowest
 * index): the best-match tie, and the smallest-tree tie. SGLang's trees count characters and grow
 * with every request routed to them until its periodic eviction, so the worker just chosen stops
 * being the smallest and unmatched requests rotate over the workers. Our index is LRU-bounded per
 * worker: once full, every worker holds exactly its capacity and the tie would send every
 * unmatched request to worker 0, a hot spot SGLang does not have.
 *
 * Scores: cost = inflight in balancing mode; 1 - match rate when routing by match; cached_blocks
 * when routing to the smallest tree.
 */
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

/* The parameters: X(name, default, min, max, integer), each a double member below. */
#define SG_PARAMS(X)                                                                               \
  X(cache_threshold, 0.5, 0, 1, false)                                                             \
  X(balance_abs_threshold, 32, 0, 1e9, true)                                                       \
  X(balance_rel_threshold, 1.1, 0, 1e6, false)

typedef struct sg_s {
  kvr_policy_t super;
  SG_PARAMS(KVR__POLICY_MEMBER)
} sg_t;

static int sg_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                   const kvr_route_req_t *req, kvr_policy_score_t *s) {
  sg_t *p = (sg_t *)base;
  uint32_t lmin = 0, lmax = 0;
  int least = KVR_POLICY_NONE, best = KVR_POLICY_NONE, smallest = KVR_POLICY_NONE;
  for (size_t i = 0; i < n; i++) {
    const kvr_worker_snap_t *w = &workers[i];
    if (!s[i].eligible)
      continue;
    if (least == KVR_POLICY_NONE) {
      lmin = lmax = w->inflight;
      least = best = smallest = (int)i;
      continue;
    }
    lmin = KVR_MIN(lmin, w->inflight);
    lmax = KVR_MAX(lmax, w->inflight);
    if (w->inflight < workers[least].inflight)
      least = (int)i;
    const kvr_worker_snap_t *b = &workers[best];
    if (w->matched_blocks > b->matched_blocks ||
        (w->matched_blocks == b->matched_blocks && w->inflight < b->inflight))
      best = (int)i;
    const kvr_worker_snap_t *sm = &workers[smallest];
    if (w->cached_blocks < sm->cached_blocks ||
        (w->cached_blocks == sm->cached_blocks && w->inflight < sm->inflight))
      smallest = (int)i;
  }
  if (least == KVR_POLICY_NONE)
    return KVR_POLICY_NONE;

  bool imbalanced = (double)(lmax - lmin) > p->balance_abs_threshold &&
                    (double)lmax > p->balance_rel_threshold * (double)lmin;
  size_t nblocks = req ? req->nblocks : 0;
  double rate = nblocks ? (double)workers[best].matched_blocks / (double)nblocks : 0;
  bool hit = !imbalanced && rate > p->cache_threshold;
  for (size_t i = 0; i < n; i++) {
    const kvr_worker_snap_t *w = &workers[i];
    if (imbalanced)
      s[i].cost = w->inflight;
    else if (hit)
      s[i].cost = 1.0 - (double)w->matched_blocks / (double)nblocks;
    else
      s[i].cost = (double)w->cached_blocks;
  }
  if (imbalanced)
    return least;
  return hit ? best : smallest;
}

KVR__POLICY_DEFINE(sglang_cache_aware,
                   "reference: SGLang router cache_aware (balance thresholds, then longest match)",
                   sg_t, 0, SG_PARAMS, sg_pick);

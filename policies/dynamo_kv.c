/* dynamo_kv.c -- reference policy: NVIDIA Dynamo's default KV router cost, on our state.
 *
 * Sources (ai-dynamo/dynamo): lib/llm/src/kv_router/scheduler.rs, DefaultWorkerSelector::
 * select_worker (the logit and the tie-break) and softmax_sample (temperature); the per-worker
 * inputs come from ActiveSequences::potential_blocks_and_tokens in
 * lib/llm/src/kv_router/sequence.rs; defaults from KvRouterConfig::default (overlap_score_weight
 * 1.0, router_temperature 0.0); documented in docs/router/kv_cache_routing.md
 * (--kv-overlap-score-weight, --router-temperature).
 *
 * Dynamo, per worker (lower is better):
 *   prefill_tokens = (isl - overlap_blocks * block_size)       this request's uncached prompt
 *                  + active prefill tokens                      uncached prompts of in-flight
 *                                                               requests until their first token
 *   prefill_blocks = prefill_tokens / block_size                (a real number, not rounded)
 *   decode_blocks  = new_blocks(request) + active_blocks        KV blocks of in-flight sequences
 *   logit          = overlap_score_weight * prefill_blocks + decode_blocks
 * Temperature 0: the minimum logit; ties to the smaller radix tree (tree_sizes), then random.
 * Temperature T > 0: logits normalized by their range (max - min), probability of worker i
 * proportional to exp(-(logit_i / range) / T), uniform when all logits are equal.
 *
 * Our adaptation (tokens per block b = block_chars / KVR_CHARS_PER_TOKEN):
 *   prefill_blocks = (queued_prefill_tokens + prompt_tokens - min(prompt_tokens,
 *                     matched_blocks * b)) / b
 *   decode_blocks  = active_tokens / b + nblocks
 * queued_prefill_tokens is exactly Dynamo's active prefill (uncached prompt tokens dispatched and
 * not yet answered); we do not use prefill_backlog_tokens, which is our own refinement.
 * active_tokens (prompt + generated of in-flight requests) stands in for active_blocks, without
 * Dynamo's deduplication of blocks shared between in-flight sequences; to match that, the request's
 * own blocks count in full (nblocks) rather than as "blocks not already active", which we cannot
 * see. That term is the same for every worker, so it changes neither the argmin nor the softmax
 * (which is shift-invariant). The tree-size tie-break uses cached_blocks (our index's per-worker
 * size). Only eligible workers (usable, not tried) take part in the min, the range and the
 * sampling, and the RNG is the policy's seeded one, not a thread RNG.
 *
 * State: the parameters and the RNG. Scores: cost = the logit.
 */
#include <math.h>
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

/* The parameters: X(name, default, min, max, integer), each a double member below. */
#define DYN_PARAMS(X)                                                                              \
  X(overlap_score_weight, 1.0, 0, 1e6, false)                                                      \
  X(temperature, 0.0, 0, 1e6, false)

typedef struct dyn_s {
  kvr_policy_t super;
  uint64_t rng;
  DYN_PARAMS(KVR__POLICY_MEMBER)
} dyn_t;

/* Dynamo's logit for one worker, in blocks (see the header). */
static double dyn_logit(const dyn_t *p, const kvr_worker_snap_t *w, const kvr_route_req_t *req) {
  double prompt = req ? (double)req->prompt_tokens : 0;
  double b = req && req->block_chars ? (double)req->block_chars / KVR_CHARS_PER_TOKEN : 1;
  double matched = (double)w->matched_blocks * b;
  double prefill_tokens = (double)w->queued_prefill_tokens + prompt - KVR_MIN(matched, prompt);
  double decode_blocks = (double)w->active_tokens / b + (req ? (double)req->nblocks : 0);
  return p->overlap_score_weight * (prefill_tokens / b) + decode_blocks;
}

/* A worker's unnormalized softmax weight: exp(-(v / range) / T) shifted by the best (lo) so the
 * largest term is exp(0) = 1. */
static double softmax_weight(const dyn_t *p, double cost, double lo, double range) {
  return range > 0 ? exp(-((cost - lo) / range) / p->temperature) : 1.0;
}

/* Temperature > 0: softmax over the range-normalized, negated logits of the eligible workers. */
static int dyn_softmax(dyn_t *p, size_t n, const kvr_policy_score_t *s) {
  double lo = INFINITY, hi = -INFINITY;
  for (size_t i = 0; i < n; i++)
    if (s[i].eligible) {
      lo = KVR_MIN(lo, s[i].cost);
      hi = KVR_MAX(hi, s[i].cost);
    }
  if (lo > hi)
    return KVR_POLICY_NONE;
  double range = hi - lo, sum = 0;
  int last = KVR_POLICY_NONE;
  for (size_t i = 0; i < n; i++) {
    if (!s[i].eligible)
      continue;
    sum += softmax_weight(p, s[i].cost, lo, range);
    last = (int)i;
  }
  /* The weights are computed again rather than kept: the same expression of the same inputs, so
   * the same doubles, and no array sized by the fleet. */
  double u = (double)(kvr_policy_rand(&p->rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
  for (size_t i = 0; i < n; i++) {
    if (!s[i].eligible)
      continue;
    acc += softmax_weight(p, s[i].cost, lo, range);
    if (u < acc)
      return (int)i;
  }
  return last; /* rounding: u landed at the very top */
}

static int dyn_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                    const kvr_route_req_t *req, kvr_policy_score_t *s) {
  dyn_t *p = (dyn_t *)base;
  for (size_t i = 0; i < n; i++)
    s[i].cost = dyn_logit(p, &workers[i], req);
  /* Temperature 0: the lowest logit, ties to the smaller cached_blocks, then at random. */
  return p->temperature > 0
             ? dyn_softmax(p, n, s)
             : kvr_policy_pick_lowest(workers, n, s, KVR_POLICY_TIES_SMALL_CACHE, &p->rng);
}

KVR__POLICY_DEFINE(dynamo_kv,
                   "reference: NVIDIA Dynamo KV router (overlap-weighted prefill + decode blocks)",
                   dyn_t, offsetof(dyn_t, rng), DYN_PARAMS, dyn_pick);

/* round_robin.c -- the baseline: each request goes to the next usable, untried worker after the
 * previous pick, cache-blind and load-blind (Phase 0 of the workload).
 *
 * State: a cursor (the index after the last pick). Invariant: the pick is the first eligible
 * worker at or after the cursor, cyclically; so with all workers usable the sequence is
 * 0, 1, ..., n-1, 0, ... whatever the load. No parameters.
 * Scores: cost = cyclic distance from the cursor (the pick has the lowest cost).
 */
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

typedef struct rr_s {
  kvr_policy_t super;
  size_t cursor;
} rr_t;

static int rr_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                   const kvr_route_req_t *req, kvr_policy_score_t *s) {
  rr_t *p = (rr_t *)base;
  if (n == 0)
    return KVR_POLICY_NONE;
  size_t start = p->cursor % n;
  int pick = KVR_POLICY_NONE;
  for (size_t k = 0; k < n; k++) {
    size_t i = (start + k) % n;
    s[i].cost = (double)k;
    if (s[i].eligible && pick == KVR_POLICY_NONE)
      pick = (int)i;
  }
  if (pick != KVR_POLICY_NONE)
    p->cursor = (size_t)pick + 1;
  return pick;
}

KVR__POLICY_DEFINE(round_robin, "next usable worker in turn; cache- and load-blind (baseline)",
                   rr_t, 0, KVR__POLICY_NO_PARAMS, rr_pick);

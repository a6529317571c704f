/* least_load.c -- the worker with the fewest requests in flight; ties to the fewer estimated
 * active tokens, then at random (seeded). Cache-blind.
 *
 * State: the RNG for ties. No parameters.
 * Scores: cost = inflight (requests the router has outstanding on the worker).
 */
#include <stddef.h>

#include "base/kvr.h"
#include "policy.h"

typedef struct ll_s {
  kvr_policy_t super;
  uint64_t rng;
} ll_t;

static int ll_pick(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t n,
                   const kvr_route_req_t *req, kvr_policy_score_t *s) {
  for (size_t i = 0; i < n; i++)
    s[i].cost = (double)workers[i].inflight;
  return kvr_policy_pick_lowest(workers, n, s, KVR_POLICY_TIES_LOAD, &((ll_t *)base)->rng);
}

KVR__POLICY_DEFINE(least_load, "fewest requests in flight, then fewest active tokens, then random",
                   ll_t, offsetof(ll_t, rng), KVR__POLICY_NO_PARAMS, ll_pick);

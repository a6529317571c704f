/* least_load.c -- the worker with the fewest requests in flight; ties to the fewer estimated
 * active tokens, then at random (seeded). Cache-blind.
 *
 * State: the RNG for ties. No parameters.
 * Scores: cost = inflight (requests the router has outstanding on the worker).
 */
#include <stdlib.h>

#include "policy.h"
#include "src/kvr.h"

typedef struct ll_s {
  kvr_policy_t super;
  uint64_t rng;
} ll_t;

extern const kvr_policy_ops_t kvr__policy_least_load;

static kvr_policy_t *ll_create(const cJSON *params, uint64_t seed, char *err, size_t errlen) {
  if (kvr_policy_parse_params(params, NULL, 0, err, errlen))
    return NULL;
  ll_t *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return NULL;
  p->super.ops = &kvr__policy_least_load;
  p->rng = seed;
  return &p->super;
}

static int ll_select(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t nworkers,
                     const kvr_route_req_t *req, uint64_t tried, kvr_policy_score_t *scores) {
  ll_t *p = (ll_t *)base;
  kvr_policy_score_t local[KVR_MAX_WORKERS];
  kvr_policy_score_t *s = scores ? scores : local;
  size_t n = KVR_MIN(nworkers, (size_t)KVR_MAX_WORKERS);
  for (size_t i = 0; i < n; i++) {
    s[i].cost = (double)workers[i].inflight;
    s[i].eligible = kvr_policy_eligible(&workers[i], i, tried);
    s[i].capped = false;
  }
  return kvr_policy_pick_lowest(workers, n, s, true, &p->rng);
}

static void ll_params(const kvr_policy_t *p, cJSON *obj) {}

static void ll_destroy(kvr_policy_t *p) {
  free(p);
}

const kvr_policy_ops_t kvr__policy_least_load = {
    .name = "least_load",
    .description = "fewest requests in flight, then fewest active tokens, then random",
    .create = ll_create,
    .select = ll_select,
    .params = ll_params,
    .destroy = ll_destroy,
};

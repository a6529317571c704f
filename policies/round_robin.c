/* round_robin.c -- the baseline: each request goes to the next usable, untried worker after the
 * previous pick, cache-blind and load-blind (Phase 0 of the workload).
 *
 * State: a cursor (the index after the last pick). Invariant: the pick is the first eligible
 * worker at or after the cursor, cyclically; so with all workers usable the sequence is
 * 0, 1, ..., n-1, 0, ... whatever the load. No parameters.
 * Scores: cost = cyclic distance from the cursor (the pick has the lowest cost).
 */
#include <stdlib.h>

#include "policy.h"
#include "src/kvr.h"

typedef struct rr_s {
  kvr_policy_t super;
  size_t cursor;
} rr_t;

extern const kvr_policy_ops_t kvr__policy_round_robin;

static kvr_policy_t *rr_create(const cJSON *params, uint64_t seed, char *err, size_t errlen) {
  if (kvr_policy_parse_params(params, NULL, 0, err, errlen))
    return NULL;
  rr_t *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return NULL;
  p->super.ops = &kvr__policy_round_robin;
  return &p->super;
}

static int rr_select(kvr_policy_t *base, const kvr_worker_snap_t *workers, size_t nworkers,
                     const kvr_route_req_t *req, uint64_t tried, kvr_policy_score_t *scores) {
  rr_t *p = (rr_t *)base;
  size_t n = KVR_MIN(nworkers, (size_t)KVR_MAX_WORKERS);
  if (n == 0)
    return KVR_POLICY_NONE;
  size_t start = p->cursor % n;
  int pick = KVR_POLICY_NONE;
  for (size_t k = 0; k < n; k++) {
    size_t i = (start + k) % n;
    bool ok = kvr_policy_eligible(&workers[i], i, tried);
    if (scores) {
      scores[i].cost = (double)k;
      scores[i].eligible = ok;
      scores[i].capped = false;
    }
    if (ok && pick == KVR_POLICY_NONE)
      pick = (int)i;
  }
  if (pick != KVR_POLICY_NONE)
    p->cursor = (size_t)pick + 1;
  return pick;
}

static void rr_params(const kvr_policy_t *p, cJSON *obj) {}

static void rr_destroy(kvr_policy_t *p) {
  free(p);
}

const kvr_policy_ops_t kvr__policy_round_robin = {
    .name = "round_robin",
    .description = "next usable worker in turn; cache- and load-blind (baseline)",
    .create = rr_create,
    .select = rr_select,
    .params = rr_params,
    .destroy = rr_destroy,
};

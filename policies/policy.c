/* policy.c -- the static policy registry, the wrappers over the ops table, and the helpers every
 * policy shares (parameter validation, lowest-cost pick with tie-breaking).
 *
 * The registry is an explicit table in display order; each policy file defines one const ops
 * table named kvr__policy_<name> (a cross-file internal, declared here only). Adding a policy means
 * one file in policies/ and one line below.
 *
 * Parameter validation is table-driven: a policy lists its numeric parameters once, with defaults
 * and bounds, as an X-macro of kvr__policy_field_t, from which kvr__policy_new builds the
 * kvr_policy_param_t spec; kvr_policy_parse_params() rejects a non-object, unknown fields
 * (naming the valid ones), non-numbers, out-of-range and non-integral values, always as
 * "params.<field>: <reason>". The same table writes the effective values back for GET
 * /admin/policy, so what is accepted and what is shown never drift apart.
 *
 * What every policy's create, params and destroy do alike lives here too: a policy describes its
 * derived struct once (size, RNG offset, parameters with defaults and bounds) and
 * KVR__POLICY_DEFINE wires kvr__policy_new, kvr__policy_select, kvr__policy_echo and
 * kvr__policy_free into its ops table, so a policy file holds only its state and its pick.
 * kvr__policy_select owns the part of select every policy shares: a local scores array when the
 * caller passes none, and eligibility (usable, not in the tried set). Nothing here is sized by the
 * fleet's bound: a select at 1,024 workers is the same code as at 4.
 */
#include "policy.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/kvr.h"

extern const kvr_policy_ops_t kvr__policy_round_robin;
extern const kvr_policy_ops_t kvr__policy_least_load;
extern const kvr_policy_ops_t kvr__policy_kv_aware;
extern const kvr_policy_ops_t kvr__policy_gie_scorer;
extern const kvr_policy_ops_t kvr__policy_sglang_cache_aware;
extern const kvr_policy_ops_t kvr__policy_dynamo_kv;
extern const kvr_policy_ops_t kvr__policy_llmd_precise;

const kvr_policy_ops_t *const kvr_policy_registry[] = {
    &kvr__policy_round_robin,        &kvr__policy_least_load,
    &kvr__policy_kv_aware,           &kvr__policy_gie_scorer,
    &kvr__policy_sglang_cache_aware, &kvr__policy_dynamo_kv,
    &kvr__policy_llmd_precise,       NULL,
};

const kvr_policy_ops_t *kvr_policy_find(const char *name) {
  if (name == NULL)
    return NULL;
  for (size_t i = 0; kvr_policy_registry[i]; i++)
    if (strcmp(kvr_policy_registry[i]->name, name) == 0)
      return kvr_policy_registry[i];
  return NULL;
}

void kvr_policy_names(char *buf, size_t len) {
  if (len == 0)
    return;
  buf[0] = '\0';
  size_t off = 0;
  for (size_t i = 0; kvr_policy_registry[i]; i++) {
    int n = snprintf(buf + off, len - off, "%s%s", i ? ", " : "", kvr_policy_registry[i]->name);
    if (n < 0 || (size_t)n >= len - off)
      return;
    off += (size_t)n;
  }
}

void kvr_policy_print_names(FILE *out) {
  char names[256];
  kvr_policy_names(names, sizeof(names));
  fprintf(out, "\npolicies: %s\n", names);
}

kvr_policy_t *kvr_policy_create(const char *name, const cJSON *params, uint64_t seed, char *err,
                                size_t errlen) {
  const kvr_policy_ops_t *ops = kvr_policy_find(name);
  if (ops == NULL) {
    char names[256];
    kvr_policy_names(names, sizeof(names));
    snprintf(err, errlen, "unknown policy '%s' (valid: %s)", name ? name : "(null)", names);
    return NULL;
  }
  return ops->create(params, seed, err, errlen);
}

int kvr_policy_select(kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t nworkers,
                      const kvr_route_req_t *req, const kvr_workerset_t *tried,
                      kvr_policy_score_t *scores) {
  return p->ops->select(p, workers, nworkers, req, tried, scores);
}

void kvr_policy_destroy(kvr_policy_t *p) {
  if (p)
    p->ops->destroy(p);
}

const char *kvr_policy_name(const kvr_policy_t *p) {
  return p->ops->name;
}

int kvr_policy_parse_params(const cJSON *params, const kvr_policy_param_t *spec, size_t n,
                            char *err, size_t errlen) {
  if (params == NULL || cJSON_IsNull(params))
    return 0;
  if (!cJSON_IsObject(params)) {
    snprintf(err, errlen, "params: must be an object");
    return KVR_EINVAL;
  }
  const cJSON *f;
  cJSON_ArrayForEach(f, params) {
    const kvr_policy_param_t *p = NULL;
    for (size_t i = 0; i < n; i++)
      if (strcmp(spec[i].name, f->string) == 0)
        p = &spec[i];
    if (p == NULL) {
      char valid[256] = "none";
      size_t off = 0;
      for (size_t i = 0; i < n && off < sizeof(valid); i++) {
        int k = snprintf(valid + off, sizeof(valid) - off, "%s%s", i ? ", " : "", spec[i].name);
        if (k < 0)
          break;
        off += (size_t)k;
      }
      snprintf(err, errlen, "params.%s: unknown parameter (valid: %s)", f->string, valid);
      return KVR_EINVAL;
    }
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble)) {
      snprintf(err, errlen, "params.%s: must be a number", p->name);
      return KVR_EINVAL;
    }
    double v = f->valuedouble;
    if (v < p->min) {
      snprintf(err, errlen, "params.%s: must be >= %g", p->name, p->min);
      return KVR_EINVAL;
    }
    if (v > p->max) {
      snprintf(err, errlen, "params.%s: must be <= %g", p->name, p->max);
      return KVR_EINVAL;
    }
    if (p->integer && v != floor(v)) {
      snprintf(err, errlen, "params.%s: must be an integer", p->name);
      return KVR_EINVAL;
    }
  }
  /* Only assign once everything is valid, so a failed create leaves the defaults untouched. */
  cJSON_ArrayForEach(f, params) {
    for (size_t i = 0; i < n; i++)
      if (strcmp(spec[i].name, f->string) == 0)
        *spec[i].value = f->valuedouble;
  }
  return 0;
}

void kvr_policy_params_to_json(const kvr_policy_param_t *spec, size_t n, cJSON *obj) {
  for (size_t i = 0; i < n; i++)
    cJSON_AddNumberToObject(obj, spec[i].name, *spec[i].value);
}

/* Fills spec with one entry per field of cls, pointing into the instance p. */
static size_t class_spec(const kvr__policy_class_t *cls, const kvr_policy_t *p,
                         kvr_policy_param_t *spec) {
  size_t n = 0;
  for (const kvr__policy_field_t *f = cls->fields; f->name && n < KVR__POLICY_MAX_FIELDS; f++)
    spec[n++] = (kvr_policy_param_t){f->name, (double *)((char *)p + f->offset), f->min, f->max,
                                     f->integer};
  return n;
}

kvr_policy_t *kvr__policy_new(const kvr_policy_ops_t *ops, const kvr__policy_class_t *cls,
                              const cJSON *params, uint64_t seed, char *err, size_t errlen) {
  kvr_policy_t *p = kvr_xcalloc(1, cls->size);
  p->ops = ops;
  if (cls->rng_offset)
    *(uint64_t *)((char *)p + cls->rng_offset) = seed;
  kvr_policy_param_t spec[KVR__POLICY_MAX_FIELDS];
  size_t n = class_spec(cls, p, spec);
  for (size_t i = 0; i < n; i++)
    *spec[i].value = cls->fields[i].def;
  if (kvr_policy_parse_params(params, spec, n, err, errlen)) {
    free(p);
    return NULL;
  }
  return p;
}

/* Workers whose scores a select without a caller's array keeps on the stack. */
#define LOCAL_SCORES 64

int kvr__policy_select(kvr__policy_pick_fn pick, kvr_policy_t *p, const kvr_worker_snap_t *workers,
                       size_t nworkers, const kvr_route_req_t *req, const kvr_workerset_t *tried,
                       kvr_policy_score_t *scores) {
  kvr_policy_score_t local[LOCAL_SCORES];
  kvr_policy_score_t *s = scores                     ? scores
                          : nworkers <= LOCAL_SCORES ? local
                                                     : kvr_xmalloc(nworkers * sizeof *s);
  for (size_t i = 0; i < nworkers; i++) {
    s[i].eligible = kvr_policy_eligible(&workers[i], i, tried);
    s[i].capped = false;
  }
  int chosen = pick(p, workers, nworkers, req, s);
  if (s != scores && s != local)
    free(s);
  return chosen;
}

void kvr__policy_echo(const kvr__policy_class_t *cls, const kvr_policy_t *p, cJSON *obj) {
  kvr_policy_param_t spec[KVR__POLICY_MAX_FIELDS];
  kvr_policy_params_to_json(spec, class_spec(cls, p, spec), obj);
}

int kvr_policy_peek(const kvr_policy_t *p, const kvr_worker_snap_t *workers, size_t nworkers,
                    const kvr_route_req_t *req, const kvr_workerset_t *tried,
                    kvr_policy_score_t *scores) {
  kvr_policy_t *copy = kvr_xmalloc(p->ops->size);
  memcpy(copy, p, p->ops->size);
  int pick = p->ops->select(copy, workers, nworkers, req, tried, scores);
  free(copy);
  return pick;
}

void kvr__policy_free(kvr_policy_t *p) {
  free(p);
}

/* Compares a against b: -1 when a is better (lower), 1 when worse, 0 when tied. */
static int cmp_cost(double a, double b) {
  double tol = 1e-9 * KVR_MAX(1.0, KVR_MAX(fabs(a), fabs(b)));
  if (a < b - tol)
    return -1;
  if (a > b + tol)
    return 1;
  return 0;
}

/* Orders two workers whose costs tie: -1 when a goes first, 1 when b does, 0 when still tied. */
static int cmp_tie(const kvr_worker_snap_t *a, const kvr_worker_snap_t *b, kvr_policy_ties_t ties) {
  switch (ties) {
  case KVR_POLICY_TIES_LOAD:
    if (a->inflight != b->inflight)
      return a->inflight < b->inflight ? -1 : 1;
    if (a->active_tokens != b->active_tokens)
      return a->active_tokens < b->active_tokens ? -1 : 1;
    return 0;
  case KVR_POLICY_TIES_SMALL_CACHE:
    if (a->cached_blocks != b->cached_blocks)
      return a->cached_blocks < b->cached_blocks ? -1 : 1;
    return 0;
  case KVR_POLICY_TIES_RANDOM:
    break;
  }
  return 0;
}

int kvr_policy_pick_lowest(const kvr_worker_snap_t *workers, size_t nworkers,
                           const kvr_policy_score_t *scores, kvr_policy_ties_t ties,
                           uint64_t *rng) {
  int best = KVR_POLICY_NONE;
  uint64_t nties = 0;
  for (size_t i = 0; i < nworkers; i++) {
    if (!scores[i].eligible || scores[i].capped)
      continue;
    int c = 0;
    if (best != KVR_POLICY_NONE) {
      c = cmp_cost(scores[i].cost, scores[best].cost);
      if (c == 0)
        c = cmp_tie(&workers[i], &workers[best], ties);
    }
    if (c == 0 && best != KVR_POLICY_NONE && workers[i].rank != workers[best].rank)
      c = workers[i].rank > workers[best].rank ? -1 : 1; /* rendezvous: replicas agree */
    if (best == KVR_POLICY_NONE || c < 0) {
      best = (int)i;
      nties = 1;
    } else if (c == 0) {
      /* Reservoir sampling keeps each tied worker with probability 1/nties. */
      nties++;
      if (kvr_policy_rand(rng) % nties == 0)
        best = (int)i;
    }
  }
  return best;
}

/* model_fleet.c -- the model fleet's parser, vLLM's GET /v1/models of each worker, its model check.
 *
 * Flow: kvr_mfleet_parse() reads the groups one at a time (group(): the count, the model, the
 * adapters, "@dp") into workers, in order, each group's workers after the previous group's;
 * every worker gets an endpoint number (one per worker, one per "@dp" group). The virtual cluster
 * asks kvr_mfleet_models_json() for a worker's model list and kvr_mfleet_serves() for vLLM's
 * model check of a request.
 *
 * Invariants: every name is 1..KVR_MFLEET_NAME_MAX-1 bytes of [A-Za-z0-9._/-]; a worker's
 * adapters differ from each other and from its base; no adapter name is also a base model of the
 * fleet (vLLM would list both and a request could not say which it means).
 */
#include "model_fleet.h"

#include "base/kvr.h"
#include "bench/sim/sim_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_mfleet_free(kvr_mfleet_t *f) {
  if (f == NULL)
    return;
  free(f->w);
  memset(f, 0, sizeof(*f));
}

static bool name_ok(const char *s, size_t len) {
  if (len == 0 || len >= KVR_MFLEET_NAME_MAX)
    return false;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-' || c == '/'))
      return false;
  }
  return true;
}

/* One group "N*MODEL[:A+B...][@dp]" (len bytes at s) appended to f. 0 or -1 with err. */
static int group(const char *s, size_t len, size_t max_workers, kvr_mfleet_t *f, char *err,
                 size_t errlen) {
  char g[512];
  if (len == 0 || len >= sizeof(g)) {
    snprintf(err, errlen, "--model-fleet: a group is %s", len ? "too long" : "empty");
    return -1;
  }
  memcpy(g, s, len);
  g[len] = '\0';
  bool dp = len > 3 && strcmp(g + len - 3, "@dp") == 0;
  if (dp)
    g[len - 3] = '\0';
  char *end;
  unsigned long n = strtoul(g, &end, 10);
  if (end == g || *end != '*' || n < 1 || n > max_workers || f->n + n > max_workers) {
    snprintf(err, errlen,
             "--model-fleet: group '%.*s' is not N*MODEL[:ADAPTER+...][@dp] with 1 <= N and at "
             "most %zu workers in all",
             (int)len, s, max_workers);
    return -1;
  }
  char *model = end + 1, *colon = strchr(model, ':');
  size_t mlen = colon ? (size_t)(colon - model) : strlen(model);
  if (!name_ok(model, mlen)) {
    snprintf(err, errlen,
             "--model-fleet: group '%.*s': the model must be 1-%d characters of "
             "[A-Za-z0-9._/-]",
             (int)len, s, KVR_MFLEET_NAME_MAX - 1);
    return -1;
  }
  kvr_mfleet_worker_t w;
  memset(&w, 0, sizeof(w));
  memcpy(w.model, model, mlen);
  for (char *a = colon ? colon + 1 : NULL; a != NULL;) {
    char *plus = strchr(a, '+');
    size_t alen = plus ? (size_t)(plus - a) : strlen(a);
    if (!name_ok(a, alen) || w.nadapters == KVR_MFLEET_ADAPTERS_MAX) {
      snprintf(err, errlen,
               "--model-fleet: group '%.*s': adapters are 1-%d of [A-Za-z0-9._/-] each, at most "
               "%d, joined by '+'",
               (int)len, s, KVR_MFLEET_NAME_MAX - 1, KVR_MFLEET_ADAPTERS_MAX);
      return -1;
    }
    char *dst = w.adapters[w.nadapters];
    memcpy(dst, a, alen);
    dst[alen] = '\0';
    bool dup = strcmp(dst, w.model) == 0;
    for (size_t i = 0; i < w.nadapters; i++)
      dup = dup || strcmp(w.adapters[i], dst) == 0;
    if (dup) {
      snprintf(err, errlen, "--model-fleet: group '%.*s': '%s' is named twice", (int)len, s, dst);
      return -1;
    }
    w.nadapters++;
    a = plus ? plus + 1 : NULL;
  }
  f->w = kvr_xrealloc(f->w, (f->n + n) * sizeof(*f->w));
  for (unsigned long i = 0; i < n; i++) {
    kvr_mfleet_worker_t *x = &f->w[f->n + i];
    *x = w; /* adapter_ptrs are set once the array stops moving (kvr_mfleet_parse) */
    x->endpoint = (int)(dp ? f->endpoints : f->endpoints + i);
    x->dp_rank = dp ? (unsigned)i : 0;
    x->dp_size = dp ? (unsigned)n : 1;
  }
  f->n += n;
  f->endpoints += dp ? 1 : n;
  return 0;
}

/* No adapter may be named as a base model anywhere in the fleet. */
static int check_names(const kvr_mfleet_t *f, char *err, size_t errlen) {
  for (size_t i = 0; i < f->n; i++)
    for (size_t k = 0; k < f->w[i].nadapters; k++)
      for (size_t j = 0; j < f->n; j++)
        if (strcmp(f->w[i].adapters[k], f->w[j].model) == 0) {
          snprintf(err, errlen, "--model-fleet: '%s' is both a base model and an adapter",
                   f->w[j].model);
          return -1;
        }
  return 0;
}

int kvr_mfleet_parse(const char *spec, size_t max_workers, kvr_mfleet_t *f, char *err,
                     size_t errlen) {
  memset(f, 0, sizeof(*f));
  if (spec == NULL || spec[0] == '\0') {
    snprintf(err, errlen, "--model-fleet: needs N*MODEL[:ADAPTER+...][@dp] groups joined by ';'");
    return KVR_EINVAL;
  }
  for (const char *s = spec;;) {
    const char *semi = strchr(s, ';');
    size_t len = semi ? (size_t)(semi - s) : strlen(s);
    if (group(s, len, max_workers, f, err, errlen) != 0) {
      kvr_mfleet_free(f);
      return KVR_EINVAL;
    }
    if (semi == NULL)
      break;
    s = semi + 1;
  }
  if (check_names(f, err, errlen) != 0) {
    kvr_mfleet_free(f);
    return KVR_EINVAL;
  }
  for (size_t i = 0; i < f->n; i++)
    for (size_t k = 0; k < f->w[i].nadapters; k++)
      f->w[i].adapter_ptrs[k] = f->w[i].adapters[k];
  return 0;
}

void kvr_mfleet_models_json(const kvr_mfleet_t *f, size_t wi, uint32_t max_model_len,
                            long long created, kvr_buf_t *out) {
  const kvr_mfleet_worker_t *w = &f->w[wi];
  char root[KVR_MFLEET_NAME_MAX + 16];
  kvr_buf_reset(out);
  kvr_buf_puts(out, "{\"object\":\"list\",\"data\":[");
  snprintf(root, sizeof(root), "/models/%s", w->model);
  kvr_sim_model_card(out, w->model, root, NULL, max_model_len, created);
  for (size_t k = 0; k < w->nadapters; k++) {
    snprintf(root, sizeof(root), "/loras/%s", w->adapters[k]);
    kvr_buf_puts(out, ",");
    kvr_sim_model_card(out, w->adapters[k], root, w->model, 0, created);
  }
  kvr_buf_puts(out, "]}");
}

bool kvr_mfleet_serves(const kvr_mfleet_worker_t *w, const char *model, int32_t *lora) {
  *lora = -1;
  if (model == NULL || model[0] == '\0' || strcmp(model, w->model) == 0)
    return true;
  for (size_t k = 0; k < w->nadapters; k++)
    if (strcmp(model, w->adapters[k]) == 0) {
      *lora = (int32_t)k;
      return true;
    }
  return false;
}

size_t kvr_mfleet_count(const kvr_mfleet_t *f, const char *model) {
  size_t n = 0;
  int32_t lora;
  for (size_t i = 0; i < f->n; i++)
    n += model != NULL && model[0] != '\0' && kvr_mfleet_serves(&f->w[i], model, &lora);
  return n;
}

static bool same_group(const kvr_mfleet_worker_t *a, const kvr_mfleet_worker_t *b) {
  if (strcmp(a->model, b->model) != 0 || a->nadapters != b->nadapters || a->dp_size > 1 ||
      b->dp_size > 1)
    return false;
  for (size_t k = 0; k < a->nadapters; k++)
    if (strcmp(a->adapters[k], b->adapters[k]) != 0)
      return false;
  return true;
}

void kvr_mfleet_describe(const kvr_mfleet_t *f, kvr_buf_t *out) {
  for (size_t i = 0; i < f->n;) {
    const kvr_mfleet_worker_t *w = &f->w[i];
    size_t n = 1;
    if (w->dp_size > 1)
      n = w->dp_size;
    else
      while (i + n < f->n && same_group(w, &f->w[i + n]))
        n++;
    kvr_buf_printf(out, "%s%zu x %s", i ? "; " : "", n, w->model);
    for (size_t k = 0; k < w->nadapters; k++)
      kvr_buf_printf(out, "%s%s", k ? ", " : " + adapters ", w->adapters[k]);
    if (w->dp_size > 1)
      kvr_buf_printf(out, " as one DP endpoint of %u ranks", w->dp_size);
    i += n;
  }
}

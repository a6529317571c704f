/* vllm.c -- vLLM's /metrics and /v1/models formats, parsed (vllm.h).
 *
 * /metrics: each line of the Prometheus text is matched against the series the policies read
 * (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc or its older name
 * vllm:gpu_cache_usage_perc, vllm:cache_config_info's block_size and num_gpu_blocks labels) and the
 * token counters of KVR_VLLM_COUNTER_MAP; samples of one name are summed across label sets (several
 * engines behind one server), the cache usage is their mean. /v1/models: the smallest positive
 * max_model_len of the listed models.
 */
#include "proto/vllm.h"

#include "base/kvr.h"
#include "base/metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t label_u64(const char *line, const char *end, const char *label) {
  char key[64];
  snprintf(key, sizeof key, "%s=\"", label);
  const char *p = line;
  size_t klen = strlen(key);
  while (p + klen < end) {
    const char *hit = memmem(p, (size_t)(end - p), key, klen);
    if (hit == NULL)
      return 0;
    /* Must be a whole label name: preceded by '{' or ','. */
    if (hit > line && (hit[-1] == '{' || hit[-1] == ',')) {
      /* The value is read from a copy bounded by its closing quote and the line's end: the page
       * need not be NUL-terminated, and the next line is not part of the value. A value no
       * integer can hold (NaN, 1e30, negative) counts as absent. */
      const char *v = hit + klen;
      char num[32];
      size_t n = 0;
      while (v + n < end && v[n] != '"' && n < sizeof num - 1)
        n++;
      memcpy(num, v, n);
      num[n] = '\0';
      double d = strtod(num, NULL);
      return d > 0 && d <= 9007199254740992.0 ? (uint64_t)d : 0;
    }
    p = hit + klen;
  }
  return 0;
}

/* A gauge sample a worker can mean: finite and not negative (NaN, +-Inf, -1e300 are ignored, so
 * they never reach a policy's cost or the router's figures). */
static bool gauge_value(const char *p, const char *eol, double *v) {
  return kvr_metric_line_value(p, eol, v) == 0 && isfinite(*v) && *v >= 0 && *v <= 1e15;
}

/* Adds one sample line [p, eol) to *m; returns 1 when it is one of the expected load series. */
static int parse_line(const char *p, const char *eol, kvr_vllm_metrics_t *m, int *nusage) {
  double v;
  if (kvr_metric_line_is(p, eol, "vllm:num_requests_running") && gauge_value(p, eol, &v)) {
    m->num_requests_running += v;
    return 1;
  }
  if (kvr_metric_line_is(p, eol, "vllm:num_requests_waiting") && gauge_value(p, eol, &v)) {
    m->num_requests_waiting += v;
    return 1;
  }
  if ((kvr_metric_line_is(p, eol, "vllm:kv_cache_usage_perc") ||
       kvr_metric_line_is(p, eol, "vllm:gpu_cache_usage_perc")) &&
      gauge_value(p, eol, &v)) {
    m->kv_cache_usage += v > 1 ? 1 : v; /* a fraction of the cache: clamped to [0, 1] */
    (*nusage)++;
    return 1;
  }
  static const char *const counters[] = {
#define XX(name, str) str,
      KVR_VLLM_COUNTER_MAP(XX)
#undef XX
  };
  for (int i = 0; i < KVR_VLLM_NCOUNTERS; i++)
    if (kvr_metric_line_is(p, eol, counters[i]) && kvr_metric_line_value(p, eol, &v) == 0) {
      /* A counter of tokens: a value no integer holds (NaN, negative, > 2^53) is left out. */
      if (v >= 0 && v <= 9007199254740992.0) {
        m->counters.v[i] += (uint64_t)llround(v);
        m->counters.present |= 1u << i;
      }
      return 0; /* not a load series: a page of counters alone is not a vLLM load page */
    }
  if (kvr_metric_line_is(p, eol, "vllm:cache_config_info")) {
    m->num_gpu_blocks = label_u64(p, eol, "num_gpu_blocks");
    m->block_size = label_u64(p, eol, "block_size");
  }
  return 0;
}

int kvr_vllm_parse_metrics(const char *text, size_t len, uint64_t now_ms, kvr_vllm_metrics_t *out) {
  kvr_vllm_metrics_t m = {.at_ms = now_ms};
  int nusage = 0, found = 0;
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      eol = end;
    if (*p != '#' && eol > p)
      found += parse_line(p, eol, &m, &nusage);
    p = eol + 1;
  }
  if (found == 0)
    return KVR_EPARSE;
  m.kv_cache_usage = nusage ? m.kv_cache_usage / nusage : 0;
  if (m.num_gpu_blocks == 0 || m.block_size == 0)
    m.num_gpu_blocks = m.block_size = 0;
  *out = m;
  return 0;
}

bool kvr_vllm_counters_advance(kvr_vllm_counter_state_t *st, const kvr_vllm_counters_t *cur,
                               uint64_t delta[KVR_VLLM_NCOUNTERS]) {
  unsigned both = st->last.present & cur->present;
  bool reset = false;
  for (int i = 0; i < KVR_VLLM_NCOUNTERS; i++)
    if ((both >> i & 1u) && cur->v[i] < st->last.v[i])
      reset = true;
  for (int i = 0; i < KVR_VLLM_NCOUNTERS; i++) {
    delta[i] = 0;
    if (!(cur->present >> i & 1u))
      continue; /* absent from this page: keeps its last value, no increase */
    if (both >> i & 1u)
      delta[i] = reset ? cur->v[i] : cur->v[i] - st->last.v[i];
    st->sum[i] += delta[i];
    st->last.v[i] = cur->v[i];
  }
  st->last.present |= cur->present;
  if (reset)
    st->resets++;
  return reset;
}

int kvr_vllm_parse_models(const char *text, size_t len, uint64_t *max_model_len) {
  cJSON *root = cJSON_ParseWithLength(text, len);
  cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  uint64_t best = 0;
  cJSON *m;
  if (!cJSON_IsArray(data))
    data = NULL;
  cJSON_ArrayForEach(m, data) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, "max_model_len");
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble < 1e15 &&
        (best == 0 || (uint64_t)v->valuedouble < best))
      best = (uint64_t)v->valuedouble;
  }
  cJSON_Delete(root);
  if (best == 0)
    return KVR_EPARSE;
  *max_model_len = best;
  return 0;
}

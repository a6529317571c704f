/* vllm.c -- vLLM's /metrics and /v1/models formats, parsed (vllm.h).
 *
 * /metrics: each line of the Prometheus text is matched against the series the policies read
 * (vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc or its older name
 * vllm:gpu_cache_usage_perc, vllm:cache_config_info's block_size and num_gpu_blocks labels) and the
 * token counters of KVR_VLLM_COUNTER_MAP; samples of one name are summed across label sets (several
 * engines behind one server), the cache usage is their mean; or, for one data-parallel rank, only
 * the samples labelled engine="R" (kvr_vllm_parse_metrics_engine); vllm:lora_requests_info's newest
 * series (the largest value) gives the adapters running and waiting. /v1/models: the cards of the
 * listed models (at most KVR_VLLM_MODELS_MAX, each id, root, parent, max_model_len and its JSON),
 * the smallest positive max_model_len among them; and vLLM's 404 for a model it does not serve.
 */
#include "proto/vllm.h"

#include "base/kvr.h"
#include "base/metrics.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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

/* Walks the label set of the sample line [line, end) to the label named name and copies its value,
 * unescaped (\\, \", \n), into out (at most outlen - 1 bytes: a longer value sets *cut and is
 * kept up to its last whole ','-separated item). Returns false when the line has no such label or
 * its label set is malformed. */
static bool label_str(const char *line, const char *end, const char *name, char *out, size_t outlen,
                      bool *cut) {
  const char *p = memchr(line, '{', (size_t)(end - line));
  size_t nlen = strlen(name);
  if (p == NULL)
    return false;
  p++;
  while (p < end && *p != '}') {
    const char *eq = memchr(p, '=', (size_t)(end - p));
    if (eq == NULL || eq + 1 >= end || eq[1] != '"')
      return false;
    bool want = (size_t)(eq - p) == nlen && memcmp(p, name, nlen) == 0;
    size_t n = 0;
    bool over = false;
    for (p = eq + 2; p < end && *p != '"'; p++) {
      char c = *p;
      if (c == '\\' && p + 1 < end) {
        c = *++p == 'n' ? '\n' : *p;
      }
      if (want && n + 1 < outlen)
        out[n++] = c;
      else if (want)
        over = true;
    }
    if (p >= end)
      return false; /* the value never closed */
    if (want) {
      if (over) { /* keep the whole names only */
        while (n > 0 && out[n - 1] != ',')
          n--;
        n = n > 0 ? n - 1 : 0;
        *cut = true;
      }
      out[n] = '\0';
      return true;
    }
    p++; /* the closing quote */
    if (p < end && *p == ',')
      p++;
  }
  return false;
}

/* A vllm:lora_requests_info sample: kept when it is newer (larger value) than the one kept. */
static void lora_line(const char *p, const char *eol, kvr_vllm_lora_info_t *lora) {
  double v;
  if (!gauge_value(p, eol, &v) || (lora->present && v < lora->updated))
    return;
  kvr_vllm_lora_info_t l = {.present = true, .updated = v};
  if (!label_str(p, eol, "running_lora_adapters", l.running, sizeof l.running, &l.cut) ||
      !label_str(p, eol, "waiting_lora_adapters", l.waiting, sizeof l.waiting, &l.cut))
    return; /* not the series vLLM writes */
  uint64_t max = label_u64(p, eol, "max_lora");
  l.max_lora = max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
  *lora = l;
}

bool kvr_vllm_lora_list_has(const char *list, const char *name) {
  size_t n = strlen(name);
  if (n == 0)
    return false;
  for (const char *p = list; p && *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    const char *q = p;
    while (len > 0 && *q == ' ') /* "a, b" (GIE's protocol example) as vLLM's "a,b" */
      q++, len--;
    while (len > 0 && q[len - 1] == ' ')
      len--;
    if (len == n && memcmp(q, name, n) == 0)
      return true;
    if (comma == NULL)
      break;
    p = comma + 1;
  }
  return false;
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
  if (kvr_metric_line_is(p, eol, "vllm:lora_requests_info")) {
    lora_line(p, eol, &m->lora);
    return 0; /* not a load series */
  }
  if (kvr_metric_line_is(p, eol, "vllm:cache_config_info")) {
    m->num_gpu_blocks = label_u64(p, eol, "num_gpu_blocks");
    m->block_size = label_u64(p, eol, "block_size");
  }
  return 0;
}

/* The engine label of the sample line [p, eol): its value as a number 0..999 (vLLM's ranks), -2
 * for another value, -1 when the line has no engine label (the labels end at the first '}'). */
static int engine_of(const char *p, const char *eol) {
  const char *open = memchr(p, '{', (size_t)(eol - p));
  const char *close = open ? memchr(open, '}', (size_t)(eol - open)) : NULL;
  if (close == NULL)
    return -1;
  for (const char *q = open; q + 8 < close; q++) {
    if ((q[0] != '{' && q[0] != ',') || memcmp(q + 1, "engine=\"", 8) != 0)
      continue;
    const char *v = q + 9;
    int n = 0, digits = 0;
    while (v < close && *v >= '0' && *v <= '9' && digits < 3)
      n = n * 10 + (*v++ - '0'), digits++;
    return digits > 0 && v < close && *v == '"' ? n : -2;
  }
  return -1;
}

int kvr_vllm_parse_metrics(const char *text, size_t len, uint64_t now_ms, kvr_vllm_metrics_t *out) {
  return kvr_vllm_parse_metrics_engine(text, len, now_ms, -1, out);
}

int kvr_vllm_parse_metrics_engine(const char *text, size_t len, uint64_t now_ms, int engine,
                                  kvr_vllm_metrics_t *out) {
  kvr_vllm_metrics_t m = {.at_ms = now_ms};
  int nusage = 0, found = 0;
  uint64_t seen = 0; /* bit R: engine="R" on the page */
  const char *p = text, *end = text + len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (eol == NULL)
      eol = end;
    if (*p != '#' && eol > p) {
      int e = engine_of(p, eol);
      if (e >= 0 && e < 64)
        seen |= 1ull << e;
      /* vllm:lora_requests_info has no engine label: it is the server's, every rank's */
      if (engine < 0 || e == engine ||
          (e == -1 && kvr_metric_line_is(p, eol, "vllm:lora_requests_info")))
        found += parse_line(p, eol, &m, &nusage);
    }
    p = eol + 1;
  }
  m.engines = (uint32_t)__builtin_popcountll(seen);
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

/* ---- GET /v1/models ----------------------------------------------------------------------- */

/* A copy of item's string when it is one of at most KVR_VLLM_MODEL_ID_MAX bytes, else NULL. */
static char *short_string(const cJSON *item) {
  if (!cJSON_IsString(item) || strlen(item->valuestring) > KVR_VLLM_MODEL_ID_MAX)
    return NULL;
  return kvr_xstrdup(item->valuestring);
}

/* The card's JSON as the worker gave it (cJSON keeps the fields and their order), or, over
 * KVR_VLLM_MODEL_CARD_MAX bytes, the fields the router reads. */
static char *card_json(const cJSON *card, const kvr_vllm_model_t *m) {
  char *text = cJSON_PrintUnformatted(card);
  if (text == NULL)
    kvr_oom("cJSON_PrintUnformatted", 0);
  if (strlen(text) <= KVR_VLLM_MODEL_CARD_MAX)
    return text;
  free(text);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "{\"id\":");
  kvr_buf_json_str(&b, m->id, strlen(m->id));
  kvr_buf_puts(&b, ",\"object\":\"model\",\"root\":");
  if (m->root)
    kvr_buf_json_str(&b, m->root, strlen(m->root));
  else
    kvr_buf_puts(&b, "null");
  kvr_buf_puts(&b, ",\"parent\":");
  if (m->parent)
    kvr_buf_json_str(&b, m->parent, strlen(m->parent));
  else
    kvr_buf_puts(&b, "null");
  if (m->max_model_len)
    kvr_buf_printf(&b, ",\"max_model_len\":%llu}", (unsigned long long)m->max_model_len);
  else
    kvr_buf_puts(&b, ",\"max_model_len\":null}");
  return kvr_buf_steal(&b);
}

/* Adds one card of "data" to out (or marks out incomplete when it cannot be kept). */
static void take_card(const cJSON *card, kvr_vllm_models_t *out) {
  const cJSON *id = cJSON_GetObjectItemCaseSensitive(card, "id");
  if (!cJSON_IsString(id) || id->valuestring[0] == '\0')
    return; /* no model a request could name */
  if (kvr_vllm_models_find(out, id->valuestring))
    return;
  if (out->n == KVR_VLLM_MODELS_MAX || strlen(id->valuestring) > KVR_VLLM_MODEL_ID_MAX) {
    out->complete = false;
    return;
  }
  kvr_vllm_model_t *m = &out->v[out->n++];
  m->id = kvr_xstrdup(id->valuestring);
  m->hash = kvr_vllm_model_hash(m->id);
  m->root = short_string(cJSON_GetObjectItemCaseSensitive(card, "root"));
  m->parent = short_string(cJSON_GetObjectItemCaseSensitive(card, "parent"));
  const cJSON *len = cJSON_GetObjectItemCaseSensitive(card, "max_model_len");
  if (cJSON_IsNumber(len) && len->valuedouble >= 1 && len->valuedouble < 1e15)
    m->max_model_len = (uint64_t)len->valuedouble;
  if (m->max_model_len && (out->max_model_len == 0 || m->max_model_len < out->max_model_len))
    out->max_model_len = m->max_model_len;
  m->card = card_json(card, m);
}

int kvr_vllm_parse_model_list(const char *text, size_t len, kvr_vllm_models_t *out) {
  memset(out, 0, sizeof *out);
  out->complete = true;
  cJSON *root = cJSON_ParseWithLength(text, len);
  cJSON *data = cJSON_GetObjectItemCaseSensitive(root, "data");
  if (cJSON_IsArray(data)) {
    out->v = kvr_xcalloc(KVR_VLLM_MODELS_MAX, sizeof *out->v);
    const cJSON *card;
    cJSON_ArrayForEach(card, data) {
      if (cJSON_IsObject(card))
        take_card(card, out);
    }
  }
  cJSON_Delete(root);
  if (out->n == 0) {
    kvr_vllm_models_free(out);
    return KVR_EPARSE;
  }
  return 0;
}

int kvr_vllm_parse_models(const char *text, size_t len, uint64_t *max_model_len) {
  kvr_vllm_models_t m;
  if (kvr_vllm_parse_model_list(text, len, &m) != 0)
    return KVR_EPARSE;
  uint64_t best = m.max_model_len;
  kvr_vllm_models_free(&m);
  if (best == 0)
    return KVR_EPARSE;
  *max_model_len = best;
  return 0;
}

int kvr_vllm_models_add_adapter(kvr_vllm_models_t *m, const char *id, const char *root,
                                const char *parent, uint64_t created_s) {
  if (kvr_vllm_models_find(m, id))
    return 1;
  if (m->v == NULL) {
    m->v = kvr_xcalloc(KVR_VLLM_MODELS_MAX, sizeof *m->v);
    m->complete = true;
  }
  if (m->n == KVR_VLLM_MODELS_MAX || strlen(id) > KVR_VLLM_MODEL_ID_MAX ||
      (root && strlen(root) > KVR_VLLM_MODEL_ID_MAX) ||
      (parent && strlen(parent) > KVR_VLLM_MODEL_ID_MAX)) {
    m->complete = false;
    return KVR_ELIMIT;
  }
  cJSON *card = cJSON_CreateObject();
  cJSON_AddStringToObject(card, "id", id);
  cJSON_AddStringToObject(card, "object", "model");
  cJSON_AddNumberToObject(card, "created", (double)created_s);
  cJSON_AddStringToObject(card, "owned_by", "vllm");
  if (root)
    cJSON_AddStringToObject(card, "root", root);
  else
    cJSON_AddNullToObject(card, "root");
  if (parent)
    cJSON_AddStringToObject(card, "parent", parent);
  else
    cJSON_AddNullToObject(card, "parent");
  cJSON_AddNullToObject(card, "max_model_len");
  take_card(card, m);
  cJSON_Delete(card);
  return 0;
}

void kvr_vllm_models_free(kvr_vllm_models_t *m) {
  if (m == NULL)
    return;
  for (size_t i = 0; i < m->n; i++) {
    free(m->v[i].id);
    free(m->v[i].root);
    free(m->v[i].parent);
    free(m->v[i].card);
  }
  free(m->v);
  memset(m, 0, sizeof *m);
}

uint64_t kvr_vllm_model_hash(const char *model) {
  return XXH3_64bits(model, strlen(model));
}

const kvr_vllm_model_t *kvr_vllm_models_find_hash(const kvr_vllm_models_t *m, const char *model,
                                                  uint64_t hash) {
  for (size_t i = 0; model && i < m->n; i++)
    if (m->v[i].hash == hash && strcmp(m->v[i].id, model) == 0)
      return &m->v[i];
  return NULL;
}

const kvr_vllm_model_t *kvr_vllm_models_find(const kvr_vllm_models_t *m, const char *model) {
  return model ? kvr_vllm_models_find_hash(m, model, kvr_vllm_model_hash(model)) : NULL;
}

void kvr_vllm_model_not_found(kvr_buf_t *out, const char *model, bool anthropic) {
  kvr_buf_t msg = KVR_BUF_INIT;
  kvr_buf_printf(&msg, "The model `%s` does not exist.", model);
  if (anthropic) {
    kvr_buf_puts(out, "{\"type\":\"error\",\"error\":{\"type\":\"NotFoundError\",\"message\":");
    kvr_buf_json_str(out, msg.data, msg.len);
    kvr_buf_puts(out, "}}");
  } else {
    kvr_buf_puts(out, "{\"error\":{\"message\":");
    kvr_buf_json_str(out, msg.data, msg.len);
    kvr_buf_puts(out, ",\"type\":\"NotFoundError\",\"param\":\"model\",\"code\":404}}");
  }
  kvr_buf_free(&msg);
}

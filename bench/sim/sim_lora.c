/* sim_lora.c -- the simulated worker's LoRA adapter table, their --lora-modules spelling and
 * vllm:lora_requests_info (see sim_lora.h).
 *
 * Flow: --lora-modules words -> kvr_sim_lora_module_parse -> (server start) kvr_sim_loras_load;
 * POST /v1/load_lora_adapter -> kvr_sim_loras_load; POST /v1/unload_lora_adapter ->
 * kvr_sim_loras_unload. A load reads <path>/adapter_config.json (read_rank) before anything is
 * changed, so a failed load leaves the table as it was. names[] mirrors v[].name after every
 * change (the server's kvr_sim_models_t points at it).
 */
#include "sim_lora.h"

#include "base/kvr.h"
#include "base/metrics.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_MAX (1u << 20) /* adapter_config.json is read whole, up to 1 MiB */
#define SERIES_MAX 1024

bool kvr_sim_lora_rank_allowed(uint32_t rank) {
  static const uint32_t ranks[] = {1, 8, 16, 32, 64, 128, 256, 320, 512};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(ranks); i++) {
    if (ranks[i] == rank)
      return true;
  }
  return false;
}

/* ---- --lora-modules ---- */

static const char *json_string(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

int kvr_sim_lora_module_parse(const char *text, kvr_sim_lora_module_t *out, char *err,
                              size_t errlen) {
  memset(out, 0, sizeof(*out));
  const char *eq = strchr(text, '=');
  if (eq != NULL && strchr(text, ',') == NULL) {
    if (strchr(eq + 1, '=') != NULL || eq == text || eq[1] == '\0') {
      snprintf(err, errlen, "'%s' is not name=path", text);
      return KVR_EINVAL;
    }
    char *name = kvr_xmalloc((size_t)(eq - text) + 1);
    memcpy(name, text, (size_t)(eq - text));
    name[eq - text] = '\0';
    out->name = name;
    out->path = kvr_xstrdup(eq + 1);
    return 0;
  }
  cJSON *o = cJSON_Parse(text);
  if (o == NULL) {
    snprintf(err, errlen, "Invalid JSON format for --lora-modules: %s", text);
    return KVR_EINVAL;
  }
  const char *name = json_string(o, "name"), *path = json_string(o, "path");
  const cJSON *base = cJSON_GetObjectItemCaseSensitive(o, "base_model_name");
  bool base_ok = base == NULL || cJSON_IsNull(base) || cJSON_IsString(base);
  const cJSON *k;
  bool known = cJSON_IsObject(o);
  cJSON_ArrayForEach(k, o) {
    if (k->string == NULL || (strcmp(k->string, "name") != 0 && strcmp(k->string, "path") != 0 &&
                              strcmp(k->string, "base_model_name") != 0))
      known = false;
  }
  if (name == NULL || path == NULL || !base_ok || !known) {
    snprintf(err, errlen,
             "Invalid fields for --lora-modules: %s (a JSON object with the strings \"name\" and "
             "\"path\" and an optional \"base_model_name\")",
             text);
    cJSON_Delete(o);
    return KVR_EINVAL;
  }
  out->name = kvr_xstrdup(name);
  out->path = kvr_xstrdup(path);
  out->base_model_name = cJSON_IsString(base) ? kvr_xstrdup(base->valuestring) : NULL;
  cJSON_Delete(o);
  return 0;
}

void kvr_sim_lora_module_free(kvr_sim_lora_module_t *m) {
  free((char *)m->name);
  free((char *)m->path);
  free((char *)m->base_model_name);
  memset(m, 0, sizeof(*m));
}

/* ---- the table ---- */

void kvr_sim_loras_init(kvr_sim_loras_t *t, uint32_t max_lora_rank) {
  memset(t, 0, sizeof(*t));
  t->max_lora_rank = max_lora_rank;
}

static void lora_free(kvr_sim_lora_t *l) {
  free(l->name);
  free(l->path);
  free(l->base);
}

void kvr_sim_loras_free(kvr_sim_loras_t *t) {
  for (size_t i = 0; i < t->n; i++)
    lora_free(&t->v[i]);
  for (size_t i = 0; i < t->nseries; i++)
    free(t->series[i].labels);
  free(t->v);
  free(t->names);
  free(t->series);
  memset(t, 0, sizeof(*t));
}

static void names_sync(kvr_sim_loras_t *t) {
  t->names = kvr_xrealloc(t->names, (t->n + 1) * sizeof(*t->names));
  for (size_t i = 0; i < t->n; i++)
    t->names[i] = t->v[i].name;
}

kvr_sim_lora_t *kvr_sim_loras_find(const kvr_sim_loras_t *t, const char *name) {
  for (size_t i = 0; i < t->n; i++) {
    if (strcmp(t->v[i].name, name) == 0)
      return &t->v[i];
  }
  return NULL;
}

/* PEFTHelper.from_local_dir: <path>/adapter_config.json and its "r". 0, 404 (no such file: vLLM's
 * LoRAAdapterNotFoundError) or 500 (unreadable, or a rank above max_lora_rank: validate_legal). */
static int read_rank(const kvr_sim_loras_t *t, const char *name, const char *path, uint32_t *rank,
                     kvr_sim_err_t *e) {
  char file[4096];
  snprintf(file, sizeof(file), "%s/adapter_config.json", path);
  FILE *f = fopen(file, "rb");
  if (f == NULL)
    return kvr_sim_err(e, 404, KVR_SIM_ERR_NOT_FOUND, NULL,
                       "Loading lora %.200s failed: No adapter found for %.200s", name, path);
  char *buf = kvr_xmalloc(CONFIG_MAX + 1);
  size_t n = fread(buf, 1, CONFIG_MAX, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *cfg = cJSON_Parse(buf);
  free(buf);
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(cfg, "r");
  int rc = 0;
  if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536 ||
      r->valuedouble != floor(r->valuedouble))
    rc = kvr_sim_err(e, 500, "InternalServerError", NULL,
                     "%.300s: not a PEFT adapter config (an integer \"r\" >= 1 is needed)", file);
  else if ((uint32_t)r->valuedouble > t->max_lora_rank)
    rc = kvr_sim_err(e, 500, "InternalServerError", NULL,
                     "LoRA rank %u is greater than max_lora_rank %u.", (uint32_t)r->valuedouble,
                     t->max_lora_rank);
  else
    *rank = (uint32_t)r->valuedouble;
  cJSON_Delete(cfg);
  return rc;
}

int kvr_sim_loras_load(kvr_sim_loras_t *t, const char *name, const char *path,
                       const char *base_model_name, bool inplace, const char *const *base_names,
                       size_t nbase, kvr_sim_lora_t **out, kvr_sim_err_t *e) {
  if (name == NULL || name[0] == '\0' || path == NULL || path[0] == '\0')
    return kvr_sim_err(e, 400, "InvalidUserInput", NULL,
                       "Both 'lora_name' and 'lora_path' must be provided.");
  kvr_sim_lora_t *l = kvr_sim_loras_find(t, name);
  if (l != NULL && !inplace)
    return kvr_sim_err(e, 400, "InvalidUserInput", NULL,
                       "The lora adapter '%.200s' has already been loaded. If you want to load "
                       "the adapter in place, set 'load_inplace' to True.",
                       name);
  uint32_t rank = 0;
  int rc = read_rank(t, name, path, &rank, e);
  if (rc != 0)
    return rc;
  if (l == NULL) {
    KVR_GROW(t->v, t->n, t->cap, 1);
    l = &t->v[t->n++];
    memset(l, 0, sizeof(*l));
    l->name = kvr_xstrdup(name);
    l->id = ++t->last_id;
    names_sync(t);
  }
  free(l->path);
  free(l->base);
  l->path = kvr_xstrdup(path);
  l->base = NULL;
  for (size_t i = 0; base_model_name != NULL && i < nbase; i++) {
    if (strcmp(base_names[i], base_model_name) == 0)
      l->base = kvr_xstrdup(base_model_name);
  }
  l->rank = rank;
  *out = l;
  return 0;
}

int kvr_sim_loras_unload(kvr_sim_loras_t *t, const char *name, uint32_t *id, kvr_sim_err_t *e) {
  if (name == NULL || name[0] == '\0')
    return kvr_sim_err(e, 400, "InvalidUserInput", NULL,
                       "'lora_name' needs to be provided to unload a LoRA adapter.");
  kvr_sim_lora_t *l = kvr_sim_loras_find(t, name);
  if (l == NULL)
    return kvr_sim_err(e, 404, KVR_SIM_ERR_NOT_FOUND, NULL,
                       "The lora adapter '%.200s' cannot be found.", name);
  *id = l->id;
  lora_free(l);
  size_t i = (size_t)(l - t->v);
  memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof(*t->v));
  t->n--;
  names_sync(t);
  return 0;
}

/* ---- vllm:lora_requests_info ---- */

void kvr_sim_loras_info_set(kvr_sim_loras_t *t, uint32_t max_lora, const char *waiting,
                            const char *running, double now) {
  kvr_buf_t l = KVR_BUF_INIT;
  kvr_buf_printf(&l, "max_lora=\"%u\",waiting_lora_adapters=\"", max_lora);
  kvr_metric_escape(&l, waiting);
  kvr_buf_puts(&l, "\",running_lora_adapters=\"");
  kvr_metric_escape(&l, running);
  kvr_buf_puts(&l, "\"");
  for (size_t i = 0; i < t->nseries; i++) {
    if (strcmp(t->series[i].labels, l.data) == 0) {
      t->series[i].value = now;
      kvr_buf_free(&l);
      return;
    }
  }
  if (t->nseries == SERIES_MAX) { /* drop the series updated longest ago */
    size_t old = 0;
    for (size_t i = 1; i < t->nseries; i++) {
      if (t->series[i].value < t->series[old].value)
        old = i;
    }
    free(t->series[old].labels);
    memmove(&t->series[old], &t->series[old + 1], (t->nseries - old - 1) * sizeof(*t->series));
    t->nseries--;
  }
  KVR_GROW(t->series, t->nseries, t->series_cap, 1);
  t->series[t->nseries].labels = kvr_xstrdup(l.data);
  t->series[t->nseries++].value = now;
  kvr_buf_free(&l);
}

void kvr_sim_loras_info_write(kvr_buf_t *b, const kvr_sim_loras_t *t) {
  kvr_metric_family(b, "vllm:lora_requests_info", "gauge", "Running stats on lora requests.");
  /* written here with every digit: kvr_metric_sample's short form would round a Unix time to
   * tens of seconds (prometheus_client writes the float's repr) */
  for (size_t i = 0; i < t->nseries; i++)
    kvr_buf_printf(b, "vllm:lora_requests_info{%s} %.17g\n", t->series[i].labels,
                   t->series[i].value);
}

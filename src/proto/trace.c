/* trace.c -- one line of a prefix-hashed request trace, read and written (trace.h).
 *
 * Reading goes through cJSON (the whole line is one small object) and then checks each field's
 * type and range, so that a malformed file is refused line by line with the reason, never half
 * read. Writing is a printf of the four fields: the ids are already small integers.
 */
#include "proto/trace.h"

#include "base/kvr.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_trace_rec_free(kvr_trace_rec_t *rec) {
  if (rec == NULL)
    return;
  free(rec->hash_ids);
  rec->hash_ids = NULL;
  rec->nhash = 0;
}

/* A non-negative integer a double holds exactly. */
static bool count_ok(const cJSON *v) {
  return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= KVR_TRACE_INT_MAX &&
         v->valuedouble == floor(v->valuedouble);
}

/* The member name of obj as a count into *out; 0 or KVR_EINVAL with err set. */
static int field_count(const cJSON *obj, const char *name, uint64_t *out, char *err,
                       size_t errlen) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  if (v == NULL) {
    snprintf(err, errlen, "missing field '%s'", name);
    return KVR_EINVAL;
  }
  if (!count_ok(v)) {
    snprintf(err, errlen, "'%s' must be a non-negative integer", name);
    return KVR_EINVAL;
  }
  *out = (uint64_t)v->valuedouble;
  return 0;
}

static int parse_ids(const cJSON *obj, kvr_trace_rec_t *out, char *err, size_t errlen) {
  const cJSON *ids = cJSON_GetObjectItemCaseSensitive(obj, "hash_ids");
  if (ids == NULL) {
    snprintf(err, errlen, "missing field 'hash_ids'");
    return KVR_EINVAL;
  }
  if (!cJSON_IsArray(ids)) {
    snprintf(err, errlen, "'hash_ids' must be an array of non-negative integers");
    return KVR_EINVAL;
  }
  size_t n = (size_t)cJSON_GetArraySize(ids), i = 0;
  out->hash_ids = kvr_xmalloc((n ? n : 1) * sizeof *out->hash_ids);
  const cJSON *v;
  cJSON_ArrayForEach(v, ids) {
    if (!count_ok(v)) {
      snprintf(err, errlen, "'hash_ids[%zu]' must be a non-negative integer", i);
      kvr_trace_rec_free(out);
      return KVR_EINVAL;
    }
    out->hash_ids[i++] = (uint64_t)v->valuedouble;
  }
  out->nhash = i;
  return 0;
}

int kvr_trace_parse(const char *line, size_t len, kvr_trace_rec_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  size_t i = 0;
  while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))
    i++;
  if (i == len)
    return KVR_ENOENT;
  const char *end = NULL;
  cJSON *obj = cJSON_ParseWithLengthOpts(line, len, &end, false);
  while (obj && end < line + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
    end++;
  if (!cJSON_IsObject(obj) || end != line + len) {
    snprintf(err, errlen, "not a JSON object");
    cJSON_Delete(obj);
    return KVR_EINVAL;
  }
  const cJSON *ts = cJSON_GetObjectItemCaseSensitive(obj, "timestamp");
  int rc = 0;
  if (ts == NULL) {
    snprintf(err, errlen, "missing field 'timestamp'");
    rc = KVR_EINVAL;
  } else if (!cJSON_IsNumber(ts) || !(ts->valuedouble >= 0) ||
             ts->valuedouble > KVR_TRACE_INT_MAX) {
    snprintf(err, errlen, "'timestamp' must be a non-negative number of milliseconds");
    rc = KVR_EINVAL;
  }
  if (rc == 0) {
    out->timestamp_ms = ts->valuedouble;
    rc = field_count(obj, "input_length", &out->input_length, err, errlen);
  }
  if (rc == 0)
    rc = field_count(obj, "output_length", &out->output_length, err, errlen);
  if (rc == 0)
    rc = parse_ids(obj, out, err, errlen);
  const cJSON *src = cJSON_GetObjectItemCaseSensitive(obj, "tokens_source");
  if (rc == 0 && cJSON_IsString(src))
    out->tokens = strcmp(src->valuestring, "usage") == 0      ? KVR_TRACE_TOKENS_USAGE
                  : strcmp(src->valuestring, "estimate") == 0 ? KVR_TRACE_TOKENS_ESTIMATE
                                                              : KVR_TRACE_TOKENS_UNSTATED;
  cJSON_Delete(obj);
  return rc;
}

void kvr_trace_format(kvr_buf_t *out, const kvr_trace_rec_t *rec) {
  kvr_buf_printf(out,
                 "{\"timestamp\": %llu, \"input_length\": %llu, \"output_length\": %llu, "
                 "\"hash_ids\": [",
                 (unsigned long long)floor(rec->timestamp_ms),
                 (unsigned long long)rec->input_length, (unsigned long long)rec->output_length);
  for (size_t i = 0; i < rec->nhash; i++)
    kvr_buf_printf(out, i ? ", %llu" : "%llu", (unsigned long long)rec->hash_ids[i]);
  kvr_buf_puts(out, "]");
  if (rec->tokens != KVR_TRACE_TOKENS_UNSTATED)
    kvr_buf_printf(out, ", \"tokens_source\": \"%s\"",
                   rec->tokens == KVR_TRACE_TOKENS_USAGE ? "usage" : "estimate");
  kvr_buf_puts(out, "}\n");
}

/* sim_api.c -- vLLM's error bodies for the simulated worker's API front-ends (see sim_api.h).
 *
 * Owns nothing: a kvr_sim_err_t is a value, the writers append to the caller's buffer.
 */
#include "sim_api.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

int kvr_sim_err(kvr_sim_err_t *e, int status, const char *type, const char *param, const char *fmt,
                ...) {
  e->status = status;
  e->type = type;
  snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof(e->message), fmt, ap);
  va_end(ap);
  return status;
}

int kvr_sim_err_kind(kvr_sim_err_t *e, int status, const char *type, const char *param) {
  e->status = status;
  e->type = type;
  snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
  return status;
}

/* pydantic's loc tuple of a dotted path: "messages.0.role" -> ('body', 'messages', 0, 'role');
 * NULL -> ('body',). */
static void loc_tuple(const char *field, char *out, size_t cap) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "('body'");
  for (const char *p = field; p != NULL && *p != '\0';) {
    size_t n = strcspn(p, ".");
    bool index = n > 0 && strspn(p, "0123456789") >= n;
    kvr_buf_printf(&b, index ? ", %.*s" : ", '%.*s'", (int)n, p);
    p += n + (p[n] == '.');
  }
  kvr_buf_puts(&b, field == NULL ? ",)" : ")");
  snprintf(out, cap, "%s", b.data);
  kvr_buf_free(&b);
}

int kvr_sim_err_validation(kvr_sim_err_t *e, const char *field, const char *param, const char *kind,
                           const char *msg) {
  /* pydantic's loc is a tuple: ('body', 'max_tokens'), or ('body',) for a model validator */
  char loc[160], dotted[80];
  loc_tuple(field, loc, sizeof(loc));
  if (field != NULL)
    snprintf(dotted, sizeof(dotted), "body.%.60s", field);
  return kvr_sim_err(e, 400, KVR_SIM_ERR_VALIDATION,
                     param   ? param
                     : field ? dotted
                             : NULL,
                     "1 validation error:\n  {'type': '%s', 'loc': %s, 'msg': '%s'}", kind, loc,
                     msg);
}

void kvr_sim_json_str(kvr_buf_t *b, const char *s) {
  kvr_buf_json_str(b, s, strlen(s));
}

void kvr_sim_err_openai_json(kvr_buf_t *b, const kvr_sim_err_t *e) {
  kvr_buf_puts(b, "{\"error\":{\"message\":");
  kvr_sim_json_str(b, e->message);
  kvr_buf_puts(b, ",\"type\":");
  kvr_sim_json_str(b, e->type);
  kvr_buf_puts(b, ",\"param\":");
  if (e->param[0] != '\0')
    kvr_sim_json_str(b, e->param);
  else
    kvr_buf_puts(b, "null");
  kvr_buf_printf(b, ",\"code\":%d}}", e->status);
}

void kvr_sim_err_anthropic_json(kvr_buf_t *b, const kvr_sim_err_t *e) {
  kvr_buf_puts(b, "{\"type\":\"error\",\"error\":{\"type\":");
  kvr_sim_json_str(b, e->type);
  kvr_buf_puts(b, ",\"message\":");
  kvr_sim_json_str(b, e->message);
  kvr_buf_puts(b, "}}");
}

void kvr_sim_model_card(kvr_buf_t *b, const char *id, const char *root, const char *parent,
                        uint32_t max_len, long long created) {
  kvr_buf_puts(b, "{\"id\":");
  kvr_buf_json_str(b, id, strlen(id));
  kvr_buf_printf(b,
                 ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"vllm\",\"root\":", created);
  kvr_buf_json_str(b, root, strlen(root));
  kvr_buf_puts(b, ",\"parent\":");
  if (parent != NULL)
    kvr_buf_json_str(b, parent, strlen(parent));
  else
    kvr_buf_puts(b, "null");
  if (max_len > 0)
    kvr_buf_printf(b, ",\"max_model_len\":%u", max_len);
  else
    kvr_buf_puts(b, ",\"max_model_len\":null");
  kvr_buf_printf(b,
                 ",\"permission\":[{\"id\":\"modelperm-sim\",\"object\":\"model_permission\","
                 "\"created\":%lld,\"allow_create_engine\":false,\"allow_sampling\":true,"
                 "\"allow_logprobs\":true,\"allow_search_indices\":false,\"allow_view\":true,"
                 "\"allow_fine_tuning\":false,\"organization\":\"*\",\"group\":null,"
                 "\"is_blocking\":false}]}",
                 created);
}

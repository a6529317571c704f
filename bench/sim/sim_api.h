/* sim_api.h -- what the simulated worker's API front-ends share: vLLM's error bodies.
 *
 * vLLM answers every error of its OpenAI-style routes as {"error": {"message", "type", "param",
 * "code"}} with code the HTTP status as a number (vllm/entrypoints/openai/engine/protocol.py
 * ErrorResponse/ErrorInfo), and the Anthropic routes as {"type": "error", "error": {"type",
 * "message"}} (vllm/entrypoints/anthropic/api_router.py translate_error_response). Which "type"
 * a cause gets (../shared/VLLM-APIS.md section 5):
 *
 *   a request body pydantic rejects (a missing field, a wrong type, a model validator)
 *                                  400 "Bad Request" (the HTTP phrase; server_utils.py
 *                                      validation_exception_handler), param: the field
 *   a serving-layer ValueError     400 "BadRequestError"
 *   Responses' own checks          400/404 "invalid_request_error" (serving.py
 * create_error_response with err_type) an unknown model               404 "NotFoundError", param
 * "model"
 *
 * Pure: a kvr_sim_err_t is filled by the request readers and rendered by the server.
 */
#ifndef KVR_SIM_API_H
#define KVR_SIM_API_H

#include "base/buf.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_SIM_ERR_VALIDATION "Bad Request"
#define KVR_SIM_ERR_BAD_REQUEST "BadRequestError"
#define KVR_SIM_ERR_INVALID "invalid_request_error"
#define KVR_SIM_ERR_NOT_FOUND "NotFoundError"

/* One error as vLLM would answer it. type points to a static string; param "" is JSON null. */
typedef struct kvr_sim_err_s {
  int status;
  const char *type;
  char param[64];
  char message[512];
} kvr_sim_err_t;

/* Sets e and returns status (so readers can `return kvr_sim_err(...)`); param may be NULL. */
int kvr_sim_err(kvr_sim_err_t *e, int status, const char *type, const char *param, const char *fmt,
                ...) __attribute__((format(printf, 5, 6)));

/* Sets e's status, type and param, keeping the message already in e->message; returns status. */
int kvr_sim_err_kind(kvr_sim_err_t *e, int status, const char *type, const char *param);

/* A pydantic body-validation error as vLLM's validation_exception_handler words it: 400 "Bad
 * Request", the message "1 validation error:\n  {'type': <kind>, 'loc': ('body', <field>), 'msg':
 * <msg>}" and param "body.<field>" (field NULL: a model validator, loc ('body',), param NULL, or
 * the parameter a VLLMValidationError names when param is given). */
int kvr_sim_err_validation(kvr_sim_err_t *e, const char *field, const char *param, const char *kind,
                           const char *msg);

/* Appends {"error":{"message","type","param","code"}} (code: the status). */
void kvr_sim_err_openai_json(kvr_buf_t *b, const kvr_sim_err_t *e);

/* Appends {"type":"error","error":{"type","message"}}. */
void kvr_sim_err_anthropic_json(kvr_buf_t *b, const kvr_sim_err_t *e);

/* Appends a JSON string of the NUL-terminated s (kvr_buf_json_str). */
void kvr_sim_json_str(kvr_buf_t *b, const char *s);

/* Appends one card of GET /v1/models (vLLM's ModelCard, vllm/entrypoints/openai/engine/protocol.py:
 * every field, nulls written) to b: parent NULL is null, max_len 0 is null (an adapter's card). The
 * simulated worker's list and the virtual cluster's (bench/vcluster/model_fleet.c) both write it.
 */
void kvr_sim_model_card(kvr_buf_t *b, const char *id, const char *root, const char *parent,
                        uint32_t max_len, long long created);

#endif

/* admin.c -- the admin API handlers (see admin.h for the routes).
 *
 * Every handler answers synchronously from the router's state: nothing here waits on a worker, so
 * the admin listener stays responsive while the public one is saturated. Policy switches replace the
 * router's policy object whole (router.c); requests already routed keep their worker.
 */
#include "admin.h"

#include "kvr.h"
#include "log.h"
#include "proxy.h"

#include <llhttp.h>
#include <stdlib.h>
#include <string.h>

static void send_json(kvr_http_req_t *req, int status, cJSON *obj) {
  char *text = cJSON_PrintUnformatted(obj);
  cJSON_Delete(obj);
  if (text == NULL) {
    kvr_http_error(req, 500, NULL, "internal", "%s", "cannot render JSON");
    return;
  }
  size_t n = strlen(text);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_append(&b, text, n);
  kvr_buf_puts(&b, "\n");
  free(text);
  kvr_http_respond(req, status, "application/json", NULL, b.data, b.len);
  kvr_buf_free(&b);
}

static cJSON *parse_body(kvr_http_req_t *req) {
  cJSON *body = req->body.len ? cJSON_ParseWithLength(req->body.data, req->body.len) : NULL;
  if (body == NULL || !cJSON_IsObject(body)) {
    cJSON_Delete(body);
    kvr_http_error(req, 400, NULL, "invalid_json", "%s", "the request body must be a JSON object");
    return NULL;
  }
  return body;
}

static cJSON *worker_json(kvr_router_t *r, const kvr_worker_t *w) {
  cJSON *all = kvr_router_workers_json(r);
  cJSON *found = NULL;
  for (cJSON *it = all->child; it; it = it->next) {
    cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
    if (cJSON_IsNumber(id) && (uint32_t)id->valuedouble == w->id) {
      found = cJSON_DetachItemViaPointer(all, it);
      break;
    }
  }
  cJSON_Delete(all);
  return found ? found : cJSON_CreateObject();
}

static void workers_post(kvr_router_t *r, kvr_http_req_t *req) {
  cJSON *body = parse_body(req);
  if (body == NULL)
    return;
  const cJSON *url = cJSON_GetObjectItemCaseSensitive(body, "url");
  if (!cJSON_IsString(url)) {
    cJSON_Delete(body);
    kvr_http_error(req, 400, NULL, "missing_required_parameter", "%s",
                   "url: required, a worker base URL like http://127.0.0.1:9001");
    return;
  }
  char err[256];
  kvr_worker_t *w = kvr_router_add_worker(r, url->valuestring, err, sizeof err);
  cJSON_Delete(body);
  if (w == NULL) {
    kvr_http_error(req, 400, NULL, "invalid_value", "url: %s", err);
    return;
  }
  send_json(req, 201, worker_json(r, w));
}

static void workers_delete(kvr_router_t *r, kvr_http_req_t *req, const char *idtext) {
  char *end;
  unsigned long id = strtoul(idtext, &end, 10);
  kvr_worker_t *w = (*idtext && *end == '\0') ? kvr_router_worker_by_id(r, (uint32_t)id) : NULL;
  if (w == NULL) {
    kvr_http_error(req, 404, NULL, "worker_not_found", "no worker with id '%s'", idtext);
    return;
  }
  cJSON *o = worker_json(r, w);
  cJSON_ReplaceItemInObjectCaseSensitive(o, "state", cJSON_CreateString("draining"));
  kvr_router_drain_worker(r, w); /* may free w when nothing is in flight */
  send_json(req, 202, o);
}

static void policy_put(kvr_router_t *r, kvr_http_req_t *req) {
  cJSON *body = parse_body(req);
  if (body == NULL)
    return;
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(body, "policy");
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(body, "params");
  char names[256];
  kvr_policy_names(names, sizeof names);
  for (const cJSON *it = body->child; it; it = it->next) {
    if (strcmp(it->string, "policy") != 0 && strcmp(it->string, "params") != 0) {
      kvr_http_error(req, 400, NULL, "unknown_parameter",
                     "%s: unknown field (expected \"policy\" and \"params\")", it->string);
      cJSON_Delete(body);
      return;
    }
  }
  if (name != NULL && !cJSON_IsString(name)) {
    kvr_http_error(req, 400, NULL, "invalid_type", "policy: must be a string, one of: %s", names);
    cJSON_Delete(body);
    return;
  }
  if (params != NULL && !cJSON_IsObject(params) && !cJSON_IsNull(params)) {
    kvr_http_error(req, 400, NULL, "invalid_type", "%s", "params: must be an object");
    cJSON_Delete(body);
    return;
  }
  if (name == NULL && params == NULL) {
    kvr_http_error(req, 400, NULL, "missing_required_parameter",
                   "policy: required, one of: %s", names);
    cJSON_Delete(body);
    return;
  }
  const char *pname = name ? name->valuestring : kvr_policy_name(r->policy);
  char err[512];
  if (kvr_router_set_policy(r, pname, cJSON_IsObject(params) ? params : NULL, err, sizeof err) !=
      0) {
    kvr_http_error(req, 400, NULL, "invalid_value", "%s", err);
    cJSON_Delete(body);
    return;
  }
  cJSON_Delete(body);
  send_json(req, 200, kvr_router_policy_json(r));
}

static void explain(kvr_router_t *r, kvr_http_req_t *req) {
  /* Which endpoint the body is for: ?endpoint=completions, else by the presence of "prompt". */
  kvr_route_t route = KVR_ROUTE_CHAT;
  if (strstr(req->query, "endpoint=completions"))
    route = KVR_ROUTE_COMPLETIONS;
  else if (req->body.len && memmem(req->body.data, req->body.len, "\"prompt\"", 8) &&
           !memmem(req->body.data, req->body.len, "\"messages\"", 10))
    route = KVR_ROUTE_COMPLETIONS;
  kvr_prompt_t prompt;
  char err[256];
  const char *code = NULL;
  if (kvr__proxy_features(r, req, route, &prompt, err, sizeof err, &code) != 0) {
    kvr_http_error(req, 400, "invalid_request_error", code, "%s", err);
    return;
  }
  kvr_route_req_t rr;
  kvr_prompt_route_req(&prompt, &rr);
  kvr_decision_t *d = malloc(sizeof *d);
  if (d == NULL) {
    kvr_prompt_free(&prompt);
    kvr_http_error(req, 500, NULL, "internal", "%s", "out of memory");
    return;
  }
  int chosen = kvr_router_decide(r, &rr, 0, false, d);
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "policy", kvr_policy_name(r->policy));
  cJSON_AddStringToObject(o, "model", prompt.model ? prompt.model : "");
  cJSON_AddNumberToObject(o, "prompt_chars", (double)prompt.text.len);
  cJSON_AddNumberToObject(o, "prompt_tokens_estimate", (double)prompt.prompt_tokens);
  cJSON_AddNumberToObject(o, "blocks", (double)prompt.nblocks);
  cJSON_AddNumberToObject(o, "block_chars", (double)r->cfg->block_chars);
  cJSON_AddNumberToObject(o, "decision_us", d->seconds * 1e6);
  if (chosen >= 0) {
    cJSON *c = cJSON_AddObjectToObject(o, "choice");
    cJSON_AddNumberToObject(c, "worker", r->slots[chosen]->id);
    cJSON_AddStringToObject(c, "url", r->slots[chosen]->url);
  } else {
    cJSON_AddNullToObject(o, "choice");
  }
  cJSON *arr = cJSON_AddArrayToObject(o, "workers");
  for (size_t i = 0; i < d->nsnaps; i++) {
    kvr_worker_t *w = r->slots[i];
    if (w == NULL)
      continue;
    const kvr_worker_snap_t *s = &d->snaps[i];
    cJSON *x = cJSON_CreateObject();
    cJSON_AddNumberToObject(x, "id", w->id);
    cJSON_AddStringToObject(x, "url", w->url);
    cJSON_AddStringToObject(x, "state", kvr_worker_state_name(w->state));
    cJSON_AddNumberToObject(x, "matched_blocks", (double)s->matched_blocks);
    uint64_t cached = (uint64_t)s->matched_blocks * r->cfg->block_chars / 4;
    cJSON_AddNumberToObject(x, "predicted_cached_tokens",
                            (double)KVR_MIN(cached, prompt.prompt_tokens));
    cJSON_AddNumberToObject(x, "in_flight", s->inflight);
    cJSON_AddNumberToObject(x, "active_tokens", (double)s->active_tokens);
    cJSON_AddNumberToObject(x, "queued_prefill_tokens", (double)s->queued_prefill_tokens);
    cJSON_AddBoolToObject(x, "metrics_fresh", s->metrics_fresh);
    cJSON_AddNumberToObject(x, "num_requests_running", s->num_requests_running);
    cJSON_AddNumberToObject(x, "num_requests_waiting", s->num_requests_waiting);
    cJSON_AddNumberToObject(x, "kv_cache_usage_perc", s->kv_cache_usage);
    cJSON_AddBoolToObject(x, "eligible", d->scores[i].eligible);
    cJSON_AddBoolToObject(x, "capped", d->scores[i].capped);
    cJSON_AddNumberToObject(x, "cost", d->scores[i].cost);
    cJSON_AddBoolToObject(x, "chosen", (int)i == chosen);
    cJSON_AddItemToArray(arr, x);
  }
  free(d);
  kvr_prompt_free(&prompt);
  send_json(req, 200, o);
}

void kvr_admin_on_request(kvr_http_req_t *req, void *data) {
  kvr_router_t *r = data;
  const char *path = req->path;
  int m = req->method;
  if (strcmp(path, "/metrics") == 0 && m == HTTP_GET) {
    kvr_buf_t b = KVR_BUF_INIT;
    kvr_router_metrics(r, &b);
    kvr_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, b.data, b.len);
    kvr_buf_free(&b);
  } else if (strcmp(path, "/health") == 0 && m == HTTP_GET) {
    bool ok = kvr_router_has_usable(r);
    const char *body = ok ? "{\"status\":\"ok\"}\n" : "{\"status\":\"unavailable\"}\n";
    kvr_http_respond(req, ok ? 200 : 503, "application/json", NULL, body, strlen(body));
  } else if (strcmp(path, "/admin/workers") == 0 && m == HTTP_GET) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "workers", kvr_router_workers_json(r));
    send_json(req, 200, o);
  } else if (strcmp(path, "/admin/workers") == 0 && m == HTTP_POST) {
    workers_post(r, req);
  } else if (strncmp(path, "/admin/workers/", 15) == 0 && m == HTTP_DELETE) {
    workers_delete(r, req, path + 15);
  } else if (strcmp(path, "/admin/policy") == 0 && m == HTTP_GET) {
    send_json(req, 200, kvr_router_policy_json(r));
  } else if (strcmp(path, "/admin/policy") == 0 && m == HTTP_PUT) {
    policy_put(r, req);
  } else if (strcmp(path, "/admin/route/explain") == 0 && m == HTTP_POST) {
    explain(r, req);
  } else if (strcmp(path, "/metrics") == 0 || strcmp(path, "/health") == 0 ||
             strcmp(path, "/admin/workers") == 0 || strncmp(path, "/admin/workers/", 15) == 0 ||
             strcmp(path, "/admin/policy") == 0 || strcmp(path, "/admin/route/explain") == 0) {
    kvr_http_error(req, 405, NULL, "method_not_allowed", "%s is not allowed on %s",
                   req->method_str, path);
  } else {
    kvr_http_error(req, 404, NULL, "not_found", "no admin route %s", path);
  }
}

/* lora.c -- runtime LoRA loads on the workers, one per (worker, adapter) at a time (lora.h).
 *
 * Flow: kvr_lora_load -> find_op (same server URL and adapter name in flight: join) or op_start
 * (kvr_router_on_lora_load_start, POST WORKER/v1/load_lora_adapter on the multi) -> on_done ->
 * classify (vLLM's answers, models/serving.py: 200 "Success: LoRA adapter 'N' added
 * successfully."; 400 InvalidUserInput "The lora adapter 'N' has already been loaded. ..."; 404
 * NotFoundError when the files are missing; 500 when the engine fails; FastAPI's 404 {"detail":
 * "Not Found"} when the server runs without VLLM_ALLOW_RUNTIME_LORA_UPDATING) ->
 * kvr_router_on_lora_load_done -> every waiter's callback.
 *
 * The op leaves l->ops before any callback runs, so a waiter's callback may start another load
 * (a later request) or end its request (kvr_lora_cancel on a waiter no longer listed is a no-op).
 */
#include "serve/lora.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ANSWER_MAX (64u * 1024u) /* bytes of a worker's answer kept for the reason */
#define REASON_MAX 300

typedef struct op_s {
  kvr_list_t node; /* in l->ops */
  kvr_lora_t *l;
  uint32_t worker_id;         /* the worker whose request started it (for the log) */
  char *url;                  /* owned: the vLLM server (all its data-parallel ranks) */
  kvr_lora_adapter_t adapter; /* owned copies (base may be NULL) */
  CURL *easy;
  struct curl_slist *hdrs;
  kvr_buf_t body, answer;
  kvr_list_t waiters; /* kvr_lora_wait_t.node, oldest first */
} op_t;

struct kvr_lora_s {
  kvr_curlm_t *curlm;
  kvr_router_t *r;
  long connect_ms, timeout_ms;
  kvr_list_t ops;
  size_t nops;
};

kvr_lora_t *kvr_lora_new(kvr_curlm_t *curlm, kvr_router_t *r, long connect_ms, long timeout_ms) {
  kvr_lora_t *l = kvr_xcalloc(1, sizeof *l);
  l->curlm = curlm;
  l->r = r;
  l->connect_ms = connect_ms;
  l->timeout_ms = timeout_ms;
  kvr_list_init(&l->ops);
  return l;
}

static void op_free(op_t *op) {
  curl_easy_cleanup(op->easy);
  curl_slist_free_all(op->hdrs);
  kvr_buf_free(&op->body);
  kvr_buf_free(&op->answer);
  free(op->url);
  free(op->adapter.name);
  free(op->adapter.path);
  free(op->adapter.base);
  free(op);
}

/* Takes op out of l->ops and unlinks its waiters (their callbacks are not called). */
static void op_detach(op_t *op) {
  kvr_list_remove(&op->node);
  op->l->nops--;
  while (!kvr_list_empty(&op->waiters)) {
    kvr_lora_wait_t *wt = KVR_CONTAINER_OF(op->waiters.next, kvr_lora_wait_t, node);
    kvr_list_remove(&wt->node);
    wt->waiting = false;
  }
}

void kvr_lora_free(kvr_lora_t *l) {
  if (l == NULL)
    return;
  while (!kvr_list_empty(&l->ops)) {
    op_t *op = KVR_CONTAINER_OF(l->ops.next, op_t, node);
    kvr_curlm_cancel(l->curlm, op->easy);
    op_detach(op);
    op_free(op);
  }
  free(l);
}

size_t kvr_lora_inflight(const kvr_lora_t *l) {
  return l->nops;
}

static size_t on_answer(char *data, size_t size, size_t n, void *ud) {
  op_t *op = ud;
  size_t len = size * n;
  if (op->answer.len < ANSWER_MAX)
    kvr_buf_append(&op->answer, data, KVR_MIN(len, (size_t)(ANSWER_MAX - op->answer.len)));
  return len;
}

/* The worker's message in its answer: vLLM's error JSON ({"error": {"message"}} or the older
 * {"message"}), FastAPI's {"detail"}, else the text itself; on one line, at most REASON_MAX. */
static void answer_reason(const kvr_buf_t *answer, char *out, size_t outlen) {
  cJSON *j = cJSON_ParseWithLength(answer->data ? answer->data : "", answer->len);
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(e) ? e : j, "message");
  if (!cJSON_IsString(m))
    m = cJSON_GetObjectItemCaseSensitive(j, "detail");
  if (cJSON_IsString(m))
    snprintf(out, outlen, "%s", m->valuestring);
  else
    snprintf(out, outlen, "%.*s", (int)KVR_MIN(answer->len, (size_t)REASON_MAX),
             answer->data ? answer->data : "");
  cJSON_Delete(j);
  for (char *p = out; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '\t')
      *p = ' ';
}

static void on_done(CURL *easy, CURLcode rc, void *data) {
  op_t *op = data;
  kvr_lora_t *l = op->l;
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  char reason[REASON_MAX + 1] = "";
  kvr_lora_outcome_t o = {KVR_LORA_LOAD_FAILED, rc == CURLE_OK ? status : 0, reason};
  if (rc != CURLE_OK) {
    snprintf(reason, sizeof reason, "%s", curl_easy_strerror(rc));
  } else {
    answer_reason(&op->answer, reason, sizeof reason);
    if (status == 200)
      o.res = KVR_LORA_LOAD_LOADED;
    else if (status == 400 && strstr(reason, "has already been loaded"))
      o.res = KVR_LORA_LOAD_ALREADY_LOADED;
    else if (status == 404 && strcmp(reason, "Not Found") == 0)
      snprintf(reason, sizeof reason, "%s",
               "Not Found (no /v1/load_lora_adapter: is the worker started with "
               "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1?)");
  }
  if (o.res == KVR_LORA_LOAD_FAILED)
    KVR_WARN("lora", "worker %u: loading LoRA adapter %s (%s) failed: HTTP %ld: %s", op->worker_id,
             op->adapter.name, op->adapter.path, o.status, reason);
  kvr_router_on_lora_load_done(l->r, op->url, &op->adapter, o.res);
  /* Out of l->ops before the callbacks: they may start another load or end their requests. */
  kvr_list_t waiters;
  kvr_list_init(&waiters);
  kvr_list_remove(&op->node);
  l->nops--;
  while (!kvr_list_empty(&op->waiters)) {
    kvr_list_t *n = op->waiters.next;
    kvr_list_remove(n);
    kvr_list_insert_tail(&waiters, n);
  }
  while (!kvr_list_empty(&waiters)) {
    kvr_lora_wait_t *wt = KVR_CONTAINER_OF(waiters.next, kvr_lora_wait_t, node);
    kvr_list_remove(&wt->node);
    wt->waiting = false;
    wt->cb(wt, &o);
  }
  op_free(op);
}

static op_t *find_op(kvr_lora_t *l, const char *url, const char *name) {
  for (kvr_list_t *n = l->ops.next; n != &l->ops; n = n->next) {
    op_t *op = KVR_CONTAINER_OF(n, op_t, node);
    if (strcmp(op->url, url) == 0 && strcmp(op->adapter.name, name) == 0)
      return op;
  }
  return NULL;
}

/* A new load of a on w: the POST on the multi, or NULL when curl refused it. */
static op_t *op_start(kvr_lora_t *l, const kvr_worker_t *w, const kvr_lora_adapter_t *a) {
  op_t *op = kvr_xcalloc(1, sizeof *op);
  op->l = l;
  op->worker_id = w->id;
  op->url = kvr_xstrdup(w->url);
  op->adapter.name = kvr_xstrdup(a->name);
  op->adapter.path = kvr_xstrdup(a->path);
  op->adapter.base = a->base ? kvr_xstrdup(a->base) : NULL;
  kvr_list_init(&op->waiters);
  kvr_buf_puts(&op->body, "{\"lora_name\":");
  kvr_buf_json_str(&op->body, a->name, strlen(a->name));
  kvr_buf_puts(&op->body, ",\"lora_path\":");
  kvr_buf_json_str(&op->body, a->path, strlen(a->path));
  kvr_buf_puts(&op->body, "}");
  kvr_buf_t url = KVR_BUF_INIT;
  kvr_buf_printf(&url, "%s/v1/load_lora_adapter", w->url);
  op->easy = kvr_curl_easy_new(url.data, l->connect_ms, l->timeout_ms, on_answer, op);
  kvr_buf_free(&url);
  op->hdrs = kvr_curl_slist_append(NULL, "Content-Type: application/json");
  curl_easy_setopt(op->easy, CURLOPT_HTTPHEADER, op->hdrs);
  curl_easy_setopt(op->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)op->body.len);
  curl_easy_setopt(op->easy, CURLOPT_POSTFIELDS, op->body.data);
  kvr_router_on_lora_load_start(l->r, w->url, a->name);
  if (kvr_curlm_add(l->curlm, op->easy, on_done, op) != 0) {
    kvr_router_on_lora_load_done(l->r, w->url, a, KVR_LORA_LOAD_FAILED);
    op_free(op);
    return NULL;
  }
  KVR_INFO("lora", "worker %u: loading LoRA adapter %s from %s", w->id, a->name, a->path);
  kvr_list_insert_tail(&l->ops, &op->node);
  l->nops++;
  return op;
}

int kvr_lora_load(kvr_lora_t *l, const kvr_worker_t *w, const kvr_lora_adapter_t *a,
                  kvr_lora_wait_t *wait) {
  op_t *op = find_op(l, w->url, a->name);
  if (op == NULL && (op = op_start(l, w, a)) == NULL)
    return KVR_EIO;
  kvr_list_insert_tail(&op->waiters, &wait->node);
  wait->waiting = true;
  return 0;
}

void kvr_lora_cancel(kvr_lora_wait_t *wait) {
  if (wait == NULL || !wait->waiting)
    return;
  kvr_list_remove(&wait->node);
  wait->waiting = false;
}

/* openai.c -- OpenAI API knowledge: routes, request features, SSE framing, response objects.
 *
 * What it owns: kvr_openai_sse_t, the one SSE line splitter of the code base (the proxy inspects
 * the streams it relays with it; the load generator measures the streams it reads with it). The
 * other functions are stateless readers and writers of the API's formats.
 *
 * The splitter. A response body arrives in chunks cut anywhere (curl delivers what one read
 * returned). Lines that are complete inside a chunk are handed to the callback in place, without a
 * copy; only a line cut by the chunk's end is copied into s->line, and the next feed appends to it
 * up to its LF. So a stream costs one memchr per line plus a copy of at most one line per chunk.
 *
 *   feed(chunk): for each LF in chunk: line = s->line + the bytes before the LF (the bytes
 *                alone when s->line is empty); strip one CR; cb(line); clear s->line.
 *                Then the bytes after the last LF -> s->line.
 *
 * Invariants: s->line holds no LF; s->line.len <= max_line; while s->overflow is set s->line is
 * empty and bytes are dropped up to the next LF, which clears it. The lines delivered depend only
 * on the bytes fed, not on where the chunks were cut (tests/src/proto/test_openai.c feeds a stream
 * at every split point and byte by byte).
 *
 * Response objects. kvr_openai_chunk_read() reports what a chunk or body says (answer text,
 * reasoning text, usage, error) as views into the cJSON tree; whether a chunk counts as a token,
 * where its text goes and how usage is accounted is decided by the caller (proxy.c, loadgen.c).
 *
 * Scratch parses. The proxy parses every SSE event it relays and every held answer only to read
 * a few fields, then drops the tree; cJSON allocates each node and string (about 25 calls for a
 * token event) and frees them all again. kvr_openai_parse_scratch() runs cJSON_ParseWithLength
 * with its allocations served from a per-thread bump arena instead: cJSON's hooks (installed once,
 * before main, by install_hooks) send allocations to the arena while a scratch parse runs on the
 * thread and to malloc/free at any other time, so every other cJSON use is unchanged. The arena is
 * reset by the next scratch parse: its trees are never freed one by one.
 *
 *   scratch_parse(s): reset arena (one chunk: used = 0; several, or over SCRATCH_KEEP: freed, and
 *                     the next chunk sized to what they held) -> arena on -> cJSON parse -> off
 *   hook_malloc(n):   arena on ? bump (a new chunk when the current one is full) : malloc(n)
 *   hook_free(p):     arena on ? nothing (only a failed parse frees, its own nodes) : free(p)
 */
#include "proto/openai.h"

#include "base/kvr.h"

#include <math.h>
#include <pthread.h>
#include <stdalign.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scratch parses ----------------------------------------------------------------------------
 */

/* Under AddressSanitizer the arena's free bytes are poisoned, so that a read or write past a
 * node or string it served is reported as it would be for a malloc'd one. */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVR_SCRATCH_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KVR_SCRATCH_ASAN 1
#endif
#ifdef KVR_SCRATCH_ASAN
#include <sanitizer/asan_interface.h>
#define SCRATCH_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define SCRATCH_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define SCRATCH_POISON(p, n) ((void)(p), (void)(n))
#define SCRATCH_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define SCRATCH_MIN (16u << 10) /* first chunk */
#define SCRATCH_KEEP (1u << 20) /* bytes an idle arena may keep between parses */

typedef struct scratch_chunk_s {
  struct scratch_chunk_s *next; /* older chunks of the same parse */
  size_t cap, used;
  alignas(max_align_t) unsigned char data[];
} scratch_chunk_t;

static _Thread_local struct {
  scratch_chunk_t *chunk; /* the current chunk, older ones behind it */
  bool on;                /* a scratch parse is running on this thread */
} scratch;

/* A thread that parsed into its arena frees it when it ends (the study's worker threads): a key
 * whose destructor runs at thread exit, set at the thread's first chunk. The main thread's arena
 * stays reachable through its thread-local storage until the process ends. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_thread_exit(void *unused) {
  (void)unused;
  kvr_openai_scratch_free();
}

static void scratch_key_create(void) {
  (void)pthread_key_create(&scratch_key, scratch_thread_exit);
}

static void *hook_malloc(size_t n) {
  if (!scratch.on)
    return malloc(n);
  size_t a = alignof(max_align_t);
  size_t asked = n;
  n = (n + a - 1) & ~(a - 1);
  scratch_chunk_t *c = scratch.chunk;
  if (c == NULL || c->cap - c->used < n) {
    size_t cap = c ? 2 * c->cap : SCRATCH_MIN;
    if (cap < n)
      cap = n;
    scratch_chunk_t *nc = malloc(sizeof *nc + cap);
    if (nc == NULL)
      return NULL;   /* cJSON fails the parse */
    if (c == NULL) { /* this thread's first chunk: free the arena when the thread ends */
      (void)pthread_once(&scratch_once, scratch_key_create);
      (void)pthread_setspecific(scratch_key, &scratch);
    }
    nc->next = c;
    nc->cap = cap;
    nc->used = 0;
    SCRATCH_POISON(nc->data, cap);
    scratch.chunk = c = nc;
  }
  void *p = c->data + c->used;
  c->used += n;
  SCRATCH_UNPOISON(p, asked);
  (void)asked;
  return p;
}

static void hook_free(void *p) {
  if (!scratch.on)
    free(p);
}

/* cJSON's hooks are process-wide: installed once before main, so before any thread or tree. */
__attribute__((constructor)) static void install_hooks(void) {
  cJSON_Hooks h = {.malloc_fn = hook_malloc, .free_fn = hook_free};
  cJSON_InitHooks(&h);
}

/* Empties the arena for the next parse: one chunk is kept as it is; several (the last parse
 * outgrew the first) are replaced by one of their total size, up to SCRATCH_KEEP. */
static void scratch_reset(void) {
  scratch_chunk_t *c = scratch.chunk;
  if (c == NULL)
    return;
  if (c->next == NULL && c->cap <= SCRATCH_KEEP) {
    c->used = 0;
    SCRATCH_POISON(c->data, c->cap);
    return;
  }
  size_t total = 0;
  while (c != NULL) {
    scratch_chunk_t *next = c->next;
    total += c->cap;
    SCRATCH_UNPOISON(c->data, c->cap);
    free(c);
    c = next;
  }
  scratch.chunk = NULL;
  if (total <= SCRATCH_KEEP) {
    c = malloc(sizeof *c + total);
    if (c != NULL) {
      c->next = NULL;
      c->cap = total;
      c->used = 0;
      SCRATCH_POISON(c->data, total);
      scratch.chunk = c;
    }
  }
}

const cJSON *kvr_openai_parse_scratch(const char *s, size_t len) {
  scratch_reset();
  scratch.on = true;
  cJSON *obj = cJSON_ParseWithLength(s, len);
  scratch.on = false;
  return obj;
}

void kvr_openai_scratch_free(void) {
  scratch_chunk_t *c = scratch.chunk;
  while (c != NULL) {
    scratch_chunk_t *next = c->next;
    SCRATCH_UNPOISON(c->data, c->cap);
    free(c);
    c = next;
  }
  scratch.chunk = NULL;
}

bool kvr_openai_response_path_id(const char *path, const char **id, size_t *len) {
  static const char prefix[] = "/v1/responses/";
  if (strncmp(path, prefix, sizeof prefix - 1) != 0)
    return false;
  const char *s = path + sizeof prefix - 1, *slash = strchr(s, '/');
  size_t n = slash ? (size_t)(slash - s) : strlen(s);
  if (n == 0 || (slash && strcmp(slash, "/cancel") != 0))
    return false;
  *id = s;
  *len = n;
  return true;
}

kvr_route_t kvr_openai_route(const char *path) {
  const char *id;
  size_t n;
  if (strcmp(path, "/v1/chat/completions") == 0)
    return KVR_ROUTE_CHAT;
  if (strcmp(path, "/v1/completions") == 0)
    return KVR_ROUTE_COMPLETIONS;
  if (strcmp(path, "/v1/models") == 0)
    return KVR_ROUTE_MODELS;
  if (strcmp(path, "/v1/responses") == 0)
    return KVR_ROUTE_RESPONSES;
  if (strcmp(path, "/v1/messages") == 0)
    return KVR_ROUTE_MESSAGES;
  if (kvr_openai_response_path_id(path, &id, &n))
    return KVR_ROUTE_RESPONSE_ID;
  return KVR_ROUTE_OTHER;
}

const char *kvr_openai_route_name(kvr_route_t route) {
  static const char *const names[] = {
#define XX(name, label) label,
      KVR_ROUTE_MAP(XX)
#undef XX
  };
  return (unsigned)route < KVR_ARRAY_SIZE(names) ? names[route] : "other";
}

bool kvr_openai_route_has_prompt(kvr_route_t route) {
  return route == KVR_ROUTE_CHAT || route == KVR_ROUTE_COMPLETIONS ||
         route == KVR_ROUTE_RESPONSES || route == KVR_ROUTE_MESSAGES;
}

/* The prompt form a route's body has. */
static kvr_prompt_kind_t route_kind(kvr_route_t route) {
  switch (route) {
  case KVR_ROUTE_CHAT:
    return KVR_PROMPT_CHAT;
  case KVR_ROUTE_RESPONSES:
    return KVR_PROMPT_RESPONSES;
  case KVR_ROUTE_MESSAGES:
    return KVR_PROMPT_MESSAGES;
  default:
    return KVR_PROMPT_COMPLETIONS;
  }
}

int kvr_openai_features(const char *body, size_t len, kvr_route_t route, size_t block_chars,
                        kvr_prompt_t *prompt, char *err, size_t errlen, const char **code) {
  kvr_prompt_init(prompt);
  if (len == 0) {
    snprintf(err, errlen, "the request body must be a JSON object");
    *code = "missing_body";
    return KVR_EINVAL;
  }
  /* Read once, into the scratch arena: nothing of the tree outlives this call. */
  const cJSON *json = kvr_openai_parse_scratch(body, len);
  if (json == NULL || !cJSON_IsObject(json)) {
    snprintf(err, errlen, "the request body is not a valid JSON object");
    *code = "invalid_json";
    return KVR_EINVAL;
  }
  int rc = kvr_prompt_from_json(json, route_kind(route), block_chars, prompt, err, errlen);
  if (rc != 0) {
    *code = prompt->err_code ? prompt->err_code : "invalid_value";
    kvr_prompt_free(prompt);
    return rc;
  }
  return 0;
}

/* ---- errors -----------------------------------------------------------------------------------
 */

void kvr_openai_error_body(kvr_buf_t *out, const char *message, const char *type,
                           const char *code) {
  kvr_buf_puts(out, "{\"error\":{\"message\":");
  kvr_buf_json_str(out, message, strlen(message));
  kvr_buf_puts(out, ",\"type\":");
  kvr_buf_json_str(out, type, strlen(type));
  kvr_buf_puts(out, ",\"param\":null,\"code\":");
  if (code)
    kvr_buf_json_str(out, code, strlen(code));
  else
    kvr_buf_puts(out, "null");
  kvr_buf_puts(out, "}}\n");
}

void kvr_openai_stream_error_event(kvr_buf_t *out, const char *why) {
  kvr_buf_t body = KVR_BUF_INIT, msg = KVR_BUF_INIT;
  kvr_buf_printf(&msg, "upstream worker failed mid-stream: %s", why);
  kvr_openai_error_body(&body, msg.data, "server_error", "upstream_stream_broken");
  /* An event ends at a blank line, so the body's own newline goes. */
  while (body.len && body.data[body.len - 1] == '\n')
    body.len--;
  kvr_buf_puts(out, "data: ");
  kvr_buf_append(out, body.data, body.len);
  kvr_buf_puts(out, "\n\ndata: [DONE]\n\n");
  kvr_buf_free(&body);
  kvr_buf_free(&msg);
}

/* ---- server-sent events -----------------------------------------------------------------------
 */

void kvr_openai_sse_init(kvr_openai_sse_t *s, size_t max_line) {
  kvr_buf_init(&s->line);
  s->max_line = max_line;
  s->overflow = false;
  s->stop = false;
  s->consumed = 0;
  s->line_at = SIZE_MAX;
}

size_t kvr_openai_sse_pending(const kvr_openai_sse_t *s) {
  return s->line.len;
}

void kvr_openai_sse_reset(kvr_openai_sse_t *s) {
  kvr_buf_reset(&s->line);
  s->overflow = false;
  s->stop = false;
  s->consumed = 0;
  s->line_at = SIZE_MAX;
}

void kvr_openai_sse_free(kvr_openai_sse_t *s) {
  if (s == NULL)
    return;
  kvr_buf_free(&s->line);
  s->overflow = false;
}

static void deliver(const char *line, size_t len, kvr_openai_sse_line_cb cb, void *cbdata) {
  if (len && line[len - 1] == '\r')
    len--;
  cb(cbdata, line, len);
}

int kvr_openai_sse_feed(kvr_openai_sse_t *s, const char *data, size_t len,
                        kvr_openai_sse_line_cb cb, void *cbdata) {
  s->consumed = s->stop ? 0 : len;
  if (len == 0 || s->stop)
    return 0;
  int rc = 0;
  const char *p = data, *end = data + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    if (!s->overflow) {
      if (s->line.len + n > s->max_line) {
        s->overflow = true;
        kvr_buf_reset(&s->line);
        rc = KVR_ELIMIT;
      } else if (nl && s->line.len == 0) {
        s->line_at = (size_t)(p - data);
        deliver(p, n, cb, cbdata); /* whole line inside this chunk: no copy */
      } else {
        kvr_buf_append(&s->line, p, n);
        s->line_at = SIZE_MAX; /* delivered only here with a part from an earlier feed */
        if (nl)
          deliver(s->line.data, s->line.len, cb, cbdata);
      }
    }
    if (nl == NULL)
      break;
    kvr_buf_reset(&s->line);
    s->overflow = false;
    p = nl + 1;
    if (s->stop) {
      s->consumed = (size_t)(p - data);
      break;
    }
  }
  return rc;
}

bool kvr_openai_sse_data(const char *line, size_t len, const char **payload, size_t *plen) {
  if (len < 5 || memcmp(line, "data:", 5) != 0)
    return false;
  size_t off = 5;
  while (off < len && line[off] == ' ')
    off++;
  *payload = line + off;
  *plen = len - off;
  return true;
}

bool kvr_openai_sse_done(const char *payload, size_t len) {
  return len == 6 && memcmp(payload, "[DONE]", 6) == 0;
}

/* ---- response objects -------------------------------------------------------------------------
 */

/* A token count as an integer: fractions truncated, negatives 0, huge values saturated. */
static uint64_t count(const cJSON *n) {
  double v = n->valuedouble;
  if (!(v > 0))
    return 0;
  return v >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)v;
}

static void read_text(const cJSON *obj, kvr_openai_chunk_t *out) {
  const cJSON *choices = cJSON_GetObjectItemCaseSensitive(obj, "choices");
  const cJSON *c0 = cJSON_IsArray(choices) ? cJSON_GetArrayItem(choices, 0) : NULL;
  if (!cJSON_IsObject(c0))
    return;
  out->finish = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(c0, "finish_reason"));
  const cJSON *dl = cJSON_GetObjectItemCaseSensitive(c0, "delta");
  const cJSON *tc = cJSON_IsObject(dl) ? cJSON_GetObjectItemCaseSensitive(dl, "tool_calls") : NULL;
  out->tool_call = tc != NULL && !cJSON_IsNull(tc);
  const cJSON *t = NULL;
  const cJSON *delta = cJSON_GetObjectItemCaseSensitive(c0, "delta");
  const cJSON *d = cJSON_IsObject(delta) ? delta : cJSON_GetObjectItemCaseSensitive(c0, "message");
  if (cJSON_IsObject(d))
    t = cJSON_GetObjectItemCaseSensitive(d, "content");
  if (!cJSON_IsString(t))
    t = cJSON_GetObjectItemCaseSensitive(c0, "text");
  if (cJSON_IsString(t) && t->valuestring[0] != '\0') {
    out->text = t->valuestring;
    out->text_len = strlen(t->valuestring);
  }
  const cJSON *r =
      cJSON_IsObject(delta) ? cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content") : NULL;
  if (cJSON_IsString(r) && r->valuestring[0] != '\0') {
    out->reasoning = r->valuestring;
    out->reasoning_len = strlen(r->valuestring);
  }
}

/* A usage figure as vLLM writes it: an integer in [0, KVR_OPENAI_USAGE_MAX]. */
static bool sane_count(const cJSON *n) {
  double v = n->valuedouble;
  return cJSON_IsNumber(n) && v >= 0 && v <= (double)KVR_OPENAI_USAGE_MAX && v == floor(v);
}

/* Usage is taken whole or not at all: every figure present must be sane_count() and the cached
 * tokens no more than the prompt's, else the answer counts as one without usage (usage_invalid),
 * so a worker's absurd figures can never wrap or skew a counter. */
static void read_usage(const cJSON *obj, kvr_openai_chunk_t *out) {
  const cJSON *usage = cJSON_GetObjectItemCaseSensitive(obj, "usage");
  if (!cJSON_IsObject(usage))
    return;
  const cJSON *pt = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens");
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(usage, "completion_tokens");
  const cJSON *det = cJSON_GetObjectItemCaseSensitive(usage, "prompt_tokens_details");
  const cJSON *cached =
      cJSON_IsObject(det) ? cJSON_GetObjectItemCaseSensitive(det, "cached_tokens") : NULL;
  bool has_pt = cJSON_IsNumber(pt), has_ct = cJSON_IsNumber(ct), has_c = cJSON_IsNumber(cached);
  if ((has_pt && !sane_count(pt)) || (has_ct && !sane_count(ct)) ||
      (has_c && (!sane_count(cached) || !has_pt || cached->valuedouble > pt->valuedouble))) {
    out->usage_invalid = true;
    return;
  }
  if ((out->has_prompt_tokens = has_pt))
    out->prompt_tokens = count(pt);
  if ((out->has_cached_tokens = has_c))
    out->cached_tokens = count(cached);
  if ((out->has_completion_tokens = has_ct))
    out->completion_tokens = count(ct);
}

/* A string member of obj, or NULL. */
static const char *str_member(const cJSON *obj, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void set_text(kvr_openai_chunk_t *out, const char *s) {
  if (s && s[0]) {
    out->text = s;
    out->text_len = strlen(s);
  }
}

/* Usage in the Responses API's words (input_tokens, input_tokens_details.cached_tokens,
 * output_tokens) or the Messages API's (input_tokens counts the uncached part when
 * cache_read_input_tokens is given: vLLM's anthropic/serving.py _build_anthropic_usage), as the
 * chat form read_usage() checks: a "usage" object with prompt_tokens, completion_tokens and
 * prompt_tokens_details.cached_tokens. Built in a small tree the caller frees. */
static cJSON *usage_as_chat(const cJSON *u, bool anthropic) {
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(u, "input_tokens");
  const cJSON *outt = cJSON_GetObjectItemCaseSensitive(u, "output_tokens");
  const cJSON *det = cJSON_GetObjectItemCaseSensitive(u, "input_tokens_details");
  const cJSON *cached = anthropic ? cJSON_GetObjectItemCaseSensitive(u, "cache_read_input_tokens")
                        : cJSON_IsObject(det)
                            ? cJSON_GetObjectItemCaseSensitive(det, "cached_tokens")
                            : NULL;
  if (!cJSON_IsNumber(in))
    return NULL;
  cJSON *root = cJSON_CreateObject(), *usage = cJSON_AddObjectToObject(root, "usage");
  double prompt = in->valuedouble + (anthropic && cJSON_IsNumber(cached) ? cached->valuedouble : 0);
  cJSON_AddNumberToObject(usage, "prompt_tokens", prompt);
  if (cJSON_IsNumber(outt))
    cJSON_AddNumberToObject(usage, "completion_tokens", outt->valuedouble);
  if (cJSON_IsNumber(cached))
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(usage, "prompt_tokens_details"),
                            "cached_tokens", cached->valuedouble);
  return root;
}

static void read_usage_of(const cJSON *u, bool anthropic, kvr_openai_chunk_t *out) {
  cJSON *chat = cJSON_IsObject(u) ? usage_as_chat(u, anthropic) : NULL;
  if (chat)
    read_usage(chat, out);
  cJSON_Delete(chat);
}

/* The text of a Responses body's output (message items' output_text parts, the first one) and of a
 * Messages body's content (its text blocks, the first one). */
static const char *first_text(const cJSON *items, const char *part_array, const char *part_type) {
  const cJSON *it;
  cJSON_ArrayForEach(it, items) {
    const cJSON *parts = part_array ? cJSON_GetObjectItemCaseSensitive(it, part_array) : NULL;
    const cJSON *p;
    if (part_array == NULL) {
      const char *type = str_member(it, "type");
      if (type && strcmp(type, part_type) == 0 && str_member(it, "text"))
        return str_member(it, "text");
      continue;
    }
    cJSON_ArrayForEach(p, parts) {
      const char *type = str_member(p, "type");
      if (type && strcmp(type, part_type) == 0 && str_member(p, "text"))
        return str_member(p, "text");
    }
  }
  return NULL;
}

/* The Responses and Messages APIs' objects, told apart by "type" (events) or "object" (bodies):
 * response.created (the id), response.output_text.delta (a token event), response.completed
 * (usage), a response body; content_block_delta text_delta (a token event), message_delta (usage),
 * a message body; "error" events. Returns false for anything else (the chat/completions forms). */
static bool read_typed(const cJSON *obj, kvr_openai_chunk_t *out) {
  const char *type = str_member(obj, "type"), *object = str_member(obj, "object");
  const cJSON *resp = cJSON_GetObjectItemCaseSensitive(obj, "response");
  if (object && strcmp(object, "response") == 0) { /* a whole Responses body */
    out->response_id = str_member(obj, "id");
    set_text(out,
             first_text(cJSON_GetObjectItemCaseSensitive(obj, "output"), "content", "output_text"));
    read_usage_of(cJSON_GetObjectItemCaseSensitive(obj, "usage"), false, out);
    return true;
  }
  if (type == NULL)
    return false;
  if (strcmp(type, "response.created") == 0 || strcmp(type, "response.completed") == 0) {
    out->response_id = str_member(resp, "id");
    if (strcmp(type, "response.completed") == 0)
      read_usage_of(cJSON_GetObjectItemCaseSensitive(resp, "usage"), false, out);
  } else if (strcmp(type, "response.output_text.delta") == 0) {
    set_text(out, str_member(obj, "delta"));
  } else if (strcmp(type, "content_block_delta") == 0) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(obj, "delta");
    const char *dt = str_member(d, "type");
    if (dt && strcmp(dt, "text_delta") == 0)
      set_text(out, str_member(d, "text"));
  } else if (strcmp(type, "message_delta") == 0) {
    read_usage_of(cJSON_GetObjectItemCaseSensitive(obj, "usage"), true, out);
  } else if (strcmp(type, "message") == 0) { /* a whole Messages body */
    set_text(out, first_text(cJSON_GetObjectItemCaseSensitive(obj, "content"), NULL, "text"));
    read_usage_of(cJSON_GetObjectItemCaseSensitive(obj, "usage"), true, out);
  } else if (strcmp(type, "error") == 0 || strcmp(type, "response.failed") == 0) {
    out->error = obj;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(obj, "error");
    out->error_message = str_member(cJSON_IsObject(e) ? e : obj, "message");
  } else {
    return strncmp(type, "response.", 9) == 0 || strncmp(type, "message_", 8) == 0 ||
           strncmp(type, "content_block_", 14) == 0;
  }
  return true;
}

void kvr_openai_chunk_read(const cJSON *obj, kvr_openai_chunk_t *out) {
  memset(out, 0, sizeof *out);
  if (read_typed(obj, out))
    return;
  read_text(obj, out);
  read_usage(obj, out);
  out->error = cJSON_GetObjectItemCaseSensitive(obj, "error");
  const cJSON *msg = cJSON_GetObjectItemCaseSensitive(out->error, "message");
  if (cJSON_IsString(msg))
    out->error_message = msg->valuestring;
}

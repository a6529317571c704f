/* tokenize.c -- prompt token ids from a worker's POST /tokenize, with a direct-mapped cache of
 * whole bodies and one of chat message prefixes (see tokenize.h). One kvr_tokenize_op_t per call
 * in flight: its easy handle on the proxy's curl multi, the answer being read, the body's prefix
 * key (where its ids go in the prefix cache), and the caller's callback. */
#include "serve/tokenize.h"

#include "base/kvr.h"
#include "core/kv_index.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define ANSWER_MAX (64u << 20) /* a /tokenize answer larger than this is refused */

typedef struct slot_s {
  uint64_t key;
  size_t body_len; /* 0: empty slot */
  uint32_t *ids;
  size_t n;
} slot_t;

struct kvr_tokenizer_s {
  kvr_curlm_t *curlm;
  slot_t *cache;
  slot_t *prefixes; /* keyed by message-prefix key (body_len: 1 when used) */
  size_t nslots;
  double prefix_coverage;
  long connect_ms, timeout_ms;
  kvr_tokenize_stats_t st;
};

struct kvr_tokenize_op_s {
  kvr_tokenizer_t *t;
  CURL *easy;
  struct curl_slist *hdrs;
  char *body; /* the POST body, kept for curl */
  size_t body_len;
  uint64_t key;
  uint64_t prefix_key; /* the whole body's message-prefix key; 0: not a chat body */
  kvr_buf_t answer;
  bool too_big;
  kvr_tokenize_cb done;
  void *data;
};

kvr_tokenizer_t *kvr_tokenizer_new(kvr_curlm_t *curlm, size_t cache_entries, double prefix_coverage,
                                   uint64_t connect_timeout_ms, uint64_t timeout_ms) {
  kvr_tokenizer_t *t = kvr_xcalloc(1, sizeof(*t));
  t->curlm = curlm;
  t->nslots = cache_entries;
  t->cache = cache_entries ? kvr_xcalloc(cache_entries, sizeof(slot_t)) : NULL;
  t->prefix_coverage = prefix_coverage;
  t->prefixes =
      cache_entries && prefix_coverage > 0 ? kvr_xcalloc(cache_entries, sizeof(slot_t)) : NULL;
  t->connect_ms = (long)connect_timeout_ms;
  t->timeout_ms = (long)timeout_ms;
  return t;
}

void kvr_tokenizer_free(kvr_tokenizer_t *t) {
  if (t == NULL)
    return;
  for (size_t i = 0; i < t->nslots; i++) {
    free(t->cache[i].ids);
    if (t->prefixes)
      free(t->prefixes[i].ids);
  }
  free(t->cache);
  free(t->prefixes);
  free(t);
}

const kvr_tokenize_stats_t *kvr_tokenizer_stats(const kvr_tokenizer_t *t) {
  return &t->st;
}

/* ---- bodies ---- */

static void copy_if(cJSON *to, const cJSON *from, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(from, key);
  if (v)
    cJSON_AddItemToObject(to, key, cJSON_Duplicate(v, true));
}

void kvr_tokenize_prefixes_free(kvr_tokenize_prefixes_t *p) {
  free(p->keys);
  free(p->chars);
  memset(p, 0, sizeof *p);
}

/* The message-prefix keys of a chat tokenize body tb (its messages not yet added): the hash of
 * the other fields seeds a chain over each message's JSON. */
static void chat_prefixes(const cJSON *tb, const cJSON *messages, kvr_tokenize_prefixes_t *pre) {
  char *fields = cJSON_PrintUnformatted(tb);
  uint64_t h = XXH3_64bits(fields ? fields : "", fields ? strlen(fields) : 0);
  cJSON_free(fields);
  size_t n = (size_t)cJSON_GetArraySize(messages), i = 0, chars = 0;
  pre->keys = kvr_xmalloc((n ? n : 1) * sizeof(uint64_t));
  pre->chars = kvr_xmalloc((n ? n : 1) * sizeof(size_t));
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    char *text = cJSON_PrintUnformatted(m);
    size_t tl = text ? strlen(text) : 0;
    h = XXH3_64bits_withSeed(text ? text : "", tl, h);
    cJSON_free(text);
    chars += tl;
    pre->keys[i] = h | 1; /* 0 means "no prefix key" */
    pre->chars[i] = chars;
    i++;
  }
  pre->n = i;
}

int kvr_tokenize_body(const char *body, size_t len, kvr_route_t route, kvr_buf_t *out,
                      uint32_t **ids, size_t *nids, kvr_tokenize_prefixes_t *pre) {
  if (pre)
    memset(pre, 0, sizeof *pre);
  cJSON *req = cJSON_ParseWithLength(body ? body : "", len);
  if (!cJSON_IsObject(req)) {
    cJSON_Delete(req);
    return -1;
  }
  int rc = -1;
  cJSON *tb = cJSON_CreateObject();
  copy_if(tb, req, "model");
  if (route == KVR_ROUTE_CHAT) {
    if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(req, "messages")))
      goto out;
    /* the chat fields that change what the template renders */
    static const char *const keys[] = {
        "add_generation_prompt", "continue_final_message", "tools",
        "chat_template",         "chat_template_kwargs",   "documents",
        "add_special_tokens"};
    for (size_t i = 0; i < KVR_ARRAY_SIZE(keys); i++)
      copy_if(tb, req, keys[i]);
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(req, "messages");
    if (pre)
      chat_prefixes(tb, messages, pre);
    cJSON_AddItemToObject(tb, "messages", cJSON_Duplicate(messages, true));
    rc = 1;
  } else if (route == KVR_ROUTE_COMPLETIONS) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 && cJSON_IsString(cJSON_GetArrayItem(p, 0)))
      p = cJSON_GetArrayItem(p, 0);
    if (cJSON_IsString(p)) {
      cJSON_AddStringToObject(tb, "prompt", p->valuestring);
      copy_if(tb, req, "add_special_tokens");
      rc = 1;
    } else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 &&
               cJSON_IsNumber(cJSON_GetArrayItem(p, 0))) {
      /* token ids already: what the engine sees */
      size_t n = (size_t)cJSON_GetArraySize(p), i = 0;
      uint32_t *v = kvr_xmalloc(n * sizeof(uint32_t));
      const cJSON *it;
      cJSON_ArrayForEach(it, p) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > UINT32_MAX) {
          free(v);
          goto out;
        }
        v[i++] = (uint32_t)it->valuedouble;
      }
      *ids = v;
      *nids = n;
      rc = 0;
    }
  }
  if (rc == 1) {
    char *text = cJSON_PrintUnformatted(tb);
    kvr_buf_reset(out);
    kvr_buf_puts(out, text ? text : "{}");
    cJSON_free(text);
  }
out:
  cJSON_Delete(tb);
  cJSON_Delete(req);
  return rc;
}

int kvr_tokenize_parse_answer(const char *text, size_t len, uint32_t **ids, size_t *nids) {
  cJSON *a = cJSON_ParseWithLength(text ? text : "", len);
  const cJSON *toks = cJSON_GetObjectItemCaseSensitive(a, "tokens");
  if (!cJSON_IsArray(toks)) {
    cJSON_Delete(a);
    return -1;
  }
  size_t n = (size_t)cJSON_GetArraySize(toks), i = 0;
  uint32_t *v = kvr_xmalloc((n ? n : 1) * sizeof(uint32_t));
  const cJSON *it;
  cJSON_ArrayForEach(it, toks) {
    if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > UINT32_MAX) {
      free(v);
      cJSON_Delete(a);
      return -1;
    }
    v[i++] = (uint32_t)it->valuedouble;
  }
  cJSON_Delete(a);
  *ids = v;
  *nids = n;
  return 0;
}

uint64_t *kvr_tokenize_route_req(const uint32_t *ids, size_t n, uint32_t block_size,
                                 const kvr_kv_salts_t *salts, kvr_route_req_t *rr) {
  uint64_t *chain = kvr_xmalloc((n / block_size + 1) * sizeof(uint64_t));
  rr->kv_nchain = kvr_kv_chain_salted(ids, n, block_size, salts, chain);
  rr->kv_chain = chain;
  rr->kv_block_size = block_size;
  rr->prompt_tokens = n;
  return chain;
}

/* ---- calls ---- */

static slot_t *cache_slot(kvr_tokenizer_t *t, uint64_t key) {
  return t->nslots ? &t->cache[key % t->nslots] : NULL;
}

static size_t on_write(char *data, size_t size, size_t n, void *ud) {
  kvr_tokenize_op_t *op = ud;
  if (op->answer.len + size * n > ANSWER_MAX) {
    op->too_big = true;
    return 0; /* curl ends the transfer with an error */
  }
  kvr_buf_append(&op->answer, data, size * n);
  return size * n;
}

static void op_free(kvr_tokenize_op_t *op) {
  curl_easy_cleanup(op->easy);
  curl_slist_free_all(op->hdrs);
  free(op->body);
  kvr_buf_free(&op->answer);
  free(op);
}

static void on_done(CURL *easy, CURLcode rc, void *data) {
  kvr_tokenize_op_t *op = data;
  kvr_tokenizer_t *t = op->t;
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  uint32_t *ids = NULL;
  size_t n = 0;
  bool ok = rc == CURLE_OK && status == 200 && !op->too_big &&
            kvr_tokenize_parse_answer(op->answer.data, op->answer.len, &ids, &n) == 0;
  if (!ok) {
    t->st.failures++;
    op->done(op->data, false, NULL, 0, false);
  } else {
    slot_t *s = cache_slot(t, op->key);
    op->done(op->data, true, ids, n, false);
    if (op->prefix_key && t->prefixes) { /* the next turn's messages begin with these */
      slot_t *p = &t->prefixes[op->prefix_key % t->nslots];
      free(p->ids);
      p->key = op->prefix_key;
      p->body_len = 1;
      p->ids = kvr_xmalloc((n ? n : 1) * sizeof(uint32_t));
      memcpy(p->ids, ids, n * sizeof(uint32_t));
      p->n = n;
    }
    if (s) {
      free(s->ids);
      s->key = op->key;
      s->body_len = op->body_len;
      s->ids = ids;
      s->n = n;
    } else {
      free(ids);
    }
  }
  op_free(op);
}

/* The longest cached message prefix of pre shorter than the whole that holds at least the
 * tokenizer's coverage of its characters, or NULL. */
static const slot_t *prefix_hit(const kvr_tokenizer_t *t, const kvr_tokenize_prefixes_t *pre) {
  if (t->prefixes == NULL || pre == NULL || pre->n < 2)
    return NULL;
  double total = (double)pre->chars[pre->n - 1];
  for (size_t i = pre->n - 1; i-- > 0;) {
    if ((double)pre->chars[i] < t->prefix_coverage * total)
      return NULL; /* shorter ones cover less */
    const slot_t *p = &t->prefixes[pre->keys[i] % t->nslots];
    if (p->body_len && p->key == pre->keys[i] && p->ids)
      return p;
  }
  return NULL;
}

kvr_tokenize_op_t *kvr_tokenize(kvr_tokenizer_t *t, const char *worker_url, const kvr_buf_t *body,
                                const kvr_tokenize_prefixes_t *pre, kvr_tokenize_cb done,
                                void *data) {
  t->st.requests++;
  uint64_t key = XXH3_64bits(body->data, body->len);
  slot_t *s = cache_slot(t, key);
  if (s && s->body_len == body->len && s->key == key && s->ids) {
    t->st.cache_hits++;
    done(data, true, s->ids, s->n, false);
    return NULL;
  }
  const slot_t *p = prefix_hit(t, pre);
  if (p) {
    t->st.prefix_hits++;
    done(data, true, p->ids, p->n, true);
    return NULL;
  }
  kvr_tokenize_op_t *op = kvr_xcalloc(1, sizeof(*op));
  op->t = t;
  op->key = key;
  op->prefix_key = pre && pre->n ? pre->keys[pre->n - 1] : 0;
  op->done = done;
  op->data = data;
  op->body = kvr_xmalloc(body->len + 1);
  memcpy(op->body, body->data, body->len);
  op->body_len = body->len;
  kvr_buf_t url = KVR_BUF_INIT;
  kvr_buf_printf(&url, "%s/tokenize", worker_url);
  op->easy = kvr_curl_easy_new(url.data, t->connect_ms, t->timeout_ms, on_write, op);
  kvr_buf_free(&url);
  op->hdrs = kvr_curl_slist_append(NULL, "Content-Type: application/json");
  curl_easy_setopt(op->easy, CURLOPT_HTTPHEADER, op->hdrs);
  curl_easy_setopt(op->easy, CURLOPT_POST, 1L);
  curl_easy_setopt(op->easy, CURLOPT_POSTFIELDS, op->body);
  curl_easy_setopt(op->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)op->body_len);
  if (kvr_curlm_add(t->curlm, op->easy, on_done, op) != 0) {
    t->st.failures++;
    op_free(op);
    done(data, false, NULL, 0, false);
    return NULL;
  }
  return op;
}

void kvr_tokenize_cancel(kvr_tokenize_op_t *op) {
  if (op == NULL)
    return;
  kvr_curlm_cancel(op->t->curlm, op->easy);
  op_free(op);
}

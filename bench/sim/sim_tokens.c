/* sim_tokens.c -- deterministic text <-> token approximation for the simulated worker.
 *
 * Owns nothing long-lived: pure functions plus kvr_sim_toks_t, a growable uint32 array.
 *
 * Flow: a chat request's messages are rendered with the template of sim_tokens.h into one string,
 * padded so that every message header and every content starts on a 4-byte boundary; the string is
 * cut into 4-byte chunks and each chunk is hashed (XXH32) to an id below KVR_SIM_VOCAB. Generated
 * words are 4 bytes long, so the text of an answer and its token ids are interchangeable.
 *
 * Invariants: encode(a + b) == encode(a) + encode(b) whenever len(a) % 4 == 0 (prefix stability);
 * kvr_sim_tokens_word_id(s, k) == kvr_sim_tokens_id(word(s, k), 4).
 *
 * XXH32 is inlined (XXH_INLINE_ALL, the same function), and called with a constant length for the
 * 4-byte chunks: a call into libxxhash per chunk, or its switch on the length, cost more than the
 * hash (a 70 KB prompt of the study's trace is 17,000 chunks).
 */
#define XXH_INLINE_ALL
#include "sim_tokens.h"

#include "base/kvr.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void kvr_sim_toks_push(kvr_sim_toks_t *t, uint32_t id) {
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    t->v = kvr_xrealloc(t->v, cap * sizeof(*t->v));
    t->cap = cap;
  }
  t->v[t->n++] = id;
}

void kvr_sim_toks_free(kvr_sim_toks_t *t) {
  if (t == NULL)
    return;
  free(t->v);
  t->v = NULL;
  t->n = t->cap = 0;
}

/* Every chunk but a prompt's last is 4 bytes: XXH32 called with the constant 4 lets the compiler
 * fold the library's switch on the length away (inlined, it then costs what the hash does). */
uint32_t kvr_sim_tokens_id(const char *chunk, size_t len) {
  uint32_t h = len == 4 ? XXH32(chunk, 4, 0x6b7672u) : XXH32(chunk, len, 0x6b7672u);
  return h % KVR_SIM_VOCAB;
}

void kvr_sim_tokens_encode(const char *text, size_t len, kvr_sim_toks_t *out) {
  size_t need = out->n + (len + KVR_SIM_TOKEN_BYTES - 1) / KVR_SIM_TOKEN_BYTES;
  if (need > out->cap) { /* room for all of them at once, not a doubling every few thousand */
    out->cap = KVR_MAX(need, 2 * out->cap);
    out->v = kvr_xrealloc(out->v, out->cap * sizeof(*out->v));
  }
  for (size_t i = 0; i < len; i += KVR_SIM_TOKEN_BYTES) {
    size_t n = KVR_MIN((size_t)KVR_SIM_TOKEN_BYTES, len - i);
    kvr_sim_toks_push(out, kvr_sim_tokens_id(text + i, n));
  }
}

static void pad4(kvr_buf_t *out) {
  while (out->len % KVR_SIM_TOKEN_BYTES != 0)
    kvr_buf_append(out, " ", 1);
}

/* "<|role|>" + spaces + "\n", total a multiple of 4 when out->len is one on entry. */
static void render_header(kvr_buf_t *out, const char *role) {
  kvr_buf_printf(out, "<|%s|>", role);
  while ((out->len + 1) % KVR_SIM_TOKEN_BYTES != 0)
    kvr_buf_append(out, " ", 1);
  kvr_buf_append(out, "\n", 1);
}

static int render_content(const cJSON *content, kvr_buf_t *out, size_t idx, char *err,
                          size_t errlen) {
  if (content == NULL || cJSON_IsNull(content))
    return 0;
  if (cJSON_IsString(content)) {
    kvr_buf_puts(out, content->valuestring);
    return 0;
  }
  if (!cJSON_IsArray(content)) {
    snprintf(err, errlen, "messages[%zu].content: must be a string or an array of parts", idx);
    return KVR_EINVAL;
  }
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text)) {
      snprintf(err, errlen, "messages[%zu].content: only text parts are supported", idx);
      return KVR_EINVAL;
    }
    kvr_buf_puts(out, text->valuestring);
  }
  return 0;
}

int kvr_sim_tokens_render_chat(const cJSON *messages, kvr_buf_t *out, char *err, size_t errlen) {
  return kvr_sim_tokens_render_chat_ex(messages, true, out, err, errlen);
}

int kvr_sim_tokens_render_chat_ex(const cJSON *messages, bool generation_prompt, kvr_buf_t *out,
                                  char *err, size_t errlen) {
  kvr_sim_render_t r = {.generation_prompt = generation_prompt};
  return kvr_sim_tokens_render(messages, &r, out, err, errlen);
}

/* Checks one message's role; 0 or KVR_EINVAL with the reason in err. */
static int check_role(const cJSON *msg, size_t idx, char *err, size_t errlen) {
  static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
  const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
  if (!cJSON_IsObject(msg) || !cJSON_IsString(role)) {
    snprintf(err, errlen, "messages[%zu].role: field required", idx);
    return KVR_EINVAL;
  }
  for (size_t i = 0; i < KVR_ARRAY_SIZE(roles); i++) {
    if (strcmp(role->valuestring, roles[i]) == 0)
      return 0;
  }
  snprintf(err, errlen, "messages[%zu].role: unknown role '%.32s'", idx, role->valuestring);
  return KVR_EINVAL;
}

int kvr_sim_tokens_render(const cJSON *messages, kvr_sim_render_t *r, kvr_buf_t *out, char *err,
                          size_t errlen) {
  if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
    snprintf(err, errlen, "messages: must be a non-empty array");
    return KVR_EINVAL;
  }
  size_t idx = 0;
  const cJSON *msg;
  cJSON_ArrayForEach(msg, messages) {
    int rc = check_role(msg, idx, err, errlen);
    if (rc != 0)
      return rc;
    render_header(out, cJSON_GetObjectItemCaseSensitive(msg, "role")->valuestring);
    r->final_content_at = out->len;
    rc = render_content(cJSON_GetObjectItemCaseSensitive(msg, "content"), out, idx, err, errlen);
    if (rc != 0)
      return rc;
    idx++;
    if (r->continue_final && msg->next == NULL)
      return 0; /* transformers cuts the render right after the final message's text */
    kvr_buf_append(out, "\n", 1);
    pad4(out);
  }
  if (r->generation_prompt)
    render_header(out, "assistant");
  return 0;
}

uint64_t kvr_sim_tokens_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t kvr_sim_tokens_seed(const uint32_t *ids, size_t n, uint64_t seed) {
  return XXH3_64bits_withSeed(ids, n * sizeof(*ids), seed);
}

void kvr_sim_tokens_word(uint64_t seed, uint32_t k, char out[KVR_SIM_TOKEN_BYTES]) {
  static const char consonants[] = "bcdfghjklmnprstvwz";
  static const char vowels[] = "aeiou";
  uint64_t h = kvr_sim_tokens_mix(seed ^ kvr_sim_tokens_mix(k));
  out[0] = consonants[h % (sizeof(consonants) - 1)];
  h /= sizeof(consonants) - 1;
  out[1] = vowels[h % (sizeof(vowels) - 1)];
  h /= sizeof(vowels) - 1;
  out[2] = consonants[h % (sizeof(consonants) - 1)];
  out[3] = ' ';
}

uint32_t kvr_sim_tokens_word_id(uint64_t seed, uint32_t k) {
  char w[KVR_SIM_TOKEN_BYTES];
  kvr_sim_tokens_word(seed, k, w);
  return kvr_sim_tokens_id(w, sizeof(w));
}

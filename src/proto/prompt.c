/* prompt.c -- prompt extraction, canonical serialization and prefix-block hashing.
 *
 * What it owns: the kvr_prompt_t of one request (canonical text, model name, block hashes); see
 * prompt.h for the canonical form and the hash chain.
 *
 * Flow: the proxy parses the body once with cJSON and calls kvr_prompt_from_json(), which walks the
 * tree, validates the fields routing depends on (model, messages/prompt, max_tokens, stream),
 * appends the canonical text to a kvr_buf_t and hashes every full block. When the response
 * completes, kvr_prompt_extend_answer() appends the assistant turn and hashes only the new full
 * blocks (the chain continues from the last full block, so earlier hashes are never recomputed).
 *
 * Invariants:
 *   - blocks[i] = XXH3_64(text[i*B .. (i+1)*B), seed = i ? blocks[i-1] : model_seed), and
 *     nblocks == text.len / B at all times.
 *   - Serialization of a message depends only on that message, and each message starts with RS,
 *     so the text of a conversation prefix is a byte prefix of the text of the longer conversation.
 *   - Validation errors leave *out freeable and name the field in err_param.
 *
 * Hashing uses libxxhash's XXH3_64bits_withSeed, inlined (XXH_INLINE_ALL) because the blocks are
 * small (64 bytes) and a call per block would dominate.
 */
#define XXH_INLINE_ALL
#include "proto/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/kvr.h"

void kvr_prompt_init(kvr_prompt_t *p) {
  memset(p, 0, sizeof(*p));
  kvr_buf_init(&p->text);
  p->block_chars = KVR_PROMPT_BLOCK_CHARS_DEFAULT;
}

void kvr_prompt_free(kvr_prompt_t *p) {
  if (p == NULL)
    return;
  free(p->model);
  free(p->blocks);
  free(p->previous_response_id);
  free(p->cache_key);
  free(p->cache_salt);
  kvr_buf_free(&p->text);
  kvr_prompt_init(p);
}

uint64_t kvr_prompt_model_seed(const char *model, size_t len) {
  return XXH3_64bits_withSeed(model, len, 0);
}

size_t kvr_prompt_hash_blocks(const char *text, size_t len, size_t block_chars, uint64_t seed,
                              uint64_t *out) {
  size_t n = len / block_chars;
  uint64_t h = seed;
  for (size_t i = 0; i < n; i++) {
    h = XXH3_64bits_withSeed(text + i * block_chars, block_chars, h);
    out[i] = h;
  }
  return n;
}

/* Hashes the full blocks of p->text that are not hashed yet. */
static void hash_new_blocks(kvr_prompt_t *p) {
  size_t want = p->text.len / p->block_chars;
  if (want <= p->nblocks)
    return;
  if (want > p->blocks_cap) {
    size_t cap = p->blocks_cap ? p->blocks_cap : 16;
    while (cap < want)
      cap *= 2;
    p->blocks = kvr_xrealloc(p->blocks, cap * sizeof(*p->blocks));
    p->blocks_cap = cap;
  }
  uint64_t seed = p->nblocks ? p->blocks[p->nblocks - 1] : p->model_seed;
  const char *from = p->text.data + p->nblocks * p->block_chars;
  p->nblocks += kvr_prompt_hash_blocks(from, p->text.len - p->nblocks * p->block_chars,
                                       p->block_chars, seed, p->blocks + p->nblocks);
}

/* --- validation helpers ------------------------------------------------------------------------
 */

static const char *json_type_name(const cJSON *v) {
  static const struct {
    cJSON_bool (*is)(const cJSON *const);
    const char *name;
  } types[] = {
      {cJSON_IsString, "a string"}, {cJSON_IsNumber, "a number"}, {cJSON_IsBool, "a boolean"},
      {cJSON_IsNull, "null"},       {cJSON_IsArray, "an array"},  {cJSON_IsObject, "an object"},
  };
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
    if (types[i].is(v))
      return types[i].name;
  return "an unknown type";
}

static int fail(kvr_prompt_t *out, const char *code, const char *param, char *err, size_t errlen,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int fail(kvr_prompt_t *out, const char *code, const char *param, char *err, size_t errlen,
                const char *fmt, ...) {
  out->err_code = code;
  snprintf(out->err_param, sizeof(out->err_param), "%s", param);
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return KVR_EINVAL;
}

static int fail_missing(kvr_prompt_t *out, const char *param, char *err, size_t errlen) {
  return fail(out, "missing_required_parameter", param, err, errlen,
              "Missing required parameter: '%s'.", param);
}

static int fail_type(kvr_prompt_t *out, const char *param, const char *expected, const cJSON *got,
                     char *err, size_t errlen) {
  return fail(out, "invalid_type", param, err, errlen,
              "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
              json_type_name(got));
}

/* Appends n as decimal digits. */
static void append_u64(kvr_buf_t *b, uint64_t n) {
  char tmp[24];
  size_t i = sizeof(tmp);
  do {
    tmp[--i] = (char)('0' + n % 10);
    n /= 10;
  } while (n);
  kvr_buf_append(b, tmp + i, sizeof(tmp) - i);
}

static void append_str(kvr_buf_t *b, const cJSON *s) {
  kvr_buf_puts(b, s->valuestring);
}

/* --- chat ------------------------------------------------------------------------------------- */

/* Appends GS + compact JSON of v (tool calls and the like). */
static void append_json(kvr_buf_t *b, const cJSON *v) {
  char *s = cJSON_PrintUnformatted(v);
  if (s == NULL)
    kvr_oom("cJSON_PrintUnformatted", 0);
  kvr_buf_append(b, &(char){KVR_PROMPT_GS}, 1);
  kvr_buf_puts(b, s);
  cJSON_free(s);
}

static int append_content_parts(kvr_prompt_t *out, const cJSON *parts, size_t mi, char *err,
                                size_t errlen) {
  char param[64];
  size_t pi = 0;
  const cJSON *part;
  cJSON_ArrayForEach(part, parts) {
    snprintf(param, sizeof(param), "messages[%zu].content[%zu]", mi, pi);
    if (!cJSON_IsObject(part))
      return fail_type(out, param, "an object", part, err, errlen);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    if (type == NULL) {
      snprintf(param, sizeof(param), "messages[%zu].content[%zu].type", mi, pi);
      return fail_missing(out, param, err, errlen);
    }
    if (!cJSON_IsString(type)) {
      snprintf(param, sizeof(param), "messages[%zu].content[%zu].type", mi, pi);
      return fail_type(out, param, "a string", type, err, errlen);
    }
    if (strcmp(type->valuestring, "text") == 0) {
      const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
      snprintf(param, sizeof(param), "messages[%zu].content[%zu].text", mi, pi);
      if (text == NULL)
        return fail_missing(out, param, err, errlen);
      if (!cJSON_IsString(text))
        return fail_type(out, param, "a string", text, err, errlen);
      append_str(&out->text, text);
    } else {
      /* Non-text parts: the type and what identifies the payload, so two different images never
       * produce the same blocks. */
      kvr_buf_append(&out->text, &(char){KVR_PROMPT_GS}, 1);
      kvr_buf_puts(&out->text, type->valuestring);
      kvr_buf_append(&out->text, &(char){KVR_PROMPT_US}, 1);
      const cJSON *payload = cJSON_GetObjectItemCaseSensitive(part, type->valuestring);
      const cJSON *id = NULL;
      if (cJSON_IsObject(payload)) {
        id = cJSON_GetObjectItemCaseSensitive(payload, "url");
        if (id == NULL)
          id = cJSON_GetObjectItemCaseSensitive(payload, "data");
      } else if (cJSON_IsString(payload)) {
        id = payload;
      }
      if (cJSON_IsString(id))
        append_str(&out->text, id);
    }
    pi++;
  }
  return 0;
}

static int append_messages(kvr_prompt_t *out, const cJSON *messages, char *err, size_t errlen) {
  char param[64];
  size_t mi = 0;
  const cJSON *msg;
  cJSON_ArrayForEach(msg, messages) {
    snprintf(param, sizeof(param), "messages[%zu]", mi);
    if (!cJSON_IsObject(msg))
      return fail_type(out, param, "an object", msg, err, errlen);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    snprintf(param, sizeof(param), "messages[%zu].role", mi);
    if (role == NULL)
      return fail_missing(out, param, err, errlen);
    if (!cJSON_IsString(role))
      return fail_type(out, param, "a string", role, err, errlen);
    kvr_buf_append(&out->text, &(char){KVR_PROMPT_RS}, 1);
    kvr_buf_puts(&out->text, role->valuestring);
    kvr_buf_append(&out->text, &(char){KVR_PROMPT_US}, 1);

    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    snprintf(param, sizeof(param), "messages[%zu].content", mi);
    if (content == NULL || cJSON_IsNull(content)) {
      /* Allowed: an assistant message that only carries tool calls. */
    } else if (cJSON_IsString(content)) {
      append_str(&out->text, content);
    } else if (cJSON_IsArray(content)) {
      int rc = append_content_parts(out, content, mi, err, errlen);
      if (rc)
        return rc;
    } else {
      return fail_type(out, param, "a string or an array of content parts", content, err, errlen);
    }
    const cJSON *tool_calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (tool_calls && !cJSON_IsNull(tool_calls))
      append_json(&out->text, tool_calls);
    const cJSON *tool_call_id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    if (tool_call_id && !cJSON_IsNull(tool_call_id))
      append_json(&out->text, tool_call_id);
    mi++;
  }
  if (mi == 0)
    return fail(out, "empty_array", "messages", err, errlen,
                "Invalid 'messages': empty array. Expected an array with minimum length 1, but "
                "got an empty array instead.");
  return 0;
}

/* --- completions ------------------------------------------------------------------------------ */

/* Appends an array of token ids; counts them into *ntok. */
static int append_token_ids(kvr_prompt_t *out, const cJSON *arr, const char *param, uint64_t *ntok,
                            char *err, size_t errlen) {
  const cJSON *t;
  cJSON_ArrayForEach(t, arr) {
    if (!cJSON_IsNumber(t))
      return fail_type(out, param, "an array of integers", t, err, errlen);
    double d = t->valuedouble;
    if (d < 0 || d > 9007199254740992.0 || d != (double)(uint64_t)d)
      return fail(out, "invalid_value", param, err, errlen,
                  "Invalid value for '%s': token ids must be non-negative integers.", param);
    append_u64(&out->text, (uint64_t)d);
    kvr_buf_append(&out->text, " ", 1);
    (*ntok)++;
  }
  return 0;
}

static int append_completion_prompt(kvr_prompt_t *out, const cJSON *prompt, uint64_t *ntok,
                                    char *err, size_t errlen) {
  if (cJSON_IsString(prompt)) {
    append_str(&out->text, prompt);
    return 0;
  }
  if (!cJSON_IsArray(prompt))
    return fail_type(out, "prompt", "a string or an array", prompt, err, errlen);
  const cJSON *first = prompt->child;
  if (first == NULL)
    return fail(out, "empty_array", "prompt", err, errlen,
                "Invalid 'prompt': empty array. Expected an array with minimum length 1, but got "
                "an empty array instead.");
  if (cJSON_IsNumber(first))
    return append_token_ids(out, prompt, "prompt", ntok, err, errlen);
  /* An array of strings or an array of token-id arrays: join the items with RS. */
  bool strings = cJSON_IsString(first);
  size_t i = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, prompt) {
    char param[32];
    snprintf(param, sizeof(param), "prompt[%zu]", i);
    if (i > 0)
      kvr_buf_append(&out->text, &(char){KVR_PROMPT_RS}, 1);
    if (strings) {
      if (!cJSON_IsString(item))
        return fail_type(out, param, "a string", item, err, errlen);
      append_str(&out->text, item);
    } else {
      if (!cJSON_IsArray(item))
        return fail_type(out, param, "an array of integers", item, err, errlen);
      int rc = append_token_ids(out, item, param, ntok, err, errlen);
      if (rc)
        return rc;
    }
    i++;
  }
  return 0;
}

/* --- responses -------------------------------------------------------------------------------- */

static void append_role(kvr_buf_t *b, const char *role) {
  kvr_buf_append(b, &(char){KVR_PROMPT_RS}, 1);
  kvr_buf_puts(b, role);
  kvr_buf_append(b, &(char){KVR_PROMPT_US}, 1);
}

/* A Responses message item's content: a string, or parts whose input_text/output_text are text
 * and whose other types (input_image, input_file, refusal) are GS type US what identifies them. */
static int append_response_content(kvr_prompt_t *out, const cJSON *content, const char *param,
                                   char *err, size_t errlen) {
  if (cJSON_IsString(content)) {
    append_str(&out->text, content);
    return 0;
  }
  if (!cJSON_IsArray(content))
    return fail_type(out, param, "a string or an array of content parts", content, err, errlen);
  const cJSON *part;
  cJSON_ArrayForEach(part, content) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    if (!cJSON_IsObject(part) || !cJSON_IsString(type))
      return fail_type(out, param, "an array of typed content parts", part, err, errlen);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if ((strcmp(type->valuestring, "input_text") == 0 ||
         strcmp(type->valuestring, "output_text") == 0) &&
        cJSON_IsString(text)) {
      append_str(&out->text, text);
      continue;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(part, "image_url");
    if (!cJSON_IsString(id))
      id = cJSON_GetObjectItemCaseSensitive(part, "file_id");
    kvr_buf_append(&out->text, &(char){KVR_PROMPT_GS}, 1);
    kvr_buf_puts(&out->text, type->valuestring);
    kvr_buf_append(&out->text, &(char){KVR_PROMPT_US}, 1);
    if (cJSON_IsString(id))
      append_str(&out->text, id);
  }
  return 0;
}

/* One item of a Responses "input" list. */
static int append_response_item(kvr_prompt_t *out, const cJSON *item, size_t i, char *err,
                                size_t errlen) {
  char param[64];
  snprintf(param, sizeof param, "input[%zu]", i);
  if (!cJSON_IsObject(item))
    return fail_type(out, param, "an object", item, err, errlen);
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
  const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
  const char *t = cJSON_IsString(type) ? type->valuestring : "message";
  if (strcmp(t, "message") == 0) {
    if (!cJSON_IsString(role)) {
      snprintf(param, sizeof param, "input[%zu].role", i);
      return role ? fail_type(out, param, "a string", role, err, errlen)
                  : fail_missing(out, param, err, errlen);
    }
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
    snprintf(param, sizeof param, "input[%zu].content", i);
    if (content == NULL)
      return fail_missing(out, param, err, errlen);
    append_role(&out->text, role->valuestring);
    return append_response_content(out, content, param, err, errlen);
  }
  if (strcmp(t, "reasoning") == 0)
    return 0; /* not part of the prompt vLLM renders from stored history */
  /* function_call (the assistant's), function_call_output (the tool's), and what else the API
   * adds: the role that carries it, then the item as compact JSON. */
  append_role(&out->text, strcmp(t, "function_call_output") == 0 ? "tool" : "assistant");
  append_json(&out->text, item);
  return 0;
}

static int append_responses(kvr_prompt_t *out, const cJSON *body, char *err, size_t errlen) {
  const cJSON *instructions = cJSON_GetObjectItemCaseSensitive(body, "instructions");
  if (instructions && !cJSON_IsNull(instructions)) {
    if (!cJSON_IsString(instructions))
      return fail_type(out, "instructions", "a string", instructions, err, errlen);
    append_role(&out->text, "system");
    append_str(&out->text, instructions);
  }
  const cJSON *input = cJSON_GetObjectItemCaseSensitive(body, "input");
  if (input == NULL)
    return fail_missing(out, "input", err, errlen);
  if (cJSON_IsString(input)) {
    append_role(&out->text, "user");
    append_str(&out->text, input);
    return 0;
  }
  if (!cJSON_IsArray(input))
    return fail_type(out, "input", "a string or an array of input items", input, err, errlen);
  size_t i = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, input) {
    int rc = append_response_item(out, item, i++, err, errlen);
    if (rc)
      return rc;
  }
  return 0;
}

/* "previous_response_id" and "store" of a Responses request. */
static int response_options(kvr_prompt_t *out, const cJSON *body, char *err, size_t errlen) {
  const cJSON *prev = cJSON_GetObjectItemCaseSensitive(body, "previous_response_id");
  if (prev && !cJSON_IsNull(prev)) {
    if (!cJSON_IsString(prev))
      return fail_type(out, "previous_response_id", "a string", prev, err, errlen);
    out->previous_response_id = kvr_xstrdup(prev->valuestring);
  }
  const cJSON *store = cJSON_GetObjectItemCaseSensitive(body, "store");
  out->store = true;
  if (store && !cJSON_IsNull(store)) {
    if (!cJSON_IsBool(store))
      return fail_type(out, "store", "a boolean", store, err, errlen);
    out->store = cJSON_IsTrue(store);
  }
  return 0;
}

/* --- messages (Anthropic) --------------------------------------------------------------------- */

/* Content blocks of a Messages message: text is text; other blocks (image, tool_use, tool_result,
 * document) are GS type US compact JSON of the block, so different payloads never look alike;
 * thinking blocks are left out (they are not part of the next turn's prompt). */
static int append_message_blocks(kvr_prompt_t *out, const cJSON *blocks, const char *param,
                                 char *err, size_t errlen) {
  const cJSON *b;
  cJSON_ArrayForEach(b, blocks) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
    if (!cJSON_IsObject(b) || !cJSON_IsString(type))
      return fail_type(out, param, "an array of typed content blocks", b, err, errlen);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
    if (strcmp(type->valuestring, "text") == 0 && cJSON_IsString(text)) {
      append_str(&out->text, text);
    } else if (strcmp(type->valuestring, "thinking") != 0 &&
               strcmp(type->valuestring, "redacted_thinking") != 0) {
      kvr_buf_append(&out->text, &(char){KVR_PROMPT_GS}, 1);
      kvr_buf_puts(&out->text, type->valuestring);
      kvr_buf_append(&out->text, &(char){KVR_PROMPT_US}, 1);
      append_json(&out->text, b);
    }
  }
  return 0;
}

/* "system": a string, or text blocks joined with no separator (vLLM's anthropic/serving.py drops
 * the ones starting with "x-anthropic-billing-header"). */
static int append_system(kvr_prompt_t *out, const cJSON *system, char *err, size_t errlen) {
  if (system == NULL || cJSON_IsNull(system))
    return 0;
  if (cJSON_IsString(system)) {
    append_role(&out->text, "system");
    append_str(&out->text, system);
    return 0;
  }
  if (!cJSON_IsArray(system))
    return fail_type(out, "system", "a string or an array of text blocks", system, err, errlen);
  append_role(&out->text, "system");
  const cJSON *b;
  cJSON_ArrayForEach(b, system) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
    if (!cJSON_IsObject(b) || !cJSON_IsString(text))
      return fail_type(out, "system", "an array of text blocks", b, err, errlen);
    if (strncmp(text->valuestring, "x-anthropic-billing-header", 26) != 0)
      append_str(&out->text, text);
  }
  return 0;
}

static int append_anthropic(kvr_prompt_t *out, const cJSON *body, char *err, size_t errlen) {
  int rc = append_system(out, cJSON_GetObjectItemCaseSensitive(body, "system"), err, errlen);
  if (rc)
    return rc;
  const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
  if (messages == NULL)
    return fail_missing(out, "messages", err, errlen);
  if (!cJSON_IsArray(messages))
    return fail_type(out, "messages", "an array", messages, err, errlen);
  size_t mi = 0;
  const cJSON *msg;
  cJSON_ArrayForEach(msg, messages) {
    char param[64];
    snprintf(param, sizeof param, "messages[%zu]", mi);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!cJSON_IsObject(msg) || !cJSON_IsString(role))
      return fail_type(out, param, "an object with a string role", msg, err, errlen);
    snprintf(param, sizeof param, "messages[%zu].content", mi);
    if (content == NULL)
      return fail_missing(out, param, err, errlen);
    append_role(&out->text, role->valuestring);
    if (cJSON_IsString(content))
      append_str(&out->text, content);
    else if (!cJSON_IsArray(content))
      return fail_type(out, param, "a string or an array of content blocks", content, err, errlen);
    else if ((rc = append_message_blocks(out, content, param, err, errlen)) != 0)
      return rc;
    mi++;
  }
  return 0;
}

/* "max_tokens" is required by the Messages API and must be positive (vLLM's anthropic/protocol.py).
 */
static int anthropic_options(kvr_prompt_t *out, const cJSON *body, char *err, size_t errlen) {
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens");
  if (mt == NULL)
    return fail_missing(out, "max_tokens", err, errlen);
  if (!cJSON_IsNumber(mt) || mt->valuedouble < 1)
    return fail(out, "invalid_value", "max_tokens", err, errlen,
                "Invalid value for 'max_tokens': expected a positive integer.");
  return 0;
}

/* "cache_salt" (vLLM: chat, completions, responses; a non-empty string) as an extra key of the
 * first block: h_0 = XXH3_64(salt, seed = XXH3_64(model)). */
static int apply_salt(kvr_prompt_t *out, const cJSON *body, char *err, size_t errlen) {
  const cJSON *salt = cJSON_GetObjectItemCaseSensitive(body, "cache_salt");
  if (salt == NULL || cJSON_IsNull(salt) || out->kind == KVR_PROMPT_MESSAGES)
    return 0;
  if (!cJSON_IsString(salt))
    return fail_type(out, "cache_salt", "a string", salt, err, errlen);
  if (salt->valuestring[0] == '\0')
    return fail(out, "invalid_value", "cache_salt", err, errlen,
                "Parameter 'cache_salt' must be a non-empty string if provided.");
  out->model_seed =
      XXH3_64bits_withSeed(salt->valuestring, strlen(salt->valuestring), out->model_seed);
  out->salted = true;
  free(out->cache_salt);
  out->cache_salt = kvr_xstrdup(salt->valuestring);
  return 0;
}

/* --- entry points ----------------------------------------------------------------------------- */

static int parse_options(kvr_prompt_t *out, const cJSON *body, char *err, size_t errlen) {
  static const char *const names[] = {"max_completion_tokens", "max_tokens", "max_output_tokens"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(names); i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, names[i]);
    if (v == NULL || cJSON_IsNull(v))
      continue;
    if (!cJSON_IsNumber(v))
      return fail_type(out, names[i], "an integer", v, err, errlen);
    double d = v->valuedouble;
    if (d < 0 || d > 1e15 || d != (double)(uint64_t)d)
      return fail(out, "invalid_value", names[i], err, errlen,
                  "Invalid value for '%s': expected a non-negative integer.", names[i]);
    if (out->max_tokens == 0)
      out->max_tokens = (uint64_t)d;
  }
  const cJSON *stream = cJSON_GetObjectItemCaseSensitive(body, "stream");
  if (stream && !cJSON_IsNull(stream)) {
    if (!cJSON_IsBool(stream))
      return fail_type(out, "stream", "a boolean", stream, err, errlen);
    out->stream = cJSON_IsTrue(stream);
  }
  return 0;
}

int kvr_prompt_from_json(const cJSON *body, kvr_prompt_kind_t kind, size_t block_chars,
                         kvr_prompt_t *out, char *err, size_t errlen) {
  kvr_prompt_init(out);
  out->kind = kind;
  if (block_chars == 0 || block_chars > KVR_PROMPT_BLOCK_CHARS_MAX)
    return fail(out, "invalid_value", "block_chars", err, errlen, "block_chars must be in 1..%d",
                KVR_PROMPT_BLOCK_CHARS_MAX);
  out->block_chars = block_chars;
  if (!cJSON_IsObject(body))
    return fail(out, "invalid_type", "", err, errlen,
                "Invalid request body: expected a JSON object, but got %s instead.",
                json_type_name(body));

  const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
  bool null_model = kind == KVR_PROMPT_RESPONSES && cJSON_IsNull(model); /* the base model */
  if (model == NULL && kind != KVR_PROMPT_RESPONSES)
    return fail_missing(out, "model", err, errlen);
  if (model != NULL && !null_model && !cJSON_IsString(model))
    return fail_type(out, "model", "a string", model, err, errlen);
  if (kind == KVR_PROMPT_MESSAGES && model->valuestring[0] == '\0')
    return fail(out, "invalid_value", "model", err, errlen, "Parameter 'model' must not be empty.");

  int rc = parse_options(out, body, err, errlen);
  if (rc)
    return rc;

  if (kind == KVR_PROMPT_MESSAGES && (rc = anthropic_options(out, body, err, errlen)) != 0)
    return rc;
  if (kind == KVR_PROMPT_RESPONSES && (rc = response_options(out, body, err, errlen)) != 0)
    return rc;
  uint64_t ntok = 0;
  if (kind == KVR_PROMPT_RESPONSES) {
    rc = append_responses(out, body, err, errlen);
  } else if (kind == KVR_PROMPT_MESSAGES) {
    rc = append_anthropic(out, body, err, errlen);
  } else if (kind == KVR_PROMPT_CHAT) {
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages");
    if (messages == NULL)
      return fail_missing(out, "messages", err, errlen);
    if (!cJSON_IsArray(messages))
      return fail_type(out, "messages", "an array", messages, err, errlen);
    rc = append_messages(out, messages, err, errlen);
  } else {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (prompt == NULL)
      return fail_missing(out, "prompt", err, errlen);
    rc = append_completion_prompt(out, prompt, &ntok, err, errlen);
  }
  if (rc) {
    kvr_buf_free(&out->text);
    return rc;
  }

  out->model = kvr_xstrdup(cJSON_IsString(model) ? model->valuestring : "");
  size_t mlen = strlen(out->model);
  out->model_seed = kvr_prompt_model_seed(out->model, mlen);
  if ((rc = apply_salt(out, body, err, errlen)) != 0) {
    kvr_buf_free(&out->text);
    return rc;
  }
  const cJSON *key = cJSON_GetObjectItemCaseSensitive(body, "prompt_cache_key");
  if (key && !cJSON_IsNull(key) && kind != KVR_PROMPT_MESSAGES) {
    if (!cJSON_IsString(key)) {
      kvr_buf_free(&out->text);
      return fail_type(out, "prompt_cache_key", "a string", key, err, errlen);
    }
    if (key->valuestring[0])
      out->cache_key = kvr_xstrdup(key->valuestring);
  }
  /* Token ids are counted exactly; text is estimated at KVR_CHARS_PER_TOKEN bytes per token. */
  out->prompt_tokens =
      ntok ? ntok : (out->text.len + KVR_CHARS_PER_TOKEN - 1) / KVR_CHARS_PER_TOKEN;
  if (out->text.len == 0)
    kvr_buf_reserve(&out->text, 0);      /* data is never NULL after success */
  if (out->previous_response_id == NULL) /* chained: the worker holds the history (prompt.h) */
    hash_new_blocks(out);
  return 0;
}

int kvr_prompt_extend_answer(kvr_prompt_t *p, const char *answer, size_t len) {
  if (p->previous_response_id != NULL)
    return 0; /* chained: nothing was hashed, nothing to extend */
  if (p->kind != KVR_PROMPT_COMPLETIONS) {
    static const char head[] = {KVR_PROMPT_RS, 'a', 's', 's', 'i',          's',
                                't',           'a', 'n', 't', KVR_PROMPT_US};
    kvr_buf_append(&p->text, head, sizeof(head));
  }
  kvr_buf_append(&p->text, answer, len);
  hash_new_blocks(p);
  return 0;
}

void kvr_prompt_route_req(const kvr_prompt_t *p, kvr_route_req_t *req) {
  req->blocks = p->blocks;
  req->nblocks = p->nblocks;
  req->block_chars = p->block_chars;
  req->prompt_tokens = p->prompt_tokens;
  req->max_tokens = p->max_tokens;
}

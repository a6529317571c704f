/* json_guard.c -- strict JSON, limits and duplicate keys in one pass over a body's raw bytes.
 *
 * What it owns: nothing that outlives kvr_json_guard_check(). During the call, a guard_t holds
 * the stack of open containers (frame_t, one per nesting level) and, for the duplicate-key check,
 * the keys of the objects still open: a stack of them (kent_t, in document order) and an
 * open-addressing table (slot_t) keyed by (hash of the unescaped key, serial of its object).
 *
 * Flow. value() reads one value: a scalar whole, or a container's opening bracket (a frame is
 * pushed). step() then advances the top frame by one token: its first member or element, the ','
 * before the next one, or the closing bracket (the frame is popped, and an object's keys leave
 * the table). check() runs value() once and step() until no frame is open, then refuses anything
 * but whitespace after the value.
 *
 *   value: ws; an array element counts in its array (max_messages, max_parts; a number in a
 *          prompt array: max_prompt_tokens); the value counts (max_nodes); then
 *          '{' '[' -> push a frame (max_depth) | '"' string | number | true false null
 *   step:  first: closer -> pop | item;   after: ',' -> item | closer -> pop
 *          item: in an object, a key string (max_open_keys, duplicate check) and ':'; a value
 *
 * Roles. A frame knows what it is for, from its parent and the member it is the value of: the
 * top-level object (ROOT); its "messages" array in a chat body (MESSAGES), whose objects
 * (MESSAGE) have a "content" array (PARTS); its "prompt" array in a completions body (PROMPT),
 * whose arrays are prompts of their own (PROMPT_ITEM). Member names are compared unescaped, as
 * Python compares them ("messag\u0065s" is "messages"). The token-id rule follows vLLM:
 * CompletionRequest.prompt is list[int] | list[list[int]] | str | list[str]
 * (vllm/entrypoints/openai/completion/protocol.py) and each prompt is checked on its own against
 * max_model_len (TokenizeParams._token_len_check in vllm/renderers/params.py raises a
 * VLLMValidationError, answered 400 BadRequestError by
 * vllm/entrypoints/serve/utils/error_response.py); a chat request has no token-id input, and
 * prompt_embeds are base64 strings, not counted.
 *
 * Duplicate keys. Each key of an object is hashed (XXH3 of its unescaped bytes, seeded by
 * lim->seed: one call over the raw bytes when the key has no escape, else over a decoded copy of
 * up to 256 bytes, the streaming API beyond) and inserted with its object's serial. A slot with
 * the same hash and serial is compared byte by byte (both keys decoded again), so the verdict is
 * exact: a collision costs a comparison, never a false duplicate. Closing an object deletes its
 * keys (backward-shift deletion, no tombstones), or rebuilds the table from the keys still open
 * when the closing object held many of them; so the table holds exactly the keys of the open
 * objects.
 *
 * Invariants: every key in the table was fully validated before it was inserted (the decoder
 * trusts it); the table is at most half full; frames <= max_depth; keys held <= max_open_keys
 * (48 bytes each: a kent_t and two slot_t); so the heap is O(depth + keys of the open objects),
 * bounded by the limits before it is allocated (STYLE.md): under 3 KiB for a body whose objects
 * hold fewer than 32 keys, whatever its length. Offsets are uint32_t: a body of 4 GiB or more is
 * refused (NODES) before its first byte is read.
 *
 * Against Python's json.loads, what vLLM reads bodies with (FastAPI's request handler calls
 * Starlette's Request.json(), json.loads(body); a JSONDecodeError becomes a RequestValidationError
 * and any other exception, UnicodeDecodeError included, an HTTPException 400 "There was an error
 * parsing the body": fastapi/routing.py; vLLM's validation_exception_handler answers the former
 * 400 too: vllm/entrypoints/serve/utils/server_utils.py):
 *   - the same: RFC 8259 grammar, whitespace " \t\n\r" only, raw bytes < 0x20 in strings refused
 *     (strict=True), anything but whitespace after the value refused ("Extra data"), escapes
 *     \" \\ \/ \b \f \n \r \t \uXXXX with exactly four hex digits, invalid UTF-8 refused, a
 *     leading UTF-8 BOM accepted (json.loads decodes bytes as utf-8-sig; cJSON skips it too);
 *   - stricter, where cJSON already refused the body or the value could not reach a tokenizer:
 *     NaN, Infinity and -Infinity (json.loads accepts them, RFC 8259 and cJSON do not); lone
 *     UTF-16 surrogates in \u escapes (json.loads makes a str of them, cJSON fails the parse, and
 *     a str with a lone surrogate has no UTF-8 form for the tokenizer); UTF-8-encoded surrogates
 *     ED A0..BF (json.loads decodes bytes with surrogatepass); UTF-16/32 bodies (json.loads
 *     detects them, RFC 8259 section 8.1 requires UTF-8);
 *   - duplicate keys refused: json.loads keeps the last, cJSON the first; refusing is the only
 *     answer on which the router and the worker cannot disagree;
 *   - "\u0000" accepted (both accept it) and reported: cJSON's strings end at it, so the text the
 *     router hashes is cut there while the worker reads all of it.
 */
#define XXH_INLINE_ALL
#include "proto/json_guard.h"

#include "base/kvr.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- rules ------------------------------------------------------------------------------------
 */

static const struct {
  const char *name;
  int status;
  const char *code;
} rules[] = {
#define XX(name, status, code) {#name, status, code},
    KVR_JSON_GUARD_RULES(XX)
#undef XX
};

const char *kvr_json_guard_rule_name(kvr_json_guard_rule_t rule) {
  if ((unsigned)rule >= KVR_ARRAY_SIZE(rules))
    return "UNKNOWN";
  return rules[rule].name;
}

void kvr_json_guard_limits_default(kvr_json_guard_limits_t *lim) {
  lim->max_depth = KVR_JSON_GUARD_MAX_DEPTH_DEFAULT;
  lim->max_nodes = KVR_JSON_GUARD_MAX_NODES_DEFAULT;
  lim->max_open_keys = KVR_JSON_GUARD_MAX_OPEN_KEYS_DEFAULT;
  lim->max_prompt_tokens = KVR_JSON_GUARD_MAX_PROMPT_TOKENS_DEFAULT;
  lim->max_messages = KVR_JSON_GUARD_MAX_MESSAGES_DEFAULT;
  lim->max_parts = KVR_JSON_GUARD_MAX_PARTS_DEFAULT;
  lim->seed = 0;
}

/* ---- state ------------------------------------------------------------------------------------
 */

enum {
  ROLE_NONE,
  ROLE_ROOT,
  ROLE_MESSAGES,
  ROLE_MESSAGE,
  ROLE_PARTS,
  ROLE_PROMPT,
  ROLE_PROMPT_ITEM
};
enum { MEMBER_OTHER, MEMBER_MESSAGES, MEMBER_PROMPT, MEMBER_CONTENT };
enum { ST_FIRST, ST_ITEM, ST_AFTER }; /* just opened / after ',' / after a member or element */

#define NO_KEY UINT32_MAX

typedef struct frame_s {
  uint64_t count;   /* elements (arrays) or members (objects) begun */
  uint64_t tokens;  /* numbers seen (PROMPT, PROMPT_ITEM) */
  size_t kbase;     /* objects: its first key in g->keys */
  uint32_t key_off; /* objects: opening quote of the current member's key, NO_KEY before one */
  uint32_t serial;  /* objects: tags its keys in the table */
  uint8_t kind;     /* '{' or '[' */
  uint8_t role;     /* ROLE_* */
  uint8_t member;   /* objects: MEMBER_* of the current key */
  uint8_t state;    /* ST_* */
} frame_t;

typedef struct kent_s { /* a key of an open object, in document order */
  uint64_t h;
  uint32_t off;
} kent_t;

typedef struct slot_s { /* table slot; serial 0: empty */
  uint64_t h;
  uint32_t off;
  uint32_t serial;
} slot_t;

typedef struct guard_s {
  const unsigned char *s;
  size_t len, pos;
  kvr_json_guard_kind_t kind;
  const kvr_json_guard_limits_t *lim;
  kvr_json_guard_verdict_t *v;
  frame_t *frames; /* owned; [0, nframes) open, innermost last */
  size_t nframes, frames_cap;
  kent_t *keys; /* owned */
  size_t nkeys, keys_cap;
  slot_t *table; /* owned; tcap slots, a power of two, or NULL */
  size_t tcap, tcount;
  uint32_t serials;   /* objects opened so far */
  unsigned char ctrl; /* the byte a CONTROL verdict names */
  bool whole_array;   /* the verdict names the innermost array, not its element */
  size_t heap;        /* bytes held in frames, keys and table */
} guard_t;

static void account(guard_t *g) {
  g->heap =
      g->frames_cap * sizeof(frame_t) + g->keys_cap * sizeof(kent_t) + g->tcap * sizeof(slot_t);
  if (g->heap > g->v->peak_bytes)
    g->v->peak_bytes = g->heap;
}

static frame_t *top(guard_t *g) {
  return g->nframes ? &g->frames[g->nframes - 1] : NULL;
}

/* ---- decoding validated strings ---------------------------------------------------------------
 */

/* Reads the unescaped bytes of a string already validated by scan_string(), from its opening
 * quote: dec_next() gives the next byte, or -1 at the closing quote. */
typedef struct dec_s {
  const unsigned char *s;
  size_t i;
  unsigned char buf[4];
  unsigned n, k;
} dec_t;

static void dec_init(dec_t *d, const unsigned char *s, size_t quote) {
  d->s = s;
  d->i = quote + 1;
  d->n = d->k = 0;
}

static uint32_t hex4(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = p[i];
    v = v << 4 | (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
  }
  return v;
}

static unsigned utf8_encode(uint32_t cp, unsigned char *out) {
  if (cp < 0x80) {
    out[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (unsigned char)(0xC0 | cp >> 6);
    out[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (unsigned char)(0xE0 | cp >> 12);
    out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (unsigned char)(0xF0 | cp >> 18);
  out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  out[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* The code point of the \u escape at p ("\uXXXX", or a surrogate pair "\uD8XX\uDCXX"); *n is
 * its length in bytes. */
static uint32_t escape_cp(const unsigned char *p, size_t *n) {
  uint32_t cp = hex4(p + 2);
  *n = 6;
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(p + 8) - 0xDC00);
    *n = 12;
  }
  return cp;
}

static int dec_next(dec_t *d) {
  if (d->k < d->n)
    return d->buf[d->k++];
  unsigned char c = d->s[d->i];
  if (c == '"')
    return -1;
  if (c != '\\') {
    d->i++;
    return c;
  }
  static const char from[] = "bfnrt", to[] = "\b\f\n\r\t";
  c = d->s[d->i + 1];
  const char *m = c ? strchr(from, c) : NULL;
  if (c != 'u') {
    d->i += 2;
    return m ? to[m - from] : c; /* \" \\ \/ stand for themselves */
  }
  size_t n;
  d->n = utf8_encode(escape_cp(d->s + d->i, &n), d->buf);
  d->i += n;
  d->k = 1;
  return d->buf[0];
}

/* True if the validated string at quote unescapes to lit[0..n). */
static bool str_is(const unsigned char *s, size_t quote, const char *lit, size_t n) {
  dec_t d;
  dec_init(&d, s, quote);
  for (size_t i = 0; i < n; i++)
    if (dec_next(&d) != (unsigned char)lit[i])
      return false;
  return dec_next(&d) == -1;
}

static bool str_equal(const unsigned char *s, size_t qa, size_t qb) {
  dec_t a, b;
  dec_init(&a, s, qa);
  dec_init(&b, s, qb);
  for (;;) {
    int ca = dec_next(&a), cb = dec_next(&b);
    if (ca != cb)
      return false;
    if (ca < 0)
      return true;
  }
}

/* XXH3 of the unescaped bytes of the validated string [quote, end]: one call over the raw bytes
 * without escapes, or over a decoded copy in buf while it fits, else the streaming API. */
static uint64_t str_hash(const unsigned char *s, size_t quote, size_t end, bool escaped,
                         uint64_t seed) {
  if (!escaped)
    return XXH3_64bits_withSeed(s + quote + 1, end - quote - 1, seed);
  unsigned char buf[256];
  size_t n = 0;
  dec_t d;
  dec_init(&d, s, quote);
  int c;
  while (n < sizeof buf && (c = dec_next(&d)) >= 0)
    buf[n++] = (unsigned char)c;
  if (n < sizeof buf)
    return XXH3_64bits_withSeed(buf, n, seed);
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, seed);
  do {
    XXH3_64bits_update(&st, buf, n);
    for (n = 0; n < sizeof buf && (c = dec_next(&d)) >= 0;)
      buf[n++] = (unsigned char)c;
  } while (n == sizeof buf);
  XXH3_64bits_update(&st, buf, n);
  return XXH3_64bits_digest(&st);
}

/* ---- verdicts ---------------------------------------------------------------------------------
 */

static void append(char *out, size_t cap, size_t *n, const char *s, size_t len) {
  for (size_t i = 0; i < len && *n + 1 < cap; i++)
    out[(*n)++] = s[i];
  out[*n] = '\0';
}

/* Appends the unescaped key at quote, printable ASCII only (other bytes as '?'), at most 48. */
static void append_key(char *out, size_t cap, size_t *n, const unsigned char *s, size_t quote) {
  dec_t d;
  dec_init(&d, s, quote);
  size_t k = 0;
  for (int c; (c = dec_next(&d)) >= 0; k++) {
    if (k == 48) {
      append(out, cap, n, "...", 3);
      return;
    }
    char ch = c >= 0x20 && c < 0x7F ? (char)c : '?';
    append(out, cap, n, &ch, 1);
  }
}

/* The member being read: every open frame's current key ("a.b") or element index ("[3]"); with
 * g->whole_array, the innermost array itself. */
static void build_path(guard_t *g, char *out, size_t cap) {
  size_t n = 0, nframes = g->nframes - (g->whole_array && g->nframes);
  out[0] = '\0';
  for (size_t i = 0; i < nframes; i++) {
    const frame_t *f = &g->frames[i];
    if (f->kind == '{' && f->key_off != NO_KEY) {
      if (n)
        append(out, cap, &n, ".", 1);
      append_key(out, cap, &n, g->s, f->key_off);
    } else if (f->kind == '[' && f->count) {
      char idx[24];
      int k = snprintf(idx, sizeof idx, "[%llu]", (unsigned long long)(f->count - 1));
      append(out, cap, &n, idx, (size_t)k);
    }
  }
  if (n + 1 == cap && cap > 4)
    memcpy(out + cap - 4, "...", 4);
}

static void describe(guard_t *g, const char *why) {
  kvr_json_guard_verdict_t *v = g->v;
  const kvr_json_guard_limits_t *l = g->lim;
  const char *at = v->path[0] ? v->path : "(top level)";
  char *m = v->message;
  size_t n = sizeof v->message;
  unsigned long long off = v->offset;
  switch (v->rule) {
  case KVR_JSON_GUARD_EMPTY:
    snprintf(m, n, "The request body is empty: it must be a JSON object.");
    break;
  case KVR_JSON_GUARD_SYNTAX:
    snprintf(m, n, "Invalid JSON at byte %llu ('%s'): %s.", off, at, why);
    break;
  case KVR_JSON_GUARD_UTF8:
    snprintf(m, n, "Invalid UTF-8 at byte %llu ('%s'): the body must be UTF-8 text.", off, at);
    break;
  case KVR_JSON_GUARD_CONTROL:
    snprintf(m, n,
             "Invalid JSON at byte %llu ('%s'): raw control character 0x%02x in a string; "
             "control characters must be escaped.",
             off, at, g->ctrl);
    break;
  case KVR_JSON_GUARD_TRAILING:
    snprintf(m, n, "Invalid JSON at byte %llu: data after the JSON value.", off);
    break;
  case KVR_JSON_GUARD_DEPTH:
    snprintf(m, n, "JSON nested deeper than %u levels at '%s'.", (unsigned)l->max_depth, at);
    break;
  case KVR_JSON_GUARD_DUPLICATE:
    snprintf(m, n, "Duplicate key '%s': a key may appear only once in an object.", at);
    break;
  case KVR_JSON_GUARD_TOKENS:
    snprintf(m, n,
             "Invalid '%s': more than %llu token ids; the maximum context length is %llu "
             "tokens. Please reduce the length of the prompt.",
             at, (unsigned long long)l->max_prompt_tokens,
             (unsigned long long)l->max_prompt_tokens);
    break;
  case KVR_JSON_GUARD_NODES:
    if (why) {
      snprintf(m, n, "The request body is too large: %s.", why);
      break;
    }
    snprintf(m, n, "The request body has more than %llu JSON values (limit passed at '%s').",
             (unsigned long long)l->max_nodes, at);
    break;
  case KVR_JSON_GUARD_KEYS:
    snprintf(m, n,
             "Too many object keys at '%s': more than %llu in one object and the objects "
             "around it.",
             at, (unsigned long long)l->max_open_keys);
    break;
  case KVR_JSON_GUARD_MESSAGES:
    snprintf(m, n, "Invalid 'messages': more than %llu messages (the limit is %llu).",
             (unsigned long long)l->max_messages, (unsigned long long)l->max_messages);
    break;
  case KVR_JSON_GUARD_PARTS:
    snprintf(m, n, "Invalid '%s': more than %llu content parts (the limit is %llu).", at,
             (unsigned long long)l->max_parts, (unsigned long long)l->max_parts);
    break;
  default:
    m[0] = '\0';
  }
}

/* Records the first broken rule, seen at byte at; returns the check's result code. */
static int fail(guard_t *g, kvr_json_guard_rule_t rule, size_t at, const char *why) {
  kvr_json_guard_verdict_t *v = g->v;
  v->rule = rule;
  v->status = rules[rule].status;
  v->code = rules[rule].code;
  v->offset = at;
  build_path(g, v->path, sizeof v->path);
  describe(g, why);
  return rule >= KVR_JSON_GUARD_TOKENS ? KVR_ELIMIT : KVR_EPARSE;
}

static int syntax(guard_t *g, size_t at, const char *why) {
  return fail(g, KVR_JSON_GUARD_SYNTAX, at, why);
}

/* ---- duplicate keys ---------------------------------------------------------------------------
 */

static size_t home(const guard_t *g, uint64_t h, uint32_t serial) {
  uint64_t x = h ^ (uint64_t)serial * UINT64_C(0x9E3779B97F4A7C15);
  return (size_t)(x ^ x >> 32) & (g->tcap - 1);
}

static void place(guard_t *g, slot_t e) {
  size_t i = home(g, e.h, e.serial);
  while (g->table[i].serial)
    i = (i + 1) & (g->tcap - 1);
  g->table[i] = e;
}

static void table_grow(guard_t *g) {
  slot_t *old = g->table;
  size_t ocap = g->tcap;
  g->tcap = ocap ? ocap * 2 : 64;
  g->table = kvr_xcalloc(g->tcap, sizeof(slot_t));
  for (size_t i = 0; i < ocap; i++)
    if (old[i].serial)
      place(g, old[i]);
  free(old);
  account(g);
}

/* Inserts the key at off (hash h) of object serial; returns the quote of an equal key already in
 * that object, or NO_KEY. */
static uint32_t table_insert(guard_t *g, uint64_t h, uint32_t off, uint32_t serial) {
  if ((g->tcount + 1) * 2 > g->tcap)
    table_grow(g);
  size_t i = home(g, h, serial);
  for (; g->table[i].serial; i = (i + 1) & (g->tcap - 1)) {
    const slot_t *e = &g->table[i];
    if (e->serial == serial && e->h == h && str_equal(g->s, e->off, off))
      return e->off;
  }
  g->table[i] = (slot_t){h, off, serial};
  g->tcount++;
  return NO_KEY;
}

/* Removes the key at off of object serial (present), shifting back the slots after it so that
 * no probe chain is broken (Knuth, TAOCP 6.4, Algorithm R). */
static void table_delete(guard_t *g, uint64_t h, uint32_t off, uint32_t serial) {
  size_t mask = g->tcap - 1, i = home(g, h, serial);
  while (g->table[i].serial != serial || g->table[i].off != off)
    i = (i + 1) & mask;
  for (size_t j = i;;) {
    j = (j + 1) & mask;
    if (g->table[j].serial == 0)
      break;
    size_t k = home(g, g->table[j].h, g->table[j].serial);
    if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
      continue; /* its home lies between the hole and it: it stays */
    g->table[i] = g->table[j];
    i = j;
  }
  g->table[i].serial = 0;
  g->tcount--;
}

/* ---- scanning ---------------------------------------------------------------------------------
 */

enum { C_PLAIN, C_QUOTE, C_ESCAPE, C_CONTROL, C_HIGH };

/* Class of each byte inside a string. */
static unsigned char str_class(unsigned char c) {
  if (c == '"')
    return C_QUOTE;
  if (c == '\\')
    return C_ESCAPE;
  if (c < 0x20)
    return C_CONTROL;
  return c >= 0x80 ? C_HIGH : C_PLAIN;
}

/* The first byte at or after i that is not plain string text (a quote, a backslash, < 0x20 or
 * >= 0x80), or len. Eight bytes at a time while they are plain (a word with any other byte, or
 * a false alarm, goes to the byte loop, which decides). */
static size_t plain_run(const unsigned char *s, size_t i, size_t len) {
  const uint64_t ones = UINT64_C(0x0101010101010101), highs = ones * 0x80;
  while (len - i >= 8) {
    uint64_t x, q, b;
    memcpy(&x, s + i, 8);
    q = x ^ ones * '"';
    b = x ^ ones * '\\';
    if ((((q - ones) & ~q) | ((b - ones) & ~b) | (x - ones * 0x20) | x) & highs)
      break;
    i += 8;
  }
  while (i < len && str_class(s[i]) == C_PLAIN)
    i++;
  return i;
}

static void skip_ws(guard_t *g) {
  while (g->pos < g->len) {
    unsigned char c = g->s[g->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      return;
    g->pos++;
  }
}

static bool is_hex(unsigned char c) {
  return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

static bool hex_at(const guard_t *g, size_t i) {
  if (g->len - i < 4)
    return false;
  for (int k = 0; k < 4; k++)
    if (!is_hex(g->s[i + k]))
      return false;
  return true;
}

/* The \u escape at *i (its backslash): four hex digits, a surrogate pair whole. */
static int scan_unicode(guard_t *g, size_t *i) {
  size_t at = *i;
  if (!hex_at(g, at + 2))
    return syntax(g, at, "\\u must be followed by four hex digits");
  uint32_t cp = hex4(g->s + at + 2);
  if (cp >= 0xDC00 && cp <= 0xDFFF)
    return syntax(g, at, "lone UTF-16 surrogate in a \\u escape");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    bool pair = g->len - at >= 12 && g->s[at + 6] == '\\' && g->s[at + 7] == 'u' &&
                hex_at(g, at + 8) && hex4(g->s + at + 8) >= 0xDC00 && hex4(g->s + at + 8) <= 0xDFFF;
    if (!pair)
      return syntax(g, at, "lone UTF-16 surrogate in a \\u escape");
    *i = at + 12;
    return 0;
  }
  if (cp == 0)
    g->v->has_nul = true;
  *i = at + 6;
  return 0;
}

static int scan_escape(guard_t *g, size_t *i) {
  size_t at = *i;
  if (at + 1 >= g->len)
    return syntax(g, at, "unterminated string");
  unsigned char c = g->s[at + 1];
  if (c == 'u')
    return scan_unicode(g, i);
  if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
      c == 't') {
    *i = at + 2;
    return 0;
  }
  return syntax(g, at, "invalid escape");
}

/* One UTF-8 sequence at *i (its lead byte >= 0x80), strictly: no overlong forms, no surrogates,
 * nothing above U+10FFFF (Unicode Table 3-7). */
static int scan_utf8(guard_t *g, size_t *i) {
  const unsigned char *p = g->s + *i;
  size_t left = g->len - *i, n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (p[0] >= 0xC2 && p[0] <= 0xDF)
    n = 2;
  else if (p[0] >= 0xE0 && p[0] <= 0xEF)
    n = 3, lo = p[0] == 0xE0 ? 0xA0 : 0x80, hi = p[0] == 0xED ? 0x9F : 0xBF;
  else if (p[0] >= 0xF0 && p[0] <= 0xF4)
    n = 4, lo = p[0] == 0xF0 ? 0x90 : 0x80, hi = p[0] == 0xF4 ? 0x8F : 0xBF;
  else
    return fail(g, KVR_JSON_GUARD_UTF8, *i, NULL);
  if (left < n || p[1] < lo || p[1] > hi)
    return fail(g, KVR_JSON_GUARD_UTF8, *i, NULL);
  for (size_t k = 2; k < n; k++)
    if (p[k] < 0x80 || p[k] > 0xBF)
      return fail(g, KVR_JSON_GUARD_UTF8, *i, NULL);
  *i += n;
  return 0;
}

/* The string at g->pos (its opening quote); leaves g->pos after the closing quote, *end on it. */
static int scan_string(guard_t *g, size_t *end, bool *escaped) {
  size_t i = g->pos + 1;
  int rc = 0;
  *escaped = false;
  while (rc == 0) {
    i = plain_run(g->s, i, g->len);
    if (i >= g->len)
      return syntax(g, g->pos, "unterminated string");
    switch (str_class(g->s[i])) {
    case C_QUOTE:
      *end = i;
      g->pos = i + 1;
      return 0;
    case C_ESCAPE:
      *escaped = true;
      rc = scan_escape(g, &i);
      break;
    case C_CONTROL:
      g->ctrl = g->s[i];
      return fail(g, KVR_JSON_GUARD_CONTROL, i, NULL);
    default:
      rc = scan_utf8(g, &i);
    }
  }
  return rc;
}

static size_t digits(const guard_t *g, size_t i) {
  while (i < g->len && g->s[i] >= '0' && g->s[i] <= '9')
    i++;
  return i;
}

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? at g->pos. */
static int scan_number(guard_t *g) {
  size_t i = g->pos, j;
  if (g->s[i] == '-')
    i++;
  if (i < g->len && g->s[i] == '0')
    i++;
  else if (i < g->len && g->s[i] >= '1' && g->s[i] <= '9')
    i = digits(g, i);
  else
    return syntax(g, g->pos, "invalid number");
  if (i < g->len && g->s[i] == '.') {
    if ((j = digits(g, i + 1)) == i + 1)
      return syntax(g, g->pos, "invalid number");
    i = j;
  }
  if (i < g->len && (g->s[i] | 0x20) == 'e') {
    i++;
    if (i < g->len && (g->s[i] == '+' || g->s[i] == '-'))
      i++;
    if ((j = digits(g, i)) == i)
      return syntax(g, g->pos, "invalid number");
    i = j;
  }
  g->pos = i;
  return 0;
}

static int scan_literal(guard_t *g) {
  static const char *const lits[] = {"true", "false", "null"};
  for (size_t k = 0; k < KVR_ARRAY_SIZE(lits); k++) {
    size_t n = strlen(lits[k]);
    if (g->len - g->pos >= n && memcmp(g->s + g->pos, lits[k], n) == 0) {
      g->pos += n;
      return 0;
    }
  }
  return syntax(g, g->pos, "expected a value");
}

/* ---- containers -------------------------------------------------------------------------------
 */

/* The role of a container opened with c as the value of parent's current member or element. */
static uint8_t role_of(const frame_t *parent, unsigned char c) {
  if (parent == NULL)
    return c == '{' ? ROLE_ROOT : ROLE_NONE;
  if (c == '[' && parent->role == ROLE_ROOT && parent->member == MEMBER_MESSAGES)
    return ROLE_MESSAGES;
  if (c == '[' && parent->role == ROLE_ROOT && parent->member == MEMBER_PROMPT)
    return ROLE_PROMPT;
  if (c == '{' && parent->role == ROLE_MESSAGES)
    return ROLE_MESSAGE;
  if (c == '[' && parent->role == ROLE_MESSAGE && parent->member == MEMBER_CONTENT)
    return ROLE_PARTS;
  if (c == '[' && parent->role == ROLE_PROMPT)
    return ROLE_PROMPT_ITEM;
  return ROLE_NONE;
}

static int open_container(guard_t *g, unsigned char c) {
  if (g->nframes >= g->lim->max_depth)
    return fail(g, KVR_JSON_GUARD_DEPTH, g->pos, NULL);
  uint8_t role = role_of(top(g), c);
  if (g->nframes == g->frames_cap) {
    g->frames_cap = g->frames_cap ? g->frames_cap * 2 : 16;
    g->frames_cap = KVR_MIN(g->frames_cap, (size_t)g->lim->max_depth);
    g->frames = kvr_xrealloc(g->frames, g->frames_cap * sizeof(frame_t));
    account(g);
  }
  frame_t *f = &g->frames[g->nframes++];
  *f = (frame_t){.kbase = g->nkeys, .key_off = NO_KEY, .kind = c, .role = role};
  if (c == '{')
    f->serial = ++g->serials;
  if (g->nframes > g->v->depth)
    g->v->depth = (uint32_t)g->nframes;
  g->pos++;
  return 0;
}

/* Empties the table and places the keys of the objects still open again: the keys of frame i
 * are g->keys[frames[i].kbase, frames[i + 1].kbase) (the last frame's end at nkeys). */
static void table_rebuild(guard_t *g) {
  memset(g->table, 0, g->tcap * sizeof(slot_t));
  g->tcount = 0;
  for (size_t i = 0; i < g->nframes; i++) {
    size_t end = i + 1 < g->nframes ? g->frames[i + 1].kbase : g->nkeys;
    for (size_t j = g->frames[i].kbase; j < end; j++)
      place(g, (slot_t){g->keys[j].h, g->keys[j].off, g->frames[i].serial});
    g->tcount += end - g->frames[i].kbase;
  }
}

/* Pops the innermost frame at its closing bracket. An object's keys leave the table one by one,
 * or, when they are many (at least an eighth of the slots), by a rebuild: a sequential pass
 * instead of a cache miss per key. */
static void close_container(guard_t *g) {
  frame_t *f = top(g);
  size_t k = g->nkeys - f->kbase;
  bool rebuild = k >= 256 && k * 8 >= g->tcap;
  for (size_t j = g->nkeys; !rebuild && j-- > f->kbase;)
    table_delete(g, g->keys[j].h, g->keys[j].off, f->serial);
  g->nkeys = f->kbase;
  g->nframes--;
  g->pos++;
  if (rebuild)
    table_rebuild(g);
}

/* Counts an element beginning in array f against the limit of its role; a verdict names the
 * array. */
static int count_element(guard_t *g, frame_t *f, unsigned char c) {
  f->count++;
  bool number = c == '-' || (c >= '0' && c <= '9');
  kvr_json_guard_rule_t rule = KVR_JSON_GUARD_OK;
  if (f->role == ROLE_MESSAGES && f->count > g->lim->max_messages)
    rule = KVR_JSON_GUARD_MESSAGES;
  else if (f->role == ROLE_PARTS && f->count > g->lim->max_parts)
    rule = KVR_JSON_GUARD_PARTS;
  else if ((f->role == ROLE_PROMPT || f->role == ROLE_PROMPT_ITEM) && number &&
           ++f->tokens > g->lim->max_prompt_tokens)
    rule = KVR_JSON_GUARD_TOKENS;
  if (rule == KVR_JSON_GUARD_OK)
    return 0;
  g->whole_array = true;
  return fail(g, rule, g->pos, NULL);
}

/* One value at g->pos (after whitespace): a scalar whole, or a container opened. */
static int value(guard_t *g) {
  skip_ws(g);
  if (g->pos >= g->len)
    return syntax(g, g->pos, "expected a value, found the end of the body");
  unsigned char c = g->s[g->pos];
  frame_t *parent = top(g);
  int rc = parent && parent->kind == '[' ? count_element(g, parent, c) : 0;
  if (rc)
    return rc;
  if (++g->v->nodes > g->lim->max_nodes)
    return fail(g, KVR_JSON_GUARD_NODES, g->pos, NULL);
  size_t end;
  bool escaped;
  if (c == '{' || c == '[')
    return open_container(g, c);
  if (c == '"')
    return scan_string(g, &end, &escaped);
  if (c == '-' || (c >= '0' && c <= '9'))
    return scan_number(g);
  return scan_literal(g);
}

/* Which member of interest the validated key at quote names in object f. */
static uint8_t member_of(const guard_t *g, const frame_t *f, size_t quote) {
  if (f->role == ROLE_ROOT && g->kind == KVR_JSON_GUARD_CHAT && str_is(g->s, quote, "messages", 8))
    return MEMBER_MESSAGES;
  if (f->role == ROLE_ROOT && g->kind == KVR_JSON_GUARD_COMPLETIONS &&
      str_is(g->s, quote, "prompt", 6))
    return MEMBER_PROMPT;
  if (f->role == ROLE_MESSAGE && str_is(g->s, quote, "content", 7))
    return MEMBER_CONTENT;
  return MEMBER_OTHER;
}

/* A member's key and its ':' in object f. */
static int member_key(guard_t *g, frame_t *f) {
  if (g->pos >= g->len || g->s[g->pos] != '"')
    return syntax(g, g->pos, "expected a string key");
  size_t quote = g->pos, end;
  bool escaped;
  int rc = scan_string(g, &end, &escaped);
  if (rc)
    return rc;
  f->count++;
  f->key_off = (uint32_t)quote;
  f->member = member_of(g, f, quote);
  if (g->nkeys >= g->lim->max_open_keys)
    return fail(g, KVR_JSON_GUARD_KEYS, quote, NULL);
  uint64_t h = str_hash(g->s, quote, end, escaped, g->lim->seed);
  if (table_insert(g, h, (uint32_t)quote, f->serial) != NO_KEY)
    return fail(g, KVR_JSON_GUARD_DUPLICATE, quote, NULL);
  if (g->nkeys == g->keys_cap) {
    g->keys_cap = g->keys_cap ? g->keys_cap * 2 : 64;
    g->keys = kvr_xrealloc(g->keys, g->keys_cap * sizeof(kent_t));
    account(g);
  }
  g->keys[g->nkeys++] = (kent_t){h, (uint32_t)quote};
  skip_ws(g);
  if (g->pos >= g->len || g->s[g->pos] != ':')
    return syntax(g, g->pos, "expected ':' after the key");
  g->pos++;
  return 0;
}

/* Advances the innermost open container by one token (see the header comment). */
static int step(guard_t *g) {
  frame_t *f = top(g);
  skip_ws(g);
  if (g->pos >= g->len)
    return syntax(g, g->pos, "unexpected end of the body");
  unsigned char c = g->s[g->pos], closer = f->kind == '{' ? '}' : ']';
  if (f->state != ST_ITEM && c == closer) {
    close_container(g);
    return 0;
  }
  if (f->state == ST_AFTER) {
    if (c != ',')
      return syntax(g, g->pos, f->kind == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
    g->pos++;
    f->state = ST_ITEM;
    return 0;
  }
  f->state = ST_AFTER;
  int rc = f->kind == '{' ? member_key(g, f) : 0;
  return rc ? rc : value(g); /* f may move: value() can grow g->frames */
}

static int check(guard_t *g) {
  if (g->len == 0)
    return fail(g, KVR_JSON_GUARD_EMPTY, 0, NULL);
  if (g->len >= UINT32_MAX)
    return fail(g, KVR_JSON_GUARD_NODES, 0, "over 4 GiB");
  if (g->len >= 3 && memcmp(g->s, "\xEF\xBB\xBF", 3) == 0)
    g->pos = 3; /* a UTF-8 byte order mark, as json.loads reads bytes (utf-8-sig) */
  int rc = value(g);
  while (rc == 0 && g->nframes)
    rc = step(g);
  if (rc)
    return rc;
  skip_ws(g);
  if (g->pos < g->len)
    return fail(g, KVR_JSON_GUARD_TRAILING, g->pos, NULL);
  return 0;
}

int kvr_json_guard_check(const char *body, size_t len, kvr_json_guard_kind_t kind,
                         const kvr_json_guard_limits_t *lim, kvr_json_guard_verdict_t *v) {
  memset(v, 0, sizeof *v);
  guard_t g = {.s = (const unsigned char *)body, .len = len, .kind = kind, .lim = lim, .v = v};
  int rc = check(&g);
  if (rc == 0)
    v->offset = len;
  free(g.frames);
  free(g.keys);
  free(g.table);
  return rc;
}

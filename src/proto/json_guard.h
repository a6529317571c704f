/* json_guard.h -- one linear pass over a request body's raw bytes, before any JSON tree is built.
 *
 * Why: cJSON builds a node per value, on the event loop, before any limit applies. An 8 MiB body
 * of 4.19 M token ids, of 2.8 M empty arrays in an unknown field or of 280 k tiny messages stalls
 * the loop for hundreds of milliseconds and holds hundreds of MiB, for a request no vLLM worker can
 * serve (issue 37, "Hostile bytes"). And where cJSON and vLLM (Python's json.loads behind
 * FastAPI) read the same bytes differently, the router routes and indexes a prompt the worker
 * never sees: duplicate keys (cJSON reads the first, json.loads the last), "\u0000" (cJSON's
 * strings end there, Python's do not), raw control characters in strings and data after the value
 * (cJSON takes them, vLLM answers 400).
 *
 * kvr_json_guard_check() reads the body once, left to right, with O(depth) state plus the keys of
 * the objects still open (for the duplicate-key check), and stops at the first broken rule:
 *   - strict RFC 8259 JSON in UTF-8 (see json_guard.c for every choice against json.loads);
 *   - limits (kvr_json_guard_limits_t): nesting depth, values, keys of the objects open at once,
 *     token ids of a completions "prompt", chat "messages", content parts of one message;
 *   - no object has the same key twice (keys compared after unescaping, as Python compares them);
 * and reports whether any string holds U+0000. The verdict carries the HTTP status, the OpenAI
 * error code and a one-line message naming the member (a path such as "messages[3].content") and
 * the limit. Pure: no loop, no sockets; nothing outlives the call.
 */
#ifndef KVR_JSON_GUARD_H
#define KVR_JSON_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- limits -----------------------------------------------------------------------------------
 */

/* Nesting depth (containers inside one another; a top-level object is depth 1). Tool schemas, the
 * deepest thing a client sends on purpose, stay far below; cJSON's own limit is 1000. */
#define KVR_JSON_GUARD_MAX_DEPTH_DEFAULT 128
/* Values (cJSON nodes) in the body. The worst bodies accepted at the default bounds, 262,139 token
 * ids in two prompts or 81,920 text parts, take 19 and 23 ms of guard + cJSON parse + prompt
 * features on the reference machine (2 vCPU Xeon; bench/results/hostile/REPORT.md measures the
 * loop end to end), under the 50 ms the loop may stall; one 131,072-token prompt of ids (vLLM's
 * largest common context) is 9 ms. A worker with a larger context fed token ids needs more. */
#define KVR_JSON_GUARD_MAX_NODES_DEFAULT 262144u
/* Keys of the objects open at once (an object's keys are held, for the duplicate check, until it
 * closes). Bounds the check's memory (48 bytes a key: 3 MiB) and time (about 3 ms at the bound)
 * against one object of a million keys; 32,768 messages of a few keys each hold a few at a time,
 * and a logit_bias over a whole 65,536-token vocabulary still fits. */
#define KVR_JSON_GUARD_MAX_OPEN_KEYS_DEFAULT 65536u
/* Token ids in one prompt of a completions request ("prompt": [ids] or each [ids] of
 * "prompt": [[ids], ...]) while no worker's max_model_len is known. Once GET /v1/models told every
 * worker's, the caller passes the largest: vLLM answers a longer prompt 400 (BadRequestError,
 * param "input_tokens", "...the model's context length is only N tokens..."), so does the guard
 * (TOKENS). Until then the node bound above is what stops a long array. */
#define KVR_JSON_GUARD_MAX_PROMPT_TOKENS_DEFAULT 1048576u
/* Elements of a chat request's "messages". Chat templates spend a few tokens on every message
 * (role header and end marker: 5 in Llama 3's), so a 131,072-token context holds fewer than
 * 32,768 of them; vLLM itself has no such bound. */
#define KVR_JSON_GUARD_MAX_MESSAGES_DEFAULT 32768u
/* Elements of one message's "content" array (content parts); the node bound caps their total. */
#define KVR_JSON_GUARD_MAX_PARTS_DEFAULT 4096u

/* What the pass enforces. Plain data: the caller fills it from configuration and the workers'
 * max_model_len (see kvr_json_guard_limits_default). A bound of 0 refuses every such element. */
typedef struct kvr_json_guard_limits_s {
  uint32_t max_depth;         /* nesting depth */
  uint64_t max_nodes;         /* values in the body */
  uint64_t max_open_keys;     /* keys of the objects open at once */
  uint64_t max_prompt_tokens; /* token ids in one prompt (completions) */
  uint64_t max_messages;      /* elements of "messages" (chat) */
  uint64_t max_parts;         /* elements of one messages[i].content (chat) */
  uint64_t seed;              /* key hashing; a per-process random value keeps probe chains short
                                 against keys chosen to collide (the verdict does not depend on it) */
} kvr_json_guard_limits_t;

/* Fills lim with the *_DEFAULT bounds above and seed 0. */
void kvr_json_guard_limits_default(kvr_json_guard_limits_t *lim);

/* Which members carry the counted limits: the top-level "messages" of a chat request, the
 * top-level "prompt" of a completions request; none for any other body. */
typedef enum {
  KVR_JSON_GUARD_ANY,         /* JSON rules, depth, values, duplicates */
  KVR_JSON_GUARD_CHAT,        /* + messages and content parts */
  KVR_JSON_GUARD_COMPLETIONS, /* + token ids of "prompt" */
} kvr_json_guard_kind_t;

/* ---- verdict ----------------------------------------------------------------------------------
 */

/* The rules, in one list: name, HTTP status, OpenAI error code. Status 400 for what vLLM answers
 * 400 (bad JSON, and a prompt longer than the context: its "maximum context length" error), 413
 * for sizes vLLM has no rule for. */
#define KVR_JSON_GUARD_RULES(XX)                                                                   \
  XX(OK, 0, NULL)                                                                                  \
  XX(EMPTY, 400, "missing_body")             /* no bytes at all */                                 \
  XX(SYNTAX, 400, "invalid_json")            /* not RFC 8259 JSON (incl. bad escapes) */           \
  XX(UTF8, 400, "invalid_encoding")          /* bytes that are not UTF-8 */                        \
  XX(CONTROL, 400, "invalid_json")           /* raw byte < 0x20 inside a string */                 \
  XX(TRAILING, 400, "invalid_json")          /* non-space after the value */                       \
  XX(DEPTH, 400, "nesting_too_deep")         /* over max_depth */                                  \
  XX(DUPLICATE, 400, "duplicate_key")        /* a key twice in one object */                       \
  XX(TOKENS, 400, "context_length_exceeded") /* a prompt over max_prompt_tokens */                 \
  XX(NODES, 413, "request_too_large")        /* over max_nodes (or a body over 4 GiB) */           \
  XX(KEYS, 413, "too_many_keys")             /* over max_open_keys */                              \
  XX(MESSAGES, 413, "too_many_messages")     /* over max_messages */                               \
  XX(PARTS, 413, "too_many_content_parts")   /* over max_parts */

typedef enum {
#define KVR__JSON_GUARD_ENUM(name, status, code) KVR_JSON_GUARD_##name,
  KVR_JSON_GUARD_RULES(KVR__JSON_GUARD_ENUM)
#undef KVR__JSON_GUARD_ENUM
} kvr_json_guard_rule_t;

/* What the pass found. path and message are NUL-terminated, truncated with "..." if long. */
typedef struct kvr_json_guard_verdict_s {
  kvr_json_guard_rule_t rule; /* KVR_JSON_GUARD_OK, or the first rule broken */
  int status;                 /* 0 when OK, else 400 or 413 */
  const char *code;           /* OpenAI error code (static string), NULL when OK */
  size_t offset;              /* byte where the broken rule was seen (len when OK) */
  char path[128];             /* member at fault: "", "model", "messages[3].content", "prompt[1]" */
  char message[256];          /* one line for the client: rule, member, limit */
  bool has_nul;               /* some string or key holds U+0000 (as "\u0000") */
  uint64_t nodes;             /* values read (all of them when OK) */
  uint32_t depth;             /* deepest nesting read */
  size_t peak_bytes;          /* heap the pass held at its peak (frames, open objects' keys) */
} kvr_json_guard_verdict_t;

/* Checks body[0..len) (not NUL-terminated; NUL bytes are bytes) as one JSON value under lim,
 * counting the members of kind. Fills *v; returns 0 when v->rule is KVR_JSON_GUARD_OK,
 * KVR_EPARSE for a broken JSON rule (EMPTY .. DUPLICATE, DEPTH included) and KVR_ELIMIT for a
 * limit (TOKENS .. PARTS). Allocates only O(depth + keys of the open objects) and frees it before
 * returning; keeps no pointer into body. Cost on the reference machine: about 0.2 ms per MiB of
 * plain string, 1.3 ms per MiB of \u escapes, 3 ms for 262,144 small values; issue 37's 8 MiB
 * bodies are refused in 1 to 3 ms (their first megabyte). */
int kvr_json_guard_check(const char *body, size_t len, kvr_json_guard_kind_t kind,
                         const kvr_json_guard_limits_t *lim, kvr_json_guard_verdict_t *v);

/* The rule's name ("OK", "SYNTAX", ...), or "UNKNOWN". */
const char *kvr_json_guard_rule_name(kvr_json_guard_rule_t rule);

#endif

/* fuzz_json_guard.c -- libFuzzer target: the one-pass body guard (src/proto/json_guard.c's
 * kvr_json_guard_check), which every chat and completions body meets before cJSON does.
 *
 * The input is a request body (the exact bytes, not NUL-terminated), checked as each kind (any,
 * chat, completions) under the default limits and under small ones derived from the input.
 * Invariants checked on every input:
 *   - the verdict is well formed: rule, status and code from the rule table, KVR_EPARSE for a JSON
 *     rule and KVR_ELIMIT for a limit, offset within the body (the length when OK), path and
 *     message NUL-terminated, one line;
 *   - it is deterministic: the same verdict again, and with another hashing seed;
 *   - whenever it says OK, cJSON_ParseWithLengthOpts(require_null_terminated) accepts the same
 *     bytes, its tree has exactly as many values as the guard counted and the same depth, and,
 *     unless the guard reported U+0000 (where cJSON's strings end early), no object of the tree
 *     has a key twice;
 *   - every limit is exact: the same body under max_nodes = nodes and max_depth = depth is OK, one
 *     less gives NODES / DEPTH;
 *   - limits only ever stop earlier: under small limits a valid body gives OK or a limit verdict,
 *     an invalid one its own verdict or a limit verdict no later in the body;
 *   - a strict prefix of a valid object or array (cut before its last non-space byte) is refused.
 */
#include "fuzz_util.h"

#include "base/kvr.h"
#include "proto/json_guard.h"

#include <cjson/cJSON.h>

static const kvr_json_guard_kind_t kinds[] = {KVR_JSON_GUARD_ANY, KVR_JSON_GUARD_CHAT,
                                              KVR_JSON_GUARD_COMPLETIONS};

static bool is_limit(kvr_json_guard_rule_t r) {
  return r == KVR_JSON_GUARD_DEPTH || r >= KVR_JSON_GUARD_TOKENS;
}

static kvr_json_guard_verdict_t run(const char *body, size_t len, kvr_json_guard_kind_t kind,
                                    const kvr_json_guard_limits_t *lim) {
  kvr_json_guard_verdict_t v;
  int rc = kvr_json_guard_check(body, len, kind, lim, &v);
  FUZZ_CHECK(memchr(v.path, '\0', sizeof v.path) != NULL);
  FUZZ_CHECK(memchr(v.message, '\0', sizeof v.message) != NULL);
  FUZZ_CHECK(strchr(v.message, '\n') == NULL);
  FUZZ_CHECK(v.nodes <= lim->max_nodes + 1 && v.depth <= lim->max_depth);
  if (v.rule == KVR_JSON_GUARD_OK) {
    FUZZ_CHECK(rc == 0 && v.status == 0 && v.code == NULL && v.offset == len);
    FUZZ_CHECK(v.message[0] == '\0' && v.path[0] == '\0');
    return v;
  }
  FUZZ_CHECK(v.rule <= KVR_JSON_GUARD_PARTS);
  FUZZ_CHECK(rc == (v.rule >= KVR_JSON_GUARD_TOKENS ? KVR_ELIMIT : KVR_EPARSE));
  FUZZ_CHECK(v.status == (v.rule >= KVR_JSON_GUARD_NODES ? 413 : 400));
  FUZZ_CHECK(v.code != NULL && v.code[0] != '\0' && v.message[0] != '\0');
  FUZZ_CHECK(v.offset <= len);
  FUZZ_CHECK((v.rule == KVR_JSON_GUARD_EMPTY) == (len == 0));
  return v;
}

static bool same(const kvr_json_guard_verdict_t *a, const kvr_json_guard_verdict_t *b) {
  return a->rule == b->rule && a->status == b->status && a->offset == b->offset &&
         a->has_nul == b->has_nul && a->nodes == b->nodes && a->depth == b->depth &&
         a->peak_bytes == b->peak_bytes && strcmp(a->path, b->path) == 0 &&
         strcmp(a->message, b->message) == 0;
}

/* Values in the tree (every node), its container depth, and whether an object repeats a key. */
static uint64_t walk(const cJSON *j, uint32_t level, uint32_t *depth, bool *dup) {
  uint64_t n = 1;
  if (!cJSON_IsArray(j) && !cJSON_IsObject(j))
    return n;
  *depth = KVR_MAX(*depth, level + 1);
  for (const cJSON *c = j->child; c != NULL; c = c->next) {
    if (cJSON_IsObject(j))
      for (const cJSON *d = c->next; d != NULL; d = d->next)
        *dup = *dup || strcmp(c->string, d->string) == 0;
    n += walk(c, level + 1, depth, dup);
  }
  return n;
}

/* What cJSON makes of an accepted body. */
static void check_cjson(const char *body, size_t len, const kvr_json_guard_verdict_t *v) {
  char *copy = fuzz_strndup((const uint8_t *)body, len);
  const char *end = NULL;
  cJSON *j = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 1);
  FUZZ_CHECK(j != NULL);
  uint32_t depth = 0;
  bool dup = false;
  FUZZ_CHECK(walk(j, 0, &depth, &dup) == v->nodes);
  FUZZ_CHECK(depth == v->depth);
  FUZZ_CHECK(v->has_nul || !dup);
  cJSON_Delete(j);
  free(copy);
}

/* The counted limits are exact at the bound. */
static void check_bounds(const char *body, size_t len, const kvr_json_guard_verdict_t *v) {
  kvr_json_guard_limits_t lim;
  kvr_json_guard_limits_default(&lim);
  lim.max_nodes = v->nodes;
  lim.max_depth = v->depth;
  FUZZ_CHECK(run(body, len, KVR_JSON_GUARD_ANY, &lim).rule == KVR_JSON_GUARD_OK);
  lim.max_nodes = v->nodes - 1;
  FUZZ_CHECK(run(body, len, KVR_JSON_GUARD_ANY, &lim).rule == KVR_JSON_GUARD_NODES);
  if (v->depth) {
    kvr_json_guard_limits_default(&lim);
    lim.max_depth = v->depth - 1;
    FUZZ_CHECK(run(body, len, KVR_JSON_GUARD_ANY, &lim).rule == KVR_JSON_GUARD_DEPTH);
  }
}

/* A strict prefix of a valid container, cut before its last non-space byte, is refused. */
static void check_prefix(const char *body, size_t len, uint64_t seed) {
  size_t first = len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0, last = len;
  while (first < len && strchr(" \t\r\n", body[first]) && body[first] != '\0')
    first++;
  while (last > first && strchr(" \t\r\n", body[last - 1]) && body[last - 1] != '\0')
    last--;
  if (first >= len || (body[first] != '{' && body[first] != '['))
    return;
  kvr_json_guard_limits_t lim;
  kvr_json_guard_limits_default(&lim);
  size_t cut = (size_t)(seed % (last - 1 - first + 1)) + first; /* in [first, last - 1] */
  FUZZ_CHECK(run(body, cut, KVR_JSON_GUARD_ANY, &lim).rule != KVR_JSON_GUARD_OK);
  FUZZ_CHECK(run(body, last - 1, KVR_JSON_GUARD_ANY, &lim).rule != KVR_JSON_GUARD_OK);
}

/* Small limits from the seed stop a body no later than its default verdict. */
static void check_small(const char *body, size_t len, kvr_json_guard_kind_t kind,
                        const kvr_json_guard_verdict_t *v, uint64_t seed) {
  kvr_json_guard_limits_t lim = {
      .max_depth = (uint32_t)(seed % 6),
      .max_nodes = (seed >> 4) % 40,
      .max_open_keys = (seed >> 10) % 8,
      .max_prompt_tokens = (seed >> 14) % 5,
      .max_messages = (seed >> 18) % 4,
      .max_parts = (seed >> 22) % 3,
      .seed = seed,
  };
  kvr_json_guard_verdict_t s = run(body, len, kind, &lim);
  if (s.rule == v->rule && s.offset == v->offset)
    return;
  FUZZ_CHECK(is_limit(s.rule));
  FUZZ_CHECK(v->rule == KVR_JSON_GUARD_OK || s.offset <= v->offset);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  const char *body = (const char *)data;
  uint64_t seed = fuzz_seed(data, len);
  kvr_json_guard_limits_t lim;
  kvr_json_guard_limits_default(&lim);
  for (size_t k = 0; k < KVR_ARRAY_SIZE(kinds); k++) {
    lim.seed = 0;
    kvr_json_guard_verdict_t a = run(body, len, kinds[k], &lim), b = run(body, len, kinds[k], &lim);
    FUZZ_CHECK(same(&a, &b));
    lim.seed = seed | 1;
    b = run(body, len, kinds[k], &lim);
    FUZZ_CHECK(same(&a, &b));
    if (a.rule == KVR_JSON_GUARD_OK && k == 0) {
      check_cjson(body, len, &a);
      check_bounds(body, len, &a);
      check_prefix(body, len, seed);
    }
    check_small(body, len, kinds[k], &a, seed >> (8 * k));
  }
  return 0;
}

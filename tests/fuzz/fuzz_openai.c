/* fuzz_openai.c -- libFuzzer target: an OpenAI request body -> routing features
 * (src/proto/openai.c's kvr_openai_features over src/proto/prompt.c), the path every proxied chat
 * and completions request takes.
 *
 * The input is a request body, fed to both routes (chat: "messages", completions: "prompt") with
 * the default block size and a small one derived from the input, so blocks of 1..17 bytes are
 * hashed too. Invariants checked on every input:
 *   - an error is KVR_EINVAL with a message and an OpenAI error code, and leaves the prompt empty;
 *   - a success is deterministic (same text, blocks, model, options on a second parse) and the
 *     canonical text does not depend on the block size;
 *   - the blocks are the chained hashes of the text: nblocks = len / block_chars, h_0 is the
 * model's seed and each block equals kvr_prompt_hash_blocks() recomputed over the text;
 *   - turn N is a byte prefix of turn N+1: dropping the last message (or last prompt item) of an
 *     accepted body gives an accepted body whose text and blocks are prefixes of the full ones;
 *   - kvr_prompt_extend_answer() keeps every earlier block and hashes exactly the new full blocks.
 */
#include "fuzz_util.h"

#include "base/kvr.h"
#include "proto/openai.h"
#include "proto/prompt.h"

#include <cjson/cJSON.h>

/* The blocks of p are the chained hashes of its text from its model's seed. */
static void check_blocks(const kvr_prompt_t *p) {
  FUZZ_CHECK(p->model != NULL);
  FUZZ_CHECK(p->model_seed == kvr_prompt_model_seed(p->model, strlen(p->model)));
  FUZZ_CHECK(p->text.data != NULL);
  size_t n = p->text.len / p->block_chars;
  FUZZ_CHECK(p->nblocks == n);
  uint64_t *want = malloc((n ? n : 1) * sizeof *want);
  FUZZ_CHECK(want != NULL);
  FUZZ_CHECK(
      kvr_prompt_hash_blocks(p->text.data, p->text.len, p->block_chars, p->model_seed, want) == n);
  FUZZ_CHECK(n == 0 || memcmp(want, p->blocks, n * sizeof *want) == 0);
  free(want);
}

static bool same_text(const kvr_prompt_t *a, const kvr_prompt_t *b) {
  return a->text.len == b->text.len && memcmp(a->text.data, b->text.data, a->text.len) == 0;
}

static int features(const char *body, size_t len, kvr_route_t route, size_t bc, kvr_prompt_t *p) {
  char err[256] = "";
  const char *code = NULL;
  int rc = kvr_openai_features(body, len, route, bc, p, err, sizeof err, &code);
  if (rc != 0) {
    FUZZ_CHECK(rc == KVR_EINVAL);
    FUZZ_CHECK(err[0] != '\0' && code != NULL && code[0] != '\0');
    FUZZ_CHECK(p->model == NULL && p->nblocks == 0 && p->blocks == NULL && p->text.len == 0);
  }
  return rc;
}

/* Turn N is a prefix of turn N+1: the body without the last item of its "messages" (chat) or of
 * its "prompt" array (completions) is accepted too, and its text and blocks are prefixes. The
 * shorter body is handed over as a cJSON tree (kvr_prompt_from_json, what kvr_openai_features
 * calls), not printed and parsed again: cJSON prints numbers with 15 significant digits when they
 * compare equal within DBL_EPSILON, which changes token ids above 10^15. */
static void check_prefix(const char *body, size_t len, kvr_route_t route,
                         const kvr_prompt_t *full) {
  cJSON *json = cJSON_ParseWithLength(body, len);
  FUZZ_CHECK(json != NULL); /* it was accepted */
  cJSON *arr =
      cJSON_GetObjectItemCaseSensitive(json, route == KVR_ROUTE_CHAT ? "messages" : "prompt");
  if (cJSON_IsArray(arr) && cJSON_GetArraySize(arr) >= 2) {
    cJSON_DeleteItemFromArray(arr, cJSON_GetArraySize(arr) - 1);
    kvr_prompt_t p;
    char err[256];
    FUZZ_CHECK(kvr_prompt_from_json(json, full->kind, full->block_chars, &p, err, sizeof err) == 0);
    FUZZ_CHECK(p.text.len <= full->text.len);
    FUZZ_CHECK(memcmp(p.text.data, full->text.data, p.text.len) == 0);
    FUZZ_CHECK(p.nblocks <= full->nblocks);
    FUZZ_CHECK(p.nblocks == 0 || memcmp(p.blocks, full->blocks, p.nblocks * sizeof *p.blocks) == 0);
    kvr_prompt_free(&p);
  }
  cJSON_Delete(json);
}

/* Appending an answer keeps the earlier blocks and hashes the new text's full blocks. */
static void check_extend(kvr_prompt_t *p, const char *answer, size_t alen) {
  size_t old_len = p->text.len, old_n = p->nblocks;
  uint64_t *old = malloc((old_n ? old_n : 1) * sizeof *old);
  FUZZ_CHECK(old != NULL);
  if (old_n)
    memcpy(old, p->blocks, old_n * sizeof *old);
  char *old_text = fuzz_strndup((const uint8_t *)p->text.data, old_len);
  FUZZ_CHECK(kvr_prompt_extend_answer(p, answer, alen) == 0);
  size_t head = p->kind == KVR_PROMPT_CHAT ? strlen("\x1e"
                                                    "assistant"
                                                    "\x1f")
                                           : 0;
  FUZZ_CHECK(p->text.len == old_len + head + alen);
  FUZZ_CHECK(memcmp(p->text.data, old_text, old_len) == 0);
  FUZZ_CHECK(memcmp(p->text.data + old_len + head, answer, alen) == 0);
  FUZZ_CHECK(p->nblocks >= old_n);
  FUZZ_CHECK(old_n == 0 || memcmp(p->blocks, old, old_n * sizeof *old) == 0);
  check_blocks(p);
  free(old_text);
  free(old);
}

static void one_route(const char *body, size_t len, kvr_route_t route, size_t small_bc) {
  kvr_prompt_t a, b, c;
  int rc = features(body, len, route, KVR_PROMPT_BLOCK_CHARS_DEFAULT, &a);
  FUZZ_CHECK(features(body, len, route, KVR_PROMPT_BLOCK_CHARS_DEFAULT, &b) == rc);
  FUZZ_CHECK(features(body, len, route, small_bc, &c) == rc);
  if (rc == 0) {
    FUZZ_CHECK(a.kind == (route == KVR_ROUTE_CHAT ? KVR_PROMPT_CHAT : KVR_PROMPT_COMPLETIONS));
    FUZZ_CHECK(same_text(&a, &b) && same_text(&a, &c));
    FUZZ_CHECK(strcmp(a.model, b.model) == 0 && a.nblocks == b.nblocks);
    FUZZ_CHECK(a.nblocks == 0 || memcmp(a.blocks, b.blocks, a.nblocks * sizeof *a.blocks) == 0);
    FUZZ_CHECK(a.max_tokens == b.max_tokens && a.stream == b.stream);
    FUZZ_CHECK(a.prompt_tokens == c.prompt_tokens && a.prompt_tokens == b.prompt_tokens);
    FUZZ_CHECK(a.text.len == 0 || a.prompt_tokens > 0);
    check_blocks(&a);
    check_blocks(&c);
    check_prefix(body, len, route, &c);
    /* The answer: the body's own bytes (any bytes, NULs included), at most 300. */
    check_extend(&c, body, KVR_MIN(len, (size_t)300));
  }
  kvr_prompt_free(&a);
  kvr_prompt_free(&b);
  kvr_prompt_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  /* The exact input bytes, not NUL-terminated: the body is a (pointer, length) from the network. */
  const char *body = (const char *)data;
  size_t small_bc = 1 + (size_t)(fuzz_seed(data, len) % 17);
  one_route(body, len, KVR_ROUTE_CHAT, small_bc);
  one_route(body, len, KVR_ROUTE_COMPLETIONS, small_bc);
  return 0;
}

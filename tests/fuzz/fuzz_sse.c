/* fuzz_sse.c -- libFuzzer target: a worker's streamed answer through the proxy's SSE path
 * (src/proto/openai.c: kvr_openai_sse_feed -> kvr_openai_sse_data -> kvr_openai_chunk_read), fed in
 * chunkings derived from the input.
 *
 * The input is the response body of a worker. For each line bound (the proxy's 1 MiB and a small
 * one, so dropped over-long lines are exercised) it is split by a reference model written here from
 * the contract in openai.h (split at LF, strip one CR, drop a line whose bytes before the LF exceed
 * the bound, never deliver the unfinished tail) and then fed to the splitter whole, byte by byte
 * (short inputs), and in three random chunkings. Invariants:
 *   - the splitter delivers exactly the reference's lines, in order, whatever the split;
 *   - KVR_ELIMIT is reported (by some feed) exactly when the reference dropped a line or the tail
 *     is over the bound; the bytes held at the end are the reference's unfinished tail;
 *   - what the proxy reads from those lines (sse_line in src/serve/proxy.c: answer text, token
 * events, the last usage, mid-stream error, [DONE]) is therefore the same for every split, and the
 *     reader's token counts are the saturated integer part of the JSON numbers.
 */
#include "fuzz_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "proto/openai.h"

#include <cjson/cJSON.h>

#define PROXY_LINE_MAX (1u << 20) /* src/serve/proxy.c SSE_LINE_MAX */
#define SMALL_LINE_MAX 48

/* What the proxy takes from a stream (src/serve/proxy.c sse_line, take_text, take_usage). */
typedef struct summary_s {
  kvr_buf_t lines;  /* every delivered line as 8 bytes of length + the bytes */
  kvr_buf_t answer; /* concatenated answer text */
  uint64_t nlines, ntokens, ndone;
  bool usage_seen, error_seen;
  uint64_t usage_prompt, usage_cached;
} summary_t;

static void summary_init(summary_t *s) {
  memset(s, 0, sizeof *s);
  kvr_buf_init(&s->lines);
  kvr_buf_init(&s->answer);
}

static void summary_free(summary_t *s) {
  kvr_buf_free(&s->lines);
  kvr_buf_free(&s->answer);
}

/* A token count must be the saturated integer part of the number (openai.c count()). */
static void check_count(const cJSON *n, uint64_t got) {
  double v = n->valuedouble;
  if (!(v > 0))
    FUZZ_CHECK(got == 0);
  else if (v >= 18446744073709551616.0)
    FUZZ_CHECK(got == UINT64_MAX);
  else /* above 2^53 a double is an integer and got + 1 may round back to got */
    FUZZ_CHECK((double)got <= v && (v < (double)got + 1.0 || v >= 9007199254740992.0));
}

/* Chat and completions usage (openai.h): taken whole when every figure present is an integer in
 * [0, KVR_OPENAI_USAGE_MAX] and cached <= prompt, else refused whole (usage_invalid). Objects with
 * a string "type", or "object": "response", may be the Responses/Messages forms, read another way.
 */
static void check_usage(const cJSON *obj, const kvr_openai_chunk_t *c) {
  const cJSON *u = cJSON_GetObjectItemCaseSensitive(obj, "usage");
  const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
  const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
  const cJSON *object = cJSON_GetObjectItemCaseSensitive(obj, "object");
  if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(obj, "type")) ||
      (cJSON_IsString(object) && strcmp(object->valuestring, "response") == 0))
    return;
  if (c->usage_invalid) {
    FUZZ_CHECK(!c->has_prompt_tokens && !c->has_completion_tokens && !c->has_cached_tokens);
    return;
  }
  FUZZ_CHECK(c->has_prompt_tokens == (cJSON_IsObject(u) && cJSON_IsNumber(pt)));
  FUZZ_CHECK(c->has_completion_tokens == (cJSON_IsObject(u) && cJSON_IsNumber(ct)));
  if (c->has_prompt_tokens)
    check_count(pt, c->prompt_tokens);
  if (c->has_completion_tokens)
    check_count(ct, c->completion_tokens);
  FUZZ_CHECK(c->has_cached_tokens || c->cached_tokens == 0);
}

/* The proxy's sse_line, recording instead of accounting. */
static void on_line(void *data, const char *line, size_t len) {
  summary_t *s = data;
  FUZZ_CHECK(memchr(line, '\n', len) == NULL);
  uint64_t l = len;
  kvr_buf_append(&s->lines, &l, sizeof l);
  kvr_buf_append(&s->lines, line, len);
  s->nlines++;
  const char *p;
  size_t plen;
  if (!kvr_openai_sse_data(line, len, &p, &plen))
    return;
  FUZZ_CHECK(p >= line + 5 && p + plen == line + len);
  if (kvr_openai_sse_done(p, plen))
    s->ndone++;
  if (plen == 0 || *p != '{')
    return;
  cJSON *obj = cJSON_ParseWithLength(p, plen);
  if (obj == NULL)
    return;
  kvr_openai_chunk_t c;
  kvr_openai_chunk_read(obj, &c);
  check_usage(obj, &c);
  if (c.text != NULL) {
    FUZZ_CHECK(c.text_len > 0 && strlen(c.text) == c.text_len);
    kvr_buf_append(&s->answer, c.text, c.text_len);
    s->ntokens++;
  }
  if (c.has_prompt_tokens) {
    s->usage_seen = true;
    s->usage_prompt = c.prompt_tokens;
    s->usage_cached = c.has_cached_tokens ? c.cached_tokens : 0;
  }
  if (c.error)
    s->error_seen = true;
  cJSON_Delete(obj);
}

static bool same_buf(const kvr_buf_t *a, const kvr_buf_t *b) {
  return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

static void check_same(const summary_t *a, const summary_t *b) {
  FUZZ_CHECK(a->nlines == b->nlines);
  FUZZ_CHECK(same_buf(&a->lines, &b->lines));
  FUZZ_CHECK(same_buf(&a->answer, &b->answer));
  FUZZ_CHECK(a->ntokens == b->ntokens && a->ndone == b->ndone);
  FUZZ_CHECK(a->usage_seen == b->usage_seen && a->error_seen == b->error_seen);
  FUZZ_CHECK(a->usage_prompt == b->usage_prompt && a->usage_cached == b->usage_cached);
}

/* The contract of openai.h, written out plainly: the lines, whether some line was over max, and
 * the unfinished tail held at the end. */
static void reference(const char *d, size_t len, size_t max, summary_t *out, bool *limit,
                      size_t *tail) {
  size_t start = 0;
  *limit = false;
  for (size_t i = 0; i < len; i++) {
    if (d[i] != '\n')
      continue;
    size_t n = i - start;
    if (n > max) {
      *limit = true;
    } else {
      if (n && d[start + n - 1] == '\r')
        n--;
      on_line(out, d + start, n);
    }
    start = i + 1;
  }
  *tail = len - start;
  if (*tail > max) {
    *limit = true;
    *tail = 0;
  }
}

/* Feeds d in chunks whose sizes come from rng (0: whole; UINT64_MAX: byte by byte). */
static void feed(const char *d, size_t len, size_t max, uint64_t rng, summary_t *out, bool *limit,
                 size_t *pending) {
  kvr_openai_sse_t s;
  kvr_openai_sse_init(&s, max);
  *limit = false;
  size_t off = 0;
  while (off < len) {
    size_t n = len - off;
    if (rng == UINT64_MAX)
      n = 1;
    else if (rng != 0) {
      uint64_t r = fuzz_rand(&rng); /* small chunks and larger ones */
      size_t want = (size_t)(1 + (r >> 1) % (r & 1 ? 8 : 200));
      n = KVR_MIN(n, want);
    }
    int rc = kvr_openai_sse_feed(&s, d + off, n, on_line, out);
    FUZZ_CHECK(rc == 0 || rc == KVR_ELIMIT);
    *limit |= rc == KVR_ELIMIT;
    FUZZ_CHECK(kvr_openai_sse_pending(&s) <= max);
    off += n;
  }
  FUZZ_CHECK(kvr_openai_sse_feed(&s, d, 0, on_line, out) == 0); /* an empty feed is a no-op */
  *pending = kvr_openai_sse_pending(&s);
  kvr_openai_sse_free(&s);
}

static void one_bound(const char *d, size_t len, size_t max, uint64_t seed) {
  summary_t ref, got;
  bool ref_limit, limit;
  size_t tail, pending;
  summary_init(&ref);
  reference(d, len, max, &ref, &ref_limit, &tail);
  uint64_t ways[5] = {0, UINT64_MAX, seed | 1, seed * 3 + 1, seed ^ 0x5555};
  for (size_t w = 0; w < 5; w++) {
    if (ways[w] == UINT64_MAX && len > 1024)
      continue;
    summary_init(&got);
    feed(d, len, max, ways[w], &got, &limit, &pending);
    check_same(&ref, &got);
    FUZZ_CHECK(limit == ref_limit);
    FUZZ_CHECK(pending == tail);
    summary_free(&got);
  }
  summary_free(&ref);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  uint64_t seed = fuzz_seed(data, len);
  one_bound((const char *)data, len, PROXY_LINE_MAX, seed);
  one_bound((const char *)data, len, SMALL_LINE_MAX, seed);
  return 0;
}

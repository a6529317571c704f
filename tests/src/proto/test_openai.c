/* test_openai.c -- OpenAI protocol knowledge (src/proto/openai.c).
 *
 * Routes from paths; request validation and prompt features (the same features prompt.c computes,
 * the error codes the proxy answers 400 with); the exact bytes of the error body and of the
 * broken-stream event; the SSE splitter fed a multi-event stream whole, in two and three pieces at
 * every split point, and byte by byte (every feeding must give the same lines), its line bound and
 * reset; "data:" payloads; and what kvr_openai_chunk_read() finds in chat, completions, reasoning,
 * usage and error objects; scratch parses (the same tree as cJSON's, arena reuse and growth).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "proto/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- routes and features ----------------------------------------------------------------------
 */

static void test_route(void **state) {
  (void)state;
  assert_int_equal(kvr_openai_route("/v1/chat/completions"), KVR_ROUTE_CHAT);
  assert_int_equal(kvr_openai_route("/v1/completions"), KVR_ROUTE_COMPLETIONS);
  assert_int_equal(kvr_openai_route("/v1/models"), KVR_ROUTE_MODELS);
  static const char *const other[] = {"/v1/chat/completions/",
                                      "/v1/Chat/completions",
                                      "/v1/models/x",
                                      "/v1/embeddings",
                                      "/v1/completions?x=1",
                                      "/v1/",
                                      "/health",
                                      ""};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(other); i++)
    assert_int_equal(kvr_openai_route(other[i]), KVR_ROUTE_OTHER);
}

static int features(const char *body, kvr_route_t route, kvr_prompt_t *p, char *err,
                    const char **code) {
  *code = NULL;
  err[0] = '\0';
  return kvr_openai_features(body, strlen(body), route, 16, p, err, 256, code);
}

static void test_features_errors(void **state) {
  (void)state;
  kvr_prompt_t p;
  char err[256];
  const char *code;
  assert_int_equal(features("", KVR_ROUTE_CHAT, &p, err, &code), KVR_EINVAL);
  assert_string_equal(code, "missing_body");
  assert_string_equal(err, "the request body must be a JSON object");
  static const char *const not_object[] = {"{", "[1,2]", "\"text\"", "null", "{\"a\":}"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(not_object); i++) {
    assert_int_equal(features(not_object[i], KVR_ROUTE_CHAT, &p, err, &code), KVR_EINVAL);
    assert_string_equal(code, "invalid_json");
    assert_string_equal(err, "the request body is not a valid JSON object");
  }
  /* prompt.c's validation: its code and message come through; prompt is left empty. */
  assert_int_equal(features("{\"model\":\"m\"}", KVR_ROUTE_CHAT, &p, err, &code), KVR_EINVAL);
  assert_string_equal(code, "missing_required_parameter");
  assert_string_equal(err, "Missing required parameter: 'messages'.");
  assert_null(p.blocks);
  assert_int_equal(p.text.len, 0);
  assert_int_equal(
      features("{\"model\":\"m\",\"prompt\":5}", KVR_ROUTE_COMPLETIONS, &p, err, &code),
      KVR_EINVAL);
  assert_string_equal(code, "invalid_type");
  kvr_prompt_free(&p);
}

/* The features are prompt.c's for the endpoint the route names (chat, else completions). */
static void check_same_as_prompt(const char *body, kvr_route_t route, kvr_prompt_kind_t kind) {
  kvr_prompt_t p, ref;
  char err[256];
  const char *code;
  assert_int_equal(features(body, route, &p, err, &code), 0);
  cJSON *j = cJSON_Parse(body);
  assert_int_equal(kvr_prompt_from_json(j, kind, 16, &ref, err, sizeof err), 0);
  cJSON_Delete(j);
  assert_int_equal(p.kind, kind);
  assert_int_equal(p.block_chars, 16);
  assert_int_equal(p.text.len, ref.text.len);
  assert_memory_equal(p.text.data, ref.text.data, ref.text.len);
  assert_int_equal(p.nblocks, ref.nblocks);
  assert_true(p.nblocks > 0);
  assert_memory_equal(p.blocks, ref.blocks, ref.nblocks * sizeof(uint64_t));
  assert_string_equal(p.model, ref.model);
  assert_int_equal(p.prompt_tokens, ref.prompt_tokens);
  assert_int_equal(p.max_tokens, ref.max_tokens);
  assert_int_equal(p.stream, ref.stream);
  kvr_prompt_free(&p);
  kvr_prompt_free(&ref);
}

static void test_features_match_prompt(void **state) {
  (void)state;
  check_same_as_prompt("{\"model\":\"m\",\"stream\":true,\"max_tokens\":9,\"messages\":["
                       "{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
                       "{\"role\":\"user\",\"content\":\"What is a KV cache, in one line?\"}]}",
                       KVR_ROUTE_CHAT, KVR_PROMPT_CHAT);
  static const char completions[] =
      "{\"model\":\"m\",\"prompt\":\"Once upon a time, in a land far away, there was\"}";
  check_same_as_prompt(completions, KVR_ROUTE_COMPLETIONS, KVR_PROMPT_COMPLETIONS);
  check_same_as_prompt(completions, KVR_ROUTE_OTHER, KVR_PROMPT_COMPLETIONS);
  check_same_as_prompt(completions, KVR_ROUTE_MODELS, KVR_PROMPT_COMPLETIONS);
}

/* ---- errors -----------------------------------------------------------------------------------
 */

static void test_error_body(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_openai_error_body(&b, "bad \"x\"\n", "invalid_request_error", "invalid_value");
  assert_string_equal(b.data, "{\"error\":{\"message\":\"bad \\\"x\\\"\\n\",\"type\":"
                              "\"invalid_request_error\",\"param\":null,\"code\":"
                              "\"invalid_value\"}}\n");
  kvr_buf_reset(&b);
  kvr_openai_error_body(&b, "m", "server_error", NULL);
  assert_string_equal(b.data,
                      "{\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"param\":null,"
                      "\"code\":null}}\n");
  kvr_buf_free(&b);
}

static void test_stream_error_event(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "data: {\"x\":1}\n\n"); /* appended to what is there */
  kvr_openai_stream_error_event(&b, "Failure when receiving data from the peer");
  assert_string_equal(b.data, "data: {\"x\":1}\n\n"
                              "data: {\"error\":{\"message\":\"upstream worker failed mid-stream: "
                              "Failure when receiving data from the peer\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":"
                              "\"upstream_stream_broken\"}}\n\ndata: [DONE]\n\n");
  kvr_buf_free(&b);
}

/* ---- SSE splitter -----------------------------------------------------------------------------
 */

/* Collects lines as "line|" and checks a line never contains an LF. */
typedef struct {
  kvr_buf_t out;
  size_t lines;
  const char *chunk; /* the chunk being fed, to tell lines read in place from copied ones */
  size_t chunk_len;
  size_t in_place;
} sink_t;

static void on_line(void *data, const char *line, size_t len) {
  sink_t *s = data;
  assert_non_null(line);
  assert_null(memchr(line, '\n', len));
  if (s->chunk && line >= s->chunk && line + len <= s->chunk + s->chunk_len)
    s->in_place++;
  kvr_buf_append(&s->out, line, len);
  kvr_buf_puts(&s->out, "|");
  s->lines++;
}

static int feed(kvr_openai_sse_t *sse, sink_t *sink, const char *data, size_t len) {
  sink->chunk = data;
  sink->chunk_len = len;
  return kvr_openai_sse_feed(sse, data, len, on_line, sink);
}

/* A vLLM-like stream: LF and CRLF line ends, a comment, an event: field, blank separators, a data
 * line without the space, one with two spaces, an empty data line, an unterminated last line. */
static const char STREAM[] =
    ": keep-alive comment\n"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":\"\"}}]}\r\n\r\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
    "event: message\n"
    "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\\n\"}}]}\r\n\n"
    "data:  {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n"
    "data:\n\n"
    "data: [DONE]\n\n"
    "data: unterminated";

static const char LINES[] =
    ": keep-alive comment|"
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
    "\"content\":\"\"}}]}||"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}||"
    "event: message|"
    "data:{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\\n\"}}]}||"
    "data:  {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}||"
    "data:||"
    "data: [DONE]||";

static void test_sse_whole(void **state) {
  (void)state;
  kvr_openai_sse_t sse;
  kvr_openai_sse_init(&sse, 4096);
  sink_t sink = {KVR_BUF_INIT, 0, NULL, 0, 0};
  assert_int_equal(feed(&sse, &sink, STREAM, sizeof STREAM - 1), 0);
  assert_string_equal(sink.out.data, LINES);
  assert_int_equal(sink.lines, 14);
  /* Fed whole, every line was read in place: nothing was copied. */
  assert_int_equal(sink.in_place, sink.lines);
  /* The unterminated line waits for its LF. */
  assert_string_equal(sse.line.data, "data: unterminated");
  assert_int_equal(kvr_openai_sse_pending(&sse), strlen("data: unterminated"));
  assert_int_equal(feed(&sse, &sink, "\n", 1), 0);
  assert_int_equal(sink.lines, 15);
  assert_int_equal(sse.line.len, 0);
  kvr_openai_sse_free(&sse);
  kvr_openai_sse_free(NULL);
  kvr_buf_free(&sink.out);
}

static void check_pieces(const size_t *cuts, size_t ncuts) {
  kvr_openai_sse_t sse;
  kvr_openai_sse_init(&sse, 4096);
  sink_t sink = {KVR_BUF_INIT, 0, NULL, 0, 0};
  size_t n = sizeof STREAM - 1, at = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t to = i < ncuts ? cuts[i] : n;
    assert_int_equal(feed(&sse, &sink, STREAM + at, to - at), 0);
    at = to;
  }
  assert_string_equal(sink.out.data, LINES);
  assert_int_equal(sse.line.len, strlen("data: unterminated"));
  kvr_openai_sse_free(&sse);
  kvr_buf_free(&sink.out);
}

static void test_sse_every_split(void **state) {
  (void)state;
  size_t n = sizeof STREAM - 1;
  for (size_t i = 0; i <= n; i++)
    check_pieces(&i, 1);
  /* Three pieces, at every pair of positions (empty pieces included). */
  for (size_t i = 0; i <= n; i += 3)
    for (size_t j = i; j <= n; j++) {
      size_t cuts[2] = {i, j};
      check_pieces(cuts, 2);
    }
}

static void test_sse_byte_by_byte(void **state) {
  (void)state;
  size_t n = sizeof STREAM - 1;
  size_t *cuts = malloc(n * sizeof *cuts);
  assert_non_null(cuts);
  for (size_t i = 0; i < n; i++)
    cuts[i] = i;
  check_pieces(cuts, n);
  free(cuts);
}

static void test_sse_line_bound(void **state) {
  (void)state;
  kvr_openai_sse_t sse;
  kvr_openai_sse_init(&sse, 10);
  sink_t sink = {KVR_BUF_INIT, 0, NULL, 0, 0};
  /* 10 bytes pass; 11 are dropped whole (a CR counts); the lines around them still arrive. */
  static const char in[] = "0123456789\nABCDEFGHIJK\nshort\n012345678\r\n0123456789\r\nend\n";
  assert_int_equal(feed(&sse, &sink, in, sizeof in - 1), KVR_ELIMIT);
  assert_string_equal(sink.out.data, "0123456789|short|012345678|end|");
  kvr_buf_reset(&sink.out);

  /* Fed byte by byte: KVR_ELIMIT on the byte that goes over, 0 while the rest is skipped. */
  int elimit = 0;
  for (size_t i = 0; i < sizeof in - 1; i++) {
    int rc = feed(&sse, &sink, in + i, 1);
    if (rc == KVR_ELIMIT) {
      elimit++;
      assert_true(i == 21 || i == 50); /* "ABCDEFGHIJK"'s K, "0123456789\r"'s CR */
    } else {
      assert_int_equal(rc, 0);
    }
  }
  assert_int_equal(elimit, 2);
  assert_string_equal(sink.out.data, "0123456789|short|012345678|end|");
  /* A line that never ends holds no more than the bound. */
  kvr_buf_reset(&sink.out);
  char big[100];
  memset(big, 'x', sizeof big);
  assert_int_equal(feed(&sse, &sink, big, sizeof big), KVR_ELIMIT);
  assert_int_equal(feed(&sse, &sink, big, sizeof big), 0);
  assert_int_equal(kvr_openai_sse_pending(&sse), 0);
  assert_int_equal(feed(&sse, &sink, "\nok\n", 4), 0);
  assert_string_equal(sink.out.data, "ok|");
  kvr_openai_sse_free(&sse);
  /* Without a bound the unfinished line grows, and the caller sees how much is held. */
  kvr_openai_sse_init(&sse, SIZE_MAX);
  kvr_buf_reset(&sink.out);
  assert_int_equal(feed(&sse, &sink, big, sizeof big), 0);
  assert_int_equal(feed(&sse, &sink, big, sizeof big), 0);
  assert_int_equal(kvr_openai_sse_pending(&sse), 2 * sizeof big);
  assert_int_equal(feed(&sse, &sink, "\n", 1), 0);
  assert_int_equal(sink.out.len, 2 * sizeof big + 1);
  kvr_openai_sse_free(&sse);
  kvr_buf_free(&sink.out);
}

static void test_sse_reset(void **state) {
  (void)state;
  kvr_openai_sse_t sse;
  kvr_openai_sse_init(&sse, 8);
  sink_t sink = {KVR_BUF_INIT, 0, NULL, 0, 0};
  feed(&sse, &sink, "data: par", 9); /* over the bound: being skipped */
  kvr_openai_sse_reset(&sse);
  assert_int_equal(feed(&sse, &sink, "tial\nx\n", 7), 0);
  assert_string_equal(sink.out.data, "tial|x|");
  feed(&sse, &sink, "abc", 3);
  kvr_openai_sse_reset(&sse);
  assert_int_equal(feed(&sse, &sink, "def\n", 4), 0);
  assert_string_equal(sink.out.data, "tial|x|def|");
  assert_int_equal(feed(&sse, &sink, NULL, 0), 0);
  kvr_openai_sse_free(&sse);
  kvr_buf_free(&sink.out);
}

/* A callback that stops at "data: [DONE]": the feed reports the bytes up to that line's LF, at
 * every split of the stream, and delivers nothing afterwards (issue 37: events after [DONE] were
 * forwarded and learned). */
typedef struct {
  int lines;
  size_t forwarded; /* bytes the caller would forward */
} stop_ctx_t;

static void stop_at_done(void *data, const char *line, size_t len) {
  kvr_openai_sse_t *s = ((void **)data)[0];
  stop_ctx_t *c = ((void **)data)[1];
  const char *p;
  size_t plen;
  c->lines++;
  if (kvr_openai_sse_data(line, len, &p, &plen) && kvr_openai_sse_done(p, plen))
    s->stop = true;
}

static void test_sse_stop(void **state) {
  (void)state;
  static const char stream[] = "data: {\"a\":1}\n\ndata: [DONE]\n\ndata: {\"evil\":1}\n\n";
  size_t want = strlen("data: {\"a\":1}\n\ndata: [DONE]\n");
  size_t len = sizeof stream - 1;
  for (size_t split = 0; split <= len; split++) {
    kvr_openai_sse_t s;
    kvr_openai_sse_init(&s, 1024);
    stop_ctx_t c = {0};
    void *ctx[2] = {&s, &c};
    kvr_openai_sse_feed(&s, stream, split, stop_at_done, ctx);
    c.forwarded += s.consumed;
    kvr_openai_sse_feed(&s, stream + split, len - split, stop_at_done, ctx);
    c.forwarded += s.consumed;
    kvr_openai_sse_feed(&s, "data: more\n", 11, stop_at_done, ctx);
    c.forwarded += s.consumed;
    assert_true(s.stop);
    assert_int_equal(c.forwarded, want);
    assert_int_equal(c.lines, 3); /* the event, its blank line, [DONE]: nothing after */
    kvr_openai_sse_reset(&s);
    assert_false(s.stop);
    kvr_openai_sse_free(&s);
  }
}

/* line_at: where each delivered line begins in the feed's data, SIZE_MAX for a line part of
 * which came in an earlier feed (a caller passing bytes through has sent that part already). */
typedef struct {
  size_t at[8];
  int n;
} at_ctx_t;

static void record_at(void *data, const char *line, size_t len) {
  (void)line, (void)len;
  kvr_openai_sse_t *s = ((void **)data)[0];
  at_ctx_t *c = ((void **)data)[1];
  if (c->n < 8)
    c->at[c->n++] = s->line_at;
}

static void test_sse_line_at(void **state) {
  (void)state;
  kvr_openai_sse_t s;
  kvr_openai_sse_init(&s, 1024);
  assert_true(s.line_at == SIZE_MAX);
  at_ctx_t c = {0};
  void *ctx[2] = {&s, &c};
  kvr_openai_sse_feed(&s, "ab\n\ncd\nef", 10, record_at, ctx); /* ab, "", cd; ef held */
  assert_int_equal(c.n, 3);
  assert_true(c.at[0] == 0 && c.at[1] == 3 && c.at[2] == 4);
  kvr_openai_sse_feed(&s, "gh\nij\n", 6, record_at, ctx); /* efgh began before; ij here */
  assert_int_equal(c.n, 5);
  assert_true(c.at[3] == SIZE_MAX && c.at[4] == 3);
  kvr_openai_sse_free(&s);
}

static void test_sse_data(void **state) {
  (void)state;
  const char *p;
  size_t n;
  static const struct {
    const char *line, *payload;
  } yes[] = {{"data: {}", "{}"}, {"data:{}", "{}"},     {"data:   x y ", "x y "},  {"data:", ""},
             {"data: ", ""},     {"data:\t{}", "\t{}"}, {"data: [DONE]", "[DONE]"}};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(yes); i++) {
    assert_true(kvr_openai_sse_data(yes[i].line, strlen(yes[i].line), &p, &n));
    assert_int_equal(n, strlen(yes[i].payload));
    assert_memory_equal(p, yes[i].payload, n);
  }
  static const char *const no[] = {"",          "data",        "Data: x", " data: x",
                                   ": data: x", "event: data", "id: 1"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(no); i++)
    assert_false(kvr_openai_sse_data(no[i], strlen(no[i]), &p, &n));
  /* Only len bytes are read: a longer buffer's tail is not part of the line. */
  assert_true(kvr_openai_sse_data("data: abcdef", 8, &p, &n));
  assert_int_equal(n, 2);
  assert_true(kvr_openai_sse_done("[DONE]", 6));
  assert_false(kvr_openai_sse_done("[DONE] ", 7));
  assert_false(kvr_openai_sse_done("[DONE]", 5));
  assert_false(kvr_openai_sse_done("{}", 2));
}

/* ---- response objects -------------------------------------------------------------------------
 */

static kvr_openai_chunk_t read_chunk(const char *json, cJSON **tree) {
  *tree = cJSON_Parse(json);
  assert_non_null(*tree);
  kvr_openai_chunk_t c;
  memset(&c, 0xa5, sizeof c); /* overwritten whole */
  kvr_openai_chunk_read(*tree, &c);
  return c;
}

#define ASSERT_TEXT(c, s)                                                                          \
  do {                                                                                             \
    assert_non_null((c).text);                                                                     \
    assert_int_equal((c).text_len, strlen(s));                                                     \
    assert_string_equal((c).text, s);                                                              \
  } while (0)

static void test_chunk_text(void **state) {
  (void)state;
  cJSON *t;
  kvr_openai_chunk_t c;
  /* Chat stream. */
  c = read_chunk("{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok\"}}]}", &t);
  ASSERT_TEXT(c, "tok");
  assert_null(c.reasoning);
  assert_null(c.error);
  assert_false(c.has_prompt_tokens || c.has_cached_tokens || c.has_completion_tokens);
  cJSON_Delete(t);
  /* The role chunk and the final chunk carry no text. */
  c = read_chunk("{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}", &t);
  assert_null(c.text);
  cJSON_Delete(t);
  c = read_chunk("{\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}", &t);
  assert_null(c.text);
  cJSON_Delete(t);
  /* Reasoning: not answer text, reported apart; content null or empty. */
  c = read_chunk("{\"choices\":[{\"delta\":{\"content\":null,\"reasoning_content\":\"hm\"}}]}", &t);
  assert_null(c.text);
  assert_string_equal(c.reasoning, "hm");
  assert_int_equal(c.reasoning_len, 2);
  cJSON_Delete(t);
  c = read_chunk("{\"choices\":[{\"delta\":{\"content\":\"a\",\"reasoning_content\":\"\"}}]}", &t);
  ASSERT_TEXT(c, "a");
  assert_null(c.reasoning);
  cJSON_Delete(t);
  /* Completions stream, and whole bodies of both endpoints. */
  c = read_chunk("{\"object\":\"text_completion\",\"choices\":[{\"text\":\" once\"}]}", &t);
  ASSERT_TEXT(c, " once");
  cJSON_Delete(t);
  c = read_chunk("{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\":\"Hi!\"}}]}", &t);
  ASSERT_TEXT(c, "Hi!");
  cJSON_Delete(t);
  /* Escapes are decoded; an embedded NUL ends the text (C string). */
  c = read_chunk("{\"choices\":[{\"delta\":{\"content\":\"a\\\"b\\u00e9\\n\"}}]}", &t);
  ASSERT_TEXT(c, "a\"b\xc3\xa9\n");
  cJSON_Delete(t);
  /* Only choices[0] counts; a missing or odd choices has nothing. */
  c = read_chunk("{\"choices\":[{\"delta\":{}},{\"delta\":{\"content\":\"x\"}}]}", &t);
  assert_null(c.text);
  cJSON_Delete(t);
  static const char *const none[] = {"{}",
                                     "{\"choices\":[]}",
                                     "{\"choices\":{}}",
                                     "{\"choices\":[5]}",
                                     "[1]",
                                     "\"s\"",
                                     "{\"choices\":"
                                     "[{\"text\":7}]}"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(none); i++) {
    c = read_chunk(none[i], &t);
    assert_null(c.text);
    assert_null(c.reasoning);
    assert_null(c.error);
    assert_false(c.has_prompt_tokens || c.has_cached_tokens || c.has_completion_tokens);
    cJSON_Delete(t);
  }
  /* delta.content not a string falls back to the choice's text. */
  c = read_chunk("{\"choices\":[{\"delta\":{\"content\":1},\"text\":\"t\"}]}", &t);
  ASSERT_TEXT(c, "t");
  cJSON_Delete(t);
  kvr_openai_chunk_read(NULL, &c);
  assert_null(c.text);
}

static void test_chunk_usage(void **state) {
  (void)state;
  cJSON *t;
  kvr_openai_chunk_t c;
  c = read_chunk("{\"choices\":[],\"usage\":{\"prompt_tokens\":1200,\"completion_tokens\":30,"
                 "\"total_tokens\":1230,\"prompt_tokens_details\":{\"cached_tokens\":1024}}}",
                 &t);
  assert_null(c.text);
  assert_true(c.has_prompt_tokens && c.has_cached_tokens && c.has_completion_tokens);
  assert_int_equal(c.prompt_tokens, 1200);
  assert_int_equal(c.cached_tokens, 1024);
  assert_int_equal(c.completion_tokens, 30);
  cJSON_Delete(t);
  /* No details, details null, partial usage, odd types. */
  c = read_chunk("{\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":null}}", &t);
  assert_true(c.has_prompt_tokens);
  assert_false(c.has_cached_tokens || c.has_completion_tokens);
  assert_int_equal(c.prompt_tokens, 5);
  cJSON_Delete(t);
  c = read_chunk("{\"usage\":{\"completion_tokens\":3,\"prompt_tokens\":\"5\"}}", &t);
  assert_false(c.has_prompt_tokens);
  assert_true(c.has_completion_tokens);
  assert_int_equal(c.completion_tokens, 3);
  cJSON_Delete(t);
  c = read_chunk("{\"usage\":[1],\"choices\":[{\"text\":\"x\"}]}", &t);
  assert_false(c.has_prompt_tokens || c.has_cached_tokens || c.has_completion_tokens);
  ASSERT_TEXT(c, "x");
  cJSON_Delete(t);
  /* Usage is taken whole or not at all: a fraction, a negative, a figure above 2^32 (1e300,
   * 2^64-1) or cached tokens above the prompt's (or without it) refuse every figure. */
  static const char *const absurd[] = {
      "{\"usage\":{\"prompt_tokens\":7.9,\"completion_tokens\":3}}",
      "{\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":-3}}",
      "{\"usage\":{\"prompt_tokens\":1e300,\"completion_tokens\":3}}",
      "{\"usage\":{\"prompt_tokens\":18446744073709551615,\"completion_tokens\":3}}",
      "{\"usage\":{\"prompt_tokens\":4294967297}}",
      "{\"usage\":{\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":11}}}",
      "{\"usage\":{\"prompt_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":1e30}}}",
      "{\"usage\":{\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":1}}}",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(absurd); i++) {
    c = read_chunk(absurd[i], &t);
    if (!c.usage_invalid || c.has_prompt_tokens || c.has_cached_tokens || c.has_completion_tokens)
      fail_msg("usage taken from %s", absurd[i]);
    cJSON_Delete(t);
  }
  /* The bounds themselves are sane: 0, cached == prompt, 2^32. */
  c = read_chunk("{\"usage\":{\"prompt_tokens\":4294967296,\"completion_tokens\":0,"
                 "\"prompt_tokens_details\":{\"cached_tokens\":4294967296}}}",
                 &t);
  assert_false(c.usage_invalid);
  assert_true(c.prompt_tokens == 4294967296ull && c.cached_tokens == 4294967296ull);
  assert_int_equal(c.completion_tokens, 0);
  cJSON_Delete(t);
  /* Usage and text in one object (a non-streamed body). */
  c = read_chunk("{\"choices\":[{\"message\":{\"content\":\"ok\"}}],\"usage\":{\"prompt_tokens\":"
                 "9,\"completion_tokens\":1}}",
                 &t);
  ASSERT_TEXT(c, "ok");
  assert_int_equal(c.prompt_tokens, 9);
  cJSON_Delete(t);
}

static void test_chunk_error(void **state) {
  (void)state;
  cJSON *t;
  kvr_openai_chunk_t c;
  c = read_chunk("{\"error\":{\"message\":\"engine died\",\"type\":\"server_error\"}}", &t);
  assert_non_null(c.error);
  assert_string_equal(c.error_message, "engine died");
  cJSON_Delete(t);
  c = read_chunk("{\"error\":null,\"choices\":[{\"text\":\"x\"}]}", &t);
  assert_non_null(c.error);
  assert_true(cJSON_IsNull(c.error));
  assert_null(c.error_message);
  ASSERT_TEXT(c, "x");
  cJSON_Delete(t);
  c = read_chunk("{\"error\":\"boom\"}", &t);
  assert_true(cJSON_IsString(c.error));
  assert_null(c.error_message);
  cJSON_Delete(t);
  c = read_chunk("{\"error\":{\"message\":5}}", &t);
  assert_non_null(c.error);
  assert_null(c.error_message);
  cJSON_Delete(t);
  /* The broken-stream event the proxy writes reads back as an error. */
  kvr_buf_t ev = KVR_BUF_INIT;
  kvr_openai_stream_error_event(&ev, "timeout");
  const char *p;
  size_t n;
  const char *eol = memchr(ev.data, '\n', ev.len);
  assert_true(kvr_openai_sse_data(ev.data, (size_t)(eol - ev.data), &p, &n));
  t = cJSON_ParseWithLength(p, n);
  assert_non_null(t);
  kvr_openai_chunk_read(t, &c);
  assert_string_equal(c.error_message, "upstream worker failed mid-stream: timeout");
  cJSON_Delete(t);
  kvr_buf_free(&ev);
}

/* ---- scratch parses
 * ------------------------------------------------------------------------------
 */

/* The tree of a scratch parse prints exactly as cJSON_ParseWithLength's; a parse reuses the arena
 * (the next one replaces the tree); invalid and empty text give NULL; a tree bigger than the first
 * chunk and one bigger than what the arena keeps (1 MiB) parse whole; ordinary cJSON trees made
 * and freed between scratch parses are untouched by them (ASan checks every allocation). */
static void test_parse_scratch(void **state) {
  (void)state;
  static const char *const docs[] = {
      "{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1795538016,\"choices\":"
      "[{\"index\":0,\"delta\":{\"content\":\"mep \\u00e9\\n\"},\"logprobs\":null,"
      "\"finish_reason\":null}]}",
      "{\"usage\":{\"prompt_tokens\":16,\"completion_tokens\":8,\"prompt_tokens_details\":"
      "{\"cached_tokens\":4}},\"x\":[1.5,-2e3,true,false,null,\"\"]}",
      "[]",
      "\"just a string\"",
  };
  for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) {
    cJSON *ref = cJSON_ParseWithLength(docs[i], strlen(docs[i]));
    assert_non_null(ref);
    char *want = cJSON_PrintUnformatted(ref);
    const cJSON *got = kvr_openai_parse_scratch(docs[i], strlen(docs[i]));
    assert_non_null(got);
    char *have = cJSON_PrintUnformatted(got);
    assert_string_equal(have, want);
    kvr_openai_chunk_t a, b;
    kvr_openai_chunk_read(ref, &a);
    kvr_openai_chunk_read(got, &b);
    assert_int_equal(a.text_len, b.text_len);
    assert_int_equal(b.prompt_tokens, a.prompt_tokens);
    assert_int_equal(b.cached_tokens, a.cached_tokens);
    free(have);
    free(want);
    cJSON_Delete(ref);
  }
  static const char *const bad[] = {"", "{", "{\"a\":}", "nul", "[1,2"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    assert_null(kvr_openai_parse_scratch(bad[i], strlen(bad[i])));

  /* Large: an array of 40,000 strings (several chunks), then 400,000 (over the kept size). */
  for (size_t n = 40000; n <= 400000; n *= 10) {
    kvr_buf_t big = KVR_BUF_INIT;
    kvr_buf_puts(&big, "[");
    for (size_t i = 0; i < n; i++)
      kvr_buf_printf(&big, "%s\"s%zu\"", i ? "," : "", i);
    kvr_buf_puts(&big, "]");
    const cJSON *t = kvr_openai_parse_scratch(big.data, big.len);
    assert_non_null(t);
    assert_int_equal(cJSON_GetArraySize(t), (int)n);
    char last[32];
    snprintf(last, sizeof last, "s%zu", n - 1);
    assert_string_equal(cJSON_GetArrayItem(t, (int)n - 1)->valuestring, last);
    kvr_buf_free(&big);
    cJSON *own = cJSON_CreateObject(); /* malloc'd as before, freed as before */
    cJSON_AddStringToObject(own, "k", "v");
    cJSON_Delete(own);
  }
  const cJSON *t = kvr_openai_parse_scratch(docs[0], strlen(docs[0]));
  kvr_openai_chunk_t c;
  kvr_openai_chunk_read(t, &c);
  assert_int_equal(c.text_len, strlen("mep \xc3\xa9\n"));
  assert_memory_equal(c.text, "mep \xc3\xa9\n", c.text_len);
  kvr_openai_scratch_free();
  kvr_openai_scratch_free();
  assert_non_null(kvr_openai_parse_scratch("{}", 2));
  kvr_openai_scratch_free();
}

KVR_TEST_MAIN(cmocka_unit_test(test_route), cmocka_unit_test(test_features_errors),
              cmocka_unit_test(test_features_match_prompt), cmocka_unit_test(test_error_body),
              cmocka_unit_test(test_stream_error_event), cmocka_unit_test(test_sse_whole),
              cmocka_unit_test(test_sse_every_split), cmocka_unit_test(test_sse_byte_by_byte),
              cmocka_unit_test(test_sse_line_bound), cmocka_unit_test(test_sse_reset),
              cmocka_unit_test(test_sse_data), cmocka_unit_test(test_sse_stop),
              cmocka_unit_test(test_sse_line_at), cmocka_unit_test(test_chunk_text),
              cmocka_unit_test(test_chunk_usage), cmocka_unit_test(test_chunk_error),
              cmocka_unit_test(test_parse_scratch))

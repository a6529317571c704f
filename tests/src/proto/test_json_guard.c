/* test_json_guard.c -- the one-pass request body guard (src/proto/json_guard.c).
 *
 * Every rule with the status, OpenAI code and path it reports: strict JSON (grammar, escapes,
 * UTF-8, raw control characters, trailing data, empty body), each limit exactly at its bound and
 * one past it (depth, values, open keys, token ids of "prompt" and of each prompt in a batch,
 * messages, content parts), duplicate keys at every depth and through escapes (and no false ones:
 * siblings, other levels, keys that differ after a NUL, tables grown, shrunk and rebuilt), U+0000
 * reported; every strict prefix of a valid body refused; and the three hostile bodies of issue 37
 * (4.19 M token ids, 2.8 M empty arrays, 280 k messages in 8 MiB) refused within their first
 * megabyte with no allocation proportional to them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "proto/json_guard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------------------------------
 */

static kvr_json_guard_limits_t defaults(void) {
  kvr_json_guard_limits_t lim;
  kvr_json_guard_limits_default(&lim);
  return lim;
}

static kvr_json_guard_verdict_t check_n(const char *body, size_t len, kvr_json_guard_kind_t kind,
                                        const kvr_json_guard_limits_t *lim) {
  kvr_json_guard_verdict_t v;
  int rc = kvr_json_guard_check(body, len, kind, lim, &v);
  if (v.rule == KVR_JSON_GUARD_OK) {
    assert_int_equal(rc, 0);
    assert_int_equal(v.status, 0);
    assert_null(v.code);
    assert_int_equal(v.offset, len);
  } else {
    assert_int_equal(rc, v.rule >= KVR_JSON_GUARD_TOKENS ? KVR_ELIMIT : KVR_EPARSE);
    assert_true(v.status == 400 || v.status == 413);
    assert_non_null(v.code);
    assert_true(v.message[0] != '\0');
    assert_true(v.offset <= len);
    assert_null(memchr(v.message, '\n', strlen(v.message)));
  }
  return v;
}

static kvr_json_guard_verdict_t check(const char *body, kvr_json_guard_kind_t kind,
                                      const kvr_json_guard_limits_t *lim) {
  return check_n(body, strlen(body), kind, lim);
}

/* The rule body breaks under the default limits (any kind). */
static kvr_json_guard_rule_t rule_of(const char *body) {
  kvr_json_guard_limits_t lim = defaults();
  return check(body, KVR_JSON_GUARD_ANY, &lim).rule;
}

#define assert_rule(body, want)                                                                    \
  do {                                                                                             \
    kvr_json_guard_rule_t got_ = rule_of(body);                                                    \
    if (got_ != (want))                                                                            \
      fail_msg("%s: got %s, want %s", (body), kvr_json_guard_rule_name(got_),                      \
               kvr_json_guard_rule_name(want));                                                    \
  } while (0)

/* [n numbers] with an optional prefix and suffix: "{\"prompt\":[" ... "]}". */
static void append_ids(kvr_buf_t *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    kvr_buf_puts(b, i ? ",7" : "7");
}

/* ---- valid JSON -------------------------------------------------------------------------------
 */

static void test_valid(void **state) {
  (void)state;
  static const char *const ok[] = {
      "{}",
      "[]",
      "0",
      "-0",
      "-0.5e-7",
      "1E+2",
      "123456789012345678901234567890",
      "\"\"",
      "true",
      "null",
      " \t\r\n{ \"a\" : [ 1 , 2 ] , \"b\" : { } } \t\r\n",
      "{\"a\":\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"}",
      "[\"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf \xee\x80\x80 \xf4\x8f\xbf\xbf\"]",
      "[\"\x7f\"]",            /* DEL is not a control character for JSON */
      "\xef\xbb\xbf{\"a\":1}", /* a UTF-8 BOM: json.loads(bytes) reads utf-8-sig */
      "[[[],[[]]],{\"a\":{\"b\":[{}]}}]",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(ok); i++)
    assert_rule(ok[i], KVR_JSON_GUARD_OK);
  kvr_json_guard_limits_t lim = defaults();
  kvr_json_guard_verdict_t v = check("{\"a\":[1,{\"b\":null}],\"c\":\"x\"}", 0, &lim);
  assert_int_equal(v.nodes, 6); /* object, array, 1, object, null, "x" */
  assert_int_equal(v.depth, 3);
  assert_false(v.has_nul);
  assert_int_equal(v.path[0], '\0');
}

/* ---- strict JSON ------------------------------------------------------------------------------
 */

static void test_syntax(void **state) {
  (void)state;
  static const char *const bad[] = {
      " ",
      "\xef\xbb\xbf",
      "[",
      "]",
      "{",
      "}",
      "[1,]",
      "[,1]",
      "[1 2]",
      "{\"a\":1,}",
      "{\"a\"}",
      "{\"a\" 1}",
      "{a:1}",
      "{'a':1}",
      "{\"a\":1 \"b\":2}",
      "{1:2}",
      "[01]",
      "[-]",
      "[1.]",
      "[.5]",
      "[+1]",
      "[1e]",
      "[1e+]",
      "[0x1]",
      "[NaN]",
      "[Infinity]",
      "[-Infinity]",
      "[tru]",
      "[True]",
      "[nul]",
      "[\"\\x\"]",
      "[\"\\U0041\"]",
      "[\"\\u00G1\"]",
      "[\"\\u12\"]",
      "[\"\\ud800\"]",
      "[\"\\udc00\"]",
      "[\"\\ud800\\u0041\"]",
      "[\"\\ud800x\"]",
      "[\"\\ud800\\ud800\"]",
      "[\"abc",
      "[\"abc\\",
      "[\"\\u",
      "\x01[]",
      "[\xef\xbb\xbf]",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    assert_rule(bad[i], KVR_JSON_GUARD_SYNTAX);
  kvr_json_guard_limits_t lim = defaults();
  kvr_json_guard_verdict_t v = check("{\"model\":\"m\",\"messages\":[1,]}", 0, &lim);
  assert_int_equal(v.status, 400);
  assert_string_equal(v.code, "invalid_json");
  assert_int_equal(v.offset, 27);
  assert_string_equal(v.path, "messages[1]");
  assert_non_null(strstr(v.message, "byte 27"));
  v = check("", 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_EMPTY);
  assert_string_equal(v.code, "missing_body");
}

static void test_control_characters(void **state) {
  (void)state;
  kvr_json_guard_limits_t lim = defaults();
  for (unsigned c = 0; c < 0x20; c++) {
    char body[] = "{\"model\":\"ab?cd\"}";
    body[12] = (char)c;
    kvr_json_guard_verdict_t v = check_n(body, sizeof body - 1, 0, &lim);
    assert_int_equal(v.rule, KVR_JSON_GUARD_CONTROL);
    assert_int_equal(v.status, 400);
    assert_int_equal(v.offset, 12);
    assert_string_equal(v.path, "model");
    char hex[8];
    snprintf(hex, sizeof hex, "0x%02x", c);
    assert_non_null(strstr(v.message, hex));
    body[2] = (char)c; /* in a key too */
    assert_int_equal(check_n(body, sizeof body - 1, 0, &lim).rule, KVR_JSON_GUARD_CONTROL);
  }
  /* Escaped, they are fine; whitespace between tokens is only " \t\n\r". */
  assert_rule("[\"\\u0001\\n\\t\"]", KVR_JSON_GUARD_OK);
  assert_rule("[1,\x0b 2]", KVR_JSON_GUARD_SYNTAX);
  assert_rule("[1,\x0c 2]", KVR_JSON_GUARD_SYNTAX);
}

static void test_trailing(void **state) {
  (void)state;
  static const char *const bad[] = {"{} x", "{}{}", "[1] 2", "{}\n,", "\"a\"\"b\"", "{}]", "1 2"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    assert_rule(bad[i], KVR_JSON_GUARD_TRAILING);
  kvr_json_guard_limits_t lim = defaults();
  static const char nul[] = "{\"a\":1}\0";
  kvr_json_guard_verdict_t v = check_n(nul, sizeof nul - 1, 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_TRAILING);
  assert_int_equal(v.offset, 7);
  assert_string_equal(v.code, "invalid_json");
  assert_rule("{} \r\n\t ", KVR_JSON_GUARD_OK);
}

static void test_utf8(void **state) {
  (void)state;
  static const char *const bad[] = {
      "[\"\x80\"]",             /* continuation byte alone */
      "[\"\xc0\x80\"]",         /* overlong NUL */
      "[\"\xc1\xbf\"]",         /* overlong */
      "[\"\xe0\x80\x80\"]",     /* overlong 3 */
      "[\"\xe0\x9f\xbf\"]",     /* overlong 3 */
      "[\"\xed\xa0\x80\"]",     /* UTF-8-encoded surrogate */
      "[\"\xed\xbf\xbf\"]",     /* UTF-8-encoded surrogate */
      "[\"\xf0\x8f\xbf\xbf\"]", /* overlong 4 */
      "[\"\xf4\x90\x80\x80\"]", /* above U+10FFFF */
      "[\"\xf5\x80\x80\x80\"]", /* no such lead */
      "[\"\xff\"]",
      "[\"\xe2\x82\"]", /* cut short */
      "[\"\xe2\x82",    /* cut at the end of the body */
      "[\"\xc3\x28\"]", /* bad continuation */
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++)
    assert_rule(bad[i], KVR_JSON_GUARD_UTF8);
  kvr_json_guard_limits_t lim = defaults();
  kvr_json_guard_verdict_t v = check("{\"m\":[\"ok\",\"x\xff\"]}", 0, &lim);
  assert_string_equal(v.code, "invalid_encoding");
  assert_int_equal(v.offset, 13);
  assert_string_equal(v.path, "m[1]");
}

/* Every strict prefix of a valid body is refused, the whole body accepted. */
static void test_truncations(void **state) {
  (void)state;
  static const char body[] =
      "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
      "\"h\\u00e9llo \\ud83d\\ude00 \xc3\xa9\\n\"}]},{\"role\":\"assistant\",\"content\":null,"
      "\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}],"
      "\"max_tokens\":-1.5e+3,\"stream\":true,\"stop\":[],\"x\":false}";
  kvr_json_guard_limits_t lim = defaults();
  for (size_t n = 0; n < sizeof body - 1; n++) {
    kvr_json_guard_verdict_t v = check_n(body, n, KVR_JSON_GUARD_CHAT, &lim);
    if (v.rule == KVR_JSON_GUARD_OK)
      fail_msg("prefix of %zu bytes accepted", n);
    assert_true(v.rule == KVR_JSON_GUARD_SYNTAX || v.rule == KVR_JSON_GUARD_UTF8 ||
                v.rule == KVR_JSON_GUARD_EMPTY);
  }
  assert_int_equal(check_n(body, sizeof body - 1, KVR_JSON_GUARD_CHAT, &lim).rule,
                   KVR_JSON_GUARD_OK);
}

/* ---- limits -----------------------------------------------------------------------------------
 */

/* n arrays or objects ({"a": ...}) nested. */
static void nested(kvr_buf_t *b, size_t n, bool objects) {
  kvr_buf_reset(b);
  for (size_t i = 0; i < n; i++)
    kvr_buf_puts(b, objects ? "{\"a\":" : "[");
  kvr_buf_puts(b, "1");
  for (size_t i = 0; i < n; i++)
    kvr_buf_puts(b, objects ? "}" : "]");
}

static void test_depth(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_json_guard_limits_t lim = defaults();
  for (int objects = 0; objects < 2; objects++) {
    nested(&b, KVR_JSON_GUARD_MAX_DEPTH_DEFAULT, objects);
    kvr_json_guard_verdict_t v = check_n(b.data, b.len, 0, &lim);
    assert_int_equal(v.rule, KVR_JSON_GUARD_OK);
    assert_int_equal(v.depth, KVR_JSON_GUARD_MAX_DEPTH_DEFAULT);
    nested(&b, KVR_JSON_GUARD_MAX_DEPTH_DEFAULT + 1, objects);
    v = check_n(b.data, b.len, 0, &lim);
    assert_int_equal(v.rule, KVR_JSON_GUARD_DEPTH);
    assert_int_equal(v.status, 400);
    assert_string_equal(v.code, "nesting_too_deep");
    assert_int_equal(v.depth, KVR_JSON_GUARD_MAX_DEPTH_DEFAULT);
    assert_non_null(strstr(v.message, "128"));
  }
  lim.max_depth = 3;
  assert_int_equal(check("[[[]]]", 0, &lim).rule, KVR_JSON_GUARD_OK);
  kvr_json_guard_verdict_t v = check("{\"a\":[{\"b\":[]}]}", 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_DEPTH);
  assert_string_equal(v.path, "a[0].b");
  lim.max_depth = 0;
  assert_int_equal(check("1", 0, &lim).rule, KVR_JSON_GUARD_OK);
  assert_int_equal(check("[]", 0, &lim).rule, KVR_JSON_GUARD_DEPTH);
  kvr_buf_free(&b);
}

static void test_nodes(void **state) {
  (void)state;
  kvr_json_guard_limits_t lim = defaults();
  lim.max_nodes = 10;
  /* An object, "x", an array and its elements: 10 values, then 11. */
  assert_int_equal(check("{\"a\":\"x\",\"b\":[1,2,3,4,5,6,7]}", 0, &lim).rule, KVR_JSON_GUARD_OK);
  kvr_json_guard_verdict_t v = check("{\"a\":\"x\",\"b\":[1,2,3,4,5,6,7,8]}", 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_NODES);
  assert_int_equal(v.status, 413);
  assert_string_equal(v.code, "request_too_large");
  assert_string_equal(v.path, "b[7]");
  assert_int_equal(v.nodes, 11);
  assert_non_null(strstr(v.message, "more than 10"));
  /* At the default bound: an array of 262,143 elements is 262,144 values. */
  kvr_buf_t b = KVR_BUF_INIT;
  lim = defaults();
  kvr_buf_puts(&b, "[");
  append_ids(&b, KVR_JSON_GUARD_MAX_NODES_DEFAULT - 1);
  kvr_buf_puts(&b, "]");
  assert_int_equal(check_n(b.data, b.len, 0, &lim).rule, KVR_JSON_GUARD_OK);
  b.len--;
  kvr_buf_puts(&b, ",7]");
  assert_int_equal(check_n(b.data, b.len, 0, &lim).rule, KVR_JSON_GUARD_NODES);
  kvr_buf_free(&b);
}

static void test_open_keys(void **state) {
  (void)state;
  kvr_json_guard_limits_t lim = defaults();
  lim.max_open_keys = 4;
  assert_int_equal(check("{\"a\":1,\"b\":{\"c\":1,\"d\":2}}", 0, &lim).rule, KVR_JSON_GUARD_OK);
  kvr_json_guard_verdict_t v = check("{\"a\":1,\"b\":{\"c\":1,\"d\":2,\"e\":3}}", 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_KEYS);
  assert_int_equal(v.status, 413);
  assert_string_equal(v.code, "too_many_keys");
  assert_string_equal(v.path, "b.e");
  /* Closed objects give their keys back: many small objects under a small bound. */
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "{\"x\":[");
  for (int i = 0; i < 1000; i++)
    kvr_buf_puts(&b, i ? ",{\"p\":1,\"q\":{\"r\":2}}" : "{\"p\":1,\"q\":{\"r\":2}}");
  kvr_buf_puts(&b, "]}");
  assert_int_equal(check_n(b.data, b.len, 0, &lim).rule, KVR_JSON_GUARD_OK);
  /* At the default bound and one past it, in one object. */
  lim = defaults();
  kvr_buf_reset(&b);
  kvr_buf_puts(&b, "{");
  for (unsigned i = 0; i < KVR_JSON_GUARD_MAX_OPEN_KEYS_DEFAULT; i++)
    kvr_buf_printf(&b, "%s\"k%u\":0", i ? "," : "", i);
  kvr_buf_puts(&b, "}");
  v = check_n(b.data, b.len, 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_OK);
  assert_true(v.peak_bytes <= 48 * (size_t)KVR_JSON_GUARD_MAX_OPEN_KEYS_DEFAULT + 4096);
  b.len--;
  kvr_buf_puts(&b, ",\"one_more\":0}");
  v = check_n(b.data, b.len, 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_KEYS);
  assert_string_equal(v.path, "one_more");
  kvr_buf_free(&b);
}

/* {"model":"m","prompt":[n ids]} */
static void prompt_body(kvr_buf_t *b, size_t n) {
  kvr_buf_reset(b);
  kvr_buf_puts(b, "{\"model\":\"m\",\"prompt\":[");
  append_ids(b, n);
  kvr_buf_puts(b, "],\"max_tokens\":1}");
}

static void test_prompt_tokens(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_json_guard_limits_t lim = defaults();
  lim.max_prompt_tokens = 131072; /* a worker's max_model_len */
  prompt_body(&b, 131072);
  assert_int_equal(check_n(b.data, b.len, KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
                   KVR_JSON_GUARD_OK);
  prompt_body(&b, 131073);
  kvr_json_guard_verdict_t v = check_n(b.data, b.len, KVR_JSON_GUARD_COMPLETIONS, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_TOKENS);
  assert_int_equal(v.status, 400);
  assert_string_equal(v.code, "context_length_exceeded");
  assert_string_equal(v.path, "prompt");
  assert_non_null(strstr(v.message, "131072"));
  assert_non_null(strstr(v.message, "maximum context length"));
  /* Not counted in a chat body, nor in any other body, nor below the top level. */
  assert_int_equal(check_n(b.data, b.len, KVR_JSON_GUARD_CHAT, &lim).rule, KVR_JSON_GUARD_OK);
  assert_int_equal(check_n(b.data, b.len, KVR_JSON_GUARD_ANY, &lim).rule, KVR_JSON_GUARD_OK);
  lim.max_prompt_tokens = 3;
  assert_int_equal(check("{\"x\":{\"prompt\":[1,2,3,4]}}", KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
                   KVR_JSON_GUARD_OK);
  /* Each prompt of a batch on its own; strings are not token ids. */
  assert_int_equal(check("{\"prompt\":[[1,2,3],[4,5,6]]}", KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
                   KVR_JSON_GUARD_OK);
  v = check("{\"prompt\":[[1,2,3],[4,5,6,7]]}", KVR_JSON_GUARD_COMPLETIONS, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_TOKENS);
  assert_string_equal(v.path, "prompt[1]");
  assert_int_equal(
      check("{\"prompt\":[\"a\",\"b\",\"c\",\"d\"]}", KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
      KVR_JSON_GUARD_OK);
  /* The member is found by its unescaped name, as json.loads names it; negatives count. */
  v = check("{\"pr\\u006fmpt\":[-1,2,3,4]}", KVR_JSON_GUARD_COMPLETIONS, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_TOKENS);
  assert_string_equal(v.path, "prompt");
  lim.max_prompt_tokens = 0;
  assert_int_equal(check("{\"prompt\":[]}", KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
                   KVR_JSON_GUARD_OK);
  assert_int_equal(check("{\"prompt\":[0]}", KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
                   KVR_JSON_GUARD_TOKENS);
  kvr_buf_free(&b);
}

/* {"model":"m","messages":[n messages]}; message 2 has parts content parts when parts > 0. */
static void chat_body(kvr_buf_t *b, size_t n, size_t parts) {
  kvr_buf_reset(b);
  kvr_buf_puts(b, "{\"model\":\"m\",\"messages\":[");
  for (size_t i = 0; i < n; i++) {
    kvr_buf_puts(b, i ? "," : "");
    if (i != 2 || parts == 0) {
      kvr_buf_puts(b, "{\"role\":\"user\",\"content\":\"hi\"}");
      continue;
    }
    kvr_buf_puts(b, "{\"role\":\"user\",\"content\":[");
    for (size_t k = 0; k < parts; k++)
      kvr_buf_puts(b, k ? ",{\"type\":\"text\",\"text\":\"x\"}"
                        : "{\"type\":\"text\",\"text\":\"x\"}");
    kvr_buf_puts(b, "]}");
  }
  kvr_buf_puts(b, "]}");
}

static void test_messages(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_json_guard_limits_t lim = defaults();
  chat_body(&b, KVR_JSON_GUARD_MAX_MESSAGES_DEFAULT, 0);
  assert_int_equal(check_n(b.data, b.len, KVR_JSON_GUARD_CHAT, &lim).rule, KVR_JSON_GUARD_OK);
  chat_body(&b, KVR_JSON_GUARD_MAX_MESSAGES_DEFAULT + 1, 0);
  kvr_json_guard_verdict_t v = check_n(b.data, b.len, KVR_JSON_GUARD_CHAT, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_MESSAGES);
  assert_int_equal(v.status, 413);
  assert_string_equal(v.code, "too_many_messages");
  assert_string_equal(v.path, "messages");
  assert_non_null(strstr(v.message, "32768"));
  assert_int_equal(check_n(b.data, b.len, KVR_JSON_GUARD_COMPLETIONS, &lim).rule,
                   KVR_JSON_GUARD_OK);
  lim.max_messages = 3;
  assert_int_equal(check("{\"messages\":[1,2,3]}", KVR_JSON_GUARD_CHAT, &lim).rule,
                   KVR_JSON_GUARD_OK);
  assert_int_equal(check("{\"messages\":[1,2,3,4]}", KVR_JSON_GUARD_CHAT, &lim).rule,
                   KVR_JSON_GUARD_MESSAGES);
  assert_int_equal(check("[{\"messages\":[1,2,3,4]}]", KVR_JSON_GUARD_CHAT, &lim).rule,
                   KVR_JSON_GUARD_OK);
  kvr_buf_free(&b);
}

static void test_parts(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_json_guard_limits_t lim = defaults();
  chat_body(&b, 4, KVR_JSON_GUARD_MAX_PARTS_DEFAULT);
  assert_int_equal(check_n(b.data, b.len, KVR_JSON_GUARD_CHAT, &lim).rule, KVR_JSON_GUARD_OK);
  chat_body(&b, 4, KVR_JSON_GUARD_MAX_PARTS_DEFAULT + 1);
  kvr_json_guard_verdict_t v = check_n(b.data, b.len, KVR_JSON_GUARD_CHAT, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_PARTS);
  assert_int_equal(v.status, 413);
  assert_string_equal(v.code, "too_many_content_parts");
  assert_string_equal(v.path, "messages[2].content");
  assert_non_null(strstr(v.message, "4096"));
  /* Only a message's "content" array counts. */
  lim.max_parts = 1;
  assert_int_equal(
      check("{\"messages\":[{\"tool_calls\":[1,2]},{\"content\":[1]}]}", KVR_JSON_GUARD_CHAT, &lim)
          .rule,
      KVR_JSON_GUARD_OK);
  assert_int_equal(
      check("{\"messages\":[{\"content\":[1]},{\"content\":[1,2]}]}", KVR_JSON_GUARD_CHAT, &lim)
          .rule,
      KVR_JSON_GUARD_PARTS);
  kvr_buf_free(&b);
}

/* ---- duplicate keys ---------------------------------------------------------------------------
 */

static void assert_duplicate(const char *body, const char *path) {
  kvr_json_guard_limits_t lim = defaults();
  kvr_json_guard_verdict_t v = check(body, KVR_JSON_GUARD_CHAT, &lim);
  if (v.rule != KVR_JSON_GUARD_DUPLICATE)
    fail_msg("%s: %s, want DUPLICATE", body, kvr_json_guard_rule_name(v.rule));
  assert_int_equal(v.status, 400);
  assert_string_equal(v.code, "duplicate_key");
  assert_string_equal(v.path, path);
  assert_non_null(strstr(v.message, path));
}

static void test_duplicates(void **state) {
  (void)state;
  assert_duplicate("{\"model\":\"a\",\"messages\":[],\"model\":\"b\"}", "model");
  assert_duplicate("{\"model\":\"a\",\"m\\u006fdel\":\"b\"}", "model");
  assert_duplicate("{\"\\u00e9\":1,\"\xc3\xa9\":2}", "??"); /* non-ASCII shown as '?' */
  assert_duplicate("{\"\\ud83d\\ude00\":1,\"\xf0\x9f\x98\x80\":2}", "????");
  assert_duplicate("{\"a\\/b\":1,\"a/b\":2}", "a/b");
  assert_duplicate("{\"\":1,\"\":2}", "");
  assert_duplicate("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{},{},"
                   "{\"role\":\"user\",\"content\":\"a\",\"content\":\"b\"}]}",
                   "messages[3].content");
  assert_duplicate("{\"a\":{\"b\":[{\"c\":{\"d\":[[{\"e\":1,\"f\":2,\"e\":3}]]}}]}}",
                   "a.b[0].c.d[0][0].e");
  assert_duplicate("{\"a\":{\"b\":1,\"c\":{\"b\":2}},\"a\":2}", "a"); /* after a nested close */
  /* No false duplicates: siblings, other levels, prefixes, NUL-separated tails. */
  static const char *const ok[] = {
      "[{\"a\":1},{\"a\":1}]",
      "{\"a\":{\"a\":{\"a\":1}}}",
      "{\"a\":1,\"ab\":2,\"abc\":3,\"b\":4}",
      "{\"a\\u0000b\":1,\"a\\u0000c\":2,\"a\":3,\"a\\u0000\":4}",
      "{\"\\\\u0061\":1,\"a\":2}",
      "{\"A\":1,\"a\":2}",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(ok); i++)
    assert_rule(ok[i], KVR_JSON_GUARD_OK);
}

/* Big objects grow the table, their close rebuilds it; the keys of the objects still open must
 * still be found, whatever the seed. */
static void test_duplicates_big(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "{\"x\":1,");
  for (int o = 0; o < 3; o++) {
    kvr_buf_printf(&b, "\"big%d\":{", o);
    for (int i = 0; i < 5000; i++)
      kvr_buf_printf(&b, "%s\"k%d\":{\"k%d\":%d}", i ? "," : "", i, i, i);
    kvr_buf_puts(&b, "},");
  }
  size_t ok_len = b.len;
  kvr_buf_puts(&b, "\"y\":2}");
  kvr_json_guard_limits_t lim = defaults();
  for (uint64_t seed = 0; seed < 4; seed++) {
    lim.seed = seed * UINT64_C(0x9E3779B97F4A7C15);
    kvr_json_guard_verdict_t v = check_n(b.data, b.len, 0, &lim);
    assert_int_equal(v.rule, KVR_JSON_GUARD_OK);
    assert_true(v.peak_bytes < 1u << 20);
  }
  b.len = ok_len;
  kvr_buf_puts(&b, "\"big1\":2}");
  for (uint64_t seed = 0; seed < 4; seed++) {
    lim.seed = seed;
    kvr_json_guard_verdict_t v = check_n(b.data, b.len, 0, &lim);
    assert_int_equal(v.rule, KVR_JSON_GUARD_DUPLICATE);
    assert_string_equal(v.path, "big1");
  }
  /* A duplicate inside the last big object, found at the end of it. */
  kvr_buf_reset(&b);
  kvr_buf_puts(&b, "{\"a\":{");
  for (int i = 0; i < 20000; i++)
    kvr_buf_printf(&b, "\"k%d\":0,", i);
  kvr_buf_puts(&b, "\"k123\":1}}");
  kvr_json_guard_verdict_t v = check_n(b.data, b.len, 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_DUPLICATE);
  assert_string_equal(v.path, "a.k123");
  kvr_buf_free(&b);
}

/* ---- U+0000 -----------------------------------------------------------------------------------
 */

static void test_nul(void **state) {
  (void)state;
  kvr_json_guard_limits_t lim = defaults();
  kvr_json_guard_verdict_t v = check(
      "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", KVR_JSON_GUARD_CHAT, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_OK);
  assert_true(v.has_nul);
  assert_true(check("{\"a\\u0000\":1}", 0, &lim).has_nul);
  assert_false(check("{\"a\":\"\\\\u0000\"}", 0, &lim).has_nul); /* an escaped backslash */
  assert_false(check("{\"a\":\"\\u0001 \\u0100\"}", 0, &lim).has_nul);
}

/* ---- issue 37's hostile bodies ----------------------------------------------------------------
 */

#define EIGHT_MIB (8u << 20)

/* prefix, then unit repeated while the body stays under 8 MiB with suffix, then suffix. */
static void fill(kvr_buf_t *b, const char *prefix, const char *unit, const char *suffix) {
  kvr_buf_reset(b);
  kvr_buf_puts(b, prefix);
  size_t u = strlen(unit), s = strlen(suffix);
  while (b->len + u + s <= EIGHT_MIB)
    kvr_buf_append(b, unit, u);
  kvr_buf_puts(b, suffix);
}

static void assert_refused_early(const kvr_buf_t *b, kvr_json_guard_kind_t kind,
                                 kvr_json_guard_rule_t want, const char *path) {
  kvr_json_guard_limits_t lim = defaults();
  lim.max_prompt_tokens = 131072;
  kvr_json_guard_verdict_t v = check_n(b->data, b->len, kind, &lim);
  assert_int_equal(v.rule, want);
  assert_string_equal(v.path, path);
  assert_true(v.offset < (1u << 20));     /* read no further than the bound */
  assert_true(v.peak_bytes <= 16u << 10); /* nothing proportional to the body */
  assert_true(v.nodes <= lim.max_nodes + 1);
}

static void test_hostile(void **state) {
  (void)state;
  kvr_buf_t b = KVR_BUF_INIT;
  /* 4.19 M token ids. */
  fill(&b, "{\"model\":\"m\",\"prompt\":[1", ",1", "]}");
  assert_true(b.len > EIGHT_MIB - 8 && b.len <= EIGHT_MIB);
  assert_refused_early(&b, KVR_JSON_GUARD_COMPLETIONS, KVR_JSON_GUARD_TOKENS, "prompt");
  /* 2.8 M empty arrays in an unknown field. */
  fill(&b, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"junk\":[[]",
       ",[]", "]}");
  assert_refused_early(&b, KVR_JSON_GUARD_CHAT, KVR_JSON_GUARD_NODES, "junk[262137]");
  /* 280 k tiny messages. */
  kvr_buf_reset(&b);
  kvr_buf_puts(&b, "{\"model\":\"m\",\"messages\":[");
  for (int i = 0; i < 280000; i++)
    kvr_buf_puts(&b, i ? ",{\"role\":\"user\",\"content\":\"\"}"
                       : "{\"role\":\"user\",\"content\":\"\"}");
  kvr_buf_puts(&b, "]}");
  assert_refused_early(&b, KVR_JSON_GUARD_CHAT, KVR_JSON_GUARD_MESSAGES, "messages");
  /* The same bodies, cut anywhere, are still refused (here: a limit before the cut). */
  b.len = 4u << 20;
  assert_refused_early(&b, KVR_JSON_GUARD_CHAT, KVR_JSON_GUARD_MESSAGES, "messages");
  kvr_buf_free(&b);
}

/* ---- the rest of the API ----------------------------------------------------------------------
 */

static void test_api(void **state) {
  (void)state;
  kvr_json_guard_limits_t lim;
  kvr_json_guard_limits_default(&lim);
  assert_int_equal(lim.max_depth, 128);
  assert_int_equal(lim.max_nodes, 262144);
  assert_int_equal(lim.max_open_keys, 65536);
  assert_int_equal(lim.max_prompt_tokens, 1048576);
  assert_int_equal(lim.max_messages, 32768);
  assert_int_equal(lim.max_parts, 4096);
  assert_int_equal(lim.seed, 0);
  assert_string_equal(kvr_json_guard_rule_name(KVR_JSON_GUARD_OK), "OK");
  assert_string_equal(kvr_json_guard_rule_name(KVR_JSON_GUARD_DUPLICATE), "DUPLICATE");
  assert_string_equal(kvr_json_guard_rule_name(KVR_JSON_GUARD_PARTS), "PARTS");
  assert_string_equal(kvr_json_guard_rule_name((kvr_json_guard_rule_t)99), "UNKNOWN");
  /* A long path is cut with "...", never overflows. */
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "{");
  for (int i = 0; i < 10; i++)
    kvr_buf_puts(&b, "\"a_rather_long_member_name_that_goes_on_and_on_and_on_\":{");
  kvr_buf_puts(&b, "\"x\":1,\"x\":2");
  for (int i = 0; i < 11; i++)
    kvr_buf_puts(&b, "}");
  kvr_json_guard_verdict_t v = check_n(b.data, b.len, 0, &lim);
  assert_int_equal(v.rule, KVR_JSON_GUARD_DUPLICATE);
  assert_int_equal(strlen(v.path), sizeof v.path - 1);
  assert_string_equal(v.path + sizeof v.path - 4, "...");
  kvr_buf_free(&b);
}

KVR_TEST_MAIN(cmocka_unit_test(test_valid), cmocka_unit_test(test_syntax),
              cmocka_unit_test(test_control_characters), cmocka_unit_test(test_trailing),
              cmocka_unit_test(test_utf8), cmocka_unit_test(test_truncations),
              cmocka_unit_test(test_depth), cmocka_unit_test(test_nodes),
              cmocka_unit_test(test_open_keys), cmocka_unit_test(test_prompt_tokens),
              cmocka_unit_test(test_messages), cmocka_unit_test(test_parts),
              cmocka_unit_test(test_duplicates), cmocka_unit_test(test_duplicates_big),
              cmocka_unit_test(test_nul), cmocka_unit_test(test_hostile),
              cmocka_unit_test(test_api))

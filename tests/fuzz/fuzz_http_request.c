/* fuzz_http_request.c -- libFuzzer target for the request parser (src/proto/http_parse.c).
 *
 * Each input is the bytes a client sends on one connection. They go through the parser the way
 * the listener feeds it (HEAD -> feed again, DONE -> take, REJECT -> stop) three times: whole, cut
 * in two at an offset taken from the first byte, and one byte at a time. Invariants checked (a
 * failure aborts, which libFuzzer reports as a crash):
 *   - the three runs agree: same status, same code, same requests (a digest of method, target,
 *     version, headers and body), same "waiting in the middle of a request" state;
 *   - a rejection has a status in 400..505, a code and a message;
 *   - feed never reports more bytes used than it was given;
 *   - every accepted request obeys the rules the parser promises: HTTP/1.0 or 1.1, a target of
 *     visible ASCII, exactly one Host on HTTP/1.1 (at most one on 1.0), Transfer-Encoding only on
 *     1.1 and without Content-Length, a body within max_body.
 * Small limits make the limit paths reachable with short inputs.
 *
 * Build by hand (the KVR_FUZZ CMake option does the same):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -I. -I/usr/share/include/llhttp
 * \
 *     tests/fuzz/fuzz_http_request.c src/proto/http_parse.c src/base/kvr.c src/base/buf.c \
 *     /usr/share/llhttp/api.c /usr/share/llhttp/http.c /usr/share/llhttp/llhttp.c -o
 * fuzz_http_request
 *   ./fuzz_http_request -max_total_time=60 tests/fuzz/corpus/http_request
 */
#include "proto/http_parse.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
  int status;
  const char *code;
  int nreq;
  bool waiting;
  uint64_t digest; /* FNV-1a over every accepted request */
} verdict_t;

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);                \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ s[i]) * UINT64_C(0x100000001b3);
  return h;
}

static uint64_t fnv_str(uint64_t h, const char *s) {
  return fnv(h, s ? s : "", s ? strlen(s) + 1 : 1);
}

static void check_request(const kvr_http_req_t *req, const kvr_http_limits_t *lim) {
  CHECK(req->http_major == 1 && (req->http_minor == 0 || req->http_minor == 1));
  CHECK(req->target != NULL && req->path != NULL && req->query != NULL);
  for (const unsigned char *t = (const unsigned char *)req->target; *t; t++)
    CHECK(*t >= 0x21 && *t <= 0x7e);
  CHECK(req->body.len <= lim->max_body);
  CHECK(req->nheaders <= lim->max_header_fields);
  int hosts = 0;
  bool te = false, cl = false;
  for (size_t i = 0; i < req->nheaders; i++) {
    const char *n = req->headers[i].name, *v = req->headers[i].value;
    CHECK(n != NULL && v != NULL);
    CHECK(strpbrk(v, "\r\n") == NULL);
    hosts += strcasecmp(n, "host") == 0;
    te |= strcasecmp(n, "transfer-encoding") == 0;
    cl |= strcasecmp(n, "content-length") == 0;
    if (strcasecmp(n, "host") == 0)
      CHECK(kvr_http_parse_host_ok(v));
  }
  CHECK(hosts <= 1 && (hosts == 1 || req->http_minor == 0));
  CHECK(!te || (req->http_minor == 1 && !cl));
}

/* Feeds data in pieces ending at the offsets cuts[0..ncuts) (ascending, < size) and at size. */
static verdict_t run(const uint8_t *data, size_t size, const size_t *cuts, size_t ncuts,
                     size_t step, const kvr_http_limits_t *lim) {
  kvr_http_parse_t *p = kvr_http_parse_new(lim);
  kvr_buf_t in = KVR_BUF_INIT;
  verdict_t v = {.digest = UINT64_C(0xcbf29ce484222325)};
  size_t from = 0, ci = 0;
  while (v.status == 0) {
    size_t to = step ? (from + step < size ? from + step : size) : ci < ncuts ? cuts[ci++] : size;
    kvr_buf_append(&in, data + from, to - from);
    from = to;
    bool again = false;
    while ((in.len || again) && v.status == 0) {
      size_t used = (size_t)-1;
      kvr_http_parse_event_t ev = kvr_http_parse_feed(p, in.data, in.len, &used);
      CHECK(used <= in.len);
      kvr_buf_consume(&in, used);
      again = ev == KVR_HTTP_PARSE_HEAD;
      if (ev == KVR_HTTP_PARSE_DONE) {
        kvr_http_req_t *req = kvr_http_parse_take(p);
        CHECK(req != NULL);
        check_request(req, lim);
        uint64_t h = fnv_str(v.digest, req->method_str);
        h = fnv_str(h, req->target);
        h = fnv(h, &req->http_minor, sizeof req->http_minor);
        for (size_t i = 0; i < req->nheaders; i++)
          h = fnv_str(fnv_str(h, req->headers[i].name), req->headers[i].value);
        v.digest = fnv(h, req->body.data ? req->body.data : "", req->body.len);
        v.nreq++;
        kvr_http_parse_req_free(req);
      } else if (ev == KVR_HTTP_PARSE_REJECT) {
        const kvr_http_rejection_t *r = kvr_http_parse_rejection(p);
        CHECK(r != NULL && r->status >= 400 && r->status <= 505);
        CHECK(r->code != NULL && r->code[0] && r->message != NULL && r->message[0]);
        v.status = r->status;
        v.code = r->code; /* static strings: comparable after the parser is freed */
      } else if (ev == KVR_HTTP_PARSE_MORE) {
        CHECK(in.len == 0);
      } else {
        CHECK(ev == KVR_HTTP_PARSE_HEAD);
      }
    }
    if (from == size)
      break;
  }
  v.waiting = v.status == 0 && kvr_http_parse_phase(p) != KVR_HTTP_PHASE_IDLE;
  kvr_buf_free(&in);
  kvr_http_parse_free(p);
  return v;
}

static void same(const verdict_t *a, const verdict_t *b) {
  CHECK(a->status == b->status);
  CHECK((a->code == NULL && b->code == NULL) || (a->code && b->code && !strcmp(a->code, b->code)));
  CHECK(a->nreq == b->nreq);
  CHECK(a->digest == b->digest);
  CHECK(a->waiting == b->waiting);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static kvr_http_limits_t lim;
  if (lim.max_url == 0) {
    kvr_http_limits_default(&lim);
    lim.max_url = 256;
    lim.max_header_bytes = 1024;
    lim.max_header_fields = 16;
    lim.max_body = 512;
  }
  verdict_t whole = run(data, size, NULL, 0, 0, &lim);
  if (size > 1) {
    size_t cut = 1 + data[0] % (size - 1);
    verdict_t two = run(data, size, &cut, 1, 0, &lim);
    same(&whole, &two);
  }
  verdict_t bytes = run(data, size, NULL, 0, 1, &lim);
  same(&whole, &bytes);
  return 0;
}

/* fuzz_http_response.c -- libFuzzer target for the worker response-head checker
 * (src/proto/http_headers.c: kvr_http_resp_status -> kvr_http_resp_field... -> kvr_http_resp_end).
 *
 * Each input is the bytes a worker sends back. They are split into lines at LF only, each line
 * with its LF, as libcurl's header callback hands them to src/serve/proxy.c: the first line is a
 * status line, the next ones are fields until a blank line ("\r\n" or "\n"), then the head ends
 * (kvr_http_resp_end). After an interim head (a 1xx other than 101, which curl consumes and then
 * reads another head) the next line is a status line again, as curl does; the bytes after the final
 * head's blank line are body and are not looked at. Input that ends inside a head ends it there
 * (the last line may lack its LF). The first verdict other than OK is the input's verdict.
 *
 * Invariants (a failure aborts, which libFuzzer reports as a crash):
 *   - deterministic: a second run gives the same verdict, the same number of lines read and the
 *     same final state (status, Content-Length, Transfer-Encoding seen);
 *   - the verdict is one of the map's reasons (never INTERIM_ONLY: that is the proxy's call);
 *   - OK implies, checked here by an independent reading of the same lines: every status line is
 *     "HTTP/" DIGIT ["." DIGIT] SP 3DIGIT [SP text] with a code in 100..599 other than 101, and the
 *     checker's status is that code; every field line, after stripping one LF and one CR before it,
 *     is a non-empty token name, ':' and a value with no control byte other than HTAB (no DEL); the
 *     Content-Length fields (digits, blanks and commas) all give one number, the checker's; no head
 *     has both Transfer-Encoding and Content-Length;
 *   - a head line holding a CR anywhere but just before its LF (a bare CR, what a client that
 *     splits at CR would read as a line end) never gives OK;
 *   - line ends do not matter: the input with every bare-LF line end of the head turned into CRLF
 *     gets the same verdict.
 *
 * Run:  build-fuzz/tests/fuzz_http_response -dict=tests/fuzz/http_response.dict \
 *         tests/fuzz/corpus/http_response     (or bench/scripts/fuzz/fuzz.sh http_response 600)
 */
#include "fuzz_util.h"

#include "proto/http_headers.h"

#include <stdbool.h>
#include <strings.h>

/* What one pass over the input found. */
typedef struct verdict_s {
  kvr_http_resp_err_t err;
  size_t lines;    /* head lines read (status lines, fields and blank lines) */
  size_t head_end; /* offset just past the last head line read */
  size_t heads;    /* status lines read */
  kvr_http_resp_check_t st;
} verdict_t;

/* The line starting at data[from]: its length including its LF, or up to the end. */
static size_t line_len(const uint8_t *data, size_t size, size_t from) {
  const uint8_t *lf = memchr(data + from, '\n', size - from);
  return lf ? (size_t)(lf - (data + from)) + 1 : size - from;
}

static bool is_blank(const uint8_t *l, size_t n) {
  return (n == 1 && l[0] == '\n') || (n == 2 && l[0] == '\r' && l[1] == '\n');
}

/* The checker over the input as the proxy feeds it. Lines are copied to exact-size buffers so ASan
 * catches a read past a line's end. */
static verdict_t run(const uint8_t *data, size_t size) {
  verdict_t v;
  memset(&v, 0, sizeof v);
  v.err = KVR_HTTP_RESP_OK;
  size_t at = 0;
  while (at < size && v.err == KVR_HTTP_RESP_OK) {
    /* A status line. */
    size_t n = line_len(data, size, at);
    char *line = fuzz_strndup(data + at, n);
    v.err = kvr_http_resp_status(&v.st, line, n);
    free(line);
    at += n;
    v.lines++;
    v.heads++;
    bool interim = v.err == KVR_HTTP_RESP_OK && v.st.status < 200;
    /* Its fields, up to the blank line or the end of the input. */
    while (v.err == KVR_HTTP_RESP_OK && at < size) {
      n = line_len(data, size, at);
      if (is_blank(data + at, n)) {
        at += n;
        v.lines++;
        break;
      }
      line = fuzz_strndup(data + at, n);
      v.err = kvr_http_resp_field(&v.st, line, n);
      free(line);
      at += n;
      v.lines++;
    }
    if (v.err == KVR_HTTP_RESP_OK)
      v.err = kvr_http_resp_end(&v.st);
    if (!interim)
      break; /* the final head: what follows is body */
  }
  v.head_end = at;
  return v;
}

/* ---- the independent reading ------------------------------------------------------------------
 */

static bool ref_tchar(uint8_t c) {
  static const char extra[] = "!#$%&'*+-.^_`|~";
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
    return true;
  for (size_t i = 0; i < sizeof extra - 1; i++)
    if (c == (uint8_t)extra[i])
      return true;
  return false;
}

static bool ref_ctl(uint8_t c) {
  return (c < 0x20 && c != '\t') || c == 0x7f;
}

static bool ref_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}

/* The line's length without one LF and one CR before it. */
static size_t ref_content(const uint8_t *l, size_t n) {
  if (n && l[n - 1] == '\n') {
    n--;
    if (n && l[n - 1] == '\r')
      n--;
  }
  return n;
}

/* True if the line has a CR that is not the one just before its final LF. */
static bool has_bare_cr(const uint8_t *l, size_t n) {
  size_t c = ref_content(l, n);
  return memchr(l, '\r', c) != NULL;
}

/* The status code of a well-formed status line, or -1. */
static int ref_status(const uint8_t *l, size_t n) {
  n = ref_content(l, n);
  if (n < 6 || memcmp(l, "HTTP/", 5) != 0 || !ref_digit(l[5]))
    return -1;
  size_t i = 6;
  if (i + 1 < n && l[i] == '.' && ref_digit(l[i + 1]))
    i += 2;
  if (i + 4 > n || l[i] != ' ' || !ref_digit(l[i + 1]) || !ref_digit(l[i + 2]) ||
      !ref_digit(l[i + 3]))
    return -1;
  if (i + 4 < n && l[i + 4] != ' ')
    return -1;
  for (size_t k = i + 4; k < n; k++)
    if (ref_ctl(l[k]))
      return -1;
  return (l[i + 1] - '0') * 100 + (l[i + 2] - '0') * 10 + (l[i + 3] - '0');
}

/* A Content-Length value's numbers all equal to *cl (set from the first); false if not digits,
 * blanks and commas, or no number at all. */
static bool ref_content_length(const uint8_t *v, size_t n, bool *have, unsigned long long *cl) {
  size_t i = 0;
  bool any = false;
  while (i < n) {
    if (v[i] == ' ' || v[i] == '\t' || v[i] == ',') {
      i++;
      continue;
    }
    if (!ref_digit(v[i]))
      return false;
    unsigned long long x = 0;
    for (; i < n && ref_digit(v[i]); i++)
      if (__builtin_mul_overflow(x, 10ull, &x) || __builtin_add_overflow(x, v[i] - '0', &x))
        return false;
    if (*have && *cl != x)
      return false;
    *have = true;
    *cl = x;
    any = true;
  }
  return any;
}

/* Everything an OK verdict promises, read again from the input (the same line split). */
static void check_ok(const uint8_t *data, size_t size, const verdict_t *v) {
  size_t at = 0;
  for (size_t h = 0; h < v->heads; h++) {
    size_t n = line_len(data, size, at);
    FUZZ_CHECK(!has_bare_cr(data + at, n));
    int code = ref_status(data + at, n);
    FUZZ_CHECK(code >= 100 && code <= 599 && code != 101);
    FUZZ_CHECK(h + 1 == v->heads ? code == v->st.status : code < 200);
    at += n;
    bool have_cl = false, have_te = false;
    unsigned long long cl = 0;
    while (at < size) {
      n = line_len(data, size, at);
      const uint8_t *l = data + at;
      at += n;
      if (is_blank(l, n))
        break;
      FUZZ_CHECK(!has_bare_cr(l, n));
      size_t c = ref_content(l, n), name = 0;
      while (name < c && ref_tchar(l[name]))
        name++;
      FUZZ_CHECK(name > 0 && name < c && l[name] == ':');
      for (size_t k = name + 1; k < c; k++)
        FUZZ_CHECK(!ref_ctl(l[k]));
      if (name == 14 && strncasecmp((const char *)l, "content-length", 14) == 0)
        FUZZ_CHECK(ref_content_length(l + name + 1, c - name - 1, &have_cl, &cl));
      if (name == 17 && strncasecmp((const char *)l, "transfer-encoding", 17) == 0)
        have_te = true;
    }
    FUZZ_CHECK(!(have_cl && have_te));
    if (h + 1 == v->heads) {
      FUZZ_CHECK(v->st.have_cl == have_cl && v->st.have_te == have_te);
      FUZZ_CHECK(!have_cl || v->st.cl == cl);
    }
  }
  FUZZ_CHECK(at == v->head_end);
}

/* A bare CR in any head line the checker read never passes. */
static void check_bare_cr(const uint8_t *data, size_t size, const verdict_t *v) {
  bool seen = false;
  for (size_t at = 0; at < v->head_end;) {
    size_t n = line_len(data, size, at);
    seen |= has_bare_cr(data + at, n);
    at += n;
  }
  FUZZ_CHECK(!seen || v->err != KVR_HTTP_RESP_OK);
}

/* The input with every bare-LF line end up to head_end made CRLF (the rest copied as is). */
static uint8_t *crlf_form(const uint8_t *data, size_t size, size_t head_end, size_t *out_len) {
  uint8_t *out = malloc(2 * size + 1);
  if (out == NULL)
    abort();
  size_t o = 0;
  for (size_t i = 0; i < size; i++) {
    if (i < head_end && data[i] == '\n' && (i == 0 || data[i - 1] != '\r'))
      out[o++] = '\r';
    out[o++] = data[i];
  }
  *out_len = o;
  return out;
}

static void same(const verdict_t *a, const verdict_t *b) {
  FUZZ_CHECK(a->err == b->err);
  FUZZ_CHECK(a->lines == b->lines && a->heads == b->heads && a->head_end == b->head_end);
  FUZZ_CHECK(a->st.status == b->st.status && a->st.have_cl == b->st.have_cl &&
             a->st.have_te == b->st.have_te && a->st.cl == b->st.cl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  verdict_t v = run(data, size);
  FUZZ_CHECK((unsigned)v.err < KVR_HTTP_RESP_ERR_COUNT && v.err != KVR_HTTP_RESP_INTERIM_ONLY);
  FUZZ_CHECK(strcmp(kvr_http_resp_err_name(v.err), "unknown") != 0);
  verdict_t again = run(data, size);
  same(&v, &again);
  if (v.err == KVR_HTTP_RESP_OK)
    check_ok(data, size, &v);
  check_bare_cr(data, size, &v);

  size_t n2;
  uint8_t *crlf = crlf_form(data, size, v.head_end, &n2);
  verdict_t w = run(crlf, n2);
  FUZZ_CHECK(w.err == v.err && w.lines == v.lines && w.heads == v.heads);
  FUZZ_CHECK(w.st.status == v.st.status && w.st.cl == v.st.cl);
  free(crlf);
  return 0;
}

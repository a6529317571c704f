/* http_headers.c -- hop-by-hop semantics and the header filters of the reverse proxy.
 *
 * What it owns: nothing beyond the calls; every function reads its arguments and writes only the
 * kvr_buf_t (or callback) it is given, so the rules are unit-tested without a loop
 * (tests/src/proto/test_http_headers.c).
 *
 * Request side: kvr_http_headers_upstream() walks the client's headers once and hands each line to
 * forward to a callback (proxy.c turns them into a curl_slist). A header is tested against the
 * hop-by-hop list, then against every Connection header of the request, then against the headers
 * the upstream client sets itself.
 *
 * Response side: the worker's head arrives one field at a time (curl's header callback), and a
 * Connection field may follow the headers it names. So kvr_http_headers_response_field() keeps
 * what is not hop-by-hop and records Connection's names as ",a,b,", and once the head is complete
 * kvr_http_headers_drop_named() removes the kept lines with those names. The comma-delimited form
 * makes the lookup of a name one strstr for ",name,".
 *
 * The two sides split a Connection value slightly differently, as they always have: the request
 * side splits on commas, spaces and tabs; the response side drops spaces and tabs and splits on
 * commas. They agree on every valid value (a token list never has blanks inside a token).
 */
#include "proto/http_headers.h"

#include "base/kvr.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Names longer than this are not header names a worker sends; their lines are ignored. */
#define NAME_MAX_LEN 128

bool kvr_http_headers_hop_by_hop(const char *name) {
  static const char *const hop[] = {
      "connection",         "keep-alive",         "te",      "trailer",
      "trailers",           "transfer-encoding",  "upgrade", "proxy-connection",
      "proxy-authenticate", "proxy-authorization"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(hop); i++)
    if (strcasecmp(name, hop[i]) == 0)
      return true;
  return strncasecmp(name, "proxy-", 6) == 0;
}

bool kvr_http_headers_connection_names(const kvr_http_header_t *headers, size_t n,
                                       const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; i < n; i++) {
    if (strcasecmp(headers[i].name, "connection") != 0)
      continue;
    const char *v = headers[i].value;
    while (*v) {
      while (*v == ' ' || *v == ',' || *v == '\t')
        v++;
      const char *e = v;
      while (*e && *e != ',' && *e != ' ' && *e != '\t')
        e++;
      if ((size_t)(e - v) == len && strncasecmp(v, name, len) == 0)
        return true;
      v = e;
    }
  }
  return false;
}

bool kvr_http_headers_has_ctl(const char *s) {
  for (; *s; s++)
    if (*s == '\r' || *s == '\n')
      return true;
  return false;
}

void kvr_http_headers_upstream(const kvr_http_header_t *headers, size_t n, const char *peer,
                               kvr_http_headers_line_cb cb, void *data) {
  kvr_buf_t line = KVR_BUF_INIT;
  const char *xff = NULL;
  for (size_t i = 0; i < n; i++) {
    const kvr_http_header_t *h = &headers[i];
    if (kvr_http_headers_hop_by_hop(h->name) ||
        kvr_http_headers_connection_names(headers, n, h->name) ||
        strcasecmp(h->name, "host") == 0 || strcasecmp(h->name, "content-length") == 0 ||
        strcasecmp(h->name, "expect") == 0 || strcasecmp(h->name, "accept-encoding") == 0)
      continue;
    if (strcasecmp(h->name, "x-forwarded-for") == 0) {
      xff = h->value;
      continue;
    }
    if (kvr_http_headers_has_ctl(h->name) || kvr_http_headers_has_ctl(h->value))
      continue; /* never reaches here after llhttp, kept as a guard */
    kvr_buf_reset(&line);
    /* "Name;" is curl's spelling of a header with an empty value. */
    if (h->value[0] == '\0')
      kvr_buf_printf(&line, "%s;", h->name);
    else
      kvr_buf_printf(&line, "%s: %s", h->name, h->value);
    cb(data, line.data);
  }
  kvr_buf_reset(&line);
  if (xff && !kvr_http_headers_has_ctl(xff))
    kvr_buf_printf(&line, "X-Forwarded-For: %s, %s", xff, peer);
  else
    kvr_buf_printf(&line, "X-Forwarded-For: %s", peer);
  cb(data, line.data);
  kvr_buf_free(&line);
}

bool kvr_http_headers_response_field(kvr_buf_t *kept, kvr_buf_t *conn_tokens, const char *line,
                                     size_t len, bool head_req) {
  const char *colon = memchr(line, ':', len);
  if (colon == NULL)
    return false;
  char name[NAME_MAX_LEN];
  size_t nlen = (size_t)(colon - line);
  if (nlen == 0 || nlen >= sizeof name)
    return false;
  memcpy(name, line, nlen);
  name[nlen] = '\0';
  const char *v = colon + 1;
  const char *end = line + len;
  while (v < end && (*v == ' ' || *v == '\t'))
    v++;
  while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
    end--;
  if (strcasecmp(name, "connection") == 0) {
    /* Remember the names it lists: those headers are hop-by-hop too (RFC 9110 7.6.1). */
    if (conn_tokens->len == 0)
      kvr_buf_puts(conn_tokens, ",");
    for (const char *t = v; t < end; t++)
      if (*t != ' ' && *t != '\t') {
        char c = (char)(*t >= 'A' && *t <= 'Z' ? *t + 32 : *t);
        kvr_buf_append(conn_tokens, &c, 1);
      }
    kvr_buf_puts(conn_tokens, ",");
  }
  bool sse = strcasecmp(name, "content-type") == 0 && (size_t)(end - v) >= 17 &&
             strncasecmp(v, "text/event-stream", 17) == 0;
  if (kvr_http_headers_hop_by_hop(name) || (strcasecmp(name, "content-length") == 0 && !head_req) ||
      strcasecmp(name, "x-kvrouter-worker") == 0 || strcasecmp(name, "date") == 0)
    return sse;
  kvr_buf_append(kept, name, nlen);
  kvr_buf_puts(kept, ": ");
  kvr_buf_append(kept, v, (size_t)(end - v));
  kvr_buf_puts(kept, "\r\n");
  return sse;
}

void kvr_http_headers_drop_named(kvr_buf_t *kept, const kvr_buf_t *conn_tokens) {
  if (conn_tokens->len == 0 || kept->len == 0)
    return;
  kvr_buf_t out = KVR_BUF_INIT;
  const char *p = kept->data, *end = p + kept->len;
  while (p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *next = eol ? eol + 1 : end;
    const char *colon = memchr(p, ':', (size_t)(next - p));
    bool drop = false;
    if (colon && colon - p < NAME_MAX_LEN - 8) { /* room for ",name," */
      char key[NAME_MAX_LEN];
      size_t n = 0;
      key[n++] = ',';
      for (const char *c = p; c < colon; c++)
        key[n++] = (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
      key[n++] = ',';
      key[n] = '\0';
      drop = strstr(conn_tokens->data, key) != NULL;
    }
    if (!drop)
      kvr_buf_append(&out, p, (size_t)(next - p));
    p = next;
  }
  kvr_buf_free(kept);
  *kept = out;
}

/* ---- the worker's response head ---------------------------------------------------------------
 */

static const char *const resp_err_names[] = {
#define XX(name, str) str,
    KVR_HTTP_RESP_ERR_MAP(XX)
#undef XX
};

const char *kvr_http_resp_err_name(kvr_http_resp_err_t e) {
  return (unsigned)e < KVR_HTTP_RESP_ERR_COUNT ? resp_err_names[e] : "unknown";
}

/* RFC 9110 5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" /
 * "`" / "|" / "~" / DIGIT / ALPHA. */
static bool is_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* The line without its one line ending (CRLF or LF). */
static size_t strip_eol(const char *line, size_t len) {
  if (len && line[len - 1] == '\n') {
    len--;
    if (len && line[len - 1] == '\r')
      len--;
  }
  return len;
}

/* RFC 9112 4: reason-phrase = *( HTAB / SP / VCHAR / obs-text ); field values likewise. */
static bool text_ok(const char *s, size_t len) {
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if ((c < 0x20 && c != '\t') || c == 0x7f)
      return false;
  }
  return true;
}

static bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

kvr_http_resp_err_t kvr_http_resp_status(kvr_http_resp_check_t *st, const char *line, size_t len) {
  memset(st, 0, sizeof *st);
  st->bytes = len;
  len = strip_eol(line, len);
  /* "HTTP/" DIGIT ["." DIGIT] SP 3DIGIT [SP reason]: HTTP/1.x, or HTTP/2 as libcurl writes it. */
  size_t i = 5;
  if (len < 5 || memcmp(line, "HTTP/", 5) != 0 || i >= len || !is_digit(line[i++]))
    return KVR_HTTP_RESP_STATUS_LINE;
  if (i + 1 < len && line[i] == '.' && is_digit(line[i + 1]))
    i += 2;
  if (i + 4 > len || line[i] != ' ' || !is_digit(line[i + 1]) || !is_digit(line[i + 2]) ||
      !is_digit(line[i + 3]) || (i + 4 < len && line[i + 4] != ' ') ||
      !text_ok(line + i + 4, len - i - 4))
    return KVR_HTTP_RESP_STATUS_LINE;
  st->status = (line[i + 1] - '0') * 100 + (line[i + 2] - '0') * 10 + (line[i + 3] - '0');
  if (st->status < 100 || st->status > 599)
    return KVR_HTTP_RESP_STATUS_CODE;
  return st->status == 101 ? KVR_HTTP_RESP_SWITCHING : KVR_HTTP_RESP_OK;
}

/* Content-Length = 1*DIGIT; a repeated field (or a list) must repeat the same value (RFC 9110
 * 8.6, RFC 9112 6.3 item 5). */
static kvr_http_resp_err_t content_length(kvr_http_resp_check_t *st, const char *v, size_t n) {
  size_t i = 0;
  bool any = false; /* this field's own value: an empty one is refused whatever came before */
  while (i < n) {
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
      i++;
    if (i == n)
      break;
    unsigned long long x = 0;
    size_t d = 0;
    for (; i < n && is_digit(v[i]); i++, d++) {
      if (x > (ULLONG_MAX - 9) / 10)
        return KVR_HTTP_RESP_CONTENT_LENGTH;
      x = x * 10 + (unsigned long long)(v[i] - '0');
    }
    if (d == 0 || (i < n && v[i] != ' ' && v[i] != '\t' && v[i] != ','))
      return KVR_HTTP_RESP_CONTENT_LENGTH;
    if (st->have_cl && st->cl != x)
      return KVR_HTTP_RESP_CONTENT_LENGTH;
    st->have_cl = any = true;
    st->cl = x;
  }
  return any ? KVR_HTTP_RESP_OK : KVR_HTTP_RESP_CONTENT_LENGTH;
}

kvr_http_resp_err_t kvr_http_resp_field(kvr_http_resp_check_t *st, const char *line, size_t len) {
  st->bytes += len;
  if (++st->fields > KVR_HTTP_RESP_FIELDS_MAX || st->bytes > KVR_HTTP_RESP_HEAD_MAX)
    return KVR_HTTP_RESP_HEAD_SIZE;
  len = strip_eol(line, len);
  if (len && (line[0] == ' ' || line[0] == '\t'))
    return KVR_HTTP_RESP_OBS_FOLD;
  size_t n = 0;
  while (n < len && is_tchar((unsigned char)line[n]))
    n++;
  if (n == 0 || n == len || line[n] != ':')
    return KVR_HTTP_RESP_HEADER_NAME;
  const char *v = line + n + 1;
  size_t vlen = len - n - 1;
  if (!text_ok(v, vlen))
    return KVR_HTTP_RESP_HEADER_VALUE;
  if (n == 14 && strncasecmp(line, "content-length", 14) == 0)
    return content_length(st, v, vlen);
  if (n == 17 && strncasecmp(line, "transfer-encoding", 17) == 0)
    st->have_te = true;
  return KVR_HTTP_RESP_OK;
}

kvr_http_resp_err_t kvr_http_resp_end(const kvr_http_resp_check_t *st) {
  return st->have_te && st->have_cl ? KVR_HTTP_RESP_TE_AND_CL : KVR_HTTP_RESP_OK;
}

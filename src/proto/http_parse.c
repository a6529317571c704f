/* http_parse.c -- request parsing for the listener: llhttp plus the strictness rules it lacks.
 *
 * Structures:
 *   kvr_http_parse_t  one llhttp parser, the limits, the request being parsed (cur), the pieces of
 *                     the header field being read (hfield, hvalue), counters for the limits, and
 * the rejection once there is one.
 *
 * Flow (see http_parse.h for the events):
 *
 *   feed(data) --llhttp_execute--> on_message_begin: cur = new request          (phase HEAD)
 *                                  on_url / on_version_complete / on_header_*: checks, copies
 *                                  on_headers_complete: request-level rules, pause -> HEAD
 *                                  on_chunk_header / on_body: body limits          (phase BODY)
 *                                  on_message_complete: pause -> DONE; take() resumes
 *              a callback that refuses sets rej and returns -1 (or HPE_USER)     -> REJECT
 *              any other llhttp error is translated here, at this one boundary  -> REJECT
 *
 * llhttp is run with all lenient flags off except LENIENT_VERSION: without it llhttp accepts
 * HTTP/0.9, 1.0, 1.1 and 2.0 and refuses every other "HTTP/D.D" with the same error as a
 * malformed version. With it, any "HTTP/D.D" reaches on_version_complete, which answers 505
 * unless it is 1.0 or 1.1 (RFC 9110 15.6.6), and a malformed version stays a 400.
 *
 * Two rules need the byte next to a span, which llhttp does not report: the end of the request
 * target (a CR or LF there means a request line without a version, which llhttp would take as
 * HTTP/0.9 and wait for a second CRLF: the client hangs) and the start of a header value (after
 * an LF, only SP/HTAB between: obs-fold, which llhttp 8 accepts). llhttp calls span callbacks
 * with pointers into the buffer being fed, so these bytes are read from that buffer, or from the
 * last one of the previous feed when the span starts the buffer (feed_start, prev_nonws). llhttp
 * emits a zero-length span when a span ends at the first byte of a feed, so the target's end is
 * seen whatever the split.
 *
 * Invariant: once rej.status is set the phase is FAILED and llhttp is never run again.
 */
#include "proto/http_parse.h"

#include "base/kvr.h"

#include <arpa/inet.h>
#include <llhttp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct kvr_http_parse_s {
  llhttp_t parser;
  kvr_http_limits_t limits;
  kvr_http_req_t *cur; /* being parsed; owned here until kvr_http_parse_take() */
  kvr_buf_t hfield, hvalue;
  size_t header_bytes, header_fields, url_bytes;
  kvr_http_parse_phase_t phase;
  bool version_seen; /* on_version_complete fired for cur */
  bool done;         /* paused at on_message_complete; cur is complete */
  bool paused;       /* llhttp is paused (HEAD or DONE) and needs llhttp_resume() */
  /* The buffer of the current feed and the last byte other than SP/HTAB fed before it. */
  const char *feed_start, *feed_end;
  char prev_byte, prev_nonws;
  kvr_http_rejection_t rej;
  char msg[192];
};

static kvr_http_parse_t *parse_of(llhttp_t *lp) {
  return lp->data;
}

/* Records the rejection (the first one wins) and returns -1 for llhttp. */
static int reject(kvr_http_parse_t *p, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int reject(kvr_http_parse_t *p, int status, const char *code, const char *fmt, ...) {
  if (p->rej.status)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->msg, sizeof p->msg, fmt, ap);
  va_end(ap);
  p->rej.status = status;
  p->rej.code = code;
  p->rej.message = p->msg;
  return -1;
}

void kvr_http_parse_req_free(kvr_http_req_t *req) {
  if (req == NULL)
    return;
  for (size_t i = 0; i < req->nheaders; i++) {
    free(req->headers[i].name);
    free(req->headers[i].value);
  }
  free(req->headers);
  free(req->target);
  free(req->path);
  kvr_buf_free(&req->body);
  free(req);
}

/* ---- pure rules --------------------------------------------------------------------------------
 */

static bool is_alpha(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* RFC 3986 2.3 unreserved and 2.2 sub-delims. */
static bool is_unreserved(unsigned char c) {
  return is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

static bool is_sub_delim(unsigned char c) {
  return c && strchr("!$&'()*+,;=", c) != NULL;
}

/* RFC 9110 5.6.2 tchar. */
static bool is_tchar(unsigned char c) {
  return is_alpha(c) || is_digit(c) || (c && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool is_token(const char *s, size_t n) {
  if (n == 0)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!is_tchar((unsigned char)s[i]))
      return false;
  return true;
}

/* reg-name = *( unreserved / pct-encoded / sub-delims ), over s[0..n). */
static bool reg_name_ok(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '%') {
      if (i + 2 >= n || !is_hex((unsigned char)s[i + 1]) || !is_hex((unsigned char)s[i + 2]))
        return false;
      i += 2;
    } else if (!is_unreserved(c) && !is_sub_delim(c)) {
      return false;
    }
  }
  return true;
}

/* IP-literal = "[" ( IPv6address / IPvFuture ) "]", given without the brackets. IPv6 is checked
 * by inet_pton(), which takes exactly RFC 4291's text forms (with an embedded IPv4 tail). */
static bool ip_literal_ok(const char *s, size_t n) {
  if (n > 0 && (s[0] == 'v' || s[0] == 'V')) {
    /* IPvFuture = "v" 1*HEXDIG "." 1*( unreserved / sub-delims / ":" ) */
    size_t i = 1;
    while (i < n && is_hex((unsigned char)s[i]))
      i++;
    if (i == 1 || i >= n || s[i] != '.' || i + 1 >= n)
      return false;
    for (i++; i < n; i++)
      if (!is_unreserved((unsigned char)s[i]) && !is_sub_delim((unsigned char)s[i]) && s[i] != ':')
        return false;
    return true;
  }
  char buf[INET6_ADDRSTRLEN + 1];
  unsigned char addr[16];
  if (n == 0 || n >= sizeof buf)
    return false;
  memcpy(buf, s, n);
  buf[n] = '\0';
  return inet_pton(AF_INET6, buf, addr) == 1;
}

bool kvr_http_parse_host_ok(const char *v) {
  if (v == NULL)
    return false;
  const char *port;
  if (v[0] == '[') {
    const char *end = strchr(v, ']');
    if (end == NULL || !ip_literal_ok(v + 1, (size_t)(end - v - 1)))
      return false;
    if (end[1] == '\0')
      return true;
    if (end[1] != ':')
      return false;
    port = end + 2;
  } else {
    /* A reg-name has no ':', so the first one starts the port. IPv4address is a reg-name in
     * form, so it needs no rule of its own. */
    const char *colon = strchr(v, ':');
    size_t hlen = colon ? (size_t)(colon - v) : strlen(v);
    if (!reg_name_ok(v, hlen))
      return false;
    if (colon == NULL)
      return true;
    port = colon + 1;
  }
  for (; *port; port++)
    if (!is_digit((unsigned char)*port))
      return false;
  return true;
}

static bool is_ows(char c) {
  return c == ' ' || c == '\t';
}

/* Splits one list element s[0..n) into its coding name and whether parameters follow. */
static int te_element(const char *s, size_t n, bool last, bool *chunked_seen, bool *other_seen,
                      kvr_http_rejection_t *out) {
  size_t b = 0, e = n;
  while (b < e && is_ows(s[b]))
    b++;
  while (e > b && is_ows(s[e - 1]))
    e--;
  if (b == e) {
    /* RFC 9110 5.6.1 lets a recipient skip empty list elements, but this list decides where the
     * body ends: a proxy and a worker that read it differently disagree on the framing (request
     * smuggling), so an ambiguous one is refused, as HAProxy does. */
    *out = (kvr_http_rejection_t){400, "invalid_transfer_encoding",
                                  "Transfer-Encoding has an empty list element"};
    return -1;
  }
  size_t name_end = b;
  while (name_end < e && s[name_end] != ';' && !is_ows(s[name_end]))
    name_end++;
  if (!is_token(s + b, name_end - b)) {
    *out = (kvr_http_rejection_t){400, "invalid_transfer_encoding",
                                  "Transfer-Encoding has an element that is not a token"};
    return -1;
  }
  bool params = name_end < e;
  if (name_end - b == 7 && strncasecmp(s + b, "chunked", 7) == 0) {
    /* RFC 9112 7: chunked has no parameters and a sender MUST NOT apply it more than once. */
    if (params || *chunked_seen || !last) {
      *out = (kvr_http_rejection_t){400, "invalid_transfer_encoding",
                                    params ? "Transfer-Encoding chunked takes no parameters"
                                           : "Transfer-Encoding chunked must be the final coding, "
                                             "applied once"};
      return -1;
    }
    *chunked_seen = true;
  } else if (last) {
    /* RFC 9112 6.3: chunked not final -> the length cannot be determined: 400 and close. */
    *out = (kvr_http_rejection_t){400, "invalid_transfer_encoding",
                                  "Transfer-Encoding must end with chunked"};
    return -1;
  } else {
    *other_seen = true;
  }
  return 0;
}

int kvr_http_parse_te_check(const char *const *vals, size_t n, kvr_http_rejection_t *out) {
  bool chunked_seen = false, other_seen = false;
  for (size_t i = 0; i < n; i++) {
    const char *s = vals[i];
    for (;;) {
      const char *comma = strchr(s, ',');
      size_t len = comma ? (size_t)(comma - s) : strlen(s);
      bool last = comma == NULL && i + 1 == n;
      if (te_element(s, len, last, &chunked_seen, &other_seen, out) != 0)
        return -1;
      if (comma == NULL)
        break;
      s = comma + 1;
    }
  }
  if (other_seen) {
    /* RFC 9112 6.1: a transfer coding the server does not understand SHOULD get 501. The router
     * decodes none but chunked, so gzip, deflate, compress and unknown names all land here.
     * "identity" too: RFC 7230 8.4.2 removed it and the IANA registry lists it as reserved, so it
     * is not a coding this server implements; answering 501 rather than 400 keeps one status for
     * "a coding we do not do" whatever its name. */
    *out = (kvr_http_rejection_t){501, "unsupported_transfer_encoding",
                                  "only the chunked transfer coding is supported"};
    return -1;
  }
  return 0;
}

/* ---- llhttp callbacks --------------------------------------------------------------------------
 */

static int on_message_begin(llhttp_t *lp) {
  kvr_http_parse_t *p = parse_of(lp);
  kvr_http_parse_req_free(p->cur);
  kvr_http_req_t *req = kvr_xcalloc(1, sizeof *req);
  req->start_ns = kvr_now_ns();
  kvr_buf_init(&req->body);
  req->query = "";
  p->cur = req;
  p->header_bytes = p->header_fields = p->url_bytes = 0;
  p->version_seen = false;
  kvr_buf_reset(&p->hfield);
  kvr_buf_reset(&p->hvalue);
  p->phase = KVR_HTTP_PHASE_HEAD;
  return 0;
}

static int on_url(llhttp_t *lp, const char *at, size_t len) {
  kvr_http_parse_t *p = parse_of(lp);
  /* Byte by byte, so that the first offending byte decides (too long or not visible ASCII)
   * whatever the pieces llhttp hands over. */
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)at[i];
    if (p->url_bytes + i >= p->limits.max_url)
      return reject(p, 414, "uri_too_long", "request target exceeds the configured limit");
    if (c < 0x21 || c > 0x7e)
      return reject(p, 400, "invalid_request_target",
                    "request target has byte 0x%02x; only visible ASCII (0x21-0x7e) is allowed", c);
  }
  p->url_bytes += len;
  /* The span ends inside this buffer: at[len] is what ended the target. */
  if (at + len < p->feed_end && (at[len] == '\r' || at[len] == '\n'))
    return reject(p, 400, "missing_http_version",
                  "request line has no HTTP version (HTTP/0.9 is not supported)");
  kvr_buf_append(&p->hfield, at, len); /* hfield doubles as the target accumulator */
  return 0;
}

static int on_url_complete(llhttp_t *lp) {
  kvr_http_parse_t *p = parse_of(lp);
  kvr_http_req_t *req = p->cur;
  req->target = kvr_buf_steal(&p->hfield);
  if (req->target == NULL)
    req->target = kvr_xcalloc(1, 1);
  char *q = strchr(req->target, '?');
  size_t plen = q ? (size_t)(q - req->target) : strlen(req->target);
  req->path = kvr_xmalloc(plen + 1);
  memcpy(req->path, req->target, plen);
  req->path[plen] = '\0';
  req->query = q ? q + 1 : "";
  return 0;
}

static int on_version_complete(llhttp_t *lp) {
  kvr_http_parse_t *p = parse_of(lp);
  p->version_seen = true;
  if (lp->http_major != 1 || lp->http_minor > 1)
    return reject(p, 505, "http_version_not_supported",
                  "HTTP/%d.%d is not supported; use HTTP/1.1 or HTTP/1.0", lp->http_major,
                  lp->http_minor);
  return 0;
}

/* Counts a piece of a header name or value against max_header_bytes (431 when over) and appends
 * it to its buffer. */
static int header_piece(kvr_http_parse_t *p, const char *at, size_t len, kvr_buf_t *to) {
  p->header_bytes += len;
  if (p->header_bytes > p->limits.max_header_bytes)
    return reject(p, 431, "headers_too_large", "request headers exceed the configured size limit");
  kvr_buf_append(to, at, len);
  return 0;
}

static int on_header_field(llhttp_t *lp, const char *at, size_t len) {
  kvr_http_parse_t *p = parse_of(lp);
  return header_piece(p, at, len, &p->hfield);
}

/* The byte just before at, in this feed or (at its start) the last one fed before. */
static char prev_byte(const kvr_http_parse_t *p, const char *at) {
  return at > p->feed_start ? at[-1] : p->prev_byte;
}

/* The last byte other than SP/HTAB before at, likewise. */
static char prev_nonws(const kvr_http_parse_t *p, const char *at) {
  while (at > p->feed_start && is_ows(at[-1]))
    at--;
  return at > p->feed_start ? at[-1] : p->prev_nonws;
}

static int on_header_value(llhttp_t *lp, const char *at, size_t len) {
  kvr_http_parse_t *p = parse_of(lp);
  /* A value piece that starts a line with SP/HTAB continues the previous line: obs-fold, which
   * RFC 9112 5.2 lets a server refuse with 400. A proxy must: the worker could unfold it
   * differently. llhttp starts such a piece at the blank right after the LF (an ordinary value
   * starts after the colon and its blanks); the piece may also be the rest of that line after a
   * feed ended inside the blanks. An empty value's zero-length piece is no fold. */
  if (len > 0 && prev_nonws(p, at) == '\n' && (is_ows(at[0]) || is_ows(prev_byte(p, at))))
    return reject(p, 400, "obsolete_line_folding",
                  "%s field value is folded across lines (obs-fold), which is not allowed",
                  p->phase == KVR_HTTP_PHASE_BODY ? "a trailer" : "a header");
  return header_piece(p, at, len, &p->hvalue);
}

static int on_header_value_complete(llhttp_t *lp) {
  kvr_http_parse_t *p = parse_of(lp);
  kvr_http_req_t *req = p->cur;
  if (++p->header_fields > p->limits.max_header_fields)
    return reject(p, 431, "too_many_headers", "request has more header fields than allowed");
  /* RFC 9110 5.6.2 token characters. llhttp 8 lets a space inside a name or before the colon
   * through; forwarding such a name is how request desync between proxy and worker starts. */
  if (!is_token(p->hfield.data, p->hfield.len))
    return reject(p, 400, "invalid_header", "header field name is not a valid token");
  /* llhttp (strict) already refuses CR, LF and NUL inside values; the check is kept as a second
   * line of defence because header values are copied to upstream requests verbatim. */
  if (p->hvalue.len && memchr(p->hvalue.data, '\0', p->hvalue.len))
    return reject(p, 400, "invalid_header", "header value contains a NUL byte");
  if (p->phase == KVR_HTTP_PHASE_BODY) {
    /* A trailer: checked and counted like a header, then dropped (never merged, RFC 9110 6.5.1). */
    kvr_buf_reset(&p->hfield);
    kvr_buf_reset(&p->hvalue);
    return 0;
  }
  /* llhttp drops leading OWS; the field value excludes the trailing OWS too (RFC 9112 5). */
  while (p->hvalue.len && is_ows(p->hvalue.data[p->hvalue.len - 1]))
    p->hvalue.data[--p->hvalue.len] = '\0';
  kvr_http_header_t *h = kvr_xrealloc(req->headers, (req->nheaders + 1) * sizeof *h);
  req->headers = h;
  h[req->nheaders].name = kvr_buf_steal(&p->hfield);
  h[req->nheaders].value = kvr_buf_steal(&p->hvalue);
  if (h[req->nheaders].value == NULL)
    h[req->nheaders].value = kvr_xcalloc(1, 1);
  req->nheaders++;
  return 0;
}

/* The first value of header name in req, or NULL (names compare ASCII case-insensitively). */
static const char *find_header(const kvr_http_req_t *req, const char *name) {
  for (size_t i = 0; i < req->nheaders; i++)
    if (strcasecmp(req->headers[i].name, name) == 0)
      return req->headers[i].value;
  return NULL;
}

/* RFC 9112 3.2: exactly one Host on HTTP/1.1, at most one on HTTP/1.0, and a valid one. */
static int check_host(kvr_http_parse_t *p, const kvr_http_req_t *req) {
  const char *host = NULL;
  for (size_t i = 0; i < req->nheaders; i++) {
    if (strcasecmp(req->headers[i].name, "host") != 0)
      continue;
    if (host)
      return reject(p, 400, "invalid_host", "request has more than one Host header field");
    host = req->headers[i].value;
  }
  if (host == NULL && req->http_minor >= 1)
    return reject(p, 400, "missing_host", "HTTP/1.1 request has no Host header field");
  if (host && !kvr_http_parse_host_ok(host))
    return reject(p, 400, "invalid_host", "Host header field is not a valid host[:port]");
  return 0;
}

/* Fields that are not lists and that the router reads (RFC 9110 5.3: a recipient may not combine
 * their repetitions): the router would read the first while a worker, or a server behind it, may
 * read the last, so a second one is refused rather than guessed. */
static int check_singletons(kvr_http_parse_t *p, const kvr_http_req_t *req) {
  static const char *const singleton[] = {"authorization", "content-type", "x-request-id",
                                          "proxy-authorization"};
  for (size_t s = 0; s < KVR_ARRAY_SIZE(singleton); s++) {
    int seen = 0;
    for (size_t i = 0; i < req->nheaders; i++)
      if (strcasecmp(req->headers[i].name, singleton[s]) == 0 && ++seen > 1)
        return reject(p, 400, "duplicate_header", "request has more than one %s header field",
                      singleton[s]);
  }
  return 0;
}

/* Transfer-Encoding rules (RFC 9112 6.1, 6.3, 7) beyond what llhttp checks. */
static int check_te(kvr_http_parse_t *p, const kvr_http_req_t *req) {
  const char *vals[16];
  size_t n = 0;
  for (size_t i = 0; i < req->nheaders; i++) {
    if (strcasecmp(req->headers[i].name, "transfer-encoding") != 0)
      continue;
    if (n == sizeof vals / sizeof *vals)
      return reject(p, 400, "invalid_transfer_encoding", "too many Transfer-Encoding fields");
    vals[n++] = req->headers[i].value;
  }
  if (n == 0)
    return 0;
  if (req->http_minor == 0)
    return reject(p, 400, "invalid_transfer_encoding",
                  "Transfer-Encoding is not allowed in an HTTP/1.0 request");
  if (find_header(req, "content-length"))
    return reject(p, 400, "invalid_transfer_encoding",
                  "a request may not have both Transfer-Encoding and Content-Length");
  kvr_http_rejection_t r;
  if (kvr_http_parse_te_check(vals, n, &r) != 0)
    return reject(p, r.status, r.code, "%s", r.message);
  return 0;
}

static int on_headers_complete(llhttp_t *lp) {
  kvr_http_parse_t *p = parse_of(lp);
  kvr_http_req_t *req = p->cur;
  if (!p->version_seen)
    return reject(p, 400, "missing_http_version", "request line has no HTTP version");
  req->method = lp->method;
  req->method_str = llhttp_method_name((llhttp_method_t)lp->method);
  req->http_major = lp->http_major;
  req->http_minor = lp->http_minor;
  req->keep_alive = llhttp_should_keep_alive(lp);
  if (req->path == NULL)
    return reject(p, 400, "invalid_request_target", "missing request target");
  if (lp->method == HTTP_CONNECT)
    return reject(p, 405, "method_not_allowed", "CONNECT is not supported");
  if (lp->upgrade || (lp->flags & F_UPGRADE) || find_header(req, "upgrade"))
    return reject(p, 501, "upgrade_not_supported", "protocol upgrades are not supported");
  if (check_host(p, req) != 0 || check_singletons(p, req) != 0 || check_te(p, req) != 0)
    return -1;
  if ((lp->flags & F_CONTENT_LENGTH) && lp->content_length > p->limits.max_body)
    return reject(p, 413, "body_too_large", "request body exceeds the configured limit");
  /* The whole body's size is known and within max_body: one allocation, so a large body is
   * written once instead of regrown by doubling in on_body (copying it each time). */
  if ((lp->flags & F_CONTENT_LENGTH) && lp->content_length > 0)
    kvr_buf_reserve(&req->body, (size_t)lp->content_length);
  p->phase = KVR_HTTP_PHASE_BODY;
  return HPE_PAUSED;
}

static int on_chunk_header(llhttp_t *lp) {
  kvr_http_parse_t *p = parse_of(lp);
  /* Answered as soon as the chunk-size line is complete, not when the body limit is hit much
   * later (or never, when the client stalls): a size over 32 bits is malformed for us, as for
   * HAProxy; one over what remains of max_body is too large. */
  if (lp->content_length > UINT32_MAX)
    return reject(p, 400, "invalid_chunk_size", "chunk size does not fit in 32 bits");
  if (lp->content_length > p->limits.max_body - p->cur->body.len)
    return reject(p, 413, "body_too_large", "request body exceeds the configured limit");
  return 0;
}

static int on_body(llhttp_t *lp, const char *at, size_t len) {
  kvr_http_parse_t *p = parse_of(lp);
  kvr_http_req_t *req = p->cur;
  if (len > p->limits.max_body - req->body.len)
    return reject(p, 413, "body_too_large", "request body exceeds the configured limit");
  kvr_buf_append(&req->body, at, len);
  return 0;
}

static int on_message_complete(llhttp_t *lp) {
  /* Pause so that llhttp_execute() returns here: the caller handles the request outside the
   * parser, and the bytes of any pipelined request stay unparsed until it takes this one. */
  parse_of(lp)->done = true;
  return HPE_PAUSED;
}

static const llhttp_settings_t *parser_settings(void) {
  static const llhttp_settings_t s = {
      .on_message_begin = on_message_begin,
      .on_url = on_url,
      .on_url_complete = on_url_complete,
      .on_version_complete = on_version_complete,
      .on_header_field = on_header_field,
      .on_header_value = on_header_value,
      .on_header_value_complete = on_header_value_complete,
      .on_headers_complete = on_headers_complete,
      .on_chunk_header = on_chunk_header,
      .on_body = on_body,
      .on_message_complete = on_message_complete,
  };
  return &s;
}

/* ---- the feed API ------------------------------------------------------------------------------
 */

/* Here rather than in the listener: the parser is what enforces most of them, and it must not
 * need the listener (the fuzz target links the parser alone). */
void kvr_http_limits_default(kvr_http_limits_t *l) {
  l->max_url = 8192;
  l->max_header_bytes = 32768;
  l->max_header_fields = 100;
  l->max_body = 8u << 20;
  l->header_timeout_ms = 10000;
  l->body_timeout_ms = 60000;
  l->keepalive_timeout_ms = 75000;
  l->max_connections = 4096;
  l->max_body_buffer = 256u << 20;
}

kvr_http_parse_t *kvr_http_parse_new(const kvr_http_limits_t *limits) {
  kvr_http_parse_t *p = kvr_xcalloc(1, sizeof *p);
  if (limits)
    p->limits = *limits;
  else
    kvr_http_limits_default(&p->limits);
  llhttp_init(&p->parser, HTTP_REQUEST, parser_settings());
  p->parser.lenient_flags |= LENIENT_VERSION; /* the version table is ours: see the top */
  p->parser.data = p;
  kvr_buf_init(&p->hfield);
  kvr_buf_init(&p->hvalue);
  p->prev_byte = p->prev_nonws = '\0';
  return p;
}

void kvr_http_parse_free(kvr_http_parse_t *p) {
  if (p == NULL)
    return;
  kvr_http_parse_req_free(p->cur);
  kvr_buf_free(&p->hfield);
  kvr_buf_free(&p->hvalue);
  free(p);
}

/* Translates an llhttp error no callback of ours explains into the answer (the one boundary). */
static void reject_llhttp(kvr_http_parse_t *p, llhttp_errno_t err) {
  const char *why = llhttp_get_error_reason(&p->parser);
  if (why == NULL)
    why = llhttp_errno_name(err);
  switch (err) {
  case HPE_PAUSED_UPGRADE:
    reject(p, 501, "upgrade_not_supported", "protocol upgrades are not supported");
    break;
  case HPE_PAUSED_H2_UPGRADE:
    reject(p, 505, "http_version_not_supported", "HTTP/2 is not supported; use HTTP/1.1");
    break;
  case HPE_INVALID_TRANSFER_ENCODING:
    reject(p, 400, "invalid_transfer_encoding", "invalid Transfer-Encoding: %s", why);
    break;
  case HPE_INVALID_CHUNK_SIZE:
    reject(p, 400, "invalid_chunk_size", "invalid chunk size: %s", why);
    break;
  default:
    reject(p, 400, "bad_request", "malformed HTTP request: %s", why);
    break;
  }
}

/* When llhttp fails on a byte inside a span (target, header name or value), it returns without
 * passing the span's bytes before that byte to our callback. Fed in smaller pieces, those bytes
 * would have reached the callback at the end of an earlier feed, and its verdict (a 414, a 431, a
 * byte outside visible ASCII...) would have come first. So they are passed now, the way llhttp
 * passes a span at the end of a feed (_span_pos0/_span_cb0 are fields of llhttp's public parser
 * struct), so that the verdict does not depend on how the bytes were split. The end of the
 * feed is set to the failing byte: that byte ends nothing. */
static void flush_failed_span(kvr_http_parse_t *p) {
  typedef int (*span_cb_t)(llhttp_t *, const char *, const char *);
  const char *start = p->parser._span_pos0, *pos = llhttp_get_error_pos(&p->parser);
  if (start == NULL || p->parser._span_cb0 == NULL || pos == NULL || start < p->feed_start ||
      pos > p->feed_end || start > pos)
    return;
  span_cb_t cb;
  memcpy(&cb, &p->parser._span_cb0, sizeof cb);
  p->feed_end = pos;
  cb(&p->parser, start, pos);
}

kvr_http_parse_event_t kvr_http_parse_feed(kvr_http_parse_t *p, const char *data, size_t len,
                                           size_t *used) {
  static const char none[1];
  *used = 0;
  if (data == NULL)
    data = none; /* an empty buffer may have no storage; llhttp does pointer arithmetic on it */
  if (p->phase == KVR_HTTP_PHASE_FAILED)
    return KVR_HTTP_PARSE_REJECT;
  if (p->done)
    return KVR_HTTP_PARSE_DONE; /* not taken yet */
  if (p->paused) {
    llhttp_resume(&p->parser);
    p->paused = false;
  }
  p->feed_start = data;
  p->feed_end = data + len;
  llhttp_errno_t err = llhttp_execute(&p->parser, data, len);
  const char *stop = data + len;
  kvr_http_parse_event_t ev = KVR_HTTP_PARSE_MORE;
  if (err == HPE_PAUSED && !p->rej.status) {
    stop = llhttp_get_error_pos(&p->parser);
    p->paused = true;
    ev = p->done ? KVR_HTTP_PARSE_DONE : KVR_HTTP_PARSE_HEAD;
  } else if (err != HPE_OK) {
    if (!p->rej.status)
      flush_failed_span(p);
    if (!p->rej.status)
      reject_llhttp(p, err);
    p->phase = KVR_HTTP_PHASE_FAILED;
    stop = data;
    ev = KVR_HTTP_PARSE_REJECT;
  }
  *used = (size_t)(stop - data);
  if (stop > data)
    p->prev_byte = stop[-1];
  for (const char *s = stop; s > data; s--)
    if (!is_ows(s[-1])) {
      p->prev_nonws = s[-1];
      break;
    }
  p->feed_start = p->feed_end = NULL;
  return ev;
}

kvr_http_parse_phase_t kvr_http_parse_phase(const kvr_http_parse_t *p) {
  return p->phase;
}

const kvr_http_req_t *kvr_http_parse_current(const kvr_http_parse_t *p) {
  return p->cur;
}

kvr_http_req_t *kvr_http_parse_take(kvr_http_parse_t *p) {
  if (!p->done)
    return NULL;
  kvr_http_req_t *req = p->cur;
  p->cur = NULL;
  p->done = false;
  p->phase = KVR_HTTP_PHASE_IDLE;
  return req;
}

const kvr_http_rejection_t *kvr_http_parse_rejection(const kvr_http_parse_t *p) {
  return p->rej.status ? &p->rej : NULL;
}

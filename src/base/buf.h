/* buf.h -- a growable byte buffer (kvr_buf_t), the one way modules assemble bytes.
 *
 * A kvr_buf_t owns its storage; data is always NUL-terminated past len so it can be used as a C
 * string when it holds text. Growth doubles; allocation failure aborts the process (kvrouter treats
 * OOM as fatal, as Redis does, because every buffer is bounded by a configured limit first).
 */
#ifndef KVR_BUF_H
#define KVR_BUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct kvr_buf_s {
  char *data; /* owned; NULL until the first append */
  size_t len;
  size_t cap;
} kvr_buf_t;

#define KVR_BUF_INIT                                                                               \
  { NULL, 0, 0 }

void kvr_buf_init(kvr_buf_t *b);
void kvr_buf_free(kvr_buf_t *b);  /* accepts NULL; leaves b empty and reusable */
void kvr_buf_reset(kvr_buf_t *b); /* len = 0, keeps storage */
void kvr_buf_reserve(kvr_buf_t *b, size_t extra);
void kvr_buf_append(kvr_buf_t *b, const void *data, size_t len);
void kvr_buf_puts(kvr_buf_t *b, const char *s);
void kvr_buf_printf(kvr_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvr_buf_vprintf(kvr_buf_t *b, const char *fmt, va_list ap);
/* Drops the first n bytes (n <= len). */
void kvr_buf_consume(kvr_buf_t *b, size_t n);
/* Hands the storage to the caller (who frees it with free()) and leaves b empty. */
char *kvr_buf_steal(kvr_buf_t *b);

/* Appends the whole file at path. Returns 0, KVR_EIO (cannot open or read) or KVR_ELIMIT (larger
 * than max bytes), with a one-line reason naming the path in err; on error b is left empty. */
int kvr_buf_read_file(kvr_buf_t *b, const char *path, size_t max, char *err, size_t errlen);

/* Appends s as a JSON string literal, quotes included, escaping per RFC 8259. */
void kvr_buf_json_str(kvr_buf_t *b, const char *s, size_t len);

#endif

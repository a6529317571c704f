/* log.h -- leveled logging to stderr and the access-log line.
 *
 * Two line formats (--log-format): text, "<ISO time> <level> <module>: message", and json, one
 * object per line {"ts":"...","level":"info","component":"router","msg":"..."} with the message
 * escaped per RFC 8259. Both carry the same UTC timestamp with milliseconds
 * ("2026-11-24T11:22:33.123Z", kvr_log_timestamp()). The access log is one line per proxied
 * request in logfmt (key=value) as its message so it can be grepped and parsed; prompts are never
 * logged.
 */
#ifndef KVR_LOG_H
#define KVR_LOG_H

#include "base/buf.h"

#include <stdbool.h>
#include <stdio.h>
#include <time.h>

typedef enum {
  KVR_LOG_DEBUG = 0,
  KVR_LOG_INFO,
  KVR_LOG_WARN,
  KVR_LOG_ERROR,
  KVR_LOG_OFF
} kvr_log_level_t;

typedef enum { KVR_LOG_TEXT = 0, KVR_LOG_JSON } kvr_log_format_t;

/* Length of a timestamp, "2026-11-24T11:22:33.123Z", without its NUL. */
#define KVR_LOG_TS_LEN 24

void kvr_log_set_level(kvr_log_level_t level);
kvr_log_level_t kvr_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns 0 or KVR_EINVAL. */
int kvr_log_parse_level(const char *s, kvr_log_level_t *out);

void kvr_log_set_format(kvr_log_format_t format);
kvr_log_format_t kvr_log_get_format(void);
/* Parses "text" or "json"; returns 0 or KVR_EINVAL. */
int kvr_log_parse_format(const char *s, kvr_log_format_t *out);

/* Where lines go: stderr unless set (tests); NULL restores stderr. */
void kvr_log_set_stream(FILE *f);

/* Writes the UTC time t (CLOCK_REALTIME now when t is NULL) as "YYYY-MM-DDTHH:MM:SS.mmmZ" into
 * buf (at least KVR_LOG_TS_LEN + 1 bytes, else buf gets ""). */
void kvr_log_timestamp(char *buf, size_t size, const struct timespec *t);

/* Appends one complete line (newline included) in format fmt to out: what kvr_log() writes. ts is
 * a kvr_log_timestamp() string. */
void kvr_log_format_line(kvr_buf_t *out, kvr_log_format_t fmt, const char *ts,
                         kvr_log_level_t level, const char *module, const char *msg);

void kvr_log(kvr_log_level_t level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Holding: from kvr_log_hold(true) on, lines below warn wait in memory until kvr_log_flush()
 * writes them together, one fwrite; a warn or error line, or 64 KiB waiting, writes them at once.
 * Only the holding thread may log meanwhile. kvr_log_hold(false) writes what waits and stops
 * holding; both are no-ops when already in that state. net/log_batch.h flushes once per loop
 * iteration. */
void kvr_log_hold(bool on);
void kvr_log_flush(void);

#define KVR_DEBUG(mod, ...) kvr_log(KVR_LOG_DEBUG, mod, __VA_ARGS__)
#define KVR_INFO(mod, ...) kvr_log(KVR_LOG_INFO, mod, __VA_ARGS__)
#define KVR_WARN(mod, ...) kvr_log(KVR_LOG_WARN, mod, __VA_ARGS__)
#define KVR_ERROR(mod, ...) kvr_log(KVR_LOG_ERROR, mod, __VA_ARGS__)

#endif

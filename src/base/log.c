/* log.c -- leveled stderr logging; see log.h.
 *
 * kvr_log() formats a line (kvr_log_format_line()) and writes it with one fwrite. While lines are
 * held (kvr_log_hold(true); net/log_batch.c does it for `kvrouter serve`'s loop) lines below warn
 * are appended to one pending buffer instead, and kvr_log_flush() writes that buffer with one
 * fwrite: every access-log line of a loop iteration leaves in one write(2) instead of one each. A
 * warn or error line, or 64 KiB pending, writes the buffer at once (lines stay in order). Holding
 * is for one thread; other threads (the virtual study's) log as before, one fwrite per line. No
 * loop here: the ground layer links no libuv.
 */
#include "base/log.h"

#include "base/kvr.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static kvr_log_level_t g_level = KVR_LOG_INFO;
static kvr_log_format_t g_format = KVR_LOG_TEXT;
static FILE *g_stream = NULL; /* NULL: stderr */
static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
static const char *const format_names[] = {"text", "json"};

/* Holding (kvr_log_hold()): lines below warn wait here for kvr_log_flush(). */
#define PENDING_MAX (64 * 1024)
static kvr_buf_t g_pending = KVR_BUF_INIT;
static bool g_batching;

void kvr_log_set_level(kvr_log_level_t level) {
  g_level = level;
}

kvr_log_level_t kvr_log_get_level(void) {
  return g_level;
}

int kvr_log_parse_level(const char *s, kvr_log_level_t *out) {
  for (int i = 0; i <= KVR_LOG_OFF; i++) {
    if (strcmp(s, level_names[i]) == 0) {
      *out = (kvr_log_level_t)i;
      return 0;
    }
  }
  return KVR_EINVAL;
}

void kvr_log_set_format(kvr_log_format_t format) {
  g_format = format;
}

kvr_log_format_t kvr_log_get_format(void) {
  return g_format;
}

int kvr_log_parse_format(const char *s, kvr_log_format_t *out) {
  for (int i = 0; i <= KVR_LOG_JSON; i++) {
    if (strcmp(s, format_names[i]) == 0) {
      *out = (kvr_log_format_t)i;
      return 0;
    }
  }
  return KVR_EINVAL;
}

void kvr_log_set_stream(FILE *f) {
  g_stream = f;
}

void kvr_log_timestamp(char *buf, size_t size, const struct timespec *t) {
  if (size == 0)
    return;
  buf[0] = '\0';
  if (size < KVR_LOG_TS_LEN + 1)
    return;
  struct timespec now;
  if (t == NULL) {
    clock_gettime(CLOCK_REALTIME, &now);
    t = &now;
  }
  /* The date and time of the last second formatted, per thread: one strftime per second. */
  static _Thread_local time_t cached_sec = (time_t)-1;
  static _Thread_local char base[32];
  if (t->tv_sec != cached_sec) {
    time_t sec = t->tv_sec;
    struct tm tm;
    if (gmtime_r(&sec, &tm) == NULL ||
        strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm) != KVR_LOG_TS_LEN - 5) {
      cached_sec = (time_t)-1;
      return;
    }
    cached_sec = sec;
  }
  long ms = t->tv_nsec / 1000000;
  if (ms < 0 || ms > 999)
    ms = 0;
  memcpy(buf, base, KVR_LOG_TS_LEN - 5);
  buf[KVR_LOG_TS_LEN - 5] = '.';
  buf[KVR_LOG_TS_LEN - 4] = (char)('0' + ms / 100);
  buf[KVR_LOG_TS_LEN - 3] = (char)('0' + ms / 10 % 10);
  buf[KVR_LOG_TS_LEN - 2] = (char)('0' + ms % 10);
  buf[KVR_LOG_TS_LEN - 1] = 'Z';
  buf[KVR_LOG_TS_LEN] = '\0';
}

void kvr_log_format_line(kvr_buf_t *out, kvr_log_format_t fmt, const char *ts,
                         kvr_log_level_t level, const char *module, const char *msg) {
  const char *lvl = level <= KVR_LOG_OFF ? level_names[level] : "?";
  if (fmt == KVR_LOG_JSON) {
    kvr_buf_puts(out, "{\"ts\":");
    kvr_buf_json_str(out, ts, strlen(ts));
    kvr_buf_puts(out, ",\"level\":");
    kvr_buf_json_str(out, lvl, strlen(lvl));
    kvr_buf_puts(out, ",\"component\":");
    kvr_buf_json_str(out, module, strlen(module));
    kvr_buf_puts(out, ",\"msg\":");
    kvr_buf_json_str(out, msg, strlen(msg));
    kvr_buf_puts(out, "}\n");
  } else {
    kvr_buf_printf(out, "%s %s %s: %s\n", ts, lvl, module, msg);
  }
}

/* One fwrite per line, or per batch of whole lines, keeps lines whole when several processes
 * share a terminal or a pipe. */
static void write_out(const char *data, size_t len) {
  FILE *f = g_stream ? g_stream : stderr;
  fwrite(data, 1, len, f);
  if (f != stderr)
    fflush(f);
}

void kvr_log(kvr_log_level_t level, const char *module, const char *fmt, ...) {
  if (level < g_level || level >= KVR_LOG_OFF)
    return;
  char ts[KVR_LOG_TS_LEN + 8];
  kvr_log_timestamp(ts, sizeof ts, NULL);
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (g_batching) {
    kvr_log_format_line(&g_pending, g_format, ts, level, module, msg);
    if (level >= KVR_LOG_WARN || g_pending.len >= PENDING_MAX)
      kvr_log_flush();
    return;
  }
  kvr_buf_t line = KVR_BUF_INIT;
  kvr_log_format_line(&line, g_format, ts, level, module, msg);
  write_out(line.data, line.len);
  kvr_buf_free(&line);
}

void kvr_log_flush(void) {
  if (g_pending.len == 0)
    return;
  write_out(g_pending.data, g_pending.len);
  g_pending.len = 0;
  if (g_pending.cap > 4 * PENDING_MAX) /* a burst of long lines: do not keep its memory */
    kvr_buf_free(&g_pending);
}

void kvr_log_hold(bool on) {
  if (on == g_batching)
    return;
  g_batching = on;
  if (!on) {
    kvr_log_flush();
    kvr_buf_free(&g_pending);
  }
}

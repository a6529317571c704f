/* log.c -- leveled stderr logging; see log.h. Single-threaded like the loop that calls it. */
#include "log.h"

#include "kvr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static kvr_log_level_t g_level = KVR_LOG_INFO;
static kvr_log_format_t g_format = KVR_LOG_TEXT;
static FILE *g_stream = NULL; /* NULL: stderr */
static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};
static const char *const format_names[] = {"text", "json"};

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
  time_t sec = t->tv_sec;
  struct tm tm;
  if (gmtime_r(&sec, &tm) == NULL)
    return;
  char base[32];
  if (strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm) == 0)
    return;
  long ms = t->tv_nsec / 1000000;
  if (ms < 0 || ms > 999)
    ms = 0;
  snprintf(buf, size, "%s.%03ldZ", base, ms);
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
  kvr_buf_t line = KVR_BUF_INIT;
  kvr_log_format_line(&line, g_format, ts, level, module, msg);
  /* One fwrite per line keeps lines whole when several processes share a terminal. */
  FILE *f = g_stream ? g_stream : stderr;
  fwrite(line.data, 1, line.len, f);
  if (f != stderr)
    fflush(f);
  kvr_buf_free(&line);
}

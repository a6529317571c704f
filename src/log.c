/* log.c -- leveled stderr logging; see log.h. Single-threaded like the loop that calls it. */
#include "log.h"

#include "kvr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static kvr_log_level_t g_level = KVR_LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

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

void kvr_log(kvr_log_level_t level, const char *module, const char *fmt, ...) {
  if (level < g_level || level >= KVR_LOG_OFF)
    return;
  char ts[32];
  kvr_utc_iso8601(ts, sizeof ts);
  char line[4096];
  int n = snprintf(line, sizeof line, "%s %s %s: ", ts, level_names[level], module);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof line)
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  /* One fputs per line keeps lines whole when several processes share a terminal. */
  size_t len = strlen(line);
  if (len + 1 < sizeof line) {
    line[len] = '\n';
    line[len + 1] = '\0';
  }
  fputs(line, stderr);
}

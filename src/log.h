/* log.h -- leveled logging to stderr and the access-log line.
 *
 * Every line is "<ISO time> <level> <module>: message". The access log is one line per proxied
 * request in logfmt (key=value) so it can be grepped and parsed; prompts are never logged.
 */
#ifndef KVR_LOG_H
#define KVR_LOG_H

typedef enum {
  KVR_LOG_DEBUG = 0,
  KVR_LOG_INFO,
  KVR_LOG_WARN,
  KVR_LOG_ERROR,
  KVR_LOG_OFF
} kvr_log_level_t;

void kvr_log_set_level(kvr_log_level_t level);
kvr_log_level_t kvr_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off"; returns 0 or KVR_EINVAL. */
int kvr_log_parse_level(const char *s, kvr_log_level_t *out);
void kvr_log(kvr_log_level_t level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define KVR_DEBUG(mod, ...) kvr_log(KVR_LOG_DEBUG, mod, __VA_ARGS__)
#define KVR_INFO(mod, ...) kvr_log(KVR_LOG_INFO, mod, __VA_ARGS__)
#define KVR_WARN(mod, ...) kvr_log(KVR_LOG_WARN, mod, __VA_ARGS__)
#define KVR_ERROR(mod, ...) kvr_log(KVR_LOG_ERROR, mod, __VA_ARGS__)

#endif

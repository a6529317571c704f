/* log_batch.c -- one prepare handle that writes the held log lines before the loop waits
 * (log_batch.h). The lines themselves are base/log.c's (kvr_log_hold, kvr_log_flush). */
#include "net/log_batch.h"

#include "base/log.h"

#include <stdbool.h>

static uv_prepare_t g_flush;
static bool g_started;

static void on_flush(uv_prepare_t *h) {
  (void)h;
  kvr_log_flush();
}

void kvr_log_batch_start(uv_loop_t *loop) {
  if (g_started)
    return;
  uv_prepare_init(loop, &g_flush);
  uv_prepare_start(&g_flush, on_flush);
  uv_unref((uv_handle_t *)&g_flush); /* never keeps the loop alive by itself */
  g_started = true;
  kvr_log_hold(true);
}

void kvr_log_batch_stop(void) {
  if (!g_started)
    return;
  g_started = false;
  kvr_log_hold(false);
  uv_close((uv_handle_t *)&g_flush, NULL);
}

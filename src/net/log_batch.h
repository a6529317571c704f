/* log_batch.h -- the access log written once per loop iteration (base/log.h holds the lines).
 *
 * From kvr_log_batch_start(loop) on, lines below warn wait in memory and are written together, one
 * fwrite, each time the loop is about to wait for I/O (an unreferenced prepare handle); a warn or
 * error line, or 64 KiB waiting, writes them at once. A crash loses at most what one loop iteration
 * logged. Only the loop's thread may log while batching. kvr_log_batch_stop() writes what waits and
 * closes the handle (run the loop once more before uv_loop_close()); both are no-ops when already
 * in that state.
 */
#ifndef KVR_LOG_BATCH_H
#define KVR_LOG_BATCH_H

#include <uv.h>

void kvr_log_batch_start(uv_loop_t *loop);
void kvr_log_batch_stop(void);

#endif

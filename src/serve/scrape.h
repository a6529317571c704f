/* scrape.h -- periodic GET /metrics of every worker: load figures for the policies, vLLM's token
 * counters for the actual cached and token figures, and health; and GET /v1/models of every
 * worker, every 30 s and when it comes back up: the model ids it serves and their max_model_len.
 *
 * A kvr_scrape_t is owned by serve.c. It owns its uv timer and its in-flight probes, uses the curl
 * multi and reads the router it is given (both must outlive it), and reports every result through
 * the router's calls (kvr_router_on_health, kvr_router_on_scrape). It holds worker ids, never
 * worker pointers: a worker removed while its probe is in flight is simply not found when the probe
 * reports, and the probe is cancelled at the next tick at the latest.
 *
 * The page formats (/metrics, /v1/models) are proto/vllm.c's, pure and tested without a loop.
 */
#ifndef KVR_SCRAPE_H
#define KVR_SCRAPE_H

#include "core/router.h"
#include "net/curlm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct kvr_scrape_s kvr_scrape_t;

/* Creates the scraper on loop, probing r's workers through curlm, and starts its timer (every
 * r->cfg->scrape_interval_ms; with 0, once a second and only DOWN workers, so they can recover).
 * Never returns NULL (out of memory aborts, kvr.h). */
kvr_scrape_t *kvr_scrape_new(uv_loop_t *loop, kvr_curlm_t *curlm, kvr_router_t *r);

/* Stops the timer, cancels every probe in flight (no report follows) and closes the timer; s is
 * freed once the loop has run the close callback. Call before closing curlm or freeing the router.
 * Accepts NULL. */
void kvr_scrape_close(kvr_scrape_t *s);

/* What one probe of worker id found, reported to r: reachable is whether a connection was made;
 * page (len bytes, may be NULL when !ok) is the body of a 200 answer when ok. Applies health and,
 * when ok and the page parses, its figures. Returns 0, KVR_EPARSE (page ignored) or KVR_ENOENT
 * (worker gone). The path every probe takes; exposed for tests. */
int kvr__scrape_report(kvr_router_t *r, uint32_t id, bool reachable, bool ok, const char *page,
                       size_t len, uint64_t now_ms);

#endif

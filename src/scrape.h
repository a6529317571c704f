/* scrape.h -- periodic GET /metrics of every worker: load figures for the policies, vLLM's token
 * counters for the actual cached and token figures, and health; and GET /v1/models of every
 * worker until its context length (max_model_len) is known.
 *
 * A kvr_scrape_t is owned by serve.c. It owns its uv timer and its in-flight probes, uses the curl
 * multi and reads the router it is given (both must outlive it), and reports every result through
 * the router's calls (kvr_router_on_health, kvr_router_on_scrape). It holds worker ids, never
 * worker pointers: a worker removed while its probe is in flight is simply not found when the probe
 * reports, and the probe is cancelled at the next tick at the latest.
 *
 * The parser, kvr_scrape_parse(), is pure and tested without a loop.
 */
#ifndef KVR_SCRAPE_H
#define KVR_SCRAPE_H

#include "curlm.h"
#include "router.h"

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

/* Parses the Prometheus text of a vLLM /metrics page taken at now_ms into *out: samples of one name
 * are summed across label sets (several engines behind one server), the cache usage is their mean.
 * Returns 0, or KVR_EPARSE when none of the expected series is present (*out is then unusable). */
int kvr_scrape_parse(const char *text, size_t len, uint64_t now_ms, kvr_router_scrape_t *out);

/* Follows one worker's vLLM counters from page to page: st holds the last page's values, cur is the
 * new page's. For each counter on both pages, delta[i] gets its increase; when any counter on both
 * pages went down, the worker restarted (a counter never decreases otherwise): every counter then
 * counts from zero again, so its increase is its whole new value (Prometheus' rate() reads a reset
 * the same way), and st->resets is counted. A counter first seen on this page only sets its
 * baseline (increase 0); one missing from it keeps its last value. Adds the increases to st->sum
 * and returns whether the page was a reset. Pure; no negative increase is ever reported. */
bool kvr_scrape_counters_advance(kvr_vllm_counter_state_t *st, const kvr_vllm_counters_t *cur,
                                 uint64_t delta[KVR_VLLM_NCOUNTERS]);

/* What one probe of worker id found, reported to r: reachable is whether a connection was made;
 * page (len bytes, may be NULL when !ok) is the body of a 200 answer when ok. Applies health and,
 * when ok and the page parses, its figures. Returns 0, KVR_EPARSE (page ignored) or KVR_ENOENT
 * (worker gone). The path every probe takes; exposed for tests. */
int kvr__scrape_report(kvr_router_t *r, uint32_t id, bool reachable, bool ok, const char *page,
                       size_t len, uint64_t now_ms);

/* Parses a GET /v1/models answer: *max_model_len gets the smallest positive max_model_len of the
 * objects in "data" (vLLM gives one per model it serves). Returns 0, or KVR_EPARSE when the text is
 * not such a list or no model gives one. */
int kvr_scrape_parse_models(const char *text, size_t len, uint64_t *max_model_len);

#endif

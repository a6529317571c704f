/* monitor.h -- the bench's side channel to the system under test: the model name, policy switches
 * and prefix-cache resets between runs, and the workers' engine counters around each level (which
 * limit a level hit).
 *
 * A kvr_monitor_t has its own kvr_curlm_t on the bench's loop, separate from the load generator's,
 * so its calls never queue behind or share a connection with the measured traffic.
 *
 * Targets (the servers whose /metrics are read): with an admin URL (the router's admin listener),
 * the workers GET ADMIN/admin/workers lists at each level start; without one, the endpoint's own
 * server (the --url without its path): one worker or a vLLM server. A target whose /metrics cannot
 * be read (a router's public listener answers 404) simply contributes nothing.
 *
 * Level figures: kvr_monitor_level_begin() reads every target's vllm:num_preemptions_total and
 * vllm:kv_cache_usage_perc (vllm:gpu_cache_usage_perc on older vLLM), then polls them every
 * poll interval while the level runs; kvr_monitor_level_end() reads them once more and writes into
 * the level the increase in preemptions summed over the workers read at both ends, and the highest
 * KV cache usage any read saw. With an admin URL, the router's own predicted and reported cached
 * prompt tokens (kvrouter_worker_usage_*_total on its /metrics) are read at both ends too.
 *
 * Loop discipline: the synchronous calls (reset, level begin/end) run the loop until their own
 * transfers finish and then uv_stop() it; a poll that finishes while the load generator runs the
 * loop never stops it. Not to be called while another uv_run() of the same loop is in progress.
 */
#ifndef KVR_MONITOR_H
#define KVR_MONITOR_H

#include "stats.h"

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct kvr_monitor_s kvr_monitor_t;

/* Creates a monitor on loop. admin_url (the router's admin listener) may be NULL; url is the
 * benchmarked endpoint (its path is ignored). poll_ms is the polling period during a level (real
 * ms, >= 50). Strings are copied. Returns NULL on a bad URL or when curl cannot be set up. */
kvr_monitor_t *kvr_monitor_new(uv_loop_t *loop, const char *admin_url, const char *url,
                               uint64_t poll_ms);

/* Stops polling, cancels transfers and closes the monitor's handles; the memory is freed once the
 * loop has run their close callbacks (the caller runs the loop afterwards). Accepts NULL. */
void kvr_monitor_free(kvr_monitor_t *m);

/* Asks GET /v1/models at the endpoint's /v1 root for the first model id (as `vllm bench serve`
 * does when no model is given) and copies it into model. Runs the loop until the answer. Returns 0
 * or KVR_EIO / KVR_EUPSTREAM / KVR_EPARSE with the reason in err. */
int kvr_monitor_fetch_model(kvr_monitor_t *m, char *model, size_t size, char *err, size_t errlen);

/* Asks the same GET /v1/models for the served context: *max_model_len gets the smallest
 * max_model_len of its models (vLLM's and the simulator's list give one per model). Runs the loop
 * until the answer. Returns 0, or KVR_EIO / KVR_EUPSTREAM / KVR_EPARSE (the list gives none) with
 * the reason in err. */
int kvr_monitor_fetch_max_model_len(kvr_monitor_t *m, uint64_t *max_model_len, char *err,
                                    size_t errlen);

/* Switches the router's policy: PUT ADMIN/admin/policy with {"policy": NAME} and, when params (a
 * JSON object's text) is not NULL, "params": params. Runs the loop until the answer. Returns 0,
 * KVR_EINVAL without an admin URL, or KVR_EUPSTREAM / KVR_EIO with the reason in err. */
int kvr_monitor_set_policy(kvr_monitor_t *m, const char *policy, const char *params, char *err,
                           size_t errlen);

/* Resets the prefix caches: POST ADMIN/admin/reset_prefix_cache when an admin URL was given (every
 * worker plus the router's cache index), else POST URL/reset_prefix_cache on the endpoint's server
 * (vLLM's dev-mode endpoint, served by `kvrouter sim`). Runs the loop until the answer. Writes a
 * one-line outcome into summary ("4/4 workers reset", "3/4 workers reset; worker 2 ...: HTTP 404").
 * Returns 0 when every worker reset, KVR_EUPSTREAM when some did not, KVR_EIO when the call itself
 * failed. */
int kvr_monitor_reset_cache(kvr_monitor_t *m, char *summary, size_t size);

/* Finds the targets, reads their counters and starts polling. Runs the loop until the reads end. */
void kvr_monitor_level_begin(kvr_monitor_t *m);

/* Stops polling, reads the counters again and fills lv->engine_workers, lv->preemptions and
 * lv->kv_usage_peak (engine_workers stays 0 when no target was read at both ends). With lv NULL
 * (the level did not run) it only stops polling. */
void kvr_monitor_level_end(kvr_monitor_t *m, kvr_level_t *lv);

/* Sums the samples of metric `name` in a Prometheus text page into *sum and their largest value
 * into *max. Returns the number of samples found (0: *sum and *max untouched). Exposed for tests.
 */
size_t kvr_monitor_prom_value(const char *text, size_t len, const char *name, double *sum,
                              double *max);

#endif

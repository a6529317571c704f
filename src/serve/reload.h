/* reload.h -- re-reading `kvrouter serve`'s settings at SIGHUP and applying what can change live.
 *
 * The settings are read again exactly as at start-up (defaults < --config FILE.json < the
 * command-line flags, kvr_config_parse_args() over the same argv) and checked whole, the policy
 * and its parameters included, before anything changes: a bad file changes nothing. Then the
 * live configuration (the one the router reads through its const pointer) and the router are
 * brought to the new settings through the router's public calls:
 *   - policy, policy_params, seed: kvr_router_set_policy() when the name or the effective
 *     parameters differ from the active policy's (an admin PUT /admin/policy is overridden);
 *   - workers: the file's list is the list; URLs not yet served are added, workers whose URL is no
 *     longer listed (added through the admin API or not) are drained, their in-flight requests
 *     finish; discovered workers (discovery.h) stay, the discovery owns them;
 *   - discovery.url, interval_ms, kv_events_port, kv_replay_port: taken by kvr_discovery_apply()
 *     (a new name is resolved at once; no name any more drains the discovered workers);
 *   - timeouts (connect, first byte, idle), retry_after_s, limits.response_buffer_bytes,
 *     health.fail_threshold, metrics_scrape.stale_ms, worker_header, access_log, log_level,
 *     log_format, shutdown_grace_ms: read live by their users, so they take effect at once.
 * What a running process cannot change (the listen addresses, the client limits, the cache
 * geometry, the scrape interval, the admin token and its settings, the CA file) is logged as
 * "needs restart" and left as it is.
 *
 * The reload counts (kvrouter_config_reloads_total{result}) are process-wide: one `serve` per
 * process.
 */
#ifndef KVR_RELOAD_H
#define KVR_RELOAD_H

#include "base/buf.h"
#include "core/config.h"
#include "core/router.h"

typedef struct kvr_discovery_s kvr_discovery_t; /* discovery.h */

#include <stddef.h>

/* The file of the last --config in serve's argv (argv[0] is "serve"), or NULL when none. */
const char *kvr_reload_config_path(int argc, char **argv);

/* Re-reads the settings from argv as kvr_config_parse_args() does, validates them and applies the
 * changeable ones to live (the configuration r reads) and r; logs each change and each setting
 * that needs a restart. Workers in disc's discovered set (disc may be NULL) are kept although the
 * list does not name them; the caller then calls kvr_discovery_apply() for the discovery.* keys.
 * Returns 0, or KVR_EINVAL with one line in err (the config parser's, with the file and line:column
 * for bad JSON) and nothing changed. Counts the result either way. */
int kvr_reload_apply(kvr_config_t *live, kvr_router_t *r, const kvr_discovery_t *disc, int argc,
                     char **argv, char *err, size_t errlen);

/* Appends the kvrouter_config_reloads_total family (result="success" and "failure") to out. */
void kvr_reload_metrics(kvr_buf_t *out);

#endif

/* serve.c -- `kvrouter serve`: wires config, router, public proxy and admin API onto one loop.
 *
 * Start-up: parse flags and config (one-line error and exit 2 on any bad value, an unusable
 * --admin-token-file included; a warning when the admin API is open and off loopback), create the
 * router (workers, policy, cache index; no loop), the curl multi, the scraper and the KV-event
 * feed (kv_feed.h: one ZMQ subscription per worker with a kv_events endpoint), the peers' load
 * polls (peers.h, --peer) and the discovery (discovery.h, --discover: workers from a DNS name,
 * re-resolved; the router may start with none and /health answers 503 until it answers) on the
 * loop, the
 * proxy and the admin API over them, listen on the public and admin addresses, run the loop. Log
 * lines, the access log's included, then leave once per loop iteration (log.h, batching).
 *
 * Reload on SIGHUP (src/serve/reload.h): the settings are read again from the same command line (so
 * from the --config file, flags still overriding it) and checked whole; a bad file logs one error
 * line and changes nothing. Otherwise policy, workers (new ones added, removed ones drained: their
 * requests finish; discovered ones stay), the discovery settings (kvr_discovery_apply()), timeouts,
 * logging and the other settings read live take effect at once; those only a restart can change
 * (listen addresses, client limits, cache geometry...) are logged as "needs restart" and left as
 * they are. Without --config there is nothing to reload (logged).
 * kvrouter_config_reloads_total{result} counts the reloads. No reload once shutdown has begun.
 *
 * Shutdown on SIGINT/SIGTERM: both listeners stop accepting and idle connections close; requests in
 * flight get up to --shutdown-grace-ms (default 10 s) to finish, then (or at a second signal) they
 * are aborted. When the last connection is gone the scraper and the curl multi close their handles,
 * the router is freed and the loop ends; the process exits 0 with every handle closed
 * (uv_loop_close() succeeds).
 */

#include "commands.h"

#include "base/kvr.h"
#include "base/log.h"
#include "core/config.h"
#include "core/router.h"
#include "net/http_server.h"
#include "net/log_batch.h"
#include "serve/admin.h"
#include "serve/discovery.h"
#include "serve/kv_feed.h"
#include "serve/peer_sync.h"
#include "serve/peers.h"
#include "serve/proxy.h"
#include "serve/reload.h"
#include "serve/scrape.h"
#include "serve/trace_out.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  uv_loop_t loop;
  kvr_config_t cfg;
  kvr_router_t *router;
  kvr_curlm_t *curlm;
  kvr_scrape_t *scrape;
  kvr_kv_feed_t *kv_feed; /* workers' KV-event streams (precise mode) */
  kvr_peers_t *peers;     /* other replicas' load (--peer) */
  kvr_peer_sync_t *sync;  /* announced requests, ours and theirs (--peer-sync-listen) */
  kvr_discovery_t *disc;  /* workers from a DNS name (--discover) */
  kvr_proxy_t *proxy;
  kvr_trace_out_t *trace; /* live traffic as a trace (--trace-out), or NULL */
  kvr_admin_t *admin_api;
  kvr_http_server_t *pub, *admin;
  uv_signal_t sigint, sigterm, sighup;
  int argc; /* serve's command line, read again at each reload */
  char **argv;
  uv_timer_t grace;
  int servers_open;
  bool stopping;
} serve_t;

static void on_handle_closed(uv_handle_t *h) {
  (void)h;
}

static void on_server_closed(void *data) {
  serve_t *s = data;
  if (--s->servers_open > 0)
    return;
  kvr_discovery_close(s->disc);
  kvr_scrape_close(s->scrape);
  kvr_kv_feed_close(s->kv_feed);
  kvr_peers_close(s->peers);
  kvr_peer_sync_close(s->sync);
  kvr_curlm_close(s->curlm);
  kvr_router_free(s->router);
  s->router = NULL;
  kvr_log_batch_stop();
  uv_close((uv_handle_t *)&s->sigint, on_handle_closed);
  uv_close((uv_handle_t *)&s->sigterm, on_handle_closed);
  uv_close((uv_handle_t *)&s->sighup, on_handle_closed);
  signal(SIGHUP, SIG_IGN); /* libuv restored the default action, which would end the process */
  uv_close((uv_handle_t *)&s->grace, on_handle_closed);
}

static void on_grace(uv_timer_t *t) {
  serve_t *s = t->data;
  if (kvr_proxy_active(s->proxy))
    KVR_WARN("serve", "aborting %zu requests still in flight", kvr_proxy_active(s->proxy));
  kvr_proxy_abort_all(s->proxy);
}

static void on_signal(uv_signal_t *sig, int signum) {
  serve_t *s = sig->data;
  if (s->stopping) {
    on_grace(&s->grace);
    return;
  }
  s->stopping = true;
  KVR_INFO("serve", "signal %d: shutting down (%zu requests in flight, grace %llu ms)", signum,
           kvr_proxy_active(s->proxy), (unsigned long long)s->cfg.shutdown_grace_ms);
  uv_timer_start(&s->grace, on_grace, s->cfg.shutdown_grace_ms, 0);
  kvr_http_server_close(s->pub, on_server_closed, s);
  kvr_http_server_close(s->admin, on_server_closed, s);
}

static void on_sighup(uv_signal_t *sig, int signum) {
  serve_t *s = sig->data;
  (void)signum;
  if (s->stopping)
    return;
  const char *path = kvr_reload_config_path(s->argc, s->argv);
  if (path == NULL) {
    KVR_WARN("serve", "SIGHUP: no --config file was given, nothing to reload");
    return;
  }
  KVR_INFO("serve", "SIGHUP: reloading the settings from %s", path);
  char err[1024];
  if (kvr_reload_apply(&s->cfg, s->router, s->disc, s->argc, s->argv, err, sizeof err) != 0) {
    KVR_ERROR("serve", "config reload failed, nothing changed: %s", err);
    return;
  }
  kvr_discovery_apply(s->disc);
  kvr_http_server_log_rejects(s->pub, s->cfg.access_log);
}

int kvr_serve_main(int argc, char **argv) {
  /* A SIGHUP before the reload handler is installed (while the config is read) must not end the
   * process with the default action: ignored until uv_signal_start() takes it over. */
  signal(SIGHUP, SIG_IGN);
  serve_t *s = kvr_xcalloc(1, sizeof *s);
  s->argc = argc;
  s->argv = argv;
  char err[1024] = "";
  int exit_code = 0;
  kvr_config_init(&s->cfg);
  int rc = kvr_config_parse_args(&s->cfg, argc, argv, stdout, err, sizeof err);
  if (rc != 0) {
    if (rc < 0)
      fprintf(stderr, "kvrouter serve: %s\n", err);
    kvr_config_free(&s->cfg);
    free(s);
    return rc > 0 ? 0 : 2;
  }
  kvr_log_level_t lvl;
  if (kvr_log_parse_level(s->cfg.log_level, &lvl) == 0)
    kvr_log_set_level(lvl);
  kvr_log_format_t lfmt;
  if (kvr_log_parse_format(s->cfg.log_format, &lfmt) == 0)
    kvr_log_set_format(lfmt);
  if (s->cfg.admin_token == NULL && !kvr_config_admin_on_loopback(&s->cfg))
    KVR_WARN("serve",
             "the admin API on %s is unauthenticated and not on loopback: anyone who reaches it "
             "can change workers and policy (give --admin-token-file)",
             s->cfg.admin_listen);
  if (s->cfg.worker_ca_file != NULL)
    kvr_curl_set_ca_file(s->cfg.worker_ca_file);
  uv_loop_init(&s->loop);
  if (s->cfg.trace_out != NULL &&
      (s->trace =
           kvr_trace_out_open(s->cfg.trace_out, s->cfg.trace_out_max_bytes, s->cfg.block_chars,
                              s->cfg.trace_block_tokens, kvr_now_ns(), err, sizeof err)) == NULL) {
    fprintf(stderr, "kvrouter serve: %s\n", err);
    exit_code = 2;
    goto out_loop;
  }
  s->router = kvr_router_new(&s->cfg, err, sizeof err);
  s->curlm = s->router ? kvr_curlm_new(&s->loop) : NULL;
  s->scrape = s->curlm ? kvr_scrape_new(&s->loop, s->curlm, s->router) : NULL;
  if (s->router && s->scrape == NULL) {
    snprintf(err, sizeof err, "cannot initialize libcurl");
    kvr_curlm_close(s->curlm);
    kvr_router_free(s->router);
    s->router = NULL;
  }
  if (s->router == NULL) {
    fprintf(stderr, "kvrouter serve: %s\n", err);
    exit_code = 2;
    uv_run(&s->loop, UV_RUN_DEFAULT); /* runs the close callbacks of what was set up */
    goto out_loop;
  }
  s->kv_feed = kvr_kv_feed_new(&s->loop, s->router);
  s->peers = kvr_peers_new(&s->loop, s->curlm, s->router);
  char sync_err[256];
  s->sync = kvr_peer_sync_new(&s->loop, s->router, sync_err, sizeof sync_err);
  s->disc = kvr_discovery_new(&s->loop, s->router, &s->cfg);
  s->proxy = kvr_proxy_new(&s->loop, s->router, s->curlm);
  kvr_proxy_set_trace(s->proxy, s->trace);
  s->admin_api = kvr_admin_new(s->router, s->curlm);
  kvr_admin_set_trace(s->admin_api, s->trace);
  kvr_admin_set_proxy(s->admin_api, s->proxy);
  s->pub = kvr_http_server_new(&s->loop, &s->cfg.limits, kvr_proxy_on_request, s->proxy);
  kvr_http_limits_t admin_limits = s->cfg.limits;
  admin_limits.max_connections = 0;
  s->admin = kvr_http_server_new(&s->loop, &admin_limits, kvr_admin_on_request, s->admin_api);
  kvr_http_server_log_rejects(s->pub, s->cfg.access_log);
  kvr_http_server_reuse_port(s->pub, s->cfg.reuse_port);
  uv_signal_init(&s->loop, &s->sigint);
  uv_signal_init(&s->loop, &s->sigterm);
  uv_signal_init(&s->loop, &s->sighup);
  uv_timer_init(&s->loop, &s->grace);
  s->sigint.data = s->sigterm.data = s->sighup.data = s->grace.data = s;
  s->servers_open = 2;
  if (sync_err[0] != '\0') {
    snprintf(err, sizeof err, "%s", sync_err);
  }
  if (sync_err[0] != '\0' || kvr_http_server_listen(s->pub, s->cfg.listen, err, sizeof err) != 0 ||
      kvr_http_server_listen(s->admin, s->cfg.admin_listen, err, sizeof err) != 0) {
    fprintf(stderr, "kvrouter serve: %s\n", err);
    exit_code = 1;
    s->stopping = true;
    kvr_http_server_close(s->pub, on_server_closed, s);
    kvr_http_server_close(s->admin, on_server_closed, s);
  } else {
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sighup, on_sighup, SIGHUP);
    kvr_log_batch_start(&s->loop); /* log lines leave once per loop iteration (net/log_batch.h) */
    KVR_INFO("serve",
             "kvrouter %s listening on %s (port %d), admin on %s (port %d), policy %s, "
             "%zu workers",
             KVR_VERSION, s->cfg.listen, kvr_http_server_port(s->pub), s->cfg.admin_listen,
             kvr_http_server_port(s->admin), s->cfg.policy, s->cfg.nworkers);
  }
  uv_run(&s->loop, UV_RUN_DEFAULT);
  kvr_http_server_free(s->pub);
  kvr_http_server_free(s->admin);
  kvr_proxy_free(s->proxy);
  kvr_admin_free(s->admin_api);
out_loop:
  kvr_trace_out_close(s->trace);
  if (uv_loop_close(&s->loop) != 0) {
    KVR_ERROR("serve", "event loop closed with handles still open");
    exit_code = exit_code ? exit_code : 1;
  }
  kvr_curl_set_ca_file(NULL);
  kvr_config_free(&s->cfg);
  free(s);
  return exit_code;
}

/* procs.h -- the child processes of `kvrouter demo`: free ports, spawn, health, stop by PID.
 *
 * A kvr_proc_t is one child (a simulated worker or the router): its PID, the loopback port it
 * serves on and a name for messages. The caller owns an array of them; nothing here keeps state
 * between calls. Every child started with kvr_procs_spawn() dies with its parent (PR_SET_PDEATHSIG)
 * and ignores SIGINT, so a Ctrl-C reaches the parent only, which then stops the children in order
 * with kvr_procs_stop_all().
 */
#ifndef KVR_PROCS_H
#define KVR_PROCS_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct kvr_proc_s {
  pid_t pid;     /* > 0 while running; 0 once reaped (or never started) */
  int port;      /* the 127.0.0.1 port it serves on */
  char name[32]; /* "worker 0", "router" */
} kvr_proc_t;

typedef enum {
  KVR_PROCS_HEALTHY,     /* GET /health answered 200 */
  KVR_PROCS_EXITED,      /* the child exited first (reaped; pid is 0) */
  KVR_PROCS_TIMEOUT,     /* no 200 within the time allowed */
  KVR_PROCS_INTERRUPTED, /* *stop became non-zero */
} kvr_procs_health_t;

/* A free TCP port on 127.0.0.1 (bound and released: the child binds it right after), or -1. */
int kvr_procs_free_port(void);

/* Starts exe with args (args[0] first, NULL-terminated) as a child whose stdout and stderr go to
 * log_path (truncated), and sets p->pid. Returns 0, or KVR_EIO with one line in err. */
int kvr_procs_spawn(kvr_proc_t *p, const char *exe, char *const *args, const char *log_path,
                    char *err, size_t errlen);

/* Polls http://127.0.0.1:PORT/health every 100 ms until 200, the child exits, *stop becomes
 * non-zero (a signal handler's flag; may be NULL) or timeout_s passes. */
kvr_procs_health_t kvr_procs_wait_health(kvr_proc_t *p, double timeout_s,
                                         const volatile sig_atomic_t *stop);

/* Sends SIGTERM to every running child, SIGKILL to whatever is left after grace_ms, and reaps
 * them all: every pid is 0 on return. */
void kvr_procs_stop_all(kvr_proc_t *procs, size_t n, double grace_ms);

#endif

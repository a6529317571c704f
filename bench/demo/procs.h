/* procs.h -- the child processes of `kvrouter demo`: spawn, the ports they report, health, stop
 * by PID.
 *
 * A kvr_proc_t is one child (a simulated worker or the router): its PID, the loopback port it
 * serves on and a name for messages. The caller owns an array of them; nothing here keeps state
 * between calls. Every child started with kvr_procs_spawn() dies with its parent (PR_SET_PDEATHSIG)
 * and ignores SIGINT, so a Ctrl-C reaches the parent only, which then stops the children in order
 * with kvr_procs_stop_all().
 *
 * Ports: a child binds port 0 itself and says which port it got on its log (`kvrouter sim` and
 * `kvrouter serve` print a "listening on" line); the parent reads it back with
 * kvr_procs_wait_line() and kvr_procs_ports(). A port the parent picked and released before the
 * child bound it could be handed out again in between (to a sibling: two workers on one port).
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
  KVR_PROCS_READY,       /* GET /health answered 200, or the line waited for is in the log */
  KVR_PROCS_EXITED,      /* the child exited first (reaped; pid is 0) */
  KVR_PROCS_TIMEOUT,     /* not ready within the time allowed */
  KVR_PROCS_INTERRUPTED, /* *stop became non-zero */
} kvr_procs_wait_t;

/* Starts exe with args (args[0] first, NULL-terminated) as a child whose stdout and stderr go to
 * log_path (truncated), and sets p->pid. Returns 0, or KVR_EIO with one line in err. */
int kvr_procs_spawn(kvr_proc_t *p, const char *exe, char *const *args, const char *log_path,
                    char *err, size_t errlen);

/* Polls http://127.0.0.1:PORT/health every 100 ms until 200, the child exits, *stop becomes
 * non-zero (a signal handler's flag; may be NULL) or timeout_s passes. */
kvr_procs_wait_t kvr_procs_wait_health(kvr_proc_t *p, double timeout_s,
                                       const volatile sig_atomic_t *stop);

/* Reads the child's log (log_path, as given to kvr_procs_spawn) every 20 ms until it holds a whole
 * line (ended by a newline) containing needle, copied into line without its newline (truncated to
 * linelen - 1), or the child exits, *stop becomes non-zero (may be NULL) or timeout_s passes. Only
 * the log's first 64 KiB are searched. */
kvr_procs_wait_t kvr_procs_wait_line(kvr_proc_t *p, const char *log_path, const char *needle,
                                     char *line, size_t linelen, double timeout_s,
                                     const volatile sig_atomic_t *stop);

/* The ports written right after each occurrence of key in line, in order (key "(port " reads 41
 * from "(port 41)"): up to max of them into ports. A number that is not 1..65535 ends the search.
 * Returns how many were read. */
size_t kvr_procs_ports(const char *line, const char *key, int *ports, size_t max);

/* The CPU time of process pid (0: this process) so far, from /proc/PID/schedstat (Linux: the
 * scheduler's own accounting, its main thread): *run_s on a core, *wait_s runnable but waiting for
 * one. Returns 0, or -1 when the file cannot be read (no such process, a kernel without
 * schedstats). */
int kvr_procs_cpu(pid_t pid, double *run_s, double *wait_s);

/* The CPU time the whole machine has been busy so far, over all its cores (/proc/stat's first
 * line: every state but idle and iowait), in seconds. Returns 0, or -1 when unreadable. */
int kvr_procs_machine_busy(double *busy_s);

/* Sends SIGTERM to every running child, SIGKILL to whatever is left after grace_ms, and reaps
 * them all: every pid is 0 on return. */
void kvr_procs_stop_all(kvr_proc_t *procs, size_t n, double grace_ms);

#endif

/* procs.c -- child processes by PID: fork/exec with a log file, the lines they log (their ports),
 * health polls, stop.
 *
 * Spawn: the child sets PR_SET_PDEATHSIG (SIGTERM) and checks that its parent is still the one
 * that forked it (the parent may have died before prctl), ignores SIGINT, sends stdout and stderr
 * to the log file and execs. Lines: the log file read from its start at each poll (a child logs a
 * few lines before it listens). Health: one curl easy handle reused across polls (1 s timeout
 * each). Every wait also reaps a child that exited (waitpid WNOHANG), so an early exit ends it at
 * once. Stop: SIGTERM to all, poll waitpid(WNOHANG) every 20 ms, SIGKILL and a blocking reap after
 * the grace period.
 *
 * Invariant: a kvr_proc_t's pid is either a live child of ours or 0, so nothing is ever signalled
 * by a PID that may have been reused.
 */
#include "procs.h"

#include "base/kvr.h"
#include "net/curlm.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* In the child: die with the parent, log to the file, become exe with other argv. */
static void exec_child(pid_t parent, int logfd, const char *exe, char *const *args) {
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent)
    _exit(1);
  signal(SIGINT, SIG_IGN); /* Ctrl-C goes to the parent, which stops the children in order */
  dup2(logfd, STDOUT_FILENO);
  dup2(logfd, STDERR_FILENO);
  execv(exe, args);
  _exit(127);
}

int kvr_procs_spawn(kvr_proc_t *p, const char *exe, char *const *args, const char *log_path,
                    char *err, size_t errlen) {
  int logfd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (logfd < 0) {
    snprintf(err, errlen, "%s: %s", log_path, strerror(errno));
    return KVR_EIO;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0)
    exec_child(parent, logfd, exe, args);
  int fork_errno = errno;
  close(logfd);
  if (pid < 0) {
    snprintf(err, errlen, "fork: %s", strerror(fork_errno));
    return KVR_EIO;
  }
  p->pid = pid;
  return 0;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
  nanosleep(&ts, NULL);
}

static bool health_ok(CURL *easy) {
  long code = 0;
  return curl_easy_perform(easy) == CURLE_OK &&
         curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
}

/* True when the child has exited (it is reaped and its pid set to 0). */
static bool exited(kvr_proc_t *p) {
  int status;
  if (waitpid(p->pid, &status, WNOHANG) != p->pid)
    return false;
  p->pid = 0;
  return true;
}

kvr_procs_wait_t kvr_procs_wait_health(kvr_proc_t *p, double timeout_s,
                                       const volatile sig_atomic_t *stop) {
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/health", p->port);
  CURL *easy = kvr_curl_easy_new(url, 0, 1000L, NULL, NULL);
  double start = kvr_now_ms();
  kvr_procs_wait_t h = KVR_PROCS_TIMEOUT;
  while (h == KVR_PROCS_TIMEOUT && kvr_now_ms() - start < timeout_s * 1000) {
    if (stop != NULL && *stop)
      h = KVR_PROCS_INTERRUPTED;
    else if (health_ok(easy))
      h = KVR_PROCS_READY;
    else if (exited(p))
      h = KVR_PROCS_EXITED;
    else
      sleep_ms(100);
  }
  curl_easy_cleanup(easy);
  return h;
}

#define LOG_SCAN_MAX (64 * 1024)

/* The whole line of the log at path holding needle, into line; false when there is none yet. */
static bool find_line(const char *path, const char *needle, char *buf, char *line, size_t linelen) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return false;
  size_t n = fread(buf, 1, LOG_SCAN_MAX, f);
  fclose(f);
  buf[n] = '\0';
  const char *hit = strstr(buf, needle);
  const char *end = hit ? strchr(hit, '\n') : NULL;
  if (end == NULL)
    return false; /* not there, or its line is still being written */
  const char *begin = hit;
  while (begin > buf && begin[-1] != '\n')
    begin--;
  size_t len = KVR_MIN((size_t)(end - begin), linelen - 1);
  memcpy(line, begin, len);
  line[len] = '\0';
  return true;
}

kvr_procs_wait_t kvr_procs_wait_line(kvr_proc_t *p, const char *log_path, const char *needle,
                                     char *line, size_t linelen, double timeout_s,
                                     const volatile sig_atomic_t *stop) {
  char *buf = kvr_xmalloc(LOG_SCAN_MAX + 1);
  double start = kvr_now_ms();
  kvr_procs_wait_t w = KVR_PROCS_TIMEOUT;
  while (w == KVR_PROCS_TIMEOUT && kvr_now_ms() - start < timeout_s * 1000) {
    if (stop != NULL && *stop)
      w = KVR_PROCS_INTERRUPTED;
    else if (find_line(log_path, needle, buf, line, linelen))
      w = KVR_PROCS_READY;
    else if (exited(p))
      w = KVR_PROCS_EXITED;
    else
      sleep_ms(20);
  }
  free(buf);
  return w;
}

size_t kvr_procs_ports(const char *line, const char *key, int *ports, size_t max) {
  size_t n = 0, klen = strlen(key);
  for (const char *at = strstr(line, key); at != NULL && n < max; at = strstr(at, key)) {
    at += klen;
    char *end;
    long port = strtol(at, &end, 10);
    if (end == at || *at < '0' || *at > '9' || port < 1 || port > 65535)
      break;
    ports[n++] = (int)port;
  }
  return n;
}

/* Reaps the children that have exited; returns how many still run. */
static size_t reap(kvr_proc_t *procs, size_t n) {
  size_t alive = 0;
  for (size_t i = 0; i < n; i++) {
    if (procs[i].pid <= 0)
      continue;
    int status;
    pid_t r = waitpid(procs[i].pid, &status, WNOHANG);
    if (r == procs[i].pid || (r < 0 && errno == ECHILD))
      procs[i].pid = 0;
    else
      alive++;
  }
  return alive;
}

void kvr_procs_stop_all(kvr_proc_t *procs, size_t n, double grace_ms) {
  for (size_t i = 0; i < n; i++)
    if (procs[i].pid > 0)
      kill(procs[i].pid, SIGTERM);
  double start = kvr_now_ms();
  while (reap(procs, n) > 0 && kvr_now_ms() - start <= grace_ms)
    sleep_ms(20);
  for (size_t i = 0; i < n; i++)
    if (procs[i].pid > 0) {
      kill(procs[i].pid, SIGKILL);
      waitpid(procs[i].pid, NULL, 0);
      procs[i].pid = 0;
    }
}

int kvr_procs_cpu(pid_t pid, double *run_s, double *wait_s) {
  char path[64];
  if (pid > 0)
    snprintf(path, sizeof(path), "/proc/%ld/schedstat", (long)pid);
  else
    snprintf(path, sizeof(path), "/proc/self/schedstat");
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  unsigned long long run = 0, wait = 0;
  int n = fscanf(f, "%llu %llu", &run, &wait);
  fclose(f);
  if (n != 2)
    return -1;
  *run_s = (double)run / 1e9;
  *wait_s = (double)wait / 1e9;
  return 0;
}

int kvr_procs_machine_busy(double *busy_s) {
  FILE *f = fopen("/proc/stat", "r");
  if (f == NULL)
    return -1;
  /* cpu user nice system idle iowait irq softirq steal (guest time is inside user) */
  unsigned long long v[8] = {0};
  int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                 &v[4], &v[5], &v[6], &v[7]);
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  if (n != 8 || hz <= 0)
    return -1;
  *busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)hz;
  return 0;
}

/* test_procs.c -- the demo's child processes: free ports, spawn with a log file, health polls
 * (healthy, exited, timed out, interrupted), and stop by PID (SIGTERM, then SIGKILL after the
 * grace period for a child that ignores it), every child reaped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/kvr.h"
#include "bench/demo/procs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static char log_path[64];

static int setup(void **state) {
  (void)state;
  snprintf(log_path, sizeof(log_path), "/tmp/kvr_test_procs_%d.log", (int)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  remove(log_path);
  return 0;
}

static void spawn_sh(kvr_proc_t *p, const char *script) {
  char *args[] = {"sh", "-c", (char *)script, NULL};
  char err[256];
  memset(p, 0, sizeof(*p));
  snprintf(p->name, sizeof(p->name), "sh");
  p->port = kvr_procs_free_port();
  assert_int_equal(kvr_procs_spawn(p, "/bin/sh", args, log_path, err, sizeof(err)), 0);
  assert_true(p->pid > 0);
}

static void test_free_port(void **state) {
  (void)state;
  int port = kvr_procs_free_port();
  assert_true(port > 0 && port < 65536);
  /* It is free: we can bind it. */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  close(fd);
}

static void test_exit_and_log(void **state) {
  (void)state;
  kvr_proc_t p;
  spawn_sh(&p, "echo hello from the child");
  /* Nothing listens on its port: the poll sees the child exit. */
  assert_int_equal(kvr_procs_wait_health(&p, 10, NULL), KVR_PROCS_EXITED);
  assert_int_equal(p.pid, 0);
  FILE *f = fopen(log_path, "r");
  char line[128] = "";
  assert_non_null(f);
  assert_non_null(fgets(line, sizeof(line), f));
  fclose(f);
  assert_string_equal(line, "hello from the child\n");
  /* exec failing is an exit too (status 127) */
  char *args[] = {"nothing", NULL};
  char err[256];
  assert_int_equal(kvr_procs_spawn(&p, "/nonexistent/kvr-binary", args, log_path, err, sizeof(err)),
                   0);
  assert_int_equal(kvr_procs_wait_health(&p, 10, NULL), KVR_PROCS_EXITED);
  /* an unwritable log is an error naming it */
  assert_int_equal(kvr_procs_spawn(&p, "/bin/sh", args, "/nonexistent/dir/x.log", err, sizeof(err)),
                   KVR_EIO);
  assert_non_null(strstr(err, "/nonexistent/dir/x.log: "));
}

static void test_timeout_interrupt_and_stop(void **state) {
  (void)state;
  kvr_proc_t p;
  spawn_sh(&p, "exec sleep 30");
  double t0 = kvr_now_ms();
  assert_int_equal(kvr_procs_wait_health(&p, 0.3, NULL), KVR_PROCS_TIMEOUT);
  assert_true(kvr_now_ms() - t0 < 3000);
  volatile sig_atomic_t stop = 1;
  assert_int_equal(kvr_procs_wait_health(&p, 10, &stop), KVR_PROCS_INTERRUPTED);
  pid_t pid = p.pid;
  t0 = kvr_now_ms();
  kvr_procs_stop_all(&p, 1, 5000);
  assert_true(kvr_now_ms() - t0 < 2000); /* SIGTERM was enough */
  assert_int_equal(p.pid, 0);
  assert_int_equal(kill(pid, 0), -1); /* reaped: no such process */
}

static void test_sigkill_after_grace(void **state) {
  (void)state;
  kvr_proc_t kids[3];
  spawn_sh(&kids[0], "trap '' TERM; exec sleep 30");
  spawn_sh(&kids[1], "exec sleep 30");
  memset(&kids[2], 0, sizeof(kids[2])); /* never started: skipped */
  usleep(100 * 1000);                   /* let the trap be set before the signal */
  double t0 = kvr_now_ms();
  kvr_procs_stop_all(kids, 3, 300);
  double took = kvr_now_ms() - t0;
  assert_true(took >= 300 && took < 3000);
  assert_int_equal(kids[0].pid, 0);
  assert_int_equal(kids[1].pid, 0);
  assert_int_equal(kids[2].pid, 0);
}

/* A child answering every connection with 200: healthy at the first poll. */
static void test_healthy(void **state) {
  (void)state;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 8), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    static const char resp[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
    for (;;) {
      int c = accept(fd, NULL, NULL);
      char buf[1024];
      if (c >= 0 && read(c, buf, sizeof(buf)) > 0 && write(c, resp, sizeof(resp) - 1) < 0)
        _exit(1);
      close(c);
    }
  }
  close(fd);
  kvr_proc_t p = {.pid = pid, .port = ntohs(a.sin_port), .name = "responder"};
  assert_int_equal(kvr_procs_wait_health(&p, 10, NULL), KVR_PROCS_HEALTHY);
  assert_int_equal(p.pid, pid);
  kvr_procs_stop_all(&p, 1, 5000);
  assert_int_equal(p.pid, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_free_port),
      cmocka_unit_test(test_exit_and_log),
      cmocka_unit_test(test_timeout_interrupt_and_stop),
      cmocka_unit_test(test_sigkill_after_grace),
      cmocka_unit_test(test_healthy),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

/* test_procs.c -- the demo's child processes: spawn with a log file, the ports children report
 * (many children started at once, each binding port 0, every port read back distinct and
 * listening; lines still being written, children that exit first), health polls (healthy, exited,
 * timed out, interrupted), and stop by PID (SIGTERM, then SIGKILL after the grace period for a
 * child that ignores it), every child reaped; the CPU a process ran and waited for (schedstat).
 *
 * The listening children are this test binary run again with --listen-child (main below): it
 * binds 127.0.0.1 port 0, logs "child listening on 127.0.0.1:PORT" as `kvrouter sim` does, then
 * accepts until it is stopped. */
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
#include <stdbool.h>
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
  p->port = 1; /* nothing listens there: health polls fail until the child exits */
  assert_int_equal(kvr_procs_spawn(p, "/bin/sh", args, log_path, err, sizeof(err)), 0);
  assert_true(p->pid > 0);
}

/* This binary as a child that listens on a port of its own choosing and logs it. */
static int listen_child(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  socklen_t len = sizeof(a);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 8) != 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) != 0)
    return 1;
  usleep((useconds_t)(getpid() % 7) * 10000); /* children report in any order */
  printf("a first line\nchild listening on 127.0.0.1:%d (pid %d)\n", ntohs(a.sin_port),
         (int)getpid());
  fflush(stdout);
  for (;;) {
    int c = accept(fd, NULL, NULL);
    if (c >= 0)
      close(c);
  }
}

static bool connects(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

#define NKIDS 24

/* Many children started at once, each on the port the kernel gave it: the ports read back from
 * their logs are all different and each is the child's (the demo once picked ports itself and
 * released them before its children bound them: two workers got one port). */
static void test_ports_reported_by_children(void **state) {
  (void)state;
  kvr_proc_t kids[NKIDS];
  char logs[NKIDS][64], err[256];
  char *args[] = {"test_procs", "--listen-child", NULL};
  memset(kids, 0, sizeof(kids));
  for (int i = 0; i < NKIDS; i++) {
    snprintf(logs[i], sizeof(logs[i]), "/tmp/kvr_test_procs_%d_%d.log", (int)getpid(), i);
    snprintf(kids[i].name, sizeof(kids[i].name), "child %d", i);
    assert_int_equal(kvr_procs_spawn(&kids[i], "/proc/self/exe", args, logs[i], err, sizeof(err)),
                     0);
  }
  for (int i = 0; i < NKIDS; i++) {
    char line[128], want[64];
    assert_int_equal(
        kvr_procs_wait_line(&kids[i], logs[i], "child listening on ", line, sizeof(line), 10, NULL),
        KVR_PROCS_READY);
    snprintf(want, sizeof(want), "(pid %d)", (int)kids[i].pid);
    assert_non_null(strstr(line, want)); /* this child's own line, without its newline */
    assert_int_equal(kvr_procs_ports(line, "127.0.0.1:", &kids[i].port, 1), 1);
    for (int j = 0; j < i; j++)
      assert_int_not_equal(kids[i].port, kids[j].port);
  }
  for (int i = 0; i < NKIDS; i++) {
    assert_true(connects(kids[i].port));
    assert_true(kids[i].pid > 0); /* still running: it did bind its port */
  }
  kvr_procs_stop_all(kids, NKIDS, 5000);
  for (int i = 0; i < NKIDS; i++)
    remove(logs[i]);
}

/* A line not yet ended, or never written: wait_line waits, then sees the child exit or times out.
 */
static void test_wait_line_exit_timeout_stop(void **state) {
  (void)state;
  kvr_proc_t p;
  char line[64] = "unchanged";
  spawn_sh(&p, "printf 'listening on 127.0.0.1:5'; sleep 0.3; printf '5 (done)\\n'; exec sleep 30");
  assert_int_equal(kvr_procs_wait_line(&p, log_path, "listening on ", line, 16, 10, NULL),
                   KVR_PROCS_READY);
  assert_string_equal(line, "listening on 12"); /* truncated to the buffer given */
  assert_int_equal(kvr_procs_wait_line(&p, log_path, "nowhere", line, sizeof(line), 0.2, NULL),
                   KVR_PROCS_TIMEOUT);
  volatile sig_atomic_t stop = 1;
  assert_int_equal(kvr_procs_wait_line(&p, log_path, "nowhere", line, sizeof(line), 10, &stop),
                   KVR_PROCS_INTERRUPTED);
  kvr_procs_stop_all(&p, 1, 5000);
  spawn_sh(&p, "echo starting; exit 3");
  assert_int_equal(kvr_procs_wait_line(&p, log_path, "listening on ", line, sizeof(line), 10, NULL),
                   KVR_PROCS_EXITED);
  assert_int_equal(p.pid, 0);
}

static void test_ports_parse(void **state) {
  (void)state;
  int ports[3] = {0};
  const char *serve = "2026-11-29T06:14:32.104Z info serve: kvrouter 0.1.0 listening on "
                      "127.0.0.1:0 (port 32833), admin on 127.0.0.1:0 (port 41325), policy x";
  assert_int_equal(kvr_procs_ports(serve, "(port ", ports, 3), 2);
  assert_int_equal(ports[0], 32833);
  assert_int_equal(ports[1], 41325);
  assert_int_equal(kvr_procs_ports(serve, "(port ", ports, 1), 1);
  assert_int_equal(
      kvr_procs_ports("sim listening on 127.0.0.1:39743 model=m", "127.0.0.1:", ports, 3), 1);
  assert_int_equal(ports[0], 39743);
  assert_int_equal(kvr_procs_ports("on 127.0.0.1:0 (port 0)", "(port ", ports, 3), 0);
  assert_int_equal(kvr_procs_ports("(port 70000)", "(port ", ports, 3), 0);
  assert_int_equal(kvr_procs_ports("(port -5) (port +5)", "(port ", ports, 3), 0);
  assert_int_equal(kvr_procs_ports("no port here", "(port ", ports, 3), 0);
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
  assert_int_equal(kvr_procs_wait_health(&p, 10, NULL), KVR_PROCS_READY);
  assert_int_equal(p.pid, pid);
  kvr_procs_stop_all(&p, 1, 5000);
  assert_int_equal(p.pid, 0);
}

/* kvr_procs_cpu: this process's run time grows with work done; a child's is read by PID; a PID
 * that is gone is -1. kvr_procs_machine_busy reads and does not go back. */
static void test_cpu(void **state) {
  (void)state;
  double run0, wait0, run1, wait1, busy0, busy1;
  assert_int_equal(kvr_procs_machine_busy(&busy0), 0);
  assert_int_equal(kvr_procs_cpu(0, &run0, &wait0), 0);
  volatile uint64_t x = 1;
  for (uint64_t i = 0; i < 50000000u; i++) /* about 50 ms of work, bounded */
    x = x * 6364136223846793005u + i;
  assert_int_equal(kvr_procs_cpu(0, &run1, &wait1), 0);
  assert_true(run1 > run0);
  assert_int_equal(kvr_procs_machine_busy(&busy1), 0);
  assert_true(busy1 >= busy0 && busy0 > 0); /* the machine was busy at least while we were */
  assert_true(wait0 >= 0 && wait1 >= wait0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    pause();
    _exit(0);
  }
  double run, wait;
  assert_int_equal(kvr_procs_cpu(pid, &run, &wait), 0);
  assert_true(run >= 0 && wait >= 0);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  assert_int_equal(kvr_procs_cpu(pid, &run, &wait), -1); /* reaped: no /proc entry */
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--listen-child") == 0)
    return listen_child();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ports_reported_by_children),
      cmocka_unit_test(test_wait_line_exit_timeout_stop),
      cmocka_unit_test(test_ports_parse),
      cmocka_unit_test(test_exit_and_log),
      cmocka_unit_test(test_timeout_interrupt_and_stop),
      cmocka_unit_test(test_sigkill_after_grace),
      cmocka_unit_test(test_healthy),
      cmocka_unit_test(test_cpu),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}

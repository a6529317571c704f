/* demo.c -- `kvrouter demo`: a whole A/B on one machine, started and stopped by one command.
 *
 * Structs: child_t is one child process (a simulated worker or the router): its PID, port, role and
 * log file. The demo owns an array of them and nothing else.
 *
 * Flow: pick free loopback ports -> fork/exec `kvrouter sim --time-scale N` per worker and
 * `kvrouter serve` in front of them (this very binary, /proc/self/exe; output to OUT/logs/) ->
 * poll each /health -> kvr_bench_main(--ab round_robin,kv_aware ...) in this process -> SIGTERM
 * every child by PID, SIGKILL after a grace period, reap -> the bench printed the summary.
 *
 * Invariants: every child started is stopped before kvr_demo_main() returns, on every path. The
 * children also get PR_SET_PDEATHSIG, so they go away even if the demo itself is killed. Ctrl-C
 * while the children start aborts the start; during the benchmark it stops the current level (the
 * bench writes a partial report), and then the children are stopped as usual.
 */

#include "commands.h"

#include "src/kvr.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 16

typedef struct child_s {
  pid_t pid;
  int port;
  char name[32];
} child_t;

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
  (void)sig;
  g_interrupted = 1;
}

static void install_handler(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

/* A free TCP port on 127.0.0.1 (bound and released; the child binds it right after). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int spawn(child_t *c, const char *exe, char **args, const char *log_path) {
  int logfd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (logfd < 0) {
    fprintf(stderr, "kvrouter demo: %s: %s\n", log_path, strerror(errno));
    return KVR_EIO;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(logfd);
    return KVR_EIO;
  }
  if (pid == 0) {
    /* Child: die with the demo, log to the file, become the same binary with other argv. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent)
      _exit(1);
    signal(SIGINT, SIG_IGN); /* Ctrl-C goes to the demo, which stops the children in order */
    dup2(logfd, STDOUT_FILENO);
    dup2(logfd, STDERR_FILENO);
    execv(exe, args);
    _exit(127);
  }
  close(logfd);
  c->pid = pid;
  return 0;
}

static size_t discard(char *ptr, size_t size, size_t nmemb, void *data) {
  (void)ptr;
  (void)data;
  return size * nmemb;
}

/* Polls http://127.0.0.1:PORT/health until 200, the child exits, Ctrl-C or timeout_s. */
static bool wait_health(const child_t *c, double timeout_s) {
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/health", c->port);
  CURL *easy = curl_easy_init();
  if (easy == NULL)
    return false;
  curl_easy_setopt(easy, CURLOPT_URL, url);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, 1000L);
  double start = kvr_now_ms();
  bool ok = false;
  while (!g_interrupted && kvr_now_ms() - start < timeout_s * 1000) {
    long code = 0;
    if (curl_easy_perform(easy) == CURLE_OK &&
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200) {
      ok = true;
      break;
    }
    int status;
    if (waitpid(c->pid, &status, WNOHANG) == c->pid) {
      fprintf(stderr, "kvrouter demo: %s exited during start-up (see its log)\n", c->name);
      ((child_t *)c)->pid = 0;
      break;
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  curl_easy_cleanup(easy);
  return ok;
}

/* SIGTERM every child, SIGKILL whatever is left after 5 s, reap all. */
static void stop_all(child_t *kids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (kids[i].pid > 0)
      kill(kids[i].pid, SIGTERM);
  double start = kvr_now_ms();
  for (;;) {
    size_t alive = 0;
    for (size_t i = 0; i < n; i++) {
      if (kids[i].pid <= 0)
        continue;
      int status;
      pid_t r = waitpid(kids[i].pid, &status, WNOHANG);
      if (r == kids[i].pid || (r < 0 && errno == ECHILD))
        kids[i].pid = 0;
      else
        alive++;
    }
    if (alive == 0)
      break;
    if (kvr_now_ms() - start > 5000) {
      for (size_t i = 0; i < n; i++)
        if (kids[i].pid > 0) {
          kill(kids[i].pid, SIGKILL);
          waitpid(kids[i].pid, NULL, 0);
          kids[i].pid = 0;
        }
      break;
    }
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static void usage(FILE *f) {
  fputs("usage: kvrouter demo [--quick] [--out DIR] [--workers N] [--time-scale N] [--seed N]\n"
        "                     [--workload W] [--ab LIST] [--labels LIST] [-- BENCH-OPTIONS...]\n"
        "\n"
        "Starts N (4) simulated vLLM workers and the router on 127.0.0.1, runs the round-robin\n"
        "(phase0) vs KV-aware (phase3) A/B on the multiturn workload with the simulators' clock\n"
        "sped up, writes the report into DIR (results/demo), prints the max SLO-compliant rate\n"
        "per phase and the gain, and stops everything it started (also on Ctrl-C).\n"
        "\n"
        "  --quick          a short run (three rates, 60 prompts each) for CI: under a minute\n"
        "  --out DIR        results folder (default results/demo)\n"
        "  --workers N      simulated workers (default 4)\n"
        "  --time-scale N   simulator speed-up (default 10; 20 with --quick)\n"
        "  --seed N         workload seed (default 42)\n"
        "  --workload W     bench workload (default multiturn, session mode: answers resent)\n"
        "  --ab LIST        policies to compare (default round_robin,kv_aware)\n"
        "  --labels LIST    their labels (default phase0,phase3 for two policies)\n"
        "  -- OPTIONS       everything after -- goes to kvrouter bench after the demo's own\n"
        "                   options (later options win), e.g. -- --num-prompts 100\n",
        f);
}

int kvr_demo_main(int argc, char **argv) {
  bool quick = false;
  const char *out = "results/demo";
  long workers = 4;
  double scale = 0;
  const char *seed = "42";
  const char *workload = "multiturn", *ab = "round_robin,kv_aware", *labels = NULL;
  int extra = argc; /* argv[extra..] go to the bench */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    char *end = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--quick") == 0) {
      quick = true;
    } else if (strcmp(a, "--") == 0) {
      extra = i + 1;
      break;
    } else if (strcmp(a, "--workload") == 0 && v) {
      workload = v;
      i++;
    } else if (strcmp(a, "--ab") == 0 && v) {
      ab = v;
      i++;
    } else if (strcmp(a, "--labels") == 0 && v) {
      labels = v;
      i++;
    } else if (strcmp(a, "--out") == 0 && v) {
      out = v;
      i++;
    } else if (strcmp(a, "--workers") == 0 && v) {
      workers = strtol(v, &end, 10);
      if (*end || workers < 1 || workers > MAX_WORKERS) {
        fprintf(stderr, "kvrouter demo: --workers must be 1..%d\n", MAX_WORKERS);
        return 2;
      }
      i++;
    } else if (strcmp(a, "--time-scale") == 0 && v) {
      scale = strtod(v, &end);
      if (*end || !(scale > 0)) {
        fprintf(stderr, "kvrouter demo: --time-scale must be > 0\n");
        return 2;
      }
      i++;
    } else if (strcmp(a, "--seed") == 0 && v) {
      strtoull(v, &end, 10);
      if (*end || *v == '-') {
        fprintf(stderr, "kvrouter demo: --seed must be a non-negative integer\n");
        return 2;
      }
      seed = v;
      i++;
    } else {
      fprintf(stderr, "kvrouter demo: unknown option or missing value '%s' (see --help)\n", a);
      return 2;
    }
  }
  if (scale == 0)
    scale = quick ? 20 : 10;
  if (argc - extra > 32) {
    fprintf(stderr, "kvrouter demo: at most 32 options after --\n");
    return 2;
  }

  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) {
    fprintf(stderr, "kvrouter demo: cannot find my own binary: %s\n", strerror(errno));
    return 1;
  }
  exe[n] = '\0';
  char logs[4096];
  snprintf(logs, sizeof(logs), "%s/logs", out);
  char cmd[4300];
  snprintf(cmd, sizeof(cmd), "%s", out);
  for (char *p = cmd + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(cmd, 0755);
      *p = '/';
    }
  mkdir(out, 0755);
  if (mkdir(logs, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "kvrouter demo: %s: %s\n", logs, strerror(errno));
    return 1;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  g_interrupted = 0;
  install_handler();

  child_t kids[MAX_WORKERS + 1];
  memset(kids, 0, sizeof(kids));
  size_t nkids = 0;
  int rc = 0;
  char scale_s[32], log_path[4200];
  snprintf(scale_s, sizeof(scale_s), "%g", scale);

  /* Workers. */
  for (long w = 0; w < workers && rc == 0; w++) {
    child_t *c = &kids[nkids];
    c->port = free_port();
    snprintf(c->name, sizeof(c->name), "worker %ld", w);
    char listen[64], seed_s[32];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", c->port);
    snprintf(seed_s, sizeof(seed_s), "%ld", w);
    char *args[] = {exe,     "sim",    "--listen", listen, "--time-scale",
                    scale_s, "--seed", seed_s,     NULL};
    snprintf(log_path, sizeof(log_path), "%s/worker-%ld.log", logs, w);
    if (c->port < 0 || spawn(c, exe, args, log_path) != 0) {
      rc = 1;
      break;
    }
    fprintf(stderr, "kvrouter demo: started %s pid %d on 127.0.0.1:%d\n", c->name, (int)c->pid,
            c->port);
    nkids++;
  }
  /* Router. */
  int admin_port = free_port();
  if (rc == 0) {
    child_t *c = &kids[nkids];
    c->port = free_port();
    snprintf(c->name, sizeof(c->name), "router");
    char listen[64], admin[64], worker_urls[MAX_WORKERS][64];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", c->port);
    snprintf(admin, sizeof(admin), "127.0.0.1:%d", admin_port);
    char *args[2 * MAX_WORKERS + 16];
    size_t k = 0;
    args[k++] = exe;
    args[k++] = "serve";
    for (size_t w = 0; w < nkids; w++) {
      snprintf(worker_urls[w], sizeof(worker_urls[w]), "http://127.0.0.1:%d", kids[w].port);
      args[k++] = "--worker";
      args[k++] = worker_urls[w];
    }
    args[k++] = "--listen";
    args[k++] = listen;
    args[k++] = "--admin-listen";
    args[k++] = admin;
    args[k++] = "--policy";
    args[k++] = "round_robin";
    args[k++] = "--access-log";
    args[k++] = "false";
    /* The simulators run time_scale times faster than real time, so the router's default 1 s
     * scrape would see metrics 4-10 simulated seconds old. 100 ms keeps them within about one
     * simulated second at scale 10; the GIE endpoint picker refreshes every 50 ms by default, so
     * gie_scorer is not judged on metrics older than its own deployments see. */
    args[k++] = "--scrape-interval-ms";
    args[k++] = "100";
    args[k] = NULL;
    snprintf(log_path, sizeof(log_path), "%s/router.log", logs);
    if (c->port < 0 || admin_port < 0 || spawn(c, exe, args, log_path) != 0) {
      rc = 1;
    } else {
      fprintf(stderr, "kvrouter demo: started router pid %d on 127.0.0.1:%d (admin %d)\n",
              (int)c->pid, c->port, admin_port);
      nkids++;
    }
  }
  for (size_t i = 0; i < nkids && rc == 0; i++)
    if (!wait_health(&kids[i], 15)) {
      if (!g_interrupted)
        fprintf(stderr, "kvrouter demo: %s on port %d never became healthy (logs in %s)\n",
                kids[i].name, kids[i].port, logs);
      rc = g_interrupted ? 130 : 1;
    }

  if (rc == 0 && !g_interrupted) {
    char url[64], admin_url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", kids[nkids - 1].port);
    snprintf(admin_url, sizeof(admin_url), "http://127.0.0.1:%d", admin_port);
    char *bargs[96];
    int k = 0;
    bargs[k++] = "bench";
    bargs[k++] = "--url";
    bargs[k++] = url;
    bargs[k++] = "--admin";
    bargs[k++] = admin_url;
    bargs[k++] = "--ab";
    bargs[k++] = (char *)ab;
    if (labels) {
      bargs[k++] = "--labels";
      bargs[k++] = (char *)labels;
    }
    bargs[k++] = "--workload";
    bargs[k++] = (char *)workload;
    bargs[k++] = "--time-scale";
    bargs[k++] = scale_s;
    bargs[k++] = "--seed";
    bargs[k++] = (char *)seed;
    bargs[k++] = "--out";
    bargs[k++] = (char *)out;
    bargs[k++] = "--title";
    bargs[k++] = quick ? "kvrouter demo (quick): round-robin vs KV-aware routing"
                       : "kvrouter demo: round-robin vs KV-aware routing";
    bool own_load = false; /* the caller's --rates/--concurrency replace the search */
    for (int i = extra; i < argc; i++)
      own_load |= strcmp(argv[i], "--rates") == 0 || strcmp(argv[i], "--concurrency") == 0;
    if (strcmp(workload, "multiturn") == 0) {
      /* The multiturn: every turn resends the answer actually streamed back. */
      bargs[k++] = "--multiturn-mode";
      bargs[k++] = "session";
    }
    if (quick) {
      /* Three paired rates: enough for every table of the report, well under a minute. */
      bargs[k++] = "--rates";
      bargs[k++] = "4,8,12";
      bargs[k++] = "--num-prompts";
      bargs[k++] = "60";
      bargs[k++] = "--cooldown-s";
      bargs[k++] = "5";
    } else {
      /* The max-SLO-rate search per phase, paired at the baseline's max rate. */
      if (!own_load)
        bargs[k++] = "--search";
      bargs[k++] = "--search-start";
      bargs[k++] = "6";
      /* Levels must outlast a response (~35 s simulated) several times or they measure a burst,
       * not a capacity; multi-turn sessions (5 turns of ~36 s) also need ~2 minutes to reach
       * their steady turn mix: 120 s of warm-up, then at least 60 s (200 prompts) measured. */
      bargs[k++] = "--num-prompts";
      bargs[k++] = "200";
      bargs[k++] = "--warmup-s";
      bargs[k++] = "120";
      bargs[k++] = "--min-level-s";
      bargs[k++] = "60";
      /* 0.5 req/s (~5% of the max rates here) keeps the whole demo under 5 minutes on 2 cores:
       * at 0.25 it took 303 s (15 levels), each further bisection step costs ~20 s. */
      bargs[k++] = "--search-resolution";
      bargs[k++] = "0.5";
      bargs[k++] = "--cooldown-s";
      bargs[k++] = "10";
    }
    for (int i = extra; i < argc; i++)
      bargs[k++] = argv[i];
    bargs[k] = NULL;
    fprintf(stderr, "kvrouter demo: running the A/B (simulated time x%s)\n", scale_s);
    rc = kvr_bench_main(k, bargs);
    install_handler(); /* libuv restored the default handlers when the bench closed its own */
    if (g_interrupted && rc == 0)
      rc = 130;
  }
  fprintf(stderr, "kvrouter demo: stopping %zu processes\n", nkids);
  stop_all(kids, nkids);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (rc == 0)
    printf("Demo done: report in %s/report.md, charts in %s/report.html\n", out, out);
  return rc;
}

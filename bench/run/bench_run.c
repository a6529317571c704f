/* bench_run.c -- one `kvrouter bench` run from its settings to its report (bench_run.h): the
 * private loop, the stop flag, the exit status; the same run from a command line; the study's
 * cells.
 *
 * Structs: bench_t is one run: its loop, its runner, the caller's io, the timer that reads the
 * stop flag, and where the last error goes.
 *
 * Flow: kvr_bench_run(): loop -> kvr_runner_new() -> [poll timer on io->stop] -> kvr_runner_run()
 * -> kvr_runner_report() -> results handed over -> runner freed -> loop closed. A signal handler
 * may do nothing but set a flag, so the flag is read on the loop, every 50 ms by a timer that does
 * not keep the loop alive, and a set flag interrupts the runner as libuv's own signal watcher would
 * (virtual time never runs the loop: its runs are not interruptible, the caller leaves the default
 * action). kvr_bench_run_argv() and the study's run_cell() only build the settings first: from
 * argv through the bench's table, or from the cell's struct with the person's extra flags on top.
 */
#include "bench_run.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "bench/report/report.h"
#include "bench_options.h"
#include "runner.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define POLL_MS 50

typedef struct bench_s {
  uv_loop_t loop;
  kvr_runner_t *r;
  const kvr_bench_io_t *io;
  uv_timer_t poll;
  char *err;
  size_t errlen;
} bench_t;

/* The error of the run so far: into err, and as a line on io->errors. */
static void fail(bench_t *b, const char *what) {
  snprintf(b->err, b->errlen, "%s", what);
  if (b->io->errors != NULL)
    fprintf(b->io->errors, "kvrouter bench: %s\n", what);
}

static void check_stop(bench_t *b) {
  int sig = (int)*b->io->stop;
  if (sig == 0 || kvr_runner_interrupted(b->r))
    return;
  if (b->io->errors != NULL)
    fprintf(b->io->errors, "\nkvrouter bench: signal %d, stopping (a partial report is written)\n",
            sig);
  kvr_runner_interrupt(b->r);
}

static void on_poll(uv_timer_t *t) {
  check_stop(t->data);
}

/* The labels and the report; the exit status. */
static int run_labels(bench_t *b) {
  bool poll = b->io->stop != NULL && !kvr_runner_virtual(b->r);
  if (poll) {
    uv_timer_init(&b->loop, &b->poll);
    b->poll.data = b;
    uv_timer_start(&b->poll, on_poll, POLL_MS, POLL_MS);
    uv_unref((uv_handle_t *)&b->poll);
    check_stop(b);
  }
  char e[512];
  int status = 0;
  if (kvr_runner_run(b->r, e, sizeof(e)) != 0) {
    fail(b, e);
    status = 1;
  }
  if (kvr_runner_interrupted(b->r))
    status = 130;
  FILE *devnull = b->io->summary ? NULL : fopen("/dev/null", "w");
  FILE *sum = b->io->summary ? b->io->summary : devnull ? devnull : stdout;
  if (kvr_runner_report(b->r, sum, e, sizeof(e)) != 0) {
    fail(b, e);
    status = status ? status : 1;
  }
  if (devnull != NULL)
    fclose(devnull);
  if (poll)
    uv_close((uv_handle_t *)&b->poll, NULL);
  uv_run(&b->loop, UV_RUN_DEFAULT);
  return status;
}

int kvr_bench_run(kvr_runner_opts_t *o, const kvr_bench_io_t *io, kvr_results_t **results,
                  char *err, size_t errlen) {
  bench_t b = {.io = io, .err = err, .errlen = errlen};
  if (results != NULL)
    *results = NULL;
  uv_loop_init(&b.loop);
  char e[512];
  int rc = kvr_runner_new(&b.loop, o, &b.r, e, sizeof(e));
  int status = rc == 0 ? 0 : rc == KVR_EINVAL ? 2 : 1;
  if (rc != 0)
    fail(&b, e);
  else
    status = run_labels(&b);
  if (b.r != NULL && results != NULL)
    *results = kvr_runner_take_results(b.r);
  kvr_runner_free(b.r);
  uv_run(&b.loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&b.loop) != 0 && io->errors != NULL)
    fprintf(io->errors, "kvrouter bench: warning: loop handles left open\n");
  return status;
}

/* The command line as the report shows it: pasted back into a shell, it runs the same bench. */
static char *command_line(int argc, char **argv) {
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_shell_join(argc, argv, &b);
  return kvr_buf_steal(&b);
}

/* A rejected command line: status 2, "kvrouter bench: WHY" in err and on io->errors. */
static int reject(const kvr_bench_io_t *io, const char *why, char *err, size_t errlen) {
  snprintf(err, errlen, "kvrouter bench: %s", why);
  if (io->errors != NULL)
    fprintf(io->errors, "%s\n", err);
  return 2;
}

int kvr_bench_run_argv(int argc, char **argv, const kvr_bench_io_t *io, kvr_results_t **results,
                       char *err, size_t errlen) {
  if (results != NULL)
    *results = NULL;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  char e[512];
  int status;
  if (kvr_bench_options_parse(&o, argc, argv, e, sizeof(e)) != 0 ||
      kvr_runner_opts_check(&o, e, sizeof(e)) != 0) {
    status = reject(io, e, err, errlen);
  } else {
    o.lg.progress = o.quiet ? NULL : io->progress;
    o.lg.progress_tty = io->progress != NULL && isatty(fileno(io->progress));
    char *cmd = command_line(argc, argv);
    o.command = cmd;
    status = kvr_bench_run(&o, io, results, err, errlen);
    free(cmd);
  }
  kvr_bench_options_free(&o);
  return status;
}

/* ---- the study's cells ---- */

/* One cell (kvr_study_run_fn): its settings from the struct, the person's flags after -- on top,
 * the rules, then the run, quietly. */
static int run_cell(const kvr_study_cell_t *c, kvr_results_t **out, char *err, size_t errlen) {
  *out = NULL;
  kvr_runner_opts_t o;
  kvr_runner_opts_default(&o);
  kvr_study_cell_opts(c, &o);
  kvr_study_words_t w;
  kvr_study_cell_words(c, &w);
  char **extra = kvr_xcalloc((size_t)c->nextra + 2, sizeof(char *));
  extra[0] = "bench";
  memcpy(extra + 1, c->extra, (size_t)c->nextra * sizeof(char *));
  kvr_bench_io_t io = {0};
  char e[512];
  int status;
  if (kvr_bench_options_parse(&o, c->nextra + 1, extra, e, sizeof(e)) != 0 ||
      kvr_runner_opts_check(&o, e, sizeof(e)) != 0) {
    status = reject(&io, e, err, errlen);
  } else {
    char *cmd = command_line(w.argc, w.argv);
    o.command = cmd;
    o.lg.progress = NULL;
    status = kvr_bench_run(&o, &io, out, err, errlen);
    free(cmd);
  }
  free(extra);
  kvr_bench_options_free(&o);
  return status;
}

int kvr_bench_run_study(const kvr_study_opts_t *o, FILE *out, kvr_study_summary_t *sum, char *err,
                        size_t errlen) {
  return kvr_study_run(o, run_cell, out, sum, err, errlen);
}

/* test_log_batch.c -- the access log written once per loop iteration (net/log_batch.c): lines
 * held until the loop is about to wait, in order, nothing lost; the prepare handle never keeps the
 * loop alive and closes with the loop. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/src/base/log_test_util.h"
#include "tests/test_util.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "net/log_batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

static void on_tick(uv_timer_t *t) {
  (void)t;
}

/* Runs one loop iteration that does not block: a due timer keeps the loop alive for it, the
 * prepare handle runs before the (non-blocking) poll. */
static void one_iteration(uv_loop_t *loop, uv_timer_t *t) {
  uv_timer_start(t, on_tick, 0, 0);
  uv_run(loop, UV_RUN_NOWAIT);
}

/* Batching: info lines wait for the loop's prepare, then leave together in order; a warn line
 * writes what waited before it and itself at once; 64 KiB waiting is written without the loop;
 * stop writes the rest and closes the handle so the loop closes; the handle never keeps the loop
 * alive. */
static void test_batching_on_a_loop(void **state) {
  (void)state;
  FILE *f = log_to_tmpfile();
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  uv_timer_t tick;
  uv_timer_init(&loop, &tick);
  kvr_log_batch_start(&loop);
  kvr_log_batch_start(&loop); /* a second start is a no-op */

  KVR_INFO("access", "request 1");
  KVR_INFO("access", "request 2");
  char *text = stream_text(f);
  assert_string_equal(text, ""); /* held */
  free(text);
  one_iteration(&loop, &tick);
  text = stream_text(f);
  assert_int_equal(count_lines(text, "\n"), 2);
  assert_in_order(text, " info access: request 1\n", " info access: request 2\n");
  free(text);

  /* A warn line does not wait, and what waited before it leaves first. */
  KVR_INFO("access", "request 3");
  KVR_WARN("proxy", "worker 1 is down");
  text = stream_text(f);
  assert_in_order(text, "request 3\n", " warn proxy: worker 1 is down\n");
  assert_int_equal(count_lines(text, "\n"), 4);
  free(text);

  /* 64 KiB waiting is written without the loop running; no line is cut. */
  char filler[1000];
  memset(filler, 'x', sizeof filler - 1);
  filler[sizeof filler - 1] = '\0';
  size_t n = 0;
  do {
    KVR_INFO("access", "%zu %s", n, filler);
    n++;
    text = stream_text(f);
    size_t written = count_lines(text, filler);
    free(text);
    if (written > 0) {
      assert_true(n >= 60 && n <= 70); /* ~1,040 bytes a line: the 64 KiB mark */
      assert_int_equal(written, n);
      break;
    }
  } while (n < 200);
  assert_true(n < 200);

  /* Stop writes what waits, closes the handle; the loop then closes. */
  KVR_INFO("access", "last one");
  kvr_log_batch_stop();
  kvr_log_batch_stop(); /* a second stop is a no-op */
  text = stream_text(f);
  assert_non_null(strstr(text, " info access: last one\n"));
  free(text);
  KVR_INFO("access", "after stop"); /* written at once again */
  text = stream_text(f);
  assert_non_null(strstr(text, " info access: after stop\n"));
  free(text);
  uv_close((uv_handle_t *)&tick, NULL);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);

  /* Started again on a loop with nothing else: uv_run returns at once (the handle is unref'd). */
  assert_int_equal(uv_loop_init(&loop), 0);
  kvr_log_batch_start(&loop);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  kvr_log_batch_stop();
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
  kvr_log_set_stream(NULL);
  fclose(f);
}

KVR_TEST_MAIN(cmocka_unit_test(test_batching_on_a_loop))

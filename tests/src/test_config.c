/* test_config.c -- `serve` settings: flags, JSON file, precedence, and one-line errors naming the
 * offending flag or JSON path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "src/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(kvr_config_t *cfg, char *err, size_t errlen, int argc, char **argv) {
  kvr_config_init(cfg);
  FILE *devnull = fopen("/dev/null", "w");
  int rc = kvr_config_parse_args(cfg, argc, argv, devnull, err, errlen);
  fclose(devnull);
  return rc;
}

static void test_flags(void **state) {
  (void)state;
  char err[512];
  kvr_config_t cfg;
  char *argv[] = {"serve",           "--worker",    "http://127.0.0.1:9001/", "--worker=http://h:2",
                  "--policy",        "round_robin", "--max-body-bytes",       "1024",
                  "--worker-header", "false",       "--policy-params",        "{}"};
  assert_int_equal(parse(&cfg, err, sizeof err, 12, argv), 0);
  assert_int_equal(cfg.nworkers, 2);
  assert_string_equal(cfg.workers[0], "http://127.0.0.1:9001");
  assert_string_equal(cfg.policy, "round_robin");
  assert_int_equal(cfg.limits.max_body, 1024);
  assert_false(cfg.worker_header);
  assert_non_null(cfg.policy_params);
  kvr_config_free(&cfg);
}

/* The defaults come from the option table (the texts --help prints). */
static void test_defaults(void **state) {
  (void)state;
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  assert_string_equal(cfg.listen, "0.0.0.0:8000");
  assert_string_equal(cfg.admin_listen, "127.0.0.1:8001");
  assert_string_equal(cfg.policy, "kv_aware");
  assert_string_equal(cfg.log_level, "info");
  assert_int_equal(cfg.connect_timeout_ms, 2000);
  assert_int_equal(cfg.first_byte_timeout_ms, 300000);
  assert_int_equal(cfg.limits.header_timeout_ms, 10000);
  assert_int_equal(cfg.limits.max_body, 8388608);
  assert_int_equal(cfg.response_buffer_max, 16u << 20);
  assert_int_equal(cfg.cache_capacity_blocks, 21766);
  assert_true(cfg.worker_header);
  assert_true(cfg.access_log);
  assert_int_equal(cfg.nworkers, 0);
  kvr_config_free(&cfg);
  /* --help prints the same texts. */
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len);
  kvr_config_usage(mem);
  fclose(mem);
  assert_non_null(strstr(text, "300000"));
  assert_non_null(strstr(text, "21766"));
  free(text);
}

static void expect_error(const char *needle, int argc, char **argv) {
  char err[512] = "";
  kvr_config_t cfg;
  assert_true(parse(&cfg, err, sizeof err, argc, argv) < 0);
  if (strstr(err, needle) == NULL)
    fail_msg("error '%s' does not mention '%s'", err, needle);
  assert_null(strchr(err, '\n'));
  kvr_config_free(&cfg);
}

static void test_errors(void **state) {
  (void)state;
  char *a1[] = {"serve", "--bogus", "1", "--worker", "http://a:1"};
  expect_error("--bogus", 5, a1);
  char *a2[] = {"serve", "--worker", "ftp://a:1"};
  expect_error("http://", 3, a2);
  char *a3[] = {"serve", "--worker", "http://a:1", "--policy", "nope"};
  expect_error("round_robin", 5, a3);
  char *a4[] = {"serve", "--worker", "http://a:1", "--max-body-bytes", "-5"};
  expect_error("--max-body-bytes", 5, a4);
  char *a5[] = {"serve"};
  expect_error("--worker", 1, a5);
  char *a6[] = {"serve", "--worker", "http://a:1", "--listen", "nohost"};
  expect_error("--listen", 5, a6);
  char *a7[] = {"serve", "--worker", "http://a:1/v1"};
  expect_error("no path", 3, a7);
  char *a8[] = {"serve",       "--worker",       "http://a:1", "--listen",
                "127.0.0.1:9", "--admin-listen", "127.0.0.1:9"};
  expect_error("--admin-listen", 7, a8);
  char *a9[] = {"serve", "--worker"};
  expect_error("missing value", 2, a9);
  char *a10[] = {"serve", "--config", "/nonexistent/kvr.json", "--worker", "http://a:1"};
  expect_error("--config: cannot open '/nonexistent/kvr.json'", 5, a10);
}

static void test_json_and_precedence(void **state) {
  (void)state;
  const char *path = "/tmp/kvr_test_config.json";
  FILE *f = fopen(path, "w");
  fputs("{\"workers\":[\"http://127.0.0.1:1\",\"http://127.0.0.1:2\"],\"policy\":\"least_load\","
        "\"timeouts\":{\"first_byte_ms\":1234},\"cache\":{\"block_chars\":32},"
        "\"worker_header\":false}",
        f);
  fclose(f);
  char err[512];
  kvr_config_t cfg;
  char *argv[] = {"serve", "--policy", "kv_aware", "--config", (char *)path};
  assert_int_equal(parse(&cfg, err, sizeof err, 5, argv), 0);
  assert_int_equal(cfg.nworkers, 2);
  assert_string_equal(cfg.policy, "kv_aware"); /* the flag wins over the file */
  assert_int_equal(cfg.first_byte_timeout_ms, 1234);
  assert_int_equal(cfg.block_chars, 32);
  assert_false(cfg.worker_header);
  kvr_config_free(&cfg);

  kvr_config_init(&cfg);
  const char *bad = "{\"timeouts\":{\"first_byte\":5}}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad, strlen(bad), "c.json", err, sizeof err), 0);
  assert_non_null(strstr(err, "c.json: timeouts.first_byte: unknown setting"));
  const char *bad2 = "{\"timeouts\":{\"first_byte_ms\":\"x\"}}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad2, strlen(bad2), "c.json", err, sizeof err),
                       0);
  assert_non_null(strstr(err, "timeouts.first_byte_ms"));
  const char *bad3 = "{\"workers\":[\"http://ok:1\", 5]}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad3, strlen(bad3), "c.json", err, sizeof err),
                       0);
  assert_non_null(strstr(err, "workers[1]"));
  assert_int_not_equal(kvr_config_apply_json(&cfg, "[1]", 3, "c.json", err, sizeof err), 0);
  kvr_config_free(&cfg);
  remove(path);
}

/* `serve` parses through the shared option engine: --version, the one wording, JSON keys and
 * their flags validated alike. */
static void test_engine_wording(void **state) {
  (void)state;
  char err[512] = "";
  kvr_config_t cfg;
  char *v[] = {"serve", "--bogus", "--version"};
  assert_int_equal(parse(&cfg, err, sizeof err, 3, v), 1);
  kvr_config_free(&cfg);
  char *a1[] = {"serve", "--bogus", "--worker", "http://a:1"};
  expect_error("--bogus: unknown option (see kvrouter serve --help)", 4, a1);
  char *a2[] = {"serve", "--worker", "http://a:1", "--max-body-bytes", "lots"};
  expect_error("--max-body-bytes: 'lots' is not a non-negative integer", 5, a2);
  char *a3[] = {"serve", "--worker", "http://a:1", "--access-log=maybe"};
  expect_error("--access-log: 'maybe' is not true or false", 4, a3);
  char *a4[] = {"serve", "--worker", "http://a:1", "stray"};
  expect_error("'stray': unexpected argument", 4, a4);
  kvr_config_init(&cfg);
  const char *bad = "{\"log_level\": \"loud\"}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad, strlen(bad), "c.json", err, sizeof err), 0);
  assert_string_equal(err, "c.json: log_level: 'loud' is not one of debug, info, warn, error, off");
  const char *bad2 = "{\"listen\": \"nowhere\"}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad2, strlen(bad2), "c.json", err, sizeof err),
                       0);
  assert_string_equal(err, "c.json: listen: 'nowhere' is not HOST:PORT");
  kvr_config_free(&cfg);
}

/* Workers on the command line replace the file's list; repeated --worker flags add to it. */
static void test_cli_workers_replace_file(void **state) {
  (void)state;
  const char *path = "/tmp/kvr_test_config_workers.json";
  FILE *f = fopen(path, "w");
  fputs("{\"workers\":[\"http://127.0.0.1:1\",\"http://127.0.0.1:2\"]}", f);
  fclose(f);
  char err[512];
  kvr_config_t cfg;
  char *argv[] = {"serve",      "--worker", "http://h:3", "--config",
                  (char *)path, "--worker", "http://h:4"};
  assert_int_equal(parse(&cfg, err, sizeof err, 7, argv), 0);
  assert_int_equal(cfg.nworkers, 2);
  assert_string_equal(cfg.workers[0], "http://h:3");
  assert_string_equal(cfg.workers[1], "http://h:4");
  kvr_config_free(&cfg);
  remove(path);
}

KVR_TEST_MAIN(cmocka_unit_test(test_defaults), cmocka_unit_test(test_flags),
              cmocka_unit_test(test_errors), cmocka_unit_test(test_json_and_precedence),
              cmocka_unit_test(test_engine_wording),
              cmocka_unit_test(test_cli_workers_replace_file))

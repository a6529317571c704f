/* test_config.c -- `serve` settings: flags, JSON file, precedence, and one-line errors naming the
 * offending flag or JSON path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "core/config.h"

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
  assert_string_equal(cfg.log_format, "text");
  assert_int_equal(cfg.shutdown_grace_ms, 10000);
  assert_int_equal(cfg.connect_timeout_ms, 2000);
  assert_int_equal(cfg.first_byte_timeout_ms, 300000);
  assert_int_equal(cfg.limits.header_timeout_ms, 10000);
  assert_int_equal(cfg.limits.body_timeout_ms, 60000);
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
        "\"timeouts\":{\"first_byte_ms\":1234,\"client_body_ms\":777},"
        "\"cache\":{\"block_chars\":32},"
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
  assert_int_equal(cfg.limits.body_timeout_ms, 777);
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

/* --lora-adapter in vLLM's --lora-modules forms (NAME=PATH, a JSON object with an optional
 * base_model_name), the JSON file's "lora_adapters" (strings or objects, replaced by the first
 * flag), and one line for each bad spec. */
static void test_lora_adapters(void **state) {
  (void)state;
  char err[512];
  kvr_config_t cfg;
  char *argv[] = {"serve",
                  "--worker",
                  "http://h:1",
                  "--lora-adapter",
                  "sql=/adapters/sql",
                  "--lora-adapter",
                  "{\"name\":\"chat\",\"path\":\"s3://b/chat\",\"base_model_name\":\"llama\"}"};
  assert_int_equal(parse(&cfg, err, sizeof err, 7, argv), 0);
  assert_int_equal(cfg.nlora_adapters, 2);
  assert_string_equal(cfg.lora_adapters[0].name, "sql");
  assert_string_equal(cfg.lora_adapters[0].path, "/adapters/sql");
  assert_null(cfg.lora_adapters[0].base);
  assert_string_equal(cfg.lora_adapters[1].name, "chat");
  assert_string_equal(cfg.lora_adapters[1].path, "s3://b/chat");
  assert_string_equal(cfg.lora_adapters[1].base, "llama");
  kvr_config_free(&cfg);
  const char *path = "/tmp/kvr_test_config_lora.json";
  FILE *f = fopen(path, "w");
  fputs("{\"workers\":[\"http://127.0.0.1:1\"],\"lora_adapters\":[\"a=/p/a\","
        "{\"name\":\"b\",\"path\":\"/p/b\"}]}",
        f);
  fclose(f);
  char *file_only[] = {"serve", "--config", (char *)path};
  assert_int_equal(parse(&cfg, err, sizeof err, 3, file_only), 0);
  assert_int_equal(cfg.nlora_adapters, 2);
  assert_string_equal(cfg.lora_adapters[1].path, "/p/b");
  kvr_config_free(&cfg);
  char *replaced[] = {"serve", "--config", (char *)path, "--lora-adapter", "c=/p/c"};
  assert_int_equal(parse(&cfg, err, sizeof err, 5, replaced), 0);
  assert_int_equal(cfg.nlora_adapters, 1);
  assert_string_equal(cfg.lora_adapters[0].name, "c");
  kvr_config_free(&cfg);
  remove(path);
  static const struct {
    const char *spec, *needle;
  } bad[] = {
      {"noequals", "want NAME=PATH"},
      {"a=/p,b=/q", "want NAME=PATH"},
      {"=/p", "needs a name and a path"},
      {"a=", "needs a name and a path"},
      {"{\"name\":\"a\"}", "needs a name and a path"},
      {"{\"name\":\"a\",\"path\":\"/p\",\"rank\":8}", "unknown key"},
      {"{\"name\":1,\"path\":\"/p\"}", "non-string"},
      {"{not json", "not a JSON object"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    char *one[] = {"serve", "--worker", "http://h:1", "--lora-adapter", (char *)bad[i].spec};
    assert_int_not_equal(parse(&cfg, err, sizeof err, 5, one), 0);
    if (strstr(err, bad[i].needle) == NULL)
      fail_msg("'%s': '%s' lacks '%s'", bad[i].spec, err, bad[i].needle);
    kvr_config_free(&cfg);
  }
  char *twice[] = {"serve", "--worker",       "http://h:1", "--lora-adapter",
                   "a=/p",  "--lora-adapter", "a=/q"};
  assert_int_not_equal(parse(&cfg, err, sizeof err, 7, twice), 0);
  assert_non_null(strstr(err, "listed twice"));
  kvr_config_free(&cfg);
}

/* Worker URLs go through libcurl's URL parser: bad ports, no host, user info, query, fragment and
 * paths are refused with one line naming the URL; https:// is accepted; the form is normalized. */
static void test_worker_url_check(void **state) {
  (void)state;
  static const struct {
    const char *url, *norm;
  } good[] = {
      {"http://127.0.0.1:9001", "http://127.0.0.1:9001"},
      {"http://127.0.0.1:9001/", "http://127.0.0.1:9001"},
      {"http://h:2//", "http://h:2"},
      {"https://vllm.example:8443/", "https://vllm.example:8443"},
      {"https://vllm.example", "https://vllm.example"},
      {"http://[::1]:9001", "http://[::1]:9001"},
      {"http://localhost", "http://localhost"},
      {"HTTP://h:3", "http://h:3"},
      /* An IPv6 zone id names the interface: kept, not dropped (fe80::1 on eth0 and on eth1 are
       * two endpoints). */
      {"http://[fe80::1%25eth0]:9001", "http://[fe80::1%25eth0]:9001"},
  };
  static const struct {
    const char *url, *needle;
  } bad[] = {
      {"http://h:abc", "port"},
      {"http://h:99999", "port"},
      {"http://h:0", "port"},
      {"http://h:", "port"},
      {"http://:80", "host"},
      {"http:///", "host"},
      {"http://u:p@h:1", "user"},
      {"http://u@h:1", "user"},
      {"http://h:1?x=1", "query"},
      {"http://h:1#frag", "fragment"},
      {"http://h:1/v1", "no path"},
      {"ftp://h:1", "http://"},
      {"h:1", "http://"},
      {"http://h 1:2", "invalid character"},
      {"", "http://"},
      /* Issue 37: "http:///x" was taken as http://x; "127.0.0.1." beside "127.0.0.1" made one
       * endpoint two workers. */
      {"http:///x", "no host"},
      {"http:///x:8000", "no host"},
      {"http://127.0.0.1.:8000", "dot"},
      {"http://vllm.example.:8000", "dot"},
  };
  char out[512], err[512];
  for (size_t i = 0; i < KVR_ARRAY_SIZE(good); i++) {
    err[0] = '\0';
    if (kvr_url_worker(good[i].url, out, sizeof out, err, sizeof err) != 0)
      fail_msg("'%s' refused: %s", good[i].url, err);
    assert_string_equal(out, good[i].norm);
  }
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    err[0] = '\0';
    if (kvr_url_worker(bad[i].url, out, sizeof out, err, sizeof err) == 0)
      fail_msg("'%s' accepted as '%s'", bad[i].url, out);
    if (strstr(err, bad[i].needle) == NULL || strchr(err, '\n') != NULL)
      fail_msg("error for '%s' is '%s', expected one line with '%s'", bad[i].url, err,
               bad[i].needle);
  }
  /* The same check guards the command line. */
  char *a1[] = {"serve", "--worker", "http://h:99999"};
  expect_error("--worker: worker URL 'http://h:99999'", 3, a1);
}

/* A config file that is not JSON is reported with the line and column where parsing stopped. */
static void test_json_syntax_error_position(void **state) {
  (void)state;
  char err[512];
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  const char *doc = "{\n  \"workers\": [\n    \"http://a:1\",\n  ]\n}\n";
  assert_int_not_equal(kvr_config_apply_json(&cfg, doc, strlen(doc), "c.json", err, sizeof err), 0);
  assert_string_equal(err, "c.json: line 4, column 3: invalid JSON");
  const char *doc2 = "{\"policy\": kv_aware}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, doc2, strlen(doc2), "c.json", err, sizeof err),
                       0);
  assert_string_equal(err, "c.json: line 1, column 12: invalid JSON");
  const char *doc3 = "";
  assert_int_not_equal(kvr_config_apply_json(&cfg, doc3, 0, "c.json", err, sizeof err), 0);
  assert_non_null(strstr(err, "c.json: line 1, column 1"));
  /* Valid JSON that is not an object keeps its own wording. */
  assert_int_not_equal(kvr_config_apply_json(&cfg, "[1]", 3, "c.json", err, sizeof err), 0);
  assert_string_equal(err, "c.json: not a JSON object");
  kvr_config_free(&cfg);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* --admin-token-file: one token, whitespace around it stripped; empty, short, unreadable or
 * multi-word files are refused naming the flag. */
static void test_admin_token_file(void **state) {
  (void)state;
  const char *path = "/tmp/kvr_test_admin_token";
  char err[512];
  kvr_config_t cfg;
  char *argv[] = {"serve", "--worker", "http://a:1", "--admin-token-file", (char *)path};

  write_file(path, "  s3cret-token-0123456789\r\n\n");
  assert_int_equal(parse(&cfg, err, sizeof err, 5, argv), 0);
  assert_string_equal(cfg.admin_token, "s3cret-token-0123456789");
  assert_false(cfg.admin_open_reads);
  kvr_config_free(&cfg);

  char *open_reads[] = {"serve",      "--worker",
                        "http://a:1", "--admin-token-file",
                        (char *)path, "--admin-open-reads=true"};
  assert_int_equal(parse(&cfg, err, sizeof err, 6, open_reads), 0);
  assert_true(cfg.admin_open_reads);
  kvr_config_free(&cfg);

  write_file(path, "");
  expect_error("--admin-token-file: '/tmp/kvr_test_admin_token' is empty", 5, argv);
  write_file(path, " \n\n");
  expect_error("--admin-token-file: '/tmp/kvr_test_admin_token' is empty", 5, argv);
  write_file(path, "short-token\n");
  expect_error("--admin-token-file: the token in '/tmp/kvr_test_admin_token' is 11 characters, "
               "shorter than 16",
               5, argv);
  write_file(path, "two words-0123456789\n");
  expect_error("--admin-token-file", 5, argv);
  remove(path);
  expect_error("--admin-token-file: cannot open '/tmp/kvr_test_admin_token'", 5, argv);

  /* Without the flag there is no token: the admin API is open as before. */
  char *none[] = {"serve", "--worker", "http://a:1"};
  assert_int_equal(parse(&cfg, err, sizeof err, 3, none), 0);
  assert_null(cfg.admin_token);
  assert_true(kvr_config_admin_on_loopback(&cfg));
  kvr_config_free(&cfg);
  char *wide[] = {"serve", "--worker", "http://a:1", "--admin-listen", "0.0.0.0:8001"};
  assert_int_equal(parse(&cfg, err, sizeof err, 5, wide), 0);
  assert_false(kvr_config_admin_on_loopback(&cfg));
  kvr_config_free(&cfg);
  char *v6[] = {"serve", "--worker", "http://a:1", "--admin-listen", "[::1]:8001"};
  assert_int_equal(parse(&cfg, err, sizeof err, 5, v6), 0);
  assert_true(kvr_config_admin_on_loopback(&cfg));
  kvr_config_free(&cfg);
}

/* --log-format text|json and --shutdown-grace-ms 0..3600000, as flags and as JSON keys. */
static void test_log_format_and_shutdown_grace(void **state) {
  (void)state;
  char err[512] = "";
  kvr_config_t cfg;
  char *ok[] = {"serve", "--worker", "http://a:1", "--log-format", "json", "--shutdown-grace-ms",
                "0"};
  assert_int_equal(parse(&cfg, err, sizeof err, 7, ok), 0);
  assert_string_equal(cfg.log_format, "json");
  assert_int_equal(cfg.shutdown_grace_ms, 0);
  kvr_config_free(&cfg);
  char *max[] = {"serve", "--worker", "http://a:1", "--log-format=text",
                 "--shutdown-grace-ms=3600000"};
  assert_int_equal(parse(&cfg, err, sizeof err, 5, max), 0);
  assert_string_equal(cfg.log_format, "text");
  assert_int_equal(cfg.shutdown_grace_ms, 3600000);
  kvr_config_free(&cfg);

  char *b1[] = {"serve", "--worker", "http://a:1", "--log-format", "xml"};
  expect_error("--log-format: 'xml' is not one of text, json", 5, b1);
  char *b2[] = {"serve", "--worker", "http://a:1", "--log-format", ""};
  expect_error("--log-format", 5, b2);
  char *b3[] = {"serve", "--worker", "http://a:1", "--shutdown-grace-ms", "3600001"};
  expect_error("--shutdown-grace-ms: '3600001'", 5, b3);
  char *b4[] = {"serve", "--worker", "http://a:1", "--shutdown-grace-ms", "-1"};
  expect_error("--shutdown-grace-ms", 5, b4);
  char *b5[] = {"serve", "--worker", "http://a:1", "--shutdown-grace-ms", "soon"};
  expect_error("--shutdown-grace-ms: 'soon'", 5, b5);

  kvr_config_init(&cfg);
  const char *js = "{\"log_format\": \"json\", \"shutdown_grace_ms\": 2500}";
  assert_int_equal(kvr_config_apply_json(&cfg, js, strlen(js), "c.json", err, sizeof err), 0);
  assert_string_equal(cfg.log_format, "json");
  assert_int_equal(cfg.shutdown_grace_ms, 2500);
  const char *bad = "{\"log_format\": \"yaml\"}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad, strlen(bad), "c.json", err, sizeof err), 0);
  assert_string_equal(err, "c.json: log_format: 'yaml' is not one of text, json");
  const char *bad2 = "{\"shutdown_grace_ms\": 4000000}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad2, strlen(bad2), "c.json", err, sizeof err),
                       0);
  assert_non_null(strstr(err, "c.json: shutdown_grace_ms:"));
  kvr_config_free(&cfg);
}

/* Issue 18's keys: outlier ejection, retry budget, admission bound; flags and JSON paths agree. */
static void test_reliability_keys(void **state) {
  (void)state;
  char err[512] = "";
  kvr_config_t cfg;
  kvr_config_init(&cfg);
  assert_int_equal(cfg.outlier_consecutive, 5);
  assert_int_equal(cfg.outlier_base_ejection_ms, 30000);
  assert_int_equal(cfg.outlier_max_ejection_ms, 300000);
  assert_int_equal(cfg.outlier_max_percent, 50);
  assert_int_equal(cfg.retry_budget_percent, 20);
  assert_int_equal(cfg.retry_min_concurrency, 3);
  assert_int_equal(cfg.admission_max_inflight, 0); /* off by default */
  assert_int_equal(cfg.admission_queue_limit, 256);
  assert_int_equal(cfg.admission_max_wait_ms, 10000);
  kvr_config_free(&cfg);
  char *ok[] = {"serve",
                "--worker",
                "http://a:1",
                "--outlier-consecutive-failures=2",
                "--outlier-base-ejection-ms=500",
                "--outlier-max-ejection-ms=4000",
                "--outlier-max-ejection-percent=100",
                "--retry-budget-percent=10",
                "--retry-min-concurrency=1",
                "--admission-max-inflight=8",
                "--admission-queue-limit=0",
                "--admission-max-wait-ms=250"};
  assert_int_equal(parse(&cfg, err, sizeof err, 12, ok), 0);
  assert_int_equal(cfg.outlier_consecutive, 2);
  assert_int_equal(cfg.outlier_base_ejection_ms, 500);
  assert_int_equal(cfg.outlier_max_ejection_ms, 4000);
  assert_int_equal(cfg.outlier_max_percent, 100);
  assert_int_equal(cfg.retry_budget_percent, 10);
  assert_int_equal(cfg.retry_min_concurrency, 1);
  assert_int_equal(cfg.admission_max_inflight, 8);
  assert_int_equal(cfg.admission_queue_limit, 0);
  assert_int_equal(cfg.admission_max_wait_ms, 250);
  kvr_config_free(&cfg);
  char *b1[] = {"serve", "--worker", "http://a:1", "--outlier-max-ejection-percent", "101"};
  expect_error("--outlier-max-ejection-percent: '101'", 5, b1);
  char *b2[] = {"serve", "--worker", "http://a:1", "--outlier-base-ejection-ms=9000",
                "--outlier-max-ejection-ms=8000"};
  expect_error("--outlier-max-ejection-ms: must be >= --outlier-base-ejection-ms (9000)", 5, b2);
  char *b3[] = {"serve", "--worker", "http://a:1", "--admission-max-wait-ms", "0"};
  expect_error("--admission-max-wait-ms: '0'", 5, b3);
  char *b4[] = {"serve", "--worker", "http://a:1", "--retry-budget-percent", "x"};
  expect_error("--retry-budget-percent: 'x'", 5, b4);

  kvr_config_init(&cfg);
  const char *js = "{\"outlier\": {\"consecutive_failures\": 7, \"base_ejection_ms\": 100, "
                   "\"max_ejection_ms\": 200, \"max_ejection_percent\": 25}, \"retry\": "
                   "{\"budget_percent\": 50, \"min_concurrency\": 0}, \"admission\": "
                   "{\"max_inflight\": 4, \"queue_limit\": 16, \"max_wait_ms\": 1000}}";
  assert_int_equal(kvr_config_apply_json(&cfg, js, strlen(js), "c.json", err, sizeof err), 0);
  assert_int_equal(cfg.outlier_consecutive, 7);
  assert_int_equal(cfg.outlier_base_ejection_ms, 100);
  assert_int_equal(cfg.outlier_max_ejection_ms, 200);
  assert_int_equal(cfg.outlier_max_percent, 25);
  assert_int_equal(cfg.retry_budget_percent, 50);
  assert_int_equal(cfg.retry_min_concurrency, 0);
  assert_int_equal(cfg.admission_max_inflight, 4);
  assert_int_equal(cfg.admission_queue_limit, 16);
  assert_int_equal(cfg.admission_max_wait_ms, 1000);
  const char *bad = "{\"admission\": {\"max_inflight\": -1}}";
  assert_int_not_equal(kvr_config_apply_json(&cfg, bad, strlen(bad), "c.json", err, sizeof err), 0);
  assert_non_null(strstr(err, "c.json: admission.max_inflight:"));
  kvr_config_free(&cfg);
}

/* Data-parallel workers (issue 35): dp_size=N on --worker, "dp_size" in the file's objects,
 * --discover-dp-size; every rank's KV-event port must exist; the ranks count against the bound. */
static void test_dp_size(void **state) {
  (void)state;
  char err[512];
  kvr_config_t cfg;
  char *ok[] = {"serve",
                "--worker",
                "http://h:8000,dp_size=4,kv_events=tcp://h:5557",
                "--worker",
                "http://g:8000",
                "--discover",
                "http://vllm:8000",
                "--discover-dp-size",
                "2"};
  assert_int_equal(parse(&cfg, err, sizeof err, 9, ok), 0);
  assert_int_equal(cfg.nworkers, 2);
  assert_int_equal(cfg.worker_dp_size[0], 4);
  assert_int_equal(cfg.worker_dp_size[1], 0);
  assert_string_equal(cfg.worker_kv_events[0], "tcp://h:5557");
  assert_int_equal(cfg.discover_dp_size, 2);
  kvr_config_free(&cfg);

  const char *json = "{\"workers\": [{\"url\": \"http://h:8000\", \"dp_size\": 8, "
                     "\"kv_events\": \"ipc:///tmp/ev\"}, \"http://g:1\"]}";
  kvr_config_init(&cfg);
  assert_int_equal(kvr_config_apply_json(&cfg, json, strlen(json), "t.json", err, sizeof err), 0);
  assert_int_equal(cfg.nworkers, 2);
  assert_int_equal(cfg.worker_dp_size[0], 8);
  assert_int_equal(cfg.worker_dp_size[1], 0);
  kvr_config_free(&cfg);

  static const struct {
    const char *spec, *want;
  } bad[] = {
      {"http://h:1,dp_size=0", "dp_size '0' must be 1..256"},
      {"http://h:1,dp_size=257", "dp_size '257' must be 1..256"},
      {"http://h:1,dp_size=2x", "dp_size '2x' must be 1..256"},
      {"http://h:1,dp_size=-1", "dp_size '-1' must be 1..256"},
      {"http://h:1,dp_size=2,dp_size=2", "unknown or repeated option 'dp_size=2'"},
      {"http://h:1,dp_size=4,kv_events=tcp://h:65533", "rank 3 would publish on port 65536"},
      {"{\"url\": \"http://h:1\", \"dp_size\": \"2\"}", "wrong type for \"dp_size\""},
      {"{\"url\": \"http://h:1\", \"dp_size\": 1.5}", "dp_size must be 1..256"},
      {"{\"url\": \"http://h:1\", \"dp_size\": 0}", "dp_size '0' must be 1..256"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    kvr_config_init(&cfg);
    err[0] = '\0';
    assert_int_not_equal(kvr_config_add_worker_spec(&cfg, bad[i].spec, err, sizeof err), 0);
    if (strstr(err, bad[i].want) == NULL)
      fail_msg("%s: '%s' lacks '%s'", bad[i].spec, err, bad[i].want);
    assert_int_equal(cfg.nworkers, 0);
    kvr_config_free(&cfg);
  }
  char *zero[] = {"serve", "--worker", "http://h:1", "--discover-dp-size", "0"};
  assert_int_not_equal(parse(&cfg, err, sizeof err, 5, zero), 0);
  assert_non_null(strstr(err, "--discover-dp-size"));
  kvr_config_free(&cfg);
  char *port[] = {"serve", "--discover",         "http://v:1", "--discover-kv-events-port",
                  "65535", "--discover-dp-size", "2"};
  assert_int_not_equal(parse(&cfg, err, sizeof err, 7, port), 0);
  assert_non_null(strstr(err, "--discover-dp-size: rank 1's KV-event port would pass 65535"));
  kvr_config_free(&cfg);

  /* 17 servers of 256 ranks are 4,352 workers: over the bound, refused before any is added. */
  kvr_config_init(&cfg);
  for (int i = 0; i < 17; i++) {
    char spec[64];
    snprintf(spec, sizeof spec, "http://h%d:1,dp_size=256", i);
    assert_int_equal(kvr_config_add_worker_spec(&cfg, spec, err, sizeof err), 0);
  }
  assert_int_equal(kvr_config_validate(&cfg, err, sizeof err), KVR_ELIMIT);
  assert_non_null(strstr(err, "makes 4352 (data-parallel ranks counted)"));
  kvr_config_free(&cfg);
}

KVR_TEST_MAIN(cmocka_unit_test(test_defaults), cmocka_unit_test(test_dp_size),
              cmocka_unit_test(test_flags), cmocka_unit_test(test_errors),
              cmocka_unit_test(test_json_and_precedence), cmocka_unit_test(test_engine_wording),
              cmocka_unit_test(test_cli_workers_replace_file), cmocka_unit_test(test_lora_adapters),
              cmocka_unit_test(test_worker_url_check),
              cmocka_unit_test(test_json_syntax_error_position),
              cmocka_unit_test(test_admin_token_file), cmocka_unit_test(test_reliability_keys),
              cmocka_unit_test(test_log_format_and_shutdown_grace))

/* test_cli.c -- the option engine (src/base/cli.h): every kind of value with its range, unknown
 * flags, missing values, switches, lists and repeated custom options, "--" passthrough, config-file
 * options applied first, --help with defaults read from the settings, --version, JSON documents
 * through the same setters, and the one-line "--flag: what is wrong" wording. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/cli.h"
#include "base/kvr.h"
#include "kvr_commit.h" /* generated at build time */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { COLOR_RED, COLOR_GREEN, COLOR_BLUE } color_t;

typedef struct settings_s {
  const char *name;
  char *owned;
  int64_t delta;
  int8_t small;
  uint32_t count;
  uint64_t big;
  size_t size;
  double ratio;
  bool on;
  bool verbose;
  int mode; /* -1 default, 0 off, 1 on */
  color_t color;
  const char *level;
  double rates[4];
  size_t nrates;
  unsigned users[3];
  size_t nusers;
  char *tags[3];
  size_t ntags;
  char seen[128]; /* what custom() saw: "nth:text;" per call */
  int file_loaded;
} settings_t;

static int custom(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                  size_t errlen) {
  settings_t *s = base;
  (void)o;
  if (strcmp(text, "bad") == 0) {
    snprintf(err, errlen, "'%s' is not good", text);
    return KVR_EINVAL;
  }
  size_t n = strlen(s->seen);
  snprintf(s->seen + n, sizeof(s->seen) - n, "%u:%s;", nth, text);
  return 0;
}

static void show_custom(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  (void)o;
  (void)base;
  snprintf(buf, len, "shown");
}

/* An "early" option: records the order in which it was applied relative to --count. */
static int load_file(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth, char *err,
                     size_t errlen) {
  settings_t *s = base;
  (void)o;
  (void)nth;
  (void)err;
  (void)errlen;
  s->file_loaded = 1;
  s->count = (uint32_t)atoi(text); /* flags given anywhere must override this */
  return 0;
}

#define F(field) KVR_CLI_FIELD(settings_t, field)

static const char *const colors[] = {"red", "green", "blue", NULL};
static const char *const levels[] = {"low", "high", NULL};

static const kvr_cli_opt_t opts[] = {
    KVR_CLI_HEADING("Basics"),
    {KVR_CLI_STR, "name", F(name), .arg = "NAME", .help = "a name", .json = "name"},
    {KVR_CLI_STR, "owned", F(owned), .flags = KVR_CLI_OWNED | KVR_CLI_NONEMPTY, .help = "owned",
     .json = "owned"},
    {KVR_CLI_INT, "delta", F(delta), KVR_CLI_RANGE(-10, 10), .help = "a signed delta",
     .json = "numbers.delta"},
    {KVR_CLI_INT, "small", F(small), .help = "an int8"},
    {KVR_CLI_UINT, "count", F(count), KVR_CLI_RANGE(1, 64), .help = "a count",
     .json = "numbers.count"},
    {KVR_CLI_UINT, "big", F(big), .help = "a u64"},
    {KVR_CLI_UINT, "size", F(size), .help = "a size_t"},
    {KVR_CLI_DOUBLE, "ratio", F(ratio), KVR_CLI_GT(0), KVR_CLI_MAX(1), .help = "a ratio",
     .json = "numbers.ratio"},
    {KVR_CLI_BOOL, "on", F(on), .help = "a bool", .json = "on"},
    KVR_CLI_HEADING("More"),
    {KVR_CLI_SWITCH, "verbose", F(verbose), .set = 1, .help = "a switch"},
    {KVR_CLI_SWITCH, "mode", F(mode), .set = 1, .help = "mode on"},
    {KVR_CLI_SWITCH, "no-mode", F(mode), .set = 0, .help = "mode off"},
    {KVR_CLI_ENUM, "color", F(color), .names = colors, .help = "a color", .json = "color"},
    {KVR_CLI_STR, "level", F(level), .names = levels, .help = "a level"},
    {KVR_CLI_LIST, "rates", KVR_CLI_ARRAY(settings_t, rates, nrates), .elem = KVR_CLI_DOUBLE,
     KVR_CLI_GT(0), .help = "rates", .json = "rates"},
    {KVR_CLI_LIST, "users", KVR_CLI_ARRAY(settings_t, users, nusers), .elem = KVR_CLI_UINT,
     KVR_CLI_RANGE(1, 100), .help = "users"},
    {KVR_CLI_LIST, "tags", KVR_CLI_ARRAY(settings_t, tags, ntags), .elem = KVR_CLI_STR,
     .help = "tags"},
    {KVR_CLI_CUSTOM, "custom", .arg = "X", .parse = custom, .show = show_custom,
     .flags = KVR_CLI_JSON_LIST, .json = "customs", .help = "a custom repeatable option"},
    {KVR_CLI_CUSTOM, "raw", .parse = custom, .flags = KVR_CLI_JSON_RAW, .json = "raw",
     .help = "a custom option taking JSON"},
    {KVR_CLI_CUSTOM, "file", .arg = "N", .parse = load_file, .flags = KVR_CLI_EARLY,
     .help = "applied before every other option"},
    {KVR_CLI_DOUBLE, "hidden", F(ratio), .flags = KVR_CLI_NODEFAULT,
     .help = "a long help text that goes on and on so that it has to be wrapped over more than "
             "one line of the terminal, at one hundred columns at most"},
};

static void epilog(FILE *out) {
  fputs("the epilog\n", out);
}

static const kvr_cli_cmd_t cmd = {
    .name = "test",
    .usage = "[options]",
    .about = "A test command.",
    .opts = opts,
    .nopts = KVR_ARRAY_SIZE(opts),
    .epilog = epilog,
};

static void init(settings_t *s) {
  memset(s, 0, sizeof(*s));
  s->name = "alpha";
  s->count = 5;
  s->ratio = 0.5;
  s->on = true;
  s->mode = -1;
  s->color = COLOR_GREEN;
  s->level = "low";
  s->rates[0] = 1.5;
  s->rates[1] = 2;
  s->nrates = 2;
}

/* Parses argv (NULL-terminated, argv[0] included) into s; captures out and err. */
static int parse(settings_t *s, char *out, size_t outlen, char *err, size_t errlen,
                 const char *const *args) {
  char *argv[64];
  int argc = 0;
  for (; args[argc] != NULL; argc++)
    argv[argc] = (char *)args[argc];
  argv[argc] = NULL;
  FILE *f = fmemopen(out, outlen, "w");
  err[0] = '\0';
  int rc = kvr_cli_parse(&cmd, s, argc, argv, NULL, f, err, errlen);
  fclose(f);
  return rc;
}

static void expect_error(const char *want, const char *const *args) {
  settings_t s;
  char out[8192] = "", err[512];
  init(&s);
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), args), KVR_EINVAL);
  if (strcmp(err, want) != 0)
    fail_msg("error '%s', want '%s'", err, want);
  assert_null(strchr(err, '\n'));
  kvr_cli_free(&cmd, &s);
}

/* A command line (NULL-terminated) and the one error it must be refused with. */
typedef struct {
  const char *args[8];
  const char *want;
} error_case_t;

static void test_kinds(void **state) {
  (void)state;
  settings_t s;
  char out[8192] = "", err[512];
  init(&s);
  const char *args[] = {"test",         "--name",    "beta",
                        "--owned=x",    "--owned",   "y",
                        "--delta",      "-7",        "--small",
                        "-128",         "--count",   "64",
                        "--big",        "184467440", "--size=12",
                        "--ratio",      "1",         "--on",
                        "off",          "--verbose", "--no-mode",
                        "--color",      "blue",      "--level",
                        "high",         "--big",     "18446744073709551615",
                        "--ratio=0.25", NULL};
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), args), 0);
  assert_string_equal(s.name, "beta");
  assert_string_equal(s.owned, "y"); /* the last wins; the first copy was freed */
  assert_int_equal(s.delta, -7);
  assert_int_equal(s.small, -128);
  assert_int_equal(s.count, 64);
  assert_true(s.big == UINT64_MAX);
  assert_int_equal(s.size, 12);
  assert_true(s.ratio == 0.25);
  assert_false(s.on);
  assert_true(s.verbose);
  assert_int_equal(s.mode, 0);
  assert_int_equal(s.color, COLOR_BLUE);
  assert_string_equal(s.level, "high");
  assert_string_equal(out, "");
  kvr_cli_free(&cmd, &s);
  assert_null(s.owned);
}

static void expect_errors(const error_case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++)
    expect_error(cases[i].want, cases[i].args);
}

static void test_ranges_and_values(void **state) {
  (void)state;
  static const error_case_t cases[] = {
      {{"test", "--count", "0", NULL}, "--count: '0' must be in [1, 64]"},
      {{"test", "--count", "65", NULL}, "--count: '65' must be in [1, 64]"},
      {{"test", "--count", "-1", NULL}, "--count: '-1' is not a non-negative integer"},
      {{"test", "--count", "1.5", NULL}, "--count: '1.5' is not a non-negative integer"},
      {{"test", "--ratio", "0", NULL}, "--ratio: '0' must be in (0, 1]"},
      {{"test", "--ratio", "nan", NULL}, "--ratio: 'nan' is not a finite number"},
      {{"test", "--ratio=", NULL}, "--ratio: '' is not a finite number"},
      {{"test", "--delta", "11", NULL}, "--delta: '11' must be in [-10, 10]"},
      {{"test", "--small", "128", NULL}, "--small: '128' must be in [-128, 127]"},
      {{"test", "--delta", "--", NULL}, "--delta: '--' is not an integer"},
      {{"test", "--big", "18446744073709551616", NULL},
       "--big: '18446744073709551616' is not a non-negative integer"},
      {{"test", "--on", "maybe", NULL}, "--on: 'maybe' is not true or false"},
      {{"test", "--color", "Red", NULL}, "--color: 'Red' is not one of red, green, blue"},
      {{"test", "--level", "mid", NULL}, "--level: 'mid' is not one of low, high"},
      {{"test", "--owned", "", NULL}, "--owned: must not be empty"},
      {{"test", "--custom", "bad", NULL}, "--custom: 'bad' is not good"},
  };
  expect_errors(cases, sizeof cases / sizeof cases[0]);
}

static void test_unknown_missing_and_switches(void **state) {
  (void)state;
  static const error_case_t cases[] = {
      {{"test", "--bogus", "1", NULL}, "--bogus: unknown option (see kvrouter test --help)"},
      {{"test", "--bogus=1", NULL}, "--bogus: unknown option (see kvrouter test --help)"},
      {{"test", "-x", NULL}, "-x: unknown option (see kvrouter test --help)"},
      {{"test", "stray", NULL}, "'stray': unexpected argument (see kvrouter test --help)"},
      {{"test", "--name", NULL}, "--name: missing value"},
      {{"test", "--verbose=1", NULL}, "--verbose: takes no value"},
      /* no passthrough: "--" is not an option */
      {{"test", "--", "x", NULL}, "--: unknown option (see kvrouter test --help)"},
      /* Errors come in command-line order even when an early option follows. */
      {{"test", "--count", "0", "--file", "7", NULL}, "--count: '0' must be in [1, 64]"},
  };
  expect_errors(cases, sizeof cases / sizeof cases[0]);
}

/* What test_lists_and_repeats refuses after its lists parsed. */
static const error_case_t list_errors[] = {
    {{"test", "--rates", "1,0", NULL}, "--rates: '0' must be > 0"},
    {{"test", "--rates", ",", NULL}, "--rates: ',' is an empty list"},
    {{"test", "--users", "1,2,3,4", NULL}, "--users: more than 3 items"},
    /* freed on the error */
    {{"test", "--tags", "a,b", "--tags", "c,d", NULL}, "--tags: more than 3 items"},
};

static void test_lists_and_repeats(void **state) {
  (void)state;
  settings_t s;
  char out[8192] = "", err[512];
  init(&s);
  const char *args[] = {"test", "--rates", "3,,4", "--rates=5", "--users", "1,100",        "--tags",
                        "a,b",  "--tags",  "c",    "--custom",  "one",     "--custom=two", NULL};
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), args), 0);
  /* The first --rates replaced the default list; the second appended. */
  assert_int_equal(s.nrates, 3);
  assert_true(s.rates[0] == 3 && s.rates[1] == 4 && s.rates[2] == 5);
  assert_int_equal(s.nusers, 2);
  assert_int_equal(s.users[1], 100);
  assert_int_equal(s.ntags, 3);
  assert_string_equal(s.tags[2], "c");
  assert_string_equal(s.seen, "0:one;1:two;");
  kvr_cli_free(&cmd, &s);
  assert_int_equal(s.ntags, 0);
  expect_errors(list_errors, sizeof list_errors / sizeof list_errors[0]);
}

static void test_early_option_and_passthrough(void **state) {
  (void)state;
  settings_t s;
  char out[8192] = "", err[512];
  init(&s);
  /* --count before --file still wins: the early option is applied first. */
  const char *args[] = {"test", "--count", "9", "--file", "33", NULL};
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), args), 0);
  assert_int_equal(s.file_loaded, 1);
  assert_int_equal(s.count, 9);
  /* With a rest pointer, "--" ends the options. */
  init(&s);
  char *argv[] = {"test", "--verbose", "--", "--bogus", "--help", NULL};
  int rest = -1;
  FILE *f = fmemopen(out, sizeof(out), "w");
  assert_int_equal(kvr_cli_parse(&cmd, &s, 5, argv, &rest, f, err, sizeof(err)), 0);
  fclose(f);
  assert_int_equal(rest, 3);
  assert_true(s.verbose);
  char *argv2[] = {"test", "--verbose", NULL};
  assert_int_equal(kvr_cli_parse(&cmd, &s, 2, argv2, &rest, stdout, err, sizeof(err)), 0);
  assert_int_equal(rest, 2);
}

static void test_help_and_version(void **state) {
  (void)state;
  settings_t s;
  char out[8192] = "", err[512];
  init(&s);
  /* --help wins wherever it stands, even after a bad flag, and nothing is stored first. */
  const char *args[] = {"test", "--count", "7", "--bogus", "--name", "--help", "-h", NULL};
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), args), KVR_CLI_EXIT);
  assert_int_equal(s.count, 5);
  assert_string_equal(s.name, "alpha");
  /* The value of --name is "--help": the -h after it asks for help. */
  static const char *const help_parts[] = {
      "usage: kvrouter test [options]\n\nA test command.\n",
      "\nBasics:\n  --name NAME\n      a name (default alpha; JSON: name)\n",
      "  --count N\n      a count (default 5; JSON: numbers.count)\n",
      "  --on BOOL\n      a bool (default true; JSON: on)\n",
      "  --verbose\n      a switch\n",
      "  --color red|green|blue\n      a color (default green; JSON: ",
      "  --rates LIST\n      rates (default 1.5,2; JSON: rates)\n",
      "  --tags LIST\n      tags\n",
      "  --custom X\n      a custom repeatable option (default shown;",
      "  -h, --help\n",
      "  --version\n",
      "the epilog\n",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(help_parts); i++)
    assert_non_null(strstr(out, help_parts[i]));
  /* Help text wraps at 100 columns; a hidden default is not shown. */
  const char *h = strstr(out, "  --hidden N\n");
  assert_non_null(h);
  assert_null(strstr(h, "(default"));
  for (const char *line = out; *line; line = strchr(line, '\n') + 1)
    assert_true(strcspn(line, "\n") <= 100);
  const char *v[] = {"test", "--ratio", "5", "--version", NULL};
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), v), KVR_CLI_EXIT);
  assert_string_equal(out, "kvrouter " KVR_VERSION " (commit " KVR_COMMIT ")\n");
  /* A value that looks like --version is a value. */
  const char *v2[] = {"test", "--name", "--version", NULL};
  assert_int_equal(parse(&s, out, sizeof(out), err, sizeof(err), v2), 0);
  assert_string_equal(s.name, "--version");
}

static int apply(settings_t *s, const char *json, char *err, size_t errlen) {
  return kvr_cli_apply_json(&cmd, s, json, strlen(json), "c.json", err, errlen);
}

static void expect_json_error(const char *json, const char *want) {
  settings_t s;
  char err[512] = "";
  init(&s);
  assert_int_equal(apply(&s, json, err, sizeof(err)), KVR_EINVAL);
  if (strcmp(err, want) != 0)
    fail_msg("error '%s', want '%s'", err, want);
  kvr_cli_free(&cmd, &s);
}

static void test_json(void **state) {
  (void)state;
  settings_t s;
  char err[512];
  init(&s);
  const char *doc =
      "{\"owned\": \"o\", \"numbers\": {\"count\": 3, \"delta\": -2, \"ratio\": 0.75},"
      " \"on\": false, \"color\": \"red\", \"rates\": [7, 8.5],"
      " \"customs\": [\"p\", \"q\"], \"raw\": {\"a\": [1]}}";
  assert_int_equal(apply(&s, doc, err, sizeof(err)), 0);
  assert_string_equal(s.owned, "o");
  assert_int_equal(s.count, 3);
  assert_int_equal(s.delta, -2);
  assert_true(s.ratio == 0.75);
  assert_false(s.on);
  assert_int_equal(s.color, COLOR_RED);
  assert_int_equal(s.nrates, 2);
  assert_true(s.rates[1] == 8.5);
  assert_string_equal(s.seen, "0:p;1:q;0:{\"a\":[1]};");
  kvr_cli_free(&cmd, &s);
  expect_json_error("[1]", "c.json: not a JSON object");
  expect_json_error("{\"numbers\": {\"cnt\": 1}}", "c.json: numbers.cnt: unknown setting");
  expect_json_error("{\"nam\": 1}", "c.json: nam: unknown setting");
  expect_json_error("{\"a\nb\": 1}", "c.json: a\\x0ab: unknown setting"); /* raw LF: one line */
  expect_json_error("{\"numbers\": {\"count\": \"3\"}}",
                    "c.json: numbers.count: must be a number, not a string");
  expect_json_error("{\"numbers\": {\"count\": -1}}",
                    "c.json: numbers.count: must be a non-negative integer");
  expect_json_error("{\"numbers\": {\"count\": 1.5}}",
                    "c.json: numbers.count: must be a non-negative integer");
  expect_json_error("{\"numbers\": {\"count\": 99}}",
                    "c.json: numbers.count: '99' must be in [1, 64]");
  expect_json_error("{\"numbers\": {\"delta\": 0.5}}", "c.json: numbers.delta: must be an integer");
  expect_json_error("{\"on\": \"yes\"}", "c.json: on: must be a boolean, not a string");
  expect_json_error("{\"on\": 1}", "c.json: on: must be a boolean");
  expect_json_error("{\"color\": 2}", "c.json: color: must be a string");
  expect_json_error("{\"color\": \"pink\"}",
                    "c.json: color: 'pink' is not one of red, green, blue");
  expect_json_error("{\"customs\": \"p\"}", "c.json: customs: must be an array");
  expect_json_error("{\"customs\": [\"p\", 5]}", "c.json: customs[1]: must be a string");
  expect_json_error("{\"customs\": [\"bad\"]}", "c.json: customs[0]: 'bad' is not good");
  expect_json_error("{\"rates\": [1, -1]}", "c.json: rates[1]: '-1' must be > 0");
}

KVR_TEST_MAIN(cmocka_unit_test(test_kinds), cmocka_unit_test(test_ranges_and_values),
              cmocka_unit_test(test_unknown_missing_and_switches),
              cmocka_unit_test(test_lists_and_repeats),
              cmocka_unit_test(test_early_option_and_passthrough),
              cmocka_unit_test(test_help_and_version), cmocka_unit_test(test_json))

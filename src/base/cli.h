/* cli.h -- the one command-line engine of every kvrouter subcommand: an option table drives the
 * flags, the JSON keys of a config file and --help.
 *
 * A subcommand keeps its settings in one struct and describes them in a static table of
 * kvr_cli_opt_t: the flag, the kind of value, where the value goes (an offset into the struct), a
 * line of help and, for `serve`, the dotted key of the same setting in its JSON config file. The
 * engine parses argv into the struct, prints --help with every default read from the struct's
 * initial value (so help can never show one default while the program starts with another), prints
 * --version, and applies a JSON document through the same setters, so the two spellings of a
 * setting can never disagree on validation.
 *
 * Command lines: `--flag VALUE` or `--flag=VALUE`; switches take no value; the last occurrence of a
 * scalar wins; a list's first occurrence replaces its default (or the config file's list) and
 * later occurrences append. `-h`, `--help` and `--version` win wherever they stand, even next to a
 * bad flag, and are seen before any value is stored. With a `rest` pointer, `--` ends the options
 * (what follows is for someone else). Options flagged KVR_CLI_EARLY (serve's --config) are applied
 * in a first pass, so the other flags override them wherever they stand.
 *
 * Errors: one line, "--flag: what is wrong" (or "FILE: json.path: what is wrong"); the subcommand
 * prints it as "kvrouter NAME: --flag: what is wrong" and exits with status 2 (kvr_cli_main()).
 */
#ifndef KVR_CLI_H
#define KVR_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum {
  KVR_CLI_SECTION, /* not an option: a heading in --help (name is the heading) */
  KVR_CLI_STR,     /* const char * into argv, or a malloc'd copy with KVR_CLI_OWNED; names: the
                    * allowed values (NULL-terminated) or NULL for any */
  KVR_CLI_INT,     /* signed integer of `size` bytes */
  KVR_CLI_UINT,    /* unsigned integer of `size` bytes */
  KVR_CLI_DOUBLE,  /* a finite double */
  KVR_CLI_BOOL,    /* bool taking a value: true/false, 1/0, on/off */
  KVR_CLI_SWITCH,  /* no value: stores `set` into the integer, enum or bool of `size` bytes */
  KVR_CLI_ENUM,    /* one of names[] (NULL-terminated): stores its index into `size` bytes */
  KVR_CLI_LIST,    /* comma-separated items of kind `elem` (STR, UINT, DOUBLE) into an array of
                    * `cap` elements of `size` bytes, count in the size_t at count_off. String items
                    * are malloc'd copies (kvr_cli_free()), so a list's default must be empty. */
  KVR_CLI_CUSTOM,  /* parse() stores the value; repeatable */
} kvr_cli_kind_t;

/* Option flags. */
#define KVR_CLI_OWNED 0x01u     /* STR: store a malloc'd copy and free the previous value */
#define KVR_CLI_NONEMPTY 0x02u  /* STR: "" is an error */
#define KVR_CLI_NODEFAULT 0x04u /* --help shows no default (the help text explains it) */
#define KVR_CLI_EARLY 0x08u     /* applied before every other option (a config file) */
#define KVR_CLI_JSON_LIST 0x10u /* CUSTOM: the JSON value is an array of strings, each parsed */
#define KVR_CLI_JSON_RAW 0x20u  /* CUSTOM: the JSON value is parsed as its JSON text */

typedef struct kvr_cli_opt_s kvr_cli_opt_t;

/* CUSTOM: stores text (the value of option o) into the settings at base; nth counts o's
 * occurrences on this command line (or items of this JSON array) from 0. Returns 0, or a negative
 * code with what is wrong in err (the engine prefixes "--flag: "). */
typedef int (*kvr_cli_parse_cb)(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                                char *err, size_t errlen);
/* CUSTOM: the value at base as text for "(default ...)" in --help; leaves buf empty for none. */
typedef void (*kvr_cli_show_cb)(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len);

struct kvr_cli_opt_s {
  kvr_cli_kind_t kind;
  const char *name; /* the flag without "--"; SECTION: the heading */
  size_t off;       /* the destination: offset from the settings' base */
  size_t size;      /* its size (for LIST: of one element) */
  const char *arg;  /* placeholder of the value in --help; NULL: from the kind */
  const char *help; /* one sentence, no default (the engine adds it) */
  const char *json; /* dotted key of the setting in a JSON config file, or NULL (a STR with a
                     * key must be KVR_CLI_OWNED: the document is freed after it is applied) */
  unsigned flags;   /* KVR_CLI_OWNED, ... */
  bool has_min, has_max, min_excl; /* numeric range (for LIST: of each item) */
  double min, max;
  const char *const *names; /* ENUM: the names; STR: the allowed values */
  long long set;            /* SWITCH: the value stored */
  kvr_cli_kind_t elem;      /* LIST: kind of an item */
  size_t cap;               /* LIST: capacity in items */
  size_t count_off;         /* LIST: offset of its size_t item count */
  kvr_cli_parse_cb parse;   /* CUSTOM */
  kvr_cli_show_cb show;     /* CUSTOM: optional */
};

/* Table helpers: the destination `member` of settings struct `type`, a list, ranges. */
#define KVR_CLI_FIELD(type, member)                                                                \
  .off = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define KVR_CLI_ARRAY(type, array, count)                                                          \
  .off = offsetof(type, array), .size = sizeof(((type *)0)->array[0]),                             \
  .cap = sizeof(((type *)0)->array) / sizeof(((type *)0)->array[0]),                               \
  .count_off = offsetof(type, count)
/* A heading in --help, between options. */
#define KVR_CLI_HEADING(title)                                                                     \
  { .kind = KVR_CLI_SECTION, .name = (title) }
#define KVR_CLI_MIN(lo) .has_min = true, .min = (lo)
#define KVR_CLI_GT(lo) .has_min = true, .min_excl = true, .min = (lo)
#define KVR_CLI_MAX(hi) .has_max = true, .max = (hi)
#define KVR_CLI_RANGE(lo, hi) KVR_CLI_MIN(lo), KVR_CLI_MAX(hi)

/* One subcommand: its name in messages ("serve", "bench routing"), the synopsis after
 * "usage: kvrouter NAME ", a paragraph under it, the table and an optional footer for --help. */
typedef struct kvr_cli_cmd_s {
  const char *name;
  const char *usage;
  const char *about;
  const kvr_cli_opt_t *opts;
  size_t nopts; /* at most KVR_CLI_MAX_OPTS */
  void (*epilog)(FILE *out);
} kvr_cli_cmd_t;

#define KVR_CLI_MAX_OPTS 128
#define KVR_CLI_EXIT 1        /* kvr_cli_parse(): --help or --version was printed */
#define KVR_CLI_CONTINUE (-1) /* kvr_cli_main(): parsed, go on */

/* Parses argv (argv[0] is the subcommand's name) into the settings at base. With rest non-NULL,
 * "--" ends the options and *rest is the index after it (argc when absent); without, "--" is an
 * unexpected argument. Returns 0, KVR_CLI_EXIT after printing --help or --version to out (nothing
 * stored), or KVR_EINVAL with one line in err; values stored before the error stay stored. */
int kvr_cli_parse(const kvr_cli_cmd_t *cmd, void *base, int argc, char **argv, int *rest, FILE *out,
                  char *err, size_t errlen);

/* kvr_cli_parse() as a subcommand's entry uses it: help and version to stdout, an error as one
 * line on stderr. Returns KVR_CLI_CONTINUE, or the exit status (0 after help/version, 2). */
int kvr_cli_main(const kvr_cli_cmd_t *cmd, void *base, int argc, char **argv, int *rest);

/* Prints "kvrouter NAME: " and the formatted message as one line on stderr; returns 2, the exit
 * status of a bad command line. For the checks a subcommand makes after parsing. */
int kvr_cli_fail(const kvr_cli_cmd_t *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints --help: the usage line, the paragraph, every option with its default read from base and
 * its JSON key, -h/--help, --version, the epilog. */
void kvr_cli_help(const kvr_cli_cmd_t *cmd, const void *base, FILE *out);

/* Applies a JSON config document (an object keyed by the table's json paths) to base. A key the
 * table does not know is an error, so a typo is never a silent default. source names the document
 * in messages ("c.json: timeouts.first_byte_ms: must be a number, not a string"). Returns 0 or
 * KVR_EINVAL with one line in err. */
int kvr_cli_apply_json(const kvr_cli_cmd_t *cmd, void *base, const char *json, size_t len,
                       const char *source, char *err, size_t errlen);

/* Frees what the engine allocated in base (KVR_CLI_OWNED strings, string list items) and
 * leaves those fields NULL or empty. */
void kvr_cli_free(const kvr_cli_cmd_t *cmd, void *base);

#endif

/* cli.c -- the option engine of every subcommand: argv, JSON config keys and --help from one table.
 *
 * Flow of kvr_cli_parse(): prescan() looks for -h/--help/--version (skipping the values of known
 * options) and prints before anything is stored; then walk() runs twice over argv, first storing
 * the KVR_CLI_EARLY options (a config file), then the others, so flags override the file wherever
 * they stand. Each occurrence goes through store(), which dispatches on the kind to one small
 * setter; a JSON value is turned into the same text a flag would carry and goes through store()
 * too, so a flag and its JSON key can never disagree on validation.
 *
 * Messages: every setter writes "WHAT: what is wrong", WHAT being "--flag" or "FILE: json.path"
 * ("FILE: workers[1]" for an array item); values are quoted as given.
 *
 * Invariants: the engine never keeps a pointer to argv beyond what it stores in the settings;
 * strings it allocates (KVR_CLI_OWNED, list items) are released by kvr_cli_free().
 */
#include "base/cli.h"

#include "base/kvr.h"
#include "kvr_commit.h" /* generated at build time: KVR_COMMIT */

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define HELP_INDENT 6
#define HELP_WIDTH 100

/* ---- reading and writing integers of any size ---- */

static void put_bits(void *dst, size_t size, uint64_t v) {
  uint8_t u8 = (uint8_t)v;
  uint16_t u16 = (uint16_t)v;
  uint32_t u32 = (uint32_t)v;
  const void *src = size == 1   ? (const void *)&u8
                    : size == 2 ? (const void *)&u16
                    : size == 4 ? (const void *)&u32
                                : (const void *)&v;
  memcpy(dst, src, size);
}

static uint64_t get_u(const void *src, size_t size) {
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  switch (size) {
  case 1:
    memcpy(&u8, src, 1);
    return u8;
  case 2:
    memcpy(&u16, src, 2);
    return u16;
  case 4:
    memcpy(&u32, src, 4);
    return u32;
  default:
    memcpy(&u64, src, 8);
    return u64;
  }
}

static int64_t get_i(const void *src, size_t size) {
  uint64_t u = get_u(src, size);
  if (size < 8 && (u >> (size * 8 - 1)) & 1)
    u |= ~0ull << (size * 8); /* sign-extend */
  return (int64_t)u;
}

static uint64_t umax_of(size_t size) {
  return size >= 8 ? UINT64_MAX : (1ull << (size * 8)) - 1;
}

/* ---- the setters: text -> destination, or "WHAT: what is wrong" ---- */

/* The range of o as text ("in [1, 64]", ">= 0") for messages. */
static void range_text(const kvr_cli_opt_t *o, char *buf, size_t len) {
  if (o->has_min && o->has_max)
    snprintf(buf, len, "in %c%.15g, %.15g]", o->min_excl ? '(' : '[', o->min, o->max);
  else if (o->has_min)
    snprintf(buf, len, "%s %.15g", o->min_excl ? ">" : ">=", o->min);
  else
    snprintf(buf, len, "<= %.15g", o->max);
}

static bool in_range(const kvr_cli_opt_t *o, double v) {
  if (o->has_min && (o->min_excl ? !(v > o->min) : !(v >= o->min)))
    return false;
  return !(o->has_max && !(v <= o->max));
}

static int out_of_range(const kvr_cli_opt_t *o, const char *text, const char *what, char *err,
                        size_t errlen) {
  char r[96];
  range_text(o, r, sizeof r);
  snprintf(err, errlen, "%s: '%s' must be %s", what, text, r);
  return KVR_EINVAL;
}

static int set_uint(const kvr_cli_opt_t *o, void *dst, size_t size, const char *text,
                    const char *what, char *err, size_t errlen) {
  char *end;
  errno = 0;
  unsigned long long v = isdigit((unsigned char)text[0]) ? strtoull(text, &end, 10) : 0;
  if (!isdigit((unsigned char)text[0]) || errno != 0 || *end != '\0') {
    snprintf(err, errlen, "%s: '%s' is not a non-negative integer", what, text);
    return KVR_EINVAL;
  }
  if ((o->has_min || o->has_max) && !in_range(o, (double)v))
    return out_of_range(o, text, what, err, errlen);
  if (v > umax_of(size)) {
    snprintf(err, errlen, "%s: '%s' must be <= %llu", what, text,
             (unsigned long long)umax_of(size));
    return KVR_EINVAL;
  }
  put_bits(dst, size, v);
  return 0;
}

static int set_int(const kvr_cli_opt_t *o, void *dst, size_t size, const char *text,
                   const char *what, char *err, size_t errlen) {
  char *end;
  errno = 0;
  const char *digits = text[0] == '-' ? text + 1 : text;
  long long v = isdigit((unsigned char)digits[0]) ? strtoll(text, &end, 10) : 0;
  if (!isdigit((unsigned char)digits[0]) || errno != 0 || *end != '\0') {
    snprintf(err, errlen, "%s: '%s' is not an integer", what, text);
    return KVR_EINVAL;
  }
  long long lo = size >= 8 ? INT64_MIN : -(1ll << (size * 8 - 1));
  long long hi = size >= 8 ? INT64_MAX : (1ll << (size * 8 - 1)) - 1;
  if ((o->has_min || o->has_max) && !in_range(o, (double)v))
    return out_of_range(o, text, what, err, errlen);
  if (v < lo || v > hi) {
    snprintf(err, errlen, "%s: '%s' must be in [%lld, %lld]", what, text, lo, hi);
    return KVR_EINVAL;
  }
  put_bits(dst, size, (uint64_t)v);
  return 0;
}

static int set_double(const kvr_cli_opt_t *o, void *dst, const char *text, const char *what,
                      char *err, size_t errlen) {
  char *end;
  errno = 0;
  double v = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !isfinite(v)) {
    snprintf(err, errlen, "%s: '%s' is not a finite number", what, text);
    return KVR_EINVAL;
  }
  if (!in_range(o, v))
    return out_of_range(o, text, what, err, errlen);
  memcpy(dst, &v, sizeof v);
  return 0;
}

static int set_bool(void *dst, const char *text, const char *what, char *err, size_t errlen) {
  bool v;
  if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0 || strcmp(text, "on") == 0)
    v = true;
  else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0 || strcmp(text, "off") == 0)
    v = false;
  else {
    snprintf(err, errlen, "%s: '%s' is not true or false", what, text);
    return KVR_EINVAL;
  }
  memcpy(dst, &v, sizeof v);
  return 0;
}

/* Index of text in names, or -1 with "'x' is not one of a, b, c" in err. */
static int name_index(const char *const *names, const char *text, const char *what, char *err,
                      size_t errlen) {
  for (int i = 0; names[i] != NULL; i++)
    if (strcmp(names[i], text) == 0)
      return i;
  int n = snprintf(err, errlen, "%s: '%s' is not one of ", what, text);
  for (int i = 0; names[i] != NULL && n >= 0 && (size_t)n < errlen; i++)
    n += snprintf(err + n, errlen - (size_t)n, "%s%s", i ? ", " : "", names[i]);
  return -1;
}

static int set_str(const kvr_cli_opt_t *o, void *dst, const char *text, bool owned,
                   const char *what, char *err, size_t errlen) {
  if ((o->flags & KVR_CLI_NONEMPTY) && *text == '\0') {
    snprintf(err, errlen, "%s: must not be empty", what);
    return KVR_EINVAL;
  }
  if (o->names != NULL && name_index(o->names, text, what, err, errlen) < 0)
    return KVR_EINVAL;
  char *old;
  memcpy(&old, dst, sizeof old);
  const char *v = owned ? kvr_xstrdup(text) : text;
  if (owned)
    free(old);
  memcpy(dst, &v, sizeof v);
  return 0;
}

/* One value of kind `kind` (a scalar, or one item of a list) into dst. */
static int set_scalar(const kvr_cli_opt_t *o, kvr_cli_kind_t kind, void *dst, size_t size,
                      const char *text, const char *what, char *err, size_t errlen) {
  int i;
  switch (kind) {
  case KVR_CLI_STR:
    return set_str(o, dst, text, (o->flags & KVR_CLI_OWNED) || o->kind == KVR_CLI_LIST, what, err,
                   errlen);
  case KVR_CLI_INT:
    return set_int(o, dst, size, text, what, err, errlen);
  case KVR_CLI_UINT:
    return set_uint(o, dst, size, text, what, err, errlen);
  case KVR_CLI_DOUBLE:
    return set_double(o, dst, text, what, err, errlen);
  case KVR_CLI_BOOL:
    return set_bool(dst, text, what, err, errlen);
  case KVR_CLI_ENUM:
    if ((i = name_index(o->names, text, what, err, errlen)) < 0)
      return KVR_EINVAL;
    put_bits(dst, size, (uint64_t)i);
    return 0;
  default:
    snprintf(err, errlen, "%s: cannot be set", what);
    return KVR_EINVAL;
  }
}

static void list_clear(const kvr_cli_opt_t *o, void *base) {
  size_t *count = (size_t *)((char *)base + o->count_off);
  char **items = (char **)((char *)base + o->off);
  if (o->elem == KVR_CLI_STR)
    for (size_t i = 0; i < *count; i++) {
      free(items[i]);
      items[i] = NULL;
    }
  *count = 0;
}

/* Comma-separated items appended to the list; the first occurrence replaces what it held. */
static int set_list(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                    const char *what, char *err, size_t errlen) {
  size_t *count = (size_t *)((char *)base + o->count_off);
  if (nth == 0)
    list_clear(o, base);
  char *copy = kvr_xstrdup(text), *save = NULL;
  int rc = 0, nitems = 0;
  for (char *t = strtok_r(copy, ",", &save); t && rc == 0; t = strtok_r(NULL, ",", &save)) {
    nitems++;
    if (*count == o->cap) {
      snprintf(err, errlen, "%s: more than %zu items", what, o->cap);
      rc = KVR_EINVAL;
    } else if ((rc = set_scalar(o, o->elem, (char *)base + o->off + *count * o->size, o->size, t,
                                what, err, errlen)) == 0)
      (*count)++;
  }
  free(copy);
  if (rc == 0 && nitems == 0) {
    snprintf(err, errlen, "%s: '%s' is an empty list", what, text);
    rc = KVR_EINVAL;
  }
  return rc;
}

static int set_custom(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                      const char *what, char *err, size_t errlen) {
  char e2[512] = "";
  if (o->parse(o, base, text, nth, e2, sizeof e2) == 0)
    return 0;
  snprintf(err, errlen, "%s: %s", what, e2);
  return KVR_EINVAL;
}

/* Stores one occurrence of o; what names it in messages. */
static int store(const kvr_cli_opt_t *o, void *base, const char *text, unsigned nth,
                 const char *what, char *err, size_t errlen) {
  void *dst = (char *)base + o->off;
  switch (o->kind) {
  case KVR_CLI_SWITCH:
    put_bits(dst, o->size, (uint64_t)o->set);
    return 0;
  case KVR_CLI_LIST:
    return set_list(o, base, text, nth, what, err, errlen);
  case KVR_CLI_CUSTOM:
    return set_custom(o, base, text, nth, what, err, errlen);
  default:
    return set_scalar(o, o->kind, dst, o->size, text, what, err, errlen);
  }
}

/* ---- argv ---- */

static const kvr_cli_opt_t *find(const kvr_cli_cmd_t *cmd, const char *name, size_t len) {
  for (size_t i = 0; i < cmd->nopts; i++) {
    const kvr_cli_opt_t *o = &cmd->opts[i];
    if (o->kind != KVR_CLI_SECTION && strlen(o->name) == len && strncmp(o->name, name, len) == 0)
      return o;
  }
  return NULL;
}

/* The option argv[i] names ("--name" or "--name=value"), or NULL. */
static const kvr_cli_opt_t *lookup(const kvr_cli_cmd_t *cmd, const char *a, const char **eq) {
  *eq = NULL;
  if (strncmp(a, "--", 2) != 0 || a[2] == '\0')
    return NULL;
  *eq = strchr(a + 2, '=');
  return find(cmd, a + 2, *eq ? (size_t)(*eq - a - 2) : strlen(a + 2));
}

static void print_version(FILE *out) {
  fprintf(out, "kvrouter %s (commit %s)\n", KVR_VERSION, KVR_COMMIT);
}

/* -h, --help or --version anywhere among the options: printed before anything is stored. */
static bool prescan(const kvr_cli_cmd_t *cmd, const void *base, int argc, char **argv,
                    bool passthrough, FILE *out) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *eq;
    if (passthrough && strcmp(a, "--") == 0)
      return false;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      kvr_cli_help(cmd, base, out);
      return true;
    }
    if (strcmp(a, "--version") == 0) {
      print_version(out);
      return true;
    }
    const kvr_cli_opt_t *o = lookup(cmd, a, &eq);
    if (o != NULL && o->kind != KVR_CLI_SWITCH && eq == NULL)
      i++; /* its value, whatever it looks like */
  }
  return false;
}

/* The option at argv[*i] and its value (advancing *i past it); NULL option at a "--" that ends
 * the options. */
static int next_opt(const kvr_cli_cmd_t *cmd, int argc, char **argv, int *i, bool passthrough,
                    const kvr_cli_opt_t **o, const char **val, char *err, size_t errlen) {
  const char *a = argv[*i], *eq;
  *o = NULL;
  *val = NULL;
  if (passthrough && strcmp(a, "--") == 0)
    return 0;
  if ((*o = lookup(cmd, a, &eq)) == NULL) {
    if (a[0] == '-')
      snprintf(err, errlen, "%.*s: unknown option (see kvrouter %s --help)",
               (int)(eq ? eq - a : (long)strlen(a)), a, cmd->name);
    else
      snprintf(err, errlen, "'%s': unexpected argument (see kvrouter %s --help)", a, cmd->name);
    return KVR_EINVAL;
  }
  if ((*o)->kind == KVR_CLI_SWITCH) {
    if (eq == NULL)
      return 0;
    snprintf(err, errlen, "--%s: takes no value", (*o)->name);
    return KVR_EINVAL;
  }
  *val = eq ? eq + 1 : (*i + 1 < argc ? argv[++*i] : NULL);
  if (*val != NULL)
    return 0;
  snprintf(err, errlen, "--%s: missing value", (*o)->name);
  return KVR_EINVAL;
}

/* One pass over argv storing the early options (early) or the others. The early pass skips what it
 * cannot read, so errors come in command-line order from the second. */
static int walk(const kvr_cli_cmd_t *cmd, void *base, int argc, char **argv, int *rest, bool early,
                char *err, size_t errlen) {
  unsigned seen[KVR_CLI_MAX_OPTS] = {0};
  for (int i = 1; i < argc; i++) {
    const kvr_cli_opt_t *o;
    const char *val;
    if (next_opt(cmd, argc, argv, &i, rest != NULL, &o, &val, err, errlen) != 0) {
      if (early)
        continue; /* reported by the second pass, in command-line order */
      return KVR_EINVAL;
    }
    if (o == NULL) {
      *rest = i + 1;
      return 0;
    }
    if (((o->flags & KVR_CLI_EARLY) != 0) != early)
      continue;
    char what[80];
    snprintf(what, sizeof what, "--%s", o->name);
    if (store(o, base, val, seen[o - cmd->opts]++, what, err, errlen) != 0)
      return KVR_EINVAL;
  }
  return 0;
}

int kvr_cli_parse(const kvr_cli_cmd_t *cmd, void *base, int argc, char **argv, int *rest, FILE *out,
                  char *err, size_t errlen) {
  if (cmd->nopts > KVR_CLI_MAX_OPTS)
    abort(); /* a table larger than the engine's bookkeeping: a programming error */
  if (prescan(cmd, base, argc, argv, rest != NULL, out))
    return KVR_CLI_EXIT;
  if (rest != NULL)
    *rest = argc;
  if (walk(cmd, base, argc, argv, rest, true, err, errlen) != 0)
    return KVR_EINVAL;
  return walk(cmd, base, argc, argv, rest, false, err, errlen);
}

int kvr_cli_fail(const kvr_cli_cmd_t *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kvrouter %s: ", cmd->name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return 2;
}

int kvr_cli_main(const kvr_cli_cmd_t *cmd, void *base, int argc, char **argv, int *rest) {
  char err[1024];
  int rc = kvr_cli_parse(cmd, base, argc, argv, rest, stdout, err, sizeof err);
  if (rc == KVR_CLI_EXIT) {
    fflush(stdout);
    return 0;
  }
  return rc < 0 ? kvr_cli_fail(cmd, "%s", err) : KVR_CLI_CONTINUE;
}

/* ---- --help ---- */

/* A scalar's value at dst as text; "" when there is none to show. */
static void show_scalar(const kvr_cli_opt_t *o, kvr_cli_kind_t kind, const void *dst, size_t size,
                        char *buf, size_t len) {
  const char *s;
  double d;
  uint64_t i;
  buf[0] = '\0';
  switch (kind) {
  case KVR_CLI_STR:
    memcpy(&s, dst, sizeof s);
    snprintf(buf, len, "%s", s ? s : "");
    break;
  case KVR_CLI_INT:
    snprintf(buf, len, "%lld", (long long)get_i(dst, size));
    break;
  case KVR_CLI_UINT:
    snprintf(buf, len, "%llu", (unsigned long long)get_u(dst, size));
    break;
  case KVR_CLI_DOUBLE:
    memcpy(&d, dst, sizeof d);
    snprintf(buf, len, "%g", d);
    break;
  case KVR_CLI_BOOL:
    snprintf(buf, len, "%s", get_u(dst, 1) ? "true" : "false");
    break;
  case KVR_CLI_ENUM:
    i = get_u(dst, size);
    for (size_t k = 0; o->names[k] != NULL; k++)
      if (k == i)
        snprintf(buf, len, "%s", o->names[k]);
    break;
  default:
    break;
  }
}

static void show_list(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  size_t count;
  memcpy(&count, (const char *)base + o->count_off, sizeof count);
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < count && n + 1 < len; i++) {
    char item[64];
    show_scalar(o, o->elem, (const char *)base + o->off + i * o->size, o->size, item, sizeof item);
    n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? "," : "", item);
  }
}

static void show_default(const kvr_cli_opt_t *o, const void *base, char *buf, size_t len) {
  buf[0] = '\0';
  if (o->flags & KVR_CLI_NODEFAULT)
    return;
  if (o->kind == KVR_CLI_LIST)
    show_list(o, base, buf, len);
  else if (o->kind == KVR_CLI_CUSTOM && o->show != NULL)
    o->show(o, base, buf, len);
  else if (o->kind != KVR_CLI_CUSTOM && o->kind != KVR_CLI_SWITCH)
    show_scalar(o, o->kind, (const char *)base + o->off, o->size, buf, len);
}

static void placeholder(const kvr_cli_opt_t *o, char *buf, size_t len) {
  buf[0] = '\0';
  if (o->kind == KVR_CLI_SWITCH)
    return;
  if (o->arg != NULL) {
    snprintf(buf, len, " %s", o->arg);
  } else if (o->kind == KVR_CLI_ENUM) {
    size_t n = 0;
    for (size_t k = 0; o->names[k] != NULL && n < len; k++)
      n += (size_t)snprintf(buf + n, len - n, "%c%s", k ? '|' : ' ', o->names[k]);
  } else {
    snprintf(buf, len, " %s",
             o->kind == KVR_CLI_STR    ? "TEXT"
             : o->kind == KVR_CLI_BOOL ? "BOOL"
             : o->kind == KVR_CLI_LIST ? "LIST"
                                       : (o->kind == KVR_CLI_CUSTOM ? "VALUE" : "N"));
  }
}

/* Prints text wrapped at HELP_WIDTH, indented; `tail` is kept whole on the last line. */
static void wrap(FILE *out, const char *text, const char *tail) {
  size_t col = 0;
  const char *p = text;
  for (;;) {
    while (*p == ' ')
      p++;
    bool is_tail = *p == '\0';
    const char *w = is_tail ? tail : p;
    size_t wl = is_tail ? strlen(tail) : strcspn(p, " ");
    if (wl == 0)
      break;
    if (col > 0 && HELP_INDENT + col + 1 + wl > HELP_WIDTH) {
      fputc('\n', out);
      col = 0;
    }
    fprintf(out, "%s%*s%.*s", col ? " " : "", col ? 0 : HELP_INDENT, "", (int)wl, w);
    col += (col ? 1 : 0) + wl;
    if (is_tail)
      break;
    p += wl;
  }
  fputc('\n', out);
}

static void help_opt(const kvr_cli_opt_t *o, const void *base, FILE *out) {
  char arg[160], def[256], tail[400];
  placeholder(o, arg, sizeof arg);
  show_default(o, base, def, sizeof def);
  fprintf(out, "  --%s%s\n", o->name, arg);
  if (def[0] && o->json)
    snprintf(tail, sizeof tail, "(default %s; JSON: %s)", def, o->json);
  else if (def[0] || o->json)
    snprintf(tail, sizeof tail, "(%s %s)", def[0] ? "default" : "JSON:", def[0] ? def : o->json);
  else
    tail[0] = '\0';
  wrap(out, o->help ? o->help : "", tail);
}

void kvr_cli_help(const kvr_cli_cmd_t *cmd, const void *base, FILE *out) {
  fprintf(out, "usage: kvrouter %s %s\n\n%s\n", cmd->name, cmd->usage, cmd->about);
  if (cmd->nopts == 0 || cmd->opts[0].kind != KVR_CLI_SECTION)
    fprintf(out, "\nOptions:\n");
  for (size_t i = 0; i < cmd->nopts; i++) {
    if (cmd->opts[i].kind == KVR_CLI_SECTION)
      fprintf(out, "\n%s:\n", cmd->opts[i].name);
    else
      help_opt(&cmd->opts[i], base, out);
  }
  fprintf(out,
          "  -h, --help\n%*sprint this help and exit\n  --version\n%*sprint the version "
          "(kvrouter %s) and exit\n",
          HELP_INDENT, "", HELP_INDENT, "", KVR_VERSION);
  if (cmd->epilog != NULL)
    cmd->epilog(out);
}

/* ---- JSON config documents ---- */

static const cJSON *json_path(const cJSON *root, const char *path) {
  char buf[128];
  snprintf(buf, sizeof buf, "%s", path);
  const cJSON *node = root;
  for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok; tok = strtok_r(NULL, ".", &save)) {
    if (!cJSON_IsObject(node))
      return NULL;
    node = cJSON_GetObjectItemCaseSensitive(node, tok);
    if (node == NULL)
      return NULL;
  }
  return node;
}

/* Rejects keys the table does not know; recurses into objects that lead to known keys. */
static int check_keys(const kvr_cli_cmd_t *cmd, const cJSON *obj, const char *prefix,
                      const char *source, char *err, size_t errlen) {
  for (const cJSON *it = obj->child; it; it = it->next) {
    char path[160];
    snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", it->string);
    size_t plen = strlen(path);
    bool known = false, is_prefix = false;
    for (size_t i = 0; i < cmd->nopts; i++) {
      const char *j = cmd->opts[i].json;
      known |= j != NULL && strcmp(j, path) == 0;
      is_prefix |= j != NULL && strncmp(j, path, plen) == 0 && j[plen] == '.';
    }
    if (known)
      continue;
    if (!is_prefix || !cJSON_IsObject(it)) {
      /* control characters in the key (cJSON accepts raw ones) are shown as \xNN, so the error
       * stays one line */
      char shown[4 * sizeof path];
      size_t n = 0;
      for (const unsigned char *c = (const unsigned char *)path; *c && n + 5 < sizeof shown; c++)
        n += (size_t)(*c < 0x20 || *c == 0x7f ? snprintf(shown + n, 5, "\\x%02x", *c)
                                              : snprintf(shown + n, 2, "%c", *c));
      shown[n] = '\0';
      snprintf(err, errlen, "%s: %s: unknown setting", source, shown);
      return KVR_EINVAL;
    }
    if (check_keys(cmd, it, path, source, err, errlen) != 0)
      return KVR_EINVAL;
  }
  return 0;
}

/* A JSON number as the text a flag would carry, checked against the kind. */
static int number_text(kvr_cli_kind_t kind, const cJSON *v, char *text, size_t len,
                       const char *what, char *err, size_t errlen) {
  double d = v->valuedouble;
  bool integral = d == floor(d) && fabs(d) < 9.2e18;
  if (kind == KVR_CLI_UINT && (!integral || d < 0)) {
    snprintf(err, errlen, "%s: must be a non-negative integer", what);
    return KVR_EINVAL;
  }
  if (kind == KVR_CLI_INT && !integral) {
    snprintf(err, errlen, "%s: must be an integer", what);
    return KVR_EINVAL;
  }
  if (kind == KVR_CLI_UINT || kind == KVR_CLI_INT)
    snprintf(text, len, "%lld", (long long)d);
  else
    snprintf(text, len, "%.17g", d);
  return 0;
}

/* A JSON scalar as the text a flag would carry; *s points at it (text or the string's own). */
static int scalar_text(kvr_cli_kind_t kind, const cJSON *v, const char **s, char *text, size_t len,
                       const char *what, char *err, size_t errlen) {
  bool numeric = kind == KVR_CLI_UINT || kind == KVR_CLI_INT || kind == KVR_CLI_DOUBLE;
  *s = text;
  if (cJSON_IsString(v) && (numeric || kind == KVR_CLI_BOOL)) {
    snprintf(err, errlen, "%s: must be a %s, not a string", what,
             kind == KVR_CLI_BOOL ? "boolean" : "number");
    return KVR_EINVAL;
  }
  if (cJSON_IsString(v)) {
    *s = v->valuestring;
    return 0;
  }
  if (cJSON_IsBool(v) && kind == KVR_CLI_BOOL) {
    snprintf(text, len, "%s", cJSON_IsTrue(v) ? "true" : "false");
    return 0;
  }
  if (cJSON_IsNumber(v) && numeric)
    return number_text(kind, v, text, len, what, err, errlen);
  snprintf(err, errlen, "%s: must be a %s", what,
           numeric                ? "number"
           : kind == KVR_CLI_BOOL ? "boolean"
                                  : "string");
  return KVR_EINVAL;
}

/* An array: each item stored in turn as occurrence i, named "WHAT[i]" in messages. */
static int apply_array(const kvr_cli_opt_t *o, void *base, const cJSON *v, const char *what,
                       char *err, size_t errlen) {
  if (!cJSON_IsArray(v)) {
    snprintf(err, errlen, "%s: must be an array", what);
    return KVR_EINVAL;
  }
  unsigned i = 0;
  kvr_cli_kind_t kind = o->kind == KVR_CLI_LIST ? o->elem : KVR_CLI_STR;
  for (const cJSON *it = v->child; it; it = it->next, i++) {
    char w[240], text[64];
    const char *s;
    snprintf(w, sizeof w, "%s[%u]", what, i);
    if ((o->flags & KVR_CLI_JSON_RAW) && cJSON_IsObject(it)) {
      /* an element given as an object reaches the option's parser as its JSON text */
      char *raw = cJSON_PrintUnformatted(it);
      int rc = store(o, base, raw ? raw : "", i, w, err, errlen);
      cJSON_free(raw);
      if (rc != 0)
        return KVR_EINVAL;
      continue;
    }
    if (scalar_text(kind, it, &s, text, sizeof text, w, err, errlen) != 0 ||
        store(o, base, s, i, w, err, errlen) != 0)
      return KVR_EINVAL;
  }
  return 0;
}

static int apply_value(const kvr_cli_opt_t *o, void *base, const cJSON *v, const char *source,
                       char *err, size_t errlen) {
  char what[200], text[64];
  snprintf(what, sizeof what, "%s: %s", source, o->json);
  if (o->kind == KVR_CLI_LIST || (o->flags & KVR_CLI_JSON_LIST))
    return apply_array(o, base, v, what, err, errlen);
  if (o->flags & KVR_CLI_JSON_RAW) {
    char *raw = cJSON_PrintUnformatted(v);
    int rc = store(o, base, raw ? raw : "", 0, what, err, errlen);
    cJSON_free(raw);
    return rc;
  }
  const char *s;
  if (scalar_text(o->kind, v, &s, text, sizeof text, what, err, errlen) != 0)
    return KVR_EINVAL;
  return store(o, base, s, 0, what, err, errlen);
}

int kvr_cli_apply_json(const kvr_cli_cmd_t *cmd, void *base, const char *json, size_t len,
                       const char *source, char *err, size_t errlen) {
  cJSON *root = cJSON_ParseWithLength(json, len);
  if (root == NULL) {
    /* Where the parser stopped, as line:column (1-based; a column counts bytes). */
    const char *at = cJSON_GetErrorPtr();
    size_t pos = (at != NULL && at >= json && at <= json + len) ? (size_t)(at - json) : len;
    unsigned long line = 1, col = 1;
    for (size_t i = 0; i < pos; i++) {
      if (json[i] == '\n') {
        line++;
        col = 1;
      } else {
        col++;
      }
    }
    snprintf(err, errlen, "%s: line %lu, column %lu: invalid JSON", source, line, col);
    return KVR_EINVAL;
  }
  if (!cJSON_IsObject(root)) {
    snprintf(err, errlen, "%s: not a JSON object", source);
    cJSON_Delete(root);
    return KVR_EINVAL;
  }
  int rc = check_keys(cmd, root, "", source, err, errlen);
  for (size_t i = 0; rc == 0 && i < cmd->nopts; i++) {
    const kvr_cli_opt_t *o = &cmd->opts[i];
    const cJSON *v = o->json ? json_path(root, o->json) : NULL;
    if (v != NULL)
      rc = apply_value(o, base, v, source, err, errlen);
  }
  cJSON_Delete(root);
  return rc;
}

void kvr_cli_free(const kvr_cli_cmd_t *cmd, void *base) {
  for (size_t i = 0; i < cmd->nopts; i++) {
    const kvr_cli_opt_t *o = &cmd->opts[i];
    if (o->kind == KVR_CLI_LIST) {
      list_clear(o, base);
    } else if (o->kind == KVR_CLI_STR && (o->flags & KVR_CLI_OWNED)) {
      char **s = (char **)((char *)base + o->off);
      free(*s);
      *s = NULL;
    }
  }
}

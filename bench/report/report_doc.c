/* report_doc.c -- the document writer: the report's sections are written once, as blocks, and a
 * format's ops table (report_md.c, report_html.c) turns each block into its own syntax.
 *
 * Struct: kvr__doc_t (report_int.h) holds the format's ops, the output buffer, the paragraph or
 * cell text being built and the cells of the row being built (NUL-separated in one buffer, with
 * their offsets).
 *
 * Flow: kvr__doc_h() / kvr__doc_p() write a block at once; kvr__doc_printf() ... kvr__doc_p_end()
 * build a paragraph in pieces; kvr__doc_table() then kvr__doc_cell() ... kvr__doc_row_end() per
 * row, then kvr__doc_table_end(). Each finished block goes to the ops, which write to out.
 *
 * Inline marks: KVR__STRONG and KVR__CODE toggle emphasis and code; kvr__md_text() and
 * kvr__html_text() render them (Markdown fences a code span holding a backtick with two and escapes
 * "|" in table cells). Every text a section writes opens and closes its own marks, so
 * both renderers start each text with both marks off.
 *
 * Also here: kvr_report_shell_join(), the command line as words a POSIX shell reads back.
 *
 * Invariants: a row has at most KVR__DOC_MAX_CELLS cells (more are dropped); the writer owns only
 * its buffers (the text, the cells, its copy of the open table's rule).
 */
#include "report.h"
#include "report_int.h"

#include <string.h>

/* Appends fmt, formatted with the variadic arguments of the enclosing function, to buf. */
#define APPEND_VA(buf, fmt)                                                                        \
  do {                                                                                             \
    va_list ap;                                                                                    \
    va_start(ap, fmt);                                                                             \
    kvr_buf_vprintf(buf, fmt, ap);                                                                 \
    va_end(ap);                                                                                    \
  } while (0)

void kvr__doc_init(kvr__doc_t *d, const kvr__doc_ops_t *ops, kvr_buf_t *out) {
  memset(d, 0, sizeof(*d));
  d->ops = ops;
  d->out = out;
}

void kvr__doc_free(kvr__doc_t *d) {
  kvr_buf_free(&d->text);
  kvr_buf_free(&d->cells);
  kvr_buf_free(&d->rule_buf);
}

static const char *text_of(kvr__doc_t *d) {
  return d->text.data ? d->text.data : "";
}

void kvr__doc_h(kvr__doc_t *d, int level, const char *fmt, ...) {
  kvr_buf_reset(&d->text);
  APPEND_VA(&d->text, fmt);
  d->ops->heading(d, level, text_of(d));
  kvr_buf_reset(&d->text);
}

void kvr__doc_printf(kvr__doc_t *d, const char *fmt, ...) {
  APPEND_VA(&d->text, fmt);
}

void kvr__doc_p_end(kvr__doc_t *d) {
  d->ops->para(d, text_of(d));
  kvr_buf_reset(&d->text);
}

void kvr__doc_p(kvr__doc_t *d, const char *fmt, ...) {
  APPEND_VA(&d->text, fmt);
  kvr__doc_p_end(d);
}

void kvr__doc_table(kvr__doc_t *d, const char *rule) {
  kvr_buf_reset(&d->rule_buf);
  kvr_buf_puts(&d->rule_buf, rule);
  d->rule = d->rule_buf.data ? d->rule_buf.data : "";
  d->rows = 0;
  d->ncells = 0;
  kvr_buf_reset(&d->cells);
  d->ops->table_begin(d, rule);
}

void kvr__doc_cell(kvr__doc_t *d, const char *fmt, ...) {
  if (d->ncells == KVR__DOC_MAX_CELLS)
    return;
  d->cell_off[d->ncells++] = d->cells.len;
  APPEND_VA(&d->cells, fmt);
  kvr_buf_append(&d->cells, "", 1); /* the NUL that ends the cell */
}

void kvr__doc_row_end(kvr__doc_t *d) {
  const char *cells[KVR__DOC_MAX_CELLS];
  for (size_t i = 0; i < d->ncells; i++)
    cells[i] = d->cells.data + d->cell_off[i];
  d->ops->row(d, cells, d->ncells, d->rows == 0);
  d->rows++;
  d->ncells = 0;
  kvr_buf_reset(&d->cells);
}

void kvr__doc_table_end(kvr__doc_t *d) {
  d->ops->table_end(d);
  d->rule = NULL;
}

/* Whether the code span opening after p (up to its closing mark) holds a backtick. */
static bool code_has_backtick(const char *p) {
  for (; *p && *p != KVR__CODE[0]; p++)
    if (*p == '`')
      return true;
  return false;
}

void kvr__md_text(kvr_buf_t *out, const char *text) {
  kvr__md_text_cell(out, text, false);
}

void kvr__md_text_cell(kvr_buf_t *out, const char *text, bool cell) {
  bool code = false, fence = false;
  for (const char *p = text; *p; p++) {
    if (*p == KVR__STRONG[0]) {
      kvr_buf_puts(out, "**");
    } else if (*p == KVR__CODE[0]) {
      /* A code span holding a backtick is fenced by two, with spaces (CommonMark). */
      if (!code)
        fence = code_has_backtick(p + 1);
      kvr_buf_puts(out, fence ? (code ? " ``" : "`` ") : "`");
      code = !code;
    } else if (cell && *p == '|') {
      kvr_buf_puts(out, "\\|"); /* a pipe would end the table cell, in code spans too (GFM) */
    } else {
      kvr_buf_append(out, p, 1);
    }
  }
}

static void html_char(kvr_buf_t *out, char c) {
  static const char special[] = "&<>\"";
  static const char *const entity[] = {"&amp;", "&lt;", "&gt;", "&quot;"};
  const char *k = c ? strchr(special, c) : NULL;
  if (k != NULL)
    kvr_buf_puts(out, entity[k - special]);
  else
    kvr_buf_append(out, &c, 1);
}

void kvr__html_text(kvr_buf_t *out, const char *text) {
  bool strong = false, code = false;
  for (const char *p = text; *p; p++) {
    if (*p == KVR__STRONG[0]) {
      kvr_buf_puts(out, strong ? "</strong>" : "<strong>");
      strong = !strong;
    } else if (*p == KVR__CODE[0]) {
      kvr_buf_puts(out, code ? "</code>" : "<code>");
      code = !code;
    } else {
      html_char(out, *p);
    }
  }
  /* A text that left a mark open still yields well-formed HTML. */
  if (code)
    kvr_buf_puts(out, "</code>");
  if (strong)
    kvr_buf_puts(out, "</strong>");
}

/* ---- shell quoting --------------------------------------------------------------------------- */

static bool shell_safe(const char *w) {
  if (*w == '\0')
    return false;
  for (const char *p = w; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          strchr("_@%+=:,./-", *p) != NULL))
      return false;
  return true;
}

void kvr_report_shell_join(int argc, char **argv, kvr_buf_t *out) {
  kvr_buf_puts(out, "kvrouter");
  for (int i = 0; i < argc; i++) {
    const char *w = argv[i] ? argv[i] : "";
    kvr_buf_puts(out, " ");
    if (shell_safe(w)) {
      kvr_buf_puts(out, w);
      continue;
    }
    kvr_buf_puts(out, "'");
    for (const char *p = w; *p; p++)
      if (*p == '\'')
        kvr_buf_puts(out, "'\\''");
      else
        kvr_buf_append(out, p, 1);
    kvr_buf_puts(out, "'");
  }
}

/* report_md.c -- the Markdown report: the document writer's blocks in Markdown syntax.
 *
 * Structs: only md_ops, the Markdown ops table of the document writer (report_int.h).
 *
 * Flow: kvr_report_markdown() -> kvr__report_head() and kvr__report_body() (report_sections.c)
 * write blocks -> md_* below append them to the output.
 *
 * Syntax: blocks are separated by one blank line (none after the last), a heading is "#"s and its
 * text, a paragraph its text on one line, a table one "| a | b |" line per row with the table's
 * alignment rule after the header. Inline marks become "**" and "`".
 */
#include "report.h"
#include "report_int.h"

static void separate(kvr__doc_t *d) {
  if (d->started)
    kvr_buf_puts(d->out, "\n");
  d->started = true;
}

static void md_heading(kvr__doc_t *d, int level, const char *text) {
  separate(d);
  kvr_buf_puts(d->out, level == 1 ? "# " : "## ");
  kvr__md_text(d->out, text);
  kvr_buf_puts(d->out, "\n");
}

static void md_para(kvr__doc_t *d, const char *text) {
  separate(d);
  kvr__md_text(d->out, text);
  kvr_buf_puts(d->out, "\n");
}

static void md_table_begin(kvr__doc_t *d, const char *rule) {
  (void)rule;
  separate(d);
}

static void md_row(kvr__doc_t *d, const char *const *cells, size_t n, bool header) {
  kvr_buf_puts(d->out, "|");
  for (size_t i = 0; i < n; i++) {
    kvr_buf_puts(d->out, " ");
    kvr__md_text_cell(d->out, cells[i], true);
    kvr_buf_puts(d->out, " |");
  }
  kvr_buf_puts(d->out, "\n");
  if (header)
    kvr_buf_printf(d->out, "%s\n", d->rule);
}

static void md_table_end(kvr__doc_t *d) {
  (void)d;
}

static const kvr__doc_ops_t md_ops = {md_heading, md_para, md_table_begin, md_row, md_table_end};

void kvr_report_markdown(const kvr_results_t *res, kvr_buf_t *out) {
  kvr__doc_t d;
  kvr__doc_init(&d, &md_ops, out);
  kvr__report_head(res, &d);
  kvr__report_body(res, &d);
  kvr__doc_free(&d);
}

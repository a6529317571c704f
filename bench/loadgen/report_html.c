/* report_html.c -- the HTML report: one self-contained page with SVG charts and every table of the
 * report, written directly (the document writer's blocks as HTML elements; no Markdown parsed).
 *
 * Structs: html_ops, the HTML ops table of the document writer (report_int.h); axis_t, the
 * scale of one line chart (its data maxima rounded to a "nice" number, and the plot area).
 *
 * Flow: kvr_report_html() -> page head -> kvr__report_head() (title, generation time) -> the four
 * charts: TTFT p99 and TPOT p99 vs load per label with the SLO line, output throughput vs load,
 * and the share of requests per worker at the detailed comparison's load -> kvr__report_body()
 * (report_sections.c) for the tables and sentences -> page end.
 *
 * Invariants: every text from the results (labels, titles, worker names) is HTML-escaped; chart
 * points above the axis maximum are drawn at the maximum (the tooltip keeps the value).
 */
#include "report_int.h"

#include "src/kvr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- blocks ---------------------------------------------------------------------------------- */

static void html_heading(kvr__doc_t *d, int level, const char *text) {
  kvr_buf_printf(d->out, "<h%d>", level);
  kvr__html_text(d->out, text);
  kvr_buf_printf(d->out, "</h%d>\n", level);
}

static void html_para(kvr__doc_t *d, const char *text) {
  kvr_buf_puts(d->out, "<p>");
  kvr__html_text(d->out, text);
  kvr_buf_puts(d->out, "</p>\n");
}

static void html_table_begin(kvr__doc_t *d, const char *rule) {
  (void)rule;
  kvr_buf_puts(d->out, "<table>\n");
}

static void html_row(kvr__doc_t *d, const char *const *cells, size_t n, bool header) {
  kvr_buf_puts(d->out, "<tr>");
  for (size_t i = 0; i < n; i++) {
    kvr_buf_puts(d->out, header ? "<th>" : "<td>");
    kvr__html_text(d->out, cells[i]);
    kvr_buf_puts(d->out, header ? "</th>" : "</td>");
  }
  kvr_buf_puts(d->out, "</tr>\n");
}

static void html_table_end(kvr__doc_t *d) {
  kvr_buf_puts(d->out, "</table>\n");
}

static const kvr__doc_ops_t html_ops = {html_heading, html_para, html_table_begin, html_row,
                                        html_table_end};

/* ---- charts ---------------------------------------------------------------------------------- */

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

#define CW 640
#define CH 360
#define ML 70
#define MR 150
#define MT 40
#define MB 50
#define PW ((double)(CW - ML - MR))
#define PH ((double)(CH - MT - MB))

typedef struct axis_s {
  double xmax, ymax;
} axis_t;

static double ax_x(const axis_t *ax, double v) {
  return ML + v / ax->xmax * PW;
}

static double ax_y(const axis_t *ax, double v) {
  return MT + PH - v / ax->ymax * PH;
}

/* A "nice" axis maximum: 1, 2, 2.5 or 5 times a power of ten at or above v. */
static double nice_max(double v) {
  if (v <= 0)
    return 1;
  double p = pow(10, floor(log10(v)));
  static const double steps[] = {1, 2, 2.5, 5, 10};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(steps); i++)
    if (steps[i] * p >= v)
      return steps[i] * p;
  return 10 * p;
}

static void svg_open(kvr_buf_t *out, const char *id, const char *title) {
  kvr_buf_printf(out,
                 "<figure><svg class=\"chart\" id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" "
                 "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n<title>",
                 id, CW, CH, CW, CH);
  kvr__html_text(out, title);
  kvr_buf_printf(out, "</title>\n<text x=\"%d\" y=\"22\" class=\"title\">", ML);
  kvr__html_text(out, title);
  kvr_buf_puts(out, "</text>\n");
}

/* A legend entry at slot k of the right margin. */
static void legend(kvr_buf_t *out, size_t k, const char *color, const char *name) {
  kvr_buf_printf(out,
                 "<rect x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                 "<text class=\"legend\" x=\"%.1f\" y=\"%.1f\">",
                 ML + PW + 16, MT + 20.0 * (double)k, color, ML + PW + 34,
                 MT + 20.0 * (double)k + 10);
  kvr__html_text(out, name);
  kvr_buf_puts(out, "</text>");
}

static axis_t line_axis(const kvr_results_t *res, const double *loads, size_t nloads,
                        const kvr__metric_t *m, double slo) {
  axis_t ax = {0, slo > 0 ? slo * 1.1 : 0};
  for (size_t i = 0; i < nloads; i++)
    ax.xmax = fmax(ax.xmax, loads[i]);
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      if (m->valid(res->runs[r].levels[i]))
        ax.ymax = fmax(ax.ymax, m->get(res->runs[r].levels[i]));
  ax.xmax = nice_max(ax.xmax);
  ax.ymax = nice_max(ax.ymax);
  return ax;
}

/* Grid, ticks, axes, axis labels and the dashed SLO line (slo > 0). */
static void line_frame(const kvr_results_t *res, const axis_t *ax, const char *ylabel, double slo,
                       kvr_buf_t *out) {
  for (int t = 0; t <= 5; t++) {
    double yv = ax->ymax * t / 5, xv = ax->xmax * t / 5;
    kvr_buf_printf(out,
                   "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                   ML, ax_y(ax, yv), ML + PW, ax_y(ax, yv), ML - 6, ax_y(ax, yv) + 4, yv);
    kvr_buf_printf(out,
                   "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                   ax_x(ax, xv), MT + PH + 18, xv);
  }
  kvr_buf_printf(out,
                 "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%.1f\"/>"
                 "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                 ML, MT, ML, MT + PH, ML, MT + PH, ML + PW, MT + PH);
  kvr_buf_printf(out,
                 "<text class=\"label\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s (%s)</text>\n"
                 "<text class=\"label\" transform=\"translate(16 %.1f) rotate(-90)\" "
                 "text-anchor=\"middle\">%s</text>\n",
                 ML + PW / 2, CH - 10, res->concurrency_mode ? "users" : "target rate",
                 kvr__load_unit(res), MT + PH / 2, ylabel);
  if (slo > 0)
    kvr_buf_printf(
        out,
        "<line class=\"slo\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"#d00\" stroke-dasharray=\"6 4\"/>"
        "<text class=\"slo-label\" x=\"%.1f\" y=\"%.1f\" fill=\"#d00\">SLO %g ms</text>\n",
        ML, ax_y(ax, slo), ML + PW, ax_y(ax, slo), ML + PW - 80, ax_y(ax, slo) - 5, slo);
}

/* One run's polyline, a circle with a tooltip per level, and its legend entry. */
static void line_series(const kvr_run_t *run, size_t r, const double *loads, size_t nloads,
                        const axis_t *ax, const kvr__metric_t *m, kvr_buf_t *out) {
  const char *color = palette[r % KVR_ARRAY_SIZE(palette)];
  kvr_buf_puts(out, "<g class=\"series\" data-label=\"");
  kvr__html_text(out, run->label);
  kvr_buf_printf(out, "\"><polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                 color);
  for (size_t i = 0; i < nloads; i++) {
    const kvr_level_t *lv = kvr__find_load(run, loads[i]);
    if (lv && m->valid(lv))
      kvr_buf_printf(out, "%.1f,%.1f ", ax_x(ax, loads[i]), ax_y(ax, fmin(m->get(lv), ax->ymax)));
  }
  kvr_buf_puts(out, "\"/>");
  for (size_t i = 0; i < nloads; i++) {
    const kvr_level_t *lv = kvr__find_load(run, loads[i]);
    if (lv && m->valid(lv))
      kvr_buf_printf(out,
                     "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%g: %.1f</title>"
                     "</circle>",
                     ax_x(ax, loads[i]), ax_y(ax, fmin(m->get(lv), ax->ymax)), color, loads[i],
                     m->get(lv));
  }
  legend(out, r, color, run->label);
  kvr_buf_puts(out, "</g>\n");
}

/* A metric vs load, one line per run, with the SLO line when slo > 0. */
static void line_chart(const kvr_results_t *res, kvr_buf_t *out, const char *id, const char *title,
                       const char *ylabel, const kvr__metric_t *m, double slo) {
  size_t nloads = 0;
  double *loads = kvr__all_loads(res, &nloads);
  axis_t ax = line_axis(res, loads, nloads, m, slo);
  svg_open(out, id, title);
  line_frame(res, &ax, ylabel, slo, out);
  for (size_t r = 0; r < res->nruns; r++)
    line_series(&res->runs[r], r, loads, nloads, &ax, m, out);
  kvr_buf_puts(out, "</svg></figure>\n");
  free(loads);
}

/* One group of bars (a run's share per worker) with the run's label under it. */
static void share_group(const kvr_run_t *run, size_t r, double dl, size_t groups,
                        char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX], size_t nnames,
                        kvr_buf_t *out) {
  double gw = PW / (double)groups;
  double bw = nnames ? (gw * 0.8) / (double)nnames : 0;
  double gx = ML + gw * (double)r + gw * 0.1;
  const kvr_level_t *lv = kvr__find_load(run, dl);
  for (size_t k = 0; lv && lv->measured && k < nnames; k++) {
    double share = (double)kvr__worker_count(lv, names[k]) / (double)lv->measured;
    kvr_buf_printf(out,
                   "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"%s\"><title>",
                   gx + bw * (double)k, MT + PH - share * PH, bw * 0.9, share * PH,
                   palette[k % KVR_ARRAY_SIZE(palette)]);
    kvr__html_text(out, names[k][0] ? names[k] : "(no header)");
    kvr_buf_printf(out, ": %.1f%%</title></rect>\n", share * 100);
  }
  kvr_buf_printf(out, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                 ML + gw * (double)r + gw / 2, MT + PH + 18);
  kvr__html_text(out, run->label);
  kvr_buf_puts(out, "</text>\n");
}

/* Bars of each run's share of requests per worker at the detailed comparison's load. */
static void share_chart(const kvr_results_t *res, kvr_buf_t *out) {
  double dl;
  char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX];
  size_t nnames;
  if (!kvr__detail_workers(res, &dl, names, &nnames))
    return;
  char a[32], title[96];
  kvr__fmt_load(res, dl, a, sizeof(a));
  snprintf(title, sizeof(title), "Share of requests per worker at %s %s", a, kvr__load_unit(res));
  svg_open(out, "worker-share", title);
  for (int t = 0; t <= 4; t++) {
    double y = MT + PH - PH * t / 4.0;
    kvr_buf_printf(out,
                   "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                   ML, y, ML + PW, y, ML - 6, y + 4, t * 25);
  }
  for (size_t r = 0; r < res->nruns; r++)
    share_group(&res->runs[r], r, dl, res->nruns, names, nnames, out);
  for (size_t k = 0; k < nnames; k++) {
    legend(out, k, palette[k % KVR_ARRAY_SIZE(palette)], names[k][0] ? names[k] : "(no header)");
    kvr_buf_puts(out, "\n");
  }
  kvr_buf_printf(out, "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", ML,
                 MT + PH, ML + PW, MT + PH);
  kvr_buf_puts(out, "</svg></figure>\n");
}

/* ---- the page -------------------------------------------------------------------------------- */

static void page_head(const kvr_results_t *res, kvr_buf_t *out) {
  kvr_buf_puts(out, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
  kvr_buf_t title = KVR_BUF_INIT;
  kvr_report_title(res, &title);
  kvr__html_text(out, title.data);
  kvr_buf_free(&title);
  kvr_buf_puts(out,
               "</title>\n<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;"
               "color:#222}table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid "
               "#ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}figure{display:inline-"
               "block;margin:0.5em}svg .grid{stroke:#eee}svg .axis{stroke:#444}svg text{font-size:"
               "12px}svg .title{font-size:14px;font-weight:bold}</style></head><body>\n");
}

void kvr_report_html(const kvr_results_t *res, kvr_buf_t *out) {
  kvr__doc_t d;
  kvr__doc_init(&d, &html_ops, out);
  page_head(res, out);
  kvr__report_head(res, &d);
  kvr__doc_h(&d, 2, "Charts");
  line_chart(res, out, "ttft-p99", "TTFT p99 vs load", "TTFT p99 (ms)", &kvr__per_load_metrics[0],
             res->slo.ttft_p99_ms);
  line_chart(res, out, "tpot-p99", "TPOT p99 vs load", "TPOT p99 (ms)", &kvr__per_load_metrics[1],
             res->slo.tpot_p99_ms);
  line_chart(res, out, "throughput", "Output throughput vs load", "output tok/s",
             &kvr__per_load_metrics[2], -1);
  share_chart(res, out);
  kvr__report_body(res, &d);
  kvr_buf_puts(out, "</body></html>\n");
  kvr__doc_free(&d);
}

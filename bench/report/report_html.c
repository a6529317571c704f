/* report_html.c -- the HTML report: one self-contained page with SVG charts and every table of the
 * report, written directly (the document writer's blocks as HTML elements; no Markdown parsed).
 *
 * Structs: html_ops, the HTML ops table of the document writer (report_int.h); scale_t, one axis
 * (the data's range rounded out to nice ticks, linear or log10); axis_t, a line chart's two.
 *
 * Flow: kvr_report_html() -> page head -> kvr__report_head() (title, generation time) -> the four
 * charts: TTFT p99 and TPOT p99 vs load per label with the SLO line, output throughput vs load,
 * and the share of requests per worker at the detailed comparison's load -> kvr__report_body()
 * (report_sections.c) for the tables and sentences -> page end.
 *
 * Invariants: every text from the results (labels, titles, worker names) is HTML-escaped; table
 * cells take their alignment from the table's Markdown rule (numbers right, text left); the axes
 * cover every point drawn (none is clipped), and the SLO widens the y axis only when it is within
 * SLO_REACH of the data (else it is named above the plot); legends and tooltips name the run as
 * "label (policy)", and tooltips give the figure's n.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

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

/* The alignment of column i from the table's Markdown rule: "---:" right (numbers), ":-:" center,
 * anything else left. Returns the cell's attribute, "" for left. */
static const char *align_attr(const char *rule, size_t i) {
  const char *p = rule ? rule : "";
  if (*p == '|')
    p++;
  for (size_t k = 0; k < i && *p; k++) {
    p = strchr(p, '|');
    if (p == NULL)
      return "";
    p++;
  }
  size_t len = strcspn(p, "|");
  if (len == 0)
    return "";
  bool left = p[0] == ':', right = p[len - 1] == ':';
  return right && left ? " class=\"c\"" : right ? " class=\"num\"" : "";
}

static void html_row(kvr__doc_t *d, const char *const *cells, size_t n, bool header) {
  kvr_buf_puts(d->out, "<tr>");
  for (size_t i = 0; i < n; i++) {
    kvr_buf_printf(d->out, "<%s%s>", header ? "th" : "td", align_attr(d->rule, i));
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

#define CW 680
#define CH 360
#define ML 70
#define MR 190
#define MT 40
#define MB 50
#define PW ((double)(CW - ML - MR))
#define PH ((double)(CH - MT - MB))

#define MAX_TICKS 16
/* A log y axis when every value is positive and the largest is this many times the smallest. */
#define LOG_RATIO 30.0
/* The SLO line widens the y axis only up to this many times the data's maximum; a higher SLO is
 * named above the plot instead of flattening the data. */
#define SLO_REACH 1.5

/* One axis: the data range [lo, hi] rounded out to nice ticks, linear or log10. */
typedef struct scale_s {
  double lo, hi;
  bool log;
  double ticks[MAX_TICKS];
  size_t nticks;
} scale_t;

typedef struct axis_s {
  scale_t x, y;
} axis_t;

/* The position of v on the scale, 0 at lo and 1 at hi. */
static double frac(const scale_t *s, double v) {
  if (s->log)
    return (log10(v) - log10(s->lo)) / (log10(s->hi) - log10(s->lo));
  return (v - s->lo) / (s->hi - s->lo);
}

static double ax_x(const axis_t *ax, double v) {
  return ML + frac(&ax->x, v) * PW;
}

static double ax_y(const axis_t *ax, double v) {
  return MT + PH - frac(&ax->y, v) * PH;
}

/* A "nice" step: 1, 2, 2.5 or 5 times a power of ten, at or above v (> 0). */
static double nice_step(double v) {
  double p = pow(10, floor(log10(v)));
  static const double steps[] = {1, 2, 2.5, 5, 10};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(steps); i++)
    if (steps[i] * p >= v * (1 - 1e-9))
      return steps[i] * p;
  return 10 * p;
}

/* A linear scale over [lo, hi] with 4 to 8 nice steps, the count that wastes least room; from zero
 * when zero_ok and lo is within half the range of it (a range far from zero starts near its
 * minimum instead). */
static scale_t linear_scale(double lo, double hi, bool zero_ok) {
  scale_t s = {0};
  if (!(hi >= lo)) /* no data */
    lo = 0, hi = 1;
  if (zero_ok && lo >= 0 && lo <= hi / 2)
    lo = 0;
  if (hi - lo < 1e-9 * fmax(1, fabs(hi))) { /* one value: a range around it */
    double pad = hi != 0 ? fabs(hi) * 0.5 : 1;
    lo = zero_ok && hi > 0 ? 0 : hi - pad;
    hi = hi + pad;
  }
  double step = 0;
  for (int n = 4; n <= 8; n++) {
    double st = nice_step((hi - lo) / n);
    double span = (ceil(hi / st - 1e-9) - floor(lo / st + 1e-9)) * st;
    if (step == 0 || span < (s.hi - s.lo) * (1 - 1e-9)) {
      step = st;
      s.lo = floor(lo / st + 1e-9) * st;
      s.hi = s.lo + span;
    }
  }
  for (double t = s.lo; t <= s.hi + step * 1e-6 && s.nticks < MAX_TICKS; t += step)
    s.ticks[s.nticks++] = fabs(t) < step * 1e-9 ? 0 : t;
  return s;
}

/* The 1-2-5 sequence value at or below (down) or at or above (!down) v > 0. */
static double step125(double v, bool down) {
  double p = pow(10, floor(log10(v)));
  static const double m[] = {1, 2, 5, 10};
  if (down) {
    for (size_t i = KVR_ARRAY_SIZE(m); i-- > 0;)
      if (m[i] * p <= v * (1 + 1e-9))
        return m[i] * p;
    return p;
  }
  for (size_t i = 0; i < KVR_ARRAY_SIZE(m); i++)
    if (m[i] * p >= v * (1 - 1e-9))
      return m[i] * p;
  return 10 * p;
}

/* A log10 scale over [lo, hi] (both > 0), bounded by 1-2-5 values; ticks at 1, 2, 5 x 10^k over
 * up to three decades, else at the powers of ten. */
static scale_t log_scale(double lo, double hi) {
  scale_t s = {0};
  s.log = true;
  s.lo = step125(lo, true);
  s.hi = step125(hi, false);
  bool fine = log10(s.hi / s.lo) <= 3;
  for (double p = pow(10, floor(log10(s.lo))); p <= s.hi * (1 + 1e-9); p *= 10) {
    static const double m[] = {1, 2, 5};
    for (size_t i = 0; i < (fine ? 3u : 1u); i++) {
      double t = m[i] * p;
      if (t >= s.lo * (1 - 1e-9) && t <= s.hi * (1 + 1e-9) && s.nticks < MAX_TICKS)
        s.ticks[s.nticks++] = t;
    }
  }
  return s;
}

/* Where the SLO line of a chart went. */
typedef enum { SLO_NONE, SLO_LINE, SLO_ABOVE, SLO_BELOW } slo_at_t;

/* The axes of a metric vs load chart: x over the loads, y over every valid figure (a log scale when
 * they span LOG_RATIO or more), widened to the SLO when it is within SLO_REACH of the data. */
static axis_t line_axis(const kvr_results_t *res, const double *loads, size_t nloads,
                        const kvr__metric_t *m, double slo, bool log_ok, slo_at_t *at) {
  axis_t ax;
  double ylo = INFINITY, yhi = -INFINITY;
  for (size_t r = 0; r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      if (m->valid(res->runs[r].levels[i])) {
        double v = m->get(res->runs[r].levels[i]);
        ylo = fmin(ylo, v);
        yhi = fmax(yhi, v);
      }
  ax.x = linear_scale(nloads ? loads[0] : 0, nloads ? loads[nloads - 1] : 1, true);
  *at = slo > 0 ? SLO_LINE : SLO_NONE;
  bool data = yhi >= ylo;
  bool log = log_ok && data && ylo > 0 && yhi / ylo >= LOG_RATIO;
  if (slo > 0 && data && slo > yhi * SLO_REACH)
    *at = SLO_ABOVE;
  else if (slo > 0 && data && log && slo < ylo / SLO_REACH)
    *at = SLO_BELOW;
  else if (slo > 0) /* the line is drawn: the axis reaches it */
    ylo = fmin(data ? ylo : slo, slo), yhi = fmax(data ? yhi : slo, slo);
  ax.y = log ? log_scale(ylo, yhi) : linear_scale(ylo, yhi, true);
  return ax;
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

/* Grid, ticks, axes, axis labels and the dashed SLO line (or its note when off the plot). */
static void line_frame(const kvr_results_t *res, const axis_t *ax, const char *ylabel, double slo,
                       slo_at_t at, kvr_buf_t *out) {
  for (size_t t = 0; t < ax->y.nticks; t++) {
    double yv = ax->y.ticks[t];
    kvr_buf_printf(out,
                   "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                   ML, ax_y(ax, yv), ML + PW, ax_y(ax, yv), ML - 6, ax_y(ax, yv) + 4, yv);
  }
  for (size_t t = 0; t < ax->x.nticks; t++)
    kvr_buf_printf(out,
                   "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                   ax_x(ax, ax->x.ticks[t]), MT + PH + 18, ax->x.ticks[t]);
  kvr_buf_printf(out,
                 "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%.1f\"/>"
                 "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                 ML, MT, ML, MT + PH, ML, MT + PH, ML + PW, MT + PH);
  kvr_buf_printf(out,
                 "<text class=\"label\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s (%s)</text>\n"
                 "<text class=\"label\" transform=\"translate(16 %.1f) rotate(-90)\" "
                 "text-anchor=\"middle\">%s%s</text>\n",
                 ML + PW / 2, CH - 10, res->concurrency_mode ? "users" : "target rate",
                 kvr__load_unit(res), MT + PH / 2, ylabel, ax->y.log ? ", log scale" : "");
  if (at == SLO_LINE)
    kvr_buf_printf(
        out,
        "<line class=\"slo\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
        "stroke=\"#d00\" stroke-dasharray=\"6 4\"/>"
        "<text class=\"slo-label\" x=\"%.1f\" y=\"%.1f\" fill=\"#d00\">SLO %g ms</text>\n",
        ML, ax_y(ax, slo), ML + PW, ax_y(ax, slo), ML + PW - 80, ax_y(ax, slo) - 5, slo);
  else if (at != SLO_NONE)
    kvr_buf_printf(out,
                   "<text class=\"slo-label\" x=\"%.1f\" y=\"%d\" fill=\"#d00\" "
                   "text-anchor=\"end\">SLO %g ms (%s the plot)</text>\n",
                   ML + PW, MT - 6, slo, at == SLO_ABOVE ? "above" : "below");
}

/* One run's polyline, a circle with a tooltip per level (load, figure, n), and its legend entry
 * naming the label and the policy. */
static void line_series(const kvr_results_t *res, size_t r, const double *loads, size_t nloads,
                        const axis_t *ax, const kvr__metric_t *m, const char *unit,
                        kvr_buf_t *out) {
  const kvr_run_t *run = &res->runs[r];
  const char *color = palette[r % KVR_ARRAY_SIZE(palette)];
  char name[160];
  kvr__run_name(run, name, sizeof(name));
  kvr_buf_puts(out, "<g class=\"series\" data-label=\"");
  kvr__html_text(out, run->label);
  kvr_buf_printf(out, "\"><polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                 color);
  for (size_t i = 0; i < nloads; i++) {
    const kvr_level_t *lv = kvr__find_load(run, loads[i]);
    if (lv && m->valid(lv))
      kvr_buf_printf(out, "%.1f,%.1f ", ax_x(ax, loads[i]), ax_y(ax, m->get(lv)));
  }
  kvr_buf_puts(out, "\"/>");
  for (size_t i = 0; i < nloads; i++) {
    const kvr_level_t *lv = kvr__find_load(run, loads[i]);
    if (lv == NULL || !m->valid(lv))
      continue;
    char a[32], v[64];
    kvr__fmt_load(res, loads[i], a, sizeof(a));
    snprintf(v, sizeof(v), m->fmt, m->get(lv));
    kvr_buf_printf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>",
                   ax_x(ax, loads[i]), ax_y(ax, m->get(lv)), color);
    kvr__html_text(out, name);
    kvr_buf_printf(out, " at %s %s: %s%s%s", a, kvr__load_unit(res), v, unit[0] ? " " : "", unit);
    if (m->count)
      kvr_buf_printf(out, " (n=%zu)", m->count(lv));
    kvr_buf_puts(out, "</title></circle>");
  }
  legend(out, r, color, name);
  kvr_buf_puts(out, "</g>\n");
}

/* A metric vs load, one line per run, with the SLO line when slo > 0; log_ok lets the y axis go
 * logarithmic when the figures span LOG_RATIO or more. */
static void line_chart(const kvr_results_t *res, kvr_buf_t *out, const char *id, const char *title,
                       const char *ylabel, const char *unit, const kvr__metric_t *m, double slo,
                       bool log_ok) {
  size_t nloads = 0;
  double *loads = kvr__all_loads(res, &nloads);
  slo_at_t at;
  axis_t ax = line_axis(res, loads, nloads, m, slo, log_ok, &at);
  svg_open(out, id, title);
  line_frame(res, &ax, ylabel, slo, at, out);
  for (size_t r = 0; r < res->nruns; r++)
    line_series(res, r, loads, nloads, &ax, m, unit, out);
  kvr_buf_puts(out, "</svg></figure>\n");
  free(loads);
}

/* One group of bars (a run's share per worker) with the run's label under it. */
static void share_group(const kvr_run_t *run, size_t r, double dl, size_t groups,
                        char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX], size_t nnames,
                        double ymax, kvr_buf_t *out) {
  double gw = PW / (double)groups;
  double bw = nnames ? (gw * 0.8) / (double)nnames : 0;
  double gx = ML + gw * (double)r + gw * 0.1;
  const kvr_level_t *lv = kvr__find_load(run, dl);
  for (size_t k = 0; lv && lv->measured && k < nnames; k++) {
    double share = (double)kvr__worker_count(lv, names[k]) / (double)lv->measured;
    kvr_buf_printf(out,
                   "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                   "fill=\"%s\"><title>",
                   gx + bw * (double)k, MT + PH - share / ymax * PH, bw * 0.9, share / ymax * PH,
                   palette[k % KVR_ARRAY_SIZE(palette)]);
    char name[160];
    kvr__run_name(run, name, sizeof(name));
    kvr__html_text(out, name);
    kvr_buf_puts(out, ", ");
    kvr__html_text(out, names[k][0] ? names[k] : "(no header)");
    kvr_buf_printf(out, ": %.1f%% (%zu of n=%zu)</title></rect>\n", share * 100,
                   kvr__worker_count(lv, names[k]), lv->measured);
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
  /* The y axis fits the largest share (in %), not always 100%. */
  double top = 0;
  for (size_t r = 0; r < res->nruns; r++) {
    const kvr_level_t *lv = kvr__find_load(&res->runs[r], dl);
    for (size_t k = 0; lv && lv->measured && k < nnames; k++)
      top = fmax(top, 100.0 * (double)kvr__worker_count(lv, names[k]) / (double)lv->measured);
  }
  scale_t ys = linear_scale(0, fmin(top > 0 ? top : 100, 100), true);
  for (size_t t = 0; t < ys.nticks; t++) {
    double y = MT + PH - PH * ys.ticks[t] / ys.hi;
    kvr_buf_printf(out,
                   "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                   "<text class=\"tick\" x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g%%</text>\n",
                   ML, y, ML + PW, y, ML - 6, y + 4, ys.ticks[t]);
  }
  for (size_t r = 0; r < res->nruns; r++)
    share_group(&res->runs[r], r, dl, res->nruns, names, nnames, ys.hi / 100, out);
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
               "color:#222;text-align:left}p,li{text-align:left;line-height:1.45}"
               "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;"
               "padding:3px 8px;text-align:left;vertical-align:top}td.num,th.num{text-align:right;"
               "font-variant-numeric:tabular-nums}td.c,th.c{text-align:center}th{background:"
               "#f3f3f3}code{background:#f3f3f3;padding:0 3px;border-radius:3px}figure{display:"
               "inline-block;margin:0.5em}svg .grid{stroke:#eee}svg .axis{stroke:#444}svg text{"
               "font-size:12px}svg .title{font-size:14px;font-weight:bold}</style></head><body>\n");
}

void kvr_report_html(const kvr_results_t *res, kvr_buf_t *out) {
  kvr__doc_t d;
  kvr__doc_init(&d, &html_ops, out);
  page_head(res, out);
  kvr__report_head(res, &d);
  kvr__doc_h(&d, 2, "Charts");
  line_chart(res, out, "ttft-p99", "TTFT p99 vs load", "TTFT p99 (ms)", "ms",
             &kvr__per_load_metrics[0], res->slo.ttft_p99_ms, true);
  line_chart(res, out, "tpot-p99", "TPOT p99 vs load", "TPOT p99 (ms)", "ms",
             &kvr__per_load_metrics[1], res->slo.tpot_p99_ms, true);
  line_chart(res, out, "throughput", "Output throughput vs load", "output tok/s", "tok/s",
             &kvr__per_load_metrics[2], -1, false);
  share_chart(res, out);
  kvr__report_body(res, &d);
  kvr_buf_puts(out, "</body></html>\n");
  kvr__doc_free(&d);
}

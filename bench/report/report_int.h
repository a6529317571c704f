/* report_int.h -- internals shared by the report modules (report*.c); not part of the API.
 *
 * Two things live here:
 *
 * 1. The document writer (report_doc.c). The report's sections (report_sections.c, with the
 *    concluding sentences from report_verdicts.c) are written once, as blocks -- headings,
 *    paragraphs, tables of cells -- into a kvr__doc_t; the doc's ops table decides the format:
 *    report_md.c renders Markdown, report_html.c renders HTML directly (no Markdown is ever
 *    parsed). Text may carry two inline marks, KVR__STRONG and KVR__CODE, each toggling emphasis
 *    or code on and off; a format renders them ("**", "`" or <strong>, <code>) and escapes
 *    everything else as it needs.
 *
 * 2. The shared views of the results (report.c): loads and their formatting, capacities and gains
 *    as text, the metric tables (title, format, accessor, validity) used by the tables and the
 *    charts, the worker names at a load, and the load of the detailed comparison.
 */
#ifndef KVR_REPORT_INT_H
#define KVR_REPORT_INT_H

#include "base/buf.h"
#include "bench/loadgen/stats.h"
#include "report_types.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#define KVR__DASH "\xe2\x80\x94" /* em dash, as in the team's reports */
#define KVR__STRONG "\x01"       /* toggles strong emphasis in document text */
#define KVR__CODE "\x02"         /* toggles code in document text */

/* ---- the document writer (report_doc.c) ------------------------------------------------------ */

typedef struct kvr__doc_s kvr__doc_t;

/* How one format writes blocks. Text arguments carry the inline marks; cells are n strings. */
typedef struct kvr__doc_ops_s {
  void (*heading)(kvr__doc_t *d, int level, const char *text);
  void (*para)(kvr__doc_t *d, const char *text);
  /* rule: the Markdown alignment row of the table ("|---|---:|"), which other formats ignore */
  void (*table_begin)(kvr__doc_t *d, const char *rule);
  void (*row)(kvr__doc_t *d, const char *const *cells, size_t n, bool header);
  void (*table_end)(kvr__doc_t *d);
} kvr__doc_ops_t;

#define KVR__DOC_MAX_CELLS 72 /* a label column plus up to 71 runs */

struct kvr__doc_s {
  const kvr__doc_ops_t *ops;
  kvr_buf_t *out;     /* where the format writes; not owned */
  bool started;       /* a block was written (Markdown separates blocks by a blank line) */
  const char *rule;   /* the open table's rule (in rule_buf), NULL outside a table */
  kvr_buf_t rule_buf; /* the doc's copy of the rule, so callers may free theirs */
  size_t rows;        /* rows written in the open table; the first is the header */
  kvr_buf_t text;     /* the paragraph or cell being built */
  size_t cell_off[KVR__DOC_MAX_CELLS]; /* offsets of the row's cells in cells */
  size_t ncells;
  kvr_buf_t cells; /* the row being built, cells separated by NULs */
};

/* Starts a document writing to out with ops; kvr__doc_free() releases its buffers. */
void kvr__doc_init(kvr__doc_t *d, const kvr__doc_ops_t *ops, kvr_buf_t *out);
void kvr__doc_free(kvr__doc_t *d);

/* A heading of level 1 or 2, formatted. */
void kvr__doc_h(kvr__doc_t *d, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends formatted text to the paragraph being built; kvr__doc_p_end() writes it. */
void kvr__doc_printf(kvr__doc_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvr__doc_p_end(kvr__doc_t *d);
/* A whole paragraph, formatted. */
void kvr__doc_p(kvr__doc_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Opens a table; its first row is the header. The doc keeps its own copy of rule. */
void kvr__doc_table(kvr__doc_t *d, const char *rule);
/* Appends one formatted cell to the row being built; kvr__doc_row_end() writes the row. */
void kvr__doc_cell(kvr__doc_t *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void kvr__doc_row_end(kvr__doc_t *d);
void kvr__doc_table_end(kvr__doc_t *d);

/* Writes text with its inline marks rendered as Markdown ("**", "`"). */
void kvr__md_text(kvr_buf_t *out, const char *text);
/* The same for a table cell when cell is true: a "|" is written "\|" so that it stays in the cell.
 */
void kvr__md_text_cell(kvr_buf_t *out, const char *text, bool cell);
/* Writes text HTML-escaped, its inline marks rendered as <strong> and <code>. */
void kvr__html_text(kvr_buf_t *out, const char *text);

/* ---- the report's sections (report_sections.c) ----------------------------------------------- */

/* Title (kvr_report_title()), the summary paragraph (kvr__verdict_summary()), generation time. */
void kvr__report_head(const kvr_results_t *res, kvr__doc_t *d);
/* Everything after the head: configuration, SLOs, tables, matrix, winner, detailed comparison,
 * per-turn TTFT, worker share, observations, workload parameters. */
void kvr__report_body(const kvr_results_t *res, kvr__doc_t *d);

/* ---- a trace workload's section (report_trace.c) --------------------------------------------- */

/* The trace's own figures and each run's cached share against the infinite cache's; nothing when
 * res->trace is NULL. */
void kvr__report_trace(const kvr_results_t *res, kvr__doc_t *d);
/* Adds "trace" to a level's "kvrouter" object: the trace's figures and the level's cached share
 * (null when the workload is not a trace). */
struct cJSON;
void kvr__trace_json(struct cJSON *k, const kvr_results_t *res, const kvr_level_t *lv);

/* ---- vllm's result file (report_json.c) -------------------------------------------------------
 */

/* vllm's "date" of the results: res->generated (UTC) as local "%Y%m%d-%H%M%S", as main_async()
 * writes it. */
void kvr__vllm_date(const kvr_results_t *res, char *buf, size_t size);
/* The file name `vllm bench serve --save-result` gives level lv of run:
 * LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json (compute_result_filename()). */
void kvr__vllm_result_name(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                           char *buf, size_t size);

/* ---- the verdict sentences (report_verdicts.c) ----------------------------------------------- */

/* The summary paragraph that opens the report: which policy has the highest max SLO-compliant load
 * and by how much over the baseline, whether that is exact or a bound, or that it is not known. */
void kvr__verdict_summary(const kvr_results_t *res, kvr__doc_t *d);
/* After the configuration table: whether every run started cold, from each run's reset outcome. */
void kvr__verdict_reset(const kvr_results_t *res, kvr__doc_t *d);
/* After the winner table: which label improved the max SLO-compliant load, or that it is not
 * known. */
void kvr__verdict_winner(const kvr_results_t *res, kvr__doc_t *d);
/* The "Key Observations" section. */
void kvr__verdict_observations(const kvr_results_t *res, kvr__doc_t *d);

/* ---- shared views of the results (report.c) -------------------------------------------------- */

typedef struct kvr__metric_s {
  const char *title;
  const char *fmt;
  double (*get)(const kvr_level_t *);
  bool (*valid)(const kvr_level_t *);
  /* The measured requests behind the figure (TTFT: those with a first token, TPOT: those with two
   * or more output tokens, ...); NULL when the figure is not one of requests (engine counters). */
  size_t (*count)(const kvr_level_t *);
} kvr__metric_t;

/* The per-load tables, in report order: [0] TTFT p99, [1] TPOT p99, [2] output throughput, ... */
extern const kvr__metric_t kvr__per_load_metrics[];
extern const size_t kvr__n_per_load_metrics;
/* Preemptions and KV cache usage peak: shown when some level has the workers' engine counters. */
extern const kvr__metric_t kvr__engine_metrics[];
extern const size_t kvr__n_engine_metrics;
/* The rows of the detailed comparison. */
extern const kvr__metric_t kvr__detail_metrics[];
extern const size_t kvr__n_detail_metrics;
/* Achieved rate per load (rate mode only). */
extern const kvr__metric_t kvr__achieved_metric;

bool kvr__has_data(const kvr_level_t *lv);
bool kvr__has_engine(const kvr_level_t *lv);

/* A level's load: its rate, or its users in concurrency mode. */
double kvr__load_of(const kvr_level_t *lv);
/* The run's level at load (within 1e-9), NULL if none. */
const kvr_level_t *kvr__find_load(const kvr_run_t *run, double load);
/* Sorted distinct loads over all runs; the caller frees. */
double *kvr__all_loads(const kvr_results_t *res, size_t *n);
/* "4", "2.50" or "2.125": users as an integer, rates with 2 decimals unless they need 3. */
void kvr__fmt_load(const kvr_results_t *res, double load, char *buf, size_t size);
const char *kvr__load_header(const kvr_results_t *res); /* "Rate" or "Users" */
const char *kvr__load_unit(const kvr_results_t *res);   /* "RPS", "conv/s" or "users" */
/* "+50%" from base to v, an em dash when base is not positive. */
void kvr__fmt_pct_change(double base, double v, char *buf, size_t size);
/* A max SLO-compliant load: "2.00", "at least 12.00" when only bounded below, an em dash when the
 * run has no level run to its end; with_unit appends the load unit. */
void kvr__fmt_cap(const kvr_results_t *res, kvr_report_cap_t cap, bool with_unit, char *buf,
                  size_t size);
/* A capacity change vs the baseline: "+50%", "at least +50%", "at most -20%", "unknown", or an em
 * dash when the baseline passed nowhere. */
void kvr__fmt_gain(kvr_report_gain_t g, char *buf, size_t size);
/* The distinct worker names seen at load dl across all runs, in first-seen order. */
size_t kvr__worker_names(const kvr_results_t *res, double dl,
                         char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX]);
/* Requests of the level that worker name served. */
size_t kvr__worker_count(const kvr_level_t *lv, const char *name);
/* The run as a reader knows it: "phase3 (kv_aware)", or only the label when the run has no policy
 * or its policy is its label. */
void kvr__run_name(const kvr_run_t *run, char *buf, size_t size);
/* Some level of the run ran to its end (or stopped early) and passed: when its max SLO-compliant
 * load is 0 anyway, it passed only above a failing level. */
bool kvr__passed_any(const kvr_run_t *run);
/* The load of the detailed comparison: the baseline's max SLO-compliant load or, when nothing
 * passed (*passed false), the lowest load the baseline measured. False when it has no levels. */
bool kvr__detail_load(const kvr_results_t *res, double *load, bool *passed);
/* kvr__detail_load()'s load into *load and the worker names seen there (kvr__worker_names()) into
 * names, their count into *nnames. False when the baseline has no levels. */
bool kvr__detail_workers(const kvr_results_t *res, double *load,
                         char names[KVR_STATS_MAX_WORKERS][KVR_WORKER_NAME_MAX], size_t *nnames);

#endif

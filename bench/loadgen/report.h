/* report.h -- the benchmark report: Markdown, per-level results JSON, per-request JSONL, HTML+SVG.
 *
 * Every renderer is a pure function of a kvr_results_t (see stats.h): it reads the collected
 * figures and appends text to a kvr_buf_t. Nothing here touches the network or a loop, so the
 * report is unit-tested on hand-built results. kvr_report_write() is the only function that touches
 * files.
 *
 * The Markdown follows the team's report form (shared/seeds/002_*.txt): configuration, SLO targets,
 * one table per metric by load and label, the SLO compliance matrix naming the failing SLO, the
 * winner table with capacity vs baseline (runs[0]), the detailed comparison at the baseline's max
 * SLO-compliant load, per-turn TTFT, worker shares, observations computed from the data, and the
 * workload parameters.
 */
#ifndef KVR_REPORT_H
#define KVR_REPORT_H

#include "src/buf.h"
#include "stats.h"

#include <stddef.h>

/* Appends the Markdown report. */
void kvr_report_markdown(const kvr_results_t *res, kvr_buf_t *out);

/* Appends the HTML page: SVG charts (TTFT p99 and TPOT p99 vs load per label with the SLO lines,
 * output throughput vs load, per-worker share at the baseline's max load) and the key tables. */
void kvr_report_html(const kvr_results_t *res, kvr_buf_t *out);

/* Appends one level's results JSON, keyed like `vllm bench serve --save-result` where the meaning
 * matches (mean_ttft_ms, p99_tpot_ms, request_throughput, ...) plus a "kvrouter" object with the
 * figures vllm does not have (send lag, cached tokens, worker share, per-turn TTFT, SLO verdict).
 */
void kvr_report_level_json(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                           kvr_buf_t *out);

/* Appends one JSON line per request of the level (warm-up included, flagged). */
void kvr_report_jsonl(const kvr_run_t *run, const kvr_level_t *lv, kvr_buf_t *out);

/* Appends a short plain-text summary: max SLO-compliant load per label and the gain vs baseline. */
void kvr_report_summary(const kvr_results_t *res, kvr_buf_t *out);

/* Writes DIR/report.md, DIR/report.html, DIR/requests.jsonl and DIR/results/<label>_<load>.json,
 * creating DIR and DIR/results as needed. Returns 0 or KVR_EIO with a one-line reason in err. */
int kvr_report_write(const kvr_results_t *res, const char *dir, char *err, size_t errlen);

#endif

/* report.h -- the benchmark report: Markdown, per-level results JSON, per-request JSONL, HTML+SVG.
 *
 * Every renderer is a pure function of a kvr_results_t (see stats.h): it reads the collected
 * figures and appends text to a kvr_buf_t. Nothing here touches the network or a loop, so the
 * report is unit-tested on hand-built results. Only report_files.c touches files:
 * kvr_report_write() and the two helpers it is made of, which the policy study
 * (bench/vcluster/study.c) uses too. The types of the analysis are in report_types.h.
 *
 * The Markdown follows the team's report form (shared/seeds/002_*.txt), opened by a summary
 * paragraph of the winner and its gain (exact, a bound, or not known): configuration, SLO targets,
 * one table per metric by load and label, the SLO compliance matrix naming the failing SLO, the
 * winner table with capacity vs baseline (runs[0]), the detailed comparison at the baseline's max
 * SLO-compliant load, per-turn TTFT, worker shares, observations computed from the data, and the
 * workload parameters.
 *
 * Every verdict it prints is computed from the results against a threshold the sentence states,
 * and turns into its opposite when the data say so: a max SLO-compliant load with no failing level
 * above it is "at least" that load and ratios built on it say so; "every run starts cold" only when
 * every worker confirmed every reset; "kept to its schedule" only when every level met the send
 * lag and rate thresholds below, otherwise the levels that missed are named.
 */
#ifndef KVR_REPORT_H
#define KVR_REPORT_H

#include "base/buf.h"
#include "bench/loadgen/stats.h"
#include "report_types.h"

#include <stdbool.h>
#include <stddef.h>

/* ---- the analysis: what the report concludes, as data (report.c) ----------------------------- */

/* "The load generator kept to its schedule" holds when, at every level of a rate-mode run, the
 * send lag p99 is under KVR_REPORT_LAG_P99_MAX_MS (real ms) and the achieved send rate is within
 * KVR_REPORT_RATE_TOL of the rate the level's seeded arrival times ask for (scheduled_rate). The
 * nominal target is not the yardstick: a Poisson schedule of a few hundred arrivals itself strays
 * from it by several percent. */
#define KVR_REPORT_LAG_P99_MAX_MS 10.0
#define KVR_REPORT_RATE_TOL 0.05

/* A run's max SLO-compliant load and how much of it is known (report_types.h). */
kvr_report_cap_t kvr_report_cap(const kvr_run_t *run);

/* The capacity ratio of cap against the baseline's base, with its bound (report_types.h). */
kvr_report_gain_t kvr_report_gain(kvr_report_cap_t base, kvr_report_cap_t cap);

/* -1, 0 or +1 when a's max SLO-compliant load is certainly below, equal to or above b's, else
 * KVR_REPORT_CMP_UNKNOWN (a lower bound at or under the other's load, two lower bounds, or a run
 * without levels). */
#define KVR_REPORT_CMP_UNKNOWN 2
int kvr_report_cmp(kvr_report_cap_t a, kvr_report_cap_t b);

/* True when run r (r > 0) certainly has the highest max SLO-compliant load: above the baseline's
 * and at or above every other run's. Ties between found limits all win; a tie with the baseline
 * wins nothing. */
bool kvr_report_winner(const kvr_results_t *res, size_t r);

/* Whether the level kept to its schedule (see KVR_REPORT_LAG_P99_MAX_MS); *lag_ok and *rate_ok say
 * which test it met (a test without data -- no sends, or fewer than two -- is met). */
bool kvr_report_on_schedule(const kvr_level_t *lv, bool *lag_ok, bool *rate_ok);

/* Appends the Markdown report. */
void kvr_report_markdown(const kvr_results_t *res, kvr_buf_t *out);

/* Appends the HTML page: SVG charts (TTFT p99 and TPOT p99 vs load per label with the SLO lines,
 * output throughput vs load, per-worker share at the baseline's max load) and every table and
 * sentence of the Markdown report, written as HTML. */
void kvr_report_html(const kvr_results_t *res, kvr_buf_t *out);

/* Appends one level's results JSON, keyed like `vllm bench serve --save-result` where the meaning
 * matches (mean_ttft_ms, p99_tpot_ms, request_throughput, ...) plus a "kvrouter" object with the
 * figures vllm does not have (send lag, cached tokens, worker share, per-turn TTFT, SLO verdict).
 */
void kvr_report_level_json(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                           kvr_buf_t *out);

/* Appends one JSON line per request of the level (warm-up included, flagged). */
void kvr_report_jsonl(const kvr_run_t *run, const kvr_level_t *lv, kvr_buf_t *out);

/* Appends a short plain-text summary: max SLO-compliant load per label and the gain vs baseline,
 * each marked when it is only a bound ("at least: every level tried passed"). The first three
 * fields of a label's line stay "LABEL LOAD UNIT" and a gain follows as "(+N% vs BASE)" (scripts
 * parse them). */
void kvr_report_summary(const kvr_results_t *res, kvr_buf_t *out);

/* Appends "kvrouter" and argv[0..argc-1] to out as one POSIX shell command line that can be pasted
 * back into a shell: words separated by single spaces; a word made only of safe characters
 * ([A-Za-z0-9_@%+=:,./-], not empty) is left bare, any other is single-quoted with each ' written
 * as '\'' (an empty word becomes ''). */
void kvr_report_shell_join(int argc, char **argv, kvr_buf_t *out);

/* The report's title: res->title (or "kvrouter Benchmark Report"), suffixed " (virtual time)" when
 * res->virtual_desc is set. */
void kvr_report_title(const kvr_results_t *res, kvr_buf_t *out);

/* Writes DIR/report.md, DIR/report.html, DIR/requests.jsonl and DIR/results/<label>_<load>.json,
 * creating DIR and DIR/results as needed. Returns 0 or KVR_EIO with a one-line reason in err. */
int kvr_report_write(const kvr_results_t *res, const char *dir, char *err, size_t errlen);

/* Creates dir and its missing parents (mkdir -p). Returns 0 or KVR_EIO with "PATH: reason". */
int kvr_report_mkdir_p(const char *dir, char *err, size_t errlen);

/* Writes b to path, replacing it. Returns 0 or KVR_EIO with "PATH: reason" in err. */
int kvr_report_write_file(const char *path, const kvr_buf_t *b, char *err, size_t errlen);

#endif

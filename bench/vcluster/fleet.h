/* fleet.h -- fleet sizing in virtual time (`kvrouter bench --virtual --size-fleet`): per policy,
 * the smallest number of workers that serves one load within the SLOs.
 *
 * The search over fleet sizes mirrors the rate search (bench/run/runner.h) with the direction
 * turned: it starts at a size (--workers), doubles it while a fleet fails (up to --size-fleet-max),
 * halves it while one passes (down to 1 worker), then bisects between the largest failing and the
 * smallest passing fleet until the two are adjacent. kvr_fleet_search_t is that search as a pure
 * state machine; the runner feeds it levels, each a fresh cluster of the size
 * (kvr_vcluster_set_workers, then the restart every virtual level begins with) at the same rate and
 * seed, so every fleet of every policy meets the identical requests. It assumes what it measures
 * is monotone (a fleet that passes would pass with one more worker); a level that breaks that
 * shows in the table.
 *
 * The answer is read back from a run's levels (kvr_level_t's engine_workers and verdict):
 * kvr_fleet_answer(). The report (report.md, fleet.json, one JSON per level, requests.jsonl) and
 * the summary printed on stdout are pure functions of the results and the sizing's settings
 * (kvr_fleet_info_t); kvr_fleet_write() alone touches files. The policy study (study.h) reads its
 * fleet cells with kvr_fleet_answer() too.
 */
#ifndef KVR_FLEET_H
#define KVR_FLEET_H

#include "base/buf.h"
#include "bench/loadgen/stats.h"

#include <stdbool.h>
#include <stddef.h>

/* The default bound of the search (--size-fleet-max). */
#define KVR_FLEET_MAX_DEFAULT 64

/* The search: x is the fleet to run next; feed its verdict; done when the largest failing and the
 * smallest passing fleet are adjacent, when max fails, when 1 passes, or after 64 levels. */
typedef struct kvr_fleet_search_s {
  unsigned x;      /* the next fleet size */
  unsigned lo, hi; /* the largest failing fleet (0: none yet), the smallest passing (0: none yet) */
  unsigned max;
  bool done;
  int steps;
} kvr_fleet_search_t;

/* start is clamped to [1, max]; max >= 1. */
void kvr_fleet_search_init(kvr_fleet_search_t *s, unsigned start, unsigned max);
void kvr_fleet_search_feed(kvr_fleet_search_t *s, bool pass);

/* What one run's levels say. */
typedef struct kvr_fleet_answer_s {
  unsigned workers;     /* the smallest fleet that passed; 0: none did */
  bool exact;           /* workers is 1, or workers - 1 was tried and failed */
  unsigned most_failed; /* the largest fleet that failed; 0: none did */
  size_t tried;         /* levels */
} kvr_fleet_answer_t;

kvr_fleet_answer_t kvr_fleet_answer(const kvr_run_t *run);

/* "6", "<= 6" (the fleet below was not tried), "> 64" (every fleet tried failed), "-" (no level).
 */
void kvr_fleet_answer_text(kvr_fleet_answer_t a, char *buf, size_t size);

/* The sizing's settings, for the report. */
typedef struct kvr_fleet_info_s {
  double rate;     /* the load every fleet ran at, req/s */
  bool trace_rate; /* the trace's own mean rate (no --rates given) */
  unsigned start;  /* the first fleet tried (--workers) */
  unsigned max;    /* --size-fleet-max */
} kvr_fleet_info_t;

/* One line per run after the first: "kv_aware serves this traffic on 6 workers where round_robin
 * needs 13" (runs[0] is the baseline; "more than 64" when it never passed), or for a lone run
 * "kv_aware serves this traffic on 6 workers". */
void kvr_fleet_headline(const kvr_results_t *res, kvr_buf_t *out);

/* The plain-text summary for stdout: the traffic, the headline, and each policy's table (fleets
 * in the order tried, pass or fail with the failing SLO). */
void kvr_fleet_summary(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out);

/* The Markdown report and the JSON summary (fleet.json). */
void kvr_fleet_markdown(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out);
void kvr_fleet_json(const kvr_results_t *res, const kvr_fleet_info_t *fi, kvr_buf_t *out);

/* Writes DIR/report.md, DIR/fleet.json, DIR/requests.jsonl and DIR/results/<label>_w<N>.json (the
 * level's JSON as a rate run writes it). Returns 0 or KVR_EIO with "PATH: reason" in err. */
int kvr_fleet_write(const kvr_results_t *res, const kvr_fleet_info_t *fi, const char *dir,
                    char *err, size_t errlen);

#endif

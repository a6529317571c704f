/* study.h -- `kvrouter bench study`: every policy on every scenario over several seeds, in virtual
 * time, in parallel, summed up in one table.
 *
 * Two kinds of scenario: a rate scenario's cell searches each policy's max SLO-compliant rate on a
 * fixed fleet; a fleet scenario's cell (`--size-fleet`, bench/vcluster/fleet.h) searches each
 * policy's smallest fleet at a fixed rate. The trace scenarios (trace, trace-fleet) replay the
 * study's trace (kvr_study_opts_t.trace: a prefix-hashed file, `--workload trace:FILE`, a window
 * of it) on Llama-3.1-8B/H100 workers at a long-context SLO: the first as a rate scenario, the
 * second at the trace's own rate as a fleet scenario. They run only when the study is given a
 * trace (the command line gives the shared Mooncake file by default; the demo's study none).
 *
 * A scenario is a named set of bench settings (a workload and what makes it itself: session mode,
 * burstiness, a mixed fleet). A cell is one (scenario, seed): one `kvrouter bench --virtual --ab
 * POLICIES --search` run, whose own report lands in OUT/<scenario>/seed<N>/. The study runs the
 * cells on `jobs` threads (each cell is a separate cluster, load generator and router: nothing is
 * shared but the read-only policy registry), then writes OUT/STUDY.md and OUT/study.json: per
 * scenario and policy the mean max SLO-compliant rate over the seeds with its min and max, and
 * kv_aware's ratio to round_robin, to the best reference policy and to the oracle.
 *
 * The study builds each cell's bench as settings (kvr_study_cell_opts) and hands the cell to the
 * caller's run function (kvr_study_run_fn; bench/run/bench_run.c runs it), which applies the
 * person's extra flags through the bench's table and runs it; the cell's words
 * (kvr_study_cell_words) are the command line its report and STUDY.md show.
 */
#ifndef KVR_STUDY_H
#define KVR_STUDY_H

#include "bench/report/report_types.h"
#include "bench/run/runner_types.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define KVR_STUDY_MAX 32

/* One scenario: a workload and what makes it itself, as bench settings. Each field is the flag
 * of the same name in the cell's command line (kvr_study_cell_words). */
typedef struct kvr_study_scenario_s {
  const char *name;
  const char *about;    /* one line for the report */
  const char *workload; /* --workload: a kind kvr_workload_parse_kind() knows */
  bool session;         /* --multiturn-mode session: sessions resend the streamed answers */
  double warmup_s;      /* --warmup-s */
  unsigned num_prompts; /* --num-prompts; 0: the study's 100 */
  double burstiness;    /* --burstiness; 0: the bench's (1, Poisson) */
  const unsigned
      *worker_blocks; /* --worker-blocks: KV blocks per worker (a mixed fleet), or NULL */
  size_t nworker_blocks;
  /* Trace scenarios: --workload trace:FILE (the study's trace and window; workload unused), the
   * workers' --preset and the SLOs (--slo-ttft-ms, --slo-tpot-ms; 0: the bench's). */
  bool trace;
  const char *preset;
  double slo_ttft_ms, slo_tpot_ms;
  bool fleet; /* --size-fleet: the cell answers a fleet per policy, not a rate */
  /* The agentic kind's shape (--agentic-turns-min/-max, --tool-min-tokens/--tool-max-tokens,
   * --agentic-max-context; 0: the workload's defaults). */
  unsigned turns_min, turns_max, tool_min, tool_max, max_context;
  bool responses;            /* --api responses: turns chained by previous_response_id */
  bool no_response_affinity; /* --no-response-affinity: a router that does not pin them */
  const char *model_fleet;   /* --model-fleet: workers serving given models (model_fleet.h) */
  unsigned max_loras;        /* --max-loras: the fleet's LoRA workers' (0: the bench's) */
  /* What one cell costs, CPU seconds as measured (study.c's table names the run): only the order
   * cells start in follows it (kvr_study_order), never a result. */
  double cost_s;
} kvr_study_scenario_t;

/* The built-in scenarios, NULL-name-terminated: multiturn, documents, control, agentic, hot-prefix,
 * bursty (multiturn at burstiness 0.3), mixed-fleet (documents with one worker at half the KV),
 * agentic-responses (agentic sessions on the Responses API, each turn chained to the previous
 * answer's id, the router pinning it as kvrouter serve does) and agentic-responses-no-id-affinity
 * (the same traffic through a router that does not), model-fleet (16 workers serving two base
 * models, one with four LoRA adapters, and a 4-rank DP endpoint, under a mix of their traffic),
 * then the trace scenarios: trace (max SLO-compliant rate) and trace-fleet (workers needed at the
 * trace's own rate). */
extern const kvr_study_scenario_t kvr_study_scenarios[];
const kvr_study_scenario_t *kvr_study_scenario(const char *name);

typedef struct kvr_study_opts_s {
  const char *scenarios[KVR_STUDY_MAX]; /* names; none = all */
  size_t nscenarios;
  const char *policies[KVR_STUDY_MAX]; /* none = every registered policy, then the oracle */
  size_t npolicies;
  unsigned seeds; /* seeds per scenario: --seed, --seed + 1, ... */
  unsigned long long seed;
  unsigned jobs;     /* threads; 0 = the machine's cores */
  double resolution; /* search resolution, req/s */
  const char *out;
  char **extra; /* bench flags after --, appended to every cell's (later flags win) */
  int nextra;
  /* Fleet flags (--workers N, --worker-blocks LIST: the demo's), given to every cell before extra
   * except a scenario's that sets its own fleet (mixed-fleet, model-fleet), which keeps it. */
  char **fleet;
  int nfleet;
  bool quiet;
  /* The trace scenarios' file and its window ("START_S:END_S", trace seconds; NULL: the whole
   * trace). No trace: they are not run (named in --scenarios: an error). The default set takes
   * them when the file can be read and says so when it cannot. */
  const char *trace;
  const char *trace_window;
} kvr_study_opts_t;

/* What the command line gives: the shared Mooncake trace (relative to the repository's root, where
 * the study is run from) and the window of it that keeps the whole study within ten minutes on two
 * cores (bench/results/study/NOTES.md). */
#define KVR_STUDY_TRACE "../shared/traces/mooncake_synthetic_trace.jsonl"
#define KVR_STUDY_TRACE_WINDOW "550:950"

void kvr_study_opts_default(kvr_study_opts_t *o);

/* One cell: a scenario at a seed, with the study's policies and search plan; what a run function
 * gets to run. */
typedef struct kvr_study_cell_s {
  const kvr_study_scenario_t *sc;
  unsigned long long seed;
  const char *const *policies; /* --ab and --labels, the first the baseline */
  size_t npolicies;
  double resolution; /* --search-resolution */
  const char *out;   /* OUT/<scenario>/seed<N> */
  const char *title;
  char **extra; /* the caller's bench flags (after --), to apply over the cell's settings */
  int nextra;
  const char *trace_workload; /* trace scenarios: "trace:FILE" */
  const char *trace_window;   /* and --trace-window's text, or NULL */
} kvr_study_cell_t;

/* Sets the cell's bench in o, which holds the bench's defaults (kvr_runner_opts_default): virtual
 * time, the policies as --ab and --labels (heap copies, freed with the bench's options), the seed,
 * the search, the level plan (--num-prompts 100 --warmup 0 --min-level-s 60 --cooldown-s 10),
 * --quiet, --out and --title, then the scenario's settings. c->extra is the caller's to apply. */
void kvr_study_cell_opts(const kvr_study_cell_t *c, kvr_runner_opts_t *o);

#define KVR_STUDY_WORDS_MAX 96

/* A cell's command line as words, and the text its numbers need. */
typedef struct kvr_study_words_s {
  char *argv[KVR_STUDY_WORDS_MAX]; /* NULL-terminated; into this struct and the cell */
  int argc;
  char seed[32], res[32], warmup[32], prompts[32], burst[32], blocks[256], ab[1024];
  char slo_ttft[32], slo_tpot[32], loras[16];
  char shape[5][16]; /* the agentic shape's numbers */
} kvr_study_words_t;

/* The cell's bench as a person would type it: "bench", "--virtual", the settings
 * kvr_study_cell_opts() makes in the same order, then c->extra. For the cell's report (its
 * command to reproduce) and STUDY.md; parsed by the bench's table, it gives the same settings. */
void kvr_study_cell_words(const kvr_study_cell_t *c, kvr_study_words_t *w);

/* Runs one cell: its bench in virtual time (kvr_study_cell_opts, then c->extra), its report written
 * as usual; *out gets its results (the caller frees them with kvr_stats_results_free), NULL on
 * failure. Returns 0 or an exit status with one line in err. Called from several threads at once.
 */
typedef int (*kvr_study_run_fn)(const kvr_study_cell_t *c, kvr_results_t **out, char *err,
                                size_t errlen);

/* One policy on one scenario over the seeds. */
typedef struct kvr_study_agg_s {
  double mean, min, max; /* max SLO-compliant rate, req/s (a fleet scenario: workers needed) */
  bool lower; /* some seed found no limit (a fleet scenario: no fleet tried passed; its figure is
               * the largest fleet tried + 1): the mean is a lower bound */
  size_t n;   /* seeds that ran */
} kvr_study_agg_t;

/* What a study found, for a caller that goes on from it (the demo). */
typedef struct kvr_study_summary_s {
  const char *scenarios[KVR_STUDY_MAX]; /* names, in run order */
  size_t nscenarios;
  const char *policies[KVR_STUDY_MAX];
  size_t npolicies;
  kvr_study_agg_t agg[KVR_STUDY_MAX][KVR_STUDY_MAX]; /* [scenario][policy] */
  bool fleet[KVR_STUDY_MAX]; /* scenario s's figures are workers needed, not rates */
  double seconds;
} kvr_study_summary_t;

/* The order the threads take the cells of scs[0..nscs) over seeds seeds (cell s * seeds + k:
 * scenario s, its k-th seed) into order[0..nscs * seeds): the costliest scenarios' cells first
 * (cost_s), ties in table then seed order. Longest first, so that no long cell starts while the
 * other threads are running out of work: the order moves no figure, only the study's wall time. */
void kvr_study_order(const kvr_study_scenario_t *const *scs, size_t nscs, unsigned seeds,
                     size_t *order);

/* Runs the study and writes its files; prints the table (and, unless quiet, a line per finished
 * cell) to out; fills *sum when not NULL. Returns 0, 1 when a cell failed (the others still
 * count), or 2 on bad options with one line in err. */
int kvr_study_run(const kvr_study_opts_t *o, kvr_study_run_fn run, FILE *out,
                  kvr_study_summary_t *sum, char *err, size_t errlen);

#endif

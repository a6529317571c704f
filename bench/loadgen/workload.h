/* workload.h -- seeded, reproducible workloads for `kvrouter bench`.
 *
 * A workload is a source of conversations. A conversation is a list of user turns (plus an optional
 * shared prefix text and system prompt); the load generator sends turn t of a conversation with the
 * whole history, including the answers it actually streamed back for turns 1..t-1.
 *
 * Kinds (kvr_workload_kind_t):
 *   multiturn  the seed workload (shared/WORKLOAD.md): `starters` shared conversation starters of
 *              starter_min..starter_max tokens of deterministic synthetic text, `turns` turns per
 *              conversation, short follow-ups, output tokens drawn from a clipped normal.
 *   documents  `documents` distinct long documents, each asked `questions` single-turn questions:
 *              a working set larger than one worker's KV cache, where placement matters most.
 *   control    single-turn prompts of unique synthetic text: no prefix is ever shared.
 *   file       conversations from a ShareGPT JSON array or the JSONL form documented in
 *              bench/loadgen/README.md; with sharegpt_vllm, a ShareGPT file as `vllm bench serve
 *              --dataset-name sharegpt` samples it: one single-turn prompt per entry.
 *   agentic    long tool-using sessions: one of `starters` shared system prompts, then a task, then
 *              agentic_turns_min..max turns whose user messages are tool outputs of
 *              tool_min_tokens..tool_max_tokens tokens; short outputs. The turns are capped so the
 *              planned context (prefix + every user turn + every turn's max_tokens) stays within
 *              agentic_max_context tokens (default 100,000, under the sim's max_model_len 131072).
 *   hot-prefix single-turn: a share hot_fraction of the requests carry the one shared hot prefix,
 *              the others a unique prompt of the same length range; each ends in a fresh question.
 *   mix        several models in one traffic (`mix:SPEC`, kvr_workload_mix_parse): each part names
 *              the model its requests send ("model": a base model or a LoRA adapter), one of the
 *              kinds above (not file or trace) and a weight; conversation k of a level belongs to
 *              part i with probability weight_i / sum (a draw of its own from the level seed and
 *              k), and is that part's own conversation k: each part has its own text pool (its
 *              seed is the workload's mixed with the part's index), so models share no prefix.
 *              Sent as sessions (multiturn parts never replay).
 *   trace      a prefix-hashed trace file (trace_replay.h): conversation k is the k-th request a
 *              level sends, single-turn, its prompt synthesised from its hash ids so that requests
 *              share exactly the blocks their id lists share, its max_tokens the trace's output
 *              length; the load generator sends them at the trace's arrival times, scaled.
 *
 * APIs (kvr_api_t): chat and completions resend the whole history every turn; the Responses API
 * (api responses, with any kind sent as sessions: not a trace, not multiturn's replay) sends each
 * turn's new message only, chained by previous_response_id to the answer before it, with
 * store true: the agentic kind this way is an agent on a Responses server (its tool outputs as
 * the new input of each turn, the history in the worker's response store).
 *
 * Reproducibility: conversation k of a level is a pure function of (workload seed, level seed, k).
 * The shared text pool (starters, documents) depends on the workload seed only, so every level and
 * every A/B label sends byte-identical starters. Text is ~4 characters per token, the simulator's
 * tokenization rate, so a 3,500-token starter is ~14,000 characters.
 */
#ifndef KVR_WORKLOAD_H
#define KVR_WORKLOAD_H

#include "base/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_WORKLOAD_CHARS_PER_TOKEN 4

/* A small seeded PRNG (splitmix64): every random choice in bench/ goes through one of these. */
typedef struct kvr_rng_s {
  uint64_t s;
} kvr_rng_t;

void kvr_workload_rng_seed(kvr_rng_t *r, uint64_t seed);
uint64_t kvr_workload_rng_u64(kvr_rng_t *r);
/* Uniform in [0, 1). */
double kvr_workload_rng_unit(kvr_rng_t *r);
/* Uniform integer in [lo, hi] (hi >= lo). */
uint64_t kvr_workload_rng_range(kvr_rng_t *r, uint64_t lo, uint64_t hi);
/* Standard normal (Box-Muller). */
double kvr_workload_rng_normal(kvr_rng_t *r);
/* Gamma(shape, scale) (Marsaglia-Tsang); shape > 0. Exponential when shape == 1. */
double kvr_workload_rng_gamma(kvr_rng_t *r, double shape, double scale);
/* Mixes two 64-bit values into a seed (used for per-level and per-conversation seeds). */
uint64_t kvr_workload_mix(uint64_t a, uint64_t b);

/* The API a workload's requests go to. KVR_API_RESPONSES is OpenAI's Responses API as an agent
 * uses it with a server-side store: each turn sends only its new message and names the previous
 * answer's id (previous_response_id), so the history lives in the worker that stored it
 * (kvr_workload_responses_body). Sessions only: a turn cannot go before the answer it names. */
typedef enum { KVR_API_CHAT = 0, KVR_API_COMPLETIONS, KVR_API_RESPONSES } kvr_api_t;

/* The API's path (/v1/chat/completions, /v1/completions, /v1/responses) and its --api name. */
const char *kvr_workload_api_path(kvr_api_t api);
const char *kvr_workload_api_name(kvr_api_t api);

typedef enum {
  KVR_WL_MULTITURN = 0,
  KVR_WL_DOCUMENTS,
  KVR_WL_CONTROL,
  KVR_WL_FILE,
  KVR_WL_AGENTIC,
  KVR_WL_HOT_PREFIX,
  KVR_WL_TRACE,
  KVR_WL_MIX,
} kvr_workload_kind_t;

/* agentic: output tokens per turn when no --output-* flag moved the global default (normal(120,
 * 60) clipped to [16, 512]); a field left at its global default takes the agentic one. */
#define KVR_WL_AGENTIC_OUT_MEAN 120.0
#define KVR_WL_AGENTIC_OUT_STD 60.0
#define KVR_WL_AGENTIC_OUT_MIN 16u
#define KVR_WL_AGENTIC_OUT_MAX 512u
/* hot-prefix: tokens of the fresh question after the prefix. */
#define KVR_WL_QUESTION_MIN_TOKENS 50u
#define KVR_WL_QUESTION_MAX_TOKENS 200u

typedef struct kvr_workload_opts_s {
  kvr_workload_kind_t kind;
  const char *path;           /* KVR_WL_FILE: the file (copied); KVR_WL_MIX: the spec (copied) */
  uint64_t seed;              /* text pool seed */
  unsigned turns;             /* multiturn: turns per conversation (5) */
  unsigned starters;          /* multiturn, agentic: shared starters / system prompts (10) */
  unsigned documents;         /* documents: distinct documents (150) */
  unsigned questions;         /* documents: questions per document (4) */
  unsigned prefix_min_tokens; /* starter/document/hot prefix length range (3500..4000) */
  unsigned prefix_max_tokens;
  unsigned control_min_tokens; /* control prompt length range (3500..7000: the multiturn mix) */
  unsigned control_max_tokens;
  double out_mean, out_std; /* output tokens per turn: normal(830, 300) clipped to [min, max] */
  unsigned out_min, out_max;
  double think_mean_s;     /* mean think time before turns 2.. (exponential), simulated seconds */
  bool replay;             /* multiturn: pre-built conversations replayed open loop (the seed's
                            * `vllm bench serve` shape): every turn carries a synthetic answer of
                            * its max_tokens, so any turn can be sent without waiting for the
                            * previous one. false: closed-loop sessions resending real answers */
  unsigned replay_width;   /* replay: conversations interleaved per block (16), see loadgen.h */
  bool replay_sample;      /* replay: every arrival is a random turn of its own conversation (a
                            * dataset of single prompts sampled at random, as `vllm bench serve`
                            * samples a custom dataset) instead of blocks; see loadgen.h */
  unsigned replay_dataset; /* replay sample: 0 = every arrival a fresh conversation; N = arrivals
                            * draw the N*turns prompts of one fixed dataset of N conversations (the
                            * same at every level), each pass over it in a new seeded order, as
                            * `vllm bench serve` replays one dataset file at every rate */
  double answer_mean, answer_std; /* replay: tokens of the pre-built answers carried in the history,
                                   * normal(mean, std) clipped to [out_min, out_max]; mean 0 = each
                                   * turn's max_tokens (the default) */
  unsigned agentic_turns_min;     /* agentic: turns per conversation, uniform (20..60) */
  unsigned agentic_turns_max;
  unsigned tool_min_tokens; /* agentic: tool output per user turn after the first (500..3000) */
  unsigned tool_max_tokens;
  unsigned agentic_max_context; /* agentic: planned context cap in tokens (100000) */
  double hot_fraction;          /* hot-prefix: share of requests with the hot prefix (0.8) */
  unsigned trace_block_tokens;  /* trace: tokens one hash id stands for (512) */
  double trace_window_start_s;  /* trace: the requests arriving in [start, end) trace seconds */
  double trace_window_end_s;    /* (0, -1: the whole trace; end < 0: to the end) */
  uint64_t max_context;         /* trace: the workers' context (input + output tokens); longer
                                 * requests are counted, not sent; 0 = no limit */
  kvr_api_t api;                /* trace: the API the prompts are rendered for (the template's
                                 * tokens are taken off the content: trace_replay.h) */
  bool sharegpt_vllm;           /* file (ShareGPT): vllm's sampling (vllm/benchmarks/datasets.py
                                 * ShareGPTDataset): entries of 2+ messages, the first message the
                                 * prompt and the second's tokens its max_tokens, kept when the
                                 * prompt has 4-1024 tokens, the output 4 or more and both at most
                                 * 2048 (tokens at ~4 characters: no tokenizer here) */
  unsigned sharegpt_output_len; /* sharegpt_vllm: max_tokens of every prompt (--sharegpt-output-len)
                                 * instead of the recorded reply's; 0 = the reply's */
} kvr_workload_opts_t;

/* Fills opts with the seed workload's defaults (multiturn replay, 10 starters x 5 turns, 830 tokens
 * out). */
void kvr_workload_opts_default(kvr_workload_opts_t *opts);

/* Parses "multiturn", "documents", "control", "agentic", "hot-prefix", "file:PATH",
 * "sharegpt:PATH" (a file with sharegpt_vllm), "trace:PATH" or "mix:SPEC" into
 * opts->kind/opts->path (path points into spec; a mix's SPEC is checked by kvr_workload_new).
 * Returns 0 or KVR_EINVAL. */
int kvr_workload_parse_kind(const char *spec, kvr_workload_opts_t *opts);

typedef struct kvr_workload_s kvr_workload_t;

/* A mix's parts: SPEC is MODEL=KIND@WEIGHT[,MODEL=KIND@WEIGHT...], e.g.
 * "model-a=multiturn@0.45,b-sql=documents@0.1": MODEL the "model" its requests send (1..127
 * bytes, none of ",=@"), KIND multiturn, documents, control, agentic or hot-prefix, WEIGHT a
 * positive number (the parts' weights are relative). At most KVR_WL_MIX_MAX parts, a model once. */
#define KVR_WL_MIX_MAX 16
typedef struct kvr_wl_mix_part_s {
  char model[128];
  kvr_workload_kind_t kind;
  double weight;
} kvr_wl_mix_part_t;

/* Parses a mix's SPEC into parts[0..*n). Returns 0, or KVR_EINVAL with a one-line reason in err
 * naming the part. */
int kvr_workload_mix_parse(const char *spec, kvr_wl_mix_part_t parts[KVR_WL_MIX_MAX], size_t *n,
                           char *err, size_t errlen);

/* A mix workload's parts (NULL and *n 0 for other kinds). */
const kvr_wl_mix_part_t *kvr_workload_mix_parts(const kvr_workload_t *wl, size_t *n);

/* Parses "replay" or "session" into opts->replay. Returns 0 or KVR_EINVAL. */
int kvr_workload_parse_mode(const char *spec, kvr_workload_opts_t *opts);

/* Parses "blocks" or "sample" into opts->replay_sample. Returns 0 or KVR_EINVAL. */
int kvr_workload_parse_order(const char *spec, kvr_workload_opts_t *opts);

/* Parses --trace-window's "START_S:END_S" (END_S may be left out: to the end) into
 * opts->trace_window_start_s/end_s. Returns 0 or KVR_EINVAL (not two numbers, START_S < 0, END_S <=
 * START_S). */
int kvr_workload_parse_window(const char *spec, kvr_workload_opts_t *opts);

/* One user turn. */
typedef struct kvr_turn_s {
  char *user;          /* owned: the user message (for turn 1 it follows the prefix) */
  uint32_t max_tokens; /* output tokens asked for */
  double think_s;      /* think time before this turn, simulated seconds (0 for turn 1) */
  char *answer;        /* owned: multiturn replay only, the pre-built assistant answer of this turn
                        * (max_tokens tokens of synthetic text) that later turns carry; else NULL */
} kvr_turn_t;

/* One conversation, owned by whoever called kvr_workload_conv(); free with
 * kvr_workload_conv_free(). */
typedef struct kvr_conv_s {
  uint64_t id;        /* k, the conversation's index within its level */
  const char *prefix; /* borrowed from the workload (shared starter/document) or NULL */
  char *prefix_owned; /* owned unique prefix (control, cold hot-prefix requests), NULL otherwise;
                         prefix points at it */
  const char *system; /* borrowed system prompt, or NULL */
  kvr_turn_t *turns;  /* owned */
  uint32_t nturns;
  int32_t group; /* starter/document/hot prefix index shared with other conversations, -1 if none */
  bool raw;      /* trace: the one turn is the whole prompt: completions send it as it is, without
                  * the "User: ... Assistant:" frame */
  const char *model; /* mix: the part's model, borrowed from the workload (its requests' "model");
                      * NULL: the run's --model */
  int32_t part;      /* mix: the part's index, -1 for other kinds */
} kvr_conv_t;

/* Creates a workload: generates the shared text pool or loads the file. Returns NULL and writes a
 * one-line reason into err on failure (bad option, unreadable or malformed file). */
kvr_workload_t *kvr_workload_new(const kvr_workload_opts_t *opts, char *err, size_t errlen);
void kvr_workload_free(kvr_workload_t *wl); /* accepts NULL */

/* Short name for reports ("multiturn", "documents", "control", "agentic", "hot-prefix",
 * "file:NAME"). */
const char *kvr_workload_name(const kvr_workload_t *wl);
/* One line describing the workload's parameters, for the report. */
void kvr_workload_describe(const kvr_workload_t *wl, kvr_buf_t *out);
/* The options the workload was created with. */
const kvr_workload_opts_t *kvr_workload_opts(const kvr_workload_t *wl);
/* Number of conversations a file holds (0 for synthetic workloads, which are unbounded). */
size_t kvr_workload_file_size(const kvr_workload_t *wl);

struct kvr_trace_replay_s; /* trace_replay.h */

/* A trace workload's trace (its requests, arrivals and figures), NULL for other kinds. */
const struct kvr_trace_replay_s *kvr_workload_trace(const kvr_workload_t *wl);

/* Trace workloads: sets the workers' context (opts.max_context; 0 = no limit) once it is known (a
 * real endpoint's GET /v1/models) and returns the number of requests a level sends; 0 for other
 * kinds. */
size_t kvr_workload_set_max_context(kvr_workload_t *wl, uint64_t max_context);

/* Fills conv with conversation k of the level seeded level_seed. Deterministic. conv is
 * overwritten (not freed) first; the caller frees it with kvr_workload_conv_free(). */
void kvr_workload_conv(const kvr_workload_t *wl, uint64_t level_seed, uint64_t k, kvr_conv_t *conv);
void kvr_workload_conv_free(kvr_conv_t *conv); /* accepts NULL; leaves conv empty */

/* Replay sample order (opts.replay_sample): arrival k of a level (k counts every arrival, warm-up
 * included, and each opens conversation k of the level) sends turn *turn of dataset conversation
 * *conv (k itself when opts.replay_dataset is 0). Pure function of (level_seed, k); the
 * workload's kvr_workload_conv() builds the same conversation for that k. */
void kvr_workload_sample_slot(const kvr_workload_t *wl, uint64_t level_seed, uint64_t k,
                              uint64_t *conv, uint32_t *turn);

/* Closed-loop steady state (loadgen.h): the 0-based turn at which user `user`'s first
 * conversation of a level starts, uniform over 0..nturns-1 (0 when nturns <= 1). Pure function of
 * (level_seed, user): the same users start at the same turns at every run of the level. */
uint32_t kvr_workload_start_turn(uint64_t level_seed, uint64_t user, uint32_t nturns);

/* A synthetic assistant answer for turn `turn` (0-based, < conv->nturns) of conv: max_tokens
 * tokens of deterministic text (~4 characters per token), the kind replay mode pre-builds, for a
 * history the load generator did not stream itself (a conversation observed mid-way). Pure
 * function of (workload seed, level_seed, conv->id, turn). Returns an owned string. */
char *kvr_workload_answer(const kvr_workload_t *wl, uint64_t level_seed, const kvr_conv_t *conv,
                          uint32_t turn);

/* Appends deterministic pseudo-English of about `chars` characters (never fewer) to out. */
void kvr_workload_text(kvr_rng_t *r, size_t chars, kvr_buf_t *out);

/* Builds the JSON request body for turn `turn` (0-based) of conv. answers[0..turn-1] are the
 * assistant answers actually streamed for the earlier turns (NULL entries count as empty).
 * Chat: {"model", "messages": [system?, user, assistant, ..., user], "max_tokens", "stream": true,
 * "stream_options": {"include_usage": true}, "ignore_eos"?}; completions: the same history rendered
 * as one "prompt" text; responses: kvr_workload_responses_body() with no previous id (the history
 * is the worker's: a chained turn needs the previous answer's id, not its text). out is reset
 * first. */
void kvr_workload_body(const kvr_conv_t *conv, uint32_t turn, const char *const *answers,
                       const char *model, kvr_api_t api, bool ignore_eos, kvr_buf_t *out);

/* The Responses API's body for turn `turn` (0-based) of conv, as an agent sends it against a
 * server that stores responses: {"model", "input": the turn's user message only (turn 0: the
 * prefix, a blank line and the message, as the chat form's first user message), "instructions":
 * the system prompt (when conv has one; a stored response does not carry it over, so it is sent
 * every turn), "previous_response_id": prev_id (turns after the first; NULL or "" leaves it
 * out), "store": true, "max_output_tokens", "stream": true, "ignore_eos"?}. The worker renders
 * instructions + its stored history + this input: the chat form's prompt of the same
 * conversation. out is reset first. */
void kvr_workload_responses_body(const kvr_conv_t *conv, uint32_t turn, const char *prev_id,
                                 const char *model, bool ignore_eos, kvr_buf_t *out);

#endif

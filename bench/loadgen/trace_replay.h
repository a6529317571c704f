/* trace_replay.h -- a prefix-hashed request trace as a bench workload (`kvrouter bench --workload
 * trace:FILE`): the file read and checked, a window of it, its own figures, and each request's
 * prompt synthesised from its hash ids.
 *
 * The format (src/proto/trace.h, ../shared/traces/README.md) gives per request an arrival time,
 * input and output token counts and the hash ids of its prompt's blocks of block_tokens tokens; no
 * text. A replay must send text whose sharing is the trace's: two requests share exactly as many
 * leading tokens as their id lists share leading blocks, and no more, at whatever block size the
 * router (64 bytes) and the engine (16 tokens) cache in.
 *
 * The synthesis rule. Block k of a request is the text T(s, k, ids[k]): a pure function of the
 * level's seed s, the position k and the id at k, never of the other ids. Equal ids at the same
 * position are the same block content (the format's own definition), so two requests whose lists
 * agree on their first j ids carry identical text up to the end of block j-1; a prefix cache (the
 * engine's, the router's: both hash chains over the prefix) then shares exactly those blocks, and
 * the chain makes an equal id after a difference worthless to it, as the format intends. Deriving
 * T from the whole chain ids[0..k] would give the same sharing (a cache only ever matches leading
 * blocks) at the cost of a hash chain per request, and would contradict "equal ids at the same
 * position mean the same content" for a file whose ids are not chained. And no more: T opens with
 * its id written in 12 characters of base 64, lowest digits first, so two different ids at the same
 * position differ in the block's first token (4 characters) whenever their low 24 bits differ, and
 * within its first three tokens always. The rest of T is words of 1-4 letters, one space each,
 * drawn from a generator seeded by (s, k, id): each word is about one token of a BPE tokenizer and
 * 4 characters on average, the rate of the simulator (KVR_SIM_TOKEN_BYTES) and the router
 * (KVR_CHARS_PER_TOKEN); a prefix of T is T cut short, so a partial last block is the start of the
 * full one.
 *
 * Lengths. The simulator counts a chat prompt as BOS + the user header (4 tokens), the content at 4
 * characters a token, then the content's closing line and the assistant header (5 tokens); a
 * completions prompt as BOS (1 token) and the text. So the content is (input_length - 9) x 4
 * characters for chat (input_length - 1 for completions) and input_length tokens in the trace are
 * input_length prompt tokens at the simulator; and block 0 is shortened by the 4 (1) template
 * tokens before it, so that trace block k is exactly tokens [k x B, (k+1) x B) of the prompt the
 * engine sees and an infinite cache of its 16-token blocks holds exactly the trace's shared blocks.
 * A request shorter than the template is sent as the template alone (9 or 1 tokens). A list with
 * fewer ids than ceil(input_length / B) blocks is completed with ids no other request has; ids
 * beyond the prompt are ignored. Output: max_tokens = output_length (at least 1: an API refuses 0),
 * sent with ignore_eos by the load generator.
 *
 * Levels. Requests are ordered by arrival (stable: a captured file is written in completion order);
 * a window [start, end) in trace seconds keeps those arriving in it, and a level sends them from
 * the window's first, at their own arrival times compressed or stretched by one factor so that
 * their mean rate, (n - 1) / span, is the level's rate (kvr_trace_replay_arrival_s). Requests whose
 * input
 * + output exceed the workers' context (kvr_trace_replay_set_context) are counted in the figures
 * and never sent: a refusal would fail every level on errors.
 *
 * Ownership: kvr_trace_replay_t owns its requests and ids; kvr_trace_replay_free() releases them.
 * Everything here is pure (no clock, no loop); only kvr_trace_replay_open() reads a file.
 */
#ifndef KVR_TRACE_REPLAY_H
#define KVR_TRACE_REPLAY_H

#include "base/buf.h"
#include "stats.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Template tokens around the content, as the simulator renders prompts (sim_tokens.h). */
#define KVR_TRACE_REPLAY_CHAT_BEFORE 4 /* BOS, "<|user|>   \n" */
#define KVR_TRACE_REPLAY_CHAT_AFTER 5  /* "\n   ", "<|assistant|>  \n" */
#define KVR_TRACE_REPLAY_TEXT_BEFORE 1 /* BOS */
#define KVR_TRACE_REPLAY_MIN_BLOCK 16  /* smallest --trace-block-tokens: above the template */
#define KVR_TRACE_REPLAY_ID_CHARS 12   /* the id's code that opens every block */
/* Characters a token: the simulator's KVR_SIM_TOKEN_BYTES, the router's KVR_CHARS_PER_TOKEN and
 * the workloads' KVR_WORKLOAD_CHARS_PER_TOKEN (test_trace_replay checks they agree). */
#define KVR_TRACE_REPLAY_CHARS_PER_TOKEN 4

typedef struct kvr_trace_replay_opts_s {
  const char *path;
  unsigned block_tokens;               /* tokens per hash id (512), >= KVR_TRACE_REPLAY_MIN_BLOCK */
  double window_start_s, window_end_s; /* [start, end) trace seconds; end < 0: to the end */
  uint64_t max_context;                /* input + output above it are not sent; 0: no limit */
  bool chat;                           /* the chat template, else completions (the bare text) */
} kvr_trace_replay_opts_t;

typedef struct kvr_trace_replay_s kvr_trace_replay_t;

/* Reads and checks the whole file. Returns NULL with one line in err: "PATH:LINE: <what is wrong>"
 * for a malformed line (proto/trace.h's reasons: not a JSON object, a missing field, a negative
 * length), "PATH: ..." for an unreadable or empty file, a window without requests, or bad
 * options. */
kvr_trace_replay_t *kvr_trace_replay_open(const kvr_trace_replay_opts_t *opts, char *err,
                                          size_t errlen);
void kvr_trace_replay_free(kvr_trace_replay_t *t); /* accepts NULL */

/* Sets the workers' context (0: no limit) and recomputes which requests are sent and their figures.
 * Returns the number sent. */
size_t kvr_trace_replay_set_context(kvr_trace_replay_t *t, uint64_t max_context);

/* The figures (the report's trace section). */
const kvr_trace_stats_t *kvr_trace_replay_stats(const kvr_trace_replay_t *t);

/* The requests a level sends (the window's, less those over the context). */
size_t kvr_trace_replay_count(const kvr_trace_replay_t *t);

/* Sent request i (< count): its arrival in trace seconds after the first sent request's, its input
 * and output tokens as the file gives them, and the input tokens an infinite cache holds for it
 * (its leading blocks seen in an earlier sent request). */
double kvr_trace_replay_arrival_s(const kvr_trace_replay_t *t, size_t i);
uint64_t kvr_trace_replay_input(const kvr_trace_replay_t *t, size_t i);
uint64_t kvr_trace_replay_output(const kvr_trace_replay_t *t, size_t i);
uint64_t kvr_trace_replay_seen(const kvr_trace_replay_t *t, size_t i);

/* Appends the prompt content of sent request i for seed (the level's) to out: the text the user
 * message carries (chat) or the whole prompt (completions). Deterministic in (seed, the request's
 * ids and lengths, the template). */
void kvr_trace_replay_text(const kvr_trace_replay_t *t, uint64_t seed, size_t i, kvr_buf_t *out);

/* Appends the first chars characters of block text T(seed, k, id) to out (the synthesis rule
 * above; exposed for tests). */
void kvr_trace_replay_block(uint64_t seed, uint64_t k, uint64_t id, size_t chars, kvr_buf_t *out);

/* The time scale factor of a level at rate (req/s): a sent request's level time is its
 * kvr_trace_replay_arrival_s() times this; 0 when the sent requests all arrive at once (a level
 * then sends them 1/rate apart). */
double kvr_trace_replay_factor(const kvr_trace_replay_t *t, double rate);

#endif

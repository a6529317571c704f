/* trace.h -- prefix-hashed request traces, one JSON object per line (pure: no file, no clock).
 *
 * The format the field exchanges traffic in (the Mooncake FAST'25 trace release; NVIDIA Dynamo's
 * trace replay and AIPerf; SGLang's bench_serving; vLLM's `timed_trace` dataset), described in
 * ../shared/traces/README.md:
 *
 *   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}
 *
 * timestamp is the arrival in milliseconds from the trace's start; input_length and output_length
 * are tokens; hash_ids name the prompt's prefix blocks (512 tokens each unless a reader is told
 * otherwise; the last may be partial): equal ids at the same position mean the same block content,
 * so two requests share their KV cache for as many leading blocks as their lists agree. No text.
 *
 * kvr_trace_parse() reads one line strictly (the bench's replay, bench/loadgen/workload.c);
 * kvr_trace_format() writes one (the router's capture, serve/trace_out.c), which adds
 * "tokens_source": "usage" or "estimate" to say where its token counts come from. Other members a
 * reader finds are ignored, so files from other tools read as they are.
 */
#ifndef KVR_TRACE_H
#define KVR_TRACE_H

#include "base/buf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The block size the format's hash ids stand for unless a reader is told otherwise. */
#define KVR_TRACE_BLOCK_TOKENS_DEFAULT 512
/* Largest integer a reader takes (a double holds it exactly: 2^53). */
#define KVR_TRACE_INT_MAX 9007199254740992.0

typedef enum {
  KVR_TRACE_TOKENS_UNSTATED = 0, /* the file does not say (other tools' files) */
  KVR_TRACE_TOKENS_USAGE,        /* the worker's usage figures */
  KVR_TRACE_TOKENS_ESTIMATE,     /* the router's estimate (no usage in the answer) */
} kvr_trace_tokens_t;

typedef struct kvr_trace_rec_s {
  double timestamp_ms;
  uint64_t input_length, output_length;
  uint64_t *hash_ids; /* parse: owned (kvr_trace_rec_free); format: the caller's */
  size_t nhash;
  kvr_trace_tokens_t tokens;
} kvr_trace_rec_t;

/* Parses one line (len bytes, no newline needed) into *out. Returns 0, or KVR_EINVAL with one line
 * in err saying what is wrong ("not a JSON object", "missing field 'hash_ids'", "'input_length'
 * must be a non-negative integer", "'hash_ids[3]' must be a non-negative integer"). A blank line
 * is KVR_ENOENT (skip it). out owns its hash_ids on success only. */
int kvr_trace_parse(const char *line, size_t len, kvr_trace_rec_t *out, char *err, size_t errlen);

/* Frees what a parsed record owns; accepts NULL. */
void kvr_trace_rec_free(kvr_trace_rec_t *rec);

/* Appends rec as one line (newline included) to out: the four fields, then "tokens_source" when
 * rec->tokens says. The timestamp is written in whole milliseconds (rounded down). */
void kvr_trace_format(kvr_buf_t *out, const kvr_trace_rec_t *rec);

#endif

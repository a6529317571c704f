/* trace_out.h -- the router's live traffic written as a prefix-hashed trace (`serve --trace-out`).
 *
 * One line per completed proxied request, in the format of proto/trace.h, so the file replays with
 * `kvrouter bench --workload trace:FILE` (and with every other tool that reads Mooncake-style
 * traces): its arrival in ms from the file's start, its prompt and output tokens (the worker's
 * usage when the answer carried it, else the router's estimate: "tokens_source" says which), and
 * the hash ids of its prompt's blocks. No text and no content hash ever leaves the process: a
 * trace block's id is the chained hash of its last router block (which names the whole prefix up to
 * it), remapped to a small integer in first-seen order per file, so two requests share exactly as
 * many leading ids as their prompts share leading trace blocks.
 *
 * Trace blocks are block_tokens tokens (default 512, the format's); with the router's block of
 * block_chars bytes and KVR_CHARS_PER_TOKEN bytes a token, one trace block spans
 * block_tokens * KVR_CHARS_PER_TOKEN / block_chars router blocks (at least 1). The line holds
 * ceil(input_length / block_tokens) ids: one per trace block whose router blocks are all hashed
 * (the last, partial trace block only when the prompt ends on a router block's boundary), then
 * fresh ids no other request shares: content the router did not hash (a prompt's tail shorter
 * than a router block, tokens the worker counted beyond the router's estimate) is never claimed
 * shared.
 *
 * Size: past max_bytes the file is renamed FILE.1 (replacing an older one) and a new FILE starts,
 * with its own time origin and id numbering, so each file replays on its own and at most about
 * 2 x max_bytes of disk is used. Written from the loop's thread through stdio's buffer, flushed by
 * a write a second or more after the last flush, by kvr_trace_out_flush() and at close.
 */
#ifndef KVR_TRACE_OUT_H
#define KVR_TRACE_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kvr_trace_out_s kvr_trace_out_t;

/* Opens (truncates) path. NULL with a one-line reason in err when it cannot be written or
 * block_chars / block_tokens is 0. now_ns is the time origin (the monotonic clock). */
kvr_trace_out_t *kvr_trace_out_open(const char *path, uint64_t max_bytes, size_t block_chars,
                                    size_t block_tokens, uint64_t now_ns, char *err, size_t errlen);

/* What one completed request puts in the trace. blocks are its prompt's chained router-block
 * hashes (nblocks of them, leading first), prompt_chars the canonical prompt's bytes. */
typedef struct kvr_trace_out_req_s {
  uint64_t arrival_ns; /* monotonic */
  const uint64_t *blocks;
  size_t nblocks;
  size_t prompt_chars;
  uint64_t input_tokens, output_tokens;
  bool from_usage; /* the token counts are the worker's usage, not the router's estimate */
} kvr_trace_out_req_t;

/* Appends one line; rotates first when the file is past max_bytes. Returns 0 or KVR_EIO (the
 * write failed: the line is lost, counted, and logged once). */
int kvr_trace_out_write(kvr_trace_out_t *t, const kvr_trace_out_req_t *req, uint64_t now_ns);

/* Writes what stdio holds. */
void kvr_trace_out_flush(kvr_trace_out_t *t);

/* Lines written and lines lost to write errors since the router started. */
uint64_t kvr_trace_out_lines(const kvr_trace_out_t *t);
uint64_t kvr_trace_out_errors(const kvr_trace_out_t *t);

/* Flushes, closes and frees; accepts NULL. */
void kvr_trace_out_close(kvr_trace_out_t *t);

#endif

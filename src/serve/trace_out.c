/* trace_out.c -- `serve --trace-out`: completed requests as trace lines (trace_out.h).
 *
 * Structs: kvr_trace_out_t holds the FILE, the byte count of the current file, its time origin,
 * and the id map: an open-addressing table from a trace block's chained hash to its small id
 * (first seen, first numbered), doubled when half full. Flow per request: its router blocks are
 * grouped into trace blocks; each full group's last hash is looked up (or numbered), the rest of
 * the ids the line needs are fresh numbers; the line is formatted by proto/trace.c and written.
 * Invariant: ids are unique per file and never reveal a hash; the map is dropped with its file.
 */
#include "serve/trace_out.h"

#include "base/buf.h"
#include "base/kvr.h"
#include "base/log.h"
#include "policies/policy.h" /* KVR_CHARS_PER_TOKEN */
#include "proto/trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot_s {
  uint64_t hash;
  uint64_t id; /* 0: empty (ids count from 1 in the table, written as id - 1) */
} slot_t;

struct kvr_trace_out_s {
  char *path, *rotated; /* FILE and FILE.1 */
  FILE *f;
  uint64_t max_bytes, bytes;
  uint64_t origin_ns;
  size_t group; /* router blocks per trace block */
  size_t block_chars;
  size_t block_tokens;
  slot_t *map;
  size_t cap, used;
  uint64_t next_id;
  uint64_t lines, errors;
  uint64_t flushed_ns; /* the last flush: stdio's buffer is written at most a second late */
  bool error_logged;
  kvr_buf_t line;
  uint64_t *ids;
  size_t ids_cap;
};

static void map_reset(kvr_trace_out_t *t) {
  free(t->map);
  t->cap = 1024;
  t->map = kvr_xcalloc(t->cap, sizeof *t->map);
  t->used = 0;
  t->next_id = 0;
}

static void map_grow(kvr_trace_out_t *t) {
  slot_t *old = t->map;
  size_t oldcap = t->cap;
  t->cap *= 2;
  t->map = kvr_xcalloc(t->cap, sizeof *t->map);
  for (size_t i = 0; i < oldcap; i++) {
    if (old[i].id == 0)
      continue;
    size_t j = (size_t)old[i].hash & (t->cap - 1);
    while (t->map[j].id)
      j = (j + 1) & (t->cap - 1);
    t->map[j] = old[i];
  }
  free(old);
}

/* The id of a trace block's hash, numbered now when first seen. */
static uint64_t map_id(kvr_trace_out_t *t, uint64_t hash) {
  if (2 * (t->used + 1) > t->cap)
    map_grow(t);
  size_t j = (size_t)hash & (t->cap - 1);
  while (t->map[j].id && t->map[j].hash != hash)
    j = (j + 1) & (t->cap - 1);
  if (t->map[j].id == 0) {
    t->map[j].hash = hash;
    t->map[j].id = ++t->next_id;
    t->used++;
  }
  return t->map[j].id - 1;
}

static int open_file(kvr_trace_out_t *t, uint64_t now_ns, char *err, size_t errlen) {
  t->f = fopen(t->path, "w");
  if (t->f == NULL) {
    snprintf(err, errlen, "--trace-out %s: %s", t->path, strerror(errno));
    return KVR_EIO;
  }
  t->bytes = 0;
  t->origin_ns = now_ns;
  map_reset(t);
  return 0;
}

kvr_trace_out_t *kvr_trace_out_open(const char *path, uint64_t max_bytes, size_t block_chars,
                                    size_t block_tokens, uint64_t now_ns, char *err,
                                    size_t errlen) {
  if (block_chars == 0 || block_tokens == 0) {
    snprintf(err, errlen, "--trace-out: block sizes must be positive");
    return NULL;
  }
  kvr_trace_out_t *t = kvr_xcalloc(1, sizeof *t);
  t->path = kvr_xstrdup(path);
  kvr_buf_t r = KVR_BUF_INIT;
  kvr_buf_printf(&r, "%s.1", path);
  t->rotated = kvr_buf_steal(&r);
  t->max_bytes = max_bytes;
  t->block_tokens = block_tokens;
  t->block_chars = block_chars;
  size_t chars = block_tokens * KVR_CHARS_PER_TOKEN;
  t->group = chars >= block_chars ? (chars + block_chars / 2) / block_chars : 1;
  if (open_file(t, now_ns, err, errlen) != 0) {
    kvr_trace_out_close(t);
    return NULL;
  }
  return t;
}

/* Past max_bytes: FILE becomes FILE.1 and a new FILE starts, ids and time from zero. */
static void rotate(kvr_trace_out_t *t, uint64_t now_ns) {
  fclose(t->f);
  t->f = NULL;
  char err[256];
  if (rename(t->path, t->rotated) != 0 || open_file(t, now_ns, err, sizeof err) != 0)
    KVR_WARN("trace", "cannot rotate %s: %s", t->path, strerror(errno));
}

/* The ids of one request: a full group of router blocks takes its last block's id, and so does
 * the last, partial group when the router's blocks cover the prompt to its end; any other trace
 * block holds bytes the router did not hash, so it gets a fresh id (shared with nobody). */
static size_t request_ids(kvr_trace_out_t *t, const kvr_trace_out_req_t *req) {
  uint64_t want = (req->input_tokens + t->block_tokens - 1) / t->block_tokens;
  bool all_hashed = req->prompt_chars <= req->nblocks * t->block_chars;
  size_t n = 0;
  KVR_GROW(t->ids, n, t->ids_cap, (size_t)want + 1);
  for (size_t g = 0; n < want && g * t->group < req->nblocks; g++) {
    size_t end = (g + 1) * t->group;
    if (end > req->nblocks && !(all_hashed && n + 1 == want))
      break;
    t->ids[n++] = map_id(t, req->blocks[KVR_MIN(end, req->nblocks) - 1]);
  }
  while (n < want)
    t->ids[n++] = t->next_id++; /* never in the map: shared with no other request */
  return n;
}

int kvr_trace_out_write(kvr_trace_out_t *t, const kvr_trace_out_req_t *req, uint64_t now_ns) {
  if (t->f && t->max_bytes && t->bytes >= t->max_bytes)
    rotate(t, now_ns);
  if (t->f == NULL) {
    t->errors++;
    return KVR_EIO;
  }
  kvr_trace_rec_t rec = {
      .timestamp_ms =
          req->arrival_ns > t->origin_ns ? (double)(req->arrival_ns - t->origin_ns) / 1e6 : 0,
      .input_length = req->input_tokens,
      .output_length = req->output_tokens,
      .tokens = req->from_usage ? KVR_TRACE_TOKENS_USAGE : KVR_TRACE_TOKENS_ESTIMATE};
  rec.nhash = request_ids(t, req);
  rec.hash_ids = t->ids;
  kvr_buf_reset(&t->line);
  kvr_trace_format(&t->line, &rec);
  if (fwrite(t->line.data, 1, t->line.len, t->f) != t->line.len) {
    t->errors++;
    if (!t->error_logged)
      KVR_WARN("trace", "writing %s failed: %s (lines are lost; logged once)", t->path,
               strerror(errno));
    t->error_logged = true;
    return KVR_EIO;
  }
  t->bytes += t->line.len;
  t->lines++;
  if (now_ns - t->flushed_ns >= 1000000000ull) {
    fflush(t->f);
    t->flushed_ns = now_ns;
  }
  return 0;
}

void kvr_trace_out_flush(kvr_trace_out_t *t) {
  if (t && t->f)
    fflush(t->f);
}

uint64_t kvr_trace_out_lines(const kvr_trace_out_t *t) {
  return t ? t->lines : 0;
}

uint64_t kvr_trace_out_errors(const kvr_trace_out_t *t) {
  return t ? t->errors : 0;
}

void kvr_trace_out_close(kvr_trace_out_t *t) {
  if (t == NULL)
    return;
  if (t->f)
    fclose(t->f);
  free(t->path);
  free(t->rotated);
  free(t->map);
  free(t->ids);
  kvr_buf_free(&t->line);
  free(t);
}

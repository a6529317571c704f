/* trace_replay.c -- a prefix-hashed trace read, windowed, measured and turned into prompts
 * (trace_replay.h has the synthesis rule and why).
 *
 * Structs: kvr_trace_replay_t owns the window's requests (req_t: arrival, lengths, ids, the file
 * line), the indexes of those a level sends, and the figures (kvr_trace_stats_t, stats.h). seen_t
 * is a set of 64-bit prefix hashes (open addressing), the infinite cache of the figures.
 *
 * Flow: open() reads the file line by line through kvr_trace_parse() (the first bad line stops it
 * with "PATH:LINE: why"), orders the requests by arrival (ties by line), keeps the window's,
 * measures them (lengths, the infinite cache over the window) and set_context() picks the ones a
 * level sends and measures those (their rate, their own infinite cache). text() writes a sent
 * request's content block by block with block().
 *
 * Invariants: ids and lengths are the file's; arrivals are seconds from the window's first
 * request; sent[] is in arrival order; every figure is a pure function of the file, the options
 * and the context.
 */
#include "trace_replay.h"

#include "base/kvr.h"
#include "proto/trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES ((size_t)4 << 30)
#define CHARS KVR_TRACE_REPLAY_CHARS_PER_TOKEN
/* Ids the file does not give (a list shorter than the prompt's blocks): above any id a file can
 * hold (KVR_TRACE_INT_MAX, 2^53), unique per request line and block. */
#define FRESH_ID (UINT64_C(1) << 63)

typedef struct req_s {
  double arrival_s; /* trace seconds from the window's first request */
  uint64_t input, output;
  uint64_t *ids; /* owned */
  size_t nids;
  size_t line;        /* 1-based line in the file */
  uint64_t seen;      /* input tokens of its blocks seen earlier in the window */
  uint64_t sent_seen; /* the same among the sent requests */
  bool over;          /* longer than the context: not sent */
} req_t;

struct kvr_trace_replay_s {
  kvr_trace_replay_opts_t o;
  req_t *reqs; /* the window's, by arrival */
  size_t nreqs;
  size_t *sent; /* indexes into reqs of the requests a level sends */
  size_t nsent;
  double sent_t0; /* the first sent request's arrival */
  kvr_trace_stats_t st;
};

/* ---- the infinite cache: a set of prefix hashes ---------------------------------------------- */

typedef struct seen_s {
  uint64_t *slot; /* 0 = empty (a hash of 0 is stored as 1: a collision of no consequence) */
  size_t cap, used;
} seen_t;

static void seen_init(seen_t *s) {
  s->cap = 1024;
  s->used = 0;
  s->slot = kvr_xcalloc(s->cap, sizeof(*s->slot));
}

static bool seen_has(const seen_t *s, uint64_t h) {
  h = h ? h : 1;
  for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
    if (s->slot[i] == h)
      return true;
    if (s->slot[i] == 0)
      return false;
  }
}

static void seen_add(seen_t *s, uint64_t h);

static void seen_grow(seen_t *s) {
  seen_t big = {kvr_xcalloc(s->cap * 2, sizeof(uint64_t)), s->cap * 2, 0};
  for (size_t i = 0; i < s->cap; i++)
    if (s->slot[i])
      seen_add(&big, s->slot[i]);
  free(s->slot);
  *s = big;
}

static void seen_add(seen_t *s, uint64_t h) {
  h = h ? h : 1;
  if (2 * (s->used + 1) > s->cap)
    seen_grow(s);
  size_t i = h & (s->cap - 1);
  while (s->slot[i] != 0 && s->slot[i] != h)
    i = (i + 1) & (s->cap - 1);
  if (s->slot[i] == 0) {
    s->slot[i] = h;
    s->used++;
  }
}

/* The chained hash of a prefix that ends in id (the previous prefix's hash is h). */
static uint64_t chain(uint64_t h, uint64_t id) {
  uint64_t st = h ^ (id * UINT64_C(0xD1B54A32D192ED03));
  kvr_splitmix64(&st);
  return kvr_splitmix64(&st);
}

/* Input tokens of r's leading blocks whose whole prefix is in s, then r's prefixes added to s. */
static uint64_t seen_request(seen_t *s, const req_t *r, unsigned block, uint64_t *blocks_seen) {
  uint64_t h = 0, k = 0;
  bool hit = true;
  for (size_t i = 0; i < r->nids; i++) {
    h = chain(h, r->ids[i]);
    hit = hit && seen_has(s, h);
    k += hit;
    seen_add(s, h);
  }
  if (blocks_seen)
    *blocks_seen += k;
  return KVR_MIN(k * block, r->input);
}

/* ---- reading --------------------------------------------------------------------------------- */

static const char *base_name(const char *path) {
  const char *b = strrchr(path, '/');
  return b ? b + 1 : path;
}

static int cmp_arrival(const void *a, const void *b) {
  const req_t *x = a, *y = b;
  if (x->arrival_s != y->arrival_s)
    return x->arrival_s < y->arrival_s ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

static bool in_window(const kvr_trace_replay_opts_t *o, double t) {
  return t >= o->window_start_s && (o->window_end_s < 0 || t < o->window_end_s);
}

/* Parses every line of text into t->reqs (arrivals in absolute trace seconds for now), keeping
 * those in the window. Returns 0 or KVR_EINVAL with "PATH:LINE: why". */
static int parse_lines(kvr_trace_replay_t *t, const char *text, size_t len, char *err,
                       size_t errlen) {
  size_t cap = 0, line = 0;
  for (size_t pos = 0; pos < len;) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - text) : len;
    line++;
    kvr_trace_rec_t rec;
    char why[160];
    int rc = kvr_trace_parse(text + pos, end - pos, &rec, why, sizeof(why));
    pos = end + 1;
    if (rc == KVR_ENOENT)
      continue;
    if (rc != 0) {
      snprintf(err, errlen, "%s:%zu: %s", t->o.path, line, why);
      return KVR_EINVAL;
    }
    t->st.file_requests++;
    if (!in_window(&t->o, rec.timestamp_ms / 1000.0)) {
      kvr_trace_rec_free(&rec);
      continue;
    }
    if (t->nreqs == cap) {
      cap = cap ? cap * 2 : 1024;
      t->reqs = kvr_xrealloc(t->reqs, cap * sizeof(*t->reqs));
    }
    t->reqs[t->nreqs++] = (req_t){.arrival_s = rec.timestamp_ms / 1000.0,
                                  .input = rec.input_length,
                                  .output = rec.output_length,
                                  .ids = rec.hash_ids,
                                  .nids = rec.nhash,
                                  .line = line};
  }
  return 0;
}

/* ---- figures --------------------------------------------------------------------------------- */

/* Lengths, span, rate and the infinite cache over the window. */
static void measure_window(kvr_trace_replay_t *t) {
  kvr_trace_stats_t *st = &t->st;
  size_t n = t->nreqs;
  double *in = kvr_xmalloc(n * sizeof(double)), *out = kvr_xmalloc(n * sizeof(double));
  double *sh = kvr_xmalloc(n * sizeof(double));
  seen_t s;
  seen_init(&s);
  for (size_t i = 0; i < n; i++) {
    req_t *r = &t->reqs[i];
    r->seen = seen_request(&s, r, t->o.block_tokens, &st->blocks_seen);
    st->blocks += r->nids;
    st->input_tokens += r->input;
    st->tokens_seen += r->seen;
    st->shared_none += r->seen == 0;
    in[i] = (double)r->input;
    out[i] = (double)r->output;
    sh[i] = (double)r->seen;
  }
  free(s.slot);
  kvr_stats_dist(in, n, &st->input);
  kvr_stats_dist(out, n, &st->output);
  kvr_stats_dist(sh, n, &st->shared);
  free(in);
  free(out);
  free(sh);
  st->span_s = n ? t->reqs[n - 1].arrival_s : 0;
  st->mean_rate = n > 1 && st->span_s > 0 ? (double)(n - 1) / st->span_s : 0;
}

size_t kvr_trace_replay_set_context(kvr_trace_replay_t *t, uint64_t max_context) {
  kvr_trace_stats_t *st = &t->st;
  t->o.max_context = st->max_context = max_context;
  free(t->sent);
  t->sent = kvr_xmalloc((t->nreqs ? t->nreqs : 1) * sizeof(*t->sent));
  t->nsent = 0;
  st->over_context = 0;
  st->sent_input_tokens = st->sent_output_tokens = st->sent_tokens_seen = 0;
  seen_t s;
  seen_init(&s);
  for (size_t i = 0; i < t->nreqs; i++) {
    req_t *r = &t->reqs[i];
    r->over = max_context > 0 && r->input + KVR_MAX(r->output, 1) > max_context;
    if (r->over) {
      st->over_context++;
      continue;
    }
    r->sent_seen = seen_request(&s, r, t->o.block_tokens, NULL);
    st->sent_input_tokens += r->input;
    st->sent_output_tokens += KVR_MAX(r->output, 1);
    st->sent_tokens_seen += r->sent_seen;
    t->sent[t->nsent++] = i;
  }
  free(s.slot);
  st->sent = t->nsent;
  t->sent_t0 = t->nsent ? t->reqs[t->sent[0]].arrival_s : 0;
  st->sent_span_s = t->nsent ? t->reqs[t->sent[t->nsent - 1]].arrival_s - t->sent_t0 : 0;
  st->sent_rate =
      t->nsent > 1 && st->sent_span_s > 0 ? (double)(t->nsent - 1) / st->sent_span_s : 0;
  return t->nsent;
}

/* ---- open, free ------------------------------------------------------------------------------ */

static int check_opts(const kvr_trace_replay_opts_t *o, char *err, size_t errlen) {
  if (o->path == NULL || o->path[0] == '\0') {
    snprintf(err, errlen, "trace: needs a path (trace:FILE)");
    return KVR_EINVAL;
  }
  if (o->block_tokens < KVR_TRACE_REPLAY_MIN_BLOCK) {
    snprintf(err, errlen, "--trace-block-tokens: at least %d, not %u", KVR_TRACE_REPLAY_MIN_BLOCK,
             o->block_tokens);
    return KVR_EINVAL;
  }
  if (!(o->window_start_s >= 0) || (o->window_end_s >= 0 && o->window_end_s <= o->window_start_s)) {
    snprintf(err, errlen, "--trace-window: need 0 <= START_S < END_S");
    return KVR_EINVAL;
  }
  return 0;
}

kvr_trace_replay_t *kvr_trace_replay_open(const kvr_trace_replay_opts_t *opts, char *err,
                                          size_t errlen) {
  if (check_opts(opts, err, errlen) != 0)
    return NULL;
  kvr_trace_replay_t *t = kvr_xcalloc(1, sizeof(*t));
  t->o = *opts;
  t->o.path = kvr_xstrdup(opts->path);
  kvr_buf_t b = KVR_BUF_INIT;
  if (kvr_buf_read_file(&b, t->o.path, MAX_FILE_BYTES, err, errlen) != 0) {
    kvr_trace_replay_free(t);
    return NULL;
  }
  int rc = parse_lines(t, b.data ? b.data : "", b.len, err, errlen);
  kvr_buf_free(&b);
  if (rc == 0 && t->st.file_requests == 0) {
    snprintf(err, errlen, "%s: no requests", t->o.path);
    rc = KVR_EINVAL;
  } else if (rc == 0 && t->nreqs == 0) {
    char end[32] = "";
    if (opts->window_end_s >= 0)
      snprintf(end, sizeof(end), "%g", opts->window_end_s);
    snprintf(err, errlen, "%s: no request arrives in --trace-window %g:%s", t->o.path,
             opts->window_start_s, end);
    rc = KVR_EINVAL;
  }
  if (rc != 0) {
    kvr_trace_replay_free(t);
    return NULL;
  }
  qsort(t->reqs, t->nreqs, sizeof(*t->reqs), cmp_arrival);
  double t0 = t->reqs[0].arrival_s;
  for (size_t i = 0; i < t->nreqs; i++)
    t->reqs[i].arrival_s -= t0;
  kvr_trace_stats_t *st = &t->st;
  snprintf(st->file, sizeof(st->file), "%s", base_name(t->o.path));
  st->block_tokens = t->o.block_tokens;
  st->windowed = opts->window_start_s > 0 || opts->window_end_s >= 0;
  st->window_start_s = opts->window_start_s;
  st->window_end_s = opts->window_end_s;
  st->requests = t->nreqs;
  measure_window(t);
  kvr_trace_replay_set_context(t, opts->max_context);
  return t;
}

void kvr_trace_replay_free(kvr_trace_replay_t *t) {
  if (t == NULL)
    return;
  for (size_t i = 0; i < t->nreqs; i++)
    free(t->reqs[i].ids);
  free(t->reqs);
  free(t->sent);
  free((char *)t->o.path);
  free(t);
}

/* ---- accessors ------------------------------------------------------------------------------- */

const kvr_trace_stats_t *kvr_trace_replay_stats(const kvr_trace_replay_t *t) {
  return &t->st;
}

size_t kvr_trace_replay_count(const kvr_trace_replay_t *t) {
  return t->nsent;
}

/* Sent request i, wrapping around (a caller never asks past the count; none sent: the first). */
static const req_t *sent_req(const kvr_trace_replay_t *t, size_t i) {
  return &t->reqs[t->nsent ? t->sent[i % t->nsent] : 0];
}

double kvr_trace_replay_arrival_s(const kvr_trace_replay_t *t, size_t i) {
  return sent_req(t, i)->arrival_s - t->sent_t0;
}

uint64_t kvr_trace_replay_input(const kvr_trace_replay_t *t, size_t i) {
  return sent_req(t, i)->input;
}

uint64_t kvr_trace_replay_output(const kvr_trace_replay_t *t, size_t i) {
  return sent_req(t, i)->output;
}

uint64_t kvr_trace_replay_seen(const kvr_trace_replay_t *t, size_t i) {
  return sent_req(t, i)->sent_seen;
}

double kvr_trace_replay_factor(const kvr_trace_replay_t *t, double rate) {
  return t->st.sent_rate > 0 && rate > 0 ? t->st.sent_rate / rate : 0;
}

/* ---- synthesis ------------------------------------------------------------------------------- */

/* Words of 1-4 letters: a BPE tokenizer reads each (with its space) as about one token, and they
 * average about 4 characters with the space, the rate the simulator counts. Each is stored with
 * its space in 8 bytes, so that block() copies a word and its space as one 8-byte move. */
typedef struct word_s {
  char s[8];   /* the word, its space, then NULs */
  uint8_t len; /* the word's letters */
} word_t;

static const word_t words[] = {
    {"a ", 1},    {"I ", 1},    {"of ", 2},   {"to ", 2},   {"in ", 2},   {"is ", 2},
    {"it ", 2},   {"on ", 2},   {"at ", 2},   {"by ", 2},   {"we ", 2},   {"he ", 2},
    {"as ", 2},   {"or ", 2},   {"an ", 2},   {"be ", 2},   {"do ", 2},   {"so ", 2},
    {"up ", 2},   {"if ", 2},   {"my ", 2},   {"no ", 2},   {"go ", 2},   {"me ", 2},
    {"us ", 2},   {"am ", 2},   {"ok ", 2},   {"oh ", 2},   {"hi ", 2},   {"the ", 3},
    {"and ", 3},  {"for ", 3},  {"not ", 3},  {"but ", 3},  {"all ", 3},  {"can ", 3},
    {"had ", 3},  {"her ", 3},  {"was ", 3},  {"one ", 3},  {"our ", 3},  {"out ", 3},
    {"day ", 3},  {"get ", 3},  {"has ", 3},  {"him ", 3},  {"his ", 3},  {"how ", 3},
    {"man ", 3},  {"new ", 3},  {"now ", 3},  {"old ", 3},  {"see ", 3},  {"two ", 3},
    {"way ", 3},  {"who ", 3},  {"did ", 3},  {"its ", 3},  {"let ", 3},  {"put ", 3},
    {"say ", 3},  {"she ", 3},  {"too ", 3},  {"use ", 3},  {"any ", 3},  {"big ", 3},
    {"end ", 3},  {"far ", 3},  {"few ", 3},  {"got ", 3},  {"own ", 3},  {"run ", 3},
    {"set ", 3},  {"try ", 3},  {"why ", 3},  {"yes ", 3},  {"ask ", 3},  {"men ", 3},
    {"off ", 3},  {"sun ", 3},  {"air ", 3},  {"that ", 4}, {"with ", 4}, {"have ", 4},
    {"this ", 4}, {"from ", 4}, {"they ", 4}, {"will ", 4}, {"what ", 4}, {"when ", 4},
    {"your ", 4}, {"said ", 4}, {"each ", 4}, {"more ", 4}, {"time ", 4}, {"some ", 4},
    {"like ", 4}, {"into ", 4}, {"them ", 4}, {"than ", 4}, {"then ", 4}, {"made ", 4},
    {"many ", 4}, {"over ", 4}, {"such ", 4}, {"only ", 4}, {"also ", 4}, {"back ", 4},
    {"even ", 4}, {"most ", 4}, {"well ", 4}, {"work ", 4}, {"year ", 4}, {"life ", 4},
    {"very ", 4}, {"just ", 4}, {"know ", 4}, {"take ", 4}, {"good ", 4}, {"come ", 4},
    {"long ", 4},
};

static const char digits64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* The id's code, then words with their spaces, cut at chars. The words go straight into the
 * buffer reserved for them: a word and its space are 2-5 bytes, written as 8, so the last one may
 * write 7 bytes past chars, inside the chars + 8 reserved (and cut off by the length). */
void kvr_trace_replay_block(uint64_t seed, uint64_t k, uint64_t id, size_t chars, kvr_buf_t *out) {
  size_t start = out->len;
  kvr_buf_reserve(out, chars + 8);
  /* The id, lowest base-64 digit first: different ids differ in the first token. */
  char code[KVR_TRACE_REPLAY_ID_CHARS];
  uint64_t v = id;
  for (size_t i = 0; i + 1 < sizeof(code); i++, v >>= 6)
    code[i] = digits64[v & 63];
  code[sizeof(code) - 1] = ' ';
  size_t ncode = KVR_MIN(chars, sizeof(code));
  memcpy(out->data + start, code, ncode);
  uint64_t st = seed ^ (k * UINT64_C(0x9E3779B97F4A7C15));
  st = kvr_splitmix64(&st) ^ (id * UINT64_C(0xD1B54A32D192ED03));
  char *p = out->data + start + ncode, *end = out->data + start + chars;
  while (p < end) {
    const word_t *w = &words[kvr_splitmix64(&st) % KVR_ARRAY_SIZE(words)];
    memcpy(p, w->s, sizeof(w->s));
    p += w->len + 1;
  }
  out->len = start + chars;
  out->data[out->len] = '\0';
}

/* Template tokens before the content and in all. */
static unsigned before(const kvr_trace_replay_t *t) {
  return t->o.chat ? KVR_TRACE_REPLAY_CHAT_BEFORE : KVR_TRACE_REPLAY_TEXT_BEFORE;
}
static unsigned overhead(const kvr_trace_replay_t *t) {
  return t->o.chat ? KVR_TRACE_REPLAY_CHAT_BEFORE + KVR_TRACE_REPLAY_CHAT_AFTER
                   : KVR_TRACE_REPLAY_TEXT_BEFORE;
}

void kvr_trace_replay_text(const kvr_trace_replay_t *t, uint64_t seed, size_t i, kvr_buf_t *out) {
  const req_t *r = sent_req(t, i);
  uint64_t B = t->o.block_tokens, pre = before(t);
  uint64_t content = r->input > overhead(t) ? r->input - overhead(t) : 0; /* tokens */
  kvr_buf_reserve(out, (size_t)content * CHARS + 1);
  /* Block k holds prompt tokens [k B, (k+1) B): content tokens [k B - pre, (k+1) B - pre). */
  for (uint64_t k = 0, c = 0; c < content; k++) {
    uint64_t end = KVR_MIN((k + 1) * B - pre, content);
    uint64_t id = k < r->nids ? r->ids[k] : FRESH_ID | (uint64_t)r->line << 20 | k;
    kvr_trace_replay_block(seed, k, id, (size_t)(end - c) * CHARS, out);
    c = end;
  }
}

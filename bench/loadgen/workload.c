/* workload.c -- synthetic workloads, file loaders and request bodies for `kvrouter bench`.
 *
 * Structs: kvr_workload_t owns the options, the shared text pool (multiturn starters or documents,
 * generated once from the workload seed) and, for file workloads, the loaded conversations.
 * kvr_conv_t is one conversation handed to the load generator; it borrows shared text from the
 * workload and owns its turns.
 *
 * Flow: kvr_workload_new() builds the pool, parses the file or opens the trace (trace_replay.h,
 * which reads it and writes each request's prompt); the load generator asks for
 * conversation k of a level with kvr_workload_conv() and renders each turn's request with
 * kvr_workload_body(), passing the answers it actually streamed back. agentic and hot-prefix build
 * their conversations in agentic_conv() and hot_conv(); agentic takes its own output defaults in
 * apply_kind_defaults() (kvr_workload_new) for every --output-* field left at the global default.
 * A mix (several models) owns one workload per part, made from the same options with the part's
 * kind and a seed of its own (mix_new); mix_conv() draws the part of conversation k and asks that
 * part's workload for its conversation k, naming the part's model in it.
 *
 * Invariants: every random choice comes from a kvr_rng_t seeded by kvr_workload_mix() of the
 * workload seed, the level seed and k, so a conversation never depends on what was generated before
 * it (levels and A/B labels are paired exactly). Text is generated at ~4 characters per token.
 */
#include "workload.h"
#include "trace_replay.h"

#include "base/kvr.h"
#include "proto/trace.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE_BYTES ((size_t)1 << 30)

/* ---- PRNG ------------------------------------------------------------------------------------ */

void kvr_workload_rng_seed(kvr_rng_t *r, uint64_t seed) {
  r->s = seed;
}

uint64_t kvr_workload_rng_u64(kvr_rng_t *r) {
  return kvr_splitmix64(&r->s);
}

double kvr_workload_rng_unit(kvr_rng_t *r) {
  return (double)(kvr_workload_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t kvr_workload_rng_range(kvr_rng_t *r, uint64_t lo, uint64_t hi) {
  if (hi <= lo)
    return lo;
  return lo + kvr_workload_rng_u64(r) % (hi - lo + 1);
}

double kvr_workload_rng_normal(kvr_rng_t *r) {
  double u1 = kvr_workload_rng_unit(r);
  double u2 = kvr_workload_rng_unit(r);
  if (u1 < 1e-300)
    u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double kvr_workload_rng_gamma(kvr_rng_t *r, double shape, double scale) {
  if (shape < 1.0) {
    /* Boost: Gamma(a) = Gamma(a + 1) * U^(1/a). */
    double u = kvr_workload_rng_unit(r);
    return kvr_workload_rng_gamma(r, shape + 1.0, scale) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
  }
  double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = kvr_workload_rng_normal(r);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    double u = kvr_workload_rng_unit(r);
    if (u < 1.0 - 0.0331 * x * x * x * x)
      return d * v * scale;
    if (log(u > 0 ? u : 1e-300) < 0.5 * x * x + d * (1.0 - v + log(v)))
      return d * v * scale;
  }
}

uint64_t kvr_workload_mix(uint64_t a, uint64_t b) {
  kvr_rng_t r = {a ^ (b * 0xD1B54A32D192ED03ull + 0x8CB92BA72F3D8DD7ull)};
  kvr_workload_rng_u64(&r);
  return kvr_workload_rng_u64(&r);
}

/* ---- synthetic text -------------------------------------------------------------------------- */

static const char *const words[] = {
    "the",        "system",     "memory",     "request",     "cache",     "model",     "token",
    "server",     "process",    "network",    "data",        "layer",     "attention", "batch",
    "latency",    "throughput", "scheduler",  "kernel",      "device",    "buffer",    "queue",
    "of",         "and",        "to",         "in",          "is",        "for",       "with",
    "that",       "on",         "as",         "by",          "from",      "each",      "which",
    "when",       "a",          "an",         "its",         "their",     "this",      "every",
    "large",      "small",      "shared",     "distributed", "parallel",  "efficient", "stable",
    "history",    "river",      "mountain",   "city",        "century",   "empire",    "language",
    "culture",    "economy",    "population", "region",      "trade",     "science",   "theory",
    "experiment", "energy",     "structure",  "function",    "protein",   "cell",      "species",
    "computes",   "stores",     "reuses",     "describes",   "explains",  "measures",  "transfers",
    "improves",   "reduces",    "increases",  "follows",     "contains",  "supports",  "produces",
    "early",      "modern",     "ancient",    "northern",    "important", "complex",   "simple",
    "between",    "through",    "during",     "after",       "before",    "under",     "across",
    "algorithm",  "protocol",   "interface",  "decoder",     "encoder",   "sequence",  "vector",
    "matrix",     "gradient",   "parameter",  "weights",     "prefix",    "block",     "worker",
    "router",     "policy",     "balance",    "load",        "traffic",   "session",   "user",
};

static const char *const openers[] = {
    "Summarize the key points of the text above.",
    "Explain the main ideas of the text above in detail.",
    "What are the most important facts in the text above?",
    "Write a detailed technical explanation of the text above.",
};

static const char *const followups[] = {
    "Can you elaborate further on that?",           "Please explain that in more detail.",
    "What are the implications of this?",           "Can you give a concrete example?",
    "How does this compare with the alternatives?", "Why does that matter?",
};

static const char *const tasks[] = {
    "Task: find the failing test in the repository with the tools above and fix it.",
    "Task: read the logs with the tools above and explain why the service restarted.",
    "Task: add input validation to the configuration loader, using the tools above.",
    "Task: profile the slow endpoint with the tools above and propose a fix.",
};

static const char *const questions[] = {
    "What is the main argument of the document above?",
    "Which numbers in the document above are the most important, and why?",
    "List the people or systems the document above mentions and their roles.",
    "What would a critic say about the document above?",
    "Summarize the second half of the document above.",
    "What questions does the document above leave open?",
    "Explain the document above to a newcomer.",
    "What are the causes and effects described in the document above?",
};

void kvr_workload_text(kvr_rng_t *r, size_t chars, kvr_buf_t *out) {
  size_t start = out->len;
  kvr_buf_reserve(out, chars + 32);
  while (out->len - start < chars) {
    unsigned n = (unsigned)kvr_workload_rng_range(r, 8, 20);
    for (unsigned i = 0; i < n; i++) {
      const char *w = words[kvr_workload_rng_u64(r) % KVR_ARRAY_SIZE(words)];
      if (i == 0) {
        char cap = w[0] >= 'a' && w[0] <= 'z' ? (char)(w[0] - 'a' + 'A') : w[0];
        kvr_buf_append(out, &cap, 1);
        kvr_buf_puts(out, w + 1);
      } else {
        kvr_buf_append(out, " ", 1);
        kvr_buf_puts(out, w);
      }
    }
    /* Paragraph breaks every few sentences, as prose has. */
    kvr_buf_puts(out, kvr_workload_rng_u64(r) % 6 == 0 ? ".\n\n" : ". ");
  }
}

/* ---- options --------------------------------------------------------------------------------- */

void kvr_workload_opts_default(kvr_workload_opts_t *o) {
  memset(o, 0, sizeof(*o));
  o->kind = KVR_WL_MULTITURN;
  o->seed = 42;
  o->turns = 5;
  o->starters = 10;
  o->documents = 150;
  o->questions = 4;
  o->prefix_min_tokens = 3500;
  o->prefix_max_tokens = 4000;
  o->control_min_tokens = 3500;
  o->control_max_tokens = 7000;
  o->out_mean = 830;
  o->out_std = 300;
  o->out_min = 64;
  o->out_max = 2048;
  o->think_mean_s = 1.0;
  o->replay = true;
  o->replay_width = 16;
  o->agentic_turns_min = 20;
  o->agentic_turns_max = 60;
  o->tool_min_tokens = 500;
  o->tool_max_tokens = 3000;
  o->agentic_max_context = 100000;
  o->hot_fraction = 0.8;
  o->trace_block_tokens = KVR_TRACE_BLOCK_TOKENS_DEFAULT;
  o->trace_window_start_s = 0;
  o->trace_window_end_s = -1;
}

/* Parses one of two names into a flag: off_name -> false, on_name -> true. */
static int parse_flag(const char *spec, const char *off_name, const char *on_name, bool *out) {
  if (strcmp(spec, on_name) == 0)
    *out = true;
  else if (strcmp(spec, off_name) == 0)
    *out = false;
  else
    return KVR_EINVAL;
  return 0;
}

int kvr_workload_parse_mode(const char *spec, kvr_workload_opts_t *o) {
  return parse_flag(spec, "session", "replay", &o->replay);
}

int kvr_workload_parse_order(const char *spec, kvr_workload_opts_t *o) {
  return parse_flag(spec, "blocks", "sample", &o->replay_sample);
}

int kvr_workload_parse_kind(const char *spec, kvr_workload_opts_t *o) {
  if (strcmp(spec, "multiturn") == 0)
    o->kind = KVR_WL_MULTITURN;
  else if (strcmp(spec, "documents") == 0)
    o->kind = KVR_WL_DOCUMENTS;
  else if (strcmp(spec, "control") == 0)
    o->kind = KVR_WL_CONTROL;
  else if (strcmp(spec, "agentic") == 0)
    o->kind = KVR_WL_AGENTIC;
  else if (strcmp(spec, "hot-prefix") == 0)
    o->kind = KVR_WL_HOT_PREFIX;
  else if (strncmp(spec, "file:", 5) == 0 && spec[5] != '\0') {
    o->kind = KVR_WL_FILE;
    o->path = spec + 5;
    o->sharegpt_vllm = false;
  } else if (strncmp(spec, "sharegpt:", 9) == 0 && spec[9] != '\0') {
    o->kind = KVR_WL_FILE;
    o->path = spec + 9;
    o->sharegpt_vllm = true;
  } else if (strncmp(spec, "trace:", 6) == 0 && spec[6] != '\0') {
    o->kind = KVR_WL_TRACE;
    o->path = spec + 6;
  } else if (strncmp(spec, "mix:", 4) == 0 && spec[4] != '\0') {
    o->kind = KVR_WL_MIX;
    o->path = spec + 4;
  } else
    return KVR_EINVAL;
  return 0;
}

int kvr_workload_parse_window(const char *spec, kvr_workload_opts_t *o) {
  char *end;
  double a = strtod(spec, &end), b = -1;
  if (end == spec || *end != ':' || !(a >= 0) || !isfinite(a))
    return KVR_EINVAL;
  const char *rest = end + 1;
  if (*rest != '\0') {
    b = strtod(rest, &end);
    if (end == rest || *end != '\0' || !(b > a) || !isfinite(b))
      return KVR_EINVAL;
  }
  o->trace_window_start_s = a;
  o->trace_window_end_s = b;
  return 0;
}

/* One part of a mix, "MODEL=KIND@WEIGHT" (len bytes at s), into *p. 0 or -1 with err. */
static int mix_part(const char *s, size_t len, kvr_wl_mix_part_t *p, char *err, size_t errlen) {
  char buf[256];
  if (len >= sizeof(buf)) {
    snprintf(err, errlen, "workload: mix: part '%.40s...' is too long", s);
    return -1;
  }
  memcpy(buf, s, len);
  buf[len] = '\0';
  char *eq = strchr(buf, '='), *at = strrchr(buf, '@');
  if (eq == NULL || at == NULL || at < eq) {
    snprintf(err, errlen, "workload: mix: part '%s' is not MODEL=KIND@WEIGHT", buf);
    return -1;
  }
  *eq = *at = '\0';
  size_t mlen = strlen(buf);
  if (mlen == 0 || mlen >= sizeof(p->model) || strchr(buf, '@') != NULL) {
    snprintf(err, errlen, "workload: mix: part '%.200s': the model must be 1-%zu bytes, no '@'", s,
             sizeof(p->model) - 1);
    return -1;
  }
  kvr_workload_opts_t k;
  kvr_workload_opts_default(&k);
  if (kvr_workload_parse_kind(eq + 1, &k) != 0 || k.kind == KVR_WL_FILE || k.kind == KVR_WL_TRACE ||
      k.kind == KVR_WL_MIX) {
    snprintf(err, errlen,
             "workload: mix: part '%s': kind '%s' is not multiturn, documents, control, agentic "
             "or hot-prefix",
             buf, eq + 1);
    return -1;
  }
  char *end;
  double w = strtod(at + 1, &end);
  if (end == at + 1 || *end != '\0' || !(w > 0) || !isfinite(w)) {
    snprintf(err, errlen, "workload: mix: part '%s': weight '%s' is not a positive number", buf,
             at + 1);
    return -1;
  }
  memcpy(p->model, buf, mlen + 1); /* mlen < sizeof(p->model), checked above */
  p->kind = k.kind;
  p->weight = w;
  return 0;
}

int kvr_workload_mix_parse(const char *spec, kvr_wl_mix_part_t parts[KVR_WL_MIX_MAX], size_t *n,
                           char *err, size_t errlen) {
  *n = 0;
  if (spec == NULL || spec[0] == '\0') {
    snprintf(err, errlen, "workload: mix: needs MODEL=KIND@WEIGHT[,...]");
    return KVR_EINVAL;
  }
  for (const char *s = spec;;) {
    const char *comma = strchr(s, ',');
    size_t len = comma ? (size_t)(comma - s) : strlen(s);
    if (*n == KVR_WL_MIX_MAX) {
      snprintf(err, errlen, "workload: mix: more than %d parts", KVR_WL_MIX_MAX);
      return KVR_EINVAL;
    }
    if (mix_part(s, len, &parts[*n], err, errlen) != 0)
      return KVR_EINVAL;
    for (size_t i = 0; i < *n; i++)
      if (strcmp(parts[i].model, parts[*n].model) == 0) {
        snprintf(err, errlen, "workload: mix: model '%s' is named twice", parts[i].model);
        return KVR_EINVAL;
      }
    (*n)++;
    if (comma == NULL)
      return 0;
    s = comma + 1;
  }
}

/* ---- the workload ---------------------------------------------------------------------------- */

typedef struct file_conv_s {
  char *system;
  char *prefix;
  kvr_turn_t *turns;
  uint32_t nturns;
} file_conv_t;

struct kvr_workload_s {
  kvr_workload_opts_t opts;
  char *path; /* owned copy of opts.path */
  char name[96];
  char **pool; /* starters (multiturn) or documents; owned */
  size_t npool;
  file_conv_t *convs; /* file workloads; owned */
  size_t nconvs;
  kvr_trace_replay_t *trace;               /* trace workloads; owned */
  kvr_wl_mix_part_t parts[KVR_WL_MIX_MAX]; /* mix: the parts, */
  kvr_workload_t *subs[KVR_WL_MIX_MAX];    /* each one's workload (owned), */
  size_t nparts;
  double wsum; /* and the sum of their weights */
};

static void file_conv_free(file_conv_t *c) {
  free(c->system);
  free(c->prefix);
  for (uint32_t i = 0; i < c->nturns; i++) {
    free(c->turns[i].user);
    free(c->turns[i].answer);
  }
  free(c->turns);
}

void kvr_workload_free(kvr_workload_t *wl) {
  if (wl == NULL)
    return;
  for (size_t i = 0; i < wl->npool; i++)
    free(wl->pool[i]);
  free(wl->pool);
  for (size_t i = 0; i < wl->nconvs; i++)
    file_conv_free(&wl->convs[i]);
  free(wl->convs);
  free(wl->path);
  kvr_trace_replay_free(wl->trace);
  for (size_t i = 0; i < wl->nparts; i++)
    kvr_workload_free(wl->subs[i]);
  free(wl);
}

static char *pool_text(uint64_t seed, uint64_t i, const char *kind, unsigned tokens) {
  kvr_rng_t r;
  kvr_workload_rng_seed(&r, kvr_workload_mix(seed, i));
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_printf(&b, "%s %llu.\n\n", kind, (unsigned long long)i + 1);
  kvr_workload_text(&r, (size_t)tokens * KVR_WORKLOAD_CHARS_PER_TOKEN - b.len, &b);
  return kvr_buf_steal(&b);
}

/* Appends synthetic text to b until b holds exactly `tokens` tokens (~4 characters each) of text:
 * b's header counts, the text is cut mid-word if need be. */
static void text_exact(kvr_rng_t *r, unsigned tokens, kvr_buf_t *b) {
  size_t chars = (size_t)tokens * KVR_WORKLOAD_CHARS_PER_TOKEN;
  if (b->len < chars)
    kvr_workload_text(r, chars - b->len, b);
  if (b->len > chars) {
    b->len = chars;
    b->data[chars] = '\0';
  }
}

/* Tokens of a text at ~4 characters per token, rounded up. */
static uint64_t text_tokens(const char *s) {
  return (strlen(s) + KVR_WORKLOAD_CHARS_PER_TOKEN - 1) / KVR_WORKLOAD_CHARS_PER_TOKEN;
}

static uint32_t clip_tokens(const kvr_workload_opts_t *o, double v) {
  if (v < o->out_min)
    v = o->out_min;
  if (v > o->out_max)
    v = o->out_max;
  return (uint32_t)llround(v);
}

static char *read_file(const char *path, size_t *len, char *err, size_t errlen) {
  kvr_buf_t b = KVR_BUF_INIT;
  if (kvr_buf_read_file(&b, path, MAX_FILE_BYTES, err, errlen) != 0)
    return NULL;
  *len = b.len;
  return kvr_buf_steal(&b); /* NUL-terminated, "" for an empty file */
}

static void conv_push_turn(file_conv_t *c, const char *user, uint32_t max_tokens, double think) {
  c->turns = kvr_xrealloc(c->turns, (c->nturns + 1) * sizeof(*c->turns));
  c->turns[c->nturns].user = kvr_xstrdup(user);
  c->turns[c->nturns].max_tokens = max_tokens;
  c->turns[c->nturns].think_s = think;
  c->turns[c->nturns].answer = NULL;
  c->nturns++;
}

static void push_conv(kvr_workload_t *wl, file_conv_t *c) {
  wl->convs = kvr_xrealloc(wl->convs, (wl->nconvs + 1) * sizeof(*wl->convs));
  wl->convs[wl->nconvs++] = *c;
}

/* vllm's ShareGPT sample of one entry (ShareGPTDataset.sample and is_valid_sequence in
 * vllm/benchmarks/datasets.py): the first message is the prompt, the second's tokens the output
 * length (or opts.sharegpt_output_len); kept when the prompt has 4-1024 tokens, the output at least
 * 4 (unless fixed) and both at most 2048. Returns false for an entry vllm skips. */
static bool sharegpt_vllm_entry(const kvr_workload_t *wl, const cJSON *msgs, file_conv_t *c) {
  const cJSON *m0 = cJSON_GetArrayItem(msgs, 0), *m1 = cJSON_GetArrayItem(msgs, 1);
  const cJSON *v0 = cJSON_GetObjectItemCaseSensitive(m0, "value");
  const cJSON *v1 = cJSON_GetObjectItemCaseSensitive(m1, "value");
  if (cJSON_GetArraySize(msgs) < 2 || !cJSON_IsString(v0) || !cJSON_IsString(v1))
    return false;
  uint64_t in = text_tokens(v0->valuestring);
  unsigned fixed = wl->opts.sharegpt_output_len;
  uint64_t out = fixed ? fixed : text_tokens(v1->valuestring);
  if (in < 4 || (!fixed && out < 4) || in > 1024 || in + out > 2048)
    return false;
  conv_push_turn(c, v0->valuestring, (uint32_t)KVR_MAX(out, 1), 0.0);
  return true;
}

/* ShareGPT: [{"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}, ...]}, ...]. The
 * recorded reply after each human message sets that turn's max_tokens (~4 chars per token); with
 * opts.sharegpt_vllm each entry is one prompt as vllm samples it (sharegpt_vllm_entry). */
static int load_sharegpt(kvr_workload_t *wl, const cJSON *root, char *err, size_t errlen) {
  size_t idx = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, root) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(item, "conversations");
    if (!cJSON_IsArray(msgs))
      msgs = cJSON_GetObjectItemCaseSensitive(item, "conversation");
    if (!cJSON_IsArray(msgs)) {
      snprintf(err, errlen, "%s: [%zu].conversations: missing or not an array", wl->path, idx);
      return KVR_EPARSE;
    }
    file_conv_t c = {0};
    if (wl->opts.sharegpt_vllm) {
      if (sharegpt_vllm_entry(wl, msgs, &c))
        push_conv(wl, &c);
      idx++;
      continue;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
      const cJSON *from = cJSON_GetObjectItemCaseSensitive(m, "from");
      const cJSON *value = cJSON_GetObjectItemCaseSensitive(m, "value");
      if (!cJSON_IsString(from) || !cJSON_IsString(value)) {
        snprintf(err, errlen, "%s: [%zu].conversations: entries need string from/value", wl->path,
                 idx);
        file_conv_free(&c);
        return KVR_EPARSE;
      }
      const char *f = from->valuestring;
      if (strcmp(f, "human") == 0 || strcmp(f, "user") == 0) {
        conv_push_turn(&c, value->valuestring, clip_tokens(&wl->opts, wl->opts.out_mean),
                       c.nturns ? wl->opts.think_mean_s : 0.0);
      } else if ((strcmp(f, "gpt") == 0 || strcmp(f, "assistant") == 0) && c.nturns > 0) {
        size_t chars = strlen(value->valuestring);
        uint32_t t = (uint32_t)(chars / KVR_WORKLOAD_CHARS_PER_TOKEN);
        c.turns[c.nturns - 1].max_tokens = t < 1 ? 1 : KVR_MIN(t, wl->opts.out_max);
      } else if (strcmp(f, "system") == 0 && c.system == NULL) {
        c.system = kvr_xstrdup(value->valuestring);
      }
    }
    if (c.nturns == 0)
      file_conv_free(&c); /* nothing to send */
    else
      push_conv(wl, &c);
    idx++;
  }
  return 0;
}

/* JSONL: one conversation per line:
 * {"system": "...", "prefix": "...", "turns": [{"user": "...", "max_tokens": 200, "think_s": 1.5}]}
 * system, prefix, max_tokens and think_s are optional. */
static int load_jsonl(kvr_workload_t *wl, char *text, char *err, size_t errlen) {
  size_t lineno = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    lineno++;
    while (*line == ' ' || *line == '\t' || *line == '\r')
      line++;
    if (*line == '\0')
      continue;
    cJSON *o = cJSON_Parse(line);
    if (!cJSON_IsObject(o)) {
      snprintf(err, errlen, "%s:%zu: not a JSON object", wl->path, lineno);
      cJSON_Delete(o);
      return KVR_EPARSE;
    }
    const cJSON *turns = cJSON_GetObjectItemCaseSensitive(o, "turns");
    if (!cJSON_IsArray(turns) || cJSON_GetArraySize(turns) == 0) {
      snprintf(err, errlen, "%s:%zu: turns: missing, empty or not an array", wl->path, lineno);
      cJSON_Delete(o);
      return KVR_EPARSE;
    }
    file_conv_t c = {0};
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(o, "system");
    if (cJSON_IsString(s))
      c.system = kvr_xstrdup(s->valuestring);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prefix");
    if (cJSON_IsString(p))
      c.prefix = kvr_xstrdup(p->valuestring);
    const cJSON *t;
    int ti = 0;
    cJSON_ArrayForEach(t, turns) {
      const cJSON *user = cJSON_GetObjectItemCaseSensitive(t, "user");
      const cJSON *mt = cJSON_GetObjectItemCaseSensitive(t, "max_tokens");
      const cJSON *th = cJSON_GetObjectItemCaseSensitive(t, "think_s");
      if (!cJSON_IsString(user) || (mt && (!cJSON_IsNumber(mt) || mt->valuedouble < 1)) ||
          (th && (!cJSON_IsNumber(th) || th->valuedouble < 0))) {
        snprintf(err, errlen, "%s:%zu: turns[%d]: need string user, max_tokens >= 1, think_s >= 0",
                 wl->path, lineno, ti);
        file_conv_free(&c);
        cJSON_Delete(o);
        return KVR_EPARSE;
      }
      uint32_t max_tokens =
          mt ? (uint32_t)mt->valuedouble : clip_tokens(&wl->opts, wl->opts.out_mean);
      double think = th ? th->valuedouble : (ti ? wl->opts.think_mean_s : 0.0);
      conv_push_turn(&c, user->valuestring, max_tokens, think);
      ti++;
    }
    push_conv(wl, &c);
    cJSON_Delete(o);
  }
  return 0;
}

static int load_file(kvr_workload_t *wl, char *err, size_t errlen) {
  size_t len = 0;
  char *text = read_file(wl->path, &len, err, errlen);
  if (text == NULL)
    return KVR_EIO;
  const char *p = text;
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
    p++;
  int rc;
  if (*p == '[') {
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsArray(root)) {
      snprintf(err, errlen, "%s: malformed JSON (expected a ShareGPT array)", wl->path);
      rc = KVR_EPARSE;
    } else {
      rc = load_sharegpt(wl, root, err, errlen);
    }
    cJSON_Delete(root);
  } else {
    rc = load_jsonl(wl, text, err, errlen);
  }
  free(text);
  if (rc == 0 && wl->nconvs == 0) {
    snprintf(err, errlen, "%s: no conversations", wl->path);
    rc = KVR_EPARSE;
  }
  return rc;
}

/* Builds the shared text pool: n texts of prefix_min..prefix_max tokens headed "LABEL i.", from a
 * stream of the workload seed and tag only. */
static void build_pool(kvr_workload_t *wl, size_t n, uint64_t tag, const char *label) {
  const kvr_workload_opts_t *o = &wl->opts;
  wl->npool = n;
  wl->pool = kvr_xcalloc(n, sizeof(char *));
  kvr_rng_t r;
  kvr_workload_rng_seed(&r, kvr_workload_mix(o->seed, tag));
  for (size_t i = 0; i < n; i++) {
    unsigned tokens =
        (unsigned)kvr_workload_rng_range(&r, o->prefix_min_tokens, o->prefix_max_tokens);
    wl->pool[i] = pool_text(kvr_workload_mix(o->seed, tag), i, label, tokens);
  }
}

/* agentic: every --output-* field still at its global default takes the agentic default. */
static void apply_kind_defaults(kvr_workload_opts_t *o) {
  kvr_workload_opts_t d;
  kvr_workload_opts_default(&d);
  if (o->kind != KVR_WL_AGENTIC)
    return;
  if (o->out_mean == d.out_mean)
    o->out_mean = KVR_WL_AGENTIC_OUT_MEAN;
  if (o->out_std == d.out_std)
    o->out_std = KVR_WL_AGENTIC_OUT_STD;
  if (o->out_min == d.out_min)
    o->out_min = KVR_WL_AGENTIC_OUT_MIN;
  if (o->out_max == d.out_max)
    o->out_max = KVR_WL_AGENTIC_OUT_MAX;
}

/* The options of the agentic and hot-prefix kinds (after apply_kind_defaults). Returns 0, or -1
 * with a one-line reason in err. */
static int check_kind_opts(const kvr_workload_opts_t *o, char *err, size_t errlen) {
  if (o->kind == KVR_WL_HOT_PREFIX && !(o->hot_fraction >= 0 && o->hot_fraction <= 1)) {
    snprintf(err, errlen, "workload: hot-prefix: --hot-fraction must be in [0, 1], not %g",
             o->hot_fraction);
    return -1;
  }
  if (o->kind != KVR_WL_AGENTIC)
    return 0;
  if (o->agentic_turns_min < 1 || o->agentic_turns_max < o->agentic_turns_min ||
      o->agentic_turns_max > 10000) {
    snprintf(err, errlen,
             "workload: agentic: need 1 <= --agentic-turns-min (%u) <= --agentic-turns-max (%u) "
             "<= 10000",
             o->agentic_turns_min, o->agentic_turns_max);
    return -1;
  }
  if (o->tool_min_tokens < 1 || o->tool_max_tokens < o->tool_min_tokens) {
    snprintf(err, errlen,
             "workload: agentic: need 1 <= --tool-min-tokens (%u) <= --tool-max-tokens (%u)",
             o->tool_min_tokens, o->tool_max_tokens);
    return -1;
  }
  if (o->out_max < o->out_min) {
    snprintf(err, errlen,
             "workload: agentic: --output-min %u > --output-max %u (agentic output defaults are "
             "[%u, %u]: set both)",
             o->out_min, o->out_max, KVR_WL_AGENTIC_OUT_MIN, KVR_WL_AGENTIC_OUT_MAX);
    return -1;
  }
  /* The first turn (system prompt, task, output) must always fit. */
  uint64_t first = (uint64_t)o->prefix_max_tokens + 64 + o->out_max;
  if (o->agentic_max_context < first) {
    snprintf(err, errlen,
             "workload: agentic: --agentic-max-context %u cannot hold a first turn of up to %llu "
             "tokens (prefix + task + --output-max)",
             o->agentic_max_context, (unsigned long long)first);
    return -1;
  }
  return 0;
}

/* trace: reads the file (trace_replay.h) with the template of the API the prompts go to. */
static int open_trace(kvr_workload_t *wl, char *err, size_t errlen) {
  const kvr_workload_opts_t *o = &wl->opts;
  kvr_trace_replay_opts_t to = {.path = o->path,
                                .block_tokens = o->trace_block_tokens,
                                .window_start_s = o->trace_window_start_s,
                                .window_end_s = o->trace_window_end_s,
                                .max_context = o->max_context,
                                .chat = o->api == KVR_API_CHAT};
  if ((wl->trace = kvr_trace_replay_open(&to, err, errlen)) == NULL)
    return KVR_EINVAL;
  wl->path = kvr_xstrdup(o->path);
  wl->opts.path = wl->path;
  snprintf(wl->name, sizeof(wl->name), "trace:%.80s", kvr_trace_replay_stats(wl->trace)->file);
  return 0;
}

/* mix: the parts and one workload per part (the options with the part's kind, sessions, and the
 * seed mixed with the part's index: a text pool of its own). 0 or -1 with err. */
static int mix_new(kvr_workload_t *wl, char *err, size_t errlen) {
  if (kvr_workload_mix_parse(wl->opts.path, wl->parts, &wl->nparts, err, errlen) != 0)
    return -1;
  for (size_t i = 0; i < wl->nparts; i++) {
    kvr_workload_opts_t so = wl->opts;
    so.kind = wl->parts[i].kind;
    so.path = NULL;
    so.replay = false;
    so.seed = kvr_workload_mix(wl->opts.seed, 0x313C000 + i);
    char e2[256];
    if ((wl->subs[i] = kvr_workload_new(&so, e2, sizeof(e2))) == NULL) {
      snprintf(err, errlen, "workload: mix: part '%s': %s", wl->parts[i].model, e2);
      return -1;
    }
    wl->wsum += wl->parts[i].weight;
  }
  snprintf(wl->name, sizeof(wl->name), "mix");
  return 0;
}

const kvr_wl_mix_part_t *kvr_workload_mix_parts(const kvr_workload_t *wl, size_t *n) {
  *n = wl->nparts;
  return wl->nparts ? wl->parts : NULL;
}

kvr_workload_t *kvr_workload_new(const kvr_workload_opts_t *opts, char *err, size_t errlen) {
  const kvr_workload_opts_t *o = opts;
  if (o->turns < 1 || o->turns > 64 || o->starters < 1 || o->documents < 1 || o->questions < 1 ||
      o->prefix_min_tokens < 1 || o->prefix_max_tokens < o->prefix_min_tokens ||
      o->control_min_tokens < 1 || o->control_max_tokens < o->control_min_tokens ||
      o->out_min < 1 || o->out_max < o->out_min || o->out_std < 0 || o->think_mean_s < 0 ||
      o->replay_width < 1 || o->replay_width > 256) {
    snprintf(err, errlen,
             "workload: inconsistent options (counts >= 1, min <= max, turns <= 64, replay width "
             "<= 256)");
    return NULL;
  }
  if (o->answer_mean < 0 || o->answer_std < 0) {
    snprintf(err, errlen, "workload: --answer-mean and --answer-std must be >= 0");
    return NULL;
  }
  if (o->replay_dataset > 0 && !(o->replay && o->replay_sample)) {
    snprintf(err, errlen, "workload: --replay-dataset needs --replay-order sample (replay mode)");
    return NULL;
  }
  if (o->api == KVR_API_RESPONSES &&
      (o->kind == KVR_WL_TRACE || (o->kind == KVR_WL_MULTITURN && o->replay))) {
    snprintf(err, errlen,
             "workload: --api responses sends each turn after the answer whose id it names: a "
             "session workload (not a trace, not multiturn's replay: add --multiturn-mode "
             "session)");
    return NULL;
  }
  kvr_workload_opts_t ko = *o;
  apply_kind_defaults(&ko);
  if (check_kind_opts(&ko, err, errlen) != 0)
    return NULL;
  kvr_workload_t *wl = kvr_xcalloc(1, sizeof(*wl));
  wl->opts = ko;
  switch (o->kind) {
  case KVR_WL_MULTITURN:
  case KVR_WL_DOCUMENTS: {
    bool docs = o->kind == KVR_WL_DOCUMENTS;
    build_pool(wl, docs ? o->documents : o->starters, docs ? 0xD0C5 : 0x5747,
               docs ? "Document" : "Conversation starter");
    snprintf(wl->name, sizeof(wl->name), "%s", docs ? "documents" : "multiturn");
    break;
  }
  case KVR_WL_AGENTIC:
    build_pool(wl, o->starters, 0xA6E7, "Agent system prompt");
    snprintf(wl->name, sizeof(wl->name), "agentic");
    break;
  case KVR_WL_HOT_PREFIX:
    build_pool(wl, 1, 0x407, "Shared system prompt");
    snprintf(wl->name, sizeof(wl->name), "hot-prefix");
    break;
  case KVR_WL_CONTROL:
    snprintf(wl->name, sizeof(wl->name), "control");
    break;
  case KVR_WL_FILE: {
    if (o->path == NULL || o->path[0] == '\0') {
      snprintf(err, errlen, "workload: file: needs a path");
      kvr_workload_free(wl);
      return NULL;
    }
    wl->path = kvr_xstrdup(o->path);
    wl->opts.path = wl->path;
    if (load_file(wl, err, errlen) != 0) {
      kvr_workload_free(wl);
      return NULL;
    }
    const char *base = strrchr(wl->path, '/');
    snprintf(wl->name, sizeof(wl->name), "file:%s", base ? base + 1 : wl->path);
    break;
  }
  case KVR_WL_TRACE:
    if (open_trace(wl, err, errlen) != 0) {
      kvr_workload_free(wl);
      return NULL;
    }
    break;
  case KVR_WL_MIX:
    wl->path = kvr_xstrdup(o->path ? o->path : "");
    wl->opts.path = wl->path;
    if (mix_new(wl, err, errlen) != 0) {
      kvr_workload_free(wl);
      return NULL;
    }
    break;
  default:
    snprintf(err, errlen, "workload: unknown kind");
    kvr_workload_free(wl);
    return NULL;
  }
  return wl;
}

const char *kvr_workload_name(const kvr_workload_t *wl) {
  return wl->name;
}

const kvr_workload_opts_t *kvr_workload_opts(const kvr_workload_t *wl) {
  return &wl->opts;
}

size_t kvr_workload_file_size(const kvr_workload_t *wl) {
  return wl->nconvs;
}

const kvr_trace_replay_t *kvr_workload_trace(const kvr_workload_t *wl) {
  return wl->trace;
}

size_t kvr_workload_set_max_context(kvr_workload_t *wl, uint64_t max_context) {
  if (wl->trace == NULL)
    return 0;
  wl->opts.max_context = max_context;
  return kvr_trace_replay_set_context(wl->trace, max_context);
}

/* The trace's line of the report's workload parameters. */
static void describe_trace(const kvr_workload_t *wl, kvr_buf_t *out) {
  const kvr_trace_stats_t *st = kvr_trace_replay_stats(wl->trace);
  kvr_buf_printf(out, "%s: %zu requests of %s", wl->name, st->requests, wl->path);
  if (st->windowed && st->window_end_s >= 0)
    kvr_buf_printf(out, " (window %g-%g s of %zu)", st->window_start_s, st->window_end_s,
                   st->file_requests);
  else if (st->windowed)
    kvr_buf_printf(out, " (window from %g s of %zu)", st->window_start_s, st->file_requests);
  kvr_buf_printf(out,
                 " over %.0f s (%.2f req/s), single-turn, each prompt synthesised from its hash "
                 "ids (%u tokens each) so that requests share exactly the blocks their ids share, "
                 "max_tokens its output_length; arrivals the trace's own, scaled to each rate",
                 st->span_s, st->mean_rate, st->block_tokens);
  if (st->over_context)
    kvr_buf_printf(out, "; %zu requests longer than the workers' context (%llu tokens) not sent",
                   st->over_context, (unsigned long long)st->max_context);
}

void kvr_workload_describe(const kvr_workload_t *wl, kvr_buf_t *out) {
  const kvr_workload_opts_t *o = &wl->opts;
  switch (o->kind) {
  case KVR_WL_MULTITURN:
    kvr_buf_printf(out,
                   "multiturn: %u shared starters of %u-%u tokens, %u turns per conversation, "
                   "short follow-ups, output tokens normal(%.0f, %.0f) clipped to [%u, %u], ",
                   o->starters, o->prefix_min_tokens, o->prefix_max_tokens, o->turns, o->out_mean,
                   o->out_std, o->out_min, o->out_max);
    if (o->replay && o->answer_mean > 0)
      kvr_buf_printf(out,
                     "mode replay: pre-built conversations with synthetic answers of "
                     "normal(%.0f, %.0f) tokens, every turn resends the full history, ",
                     o->answer_mean, o->answer_std);
    else if (o->replay)
      kvr_buf_printf(out,
                     "mode replay: pre-built conversations with synthetic answers of max_tokens, "
                     "every turn resends the full history, ");
    if (o->replay && o->replay_sample && o->replay_dataset > 0)
      kvr_buf_printf(out,
                     "arrivals draw the %u prompts of a fixed dataset of %u conversations (the "
                     "same at every level), each pass in a new seeded order",
                     o->replay_dataset * o->turns, o->replay_dataset);
    else if (o->replay && o->replay_sample)
      kvr_buf_printf(out, "each arrival a uniformly random turn of its own conversation (a "
                          "dataset sampled at random: only the starters are shared)");
    else if (o->replay)
      kvr_buf_printf(out,
                     "turns sent open loop in blocks of %u interleaved conversations (turn mix "
                     "uniform per level)",
                     o->replay_width);
    else
      kvr_buf_printf(out,
                     "mode session: closed-loop conversations resending the answers streamed back, "
                     "think time exponential mean %.2f s",
                     o->think_mean_s);
    break;
  case KVR_WL_DOCUMENTS:
    kvr_buf_printf(out,
                   "documents: %u distinct documents of %u-%u tokens (~%.0fk tokens in all), %u "
                   "questions each, single-turn, output tokens normal(%.0f, %.0f) clipped to "
                   "[%u, %u]",
                   o->documents, o->prefix_min_tokens, o->prefix_max_tokens,
                   o->documents * (o->prefix_min_tokens + o->prefix_max_tokens) / 2000.0,
                   o->questions, o->out_mean, o->out_std, o->out_min, o->out_max);
    break;
  case KVR_WL_CONTROL:
    kvr_buf_printf(out,
                   "control: single-turn prompts of %u-%u tokens of unique text (no shared "
                   "prefixes), output tokens normal(%.0f, %.0f) clipped to [%u, %u]",
                   o->control_min_tokens, o->control_max_tokens, o->out_mean, o->out_std,
                   o->out_min, o->out_max);
    break;
  case KVR_WL_AGENTIC:
    kvr_buf_printf(out,
                   "agentic: %u shared system prompts of %u-%u tokens, %u-%u turns per "
                   "conversation (capped so the planned context stays within %u tokens), user "
                   "turns after the first are tool outputs of %u-%u tokens, output tokens "
                   "normal(%.0f, %.0f) clipped to [%u, %u], think time exponential mean %.2f s",
                   o->starters, o->prefix_min_tokens, o->prefix_max_tokens, o->agentic_turns_min,
                   o->agentic_turns_max, o->agentic_max_context, o->tool_min_tokens,
                   o->tool_max_tokens, o->out_mean, o->out_std, o->out_min, o->out_max,
                   o->think_mean_s);
    break;
  case KVR_WL_HOT_PREFIX:
    kvr_buf_printf(out,
                   "hot-prefix: %.0f%% of requests carry one shared prefix of %u-%u tokens, the "
                   "others a unique prompt of the same length range, single-turn, each a fresh "
                   "question of %u-%u tokens, output tokens normal(%.0f, %.0f) clipped to [%u, %u]",
                   o->hot_fraction * 100, o->prefix_min_tokens, o->prefix_max_tokens,
                   KVR_WL_QUESTION_MIN_TOKENS, KVR_WL_QUESTION_MAX_TOKENS, o->out_mean, o->out_std,
                   o->out_min, o->out_max);
    break;
  case KVR_WL_FILE:
    kvr_buf_printf(out, "%s: %zu conversations from %s%s", wl->name, wl->nconvs, wl->path,
                   o->sharegpt_vllm ? " (vllm's ShareGPT sample: the first message of each entry, "
                                      "single-turn)"
                                    : "");
    break;
  case KVR_WL_TRACE:
    describe_trace(wl, out);
    break;
  case KVR_WL_MIX:
    kvr_buf_printf(out, "mix of %zu models (each its own text pool, sessions):", wl->nparts);
    for (size_t i = 0; i < wl->nparts; i++) {
      kvr_buf_printf(out, "%s %s %.1f%% ", i ? ";" : "", wl->parts[i].model,
                     100 * wl->parts[i].weight / wl->wsum);
      kvr_workload_describe(wl->subs[i], out);
    }
    break;
  }
}

void kvr_workload_conv_free(kvr_conv_t *c) {
  if (c == NULL)
    return;
  for (uint32_t i = 0; i < c->nturns; i++) {
    free(c->turns[i].user);
    free(c->turns[i].answer);
  }
  free(c->turns);
  free(c->prefix_owned);
  memset(c, 0, sizeof(*c));
  c->group = -1;
  c->part = -1;
}

static void conv_alloc(kvr_conv_t *c, uint32_t nturns) {
  c->turns = kvr_xcalloc(nturns, sizeof(*c->turns));
  c->nturns = nturns;
}

static double think(const kvr_workload_opts_t *o, kvr_rng_t *r) {
  if (o->think_mean_s <= 0)
    return 0;
  return kvr_workload_rng_gamma(r, 1.0, o->think_mean_s);
}

void kvr_workload_sample_slot(const kvr_workload_t *wl, uint64_t level_seed, uint64_t k,
                              uint64_t *conv, uint32_t *turn) {
  const kvr_workload_opts_t *o = &wl->opts;
  kvr_rng_t r;
  if (o->replay_dataset == 0) {
    kvr_workload_rng_seed(&r, kvr_workload_mix(kvr_workload_mix(level_seed, 0x5A3), k));
    *turn = (uint32_t)kvr_workload_rng_range(&r, 0, o->turns - 1);
    *conv = k;
    return;
  }
  /* Pass p visits the D prompts in a seeded pseudo-random order: a 4-round Feistel permutation of
   * [0, 4^h) >= D, cycle-walked into [0, D) (every prompt once per pass, no fixed stride). */
  uint64_t d = (uint64_t)o->replay_dataset * o->turns, pass = k / d, j = k % d;
  uint64_t key = kvr_workload_mix(kvr_workload_mix(level_seed, 0xDA7A), pass);
  unsigned h = 1;
  while ((1ull << (2 * h)) < d)
    h++;
  uint64_t mask = (1ull << h) - 1, prompt = j;
  do {
    uint64_t l = prompt >> h, rr = prompt & mask;
    for (uint64_t round = 0; round < 4; round++) {
      uint64_t f = kvr_workload_mix(key, (round << 32) ^ rr) & mask;
      uint64_t t = rr;
      rr = l ^ f;
      l = t;
    }
    prompt = (l << h) | rr;
  } while (prompt >= d);
  *conv = prompt / o->turns;
  *turn = (uint32_t)(prompt % o->turns);
}

/* One user turn of an agentic conversation: the task (turn 0) or a tool output of
 * tool_min..tool_max tokens of synthetic text. Returns an owned string. */
static char *agentic_user(const kvr_workload_opts_t *o, kvr_rng_t *r, uint32_t t) {
  if (t == 0)
    return kvr_xstrdup(tasks[kvr_workload_rng_u64(r) % KVR_ARRAY_SIZE(tasks)]);
  unsigned tokens = (unsigned)kvr_workload_rng_range(r, o->tool_min_tokens, o->tool_max_tokens);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_printf(&b, "Tool output (call %u):\n", t);
  text_exact(r, tokens, &b);
  return kvr_buf_steal(&b);
}

/* agentic: a shared system prompt, a task, then tool outputs. Turns are drawn uniformly from
 * agentic_turns_min..max and cut where the planned context (prefix + every user turn + every
 * max_tokens so far) would pass agentic_max_context; check_kind_opts() makes turn 0 always fit. */
static void agentic_conv(const kvr_workload_t *wl, kvr_rng_t *r, kvr_conv_t *c) {
  const kvr_workload_opts_t *o = &wl->opts;
  c->group = (int32_t)kvr_workload_rng_range(r, 0, wl->npool - 1);
  c->prefix = wl->pool[c->group];
  uint32_t want = (uint32_t)kvr_workload_rng_range(r, o->agentic_turns_min, o->agentic_turns_max);
  conv_alloc(c, want);
  uint64_t ctx = text_tokens(c->prefix) + 1; /* + the "\n\n" before the task */
  uint32_t n = 0;
  for (uint32_t t = 0; t < want; t++) {
    char *user = agentic_user(o, r, t);
    uint32_t out = clip_tokens(o, o->out_mean + o->out_std * kvr_workload_rng_normal(r));
    double th = t == 0 ? 0.0 : think(o, r);
    uint64_t add = text_tokens(user) + out;
    if (t > 0 && ctx + add > o->agentic_max_context) {
      free(user);
      break;
    }
    ctx += add;
    c->turns[n].user = user;
    c->turns[n].max_tokens = out;
    c->turns[n].think_s = th;
    n++;
  }
  c->nturns = n;
}

/* hot-prefix: with probability hot_fraction the one shared prefix, else a unique prompt of the same
 * length range that opens with a random 64-bit tag (so no two share even their first words); then
 * a fresh question of KVR_WL_QUESTION_MIN..MAX_TOKENS tokens. */
static void hot_conv(const kvr_workload_t *wl, kvr_rng_t *r, kvr_conv_t *c) {
  const kvr_workload_opts_t *o = &wl->opts;
  if (kvr_workload_rng_unit(r) < o->hot_fraction) {
    c->group = 0;
    c->prefix = wl->pool[0];
  } else {
    unsigned tokens =
        (unsigned)kvr_workload_rng_range(r, o->prefix_min_tokens, o->prefix_max_tokens);
    kvr_buf_t b = KVR_BUF_INIT;
    kvr_buf_printf(&b, "[%016llx] ", (unsigned long long)kvr_workload_rng_u64(r));
    text_exact(r, tokens, &b);
    c->prefix_owned = kvr_buf_steal(&b);
    c->prefix = c->prefix_owned;
  }
  conv_alloc(c, 1);
  unsigned q =
      (unsigned)kvr_workload_rng_range(r, KVR_WL_QUESTION_MIN_TOKENS, KVR_WL_QUESTION_MAX_TOKENS);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_buf_puts(&b, "Question: ");
  text_exact(r, q, &b);
  c->turns[0].user = kvr_buf_steal(&b);
  c->turns[0].max_tokens = clip_tokens(o, o->out_mean + o->out_std * kvr_workload_rng_normal(r));
}

/* mix: conversation k's part, drawn from a stream of the level seed and k alone (the parts'
 * conversations draw from their own seeds), then that part's conversation k. */
static void mix_conv(const kvr_workload_t *wl, uint64_t level_seed, uint64_t k, kvr_conv_t *c) {
  kvr_rng_t r;
  kvr_workload_rng_seed(&r,
                        kvr_workload_mix(kvr_workload_mix(wl->opts.seed ^ 0x313C, level_seed), k));
  double u = kvr_workload_rng_unit(&r) * wl->wsum, acc = 0;
  size_t i = 0;
  while (i + 1 < wl->nparts && u >= (acc += wl->parts[i].weight))
    i++;
  kvr_workload_conv(wl->subs[i], level_seed, k, c);
  c->model = wl->parts[i].model;
  c->part = (int32_t)i;
}

void kvr_workload_conv(const kvr_workload_t *wl, uint64_t level_seed, uint64_t k, kvr_conv_t *c) {
  const kvr_workload_opts_t *o = &wl->opts;
  memset(c, 0, sizeof(*c));
  c->id = k;
  c->group = -1;
  c->part = -1;
  if (o->kind == KVR_WL_MIX) {
    mix_conv(wl, level_seed, k, c);
    return;
  }
  if (o->kind == KVR_WL_MULTITURN && o->replay && o->replay_sample && o->replay_dataset > 0) {
    /* A fixed dataset: the conversation depends on the dataset entry only, not on the level. */
    uint32_t turn;
    kvr_workload_sample_slot(wl, level_seed, k, &k, &turn);
    level_seed = 0xDA7A5E7ull;
  }
  kvr_rng_t r;
  kvr_workload_rng_seed(&r, kvr_workload_mix(kvr_workload_mix(o->seed, level_seed), k));
  switch (o->kind) {
  case KVR_WL_MULTITURN:
    c->group = (int32_t)kvr_workload_rng_range(&r, 0, wl->npool - 1);
    c->prefix = wl->pool[c->group];
    conv_alloc(c, o->turns);
    for (uint32_t t = 0; t < o->turns; t++) {
      const char *u = t == 0 ? openers[kvr_workload_rng_u64(&r) % KVR_ARRAY_SIZE(openers)]
                             : followups[kvr_workload_rng_u64(&r) % KVR_ARRAY_SIZE(followups)];
      c->turns[t].user = kvr_xstrdup(u);
      c->turns[t].max_tokens =
          clip_tokens(o, o->out_mean + o->out_std * kvr_workload_rng_normal(&r));
      c->turns[t].think_s = t == 0 ? 0.0 : think(o, &r);
    }
    if (o->replay) {
      /* Answers from their own stream so session mode's draws (above) stay unchanged. The last
       * turn's answer is never resent: not generated. */
      kvr_rng_t ar;
      kvr_workload_rng_seed(
          &ar, kvr_workload_mix(kvr_workload_mix(o->seed, level_seed), k ^ 0xA45E000000000000ull));
      for (uint32_t t = 0; t + 1 < o->turns; t++) {
        uint32_t len =
            o->answer_mean > 0
                ? clip_tokens(o, o->answer_mean + o->answer_std * kvr_workload_rng_normal(&ar))
                : c->turns[t].max_tokens;
        kvr_buf_t b = KVR_BUF_INIT;
        kvr_workload_text(&ar, (size_t)len * KVR_WORKLOAD_CHARS_PER_TOKEN, &b);
        c->turns[t].answer = kvr_buf_steal(&b);
      }
    }
    break;
  case KVR_WL_DOCUMENTS: {
    uint64_t doc = kvr_workload_rng_range(&r, 0, wl->npool - 1);
    uint64_t q = kvr_workload_rng_range(&r, 0, o->questions - 1);
    c->group = (int32_t)doc;
    c->prefix = wl->pool[doc];
    conv_alloc(c, 1);
    c->turns[0].user = kvr_xstrdup(questions[(doc * o->questions + q) % KVR_ARRAY_SIZE(questions)]);
    c->turns[0].max_tokens = clip_tokens(o, o->out_mean + o->out_std * kvr_workload_rng_normal(&r));
    break;
  }
  case KVR_WL_CONTROL: {
    unsigned tokens =
        (unsigned)kvr_workload_rng_range(&r, o->control_min_tokens, o->control_max_tokens);
    kvr_buf_t b = KVR_BUF_INIT;
    kvr_workload_text(&r, (size_t)tokens * KVR_WORKLOAD_CHARS_PER_TOKEN, &b);
    c->prefix_owned = kvr_buf_steal(&b);
    c->prefix = c->prefix_owned;
    conv_alloc(c, 1);
    c->turns[0].user = kvr_xstrdup(openers[kvr_workload_rng_u64(&r) % KVR_ARRAY_SIZE(openers)]);
    c->turns[0].max_tokens = clip_tokens(o, o->out_mean + o->out_std * kvr_workload_rng_normal(&r));
    break;
  }
  case KVR_WL_AGENTIC:
    agentic_conv(wl, &r, c);
    break;
  case KVR_WL_HOT_PREFIX:
    hot_conv(wl, &r, c);
    break;
  case KVR_WL_TRACE: {
    /* Request k of those a level sends; its text from a seed of the workload's and the level's. */
    kvr_buf_t b = KVR_BUF_INIT;
    kvr_trace_replay_text(wl->trace, kvr_workload_mix(o->seed, level_seed), (size_t)k, &b);
    conv_alloc(c, 1);
    c->turns[0].user = b.data ? kvr_buf_steal(&b) : kvr_xstrdup("");
    uint64_t out = kvr_trace_replay_output(wl->trace, (size_t)k);
    c->turns[0].max_tokens = (uint32_t)KVR_MIN(KVR_MAX(out, 1), UINT32_MAX);
    c->raw = true;
    break;
  }
  case KVR_WL_MIX:
    break; /* mix_conv above */
  case KVR_WL_FILE: {
    /* Each level walks the file from its own seeded offset: distinct conversations, in file order.
     */
    size_t i = (size_t)((kvr_workload_mix(o->seed, level_seed) + k) % wl->nconvs);
    const file_conv_t *f = &wl->convs[i];
    c->group = (int32_t)i;
    c->prefix = f->prefix;
    c->system = f->system;
    conv_alloc(c, f->nturns);
    for (uint32_t t = 0; t < f->nturns; t++) {
      c->turns[t].user = kvr_xstrdup(f->turns[t].user);
      c->turns[t].max_tokens = f->turns[t].max_tokens;
      c->turns[t].think_s = f->turns[t].think_s;
    }
    break;
  }
  }
}

uint32_t kvr_workload_start_turn(uint64_t level_seed, uint64_t user, uint32_t nturns) {
  if (nturns <= 1)
    return 0;
  kvr_rng_t r;
  kvr_workload_rng_seed(&r, kvr_workload_mix(kvr_workload_mix(level_seed, 0x57EAD), user));
  return (uint32_t)kvr_workload_rng_range(&r, 0, nturns - 1);
}

char *kvr_workload_answer(const kvr_workload_t *wl, uint64_t level_seed, const kvr_conv_t *conv,
                          uint32_t turn) {
  /* A stream of its own (not replay's, not the conversation's): nothing else shifts. */
  kvr_rng_t r;
  uint64_t conv_seed = kvr_workload_mix(kvr_workload_mix(wl->opts.seed, level_seed),
                                        conv->id ^ 0x57A7E00000000000ull);
  kvr_workload_rng_seed(&r, kvr_workload_mix(conv_seed, turn));
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_workload_text(&r, (size_t)conv->turns[turn].max_tokens * KVR_WORKLOAD_CHARS_PER_TOKEN, &b);
  return kvr_buf_steal(&b);
}

/* The user message of turn t: turn 0 carries the prefix (starter/document) before the question. */
static void user_text(const kvr_conv_t *c, uint32_t t, kvr_buf_t *tmp) {
  kvr_buf_reset(tmp);
  if (t == 0 && c->prefix) {
    kvr_buf_puts(tmp, c->prefix);
    kvr_buf_puts(tmp, "\n\n");
  }
  kvr_buf_puts(tmp, c->turns[t].user);
}

const char *kvr_workload_api_path(kvr_api_t api) {
  return api == KVR_API_CHAT          ? "/v1/chat/completions"
         : api == KVR_API_COMPLETIONS ? "/v1/completions"
                                      : "/v1/responses";
}

const char *kvr_workload_api_name(kvr_api_t api) {
  return api == KVR_API_CHAT ? "chat" : api == KVR_API_COMPLETIONS ? "completions" : "responses";
}

void kvr_workload_responses_body(const kvr_conv_t *c, uint32_t turn, const char *prev_id,
                                 const char *model, bool ignore_eos, kvr_buf_t *out) {
  kvr_buf_t tmp = KVR_BUF_INIT;
  kvr_buf_reset(out);
  kvr_buf_puts(out, "{\"model\":");
  kvr_buf_json_str(out, model, strlen(model));
  if (c->system) {
    kvr_buf_puts(out, ",\"instructions\":");
    kvr_buf_json_str(out, c->system, strlen(c->system));
  }
  user_text(c, turn, &tmp);
  kvr_buf_puts(out, ",\"input\":");
  kvr_buf_json_str(out, tmp.data, tmp.len);
  if (prev_id != NULL && prev_id[0] != '\0') {
    kvr_buf_puts(out, ",\"previous_response_id\":");
    kvr_buf_json_str(out, prev_id, strlen(prev_id));
  }
  kvr_buf_printf(out, ",\"store\":true,\"max_output_tokens\":%u,\"stream\":true",
                 c->turns[turn].max_tokens);
  if (ignore_eos)
    kvr_buf_puts(out, ",\"ignore_eos\":true");
  kvr_buf_puts(out, "}");
  kvr_buf_free(&tmp);
}

void kvr_workload_body(const kvr_conv_t *c, uint32_t turn, const char *const *answers,
                       const char *model, kvr_api_t api, bool ignore_eos, kvr_buf_t *out) {
  if (api == KVR_API_RESPONSES) {
    kvr_workload_responses_body(c, turn, NULL, model, ignore_eos, out);
    return;
  }
  kvr_buf_t tmp = KVR_BUF_INIT;
  kvr_buf_reset(out);
  kvr_buf_puts(out, "{\"model\":");
  kvr_buf_json_str(out, model, strlen(model));
  if (api == KVR_API_CHAT) {
    kvr_buf_puts(out, ",\"messages\":[");
    if (c->system) {
      kvr_buf_puts(out, "{\"role\":\"system\",\"content\":");
      kvr_buf_json_str(out, c->system, strlen(c->system));
      kvr_buf_puts(out, "},");
    }
    for (uint32_t t = 0; t <= turn; t++) {
      user_text(c, t, &tmp);
      kvr_buf_puts(out, t ? ",{\"role\":\"user\",\"content\":" : "{\"role\":\"user\",\"content\":");
      kvr_buf_json_str(out, tmp.data, tmp.len);
      kvr_buf_puts(out, "}");
      if (t < turn) {
        const char *a = answers && answers[t] ? answers[t] : "";
        kvr_buf_puts(out, ",{\"role\":\"assistant\",\"content\":");
        kvr_buf_json_str(out, a, strlen(a));
        kvr_buf_puts(out, "}");
      }
    }
    kvr_buf_puts(out, "]");
  } else if (c->raw) {
    kvr_buf_puts(out, ",\"prompt\":");
    kvr_buf_json_str(out, c->turns[0].user, strlen(c->turns[0].user));
  } else {
    kvr_buf_t prompt = KVR_BUF_INIT;
    if (c->system)
      kvr_buf_printf(&prompt, "System: %s\n\n", c->system);
    for (uint32_t t = 0; t <= turn; t++) {
      user_text(c, t, &tmp);
      kvr_buf_puts(&prompt, "User: ");
      kvr_buf_append(&prompt, tmp.data, tmp.len);
      kvr_buf_puts(&prompt, "\n\nAssistant:");
      if (t < turn) {
        kvr_buf_puts(&prompt, " ");
        kvr_buf_puts(&prompt, answers && answers[t] ? answers[t] : "");
        kvr_buf_puts(&prompt, "\n\n");
      }
    }
    kvr_buf_puts(out, ",\"prompt\":");
    kvr_buf_json_str(out, prompt.data, prompt.len);
    kvr_buf_free(&prompt);
  }
  kvr_buf_printf(out,
                 ",\"max_tokens\":%u,\"stream\":true,\"stream_options\":{\"include_usage\":true}",
                 c->turns[turn].max_tokens);
  if (ignore_eos)
    kvr_buf_puts(out, ",\"ignore_eos\":true");
  kvr_buf_puts(out, "}");
  kvr_buf_free(&tmp);
}

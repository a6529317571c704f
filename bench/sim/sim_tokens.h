/* sim_tokens.h -- the simulated worker's deterministic tokenizer and text generator.
 *
 * Not a real tokenizer: an approximation with the one property prefix caching needs, stability.
 * Text is cut into fixed 4-byte chunks (about 4 characters per token, like Llama-3's tokenizer on
 * English) and every chunk is hashed to a token id, so the same text always gives the same ids and
 * a text that extends another gives ids that extend the other's.
 *
 * Chat prompts are rendered with a fixed template before tokenizing:
 *
 *   for each message:  "<|" role "|>" spaces "\n"   padded: the content starts on a 4-byte boundary
 *                      content "\n" spaces           padded: the next message does too
 *   then the generation prompt, exactly the assistant header "<|assistant|>" spaces "\n"
 *
 * Generated text is a sequence of pseudo-words of exactly 4 bytes (3 lowercase letters and a
 * space), one word per token, chosen by a per-request seed. Because the generation prompt equals
 * the assistant header and words are token-aligned, a follow-up turn that carries the previous
 * answer verbatim as the assistant message tokenizes to turn 1's prompt + answer + the new message,
 * so it hits every full block turn 1 cached, as it would on vLLM.
 *
 * continue_final_message (vLLM's chat option, transformers' rendering) ends the text right after
 * the final message's content: no "\n", no padding, no generation prompt. A final assistant
 * message's header equals the generation prompt, so "prompt + the first k words of its answer" as
 * a continued assistant message renders to exactly the ids of the prompt followed by those k words
 * (kvr_sim_render_t.final_content_at says where the continued content starts).
 */
#ifndef KVR_SIM_TOKENS_H
#define KVR_SIM_TOKENS_H

#include "base/buf.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_SIM_TOKEN_BYTES 4
#define KVR_SIM_VOCAB 128256u /* Llama-3's vocabulary size; ids are in [0, KVR_SIM_VOCAB) */

/* A growable array of token ids. Owns v. */
typedef struct kvr_sim_toks_s {
  uint32_t *v;
  size_t n;
  size_t cap;
} kvr_sim_toks_t;

void kvr_sim_toks_push(kvr_sim_toks_t *t, uint32_t id);
void kvr_sim_toks_free(kvr_sim_toks_t *t); /* accepts NULL; leaves t empty */

/* The token id of one chunk of 1..4 bytes. */
uint32_t kvr_sim_tokens_id(const char *chunk, size_t len);

/* Appends to out the ids of text cut into 4-byte chunks (the last one may be shorter). */
void kvr_sim_tokens_encode(const char *text, size_t len, kvr_sim_toks_t *out);

/* Renders an OpenAI "messages" array with the template above, generation prompt included, into out.
 * Content may be a string, null, or an array of {"type":"text","text":...} parts. Returns 0, or
 * KVR_EINVAL with a one-line reason in err (the message vLLM's 400 would carry). */
int kvr_sim_tokens_render_chat(const cJSON *messages, kvr_buf_t *out, char *err, size_t errlen);
/* The same, with the generation prompt (the assistant header) only when generation_prompt. */
int kvr_sim_tokens_render_chat_ex(const cJSON *messages, bool generation_prompt, kvr_buf_t *out,
                                  char *err, size_t errlen);

/* How kvr_sim_tokens_render() renders a messages array. */
typedef struct kvr_sim_render_s {
  bool generation_prompt;  /* in: append the assistant header (vLLM's add_generation_prompt) */
  bool continue_final;     /* in: stop right after the final message's content */
  size_t final_content_at; /* out: byte offset in the rendered text where the final message's
                            * content starts (always a multiple of 4) */
} kvr_sim_render_t;

/* Renders messages into out (appended; out is expected to start empty) as r says. Content may be
 * a string, null, or an array of {"type":"text","text":...} parts. Returns 0, or KVR_EINVAL with a
 * one-line reason in err. */
int kvr_sim_tokens_render(const cJSON *messages, kvr_sim_render_t *r, kvr_buf_t *out, char *err,
                          size_t errlen);

/* The seed of a request's generated text: a hash of its prompt ids and the worker's --seed, so a
 * repeated request produces the same answer. */
uint64_t kvr_sim_tokens_seed(const uint32_t *ids, size_t n, uint64_t seed);

/* Generated word number k (0-based) for seed: writes exactly 4 bytes (3 letters and a space). */
void kvr_sim_tokens_word(uint64_t seed, uint32_t k, char out[KVR_SIM_TOKEN_BYTES]);

/* The token id of word k, equal to kvr_sim_tokens_id() of the word's text. */
uint32_t kvr_sim_tokens_word_id(uint64_t seed, uint32_t k);

/* A well-mixed 64-bit hash of x (splitmix64's finalizer); deterministic pseudo-randomness. */
uint64_t kvr_sim_tokens_mix(uint64_t x);

#endif

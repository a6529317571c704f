/* fuzz_prom.c -- libFuzzer target: the Prometheus text of a worker's /metrics page through the
 * scraper's reader (src/proto/vllm.c kvr_vllm_parse_metrics over src/base/metrics.c's metric-line
 * helpers): the vllm:num_requests_running / _waiting sums, the vllm:kv_cache_usage_perc mean and
 * the labels of vllm:cache_config_info (block_size, num_gpu_blocks).
 *
 * The input is the page, read as the exact bytes received (not NUL-terminated: a reader that runs
 * past the page is an ASan error). Invariants:
 *   - the result is KVR_EPARSE or 0, and deterministic;
 *   - the cache geometry is both numbers or neither;
 *   - comments, blank lines and lines that are no metric are ignored: the page after
 *     "# HELP ...\n\n", and with "\n" or "\n9\n" appended, reads the same (so no label value is
 *     read across the end of its line);
 *   - a line is read on its own, whatever garbage comes before it: appending a known
 *     num_requests_running sample adds exactly 1 to the sum, appending a cache_config_info line
 *     gives exactly its labels (the last one wins), whatever the page was; appending a
 *     vllm:lora_requests_info series of the largest value a gauge may have (1e15) makes it the
 *     chosen one, its lists and max_lora exactly, whatever the page's own series were; the chosen
 *     lists always hold less than KVR_VLLM_LORA_NAMES_MAX bytes.
 */
#include "fuzz_util.h"

#include "base/kvr.h"
#include "serve/scrape.h"

#include <math.h>

/* Equal, NaN included (a page may say "NaN"). */
static bool same_num(double a, double b) {
  return (isnan(a) && isnan(b)) || a == b;
}

static bool same(const kvr_vllm_metrics_t *a, const kvr_vllm_metrics_t *b) {
  return a->at_ms == b->at_ms && same_num(a->num_requests_running, b->num_requests_running) &&
         same_num(a->num_requests_waiting, b->num_requests_waiting) &&
         same_num(a->kv_cache_usage, b->kv_cache_usage) && a->num_gpu_blocks == b->num_gpu_blocks &&
         a->block_size == b->block_size;
}

/* kvr_scrape_parse on an exact-size heap copy of parts joined (so ASan sees a read past the end).
 */
static int parse_joined(const char *a, size_t alen, const char *b, size_t blen,
                        kvr_vllm_metrics_t *out) {
  char *buf = malloc(alen + blen ? alen + blen : 1);
  FUZZ_CHECK(buf != NULL);
  if (alen)
    memcpy(buf, a, alen);
  if (blen)
    memcpy(buf + alen, b, blen);
  int rc = kvr_vllm_parse_metrics(buf, alen + blen, 42, out);
  FUZZ_CHECK(rc == 0 || rc == KVR_EPARSE);
  if (rc == 0) {
    FUZZ_CHECK(out->at_ms == 42);
    FUZZ_CHECK((out->num_gpu_blocks == 0) == (out->block_size == 0));
  }
  free(buf);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len) {
  const char *page = (const char *)data;
  kvr_vllm_metrics_t m, m2;
  int rc = parse_joined(page, len, NULL, 0, &m);
  if (rc == 0)
    FUZZ_CHECK(strlen(m.lora.running) < KVR_VLLM_LORA_NAMES_MAX &&
               strlen(m.lora.waiting) < KVR_VLLM_LORA_NAMES_MAX);
  FUZZ_CHECK(parse_joined(page, len, NULL, 0, &m2) == rc);
  FUZZ_CHECK(rc != 0 || same(&m, &m2));

  static const char help[] = "# HELP vllm:num_requests_running Number of requests.\n\n";
  FUZZ_CHECK(parse_joined(help, sizeof help - 1, page, len, &m2) == rc);
  FUZZ_CHECK(rc != 0 || same(&m, &m2));
  FUZZ_CHECK(parse_joined(page, len, "\n", 1, &m2) == rc);
  FUZZ_CHECK(rc != 0 || same(&m, &m2));
  /* A line that is no metric changes nothing, and no value is read across a line end. */
  FUZZ_CHECK(parse_joined(page, len, "\n9\n", 3, &m2) == rc);
  FUZZ_CHECK(rc != 0 || same(&m, &m2));

  static const char running[] = "\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1.0\n";
  FUZZ_CHECK(parse_joined(page, len, running, sizeof running - 1, &m2) == 0);
  FUZZ_CHECK(same_num(m2.num_requests_running, (rc == 0 ? m.num_requests_running : 0) + 1.0));
  if (rc == 0)
    FUZZ_CHECK(same_num(m2.num_requests_waiting, m.num_requests_waiting) &&
               same_num(m2.kv_cache_usage, m.kv_cache_usage));

  static const char info[] = "\nvllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\","
                             "num_gpu_blocks=\"21766\",prefix_caching_hash_algo=\"sha256\"} 1.0\n";
  int rc2 = parse_joined(page, len, info, sizeof info - 1, &m2);
  FUZZ_CHECK(rc2 == rc); /* the info line alone is not a load series */
  if (rc == 0)
    FUZZ_CHECK(m2.block_size == 16 && m2.num_gpu_blocks == 21766);

  static const char lora[] = "\nvllm:lora_requests_info{max_lora=\"3\",running_lora_adapters="
                             "\"a\\\"b,c\",waiting_lora_adapters=\"\"} 1e15\n";
  FUZZ_CHECK(parse_joined(page, len, lora, sizeof lora - 1, &m2) == rc); /* not a load series */
  if (rc == 0)
    FUZZ_CHECK(m2.lora.present && !m2.lora.cut && m2.lora.max_lora == 3 &&
               strcmp(m2.lora.running, "a\"b,c") == 0 && m2.lora.waiting[0] == '\0');
  return 0;
}

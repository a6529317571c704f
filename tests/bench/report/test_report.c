/* test_report.c -- golden-structure tests of the report renderers on hand-built results. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tests/test_util.h"

#include "base/kvr.h"
#include "bench/loadgen/stats.h"
#include "bench/report/report.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A level of 20 requests with constant TTFT/TPOT (so every percentile equals them), spread
 * round-robin over nworkers named w0.., plus nfail failed requests. */
static kvr_level_t *level(const kvr_slo_t *slo, double rate, double ttft, double tpot, int nfail,
                          int nworkers) {
  kvr_level_t *lv = kvr_stats_level_new(rate, 0);
  for (int i = 0; i < 20 + nfail; i++) {
    kvr_req_rec_t r;
    memset(&r, 0, sizeof(r));
    r.conv = (uint64_t)i / 2;
    r.turn = 1 + i % 2;
    r.sent_s = r.target_s = i / rate;
    r.ok = i < 20;
    r.status = r.ok ? 200 : 503;
    r.ttft_ms = r.ok ? ttft : -1;
    r.output_tokens = r.ok ? 101 : 0;
    r.tpot_ms = r.ok ? tpot : -1;
    r.e2e_ms = r.ok ? ttft + 100 * tpot : 5;
    r.prompt_tokens = r.ok ? 4000 : 0;
    r.cached_tokens = r.ok ? 3000 : 0;
    r.usage_seen = r.ok;
    snprintf(r.worker, sizeof(r.worker), "w%d", i % nworkers);
    if (!r.ok)
      snprintf(r.error, sizeof(r.error), "HTTP 503");
    double itl[3] = {tpot, tpot, tpot};
    kvr_stats_level_add(lv, &r, itl, r.ok ? 3 : 0);
  }
  kvr_stats_level_finish(lv, slo);
  return lv;
}

/* phase0 passes at 1 and 2, fails TPOT at 3 and TTFT+TPOT at 4; phase3 passes up to 3, has no
 * level at 1, and fails on errors at 4. */
static kvr_results_t *sample(void) {
  kvr_results_t *res = kvr_stats_results_new();
  kvr_stats_set_str(&res->title, "A/B <test>");
  kvr_stats_set_str(&res->generated, "2026-01-01T00:00:00Z");
  kvr_stats_set_str(&res->url, "http://127.0.0.1:1");
  kvr_stats_set_str(&res->model, "m");
  kvr_stats_set_str(&res->workload, "multiturn");
  res->num_prompts = 20;
  kvr_run_t *a = kvr_stats_results_add_run(res, "phase0", "round_robin", "round robin");
  kvr_stats_run_add(a, level(&res->slo, 1, 300, 30, 0, 4));
  kvr_stats_run_add(a, level(&res->slo, 2, 700, 50, 0, 4));
  kvr_stats_run_add(a, level(&res->slo, 3, 900, 70, 0, 4));
  kvr_stats_run_add(a, level(&res->slo, 4, 1200, 90, 0, 4));
  kvr_run_t *b = kvr_stats_results_add_run(res, "phase3", "kv_aware", "kv aware");
  kvr_stats_run_add(b, level(&res->slo, 2, 400, 40, 0, 2));
  kvr_stats_run_add(b, level(&res->slo, 3, 600, 55, 0, 2));
  kvr_stats_run_add(b, level(&res->slo, 4, 800, 58, 3, 2));
  return res;
}

static const char *section(const char *md, const char *heading) {
  const char *s = strstr(md, heading);
  assert_non_null(s);
  return s;
}

static void test_markdown_structure(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  const char *m = md.data;
  section(m, "# A/B <test>");
  section(m, "## Configuration");
  section(m, "| 0 | phase0 (baseline) | round_robin | round robin |");
  section(m, "| TTFT p99 | < 1000ms |");
  section(m, "## Results \xe2\x80\x94 TTFT p99 (ms)");
  section(m, "## Results \xe2\x80\x94 TPOT p99 (ms)");
  section(m, "## Results \xe2\x80\x94 Output Throughput (tok/s)");
  section(m, "## Results \xe2\x80\x94 Max Concurrent Requests");
  /* phase3 has no level at 1.00: an em dash. */
  const char *ttft = section(m, "## Results \xe2\x80\x94 TTFT p99 (ms)");
  assert_true(strstr(ttft, "| 1.00 | 300 (n=20) | \xe2\x80\x94 |") != NULL);
  assert_true(strstr(ttft, "| 4.00 | 1200 (n=20) | 800 (n=20) |") != NULL);
  /* The compliance matrix names the failing SLO. */
  const char *matrix = section(m, "## SLO Compliance Matrix");
  assert_non_null(strstr(matrix, "| 2.00 | PASS | PASS |"));
  assert_non_null(strstr(matrix, "| 3.00 | FAIL (TPOT) | PASS |"));
  assert_non_null(strstr(matrix, "| 4.00 | FAIL (TTFT+TPOT) | FAIL (errors) |"));
  /* Winner: phase0 max 2, phase3 max 3 -> +50%. */
  const char *win = section(m, "## Winner Identification");
  assert_non_null(strstr(win, "| phase0 | 2.00 | \xe2\x80\x94 |"));
  assert_non_null(strstr(win, "| phase3 **WINNER** | 3.00 | +50% |"));
  assert_non_null(
      strstr(win, "improved max SLO-compliant load over baseline: 2.00 -> 3.00 RPS (+50%)"));
  const char *det = section(m, "## Detailed Comparison at Baseline Max Rate (2.00 RPS)");
  assert_non_null(strstr(det, "| TTFT p99 (ms) | 700 | 400 |"));
  assert_non_null(strstr(det, "| Completed | 20 | 20 |"));
  assert_non_null(strstr(det, "| Cached tokens (% of prompt) | 75% | 75% |"));
  const char *turns = section(m, "## Per-Turn TTFT at 2.00 RPS");
  assert_non_null(strstr(turns, "| 2 | 700 / 700, 4000 tok, 75% cached | 400 / 400"));
  const char *share = section(m, "## Worker Share at 2.00 RPS");
  assert_non_null(strstr(share, "| w0 | 5 (25%) | 10 (50%) |"));
  assert_non_null(strstr(share, "| w3 | 5 (25%) | 0 (0%) |"));
  const char *obs = section(m, "## Key Observations");
  assert_non_null(
      strstr(obs, "`phase3` raises the max SLO-compliant load from 2.00 to 3.00 RPS (+50%)"));
  assert_non_null(strstr(obs, "TPOT binds first for `phase0`"));
  assert_non_null(strstr(obs, "errors binds first for `phase3`"));
  assert_non_null(strstr(obs, "changes TTFT p99 by -43% (700 -> 400 ms)"));
  assert_non_null(strstr(obs, "75.0% of prompt tokens were served from the KV cache"));
  assert_non_null(strstr(obs, "3 requests failed"));
  section(m, "## Workload Parameters");
  section(m, "| Rate Meaning | requests per second of turn arrivals");
  section(m, "| Arrival Distribution | Poisson (burstiness=1.0) |");
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

static void test_no_improvement(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  /* base and tied fail at 2, so their max (1) is found, not only bounded below. */
  kvr_run_t *a = kvr_stats_results_add_run(res, "base", "", "");
  kvr_stats_run_add(a, level(&res->slo, 1, 300, 30, 0, 1));
  kvr_stats_run_add(a, level(&res->slo, 2, 1300, 30, 0, 1));
  kvr_run_t *b = kvr_stats_results_add_run(res, "worse", "", "");
  kvr_stats_run_add(b, level(&res->slo, 1, 1300, 30, 0, 1));
  kvr_run_t *c = kvr_stats_results_add_run(res, "tied", "", "");
  kvr_stats_run_add(c, level(&res->slo, 1, 300, 30, 0, 1));
  kvr_stats_run_add(c, level(&res->slo, 2, 1300, 30, 0, 1));
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  assert_non_null(strstr(md.data, "| worse | 0.00 | -100% |"));
  assert_non_null(strstr(md.data, "| tied | 1.00 | +0% |")); /* equal to the baseline: no winner */
  assert_non_null(strstr(md.data, "**No configuration improved over baseline.**"));
  assert_non_null(strstr(md.data, "| 1.00 | PASS | FAIL (TTFT) |"));
  assert_null(strstr(md.data, "WINNER"));
  kvr_buf_t sum = KVR_BUF_INIT;
  kvr_report_summary(res, &sum);
  assert_non_null(strstr(sum.data, "(-100% vs base)"));
  kvr_buf_free(&sum);
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

static size_t count(const char *s, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

static const char *svg_by_id(const char *html, const char *id, char *buf, size_t size) {
  char needle[64];
  snprintf(needle, sizeof(needle), "id=\"%s\"", id);
  const char *s = strstr(html, needle);
  assert_non_null(s);
  const char *e = strstr(s, "</svg>");
  assert_non_null(e);
  size_t n = KVR_MIN((size_t)(e - s), size - 1);
  memcpy(buf, s, n);
  buf[n] = '\0';
  return buf;
}

static void test_html_charts(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t html = KVR_BUF_INIT;
  kvr_report_html(res, &html);
  const char *h = html.data;
  assert_int_equal(count(h, "<svg"), 4);
  assert_int_equal(count(h, "</svg>"), 4);
  static char buf[65536];
  svg_by_id(h, "ttft-p99", buf, sizeof(buf));
  assert_int_equal(count(buf, "class=\"slo\""), 1);
  assert_non_null(strstr(buf, "SLO 1000 ms"));
  assert_int_equal(count(buf, "<polyline"), 2);
  assert_non_null(strstr(buf, "data-label=\"phase3\""));
  svg_by_id(h, "tpot-p99", buf, sizeof(buf));
  assert_non_null(strstr(buf, "SLO 60 ms"));
  svg_by_id(h, "throughput", buf, sizeof(buf));
  assert_null(strstr(buf, "class=\"slo\""));
  svg_by_id(h, "worker-share", buf, sizeof(buf));
  /* 4 workers x phase0 + 4 x phase3 (two of them with zero share). */
  assert_int_equal(count(buf, "class=\"bar\""), 8);
  /* Labels and titles are escaped. */
  assert_non_null(strstr(h, "<h1>A/B &lt;test&gt;</h1>"));
  assert_non_null(strstr(h, "<td>FAIL (TPOT)</td>"));
  kvr_buf_free(&html);
  kvr_stats_results_free(res);
}

/* The cells of every Markdown table in order, inline marks ("**", "`") removed, one per line. */
static void md_cells(const char *md, kvr_buf_t *out) {
  for (const char *line = md; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
    size_t len = strcspn(line, "\n");
    if (line[0] != '|' || strspn(line, "|-: ") == len) /* not a table row, or its rule */
      continue;
    const char *c = line + 1;
    while (c < line + len) {
      const char *e = memchr(c, '|', (size_t)(line + len - c));
      const char *b = c, *z = e;
      while (b < z && *b == ' ')
        b++;
      while (z > b && z[-1] == ' ')
        z--;
      for (const char *p = b; p < z; p++)
        if (*p != '`' && !(p[0] == '*' && p + 1 < z && p[1] == '*') &&
            !(p > b && p[-1] == '*' && *p == '*'))
          kvr_buf_append(out, p, 1);
      kvr_buf_puts(out, "\n");
      c = e + 1;
    }
  }
}

/* The text of every <td> and <th> of an HTML page in order, tags removed and entities decoded,
 * one per line, leading and trailing spaces trimmed. */
static void html_cells(const char *html, kvr_buf_t *out) {
  static const char *const ents[][2] = {
      {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}};
  for (const char *p = html; (p = strstr(p, "<t")) != NULL; p++) {
    if ((strncmp(p, "<td", 3) != 0 && strncmp(p, "<th", 3) != 0) || (p[3] != '>' && p[3] != ' '))
      continue;
    const char *e = strstr(p, p[2] == 'd' ? "</td>" : "</th>");
    assert_non_null(e);
    kvr_buf_t cell = KVR_BUF_INIT;
    for (const char *c = strchr(p, '>') + 1; c < e; c++) {
      if (*c == '<') {
        c = strchr(c, '>');
        continue;
      }
      size_t k = 0;
      while (k < 4 && strncmp(c, ents[k][0], strlen(ents[k][0])) != 0)
        k++;
      kvr_buf_puts(&cell, k < 4 ? ents[k][1] : (char[]){*c, 0});
      if (k < 4)
        c += strlen(ents[k][0]) - 1;
    }
    const char *b = cell.data ? cell.data : "";
    size_t n = cell.len;
    while (n && b[0] == ' ')
      b++, n--;
    while (n && b[n - 1] == ' ')
      n--;
    kvr_buf_append(out, b, n);
    kvr_buf_puts(out, "\n");
    kvr_buf_free(&cell);
    p = e;
  }
}

/* The HTML is written directly (not converted from the Markdown) and holds every table of the
 * Markdown report with the same figures in the same order, plus the four charts. */
static void check_html_tables(kvr_results_t *res) {
  kvr_buf_t md = KVR_BUF_INIT, html = KVR_BUF_INIT, a = KVR_BUF_INIT, b = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  kvr_report_html(res, &html);
  md_cells(md.data, &a);
  html_cells(html.data, &b);
  assert_true(a.len > 500);
  assert_string_equal(a.data, b.data);
  assert_null(strstr(html.data, "**"));
  assert_null(strstr(html.data, "|--"));
  assert_null(strstr(html.data, "`"));
  assert_int_equal(count(html.data, "<table>"), count(md.data, "\n|--") + count(md.data, "\n|:-"));
  static const char *const charts[] = {"ttft-p99", "tpot-p99", "throughput", "worker-share"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(charts); i++) {
    char needle[64];
    snprintf(needle, sizeof(needle), "<svg class=\"chart\" id=\"%s\"", charts[i]);
    assert_non_null(strstr(html.data, needle));
  }
  kvr_buf_free(&md);
  kvr_buf_free(&html);
  kvr_buf_free(&a);
  kvr_buf_free(&b);
}

static void test_html_has_every_table(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  check_html_tables(res);
  res->cache_reset = "before each run: POST /admin/reset_prefix_cache";
  res->runs[0].levels[1]->engine_workers = 2; /* adds the engine tables and rows */
  res->runs[0].levels[1]->preemptions = 4;
  res->concurrency_mode = false;
  check_html_tables(res);
  res->cache_reset = NULL;
  kvr_stats_results_free(res);
}

static void test_level_json_and_jsonl(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  const kvr_run_t *run = &res->runs[0];
  const kvr_level_t *lv = run->levels[2];
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_level_json(res, run, lv, &b);
  cJSON *j = cJSON_Parse(b.data);
  assert_non_null(j);
  assert_true(cJSON_GetObjectItem(j, "request_rate")->valuedouble == 3.0);
  assert_true(cJSON_GetObjectItem(j, "p99_ttft_ms")->valuedouble == 900.0);
  assert_true(cJSON_GetObjectItem(j, "median_tpot_ms")->valuedouble == 70.0);
  assert_int_equal(cJSON_GetObjectItem(j, "completed")->valueint, 20);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "ttfts")), 20);
  cJSON *k = cJSON_GetObjectItem(j, "kvrouter");
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(k, "slo"), "failed")->valuestring,
                      "TPOT");
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(k, "worker_share"), "w1")->valueint, 5);
  cJSON_Delete(j);

  kvr_buf_reset(&b);
  kvr_report_jsonl(&res->runs[1], res->runs[1].levels[2], &b);
  assert_int_equal(count(b.data, "\n"), 23);
  char *save = NULL;
  int failed = 0;
  for (char *line = strtok_r(b.data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    cJSON *o = cJSON_Parse(line);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "label")->valuestring, "phase3");
    failed += cJSON_IsFalse(cJSON_GetObjectItem(o, "ok"));
    cJSON_Delete(o);
  }
  assert_int_equal(failed, 3);
  kvr_buf_free(&b);
  kvr_stats_results_free(res);
}

/* One request of the hand-built level of test_vllm_keys(). */
static void add_req(kvr_level_t *lv, bool warmup, double sent, bool ok, double ttft, uint32_t out,
                    double e2e) {
  kvr_req_rec_t r;
  memset(&r, 0, sizeof(r));
  r.warmup = warmup;
  r.user = -1;
  r.seq = (uint64_t)lround(sent * 100); /* sent in the order of their send times */
  r.sent_s = r.target_s = sent;
  r.ok = ok;
  r.status = ok ? 200 : 503;
  r.ttft_ms = ttft;
  r.output_tokens = out;
  r.tpot_ms = ok && out > 1 ? (e2e - ttft) / (out - 1) : -1;
  r.e2e_ms = e2e;
  r.prompt_tokens = 100 + (uint32_t)lround(sent * 100);
  if (!ok)
    snprintf(r.error, sizeof(r.error), "HTTP 503");
  kvr_stats_level_add(lv, &r, NULL, 0);
}

static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItem(o, key);
  assert_non_null(v);
  assert_true(cJSON_IsNumber(v));
  return v->valuedouble;
}

#define assert_near(a, b) assert_true(fabs((a) - (b)) < 1e-9)

/* The keys vllm/benchmarks/serve.py writes that kvrouter added: endpoint_type, tokenizer_id,
 * request_goodput, max_output_tokens_per_s, and the per-request latencies and start_times (seconds,
 * measured requests in send order, as vllm's dispatch order), itls and generated_texts left out
 * without --save-detailed (as vllm leaves them out). */
static void test_vllm_keys(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  kvr_stats_set_str(&res->model, "org/model");
  kvr_stats_set_str(&res->api, "chat");
  kvr_run_t *run = kvr_stats_results_add_run(res, "base", "", "");
  kvr_level_t *lv = kvr_stats_level_new(2, 0);
  /* Added in completion order; sent at 1.0 (C), 1.2 (E), 1.5 (D), 1.8 (F), 2.05 (B). */
  add_req(lv, true, 0.0, true, 100, 5, 500);     /* warm-up: left out */
  add_req(lv, false, 1.2, false, -1, 0, 5);      /* E: failed */
  add_req(lv, false, 1.0, true, 500, 3, 600);    /* C: TPOT 50, good */
  add_req(lv, false, 1.8, true, 900, 1, 900);    /* F: one token (TPOT 0), good */
  add_req(lv, false, 2.05, true, 200, 11, 1200); /* B: TPOT 100 over 60 */
  add_req(lv, false, 1.5, true, 1500, 1, 1500);  /* D: TTFT 1500 over 1000 */
  kvr_stats_level_finish(lv, &res->slo);
  kvr_stats_run_add(run, lv);
  assert_near(lv->duration_s, 2.25); /* 1.0 -> B's end at 3.25 */

  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_level_json(res, run, lv, &b);
  cJSON *j = cJSON_Parse(b.data);
  assert_non_null(j);
  assert_string_equal(cJSON_GetObjectItem(j, "endpoint_type")->valuestring, "openai-chat");
  assert_string_equal(cJSON_GetObjectItem(j, "backend")->valuestring, "openai-chat");
  assert_string_equal(cJSON_GetObjectItem(j, "tokenizer_id")->valuestring, "org/model");
  /* C and F meet TTFT <= 1000 and TPOT <= 60 ms: 2 over the 2.25 s window. */
  assert_near(num(j, "request_goodput"), 2 / 2.25);
  /* 1-s buckets from 1.0: C's 3 tokens in [1, 2); F's, and B's first 8 (2.25 + 0.1k) in [2, 3);
   * B's last 3 and D's in [3, 4). */
  assert_near(num(j, "max_output_tokens_per_s"), 9);
  assert_near(num(j, "max_concurrent_requests"), (double)lv->max_concurrent);
  assert_null(cJSON_GetObjectItem(j, "itls"));
  assert_null(cJSON_GetObjectItem(j, "generated_texts"));

  /* Send order (the records are in completion order: E, C, F, B, D): C, E, D, F, B. */
  static const double start[] = {1.0, 1.2, 1.5, 1.8, 2.05};
  static const double ttft[] = {0.5, 0, 1.5, 0.9, 0.2};
  static const double lat[] = {0.6, 0, 1.5, 0.9, 1.2};
  static const double e2e_ms[] = {600, 5, 1500, 900, 1200};
  static const double in[] = {200, 220, 250, 280, 305};
  const cJSON *k = cJSON_GetObjectItem(j, "kvrouter");
  static const char *const top[] = {"input_lens", "output_lens", "ttfts",
                                    "latencies",  "start_times", "errors"};
  static const char *const kv[] = {"cached_lens", "e2els", "tpots", "turns"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(top); i++)
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, top[i])), 5);
  for (size_t i = 0; i < KVR_ARRAY_SIZE(kv); i++)
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(k, kv[i])), 5);
  for (int i = 0; i < 5; i++) {
    assert_near(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "start_times"), i)->valuedouble,
                start[i]);
    assert_near(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "ttfts"), i)->valuedouble, ttft[i]);
    assert_near(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "latencies"), i)->valuedouble, lat[i]);
    assert_near(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "input_lens"), i)->valuedouble, in[i]);
    assert_near(cJSON_GetArrayItem(cJSON_GetObjectItem(k, "e2els"), i)->valuedouble, e2e_ms[i]);
  }
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "errors"), 1)->valuestring,
                      "HTTP 503");
  cJSON_Delete(j);

  /* No SLO set: vllm writes null without --goodput; no model: no tokenizer. */
  res->slo.ttft_p99_ms = res->slo.tpot_p99_ms = 0;
  kvr_stats_set_str(&res->model, NULL);
  kvr_buf_reset(&b);
  kvr_report_level_json(res, run, lv, &b);
  j = cJSON_Parse(b.data);
  assert_non_null(j);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "request_goodput")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "tokenizer_id")));
  cJSON_Delete(j);
  kvr_buf_free(&b);
  kvr_stats_results_free(res);
}

/* Two threads writing level JSONs at once, as `kvrouter bench study` writes its cells' (one
 * level of 2,000 requests, one of 40, each added in reverse send order): every JSON's start_times
 * come out in send order. The sort's context was once one pointer for every thread: a sort could
 * read the other thread's level (out of order, or out of its records: a segfault). A race, so a
 * regression shows only when the two sorts overlap, as they did in two of six study runs. */
typedef struct json_job_s {
  kvr_results_t *res;
  kvr_run_t *run;
  kvr_level_t *lv;
  size_t n;
  int rounds;
  bool ok;
} json_job_t;

static void *write_jsons(void *arg) {
  json_job_t *jb = arg;
  jb->ok = true;
  kvr_buf_t b = KVR_BUF_INIT;
  for (int i = 0; i < jb->rounds && jb->ok; i++) {
    kvr_buf_reset(&b);
    kvr_report_level_json(jb->res, jb->run, jb->lv, &b);
    cJSON *j = cJSON_Parse(b.data);
    const cJSON *st = cJSON_GetObjectItem(j, "start_times");
    jb->ok = j != NULL && (size_t)cJSON_GetArraySize(st) == jb->n;
    for (int k = 1; jb->ok && k < cJSON_GetArraySize(st); k++)
      jb->ok = cJSON_GetArrayItem(st, k - 1)->valuedouble < cJSON_GetArrayItem(st, k)->valuedouble;
    cJSON_Delete(j);
  }
  kvr_buf_free(&b);
  return NULL;
}

static void test_level_json_threads(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  kvr_run_t *run = kvr_stats_results_add_run(res, "base", "", "");
  json_job_t jobs[2] = {{.n = 2000, .rounds = 30}, {.n = 40, .rounds = 1000}};
  for (int t = 0; t < 2; t++) {
    kvr_level_t *lv = kvr_stats_level_new(1, 0);
    for (size_t i = jobs[t].n; i-- > 0;)
      add_req(lv, false, 1.0 + (double)i / 100.0, true, 100, 3, 300);
    kvr_stats_level_finish(lv, &res->slo);
    kvr_stats_run_add(run, lv);
    jobs[t].res = res;
    jobs[t].run = run;
    jobs[t].lv = lv;
  }
  pthread_t th[2];
  for (int t = 0; t < 2; t++)
    assert_int_equal(pthread_create(&th[t], NULL, write_jsons, &jobs[t]), 0);
  for (int t = 0; t < 2; t++)
    pthread_join(th[t], NULL);
  assert_true(jobs[0].ok);
  assert_true(jobs[1].ok);
  kvr_stats_results_free(res);
}

static void test_write_files(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  char dir[] = "/tmp/kvr_report_XXXXXX";
  assert_non_null(mkdtemp(dir));
  char sub[256], err[256], path[512];
  snprintf(sub, sizeof(sub), "%s/out/nested", dir);
  assert_int_equal(kvr_report_write(res, sub, err, sizeof(err)), 0);
  const char *files[] = {"report.md", "report.html", "requests.jsonl",
                         "results/phase0_rate1.00.json", "results/phase3_rate4.00.json"};
  struct stat st;
  for (size_t i = 0; i < KVR_ARRAY_SIZE(files); i++) {
    snprintf(path, sizeof(path), "%s/%s", sub, files[i]);
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > 0);
  }
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(kvr_report_write(res, "/proc/kvr-no-such/x", err, sizeof(err)), KVR_EIO);
  assert_non_null(strstr(err, "/proc/kvr-no-such"));
  kvr_stats_results_free(res);
}

/* Engine figures (preemptions, KV peak) and the prefix-cache reset outcome in the Markdown and the
 * level JSON; levels without engine figures show n/a / null, and without any the tables are left
 * out. */
static void test_engine_figures_and_reset(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  assert_null(strstr(md.data, "Preemptions"));
  assert_non_null(strstr(md.data, "Prefix caches were **not** reset between runs"));
  assert_non_null(strstr(md.data, "| Prefix Cache Reset | none |"));
  kvr_buf_reset(&md);

  res->cache_reset = "before each run: POST /admin/reset_prefix_cache";
  snprintf(res->runs[0].cache_reset, sizeof(res->runs[0].cache_reset), "2/2 workers reset");
  res->runs[0].cache_reset_outcome = KVR_CACHE_RESET_ALL;
  snprintf(res->runs[1].cache_reset, sizeof(res->runs[1].cache_reset),
           "1/2 workers reset; worker 1: HTTP 404");
  res->runs[1].cache_reset_outcome = KVR_CACHE_RESET_FAILED;
  kvr_level_t *a2 = res->runs[0].levels[1], *a3 = res->runs[0].levels[2];
  kvr_level_t *b2 = res->runs[1].levels[0];
  a2->engine_workers = 2, a2->preemptions = 0, a2->kv_usage_peak = 0.5;
  a3->engine_workers = 2, a3->preemptions = 17, a3->kv_usage_peak = 0.99;
  b2->engine_workers = 2, b2->preemptions = 0, b2->kv_usage_peak = 0.4;
  kvr_report_markdown(res, &md);
  const char *m = md.data;
  const char *conf = section(m, "## Configuration");
  assert_non_null(strstr(conf, "| # | Label | Policy | Description | Prefix Cache Reset |"));
  assert_non_null(strstr(conf, "| 0 | phase0 (baseline) | round_robin | round robin | 2/2 workers "
                               "reset |"));
  assert_non_null(strstr(conf, "| kv aware | 1/2 workers reset; worker 1: HTTP 404 |"));
  /* phase3's reset failed on worker 1: the report says so and does not claim a cold start. */
  assert_non_null(strstr(conf, "Prefix caches were reset before each run: POST "
                               "/admin/reset_prefix_cache, but **not every run started cold**: "
                               "the reset before `phase3` failed (1/2 workers reset; worker 1: "
                               "HTTP 404), so `phase3` did not start from reset caches (a worker "
                               "whose reset failed kept what it had cached); `phase0` started "
                               "cold (every worker confirmed its reset)."));
  assert_null(strstr(m, "every run starts cold"));
  const char *pre = section(m, "## Results \xe2\x80\x94 Preemptions (KV cache full)");
  assert_non_null(strstr(pre, "| 1.00 | n/a | \xe2\x80\x94 |"));
  assert_non_null(strstr(pre, "| 2.00 | 0 | 0 |"));
  assert_non_null(strstr(pre, "| 3.00 | 17 | n/a |"));
  const char *kv = section(m, "## Results \xe2\x80\x94 KV Cache Usage Peak");
  assert_non_null(strstr(kv, "| 3.00 | 99% | n/a |"));
  const char *det = section(m, "## Detailed Comparison at Baseline Max Rate (2.00 RPS)");
  assert_non_null(strstr(det, "| Preemptions | 0 | 0 |"));
  assert_non_null(strstr(det, "| KV cache usage peak | 50% | 40% |"));
  assert_non_null(strstr(m, "| Prefix Cache Reset | before each run: POST "
                            "/admin/reset_prefix_cache |"));

  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_level_json(res, &res->runs[0], a3, &b);
  cJSON *j = cJSON_Parse(b.data);
  cJSON *k = cJSON_GetObjectItem(j, "kvrouter");
  assert_int_equal(cJSON_GetObjectItem(k, "preemptions")->valueint, 17);
  assert_true(cJSON_GetObjectItem(k, "kv_cache_usage_peak")->valuedouble == 0.99);
  assert_int_equal(cJSON_GetObjectItem(k, "engine_metrics_workers")->valueint, 2);
  assert_string_equal(cJSON_GetObjectItem(k, "prefix_cache_reset")->valuestring,
                      "2/2 workers reset");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(k, "prefix_cache_reset_complete")));
  cJSON_Delete(j);
  kvr_buf_reset(&b);
  kvr_report_level_json(res, &res->runs[1], res->runs[1].levels[1], &b);
  j = cJSON_Parse(b.data);
  k = cJSON_GetObjectItem(j, "kvrouter");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(k, "preemptions")));
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(k, "kv_cache_usage_peak")));
  assert_int_equal(cJSON_GetObjectItem(k, "engine_metrics_workers")->valueint, 0);
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(k, "prefix_cache_reset_complete")));
  cJSON_Delete(j);
  kvr_buf_free(&b);
  kvr_buf_free(&md);
  res->cache_reset = NULL;
  kvr_stats_results_free(res);
}

/* Each run's reset outcome decides the cold-start sentence: all confirmed, one failed (above), one
 * not recorded. */
static void test_reset_verdicts(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT;
  res->cache_reset = "before each run: POST /admin/reset_prefix_cache";
  res->runs[0].cache_reset_outcome = KVR_CACHE_RESET_ALL;
  res->runs[1].cache_reset_outcome = KVR_CACHE_RESET_ALL;
  kvr_report_markdown(res, &md);
  assert_non_null(strstr(md.data, "Prefix caches were reset before each run: POST "
                                  "/admin/reset_prefix_cache, and every worker confirmed its reset "
                                  "before every run, so every run starts cold."));
  kvr_buf_reset(&md);
  res->runs[1].cache_reset_outcome = KVR_CACHE_RESET_UNKNOWN;
  kvr_report_markdown(res, &md);
  assert_null(strstr(md.data, "every run starts cold"));
  assert_null(strstr(md.data, "not every run started cold"));
  assert_non_null(strstr(md.data, "but **whether every run started cold is not known**: the "
                                  "outcome of the reset before `phase3` was not recorded, so "
                                  "whether it started cold is not known; `phase0` started cold"));
  kvr_buf_free(&md);
  res->cache_reset = NULL;
  kvr_stats_results_free(res);
}

static kvr_results_t *two_runs(void) {
  kvr_results_t *res = kvr_stats_results_new();
  kvr_run_t *a = kvr_stats_results_add_run(res, "phase0", "round_robin", "");
  kvr_stats_run_add(a, level(&res->slo, 4, 300, 30, 0, 4));
  kvr_stats_run_add(a, level(&res->slo, 8, 400, 30, 0, 4));
  kvr_stats_run_add(a, level(&res->slo, 12, 500, 30, 0, 4));
  kvr_run_t *b = kvr_stats_results_add_run(res, "phase3", "kv_aware", "");
  kvr_stats_run_add(b, level(&res->slo, 4, 200, 30, 0, 4));
  kvr_stats_run_add(b, level(&res->slo, 8, 250, 30, 0, 4));
  kvr_stats_run_add(b, level(&res->slo, 12, 300, 30, 0, 4));
  return res;
}

static void render(const kvr_results_t *res, kvr_buf_t *md, kvr_buf_t *sum) {
  kvr_buf_reset(md);
  kvr_buf_reset(sum);
  kvr_report_markdown(res, md);
  kvr_report_summary(res, sum);
}

/* Every level tried passed (demo --quick): the max SLO-compliant load is only bounded below, and
 * nothing is claimed about which label is better. */
static void test_capacity_not_found(void **state) {
  (void)state;
  kvr_results_t *res = two_runs();
  kvr_buf_t md = KVR_BUF_INIT, sum = KVR_BUF_INIT;
  render(res, &md, &sum);
  const char *m = md.data;
  assert_non_null(strstr(m, "| phase0 | at least 12.00 | \xe2\x80\x94 |"));
  assert_non_null(strstr(m, "| phase3 | at least 12.00 | unknown |"));
  assert_null(strstr(m, "WINNER"));
  assert_null(strstr(m, "No configuration"));
  assert_non_null(strstr(m, "**Which configuration has the highest max SLO-compliant load is not "
                            "known:** `phase0` passed every level tried (at least 12.00 RPS); "
                            "`phase3` passed every level tried (at least 12.00 RPS)."));
  assert_non_null(strstr(m, "## Detailed Comparison at Baseline's Highest Passing Rate (12.00 "
                            "RPS; every level passed, so its max was not found)"));
  assert_non_null(strstr(m, "1. **Whether any configuration raises the max SLO-compliant load "
                            "above `phase0`'s is not known:**"));
  assert_non_null(strstr(m, "**`phase0` passed every measured load.**"));
  assert_non_null(strstr(sum.data, "12.00 RPS  (at least: every level tried passed)\n"));
  assert_non_null(strstr(sum.data, "12.00 RPS  (no ratio: both passed every level tried, so "
                                   "neither limit was found)\n"));
  assert_null(strstr(sum.data, "+0%"));

  /* phase0 fails at 16, phase3 passes there: phase3 certainly wins, by at least +33%. */
  kvr_stats_run_add(&res->runs[0], level(&res->slo, 16, 1200, 30, 0, 4));
  kvr_stats_run_add(&res->runs[1], level(&res->slo, 16, 350, 30, 0, 4));
  render(res, &md, &sum);
  m = md.data;
  assert_non_null(strstr(m, "| phase0 | 12.00 | \xe2\x80\x94 |"));
  assert_non_null(strstr(m, "| phase3 **WINNER** | at least 16.00 | at least +33% |"));
  assert_non_null(strstr(m, "**phase3 improved max SLO-compliant load over baseline: 12.00 -> at "
                            "least 16.00 RPS (at least +33%).**"));
  assert_non_null(strstr(m, "1. **`phase3` raises the max SLO-compliant load from 12.00 to at "
                            "least 16.00 RPS (at least +33%) over `phase0`.** It passed every "
                            "level tried, so its own limit was not found"));
  assert_non_null(strstr(m, "## Detailed Comparison at Baseline Max Rate (12.00 RPS)"));
  assert_non_null(strstr(sum.data, "16.00 RPS  (+33% vs phase0) at least: phase3 passed every "
                                   "level tried\n"));

  /* phase3 fails at 20: both limits found, the plain figures and sentences. */
  kvr_stats_run_add(&res->runs[1], level(&res->slo, 20, 1300, 30, 0, 4));
  render(res, &md, &sum);
  m = md.data;
  assert_non_null(strstr(m, "| phase3 **WINNER** | 16.00 | +33% |"));
  assert_non_null(strstr(m, "**phase3 improved max SLO-compliant load over baseline: 12.00 -> "
                            "16.00 RPS (+33%).**"));
  assert_non_null(strstr(m, "1. **`phase3` raises the max SLO-compliant load from 12.00 to 16.00 "
                            "RPS (+33%) over `phase0`.** On this workload it serves 33% more "
                            "traffic within the SLOs."));
  assert_null(strstr(m, "at least"));
  assert_non_null(strstr(sum.data, "16.00 RPS  (+33% vs phase0)\n"));
  kvr_buf_free(&md);
  kvr_buf_free(&sum);
  kvr_stats_results_free(res);
}

/* The analysis as data: bounds of ratios and certain comparisons. */
static void test_capacity_bounds_as_data(void **state) {
  (void)state;
  kvr_report_cap_t found2 = {2, true, true}, found3 = {3, true, true}, atleast3 = {3, true, false};
  kvr_report_cap_t atleast4 = {4, true, false}, none = {0, true, true}, noran = {0, false, false};
  assert_int_equal(kvr_report_gain(found2, found3).bound, KVR_REPORT_EXACT);
  assert_true(kvr_report_gain(found2, found3).ratio == 1.5);
  assert_int_equal(kvr_report_gain(found2, atleast3).bound, KVR_REPORT_AT_LEAST);
  assert_int_equal(kvr_report_gain(atleast3, found2).bound, KVR_REPORT_AT_MOST);
  assert_int_equal(kvr_report_gain(atleast3, atleast4).bound, KVR_REPORT_UNKNOWN);
  assert_int_equal(kvr_report_gain(none, found2).bound, KVR_REPORT_NO_BASE);
  assert_int_equal(kvr_report_gain(atleast3, none).bound, KVR_REPORT_EXACT); /* -100% */
  assert_int_equal(kvr_report_gain(noran, found2).bound, KVR_REPORT_UNKNOWN);
  assert_int_equal(kvr_report_cmp(found3, found2), 1);
  assert_int_equal(kvr_report_cmp(found2, found2), 0);
  assert_int_equal(kvr_report_cmp(atleast4, found3), 1);
  assert_int_equal(kvr_report_cmp(atleast3, found3), KVR_REPORT_CMP_UNKNOWN);
  assert_int_equal(kvr_report_cmp(found2, atleast3), -1);
  assert_int_equal(kvr_report_cmp(found3, atleast3), KVR_REPORT_CMP_UNKNOWN);
  assert_int_equal(kvr_report_cmp(atleast3, atleast4), KVR_REPORT_CMP_UNKNOWN);
  assert_int_equal(kvr_report_cmp(noran, found2), KVR_REPORT_CMP_UNKNOWN);
}

/* "Kept to its schedule" only when every level's send lag p99 is under 10 ms and its achieved rate
 * within 5% of its scheduled rate; otherwise the levels that missed are named with their figures.
 */
static void test_schedule_verdicts(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  assert_non_null(strstr(md.data, "**The load generator kept to its schedule:** at every level the "
                                  "send lag p99 was under 10 ms (real time; worst 0.00 ms) and "
                                  "the achieved rate within 5% of the rate the level's arrival "
                                  "times ask for (worst 0.0% off)."));
  kvr_level_t *p3 = res->runs[1].levels[1];     /* phase3 at 3 */
  kvr_level_t *p0 = res->runs[0].levels[3];     /* phase0 at 4 */
  p3->lag.p99 = 33;                             /* the README's demo run */
  p0->achieved_rate = 0.9 * p0->scheduled_rate; /* 10% short */
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_null(strstr(md.data, "kept to its schedule"));
  assert_non_null(strstr(md.data, "**The load generator missed its schedule at 2 of 7 levels** (it "
                                  "keeps to it when the send lag p99 is under 10 ms, real time, "
                                  "and the achieved rate within 5% of the rate the level's "
                                  "arrival times ask for): `phase0` at 4.00 RPS: achieved 3.60 "
                                  "req/s vs 4.00 scheduled (-10.0%); `phase3` at 3.00 RPS: send "
                                  "lag p99 33.0 ms."));
  bool lag_ok, rate_ok;
  assert_false(kvr_report_on_schedule(p3, &lag_ok, &rate_ok));
  assert_false(lag_ok);
  assert_true(rate_ok);
  p3->lag.p99 = 9.99;
  assert_true(kvr_report_on_schedule(p3, &lag_ok, &rate_ok));
  /* Closed-loop users have no schedule: no verdict. */
  res->concurrency_mode = true;
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_null(strstr(md.data, "its schedule"));
  assert_non_null(
      strstr(md.data, "| Tool | `kvrouter bench` (closed-loop users, libuv + libcurl) |"));
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

/* Placement is judged over every worker seen at the load, the workload rows from the data. */
static void test_balance_and_workload_rows(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  const char *m = md.data;
  assert_non_null(strstr(m, "**`phase0` spread requests over 4 workers at 2.00 RPS**: the busiest "
                            "took 25%, the least busy 25% (even would be 25%)."));
  assert_non_null(strstr(m, "**`phase3` spread requests over 2 of the 4 workers seen at 2.00 "
                            "RPS**: the busiest took 50%, 2 took none (even would be 25%)."));
  assert_non_null(strstr(m, "| Tool | `kvrouter bench` (open-loop, libuv + libcurl) |"));
  assert_non_null(strstr(m, "| Prompts per Rate | 20 asked, 20-23 measured per level run to its "
                            "end |"));
  assert_non_null(strstr(m, "| Warm-up | first 0 requests of each level, excluded from metrics |"));
  assert_non_null(strstr(m, "each arrival sends the next eligible turn of an open conversation"));
  res->replay = true;
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_null(strstr(md.data, "each arrival sends the next eligible turn"));
  assert_non_null(strstr(md.data, "arrival i sends a pre-assigned (conversation, turn) of the "
                                  "replayed conversations whether or not that conversation's "
                                  "previous turn has finished"));
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

/* A run whose only failing level was interrupted has not found its limit. */
static void test_interrupted_failure_bounds_nothing(void **state) {
  (void)state;
  kvr_results_t *res = two_runs();
  kvr_level_t *lv = level(&res->slo, 16, 1500, 30, 0, 4);
  lv->interrupted = true;
  kvr_stats_run_add(&res->runs[1], lv);
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  assert_non_null(strstr(md.data, "**`phase3` failed no level it ran to its end.** Its interrupted "
                                  "levels cover only the requests finished before the stop"));
  assert_non_null(strstr(md.data, "| phase3 | at least 12.00 | unknown |"));
  assert_non_null(strstr(md.data, "| 16.00 | \xe2\x80\x94 | FAIL (TTFT) (partial) |"));
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

/* A baseline that passes at no load below its first failure: no ratio, and the sentences say
 * whether it passed anywhere at all. */
static void test_baseline_passes_nowhere(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  kvr_run_t *a = kvr_stats_results_add_run(res, "phase0", "", "");
  kvr_stats_run_add(a, level(&res->slo, 2, 1300, 30, 0, 2));
  kvr_run_t *b = kvr_stats_results_add_run(res, "phase3", "", "");
  kvr_stats_run_add(b, level(&res->slo, 2, 300, 30, 0, 2));
  kvr_stats_run_add(b, level(&res->slo, 4, 1300, 30, 0, 2));
  kvr_buf_t md = KVR_BUF_INIT, sum = KVR_BUF_INIT;
  render(res, &md, &sum);
  assert_non_null(strstr(md.data, "| phase3 **WINNER** | 2.00 | \xe2\x80\x94 |"));
  assert_non_null(strstr(md.data, "**phase3 passed up to 2.00 RPS; the baseline passed at no "
                                  "measured load.**"));
  assert_non_null(strstr(md.data, "(2.00 RPS; no load passed)"));
  assert_non_null(strstr(sum.data, "2.00 RPS  (baseline passed at no load)\n"));
  kvr_stats_run_add(&res->runs[0], level(&res->slo, 4, 300, 30, 0, 2)); /* passes above a failure */
  render(res, &md, &sum);
  assert_non_null(strstr(md.data, "the baseline passed at no measured load below its first "
                                  "failure.**"));
  assert_non_null(strstr(md.data, "(2.00 RPS; no load below its first failure passed)"));
  kvr_buf_free(&md);
  kvr_buf_free(&sum);
  kvr_stats_results_free(res);
}

/* A concurrency level of 4 users measured in steady state: 4 warm-up records (each user's first),
 * 6 measured (one with a single output token), 2 cool-down (a third cancelled). */
static kvr_level_t *steady_level(const kvr_slo_t *slo) {
  kvr_level_t *lv = kvr_stats_level_new(0, 4);
  for (int i = 0; i < 12; i++) {
    kvr_req_rec_t r;
    memset(&r, 0, sizeof(r));
    r.user = i % 4;
    r.conv = (uint64_t)i % 4;
    r.turn = 1 + (uint32_t)i % 5;
    r.warmup = i < 4 || i >= 10;
    r.cooldown = i >= 10;
    r.sent_s = r.target_s = i;
    r.ok = true;
    r.status = 200;
    r.ttft_ms = 100;
    r.output_tokens = i == 5 ? 1 : 11;
    r.tpot_ms = i == 5 ? -1 : 10;
    r.e2e_ms = 100 + 10 * (r.output_tokens - 1);
    r.prompt_tokens = 4000 + 100 * r.turn;
    r.cached_tokens = 1000 * (uint32_t)i;
    r.usage_seen = true;
    double itl[1] = {10};
    kvr_stats_level_add(lv, &r, itl, 1);
  }
  lv->steady_state = true;
  lv->warmup_requests = 4;
  lv->cooldown_requests = 3;
  lv->cancelled_requests = 1;
  kvr_stats_level_finish(lv, slo);
  return lv;
}

/* Number i of array name of object o. */
static double item(const cJSON *o, const char *name, int i) {
  const cJSON *a = cJSON_GetObjectItem(o, name);
  assert_true(cJSON_IsArray(a));
  return cJSON_GetArrayItem(a, i)->valuedouble;
}

/* The per-request arrays of the measured requests line up with vllm's; the counts and the steady
 * state are in the JSON, the cool-down flag and the user in the JSONL, one sentence in the report.
 */
static void test_steady_state_level(void **state) {
  (void)state;
  kvr_results_t *res = kvr_stats_results_new();
  res->concurrency_mode = true;
  res->num_prompts = 6;
  kvr_run_t *run = kvr_stats_results_add_run(res, "bench", "", "");
  kvr_stats_run_add(run, steady_level(&res->slo));
  const kvr_level_t *lv = run->levels[0];
  assert_int_equal(lv->measured, 6);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_level_json(res, run, lv, &b);
  cJSON *j = cJSON_Parse(b.data);
  assert_non_null(j);
  cJSON *k = cJSON_GetObjectItem(j, "kvrouter");
  const char *arrays[] = {"cached_lens", "e2els", "tpots", "turns"};
  for (size_t a = 0; a < 4; a++)
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(k, arrays[a])), 6);
  assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "input_lens")), 6);
  for (int i = 0; i < 6; i++) { /* entry i is record 4 + i everywhere */
    int rec = 4 + i;
    assert_true(item(j, "input_lens", i) == 4000 + 100 * (1 + rec % 5));
    assert_true(item(k, "turns", i) == 1 + rec % 5);
    assert_true(item(k, "cached_lens", i) == 1000 * rec);
    assert_true(item(k, "tpots", i) == (rec == 5 ? -1 : 10));
    assert_true(item(k, "e2els", i) == (rec == 5 ? 100 : 200));
  }
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(k, "steady_state")));
  assert_int_equal(cJSON_GetObjectItem(k, "warmup_requests")->valueint, 4);
  assert_int_equal(cJSON_GetObjectItem(k, "cooldown_requests")->valueint, 3);
  assert_int_equal(cJSON_GetObjectItem(k, "cancelled_requests")->valueint, 1);
  cJSON_Delete(j);

  kvr_buf_reset(&b);
  kvr_report_jsonl(run, lv, &b);
  assert_int_equal(count(b.data, "\"cooldown\":true"), 2);
  assert_int_equal(count(b.data, "\"warmup\":true"), 6);
  assert_int_equal(count(b.data, "\"user\":3,"), 3);

  kvr_buf_reset(&b);
  kvr_report_markdown(res, &b);
  assert_non_null(strstr(b.data, "| Warm-up / Cool-down | measured in steady state: 4 warm-up "
                                 "requests per level"));
  assert_non_null(strstr(b.data, "then 3 cool-down requests sent while those finished"));
  assert_non_null(strstr(b.data, "observed in steady state"));
  kvr_buf_free(&b);
  kvr_stats_results_free(res);
}

/* The Command row can be pasted back into a shell: safe words bare, others single-quoted. */
static void test_shell_join(void **state) {
  (void)state;
  static const struct {
    const char *arg, *want;
  } cases[] = {
      {"bench", "bench"},
      {"--rates=1,2.5", "--rates=1,2.5"},
      {"user@host:/a/b_c%+", "user@host:/a/b_c%+"},
      {"two words", "'two words'"},
      {"it's", "'it'\\''s'"},
      {"", "''"},
      {"$HOME", "'$HOME'"},
      {"a*b", "'a*b'"},
      {"~", "'~'"},
      {"x;rm -rf /", "'x;rm -rf /'"},
      {"'", "''\\'''"},
      {"\"q\"", "'\"q\"'"},
      {"tab\there", "'tab\there'"},
      {"caf\xc3\xa9", "'caf\xc3\xa9'"},
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(cases); i++) {
    kvr_buf_t b = KVR_BUF_INIT;
    char *argv[] = {(char *)cases[i].arg};
    kvr_report_shell_join(1, argv, &b);
    char want[128];
    snprintf(want, sizeof(want), "kvrouter %s", cases[i].want);
    assert_string_equal(b.data, want);
    kvr_buf_free(&b);
  }
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_shell_join(0, NULL, &b);
  assert_string_equal(b.data, "kvrouter");
  kvr_buf_reset(&b);
  char *argv[] = {"bench", "--title", "A/B it's", "--rates", "1,2", "--out", "x y/"};
  kvr_report_shell_join(7, argv, &b);
  assert_string_equal(b.data, "kvrouter bench --title 'A/B it'\\''s' --rates 1,2 --out 'x y/'");
  kvr_buf_free(&b);
}

/* The virtual-time mark: title suffix, Clock line, JSON flag; nothing of it for a real run. */
static void test_virtual_mark(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT, html = KVR_BUF_INIT, js = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  kvr_report_html(res, &html);
  kvr_report_level_json(res, &res->runs[0], res->runs[0].levels[0], &js);
  assert_non_null(strstr(md.data, "# A/B <test>\n"));
  assert_null(strstr(md.data, "virtual"));
  assert_null(strstr(md.data, "Clock:"));
  assert_null(strstr(html.data, "virtual"));
  cJSON *j = cJSON_Parse(js.data);
  cJSON *k = cJSON_GetObjectItem(j, "kvrouter");
  assert_true(cJSON_IsFalse(cJSON_GetObjectItem(k, "virtual")));
  assert_null(cJSON_GetObjectItem(k, "virtual_desc"));
  cJSON_Delete(j);

  kvr_stats_set_str(&res->virtual_desc, "4 sim workers, 2 ms link delay, seed 7");
  kvr_buf_reset(&md);
  kvr_buf_reset(&html);
  kvr_buf_reset(&js);
  kvr_report_markdown(res, &md);
  kvr_report_html(res, &html);
  kvr_report_level_json(res, &res->runs[0], res->runs[0].levels[0], &js);
  assert_true(strncmp(md.data, "# A/B <test> (virtual time)\n", 28) == 0);
  const char *conf = section(md.data, "## Configuration");
  const char *clock = strstr(conf, "\nClock: virtual time \xe2\x80\x94 4 sim workers, 2 ms link "
                                   "delay, seed 7\n");
  assert_non_null(clock);
  assert_true(clock < section(md.data, "## SLO Targets"));
  assert_non_null(strstr(html.data, "<title>A/B &lt;test&gt; (virtual time)</title>"));
  assert_non_null(strstr(html.data, "<h1>A/B &lt;test&gt; (virtual time)</h1>"));
  assert_non_null(strstr(html.data, "<p>Clock: virtual time \xe2\x80\x94 4 sim workers, 2 ms link "
                                    "delay, seed 7</p>"));
  j = cJSON_Parse(js.data);
  k = cJSON_GetObjectItem(j, "kvrouter");
  assert_true(cJSON_IsTrue(cJSON_GetObjectItem(k, "virtual")));
  assert_string_equal(cJSON_GetObjectItem(k, "virtual_desc")->valuestring,
                      "4 sim workers, 2 ms link delay, seed 7");
  cJSON_Delete(j);
  kvr_buf_free(&md);
  kvr_buf_free(&html);
  kvr_buf_free(&js);
  kvr_stats_results_free(res); /* frees virtual_desc (checked under ASan/valgrind) */
}

/* The paragraph right after the title (Markdown: the first block after "# title"). */
static const char *first_para(const char *md, char *buf, size_t size) {
  const char *p = strstr(md, "\n\n");
  assert_non_null(p);
  p += 2;
  size_t n = strcspn(p, "\n");
  snprintf(buf, size, "%.*s", (int)n, p);
  return buf;
}

/* The summary that opens the report says who won by how much, exact or a bound, or not known. */
static void test_summary_paragraph(void **state) {
  (void)state;
  char p[2048];
  kvr_results_t *res = sample();
  kvr_buf_t md = KVR_BUF_INIT, html = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  assert_string_equal(first_para(md.data, p, sizeof(p)),
                      "**Summary:** `phase3` (kv_aware) has the highest max SLO-compliant load, "
                      "**3.00 RPS**, against 2.00 RPS for the baseline `phase0` (round_robin): "
                      "**+50%**. Both limits were found (a higher load failed), so the gain is "
                      "exact. (Max SLO-compliant load: the highest load at which TTFT p99 < 1000 "
                      "ms and TPOT p99 < 60 ms.)");
  kvr_report_html(res, &html);
  assert_non_null(strstr(html.data, "</h1>\n<p><strong>Summary:</strong> <code>phase3</code> "
                                    "(kv_aware) has the highest max SLO-compliant load, "
                                    "<strong>3.00 RPS</strong>, against 2.00 RPS"));
  kvr_buf_free(&html);
  kvr_stats_results_free(res);

  /* Every level passed: nothing is claimed. */
  res = two_runs();
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  first_para(md.data, p, sizeof(p));
  assert_non_null(strstr(p, "**Summary:** which configuration has the highest max SLO-compliant "
                            "load is **not known**: `phase0` passed every level tried (at least "
                            "12.00 RPS); `phase3` passed every level tried (at least 12.00 RPS)."));
  assert_null(strstr(p, "WINNER"));
  assert_null(strstr(p, "has the highest max SLO-compliant load,"));
  /* phase0 fails at 16, phase3 passes there: a lower bound. */
  kvr_stats_run_add(&res->runs[0], level(&res->slo, 16, 1200, 30, 0, 4));
  kvr_stats_run_add(&res->runs[1], level(&res->slo, 16, 350, 30, 0, 4));
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_string_equal(first_para(md.data, p, sizeof(p)),
                      "**Summary:** `phase3` (kv_aware) has the highest max SLO-compliant load, "
                      "**at least 16.00 RPS**, against 12.00 RPS for the baseline `phase0` "
                      "(round_robin): **at least +33%**. It passed every level tried, so its own "
                      "limit was not found and the gain is a lower bound: measure higher loads to "
                      "find it. (Max SLO-compliant load: the highest load at which TTFT p99 < 1000 "
                      "ms and TPOT p99 < 60 ms.)");
  /* phase3 fails below phase0's limit: the baseline is not beaten. */
  kvr_stats_run_add(&res->runs[1], level(&res->slo, 6, 1300, 30, 0, 4));
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  first_para(md.data, p, sizeof(p));
  assert_non_null(strstr(p, "**Summary:** no configuration beat the baseline `phase0` "
                            "(round_robin): its max SLO-compliant load is **12.00 RPS** and every "
                            "other one's is the same or lower."));
  kvr_stats_results_free(res);

  /* One run, no policy: its own limit. */
  res = kvr_stats_results_new();
  kvr_run_t *a = kvr_stats_results_add_run(res, "solo", "", "");
  kvr_stats_run_add(a, level(&res->slo, 1, 300, 30, 0, 1));
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_string_equal(first_para(md.data, p, sizeof(p)),
                      "**Summary:** `solo` has a max SLO-compliant load of **at least 1.00 RPS** "
                      "(every level tried passed, so this is a lower bound).");
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

/* The y tick values of a chart (right-aligned tick labels), in order; returns their count. */
static size_t y_ticks(const char *svg, double *v, size_t max) {
  size_t n = 0;
  for (const char *p = strstr(svg, "<text class=\"tick\""); p && n < max;
       p = strstr(p + 1, "<text class=\"tick\"")) {
    const char *gt = strchr(p, '>');
    const char *end = strstr(p, "text-anchor=\"end\"");
    if (end != NULL && end < gt)
      v[n++] = strtod(gt + 1, NULL);
  }
  return n;
}

/* The first x tick value of a chart (centred tick labels). */
static double first_x_tick(const char *svg) {
  const char *needle = "text-anchor=\"middle\">";
  const char *p = strstr(svg, needle);
  assert_non_null(p);
  return strtod(p + strlen(needle), NULL);
}

/* Every circle of the chart lies inside the plot (MT = 40 .. MT + PH = 310). */
static void assert_points_inside(const char *svg) {
  size_t n = 0;
  for (const char *p = strstr(svg, " cy=\""); p; p = strstr(p + 1, " cy=\"")) {
    double cy = strtod(p + 5, NULL);
    assert_true(cy >= 40 - 1e-6 && cy <= 310 + 1e-6);
    n++;
  }
  assert_true(n > 0);
}

/* Legends and tooltips name the policy; tooltips carry n; emphasis is structure, not "**". */
static void test_html_legends_and_markup(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  /* Sentences with emphasis and code everywhere: failed reset, missed schedule. */
  res->cache_reset = "before each run: POST /admin/reset_prefix_cache";
  res->runs[0].cache_reset_outcome = KVR_CACHE_RESET_ALL;
  res->runs[1].cache_reset_outcome = KVR_CACHE_RESET_FAILED;
  res->runs[1].levels[1]->lag.p99 = 33;
  kvr_stats_set_str(&res->command, "kvrouter bench --labels phase0,phase3");
  kvr_buf_t html = KVR_BUF_INIT, md = KVR_BUF_INIT;
  kvr_report_html(res, &html);
  kvr_report_markdown(res, &md);
  const char *h = html.data;
  assert_non_null(strstr(md.data, "**not every run started cold**"));
  assert_non_null(strstr(md.data, "| Command | `kvrouter bench --labels phase0,phase3` |"));
  assert_null(strstr(h, "**"));
  assert_null(strstr(h, "`"));
  assert_non_null(strstr(h, "but <strong>not every run started cold</strong>: the reset before "
                            "<code>phase3</code> failed"));
  assert_non_null(strstr(h, "<strong>The load generator missed its schedule at 1 of 7 "
                            "levels</strong>"));
  assert_non_null(strstr(h, "<td>Command</td><td><code>kvrouter bench --labels "
                            "phase0,phase3</code></td>"));
  /* Prose and text cells left, figures right. */
  assert_non_null(strstr(h, "p,li{text-align:left"));
  assert_non_null(strstr(h, "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left"));
  assert_non_null(strstr(h, "td.num,th.num{text-align:right"));
  assert_non_null(strstr(h, "<tr><td class=\"num\">1.00</td><td class=\"num\">300 (n=20)</td>"));
  assert_non_null(strstr(h, "<tr><td class=\"c\">0</td><td>phase0 (baseline)</td>"));
  static char buf[65536];
  svg_by_id(h, "ttft-p99", buf, sizeof(buf));
  assert_non_null(strstr(buf, ">phase0 (round_robin)</text>"));
  assert_non_null(strstr(buf, ">phase3 (kv_aware)</text>"));
  assert_non_null(strstr(buf, "<title>phase3 (kv_aware) at 2.00 RPS: 400 ms (n=20)</title>"));
  svg_by_id(h, "tpot-p99", buf, sizeof(buf));
  assert_non_null(strstr(buf, "<title>phase0 (round_robin) at 4.00 RPS: 90 ms (n=20)</title>"));
  svg_by_id(h, "worker-share", buf, sizeof(buf));
  assert_non_null(strstr(buf, "<title>phase3 (kv_aware), w0: 50.0% (10 of n=20)</title>"));
  /* No policy, or a policy equal to the label: the label alone. */
  kvr_buf_reset(&html);
  res->runs[0].policy[0] = '\0';
  snprintf(res->runs[1].policy, sizeof(res->runs[1].policy), "phase3");
  kvr_report_html(res, &html);
  svg_by_id(html.data, "ttft-p99", buf, sizeof(buf));
  assert_non_null(strstr(buf, ">phase0</text>"));
  assert_non_null(strstr(buf, ">phase3</text>"));
  assert_null(strstr(buf, "(kv_aware)"));
  /* A code span holding a backtick gets a double fence; a pipe stays in its Markdown cell. */
  kvr_stats_set_str(&res->command, "kvrouter bench --title 'a`b|c'");
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_non_null(strstr(md.data, "| Command | `` kvrouter bench --title 'a`b\\|c' `` |"));
  kvr_buf_free(&html);
  kvr_buf_free(&md);
  res->cache_reset = NULL;
  kvr_stats_results_free(res);
}

/* One run at loads with the given TTFT p99 (constant per level) and TPOT 30 ms. */
static kvr_results_t *ttft_curve(const double *loads, const double *ttft, size_t n) {
  kvr_results_t *res = kvr_stats_results_new();
  kvr_run_t *a = kvr_stats_results_add_run(res, "base", "round_robin", "");
  for (size_t i = 0; i < n; i++)
    kvr_stats_run_add(a, level(&res->slo, loads[i], ttft[i], 30, 0, 2));
  return res;
}

/* Axes fit the data: nice ticks from the data's range, the SLO drawn only near it, a log axis for
 * figures spanning decades, x from near the first load when it is far from zero; no point
 * clipped. */
static void test_chart_axes_fit(void **state) {
  (void)state;
  static char buf[65536];
  double t[32];
  kvr_buf_t html = KVR_BUF_INIT;
  /* The sample: TTFT 300..1200 ms with the 1000 ms SLO: 0..1200, linear. */
  kvr_results_t *res = sample();
  kvr_report_html(res, &html);
  svg_by_id(html.data, "ttft-p99", buf, sizeof(buf));
  size_t n = y_ticks(buf, t, 32);
  assert_true(n >= 4 && n <= 9);
  assert_true(t[0] == 0 && t[n - 1] == 1200);
  assert_null(strstr(buf, "log scale"));
  assert_points_inside(buf);
  svg_by_id(html.data, "tpot-p99", buf, sizeof(buf)); /* TPOT 30..90 ms, SLO 60 */
  n = y_ticks(buf, t, 32);
  assert_true(t[n - 1] >= 90 && t[n - 1] <= 100);
  assert_points_inside(buf);
  svg_by_id(html.data, "worker-share", buf, sizeof(buf)); /* largest share 50% */
  n = y_ticks(buf, t, 32);
  assert_true(t[n - 1] == 50);
  kvr_stats_results_free(res);

  /* TTFT far under the SLO: the axis fits 10..40 ms and the SLO is noted above the plot. */
  static const double loads[] = {8, 9, 10, 11, 12};
  static const double low[] = {10, 15, 20, 30, 40};
  res = ttft_curve(loads, low, 5);
  kvr_buf_reset(&html);
  kvr_report_html(res, &html);
  svg_by_id(html.data, "ttft-p99", buf, sizeof(buf));
  n = y_ticks(buf, t, 32);
  assert_true(t[0] == 0 && t[n - 1] >= 40 && t[n - 1] <= 50);
  assert_null(strstr(buf, "class=\"slo\""));
  assert_non_null(strstr(buf, "SLO 1000 ms (above the plot)"));
  assert_true(first_x_tick(buf) == 8); /* loads 8..12: x starts at 8, not 0 */
  assert_points_inside(buf);
  kvr_stats_results_free(res);

  /* TTFT from 100 ms to 30 s: a log axis from 100 to 50000, the SLO line on it. */
  static const double wide[] = {100, 300, 900, 5000, 30000};
  res = ttft_curve(loads, wide, 5);
  kvr_buf_reset(&html);
  kvr_report_html(res, &html);
  svg_by_id(html.data, "ttft-p99", buf, sizeof(buf));
  assert_non_null(strstr(buf, "TTFT p99 (ms), log scale"));
  n = y_ticks(buf, t, 32);
  assert_true(t[0] == 100 && t[n - 1] == 50000);
  assert_int_equal(count(buf, "class=\"slo\""), 1);
  assert_points_inside(buf);
  svg_by_id(html.data, "throughput", buf, sizeof(buf)); /* throughput stays linear */
  assert_null(strstr(buf, "log scale"));
  assert_points_inside(buf);
  kvr_buf_free(&html);
  kvr_stats_results_free(res);
}

/* A trace workload's section: the trace's own figures after the configuration, each run's cached
 * share at its max SLO-compliant rate against the infinite cache's, the same in the HTML and in
 * each level's JSON; the workload rows say what a rate and a level are. */
static void test_trace_section(void **state) {
  (void)state;
  kvr_results_t *res = sample();
  res->trace = calloc(1, sizeof(*res->trace));
  kvr_trace_stats_t *t = res->trace;
  snprintf(t->file, sizeof(t->file), "%s", "mooncake.jsonl");
  t->block_tokens = 512;
  t->file_requests = t->requests = 3993;
  t->span_s = 1022.025;
  t->mean_rate = 3992 / 1022.025;
  t->input = (kvr_dist_t){.n = 3993, .mean = 15325.4, .p50 = 11587, .p99 = 66456, .max = 191378};
  t->output = (kvr_dist_t){.n = 3993, .mean = 149.1, .p50 = 69, .p99 = 768, .max = 893};
  t->blocks = 121877;
  t->blocks_seen = 77952; /* 63.96% */
  t->input_tokens = 1000;
  t->tokens_seen = 651;
  t->shared = (kvr_dist_t){.n = 3993, .p50 = 0, .p90 = 35840, .max = 190976};
  t->shared_none = 2196;
  t->max_context = 131072;
  t->over_context = 10;
  t->sent = 3983;
  t->sent_span_s = 1022.0;
  t->sent_rate = 3.9;
  t->sent_input_tokens = 1000;
  t->sent_tokens_seen = 600; /* 60.0%: the runs' 75% cached is 125% of it */
  kvr_buf_t md = KVR_BUF_INIT;
  kvr_report_markdown(res, &md);
  const char *tr = section(md.data, "\n## Trace\n");
  assert_true(tr > section(md.data, "\n## Configuration\n"));
  assert_true(tr < section(md.data, "\n## SLO Targets\n"));
  static const char *const rows[] = {
      "| File | `mooncake.jsonl` (3,993 requests) |",
      "| Window | the whole trace |",
      "| Requests | 3,993 over 1,022 s: mean rate 3.91 req/s |",
      "| Input tokens per request | mean 15,325, p50 11,587, p99 66,456, max 191,378 |",
      "| Output tokens per request | mean 149, p50 69, p99 768, max 893 |",
      "| Hash blocks | 121,877 of 512 tokens |",
      "| Infinite-cache hit rate | 64.0% of blocks seen earlier in the trace (65.1% of input "
      "tokens) |",
      "| Shared prefix per request | none for 55% of requests; p50 0, p90 35,840, max 190,976 "
      "tokens seen earlier |",
      "| Longer than the workers' context | 10 requests (input + output over 131,072 tokens): "
      "counted here, not sent |",
      "| Sent at every level | 3,983 requests over 1,022 s (3.90 req/s: the rate each level "
      "compresses or stretches to its own); an infinite cache holds 60.0% of their input tokens |",
      "| Run | Rate (RPS) | Cached tokens (% of prompt) | Lowest-highest over its levels | Share "
      "of the infinite cache's 60.0% |",
      "| phase0 (round_robin) | 2.00 | 75.0% | 75.0-75.0% | 125% |",
      "| phase3 (kv_aware) | 3.00 | 75.0% | 75.0-75.0% | 125% |",
      "| Prompts per Rate | the trace's 3983 requests that fit the workers' context, every level "
      "(`--num-prompts` does not apply) |",
      "| Arrival Distribution | the trace's own arrival times, scaled to each rate |",
  };
  for (size_t i = 0; i < KVR_ARRAY_SIZE(rows); i++)
    if (strstr(md.data, rows[i]) == NULL)
      fail_msg("missing row: %s\n%s", rows[i], tr);
  check_html_tables(res);
  /* Each level's JSON: the trace's figures and the level's own cached share. */
  kvr_buf_t js = KVR_BUF_INIT;
  kvr_report_level_json(res, &res->runs[1], res->runs[1].levels[0], &js);
  cJSON *j = cJSON_Parse(js.data);
  const cJSON *o = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "kvrouter"), "trace");
  assert_true(cJSON_IsObject(o));
  assert_string_equal(cJSON_GetObjectItem(o, "file")->valuestring, "mooncake.jsonl");
  assert_int_equal(cJSON_GetObjectItem(o, "over_context")->valuedouble, 10);
  assert_true(fabs(cJSON_GetObjectItem(o, "infinite_cache_block_share")->valuedouble -
                   77952.0 / 121877) < 1e-12);
  assert_true(fabs(cJSON_GetObjectItem(o, "cached_token_share")->valuedouble - 0.75) < 1e-12);
  assert_string_equal(
      cJSON_GetObjectItem(cJSON_GetObjectItem(j, "kvrouter"), "rate_meaning")->valuestring,
      "trace requests per second (its arrivals, scaled)");
  cJSON_Delete(j);
  /* Another workload: no section, "trace": null. */
  free(res->trace);
  res->trace = NULL;
  kvr_buf_reset(&md);
  kvr_report_markdown(res, &md);
  assert_null(strstr(md.data, "## Trace"));
  kvr_buf_reset(&js);
  kvr_report_level_json(res, &res->runs[1], res->runs[1].levels[0], &js);
  j = cJSON_Parse(js.data);
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "kvrouter"), "trace")));
  cJSON_Delete(j);
  kvr_buf_free(&js);
  kvr_buf_free(&md);
  kvr_stats_results_free(res);
}

KVR_TEST_MAIN(cmocka_unit_test(test_markdown_structure), cmocka_unit_test(test_no_improvement),
              cmocka_unit_test(test_html_charts), cmocka_unit_test(test_level_json_and_jsonl),
              cmocka_unit_test(test_vllm_keys), cmocka_unit_test(test_level_json_threads),
              cmocka_unit_test(test_write_files), cmocka_unit_test(test_engine_figures_and_reset),
              cmocka_unit_test(test_html_has_every_table), cmocka_unit_test(test_reset_verdicts),
              cmocka_unit_test(test_capacity_not_found),
              cmocka_unit_test(test_capacity_bounds_as_data),
              cmocka_unit_test(test_schedule_verdicts),
              cmocka_unit_test(test_balance_and_workload_rows),
              cmocka_unit_test(test_interrupted_failure_bounds_nothing),
              cmocka_unit_test(test_baseline_passes_nowhere),
              cmocka_unit_test(test_steady_state_level), cmocka_unit_test(test_shell_join),
              cmocka_unit_test(test_virtual_mark), cmocka_unit_test(test_summary_paragraph),
              cmocka_unit_test(test_html_legends_and_markup), cmocka_unit_test(test_chart_axes_fit),
              cmocka_unit_test(test_trace_section))

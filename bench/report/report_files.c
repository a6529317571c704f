/* report_files.c -- writes the report's files: DIR/report.md, DIR/report.html, DIR/requests.jsonl
 * and DIR/results/<label>_<load>.json, creating the folders as needed; with vllm's --save-result
 * or --append-result, each level's JSON also where `vllm bench serve` puts it (write_vllm).
 *
 * The only module of the report that touches the file system; every renderer it calls is a pure
 * function of the results. The first error stops the writing and is returned with its path.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kvr_report_mkdir_p(const char *dir, char *err, size_t errlen) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s", dir);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
      return KVR_EIO;
    }
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
    return KVR_EIO;
  }
  return 0;
}

int kvr_report_write_file(const char *path, const kvr_buf_t *b, char *err, size_t errlen) {
  FILE *f = fopen(path, "wb");
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return KVR_EIO;
  }
  size_t w = b->len ? fwrite(b->data, 1, b->len, f) : 0;
  int rc = fclose(f);
  if (w != b->len || rc != 0) {
    snprintf(err, errlen, "%s: write failed", path);
    return KVR_EIO;
  }
  return 0;
}

/* A label made safe for a file name. */
static void safe_name(const char *s, char *out, size_t size) {
  size_t i = 0;
  for (; *s && i + 1 < size; s++)
    out[i++] = (char)((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
                              (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'
                          ? *s
                          : '_');
  out[i] = '\0';
}

/* Writes level lv's JSON as vllm's --save-result does: to --result-dir (default: the current
 * folder), named --result-filename or as vllm names it (kvr__vllm_result_name). A file this call
 * already wrote, or any with --append-result, gets the document appended after a newline, vllm's
 * --append-result form; otherwise it is replaced. written[0..*nwritten) are the paths so far. */
static int write_vllm(const kvr_results_t *res, const kvr_run_t *run, const kvr_level_t *lv,
                      char **written, size_t *nwritten, char *err, size_t errlen) {
  const kvr_result_opts_t *ro = &lv->result;
  char name[1024], path[4096];
  if (ro->result_dir != NULL && kvr_report_mkdir_p(ro->result_dir, err, errlen) != 0)
    return KVR_EIO;
  if (ro->result_filename != NULL)
    snprintf(name, sizeof(name), "%s", ro->result_filename);
  else
    kvr__vllm_result_name(res, run, lv, name, sizeof(name));
  if (ro->result_dir != NULL)
    snprintf(path, sizeof(path), "%s/%s", ro->result_dir, name);
  else
    snprintf(path, sizeof(path), "%s", name);
  bool again = false;
  for (size_t i = 0; i < *nwritten && !again; i++)
    again = strcmp(written[i], path) == 0;
  if (!again)
    written[(*nwritten)++] = kvr_xstrdup(path);
  FILE *f = fopen(path, again || ro->append_result ? "a" : "w");
  if (f == NULL) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return KVR_EIO;
  }
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_level_json(res, run, lv, &b);
  size_t len = b.len > 0 && b.data[b.len - 1] == '\n' ? b.len - 1 : b.len; /* as json.dump */
  bool sep = ftell(f) > 0;
  bool ok = (!sep || fputc('\n', f) != EOF) && fwrite(b.data, 1, len, f) == len;
  kvr_buf_free(&b);
  if (fclose(f) != 0 || !ok) {
    snprintf(err, errlen, "%s: write failed", path);
    return KVR_EIO;
  }
  return 0;
}

/* Every level that asked for vllm's file (--save-result, --append-result). */
static int write_vllm_files(const kvr_results_t *res, char *err, size_t errlen) {
  size_t nlevels = 0, nwritten = 0;
  for (size_t r = 0; r < res->nruns; r++)
    nlevels += res->runs[r].nlevels;
  char **written = kvr_xcalloc(nlevels ? nlevels : 1, sizeof(char *));
  int rc = 0;
  for (size_t r = 0; rc == 0 && r < res->nruns; r++)
    for (size_t i = 0; rc == 0 && i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      if (lv->result.save_result || lv->result.append_result)
        rc = write_vllm(res, &res->runs[r], lv, written, &nwritten, err, errlen);
    }
  for (size_t i = 0; i < nwritten; i++)
    free(written[i]);
  free(written);
  return rc;
}

int kvr_report_write(const kvr_results_t *res, const char *dir, char *err, size_t errlen) {
  char path[4096];
  int rc = kvr_report_mkdir_p(dir, err, errlen);
  if (rc != 0)
    return rc;
  snprintf(path, sizeof(path), "%s/results", dir);
  if ((rc = kvr_report_mkdir_p(path, err, errlen)) != 0)
    return rc;
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_report_markdown(res, &b);
  snprintf(path, sizeof(path), "%s/report.md", dir);
  rc = kvr_report_write_file(path, &b, err, errlen);
  kvr_buf_reset(&b);
  if (rc == 0) {
    kvr_report_html(res, &b);
    snprintf(path, sizeof(path), "%s/report.html", dir);
    rc = kvr_report_write_file(path, &b, err, errlen);
    kvr_buf_reset(&b);
  }
  for (size_t r = 0; rc == 0 && r < res->nruns; r++)
    for (size_t i = 0; i < res->runs[r].nlevels; i++)
      kvr_report_jsonl(&res->runs[r], res->runs[r].levels[i], &b);
  if (rc == 0) {
    snprintf(path, sizeof(path), "%s/requests.jsonl", dir);
    rc = kvr_report_write_file(path, &b, err, errlen);
  }
  for (size_t r = 0; rc == 0 && r < res->nruns; r++) {
    for (size_t i = 0; rc == 0 && i < res->runs[r].nlevels; i++) {
      const kvr_level_t *lv = res->runs[r].levels[i];
      char label[128], load[32];
      safe_name(res->runs[r].label, label, sizeof(label));
      kvr__fmt_load(res, kvr__load_of(lv), load, sizeof(load));
      kvr_buf_reset(&b);
      kvr_report_level_json(res, &res->runs[r], lv, &b);
      snprintf(path, sizeof(path), "%s/results/%s_%s%s.json", dir, label,
               lv->concurrency ? "c" : "rate", load);
      rc = kvr_report_write_file(path, &b, err, errlen);
    }
  }
  kvr_buf_free(&b);
  if (rc == 0)
    rc = write_vllm_files(res, err, errlen);
  return rc;
}

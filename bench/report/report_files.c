/* report_files.c -- writes the report's files: DIR/report.md, DIR/report.html, DIR/requests.jsonl
 * and DIR/results/<label>_<load>.json, creating the folders as needed.
 *
 * The only module of the report that touches the file system; every renderer it calls is a pure
 * function of the results. The first error stops the writing and is returned with its path.
 */
#include "report.h"
#include "report_int.h"

#include "base/kvr.h"

#include <errno.h>
#include <stdio.h>
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
  return rc;
}

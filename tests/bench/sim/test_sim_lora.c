/* test_sim_lora.c -- the simulated worker's LoRA adapter table (bench/sim/sim_lora.h): the
 * --lora-modules spellings, loading from a folder's adapter_config.json (ids, ranks, in-place
 * reloads, base model names, vLLM's errors), unloading, and vllm:lora_requests_info's series. */
#include "base/buf.h"
#include "base/kvr.h"
#include "bench/sim/sim_lora.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/test_util.h"

static void test_module_parse(void **state) {
  (void)state;
  kvr_sim_lora_module_t m;
  char err[256];
  assert_int_equal(kvr_sim_lora_module_parse("sql=/a/sql", &m, err, sizeof(err)), 0);
  assert_string_equal(m.name, "sql");
  assert_string_equal(m.path, "/a/sql");
  assert_null(m.base_model_name);
  kvr_sim_lora_module_free(&m);
  assert_int_equal(kvr_sim_lora_module_parse(
                       "{\"name\":\"fr\",\"path\":\"/a/fr\",\"base_model_name\":\"llama\"}", &m,
                       err, sizeof(err)),
                   0);
  assert_string_equal(m.name, "fr");
  assert_string_equal(m.path, "/a/fr");
  assert_string_equal(m.base_model_name, "llama");
  kvr_sim_lora_module_free(&m);
  /* an item with '=' and ',' is JSON (LoRAParserAction's rule) */
  assert_int_equal(kvr_sim_lora_module_parse("a=b,c", &m, err, sizeof(err)), KVR_EINVAL);
  assert_non_null(strstr(err, "Invalid JSON format for --lora-modules: a=b,c"));
  static const char *const bad[] = {"{\"name\":\"x\"}",
                                    "{\"name\":\"x\",\"path\":3}",
                                    "{\"name\":\"x\",\"path\":\"p\",\"rank\":8}",
                                    "[1]",
                                    "=p",
                                    "n=",
                                    "a=b=c"};
  for (size_t i = 0; i < KVR_ARRAY_SIZE(bad); i++) {
    if (kvr_sim_lora_module_parse(bad[i], &m, err, sizeof(err)) != KVR_EINVAL)
      fail_msg("%s was accepted", bad[i]);
  }
  assert_true(kvr_sim_lora_rank_allowed(16) && kvr_sim_lora_rank_allowed(320));
  assert_false(kvr_sim_lora_rank_allowed(0) || kvr_sim_lora_rank_allowed(17));
}

/* A folder dir/name holding adapter_config.json with "r": rank (rank < 0: no config file). */
static void make_adapter(const char *dir, const char *name, int rank) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  mkdir(path, 0700);
  if (rank < 0)
    return;
  snprintf(path, sizeof(path), "%s/%s/adapter_config.json", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "{\"r\": %d, \"lora_alpha\": 16, \"peft_type\": \"LORA\"}", rank);
  fclose(f);
}

static void remove_adapter(const char *dir, const char *name) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s/adapter_config.json", dir, name);
  unlink(path);
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  rmdir(path);
}

static void test_load_unload(void **state) {
  (void)state;
  char dir[] = "/tmp/test_sim_lora.XXXXXX";
  assert_non_null(mkdtemp(dir));
  make_adapter(dir, "a", 8);
  make_adapter(dir, "b", 64);
  make_adapter(dir, "empty", -1);
  char pa[512], pb[512], pe[512], pm[512];
  snprintf(pa, sizeof(pa), "%s/a", dir);
  snprintf(pb, sizeof(pb), "%s/b", dir);
  snprintf(pe, sizeof(pe), "%s/empty", dir);
  snprintf(pm, sizeof(pm), "%s/missing", dir);
  static const char *const bases[] = {"llama", "chat"};
  kvr_sim_loras_t t;
  kvr_sim_loras_init(&t, 16);
  kvr_sim_lora_t *l;
  kvr_sim_err_t e;
  assert_int_equal(kvr_sim_loras_load(&t, "a", pa, "chat", false, bases, 2, &l, &e), 0);
  assert_int_equal(l->id, 1);
  assert_int_equal(l->rank, 8);
  assert_string_equal(l->base, "chat");
  assert_int_equal(kvr_sim_loras_load(&t, "a2", pa, "nope", false, bases, 2, &l, &e), 0);
  assert_int_equal(l->id, 2);
  assert_null(l->base); /* not a served name: the parent is the first served name */
  assert_int_equal(t.n, 2);
  assert_string_equal(t.names[0], "a");
  assert_string_equal(t.names[1], "a2");
  /* vLLM's errors, each leaving the table as it was */
  assert_int_equal(kvr_sim_loras_load(&t, "a", pa, NULL, false, bases, 2, &l, &e), 400);
  assert_string_equal(e.type, "InvalidUserInput");
  assert_non_null(strstr(e.message, "has already been loaded"));
  assert_int_equal(kvr_sim_loras_load(&t, "", pa, NULL, false, bases, 2, &l, &e), 400);
  assert_string_equal(e.message, "Both 'lora_name' and 'lora_path' must be provided.");
  assert_int_equal(kvr_sim_loras_load(&t, "m", pm, NULL, false, bases, 2, &l, &e), 404);
  assert_string_equal(e.type, "NotFoundError");
  char want[700];
  snprintf(want, sizeof(want), "Loading lora m failed: No adapter found for %s", pm);
  assert_string_equal(e.message, want);
  assert_int_equal(kvr_sim_loras_load(&t, "e", pe, NULL, false, bases, 2, &l, &e), 404);
  assert_int_equal(kvr_sim_loras_load(&t, "b", pb, NULL, false, bases, 2, &l, &e), 500);
  assert_string_equal(e.message, "LoRA rank 64 is greater than max_lora_rank 16.");
  assert_int_equal(t.n, 2);
  /* in place: the same id, the new path and rank */
  make_adapter(dir, "a16", 16);
  char pa16[512];
  snprintf(pa16, sizeof(pa16), "%s/a16", dir);
  assert_int_equal(kvr_sim_loras_load(&t, "a", pa16, NULL, true, bases, 2, &l, &e), 0);
  assert_int_equal(l->id, 1);
  assert_int_equal(l->rank, 16);
  assert_string_equal(l->path, pa16);
  /* unload */
  uint32_t id = 0;
  assert_int_equal(kvr_sim_loras_unload(&t, "a", &id, &e), 0);
  assert_int_equal(id, 1);
  assert_int_equal(t.n, 1);
  assert_string_equal(t.names[0], "a2");
  assert_int_equal(kvr_sim_loras_unload(&t, "a", &id, &e), 404);
  assert_string_equal(e.message, "The lora adapter 'a' cannot be found.");
  assert_int_equal(kvr_sim_loras_unload(&t, "", &id, &e), 400);
  /* a new adapter takes the next id, never a freed one (lora_id_counter) */
  assert_int_equal(kvr_sim_loras_load(&t, "c", pa, NULL, false, bases, 2, &l, &e), 0);
  assert_int_equal(l->id, 3);
  kvr_sim_loras_free(&t);
  remove_adapter(dir, "a");
  remove_adapter(dir, "b");
  remove_adapter(dir, "a16");
  remove_adapter(dir, "empty");
  assert_int_equal(rmdir(dir), 0);
}

/* Each label combination is a series keeping its last value; the family is there without any. */
static void test_info_series(void **state) {
  (void)state;
  kvr_sim_loras_t t;
  kvr_sim_loras_init(&t, 16);
  kvr_buf_t b = KVR_BUF_INIT;
  kvr_sim_loras_info_write(&b, &t);
  assert_string_equal(b.data, "# HELP vllm:lora_requests_info Running stats on lora requests.\n"
                              "# TYPE vllm:lora_requests_info gauge\n");
  kvr_sim_loras_info_set(&t, 2, "", "sql", 1795940000.25);
  kvr_sim_loras_info_set(&t, 2, "fr", "sql", 1795940001.5);
  kvr_sim_loras_info_set(&t, 2, "", "sql", 1795940002.75);
  kvr_buf_reset(&b);
  kvr_sim_loras_info_write(&b, &t);
  assert_non_null(strstr(b.data,
                         "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\","
                         "running_lora_adapters=\"sql\"} 1795940002.75\n"));
  assert_non_null(strstr(b.data, "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters="
                                 "\"fr\",running_lora_adapters=\"sql\"} 1795940001.5\n"));
  assert_int_equal(t.nseries, 2);
  /* the newest 1,024 are kept: the one updated longest ago goes */
  for (int i = 0; i < 1100; i++) {
    char name[16];
    snprintf(name, sizeof(name), "x%d", i);
    kvr_sim_loras_info_set(&t, 2, name, "", 1795950000.0 + i);
  }
  assert_int_equal(t.nseries, 1024);
  kvr_buf_reset(&b);
  kvr_sim_loras_info_write(&b, &t);
  assert_null(strstr(b.data, "running_lora_adapters=\"sql\""));
  assert_non_null(strstr(b.data, "waiting_lora_adapters=\"x1099\""));
  kvr_buf_free(&b);
  kvr_sim_loras_free(&t);
}

KVR_TEST_MAIN(cmocka_unit_test(test_module_parse), cmocka_unit_test(test_load_unload),
              cmocka_unit_test(test_info_series))

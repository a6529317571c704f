/* test_http_route.c -- the route table (src/http_route.c): exact and prefix matches, table order,
 * 404 against 405, the Allow list (HEAD implied by GET), pass-through routes. */
#include "src/http_route.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tests/test_util.h"

static void h_a(kvr_http_req_t *req, void *data, const char *tail) {}
static void h_b(kvr_http_req_t *req, void *data, const char *tail) {}

static const kvr_http_route_t table[] = {
    {"/health", KVR_HTTP_M(GET), h_a},
    {"/admin/workers", KVR_HTTP_M(GET), h_a},
    {"/admin/workers", KVR_HTTP_M(POST), h_b},
    {"/admin/workers/*", KVR_HTTP_M(DELETE), h_b},
    {"/v1/chat/completions", KVR_HTTP_M(POST), h_a},
    {"/v1/*", KVR_HTTP_M_ANY, h_b},
};
#define N (sizeof table / sizeof table[0])

static const kvr_http_route_t *find(const char *path, int method, const char **tail, int *status,
                                    char *allow) {
  return kvr_http_route_find(table, N, path, method, tail, status, allow, 128);
}

static void test_exact_and_head(void **state) {
  const char *tail;
  int st;
  char allow[128];
  assert_ptr_equal(find("/health", HTTP_GET, &tail, &st, allow), &table[0]);
  assert_int_equal(st, 0);
  assert_string_equal(tail, "");
  assert_ptr_equal(find("/health", HTTP_HEAD, &tail, &st, allow), &table[0]);
  assert_ptr_equal(find("/admin/workers", HTTP_POST, &tail, &st, allow), &table[2]);
}

static void test_405_lists_every_method_on_the_path(void **state) {
  const char *tail;
  int st;
  char allow[128];
  assert_null(find("/admin/workers", HTTP_PUT, &tail, &st, allow));
  assert_int_equal(st, 405);
  assert_string_equal(allow, "GET, HEAD, POST");
  assert_null(find("/health", HTTP_POST, &tail, &st, allow));
  assert_int_equal(st, 405);
  assert_string_equal(allow, "GET, HEAD");
}

static void test_404_and_prefix_tail(void **state) {
  const char *tail;
  int st;
  char allow[128];
  assert_null(find("/nope", HTTP_GET, &tail, &st, allow));
  assert_int_equal(st, 404);
  assert_ptr_equal(find("/admin/workers/3", HTTP_DELETE, &tail, &st, allow), &table[3]);
  assert_string_equal(tail, "3");
  assert_null(find("/admin/workers/3", HTTP_GET, &tail, &st, allow));
  assert_int_equal(st, 405);
  assert_string_equal(allow, "DELETE");
}

static void test_order_gives_precedence_and_any_passes(void **state) {
  const char *tail;
  int st;
  char allow[128];
  /* An exact route decides its path: GET on it is a 405 although the pass-through /v1/ * would
   * accept GET; other /v1/ paths pass through with any method. */
  assert_ptr_equal(find("/v1/chat/completions", HTTP_POST, &tail, &st, allow), &table[4]);
  assert_null(find("/v1/chat/completions", HTTP_GET, &tail, &st, allow));
  assert_int_equal(st, 405);
  assert_string_equal(allow, "POST");
  assert_ptr_equal(find("/v1/embeddings", HTTP_PATCH, &tail, &st, allow), &table[5]);
  assert_string_equal(tail, "embeddings");
}

static void test_allow_truncates_safely(void **state) {
  const char *tail;
  int st;
  char small[8];
  assert_null(
      kvr_http_route_find(table, N, "/admin/workers", HTTP_PUT, &tail, &st, small, sizeof small));
  assert_int_equal(st, 405);
  assert_true(strlen(small) < sizeof small);
}

KVR_TEST_MAIN(cmocka_unit_test(test_exact_and_head),
              cmocka_unit_test(test_405_lists_every_method_on_the_path),
              cmocka_unit_test(test_404_and_prefix_tail),
              cmocka_unit_test(test_order_gives_precedence_and_any_passes),
              cmocka_unit_test(test_allow_truncates_safely))

/* test_http_route.c -- the route table (src/net/http_route.c): exact and prefix matches, table
 * order, 404 against 405, the Allow list (HEAD implied by GET), pass-through routes. */
#include "net/http_route.h"

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

/* path and method reach table[i] with status 0; tail, unless NULL, is what the route saw. */
static void routed(const char *path, int method, size_t i, const char *tail) {
  const char *t;
  int st;
  char allow[128];
  assert_ptr_equal(find(path, method, &t, &st, allow), &table[i]);
  assert_int_equal(st, 0);
  if (tail)
    assert_string_equal(t, tail);
}

/* No route for path and method: status is 404 (allow NULL), or 405 with exactly allow. */
static void refused(const char *path, int method, int status, const char *allow) {
  const char *tail;
  int st;
  char got[128];
  assert_null(find(path, method, &tail, &st, got));
  assert_int_equal(st, status);
  if (allow)
    assert_string_equal(got, allow);
}

static void test_exact_and_head(void **state) {
  routed("/health", HTTP_GET, 0, "");
  routed("/health", HTTP_HEAD, 0, NULL);
  routed("/admin/workers", HTTP_POST, 2, NULL);
}

static void test_405_lists_every_method_on_the_path(void **state) {
  refused("/admin/workers", HTTP_PUT, 405, "GET, HEAD, POST");
  refused("/health", HTTP_POST, 405, "GET, HEAD");
}

static void test_404_and_prefix_tail(void **state) {
  refused("/nope", HTTP_GET, 404, NULL);
  routed("/admin/workers/3", HTTP_DELETE, 3, "3");
  refused("/admin/workers/3", HTTP_GET, 405, "DELETE");
}

static void test_order_gives_precedence_and_any_passes(void **state) {
  /* An exact route decides its path: GET on it is a 405 although the pass-through /v1/ * would
   * accept GET; other /v1/ paths pass through with any method. */
  routed("/v1/chat/completions", HTTP_POST, 4, NULL);
  refused("/v1/chat/completions", HTTP_GET, 405, "POST");
  routed("/v1/embeddings", HTTP_PATCH, 5, "embeddings");
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

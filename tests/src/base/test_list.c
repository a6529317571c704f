/* test_list.c -- the intrusive list (src/base/list.h): order, removal during iteration,
 * self-linking. */
#include "base/kvr.h"
#include "base/list.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tests/test_util.h"

typedef struct item_s {
  int value;
  kvr_list_t node;
} item_t;

static int values(kvr_list_t *head, int *out, int max) {
  int n = 0;
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, head) {
    if (n < max)
      out[n] = KVR_CONTAINER_OF(q, item_t, node)->value;
    n++;
  }
  return n;
}

static void test_insert_order_and_count(void **state) {
  kvr_list_t head;
  kvr_list_init(&head);
  assert_true(kvr_list_empty(&head));
  item_t it[3] = {{1, {0}}, {2, {0}}, {3, {0}}};
  kvr_list_insert_tail(&head, &it[1].node);
  kvr_list_insert_head(&head, &it[0].node);
  kvr_list_insert_tail(&head, &it[2].node);
  int v[4];
  assert_int_equal(values(&head, v, 4), 3);
  assert_int_equal(v[0], 1);
  assert_int_equal(v[1], 2);
  assert_int_equal(v[2], 3);
  assert_int_equal(kvr_list_count(&head), 3);
  assert_false(kvr_list_empty(&head));
}

static void test_remove_self_links_and_is_idempotent(void **state) {
  kvr_list_t head;
  kvr_list_init(&head);
  item_t a = {1, {0}}, b = {2, {0}};
  kvr_list_insert_tail(&head, &a.node);
  kvr_list_insert_tail(&head, &b.node);
  assert_true(kvr_list_linked(&a.node));
  kvr_list_remove(&a.node);
  assert_false(kvr_list_linked(&a.node));
  kvr_list_remove(&a.node); /* harmless a second time */
  int v[2];
  assert_int_equal(values(&head, v, 2), 1);
  assert_int_equal(v[0], 2);
  kvr_list_remove(&b.node);
  assert_true(kvr_list_empty(&head));
}

static void test_foreach_safe_frees_current(void **state) {
  kvr_list_t head;
  kvr_list_init(&head);
  for (int i = 0; i < 5; i++) {
    item_t *it = kvr_xmalloc(sizeof *it);
    it->value = i;
    kvr_list_insert_tail(&head, &it->node);
  }
  int sum = 0;
  kvr_list_t *q, *tmp;
  KVR_LIST_FOREACH_SAFE(q, tmp, &head) {
    item_t *it = KVR_CONTAINER_OF(q, item_t, node);
    sum += it->value;
    kvr_list_remove(q);
    free(it);
  }
  assert_int_equal(sum, 0 + 1 + 2 + 3 + 4);
  assert_true(kvr_list_empty(&head));
}

static void test_allocators(void **state) {
  char *s = kvr_xstrdup("abc");
  assert_string_equal(s, "abc");
  s = kvr_xrealloc(s, 64);
  assert_string_equal(s, "abc");
  free(s);
  assert_null(kvr_xstrdup(NULL));
  int *z = kvr_xcalloc(16, sizeof *z);
  for (int i = 0; i < 16; i++)
    assert_int_equal(z[i], 0);
  free(z);
  free(kvr_xmalloc(0)); /* a zero-size request still gives a pointer to free */
}

KVR_TEST_MAIN(cmocka_unit_test(test_insert_order_and_count),
              cmocka_unit_test(test_remove_self_links_and_is_idempotent),
              cmocka_unit_test(test_foreach_safe_frees_current), cmocka_unit_test(test_allocators))

/* test_util.h -- what the cmocka unit tests do alike, written once: macros and static inline
 * functions only (each unit test is its own executable linking only its own library, so nothing
 * here is linked twice). Include after <cmocka.h>. */
#ifndef KVR_TESTS_TEST_UTIL_H
#define KVR_TESTS_TEST_UTIL_H

/* main(): runs the given cmocka_unit_test(...) entries as one group, without setup or teardown. */
#define KVR_TEST_MAIN(...)                                                                         \
  int main(void) {                                                                                 \
    const struct CMUnitTest tests[] = {__VA_ARGS__};                                               \
    return cmocka_run_group_tests(tests, NULL, NULL);                                              \
  }

#endif

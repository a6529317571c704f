/* policy_test.h -- what the policy unit tests do alike, written once (static inline: each test is
 * its own executable): make a policy from its JSON parameters, failing the test when it cannot,
 * and check that parameters are refused with the policy's own message. Include after <cmocka.h>. */
#ifndef KVR_TESTS_POLICIES_POLICY_TEST_H
#define KVR_TESTS_POLICIES_POLICY_TEST_H

#include <string.h>

#include "policies/policy.h"

/* Policy name with params (JSON text, NULL: the defaults) and seed; fails the test if refused. */
static inline kvr_policy_t *kvr_test_policy_make(const char *name, const char *params,
                                                 uint64_t seed) {
  char err[256] = "";
  cJSON *j = params ? cJSON_Parse(params) : NULL;
  kvr_policy_t *p = kvr_policy_create(name, j, seed, err, sizeof(err));
  cJSON_Delete(j);
  if (p == NULL)
    fail_msg("create %s %s: %s", name, params ? params : "{}", err);
  return p;
}

/* Policy name refuses params (valid JSON text) with exactly the message want. */
static inline void kvr_test_policy_refuses(const char *name, const char *params, const char *want) {
  cJSON *j = cJSON_Parse(params);
  assert_non_null(j);
  char err[512] = "";
  kvr_policy_t *q = kvr_policy_create(name, j, 1, err, sizeof(err));
  cJSON_Delete(j);
  if (q != NULL) {
    kvr_policy_destroy(q);
    fail_msg("%s: accepted, want '%s'", params, want);
  }
  if (strcmp(err, want) != 0)
    fail_msg("%s: got '%s', want '%s'", params, err, want);
}

#endif

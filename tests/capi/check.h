/* The checks of the C ABI test programs: counters, CHECK macros, and groups
 * of checks printed a line each. Each program includes it once. */
#ifndef KDN_TESTS_CAPI_CHECK_H
#define KDN_TESTS_CAPI_CHECK_H

#include <kdn/kdn.h>

#include <stdio.h>
#include <string.h>


static int g_passed;
static int g_failed;
static const char *g_group;
static int g_group_passed;
static int g_group_failed;

static void check_at(int ok, const char *what, int line) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  printf("  FAILED (line %d): %s\n", line, what);
}

static void check_eq_at(unsigned long long got, unsigned long long want, const char *what, int line) {
  if (got == want) {
    ++g_passed;
    return;
  }
  ++g_failed;
  printf("  FAILED (line %d): %s: got %llu, want %llu\n", line, what, got, want);
}

static void check_status_at(kdn_status got, kdn_status want, const char *what, int line) {
  if (got == want) {
    ++g_passed;
    return;
  }
  ++g_failed;
  printf("  FAILED (line %d): %s returned %s, want %s (message: \"%s\")\n", line, what, kdn_status_str(got),
         kdn_status_str(want), kdn_last_error_message());
}

/* A runtime and model of their own, for the "following successful call"
 * that must clear the last error message after each expected failure. */
static kdn_runtime *g_probe_runtime;
static kdn_model *g_probe_model;

static void check_error_at(kdn_status got, kdn_status want, const char *what, int line) {
  /* Read the message before any other kdn call can replace it. */
  const char *message = kdn_last_error_message();
  const int has_message = message != NULL && message[0] != '\0';
  uint64_t bytes = 0;
  check_status_at(got, want, what, line);
  check_at(has_message, "the failure sets kdn_last_error_message()", line);
  check_at(g_probe_model != NULL && kdn_model_kv_bytes_per_token(g_probe_model, &bytes) == KDN_OK &&
               strcmp(kdn_last_error_message(), "") == 0,
           "a following successful call leaves kdn_last_error_message() empty", line);
}

#define CHECK(cond) check_at((cond) != 0, #cond, __LINE__)
#define CHECK_EQ(got, want) \
  check_eq_at((unsigned long long)(got), (unsigned long long)(want), #got " == " #want, __LINE__)
#define CHECK_OK(call) check_status_at((call), KDN_OK, #call, __LINE__)
#define CHECK_ERROR(want, call) check_error_at((call), (want), #call, __LINE__)

static void group_begin(const char *name) {
  g_group = name;
  g_group_passed = g_passed;
  g_group_failed = g_failed;
}

static void group_end(void) {
  const int failed = g_failed - g_group_failed;
  const int total = g_passed - g_group_passed + failed;
  if (failed == 0) {
    printf("ok    %-50s %3d checks\n", g_group, total);
  } else {
    printf("FAIL  %-50s %3d checks, %d failed\n", g_group, total, failed);
  }
}

#endif /* KDN_TESTS_CAPI_CHECK_H */

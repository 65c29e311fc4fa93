// SPDX-License-Identifier: Apache-2.0
/* The checks of the C ABI test programs: counters, CHECK macros, groups of
 * checks printed a line each, and the case runner (each program is a table
 * of named cases; ctest runs each case in its own process). Each program
 * includes it once, after <kdn/kdn.h> (with KDN_EXPERIMENTAL defined first
 * where it needs that section). */
#ifndef KDN_TESTS_CAPI_CHECK_H
#define KDN_TESTS_CAPI_CHECK_H

#include <kdn/kdn.h>

#include <stdio.h>
#include <stdlib.h>
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
  printf("  FAILED (line %d): %s returned %s (%d), want %s (message: \"%s\")\n", line, what, kdn_status_string(got),
         (int)got, kdn_status_string(want), kdn_last_error_message());
}

/* A runtime and model of their own, for the "following successful call"
 * that must clear the last error message after each expected failure.
 * Created on first use (a program that forks does so before any runtime
 * exists), destroyed by run_cases. */
static kdn_runtime *g_probe_runtime;
static kdn_model *g_probe_model;

static kdn_model *probe_model(void) {
  if (g_probe_model == NULL) {
    kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
    spec.num_layers = 1;
    spec.num_kv_heads = 1;
    spec.head_dim = 8;
    spec.fingerprint = "probe";
    spec.fingerprint_len = 5;
    if (g_probe_runtime == NULL && kdn_runtime_create(NULL, &g_probe_runtime) != KDN_OK) return NULL;
    if (kdn_model_create(g_probe_runtime, &spec, &g_probe_model) != KDN_OK) return NULL;
  }
  return g_probe_model;
}

static void probe_destroy(void) {
  kdn_model_destroy(g_probe_model);
  kdn_runtime_destroy(g_probe_runtime);
  g_probe_model = NULL;
  g_probe_runtime = NULL;
}

/* The call failed with `want`, said why, and the next successful call on
 * this thread clears the message. */
static void check_error_at(kdn_status got, kdn_status want, const char *what, int line) {
  /* Read the message before any other kdn call can replace it. */
  const char *message = kdn_last_error_message();
  const int has_message = message != NULL && message[0] != '\0';
  uint64_t bytes = 0;
  kdn_model *probe;
  check_status_at(got, want, what, line);
  check_at(has_message, "the failure sets kdn_last_error_message()", line);
  probe = probe_model();
  check_at(probe != NULL && kdn_model_get_kv_bytes_per_token(probe, &bytes) == KDN_OK &&
               strcmp(kdn_last_error_message(), "") == 0,
           "a following successful call leaves kdn_last_error_message() empty", line);
}

/* As check_error_at, and the message names `name` (a struct, a codec). */
static void check_error_naming_at(kdn_status got, kdn_status want, const char *name, const char *what, int line) {
  const char *message = kdn_last_error_message();
  const int names = message != NULL && strstr(message, name) != NULL;
  if (got == want && !names) printf("  (line %d) the message \"%s\" does not name %s\n", line, message, name);
  check_at(got != want || names, "the message names the struct", line);
  check_error_at(got, want, what, line);
}

#define CHECK(cond) check_at((cond) != 0, #cond, __LINE__)
#define CHECK_EQ(got, want) \
  check_eq_at((unsigned long long)(got), (unsigned long long)(want), #got " == " #want, __LINE__)
#define CHECK_OK(call) check_status_at((call), KDN_OK, #call, __LINE__)
#define CHECK_ERROR(want, call) check_error_at((call), (want), #call, __LINE__)
#define CHECK_ERROR_NAMING(want, name, call) check_error_naming_at((call), (want), (name), #call, __LINE__)

static void group_begin(const char *name) {
  g_group = name;
  g_group_passed = g_passed;
  g_group_failed = g_failed;
}

static void group_end(void) {
  const int failed = g_failed - g_group_failed;
  const int total = g_passed - g_group_passed + failed;
  if (failed == 0) {
    printf("ok    %-60s %3d checks\n", g_group, total);
  } else {
    printf("FAIL  %-60s %3d checks, %d failed\n", g_group, total, failed);
  }
}

/* ---- Cases ------------------------------------------------------------------
 * A program is a table of cases, one `CASE(name),` line each (CMake reads
 * those lines to register one ctest test per case: keep them one a line):
 *   prog <case>           runs one case (what ctest does)
 *   prog                  runs every case in order, in this process (for humans)
 *   prog --list           prints the case names, one a line
 *   prog --check-list N.. exits 0 when N.. are exactly the cases, in order
 * Exit status: 0 passed, 1 a check failed, 2 an unknown case or usage,
 * 77 skipped (the reference model is missing). */

typedef struct test_case {
  const char *name;
  void (*run)(void);
} test_case;
#define CASE(name) { #name, test_##name }

typedef struct test_program {
  const test_case *cases;
  size_t num_cases;
  int (*setup)(void);           /* once, before the first case: 0 ok, 1 fail, 77 skip; may be NULL */
  void (*after_case)(void);     /* after each case: release what it left; may be NULL */
  void (*teardown)(void);       /* once, at the end; may be NULL */
} test_program;

static int run_one(const test_program *p, const test_case *c) {
  const int failed_before = g_failed;
  const int passed_before = g_passed;
  printf("---- case %s\n", c->name);
  c->run();
  if (p->after_case != NULL) p->after_case();
  if (g_failed != failed_before) {
    printf("---- case %s: FAILED (%d of %d checks)\n", c->name, g_failed - failed_before,
           g_failed - failed_before + g_passed - passed_before);
    return 1;
  }
  if (g_passed == passed_before) {
    printf("---- case %s: FAILED (it checked nothing)\n", c->name);
    return 1;
  }
  printf("---- case %s: ok (%d checks)\n", c->name, g_passed - passed_before);
  return 0;
}

static int run_cases(const test_program *p, int argc, char **argv) {
  size_t i;
  int status = 0;
  const test_case *only = NULL;
  setvbuf(stdout, NULL, _IOLBF, 0); /* every line out, even before a crash */
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (i = 0; i < p->num_cases; ++i) printf("%s\n", p->cases[i].name);
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "--check-list") == 0) {
    int same = (size_t)(argc - 2) == p->num_cases;
    for (i = 0; same && i < p->num_cases; ++i) same = strcmp(argv[2 + i], p->cases[i].name) == 0;
    if (!same) {
      printf("the registered tests and the program's cases differ.\nregistered:");
      for (i = 2; i < (size_t)argc; ++i) printf(" %s", argv[i]);
      printf("\nprogram:   ");
      for (i = 0; i < p->num_cases; ++i) printf(" %s", p->cases[i].name);
      printf("\n(keep each CASE(name), on a line of its own, and reconfigure)\n");
      return 1;
    }
    printf("%lu cases, registered as they are\n", (unsigned long)p->num_cases);
    return 0;
  }
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    printf("usage: %s [case | --list | --check-list names...]\n", argv[0]);
    return 2;
  }
  if (argc == 2) {
    for (i = 0; i < p->num_cases && only == NULL; ++i) {
      if (strcmp(argv[1], p->cases[i].name) == 0) only = &p->cases[i];
    }
    if (only == NULL) {
      printf("unknown case \"%s\"; the cases are:\n", argv[1]);
      for (i = 0; i < p->num_cases; ++i) printf("  %s\n", p->cases[i].name);
      return 2;
    }
  }
  if (p->setup != NULL) {
    const int s = p->setup();
    if (s != 0) return s;
  }
  if (only != NULL) {
    status = run_one(p, only);
  } else {
    for (i = 0; i < p->num_cases; ++i) status |= run_one(p, &p->cases[i]);
  }
  probe_destroy();
  if (p->teardown != NULL) p->teardown();
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return status == 0 && g_failed == 0 ? 0 : 1;
}

#endif /* KDN_TESTS_CAPI_CHECK_H */

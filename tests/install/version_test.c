// SPDX-License-Identifier: Apache-2.0
/* install.version: the version macros of <kdn/kdn.h>, kdn_version() and
 * kdn_version_number() agree with each other and with the CMake project
 * version (KDN_PROJECT_VERSION, "MAJOR.MINOR.PATCH", given by the build). */
#include <stdio.h>
#include <string.h>

#include <kdn/kdn.h>

#ifndef KDN_PROJECT_VERSION
#error "compile with -DKDN_PROJECT_VERSION=\"MAJOR.MINOR.PATCH\""
#endif

static int failures = 0;

#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      printf("%s:%d: expected %s\n", __FILE__, __LINE__, #cond);          \
      ++failures;                                                         \
    }                                                                     \
  } while (0)

int main(void) {
  unsigned major = 0, minor = 0, patch = 0;
  char extra = 0;
  char macros[64];
  const char *runtime = kdn_version();

  printf("CMake %s, macros %d.%d.%d (%d), kdn_version() %s, kdn_version_number() %lu\n", KDN_PROJECT_VERSION,
         KDN_VERSION_MAJOR, KDN_VERSION_MINOR, KDN_VERSION_PATCH, KDN_VERSION_NUMBER, runtime == NULL ? "(null)" : runtime,
         (unsigned long)kdn_version_number());
  EXPECT(sscanf(KDN_PROJECT_VERSION, "%u.%u.%u%c", &major, &minor, &patch, &extra) == 3);
  EXPECT(major == KDN_VERSION_MAJOR && minor == KDN_VERSION_MINOR && patch == KDN_VERSION_PATCH);
  snprintf(macros, sizeof macros, "%d.%d.%d", KDN_VERSION_MAJOR, KDN_VERSION_MINOR, KDN_VERSION_PATCH);
  EXPECT(strcmp(macros, KDN_PROJECT_VERSION) == 0);
  EXPECT(KDN_VERSION_NUMBER == major * 10000 + minor * 100 + patch);
  EXPECT(minor < 100 && patch < 100); /* else KDN_VERSION_NUMBER is ambiguous */
  EXPECT(runtime != NULL && strcmp(runtime, KDN_PROJECT_VERSION) == 0);
  EXPECT(kdn_version_number() == KDN_VERSION_NUMBER);
  EXPECT(runtime == kdn_version()); /* static storage */
  return failures == 0 ? 0 : 1;
}

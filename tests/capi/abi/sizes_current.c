// SPDX-License-Identifier: Apache-2.0
/* Today's kdn.h against the frozen 1.0 layout (sizes_v1.c): every 1.0 field
 * is where it was and as wide, every KDN_X_SIZE_V1 and every named value is
 * unchanged, and every struct is at least its 1.0 size (fields are only
 * appended). Prints each difference; exit 0 when there is none. */
#include <kdn/kdn.h>

#include <stdio.h>
#include <string.h>

#include "v1_layout.h"

extern const kdn_field_layout kdn_v1_fields[];
extern const size_t kdn_v1_num_fields;
extern const kdn_struct_layout kdn_v1_structs[];
extern const size_t kdn_v1_num_structs;
extern const kdn_value kdn_v1_values[];
extern const size_t kdn_v1_num_values;

static const kdn_field_layout kFields[] = {KDN_V1_FIELDS(KDN_FIELD_LAYOUT_)};
static const kdn_struct_layout kStructs[] = {KDN_V1_STRUCTS(KDN_STRUCT_LAYOUT_)};
static const kdn_value kValues[] = {KDN_V1_VALUES(KDN_VALUE_)};

int main(void) {
  size_t i;
  int differences = 0;
  if (kdn_v1_num_fields != sizeof kFields / sizeof kFields[0] ||
      kdn_v1_num_structs != sizeof kStructs / sizeof kStructs[0] ||
      kdn_v1_num_values != sizeof kValues / sizeof kValues[0]) {
    printf("FAILED: the two translation units expanded different lists\n");
    return 1;
  }
  for (i = 0; i < kdn_v1_num_fields; ++i) {
    const kdn_field_layout *v1 = &kdn_v1_fields[i], *now = &kFields[i];
    if (v1->offset != now->offset || v1->size != now->size) {
      printf("FAILED: %s.%s: 1.0 has offset %lu size %lu, kdn.h offset %lu size %lu\n", v1->type, v1->field,
             (unsigned long)v1->offset, (unsigned long)v1->size, (unsigned long)now->offset,
             (unsigned long)now->size);
      ++differences;
    }
  }
  for (i = 0; i < kdn_v1_num_structs; ++i) {
    const kdn_struct_layout *v1 = &kdn_v1_structs[i], *now = &kStructs[i];
    if (v1->size_v1 != now->size_v1) {
      printf("FAILED: %s: its _SIZE_V1 was %lu in 1.0, is %lu in kdn.h\n", v1->type, (unsigned long)v1->size_v1,
             (unsigned long)now->size_v1);
      ++differences;
    }
    if (now->size < v1->size || now->size % 8 != 0) {
      printf("FAILED: %s: sizeof %lu in kdn.h, %lu in 1.0 (structs only grow, by multiples of 8)\n", v1->type,
             (unsigned long)now->size, (unsigned long)v1->size);
      ++differences;
    }
  }
  for (i = 0; i < kdn_v1_num_values; ++i) {
    if (kdn_v1_values[i].value != kValues[i].value) {
      printf("FAILED: %s was %lld in 1.0, is %lld in kdn.h\n", kValues[i].name, kdn_v1_values[i].value,
             kValues[i].value);
      ++differences;
    }
  }
  printf("%lu fields, %lu structs, %lu values compared: %d differences\n", (unsigned long)kdn_v1_num_fields,
         (unsigned long)kdn_v1_num_structs, (unsigned long)kdn_v1_num_values, differences);
  return differences == 0 ? 0 : 1;
}

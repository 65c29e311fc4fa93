// SPDX-License-Identifier: Apache-2.0
/* The 1.0 layout, compiled against the frozen kdn_v1.h only (C11): each
 * KDN_X_SIZE_V1 is sizeof(X) there and ends exactly at X's last field (no
 * tail padding), checked at compile time. The tables below are what
 * sizes_current.c compares today's kdn.h with. */
#include "kdn_v1.h"

#include "v1_layout.h"

#if KDN_VERSION_MAJOR != 1 || KDN_VERSION_MINOR != 0
#error "kdn_v1.h is the frozen 1.0 header"
#endif

#define KDN_PIN_SIZE_(type, size_v1, last)                                                         \
  _Static_assert((size_v1) == sizeof(type), #size_v1 " == sizeof(" #type ") in kdn_v1.h");         \
  _Static_assert((size_v1) == offsetof(type, last) + sizeof(((type *)0)->last),                    \
                 #size_v1 " ends at " #type "." #last ": no tail padding");
KDN_V1_STRUCTS(KDN_PIN_SIZE_)

/* The values the issue pinned, written out once more. */
_Static_assert(KDN_TIER_CONFIG_SIZE_V1 == 64 && KDN_RUNTIME_OPTIONS_SIZE_V1 == 48 && KDN_MODEL_SPEC_SIZE_V1 == 48 &&
                   KDN_REQUEST_SIZE_V1 == 48 && KDN_KV_VIEW_SIZE_V1 == 184 && KDN_LOOKUP_RESULT_SIZE_V1 == 88 &&
                   KDN_KV_RESULT_SIZE_V1 == 48 && KDN_DOCUMENT_INFO_SIZE_V1 == 304 && KDN_STATS_SIZE_V1 == 160 &&
                   KDN_LATENCY_SIZE_V1 == 56 && KDN_TIER_STATS_SIZE_V1 == 208,
               "the published 1.0 sizes");
_Static_assert(sizeof(kdn_token_range) == 16, "kdn_token_range is frozen as it is");

const kdn_field_layout kdn_v1_fields[] = {KDN_V1_FIELDS(KDN_FIELD_LAYOUT_)};
const size_t kdn_v1_num_fields = sizeof kdn_v1_fields / sizeof kdn_v1_fields[0];
const kdn_struct_layout kdn_v1_structs[] = {KDN_V1_STRUCTS(KDN_STRUCT_LAYOUT_)};
const size_t kdn_v1_num_structs = sizeof kdn_v1_structs / sizeof kdn_v1_structs[0];
const kdn_value kdn_v1_values[] = {KDN_V1_VALUES(KDN_VALUE_)};
const size_t kdn_v1_num_values = sizeof kdn_v1_values / sizeof kdn_v1_values[0];

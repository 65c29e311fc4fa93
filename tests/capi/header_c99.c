// SPDX-License-Identifier: Apache-2.0
/* The public header as strict C99 (-std=c99 -Wall -Wextra -pedantic -Werror),
 * built twice: as is, and with KDN_EXPERIMENTAL defined. It must be
 * self-contained (the only include); its layout rules hold (struct_size
 * first, filled_size second in outputs, no tail padding, first published
 * sizes no larger than the structs); its _INIT macros are valid
 * initialisers, and each _init() function writes what its macro does. */
#include <kdn/kdn.h>

/* Compile-time checks without C11's _Static_assert. */
#define KDN_HEADER_ASSERT(name, cond) typedef char kdn_header_assert_##name[(cond) ? 1 : -1]

/* Enums are pinned to 32 bits by their _FORCE32_ members; kdn_status is an
 * int32_t. */
KDN_HEADER_ASSERT(status_is_32_bits, sizeof(kdn_status) == 4 && (kdn_status)-1 < 0);
KDN_HEADER_ASSERT(dtype_is_32_bits, sizeof(kdn_dtype) == 4);
KDN_HEADER_ASSERT(memory_is_32_bits, sizeof(kdn_memory_kind) == 4);
KDN_HEADER_ASSERT(rope_is_32_bits, sizeof(kdn_rope_style) == 4);
KDN_HEADER_ASSERT(tier_kind_is_32_bits, sizeof(kdn_tier_kind) == 4);
KDN_HEADER_ASSERT(policy_is_32_bits, sizeof(kdn_eviction_policy) == 4);
KDN_HEADER_ASSERT(layout_is_32_bits, sizeof(kdn_kv_layout) == 4);
KDN_HEADER_ASSERT(op_state_is_32_bits, sizeof(kdn_op_state) == 4);
KDN_HEADER_ASSERT(latency_kind_is_32_bits, sizeof(kdn_latency_kind) == 4);
KDN_HEADER_ASSERT(token_range_is_plain, sizeof(kdn_token_range) == 16);

/* Every versioned struct: struct_size first, a size that is a multiple of
 * 8 (no implicit tail padding), at least its first published size. */
#define KDN_VERSIONED(name, type, size_v1)                                        \
  KDN_HEADER_ASSERT(name##_size_first, offsetof(type, struct_size) == 0);         \
  KDN_HEADER_ASSERT(name##_multiple_of_8, sizeof(type) % 8 == 0);                 \
  KDN_HEADER_ASSERT(name##_v1_size, (size_v1) <= sizeof(type) && (size_v1) % 8 == 0)
/* Outputs: filled_size second. */
#define KDN_OUTPUT(name, type, size_v1) \
  KDN_VERSIONED(name, type, size_v1);   \
  KDN_HEADER_ASSERT(name##_filled_second, offsetof(type, filled_size) == 4)

KDN_VERSIONED(tier_config, kdn_tier_config, KDN_TIER_CONFIG_SIZE_V1);
KDN_VERSIONED(runtime_options, kdn_runtime_options, KDN_RUNTIME_OPTIONS_SIZE_V1);
KDN_VERSIONED(model_spec, kdn_model_spec, KDN_MODEL_SPEC_SIZE_V1);
KDN_VERSIONED(request, kdn_request, KDN_REQUEST_SIZE_V1);
KDN_VERSIONED(kv_view, kdn_kv_view, KDN_KV_VIEW_SIZE_V1);
KDN_OUTPUT(lookup_result, kdn_lookup_result, KDN_LOOKUP_RESULT_SIZE_V1);
KDN_OUTPUT(document_info, kdn_document_info, KDN_DOCUMENT_INFO_SIZE_V1);
KDN_OUTPUT(stats, kdn_stats, KDN_STATS_SIZE_V1);
KDN_OUTPUT(latency, kdn_latency, KDN_LATENCY_SIZE_V1);
KDN_OUTPUT(tier_stats, kdn_tier_stats, KDN_TIER_STATS_SIZE_V1);
KDN_OUTPUT(kv_result, kdn_kv_result, KDN_KV_RESULT_SIZE_V1);
#ifdef KDN_EXPERIMENTAL
KDN_OUTPUT(chunk_info, kdn_chunk_info, 8);
KDN_VERSIONED(blend_segment, kdn_blend_segment, 8);
KDN_VERSIONED(blend_options, kdn_blend_options, 8);
KDN_OUTPUT(blend_report, kdn_blend_report, 8);
#endif

static void fill(void *p, unsigned long n) {
  unsigned char *b = p;
  unsigned long i;
  for (i = 0; i < n; ++i) b[i] = 0x5A;
}

static int same(const void *a, const void *b, unsigned long n) {
  const unsigned char *x = a, *y = b;
  unsigned long i;
  for (i = 0; i < n; ++i) {
    if (x[i] != y[i]) return 0;
  }
  return 1;
}

/* The macro and the function give the same bytes (the structs have no
 * padding), and struct_size is the caller's sizeof. */
#define KDN_AGREE(type, MACRO, init_fn)                                     \
  do {                                                                      \
    type from_macro = MACRO;                                                \
    type from_function;                                                     \
    fill(&from_function, sizeof from_function);                             \
    bad |= init_fn(&from_function, sizeof from_function) != KDN_OK;         \
    bad |= !same(&from_macro, &from_function, sizeof from_macro);           \
    bad |= from_macro.struct_size != sizeof from_macro;                     \
  } while (0)

int main(void) {
  int bad = 0;
  KDN_AGREE(kdn_tier_config, KDN_TIER_CONFIG_INIT, kdn_tier_config_init);
  KDN_AGREE(kdn_runtime_options, KDN_RUNTIME_OPTIONS_INIT, kdn_runtime_options_init);
  KDN_AGREE(kdn_model_spec, KDN_MODEL_SPEC_INIT, kdn_model_spec_init);
  KDN_AGREE(kdn_request, KDN_REQUEST_INIT, kdn_request_init);
  KDN_AGREE(kdn_kv_view, KDN_KV_VIEW_INIT, kdn_kv_view_init);
  KDN_AGREE(kdn_lookup_result, KDN_LOOKUP_RESULT_INIT, kdn_lookup_result_init);
  KDN_AGREE(kdn_document_info, KDN_DOCUMENT_INFO_INIT, kdn_document_info_init);
  KDN_AGREE(kdn_stats, KDN_STATS_INIT, kdn_stats_init);
  KDN_AGREE(kdn_latency, KDN_LATENCY_INIT, kdn_latency_init);
  KDN_AGREE(kdn_tier_stats, KDN_TIER_STATS_INIT, kdn_tier_stats_init);
  KDN_AGREE(kdn_kv_result, KDN_KV_RESULT_INIT, kdn_kv_result_init);
#ifdef KDN_EXPERIMENTAL
  KDN_AGREE(kdn_chunk_info, KDN_CHUNK_INFO_INIT, kdn_chunk_info_init);
  KDN_AGREE(kdn_blend_segment, KDN_BLEND_SEGMENT_INIT, kdn_blend_segment_init);
  KDN_AGREE(kdn_blend_options, KDN_BLEND_OPTIONS_INIT, kdn_blend_options_init);
  KDN_AGREE(kdn_blend_report, KDN_BLEND_REPORT_INIT, kdn_blend_report_init);
#endif
  bad |= kdn_version_number() != KDN_VERSION_NUMBER;
  bad |= KDN_VERSION_NUMBER != KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH;
  return bad ? 1 : 0;
}

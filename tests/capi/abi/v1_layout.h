// SPDX-License-Identifier: Apache-2.0
/* The 1.0 layout of every struct of the stable C ABI, as X-macro lists:
 * included by sizes_v1.c (compiled against the frozen kdn_v1.h) and by
 * sizes_current.c (compiled against today's kdn.h), which expand the same
 * lists with their own header's types and compare. Like kdn_v1.h, these
 * lists describe 1.0 and never change. */
#ifndef KDN_TESTS_CAPI_ABI_V1_LAYOUT_H
#define KDN_TESTS_CAPI_ABI_V1_LAYOUT_H

#include <stddef.h>

/* F(type, field): every field of each versioned struct, in order. */
#define KDN_V1_FIELDS(F)                                                                                     \
  F(kdn_tier_config, struct_size) F(kdn_tier_config, kind) F(kdn_tier_config, capacity_bytes)                \
  F(kdn_tier_config, path) F(kdn_tier_config, path_len) F(kdn_tier_config, policy)                           \
  F(kdn_tier_config, high_watermark) F(kdn_tier_config, low_watermark) F(kdn_tier_config, write_through)     \
  F(kdn_tier_config, codec) F(kdn_tier_config, codec_len)                                                    \
  F(kdn_runtime_options, struct_size) F(kdn_runtime_options, chunk_tokens)                                   \
  F(kdn_runtime_options, host_capacity_bytes) F(kdn_runtime_options, hash_seed) F(kdn_runtime_options, tiers) \
  F(kdn_runtime_options, num_tiers) F(kdn_runtime_options, worker_threads) F(kdn_runtime_options, reserved0) \
  F(kdn_model_spec, struct_size) F(kdn_model_spec, num_layers) F(kdn_model_spec, num_kv_heads)               \
  F(kdn_model_spec, head_dim) F(kdn_model_spec, dtype) F(kdn_model_spec, rope_theta)                         \
  F(kdn_model_spec, rope_style) F(kdn_model_spec, rotary_dim) F(kdn_model_spec, fingerprint)                 \
  F(kdn_model_spec, fingerprint_len)                                                                         \
  F(kdn_request, struct_size) F(kdn_request, hash_bytes) F(kdn_request, tokens) F(kdn_request, num_tokens)   \
  F(kdn_request, block_hashes) F(kdn_request, num_blocks) F(kdn_request, block_tokens)                       \
  F(kdn_request, reserved0)                                                                                  \
  F(kdn_kv_view, struct_size) F(kdn_kv_view, memory) F(kdn_kv_view, dtype) F(kdn_kv_view, layout)            \
  F(kdn_kv_view, layers) F(kdn_kv_view, num_layers) F(kdn_kv_view, k_layers) F(kdn_kv_view, v_layers)        \
  F(kdn_kv_view, data) F(kdn_kv_view, size_bytes) F(kdn_kv_view, stride_layer) F(kdn_kv_view, stride_kv)     \
  F(kdn_kv_view, stride_token) F(kdn_kv_view, stride_head) F(kdn_kv_view, stride_dim)                        \
  F(kdn_kv_view, v_stride_token) F(kdn_kv_view, v_stride_head) F(kdn_kv_view, v_stride_dim)                  \
  F(kdn_kv_view, num_tokens) F(kdn_kv_view, layer_elements) F(kdn_kv_view, block_size)                       \
  F(kdn_kv_view, reserved0) F(kdn_kv_view, block_table) F(kdn_kv_view, block_table_len)                      \
  F(kdn_kv_view, num_blocks) F(kdn_kv_view, block_stride)                                                    \
  F(kdn_lookup_result, struct_size) F(kdn_lookup_result, filled_size) F(kdn_lookup_result, status)           \
  F(kdn_lookup_result, num_tiers) F(kdn_lookup_result, cached_tokens) F(kdn_lookup_result, tier_tokens)      \
  F(kdn_kv_result, struct_size) F(kdn_kv_result, filled_size) F(kdn_kv_result, state)                        \
  F(kdn_kv_result, status) F(kdn_kv_result, tokens) F(kdn_kv_result, covered) F(kdn_kv_result, num_failed)   \
  F(kdn_kv_result, flags) F(kdn_kv_result, reserved0)                                                        \
  F(kdn_token_range, begin) F(kdn_token_range, end)                                                          \
  F(kdn_document_info, struct_size) F(kdn_document_info, filled_size) F(kdn_document_info, doc_id_len)       \
  F(kdn_document_info, pinned) F(kdn_document_info, doc_id) F(kdn_document_info, version)                    \
  F(kdn_document_info, num_tokens) F(kdn_document_info, chunks) F(kdn_document_info, chunks_present)         \
  F(kdn_document_info, expires_in_ms)                                                                        \
  F(kdn_stats, struct_size) F(kdn_stats, filled_size) F(kdn_stats, lookups) F(kdn_stats, retrieves)          \
  F(kdn_stats, stores) F(kdn_stats, hits) F(kdn_stats, misses) F(kdn_stats, tokens_served)                   \
  F(kdn_stats, tokens_stored) F(kdn_stats, bytes_served) F(kdn_stats, bytes_stored) F(kdn_stats, chunks)     \
  F(kdn_stats, used_bytes) F(kdn_stats, capacity_bytes) F(kdn_stats, evictions) F(kdn_stats, edited_served)  \
  F(kdn_stats, leases_active) F(kdn_stats, pins_active) F(kdn_stats, pins_forced_unpin)                      \
  F(kdn_stats, corrupt_detected) F(kdn_stats, edits)                                                         \
  F(kdn_latency, struct_size) F(kdn_latency, filled_size) F(kdn_latency, count) F(kdn_latency, mean_us)      \
  F(kdn_latency, p50_us) F(kdn_latency, p90_us) F(kdn_latency, p99_us) F(kdn_latency, max_us)                \
  F(kdn_tier_stats, struct_size) F(kdn_tier_stats, filled_size) F(kdn_tier_stats, kind)                      \
  F(kdn_tier_stats, reserved0) F(kdn_tier_stats, name) F(kdn_tier_stats, codec) F(kdn_tier_stats, hits)      \
  F(kdn_tier_stats, misses) F(kdn_tier_stats, puts) F(kdn_tier_stats, put_refusals)                          \
  F(kdn_tier_stats, evictions) F(kdn_tier_stats, demotions_in) F(kdn_tier_stats, promotions_in)              \
  F(kdn_tier_stats, bytes_in) F(kdn_tier_stats, bytes_out) F(kdn_tier_stats, objects)                        \
  F(kdn_tier_stats, used_bytes) F(kdn_tier_stats, capacity_bytes) F(kdn_tier_stats, corrupt_detected)        \
  F(kdn_tier_stats, encoded_chunks) F(kdn_tier_stats, bytes_before_encoding)                                 \
  F(kdn_tier_stats, bytes_after_encoding) F(kdn_tier_stats, encode_failures) F(kdn_tier_stats, decode_failures)

/* S(type, SIZE_V1 constant, last field): each versioned struct. */
#define KDN_V1_STRUCTS(S)                                                  \
  S(kdn_tier_config, KDN_TIER_CONFIG_SIZE_V1, codec_len)                   \
  S(kdn_runtime_options, KDN_RUNTIME_OPTIONS_SIZE_V1, reserved0)           \
  S(kdn_model_spec, KDN_MODEL_SPEC_SIZE_V1, fingerprint_len)               \
  S(kdn_request, KDN_REQUEST_SIZE_V1, reserved0)                           \
  S(kdn_kv_view, KDN_KV_VIEW_SIZE_V1, block_stride)                        \
  S(kdn_lookup_result, KDN_LOOKUP_RESULT_SIZE_V1, tier_tokens)             \
  S(kdn_kv_result, KDN_KV_RESULT_SIZE_V1, reserved0)                       \
  S(kdn_document_info, KDN_DOCUMENT_INFO_SIZE_V1, expires_in_ms)           \
  S(kdn_stats, KDN_STATS_SIZE_V1, edits)                                   \
  S(kdn_latency, KDN_LATENCY_SIZE_V1, max_us)                              \
  S(kdn_tier_stats, KDN_TIER_STATS_SIZE_V1, decode_failures)

/* V(constant): every named value of 1.0, pinned forever. */
#define KDN_V1_VALUES(V)                                                                                      \
  V(KDN_VERSION_MAJOR) V(KDN_MAX_TIERS)                                                                       \
  V(KDN_OK) V(KDN_ERR_INVALID_ARGUMENT) V(KDN_ERR_NOT_FOUND) V(KDN_ERR_BUSY) V(KDN_ERR_UNAVAILABLE)           \
  V(KDN_ERR_CORRUPT) V(KDN_ERR_UNSUPPORTED) V(KDN_ERR_NO_MEMORY) V(KDN_ERR_INTERNAL) V(KDN_ERR_TIMEOUT)        \
  V(KDN_ERR_CANCELLED) V(KDN_ERR_VERSION) V(KDN_ERR_BUFFER_TOO_SMALL)                                         \
  V(KDN_DTYPE_F32) V(KDN_DTYPE_F16) V(KDN_DTYPE_BF16)                                                         \
  V(KDN_TIER_HOST) V(KDN_TIER_DEVICE) V(KDN_TIER_DISK) V(KDN_EVICT_LRU) V(KDN_EVICT_S3FIFO)                   \
  V(KDN_ROPE_INTERLEAVED) V(KDN_ROPE_NEOX) V(KDN_MEMORY_HOST)                                                 \
  V(KDN_LAYOUT_CONTIGUOUS) V(KDN_LAYOUT_PAGED_NHD) V(KDN_LAYOUT_PAGED_HND)                                    \
  V(KDN_OP_PENDING) V(KDN_OP_DONE) V(KDN_OP_FAILED) V(KDN_OP_CANCELLED)                                       \
  V(KDN_LATENCY_LOOKUP) V(KDN_LATENCY_LOAD) V(KDN_LATENCY_STORE) V(KDN_RESULT_LOSSY)

/* What each translation unit reports. */
typedef struct kdn_field_layout {
  const char *type, *field;
  size_t offset, size;
} kdn_field_layout;

typedef struct kdn_struct_layout {
  const char *type;
  size_t size_v1; /* the header's KDN_X_SIZE_V1 */
  size_t size;    /* sizeof in that header */
} kdn_struct_layout;

typedef struct kdn_value {
  const char *name;
  long long value;
} kdn_value;

#define KDN_FIELD_LAYOUT_(type, field) {#type, #field, offsetof(type, field), sizeof(((type *)0)->field)},
#define KDN_STRUCT_LAYOUT_(type, size_v1, last) {#type, (size_v1), sizeof(type)},
#define KDN_VALUE_(name) {#name, (long long)(name)},

#endif /* KDN_TESTS_CAPI_ABI_V1_LAYOUT_H */

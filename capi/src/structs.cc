// SPDX-License-Identifier: Apache-2.0
// The C ABI: the _init functions of its versioned structs.
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

extern "C" {

/* ---- init functions ---- */

#define KDN_DEFINE_INIT(type, size_v1, init_macro)                      \
  kdn_status type##_init(type* p, size_t struct_size) {                 \
    static const type defaults = init_macro;                            \
    return InitStruct(p, struct_size, size_v1, defaults, #type);        \
  }

KDN_DEFINE_INIT(kdn_tier_config, KDN_TIER_CONFIG_SIZE_V1, KDN_TIER_CONFIG_INIT)
KDN_DEFINE_INIT(kdn_quota, KDN_QUOTA_SIZE_V1, KDN_QUOTA_INIT)
KDN_DEFINE_INIT(kdn_quota_stats, KDN_QUOTA_STATS_SIZE_V1, KDN_QUOTA_STATS_INIT)
KDN_DEFINE_INIT(kdn_runtime_options, KDN_RUNTIME_OPTIONS_SIZE_V1, KDN_RUNTIME_OPTIONS_INIT)
KDN_DEFINE_INIT(kdn_model_spec, KDN_MODEL_SPEC_SIZE_V1, KDN_MODEL_SPEC_INIT)
KDN_DEFINE_INIT(kdn_request, KDN_REQUEST_SIZE_V1, KDN_REQUEST_INIT)
KDN_DEFINE_INIT(kdn_kv_view, KDN_KV_VIEW_SIZE_V1, KDN_KV_VIEW_INIT)
KDN_DEFINE_INIT(kdn_lookup_result, KDN_LOOKUP_RESULT_SIZE_V1, KDN_LOOKUP_RESULT_INIT)
KDN_DEFINE_INIT(kdn_kv_result, KDN_KV_RESULT_SIZE_V1, KDN_KV_RESULT_INIT)
KDN_DEFINE_INIT(kdn_document_info, KDN_DOCUMENT_INFO_SIZE_V1, KDN_DOCUMENT_INFO_INIT)
KDN_DEFINE_INIT(kdn_stats, KDN_STATS_SIZE_V1, KDN_STATS_INIT)
KDN_DEFINE_INIT(kdn_latency, KDN_LATENCY_SIZE_V1, KDN_LATENCY_INIT)
KDN_DEFINE_INIT(kdn_tier_stats, KDN_TIER_STATS_SIZE_V1, KDN_TIER_STATS_INIT)
// Experimental structs: their first size is their size today.
KDN_DEFINE_INIT(kdn_chunk_info, sizeof(kdn_chunk_info), KDN_CHUNK_INFO_INIT)
KDN_DEFINE_INIT(kdn_blend_segment, sizeof(kdn_blend_segment), KDN_BLEND_SEGMENT_INIT)
// Grown in 1.9 (the KV pass, first tokens): older callers' sizes stay good.
KDN_DEFINE_INIT(kdn_blend_options, KDN_BLEND_OPTIONS_SIZE_V1, KDN_BLEND_OPTIONS_INIT)
KDN_DEFINE_INIT(kdn_blend_report, KDN_BLEND_REPORT_SIZE_V1, KDN_BLEND_REPORT_INIT)

}  // extern "C"

// SPDX-License-Identifier: Apache-2.0
// The public header as strict C++20 (-Wall -Wextra -pedantic -Werror), built
// twice: as is, and with KDN_EXPERIMENTAL defined. It must be self-contained
// (the only include), its _INIT macros must be valid constant initialisers,
// and each _init() function must write what its macro does.
#include <kdn/kdn.h>

static_assert(sizeof(kdn_status) == 4 && kdn_status(-1) < 0);
static_assert(sizeof(kdn_dtype) == 4 && sizeof(kdn_memory_kind) == 4 && sizeof(kdn_rope_style) == 4 &&
              sizeof(kdn_tier_kind) == 4 && sizeof(kdn_kv_layout) == 4 && sizeof(kdn_op_state) == 4 &&
              sizeof(kdn_latency_kind) == 4 && sizeof(kdn_eviction_policy) == 4);
static_assert(KDN_VERSION_NUMBER == KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH);

template <typename T>
constexpr bool Versioned(unsigned size_v1) {
  return offsetof(T, struct_size) == 0 && sizeof(T) % 8 == 0 && size_v1 <= sizeof(T) && size_v1 % 8 == 0;
}
static_assert(Versioned<kdn_tier_config>(KDN_TIER_CONFIG_SIZE_V1));
static_assert(Versioned<kdn_runtime_options>(KDN_RUNTIME_OPTIONS_SIZE_V1));
static_assert(Versioned<kdn_model_spec>(KDN_MODEL_SPEC_SIZE_V1));
static_assert(Versioned<kdn_request>(KDN_REQUEST_SIZE_V1));
static_assert(Versioned<kdn_kv_view>(KDN_KV_VIEW_SIZE_V1));
static_assert(Versioned<kdn_lookup_result>(KDN_LOOKUP_RESULT_SIZE_V1) && offsetof(kdn_lookup_result, filled_size) == 4);
static_assert(Versioned<kdn_document_info>(KDN_DOCUMENT_INFO_SIZE_V1) && offsetof(kdn_document_info, filled_size) == 4);
static_assert(Versioned<kdn_stats>(KDN_STATS_SIZE_V1) && offsetof(kdn_stats, filled_size) == 4);
static_assert(Versioned<kdn_latency>(KDN_LATENCY_SIZE_V1) && offsetof(kdn_latency, filled_size) == 4);
static_assert(Versioned<kdn_tier_stats>(KDN_TIER_STATS_SIZE_V1) && offsetof(kdn_tier_stats, filled_size) == 4);
static_assert(Versioned<kdn_kv_result>(KDN_KV_RESULT_SIZE_V1) && offsetof(kdn_kv_result, filled_size) == 4);

// The macros are constant expressions with the documented defaults.
constexpr kdn_runtime_options kOptions = KDN_RUNTIME_OPTIONS_INIT;
constexpr kdn_model_spec kSpec = KDN_MODEL_SPEC_INIT;
constexpr kdn_kv_view kView = KDN_KV_VIEW_INIT;
constexpr kdn_tier_config kTier = KDN_TIER_CONFIG_INIT;
constexpr kdn_document_info kDoc = KDN_DOCUMENT_INFO_INIT;
static_assert(kOptions.struct_size == sizeof(kdn_runtime_options) && kOptions.chunk_tokens == 256 &&
              kOptions.host_capacity_bytes == (uint64_t{1} << 30));
static_assert(kSpec.struct_size == sizeof(kdn_model_spec) && kSpec.rope_theta == 10000.0f &&
              kSpec.rope_style == KDN_ROPE_INTERLEAVED);
static_assert(kView.struct_size == sizeof(kdn_kv_view) && kView.memory == KDN_MEMORY_HOST &&
              kView.layout == KDN_LAYOUT_CONTIGUOUS && kView.data == nullptr);
static_assert(kTier.capacity_bytes == (uint64_t{1} << 30) && kTier.kind == KDN_TIER_HOST);
static_assert(kDoc.expires_in_ms == -1);

namespace {

bool Same(const void *a, const void *b, unsigned long n) {
  auto x = static_cast<const unsigned char *>(a);
  auto y = static_cast<const unsigned char *>(b);
  for (unsigned long i = 0; i < n; ++i) {
    if (x[i] != y[i]) return false;
  }
  return true;
}

// The function writes the macro's bytes (the structs have no padding).
template <typename T>
bool Agrees(const T &from_macro, kdn_status (*init)(T *, size_t)) {
  T from_function;
  auto bytes = reinterpret_cast<unsigned char *>(&from_function);
  for (unsigned long i = 0; i < sizeof(T); ++i) bytes[i] = 0x5A;
  return init(&from_function, sizeof(T)) == KDN_OK && Same(&from_macro, &from_function, sizeof(T)) &&
         from_macro.struct_size == sizeof(T);
}

}  // namespace

int main() {
  bool ok = Agrees<kdn_tier_config>(KDN_TIER_CONFIG_INIT, kdn_tier_config_init) &&
            Agrees<kdn_runtime_options>(KDN_RUNTIME_OPTIONS_INIT, kdn_runtime_options_init) &&
            Agrees<kdn_model_spec>(KDN_MODEL_SPEC_INIT, kdn_model_spec_init) &&
            Agrees<kdn_request>(KDN_REQUEST_INIT, kdn_request_init) &&
            Agrees<kdn_kv_view>(KDN_KV_VIEW_INIT, kdn_kv_view_init) &&
            Agrees<kdn_lookup_result>(KDN_LOOKUP_RESULT_INIT, kdn_lookup_result_init) &&
            Agrees<kdn_document_info>(KDN_DOCUMENT_INFO_INIT, kdn_document_info_init) &&
            Agrees<kdn_stats>(KDN_STATS_INIT, kdn_stats_init) &&
            Agrees<kdn_latency>(KDN_LATENCY_INIT, kdn_latency_init) &&
            Agrees<kdn_tier_stats>(KDN_TIER_STATS_INIT, kdn_tier_stats_init) &&
            Agrees<kdn_kv_result>(KDN_KV_RESULT_INIT, kdn_kv_result_init);
#ifdef KDN_EXPERIMENTAL
  ok = ok && Agrees<kdn_chunk_info>(KDN_CHUNK_INFO_INIT, kdn_chunk_info_init) &&
       Agrees<kdn_blend_segment>(KDN_BLEND_SEGMENT_INIT, kdn_blend_segment_init) &&
       Agrees<kdn_blend_options>(KDN_BLEND_OPTIONS_INIT, kdn_blend_options_init) &&
       Agrees<kdn_blend_report>(KDN_BLEND_REPORT_INIT, kdn_blend_report_init);
#endif
  ok = ok && kdn_version_number() == KDN_VERSION_NUMBER;
  return ok ? 0 : 1;
}

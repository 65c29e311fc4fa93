// The public header as strict C++20 (-Wall -Wextra -pedantic -Werror): it
// must be self-contained (the only include), its _INIT macros must be valid
// (even constant) initialisers, and each _init() function must agree with
// its macro.
#include <kdn/kdn.h>

static_assert(sizeof(kdn_status) == 4 && sizeof(kdn_dtype) == 4 && sizeof(kdn_memory_kind) == 4 &&
              sizeof(kdn_rope_style) == 4);
static_assert(offsetof(kdn_runtime_options, struct_size) == 0 && offsetof(kdn_model_spec, struct_size) == 0 &&
              offsetof(kdn_kv_buffer, struct_size) == 0 && offsetof(kdn_store_options, struct_size) == 0 &&
              offsetof(kdn_stats, struct_size) == 0);

constexpr kdn_runtime_options kOptions = KDN_RUNTIME_OPTIONS_INIT;
constexpr kdn_model_spec kSpec = KDN_MODEL_SPEC_INIT;
constexpr kdn_kv_buffer kKv = KDN_KV_BUFFER_INIT;
constexpr kdn_store_options kStoreOptions = KDN_STORE_OPTIONS_INIT;
constexpr kdn_stats kStats = KDN_STATS_INIT;
static_assert(kOptions.struct_size == sizeof(kdn_runtime_options) && kOptions.chunk_tokens == 256 &&
              kOptions.host_capacity_bytes == (uint64_t{1} << 30));
static_assert(kSpec.struct_size == sizeof(kdn_model_spec) && kSpec.rope_theta == 10000.0f);
static_assert(kKv.struct_size == sizeof(kdn_kv_buffer) && kKv.memory == KDN_MEMORY_HOST);
static_assert(kStoreOptions.struct_size == sizeof(kdn_store_options));
static_assert(kStats.struct_size == sizeof(kdn_stats));
static_assert(KDN_VERSION_NUMBER == KDN_VERSION_MAJOR * 10000 + KDN_VERSION_MINOR * 100 + KDN_VERSION_PATCH);

int main() {
  kdn_runtime_options options;
  kdn_model_spec spec;
  kdn_kv_buffer kv;
  kdn_store_options store_options;
  kdn_stats stats;
  kdn_runtime_options_init(&options);
  kdn_model_spec_init(&spec);
  kdn_kv_buffer_init(&kv);
  kdn_store_options_init(&store_options);
  kdn_stats_init(&stats);
  bool bad = options.struct_size != kOptions.struct_size || options.chunk_tokens != kOptions.chunk_tokens ||
             options.host_capacity_bytes != kOptions.host_capacity_bytes || options.hash_seed != kOptions.hash_seed;
  bad |= spec.struct_size != kSpec.struct_size || spec.dtype != kSpec.dtype || spec.rope_theta != kSpec.rope_theta ||
         spec.rope_style != kSpec.rope_style || spec.rotary_dim != kSpec.rotary_dim ||
         spec.fingerprint != kSpec.fingerprint || spec.fingerprint_len != kSpec.fingerprint_len;
  bad |= kv.struct_size != kKv.struct_size || kv.memory != kKv.memory || kv.data != kKv.data || kv.dtype != kKv.dtype;
  bad |= store_options.struct_size != kStoreOptions.struct_size || stats.struct_size != kStats.struct_size;
  bad |= kdn_version_number() != KDN_VERSION_NUMBER;
  return bad ? 1 : 0;
}

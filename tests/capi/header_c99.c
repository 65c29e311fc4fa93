/* The public header as strict C99 (-std=c99 -Wall -Wextra -pedantic -Werror):
 * it must be self-contained (the only include), its _INIT macros must be valid
 * initialisers, and each _init() function must agree with its macro. */
#include <kdn/kdn.h>

/* Compile-time checks without C11's _Static_assert. */
#define KDN_HEADER_ASSERT(name, cond) typedef char kdn_header_assert_##name[(cond) ? 1 : -1]

/* Enums are pinned to 32 bits by their _FORCE32_ members. */
KDN_HEADER_ASSERT(status_is_32_bits, sizeof(kdn_status) == 4);
KDN_HEADER_ASSERT(dtype_is_32_bits, sizeof(kdn_dtype) == 4);
KDN_HEADER_ASSERT(memory_is_32_bits, sizeof(kdn_memory_kind) == 4);
KDN_HEADER_ASSERT(rope_is_32_bits, sizeof(kdn_rope_style) == 4);
/* Every options struct starts with struct_size. */
KDN_HEADER_ASSERT(runtime_options_size_first, offsetof(kdn_runtime_options, struct_size) == 0);
KDN_HEADER_ASSERT(model_spec_size_first, offsetof(kdn_model_spec, struct_size) == 0);
KDN_HEADER_ASSERT(kv_buffer_size_first, offsetof(kdn_kv_buffer, struct_size) == 0);
KDN_HEADER_ASSERT(store_options_size_first, offsetof(kdn_store_options, struct_size) == 0);
KDN_HEADER_ASSERT(stats_size_first, offsetof(kdn_stats, struct_size) == 0);

int main(void) {
  kdn_runtime_options options = KDN_RUNTIME_OPTIONS_INIT;
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  kdn_kv_buffer kv = KDN_KV_BUFFER_INIT;
  kdn_store_options store_options = KDN_STORE_OPTIONS_INIT;
  kdn_stats stats = KDN_STATS_INIT;
  kdn_runtime_options options2;
  kdn_model_spec spec2;
  kdn_kv_buffer kv2;
  kdn_store_options store_options2;
  kdn_stats stats2;
  int bad = 0;

  kdn_runtime_options_init(&options2);
  kdn_model_spec_init(&spec2);
  kdn_kv_buffer_init(&kv2);
  kdn_store_options_init(&store_options2);
  kdn_stats_init(&stats2);

  bad |= options.struct_size != sizeof options || options2.struct_size != options.struct_size;
  bad |= options2.chunk_tokens != options.chunk_tokens;
  bad |= options2.host_capacity_bytes != options.host_capacity_bytes;
  bad |= options2.hash_seed != options.hash_seed;
  bad |= spec.struct_size != sizeof spec || spec2.struct_size != spec.struct_size;
  bad |= spec2.dtype != spec.dtype || spec2.rope_theta != spec.rope_theta;
  bad |= spec2.rope_style != spec.rope_style || spec2.rotary_dim != spec.rotary_dim;
  bad |= spec2.fingerprint != spec.fingerprint || spec2.fingerprint_len != spec.fingerprint_len;
  bad |= kv.struct_size != sizeof kv || kv2.struct_size != kv.struct_size;
  bad |= kv2.memory != kv.memory || kv2.data != kv.data || kv2.dtype != kv.dtype;
  bad |= store_options.struct_size != sizeof store_options;
  bad |= store_options2.struct_size != store_options.struct_size;
  bad |= stats.struct_size != sizeof stats || stats2.struct_size != stats.struct_size;
  bad |= kdn_version_number() != KDN_VERSION_NUMBER;
  return bad ? 1 : 0;
}

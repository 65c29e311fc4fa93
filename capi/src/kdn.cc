// extern "C" shims over kdn::core. Each body runs inside KDN_BEGIN/KDN_END,
// which turn any exception into a status and the thread's last-error message.
#include "kdn/kdn.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "keys/hash.h"
#include "store/kv_store.h"

struct kdn_runtime {
  std::unique_ptr<kdn::store::KvStore> rep;
};

struct kdn_model {
  const kdn_runtime* runtime;
  kdn_dtype dtype;
  kdn::store::ModelKv kv;
};

namespace {

thread_local std::string g_last_error;

kdn_status Fail(kdn_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

kdn_status FromStatus(const kdn::Status& s) {
  if (s.ok()) return KDN_OK;
  return Fail(static_cast<kdn_status>(static_cast<int>(s.code())), s.message());
}

// Copies a caller's options struct over defaults, honouring struct_size:
// fields below it are read, the rest keep their defaults. `min_size` is the
// size of the struct's first version.
template <typename T>
kdn_status ReadStruct(const T* in, size_t min_size, const char* name, T* out) {
  if (in == nullptr) return KDN_OK;  // defaults
  const uint32_t size = in->struct_size;
  if (size < min_size || size > 65536) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, std::string(name) + ": struct_size " + std::to_string(size) +
                                              " is wrong (expected " + std::to_string(sizeof(T)) +
                                              "; initialise it with its _INIT macro or _init function)");
  }
  std::memcpy(out, in, std::min<size_t>(size, sizeof(T)));
  out->struct_size = static_cast<uint32_t>(sizeof(T));
  return KDN_OK;
}

int64_t DtypeBytes(kdn_dtype d) {
  switch (d) {
    case KDN_DTYPE_F32: return 4;
    case KDN_DTYPE_F16:
    case KDN_DTYPE_BF16: return 2;
    default: return 0;
  }
}

kdn_status CheckCall(const kdn_runtime* rt, const kdn_model* model, const char* ns, size_t ns_len,
                     const int32_t* tokens, size_t num_tokens) {
  if (rt == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (model->runtime != rt) return Fail(KDN_ERR_INVALID_ARGUMENT, "model was registered with another runtime");
  if (ns == nullptr || ns_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace is empty: every call names its tenant");
  if (ns_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace longer than 4096 bytes");
  if (num_tokens == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no tokens (num_tokens is 0)");
  if (tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tokens is NULL");
  if (num_tokens > (size_t{1} << 32)) return Fail(KDN_ERR_INVALID_ARGUMENT, "more than 2^32 tokens");
  for (size_t i = 0; i < num_tokens; ++i) {
    if (tokens[i] < 0) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "token " + std::to_string(i) + " has negative id " + std::to_string(tokens[i]));
    }
  }
  return KDN_OK;
}

kdn_status ResolveKv(const kdn_model* model, const kdn_kv_buffer* in, size_t num_tokens,
                     kdn::store::KvBufferView* out) {
  if (in == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "KV buffer is NULL");
  kdn_kv_buffer b = KDN_KV_BUFFER_INIT;
  if (kdn_status s = ReadStruct(in, sizeof(kdn_kv_buffer), "kdn_kv_buffer", &b); s != KDN_OK) return s;
  if (b.memory != KDN_MEMORY_HOST) {
    return Fail(KDN_ERR_UNSUPPORTED, "KV buffer memory kind " + std::to_string(b.memory) + " is not supported");
  }
  if (b.dtype != model->dtype) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "KV buffer dtype " + std::to_string(b.dtype) +
                                              " differs from the model's " + std::to_string(model->dtype));
  }
  kdn::store::KvBufferView v;
  v.data = b.data;
  v.size_bytes = b.size_bytes;
  v.num_tokens = b.num_tokens;
  v.strides = {b.stride_layer, b.stride_kv, b.stride_token, b.stride_head, b.stride_dim};
  auto r = kdn::store::ResolveBuffer(model->kv, v, num_tokens);
  if (!r.ok()) return FromStatus(r.status());
  *out = *r;
  return KDN_OK;
}

}  // namespace

#define KDN_BEGIN  \
  g_last_error.clear(); \
  try {
#define KDN_END                                                                  \
  }                                                                              \
  catch (const std::bad_alloc&) {                                                \
    return Fail(KDN_ERR_NO_MEMORY, "out of memory");                             \
  }                                                                              \
  catch (const std::exception& e) {                                              \
    return Fail(KDN_ERR_INTERNAL, std::string("internal error: ") + e.what());   \
  }                                                                              \
  catch (...) {                                                                  \
    return Fail(KDN_ERR_INTERNAL, "internal error: unknown exception");          \
  }

extern "C" {

uint32_t kdn_version_number(void) { return KDN_VERSION_NUMBER; }

const char* kdn_version(void) {
#define KDN_STR2(x) #x
#define KDN_STR(x) KDN_STR2(x)
  return KDN_STR(KDN_VERSION_MAJOR) "." KDN_STR(KDN_VERSION_MINOR) "." KDN_STR(KDN_VERSION_PATCH);
}

const char* kdn_status_str(kdn_status status) {
  switch (status) {
    case KDN_OK: return "KDN_OK";
    case KDN_ERR_INVALID_ARGUMENT: return "KDN_ERR_INVALID_ARGUMENT";
    case KDN_ERR_NOT_FOUND: return "KDN_ERR_NOT_FOUND";
    case KDN_ERR_RETRY_LATER: return "KDN_ERR_RETRY_LATER";
    case KDN_ERR_UNAVAILABLE: return "KDN_ERR_UNAVAILABLE";
    case KDN_ERR_CORRUPT: return "KDN_ERR_CORRUPT";
    case KDN_ERR_UNSUPPORTED: return "KDN_ERR_UNSUPPORTED";
    case KDN_ERR_NO_MEMORY: return "KDN_ERR_NO_MEMORY";
    case KDN_ERR_INTERNAL: return "KDN_ERR_INTERNAL";
    default: return "KDN_STATUS_UNKNOWN";
  }
}

const char* kdn_last_error_message(void) { return g_last_error.c_str(); }

void kdn_runtime_options_init(kdn_runtime_options* options) {
  if (options) *options = KDN_RUNTIME_OPTIONS_INIT;
}
void kdn_model_spec_init(kdn_model_spec* spec) {
  if (spec) *spec = KDN_MODEL_SPEC_INIT;
}
void kdn_kv_buffer_init(kdn_kv_buffer* buffer) {
  if (buffer) *buffer = KDN_KV_BUFFER_INIT;
}
void kdn_store_options_init(kdn_store_options* options) {
  if (options) *options = KDN_STORE_OPTIONS_INIT;
}
void kdn_stats_init(kdn_stats* stats) {
  if (stats) *stats = KDN_STATS_INIT;
}

kdn_status kdn_runtime_create(const kdn_runtime_options* options, kdn_runtime** out) {
  KDN_BEGIN
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  if (kdn_status s = ReadStruct(options, sizeof(kdn_runtime_options), "kdn_runtime_options", &o); s != KDN_OK) return s;
  if (o.chunk_tokens == 0 || o.chunk_tokens > 65536) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "chunk_tokens " + std::to_string(o.chunk_tokens) + " out of range 1..65536");
  }
  if (o.host_capacity_bytes == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "host_capacity_bytes is 0");
  kdn::store::StoreOptions so;
  so.chunk_tokens = o.chunk_tokens;
  so.host_capacity_bytes = o.host_capacity_bytes;
  so.hash_seed = o.hash_seed;
  auto rt = std::make_unique<kdn_runtime>();
  rt->rep = std::make_unique<kdn::store::KvStore>(so);
  *out = rt.release();
  return KDN_OK;
  KDN_END
}

void kdn_runtime_destroy(kdn_runtime* runtime) { delete runtime; }

kdn_status kdn_model_create(kdn_runtime* runtime, const kdn_model_spec* spec, kdn_model** out) {
  KDN_BEGIN
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (runtime == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  if (spec == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model spec is NULL");
  kdn_model_spec s = KDN_MODEL_SPEC_INIT;
  if (kdn_status st = ReadStruct(spec, sizeof(kdn_model_spec), "kdn_model_spec", &s); st != KDN_OK) return st;
  auto bad = [](const std::string& m) { return Fail(KDN_ERR_INVALID_ARGUMENT, "model spec: " + m); };
  if (s.num_layers == 0 || s.num_layers > 4096) return bad("num_layers " + std::to_string(s.num_layers) + " out of range 1..4096");
  if (s.num_kv_heads == 0 || s.num_kv_heads > 4096) return bad("num_kv_heads " + std::to_string(s.num_kv_heads) + " out of range 1..4096");
  if (s.head_dim == 0 || s.head_dim > 65536) return bad("head_dim " + std::to_string(s.head_dim) + " out of range 1..65536");
  const int64_t elem = DtypeBytes(s.dtype);
  if (elem == 0) return bad("unknown dtype " + std::to_string(s.dtype));
  if (s.rope_style != KDN_ROPE_INTERLEAVED && s.rope_style != KDN_ROPE_NEOX) {
    return bad("unknown rope_style " + std::to_string(s.rope_style));
  }
  if (!(s.rope_theta > 0.0f) || !std::isfinite(s.rope_theta)) return bad("rope_theta must be positive and finite");
  const uint32_t rotary = s.rotary_dim == 0 ? s.head_dim : s.rotary_dim;
  if (rotary > s.head_dim || rotary % 2 != 0) {
    return bad("rotary_dim " + std::to_string(rotary) + " must be even and at most head_dim " + std::to_string(s.head_dim));
  }
  if (s.fingerprint == nullptr || s.fingerprint_len == 0) {
    return bad("fingerprint is empty: it must identify the weights, so KV never reaches another model");
  }
  if (s.fingerprint_len > 65536) return bad("fingerprint longer than 65536 bytes");
  const int64_t per_token = int64_t{s.num_layers} * 2 * s.num_kv_heads * s.head_dim * elem;
  if (per_token > (int64_t{1} << 32)) return bad("KV bytes per token exceed 4 GiB");
  kdn::keys::ModelIdentity id;
  id.layers = s.num_layers;
  id.kv_heads = s.num_kv_heads;
  id.head_dim = s.head_dim;
  id.dtype = static_cast<uint32_t>(s.dtype);
  id.rope_theta = s.rope_theta;
  id.rope_style = static_cast<uint32_t>(s.rope_style);
  id.rotary_dim = rotary;
  id.fingerprint.assign(s.fingerprint, s.fingerprint_len);
  auto m = std::make_unique<kdn_model>();
  m->runtime = runtime;
  m->dtype = s.dtype;
  m->kv.fingerprint = kdn::keys::ModelFingerprint(id);
  m->kv.shape = {s.num_layers, s.num_kv_heads, s.head_dim, elem};
  *out = m.release();
  return KDN_OK;
  KDN_END
}

void kdn_model_destroy(kdn_model* model) { delete model; }

kdn_status kdn_model_fingerprint(const kdn_model* model, uint8_t out[32]) {
  KDN_BEGIN
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  std::memcpy(out, model->kv.fingerprint.data(), 32);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_model_kv_bytes_per_token(const kdn_model* model, uint64_t* out) {
  KDN_BEGIN
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = static_cast<uint64_t>(model->kv.bytes_per_token());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_lookup(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                      const int32_t* tokens, size_t num_tokens, uint64_t* out_cached_tokens) {
  KDN_BEGIN
  if (out_cached_tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_cached_tokens is NULL");
  *out_cached_tokens = 0;
  if (kdn_status s = CheckCall(runtime, model, ns, ns_len, tokens, num_tokens); s != KDN_OK) return s;
  *out_cached_tokens = runtime->rep->Lookup(model->kv, std::string_view(ns, ns_len), {tokens, num_tokens});
  return KDN_OK;
  KDN_END
}

kdn_status kdn_store(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                     const int32_t* tokens, size_t num_tokens, const kdn_kv_buffer* kv,
                     const kdn_store_options* options, uint64_t* out_stored_tokens) {
  KDN_BEGIN
  if (out_stored_tokens) *out_stored_tokens = 0;
  if (kdn_status s = CheckCall(runtime, model, ns, ns_len, tokens, num_tokens); s != KDN_OK) return s;
  kdn_store_options o = KDN_STORE_OPTIONS_INIT;
  if (kdn_status s = ReadStruct(options, sizeof(kdn_store_options), "kdn_store_options", &o); s != KDN_OK) return s;
  kdn::store::KvBufferView view;
  if (kdn_status s = ResolveKv(model, kv, num_tokens, &view); s != KDN_OK) return s;
  const uint64_t stored = runtime->rep->Store(model->kv, std::string_view(ns, ns_len), {tokens, num_tokens}, view);
  if (out_stored_tokens) *out_stored_tokens = stored;
  return KDN_OK;
  KDN_END
}

kdn_status kdn_retrieve(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                        const int32_t* tokens, size_t num_tokens, const kdn_kv_buffer* kv,
                        uint64_t* out_filled_tokens) {
  KDN_BEGIN
  if (out_filled_tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_filled_tokens is NULL");
  *out_filled_tokens = 0;
  if (kdn_status s = CheckCall(runtime, model, ns, ns_len, tokens, num_tokens); s != KDN_OK) return s;
  kdn::store::KvBufferView view;
  if (kdn_status s = ResolveKv(model, kv, num_tokens, &view); s != KDN_OK) return s;
  const uint64_t filled = runtime->rep->Retrieve(model->kv, std::string_view(ns, ns_len), {tokens, num_tokens}, view);
  *out_filled_tokens = filled;
  if (filled == 0) {
    return Fail(KDN_ERR_NOT_FOUND, "no cached KV for these tokens under this model fingerprint and namespace");
  }
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_stats(kdn_runtime* runtime, kdn_stats* out) {
  KDN_BEGIN
  if (runtime == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const uint32_t size = out->struct_size;
  if (size < 2 * sizeof(uint32_t) || size > 65536) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "kdn_stats: struct_size " + std::to_string(size) +
                                              " is wrong (initialise it with KDN_STATS_INIT)");
  }
  const kdn::store::StoreStats s = runtime->rep->Stats();
  kdn_stats full = KDN_STATS_INIT;
  full.lookups = s.lookups;
  full.retrieves = s.retrieves;
  full.stores = s.stores;
  full.hits = s.hits;
  full.misses = s.misses;
  full.tokens_served = s.tokens_served;
  full.tokens_stored = s.tokens_stored;
  full.bytes_served = s.bytes_served;
  full.bytes_stored = s.bytes_stored;
  full.chunks = s.host.objects;
  full.used_bytes = s.host.bytes;
  full.capacity_bytes = s.host.capacity;
  full.evictions = s.host.evictions;
  // Write only what the caller's struct has room for; keep its struct_size.
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(uint32_t), reinterpret_cast<const char*>(&full) + sizeof(uint32_t),
              std::min<size_t>(size, sizeof(kdn_stats)) - sizeof(uint32_t));
  return KDN_OK;
  KDN_END
}

}  // extern "C"

// extern "C" shims over kdn::core: they translate C structs to core types,
// check what only the C side can get wrong (NULL pointers, struct sizes,
// enum values), and forward. Logic that C++ callers need too lives in core/
// (store/runtime.h, store/kv_views.h, blend/documents.h). Each body runs
// inside KDN_BEGIN/KDN_END, which turn any exception into a status and the
// thread's last-error message.
#define KDN_EXPERIMENTAL
#include "kdn/kdn.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "blend/documents.h"
#include "keys/hash.h"
#include "store/redis_tier.h"
#include "store/remote_tier.h"
#include "store/leveled_tier.h"
#include "store/runtime.h"
#include "util/dtype.h"

struct kdn_runtime {
  std::shared_ptr<kdn::store::Runtime> rep;
};

struct kdn_model {
  std::shared_ptr<kdn::store::Runtime> runtime;  // keeps the store alive
  kdn::store::ModelKv kv;
  kdn::kernels::RopeSpec rope;  // theta, style, rotary_dim of the spec (blending re-positions keys)
};

struct kdn_op {
  std::shared_ptr<kdn::store::Runtime> runtime;  // first: released last
  std::shared_ptr<kdn::store::EngineOp> rep;
  kdn::store::LoadOp* load = nullptr;  // set for loads
  kdn::store::SaveOp* save = nullptr;  // set for saves
};

namespace {

using kdn::store::ViewSpec;

// The shims cast these C values to core ones: the numbers must agree.
static_assert(static_cast<int>(kdn::kernels::RopeScaling::kNone) == KDN_ROPE_SCALING_NONE);
static_assert(static_cast<int>(kdn::kernels::RopeScaling::kLinear) == KDN_ROPE_SCALING_LINEAR);
static_assert(static_cast<int>(kdn::kernels::RopeScaling::kNtk) == KDN_ROPE_SCALING_NTK);
static_assert(static_cast<int>(kdn::store::ViewLayout::kContiguous) == KDN_LAYOUT_CONTIGUOUS);
static_assert(static_cast<int>(kdn::store::ViewLayout::kPagedNhd) == KDN_LAYOUT_PAGED_NHD);
static_assert(static_cast<int>(kdn::store::ViewLayout::kPagedHnd) == KDN_LAYOUT_PAGED_HND);
static_assert(static_cast<int>(kdn::Code::kInvalidArgument) == KDN_ERR_INVALID_ARGUMENT);
static_assert(static_cast<int>(kdn::Code::kNotFound) == KDN_ERR_NOT_FOUND);
static_assert(static_cast<int>(kdn::Code::kBusy) == KDN_ERR_BUSY);
static_assert(static_cast<int>(kdn::Code::kUnavailable) == KDN_ERR_UNAVAILABLE);
static_assert(static_cast<int>(kdn::Code::kCorrupt) == KDN_ERR_CORRUPT);
static_assert(static_cast<int>(kdn::Code::kUnsupported) == KDN_ERR_UNSUPPORTED);
static_assert(static_cast<int>(kdn::Code::kNoMemory) == KDN_ERR_NO_MEMORY);
static_assert(static_cast<int>(kdn::Code::kInternal) == KDN_ERR_INTERNAL);
static_assert(static_cast<int>(kdn::Code::kTimeout) == KDN_ERR_TIMEOUT);
static_assert(static_cast<int>(kdn::Code::kCancelled) == KDN_ERR_CANCELLED);
static_assert(static_cast<int>(kdn::Code::kVersion) == KDN_ERR_VERSION);
static_assert(static_cast<int>(kdn::Code::kBufferTooSmall) == KDN_ERR_BUFFER_TOO_SMALL);

thread_local std::string g_last_error;
// Set while this thread runs an editor callback (the runtime's mover
// thread): calls that could wait for that thread are refused there.
thread_local bool t_in_editor = false;

// The value of an enum field or argument from a C caller, as an integer: C
// lets any int through, and loading a value outside a C++ enum's range is
// undefined behaviour, so the shims never read a caller's enum as an enum.
template <typename E>
int32_t Raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t));
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// Struct sizes above this are not a struct.
constexpr uint32_t kMaxStructSize = 65536;

kdn_status Fail(kdn_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

kdn_status FromStatus(const kdn::Status& s) {
  if (s.ok()) return KDN_OK;
  return Fail(static_cast<kdn_status>(static_cast<int>(s.code())), s.message());
}

std::string VersionString() {
  return std::to_string(KDN_VERSION_MAJOR) + "." + std::to_string(KDN_VERSION_MINOR) + "." +
         std::to_string(KDN_VERSION_PATCH);
}

// Checks a struct_size against the struct's first published size and, for
// a caller built with a larger struct, that every byte this library does not
// know is zero (a field set there asks for a feature this library lacks).
kdn_status CheckSize(const void* p, uint32_t size, size_t known, uint32_t v1, const char* name) {
  if (size < v1) {
    return Fail(KDN_ERR_VERSION, std::string(name) + ": struct_size " + std::to_string(size) +
                                     " is below its first published size " + std::to_string(v1) +
                                     " (initialise it with " + name + "_init(&s, sizeof s))");
  }
  if (size > kMaxStructSize) {
    return Fail(KDN_ERR_VERSION, std::string(name) + ": struct_size " + std::to_string(size) + " is not a struct size");
  }
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (size_t i = known; i < size; ++i) {
    if (bytes[i] != 0) {
      return Fail(KDN_ERR_VERSION, std::string(name) + ": the caller's struct (" + std::to_string(size) +
                                       " bytes) sets a field at byte " + std::to_string(i) + " that kdn " +
                                       VersionString() + " does not know (it knows " + std::to_string(known) +
                                       " bytes): it needs a newer library");
    }
  }
  return KDN_OK;
}

// Reads a caller's input struct over the defaults in *out.
template <typename T>
kdn_status ReadIn(const T* in, uint32_t v1, const char* name, T* out) {
  if (kdn_status s = CheckSize(in, in->struct_size, sizeof(T), v1, name); s != KDN_OK) return s;
  std::memcpy(out, in, std::min<size_t>(in->struct_size, sizeof(T)));
  out->struct_size = static_cast<uint32_t>(sizeof(T));
  return KDN_OK;
}

kdn_status CheckReserved(uint32_t reserved, const std::string& name) {
  if (reserved == 0) return KDN_OK;
  return Fail(KDN_ERR_VERSION, name + ": reserved0 is set; it is reserved for later versions and must be 0");
}

// The C name of a struct that travels in arrays, for messages.
template <typename T>
const char* StructName() {
  if constexpr (std::is_same_v<T, const kdn_tier_config>) return "kdn_tier_config";
  if constexpr (std::is_same_v<T, const kdn_request>) return "kdn_request";
  if constexpr (std::is_same_v<T, const kdn_kv_view>) return "kdn_kv_view";
  if constexpr (std::is_same_v<T, kdn_lookup_result>) return "kdn_lookup_result";
  if constexpr (std::is_same_v<T, kdn_document_info>) return "kdn_document_info";
  if constexpr (std::is_same_v<T, const kdn_blend_segment>) return "kdn_blend_segment";
  return "struct";
}

// Element i of an array of versioned structs, at the caller's stride.
template <typename T>
T* At(T* array, size_t stride, size_t i) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(array) + i * stride);
}

// The stride of an array of versioned structs: its first element's
// struct_size, which every element must carry.
template <typename T>
kdn_status ArrayStride(const T* array, size_t count, uint32_t v1, const char* name, size_t* stride) {
  const uint32_t size = array[0].struct_size;
  if (size < v1 || size > kMaxStructSize || size % alignof(T) != 0) {
    return Fail(KDN_ERR_VERSION, std::string(name) + "[0] (" + StructName<T>() + "): struct_size " +
                                     std::to_string(size) + " is not a size of this struct (its first published size is " +
                                     std::to_string(v1) + "; initialise it with " + StructName<T>() +
                                     "_init(&s, sizeof s))");
  }
  for (size_t i = 1; i < count; ++i) {
    const uint32_t s = At(array, size, i)->struct_size;
    if (s != size) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, std::string(name) + "[" + std::to_string(i) + "]: struct_size " +
                                                std::to_string(s) + " differs from element 0's " +
                                                std::to_string(size) + " (an array has one element size)");
    }
  }
  *stride = size;
  return KDN_OK;
}

// Checks a caller's output struct before anything is written.
template <typename T>
kdn_status CheckOut(const T* out, uint32_t v1, const char* name) {
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, std::string(name) + " output is NULL");
  const uint32_t size = out->struct_size;
  if (size < v1 || size > kMaxStructSize) {
    return Fail(KDN_ERR_VERSION, std::string(name) + ": struct_size " + std::to_string(size) +
                                     " is not a size of this struct (initialise it with " + name +
                                     "_init(&s, sizeof s))");
  }
  return KDN_OK;
}

// Copies `full` into the caller's struct as far as its struct_size reaches,
// zeroes the tail this library does not know, and says how much it filled.
template <typename T>
void WriteOut(const T& full, T* out) {
  const size_t size = out->struct_size;
  const size_t n = std::min(size, sizeof(T));
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(uint32_t), reinterpret_cast<const char*>(&full) + sizeof(uint32_t),
              n - sizeof(uint32_t));
  if (size > sizeof(T)) std::memset(reinterpret_cast<char*>(out) + sizeof(T), 0, size - sizeof(T));
  out->filled_size = static_cast<uint32_t>(n);
}

// Writes a struct's defaults into a caller's struct of `size` bytes.
template <typename T>
kdn_status InitStruct(T* p, size_t size, uint32_t v1, const T& defaults, const char* name) {
  g_last_error.clear();
  if (p == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, std::string(name) + "_init: the struct is NULL");
  if (size < v1 || size > kMaxStructSize) {
    return Fail(KDN_ERR_VERSION, std::string(name) + "_init: size " + std::to_string(size) +
                                     " is not a size of this struct (its first published size is " +
                                     std::to_string(v1) + ")");
  }
  std::memset(static_cast<void*>(p), 0, size);
  std::memcpy(static_cast<void*>(p), &defaults, std::min(size, sizeof(T)));
  p->struct_size = static_cast<uint32_t>(size);
  return KDN_OK;
}

// Inside an editor, on the store's mover thread, a handle's release may be
// the runtime's last reference, and freeing the runtime joins that very
// thread: the release runs on a thread of its own instead, after the
// callback returns. Without a thread to run it on, the handle leaks rather
// than abort.
template <typename F>
bool ReleasedElsewhereInEditor(F release) {
  if (!t_in_editor) return false;
  try {
    std::thread(std::move(release)).detach();
  } catch (...) {
  }
  return true;
}

kdn_status NotInEditor() {
  if (!t_in_editor) return KDN_OK;
  return Fail(KDN_ERR_INVALID_ARGUMENT,
              "called from inside an editor callback: the editor runs on the runtime's mover thread, which this call "
              "could wait for; only calls that take no runtime, model or op are allowed there");
}

// An editor callback as the store's ChunkEditor.
class CallbackEditor final : public kdn::store::ChunkEditor {
 public:
  CallbackEditor(kdn_edit_fn fn, void* user) : fn_(fn), user_(user) {}
  kdn::Result<bool> Edit(kdn::store::Chunk& chunk) override {
    kdn_chunk_info info = KDN_CHUNK_INFO_INIT;
    info.filled_size = sizeof info;
    info.num_layers = chunk.meta.layers;
    info.num_kv_heads = chunk.meta.kv_heads;
    info.head_dim = chunk.meta.head_dim;
    info.num_tokens = chunk.meta.tokens;
    info.dtype = static_cast<kdn_dtype>(chunk.meta.dtype);
    info.first_position = chunk.meta.first_position;
    std::memcpy(info.model_fingerprint, chunk.meta.model.data(), 32);
    int changed = 0;
    t_in_editor = true;
    const kdn_status s = fn_(user_, &info, chunk.payload.data(), chunk.payload.size(), &changed);
    t_in_editor = false;
    if (s != KDN_OK) return kdn::Status(kdn::Code::kInternal, "editor callback failed with status " + std::to_string(s));
    return changed != 0;
  }

 private:
  kdn_edit_fn fn_;
  void* user_;
};

kdn_op_state StateOf(kdn::store::OpState s) {
  switch (s) {
    case kdn::store::OpState::kPending: return KDN_OP_PENDING;
    case kdn::store::OpState::kDone: return KDN_OP_DONE;
    case kdn::store::OpState::kFailed: return KDN_OP_FAILED;
    case kdn::store::OpState::kCancelled: return KDN_OP_CANCELLED;
  }
  return KDN_OP_FAILED;
}

kdn_status CheckDocId(const char* doc_id, size_t len) {
  if (doc_id == nullptr || len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "doc_id is empty");
  if (len > 255) return Fail(KDN_ERR_INVALID_ARGUMENT, "doc_id longer than 255 bytes");
  if (std::memchr(doc_id, '\0', len) != nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "doc_id contains a NUL byte");
  return KDN_OK;
}

kdn_status CheckTarget(const kdn_model* model, const char* ns, size_t ns_len) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (ns == nullptr || ns_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace is empty: every call names its tenant");
  if (ns_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace longer than 4096 bytes");
  return KDN_OK;
}

kdn_status CheckRuntime(const kdn_runtime* rt) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (rt == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  return KDN_OK;
}

kdn_status CheckOp(const kdn_op* op) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  return KDN_OK;
}

kdn_status CheckTokens(const int32_t* tokens, size_t num_tokens, const std::string& what) {
  if (num_tokens == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": no tokens (num_tokens is 0)");
  if (tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": tokens is NULL");
  if (num_tokens > (size_t{1} << 32)) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": more than 2^32 tokens");
  for (size_t i = 0; i < num_tokens; ++i) {
    if (tokens[i] < 0) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": token " + std::to_string(i) + " has negative id " +
                                                std::to_string(tokens[i]));
    }
  }
  return KDN_OK;
}

// A request's keys, copied (asynchronous ops outlive the caller's arrays).
kdn_status ReadRequest(const kdn::store::KvStore& store, const kdn_request* in, const std::string& what,
                       kdn::store::OwnedKeys* out, std::uint64_t* target_us = nullptr) {
  if (in == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + " is NULL");
  kdn_request r = KDN_REQUEST_INIT;
  if (kdn_status s = ReadIn(in, KDN_REQUEST_SIZE_V1, "kdn_request", &r); s != KDN_OK) return s;
  if (kdn_status s = CheckReserved(r.reserved0, what); s != KDN_OK) return s;
  if (r.ttft_target_us > std::uint64_t{3600} * 1000000) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": ttft_target_us is over an hour (microseconds, not nanoseconds?)");
  }
  if (target_us != nullptr) *target_us = r.ttft_target_us;
  if (r.hash_bytes == 0) {
    if (kdn_status s = CheckTokens(r.tokens, r.num_tokens, what); s != KDN_OK) return s;
    out->tokens.assign(r.tokens, r.tokens + r.num_tokens);
    return KDN_OK;
  }
  if (r.hash_bytes > 64) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": hash_bytes must be 1..64");
  if (r.num_blocks == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": no blocks (num_blocks is 0)");
  if (r.block_hashes == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_hashes is NULL");
  if (r.block_tokens == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_tokens is 0");
  if (r.num_blocks > (size_t{1} << 28)) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": too many blocks");
  out->hashes.assign(r.block_hashes, r.block_hashes + r.num_blocks * r.hash_bytes);
  out->hash_bytes = r.hash_bytes;
  out->block_tokens = r.block_tokens;
  if (kdn::Status s = store.CheckKeys(out->keys()); !s.ok()) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": " + s.message());
  return KDN_OK;
}

// The caller's views as core view specs (their arrays still the caller's).
kdn_status ReadViews(const kdn_model* model, const kdn_kv_view* views, size_t num_views, std::vector<ViewSpec>* out) {
  if (num_views == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no KV views (num_views is 0)");
  if (views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "views is NULL");
  if (num_views > static_cast<size_t>(model->kv.shape.layers)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "num_views " + std::to_string(num_views) + " exceeds the model's " +
                                              std::to_string(model->kv.shape.layers) + " layers");
  }
  size_t stride = 0;
  if (kdn_status s = ArrayStride(views, num_views, KDN_KV_VIEW_SIZE_V1, "views", &stride); s != KDN_OK) return s;
  for (size_t i = 0; i < num_views; ++i) {
    const std::string what = "views[" + std::to_string(i) + "]";
    kdn_kv_view v = KDN_KV_VIEW_INIT;
    if (kdn_status s = ReadIn(At(views, stride, i), KDN_KV_VIEW_SIZE_V1, "kdn_kv_view", &v); s != KDN_OK) return s;
    if (kdn_status s = CheckReserved(v.reserved0, what); s != KDN_OK) return s;
    if (Raw(v.memory) != KDN_MEMORY_HOST && Raw(v.memory) != KDN_MEMORY_DEVICE) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown memory kind " + std::to_string(Raw(v.memory)));
    }
    if (const int32_t l = Raw(v.layout); l != KDN_LAYOUT_CONTIGUOUS && l != KDN_LAYOUT_PAGED_NHD && l != KDN_LAYOUT_PAGED_HND) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown layout " + std::to_string(l));
    }
    if (v.num_layers > static_cast<size_t>(model->kv.shape.layers)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": num_layers " + std::to_string(v.num_layers) +
                                                " exceeds the model's " + std::to_string(model->kv.shape.layers));
    }
    if (v.layers != nullptr && v.num_layers == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": layers given, num_layers is 0");
    if (v.block_table == nullptr && v.block_table_len != 0) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_table is NULL with block_table_len > 0");
    }
    if (v.block_table_len > (size_t{1} << 31)) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_table_len is absurd");
    ViewSpec s;
    s.memory = static_cast<std::uint32_t>(Raw(v.memory));
    s.dtype = static_cast<std::uint32_t>(Raw(v.dtype));
    s.layout = static_cast<kdn::store::ViewLayout>(Raw(v.layout));
    if (v.layers != nullptr) s.layers = {v.layers, v.num_layers};
    s.num_layers = v.num_layers;
    s.k_layers = v.k_layers;
    s.v_layers = v.v_layers;
    s.data = v.data;
    s.size_bytes = v.size_bytes;
    s.stride_layer = v.stride_layer;
    s.stride_kv = v.stride_kv;
    s.stride_token = v.stride_token;
    s.stride_head = v.stride_head;
    s.stride_dim = v.stride_dim;
    s.v_stride_token = v.v_stride_token;
    s.v_stride_head = v.v_stride_head;
    s.v_stride_dim = v.v_stride_dim;
    s.num_tokens = v.num_tokens;
    s.layer_elements = v.layer_elements;
    s.block_size = v.block_size;
    if (v.block_table != nullptr) s.block_table = {v.block_table, v.block_table_len};
    s.num_blocks = v.num_blocks;
    s.block_stride = v.block_stride;
    out->push_back(s);
  }
  return KDN_OK;
}

// Views checked against the model for `tokens` tokens (nullopt: their room).
// Views in device memory only where `device_ok` (the calls that deliver to
// a device) and the runtime has a device.
kdn_status ResolveViews(const kdn_model* model, const kdn_kv_view* views, size_t num_views,
                        std::optional<std::uint64_t> tokens, kdn::store::ResolvedViews* out, bool device_ok = false) {
  std::vector<ViewSpec> specs;
  if (kdn_status s = ReadViews(model, views, num_views, &specs); s != KDN_OK) return s;
  auto r = kdn::store::ResolvedViews::Resolve(model->kv, specs, tokens);
  if (!r.ok()) return FromStatus(r.status());
  if (r->device() && !device_ok) {
    return Fail(KDN_ERR_UNSUPPORTED, "KV views in device memory are taken by kdn_kv_store, kdn_kv_retrieve, "
                                     "kdn_kv_load_async and kdn_kv_save_async only");
  }
  if (r->device() && model->runtime->store().device() == nullptr) {
    return Fail(KDN_ERR_UNSUPPORTED, "KV views in device memory: this runtime has no device (no usable GPU, or "
                                     "device = KDN_DEVICE_NONE; KDN_DEVICE_EMULATED stands host memory in for one)");
  }
  *out = std::move(r).value();
  return KDN_OK;
}

// A request's TTFT target as the store's delivery scope (none for 0).
void Deliver(std::optional<kdn::store::DeliveryScope>& scope, std::uint64_t target_us) {
  if (target_us == 0) return;
  kdn::store::DeliveryTarget t;
  t.deadline_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count() +
                  static_cast<std::int64_t>(target_us) * 1000;
  scope.emplace(t);
}

// What every KV call of a request checks first: the model and namespace,
// the request's keys (copied), and the views resolved for its length.
kdn_status ReadKvCall(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                      const kdn_kv_view* views, size_t num_views, kdn::store::OwnedKeys* keys,
                      kdn::store::ResolvedViews* resolved, std::uint64_t* target_us = nullptr) {
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = ReadRequest(model->runtime->store(), request, "request", keys, target_us); s != KDN_OK) return s;
  return ResolveViews(model, views, num_views, keys->keys().size(), resolved, /*device_ok=*/true);
}

// Starts a load or save op and wraps it in a handle.
template <typename OpT, typename StartFn>
kdn_status StartOp(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                   const kdn_kv_view* views, size_t num_views, kdn_op** out, OpT* kdn_op::*member, StartFn start) {
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  kdn::store::OwnedKeys keys;
  kdn::store::ResolvedViews resolved;
  std::uint64_t target_us = 0;
  if (kdn_status s = ReadKvCall(model, ns, ns_len, request, views, num_views, &keys, &resolved, &target_us); s != KDN_OK) {
    return s;
  }
  std::optional<kdn::store::DeliveryScope> delivery;  // a load op takes the target with it
  Deliver(delivery, target_us);
  auto op = start(*model->runtime, model->kv, std::string(ns, ns_len), std::move(keys), resolved);
  if (!op.ok()) return FromStatus(op.status());
  auto handle = std::make_unique<kdn_op>();
  handle->runtime = model->runtime;
  handle.get()->*member = op->get();
  handle->rep = std::move(op).value();
  *out = handle.release();
  return KDN_OK;
}

}  // namespace

#define KDN_BEGIN         \
  g_last_error.clear();   \
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

const char* kdn_status_string(kdn_status status) {
  switch (status) {
    case KDN_OK: return "KDN_OK";
    case KDN_ERR_INVALID_ARGUMENT: return "KDN_ERR_INVALID_ARGUMENT";
    case KDN_ERR_NOT_FOUND: return "KDN_ERR_NOT_FOUND";
    case KDN_ERR_BUSY: return "KDN_ERR_BUSY";
    case KDN_ERR_UNAVAILABLE: return "KDN_ERR_UNAVAILABLE";
    case KDN_ERR_CORRUPT: return "KDN_ERR_CORRUPT";
    case KDN_ERR_UNSUPPORTED: return "KDN_ERR_UNSUPPORTED";
    case KDN_ERR_NO_MEMORY: return "KDN_ERR_NO_MEMORY";
    case KDN_ERR_INTERNAL: return "KDN_ERR_INTERNAL";
    case KDN_ERR_TIMEOUT: return "KDN_ERR_TIMEOUT";
    case KDN_ERR_CANCELLED: return "KDN_ERR_CANCELLED";
    case KDN_ERR_VERSION: return "KDN_ERR_VERSION";
    case KDN_ERR_BUFFER_TOO_SMALL: return "KDN_ERR_BUFFER_TOO_SMALL";
    default: return "KDN_ERR_UNKNOWN";
  }
}

const char* kdn_last_error_message(void) { return g_last_error.c_str(); }

/* ---- init functions ---- */

#define KDN_DEFINE_INIT(type, size_v1, init_macro)                      \
  kdn_status type##_init(type* p, size_t struct_size) {                 \
    static const type defaults = init_macro;                            \
    return InitStruct(p, struct_size, size_v1, defaults, #type);        \
  }

KDN_DEFINE_INIT(kdn_tier_config, KDN_TIER_CONFIG_SIZE_V1, KDN_TIER_CONFIG_INIT)
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
KDN_DEFINE_INIT(kdn_blend_options, sizeof(kdn_blend_options), KDN_BLEND_OPTIONS_INIT)
KDN_DEFINE_INIT(kdn_blend_report, sizeof(kdn_blend_report), KDN_BLEND_REPORT_INIT)

/* ---- runtime ---- */

static kdn_status CreateRuntime(const kdn_runtime_options* options, kdn_edit_fn editor, void* editor_user,
                                kdn_runtime** out) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  if (options != nullptr) {
    if (kdn_status s = ReadIn(options, KDN_RUNTIME_OPTIONS_SIZE_V1, "kdn_runtime_options", &o); s != KDN_OK) return s;
    if (kdn_status s = CheckReserved(o.reserved0, "kdn_runtime_options"); s != KDN_OK) return s;
  }
  if (o.chunk_tokens == 0 || o.chunk_tokens > 65536) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "chunk_tokens " + std::to_string(o.chunk_tokens) + " out of range 1..65536");
  }
  if (o.host_capacity_bytes == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "host_capacity_bytes is 0");
  if (o.num_tiers > KDN_MAX_TIERS) return Fail(KDN_ERR_INVALID_ARGUMENT, "at most " + std::to_string(KDN_MAX_TIERS) + " tiers");
  if (o.num_tiers > 0 && o.tiers == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tiers is NULL");
  if (o.worker_threads > 64) return Fail(KDN_ERR_INVALID_ARGUMENT, "worker_threads " + std::to_string(o.worker_threads) + " above 64");
  kdn::store::StoreOptions so;
  if (o.device_ordinal < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "device_ordinal " + std::to_string(o.device_ordinal) + " is negative");
  switch (Raw(o.device)) {
    case KDN_DEVICE_AUTO: {
      auto d = kdn::store::MakeCudaDevice(o.device_ordinal);
      if (d.ok()) {
        so.device = std::move(d).value();
      } else if (d.status().code() != kdn::Code::kUnsupported) {
        return FromStatus(d.status());  // a GPU, but not that one
      }
      break;
    }
    case KDN_DEVICE_NONE: break;
    case KDN_DEVICE_EMULATED: so.device = kdn::store::MakeEmulatedDevice(); break;
    case KDN_DEVICE_CUDA: {
      auto d = kdn::store::MakeCudaDevice(o.device_ordinal);
      if (!d.ok()) return FromStatus(d.status());
      so.device = std::move(d).value();
      break;
    }
    default: return Fail(KDN_ERR_INVALID_ARGUMENT, "unknown device mode " + std::to_string(Raw(o.device)));
  }
  so.chunk_tokens = o.chunk_tokens;
  so.host_capacity_bytes = o.host_capacity_bytes;
  so.hash_seed = o.hash_seed;
  size_t stride = 0;
  if (o.num_tiers > 0) {
    if (kdn_status s = ArrayStride(o.tiers, o.num_tiers, KDN_TIER_CONFIG_SIZE_V1, "tiers", &stride); s != KDN_OK) return s;
  }
  for (size_t i = 0; i < o.num_tiers; ++i) {
    kdn_tier_config c = KDN_TIER_CONFIG_INIT;
    const std::string what = "tiers[" + std::to_string(i) + "]";
    if (kdn_status s = ReadIn(At(o.tiers, stride, i), KDN_TIER_CONFIG_SIZE_V1, "kdn_tier_config", &c); s != KDN_OK) return s;
    kdn::store::TierSpec t;
    switch (Raw(c.kind)) {
      case KDN_TIER_HOST: t.kind = kdn::store::TierSpec::Kind::kHost; break;
      case KDN_TIER_DEVICE: t.kind = kdn::store::TierSpec::Kind::kDevice; break;
      case KDN_TIER_DISK: t.kind = kdn::store::TierSpec::Kind::kDisk; break;
      case KDN_TIER_REMOTE: t.kind = kdn::store::TierSpec::Kind::kRemote; break;
      case KDN_TIER_REDIS: t.kind = kdn::store::TierSpec::Kind::kRedis; break;
      default: return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown kind " + std::to_string(Raw(c.kind)));
    }
    if (c.reserved1 != 0) return Fail(KDN_ERR_VERSION, what + ": reserved1 is not 0");
    if ((c.address == nullptr && c.address_len != 0) || (c.token == nullptr && c.token_len != 0)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": address or token is NULL with a length");
    }
    if ((c.tls_ca_file == nullptr && c.tls_ca_file_len != 0) || (c.tls_server_name == nullptr && c.tls_server_name_len != 0)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": tls_ca_file or tls_server_name is NULL with a length");
    }
    if (c.user == nullptr && c.user_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": user is NULL with a length");
    if (c.address_len > 4096 || c.token_len > 4096 || c.tls_ca_file_len > 4096 || c.tls_server_name_len > 4096 ||
        c.user_len > 4096) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": address, token, user or a TLS field longer than 4096 bytes");
    }
    if (Raw(c.kind) == KDN_TIER_REDIS) {
      // A caller older than 1.3 never names this kind; one that does gets
      // user and ttl_ms from its struct, or their defaults when it is shorter.
      if (c.address_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a redis tier needs an address (host:port,...)");
      t.address.assign(c.address, c.address_len);
      if (c.token_len != 0) t.token.assign(c.token, c.token_len);
      if (c.user_len != 0) t.user.assign(c.user, c.user_len);
      if (t.address.find('\0') != std::string::npos || t.token.find('\0') != std::string::npos ||
          t.user.find('\0') != std::string::npos) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": address, token or user contains a NUL byte");
      }
      if (!t.user.empty() && t.token.empty()) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a redis user needs a password (token)");
      }
      if (c.tls_ca_file_len != 0 || c.tls_server_name_len != 0) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a redis tier has no TLS (tls_ca_file, tls_server_name)");
      }
      t.timeout_ms = c.timeout_ms == 0 ? 2000 : c.timeout_ms;
      t.ttl_ms = c.ttl_ms;
    } else if (c.user_len != 0 || c.ttl_ms != 0) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": user and ttl_ms are for redis tiers only");
    }
    if (Raw(c.kind) == KDN_TIER_REMOTE) {
      if (c.address_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a remote tier needs an address");
      if (c.token_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a remote tier needs a token");
      t.address.assign(c.address, c.address_len);
      t.token.assign(c.token, c.token_len);
      if (t.address.find('\0') != std::string::npos || t.token.find('\0') != std::string::npos) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": address or token contains a NUL byte");
      }
      t.timeout_ms = c.timeout_ms == 0 ? 2000 : c.timeout_ms;
      if (c.tls_ca_file_len != 0) t.tls_ca_file.assign(c.tls_ca_file, c.tls_ca_file_len);
      if (c.tls_server_name_len != 0) t.tls_server_name.assign(c.tls_server_name, c.tls_server_name_len);
      if (t.tls_ca_file.find('\0') != std::string::npos || t.tls_server_name.find('\0') != std::string::npos) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a TLS field contains a NUL byte");
      }
    }
    if (c.capacity_bytes == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": capacity_bytes is 0");
    t.capacity_bytes = c.capacity_bytes;
    if (c.path == nullptr && c.path_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": path is NULL");
    if (c.path_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": path longer than 4096 bytes");
    if (Raw(c.kind) == KDN_TIER_DISK) {
      if (c.path == nullptr || c.path_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a disk tier needs a path");
      // The file system would see only the part before it.
      if (std::memchr(c.path, '\0', c.path_len) != nullptr) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": path contains a NUL byte");
      }
      t.path.assign(c.path, c.path_len);
    }
    switch (Raw(c.policy)) {
      case KDN_EVICT_LRU: t.policy = kdn::store::PolicyKind::kLru; break;
      case KDN_EVICT_S3FIFO: t.policy = kdn::store::PolicyKind::kS3Fifo; break;
      case KDN_EVICT_COST: t.policy = kdn::store::PolicyKind::kCost; break;
      default: return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown eviction policy " + std::to_string(Raw(c.policy)));
    }
    t.high_watermark = c.high_watermark == 0.0f ? 0.95 : c.high_watermark;
    t.low_watermark = c.low_watermark == 0.0f ? std::min(0.85, t.high_watermark) : c.low_watermark;
    if (!(t.low_watermark > 0 && t.low_watermark <= t.high_watermark && t.high_watermark <= 1.0)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": watermarks must satisfy 0 < low <= high <= 1");
    }
    t.write_through = c.write_through != 0;
    if (c.codec == nullptr && c.codec_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": codec is NULL");
    if (c.codec_len > 256) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": codec spec longer than 256 bytes");
    if (c.codec != nullptr) t.codec.assign(c.codec, c.codec_len);  // empty: the kind's default
    if (c.levels == nullptr && c.levels_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": levels is NULL");
    if (c.levels_len > 2048) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": levels longer than 2048 bytes");
    if (c.levels_len != 0) {
      if (Raw(c.kind) != KDN_TIER_REMOTE && Raw(c.kind) != KDN_TIER_REDIS) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": quality levels are for remote and redis tiers");
      }
      if (c.codec_len != 0) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a tier with levels takes no codec (its levels are its codecs)");
      }
      const std::string all(c.levels, c.levels_len);
      size_t at = 0;
      while (at <= all.size()) {
        size_t end = all.find(';', at);
        if (end == std::string::npos) end = all.size();
        std::string level = all.substr(at, end - at);
        while (!level.empty() && level.front() == ' ') level.erase(level.begin());
        while (!level.empty() && level.back() == ' ') level.pop_back();
        if (level.empty()) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": an empty level in '" + all + "'");
        t.levels.push_back(level);
        at = end + 1;
      }
    }
    so.tiers.push_back(t);
  }
  if (editor) so.editor = std::make_shared<CallbackEditor>(editor, editor_user);
  auto rt = kdn::store::Runtime::Create(so, o.worker_threads == 0 ? 2 : static_cast<int>(o.worker_threads));
  if (!rt.ok()) return FromStatus(rt.status());
  auto handle = std::make_unique<kdn_runtime>();
  handle->rep = std::move(rt).value();
  *out = handle.release();
  return KDN_OK;
}

kdn_status kdn_runtime_create(const kdn_runtime_options* options, kdn_runtime** out) {
  KDN_BEGIN
  return CreateRuntime(options, nullptr, nullptr, out);
  KDN_END
}

kdn_status kdn_runtime_create_with_editor(const kdn_runtime_options* options, kdn_edit_fn editor, void* user,
                                          kdn_runtime** out) {
  KDN_BEGIN
  if (out != nullptr) *out = nullptr;
  if (editor == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "editor is NULL (use kdn_runtime_create)");
  return CreateRuntime(options, editor, user, out);
  KDN_END
}

void kdn_runtime_destroy(kdn_runtime* runtime) {
  // The last reference (this one, or a model's or op's later) finishes the
  // queued loads and saves and frees the store.
  if (runtime == nullptr || ReleasedElsewhereInEditor([runtime] { delete runtime; })) return;
  delete runtime;
}

kdn_status kdn_runtime_get_stats(kdn_runtime* runtime, kdn_stats* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_STATS_SIZE_V1, "kdn_stats"); s != KDN_OK) return s;
  WriteOut(kdn_stats(KDN_STATS_INIT), out);
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  kdn::store::KvStore& store = runtime->rep->store();
  const kdn::store::Telemetry t = store.Stats();
  const kdn::store::StoreCounters c = store.chain().Counters();
  kdn_stats full = KDN_STATS_INIT;
  full.lookups = t.lookups;
  full.retrieves = t.retrieves;
  full.stores = t.stores;
  full.hits = t.hits;
  full.misses = t.misses;
  full.tokens_served = t.tokens_served;
  full.tokens_stored = t.tokens_stored;
  full.bytes_served = t.bytes_served;
  full.bytes_stored = t.bytes_stored;
  for (const kdn::store::LevelStats& l : store.chain().Stats()) {
    full.chunks += l.objects;
    full.used_bytes += l.used_bytes;
    full.capacity_bytes += l.capacity_bytes;
    full.evictions += l.evictions;
    full.corrupt_detected += l.corrupt_detected;
  }
  full.edited_served = t.edited_served;
  full.leases_active = c.leases_active;
  full.pins_active = c.pins_active;
  full.pins_forced_unpin = c.pins_forced_unpin;
  full.edits = c.edits;
  full.tokens_requested = t.tokens_requested;
  full.prefill_tokens = t.prefill_tokens;
  full.prefill_ns = t.prefill_ns;
  full.ttft_saved_ns = t.ttft_saved_ns;
  full.tokens_served_unpriced = t.tokens_served_unpriced;
  full.delivery_ns = t.delivery_ns;
  full.lookup_tokens = t.lookup_tokens;
  full.lookup_hit_tokens = t.lookup_hit_tokens;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_latency(kdn_runtime* runtime, kdn_latency_kind kind, kdn_latency* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_LATENCY_SIZE_V1, "kdn_latency"); s != KDN_OK) return s;
  WriteOut(kdn_latency(KDN_LATENCY_INIT), out);
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  const kdn::store::Telemetry t = runtime->rep->store().Stats();
  const kdn::telemetry::HistogramSnapshot* h = nullptr;
  switch (Raw(kind)) {
    case KDN_LATENCY_LOOKUP: h = &t.lookup_us; break;
    case KDN_LATENCY_LOAD: h = &t.load_us; break;
    case KDN_LATENCY_STORE: h = &t.store_us; break;
    default: return Fail(KDN_ERR_INVALID_ARGUMENT, "unknown latency kind " + std::to_string(Raw(kind)));
  }
  kdn_latency full = KDN_LATENCY_INIT;
  full.count = h->count;
  full.mean_us = h->mean();
  full.p50_us = h->p50;
  full.p90_us = h->p90;
  full.p99_us = h->p99;
  full.max_us = h->max;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_tier_count(kdn_runtime* runtime, uint32_t* out) {
  KDN_BEGIN
  if (out != nullptr) *out = 0;
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = static_cast<uint32_t>(runtime->rep->store().chain().levels());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_tier_stats(kdn_runtime* runtime, uint32_t index, kdn_tier_stats* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_TIER_STATS_SIZE_V1, "kdn_tier_stats"); s != KDN_OK) return s;
  WriteOut(kdn_tier_stats(KDN_TIER_STATS_INIT), out);
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  const auto levels = runtime->rep->store().chain().Stats();
  if (index >= levels.size()) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "tier " + std::to_string(index) + " of " + std::to_string(levels.size()));
  }
  const kdn::store::LevelStats& l = levels[index];
  kdn_tier_stats full = KDN_TIER_STATS_INIT;
  switch (runtime->rep->tier_kind(index)) {
    case kdn::store::TierSpec::Kind::kHost: full.kind = KDN_TIER_HOST; break;
    case kdn::store::TierSpec::Kind::kDevice: full.kind = KDN_TIER_DEVICE; break;
    case kdn::store::TierSpec::Kind::kDisk: full.kind = KDN_TIER_DISK; break;
    case kdn::store::TierSpec::Kind::kRemote: full.kind = KDN_TIER_REMOTE; break;
    case kdn::store::TierSpec::Kind::kRedis: full.kind = KDN_TIER_REDIS; break;
  }
  std::snprintf(full.name, sizeof full.name, "%s", l.name.c_str());
  std::snprintf(full.codec, sizeof full.codec, "%s", l.codec.c_str());
  full.hits = l.hits;
  full.misses = l.misses;
  full.puts = l.puts;
  full.put_refusals = l.put_refusals;
  full.evictions = l.evictions;
  full.demotions_in = l.demotions_in;
  full.promotions_in = l.promotions_in;
  full.bytes_in = l.bytes_in;
  full.bytes_out = l.bytes_out;
  full.objects = l.objects;
  full.used_bytes = l.used_bytes;
  full.capacity_bytes = l.capacity_bytes;
  full.corrupt_detected = l.corrupt_detected;
  full.encoded_chunks = l.encoded_chunks;
  full.bytes_before_encoding = l.bytes_before_encoding;
  full.bytes_after_encoding = l.bytes_after_encoding;
  full.encode_failures = l.encode_failures;
  full.decode_failures = l.decode_failures;
  full.io_errors = l.io_errors;
  // The watermarks of the tiers that evict (remote and redis tiers leave
  // that to their server: 0).
  const std::vector<kdn::store::TierSpec>& specs = runtime->rep->store().options().tiers;
  if (index < specs.size() && (full.kind == KDN_TIER_HOST || full.kind == KDN_TIER_DEVICE || full.kind == KDN_TIER_DISK)) {
    full.high_watermark = specs[index].high_watermark;
    full.low_watermark = specs[index].low_watermark;
  }
  if (const auto* remote = dynamic_cast<const kdn::store::RemoteTier*>(&runtime->rep->store().chain().tier(index))) {
    const kdn::store::RemoteCounters rc = remote->remote_counters();
    full.remote_calls = rc.calls;
    full.remote_failed_calls = rc.failed_calls;
    full.remote_timeouts = rc.timeouts;
    full.write_queue_full = rc.queue_full;
    full.write_queued_bytes = rc.queued_bytes;
  }
  if (const auto* redis = dynamic_cast<const kdn::store::RedisTier*>(&runtime->rep->store().chain().tier(index))) {
    const kdn::store::RedisCounters rc = redis->redis_counters();
    full.remote_calls = rc.client.commands;
    full.remote_failed_calls = rc.failed_commands;
    full.remote_timeouts = rc.client.timeouts;
  }
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

/* ---- models ---- */

kdn_status kdn_model_create(kdn_runtime* runtime, const kdn_model_spec* spec, kdn_model** out) {
  KDN_BEGIN
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  if (spec == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model spec is NULL");
  kdn_model_spec s = KDN_MODEL_SPEC_INIT;
  if (kdn_status st = ReadIn(spec, KDN_MODEL_SPEC_SIZE_V1, "kdn_model_spec", &s); st != KDN_OK) return st;
  auto bad = [](const std::string& m) { return Fail(KDN_ERR_INVALID_ARGUMENT, "model spec: " + m); };
  if (s.num_layers == 0 || s.num_layers > 4096) return bad("num_layers " + std::to_string(s.num_layers) + " out of range 1..4096");
  if (s.num_kv_heads == 0 || s.num_kv_heads > 4096) return bad("num_kv_heads " + std::to_string(s.num_kv_heads) + " out of range 1..4096");
  if (s.head_dim == 0 || s.head_dim > 65536) return bad("head_dim " + std::to_string(s.head_dim) + " out of range 1..65536");
  const int32_t dtype = Raw(s.dtype), rope_style = Raw(s.rope_style);
  const auto elem = static_cast<int64_t>(dtype < 0 ? 0 : kdn::DtypeBytes(static_cast<uint32_t>(dtype)));
  if (elem == 0) return bad("unknown dtype " + std::to_string(dtype));
  if (rope_style != KDN_ROPE_INTERLEAVED && rope_style != KDN_ROPE_NEOX) {
    return bad("unknown rope_style " + std::to_string(rope_style));
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
  id.dtype = static_cast<uint32_t>(dtype);
  id.rope_theta = s.rope_theta;
  id.rope_style = static_cast<uint32_t>(rope_style);
  id.rotary_dim = rotary;
  id.fingerprint.assign(s.fingerprint, s.fingerprint_len);
  auto m = std::make_unique<kdn_model>();
  m->runtime = runtime->rep;
  m->kv.fingerprint = kdn::keys::ModelFingerprint(id);
  m->kv.shape = {s.num_layers, s.num_kv_heads, s.head_dim, elem};
  m->kv.dtype = static_cast<uint32_t>(dtype);
  m->rope.head_dim = static_cast<int>(s.head_dim);
  m->rope.rotary_dim = static_cast<int>(rotary);
  m->rope.theta = s.rope_theta;
  m->rope.style = rope_style == KDN_ROPE_NEOX ? kdn::kernels::RopeStyle::kNeox : kdn::kernels::RopeStyle::kInterleaved;
  *out = m.release();
  return KDN_OK;
  KDN_END
}

void kdn_model_destroy(kdn_model* model) {
  if (model == nullptr || ReleasedElsewhereInEditor([model] { delete model; })) return;
  delete model;
}

kdn_status kdn_model_get_fingerprint(const kdn_model* model, uint8_t out[32]) {
  KDN_BEGIN
  if (out != nullptr) std::memset(out, 0, 32);
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  std::memcpy(out, model->kv.fingerprint.data(), 32);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_model_get_kv_bytes_per_token(const kdn_model* model, uint64_t* out) {
  KDN_BEGIN
  if (out != nullptr) *out = 0;
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = static_cast<uint64_t>(model->kv.bytes_per_token());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_model_report_prefill(const kdn_model* model, uint64_t tokens, uint64_t elapsed_ns) {
  KDN_BEGIN
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  return FromStatus(model->runtime->store().ReportPrefill(model->kv, tokens, elapsed_ns));
  KDN_END
}

/* ---- KV ---- */

kdn_status kdn_kv_lookup(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* requests,
                         size_t num_requests, kdn_lookup_result* results) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (num_requests == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no requests (num_requests is 0)");
  if (requests == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "requests is NULL");
  if (results == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "results is NULL");
  size_t in_stride = 0, out_stride = 0;
  if (kdn_status s = ArrayStride(requests, num_requests, KDN_REQUEST_SIZE_V1, "requests", &in_stride); s != KDN_OK) return s;
  if (kdn_status s = ArrayStride(results, num_requests, KDN_LOOKUP_RESULT_SIZE_V1, "results", &out_stride); s != KDN_OK) {
    return s;
  }
  kdn::store::KvStore& store = model->runtime->store();
  for (size_t i = 0; i < num_requests; ++i) {
    kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
    kdn::store::OwnedKeys keys;
    r.status = ReadRequest(store, At(requests, in_stride, i), "requests[" + std::to_string(i) + "]", &keys);
    if (r.status == KDN_OK) {
      const auto found = store.Lookup(model->kv, std::string_view(ns, ns_len), keys.keys());
      r.cached_tokens = found.tokens;
      r.num_tiers = static_cast<uint32_t>(std::min<size_t>(found.tier_tokens.size(), KDN_MAX_TIERS));
      for (uint32_t t = 0; t < r.num_tiers; ++t) r.tier_tokens[t] = found.tier_tokens[t];
    }
    WriteOut(r, At(results, out_stride, i));
  }
  g_last_error.clear();  // the batch succeeded; each result carries its request's status
  return KDN_OK;
  KDN_END
}

kdn_status kdn_kv_store(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                        const kdn_kv_view* views, size_t num_views, kdn_kv_result* out) {
  KDN_BEGIN
  if (out != nullptr) {
    if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
    WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  }
  kdn::store::OwnedKeys keys;
  kdn::store::ResolvedViews resolved;
  if (kdn_status s = ReadKvCall(model, ns, ns_len, request, views, num_views, &keys, &resolved); s != KDN_OK) return s;
  auto stored = model->runtime->Store(model->kv, std::string_view(ns, ns_len), keys.keys(), resolved);
  if (!stored.ok()) return FromStatus(stored.status());
  if (out != nullptr) {
    kdn_kv_result r = KDN_KV_RESULT_INIT;
    r.state = KDN_OP_DONE;
    r.tokens = *stored;
    WriteOut(r, out);
  }
  return KDN_OK;
  KDN_END
}

kdn_status kdn_kv_retrieve(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                           const kdn_kv_view* views, size_t num_views, kdn_kv_result* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
  WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  kdn::store::OwnedKeys keys;
  kdn::store::ResolvedViews resolved;
  std::uint64_t target_us = 0;
  if (kdn_status s = ReadKvCall(model, ns, ns_len, request, views, num_views, &keys, &resolved, &target_us); s != KDN_OK) {
    return s;
  }
  std::optional<kdn::store::DeliveryScope> delivery;
  Deliver(delivery, target_us);
  auto filled = model->runtime->Retrieve(model->kv, std::string_view(ns, ns_len), keys.keys(), resolved);
  if (!filled.ok()) return FromStatus(filled.status());
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  r.state = KDN_OP_DONE;
  r.tokens = filled->tokens;
  r.covered = filled->covered;
  r.flags = filled->lossy ? KDN_RESULT_LOSSY : 0u;
  WriteOut(r, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_kv_load_async(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                             const kdn_kv_view* views, size_t num_views, kdn_op** out) {
  KDN_BEGIN
  return StartOp(model, ns, ns_len, request, views, num_views, out, &kdn_op::load,
                 [](kdn::store::Runtime& rt, const kdn::store::ModelKv& m, std::string n, kdn::store::OwnedKeys k,
                    const kdn::store::ResolvedViews& v) { return rt.Load(m, std::move(n), std::move(k), v); });
  KDN_END
}

kdn_status kdn_kv_save_async(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                             const kdn_kv_view* views, size_t num_views, kdn_op** out) {
  KDN_BEGIN
  return StartOp(model, ns, ns_len, request, views, num_views, out, &kdn_op::save,
                 [](kdn::store::Runtime& rt, const kdn::store::ModelKv& m, std::string n, kdn::store::OwnedKeys k,
                    const kdn::store::ResolvedViews& v) { return rt.Save(m, std::move(n), std::move(k), v); });
  KDN_END
}

/* ---- ops ---- */

kdn_status kdn_op_layer_ready(kdn_op* op, uint32_t layer) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (op->save == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is not a save");
  return FromStatus(op->save->SaveLayer(layer));
  KDN_END
}

kdn_status kdn_op_wait_layer(kdn_op* op, uint32_t layer, int64_t timeout_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (op->load == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is not a load");
  return FromStatus(op->load->WaitLayer(layer, timeout_ms));
  KDN_END
}

kdn_status kdn_op_wait(kdn_op* op, int64_t timeout_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  return FromStatus(op->rep->Wait(timeout_ms));
  KDN_END
}

kdn_status kdn_op_poll(kdn_op* op, kdn_op_state* out) {
  KDN_BEGIN
  if (out != nullptr) *out = KDN_OP_PENDING;
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = StateOf(op->rep->Poll());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_cancel(kdn_op* op) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  op->rep->Cancel();
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_get_result(kdn_op* op, kdn_kv_result* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
  WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  const kdn::store::OpResult r = op->rep->Outcome();
  kdn_kv_result full = KDN_KV_RESULT_INIT;
  full.state = StateOf(r.state);
  full.status = static_cast<kdn_status>(static_cast<int>(r.status.code()));
  full.tokens = r.tokens;
  full.covered = r.covered;
  full.num_failed = r.failed.size();
  full.flags = r.lossy ? KDN_RESULT_LOSSY : 0u;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_get_failed_ranges(kdn_op* op, kdn_token_range* out, size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (out_count != nullptr) *out_count = 0;
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const kdn::store::OpResult r = op->rep->Outcome();
  *out_count = r.failed.size();
  for (size_t i = 0; i < std::min(capacity, r.failed.size()); ++i) out[i] = {r.failed[i].begin, r.failed[i].end};
  return KDN_OK;
  KDN_END
}

void kdn_op_destroy(kdn_op* op) {
  if (!op) return;
  op->rep->Cancel();
  auto finish = [op] {
    // Nothing reads or writes the caller's KV once this is done: a load
    // runs to its cancel point, a save's queued layer copies finish.
    if (op->load) (void)op->rep->Wait(-1);
    if (op->save) op->save->Drain();
    delete op;  // the runtime reference goes last (member order)
  };
  if (ReleasedElsewhereInEditor(finish)) return;
  finish();
}

/* ---- knowledge ---- */

kdn_status kdn_knowledge_put(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                             size_t doc_id_len, uint64_t version, const char* metadata, size_t metadata_len,
                             const int32_t* tokens, size_t num_tokens, const kdn_kv_view* views, size_t num_views) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (kdn_status s = CheckTokens(tokens, num_tokens, "document"); s != KDN_OK) return s;
  if (metadata == nullptr && metadata_len > 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "metadata is NULL");
  if (metadata_len > (size_t{1} << 20)) return Fail(KDN_ERR_INVALID_ARGUMENT, "metadata longer than 1 MiB");
  kdn::store::ResolvedViews resolved;
  if (kdn_status s = ResolveViews(model, views, num_views, num_tokens, &resolved); s != KDN_OK) return s;
  return FromStatus(model->runtime->knowledge().Put(model->kv, std::string_view(ns, ns_len),
                                                   std::string(doc_id, doc_id_len), version,
                                                   std::string(metadata ? metadata : "", metadata_len),
                                                   {tokens, num_tokens}, resolved));
  KDN_END
}

static void InfoOf(const kdn::store::DocumentInfo& d, int64_t now_ns, kdn_document_info* info) {
  info->doc_id_len = static_cast<uint32_t>(d.doc_id.size());
  std::snprintf(info->doc_id, sizeof info->doc_id, "%s", d.doc_id.c_str());
  info->version = d.version;
  info->num_tokens = d.tokens;
  info->chunks = d.chunks;
  info->chunks_present = d.chunks_present;
  info->pinned = d.pinned ? 1u : 0u;
  info->expires_in_ms = d.expires_at_ns == 0 ? -1 : std::max<int64_t>(0, (d.expires_at_ns - now_ns) / 1000000);
  info->hits = d.hits;
  info->pin_expires_in_ms =
      d.pinned && d.pin_expires_at_ns != 0 ? std::max<int64_t>(0, (d.pin_expires_at_ns - now_ns) / 1000000) : -1;
}

kdn_status kdn_knowledge_get_info(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                                  size_t doc_id_len, kdn_document_info* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_DOCUMENT_INFO_SIZE_V1, "kdn_document_info"); s != KDN_OK) return s;
  WriteOut(kdn_document_info(KDN_DOCUMENT_INFO_INIT), out);
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  auto d = model->runtime->knowledge().Info(model->kv, std::string_view(ns, ns_len), std::string(doc_id, doc_id_len));
  if (!d.ok()) return FromStatus(d.status());
  kdn_document_info info = KDN_DOCUMENT_INFO_INIT;
  InfoOf(*d, model->runtime->store().chain().clock().NowNs(), &info);
  WriteOut(info, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_knowledge_list(const kdn_model* model, const char* ns, size_t ns_len, kdn_document_info* out,
                              size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (out_count != nullptr) *out_count = 0;
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  size_t stride = 0;
  if (capacity > 0) {
    if (kdn_status s = ArrayStride(out, capacity, KDN_DOCUMENT_INFO_SIZE_V1, "out", &stride); s != KDN_OK) return s;
  }
  const auto docs = model->runtime->knowledge().List(model->kv, std::string_view(ns, ns_len));
  const int64_t now = model->runtime->store().chain().clock().NowNs();
  for (size_t i = 0; i < std::min(capacity, docs.size()); ++i) {
    kdn_document_info info = KDN_DOCUMENT_INFO_INIT;
    InfoOf(docs[i], now, &info);
    WriteOut(info, At(out, stride, i));
  }
  *out_count = docs.size();
  return KDN_OK;
  KDN_END
}

kdn_status kdn_knowledge_pin(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                             size_t doc_id_len, int64_t ttl_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (ttl_ms < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms must not be negative");
  if (ttl_ms > (int64_t{1} << 43)) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms above 2^43 (278 years)");
  return FromStatus(model->runtime->knowledge().Pin(model->kv, std::string_view(ns, ns_len),
                                                   std::string(doc_id, doc_id_len), true, ttl_ms * 1000000));
  KDN_END
}

kdn_status kdn_knowledge_unpin(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                               size_t doc_id_len) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  return FromStatus(model->runtime->knowledge().Pin(model->kv, std::string_view(ns, ns_len),
                                                   std::string(doc_id, doc_id_len), false, 0));
  KDN_END
}

kdn_status kdn_knowledge_expire(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                                size_t doc_id_len, int64_t ttl_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (ttl_ms < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms must not be negative");
  if (ttl_ms > (int64_t{1} << 43)) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms above 2^43 (278 years)");
  return FromStatus(model->runtime->knowledge().Expire(model->kv, std::string_view(ns, ns_len),
                                                      std::string(doc_id, doc_id_len), ttl_ms * 1000000));
  KDN_END
}

kdn_status kdn_knowledge_delete(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                                size_t doc_id_len) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  return FromStatus(model->runtime->knowledge().Delete(model->kv, std::string_view(ns, ns_len),
                                                      std::string(doc_id, doc_id_len)));
  KDN_END
}

kdn_status kdn_knowledge_fetch(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                               size_t doc_id_len, const kdn_kv_view* views, size_t num_views, int32_t* tokens,
                               size_t tokens_capacity, kdn_kv_result* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
  WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (tokens_capacity > 0 && tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tokens is NULL");
  if (num_views > 0 && views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "views is NULL");
  std::uint64_t room = UINT64_MAX;
  if (tokens != nullptr) room = tokens_capacity;
  kdn::store::ResolvedViews resolved;
  const bool with_kv = num_views > 0;
  if (with_kv) {
    if (kdn_status s = ResolveViews(model, views, num_views, std::nullopt, &resolved); s != KDN_OK) return s;
    room = std::min(room, resolved.room());
  }
  std::vector<int32_t> doc_tokens;
  bool lossy = false;
  const kdn::Status st = model->runtime->knowledge().Fetch(model->kv, std::string_view(ns, ns_len),
                                                           std::string(doc_id, doc_id_len), with_kv ? &resolved : nullptr,
                                                           room, &doc_tokens, &lossy);
  if (st.ok() || st.code() == kdn::Code::kBufferTooSmall) {
    kdn_kv_result r = KDN_KV_RESULT_INIT;
    r.state = st.ok() ? KDN_OP_DONE : KDN_OP_FAILED;
    r.status = static_cast<kdn_status>(static_cast<int>(st.code()));
    r.tokens = doc_tokens.size();
    r.flags = lossy ? KDN_RESULT_LOSSY : 0u;
    WriteOut(r, out);
  }
  if (!st.ok()) return FromStatus(st);
  if (tokens != nullptr) std::copy(doc_tokens.begin(), doc_tokens.end(), tokens);
  return KDN_OK;
  KDN_END
}

}  // extern "C"

/* ---- blending (experimental) ---- */

namespace {

// The caller's callback as the blender's engine.
class CallbackEngine final : public kdn::blend::LayerEngine {
 public:
  CallbackEngine(const kdn_blend_options& o, int kv_dim) : o_(o), kv_dim_(kv_dim) {}
  kdn::Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                    float* k_layer, float* v_layer, int total) override {
    std::vector<int32_t> ids(tokens.begin(), tokens.end());
    std::vector<int32_t> pos(positions.begin(), positions.end());
    const size_t count = positions.size();
    const kdn_status st =
        o_.layer_fn(o_.user, static_cast<uint32_t>(layer), pos.data(), layer == 0 ? ids.data() : nullptr, count, hidden,
                    count * o_.hidden_dim, o_.hidden_dim, k_layer, v_layer,
                    static_cast<size_t>(total) * static_cast<size_t>(kv_dim_), static_cast<size_t>(total));
    if (st == KDN_OK) return kdn::Status::Ok();
    if (st > 0 || st < KDN_ERR_BUFFER_TOO_SMALL) {
      return kdn::Status::Internal("the blend callback returned an unknown status " + std::to_string(st) +
                                   " at layer " + std::to_string(layer));
    }
    return kdn::Status(static_cast<kdn::Code>(st), "the blend callback failed at layer " + std::to_string(layer) +
                                                       " (" + kdn_status_string(st) + ")");
  }
  int hidden_dim() const override { return static_cast<int>(o_.hidden_dim); }

 private:
  const kdn_blend_options& o_;
  int kv_dim_;
};

}  // namespace

extern "C" kdn_status kdn_kv_blend(const kdn_model* model, const char* ns, size_t ns_len,
                                   const kdn_blend_segment* segments, size_t num_segments,
                                   const kdn_blend_options* options, const kdn_kv_view* views, size_t num_views,
                                   kdn_blend_report* report) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (report != nullptr) {
    if (kdn_status s = CheckOut(report, sizeof(kdn_blend_report), "kdn_blend_report"); s != KDN_OK) return s;
  }
  if (options == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options are NULL (they carry the callback)");
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  if (kdn_status s = ReadIn(options, sizeof(kdn_blend_options), "kdn_blend_options", &o); s != KDN_OK) return s;
  if (o.layer_fn == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: layer_fn is NULL");
  if (o.hidden_dim == 0 || o.hidden_dim > (1u << 20)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: hidden_dim must be 1..2^20");
  }
  if (num_segments == 0 || segments == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no segments");
  if (num_views == 0 || views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no KV views");
  const int layers = static_cast<int>(model->kv.shape.layers);
  kdn::blend::BlendOptions bo;
  bo.ratio = o.ratio;
  bo.threshold = o.threshold;
  if (o.check_layers != nullptr) {
    if (o.num_check_layers > static_cast<size_t>(layers)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: more check layers than model layers");
    }
    bo.check_layers.assign(o.check_layers, o.check_layers + o.num_check_layers);
  } else if (o.num_check_layers != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: check_layers is NULL with num_check_layers > 0");
  } else {
    bo.check_layers = {layers > 1 ? 1 : 0};
  }
  bo.rope = model->rope;
  const int32_t scaling = Raw(o.rope_scaling);
  if (scaling != KDN_ROPE_SCALING_NONE && scaling != KDN_ROPE_SCALING_LINEAR && scaling != KDN_ROPE_SCALING_NTK) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: unknown rope_scaling " + std::to_string(scaling));
  }
  bo.rope.scaling = static_cast<kdn::kernels::RopeScaling>(scaling);
  bo.rope.factor = o.rope_factor;

  size_t stride = 0;
  if (kdn_status s = ArrayStride(segments, num_segments, sizeof(kdn_blend_segment), "segments", &stride); s != KDN_OK) {
    return s;
  }
  std::vector<kdn::blend::Segment> segs;
  for (size_t i = 0; i < num_segments; ++i) {
    const std::string what = "segments[" + std::to_string(i) + "]";
    kdn_blend_segment seg = KDN_BLEND_SEGMENT_INIT;
    if (kdn_status s = ReadIn(At(segments, stride, i), sizeof(kdn_blend_segment), "kdn_blend_segment", &seg); s != KDN_OK) {
      return s;
    }
    kdn::blend::Segment out;
    if (Raw(seg.kind) == KDN_SEGMENT_TOKENS) {
      if (seg.num_tokens > 0) {
        if (kdn_status s = CheckTokens(seg.tokens, seg.num_tokens, what); s != KDN_OK) return s;
        out.tokens.assign(seg.tokens, seg.tokens + seg.num_tokens);
      }
    } else if (Raw(seg.kind) == KDN_SEGMENT_DOCUMENT) {
      if (kdn_status s = CheckDocId(seg.doc_id, seg.doc_id_len); s != KDN_OK) return s;
      out.document = true;
      out.doc_id.assign(seg.doc_id, seg.doc_id_len);
    } else {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown kind " + std::to_string(Raw(seg.kind)));
    }
    segs.push_back(std::move(out));
  }
  std::vector<ViewSpec> specs;
  if (kdn_status s = ReadViews(model, views, num_views, &specs); s != KDN_OK) return s;
  for (const ViewSpec& v : specs) {
    if (v.memory == KDN_MEMORY_DEVICE && model->runtime->store().device() == nullptr) {
      return Fail(KDN_ERR_UNSUPPORTED, "kdn_kv_blend: KV views in device memory: this runtime has no device");
    }
  }
  CallbackEngine engine(o, static_cast<int>(model->kv.shape.heads * model->kv.shape.head_dim));
  auto r = kdn::blend::BlendDocuments(model->runtime->knowledge(), model->kv, std::string_view(ns, ns_len), segs, bo,
                                      engine, specs);
  if (!r.ok()) return FromStatus(r.status());
  // The prefill the blend saved: the context's positions x the share of
  // the layer x position work not recomputed (kdn_stats.ttft_saved_ns).
  model->runtime->store().CountBlendSaving(model->kv,
                                           static_cast<double>(r->positions) * (1.0 - r->recompute_fraction));
  if (report != nullptr) {
    kdn_blend_report full = KDN_BLEND_REPORT_INIT;
    full.positions = static_cast<uint32_t>(r->positions);
    full.cached_positions = static_cast<uint32_t>(r->cached_positions);
    full.fresh_positions = static_cast<uint32_t>(r->fresh_positions);
    full.selected = static_cast<uint32_t>(r->selected);
    full.recompute_fraction = r->recompute_fraction;
    WriteOut(full, report);
  }
  return KDN_OK;
  KDN_END
}

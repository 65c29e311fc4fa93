// SPDX-License-Identifier: Apache-2.0
// What every extern "C" shim over kdn::core uses: the handles, the struct
// mechanics (sizes, reading callers' structs, writing outputs), errors (the
// thread's last message, Status to kdn_status) and KDN_BEGIN/KDN_END. The
// shims themselves are one file per handle (runtime.cc, model.cc, kv.cc,
// op.cc, knowledge.cc, blend.cc; structs.cc the _init functions, errors.cc
// versions and messages): they translate C structs to core types, check what
// only the C side can get wrong (NULL pointers, struct sizes, enum values),
// and forward. Logic that C++ callers need too lives in core/
// (runtime/runtime.h, engine/kv_views.h, knowledge/blend_documents.h). Each body runs
// inside KDN_BEGIN/KDN_END, which turn any exception into a status and the
// thread's last-error message.
#pragma once

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

#include "core/engine/groups.h"
#include "core/knowledge/blend_documents.h"
#include "core/keys/hash.h"
#include "core/tiers/tier_spec.h"
#include "core/runtime/runtime.h"
#include "core/util/dtype.h"

struct kdn_runtime {
  std::shared_ptr<kdn::store::Runtime> rep;
};

struct kdn_model {
  std::shared_ptr<kdn::store::Runtime> runtime;  // keeps the store alive
  kdn::store::ModelKv kv;
  // Theta, style, rotary_dim of the spec (blending re-positions keys); a
  // latent model's: one head of its latent_rope_dim RoPE dims.
  kdn::kernels::RopeSpec rope;
  // KDN_CACHE_LATENT: the latent's dims (kv.shape is then 1 head of
  // latent_dim / 2: its first half is kept as "K", its second as "V"; the
  // views are translated so, docs/model-kinds.md). 0: K and V.
  std::uint32_t latent_dim = 0;
  // A model with sliding-window or recurrent layers, kept in layer groups
  // (engine/groups.h; kdn_model_spec.layer_windows / num_state_layers):
  // every KV call goes through them. Null: one group, the plain paths.
  std::shared_ptr<const kdn::store::GroupedModel> grouped;
};

struct kdn_op {
  std::shared_ptr<kdn::store::Runtime> runtime;  // first: released last
  std::shared_ptr<kdn::store::EngineOp> rep;
  kdn::store::LoadOp* load = nullptr;  // set for loads
  kdn::store::SaveOp* save = nullptr;  // set for saves
};

// Internal to libkdn (hidden: -fvisibility=hidden).
namespace kdn::capi {

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

inline thread_local std::string g_last_error;
// Set while this thread runs an editor callback (the runtime's mover
// thread): calls that could wait for that thread are refused there.
inline thread_local bool t_in_editor = false;

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
inline constexpr uint32_t kMaxStructSize = 65536;

inline kdn_status Fail(kdn_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

// A core code as the C ABI's status: the same number for every code kdn.h
// has; core's two that it has not (kdnd's, core/util/status.h) as the
// nearest it has.
constexpr kdn_status AbiStatus(kdn::Code code) {
  switch (code) {
    case kdn::Code::kPermissionDenied: return KDN_ERR_UNAVAILABLE;
    case kdn::Code::kTooLarge: return KDN_ERR_INVALID_ARGUMENT;
    default: return static_cast<kdn_status>(static_cast<int>(code));
  }
}
// Every core code, down to the last (kdn::kLowestCode), is a status kdn.h
// has: a core code added without a mapping here fails the build.
constexpr bool AbiStatusesKnown() {
  for (int c = 0; c >= static_cast<int>(kdn::kLowestCode); --c) {
    const int s = static_cast<int>(AbiStatus(static_cast<kdn::Code>(c)));
    if (s > KDN_OK || s < KDN_ERR_BUFFER_TOO_SMALL) return false;
  }
  return true;
}
static_assert(AbiStatusesKnown(), "a core status code without a kdn_status (AbiStatus)");

inline kdn_status FromStatus(const kdn::Status& s) {
  if (s.ok()) return KDN_OK;
  return Fail(AbiStatus(s.code()), s.message());
}

inline std::string VersionString() {
  return std::to_string(KDN_VERSION_MAJOR) + "." + std::to_string(KDN_VERSION_MINOR) + "." +
         std::to_string(KDN_VERSION_PATCH);
}

// One rule for every struct, single or in an array, input or output: its
// struct_size is a size the struct can have (a multiple of its alignment:
// the compiler pads every version to one), never one that ends inside a
// field.
inline kdn_status CheckAlignedSize(uint32_t size, size_t align, const char* name) {
  if (size % align == 0) return KDN_OK;
  return Fail(KDN_ERR_VERSION, std::string(name) + ": struct_size " + std::to_string(size) +
                                   " is not a size of this struct (every version's size is a multiple of " +
                                   std::to_string(align) + "; initialise it with " + name + "_init(&s, sizeof s))");
}

// Checks a struct_size against the struct's first published size and, for
// a caller built with a larger struct, that every byte this library does not
// know is zero (a field set there asks for a feature this library lacks).
inline kdn_status CheckSize(const void* p, uint32_t size, size_t known, size_t align, uint32_t v1, const char* name) {
  if (size < v1) {
    return Fail(KDN_ERR_VERSION, std::string(name) + ": struct_size " + std::to_string(size) +
                                     " is below its first published size " + std::to_string(v1) +
                                     " (initialise it with " + name + "_init(&s, sizeof s))");
  }
  if (kdn_status s = CheckAlignedSize(size, align, name); s != KDN_OK) return s;
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
  if (kdn_status s = CheckSize(in, in->struct_size, sizeof(T), alignof(T), v1, name); s != KDN_OK) return s;
  std::memcpy(out, in, std::min<size_t>(in->struct_size, sizeof(T)));
  out->struct_size = static_cast<uint32_t>(sizeof(T));
  return KDN_OK;
}

inline kdn_status CheckReserved(uint32_t reserved, const std::string& name) {
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
  if constexpr (std::is_same_v<T, const kdn_quota>) return "kdn_quota";
  if constexpr (std::is_same_v<T, kdn_quota_stats>) return "kdn_quota_stats";
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
  return CheckAlignedSize(size, alignof(T), name);
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

// An output struct at its defaults as its _init writes them (filled_size 0):
// what a call that fails leaves in it.
template <typename T>
void ResetOut(const T& defaults, T* out) {
  WriteOut(defaults, out);
  out->filled_size = 0;
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

}  // namespace kdn::capi

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

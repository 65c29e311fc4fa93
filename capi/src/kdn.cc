// extern "C" shims over kdn::core. Each body runs inside KDN_BEGIN/KDN_END,
// which turn any exception into a status and the thread's last-error message.
#include "kdn/kdn.h"

#include "blend/blend.h"
#include "common/half.h"
#include "ref/kv_view_ref.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "keys/hash.h"
#include "store/engine_ops.h"
#include "store/knowledge.h"
#include "store/kv_store.h"
#include "util/executor.h"

struct kdn_runtime {
  std::unique_ptr<kdn::store::KvStore> rep;
  std::unique_ptr<kdn::store::KnowledgeIndex> knowledge;
  std::unique_ptr<kdn::Executor> executor;  // destroyed first: finishes queued loads and saves
  std::vector<kdn_tier_kind> tier_kinds;
};

struct kdn_op {
  std::shared_ptr<kdn::store::EngineOp> rep;
  kdn::store::LoadOp* load = nullptr;  // set for loads
  kdn::store::SaveOp* save = nullptr;  // set for saves
};

struct kdn_model {
  const kdn_runtime* runtime;
  kdn_dtype dtype;
  kdn::store::ModelKv kv;
  kdn::kernels::RopeSpec rope;  // theta, style, rotary_dim of the spec (blending re-positions keys)
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


// The size of kdn_runtime_options in version 0.1 (before tiers were appended).
constexpr size_t kRuntimeOptionsV1 = offsetof(kdn_runtime_options, tiers);
// The size of kdn_tier_config before the codec was appended.
constexpr size_t kTierConfigV1 = offsetof(kdn_tier_config, codec);

// An editor callback as the store's ChunkEditor.
class CallbackEditor final : public kdn::store::ChunkEditor {
 public:
  CallbackEditor(kdn_edit_fn fn, void* user) : fn_(fn), user_(user) {}
  kdn::Result<bool> Edit(kdn::store::Chunk& chunk) override {
    kdn_chunk_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    info.num_layers = chunk.meta.layers;
    info.num_kv_heads = chunk.meta.kv_heads;
    info.head_dim = chunk.meta.head_dim;
    info.num_tokens = chunk.meta.tokens;
    info.dtype = static_cast<kdn_dtype>(chunk.meta.dtype);
    info.first_position = chunk.meta.first_position;
    std::memcpy(info.model_fingerprint, chunk.meta.model.data(), 32);
    int changed = 0;
    const kdn_status s = fn_(user_, &info, chunk.payload.data(), chunk.payload.size(), &changed);
    if (s != KDN_OK) return kdn::Status(static_cast<kdn::Code>(static_cast<int>(s)), "editor callback failed");
    return changed != 0;
  }

 private:
  kdn_edit_fn fn_;
  void* user_;
};

kdn::store::TokenKeys TokenKeysOf(const int32_t* tokens, size_t n) {
  kdn::store::TokenKeys k;
  k.tokens = {tokens, n};
  return k;
}

kdn_latency Latency(const kdn::telemetry::HistogramSnapshot& h) {
  return kdn_latency{h.count, h.mean(), h.p50, h.p90, h.p99, h.max};
}

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
  return KDN_OK;
}

// Whether a caller's output struct has a usable struct_size.
bool OutSizeOk(uint32_t size) { return size >= 2 * sizeof(uint32_t) && size <= 65536; }

// Copies `full` into the caller's struct as far as its struct_size reaches
// (an older caller's shorter struct gets the fields it knows); keeps its
// struct_size.
template <typename T>
void WriteOut(const T& full, T* out) {
  const size_t size = std::min<size_t>(out->struct_size, sizeof(T));
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(uint32_t), reinterpret_cast<const char*>(&full) + sizeof(uint32_t),
              size - sizeof(uint32_t));
}

int64_t DtypeBytes(kdn_dtype d) {
  switch (d) {
    case KDN_DTYPE_F32: return 4;
    case KDN_DTYPE_F16:
    case KDN_DTYPE_BF16: return 2;
    default: return 0;
  }
}

kdn_status CheckTarget(const kdn_runtime* rt, const kdn_model* model, const char* ns, size_t ns_len) {
  if (rt == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  if (model == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "model is NULL");
  if (model->runtime != rt) return Fail(KDN_ERR_INVALID_ARGUMENT, "model was registered with another runtime");
  if (ns == nullptr || ns_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace is empty: every call names its tenant");
  if (ns_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, "namespace longer than 4096 bytes");
  return KDN_OK;
}

kdn_status CheckTokens(const int32_t* tokens, size_t num_tokens) {
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

kdn_status CheckCall(const kdn_runtime* rt, const kdn_model* model, const char* ns, size_t ns_len,
                     const int32_t* tokens, size_t num_tokens) {
  if (kdn_status s = CheckTarget(rt, model, ns, ns_len); s != KDN_OK) return s;
  return CheckTokens(tokens, num_tokens);
}

// A request's keys, copied (asynchronous ops outlive the caller's arrays).
kdn_status RequestKeys(const kdn_runtime* rt, const kdn_request* in, kdn::store::OwnedKeys* out) {
  if (in == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "request is NULL");
  kdn_request r = KDN_REQUEST_INIT;
  if (kdn_status s = ReadStruct(in, sizeof(kdn_request), "kdn_request", &r); s != KDN_OK) return s;
  if (r.hash_bytes == 0) {
    if (kdn_status s = CheckTokens(r.tokens, r.num_tokens); s != KDN_OK) return s;
    out->tokens.assign(r.tokens, r.tokens + r.num_tokens);
    return KDN_OK;
  }
  if (r.hash_bytes > 64) return Fail(KDN_ERR_INVALID_ARGUMENT, "hash_bytes must be 1..64");
  if (r.num_blocks == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no blocks (num_blocks is 0)");
  if (r.block_hashes == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "block_hashes is NULL");
  if (r.block_tokens == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "block_tokens is 0");
  if (r.num_blocks > (size_t{1} << 28)) return Fail(KDN_ERR_INVALID_ARGUMENT, "too many blocks");
  out->hashes.assign(r.block_hashes, r.block_hashes + r.num_blocks * r.hash_bytes);
  out->hash_bytes = r.hash_bytes;
  out->block_tokens = r.block_tokens;
  return FromStatus(rt->rep->CheckKeys(out->keys()));
}

// The C groups as core groups (their arrays still the caller's: the ops copy them).
kdn_status ReadGroups(const kdn_model* model, const kdn_kv_group* in, size_t n, std::vector<kdn::store::KvGroup>* out) {
  if (n == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no KV groups (num_groups is 0)");
  if (in == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "groups is NULL");
  for (size_t i = 0; i < n; ++i) {
    const std::string what = "KV group " + std::to_string(i);
    kdn_kv_group g = KDN_KV_GROUP_INIT;
    if (kdn_status s = ReadStruct(&in[i], sizeof(kdn_kv_group), what.c_str(), &g); s != KDN_OK) return s;
    kdn_kv_view v = KDN_KV_VIEW_INIT;
    if (kdn_status s = ReadStruct(&g.view, sizeof(kdn_kv_view), (what + " view").c_str(), &v); s != KDN_OK) return s;
    if (g.layers == nullptr || g.num_layers == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": no layers");
    if (v.num_layers != g.num_layers) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": the view has " + std::to_string(v.num_layers) + " layers, the group " +
                                                std::to_string(g.num_layers));
    }
    if (v.memory != KDN_MEMORY_HOST) {
      return Fail(KDN_ERR_UNSUPPORTED, what + ": only host memory views are supported by this version");
    }
    if (v.dtype != model->dtype) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": the view's dtype differs from the model's");
    if (v.k_layers == nullptr || v.v_layers == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": k_layers or v_layers is NULL");
    kdn::store::KvGroup cg;
    cg.layers.assign(g.layers, g.layers + g.num_layers);
    kdn::kernels::KvView& kv = cg.view;
    kv.shape = model->kv.shape;
    kv.shape.layers = static_cast<int64_t>(g.num_layers);
    kv.k_base = v.k_layers;
    kv.v_base = v.v_layers;
    switch (v.layout) {
      case KDN_LAYOUT_CONTIGUOUS:
        kv.paged = false;
        break;
      case KDN_LAYOUT_PAGED_NHD:
      case KDN_LAYOUT_PAGED_HND:
        kv.paged = true;
        kv.order = v.layout == KDN_LAYOUT_PAGED_NHD ? kdn::kernels::PageOrder::kNHD : kdn::kernels::PageOrder::kHND;
        if (v.block_table == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": block_table is NULL");
        break;
      default:
        return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown layout " + std::to_string(v.layout));
    }
    kv.stride_token = v.stride_token;
    kv.stride_head = v.stride_head;
    kv.stride_dim = v.stride_dim;
    kv.v_stride_token = v.v_stride_token;
    kv.v_stride_head = v.v_stride_head;
    kv.v_stride_dim = v.v_stride_dim;
    kv.layer_elements = static_cast<int64_t>(v.layer_elements);
    kv.block_size = v.block_size;
    kv.block_table = v.block_table;
    kv.table_len = static_cast<int64_t>(v.block_table_len);
    kv.num_blocks = static_cast<int64_t>(v.num_blocks);
    kv.block_stride = v.block_stride;
    out->push_back(std::move(cg));
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

// Starts a load or save op (OpT::Start) and wraps it in a handle, whose
// `member` points at it.
template <typename OpT>
kdn_status StartOp(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                   const kdn_request* request, const kdn_kv_group* groups, size_t num_groups, kdn_op** out,
                   OpT* kdn_op::*member) {
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  kdn::store::OwnedKeys keys;
  if (kdn_status s = RequestKeys(runtime, request, &keys); s != KDN_OK) return s;
  std::vector<kdn::store::KvGroup> g;
  if (kdn_status s = ReadGroups(model, groups, num_groups, &g); s != KDN_OK) return s;
  auto op = OpT::Start(*runtime->rep, *runtime->executor, model->kv, std::string(ns, ns_len), std::move(keys), std::move(g));
  if (!op.ok()) return FromStatus(op.status());
  auto handle = std::make_unique<kdn_op>();
  handle.get()->*member = op->get();
  handle->rep = std::move(op).value();
  *out = handle.release();
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
  if (kdn_status s = ReadStruct(options, kRuntimeOptionsV1, "kdn_runtime_options", &o); s != KDN_OK) return s;
  if (o.chunk_tokens == 0 || o.chunk_tokens > 65536) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "chunk_tokens " + std::to_string(o.chunk_tokens) + " out of range 1..65536");
  }
  if (o.host_capacity_bytes == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "host_capacity_bytes is 0");
  if (o.num_tiers > KDN_MAX_TIERS) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "at most " + std::to_string(KDN_MAX_TIERS) + " tiers");
  }
  if (o.num_tiers > 0 && o.tiers == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tiers is NULL");
  kdn::store::StoreOptions so;
  so.chunk_tokens = o.chunk_tokens;
  so.host_capacity_bytes = o.host_capacity_bytes;
  so.hash_seed = o.hash_seed;
  auto rt = std::make_unique<kdn_runtime>();
  for (size_t i = 0; i < o.num_tiers; ++i) {
    kdn_tier_config c = KDN_TIER_CONFIG_INIT;
    const std::string what = "tier " + std::to_string(i);
    if (kdn_status s = ReadStruct(&o.tiers[i], kTierConfigV1, what.c_str(), &c); s != KDN_OK) return s;
    kdn::store::TierSpec t;
    switch (c.kind) {
      case KDN_TIER_HOST: t.kind = kdn::store::TierSpec::Kind::kHost; break;
      case KDN_TIER_DEVICE: t.kind = kdn::store::TierSpec::Kind::kDevice; break;
      case KDN_TIER_DISK: t.kind = kdn::store::TierSpec::Kind::kDisk; break;
      default: return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown kind " + std::to_string(c.kind));
    }
    if (c.capacity_bytes == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": capacity_bytes is 0");
    t.capacity_bytes = c.capacity_bytes;
    if (c.kind == KDN_TIER_DISK) {
      if (c.path == nullptr || c.path_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": a disk tier needs a path");
      t.path.assign(c.path, c.path_len);
    }
    switch (c.policy) {
      case KDN_EVICT_LRU: t.policy = kdn::store::PolicyKind::kLru; break;
      case KDN_EVICT_S3FIFO: t.policy = kdn::store::PolicyKind::kS3Fifo; break;
      default: return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown eviction policy " + std::to_string(c.policy));
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
    so.tiers.push_back(t);
    rt->tier_kinds.push_back(c.kind);
  }
  if (so.tiers.empty()) rt->tier_kinds.push_back(KDN_TIER_HOST);
  if (o.editor) so.editor = std::make_shared<CallbackEditor>(o.editor, o.editor_user);
  auto store = kdn::store::KvStore::Create(so);
  if (!store.ok()) return FromStatus(store.status());
  rt->rep = std::move(store).value();
  rt->knowledge = std::make_unique<kdn::store::KnowledgeIndex>(*rt->rep);
  rt->executor = std::make_unique<kdn::Executor>(o.worker_threads == 0 ? 2 : static_cast<int>(std::min(o.worker_threads, 64u)));
  *out = rt.release();
  return KDN_OK;
  KDN_END
}

void kdn_runtime_destroy(kdn_runtime* runtime) {
  if (!runtime) return;
  runtime->executor.reset();  // runs queued loads and saves to the end first
  delete runtime;
}

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
  m->kv.dtype = static_cast<uint32_t>(s.dtype);
  m->rope.head_dim = static_cast<int>(s.head_dim);
  m->rope.rotary_dim = static_cast<int>(rotary);
  m->rope.theta = s.rope_theta;
  m->rope.style = s.rope_style == KDN_ROPE_NEOX ? kdn::kernels::RopeStyle::kNeox : kdn::kernels::RopeStyle::kInterleaved;
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
  *out_cached_tokens = runtime->rep->Lookup(model->kv, std::string_view(ns, ns_len), TokenKeysOf(tokens, num_tokens)).tokens;
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
  kdn::store::KvBufferView buffer;
  if (kdn_status s = ResolveKv(model, kv, num_tokens, &buffer); s != KDN_OK) return s;
  const kdn::store::BufferAsView view(model->kv, buffer);
  auto stored = runtime->rep->Store(model->kv, std::string_view(ns, ns_len), TokenKeysOf(tokens, num_tokens), view.view());
  if (!stored.ok()) return FromStatus(stored.status());
  if (out_stored_tokens) *out_stored_tokens = *stored;
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
  kdn::store::KvBufferView buffer;
  if (kdn_status s = ResolveKv(model, kv, num_tokens, &buffer); s != KDN_OK) return s;
  const kdn::store::BufferAsView view(model->kv, buffer);
  const uint64_t filled =
      runtime->rep->Retrieve(model->kv, std::string_view(ns, ns_len), TokenKeysOf(tokens, num_tokens), view.view());
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
  if (!OutSizeOk(size)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "kdn_stats: struct_size " + std::to_string(size) +
                                              " is wrong (initialise it with KDN_STATS_INIT)");
  }
  const kdn::store::Telemetry t = runtime->rep->Stats();
  const kdn::store::StoreCounters c = runtime->rep->chain().Counters();
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
  for (const kdn::store::LevelStats& l : runtime->rep->chain().Stats()) {
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
  full.lookup = Latency(t.lookup_us);
  full.load = Latency(t.load_us);
  full.store = Latency(t.store_us);
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

void kdn_tier_config_init(kdn_tier_config* config) {
  if (config) *config = KDN_TIER_CONFIG_INIT;
}
void kdn_kv_view_init(kdn_kv_view* view) {
  if (view) *view = KDN_KV_VIEW_INIT;
}

kdn_status kdn_runtime_tier_count(kdn_runtime* runtime, uint32_t* out) {
  KDN_BEGIN
  if (runtime == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = static_cast<uint32_t>(runtime->rep->chain().levels());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_tier_stats(kdn_runtime* runtime, uint32_t index, kdn_tier_stats* out) {
  KDN_BEGIN
  if (runtime == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "runtime is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const uint32_t size = out->struct_size;
  if (!OutSizeOk(size)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "kdn_tier_stats: struct_size " + std::to_string(size) + " is wrong");
  }
  const auto levels = runtime->rep->chain().Stats();
  if (index >= levels.size()) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "tier " + std::to_string(index) + " of " + std::to_string(levels.size()));
  }
  const kdn::store::LevelStats& l = levels[index];
  kdn_tier_stats full = KDN_TIER_STATS_INIT;
  full.kind = runtime->tier_kinds[index];
  std::snprintf(full.name, sizeof full.name, "%s", l.name.c_str());
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
  std::snprintf(full.codec, sizeof full.codec, "%s", l.codec.c_str());
  full.encoded_chunks = l.encoded_chunks;
  full.bytes_before_encoding = l.bytes_before_encoding;
  full.bytes_after_encoding = l.bytes_after_encoding;
  full.encode_failures = l.encode_failures;
  full.decode_failures = l.decode_failures;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_lookup_batch(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                            const kdn_request* requests, size_t num_requests, kdn_lookup_result* results) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (num_requests == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no requests (num_requests is 0)");
  if (requests == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "requests is NULL");
  if (results == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "results is NULL");
  for (size_t i = 0; i < num_requests; ++i) {
    if (!OutSizeOk(results[i].struct_size)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "results[" + std::to_string(i) + "]: struct_size is wrong (use KDN_LOOKUP_RESULT_INIT)");
    }
  }
  for (size_t i = 0; i < num_requests; ++i) {
    kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
    kdn::store::OwnedKeys keys;
    r.status = RequestKeys(runtime, &requests[i], &keys);
    if (r.status == KDN_OK) {
      const auto found = runtime->rep->Lookup(model->kv, std::string_view(ns, ns_len), keys.keys());
      r.cached_tokens = found.tokens;
      r.num_tiers = static_cast<uint32_t>(std::min<size_t>(found.tier_tokens.size(), KDN_MAX_TIERS));
      for (uint32_t t = 0; t < r.num_tiers; ++t) r.tier_tokens[t] = found.tier_tokens[t];
    }
    WriteOut(r, &results[i]);
  }
  g_last_error.clear();  // the batch succeeded; each result carries its request's status
  return KDN_OK;
  KDN_END
}

kdn_status kdn_load_begin(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                          const kdn_request* request, const kdn_kv_group* groups, size_t num_groups, kdn_op** out) {
  KDN_BEGIN
  return StartOp<kdn::store::LoadOp>(runtime, model, ns, ns_len, request, groups, num_groups, out, &kdn_op::load);
  KDN_END
}

kdn_status kdn_op_wait_layer(kdn_op* op, uint32_t layer, int64_t timeout_ms) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  if (op->load == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is not a load");
  return FromStatus(op->load->WaitLayer(layer, timeout_ms));
  KDN_END
}

kdn_status kdn_save_begin(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                          const kdn_request* request, const kdn_kv_group* groups, size_t num_groups, kdn_op** out) {
  KDN_BEGIN
  return StartOp<kdn::store::SaveOp>(runtime, model, ns, ns_len, request, groups, num_groups, out, &kdn_op::save);
  KDN_END
}

kdn_status kdn_save_layer(kdn_op* op, uint32_t layer) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  if (op->save == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is not a save");
  return FromStatus(op->save->SaveLayer(layer));
  KDN_END
}

kdn_status kdn_op_wait(kdn_op* op, int64_t timeout_ms) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  return FromStatus(op->rep->Wait(timeout_ms));
  KDN_END
}

kdn_status kdn_op_poll(kdn_op* op, kdn_op_state* out) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = StateOf(op->rep->Poll());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_cancel(kdn_op* op) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  op->rep->Cancel();
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_result_get(kdn_op* op, kdn_op_result* out) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const uint32_t size = out->struct_size;
  if (!OutSizeOk(size)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "kdn_op_result: struct_size is wrong (use KDN_OP_RESULT_INIT)");
  }
  const kdn::store::OpResult r = op->rep->Outcome();
  kdn_op_result full = KDN_OP_RESULT_INIT;
  full.state = StateOf(r.state);
  full.status = static_cast<kdn_status>(static_cast<int>(r.status.code()));
  full.tokens = r.tokens;
  full.covered = r.covered;
  full.num_failed = r.failed.size();
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_failed_ranges(kdn_op* op, kdn_token_range* out, size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (op == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is NULL");
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
  // Nothing may read the caller's KV after this returns: a load runs to its
  // cancel point, a save's queued layer copies finish.
  if (op->load) (void)op->rep->Wait(-1);
  if (op->save) op->save->Drain();
  delete op;
}

kdn_status kdn_knowledge_put(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                             const char* doc_id, size_t doc_id_len, uint64_t version, const char* metadata,
                             size_t metadata_len, const int32_t* tokens, size_t num_tokens, const kdn_kv_buffer* kv) {
  KDN_BEGIN
  if (kdn_status s = CheckCall(runtime, model, ns, ns_len, tokens, num_tokens); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (metadata == nullptr && metadata_len > 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "metadata is NULL");
  kdn::store::KvBufferView buffer;
  if (kdn_status s = ResolveKv(model, kv, num_tokens, &buffer); s != KDN_OK) return s;
  const kdn::store::BufferAsView view(model->kv, buffer);
  return FromStatus(runtime->knowledge->Put(model->kv, std::string_view(ns, ns_len), std::string(doc_id, doc_id_len),
                                            version, std::string(metadata ? metadata : "", metadata_len),
                                            {tokens, num_tokens}, view.view()));
  KDN_END
}

kdn_status kdn_knowledge_list(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                              kdn_document_info* out, size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const auto docs = runtime->knowledge->List(model->kv, std::string_view(ns, ns_len));
  *out_count = docs.size();
  const int64_t now = runtime->rep->chain().clock().NowNs();
  for (size_t i = 0; i < std::min(capacity, docs.size()); ++i) {
    const uint32_t size = out[i].struct_size;
    if (!OutSizeOk(size)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "out[" + std::to_string(i) + "]: struct_size is wrong (use KDN_DOCUMENT_INFO_INIT)");
    }
    const kdn::store::DocumentInfo& d = docs[i];
    kdn_document_info info = KDN_DOCUMENT_INFO_INIT;
    info.doc_id_len = static_cast<uint32_t>(d.doc_id.size());
    std::memcpy(info.doc_id, d.doc_id.data(), d.doc_id.size());
    info.version = d.version;
    info.num_tokens = d.tokens;
    info.chunks = d.chunks;
    info.chunks_present = d.chunks_present;
    info.pinned = d.pinned ? 1u : 0u;
    info.expires_in_ms = d.expires_at_ns == 0 ? -1 : std::max<int64_t>(0, (d.expires_at_ns - now) / 1000000);
    WriteOut(info, &out[i]);
  }
  return KDN_OK;
  KDN_END
}

kdn_status kdn_knowledge_pin(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                             const char* doc_id, size_t doc_id_len, int pin, int64_t ttl_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (ttl_ms < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms must not be negative");
  return FromStatus(runtime->knowledge->Pin(model->kv, std::string_view(ns, ns_len), std::string(doc_id, doc_id_len),
                                            pin != 0, ttl_ms * 1000000));
  KDN_END
}

kdn_status kdn_knowledge_expire(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                                const char* doc_id, size_t doc_id_len, int64_t ttl_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (ttl_ms < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms must not be negative");
  return FromStatus(runtime->knowledge->Expire(model->kv, std::string_view(ns, ns_len),
                                               std::string(doc_id, doc_id_len), ttl_ms * 1000000));
  KDN_END
}

kdn_status kdn_knowledge_delete(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                                const char* doc_id, size_t doc_id_len) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  return FromStatus(runtime->knowledge->Delete(model->kv, std::string_view(ns, ns_len), std::string(doc_id, doc_id_len)));
  KDN_END
}

kdn_status kdn_knowledge_fetch(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                               const char* doc_id, size_t doc_id_len, const kdn_kv_buffer* kv, int32_t* tokens,
                               size_t tokens_capacity, uint64_t* out_num_tokens) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (out_num_tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_num_tokens is NULL");
  if (tokens_capacity > 0 && tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tokens is NULL");
  *out_num_tokens = 0;
  const std::string id(doc_id, doc_id_len);
  const std::string_view n(ns, ns_len);
  auto doc_tokens = runtime->knowledge->Fetch(model->kv, n, id, nullptr);
  if (!doc_tokens.ok()) return FromStatus(doc_tokens.status());
  if (kv != nullptr) {
    kdn::store::KvBufferView buffer;
    if (kdn_status s = ResolveKv(model, kv, doc_tokens->size(), &buffer); s != KDN_OK) return s;
    const kdn::store::BufferAsView view(model->kv, buffer);
    doc_tokens = runtime->knowledge->Fetch(model->kv, n, id, &view.view());
    if (!doc_tokens.ok()) return FromStatus(doc_tokens.status());
  }
  *out_num_tokens = doc_tokens->size();
  std::copy_n(doc_tokens->begin(), std::min(tokens_capacity, doc_tokens->size()), tokens);
  return KDN_OK;
  KDN_END
}


void kdn_blend_options_init(kdn_blend_options* options) {
  if (options) *options = KDN_BLEND_OPTIONS_INIT;
}

namespace {

// The caller's callback as the blender's engine.
class CallbackEngine final : public kdn::blend::LayerEngine {
 public:
  CallbackEngine(const kdn_blend_options& o) : o_(o) {}
  kdn::Status Layer(int layer, std::span<const int> positions, std::span<const int> tokens, float* hidden,
                    float* k_layer, float* v_layer, int total) override {
    std::vector<int32_t> ids(positions.size(), 0);
    for (size_t i = 0; i < tokens.size(); ++i) ids[i] = tokens[i];
    std::vector<int32_t> pos(positions.begin(), positions.end());
    const kdn_status st = o_.layer_fn(o_.user, static_cast<uint32_t>(layer), pos.data(), layer == 0 ? ids.data() : nullptr,
                                      positions.size(), hidden, o_.hidden_dim, k_layer, v_layer,
                                      static_cast<size_t>(total));
    if (st == KDN_OK) return kdn::Status::Ok();
    const int code = static_cast<int>(st);
    if (code > 0 || code < static_cast<int>(KDN_ERR_INTERNAL)) {
      return kdn::Status::Internal("the blend callback returned an unknown status " + std::to_string(code) +
                                   " at layer " + std::to_string(layer));
    }
    return kdn::Status(static_cast<kdn::Code>(code), "the blend callback failed at layer " + std::to_string(layer) +
                                                         " (" + kdn_status_str(st) + ")");
  }
  int hidden_dim() const override { return static_cast<int>(o_.hidden_dim); }

 private:
  const kdn_blend_options& o_;
};

float LoadAs(kdn_dtype d, const std::uint8_t* p, size_t i) {
  if (d == KDN_DTYPE_F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  std::uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return d == KDN_DTYPE_F16 ? kdn::kernels::half_to_float(h) : kdn::kernels::bf16_to_float(h);
}
void StoreAs(kdn_dtype d, std::uint8_t* p, size_t i, float f) {
  if (d == KDN_DTYPE_F32) {
    std::memcpy(p + 4 * i, &f, 4);
    return;
  }
  const std::uint16_t h = d == KDN_DTYPE_F16 ? kdn::kernels::float_to_half(f) : kdn::kernels::float_to_bf16(f);
  std::memcpy(p + 2 * i, &h, 2);
}

}  // namespace

kdn_status kdn_blend(kdn_runtime* runtime, const kdn_model* model, const char* ns, size_t ns_len,
                     const kdn_blend_segment* segments, size_t num_segments, const kdn_blend_options* options,
                     const kdn_kv_buffer* kv, kdn_blend_report* report) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(runtime, model, ns, ns_len); s != KDN_OK) return s;
  if (report != nullptr && !OutSizeOk(report->struct_size)) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "kdn_blend_report: struct_size " + std::to_string(report->struct_size) +
                                              " is wrong (initialise it with KDN_BLEND_REPORT_INIT)");
  }
  if (options == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options are NULL (they carry the callback)");
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  if (kdn_status s = ReadStruct(options, sizeof(kdn_blend_options), "kdn_blend_options", &o); s != KDN_OK) return s;
  if (o.layer_fn == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: layer_fn is NULL");
  if (o.hidden_dim == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: hidden_dim is 0");
  if (num_segments == 0 || segments == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "no segments");
  if (kv == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "kv is NULL");
  const kdn::store::ModelKv& m = model->kv;
  const int layers = static_cast<int>(m.shape.layers);
  kdn::blend::BlendOptions bo;
  bo.ratio = o.ratio;
  bo.threshold = o.threshold;
  if (o.check_layers != nullptr) {
    bo.check_layers.assign(o.check_layers, o.check_layers + o.num_check_layers);
  } else if (o.num_check_layers != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: check_layers is NULL with num_check_layers > 0");
  } else {
    bo.check_layers = {layers > 1 ? 1 : 0};
  }
  bo.rope = model->rope;
  if (o.rope_scaling != KDN_ROPE_SCALING_NONE && o.rope_scaling != KDN_ROPE_SCALING_LINEAR &&
      o.rope_scaling != KDN_ROPE_SCALING_NTK) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "blend options: unknown rope_scaling " + std::to_string(o.rope_scaling));
  }
  bo.rope.scaling = static_cast<kdn::kernels::RopeScaling>(o.rope_scaling);
  bo.rope.factor = o.rope_factor;

  // The pieces: documents fetched at their own positions, tokens as given.
  const std::string_view n(ns, ns_len);
  std::vector<kdn::blend::Piece> pieces;
  size_t total = 0;
  for (size_t i = 0; i < num_segments; ++i) {
    kdn_blend_segment seg = KDN_BLEND_SEGMENT_INIT;
    if (kdn_status s = ReadStruct(&segments[i], sizeof(kdn_blend_segment), "kdn_blend_segment", &seg); s != KDN_OK) {
      return s;
    }
    kdn::blend::Piece p;
    if (seg.kind == KDN_SEGMENT_TOKENS) {
      if (seg.num_tokens > 0 && seg.tokens == nullptr) {
        return Fail(KDN_ERR_INVALID_ARGUMENT, "segment " + std::to_string(i) + ": tokens is NULL");
      }
      p.tokens.assign(seg.tokens, seg.tokens + seg.num_tokens);
    } else if (seg.kind == KDN_SEGMENT_DOCUMENT) {
      if (kdn_status s = CheckDocId(seg.doc_id, seg.doc_id_len); s != KDN_OK) return s;
      const std::string id(seg.doc_id, seg.doc_id_len);
      auto tokens = runtime->knowledge->Fetch(m, n, id, nullptr);
      if (!tokens.ok()) return FromStatus(tokens.status());
      const size_t T = tokens->size();
      std::vector<std::uint8_t> raw(T * static_cast<size_t>(m.bytes_per_token()));
      kdn::store::KvBufferView buffer{raw.data(), raw.size(), T, {}};
      auto resolved = kdn::store::ResolveBuffer(m, buffer, T);
      if (!resolved.ok()) return FromStatus(resolved.status());
      const kdn::store::BufferAsView view(m, *resolved);
      auto fetched = runtime->knowledge->Fetch(m, n, id, &view.view());
      if (!fetched.ok()) return FromStatus(fetched.status());
      p.tokens = std::move(fetched).value();
      p.kv.resize(raw.size() / static_cast<size_t>(m.shape.elem_bytes));
      for (size_t e = 0; e < p.kv.size(); ++e) p.kv[e] = LoadAs(model->dtype, raw.data(), e);
    } else {
      return Fail(KDN_ERR_INVALID_ARGUMENT, "segment " + std::to_string(i) + ": unknown kind " +
                                                std::to_string(seg.kind));
    }
    total += p.tokens.size();
    pieces.push_back(std::move(p));
  }
  kdn::store::KvBufferView out_buffer;
  if (kdn_status s = ResolveKv(model, kv, total, &out_buffer); s != KDN_OK) return s;

  CallbackEngine engine(o);
  std::vector<float> composed;
  const kdn::blend::ModelShape shape{layers, static_cast<int>(m.shape.heads), static_cast<int>(m.shape.head_dim)};
  auto r = kdn::blend::Compose(shape, pieces, bo, engine, &composed);
  if (!r.ok()) return FromStatus(r.status());
  // Into the caller's buffer, in the model's dtype.
  std::vector<std::uint8_t> canonical(composed.size() * static_cast<size_t>(m.shape.elem_bytes));
  for (size_t e = 0; e < composed.size(); ++e) StoreAs(model->dtype, canonical.data(), e, composed[e]);
  const kdn::store::BufferAsView view(m, out_buffer);
  kdn::kernels::view_scatter_cpu(canonical.data(), view.view(), 0, static_cast<std::int64_t>(total), 0, layers);
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

}  // extern "C"

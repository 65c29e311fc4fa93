// SPDX-License-Identifier: Apache-2.0
// The layer between kdn.h and SWIG's Java and Python modules.
//
// kdn.h is C: out-parameters, borrowed strings, versioned structs, a status
// per call. SWIG maps that shape literally (pointers to pointers, leaking
// setters on borrowed strings, BigInteger for uint64_t, enums that throw on a
// value they do not know). This header gives SWIG a shape it maps well:
// value types that own their strings, handle classes whose methods return
// results and throw kdn::binding::Error on failure, ints for the open enums
// (each language has its own enum types over them), and one buffer argument,
// (void *data, size_t bytes), that each language's typemap fills from the
// caller's own memory without a copy (a direct ByteBuffer, anything with
// Python's buffer protocol); or, for memory a language finds by itself (GPU
// arrays), a Memory: address, length, host or device, CUDA stream.
//
// Header-only, C++17, used by the generated wrappers alone.
// Thread-safety: a Runtime, Model or Op may be used from many threads at
// once (kdn.h), and close() may come from any thread at any time: it marks
// the handle closed (later calls throw an Error with closed() set), cancels
// an op, waits until the calls in flight on the handle have left, then
// destroys it. Op waits run in slices of at most kWaitSliceMs, so a close
// ends a wait promptly (it throws the closed Error).
#ifndef KDN_BINDING_HPP
#define KDN_BINDING_HPP

#define KDN_EXPERIMENTAL 1
#include <kdn/kdn.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// Functions newer than the oldest libkdn the bindings load against (1.9)
// are weak references: the module still loads against an older library,
// and a call to one there throws KDN_ERR_VERSION (detail::Since).
#if !defined(SWIG) && defined(__GNUC__)
#pragma weak kdn_runtime_get_quota_stats
#endif

namespace kdn {
namespace binding {

// A failed call: kdn's status and message. `closed` is set when a closed
// handle was used (the call never reached kdn); `needed` is the length a
// KDN_ERR_BUFFER_TOO_SMALL asked for (tokens), else 0.
class Error : public std::exception {
 public:
  Error(int status, std::string message, bool closed = false, uint64_t needed = 0)
      : status_(status), message_(std::move(message)), closed_(closed), needed_(needed) {}
  const char* what() const noexcept override { return message_.c_str(); }
  int status() const { return status_; }
  const std::string& message() const { return message_; }
  bool closed() const { return closed_; }
  uint64_t needed() const { return needed_; }

 private:
  int status_;
  std::string message_;
  bool closed_;
  uint64_t needed_;
};

namespace detail {
// Throws the last failure of this thread (read right after the call).
inline void Check(kdn_status status, uint64_t needed = 0) {
  if (status != KDN_OK) throw Error(status, kdn_last_error_message(), false, needed);
}
inline void Closed(const char* what) { throw Error(KDN_ERR_INVALID_ARGUMENT, std::string(what) + " is closed", true); }
inline void Invalid(const std::string& message) { throw Error(KDN_ERR_INVALID_ARGUMENT, message); }
inline uint32_t DtypeBytes(int dtype) { return dtype == KDN_DTYPE_F32 ? 4u : 2u; }
// Throws KDN_ERR_VERSION unless `fn`, a function of C ABI 1.`minor`, is
// there (a weak reference: null in an older libkdn).
inline void Since(const void* fn, const char* name, int minor) {
  if (fn == nullptr) {
    throw Error(KDN_ERR_VERSION, std::string(name) + " needs libkdn 1." + std::to_string(minor) + " or later; this is " +
                                     kdn_version());
  }
}
// Throws KDN_ERR_VERSION unless the libkdn loaded is 1.`minor` or later, for
// `what`, fields of C ABI 1.`minor` the caller set: an older library would
// refuse the struct for a tail it does not know, without saying which field.
inline void SinceFields(const char* what, int minor) {
  if (kdn_version_number() < 10000u + 100u * static_cast<uint32_t>(minor)) {
    throw Error(KDN_ERR_VERSION, std::string(what) + " need libkdn 1." + std::to_string(minor) + " or later; this is " +
                                     kdn_version());
  }
}

#ifndef SWIG
// A handle's life: every call holds a Use for its duration; Close marks the
// handle closed (new calls throw), stops what may block (an op's cancel),
// waits until the calls in flight have left, and only then destroys it.
class Life {
 public:
  explicit Life(const char* what) : what_(what) {}
  Life(const Life&) = delete;
  Life& operator=(const Life&) = delete;

  // One call in flight on the handle (throws the closed Error if it is).
  class Use {
   public:
    explicit Use(const Life& life) : life_(life) {
      std::lock_guard<std::mutex> lock(life_.mu_);
      if (life_.state_ != kOpen || life_.refusing_) Closed(life_.what_);
      ++life_.calls_;
    }
    ~Use() {
      std::lock_guard<std::mutex> lock(life_.mu_);
      if (--life_.calls_ == 0 && life_.state_ != kOpen) life_.cv_.notify_all();
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    const Life& life_;
  };

  // Idempotent; a second close (another thread) returns once the first is done.
  template <typename Stop, typename Destroy>
  void Close(Stop stop, Destroy destroy) {
    std::unique_lock<std::mutex> lock(mu_);
    if (state_ != kOpen) {
      cv_.wait(lock, [this] { return state_ == kClosed; });
      return;
    }
    state_ = kClosing;
    lock.unlock();
    stop();
    lock.lock();
    cv_.wait(lock, [this] { return calls_ == 0; });
    lock.unlock();
    destroy();  // unlocked: it may wait for a callback that asks closing()
    lock.lock();
    state_ = kClosed;
    cv_.notify_all();
  }
  bool closing() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ != kOpen || refusing_;
  }
  // New calls throw the closed Error from now on, while the close itself
  // comes later (a close inside a callback of a call on the handle, handed
  // to another thread): what "closed" means to the caller holds at once.
  void Refuse() {
    std::lock_guard<std::mutex> lock(mu_);
    refusing_ = true;
  }
 private:
  enum State { kOpen, kClosing, kClosed };
  const char* what_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable State state_ = kOpen;
  mutable uint64_t calls_ = 0;
  bool refusing_ = false;
};

// The longest slice of one blocking kdn wait: how long a close may wait for it.
constexpr int64_t kWaitSliceMs = 20;
#endif
}  // namespace detail

inline std::string version() { return kdn_version(); }
inline uint32_t version_number() { return kdn_version_number(); }
inline std::string status_string(int status) { return kdn_status_string(status); }

// ---- Configuration (inputs; every field has kdn.h's default) -------------

struct TierConfig {
  int kind = KDN_TIER_HOST;
  uint64_t capacity_bytes = 1ull << 30;
  std::string path;  // disk
  int policy = KDN_EVICT_LRU;
  float high_watermark = 0, low_watermark = 0;
  bool write_through = false;
  std::string codec;
  std::string address, token;  // remote, redis (token: the password)
  uint32_t timeout_ms = 0;      // remote, redis
  std::string tls_ca_file, tls_server_name;  // remote
  std::string user;             // redis (1.3): the ACL user of AUTH
  uint64_t ttl_ms = 0;          // redis (1.3): the keys expire after this; 0: never
  // remote, redis (1.6): quality levels, codec specs finest first separated
  // by ';' (codec then empty); a load with a TTFT target picks each chunk's.
  std::string levels;
  // Since 1.13, not for remote tiers: a namespace's quota in this tier, the
  // most bytes its chunks may take (as the tier counts its capacity); over
  // it, the namespace's puts evict its own coldest chunks, never another's
  // (docs/security.md, "Quotas"). One per namespace, at most 4096; kdn
  // checks them when the runtime is created. Runtime::quota_stats reports
  // them in this order.
  void add_quota(const std::string& ns, uint64_t bytes) { quotas.push_back(Quota{ns, bytes}); }
  size_t quota_count() const { return quotas.size(); }
  void clear_quotas() { quotas.clear(); }
#ifndef SWIG
  struct Quota {
    std::string ns;
    uint64_t bytes;
  };
  std::vector<Quota> quotas;
#endif
};

struct RuntimeOptions {
  uint32_t chunk_tokens = 256;
  uint64_t host_capacity_bytes = 1ull << 30;
  uint64_t hash_seed = 0;
  uint32_t worker_threads = 0;
  int device = KDN_DEVICE_AUTO;   // since 1.5: the GPU KV is delivered to (kdn_device_mode)
  int32_t device_ordinal = 0;     // since 1.5: the CUDA device
  // Since 1.7: load every cached chunk, even where its tier delivers slower
  // than the engine prefills (false: such chunks are left to recompute).
  bool load_slower_than_prefill = false;
  // Since 1.8: the deployment's secret (a file of 32 bytes or more, closed
  // to others): chunks of redis and disk tiers are sealed with it.
  std::string secret_file;
  // Since 1.14: encryption at rest. The master keys' source, at most one of
  // the two (empty: none): a file closed to others, one key per line as 64
  // hex digits (the first encrypts, every one decrypts), or the NAME of an
  // environment variable holding such lines. Chunks of disk, redis and
  // remote tiers are then AES-256-GCM encrypted; one that does not decrypt
  // is a miss (TierStats::auth_failures). A libkdn older than 1.14:
  // KDN_ERR_VERSION when either is set.
  std::string encryption_key_file;
  std::string encryption_key_env;
  // Tiers, highest first; none: one host tier of host_capacity_bytes.
  void add_tier(const TierConfig& tier) { tiers.push_back(tier); }
  size_t tier_count() const { return tiers.size(); }
  void clear_tiers() { tiers.clear(); }
#ifndef SWIG
  std::vector<TierConfig> tiers;
#endif
};

struct ModelSpec {
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0;
  int dtype = KDN_DTYPE_F32;
  float rope_theta = 10000.0f;
  int rope_style = KDN_ROPE_INTERLEAVED;
  uint32_t rotary_dim = 0;
  std::string fingerprint;
  // Since 1.11 (kdn_model_spec.cache_kind): KDN_CACHE_LATENT caches one
  // vector of latent_dim per token and layer (MLA).
  int cache_kind = KDN_CACHE_KV;
  uint32_t latent_dim = 0, latent_rope_dim = 0;
  // Since 1.12 (kdn_model_spec.layer_windows, num_state_layers,
  // state_bytes): layer `layer`'s sliding window in tokens (0: full
  // attention); unset layers are full. Recurrent layers' states travel with
  // a call as a StateLayers (the Model's *_states calls), which fill the C
  // ABI's kdn_kv_view.state_layers.
  void set_layer_window(uint32_t layer, uint32_t window) {
    if (layer >= layer_windows.size()) layer_windows.resize(layer + 1, 0);
    layer_windows[layer] = window;
  }
  uint32_t num_state_layers = 0;
  uint64_t state_bytes = 0;
#ifndef SWIG
  std::vector<uint32_t> layer_windows;  // empty: every layer full
  // Elements one token's KV takes in one layer (K and V, or the latent).
  uint64_t row_elements() const {
    return cache_kind == KDN_CACHE_LATENT ? uint64_t{latent_dim} : uint64_t{2} * num_kv_heads * head_dim;
  }
  // Elements of a paged block per layer allocation half (K's, or the latent's).
  uint64_t block_row() const {
    return cache_kind == KDN_CACHE_LATENT ? uint64_t{latent_dim} : uint64_t{num_kv_heads} * head_dim;
  }
#endif
};

// The tokens of a KV call: ids, or the engine's chained block hashes. Copied
// in (tokens cost 4 bytes each), so one Request can be reused across calls.
class Request {
 public:
  // Each language's typemap fills (tokens, num_tokens) from its int array.
  void set_tokens(const int32_t* tokens, size_t num_tokens) {
    tokens_.assign(tokens, tokens + num_tokens);
    hashes_.clear();
    hash_bytes_ = 0;
    block_tokens_ = 0;
  }
  void set_block_hashes(const char* hashes, size_t bytes, uint32_t hash_bytes, uint32_t block_tokens) {
    if (hash_bytes == 0 || bytes % hash_bytes != 0) {
      detail::Invalid("block hashes: " + std::to_string(bytes) + " bytes is not a whole number of " +
                      std::to_string(hash_bytes) + "-byte hashes");
    }
    hashes_.assign(hashes, hashes + bytes);
    tokens_.clear();
    hash_bytes_ = hash_bytes;
    block_tokens_ = block_tokens;
  }
  size_t size() const { return hash_bytes_ ? hashes_.size() / hash_bytes_ : tokens_.size(); }
  bool uses_hashes() const { return hash_bytes_ != 0; }
  // Since 1.6, for retrieve and load_async: the time from the call within
  // which the cached prefix's KV should be in place, in microseconds (0:
  // none). Remote tiers with quality levels pick each chunk's level by it.
  void set_ttft_target_us(uint64_t us) { ttft_target_us_ = us; }
  uint64_t ttft_target_us() const { return ttft_target_us_; }
  // A copy with another target (the tokens copied too).
  Request with_ttft_target_us(uint64_t us) const {
    Request r = *this;
    r.ttft_target_us_ = us;
    return r;
  }
  // Since 1.13: the salt that enters every chunk key (kdn_request.salt;
  // empty: none). Copied in; kdn refuses one over 4096 bytes at the call.
  void set_salt(const char* salt, size_t bytes) { salt_.assign(salt, salt + bytes); }

#ifndef SWIG
  kdn_request Native() const {
    kdn_request r = KDN_REQUEST_INIT;
    r.ttft_target_us = ttft_target_us_;
    if (!salt_.empty()) {
      r.salt = reinterpret_cast<const uint8_t*>(salt_.data());
      r.salt_len = salt_.size();
    }
    if (hash_bytes_) {
      r.hash_bytes = hash_bytes_;
      r.block_hashes = reinterpret_cast<const uint8_t*>(hashes_.data());
      r.num_blocks = hashes_.size() / hash_bytes_;
      r.block_tokens = block_tokens_;
    } else {
      r.tokens = tokens_.data();
      r.num_tokens = tokens_.size();
    }
    return r;
  }

 private:
  std::vector<int32_t> tokens_;
  std::string hashes_;
  uint32_t hash_bytes_ = 0, block_tokens_ = 0;
  uint64_t ttft_target_us_ = 0;
  std::string salt_;
#endif
};

// Where the caller's KV lies in the one buffer passed with each call
// (kdn_kv_view without its pointers). Counts and strides in elements.
// Default: the canonical layout [layer][k|v][token][kv_head][head_dim].
struct KvView {
  int layout = KDN_LAYOUT_CONTIGUOUS;
  int64_t stride_layer = 0, stride_kv = 0;
  int64_t stride_token = 0, stride_head = 0, stride_dim = 0;
  int64_t v_stride_token = 0, v_stride_head = 0, v_stride_dim = 0;
  uint64_t num_tokens = 0;      // room, in tokens; 0 = the request's
  uint64_t layer_elements = 0;  // per-layer offsets: elements each layer's K (or V) may span
  uint32_t block_size = 0;      // paged
  uint64_t num_blocks = 0;      // paged: blocks per layer
  int64_t block_stride = 0;     // paged: elements between blocks; 0 = dense

  // A subset of the model's layers, in order (none: all of them).
  void add_layer(uint32_t model_layer) { layers_.push_back(model_layer); }
  // Per view layer: where its K and V start in the buffer (elements). Needed
  // for paged layouts and for layers that are not at one stride apart.
  void add_layer_offsets(int64_t k_offset, int64_t v_offset) {
    k_offsets_.push_back(k_offset);
    v_offsets_.push_back(v_offset);
  }
  // Paged: the block of each group of block_size tokens, in order.
  void add_block(int32_t block) { block_table_.push_back(block); }
  void clear_blocks() { block_table_.clear(); }

#ifndef SWIG
  // The native view over `data`, with the pointer arrays it needs kept in
  // `k`/`v`. Every byte a layer offset can reach is checked against `bytes`
  // here, since kdn can only bound one allocation.
  kdn_kv_view Native(const ModelSpec& spec, void* data, size_t bytes, std::vector<void*>* k,
                     std::vector<void*>* v) const {
    kdn_kv_view view = KDN_KV_VIEW_INIT;
    view.dtype = static_cast<kdn_dtype>(spec.dtype);
    view.layout = static_cast<kdn_kv_layout>(layout);
    view.layers = layers_.empty() ? nullptr : layers_.data();
    view.num_layers = layers_.size();
    view.stride_layer = stride_layer;
    view.stride_kv = stride_kv;
    view.stride_token = stride_token;
    view.stride_head = stride_head;
    view.stride_dim = stride_dim;
    view.v_stride_token = v_stride_token;
    view.v_stride_head = v_stride_head;
    view.v_stride_dim = v_stride_dim;
    view.num_tokens = num_tokens;
    view.block_size = block_size;
    view.block_table = block_table_.empty() ? nullptr : block_table_.data();
    view.block_table_len = block_table_.size();
    view.num_blocks = num_blocks;
    view.block_stride = block_stride;
    if (k_offsets_.empty()) {
      view.data = data;
      view.size_bytes = bytes;
      return view;
    }
    // Per-layer offsets into the one buffer: bound each layer's span.
    const uint64_t elem = detail::DtypeBytes(spec.dtype);
    uint64_t span = layer_elements;
    if (layout != KDN_LAYOUT_CONTIGUOUS) {
      const uint64_t block = block_stride ? static_cast<uint64_t>(block_stride) : uint64_t{block_size} * spec.block_row();
      if (block == 0 || num_blocks > bytes / elem / block) {
        detail::Invalid("a paged view of " + std::to_string(num_blocks) + " blocks does not fit the buffer's " +
                        std::to_string(bytes) + " bytes");
      }
      if (block_stride && static_cast<uint64_t>(block_stride) < uint64_t{block_size} * spec.block_row()) {
        detail::Invalid("block_stride is smaller than a block");
      }
      span = num_blocks * block;
      view.num_blocks = num_blocks;
    } else {
      view.layer_elements = layer_elements;
    }
    if (span == 0) {
      detail::Invalid(layout == KDN_LAYOUT_CONTIGUOUS ? "a view with layer offsets needs layer_elements"
                                                      : "a paged view needs num_blocks");
    }
    const size_t n = k_offsets_.size();
    if (n != (layers_.empty() ? size_t{spec.num_layers} : layers_.size())) {
      detail::Invalid("the view has layer offsets for " + std::to_string(n) + " layers, not one per layer it names (" +
                      std::to_string(layers_.empty() ? size_t{spec.num_layers} : layers_.size()) + ")");
    }
    k->resize(n);
    v->resize(n);
    for (size_t j = 0; j < n; ++j) {
      for (int which = 0; which < 2; ++which) {
        const int64_t off = which ? v_offsets_[j] : k_offsets_[j];
        if (off < 0 || static_cast<uint64_t>(off) > bytes / elem || span > bytes / elem - off) {
          detail::Invalid("layer " + std::to_string(j) + "'s " + (which ? "V" : "K") + " at element " +
                          std::to_string(off) + " spans past the buffer's " + std::to_string(bytes) + " bytes");
        }
        (which ? *v : *k)[j] = static_cast<char*>(data) + off * elem;
      }
    }
    view.k_layers = k->data();
    view.v_layers = v->data();
    return view;
  }

 private:
  std::vector<uint32_t> layers_;
  std::vector<int64_t> k_offsets_, v_offsets_;
  std::vector<int32_t> block_table_;
#endif
};

// A call's KV memory by address (since 1.5): memory a language finds by
// itself, not through its buffer typemap (Python: objects with
// __cuda_array_interface__ or DLPack). kind KDN_MEMORY_DEVICE: memory of the
// runtime's device (RuntimeOptions::device; emulated: host memory standing
// in for it), with the engine's CUDA stream (1.8), whose queued work kdn's
// waits for and which sees kdn's writes. The caller keeps the memory alive
// and unmoved for the call (an op: until it is closed).
struct Memory {
  uint64_t address = 0;        // the first byte
  uint64_t bytes = 0;          // bytes reachable from address
  int kind = KDN_MEMORY_HOST;  // kdn_memory_kind
  uint64_t cuda_stream = 0;    // a cudaStream_t, device memory only; 0: none
};

// ---- Results (outputs, copied out) ----------------------------------------

struct KvResult {
  int state = KDN_OP_PENDING;
  int status = KDN_OK;
  uint64_t tokens = 0, covered = 0, num_failed = 0;
  uint32_t flags = 0;
  bool lossy() const { return (flags & KDN_RESULT_LOSSY) != 0; }
#ifndef SWIG
  static KvResult From(const kdn_kv_result& r) {
    KvResult out;
    out.state = r.state;
    out.status = r.status;
    out.tokens = r.tokens;
    out.covered = r.covered;
    out.num_failed = r.num_failed;
    out.flags = r.flags;
    return out;
  }
#endif
};

struct LookupResult {
  int status = KDN_OK;
  uint64_t cached_tokens = 0;
  uint32_t num_tiers = 0;
  uint64_t tier_tokens(uint32_t tier) const { return tier < KDN_MAX_TIERS ? tier_tokens_[tier] : 0; }
#ifndef SWIG
  uint64_t tier_tokens_[KDN_MAX_TIERS] = {};
  static LookupResult From(const kdn_lookup_result& r) {
    LookupResult out;
    out.status = r.status;
    out.cached_tokens = r.cached_tokens;
    out.num_tiers = r.num_tiers;
    std::memcpy(out.tier_tokens_, r.tier_tokens, sizeof r.tier_tokens);
    return out;
  }
#endif
};

struct DocumentInfo {
  std::string doc_id;
  bool pinned = false;
  uint64_t version = 0, num_tokens = 0;
  uint32_t chunks = 0, chunks_present = 0;
  int64_t expires_in_ms = -1;
  uint64_t hits = 0;  // chunks of it served (fetches, blends) since this version was put (since 1.4)
  int64_t pin_expires_in_ms = -1;  // pinned with a TTL: ms until the pin ends; -1: not, or until unpinned (1.4)
#ifndef SWIG
  static DocumentInfo From(const kdn_document_info& d) {
    DocumentInfo out;
    out.doc_id.assign(d.doc_id, d.doc_id_len);
    out.pinned = d.pinned != 0;
    out.version = d.version;
    out.num_tokens = d.num_tokens;
    out.chunks = d.chunks;
    out.chunks_present = d.chunks_present;
    out.expires_in_ms = d.expires_in_ms;
    out.hits = d.hits;
    out.pin_expires_in_ms = d.pin_expires_in_ms;
    return out;
  }
#endif
};

// A fetched document: the result, and its tokens (copied out).
struct FetchResult {
  KvResult result;
  size_t token_count() const { return tokens_.size(); }
  int32_t token(size_t i) const { return i < tokens_.size() ? tokens_[i] : -1; }
  // Into the caller's buffer (4 bytes per token, little-endian int32).
  void copy_tokens(void* data, size_t bytes) const {
    if (bytes < tokens_.size() * sizeof(int32_t)) {
      detail::Invalid("copy_tokens: " + std::to_string(bytes) + " bytes hold fewer than " +
                      std::to_string(tokens_.size()) + " tokens");
    }
    if (!tokens_.empty()) std::memcpy(data, tokens_.data(), tokens_.size() * sizeof(int32_t));
  }
#ifndef SWIG
  std::vector<int32_t> tokens_;
#endif
};

struct Stats {
  uint64_t lookups = 0, retrieves = 0, stores = 0, hits = 0, misses = 0;
  uint64_t tokens_served = 0, tokens_stored = 0, bytes_served = 0, bytes_stored = 0;
  uint64_t chunks = 0, used_bytes = 0, capacity_bytes = 0, evictions = 0, edited_served = 0;
  uint64_t leases_active = 0, pins_active = 0, pins_forced_unpin = 0, corrupt_detected = 0, edits = 0;
  // Since 1.4: tokens loads asked for; prefills engines reported
  // (Model::report_prefill) and their time; the prefill time loads saved;
  // tokens served while their model had no report; time spent in loads; the
  // tokens looked-up requests covered and, of them, the cached leading ones.
  uint64_t tokens_requested = 0, prefill_tokens = 0, prefill_ns = 0, ttft_saved_ns = 0;
  uint64_t tokens_served_unpriced = 0, delivery_ns = 0, lookup_tokens = 0, lookup_hit_tokens = 0;
  // Since 1.7: cached tokens loads left to recompute, their tiers slower
  // than the engine's prefill (RuntimeOptions::load_slower_than_prefill).
  uint64_t recompute_tokens = 0;
};

struct Latency {
  uint64_t count = 0;
  double mean_us = 0, p50_us = 0, p90_us = 0, p99_us = 0, max_us = 0;
};

struct TierStats {
  int kind = KDN_TIER_HOST;
  std::string name, codec;
  uint64_t hits = 0, misses = 0, puts = 0, put_refusals = 0, evictions = 0;
  uint64_t demotions_in = 0, promotions_in = 0, bytes_in = 0, bytes_out = 0;
  uint64_t objects = 0, used_bytes = 0, capacity_bytes = 0, corrupt_detected = 0;
  uint64_t encoded_chunks = 0, bytes_before_encoding = 0, bytes_after_encoding = 0;
  uint64_t encode_failures = 0, decode_failures = 0, io_errors = 0;
  uint64_t remote_calls = 0, remote_failed_calls = 0, remote_timeouts = 0;
  uint64_t write_queue_full = 0, write_queued_bytes = 0;
  double high_watermark = 0, low_watermark = 0;  // since 1.4; 0 and 0: none (remote, redis)
  // Since 1.7: the tier's measured delivery into host and device views (ns
  // per token of KV; 0 until measured), and its chunks loads left to
  // recompute as slower than prefill.
  double delivery_ns_per_token = 0, device_delivery_ns_per_token = 0;
  uint64_t recompute_chunks = 0;
  uint64_t auth_failures = 0;  // since 1.8: of corrupt_detected, chunks whose seal failed
};

// Since 1.13: one namespace's quota in a tier, now (kdn_quota_stats).
// ns_hash: kdn's hash of the namespace as chunk envelopes record it (SHA-256
// of "kdn-namespace-v1" and the namespace, each after its length as a
// little-endian u64: core/keys/hash.cc), in 64 lowercase hex digits.
struct QuotaStats {
  std::string ns_hash;
  uint64_t quota_bytes = 0, used_bytes = 0, objects = 0;
  uint64_t quota_evictions = 0;  // its chunks evicted to keep it within its quota
  uint64_t room_evictions = 0;   // its chunks evicted for the tier's room
  uint64_t refused = 0;          // its puts refused: one chunk larger than its quota
};

struct ChunkInfo {
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0, num_tokens = 0;
  int dtype = KDN_DTYPE_F32;
  int64_t first_position = -1;
};

// The editor (experimental in kdn.h): rewrites a stored chunk's KV in
// place, in the canonical layout, on the runtime's mover thread. Return true
// when it changed the KV. Throwing (a Java or Python exception) leaves the
// chunk as it was; the runtime goes on.
class Editor {
 public:
  virtual ~Editor() = default;
  virtual bool edit(const ChunkInfo& info, void* kv, size_t kv_bytes) = 0;
};

#ifndef SWIG
namespace detail {
// Editor calls running on this thread (kdn's mover thread, inside edit()).
inline int& EditorDepth() {
  thread_local int depth = 0;
  return depth;
}

// Each language's wrapper reports a callback's exception through this hook
// (it prints it: Python's PyErr_Print, Java's ExceptionDescribe).
inline kdn_status EditTrampoline(void* user, const kdn_chunk_info* info, void* kv, size_t kv_bytes, int* out_changed) {
  ChunkInfo c;
  c.num_layers = info->num_layers;
  c.num_kv_heads = info->num_kv_heads;
  c.head_dim = info->head_dim;
  c.num_tokens = info->num_tokens;
  c.dtype = info->dtype;
  c.first_position = info->first_position;
  struct Depth {
    Depth() { ++EditorDepth(); }
    ~Depth() { --EditorDepth(); }
  } depth;
  try {
    *out_changed = static_cast<Editor*>(user)->edit(c, kv, kv_bytes) ? 1 : 0;
    return KDN_OK;
  } catch (...) {
    return KDN_ERR_INTERNAL;
  }
}
}  // namespace detail
#endif

// True on a thread that is running an editor (kdn's mover thread, inside
// Editor::edit, from before the language's callback starts until after it
// returns). Closing a runtime there would destroy it on its own mover
// thread: the wrappers hand such closes (a finalizer run by a collection
// inside the callback, say) to another thread.
inline bool in_editor() { return detail::EditorDepth() > 0; }

// ---- Blending (experimental in kdn.h) ----------------------------------------

// The pieces of a blended context, in order: documents (knowledge items) by
// doc_id, and tokens computed now (the query). Copied in.
class BlendSegments {
 public:
  void add_document(const std::string& doc_id) { segments_.push_back(Segment{KDN_SEGMENT_DOCUMENT, doc_id, {}}); }
  // Each language's typemap fills (tokens, num_tokens) from its int array.
  void add_tokens(const int32_t* tokens, size_t num_tokens) {
    segments_.push_back(Segment{KDN_SEGMENT_TOKENS, std::string(), std::vector<int32_t>(tokens, tokens + num_tokens)});
  }
  size_t size() const { return segments_.size(); }
  void clear() { segments_.clear(); }

#ifndef SWIG
  // The native segments, borrowing this object's strings and arrays.
  std::vector<kdn_blend_segment> Native() const {
    std::vector<kdn_blend_segment> out(segments_.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const Segment& s = segments_[i];
      detail::Check(kdn_blend_segment_init(&out[i], sizeof out[i]));
      out[i].kind = static_cast<kdn_segment_kind>(s.kind);
      if (s.kind == KDN_SEGMENT_DOCUMENT) {
        out[i].doc_id = s.doc_id.data();
        out[i].doc_id_len = s.doc_id.size();
      } else {
        out[i].tokens = s.tokens.data();
        out[i].num_tokens = s.tokens.size();
      }
    }
    return out;
  }

 private:
  struct Segment {
    int kind;
    std::string doc_id;
    std::vector<int32_t> tokens;
  };
  std::vector<Segment> segments_;
#endif
};

// How to blend (kdn_blend_options without the callbacks); kdn.h's defaults.
struct BlendOptions {
  // Fraction of cached tokens recomputed, in [0, 1]; -1 (since 1.9): the
  // method's default (0.28 over check layers { 1, 2 } with a KV pass,
  // CacheBlend's 0.15 at layer 1 without).
  float ratio = -1.0f;
  float threshold = -1.0f;   // >= 0: select by key deviation >= threshold instead
  uint32_t hidden_dim = 0;   // the engine's hidden width; must be set
  int rope_scaling = KDN_ROPE_SCALING_NONE;
  float rope_factor = 1.0f;
  // Since 1.9: with a KV pass (BlendLayer::has_kv_pass), its work per
  // position over a whole layer's, in (0, 1] (kdn refuses it unset).
  float kv_cost = 0.0f;
  // Since 1.9: leading tokens of each document recomputed at every layer.
  uint32_t first_tokens = 0;
  // Since 1.9: the accuracy gate, a file `kdn blend calibrate` wrote (empty:
  // no gate). The blend runs only when it holds this model's record for the
  // method these options resolve to at or below max_kl_ratio; otherwise
  // every position is recomputed (BlendReport::gated).
  std::string gate_file;
  float max_kl_ratio = 0.2f;
  // The check layers, ascending (none: the method's, see ratio).
  void add_check_layer(uint32_t layer) { check_layers.push_back(layer); }
  void clear_check_layers() { check_layers.clear(); }
#ifndef SWIG
  std::vector<uint32_t> check_layers;
#endif
};

struct BlendReport {
  uint32_t positions = 0, cached_positions = 0, fresh_positions = 0, selected = 0;
  double recompute_fraction = 0;  // layer x position work recomputed / a full prefill's
  // Since 1.9: cached positions recomputed at every layer (first_tokens),
  // positions x layers given only a KV pass, the ratio used (the default
  // resolved) and how many check layers.
  uint32_t anchored = 0, kv_passes = 0;
  float ratio = 0;
  uint32_t num_check_layers = 0;
  // Since 1.9: the gate refused the method (every position recomputed), and
  // the gate file's KL ratio for it (-1: no record, or no gate).
  bool gated = false;
  float gate_kl_ratio = -1.0f;
};

// The engine's side of a blend (kdn_blend_layer_fn's arguments), on the
// thread that called Model::blend, layer by layer in order; every buffer is
// borrowed for the call. Throwing fails the blend: an Error with its
// status, anything else with KDN_ERR_INTERNAL.
class BlendLayer {
 public:
  virtual ~BlendLayer() = default;
  // The recompute of one layer for `count` positions (kdn.h's layer_fn; a
  // latent model's: k holds each position's latent, v is null).
  virtual void layer(uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count, float* hidden,
                     size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len, size_t total) = 0;
  // Since 1.9, kdn.h's kv_fn: the layer's K and V alone for the positions,
  // bit for bit what layer() writes there, and nothing else. Called only
  // when has_kv_pass() is true.
  virtual bool has_kv_pass() const { return false; }
  virtual void kv_pass(uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count, float* hidden,
                       size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len, size_t total) {
    (void)layer, (void)positions, (void)tokens, (void)count, (void)hidden, (void)hidden_len, (void)hidden_dim;
    (void)k, (void)v, (void)kv_len, (void)total;
    throw Error(KDN_ERR_INTERNAL, "this blend layer has no KV pass");
  }
};

#ifndef SWIG
namespace detail {
// A BlendLayer member as kdn's callback: an exception becomes a status.
template <void (BlendLayer::*Method)(uint32_t, const int32_t*, const int32_t*, size_t, float*, size_t, uint32_t,
                                     float*, float*, size_t, size_t)>
kdn_status BlendTrampoline(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                           float* hidden, size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len,
                           size_t total) {
  try {
    (static_cast<BlendLayer*>(user)->*Method)(layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v,
                                               kv_len, total);
    return KDN_OK;
  } catch (const Error& e) {
    return e.status() != KDN_OK ? e.status() : KDN_ERR_INTERNAL;
  } catch (...) {
    return KDN_ERR_INTERNAL;
  }
}
}  // namespace detail
#endif

// Token ranges [begin, end) (kdn_token_range), as a value: size(), then
// begin(i) / end(i) (0 past the end).
class TokenRanges {
 public:
  size_t size() const { return ranges_.size(); }
  uint64_t begin(size_t i) const { return i < ranges_.size() ? ranges_[i].begin : 0; }
  uint64_t end(size_t i) const { return i < ranges_.size() ? ranges_[i].end : 0; }
#ifndef SWIG
  std::vector<kdn_token_range> ranges_;
#endif
};

// Since 1.12: the recurrent layers' states of one KV call
// (kdn_kv_view.state_layers), for a model with num_state_layers > 0: one
// buffer per recurrent layer, in the model's order, each at least
// ModelSpec::state_bytes long (kdn reads or writes its first state_bytes).
// A store or save takes the state after the request's last token (kept as
// the snapshot at that boundary); a retrieve or load writes the snapshot
// at the prefix it returns. Each language's typemap fills (data, bytes)
// from the caller's own memory, without a copy (a direct ByteBuffer,
// anything with Python's buffer protocol): the caller keeps every buffer
// alive and unmoved for the call (an op: until it is closed), as for the
// KV. Empty: no state, as the calls without one.
class StateLayers {
 public:
  void add(void* data, size_t bytes) {
    data_.push_back(data);
    bytes_.push_back(bytes);
  }
  size_t size() const { return data_.size(); }
  uint64_t bytes(size_t i) const { return i < bytes_.size() ? bytes_[i] : 0; }
  void clear() {
    data_.clear();
    bytes_.clear();
  }

#ifndef SWIG
  // kdn_kv_view.state_layers for a model of `spec`, every bound checked
  // here (kdn cannot bound the states' memory): one state per recurrent
  // layer, each at least state_bytes. NULL when empty.
  void* const* Native(const ModelSpec& spec) const {
    if (data_.empty()) return nullptr;
    if (spec.num_state_layers == 0) {
      detail::Invalid("the call passes " + std::to_string(data_.size()) +
                      " recurrent states, but the model has no recurrent layers (num_state_layers 0)");
    }
    if (data_.size() != spec.num_state_layers) {
      detail::Invalid("the call passes " + std::to_string(data_.size()) + " recurrent states, but the model has " +
                      std::to_string(spec.num_state_layers) + " recurrent layers (one state each)");
    }
    for (size_t i = 0; i < bytes_.size(); ++i) {
      if (bytes_[i] < spec.state_bytes) {
        detail::Invalid("recurrent state " + std::to_string(i) + " is " + std::to_string(bytes_[i]) +
                        " bytes, shorter than the model's state_bytes (" + std::to_string(spec.state_bytes) + ")");
      }
      if (data_[i] == nullptr) detail::Invalid("recurrent state " + std::to_string(i) + " is null");
    }
    return data_.data();
  }

 private:
  std::vector<void*> data_;
  std::vector<uint64_t> bytes_;
#endif
};

// ---- Handles ---------------------------------------------------------------

class Model;
class Op;

class Runtime {
 public:
  explicit Runtime(const RuntimeOptions& options) { Create(options, nullptr); }
  // The editor must stay alive until the runtime, its models and ops are all
  // closed (each language's wrapper keeps a reference to it).
  Runtime(const RuntimeOptions& options, Editor* editor) {
    if (editor == nullptr) detail::Invalid("editor is null");
    Create(options, editor);
  }
  ~Runtime() { close(); }
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Waits for the calls in flight on this runtime (not its models' calls:
  // models and ops keep kdn's runtime alive until they are closed).
  void close() {
    life_.Close([] {}, [this] {
      kdn_runtime_destroy(rt_);
      rt_ = nullptr;
    });
  }
  bool is_closed() const { return life_.closing(); }
  // New calls fail as closed from now on; close() still does the closing.
  void refuse() { life_.Refuse(); }

  Stats stats() {
    const detail::Life::Use use(life_);
    kdn_stats s;
    detail::Check(kdn_stats_init(&s, sizeof s));
    detail::Check(kdn_runtime_get_stats(rt_, &s));
    Stats out;
    out.lookups = s.lookups;
    out.retrieves = s.retrieves;
    out.stores = s.stores;
    out.hits = s.hits;
    out.misses = s.misses;
    out.tokens_served = s.tokens_served;
    out.tokens_stored = s.tokens_stored;
    out.bytes_served = s.bytes_served;
    out.bytes_stored = s.bytes_stored;
    out.chunks = s.chunks;
    out.used_bytes = s.used_bytes;
    out.capacity_bytes = s.capacity_bytes;
    out.evictions = s.evictions;
    out.edited_served = s.edited_served;
    out.leases_active = s.leases_active;
    out.pins_active = s.pins_active;
    out.pins_forced_unpin = s.pins_forced_unpin;
    out.corrupt_detected = s.corrupt_detected;
    out.edits = s.edits;
    out.tokens_requested = s.tokens_requested;
    out.prefill_tokens = s.prefill_tokens;
    out.prefill_ns = s.prefill_ns;
    out.ttft_saved_ns = s.ttft_saved_ns;
    out.tokens_served_unpriced = s.tokens_served_unpriced;
    out.delivery_ns = s.delivery_ns;
    out.lookup_tokens = s.lookup_tokens;
    out.lookup_hit_tokens = s.lookup_hit_tokens;
    out.recompute_tokens = s.recompute_tokens;
    return out;
  }

  Latency latency(int kind) {
    const detail::Life::Use use(life_);
    kdn_latency l;
    detail::Check(kdn_latency_init(&l, sizeof l));
    detail::Check(kdn_runtime_get_latency(rt_, static_cast<kdn_latency_kind>(kind), &l));
    Latency out;
    out.count = l.count;
    out.mean_us = l.mean_us;
    out.p50_us = l.p50_us;
    out.p90_us = l.p90_us;
    out.p99_us = l.p99_us;
    out.max_us = l.max_us;
    return out;
  }

  uint32_t tier_count() {
    const detail::Life::Use use(life_);
    uint32_t n = 0;
    detail::Check(kdn_runtime_get_tier_count(rt_, &n));
    return n;
  }

  TierStats tier_stats(uint32_t index) {
    const detail::Life::Use use(life_);
    kdn_tier_stats t;
    detail::Check(kdn_tier_stats_init(&t, sizeof t));
    detail::Check(kdn_runtime_get_tier_stats(rt_, index, &t));
    TierStats out;
    out.kind = t.kind;
    out.name = t.name;
    out.codec = t.codec;
    out.hits = t.hits;
    out.misses = t.misses;
    out.puts = t.puts;
    out.put_refusals = t.put_refusals;
    out.evictions = t.evictions;
    out.demotions_in = t.demotions_in;
    out.promotions_in = t.promotions_in;
    out.bytes_in = t.bytes_in;
    out.bytes_out = t.bytes_out;
    out.objects = t.objects;
    out.used_bytes = t.used_bytes;
    out.capacity_bytes = t.capacity_bytes;
    out.corrupt_detected = t.corrupt_detected;
    out.encoded_chunks = t.encoded_chunks;
    out.bytes_before_encoding = t.bytes_before_encoding;
    out.bytes_after_encoding = t.bytes_after_encoding;
    out.encode_failures = t.encode_failures;
    out.decode_failures = t.decode_failures;
    out.io_errors = t.io_errors;
    out.remote_calls = t.remote_calls;
    out.remote_failed_calls = t.remote_failed_calls;
    out.remote_timeouts = t.remote_timeouts;
    out.write_queue_full = t.write_queue_full;
    out.write_queued_bytes = t.write_queued_bytes;
    out.high_watermark = t.high_watermark;
    out.low_watermark = t.low_watermark;
    out.delivery_ns_per_token = t.delivery_ns_per_token;
    out.device_delivery_ns_per_token = t.device_delivery_ns_per_token;
    out.recompute_chunks = t.recompute_chunks;
    out.auth_failures = t.auth_failures;
    return out;
  }

  // Since 1.13: the quotas of tier `index`, in the order its TierConfig
  // added them (empty: none).
  std::vector<QuotaStats> quota_stats(uint32_t index) {
    const detail::Life::Use use(life_);
    detail::Since(reinterpret_cast<const void*>(&kdn_runtime_get_quota_stats), "kdn_runtime_get_quota_stats", 13);
    size_t count = 0;
    detail::Check(kdn_runtime_get_quota_stats(rt_, index, nullptr, 0, &count));
    const kdn_quota_stats init = KDN_QUOTA_STATS_INIT;  // the macro: no 1.13 symbol needed
    std::vector<kdn_quota_stats> raw(count, init);
    if (count > 0) detail::Check(kdn_runtime_get_quota_stats(rt_, index, raw.data(), raw.size(), &count));
    std::vector<QuotaStats> out;
    out.reserve(std::min(count, raw.size()));
    static const char kHex[] = "0123456789abcdef";
    for (size_t i = 0; i < count && i < raw.size(); ++i) {
      const kdn_quota_stats& q = raw[i];
      QuotaStats s;
      s.ns_hash.reserve(2 * sizeof q.ns_hash);
      for (uint8_t b : q.ns_hash) {
        s.ns_hash.push_back(kHex[b >> 4]);
        s.ns_hash.push_back(kHex[b & 15]);
      }
      s.quota_bytes = q.quota_bytes;
      s.used_bytes = q.used_bytes;
      s.objects = q.objects;
      s.quota_evictions = q.quota_evictions;
      s.room_evictions = q.room_evictions;
      s.refused = q.refused;
      out.push_back(std::move(s));
    }
    return out;
  }

  // A model of this runtime (the caller closes it).
  Model* create_model(const ModelSpec& spec);

#ifndef SWIG
 private:
  void Create(const RuntimeOptions& options, Editor* editor) {
    if (!options.encryption_key_file.empty() || !options.encryption_key_env.empty()) {
      detail::SinceFields("encryption_key_file and encryption_key_env", 14);
    }
    std::vector<kdn_tier_config> tiers(options.tiers.size());
    // Each tier's kdn_quota array, alive until kdn_runtime_create returns.
    std::vector<std::vector<kdn_quota>> quotas(options.tiers.size());
    for (size_t i = 0; i < tiers.size(); ++i) {
      const TierConfig& t = options.tiers[i];
      kdn_tier_config& c = tiers[i];
      detail::Check(kdn_tier_config_init(&c, sizeof c));
      c.kind = static_cast<kdn_tier_kind>(t.kind);
      c.capacity_bytes = t.capacity_bytes;
      c.path = t.path.data();
      c.path_len = t.path.size();
      c.policy = static_cast<kdn_eviction_policy>(t.policy);
      c.high_watermark = t.high_watermark;
      c.low_watermark = t.low_watermark;
      c.write_through = t.write_through ? 1u : 0u;
      c.codec = t.codec.data();
      c.codec_len = t.codec.size();
      c.address = t.address.data();
      c.address_len = t.address.size();
      c.token = t.token.data();
      c.token_len = t.token.size();
      c.timeout_ms = t.timeout_ms;
      c.tls_ca_file = t.tls_ca_file.data();
      c.tls_ca_file_len = t.tls_ca_file.size();
      c.tls_server_name = t.tls_server_name.data();
      c.tls_server_name_len = t.tls_server_name.size();
      // 1.3's fields stay zero unless set, so a 1.2 library (which refuses
      // a struct whose tail it does not know unless it is zero) still works.
      if (!t.user.empty()) {
        c.user = t.user.data();
        c.user_len = t.user.size();
      }
      c.ttl_ms = t.ttl_ms;
      if (!t.levels.empty()) {
        c.levels = t.levels.data();
        c.levels_len = t.levels.size();
      }
      if (!t.quotas.empty()) {
        std::vector<kdn_quota>& q = quotas[i];
        const kdn_quota init = KDN_QUOTA_INIT;  // the macro: no 1.13 symbol needed
        q.assign(t.quotas.size(), init);
        for (size_t j = 0; j < q.size(); ++j) {
          q[j].ns = t.quotas[j].ns.data();
          q[j].ns_len = t.quotas[j].ns.size();
          q[j].bytes = t.quotas[j].bytes;
        }
        c.quotas = q.data();
        c.num_quotas = q.size();
      }
    }
    kdn_runtime_options o;
    detail::Check(kdn_runtime_options_init(&o, sizeof o));
    o.chunk_tokens = options.chunk_tokens;
    o.host_capacity_bytes = options.host_capacity_bytes;
    o.hash_seed = options.hash_seed;
    o.worker_threads = options.worker_threads;
    o.tiers = tiers.empty() ? nullptr : tiers.data();
    o.num_tiers = tiers.size();
    o.device = static_cast<kdn_device_mode>(options.device);
    o.device_ordinal = options.device_ordinal;
    o.load_slower_than_prefill = options.load_slower_than_prefill ? 1u : 0u;
    if (!options.secret_file.empty()) {
      o.secret_file = options.secret_file.data();
      o.secret_file_len = options.secret_file.size();
    }
    // 1.14's fields stay zero unless set (a 1.13 library refuses a struct
    // whose tail it does not know unless it is zero; set, they were checked
    // against the library's version above).
    if (!options.encryption_key_file.empty()) {
      o.encryption_key_file = options.encryption_key_file.data();
      o.encryption_key_file_len = options.encryption_key_file.size();
    }
    if (!options.encryption_key_env.empty()) {
      o.encryption_key_env = options.encryption_key_env.data();
      o.encryption_key_env_len = options.encryption_key_env.size();
    }
    if (editor) {
      detail::Check(kdn_runtime_create_with_editor(&o, &detail::EditTrampoline, editor, &rt_));
    } else {
      detail::Check(kdn_runtime_create(&o, &rt_));
    }
  }

  kdn_runtime* rt_ = nullptr;
  detail::Life life_{"the runtime"};
#endif
};

// Lookups of many requests at once: add them, run Model::lookup_batch, read
// result(i). A bad request fails alone, in its result's status.
class LookupBatch {
 public:
  void add(const Request& request) { requests_.push_back(request); }
  void clear() {
    requests_.clear();
    results_.clear();
  }
  size_t size() const { return requests_.size(); }
  LookupResult result(size_t i) const {
    if (i >= results_.size()) detail::Invalid("no result " + std::to_string(i) + " (run lookup_batch first)");
    return results_[i];
  }
#ifndef SWIG
  std::vector<Request> requests_;
  std::vector<LookupResult> results_;
#endif
};

class Model {
 public:
  ~Model() { close(); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Waits for the calls in flight on this model (its ops live on).
  void close() {
    life_.Close([] {}, [this] {
      kdn_model_destroy(m_);
      m_ = nullptr;
    });
  }
  bool is_closed() const { return life_.closing(); }
  // New calls fail as closed from now on; close() still does the closing.
  void refuse() { life_.Refuse(); }
  const ModelSpec& spec() const { return spec_; }

  uint64_t kv_bytes_per_token() const {
    const detail::Life::Use use(life_);
    uint64_t n = 0;
    detail::Check(kdn_model_get_kv_bytes_per_token(m_, &n));
    return n;
  }
  // The 32-byte identity kdn derived from the spec, as 64 hex digits.
  std::string fingerprint() const {
    uint8_t id[32];
    {
      const detail::Life::Use use(life_);
      detail::Check(kdn_model_get_fingerprint(m_, id));
    }
    static const char kHex[] = "0123456789abcdef";
    std::string out;
    for (uint8_t b : id) {
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
    return out;
  }

  // The engine prefilled `tokens` tokens of this model in `elapsed_ns` (since
  // 1.4): later loads price the tokens they serve at the mean time per token.
  void report_prefill(uint64_t tokens, uint64_t elapsed_ns) const {
    const detail::Life::Use use(life_);
    detail::Check(kdn_model_report_prefill(m_, tokens, elapsed_ns));
  }

  LookupResult lookup(const std::string& ns, const Request& request) const {
    const detail::Life::Use use(life_);
    kdn_request r = request.Native();
    kdn_lookup_result res;
    detail::Check(kdn_lookup_result_init(&res, sizeof res));
    detail::Check(kdn_kv_lookup(m_, ns.data(), ns.size(), &r, 1, &res));
    return LookupResult::From(res);
  }

  void lookup_batch(const std::string& ns, LookupBatch& batch) const {
    const detail::Life::Use use(life_);
    std::vector<kdn_request> reqs;
    reqs.reserve(batch.requests_.size());
    for (const Request& r : batch.requests_) reqs.push_back(r.Native());
    std::vector<kdn_lookup_result> res(reqs.size());
    for (kdn_lookup_result& r : res) detail::Check(kdn_lookup_result_init(&r, sizeof r));
    detail::Check(kdn_kv_lookup(m_, ns.data(), ns.size(), reqs.data(), reqs.size(), res.data()));
    batch.results_.clear();
    for (const kdn_lookup_result& r : res) batch.results_.push_back(LookupResult::From(r));
  }

  KvResult store(const std::string& ns, const Request& request, const KvView& view, void* data, size_t bytes) const {
    return Call(&kdn_kv_store, ns, request, view, Host(data, bytes));
  }
  // A miss is not an error: tokens is 0.
  KvResult retrieve(const std::string& ns, const Request& request, const KvView& view, void* data,
                    size_t bytes) const {
    return Call(&kdn_kv_retrieve, ns, request, view, Host(data, bytes));
  }

  // Asynchronous, layer by layer. The buffer must stay alive and unmoved
  // until the op is closed (each language's Op keeps a reference to it).
  Op* load_async(const std::string& ns, const Request& request, const KvView& view, void* data, size_t bytes);
  Op* save_async(const std::string& ns, const Request& request, const KvView& view, void* data, size_t bytes);

  // The same calls on memory given by address (since 1.5): device memory
  // (Memory::kind KDN_MEMORY_DEVICE) or host memory a language found itself.
  KvResult store_memory(const std::string& ns, const Request& request, const KvView& view,
                        const Memory& memory) const {
    return Call(&kdn_kv_store, ns, request, view, memory);
  }
  KvResult retrieve_memory(const std::string& ns, const Request& request, const KvView& view,
                           const Memory& memory) const {
    return Call(&kdn_kv_retrieve, ns, request, view, memory);
  }
  Op* load_async_memory(const std::string& ns, const Request& request, const KvView& view, const Memory& memory);
  Op* save_async_memory(const std::string& ns, const Request& request, const KvView& view, const Memory& memory);

  // Since 1.12: the same calls with the recurrent layers' states (a model
  // with num_state_layers > 0; see StateLayers). A retrieve or load of such
  // a model needs them (kdn: KDN_ERR_INVALID_ARGUMENT without); a store or
  // save without them stores KV that no lookup counts. Host memory only
  // (kdn refuses device views of such a model).
  KvResult store_states(const std::string& ns, const Request& request, const KvView& view, void* data, size_t bytes,
                        const StateLayers& states) const {
    return Call(&kdn_kv_store, ns, request, view, Host(data, bytes), &states);
  }
  KvResult retrieve_states(const std::string& ns, const Request& request, const KvView& view, void* data,
                           size_t bytes, const StateLayers& states) const {
    return Call(&kdn_kv_retrieve, ns, request, view, Host(data, bytes), &states);
  }
  Op* load_async_states(const std::string& ns, const Request& request, const KvView& view, void* data, size_t bytes,
                        const StateLayers& states);
  Op* save_async_states(const std::string& ns, const Request& request, const KvView& view, void* data, size_t bytes,
                        const StateLayers& states);
  KvResult store_memory_states(const std::string& ns, const Request& request, const KvView& view,
                               const Memory& memory, const StateLayers& states) const {
    return Call(&kdn_kv_store, ns, request, view, memory, &states);
  }
  KvResult retrieve_memory_states(const std::string& ns, const Request& request, const KvView& view,
                                  const Memory& memory, const StateLayers& states) const {
    return Call(&kdn_kv_retrieve, ns, request, view, memory, &states);
  }
  Op* load_async_memory_states(const std::string& ns, const Request& request, const KvView& view,
                               const Memory& memory, const StateLayers& states);
  Op* save_async_memory_states(const std::string& ns, const Request& request, const KvView& view,
                               const Memory& memory, const StateLayers& states);

  // Blending (experimental): composes the segments, in order, into the
  // views; `layer` recomputes the selected tokens layer by layer (on this
  // thread, during the call), and gives the check layers' KV passes when it
  // has one (1.9). A context with documents needs the view's room
  // (KvView::num_tokens); too little: KDN_ERR_BUFFER_TOO_SMALL.
  BlendReport blend(const std::string& ns, const BlendSegments& segments, const BlendOptions& options,
                    const KvView& view, void* data, size_t bytes, BlendLayer* layer) const {
    return blend_memory(ns, segments, options, view, Host(data, bytes), layer);
  }
  BlendReport blend_memory(const std::string& ns, const BlendSegments& segments, const BlendOptions& options,
                           const KvView& view, const Memory& memory, BlendLayer* layer) const {
    const std::vector<kdn_blend_segment> segs = segments.Native();
    return Blend(ns, &segs, nullptr, options, view, memory, layer);
  }
  // Since 1.9: a blend of the context given as its tokens (kdn_kv_blend_tokens):
  // the ranges match() finds are placed from their documents, the rest is
  // computed. The view holds the context (num_tokens 0 or at least its length).
  BlendReport blend_tokens(const std::string& ns, const Request& context, const BlendOptions& options,
                           const KvView& view, void* data, size_t bytes, BlendLayer* layer) const {
    return blend_tokens_memory(ns, context, options, view, Host(data, bytes), layer);
  }
  BlendReport blend_tokens_memory(const std::string& ns, const Request& context, const BlendOptions& options,
                                  const KvView& view, const Memory& memory, BlendLayer* layer) const {
    if (context.uses_hashes()) detail::Invalid("a blend by tokens takes token ids, not block hashes");
    return Blend(ns, nullptr, &context, options, view, memory, layer);
  }
  // Since 1.9 (kdn_kv_match, experimental): the ranges [begin, end) of the
  // context's tokens found in this namespace's knowledge items, ascending;
  // the rest is what the engine must compute.
  TokenRanges match(const std::string& ns, const Request& context) const {
    if (context.uses_hashes()) detail::Invalid("match takes token ids, not block hashes");
    const detail::Life::Use use(life_);
    const kdn_request r = context.Native();
    TokenRanges out;
    size_t count = 0;
    for (;;) {  // a put between the two calls may add ranges: ask again
      out.ranges_.resize(count ? count : 8);
      detail::Check(kdn_kv_match(m_, ns.data(), ns.size(), r.tokens, r.num_tokens, out.ranges_.data(),
                                 out.ranges_.size(), &count));
      if (count <= out.ranges_.size()) break;
    }
    out.ranges_.resize(count);
    return out;
  }

  // ---- Knowledge items ----
  void knowledge_put(const std::string& ns, const std::string& doc_id, uint64_t version, const std::string& metadata,
                     const Request& tokens, const KvView& view, void* data, size_t bytes) const {
    if (tokens.uses_hashes()) detail::Invalid("a knowledge item takes token ids, not block hashes");
    const detail::Life::Use use(life_);
    const KvCallArgs a(*this, &tokens, view, Host(data, bytes));
    detail::Check(kdn_knowledge_put(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), version,
                                    metadata.data(), metadata.size(), a.request.tokens, a.request.num_tokens,
                                    &a.view, 1));
  }
  DocumentInfo knowledge_info(const std::string& ns, const std::string& doc_id) const {
    const detail::Life::Use use(life_);
    kdn_document_info d;
    detail::Check(kdn_document_info_init(&d, sizeof d));
    detail::Check(kdn_knowledge_get_info(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), &d));
    return DocumentInfo::From(d);
  }
  // Every document of this model and namespace, in doc_id order.
  size_t knowledge_list(const std::string& ns) {
    const detail::Life::Use use(life_);
    size_t count = 0;
    std::vector<kdn_document_info> docs;
    for (;;) {  // a put between the two calls may add documents: ask again
      docs.resize(count ? count : 16);
      for (kdn_document_info& d : docs) detail::Check(kdn_document_info_init(&d, sizeof d));
      detail::Check(kdn_knowledge_list(m_, ns.data(), ns.size(), docs.data(), docs.size(), &count));
      if (count <= docs.size()) break;
    }
    listed_.clear();
    for (size_t i = 0; i < count; ++i) listed_.push_back(DocumentInfo::From(docs[i]));
    return listed_.size();
  }
  // Document i of the last knowledge_list on this model (not thread-safe:
  // the language wrappers copy them out under their own lock).
  DocumentInfo listed(size_t i) const {
    if (i >= listed_.size()) detail::Invalid("no listed document " + std::to_string(i));
    return listed_[i];
  }
  void knowledge_pin(const std::string& ns, const std::string& doc_id, int64_t ttl_ms) const {
    const detail::Life::Use use(life_);
    detail::Check(kdn_knowledge_pin(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), ttl_ms));
  }
  void knowledge_unpin(const std::string& ns, const std::string& doc_id) const {
    const detail::Life::Use use(life_);
    detail::Check(kdn_knowledge_unpin(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size()));
  }
  void knowledge_expire(const std::string& ns, const std::string& doc_id, int64_t ttl_ms) const {
    const detail::Life::Use use(life_);
    detail::Check(kdn_knowledge_expire(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), ttl_ms));
  }
  void knowledge_delete(const std::string& ns, const std::string& doc_id) const {
    const detail::Life::Use use(life_);
    detail::Check(kdn_knowledge_delete(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size()));
  }
  // The document's KV into the buffer (the view must state its room,
  // num_tokens) and its tokens into the result. Too little room: Error with
  // KDN_ERR_BUFFER_TOO_SMALL and needed() = the document's length.
  FetchResult knowledge_fetch(const std::string& ns, const std::string& doc_id, const KvView& view, void* data,
                              size_t bytes) const {
    const detail::Life::Use use(life_);
    const KvCallArgs a(*this, nullptr, view, Host(data, bytes));
    FetchResult out;
    const uint64_t per_token = uint64_t{spec_.num_layers} * spec_.row_elements() * detail::DtypeBytes(spec_.dtype);
    if (per_token == 0 || view.num_tokens > bytes / per_token) {
      detail::Invalid("the view's room of " + std::to_string(view.num_tokens) + " tokens exceeds the buffer's " +
                      std::to_string(bytes) + " bytes");
    }
    out.tokens_.resize(view.num_tokens);
    kdn_kv_result r;
    detail::Check(kdn_kv_result_init(&r, sizeof r));
    const kdn_status s = kdn_knowledge_fetch(m_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), &a.view, 1,
                                             out.tokens_.data(), out.tokens_.size(), &r);
    detail::Check(s, s == KDN_ERR_BUFFER_TOO_SMALL ? r.tokens : 0);
    out.tokens_.resize(r.tokens);
    out.result = KvResult::From(r);
    return out;
  }

#ifndef SWIG
  Model(kdn_model* m, const ModelSpec& spec) : m_(m), spec_(spec) {}

 private:
  static Memory Host(void* data, size_t bytes) {
    Memory m;
    m.address = reinterpret_cast<uintptr_t>(data);
    m.bytes = bytes;
    return m;
  }

  // kdn_kv_blend (segments) or kdn_kv_blend_tokens (context).
  BlendReport Blend(const std::string& ns, const std::vector<kdn_blend_segment>* segs, const Request* context,
                    const BlendOptions& options, const KvView& view, const Memory& memory, BlendLayer* layer) const {
    if (layer == nullptr) detail::Invalid("blend: the layer callback is null");
    const detail::Life::Use use(life_);
    const KvCallArgs a(*this, context, view, memory);
    kdn_blend_options o;
    detail::Check(kdn_blend_options_init(&o, sizeof o));
    o.ratio = options.ratio;
    o.threshold = options.threshold;
    o.hidden_dim = options.hidden_dim;
    o.check_layers = options.check_layers.empty() ? nullptr : options.check_layers.data();
    o.num_check_layers = options.check_layers.size();
    o.rope_scaling = static_cast<kdn_rope_scaling>(options.rope_scaling);
    o.rope_factor = options.rope_factor;
    o.layer_fn = &detail::BlendTrampoline<&BlendLayer::layer>;
    o.user = layer;
    if (layer->has_kv_pass()) o.kv_fn = &detail::BlendTrampoline<&BlendLayer::kv_pass>;
    o.kv_cost = options.kv_cost;
    o.first_tokens = options.first_tokens;
    if (!options.gate_file.empty()) {
      o.gate_file = options.gate_file.data();
      o.gate_file_len = options.gate_file.size();
      o.max_kl_ratio = options.max_kl_ratio;
    }
    kdn_blend_report r;
    detail::Check(kdn_blend_report_init(&r, sizeof r));
    if (segs != nullptr) {
      detail::Check(kdn_kv_blend(m_, ns.data(), ns.size(), segs->data(), segs->size(), &o, &a.view, 1, &r));
    } else {
      detail::Check(kdn_kv_blend_tokens(m_, ns.data(), ns.size(), a.request.tokens, a.request.num_tokens, &o,
                                        &a.view, 1, &r));
    }
    BlendReport out;
    out.positions = r.positions;
    out.cached_positions = r.cached_positions;
    out.fresh_positions = r.fresh_positions;
    out.selected = r.selected;
    out.recompute_fraction = r.recompute_fraction;
    out.anchored = r.anchored;
    out.kv_passes = r.kv_passes;
    out.ratio = r.ratio;
    out.num_check_layers = r.num_check_layers;
    out.gated = r.gated != 0;
    out.gate_kl_ratio = r.gate_kl_ratio;
    return out;
  }

  // What every KV call passes kdn: the request (if any) and the native view
  // over the caller's memory, with the pointer arrays that view needs.
  // `states` (since 1.12): the recurrent layers' states, borrowed for the
  // call (kdn copies the pointer array; the memory, an op's, until it ends).
  struct KvCallArgs {
    KvCallArgs(const Model& model, const Request* req, const KvView& kv, const Memory& memory,
               const StateLayers* states = nullptr)
        : request(NativeRequest(req)),
          view(kv.Native(model.spec_, reinterpret_cast<void*>(static_cast<uintptr_t>(memory.address)),
                         static_cast<size_t>(memory.bytes), &k, &v)) {
      view.memory = static_cast<kdn_memory_kind>(memory.kind);
      view.cuda_stream = reinterpret_cast<void*>(static_cast<uintptr_t>(memory.cuda_stream));
      if (states != nullptr) view.state_layers = states->Native(model.spec_);
    }
    KvCallArgs(const KvCallArgs&) = delete;
    KvCallArgs& operator=(const KvCallArgs&) = delete;
    std::vector<void*> k, v;  // before view: Native fills them
    kdn_request request;
    kdn_kv_view view;

    static kdn_request NativeRequest(const Request* req) {
      if (req) return req->Native();
      kdn_request none = KDN_REQUEST_INIT;
      return none;
    }
  };

  using KvCall = kdn_status (*)(const kdn_model*, const char*, size_t, const kdn_request*, const kdn_kv_view*, size_t,
                                kdn_kv_result*);
  KvResult Call(KvCall call, const std::string& ns, const Request& request, const KvView& view,
                const Memory& memory, const StateLayers* states = nullptr) const {
    const detail::Life::Use use(life_);
    const KvCallArgs a(*this, &request, view, memory, states);
    kdn_kv_result res;
    detail::Check(kdn_kv_result_init(&res, sizeof res));
    detail::Check(call(m_, ns.data(), ns.size(), &a.request, &a.view, 1, &res));
    return KvResult::From(res);
  }
  using OpCall = kdn_status (*)(const kdn_model*, const char*, size_t, const kdn_request*, const kdn_kv_view*, size_t,
                                kdn_op**);
  Op* Start(OpCall call, const std::string& ns, const Request& request, const KvView& view,
            const Memory& memory, const StateLayers* states = nullptr) const;

  kdn_model* m_ = nullptr;
  ModelSpec spec_;
  detail::Life life_{"the model"};
  std::vector<DocumentInfo> listed_;
#endif
};

// A load or save in progress.
class Op {
 public:
  ~Op() { close(); }
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // Cancels it if it still runs, ends the waits in progress (they throw the
  // closed Error), waits for the calls in flight, then until nothing touches
  // the buffer, frees it.
  void close() {
    life_.Close([this] { kdn_op_cancel(op_); }, [this] {
      kdn_op_destroy(op_);
      op_ = nullptr;
    });
  }
  bool is_closed() const { return life_.closing(); }
  // New calls fail as closed from now on; close() still does the closing.
  void refuse() { life_.Refuse(); }

  void layer_ready(uint32_t layer) {
    const detail::Life::Use use(life_);
    detail::Check(kdn_op_layer_ready(op_, layer));
  }
  // true: the op ended (Error if it failed or was cancelled); false: the
  // time ran out first (timeout_ms < 0: no limit).
  bool wait(int64_t timeout_ms) {
    return Sliced(timeout_ms, [this](int64_t slice) { return kdn_op_wait(op_, slice); });
  }
  bool wait_layer(uint32_t layer, int64_t timeout_ms) {
    return Sliced(timeout_ms, [this, layer](int64_t slice) { return kdn_op_wait_layer(op_, layer, slice); });
  }
  int poll() {
    const detail::Life::Use use(life_);
    kdn_op_state state = KDN_OP_PENDING;
    detail::Check(kdn_op_poll(op_, &state));
    return state;
  }
  void cancel() {
    const detail::Life::Use use(life_);
    detail::Check(kdn_op_cancel(op_));
  }
  KvResult result() {
    const detail::Life::Use use(life_);
    kdn_kv_result r;
    detail::Check(kdn_kv_result_init(&r, sizeof r));
    detail::Check(kdn_op_get_result(op_, &r));
    return KvResult::From(r);
  }
  // The failed ranges of a load: count, then begin(i) / end(i).
  size_t failed_ranges() {
    const detail::Life::Use use(life_);
    kdn_op* op = op_;
    size_t count = 0;
    detail::Check(kdn_op_get_failed_ranges(op, nullptr, 0, &count));
    ranges_.resize(count);
    if (count) detail::Check(kdn_op_get_failed_ranges(op, ranges_.data(), ranges_.size(), &count));
    ranges_.resize(std::min(count, ranges_.size()));
    return ranges_.size();
  }
  uint64_t range_begin(size_t i) const { return i < ranges_.size() ? ranges_[i].begin : 0; }
  uint64_t range_end(size_t i) const { return i < ranges_.size() ? ranges_[i].end : 0; }

#ifndef SWIG
  explicit Op(kdn_op* op) : op_(op) {}

 private:
  // A blocking wait run in slices of at most kWaitSliceMs, so that a close
  // from another thread ends it (with the closed Error) instead of freeing
  // the op under it. `wait(slice_ms)` is one kdn wait.
  template <typename Wait>
  bool Sliced(int64_t timeout_ms, Wait wait) {
    const detail::Life::Use use(life_);
    using Clock = std::chrono::steady_clock;
    const bool limited = timeout_ms >= 0 && timeout_ms < (int64_t{1} << 40);  // 2^40 ms: 34 years, no limit
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(limited ? timeout_ms : 0);
    for (;;) {
      int64_t slice = detail::kWaitSliceMs;
      if (limited) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        slice = std::clamp<int64_t>(left, 0, slice);
      }
      const kdn_status s = wait(slice);
      if (s != KDN_ERR_TIMEOUT || life_.closing()) {
        if (s != KDN_OK && life_.closing()) {
          throw Error(KDN_ERR_INVALID_ARGUMENT, "the op was closed during the wait", true);
        }
        detail::Check(s);
        return true;
      }
      if (limited && Clock::now() >= deadline) return false;
    }
  }

  kdn_op* op_ = nullptr;
  detail::Life life_{"the op"};
  std::vector<kdn_token_range> ranges_;
#endif
};

inline Model* Runtime::create_model(const ModelSpec& spec) {
  kdn_model_spec s;
  detail::Check(kdn_model_spec_init(&s, sizeof s));
  s.num_layers = spec.num_layers;
  s.num_kv_heads = spec.num_kv_heads;
  s.head_dim = spec.head_dim;
  s.dtype = static_cast<kdn_dtype>(spec.dtype);
  s.rope_theta = spec.rope_theta;
  s.rope_style = static_cast<kdn_rope_style>(spec.rope_style);
  s.rotary_dim = spec.rotary_dim;
  s.cache_kind = static_cast<kdn_cache_kind>(spec.cache_kind);
  s.latent_dim = spec.latent_dim;
  s.latent_rope_dim = spec.latent_rope_dim;
  // One window per layer (kdn copies them): the layers not set are full.
  std::vector<uint32_t> windows = spec.layer_windows;
  if (!windows.empty()) {
    if (windows.size() > spec.num_layers) {
      detail::Invalid("model spec: a layer window is set for layer " + std::to_string(windows.size() - 1) +
                      " of a model of " + std::to_string(spec.num_layers) + " layers");
    }
    windows.resize(spec.num_layers, 0);
    s.layer_windows = windows.data();
  }
  s.num_state_layers = spec.num_state_layers;
  s.state_bytes = spec.state_bytes;
  s.fingerprint = spec.fingerprint.data();
  s.fingerprint_len = spec.fingerprint.size();
  const detail::Life::Use use(life_);
  kdn_model* m = nullptr;
  detail::Check(kdn_model_create(rt_, &s, &m));
  return new Model(m, spec);
}

inline Op* Model::load_async(const std::string& ns, const Request& request, const KvView& view, void* data,
                             size_t bytes) {
  return Start(&kdn_kv_load_async, ns, request, view, Host(data, bytes));
}

inline Op* Model::save_async(const std::string& ns, const Request& request, const KvView& view, void* data,
                             size_t bytes) {
  return Start(&kdn_kv_save_async, ns, request, view, Host(data, bytes));
}

inline Op* Model::load_async_memory(const std::string& ns, const Request& request, const KvView& view,
                                    const Memory& memory) {
  return Start(&kdn_kv_load_async, ns, request, view, memory);
}

inline Op* Model::save_async_memory(const std::string& ns, const Request& request, const KvView& view,
                                    const Memory& memory) {
  return Start(&kdn_kv_save_async, ns, request, view, memory);
}

inline Op* Model::load_async_states(const std::string& ns, const Request& request, const KvView& view, void* data,
                                    size_t bytes, const StateLayers& states) {
  return Start(&kdn_kv_load_async, ns, request, view, Host(data, bytes), &states);
}

inline Op* Model::save_async_states(const std::string& ns, const Request& request, const KvView& view, void* data,
                                    size_t bytes, const StateLayers& states) {
  return Start(&kdn_kv_save_async, ns, request, view, Host(data, bytes), &states);
}

inline Op* Model::load_async_memory_states(const std::string& ns, const Request& request, const KvView& view,
                                           const Memory& memory, const StateLayers& states) {
  return Start(&kdn_kv_load_async, ns, request, view, memory, &states);
}

inline Op* Model::save_async_memory_states(const std::string& ns, const Request& request, const KvView& view,
                                           const Memory& memory, const StateLayers& states) {
  return Start(&kdn_kv_save_async, ns, request, view, memory, &states);
}

inline Op* Model::Start(OpCall call, const std::string& ns, const Request& request, const KvView& view,
                        const Memory& memory, const StateLayers* states) const {
  const detail::Life::Use use(life_);
  const KvCallArgs a(*this, &request, view, memory, states);
  kdn_op* op = nullptr;
  detail::Check(call(m_, ns.data(), ns.size(), &a.request, &a.view, 1, &op));
  return new Op(op);
}

}  // namespace binding
}  // namespace kdn

#endif  // KDN_BINDING_HPP

// SPDX-License-Identifier: Apache-2.0
// Asynchronous, layer-by-layer loads and saves, as serving engines overlap
// KV transfer with their forward pass (vLLM's start_load_kv /
// wait_for_layer_load / save_kv_layer / wait_for_save).
//
// A load leases the cached prefix's chunks, then writes them into the
// engine's views one layer at a time, in layer order; WaitLayer(l) returns
// once layer l is written. A save plans the chunks no tier holds yet; each
// SaveLayer(l) gathers layer l from the views in the background; once every
// layer is in, the chunks are put into the store, on a worker thread (the
// caller never waits for disk or encoding work).
//
// A request may carry several KV groups (for example full-attention and
// sliding-window layers), each a view over its own subset of the model's
// layers. The views' arrays (layer pointers, block tables) are copied at the
// start; the KV memory they point to is borrowed until the op ends.
// Thread-safety: Wait*, Poll, Cancel and Outcome may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/engine/kv_store.h"
#include "core/util/executor.h"

namespace kdn::store {

struct GroupedModel;  // engine/groups.h

// A request's keys with owned storage (the op outlives the caller's arrays).
struct OwnedKeys {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> hashes;
  std::uint32_t hash_bytes = 0, block_tokens = 0;
  std::vector<std::uint8_t> salt;
  TokenKeys keys() const { return TokenKeys{tokens, hashes, hash_bytes, block_tokens, salt}; }
  static OwnedKeys Of(const TokenKeys& k) {
    OwnedKeys o;
    o.tokens.assign(k.tokens.begin(), k.tokens.end());
    o.hashes.assign(k.hashes.begin(), k.hashes.end());
    o.hash_bytes = k.hash_bytes;
    o.block_tokens = k.block_tokens;
    o.salt.assign(k.salt.begin(), k.salt.end());
    return o;
  }
};

enum class OpState { kPending, kDone, kFailed, kCancelled };

struct OpResult {
  OpState state = OpState::kPending;
  Status status;
  std::uint64_t tokens = 0;    // load: tokens written (all chunks that loaded); save: tokens cached afterwards
  std::uint64_t covered = 0;   // load: the cached prefix found
  std::vector<TokenRange> failed;  // load: ranges of the prefix that could not be read (recompute them)
  bool lossy = false;              // load: some KV written was decoded from a lossy codec
};

class EngineOp : public std::enable_shared_from_this<EngineOp> {
 public:
  virtual ~EngineOp() = default;
  // Until the op ends or timeout_ms passes (< 0: no limit): kTimeout on timeout;
  // the op's own status after (kCancelled when cancelled).
  Status Wait(std::int64_t timeout_ms);
  OpState Poll() const;
  // Asks the op to stop; it ends kCancelled at its next step.
  virtual void Cancel();
  OpResult Outcome() const;

 protected:
  void Finish(OpState state, Status status);  // mu_ not held
  bool cancelled() const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  OpResult result_;       // guarded by mu_
  bool cancel_ = false;   // guarded by mu_
};

class LoadOp final : public EngineOp {
 public:
  // Validates the groups, then loads on `executor`. `device`: the views are
  // device memory (device/device.h): the chunks are delivered by the store's
  // device (KvStore::DeliverToDevice), every layer at once, and then every
  // WaitLayer returns. `target`: the caller's delivery target (none: no
  // deadline), for tiers with quality levels.
  // `grouped`: a model kept in layer groups (engine/groups.h): the load is
  // GroupedRetrieve's (the one rule for hits) on the executor, every layer
  // at once, its recurrent state written into `state` (host views only).
  static Result<std::shared_ptr<LoadOp>> Start(KvStore& store, Executor& executor, const ModelKv& model,
                                               std::string ns, OwnedKeys keys, std::vector<KvGroup> groups,
                                               bool device = false, const DeliveryTarget& target = {},
                                               std::shared_ptr<const GroupedModel> grouped = nullptr,
                                               std::vector<void*> state = {});
  // Until model layer `layer` is written (or the op ended). kNotFound when
  // the op ended without writing it (cancelled, failed).
  Status WaitLayer(std::uint32_t layer, std::int64_t timeout_ms);

 private:
  LoadOp() = default;
  void Run(KvStore& store, const ModelKv& model);

  std::string ns_;
  OwnedKeys keys_;
  std::vector<KvGroup> groups_;
  std::vector<std::vector<void*>> pointers_;   // owned copies of the views' arrays
  std::vector<std::vector<std::int32_t>> tables_;
  std::uint32_t layers_done_ = 0;              // guarded by mu_
  std::uint32_t layers_ = 0;
  bool device_ = false;
  DeliveryTarget target_;  // the caller's (Start's argument), for the fetch on the worker
  Device::StreamMark engine_mark_;  // the engine's stream as Start found it (device views naming one)
  std::shared_ptr<const GroupedModel> grouped_;
  std::vector<void*> state_;
};

class SaveOp final : public EngineOp {
 public:
  // `device`: the views are device memory; each layer is gathered by the
  // store's device and copied to the host chunks the save puts.
  // `grouped`: a model kept in layer groups (engine/groups.h): once every
  // layer is ready the save is GroupedStore's, on a worker, with the
  // recurrent layers' `state` (empty: no snapshot; host views only).
  static Result<std::shared_ptr<SaveOp>> Start(KvStore& store, Executor& executor, const ModelKv& model,
                                               std::string ns, OwnedKeys keys, std::vector<KvGroup> groups,
                                               bool device = false,
                                               std::shared_ptr<const GroupedModel> grouped = nullptr,
                                               std::vector<void*> state = {});
  // Model layer `layer` is ready in the views: gather it in the background.
  // After Cancel, a no-op.
  Status SaveLayer(std::uint32_t layer);
  // A save ends cancelled as soon as the copies already handed to the
  // workers have run: it does not wait for layers it will never store.
  void Cancel() override;
  // Until no background copy reads the views any more (and, when every
  // layer was given, the op has ended).
  void Drain();

 private:
  SaveOp() = default;
  // `after`: the engine's stream as SaveLayer found it (the layer's KV is
  // written once the work queued on it by then has run).
  void GatherLayer(std::uint32_t layer, const Device::StreamMark& after);
  Status GatherLayerOnDevice(const kernels::KvView& view, size_t chunk, std::uint32_t layer);
  void Commit();
  void EndIfCancelledAndIdle();

  KvStore* store_ = nullptr;
  Executor* executor_ = nullptr;
  ModelKv model_;
  std::string ns_;
  OwnedKeys keys_;
  std::vector<KvGroup> groups_;
  std::vector<std::vector<void*>> pointers_;
  std::vector<std::vector<std::int32_t>> tables_;
  std::vector<KvStore::PlannedChunk> plan_;
  std::vector<Payload> payloads_;
  std::vector<bool> requested_;       // guarded by mu_
  std::uint32_t gathered_ = 0;        // guarded by mu_
  std::uint32_t expected_ = 0;
  std::chrono::steady_clock::time_point started_;
  bool device_ = false;
  Status device_error_;  // the first failure of a device gather; guarded by mu_
  std::shared_ptr<const GroupedModel> grouped_;
  std::vector<void*> state_;
};

// A model-wide view of a group: view layer l is model layer l for the
// group's layers; the other layers' pointers (in k / v) are null.
kernels::KvView ModelView(const ModelKv& model, const KvGroup& g, std::vector<void*>& k, std::vector<void*>& v);

// Canonical bytes of tokens [begin, begin + tokens) of every layer of
// `model`, from host views split into groups that cover its layers once
// (out: tokens * bytes_per_token bytes) / into them.
void GatherGroups(const ModelKv& model, std::span<const KvGroup> groups, std::uint64_t begin, std::uint64_t tokens,
                  std::uint8_t* out);
void ScatterGroups(const ModelKv& model, std::span<const KvGroup> groups, const std::uint8_t* canonical,
                   std::uint64_t begin, std::uint64_t tokens);

// Checks groups against a model and request length and copies their arrays
// into `pointers` / `tables` so the views no longer borrow caller arrays.
Status AdoptGroups(const ModelKv& model, std::uint64_t tokens, std::vector<KvGroup>& groups,
                   std::vector<std::vector<void*>>& pointers, std::vector<std::vector<std::int32_t>>& tables);

}  // namespace kdn::store

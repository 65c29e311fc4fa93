// SPDX-License-Identifier: Apache-2.0
// A runtime: the KV store, its knowledge index and the workers of its
// asynchronous loads and saves, as one object (the C ABI's kdn_runtime and
// the C++ tools; kdnd hosts a chain of tiers of its own, server/service.h, not
// a runtime). Its synchronous calls take resolved views (engine/kv_views.h),
// so a caller with several KV groups gets the same store and retrieve, as a
// prefix on the caller's thread, as one with a single view.
// Lifetime: shared. The C ABI's models and ops hold a reference, so the
// store outlives every handle that points into it. Destruction finishes the
// queued loads and saves first (the executor is the last member).
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/engine/engine_ops.h"
#include "core/knowledge/knowledge.h"
#include "core/knowledge/match.h"
#include "core/engine/kv_store.h"
#include "core/engine/kv_views.h"
#include "core/util/executor.h"

namespace kdn::store {

// What a runtime is made from: the store's options (chunking, tiers, the
// device) and the workers of its asynchronous loads and saves.
struct RuntimeOptions {
  StoreOptions store;
  int worker_threads = 2;
};
inline constexpr std::uint32_t kMaxChunkTokens = 65536;
inline constexpr int kMaxWorkerThreads = 64;

// The one place a runtime's options are checked (Create calls it; the C ABI
// checks only what the C side can get wrong before it): chunk_tokens in
// 1..kMaxChunkTokens, a host capacity for the default tier, worker_threads in
// 1..kMaxWorkerThreads, and every tier by ValidateTierSpec. kInvalidArgument
// naming the field.
Status ValidateRuntimeOptions(const RuntimeOptions& options);

class Runtime {
 public:
  static Result<std::shared_ptr<Runtime>> Create(const RuntimeOptions& options);
  static Result<std::shared_ptr<Runtime>> Create(const StoreOptions& store, int worker_threads) {
    return Create(RuntimeOptions{store, worker_threads});
  }
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  KvStore& store() { return *store_; }
  KnowledgeIndex& knowledge() { return *knowledge_; }
  // Finds the knowledge items' chunks inside a context's tokens (blending by text).
  blend::ChunkMatcher& matcher() { return *matcher_; }
  // How loading the knowledge index's file went (OK: loaded, or none yet).
  const Status& knowledge_status() const { return knowledge_status_; }
  Executor& executor() { return *executor_; }
  // The kind of each tier, highest first.
  TierSpec::Kind tier_kind(size_t index) const;

  // Stores the request's KV from the views; the leading tokens cached after.
  Result<std::uint64_t> Store(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                              const ResolvedViews& views);
  // Writes the longest cached prefix into the views (tokens 0: a miss).
  // `target`: the call's delivery target (none: no deadline), passed down
  // to the tiers with quality levels.
  Result<KvStore::Retrieved> Retrieve(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                      const ResolvedViews& views, const DeliveryTarget& target = {});
  Result<std::shared_ptr<LoadOp>> Load(const ModelKv& model, std::string ns, OwnedKeys keys, const ResolvedViews& views,
                                       const DeliveryTarget& target = {});
  Result<std::shared_ptr<SaveOp>> Save(const ModelKv& model, std::string ns, OwnedKeys keys, const ResolvedViews& views);

 private:
  Runtime() = default;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KnowledgeIndex> knowledge_;
  std::unique_ptr<blend::ChunkMatcher> matcher_;  // over knowledge_ (destroyed before it)
  Status knowledge_status_;
  std::unique_ptr<Executor> executor_;  // last: destroyed first, finishing queued work
};

}  // namespace kdn::store

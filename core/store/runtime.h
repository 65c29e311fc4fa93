// A runtime: the KV store, its knowledge index and the workers of its
// asynchronous loads and saves, as one object that front ends share (the C
// ABI's kdn_runtime, kdnd). Its synchronous calls take resolved views
// (store/kv_views.h), so a caller with several KV groups gets the same
// store and retrieve as one with a single view.
// Lifetime: shared. The C ABI's models and ops hold a reference, so the
// store outlives every handle that points into it. Destruction finishes the
// queued loads and saves first (the executor is the last member).
// Thread-safety: every member function may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "store/engine_ops.h"
#include "store/knowledge.h"
#include "store/kv_store.h"
#include "store/kv_views.h"
#include "util/executor.h"

namespace kdn::store {

class Runtime {
 public:
  static Result<std::shared_ptr<Runtime>> Create(const StoreOptions& options, int worker_threads);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  KvStore& store() { return *store_; }
  KnowledgeIndex& knowledge() { return *knowledge_; }
  // How loading the knowledge index's file went (OK: loaded, or none yet).
  const Status& knowledge_status() const { return knowledge_status_; }
  Executor& executor() { return *executor_; }
  // The kind of each tier, highest first.
  TierSpec::Kind tier_kind(size_t index) const;

  // Stores the request's KV from the views; the leading tokens cached after.
  Result<std::uint64_t> Store(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                              const ResolvedViews& views);
  // Writes the longest cached prefix into the views (tokens 0: a miss).
  Result<KvStore::Retrieved> Retrieve(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                      const ResolvedViews& views);
  Result<std::shared_ptr<LoadOp>> Load(const ModelKv& model, std::string ns, OwnedKeys keys, const ResolvedViews& views);
  Result<std::shared_ptr<SaveOp>> Save(const ModelKv& model, std::string ns, OwnedKeys keys, const ResolvedViews& views);

 private:
  Runtime() = default;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KnowledgeIndex> knowledge_;
  Status knowledge_status_;
  std::unique_ptr<Executor> executor_;  // last: destroyed first, finishing queued work
};

}  // namespace kdn::store

// SPDX-License-Identifier: Apache-2.0
#include "core/runtime/runtime.h"

#include <cstdio>

namespace kdn::store {

Status ValidateRuntimeOptions(const RuntimeOptions& o) {
  const StoreOptions& s = o.store;
  if (s.chunk_tokens == 0 || s.chunk_tokens > kMaxChunkTokens) {
    return Status::InvalidArgument("chunk_tokens " + std::to_string(s.chunk_tokens) + " out of range 1.." +
                                   std::to_string(kMaxChunkTokens));
  }
  if (s.host_capacity_bytes == 0) return Status::InvalidArgument("host_capacity_bytes is 0");
  if (o.worker_threads < 1 || o.worker_threads > kMaxWorkerThreads) {
    return Status::InvalidArgument("worker_threads " + std::to_string(o.worker_threads) + " out of range 1.." +
                                   std::to_string(kMaxWorkerThreads));
  }
  for (size_t i = 0; i < s.tiers.size(); ++i) {
    if (Status st = ValidateTierSpec(s.tiers[i]); !st.ok()) {
      return Status(st.code(), "tiers[" + std::to_string(i) + "]: " + st.message());
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<Runtime>> Runtime::Create(const RuntimeOptions& ro) {
  KDN_RETURN_IF_ERROR(ValidateRuntimeOptions(ro));
  const StoreOptions& options = ro.store;
  const int worker_threads = ro.worker_threads;
  auto store = KvStore::Create(options);
  if (!store.ok()) return store.status();
  std::shared_ptr<Runtime> rt(new Runtime());
  rt->store_ = std::move(store).value();
  rt->knowledge_ = std::make_unique<KnowledgeIndex>(*rt->store_);
  rt->matcher_ = std::make_unique<blend::ChunkMatcher>(*rt->knowledge_);
  // Documents survive a restart where their chunks do: the index is kept
  // beside the first disk tier's objects (the tier's LOCK keeps a second
  // runtime out of the directory). A file that could not be loaded was set
  // aside and the runtime starts with no documents (knowledge_status()).
  for (const TierSpec& t : options.tiers) {
    if (t.kind != TierSpec::Kind::kDisk) continue;
    rt->knowledge_status_ =
        rt->knowledge_->Persist(t.path + "/knowledge.kdnidx", std::chrono::milliseconds(200), rt->store_->sealer());
    if (!rt->knowledge_status_.ok()) std::fprintf(stderr, "kdn: %s\n", rt->knowledge_status_.message().c_str());
    break;
  }
  rt->executor_ = std::make_unique<Executor>(worker_threads);
  return rt;
}

Runtime::~Runtime() { executor_.reset(); }

TierSpec::Kind Runtime::tier_kind(size_t index) const {
  const auto& tiers = store_->options().tiers;
  return index < tiers.size() ? tiers[index].kind : TierSpec::Kind::kHost;
}

Result<std::uint64_t> Runtime::Store(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                     const ResolvedViews& views) {
  if (views.device()) return store_->StoreFromDevice(model, ns, keys, views.groups());
  if (const kernels::KvView* whole = views.whole()) return store_->Store(model, ns, keys, *whole);
  // Several groups: the save op's path, every layer at once.
  auto op = Save(model, std::string(ns), OwnedKeys::Of(keys), views);
  if (!op.ok()) return op.status();
  for (std::int64_t l = 0; l < model.shape.layers; ++l) KDN_RETURN_IF_ERROR((*op)->SaveLayer(static_cast<std::uint32_t>(l)));
  KDN_RETURN_IF_ERROR((*op)->Wait(-1));
  return (*op)->Outcome().tokens;
}

Result<KvStore::Retrieved> Runtime::Retrieve(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                             const ResolvedViews& views, const DeliveryTarget& target) {
  if (views.device()) return store_->RetrieveToDevice(model, ns, keys, views.groups(), target);
  if (const kernels::KvView* whole = views.whole()) return store_->RetrieveInto(model, ns, keys, *whole, target);
  // Several groups: on the caller's thread too, and a prefix as above.
  KDN_RETURN_IF_ERROR(store_->CheckKeys(keys));
  return store_->RetrieveWith(
      model, ns, keys,
      [&](const FetchedChunk& c) { views.Scatter(model, c.lease.chunk()->payload.data(), c.begin, c.tokens); },
      target);
}

Result<std::shared_ptr<LoadOp>> Runtime::Load(const ModelKv& model, std::string ns, OwnedKeys keys,
                                              const ResolvedViews& views, const DeliveryTarget& target) {
  return LoadOp::Start(*store_, *executor_, model, std::move(ns), std::move(keys), views.groups(), views.device(),
                       target);
}

Result<std::shared_ptr<SaveOp>> Runtime::Save(const ModelKv& model, std::string ns, OwnedKeys keys,
                                              const ResolvedViews& views) {
  return SaveOp::Start(*store_, *executor_, model, std::move(ns), std::move(keys), views.groups(), views.device());
}

}  // namespace kdn::store

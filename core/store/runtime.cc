#include "store/runtime.h"

namespace kdn::store {

Result<std::shared_ptr<Runtime>> Runtime::Create(const StoreOptions& options, int worker_threads) {
  if (worker_threads < 1 || worker_threads > 64) {
    return Status::InvalidArgument("worker_threads " + std::to_string(worker_threads) + " out of range 1..64");
  }
  auto store = KvStore::Create(options);
  if (!store.ok()) return store.status();
  std::shared_ptr<Runtime> rt(new Runtime());
  rt->store_ = std::move(store).value();
  rt->knowledge_ = std::make_unique<KnowledgeIndex>(*rt->store_);
  // Documents survive a restart where their chunks do: the index is kept
  // beside the first disk tier's objects (the tier's LOCK keeps a second
  // runtime out of the directory). A file that could not be loaded was set
  // aside and the runtime starts with no documents (knowledge_status()).
  for (const TierSpec& t : options.tiers) {
    if (t.kind != TierSpec::Kind::kDisk) continue;
    rt->knowledge_status_ = rt->knowledge_->Persist(t.path + "/knowledge.kdnidx");
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
                                             const ResolvedViews& views) {
  if (views.device()) return store_->RetrieveToDevice(model, ns, keys, views.groups());
  if (const kernels::KvView* whole = views.whole()) return store_->RetrieveInto(model, ns, keys, *whole);
  auto op = Load(model, std::string(ns), OwnedKeys::Of(keys), views);
  if (!op.ok()) return op.status();
  KDN_RETURN_IF_ERROR((*op)->Wait(-1));
  const OpResult r = (*op)->Outcome();
  KvStore::Retrieved out;
  out.tokens = r.failed.empty() ? r.covered : r.failed.front().begin;
  out.covered = r.covered;
  out.lossy = r.lossy;
  return out;
}

Result<std::shared_ptr<LoadOp>> Runtime::Load(const ModelKv& model, std::string ns, OwnedKeys keys,
                                              const ResolvedViews& views) {
  return LoadOp::Start(*store_, *executor_, model, std::move(ns), std::move(keys), views.groups(), views.device());
}

Result<std::shared_ptr<SaveOp>> Runtime::Save(const ModelKv& model, std::string ns, OwnedKeys keys,
                                              const ResolvedViews& views) {
  return SaveOp::Start(*store_, *executor_, model, std::move(ns), std::move(keys), views.groups(), views.device());
}

}  // namespace kdn::store

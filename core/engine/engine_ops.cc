// SPDX-License-Identifier: Apache-2.0
#include "core/engine/engine_ops.h"

#include <chrono>
#include <optional>

#include "core/engine/groups.h"
#include "kernels/ref/kv_view_ref.h"

namespace kdn::store {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// A full-model view of a group: view layer l is model layer l for the
// group's layers; the other layers' pointers are null and never touched.
kernels::KvView ModelView(const ModelKv& model, const KvGroup& g, std::vector<void*>& k, std::vector<void*>& v) {
  k.assign(static_cast<size_t>(model.shape.layers), nullptr);
  v.assign(static_cast<size_t>(model.shape.layers), nullptr);
  for (size_t j = 0; j < g.layers.size(); ++j) {
    k[g.layers[j]] = g.view.k_base[j];
    v[g.layers[j]] = g.view.v_base[j];
  }
  kernels::KvView mv = g.view;
  mv.shape = model.shape;
  mv.k_base = k.data();
  mv.v_base = v.data();
  return mv;
}

void GatherGroups(const ModelKv& model, std::span<const KvGroup> groups, std::uint64_t begin, std::uint64_t tokens,
                  std::uint8_t* out) {
  std::vector<void*> k, v;
  for (const KvGroup& g : groups) {
    const kernels::KvView mv = ModelView(model, g, k, v);
    for (std::uint32_t l : g.layers) {
      kernels::view_gather_cpu(mv, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(tokens), l, l + 1, out);
    }
  }
}

void ScatterGroups(const ModelKv& model, std::span<const KvGroup> groups, const std::uint8_t* canonical,
                   std::uint64_t begin, std::uint64_t tokens) {
  std::vector<void*> k, v;
  for (const KvGroup& g : groups) {
    const kernels::KvView mv = ModelView(model, g, k, v);
    for (std::uint32_t l : g.layers) {
      kernels::view_scatter_cpu(canonical, mv, static_cast<std::int64_t>(begin), static_cast<std::int64_t>(tokens), l,
                                l + 1);
    }
  }
}

Status AdoptGroups(const ModelKv& model, std::uint64_t tokens, std::vector<KvGroup>& groups,
                   std::vector<std::vector<void*>>& pointers, std::vector<std::vector<std::int32_t>>& tables) {
  if (groups.empty()) return Status::InvalidArgument("no KV groups");
  std::vector<bool> seen(static_cast<size_t>(model.shape.layers), false);
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    KvGroup& g = groups[gi];
    const std::string where = "KV group " + std::to_string(gi) + ": ";
    if (g.layers.empty()) return Status::InvalidArgument(where + "no layers");
    for (std::uint32_t l : g.layers) {
      if (l >= seen.size()) return Status::InvalidArgument(where + "layer " + std::to_string(l) + " beyond the model");
      if (seen[l]) return Status::InvalidArgument(where + "layer " + std::to_string(l) + " is in two groups");
      seen[l] = true;
    }
    if (g.view.shape.heads != model.shape.heads || g.view.shape.head_dim != model.shape.head_dim ||
        g.view.shape.elem_bytes != model.shape.elem_bytes) {
      return Status::InvalidArgument(where + "the view's heads, head_dim or dtype differ from the model's");
    }
    g.view.shape.layers = static_cast<std::int64_t>(g.layers.size());
    const char* why = nullptr;
    if (!kernels::view_valid(g.view, static_cast<std::int64_t>(tokens), &why)) {
      return Status::InvalidArgument(where + why);
    }
    // Copies of the caller's arrays: the op may outlive them.
    pointers.emplace_back(g.view.k_base, g.view.k_base + g.layers.size());
    const size_t k_at = pointers.size() - 1;
    pointers.emplace_back(g.view.v_base, g.view.v_base + g.layers.size());
    g.view.k_base = pointers[k_at].data();
    g.view.v_base = pointers.back().data();
    if (g.view.paged) {
      tables.emplace_back(g.view.block_table, g.view.block_table + g.view.table_len);
      g.view.block_table = tables.back().data();
    }
  }
  for (size_t l = 0; l < seen.size(); ++l) {
    if (!seen[l]) return Status::InvalidArgument("the KV groups must cover every layer; layer " + std::to_string(l) + " is in none");
  }
  return Status::Ok();
}

// ---- EngineOp -------------------------------------------------------------------

Status EngineOp::Wait(std::int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ended = [&] { return result_.state != OpState::kPending; };
  if (timeout_ms < 0) {
    cv_.wait(lock, ended);
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ended)) {
    return Status(Code::kTimeout, "operation still running after " + std::to_string(timeout_ms) + " ms");
  }
  return result_.status;
}

OpState EngineOp::Poll() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_.state;
}

void EngineOp::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_ = true;
}

bool EngineOp::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancel_;
}

OpResult EngineOp::Outcome() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

void EngineOp::Finish(OpState state, Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_.state = state;
    result_.status = std::move(status);
  }
  cv_.notify_all();
}

// ---- LoadOp ---------------------------------------------------------------------

Result<std::shared_ptr<LoadOp>> LoadOp::Start(KvStore& store, Executor& executor, const ModelKv& model,
                                              std::string ns, OwnedKeys keys, std::vector<KvGroup> groups,
                                              bool device, const DeliveryTarget& target,
                                              std::shared_ptr<const GroupedModel> grouped, std::vector<void*> state) {
  KDN_RETURN_IF_ERROR(store.CheckKeys(keys.keys()));
  if (device && store.device() == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  if (grouped && device) return Status::Unsupported("a model kept in layer groups takes host views only");
  if (grouped && grouped->state_layers > 0 && state.size() != grouped->state_layers) {
    return Status::InvalidArgument("the model has " + std::to_string(grouped->state_layers) +
                                   " recurrent layers: a load needs their state's memory (state_layers)");
  }
  std::shared_ptr<LoadOp> op(new LoadOp());
  op->grouped_ = std::move(grouped);
  op->state_ = std::move(state);
  op->device_ = device;
  op->target_ = target;
  KDN_RETURN_IF_ERROR(AdoptGroups(model, keys.keys().size(), groups, op->pointers_, op->tables_));
  op->ns_ = std::move(ns);
  op->keys_ = std::move(keys);
  op->groups_ = std::move(groups);
  op->layers_ = static_cast<std::uint32_t>(model.shape.layers);
  if (device) {
    Result<Device::StreamMark> mark = store.MarkEngineStream(op->groups_);
    if (!mark.ok()) return mark.status();
    op->engine_mark_ = std::move(mark).value();
  }
  executor.Submit([op, &store, model] { op->Run(store, model); });
  return op;
}

void LoadOp::Run(KvStore& store, const ModelKv& model) {
  const auto t0 = std::chrono::steady_clock::now();
  if (grouped_) {
    // Every group's chunks and the state at once (the rule needs them all
    // before any prefix is known): then every layer is ready.
    Result<KvStore::Retrieved> r = GroupedRetrieve(store, *grouped_, ns_, keys_.keys(), groups_, state_);
    if (!r.ok()) {
      Finish(OpState::kFailed, r.status());
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_.covered = r->covered;
      result_.tokens = r->tokens;
      result_.lossy = r->lossy;
      layers_done_ = layers_;
    }
    cv_.notify_all();
    Finish(OpState::kDone, Status::Ok());
    return;
  }
  if (device_) {
    Fetch fetch = store.FetchPrefix(model, ns_, keys_.keys(), TieredStore::Form::kStored, target_);
    if (cancelled()) {
      fetch.chunks.clear();
      Finish(OpState::kCancelled, Status(Code::kCancelled, "load cancelled"));
      return;
    }
    // Layers in order, a step at a time: kdn_op_wait_layer(l) returns once
    // layer l is in place (the result's ranges are known at the end).
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_.covered = fetch.covered;
    }
    Result<KvStore::Delivered> d = store.DeliverToDevice(
        model, fetch, groups_, /*as_prefix=*/false, [this](std::uint32_t layers) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            layers_done_ = layers;
          }
          cv_.notify_all();
        },
        engine_mark_);
    if (!d.ok()) {
      fetch.chunks.clear();
      Finish(OpState::kFailed, d.status());
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_.covered = fetch.covered;
      result_.failed = fetch.failed;
      result_.tokens = d->tokens;
      result_.lossy = d->lossy;
      layers_done_ = layers_;
    }
    cv_.notify_all();
    store.CountLoad(model, ns_, fetch, keys_.keys().size(), d->tokens,
                    d->tokens * static_cast<std::uint64_t>(model.bytes_per_token()), MicrosSince(t0));
    fetch.chunks.clear();
    Finish(OpState::kDone, Status::Ok());
    return;
  }
  Fetch fetch = store.FetchPrefix(model, ns_, keys_.keys(), TieredStore::Form::kCanonical, target_);
  std::vector<std::vector<void*>> k(groups_.size()), v(groups_.size());
  std::vector<kernels::KvView> views;
  for (size_t g = 0; g < groups_.size(); ++g) views.push_back(ModelView(model, groups_[g], k[g], v[g]));
  std::vector<int> group_of(static_cast<size_t>(model.shape.layers), -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (std::uint32_t l : groups_[g].layers) group_of[l] = static_cast<int>(g);
  }
  std::uint64_t loaded = 0;
  for (const FetchedChunk& c : fetch.chunks) loaded += c.tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_.covered = fetch.covered;
    result_.failed = fetch.failed;
    result_.tokens = loaded;
    result_.lossy = fetch.lossy_chunks > 0;
  }
  for (std::int64_t l = 0; l < model.shape.layers; ++l) {
    if (cancelled()) {
      fetch.chunks.clear();
      Finish(OpState::kCancelled, Status(Code::kCancelled, "load cancelled"));
      return;
    }
    if (const int g = group_of[static_cast<size_t>(l)]; g >= 0) {
      KvStore::Scatter(fetch, views[static_cast<size_t>(g)], l, l + 1);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      layers_done_ = static_cast<std::uint32_t>(l + 1);
    }
    cv_.notify_all();
  }
  store.CountLoad(model, ns_, fetch, keys_.keys().size(), loaded,
                  loaded * static_cast<std::uint64_t>(model.bytes_per_token()), MicrosSince(t0));
  fetch.chunks.clear();  // the leases end before the op does
  Finish(OpState::kDone, Status::Ok());
}

Status LoadOp::WaitLayer(std::uint32_t layer, std::int64_t timeout_ms) {
  if (layer >= layers_) {
    return Status::InvalidArgument("layer " + std::to_string(layer) + " beyond the model's " + std::to_string(layers_));
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return layers_done_ > layer || result_.state != OpState::kPending; };
  if (timeout_ms < 0) {
    cv_.wait(lock, ready);
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready)) {
    return Status(Code::kTimeout, "layer " + std::to_string(layer) + " not loaded after " +
                                         std::to_string(timeout_ms) + " ms");
  }
  if (layers_done_ > layer) return Status::Ok();
  return result_.status.ok() ? Status::NotFound("layer " + std::to_string(layer) + " is not in the model")
                             : result_.status;
}

// ---- SaveOp ---------------------------------------------------------------------

Result<std::shared_ptr<SaveOp>> SaveOp::Start(KvStore& store, Executor& executor, const ModelKv& model,
                                              std::string ns, OwnedKeys keys, std::vector<KvGroup> groups,
                                              bool device, std::shared_ptr<const GroupedModel> grouped,
                                              std::vector<void*> state) {
  if (device && store.device() == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  if (grouped && device) return Status::Unsupported("a model kept in layer groups takes host views only");
  std::shared_ptr<SaveOp> op(new SaveOp());
  op->device_ = device;
  KDN_RETURN_IF_ERROR(AdoptGroups(model, keys.keys().size(), groups, op->pointers_, op->tables_));
  // A grouped model's save plans nothing: GroupedStore does it all at the end.
  Result<std::vector<KvStore::PlannedChunk>> plan = std::vector<KvStore::PlannedChunk>{};
  if (grouped) {
    KDN_RETURN_IF_ERROR(store.CheckKeys(keys.keys()));
  } else {
    plan = store.PlanStore(model, ns, keys.keys());
  }
  if (!plan.ok()) return plan.status();
  op->grouped_ = std::move(grouped);
  op->state_ = std::move(state);
  op->started_ = std::chrono::steady_clock::now();
  op->store_ = &store;
  op->executor_ = &executor;
  op->model_ = model;
  op->ns_ = std::move(ns);
  op->keys_ = std::move(keys);
  op->groups_ = std::move(groups);
  op->plan_ = std::move(plan).value();
  for (const auto& p : op->plan_) {
    op->payloads_.push_back(Payload::Uninitialized(
        p.present ? 0 : static_cast<size_t>(p.tokens * static_cast<std::uint64_t>(model.bytes_per_token()))));
  }
  op->requested_.assign(static_cast<size_t>(model.shape.layers), false);
  for (const KvGroup& g : op->groups_) op->expected_ += static_cast<std::uint32_t>(g.layers.size());
  return op;
}

Status SaveOp::SaveLayer(std::uint32_t layer) {
  // The engine may have queued the layer's writes on its stream without
  // waiting for them: the gather waits for what the stream holds now.
  Device::StreamMark after;
  if (device_) {
    Result<Device::StreamMark> mark = store_->MarkEngineStream(groups_);
    if (!mark.ok()) return mark.status();
    after = std::move(mark).value();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancel_) return Status::Ok();  // it ends (or ended) cancelled: nothing more is stored
    if (result_.state != OpState::kPending) return Status::InvalidArgument("save already finished");
    if (layer >= requested_.size()) return Status::InvalidArgument("layer " + std::to_string(layer) + " beyond the model");
    bool in_group = false;
    for (const KvGroup& g : groups_) {
      for (std::uint32_t l : g.layers) in_group = in_group || l == layer;
    }
    if (!in_group) return Status::InvalidArgument("layer " + std::to_string(layer) + " is in no KV group of this save");
    if (requested_[layer]) return Status::InvalidArgument("layer " + std::to_string(layer) + " saved twice");
    requested_[layer] = true;
  }
  // The op stays alive until its last task ran: the task holds a reference.
  executor_->Submit([self = std::static_pointer_cast<SaveOp>(shared_from_this()), layer, after] {
    self->GatherLayer(layer, after);
  });
  return Status::Ok();
}

void SaveOp::GatherLayer(std::uint32_t layer, const Device::StreamMark& after) {
  std::vector<void*> k, v;
  Status failed;
  if (device_) failed = store_->FollowEngineStream(groups_, after);
  for (const KvGroup& g : groups_) {
    bool here = false;
    for (std::uint32_t l : g.layers) here = here || l == layer;
    if (!here) continue;
    const kernels::KvView view = ModelView(model_, g, k, v);
    for (size_t i = 0; i < plan_.size(); ++i) {
      if (plan_[i].present) continue;
      if (device_) {
        if (failed.ok()) failed = GatherLayerOnDevice(view, i, layer);
        continue;
      }
      kernels::view_gather_cpu(view, static_cast<std::int64_t>(plan_[i].begin), static_cast<std::int64_t>(plan_[i].tokens),
                               layer, layer + 1, payloads_[i].data());
    }
  }
  if (!failed.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_error_.ok()) device_error_ = failed;
  }
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = ++gathered_ == expected_;
  }
  cv_.notify_all();
  if (last) {
    Commit();
  } else {
    EndIfCancelledAndIdle();
  }
}

void SaveOp::Cancel() {
  EngineOp::Cancel();
  EndIfCancelledAndIdle();
}

void SaveOp::EndIfCancelledAndIdle() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::uint32_t requested = 0;
    for (bool r : requested_) requested += r;
    // Not while a copy runs, nor once every layer was given (Commit ends it).
    if (!cancel_ || result_.state != OpState::kPending || gathered_ != requested || requested == expected_) return;
  }
  Finish(OpState::kCancelled, Status(Code::kCancelled, "save cancelled"));
}

void SaveOp::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  std::uint32_t requested = 0;
  for (bool r : requested_) requested += r;
  // Every copy handed to the workers has run; when all layers were given,
  // the commit has run too.
  cv_.wait(lock, [&] {
    return gathered_ == requested && (gathered_ < expected_ || result_.state != OpState::kPending);
  });
}

Status SaveOp::GatherLayerOnDevice(const kernels::KvView& view, size_t i, std::uint32_t layer) {
  Device& dev = *store_->device();
  const KvStore::PlannedChunk& p = plan_[i];
  // The layer's slice of a canonical chunk: [k|v][token][head][dim].
  const std::uint64_t slice = 2 * p.tokens * static_cast<std::uint64_t>(model_.shape.heads * model_.shape.head_dim *
                                                                         model_.shape.elem_bytes);
  const std::uint64_t at = slice * layer;
  Result<Payload> staging = dev.Allocate(payloads_[i].size());
  if (!staging.ok()) return staging.status();
  KDN_RETURN_IF_ERROR(dev.Gather(view, static_cast<std::int64_t>(p.begin), static_cast<std::int64_t>(p.tokens), layer,
                                 layer + 1, staging->data()));
  return dev.CopyToHost(payloads_[i].data() + at, staging->data() + at, static_cast<size_t>(slice));
}

void SaveOp::Commit() {
  if (cancelled()) {
    Finish(OpState::kCancelled, Status(Code::kCancelled, "save cancelled"));
    return;
  }
  Status device_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    device_error = device_error_;
  }
  if (!device_error.ok()) {
    Finish(OpState::kFailed, device_error);
    return;
  }
  if (grouped_) {
    Result<std::uint64_t> r = GroupedStore(*store_, *grouped_, ns_, keys_.keys(), groups_, state_);
    if (!r.ok()) {
      Finish(OpState::kFailed, r.status());
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_.tokens = *r;
    }
    Finish(OpState::kDone, Status::Ok());
    return;
  }
  std::uint64_t stored = 0;
  for (size_t i = 0; i < plan_.size(); ++i) {
    if (!store_->CommitChunk(model_, ns_, plan_[i], std::move(payloads_[i])).ok()) break;  // keep the prefix
    stored = plan_[i].begin + plan_[i].tokens;
  }
  store_->CountStore(MicrosSince(started_));
  // What the tiers hold now: a later chunk's put may have evicted an earlier one.
  stored = store_->HeldPrefix(ns_, plan_, stored);
  {
    std::lock_guard<std::mutex> lock(mu_);
    result_.tokens = stored;
  }
  Finish(OpState::kDone, Status::Ok());
}

}  // namespace kdn::store

// SPDX-License-Identifier: Apache-2.0
// KvStore's paths for engines' KV views in device memory (device/device.h):
// loads that never bring the canonical KV through the host, and stores that
// keep it on the device when the top tier is a device tier.
#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "core/store/chunk_codec.h"
#include "core/engine/engine_ops.h"
#include "core/engine/kv_store.h"

namespace kdn::store {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

std::uint64_t NsSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

codec::Shape ShapeOfMeta(const ChunkMeta& m) { return {m.layers, m.kv_heads, m.head_dim, m.tokens, m.dtype}; }

// Runs `op(view, layer_begin, layer_end)` over every run of consecutive model
// layers of every group, on a model-wide view of the group.
template <typename Op>
Status ForEachLayerRun(const ModelKv& model, std::span<const KvGroup> groups, Op&& op) {
  std::vector<void*> k, v;
  for (const KvGroup& g : groups) {
    const kernels::KvView mv = ModelView(model, g, k, v);
    std::vector<std::uint32_t> layers = g.layers;
    std::sort(layers.begin(), layers.end());
    for (size_t i = 0; i < layers.size();) {
      size_t j = i + 1;
      while (j < layers.size() && layers[j] == layers[j - 1] + 1) ++j;
      KDN_RETURN_IF_ERROR(op(mv, std::int64_t{layers[i]}, std::int64_t{layers[j - 1]} + 1));
      i = j;
    }
  }
  return Status::Ok();
}

// Copies layers [lb, le) of a raw host chunk into a view that lays them out
// as the chunk does (kernels::view_dense_like_chunk): one host-to-device copy
// per layer's K and V, no staging and no kernel.
Status CopyLayersToView(Device& dev, const std::uint8_t* chunk, const kernels::KvView& v, const FetchedChunk& c,
                        std::int64_t lb, std::int64_t le) {
  const kernels::KvShape& s = v.shape;
  const auto tokens = static_cast<std::int64_t>(c.tokens);
  const std::int64_t run = tokens * s.heads * s.head_dim * s.elem_bytes;  // one layer's K (or V) of the chunk
  const std::int64_t at = kernels::view_offset(v, static_cast<std::int64_t>(c.begin), 0, 0) * s.elem_bytes;
  for (std::int64_t l = lb; l < le; ++l) {
    for (std::int64_t kv = 0; kv < 2; ++kv) {
      auto* dst = static_cast<std::uint8_t*>((kv == 0 ? v.k_base : v.v_base)[l]) + at;
      KDN_RETURN_IF_ERROR(dev.CopyToDevice(dst, chunk + (l * 2 + kv) * run, static_cast<size_t>(run)));
    }
  }
  return Status::Ok();
}

// Where each plane (layer, k|v) of chunk `c` goes when every layer of the
// model has one view and the views lay the chunk's rows out as the chunk
// does (kernels::view_dense_like_chunk, one row stride): a batched kdn decode
// writes there directly, with no staging and no scatter. Empty if not.
struct PlaneTargets {
  std::vector<void*> planes;
  std::uint64_t row = 0;
};
std::optional<PlaneTargets> DirectPlanes(const ModelKv& model, std::span<const KvGroup> groups, const FetchedChunk& c,
                                         std::uint32_t layers) {
  PlaneTargets t;
  t.planes.assign(2ull * layers, nullptr);
  bool ok = true;
  const Status st = ForEachLayerRun(model, groups, [&](const kernels::KvView& v, std::int64_t lb, std::int64_t le) {
    const auto row = static_cast<std::uint64_t>(v.stride_token);
    if (!kernels::view_dense_like_chunk(v) || (t.row != 0 && t.row != row)) {
      ok = false;
      return Status::Ok();
    }
    t.row = row;
    const std::int64_t at = kernels::view_offset(v, static_cast<std::int64_t>(c.begin), 0, 0) * v.shape.elem_bytes;
    for (std::int64_t l = lb; l < le; ++l) {
      if (l >= static_cast<std::int64_t>(layers) || t.planes[2 * l] != nullptr) {
        ok = false;
        return Status::Ok();
      }
      t.planes[2 * l] = static_cast<std::uint8_t*>(v.k_base[l]) + at;
      t.planes[2 * l + 1] = static_cast<std::uint8_t*>(v.v_base[l]) + at;
    }
    return Status::Ok();
  });
  if (!st.ok() || !ok || std::find(t.planes.begin(), t.planes.end(), nullptr) != t.planes.end()) return std::nullopt;
  return t;
}

}  // namespace

Result<KvStore::Delivered> KvStore::DeliverToDevice(const ModelKv& model, Fetch& f, std::span<const KvGroup> groups,
                                                    bool as_prefix, const LayersDone& layers_done,
                                                    const Device::StreamMark& after) {
  Device* dev = device();
  if (dev == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  KDN_RETURN_IF_ERROR(FollowEngineStream(groups, after));
  const auto per_token = static_cast<std::uint64_t>(model.bytes_per_token());
  const auto L = static_cast<std::int64_t>(model.shape.layers);
  // Layer steps: with `layers_done`, the layers are written in order, a
  // step of them at a time, each step synchronized and reported before the
  // next begins (an engine computes layer l while later ones load); without
  // it, in one step. cachegen and tc decode whole chunks: a load with any
  // takes one step.
  std::int64_t step = L;
  if (layers_done) {
    step = std::max<std::int64_t>(1, (L + kDeviceLayerSteps - 1) / kDeviceLayerSteps);
    for (const FetchedChunk& c : f.chunks) {
      const codec::CodecId id = c.lease.chunk()->meta.codec;
      if (id == codec::CodecId::kCacheGen || id == codec::CodecId::kTc) step = L;
    }
  }
  // Where a chunk's layers [lb, le) lie in its canonical bytes (one run:
  // the canonical layout is layer-major).
  const auto layer_bytes = [&](const FetchedChunk& c) { return c.tokens * per_token / static_cast<std::uint64_t>(L); };
  // Two staging buffers of the largest chunk, alternating: on a GPU the
  // copy or decode of chunk i+1 is queued while chunk i is scattered.
  // (Raw host chunks need none when every view takes them as they are.)
  bool all_dense = true;
  KDN_RETURN_IF_ERROR(ForEachLayerRun(model, groups, [&](const kernels::KvView& v, std::int64_t, std::int64_t) {
    all_dense = all_dense && kernels::view_dense_like_chunk(v);
    return Status::Ok();
  }));
  std::uint64_t largest = 0;
  for (const FetchedChunk& c : f.chunks) {
    const ChunkRef& ch = c.lease.chunk();
    const bool raw = ch->meta.codec == codec::CodecId::kRaw;
    if (ch->meta.codec == codec::CodecId::kKdn) continue;  // batched, below
    if (!raw || (!ch->meta.device && !all_dense)) largest = std::max(largest, c.tokens * per_token);
  }
  chunk::Payload staging[2];
  if (largest > 0) {
    for (chunk::Payload& s : staging) {
      Result<chunk::Payload> b = dev->Allocate(static_cast<size_t>(largest));
      if (!b.ok()) return b.status();
      s = std::move(b).value();
    }
  }
  std::uint64_t stop = UINT64_MAX;  // as_prefix: the first failure's begin
  std::vector<TokenRange> failed;   // decodes that failed here
  std::vector<bool> bad(f.chunks.size(), false);
  int slot = 0;
  // Chunks of codecs without a device kernel (zstd, int8, fp8, kivi) decode
  // on the CPU: on the fetch threads, all at once, up to kHostDecodeAhead
  // bytes of decoded KV; any beyond that one by one as they come.
  constexpr std::uint64_t kHostDecodeAhead = std::uint64_t{1} << 30;
  struct HostDecoded {
    std::optional<Result<ChunkRef>> raw;
    std::uint64_t ns = 0;
    std::uint64_t sharing = 1;  // threads that decoded ahead together
  };
  std::vector<HostDecoded> host(f.chunks.size());
  {
    std::vector<size_t> todo;
    std::uint64_t ahead = 0;
    for (size_t i = 0; i < f.chunks.size(); ++i) {
      const ChunkRef& ch = f.chunks[i].lease.chunk();
      if (ch->meta.codec == codec::CodecId::kRaw || Device::DecodesOnDevice(ch->meta.codec)) continue;
      ahead += f.chunks[i].tokens * per_token;
      if (ahead > kHostDecodeAhead) break;
      todo.push_back(i);
    }
    auto decode = [&](size_t b, size_t e) {
      for (size_t j = b; j < e; ++j) {
        const auto t0 = std::chrono::steady_clock::now();
        host[todo[j]].raw.emplace(DecodeChunk(f.chunks[todo[j]].lease.chunk()));
        host[todo[j]].ns = NsSince(t0);
      }
    };
    std::unique_lock<std::mutex> pool(fetch_mu_, std::defer_lock);
    if (fetch_pool_ != nullptr && todo.size() >= 2 && pool.try_lock()) {
      fetch_pool_->ParallelFor(todo.size(), 1, decode);
      const auto sharing = std::min<std::uint64_t>(static_cast<std::uint64_t>(fetch_pool_->threads()), todo.size());
      for (size_t i : todo) host[i].sharing = sharing;
    }
  }
  // kdn chunks decode in batches, one device launch each (on a GPU every
  // stream of every chunk of the step at once): straight into the views
  // where they lay the chunk out (DirectPlanes), else into a staging area of
  // up to options_.device_staging_bytes that the scatter kernel reads.
  // Direct decodes may write the tokens of chunks past a failed one (as a
  // prefix they are then not counted as written: the engine recomputes
  // them). With several steps the payloads cross once, before the first.
  const std::uint64_t staging_cap = options_.device_staging_bytes;
  struct KdnDecoded {
    bool done = false, direct = false;
    Status st;
    const void* src = nullptr;
    std::uint64_t ns = 0;
  };
  std::vector<std::optional<PlaneTargets>> direct(f.chunks.size());
  std::vector<const std::uint8_t*> kdn_on_device(f.chunks.size(), nullptr);
  std::uint64_t staged_kdn = 0, largest_kdn = 0, kdn_payloads = 0;
  for (size_t i = 0; i < f.chunks.size(); ++i) {
    const ChunkRef& ch = f.chunks[i].lease.chunk();
    if (ch->meta.codec != codec::CodecId::kKdn) continue;
    kdn_payloads += ch->payload.size();
    direct[i] = DirectPlanes(model, groups, f.chunks[i], ch->meta.layers);
    if (!direct[i]) {
      staged_kdn += f.chunks[i].tokens * per_token;
      largest_kdn = std::max(largest_kdn, f.chunks[i].tokens * per_token);
    }
  }
  chunk::Payload kdn_staging, kdn_uploaded;
  if (staged_kdn > 0) {
    Result<chunk::Payload> b = dev->Allocate(static_cast<size_t>(std::max(largest_kdn, std::min(staged_kdn, staging_cap))));
    if (!b.ok()) return b.status();
    kdn_staging = std::move(b).value();
  }
  if (step < L && kdn_payloads > 0 && !dev->emulated()) {
    // Without room for them all, each step uploads its batch's payloads.
    Result<chunk::Payload> b = dev->Allocate(static_cast<size_t>(kdn_payloads));
    if (b.ok()) kdn_uploaded = std::move(b).value();
  }
  if (kdn_uploaded.size() > 0) {
    std::uint64_t at = 0;
    for (size_t i = 0; i < f.chunks.size(); ++i) {
      const ChunkRef& ch = f.chunks[i].lease.chunk();
      if (ch->meta.codec != codec::CodecId::kKdn) continue;
      KDN_RETURN_IF_ERROR(dev->CopyToDevice(kdn_uploaded.data() + at, ch->payload.data(), ch->payload.size()));
      kdn_on_device[i] = kdn_uploaded.data() + at;
      at += ch->payload.size();
    }
  }
  Delivered out;
  for (std::int64_t lb = 0; lb < L; lb += step) {
    const std::int64_t le = std::min(L, lb + step);
    std::vector<KdnDecoded> kdn(f.chunks.size());
    // Decodes layers [lb, le) of the kdn chunks from `first` on that are not
    // decoded yet in this step, as many as the staging holds (every direct one).
    auto decode_kdn_from = [&](size_t first) -> Status {
      std::vector<codec::KdnBatchJob> jobs;
      std::vector<size_t> which;
      std::uint64_t used = 0;
      bool full = false;  // staged chunks stop at the first that does not fit: those before it are placed before the staging is reused
      for (size_t i = first; i < f.chunks.size(); ++i) {
        const ChunkRef& ch = f.chunks[i].lease.chunk();
        if (ch->meta.codec != codec::CodecId::kKdn || kdn[i].done || bad[i]) continue;
        codec::KdnBatchJob j;
        j.shape = ShapeOfMeta(ch->meta);
        j.payload = ch->payload.data();
        j.size = ch->payload.size();
        j.device_payload = kdn_on_device[i];
        j.plane_begin = static_cast<std::uint32_t>(2 * lb);
        j.plane_end = static_cast<std::uint32_t>(2 * le);
        if (direct[i]) {
          j.planes = direct[i]->planes;
          j.row = direct[i]->row;
        } else {
          const std::uint64_t bytes = f.chunks[i].tokens * per_token;
          full = full || used + bytes > kdn_staging.size();
          if (full) continue;  // the next batch's
          j.out = kdn_staging.data() + used;
          used += bytes;
        }
        jobs.push_back(std::move(j));
        which.push_back(i);
      }
      if (jobs.empty()) return Status::Ok();
      const auto t0 = std::chrono::steady_clock::now();
      KDN_RETURN_IF_ERROR(dev->DecodeKdnBatch(jobs));
      const std::uint64_t ns = NsSince(t0) / jobs.size();
      for (size_t k = 0; k < jobs.size(); ++k) {
        KdnDecoded& d = kdn[which[k]];
        d.done = true;
        d.direct = !jobs[k].planes.empty();
        d.st = jobs[k].status;
        d.src = jobs[k].out;
        d.ns = ns;
      }
      return Status::Ok();
    };
    for (size_t index = 0; index < f.chunks.size(); ++index) {
      const FetchedChunk& c = f.chunks[index];
      if (c.begin >= stop) break;
      if (bad[index]) continue;  // failed in an earlier step
      const ChunkRef& ch = c.lease.chunk();
      const std::uint64_t run = layer_bytes(c), run_at = static_cast<std::uint64_t>(lb) * run;
      const std::uint64_t bytes = static_cast<std::uint64_t>(le - lb) * run;  // this step's layers
      const void* src = nullptr;
      // Raw KV in host memory (a raw host chunk, or one the CPU decoded):
      // straight into the views that lay it out as the chunk does (a layer's K
      // or V one run), through staging and the scatter kernel into the others.
      const std::uint8_t* host_raw = ch->meta.codec == codec::CodecId::kRaw && !ch->meta.device ? ch->payload.data() : nullptr;
      ChunkRef decoded;  // a CPU-decoded chunk, alive until its copies are queued (a copy from pageable memory has read it when it returns)
      bool staged = false, in_place = false;
      if (ch->meta.codec == codec::CodecId::kRaw) {
        if (ch->meta.device) src = ch->payload.data();  // the device tier's own block
      } else {
        const auto t0 = std::chrono::steady_clock::now();
        std::uint64_t ns = 0;
        Status st;
        const bool first_step = lb == 0;  // a chunk's decode is counted once (a CPU decode serves every step)
        bool on_cpu = false;
        if (ch->meta.codec == codec::CodecId::kKdn) {
          if (!kdn[index].done) KDN_RETURN_IF_ERROR(decode_kdn_from(index));
          st = kdn[index].st;
          ns = kdn[index].ns;
          src = kdn[index].src;
          in_place = kdn[index].direct;
        } else if (Device::DecodesOnDevice(ch->meta.codec)) {
          st = dev->Decode(ShapeOfMeta(ch->meta), ch->meta.codec, ch->payload.data(), ch->payload.size(),
                           staging[slot].data());
          src = staging[slot].data();
          ns = NsSince(t0);
        } else {
          // No kernel for this codec: the CPU decoded it (above, or now), the
          // canonical bytes cross.
          on_cpu = true;
          if (!host[index].raw) {
            host[index].raw.emplace(DecodeChunk(ch));
            host[index].ns = NsSince(t0);
          }
          Result<ChunkRef>& raw = *host[index].raw;
          ns = host[index].ns;
          st = raw.status();
          if (raw.ok()) {
            if (first_step) ++dev->host_decodes_;
            decoded = le == L ? std::move(raw).value() : raw.value();  // kept for the next steps
            host_raw = decoded->payload.data();
          }
        }
        if (st.code() != Code::kCorrupt && !st.ok()) return st;  // the device failed, not the bytes
        if ((first_step || !st.ok()) && c.lease.level() >= 0) {
          chain_->RecordDecode(static_cast<size_t>(c.lease.level()), ch->meta.key, st, ns);
        }
        // Its tier's delivery rate (RecordRates): a CPU decode once, a device decode per step.
        if (!on_cpu || first_step) f.chunks[index].work_ns += ns / host[index].sharing;
        if (!st.ok()) {
          bad[index] = true;
          if (!failed.empty() && failed.back().end == c.begin) {
            failed.back().end = c.begin + c.tokens;
          } else {
            failed.push_back({c.begin, c.begin + c.tokens});
          }
          if (as_prefix) stop = c.begin;
          continue;
        }
      }
      if (!in_place) KDN_RETURN_IF_ERROR(ForEachLayerRun(model, groups, [&](const kernels::KvView& v, std::int64_t rb, std::int64_t re) {
        rb = std::max(rb, lb);
        re = std::min(re, le);
        if (rb >= re) return Status::Ok();
        if (host_raw != nullptr && kernels::view_dense_like_chunk(v)) return CopyLayersToView(*dev, host_raw, v, c, rb, re);
        if (host_raw != nullptr && !staged) {
          // This step's layers of the chunk, where they lie in it.
          KDN_RETURN_IF_ERROR(dev->CopyToDevice(staging[slot].data() + run_at, host_raw + run_at, static_cast<size_t>(bytes)));
          src = staging[slot].data();
          staged = true;
        }
        return dev->Scatter(src, v, static_cast<std::int64_t>(c.begin), static_cast<std::int64_t>(c.tokens), rb, re);
      }));
      slot ^= 1;
    }
    KDN_RETURN_IF_ERROR(dev->Synchronize());
    if (layers_done) layers_done(static_cast<std::uint32_t>(le));
  }
  for (size_t i = 0; i < f.chunks.size(); ++i) {
    const FetchedChunk& c = f.chunks[i];
    if (bad[i] || c.begin >= stop) continue;
    out.tokens += c.tokens;
    out.lossy = out.lossy || codec::IsLossy(c.lease.chunk()->meta.codec) || c.lease.chunk()->meta.lossy;
  }
  // The failures of this pass join the fetch's, in order of tokens.
  if (!failed.empty()) {
    f.failed.insert(f.failed.end(), failed.begin(), failed.end());
    std::sort(f.failed.begin(), f.failed.end(), [](const TokenRange& a, const TokenRange& b) { return a.begin < b.begin; });
    std::erase_if(f.chunks, [&](const FetchedChunk& c) {
      return std::any_of(failed.begin(), failed.end(), [&](const TokenRange& r) { return c.begin == r.begin || (c.begin > r.begin && c.begin < r.end); });
    });
  }
  if (as_prefix) out.tokens = std::min(out.tokens, f.prefix());
  KDN_RETURN_IF_ERROR(dev->StreamAfterUs(EngineStream(groups)));
  return out;
}

Result<Device::StreamMark> KvStore::MarkEngineStream(std::span<const KvGroup> groups) {
  void* stream = EngineStream(groups);
  if (device() == nullptr || stream == nullptr) return Device::StreamMark();
  return device()->MarkStream(stream);
}

Status KvStore::FollowEngineStream(std::span<const KvGroup> groups, const Device::StreamMark& mark) {
  if (device() == nullptr || EngineStream(groups) == nullptr) return Status::Ok();
  if (mark) return device()->AfterMark(mark);
  Result<Device::StreamMark> now = MarkEngineStream(groups);
  if (!now.ok()) return now.status();
  return device()->AfterMark(*now);
}

Status KvStore::ScatterToDevice(const ModelKv& model, const std::uint8_t* canonical, std::uint64_t tokens,
                               std::span<const KvGroup> groups) {
  Device* dev = device();
  if (dev == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  const std::uint64_t bytes = tokens * static_cast<std::uint64_t>(model.bytes_per_token());
  if (bytes == 0) return Status::Ok();
  Result<chunk::Payload> staging = dev->Allocate(static_cast<size_t>(bytes));
  if (!staging.ok()) return staging.status();
  KDN_RETURN_IF_ERROR(FollowEngineStream(groups));
  KDN_RETURN_IF_ERROR(dev->CopyToDevice(staging->data(), canonical, static_cast<size_t>(bytes)));
  return ScatterRuns(model, staging->data(), tokens, groups);
}

Status KvStore::ScatterOnDevice(const ModelKv& model, const void* canonical, std::uint64_t tokens,
                                std::span<const KvGroup> groups) {
  if (device() == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  if (tokens == 0) return Status::Ok();
  KDN_RETURN_IF_ERROR(FollowEngineStream(groups));
  return ScatterRuns(model, canonical, tokens, groups);
}

Status KvStore::ScatterRuns(const ModelKv& model, const void* canonical, std::uint64_t tokens,
                            std::span<const KvGroup> groups) {
  Device* dev = device();
  KDN_RETURN_IF_ERROR(ForEachLayerRun(model, groups, [&](const kernels::KvView& v, std::int64_t lb, std::int64_t le) {
    return dev->Scatter(canonical, v, 0, static_cast<std::int64_t>(tokens), lb, le);
  }));
  KDN_RETURN_IF_ERROR(dev->StreamAfterUs(EngineStream(groups)));
  return dev->Synchronize();
}

Result<KvStore::Retrieved> KvStore::RetrieveToDevice(const ModelKv& model, std::string_view ns, const TokenKeys& keys,
                                                     std::span<const KvGroup> groups,
                                                       const DeliveryTarget& target) {
  if (device() == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  const auto t0 = std::chrono::steady_clock::now();
  // The engine's stream as the call found it: the writes wait for that.
  Result<Device::StreamMark> mark = MarkEngineStream(groups);
  if (!mark.ok()) return mark.status();
  Fetch f = FetchPrefix(model, ns, keys, TieredStore::Form::kStored, target);
  // As a prefix: chunks past the first failure to read are not written.
  const std::uint64_t read_prefix = f.prefix();
  std::erase_if(f.chunks, [&](const FetchedChunk& c) { return c.begin >= read_prefix; });
  Result<Delivered> d = DeliverToDevice(model, f, groups, /*as_prefix=*/true, {}, *mark);
  if (!d.ok()) return d.status();
  const std::uint64_t prefix = f.prefix();
  std::erase_if(f.chunks, [&](const FetchedChunk& c) { return c.begin >= prefix; });  // not written: not served
  CountLoad(model, ns, f, keys.size(), prefix, prefix * static_cast<std::uint64_t>(model.bytes_per_token()),
            MicrosSince(t0));
  Retrieved r;
  r.tokens = prefix;
  r.covered = f.covered;
  r.lossy = d->lossy;
  return r;
}

Result<std::uint64_t> KvStore::StoreFromDevice(const ModelKv& model, std::string_view ns, const TokenKeys& k,
                                               std::span<const KvGroup> groups) {
  Device* dev = device();
  if (dev == nullptr) return Status::Unsupported("KV views in device memory: this runtime has no device");
  const auto t0 = std::chrono::steady_clock::now();
  auto plan = PlanStore(model, ns, k);
  if (!plan.ok()) return plan.status();
  const auto per_token = static_cast<std::uint64_t>(model.bytes_per_token());
  std::uint64_t largest = 0;
  for (const PlannedChunk& p : *plan) {
    if (!p.present) largest = std::max(largest, p.tokens * per_token);
  }
  chunk::Payload staging;
  if (largest > 0) {
    Result<chunk::Payload> b = dev->Allocate(static_cast<size_t>(largest));
    if (!b.ok()) return b.status();
    staging = std::move(b).value();
  }
  const bool keep_on_device = chain_->TakesDevicePayloads();
  KDN_RETURN_IF_ERROR(FollowEngineStream(groups));  // the engine's writes to the views come first
  std::uint64_t stored = 0;
  for (const PlannedChunk& p : *plan) {
    if (!p.present) {
      const std::uint64_t bytes = p.tokens * per_token;
      KDN_RETURN_IF_ERROR(ForEachLayerRun(model, groups, [&](const kernels::KvView& v, std::int64_t lb, std::int64_t le) {
        return dev->Gather(v, static_cast<std::int64_t>(p.begin), static_cast<std::int64_t>(p.tokens), lb, le,
                           staging.data());
      }));
      Status st = Status::Unsupported("not on the device");
      if (keep_on_device) {
        // The device tier copies it device to device into its own block
        // (the put reads the staging buffer only while it runs).
        KDN_RETURN_IF_ERROR(dev->Synchronize());
        st = PutPayload(model, ns, p.key, p.tokens, static_cast<std::int64_t>(p.begin),
                        chunk::Payload::Adopt(staging.data(), static_cast<size_t>(bytes), nullptr), /*on_device=*/true,
                        p.value);
      }
      if (!st.ok()) {
        // Any other tier reads the KV on the host.
        Payload host = Payload::Uninitialized(static_cast<size_t>(bytes));
        KDN_RETURN_IF_ERROR(dev->CopyToHost(host.data(), staging.data(), static_cast<size_t>(bytes)));
        st = CommitChunk(model, ns, p, std::move(host));
      }
      if (!st.ok()) break;  // no tier could take it: keep the prefix
    }
    stored = p.begin + p.tokens;
  }
  KDN_RETURN_IF_ERROR(dev->StreamAfterUs(EngineStream(groups)));
  CountStore(MicrosSince(t0));
  return HeldPrefix(ns, *plan, stored);
}

}  // namespace kdn::store

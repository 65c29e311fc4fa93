// SPDX-License-Identifier: Apache-2.0
#include "bench/gpu_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_kv.h"
#include "bench/canonical_view.h"
#include "bench/bench_util.h"
#include "kernels/common/half.h"
#include "core/codec/codec.h"
#include "core/codec/device.h"
#include "core/codec/tc_profile.h"
#include "refengine/model_loader.h"
#include "core/device/device.h"
#include "core/tiers/host_pool.h"
#include "core/engine/kv_store.h"
#include "core/knowledge/device_compose.h"
#include "core/util/dtype.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kdn::bench {
namespace {

// Why this run cannot measure, or "" when a GPU is there.
std::string WhyNoGpu() {
  if (!codec::DeviceCodecsBuilt()) return "this build has no CUDA kernels (configure with -DKDN_CUDA=ON)";
#ifdef KDN_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable CUDA device (") + cudaGetErrorString(e) + ")";
  if (n == 0) return "no CUDA device";
#endif
  return "";
}

// Median seconds of `once` over `repeats` runs after one warm-up; < 0 when
// a run failed.
template <typename F>
double MedianSeconds(int repeats, F&& once) {
  if (!once()) return -1;
  std::vector<double> s;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!once()) return -1;
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// What the delivery records run on: a model's KV in requests, each a
// canonical host buffer ([layer][k|v][token][head][dim], f16) of its tokens.
struct Request {
  std::vector<std::int32_t> ids;    // its token ids (distinct per request)
  const std::uint8_t* kv = nullptr;  // canonical, ids.size() tokens
};
struct Scenario {
  std::string name;
  store::TierSpec::Kind kind;
  std::string codec;
  bool device_baseline;  // against the device-to-device copy (else host-to-device)
};
struct Workload {
  store::ModelKv model;
  std::vector<Request> requests;
  std::vector<Scenario> scenarios;
  nlohmann::json params;
};

std::uint64_t RequestBytes(const store::ModelKv& m, const Request& r) {
  return static_cast<std::uint64_t>(m.bytes_per_token()) * r.ids.size();
}

// Delivery into device KV views through the store (KvStore::RetrieveToDevice),
// per source tier, against the copy of the same raw bytes that it replaces,
// in the same run: each request retrieved once per timed run into a
// canonical device view of its tokens (256-token chunks in the store).
//   <prefix>copy_h2d_gbps_raw   each request's raw bytes host -> device (pinned host memory where a GPU is)
//   <prefix>copy_d2d_gbps_raw   the same device -> device
//   <prefix><scenario>_gbps     a tier of the scenario's kind and codec into the views, vs copy_d2d (a device
//                               tier) or copy_h2d (the others)
//   <prefix>scatter_<layout>_gbps  the scatter kernel alone: device chunks of every request into a view of
//                               that layout (canonical, paged NHD and HND of 16-token blocks), vs copy_d2d
// GB/s of canonical KV written into the views.
int DeliveryRecords(const std::shared_ptr<store::Device>& dev, const Workload& w, int repeats, const std::string& prefix,
                    Records& records) {
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "kdn bench gpu: %s%s\n", prefix.c_str(), m.c_str());
    return 2;
  };
  const store::ModelKv& model = w.model;
  const size_t n = w.requests.size();
  std::vector<std::uint64_t> at(n + 1, 0);  // each request's offset in the concatenated bytes
  for (size_t i = 0; i < n; ++i) at[i + 1] = at[i] + RequestBytes(model, w.requests[i]);
  const std::uint64_t total = at[n];
  // The baselines.
  auto pool = store::HostPool::Create(total, store::MemoryKind::kPinnedHost);
  if (!pool.ok()) return fail(pool.status().message());
  chunk::Payload host = (*pool)->Allocate(total);
  if (host.empty()) return fail("cannot allocate pinned host memory");
  for (size_t i = 0; i < n; ++i) std::memcpy(host.data() + at[i], w.requests[i].kv, at[i + 1] - at[i]);
  Result<chunk::Payload> src = dev->Allocate(total), dst = dev->Allocate(total);
  if (!src.ok() || !dst.ok()) return fail("cannot allocate device memory");
  const double h2d_s = MedianSeconds(repeats, [&] {
    for (size_t i = 0; i < n; ++i) {
      if (!dev->CopyToDevice(dst->data() + at[i], host.data() + at[i], at[i + 1] - at[i]).ok()) return false;
    }
    return dev->Synchronize().ok();
  });
  if (!dev->CopyToDevice(src->data(), host.data(), total).ok() || !dev->Synchronize().ok()) return fail("copy failed");
  const double d2d_s = MedianSeconds(repeats, [&] {
    for (size_t i = 0; i < n; ++i) {
      if (!dev->CopyOnDevice(dst->data() + at[i], src->data() + at[i], at[i + 1] - at[i]).ok()) return false;
    }
    return dev->Synchronize().ok();
  });
  if (h2d_s <= 0 || d2d_s <= 0) return fail("the baseline copies failed");
  nlohmann::json params = w.params;
  params["device"] = dev->name();
  params["requests"] = n;
  params["tokens_per_request"] = w.requests.empty() ? 0 : w.requests[0].ids.size();
  params["total_bytes"] = total;
  const double h2d = static_cast<double>(total) / h2d_s / 1e9, d2d = static_cast<double>(total) / d2d_s / 1e9;
  records.Add(prefix + "copy_h2d_gbps_raw", h2d, "GB/s", params);
  records.Add(prefix + "copy_d2d_gbps_raw", d2d, "GB/s", params);

  int rc = 0;
  // The scatter kernel alone, from device chunks (src) into views of each layout.
  {
    constexpr std::int64_t kBlock = 16;
    const kernels::KvShape& shape = model.shape;
    const std::int64_t row = shape.heads * shape.head_dim * shape.elem_bytes;  // one token of one layer's K
    for (const char* layout : {"canonical", "paged_nhd", "paged_hnd"}) {
      const bool paged = std::string(layout) != "canonical";
      // Per request: its view (paged: per layer K and V block pools, blocks in a shuffled order).
      std::vector<chunk::Payload> pools;
      std::vector<std::vector<void*>> k(n), v(n);
      std::vector<std::vector<std::int32_t>> tables(n);
      std::vector<kernels::KvView> views(n);
      bool ok = true;
      for (size_t i = 0; i < n && ok; ++i) {
        const auto tokens = static_cast<std::int64_t>(w.requests[i].ids.size());
        if (!paged) {
          const CanonicalView cv(model, dst->data() + at[i], static_cast<std::uint64_t>(tokens));
          views[i] = cv.view();
          k[i].assign(cv.view().k_base, cv.view().k_base + shape.layers);
          v[i].assign(cv.view().v_base, cv.view().v_base + shape.layers);
        } else {
          const std::int64_t blocks = (tokens + kBlock - 1) / kBlock;
          for (std::int64_t b = 0; b < blocks; ++b) tables[i].push_back(static_cast<std::int32_t>((b * 7 + 3) % blocks));
          for (std::int64_t l = 0; l < 2 * shape.layers && ok; ++l) {
            Result<chunk::Payload> p = dev->Allocate(static_cast<size_t>(blocks * kBlock * row));
            ok = p.ok();
            if (!ok) break;
            (l % 2 == 0 ? k[i] : v[i]).push_back(p->data());
            pools.push_back(std::move(p).value());
          }
          kernels::KvView& view = views[i];
          view.shape = shape;
          view.paged = true;
          view.block_size = kBlock;
          view.order = std::string(layout) == "paged_nhd" ? kernels::PageOrder::kNHD : kernels::PageOrder::kHND;
          view.block_table = tables[i].data();
          view.table_len = blocks;
          view.num_blocks = blocks;
        }
        views[i].k_base = k[i].data();
        views[i].v_base = v[i].data();
      }
      if (!ok) {
        rc = fail(std::string(layout) + ": cannot allocate device memory for the view");
        break;
      }
      std::string why;
      const double secs = MedianSeconds(repeats, [&] {
        for (size_t i = 0; i < n; ++i) {
          const auto tokens = static_cast<std::int64_t>(w.requests[i].ids.size());
          Status st = dev->Scatter(src->data() + at[i], views[i], 0, tokens, 0, shape.layers);
          if (!st.ok()) {
            why = st.message();
            return false;
          }
        }
        return dev->Synchronize().ok();
      });
      if (secs <= 0) {
        rc = fail(std::string("scatter ") + layout + ": " + why);
        break;
      }
      nlohmann::json p = params;
      p["layout"] = layout;
      if (paged) p["block_tokens"] = kBlock;
      records.Add(prefix + "scatter_" + layout + "_gbps", static_cast<double>(total) / secs / 1e9, "GB/s", p,
                  prefix + "copy_d2d_gbps_raw", d2d);
    }
  }

  // kdn's batched decode alone: every request's chunks (256 tokens each,
  // kdn:balanced, payloads in pinned host memory) decoded in one batch per
  // request into its canonical view, payload upload included, vs copy_d2d.
  if (rc == 0) {
    auto codec_spec = codec::ParseSpec("kdn:balanced");
    auto kdn = codec_spec.ok() ? codec::MakeCodec(*codec_spec) : Result<std::unique_ptr<codec::Codec>>(codec_spec.status());
    if (!kdn.ok()) return fail(kdn.status().message());
    const std::uint64_t per_token = static_cast<std::uint64_t>(model.bytes_per_token());
    std::vector<std::vector<codec::KdnBatchJob>> jobs(n);
    std::vector<codec::Bytes> encoded;
    std::vector<std::uint8_t> chunk;
    std::uint64_t payload_bytes = 0;
    for (size_t i = 0; i < n && rc == 0; ++i) {
      const std::uint64_t tokens = w.requests[i].ids.size();
      for (std::uint64_t t0 = 0; t0 < tokens; t0 += kChunkTokens) {
        const std::uint64_t t1 = std::min<std::uint64_t>(tokens, t0 + kChunkTokens);
        const codec::Shape shape{static_cast<std::uint32_t>(model.shape.layers), static_cast<std::uint32_t>(model.shape.heads),
                                 static_cast<std::uint32_t>(model.shape.head_dim), static_cast<std::uint32_t>(t1 - t0),
                                 model.shape.elem_bytes == 4 ? 0u : 1u};
        // The chunk's canonical bytes: per (layer, k|v) plane, its tokens' rows.
        const std::uint64_t row = per_token / (2 * static_cast<std::uint64_t>(model.shape.layers));
        chunk.resize((t1 - t0) * per_token);
        for (std::uint64_t p = 0; p < 2ull * static_cast<std::uint64_t>(model.shape.layers); ++p) {
          std::memcpy(chunk.data() + p * (t1 - t0) * row, w.requests[i].kv + (p * tokens + t0) * row, (t1 - t0) * row);
        }
        Result<codec::Bytes> enc = (*kdn)->Encode(shape, chunk.data());
        if (!enc.ok()) {
          rc = fail("kdn encode: " + enc.status().message());
          break;
        }
        payload_bytes += enc->size();
        encoded.push_back(std::move(enc).value());
        codec::KdnBatchJob j;
        j.shape = shape;
        j.row = row / static_cast<std::uint64_t>(model.shape.elem_bytes);  // elements
        const CanonicalView cv(model, dst->data() + at[i], tokens);
        for (std::int64_t l = 0; l < model.shape.layers; ++l) {
          for (void* const* base : {cv.view().k_base, cv.view().v_base}) {
            j.planes.push_back(static_cast<std::uint8_t*>(base[l]) + t0 * row);
          }
        }
        jobs[i].push_back(std::move(j));
      }
    }
    // The payloads in pinned memory, back to back.
    auto ppool = store::HostPool::Create(2 * payload_bytes + (std::uint64_t{1} << 20), store::MemoryKind::kPinnedHost);
    chunk::Payload pinned = rc == 0 && ppool.ok() ? (*ppool)->Allocate(payload_bytes) : chunk::Payload();
    if (rc == 0 && pinned.empty()) rc = fail("cannot allocate pinned memory for the payloads");
    if (rc == 0) {
      std::uint64_t off = 0, k = 0;
      for (auto& js : jobs) {
        for (codec::KdnBatchJob& j : js) {
          std::memcpy(pinned.data() + off, encoded[k].data(), encoded[k].size());
          j.payload = pinned.data() + off;
          j.size = encoded[k].size();
          off += encoded[k++].size();
        }
      }
      std::string why;
      const double secs = MedianSeconds(repeats, [&] {
        for (auto& js : jobs) {
          const Status st = dev->DecodeKdnBatch(js);
          for (const codec::KdnBatchJob& j : js) {
            if (!st.ok() || !j.status.ok()) {
              why = st.ok() ? j.status.message() : st.message();
              return false;
            }
          }
        }
        return dev->Synchronize().ok();
      });
      if (secs <= 0) {
        rc = fail("kdn batch decode: " + why);
      } else {
        nlohmann::json p = params;
        p["spec"] = (*kdn)->spec().ToString();
        p["payload_bytes"] = payload_bytes;
        p["ratio"] = static_cast<double>(total) / static_cast<double>(payload_bytes);
        p["batch"] = "every chunk of a request in one DecodeKdnBatch (one launch on a GPU), payload upload included";
        records.Add(prefix + "decode_kdn_batch_gbps", static_cast<double>(total) / secs / 1e9, "GB/s", p,
                    prefix + "copy_d2d_gbps_raw", d2d);
      }
    }
  }

  std::string dir = (std::filesystem::temp_directory_path() / "kdn-bench-gpu-XXXXXX").string();
  if (rc == 0 && mkdtemp(dir.data()) == nullptr) return fail("cannot make a temporary directory");
  for (const Scenario& sc : w.scenarios) {
    if (rc != 0) break;
    store::StoreOptions so;
    so.chunk_tokens = kChunkTokens;
    so.device = dev;
    store::TierSpec t;
    t.kind = sc.kind;
    t.capacity_bytes = total * 2 + (std::uint64_t{64} << 20);
    t.codec = sc.codec;
    t.fsync = false;
    t.path = dir + "/" + sc.name;
    so.tiers = {t};
    auto kv = store::KvStore::Create(so);
    if (!kv.ok()) {
      rc = fail(sc.name + ": " + kv.status().message());
      break;
    }
    std::vector<store::KvGroup> groups(n);
    std::vector<std::unique_ptr<CanonicalView>> views;
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      const Request& q = w.requests[i];
      store::TokenKeys keys;
      keys.tokens = q.ids;
      const CanonicalView hv(model, const_cast<std::uint8_t*>(q.kv), q.ids.size());
      auto stored = (*kv)->Store(model, "bench", keys, hv.view());
      ok = stored.ok() && *stored == q.ids.size();
      views.push_back(std::make_unique<CanonicalView>(model, dst->data() + at[i], q.ids.size()));
      for (std::int64_t l = 0; l < model.shape.layers; ++l) groups[i].layers.push_back(static_cast<std::uint32_t>(l));
      groups[i].view = views.back()->view();
    }
    if (!ok) {
      rc = fail(sc.name + ": the store did not take the requests");
      break;
    }
    (*kv)->chain().Flush();
    std::string why;
    const double secs = MedianSeconds(repeats, [&] {
      for (size_t i = 0; i < n; ++i) {
        store::TokenKeys keys;
        keys.tokens = w.requests[i].ids;
        auto r = (*kv)->RetrieveToDevice(model, "bench", keys, std::span<const store::KvGroup>(&groups[i], 1));
        if (!r.ok() || r->tokens != w.requests[i].ids.size()) {
          why = r.ok() ? "a retrieve found " + std::to_string(r->tokens) + " tokens" : r.status().message();
          return false;
        }
      }
      return true;
    });
    if (secs <= 0) {
      rc = fail(sc.name + ": " + why);
      break;
    }
    nlohmann::json p = params;
    p["tier"] = store::TierSpec::Kind::kDisk == sc.kind ? "disk" : sc.kind == store::TierSpec::Kind::kHost ? "host" : "device";
    p["codec"] = (*kv)->options().tiers[0].codec;
    if (sc.kind == store::TierSpec::Kind::kDisk) p["page_cache"] = "warm (the files were just written; O_DIRECT where the filesystem allows it)";
    const double gbps = static_cast<double>(total) / secs / 1e9;
    records.Add(prefix + sc.name + "_gbps", gbps, "GB/s", p, prefix + (sc.device_baseline ? "copy_d2d_gbps_raw" : "copy_h2d_gbps_raw"),
                sc.device_baseline ? d2d : h2d);
  }
  std::filesystem::remove_all(dir);
  return rc;
}

// The reference model's real KV: each 256-token chunk of the held-out text
// its own request, every tier of the table, tc with the model's profile.
Workload RefWorkload(const std::vector<std::vector<std::uint8_t>>& chunks, const codec::Shape& shape, int repeats) {
  Workload w;
  w.model.shape = {shape.layers, shape.kv_heads, shape.head_dim, 2};
  w.model.dtype = shape.dtype;
  // The tc profile is fitted to this model's KV as the reference engine names
  // it (its f16 fingerprint): every scenario uses that fingerprint.
  std::filesystem::path profile(refengine::DefaultModelsDir());
  profile /= "stories260K.kdntc";
  auto prof = codec::LoadTcProfile(profile.string());
  if (prof.ok() && (*prof)->fingerprints.size() > 1) {
    std::memcpy(w.model.fingerprint.data(), (*prof)->fingerprints[1].data(), 32);
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    Request q;
    for (std::uint32_t k = 0; k < shape.tokens; ++k) q.ids.push_back(static_cast<std::int32_t>(i * 100000 + k));
    q.kv = chunks[i].data();
    w.requests.push_back(std::move(q));
  }
  w.scenarios = {{"get_device_tier", store::TierSpec::Kind::kDevice, "raw", true},
                 {"deliver_host_raw", store::TierSpec::Kind::kHost, "raw", false},
                 {"deliver_disk_zstd", store::TierSpec::Kind::kDisk, "zstd", false},
                 {"deliver_disk_raw", store::TierSpec::Kind::kDisk, "raw", false},
                 {"deliver_disk_kdn", store::TierSpec::Kind::kDisk, "kdn:balanced", false}};
  if (prof.ok()) {
    w.scenarios.push_back({"deliver_disk_tc", store::TierSpec::Kind::kDisk, "tc:balanced,profile=" + profile.string(), false});
  } else {
    std::fprintf(stderr, "kdn bench gpu: warning: no tc scenario: %s\n", prof.status().message().c_str());
  }
  w.params = {{"model", "stories260K"}, {"shape", "ref"}, {"chunk_tokens", kChunkTokens}, {"dtype", "f16"},
              {"repeats", repeats}, {"text", "bench/texts/heldout.txt"}, {"kv", "real (the reference model's prefill)"}};
  return w;
}

// Synthetic KV of Llama-3.1-8B's shape (32 layers, 8 KV heads, head_dim
// 128, f16: 128 KiB per token): per channel (layer, k|v, head, dim) a scale
// (log-uniform over e^-3..e^1.5, as real K has outlier channels) and an
// offset, and a smooth drift along the tokens (an AR(1) walk per channel)
// plus a little noise. Deterministic (seeded). Labelled synthetic in every
// record: its compression ratios are not a real model's.
std::vector<std::uint8_t> SyntheticLlama8b(std::uint32_t tokens) {
  constexpr std::int64_t kLayers = 32, kHeads = 8, kDim = 128, kRow = kHeads * kDim;
  std::vector<std::uint8_t> out(static_cast<size_t>(kLayers * 2 * tokens * kRow * 2));
  auto* h = reinterpret_cast<std::uint16_t*>(out.data());
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {  // xorshift64*, uniform in [0, 1)
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return static_cast<double>((x * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
  };
  std::vector<float> scale(kRow), offset(kRow), state(kRow);
  for (std::int64_t lk = 0; lk < kLayers * 2; ++lk) {
    for (std::int64_t c = 0; c < kRow; ++c) {
      scale[c] = static_cast<float>(std::exp(-3.0 + 4.5 * next()));
      offset[c] = static_cast<float>((next() - 0.5) * 0.6) * scale[c];
      state[c] = static_cast<float>(next() - 0.5);
    }
    for (std::uint32_t t = 0; t < tokens; ++t) {
      std::uint16_t* row = h + (lk * tokens + t) * kRow;
      for (std::int64_t c = 0; c < kRow; ++c) {
        state[c] = 0.97f * state[c] + 0.2f * static_cast<float>(next() - 0.5);
        const float noise = 0.05f * static_cast<float>(next() - 0.5);
        row[c] = kernels::float_to_half(offset[c] + scale[c] * (state[c] + noise));
      }
    }
  }
  return out;
}

Workload Llama8bWorkload(const std::vector<std::uint8_t>& kv, std::uint32_t tokens, int repeats) {
  Workload w;
  w.model.shape = {32, 8, 128, 2};
  w.model.dtype = 1;  // f16
  w.model.fingerprint.fill(0x8b);
  Request q;
  for (std::uint32_t k = 0; k < tokens; ++k) q.ids.push_back(static_cast<std::int32_t>(k));
  q.kv = kv.data();
  w.requests.push_back(std::move(q));
  w.scenarios = {{"get_device_tier", store::TierSpec::Kind::kDevice, "raw", true},
                 {"deliver_host_raw", store::TierSpec::Kind::kHost, "raw", false},
                 {"deliver_host_kdn", store::TierSpec::Kind::kHost, "kdn:balanced", false},
                 {"deliver_host_cachegen", store::TierSpec::Kind::kHost, "cachegen", false},
                 {"deliver_disk_kdn", store::TierSpec::Kind::kDisk, "kdn:balanced", false},
                 {"deliver_disk_zstd", store::TierSpec::Kind::kDisk, "zstd", false},
                 // The disk's default with a GPU (store/chunk_codec.h kDefaultColdGpuCodec), beside zstd's.
                 {"deliver_disk_raw", store::TierSpec::Kind::kDisk, "raw", false}};
  w.params = {{"model", "llama-3.1-8b shape"}, {"shape", "llama-8b"}, {"chunk_tokens", kChunkTokens},
              {"dtype", "f16"}, {"repeats", repeats},
              {"kv", "synthetic: per-channel scales, smooth token drift (bench/gpu_bench.cc SyntheticLlama8b)"},
              {"tc", "not measured: tc needs a profile fitted to the model's KV, and there is none for a synthetic model"}};
  return w;
}

// 256-token chunks of f16 KV of the held-out text, as the store keeps them;
// empty with *why set when the reference model is missing.
std::vector<std::vector<std::uint8_t>> HeldOutChunks(codec::Shape* shape, std::string* why) {
  std::vector<std::vector<std::uint8_t>> chunks;
  const RealKv real = Prefill(8);
  if (!real.model) {
    *why = "the reference model is needed: " + real.why_not;
    return chunks;
  }
  if (real.window < static_cast<int>(kChunkTokens)) {
    *why = "the prefilled windows are shorter than a chunk";
    return chunks;
  }
  const size_t row = size_t{real.heads} * real.head_dim;
  for (const auto& w : real.kv) {
    chunk::Payload p = Slice(w, real.layers, row, static_cast<size_t>(real.window), 0, kChunkTokens);
    const std::vector<float> f(reinterpret_cast<const float*>(p.data()),
                               reinterpret_cast<const float*>(p.data()) + p.size() / 4);
    const std::vector<std::uint16_t> h = ToHalf(f);
    chunks.emplace_back(reinterpret_cast<const std::uint8_t*>(h.data()),
                        reinterpret_cast<const std::uint8_t*>(h.data()) + h.size() * 2);
  }
  *shape = {real.layers, real.heads, real.head_dim, kChunkTokens, 1};
  return chunks;
}

}  // namespace

// An engine that does no work: the blend records time kdn's own part of a
// blend (placement, re-positioning, the check layers' saves and deviations,
// the conversion to the model's dtype, the host path's copy to the device),
// which is what moving the composition to the device changes; the engine's
// layers cost the same on either path and are left out (stated in params).
class NoWorkEngine final : public blend::LayerEngine {
 public:
  NoWorkEngine(int hidden, bool on_device) : hidden_(hidden), on_device_(on_device) {}
  Status Layer(int, std::span<const int>, std::span<const int>, float*, float*, float*, int) override {
    return Status::Ok();
  }
  Status KvPass(int, std::span<const int>, std::span<const int>, float*, float*, float*, int) override {
    return Status::Ok();
  }
  bool has_kv_pass() const override { return true; }
  double kv_pass_cost(int) const override { return 0.065; }
  int hidden_dim() const override { return hidden_; }
  bool on_device() const override { return on_device_; }

 private:
  int hidden_;
  bool on_device_;
};

// Blending four cached documents and a 64-token question of the 8B shape
// (f16 views) with kdn's default method: composed on the host, converted and
// copied to the device (the path of an engine on the host), against composed
// on `dev` (KDN_BLEND_ENGINE_ON_DEVICE), both ending with the f16 canonical
// KV in device memory. Returns 0, or 2 after saying why.
int BlendComposeRecords(const std::shared_ptr<store::Device>& dev, std::uint32_t tokens, int repeats,
                        const std::string& prefix, Records& records) {
  constexpr int kLayers = 32, kHeads = 8, kHeadDim = 128, kHidden = 4096, kQuestion = 64, kDocs = 4;
  const blend::ModelShape shape{kLayers, kHeads, kHeadDim};
  const auto kvd = static_cast<size_t>(kHeads * kHeadDim);
  std::vector<blend::Piece> pieces;
  const std::uint32_t per_doc = (tokens - kQuestion) / kDocs;
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int d = 0; d < kDocs; ++d) {
    blend::Piece p;
    p.tokens.assign(per_doc, 7);
    p.kv.resize(static_cast<size_t>(kLayers) * 2 * per_doc * kvd);
    for (float& v : p.kv) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      v = static_cast<float>(static_cast<double>(x >> 40) / 16777216.0 - 0.5);
    }
    pieces.push_back(std::move(p));
  }
  pieces.push_back(blend::Piece{std::vector<std::int32_t>(kQuestion, 9), {}, 0});
  const size_t total = static_cast<size_t>(kDocs) * per_doc + kQuestion;
  const size_t floats = static_cast<size_t>(kLayers) * 2 * total * kvd;
  blend::BlendOptions opt;
  opt.rope.head_dim = kHeadDim;
  opt.rope.theta = 500000.0;
  opt.rope.style = kernels::RopeStyle::kNeox;
  Result<chunk::Payload> out = dev->Allocate(floats * 2);
  if (!out.ok()) {
    std::fprintf(stderr, "kdn bench gpu: %s\n", out.status().message().c_str());
    return 2;
  }
  std::vector<float> host_kv;
  std::vector<std::uint8_t> host_f16(floats * 2);
  NoWorkEngine on_host(kHidden, false), on_device(kHidden, true);
  Status last;
  const double host_s = MedianSeconds(repeats, [&] {
    Result<blend::BlendReport> r = blend::Compose(shape, pieces, opt, on_host, &host_kv);
    if (!r.ok()) {
      last = r.status();
      return false;
    }
    FromFloat(1, host_kv.data(), host_kv.size(), host_f16.data());
    last = dev->CopyToDevice(out->data(), host_f16.data(), host_f16.size());
    if (last.ok()) last = dev->Synchronize();
    return last.ok();
  });
  const double device_s = host_s < 0 ? -1 : MedianSeconds(repeats, [&] {
    chunk::Payload kv;
    Result<blend::BlendReport> r = blend::ComposeOnDevice(shape, pieces, opt, on_device, *dev, &kv);
    if (!r.ok()) {
      last = r.status();
      return false;
    }
    last = dev->FromFloat(1, reinterpret_cast<const float*>(kv.data()), static_cast<std::int64_t>(floats), out->data());
    if (last.ok()) last = dev->Synchronize();
    return last.ok();
  });
  if (host_s < 0 || device_s < 0) {
    std::fprintf(stderr, "kdn bench gpu: blend: %s\n", last.message().c_str());
    return 2;
  }
  nlohmann::json p = {{"shape", "llama-8b"}, {"positions", total}, {"documents", kDocs},
                      {"question_tokens", kQuestion}, {"dtype", "f16"}, {"method", "kdn default (KV passes at 1 and 2, 28%)"},
                      {"engine", "none: kdn's own work only (the engine's layers cost the same on either path)"},
                      {"kv", "synthetic (uniform values)"}, {"repeats", repeats}};
  if (dev->emulated()) p["emulated"] = "host memory stands in for the GPU's; CPU paths of the kernels";
  records.Add(prefix + "blend_compose_host_ms", host_s * 1e3, "ms", p);
  records.Add(prefix + "blend_compose_device_ms", device_s * 1e3, "ms", p, prefix + "blend_compose_host_ms",
              host_s * 1e3);
  return 0;
}

int RunGpuBench(const GpuBenchOptions& o) {
  Records records;
  // The delivery records on `dev`, for the options' shape: the reference
  // model's real KV, or the 8B shape's synthetic KV at each request size.
  auto deliver = [&](const std::shared_ptr<store::Device>& dev, const std::string& prefix) -> int {
    if (o.shape == "ref") {
      codec::Shape shape;
      std::string why;
      const auto chunks = HeldOutChunks(&shape, &why);
      if (chunks.empty()) {
        std::fprintf(stderr, "kdn bench gpu: %s\n", why.c_str());
        return 2;
      }
      Workload w = RefWorkload(chunks, shape, o.repeats);
      if (dev->emulated()) w.params["emulated"] = "host memory stands in for the GPU's; CPU paths of the kernels";
      return DeliveryRecords(dev, w, o.repeats, prefix, records);
    }
    for (std::uint32_t tokens : o.tokens) {
      const std::vector<std::uint8_t> kv = SyntheticLlama8b(tokens);
      Workload w = Llama8bWorkload(kv, tokens, o.repeats);
      if (dev->emulated()) w.params["emulated"] = "host memory stands in for the GPU's; CPU paths of the kernels";
      if (int rc = DeliveryRecords(dev, w, o.repeats, prefix + "llama8b_" + std::to_string(tokens) + "_", records); rc != 0) {
        return rc;
      }
    }
    // Blending at the first request size, at most 8192 positions (its float
    // KV, 256 KiB a position, is held three times over).
    const std::uint32_t blend_tokens = std::min<std::uint32_t>(o.tokens.front(), 8192);
    return BlendComposeRecords(dev, blend_tokens, o.repeats, prefix + "llama8b_" + std::to_string(blend_tokens) + "_",
                               records);
  };
  if (o.shape != "ref" && o.shape != "llama-8b") {
    std::fprintf(stderr, "kdn bench gpu: unknown --shape %s (ref or llama-8b)\n", o.shape.c_str());
    return 2;
  }
  for (std::uint32_t tokens : o.tokens) {
    if (tokens == 0 || tokens % kChunkTokens != 0) {
      std::fprintf(stderr, "kdn bench gpu: --tokens %u: a positive multiple of %u\n", tokens, kChunkTokens);
      return 2;
    }
  }
  if (o.emulated) {
    // The delivery measures on the emulated device: the CPU paths of the
    // kernels over host memory. A check of the paths and of this bench, not
    // a GPU measurement (named emulated_*).
    if (int rc = deliver(store::MakeEmulatedDevice(), "emulated_"); rc != 0) return rc;
    return records.Finish(o.json_path, "kdn bench gpu");
  }
  const std::string why = WhyNoGpu();
  if (!why.empty()) {
    std::printf("kdn bench gpu: needs a CUDA GPU: %s; no records (--emulated measures the CPU emulation instead)\n",
                why.c_str());
    return records.Finish(o.json_path, "kdn bench gpu");
  }
#ifdef KDN_HAVE_CUDA
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "kdn bench gpu: %s\n", m.c_str());
    return 2;
  };
  codec::Shape shape;
  std::string no_kv;
  const std::vector<std::vector<std::uint8_t>> chunks = HeldOutChunks(&shape, &no_kv);
  if (chunks.empty()) return fail(no_kv);
  const std::uint64_t bytes = shape.bytes();
  void* pinned = nullptr;
  void* dev = nullptr;
  void* dev2 = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMallocHost(&pinned, bytes) != cudaSuccess || cudaMalloc(&dev, bytes) != cudaSuccess ||
      cudaMalloc(&dev2, bytes) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
    return fail("cannot allocate pinned and device memory");
  }
  std::memcpy(pinned, chunks[0].data(), bytes);
  auto median_gbps = [&](auto&& once) -> double {
    std::vector<double> s;
    for (int r = 0; r < o.repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      if (!once()) return -1;
      s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(s.begin(), s.end());
    return static_cast<double>(bytes) / s[s.size() / 2] / 1e9;
  };
  const nlohmann::json params = {{"model", "stories260K"}, {"chunk_tokens", kChunkTokens}, {"dtype", "f16"},
                                 {"bytes", bytes}, {"repeats", o.repeats}, {"text", "bench/texts/heldout.txt"}};
  const double h2d = median_gbps([&] {
    return cudaMemcpyAsync(dev, pinned, bytes, cudaMemcpyHostToDevice, stream) == cudaSuccess &&
           cudaStreamSynchronize(stream) == cudaSuccess;
  });
  const double d2d = median_gbps([&] {
    return cudaMemcpyAsync(dev2, dev, bytes, cudaMemcpyDeviceToDevice, stream) == cudaSuccess &&
           cudaStreamSynchronize(stream) == cudaSuccess;
  });
  records.Add("gpu_h2d_gbps_raw", h2d, "GB/s", params);
  records.Add("gpu_d2d_gbps_raw", d2d, "GB/s", params, "gpu_h2d_gbps_raw", h2d);
  std::filesystem::path profile(refengine::DefaultModelsDir());
  profile /= "stories260K.kdntc";
  struct Named {
    const char* name;
    std::string spec;
    Status (*decode)(const codec::Shape&, const std::uint8_t*, size_t, void*, void*);
  };
  const Named codecs[] = {{"kdn", "kdn:balanced", codec::KdnDecodeOnDevice},
                          {"cachegen", "cachegen", codec::CacheGenDecodeOnDevice},
                          {"tc", "tc:balanced,profile=" + profile.string(), codec::TcDecodeOnDevice}};
  for (const Named& n : codecs) {
    Result<codec::Spec> spec = codec::ParseSpec(n.spec);
    Result<std::unique_ptr<codec::Codec>> c = spec.ok() ? codec::MakeCodec(*spec) : Result<std::unique_ptr<codec::Codec>>(spec.status());
    if (!c.ok()) {
      std::fprintf(stderr, "kdn bench gpu: warning: skipping %s: %s\n", n.spec.c_str(), c.status().message().c_str());
      continue;
    }
    Result<codec::Bytes> payload = (*c)->Encode(shape, chunks[0].data());
    if (!payload.ok()) return fail(n.spec + ": " + payload.status().message());
    void* staged = nullptr;
    if (cudaMallocHost(&staged, payload->size()) != cudaSuccess) return fail("cannot allocate pinned memory");
    std::memcpy(staged, payload->data(), payload->size());
    Status last;
    const double gbps = median_gbps([&] {
      last = n.decode(shape, static_cast<const std::uint8_t*>(staged), payload->size(), dev, stream);
      return last.ok();
    });
    cudaFreeHost(staged);
    if (gbps < 0) return fail(n.spec + " on the device: " + last.message());
    nlohmann::json p = params;
    p["spec"] = (*c)->spec().ToString();
    p["payload_bytes"] = payload->size();
    p["goal"] = ">= 1 (decode at least as fast as the raw bytes cross PCIe)";
    records.Add(std::string("gpu_decode_gbps_") + n.name, gbps, "GB/s", p, "gpu_h2d_gbps_raw", h2d);
  }
  cudaStreamDestroy(stream);
  cudaFree(dev);
  cudaFree(dev2);
  cudaFreeHost(pinned);
  // Delivery through the store into a device view, per source tier.
  auto device = store::MakeCudaDevice(0);
  if (!device.ok()) return fail(device.status().message());
  if (int rc = deliver(*device, "gpu_"); rc != 0) return rc;
  return records.Finish(o.json_path, "kdn bench gpu");
#else
  return 0;
#endif
}

}  // namespace kdn::bench

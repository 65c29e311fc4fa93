#include "bench/gpu_bench.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_kv.h"
#include "bench/canonical_view.h"
#include "bench/bench_util.h"
#include "core/codec/codec.h"
#include "core/codec/device.h"
#include "core/codec/tc_profile.h"
#include "refengine/model_loader.h"
#include "core/device/device.h"
#include "core/tiers/host_pool.h"
#include "core/engine/kv_store.h"

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

// Delivery into a device KV view through the store (KvStore::RetrieveToDevice),
// per source tier, against the copy of the same raw bytes that it replaces,
// in the same run: one request per chunk (256 tokens of a held-out window,
// f16), every chunk of the run retrieved once per timed run.
//   <prefix>copy_h2d_gbps_raw   the raw f16 chunks host -> device (pinned host memory where a GPU is)
//   <prefix>copy_d2d_gbps_raw   the same device -> device
//   <prefix>get_device_tier_gbps          a device tier (raw) into the view, vs copy_d2d
//   <prefix>deliver_host_raw_gbps         a host tier (raw) into the view, vs copy_h2d
//   <prefix>deliver_disk_<codec>_gbps     a disk tier in zstd, kdn:balanced, tc:balanced (page cache warm:
//                                         the decode path, not the disk), vs copy_h2d
// GB/s of canonical KV written into the view.
int DeliveryRecords(const std::shared_ptr<store::Device>& dev, const std::vector<std::vector<std::uint8_t>>& chunks,
                    const codec::Shape& shape, int repeats, const std::string& prefix, const nlohmann::json& base,
                    Records& records) {
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "kdn bench gpu: %s%s\n", prefix.c_str(), m.c_str());
    return 2;
  };
  const size_t n = chunks.size();
  const std::uint64_t cb = shape.bytes(), total = cb * n;
  store::ModelKv model;
  model.shape = {shape.layers, shape.kv_heads, shape.head_dim, 2};
  model.dtype = shape.dtype;
  // The tc profile is fitted to this model's KV as the reference engine names
  // it (its f16 fingerprint): every scenario uses that fingerprint.
  std::filesystem::path profile(refengine::DefaultModelsDir());
  profile /= "stories260K.kdntc";
  auto prof = codec::LoadTcProfile(profile.string());
  if (prof.ok() && (*prof)->fingerprints.size() > 1) {
    std::memcpy(model.fingerprint.data(), (*prof)->fingerprints[1].data(), 32);
  }
  // The baselines.
  auto pool = store::HostPool::Create(total, store::MemoryKind::kPinnedHost);
  if (!pool.ok()) return fail(pool.status().message());
  chunk::Payload host = (*pool)->Allocate(total);
  if (host.empty()) return fail("cannot allocate pinned host memory");
  for (size_t i = 0; i < n; ++i) std::memcpy(host.data() + i * cb, chunks[i].data(), cb);
  Result<chunk::Payload> src = dev->Allocate(total), dst = dev->Allocate(total);
  if (!src.ok() || !dst.ok()) return fail("cannot allocate device memory");
  const double h2d_s = MedianSeconds(repeats, [&] {
    for (size_t i = 0; i < n; ++i) {
      if (!dev->CopyToDevice(dst->data() + i * cb, host.data() + i * cb, cb).ok()) return false;
    }
    return dev->Synchronize().ok();
  });
  if (!dev->CopyToDevice(src->data(), host.data(), total).ok() || !dev->Synchronize().ok()) return fail("copy failed");
  const double d2d_s = MedianSeconds(repeats, [&] {
    for (size_t i = 0; i < n; ++i) {
      if (!dev->CopyOnDevice(dst->data() + i * cb, src->data() + i * cb, cb).ok()) return false;
    }
    return dev->Synchronize().ok();
  });
  if (h2d_s <= 0 || d2d_s <= 0) return fail("the baseline copies failed");
  nlohmann::json params = base;
  params["device"] = dev->name();
  params["chunks"] = n;
  params["total_bytes"] = total;
  const double h2d = static_cast<double>(total) / h2d_s / 1e9, d2d = static_cast<double>(total) / d2d_s / 1e9;
  records.Add(prefix + "copy_h2d_gbps_raw", h2d, "GB/s", params);
  records.Add(prefix + "copy_d2d_gbps_raw", d2d, "GB/s", params);

  std::string dir = (std::filesystem::temp_directory_path() / "kdn-bench-gpu-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return fail("cannot make a temporary directory");
  struct Scenario {
    std::string name;
    store::TierSpec::Kind kind;
    std::string codec;
    bool device_baseline;
  };
  std::vector<Scenario> scenarios = {{"get_device_tier", store::TierSpec::Kind::kDevice, "raw", true},
                                     {"deliver_host_raw", store::TierSpec::Kind::kHost, "raw", false},
                                     {"deliver_disk_zstd", store::TierSpec::Kind::kDisk, "zstd", false},
                                     {"deliver_disk_kdn", store::TierSpec::Kind::kDisk, "kdn:balanced", false}};
  if (prof.ok()) {
    scenarios.push_back({"deliver_disk_tc", store::TierSpec::Kind::kDisk, "tc:balanced,profile=" + profile.string(), false});
  } else {
    std::fprintf(stderr, "kdn bench gpu: warning: no tc scenario: %s\n", prof.status().message().c_str());
  }
  int rc = 0;
  for (const Scenario& sc : scenarios) {
    store::StoreOptions so;
    so.chunk_tokens = shape.tokens;
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
    // One request per chunk, each at positions 0..255 as it was prefilled.
    std::vector<std::vector<std::int32_t>> ids(n);
    std::vector<store::KvGroup> groups(n);
    std::vector<std::unique_ptr<CanonicalView>> views;
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) {
      for (std::uint32_t k = 0; k < shape.tokens; ++k) ids[i].push_back(static_cast<std::int32_t>(i * 100000 + k));
      store::TokenKeys keys;
      keys.tokens = ids[i];
      // Canonical buffers of cb bytes each: shape.tokens tokens of the model.
      const CanonicalView hv(model, const_cast<std::uint8_t*>(chunks[i].data()), shape.tokens);
      auto stored = (*kv)->Store(model, "bench", keys, hv.view());
      ok = stored.ok() && *stored == shape.tokens;
      views.push_back(std::make_unique<CanonicalView>(model, dst->data() + i * cb, shape.tokens));
      for (std::uint32_t l = 0; l < shape.layers; ++l) groups[i].layers.push_back(l);
      groups[i].view = views.back()->view();
    }
    if (!ok) {
      rc = fail(sc.name + ": the store did not take the chunks");
      break;
    }
    (*kv)->chain().Flush();
    std::string why;
    const double secs = MedianSeconds(repeats, [&] {
      for (size_t i = 0; i < n; ++i) {
        store::TokenKeys keys;
        keys.tokens = ids[i];
        auto r = (*kv)->RetrieveToDevice(model, "bench", keys, std::span<const store::KvGroup>(&groups[i], 1));
        if (!r.ok() || r->tokens != shape.tokens) {
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

int RunGpuBench(const GpuBenchOptions& o) {
  Records records;
  if (o.emulated) {
    // The delivery measures on the emulated device: the CPU paths of the
    // kernels over host memory. A check of the paths and of this bench, not
    // a GPU measurement (named emulated_*).
    codec::Shape shape;
    std::string why;
    const auto chunks = HeldOutChunks(&shape, &why);
    if (chunks.empty()) {
      std::fprintf(stderr, "kdn bench gpu: %s\n", why.c_str());
      return 2;
    }
    const nlohmann::json params = {{"model", "stories260K"}, {"chunk_tokens", kChunkTokens}, {"dtype", "f16"},
                                   {"repeats", o.repeats}, {"text", "bench/texts/heldout.txt"},
                                   {"emulated", "host memory stands in for the GPU's; CPU paths of the kernels"}};
    if (int rc = DeliveryRecords(store::MakeEmulatedDevice(), chunks, shape, o.repeats, "emulated_", params, records); rc != 0) {
      return rc;
    }
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
  if (int rc = DeliveryRecords(*device, chunks, shape, o.repeats, "gpu_", params, records); rc != 0) return rc;
  return records.Finish(o.json_path, "kdn bench gpu");
#else
  return 0;
#endif
}

}  // namespace kdn::bench

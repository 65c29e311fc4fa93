#include "gpu_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_kv.h"
#include "bench_util.h"
#include "codec/codec.h"
#include "codec/device.h"
#include "model_loader.h"

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

}  // namespace

int RunGpuBench(const GpuBenchOptions& o) {
  Records records;
  const std::string why = WhyNoGpu();
  if (!why.empty()) {
    std::printf("kdn bench gpu: needs a CUDA GPU: %s; no records\n", why.c_str());
    return records.Finish(o.json_path, "kdn bench gpu");
  }
#ifdef KDN_HAVE_CUDA
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "kdn bench gpu: %s\n", m.c_str());
    return 2;
  };
  const RealKv real = Prefill(8);
  if (!real.model) return fail("the reference model is needed: " + real.why_not);
  if (real.window < static_cast<int>(kChunkTokens)) return fail("the prefilled windows are shorter than a chunk");
  const size_t row = size_t{real.heads} * real.head_dim;
  // 256-token chunks of f16 KV, as the store keeps them.
  std::vector<std::vector<std::uint8_t>> chunks;
  for (const auto& w : real.kv) {
    chunk::Payload p = Slice(w, real.layers, row, static_cast<size_t>(real.window), 0, kChunkTokens);
    const std::vector<float> f(reinterpret_cast<const float*>(p.data()),
                               reinterpret_cast<const float*>(p.data()) + p.size() / 4);
    const std::vector<std::uint16_t> h = ToHalf(f);
    chunks.emplace_back(reinterpret_cast<const std::uint8_t*>(h.data()),
                        reinterpret_cast<const std::uint8_t*>(h.data()) + h.size() * 2);
  }
  const codec::Shape shape{real.layers, real.heads, real.head_dim, kChunkTokens, 1};
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
  return records.Finish(o.json_path, "kdn bench gpu");
#else
  return 0;
#endif
}

}  // namespace kdn::bench

// SPDX-License-Identifier: Apache-2.0
// `kdn bench gpu`: the GPU path's delivery against the copies it competes
// with, in the same run (issue 17, part 2). Without a CUDA GPU (or in a build
// without the CUDA kernels) it says it needs one, writes an empty JSON array
// and exits 0.
// Thread-safety: RunGpuBench is a whole command; run one at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kdn::bench {

struct GpuBenchOptions {
  std::string json_path;
  int repeats = 20;  // timed decodes per codec (median)
  // The delivery measures on the emulated device (host memory, the kernels'
  // CPU paths), named emulated_*: runs anywhere; a check, not a GPU measure.
  bool emulated = false;
  // "ref": the reference model's real KV (256-token chunks of the held-out
  // text, a request each); "llama-8b": Llama-3.1-8B's shape (32 layers, 8 KV
  // heads, head_dim 128, f16), synthetic KV, one request of each of `tokens`.
  std::string shape = "ref";
  std::vector<std::uint32_t> tokens = {4096, 16384};  // multiples of 256
};

// With a GPU, on the reference model's real KV (256-token chunks of the
// held-out text, f16): gpu_h2d_gbps_raw, the PCIe copy of the raw f16
// bytes from pinned host memory (cudaMemcpyAsync, the baseline);
// gpu_d2d_gbps_raw, cudaMemcpy device to device; and per codec (kdn:balanced,
// cachegen, tc:balanced) gpu_decode_gbps_<codec>: a payload in pinned host
// memory decoded into device memory (upload, kernels, cuBLAS for tc), in GB/s
// of decoded KV, against the raw copy (goal: >= 1, decoding never slower
// than moving the raw bytes). Then delivery through the store into a device
// KV view (gpu_get_device_tier_gbps against a device-to-device copy of the
// same bytes; gpu_deliver_{host_raw,disk_zstd,disk_kdn,disk_tc}_gbps against
// the PCIe copy of the raw bytes: see DeliveryRecords in the .cc). Returns
// an exit code. With --shape llama-8b the delivery records are named
// <prefix>llama8b_<tokens>_*, from synthetic KV (labelled so), with host
// tiers in kdn:balanced and cachegen besides; every run adds the scatter
// kernel alone into canonical, paged NHD and paged HND views against the
// device-to-device copy (scatter_<layout>_gbps).
int RunGpuBench(const GpuBenchOptions& options);

}  // namespace kdn::bench

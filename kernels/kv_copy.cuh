// CUDA gather/scatter of KV between a strided device buffer and a canonical
// device chunk. The per-element math is common/kv_copy.h, the same the CPU
// path (ref/kv_copy_ref.h) uses.
#pragma once

#include <cuda_runtime.h>

#include "common/kv_copy.h"

namespace kdn::kernels {

struct KvCopyArgs {
  void* buffer = nullptr;       // device: the caller's strided KV
  KvStrides strides;
  KvShape shape;
  std::int64_t token_begin = 0;  // first buffer token of the chunk
  std::int64_t tokens = 0;       // tokens in the chunk
  void* chunk = nullptr;         // device: canonical chunk
};

// buffer -> chunk. Never synchronizes, allocates or prints.
cudaError_t launch_kv_gather(const KvCopyArgs& args, cudaStream_t stream);
// chunk -> buffer.
cudaError_t launch_kv_scatter(const KvCopyArgs& args, cudaStream_t stream);

}  // namespace kdn::kernels

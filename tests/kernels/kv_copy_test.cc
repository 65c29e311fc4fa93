// The CPU path of KV gather/scatter against the element-by-element
// definition, over layouts engines use; and the CUDA kernel against the CPU
// path where a GPU is present.
#include "ref/kv_copy_ref.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kv_copy.cuh"
#endif

namespace kdn::kernels {
namespace {

struct Layout {
  const char* name;
  KvStrides strides;
  std::int64_t elements;  // buffer size in elements
};

// Layouts of a buffer of T tokens for shape (L=3, H=2, D=4).
std::vector<Layout> Layouts(std::int64_t T) {
  const std::int64_t L = 3, H = 2, D = 4;
  return {
      {"canonical", canonical_strides({L, H, D, 4}, T), L * 2 * T * H * D},
      // llama.cpp-like: K and V apart, each [layer][token][head][dim].
      {"k_then_v", {T * H * D, L * T * H * D, H * D, D, 1}, 2 * L * T * H * D},
      // HND: heads before tokens.
      {"hnd", {2 * H * T * D, H * T * D, D, T * D, 1}, L * 2 * H * T * D},
      // Padded rows and a transposed head_dim (dim stride != 1).
      {"padded_dim_major", {2 * (H * D * T + 5), H * D * T + 5, 1, D * T, T}, L * 2 * (H * D * T + 5)},
  };
}

template <typename T>
void RoundTrip(std::int64_t elem_bytes) {
  const std::int64_t tokens = 11;
  const KvShape shape{3, 2, 4, elem_bytes};
  for (const Layout& layout : Layouts(tokens)) {
    std::vector<T> buffer(static_cast<size_t>(layout.elements));
    std::iota(buffer.begin(), buffer.end(), T(1));
    for (std::int64_t begin : {0, 3}) {
      const std::int64_t n = tokens - begin;
      std::vector<T> chunk(static_cast<size_t>(chunk_elements(shape, n)));
      kv_gather_cpu(buffer.data(), layout.strides, shape, begin, n, chunk.data());
      // Against the definition, element by element.
      for (std::int64_t e = 0; e < static_cast<std::int64_t>(chunk.size()); ++e) {
        KvIndex i = canonical_index(shape, n, e);
        i.token += begin;
        ASSERT_EQ(chunk[static_cast<size_t>(e)], buffer[static_cast<size_t>(element_offset(layout.strides, i))])
            << layout.name << " element " << e;
      }
      std::vector<T> back(buffer.size(), T(0));
      kv_scatter_cpu(chunk.data(), layout.strides, shape, begin, n, back.data());
      std::vector<T> again(chunk.size());
      kv_gather_cpu(back.data(), layout.strides, shape, begin, n, again.data());
      EXPECT_EQ(again, chunk) << layout.name;
    }
  }
}

TEST(KvCopy, GatherScatterMatchTheDefinitionF32) { RoundTrip<std::uint32_t>(4); }
TEST(KvCopy, GatherScatterMatchTheDefinitionF16) { RoundTrip<std::uint16_t>(2); }

#ifdef KDN_HAVE_CUDA
bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(KvCopyCuda, MatchesTheCpuPath) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernel is compiled, its math is checked on the CPU above";
  const std::int64_t tokens = 11;
  const KvShape shape{3, 2, 4, 4};
  for (const Layout& layout : Layouts(tokens)) {
    std::vector<std::uint32_t> host(static_cast<size_t>(layout.elements));
    std::iota(host.begin(), host.end(), 1u);
    const size_t chunk_n = static_cast<size_t>(chunk_elements(shape, tokens));
    std::vector<std::uint32_t> want(chunk_n), got(chunk_n);
    kv_gather_cpu(host.data(), layout.strides, shape, 0, tokens, want.data());
    void *dbuf = nullptr, *dchunk = nullptr;
    ASSERT_EQ(cudaMalloc(&dbuf, host.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dchunk, chunk_n * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dbuf, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    KvCopyArgs a;
    a.buffer = dbuf;
    a.strides = layout.strides;
    a.shape = shape;
    a.tokens = tokens;
    a.chunk = dchunk;
    ASSERT_EQ(launch_kv_gather(a, nullptr), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got.data(), dchunk, chunk_n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(got, want) << layout.name;
    ASSERT_EQ(cudaMemset(dbuf, 0, host.size() * 4), cudaSuccess);
    ASSERT_EQ(launch_kv_scatter(a, nullptr), cudaSuccess);
    std::vector<std::uint32_t> back(host.size()), want_back(host.size(), 0);
    kv_scatter_cpu(want.data(), layout.strides, shape, 0, tokens, want_back.data());
    ASSERT_EQ(cudaMemcpy(back.data(), dbuf, host.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, want_back) << layout.name;
    cudaFree(dbuf);
    cudaFree(dchunk);
  }
}
#endif

}  // namespace
}  // namespace kdn::kernels

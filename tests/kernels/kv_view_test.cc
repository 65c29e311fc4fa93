// SPDX-License-Identifier: Apache-2.0
// The CPU path of view gather/scatter against the element-by-element
// definition over engines' layouts (vLLM-like paged NHD, HND, FlashInfer's
// interleaved K/V blocks, llama.cpp's per-layer K and V, its transposed V,
// padded rows and heads); the offsets against the engines' own formulas; the
// validator and bounds helper; and the CUDA kernels against the CPU path
// where a GPU is present.
#include "kernels/ref/kv_view_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/kv_view.cuh"
#endif

namespace kdn::kernels {
namespace {

constexpr std::int64_t kLayers = 3, kHeads = 2, kDim = 8, kBlock = 16;

// A value no test writes on purpose: untouched memory keeps it.
template <typename T>
constexpr T Sentinel() {
  return sizeof(T) == 4 ? static_cast<T>(0xDEADBEEFu) : static_cast<T>(0xDEADu);
}

// An engine's KV storage and the view over it. Each layer's K and V start at
// an element offset of one of the allocations (K and V share one in
// FlashInfer's interleaved layout). Movable, not copyable: the view points
// into the vectors' heap storage.
template <typename T>
struct Engine {
  struct Where {
    std::size_t alloc = 0;
    std::int64_t offset = 0;
  };
  std::string name;
  std::vector<std::vector<T>> allocs;
  std::vector<Where> k_at, v_at;  // per layer
  std::vector<std::int32_t> table;
  std::vector<void*> k_ptrs, v_ptrs;
  KvView view;
  std::int64_t seq_tokens = 0;  // tokens the view holds

  Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  Engine(Engine&&) = default;
  Engine& operator=(Engine&&) = default;

  // Points the view at the allocations and the table.
  void Bind() {
    k_ptrs.clear();
    v_ptrs.clear();
    for (std::size_t l = 0; l < k_at.size(); ++l) {
      k_ptrs.push_back(allocs[k_at[l].alloc].data() + k_at[l].offset);
      v_ptrs.push_back(allocs[v_at[l].alloc].data() + v_at[l].offset);
    }
    view.k_base = k_ptrs.data();
    view.v_base = v_ptrs.data();
    if (view.paged) {
      view.block_table = table.data();
      view.table_len = static_cast<std::int64_t>(table.size());
    }
  }
  const Where& At(std::int64_t layer, std::int64_t kv) const {
    return (kv == 0 ? k_at : v_at)[static_cast<std::size_t>(layer)];
  }
  // Index within its allocation of an element, by the definition.
  std::size_t Index(const KvIndex& i, std::int64_t token_begin) const {
    return static_cast<std::size_t>(At(i.layer, i.kv).offset +
                                    view_offset(view, i.kv, token_begin + i.token, i.head, i.dim));
  }
  T& Elem(const KvIndex& i, std::int64_t token_begin) { return allocs[At(i.layer, i.kv).alloc][Index(i, token_begin)]; }
  void Fill(T first) {
    T x = first;
    for (auto& a : allocs) {
      for (T& e : a) e = x++;
    }
  }
  void FillWith(T value) {
    for (auto& a : allocs) a.assign(a.size(), value);
  }
};

// vLLM-like paged cache: per layer K and V [num_blocks][block_size][heads][dim]
// (NHD) or [num_blocks][heads][block_size][dim] (HND); interleaved: one
// allocation per layer [num_blocks][k|v][block] as FlashInfer. 11 physical
// blocks, 5 of them in a shuffled table holding 75 tokens (not a multiple of
// 16, the last block part full).
template <typename T>
Engine<T> Paged(const char* name, PageOrder order, bool interleaved) {
  Engine<T> e;
  e.name = name;
  const std::int64_t num_blocks = 11, block = kBlock * kHeads * kDim;
  e.table = {7, 2, 9, 0, 5};
  e.seq_tokens = 75;
  KvView& v = e.view;
  v.shape = {kLayers, kHeads, kDim, static_cast<std::int64_t>(sizeof(T))};
  v.paged = true;
  v.block_size = kBlock;
  v.order = order;
  v.num_blocks = num_blocks;
  if (interleaved) v.block_stride = 2 * block;
  for (std::int64_t l = 0; l < kLayers; ++l) {
    if (interleaved) {
      e.allocs.emplace_back(static_cast<std::size_t>(num_blocks * 2 * block));
      e.k_at.push_back({e.allocs.size() - 1, 0});
      e.v_at.push_back({e.allocs.size() - 1, block});
    } else {
      e.allocs.emplace_back(static_cast<std::size_t>(num_blocks * block));
      e.k_at.push_back({e.allocs.size() - 1, 0});
      e.allocs.emplace_back(static_cast<std::size_t>(num_blocks * block));
      e.v_at.push_back({e.allocs.size() - 1, 0});
    }
  }
  e.Bind();
  return e;
}

constexpr std::int64_t kCtx = 40;

// llama.cpp-like contiguous per-layer caches of kCtx cells: K (and V)
// [cell][head][dim + head_pad] with row_pad elements after each cell's row;
// V transposed as without flash attention: [head*dim][cell].
template <typename T>
Engine<T> Contiguous(const char* name, std::int64_t head_pad, std::int64_t row_pad, bool v_transposed) {
  Engine<T> e;
  e.name = name;
  e.seq_tokens = kCtx;
  KvView& v = e.view;
  v.shape = {kLayers, kHeads, kDim, static_cast<std::int64_t>(sizeof(T))};
  v.stride_dim = 1;
  v.stride_head = kDim + head_pad;
  v.stride_token = kHeads * v.stride_head + row_pad;
  v.layer_elements = kCtx * v.stride_token;
  if (v_transposed) {
    v.v_stride_token = 1;
    v.v_stride_dim = kCtx;
    v.v_stride_head = kDim * kCtx;
  }
  for (std::int64_t l = 0; l < kLayers; ++l) {
    e.allocs.emplace_back(static_cast<std::size_t>(v.layer_elements));
    e.k_at.push_back({e.allocs.size() - 1, 0});
    e.allocs.emplace_back(static_cast<std::size_t>(v.layer_elements));
    e.v_at.push_back({e.allocs.size() - 1, 0});
  }
  e.Bind();
  return e;
}

template <typename T>
std::vector<Engine<T>> Engines() {
  std::vector<Engine<T>> out;
  out.push_back(Paged<T>("vllm_nhd", PageOrder::kNHD, false));
  out.push_back(Paged<T>("hnd", PageOrder::kHND, false));
  out.push_back(Paged<T>("flashinfer_nhd_interleaved", PageOrder::kNHD, true));
  out.push_back(Paged<T>("flashinfer_hnd_interleaved", PageOrder::kHND, true));
  out.push_back(Contiguous<T>("llama_k_v", 0, 0, false));
  out.push_back(Contiguous<T>("llama_v_transposed", 0, 0, true));
  out.push_back(Contiguous<T>("padded_rows", 0, 3, false));
  out.push_back(Contiguous<T>("padded_heads", 2, 0, false));
  return out;
}

using Range = std::pair<std::int64_t, std::int64_t>;

// (token_begin, tokens): unaligned starts, counts not multiples of 16, the
// whole sequence, the last token.
std::vector<Range> TokenRanges(std::int64_t seq) { return {{5, seq - 18}, {19, seq - 19}, {0, seq}, {seq - 1, 1}}; }
// [layer_begin, layer_end): all, a middle one, a tail, none.
std::vector<Range> LayerRanges() { return {{0, kLayers}, {1, 2}, {1, kLayers}, {1, 1}}; }

std::string Where(const std::string& name, Range tr, Range lr) {
  return name + " tokens [" + std::to_string(tr.first) + ", +" + std::to_string(tr.second) + ") layers [" +
         std::to_string(lr.first) + ", " + std::to_string(lr.second) + ")";
}

// Index of the first difference, -1 when equal.
template <typename T>
std::int64_t FirstDiff(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return static_cast<std::int64_t>(std::min(a.size(), b.size()));
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  }
  return -1;
}

bool InLayers(const KvIndex& i, Range lr) { return i.layer >= lr.first && i.layer < lr.second; }

// The definition: chunk element e of a selected layer is the view element at
// view_offset(canonical_index(e)); the other layers' slices keep the sentinel.
template <typename T>
std::vector<T> ExpectedChunk(Engine<T>& e, Range tr, Range lr) {
  const KvShape& s = e.view.shape;
  std::vector<T> out(static_cast<std::size_t>(chunk_elements(s, tr.second)), Sentinel<T>());
  for (std::int64_t x = 0; x < static_cast<std::int64_t>(out.size()); ++x) {
    const KvIndex i = canonical_index(s, tr.second, x);
    if (InLayers(i, lr)) out[static_cast<std::size_t>(x)] = e.Elem(i, tr.first);
  }
  return out;
}

// A chunk of distinct values, none the sentinel; 4-byte ones are float NaN
// payloads, which a copy through float arithmetic would not keep.
template <typename T>
std::vector<T> PatternChunk(const KvShape& s, std::int64_t tokens) {
  std::vector<T> out(static_cast<std::size_t>(chunk_elements(s, tokens)));
  T x = sizeof(T) == 4 ? static_cast<T>(0x7F800001u) : static_cast<T>(0x7C01u);
  for (T& v : out) v = x++;
  return out;
}

TEST(KvView, OffsetsMatchTheEnginesFormulas) {
  for (Engine<std::uint16_t>& e : Engines<std::uint16_t>()) {
    const KvView& v = e.view;
    for (std::int64_t t = 0; t < e.seq_tokens; ++t) {
      for (std::int64_t h = 0; h < kHeads; ++h) {
        for (std::int64_t d = 0; d < kDim; ++d) {
          std::int64_t k = 0, val = 0;  // expected offsets of K and V from their allocation's start
          if (v.paged) {
            const std::int64_t b = e.table[static_cast<std::size_t>(t / kBlock)], s = t % kBlock;
            const bool nhd = v.order == PageOrder::kNHD;
            const std::int64_t in_block = nhd ? (s * kHeads + h) * kDim + d : (h * kBlock + s) * kDim + d;
            const std::int64_t block = kBlock * kHeads * kDim;
            if (v.block_stride != 0) {  // [block][k|v][...]
              k = (b * 2 + 0) * block + in_block;
              val = (b * 2 + 1) * block + in_block;
            } else {
              k = val = b * block + in_block;
            }
          } else if (e.name == "llama_v_transposed") {
            k = t * kHeads * kDim + h * kDim + d;
            val = (h * kDim + d) * kCtx + t;
          } else if (e.name == "padded_rows") {
            k = val = t * (kHeads * kDim + 3) + h * kDim + d;
          } else if (e.name == "padded_heads") {
            k = val = t * kHeads * (kDim + 2) + h * (kDim + 2) + d;
          } else {
            k = val = t * kHeads * kDim + h * kDim + d;
          }
          ASSERT_EQ(e.Index({0, 0, t, h, d}, 0), static_cast<std::size_t>(k)) << e.name << " K " << t << "," << h << "," << d;
          ASSERT_EQ(e.Index({0, 1, t, h, d}, 0), static_cast<std::size_t>(val)) << e.name << " V " << t << "," << h << "," << d;
        }
      }
    }
  }
}

template <typename T>
void GatherMatchesTheDefinition() {
  for (Engine<T>& e : Engines<T>()) {
    e.Fill(T(1));
    const char* why = "";
    ASSERT_TRUE(view_valid(e.view, e.seq_tokens, &why)) << e.name << ": " << why;
    for (Range tr : TokenRanges(e.seq_tokens)) {
      for (Range lr : LayerRanges()) {
        std::vector<T> chunk(static_cast<std::size_t>(chunk_elements(e.view.shape, tr.second)), Sentinel<T>());
        view_gather_cpu(e.view, tr.first, tr.second, lr.first, lr.second, chunk.data());
        EXPECT_EQ(FirstDiff(chunk, ExpectedChunk(e, tr, lr)), -1) << Where(e.name, tr, lr);
      }
    }
  }
}

TEST(KvView, GatherMatchesTheDefinitionF32) { GatherMatchesTheDefinition<std::uint32_t>(); }
TEST(KvView, GatherMatchesTheDefinitionF16) { GatherMatchesTheDefinition<std::uint16_t>(); }

// Scatter into sentinel-filled storage writes exactly the addressed elements
// with the chunk's values (everything else keeps the sentinel), and gathering
// them back returns the chunk's selected layers bit for bit.
template <typename T>
void ScatterWritesOnlyItsElementsAndRoundTrips() {
  for (Engine<T>& e : Engines<T>()) {
    for (Range tr : TokenRanges(e.seq_tokens)) {
      for (Range lr : LayerRanges()) {
        const KvShape& s = e.view.shape;
        const std::vector<T> chunk = PatternChunk<T>(s, tr.second);
        e.FillWith(Sentinel<T>());
        std::vector<std::vector<T>> want = e.allocs;
        for (std::int64_t x = 0; x < static_cast<std::int64_t>(chunk.size()); ++x) {
          const KvIndex i = canonical_index(s, tr.second, x);
          if (InLayers(i, lr)) want[e.At(i.layer, i.kv).alloc][e.Index(i, tr.first)] = chunk[static_cast<std::size_t>(x)];
        }
        view_scatter_cpu(chunk.data(), e.view, tr.first, tr.second, lr.first, lr.second);
        for (std::size_t a = 0; a < want.size(); ++a) {
          EXPECT_EQ(FirstDiff(e.allocs[a], want[a]), -1) << Where(e.name, tr, lr) << " allocation " << a;
        }
        std::vector<T> back(chunk.size(), Sentinel<T>());
        view_gather_cpu(e.view, tr.first, tr.second, lr.first, lr.second, back.data());
        std::vector<T> selected = chunk;
        for (std::int64_t x = 0; x < static_cast<std::int64_t>(chunk.size()); ++x) {
          if (!InLayers(canonical_index(s, tr.second, x), lr)) selected[static_cast<std::size_t>(x)] = Sentinel<T>();
        }
        EXPECT_EQ(FirstDiff(back, selected), -1) << Where(e.name, tr, lr) << " round trip";
        EXPECT_EQ(std::memcmp(back.data(), selected.data(), back.size() * sizeof(T)), 0) << Where(e.name, tr, lr);
      }
    }
  }
}

TEST(KvView, ScatterWritesOnlyItsElementsAndRoundTripsF32) { ScatterWritesOnlyItsElementsAndRoundTrips<std::uint32_t>(); }
TEST(KvView, ScatterWritesOnlyItsElementsAndRoundTripsF16) { ScatterWritesOnlyItsElementsAndRoundTrips<std::uint16_t>(); }

// Layer 1 alone: the chunk's layer 0 and 2 slices and the storage of layers 0
// and 2 stay as they were.
TEST(KvView, LayerRangesTouchOnlyTheirLayers) {
  for (Engine<std::uint32_t>& e : Engines<std::uint32_t>()) {
    const std::int64_t tokens = 21, per_layer = 2 * tokens * kHeads * kDim;
    e.Fill(1u);
    std::vector<std::uint32_t> chunk(static_cast<std::size_t>(chunk_elements(e.view.shape, tokens)), Sentinel<std::uint32_t>());
    view_gather_cpu(e.view, 3, tokens, 1, 2, chunk.data());
    for (std::int64_t x = 0; x < static_cast<std::int64_t>(chunk.size()); ++x) {
      const bool layer1 = x >= per_layer && x < 2 * per_layer;
      ASSERT_EQ(chunk[static_cast<std::size_t>(x)] == Sentinel<std::uint32_t>(), !layer1) << e.name << " chunk element " << x;
    }
    e.FillWith(Sentinel<std::uint32_t>());
    const std::vector<std::uint32_t> pattern = PatternChunk<std::uint32_t>(e.view.shape, tokens);
    view_scatter_cpu(pattern.data(), e.view, 3, tokens, 1, 2);
    std::int64_t written = 0;
    for (std::size_t a = 0; a < e.allocs.size(); ++a) {
      for (std::uint32_t x : e.allocs[a]) written += x != Sentinel<std::uint32_t>();
    }
    EXPECT_EQ(written, per_layer) << e.name;
    for (std::int64_t l : {0, 2}) {
      for (std::int64_t kv : {0, 1}) {
        if (e.view.block_stride != 0) continue;  // K and V share an allocation: the count above covers it
        const auto& a = e.allocs[e.At(l, kv).alloc];
        for (std::uint32_t x : a) ASSERT_EQ(x, Sentinel<std::uint32_t>()) << e.name << " layer " << l;
      }
    }
  }
}

// view_valid rejects, with a reason, and names the given problem.
void ExpectInvalid(const KvView& v, std::int64_t tokens, const std::string& expected_reason) {
  const char* why = nullptr;
  EXPECT_FALSE(view_valid(v, tokens, &why)) << expected_reason;
  ASSERT_NE(why, nullptr) << expected_reason;
  EXPECT_NE(std::string(why).find(expected_reason), std::string::npos) << "got: " << why;
}

TEST(KvView, ValidatorAndBoundsRejectBadPagedViews) {
  Engine<std::uint16_t> e = Paged<std::uint16_t>("vllm_nhd", PageOrder::kNHD, false);
  const char* why = nullptr;
  ASSERT_TRUE(view_valid(e.view, 75, &why)) << why;
  EXPECT_TRUE(view_valid(e.view, 80, nullptr));  // the last block full
  EXPECT_TRUE(view_valid(e.view, 0, nullptr));
  EXPECT_TRUE(view_in_bounds(e.view, 70, 10, nullptr));

  // The table holds 5 blocks: 80 tokens.
  ExpectInvalid(e.view, 81, "table");
  EXPECT_FALSE(view_in_bounds(e.view, 70, 11, &why));
  {
    KvView v = e.view;
    v.table_len = 4;  // 64 tokens
    ExpectInvalid(v, 75, "table");
    EXPECT_TRUE(view_valid(v, 64, nullptr));
    v.block_table = nullptr;
    ExpectInvalid(v, 1, "table");
  }
  // Negative block id in logical block 2 (tokens 32..47).
  e.table[2] = -1;
  ExpectInvalid(e.view, 75, "negative block id");
  EXPECT_TRUE(view_in_bounds(e.view, 0, 32, nullptr));
  EXPECT_TRUE(view_in_bounds(e.view, 48, 27, nullptr));
  EXPECT_FALSE(view_in_bounds(e.view, 30, 5, &why));
  // Block id past the allocation's 11 blocks; unchecked when num_blocks is unknown.
  e.table[2] = 11;
  ExpectInvalid(e.view, 75, "num_blocks");
  EXPECT_FALSE(view_in_bounds(e.view, 40, 1, nullptr));
  {
    KvView v = e.view;
    v.num_blocks = 0;
    EXPECT_TRUE(view_valid(v, 75, nullptr));
  }
  e.table[2] = 10;
  EXPECT_TRUE(view_valid(e.view, 75, nullptr));
  // Null base arrays and bases.
  {
    KvView v = e.view;
    v.k_base = nullptr;
    ExpectInvalid(v, 75, "null");
    v = e.view;
    v.v_base = nullptr;
    ExpectInvalid(v, 75, "null");
    void* const saved = e.v_ptrs[1];
    e.v_ptrs[1] = nullptr;
    ExpectInvalid(e.view, 75, "null");
    e.v_ptrs[1] = saved;
  }
  // block_size 0 (and negative), element sizes, block stride, shape, order.
  {
    KvView v = e.view;
    v.block_size = 0;
    ExpectInvalid(v, 75, "block_size");
    EXPECT_FALSE(view_in_bounds(v, 0, 1, nullptr));
    v.block_size = -16;
    ExpectInvalid(v, 75, "block_size");
    v = e.view;
    v.shape.elem_bytes = 3;
    ExpectInvalid(v, 75, "elem_bytes");
    v.shape.elem_bytes = 0;
    ExpectInvalid(v, 75, "elem_bytes");
    v = e.view;
    v.block_stride = kBlock * kHeads * kDim - 1;
    ExpectInvalid(v, 75, "block_stride");
    v = e.view;
    v.shape.heads = 0;
    ExpectInvalid(v, 75, "positive");
    v = e.view;
    v.order = static_cast<PageOrder>(7);
    ExpectInvalid(v, 75, "order");
    ExpectInvalid(e.view, -1, "negative");
  }
  EXPECT_TRUE(view_valid(e.view, 75, nullptr));
}

TEST(KvView, ValidatorAndBoundsRejectBadContiguousViews) {
  Engine<std::uint32_t> e = Contiguous<std::uint32_t>("llama_v_transposed", 0, 0, true);
  const char* why = nullptr;
  ASSERT_TRUE(view_valid(e.view, kCtx, &why)) << why;
  EXPECT_TRUE(view_in_bounds(e.view, 10, kCtx - 10, nullptr));
  // Past the kCtx cells of the allocation: the transposed V's tokens run into
  // its next dim, and both run off the allocation.
  ExpectInvalid(e.view, kCtx + 1, "overlap");
  EXPECT_FALSE(view_in_bounds(e.view, kCtx - 1, 2, &why));
  EXPECT_NE(std::string(why).find("outside"), std::string::npos) << why;
  {
    Engine<std::uint32_t> k_v = Contiguous<std::uint32_t>("llama_k_v", 0, 0, false);
    ExpectInvalid(k_v.view, kCtx + 1, "outside");
  }
  {
    KvView v = e.view;
    v.layer_elements = kCtx * kHeads * kDim - 1;  // one element short
    ExpectInvalid(v, kCtx, "outside");
    EXPECT_TRUE(view_valid(v, kCtx - 1, nullptr));
    v.layer_elements = 0;  // unknown: unchecked
    EXPECT_TRUE(view_valid(v, kCtx, nullptr));
    EXPECT_TRUE(view_in_bounds(v, 0, kCtx + 100, nullptr));
    v.layer_elements = -1;
    ExpectInvalid(v, kCtx, "layer_elements");
  }
  // Overlapping and negative strides.
  {
    KvView v = e.view;
    v.stride_head = 1;  // K's heads overlap its dims
    ExpectInvalid(v, kCtx, "overlap");
    v = e.view;
    v.v_stride_dim = kCtx - 1;  // V's dims overlap its tokens
    ExpectInvalid(v, kCtx, "overlap");
    EXPECT_TRUE(view_valid(v, kCtx - 1, nullptr));
    v = e.view;
    v.stride_token = -kHeads * kDim;
    ExpectInvalid(v, kCtx, "negative stride");
  }
  {
    KvView v = e.view;
    v.k_base = nullptr;
    ExpectInvalid(v, kCtx, "null");
    e.k_ptrs[0] = nullptr;
    ExpectInvalid(e.view, kCtx, "null");
  }
}

// Two more views for the row kernels: K and V starting one element past an
// aligned address (vectors narrow to what every row start meets), and heads
// padded by one element (rows of 8 elements at a stride of 9).
template <typename T>
std::vector<Engine<T>> RowEngines() {
  std::vector<Engine<T>> out = Engines<T>();
  Engine<T> shifted = Contiguous<T>("llama_k_v_shifted_one_element", 0, 0, false);
  for (auto& w : shifted.k_at) w.offset += 1;
  for (auto& w : shifted.v_at) w.offset += 1;
  for (auto& a : shifted.allocs) a.resize(a.size() + 1);
  shifted.Bind();
  out.push_back(std::move(shifted));
  out.push_back(Contiguous<T>("padded_heads_by_one", 1, 0, false));
  return out;
}

// The kernels' work items run on the CPU (what the emulated device does)
// move exactly what the CPU path moves, both ways, over every layout.
template <typename T>
void EmulatedKernelMatchesTheCpuPath() {
  for (Engine<T>& e : RowEngines<T>()) {
    for (Range tr : TokenRanges(e.seq_tokens)) {
      for (Range lr : LayerRanges()) {
        const std::string where = Where(e.name, tr, lr);
        const KvShape& s = e.view.shape;
        const std::size_t n = static_cast<std::size_t>(chunk_elements(s, tr.second));
        KvViewArgs a;
        a.view = e.view;
        a.token_begin = tr.first;
        a.tokens = tr.second;
        a.layer_begin = lr.first;
        a.layer_end = lr.second;
        a.base_alignment = view_base_alignment(e.view);

        e.Fill(T(1));
        std::vector<T> want(n, Sentinel<T>()), got(n, Sentinel<T>());
        view_gather_cpu(e.view, tr.first, tr.second, lr.first, lr.second, want.data());
        a.chunk = got.data();
        view_copy_emulated(a, true);
        EXPECT_EQ(FirstDiff(got, want), -1) << where << " gather";

        std::vector<T> chunk = PatternChunk<T>(s, tr.second);
        e.FillWith(Sentinel<T>());
        view_scatter_cpu(chunk.data(), e.view, tr.first, tr.second, lr.first, lr.second);
        const std::vector<std::vector<T>> expected = e.allocs;
        e.FillWith(Sentinel<T>());
        a.chunk = chunk.data();
        view_copy_emulated(a, false);
        for (std::size_t i = 0; i < expected.size(); ++i) {
          EXPECT_EQ(FirstDiff(e.allocs[i], expected[i]), -1) << where << " scatter, allocation " << i;
        }
      }
    }
  }
}

TEST(KvViewRows, EmulatedKernelMatchesTheCpuPathF32) { EmulatedKernelMatchesTheCpuPath<std::uint32_t>(); }
TEST(KvViewRows, EmulatedKernelMatchesTheCpuPathF16) { EmulatedKernelMatchesTheCpuPath<std::uint16_t>(); }

// The vector width: the widest that every row start meets on both sides.
TEST(KvViewRows, ThePlanPicksTheWidestVectorEveryRowMeets) {
  auto plan = [](Engine<std::uint16_t>& e, std::int64_t tokens, void* chunk) {
    KvViewArgs a;
    a.view = e.view;
    a.chunk = chunk;
    a.tokens = tokens;
    a.layer_begin = 0;
    a.layer_end = kLayers;
    a.base_alignment = view_base_alignment(e.view);
    return plan_rows(a);
  };
  alignas(16) static unsigned char chunk[16];
  // f16 rows of 8 elements: one 16-byte vector per row where everything is aligned.
  Engine<std::uint16_t> nhd = Paged<std::uint16_t>("vllm_nhd", PageOrder::kNHD, false);
  KvRowPlan p = plan(nhd, 20, chunk);
  EXPECT_TRUE(p.contiguous_rows);
  EXPECT_EQ(p.vec_bytes, 16);
  EXPECT_EQ(p.vecs_per_row, 1);
  EXPECT_EQ(p.rows, kLayers * 2 * 20 * kHeads);
  // A chunk 8 bytes off a 16-byte boundary: 8-byte vectors.
  p = plan(nhd, 20, chunk + 8);
  EXPECT_EQ(p.vec_bytes, 8);
  EXPECT_EQ(p.vecs_per_row, 2);
  // Heads padded by one element: row starts 18 bytes apart, 2-byte vectors.
  Engine<std::uint16_t> padded = Contiguous<std::uint16_t>("padded_heads_by_one", 1, 0, false);
  p = plan(padded, 20, chunk);
  EXPECT_EQ(p.vec_bytes, 2);
  EXPECT_EQ(p.vecs_per_row, kDim);
  // llama.cpp's transposed V: dims are not contiguous, one element per item.
  Engine<std::uint16_t> transposed = Contiguous<std::uint16_t>("llama_v_transposed", 0, 0, true);
  p = plan(transposed, 20, chunk);
  EXPECT_FALSE(p.contiguous_rows);
  EXPECT_EQ(p.vec_bytes, 2);
  EXPECT_EQ(p.vecs_per_row, kDim);
  // A base one element off: 2-byte vectors.
  std::vector<Engine<std::uint16_t>> rows = RowEngines<std::uint16_t>();
  Engine<std::uint16_t>& shifted = rows[rows.size() - 2];
  ASSERT_EQ(shifted.name, "llama_k_v_shifted_one_element");
  EXPECT_EQ(view_base_alignment(shifted.view), 2);
  EXPECT_EQ(plan(shifted, 20, chunk).vec_bytes, 2);
}

#ifdef KDN_HAVE_CUDA
bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The launchers check their scalar arguments before touching the device, so
// this runs without a GPU.
TEST(KvViewCuda, LaunchersRejectBadArgumentsBeforeLaunching) {
  Engine<std::uint32_t> e = Paged<std::uint32_t>("vllm_nhd", PageOrder::kNHD, false);
  KvViewArgs a;
  a.view = e.view;
  a.chunk = nullptr;
  a.tokens = 10;
  a.layer_begin = 0;
  a.layer_end = kLayers;
  EXPECT_EQ(launch_view_gather(a, nullptr), cudaErrorInvalidValue);  // null chunk
  std::vector<std::uint32_t> chunk(static_cast<std::size_t>(chunk_elements(e.view.shape, 10)));
  a.chunk = chunk.data();  // never dereferenced: every call below fails or does nothing first
  KvViewArgs b = a;
  b.view.shape.elem_bytes = 8;
  EXPECT_EQ(launch_view_gather(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.layer_end = kLayers + 1;
  EXPECT_EQ(launch_view_scatter(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.layer_begin = 2;
  b.layer_end = 1;
  EXPECT_EQ(launch_view_gather(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.token_begin = -1;
  EXPECT_EQ(launch_view_gather(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.view.block_size = 0;
  EXPECT_EQ(launch_view_scatter(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.view.block_table = nullptr;
  EXPECT_EQ(launch_view_gather(b, nullptr), cudaErrorInvalidValue);
  b = a;
  b.tokens = 0;  // nothing to copy
  EXPECT_EQ(launch_view_gather(b, nullptr), cudaSuccess);
  b = a;
  b.layer_end = 0;
  EXPECT_EQ(launch_view_scatter(b, nullptr), cudaSuccess);
}

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// An engine's allocations, layer base arrays and block table on the device.
template <typename T>
struct DeviceEngine {
  std::vector<void*> allocs;
  void** k = nullptr;
  void** v = nullptr;
  std::int32_t* table = nullptr;
  KvView view;  // the engine's view with device arrays
  std::int64_t base_alignment = 0;  // of the device base addresses

  DeviceEngine() = default;
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;
  ~DeviceEngine() {
    for (void* p : allocs) cudaFree(p);
    cudaFree(k);
    cudaFree(v);
    cudaFree(table);
  }
};

template <typename T>
void Upload(const Engine<T>& e, DeviceEngine<T>* d) {
  for (const auto& a : e.allocs) {
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, a.size() * sizeof(T)));
    d->allocs.push_back(p);
    CUDA_OK(cudaMemcpy(p, a.data(), a.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<void*> k, v;
  for (std::int64_t l = 0; l < kLayers; ++l) {
    k.push_back(static_cast<T*>(d->allocs[e.At(l, 0).alloc]) + e.At(l, 0).offset);
    v.push_back(static_cast<T*>(d->allocs[e.At(l, 1).alloc]) + e.At(l, 1).offset);
  }
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d->k), k.size() * sizeof(void*)));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d->v), v.size() * sizeof(void*)));
  CUDA_OK(cudaMemcpy(d->k, k.data(), k.size() * sizeof(void*), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d->v, v.data(), v.size() * sizeof(void*), cudaMemcpyHostToDevice));
  KvView host = e.view;  // the device addresses in host arrays, for their alignment
  host.k_base = k.data();
  host.v_base = v.data();
  d->base_alignment = view_base_alignment(host);
  d->view = e.view;
  d->view.k_base = d->k;
  d->view.v_base = d->v;
  if (e.view.paged) {
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d->table), e.table.size() * sizeof(std::int32_t)));
    CUDA_OK(cudaMemcpy(d->table, e.table.data(), e.table.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
    d->view.block_table = d->table;
  }
}

// Copies the engine's host allocations onto the device ones.
template <typename T>
void Refresh(const Engine<T>& e, const DeviceEngine<T>& d) {
  for (std::size_t a = 0; a < e.allocs.size(); ++a) {
    CUDA_OK(cudaMemcpy(d.allocs[a], e.allocs[a].data(), e.allocs[a].size() * sizeof(T), cudaMemcpyHostToDevice));
  }
}

// GPU output against the CPU path: bit-exact (both only move bytes).
template <typename T>
void CudaMatchesTheCpuPath() {
  for (Engine<T>& e : Engines<T>()) {
    for (Range tr : TokenRanges(e.seq_tokens)) {
      for (Range lr : LayerRanges()) {
        const std::string where = Where(e.name, tr, lr);
        const KvShape& s = e.view.shape;
        const std::size_t n = static_cast<std::size_t>(chunk_elements(s, tr.second));
        e.Fill(T(1));
        DeviceEngine<T> d;
        ASSERT_NO_FATAL_FAILURE(Upload(e, &d));
        void* dchunk = nullptr;
        CUDA_OK(cudaMalloc(&dchunk, n * sizeof(T)));
        KvViewArgs a;
        a.view = d.view;
        a.chunk = dchunk;
        a.token_begin = tr.first;
        a.tokens = tr.second;
        a.layer_begin = lr.first;
        a.layer_end = lr.second;
        a.base_alignment = d.base_alignment;

        // Gather.
        std::vector<T> want(n, Sentinel<T>()), got(n);
        CUDA_OK(cudaMemcpy(dchunk, want.data(), n * sizeof(T), cudaMemcpyHostToDevice));
        view_gather_cpu(e.view, tr.first, tr.second, lr.first, lr.second, want.data());
        CUDA_OK(launch_view_gather(a, nullptr));
        CUDA_OK(cudaMemcpy(got.data(), dchunk, n * sizeof(T), cudaMemcpyDeviceToHost));
        EXPECT_EQ(FirstDiff(got, want), -1) << where << " gather";

        // Scatter into sentinel-filled storage.
        const std::vector<T> chunk = PatternChunk<T>(s, tr.second);
        CUDA_OK(cudaMemcpy(dchunk, chunk.data(), n * sizeof(T), cudaMemcpyHostToDevice));
        e.FillWith(Sentinel<T>());
        ASSERT_NO_FATAL_FAILURE(Refresh(e, d));
        CUDA_OK(launch_view_scatter(a, nullptr));
        view_scatter_cpu(chunk.data(), e.view, tr.first, tr.second, lr.first, lr.second);
        for (std::size_t i = 0; i < e.allocs.size(); ++i) {
          std::vector<T> dev(e.allocs[i].size());
          CUDA_OK(cudaMemcpy(dev.data(), d.allocs[i], dev.size() * sizeof(T), cudaMemcpyDeviceToHost));
          EXPECT_EQ(FirstDiff(dev, e.allocs[i]), -1) << where << " scatter, allocation " << i;
        }
        CUDA_OK(cudaFree(dchunk));
      }
    }
  }
}

TEST(KvViewCuda, MatchesTheCpuPathF32) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their math is checked on the CPU above";
  CudaMatchesTheCpuPath<std::uint32_t>();
}

TEST(KvViewCuda, MatchesTheCpuPathF16) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device: the kernels are compiled, their math is checked on the CPU above";
  CudaMatchesTheCpuPath<std::uint16_t>();
}
#endif

}  // namespace
}  // namespace kdn::kernels

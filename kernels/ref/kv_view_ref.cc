// SPDX-License-Identifier: Apache-2.0
#include "kernels/ref/kv_view_ref.h"

#include <algorithm>
#include <cstring>

namespace kdn::kernels {
namespace {

// Moves tokens [token_begin, token_begin + tokens) of layers
// [layer_begin, layer_end) between the view and a chunk; `to_chunk` picks the
// direction. The view is walked in runs of tokens it lays out uniformly (the
// whole range when contiguous, the part of one physical block when paged);
// within a run the largest contiguous pieces go through memcpy (the whole run,
// a token's heads, a head's dims), anything else element by element. Every
// piece's address comes from the shared view_offset / element_offset.
// Joins pieces that continue each other on both sides into one memcpy: a
// buffer laid out like the chunk then moves in a single call, which lets the
// C library use its large-copy path (non-temporal stores).
class Coalescer {
 public:
  explicit Coalescer(bool to_chunk) : to_chunk_(to_chunk) {}
  ~Coalescer() { Flush(); }
  void Add(unsigned char* view, unsigned char* chunk, std::size_t bytes) {
    if (bytes_ != 0 && view == view_ + bytes_ && chunk == chunk_ + bytes_) {
      bytes_ += bytes;
      return;
    }
    Flush();
    view_ = view;
    chunk_ = chunk;
    bytes_ = bytes;
  }
  void Flush() {
    if (bytes_ == 0) return;
    if (to_chunk_) {
      std::memcpy(chunk_, view_, bytes_);
    } else {
      std::memcpy(view_, chunk_, bytes_);
    }
    bytes_ = 0;
  }

 private:
  const bool to_chunk_;
  unsigned char* view_ = nullptr;
  unsigned char* chunk_ = nullptr;
  std::size_t bytes_ = 0;
};

void Copy(const KvView& v, std::int64_t token_begin, std::int64_t tokens, std::int64_t layer_begin,
          std::int64_t layer_end, unsigned char* chunk, bool to_chunk) {
  if (tokens <= 0 || layer_begin >= layer_end) return;
  Coalescer out(to_chunk);
  const KvShape& s = v.shape;
  const std::int64_t eb = s.elem_bytes, heads = s.heads, dims = s.head_dim;
  const KvStrides cs = canonical_strides(s, tokens);
  for (std::int64_t l = layer_begin; l < layer_end; ++l) {
    for (std::int64_t kv = 0; kv < 2; ++kv) {
      auto* base = static_cast<unsigned char*>((kv == 0 ? v.k_base : v.v_base)[l]);
      // t: chunk token (view token token_begin + t).
      auto move = [&](std::int64_t t, std::int64_t h, std::int64_t d, std::int64_t elems) {
        unsigned char* b = base + view_offset(v, kv, token_begin + t, h, d) * eb;
        unsigned char* c = chunk + element_offset(cs, {l, kv, t, h, d}) * eb;
        out.Add(b, c, static_cast<std::size_t>(elems * eb));
      };
      const KvRunStrides rs = view_run_strides(v, kv);
      const bool dim_run = rs.dim == 1 || dims == 1;
      const bool head_run = dim_run && (rs.head == dims || heads == 1);
      for (std::int64_t t = 0; t < tokens;) {
        std::int64_t run = tokens - t;
        if (v.paged) run = std::min(run, v.block_size - (token_begin + t) % v.block_size);
        if (head_run && (rs.token == heads * dims || run == 1)) {
          move(t, 0, 0, run * heads * dims);
        } else {
          for (std::int64_t u = t; u < t + run; ++u) {
            if (head_run) {
              move(u, 0, 0, heads * dims);
              continue;
            }
            for (std::int64_t h = 0; h < heads; ++h) {
              if (dim_run) {
                move(u, h, 0, dims);
                continue;
              }
              for (std::int64_t d = 0; d < dims; ++d) move(u, h, d, 1);
            }
          }
        }
        t += run;
      }
    }
  }
}

bool Fail(const char** why, const char* what) {
  if (why != nullptr) *why = what;
  return false;
}

// a * b + c, false on overflow.
bool MulAdd(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t* out) {
  std::int64_t p = 0;
  return !__builtin_mul_overflow(a, b, &p) && !__builtin_add_overflow(p, c, out);
}

// Whether (token, head, dim) -> offset is one-to-one over
// [0, tokens) x [0, heads) x [0, dims) for non-negative strides: sorted by
// stride, each axis must step past everything the smaller ones reach (a
// sufficient condition, met by every real layout).
bool Disjoint(const KvRunStrides& s, std::int64_t tokens, std::int64_t heads, std::int64_t dims) {
  struct Axis {
    std::int64_t stride, extent;
  };
  Axis axes[3] = {{s.token, tokens}, {s.head, heads}, {s.dim, dims}};
  std::sort(axes, axes + 3, [](const Axis& a, const Axis& b) { return a.stride < b.stride; });
  std::int64_t reach = 0;  // largest offset the smaller axes reach
  for (const Axis& a : axes) {
    if (a.extent <= 1) continue;
    if (a.stride <= reach) return false;
    if (!MulAdd(a.stride, a.extent - 1, reach, &reach)) return false;
  }
  return true;
}

bool PagedInBounds(const KvView& v, std::int64_t token_begin, std::int64_t tokens, const char** why) {
  if (v.block_size <= 0) return Fail(why, "block_size must be positive");
  std::int64_t last_token = 0;
  if (__builtin_add_overflow(token_begin, tokens - 1, &last_token)) return Fail(why, "token range overflows");
  const std::int64_t first = token_begin / v.block_size, last = last_token / v.block_size;
  if (v.block_table == nullptr || last >= v.table_len) return Fail(why, "block table too short for the tokens");
  for (std::int64_t i = first; i <= last; ++i) {
    const std::int64_t id = v.block_table[i];
    if (id < 0) return Fail(why, "negative block id");
    if (v.num_blocks > 0 && id >= v.num_blocks) return Fail(why, "block id >= num_blocks");
  }
  return true;
}

bool ContiguousInBounds(const KvView& v, std::int64_t token_begin, std::int64_t tokens, const char** why) {
  if (v.layer_elements <= 0) return true;
  for (std::int64_t kv = 0; kv < 2; ++kv) {
    const KvRunStrides s = view_run_strides(v, kv);
    const std::int64_t lo[3] = {token_begin, 0, 0};
    const std::int64_t hi[3] = {token_begin + tokens - 1, v.shape.heads - 1, v.shape.head_dim - 1};
    const std::int64_t stride[3] = {s.token, s.head, s.dim};
    std::int64_t min = 0, max = 0;
    for (int a = 0; a < 3; ++a) {
      std::int64_t x = 0, y = 0;
      if (__builtin_mul_overflow(stride[a], lo[a], &x) || __builtin_mul_overflow(stride[a], hi[a], &y) ||
          __builtin_add_overflow(min, std::min(x, y), &min) || __builtin_add_overflow(max, std::max(x, y), &max)) {
        return Fail(why, "offsets overflow");
      }
    }
    if (min < 0 || max >= v.layer_elements) return Fail(why, "offsets outside the layer allocation");
  }
  return true;
}

}  // namespace

void view_gather_cpu(const KvView& v, std::int64_t token_begin, std::int64_t tokens, std::int64_t layer_begin,
                     std::int64_t layer_end, void* chunk) {
  Copy(v, token_begin, tokens, layer_begin, layer_end, static_cast<unsigned char*>(chunk), true);
}

void view_scatter_cpu(const void* chunk, const KvView& v, std::int64_t token_begin, std::int64_t tokens,
                      std::int64_t layer_begin, std::int64_t layer_end) {
  Copy(v, token_begin, tokens, layer_begin, layer_end,
       const_cast<unsigned char*>(static_cast<const unsigned char*>(chunk)), false);
}

std::int64_t view_base_alignment(const KvView& v) {
  std::int64_t w = 16;
  for (std::int64_t l = 0; l < v.shape.layers; ++l) {
    w = gcd_pow2(w, static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(v.k_base[l]) % 16));
    w = gcd_pow2(w, static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(v.v_base[l]) % 16));
  }
  return w;
}

void view_copy_emulated(const KvViewArgs& a, bool to_chunk) {
  if (a.tokens <= 0 || a.layer_begin >= a.layer_end) return;
  const KvRowPlan p = plan_rows(a);
  const std::int64_t n = p.items();
  if (rows_fit_32_bits(p)) {
    for (std::int64_t i = 0; i < n; ++i) move_row_vector<std::uint32_t>(a, p, static_cast<std::uint32_t>(i), to_chunk);
  } else {
    for (std::int64_t i = 0; i < n; ++i) move_row_vector<std::uint64_t>(a, p, static_cast<std::uint64_t>(i), to_chunk);
  }
}

bool view_in_bounds(const KvView& v, std::int64_t token_begin, std::int64_t tokens, const char** why) {
  if (token_begin < 0 || tokens < 0) return Fail(why, "negative token range");
  if (tokens == 0) return true;
  return v.paged ? PagedInBounds(v, token_begin, tokens, why) : ContiguousInBounds(v, token_begin, tokens, why);
}

bool view_valid(const KvView& v, std::int64_t tokens_needed, const char** why) {
  const KvShape& s = v.shape;
  if (s.layers <= 0 || s.heads <= 0 || s.head_dim <= 0) return Fail(why, "layers, heads and head_dim must be positive");
  std::int64_t row = 0;
  if (!MulAdd(s.heads, s.head_dim, 0, &row)) return Fail(why, "heads * head_dim overflows");
  if (s.elem_bytes != 2 && s.elem_bytes != 4) return Fail(why, "elem_bytes must be 2 or 4");
  if (tokens_needed < 0) return Fail(why, "negative token count");
  if (v.k_base == nullptr || v.v_base == nullptr) return Fail(why, "null K or V base array");
  for (std::int64_t l = 0; l < s.layers; ++l) {
    if (v.k_base[l] == nullptr || v.v_base[l] == nullptr) return Fail(why, "null K or V base of a layer");
  }
  if (v.paged) {
    if (v.block_size <= 0) return Fail(why, "block_size must be positive");
    if (v.order != PageOrder::kNHD && v.order != PageOrder::kHND) return Fail(why, "unknown page order");
    if (v.paged_token_stride != 0 && (v.order != PageOrder::kNHD || v.paged_token_stride < row)) {
      return Fail(why, "a token row stride needs NHD pages and must hold a token's heads");
    }
    std::int64_t block_elems = 0;
    if (!MulAdd(v.block_size, v.paged_token_stride != 0 ? v.paged_token_stride : row, 0, &block_elems)) {
      return Fail(why, "block size overflows");
    }
    if (v.block_stride != 0 && v.block_stride < block_elems) return Fail(why, "block_stride smaller than a block");
    if (v.num_blocks < 0) return Fail(why, "negative num_blocks");
  } else {
    const KvRunStrides ks = view_run_strides(v, 0), vs = view_run_strides(v, 1);
    for (const KvRunStrides& st : {ks, vs}) {
      if (st.token < 0 || st.head < 0 || st.dim < 0) return Fail(why, "negative stride");
      if (!Disjoint(st, tokens_needed, s.heads, s.head_dim)) return Fail(why, "strides make elements overlap");
    }
    if (v.layer_elements < 0) return Fail(why, "negative layer_elements");
  }
  return view_in_bounds(v, 0, tokens_needed, why);
}

}  // namespace kdn::kernels

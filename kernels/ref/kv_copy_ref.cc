#include "ref/kv_copy_ref.h"

#include <cstring>

namespace kdn::kernels {
namespace {

// Moves between the buffer and a chunk; `to_chunk` picks the direction. Runs
// of contiguous elements go through memcpy; anything else element by element
// with the shared offset math.
void Copy(unsigned char* buffer, const KvStrides& st, const KvShape& s, std::int64_t token_begin,
          std::int64_t tokens, unsigned char* chunk, bool to_chunk) {
  const std::int64_t eb = s.elem_bytes;
  const KvStrides cs = canonical_strides(s, tokens);
  auto move = [&](const KvIndex& i, std::int64_t elems) {
    KvIndex bi = i;
    bi.token += token_begin;
    unsigned char* b = buffer + element_offset(st, bi) * eb;
    unsigned char* c = chunk + element_offset(cs, i) * eb;
    if (to_chunk) {
      std::memcpy(c, b, static_cast<size_t>(elems * eb));
    } else {
      std::memcpy(b, c, static_cast<size_t>(elems * eb));
    }
  };
  const bool dims = st.dim == 1;
  const bool heads = dims && st.head == s.head_dim;
  const bool toks = heads && st.token == s.heads * s.head_dim;
  for (std::int64_t l = 0; l < s.layers; ++l) {
    for (std::int64_t kv = 0; kv < 2; ++kv) {
      if (toks) {
        move({l, kv, 0, 0, 0}, tokens * s.heads * s.head_dim);
        continue;
      }
      for (std::int64_t t = 0; t < tokens; ++t) {
        if (heads) {
          move({l, kv, t, 0, 0}, s.heads * s.head_dim);
          continue;
        }
        for (std::int64_t h = 0; h < s.heads; ++h) {
          if (dims) {
            move({l, kv, t, h, 0}, s.head_dim);
            continue;
          }
          for (std::int64_t d = 0; d < s.head_dim; ++d) move({l, kv, t, h, d}, 1);
        }
      }
    }
  }
}

}  // namespace

void kv_gather_cpu(const void* buffer, const KvStrides& st, const KvShape& s, std::int64_t token_begin,
                   std::int64_t tokens, void* chunk) {
  Copy(const_cast<unsigned char*>(static_cast<const unsigned char*>(buffer)), st, s, token_begin, tokens,
       static_cast<unsigned char*>(chunk), true);
}

void kv_scatter_cpu(const void* chunk, const KvStrides& st, const KvShape& s, std::int64_t token_begin,
                    std::int64_t tokens, void* buffer) {
  Copy(static_cast<unsigned char*>(buffer), st, s, token_begin, tokens,
       const_cast<unsigned char*>(static_cast<const unsigned char*>(chunk)), false);
}

}  // namespace kdn::kernels

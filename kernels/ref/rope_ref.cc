// SPDX-License-Identifier: Apache-2.0
#include "kernels/ref/rope_ref.h"

#include <cstddef>
#include <vector>

namespace kdn::kernels {
namespace {

// cos/sin of every pair for one delta.
struct DeltaTable {
  std::vector<double> c, s;
  void Fill(const std::vector<double>& inv_freq, std::int64_t delta) {
    c.resize(inv_freq.size());
    s.resize(inv_freq.size());
    for (std::size_t j = 0; j < inv_freq.size(); ++j) rope_delta_cos_sin(delta, inv_freq[j], c[j], s[j]);
  }
};

std::vector<double> InvFreq(const RopeSpec& spec) {
  std::vector<double> w(static_cast<std::size_t>(rope_pairs(spec)));
  for (std::size_t j = 0; j < w.size(); ++j) w[j] = rope_spec_inv_freq(spec, static_cast<int>(j));
  return w;
}

template <KeyType T>
void RotateToken(const RopeSpec& spec, void* keys, std::int64_t row_stride, std::int64_t t, int kv_heads,
                 const DeltaTable& d) {
  const int pairs = static_cast<int>(d.c.size());
  for (int h = 0; h < kv_heads; ++h) {
    const std::int64_t head = rope_head_offset(t, h, row_stride, spec.head_dim);
    for (int j = 0; j < pairs; ++j) {
      const auto k = static_cast<std::size_t>(j);
      rope_rotate_key_pair<T>(keys, head, spec, j, d.c[k], d.s[k]);
    }
  }
}

template <KeyType T>
void Reposition(const RopeSpec& spec, void* keys, std::int64_t row_stride, std::int64_t tokens, int kv_heads,
                const std::int64_t* old_pos, const std::int64_t* new_pos) {
  const std::vector<double> inv_freq = InvFreq(spec);
  DeltaTable d;
  bool filled = false;
  std::int64_t last = 0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t delta = new_pos[t] - old_pos[t];
    if (delta == 0) continue;
    if (!filled || delta != last) {
      d.Fill(inv_freq, delta);
      filled = true;
      last = delta;
    }
    RotateToken<T>(spec, keys, row_stride, t, kv_heads, d);
  }
}

template <KeyType T>
void Shift(const RopeSpec& spec, void* keys, std::int64_t row_stride, std::int64_t tokens, int kv_heads,
           std::int64_t delta) {
  DeltaTable d;
  d.Fill(InvFreq(spec), delta);
  for (std::int64_t t = 0; t < tokens; ++t) RotateToken<T>(spec, keys, row_stride, t, kv_heads, d);
}

}  // namespace

bool rope_reposition_cpu(const RopeSpec& spec, KeyType type, void* keys, std::int64_t row_stride,
                         std::int64_t tokens, int kv_heads, const std::int64_t* old_pos,
                         const std::int64_t* new_pos) {
  if (rope_keys_problem(spec, row_stride, tokens, kv_heads) != nullptr || !key_type_valid(type)) return false;
  if (tokens == 0) return true;
  if (keys == nullptr || old_pos == nullptr || new_pos == nullptr) return false;
  switch (type) {
    case KeyType::kF32:
      Reposition<KeyType::kF32>(spec, keys, row_stride, tokens, kv_heads, old_pos, new_pos);
      break;
    case KeyType::kF16:
      Reposition<KeyType::kF16>(spec, keys, row_stride, tokens, kv_heads, old_pos, new_pos);
      break;
    case KeyType::kBF16:
      Reposition<KeyType::kBF16>(spec, keys, row_stride, tokens, kv_heads, old_pos, new_pos);
      break;
  }
  return true;
}

bool rope_shift_cpu(const RopeSpec& spec, KeyType type, void* keys, std::int64_t row_stride, std::int64_t tokens,
                    int kv_heads, std::int64_t delta) {
  if (rope_keys_problem(spec, row_stride, tokens, kv_heads) != nullptr || !key_type_valid(type)) return false;
  if (tokens == 0 || delta == 0) return true;
  if (keys == nullptr) return false;
  switch (type) {
    case KeyType::kF32:
      Shift<KeyType::kF32>(spec, keys, row_stride, tokens, kv_heads, delta);
      break;
    case KeyType::kF16:
      Shift<KeyType::kF16>(spec, keys, row_stride, tokens, kv_heads, delta);
      break;
    case KeyType::kBF16:
      Shift<KeyType::kBF16>(spec, keys, row_stride, tokens, kv_heads, delta);
      break;
  }
  return true;
}

bool RepositionKeysF32(const RopeSpec& spec, float* keys, std::int64_t row_stride_floats, int tokens, int kv_heads,
                       const std::int64_t* old_pos, const std::int64_t* new_pos) {
  return rope_reposition_cpu(spec, KeyType::kF32, keys, row_stride_floats, tokens, kv_heads, old_pos, new_pos);
}

bool RepositionKeysF32Delta(const RopeSpec& spec, float* keys, std::int64_t row_stride_floats, int tokens,
                            int kv_heads, std::int64_t delta) {
  return rope_shift_cpu(spec, KeyType::kF32, keys, row_stride_floats, tokens, kv_heads, delta);
}

}  // namespace kdn::kernels

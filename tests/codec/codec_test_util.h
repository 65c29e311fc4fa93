// SPDX-License-Identifier: Apache-2.0
// Shared by the codec tests: the reference run's KV as a canonical chunk,
// conversions to and from a dtype's bytes, and making a codec from a spec.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/codec/codec.h"
#include "core/codec/payload.h"
#include "test_models.h"
#include "core/util/dtype.h"

namespace kdn::codec::test {

inline constexpr std::uint32_t kLayers = 5, kHeads = 4, kDim = 8, kTokens = 48;

inline Shape RefShape(std::uint32_t dtype) { return Shape{kLayers, kHeads, kDim, kTokens, dtype}; }

// The canonical chunk ([layer][k|v][token][kv_head][head_dim]) of the
// reference run's 48 positions, as float; empty when the files are missing.
inline std::vector<float> ReferenceKv() {
  const std::vector<float> k = testing::ReadFloats(testing::ReferencePath("kv260k.k.f32"));
  const std::vector<float> v = testing::ReadFloats(testing::ReferencePath("kv260k.v.f32"));
  const size_t per = size_t{kLayers} * kTokens * kHeads * kDim;
  if (k.size() != per || v.size() != per) return {};
  std::vector<float> out(2 * per);
  const size_t row = size_t{kHeads} * kDim;
  for (size_t l = 0; l < kLayers; ++l) {
    for (size_t t = 0; t < kTokens; ++t) {
      std::memcpy(&out[((l * 2 + 0) * kTokens + t) * row], &k[(l * kTokens + t) * row], row * 4);
      std::memcpy(&out[((l * 2 + 1) * kTokens + t) * row], &v[(l * kTokens + t) * row], row * 4);
    }
  }
  return out;
}

// The chunk in `dtype`'s bytes, and back.
inline std::vector<std::uint8_t> ToBytes(const std::vector<float>& kv, std::uint32_t dtype) {
  std::vector<std::uint8_t> out(kv.size() * DtypeBytes(dtype));
  for (size_t i = 0; i < kv.size(); ++i) internal::StoreElement(dtype, out.data(), i, kv[i]);
  return out;
}
inline std::vector<float> ToFloats(const std::vector<std::uint8_t>& bytes, std::uint32_t dtype) {
  std::vector<float> out(bytes.size() / DtypeBytes(dtype));
  for (size_t i = 0; i < out.size(); ++i) out[i] = internal::LoadElement(dtype, bytes.data(), i);
  return out;
}

inline std::unique_ptr<Codec> Make(const std::string& text) {
  Result<Spec> spec = ParseSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  Result<std::unique_ptr<Codec>> c = MakeCodec(*spec);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return std::move(c).value();
}

}  // namespace kdn::codec::test

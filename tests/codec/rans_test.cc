// SPDX-License-Identifier: Apache-2.0
// kdn's rANS entropy coder (core/codec/rans.h) and its state math
// (kernels/common/rans.h): round trips, compression against the empirical
// entropy, table format, and rejection of corrupt input (runs under ASan).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/codec/rans.h"
#include "kernels/common/rans.h"

namespace kdn::codec::rans {
namespace {

std::vector<std::uint8_t> Uniform(std::size_t n, std::uint32_t alphabet, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::uint32_t> d(0, alphabet - 1);
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = static_cast<std::uint8_t>(d(rng));
  return v;
}

// A two-sided geometric over 256 values centred on 128 (like quantized
// residuals): p(k) ~ r^|k - 128|.
std::vector<std::uint8_t> Skewed(std::size_t n, double r, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> w(256);
  for (int k = 0; k < 256; ++k) w[k] = std::pow(r, std::abs(k - 128));
  std::discrete_distribution<int> d(w.begin(), w.end());
  std::vector<std::uint8_t> v(n);
  for (auto& x : v) x = static_cast<std::uint8_t>(d(rng));
  return v;
}

FreqTable TableFor(const std::vector<std::uint8_t>& v, std::uint32_t scale_bits = kDefaultScaleBits) {
  std::vector<std::uint64_t> counts = Histogram(v);
  if (counts.empty()) counts.assign(1, 0);
  Result<FreqTable> t = BuildTable(counts, scale_bits);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : FreqTable{};
}

void RoundTrip(const std::vector<std::uint8_t>& v, std::uint32_t lanes, std::uint32_t scale_bits = kDefaultScaleBits) {
  const FreqTable t = TableFor(v, scale_bits);
  Result<std::vector<std::uint8_t>> enc = Encode(v, t, lanes);
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  std::vector<std::uint8_t> dec(v.size() + 1, 0xAB);
  Status st = Decode(*enc, t, v.size(), dec.data(), lanes);
  ASSERT_TRUE(st.ok()) << st.message() << " n=" << v.size() << " lanes=" << lanes;
  EXPECT_EQ(dec.back(), 0xAB) << "wrote past count";
  dec.pop_back();
  EXPECT_EQ(dec, v) << "n=" << v.size() << " lanes=" << lanes;
}

// ---------------------------------------------------------------- state math

TEST(RansKernel, PutThenAdvanceIsIdentity) {
  using namespace kdn::kernels;
  const std::uint32_t sb = 12;
  const std::uint32_t start = 1000, freq = 37;
  for (std::uint32_t x : {kRansLow, kRansLow + 12345u, kRansHigh - 1}) {
    std::uint8_t buf[8];
    std::uint8_t* p = buf + 8;
    std::uint32_t y = rans_enc_renorm(x, freq, sb, p);
    ASSERT_GE(buf + 8 - p, 0);
    ASSERT_LE(buf + 8 - p, static_cast<std::ptrdiff_t>(rans_max_bytes_per_symbol(sb)));
    y = rans_enc_put(y, start, freq, sb);
    ASSERT_TRUE(rans_state_valid(y));
    const std::uint32_t slot = rans_dec_slot(y, sb);
    EXPECT_GE(slot, start);
    EXPECT_LT(slot, start + freq);
    std::uint32_t z = rans_dec_advance(y, start, freq, sb);
    const std::uint8_t* q = p;
    ASSERT_TRUE(rans_dec_renorm(z, q, buf + 8));
    EXPECT_EQ(q, buf + 8);
    EXPECT_EQ(z, x);
  }
}

// ---------------------------------------------------------------- round trips

TEST(RansRoundTrip, AlphabetsLengthsAndLanes) {
  const std::uint32_t alphabets[] = {1, 2, 5, 256};
  for (std::uint32_t lanes : {1u, 4u, 8u}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{lanes - 1}, std::size_t{lanes},
                          std::size_t{lanes + 1}, std::size_t{1000}, std::size_t{100003}}) {
      for (std::uint32_t a : alphabets) RoundTrip(Uniform(n, a, 7 * a + static_cast<std::uint32_t>(n)), lanes);
      RoundTrip(Skewed(n, 0.5, 11 + static_cast<std::uint32_t>(n)), lanes);
      RoundTrip(Skewed(n, 0.05, 13 + static_cast<std::uint32_t>(n)), lanes);
    }
  }
}

TEST(RansRoundTrip, ExtremeSkewAndScales) {
  // One symbol of 100000 plus a handful of rare ones: freq 1 each.
  std::vector<std::uint8_t> v(100000, 3);
  v[0] = 0;
  v[500] = 255;
  v[99999] = 200;
  for (std::uint32_t lanes : {1u, 4u, 8u}) {
    for (std::uint32_t sb : {8u, 12u, 15u}) RoundTrip(v, lanes, sb);
  }
  // Small scales with small alphabets.
  for (std::uint32_t sb : {1u, 2u, 4u}) RoundTrip(Uniform(5000, 2, 3), 4, sb);
}

TEST(RansRoundTrip, OneSymbolCostsOnlyTheStates) {
  const std::vector<std::uint8_t> v(10000, 0);
  const FreqTable t = TableFor(v);
  for (std::uint32_t lanes : {1u, 4u, 8u}) {
    Result<std::vector<std::uint8_t>> enc = Encode(v, t, lanes);
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(enc->size(), 4u * lanes);
  }
}

TEST(RansRoundTrip, EncodeRejectsBadInput) {
  FreqTable t = TableFor({0, 1, 1});
  const std::vector<std::uint8_t> absent = {0, 1, 2};
  EXPECT_EQ(Encode(absent, t).status().code(), Code::kInvalidArgument);
  const std::vector<std::uint8_t> ok = {0, 1};
  EXPECT_EQ(Encode(ok, t, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Encode(ok, t, kMaxLanes + 1).status().code(), Code::kInvalidArgument);
  t.freq[0] += 1;  // cum no longer matches
  EXPECT_EQ(Encode(ok, t).status().code(), Code::kInvalidArgument);
}

// ---------------------------------------------------------------- compression

double EntropyBits(const std::vector<std::uint8_t>& v) {
  const std::vector<std::uint64_t> counts = Histogram(v);
  double bits = 0;
  for (std::uint64_t c : counts) {
    if (c == 0) continue;
    bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / static_cast<double>(v.size()));
  }
  return bits;
}

TEST(RansCompression, WithinOnePercentOfEntropy) {
  const std::size_t n = 1 << 20;
  for (double r : {0.8, 0.5, 0.2}) {
    const std::vector<std::uint8_t> v = Skewed(n, r, 42);
    const FreqTable t = TableFor(v);
    const double entropy_bytes = EntropyBits(v) / 8;
    for (std::uint32_t lanes : {1u, 4u, 8u}) {
      Result<std::vector<std::uint8_t>> enc = Encode(v, t, lanes);
      ASSERT_TRUE(enc.ok());
      const double size = static_cast<double>(enc->size());
      std::printf("r=%.2f lanes=%u: %.4f bits/symbol, entropy %.4f (+%.3f%%)\n", r, lanes, size * 8 / n,
                  entropy_bytes * 8 / n, 100.0 * (size / entropy_bytes - 1));
      EXPECT_LE(size, entropy_bytes * 1.01 + 4.0 * lanes + 8) << "r=" << r << " lanes=" << lanes;
      EXPECT_GE(size, entropy_bytes * 0.99);  // sanity: no code beats the entropy by much
      std::vector<std::uint8_t> dec(n);
      ASSERT_TRUE(Decode(*enc, t, n, dec.data(), lanes).ok());
      EXPECT_EQ(dec, v);
    }
  }
}

// ---------------------------------------------------------------- table format

TEST(RansTable, NormalizesExactly) {
  const std::vector<std::uint64_t> counts = {0, 1, 1000000, 3, 0, 77, 1};
  for (std::uint32_t sb : {4u, 8u, 12u, 15u}) {
    Result<FreqTable> t = BuildTable(counts, sb);
    ASSERT_TRUE(t.ok()) << t.status().message();
    EXPECT_TRUE(ValidateTable(*t).ok());
    EXPECT_EQ(t->cum.back(), 1u << sb);
    for (std::size_t s = 0; s < counts.size(); ++s) {
      EXPECT_EQ(counts[s] == 0, t->freq[s] == 0) << "s=" << s << " sb=" << sb;
    }
  }
  // All-zero counts: symbol 0 takes the range.
  Result<FreqTable> z = BuildTable(std::vector<std::uint64_t>{0, 0}, 12);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->freq[0], 4096);
  // Rejections.
  EXPECT_FALSE(BuildTable(std::vector<std::uint64_t>{}, 12).ok());
  EXPECT_FALSE(BuildTable(std::vector<std::uint64_t>(257, 1), 12).ok());
  EXPECT_FALSE(BuildTable(std::vector<std::uint64_t>{1}, 0).ok());
  EXPECT_FALSE(BuildTable(std::vector<std::uint64_t>{1}, 16).ok());
  EXPECT_FALSE(BuildTable(std::vector<std::uint64_t>(256, 1), 7).ok());  // 256 symbols > 128 slots
  EXPECT_TRUE(BuildTable(std::vector<std::uint64_t>(256, 1), 8).ok());
}

TEST(RansTable, SerializeParseRoundTrip) {
  for (double r : {0.9, 0.3}) {
    const FreqTable t = TableFor(Skewed(20000, r, 5));
    std::vector<std::uint8_t> bytes = {0xEE};  // appends after existing bytes
    SerializeTable(t, &bytes);
    const std::size_t size = bytes.size() - 1;
    EXPECT_LE(size, 2 + 2 * t.freq.size());
    bytes.push_back(0x99);  // trailing data is not part of the table
    std::size_t consumed = 0;
    Result<FreqTable> p = ParseTable(std::span<const std::uint8_t>(bytes).subspan(1), &consumed);
    ASSERT_TRUE(p.ok()) << p.status().message();
    EXPECT_EQ(consumed, size);
    EXPECT_EQ(p->scale_bits, t.scale_bits);
    EXPECT_EQ(p->freq, t.freq);
    EXPECT_EQ(p->cum, t.cum);
  }
}

TEST(RansTable, ParseRejectsCorruptTables) {
  const FreqTable t = TableFor(Skewed(20000, 0.6, 9));
  std::vector<std::uint8_t> good;
  SerializeTable(t, &good);
  // Every truncation.
  for (std::size_t len = 0; len < good.size(); ++len) {
    Result<FreqTable> p = ParseTable(std::span<const std::uint8_t>(good.data(), len));
    EXPECT_EQ(p.status().code(), Code::kCorrupt) << "len=" << len;
  }
  // Bad sums, scales and alphabet sizes.
  auto expect_corrupt = [](std::vector<std::uint8_t> b, const char* what) {
    Result<FreqTable> p = ParseTable(b);
    EXPECT_EQ(p.status().code(), Code::kCorrupt) << what;
  };
  expect_corrupt({12, 2, 0x80, 0x10, 0x01}, "sum 2049 (4096 is 0x80 0x20)");
  expect_corrupt({12, 1, 0x80, 0x40}, "sum 8192");
  expect_corrupt({12, 1, 0x00}, "sum 0");
  expect_corrupt({0, 1, 1}, "scale 0");
  expect_corrupt({16, 1, 0x80, 0x80, 0x04}, "scale 16");
  expect_corrupt({12, 0}, "alphabet 0");
  expect_corrupt({12, 0x81, 0x02}, "alphabet 257");
  expect_corrupt({12, 1, 0x80, 0xA0, 0x00}, "overlong varint");
  expect_corrupt({12, 1, 0xFF, 0xFF, 0xFF, 0x7F}, "oversized varint");
  // A valid hand-written one: 2 symbols at 2048 each (0x80 0x10).
  Result<FreqTable> v = ParseTable(std::vector<std::uint8_t>{12, 2, 0x80, 0x10, 0x80, 0x10});
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->freq, (std::vector<std::uint16_t>{2048, 2048}));
  // Any one-byte change of a real table parses to a valid table or kCorrupt.
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::vector<std::uint8_t> b = good;
    b[i] ^= 0x01;
    Result<FreqTable> p = ParseTable(b);
    if (p.ok()) {
      EXPECT_TRUE(ValidateTable(*p).ok());
    } else {
      EXPECT_EQ(p.status().code(), Code::kCorrupt);
    }
  }
}

// ---------------------------------------------------------------- decoder rejection

TEST(RansDecode, RejectsEveryTruncation) {
  const std::vector<std::uint8_t> v = Skewed(300, 0.7, 21);
  const FreqTable t = TableFor(v);
  for (std::uint32_t lanes : {1u, 4u, 8u}) {
    Result<std::vector<std::uint8_t>> enc = Encode(v, t, lanes);
    ASSERT_TRUE(enc.ok());
    std::vector<std::uint8_t> out(v.size());
    for (std::size_t len = 0; len < enc->size(); ++len) {
      // A copy of exactly `len` bytes so ASan sees any read past it.
      const std::vector<std::uint8_t> cut(enc->begin(), enc->begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_EQ(Decode(cut, t, v.size(), out.data(), lanes).code(), Code::kCorrupt) << "len=" << len;
    }
    // Overrun: trailing bytes, or asking for fewer symbols than coded.
    std::vector<std::uint8_t> longer = *enc;
    longer.push_back(0);
    EXPECT_EQ(Decode(longer, t, v.size(), out.data(), lanes).code(), Code::kCorrupt);
    EXPECT_EQ(Decode(*enc, t, v.size() - 1, out.data(), lanes).code(), Code::kCorrupt);
    // Wrong lane count.
    const std::uint32_t other = lanes == 1 ? 4 : 1;
    EXPECT_FALSE(Decode(*enc, t, v.size(), out.data(), other).ok());
  }
}

TEST(RansDecode, RejectsBadStates) {
  const FreqTable t = TableFor({0, 1, 2, 2});
  std::uint8_t out[4];
  // Empty stream of 1 lane is the state 2^23 alone.
  const std::vector<std::uint8_t> empty = {0x00, 0x00, 0x80, 0x00};
  EXPECT_TRUE(Decode(empty, t, 0, out).ok());
  EXPECT_EQ(Decode(std::vector<std::uint8_t>{0xFF, 0xFF, 0x7F, 0x00}, t, 0, out).code(), Code::kCorrupt);
  EXPECT_EQ(Decode(std::vector<std::uint8_t>{0x00, 0x00, 0x00, 0x80}, t, 0, out).code(), Code::kCorrupt);
  EXPECT_EQ(Decode(std::vector<std::uint8_t>{0x01, 0x00, 0x80, 0x00}, t, 0, out).code(), Code::kCorrupt);
  EXPECT_EQ(Decode(empty, t, 1, nullptr).code(), Code::kInvalidArgument);
}

TEST(RansDecode, GarbageNeverCrashes) {
  std::mt19937 rng(1234);
  const FreqTable tables[] = {TableFor(Skewed(5000, 0.6, 1)), TableFor(Uniform(5000, 2, 2)),
                              TableFor(std::vector<std::uint8_t>(10, 0))};
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const std::size_t len = rng() % 200;
    std::vector<std::uint8_t> g(len);
    for (auto& b : g) b = static_cast<std::uint8_t>(rng());
    // Sometimes make the states valid so decoding goes further.
    for (std::size_t k = 3; k < len && k < 32; k += 4) {
      if (rng() % 2) g[k] = static_cast<std::uint8_t>(g[k] & 0x7F) | 0x01;
    }
    const std::uint32_t lanes = std::uint32_t{1} << (rng() % 4);
    const std::size_t count = rng() % 300;
    std::vector<std::uint8_t> out(count);
    Status st = Decode(g, tables[iter % 3], count, out.data(), lanes);
    if (st.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(st.code(), Code::kCorrupt);
    }
  }
  EXPECT_LT(ok, 30);  // garbage that happens to be a valid stream is rare
}

}  // namespace
}  // namespace kdn::codec::rans

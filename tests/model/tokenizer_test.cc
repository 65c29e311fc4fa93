// SPDX-License-Identifier: Apache-2.0
#include "lab/model/tokenizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "test_models.h"

namespace kdn::model {
namespace {

// The reference greedy run of models/README.md.
const char kReferenceText[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to";

Tokenizer LoadTok() {
  auto t = Tokenizer::Load(testing::TokenizerPath(), 512);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

TEST(Tokenizer, DecodesTheReferenceIds) {
  KDN_REQUIRE_MODEL();
  EXPECT_EQ(LoadTok().DecodeAll(testing::kReferenceIds, kBos), kReferenceText);
}

TEST(Tokenizer, EncodesTheReferenceTextToTheReferenceIds) {
  KDN_REQUIRE_MODEL();
  std::vector<int> expect = {kBos};
  expect.insert(expect.end(), testing::kReferenceIds.begin(), testing::kReferenceIds.end());
  EXPECT_EQ(LoadTok().Encode(kReferenceText, true), expect);
}

TEST(Tokenizer, RoundTripsTextWithUnknownCharacters) {
  KDN_REQUIRE_MODEL();
  const Tokenizer t = LoadTok();
  for (const std::string text : {"Tom had a red kite.", "naïve café 東京 \xF0\x9F\x98\x80!", "a\nb\tc", "x"}) {
    const std::vector<int> ids = t.Encode(text, true);
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[0], kBos);
    for (int id : ids) EXPECT_TRUE(id >= 0 && id < 512);
    EXPECT_EQ(t.DecodeAll({ids.begin() + 1, ids.end()}, kBos), text);
  }
  EXPECT_EQ(t.Encode("", true), std::vector<int>{kBos});
  EXPECT_TRUE(t.Encode("", false).empty());
}

TEST(Tokenizer, RejectsTruncatedAndOversizedFiles) {
  KDN_REQUIRE_MODEL();
  std::ifstream in(testing::TokenizerPath(), std::ios::binary);
  const std::vector<std::uint8_t> good{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  for (size_t cut : {size_t{0}, size_t{3}, size_t{100}, good.size() - 1}) {
    auto t = Tokenizer::Parse({good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)}, 512);
    ASSERT_FALSE(t.ok()) << cut;
    EXPECT_NE(t.status().message().find("truncated"), std::string::npos) << t.status().message();
  }
  auto longer = good;
  longer.push_back(0);
  auto t = Tokenizer::Parse(longer, 512);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("oversized"), std::string::npos);
  auto bad_len = good;
  const std::int32_t huge = 1 << 30;
  std::memcpy(bad_len.data() + 8, &huge, 4);  // token 0's length
  EXPECT_FALSE(Tokenizer::Parse(bad_len, 512).ok());
  EXPECT_EQ(Tokenizer::Load("/nonexistent/tok.bin", 512).status().code(), Code::kNotFound);
}

TEST(Tokenizer, ByteLevelFallbackRoundTrips) {
  const Tokenizer t = Tokenizer::Bytes(512);
  const std::string text = "Hello, wörld\n";
  const std::vector<int> ids = t.Encode(text, true);
  // BOS, then one token per byte (there is no " " piece, so no dummy prefix).
  EXPECT_EQ(ids.size(), 1 + text.size());
  EXPECT_EQ(t.DecodeAll({ids.begin() + 1, ids.end()}, kBos), text);
}

}  // namespace
}  // namespace kdn::model

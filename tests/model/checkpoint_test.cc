// SPDX-License-Identifier: Apache-2.0
#include "lab/model/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "test_models.h"

namespace kdn::model {
namespace {

std::vector<std::uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void SetHeader(std::vector<std::uint8_t>& bytes, int index, std::int32_t value) {
  std::memcpy(bytes.data() + 4 * index, &value, 4);
}

TEST(Checkpoint, LoadsStories260K) {
  KDN_REQUIRE_MODEL();
  auto c = Checkpoint::Load(testing::ModelPath());
  ASSERT_TRUE(c.ok()) << c.status().message();
  const ModelConfig& m = c->config();
  EXPECT_EQ(m.dim, 64);
  EXPECT_EQ(m.hidden_dim, 172);
  EXPECT_EQ(m.n_layers, 5);
  EXPECT_EQ(m.n_heads, 8);
  EXPECT_EQ(m.n_kv_heads, 4);
  EXPECT_EQ(m.vocab_size, 512);
  EXPECT_EQ(m.seq_len, 512);
  EXPECT_TRUE(m.shared_classifier);
  EXPECT_EQ(m.head_dim(), 8);
  EXPECT_EQ(m.kv_dim(), 32);
  EXPECT_EQ(m.kv_bytes_per_token(), 1280);
  EXPECT_EQ(c->classifier(), c->tok_emb());
}

TEST(Checkpoint, TruncatedFileIsAClearError) {
  KDN_REQUIRE_MODEL();
  auto bytes = ReadFile(testing::ModelPath());
  bytes.resize(bytes.size() - 4);
  auto c = Checkpoint::Parse(bytes);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find("truncated"), std::string::npos) << c.status().message();
}

TEST(Checkpoint, OversizedFileIsAClearError) {
  KDN_REQUIRE_MODEL();
  auto bytes = ReadFile(testing::ModelPath());
  bytes.push_back(0);
  auto c = Checkpoint::Parse(bytes);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("oversized"), std::string::npos) << c.status().message();
}

TEST(Checkpoint, InconsistentHeadersAreClearErrors) {
  KDN_REQUIRE_MODEL();
  const auto good = ReadFile(testing::ModelPath());
  struct Case {
    int field;
    std::int32_t value;
    const char* expect;
  } cases[] = {
      {0, 0, "dim"},            {0, -64, "dim"},         {0, 65, "multiple of n_heads"},
      {1, 0, "hidden_dim"},     {2, 0, "n_layers"},      {2, 100000, "n_layers"},
      {3, 0, "n_heads"},        {3, 3, "multiple of n_heads"}, {4, 3, "n_kv_heads"},
      {4, 16, "n_kv_heads"},    {5, 0, "vocab_size"},    {5, INT32_MIN, "vocab_size"},
      {6, 0, "seq_len"},        {6, 1 << 30, "seq_len"}, {3, 64, "odd"},
      {2, 6, "truncated"},      {2, 4, "oversized"},
  };
  for (const Case& k : cases) {
    auto bytes = good;
    SetHeader(bytes, k.field, k.value);
    auto c = Checkpoint::Parse(bytes);
    ASSERT_FALSE(c.ok()) << "field " << k.field << " = " << k.value;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos)
        << "field " << k.field << " = " << k.value << ": " << c.status().message();
  }
}

TEST(Checkpoint, TinyAndMissingFiles) {
  for (size_t n : {0u, 1u, 27u}) {
    auto c = Checkpoint::Parse(std::vector<std::uint8_t>(n, 0));
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("truncated"), std::string::npos);
  }
  auto c = Checkpoint::Load("/nonexistent/model.bin");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), Code::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/model.bin"), std::string::npos);
}

TEST(Checkpoint, UnsharedClassifierIsRead) {
  // A file with a negative vocab_size carries its own classifier after the RoPE tables.
  ModelConfig c = Stories260KConfig();
  c.vocab_size = 16;
  c.seq_len = 4;
  c.shared_classifier = false;
  const std::int64_t floats = Checkpoint::FloatCount(c);
  std::vector<std::uint8_t> bytes(28 + static_cast<size_t>(floats) * 4, 0);
  const std::int32_t header[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, -c.vocab_size, c.seq_len};
  std::memcpy(bytes.data(), header, sizeof header);
  const float marker = 7.5f;
  std::memcpy(bytes.data() + bytes.size() - 4, &marker, 4);  // the classifier's last element
  auto ck = Checkpoint::Parse(bytes);
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_FALSE(ck->config().shared_classifier);
  EXPECT_NE(ck->classifier(), ck->tok_emb());
  EXPECT_EQ(ck->classifier()[c.vocab_size * c.dim - 1], marker);
}

}  // namespace
}  // namespace kdn::model

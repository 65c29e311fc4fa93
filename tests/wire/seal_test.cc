// SPDX-License-Identifier: Apache-2.0
// Sealed envelopes (core/wire/seal.h): what a tier with a deployment secret
// writes and reads back. A seal opens only with its secret and only over the
// bytes it was made for: any byte of the envelope or the trailer changed, a
// trailer missing, cut or of another secret, bytes added: refused.
#include "core/wire/seal.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "core/wire/envelope.h"

namespace kdn::wire {
namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef-deployment-one";

chunk::Bytes Envelope(std::uint32_t seed = 3) {
  chunk::Chunk c;
  c.meta.key[0] = 1;
  c.meta.model[0] = 2;
  c.meta.ns_hash[0] = 3;
  c.meta.dtype = 1;
  c.meta.layers = 2;
  c.meta.kv_heads = 2;
  c.meta.head_dim = 8;
  c.meta.tokens = 4;
  c.payload = chunk::Payload(c.meta.payload_bytes());
  std::mt19937 rng(seed);
  for (auto& b : c.payload) b = static_cast<std::uint8_t>(rng());
  return EncodeEnvelope(c).value();
}

chunk::Bytes Sealed(const ChunkSealer& s, const chunk::Bytes& env) {
  chunk::Bytes out = env;
  out.resize(env.size() + kSealTrailerBytes);
  EXPECT_TRUE(s.Seal(out.data(), env.size(), out.data() + env.size()).ok());
  return out;
}

std::shared_ptr<const ChunkSealer> Sealer(const std::string& secret = kSecret) {
  auto s = ChunkSealer::FromSecret(secret);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : nullptr;
}

TEST(SealTest, OpensWithItsSecretOverItsBytesOnly) {
  auto s = Sealer();
  ASSERT_TRUE(s);
  const chunk::Bytes env = Envelope();
  const chunk::Bytes sealed = Sealed(*s, env);
  size_t n = 0;
  ASSERT_TRUE(s->Open(sealed.data(), sealed.size(), &n).ok());
  EXPECT_EQ(n, env.size());
  EXPECT_TRUE(DecodeEnvelope(sealed.data(), n, nullptr).ok());
  // Two seals of the same bytes differ (a fresh salt) and both open.
  const chunk::Bytes again = Sealed(*s, env);
  EXPECT_NE(again, sealed);
  EXPECT_TRUE(s->Open(again.data(), again.size(), &n).ok());
  // Every byte matters: each one flipped in turn is refused.
  for (size_t i = 0; i < sealed.size(); ++i) {
    chunk::Bytes b = sealed;
    b[i] ^= 0x01;
    EXPECT_EQ(s->Open(b.data(), b.size(), &n).code(), Code::kCorrupt) << "byte " << i << " of " << sealed.size();
  }
  // No trailer, a cut one, bytes added, another secret's.
  EXPECT_EQ(s->Open(env.data(), env.size(), &n).code(), Code::kCorrupt);
  EXPECT_EQ(s->Open(sealed.data(), sealed.size() - 1, &n).code(), Code::kCorrupt);
  chunk::Bytes longer = sealed;
  longer.push_back(0);
  EXPECT_EQ(s->Open(longer.data(), longer.size(), &n).code(), Code::kCorrupt);
  auto other = Sealer(kSecret + "-two");
  ASSERT_TRUE(other);
  const Status st = other->Open(sealed.data(), sealed.size(), &n);
  EXPECT_EQ(st.code(), Code::kCorrupt);
  EXPECT_NE(st.message().find("another secret"), std::string::npos) << st.message();
  // A forger who recomputes the envelope's checksums (another payload under
  // the same key) and keeps the old trailer: refused.
  chunk::Bytes forged = Envelope(/*seed=*/9);
  ASSERT_EQ(forged.size(), env.size());
  forged.insert(forged.end(), sealed.end() - kSealTrailerBytes, sealed.end());
  EXPECT_EQ(s->Open(forged.data(), forged.size(), &n).code(), Code::kCorrupt);
  // Garbage and nothing.
  const std::uint8_t junk[16] = {0xFF, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(s->Open(junk, sizeof junk, &n).code(), Code::kCorrupt);
  EXPECT_EQ(s->Open(nullptr, 0, &n).code(), Code::kCorrupt);
}

TEST(SealTest, AReaderWithoutASecretSkipsASealAndOnlyASeal) {
  auto s = Sealer();
  ASSERT_TRUE(s);
  const chunk::Bytes env = Envelope();
  const chunk::Bytes sealed = Sealed(*s, env);
  EXPECT_EQ(EnvelopeBytesIgnoringSeal(sealed.data(), sealed.size()), env.size());
  EXPECT_EQ(EnvelopeBytesIgnoringSeal(env.data(), env.size()), env.size());
  chunk::Bytes other = env;
  other.resize(env.size() + kSealTrailerBytes, 0xAB);  // 48 bytes that are no seal
  EXPECT_EQ(EnvelopeBytesIgnoringSeal(other.data(), other.size()), other.size());
}

TEST(SealTest, SecretsAreLongEnoughAndTheirFilesPrivate) {
  EXPECT_EQ(ChunkSealer::FromSecret("short").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ChunkSealer::FromSecret(std::string(5000, 'x')).status().code(), Code::kInvalidArgument);
  const std::string path = ::testing::TempDir() + "/kdn_seal_" + std::to_string(::getpid());
  std::ofstream(path) << kSecret;
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto open = ChunkSealer::FromFile(path);
  EXPECT_EQ(open.status().code(), Code::kInvalidArgument);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos) << open.status().message();
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  auto ok = ChunkSealer::FromFile(path);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ((*ok)->key_id(), Sealer()->key_id()) << "the file's bytes are the secret";
  EXPECT_EQ(ChunkSealer::FromFile(path + ".missing").status().code(), Code::kInvalidArgument);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kdn::wire

// SPDX-License-Identifier: Apache-2.0
// Encryption at rest through a runtime's disk tier (issue 37, item 2;
// wire/cipher.h), with the reference model's KV: the tier's files hold none
// of it in the clear (searched for block by block, where a tier without
// keys shows every block); a ciphertext changed, or moved under another
// chunk's key with its checksums made right, is a counted miss; a runtime
// without the key misses; rotation reads old chunks while their key is on
// the ring and writes new ones under the first key.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/runtime/runtime.h"
#include "core/wire/cipher.h"
#include "core/wire/envelope.h"
#include "plaintext.h"
#include "reference_kv.h"
#include "test_models.h"

namespace kdn::store {
namespace {

namespace fs = std::filesystem;

const std::string kKeyA = "2b7e151628aed2a6abf7158809cf4f3c2b7e151628aed2a6abf7158809cf4f3c";
const std::string kKeyB = "603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4";

class AtRest : public ::testing::Test {
 protected:
  void SetUp() override {
    KDN_REQUIRE_MODEL();
    ref_ = testing::PrefillStory();
    ASSERT_FALSE(ref_.canonical.empty());
    root_ = fs::path(::testing::TempDir()) / ("kdn-at-rest-" + std::to_string(::getpid()) + "-" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string KeyFile(const std::string& name, const std::string& text) {
    const std::string path = (root_ / name).string();
    std::ofstream(path) << text;
    EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
    return path;
  }
  // A runtime whose one tier is a raw disk tier in `dir`, with the keys of
  // `key_file` (none: empty).
  std::shared_ptr<Runtime> Disk(const std::string& dir, const std::string& key_file) {
    StoreOptions o;
    o.chunk_tokens = 8;
    o.encryption_key_file = key_file;
    TierSpec disk;
    disk.kind = TierSpec::Kind::kDisk;
    disk.path = (root_ / dir).string();
    disk.capacity_bytes = 64 << 20;
    disk.codec = "raw";
    o.tiers = {disk};
    auto rt = Runtime::Create(o, 2);
    EXPECT_TRUE(rt.ok()) << rt.status().message();
    return rt.ok() ? std::move(rt).value() : nullptr;
  }
  std::uint64_t StoreAll(Runtime& rt, const std::string& ns = "t") {
    std::vector<float> in = ref_.canonical;
    auto views = ResolvedViews::Resolve(ref_.m, std::vector<ViewSpec>{View(in)}, ref_.tokens.size()).value();
    auto stored = rt.Store(ref_.m, ns, ref_.Keys(), views);
    EXPECT_TRUE(stored.ok()) << stored.status().message();
    rt.store().chain().Flush();
    return stored.ok() ? *stored : 0;
  }
  // The prefix retrieved; *exact: the KV written is the reference's.
  std::uint64_t RetrieveAll(Runtime& rt, const std::string& ns = "t", bool* exact = nullptr) {
    std::vector<float> out(ref_.canonical.size(), 0.0f);
    auto views = ResolvedViews::Resolve(ref_.m, std::vector<ViewSpec>{View(out)}, ref_.tokens.size()).value();
    auto got = rt.Retrieve(ref_.m, ns, ref_.Keys(), views);
    EXPECT_TRUE(got.ok()) << got.status().message();
    if (exact) *exact = out == ref_.canonical;
    return got.ok() ? got->tokens : 0;
  }
  static ViewSpec View(std::vector<float>& kv) {
    ViewSpec s;
    s.data = kv.data();
    s.size_bytes = kv.size() * 4;
    return s;
  }
  std::vector<std::string_view> Plain() const {
    return {std::string_view(reinterpret_cast<const char*>(ref_.canonical.data()), ref_.canonical.size() * 4)};
  }
  // The object files of a disk tier's directory.
  std::vector<fs::path> Objects(const std::string& dir) const {
    std::vector<fs::path> out;
    for (auto& e : fs::recursive_directory_iterator(root_ / dir / "objects")) {
      if (e.is_regular_file()) out.push_back(e.path());
    }
    return out;
  }
  static std::vector<std::uint8_t> Read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<std::uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  static void Write(const fs::path& p, const std::vector<std::uint8_t>& b) {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  }
  static std::uint64_t AuthFailures(Runtime& rt) { return rt.store().chain().Stats()[0].auth_failures; }

  testing::ReferenceKv ref_;
  fs::path root_;
};

TEST_F(AtRest, ADiskTiersFilesHoldNoKvInTheClear) {
  const std::string keys = KeyFile("keys", kKeyA + "\n");
  size_t blocks = 0;
  {
    // Without keys the search finds the KV: every block of it.
    auto plain = Disk("plain", "");
    ASSERT_TRUE(plain);
    ASSERT_EQ(StoreAll(*plain), ref_.tokens.size());
    EXPECT_EQ(testing::PlaintextBlocksFound(Plain(), testing::FilesUnder(root_ / "plain"), &blocks), blocks);
    ASSERT_GT(blocks, 100u);
  }
  auto rt = Disk("sealed", keys);
  ASSERT_TRUE(rt);
  ASSERT_EQ(StoreAll(*rt), ref_.tokens.size());
  const std::vector<fs::path> files = Objects("sealed");
  // The whole chunks, and the tail's pieces.
  ASSERT_GT(files.size(), ref_.tokens.size() / 8);
  EXPECT_EQ(testing::PlaintextBlocksFound(Plain(), testing::FilesUnder(root_ / "sealed")), 0u)
      << "KV in the clear in an encrypting tier's files";
  // Each file an envelope of an encrypted chunk under key A.
  for (const fs::path& f : files) {
    const std::vector<std::uint8_t> b = Read(f);
    auto c = wire::DecodeEnvelope(b.data(), b.size(), nullptr);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)->meta.codec, codec::CodecId::kEncrypted);
    wire::KeyId id;
    ASSERT_TRUE(wire::EncryptedKeyId(**c, &id));
    EXPECT_EQ(id, wire::ChunkCipher::FromText(kKeyA, "A").value()->key_id());
  }
  // Read back by a fresh runtime with the key: the KV bit for bit.
  rt.reset();
  rt = Disk("sealed", keys);
  bool exact = false;
  EXPECT_EQ(RetrieveAll(*rt, "t", &exact), ref_.tokens.size());
  EXPECT_TRUE(exact);
  EXPECT_EQ(AuthFailures(*rt), 0u);
  // Without the key: a miss, counted (and the object dropped, as one whose
  // seal fails is).
  rt.reset();
  auto keyless = Disk("sealed", "");
  EXPECT_EQ(RetrieveAll(*keyless), 0u);
  // At least the first chunk's; the load may have read those after it at once.
  EXPECT_GE(AuthFailures(*keyless), 1u);
}

TEST_F(AtRest, ACiphertextChangedOrMovedIsACountedMiss) {
  const std::string keys = KeyFile("keys", kKeyA + "\n");
  ASSERT_EQ(StoreAll(*Disk("d", keys)), ref_.tokens.size());
  // The files by the first position of their chunk.
  std::map<std::int64_t, fs::path> by_position;
  std::map<std::int64_t, chunk::ChunkRef> chunks;
  for (const fs::path& f : Objects("d")) {
    const std::vector<std::uint8_t> b = Read(f);
    chunk::ChunkRef c = wire::DecodeEnvelope(b.data(), b.size(), nullptr).value();
    by_position[c->meta.first_position] = f;
    chunks[c->meta.first_position] = c;
  }
  ASSERT_TRUE(by_position.contains(0) && by_position.contains(8) && by_position.contains(16));
  // The attacker's rewrite: a well-formed envelope, its checksums right.
  auto rewrite = [&](const fs::path& f, const chunk::Chunk& c) {
    Write(f, wire::EncodeEnvelope(c).value());
  };
  // Chunk 2 (tokens 16..23): one ciphertext bit flipped.
  {
    chunk::Chunk c;
    c.meta = chunks[16]->meta;
    c.payload = chunk::Payload(chunks[16]->payload.data(), chunks[16]->payload.size());
    c.payload[wire::kEncryptedHeaderBytes + 100] ^= 0x04;
    rewrite(by_position[16], c);
  }
  auto rt = Disk("d", keys);
  EXPECT_EQ(RetrieveAll(*rt), 16u);
  EXPECT_EQ(AuthFailures(*rt), 1u);
  EXPECT_FALSE(fs::exists(by_position[16])) << "a chunk that does not open is removed";
  rt.reset();
  // Chunk 0's file now holds chunk 1's ciphertext under chunk 0's key (a
  // valid ciphertext of the tenant, moved): it does not open either.
  {
    chunk::Chunk c;
    c.meta = chunks[8]->meta;
    c.meta.key = chunks[0]->meta.key;
    c.meta.first_position = 0;
    c.payload = chunk::Payload(chunks[8]->payload.data(), chunks[8]->payload.size());
    rewrite(by_position[0], c);
  }
  rt = Disk("d", keys);
  EXPECT_EQ(RetrieveAll(*rt), 0u);
  EXPECT_EQ(AuthFailures(*rt), 1u);
}

TEST_F(AtRest, RotationReadsOldChunksWhileTheirKeyIsOnTheRing) {
  const std::string a = KeyFile("a", kKeyA + "\n");
  const std::string ba = KeyFile("ba", "# B encrypts, A still decrypts\n" + kKeyB + "\n" + kKeyA + "\n");
  const std::string b = KeyFile("b", kKeyB + "\n");
  ASSERT_EQ(StoreAll(*Disk("d", a), "old"), ref_.tokens.size());
  const wire::KeyId id_a = wire::ChunkCipher::FromText(kKeyA, "A").value()->key_id();
  const wire::KeyId id_b = wire::ChunkCipher::FromText(kKeyB, "B").value()->key_id();
  auto ids = [&] {
    std::map<std::string, int> n;
    for (const fs::path& f : Objects("d")) {
      const std::vector<std::uint8_t> bytes = Read(f);
      chunk::ChunkRef c = wire::DecodeEnvelope(bytes.data(), bytes.size(), nullptr).value();
      wire::KeyId id;
      EXPECT_TRUE(wire::EncryptedKeyId(*c, &id));
      ++n[id == id_a ? "A" : id == id_b ? "B" : "other"];
    }
    return n;
  };
  const int n = static_cast<int>(Objects("d").size());
  EXPECT_EQ(ids(), (std::map<std::string, int>{{"A", n}}));
  {
    // The new key first: old chunks read, new ones written under B.
    auto rt = Disk("d", ba);
    bool exact = false;
    EXPECT_EQ(RetrieveAll(*rt, "old", &exact), ref_.tokens.size());
    EXPECT_TRUE(exact);
    ASSERT_EQ(StoreAll(*rt, "new"), ref_.tokens.size());
    EXPECT_EQ(ids(), (std::map<std::string, int>{{"A", n}, {"B", n}}));
  }
  // The old key off the ring: its chunks are misses, counted; B's read.
  auto rt = Disk("d", b);
  bool exact = false;
  EXPECT_EQ(RetrieveAll(*rt, "new", &exact), ref_.tokens.size());
  EXPECT_TRUE(exact);
  EXPECT_EQ(RetrieveAll(*rt, "old"), 0u);
  EXPECT_GE(AuthFailures(*rt), 1u);
}

TEST_F(AtRest, AKeySourceThatIsNotOneFailsTheRuntime) {
  StoreOptions o;
  o.encryption_key_file = (root_ / "absent").string();
  EXPECT_EQ(Runtime::Create(o, 1).status().code(), Code::kInvalidArgument);
  const std::string open = (root_ / "open").string();
  std::ofstream(open) << kKeyA << "\n";
  ::chmod(open.c_str(), 0644);
  o.encryption_key_file = open;
  auto rt = Runtime::Create(o, 1);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("chmod"), std::string::npos) << rt.status().message();
  o.encryption_key_file = KeyFile("short", kKeyA.substr(0, 40) + "\n");
  rt = Runtime::Create(o, 1);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().message().find(kKeyA.substr(0, 40)), std::string::npos) << "a key in a message";
  o.encryption_key_file = KeyFile("good", kKeyA + "\n");
  o.encryption_key_env = "KDN_SOME_VARIABLE";
  EXPECT_EQ(Runtime::Create(o, 1).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kdn::store

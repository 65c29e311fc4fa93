// SPDX-License-Identifier: Apache-2.0
// Encryption at rest (core/wire/cipher.h): the master key ring's text, the
// derivations (pinned, and HKDF checked against its definition by HMAC),
// and the encrypted payload: it opens only under its key, its namespace and
// its own description, and any byte of it changed is refused.
#include "core/wire/cipher.h"

#include <gtest/gtest.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "core/wire/envelope.h"

namespace kdn::wire {
namespace {

// Two master keys as a key file holds them (64 hex digits a line).
const std::string kKeyA = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const std::string kKeyB = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

std::shared_ptr<const ChunkCipher> TestRing(const std::string& text) {
  auto c = ChunkCipher::FromText(text, "the test ring");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : nullptr;
}

chunk::ChunkRef TestChunk(std::uint32_t seed = 3, codec::CodecId codec = codec::CodecId::kRaw) {
  auto c = std::make_shared<chunk::Chunk>();
  c->meta.key[0] = 1;
  c->meta.model[0] = 2;
  c->meta.ns_hash[0] = 3;
  c->meta.dtype = 1;
  c->meta.layers = 2;
  c->meta.kv_heads = 2;
  c->meta.head_dim = 8;
  c->meta.tokens = 4;
  c->meta.first_position = 16;
  c->meta.codec = codec;
  c->payload = chunk::Payload(c->meta.payload_bytes());
  std::mt19937 rng(seed);
  for (auto& b : c->payload) b = static_cast<std::uint8_t>(rng());
  return c;
}

std::string HexOf(const std::uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

std::vector<std::uint8_t> Unhex(const std::string& hex) {
  std::vector<std::uint8_t> out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

bool SamePayload(const chunk::Chunk& a, const chunk::Chunk& b) {
  return a.payload.size() == b.payload.size() && std::equal(a.payload.begin(), a.payload.end(), b.payload.begin());
}

TEST(CipherTest, DerivationsArePinnedAndHkdfIsItsDefinition) {
  const std::vector<std::uint8_t> master = Unhex(kKeyA);
  ASSERT_EQ(master.size(), kMasterKeyBytes);
  // The key id: SHA-256("kdn at-rest key id v1" || key), its first 8 bytes.
  const KeyId id = MasterKeyId(master.data());
  EXPECT_EQ(HexOf(id.data(), id.size()), "22a8b1d2a10c4290");
  keys::Digest ns{};
  for (size_t i = 0; i < ns.size(); ++i) ns[i] = static_cast<std::uint8_t>(0xa0 + i);
  const SymmetricKey k = NamespaceKey(master.data(), ns);
  EXPECT_EQ(HexOf(k.data(), k.size()), "009774eee1de1727da5f49ea8db590133e5a9707729299e3faca1ba97a1331b3");
  // HKDF-SHA256 (RFC 5869) by hand: PRK = HMAC(salt, IKM); OKM = T(1) =
  // HMAC(PRK, info || 0x01), 32 bytes.
  const std::string salt = "kdn at-rest v1";
  std::uint8_t prk[32], okm[32];
  unsigned len = 0;
  ASSERT_TRUE(HMAC(EVP_sha256(), salt.data(), static_cast<int>(salt.size()), master.data(), master.size(), prk, &len));
  std::vector<std::uint8_t> t(ns.begin(), ns.end());
  t.push_back(1);
  ASSERT_TRUE(HMAC(EVP_sha256(), prk, 32, t.data(), t.size(), okm, &len));
  EXPECT_EQ(HexOf(k.data(), k.size()), HexOf(okm, 32));
  // Another namespace, another key; another master, another key and id.
  keys::Digest other = ns;
  other[31] ^= 1;
  EXPECT_NE(NamespaceKey(master.data(), other), k);
  const std::vector<std::uint8_t> b = Unhex(kKeyB);
  EXPECT_NE(NamespaceKey(b.data(), ns), k);
  EXPECT_NE(MasterKeyId(b.data()), id);
}

TEST(CipherTest, TheRingsTextIsKeysOnePerLine) {
  auto two = TestRing("# rotated 2026-12-06\n" + kKeyB + "\n\n  " + kKeyA + "  \n");
  ASSERT_TRUE(two);
  EXPECT_EQ(two->keys(), 2u);
  EXPECT_EQ(two->key_id(), MasterKeyId(Unhex(kKeyB).data()));  // the first encrypts
  EXPECT_TRUE(two->Holds(MasterKeyId(Unhex(kKeyA).data())));
  // Refused, and the message never holds the key.
  for (const std::string& bad : {std::string(""), std::string("# none\n\n"), kKeyA.substr(0, 62),
                                 kKeyA + "00", "zz" + kKeyA.substr(2), kKeyA + "\n" + kKeyA}) {
    auto c = ChunkCipher::FromText(bad, "the test ring");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(c.status().message().find(kKeyA.substr(4, 20)), std::string::npos) << c.status().message();
  }
}

TEST(CipherTest, KeysComeFromAPrivateFileOrAVariable) {
  const std::string path = ::testing::TempDir() + "/kdn-cipher-keys-" + std::to_string(::getpid());
  {
    std::ofstream f(path);
    f << kKeyA << "\n";
  }
  ::chmod(path.c_str(), 0644);
  auto open = ChunkCipher::FromFile(path);
  ASSERT_FALSE(open.ok());
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos) << open.status().message();
  ::chmod(path.c_str(), 0600);
  auto ring = ChunkCipher::FromFile(path);
  ASSERT_TRUE(ring.ok()) << ring.status().message();
  EXPECT_EQ((*ring)->key_id(), MasterKeyId(Unhex(kKeyA).data()));
  EXPECT_FALSE(ChunkCipher::FromFile(path + ".missing").ok());
  ::setenv("KDN_TEST_MASTER_KEYS", kKeyB.c_str(), 1);
  auto env = ChunkCipher::Load("", "KDN_TEST_MASTER_KEYS");
  ASSERT_TRUE(env.ok()) << env.status().message();
  EXPECT_EQ((*env)->key_id(), MasterKeyId(Unhex(kKeyB).data()));
  ::unsetenv("KDN_TEST_MASTER_KEYS");
  EXPECT_FALSE(ChunkCipher::Load("", "KDN_TEST_MASTER_KEYS").ok());
  EXPECT_FALSE(ChunkCipher::Load(path, "KDN_TEST_MASTER_KEYS").ok());  // one source, not two
  auto none = ChunkCipher::Load("", "");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  std::remove(path.c_str());
}

TEST(CipherTest, AnEncryptedChunkOpensUnderItsKeyAndDescriptionOnly) {
  auto a = TestRing(kKeyA);
  ASSERT_TRUE(a);
  const chunk::ChunkRef plain = TestChunk(3, codec::CodecId::kZstd);
  Result<chunk::ChunkRef> enc = a->Encrypt(*plain);
  ASSERT_TRUE(enc.ok()) << enc.status().message();
  const chunk::Chunk& e = **enc;
  EXPECT_EQ(e.meta.codec, codec::CodecId::kEncrypted);
  EXPECT_EQ(e.payload.size(), plain->payload.size() + kEncryptionOverhead);
  KeyId id;
  ASSERT_TRUE(EncryptedKeyId(e, &id));
  EXPECT_EQ(id, a->key_id());
  // The plaintext appears nowhere in it (not even a 16-byte piece).
  const std::string cipher_text(e.payload.begin(), e.payload.end());
  for (size_t at = 0; at + 16 <= plain->payload.size(); at += 16) {
    EXPECT_EQ(cipher_text.find(std::string(plain->payload.begin() + at, plain->payload.begin() + at + 16)),
              std::string::npos);
  }
  // Two encryptions differ (a fresh nonce); both open, in place or not.
  Result<chunk::ChunkRef> again = a->Encrypt(*plain);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(SamePayload(**again, e));
  for (bool in_place : {false, true}) {
    auto copy = std::make_shared<chunk::Chunk>();
    copy->meta = e.meta;
    copy->payload = chunk::Payload(e.payload.data(), e.payload.size());
    Result<chunk::ChunkRef> open = a->Decrypt(copy, in_place);
    ASSERT_TRUE(open.ok()) << open.status().message();
    EXPECT_EQ((*open)->meta, plain->meta);
    EXPECT_TRUE(SamePayload(**open, *plain));
    EXPECT_EQ(in_place, (*open)->payload.data() == copy->payload.data() + kEncryptedHeaderBytes);
  }
  // Through an envelope (codec `encrypted`) and back.
  const chunk::Bytes envelope = EncodeEnvelope(e).value();
  Result<chunk::ChunkRef> decoded = DecodeEnvelope(envelope.data(), envelope.size(), &e.meta.key);
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  Result<chunk::ChunkRef> open = a->Decrypt(*decoded);
  ASSERT_TRUE(open.ok()) << open.status().message();
  EXPECT_TRUE(SamePayload(**open, *plain));

  auto refused = [&](const chunk::Chunk& c, const std::string& what) {
    auto copy = std::make_shared<chunk::Chunk>();
    copy->meta = c.meta;
    copy->payload = chunk::Payload(c.payload.data(), c.payload.size());
    Result<chunk::ChunkRef> r = a->Decrypt(copy);
    EXPECT_FALSE(r.ok()) << what;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kCorrupt) << what;
    }
  };
  // Every byte of the payload matters: each flipped in turn is refused.
  for (size_t i = 0; i < e.payload.size(); ++i) {
    chunk::Chunk b;
    b.meta = e.meta;
    b.payload = chunk::Payload(e.payload.data(), e.payload.size());
    b.payload[i] ^= 0x01;
    refused(b, "byte " + std::to_string(i));
  }
  // So does each field of the description: the ciphertext moved under
  // another key, namespace (whose key is another), model, shape, position.
  std::vector<std::pair<std::string, std::function<void(chunk::ChunkMeta&)>>> edits = {
      {"key", [](chunk::ChunkMeta& m) { m.key[5] ^= 1; }},
      {"namespace", [](chunk::ChunkMeta& m) { m.ns_hash[0] ^= 1; }},
      {"model", [](chunk::ChunkMeta& m) { m.model[31] ^= 1; }},
      {"dtype", [](chunk::ChunkMeta& m) { m.dtype = 2; }},
      {"layers", [](chunk::ChunkMeta& m) { m.layers = 4; m.tokens = 2; }},
      {"kv_heads", [](chunk::ChunkMeta& m) { m.kv_heads = 1; m.tokens = 8; }},
      {"head_dim", [](chunk::ChunkMeta& m) { m.head_dim = 4; m.tokens = 8; }},
      {"first_position", [](chunk::ChunkMeta& m) { m.first_position = 20; }},
      {"edited", [](chunk::ChunkMeta& m) { m.edited = true; }}};
  for (const auto& [what, edit] : edits) {
    chunk::Chunk b;
    b.meta = e.meta;
    edit(b.meta);
    b.payload = chunk::Payload(e.payload.data(), e.payload.size());
    refused(b, what);
  }
  // The payload cut short of its header and tag; a header naming no codec.
  chunk::Chunk cut;
  cut.meta = e.meta;
  cut.payload = chunk::Payload(e.payload.data(), kEncryptionOverhead - 1);
  refused(cut, "cut");
  // Another master key's ring does not hold it; a ring with both opens it.
  auto b = TestRing(kKeyB);
  Result<chunk::ChunkRef> other = b->Decrypt(*enc);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("does not hold"), std::string::npos);
  auto both = TestRing(kKeyB + "\n" + kKeyA);
  EXPECT_TRUE(both->Decrypt(*enc).ok());
  // Encrypting twice, or a device's chunk, is refused; a chunk that is not
  // encrypted is given back as it is.
  EXPECT_EQ(a->Encrypt(e).status().code(), Code::kInvalidArgument);
  Result<chunk::ChunkRef> same = a->Decrypt(plain);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->get(), plain.get());
}

// The cache of namespace keys is bounded: many tenants never grow it past
// kMaxDerivedKeys, and each chunk still opens after the cache was cleared.
TEST(CipherTest, TheDerivedKeysAreBoundedWhateverTheNumberOfNamespaces) {
  auto a = TestRing(kKeyA);
  const chunk::ChunkRef plain = TestChunk(5);
  chunk::ChunkRef first;
  size_t most = 0;
  for (size_t i = 0; i < ChunkCipher::kMaxDerivedKeys + 100; ++i) {
    auto c = std::make_shared<chunk::Chunk>();
    c->meta = plain->meta;
    std::memcpy(c->meta.ns_hash.data(), &i, sizeof i);
    c->payload = chunk::Payload(plain->payload.data(), plain->payload.size());
    Result<chunk::ChunkRef> enc = a->Encrypt(*c);
    ASSERT_TRUE(enc.ok());
    if (i == 0) first = *enc;
    most = std::max(most, a->derived_keys());
  }
  EXPECT_LE(most, ChunkCipher::kMaxDerivedKeys);
  EXPECT_GE(most, ChunkCipher::kMaxDerivedKeys - 1);
  EXPECT_LT(a->derived_keys(), 200u);  // cleared once, then refilled by the last 100
  Result<chunk::ChunkRef> open = a->Decrypt(first);  // its key derived again
  ASSERT_TRUE(open.ok()) << open.status().message();
  EXPECT_TRUE(SamePayload(**open, *plain));
}

TEST(CipherTest, TiersEncryptWhatLeavesAndOpenOnlyWhatTheirRingHolds) {
  auto a = TestRing(kKeyA), b = TestRing(kKeyB);
  const chunk::ChunkRef plain = TestChunk(7);
  // Without a cipher a chunk goes as it is; with one it is encrypted once.
  EXPECT_EQ(ToRest(plain, nullptr)->get(), plain.get());
  EXPECT_EQ(AtRestPayloadBytes(*plain, nullptr), plain->payload.size());
  EXPECT_EQ(AtRestPayloadBytes(*plain, a.get()), plain->payload.size() + kEncryptionOverhead);
  const chunk::ChunkRef enc = ToRest(plain, a.get()).value();
  EXPECT_EQ(enc->meta.codec, codec::CodecId::kEncrypted);
  EXPECT_EQ(ToRest(enc, b.get())->get(), enc.get());  // a client's, on a node: as it is
  EXPECT_EQ(AtRestPayloadBytes(*enc, b.get()), enc->payload.size());
  // Read back: opened by the ring that holds its key.
  Result<chunk::ChunkRef> open = FromRest(enc, a.get(), false);
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(SamePayload(**open, *plain));
  // A runtime without its key, or without keys: a miss (kCorrupt).
  EXPECT_EQ(FromRest(enc, b.get(), false).status().code(), Code::kCorrupt);
  EXPECT_EQ(FromRest(enc, nullptr, false).status().code(), Code::kCorrupt);
  // A node keeps what it cannot open, for the client whose key it is.
  EXPECT_EQ(FromRest(enc, b.get(), true)->get(), enc.get());
  EXPECT_EQ(FromRest(enc, nullptr, true)->get(), enc.get());
  auto moved = std::make_shared<chunk::Chunk>();
  moved->meta = enc->meta;
  moved->meta.key[0] ^= 0x80;  // a node's object key: its own key does not open it either
  moved->payload = chunk::Payload(enc->payload.data(), enc->payload.size());
  EXPECT_EQ(FromRest(moved, a.get(), true)->get(), moved.get());
  EXPECT_EQ(FromRest(moved, a.get(), false).status().code(), Code::kCorrupt);
}

}  // namespace
}  // namespace kdn::wire

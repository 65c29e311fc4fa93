// SPDX-License-Identifier: Apache-2.0
#include "core/keys/hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

namespace kdn::keys {
namespace {

using namespace std::string_literals;

ModelIdentity Ref() {
  ModelIdentity m;
  m.layers = 5;
  m.kv_heads = 4;
  m.head_dim = 8;
  m.dtype = 0;
  m.fingerprint = "stories260K";
  return m;
}

TEST(Hash, Sha256OfTheEmptyStringIsTheStandardOne) {
  EXPECT_EQ(ToHex(Hasher().Finish()), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Hasher h;
  h.Bytes("abc", 3);
  EXPECT_EQ(ToHex(h.Finish()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Keys must be the same in every process, language and version: these
// digests are part of the on-disk and on-wire format. Changing the encoding
// means a new domain tag ("kdn-chunk-v2"), never new values under v1. The
// values were computed independently with Python's hashlib from the encoding
// README.md documents.
TEST(Hash, ChunkKeysAreStable) {
  const Digest model = ModelFingerprint(Ref());
  EXPECT_EQ(ToHex(model), "daddac67ee246df360dc7f70986e74f13d49cbe04650b04b8fad62c9905660f5");
  const std::vector<std::int32_t> tokens = {1, 403, 407, 261};
  const Digest k0 = ChunkKey(0, "tenant", model, Digest{}, tokens);
  EXPECT_EQ(ToHex(k0), "124be26d553108cfa3ec47ea99462c3d851354a245e3e8f7d337805f6ce6d746");
}

// A salted request's chain (kdn_request.salt, vLLM's cache_salt) starts at
// H("kdn-salt-v1", salt) instead of 32 zero bytes, so the salt is in every
// key; an empty salt is no salt (the keys above). Pinned, and computed
// independently with Python's hashlib from docs/storage.md's encoding.
TEST(Hash, ASaltStartsTheChainAndEntersEveryKey) {
  const Digest model = ModelFingerprint(Ref());
  EXPECT_EQ(ChainStart({}), Digest{});
  const std::string salt = "user-1";
  const Digest start = ChainStart(std::span(reinterpret_cast<const std::uint8_t*>(salt.data()), salt.size()));
  EXPECT_EQ(ToHex(start), "1a7c3a48aa06f2fcb22ba24d0a51e99151f3ebf8e1acb7f772360383cb3d6b43");
  const Digest k0 = ChunkKey(0, "tenant", model, start, std::vector<std::int32_t>{1, 403, 407, 261});
  EXPECT_EQ(ToHex(k0), "f9d43a0c196fd846e59f78bd052442fb3dc1a9395d1194939ac82982155b8699");
  EXPECT_EQ(ToHex(ChunkKey(0, "tenant", model, k0, std::vector<std::int32_t>{5, 6, 7})),
            "d85b762ea026509d84e7c2dcb2190e95fc2fcbc928a5263756051ad424f8e40b");
  // Every byte of the salt counts, and its length.
  std::set<Digest> starts;
  for (const std::string& s : {"user-1"s, "user-2"s, "user-1\0"s, "user-"s, "x"s}) {
    starts.insert(ChainStart(std::span(reinterpret_cast<const std::uint8_t*>(s.data()), s.size())));
  }
  EXPECT_EQ(starts.size(), 5u);
  EXPECT_FALSE(starts.count(Digest{}));
}

// Keys come from clients (a kdnd tenant names keys of its choosing), so the
// table hash mixes every byte under a secret: keys crafted to agree in all
// but one byte, or in the 8 bytes a plain read of the digest would take,
// still spread over the buckets (before, 4,096 such keys shared one bucket
// and a table of them cost a full scan per find).
TEST(Hash, DigestHashSpreadsKeysThatShareTheirLeadingBytes) {
  for (int varying : {0, 31, 28}) {  // the byte that differs (0: the first 8 bytes equal after it)
    SCOPED_TRACE(varying);
    std::unordered_set<Digest, DigestHash> set;
    std::set<size_t> hashes;
    for (int i = 0; i < 4096; ++i) {
      Digest d{};
      d.fill(0x41);
      const int at = varying == 0 ? 8 : varying;  // 0: bytes 0-7 stay equal, 8 and 9 vary
      d[at] = static_cast<std::uint8_t>(i);
      d[at == 31 ? 30 : at + 1] = static_cast<std::uint8_t>(i >> 8);
      set.insert(d);
      hashes.insert(DigestHash()(d));
    }
    ASSERT_EQ(set.size(), 4096u);
    EXPECT_EQ(hashes.size(), 4096u);  // 64-bit values: a collision among 4,096 is a 1e-12 event
    size_t largest = 0;
    for (size_t b = 0; b < set.bucket_count(); ++b) largest = std::max(largest, set.bucket_size(b));
    EXPECT_LE(largest, 12u);  // a uniform hash's fullest bucket of ~4,096 over as many: about 6
  }
  // The same digest hashes the same within the process.
  Digest d{};
  d[5] = 7;
  EXPECT_EQ(DigestHash()(d), DigestHash()(Digest(d)));
}

TEST(Hash, EveryInputChangesTheKey) {
  const Digest model = ModelFingerprint(Ref());
  const std::vector<std::int32_t> tokens = {1, 2, 3};
  Digest prev{};
  prev[0] = 1;
  std::set<std::string> keys = {
      ToHex(ChunkKey(0, "a", model, Digest{}, tokens)),
      ToHex(ChunkKey(1, "a", model, Digest{}, tokens)),
      ToHex(ChunkKey(0, "b", model, Digest{}, tokens)),
      ToHex(ChunkKey(0, "a", model, prev, tokens)),
      ToHex(ChunkKey(0, "a", model, Digest{}, std::vector<std::int32_t>{1, 2, 4})),
      ToHex(ChunkKey(0, "a", model, Digest{}, std::vector<std::int32_t>{1, 2})),
      ToHex(ChunkKey(0, "a", model, Digest{}, {})),
  };
  ModelIdentity other = Ref();
  other.fingerprint = "stories260K-finetuned";
  keys.insert(ToHex(ChunkKey(0, "a", ModelFingerprint(other), Digest{}, tokens)));
  EXPECT_EQ(keys.size(), 8u);
  // Deterministic across processes and machines: the key of these inputs,
  // pinned (a change to the encoding or the hash changes it).
  EXPECT_EQ(ToHex(ChunkKey(0, "a", model, Digest{}, tokens)), "5f9cabaf095f733ca25554a30048c3eaa7b265720ca212d93bf9d5420ceb9058");
}

// A walk's keyer gives the very keys of the functions that define them, for
// heads that end anywhere in a SHA-256 block and any number of tokens.
TEST(Hash, ChunkKeyerGivesTheDefinedKeys) {
  const Digest model = ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "keyer"});
  std::vector<std::int32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i * 37 % 512);
  std::vector<std::uint8_t> blocks(40 * 16);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<std::uint8_t>(i * 11);
  for (size_t ns_len : {0u, 1u, 5u, 23u, 24u, 55u, 56u, 64u, 100u}) {
    const std::string ns(ns_len, 'n');
    for (std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{0x0123456789abcdef}}) {
      const ChunkKeyer keyer(seed, ns, model);
      Digest prev{};
      for (size_t len : {0u, 1u, 7u, 16u, 255u, 256u, 300u}) {
        const auto t = std::span<const std::int32_t>(tokens).first(len);
        ASSERT_EQ(keyer.Key(prev, t), ChunkKey(seed, ns, model, prev, t)) << ns_len << " " << len;
        const auto b = std::span<const std::uint8_t>(blocks).first(len / 8 * 16);
        ASSERT_EQ(keyer.KeyFromBlocks(prev, b, 16), ChunkKeyFromBlocks(seed, ns, model, prev, b, 16)) << ns_len;
        prev = keyer.Key(prev, t);
      }
    }
  }
}

// Keyers made one after another for different (seed, ns, model) on one
// thread, and on several threads at once, each give their own triple's keys
// (a thread reuses the head states of its last triple only for that triple,
// and does not keep them for long namespaces).
TEST(Hash, ChunkKeyersOfDifferentHeadsDoNotMix) {
  const Digest m1 = ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "one"});
  const Digest m2 = ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "two"});
  struct Head {
    std::uint64_t seed;
    std::string ns;
    Digest model;
  };
  // Same-length namespaces that differ in one byte, seeds, models, and back.
  const std::vector<Head> heads = {{0, "tenant-a", m1}, {0, "tenant-b", m1}, {1, "tenant-b", m1}, {1, "tenant-b", m2},
                                   {0, "tenant-a", m1}, {0, "", m1},         {0, "tenant-a", m2}, {0, "tenant-a", m1},
                                   // Namespaces too long to be kept, and one that is kept.
                                   {0, std::string(200, 'x'), m1}, {0, std::string(200, 'y'), m1},
                                   {0, std::string(128, 'x'), m1}, {0, std::string(200, 'x'), m1}};
  std::vector<std::int32_t> tokens(256);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i * 7919 % 32000);
  std::vector<std::uint8_t> blocks(16 * 16, 5);
  auto check = [&](size_t first) {
    for (size_t r = 0; r < 3 * heads.size(); ++r) {
      const Head& h = heads[(first + r) % heads.size()];
      const ChunkKeyer keyer(h.seed, h.ns, h.model);
      if (keyer.Key(Digest{}, tokens) != ChunkKey(h.seed, h.ns, h.model, Digest{}, tokens)) return false;
      if (keyer.KeyFromBlocks(Digest{}, blocks, 16) != ChunkKeyFromBlocks(h.seed, h.ns, h.model, Digest{}, blocks, 16)) {
        return false;
      }
    }
    return true;
  };
  EXPECT_TRUE(check(0));
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (size_t t = 0; t < 4; ++t) threads.emplace_back([&, t] { good += check(t) ? 1 : 0; });
  for (auto& th : threads) th.join();
  EXPECT_EQ(good.load(), 4);
}

TEST(Hash, EncodingIsUnambiguous) {
  // Length-prefixed strings: ("ab", "c") and ("a", "bc") must differ.
  Hasher a, b;
  a.Str("ab").Str("c");
  b.Str("a").Str("bc");
  EXPECT_NE(a.Finish(), b.Finish());
}

TEST(Hash, ModelFingerprintCoversTheShape) {
  std::set<std::string> fps;
  auto add = [&](ModelIdentity m) { fps.insert(ToHex(ModelFingerprint(m))); };
  add(Ref());
  ModelIdentity m = Ref();
  m.layers = 6;
  add(m);
  m = Ref();
  m.kv_heads = 8;
  add(m);
  m = Ref();
  m.head_dim = 16;
  add(m);
  m = Ref();
  m.dtype = 1;
  add(m);
  m = Ref();
  m.rope_theta = 500000.0f;
  add(m);
  m = Ref();
  m.rope_style = 1;
  add(m);
  m = Ref();
  m.rotary_dim = 4;
  add(m);
  EXPECT_EQ(fps.size(), 8u);
}

}  // namespace
}  // namespace kdn::keys

// SPDX-License-Identifier: Apache-2.0
#include "core/wire/envelope.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "core/wire/chunk.capnp.h"
#include "wire/chunk_next.capnp.h"

namespace kdn::wire {
namespace {

using chunk::Bytes;
using chunk::Chunk;
using chunk::ChunkMeta;

keys::Digest Digest(std::uint8_t seed) {
  keys::Digest d;
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<std::uint8_t>(seed * 31 + i * 7 + 1);
  return d;
}

ChunkMeta Meta(std::uint32_t dtype, std::uint32_t layers, std::uint32_t kv_heads, std::uint32_t head_dim,
               std::uint32_t tokens) {
  ChunkMeta m;
  m.key = Digest(1);
  m.model = Digest(2);
  m.ns_hash = Digest(3);
  m.dtype = dtype;
  m.layers = layers;
  m.kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.tokens = tokens;
  m.first_position = 512;
  m.edited = true;
  return m;
}

Chunk MakeChunk(const ChunkMeta& meta, std::uint32_t seed = 7) {
  Chunk c;
  c.meta = meta;
  c.payload = chunk::Payload(meta.payload_bytes());
  std::mt19937 rng(seed);
  for (auto& b : c.payload) b = static_cast<std::uint8_t>(rng());
  return c;
}

// A small f16 chunk whose payload (36 bytes) ends mid-word: padding included.
Chunk SmallChunk() { return MakeChunk(Meta(/*f16*/ 1, 1, 1, 9, 1)); }

Bytes Encode(const Chunk& c) {
  Result<Bytes> r = EncodeEnvelope(c);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(r).value() : Bytes{};
}

Result<chunk::ChunkRef> Decode(const Bytes& b, const keys::Digest* key = nullptr) {
  return DecodeEnvelope(b.data(), b.size(), key);
}

Bytes ToBytes(capnp::MessageBuilder& builder) {
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  const kj::ArrayPtr<const kj::byte> bytes = flat.asBytes();
  return Bytes(bytes.begin(), bytes.end());
}

// Builds an envelope field by field with schema `Envelope` (today's, or the
// imagined next one), checksummed as a writer would (so that the check under
// test is the one that fails), then lets `extra` set more fields.
template <typename Envelope, typename Extra>
Bytes Build(EnvelopeHeader h, std::span<const std::uint8_t> payload, Extra&& extra) {
  capnp::MallocMessageBuilder builder;
  typename Envelope::Builder e = builder.initRoot<Envelope>();
  h.payload_bytes = payload.size();
  h.checksum = PayloadChecksum(payload.data(), payload.size());
  e.setVersionMajor(h.version_major);
  e.setVersionMinor(h.version_minor);
  e.setModel(capnp::Data::Reader(h.meta.model.data(), 32));
  e.setNamespaceHash(capnp::Data::Reader(h.meta.ns_hash.data(), 32));
  e.setKey(capnp::Data::Reader(h.meta.key.data(), 32));
  e.setCodec(static_cast<decltype(e.getCodec())>(h.codec));
  e.setDtype(static_cast<decltype(e.getDtype())>(h.meta.dtype));
  e.getShape().setLayers(h.meta.layers);
  e.getShape().setKvHeads(h.meta.kv_heads);
  e.getShape().setHeadDim(h.meta.head_dim);
  e.getShape().setTokens(h.meta.tokens);
  e.setFirstPosition(h.meta.first_position);
  e.setEdited(h.meta.edited);
  auto pieces = e.initPayload(payload.empty() ? 0 : 1);
  if (!payload.empty()) pieces.set(0, capnp::Data::Reader(payload.data(), payload.size()));
  e.setChecksum(h.checksum);
  e.setChecksumAlgorithm(static_cast<decltype(e.getChecksumAlgorithm())>(h.checksum_algorithm));
  e.setHeaderChecksum(HeaderChecksum(h));
  extra(e);
  return ToBytes(builder);
}

Bytes Build(const EnvelopeHeader& h, std::span<const std::uint8_t> payload) {
  return Build<schema::ChunkEnvelope>(h, payload, [](auto&) {});
}

std::span<const std::uint8_t> Span(const chunk::Payload& p) { return {p.data(), p.size()}; }

EnvelopeHeader HeaderOf(const Chunk& c) {
  EnvelopeHeader h;
  h.meta = c.meta;
  return h;
}

void ExpectSameChunk(const Chunk& got, const Chunk& want) {
  EXPECT_EQ(got.meta, want.meta);
  ASSERT_EQ(got.payload.size(), want.payload.size());
  EXPECT_TRUE(std::equal(got.payload.begin(), got.payload.end(), want.payload.begin()));
}

TEST(Envelope, RoundTripsEveryField) {
  for (const ChunkMeta& m : {Meta(0, 2, 4, 8, 16), Meta(1, 3, 1, 9, 1), Meta(2, 1, 2, 3, 5)}) {
    Chunk c = MakeChunk(m);
    c.meta.first_position = -1;
    c.meta.edited = false;
    const Bytes b = Encode(c);
    Result<chunk::ChunkRef> r = Decode(b, &c.meta.key);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ExpectSameChunk(**r, c);
  }
  const Chunk c = SmallChunk();  // first_position 512, edited
  Result<chunk::ChunkRef> r = Decode(Encode(c));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectSameChunk(**r, c);
}

TEST(Envelope, EmptyPayloadRoundTrips) {
  const Chunk c = MakeChunk(Meta(0, 4, 4, 64, 0));
  ASSERT_TRUE(c.payload.empty());
  const Bytes b = Encode(c);
  EXPECT_EQ(b.size(), EncodedEnvelopeSize(0));
  Result<chunk::ChunkRef> r = Decode(b);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectSameChunk(**r, c);
}

TEST(Envelope, EncodedSizeIsKnownWithoutEncoding) {
  for (std::uint32_t head_dim : {1u, 2u, 3u, 9u, 64u, 1000u, 16385u}) {
    for (std::uint32_t dtype : {0u, 1u}) {
      const Chunk c = MakeChunk(Meta(dtype, 1, 1, head_dim, 1));
      EXPECT_EQ(Encode(c).size(), EncodedEnvelopeSize(c.payload.size())) << head_dim << " " << dtype;
    }
  }
}

TEST(Envelope, DecodesUnalignedBuffers) {
  const Chunk c = SmallChunk();
  const Bytes b = Encode(c);
  Bytes shifted(b.size() + 1);
  std::memcpy(shifted.data() + 1, b.data(), b.size());
  Result<chunk::ChunkRef> r = DecodeEnvelope(shifted.data() + 1, b.size(), &c.meta.key);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectSameChunk(**r, c);
}

// Past Cap'n Proto's default traversal limit (64 MiB) and its largest Data
// (512 MiB): the payload travels in 256 MiB pieces.
TEST(Envelope, OneGibPayloadRoundTrips) {
  Chunk c;
  c.meta = Meta(0, 1, 1, 1u << 27, 1);  // 2 x 2^27 x 4 bytes = 1 GiB
  c.payload = chunk::Payload(c.meta.payload_bytes());
  ASSERT_EQ(c.payload.size(), std::uint64_t{1} << 30);
  for (size_t i = 0; i < c.payload.size(); i += 4093) c.payload[i] = static_cast<std::uint8_t>(i >> 12);
  c.payload[c.payload.size() - 1] = 0x5A;
  Bytes b = Encode(c);
  ASSERT_EQ(b.size(), EncodedEnvelopeSize(c.payload.size()));
  {
    Result<chunk::ChunkRef> r = Decode(b, &c.meta.key);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ExpectSameChunk(**r, c);
  }
  b[b.size() - 8] ^= 1;  // inside the last piece
  Result<chunk::ChunkRef> r = Decode(b, &c.meta.key);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
}

// A writer that reuses its buffers encodes over old bytes: the result is
// byte for byte what an encoding into zeros gives, for payloads that end
// mid-word and ones that do not, and the progress it reports only ever
// names bytes that are already final.
TEST(Envelope, EncodingOverOldBytesMatchesEncodingIntoZeros) {
  const Chunk chunks[] = {SmallChunk(), MakeChunk(Meta(0, 1, 1, 1, 1)), MakeChunk(Meta(1, 2, 3, 40001, 1), 9),
                          MakeChunk(Meta(0, 3, 2, 64, 256), 11)};
  for (const Chunk& c : chunks) {
    const Bytes want = Encode(c);
    const std::uint64_t n = c.payload.size();
    const std::uint64_t payload_start = want.size() - ((n + 7) / 8 * 8);
    for (const std::uint8_t old : {0x00, 0xA5, 0xFF}) {
      std::vector<std::uint64_t> words((want.size() + 7) / 8);
      auto* out = reinterpret_cast<std::uint8_t*>(words.data());
      std::memset(out, old, want.size());
      std::uint64_t last = payload_start;
      int calls = 0;
      bool final_bytes = true;
      ASSERT_TRUE(EncodeEnvelopeOver(c, out, want.size(), [&](std::uint64_t end) {
                    ++calls;
                    EXPECT_GT(end, last);
                    EXPECT_LE(end, payload_start + n);
                    final_bytes &= std::equal(out + last, out + end, want.begin() + static_cast<std::ptrdiff_t>(last));
                    last = end;
                  }).ok());
      EXPECT_TRUE(final_bytes) << n;
      EXPECT_EQ(last, payload_start + n) << n;  // the whole payload reported
      EXPECT_GE(calls, static_cast<int>(n / (64 << 10)));
      EXPECT_TRUE(std::equal(want.begin(), want.end(), out)) << n << " over " << int{old};
      std::memset(out, old, want.size());
      ASSERT_TRUE(EncodeEnvelopeOver(c, out, want.size()).ok());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), out)) << n << " over " << int{old};
    }
  }
}

// A reader that hashed the payload while it arrived hands the decoder its
// checksum: the decoder checks it like its own, and it knows where a
// one-piece payload starts without parsing.
TEST(Envelope, ACallersPayloadChecksumIsCheckedLikeItsOwn) {
  const Chunk c = MakeChunk(Meta(1, 2, 3, 40001, 1), 9);
  const Bytes b = Encode(c);
  const std::uint64_t at = OnePiecePayloadOffset();
  ASSERT_EQ(at + ((c.payload.size() + 7) / 8 * 8), b.size());
  EXPECT_TRUE(std::equal(c.payload.begin(), c.payload.end(), b.begin() + static_cast<std::ptrdiff_t>(at)));
  int calls = 0;
  Result<chunk::ChunkRef> r = DecodeEnvelope(b.data(), b.size(), &c.meta.key, nullptr,
                                             [&](const std::uint8_t* p, size_t n) {
                                               ++calls;
                                               EXPECT_EQ(p, b.data() + at);
                                               EXPECT_EQ(n, c.payload.size());
                                               return PayloadChecksum(p, n);
                                             });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(calls, 1);
  ExpectSameChunk(**r, c);
  r = DecodeEnvelope(b.data(), b.size(), &c.meta.key, nullptr,
                     [](const std::uint8_t* p, size_t n) { return PayloadChecksum(p, n) ^ 1; });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
}

TEST(Envelope, NewerMajorVersionIsUnsupported) {
  const Chunk c = SmallChunk();
  EnvelopeHeader h = HeaderOf(c);
  h.version_major = 2;
  Result<chunk::ChunkRef> r = Decode(Build(h, Span(c.payload)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_NE(r.status().message().find("format version 2.0 is newer"), std::string::npos) << r.status().message();
}

TEST(Envelope, VersionZeroIsCorrupt) {
  const Chunk c = SmallChunk();
  EnvelopeHeader h = HeaderOf(c);
  h.version_major = 0;
  EXPECT_EQ(Decode(Build(h, Span(c.payload))).status().code(), Code::kCorrupt);
}

TEST(Envelope, NewerMinorVersionWithUnknownFieldsDecodes) {
  const Chunk c = SmallChunk();
  EnvelopeHeader h = HeaderOf(c);
  h.version_minor = 1;
  const Bytes b = Build<next::ChunkEnvelope>(h, Span(c.payload), [](next::ChunkEnvelope::Builder& e) {
    e.setPinned(true);
    e.setPriority(0xDEADBEEF);
    e.initProvenance().setEngine("an engine from the future");
    e.getProvenance().setComputedAtNs(42);
    auto tags = e.initTags(2);
    tags.set(0, "rag");
    tags.set(1, "doc-17");
  });
  // Sanity: the message does carry the new fields, and is bigger.
  ASSERT_GT(b.size(), EncodedEnvelopeSize(c.payload.size()));
  Result<chunk::ChunkRef> r = Decode(b, &c.meta.key);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectSameChunk(**r, c);
}

TEST(Envelope, ANewerFieldClaimingVersion1_0IsCorrupt) {
  // A 1.0 message is exact; a 1.0 reader must not mistake garbage in unused
  // bits for a field it does not know.
  const Chunk c = SmallChunk();
  const Bytes b = Build<next::ChunkEnvelope>(HeaderOf(c), Span(c.payload),
                                             [](next::ChunkEnvelope::Builder& e) { e.setPinned(true); });
  EXPECT_EQ(Decode(b).status().code(), Code::kCorrupt);
}

TEST(Envelope, WriterBuiltMessagesMatchTheEncoder) {
  // Build() and EncodeEnvelope agree on a 1.0 message, so the tests below
  // change exactly the field they mean to.
  const Chunk c = SmallChunk();
  Result<chunk::ChunkRef> r = Decode(Build(HeaderOf(c), Span(c.payload)), &c.meta.key);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ExpectSameChunk(**r, c);
}

TEST(Envelope, BadPayloadChecksumIsCorrupt) {
  const Chunk c = SmallChunk();
  Bytes b = Encode(c);
  b[b.size() - 8] ^= 0x10;  // last payload word (36 bytes: 4 of payload then 4 of padding)
  Result<chunk::ChunkRef> r = Decode(b);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("payload checksum"), std::string::npos) << r.status().message();
}

TEST(Envelope, StoredChecksumMismatchIsCorrupt) {
  const Chunk c = SmallChunk();
  // Header checksum made over a wrong payload checksum: the header is
  // consistent, the payload is not.
  Bytes b = Build<schema::ChunkEnvelope>(HeaderOf(c), Span(c.payload), [&](schema::ChunkEnvelope::Builder& e) {
    EnvelopeHeader h = HeaderOf(c);
    h.payload_bytes = c.payload.size();
    h.checksum = e.getChecksum() + 1;
    e.setChecksum(h.checksum);
    e.setHeaderChecksum(HeaderChecksum(h));
  });
  Result<chunk::ChunkRef> r = Decode(b);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("payload checksum"), std::string::npos) << r.status().message();
}

TEST(Envelope, BadHeaderChecksumIsCorrupt) {
  const Chunk c = SmallChunk();
  const Bytes b = Build<schema::ChunkEnvelope>(HeaderOf(c), Span(c.payload), [](schema::ChunkEnvelope::Builder& e) {
    e.setHeaderChecksum(e.getHeaderChecksum() ^ 1);
  });
  Result<chunk::ChunkRef> r = Decode(b);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("header checksum"), std::string::npos) << r.status().message();
}

TEST(Envelope, WrongKeyIsCorrupt) {
  const Chunk c = SmallChunk();
  const keys::Digest other = Digest(99);
  Result<chunk::ChunkRef> r = Decode(Encode(c), &other);
  EXPECT_EQ(r.status().code(), Code::kCorrupt);
  EXPECT_NE(r.status().message().find("expected"), std::string::npos) << r.status().message();
}

TEST(Envelope, ShapeThatDoesNotMatchThePayloadIsCorrupt) {
  const Chunk c = SmallChunk();
  for (int which = 0; which < 5; ++which) {
    EnvelopeHeader h = HeaderOf(c);
    switch (which) {
      case 0: h.meta.tokens = 2; break;
      case 1: h.meta.head_dim = 8; break;
      case 2: h.meta.dtype = 0; break;  // f32: twice the bytes
      case 3: h.meta.layers = 0; break;
      case 4: h.meta.layers = h.meta.kv_heads = h.meta.head_dim = h.meta.tokens = 0xFFFFFFFF; break;  // overflows
    }
    // Build a consistent message around a payload that does not fit the shape.
    Result<chunk::ChunkRef> r = Decode(Build(h, Span(c.payload)));
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << which << ": " << r.status().message();
  }
}

TEST(Envelope, UnknownCodecIsUnsupported) {
  const Chunk c = SmallChunk();
  EnvelopeHeader h = HeaderOf(c);
  h.codec = 9;  // 8 is `encrypted` (wire/cipher.h)
  Result<chunk::ChunkRef> r = Decode(Build(h, Span(c.payload)));
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  EXPECT_NE(r.status().message().find("codec 9"), std::string::npos) << r.status().message();
}

// ---- Encoded payloads (codecs) ------------------------------------------------

TEST(Envelope, CodecValuesArePinnedToTheCodecLibrarysIds) {
  EXPECT_EQ(static_cast<int>(schema::Codec::RAW), 0);
  EXPECT_EQ(static_cast<int>(schema::Codec::FP8), static_cast<int>(codec::CodecId::kFp8));
  EXPECT_EQ(static_cast<int>(schema::Codec::INT8), static_cast<int>(codec::CodecId::kInt8));
  EXPECT_EQ(static_cast<int>(schema::Codec::KIVI2), static_cast<int>(codec::CodecId::kKivi2));
  EXPECT_EQ(static_cast<int>(schema::Codec::CACHEGEN), static_cast<int>(codec::CodecId::kCacheGen));
  EXPECT_EQ(static_cast<int>(schema::Codec::KDN), static_cast<int>(codec::CodecId::kKdn));
  EXPECT_EQ(static_cast<int>(schema::Codec::ZSTD), static_cast<int>(codec::CodecId::kZstd));
  EXPECT_EQ(static_cast<int>(schema::Codec::TC), static_cast<int>(codec::CodecId::kTc));
  EXPECT_EQ(static_cast<int>(schema::Codec::ENCRYPTED), static_cast<int>(codec::CodecId::kEncrypted));
  EXPECT_EQ(kLastKnownCodec, 8);
}

// An encoded chunk: the reference shape's meta, and an opaque payload of
// `n` bytes (the envelope does not read codec payloads; the codec does).
Chunk EncodedChunk(codec::CodecId id, size_t n) {
  Chunk c;
  c.meta = Meta(/*f16*/ 1, 2, 4, 8, 16);
  c.meta.codec = id;
  c.payload = chunk::Payload(n);
  std::mt19937 rng(static_cast<std::uint32_t>(n));
  for (auto& b : c.payload) b = static_cast<std::uint8_t>(rng());
  return c;
}

TEST(Envelope, EncodedPayloadsRoundTripWithTheirCodec) {
  for (std::uint32_t id = 1; id <= 8; ++id) {
    for (size_t n : {size_t{1}, size_t{77}, size_t{4096}}) {
      if (id == 8 && n < 48) continue;  // an encrypted payload holds its header and tag (below)
      const Chunk c = EncodedChunk(static_cast<codec::CodecId>(id), n);
      const Bytes b = Encode(c);
      EXPECT_EQ(b.size(), EncodedEnvelopeSize(n)) << id;
      Result<chunk::ChunkRef> r = Decode(b, &c.meta.key);
      ASSERT_TRUE(r.ok()) << id << ": " << r.status().message();
      EXPECT_EQ((*r)->meta.codec, c.meta.codec);
      ExpectSameChunk(**r, c);
    }
  }
  // A raw chunk's envelope is byte for byte what a 1.0 writer made: the
  // codec field stays 0, checked by the same exactness rules.
  const Chunk raw = SmallChunk();
  EXPECT_EQ(Encode(raw), Build(HeaderOf(raw), Span(raw.payload)));
}

TEST(Envelope, EncodedPayloadsAreCheckedForWhatTheEnvelopeCanCheck) {
  // The checksums cover an encoded payload and its codec as any other.
  const Chunk c = EncodedChunk(codec::CodecId::kInt8, 300);
  Bytes b = Encode(c);
  b[b.size() - 8 - 10] ^= 0x10;  // in the payload
  EXPECT_EQ(Decode(b).status().code(), Code::kCorrupt);
  // An empty encoded payload (a codec payload starts with a header).
  EnvelopeHeader h = HeaderOf(c);
  h.codec = 2;
  EXPECT_EQ(Decode(Build(h, {})).status().code(), Code::kCorrupt);
  // An encrypted payload shorter than its header and tag (wire/cipher.h).
  const Chunk short_encrypted = EncodedChunk(codec::CodecId::kEncrypted, 47);
  h = HeaderOf(short_encrypted);
  EXPECT_EQ(Decode(Build(h, Span(short_encrypted.payload))).status().code(), Code::kCorrupt);
  h = HeaderOf(c);
  // Written by a newer kdn: a codec value this reader does not know.
  h.codec = static_cast<std::uint16_t>(kLastKnownCodec + 1);
  Result<chunk::ChunkRef> r = Decode(Build(h, Span(c.payload)));
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
  // The writer refuses the same.
  Chunk bad = EncodedChunk(codec::CodecId::kInt8, 0);
  EXPECT_EQ(EncodeEnvelope(bad).status().code(), Code::kInvalidArgument);
  bad = EncodedChunk(static_cast<codec::CodecId>(9), 10);
  EXPECT_EQ(EncodeEnvelope(bad).status().code(), Code::kInvalidArgument);
  // A raw envelope still must match its shape exactly.
  h = HeaderOf(c);
  h.codec = 0;
  EXPECT_EQ(Decode(Build(h, Span(c.payload))).status().code(), Code::kCorrupt);
}

TEST(Envelope, UnknownDtypeAndChecksumAlgorithmAreUnsupported) {
  const Chunk c = SmallChunk();
  EnvelopeHeader h = HeaderOf(c);
  h.meta.dtype = 9;
  EXPECT_EQ(Decode(Build(h, Span(c.payload))).status().code(), Code::kUnsupported);
  h = HeaderOf(c);
  h.checksum_algorithm = 3;
  EXPECT_EQ(Decode(Build(h, Span(c.payload))).status().code(), Code::kUnsupported);
}

TEST(Envelope, EncodeRejectsAPayloadThatDoesNotMatchItsMeta) {
  Chunk c = SmallChunk();
  c.payload = chunk::Payload(c.payload.data(), c.payload.size() - 1);
  EXPECT_EQ(EncodeEnvelope(c).status().code(), Code::kInvalidArgument);
  c = SmallChunk();
  c.meta.dtype = 5;
  EXPECT_EQ(EncodeEnvelope(c).status().code(), Code::kInvalidArgument);
}

TEST(Envelope, EveryTruncationIsCorrupt) {
  const Chunk c = SmallChunk();
  const Bytes b = Encode(c);
  for (size_t n = 0; n < b.size(); ++n) {
    Result<chunk::ChunkRef> r = DecodeEnvelope(n ? b.data() : nullptr, n, nullptr);
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << n;
  }
  Bytes longer = b;
  longer.resize(b.size() + 8);
  EXPECT_EQ(Decode(longer).status().code(), Code::kCorrupt);
}

TEST(Envelope, EverySingleByteChangeIsDetected) {
  const Chunk c = SmallChunk();
  const Bytes b = Encode(c);
  for (size_t i = 0; i < b.size(); ++i) {
    for (std::uint8_t x : {0x01, 0x02, 0x10, 0x80, 0xFF}) {
      Bytes m = b;
      m[i] ^= x;
      Result<chunk::ChunkRef> r = Decode(m, &c.meta.key);
      EXPECT_FALSE(r.ok()) << "byte " << i << " ^ " << int{x} << " went unnoticed";
    }
  }
}

TEST(Envelope, RandomGarbageIsRejected) {
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 3000; ++i) {
    Bytes g(rng() % 600);
    for (auto& x : g) x = static_cast<std::uint8_t>(rng());
    if (i % 3 == 0 && g.size() >= 8) {
      // A plausible segment table, so the parser gets further.
      const std::uint32_t table[2] = {0, static_cast<std::uint32_t>(g.size() / 8 - 1)};
      std::memcpy(g.data(), table, sizeof table);
      g.resize(g.size() / 8 * 8);
    }
    Result<chunk::ChunkRef> r = Decode(g);
    EXPECT_FALSE(r.ok());
    EXPECT_TRUE(r.status().code() == Code::kCorrupt || r.status().code() == Code::kUnsupported)
        << r.status().message();
  }
}

// Thousands of random mutations of a valid envelope: a status every time,
// never a crash, and never a chunk other than the one encoded.
TEST(Envelope, RandomMutationsNeverCrashOrLie) {
  const Chunk c = MakeChunk(Meta(0, 2, 2, 4, 3));
  const Bytes b = Encode(c);
  std::mt19937_64 rng(99);
  int rejected = 0;
  for (int i = 0; i < 5000; ++i) {
    Bytes m = b;
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 4) {
        case 0: m[rng() % m.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8)); break;
        case 1: m[rng() % m.size()] = static_cast<std::uint8_t>(rng()); break;
        case 2: {  // overwrite a word with small integers: plausible pointers and sizes
          const size_t w = rng() % (m.size() / 8);
          const std::uint64_t v = rng() % 64;
          std::memcpy(m.data() + 8 * w + (rng() % 2) * 4, &v, 4);
          break;
        }
        case 3: m.resize(std::max<size_t>(8, m.size() - 8 * (1 + rng() % 3))); break;
      }
    }
    Result<chunk::ChunkRef> r = Decode(m, &c.meta.key);
    if (r.ok()) {
      ExpectSameChunk(**r, c);  // only a mutation that changed nothing may pass
      EXPECT_TRUE(m == b);
    } else {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 4900);
}

}  // namespace
}  // namespace kdn::wire

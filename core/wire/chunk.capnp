# SPDX-License-Identifier: Apache-2.0
# The chunk envelope: one stored chunk, self-describing and self-checking.
# It is what the disk tier writes as one file, and what remote tiers move as
# one value. Everything needed to check and decode the KV travels with it.
#
# Evolution rules (STYLE.md): a field takes the next ordinal; an ordinal is
# never renumbered nor reused. A writer that adds fields bumps versionMinor;
# older readers ignore fields they do not know (Cap'n Proto skips them). A
# change older readers must not accept (a different meaning for an existing
# field) bumps versionMajor, which they refuse as unsupported.
#
# Checks (checksumAlgorithm = xxh3, the only one in version 1):
# - `checksum` is XXH3-64 (seed 0) of the payload bytes (the pieces,
#   concatenated);
# - `headerChecksum` is XXH3-64 (seed 0) of the canonical header encoding:
#   little-endian, in this order: versionMajor u16, versionMinor u16,
#   model, namespaceHash, key (each as u64 length then bytes), codec u16,
#   dtype u16, layers u32, kvHeads u32, headDim u32, tokens u32,
#   firstPosition i64, edited u8 (0/1), payload length u64, checksum u64,
#   checksumAlgorithm u16. It covers the fields of version 1.0 only: fields
#   added later carry their own checks, so that an old reader can still
#   verify what it understands.
# - A version 1.0 message is exact: one segment, the struct at the sizes of
#   this schema, unused bits and padding zero. With the two checksums, every
#   bit of such a message is checked, so any single flipped bit is detected.
@0xf92e73377a36e3d6;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kdn::wire::schema");

# How the payload encodes the canonical KV ([layer][k|v][token][kv_head][head_dim]).
# The values are codec::CodecId's (core/codec/codec.h), pinned forever.
# Every codec but raw stores its own self-describing payload (a header that
# repeats the codec id, the shape and the dtype, then the encoded KV); the
# reader decodes it against this envelope's shape and dtype and refuses a
# payload whose header says anything else.
#
# Adding an enumerant (a new codec) does not change versionMinor: the
# message is still an exact 1.0 message, its codec covered by the header
# checksum, and a reader that does not know the value refuses the object as
# unsupported (the disk tier counts it as unreadable and removes it); it can
# never mistake it for raw KV. Envelopes of raw chunks stay byte for byte
# what 1.0 writers wrote.
enum Codec {
  raw @0;       # the canonical bytes themselves (no codec header)
  fp8 @1;       # e4m3 with per-token or per-head scales
  int8 @2;      # symmetric int8, one scale per (layer, k|v, token)
  kivi2 @3;     # 2-bit, keys per channel, values per token
  cachegen @4;  # LMCache's CacheGen, range-coded
  kdn @5;       # kdn's compressing codec
  zstd @6;      # lossless: byte planes compressed by zstd
  tc @7;        # kdn's transform codec (a per-model KLT profile)
  encrypted @8; # encrypted at rest (core/wire/cipher.h): the payload is a
                # header naming the codec it encrypts, the master key's id
                # and the nonce, then the AES-256-GCM ciphertext of that
                # codec's payload, then the tag. Readers before it refuse it
                # as an unknown codec: they never read ciphertext as KV.
}

# Element type of the KV (mirrors kdn_dtype).
enum DType {
  f32 @0;
  f16 @1;
  bf16 @2;
}

enum ChecksumAlgorithm {
  xxh3 @0;  # XXH3-64, seed 0 (see above)
}

struct ChunkEnvelope {
  versionMajor @0 :UInt16;    # 1; a reader refuses a newer major version
  versionMinor @1 :UInt16;    # 0; newer minors only add fields
  model @2 :Data;             # model fingerprint, 32 bytes
  namespaceHash @3 :Data;     # SHA-256 of the tenant namespace, 32 bytes
  key @4 :Data;               # the chunk's key (prefix or content key), 32 bytes
  codec @5 :Codec;
  dtype @6 :DType;
  shape :group {
    layers @7 :UInt32;
    kvHeads @8 :UInt32;
    headDim @9 :UInt32;
    tokens @10 :UInt32;
  }
  firstPosition @11 :Int64;   # position of the first token; -1 = position-free (always written)
  edited @12 :Bool;           # rewritten by an editor stage after it was stored
  # The encoded KV, in pieces to concatenate: a Cap'n Proto Data holds less
  # than 512 MiB (29-bit list sizes), a payload may hold more. Writers cut
  # pieces of exactly 256 MiB, the last one shorter; no piece is empty (an
  # empty payload has no pieces).
  payload @13 :List(Data);
  checksum @14 :UInt64;       # XXH3-64 of the payload
  checksumAlgorithm @15 :ChecksumAlgorithm;
  headerChecksum @16 :UInt64; # XXH3-64 of the canonical header encoding
}

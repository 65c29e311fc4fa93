# SPDX-License-Identifier: Apache-2.0
# Test only: the chunk envelope as a future minor version might extend it
# (core/wire/chunk.capnp plus fields at the next ordinals). Messages built
# with it must decode with today's reader, the new fields ignored.
@0xafd0a149aa0d35ec;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kdn::wire::next");

enum Codec {
  raw @0;
  fp8 @1;
  int8 @2;
  kivi2 @3;
  cachegen @4;
  kdn @5;
}

enum DType {
  f32 @0;
  f16 @1;
  bf16 @2;
}

enum ChecksumAlgorithm {
  xxh3 @0;
}

struct Provenance {
  engine @0 :Text;
  computedAtNs @1 :Int64;
}

struct ChunkEnvelope {
  versionMajor @0 :UInt16;
  versionMinor @1 :UInt16;
  model @2 :Data;
  namespaceHash @3 :Data;
  key @4 :Data;
  codec @5 :Codec;
  dtype @6 :DType;
  shape :group {
    layers @7 :UInt32;
    kvHeads @8 :UInt32;
    headDim @9 :UInt32;
    tokens @10 :UInt32;
  }
  firstPosition @11 :Int64;
  edited @12 :Bool;
  payload @13 :List(Data);
  checksum @14 :UInt64;
  checksumAlgorithm @15 :ChecksumAlgorithm;
  headerChecksum @16 :UInt64;
  # New in the imagined 1.1: a scalar (lands in the data section, some in
  # bits 1.0 leaves unused), a pointer, and a nested struct.
  pinned @17 :Bool;
  priority @18 :UInt32;
  provenance @19 :Provenance;
  tags @20 :List(Text);
}

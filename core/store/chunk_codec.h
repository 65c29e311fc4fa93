// SPDX-License-Identifier: Apache-2.0
// Chunks in a tier's codec: which codec a tier uses, and the two steps
// between a chunk's canonical KV and its stored form. A chunk whose
// meta.codec is kRaw holds the canonical bytes; any other chunk holds that
// codec's self-describing payload (codec/codec.h), and nothing reads its KV
// before DecodeChunk has turned it back into canonical bytes.
//
// Where these run (store/tiered_store.h): the chain encodes a chunk for a
// tier whose codec is not raw before it puts it there (on the mover thread
// for demotions, on the saving thread for a put that lands in that tier
// directly) and decodes what it reads from such a tier before anyone sees
// it. Raw chunks pass through both steps untouched: no copy.
// Thread-safety: pure functions, and codecs that are immutable.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/codec/codec.h"
#include "core/store/tier.h"
#include "core/util/status.h"

namespace kdn::store {

// The codec of host and device tiers unless configured: the engine reads
// them, and they hold what is hot.
inline constexpr std::string_view kDefaultHotCodec = "raw";
// The codec of disk (and later remote) tiers unless configured: lossless
// zstd ("zstd" = "zstd:level=3,shuffle=1"), so that a retrieve returns the
// bytes stored. kdn's compressing codec ("kdn") fits more chunks but is
// lossy: only a tier that names it (or another lossy codec) uses it, and
// loads report KV it served (ChunkMeta::lossy, KDN_RESULT_LOSSY).
inline constexpr std::string_view kDefaultColdCodec = "zstd";
// The same where the runtime has a GPU: raw. Lossless coding of KV buys
// 1.1-1.4x at best (zstd 1.16x on real KV), and zstd decodes on the CPU at
// a fraction of what a disk reads and the GPU prefills (issue 30: 0.38 GB/s
// on the H200's host, against a 262 ms prefill of 1 GiB of KV): it would
// make the disk slower, never faster (docs/gpu.md).
inline constexpr std::string_view kDefaultColdGpuCodec = "raw";
// The codec of redis tiers unless configured (issue 15): kdn's balanced
// preset, so that a chunk crosses the network compressed. Lossy, like any
// kdn codec: loads of KV such a tier served say so.
inline constexpr std::string_view kDefaultRedisCodec = "kdn:balanced";

// A tier's codec from its spec ("raw", "int8", "cachegen:bins=16",
// "kdn:hifi"); kInvalidArgument, naming the problem, for a spec that does
// not parse or names an unknown codec or parameter.
Result<std::shared_ptr<const codec::Codec>> MakeTierCodec(std::string_view spec);

// `chunk` (canonical KV) encoded by `codec`: a new chunk with the same meta
// but codec = codec.id() and the codec's payload. kInvalidArgument when the
// chunk is already encoded or its payload does not match its shape and
// dtype; the codec's own errors (e.g. non-finite KV) as it returns them.
Result<ChunkRef> EncodeChunk(const codec::Codec& codec, const Chunk& chunk);

// `stored` with its canonical KV: `stored` itself when raw, else a new chunk
// decoded from it (meta.codec = kRaw; meta.lossy when its codec is lossy,
// codec::IsLossy: zstd's chunks come back exact and unmarked). kCorrupt when the codec is one this
// build cannot decode, or the payload's own header disagrees with the
// chunk's shape, dtype or codec, or the payload fails to decode: such a
// chunk must be treated as unreadable (a miss), never as KV.
Result<ChunkRef> DecodeChunk(const ChunkRef& stored);

}  // namespace kdn::store

// SPDX-License-Identifier: Apache-2.0
#include "disk_cmd.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <vector>

#include "core/codec/codec.h"
#include "core/keys/hash.h"
#include "core/store/chunk_codec.h"
#include "core/tiers/disk_tier.h"

namespace kdn::tools {
namespace {

using store::Chunk;
using store::ChunkRef;
using store::DiskTier;

// One step of splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed,
// deterministic stream.
std::uint64_t SplitMix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

keys::Digest FillKey(std::uint64_t seed, std::uint64_t index) {
  keys::Hasher h;
  h.Str("kdn-disk-fill-v1").U64(seed).U64(index);
  return h.Finish();
}

keys::Digest NamedDigest(const char* name) {
  keys::Hasher h;
  h.Str(name);
  return h.Finish();
}

// Chunk `index` of a fill with `seed`: f32, one layer, one KV head, one
// token, head_dim = bytes / 8 (K and V of 4 bytes each), so the payload is
// exactly `bytes`. The index is stored as first_position, so that verify can
// recompute what an object must hold. `finite`: every 4 bytes a float in
// [-1, 1) from the same stream (for codecs, which refuse NaN and infinity);
// otherwise the stream's bytes as they are.
ChunkRef FillChunk(std::uint64_t seed, std::uint64_t index, std::uint64_t bytes, bool finite) {
  auto c = std::make_shared<Chunk>();
  c->meta.key = FillKey(seed, index);
  c->meta.model = NamedDigest("kdn-disk-fill-model");
  c->meta.ns_hash = NamedDigest("kdn-disk-fill");
  c->meta.dtype = 0;
  c->meta.layers = 1;
  c->meta.kv_heads = 1;
  c->meta.head_dim = static_cast<std::uint32_t>(bytes / 8);
  c->meta.tokens = 1;
  c->meta.first_position = static_cast<std::int64_t>(index);
  c->payload = store::Payload(bytes);
  std::uint64_t state = seed * 0xD1B54A32D192ED03ull ^ index;
  for (std::uint64_t off = 0; off < bytes; off += 8) {
    const std::uint64_t word = SplitMix64(state);
    if (finite) {
      const float pair[2] = {static_cast<float>(static_cast<std::int32_t>(word)) * 0x1p-31f,
                             static_cast<float>(static_cast<std::int32_t>(word >> 32)) * 0x1p-31f};
      std::memcpy(c->payload.data() + off, pair, 8);
    } else {
      std::memcpy(c->payload.data() + off, &word, 8);
    }
  }
  return c;
}

using CodecRef = std::shared_ptr<const codec::Codec>;

// The tier's codec; null for raw.
Result<CodecRef> ParseCodec(const std::string& spec) {
  Result<CodecRef> c = store::MakeTierCodec(spec);
  if (!c.ok()) return c.status();
  if ((*c)->id() == codec::CodecId::kRaw) return CodecRef();
  return c;
}

// A fill chunk as the tier stores it: encoded by `codec` (raw if it does
// not encode, as the chain does).
ChunkRef StoredForm(const ChunkRef& chunk, const CodecRef& codec) {
  if (!codec) return chunk;
  Result<ChunkRef> encoded = store::EncodeChunk(*codec, *chunk);
  return encoded.ok() ? std::move(encoded).value() : chunk;
}

// What a read of a fill chunk must give back: its bytes through the codec
// and back.
ChunkRef ExpectedRead(const ChunkRef& chunk, const CodecRef& codec) {
  Result<ChunkRef> decoded = store::DecodeChunk(StoredForm(chunk, codec));
  return decoded.ok() ? std::move(decoded).value() : nullptr;
}

Status CheckChunkBytes(std::uint64_t bytes) {
  if (bytes == 0 || bytes % 8 != 0 || bytes / 8 > std::numeric_limits<std::uint32_t>::max()) {
    return Status::InvalidArgument(
        "--chunk-bytes must be a positive multiple of 8 (each head_dim element is an f32 K and an f32 V)");
  }
  return Status::Ok();
}

Result<std::unique_ptr<DiskTier>> OpenTier(const std::string& dir, std::uint64_t capacity,
                                           store::FsyncPolicy fsync) {
  store::DiskTierOptions o;
  o.directory = dir;
  o.capacity_bytes = capacity;
  o.fsync = fsync;
  return DiskTier::Open(o);
}

store::FsyncPolicy ParseFsync(const std::string& s) {
  if (s == "none") return store::FsyncPolicy::kNone;
  if (s == "full") return store::FsyncPolicy::kFull;
  return store::FsyncPolicy::kData;
}

// The keys the tier holds, oldest use first: who to evict when it is full.
std::deque<keys::Digest> OldestFirst(const DiskTier& tier) {
  std::vector<store::ObjectInfo> objects = tier.List();
  std::sort(objects.begin(), objects.end(),
            [](const store::ObjectInfo& a, const store::ObjectInfo& b) { return a.last_use_ns < b.last_use_ns; });
  std::deque<keys::Digest> keys;
  for (const store::ObjectInfo& o : objects) keys.push_back(o.key);
  return keys;
}

// Puts a chunk, evicting the oldest objects it knows of while the tier is full.
Status PutEvicting(DiskTier& tier, const ChunkRef& chunk, std::deque<keys::Digest>& oldest) {
  for (;;) {
    const Status s = tier.Put(chunk);
    if (s.code() != Code::kBusy) return s;
    // Erase returns false for a key already gone (listed twice): try the next.
    bool evicted = false;
    while (!evicted && !oldest.empty()) {
      evicted = tier.Erase(oldest.front());
      oldest.pop_front();
    }
    if (!evicted) return Status(Code::kBusy, "a chunk does not fit even in the empty tier");
  }
}

// A progress line on stderr about every tenth of the way.
class Progress {
 public:
  explicit Progress(std::uint64_t total) : total_(total), step_(std::max<std::uint64_t>(1, total / 10)) {}
  void Update(std::uint64_t done, const DiskTier& tier) const {
    if (done % step_ != 0 && done != total_) return;
    std::fprintf(stderr, "kdn disk fill: %llu/%llu chunks, tier %.1f/%.1f MiB, %llu objects\n",
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                 static_cast<double>(tier.used_bytes()) / (1 << 20),
                 static_cast<double>(tier.capacity_bytes()) / (1 << 20),
                 static_cast<unsigned long long>(tier.objects()));
  }

 private:
  std::uint64_t total_, step_;
};

struct VerifyReport {
  std::uint64_t objects = 0, intact = 0, corrupt_detected = 0, returned_corrupt = 0, other_errors = 0;
  std::uint64_t usage_bytes = 0, capacity_bytes = 0;
};

// Whether a chunk the tier returned (decoded) holds exactly what fill wrote
// for it, through the codec and back.
bool MatchesFill(const Chunk& got, const keys::Digest& listed_key, std::uint64_t seed, const CodecRef& codec) {
  if (got.meta.first_position < 0 || !CheckChunkBytes(got.payload.size()).ok()) return false;
  const ChunkRef want = ExpectedRead(
      FillChunk(seed, static_cast<std::uint64_t>(got.meta.first_position), got.payload.size(), codec != nullptr), codec);
  if (!want) return false;
  return got.meta == want->meta && listed_key == want->meta.key &&
         std::memcmp(got.payload.data(), want->payload.data(), want->payload.size()) == 0;
}

VerifyReport Verify(DiskTier& tier, std::uint64_t seed, const CodecRef& codec) {
  VerifyReport r;
  r.usage_bytes = tier.used_bytes();  // as the restart found it
  r.capacity_bytes = tier.capacity_bytes();
  const std::vector<store::ObjectInfo> objects = tier.List();
  r.objects = objects.size();
  std::uint64_t undecodable = 0;
  for (const store::ObjectInfo& o : objects) {
    Result<ChunkRef> got = tier.Get(o.key);
    if (got.ok()) {
      Result<ChunkRef> decoded = store::DecodeChunk(*got);
      if (!decoded.ok()) {
        // Whole and checksummed, yet not a payload of its codec: detected,
        // removed (as the chain does), never returned.
        ++undecodable;
        tier.Erase(o.key);
        continue;
      }
      got = std::move(decoded).value();
    }
    if (got.ok() && MatchesFill(**got, o.key, seed, codec)) {
      ++r.intact;
    } else if (got.ok()) {
      ++r.returned_corrupt;
    } else if (got.status().code() != Code::kNotFound) {
      ++r.other_errors;
      std::fprintf(stderr, "kdn disk verify: %s\n", got.status().message().c_str());
    }
  }
  r.corrupt_detected = tier.counters().corrupt_detected + undecodable;
  return r;
}

}  // namespace

int RunDiskFill(const DiskFillOptions& options) {
  if (Status s = CheckChunkBytes(options.chunk_bytes); !s.ok()) {
    std::fprintf(stderr, "kdn disk fill: %s\n", s.message().c_str());
    return 2;
  }
  Result<std::unique_ptr<DiskTier>> tier = OpenTier(options.dir, options.capacity, ParseFsync(options.fsync));
  if (!tier.ok()) {
    std::fprintf(stderr, "kdn disk fill: %s\n", tier.status().message().c_str());
    return 2;
  }
  Result<CodecRef> codec = ParseCodec(options.codec);
  if (!codec.ok()) {
    std::fprintf(stderr, "kdn disk fill: %s\n", codec.status().message().c_str());
    return 2;
  }
  DiskTier& t = **tier;
  std::deque<keys::Digest> oldest = OldestFirst(t);
  const Progress progress(options.chunks);
  for (std::uint64_t i = 0; i < options.chunks; ++i) {
    const ChunkRef chunk = StoredForm(FillChunk(options.seed, i, options.chunk_bytes, *codec != nullptr), *codec);
    if (Status s = PutEvicting(t, chunk, oldest); !s.ok()) {
      std::fprintf(stderr, "kdn disk fill: chunk %llu: %s\n", static_cast<unsigned long long>(i), s.message().c_str());
      return 2;
    }
    oldest.push_back(chunk->meta.key);
    progress.Update(i + 1, t);
  }
  return 0;
}

int RunDiskVerify(const DiskVerifyOptions& options) {
  Result<CodecRef> codec = ParseCodec(options.codec);
  if (!codec.ok()) {
    std::fprintf(stderr, "kdn disk verify: %s\n", codec.status().message().c_str());
    return 2;
  }
  Result<std::unique_ptr<DiskTier>> tier = OpenTier(options.dir, options.capacity, store::FsyncPolicy::kData);
  if (!tier.ok()) {
    std::fprintf(stderr, "kdn disk verify: %s\n", tier.status().message().c_str());
    return 2;
  }
  const VerifyReport r = Verify(**tier, options.seed, *codec);
  if (options.json) {
    const nlohmann::json j = {{"objects", r.objects},
                              {"intact", r.intact},
                              {"corrupt_detected", r.corrupt_detected},
                              {"returned_corrupt", r.returned_corrupt},
                              {"usage_bytes", r.usage_bytes},
                              {"capacity_bytes", r.capacity_bytes}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%llu objects: %llu intact, %llu corrupt (detected and removed), %llu wrong bytes returned; "
                "usage %llu of %llu bytes\n",
                static_cast<unsigned long long>(r.objects), static_cast<unsigned long long>(r.intact),
                static_cast<unsigned long long>(r.corrupt_detected),
                static_cast<unsigned long long>(r.returned_corrupt),
                static_cast<unsigned long long>(r.usage_bytes), static_cast<unsigned long long>(r.capacity_bytes));
  }
  if (r.other_errors > 0) return 2;
  return r.returned_corrupt > 0 || r.usage_bytes > r.capacity_bytes ? 1 : 0;
}

DiskCommand::DiskCommand(CLI::App& app) {
  CLI::App* disk = app.add_subcommand("disk", "Disk tier: fill a directory, verify it after a crash");
  disk->require_subcommand(1);

  fill_cmd_ = disk->add_subcommand("fill", "Write deterministic chunks through a disk tier (safe to kill)");
  fill_cmd_->add_option("--dir", fill_.dir, "tier directory")->required();
  fill_cmd_->add_option("--chunks", fill_.chunks, "chunks to write")->required();
  fill_cmd_->add_option("--chunk-bytes", fill_.chunk_bytes, "payload bytes per chunk, a multiple of 8")
      ->capture_default_str();
  fill_cmd_->add_option("--seed", fill_.seed, "seed of the chunks' keys and bytes")->required();
  fill_cmd_->add_option("--capacity", fill_.capacity, "tier capacity in bytes (the oldest are evicted)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  fill_cmd_->add_option("--fsync", fill_.fsync, "fsync policy: none, data or full")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "data", "full"}));
  fill_cmd_->add_option("--codec", fill_.codec, "store chunks encoded with this codec (e.g. int8, kdn)")
      ->capture_default_str();

  verify_cmd_ = disk->add_subcommand("verify", "Reopen a tier directory and check every object in it");
  verify_cmd_->add_option("--dir", verify_.dir, "tier directory")->required();
  verify_cmd_->add_option("--seed", verify_.seed, "the seed fill used")->required();
  verify_cmd_->add_option("--capacity", verify_.capacity, "tier capacity in bytes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  verify_cmd_->add_flag("--json", verify_.json, "print one JSON object");
  verify_cmd_->add_option("--codec", verify_.codec, "the codec fill used")->capture_default_str();
}

}  // namespace kdn::tools

// SPDX-License-Identifier: Apache-2.0
// What a tier is made from: TierSpec (the kind, its capacity, address,
// codec, policy and watermarks), the one place its rules are checked
// (ValidateTierSpec: the C ABI and kdnd's config call it), and the factory
// that makes the concrete tier (MakeTier): the engine above knows tiers only
// through this and store/tier.h.
// Thread-safety: pure functions, apart from the tiers MakeTier opens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/wire/cipher.h"
#include "core/wire/seal.h"
#include "core/device/device.h"
#include "core/store/policy.h"
#include "core/store/tier.h"
#include "core/store/tiered_store.h"
#include "core/util/status.h"

namespace kdn::store {

struct TierSpec {
  enum class Kind { kHost, kDevice, kDisk, kRemote, kRedis };
  Kind kind = Kind::kHost;
  std::uint64_t capacity_bytes = std::uint64_t{1} << 30;
  std::string path;  // disk: the directory
  // remote: a kdnd's address ("host:port", "unix:/path"), a bearer token it
  // takes, and the deadline of each call (tiers/remote_tier.h).
  std::string address, token;
  std::uint32_t timeout_ms = 2000;
  // remote over TLS: the PEM certificate(s) to trust, and the name the
  // node's certificate must carry (empty: the address's host).
  std::string tls_ca_file, tls_server_name;
  // redis (tiers/redis_tier.h): `address` is the seeds, "host:port" of one
  // node or more, comma-separated (of a cluster: any of its nodes); `token`
  // the password (empty: no AUTH) and `user` the ACL user (empty: the
  // password alone); timeout_ms the deadline of each command. Keys are
  // key_prefix + the chunk key's hex; ttl_ms 0: they do not expire.
  std::string user;
  std::string key_prefix = "kdn:";
  std::uint64_t ttl_ms = 0;
  std::uint32_t connect_timeout_ms = 500;
  PolicyKind policy = PolicyKind::kLru;
  double high_watermark = 0.95, low_watermark = 0.85;
  bool write_through = false;
  bool fsync = true;  // disk: fsync each object before it becomes visible (off: faster, not crash-safe)
  // How the tier stores chunks: a codec spec (codec/codec.h: "raw", "int8",
  // "cachegen:bins=16", "kdn:hifi", ...). Empty: the kind's default, raw for
  // host and device tiers (kDefaultHotCodec), lossless zstd for disk and
  // remote tiers (kDefaultColdCodec, store/chunk_codec.h; raw where the
  // runtime has a GPU: kDefaultColdGpuCodec), kdn:balanced for
  // redis tiers (kDefaultRedisCodec: chunks cross the network compressed;
  // lossy, so such a tier's loads are flagged lossy); otherwise a lossy
  // codec only if named.
  // A spec that does not parse or names an unknown codec fails
  // KvStore::Create with kInvalidArgument.
  // KvStore::options() reports the codec each tier actually uses.
  std::string codec;
  // Remote and redis tiers: quality levels, codec specs finest first (store/
  // leveled_tier.h): every chunk is kept at each, and a load with a target
  // (ReadContext::target) fetches each chunk at the finest level that meets it.
  // With levels, `codec` must be empty (the chain's codec for the tier is raw).
  std::vector<std::string> levels;
  // Namespaces' quotas in this tier (store/tiered_store.h, NamespaceQuota):
  // the most bytes each namespace's chunks may take here. Not for remote
  // tiers (a kdnd keeps its own quotas, in its config).
  struct Quota {
    std::string ns;
    std::uint64_t bytes = 0;
  };
  std::vector<Quota> quotas;
};

// The watermark rule of every front end (the C ABI, kdnd's config, C++
// callers through KvStore::Create): 0 < low <= high <= 1; low == high evicts
// exactly down to the mark.
Status CheckWatermarks(double high, double low);
// The low watermark of a spec that names only the high one.
inline double DefaultLowWatermark(double high) { return high < 0.85 ? high : 0.85; }
// The deadline of a remote or redis tier's calls when none is given.
inline constexpr std::uint32_t kDefaultTierTimeoutMs = 2000;

// Checks a spec on its own (what every kind requires and refuses: a disk
// tier's path, a remote tier's address and token, a redis tier's seeds, TLS
// only for remote tiers, levels only for remote and redis tiers and then no
// codec, no NUL byte in a string, the watermarks). kInvalidArgument with a
// message that names the field. Opens nothing: MakeTier checks the rest
// (a codec that does not parse, a directory it cannot open).
Status ValidateTierSpec(const TierSpec& spec);

// Quality levels written as one string, codec specs separated by ';'
// ("raw; kdn:balanced; kdn:compact"), spaces around each trimmed: the list,
// or kInvalidArgument for an empty level.
Result<std::vector<std::string>> ParseLevels(std::string_view text);

// The tier a spec describes (index: its place in the chain, for errors).
// chunk_tokens: the store's chunk size, which a remote tier tells its node
// with each lookup (0: not told). A device tier's memory is `device`'s (the
// emulated device's: host memory); without one, the GPU's when one is
// usable, else emulated.
// `sealer`: the deployment secret's (StoreOptions::secret_file), for the
// tiers that others can write (redis, disk); null: none.
// `cipher`: the master keys (StoreOptions::encryption_key_file, wire/
// cipher.h), for the tiers whose chunks leave the process (disk, redis,
// remote); null: none. `node`: a node's tiers, which keep what they cannot
// decrypt as it is (wire::FromRest pass_through).
Result<std::unique_ptr<Tier>> MakeTier(const TierSpec& spec, size_t index, std::uint64_t chunk_tokens = 0,
                                       const Device* device = nullptr,
                                       std::shared_ptr<const wire::ChunkSealer> sealer = nullptr,
                                       std::shared_ptr<const wire::ChunkCipher> cipher = nullptr, bool node = false);
// The chain level of a spec's tier (policy, watermarks, write-through; no codec).
LevelOptions LevelFor(const TierSpec& spec, std::unique_ptr<Tier> tier);

// About what `bytes` of chunk payload cost in a spec's tier before it holds
// them: a memory tier's slab class, the bytes themselves elsewhere (disk,
// remote and redis tiers store them encoded, near that size or less).
std::uint64_t EstimatedCost(const TierSpec& spec, std::uint64_t bytes);

// The codec spec a tier of `kind` uses when its TierSpec::codec is empty.
// `gpu`: the runtime has a CUDA device (not the emulated one). Its disk and
// remote tiers then default to raw (kDefaultColdGpuCodec): the CPU's zstd
// decode is slower than the disk and than the GPU's prefill (docs/gpu.md
// "The disk tier's default with a GPU").
std::string_view DefaultTierCodec(TierSpec::Kind kind, bool gpu = false);

}  // namespace kdn::store

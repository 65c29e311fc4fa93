// SPDX-License-Identifier: Apache-2.0
#include "core/tiers/tier_spec.h"

#include <algorithm>
#include <string>

#include "core/store/chunk_codec.h"
#include "core/tiers/disk_tier.h"
#include "core/tiers/host_pool.h"
#include "core/tiers/leveled_tier.h"
#include "core/tiers/memory_tier.h"
#include "core/tiers/redis_tier.h"
#include "core/tiers/remote_tier.h"
#include "core/wire/node_client.h"

namespace kdn::store {

namespace {

// A remote or redis tier with quality levels keeps them through a LeveledTier.
Result<std::unique_ptr<Tier>> WithLevels(const TierSpec& spec, size_t index, std::unique_ptr<Tier> tier) {
  if (spec.levels.empty()) return tier;
  auto t = LeveledTier::Create(std::move(tier), spec.levels);
  if (!t.ok()) return Status(t.status().code(), "tier " + std::to_string(index) + ": " + t.status().message());
  return std::unique_ptr<Tier>(std::move(t).value());
}

}  // namespace

Result<std::unique_ptr<Tier>> MakeTier(const TierSpec& spec, size_t index, std::uint64_t chunk_tokens,
                                       const Device* device, std::shared_ptr<const wire::ChunkSealer> sealer,
                                       std::shared_ptr<const wire::ChunkCipher> cipher, bool node) {
  switch (spec.kind) {
    case TierSpec::Kind::kHost: {
      auto t = MemoryTier::Create("host", spec.capacity_bytes, MemoryKind::kPinnedHost);
      if (!t.ok()) return t.status();
      return std::unique_ptr<Tier>(std::move(t).value());
    }
    case TierSpec::Kind::kDevice: {
      const bool real = device != nullptr ? !device->emulated() : GpuPresent();
      auto t = MemoryTier::Create("device", spec.capacity_bytes, real ? MemoryKind::kDevice : MemoryKind::kDeviceEmulated);
      if (!t.ok()) return t.status();
      return std::unique_ptr<Tier>(std::move(t).value());
    }
    case TierSpec::Kind::kDisk: {
      if (spec.path.empty()) return Status::InvalidArgument("tier " + std::to_string(index) + ": disk tier needs a directory");
      DiskTierOptions o;
      o.directory = spec.path;
      o.capacity_bytes = spec.capacity_bytes;
      o.name = "disk";
      o.fsync = spec.fsync ? FsyncPolicy::kData : FsyncPolicy::kNone;
      o.sealer = sealer;
      o.cipher = cipher;
      o.pass_through_encrypted = node;
      auto t = DiskTier::Open(o);
      if (!t.ok()) return t.status();
      return std::unique_ptr<Tier>(std::move(t).value());
    }
    case TierSpec::Kind::kRemote: {
      RemoteTierOptions o;
      o.address = spec.address;
      o.token = spec.token;
      o.timeout_ms = spec.timeout_ms;
      o.tls_ca_file = spec.tls_ca_file;
      o.tls_server_name = spec.tls_server_name;
      o.chunk_tokens = chunk_tokens;
      o.sealer = sealer;
      o.cipher = cipher;
      auto t = RemoteTier::Create(o);
      if (!t.ok()) return Status(t.status().code(), "tier " + std::to_string(index) + ": " + t.status().message());
      return WithLevels(spec, index, std::move(t).value());
    }
    case TierSpec::Kind::kRedis: {
      RedisTierOptions o;
      auto seeds = ParseRedisSeeds(spec.address);
      if (!seeds.ok()) return Status(seeds.status().code(), "tier " + std::to_string(index) + ": " + seeds.status().message());
      o.client.seeds = std::move(seeds).value();
      o.client.user = spec.user;
      o.client.password = spec.token;
      o.client.command_timeout_ms = spec.timeout_ms;
      o.client.connect_timeout_ms = std::min(spec.connect_timeout_ms, spec.timeout_ms);
      o.key_prefix = spec.key_prefix;
      o.ttl_ms = spec.ttl_ms;
      o.hint_ms = std::max<std::uint32_t>(spec.timeout_ms, 1000);
      o.sealer = std::move(sealer);
      o.cipher = std::move(cipher);
      o.pass_through_encrypted = node;
      auto t = RedisTier::Create(o);
      if (!t.ok()) return Status(t.status().code(), "tier " + std::to_string(index) + ": " + t.status().message());
      return WithLevels(spec, index, std::move(t).value());
    }
  }
  return Status::InvalidArgument("unknown tier kind");
}

LevelOptions LevelFor(const TierSpec& spec, std::unique_ptr<Tier> tier) {
  LevelOptions lo;
  lo.tier = std::move(tier);
  lo.policy = spec.policy;
  lo.high_watermark = spec.high_watermark;
  lo.low_watermark = spec.low_watermark;
  lo.write_through = spec.write_through;
  for (const TierSpec::Quota& q : spec.quotas) lo.quotas.push_back({keys::NamespaceHash(q.ns), q.bytes});
  return lo;
}

Status CheckWatermarks(double high, double low) {
  if (!(low > 0 && low <= high && high <= 1.0)) {
    return Status::InvalidArgument("watermarks must satisfy 0 < low <= high <= 1 (high " + std::to_string(high) +
                                   ", low " + std::to_string(low) + ")");
  }
  return Status::Ok();
}

namespace {

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

}  // namespace

Status ValidateTierSpec(const TierSpec& spec) {
  using Kind = TierSpec::Kind;
  const bool remote = spec.kind == Kind::kRemote, redis = spec.kind == Kind::kRedis;
  if (spec.capacity_bytes == 0) return Status::InvalidArgument("capacity_bytes is 0");
  switch (spec.kind) {
    case Kind::kHost:
    case Kind::kDevice: break;
    case Kind::kDisk:
      if (spec.path.empty()) return Status::InvalidArgument("a disk tier needs a path (the directory of its objects)");
      // The file system would see only the part before it.
      if (HasNul(spec.path)) return Status::InvalidArgument("path contains a NUL byte");
      break;
    case Kind::kRemote:
      if (spec.address.empty()) return Status::InvalidArgument("a remote tier needs an address");
      if (spec.token.empty()) return Status::InvalidArgument("a remote tier needs a token");
      break;
    case Kind::kRedis:
      if (spec.address.empty()) return Status::InvalidArgument("a redis tier needs an address (host:port,...)");
      if (!spec.user.empty() && spec.token.empty()) {
        return Status::InvalidArgument("a redis user needs a password (token)");
      }
      break;
    default: return Status::InvalidArgument("unknown tier kind");
  }
  if (HasNul(spec.address) || HasNul(spec.token) || HasNul(spec.user)) {
    return Status::InvalidArgument("address, token or user contains a NUL byte");
  }
  if (remote) KDN_RETURN_IF_ERROR(wire::CheckNodeAddress(spec.address));
  if ((!spec.tls_ca_file.empty() || !spec.tls_server_name.empty()) && redis) {
    return Status::InvalidArgument("a redis tier has no TLS (tls_ca_file, tls_server_name)");
  }
  if (HasNul(spec.tls_ca_file) || HasNul(spec.tls_server_name)) {
    return Status::InvalidArgument("a TLS field contains a NUL byte");
  }
  if ((!spec.user.empty() || spec.ttl_ms != 0) && !redis) {
    return Status::InvalidArgument("user and ttl_ms are for redis tiers only");
  }
  if ((remote || redis) && spec.timeout_ms == 0) return Status::InvalidArgument("timeout_ms is 0");
  KDN_RETURN_IF_ERROR(CheckWatermarks(spec.high_watermark, spec.low_watermark));
  if (!spec.quotas.empty()) {
    if (remote) return Status::InvalidArgument("quotas are not for a remote tier (set them in the kdnd's config)");
    std::vector<std::string> seen;
    for (const TierSpec::Quota& q : spec.quotas) {
      if (q.ns.size() > 4096) return Status::InvalidArgument("a quota's namespace is longer than 4096 bytes");
      if (std::find(seen.begin(), seen.end(), q.ns) != seen.end()) {
        return Status::InvalidArgument("two quotas for the namespace '" + q.ns + "'");
      }
      seen.push_back(q.ns);
    }
  }
  if (!spec.levels.empty()) {
    if (!remote && !redis) return Status::InvalidArgument("quality levels are for remote and redis tiers");
    if (!spec.codec.empty() && spec.codec != "raw") {
      return Status::InvalidArgument("a tier with quality levels takes no codec (its levels are its codecs)");
    }
    for (const std::string& level : spec.levels) {
      if (level.empty()) return Status::InvalidArgument("an empty quality level");
    }
  }
  return Status::Ok();
}

Result<std::vector<std::string>> ParseLevels(std::string_view all) {
  std::vector<std::string> levels;
  size_t at = 0;
  while (at <= all.size()) {
    size_t end = all.find(';', at);
    if (end == std::string_view::npos) end = all.size();
    std::string_view level = all.substr(at, end - at);
    while (!level.empty() && level.front() == ' ') level.remove_prefix(1);
    while (!level.empty() && level.back() == ' ') level.remove_suffix(1);
    if (level.empty()) return Status::InvalidArgument("an empty level in '" + std::string(all) + "'");
    levels.emplace_back(level);
    at = end + 1;
  }
  return levels;
}

std::uint64_t EstimatedCost(const TierSpec& spec, std::uint64_t bytes) {
  const bool memory = spec.kind == TierSpec::Kind::kHost || spec.kind == TierSpec::Kind::kDevice;
  return memory ? HostPool::ClassSize(bytes) : bytes;
}

std::string_view DefaultTierCodec(TierSpec::Kind kind, bool gpu) {
  switch (kind) {
    case TierSpec::Kind::kHost:
    case TierSpec::Kind::kDevice: return kDefaultHotCodec;
    case TierSpec::Kind::kDisk:
    case TierSpec::Kind::kRemote: return gpu ? kDefaultColdGpuCodec : kDefaultColdCodec;
    case TierSpec::Kind::kRedis: return kDefaultRedisCodec;
  }
  return kDefaultHotCodec;
}

}  // namespace kdn::store

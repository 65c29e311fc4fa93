// SPDX-License-Identifier: Apache-2.0
// `kdn bench redis`: the Redis tier (tiers/redis_tier.h) against
// redis-server processes started here on loopback (redis/local_servers.h):
// one node, and a cluster of 3 masters without replicas (a replica would
// share the same cores and slow both sides alike). Each measure has a
// baseline doing the same work under the same guarantee in the same run:
// plain hiredis (blocking redisCommand, or redisAppendCommand for a
// pipeline), one connection per node, each key sent to its slot's master as
// one CLUSTER SLOTS reply maps it.
// Thread-safety: RunRedisBench runs on one thread; the runtimes it makes run
// their own fetch threads.
#include "bench/redis_bench.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/bench_kv.h"
#include "bench/bench_util.h"
#include "core/redis/client.h"
#include "core/redis/local_servers.h"
#include "core/tiers/redis_tier.h"
#include "core/runtime/runtime.h"

namespace kdn::bench {
namespace {

namespace local = redis::local;
using chunk::ChunkRef;

// Generous for a 32 MiB value on a loaded machine; both sides use it.
constexpr std::uint32_t kTimeoutMs = 20000;
// Each server's memory; keys are deleted between phases.
constexpr const char* kMaxMemory = "1gb";
constexpr size_t kLookupChunks = 512;

// ---------------------------------------------------------------- raw hiredis

struct ReplyFree {
  void operator()(redisReply* r) const {
    if (r != nullptr) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

// Plain hiredis connections, one per master, and the slot map of one CLUSTER
// SLOTS reply (a server without cluster mode: every slot is its own).
class RawRedis {
 public:
  // Connects to the node at 127.0.0.1:`port` and through its slot map to
  // every master; null, saying why, on failure.
  static std::unique_ptr<RawRedis> Connect(int port, std::string* why) {
    std::unique_ptr<RawRedis> r(new RawRedis);
    redisContext* seed = r->Dial("127.0.0.1", port, why);
    if (seed == nullptr) return nullptr;
    Reply slots(static_cast<redisReply*>(redisCommand(seed, "CLUSTER SLOTS")));
    if (!slots) {
      *why = "CLUSTER SLOTS: no reply";
      return nullptr;
    }
    if (slots->type == REDIS_REPLY_ERROR) {  // not a cluster
      r->slot_.fill(seed);
      return r;
    }
    for (size_t i = 0; slots->type == REDIS_REPLY_ARRAY && i < slots->elements; ++i) {
      const redisReply* e = slots->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[2]->type != REDIS_REPLY_ARRAY ||
          e->element[2]->elements < 2) {
        continue;
      }
      const redisReply* master = e->element[2];
      const std::string host(master->element[0]->str, master->element[0]->len);
      redisContext* c = r->Dial(host, static_cast<int>(master->element[1]->integer), why);
      if (c == nullptr) return nullptr;
      for (long long s = e->element[0]->integer; s <= e->element[1]->integer && s < 16384; ++s) {
        r->slot_[static_cast<size_t>(s)] = c;
      }
    }
    if (std::find(r->slot_.begin(), r->slot_.end(), nullptr) != r->slot_.end()) {
      *why = "CLUSTER SLOTS leaves slots without a master";
      return nullptr;
    }
    return r;
  }
  ~RawRedis() {
    for (auto& [addr, c] : by_addr_) redisFree(c);
  }

  redisContext* For(std::string_view key) const { return slot_[redis::KeySlot(key)]; }
  size_t nodes() const { return by_addr_.size(); }

  // SET key value, one call; whether the server said OK.
  bool Set(const std::string& key, const std::uint8_t* data, size_t size) const {
    Reply r(static_cast<redisReply*>(redisCommand(For(key), "SET %b %b", key.data(), key.size(), data, size)));
    return r && r->type == REDIS_REPLY_STATUS;
  }
  // GET key, one call: the reply (a string when the key is there), or null.
  Reply Get(const std::string& key) const {
    return Reply(static_cast<redisReply*>(redisCommand(For(key), "GET %b", key.data(), key.size())));
  }
  // `command` ("EXISTS", "GET", "STRLEN") of every key, pipelined: appended
  // to each key's node, every node's pipeline written, then each node's
  // replies read. The replies in key order (null where one failed).
  std::vector<Reply> Pipelined(const char* command, std::span<const std::string> keys) const {
    std::map<redisContext*, std::vector<size_t>> order;
    const std::string format = std::string(command) + " %b";
    for (size_t i = 0; i < keys.size(); ++i) {
      redisContext* c = For(keys[i]);
      if (redisAppendCommand(c, format.c_str(), keys[i].data(), keys[i].size()) == REDIS_OK) order[c].push_back(i);
    }
    for (auto& [c, idx] : order) {
      int done = 0;
      while (!done && redisBufferWrite(c, &done) == REDIS_OK) {
      }
    }
    std::vector<Reply> out(keys.size());
    for (auto& [c, idx] : order) {
      for (size_t i : idx) {
        void* r = nullptr;
        if (redisGetReply(c, &r) != REDIS_OK) break;
        out[i].reset(static_cast<redisReply*>(r));
      }
    }
    return out;
  }
  // FLUSHALL on every master: the phase's keys gone (not timed).
  bool FlushAll() const {
    bool ok = true;
    for (const auto& [addr, c] : by_addr_) {
      Reply r(static_cast<redisReply*>(redisCommand(c, "FLUSHALL")));
      ok = ok && r && r->type == REDIS_REPLY_STATUS;
    }
    return ok;
  }

 private:
  RawRedis() = default;
  redisContext* Dial(const std::string& host, int port, std::string* why) {
    const std::string addr = host + ":" + std::to_string(port);
    if (auto it = by_addr_.find(addr); it != by_addr_.end()) return it->second;
    const timeval tv{kTimeoutMs / 1000, (kTimeoutMs % 1000) * 1000};
    redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
    if (c == nullptr || c->err != 0) {
      *why = "cannot connect to " + addr + (c != nullptr ? std::string(": ") + c->errstr : std::string());
      if (c != nullptr) redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    by_addr_[addr] = c;
    return c;
  }

  std::map<std::string, redisContext*> by_addr_;
  std::array<redisContext*, 16384> slot_{};
};

// ---------------------------------------------------------------- servers

// A topology under test: its seed, the raw connections to it, what it is.
struct Target {
  const char* name;  // "single", "cluster"
  int port = 0;
  std::string description;
  std::unique_ptr<RawRedis> raw;
  std::string seed() const { return "127.0.0.1:" + std::to_string(port); }
};

// Alternates which side runs first, after one warm-up run of each (r = -1:
// connections made, buffers grown); each side returns ms, or < 0 on failure.
// False when a side failed.
bool Alternate(int repeats, const std::function<double()>& a, const std::function<double()>& b,
               std::vector<double>* ta, std::vector<double>* tb) {
  for (int r = -1; r < repeats; ++r) {
    const bool a_first = r % 2 == 0;
    const double x = a_first ? a() : b();
    const double y = a_first ? b() : a();
    if (x < 0 || y < 0) return false;
    if (r >= 0) {
      ta->push_back(a_first ? x : y);
      tb->push_back(a_first ? y : x);
    }
  }
  return true;
}

nlohmann::json TargetParams(const Target& t, int repeats) {
  return {{"servers", t.description},
          {"masters", t.raw->nodes()},
          {"repeats", repeats},
          {"cores", std::thread::hardware_concurrency()},
          {"transport", "TCP on loopback (127.0.0.1); redis-server started by the bench, maxmemory " +
                            std::string(kMaxMemory) + ", no persistence"},
          {"baseline_client", "plain hiredis 0.14 (blocking redisCommand; redisAppendCommand + redisBufferWrite + "
                              "redisGetReply for a pipeline), one connection per master, keys routed by "
                              "redis::KeySlot over one CLUSTER SLOTS reply"}};
}

// ---------------------------------------------------------------- runtimes

// A runtime whose only tier is the redis tier at `seed`.
Result<std::shared_ptr<store::Runtime>> RedisRuntime(const std::string& seed, const std::string& codec) {
  return OneTierRuntime(store::TierSpec::Kind::kRedis, seed, codec, "", kTimeoutMs);
}

// The Redis keys of the whole chunks of `tokens` as a store with options
// `o` (its first tier the redis tier) keeps them in namespace `ns`.
std::vector<std::string> ChainKeys(const store::StoreOptions& o, std::string_view ns, const keys::Digest& model,
                                   std::span<const std::int32_t> tokens) {
  const keys::ChunkKeyer keyer(o.hash_seed, ns, model);  // as the store hashes them
  std::vector<std::string> out;
  keys::Digest prev{};
  for (size_t pos = 0; tokens.size() - pos >= o.chunk_tokens; pos += o.chunk_tokens) {
    prev = keyer.Key(prev, tokens.subspan(pos, o.chunk_tokens));
    out.push_back(o.tiers.front().key_prefix + keys::ToHex(prev));
  }
  return out;
}

// ---------------------------------------------------------------- put / get

// Puts and gets of `set` through a RedisTier made with RedisTierOptions as a
// user gets them but for the seed (and timeouts), against raw hiredis SET and
// GET of the same envelope bytes under the same keys.
int PutGet(const ChunkSet& set, Target& t, int repeats, Records& out) {
  // A run of small chunks is short (tens of ms): three times the runs.
  const int runs = set.shape.chunk_bytes() < (std::uint64_t{1} << 20) ? 3 * repeats : repeats;
  store::RedisTierOptions o;
  o.client.seeds = {t.seed()};
  o.client.command_timeout_ms = kTimeoutMs;
  auto tier_or = store::RedisTier::Create(o);
  if (!tier_or.ok()) {
    std::fprintf(stderr, "bench: redis tier: %s\n", tier_or.status().message().c_str());
    return 2;
  }
  store::RedisTier& tier = **tier_or;
  const size_t n = set.chunks.size();
  const std::uint64_t env = set.envelope_bytes();
  std::vector<std::string> names(n);
  for (size_t i = 0; i < n; ++i) names[i] = tier.KeyOf(set.chunks[i]->meta.key);
  const RawRedis& raw = *t.raw;
  auto fail = [&](const char* what) {
    std::fprintf(stderr, "bench: %s (%s, %s)\n", what, set.shape.suffix, t.name);
    return -1.0;
  };

  auto tier_put = [&]() -> double {
    const double t0 = NowMs();
    for (const ChunkRef& c : set.chunks) {
      if (!tier.Put(c).ok()) return fail("RedisTier::Put failed");
    }
    const double ms = NowMs() - t0;
    return raw.FlushAll() ? ms : fail("FLUSHALL failed");
  };
  auto raw_put = [&]() -> double {
    const double t0 = NowMs();
    for (size_t i = 0; i < n; ++i) {
      if (!raw.Set(names[i], set.envelopes[i].data(), env)) return fail("raw SET failed");
    }
    const double ms = NowMs() - t0;
    return raw.FlushAll() ? ms : fail("FLUSHALL failed");
  };
  std::vector<ChunkRef> got(n);
  auto tier_get = [&]() -> double {
    const double t0 = NowMs();
    for (size_t i = 0; i < n; ++i) {
      Result<ChunkRef> r = tier.Get(set.chunks[i]->meta.key);
      if (!r.ok()) return fail("RedisTier::Get missed");
      got[i] = std::move(r).value();
    }
    const double ms = NowMs() - t0;
    for (size_t i = 0; i < n; ++i) {
      if (!(got[i]->meta == set.chunks[i]->meta) || got[i]->payload.size() != set.chunks[i]->payload.size() ||
          std::memcmp(got[i]->payload.data(), set.chunks[i]->payload.data(), got[i]->payload.size()) != 0) {
        return fail("RedisTier::Get returned other bytes");
      }
    }
    std::fill(got.begin(), got.end(), nullptr);
    return ms;
  };
  std::vector<Reply> replies(n);
  auto raw_get = [&]() -> double {
    const double t0 = NowMs();
    // Each reply held to the end of the run, as the tier's chunks are.
    for (size_t i = 0; i < n; ++i) replies[i] = raw.Get(names[i]);
    const double ms = NowMs() - t0;
    for (size_t i = 0; i < n; ++i) {
      const Reply& r = replies[i];
      if (!r || r->type != REDIS_REPLY_STRING || static_cast<std::uint64_t>(r->len) != env ||
          std::memcmp(r->str, set.envelopes[i].data(), env) != 0) {
        return fail("raw GET returned other bytes");
      }
    }
    for (Reply& r : replies) r.reset();
    return ms;
  };

  std::vector<double> tp, rp, tg, rg;
  if (!Alternate(runs, tier_put, raw_put, &tp, &rp)) return 1;
  for (const ChunkRef& c : set.chunks) {  // what the gets read
    if (!tier.Put(c).ok()) {
      fail("RedisTier::Put failed");
      return 1;
    }
  }
  if (!Alternate(runs, tier_get, raw_get, &tg, &rg)) return 1;
  if (!raw.FlushAll()) return 2;

  const double gb = static_cast<double>(env) * static_cast<double>(n) / 1e9;
  nlohmann::json base = ShapeParams(set, runs);
  base.update(TargetParams(t, runs));
  base["codec"] = "raw (the tier stores what it is given; the chain encodes)";
  base["bytes"] = "envelope bytes (the chunk framed, as both sides send it)";
  base["tier"] = {{"connections_per_node", o.client.connections_per_node},
                  {"command_timeout_ms", o.client.command_timeout_ms}};
  base["callers"] = "one thread on each side, one command in flight: the tier uses one of its pooled connections "
                    "per node at a time, the raw side its one connection per node";
  nlohmann::json p = base, g = base;
  p["guarantee"] = "tier: RedisTier::Put of each chunk in turn (the envelope framed from the chunk, one SET per "
                   "call, back once the server answered OK); raw: one SET of the same envelope bytes under the same "
                   "key per redisCommand call, back once the server answered OK";
  const std::string suffix = std::string(set.shape.suffix) + "_" + t.name;
  out.Add("redis_put_gbps_" + suffix, gb / (Median(tp) / 1e3), "GB/s", p, "raw_hiredis_set_gbps",
          gb / (Median(rp) / 1e3));
  g["path"] = "tier: RedisTier::Get of each chunk in turn (one GET per call; the envelope checked, both checksums, "
              "the payload kept in the reply), every chunk held to the end of the run; raw: one GET per "
              "redisCommand call, every reply held to the end of the run (no checksum)";
  out.Add("redis_get_gbps_" + suffix, gb / (Median(tg) / 1e3), "GB/s", g, "raw_hiredis_get_gbps",
          gb / (Median(rg) / 1e3));
  return 0;
}

// ---------------------------------------------------------------- lookup

// KvStore::Lookup of a 512-chunk prefix through a runtime whose only tier is
// the redis tier, against raw pipelined EXISTS of the same 512 keys.
int Lookup(Target& t, int repeats, Records& out) {
  auto rt = RedisRuntime(t.seed(), "raw");
  if (!rt.ok()) {
    std::fprintf(stderr, "bench: lookup runtime: %s\n", rt.status().message().c_str());
    return 2;
  }
  // A small model (32 bytes per token): what is stored does not matter to a
  // lookup, only how many keys it probes.
  store::ModelKv m;
  m.fingerprint = keys::ModelFingerprint({1, 1, 8, 1, 10000.0f, 0, 8, "bench-redis-lookup"});
  m.shape = {1, 1, 8, 2};
  m.dtype = 1;
  const std::string ns = "bench-lookup";
  const size_t T = kLookupChunks * kChunkTokens;
  std::vector<std::int32_t> tokens(T);
  std::uint32_t x = 12345;
  for (auto& tok : tokens) {
    x = x * 1664525u + 1013904223u;
    tok = static_cast<std::int32_t>((x >> 8) % 32000);
  }
  std::vector<std::uint16_t> kv(static_cast<size_t>(m.bytes_per_token()) * T / 2, 0x3c00);
  auto views = CanonicalViews(m, kv.data(), T);
  const store::TokenKeys request = Keys(tokens);
  Result<std::uint64_t> stored =
      views.ok() ? (*rt)->Store(m, ns, request, *views) : Result<std::uint64_t>(views.status());
  if (!stored.ok() || *stored != T) {
    std::fprintf(stderr, "bench: lookup (%s): store: %s\n", t.name,
                 stored.ok() ? "partial" : stored.status().message().c_str());
    return 2;
  }
  // The keys' hashing alone (part of the tier's side, not of the raw one).
  std::vector<std::string> names;
  const double hash_ms = MedianMs(std::max(4 * repeats, 5), [&] {
    names = ChainKeys((*rt)->store().options(), ns, m.fingerprint, tokens);
  });
  store::KvStore& kvs = (*rt)->store();
  auto tier_lookup = [&]() -> double {
    const double t0 = NowMs();
    const store::LookupResult r = kvs.Lookup(m, ns, request);
    const double ms = NowMs() - t0;
    if (r.tokens != T) {
      std::fprintf(stderr, "bench: lookup (%s) found %llu of %zu tokens\n", t.name,
                   static_cast<unsigned long long>(r.tokens), T);
      return -1;
    }
    return ms;
  };
  auto raw_exists = [&]() -> double {
    const double t0 = NowMs();
    const std::vector<Reply> r = t.raw->Pipelined("EXISTS", names);
    const double ms = NowMs() - t0;
    for (const Reply& e : r) {
      if (!e || e->type != REDIS_REPLY_INTEGER || e->integer != 1) {
        std::fprintf(stderr, "bench: lookup (%s): raw EXISTS did not find every key\n", t.name);
        return -1;
      }
    }
    return ms;
  };
  // Lookups are short: more runs than the transfers (medians).
  const int runs = std::max(4 * repeats, 5);
  std::vector<double> tl, rl;
  if (!Alternate(runs, tier_lookup, raw_exists, &tl, &rl)) return 1;
  if (!t.raw->FlushAll()) return 2;
  nlohmann::json p = TargetParams(t, runs);
  p["chunks"] = kLookupChunks;
  p["tokens"] = T;
  p["chunk_tokens"] = kChunkTokens;
  p["key_hashing_us"] = hash_ms * 1e3;
  p["key_hashing_is"] = "the 512 chunk keys hashed (SHA-256 over the tokens, chained) and named alone, as the store "
                        "hashes them: part of the tier's side only";
  p["path"] = "tier: store::KvStore::Lookup of the prefix through a runtime whose only tier is redis (the 512 chunk "
              "keys hashed, one pipelined EXISTS per node from the tier's Prefetch, the walk answered from it); raw: "
              "the same 512 keys (hashed beforehand) as one pipelined EXISTS per node, written to every node, then "
              "each node's replies read";
  out.Add(std::string("redis_lookup_us_512_") + t.name, Median(tl) * 1e3, "us", p, "raw_hiredis_exists_us",
          Median(rl) * 1e3);
  return 0;
}

// ---------------------------------------------------------------- delivery

// The reference model's real KV (f16) retrieved, window by window, by a
// runtime whose only tier is the single node, kept as kdn:balanced and as
// raw, against raw pipelined GET of the raw chunks (a window's keys at once,
// as a retrieve reads them).
int Delivery(const RealKv& real, Target& t, int repeats, Records& out) {
  WindowKv kv(real);
  if (!kv.ok) return 2;
  const size_t windows = kv.windows;
  const std::uint64_t kv_bytes = kv.kv_bytes;

  struct Side {
    const char* name;
    const char* codec;
    std::string ns;
    std::shared_ptr<store::Runtime> rt;
    std::vector<std::vector<std::string>> names;  // per window
    std::vector<double> ms;
  };
  Side sides[2] = {{"balanced", "kdn:balanced", "bench-balanced", nullptr, {}, {}},
                   {"raw", "raw", "bench-raw", nullptr, {}, {}}};
  for (Side& s : sides) {
    auto rt = RedisRuntime(t.seed(), s.codec);
    if (!rt.ok()) {
      std::fprintf(stderr, "bench: delivery runtime: %s\n", rt.status().message().c_str());
      return 2;
    }
    s.rt = std::move(rt).value();
    if (!kv.StoreAll(*s.rt, s.ns, s.codec)) return 2;
    for (size_t w = 0; w < windows; ++w) {
      s.names.push_back(ChainKeys(s.rt->store().options(), s.ns, kv.m16.fingerprint, real.ids[w]));
    }
  }
  // What travels: the stored values' sizes, as the server reports them.
  std::uint64_t stored_bytes[2] = {0, 0};
  size_t chunks = 0;
  for (int k = 0; k < 2; ++k) {
    for (const auto& names : sides[k].names) {
      for (const Reply& r : t.raw->Pipelined("STRLEN", names)) {
        if (!r || r->type != REDIS_REPLY_INTEGER || r->integer <= 0) {
          std::fprintf(stderr, "bench: delivery: a %s chunk is not in the server\n", sides[k].codec);
          return 1;
        }
        stored_bytes[k] += static_cast<std::uint64_t>(r->integer);
        chunks += k == 0 ? 1 : 0;
      }
    }
  }

  // Every window retrieved in turn (one caller); checked.
  auto deliver = [&](Side& s) -> double {
    std::atomic<bool> whole{true}, lossy{false};
    const double t0 = NowMs();
    for (size_t w = 0; w < windows; ++w) kv.Retrieve(*s.rt, s.ns, w, whole, lossy);
    const double ms = NowMs() - t0;
    return kv.CheckAndReset(s.name, std::string(s.codec) == "raw", whole, lossy) ? ms : -1;
  };
  std::vector<Reply> held;
  auto raw_get = [&]() -> double {
    const double t0 = NowMs();
    for (const auto& names : sides[1].names) {
      for (Reply& r : t.raw->Pipelined("GET", names)) held.push_back(std::move(r));
    }
    const double ms = NowMs() - t0;
    std::uint64_t bytes = 0;
    for (const Reply& r : held) bytes += r && r->type == REDIS_REPLY_STRING ? static_cast<std::uint64_t>(r->len) : 0;
    held.clear();
    if (bytes != stored_bytes[1]) {
      std::fprintf(stderr, "bench: delivery: raw GET returned %llu of %llu bytes\n",
                   static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(stored_bytes[1]));
      return -1;
    }
    return ms;
  };
  std::vector<double> base;
  for (int r = -1; r < repeats; ++r) {  // r = -1 warms up
    for (Side& s : sides) {
      const double ms = deliver(s);
      if (ms < 0) return 1;
      if (r >= 0) s.ms.push_back(ms);
    }
    const double ms = raw_get();
    if (ms < 0) return 1;
    if (r >= 0) base.push_back(ms);
  }
  if (!t.raw->FlushAll()) return 2;

  const double gb = static_cast<double>(kv_bytes) / 1e9;
  const double base_gbps = gb / (Median(base) / 1e3);
  for (int k = 0; k < 2; ++k) {
    const Side& s = sides[k];
    nlohmann::json p = TargetParams(t, repeats);
    p["codec"] = s.codec;
    p["model"] = "stories260K";
    p["text"] = "bench/texts/" + real.text_name;
    p["dtype"] = "f16";
    p["chunk_tokens"] = kChunkTokens;
    p["chunks"] = chunks;
    p["windows"] = windows;
    p["window_tokens"] = real.window;
    p["kv_bytes"] = kv_bytes;
    p["stored_bytes"] = stored_bytes[k];
    p["size_ratio"] = static_cast<double>(kv_bytes) / static_cast<double>(stored_bytes[k]);
    p["size_ratio_is"] = "uncompressed KV bytes / bytes stored in Redis (the envelopes, STRLEN)";
    p["fetch_threads"] = s.rt->store().fetch_threads();
    p["path"] = "store::Runtime::Retrieve of each window in turn into the caller's canonical buffer (the lookup and "
                "the window's GETs pipelined by the tier's Prefetch, each chunk decoded, scattered)";
    p["baseline_is"] = "raw hiredis GET of the raw side's chunks, each window's keys pipelined at once, every reply "
                       "held to the end of the run; rate counted in uncompressed KV bytes";
    out.Add(std::string("redis_delivery_gbps_") + s.name, gb / (Median(s.ms) / 1e3), "GB/s", p,
            "raw_hiredis_get_gbps", base_gbps);
  }
  return 0;
}

// Every measure against one topology; the delivery on the single node only.
int RunTarget(Target& t, const ChunkSet& ref, const ChunkSet& big, const RealKv& real, int repeats, Records& out) {
  std::string why;
  t.raw = RawRedis::Connect(t.port, &why);
  if (!t.raw) {
    std::fprintf(stderr, "kdn bench redis: %s: %s\n", t.name, why.c_str());
    return 2;
  }
  int rc = PutGet(ref, t, repeats, out);
  if (rc == 0) rc = PutGet(big, t, repeats, out);
  if (rc == 0) rc = Lookup(t, repeats, out);
  if (rc == 0 && real.model && std::string(t.name) == "single") rc = Delivery(real, t, repeats, out);
  return rc;
}

}  // namespace

int RunRedisBench(const RedisBenchOptions& o) {
  const int repeats = o.repeats > 0 ? o.repeats : (o.quick ? 2 : 5);
  std::printf("kdn bench redis: %d repeats per measure (medians), redis-server on loopback, %u cores\n", repeats,
              std::thread::hardware_concurrency());
  if (!local::HaveRedis()) {
    std::fprintf(stderr, "kdn bench redis: needs /usr/bin/redis-server and /usr/bin/redis-cli (scripts/setup)\n");
    return 2;
  }
  // The reference model's KV: 2 chunks per 512-token window, for the ref
  // chunks and the delivery.
  const RealKv real = Prefill(o.quick ? 8 : 128);
  if (!real.model) {
    std::fprintf(stderr, "kdn bench redis: warning: no redis_delivery records, and the ref chunks are a pattern: %s\n",
                 real.why_not.c_str());
  }
  Records records;
  int rc = 0;
  try {
    const ChunkSet ref = MakeChunks(kRef, o.quick ? 16 : 256, real);
    const ChunkSet big = MakeChunks(k8b, o.quick ? 3 : 12, real);
    const std::vector<std::string> config = {"--maxmemory", kMaxMemory};
    {
      local::TempDir dir;
      local::Server single(dir.path / "single", config);
      if (!single.running()) {
        std::fprintf(stderr, "kdn bench redis: redis-server did not start\n");
        return 2;
      }
      Target t{"single", single.port(), "one redis-server", nullptr};
      rc = RunTarget(t, ref, big, real, repeats, records);
    }  // the node stopped
    if (rc == 0) {
      local::Cluster cluster(3, 0, config);
      if (!cluster.error().empty()) {
        std::fprintf(stderr, "kdn bench redis: cluster: %s\n", cluster.error().c_str());
        return 2;
      }
      Target t{"cluster", cluster.node(0).port(),
               "a Redis Cluster of 3 masters (no replicas) made by redis-cli --cluster create", nullptr};
      rc = RunTarget(t, ref, big, real, repeats, records);
    }  // the cluster stopped
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kdn bench redis: %s\n", e.what());
    return 2;
  }
  if (rc != 0) return rc;
  return records.Finish(o.json_path, "kdn bench redis");
}

}  // namespace kdn::bench

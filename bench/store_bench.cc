#include "store_bench.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "bench_util.h"
#include "store/cache_sim.h"
#include "store/disk_tier.h"
#include "store/kv_store.h"

namespace kdn::bench {
namespace {

namespace fs = std::filesystem;
using store::KvStore;

struct Shape {
  const char* suffix;
  std::int64_t layers, heads, head_dim, elem_bytes;
  std::uint32_t tokens;  // one chunk
  std::uint64_t bytes() const {
    return static_cast<std::uint64_t>(layers * 2 * heads * head_dim * elem_bytes) * tokens;
  }
};
// Llama-3-8B (32 x 8 x 128, bf16) and the reference model (5 x 4 x 8, f32), 256-token chunks.
constexpr Shape k8b{"8b", 32, 8, 128, 2, 256};
constexpr Shape kRef{"ref", 5, 4, 8, 4, 256};

store::ModelKv Model(const Shape& s, const char* name) {
  store::ModelKv m;
  m.fingerprint = keys::ModelFingerprint({static_cast<std::uint32_t>(s.layers), static_cast<std::uint32_t>(s.heads),
                                          static_cast<std::uint32_t>(s.head_dim), s.elem_bytes == 4 ? 0u : 2u,
                                          10000.0f, 0, static_cast<std::uint32_t>(s.head_dim), name});
  m.shape = {s.layers, s.heads, s.head_dim, s.elem_bytes};
  m.dtype = s.elem_bytes == 4 ? 0 : 2;
  return m;
}

std::vector<std::int32_t> Ids(size_t n, int salt) {
  std::vector<std::int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<std::int32_t>((i * 2654435761u + static_cast<unsigned>(salt)) % 32000);
  return t;
}

store::TokenKeys Keys(const std::vector<std::int32_t>& t) {
  store::TokenKeys k;
  k.tokens = t;
  return k;
}

nlohmann::json ShapeParams(const Shape& s, int repeats) {
  return {{"chunk_bytes", s.bytes()}, {"tokens", s.tokens}, {"layers", s.layers}, {"kv_heads", s.heads},
          {"head_dim", s.head_dim}, {"dtype", s.elem_bytes == 2 ? "bf16" : "f32"}, {"repeats", repeats}};
}

// Retrieve of one chunk from the host tier into a canonical buffer vs memcpy.
int HostGet(const Shape& s, int repeats, Records& out) {
  store::StoreOptions o;
  o.host_capacity_bytes = std::uint64_t{1} << 30;
  auto kv = KvStore::Create(o).value();
  const store::ModelKv m = Model(s, "bench");
  const size_t bytes = s.bytes();
  std::vector<std::uint8_t> src(bytes), dst(bytes, 1), dst2(bytes, 1);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<std::uint8_t>(i * 131 >> 7);
  const auto ids = Ids(s.tokens, 1);
  store::KvBufferView b;
  b.data = src.data();
  b.size_bytes = bytes;
  b.num_tokens = s.tokens;
  const store::BufferAsView in(m, store::ResolveBuffer(m, b, s.tokens).value());
  if (kv->Store(m, "bench", Keys(ids), in.view()).value() != s.tokens) return 2;
  b.data = dst.data();
  const store::BufferAsView outv(m, store::ResolveBuffer(m, b, s.tokens).value());
  bool ok = true;
  const double get_ms = MedianMs(repeats, [&] { ok &= kv->Retrieve(m, "bench", Keys(ids), outv.view()) == s.tokens; });
  const double memcpy_ms = MedianMs(repeats, [&] {
    std::memcpy(dst2.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst2.data()) : "memory");
  });
  if (!ok || dst != src) {
    std::fprintf(stderr, "bench: host get returned wrong bytes\n");
    return 1;
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  out.Add(std::string("host_get_gbps_") + s.suffix, gb / (get_ms / 1e3), "GB/s", ShapeParams(s, repeats), "memcpy_gbps",
          gb / (memcpy_ms / 1e3));
  return 0;
}

// Raw sequential O_DIRECT write (then fdatasync) and read of `count` pieces
// of `bytes` into one file: the disk's own speed, for the baselines.
struct Raw {
  double write_s = 0, read_s = 0;
};
Raw RawDirect(const fs::path& file, const std::uint8_t* data, size_t bytes, int count) {
  Raw r;
  const size_t aligned = (bytes + 4095) / 4096 * 4096;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, aligned) != 0) return r;
  std::memcpy(buf, data, bytes);
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  const bool direct = fd >= 0;
  if (!direct) fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  double t0 = NowMs();
  for (int i = 0; i < count; ++i) {
    if (::write(fd, buf, aligned) != static_cast<ssize_t>(aligned)) break;
  }
  ::fdatasync(fd);
  r.write_s = (NowMs() - t0) / 1e3;
  ::close(fd);
  fd = ::open(file.c_str(), direct ? (O_RDONLY | O_DIRECT) : O_RDONLY);
  t0 = NowMs();
  for (int i = 0; i < count; ++i) {
    if (::read(fd, buf, aligned) != static_cast<ssize_t>(aligned)) break;
  }
  r.read_s = (NowMs() - t0) / 1e3;
  ::close(fd);
  std::free(buf);
  fs::remove(file);
  return r;
}

// Puts then gets `count` chunks through the disk tier, against the raw disk.
int Disk(const Shape& s, int count, int repeats, const fs::path& dir, Records& out) {
  std::vector<double> tw, tr, rw, rr;
  const size_t bytes = s.bytes();
  std::vector<store::ChunkRef> chunks;
  for (int i = 0; i < count; ++i) {
    auto c = std::make_shared<store::Chunk>();
    c->meta.key = keys::ChunkKey(static_cast<std::uint64_t>(i), "bench", keys::Digest{}, keys::Digest{}, {});
    c->meta.dtype = s.elem_bytes == 4 ? 0 : 2;
    c->meta.layers = static_cast<std::uint32_t>(s.layers);
    c->meta.kv_heads = static_cast<std::uint32_t>(s.heads);
    c->meta.head_dim = static_cast<std::uint32_t>(s.head_dim);
    c->meta.tokens = s.tokens;
    c->payload = store::Payload(bytes);
    for (size_t b = 0; b < bytes; b += 64) c->payload[b] = static_cast<std::uint8_t>(b + static_cast<size_t>(i));
    chunks.push_back(std::move(c));
  }
  for (int r = 0; r < repeats; ++r) {
    const fs::path tdir = dir / ("tier-" + std::to_string(r));
    fs::remove_all(tdir);
    store::DiskTierOptions o;
    o.directory = tdir.string();
    o.capacity_bytes = static_cast<std::uint64_t>(count + 1) * (bytes + (1 << 20));
    auto tier = store::DiskTier::Open(o);
    if (!tier.ok()) {
      std::fprintf(stderr, "bench: %s\n", tier.status().message().c_str());
      return 2;
    }
    double t0 = NowMs();
    for (const auto& c : chunks) {
      if (!(*tier)->Put(c).ok()) return 2;
    }
    tw.push_back((NowMs() - t0) / 1e3);
    t0 = NowMs();
    for (const auto& c : chunks) {
      auto got = (*tier)->Get(c->meta.key);
      if (!got.ok() || (*got)->payload.size() != bytes) return 1;
    }
    tr.push_back((NowMs() - t0) / 1e3);
    tier->reset();
    fs::remove_all(tdir);
    const Raw raw = RawDirect(dir / "raw.bin", chunks[0]->payload.data(), bytes, count);
    rw.push_back(raw.write_s);
    rr.push_back(raw.read_s);
  }
  const double gb = static_cast<double>(bytes) * count / 1e9;
  nlohmann::json p = ShapeParams(s, repeats);
  p["chunks"] = count;
  p["fsync"] = "data, per object";
  out.Add(std::string("disk_write_gbps_") + s.suffix, gb / Median(tw), "GB/s", p, "raw_odirect_write_gbps", gb / Median(rw));
  out.Add(std::string("disk_read_gbps_") + s.suffix, gb / Median(tr), "GB/s", p, "raw_odirect_read_gbps", gb / Median(rr));
  return 0;
}

// The keys of a 512-chunk request against SHA-256 of the same token bytes.
void KeyHash(int repeats, Records& out) {
  const size_t chunks = 512, per = 256;
  const auto ids = Ids(chunks * per, 3);
  const keys::Digest model = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "bench"});
  keys::Digest sink{};
  const double keys_ms = MedianMs(repeats, [&] {
    keys::Digest prev{};
    for (size_t c = 0; c < chunks; ++c) prev = keys::ChunkKey(0, "bench", model, prev, std::span(ids).subspan(c * per, per));
    sink = prev;
  });
  const double raw_ms = MedianMs(repeats, [&] {
    unsigned char d[32];
    unsigned int n = 0;
    EVP_Digest(ids.data(), ids.size() * 4, d, &n, EVP_sha256(), nullptr);
    sink[0] ^= d[0];
  });
  const double gb = static_cast<double>(ids.size() * 4) / 1e9;
  out.Add("key_hash_gbps", gb / (keys_ms / 1e3), "GB/s",
          {{"chunks", chunks}, {"chunk_tokens", per}, {"repeats", repeats}, {"hash", "sha256"}}, "raw_sha256_gbps",
          gb / (raw_ms / 1e3));
}

// Lookup of a 512-chunk cached prefix (host tier).
void Lookup(int repeats, Records& out) {
  const Shape tiny{"tiny", 1, 1, 8, 4, 256};
  store::StoreOptions o;
  o.host_capacity_bytes = std::uint64_t{64} << 20;
  auto kv = KvStore::Create(o).value();
  const store::ModelKv m = Model(tiny, "lookup");
  const auto ids = Ids(512 * 256, 4);
  std::vector<std::uint8_t> src(ids.size() * 64, 7);
  store::KvBufferView b;
  b.data = src.data();
  b.size_bytes = src.size();
  b.num_tokens = ids.size();
  const store::BufferAsView in(m, store::ResolveBuffer(m, b, ids.size()).value());
  (void)kv->Store(m, "bench", Keys(ids), in.view());
  std::uint64_t found = 0;
  const double ms = MedianMs(repeats * 10, [&] { found = kv->Lookup(m, "bench", Keys(ids)).tokens; });
  out.Add("lookup_us", ms * 1e3, "us", {{"chunks", 512}, {"chunk_tokens", 256}, {"found_tokens", found},
                                         {"repeats", repeats * 10}});
}

// Zipf document reuse (20% of documents take 80% of requests) through a
// host tier of `fraction` of the working set over a disk tier of twice that:
// each request loads its document, and stores it where it missed (as an
// engine does after prefill). Hit rate per tier = chunks served by it /
// chunks requested.
int HitRates(const fs::path& dir, bool quick, Records& out) {
  store::ZipfWorkload w;
  w.documents = 1000;
  w.chunks_per_doc = 8;
  w.exponent = store::ZipfExponentForShare(w.documents, 0.2, 0.8);
  w.requests = quick ? 2000 : 20000;
  w.seed = 42;
  const std::vector<std::uint64_t> docs = store::ZipfRequests(w);
  const Shape tiny{"tiny", 1, 1, 8, 4, 16};  // 512-byte chunks: one 4 KiB block in memory
  const store::ModelKv m = Model(tiny, "zipf");
  const std::uint64_t objects = w.documents * w.chunks_per_doc;
  std::vector<std::uint8_t> kvbytes(w.chunks_per_doc * tiny.tokens * 64, 3);
  for (store::PolicyKind policy : {store::PolicyKind::kLru, store::PolicyKind::kS3Fifo}) {
    for (double fraction : {0.10, 0.25, 0.50}) {
      const fs::path tdir = dir / "zipf";
      fs::remove_all(tdir);
      store::StoreOptions o;
      o.chunk_tokens = tiny.tokens;
      store::TierSpec host, disk;
      host.capacity_bytes = static_cast<std::uint64_t>(fraction * static_cast<double>(objects)) * 4096;
      host.policy = policy;
      disk.kind = store::TierSpec::Kind::kDisk;
      disk.path = tdir.string();
      disk.policy = policy;
      disk.fsync = false;  // hit rates do not depend on durability
      disk.codec = "raw";  // capacity counted in raw chunks, as the cache simulation does
      const std::uint64_t file_bytes = 512 + 512;  // payload plus envelope, generously
      disk.capacity_bytes = static_cast<std::uint64_t>(std::min(1.0, 2 * fraction) * static_cast<double>(objects)) * file_bytes;
      o.tiers = {host, disk};
      auto kv = KvStore::Create(o);
      if (!kv.ok()) {
        std::fprintf(stderr, "bench: %s\n", kv.status().message().c_str());
        return 2;
      }
      std::uint64_t requested = 0;
      std::vector<std::uint64_t> start_hits;
      for (size_t r = 0; r < docs.size(); ++r) {
        if (r == docs.size() / 10) {  // the first 10% warm the cache up
          (*kv)->chain().Flush();
          for (const auto& l : (*kv)->chain().Stats()) start_hits.push_back(l.hits);
          requested = 0;
        }
        const auto ids = Ids(w.chunks_per_doc * tiny.tokens, static_cast<int>(docs[r]) * 7919 + 1);
        store::KvBufferView b;
        b.data = kvbytes.data();
        b.size_bytes = kvbytes.size();
        b.num_tokens = ids.size();
        const store::BufferAsView view(m, store::ResolveBuffer(m, b, ids.size()).value());
        const std::uint64_t got = (*kv)->Retrieve(m, "zipf", Keys(ids), view.view());
        requested += w.chunks_per_doc;
        if (got < ids.size()) (void)(*kv)->Store(m, "zipf", Keys(ids), view.view());
      }
      (*kv)->chain().Flush();
      const auto stats = (*kv)->chain().Stats();
      double total = 0;
      for (size_t t = 0; t < stats.size(); ++t) {
        const double rate = static_cast<double>(stats[t].hits - start_hits[t]) / static_cast<double>(requested);
        total += rate;
        out.Add("hit_rate", rate, "ratio",
                {{"tier", stats[t].name}, {"policy", store::PolicyName(policy)}, {"host_fraction", fraction},
                 {"disk_fraction", std::min(1.0, 2 * fraction)}, {"documents", w.documents},
                 {"chunks_per_doc", w.chunks_per_doc}, {"zipf_exponent", w.exponent}, {"requests", w.requests}});
      }
      out.Add("hit_rate", total, "ratio",
              {{"tier", "all"}, {"policy", store::PolicyName(policy)}, {"host_fraction", fraction},
               {"disk_fraction", std::min(1.0, 2 * fraction)}, {"requests", w.requests}});
      kv->reset();
      fs::remove_all(tdir);
    }
  }
  return 0;
}

}  // namespace

int RunStoreBench(const StoreBenchOptions& o) {
  const int repeats = o.repeats > 0 ? o.repeats : (o.quick ? 3 : 10);
  const fs::path dir = (o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir)) /
                       ("kdn-bench-store-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::printf("kdn bench store: %d repeats per measure (medians), scratch %s\n", repeats, dir.c_str());
  Records records;
  int rc = 0;
  for (const Shape& s : {k8b, kRef}) {
    if (rc == 0) rc = HostGet(s, repeats, records);
  }
  if (rc == 0) rc = Disk(k8b, o.quick ? 2 : 8, o.quick ? 1 : 3, dir, records);
  if (rc == 0) rc = Disk(kRef, o.quick ? 16 : 256, o.quick ? 1 : 3, dir, records);
  if (rc == 0) KeyHash(repeats, records);
  if (rc == 0) Lookup(repeats, records);
  if (rc == 0) rc = HitRates(dir, o.quick, records);
  fs::remove_all(dir);
  if (rc != 0) return rc;
  if (!records.Write(o.json_path)) {
    std::fprintf(stderr, "kdn bench store: cannot write %s\n", o.json_path.c_str());
    return 2;
  }
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace kdn::bench

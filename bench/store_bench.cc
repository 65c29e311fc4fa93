#include "store_bench.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "bench_util.h"
#include "store/cache_sim.h"
#include "store/disk_tier.h"
#include "store/kv_store.h"
#include "wire/envelope.h"

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

// The scratch directory of the disk measures and the filesystem it is on.
// Disk figures taken on a memory filesystem measure memory, not a disk: the
// bench refuses one unless told otherwise, and every record says which it was.
struct Scratch {
  fs::path dir;
  std::string fs_type;  // "ext2/ext3/ext4", "tmpfs", "overlay on tmpfs", "ext2/ext3/ext4 on /dev/zram0", ...
  bool memory = false;  // tmpfs, ramfs, hugetlbfs, a RAM disk, an overlay over one of them
  void Describe(nlohmann::json& p) const {
    p["scratch_fs"] = fs_type;
    p["memory_fs"] = memory;
  }
};

// The filesystem type statfs reports, by name; whether it lives in memory.
std::string FsTypeName(unsigned long magic, bool* memory) {
  *memory = magic == TMPFS_MAGIC || magic == RAMFS_MAGIC || magic == HUGETLBFS_MAGIC;
  switch (magic) {
    case TMPFS_MAGIC: return "tmpfs";
    case RAMFS_MAGIC: return "ramfs";
    case HUGETLBFS_MAGIC: return "hugetlbfs";
    case EXT4_SUPER_MAGIC: return "ext2/ext3/ext4";
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case F2FS_SUPER_MAGIC: return "f2fs";
    case OVERLAYFS_SUPER_MAGIC: return "overlay";
    case FUSE_SUPER_MAGIC: return "fuse";
    case NFS_SUPER_MAGIC: return "nfs";
    case 0x2FC12FC1: return "zfs";
  }
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%lx", magic);
  return hex;
}

// /proc/self/mountinfo escapes spaces, tabs, newlines and backslashes as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The mount that holds `path` (the last, innermost one listed): its
// filesystem type, source and superblock options. Empty when unknown.
struct MountEntry {
  std::string type, source, options;
};
MountEntry MountOf(const fs::path& path) {
  MountEntry best;
  size_t best_len = 0;
  std::ifstream in("/proc/self/mountinfo");
  const std::string p = path.string();
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::vector<std::string> fields;
    for (std::string w; f >> w;) fields.push_back(w);
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string mount = Unescape(fields[4]);
    const bool under = mount == "/" || p == mount || (p.starts_with(mount) && p[mount.size()] == '/');
    if (!under || mount.size() < best_len) continue;
    best_len = mount.size();
    best = {dash[1], Unescape(dash[2]), dash[3]};
  }
  return best;
}

Scratch DescribeScratch(const fs::path& dir) {
  Scratch s;
  s.dir = dir;
  struct statfs st;
  if (::statfs(dir.c_str(), &st) != 0) {
    s.fs_type = "unknown";
    return s;
  }
  s.fs_type = FsTypeName(static_cast<unsigned long>(st.f_type), &s.memory);
  std::error_code ec;
  const MountEntry m = MountOf(fs::canonical(dir, ec));
  // A disk filesystem on a RAM disk (zram, brd) is memory too.
  if (m.source.starts_with("/dev/zram") || m.source.starts_with("/dev/ram")) {
    s.fs_type += " on " + m.source;
    s.memory = true;
  }
  // An overlay lives where its upper directory does (when this mount
  // namespace can see it; a container's often cannot).
  if (static_cast<unsigned long>(st.f_type) == OVERLAYFS_SUPER_MAGIC) {
    const size_t at = ("," + m.options).find(",upperdir=");
    struct statfs up;
    if (at != std::string::npos) {
      std::string upper = m.options.substr(at + 9);
      upper = Unescape(upper.substr(0, upper.find(',')));
      if (::statfs(upper.c_str(), &up) == 0) {
        bool memory = false;
        s.fs_type = "overlay on " + FsTypeName(static_cast<unsigned long>(up.f_type), &memory);
        s.memory = memory;
        const MountEntry um = MountOf(fs::canonical(upper, ec));
        if (um.source.starts_with("/dev/zram") || um.source.starts_with("/dev/ram")) {
          s.fs_type += " on " + um.source;
          s.memory = true;
        }
        return s;
      }
    }
    s.fs_type = "overlay (its upper directory is not visible here)";
  }
  return s;
}

// Retrieve of one chunk from the host tier into a canonical buffer vs memcpy.
int HostGet(const Shape& s, int repeats, const Scratch& scratch, Records& out) {
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
  nlohmann::json p = ShapeParams(s, repeats);
  scratch.Describe(p);
  out.Add(std::string("host_get_gbps_") + s.suffix, gb / (get_ms / 1e3), "GB/s", p, "memcpy_gbps", gb / (memcpy_ms / 1e3));
  return 0;
}

// What a disk Put promises, in words, for the records.
const char* FsyncName(store::FsyncPolicy p) {
  switch (p) {
    case store::FsyncPolicy::kNone: return "none";
    case store::FsyncPolicy::kData: return "data";
    case store::FsyncPolicy::kFull: return "full";
  }
  return "?";
}
const char* Durability(store::FsyncPolicy p) {
  switch (p) {
    case store::FsyncPolicy::kNone: return "per object: temp file, write, rename into place (no sync)";
    case store::FsyncPolicy::kData: return "per object: temp file, write, fdatasync, rename into place";
    case store::FsyncPolicy::kFull:
      return "per object: temp file, write, fdatasync, rename into place, fsync of its directory";
  }
  return "?";
}

// The fraction of the pages of the regular files under `root` that are in
// the page cache: what a write through the page cache leaves behind and an
// O_DIRECT write does not. -1 when nothing could be checked.
double ResidentFraction(const fs::path& root) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t resident = 0, total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->file_size(ec) == 0) continue;
    const size_t size = static_cast<size_t>(it->file_size(ec));
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) continue;
    std::vector<unsigned char> vec((size + page - 1) / page);
    if (::mincore(map, size, vec.data()) == 0) {
      for (unsigned char v : vec) resident += v & 1;
      total += vec.size();
    }
    ::munmap(map, size);
  }
  return total == 0 ? -1.0 : static_cast<double>(resident) / static_cast<double>(total);
}

// Whether writes went around the page cache, judged by what they left in it
// (an O_DIRECT open the filesystem accepts may still be served buffered).
bool WroteDirect(const fs::path& root) {
  const double f = ResidentFraction(root);
  return f >= 0 && f < 0.5;
}

// The raw disk doing what a disk tier Put promises, object by object: the
// same bytes per object (the tier's file size), the same files (a temp file
// in tmp/, renamed to objects/<first key byte>/<key>.kdn), the same syncs
// (`policy`), then each object read back whole, one open per object, the way
// the tier reads (O_DIRECT where the filesystem allows it). What kdn adds
// (framing, checksums, the index) is left out, and the buffer is aligned and
// reused: O_DIRECT where accepted, or buffered otherwise, as found.
struct RawObjects {
  double write_s = 0, read_s = 0;
  bool write_odirect = false, read_odirect = false;
};
Result<RawObjects> RawPerObject(const fs::path& root, const std::vector<store::ChunkRef>& chunks,
                                std::uint64_t object_bytes, store::FsyncPolicy policy) {
  constexpr size_t kAlign = 4096;
  const size_t aligned = (object_bytes + kAlign - 1) / kAlign * kAlign;
  void* mem = nullptr;
  if (posix_memalign(&mem, kAlign, aligned) != 0) return Status(Code::kNoMemory, "raw baseline: no memory");
  const std::unique_ptr<std::uint8_t, decltype(&std::free)> buf(static_cast<std::uint8_t*>(mem), &std::free);
  std::memset(buf.get(), 0, aligned);
  std::memcpy(buf.get(), chunks[0]->payload.data(), std::min<size_t>(object_bytes, chunks[0]->payload.size()));
  auto fail = [](const std::string& what, const fs::path& path) {
    return Status(Code::kUnavailable, "raw baseline: " + what + " " + path.string() + ": " + std::strerror(errno));
  };
  auto sync_dir = [](const fs::path& d) {
    const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const bool ok = fd >= 0 && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    return ok;
  };
  fs::remove_all(root);
  fs::create_directories(root / "tmp");
  fs::create_directories(root / "objects");
  RawObjects r;
  bool direct = true;
  std::array<bool, 256> shard_ready{};
  std::vector<fs::path> paths;
  double t0 = NowMs();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const keys::Digest& key = chunks[i]->meta.key;
    const fs::path tmp = root / "tmp" / (std::to_string(i) + ".tmp");
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    int fd = direct ? ::open(tmp.c_str(), flags | O_DIRECT, 0644) : -1;
    if (fd < 0) {
      if (direct && errno != EINVAL) return fail("create", tmp);
      direct = false;  // the filesystem refuses O_DIRECT
      fd = ::open(tmp.c_str(), flags, 0644);
      if (fd < 0) return fail("create", tmp);
    }
    // O_DIRECT writes whole blocks; the file is then cut to the object's size.
    const size_t n = direct ? aligned : object_bytes;
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd, buf.get() + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      done += static_cast<size_t>(w);
    }
    bool ok = done == n;
    if (ok && direct && aligned != object_bytes) ok = ::ftruncate(fd, static_cast<off_t>(object_bytes)) == 0;
    if (ok && policy != store::FsyncPolicy::kNone) ok = ::fdatasync(fd) == 0;
    if (::close(fd) != 0) ok = false;
    if (!ok) return fail("write", tmp);
    const char hex[] = "0123456789abcdef";
    const fs::path shard = root / "objects" / std::string{hex[key[0] >> 4], hex[key[0] & 15]};
    if (!shard_ready[key[0]]) {
      fs::create_directories(shard);
      if (policy == store::FsyncPolicy::kFull && !sync_dir(root / "objects")) return fail("fsync", root / "objects");
      shard_ready[key[0]] = true;
    }
    paths.push_back(shard / (keys::ToHex(key) + ".kdn"));
    if (::rename(tmp.c_str(), paths.back().c_str()) != 0) return fail("rename to", paths.back());
    if (policy == store::FsyncPolicy::kFull && !sync_dir(shard)) return fail("fsync", shard);
  }
  r.write_s = (NowMs() - t0) / 1e3;
  r.write_odirect = direct && WroteDirect(root / "objects");
  direct = true;
  t0 = NowMs();
  for (const fs::path& path : paths) {
    int fd = direct ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT) : -1;
    if (fd < 0) {
      if (direct && errno != EINVAL) return fail("open", path);
      direct = false;
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return fail("open", path);
    }
    struct stat st;
    size_t got = 0;
    if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_size) == object_bytes) {
      while (got < object_bytes) {
        const ssize_t k = ::read(fd, buf.get() + got, aligned - got);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
    }
    ::close(fd);
    if (got != object_bytes) return fail("read", path);
  }
  r.read_s = (NowMs() - t0) / 1e3;
  r.read_odirect = direct;
  fs::remove_all(root);
  return r;
}

// One file of `count` pieces written with O_DIRECT (buffered if refused) and
// one fdatasync at the end, then read back: the device's streaming speed.
// Not a baseline of the tier (no per-object durability); recorded beside it
// to show what the per-object work costs.
struct Stream {
  double write_s = 0, read_s = 0;
  bool write_odirect = false, read_odirect = false;
};
Stream RawStream(const fs::path& dir, const std::uint8_t* data, size_t bytes, int count) {
  Stream r;
  fs::create_directories(dir);
  const fs::path file = dir / "stream.bin";
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
  r.write_odirect = direct && WroteDirect(dir);
  r.read_odirect = direct;
  fd = ::open(file.c_str(), direct ? (O_RDONLY | O_DIRECT) : O_RDONLY);
  t0 = NowMs();
  for (int i = 0; i < count; ++i) {
    if (::read(fd, buf, aligned) != static_cast<ssize_t>(aligned)) break;
  }
  r.read_s = (NowMs() - t0) / 1e3;
  ::close(fd);
  std::free(buf);
  fs::remove_all(dir);
  return r;
}

// Puts then gets `count` chunks through the disk tier, against the raw disk
// doing the same per-object work under the same durability (RawPerObject),
// the two interleaved (alternating which goes first) in each repeat.
int Disk(const Shape& s, int count, int repeats, const Scratch& scratch, Records& out) {
  std::vector<double> tw, tr, rw, rr, sw, sr;
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
  const store::DiskTierOptions defaults;  // the tier as a user gets it
  const store::FsyncPolicy policy = defaults.fsync;
  bool tier_write_direct = true, tier_read_direct = true, raw_write_direct = true, raw_read_direct = true;
  bool stream_write_direct = true, stream_read_direct = true;
  std::uint64_t object_bytes = 0;
  for (int r = 0; r < repeats; ++r) {
    auto run_tier = [&]() -> int {
      const fs::path tdir = scratch.dir / ("tier-" + std::to_string(r));
      fs::remove_all(tdir);
      store::DiskTierOptions o = defaults;
      o.directory = tdir.string();
      o.capacity_bytes = static_cast<std::uint64_t>(count + 1) * (bytes + (1 << 20));
      auto tier = store::DiskTier::Open(o);
      if (!tier.ok()) {
        std::fprintf(stderr, "bench: %s\n", tier.status().message().c_str());
        return 2;
      }
      object_bytes = (*tier)->Cost(*chunks[0]);
      double t0 = NowMs();
      for (const auto& c : chunks) {
        if (Status st = (*tier)->Put(c); !st.ok()) {
          std::fprintf(stderr, "bench: disk put: %s\n", st.message().c_str());
          return 2;
        }
      }
      tw.push_back((NowMs() - t0) / 1e3);
      tier_write_direct &= WroteDirect(tdir / "objects");
      t0 = NowMs();
      for (const auto& c : chunks) {
        auto got = (*tier)->Get(c->meta.key);
        if (!got.ok() || (*got)->payload.size() != bytes) return 1;
      }
      tr.push_back((NowMs() - t0) / 1e3);
      tier_read_direct &= (*tier)->odirect_active();
      tier->reset();
      fs::remove_all(tdir);
      return 0;
    };
    auto run_raw = [&]() -> int {
      const std::uint64_t n = wire::EncodedEnvelopeSize(bytes);  // the tier's file size
      Result<RawObjects> raw = RawPerObject(scratch.dir / "raw", chunks, n, policy);
      if (!raw.ok()) {
        std::fprintf(stderr, "bench: %s\n", raw.status().message().c_str());
        return 2;
      }
      rw.push_back(raw->write_s);
      rr.push_back(raw->read_s);
      raw_write_direct &= raw->write_odirect;
      raw_read_direct &= raw->read_odirect;
      return 0;
    };
    const int first = r % 2 == 0 ? run_tier() : run_raw();
    if (first != 0) return first;
    const int second = r % 2 == 0 ? run_raw() : run_tier();
    if (second != 0) return second;
    const Stream stream = RawStream(scratch.dir / "stream", chunks[0]->payload.data(), bytes, count);
    sw.push_back(stream.write_s);
    sr.push_back(stream.read_s);
    stream_write_direct &= stream.write_odirect;
    stream_read_direct &= stream.read_odirect;
  }
  const double gb = static_cast<double>(bytes) * count / 1e9;
  nlohmann::json p = ShapeParams(s, repeats);
  p["chunks"] = count;
  p["object_bytes"] = object_bytes;
  p["tier"] = {{"fsync", FsyncName(policy)}, {"durability", Durability(policy)},
               {"write_odirect", tier_write_direct}, {"read_odirect", tier_read_direct}};
  p["raw"] = {{"fsync", FsyncName(policy)}, {"durability", Durability(policy)},
              {"write_odirect", raw_write_direct}, {"read_odirect", raw_read_direct}};
  scratch.Describe(p);
  out.Add(std::string("disk_write_gbps_") + s.suffix, gb / Median(tw), "GB/s", p, "raw_disk_write_gbps", gb / Median(rw));
  out.Add(std::string("disk_read_gbps_") + s.suffix, gb / Median(tr), "GB/s", p, "raw_disk_read_gbps", gb / Median(rr));
  nlohmann::json sp = ShapeParams(s, repeats);
  sp["chunks"] = count;
  sp["durability"] = "one file, one fdatasync after all chunks (no per-object durability; not a baseline)";
  sp["write_odirect"] = stream_write_direct;
  sp["read_odirect"] = stream_read_direct;
  scratch.Describe(sp);
  out.Add(std::string("raw_stream_write_gbps_") + s.suffix, gb / Median(sw), "GB/s", sp);
  out.Add(std::string("raw_stream_read_gbps_") + s.suffix, gb / Median(sr), "GB/s", sp);
  return 0;
}

// SHA-256 of a request's token bytes in one stream: the machine's limit for
// hashing them (what key hashing and lookups are compared with). Returns ms.
double RawTokenSha256Ms(int repeats, const std::vector<std::int32_t>& ids) {
  unsigned char sink = 0;
  const double ms = MedianMs(repeats, [&] {
    unsigned char d[32];
    unsigned int n = 0;
    EVP_Digest(ids.data(), ids.size() * 4, d, &n, EVP_sha256(), nullptr);
    sink ^= d[0];
  });
  asm volatile("" : : "r"(sink) : "memory");
  return ms;
}

// The keys of a 512-chunk request, as the store's walks compute them (one
// keyer per walk), against SHA-256 of the same token bytes in one stream.
// The keys hash more than the tokens: per chunk the previous key (32 bytes),
// the token count and what is left of the head after its first block.
void KeyHash(int repeats, const Scratch& scratch, Records& out) {
  const size_t chunks = 512, per = 256;
  const auto ids = Ids(chunks * per, 3);
  const keys::Digest model = keys::ModelFingerprint({5, 4, 8, 0, 10000.0f, 0, 8, "bench"});
  keys::Digest sink{};
  const double keys_ms = MedianMs(repeats, [&] {
    const keys::ChunkKeyer keyer(0, "bench", model);
    keys::Digest prev{};
    for (size_t c = 0; c < chunks; ++c) prev = keyer.Key(prev, std::span(ids).subspan(c * per, per));
    sink = prev;
  });
  if (sink != [&] {
        keys::Digest prev{};
        for (size_t c = 0; c < chunks; ++c) prev = keys::ChunkKey(0, "bench", model, prev, std::span(ids).subspan(c * per, per));
        return prev;
      }()) {
    std::fprintf(stderr, "bench: the keyer's keys differ from ChunkKey's\n");
  }
  const double raw_ms = RawTokenSha256Ms(repeats, ids);
  const double gb = static_cast<double>(ids.size() * 4) / 1e9;
  nlohmann::json p = {{"chunks", chunks}, {"chunk_tokens", per}, {"repeats", repeats}, {"hash", "sha256"},
                      {"baseline", "SHA-256 of the same token bytes in one stream (EVP_Digest)"}};
  scratch.Describe(p);
  out.Add("key_hash_gbps", gb / (keys_ms / 1e3), "GB/s", p, "raw_sha256_gbps", gb / (raw_ms / 1e3));
}

// Lookup of a 512-chunk cached prefix (host tier), against hashing its
// token bytes (the goal: at most 1.2x that).
void Lookup(int repeats, const Scratch& scratch, Records& out) {
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
  const double raw_ms = RawTokenSha256Ms(repeats * 10, ids);
  nlohmann::json p = {{"chunks", 512}, {"chunk_tokens", 256}, {"found_tokens", found}, {"repeats", repeats * 10},
                      {"baseline", "SHA-256 of the same token bytes in one stream (EVP_Digest)"}};
  scratch.Describe(p);
  out.Add("lookup_us", ms * 1e3, "us", p, "raw_sha256_us", raw_ms * 1e3);
}

// Zipf document reuse (20% of documents take 80% of requests) through a
// host tier of `fraction` of the working set over a disk tier of twice that:
// each request loads its document, and stores it where it missed (as an
// engine does after prefill). Hit rate per tier = chunks served by it /
// chunks requested.
int HitRates(const Scratch& scratch, bool quick, Records& out) {
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
      const fs::path tdir = scratch.dir / "zipf";
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
        nlohmann::json p = {{"tier", stats[t].name}, {"policy", store::PolicyName(policy)}, {"host_fraction", fraction},
                            {"disk_fraction", std::min(1.0, 2 * fraction)}, {"documents", w.documents},
                            {"chunks_per_doc", w.chunks_per_doc}, {"zipf_exponent", w.exponent}, {"requests", w.requests}};
        scratch.Describe(p);
        out.Add("hit_rate", rate, "ratio", p);
      }
      nlohmann::json p = {{"tier", "all"}, {"policy", store::PolicyName(policy)}, {"host_fraction", fraction},
                          {"disk_fraction", std::min(1.0, 2 * fraction)}, {"requests", w.requests}};
      scratch.Describe(p);
      out.Add("hit_rate", total, "ratio", p);
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
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "kdn bench store: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 2;
  }
  const Scratch scratch = DescribeScratch(dir);
  if (scratch.memory && !o.allow_memory_fs) {
    fs::remove_all(dir, ec);
    std::fprintf(stderr,
                 "kdn bench store: %s is on %s, a memory filesystem: the disk figures would measure memory, not a "
                 "disk.\nPass --dir DIR on a disk, or --allow-memory-fs to run anyway (every record then says "
                 "\"memory_fs\": true).\n",
                 dir.parent_path().c_str(), scratch.fs_type.c_str());
    return 2;
  }
  std::printf("kdn bench store: %d repeats per measure (medians), scratch %s (%s)\n", repeats, dir.c_str(),
              scratch.fs_type.c_str());
  if (scratch.memory) {
    std::printf("WARNING: the scratch directory is on %s, a memory filesystem: the disk figures measure memory, "
                "not a disk (\"memory_fs\": true in every record)\n",
                scratch.fs_type.c_str());
  }
  Records records;
  int rc = 0;
  for (const Shape& s : {k8b, kRef}) {
    if (rc == 0) rc = HostGet(s, repeats, scratch, records);
  }
  if (rc == 0) rc = Disk(k8b, o.quick ? 2 : 8, o.quick ? 1 : 3, scratch, records);
  if (rc == 0) rc = Disk(kRef, o.quick ? 16 : 256, o.quick ? 1 : 3, scratch, records);
  if (rc == 0) KeyHash(repeats, scratch, records);
  if (rc == 0) Lookup(repeats, scratch, records);
  if (rc == 0) rc = HitRates(scratch, o.quick, records);
  fs::remove_all(dir, ec);
  if (rc != 0) return rc;
  if (!records.Write(o.json_path)) {
    std::fprintf(stderr, "kdn bench store: cannot write %s\n", o.json_path.c_str());
    return 2;
  }
  std::printf("wrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace kdn::bench

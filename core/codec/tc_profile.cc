// SPDX-License-Identifier: Apache-2.0
#include "core/codec/tc_profile.h"

#include <openssl/evp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "kernels/common/kdn_quant.h"
#include "kernels/common/tc_math.h"

namespace kdn::codec {
namespace {

constexpr char kMagic[8] = {'K', 'D', 'N', 'T', 'C', 'P', 'F', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{256} << 20;
constexpr std::uint32_t kMaxLayers = 4096, kMaxChannels = 4096, kMaxPresets = 64, kMaxFingerprints = 64;

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    out.insert(out.end(), b, b + n);
  }
  std::vector<std::uint8_t> out;
};

class Reader {
 public:
  Reader(const std::uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  template <typename T>
  bool Get(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool Bytes(void* out, size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) return false;
    std::memcpy(out, p_, n);
    p_ += n;
    return true;
  }
  bool Floats(std::vector<float>* v, size_t n) {
    if (static_cast<size_t>(end_ - p_) / 4 < n) return false;
    v->resize(n);
    std::memcpy(v->data(), p_, n * 4);
    p_ += n * 4;
    for (float f : *v) {
      if (!std::isfinite(f)) return false;
    }
    return true;
  }
  bool done() const { return p_ == end_; }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

std::array<std::uint8_t, 32> Sha256(const std::uint8_t* p, size_t n) {
  std::array<std::uint8_t, 32> d{};
  unsigned int len = 0;
  EVP_Digest(p, n, d.data(), &len, EVP_sha256(), nullptr);
  return d;
}

std::uint64_t IdOf(const std::array<std::uint8_t, 32>& d) {
  std::uint64_t id = 0;
  for (int i = 7; i >= 0; --i) id = id << 8 | d[static_cast<size_t>(i)];
  return id;
}

struct Registry {
  std::shared_mutex mu;  // decoders only read
  std::map<std::uint64_t, std::shared_ptr<const TcProfile>> by_id;
};
Registry& TheRegistry() {
  static Registry* r = new Registry;  // never destroyed: decoders may run at exit
  return *r;
}

// Why `p` cannot be written or used, or "" if it can.
std::string Problem(const TcProfile& p) {
  if (p.layers == 0 || p.layers > kMaxLayers) return "layers out of range";
  if (p.kv_heads == 0 || p.head_dim == 0 || std::uint64_t{p.kv_heads} * p.head_dim > kMaxChannels) {
    return "channels out of range";
  }
  if (p.head_dim > kernels::kTcMaxHeadDim) return "head_dim over 512";
  if (p.rope.head_dim != static_cast<int>(p.head_dim)) return "RoPE head_dim differs from the model's";
  if (const char* why = kernels::rope_spec_problem(p.rope)) return std::string("RoPE: ") + why;
  const size_t planes = size_t{p.layers} * 2, C = p.channels();
  if (p.plane_weight.size() != planes || p.planes.size() != planes) return "plane count differs from layers x 2";
  for (double w : p.plane_weight) {
    if (!(w > 0 && std::isfinite(w))) return "a plane weight is not finite and positive";
  }
  for (const TcPlane& pl : p.planes) {
    if (pl.mean.size() != C || pl.var.size() != C || pl.basis.size() != C * C) return "a plane's sizes";
    if (!(pl.sigma > 0 && std::isfinite(pl.sigma))) return "a plane's sigma is not finite and positive";
  }
  if (p.tables.empty() || p.tables.size() > kTcMaxTables) return "table count out of range";
  bool widest = false;  // the encoder needs codes up to +-127
  for (const TcTable& t : p.tables) widest = widest || t.range == kernels::kKdnMaxCode;
  if (!widest) return "no table covers codes up to 127";
  if (p.fingerprints.size() > kMaxFingerprints || p.presets.size() > kMaxPresets) return "too many entries";
  return "";
}

void DeriveBases(TcProfile* p) {
  const size_t C = p->channels();
  p->bases.clear();
  p->bases_t.clear();
  for (TcPlane& pl : p->planes) {
    pl.basis_t.resize(C * C);
    for (size_t c = 0; c < C; ++c) {
      for (size_t i = 0; i < C; ++i) pl.basis_t[i * C + c] = pl.basis[c * C + i];
    }
    p->bases.insert(p->bases.end(), pl.basis.begin(), pl.basis.end());
    p->bases_t.insert(p->bases_t.end(), pl.basis_t.begin(), pl.basis_t.end());
  }
  p->slots.clear();
  for (const TcTable& t : p->tables) p->slots.insert(p->slots.end(), t.slots.begin(), t.slots.end());
}

}  // namespace

bool TcProfile::Fits(const std::uint8_t* fingerprint) const {
  for (const auto& f : fingerprints) {
    if (std::memcmp(f.data(), fingerprint, 32) == 0) return true;
  }
  return false;
}

bool PrepareTcTable(TcTable* t) {
  if (t->range < 1 || t->range > kernels::kKdnMaxCode || t->freq.size() != 2 * size_t{t->range} + 1) return false;
  std::uint32_t sum = 0;
  t->start.resize(t->freq.size());
  for (size_t s = 0; s < t->freq.size(); ++s) {
    if (t->freq[s] == 0) return false;
    t->start[s] = sum;
    sum += t->freq[s];
  }
  if (sum != 1u << kTcScaleBits) return false;
  t->rcp.resize(t->freq.size());
  t->bits.resize(t->freq.size());
  for (size_t s = 0; s < t->freq.size(); ++s) {
    t->rcp[s] = kernels::kdn_rcp(t->freq[s]);
    t->bits[s] = static_cast<float>(kTcScaleBits - std::log2(static_cast<double>(t->freq[s])));
  }
  t->slots.resize(size_t{1} << kTcScaleBits);
  for (size_t s = 0; s < t->freq.size(); ++s) {
    for (std::uint32_t k = 0; k < t->freq[s]; ++k) {
      t->slots[t->start[s] + k] = kernels::kdn_slot_pack(static_cast<std::uint32_t>(s), t->start[s], t->freq[s]);
    }
  }
  return true;
}

Result<std::vector<std::uint8_t>> SerializeTcProfile(TcProfile* p) {
  if (std::string why = Problem(*p); !why.empty()) return Status::InvalidArgument("transform profile: " + why);
  for (TcTable& t : p->tables) {
    if (!PrepareTcTable(&t)) return Status::InvalidArgument("transform profile: a table is not a 12-bit model");
  }
  Writer w;
  w.Bytes(kMagic, sizeof kMagic);
  w.Put(kVersion);
  w.Put(p->layers);
  w.Put(p->kv_heads);
  w.Put(p->head_dim);
  w.Put(static_cast<std::uint32_t>(kernels::rope_rotary_dim(p->rope)));
  w.Put(static_cast<std::uint32_t>(p->rope.style));
  w.Put(static_cast<std::uint32_t>(p->rope.scaling));
  w.Put(p->rope.theta);
  w.Put(p->rope.factor);
  w.Put(static_cast<std::uint32_t>(p->fingerprints.size()));
  for (const auto& f : p->fingerprints) w.Bytes(f.data(), f.size());
  w.Put(static_cast<std::uint32_t>(p->presets.size()));
  for (const auto& [name, params] : p->presets) {
    const std::string line = name + " " + params;
    if (line.size() > 0xFFFF) return Status::InvalidArgument("transform profile: a preset line is too long");
    w.Put(static_cast<std::uint16_t>(line.size()));
    w.Bytes(line.data(), line.size());
  }
  for (double v : p->plane_weight) w.Put(v);
  for (const TcPlane& pl : p->planes) {
    w.Put(pl.sigma);
    w.Bytes(pl.mean.data(), pl.mean.size() * 4);
    w.Bytes(pl.basis.data(), pl.basis.size() * 4);
    w.Bytes(pl.var.data(), pl.var.size() * 4);
  }
  w.Put(static_cast<std::uint32_t>(p->tables.size()));
  for (const TcTable& t : p->tables) {
    w.Put(t.kind);
    w.Put(t.scale);
    w.Put(static_cast<std::uint8_t>(t.range));
    w.Bytes(t.freq.data(), t.freq.size() * 2);
  }
  const auto digest = Sha256(w.out.data(), w.out.size());
  w.Bytes(digest.data(), digest.size());
  p->id = IdOf(digest);
  p->digest = digest;
  DeriveBases(p);
  return std::move(w.out);
}

Result<std::shared_ptr<const TcProfile>> ParseTcProfile(const std::vector<std::uint8_t>& bytes) {
  auto corrupt = [](const std::string& why) { return Status::Corrupt("transform profile: " + why); };
  if (bytes.size() < sizeof kMagic + 32) return corrupt("truncated");
  const size_t body = bytes.size() - 32;
  const auto digest = Sha256(bytes.data(), body);
  if (std::memcmp(digest.data(), bytes.data() + body, 32) != 0) return corrupt("its digest does not match");
  Reader r(bytes.data(), body);
  char magic[8];
  std::uint32_t version = 0;
  if (!r.Bytes(magic, 8) || std::memcmp(magic, kMagic, 8) != 0) return corrupt("not a transform profile");
  if (!r.Get(&version) || version != kVersion) return corrupt("unknown version " + std::to_string(version));
  auto p = std::make_shared<TcProfile>();
  std::uint32_t rotary = 0, style = 0, scaling = 0, n = 0;
  if (!r.Get(&p->layers) || !r.Get(&p->kv_heads) || !r.Get(&p->head_dim) || !r.Get(&rotary) || !r.Get(&style) ||
      !r.Get(&scaling) || !r.Get(&p->rope.theta) || !r.Get(&p->rope.factor)) {
    return corrupt("truncated header");
  }
  if (p->layers == 0 || p->layers > kMaxLayers || p->kv_heads == 0 || p->head_dim == 0 ||
      std::uint64_t{p->kv_heads} * p->head_dim > kMaxChannels || style > 1 || scaling > 2) {
    return corrupt("shape or RoPE out of range");
  }
  p->rope.head_dim = static_cast<int>(p->head_dim);
  p->rope.rotary_dim = static_cast<int>(rotary);
  p->rope.style = static_cast<kernels::RopeStyle>(style);
  p->rope.scaling = static_cast<kernels::RopeScaling>(scaling);
  if (!r.Get(&n) || n > kMaxFingerprints) return corrupt("fingerprints");
  p->fingerprints.resize(n);
  for (auto& f : p->fingerprints) {
    if (!r.Bytes(f.data(), f.size())) return corrupt("truncated fingerprints");
  }
  if (!r.Get(&n) || n > kMaxPresets) return corrupt("presets");
  for (std::uint32_t i = 0; i < n; ++i) {
    std::uint16_t len = 0;
    if (!r.Get(&len)) return corrupt("truncated presets");
    std::string line(len, '\0');
    if (!r.Bytes(line.data(), len)) return corrupt("truncated presets");
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0) return corrupt("a preset line without 'NAME PARAMS'");
    p->presets.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  const size_t planes = size_t{p->layers} * 2, C = p->channels();
  p->plane_weight.resize(planes);
  for (double& v : p->plane_weight) {
    if (!r.Get(&v)) return corrupt("truncated plane weights");
  }
  p->planes.resize(planes);
  for (TcPlane& pl : p->planes) {
    if (!r.Get(&pl.sigma) || !r.Floats(&pl.mean, C) || !r.Floats(&pl.basis, C * C) || !r.Floats(&pl.var, C)) {
      return corrupt("truncated or non-finite plane");
    }
  }
  if (!r.Get(&n) || n == 0 || n > kTcMaxTables) return corrupt("table count");
  p->tables.resize(n);
  for (TcTable& t : p->tables) {
    std::uint8_t range = 0;
    if (!r.Get(&t.kind) || !r.Get(&t.scale) || !r.Get(&range)) return corrupt("truncated table");
    t.range = range;
    t.freq.resize(2 * size_t{range} + 1);
    if (!r.Bytes(t.freq.data(), t.freq.size() * 2)) return corrupt("truncated table");
    if (!PrepareTcTable(&t)) return corrupt("a table is not a 12-bit model over 2R + 1 codes");
  }
  if (!r.done()) return corrupt("trailing bytes");
  if (std::string why = Problem(*p); !why.empty()) return corrupt(why);
  p->id = IdOf(digest);
  p->digest = digest;
  DeriveBases(p.get());
  return std::shared_ptr<const TcProfile>(std::move(p));
}

Result<std::shared_ptr<const TcProfile>> LoadTcProfile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return Status::InvalidArgument("transform profile '" + path + "': not a readable file");
  }
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxFileBytes) {
    return Status::InvalidArgument("transform profile '" + path + "': unreadable or over 256 MiB");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument("transform profile '" + path + "': cannot read it");
  std::vector<std::uint8_t> bytes(static_cast<size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (!in || in.peek() != std::char_traits<char>::eof()) {
    return Status::InvalidArgument("transform profile '" + path + "': read error (changed while read?)");
  }
  Result<std::shared_ptr<const TcProfile>> p = ParseTcProfile(bytes);
  if (!p.ok()) return Status(p.status().code(), "'" + path + "': " + p.status().message());
  KDN_RETURN_IF_ERROR(RegisterTcProfile(*p));
  return FindTcProfile((*p)->id);
}

Status RegisterTcProfile(std::shared_ptr<const TcProfile> profile) {
  Registry& r = TheRegistry();
  std::lock_guard<std::shared_mutex> lock(r.mu);
  auto [it, fresh] = r.by_id.emplace(profile->id, profile);
  if (!fresh && it->second->digest != profile->digest) {
    return Status::InvalidArgument("transform profile: another profile with the same id is loaded");
  }
  return Status::Ok();
}

std::shared_ptr<const TcProfile> FindTcProfile(std::uint64_t id) {
  Registry& r = TheRegistry();
  std::shared_lock<std::shared_mutex> lock(r.mu);
  auto it = r.by_id.find(id);
  return it == r.by_id.end() ? nullptr : it->second;
}

}  // namespace kdn::codec

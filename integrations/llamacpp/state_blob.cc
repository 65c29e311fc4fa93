// SPDX-License-Identifier: Apache-2.0
// llama.cpp's sequence state and kdn's canonical KV; the format is in
// state_blob.h.
#include "state_blob.h"
#include "core/util/dtype.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <string>

namespace kdn::llamacpp {
namespace {

// A bounds-checked little-endian reader over the blob.
class Reader {
 public:
  Reader(const std::uint8_t* p, std::size_t n) : p_(p), n_(n) {}
  template <typename T>
  bool Get(T* v) {
    if (n_ - pos_ < sizeof(T)) return false;
    std::memcpy(v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // A pointer to the next `bytes` bytes, or null when they are not there.
  const std::uint8_t* Take(std::uint64_t bytes) {
    if (bytes > n_ - pos_) return nullptr;
    const std::uint8_t* at = p_ + pos_;
    pos_ += static_cast<std::size_t>(bytes);
    return at;
  }
  std::size_t pos() const { return pos_; }

 private:
  const std::uint8_t* p_;
  std::size_t n_, pos_ = 0;
};

template <typename T>
void Put(std::vector<std::uint8_t>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

std::uint32_t ElementBytes(std::uint32_t dtype) { return kdn::DtypeBytes(dtype); }

Status Short(const char* what) { return Status::Corrupt(std::string("llama.cpp state: truncated in ") + what); }

}  // namespace

Result<CanonicalKv> BlobToCanonical(const std::uint8_t* blob, std::size_t size, const KvShape& shape) {
  Result<std::vector<CanonicalKv>> caches = BlobToCanonical(blob, size, std::span<const KvShape>(&shape, 1));
  if (!caches.ok()) return caches.status();
  return std::move(caches->front());
}

namespace {

// One cache's state, from the reader's position (its stream count on).
Result<CanonicalKv> ParseCache(Reader& r, const KvShape& shape) {
  std::uint32_t streams = 0, cells = 0;
  if (!r.Get(&streams)) return Short("the header");
  if (streams != 1) {
    return Status::Unsupported("llama.cpp state: " + std::to_string(streams) + " streams (kdn takes 1)");
  }
  if (!r.Get(&cells)) return Short("the cell count");
  CanonicalKv kv;
  if (cells == 0) return kv;
  // Cells: one sequence each, positions first .. first + cells - 1 each once
  // (first 0, or later in a sliding-window cache that dropped older tokens).
  std::vector<std::int32_t> pos_of(cells);
  for (std::uint32_t c = 0; c < cells; ++c) {
    std::uint32_t n_seq = 0;
    if (!r.Get(&pos_of[c]) || !r.Get(&n_seq)) return Short("the cells");
    if (n_seq != 1) return Status::Unsupported("llama.cpp state: a cell of " + std::to_string(n_seq) + " sequences");
    std::int32_t seq = 0;
    if (!r.Get(&seq)) return Short("the cells");
  }
  const std::int64_t first = *std::min_element(pos_of.begin(), pos_of.end());
  std::vector<std::int64_t> cell_of(cells, -1);  // position - first -> cell
  for (std::uint32_t c = 0; c < cells; ++c) {
    const std::int64_t at = std::int64_t{pos_of[c]} - first;
    if (first < 0 || at >= cells || cell_of[static_cast<std::size_t>(at)] >= 0) {
      return Status::Unsupported("llama.cpp state: positions are not " + std::to_string(first) + ".." +
                                 std::to_string(first + cells - 1) + " each once (position " +
                                 std::to_string(pos_of[c]) + ")");
    }
    cell_of[static_cast<std::size_t>(at)] = c;
  }
  std::uint32_t v_trans = 0, layers = 0;
  if (!r.Get(&v_trans) || !r.Get(&layers)) return Short("the layer count");
  if (v_trans > 1) return Status::Corrupt("llama.cpp state: v_trans " + std::to_string(v_trans));
  if (shape.layers != 0 && layers != shape.layers) {
    return Status::InvalidArgument("llama.cpp state: " + std::to_string(layers) + " layers, the model has " +
                                   std::to_string(shape.layers));
  }
  const std::uint64_t C = shape.channels();
  std::int32_t dtype = -1;
  // K then V rows of every layer: pointers into the blob.
  std::vector<const std::uint8_t*> k(layers), v(layers);
  auto type_ok = [&](std::int32_t t) -> Status {
    if (t != 0 && t != 1) {
      return Status::Unsupported("llama.cpp state: a cache of ggml type " + std::to_string(t) +
                                              " (kdn takes f32 and f16)");
    }
    if (dtype >= 0 && t != dtype) return Status::Unsupported("llama.cpp state: K and V of different types");
    dtype = t;
    return Status::Ok();
  };
  for (std::uint32_t l = 0; l < layers; ++l) {
    std::int32_t t = 0;
    std::uint64_t row = 0;
    if (!r.Get(&t) || !r.Get(&row)) return Short("K");
    KDN_RETURN_IF_ERROR(type_ok(t));
    if (row != C * ElementBytes(static_cast<std::uint32_t>(t))) {
      return Status::InvalidArgument("llama.cpp state: K rows of " + std::to_string(row) + " bytes, the model's are " +
                                     std::to_string(C * ElementBytes(static_cast<std::uint32_t>(t))));
    }
    if ((k[l] = r.Take(row * cells)) == nullptr) return Short("K");
  }
  const std::uint32_t eb = ElementBytes(static_cast<std::uint32_t>(dtype));
  for (std::uint32_t l = 0; l < layers; ++l) {
    std::int32_t t = 0;
    if (!r.Get(&t)) return Short("V");
    KDN_RETURN_IF_ERROR(type_ok(t));
    if (v_trans == 0) {
      std::uint64_t row = 0;
      if (!r.Get(&row)) return Short("V");
      if (row != C * eb) return Status::InvalidArgument("llama.cpp state: V rows of " + std::to_string(row) + " bytes");
    } else {
      std::uint32_t el = 0, per_token = 0;
      if (!r.Get(&el) || !r.Get(&per_token)) return Short("V");
      if (el != eb || per_token != C) {
        return Status::InvalidArgument("llama.cpp state: V of " + std::to_string(per_token) + " values of " +
                                       std::to_string(el) + " bytes a token");
      }
    }
    if ((v[l] = r.Take(C * eb * cells)) == nullptr) return Short("V");
  }

  kv.dtype = static_cast<std::uint32_t>(dtype);
  kv.v_trans = v_trans == 1;
  kv.first = static_cast<std::uint64_t>(first);
  kv.tokens = cells;
  const std::uint64_t row = C * eb;
  kv.bytes.resize(static_cast<std::size_t>(2ull * layers * cells * row));
  for (std::uint32_t l = 0; l < layers; ++l) {
    std::uint8_t* kout = kv.bytes.data() + (2ull * l) * cells * row;
    std::uint8_t* vout = kout + cells * row;
    for (std::uint32_t p = 0; p < cells; ++p) {
      const std::uint64_t c = static_cast<std::uint64_t>(cell_of[p]);
      std::memcpy(kout + p * row, k[l] + c * row, row);
      if (!kv.v_trans) {
        std::memcpy(vout + p * row, v[l] + c * row, row);
      } else {
        for (std::uint64_t j = 0; j < C; ++j) std::memcpy(vout + p * row + j * eb, v[l] + (j * cells + c) * eb, eb);
      }
    }
  }
  return kv;
}

}  // namespace

Result<std::vector<CanonicalKv>> BlobToCanonical(const std::uint8_t* blob, std::size_t size,
                                                 std::span<const KvShape> caches) {
  if (blob == nullptr && size > 0) return Status::InvalidArgument("llama.cpp state: null blob");
  Reader r(blob, size);
  std::uint32_t magic = 0;
  std::int32_t source = 0;
  if (!r.Get(&magic) || !r.Get(&source)) return Short("the header");
  if (magic != kStateMagic) {
    return Status::Unsupported("llama.cpp state: unknown magic " + std::to_string(magic) +
                               " (not a sequence state of the llama.cpp kdn was built for)");
  }
  std::vector<CanonicalKv> out;
  for (const KvShape& shape : caches) {
    Result<CanonicalKv> kv = ParseCache(r, shape);
    if (!kv.ok()) return kv.status();
    out.push_back(std::move(kv).value());
  }
  if (r.pos() != size) {
    return Status::Corrupt(out.back().tokens == 0 ? "llama.cpp state: bytes after an empty sequence"
                                                   : "llama.cpp state: bytes after the last layer");
  }
  return out;
}

Result<std::vector<std::uint8_t>> CanonicalToBlob(const CanonicalKv& kv, const KvShape& shape) {
  return CanonicalToBlob(std::span<const CanonicalKv>(&kv, 1), std::span<const KvShape>(&shape, 1));
}

namespace {

// One cache's state (from its stream count on), appended to `out`.
Status AppendCache(const CanonicalKv& kv, const KvShape& shape, std::vector<std::uint8_t>& out) {
  if (kv.dtype > 1) return Status::InvalidArgument("llama.cpp state: dtype " + std::to_string(kv.dtype) + " (f32 or f16)");
  const std::uint64_t C = shape.channels(), eb = ElementBytes(kv.dtype), row = C * eb, n = kv.tokens;
  if (n > 0x7FFFFFFFull) return Status::InvalidArgument("llama.cpp state: too many tokens");
  if (kv.bytes.size() != 2ull * shape.layers * n * row) {
    return Status::InvalidArgument("llama.cpp state: " + std::to_string(kv.bytes.size()) + " canonical bytes for " +
                                   std::to_string(n) + " tokens");
  }
  out.reserve(out.size() + 16 + 12 * n + 2 * shape.layers * (16 + n * row));
  Put(out, std::uint32_t{1});
  Put(out, static_cast<std::uint32_t>(n));
  if (n == 0) return Status::Ok();
  if (kv.first + n > 0x7FFFFFFFull) return Status::InvalidArgument("llama.cpp state: positions past 2^31");
  for (std::uint64_t p = 0; p < n; ++p) {
    Put(out, static_cast<std::int32_t>(kv.first + p));
    Put(out, std::uint32_t{1});
    Put(out, std::int32_t{0});
  }
  Put(out, std::uint32_t{kv.v_trans ? 1u : 0u});
  Put(out, shape.layers);
  auto append = [&](const std::uint8_t* p, std::uint64_t bytes) { out.insert(out.end(), p, p + bytes); };
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    Put(out, static_cast<std::int32_t>(kv.dtype));
    Put(out, row);
    append(kv.bytes.data() + 2ull * l * n * row, n * row);
  }
  for (std::uint32_t l = 0; l < shape.layers; ++l) {
    const std::uint8_t* vin = kv.bytes.data() + (2ull * l + 1) * n * row;
    Put(out, static_cast<std::int32_t>(kv.dtype));
    if (!kv.v_trans) {
      Put(out, row);
      append(vin, n * row);
    } else {
      Put(out, static_cast<std::uint32_t>(eb));
      Put(out, static_cast<std::uint32_t>(C));
      const std::size_t at = out.size();
      out.resize(at + static_cast<std::size_t>(C * n * eb));
      for (std::uint64_t j = 0; j < C; ++j) {
        for (std::uint64_t p = 0; p < n; ++p) std::memcpy(out.data() + at + (j * n + p) * eb, vin + p * row + j * eb, eb);
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::uint8_t>> CanonicalToBlob(std::span<const CanonicalKv> caches, std::span<const KvShape> shapes) {
  if (caches.size() != shapes.size() || caches.empty()) {
    return Status::InvalidArgument("llama.cpp state: " + std::to_string(caches.size()) + " caches for " +
                                   std::to_string(shapes.size()) + " shapes");
  }
  std::vector<std::uint8_t> out;
  Put(out, kStateMagic);
  Put(out, std::int32_t{0});
  for (size_t i = 0; i < caches.size(); ++i) KDN_RETURN_IF_ERROR(AppendCache(caches[i], shapes[i], out));
  return out;
}

}  // namespace kdn::llamacpp

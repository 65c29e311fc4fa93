// SPDX-License-Identifier: Apache-2.0
// llama.cpp's sequence state and kdn's canonical KV; the format is in
// state_blob.h.
#include "state_blob.h"
#include "core/util/dtype.h"

#include <cstring>
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
  bool done() const { return pos_ == n_; }

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
  if (blob == nullptr && size > 0) return Status::InvalidArgument("llama.cpp state: null blob");
  Reader r(blob, size);
  std::uint32_t magic = 0, streams = 0, cells = 0;
  std::int32_t source = 0;
  if (!r.Get(&magic) || !r.Get(&source) || !r.Get(&streams)) return Short("the header");
  if (magic != kStateMagic) {
    return Status::Unsupported("llama.cpp state: unknown magic " + std::to_string(magic) +
                                            " (not a sequence state of the llama.cpp kdn was built for)");
  }
  if (streams != 1) {
    return Status::Unsupported("llama.cpp state: " + std::to_string(streams) + " streams (kdn takes 1)");
  }
  if (!r.Get(&cells)) return Short("the cell count");
  CanonicalKv kv;
  if (cells == 0) return r.done() ? Result<CanonicalKv>(kv) : Status::Corrupt("llama.cpp state: bytes after an empty sequence");
  // Cells: each position once, one sequence each.
  std::vector<std::int64_t> cell_of(cells, -1);  // position -> cell
  for (std::uint32_t c = 0; c < cells; ++c) {
    std::int32_t pos = 0;
    std::uint32_t n_seq = 0;
    if (!r.Get(&pos) || !r.Get(&n_seq)) return Short("the cells");
    if (n_seq != 1) return Status::Unsupported("llama.cpp state: a cell of " + std::to_string(n_seq) + " sequences");
    std::int32_t seq = 0;
    if (!r.Get(&seq)) return Short("the cells");
    if (pos < 0 || static_cast<std::uint32_t>(pos) >= cells || cell_of[static_cast<std::size_t>(pos)] >= 0) {
      return Status::Unsupported("llama.cpp state: positions are not 0.." + std::to_string(cells - 1) +
                                              " each once (position " + std::to_string(pos) + ")");
    }
    cell_of[static_cast<std::size_t>(pos)] = c;
  }
  std::uint32_t v_trans = 0, layers = 0;
  if (!r.Get(&v_trans) || !r.Get(&layers)) return Short("the layer count");
  if (v_trans > 1) return Status::Corrupt("llama.cpp state: v_trans " + std::to_string(v_trans));
  if (layers != shape.layers) {
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
  if (!r.done()) return Status::Corrupt("llama.cpp state: bytes after the last layer");

  kv.dtype = static_cast<std::uint32_t>(dtype);
  kv.v_trans = v_trans == 1;
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

Result<std::vector<std::uint8_t>> CanonicalToBlob(const CanonicalKv& kv, const KvShape& shape) {
  if (kv.dtype > 1) return Status::InvalidArgument("llama.cpp state: dtype " + std::to_string(kv.dtype) + " (f32 or f16)");
  const std::uint64_t C = shape.channels(), eb = ElementBytes(kv.dtype), row = C * eb, n = kv.tokens;
  if (n > 0x7FFFFFFFull) return Status::InvalidArgument("llama.cpp state: too many tokens");
  if (kv.bytes.size() != 2ull * shape.layers * n * row) {
    return Status::InvalidArgument("llama.cpp state: " + std::to_string(kv.bytes.size()) + " canonical bytes for " +
                                   std::to_string(n) + " tokens");
  }
  std::vector<std::uint8_t> out;
  out.reserve(24 + 12 * n + 2 * shape.layers * (16 + n * row));
  Put(out, kStateMagic);
  Put(out, std::int32_t{0});
  Put(out, std::uint32_t{1});
  Put(out, static_cast<std::uint32_t>(n));
  if (n == 0) return out;
  for (std::uint64_t p = 0; p < n; ++p) {
    Put(out, static_cast<std::int32_t>(p));
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
  return out;
}

}  // namespace kdn::llamacpp

// SPDX-License-Identifier: Apache-2.0
#include "core/codec/payload.h"

#include <bit>
#include <charconv>
#include <cstring>

#include "kernels/common/half.h"
#include "kernels/common/kdn_quant.h"

namespace kdn::codec::internal {
namespace {

static_assert(std::endian::native == std::endian::little, "payloads are written as the memory image");

constexpr std::uint8_t kMagic[4] = {'K', 'D', 'N', 'C'};

void PutU32(std::uint8_t* p, std::uint32_t v) { std::memcpy(p, &v, 4); }
std::uint32_t GetU32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::uint32_t Fnv1a(const std::uint8_t* p, size_t n) {
  std::uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

std::string ShapeString(const Shape& s) {
  return std::to_string(s.layers) + "x2x" + std::to_string(s.tokens) + "x" + std::to_string(s.kv_heads) + "x" +
         std::to_string(s.head_dim) + " dtype " + std::to_string(s.dtype);
}

}  // namespace

void WriteHeader(const Header& h, std::uint8_t* out) {
  std::memcpy(out, kMagic, 4);
  const std::uint16_t version = kVersion, id = static_cast<std::uint16_t>(h.id);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 6, &id, 2);
  PutU32(out + 8, h.shape.layers);
  PutU32(out + 12, h.shape.kv_heads);
  PutU32(out + 16, h.shape.head_dim);
  PutU32(out + 20, h.shape.tokens);
  PutU32(out + 24, h.shape.dtype);
  PutU32(out + 28, h.param0);
  PutU32(out + 32, h.param1);
  PutU32(out + 36, Fnv1a(out, 36));
}

Result<Header> ReadHeader(CodecId id, const Shape& shape, const std::uint8_t* data, size_t size) {
  if (size < kHeaderBytes || data == nullptr) {
    return Status::Corrupt("codec payload truncated: " + std::to_string(size) + " bytes, the header alone is " +
                           std::to_string(kHeaderBytes));
  }
  if (std::memcmp(data, kMagic, 4) != 0) return Status::Corrupt("codec payload: bad magic (not a kdn codec payload)");
  std::uint16_t version, got_id;
  std::memcpy(&version, data + 4, 2);
  std::memcpy(&got_id, data + 6, 2);
  if (GetU32(data + 36) != Fnv1a(data, 36)) return Status::Corrupt("codec payload: header checksum mismatch");
  if (version != kVersion) {
    return Status::Corrupt("codec payload: version " + std::to_string(version) + ", this build reads " +
                           std::to_string(kVersion));
  }
  if (got_id != static_cast<std::uint16_t>(id)) {
    return Status::Corrupt("codec payload: written by codec id " + std::to_string(got_id) + ", decoding as codec id " +
                           std::to_string(static_cast<std::uint32_t>(id)));
  }
  Header h;
  h.id = id;
  h.shape.layers = GetU32(data + 8);
  h.shape.kv_heads = GetU32(data + 12);
  h.shape.head_dim = GetU32(data + 16);
  h.shape.tokens = GetU32(data + 20);
  h.shape.dtype = GetU32(data + 24);
  h.param0 = GetU32(data + 28);
  h.param1 = GetU32(data + 32);
  if (!(h.shape == shape)) {
    return Status::Corrupt("codec payload: describes a chunk of " + ShapeString(h.shape) + ", expected " +
                           ShapeString(shape));
  }
  return h;
}

Status CheckShape(const Shape& shape) {
  if (shape.dtype > 2) return Status::InvalidArgument("codec: unknown dtype " + std::to_string(shape.dtype));
  std::uint64_t n = 2;
  for (std::uint64_t f : {std::uint64_t{shape.layers}, std::uint64_t{shape.tokens}, std::uint64_t{shape.kv_heads},
                          std::uint64_t{shape.head_dim}}) {
    if (__builtin_mul_overflow(n, f, &n) || n > (std::uint64_t{1} << 40)) {
      return Status::InvalidArgument("codec: chunk too large: " + ShapeString(shape));
    }
  }
  return Status::Ok();
}

float LoadElement(std::uint32_t dtype, const std::uint8_t* base, std::uint64_t i) {
  if (dtype == 0) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  }
  std::uint16_t h;
  std::memcpy(&h, base + i * 2, 2);
  return dtype == 1 ? kernels::half_to_float(h) : kernels::bf16_to_float(h);
}

void StoreElement(std::uint32_t dtype, std::uint8_t* base, std::uint64_t i, float v) {
  if (dtype == 0) {
    std::memcpy(base + i * 4, &v, 4);
    return;
  }
  const std::uint16_t h = dtype == 1 ? kernels::float_to_half(v) : kernels::float_to_bf16(v);
  std::memcpy(base + i * 2, &h, 2);
}

bool FitsDtype(std::uint32_t dtype, float maxabs) {
  if (!(maxabs <= 3.4028235e38f)) return false;  // inf or NaN
  if (dtype == 1) return kernels::float_to_half(maxabs) < 0x7C00u;
  if (dtype == 2) return kernels::float_to_bf16(maxabs) < 0x7F80u;
  return true;
}

void PutF32(std::uint8_t* p, float v) { std::memcpy(p, &v, 4); }
float GetF32(const std::uint8_t* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

Status RejectUnknownParams(const Spec& spec, std::initializer_list<std::string_view> known) {
  for (const auto& [k, v] : spec.params) {
    bool ok = false;
    for (std::string_view n : known) ok = ok || k == n;
    if (!ok) {
      return Status::InvalidArgument("codec '" + spec.name + "': unknown parameter '" + k + "' (value '" + v + "')");
    }
  }
  return Status::Ok();
}

Result<std::uint32_t> ParseUint(const std::string& name, const std::string& value, std::uint32_t lo,
                                std::uint32_t hi) {
  std::uint32_t v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || ptr != end || v < lo || v > hi) {
    return Status::InvalidArgument("codec parameter " + name + "=" + value + ": expected an integer in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

Result<double> ParseFloat(const std::string& name, const std::string& value, double lo, double hi) {
  double v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (value.empty() || ec != std::errc() || ptr != end || !(v >= lo && v <= hi)) {
    return Status::InvalidArgument("codec parameter " + name + "=" + value + ": expected a number in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

Result<std::vector<double>> ParseList(const std::string& name, const std::string& value) {
  std::vector<double> out;
  size_t start = 0;
  while (true) {
    const size_t sep = value.find('_', start);
    Result<double> v = ParseFloat(name, value.substr(start, sep - start), 1e-3, 1e3);
    if (!v.ok()) return v.status();
    out.push_back(*v);
    if (sep == std::string::npos) break;
    start = sep + 1;
  }
  return out;
}

Result<bool> ParseStepField(const std::string& key, const std::string& value, const StepFields& f) {
  if (key == "step" || key == "vmul") {
    Result<double> v = key == "step" ? ParseFloat(key, value, 1e-3, 64) : ParseFloat(key, value, 1e-2, 1e2);
    if (!v.ok()) return v.status();
    *(key == "step" ? f.step : f.vmul) = *v;
    return true;
  }
  if (key == "sink" || key == "lanes") {
    Result<std::uint32_t> v = key == "sink" ? ParseUint(key, value, 0, 1024) : ParseUint(key, value, 1, kernels::kKdnMaxLanes);
    if (!v.ok()) return v.status();
    *(key == "sink" ? f.sinks : f.lanes) = *v;
    return true;
  }
  if (key == "pw") {
    Result<std::vector<double>> v = ParseList(key, value);
    if (!v.ok()) return v.status();
    *f.plane_weight = std::move(v).value();
    return true;
  }
  return false;
}

}  // namespace kdn::codec::internal

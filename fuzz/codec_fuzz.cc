// SPDX-License-Identifier: Apache-2.0
// kdn_codec_fuzz: a libFuzzer target for the decoders that read untrusted
// bytes: the KV codec decoders (core/codec, every id DecoderFor knows), the
// rANS table and stream parser (codec/rans.h) and the chunk envelope
// (wire/envelope.h). Built with -DKDN_FUZZ=ON; run by fuzz/run.
//
// The contract checked, for any input:
// - no crash, no out-of-bounds access or undefined behaviour (ASan, UBSan),
//   no uncaught exception, no hang (-timeout), bounded memory (-rss_limit_mb);
// - codec Decode returns Ok or kCorrupt for a valid shape (kInvalidArgument
//   for a bad dtype); on Ok every element of `out` was written and is finite
//   (`out` starts as NaN bytes, so an element left unwritten fails too), and
//   a second decode into zeroed memory gives the same bytes.
//   raw and zstd (lossless) are exempt from finiteness by design: they
//   return the stored bytes as they are (checked for raw);
// - Encode's own output always decodes (when no mutation was applied);
// - rANS: a parsed table is valid and re-serializes to the bytes it was read
//   from; a stream that decodes re-encodes to exactly its bytes; a table
//   built from counts serializes, parses back, and round-trips its symbols;
// - envelope: a decoded chunk has the payload its shape says, re-encodes and
//   decodes again to the same chunk; an untouched envelope decodes.
//
// Input layout. Byte 0 picks a mode (byte 0 % 8); each mode reads what follows
// through Input (reads past the end give 0):
//   0, 1  kAsIs:      Shape, decoder id u8, then the payload as is.
//   2     kSynth:     Shape, decoder id u8, header id u8, param0, param1
//                     (Param), then the body: a valid header for the shape is
//                     written in front of it, so decoders get past the header.
//   3-5   kMutate:    Shape, spec u8, spec parameter u8, decoder u8, KV
//                     profile u8, KV seed u8, fix-up flags u8, resize
//                     (u8 op, u16 amount), then up to 64 edits (u24 position
//                     mod size, u8 value: xor, or set when position bit 23 is
//                     set) applied to a valid payload that Encode wrote for a
//                     deterministic KV of the shape. Reaches the checks deep
//                     inside each decoder, which random bytes rarely do.
//   6     kRans:      sub-mode u8; even: lanes u8, count u16, then a table
//                     (ParseTable format) and a stream, both as is; odd:
//                     scale u8, alphabet u8, lanes u8, counts (alphabet
//                     bytes), then symbols (taken modulo the present ones).
//   7     kEnvelope:  sub-mode u8; even: the envelope as is (bit 1: read at
//                     an odd address; bit 2: expect the all-zero key; bit 3:
//                     pass an owner); 1 mod 4: Shape, seed u8, then edits as
//                     in kMutate, applied to a valid envelope of random raw
//                     KV or (seed bit 7) of a codec's payload; 3 mod 4: a
//                     message built field by field from the input (RunEnvelopeFields)
//                     with correct checksums, which reaches the checks
//                     behind them. An envelope that decodes has its codec
//                     payload decoded and checked too.
// Shape: layers u8 (1 + b % 5), kv_heads u8 (1 + b % 4), head_dim u8
// (1 + b % 16), tokens u16 (% 301), dtype u8 (% 3), flags u8 (low nibble
// 0xF: dtype 3, which no codec knows; high nibble 0xF: one dimension zero,
// 0xE: 6 + b % 7 layers).
//
// KDN_FUZZ_WRITE_SEEDS=DIR kdn_codec_fuzz writes a seed corpus (every mode,
// every codec spec and dtype) into DIR and exits. fuzz/run writes it afresh
// before each run, so the seeds always match this file and the codecs'
// current formats.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "core/codec/codec.h"
#include "core/codec/payload.h"
#include "core/codec/rans.h"
#include "lab/codec/tc_calibrate.h"
#include "core/codec/tc_profile.h"
#include "core/keys/hash.h"
#include "core/store/tier.h"
#include "core/wire/chunk.capnp.h"
#include "core/wire/envelope.h"

namespace kdn::fuzz {
namespace {

using codec::CodecId;
using codec::Shape;
using codec::Spec;

constexpr std::uint32_t kCodecIds = 8;  // CodecId 0..7
constexpr std::size_t kMaxEdits = 64;
constexpr std::size_t kMaxRansCount = 4096;

// ------------------------------------------------------------ reporting

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "kdn_codec_fuzz: contract violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void Require(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

std::string Describe(const Shape& s) {
  return std::to_string(s.layers) + "x2x" + std::to_string(s.tokens) + "x" + std::to_string(s.kv_heads) + "x" +
         std::to_string(s.head_dim) + " dtype " + std::to_string(s.dtype);
}

// ------------------------------------------------------------ input

// Reads the fuzz input front to back; past the end every read gives 0, so
// any input is a complete instruction.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  // Little-endian; each read is its own statement (the order in which the
  // operands of | are evaluated is unspecified).
  std::uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t U16() {
    const std::uint32_t lo = U8();
    return static_cast<std::uint16_t>(lo | std::uint32_t{U8()} << 8);
  }
  std::uint32_t U24() {
    const std::uint32_t lo = U16();
    return lo | std::uint32_t{U8()} << 16;
  }
  std::uint32_t U32() {
    const std::uint32_t lo = U24();
    return lo | std::uint32_t{U8()} << 24;
  }
  std::size_t remaining() const { return size_ - pos_; }
  // The unread bytes (possibly none); consumes them.
  std::span<const std::uint8_t> Rest() {
    std::span<const std::uint8_t> r(data_ + pos_, size_ - pos_);
    pos_ = size_;
    return r;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The inverse of Input, for writing seeds.
struct Output {
  std::vector<std::uint8_t> bytes;
  void U8(std::uint32_t v) { bytes.push_back(static_cast<std::uint8_t>(v)); }
  void U16(std::uint32_t v) { U8(v), U8(v >> 8); }
  void U32(std::uint32_t v) { U16(v), U16(v >> 16); }
  void Append(std::span<const std::uint8_t> b) { bytes.insert(bytes.end(), b.begin(), b.end()); }
};

Shape ReadShape(Input& in) {
  Shape s;
  const std::uint8_t layers = in.U8();
  s.layers = 1 + layers % 5u;
  s.kv_heads = 1 + in.U8() % 4u;
  s.head_dim = 1 + in.U8() % 16u;
  s.tokens = in.U16() % 301u;
  s.dtype = in.U8() % 3u;
  const std::uint8_t flags = in.U8();
  if ((flags & 0x0F) == 0x0F) s.dtype = 3;
  if ((flags & 0xF0) == 0xE0) s.layers = 6 + layers % 7u;  // 6..12: schedules that change at layer 10
  if ((flags & 0xF0) == 0xF0) {
    switch (flags & 3) {
      case 0: s.layers = 0; break;
      case 1: s.kv_heads = 0; break;
      case 2: s.head_dim = 0; break;
      default: s.tokens = 0; break;
    }
  }
  return s;
}

// Writes the bytes ReadShape reads back as `s` (dimensions in range, dtype <= 2).
void WriteShape(Output& out, const Shape& s) {
  out.U8(s.layers - 1);
  out.U8(s.kv_heads - 1);
  out.U8(s.head_dim - 1);
  out.U16(s.tokens);
  out.U8(s.dtype);
  out.U8(0);
}

// A codec parameter: 0, or a u8, u16 or u32 (selector byte first).
std::uint32_t ReadParam(Input& in) {
  switch (in.U8() % 4) {
    case 0: return 0;
    case 1: return in.U8();
    case 2: return in.U16();
    default: return in.U32();
  }
}

// ------------------------------------------------------------ deterministic KV

class SplitMix {
 public:
  explicit SplitMix(std::uint64_t seed) : s_(seed) {}
  std::uint64_t Next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  float Unit() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f); }
  float Signed() { return 2.0f * Unit() - 1.0f; }

 private:
  std::uint64_t s_;
};

// The largest magnitude a dtype holds (with margin for rounding).
float DtypeMax(std::uint32_t dtype) { return dtype == 1 ? 65000.0f : 3.0e38f; }

// A chunk of `s` in its dtype's bytes; `profile` picks the value
// distribution (KV-like with outlier channels, zeros, a constant, values near
// the dtype's largest, tiny and subnormal values, sparse spikes).
std::vector<std::uint8_t> MakeKv(const Shape& s, std::uint8_t profile, std::uint8_t seed) {
  std::vector<std::uint8_t> kv(s.bytes());
  SplitMix rng(seed * 0x100000001B3ull ^ (std::uint64_t{s.layers} << 40) ^ (std::uint64_t{s.tokens} << 20) ^
               (s.kv_heads << 8) ^ s.head_dim);
  const float constant = rng.Signed() * 4.0f;
  const std::uint64_t n = s.elements();
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t channel = s.head_dim == 0 ? 0 : i % s.head_dim;
    float v = 0.0f;
    switch (profile % 6) {
      case 0: {  // roughly Gaussian, a few outlier channels
        const float g = rng.Signed() + rng.Signed() + rng.Signed();
        v = g * (channel % 7 == 3 ? 20.0f : 1.0f);
        break;
      }
      case 1: v = 0.0f; break;
      case 2: v = constant; break;
      case 3: v = rng.Signed() * DtypeMax(s.dtype); break;
      case 4: v = rng.Signed() * std::ldexp(1.0f, -static_cast<int>(rng.Next() % 140)); break;
      default: v = rng.Next() % 97 == 0 ? rng.Signed() * 1000.0f : 0.0f; break;
    }
    codec::internal::StoreElement(s.dtype, kv.data(), i, v);
  }
  return kv;
}

// ------------------------------------------------------------ codecs

// A transform profile for `shape`'s model (tc needs one): a Householder
// reflection as every plane's basis (orthonormal, not the identity), unit
// variances, the calibration's table family; written once per model shape
// to the temp directory and loaded (so registered) by the spec that names
// it. "" when the shape has no rotary pair (head_dim < 2).
std::string TcProfileFor(const Shape& shape) {
  static std::map<std::tuple<std::uint32_t, std::uint32_t, std::uint32_t>, std::string> made;
  const auto key = std::make_tuple(shape.layers, shape.kv_heads, shape.head_dim);
  if (auto it = made.find(key); it != made.end()) return it->second;
  if (shape.head_dim < 2 || shape.layers == 0 || shape.kv_heads == 0) return made[key] = "";
  codec::TcProfile p;
  p.layers = shape.layers;
  p.kv_heads = shape.kv_heads;
  p.head_dim = shape.head_dim;
  p.rope.head_dim = static_cast<int>(shape.head_dim);
  p.rope.rotary_dim = static_cast<int>(shape.head_dim & ~1u);
  const std::uint32_t C = p.channels();
  double vv = 0;
  for (std::uint32_t c = 0; c < C; ++c) vv += double(c + 1) * (c + 1);
  codec::TcPlane plane;
  plane.sigma = 1;
  plane.mean.assign(C, 0.0f);
  plane.var.assign(C, 1.0f);
  plane.basis.resize(size_t{C} * C);
  for (std::uint32_t r = 0; r < C; ++r) {
    for (std::uint32_t c = 0; c < C; ++c) {
      plane.basis[size_t{r} * C + c] = static_cast<float>((r == c ? 1.0 : 0.0) - 2.0 * (r + 1) * (c + 1) / vv);
    }
  }
  p.planes.assign(size_t{shape.layers} * 2, plane);
  p.plane_weight.assign(size_t{shape.layers} * 2, 1.0);
  p.tables = codec::TcTableFamily();
  Result<std::vector<std::uint8_t>> bytes = codec::SerializeTcProfile(&p);
  if (!bytes.ok()) Fail("the fuzzer's transform profile: " + bytes.status().message());
  // Named by the shape alone (the content is a function of it): written to a
  // temporary name and renamed, so concurrent fuzzers never read half a file.
  const std::string name = "kdn_fuzz_tc_" + std::to_string(shape.layers) + "_" + std::to_string(shape.kv_heads) +
                           "_" + std::to_string(shape.head_dim) + ".kdntc";
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / name).string(), tmp = (dir / (name + "." + std::to_string(getpid()))).string();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
    if (!out.flush()) Fail("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) Fail("cannot rename " + tmp + ": " + ec.message());
  return made[key] = path;
}

// The encoder specs kMutate draws from; `param` varies the parameterized ones.
Spec EncoderSpec(std::uint8_t which, std::uint8_t param, const Shape& shape) {
  switch (which % 14) {
    case 0: return Spec{"raw", {}};
    case 1: return Spec{"fp8", {}};
    case 2: return Spec{"fp8", {{"scale", "head"}}};
    case 3: return Spec{"int8", {}};
    case 4: return Spec{"kivi2", {}};
    case 5: return Spec{"kivi2", {{"bits", "4"}, {"group", std::to_string(1 + param % 64)}}};
    case 6: return Spec{"kivi2", {{"bits", "2"}, {"group", std::to_string(1 + param)}}};
    case 7: return Spec{"cachegen", {}};
    case 8: return Spec{"cachegen", {{"bins", "16"}}};
    case 9: return Spec{"cachegen", {{"bins", std::to_string(3 + param % 254)}}};
    case 11: return Spec{"zstd", {}};
    case 12: return Spec{"zstd", {{"level", std::to_string(1 + param % 19)}, {"shuffle", std::to_string(param & 1)}}};
    case 13: {
      const std::string profile = TcProfileFor(shape);
      if (profile.empty()) return Spec{"tc", {{"preset", "none"}}};  // refused by MakeCodec: skipped
      return Spec{"tc",
                  {{"profile", profile},
                   {"step", std::to_string(0.05 + (param % 32) * 0.05)},
                   {"sink", std::to_string(param / 32 % 3)},
                   {"lanes", std::to_string(1 + param % 8)}}};
    }
    default: return Spec{"kdn", {}};  // skipped while MakeCodec(kdn) fails
  }
}
constexpr std::uint8_t kEncoderSpecs = 14;

// A buffer of exactly n bytes on the heap, so that ASan reports any access
// past it (a std::vector's spare capacity would hide one).
std::unique_ptr<std::uint8_t[]> Exact(std::span<const std::uint8_t> bytes) {
  std::unique_ptr<std::uint8_t[]> p(new std::uint8_t[bytes.size()]);
  if (!bytes.empty()) std::memcpy(p.get(), bytes.data(), bytes.size());
  return p;
}

// Decodes `payload` as codec `id` for `shape` and checks the contract.
// Returns the status (Ok or not), or nullopt when the id has no decoder.
// `must_decode`: the payload is Encode's untouched output.
std::optional<Status> DecodeAndCheck(std::uint32_t id, const Shape& shape, std::span<const std::uint8_t> payload,
                                     bool must_decode) {
  Result<std::unique_ptr<codec::Codec>> decoder = codec::DecoderFor(static_cast<CodecId>(id));
  if (!decoder.ok()) return std::nullopt;  // an id not built (yet): skipped
  const std::string where = "codec id " + std::to_string(id) + ", shape " + Describe(shape) + ", payload of " +
                            std::to_string(payload.size()) + " bytes: ";
  const std::unique_ptr<std::uint8_t[]> in = Exact(payload);
  const std::uint64_t out_bytes = shape.bytes();
  std::unique_ptr<std::uint8_t[]> out(new std::uint8_t[out_bytes]);
  std::memset(out.get(), 0xFF, out_bytes);  // NaN in every dtype
  const Status st = (*decoder)->Decode(shape, payload.empty() ? nullptr : in.get(), payload.size(), out.get());
  if (shape.dtype > 2) {
    Require(st.code() == Code::kInvalidArgument, where + "a bad dtype gave '" + st.message() + "'");
    return st;
  }
  Require(st.ok() || st.code() == Code::kCorrupt,
          where + "status " + std::to_string(static_cast<int>(st.code())) + " ('" + st.message() +
              "'), expected Ok or kCorrupt");
  Require(st.ok() || !st.message().empty(), where + "an error without a message");
  if (must_decode) Require(st.ok(), where + "Encode's own payload does not decode: " + st.message());
  if (!st.ok()) return st;
  // The output depends on the payload alone: decoding again into zeroed
  // memory gives the same bytes (catches reads of `out` before it is
  // written, and bytes left unwritten, which ASan does not see).
  {
    std::unique_ptr<std::uint8_t[]> again(new std::uint8_t[out_bytes]);
    std::memset(again.get(), 0, out_bytes);
    const Status st2 = (*decoder)->Decode(shape, payload.empty() ? nullptr : in.get(), payload.size(), again.get());
    Require(st2.ok() && (out_bytes == 0 || std::memcmp(out.get(), again.get(), out_bytes) == 0),
            where + "a second decode into zeroed memory gave another result");
  }
  if (id == static_cast<std::uint32_t>(CodecId::kRaw)) {
    Require(payload.size() == codec::internal::kHeaderBytes + out_bytes &&
                (out_bytes == 0 || std::memcmp(out.get(), payload.data() + codec::internal::kHeaderBytes,
                                               out_bytes) == 0),
            where + "raw did not return its stored bytes");
    return st;
  }
  // zstd is lossless: it returns whatever bytes were encoded, finite or not
  // (its checksum makes a damaged frame kCorrupt).
  if (!codec::IsLossy(static_cast<CodecId>(id))) return st;
  const std::uint64_t n = shape.elements();
  for (std::uint64_t i = 0; i < n; ++i) {
    const float v = codec::internal::LoadElement(shape.dtype, out.get(), i);
    if (!std::isfinite(v)) {
      Fail(where + "decoded element " + std::to_string(i) + " is " + std::to_string(v) +
           " (non-finite, or never written)");
    }
  }
  return st;
}

// FNV-1a of header bytes 0..35: payload.h's header check.
void FixHeaderCheck(std::vector<std::uint8_t>& p) {
  if (p.size() < codec::internal::kHeaderBytes) return;
  std::uint32_t h = 2166136261u;
  for (std::size_t i = 0; i < 36; ++i) h = (h ^ p[i]) * 16777619u;
  std::memcpy(p.data() + 36, &h, 4);
}

// Resizes and edits `bytes` as the input says (see the layout above).
void ApplyEdits(Input& in, std::vector<std::uint8_t>& bytes) {
  const std::uint8_t op = in.U8();
  const std::uint16_t amount = in.U16();
  switch (op % 4) {
    case 1: bytes.resize(bytes.size() - std::min<std::size_t>(amount, bytes.size())); break;
    case 2: bytes.resize(bytes.size() + amount % 1024, static_cast<std::uint8_t>(amount >> 10)); break;
    case 3: if (!bytes.empty()) bytes.resize(amount % bytes.size()); break;
    default: break;
  }
  for (std::size_t e = 0; e < kMaxEdits && in.remaining() >= 4 && !bytes.empty(); ++e) {
    const std::uint32_t pos = in.U24();
    const std::uint8_t value = in.U8();
    std::uint8_t& b = bytes[(pos & 0x7FFFFF) % bytes.size()];
    b = (pos & 0x800000) ? value : static_cast<std::uint8_t>(b ^ value);
  }
}

// Encodes a deterministic KV (and sets *id to the codec's id); nullopt when
// the codec is not built, or refuses KV near its dtype's largest value
// (profile 3), which an encoder may do. Refusing other KV is a failure.
std::optional<std::vector<std::uint8_t>> EncodeKv(const Spec& spec, const Shape& shape, std::uint8_t profile,
                                                  std::uint8_t seed, std::uint32_t* id = nullptr) {
  Result<std::unique_ptr<codec::Codec>> c = codec::MakeCodec(spec);
  if (!c.ok()) return std::nullopt;
  if (id != nullptr) *id = static_cast<std::uint32_t>((*c)->id());
  const std::vector<std::uint8_t> kv = MakeKv(shape, profile, seed);
  const std::unique_ptr<std::uint8_t[]> kv_exact = Exact(kv);
  Result<codec::Bytes> payload = (*c)->Encode(shape, kv_exact.get());
  if (!payload.ok()) {
    if (shape.dtype <= 2 && profile % 6 != 3) {
      Fail("Encode (" + spec.ToString() + ", shape " + Describe(shape) + ", profile " + std::to_string(profile % 6) +
           ") refused finite KV: " + payload.status().message());
    }
    return std::nullopt;
  }
  return std::move(payload).value();
}

// ------------------------------------------------------------ modes

void RunAsIs(Input& in) {
  const Shape shape = ReadShape(in);
  const std::uint32_t id = in.U8() % kCodecIds;
  DecodeAndCheck(id, shape, in.Rest(), false);
}

void RunSynth(Input& in) {
  const Shape shape = ReadShape(in);
  const std::uint32_t id = in.U8() % kCodecIds;
  codec::internal::Header h;
  h.id = static_cast<CodecId>(in.U8() % 16 == 0 ? in.U8() % kCodecIds : id);
  h.shape = shape;
  h.param0 = ReadParam(in);
  h.param1 = ReadParam(in);
  const std::span<const std::uint8_t> body = in.Rest();
  std::vector<std::uint8_t> payload(codec::internal::kHeaderBytes + body.size());
  codec::internal::WriteHeader(h, payload.data());
  if (!body.empty()) std::memcpy(payload.data() + codec::internal::kHeaderBytes, body.data(), body.size());
  DecodeAndCheck(id, shape, payload, false);
}

void RunMutate(Input& in) {
  const Shape shape = ReadShape(in);
  const std::uint8_t which = in.U8();
  const Spec spec = EncoderSpec(which, in.U8(), shape);
  const std::uint8_t decoder = in.U8(), profile = in.U8(), seed = in.U8(), fix = in.U8();
  if (shape.dtype > 2) return;  // nothing to encode
  std::uint32_t encoder_id = 0;
  std::optional<std::vector<std::uint8_t>> payload = EncodeKv(spec, shape, profile, seed, &encoder_id);
  if (!payload) return;
  const std::uint32_t id = decoder >= 240 ? decoder % kCodecIds : encoder_id;
  const std::vector<std::uint8_t> original = *payload;
  ApplyEdits(in, *payload);
  if (fix & 1) FixHeaderCheck(*payload);  // so that edits to the header reach its fields
  // (Compared at the end: an edit can be undone by a later one or by the fix-up.)
  DecodeAndCheck(id, shape, *payload, *payload == original && id == encoder_id);
}

void RunRansParse(Input& in) {
  const std::uint8_t lanes_byte = in.U8();
  // 250..255: invalid lane counts (0, 33, 66, ...).
  const std::uint32_t lanes = lanes_byte >= 250 ? (lanes_byte - 250u) * 33u : 1 + lanes_byte % codec::rans::kMaxLanes;
  const std::size_t count = in.U16() % (kMaxRansCount + 1);
  const std::span<const std::uint8_t> rest = in.Rest();
  const std::unique_ptr<std::uint8_t[]> bytes = Exact(rest);
  std::size_t consumed = ~std::size_t{0};
  Result<codec::rans::FreqTable> table =
      codec::rans::ParseTable(std::span<const std::uint8_t>(bytes.get(), rest.size()), &consumed);
  if (!table.ok()) {
    Require(table.status().code() == Code::kCorrupt, "rans ParseTable: status other than kCorrupt: " +
                                                         table.status().message());
    return;
  }
  Require(consumed <= rest.size(), "rans ParseTable consumed more than it was given");
  Require(codec::rans::ValidateTable(*table).ok(), "rans ParseTable returned an invalid table");
  std::vector<std::uint8_t> reserialized;
  codec::rans::SerializeTable(*table, &reserialized);
  Require(reserialized.size() == consumed && std::memcmp(reserialized.data(), bytes.get(), consumed) == 0,
          "rans: a parsed table does not serialize back to its bytes");
  const std::span<const std::uint8_t> stream(bytes.get() + consumed, rest.size() - consumed);
  std::unique_ptr<std::uint8_t[]> out(new std::uint8_t[count]);
  const Status st = codec::rans::Decode(stream, *table, count, out.get(), lanes);
  if (lanes < 1 || lanes > codec::rans::kMaxLanes) {
    Require(st.code() == Code::kInvalidArgument, "rans Decode accepted lanes " + std::to_string(lanes));
    return;
  }
  Require(st.ok() || st.code() == Code::kCorrupt, "rans Decode: status other than kCorrupt: " + st.message());
  if (!st.ok()) return;
  for (std::size_t i = 0; i < count; ++i) {
    Require(out[i] < table->freq.size() && table->freq[out[i]] > 0, "rans Decode produced an absent symbol");
  }
  Result<std::vector<std::uint8_t>> re = codec::rans::Encode(std::span<const std::uint8_t>(out.get(), count),
                                                             *table, lanes);
  Require(re.ok(), "rans Encode refused Decode's symbols: " + re.status().message());
  Require(*re == std::vector<std::uint8_t>(stream.begin(), stream.end()),
          "rans: a stream that decodes does not re-encode to its own bytes (" + std::to_string(count) +
              " symbols, " + std::to_string(lanes) + " lanes)");
}

void RunRansBuild(Input& in) {
  const std::uint32_t scale_bits = in.U8() % 17;  // 0 and 16: invalid
  const std::size_t alphabet = in.U8() + std::size_t{1};
  const std::uint32_t lanes = 1 + in.U8() % codec::rans::kMaxLanes;
  std::vector<std::uint64_t> counts(alphabet);
  std::vector<std::uint8_t> present;
  for (std::size_t s = 0; s < alphabet; ++s) {
    const std::uint8_t b = in.U8();
    counts[s] = b < 128 ? 0 : (b < 250 ? b - 127u : std::uint64_t{b} << (b - 240));
    if (counts[s] != 0) present.push_back(static_cast<std::uint8_t>(s));
  }
  Result<codec::rans::FreqTable> table = codec::rans::BuildTable(counts, scale_bits);
  if (!table.ok()) {
    Require(table.status().code() == Code::kInvalidArgument, "rans BuildTable: " + table.status().message());
    Require(scale_bits < 1 || scale_bits > codec::rans::kMaxScaleBits || present.size() > (1u << scale_bits),
            "rans BuildTable refused a valid request: " + table.status().message());
    return;
  }
  Require(codec::rans::ValidateTable(*table).ok(), "rans BuildTable returned an invalid table");
  for (std::size_t s = 0; s < alphabet; ++s) {
    // All-zero counts give symbol 0 the whole range (a table for no symbols).
    const bool want_slots = present.empty() ? s == 0 : counts[s] != 0;
    Require(want_slots == (table->freq[s] != 0), "rans BuildTable: symbol " + std::to_string(s) + " (count " +
                                                      std::to_string(counts[s]) + ") got " +
                                                      std::to_string(table->freq[s]) + " slots");
  }
  std::vector<std::uint8_t> serialized;
  codec::rans::SerializeTable(*table, &serialized);
  std::size_t consumed = 0;
  Result<codec::rans::FreqTable> parsed = codec::rans::ParseTable(serialized, &consumed);
  Require(parsed.ok() && consumed == serialized.size() && parsed->freq == table->freq && parsed->cum == table->cum,
          "rans: a built table does not parse back");
  std::vector<std::uint8_t> symbols;
  if (!present.empty()) {
    for (std::uint8_t b : in.Rest()) symbols.push_back(present[b % present.size()]);
  }
  if (symbols.size() > kMaxRansCount) symbols.resize(kMaxRansCount);
  Result<std::vector<std::uint8_t>> stream = codec::rans::Encode(symbols, *table, lanes);
  Require(stream.ok(), "rans Encode failed: " + stream.status().message());
  const std::unique_ptr<std::uint8_t[]> exact = Exact(*stream);
  std::unique_ptr<std::uint8_t[]> out(new std::uint8_t[symbols.size()]);
  const Status st = codec::rans::Decode(std::span<const std::uint8_t>(exact.get(), stream->size()), *table,
                                        symbols.size(), out.get(), lanes);
  Require(st.ok(), "rans: Encode's stream does not decode: " + st.message());
  Require(symbols.empty() || std::memcmp(out.get(), symbols.data(), symbols.size()) == 0,
          "rans: the round trip changed the symbols");
}

// The chunk's shape as the codecs see it.
Shape ShapeOf(const store::ChunkMeta& m) { return Shape{m.layers, m.kv_heads, m.head_dim, m.tokens, m.dtype}; }

void CheckDecodedChunk(const store::ChunkRef& chunk) {
  Require(chunk != nullptr, "envelope: Ok with no chunk");
  const store::ChunkMeta& m = chunk->meta;
  if (m.codec == CodecId::kRaw) {
    Require(chunk->payload.size() == m.payload_bytes(), "envelope: a raw payload's size does not match the shape");
  } else {
    Require(!chunk->payload.empty(), "envelope: an empty encoded payload");
    // What a read through the chain does next (store::DecodeChunk): the
    // codec decodes the payload for the envelope's shape. Bounded shapes only.
    const Shape shape = ShapeOf(m);
    if (codec::internal::CheckShape(shape).ok() && shape.bytes() <= (std::uint64_t{1} << 24)) {
      DecodeAndCheck(static_cast<std::uint32_t>(m.codec), shape,
                     std::span<const std::uint8_t>(chunk->payload.data(), chunk->payload.size()), false);
    }
  }
  Result<store::Bytes> again = wire::EncodeEnvelope(*chunk);
  Require(again.ok(), "envelope: a decoded chunk does not re-encode: " + again.status().message());
  const std::unique_ptr<std::uint8_t[]> exact = Exact(*again);
  Result<store::ChunkRef> back = wire::DecodeEnvelope(exact.get(), again->size(), nullptr);
  Require(back.ok(), "envelope: a re-encoded chunk does not decode: " + back.status().message());
  Require((*back)->meta == chunk->meta && (*back)->payload.size() == chunk->payload.size() &&
              (chunk->payload.empty() ||
               std::memcmp((*back)->payload.data(), chunk->payload.data(), chunk->payload.size()) == 0),
          "envelope: the re-encoded chunk differs");
}

void RequireEnvelopeStatus(const Status& st) {
  Require(st.ok() || st.code() == Code::kCorrupt || st.code() == Code::kUnsupported,
          "envelope: status " + std::to_string(static_cast<int>(st.code())) + " ('" + st.message() + "')");
}

void RunEnvelopeAsIs(Input& in, std::uint8_t sub) {
  const std::span<const std::uint8_t> rest = in.Rest();
  // One byte of slack in front, to place the envelope at an odd address.
  const std::size_t offset = (sub & 2) ? 1 : 0;
  std::shared_ptr<std::uint8_t[]> buf(new std::uint8_t[rest.size() + offset]);
  if (!rest.empty()) std::memcpy(buf.get() + offset, rest.data(), rest.size());
  const keys::Digest zero{};
  Result<store::ChunkRef> chunk =
      wire::DecodeEnvelope(buf.get() + offset, rest.size(), (sub & 4) ? &zero : nullptr,
                           (sub & 8) ? std::shared_ptr<void>(buf) : nullptr);
  RequireEnvelopeStatus(chunk.status());
  if (chunk.ok()) CheckDecodedChunk(*chunk);
}

// A chunk of `shape` with random metadata; its payload is random raw KV, or
// (seed bit 7) a codec's encoding of a deterministic KV.
store::Chunk RandomChunk(const Shape& shape, std::uint8_t seed) {
  store::Chunk chunk;
  SplitMix rng(seed);
  chunk.meta.dtype = shape.dtype;
  chunk.meta.layers = shape.layers;
  chunk.meta.kv_heads = shape.kv_heads;
  chunk.meta.head_dim = shape.head_dim;
  chunk.meta.tokens = shape.tokens;
  chunk.meta.first_position = (seed & 1) ? -1 : static_cast<std::int64_t>(rng.Next() % 100000);
  chunk.meta.edited = (seed & 2) != 0;
  for (auto& b : chunk.meta.key) b = static_cast<std::uint8_t>(rng.Next());
  for (auto& b : chunk.meta.model) b = static_cast<std::uint8_t>(rng.Next());
  std::vector<std::uint8_t> payload(chunk.meta.payload_bytes());
  for (auto& b : payload) b = static_cast<std::uint8_t>(rng.Next());
  std::uint32_t id = 0;
  if (seed & 0x80) {
    std::optional<std::vector<std::uint8_t>> encoded = EncodeKv(EncoderSpec(seed & 0x7F, seed, shape), shape, 0, seed, &id);
    // meta.codec kRaw means the canonical bytes themselves, not the raw
    // codec's payload: such a chunk keeps its random KV.
    if (encoded && id != static_cast<std::uint32_t>(CodecId::kRaw)) {
      payload = std::move(*encoded);
      chunk.meta.codec = static_cast<CodecId>(id);
    }
  }
  chunk.payload = store::Payload(payload.data(), payload.size());
  return chunk;
}

void RunEnvelopeMutate(Input& in) {
  Shape shape = ReadShape(in);
  shape.tokens %= 17;  // keep the payload (and the checksums over it) small
  const std::uint8_t seed = in.U8();
  if (shape.dtype > 2) return;
  const store::Chunk chunk = RandomChunk(shape, seed);
  Result<store::Bytes> encoded = wire::EncodeEnvelope(chunk);
  Require(encoded.ok(), "envelope: EncodeEnvelope failed: " + encoded.status().message());
  std::vector<std::uint8_t> bytes = *encoded;
  ApplyEdits(in, bytes);
  const bool changed = bytes != *encoded;
  const std::unique_ptr<std::uint8_t[]> exact = Exact(bytes);
  Result<store::ChunkRef> decoded = wire::DecodeEnvelope(exact.get(), bytes.size(), nullptr);
  RequireEnvelopeStatus(decoded.status());
  if (!changed) Require(decoded.ok(), "envelope: an untouched envelope does not decode: " + decoded.status().message());
  if (decoded.ok()) CheckDecodedChunk(*decoded);
}

// An envelope message written field by field: each field is the value
// EncodeEnvelope would write unless a flag picks one from the input
// (versions, codec, dtype, checksum algorithm, shape dimensions of any u32,
// digest sizes, payload pieces, either checksum). Layout after the sub-mode:
// flags u16, Shape, seed u8, then the fields the flags ask for, in the order
// below, then (flag 0x400) the payload bytes themselves.
void RunEnvelopeFields(Input& in) {
  const std::uint16_t flags = in.U16();
  const Shape shape = ReadShape(in);
  const std::uint8_t seed = in.U8();
  if (shape.dtype > 2) return;
  store::Chunk chunk = RandomChunk(shape, seed);
  std::vector<std::uint8_t> payload(chunk.payload.begin(), chunk.payload.end());
  wire::EnvelopeHeader h;
  h.meta = chunk.meta;
  h.codec = static_cast<std::uint16_t>(chunk.meta.codec);
  if (flags & 0x001) h.version_major = in.U8() % 4;
  if (flags & 0x002) h.version_minor = in.U8() % 4;
  if (flags & 0x004) h.codec = in.U8() % 8;
  if (flags & 0x008) h.meta.dtype = in.U8() % 4;
  if (flags & 0x010) h.checksum_algorithm = in.U8() % 2;
  if (flags & 0x020) {
    h.meta.layers = in.U32(), h.meta.kv_heads = in.U32(), h.meta.head_dim = in.U32(), h.meta.tokens = in.U32();
  }
  std::size_t digest_bytes[3] = {32, 32, 32};
  if (flags & 0x040) {
    for (std::size_t& d : digest_bytes) d = in.U8() % 40;
  }
  // 0: no pieces; 1: one; 2: the payload cut in two; 3: an empty piece too.
  // EncodeEnvelope writes one piece, none for an empty payload.
  std::uint8_t pieces = 1;
  if (flags & 0x080) pieces = in.U8() % 4;
  const bool bad_checksum = flags & 0x100, bad_header_checksum = flags & 0x200;
  const std::uint64_t stored_checksum = bad_checksum ? in.U32() : 0;
  const std::uint64_t stored_header_checksum = bad_header_checksum ? in.U32() : 0;
  if (flags & 0x400) {
    const std::span<const std::uint8_t> rest = in.Rest();
    payload.assign(rest.begin(), rest.end());
  }
  if (pieces == 0) payload.clear();
  h.payload_bytes = payload.size();
  h.checksum = bad_checksum ? stored_checksum : wire::PayloadChecksum(payload.data(), payload.size());

  // One segment, as EncodeEnvelope writes (a version 1.0 reader requires it):
  // the first segment holds the whole message, with room for odd digests.
  capnp::MallocMessageBuilder builder(static_cast<unsigned>(wire::EncodedEnvelopeSize(payload.size()) / 8 + 64));
  wire::schema::ChunkEnvelope::Builder e = builder.initRoot<wire::schema::ChunkEnvelope>();
  e.setVersionMajor(h.version_major);
  e.setVersionMinor(h.version_minor);
  const keys::Digest* digests[3] = {&h.meta.model, &h.meta.ns_hash, &h.meta.key};
  std::uint8_t odd_digest[40] = {};
  for (int i = 0; i < 3; ++i) {
    const std::uint8_t* bytes = digest_bytes[i] <= 32 ? digests[i]->data() : odd_digest;
    const capnp::Data::Reader blob(bytes, digest_bytes[i]);
    if (i == 0) e.setModel(blob);
    if (i == 1) e.setNamespaceHash(blob);
    if (i == 2) e.setKey(blob);
  }
  e.setCodec(static_cast<wire::schema::Codec>(h.codec));
  e.setDtype(static_cast<wire::schema::DType>(h.meta.dtype));
  e.getShape().setLayers(h.meta.layers);
  e.getShape().setKvHeads(h.meta.kv_heads);
  e.getShape().setHeadDim(h.meta.head_dim);
  e.getShape().setTokens(h.meta.tokens);
  e.setFirstPosition(h.meta.first_position);
  e.setEdited(h.meta.edited);
  const std::size_t cut = pieces >= 2 ? payload.size() / 2 : payload.size();
  const unsigned n_pieces = pieces == 1 && payload.empty() && !(flags & 0x080) ? 0u : pieces;
  capnp::List<capnp::Data>::Builder list = e.initPayload(n_pieces);
  if (n_pieces >= 1) list.set(0, capnp::Data::Reader(payload.data(), cut));
  if (n_pieces >= 2) list.set(1, capnp::Data::Reader(payload.data() + cut, payload.size() - cut));
  if (n_pieces >= 3) list.set(2, capnp::Data::Reader(payload.data(), 0));
  e.setChecksum(h.checksum);
  e.setChecksumAlgorithm(static_cast<wire::schema::ChecksumAlgorithm>(h.checksum_algorithm));
  e.setHeaderChecksum(bad_header_checksum ? stored_header_checksum : wire::HeaderChecksum(h));
  const kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  const kj::ArrayPtr<const kj::byte> message = flat.asBytes();
  const std::unique_ptr<std::uint8_t[]> exact = Exact(std::span<const std::uint8_t>(message.begin(), message.size()));
  Result<store::ChunkRef> decoded = wire::DecodeEnvelope(exact.get(), message.size(), nullptr);
  RequireEnvelopeStatus(decoded.status());
  if (decoded.ok()) CheckDecodedChunk(*decoded);
  // Nothing changed from what EncodeEnvelope writes: it must decode.
  if ((flags & 0x7FF) == 0) {
    Require(decoded.ok(), "envelope: a message built as EncodeEnvelope builds it does not decode: " +
                              decoded.status().message());
  }
}

void Run(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  const std::uint8_t mode = in.U8();
  switch (mode % 8) {
    case 0:
    case 1: RunAsIs(in); break;
    case 2: RunSynth(in); break;
    case 3:
    case 4:
    case 5: RunMutate(in); break;
    case 6:
      if (in.U8() % 2 == 0) RunRansParse(in); else RunRansBuild(in);
      break;
    default: {
      const std::uint8_t sub = in.U8();
      if (sub % 2 == 0) {
        RunEnvelopeAsIs(in, sub);
      } else if (sub % 4 == 1) {
        RunEnvelopeMutate(in);
      } else {
        RunEnvelopeFields(in);
      }
      break;
    }
  }
}

// ------------------------------------------------------------ seeds

void WriteSeed(const std::string& dir, const std::string& name, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(dir + "/" + name, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) {
    std::fprintf(stderr, "kdn_codec_fuzz: cannot write %s/%s\n", dir.c_str(), name.c_str());
    std::exit(1);
  }
}

std::string SeedName(const Spec& spec) {
  Spec named = spec;
  named.params.erase("profile");  // a path
  std::string s = named.ToString();
  for (char& c : s) {
    if (c == ':' || c == ',' || c == '=') c = '-';
  }
  return s;
}

// One seed per mode, codec spec and dtype: valid inputs each mode decodes
// successfully, which libFuzzer then mutates.
int WriteSeeds(const std::string& dir) {
  // A small chunk, and one of more than 256 tokens (several cachegen streams).
  const Shape shapes[] = {{2, 2, 8, 20, 0}, {3, 2, 5, 260, 0}};
  int written = 0;
  for (std::uint32_t dtype = 0; dtype < 3; ++dtype) {
    for (std::uint8_t which = 0; which < kEncoderSpecs; ++which) {
      for (std::size_t k = 0; k < std::size(shapes); ++k) {
        Shape shape = shapes[k];
        shape.dtype = dtype;
        const std::uint8_t param = 7, profile = 0, seed = static_cast<std::uint8_t>(k + 1);
        const Spec spec = EncoderSpec(which, param, shape);
        std::optional<std::vector<std::uint8_t>> payload = EncodeKv(spec, shape, profile, seed);
        if (!payload) continue;
        const std::string tag = SeedName(spec) + "-dt" + std::to_string(dtype) + "-s" + std::to_string(k);
        // kMutate, no edits.
        Output m;
        m.U8(3);
        WriteShape(m, shape);
        m.U8(which), m.U8(param), m.U8(0), m.U8(profile), m.U8(seed), m.U8(0), m.U8(0), m.U16(0);
        WriteSeed(dir, "mutate-" + tag, m.bytes);
        // kAsIs: the payload itself (small shapes only: libFuzzer's inputs are
        // kept short).
        if (payload->size() <= 4096) {
          Output a;
          a.U8(0);
          WriteShape(a, shape);
          Result<std::unique_ptr<codec::Codec>> c = codec::MakeCodec(spec);
          a.U8(static_cast<std::uint32_t>((*c)->id()));
          a.Append(*payload);
          WriteSeed(dir, "asis-" + tag, a.bytes);
          // kSynth: the same body behind a synthesized header.
          codec::internal::Header h;
          std::memcpy(&h.param0, payload->data() + 28, 4);
          std::memcpy(&h.param1, payload->data() + 32, 4);
          Output s;
          s.U8(2);
          WriteShape(s, shape);
          s.U8(static_cast<std::uint32_t>((*c)->id()));
          s.U8(1);  // header id = decoder id
          s.U8(3), s.U32(h.param0);
          s.U8(3), s.U32(h.param1);
          s.Append(std::span<const std::uint8_t>(*payload).subspan(codec::internal::kHeaderBytes));
          WriteSeed(dir, "synth-" + tag, s.bytes);
          written += 2;
        }
        ++written;
      }
    }
  }
  // rANS: a table and stream from the encoder, for 1, 4 and 32 lanes.
  for (std::uint32_t lanes : {1u, 4u, 32u}) {
    const std::vector<std::uint64_t> counts = {5, 0, 1, 9, 3, 0, 0, 2};
    Result<codec::rans::FreqTable> table = codec::rans::BuildTable(counts, 10);
    std::vector<std::uint8_t> symbols;
    for (int i = 0; i < 100; ++i) symbols.push_back(static_cast<std::uint8_t>(i * 7 % 8 == 1 ? 0 : i * 3 % 8));
    for (auto& s : symbols) {
      if (counts[s] == 0) s = 3;
    }
    Result<std::vector<std::uint8_t>> stream = codec::rans::Encode(symbols, *table, lanes);
    Output p;
    p.U8(6), p.U8(0), p.U8(lanes - 1), p.U16(static_cast<std::uint32_t>(symbols.size()));
    std::vector<std::uint8_t> t;
    codec::rans::SerializeTable(*table, &t);
    p.Append(t);
    p.Append(*stream);
    WriteSeed(dir, "rans-parse-l" + std::to_string(lanes), p.bytes);
    Output b;
    b.U8(6), b.U8(1), b.U8(12), b.U8(15), b.U8(lanes - 1);
    for (int s = 0; s < 16; ++s) b.U8(s % 3 == 0 ? 0 : 128 + s * 7);
    for (int i = 0; i < 200; ++i) b.U8(i * 37);
    WriteSeed(dir, "rans-build-l" + std::to_string(lanes), b.bytes);
    written += 2;
  }
  // Envelopes: as is (aligned and not, with and without an owner) and mutated.
  for (std::uint32_t dtype = 0; dtype < 3; ++dtype) {
    const Shape shape{2, 2, 4, 5, dtype};
    Result<store::Bytes> env = wire::EncodeEnvelope(RandomChunk(shape, 3));
    for (std::uint8_t sub : {0, 2, 8}) {
      Output e;
      e.U8(7), e.U8(sub);
      e.Append(*env);
      WriteSeed(dir, "envelope-asis-" + std::to_string(sub) + "-dt" + std::to_string(dtype), e.bytes);
      ++written;
    }
    for (std::uint8_t seed : {3, 0x80 | 1, 0x80 | 3, 0x80 | 4, 0x80 | 7, 0x80 | 10}) {
      Output m;
      m.U8(7), m.U8(1);
      WriteShape(m, shape);
      m.U8(seed), m.U8(0), m.U16(0);
      WriteSeed(dir, "envelope-mutate-" + std::to_string(seed) + "-dt" + std::to_string(dtype), m.bytes);
      ++written;
      Output a;
      a.U8(7), a.U8(0);
      a.Append(*wire::EncodeEnvelope(RandomChunk(shape, seed)));
      WriteSeed(dir, "envelope-asis-" + std::to_string(seed) + "-dt" + std::to_string(dtype), a.bytes);
      ++written;
    }
  }
  // Envelopes built field by field: as EncodeEnvelope would, then with each
  // flag on its own (its fields zero).
  for (std::uint32_t flag = 0; flag <= 11; ++flag) {
    for (std::uint8_t seed : {3, 0x80 | 4, 0x80 | 7}) {
      Output f;
      f.U8(7), f.U8(3);
      f.U16(flag == 0 ? 0 : 1u << (flag - 1));
      WriteShape(f, Shape{2, 2, 4, 5, 0});
      f.U8(seed);
      WriteSeed(dir, "envelope-fields-" + std::to_string(flag) + "-" + std::to_string(seed), f.bytes);
      ++written;
    }
  }
  // cachegen's default schedule changes at layer 10.
  for (std::uint8_t which : {7, 8}) {
    Output m;
    m.U8(3);
    m.U8(12 - 6), m.U8(0), m.U8(3), m.U16(9), m.U8(0), m.U8(0xE0);
    m.U8(which), m.U8(0), m.U8(0), m.U8(0), m.U8(1), m.U8(0), m.U8(0), m.U16(0);
    WriteSeed(dir, "mutate-12-layers-" + std::to_string(which), m.bytes);
    ++written;
  }
  std::fprintf(stderr, "kdn_codec_fuzz: wrote %d seeds to %s\n", written, dir.c_str());
  return 0;
}

}  // namespace
}  // namespace kdn::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("KDN_FUZZ_WRITE_SEEDS"); dir != nullptr && *dir != '\0') {
    std::exit(kdn::fuzz::WriteSeeds(dir));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kdn::fuzz::Run(data, size);
  return 0;
}

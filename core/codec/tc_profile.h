// SPDX-License-Identifier: Apache-2.0
// The transform codec's profile (issue 17): what `kdn codec calibrate
// --transform` learns of one model's KV, once, for every chunk of it.
//
// Per plane p = (layer, k|v), over the C = kv_heads * head_dim channels of a
// token (keys with RoPE undone at their positions first):
//   mean[C]      the calibration text's channel means (reported; the codec
//                sends each chunk's own means)
//   basis[C*C]   an orthonormal basis (a KLT: eigenvectors of the channels'
//                covariance), basis[c * C + i] = component i's weight on
//                channel c; components by decreasing variance
//   var[C]       each component's variance on the calibration text
//   sigma        the plane's RMS deviation (sqrt(sum var / C))
// plus the model's RoPE (to undo it on keys), the fingerprints of the
// models it fits (a chunk of another model is refused), the codec's presets
// ("balanced step=0.5,vmul=2.5"), per-plane step weights, and a family of
// static rANS tables (discretized Laplace and Gauss densities of growing
// scale, 12-bit) from which the encoder picks one per component and chunk:
// the tables live here, not in each chunk, so a 256-token chunk pays one
// byte per component for its model.
//
// File (little-endian, every field fixed-size unless said):
//   magic "KDNTCPF1" (8), version u32 (1)
//   layers, kv_heads, head_dim u32
//   rope: rotary_dim u32, style u32, scaling u32, theta f64, factor f64
//   fingerprints: n u32, n x 32 bytes
//   presets: n u32, n x (length u16, "NAME PARAMS" bytes)
//   plane weights: layers * 2 x f64
//   planes (layer-major, keys then values): sigma f64, mean C x f32,
//     basis C*C x f32, var C x f32
//   tables: n u32 (1..254), n x (kind u8, scale f32, R u8 in 1..127,
//     freq (2R + 1) x u16 summing to 4096, each >= 1)
//   sha256 of every byte before it (32)
// The profile's id is the first 8 bytes of that digest (little-endian): a
// payload names its profile by id, so a decoder holding another profile (or
// none) fails cleanly instead of decoding garbage.
//
// Thread-safety: a TcProfile is immutable once loaded; the registry is
// internally synchronized.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/common/rope_reposition.h"
#include "core/util/status.h"

namespace kdn::codec {

inline constexpr std::uint32_t kTcScaleBits = 12;
inline constexpr std::uint32_t kTcMaxTables = 254;
inline constexpr std::uint8_t kTcZeroTable = 255;  // a component coded as all zeros

struct TcTable {
  std::uint8_t kind = 0;  // 0 Laplace, 1 Gauss (reported only)
  float scale = 0;        // in quantization steps (reported only)
  std::uint32_t range = 0;           // R: symbols are codes in [-R, R]
  std::vector<std::uint16_t> freq;   // 2R + 1 entries, code q at q + R
  // Derived when loaded (not stored): cumulative starts, the encoder's
  // reciprocals (kernels::kdn_rcp) and code lengths in bits, and the
  // decoder's 4096 packed slots (kernels::kdn_slot_pack of symbol q + R).
  std::vector<std::uint32_t> start;
  std::vector<std::uint64_t> rcp;
  std::vector<float> bits;
  std::vector<std::uint32_t> slots;
};

struct TcPlane {
  double sigma = 0;
  std::vector<float> mean, basis, var;
  std::vector<float> basis_t;  // derived when loaded: basis_t[i * C + c] = basis[c * C + i]
};

struct TcProfile {
  std::uint32_t layers = 0, kv_heads = 0, head_dim = 0;
  kernels::RopeSpec rope;
  std::vector<std::array<std::uint8_t, 32>> fingerprints;
  std::vector<std::pair<std::string, std::string>> presets;  // name, "step=...,vmul=..."
  std::vector<double> plane_weight;  // layers * 2
  std::vector<TcPlane> planes;       // layers * 2
  std::vector<TcTable> tables;
  // Derived when loaded: every table's slots back to back ([table][4096]),
  // and every plane's basis back to back (the decoders' arrays).
  std::vector<std::uint32_t> slots;
  std::vector<float> bases, bases_t;
  std::uint64_t id = 0;  // set by Serialize / Parse
  std::array<std::uint8_t, 32> digest{};  // the file's SHA-256 (id = its first 8 bytes)

  std::uint32_t channels() const { return kv_heads * head_dim; }
  // Whether a chunk of model `fingerprint` may be coded with this profile.
  bool Fits(const std::uint8_t* fingerprint) const;
};

// The file's bytes; sets profile->id. kInvalidArgument if the profile is
// inconsistent (sizes, tables, RoPE).
Result<std::vector<std::uint8_t>> SerializeTcProfile(TcProfile* profile);
// kCorrupt on any inconsistency (truncation, digest, sizes, tables whose
// frequencies do not sum to 4096, a basis with non-finite values).
Result<std::shared_ptr<const TcProfile>> ParseTcProfile(const std::vector<std::uint8_t>& bytes);
// Reads a file and registers the profile (below); kInvalidArgument if the
// file cannot be read, kCorrupt as ParseTcProfile.
Result<std::shared_ptr<const TcProfile>> LoadTcProfile(const std::string& path);

// The profiles this process has loaded, by id: decoders find a payload's
// profile here. Loading registers; a profile stays registered for the
// process's life (profiles are a few tens of KB per model).
// kInvalidArgument if another profile with the same id (and another digest)
// is registered already (a 64-bit collision: refused, never mixed up).
Status RegisterTcProfile(std::shared_ptr<const TcProfile> profile);
std::shared_ptr<const TcProfile> FindTcProfile(std::uint64_t id);

// Builds the derived fields of a table (start, slots); false if its
// frequencies are not a valid 12-bit model over 2R + 1 symbols.
bool PrepareTcTable(TcTable* table);

}  // namespace kdn::codec

// SPDX-License-Identifier: Apache-2.0
// tc: kdn's transform codec (issue 17). Per plane (one layer's keys or
// values of a chunk), with a profile learned once per model
// (core/codec/tc_profile.h, `kdn codec calibrate --transform`):
//  1. keys: RoPE undone at each token's position (the chunk's first
//     position + t), so that a key's channels are the model's pre-RoPE
//     projection, whose large means no longer rotate with position;
//  2. the first `sink` tokens (default 0) may travel as halves (attention
//     sinks, as kdn; the transform codes them well enough without);
//  3. the other tokens, minus the chunk's channel means (halves), are
//     projected on the profile's KLT basis (kernels/common/tc_math.h);
//  4. every component is quantized with the plane's step delta (from the
//     preset's step, the plane's weight, vmul for values, and the plane's
//     sigma in the profile), doubled e times if its largest value would
//     not fit a code of +-127; a common step over orthonormal components
//     is reverse water-filling: components smaller than the step code as
//     zeros;
//  5. codes are entropy-coded with static rANS (kernels/common/kdn_quant.h's
//     16-bit-renormalizing states, `lanes` interleaved) with, per component,
//     the profile's table that codes it in the fewest bits among those
//     within about 2x of the codes' own scale and the widest (one byte names
//     it; 255 = every code zero, nothing coded); one stream per `group`
//     components (independent: a GPU decodes them in parallel).
// Decoding reverses it: rANS, codes x steps, x = m + B y, RoPE re-applied.
//
// Payload: header (param0 = sinks requested, param1 = lanes | group << 16),
// then
//   profile id       u64 (tc_profile.h): a decoder without it fails (kCorrupt:
//                    unreadable here, a miss, as any undecodable chunk)
//   first position   i64 (>= 0)
//   per plane (layer-major, keys then values):
//     delta          f32, finite, > 0
//     mean           C x f16 (finite)
//     components     C x (table u8: < tables or 255, shift u8 <= 24)
//     sinks          min(S, tokens) x C x f16, as stored (keys with RoPE)
//     lengths        G x u32, G = ceil(C / group)
//     streams        G streams back to back, stream g: lanes u32 states, then
//                    u16 words (symbols: tokens [S, T) x the coded components
//                    of [g * group, (g + 1) * group), token-major;
//                    kernels/common/tc_math.h: tc_decode_stream)
// Decode consumes every byte or fails (kCorrupt).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/codec/device.h"
#include "core/codec/payload.h"
#include "core/codec/tc_cpu.h"
#include "core/codec/tc_profile.h"
#include "kernels/common/half.h"
#include "kernels/common/kdn_quant.h"
#include "kernels/common/tc_math.h"
#include "kernels/ref/tc_ref.h"

namespace kdn::codec::internal {
namespace {

constexpr std::uint32_t kMaxSinks = 1024;
constexpr std::int64_t kMaxFirstPosition = std::int64_t{1} << 40;

struct Params {
  double step = 0;    // relative to the plane's sigma
  double vmul = 2.5;  // values' step relative to keys'
  std::uint32_t sinks = 0;
  std::uint32_t lanes = 8;
  std::uint32_t group = 32;  // components per stream
  std::vector<double> plane_weight;  // empty: the profile's
};

void PutU64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void PutU32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void PutU16(Bytes& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v));
  out.push_back(static_cast<std::uint8_t>(v >> 8));
}
std::uint64_t GetU64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
std::uint16_t GetU16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | p[1] << 8); }

// (cos, sin) of (first + t) * w_j for every token t and rotary pair j.
std::vector<double> Angles(const kernels::RopeSpec& rope, std::int64_t first, std::uint32_t tokens) {
  const int pairs = kernels::rope_pairs(rope);
  std::vector<double> cs(size_t{tokens} * pairs * 2);
  for (int j = 0; j < pairs; ++j) {
    const double w = kernels::rope_spec_inv_freq(rope, j);
    for (std::uint32_t t = 0; t < tokens; ++t) {
      double c, s;
      kernels::rope_delta_cos_sin(first + t, w, c, s);
      cs[(size_t{t} * pairs + j) * 2] = c;
      cs[(size_t{t} * pairs + j) * 2 + 1] = s;
    }
  }
  return cs;
}

// Codes tokens [S, T) x `coded` components of q (rows of C codes) as one
// stream (kernels::tc_decode_stream's format), backwards with `lanes`
// interleaved states, and appends it to *out. *words is scratch.
void EncodeStream(const std::int32_t* q, std::uint32_t C, std::uint32_t S, std::uint32_t T,
                  const std::vector<std::uint32_t>& coded, const std::uint8_t* table, const std::vector<TcTable>& tables,
                  std::uint32_t lanes, std::vector<std::uint16_t>* words, Bytes* out) {
  const std::uint64_t per_token = coded.size(), count = std::uint64_t{T - S} * per_token;
  words->assign(count + 2, 0);  // a symbol moves at most one word; one of room below
  std::uint16_t* const end = words->data() + words->size();
  std::uint16_t* ptr = end;
  std::uint32_t state[kernels::kKdnMaxLanes];
  for (std::uint32_t k = 0; k < lanes; ++k) state[k] = kernels::kKdnRansLow;
  if (count > 0) {
    std::uint32_t lane = static_cast<std::uint32_t>((count - 1) % lanes);
    for (std::uint32_t t = T; t-- > S;) {
      const std::int32_t* qt = q + size_t{t} * C;
      for (std::uint64_t j = per_token; j-- > 0;) {
        const std::uint32_t i = coded[j];
        const TcTable& tb = tables[table[i]];
        const size_t sym = static_cast<size_t>(qt[i] + static_cast<std::int32_t>(tb.range));
        state[lane] = kernels::kdn_rans_put(state[lane], tb.start[sym], tb.freq[sym], tb.rcp[sym], ptr);
        lane = lane == 0 ? lanes - 1 : lane - 1;
      }
    }
  }
  for (std::uint32_t k = 0; k < lanes; ++k) PutU32(*out, state[k]);
  for (const std::uint16_t* w = ptr; w < end; ++w) PutU16(*out, *w);
}

std::string Hex(std::uint64_t id) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

class TcCodec final : public Codec {
 public:
  TcCodec(Spec spec, Params p, std::shared_ptr<const TcProfile> profile)
      : spec_(std::move(spec)), p_(std::move(p)), profile_(std::move(profile)) {}
  CodecId id() const override { return CodecId::kTc; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    return EncodeWith(shape, kv, ChunkInfo{});
  }

  Result<Bytes> EncodeWith(const Shape& shape, const std::uint8_t* kv, const ChunkInfo& info) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    if (!profile_) return Status::InvalidArgument("codec 'tc': encoding needs profile=FILE (a transform profile)");
    const TcProfile& pr = *profile_;
    if (shape.layers != pr.layers || shape.kv_heads != pr.kv_heads || shape.head_dim != pr.head_dim) {
      return Status::InvalidArgument("codec 'tc': the chunk's shape is not the profile's model's");
    }
    if (info.has_model && !pr.fingerprints.empty() && !pr.Fits(info.model)) {
      return Status::InvalidArgument("codec 'tc': the chunk is of another model than the profile's");
    }
    const std::int64_t first = info.first_position < 0 ? 0 : info.first_position;
    if (first > kMaxFirstPosition) {
      return Status::InvalidArgument("codec 'tc': first position " + std::to_string(first) + " beyond 2^40");
    }
    const std::uint32_t C = pr.channels(), T = shape.tokens, S = std::min(p_.sinks, T);
    const std::vector<double> cs = Angles(pr.rope, first, T);
    const int pairs = kernels::rope_pairs(pr.rope);
    std::uint32_t widest = 0;  // the widest table's range: codes the encoder may use
    for (const TcTable& tb : pr.tables) widest = std::max(widest, tb.range);

    Bytes out(kHeaderBytes);
    bool near_limit = false;  // some plane came close to the dtype's largest value
    WriteHeader(Header{CodecId::kTc, shape, p_.sinks, p_.lanes | p_.group << 16}, out.data());
    PutU64(out, pr.id);
    PutU64(out, static_cast<std::uint64_t>(first));

    std::vector<float> x(size_t{T} * C), y(size_t{T} * C);
    std::vector<float> mean(C);
    std::vector<std::int32_t> q(size_t{T} * C);
    std::vector<std::uint8_t> table(C), shift(C);
    std::vector<std::uint32_t> hist(2 * kernels::kTcMaxCode + 1);
    std::vector<std::uint32_t> coded;
    std::vector<std::uint16_t> words;
    for (std::uint32_t l = 0; l < shape.layers; ++l) {
      for (std::uint32_t kvi = 0; kvi < 2; ++kvi) {
        const size_t plane = size_t{l} * 2 + kvi;
        const TcPlane& pl = pr.planes[plane];
        const std::uint64_t base = Index(shape, l, kvi, 0, 0, 0);
        float xmax = 0;  // the largest |value| of the coded tokens, as stored
        for (std::uint64_t i = 0; i < std::uint64_t{T} * C; ++i) {
          x[i] = LoadElement(shape.dtype, kv, base + i);
          if (!std::isfinite(x[i])) return Status::InvalidArgument("codec 'tc': non-finite KV");
          if (i >= std::uint64_t{S} * C) xmax = std::max(xmax, std::fabs(x[i]));
          if (i < std::uint64_t{S} * C && !(std::fabs(x[i]) <= kernels::kKdnMaxHalf)) {
            return Status::InvalidArgument("codec 'tc': a sink value does not fit a half");
          }
        }
        // Sinks as stored.
        const size_t sinks_at = out.size();
        for (std::uint64_t i = 0; i < std::uint64_t{S} * C; ++i) PutU16(out, kernels::float_to_half(x[i]));
        const Bytes sink_bytes(out.begin() + static_cast<std::ptrdiff_t>(sinks_at), out.end());
        out.resize(sinks_at);
        if (kvi == 0) {
          for (std::uint32_t t = S; t < T; ++t) {
            kernels::tc_rotate_token(&x[size_t{t} * C], static_cast<int>(pr.kv_heads), pr.rope,
                                     &cs[size_t{t} * pairs * 2], -1.0);
          }
        }
        // The chunk's channel means, as halves.
        for (std::uint32_t c = 0; c < C; ++c) {
          double sum = 0;
          for (std::uint32_t t = S; t < T; ++t) sum += x[size_t{t} * C + c];
          const double m = T > S ? sum / (T - S) : 0.0;
          if (!(std::fabs(m) <= kernels::kKdnMaxHalf)) {
            return Status::InvalidArgument("codec 'tc': a channel's mean does not fit a half");
          }
          mean[c] = kernels::half_to_float(kernels::float_to_half(static_cast<float>(m)));
        }
        for (std::uint32_t t = S; t < T; ++t) {
          kernels::tc_project(&x[size_t{t} * C], mean.data(), pl.basis.data(), C, &y[size_t{t} * C]);
        }
        const double weight = p_.plane_weight.empty() ? pr.plane_weight[plane] : p_.plane_weight[plane];
        const double delta_d = p_.step * weight * (kvi == 1 ? p_.vmul : 1.0) * pl.sigma;
        if (!(delta_d >= 1e-30 && delta_d <= 1e30)) {
          return Status::InvalidArgument("codec 'tc': the step of plane " + std::to_string(plane) + " is not usable");
        }
        const float delta = static_cast<float>(delta_d);
        // Per component: shift, codes, and the cheapest table.
        for (std::uint32_t i = 0; i < C; ++i) {
          float maxabs = 0;
          for (std::uint32_t t = S; t < T; ++t) {
            const float a = std::fabs(y[size_t{t} * C + i]);
            if (!(a <= maxabs)) maxabs = a;  // NaN stays
          }
          if (!std::isfinite(maxabs)) return Status::InvalidArgument("codec 'tc': non-finite KV");
          std::int32_t e = 0;
          while (e < kernels::kTcMaxShift && maxabs / std::ldexp(delta, e) > static_cast<float>(widest)) ++e;
          if (maxabs / std::ldexp(delta, e) > static_cast<float>(widest)) {
            return Status::InvalidArgument("codec 'tc': a component too large for the plane's step");
          }
          shift[i] = static_cast<std::uint8_t>(e);
          const float step = std::ldexp(delta, e);
          std::int32_t lo = 0, hi = 0;
          for (std::uint32_t t = S; t < T; ++t) {
            const std::int32_t code = kernels::tc_quantize(y[size_t{t} * C + i], step);
            q[size_t{t} * C + i] = code;
            lo = std::min(lo, code);
            hi = std::max(hi, code);
          }
          if (lo == 0 && hi == 0) {
            table[i] = kTcZeroTable;
            continue;
          }
          std::fill(hist.begin(), hist.end(), 0u);
          for (std::uint32_t t = S; t < T; ++t) ++hist[static_cast<size_t>(q[size_t{t} * C + i] + kernels::kTcMaxCode)];
          const std::uint32_t top = static_cast<std::uint32_t>(std::max(-lo, hi));
          // Candidates: of each kind, the tables whose scale is within a factor
          // of 2 of the codes' own (mean |q| for Laplace, RMS for Gauss), and
          // the widest (always able to code them).
          double abs_sum = 0, sq_sum = 0;
          for (std::int32_t v = lo; v <= hi; ++v) {
            const double n = hist[static_cast<size_t>(v + kernels::kTcMaxCode)];
            abs_sum += n * std::abs(v);
            sq_sum += n * double(v) * v;
          }
          const double scale[2] = {abs_sum / (T - S), std::sqrt(sq_sum / (T - S))};
          double best = -1;
          for (size_t k = 0; k < pr.tables.size(); ++k) {
            const TcTable& tb = pr.tables[k];
            if (top > tb.range) continue;
            const double own = scale[tb.kind == 0 ? 0 : 1];
            if (tb.range != widest && (tb.scale > 2 * own + 0.1 || tb.scale < 0.5 * own - 0.1)) continue;
            double bits = 0;
            for (std::int32_t v = lo; v <= hi; ++v) {
              const std::uint32_t n = hist[static_cast<size_t>(v + kernels::kTcMaxCode)];
              if (n) bits += n * static_cast<double>(tb.bits[static_cast<size_t>(v + static_cast<std::int32_t>(tb.range))]);
            }
            if (best < 0 || bits < best) best = bits, table[i] = static_cast<std::uint8_t>(k);
          }
        }
        // What the decoder will rebuild must fit the dtype. Each token's error
        // is at most half the steps' norm (orthonormal basis, rotations), so
        // only values that close to the dtype's largest need the exact check:
        // rebuilding the plane as the decoder does.
        double bound2 = 0;
        for (std::uint32_t i = 0; i < C; ++i) bound2 += 0.25 * double(std::ldexp(delta, shift[i])) * std::ldexp(delta, shift[i]);
        const double largest = shape.dtype == 1 ? kernels::kKdnMaxHalf : shape.dtype == 2 ? 3.38e38 : 3.4e38;
        if (xmax * 1.001 + std::sqrt(bound2) * 1.001 >= largest) {
          near_limit = true;
          std::vector<float> yq(C), row(C);
          for (std::uint32_t t = S; t < T; ++t) {
            for (std::uint32_t i = 0; i < C; ++i) {
              yq[i] = table[i] == kTcZeroTable ? 0.0f : static_cast<float>(q[size_t{t} * C + i]) * std::ldexp(delta, shift[i]);
            }
            kernels::tc_reconstruct(yq.data(), mean.data(), pl.basis_t.data(), C, row.data());
            if (kvi == 0) {
              kernels::tc_rotate_token(row.data(), static_cast<int>(pr.kv_heads), pr.rope, &cs[size_t{t} * pairs * 2], 1.0);
            }
            float rmax = 0;
            for (float v : row) {
              const float a = std::fabs(v);
              if (!(a <= rmax)) rmax = a;
            }
            if (!FitsDtype(shape.dtype, rmax)) {
              return Status::InvalidArgument("codec 'tc': values too close to the dtype's largest to code");
            }
          }
        }
        // The plane.
        std::uint8_t db[4];
        std::memcpy(db, &delta, 4);
        out.insert(out.end(), db, db + 4);
        for (std::uint32_t c = 0; c < C; ++c) PutU16(out, kernels::float_to_half(mean[c]));
        for (std::uint32_t i = 0; i < C; ++i) {
          out.push_back(table[i]);
          out.push_back(shift[i]);
        }
        out.insert(out.end(), sink_bytes.begin(), sink_bytes.end());
        // One stream per group of components: lengths, then the streams.
        const std::uint32_t groups = (C + p_.group - 1) / p_.group;
        const size_t lengths_at = out.size();
        out.resize(out.size() + 4ull * groups);
        for (std::uint32_t g = 0; g < groups; ++g) {
          coded.clear();
          for (std::uint32_t i = g * p_.group; i < std::min(C, (g + 1) * p_.group); ++i) {
            if (table[i] != kTcZeroTable) coded.push_back(i);
          }
          const size_t at = out.size();
          EncodeStream(q.data(), C, S, T, coded, table.data(), pr.tables, p_.lanes, &words, &out);
          const std::uint64_t length = out.size() - at;
          if (length > 0xFFFFFFFFull) return Status::InvalidArgument("codec 'tc': a stream is too long");
          const std::uint32_t l32 = static_cast<std::uint32_t>(length);
          std::memcpy(&out[lengths_at + 4ull * g], &l32, 4);
        }
      }
    }
    if (near_limit) {
      // The check above rebuilds planes in the encoder's order of
      // operations; the decoder's (its product, its RoPE) can round a value
      // at the dtype's edge the other way. Near the edge, the decoder itself
      // has the last word: a payload it would refuse is not handed out.
      std::vector<std::uint8_t> rebuilt(static_cast<size_t>(shape.bytes()));
      if (!TcDecodeCpu(shape, out.data(), out.size(), rebuilt.data(), profile_).ok()) {
        return Status::InvalidArgument("codec 'tc': values too close to the dtype's largest to code");
      }
    }
    return out;
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    // The device decode's emulation's bytes, with less work (tc_cpu.h).
    return TcDecodeCpu(shape, data, size, out, profile_);
  }

 private:
  Spec spec_;
  Params p_;
  std::shared_ptr<const TcProfile> profile_;
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeTc(const Spec& spec) {
  auto reject_unknown = [](const Spec& s) {
    return RejectUnknownParams(s, {"preset", "profile", "step", "vmul", "sink", "lanes", "group", "pw"});
  };
  KDN_RETURN_IF_ERROR(reject_unknown(spec));
  std::shared_ptr<const TcProfile> profile;
  std::map<std::string, std::string> params;
  const auto preset = spec.params.find("preset");
  if (auto it = spec.params.find("profile"); it != spec.params.end()) {
    Result<std::shared_ptr<const TcProfile>> loaded = LoadTcProfile(it->second);
    if (!loaded.ok()) return Status::InvalidArgument("codec 'tc': " + loaded.status().message());
    profile = *loaded;
    if (preset != spec.params.end()) {
      bool found = false;
      for (const auto& [name, line] : profile->presets) {
        if (name != preset->second) continue;
        Result<Spec> from = ParseSpec("tc:" + line);
        if (!from.ok() || from->params.count("profile") || from->params.count("preset")) {
          return Status::InvalidArgument("codec 'tc': profile '" + it->second + "': preset " + name +
                                         " is not a list of tc parameters");
        }
        KDN_RETURN_IF_ERROR(reject_unknown(*from));
        params = from->params;
        found = true;
      }
      if (!found) {
        return Status::InvalidArgument("codec 'tc': profile '" + it->second + "' has no preset '" + preset->second +
                                       "'");
      }
    }
  } else if (preset != spec.params.end()) {
    return Status::InvalidArgument("codec 'tc': a preset needs profile=FILE");
  }
  for (const auto& [key, value] : spec.params) params[key] = value;
  Params p;
  const StepFields fields{&p.step, &p.vmul, &p.sinks, &p.lanes, &p.plane_weight};
  for (const auto& [key, value] : params) {
    Result<bool> parsed = ParseStepField(key, value, fields);
    if (!parsed.ok()) return parsed.status();
    if (key == "group") {
      Result<std::uint32_t> v = ParseUint(key, value, 1, 0xFFFF);
      if (!v.ok()) return v.status();
      p.group = *v;
    }
  }
  if (profile) {
    if (p.step <= 0) return Status::InvalidArgument("codec 'tc': no step (give step=S or a preset of the profile)");
    if (!p.plane_weight.empty() && p.plane_weight.size() != profile->plane_weight.size()) {
      return Status::InvalidArgument("codec 'tc': pw has " + std::to_string(p.plane_weight.size()) +
                                     " weights, the profile's model " + std::to_string(profile->plane_weight.size()) +
                                     " planes");
    }
  }
  return std::unique_ptr<Codec>(new TcCodec(spec, std::move(p), std::move(profile)));
}

}  // namespace kdn::codec::internal

namespace kdn::codec {

using internal::GetU16;
using internal::GetU64;
using internal::kMaxFirstPosition;
using internal::kMaxSinks;

Result<TcDirectory> ParseTcDirectory(const Shape& shape, const std::uint8_t* data, size_t size,
                                     std::shared_ptr<const TcProfile> hint) {
  KDN_RETURN_IF_ERROR(internal::CheckShape(shape));
  Result<internal::Header> h = internal::ReadHeader(CodecId::kTc, shape, data, size);
  if (!h.ok()) return h.status();
  const std::uint32_t sinks = h->param0, lanes = h->param1 & 0xFFFF, group = h->param1 >> 16;
  if (sinks > kMaxSinks || lanes < 1 || lanes > kernels::kKdnMaxLanes || group < 1) {
    return Status::Corrupt("tc payload: sinks, lanes or group out of range");
  }
  const std::uint8_t* p = data + internal::kHeaderBytes;
  const std::uint8_t* const end = data + size;
  if (end - p < 16) return Status::Corrupt("tc payload: truncated");
  const std::uint64_t id = GetU64(p);
  TcDirectory d;
  d.first = static_cast<std::int64_t>(GetU64(p + 8));
  p += 16;
  d.profile = hint && hint->id == id ? hint : FindTcProfile(id);
  if (!d.profile) {
    return Status::Corrupt("tc payload: transform profile " + internal::Hex(id) +
                           " is not loaded in this process (a tc codec spec with profile=FILE loads it)");
  }
  const TcProfile& pr = *d.profile;
  if (shape.layers != pr.layers || shape.kv_heads != pr.kv_heads || shape.head_dim != pr.head_dim) {
    return Status::Corrupt("tc payload: the shape is not its profile's model's");
  }
  if (d.first < 0 || d.first > kMaxFirstPosition) return Status::Corrupt("tc payload: bad first position");
  const std::uint32_t C = pr.channels(), T = shape.tokens, planes = shape.layers * 2;
  d.sinks = std::min(sinks, T);
  d.lanes = lanes;
  const std::uint32_t S = d.sinks, groups = (C + group - 1) / group;
  d.mean.resize(size_t{planes} * C);
  d.step.resize(size_t{planes} * C);
  d.range.assign(size_t{planes} * C, 0);
  d.table_of.assign(size_t{planes} * C, 0);
  d.sinks_at.resize(planes);
  for (std::uint32_t plane = 0; plane < planes; ++plane) {
    const std::uint64_t fixed = 4 + 2ull * C + 2ull * C + 2ull * S * C + 4ull * groups;
    if (static_cast<std::uint64_t>(end - p) < fixed) return Status::Corrupt("tc payload: truncated plane");
    float delta;
    std::memcpy(&delta, p, 4);
    p += 4;
    if (!(delta > 0.0f) || !std::isfinite(delta)) return Status::Corrupt("tc payload: bad step");
    const size_t at = size_t{plane} * C;
    for (std::uint32_t c = 0; c < C; ++c, p += 2) {
      const std::uint16_t hm = GetU16(p);
      if ((hm & 0x7C00u) == 0x7C00u) return Status::Corrupt("tc payload: non-finite mean");
      d.mean[at + c] = kernels::half_to_float(hm);
    }
    std::vector<std::uint32_t> coded;
    for (std::uint32_t i = 0; i < C; ++i, p += 2) {
      const std::uint8_t table = p[0], shift = p[1];
      if (shift > kernels::kTcMaxShift || (table != kTcZeroTable && table >= pr.tables.size())) {
        return Status::Corrupt("tc payload: bad component table or shift");
      }
      d.step[at + i] = std::ldexp(delta, shift);
      if (!std::isfinite(d.step[at + i])) return Status::Corrupt("tc payload: bad step");
      if (table != kTcZeroTable) {
        coded.push_back(i);
        d.table_of[at + i] = table;
        d.range[at + i] = static_cast<std::int32_t>(pr.tables[table].range);
      }
    }
    d.sinks_at[plane] = static_cast<std::uint64_t>(p - data);
    for (std::uint64_t i = 0; i < std::uint64_t{S} * C; ++i, p += 2) {
      if ((GetU16(p) & 0x7C00u) == 0x7C00u) return Status::Corrupt("tc payload: non-finite sink");
    }
    const std::uint8_t* lengths = p;
    p += 4ull * groups;
    for (std::uint32_t g = 0; g < groups; ++g) {
      std::uint32_t length;
      std::memcpy(&length, lengths + 4ull * g, 4);
      if (static_cast<std::uint64_t>(end - p) < length) return Status::Corrupt("tc payload: truncated stream");
      kernels::TcStreamDir sd;
      sd.offset = static_cast<std::uint64_t>(p - data);
      sd.length = length;
      sd.plane = plane;
      sd.comp_at = static_cast<std::uint32_t>(d.comps.size());
      for (std::uint32_t i : coded) {
        if (i >= std::uint64_t{g} * group && i < std::uint64_t{g + 1} * group) d.comps.push_back(i);
      }
      sd.comps = static_cast<std::uint32_t>(d.comps.size()) - sd.comp_at;
      d.streams.push_back(sd);
      p += length;
    }
  }
  if (p != end) return Status::Corrupt("tc payload: trailing bytes");
  return d;
}

kernels::TcDecodeArgs TcStreamScalars(const Shape& shape, const TcDirectory& d) {
  kernels::TcDecodeArgs a;
  a.tokens = shape.tokens;
  a.channels = d.profile->channels();
  a.sinks = d.sinks;
  a.lanes = d.lanes;
  a.n_streams = d.streams.size();
  return a;
}

kernels::TcFinishArgs TcFinishScalars(const Shape& shape, const TcDirectory& d) {
  kernels::TcFinishArgs f;
  f.tokens = shape.tokens;
  f.channels = d.profile->channels();
  f.sinks = d.sinks;
  f.kv_heads = d.profile->kv_heads;
  f.planes = shape.layers * 2;
  f.dtype = shape.dtype;
  f.first = d.first;
  f.rope = d.profile->rope;
  return f;
}

Status TcDecodeEmulated(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out,
                        std::shared_ptr<const TcProfile> hint) {
  Result<TcDirectory> d = ParseTcDirectory(shape, data, size, std::move(hint));
  if (!d.ok()) return d.status();
  const TcProfile& pr = *d->profile;
  const std::uint32_t C = pr.channels(), T = shape.tokens, planes = shape.layers * 2;
  // The components (zeroed: streams write the coded ones) and the product.
  // Reused per thread up to kKeep bytes: a fresh buffer of this size comes
  // from mmap as zero pages, and faulting them in cost more than the decode.
  constexpr size_t kKeep = size_t{32} << 20;
  const size_t n = size_t{planes} * T * C;
  thread_local std::vector<float> kept;
  std::vector<float> own;
  std::vector<float>& scratch = 2 * n * sizeof(float) <= kKeep ? kept : own;
  if (scratch.size() < 2 * n) scratch.resize(2 * n);
  float* const y = scratch.data();
  float* const acc = y + n;
  std::fill(y, y + n, 0.0f);
  kernels::TcDecodeArgs a = TcStreamScalars(shape, *d);
  a.payload = data;
  a.streams = d->streams.data();
  a.comps = d->comps.data();
  a.table_of = d->table_of.data();
  a.range = d->range.data();
  a.step = d->step.data();
  a.slots = pr.slots.data();
  a.y = y;
  const std::uint32_t bad = kernels::tc_streams_ref(a);
  if (bad != ~0u) {
    return Status::Corrupt("tc payload: stream " + std::to_string(bad) + " (plane " +
                           std::to_string(d->streams[bad].plane) + ") does not decode");
  }
  kernels::tc_accumulate_ref(y, pr.bases_t.data(), planes, T, d->sinks, C, acc);
  kernels::TcFinishArgs f = TcFinishScalars(shape, *d);
  f.payload = data;
  f.sinks_at = d->sinks_at.data();
  f.mean = d->mean.data();
  f.acc = acc;
  f.out = out;
  if (kernels::tc_finish_ref(f) != ~std::uint64_t{0}) {
    return Status::Corrupt("tc payload: values overflow the dtype");
  }
  return Status::Ok();
}

}  // namespace kdn::codec

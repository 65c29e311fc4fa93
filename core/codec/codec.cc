// SPDX-License-Identifier: Apache-2.0
// Spec parsing and printing, and the dispatch from a spec or a codec id to
// a codec. Names: raw, fp8, int8, kivi2, cachegen, kdn, zstd, tc.
#include "core/codec/codec.h"

#include <string>

#include "core/codec/payload.h"

namespace kdn::codec {
namespace {

// The key a bare word after the colon ("kdn:balanced") is stored under.
constexpr const char* kPresetKey = "preset";

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.';
}
bool IsWord(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsWordChar(c)) return false;
  }
  return true;
}
// A value may also be a path ("profile=dir/file").
bool IsValue(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsWordChar(c) && c != '/') return false;
  }
  return true;
}

}  // namespace

std::string Spec::ToString() const {
  std::string out = name;
  char sep = ':';
  if (auto it = params.find(kPresetKey); it != params.end()) {
    out += sep;
    out += it->second;
    sep = ',';
  }
  for (const auto& [k, v] : params) {
    if (k == kPresetKey) continue;
    out += sep;
    out += k + "=" + v;
    sep = ',';
  }
  return out;
}

Result<Spec> ParseSpec(std::string_view text) {
  const std::string shown = "codec spec '" + std::string(text) + "': ";
  Spec spec;
  const size_t colon = text.find(':');
  spec.name = std::string(text.substr(0, colon));
  if (spec.name.empty()) return Status::InvalidArgument(shown + "empty codec name");
  if (!IsWord(spec.name)) return Status::InvalidArgument(shown + "bad codec name '" + spec.name + "'");
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  if (rest.empty()) return Status::InvalidArgument(shown + "nothing after ':'");
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t eq = item.find('=');
    std::string key, value;
    if (eq == std::string_view::npos) {
      if (!IsWord(item)) return Status::InvalidArgument(shown + "bad item '" + std::string(item) + "'");
      key = kPresetKey;
      value = std::string(item);
    } else {
      key = std::string(item.substr(0, eq));
      value = std::string(item.substr(eq + 1));
      if (!IsWord(key)) return Status::InvalidArgument(shown + "bad parameter name in '" + std::string(item) + "'");
      if (!IsValue(value)) return Status::InvalidArgument(shown + "bad value in '" + std::string(item) + "'");
    }
    if (!spec.params.emplace(key, value).second) {
      return Status::InvalidArgument(shown + (key == kPresetKey ? "more than one preset" : "parameter '" + key +
                                                                                                "' given twice"));
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return spec;
}

Result<std::unique_ptr<Codec>> MakeCodec(const Spec& spec) {
  if (spec.name == "raw") return internal::MakeRaw(spec);
  if (spec.name == "fp8") return internal::MakeFp8(spec);
  if (spec.name == "int8") return internal::MakeInt8(spec);
  if (spec.name == "kivi2") return internal::MakeKivi(spec);
  if (spec.name == "cachegen") return internal::MakeCacheGen(spec);
  if (spec.name == "kdn") return internal::MakeKdn(spec);
  if (spec.name == "zstd") return internal::MakeZstd(spec);
  if (spec.name == "tc") return internal::MakeTc(spec);
  return Status::InvalidArgument("unknown codec '" + spec.name +
                                 "' (known: raw, fp8, int8, kivi2, cachegen, kdn, zstd, tc)");
}

bool IsLossy(CodecId id) { return id != CodecId::kRaw && id != CodecId::kZstd; }

Result<std::unique_ptr<Codec>> DecoderFor(CodecId id) {
  // Decoders take every parameter from the payload; the default spec only
  // names the codec.
  switch (id) {
    case CodecId::kRaw: return MakeCodec(Spec{"raw", {}});
    case CodecId::kFp8: return MakeCodec(Spec{"fp8", {}});
    case CodecId::kInt8: return MakeCodec(Spec{"int8", {}});
    case CodecId::kKivi2: return MakeCodec(Spec{"kivi2", {}});
    case CodecId::kCacheGen: return MakeCodec(Spec{"cachegen", {}});
    case CodecId::kKdn: return MakeCodec(Spec{"kdn", {}});
    case CodecId::kZstd: return MakeCodec(Spec{"zstd", {}});
    case CodecId::kTc: return MakeCodec(Spec{"tc", {}});
    case CodecId::kEncrypted:
      return Status::Unsupported("an encrypted payload (encrypted at rest: only a tier with its master key opens it)");
  }
  return Status::Unsupported("unknown codec id " + std::to_string(static_cast<std::uint32_t>(id)) +
                             " (written by a newer kdn?)");
}

}  // namespace kdn::codec

// SPDX-License-Identifier: Apache-2.0
// raw: the chunk's bytes as they are.
// Payload: header (param0 = param1 = 0), then shape.bytes() bytes of KV in
// the canonical layout and shape.dtype. Size: kHeaderBytes + shape.bytes().
#include <cstring>

#include "core/codec/payload.h"

namespace kdn::codec::internal {
namespace {

class RawCodec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kRaw; }
  const Spec& spec() const override { return spec_; }

  Result<Bytes> Encode(const Shape& shape, const std::uint8_t* kv) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Bytes out(kHeaderBytes + shape.bytes());
    WriteHeader(Header{CodecId::kRaw, shape, 0, 0}, out.data());
    if (shape.bytes() > 0) std::memcpy(out.data() + kHeaderBytes, kv, shape.bytes());
    return out;
  }

  Status Decode(const Shape& shape, const std::uint8_t* data, size_t size, std::uint8_t* out) const override {
    KDN_RETURN_IF_ERROR(CheckShape(shape));
    Result<Header> h = ReadHeader(CodecId::kRaw, shape, data, size);
    if (!h.ok()) return h.status();
    if (h->param0 != 0 || h->param1 != 0) return Status::Corrupt("raw payload: nonzero parameters");
    if (size - kHeaderBytes != shape.bytes()) {
      return Status::Corrupt("raw payload: " + std::to_string(size - kHeaderBytes) + " body bytes, expected " +
                             std::to_string(shape.bytes()));
    }
    if (shape.bytes() > 0) std::memcpy(out, data + kHeaderBytes, shape.bytes());
    return Status::Ok();
  }

 private:
  Spec spec_{"raw", {}};
};

}  // namespace

Result<std::unique_ptr<Codec>> MakeRaw(const Spec& spec) {
  KDN_RETURN_IF_ERROR(RejectUnknownParams(spec, {}));
  return std::unique_ptr<Codec>(new RawCodec());
}

}  // namespace kdn::codec::internal

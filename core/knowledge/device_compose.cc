// SPDX-License-Identifier: Apache-2.0
#include "core/knowledge/device_compose.h"

#include <utility>

namespace kdn::blend {
namespace {

class DeviceSpace final : public ComposeSpace {
 public:
  explicit DeviceSpace(store::Device& device) : dev_(device) {}
  Status InitKv(size_t floats) override { return Alloc(floats, &kv_); }
  float* kv() override { return Floats(kv_); }
  Status PlaceRows(size_t offset, const float* src, size_t n) override {
    return dev_.CopyToDevice(Floats(kv_) + offset, src, n * sizeof(float));
  }
  Status ShiftKeys(const kernels::RopeSpec& rope, size_t offset, std::int64_t row_stride, std::int64_t tokens,
                   int kv_heads, std::int64_t delta) override {
    return dev_.RopeShift(rope, Floats(kv_) + offset, row_stride, tokens, kv_heads, delta);
  }
  Status InitHidden(size_t rows, int width) override { return Alloc(rows * static_cast<size_t>(width), &h_); }
  float* hidden() override { return Floats(h_); }
  Status KeepHidden(std::span<const std::int32_t> keep, int width) override {
    chunk::Payload next;
    KDN_RETURN_IF_ERROR(Alloc(keep.size() * static_cast<size_t>(width), &next));
    KDN_RETURN_IF_ERROR(dev_.GatherRows(Floats(next), Floats(h_), keep, width));
    h_ = std::move(next);  // freed once the gather is done (cudaFree synchronizes)
    return Status::Ok();
  }
  Result<float*> CandidateHidden(std::span<const std::int32_t> rows, int width, bool copy) override {
    KDN_RETURN_IF_ERROR(Alloc(rows.size() * static_cast<size_t>(width), &c_));
    if (copy) KDN_RETURN_IF_ERROR(dev_.GatherRows(Floats(c_), Floats(h_), rows, width));
    return Floats(c_);
  }
  Status SaveKeys(size_t offset, std::span<const std::int32_t> rows, int kv_dim) override {
    KDN_RETURN_IF_ERROR(Alloc(rows.size() * static_cast<size_t>(kv_dim), &saved_));
    return dev_.GatherRows(Floats(saved_), Floats(kv_) + offset, rows, kv_dim);
  }
  Status Deviations(size_t offset, std::span<const std::int32_t> plane_rows, std::span<const std::int32_t> saved_rows,
                    int kv_dim, double* out) override {
    return dev_.RowDeviations(Floats(kv_) + offset, Floats(saved_), plane_rows, saved_rows, kv_dim, out);
  }
  Status BeforeEngine() override { return dev_.Synchronize(); }

  chunk::Payload TakeKv() { return std::move(kv_); }

 private:
  Status Alloc(size_t floats, chunk::Payload* p) {
    Result<chunk::Payload> a = dev_.Allocate(floats * sizeof(float));
    if (!a.ok()) return a.status();
    *p = std::move(*a);
    return Status::Ok();
  }
  static float* Floats(chunk::Payload& p) { return reinterpret_cast<float*>(p.data()); }

  store::Device& dev_;
  chunk::Payload kv_, h_, c_, saved_;
};

}  // namespace

Result<BlendReport> ComposeOnDevice(const ModelShape& shape, std::span<const Piece> pieces,
                                    const BlendOptions& options, LayerEngine& engine, store::Device& device,
                                    chunk::Payload* kv_out) {
  if (!engine.on_device()) {
    return Status::InvalidArgument("blend: an engine on the host composes there (Compose)");
  }
  DeviceSpace space(device);
  Result<BlendReport> r = ComposeIn(shape, pieces, options, engine, space);
  if (!r.ok()) return r;
  KDN_RETURN_IF_ERROR(device.Synchronize());
  *kv_out = space.TakeKv();
  return r;
}

}  // namespace kdn::blend

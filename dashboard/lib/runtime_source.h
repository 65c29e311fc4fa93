// A runtime in this process as a data source: polls its C ABI counters
// (kdn_runtime_get_stats, _get_tier_stats, _get_latency) every interval_ms on
// a worker thread and turns them into Snapshots. TTFT saved is the tokens
// served x prefill_us_per_token (the engine's measured prefill time per
// token, which the C ABI does not know: the embedding engine gives it), the
// delivery time is the load latency's count x mean.
// Thread-safety: as Source. The runtime handle is borrowed: it must stay
// valid until stop() returns (kdn_runtime_destroy only after that).
#pragma once

#include <memory>

#include "source.h"

struct kdn_runtime;

namespace kdn::dash {

struct RuntimeSourceOptions {
  std::uint32_t interval_ms = 500;
  double prefill_us_per_token = 0;  // 0: TTFT saved not computed (shown as unknown)
};

class RuntimeSource final : public Source {
  Q_OBJECT
 public:
  RuntimeSource(kdn_runtime* runtime, RuntimeSourceOptions options, QObject* parent = nullptr);
  ~RuntimeSource() override;  // stops

  void start() override;
  void stop() override;
  State state() const override;
  QString describe() const override;

  // One reading now, on the calling thread (the worker uses it; tests too).
  static Snapshot Read(kdn_runtime* runtime, const RuntimeSourceOptions& options);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdn::dash

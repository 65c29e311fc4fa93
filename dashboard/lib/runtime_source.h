// SPDX-License-Identifier: Apache-2.0
// A runtime in this process as a data source: polls its C ABI counters
// (kdn_runtime_get_stats, _get_tier_stats, _get_latency) every interval_ms on
// a worker thread and turns them into Snapshots. TTFT saved is the runtime's
// own measure (kdn_stats.ttft_saved_ns: the tokens each load served x the
// model's mean prefill time per token, from the prefills the engine reported
// with kdn_model_report_prefill), the delivery time the time spent in loads
// (kdn_stats.delivery_ns). A tier's delivery limit is the rate its loads
// were measured at (kdn_tier_stats.delivery_ns_per_token x the model's KV
// bytes per token; needs RuntimeSourceOptions::model).
// The namespaces' quotas of each tier (kdn_runtime_get_quota_stats) are
// named by RuntimeSourceOptions::namespaces where one of them hashes to the
// quota's namespace, else by the hash's first 8 hex digits ("#1a2b3c4d").
// Thread-safety: as Source. The runtime handle is borrowed: it must stay
// valid until stop() returns (kdn_runtime_destroy only after that).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "source.h"

struct kdn_runtime;
struct kdn_model;

namespace kdn::dash {

struct RuntimeSourceOptions {
  std::uint32_t interval_ms = 500;
  // A fallback for tokens served before the engine reported any prefill of
  // their model (kdn_stats.tokens_served_unpriced); 0: those count nothing.
  double prefill_us_per_token = 0;
  // Knowledge items: the documents of `model` in these namespaces, most hit
  // first, at most documents_top (no model or no namespace: none listed).
  // The model is borrowed like the runtime; its KV size per token also turns
  // the tiers' measured delivery time per token into bytes per second.
  // The namespaces also name the rows of the tiers' quotas (with or without
  // a model).
  const kdn_model* model = nullptr;
  std::vector<std::string> namespaces;
  std::uint32_t documents_top = 20;
  // Listing every document of a namespace costs more than the counters
  // (tens of MB for 100,000s of documents): the worker lists them every
  // documents_interval_ms (as NodeSource does) and carries the last listing
  // in the snapshots between.
  std::uint32_t documents_interval_ms = 2000;
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
  // Without list_documents, the counters only: no knowledge listing (the
  // namespaces still name the quotas' rows).
  static Snapshot Read(kdn_runtime* runtime, const RuntimeSourceOptions& options, bool list_documents = true);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdn::dash

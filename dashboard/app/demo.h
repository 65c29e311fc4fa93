// SPDX-License-Identifier: Apache-2.0
// `kdn-dashboard --demo`: a kdnd and a workload in this process, so the
// dashboard has real numbers to show with one command.
//
// The node (server::Server on a thread) listens on a loopback port the OS
// picks, with a small host tier over a small disk tier (so chunks are
// demoted and evicted while one watches) and server.prefill_us_per_token set
// from a prefill of the reference model timed here (so TTFT saved is the
// model's real recompute time). Two tokens: the workload's (namespace
// "demo") and the dashboard's (stats, and "demo" to list its documents).
//
// The workload (a thread): the reference engine on a runtime whose only
// tier is that node. It registers the first passages as knowledge items
// (two of them pinned, one with a TTL), then serves requests picked from a
// Zipf mix of documents (bench/texts/stories.txt, one paragraph each):
// mostly a document as a prompt (lookup + retrieve, prefill of the rest;
// stored when the node lacked some of its chunks), sometimes a RAG prompt
// blending two knowledge items.
//
// In process (DemoOptions::in_process): no kdnd. The workload's runtime has
// the host tier over the disk tier itself (the disk tier's default codec,
// zstd, so the compression column has numbers), the window watches it
// through RuntimeSource, and TTFT saved is the runtime's own measure: the
// reference engine reports each prefill it runs (kdn_model_report_prefill).
// Thread-safety: Start and the destructor on one thread; the accessors from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

struct kdn_runtime;
struct kdn_model;

namespace kdn::server {
class Server;
}

namespace kdn::dash {

struct DemoOptions {
  std::string texts;              // paragraphs separated by blank lines; empty: bench/texts/stories.txt
  std::uint32_t chunk_tokens = 64;
  std::uint32_t document_tokens = 192;  // each paragraph's first tokens (prefill is what the demo waits on)
  std::uint64_t host_bytes = std::uint64_t{3} << 19;  // 1.5 MiB
  std::uint64_t disk_bytes = std::uint64_t{3} << 20;
  double zipf_s = 1.1;
  std::uint32_t pause_ms = 5;     // between two requests (a demo, not a benchmark)
  bool in_process = false;        // a runtime with its own tiers instead of a kdnd
};

struct DemoCounters {
  std::atomic<std::uint64_t> requests{0}, stores{0}, blends{0}, errors{0};
};

class Demo {
 public:
  // Loads the model, measures its prefill, starts the node and the workload.
  // nullptr with *error set when any of it fails.
  static std::unique_ptr<Demo> Start(const DemoOptions& options, std::string* error);
  // Stops the workload, then the node (destroyed: its knowledge registry's
  // last save is written), then removes its directory.
  ~Demo();
  Demo(const Demo&) = delete;
  Demo& operator=(const Demo&) = delete;

  const std::string& address() const;       // the node's "127.0.0.1:port" (empty in process)
  // In process: the workload's runtime, valid until the Demo is destroyed
  // (stop a RuntimeSource over it first); otherwise nullptr.
  kdn_runtime* runtime() const;
  const kdn_model* model() const;  // in process: the engine's model (for listing documents); else nullptr
  static const char* knowledge_namespace();  // where the workload puts its knowledge items
  const std::string& stats_token() const;   // the dashboard's token
  double prefill_us_per_token() const;      // measured
  std::string describe() const;             // one line for the terminal
  const DemoCounters& counters() const;
  // The kdnd in this process (nullptr in process), and the directory its
  // disk tier (or the runtime's) lives in: for tests of the teardown.
  server::Server* node() const;
  const std::string& directory() const;

 private:
  struct Impl;
  explicit Demo(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdn::dash

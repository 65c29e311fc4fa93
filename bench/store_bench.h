#pragma once

#include <string>

namespace kdn::bench {

struct StoreBenchOptions {
  std::string json_path;
  std::string dir;   // scratch directory for the disk measures (default: the system's temp dir)
  int repeats = 0;   // 0: 10, or 3 with quick
  bool quick = false;
};

// The storage module's measures, each against its baseline in the same run:
// host get vs memcpy, disk write/read vs raw O_DIRECT, key hashing vs the raw
// hash, lookup latency, and hit rates per tier and policy on a Zipf reuse
// workload. Writes JSON records; returns an exit code.
int RunStoreBench(const StoreBenchOptions& options);

}  // namespace kdn::bench

// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace kdn::bench {

struct StoreBenchOptions {
  std::string json_path;
  std::string dir;   // scratch directory for the disk measures (default: the system's temp dir)
  int repeats = 0;   // 0: 10, or 3 with quick
  bool quick = false;
  // Run even when `dir` is on a memory filesystem (tmpfs, ramfs, a RAM disk),
  // which is refused otherwise; every record says so ("memory_fs": true).
  bool allow_memory_fs = false;
};

// The storage module's measures, each against its baseline in the same run:
// host get vs memcpy, disk tier write/read vs the raw disk doing the same
// per-object work under the same durability (each record states both sides'
// policy and whether O_DIRECT was in effect), key hashing vs the raw hash,
// lookup latency, hit rates per tier and policy on a Zipf reuse workload,
// and the effective delivery from disk: the reference model's real KV (f16,
// 256-token chunks; 240 of them, 16 with quick) retrieved from a cold page
// cache out of a disk-only store that keeps it as kdn:balanced, against one
// that keeps it raw, with the file reads and the decode alone beside it,
// and both again with encryption at rest (master keys: wire/cipher.h), each
// against its plain twin in the same runs (skipped, with a warning, without
// the reference model). Writes JSON records; returns an exit code (2, saying why, when
// the scratch directory is on a memory filesystem and that is not allowed).
int RunStoreBench(const StoreBenchOptions& options);

}  // namespace kdn::bench

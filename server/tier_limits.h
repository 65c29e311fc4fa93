// SPDX-License-Identifier: Apache-2.0
// How fast each of kdnd's tiers can deliver: measured once at start (when
// server.measure_tiers is on, before the node serves) and reported with the
// tier's statistics (TierStatsSnapshot::limit_bytes_per_s, kdn_tier_limit_
// bytes_per_second), so that a tier's read rate can be drawn against what it
// could do.
//
//   host  memcpy of a chunk-sized buffer (8 MiB), the median of 5 copies:
//         what a hit in memory costs to hand out.
//   disk  a 16 MiB file written into the tier's own DIR/tmp (named as the
//         tier names its temp files, "<pid>-<n>.tmp", so that the tier's
//         Open removes it should kdnd die in the middle), synced, dropped
//         from the page cache (POSIX_FADV_DONTNEED) and timed as it is read
//         back with read(): the disk's cold read rate; the median of up to 3
//         reads. The file is removed on every path, error or not.
//   other kinds (device, remote, redis): 0, not measured.
//
// Each measurement takes a few ms (host) to a few hundred (disk, mostly its
// write and sync), so a node with a tier of each kind starts well within a
// second more. A filesystem that keeps files in memory (tmpfs) ignores the
// page-cache drop: its "disk" reads at memory speed, which is what such a
// tier does deliver.
// Thread-safety: plain functions; each measurement uses its own buffers and
// file.
#pragma once

#include <string>
#include <vector>

#include "core/engine/kv_store.h"
#include "core/util/status.h"

namespace kdn::server {

// The read rate, bytes/s, of a tier of `kind` (for a disk tier, the tier's
// directory, which must hold its tmp/, i.e. a directory the tier has
// opened); 0 for the kinds not measured. A rate is positive and finite; a
// failed measurement (no tmp/, a full disk, an I/O error) is an error that
// names the directory and the step.
Result<double> MeasureTierLimit(store::TierSpec::Kind kind, const std::string& directory);

// One rate per spec, in order; a tier whose measurement fails gets 0 (not
// measured) and the failure is logged, never fatal: a node serves without
// its limits. Each result is logged (stderr, as kdnd's other notices),
// naming the tier by names[i] (the name its statistics carry).
std::vector<double> MeasureTierLimits(const std::vector<store::TierSpec>& specs, const std::vector<std::string>& names);

}  // namespace kdn::server

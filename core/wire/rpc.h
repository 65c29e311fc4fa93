// SPDX-License-Identifier: Apache-2.0
// What both ends of kdnd's RPC (wire/node.capnp) agree on besides the schema.
#pragma once

#include <cstdint>

#include <capnp/message.h>

namespace kdn::wire {

// The largest message either end reads: an envelope piece (256 MiB) plus
// its framing. Cap'n Proto refuses a larger message before it allocates it.
inline constexpr std::uint64_t kMaxRpcMessageWords = (std::uint64_t{1} << 28) / 8 + (std::uint64_t{1} << 20);

inline capnp::ReaderOptions RpcReaderOptions() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = kMaxRpcMessageWords;
  return o;
}

}  // namespace kdn::wire

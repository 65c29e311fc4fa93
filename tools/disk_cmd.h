// SPDX-License-Identifier: Apache-2.0
// `kdn disk fill` and `kdn disk verify`: exercise a disk tier directory the
// way a crash test needs. `fill` writes chunks whose every byte follows from
// (seed, chunk index) and may be killed at any moment; `verify` reopens the
// directory as a restart would and checks every object it holds against
// those bytes, reporting JSON. With --codec (not raw), fill stores each
// chunk encoded, as a chain would for a disk tier with that codec (the
// chunks then hold finite f32 values, which every codec takes), and verify,
// given the same --codec, checks that each object decodes to exactly what
// the fill chunk encodes and decodes to (codecs are deterministic).
// Thread-safety: single-threaded command code.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

namespace kdn::tools {

struct DiskFillOptions {
  std::string dir;
  std::uint64_t chunks = 0;
  std::uint64_t chunk_bytes = 65536;  // payload bytes; a multiple of 8
  std::uint64_t seed = 0;
  std::uint64_t capacity = std::uint64_t{1} << 30;
  std::string fsync = "data";         // none | data | full
  std::string codec = "raw";          // a codec spec (codec/codec.h)
};

struct DiskVerifyOptions {
  std::string dir;
  std::uint64_t seed = 0;
  std::uint64_t capacity = std::uint64_t{1} << 30;
  bool json = false;
  std::string codec = "raw";          // the codec fill used
};

// Exit codes: 0 done, 2 bad arguments or an error.
int RunDiskFill(const DiskFillOptions& options);
// Exit codes: 0 when the tier never returned wrong bytes and its usage is
// within its capacity, 1 otherwise, 2 on an error.
int RunDiskVerify(const DiskVerifyOptions& options);

// Registers `disk fill` and `disk verify` on a CLI11 app; after parsing,
// chosen() says whether one of them was picked and Run() runs it.
class DiskCommand {
 public:
  explicit DiskCommand(CLI::App& app);
  // The parser writes into the options in place: the object must not move.
  DiskCommand(const DiskCommand&) = delete;
  DiskCommand& operator=(const DiskCommand&) = delete;
  bool chosen() const { return *fill_cmd_ || *verify_cmd_; }
  int Run() const { return *fill_cmd_ ? RunDiskFill(fill_) : RunDiskVerify(verify_); }

 private:
  DiskFillOptions fill_;
  DiskVerifyOptions verify_;
  CLI::App* fill_cmd_ = nullptr;
  CLI::App* verify_cmd_ = nullptr;
};

}  // namespace kdn::tools

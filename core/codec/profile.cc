// SPDX-License-Identifier: Apache-2.0
// Reading a codec profile (the file `kdn codec calibrate` writes). Apart
// from calibrate.cc so that decoding with a profile does not pull the
// calibration (and with it the reference transformer) into libkdn.so.
#include <fstream>
#include <string>

#include "core/codec/profile.h"

namespace kdn::codec {

Result<std::string> ReadProfile(const std::string& path, const std::string& preset) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("codec profile '" + path + "': cannot read it");
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
      return Status::InvalidArgument("codec profile '" + path + "' line " + std::to_string(number) +
                                     ": expected 'PRESET SPEC'");
    }
    if (line.substr(0, space) == preset) return line.substr(space + 1);
  }
  if (in.bad()) return Status::InvalidArgument("codec profile '" + path + "': read error");
  return Status::NotFound("codec profile '" + path + "' has no preset '" + preset + "'");
}

}  // namespace kdn::codec

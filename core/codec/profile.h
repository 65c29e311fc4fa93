// SPDX-License-Identifier: Apache-2.0
// Codec profiles: one "PRESET SPEC" line per preset, '#' comments.
// Thread-safety: pure functions (reads a file).
#pragma once

#include <string>

#include "core/util/status.h"

namespace kdn::codec {

// The spec a profile gives `preset`: kNotFound if it has no such line,
// kInvalidArgument if the file cannot be read or a line is malformed.
Result<std::string> ReadProfile(const std::string& path, const std::string& preset);

}  // namespace kdn::codec

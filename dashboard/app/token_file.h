// SPDX-License-Identifier: Apache-2.0
// The bearer token a dashboard logs in with, read from a file as kdnd reads
// its token files (server/config.cc): a regular file that neither group nor
// others may read (it holds a secret), at most 64 KiB, one word; trailing
// whitespace stripped.
// Thread-safety: a plain function.
#pragma once

#include <string>

namespace kdn::dash {

// The token, or false with a message for the user in *error (naming the
// file, never the token).
bool ReadTokenFile(const std::string& path, std::string* token, std::string* error);

}  // namespace kdn::dash

// SPDX-License-Identifier: Apache-2.0
// Searching stored bytes (a disk tier's files, a Redis server's values) for
// KV in the clear: the tests of encryption at rest (wire/cipher.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

namespace kdn::testing {

// How many of the 32-byte blocks of `plain` (each buffer cut at 32-byte
// steps) occur anywhere in `stored`: 0 when none of it is there in the
// clear; all of them when it is stored as it is.
inline size_t PlaintextBlocksFound(const std::vector<std::string_view>& plain, const std::vector<std::string>& stored,
                                   size_t* blocks = nullptr) {
  constexpr size_t kBlock = 32;
  size_t found = 0, total = 0;
  for (std::string_view p : plain) {
    for (size_t at = 0; at + kBlock <= p.size(); at += kBlock) {
      ++total;
      const std::string_view needle = p.substr(at, kBlock);
      for (const std::string& s : stored) {
        if (s.find(needle) != std::string::npos) {
          ++found;
          break;
        }
      }
    }
  }
  if (blocks) *blocks = total;
  return found;
}

// Every regular file under `dir`, read whole.
inline std::vector<std::string> FilesUnder(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    std::ifstream f(it->path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return out;
}

}  // namespace kdn::testing

// SPDX-License-Identifier: Apache-2.0
// The llama2.c / SentencePiece-style BPE tokenizer (tok512.bin format), and a
// byte-level fallback for runs without a tokenizer file.
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/util/status.h"

namespace kdn::model {

inline constexpr int kBos = 1;
inline constexpr int kEos = 2;

class Tokenizer {
 public:
  // Parses a tokenizer file image with `vocab_size` entries.
  static Result<Tokenizer> Parse(const std::vector<std::uint8_t>& bytes, int vocab_size);
  static Result<Tokenizer> Load(const std::string& path, int vocab_size);
  // Byte-level vocabulary: <unk>, <s>, </s>, then <0x00>..<0xFF>, padded to
  // vocab_size (>= 259) with unused pieces. No merges.
  static Tokenizer Bytes(int vocab_size);

  // Text -> ids: a dummy-prefix space, code points (unknown ones as byte
  // tokens), then greedy merges of the best-scored pair. BOS is prepended
  // when `bos` is set.
  std::vector<int> Encode(std::string_view text, bool bos) const;
  // The text of `token` when it follows `prev` (a leading space is dropped
  // after BOS; <0xNN> pieces are raw bytes).
  std::string Decode(int prev, int token) const;
  std::string DecodeAll(const std::vector<int>& ids, int prev = kBos) const;

  int vocab_size() const { return static_cast<int>(pieces_.size()); }

 private:
  Tokenizer() = default;
  void Index();
  int Find(std::string_view piece) const;

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
};

}  // namespace kdn::model

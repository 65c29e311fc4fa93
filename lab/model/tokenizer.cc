// SPDX-License-Identifier: Apache-2.0
#include "lab/model/tokenizer.h"

#include <cstdio>
#include <cstring>
#include <fstream>

namespace kdn::model {

Result<Tokenizer> Tokenizer::Parse(const std::vector<std::uint8_t>& bytes, int vocab_size) {
  if (vocab_size <= 0) return Status::InvalidArgument("tokenizer: vocab_size must be positive");
  size_t off = 0;
  auto read_i32 = [&](std::int32_t* v) {
    if (bytes.size() - off < 4) return false;
    std::memcpy(v, bytes.data() + off, 4);
    off += 4;
    return true;
  };
  std::int32_t max_len = 0;
  if (!read_i32(&max_len)) return Status::InvalidArgument("tokenizer file truncated: no header");
  if (max_len <= 0 || max_len > 4096) {
    return Status::InvalidArgument("tokenizer: max_token_length " + std::to_string(max_len) + " out of range 1..4096");
  }
  Tokenizer t;
  t.pieces_.reserve(static_cast<size_t>(vocab_size));
  t.scores_.reserve(static_cast<size_t>(vocab_size));
  for (int i = 0; i < vocab_size; ++i) {
    std::int32_t score_bits = 0, len = 0;
    if (!read_i32(&score_bits) || !read_i32(&len)) {
      return Status::InvalidArgument("tokenizer file truncated at token " + std::to_string(i) + " of " +
                                     std::to_string(vocab_size));
    }
    float score;
    std::memcpy(&score, &score_bits, 4);
    if (len < 0 || len > max_len) {
      return Status::InvalidArgument("tokenizer: token " + std::to_string(i) + " has length " + std::to_string(len) +
                                     " (max_token_length " + std::to_string(max_len) + ")");
    }
    if (bytes.size() - off < static_cast<size_t>(len)) {
      return Status::InvalidArgument("tokenizer file truncated in token " + std::to_string(i));
    }
    t.pieces_.emplace_back(reinterpret_cast<const char*>(bytes.data() + off), static_cast<size_t>(len));
    t.scores_.push_back(score);
    off += static_cast<size_t>(len);
  }
  if (off != bytes.size()) {
    return Status::InvalidArgument("tokenizer file oversized: " + std::to_string(bytes.size() - off) +
                                   " bytes after the last of " + std::to_string(vocab_size) + " tokens");
  }
  t.Index();
  return t;
}

Result<Tokenizer> Tokenizer::Load(const std::string& path, int vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("cannot open tokenizer file '" + path + "'");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto r = Parse(bytes, vocab_size);
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

Tokenizer Tokenizer::Bytes(int vocab_size) {
  Tokenizer t;
  t.pieces_ = {"<unk>", "\n<s>\n", "\n</s>\n"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    t.pieces_.emplace_back(buf);
  }
  for (int i = static_cast<int>(t.pieces_.size()); i < vocab_size; ++i) t.pieces_.push_back("<unused" + std::to_string(i) + ">");
  t.scores_.assign(t.pieces_.size(), 0.0f);
  t.Index();
  return t;
}

void Tokenizer::Index() {
  ids_.clear();
  // The first id wins for duplicate pieces.
  for (int i = static_cast<int>(pieces_.size()) - 1; i >= 0; --i) ids_[pieces_[static_cast<size_t>(i)]] = i;
}

int Tokenizer::Find(std::string_view piece) const {
  auto it = ids_.find(std::string(piece));
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int> Tokenizer::Encode(std::string_view text, bool bos) const {
  std::vector<int> ids;
  if (bos) ids.push_back(kBos);
  if (text.empty()) return ids;
  auto push_bytes = [&](std::string_view s) {
    for (unsigned char b : s) ids.push_back(b + 3);
  };
  const int space = Find(" ");
  if (space >= 0) ids.push_back(space);
  // Split into UTF-8 code points (a continuation run is capped at 4 bytes).
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i + 1;
    while (j < text.size() && j - i < 4 && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) ++j;
    const std::string_view cp = text.substr(i, j - i);
    const int id = Find(cp);
    if (id >= 0) {
      ids.push_back(id);
    } else {
      push_bytes(cp);
    }
    i = j;
  }
  // Merge the best-scored adjacent pair until none is in the vocabulary.
  const size_t first = bos ? 1 : 0;
  std::string merged;
  for (;;) {
    float best_score = -1e30f;
    int best_id = -1;
    size_t best_at = 0;
    for (size_t k = first; k + 1 < ids.size(); ++k) {
      merged = pieces_[static_cast<size_t>(ids[k])];
      merged += pieces_[static_cast<size_t>(ids[k + 1])];
      const int id = Find(merged);
      if (id >= 0 && scores_[static_cast<size_t>(id)] > best_score) {
        best_score = scores_[static_cast<size_t>(id)];
        best_id = id;
        best_at = k;
      }
    }
    if (best_id < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  return ids;
}

std::string Tokenizer::Decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return "";
  std::string_view piece = pieces_[static_cast<size_t>(token)];
  if (prev == kBos && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  unsigned int byte = 0;
  char tail = 0;
  if (piece.size() == 6 && std::sscanf(std::string(piece).c_str(), "<0x%02X>%c", &byte, &tail) == 1) {
    return std::string(1, static_cast<char>(byte));
  }
  return std::string(piece);
}

std::string Tokenizer::DecodeAll(const std::vector<int>& ids, int prev) const {
  std::string out;
  for (int id : ids) {
    out += Decode(prev, id);
    prev = id;
  }
  return out;
}

}  // namespace kdn::model

// SPDX-License-Identifier: Apache-2.0
// `kdn ingest`: every text file under a directory becomes a knowledge item
// of a store (refengine/ingest.h), with a progress bar on a terminal (plain
// lines otherwise), Ctrl-C to stop after the files in progress, and a
// summary: files by outcome, items, tokens, bytes in the store, time.
#pragma once

#include <cstdint>
#include <string>

namespace kdn::tools {

struct IngestCmdOptions {
  std::string model, tokenizer;  // empty: the reference model
  std::string dir;               // the documents
  std::string store;             // the store's disk directory (its tier, and knowledge.kdnidx)
  std::string ns = "docs";
  std::string engine = "ref";
  double pin_s = -1;             // pin items this many seconds (0: until unpinned; < 0: no pin)
  int workers = 0;
  std::uint32_t max_tokens = 0;
  std::uint64_t capacity = std::uint64_t{16} << 30;  // the disk tier's
  std::string codec;             // the disk tier's (empty: zstd, lossless)
  std::uint32_t chunk_tokens = 256;
  bool prune = false;
  std::string progress = "auto";  // auto, bar, lines
  std::string json_path;          // the summary as JSON
};

// Exit status: 0 done (bad files skipped and reported), 1 a file failed or
// the run could not start, 130 stopped by Ctrl-C (run again to resume).
int RunIngest(const IngestCmdOptions& options);

}  // namespace kdn::tools

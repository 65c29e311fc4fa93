// SPDX-License-Identifier: Apache-2.0
// Ingestion of a document set: every text file under a directory becomes a
// knowledge item (doc_id = its path relative to the directory, version = a
// hash of its content), prefilled by the reference engine and stored through
// the C ABI (kdn_knowledge_put). `kdn ingest` and `kdn bench ingest` run it.
//
// - Long files: the reference model reads at most its context (512 tokens)
//   at once, and a knowledge item is prefilled alone from position 0. A file
//   of more tokens than `max_tokens` is cut into parts of at most that many
//   (at the last line break in the part's last quarter, if there is one),
//   each its own item "PATH#K" (K from 1); a file that fits is one item
//   "PATH". Every item's metadata is JSON: {"path", "part", "parts", "bytes"}.
// - Resumable: what the runtime's index already holds of a file at the same
//   version, whole (every part, every chunk in some tier), is skipped; a
//   file whose content changed is put again and its parts that are no longer
//   made are deleted. A runtime with a disk tier keeps its index across
//   restarts (knowledge.kdnidx), so a second run skips what the first stored.
// - Bad input is reported and skipped, the rest ingested: files that cannot
//   be read, empty files (nothing but whitespace), binary files (a NUL byte,
//   or not UTF-8), files larger than max_file_bytes, and a file that changes
//   while it is ingested (checked before each part's put; the parts already
//   put are deleted). Symbolic links are not followed; names starting with
//   '.' (files and directories) are left out.
// - Stopping: when *stop becomes true the workers finish the file they are
//   on (a file's parts are put whole or deleted) and return; what is left is
//   ingested by the next run.
// - Workers: `workers` threads, each with its own engine (a transformer on
//   one thread), take files in path order.
// Thread-safety: Ingest may be called from one thread at a time per runtime;
// the event callback is called from the workers, one call at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "refengine/model_loader.h"
#include "refengine/ref_engine.h"  // first to include kdn.h: the engine uses its experimental calls
#include "core/util/status.h"

namespace kdn::refengine {

struct IngestOptions {
  std::string dir;                          // the documents
  std::string ns;                           // kdn namespace of the items
  std::int64_t pin_ttl_ms = -1;             // pin each item for this long (0: until unpinned; -1: no pin)
  int workers = 0;                          // 0: one per hardware thread
  std::uint32_t max_tokens = 0;             // tokens per item at most; 0: the model's context
  std::uint64_t max_file_bytes = 16 << 20;  // larger files are skipped
  bool prune = false;                       // delete the items of files no longer under dir
  bool store = true;                        // false: prefill only, store nothing (the benchmark's baseline)
  // Fault injection (tests): runs once the files are listed, and before
  // each part's put with the file's path relative to dir.
  std::function<void()> after_listing;
  std::function<void(const std::string& path)> before_put;
};

enum class FileOutcome {
  kIngested,     // new: put
  kReplaced,     // held at another version (or incomplete): put again
  kUnchanged,    // held at this version, whole: skipped
  kEmpty,        // skipped
  kBinary,       // skipped
  kUnreadable,   // skipped (the reason in detail)
  kTooLarge,     // skipped
  kChanged,      // changed while it was ingested: skipped
  kFailed,       // a call failed (the message in detail): skipped
};
const char* OutcomeName(FileOutcome outcome);
// A file's name as a terminal line may show it: control bytes (newlines,
// escapes), backslashes and, in a name that is not UTF-8, its bytes over
// 0x7F written as \xHH; anything else as it is.
std::string PrintableName(const std::string& name);
inline bool Skipped(FileOutcome o) { return o != FileOutcome::kIngested && o != FileOutcome::kReplaced; }

struct FileEvent {
  std::string path;  // relative to dir
  FileOutcome outcome = FileOutcome::kIngested;
  std::string detail;
  std::uint64_t bytes = 0;
  std::uint64_t tokens = 0;  // tokens of its items (0 when skipped before tokenizing)
  std::uint32_t parts = 0;
};

struct IngestProgress {
  std::uint64_t files_total = 0, files_done = 0;
  std::uint64_t bytes_total = 0, bytes_done = 0;
  std::uint64_t tokens_done = 0;  // tokens prefilled (and stored) so far
  double elapsed_s = 0;
};

struct IngestSummary {
  std::uint64_t files = 0;
  std::uint64_t by_outcome[9] = {};      // indexed by FileOutcome
  std::uint64_t items = 0;               // knowledge items put
  std::uint64_t tokens = 0;              // their tokens
  std::uint64_t bytes = 0;               // bytes of the files put
  std::uint64_t deleted = 0;             // items deleted (parts no longer made, pruned files)
  std::uint64_t prefill_ns = 0;          // forward passes, summed over the workers
  std::uint64_t put_ns = 0;              // kdn_knowledge_put (and pins), summed over the workers
  double wall_s = 0;                     // the whole run
  bool interrupted = false;              // stopped before every file was looked at
  std::uint64_t left = 0;                // files not looked at
  int workers = 0;
};

using IngestEventFn = std::function<void(const FileEvent&, const IngestProgress&)>;

// The text files under options.dir, relative paths in order, with their sizes.
struct FoundFile {
  std::string path;
  std::uint64_t bytes = 0;
};
Result<std::vector<FoundFile>> FindDocuments(const std::string& dir);

// The version of a document's content: the first 8 bytes of its SHA-256,
// little-endian (never 0).
std::uint64_t ContentVersion(const std::string& content);

// The store `kdn ingest` fills: a host tier (`host_bytes`) written through to
// a disk tier at `dir` (its `capacity` and `codec`; empty: zstd), so a put
// returns once the chunk is in memory and the disk write overlaps the next
// prefills; the runtime's destroy waits for the writes. An engine opens the
// same directory as a disk tier (with the same chunk_tokens and hash seed)
// and finds the documents there.
struct StoreOptions {
  std::string dir;
  std::uint64_t capacity = std::uint64_t{16} << 30;
  std::string codec;
  std::uint32_t chunk_tokens = 256;
  std::uint64_t host_bytes = std::uint64_t{256} << 20;
};
// kdn_runtime_destroy the result.
Result<kdn_runtime*> OpenStore(const StoreOptions& options);

Result<IngestSummary> Ingest(const LoadedModel& model, kdn_runtime* runtime, const IngestOptions& options,
                             const std::atomic<bool>* stop, const IngestEventFn& on_event);

}  // namespace kdn::refengine

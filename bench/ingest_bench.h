// SPDX-License-Identifier: Apache-2.0
// `kdn bench ingest`: what storing costs on top of prefill when a document
// set is ingested (issue 18, part 1), and the time to inject the reference
// corpus.
// Thread-safety: RunIngestBench is a whole command; run one at a time.
#pragma once

#include <string>

namespace kdn::bench {

struct IngestBenchOptions {
  std::string json_path;
  std::string model, tokenizer;  // empty: the reference model
  std::string dir;               // the documents (default: the reference corpus, written to a scratch dir)
  std::string scratch;           // where the stores go (default: the temp dir)
  int workers = 0;               // 0: one per core
  int repeats = 3;               // runs of each side (median)
  bool quick = false;            // one run of each on a few documents (a smoke test)
};

// The reference corpus: every story of bench/texts/{stories,heldout,
// calibration}.txt (paragraphs between blank lines) as a file of its own.
// Records, per run of the same documents with the same engines and workers:
//   ingest_prefill_only_tokens_per_s  the forward passes alone (reading and
//                                     tokenizing the files included)
//   ingest_tokens_per_s               the same plus kdn_knowledge_put into a
//                                     fresh disk tier (zstd, fdatasync per
//                                     chunk: the tier's defaults) and the
//                                     index's save; ratio against the above
//   ingest_store_overhead             1 - that ratio (goal: at most 0.10)
//   ingest_reference_corpus_s         wall time to inject the corpus
//   ingest_resume_s                   a second run over the same store (every
//                                     file unchanged, skipped)
// Sides alternate (prefill, ingest, prefill, ...) so drift hits both.
int RunIngestBench(const IngestBenchOptions& options);

}  // namespace kdn::bench

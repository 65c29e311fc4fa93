// SPDX-License-Identifier: Apache-2.0
// `kdn bench codec`: the KV codecs measured on the reference model's real KV
// (issue 4, sections 5 and 7).
// Thread-safety: RunCodecBench is a whole command; run one at a time.
#pragma once

#include <string>

namespace kdn::bench {

struct CodecBenchOptions {
  std::string json_path;
  std::string png_path;   // empty: json_path with its extension replaced by .png
  std::string model;      // empty: the reference model (required: no random stand-in)
  std::string tokenizer;  // empty: the reference tokenizer
  std::string text;       // empty: bench/texts/heldout.txt (the presets were tuned on stories.txt)
  int context = 0;        // N: positions per quality context, one chunk each; 0 means 256, or 128 with quick
  int continue_tokens = 0;  // K: 0 means 64, or 16 with quick
  int contexts = 0;       // at most this many quality contexts; 0: all, or 3 with quick
  int repeats = 0;        // timed runs per speed measure at least; 0: 15, or 3 with quick
  int threads = 0;        // threads for the quality evaluations; 0: all cores
  bool quick = false;     // a smoke test, not a measurement
};

// For raw, fp8, int8, kivi2, cachegen, kdn (= kdn:balanced), kdn:hifi and
// zstd (the lossless codec, = zstd:level=3,shuffle=1) at their default
// settings:
//  - quality (codec::Evaluate: KL mean and p95, top-1 agreement) and size
//    (ratio vs f16) from ONE encoding of each context's KV held as f16 (as
//    engines hold it and the store keeps it), one chunk per context: the
//    headline at the store's chunk size (contexts of 256 tokens; records
//    `codec_<measure>_<codec>`) and beside it at 448 tokens (records
//    `..._448`), against zstd -1 on the same f16 bytes;
//  - single-threaded encode and decode GB/s of uncompressed KV on fp16 (and
//    fp32) chunks of 256 tokens, against zstd -1 on the same bytes in the
//    same run; zstd -3 and lz4 are measured beside it;
//  - kdn:balanced decoding those f16 chunks on two threads against one
//    (wall-clock, alternated in the same run; `codec_decode_2threads_gbps_kdn`
//    against `codec_decode_1thread_gbps_kdn`), with the machine's core count;
//  - kdn:balanced against cachegen, kdn:hifi's ratio at its KL;
//  - a settings sweep per codec (headline context), written as records
//    `codec_curve_<spec>` and drawn as a PNG of ratio against KL (gnuplot;
//    skipped with a warning when gnuplot is missing).
// Every figure comes from the text measured (by default the held-out
// bench/texts/heldout.txt; kdn's presets were chosen on stories.txt): each
// record's params name it ("text", "held_out"; the presets' "tuned_on"), and
// measuring on the tuning text is warned about.
// Codecs that cannot be built (MakeCodec fails) or fail on the KV are
// skipped with a warning on stderr; the rest is still written.
// Writes the JSON array of DESIGN.md's records; returns an exit code (0 done,
// 2 bad arguments or nothing measurable).
int RunCodecBench(const CodecBenchOptions& options);

}  // namespace kdn::bench

// SPDX-License-Identifier: Apache-2.0
// llama.cpp as an engine of `kdn bench rag` (bench/rag_bench.h): the same
// requests on the reference model as GGUF, through the connector.
//
//   in-context: the whole prompt decoded in one batch;
//   prefix reuse: Connector::Restore of the longest cached prefix, the rest
//     decoded, then Connector::Save of the prompt (a host tier);
//   blending: each document's KV computed alone (BOS, then the document),
//     saved by Inject into a host tier written through to a disk tier, placed
//     by BuildBlend (llama_eval.h) with its first `first_tokens` tokens
//     decoded again in place, then the history and question decoded:
//     llama.cpp's API has no per-layer hook, so kdn's selection cannot run
//     inside it (docs/llamacpp.md); this is EPIC / LegoLink's rule;
//   warm: the whole prompt saved first (untimed), restored, the last token
//     decoded.
// One session (f32 cache, flash attention off, one thread, 512 positions,
// two sequences for the moves), greedy decoding.
// Thread-safety: one engine per thread.
#pragma once

#include <string>

#include "bench/rag_bench.h"

namespace kdn::llamacpp {

// The engine on `gguf` (default: the reference model's GGUF of this build).
bench::RagEngineFactory RagEngineFactory(std::string gguf = KDN_GGUF_PATH, int first_tokens = 16);

}  // namespace kdn::llamacpp

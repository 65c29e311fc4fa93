// CPU path of KV gather (buffer -> canonical chunk) and scatter (chunk ->
// buffer), using the index math of common/kv_copy.h.
// Thread-safety: pure functions of their arguments.
#pragma once

#include "common/kv_copy.h"

namespace kdn::kernels {

// Copies buffer tokens [token_begin, token_begin + tokens) into `chunk`.
void kv_gather_cpu(const void* buffer, const KvStrides& st, const KvShape& s, std::int64_t token_begin,
                   std::int64_t tokens, void* chunk);
// Copies `chunk` into buffer tokens [token_begin, token_begin + tokens).
void kv_scatter_cpu(const void* chunk, const KvStrides& st, const KvShape& s, std::int64_t token_begin,
                    std::int64_t tokens, void* buffer);

}  // namespace kdn::kernels

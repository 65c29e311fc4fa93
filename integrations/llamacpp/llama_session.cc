// SPDX-License-Identifier: Apache-2.0
// A llama.cpp session; the contract is in llama_session.h.
#include "llama_session.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <mutex>

#include "ggml-backend.h"
#include "llama.h"

namespace kdn::llamacpp {
namespace {

// llama.cpp's log: warnings and errors only, to stderr (not the
// continuations of its info lines: the model loader's progress dots).
void QuietLog(enum ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

// The CPU backends are shared libraries found at run time: registered once
// per process, before any model is loaded, or no backend is found.
void InitBackends(const std::string& dir) {
  static std::once_flag once;
  std::call_once(once, [&] {
    llama_log_set(QuietLog, nullptr);
    ggml_backend_load_all_from_path(dir.c_str());
    llama_backend_init();
  });
}

}  // namespace

struct Session::Impl {
  SessionOptions options;
  llama_model* model = nullptr;
  llama_context* ctx = nullptr;
  const llama_vocab* vocab = nullptr;
  std::uint64_t decode_ns = 0;  // time in llama_decode, summed
  // llama_decode, timed.
  int Decode(const llama_batch& b) {
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = llama_decode(ctx, b);
    decode_ns += static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    return rc;
  }
  ~Impl() {
    if (ctx != nullptr) llama_free(ctx);
    if (model != nullptr) llama_model_free(model);
  }
};

Result<std::unique_ptr<Session>> Session::Load(const SessionOptions& o) {
  if (o.n_ctx == 0) return Status::InvalidArgument("llama session: n_ctx must be positive");
  InitBackends(o.backend_dir);
  std::unique_ptr<Session> s(new Session());
  s->impl_ = std::make_unique<Impl>();
  s->impl_->options = o;
  llama_model_params mp = llama_model_default_params();
  s->impl_->model = llama_model_load_from_file(o.gguf.c_str(), mp);
  if (s->impl_->model == nullptr) {
    return Status::InvalidArgument("llama session: cannot load the model '" + o.gguf +
                                   "' (is it a GGUF file, and are the CPU backends in '" + o.backend_dir + "'?)");
  }
  s->impl_->vocab = llama_model_get_vocab(s->impl_->model);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = o.n_ctx;
  cp.n_batch = o.n_ctx;
  cp.n_ubatch = o.n_ctx;
  cp.n_seq_max = std::max<std::uint32_t>(o.n_seq_max, 1);
  cp.kv_unified = cp.n_seq_max > 1;
  cp.n_threads = cp.n_threads_batch = o.threads;
  cp.flash_attn_type = o.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = cp.type_v = o.f16_cache ? GGML_TYPE_F16 : GGML_TYPE_F32;
  cp.no_perf = true;
  s->impl_->ctx = llama_init_from_model(s->impl_->model, cp);
  if (s->impl_->ctx == nullptr) return Status::Internal("llama session: cannot create a context for '" + o.gguf + "'");
  return s;
}

Session::~Session() = default;

Result<std::vector<std::int32_t>> Session::Tokenize(const std::string& text) const {
  std::vector<llama_token> ids(text.size() + 2);
  int n = llama_tokenize(impl_->vocab, text.data(), static_cast<std::int32_t>(text.size()), ids.data(),
                         static_cast<std::int32_t>(ids.size()), /*add_special=*/true, /*parse_special=*/false);
  if (n < 0) return Status::InvalidArgument("llama session: the text does not tokenize");
  ids.resize(static_cast<size_t>(n));
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

std::uint64_t Session::decode_ns() const { return impl_->decode_ns; }

std::int32_t Session::vocab_size() const { return llama_vocab_n_tokens(impl_->vocab); }

Status Session::Decode(const std::vector<std::int32_t>& tokens) {
  if (tokens.empty()) return Status::InvalidArgument("llama session: nothing to decode");
  std::vector<llama_token> t(tokens.begin(), tokens.end());
  const int rc = impl_->Decode(llama_batch_get_one(t.data(), static_cast<std::int32_t>(t.size())));
  if (rc != 0) return Status::Internal("llama session: llama_decode returned " + std::to_string(rc));
  return Status::Ok();
}

Status Session::DecodeAt(const std::vector<std::int32_t>& tokens, std::int32_t first) {
  if (tokens.empty()) return Status::InvalidArgument("llama session: nothing to decode");
  const auto n = static_cast<std::int32_t>(tokens.size());
  llama_batch b = llama_batch_init(n, 0, 1);
  for (std::int32_t i = 0; i < n; ++i) {
    b.token[i] = tokens[static_cast<std::size_t>(i)];
    b.pos[i] = first + i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = i + 1 == n;
  }
  b.n_tokens = n;
  const int rc = impl_->Decode(b);
  llama_batch_free(b);
  if (rc != 0) return Status::Internal("llama session: llama_decode returned " + std::to_string(rc));
  return Status::Ok();
}

Result<std::vector<float>> Session::DecodeWithLogits(const std::vector<std::int32_t>& tokens) {
  if (tokens.empty()) return Status::InvalidArgument("llama session: nothing to decode");
  const auto n = static_cast<std::int32_t>(tokens.size());
  llama_batch b = llama_batch_init(n, 0, 1);
  const llama_pos first = llama_memory_seq_pos_max(llama_get_memory(impl_->ctx), 0) + 1;
  for (std::int32_t i = 0; i < n; ++i) {
    b.token[i] = tokens[static_cast<std::size_t>(i)];
    b.pos[i] = first + i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = n;
  const int rc = impl_->Decode(b);
  llama_batch_free(b);
  if (rc != 0) return Status::Internal("llama session: llama_decode returned " + std::to_string(rc));
  const std::int32_t vocab = vocab_size();
  std::vector<float> out(static_cast<std::size_t>(n) * static_cast<std::size_t>(vocab));
  for (std::int32_t i = 0; i < n; ++i) {
    std::memcpy(out.data() + static_cast<std::size_t>(i) * static_cast<std::size_t>(vocab),
                llama_get_logits_ith(impl_->ctx, i), sizeof(float) * static_cast<std::size_t>(vocab));
  }
  return out;
}

std::int32_t Session::Argmax() const {
  const float* l = llama_get_logits_ith(impl_->ctx, -1);
  const std::int32_t n = vocab_size();
  std::int32_t best = 0;
  for (std::int32_t i = 1; i < n; ++i) {
    if (l[i] > l[best]) best = i;
  }
  return best;
}

std::vector<float> Session::LastLogits() const {
  const float* l = llama_get_logits_ith(impl_->ctx, -1);
  return std::vector<float>(l, l + vocab_size());
}

Result<std::vector<std::int32_t>> Session::Greedy(int steps) {
  std::vector<std::int32_t> out;
  for (int s = 0; s < steps; ++s) {
    out.push_back(Argmax());
    if (s + 1 < steps) KDN_RETURN_IF_ERROR(Decode({out.back()}));
  }
  return out;
}

void Session::Clear() { llama_memory_clear(llama_get_memory(impl_->ctx), /*data=*/true); }

Result<std::vector<std::uint8_t>> Session::SaveSequence() const {
  std::vector<std::uint8_t> state(llama_state_seq_get_size(impl_->ctx, 0));
  const std::size_t n = llama_state_seq_get_data(impl_->ctx, state.data(), state.size(), 0);
  if (n == 0 || n > state.size()) return Status::Internal("llama session: llama_state_seq_get_data failed");
  state.resize(n);
  return state;
}

Status Session::RestoreSequence(const std::vector<std::uint8_t>& state, std::int32_t seq) {
  if (llama_state_seq_set_data(impl_->ctx, state.data(), state.size(), seq) == 0) {
    return Status::InvalidArgument("llama session: llama.cpp refused the state (" + std::to_string(state.size()) +
                                   " bytes)");
  }
  return Status::Ok();
}

const SessionOptions& Session::options() const { return impl_->options; }

void Session::SeqRemove(std::int32_t seq, std::int32_t p0, std::int32_t p1) {
  llama_memory_seq_rm(llama_get_memory(impl_->ctx), seq, p0, p1);
}
void Session::SeqShift(std::int32_t seq, std::int32_t p0, std::int32_t p1, std::int32_t delta) {
  llama_memory_seq_add(llama_get_memory(impl_->ctx), seq, p0, p1, delta);
}
void Session::SeqCopy(std::int32_t seq, std::int32_t dst, std::int32_t p0, std::int32_t p1) {
  llama_memory_seq_cp(llama_get_memory(impl_->ctx), seq, dst, p0, p1);
}

std::uint32_t Session::layers() const { return static_cast<std::uint32_t>(llama_model_n_layer(impl_->model)); }
std::uint32_t Session::kv_heads() const { return static_cast<std::uint32_t>(llama_model_n_head_kv(impl_->model)); }
std::uint32_t Session::head_dim() const {
  return static_cast<std::uint32_t>(llama_model_n_embd(impl_->model) / llama_model_n_head(impl_->model));
}
std::uint32_t Session::sliding_window() const {
  return static_cast<std::uint32_t>(std::max(0, llama_model_n_swa(impl_->model)));
}
bool Session::recurrent() const {
  return llama_model_is_recurrent(impl_->model) || llama_model_is_hybrid(impl_->model);
}
std::string Session::Metadata(const std::string& key) const {
  char buf[256];
  const int n = llama_model_meta_val_str(impl_->model, key.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf, static_cast<std::size_t>(std::min<int>(n, sizeof buf - 1)));
}

}  // namespace kdn::llamacpp

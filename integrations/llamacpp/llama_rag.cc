// SPDX-License-Identifier: Apache-2.0
#include "llama_rag.h"

#include "refengine/ingest.h"  // first to include kdn.h: the reference engine uses its experimental calls

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "connector.h"
#include "llama_eval.h"
#include "llama_session.h"

namespace kdn::llamacpp {
namespace {

using bench::RagDocument;
using bench::RagInjected;
using bench::RagMode;
using bench::RagRequest;
using bench::RagServed;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<std::int32_t> Ids(const std::vector<int>& v) { return std::vector<std::int32_t>(v.begin(), v.end()); }

class LlamaRagEngine : public bench::RagEngine {
 public:
  static Result<std::unique_ptr<bench::RagEngine>> Create(const std::string& gguf, const std::string& scratch,
                                                           int first_tokens) {
    std::unique_ptr<LlamaRagEngine> e(new LlamaRagEngine(gguf, scratch, first_tokens));
    SessionOptions so;
    so.gguf = gguf;
    so.backend_dir = KDN_LLAMACPP_LIBDIR;
    so.n_seq_max = 2;  // the blend moves a document's cells through sequence 1
    auto s = Session::Load(so);
    if (!s.ok()) return s.status();
    e->session_ = std::move(s).value();
    auto spec = ModelSpecFor(*e->session_, gguf, &e->fingerprint_);
    if (!spec.ok()) return spec.status();
    e->spec_ = *spec;
    for (RagMode m : {RagMode::kPrefix, RagMode::kWarm, RagMode::kKnowledgeCached}) {
      auto rt = bench::RagHostStore();
      if (!rt.ok()) return rt.status();
      KDN_RETURN_IF_ERROR(e->Attach(m, *rt));
    }
    return std::unique_ptr<bench::RagEngine>(std::move(e));
  }
  ~LlamaRagEngine() override {
    for (int m = 0; m < bench::kRagModes; ++m) Detach(static_cast<RagMode>(m));
  }

  std::string name() const override { return "llama.cpp"; }
  std::string description() const override {
    return "llama.cpp (prebuilt libllama, " KDN_LLAMACPP_BUILD "), the reference model as GGUF, f32 cache, flash "
           "attention off, one thread";
  }
  std::string blend_method() const override {
    return "the first " + std::to_string(first_tokens_) +
           " tokens of each document decoded again in place, the rest restored from its KV computed alone "
           "(EPIC/LegoLink's rule: llama.cpp's API has no per-layer hook for kdn's selection)";
  }

  Result<RagInjected> Inject(const std::vector<RagDocument>& kb) override {
    // Every document computed alone and saved, the store closed (its disk
    // writes done) before the time stops; then opened again to serve.
    refengine::StoreOptions so;
    so.dir = scratch_ + "/kb";
    so.chunk_tokens = bench::kRagChunkTokens;
    RagInjected out;
    const auto t0 = std::chrono::steady_clock::now();
    {
      auto rt = refengine::OpenStore(so);
      if (!rt.ok()) return rt.status();
      KDN_RETURN_IF_ERROR(Attach(RagMode::kBlend, *rt));
      Connector& c = *conn_[static_cast<int>(RagMode::kBlend)];
      for (const RagDocument& d : kb) {
        std::vector<std::int32_t> alone = {1};
        alone.insert(alone.end(), d.tokens.begin(), d.tokens.end());
        session_->Clear();
        const auto p0 = std::chrono::steady_clock::now();
        KDN_RETURN_IF_ERROR(c.Prefill(alone));
        out.prefill_s += SecondsSince(p0);
        Result<std::uint64_t> saved = c.Save(alone);
        if (!saved.ok()) return saved.status();
        if (*saved != alone.size()) {
          return Status::Internal("llama rag: document " + d.id + ": " + std::to_string(*saved) + " of " +
                                  std::to_string(alone.size()) + " tokens cached");
        }
        out.tokens += d.tokens.size();
      }
      Detach(RagMode::kBlend);
    }
    out.wall_s = SecondsSince(t0);
    auto rt = refengine::OpenStore(so);
    if (!rt.ok()) return rt.status();
    KDN_RETURN_IF_ERROR(Attach(RagMode::kBlend, *rt));
    return out;
  }

  Status Prepare(RagMode mode, const RagRequest& r, const std::vector<RagDocument>&) override {
    if (mode != RagMode::kWarm && mode != RagMode::kKnowledgeCached) return Status::Ok();
    session_->Clear();
    std::vector<std::int32_t> part = Ids(r.prompt);
    if (mode == RagMode::kKnowledgeCached) part.resize(part.size() - r.tail.size());
    KDN_RETURN_IF_ERROR(session_->Decode(part));
    Result<std::uint64_t> saved = conn_[static_cast<int>(mode)]->Save(part);
    return saved.ok() ? Status::Ok() : saved.status();
  }

  Result<RagServed> Serve(RagMode mode, const RagRequest& r, const std::vector<RagDocument>& kb, int generate,
                          const std::vector<int>* forced) override {
    Session& s = *session_;
    const std::vector<std::int32_t> prompt = Ids(r.prompt);
    RagServed out;
    s.Clear();
    const std::uint64_t engine0 = s.decode_ns();
    const auto t0 = std::chrono::steady_clock::now();
    switch (mode) {
      case RagMode::kInContext:
        KDN_RETURN_IF_ERROR(s.Decode(prompt));
        out.recompute_fraction = 1;
        break;
      case RagMode::kPrefix:
      case RagMode::kWarm:
      case RagMode::kKnowledgeCached: {
        Connector& c = *conn_[static_cast<int>(mode)];
        Result<Connector::Restored> got = c.Restore(prompt);
        if (!got.ok()) return got.status();
        out.reused_tokens = got->tokens;
        KDN_RETURN_IF_ERROR(
            c.Prefill(std::vector<std::int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(got->tokens), prompt.end())));
        out.recompute_fraction = static_cast<double>(prompt.size() - got->tokens) / static_cast<double>(prompt.size());
        break;
      }
      case RagMode::kBlend: {
        std::vector<std::vector<std::int32_t>> docs;
        std::size_t placed = 0, decoded = 1 + r.tail.size();  // BOS and the tail
        for (int d : r.documents) {
          docs.push_back(Ids(kb[static_cast<std::size_t>(d)].tokens));
          const std::size_t k = std::min(docs.back().size(), static_cast<std::size_t>(first_tokens_));
          placed += docs.back().size() - k;
          decoded += k;
        }
        KDN_RETURN_IF_ERROR(BuildBlend(s, *conn_[static_cast<int>(mode)], docs, static_cast<std::size_t>(first_tokens_),
                                       0, Ids(r.tail)));
        out.reused_tokens = placed;
        out.recompute_fraction = static_cast<double>(decoded) / static_cast<double>(prompt.size());
        break;
      }
    }
    out.step_logits = s.LastLogits();
    out.continuation.assign(1, s.Argmax());
    out.ttft_ms = SecondsSince(t0) * 1e3;
    if (mode == RagMode::kPrefix) {
      Result<std::uint64_t> saved = conn_[static_cast<int>(mode)]->Save(prompt);
      if (!saved.ok()) return saved.status();
    }
    // Greedy decoding, or the forced tokens (teacher forcing), one step each.
    for (int step = 1; step < generate; ++step) {
      const auto prev = static_cast<std::size_t>(step - 1);
      const std::int32_t next = forced != nullptr && prev < forced->size() ? (*forced)[prev] : out.continuation.back();
      KDN_RETURN_IF_ERROR(s.Decode({next}));
      const std::vector<float> l = s.LastLogits();
      out.step_logits.insert(out.step_logits.end(), l.begin(), l.end());
      out.continuation.push_back(s.Argmax());
    }
    out.engine_ms = static_cast<double>(s.decode_ns() - engine0) / 1e6;
    return out;
  }

  nlohmann::json Store(RagMode mode) override { return bench::RagStoreJson(rt_[static_cast<int>(mode)]); }

 private:
  LlamaRagEngine(std::string gguf, std::string scratch, int first_tokens)
      : gguf_(std::move(gguf)), scratch_(std::move(scratch)), first_tokens_(first_tokens) {}

  // A mode's store (taken over) with its model and connector.
  Status Attach(RagMode mode, kdn_runtime* rt) {
    const int m = static_cast<int>(mode);
    rt_[m] = rt;
    if (kdn_model_create(rt, &spec_, &model_[m]) != KDN_OK) {
      return Status::InvalidArgument(std::string("llama rag: kdn_model_create: ") + kdn_last_error_message());
    }
    const char* ns = mode == RagMode::kBlend ? "kb" : mode == RagMode::kPrefix ? "rag" : "warm";  // one store per mode
    conn_[m] = std::make_unique<Connector>(*session_, model_[m], ns);
    return Status::Ok();
  }
  void Detach(RagMode mode) {
    const int m = static_cast<int>(mode);
    conn_[m].reset();
    if (model_[m] != nullptr) kdn_model_destroy(model_[m]);
    if (rt_[m] != nullptr) kdn_runtime_destroy(rt_[m]);
    model_[m] = nullptr;
    rt_[m] = nullptr;
  }

  std::string gguf_, scratch_;
  int first_tokens_;
  std::unique_ptr<Session> session_;
  std::string fingerprint_;
  kdn_model_spec spec_{};
  kdn_runtime* rt_[bench::kRagModes] = {};
  kdn_model* model_[bench::kRagModes] = {};
  std::unique_ptr<Connector> conn_[bench::kRagModes];
};

}  // namespace

bench::RagEngineFactory RagEngineFactory(std::string gguf, int first_tokens) {
  return [gguf = std::move(gguf), first_tokens](const std::string& scratch) {
    return LlamaRagEngine::Create(gguf, scratch, first_tokens);
  };
}

}  // namespace kdn::llamacpp

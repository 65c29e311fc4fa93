// SPDX-License-Identifier: Apache-2.0
#include "refengine/ref_engine.h"

#include <algorithm>
#include <chrono>
#include <span>

namespace kdn::refengine {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A request over token ids (the ids are borrowed).
kdn_request Request(const std::vector<int>& tokens) {
  kdn_request r = KDN_REQUEST_INIT;
  r.tokens = tokens.data();
  r.num_tokens = tokens.size();
  return r;
}

// The blend callback: the transformer's layer over the blender's KV. The
// buffers' lengths are checked against what the header promises before the
// transformer touches them.
struct BlendCallback {
  model::Transformer* transformer;
  double ms = 0;  // time in the transformer's layers
};

// The blend callbacks' arguments, checked as the header states them; then
// one layer (whole, or its K and V alone) of the transformer.
template <typename Run>
kdn_status CallLayer(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                     float* hidden, size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len,
                     size_t total, Run run) {
  BlendCallback& cb = *static_cast<BlendCallback*>(user);
  model::Transformer& t = *cb.transformer;
  const model::ModelConfig& c = t.config();
  if (layer >= static_cast<uint32_t>(c.n_layers) || hidden_dim != static_cast<uint32_t>(c.dim) ||
      positions == nullptr || hidden == nullptr || k == nullptr || v == nullptr || count > total ||
      total > static_cast<size_t>(c.seq_len) || hidden_len < count * hidden_dim ||
      kv_len < total * static_cast<size_t>(c.kv_dim()) || (layer == 0 && tokens == nullptr)) {
    return KDN_ERR_INVALID_ARGUMENT;
  }
  const std::vector<int> pos(positions, positions + count);
  std::vector<int> ids;
  if (tokens != nullptr) ids.assign(tokens, tokens + count);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = run(t, static_cast<int>(layer), pos, ids, hidden, k, v, static_cast<int>(total));
  cb.ms += MsSince(t0);
  if (s.ok()) return KDN_OK;
  return s.code() == Code::kInvalidArgument ? KDN_ERR_INVALID_ARGUMENT : KDN_ERR_INTERNAL;
}

kdn_status BlendLayer(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                      float* hidden, size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len,
                      size_t total) {
  return CallLayer(user, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total,
                   [](model::Transformer& t, int l, const std::vector<int>& pos, const std::vector<int>& ids,
                      float* h, float* kk, float* vv, int n) { return t.ForwardLayer(l, pos, ids, h, kk, vv, n); });
}

// The KV pass (kv_fn): the layer's K and V alone.
kdn_status BlendKv(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                   float* hidden, size_t hidden_len, uint32_t hidden_dim, float* k, float* v, size_t kv_len,
                   size_t total) {
  return CallLayer(user, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total,
                   [](model::Transformer& t, int l, const std::vector<int>& pos, const std::vector<int>& ids,
                      float* h, float* kk, float* vv, int n) { return t.ForwardKv(l, pos, ids, h, kk, vv, n); });
}

}  // namespace

Status FromKdn(kdn_status status, const std::string& what) {
  if (status == KDN_OK) return Status::Ok();
  return Status(static_cast<Code>(status), what + ": " + kdn_status_string(status) + ": " + kdn_last_error_message());
}

RefEngine::RefEngine(const LoadedModel& model, int threads) : transformer_(*model.weights, threads) {}

RefEngine::~RefEngine() { kdn_model_destroy(model_); }

Result<std::unique_ptr<RefEngine>> RefEngine::Create(const LoadedModel& model, kdn_runtime* runtime, int threads) {
  std::unique_ptr<RefEngine> e(new RefEngine(model, threads));
  const model::ModelConfig& c = model.weights->config();
  kdn_model_spec spec = KDN_MODEL_SPEC_INIT;
  spec.num_layers = static_cast<uint32_t>(c.n_layers);
  spec.num_kv_heads = static_cast<uint32_t>(c.n_kv_heads);
  spec.head_dim = static_cast<uint32_t>(c.head_dim());
  spec.dtype = KDN_DTYPE_F32;
  spec.rope_theta = 10000.0f;
  spec.rope_style = KDN_ROPE_INTERLEAVED;
  spec.fingerprint = model.fingerprint.data();
  spec.fingerprint_len = model.fingerprint.size();
  KDN_RETURN_IF_ERROR(FromKdn(kdn_model_create(runtime, &spec, &e->model_), "kdn_model_create"));
  return e;
}

kdn_kv_view RefEngine::View(model::KvCache& cache) const {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.dtype = KDN_DTYPE_F32;
  v.data = cache.data();
  v.size_bytes = cache.size_floats() * sizeof(float);
  v.num_tokens = static_cast<uint64_t>(cache.max_seq());
  v.stride_layer = cache.stride_layer();
  v.stride_kv = cache.stride_kv();
  v.stride_token = cache.kv_dim();
  v.stride_head = config().head_dim();
  v.stride_dim = 1;
  return v;
}

Status RefEngine::Prefill(std::span<const int> tokens, int pos, model::KvCache& cache, std::vector<float>* logits) {
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(transformer_.Forward(tokens, pos, cache, logits));
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  // A report kdn refuses (a zero time on a coarse clock) only loses a sample.
  if (model_ != nullptr && !tokens.empty() && ns > 0) {
    kdn_model_report_prefill(model_, tokens.size(), static_cast<std::uint64_t>(ns));
  }
  return Status::Ok();
}

Result<std::uint64_t> RefEngine::Ingest(const std::string& ns, const std::vector<int>& tokens) {
  model::KvCache cache = transformer_.NewCache();
  KDN_RETURN_IF_ERROR(Prefill(tokens, 0, cache, nullptr));
  const kdn_kv_view view = View(cache);
  const kdn_request req = Request(tokens);
  kdn_kv_result stored = KDN_KV_RESULT_INIT;
  KDN_RETURN_IF_ERROR(
      FromKdn(kdn_kv_store(model_, ns.data(), ns.size(), &req, &view, 1, &stored), "kdn_kv_store"));
  return stored.tokens;
}

Status RefEngine::Decode(model::KvCache& cache, int pos, int steps, Answer* answer) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> forced = std::move(forced_);
  forced_.clear();
  int token = answer->first_token;
  answer->continuation.assign(1, token);
  answer->step_logits = logits_;
  for (int s = 1; s < steps && pos < cache.max_seq(); ++s, ++pos) {
    const size_t prev = static_cast<size_t>(s - 1);
    const int in[1] = {prev < forced.size() ? forced[prev] : token};
    KDN_RETURN_IF_ERROR(transformer_.Forward(in, pos, cache, &logits_));
    token = model::Argmax(logits_);
    answer->continuation.push_back(token);
    answer->step_logits.insert(answer->step_logits.end(), logits_.begin(), logits_.end());
  }
  answer->decode_ms = MsSince(t0);
  return Status::Ok();
}

Result<Answer> RefEngine::Cold(const std::vector<int>& tokens, int steps) {
  model::KvCache cache = transformer_.NewCache();
  Answer a;
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(Prefill(tokens, 0, cache, &logits_));
  a.first_token = model::Argmax(logits_);
  a.ttft_ms = a.prefill_ms = MsSince(t0);
  KDN_RETURN_IF_ERROR(Decode(cache, static_cast<int>(tokens.size()), steps, &a));
  a.engine_ms = a.prefill_ms + a.decode_ms;
  return a;
}

Result<Answer> RefEngine::Warm(const std::string& ns, const std::vector<int>& tokens, int steps) {
  return WarmThenMaybeStore(ns, tokens, steps, false);
}

Result<Answer> RefEngine::Serve(const std::string& ns, const std::vector<int>& tokens, int steps) {
  return WarmThenMaybeStore(ns, tokens, steps, true);
}

Result<Answer> RefEngine::WarmThenMaybeStore(const std::string& ns, const std::vector<int>& tokens, int steps,
                                             bool store) {
  if (tokens.empty()) return Status::InvalidArgument("empty prompt");
  model::KvCache cache = transformer_.NewCache();
  const kdn_kv_view view = View(cache);
  const kdn_request req = Request(tokens);
  Answer a;
  const auto t0 = std::chrono::steady_clock::now();
  kdn_lookup_result looked = KDN_LOOKUP_RESULT_INIT;
  KDN_RETURN_IF_ERROR(FromKdn(kdn_kv_lookup(model_, ns.data(), ns.size(), &req, 1, &looked), "kdn_kv_lookup"));
  KDN_RETURN_IF_ERROR(FromKdn(looked.status, "kdn_kv_lookup (the request)"));
  a.lookup_ms = MsSince(t0);
  std::uint64_t filled = 0;
  kdn_kv_result got = KDN_KV_RESULT_INIT;
  if (looked.cached_tokens > 0) {
    // A miss here (the KV evicted since the lookup) is KDN_OK with 0 tokens:
    // the prefill below then runs in full.
    const auto t1 = std::chrono::steady_clock::now();
    KDN_RETURN_IF_ERROR(
        FromKdn(kdn_kv_retrieve(model_, ns.data(), ns.size(), &req, &view, 1, &got), "kdn_kv_retrieve"));
    filled = got.tokens;
    a.retrieve_ms = MsSince(t1);
  }
  a.reused_tokens = filled;
  // The last prompt token is always run, to get the logits of the next one.
  const size_t start = std::min<size_t>(filled, tokens.size() - 1);
  const auto t2 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(Prefill(std::span<const int>(tokens).subspan(start), static_cast<int>(start), cache, &logits_));
  a.first_token = model::Argmax(logits_);
  a.prefill_ms = MsSince(t2);
  a.ttft_ms = MsSince(t0);
  a.cached_after = filled;
  if (store && filled < tokens.size()) {
    kdn_kv_result stored = KDN_KV_RESULT_INIT;
    KDN_RETURN_IF_ERROR(FromKdn(kdn_kv_store(model_, ns.data(), ns.size(), &req, &view, 1, &stored), "kdn_kv_store"));
    a.cached_after = stored.tokens;
  }
  KDN_RETURN_IF_ERROR(Decode(cache, static_cast<int>(tokens.size()), steps, &a));
  a.engine_ms = a.prefill_ms + a.decode_ms;
  return a;
}

Status RefEngine::PutDocument(const std::string& ns, const std::string& doc_id, const std::vector<int>& tokens) {
  return PutDocument(ns, doc_id, 1, "", tokens, nullptr, nullptr);
}

Status RefEngine::PutDocument(const std::string& ns, const std::string& doc_id, std::uint64_t version,
                              const std::string& metadata, std::span<const int> tokens, std::uint64_t* prefill_ns,
                              std::uint64_t* put_ns, const std::function<Status()>& before_put) {
  if (!cache_) cache_ = std::make_unique<model::KvCache>(transformer_.NewCache());  // reused: one per engine
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(Prefill(tokens, 0, *cache_, nullptr));
  const auto t1 = std::chrono::steady_clock::now();
  if (before_put) KDN_RETURN_IF_ERROR(before_put());
  const auto t2 = std::chrono::steady_clock::now();
  const kdn_kv_view view = View(*cache_);
  KDN_RETURN_IF_ERROR(FromKdn(kdn_knowledge_put(model_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), version,
                                                metadata.data(), metadata.size(), tokens.data(), tokens.size(), &view, 1),
                              "kdn_knowledge_put"));
  const auto t3 = std::chrono::steady_clock::now();
  if (prefill_ns) *prefill_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  if (put_ns) *put_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t3 - t2).count());
  return Status::Ok();
}

Result<std::uint64_t> RefEngine::PrefillOnly(std::span<const int> tokens) {
  if (!cache_) cache_ = std::make_unique<model::KvCache>(transformer_.NewCache());
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(transformer_.Forward(tokens, 0, *cache_, nullptr));
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

Result<std::vector<int>> RefEngine::DocumentTokens(const std::string& ns, const std::string& doc_id) {
  // A guess first; the call says how many there are when it is too small
  // (the document may also have grown meanwhile: then ask again).
  std::vector<int> tokens(static_cast<size_t>(config().seq_len));
  for (;;) {
    kdn_kv_result fetched = KDN_KV_RESULT_INIT;
    const kdn_status s = kdn_knowledge_fetch(model_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), nullptr, 0,
                                             tokens.data(), tokens.size(), &fetched);
    const std::uint64_t num = fetched.tokens;
    if (s == KDN_ERR_BUFFER_TOO_SMALL && num > tokens.size()) {
      tokens.resize(static_cast<size_t>(num));
      continue;
    }
    KDN_RETURN_IF_ERROR(FromKdn(s, "kdn_knowledge_fetch"));
    tokens.resize(static_cast<size_t>(num));
    return tokens;
  }
}

Result<Answer> RefEngine::Blended(const std::string& ns, const std::vector<std::string>& doc_ids,
                                  const std::vector<int>& question, const BlendMethod& method, int steps,
                                  std::vector<int>* prompt, kdn_blend_report* report) {
  if (question.empty()) return Status::InvalidArgument("empty question");
  // The prompt the blend stands for, for a cold run of the same (and the
  // context's length, which the KV pass's cost depends on); not timed.
  prompt->assign(1, 1);
  for (const std::string& id : doc_ids) {
    Result<std::vector<int>> tokens = DocumentTokens(ns, id);
    if (!tokens.ok()) return tokens.status();
    prompt->insert(prompt->end(), tokens->begin(), tokens->end());
  }
  prompt->insert(prompt->end(), question.begin(), question.end());
  model::KvCache cache = transformer_.NewCache();
  const kdn_kv_view view = View(cache);
  Answer a;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::int32_t> bos = {1};
  const std::vector<std::int32_t> head(question.begin(), question.end() - 1);
  std::vector<kdn_blend_segment> segs;
  kdn_blend_segment s = KDN_BLEND_SEGMENT_INIT;
  s.tokens = bos.data();
  s.num_tokens = 1;
  segs.push_back(s);
  for (const std::string& id : doc_ids) {
    s = KDN_BLEND_SEGMENT_INIT;
    s.kind = KDN_SEGMENT_DOCUMENT;
    s.doc_id = id.data();
    s.doc_id_len = id.size();
    segs.push_back(s);
  }
  if (!head.empty()) {
    s = KDN_BLEND_SEGMENT_INIT;
    s.tokens = head.data();
    s.num_tokens = head.size();
    segs.push_back(s);
  }
  BlendCallback callback{&transformer_};
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  o.ratio = method.ratio;
  o.hidden_dim = static_cast<uint32_t>(transformer_.config().dim);
  o.layer_fn = BlendLayer;
  o.user = &callback;
  o.first_tokens = method.first_tokens;
  if (method.kv_pass) {
    o.kv_fn = BlendKv;
    o.kv_cost = static_cast<float>(transformer_.KvMacs() /
                                   transformer_.LayerMacs(static_cast<int>(prompt->size()) - 1));
  }
  *report = KDN_BLEND_REPORT_INIT;
  KDN_RETURN_IF_ERROR(FromKdn(
      kdn_kv_blend(model_, ns.data(), ns.size(), segs.data(), segs.size(), &o, &view, 1, report), "kdn_kv_blend"));
  const int n = static_cast<int>(report->positions);
  const int last = question.back();
  const auto t1 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(transformer_.Forward(std::span<const int>(&last, 1), n, cache, &logits_));
  a.prefill_ms = callback.ms + MsSince(t1);
  a.first_token = model::Argmax(logits_);
  a.ttft_ms = MsSince(t0);
  a.reused_tokens = report->cached_positions;
  KDN_RETURN_IF_ERROR(Decode(cache, n + 1, steps, &a));
  a.engine_ms = a.prefill_ms + a.decode_ms;
  return a;
}

}  // namespace kdn::refengine

#include "ref_engine.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "keys/hash.h"

namespace kdn::tools {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string FileDigest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  keys::Hasher h;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.Bytes(buf.data(), static_cast<size_t>(in.gcount()));
  }
  return keys::ToHex(h.Finish());
}

}  // namespace

std::string DefaultModelsDir() {
  if (const char* env = std::getenv("KDN_MODELS"); env && *env) return env;
#ifdef KDN_MODELS_DIR
  if (std::filesystem::exists(std::string(KDN_MODELS_DIR) + "/stories260K.bin")) return KDN_MODELS_DIR;
#endif
  return "../shared/models";
}

Status FromKdn(kdn_status status, const std::string& what) {
  if (status == KDN_OK) return Status::Ok();
  return Status(static_cast<Code>(static_cast<int>(status)),
                what + ": " + kdn_status_str(status) + ": " + kdn_last_error_message());
}

Result<LoadedModel> LoadModel(const std::string& model_path, const std::string& tokenizer_path, bool allow_random) {
  const std::string dir = DefaultModelsDir();
  const std::string mpath = model_path.empty() ? dir + "/stories260K.bin" : model_path;
  const std::string tpath = tokenizer_path.empty() ? dir + "/tok512.bin" : tokenizer_path;
  LoadedModel m;
  if (model_path.empty() && allow_random && !std::filesystem::exists(mpath)) {
    const model::ModelConfig config = model::Stories260KConfig();
    m.weights = std::make_unique<model::Checkpoint>(model::Checkpoint::Random(config, 260));
    m.tokenizer = std::make_unique<model::Tokenizer>(model::Tokenizer::Bytes(config.vocab_size));
    m.fingerprint = "llama2c:random-init:seed=260:stories260K-shape";
    m.random = true;
    m.description = "RANDOMLY INITIALISED model of the stories260K shape (no file at " + mpath +
                    "): timings are real, the text is noise";
    return m;
  }
  auto w = model::Checkpoint::Load(mpath);
  if (!w.ok()) return w.status();
  m.weights = std::make_unique<model::Checkpoint>(std::move(w).value());
  auto t = model::Tokenizer::Load(tpath, m.weights->config().vocab_size);
  if (!t.ok()) return t.status();
  m.tokenizer = std::make_unique<model::Tokenizer>(std::move(t).value());
  m.fingerprint = "llama2c:weights=" + FileDigest(mpath) + ":tokenizer=" + FileDigest(tpath);
  const auto& c = m.weights->config();
  m.description = mpath + " (dim " + std::to_string(c.dim) + ", " + std::to_string(c.n_layers) + " layers, " +
                  std::to_string(c.n_heads) + " heads, " + std::to_string(c.n_kv_heads) + " KV heads, context " +
                  std::to_string(c.seq_len) + ")";
  return m;
}

RefEngine::RefEngine(const LoadedModel& model, kdn_runtime* runtime, int threads)
    : transformer_(*model.weights, threads), runtime_(runtime) {}

RefEngine::~RefEngine() { kdn_model_destroy(model_); }

Result<std::unique_ptr<RefEngine>> RefEngine::Create(const LoadedModel& model, kdn_runtime* runtime, int threads) {
  std::unique_ptr<RefEngine> e(new RefEngine(model, runtime, threads));
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

kdn_kv_buffer RefEngine::View(model::KvCache& cache) const {
  // The cache is [layer][k|v][pos][kv_head][head_dim]: buffer token i is position i.
  kdn_kv_buffer b = KDN_KV_BUFFER_INIT;
  b.data = cache.data();
  b.size_bytes = cache.size_floats() * sizeof(float);
  b.num_tokens = static_cast<uint64_t>(cache.max_seq());
  b.dtype = KDN_DTYPE_F32;
  b.stride_layer = cache.stride_layer();
  b.stride_kv = cache.stride_kv();
  b.stride_token = cache.kv_dim();
  b.stride_head = config().head_dim();
  b.stride_dim = 1;
  return b;
}

Result<std::uint64_t> RefEngine::Ingest(const std::string& ns, const std::vector<int>& tokens) {
  model::KvCache cache = transformer_.NewCache();
  KDN_RETURN_IF_ERROR(transformer_.Forward(tokens, 0, cache, nullptr));
  const kdn_kv_buffer view = View(cache);
  std::uint64_t stored = 0;
  KDN_RETURN_IF_ERROR(FromKdn(kdn_store(runtime_, model_, ns.data(), ns.size(), tokens.data(), tokens.size(), &view,
                                        nullptr, &stored),
                              "kdn_store"));
  return stored;
}

Status RefEngine::Decode(model::KvCache& cache, int pos, int steps, Answer* answer) {
  int token = answer->first_token;
  answer->continuation.assign(1, token);
  for (int s = 1; s < steps && pos < cache.max_seq(); ++s, ++pos) {
    const int in[1] = {token};
    KDN_RETURN_IF_ERROR(transformer_.Forward(in, pos, cache, &logits_));
    token = model::Argmax(logits_);
    answer->continuation.push_back(token);
  }
  return Status::Ok();
}

Result<Answer> RefEngine::Cold(const std::vector<int>& tokens, int steps) {
  model::KvCache cache = transformer_.NewCache();
  Answer a;
  const auto t0 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(transformer_.Forward(tokens, 0, cache, &logits_));
  a.first_token = model::Argmax(logits_);
  a.ttft_ms = a.prefill_ms = MsSince(t0);
  KDN_RETURN_IF_ERROR(Decode(cache, static_cast<int>(tokens.size()), steps, &a));
  return a;
}

Result<Answer> RefEngine::Warm(const std::string& ns, const std::vector<int>& tokens, int steps) {
  if (tokens.empty()) return Status::InvalidArgument("empty prompt");
  model::KvCache cache = transformer_.NewCache();
  const kdn_kv_buffer view = View(cache);
  Answer a;
  const auto t0 = std::chrono::steady_clock::now();
  std::uint64_t cached = 0;
  KDN_RETURN_IF_ERROR(FromKdn(
      kdn_lookup(runtime_, model_, ns.data(), ns.size(), tokens.data(), tokens.size(), &cached), "kdn_lookup"));
  a.lookup_ms = MsSince(t0);
  std::uint64_t filled = 0;
  if (cached > 0) {
    const auto t1 = std::chrono::steady_clock::now();
    const kdn_status s = kdn_retrieve(runtime_, model_, ns.data(), ns.size(), tokens.data(), tokens.size(), &view, &filled);
    if (s != KDN_OK && s != KDN_ERR_NOT_FOUND) return FromKdn(s, "kdn_retrieve");  // a miss just means prefill
    a.retrieve_ms = MsSince(t1);
  }
  a.reused_tokens = filled;
  // The last prompt token is always run, to get the logits of the next one.
  const size_t start = std::min<size_t>(filled, tokens.size() - 1);
  const auto t2 = std::chrono::steady_clock::now();
  KDN_RETURN_IF_ERROR(transformer_.Forward(std::span<const int>(tokens).subspan(start), static_cast<int>(start), cache,
                                           &logits_));
  a.first_token = model::Argmax(logits_);
  a.prefill_ms = MsSince(t2);
  a.ttft_ms = MsSince(t0);
  KDN_RETURN_IF_ERROR(Decode(cache, static_cast<int>(tokens.size()), steps, &a));
  return a;
}

Status RefEngine::PutDocument(const std::string& ns, const std::string& doc_id, const std::vector<int>& tokens) {
  model::KvCache cache = transformer_.NewCache();
  KDN_RETURN_IF_ERROR(transformer_.Forward(tokens, 0, cache, nullptr));
  const kdn_kv_buffer view = View(cache);
  return FromKdn(kdn_knowledge_put(runtime_, model_, ns.data(), ns.size(), doc_id.data(), doc_id.size(), 1, "", 0,
                                   tokens.data(), tokens.size(), &view),
                 "kdn_knowledge_put");
}

namespace {

// The blend callback: the transformer's layer over the blender's KV.
kdn_status BlendLayer(void* user, uint32_t layer, const int32_t* positions, const int32_t* tokens, size_t count,
                      float* hidden, uint32_t /*hidden_dim*/, float* k, float* v, size_t total) {
  auto* t = static_cast<model::Transformer*>(user);
  const std::vector<int> pos(positions, positions + count);
  std::vector<int> ids;
  if (tokens != nullptr) ids.assign(tokens, tokens + count);
  const Status s = t->ForwardLayer(static_cast<int>(layer), pos, ids, hidden, k, v, static_cast<int>(total));
  return s.ok() ? KDN_OK : KDN_ERR_INTERNAL;
}

}  // namespace

Result<Answer> RefEngine::Blended(const std::string& ns, const std::vector<std::string>& doc_ids,
                                  const std::vector<int>& question, double ratio, int steps, std::vector<int>* prompt,
                                  kdn_blend_report* report) {
  if (question.empty()) return Status::InvalidArgument("empty question");
  model::KvCache cache = transformer_.NewCache();
  const kdn_kv_buffer view = View(cache);
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
  kdn_blend_options o = KDN_BLEND_OPTIONS_INIT;
  o.ratio = static_cast<float>(ratio);
  o.hidden_dim = static_cast<uint32_t>(transformer_.config().dim);
  o.layer_fn = BlendLayer;
  o.user = &transformer_;
  *report = KDN_BLEND_REPORT_INIT;
  KDN_RETURN_IF_ERROR(
      FromKdn(kdn_blend(runtime_, model_, ns.data(), ns.size(), segs.data(), segs.size(), &o, &view, report), "kdn_blend"));
  const int n = static_cast<int>(report->positions);
  const int last = question.back();
  KDN_RETURN_IF_ERROR(transformer_.Forward(std::span<const int>(&last, 1), n, cache, &logits_));
  a.first_token = model::Argmax(logits_);
  a.ttft_ms = MsSince(t0);
  a.reused_tokens = report->cached_positions;
  KDN_RETURN_IF_ERROR(Decode(cache, n + 1, steps, &a));
  // The prompt the blend stood for, for a cold run of the same.
  prompt->assign(1, 1);
  for (const std::string& id : doc_ids) {
    std::vector<std::int32_t> tokens(4096);
    std::uint64_t num = 0;
    KDN_RETURN_IF_ERROR(FromKdn(kdn_knowledge_fetch(runtime_, model_, ns.data(), ns.size(), id.data(), id.size(),
                                                    nullptr, tokens.data(), tokens.size(), &num),
                                "kdn_knowledge_fetch"));
    prompt->insert(prompt->end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(std::min<std::uint64_t>(num, tokens.size())));
  }
  prompt->insert(prompt->end(), question.begin(), question.end());
  return a;
}

}  // namespace kdn::tools

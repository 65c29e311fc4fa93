// SPDX-License-Identifier: Apache-2.0
#include "refengine/model_loader.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/keys/hash.h"

namespace kdn::refengine {
namespace {

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

}  // namespace kdn::refengine

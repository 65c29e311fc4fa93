// SPDX-License-Identifier: Apache-2.0
#include "codec_cmd.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lab/codec/calibrate.h"
#include "core/codec/codec.h"
#include "lab/codec/tc_calibrate.h"
#include "core/keys/hash.h"
#include "lab/codec/eval.h"
#include "refengine/model_loader.h"

namespace kdn::tools {

int RunCodecEval(const CodecEvalOptions& o) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "kdn codec eval: %s\n", message.c_str());
    return 2;
  };
  Result<codec::Spec> spec = codec::ParseSpec(o.codec);
  if (!spec.ok()) return fail("bad codec spec '" + o.codec + "': " + spec.status().message());
  Result<std::unique_ptr<codec::Codec>> made = codec::MakeCodec(*spec);
  if (!made.ok()) return fail("codec '" + o.codec + "': " + made.status().message());

  std::ifstream in(o.text, std::ios::binary);
  if (!in) return fail("cannot read the text file '" + o.text + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return fail("cannot read the text file '" + o.text + "'");

  auto loaded = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) return fail(loaded.status().message());

  const std::vector<int> tokens = codec::TokenizeStories(*loaded->tokenizer, text);
  codec::EvalOptions eo;
  eo.context = o.context;
  eo.continue_tokens = o.continue_tokens;
  Result<codec::EvalResult> r = codec::Evaluate(*loaded->weights, tokens, **made, eo);
  if (!r.ok()) return fail(r.status().message());

  if (o.json) {
    const nlohmann::ordered_json j = {{"codec", r->codec},
                              {"contexts", r->contexts},
                              {"ratio_vs_fp16", r->ratio_vs_fp16},
                              {"ratio_vs_fp32", r->ratio_vs_fp32},
                              {"kl_mean", r->kl_mean},
                              {"kl_p95", r->kl_p95},
                              {"top1_agreement", r->top1_agreement},
                              {"greedy_agreement", r->greedy_agreement}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("codec %s on %s\n", r->codec.c_str(), o.text.c_str());
  std::printf("  %d contexts of %d tokens (of %zu), %d continued tokens each\n", r->contexts, o.context,
              tokens.size(), o.continue_tokens);
  std::printf("  size      %llu bytes encoded; ratio vs fp16 %.3f (%llu bytes), vs fp32 %.3f (%llu bytes)\n",
              static_cast<unsigned long long>(r->encoded_bytes), r->ratio_vs_fp16,
              static_cast<unsigned long long>(r->fp16_bytes), r->ratio_vs_fp32,
              static_cast<unsigned long long>(r->fp32_bytes));
  std::printf("  KL        mean %.6g nats, p95 %.6g nats (teacher-forced)\n", r->kl_mean, r->kl_p95);
  std::printf("  top-1     %.2f%% agreement (teacher-forced)\n", 100.0 * r->top1_agreement);
  std::printf("  greedy    %.2f%% agreement (free-running)\n", 100.0 * r->greedy_agreement);
  return 0;
}

namespace {

nlohmann::ordered_json FitJson(const codec::EvalResult& r) {
  return {{"ratio_vs_fp16", r.ratio_vs_fp16}, {"kl_mean", r.kl_mean}, {"kl_p95", r.kl_p95},
          {"top1_agreement", r.top1_agreement}};
}

int CalibrateTransform(const CodecCalibrateOptions& o, const refengine::LoadedModel& loaded,
                       const std::vector<int>& tokens) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "kdn codec calibrate --transform: %s\n", message.c_str());
    return 2;
  };
  if (o.out.empty()) return fail("--out FILE is required (the profile is binary)");
  const model::ModelConfig& c = loaded.weights->config();
  codec::TcCalibrateOptions co;
  co.eval.context = o.context;
  co.eval.continue_tokens = o.continue_tokens;
  co.max_contexts = o.max_contexts;
  co.vmul = o.vmul;
  co.balanced_contexts = o.balanced_contexts;
  co.rope.head_dim = c.head_dim();
  co.rope.theta = 10000.0;  // llama2.c's
  co.work_path = o.out + ".partial";
  // The fingerprints a runtime gives this model's KV (the reference engine's
  // identity, or the one given), in every dtype an engine may hold it in.
  const std::string engine_fingerprint = o.fingerprint.empty() ? loaded.fingerprint : o.fingerprint;
  for (std::uint32_t dtype : {0u, 1u, 2u}) {
    keys::ModelIdentity id;
    id.layers = static_cast<std::uint32_t>(c.n_layers);
    id.kv_heads = static_cast<std::uint32_t>(c.n_kv_heads);
    id.head_dim = static_cast<std::uint32_t>(c.head_dim());
    id.dtype = dtype;
    id.rope_theta = 10000.0f;
    id.rope_style = 0;
    id.rotary_dim = id.head_dim;
    id.fingerprint = engine_fingerprint;
    co.fingerprints.push_back(keys::ModelFingerprint(id));
  }
  Result<codec::TcCalibration> cal = codec::CalibrateTransform(*loaded.weights, tokens, co);
  std::remove(co.work_path.c_str());
  if (!cal.ok()) return fail(cal.status().message());
  Result<std::vector<std::uint8_t>> bytes = codec::SerializeTcProfile(&cal->profile);
  if (!bytes.ok()) return fail(bytes.status().message());
  {
    std::ofstream f(o.out, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
    if (!f.flush()) return fail("cannot write the profile '" + o.out + "'");
  }
  nlohmann::ordered_json j = {{"profile", o.out},
                              {"bytes", bytes->size()},
                              {"contexts", cal->contexts},
                              {"evaluations", cal->evaluations},
                              {"cachegen", FitJson(cal->cachegen)}};
  for (size_t p = 0; p < cal->spectra.size(); ++p) j["spectra"].push_back(cal->spectra[p]);
  for (const codec::PresetFit& f : cal->presets) {
    nlohmann::ordered_json fj = FitJson(f.result);
    fj["spec"] = "tc:" + f.name + ",profile=" + o.out;
    fj["step"] = f.step;
    fj["target_kl"] = f.target_kl;
    j["presets"][f.name] = fj;
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("transform profile %s: %zu bytes, %d contexts of %d tokens\n", o.out.c_str(), bytes->size(),
                cal->contexts, o.context);
    std::printf("cachegen: %.3gx at KL %.4g\n", cal->cachegen.ratio_vs_fp16, cal->cachegen.kl_mean);
    for (const codec::PresetFit& f : cal->presets) {
      std::printf("%s: step %.4g, %.3gx at KL %.4g (target %.4g): --codec tc:%s,profile=%s\n", f.name.c_str(),
                  f.step, f.result.ratio_vs_fp16, f.result.kl_mean, f.target_kl, f.name.c_str(), o.out.c_str());
    }
  }
  return 0;
}

}  // namespace

int RunCodecCalibrate(const CodecCalibrateOptions& o) {
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "kdn codec calibrate: %s\n", message.c_str());
    return 2;
  };
  std::ifstream in(o.text, std::ios::binary);
  if (!in) return fail("cannot read the text file '" + o.text + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto loaded = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!loaded.ok()) return fail(loaded.status().message());
  const std::vector<int> tokens = codec::TokenizeStories(*loaded->tokenizer, text);
  if (o.transform) return CalibrateTransform(o, *loaded, tokens);
  codec::CalibrateOptions co;
  co.eval.context = o.context;
  co.eval.continue_tokens = o.continue_tokens;
  co.max_contexts = o.max_contexts;
  Result<codec::Calibration> c = codec::Calibrate(*loaded->weights, tokens, co);
  if (!c.ok()) return fail(c.status().message());
  const std::string profile = codec::ProfileText(*c, co, "model " + o.model + ", text " + o.text);
  if (!o.out.empty()) {
    std::ofstream f(o.out, std::ios::binary | std::ios::trunc);
    f << profile;
    if (!f.flush()) return fail("cannot write the profile '" + o.out + "'");
  }
  if (o.json) {
    nlohmann::ordered_json j = {{"contexts", c->contexts},
                                {"evaluations", c->evaluations},
                                {"baseline_kl", c->baseline_kl},
                                {"plane_kl", c->plane_kl},
                                {"plane_weight", c->plane_weight},
                                {"cachegen", {{"ratio_vs_fp16", c->cachegen.ratio_vs_fp16}, {"kl_mean", c->cachegen.kl_mean}}}};
    for (const codec::PresetFit& f : c->presets) {
      j["presets"][f.name] = {{"spec", codec::PresetSpec(*c, f, co)},
                              {"target_kl", f.target_kl},
                              {"ratio_vs_fp16", f.result.ratio_vs_fp16},
                              {"kl_mean", f.result.kl_mean},
                              {"kl_p95", f.result.kl_p95},
                              {"top1_agreement", f.result.top1_agreement}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s", profile.c_str());
  }
  return 0;
}

CodecCommand::CodecCommand(CLI::App& app) {
  CLI::App* codec = app.add_subcommand("codec", "KV codecs: quality on the reference model");
  codec->require_subcommand(1);
  eval_cmd_ = codec->add_subcommand("eval", "Encode real KV, continue from it, compare with the original");
  eval_cmd_->add_option("--model", eval_.model, "llama2.c checkpoint")->required();
  eval_cmd_->add_option("--tokenizer", eval_.tokenizer, "tokenizer file (tok512.bin format)")->required();
  eval_cmd_->add_option("--codec", eval_.codec, "codec spec: NAME[:key=value,...] or NAME:preset")->required();
  eval_cmd_->add_option("--text", eval_.text, "text file, cut into contexts")->required();
  eval_cmd_->add_option("--context", eval_.context, "tokens per context, BOS included")->capture_default_str();
  eval_cmd_->add_option("--continue", eval_.continue_tokens, "continued tokens compared per context")
      ->capture_default_str();
  eval_cmd_->add_flag("--json", eval_.json, "print one JSON object");

  calibrate_cmd_ = codec->add_subcommand(
      "calibrate", "Measure each layer's sensitivity and fit kdn's presets to a model: prints a codec profile");
  calibrate_cmd_->add_option("--model", calibrate_.model, "llama2.c checkpoint")->required();
  calibrate_cmd_->add_option("--tokenizer", calibrate_.tokenizer, "tokenizer file (tok512.bin format)")->required();
  calibrate_cmd_->add_option("--text", calibrate_.text, "calibration text (hold it out of evaluations)")->required();
  calibrate_cmd_->add_option("--out", calibrate_.out, "write the profile here (use: --codec kdn:balanced,profile=FILE)");
  calibrate_cmd_->add_option("--context", calibrate_.context, "tokens per context, BOS included")->capture_default_str();
  calibrate_cmd_->add_option("--continue", calibrate_.continue_tokens, "continued tokens compared per context")
      ->capture_default_str();
  calibrate_cmd_->add_option("--max-contexts", calibrate_.max_contexts, "use at most this many contexts (0: all)")
      ->capture_default_str();
  calibrate_cmd_->add_flag("--json", calibrate_.json, "print one JSON object");
  calibrate_cmd_->add_flag("--transform", calibrate_.transform,
                           "fit the transform codec (tc): per-layer KLT bases and presets, a binary profile at --out");
  calibrate_cmd_->add_option("--vmul", calibrate_.vmul, "tc: values' step relative to keys'")->capture_default_str();
  calibrate_cmd_->add_option("--balanced-also-at", calibrate_.balanced_contexts,
                             "tc: context lengths at which tc:balanced must also keep its margin under cachegen's KL "
                             "(fitted at each; the smallest step wins)");
  calibrate_cmd_->add_option("--fingerprint", calibrate_.fingerprint,
                             "tc: the model fingerprint the engine gives kdn (default: the reference engine's)");
}

}  // namespace kdn::tools

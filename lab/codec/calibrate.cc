// SPDX-License-Identifier: Apache-2.0
#include "lab/codec/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>

#include "core/codec/codec.h"

namespace kdn::codec {
namespace {

constexpr double kFine = 0.02;             // other planes' multiplier while one is probed
constexpr double kMinWeight = 1.0 / 20, kMaxWeight = 20;
constexpr double kMinStep = 0.01, kMaxStep = 16;
constexpr int kBisections = 7;

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string JoinWeights(const std::vector<double>& w) {
  std::string out;
  for (double v : w) out += (out.empty() ? "" : "_") + Number(v);
  return out;
}

std::string KdnSpec(double step, const std::vector<double>& pw, const CalibrateOptions& o) {
  std::string s = "kdn:alpha=" + Number(o.alpha) + ",sink=" + std::to_string(o.sinks) + ",step=" + Number(step);
  if (!pw.empty()) s += ",pw=" + JoinWeights(pw);
  return s;
}

Result<EvalResult> EvalSpec(const model::Checkpoint& weights, const std::vector<int>& tokens, const std::string& text,
                            const EvalOptions& eo) {
  Result<Spec> spec = ParseSpec(text);
  if (!spec.ok()) return spec.status();
  Result<std::unique_ptr<Codec>> codec = MakeCodec(*spec);
  if (!codec.ok()) return codec.status();
  return Evaluate(weights, tokens, **codec, eo);
}

}  // namespace

Result<PresetFit> FitStep(double target_kl, double probe_step,
                          const std::function<Result<EvalResult>(double)>& eval) {
  PresetFit fit;
  fit.target_kl = target_kl;
  // A first guess from KL ~ step^2, then bisection in log(step) between a
  // step known to meet the target and one known to miss it.
  Result<EvalResult> probe = eval(probe_step);
  if (!probe.ok()) return probe.status();
  double lo = 0, hi = 0;  // lo meets the target, hi misses; 0 = unknown
  auto consider = [&](double step, const EvalResult& r) {
    if (r.kl_mean <= target_kl) {
      if (step > lo) lo = step, fit.result = r;
    } else if (hi == 0 || step < hi) {
      hi = step;
    }
  };
  consider(probe_step, *probe);
  double step = std::clamp(probe_step * std::sqrt(target_kl / std::max(probe->kl_mean, 1e-12)), kMinStep, kMaxStep);
  for (int i = 0; i < kBisections; ++i) {
    Result<EvalResult> r = eval(step);
    if (!r.ok()) return r.status();
    consider(step, *r);
    if (lo > 0 && hi > 0) {
      step = std::sqrt(lo * hi);
    } else if (lo > 0) {
      step = std::min(lo * 1.5, kMaxStep);
    } else {
      step = std::max(hi / 1.5, kMinStep);
    }
    if (lo > 0 && hi > 0 && hi / lo < 1.03) break;
  }
  if (lo == 0) {
    return Status::InvalidArgument("calibration: no step down to " + Number(kMinStep) + " meets KL " +
                                   Number(target_kl));
  }
  fit.step = lo;
  return fit;
}

Result<Calibration> Calibrate(const model::Checkpoint& weights, const std::vector<int>& text_tokens,
                              const CalibrateOptions& o) {
  std::vector<int> tokens = text_tokens;
  const size_t n = static_cast<size_t>(std::max(o.eval.context, 1));
  if (o.max_contexts > 0 && tokens.size() > n * static_cast<size_t>(o.max_contexts)) {
    tokens.resize(n * static_cast<size_t>(o.max_contexts));
  }
  const int layers = weights.config().n_layers;
  const size_t planes = static_cast<size_t>(layers) * 2;
  Calibration c;
  auto eval = [&](const std::string& spec) -> Result<EvalResult> {
    ++c.evaluations;
    return EvalSpec(weights, tokens, spec, o.eval);
  };

  // 1. Sensitivity: the baseline, then each plane alone (two at a time).
  Result<EvalResult> base = eval(KdnSpec(o.probe_step, std::vector<double>(planes, kFine), o));
  if (!base.ok()) return base.status();
  c.contexts = base->contexts;
  c.baseline_kl = base->kl_mean;
  c.plane_kl.assign(planes, 0.0);
  for (size_t p = 0; p < planes; p += 2) {
    std::vector<std::future<Result<EvalResult>>> runs;
    for (size_t q = p; q < std::min(planes, p + 2); ++q) {
      std::vector<double> pw(planes, kFine);
      pw[q] = 1.0;
      const std::string spec = KdnSpec(o.probe_step, pw, o);
      ++c.evaluations;
      runs.push_back(std::async(std::launch::async, [&, spec] { return EvalSpec(weights, tokens, spec, o.eval); }));
    }
    for (size_t i = 0; i < runs.size(); ++i) {
      Result<EvalResult> r = runs[i].get();
      if (!r.ok()) return r.status();
      c.plane_kl[p + i] = std::max(r->kl_mean - c.baseline_kl, 1e-12);
    }
  }
  // 2. Allocation: step_p ~ w_p^(-1/2), geometric mean 1.
  c.plane_weight.resize(planes);
  double log_sum = 0;
  for (size_t p = 0; p < planes; ++p) {
    const double w = c.plane_kl[p] / (o.probe_step * o.probe_step);
    c.plane_weight[p] = 1.0 / std::sqrt(w);
    log_sum += std::log(c.plane_weight[p]);
  }
  const double gm = std::exp(log_sum / static_cast<double>(planes));
  for (double& w : c.plane_weight) w = std::clamp(w / gm, kMinWeight, kMaxWeight);

  // 3. Presets: the largest step at or under each target.
  Result<EvalResult> cg = eval("cachegen");
  if (!cg.ok()) return cg.status();
  c.cachegen = *cg;
  for (const auto& [name, target] : {std::pair<std::string, double>{"balanced", o.balanced_kl > 0 ? o.balanced_kl
                                                                                                  : o.balanced_margin * cg->kl_mean},
                                     std::pair<std::string, double>{"hifi", o.hifi_kl}}) {
    Result<PresetFit> fit = FitStep(target, o.probe_step, [&](double step) { return eval(KdnSpec(step, c.plane_weight, o)); });
    if (!fit.ok()) return Status::InvalidArgument(fit.status().message() + " for preset " + name);
    fit->name = name;
    c.presets.push_back(*fit);
  }
  return c;
}

std::string PresetSpec(const Calibration& c, const PresetFit& fit, const CalibrateOptions& o) {
  return KdnSpec(fit.step, c.plane_weight, o);
}

std::string ProfileText(const Calibration& c, const CalibrateOptions& o, const std::string& about) {
  std::ostringstream out;
  out << "# kdn codec profile (kdn codec calibrate): " << about << "\n";
  out << "# " << c.contexts << " contexts of " << o.eval.context << " tokens, " << o.eval.continue_tokens
      << " continued; cachegen KL " << Number(c.cachegen.kl_mean) << " at " << Number(c.cachegen.ratio_vs_fp16)
      << "x\n";
  for (const PresetFit& f : c.presets) {
    out << "# " << f.name << ": target KL " << Number(f.target_kl) << ", got " << Number(f.result.kl_mean) << " at "
        << Number(f.result.ratio_vs_fp16) << "x vs fp16\n";
  }
  for (const PresetFit& f : c.presets) out << f.name << " " << PresetSpec(c, f, o) << "\n";
  return out.str();
}

}  // namespace kdn::codec

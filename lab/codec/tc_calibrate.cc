// SPDX-License-Identifier: Apache-2.0
#include "lab/codec/tc_calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>

#include "core/codec/codec.h"
#include "core/codec/rans.h"
#include "kernels/common/tc_math.h"
#include "lab/model/transformer.h"

// LAPACK (Fortran calling convention): eigenvalues and eigenvectors of a
// symmetric matrix.
extern "C" void dsyev_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                       double* work, const int* lwork, int* info);

namespace kdn::codec {
namespace {

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// P(q) for codes q in [-R, R] of a density of `kind` and `scale` (in steps).
std::vector<double> Probabilities(int kind, double scale, int R) {
  std::vector<double> p(static_cast<size_t>(2 * R + 1));
  auto cdf = [&](double x) {
    if (kind == 0) return x < 0 ? 0.5 * std::exp(x / scale) : 1.0 - 0.5 * std::exp(-x / scale);
    return 0.5 * std::erfc(-x / (scale * std::sqrt(2.0)));
  };
  for (int q = -R; q <= R; ++q) p[static_cast<size_t>(q + R)] = cdf(q + 0.5) - cdf(q - 0.5);
  return p;
}

TcTable MakeTable(int kind, double scale) {
  const int R = static_cast<int>(std::clamp(std::ceil((kind == 0 ? 12 : 6) * scale) + 1, 1.0, 127.0));
  const std::vector<double> p = Probabilities(kind, scale, R);
  std::vector<std::uint64_t> counts(p.size());
  for (size_t i = 0; i < p.size(); ++i) counts[i] = std::max<std::uint64_t>(1, std::llround(p[i] * 1e12));
  Result<rans::FreqTable> t = rans::BuildTable(counts, kTcScaleBits);
  TcTable out;
  out.kind = static_cast<std::uint8_t>(kind);
  out.scale = static_cast<float>(scale);
  out.range = static_cast<std::uint32_t>(R);
  out.freq = t.ok() ? t->freq : std::vector<std::uint16_t>{};
  return out;
}

// The KLT of one plane from its mean and covariance accumulators.
Status FitPlane(const std::vector<double>& sum, const std::vector<double>& outer, double n, std::uint32_t C,
                TcPlane* plane, std::vector<double>* spectrum) {
  std::vector<double> a(size_t{C} * C);
  for (std::uint32_t i = 0; i < C; ++i) {
    for (std::uint32_t j = 0; j < C; ++j) {
      a[size_t{i} * C + j] = outer[size_t{i} * C + j] / n - (sum[i] / n) * (sum[j] / n);
    }
  }
  std::vector<double> w(C);
  const int dim = static_cast<int>(C);
  int info = 0, lwork = -1;
  double query = 0;
  dsyev_("V", "U", &dim, a.data(), &dim, w.data(), &query, &lwork, &info);
  if (info != 0) return Status::Internal("LAPACK dsyev workspace query failed: " + std::to_string(info));
  lwork = static_cast<int>(query);
  std::vector<double> work(static_cast<size_t>(std::max(lwork, 1)));
  dsyev_("V", "U", &dim, a.data(), &dim, w.data(), work.data(), &lwork, &info);
  if (info != 0) return Status::Internal("LAPACK dsyev failed: " + std::to_string(info));
  // Column-major: eigenvector k is a[k * C .. k * C + C), eigenvalues ascending.
  plane->mean.resize(C);
  plane->var.resize(C);
  plane->basis.resize(size_t{C} * C);
  spectrum->assign(C, 0);
  double total = 0;
  for (std::uint32_t i = 0; i < C; ++i) {
    const std::uint32_t k = C - 1 - i;  // component i: the i-th largest
    const double var = std::max(w[k], 0.0);
    plane->var[i] = static_cast<float>(var);
    (*spectrum)[i] = var;
    total += var;
    for (std::uint32_t c = 0; c < C; ++c) plane->basis[size_t{c} * C + i] = static_cast<float>(a[size_t{k} * C + c]);
  }
  for (std::uint32_t c = 0; c < C; ++c) plane->mean[c] = static_cast<float>(sum[c] / n);
  plane->sigma = std::sqrt(std::max(total / C, 1e-30));
  return Status::Ok();
}

}  // namespace

std::vector<TcTable> TcTableFamily() {
  std::vector<TcTable> out;
  for (int k = 0; k < 32; ++k) out.push_back(MakeTable(0, 0.05 * std::pow(1.25, k)));
  for (int k = 0; k < 30; ++k) out.push_back(MakeTable(1, 0.1 * std::pow(1.25, k)));
  return out;
}

Result<TcCalibration> CalibrateTransform(const model::Checkpoint& weights, const std::vector<int>& text_tokens,
                                         const TcCalibrateOptions& o) {
  const model::ModelConfig& mc = weights.config();
  const int n = o.eval.context;
  if (n < 2 || static_cast<int>(o.sinks) >= n - 1) {
    return Status::InvalidArgument("calibration: the context must hold more tokens than the sinks");
  }
  if (n > mc.seq_len) return Status::InvalidArgument("calibration: the context exceeds the model's");
  std::vector<int> tokens = text_tokens;
  if (o.max_contexts > 0 && tokens.size() > size_t(n) * size_t(o.max_contexts)) {
    tokens.resize(size_t(n) * size_t(o.max_contexts));
  }
  const int contexts = static_cast<int>(tokens.size() / size_t(n));
  if (contexts < 1) return Status::InvalidArgument("calibration: the text is shorter than one context");
  for (int id : tokens) {
    if (id < 0 || id >= mc.vocab_size) return Status::InvalidArgument("calibration: a token outside the vocabulary");
  }
  TcCalibration cal;
  cal.contexts = contexts;
  TcProfile& pr = cal.profile;
  pr.layers = static_cast<std::uint32_t>(mc.n_layers);
  pr.kv_heads = static_cast<std::uint32_t>(mc.n_kv_heads);
  pr.head_dim = static_cast<std::uint32_t>(mc.head_dim());
  pr.rope = o.rope;
  pr.rope.head_dim = static_cast<int>(pr.head_dim);
  if (const char* why = kernels::rope_spec_problem(pr.rope)) return Status::InvalidArgument(std::string("RoPE: ") + why);
  pr.fingerprints = o.fingerprints;
  const std::uint32_t C = pr.channels(), planes = pr.layers * 2;
  const int pairs = kernels::rope_pairs(pr.rope);

  // 1-2. KV of every context, moments per plane.
  std::vector<std::vector<double>> sum(planes, std::vector<double>(C)), outer(planes, std::vector<double>(size_t{C} * C));
  std::vector<double> cs(size_t(n) * pairs * 2);
  for (int j = 0; j < pairs; ++j) {
    const double w = kernels::rope_spec_inv_freq(pr.rope, j);
    for (int t = 0; t < n; ++t) kernels::rope_delta_cos_sin(t, w, cs[(size_t(t) * pairs + j) * 2], cs[(size_t(t) * pairs + j) * 2 + 1]);
  }
  model::Transformer tr(weights);
  model::KvCache cache = tr.NewCache();
  double count = 0;
  std::vector<float> row(C);
  for (int ci = 0; ci < contexts; ++ci) {
    std::vector<int> ctx(tokens.begin() + std::ptrdiff_t(ci) * n, tokens.begin() + std::ptrdiff_t(ci + 1) * n);
    ctx[0] = model::kBos;
    KDN_RETURN_IF_ERROR(tr.Forward(ctx, 0, cache, nullptr));
    const std::vector<float> kv = cache.Export(0, n);
    for (std::uint32_t p = 0; p < planes; ++p) {
      const float* base = kv.data() + size_t{p} * size_t(n) * C;
      for (int t = static_cast<int>(o.sinks); t < n; ++t) {
        std::copy(base + size_t(t) * C, base + size_t(t + 1) * C, row.begin());
        if (p % 2 == 0) kernels::tc_rotate_token(row.data(), static_cast<int>(pr.kv_heads), pr.rope, &cs[size_t(t) * pairs * 2], -1.0);
        std::vector<double>& s = sum[p];
        std::vector<double>& op = outer[p];
        for (std::uint32_t i = 0; i < C; ++i) {
          s[i] += row[i];
          for (std::uint32_t j = 0; j < C; ++j) op[size_t{i} * C + j] += double(row[i]) * row[j];
        }
      }
    }
    count += n - static_cast<int>(o.sinks);
  }
  pr.planes.resize(planes);
  cal.spectra.resize(planes);
  for (std::uint32_t p = 0; p < planes; ++p) {
    KDN_RETURN_IF_ERROR(FitPlane(sum[p], outer[p], count, C, &pr.planes[p], &cal.spectra[p]));
  }
  pr.plane_weight.assign(planes, 1.0);
  // 3. Tables.
  pr.tables = TcTableFamily();
  for (const TcTable& t : pr.tables) {
    if (t.freq.empty()) return Status::Internal("calibration: a table could not be normalized");
  }
  if (!o.fit_presets) {
    Result<std::vector<std::uint8_t>> bytes = SerializeTcProfile(&pr);
    if (!bytes.ok()) return bytes.status();
    return cal;
  }
  // 4. Presets, with the profile (no presets yet) at work_path.
  if (o.work_path.empty()) return Status::InvalidArgument("calibration: fitting presets needs a work path");
  {
    Result<std::vector<std::uint8_t>> bytes = SerializeTcProfile(&pr);
    if (!bytes.ok()) return bytes.status();
    std::ofstream out(o.work_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes->data()), static_cast<std::streamsize>(bytes->size()));
    if (!out) return Status::InvalidArgument("calibration: cannot write '" + o.work_path + "'");
  }
  auto spec_of = [&](double step) {
    return "tc:profile=" + o.work_path + ",sink=" + std::to_string(o.sinks) + ",step=" + Number(step) +
           ",vmul=" + Number(o.vmul);
  };
  // A codec spec evaluated on the text at `at`'s context (o.eval's by default).
  auto eval = [&](const std::string& text, const EvalOptions* at = nullptr) -> Result<EvalResult> {
    ++cal.evaluations;
    Result<Spec> spec = ParseSpec(text);
    if (!spec.ok()) return spec.status();
    Result<std::unique_ptr<Codec>> codec = MakeCodec(*spec);
    if (!codec.ok()) return codec.status();
    return Evaluate(weights, tokens, **codec, at != nullptr ? *at : o.eval);
  };
  Result<EvalResult> cg = eval("cachegen");
  if (!cg.ok()) return cg.status();
  cal.cachegen = *cg;
  const double probe_step = 0.5;
  for (const auto& [name, target] : {std::pair<std::string, double>{"balanced", o.balanced_kl > 0
                                                                                     ? o.balanced_kl
                                                                                     : o.balanced_margin * cg->kl_mean},
                                     std::pair<std::string, double>{"hifi", o.hifi_kl}}) {
    Result<PresetFit> fit = FitStep(target, probe_step, [&](double step) { return eval(spec_of(step)); });
    if (!fit.ok()) return Status::InvalidArgument(fit.status().message() + " for preset " + name);
    if (name == "balanced" && o.balanced_kl <= 0) {
      for (int context : o.balanced_contexts) {
        EvalOptions at = o.eval;
        at.context = context;
        auto eval_at = [&](const std::string& text) { return eval(text, &at); };
        Result<EvalResult> cg_at = eval_at("cachegen");
        if (!cg_at.ok()) return cg_at.status();
        Result<PresetFit> there = FitStep(o.balanced_margin * cg_at->kl_mean, probe_step,
                                          [&](double step) { return eval_at(spec_of(step)); });
        if (!there.ok()) return Status::InvalidArgument(there.status().message() + " for preset balanced at " +
                                                        std::to_string(context) + " tokens");
        if (there->step < fit->step) fit = there;
      }
    }
    fit->name = name;
    const double lo = fit->step;
    cal.presets.push_back(*fit);
    pr.presets.emplace_back(name, "sink=" + std::to_string(o.sinks) + ",step=" + Number(lo) + ",vmul=" + Number(o.vmul));
  }
  Result<std::vector<std::uint8_t>> bytes = SerializeTcProfile(&pr);
  if (!bytes.ok()) return bytes.status();
  return cal;
}

}  // namespace kdn::codec

// SPDX-License-Identifier: Apache-2.0
#include "bench/codec_bench.h"

#include <lz4.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "bench/bench_util.h"
#include "bench/plot.h"
#include "core/codec/codec.h"
#include "lab/codec/eval.h"
#include "kernels/common/half.h"
#include "lab/model/transformer.h"
#include "refengine/model_loader.h"
#include "core/util/thread_pool.h"

#ifndef KDN_BENCH_TEXTS_DIR
#define KDN_BENCH_TEXTS_DIR "bench/texts"
#endif


namespace kdn::bench {
namespace {

using codec::Bytes;

// ---------------------------------------------------------------- settings

// The codecs at their default settings: record name (a safe identifier) and
// spec. The transform codec's presets come from the model's profile (its
// path with the extension .kdntc: models/stories260K.kdntc for the reference
// model, fitted on the tuning text by `kdn codec calibrate --transform`).
struct Named {
  std::string name;
  std::string spec;
};
std::vector<Named> Defaults(const std::string& model_path) {
  std::vector<Named> out = {{"raw", "raw"},           {"fp8", "fp8"},           {"int8", "int8"},
                            {"kivi2", "kivi2"},       {"cachegen", "cachegen"}, {"kdn", "kdn:balanced"},
                            {"kdn_hifi", "kdn:hifi"}, {"zstd", "zstd"}};
  std::filesystem::path profile =
      model_path.empty() ? std::filesystem::path(refengine::DefaultModelsDir()) / "stories260K.bin"
                         : std::filesystem::path(model_path);
  profile.replace_extension(".kdntc");
  out.push_back({"tc", "tc:balanced,profile=" + profile.string()});
  out.push_back({"tc_hifi", "tc:hifi,profile=" + profile.string()});
  return out;
}

// One codec's settings sweep: one line of the plot, in the order drawn.
struct Sweep {
  std::string series;  // the codec's name
  std::string title;   // the plot's legend
  std::string color;   // the plot's line colour (gnuplot rgb)
  std::vector<std::string> specs;
};

std::vector<Sweep> Sweeps() {
  std::vector<Sweep> s = {
      {"fp8", "fp8 (scale per token, per head)", "#1f77b4", {"fp8:scale=token", "fp8:scale=head"}},
      {"int8", "int8 (scale per token)", "#17becf", {"int8"}},
      {"kivi2", "kivi2 (2 bits, group 16, 32, 64)", "#e69f00", {"kivi2:group=16", "kivi2:group=32", "kivi2:group=64"}},
      {"cachegen",
       "cachegen (bins 8..64)",
       "#d62728",
       {"cachegen:bins=8", "cachegen:bins=12", "cachegen:bins=16", "cachegen:bins=24", "cachegen:bins=32",
        "cachegen:bins=48", "cachegen:bins=64"}},
  };
  // kdn's quality knob: the relative quantization step, geometric over [0.05, 1].
  Sweep kdn{"kdn", "kdn (step 0.05..1)", "#2ca02c", {}};
  for (int i = 0; i < 8; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "kdn:step=%.3g", 0.05 * std::pow(20.0, i / 7.0));
    kdn.specs.push_back(buf);
  }
  s.push_back(std::move(kdn));
  return s;
}

// "kdn:step=0.0767" -> "kdn_step_0_0767": lower-case letters, digits and
// single underscores, none at either end.
std::string SafeName(std::string_view text) {
  std::string out;
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u)) {
      out += static_cast<char>(std::tolower(u));
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// The texts (bench/texts/README.md): the presets' parameters were chosen on
// the tuning text; every figure is reported on the held-out one.
constexpr const char* kHeldOutText = "heldout.txt";
constexpr const char* kTuningText = "stories.txt";

// bench/texts/NAME as built (an absolute path), else relative to the
// working directory.
std::string TextPath(const std::string& name) {
  const std::string built = std::string(KDN_BENCH_TEXTS_DIR) + "/" + name;
  std::error_code ec;
  if (std::filesystem::exists(built, ec)) return built;
  return "bench/texts/" + name;
}

// Whether `path` names the same file as bench/texts/`name`.
bool IsText(const std::string& path, const std::string& name) {
  std::error_code ec;
  return std::filesystem::equivalent(path, TextPath(name), ec);
}

// ---------------------------------------------------------------- real KV

// The canonical KV ([layer][k|v][token][kv_head][head_dim], fp32) of
// `tokens` prefilled from position 0, positions [begin, end) of it per chunk
// boundary in `cuts` (consecutive pairs).
Status PrefillChunks(model::Transformer& t, model::KvCache& cache, const std::vector<int>& tokens,
                     const std::vector<std::pair<int, int>>& cuts, std::vector<std::vector<float>>* out) {
  KDN_RETURN_IF_ERROR(t.Forward(tokens, 0, cache, nullptr));
  for (const auto& [begin, end] : cuts) out->push_back(cache.Export(begin, end));
  return Status::Ok();
}

Bytes AsF32Bytes(const std::vector<float>& kv) {
  Bytes b(kv.size() * sizeof(float));
  std::memcpy(b.data(), kv.data(), b.size());
  return b;
}

// fp16, round to nearest even: the KV as an engine holding fp16 has it.
Bytes AsF16Bytes(const std::vector<float>& kv) {
  Bytes b(kv.size() * 2);
  for (size_t i = 0; i < kv.size(); ++i) {
    const std::uint16_t h = kernels::float_to_half(kv[i]);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
  return b;
}

// Windows of `n` tokens of the stream with the first replaced by BOS, as
// codec::Evaluate cuts its contexts.
std::vector<int> Window(const std::vector<int>& stream, size_t index, size_t n) {
  std::vector<int> w(stream.begin() + static_cast<std::ptrdiff_t>(index * n),
                     stream.begin() + static_cast<std::ptrdiff_t>((index + 1) * n));
  w[0] = model::kBos;
  return w;
}

// ---------------------------------------------------------------- coders

// An encoded chunk: buf[0, size) (buf may be larger: compressors write into
// a buffer of their bound, kept across runs so no run pays for zeroing it).
struct Encoded {
  Bytes buf;
  size_t size = 0;
};

// A coder under measurement: encode a chunk's bytes, decode them into a
// buffer of the chunk's size. Both return false with a message on failure.
struct Coder {
  std::string name;  // record name
  bool lossless = false;
  std::function<bool(const Bytes& in, Encoded* out, std::string* error)> encode;
  std::function<bool(const Encoded& in, Bytes* out, std::string* error)> decode;
};

// `codec` (borrowed; must outlive the coder) on chunks of `shape`.
Coder CodecCoder(const std::string& name, const codec::Codec& codec, const codec::Shape& shape) {
  Coder c;
  c.name = name;
  c.lossless = !codec::IsLossy(codec.id());  // raw and zstd: checked bit for bit
  c.encode = [&codec, shape](const Bytes& in, Encoded* out, std::string* error) {
    Result<Bytes> r = codec.Encode(shape, in.data());
    if (!r.ok()) {
      *error = r.status().message();
      return false;
    }
    out->buf = std::move(*r);
    out->size = out->buf.size();
    return true;
  };
  c.decode = [&codec, shape](const Encoded& in, Bytes* out, std::string* error) {
    const Status s = codec.Decode(shape, in.buf.data(), in.size, out->data());
    if (!s.ok()) *error = s.message();
    return s.ok();
  };
  return c;
}

Coder ZstdCoder(const std::string& name, int level) {
  struct Ctx {
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_DCtx* d = ZSTD_createDCtx();
    ~Ctx() {
      ZSTD_freeCCtx(c);
      ZSTD_freeDCtx(d);
    }
  };
  auto ctx = std::make_shared<Ctx>();
  Coder c;
  c.name = name;
  c.lossless = true;
  c.encode = [ctx, level](const Bytes& in, Encoded* out, std::string* error) {
    const size_t bound = ZSTD_compressBound(in.size());
    if (out->buf.size() < bound) out->buf.resize(bound);
    const size_t n = ZSTD_compressCCtx(ctx->c, out->buf.data(), out->buf.size(), in.data(), in.size(), level);
    if (ZSTD_isError(n)) {
      *error = ZSTD_getErrorName(n);
      return false;
    }
    out->size = n;
    return true;
  };
  c.decode = [ctx](const Encoded& in, Bytes* out, std::string* error) {
    const size_t n = ZSTD_decompressDCtx(ctx->d, out->data(), out->size(), in.buf.data(), in.size);
    if (ZSTD_isError(n) || n != out->size()) {
      *error = ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short output";
      return false;
    }
    return true;
  };
  return c;
}

Coder Lz4Coder(const std::string& name) {
  Coder c;
  c.name = name;
  c.lossless = true;
  c.encode = [](const Bytes& in, Encoded* out, std::string* error) {
    const int bound = LZ4_compressBound(static_cast<int>(in.size()));
    if (out->buf.size() < static_cast<size_t>(bound)) out->buf.resize(static_cast<size_t>(bound));
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(in.data()),
                                       reinterpret_cast<char*>(out->buf.data()), static_cast<int>(in.size()), bound);
    if (n <= 0) {
      *error = "LZ4_compress_default failed";
      return false;
    }
    out->size = static_cast<size_t>(n);
    return true;
  };
  c.decode = [](const Encoded& in, Bytes* out, std::string* error) {
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(in.buf.data()),
                                      reinterpret_cast<char*>(out->data()),
                                      static_cast<int>(in.size), static_cast<int>(out->size()));
    if (n < 0 || static_cast<size_t>(n) != out->size()) {
      *error = "LZ4_decompress_safe failed";
      return false;
    }
    return true;
  };
  return c;
}

// Sum of the chunks' sizes over the sum of their encodings.
Result<double> SizeRatio(const Coder& coder, const std::vector<Bytes>& chunks) {
  std::uint64_t raw = 0, encoded = 0;
  Encoded e;
  std::string error;
  for (const Bytes& chunk : chunks) {
    if (!coder.encode(chunk, &e, &error)) return Status::Internal(coder.name + ": " + error);
    raw += chunk.size();
    encoded += e.size;
  }
  return encoded ? static_cast<double>(raw) / static_cast<double>(encoded) : 0.0;
}

// The calling thread's CPU time (user + system) in milliseconds.
double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

struct Speed {
  double encode_gbps = 0, decode_gbps = 0;            // over the thread's CPU time
  double encode_wall_gbps = 0, decode_wall_gbps = 0;  // over wall-clock time
  double ratio = 0;  // the chunks' bytes over their encodings' bytes
  int encode_runs = 0, decode_runs = 0;
};

// Times encoding, then decoding, of every chunk, one run at a time, on the
// calling thread: a warm-up run (which also checks the round trip: exact for
// lossless coders, a successful decode for the others), then at least
// `min_runs` timed runs and more until `min_ms` have passed (at most 1000).
// GB/s of uncompressed bytes over the median run, per core: the run's CPU
// time on this thread, so that other processes sharing the machine do not
// count (on an idle machine it equals the wall-clock time, also reported).
Result<Speed> Measure(const Coder& coder, const std::vector<Bytes>& chunks, int min_runs, double min_ms) {
  std::vector<Encoded> enc(chunks.size());
  std::vector<Bytes> dec(chunks.size());
  std::uint64_t raw = 0, encoded = 0;
  std::string error;
  for (size_t i = 0; i < chunks.size(); ++i) {
    dec[i].assign(chunks[i].size(), 0);
    if (!coder.encode(chunks[i], &enc[i], &error) || !coder.decode(enc[i], &dec[i], &error)) {
      return Status::Internal(coder.name + ": " + error);
    }
    if (coder.lossless && dec[i] != chunks[i]) return Status::Internal(coder.name + ": the round trip is not exact");
    raw += chunks[i].size();
    encoded += enc[i].size;
  }
  const double gb = static_cast<double>(raw) / 1e9;
  auto timed = [&](auto&& run, double* cpu_gbps, double* wall_gbps, int* runs) {
    std::vector<double> cpu, wall;
    const double start = NowMs();
    while (static_cast<int>(cpu.size()) < min_runs || (NowMs() - start < min_ms && cpu.size() < 1000)) {
      const double w0 = NowMs(), c0 = ThreadCpuMs();
      run();
      cpu.push_back(ThreadCpuMs() - c0);
      wall.push_back(NowMs() - w0);
    }
    *runs = static_cast<int>(cpu.size());
    *cpu_gbps = gb / (std::max(Median(cpu), 1e-6) / 1e3);
    *wall_gbps = gb / (std::max(Median(wall), 1e-6) / 1e3);
  };
  bool ok = true;
  Speed s;
  timed(
      [&] {
        for (size_t i = 0; i < chunks.size(); ++i) ok &= coder.encode(chunks[i], &enc[i], &error);
      },
      &s.encode_gbps, &s.encode_wall_gbps, &s.encode_runs);
  timed(
      [&] {
        for (size_t i = 0; i < chunks.size(); ++i) ok &= coder.decode(enc[i], &dec[i], &error);
      },
      &s.decode_gbps, &s.decode_wall_gbps, &s.decode_runs);
  if (!ok) return Status::Internal(coder.name + ": " + error);
  s.ratio = encoded ? static_cast<double>(raw) / static_cast<double>(encoded) : 0.0;
  return s;
}

// Decoding all the chunks on one thread, then the same chunks split over
// two (each thread decodes its contiguous half into its chunks' own output
// buffers), the two alternated run by run so that both see the same machine.
// Wall-clock GB/s of uncompressed bytes over the median run of each; the
// process's CPU time over the wall-clock time of the two-thread runs says
// whether both threads had a core (2 when they did).
struct Scaling {
  double one_gbps = 0, two_gbps = 0;
  double two_cpu_per_wall = 0;
  int runs = 0;
};

double ProcessCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

Result<Scaling> MeasureTwoThreads(const Coder& coder, const std::vector<Bytes>& chunks, int min_runs, double min_ms) {
  std::vector<Encoded> enc(chunks.size());
  std::vector<Bytes> dec(chunks.size());
  std::uint64_t raw = 0;
  std::string error;
  for (size_t i = 0; i < chunks.size(); ++i) {
    dec[i].assign(chunks[i].size(), 0);
    if (!coder.encode(chunks[i], &enc[i], &error)) return Status::Internal(coder.name + ": " + error);
    raw += chunks[i].size();
  }
  const double gb = static_cast<double>(raw) / 1e9;
  std::atomic<bool> ok{true};
  std::mutex error_mu;
  auto decode = [&](size_t begin, size_t end) {
    std::string e;
    for (size_t i = begin; i < end; ++i) {
      if (!coder.decode(enc[i], &dec[i], &e)) {
        ok = false;
        std::lock_guard<std::mutex> lock(error_mu);
        error = e;
      }
    }
  };
  ThreadPool pool(2);
  decode(0, chunks.size());  // warm-up: the buffers touched, the pool's worker started
  pool.ParallelFor(chunks.size(), 1, decode);
  std::vector<double> one, two, two_cpu;
  const double start = NowMs();
  while (static_cast<int>(one.size()) < min_runs || (NowMs() - start < min_ms && one.size() < 1000)) {
    double t0 = NowMs();
    decode(0, chunks.size());
    one.push_back(NowMs() - t0);
    const double c0 = ProcessCpuMs();
    t0 = NowMs();
    pool.ParallelFor(chunks.size(), 1, decode);
    two.push_back(NowMs() - t0);
    two_cpu.push_back(ProcessCpuMs() - c0);
  }
  if (!ok) return Status::Internal(coder.name + ": " + error);
  Scaling s;
  s.runs = static_cast<int>(one.size());
  s.one_gbps = gb / (std::max(Median(one), 1e-6) / 1e3);
  s.two_gbps = gb / (std::max(Median(two), 1e-6) / 1e3);
  s.two_cpu_per_wall = Median(two_cpu) / std::max(Median(two), 1e-6);
  return s;
}

// ---------------------------------------------------------------- quality

// One codec setting's quality and size on the quality contexts, both from
// one encoding of their KV held as f16 (codec::Evaluate): at the headline
// context (one chunk of the store's 256 tokens per context) and, for the
// defaults, at the long one (one chunk of 448 tokens).
struct Point {
  std::string spec;  // as written in the sweep or the defaults
  std::unique_ptr<codec::Codec> codec;
  int same_as = -1;  // index of an earlier point with the same normalized spec
  bool ok = false;
  std::string error;
  codec::EvalResult eval;
  double ratio = 0;  // f16 bytes over encoded bytes (eval.ratio_vs_fp16)
  double seconds = 0;
  bool wants_long = false;  // a default: measured at the long context too
  bool ok_long = false;
  codec::EvalResult eval_long;
};

// ---------------------------------------------------------------- the plot

// The label of a point: the value of its last parameter ("cachegen:bins=8"
// -> "8"), the whole spec for a preset, nothing for a bare name.
std::string PointLabel(const std::string& spec) {
  const size_t eq = spec.rfind('=');
  if (eq != std::string::npos) return spec.substr(eq + 1);
  return spec.find(':') != std::string::npos ? spec : "";
}

struct Series {
  std::string title;
  std::string color;  // gnuplot rgb
  bool line = true;   // false: points only, labelled below
  std::vector<const Point*> points;
};

// Writes the PNG of ratio (y) against KL mean (x, log scale): one line per
// series; points with KL 0 (lossless) cannot sit on a log axis and are left
// out, zstd -1's ratio is drawn as a horizontal line instead.
void Plot(const std::string& png, const std::string& subtitle, const std::vector<Series>& series,
          double zstd_ratio) {
  std::string data, plot;
  int drawn = 0;
  for (size_t i = 0; i < series.size(); ++i) {
    std::string block;
    for (const Point* p : series[i].points) {
      if (!p->ok || !(p->eval.kl_mean > 0)) continue;
      char row[160];
      std::snprintf(row, sizeof row, "%.6g %.6g \"%s\"\n", p->eval.kl_mean, p->ratio, PointLabel(p->spec).c_str());
      block += row;
    }
    if (block.empty()) continue;
    const std::string name = "$s" + std::to_string(i);
    data += name + " << EOD\n" + block + "EOD\n";
    plot += std::string(plot.empty() ? "plot " : ", \\\n     ") + name + " using 1:2 with " +
            (series[i].line ? "linespoints lw 2 pt 7 ps 1.2" : "points pt 9 ps 2.2") + " lc rgb '" +
            series[i].color + "' title " + GnuplotQuote(series[i].title) + ", \\\n     " + name +
            " using 1:2:3 with labels offset char " + (series[i].line ? "0.6,0.7 center" : "1.4,-0.4 left") +
            " font ',8' notitle";
    ++drawn;
  }
  if (drawn == 0) {
    std::fprintf(stderr, "kdn bench codec: warning: no lossy codec was measured; no PNG\n");
    return;
  }
  char zstd_line[160];
  std::snprintf(zstd_line, sizeof zstd_line,
                ", \\\n     %.6g with lines dt 2 lc rgb 'black' title 'zstd -1 (lossless)'", zstd_ratio);
  if (zstd_ratio > 0) plot += zstd_line;

  std::string body = data;
  body += "set title " + GnuplotQuote("KV codecs: size against quality\n" + subtitle) + "\n";
  body +=
      "set logscale x\n"
      "set xlabel 'KL(original || decoded), mean over continued positions (nats, log scale)'\n"
      "set ylabel 'size ratio vs fp16 (x)'\n"
      "set yrange [0:*]\n"
      "set grid\n"
      "set key outside right top\n"
      "set arrow from 2e-3, graph 0 to 2e-3, graph 1 nohead dt 3 lc rgb 'gray40'\n"
      "set label 'KL 2e-3' at 2e-3, graph 0.97 offset char 0.5,0 font ',8'\n";
  body += plot + "\n";
  DrawPng(png, body, "kdn bench codec");
}

}  // namespace

int RunCodecBench(const CodecBenchOptions& o) {
  const double t_start = NowMs();
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "kdn bench codec: %s\n", message.c_str());
    return 2;
  };
  // The headline context is one chunk of the store's size; the long one is
  // the largest that leaves the continuation room in stories260K's 512.
  const int n_ctx = o.context > 0 ? o.context : (o.quick ? 128 : 256);
  constexpr int kLongContext = 448;
  const int k_cont = o.continue_tokens > 0 ? o.continue_tokens : (o.quick ? 16 : 64);
  const int max_contexts = o.contexts > 0 ? o.contexts : (o.quick ? 3 : 0);
  const int min_runs = o.repeats > 0 ? o.repeats : (o.quick ? 3 : 15);
  const double min_ms = o.quick ? 0.0 : 250.0;
  const size_t speed_windows = o.quick ? 1 : 8;
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(threads, 1);

  // The model (real KV only: a random stand-in would make the quality
  // measures meaningless) and the text.
  auto m = refengine::LoadModel(o.model, o.tokenizer, /*allow_random=*/false);
  if (!m.ok()) return fail(m.status().message());
  const model::ModelConfig& cfg = m->weights->config();
  const std::string text_path = o.text.empty() ? TextPath(kHeldOutText) : o.text;
  // The text as records name it: bench/texts/NAME for ours, else as given.
  const std::string ours = o.text.empty() || IsText(o.text, kHeldOutText) ? kHeldOutText
                           : IsText(o.text, kTuningText)                  ? kTuningText
                                                                          : "";
  const std::string text_name = ours.empty() ? o.text : "bench/texts/" + ours;
  const std::string tuning_name = std::string("bench/texts/") + kTuningText;
  const bool held_out = !IsText(text_path, kTuningText);
  std::ifstream in(text_path, std::ios::binary);
  if (!in) return fail("cannot read the text file '" + text_path + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<int> stream = codec::TokenizeStories(*m->tokenizer, text);
  if (!held_out) {
    std::fprintf(stderr,
                 "kdn bench codec: warning: %s is the tuning text (kdn's presets were chosen on it): its "
                 "figures are not held out (records say \"held_out\": false)\n",
                 text_path.c_str());
  }
  if (n_ctx < 2 || static_cast<std::int64_t>(n_ctx) + k_cont > cfg.seq_len) {
    return fail("--context " + std::to_string(n_ctx) + " and --continue " + std::to_string(k_cont) +
                " must leave room in the model's context of " + std::to_string(cfg.seq_len) + " tokens");
  }
  // The contexts of `n` tokens measured: all the text has, or max_contexts.
  auto contexts_of = [&](int n) {
    size_t c = stream.size() / static_cast<size_t>(n);
    if (max_contexts > 0) c = std::min(c, static_cast<size_t>(max_contexts));
    return c;
  };
  const size_t contexts = contexts_of(n_ctx);
  if (contexts == 0) {
    return fail("the text has " + std::to_string(stream.size()) + " tokens, fewer than one context of " +
                std::to_string(n_ctx));
  }
  const bool want_long = n_ctx != kLongContext && static_cast<std::int64_t>(kLongContext) + k_cont <= cfg.seq_len &&
                         contexts_of(kLongContext) > 0;
  if (!want_long && n_ctx != kLongContext) {
    std::fprintf(stderr, "kdn bench codec: warning: no %d-token figures (the model or the text is too short)\n",
                 kLongContext);
  }
  const size_t long_contexts = want_long ? contexts_of(kLongContext) : 0;
  auto first_tokens = [&](size_t n) {
    return std::vector<int>(stream.begin(), stream.begin() + static_cast<std::ptrdiff_t>(n));
  };
  const std::vector<int> quality_tokens = first_tokens(contexts * static_cast<size_t>(n_ctx));
  const std::vector<int> long_tokens = first_tokens(long_contexts * kLongContext);

  const auto u32 = [](int v) { return static_cast<std::uint32_t>(v); };
  // Speed chunks: chunk_tokens as an engine stores them, cut from windows of
  // the model's whole context.
  const int chunk_tokens = std::min(256, cfg.seq_len);
  const size_t window = static_cast<size_t>(cfg.seq_len / chunk_tokens * chunk_tokens);
  const size_t windows = std::min(speed_windows, stream.size() / window);
  if (windows == 0) return fail("the text is shorter than one window of " + std::to_string(window) + " tokens");
  const codec::Shape s16{u32(cfg.n_layers), u32(cfg.n_kv_heads), u32(cfg.head_dim()), u32(chunk_tokens), 1};
  codec::Shape s32 = s16;
  s32.dtype = 0;

  // q16 / q16_long: the quality contexts' KV as f16, one chunk per context,
  // as codec::Evaluate holds and encodes it (the lossless baselines' ratios
  // are taken on these bytes).
  std::vector<Bytes> q16, q16_long, c16, c32;
  {
    model::Transformer t(*m->weights);
    model::KvCache cache = t.NewCache();
    std::vector<std::vector<float>> kv;
    for (const auto& [n, count, out] :
         {std::tuple{n_ctx, contexts, &q16}, std::tuple{kLongContext, long_contexts, &q16_long}}) {
      for (size_t i = 0; i < count; ++i) {
        if (Status s = PrefillChunks(t, cache, Window(stream, i, static_cast<size_t>(n)), {{0, n}}, &kv); !s.ok()) {
          return fail(s.message());
        }
      }
      for (const auto& k : kv) out->push_back(AsF16Bytes(k));
      kv.clear();
    }
    std::vector<std::pair<int, int>> cuts;
    for (int b = 0; b + chunk_tokens <= static_cast<int>(window); b += chunk_tokens) {
      cuts.emplace_back(b, b + chunk_tokens);
    }
    for (size_t w = 0; w < windows; ++w) {
      if (Status s = PrefillChunks(t, cache, Window(stream, w, window), cuts, &kv); !s.ok()) return fail(s.message());
    }
    for (const auto& k : kv) {
      c16.push_back(AsF16Bytes(k));
      c32.push_back(AsF32Bytes(k));
    }
  }
  std::printf("kdn bench codec: %s; text %s (%zu tokens%s)\n", m->description.c_str(), text_path.c_str(),
              stream.size(), held_out ? ", held out" : ", the TUNING text");
  std::printf("  quality (f16 KV): %zu contexts of %d tokens and %zu of %d, %d continued; speed: %zu chunks of %d "
              "tokens; %d threads\n",
              contexts, n_ctx, long_contexts, kLongContext, k_cont, c16.size(), chunk_tokens, threads);

  // ---- quality and size of every setting (defaults first, then the sweeps)
  const std::vector<Sweep> sweeps = Sweeps();
  std::vector<Point> points;
  std::map<std::string, int> index;       // spec as written -> point
  std::map<std::string, int> normalized;  // codec's own spec -> first point
  auto add_point = [&](const std::string& spec) {
    if (index.count(spec)) return;
    const int at = static_cast<int>(points.size());
    index[spec] = at;
    Point p;
    p.spec = spec;
    Result<codec::Spec> parsed = codec::ParseSpec(spec);
    Result<std::unique_ptr<codec::Codec>> made =
        parsed.ok() ? codec::MakeCodec(*parsed) : Result<std::unique_ptr<codec::Codec>>(parsed.status());
    if (!made.ok()) {
      p.error = made.status().message();
      std::fprintf(stderr, "kdn bench codec: warning: skipping %s: %s\n", spec.c_str(), p.error.c_str());
    } else {
      p.codec = std::move(*made);
      const auto [it, fresh] = normalized.emplace(p.codec->spec().ToString(), at);
      if (!fresh) p.same_as = it->second;
    }
    points.push_back(std::move(p));
  };
  const std::vector<Named> defaults = Defaults(o.model);
  for (const Named& d : defaults) add_point(d.spec);
  for (const Sweep& s : sweeps) {
    for (const std::string& spec : s.specs) add_point(spec);
  }
  for (const Named& d : defaults) {
    Point& p = points[static_cast<size_t>(index.at(d.spec))];
    Point& first = p.same_as >= 0 ? points[static_cast<size_t>(p.same_as)] : p;
    first.wants_long = want_long;
  }

  codec::EvalOptions eo;  // dtype f16: the ratio and the KL from one encoding
  eo.context = n_ctx;
  eo.continue_tokens = k_cont;
  codec::EvalOptions eo_long = eo;
  eo_long.context = kLongContext;
  {
    // Evaluations are independent: `threads` workers take the next one
    // (the long ones after the headline ones).
    std::vector<std::pair<size_t, bool>> jobs;  // (point, long)
    for (bool long_ctx : {false, true}) {
      for (size_t i = 0; i < points.size(); ++i) {
        const Point& p = points[i];
        if (p.codec && p.same_as < 0 && (!long_ctx || p.wants_long)) jobs.emplace_back(i, long_ctx);
      }
    }
    std::atomic<size_t> next{0};
    std::mutex print;
    ThreadPool pool(threads);
    pool.ParallelFor(static_cast<size_t>(threads), 1, [&](size_t, size_t) {
      for (size_t j = next++; j < jobs.size(); j = next++) {
        Point& p = points[jobs[j].first];
        const bool long_ctx = jobs[j].second;
        const double t0 = NowMs();
        Result<codec::EvalResult> r =
            codec::Evaluate(*m->weights, long_ctx ? long_tokens : quality_tokens, *p.codec, long_ctx ? eo_long : eo);
        const double seconds = (NowMs() - t0) / 1e3;
        std::lock_guard<std::mutex> lock(print);
        if (!r.ok()) {
          if (long_ctx) {
            std::fprintf(stderr, "kdn bench codec: warning: no %d-token figures for %s: %s\n", kLongContext,
                         p.spec.c_str(), r.status().message().c_str());
            continue;
          }
          p.error = r.status().message();
          std::fprintf(stderr, "kdn bench codec: warning: skipping %s: %s\n", p.spec.c_str(), p.error.c_str());
          continue;
        }
        if (long_ctx) {
          p.eval_long = *r;
          p.ok_long = true;
        } else {
          p.eval = *r;
          p.ratio = r->ratio_vs_fp16;
          p.seconds = seconds;
          p.ok = true;
        }
        std::printf("  eval %-22s %3d tokens: ratio %7.3f  KL mean %-10.4g p95 %-10.4g top-1 %.4f  (%.1f s)\n",
                    p.spec.c_str(), long_ctx ? kLongContext : n_ctx, r->ratio_vs_fp16, r->kl_mean, r->kl_p95,
                    r->top1_agreement, seconds);
        std::fflush(stdout);
      }
    });
  }
  for (Point& p : points) {  // copies share their first point's results
    if (p.same_as < 0) continue;
    const Point& first = points[static_cast<size_t>(p.same_as)];
    p.ok = first.ok;
    p.error = first.error;
    p.eval = first.eval;
    p.ratio = first.ratio;
    p.ok_long = first.ok_long;
    p.eval_long = first.eval_long;
  }
  auto point = [&](const std::string& spec) -> const Point& { return points[static_cast<size_t>(index.at(spec))]; };

  // ---- speed: single-threaded, nothing else running
  std::vector<Coder> baselines16 = {ZstdCoder("zstd1", 1), ZstdCoder("zstd3", 3), Lz4Coder("lz4")};
  std::vector<Coder> baselines32 = {ZstdCoder("zstd1", 1), ZstdCoder("zstd3", 3), Lz4Coder("lz4")};
  const char* kBaselineTitles[] = {"zstd -1", "zstd -3", "lz4 (default)"};
  Records records;
  // Baselines: ratio on the quality contexts' f16 bytes, speed on the chunks.
  std::vector<double> base_ratio(3, 0.0), base_ratio_long(3, 0.0);
  std::vector<Speed> base16(3), base32(3);
  for (size_t b = 0; b < baselines16.size(); ++b) {
    Result<double> r = SizeRatio(baselines16[b], q16);
    Result<double> rl = want_long ? SizeRatio(baselines16[b], q16_long) : Result<double>(0.0);
    Result<Speed> s16r = Measure(baselines16[b], c16, min_runs, min_ms);
    Result<Speed> s32r = Measure(baselines32[b], c32, min_runs, min_ms);
    if (!r.ok() || !rl.ok() || !s16r.ok() || !s32r.ok()) {
      return fail((!r.ok() ? r.status() : !rl.ok() ? rl.status() : !s16r.ok() ? s16r.status() : s32r.status())
                      .message());
    }
    base_ratio[b] = *r;
    base_ratio_long[b] = *rl;
    base16[b] = *s16r;
    base32[b] = *s32r;
  }
  const std::string model_name =
      o.model.empty() ? std::string("stories260K") : std::filesystem::path(o.model).stem().string();
  // Every record says which text its figure came from; quality records also
  // the KV they were measured on (f16, one chunk of context_tokens per
  // context: size and KL from the same encoding).
  const nlohmann::json text_params = {{"text", text_name}, {"held_out", held_out}};
  auto quality_params = [&](bool long_ctx) {
    nlohmann::json q = text_params;
    q.update({{"contexts", long_ctx ? long_contexts : contexts},
              {"context_tokens", long_ctx ? kLongContext : n_ctx},
              {"chunk_tokens", long_ctx ? kLongContext : n_ctx},
              {"dtype", "f16"},
              {"continue_tokens", k_cont},
              {"model", model_name}});
    return q;
  };
  const std::string long_suffix = "_" + std::to_string(kLongContext);
  const std::uint64_t bytes16 = c16.size() * s16.bytes(), bytes32 = c32.size() * s32.bytes();
  // The four speed records of `n` (decode and encode, f16 and f32), against
  // zstd -1's on the same bytes (none for zstd -1 itself).
  auto add_speeds = [&](const std::string& n, const std::string& spec, const Speed& f16, const Speed& f32) {
    struct Row {
      const char* measure;
      bool half, encode;
    };
    for (const Row& r : {Row{"codec_decode_gbps_", true, false}, Row{"codec_encode_gbps_", true, true},
                         Row{"codec_decode_f32_gbps_", false, false}, Row{"codec_encode_f32_gbps_", false, true}}) {
      const Speed& s = r.half ? f16 : f32;
      const Speed& base = r.half ? base16[0] : base32[0];
      nlohmann::json params = text_params;
      params.update({{"spec", spec},
                     {"dtype", r.half ? "f16" : "f32"},
                     {"chunk_tokens", chunk_tokens},
                     {"chunks", c16.size()},
                     {"bytes", r.half ? bytes16 : bytes32},
                     {"chunk_ratio", s.ratio},
                     {"runs", r.encode ? s.encode_runs : s.decode_runs},
                     {"threads", 1},
                     {"clock", "thread CPU time"},
                     {"wall_gbps", r.encode ? s.encode_wall_gbps : s.decode_wall_gbps}});
      records.Add(r.measure + n, r.encode ? s.encode_gbps : s.decode_gbps, "GB/s", params,
                  n == "zstd1" ? "" : r.measure + std::string("zstd1"), r.encode ? base.encode_gbps : base.decode_gbps);
    }
  };
  for (size_t b = 0; b < baselines16.size(); ++b) {
    const std::string& n = baselines16[b].name;
    for (bool long_ctx : {false, true}) {
      if (long_ctx && !want_long) continue;
      const std::string sfx = long_ctx ? long_suffix : "";
      nlohmann::json rp = quality_params(long_ctx);
      rp.erase("continue_tokens");
      rp["spec"] = kBaselineTitles[b];
      const std::vector<double>& ratios = long_ctx ? base_ratio_long : base_ratio;
      records.Add("codec_ratio_" + n + sfx, ratios[b], "x", rp, b == 0 ? "" : "codec_ratio_zstd1" + sfx, ratios[0]);
    }
    add_speeds(n, kBaselineTitles[b], base16[b], base32[b]);
  }

  // Every codec at its default setting: kdn's presets also say the text
  // their parameters were chosen on.
  auto is_preset = [](const std::string& n) { return n.rfind("kdn", 0) == 0 || n.rfind("tc", 0) == 0; };
  for (const Named& d : defaults) {
    const Point& p = point(d.spec);
    if (!p.ok) continue;  // warned about above
    const std::string spec = p.codec->spec().ToString();
    const std::string n = d.name;
    Result<Speed> sp16 = Measure(CodecCoder(n, *p.codec, s16), c16, min_runs, min_ms);
    Result<Speed> sp32 = Measure(CodecCoder(n, *p.codec, s32), c32, min_runs, min_ms);
    for (bool long_ctx : {false, true}) {
      if (long_ctx && !p.ok_long) continue;
      const codec::EvalResult& e = long_ctx ? p.eval_long : p.eval;
      const std::string sfx = long_ctx ? long_suffix : "";
      nlohmann::json qp = quality_params(long_ctx);
      qp["spec"] = spec;
      if (is_preset(n)) qp["tuned_on"] = tuning_name;
      records.Add("codec_ratio_" + n + sfx, e.ratio_vs_fp16, "x", qp, "codec_ratio_zstd1" + sfx,
                  (long_ctx ? base_ratio_long : base_ratio)[0]);
      records.Add("codec_kl_" + n + sfx, e.kl_mean, "nats", qp);
      records.Add("codec_kl_p95_" + n + sfx, e.kl_p95, "nats", qp);
      nlohmann::json tp = qp;
      tp["greedy_agreement"] = e.greedy_agreement;
      records.Add("codec_top1_" + n + sfx, e.top1_agreement, "fraction", tp);
    }
    if (!sp16.ok() || !sp32.ok()) {
      std::fprintf(stderr, "kdn bench codec: warning: no speed for %s: %s\n", spec.c_str(),
                   (!sp16.ok() ? sp16.status() : sp32.status()).message().c_str());
      continue;
    }
    add_speeds(n, spec, *sp16, *sp32);
  }

  // kdn:balanced decoding several chunks on two threads against one (issue
  // 11: >= 1.8x), wall-clock, in the same run.
  if (const Point& k = point("kdn:balanced"); k.ok) {
    Result<Scaling> sc = MeasureTwoThreads(CodecCoder("kdn", *k.codec, s16), c16, min_runs, min_ms);
    if (sc.ok()) {
      const unsigned cores = std::thread::hardware_concurrency();
      nlohmann::json params = text_params;
      params.update({{"spec", k.codec->spec().ToString()},
                     {"dtype", "f16"},
                     {"chunk_tokens", chunk_tokens},
                     {"chunks", c16.size()},
                     {"bytes", bytes16},
                     {"runs", sc->runs},
                     {"clock", "wall-clock"},
                     {"split", "contiguous halves of the chunks, one per thread, each into its own output buffers"},
                     {"hardware_concurrency", cores}});
      nlohmann::json one = params;
      one["threads"] = 1;
      records.Add("codec_decode_1thread_gbps_kdn", sc->one_gbps, "GB/s", one);
      params["threads"] = 2;
      params["cpu_per_wall"] = sc->two_cpu_per_wall;  // 2 when both threads had a core throughout
      params["goal"] = ">= 1.8";
      params["meaningful"] = cores >= 2;
      if (cores < 2) {
        params["note"] = "fewer than 2 cores (" + std::to_string(cores) + "): the measure is not meaningful";
      }
      records.Add("codec_decode_2threads_gbps_kdn", sc->two_gbps, "GB/s", params, "codec_decode_1thread_gbps_kdn",
                  sc->one_gbps);
    } else {
      std::fprintf(stderr, "kdn bench codec: warning: no two-thread decode figure: %s\n",
                   sc.status().message().c_str());
    }
  } else {
    std::fprintf(stderr, "kdn bench codec: warning: no two-thread decode figure (kdn:balanced missing)\n");
  }

  // kdn against cachegen (issue 4: >= 1.5x smaller at no more KL), and
  // kdn:hifi at fp8 quality (KL mean <= 2e-3, >= 3x smaller than fp16): at
  // the headline context, and at the long one beside it.
  const Point& kdn = point("kdn:balanced");
  const Point& cg = point("cachegen");
  const Point& hifi = point("kdn:hifi");
  for (bool long_ctx : {false, true}) {
    if (long_ctx && !want_long) continue;
    const std::string sfx = long_ctx ? long_suffix : "";
    const codec::EvalResult& ke = long_ctx ? kdn.eval_long : kdn.eval;
    const codec::EvalResult& ce = long_ctx ? cg.eval_long : cg.eval;
    const codec::EvalResult& he = long_ctx ? hifi.eval_long : hifi.eval;
    if (kdn.ok && cg.ok && (!long_ctx || (kdn.ok_long && cg.ok_long)) && ce.ratio_vs_fp16 > 0) {
      const bool no_higher = ke.kl_mean <= ce.kl_mean;
      nlohmann::json vs = quality_params(long_ctx);
      vs.update({{"spec", kdn.codec->spec().ToString()},
                 {"tuned_on", tuning_name},
                 {"against", cg.codec->spec().ToString()},
                 {"ratio_vs_fp16", ke.ratio_vs_fp16},
                 {"cachegen_ratio_vs_fp16", ce.ratio_vs_fp16},
                 {"kl_mean", ke.kl_mean},
                 {"cachegen_kl_mean", ce.kl_mean},
                 {"kl_no_higher", no_higher},
                 {"goal", ">= 1.5 with kl_no_higher"}});
      records.Add("codec_ratio_vs_cachegen" + sfx, ke.ratio_vs_fp16 / ce.ratio_vs_fp16, "x", vs);
      if (ce.kl_mean > 0) records.Add("codec_kl_vs_cachegen" + sfx, ke.kl_mean / ce.kl_mean, "x", vs);
    } else {
      std::fprintf(stderr,
                   "kdn bench codec: warning: no codec_ratio_vs_cachegen%s (kdn:balanced or cachegen missing)\n",
                   sfx.c_str());
    }
    if (hifi.ok && (!long_ctx || hifi.ok_long)) {
      nlohmann::json hp = quality_params(long_ctx);
      hp.update({{"spec", hifi.codec->spec().ToString()},
                 {"tuned_on", tuning_name},
                 {"kl_mean", he.kl_mean},
                 {"kl_p95", he.kl_p95},
                 {"kl_within_goal", he.kl_mean <= 2e-3},
                 {"goal", ">= 3 with kl_mean <= 2e-3"}});
      records.Add("codec_ratio_hifi_kdn" + sfx, he.ratio_vs_fp16, "x", hp);
    } else {
      std::fprintf(stderr, "kdn bench codec: warning: no codec_ratio_hifi_kdn%s (kdn:hifi missing)\n", sfx.c_str());
    }
  }

  // The transform codec (issue 17: >= 8x fp16 at no more KL than cachegen,
  // and >= 5x at KL <= 2e-3), with the profile's presets.
  auto spec_named = [&defaults](const std::string& name) {
    return std::find_if(defaults.begin(), defaults.end(), [&](const Named& d) { return d.name == name; })->spec;
  };
  const Point& tc = point(spec_named("tc"));
  const Point& tc_hifi = point(spec_named("tc_hifi"));
  for (bool long_ctx : {false, true}) {
    if (long_ctx && !want_long) continue;
    const std::string sfx = long_ctx ? long_suffix : "";
    if (tc.ok && cg.ok && (!long_ctx || (tc.ok_long && cg.ok_long))) {
      const codec::EvalResult& te = long_ctx ? tc.eval_long : tc.eval;
      const codec::EvalResult& ce = long_ctx ? cg.eval_long : cg.eval;
      nlohmann::json vs = quality_params(long_ctx);
      vs.update({{"spec", tc.codec->spec().ToString()},
                 {"tuned_on", tuning_name},
                 {"against", cg.codec->spec().ToString()},
                 {"kl_mean", te.kl_mean},
                 {"cachegen_ratio_vs_fp16", ce.ratio_vs_fp16},
                 {"cachegen_kl_mean", ce.kl_mean},
                 {"kl_no_higher", te.kl_mean <= ce.kl_mean},
                 {"goal", ">= 8 with kl_no_higher"}});
      records.Add("codec_ratio_tc_at_cachegen_kl" + sfx, te.ratio_vs_fp16, "x", vs);
    } else {
      std::fprintf(stderr, "kdn bench codec: warning: no codec_ratio_tc_at_cachegen_kl%s (tc or cachegen missing)\n",
                   sfx.c_str());
    }
    if (tc_hifi.ok && (!long_ctx || tc_hifi.ok_long)) {
      const codec::EvalResult& he = long_ctx ? tc_hifi.eval_long : tc_hifi.eval;
      nlohmann::json hp = quality_params(long_ctx);
      hp.update({{"spec", tc_hifi.codec->spec().ToString()},
                 {"tuned_on", tuning_name},
                 {"kl_mean", he.kl_mean},
                 {"kl_p95", he.kl_p95},
                 {"kl_within_goal", he.kl_mean <= 2e-3},
                 {"goal", ">= 5 with kl_mean <= 2e-3"}});
      records.Add("codec_ratio_hifi_tc" + sfx, he.ratio_vs_fp16, "x", hp);
    }
  }

  // The sweeps: one record per setting, at the headline context.
  std::vector<Series> series;
  for (const Sweep& s : sweeps) {
    Series line{s.title, s.color, true, {}};
    for (const std::string& spec : s.specs) {
      const Point& p = point(spec);
      line.points.push_back(&p);
      if (!p.ok) continue;
      nlohmann::json cp = quality_params(false);
      cp.update({{"series", s.series},
                 {"spec", p.codec->spec().ToString()},
                 {"kl_mean", p.eval.kl_mean},
                 {"kl_p95", p.eval.kl_p95},
                 {"top1_agreement", p.eval.top1_agreement},
                 {"greedy_agreement", p.eval.greedy_agreement}});
      records.Add("codec_curve_" + SafeName(spec), p.ratio, "x", cp);
    }
    series.push_back(std::move(line));
  }
  series.push_back(Series{"kdn presets", "#1a7f1a", false, {&kdn, &hifi}});

  if (!records.Write(o.json_path)) return fail("cannot write " + o.json_path);
  std::printf("wrote %s\n", o.json_path.c_str());
  const std::string png =
      o.png_path.empty() ? std::filesystem::path(o.json_path).replace_extension(".png").string() : o.png_path;
  char subtitle[300];
  std::snprintf(subtitle, sizeof subtitle,
                "%s, f16 KV, %s: %zu contexts of %d tokens (one chunk each), %d continued; KL 0 (raw) not shown",
                model_name.c_str(), std::filesystem::path(text_name).filename().string().c_str(), contexts, n_ctx,
                k_cont);
  Plot(png, subtitle, series, base_ratio[0]);
  std::printf("kdn bench codec: %.1f s\n", (NowMs() - t_start) / 1e3);
  return 0;
}

}  // namespace kdn::bench

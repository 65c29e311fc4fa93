// SPDX-License-Identifier: Apache-2.0
// The llama.cpp connector through kdn's C ABI:
// - a prompt prefilled and saved in one context is restored in a new one
//   (a host tier; and a disk tier across a restart of the runtime), and the
//   continuation is bit-identical to prefill, for f32 and f16 caches with
//   flash attention on and off;
// - a longer prompt sharing the prefix restores it and decodes only the rest;
// - RestoreInto puts every cached token (the last one's too) into another
//   sequence, from which the KV moves and continues as prefill's;
// - the connector's prefills are reported to kdn, which prices the tokens a
//   restore serves at llama.cpp's measured rate (TTFT saved);
// - KV stored for another GGUF (another fingerprint) is never restored, and
//   chunks corrupted on disk are a miss and a recompute.
#include "connector.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "llama_test_util.h"
#include "test_models.h"

namespace kdn::llamacpp {
namespace {

std::unique_ptr<Session> Open(bool flash_attn, bool f16) { return OpenReference(flash_attn, f16); }

// A runtime of chunks of 64 tokens: one host tier, or one disk tier at `dir`.
kdn_runtime* Runtime(const std::string& dir = "") {
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  o.chunk_tokens = 64;
  kdn_tier_config disk = KDN_TIER_CONFIG_INIT;
  if (!dir.empty()) {
    disk.kind = KDN_TIER_DISK;
    disk.path = dir.c_str();
    disk.path_len = dir.size();
    disk.capacity_bytes = 64u << 20;
    o.tiers = &disk;
    o.num_tiers = 1;
  }
  kdn_runtime* rt = nullptr;
  EXPECT_EQ(kdn_runtime_create(&o, &rt), KDN_OK) << kdn_last_error_message();
  return rt;
}

kdn_model* Model(kdn_runtime* rt, const Session& s, const std::string& gguf = KDN_GGUF_PATH) {
  std::string fingerprint;
  auto spec = ModelSpecFor(s, gguf, &fingerprint);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  kdn_model* m = nullptr;
  EXPECT_EQ(kdn_model_create(rt, &*spec, &m), KDN_OK) << kdn_last_error_message();
  return m;
}

// A real text of `n` tokens: BOS, the reference run's ids, then the model's
// own greedy continuation.
std::vector<std::int32_t> Text(std::size_t n) {
  auto s = Open(false, false);
  std::vector<std::int32_t> t = {1};
  t.insert(t.end(), testing::kReferenceIds.begin(), testing::kReferenceIds.end());
  EXPECT_TRUE(s->Decode(t).ok());
  auto more = s->Greedy(static_cast<int>(n - t.size()));
  t.insert(t.end(), more->begin(), more->end());
  return t;
}

// Greedy ids after prefilling `prompt` in a fresh session.
std::vector<std::int32_t> Cold(bool flash_attn, bool f16, const std::vector<std::int32_t>& prompt, int steps) {
  auto s = Open(flash_attn, f16);
  EXPECT_TRUE(s->Decode(prompt).ok());
  return s->Greedy(steps).value();
}

// Restores `prompt` through `c` into its session, decodes the rest, and
// returns the greedy ids and the tokens restored.
std::pair<std::vector<std::int32_t>, std::uint64_t> Warm(Session& s, Connector& c,
                                                         const std::vector<std::int32_t>& prompt, int steps) {
  auto r = c.Restore(prompt);
  EXPECT_TRUE(r.ok()) << r.status().message();
  const std::uint64_t got = r.ok() ? r->tokens : 0;
  if (got == 0) s.Clear();
  EXPECT_TRUE(s.Decode(std::vector<std::int32_t>(prompt.begin() + static_cast<std::ptrdiff_t>(got), prompt.end())).ok());
  return {s.Greedy(steps).value(), got};
}

// Prefills `prompt` and saves it through a runtime with a disk tier at
// `dir`, then closes the runtime.
void SaveOnDisk(const std::string& dir, const std::vector<std::int32_t>& prompt) {
  kdn_runtime* rt = Runtime(dir);
  auto s = Open(false, false);
  kdn_model* m = Model(rt, *s);
  Connector c(*s, m, "t");
  ASSERT_TRUE(s->Decode(prompt).ok());
  EXPECT_EQ(c.Save(prompt).value(), prompt.size());
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

TEST(Connector, RestoresWhatPrefillComputedAndContinuesIdentically) {
  KDN_REQUIRE_MODEL();
  const std::vector<std::int32_t> text = Text(300);
  const std::vector<std::int32_t> prompt(text.begin(), text.begin() + 200);
  for (bool flash_attn : {false, true}) {
    for (bool f16 : {false, true}) {
      SCOPED_TRACE(std::string("flash attention ") + (flash_attn ? "on" : "off") + ", " + (f16 ? "f16" : "f32"));
      kdn_runtime* rt = Runtime();
      auto first = Open(flash_attn, f16);
      kdn_model* m = Model(rt, *first);
      Connector save(*first, m, "tenant");
      ASSERT_TRUE(first->Decode(prompt).ok());
      auto cached = save.Save(prompt);
      ASSERT_TRUE(cached.ok()) << cached.status().message();
      EXPECT_EQ(*cached, prompt.size());

      const std::vector<std::int32_t> want = Cold(flash_attn, f16, prompt, 16);
      auto second = Open(flash_attn, f16);
      Connector load(*second, m, "tenant");
      const auto [ids, restored] = Warm(*second, load, prompt, 16);
      EXPECT_EQ(restored, prompt.size() - 1);
      EXPECT_EQ(ids, want);

      // A longer prompt sharing the prefix: the cached part is restored, the
      // rest decoded.
      const std::vector<std::int32_t> longer(text.begin(), text.begin() + 280);
      auto third = Open(flash_attn, f16);
      Connector load3(*third, m, "tenant");
      const auto [ids3, restored3] = Warm(*third, load3, longer, 16);
      EXPECT_EQ(restored3, prompt.size());
      EXPECT_EQ(ids3, Cold(flash_attn, f16, longer, 16));

      // Another tenant sees nothing.
      auto fourth = Open(flash_attn, f16);
      Connector other(*fourth, m, "another tenant");
      EXPECT_EQ(other.Restore(prompt)->tokens, 0u);
      kdn_model_destroy(m);
      kdn_runtime_destroy(rt);
    }
  }
}

// A model with sliding-window layers (the reference weights as gemma3,
// window 16 on every other layer: tools/llama2c_to_gguf.py), whose
// llama.cpp cache is two (full layers, and an SWA cache that keeps the last
// 16 tokens): kdn keeps its layers as groups (docs/model-kinds.md). Saved
// right after the prefill, restored in a new context, the continuation is
// the prefill's, flash attention on and off; a longer prompt restores the
// whole saved prefix; a shorter one gets none of it (the SWA cache held
// only the saved request's window: no chunk of a shorter prefix's window
// was stored), and recomputes; the plain form of ModelSpecFor refuses it.
TEST(Connector, ASlidingWindowModelIsKeptAsLayerGroupsAndContinuesIdentically) {
  KDN_REQUIRE_MODEL();
  const std::vector<std::int32_t> text = Text(300);
  const std::vector<std::int32_t> prompt(text.begin(), text.begin() + 200);
  for (bool flash_attn : {false, true}) {
    SCOPED_TRACE(std::string("flash attention ") + (flash_attn ? "on" : "off"));
    auto open = [&] { return OpenReference(flash_attn, false, KDN_GGUF_SWA_PATH); };
    auto cold = [&](const std::vector<std::int32_t>& p, int steps) {
      auto s = open();
      EXPECT_TRUE(s->Decode(p).ok());
      return s->Greedy(steps).value();
    };
    auto first = open();
    ASSERT_NE(first, nullptr);
    EXPECT_EQ(first->sliding_window(), 16u);
    std::string fingerprint;
    EXPECT_EQ(ModelSpecFor(static_cast<const Session&>(*first), KDN_GGUF_SWA_PATH, &fingerprint).status().code(),
              Code::kUnsupported);
    CacheLayout layout;
    auto spec = ModelSpecFor(*first, KDN_GGUF_SWA_PATH, &layout);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    // llama.cpp's full layers (1, 3) first, then its SWA cache's (0, 2, 4).
    EXPECT_EQ(layout.windows, (std::vector<std::uint32_t>{0, 0, 16, 16, 16}));
    EXPECT_EQ(layout.swa_layers, 3u);
    kdn_runtime* rt = Runtime();
    kdn_model* m = nullptr;
    ASSERT_EQ(kdn_model_create(rt, &*spec, &m), KDN_OK) << kdn_last_error_message();
    Connector save(*first, m, "tenant", layout);
    ASSERT_TRUE(first->Decode(prompt).ok());
    auto cached = save.Save(prompt);
    ASSERT_TRUE(cached.ok()) << cached.status().message();
    EXPECT_EQ(*cached, prompt.size());

    auto second = open();
    Connector load(*second, m, "tenant", layout);
    const auto [ids, restored] = Warm(*second, load, prompt, 16);
    EXPECT_EQ(restored, prompt.size() - 1);
    EXPECT_EQ(ids, cold(prompt, 16));

    const std::vector<std::int32_t> longer(text.begin(), text.begin() + 280);
    auto third = open();
    Connector load3(*third, m, "tenant", layout);
    const auto [ids3, restored3] = Warm(*third, load3, longer, 16);
    EXPECT_EQ(restored3, prompt.size());
    EXPECT_EQ(ids3, cold(longer, 16));

    const std::vector<std::int32_t> shorter(text.begin(), text.begin() + 150);
    auto fourth = open();
    Connector load4(*fourth, m, "tenant", layout);
    const auto [ids4, restored4] = Warm(*fourth, load4, shorter, 16);
    EXPECT_EQ(restored4, 0u);
    EXPECT_EQ(ids4, cold(shorter, 16));
    kdn_model_destroy(m);
    kdn_runtime_destroy(rt);
  }
}

// For KV that is placed, not continued (a RAG document's): every cached
// token, into a second sequence of a unified cache; moved into the first, it
// continues as prefill does once the token after the prompt is decoded.
TEST(Connector, RestoreIntoPlacesEveryCachedTokenInAnotherSequence) {
  KDN_REQUIRE_MODEL();
  const std::vector<std::int32_t> text = Text(200);
  const std::vector<std::int32_t> prompt(text.begin(), text.begin() + 130);  // two chunks and a piece
  kdn_runtime* rt = Runtime();
  auto first = Open(false, false);
  kdn_model* m = Model(rt, *first);
  Connector save(*first, m, "t");
  ASSERT_TRUE(first->Decode(prompt).ok());
  ASSERT_EQ(save.Save(prompt).value(), prompt.size());
  SessionOptions two;
  two.gguf = KDN_GGUF_PATH;
  two.backend_dir = KDN_LLAMACPP_LIBDIR;
  two.n_seq_max = 2;
  auto s = Session::Load(two);
  ASSERT_TRUE(s.ok()) << s.status().message();
  Connector load(**s, m, "t");
  // Only the cached prefix of a longer request; nothing of an unknown one.
  auto got = load.RestoreInto(std::vector<std::int32_t>(text.begin(), text.begin() + 150), 1);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(got->tokens, prompt.size());
  std::vector<std::int32_t> unknown = prompt;
  unknown[1] = unknown[1] == 7 ? 8 : 7;
  EXPECT_EQ(load.RestoreInto(unknown, 1)->tokens, 0u);
  (*s)->SeqCopy(1, 0, -1, -1);
  (*s)->SeqRemove(1, -1, -1);
  const std::vector<std::int32_t> want = Cold(false, false, prompt, 17);
  ASSERT_TRUE((*s)->Decode({want[0]}).ok());
  EXPECT_EQ((*s)->Greedy(16).value(), std::vector<std::int32_t>(want.begin() + 1, want.end()));
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

TEST(Connector, PrefillsAreReportedAndPriceWhatRestoresServe) {
  KDN_REQUIRE_MODEL();
  const std::vector<std::int32_t> text = Text(200);
  const std::vector<std::int32_t> prompt(text.begin(), text.begin() + 128);
  kdn_runtime* rt = Runtime();
  auto first = Open(false, false);
  kdn_model* m = Model(rt, *first);
  Connector save(*first, m, "tenant");
  ASSERT_TRUE(save.Prefill(prompt).ok());
  ASSERT_EQ(save.Save(prompt).value(), prompt.size());
  kdn_stats st = KDN_STATS_INIT;
  ASSERT_EQ(kdn_runtime_get_stats(rt, &st), KDN_OK);
  EXPECT_EQ(st.prefill_tokens, prompt.size());
  EXPECT_GT(st.prefill_ns, 0u);  // llama.cpp's decode of 128 tokens, timed
  EXPECT_EQ(st.ttft_saved_ns, 0u);

  // A new session restores the prompt and prefills the rest of a longer one.
  const std::vector<std::int32_t> longer(text.begin(), text.begin() + 160);
  auto second = Open(false, false);
  Connector load(*second, m, "tenant");
  auto restored = load.Restore(longer);
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored->tokens, prompt.size());
  const std::vector<std::int32_t> rest(longer.begin() + static_cast<std::ptrdiff_t>(restored->tokens), longer.end());
  const double per_token = static_cast<double>(st.prefill_ns) / static_cast<double>(st.prefill_tokens);
  ASSERT_TRUE(load.Prefill(rest).ok());
  ASSERT_EQ(kdn_runtime_get_stats(rt, &st), KDN_OK);
  // The restore was priced at the mean of the reports before it.
  EXPECT_EQ(st.tokens_served, prompt.size());
  EXPECT_EQ(st.tokens_served_unpriced, 0u);
  EXPECT_NEAR(static_cast<double>(st.ttft_saved_ns), per_token * static_cast<double>(prompt.size()), 1.0);
  EXPECT_EQ(st.prefill_tokens, prompt.size() + rest.size());
  EXPECT_EQ(second->Greedy(8).value(), Cold(false, false, longer, 8));
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
}

TEST(Connector, RestoresFromADiskTierAfterARestart) {
  KDN_REQUIRE_MODEL();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kdn-llamacpp-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  const std::vector<std::int32_t> prompt = Text(200);
  ASSERT_NO_FATAL_FAILURE(SaveOnDisk(dir, prompt));
  kdn_runtime* rt = Runtime(dir);
  auto s = Open(false, false);
  kdn_model* m = Model(rt, *s);
  Connector c(*s, m, "t");
  const auto [ids, restored] = Warm(*s, c, prompt, 16);
  EXPECT_EQ(restored, prompt.size() - 1);
  EXPECT_EQ(ids, Cold(false, false, prompt, 16));
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  std::filesystem::remove_all(dir);
}

TEST(Connector, ACorruptedChunkOnDiskIsAMissAndARecompute) {
  KDN_REQUIRE_MODEL();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kdn-llamacpp-bad-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(dir);
  const std::vector<std::int32_t> prompt = Text(130);  // two chunks of 64 and a piece of 2
  ASSERT_NO_FATAL_FAILURE(SaveOnDisk(dir, prompt));
  // Flip a byte in the middle of every object: every chunk fails its checksum.
  int damaged = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".kdn") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(e.file_size());
    f.seekg(size / 2);
    const char b = static_cast<char>(f.get());
    f.seekp(size / 2);
    f.put(static_cast<char>(b ^ 0x40));
    ++damaged;
  }
  ASSERT_GT(damaged, 0);
  kdn_runtime* rt = Runtime(dir);
  auto fresh = Open(false, false);
  kdn_model* m = Model(rt, *fresh);
  Connector load(*fresh, m, "t");
  const auto [ids, restored] = Warm(*fresh, load, prompt, 16);
  EXPECT_EQ(restored, 0u);
  EXPECT_EQ(ids, Cold(false, false, prompt, 16)) << "recomputed as prefill";
  kdn_model_destroy(m);
  kdn_runtime_destroy(rt);
  std::filesystem::remove_all(dir);
}

TEST(Connector, KvOfAnotherGgufIsNeverRestored) {
  KDN_REQUIRE_MODEL();
  // Another GGUF: the same weights but one byte of padding changed, so the
  // same shape under another fingerprint.
  const std::string other = (std::filesystem::temp_directory_path() /
                             ("kdn-llamacpp-other-" + std::to_string(::getpid()) + ".gguf"))
                                .string();
  std::filesystem::copy_file(KDN_GGUF_PATH, other, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(other, std::ios::in | std::ios::out | std::ios::binary | std::ios::ate);
    f.seekp(-1, std::ios::end);
    f.put('\x01');
  }
  const std::vector<std::int32_t> prompt = Text(150);
  kdn_runtime* rt = Runtime();
  auto s = Open(false, false);
  kdn_model* mine = Model(rt, *s);
  kdn_model* theirs = Model(rt, *s, other);
  Connector save(*s, theirs, "t");
  ASSERT_TRUE(s->Decode(prompt).ok());
  ASSERT_EQ(save.Save(prompt).value(), prompt.size());
  auto fresh = Open(false, false);
  Connector load(*fresh, mine, "t");
  EXPECT_EQ(load.Restore(prompt)->tokens, 0u);
  kdn_model_destroy(mine);
  kdn_model_destroy(theirs);
  kdn_runtime_destroy(rt);
  std::filesystem::remove(other);
}

}  // namespace
}  // namespace kdn::llamacpp

// SPDX-License-Identifier: Apache-2.0
// KV views in device memory (device/device.h, KvStore's device paths): a
// device tier serves device views device to device, encoded chunks of lower
// tiers are decoded by the device straight into the view, saves gather on
// the device. Every scenario runs on the emulated device (host memory
// standing in for the GPU's, the kernels' CPU paths: what these machines
// have), and again on the CUDA device where one is usable (skipped, saying
// so, elsewhere). KV comes from the reference transformer; what a device
// view receives is compared byte for byte with what the host path writes.
#include "core/device/device.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>

#include "core/codec/tc_profile.h"
#include "reference_kv.h"
#include "core/tiers/host_pool.h"
#include "core/tiers/memory_tier.h"
#include "core/runtime/runtime.h"
#include "test_gpu.h"
#include "test_models.h"

#ifdef KDN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kdn::store {
namespace {

using Reference = testing::ReferenceKv;

Reference Prefill() { return testing::PrefillStory(); }

std::string TempDir() {
  std::string t = ::testing::TempDir() + "/kdn_device_XXXXXX";
  EXPECT_NE(mkdtemp(t.data()), nullptr);
  return t;
}

// Device memory holding a copy of host bytes.
Payload Upload(Device& d, const void* src, size_t n) {
  Payload p = d.Allocate(n).value();
  EXPECT_TRUE(d.CopyToDevice(p.data(), src, n).ok());
  EXPECT_TRUE(d.Synchronize().ok());
  return p;
}

std::vector<float> Download(Device& d, const Payload& p) {
  std::vector<float> out(p.size() / 4);
  EXPECT_TRUE(d.CopyToHost(out.data(), p.data(), p.size()).ok());
  return out;
}

// The whole canonical layout in one device allocation.
ViewSpec Canonical(Payload& p) {
  ViewSpec s;
  s.memory = 1;
  s.dtype = 0;
  s.data = p.data();
  s.size_bytes = p.size();
  return s;
}

// A paged (NHD) device view with a shuffled block table, as vLLM keeps KV.
struct Paged {
  static constexpr std::int64_t kBlock = 4;
  std::vector<Payload> k, v;
  std::vector<void*> kp, vp;
  std::vector<std::int32_t> table;
  std::int64_t blocks = 0, row = 0;

  Paged(Device& d, const ModelKv& m, size_t tokens) {
    row = m.shape.heads * m.shape.head_dim;
    const std::int64_t used = (static_cast<std::int64_t>(tokens) + kBlock - 1) / kBlock;
    blocks = used + 3;
    table.resize(static_cast<size_t>(used));
    for (std::int64_t i = 0; i < used; ++i) table[static_cast<size_t>(i)] = static_cast<std::int32_t>((i * 5 + 2) % blocks);
    const std::vector<float> poison(static_cast<size_t>(blocks * kBlock * row), -7.0f);
    for (std::int64_t l = 0; l < m.shape.layers; ++l) {
      k.push_back(Upload(d, poison.data(), poison.size() * 4));
      v.push_back(Upload(d, poison.data(), poison.size() * 4));
      kp.push_back(k.back().data());
      vp.push_back(v.back().data());
    }
  }
  ViewSpec Spec(size_t tokens) const {
    ViewSpec s;
    s.memory = 1;
    s.layout = ViewLayout::kPagedNhd;
    s.k_layers = kp.data();
    s.v_layers = vp.data();
    s.num_layers = kp.size();
    s.block_size = kBlock;
    s.block_table = table;
    s.num_blocks = static_cast<std::uint64_t>(blocks);
    s.num_tokens = tokens;
    return s;
  }
  // Back in the canonical layout, for the first `tokens` tokens.
  std::vector<float> Canonical(Device& d, size_t tokens) const {
    std::vector<float> out(kp.size() * 2 * tokens * static_cast<size_t>(row));
    for (size_t l = 0; l < kp.size(); ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<float> layer = Download(d, kv == 0 ? k[l] : v[l]);
        for (size_t t = 0; t < tokens; ++t) {
          const size_t at = (static_cast<size_t>(table[t / kBlock]) * kBlock + t % kBlock) * static_cast<size_t>(row);
          std::memcpy(&out[((l * 2 + static_cast<size_t>(kv)) * tokens + t) * static_cast<size_t>(row)], &layer[at],
                      static_cast<size_t>(row) * 4);
        }
      }
    }
    return out;
  }
};

Result<ResolvedViews> Resolve(const Reference& r, std::vector<ViewSpec> specs) {
  return ResolvedViews::Resolve(r.m, specs, r.tokens.size());
}

ViewSpec HostView(std::vector<float>& kv) {
  ViewSpec h;
  h.data = kv.data();
  h.size_bytes = kv.size() * 4;
  return h;
}

// Stores the reference KV from a host view (the host path); the tokens cached.
std::uint64_t StoreFromHost(Runtime& rt, const Reference& r) {
  std::vector<float> in = r.canonical;
  auto stored = rt.Store(r.m, "t", r.Keys(), Resolve(r, {HostView(in)}).value());
  return stored.ok() ? *stored : 0;
}

// A retrieve of the reference request into a paged device view; the tokens written.
std::uint64_t RetrievePaged(Runtime& rt, const Reference& r, Paged& view) {
  auto got = rt.Retrieve(r.m, "t", r.Keys(), Resolve(r, {view.Spec(r.tokens.size())}).value());
  EXPECT_TRUE(got.ok()) << got.status().message();
  return got.ok() ? got->tokens : 0;
}

// Runs each scenario on the emulated device and, where one is usable, on
// the GPU.
class DeviceDelivery : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      auto d = MakeCudaDevice(0);
      if (!d.ok()) GTEST_SKIP() << "no usable CUDA device: " << d.status().message() << " (the emulated run covers the logic)";
      device_ = std::move(d).value();
    } else {
      device_ = MakeEmulatedDevice();
    }
  }
  std::shared_ptr<Runtime> Make(std::vector<TierSpec> tiers, std::uint32_t chunk_tokens = 8,
                                std::uint64_t staging_bytes = std::uint64_t{256} << 20) {
    StoreOptions o;
    o.chunk_tokens = chunk_tokens;
    o.device_staging_bytes = staging_bytes;
    o.tiers = std::move(tiers);
    o.device = device_;
    auto rt = Runtime::Create(o, 2);
    EXPECT_TRUE(rt.ok()) << rt.status().message();
    return rt.ok() ? *rt : nullptr;
  }
  std::shared_ptr<Device> device_;
};

TierSpec DeviceTier(std::uint64_t bytes = 1 << 20) {
  TierSpec t;
  t.kind = TierSpec::Kind::kDevice;
  t.capacity_bytes = bytes;
  return t;
}

TierSpec HostTier(const std::string& codec = "") {
  TierSpec t;
  t.kind = TierSpec::Kind::kHost;
  t.capacity_bytes = 1 << 20;
  t.codec = codec;
  return t;
}

TierSpec Disk(const std::string& dir, const std::string& codec) {
  TierSpec t;
  t.kind = TierSpec::Kind::kDisk;
  t.path = dir;
  t.capacity_bytes = 64 << 20;
  t.codec = codec;
  t.fsync = false;
  return t;
}

TEST_P(DeviceDelivery, ADeviceTierServesDeviceViewsWithoutAHostRoundTrip) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({DeviceTier()});
  ASSERT_NE(rt, nullptr);
  Device& d = *device_;
  Payload in = Upload(d, r.canonical.data(), r.canonical.size() * 4);
  auto src = Resolve(r, {Canonical(in)});
  ASSERT_TRUE(src.ok()) << src.status().message();
  ASSERT_TRUE(src->device());
  const DeviceCounters before = d.counters();
  ASSERT_EQ(rt->Store(r.m, "t", r.Keys(), *src).value(), r.tokens.size());
  const DeviceCounters stored = d.counters();
  EXPECT_GT(stored.gathers, before.gathers);
  EXPECT_EQ(stored.d2h_bytes, before.d2h_bytes) << "a save into a device tier copied KV to the host";

  Paged out(d, r.m, r.tokens.size());
  auto dst = Resolve(r, {out.Spec(r.tokens.size())});
  ASSERT_TRUE(dst.ok()) << dst.status().message();
  const DeviceCounters ready = d.counters();  // after the test's own uploads
  const KvStore::Retrieved got = rt->Retrieve(r.m, "t", r.Keys(), *dst).value();
  EXPECT_EQ(got.tokens, r.tokens.size());
  EXPECT_FALSE(got.lossy);
  const DeviceCounters loaded = d.counters();
  EXPECT_GT(loaded.scatters, ready.scatters);
  EXPECT_EQ(loaded.h2d_bytes, ready.h2d_bytes) << "a load from a device tier copied KV from the host";
  EXPECT_EQ(loaded.d2h_bytes, ready.d2h_bytes);
  const auto* tier = dynamic_cast<const MemoryTier*>(&rt->store().chain().tier(0));
  ASSERT_NE(tier, nullptr);
  EXPECT_EQ(tier->host_copy_bytes(), 0u) << "the device tier copied a chunk out to the host";
  EXPECT_EQ(out.Canonical(d, r.tokens.size()), r.canonical);
  // The load was counted like a host one.
  EXPECT_EQ(rt->store().Stats().tokens_served, r.tokens.size());
}

// Chunks in a disk tier's codec reach a device view decoded by the device
// (kdn, cachegen, tc) or by the CPU (zstd, int8): the same bytes as the host
// path's retrieve, and only the encoded payloads cross for the first kind.
TEST_P(DeviceDelivery, EncodedChunksAreDecodedIntoTheViewAsTheHostPathDecodesThem) {
  KDN_REQUIRE_MODEL();
  const std::string profile = testing::ModelsDir() + "/stories260K.kdntc";
  auto prof = codec::LoadTcProfile(profile);
  ASSERT_TRUE(prof.ok()) << prof.status().message();
  struct Case {
    std::string codec;
    bool on_device, lossy;
  };
  for (const Case& c : {Case{"kdn:balanced", true, true}, Case{"cachegen", true, true},
                        Case{"tc:balanced,profile=" + profile, true, true}, Case{"zstd", false, false},
                        Case{"int8", false, true}}) {
    SCOPED_TRACE(c.codec);
    Reference r = Prefill();
    // The profile is fitted to this model's KV as the reference engine names it.
    std::memcpy(r.m.fingerprint.data(), (*prof)->fingerprints.at(0).data(), 32);
    const std::string dir = TempDir();
    auto rt = Make({Disk(dir, c.codec)});
    ASSERT_NE(rt, nullptr);
    ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
    // The host path: decoded on the CPU.
    std::vector<float> host_out(r.canonical.size(), 0.0f);
    ViewSpec ho = HostView(host_out);
    const KvStore::Retrieved on_host = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {ho}).value()).value();
    ASSERT_EQ(on_host.tokens, r.tokens.size());
    EXPECT_EQ(on_host.lossy, c.lossy);
    // The device path.
    Device& d = *device_;
    Paged out(d, r.m, r.tokens.size());
    const DeviceCounters before = d.counters();
    const KvStore::Retrieved got = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {out.Spec(r.tokens.size())}).value()).value();
    const DeviceCounters after = d.counters();
    EXPECT_EQ(got.tokens, r.tokens.size());
    EXPECT_EQ(got.lossy, c.lossy);
    const std::vector<float> dev = out.Canonical(d, r.tokens.size());
    if (device_->emulated() || c.codec.rfind("tc", 0) != 0) {
      EXPECT_EQ(dev, host_out) << "the device path's bytes differ from the CPU decoder's";
    } else {
      // On a GPU the transform codec's product sums in cuBLAS's order.
      float largest = 0.0f;
      for (float x : host_out) largest = std::max(largest, std::abs(x));
      for (size_t i = 0; i < dev.size(); ++i) ASSERT_NEAR(dev[i], host_out[i], 1e-5f * largest + 1e-6f) << i;
    }
    const std::uint64_t chunks = (r.tokens.size() + 7) / 8 + 2;  // 3 chunks of 8, then pieces: at least
    if (c.on_device) {
      EXPECT_GE(after.device_decodes - before.device_decodes, 3u);
      EXPECT_LE(after.device_decodes - before.device_decodes, chunks);
      EXPECT_EQ(after.host_decodes, before.host_decodes);
      // Exactly the payloads, each once (the tier encoded each chunk once).
      EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, rt->store().chain().Stats().at(0).bytes_after_encoding)
          << "more than the encoded payloads crossed";
    } else {
      EXPECT_EQ(after.device_decodes, before.device_decodes);
      EXPECT_GE(after.host_decodes - before.host_decodes, 3u);
      EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, r.canonical.size() * 4);
    }
    EXPECT_EQ(after.d2h_bytes, before.d2h_bytes);
    // The level counted the device's decodes as its own.
    const LevelStats disk = rt->store().chain().Stats().at(0);
    EXPECT_GE(disk.decoded_chunks, 6u);
    EXPECT_EQ(disk.decode_failures, 0u);
    std::filesystem::remove_all(dir);
  }
}

// The second chunk (tokens 8..15) of the reference request as a kdn chunk
// whose payload is garbage.
ChunkRef GarbageKdnChunk(const Reference& r, const keys::Digest& key) {
  auto bad = std::make_shared<Chunk>();
  bad->meta.key = key;
  bad->meta.model = r.m.fingerprint;
  bad->meta.ns_hash = keys::NamespaceHash("t");
  bad->meta.dtype = 0;
  bad->meta.layers = 5;
  bad->meta.kv_heads = 4;
  bad->meta.head_dim = 8;
  bad->meta.tokens = 8;
  bad->meta.first_position = 8;
  bad->meta.codec = codec::CodecId::kKdn;
  std::vector<std::uint8_t> junk(600, 0x5A);
  bad->payload = Payload(junk.data(), junk.size());
  return bad;
}

// A payload that does not decode on the device is a miss, counted and
// removed, as the CPU path treats it; a retrieve stops before it.
TEST_P(DeviceDelivery, APayloadThatDoesNotDecodeIsAMissCountedAndRemoved) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({HostTier("kdn:balanced")});
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
  // Replace the second chunk (tokens 8..15) by one whose kdn payload is garbage.
  KvStore& store = rt->store();
  auto plan = store.PlanStore(r.m, "t", r.Keys()).value();
  ASSERT_GE(plan.size(), 3u);
  const keys::Digest second = plan[1].key;
  ASSERT_TRUE(store.chain().Erase(second));
  ASSERT_TRUE(store.chain().Put(GarbageKdnChunk(r, second)).ok());

  Device& d = *device_;
  const size_t row = 32, T = r.tokens.size();
  // A load (not a prefix) writes every chunk that decodes and reports the gap.
  Paged all(d, r.m, T);
  auto op = rt->Load(r.m, "t", OwnedKeys::Of(r.Keys()), Resolve(r, {all.Spec(T)}).value()).value();
  ASSERT_TRUE(op->Wait(-1).ok());
  const OpResult res = op->Outcome();
  ASSERT_EQ(res.failed.size(), 1u);
  EXPECT_EQ(res.failed.front().begin, 8u);
  EXPECT_EQ(res.failed.front().end, 16u);
  EXPECT_EQ(res.covered, T);
  EXPECT_EQ(res.tokens, T - 8);
  EXPECT_TRUE(res.lossy);
  const std::vector<float> loaded = all.Canonical(d, T);
  for (size_t l = 0; l < 5; ++l) {
    EXPECT_EQ(loaded[((l * 2) * T + 8) * row], -7.0f) << "layer " << l << ": the gap was written";
    EXPECT_NE(loaded[((l * 2) * T + 16) * row], -7.0f) << "layer " << l << ": a chunk after the gap is missing";
  }
  const LevelStats level = store.chain().Stats().at(0);
  EXPECT_EQ(level.decode_failures, 1u);
  EXPECT_FALSE(store.chain().ContainsAt(0, second)) << "the chunk that does not decode was kept";
  // Now a retrieve finds the prefix up to it, and writes nothing past it.
  Paged out(d, r.m, T);
  const KvStore::Retrieved got = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {out.Spec(T)}).value()).value();
  EXPECT_EQ(got.tokens, 8u);
  const std::vector<float> dev = out.Canonical(d, T);
  for (size_t l = 0; l < 5; ++l) {
    EXPECT_NE(dev[((l * 2) * T + 7) * row], -7.0f) << "layer " << l;
    for (size_t t = 8; t < T; ++t) EXPECT_EQ(dev[((l * 2) * T + t) * row], -7.0f) << "layer " << l << " token " << t;
  }
}

// kdn chunks decode in batches, one device launch for the load: straight
// into a view that lays them out as the chunk does (no staging, no scatter),
// through staging and the scatter kernel into a paged one; the same bytes
// as the CPU decoder either way. A chunk that does not decode is reported
// alone, and a retrieve stops before it.
TEST_P(DeviceDelivery, KdnChunksDecodeInOneBatchStraightIntoDenseViews) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({HostTier("kdn:balanced")});
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
  const size_t T = r.tokens.size();
  std::vector<float> host_out(r.canonical.size(), 0.0f);
  ViewSpec ho = HostView(host_out);
  ASSERT_EQ(rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {ho}).value()).value().tokens, T);
  Device& d = *device_;
  std::vector<float> sentinel(r.canonical.size(), -7.0f);
  Payload dense = Upload(d, sentinel.data(), sentinel.size() * 4);
  const DeviceCounters before = d.counters();
  const KvStore::Retrieved got = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {Canonical(dense)}).value()).value();
  const DeviceCounters after = d.counters();
  EXPECT_EQ(got.tokens, T);
  EXPECT_TRUE(got.lossy);
  EXPECT_EQ(Download(d, dense), host_out) << "the batched decode's bytes differ from the CPU decoder's";
  EXPECT_EQ(after.scatters, before.scatters) << "a dense view took kdn chunks through the scatter kernel";
  EXPECT_GE(after.device_decodes - before.device_decodes, 3u);
  EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, rt->store().chain().Stats().at(0).bytes_after_encoding)
      << "more than the encoded payloads crossed";

  // The second chunk (tokens 8..15) replaced by one whose payload is garbage.
  KvStore& store = rt->store();
  auto plan = store.PlanStore(r.m, "t", r.Keys()).value();
  ASSERT_GE(plan.size(), 3u);
  ASSERT_TRUE(store.chain().Erase(plan[1].key));
  ASSERT_TRUE(store.chain().Put(GarbageKdnChunk(r, plan[1].key)).ok());
  Payload again = Upload(d, sentinel.data(), sentinel.size() * 4);
  const KvStore::Retrieved part = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {Canonical(again)}).value()).value();
  EXPECT_EQ(part.tokens, 8u) << "a retrieve stops before the chunk that does not decode";
  const std::vector<float> first = Download(d, again);
  const size_t row = 32;
  for (size_t l = 0; l < 5; ++l) {
    for (size_t t = 0; t < 8; ++t) {
      EXPECT_EQ(first[((l * 2) * T + t) * row], host_out[((l * 2) * T + t) * row]) << "layer " << l << " token " << t;
    }
  }
  EXPECT_EQ(store.chain().Stats().at(0).decode_failures, 1u);
  EXPECT_FALSE(store.chain().ContainsAt(0, plan[1].key)) << "the chunk that does not decode was kept";
}

// kdn chunks into a paged view go through staging in batches; with room for
// a chunk and a half, a load takes several batches, each reusing the staging
// only after the chunks of the one before were scattered: the same bytes as
// the CPU decoder.
TEST_P(DeviceDelivery, KdnBatchesThroughSmallStagingReuseItInOrder) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  const std::uint64_t chunk_bytes = 8 * static_cast<std::uint64_t>(r.m.bytes_per_token());
  auto rt = Make({HostTier("kdn:balanced")}, 8, chunk_bytes + chunk_bytes / 2);
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
  const size_t T = r.tokens.size();
  ASSERT_GE(T, 24u) << "three chunks at least";
  std::vector<float> host_out(r.canonical.size(), 0.0f);
  ViewSpec ho = HostView(host_out);
  ASSERT_EQ(rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {ho}).value()).value().tokens, T);
  Device& d = *device_;
  Paged out(d, r.m, T);
  const DeviceCounters before = d.counters();
  EXPECT_EQ(rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {out.Spec(T)}).value()).value().tokens, T);
  const DeviceCounters after = d.counters();
  EXPECT_EQ(out.Canonical(d, T), host_out) << "a batch overwrote staged chunks before they were scattered";
  EXPECT_GE(after.device_decodes - before.device_decodes, 3u);
  EXPECT_GT(after.scatters, before.scatters);
}

// The asynchronous ops with device views: a save gathers each layer on the
// device (to a host tier: the bytes cross once), a load writes every layer.
TEST_P(DeviceDelivery, LoadAndSaveOpsMoveTheSameBytes) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({HostTier()});
  ASSERT_NE(rt, nullptr);
  Device& d = *device_;
  Payload in = Upload(d, r.canonical.data(), r.canonical.size() * 4);
  auto save = rt->Save(r.m, "t", OwnedKeys::Of(r.Keys()), Resolve(r, {Canonical(in)}).value());
  ASSERT_TRUE(save.ok()) << save.status().message();
  for (std::uint32_t l = 0; l < 5; ++l) ASSERT_TRUE((*save)->SaveLayer(4 - l).ok());
  ASSERT_TRUE((*save)->Wait(-1).ok()) << (*save)->Outcome().status.message();
  EXPECT_EQ((*save)->Outcome().tokens, r.tokens.size());
  EXPECT_EQ(d.counters().d2h_bytes, r.canonical.size() * 4) << "a layer crossed twice, or not at all";

  Paged out(d, r.m, r.tokens.size());
  auto load = rt->Load(r.m, "t", OwnedKeys::Of(r.Keys()), Resolve(r, {out.Spec(r.tokens.size())}).value());
  ASSERT_TRUE(load.ok()) << load.status().message();
  ASSERT_TRUE((*load)->WaitLayer(4, -1).ok());
  ASSERT_TRUE((*load)->Wait(-1).ok());
  EXPECT_EQ((*load)->Outcome().tokens, r.tokens.size());
  EXPECT_EQ(out.Canonical(d, r.tokens.size()), r.canonical);
}

// A save from a device view into a chain whose top tier is not on the
// device copies to the host and puts as usual; what comes back is exact.
TEST_P(DeviceDelivery, ASaveToAHostTierCopiesOnceAndRoundTrips) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({HostTier(), DeviceTier()});
  ASSERT_NE(rt, nullptr);
  Device& d = *device_;
  Payload in = Upload(d, r.canonical.data(), r.canonical.size() * 4);
  ASSERT_EQ(rt->Store(r.m, "t", r.Keys(), Resolve(r, {Canonical(in)}).value()).value(), r.tokens.size());
  EXPECT_EQ(d.counters().d2h_bytes, r.canonical.size() * 4);
  Payload out = Upload(d, std::vector<float>(r.canonical.size(), 0.0f).data(), r.canonical.size() * 4);
  const DeviceCounters before = d.counters();
  EXPECT_EQ(rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {Canonical(out)}).value()).value().tokens, r.tokens.size());
  EXPECT_EQ(d.counters().h2d_bytes - before.h2d_bytes, r.canonical.size() * 4) << "raw host chunks cross once";
  // A view laid out as the chunks are takes them by copies: no staging, no scatter.
  EXPECT_EQ(d.counters().scatters, before.scatters);
  EXPECT_EQ(Download(d, out), r.canonical);
}

// Raw chunks of a host tier go straight into a view that lays them out as
// they are (above) and through staging and the scatter kernel into one that
// does not (a paged view); each crosses once either way, and both views
// receive the host path's bytes.
TEST_P(DeviceDelivery, RawHostChunksGoStraightOnlyIntoViewsLaidOutAsTheChunks) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({HostTier()});
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
  Device& d = *device_;
  Paged paged(d, r.m, r.tokens.size());
  const DeviceCounters before = d.counters();
  EXPECT_EQ(RetrievePaged(*rt, r, paged), r.tokens.size());
  const DeviceCounters after = d.counters();
  EXPECT_EQ(after.h2d_bytes - before.h2d_bytes, r.canonical.size() * 4);
  EXPECT_GT(after.scatters, before.scatters) << "a paged view takes chunks through the scatter kernel";
  EXPECT_EQ(paged.Canonical(d, r.tokens.size()), r.canonical);
}

// Never slower than prefill, into device views: the rate of a tier into
// device views is measured apart from its rate into host views, and once the
// engine prefills faster than a disk tier delivers to the device, a
// retrieve leaves its chunks to recompute (nothing crosses).
TEST_P(DeviceDelivery, ChunksSlowerThanPrefillAreLeftToRecomputeForDeviceViewsToo) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  const std::string dir = TempDir();
  auto rt = Make({Disk(dir, "zstd")});
  ASSERT_NE(rt, nullptr);
  ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
  Device& d = *device_;
  Paged out(d, r.m, r.tokens.size());
  ASSERT_EQ(RetrievePaged(*rt, r, out), r.tokens.size());
  KvStore& store = rt->store();
  const KvStore::DeliveryRate rate = store.Rate(0, /*device=*/true);
  EXPECT_EQ(rate.samples, 1u);
  ASSERT_GT(rate.ns_per_token, 0.0);
  EXPECT_EQ(store.Rate(0, /*device=*/false).samples, 0u);
  ASSERT_TRUE(store.ReportPrefill(r.m, 1000000, static_cast<std::uint64_t>(std::max(1.0, rate.ns_per_token / 100) * 1e6)).ok());
  const DeviceCounters before = d.counters();
  EXPECT_EQ(RetrievePaged(*rt, r, out), 0u);
  EXPECT_EQ(d.counters().h2d_bytes, before.h2d_bytes) << "a chunk left to recompute crosses nothing";
  EXPECT_GT(store.Rate(0, true).recompute_chunks, 0u);
  EXPECT_EQ(store.Stats().recompute_tokens, r.tokens.size());
  std::filesystem::remove_all(dir);
}

// A device that does what the one it wraps does, but holds its callers in
// Synchronize from the `hold_at`-th call on until Release (fault injection:
// a load's later layer steps made slow, to see the earlier ones reported).
class GatedDevice final : public Device {
 public:
  explicit GatedDevice(std::shared_ptr<Device> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool emulated() const override { return inner_->emulated(); }
  Result<chunk::Payload> Allocate(size_t n) override { return inner_->Allocate(n); }
  Status CopyToDevice(void* d, const void* s, size_t n) override { return inner_->CopyToDevice(d, s, n); }
  Status CopyToHost(void* d, const void* s, size_t n) override { return inner_->CopyToHost(d, s, n); }
  Status CopyOnDevice(void* d, const void* s, size_t n) override { return inner_->CopyOnDevice(d, s, n); }
  Status Scatter(const void* chunk, const kernels::KvView& view, std::int64_t tb, std::int64_t tokens, std::int64_t lb,
                 std::int64_t le) override {
    return inner_->Scatter(chunk, view, tb, tokens, lb, le);
  }
  Status Gather(const kernels::KvView& view, std::int64_t tb, std::int64_t tokens, std::int64_t lb, std::int64_t le,
                void* chunk) override {
    return inner_->Gather(view, tb, tokens, lb, le, chunk);
  }
  Status Decode(const codec::Shape& shape, codec::CodecId id, const std::uint8_t* payload, size_t size,
                void* out) override {
    return inner_->Decode(shape, id, payload, size, out);
  }
  Status DecodeKdnBatch(std::span<codec::KdnBatchJob> jobs) override { return inner_->DecodeKdnBatch(jobs); }
  Status GatherRows(float* dst, const float* src, std::span<const std::int32_t> rows, std::int64_t width) override {
    return inner_->GatherRows(dst, src, rows, width);
  }
  Status RowDeviations(const float* plane, const float* saved, std::span<const std::int32_t> plane_rows,
                       std::span<const std::int32_t> saved_rows, std::int64_t width, double* out) override {
    return inner_->RowDeviations(plane, saved, plane_rows, saved_rows, width, out);
  }
  Status RopeShift(const kernels::RopeSpec& spec, float* keys, std::int64_t row_stride, std::int64_t tokens,
                   int kv_heads, std::int64_t delta) override {
    return inner_->RopeShift(spec, keys, row_stride, tokens, kv_heads, delta);
  }
  Status FromFloat(std::uint32_t dtype, const float* src, std::int64_t n, void* dst) override {
    return inner_->FromFloat(dtype, src, n, dst);
  }
  Result<StreamMark> MarkStream(void* stream) override { return inner_->MarkStream(stream); }
  Status AfterMark(const StreamMark& mark) override { return inner_->AfterMark(mark); }
  Status StreamAfterUs(void* stream) override { return inner_->StreamAfterUs(stream); }
  Status Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (++syncs_ >= hold_at_) cv_.wait(lock, [&] { return released_; });
    lock.unlock();
    return inner_->Synchronize();
  }
  void HoldFromCall(std::uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_at_ = syncs_ + n;
    released_ = false;
  }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::shared_ptr<Device> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t syncs_ = 0, hold_at_ = UINT64_MAX;
  bool released_ = true;
};

// Item 3 of issue 30: a load op into device views writes its layers in
// order, a step at a time (here a layer per step: the model has 5), and
// reports each step as it lands: kdn_op_wait_layer(0) returns while the
// later layers are still held back. Raw, kdn (decoded a plane range per
// step) and zstd (decoded once on the CPU) chunks end with the same bytes
// as a retrieve writes.
TEST_P(DeviceDelivery, ALoadOpIntoDeviceViewsCompletesItsLayersInOrder) {
  KDN_REQUIRE_MODEL();
  const std::shared_ptr<Device> plain = device_;
  for (const std::string codec : {"raw", "kdn:balanced", "zstd"}) {
    SCOPED_TRACE(codec);
    Reference r = Prefill();
    auto gated = std::make_shared<GatedDevice>(plain);
    device_ = gated;
    auto rt = Make({HostTier(codec)});
    ASSERT_NE(rt, nullptr);
    ASSERT_EQ(StoreFromHost(*rt, r), r.tokens.size());
    Device& d = *device_;
    Paged want(d, r.m, r.tokens.size());
    ASSERT_EQ(RetrievePaged(*rt, r, want), r.tokens.size());
    Paged out(d, r.m, r.tokens.size());
    gated->HoldFromCall(2);  // the first step's synchronize passes, the second's waits
    auto load = rt->Load(r.m, "t", OwnedKeys::Of(r.Keys()), Resolve(r, {out.Spec(r.tokens.size())}).value());
    ASSERT_TRUE(load.ok()) << load.status().message();
    EXPECT_TRUE((*load)->WaitLayer(0, 30000).ok()) << "layer 0 was not reported before the later layers landed";
    EXPECT_EQ((*load)->Outcome().state, OpState::kPending);
    EXPECT_EQ((*load)->WaitLayer(1, 50).code(), Code::kTimeout);
    gated->Release();
    ASSERT_TRUE((*load)->Wait(-1).ok()) << (*load)->Outcome().status.message();
    for (std::uint32_t l = 0; l < 5; ++l) EXPECT_TRUE((*load)->WaitLayer(l, 0).ok());
    EXPECT_EQ((*load)->Outcome().tokens, r.tokens.size());
    EXPECT_EQ(out.Canonical(d, r.tokens.size()), want.Canonical(d, r.tokens.size()));
    device_ = plain;
  }
}

// An engine's CUDA stream in the views (kdn_kv_view.cuda_stream, 1.8):
// every call marks it when made, its device work waits for the mark, and
// the stream then waits for kdn's writes; a save marks it per layer (the
// engine saves a layer right after queueing its writes). On the emulated
// device these only count (a stand-in handle, never dereferenced); on a GPU
// a real stream orders real work. The bytes are the same either way.
TEST_P(DeviceDelivery, CallsOrderTheirDeviceWorkAfterTheEnginesStream) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  auto rt = Make({HostTier()});
  ASSERT_NE(rt, nullptr);
  Device& d = *device_;
  void* stream = reinterpret_cast<void*>(std::uintptr_t{0x5EED});
#ifdef KDN_HAVE_CUDA
  cudaStream_t cuda_stream = nullptr;
  if (GetParam()) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&cuda_stream, cudaStreamNonBlocking), cudaSuccess);
    stream = cuda_stream;
  }
#endif
  auto with_stream = [&](ViewSpec s) {
    s.engine_stream = stream;
    return s;
  };
  const size_t T = r.tokens.size();
  Payload in = Upload(d, r.canonical.data(), r.canonical.size() * 4);
  DeviceCounters c0 = d.counters();
  ASSERT_EQ(rt->Store(r.m, "t", r.Keys(), Resolve(r, {with_stream(Canonical(in))}).value()).value(), T);
  DeviceCounters c1 = d.counters();
  EXPECT_EQ(c1.stream_marks - c0.stream_marks, 1u);
  EXPECT_EQ(c1.mark_waits - c0.mark_waits, 1u) << "the gathers did not wait for the engine's stream";
  EXPECT_EQ(c1.stream_waits - c0.stream_waits, 1u);

  Paged out(d, r.m, T);
  c0 = d.counters();
  EXPECT_EQ(rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {with_stream(out.Spec(T))}).value()).value().tokens, T);
  c1 = d.counters();
  EXPECT_EQ(c1.stream_marks - c0.stream_marks, 1u);
  EXPECT_EQ(c1.mark_waits - c0.mark_waits, 1u) << "the writes did not wait for the engine's stream";
  EXPECT_EQ(c1.stream_waits - c0.stream_waits, 1u) << "the engine's stream does not wait for the writes";
  EXPECT_EQ(out.Canonical(d, T), r.canonical);

  Paged loaded(d, r.m, T);
  c0 = d.counters();
  auto load = rt->Load(r.m, "t", OwnedKeys::Of(r.Keys()), Resolve(r, {with_stream(loaded.Spec(T))}).value());
  ASSERT_TRUE(load.ok()) << load.status().message();
  EXPECT_EQ(d.counters().stream_marks - c0.stream_marks, 1u) << "a load op marks the stream when it starts";
  ASSERT_TRUE((*load)->Wait(-1).ok());
  c1 = d.counters();
  EXPECT_EQ(c1.mark_waits - c0.mark_waits, 1u);
  EXPECT_EQ(c1.stream_waits - c0.stream_waits, 1u);
  EXPECT_EQ(loaded.Canonical(d, T), r.canonical);

  auto rt2 = Make({HostTier()});
  ASSERT_NE(rt2, nullptr);
  c0 = d.counters();
  auto save = rt2->Save(r.m, "t", OwnedKeys::Of(r.Keys()), Resolve(r, {with_stream(Canonical(in))}).value());
  ASSERT_TRUE(save.ok()) << save.status().message();
  for (std::uint32_t l = 0; l < 5; ++l) ASSERT_TRUE((*save)->SaveLayer(l).ok());
  ASSERT_TRUE((*save)->Wait(-1).ok()) << (*save)->Outcome().status.message();
  c1 = d.counters();
  EXPECT_EQ(c1.stream_marks - c0.stream_marks, 5u) << "one mark per layer saved";
  EXPECT_EQ(c1.mark_waits - c0.mark_waits, 5u);
  Paged back(d, r.m, T);
  EXPECT_EQ(rt2->Retrieve(r.m, "t", r.Keys(), Resolve(r, {back.Spec(T)}).value()).value().tokens, T);
  EXPECT_EQ(back.Canonical(d, T), r.canonical);

  // Without a stream nothing is marked or waited for.
  c0 = d.counters();
  EXPECT_EQ(rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {out.Spec(T)}).value()).value().tokens, T);
  c1 = d.counters();
  EXPECT_EQ(c1.stream_marks, c0.stream_marks);
  EXPECT_EQ(c1.mark_waits, c0.mark_waits);
  EXPECT_EQ(c1.stream_waits, c0.stream_waits);
#ifdef KDN_HAVE_CUDA
  if (cuda_stream != nullptr) {
    EXPECT_EQ(cudaStreamSynchronize(cuda_stream), cudaSuccess);
    cudaStreamDestroy(cuda_stream);
  }
#endif
}

// The first `n` tokens of a reference (its canonical KV cut to them).
Reference FirstTokens(Reference r, size_t n) {
  const size_t T = r.tokens.size(), row = static_cast<size_t>(r.m.shape.heads * r.m.shape.head_dim);
  std::vector<float> kv(2 * static_cast<size_t>(r.m.shape.layers) * n * row);
  for (size_t plane = 0; plane < 2 * static_cast<size_t>(r.m.shape.layers); ++plane) {
    std::memcpy(&kv[plane * n * row], &r.canonical[plane * T * row], n * row * 4);
  }
  r.canonical = std::move(kv);
  r.tokens.resize(n);
  return r;
}

// Tokens [begin, begin + n) of every plane (layer, k|v) of canonical KV of T tokens.
std::vector<float> TokensOf(const std::vector<float>& kv, size_t T, size_t begin, size_t n, size_t row) {
  std::vector<float> out;
  for (size_t plane = 0; plane < kv.size() / (T * row); ++plane) {
    out.insert(out.end(), kv.begin() + static_cast<std::ptrdiff_t>((plane * T + begin) * row),
               kv.begin() + static_cast<std::ptrdiff_t>((plane * T + begin + n) * row));
  }
  return out;
}

// A device tier with room for two chunks over a disk tier in kdn (lossy),
// three chunks stored from device memory: the first goes down to disk,
// encoded. A retrieve into device memory decodes it there; the retrieve's
// promotion of it (in the background) evicts another chunk from the full
// top tier, down to disk, encoded, if it runs before the next read (it is
// refused while the retrieve still leases the others). So a retrieve
// into host memory after it may get that chunk decoded where the first got
// it exact: the only copy left is the encoded one. What holds whatever the
// timing: every chunk either read is the stored KV or the one decode of its
// one encoding (the device's and the CPU's the same bytes), and a chunk
// comes back exact only while it was never demoted. Several rounds, as the
// timing varies; the order the mover takes is not asserted.
TEST_P(DeviceDelivery, ReadsOfALossyChainDifferOnlyWhereAChunkWentDownBetweenThem) {
  KDN_REQUIRE_MODEL();
  constexpr size_t kChunk = 8, kChunks = 3, T = kChunks * kChunk;
  Reference r = FirstTokens(Prefill(), T);
  const size_t row = static_cast<size_t>(r.m.shape.heads * r.m.shape.head_dim);
  const std::uint64_t chunk_bytes = kChunk * static_cast<std::uint64_t>(r.m.bytes_per_token());
  Device& d = *device_;
  size_t demoted_between = 0;
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const std::string dir = TempDir();
    TierSpec top = DeviceTier(2 * HostPool::ClassSize(chunk_bytes));
    top.high_watermark = top.low_watermark = 1.0;
    auto rt = Make({top, Disk(dir, "kdn")}, kChunk);
    ASSERT_NE(rt, nullptr);
    Payload in = Upload(d, r.canonical.data(), r.canonical.size() * 4);
    ASSERT_EQ(rt->Store(r.m, "t", r.Keys(), Resolve(r, {Canonical(in)}).value()).value(), T);
    rt->store().chain().Flush();
    ASSERT_EQ(rt->store().chain().Stats().at(1).objects, 1u);
    ASSERT_EQ(rt->store().chain().Stats().at(1).encoded_chunks, 1u);

    Payload dense = Upload(d, std::vector<float>(r.canonical.size(), -7.0f).data(), r.canonical.size() * 4);
    const KvStore::Retrieved on_device = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {Canonical(dense)}).value()).value();
    ASSERT_EQ(on_device.tokens, T);
    EXPECT_TRUE(on_device.lossy);
    const std::vector<float> first = Download(d, dense);
    std::vector<float> second(r.canonical.size(), -7.0f);
    ViewSpec hv = HostView(second);
    const KvStore::Retrieved on_host = rt->Retrieve(r.m, "t", r.Keys(), Resolve(r, {hv}).value()).value();
    ASSERT_EQ(on_host.tokens, T);
    EXPECT_TRUE(on_host.lossy);
    for (size_t c = 0; c < kChunks; ++c) {
      SCOPED_TRACE("chunk " + std::to_string(c));
      const std::vector<float> stored = TokensOf(r.canonical, T, c * kChunk, kChunk, row);
      const std::vector<float> a = TokensOf(first, T, c * kChunk, kChunk, row);
      const std::vector<float> b = TokensOf(second, T, c * kChunk, kChunk, row);
      // The first chunk was on disk before either read: decoded by both.
      if (c == 0) {
        EXPECT_NE(a, stored) << "the chunk on disk came back undecoded";
      }
      if (a != stored) {
        EXPECT_EQ(b, a) << "two decodes of one encoding differ (the device's and the CPU's)";
      } else if (b != stored) {
        ++demoted_between;  // exact, then decoded: demoted between the reads
        EXPECT_GE(rt->store().chain().Stats().at(1).encoded_chunks, 2u);
      }
    }
    rt->store().chain().Flush();
    EXPECT_EQ(rt->store().chain().Stats().at(1).decode_failures, 0u);
    rt.reset();
    std::filesystem::remove_all(dir);
  }
  std::printf("chunks demoted between the two reads: %zu (of 12 rounds)\n", demoted_between);
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceDelivery, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Cuda" : "Emulated"; });

// A stream orders device work only, and a call names one.
TEST(DeviceViews, AnEngineStreamIsForDeviceViewsAndOnePerCall) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  std::vector<float> host(r.canonical.size());
  ViewSpec h = HostView(host);
  h.engine_stream = reinterpret_cast<void*>(std::uintptr_t{1});
  auto bad = Resolve(r, {h});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cuda_stream"), std::string::npos) << bad.status().message();
  // Two device views over the layers, naming two streams.
  std::vector<float> a(r.canonical.size()), b(r.canonical.size());
  const std::uint32_t first[] = {0, 1, 2}, rest[] = {3, 4};
  ViewSpec va = HostView(a), vb = HostView(b);
  va.memory = vb.memory = 1;
  va.layers = first;
  va.num_layers = 3;
  vb.layers = rest;
  vb.num_layers = 2;
  va.engine_stream = reinterpret_cast<void*>(std::uintptr_t{1});
  vb.engine_stream = reinterpret_cast<void*>(std::uintptr_t{2});
  auto two = Resolve(r, {va, vb});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("cuda_stream differs"), std::string::npos) << two.status().message();
  vb.engine_stream = va.engine_stream;
  auto one = Resolve(r, {va, vb});
  ASSERT_TRUE(one.ok()) << one.status().message();
  for (const KvGroup& g : one->groups()) EXPECT_EQ(g.engine_stream, va.engine_stream);
}

TEST(DeviceViews, AreRefusedWithoutADeviceAndMixedWithHostViews) {
  KDN_REQUIRE_MODEL();
  Reference r = Prefill();
  StoreOptions o;
  o.chunk_tokens = 8;
  auto rt = Runtime::Create(o, 1).value();
  std::vector<float> a = r.canonical, b = r.canonical;
  ViewSpec dev;
  dev.memory = 1;
  dev.data = a.data();
  dev.size_bytes = a.size() * 4;
  auto views = Resolve(r, {dev});
  ASSERT_TRUE(views.ok());
  EXPECT_EQ(rt->Store(r.m, "t", r.Keys(), *views).status().code(), Code::kUnsupported);
  EXPECT_EQ(rt->Retrieve(r.m, "t", r.Keys(), *views).status().code(), Code::kUnsupported);
  EXPECT_EQ(rt->Load(r.m, "t", OwnedKeys::Of(r.Keys()), *views).status().code(), Code::kUnsupported);
  EXPECT_EQ(rt->Save(r.m, "t", OwnedKeys::Of(r.Keys()), *views).status().code(), Code::kUnsupported);
  // Layers 0-2 in device memory, 3-4 in host memory: refused before anything is touched.
  const std::vector<std::uint32_t> first = {0, 1, 2}, second = {3, 4};
  ViewSpec x = dev, y = dev;
  x.layers = first;
  x.num_layers = 3;
  y.memory = 0;
  y.data = b.data();
  y.layers = second;
  y.num_layers = 2;
  auto mixed = Resolve(r, {x, y});
  EXPECT_EQ(mixed.status().code(), Code::kInvalidArgument);
  ViewSpec z = dev;
  z.memory = 2;
  EXPECT_EQ(Resolve(r, {z}).status().code(), Code::kInvalidArgument);
}

TEST(DeviceViews, TheEmulatedDeviceCountsWhatCrosses) {
  auto d = MakeEmulatedDevice();
  EXPECT_TRUE(d->emulated());
  EXPECT_EQ(d->name(), "emulated");
  const std::vector<std::uint8_t> bytes(100, 3);
  Payload p = d->Allocate(100).value();
  ASSERT_TRUE(d->CopyToDevice(p.data(), bytes.data(), 100).ok());
  std::vector<std::uint8_t> back(100, 0);
  Payload q = d->Allocate(100).value();
  ASSERT_TRUE(d->CopyOnDevice(q.data(), p.data(), 100).ok());
  ASSERT_TRUE(d->CopyToHost(back.data(), q.data(), 100).ok());
  EXPECT_EQ(back, bytes);
  const DeviceCounters c = d->counters();
  EXPECT_EQ(c.h2d_bytes, 100u);
  EXPECT_EQ(c.d2d_bytes, 100u);
  EXPECT_EQ(c.d2h_bytes, 100u);
  EXPECT_FALSE(Device::DecodesOnDevice(codec::CodecId::kZstd));
  EXPECT_TRUE(Device::DecodesOnDevice(codec::CodecId::kTc));
  EXPECT_EQ(d->Decode({1, 1, 1, 1, 0}, codec::CodecId::kZstd, bytes.data(), 100, back.data()).code(), Code::kUnsupported);
  // A CUDA device is there only with CUDA and a GPU.
  EXPECT_EQ(MakeCudaDevice(0).ok(), testing::HaveGpu());
}

}  // namespace
}  // namespace kdn::store

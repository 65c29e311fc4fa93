// SPDX-License-Identifier: Apache-2.0
// The C ABI: kdn_runtime (create from options, stats, tier stats).
#include <cstring>

#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

extern "C" {

/* ---- runtime ---- */

static kdn_status CreateRuntime(const kdn_runtime_options* options, kdn_edit_fn editor, void* editor_user,
                                kdn_runtime** out) {
  if (kdn_status s = NotInEditor(); s != KDN_OK) return s;
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = nullptr;
  kdn_runtime_options o = KDN_RUNTIME_OPTIONS_INIT;
  if (options != nullptr) {
    if (kdn_status s = ReadIn(options, KDN_RUNTIME_OPTIONS_SIZE_V1, "kdn_runtime_options", &o); s != KDN_OK) return s;
    if (kdn_status s = CheckReserved(o.reserved0, "kdn_runtime_options"); s != KDN_OK) return s;
    if (kdn_status s = CheckReserved(o.reserved1, "kdn_runtime_options"); s != KDN_OK) return s;
  }
  if (o.load_slower_than_prefill > 1) {
    return Fail(KDN_ERR_INVALID_ARGUMENT,
                "load_slower_than_prefill " + std::to_string(o.load_slower_than_prefill) + " is neither 0 nor 1");
  }
  if (o.num_tiers > KDN_MAX_TIERS) return Fail(KDN_ERR_INVALID_ARGUMENT, "at most " + std::to_string(KDN_MAX_TIERS) + " tiers");
  if (o.num_tiers > 0 && o.tiers == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tiers is NULL");
  kdn::store::StoreOptions so;
  if (o.device_ordinal < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "device_ordinal " + std::to_string(o.device_ordinal) + " is negative");
  switch (Raw(o.device)) {
    case KDN_DEVICE_AUTO: {
      auto d = kdn::store::MakeCudaDevice(o.device_ordinal);
      if (d.ok()) {
        so.device = std::move(d).value();
      } else if (d.status().code() != kdn::Code::kUnsupported) {
        return FromStatus(d.status());  // a GPU, but not that one
      }
      break;
    }
    case KDN_DEVICE_NONE: break;
    case KDN_DEVICE_EMULATED: so.device = kdn::store::MakeEmulatedDevice(); break;
    case KDN_DEVICE_CUDA: {
      auto d = kdn::store::MakeCudaDevice(o.device_ordinal);
      if (!d.ok()) return FromStatus(d.status());
      so.device = std::move(d).value();
      break;
    }
    default: return Fail(KDN_ERR_INVALID_ARGUMENT, "unknown device mode " + std::to_string(Raw(o.device)));
  }
  so.chunk_tokens = o.chunk_tokens;
  so.recompute_when_faster = o.load_slower_than_prefill == 0;
  if (o.secret_file == nullptr && o.secret_file_len != 0) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "secret_file is NULL with a length");
  }
  if (o.secret_file != nullptr) {
    if (o.secret_file_len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "secret_file is empty (secret_file_len is 0)");
    so.secret_file.assign(o.secret_file, o.secret_file_len);
  }
  // Since 1.14: the master keys' source (a file, or a variable's name).
  for (auto [text, len, name, out] : {std::tuple{o.encryption_key_file, o.encryption_key_file_len, "encryption_key_file", &so.encryption_key_file},
                                      std::tuple{o.encryption_key_env, o.encryption_key_env_len, "encryption_key_env", &so.encryption_key_env}}) {
    if (text == nullptr && len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL with a length");
    if (text != nullptr) {
      if (len == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, std::string(name) + " is empty (its length is 0)");
      out->assign(text, len);
    }
  }
  so.host_capacity_bytes = o.host_capacity_bytes;
  so.hash_seed = o.hash_seed;
  size_t stride = 0;
  if (o.num_tiers > 0) {
    if (kdn_status s = ArrayStride(o.tiers, o.num_tiers, KDN_TIER_CONFIG_SIZE_V1, "tiers", &stride); s != KDN_OK) return s;
  }
  for (size_t i = 0; i < o.num_tiers; ++i) {
    kdn_tier_config c = KDN_TIER_CONFIG_INIT;
    const std::string what = "tiers[" + std::to_string(i) + "]";
    if (kdn_status s = ReadIn(At(o.tiers, stride, i), KDN_TIER_CONFIG_SIZE_V1, "kdn_tier_config", &c); s != KDN_OK) return s;
    kdn::store::TierSpec t;
    switch (Raw(c.kind)) {
      case KDN_TIER_HOST: t.kind = kdn::store::TierSpec::Kind::kHost; break;
      case KDN_TIER_DEVICE: t.kind = kdn::store::TierSpec::Kind::kDevice; break;
      case KDN_TIER_DISK: t.kind = kdn::store::TierSpec::Kind::kDisk; break;
      case KDN_TIER_REMOTE: t.kind = kdn::store::TierSpec::Kind::kRemote; break;
      case KDN_TIER_REDIS: t.kind = kdn::store::TierSpec::Kind::kRedis; break;
      default: return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown kind " + std::to_string(Raw(c.kind)));
    }
    if (c.reserved1 != 0) return Fail(KDN_ERR_VERSION, what + ": reserved1 is not 0");
    if ((c.address == nullptr && c.address_len != 0) || (c.token == nullptr && c.token_len != 0)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": address or token is NULL with a length");
    }
    if ((c.tls_ca_file == nullptr && c.tls_ca_file_len != 0) || (c.tls_server_name == nullptr && c.tls_server_name_len != 0)) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": tls_ca_file or tls_server_name is NULL with a length");
    }
    if (c.user == nullptr && c.user_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": user is NULL with a length");
    if (c.address_len > 4096 || c.token_len > 4096 || c.tls_ca_file_len > 4096 || c.tls_server_name_len > 4096 ||
        c.user_len > 4096) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": address, token, user or a TLS field longer than 4096 bytes");
    }
    // The strings as given (lengths checked above); the rules on them are
    // core's (ValidateTierSpec), the same as kdnd's config applies.
    const auto str = [](const char* p, size_t n) { return n == 0 ? std::string() : std::string(p, n); };
    t.address = str(c.address, c.address_len);
    t.token = str(c.token, c.token_len);
    t.user = str(c.user, c.user_len);
    t.tls_ca_file = str(c.tls_ca_file, c.tls_ca_file_len);
    t.tls_server_name = str(c.tls_server_name, c.tls_server_name_len);
    // A caller older than 1.3 never names a redis tier; one that does gets
    // user and ttl_ms from its struct, or their defaults when it is shorter.
    t.ttl_ms = c.ttl_ms;
    t.timeout_ms = c.timeout_ms == 0 ? kdn::store::kDefaultTierTimeoutMs : c.timeout_ms;
    t.capacity_bytes = c.capacity_bytes;
    if (c.path == nullptr && c.path_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": path is NULL");
    if (c.path_len > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": path longer than 4096 bytes");
    if (Raw(c.kind) == KDN_TIER_DISK) t.path = str(c.path, c.path_len);
    switch (Raw(c.policy)) {
      case KDN_EVICT_LRU: t.policy = kdn::store::PolicyKind::kLru; break;
      case KDN_EVICT_S3FIFO: t.policy = kdn::store::PolicyKind::kS3Fifo; break;
      case KDN_EVICT_COST: t.policy = kdn::store::PolicyKind::kCost; break;
      default: return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": unknown eviction policy " + std::to_string(Raw(c.policy)));
    }
    // 0: the default.
    t.high_watermark = c.high_watermark == 0.0f ? 0.95 : c.high_watermark;
    t.low_watermark = c.low_watermark == 0.0f ? kdn::store::DefaultLowWatermark(t.high_watermark) : c.low_watermark;
    t.write_through = c.write_through != 0;
    if (c.codec == nullptr && c.codec_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": codec is NULL");
    if (c.codec_len > 256) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": codec spec longer than 256 bytes");
    t.codec = str(c.codec, c.codec_len);  // empty: the kind's default
    if (c.levels == nullptr && c.levels_len != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": levels is NULL");
    if (c.levels_len > 2048) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": levels longer than 2048 bytes");
    if (c.levels_len != 0) {
      auto levels = kdn::store::ParseLevels(std::string_view(c.levels, c.levels_len));
      if (!levels.ok()) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": " + levels.status().message());
      t.levels = std::move(levels).value();
    }
    if (c.quotas == nullptr && c.num_quotas != 0) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": quotas is NULL");
    if (c.num_quotas > 4096) return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": more than 4096 quotas");
    if (c.num_quotas > 0) {
      size_t qstride = 0;
      if (kdn_status s = ArrayStride(c.quotas, c.num_quotas, KDN_QUOTA_SIZE_V1, (what + ".quotas").c_str(), &qstride);
          s != KDN_OK) {
        return s;
      }
      for (size_t j = 0; j < c.num_quotas; ++j) {
        const std::string qwhat = what + ".quotas[" + std::to_string(j) + "]";
        kdn_quota q = KDN_QUOTA_INIT;
        if (kdn_status s = ReadIn(At(c.quotas, qstride, j), KDN_QUOTA_SIZE_V1, "kdn_quota", &q); s != KDN_OK) return s;
        if (kdn_status s = CheckReserved(q.reserved0, qwhat); s != KDN_OK) return s;
        if (q.ns == nullptr || q.ns_len == 0 || q.ns_len > 4096) {
          return Fail(KDN_ERR_INVALID_ARGUMENT, qwhat + ": the namespace must be 1 to 4096 bytes");
        }
        t.quotas.push_back({std::string(q.ns, q.ns_len), q.bytes});
      }
    }
    if (auto st = kdn::store::ValidateTierSpec(t); !st.ok()) {
      return Fail(KDN_ERR_INVALID_ARGUMENT, what + ": " + st.message());
    }
    so.tiers.push_back(t);
  }
  if (editor) so.editor = std::make_shared<CallbackEditor>(editor, editor_user);
  // The rules on the options are core's (ValidateRuntimeOptions); worker_threads 0 is the ABI's default.
  kdn::store::RuntimeOptions ro;
  ro.store = std::move(so);
  ro.worker_threads = o.worker_threads == 0 ? 2 : static_cast<int>(std::min<uint32_t>(o.worker_threads, 1u << 20));
  auto rt = kdn::store::Runtime::Create(ro);
  if (!rt.ok()) return FromStatus(rt.status());
  auto handle = std::make_unique<kdn_runtime>();
  handle->rep = std::move(rt).value();
  *out = handle.release();
  return KDN_OK;
}

kdn_status kdn_runtime_create(const kdn_runtime_options* options, kdn_runtime** out) {
  KDN_BEGIN
  return CreateRuntime(options, nullptr, nullptr, out);
  KDN_END
}

kdn_status kdn_runtime_create_with_editor(const kdn_runtime_options* options, kdn_edit_fn editor, void* user,
                                          kdn_runtime** out) {
  KDN_BEGIN
  if (out != nullptr) *out = nullptr;
  if (editor == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "editor is NULL (use kdn_runtime_create)");
  return CreateRuntime(options, editor, user, out);
  KDN_END
}

void kdn_runtime_destroy(kdn_runtime* runtime) {
  // The last reference (this one, or a model's or op's later) finishes the
  // queued loads and saves and frees the store.
  if (runtime == nullptr || ReleasedElsewhereInEditor([runtime] { delete runtime; })) return;
  delete runtime;
}

kdn_status kdn_runtime_get_stats(kdn_runtime* runtime, kdn_stats* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_STATS_SIZE_V1, "kdn_stats"); s != KDN_OK) return s;
  WriteOut(kdn_stats(KDN_STATS_INIT), out);
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  kdn::store::KvStore& store = runtime->rep->store();
  const kdn::store::Telemetry t = store.Stats();
  const kdn::store::StoreCounters c = store.chain().Counters();
  kdn_stats full = KDN_STATS_INIT;
  full.lookups = t.lookups;
  full.retrieves = t.retrieves;
  full.stores = t.stores;
  full.hits = t.hits;
  full.misses = t.misses;
  full.tokens_served = t.tokens_served;
  full.tokens_stored = t.tokens_stored;
  full.bytes_served = t.bytes_served;
  full.bytes_stored = t.bytes_stored;
  for (const kdn::store::LevelStats& l : store.chain().Stats()) {
    full.chunks += l.objects;
    full.used_bytes += l.used_bytes;
    full.capacity_bytes += l.capacity_bytes;
    full.evictions += l.evictions;
    full.corrupt_detected += l.corrupt_detected;
  }
  full.edited_served = t.edited_served;
  full.leases_active = c.leases_active;
  full.pins_active = c.pins_active;
  full.pins_forced_unpin = c.pins_forced_unpin;
  full.edits = c.edits;
  full.tokens_requested = t.tokens_requested;
  full.prefill_tokens = t.prefill_tokens;
  full.prefill_ns = t.prefill_ns;
  full.ttft_saved_ns = t.ttft_saved_ns;
  full.tokens_served_unpriced = t.tokens_served_unpriced;
  full.delivery_ns = t.delivery_ns;
  full.lookup_tokens = t.lookup_tokens;
  full.lookup_hit_tokens = t.lookup_hit_tokens;
  full.recompute_tokens = t.recompute_tokens;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_latency(kdn_runtime* runtime, kdn_latency_kind kind, kdn_latency* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_LATENCY_SIZE_V1, "kdn_latency"); s != KDN_OK) return s;
  WriteOut(kdn_latency(KDN_LATENCY_INIT), out);
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  const kdn::store::Telemetry t = runtime->rep->store().Stats();
  const kdn::telemetry::HistogramSnapshot* h = nullptr;
  switch (Raw(kind)) {
    case KDN_LATENCY_LOOKUP: h = &t.lookup_us; break;
    case KDN_LATENCY_LOAD: h = &t.load_us; break;
    case KDN_LATENCY_STORE: h = &t.store_us; break;
    default: return Fail(KDN_ERR_INVALID_ARGUMENT, "unknown latency kind " + std::to_string(Raw(kind)));
  }
  kdn_latency full = KDN_LATENCY_INIT;
  full.count = h->count;
  full.mean_us = h->mean();
  full.p50_us = h->p50;
  full.p90_us = h->p90;
  full.p99_us = h->p99;
  full.max_us = h->max;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_tier_count(kdn_runtime* runtime, uint32_t* out) {
  KDN_BEGIN
  if (out != nullptr) *out = 0;
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = static_cast<uint32_t>(runtime->rep->store().chain().levels());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_quota_stats(kdn_runtime* runtime, uint32_t index, kdn_quota_stats* out, size_t capacity,
                                      size_t* out_count) {
  KDN_BEGIN
  if (out_count != nullptr) *out_count = 0;
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const kdn::store::TieredStore& chain = runtime->rep->store().chain();
  if (index >= chain.levels()) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "tier " + std::to_string(index) + " of " + std::to_string(chain.levels()));
  }
  size_t stride = 0;
  if (capacity > 0) {
    if (kdn_status s = ArrayStride(out, capacity, KDN_QUOTA_STATS_SIZE_V1, "out", &stride); s != KDN_OK) return s;
  }
  const std::vector<kdn::store::NamespaceUse> uses = chain.Namespaces(index);
  for (size_t i = 0; i < std::min(capacity, uses.size()); ++i) {
    const kdn::store::NamespaceUse& u = uses[i];
    kdn_quota_stats q = KDN_QUOTA_STATS_INIT;
    std::memcpy(q.ns_hash, u.ns.data(), sizeof q.ns_hash);
    q.quota_bytes = u.quota_bytes;
    q.used_bytes = u.used_bytes;
    q.objects = u.objects;
    q.quota_evictions = u.quota_evictions;
    q.room_evictions = u.room_evictions;
    q.refused = u.refused;
    WriteOut(q, At(out, stride, i));
  }
  *out_count = uses.size();
  return KDN_OK;
  KDN_END
}

kdn_status kdn_runtime_get_tier_stats(kdn_runtime* runtime, uint32_t index, kdn_tier_stats* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_TIER_STATS_SIZE_V1, "kdn_tier_stats"); s != KDN_OK) return s;
  WriteOut(kdn_tier_stats(KDN_TIER_STATS_INIT), out);
  if (kdn_status s = CheckRuntime(runtime); s != KDN_OK) return s;
  const auto levels = runtime->rep->store().chain().Stats();
  if (index >= levels.size()) {
    return Fail(KDN_ERR_INVALID_ARGUMENT, "tier " + std::to_string(index) + " of " + std::to_string(levels.size()));
  }
  const kdn::store::LevelStats& l = levels[index];
  kdn_tier_stats full = KDN_TIER_STATS_INIT;
  switch (runtime->rep->tier_kind(index)) {
    case kdn::store::TierSpec::Kind::kHost: full.kind = KDN_TIER_HOST; break;
    case kdn::store::TierSpec::Kind::kDevice: full.kind = KDN_TIER_DEVICE; break;
    case kdn::store::TierSpec::Kind::kDisk: full.kind = KDN_TIER_DISK; break;
    case kdn::store::TierSpec::Kind::kRemote: full.kind = KDN_TIER_REMOTE; break;
    case kdn::store::TierSpec::Kind::kRedis: full.kind = KDN_TIER_REDIS; break;
  }
  std::snprintf(full.name, sizeof full.name, "%s", l.name.c_str());
  std::snprintf(full.codec, sizeof full.codec, "%s", l.codec.c_str());
  full.hits = l.hits;
  full.misses = l.misses;
  full.puts = l.puts;
  full.put_refusals = l.put_refusals;
  full.evictions = l.evictions;
  full.demotions_in = l.demotions_in;
  full.promotions_in = l.promotions_in;
  full.bytes_in = l.bytes_in;
  full.bytes_out = l.bytes_out;
  full.objects = l.objects;
  full.used_bytes = l.used_bytes;
  full.capacity_bytes = l.capacity_bytes;
  full.corrupt_detected = l.corrupt_detected;
  full.encoded_chunks = l.encoded_chunks;
  full.bytes_before_encoding = l.bytes_before_encoding;
  full.bytes_after_encoding = l.bytes_after_encoding;
  full.encode_failures = l.encode_failures;
  full.decode_failures = l.decode_failures;
  full.io_errors = l.io_errors;
  // The watermarks of the tiers that evict (remote and redis tiers leave
  // that to their server: 0).
  const std::vector<kdn::store::TierSpec>& specs = runtime->rep->store().options().tiers;
  if (index < specs.size() && (full.kind == KDN_TIER_HOST || full.kind == KDN_TIER_DEVICE || full.kind == KDN_TIER_DISK)) {
    full.high_watermark = specs[index].high_watermark;
    full.low_watermark = specs[index].low_watermark;
  }
  // A networked tier's transport (a tier with quality levels: the one it wraps).
  const kdn::store::TransportCounters tc = runtime->rep->store().chain().tier(index).transport_counters();
  full.remote_calls = tc.calls;
  full.remote_failed_calls = tc.failed_calls;
  full.remote_timeouts = tc.timeouts;
  full.write_queue_full = tc.queue_full;
  full.write_queued_bytes = tc.queued_bytes;
  const kdn::store::KvStore::DeliveryRate host = runtime->rep->store().Rate(index, false);
  const kdn::store::KvStore::DeliveryRate dev = runtime->rep->store().Rate(index, true);
  full.delivery_ns_per_token = host.ns_per_token;
  full.device_delivery_ns_per_token = dev.ns_per_token;
  full.recompute_chunks = host.recompute_chunks + dev.recompute_chunks;
  full.auth_failures = l.auth_failures;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

}  // extern "C"

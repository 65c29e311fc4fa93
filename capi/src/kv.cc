// SPDX-License-Identifier: Apache-2.0
// The C ABI: lookups, stores, retrieves, asynchronous loads and saves.
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

extern "C" {

/* ---- KV ---- */

kdn_status kdn_kv_lookup(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* requests,
                         size_t num_requests, kdn_lookup_result* results) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (num_requests == 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "no requests (num_requests is 0)");
  if (requests == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "requests is NULL");
  if (results == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "results is NULL");
  size_t in_stride = 0, out_stride = 0;
  if (kdn_status s = ArrayStride(requests, num_requests, KDN_REQUEST_SIZE_V1, "requests", &in_stride); s != KDN_OK) return s;
  if (kdn_status s = ArrayStride(results, num_requests, KDN_LOOKUP_RESULT_SIZE_V1, "results", &out_stride); s != KDN_OK) {
    return s;
  }
  kdn::store::KvStore& store = model->runtime->store();
  for (size_t i = 0; i < num_requests; ++i) {
    kdn_lookup_result r = KDN_LOOKUP_RESULT_INIT;
    kdn::store::OwnedKeys keys;
    r.status = ReadRequest(store, At(requests, in_stride, i), "requests[" + std::to_string(i) + "]", &keys);
    if (r.status == KDN_OK) {
      // A grouped model: the one rule for hits (per tier too).
      const auto found = model->grouped
                             ? kdn::store::GroupedLookup(store, *model->grouped, std::string_view(ns, ns_len), keys.keys())
                             : store.Lookup(model->kv, std::string_view(ns, ns_len), keys.keys());
      r.cached_tokens = found.tokens;
      r.num_tiers = static_cast<uint32_t>(std::min<size_t>(found.tier_tokens.size(), KDN_MAX_TIERS));
      for (uint32_t t = 0; t < r.num_tiers; ++t) r.tier_tokens[t] = found.tier_tokens[t];
    }
    WriteOut(r, At(results, out_stride, i));
  }
  g_last_error.clear();  // the batch succeeded; each result carries its request's status
  return KDN_OK;
  KDN_END
}

kdn_status kdn_kv_store(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                        const kdn_kv_view* views, size_t num_views, kdn_kv_result* out) {
  KDN_BEGIN
  if (out != nullptr) {
    if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
    WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  }
  kdn::store::OwnedKeys keys;
  kdn::store::ResolvedViews resolved;
  std::vector<void*> state;
  if (kdn_status s = ReadKvCall(model, ns, ns_len, request, views, num_views, &keys, &resolved, nullptr, &state);
      s != KDN_OK) {
    return s;
  }
  auto stored = model->grouped ? kdn::store::GroupedStore(model->runtime->store(), *model->grouped,
                                                          std::string_view(ns, ns_len), keys.keys(), resolved.groups(), state)
                               : model->runtime->Store(model->kv, std::string_view(ns, ns_len), keys.keys(), resolved);
  if (!stored.ok()) return FromStatus(stored.status());
  if (out != nullptr) {
    kdn_kv_result r = KDN_KV_RESULT_INIT;
    r.state = KDN_OP_DONE;
    r.tokens = *stored;
    WriteOut(r, out);
  }
  return KDN_OK;
  KDN_END
}

kdn_status kdn_kv_retrieve(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                           const kdn_kv_view* views, size_t num_views, kdn_kv_result* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
  WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  kdn::store::OwnedKeys keys;
  kdn::store::ResolvedViews resolved;
  std::uint64_t target_us = 0;
  std::vector<void*> state;
  if (kdn_status s = ReadKvCall(model, ns, ns_len, request, views, num_views, &keys, &resolved, &target_us, &state);
      s != KDN_OK) {
    return s;
  }
  auto filled = model->grouped
                    ? kdn::store::GroupedRetrieve(model->runtime->store(), *model->grouped, std::string_view(ns, ns_len),
                                                  keys.keys(), resolved.groups(), state)
                    : model->runtime->Retrieve(model->kv, std::string_view(ns, ns_len), keys.keys(), resolved,
                                               Deliver(target_us));
  if (!filled.ok()) return FromStatus(filled.status());
  kdn_kv_result r = KDN_KV_RESULT_INIT;
  r.state = KDN_OP_DONE;
  r.tokens = filled->tokens;
  r.covered = filled->covered;
  r.flags = filled->lossy ? KDN_RESULT_LOSSY : 0u;
  WriteOut(r, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_kv_load_async(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                             const kdn_kv_view* views, size_t num_views, kdn_op** out) {
  KDN_BEGIN
  return StartOp(model, ns, ns_len, request, views, num_views, out, &kdn_op::load,
                 [model](kdn::store::Runtime& rt, const kdn::store::ModelKv& m, std::string n, kdn::store::OwnedKeys k,
                         const kdn::store::ResolvedViews& v, const kdn::store::DeliveryTarget& t,
                         std::vector<void*> state) -> kdn::Result<std::shared_ptr<kdn::store::LoadOp>> {
                   if (!model->grouped) return rt.Load(m, std::move(n), std::move(k), v, t);
                   return kdn::store::LoadOp::Start(rt.store(), rt.executor(), m, std::move(n), std::move(k), v.groups(),
                                                    false, t, model->grouped, std::move(state));
                 });
  KDN_END
}

kdn_status kdn_kv_save_async(const kdn_model* model, const char* ns, size_t ns_len, const kdn_request* request,
                             const kdn_kv_view* views, size_t num_views, kdn_op** out) {
  KDN_BEGIN
  return StartOp(model, ns, ns_len, request, views, num_views, out, &kdn_op::save,
                 [model](kdn::store::Runtime& rt, const kdn::store::ModelKv& m, std::string n, kdn::store::OwnedKeys k,
                         const kdn::store::ResolvedViews& v, const kdn::store::DeliveryTarget&,
                         std::vector<void*> state) -> kdn::Result<std::shared_ptr<kdn::store::SaveOp>> {
                   if (!model->grouped) return rt.Save(m, std::move(n), std::move(k), v);
                   return kdn::store::SaveOp::Start(rt.store(), rt.executor(), m, std::move(n), std::move(k), v.groups(),
                                                    false, model->grouped, std::move(state));
                 });
  KDN_END
}

}  // extern "C"

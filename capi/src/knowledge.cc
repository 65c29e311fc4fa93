// SPDX-License-Identifier: Apache-2.0
// The C ABI: knowledge items (put, info, list, pin, expire, delete, fetch).
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

namespace {
// Knowledge items are position-free documents blended into prompts: a
// recurrent state belongs to one prefix, and blending such a model is not
// built (docs/model-kinds.md).
constexpr const char* kGroupedKnowledge =
    "knowledge items of a model with sliding-window or recurrent layers are not supported yet";
}  // namespace

extern "C" {

/* ---- knowledge ---- */

kdn_status kdn_knowledge_put(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                             size_t doc_id_len, uint64_t version, const char* metadata, size_t metadata_len,
                             const int32_t* tokens, size_t num_tokens, const kdn_kv_view* views, size_t num_views) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (kdn_status s = CheckTokens(tokens, num_tokens, "document"); s != KDN_OK) return s;
  if (metadata == nullptr && metadata_len > 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "metadata is NULL");
  if (metadata_len > (size_t{1} << 20)) return Fail(KDN_ERR_INVALID_ARGUMENT, "metadata longer than 1 MiB");
  if (model->grouped) return Fail(KDN_ERR_UNSUPPORTED, kGroupedKnowledge);
  kdn::store::ResolvedViews resolved;
  if (kdn_status s = ResolveViews(model, views, num_views, num_tokens, &resolved); s != KDN_OK) return s;
  return FromStatus(model->runtime->knowledge().Put(model->kv, std::string_view(ns, ns_len),
                                                   std::string(doc_id, doc_id_len), version,
                                                   std::string(metadata ? metadata : "", metadata_len),
                                                   {tokens, num_tokens}, resolved));
  KDN_END
}

static void InfoOf(const kdn::store::DocumentInfo& d, int64_t now_ns, kdn_document_info* info) {
  info->doc_id_len = static_cast<uint32_t>(d.doc_id.size());
  std::snprintf(info->doc_id, sizeof info->doc_id, "%s", d.doc_id.c_str());
  info->version = d.version;
  info->num_tokens = d.tokens;
  info->chunks = d.chunks;
  info->chunks_present = d.chunks_present;
  info->pinned = d.pinned ? 1u : 0u;
  info->expires_in_ms = d.expires_at_ns == 0 ? -1 : std::max<int64_t>(0, (d.expires_at_ns - now_ns) / 1000000);
  info->hits = d.hits;
  info->pin_expires_in_ms =
      d.pinned && d.pin_expires_at_ns != 0 ? std::max<int64_t>(0, (d.pin_expires_at_ns - now_ns) / 1000000) : -1;
}

kdn_status kdn_knowledge_get_info(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                                  size_t doc_id_len, kdn_document_info* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_DOCUMENT_INFO_SIZE_V1, "kdn_document_info"); s != KDN_OK) return s;
  WriteOut(kdn_document_info(KDN_DOCUMENT_INFO_INIT), out);
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  auto d = model->runtime->knowledge().Info(model->kv, std::string_view(ns, ns_len), std::string(doc_id, doc_id_len));
  if (!d.ok()) return FromStatus(d.status());
  kdn_document_info info = KDN_DOCUMENT_INFO_INIT;
  InfoOf(*d, model->runtime->store().chain().clock().NowNs(), &info);
  WriteOut(info, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_knowledge_list(const kdn_model* model, const char* ns, size_t ns_len, kdn_document_info* out,
                              size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (out_count != nullptr) *out_count = 0;
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  size_t stride = 0;
  if (capacity > 0) {
    if (kdn_status s = ArrayStride(out, capacity, KDN_DOCUMENT_INFO_SIZE_V1, "out", &stride); s != KDN_OK) return s;
  }
  const auto docs = model->runtime->knowledge().List(model->kv, std::string_view(ns, ns_len));
  const int64_t now = model->runtime->store().chain().clock().NowNs();
  for (size_t i = 0; i < std::min(capacity, docs.size()); ++i) {
    kdn_document_info info = KDN_DOCUMENT_INFO_INIT;
    InfoOf(docs[i], now, &info);
    WriteOut(info, At(out, stride, i));
  }
  *out_count = docs.size();
  return KDN_OK;
  KDN_END
}

kdn_status kdn_knowledge_pin(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                             size_t doc_id_len, int64_t ttl_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (ttl_ms < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms must not be negative");
  if (ttl_ms > (int64_t{1} << 43)) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms above 2^43 (278 years)");
  return FromStatus(model->runtime->knowledge().Pin(model->kv, std::string_view(ns, ns_len),
                                                   std::string(doc_id, doc_id_len), true, ttl_ms * 1000000));
  KDN_END
}

kdn_status kdn_knowledge_unpin(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                               size_t doc_id_len) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  return FromStatus(model->runtime->knowledge().Pin(model->kv, std::string_view(ns, ns_len),
                                                   std::string(doc_id, doc_id_len), false, 0));
  KDN_END
}

kdn_status kdn_knowledge_expire(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                                size_t doc_id_len, int64_t ttl_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (ttl_ms < 0) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms must not be negative");
  if (ttl_ms > (int64_t{1} << 43)) return Fail(KDN_ERR_INVALID_ARGUMENT, "ttl_ms above 2^43 (278 years)");
  return FromStatus(model->runtime->knowledge().Expire(model->kv, std::string_view(ns, ns_len),
                                                      std::string(doc_id, doc_id_len), ttl_ms * 1000000));
  KDN_END
}

kdn_status kdn_knowledge_delete(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                                size_t doc_id_len) {
  KDN_BEGIN
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  return FromStatus(model->runtime->knowledge().Delete(model->kv, std::string_view(ns, ns_len),
                                                      std::string(doc_id, doc_id_len)));
  KDN_END
}

kdn_status kdn_knowledge_fetch(const kdn_model* model, const char* ns, size_t ns_len, const char* doc_id,
                               size_t doc_id_len, const kdn_kv_view* views, size_t num_views, int32_t* tokens,
                               size_t tokens_capacity, kdn_kv_result* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
  WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  if (kdn_status s = CheckTarget(model, ns, ns_len); s != KDN_OK) return s;
  if (kdn_status s = CheckDocId(doc_id, doc_id_len); s != KDN_OK) return s;
  if (tokens_capacity > 0 && tokens == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "tokens is NULL");
  if (num_views > 0 && views == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "views is NULL");
  std::uint64_t room = UINT64_MAX;
  if (tokens != nullptr) room = tokens_capacity;
  kdn::store::ResolvedViews resolved;
  const bool with_kv = num_views > 0;
  if (with_kv && model->grouped) return Fail(KDN_ERR_UNSUPPORTED, kGroupedKnowledge);
  if (with_kv) {
    if (kdn_status s = ResolveViews(model, views, num_views, std::nullopt, &resolved); s != KDN_OK) return s;
    room = std::min(room, resolved.room());
  }
  std::vector<int32_t> doc_tokens;
  bool lossy = false;
  const kdn::Status st = model->runtime->knowledge().Fetch(model->kv, std::string_view(ns, ns_len),
                                                           std::string(doc_id, doc_id_len), with_kv ? &resolved : nullptr,
                                                           room, &doc_tokens, &lossy);
  if (st.ok() || st.code() == kdn::Code::kBufferTooSmall) {
    kdn_kv_result r = KDN_KV_RESULT_INIT;
    r.state = st.ok() ? KDN_OP_DONE : KDN_OP_FAILED;
    r.status = AbiStatus(st.code());
    r.tokens = doc_tokens.size();
    r.flags = lossy ? KDN_RESULT_LOSSY : 0u;
    WriteOut(r, out);
  }
  if (!st.ok()) return FromStatus(st);
  if (tokens != nullptr) std::copy(doc_tokens.begin(), doc_tokens.end(), tokens);
  return KDN_OK;
  KDN_END
}

}  // extern "C"

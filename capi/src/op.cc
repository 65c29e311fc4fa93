// SPDX-License-Identifier: Apache-2.0
// The C ABI: kdn_op (an asynchronous load or save in flight).
#include "calls.h"
#include "shim.h"

using namespace kdn::capi;

extern "C" {

/* ---- ops ---- */

kdn_status kdn_op_layer_ready(kdn_op* op, uint32_t layer) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (op->save == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is not a save");
  return FromStatus(op->save->SaveLayer(layer));
  KDN_END
}

kdn_status kdn_op_wait_layer(kdn_op* op, uint32_t layer, int64_t timeout_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (op->load == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "op is not a load");
  return FromStatus(op->load->WaitLayer(layer, timeout_ms));
  KDN_END
}

kdn_status kdn_op_wait(kdn_op* op, int64_t timeout_ms) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  return FromStatus(op->rep->Wait(timeout_ms));
  KDN_END
}

kdn_status kdn_op_poll(kdn_op* op, kdn_op_state* out) {
  KDN_BEGIN
  if (out != nullptr) *out = KDN_OP_PENDING;
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  *out = StateOf(op->rep->Poll());
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_cancel(kdn_op* op) {
  KDN_BEGIN
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  op->rep->Cancel();
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_get_result(kdn_op* op, kdn_kv_result* out) {
  KDN_BEGIN
  if (kdn_status s = CheckOut(out, KDN_KV_RESULT_SIZE_V1, "kdn_kv_result"); s != KDN_OK) return s;
  WriteOut(kdn_kv_result(KDN_KV_RESULT_INIT), out);
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  const kdn::store::OpResult r = op->rep->Outcome();
  kdn_kv_result full = KDN_KV_RESULT_INIT;
  full.state = StateOf(r.state);
  full.status = AbiStatus(r.status.code());
  full.tokens = r.tokens;
  full.covered = r.covered;
  full.num_failed = r.failed.size();
  full.flags = r.lossy ? KDN_RESULT_LOSSY : 0u;
  WriteOut(full, out);
  return KDN_OK;
  KDN_END
}

kdn_status kdn_op_get_failed_ranges(kdn_op* op, kdn_token_range* out, size_t capacity, size_t* out_count) {
  KDN_BEGIN
  if (out_count != nullptr) *out_count = 0;
  if (kdn_status s = CheckOp(op); s != KDN_OK) return s;
  if (out_count == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out_count is NULL");
  if (capacity > 0 && out == nullptr) return Fail(KDN_ERR_INVALID_ARGUMENT, "out is NULL");
  const kdn::store::OpResult r = op->rep->Outcome();
  *out_count = r.failed.size();
  for (size_t i = 0; i < std::min(capacity, r.failed.size()); ++i) out[i] = {r.failed[i].begin, r.failed[i].end};
  return KDN_OK;
  KDN_END
}

void kdn_op_destroy(kdn_op* op) {
  if (!op) return;
  op->rep->Cancel();
  auto finish = [op] {
    // Nothing reads or writes the caller's KV once this is done: a load
    // runs to its cancel point, a save's queued layer copies finish.
    if (op->load) (void)op->rep->Wait(-1);
    if (op->save) op->save->Drain();
    delete op;  // the runtime reference goes last (member order)
  };
  if (ReleasedElsewhereInEditor(finish)) return;
  finish();
}

}  // extern "C"

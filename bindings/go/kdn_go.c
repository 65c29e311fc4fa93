// SPDX-License-Identifier: Apache-2.0
/* The Go binding's C shims (see kdn_go.h). cgo compiles this file with the
 * package. */
#include "kdn_go.h"

#include <stdlib.h>
#include <string.h>

#include "_cgo_export.h" /* kdnGoEdit, the editor trampoline */

/* ---- Helpers --------------------------------------------------------------- */

static char *dup_message(const char *m) {
  size_t n = strlen(m);
  char *s = malloc(n + 1);
  if (s != NULL) memcpy(s, m, n + 1);
  return s;
}

/* The status with, on failure, this thread's last error message. */
static kdn_go_ret ret(kdn_status status) {
  kdn_go_ret r;
  r.status = status;
  r.msg = status == KDN_OK ? NULL : dup_message(kdn_last_error_message());
  return r;
}

/* A failure of the shim itself (before kdn was called). */
static kdn_go_ret fail(kdn_status status, const char *message) {
  kdn_go_ret r;
  r.status = status;
  r.msg = dup_message(message);
  return r;
}

static kdn_request make_request(kdn_go_req in, const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts) {
  kdn_request r = KDN_REQUEST_INIT; /* the same as kdn_request_init, without a call */
  r.hash_bytes = in.hash_bytes;
  r.tokens = in.tokens_off >= 0 && tokens != NULL ? tokens + in.tokens_off : NULL;
  r.num_tokens = (size_t)in.num_tokens;
  r.block_hashes = in.hashes_off >= 0 && hashes != NULL ? hashes + in.hashes_off : NULL;
  r.num_blocks = (size_t)in.num_blocks;
  r.block_tokens = in.block_tokens;
  r.ttft_target_us = in.ttft_target_us;
  r.salt = in.salt_off >= 0 && salts != NULL ? salts + in.salt_off : NULL;
  r.salt_len = r.salt != NULL ? (size_t)in.salt_len : 0;
  return r;
}

/* The views of a call, built in C memory: small calls on the stack. */
enum { STACK_VIEWS = 4, STACK_PTRS = 64 };
typedef struct views {
  kdn_kv_view stack_views[STACK_VIEWS];
  void *stack_ptrs[STACK_PTRS];
  kdn_kv_view *views;
  void **ptrs;
} views;

static void views_free(views *v) {
  if (v->views != v->stack_views) free(v->views);
  if (v->ptrs != v->stack_ptrs) free(v->ptrs);
}

/* Fills v->views from the templates; 0 on success, or a status. */
static kdn_status views_build(views *v, const kdn_kv_view *tmpl, const kdn_go_view_aux *aux, size_t n,
                              const uint32_t *layers, const int64_t *offsets, const int32_t *table, void *data,
                              size_t data_len, void *state, kdn_go_mem mem) {
  size_t i, j, total = 0, used = 0;
  if (state == NULL) state = data; /* host memory: the state is never on the device */
  if (mem.device != 0) data = (void *)mem.device;
  v->views = v->stack_views;
  v->ptrs = v->stack_ptrs;
  for (i = 0; i < n; ++i) {
    if (aux[i].k_off >= 0) total += 2 * (size_t)aux[i].num_ptrs;
    if (aux[i].state_off >= 0) total += (size_t)aux[i].num_state;
  }
  if (n > STACK_VIEWS) v->views = malloc(n * sizeof(kdn_kv_view));
  if (total > STACK_PTRS) v->ptrs = malloc(total * sizeof(void *));
  if (v->views == NULL || v->ptrs == NULL) {
    views_free(v);
    return KDN_ERR_NO_MEMORY;
  }
  for (i = 0; i < n; ++i) {
    kdn_kv_view *out = &v->views[i];
    *out = tmpl[i];
    out->struct_size = sizeof(kdn_kv_view);
    out->memory = mem.device != 0 ? KDN_MEMORY_DEVICE : KDN_MEMORY_HOST;
    out->cuda_stream = (void *)mem.stream;
    out->layers = aux[i].layers_off >= 0 ? layers + aux[i].layers_off : NULL;
    out->block_table = aux[i].table_off >= 0 ? table + aux[i].table_off : NULL;
    if (aux[i].k_off >= 0) {
      void **k = v->ptrs + used, **vv = k + aux[i].num_ptrs;
      for (j = 0; j < (size_t)aux[i].num_ptrs; ++j) {
        k[j] = (char *)data + offsets[aux[i].k_off + j];
        vv[j] = (char *)data + offsets[aux[i].v_off + j];
      }
      used += 2 * (size_t)aux[i].num_ptrs;
      out->k_layers = k;
      out->v_layers = vv;
      out->data = NULL;
      out->size_bytes = 0;
    } else {
      out->k_layers = NULL;
      out->v_layers = NULL;
      out->data = data;
      out->size_bytes = data != NULL ? data_len : 0;
    }
    out->state_layers = NULL;
    if (aux[i].state_off >= 0) {
      void **st = v->ptrs + used;
      for (j = 0; j < (size_t)aux[i].num_state; ++j) st[j] = (char *)state + offsets[aux[i].state_off + j];
      used += (size_t)aux[i].num_state;
      out->state_layers = st;
    }
  }
  return KDN_OK;
}

/* ---- Runtime and model ------------------------------------------------------ */

/* Set on the mover thread while the Go editor runs. */
static __thread int in_editor;

int kdn_go_in_editor(void) { return in_editor; }

static kdn_status edit_shim(void *user, const kdn_chunk_info *info, void *kv, size_t kv_bytes, int *out_changed) {
  kdn_status s;
  in_editor = 1;
  s = kdnGoEdit((uintptr_t)user, (kdn_chunk_info *)info, kv, kv_bytes, out_changed);
  in_editor = 0;
  return s;
}

kdn_go_ret kdn_go_runtime_create(const kdn_runtime_options *options, uintptr_t editor, kdn_runtime **out) {
  if (editor != 0) return ret(kdn_runtime_create_with_editor(options, edit_shim, (void *)editor, out));
  return ret(kdn_runtime_create(options, out));
}

kdn_go_ret kdn_go_model_create(kdn_runtime *rt, const kdn_model_spec *spec_in, const char *fingerprint,
                               size_t fingerprint_len, kdn_model **out, uint64_t *bytes_per_token,
                               uint8_t *fingerprint_out) {
  kdn_model_spec spec = *spec_in;
  kdn_status s;
  spec.fingerprint = fingerprint;
  spec.fingerprint_len = fingerprint_len;
  s = kdn_model_create(rt, &spec, out);
  if (s != KDN_OK) return ret(s);
  s = kdn_model_get_kv_bytes_per_token(*out, bytes_per_token);
  if (s == KDN_OK) s = kdn_model_get_fingerprint(*out, fingerprint_out);
  if (s != KDN_OK) {
    kdn_go_ret r = ret(s);
    kdn_model_destroy(*out);
    *out = NULL;
    return r;
  }
  return ret(KDN_OK);
}

kdn_go_ret kdn_go_model_report_prefill(const kdn_model *m, uint64_t tokens, uint64_t elapsed_ns) {
  return ret(kdn_model_report_prefill(m, tokens, elapsed_ns));
}

/* ---- KV calls ---------------------------------------------------------------- */

kdn_go_kvret kdn_go_kv_call(int which, const kdn_model *m, const char *ns, size_t ns_len, kdn_go_req req_in,
                            const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts,
                            const kdn_kv_view *tmpl, const kdn_go_view_aux *aux, size_t num_views,
                            const uint32_t *layers, const int64_t *offsets, const int32_t *table, void *data,
                            size_t data_len, void *state, kdn_go_mem mem, kdn_op **op) {
  kdn_go_kvret r;
  kdn_go_ret st;
  kdn_request req = make_request(req_in, tokens, hashes, salts);
  const kdn_kv_result init = KDN_KV_RESULT_INIT;
  views v;
  kdn_status s;
  r.result = init;
  if (op != NULL) *op = NULL;
  s = views_build(&v, tmpl, aux, num_views, layers, offsets, table, data, data_len, state, mem);
  if (s != KDN_OK) {
    st = fail(s, "out of memory building the views");
  } else {
    switch (which) {
      case KDN_GO_STORE: s = kdn_kv_store(m, ns, ns_len, &req, v.views, num_views, &r.result); break;
      case KDN_GO_RETRIEVE: s = kdn_kv_retrieve(m, ns, ns_len, &req, v.views, num_views, &r.result); break;
      case KDN_GO_LOAD: s = kdn_kv_load_async(m, ns, ns_len, &req, v.views, num_views, op); break;
      case KDN_GO_SAVE: s = kdn_kv_save_async(m, ns, ns_len, &req, v.views, num_views, op); break;
      default: s = KDN_ERR_INVALID_ARGUMENT; break;
    }
    st = ret(s);
    views_free(&v);
  }
  r.status = st.status;
  r.msg = st.msg;
  return r;
}

kdn_go_lookupret kdn_go_lookup1(const kdn_model *m, const char *ns, size_t ns_len, kdn_go_req req_in,
                                const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts) {
  kdn_go_lookupret r;
  kdn_go_ret st;
  kdn_request req = make_request(req_in, tokens, hashes, salts);
  const kdn_lookup_result init = KDN_LOOKUP_RESULT_INIT;
  r.result = init;
  st = ret(kdn_kv_lookup(m, ns, ns_len, &req, 1, &r.result));
  r.status = st.status;
  r.msg = st.msg;
  return r;
}

kdn_go_ret kdn_go_lookup(const kdn_model *m, const char *ns, size_t ns_len, const kdn_go_req *reqs, size_t num,
                         const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts,
                         kdn_lookup_result *results) {
  kdn_request stack[16];
  kdn_request *req = num <= 16 ? stack : malloc(num * sizeof(kdn_request));
  kdn_go_ret r;
  size_t i;
  if (req == NULL) return fail(KDN_ERR_NO_MEMORY, "out of memory building the requests");
  for (i = 0; i < num; ++i) {
    req[i] = make_request(reqs[i], tokens, hashes, salts);
    kdn_lookup_result_init(&results[i], sizeof results[i]);
  }
  r = ret(kdn_kv_lookup(m, ns, ns_len, num ? req : NULL, num, results));
  if (req != stack) free(req);
  return r;
}

/* ---- Knowledge items -------------------------------------------------------- */

kdn_go_ret kdn_go_knowledge_put(const kdn_model *m, const char *ns, size_t ns_len, const char *doc, size_t doc_len,
                                uint64_t version, const char *meta, size_t meta_len, const int32_t *doc_tokens,
                                size_t num_tokens, const kdn_kv_view *tmpl, const kdn_go_view_aux *aux,
                                size_t num_views, const uint32_t *layers, const int64_t *offsets,
                                const int32_t *table, void *data, size_t data_len) {
  views v;
  kdn_go_ret r;
  const kdn_go_mem host = {0, 0}; /* the knowledge calls take host memory only */
  kdn_status s = views_build(&v, tmpl, aux, num_views, layers, offsets, table, data, data_len, NULL, host);
  if (s != KDN_OK) return fail(s, "out of memory building the views");
  r = ret(kdn_knowledge_put(m, ns, ns_len, doc, doc_len, version, meta, meta_len, doc_tokens, num_tokens,
                            num_views ? v.views : NULL, num_views));
  views_free(&v);
  return r;
}

kdn_go_kvret kdn_go_knowledge_fetch(const kdn_model *m, const char *ns, size_t ns_len, const char *doc,
                                    size_t doc_len, int32_t *doc_tokens, size_t tokens_capacity,
                                    const kdn_kv_view *tmpl, const kdn_go_view_aux *aux, size_t num_views,
                                    const uint32_t *layers, const int64_t *offsets, const int32_t *table, void *data,
                                    size_t data_len) {
  kdn_go_kvret r;
  kdn_go_ret st;
  views v;
  kdn_status s;
  const kdn_go_mem host = {0, 0};
  kdn_kv_result_init(&r.result, sizeof r.result);
  s = views_build(&v, tmpl, aux, num_views, layers, offsets, table, data, data_len, NULL, host);
  if (s != KDN_OK) {
    st = fail(s, "out of memory building the views");
  } else {
    st = ret(kdn_knowledge_fetch(m, ns, ns_len, doc, doc_len, num_views ? v.views : NULL, num_views, doc_tokens,
                                 tokens_capacity, &r.result));
    views_free(&v);
  }
  r.status = st.status;
  r.msg = st.msg;
  return r;
}

kdn_go_ret kdn_go_knowledge_info(const kdn_model *m, const char *ns, size_t ns_len, const char *doc, size_t doc_len,
                                 kdn_document_info *out) {
  kdn_document_info_init(out, sizeof *out);
  return ret(kdn_knowledge_get_info(m, ns, ns_len, doc, doc_len, out));
}

kdn_go_ret kdn_go_knowledge_list(const kdn_model *m, const char *ns, size_t ns_len, kdn_document_info *out,
                                 size_t capacity, size_t *count) {
  size_t i;
  for (i = 0; i < capacity; ++i) kdn_document_info_init(&out[i], sizeof out[i]);
  return ret(kdn_knowledge_list(m, ns, ns_len, capacity ? out : NULL, capacity, count));
}

kdn_go_ret kdn_go_knowledge_admin(int which, const kdn_model *m, const char *ns, size_t ns_len, const char *doc,
                                  size_t doc_len, int64_t ttl_ms) {
  switch (which) {
    case 0: return ret(kdn_knowledge_pin(m, ns, ns_len, doc, doc_len, ttl_ms));
    case 1: return ret(kdn_knowledge_unpin(m, ns, ns_len, doc, doc_len));
    case 2: return ret(kdn_knowledge_expire(m, ns, ns_len, doc, doc_len, ttl_ms));
    default: return ret(kdn_knowledge_delete(m, ns, ns_len, doc, doc_len));
  }
}

kdn_go_ret kdn_go_kv_match(const kdn_model *m, const char *ns, size_t ns_len, const int32_t *tokens,
                           size_t num_tokens, kdn_token_range *out, size_t capacity, size_t *count) {
  return ret(kdn_kv_match(m, ns, ns_len, tokens, num_tokens, out, capacity, count));
}

/* ---- Ops ---------------------------------------------------------------------- */

kdn_go_ret kdn_go_op_wait(kdn_op *op, int64_t timeout_ms) { return ret(kdn_op_wait(op, timeout_ms)); }

kdn_go_ret kdn_go_op_wait_layer(kdn_op *op, uint32_t layer, int64_t timeout_ms) {
  return ret(kdn_op_wait_layer(op, layer, timeout_ms));
}

kdn_go_ret kdn_go_op_layer_ready(kdn_op *op, uint32_t layer) { return ret(kdn_op_layer_ready(op, layer)); }

kdn_go_ret kdn_go_op_poll(kdn_op *op, kdn_op_state *out) { return ret(kdn_op_poll(op, out)); }

kdn_go_ret kdn_go_op_cancel(kdn_op *op) { return ret(kdn_op_cancel(op)); }

kdn_go_kvret kdn_go_op_result(kdn_op *op) {
  kdn_go_kvret r;
  kdn_go_ret st;
  kdn_kv_result_init(&r.result, sizeof r.result);
  st = ret(kdn_op_get_result(op, &r.result));
  r.status = st.status;
  r.msg = st.msg;
  return r;
}

kdn_go_ret kdn_go_op_failed_ranges(kdn_op *op, kdn_token_range *out, size_t capacity, size_t *count) {
  kdn_token_range none;
  return ret(kdn_op_get_failed_ranges(op, capacity ? out : &none, capacity, count));
}

/* ---- Statistics ------------------------------------------------------------------ */

kdn_go_ret kdn_go_stats(kdn_runtime *rt, kdn_stats *out) {
  kdn_stats_init(out, sizeof *out);
  return ret(kdn_runtime_get_stats(rt, out));
}

kdn_go_ret kdn_go_latency(kdn_runtime *rt, kdn_latency_kind kind, kdn_latency *out) {
  kdn_latency_init(out, sizeof *out);
  return ret(kdn_runtime_get_latency(rt, kind, out));
}

kdn_go_ret kdn_go_tier_count(kdn_runtime *rt, uint32_t *out) { return ret(kdn_runtime_get_tier_count(rt, out)); }

kdn_go_ret kdn_go_tier_stats(kdn_runtime *rt, uint32_t index, kdn_tier_stats *out) {
  kdn_tier_stats_init(out, sizeof *out);
  return ret(kdn_runtime_get_tier_stats(rt, index, out));
}

kdn_go_ret kdn_go_quota_stats(kdn_runtime *rt, uint32_t index, kdn_quota_stats *out, size_t capacity,
                              size_t *count) {
  size_t i;
  for (i = 0; i < capacity; ++i) kdn_quota_stats_init(&out[i], sizeof out[i]);
  return ret(kdn_runtime_get_quota_stats(rt, index, capacity ? out : NULL, capacity, count));
}

// SPDX-License-Identifier: Apache-2.0
/* The C side of the Go binding: shims that take every Go pointer as a direct
 * argument and build kdn's structs here, in C memory, so that no Go memory
 * ever holds a pointer to Go memory (cgo's rule; Go 1.19 cannot pin).
 *
 * Every shim returns its status together with a copy of
 * kdn_last_error_message() (malloc'd, NULL on success; the Go side frees
 * it), read in the same cgo call: a goroutine may move to another OS thread
 * between two cgo calls, and the message is per thread. */
#ifndef KDN_GO_H
#define KDN_GO_H

#ifndef KDN_EXPERIMENTAL
#define KDN_EXPERIMENTAL 1 /* kdn_runtime_create_with_editor, kdn_chunk_info, kdn_kv_match */
#endif
#include <kdn/kdn.h>
#include <stddef.h>
#include <stdint.h>

/* A status and, on failure, the message (malloc'd). */
typedef struct kdn_go_ret {
  kdn_status status;
  char *msg;
} kdn_go_ret;

/* A request without pointers: the arrays are passed beside it. */
typedef struct kdn_go_req {
  int64_t tokens_off; /* first token in the call's token array; -1: no tokens */
  int64_t num_tokens;
  int64_t hashes_off; /* first byte in the call's hash array; -1: no hashes */
  int64_t num_blocks;
  uint32_t hash_bytes;
  uint32_t block_tokens;
  uint64_t ttft_target_us; /* since 1.6 */
  int64_t salt_off;        /* since 1.13: first byte in the call's salt array; -1: no salt */
  int64_t salt_len;
} kdn_go_req;

/* Where a KV call's memory is. device 0: host memory, the call's data
 * argument (a Go pointer, which cgo checks and keeps alive for the call).
 * Otherwise an address in the runtime's device memory (since 1.5), passed
 * as an integer because it must never be a Go pointer, and the engine's
 * CUDA stream (since 1.8; 0: none), which every view of the call names. */
typedef struct kdn_go_mem {
  uintptr_t device;
  uintptr_t stream;
} kdn_go_mem;

/* Where a view's arrays start in the call's flat arrays (-1: none). The
 * kdn_kv_view beside it carries every other field; its pointers are unset. */
typedef struct kdn_go_view_aux {
  int64_t layers_off;  /* into layers (num_layers of them) */
  int64_t k_off;       /* into offsets: num_ptrs byte offsets of each layer's K in data */
  int64_t v_off;       /* ... and of V */
  int64_t num_ptrs;
  int64_t table_off;   /* into the block table array (block_table_len of them) */
  int64_t state_off;   /* into offsets: num_state byte offsets of each recurrent layer's state (since
                          1.12), in the call's state memory; -1: none (state_layers NULL) */
  int64_t num_state;
} kdn_go_view_aux;

typedef struct kdn_go_kvret {
  kdn_status status;
  char *msg;
  kdn_kv_result result;
} kdn_go_kvret;

typedef struct kdn_go_lookupret {
  kdn_status status;
  char *msg;
  kdn_lookup_result result;
} kdn_go_lookupret;

/* Whether this thread runs an editor callback (the runtime's mover thread,
 * inside kdnGoEdit): kdn's destroy functions only defer their work there,
 * so the Go side defers its Close instead (see guard.closeThen). */
int kdn_go_in_editor(void);

/* Runtime and model. */
kdn_go_ret kdn_go_runtime_create(const kdn_runtime_options *options, uintptr_t editor, kdn_runtime **out);
kdn_go_ret kdn_go_model_create(kdn_runtime *rt, const kdn_model_spec *spec, const char *fingerprint,
                               size_t fingerprint_len, kdn_model **out, uint64_t *bytes_per_token,
                               uint8_t *fingerprint_out /* 32 bytes */);
/* Since 1.4. */
kdn_go_ret kdn_go_model_report_prefill(const kdn_model *m, uint64_t tokens, uint64_t elapsed_ns);

/* Which kind of KV call kdn_go_kv_call makes. */
enum { KDN_GO_STORE = 0, KDN_GO_RETRIEVE = 1, KDN_GO_LOAD = 2, KDN_GO_SAVE = 3 };

/* A KV call with one request: tokens, hashes, salts, layers, offsets and
 * table are the flat arrays the request and views index into (kdn copies
 * the request's, an op's included, before it returns); data is the memory
 * the views describe (or, with mem.device set, device memory: data is then
 * NULL and data_len its size). The recurrent state's offsets (a view's
 * state_off) are in state (C memory the Go side copied it to), or in data
 * when state is NULL. A store or retrieve sets the result; a load or save
 * (data: C memory, which kdn keeps using) starts the op it puts in *op. */
kdn_go_kvret kdn_go_kv_call(int which, const kdn_model *m, const char *ns, size_t ns_len, kdn_go_req req,
                            const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts,
                            const kdn_kv_view *views, const kdn_go_view_aux *aux, size_t num_views,
                            const uint32_t *layers, const int64_t *offsets, const int32_t *table, void *data,
                            size_t data_len, void *state, kdn_go_mem mem, kdn_op **op);

/* One request's lookup. */
kdn_go_lookupret kdn_go_lookup1(const kdn_model *m, const char *ns, size_t ns_len, kdn_go_req req,
                                const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts);
/* Batched lookup: reqs and results are num arrays (results: Go memory, no pointers). */
kdn_go_ret kdn_go_lookup(const kdn_model *m, const char *ns, size_t ns_len, const kdn_go_req *reqs, size_t num,
                         const int32_t *tokens, const uint8_t *hashes, const uint8_t *salts,
                         kdn_lookup_result *results);

/* Knowledge items. */
kdn_go_ret kdn_go_knowledge_put(const kdn_model *m, const char *ns, size_t ns_len, const char *doc, size_t doc_len,
                                uint64_t version, const char *meta, size_t meta_len, const int32_t *doc_tokens,
                                size_t num_tokens, const kdn_kv_view *views, const kdn_go_view_aux *aux,
                                size_t num_views, const uint32_t *layers, const int64_t *offsets,
                                const int32_t *table, void *data, size_t data_len);
kdn_go_kvret kdn_go_knowledge_fetch(const kdn_model *m, const char *ns, size_t ns_len, const char *doc,
                                    size_t doc_len, int32_t *doc_tokens, size_t tokens_capacity,
                                    const kdn_kv_view *views, const kdn_go_view_aux *aux, size_t num_views,
                                    const uint32_t *layers, const int64_t *offsets, const int32_t *table, void *data,
                                    size_t data_len);
kdn_go_ret kdn_go_knowledge_info(const kdn_model *m, const char *ns, size_t ns_len, const char *doc, size_t doc_len,
                                 kdn_document_info *out);
kdn_go_ret kdn_go_knowledge_list(const kdn_model *m, const char *ns, size_t ns_len, kdn_document_info *out,
                                 size_t capacity, size_t *count);
/* which: 0 pin, 1 unpin, 2 expire, 3 delete. */
kdn_go_ret kdn_go_knowledge_admin(int which, const kdn_model *m, const char *ns, size_t ns_len, const char *doc,
                                  size_t doc_len, int64_t ttl_ms);
/* Since 1.9 (experimental): kdn_kv_match, up to capacity ranges into out
 * (capacity 0: out may be NULL). */
kdn_go_ret kdn_go_kv_match(const kdn_model *m, const char *ns, size_t ns_len, const int32_t *tokens,
                           size_t num_tokens, kdn_token_range *out, size_t capacity, size_t *count);

/* Ops. */
kdn_go_ret kdn_go_op_wait(kdn_op *op, int64_t timeout_ms);
kdn_go_ret kdn_go_op_wait_layer(kdn_op *op, uint32_t layer, int64_t timeout_ms);
kdn_go_ret kdn_go_op_layer_ready(kdn_op *op, uint32_t layer);
kdn_go_ret kdn_go_op_poll(kdn_op *op, kdn_op_state *out);
kdn_go_ret kdn_go_op_cancel(kdn_op *op);
kdn_go_kvret kdn_go_op_result(kdn_op *op);
kdn_go_ret kdn_go_op_failed_ranges(kdn_op *op, kdn_token_range *out, size_t capacity, size_t *count);

/* Statistics. */
kdn_go_ret kdn_go_stats(kdn_runtime *rt, kdn_stats *out);
kdn_go_ret kdn_go_latency(kdn_runtime *rt, kdn_latency_kind kind, kdn_latency *out);
kdn_go_ret kdn_go_tier_count(kdn_runtime *rt, uint32_t *out);
kdn_go_ret kdn_go_tier_stats(kdn_runtime *rt, uint32_t index, kdn_tier_stats *out);
/* Since 1.13: tier index's quotas, up to capacity into out (each element
 * initialised here; capacity 0: out may be NULL), their number in *count. */
kdn_go_ret kdn_go_quota_stats(kdn_runtime *rt, uint32_t index, kdn_quota_stats *out, size_t capacity,
                              size_t *count);

#endif /* KDN_GO_H */

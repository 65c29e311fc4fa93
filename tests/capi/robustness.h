// SPDX-License-Identifier: Apache-2.0
/* Helpers of the robustness programs (bad_input_test.c, stress_test.c):
 * their checks, and the reference model's KV laid out the ways the C ABI
 * takes it, with a per-sequence offset so that every byte is a known
 * function of the tokens it belongs to. Each program includes it once, after
 * defining KDN_EXPERIMENTAL if it uses that section. */
#ifndef KDN_TESTS_CAPI_ROBUSTNESS_H
#define KDN_TESTS_CAPI_ROBUSTNESS_H

#include <kdn/kdn.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Checks --------------------------------------------------------------
 * Counters are per process; the stress test's threads keep their own. */
static int g_checks;
static int g_failures;

static inline void rb_check_at(int ok, const char *what, int line) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  printf("  FAILED (line %d): %s\n", line, what);
}

static inline void rb_check_eq_at(unsigned long long got, unsigned long long want, const char *what, int line) {
  ++g_checks;
  if (got == want) return;
  ++g_failures;
  printf("  FAILED (line %d): %s: got %llu, want %llu\n", line, what, got, want);
}

static inline void rb_check_ok_at(kdn_status got, const char *what, int line) {
  ++g_checks;
  if (got == KDN_OK) return;
  ++g_failures;
  printf("  FAILED (line %d): %s returned %s (%d): \"%s\"\n", line, what, kdn_status_string(got), (int)got,
         kdn_last_error_message());
}

#define CHECK(cond) rb_check_at((cond) != 0, #cond, __LINE__)
#define CHECK_EQ(got, want) \
  rb_check_eq_at((unsigned long long)(got), (unsigned long long)(want), #got " == " #want, __LINE__)
/* reference.h's new_model uses CHECK_OK. */
#ifndef CHECK_OK
#define CHECK_OK(call) rb_check_ok_at((call), #call, __LINE__)
#endif

#include "reference.h"

/* 1 when the n bytes at p are all `value`. */
static inline int bytes_are(const void *p, size_t n, unsigned char value) {
  const unsigned char *b = p;
  size_t i;
  for (i = 0; i < n; ++i)
    if (b[i] != value) return 0;
  return 1;
}

/* ---- The reference KV, shifted ---------------------------------------------
 * Sequence KV: element (layer, k|v, position, head, dim) is the reference
 * model's value there plus `add`, a small binary fraction, so that KV
 * stored for different token sequences differs in every byte while staying
 * exact in float32. */
static inline float kv_value(int layer, int kv, int position, int head, int dim, float add) {
  return ref_at(layer, kv, position, head, dim) + add;
}

/* The canonical layout [layer][k|v][token][head][dim] with room for `room`
 * tokens: the element index. */
static inline size_t canon_index(uint64_t room, int layer, int kv, uint64_t token, int head, int dim) {
  return ((((size_t)layer * 2 + (size_t)kv) * (size_t)room + (size_t)token) * HEADS + (size_t)head) * HEAD_DIM +
         (size_t)dim;
}

static inline size_t canon_bytes(uint64_t room) { return (size_t)room * BYTES_PER_TOKEN; }

/* Writes tokens [0, n) of a canonical buffer of `room` tokens. */
static inline void canon_fill(float *buf, uint64_t room, uint64_t n, float add) {
  int l, kv, h, d;
  uint64_t t;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < n; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) buf[canon_index(room, l, kv, t, h, d)] = kv_value(l, kv, (int)t, h, d, add);
}

/* The number of elements of tokens [0, n) that do not hold the sequence's
 * KV, plus those of tokens [n, room) whose bytes are not all `sentinel`. */
static inline uint64_t canon_mismatches(const float *buf, uint64_t room, uint64_t n, float add, unsigned char sentinel) {
  uint64_t bad = 0, t;
  int l, kv, h, d;
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < room; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float *e = &buf[canon_index(room, l, kv, t, h, d)];
            if (t < n) {
              const float want = kv_value(l, kv, (int)t, h, d, add);
              if (memcmp(e, &want, sizeof want) != 0) ++bad;
            } else {
              const unsigned char *b = (const unsigned char *)e;
              if (b[0] != sentinel || b[1] != sentinel || b[2] != sentinel || b[3] != sentinel) ++bad;
            }
          }
  return bad;
}

/* Describes the first wrong element of a canonical buffer (as
 * canon_mismatches counts them) into out: where it is, what it holds. */
static inline void canon_describe(const float *buf, uint64_t room, uint64_t n, float add, unsigned char sentinel,
                                  char *out, size_t out_size) {
  uint64_t t;
  int l, kv, h, d;
  snprintf(out, out_size, "no wrong element");
  for (l = 0; l < LAYERS; ++l)
    for (kv = 0; kv < 2; ++kv)
      for (t = 0; t < room; ++t)
        for (h = 0; h < HEADS; ++h)
          for (d = 0; d < HEAD_DIM; ++d) {
            const float *e = &buf[canon_index(room, l, kv, t, h, d)];
            const unsigned char *b = (const unsigned char *)e;
            const int untouched = b[0] == sentinel && b[1] == sentinel && b[2] == sentinel && b[3] == sentinel;
            const float want = t < n ? kv_value(l, kv, (int)t, h, d, add) : 0.0f;
            if (t < n ? memcmp(e, &want, sizeof want) == 0 : untouched) continue;
            if (t >= n) {
              snprintf(out, out_size, "layer %d %s token %llu (of room %llu, %llu filled) written past the end: %g",
                       l, kv ? "V" : "K", (unsigned long long)t, (unsigned long long)room, (unsigned long long)n,
                       (double)*e);
            } else if (untouched) {
              snprintf(out, out_size, "layer %d %s token %llu of %llu not written", l, kv ? "V" : "K",
                       (unsigned long long)t, (unsigned long long)n);
            } else {
              snprintf(out, out_size,
                       "layer %d %s token %llu head %d dim %d of %llu: %.9g, want %.9g (reference %.9g + %g; the "
                       "value holds the reference + %.9g)",
                       l, kv ? "V" : "K", (unsigned long long)t, h, d, (unsigned long long)n, (double)*e,
                       (double)want, (double)ref_at(l, kv, (int)t, h, d), (double)add,
                       (double)(*e - ref_at(l, kv, (int)t, h, d)));
            }
            return;
          }
}

/* A view of a canonical buffer of `room` tokens (one allocation). */
static inline kdn_kv_view canon_view(float *buf, uint64_t room) {
  kdn_kv_view v = KDN_KV_VIEW_INIT;
  v.data = buf;
  v.size_bytes = canon_bytes(room);
  v.num_tokens = room;
  return v;
}

/* A request for token ids. */
static inline kdn_request token_request(const int32_t *tokens, size_t n) {
  kdn_request r = KDN_REQUEST_INIT;
  r.tokens = tokens;
  r.num_tokens = n;
  return r;
}

#endif /* KDN_TESTS_CAPI_ROBUSTNESS_H */

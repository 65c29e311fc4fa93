# SPDX-License-Identifier: Apache-2.0
"""The reference model (stories260K, a llama2.c checkpoint: models/README.md)
in numpy, for the tests: its real KV, and its forward pass one layer at a
time, which is what a blend's layer callback computes.

The forward pass follows the reference transformer (lab/model/transformer.cc):
RMSNorm, Q/K/V projections, interleaved RoPE (pairs 2j, 2j+1, theta 10000),
causal grouped-query attention over the layer's KV of every position, the
output projection, then the SwiGLU feed-forward block, both residual. It is
float32 like kdn's, not bitwise the same (another order of additions): the
tests compare it with the repository's reference KV (computed in double
precision by an independent forward pass) at a tolerance.

Every row is computed alone, bit for bit the same whichever rows run with
it: the products are numpy.einsum's (its own loops, one sum per output
element), not a BLAS's, whose kernels may add in another order for another
number of rows. A blend runs a layer for varying sets of positions, and the
KV pass (kv) must write what the whole layer writes, bit for bit.
"""
import os

import numpy as np

MODELS = os.environ.get("KDN_MODELS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                                      os.pardir, os.pardir, "models")
MODEL_PATH = os.path.join(MODELS, "stories260K.bin")
BOS = 1
# The reference run of models/README.md (greedy from BOS, 48 steps), as
# tests/common/test_models.h pins it.
REFERENCE_IDS = [
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419,
    292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391,
    266, 267]


def present():
    return os.path.exists(MODEL_PATH)


def required():
    """CI sets KDN_REQUIRE_MODELS=1: a missing model fails instead of skipping."""
    return os.environ.get("KDN_REQUIRE_MODELS") == "1"


def reference_kv():
    """The reference KV of BOS + the first 47 greedy ids (48 positions):
    (tokens, k, v), k and v float32 [layer 5][position 48][kv_head 4][head_dim 8]."""
    k = np.fromfile(os.path.join(MODELS, "reference", "kv260k.k.f32"), np.float32).reshape(5, 48, 4, 8)
    v = np.fromfile(os.path.join(MODELS, "reference", "kv260k.v.f32"), np.float32).reshape(5, 48, 4, 8)
    return np.array([BOS] + REFERENCE_IDS[:47], np.int32), k, v


class RefModel:
    """The checkpoint's weights and the forward pass of one layer."""

    def __init__(self, path=MODEL_PATH):
        raw = np.fromfile(path, np.uint8)
        dim, hidden, layers, heads, kv_heads, vocab, seq_len = (int(n) for n in np.frombuffer(raw[:28], np.int32))
        shared = vocab > 0
        vocab = abs(vocab)
        w = np.frombuffer(raw[28:], np.float32)
        hd = dim // heads
        kv_dim = kv_heads * hd
        at = 0

        def take(*shape):
            nonlocal at
            n = int(np.prod(shape))
            out = w[at:at + n].reshape(shape)
            at += n
            return out

        self.tok_emb = take(vocab, dim)
        self.rms_att = take(layers, dim)
        self.wq = take(layers, dim, dim)  # [out][in], as llama2.c writes them
        self.wk = take(layers, kv_dim, dim)
        self.wv = take(layers, kv_dim, dim)
        self.wo = take(layers, dim, dim)
        self.rms_ffn = take(layers, dim)
        self.w1 = take(layers, hidden, dim)
        self.w2 = take(layers, dim, hidden)
        self.w3 = take(layers, hidden, dim)
        self.rms_final = take(dim)
        at += seq_len * hd  # llama2.c's RoPE tables (cos, sin): computed below instead
        if not shared:
            take(vocab, dim)
        assert at == w.size, "not a llama2.c checkpoint of the expected size"
        self.dim, self.hidden, self.layers, self.heads, self.kv_heads = dim, hidden, layers, heads, kv_heads
        self.head_dim, self.kv_dim = hd, kv_dim
        self.inv_freq = 10000.0 ** (-2.0 * np.arange(hd // 2) / hd)  # float64, as kdn computes the angles

    @staticmethod
    def _rms_norm(x, gain):
        ss = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32) + np.float32(1e-5)
        return gain * (x / np.sqrt(ss))

    def _rope(self, rows, positions, heads):
        """Interleaved RoPE of rows [n][heads * head_dim] at positions, in place."""
        angle = np.asarray(positions, np.float64)[:, None] * self.inv_freq[None, :]
        c, s = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
        r = rows.reshape(len(positions), heads, self.head_dim // 2, 2)
        a, b = r[..., 0].copy(), r[..., 1].copy()
        r[..., 0] = a * c[:, None, :] - b * s[:, None, :]
        r[..., 1] = a * s[:, None, :] + b * c[:, None, :]

    def embed(self, tokens):
        return self.tok_emb[np.asarray(tokens, np.int64)].copy()

    @staticmethod
    def _mul(x, w):
        """x [n][in] times w [out][in] transposed, row by row (see above)."""
        return np.einsum("ni,oi->no", x, w)

    def _kv_rows(self, l, positions, hidden, k, v):
        """Writes the positions' K (after RoPE) and V of layer l into k, v;
        returns the normed input, for the rest of the layer."""
        xb = self._rms_norm(hidden, self.rms_att[l])
        kk = self._mul(xb, self.wk[l])
        self._rope(kk, positions, self.kv_heads)
        k[positions] = kk
        v[positions] = self._mul(xb, self.wv[l])
        return xb

    def kv(self, l, positions, hidden, k, v):
        """The KV pass of layer l (a blend's kv_fn): the positions' K and V
        alone, what layer() writes there; no attention, hidden untouched."""
        self._kv_rows(l, np.asarray(positions, np.int64), hidden, k, v)

    def layer(self, l, positions, hidden, k, v):
        """Layer l for `positions` (ascending): hidden [n][dim] in and out;
        writes the positions' K (after RoPE) and V into k, v [total][kv_dim]
        and attends each position causally over [0, itself] of them."""
        positions = np.asarray(positions, np.int64)
        n = len(positions)
        x = hidden
        xb = self._kv_rows(l, positions, x, k, v)
        q = self._mul(xb, self.wq[l])
        self._rope(q, positions, self.heads)
        span = int(positions[-1]) + 1
        group = self.heads // self.kv_heads
        keys = np.repeat(k[:span].reshape(span, self.kv_heads, self.head_dim), group, axis=1)
        values = np.repeat(v[:span].reshape(span, self.kv_heads, self.head_dim), group, axis=1)
        scores = np.einsum("nhd,thd->nht", q.reshape(n, self.heads, self.head_dim), keys)
        scores *= np.float32(1.0 / np.sqrt(self.head_dim))
        scores = np.where(np.arange(span)[None, None, :] > positions[:, None, None], np.float32(-np.inf), scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        att = np.einsum("nht,thd->nhd", scores, values).reshape(n, self.dim)
        x += self._mul(att, self.wo[l])
        xb = self._rms_norm(x, self.rms_ffn[l])
        h1 = self._mul(xb, self.w1[l])
        h = h1 / (np.float32(1.0) + np.exp(-h1)) * self._mul(xb, self.w3[l])
        x += self._mul(h, self.w2[l])

    def prefill(self, tokens):
        """The KV of `tokens` from position 0: float32 in the canonical
        layout [layer][k|v][token][kv_head][head_dim]."""
        n = len(tokens)
        positions = np.arange(n)
        hidden = self.embed(tokens)
        out = np.zeros((self.layers, 2, n, self.kv_heads, self.head_dim), np.float32)
        for l in range(self.layers):
            k = np.zeros((n, self.kv_dim), np.float32)
            v = np.zeros((n, self.kv_dim), np.float32)
            self.layer(l, positions, hidden, k, v)
            out[l, 0] = k.reshape(n, self.kv_heads, self.head_dim)
            out[l, 1] = v.reshape(n, self.kv_heads, self.head_dim)
        return out

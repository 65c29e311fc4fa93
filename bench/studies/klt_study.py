#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A study for a transform codec (issue 17): does a per-layer KLT (PCA) pay on stories260K's KV?

A numpy re-implementation of the reference model's forward pass (checked against
models/reference/kv260k.{k,v}.f32 to 1e-6) computes the KV of 256-token contexts of
bench/texts/stories.txt (the basis is fitted there) and bench/texts/heldout.txt (every number
is measured there); per layer and K/V it reports the spectrum, the KLT's coding gain, and the
zeroth-order entropy of uniform quantization per channel vs per KLT component at equal MSE,
for keys as stored and with RoPE undone, with one basis per layer (32 channels) or per KV head
(8). Ideal entropies, no side information: a feasibility study, not a codec. numpy only:

  python3 bench/studies/klt_study.py --out /tmp/klt-study     # about 2 minutes; report.txt there
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np

BOS = 1
CTX = 256
ROPE_THETA = 10000.0


# ----------------------------------------------------------------------------- model
class Model:
    def __init__(self, path):
        raw = open(path, "rb").read()
        dim, hidden, L, nh, nkv, vocab, seq = struct.unpack("<7i", raw[:28])
        self.shared = vocab > 0
        vocab = abs(vocab)
        self.dim, self.hidden, self.L, self.nh, self.nkv, self.vocab, self.seq = dim, hidden, L, nh, nkv, vocab, seq
        self.hd = dim // nh
        self.kvd = self.hd * nkv
        w = np.frombuffer(raw, dtype="<f4", offset=28).astype(np.float64)
        off = 0

        def take(*shape):
            nonlocal off
            n = int(np.prod(shape))
            a = w[off:off + n].reshape(shape)
            off += n
            return a

        self.tok = take(vocab, dim)
        self.rms_att = take(L, dim)
        self.wq = take(L, dim, dim)
        self.wk = take(L, self.kvd, dim)
        self.wv = take(L, self.kvd, dim)
        self.wo = take(L, dim, dim)
        self.rms_ffn = take(L, dim)
        self.w1 = take(L, hidden, dim)
        self.w2 = take(L, dim, hidden)
        self.w3 = take(L, hidden, dim)
        self.rms_final = take(dim)
        off += seq * self.hd // 2 * 2  # freq_cis_real, freq_cis_imag (unused)
        self.wcls = self.tok if self.shared else take(vocab, dim)
        assert off == w.size, (off, w.size)
        j = np.arange(self.hd // 2)
        # llama2.c: head_dim index i (even) -> freq = 1 / theta^(i / head_size), i = 2j
        self.inv_freq = 1.0 / ROPE_THETA ** (2.0 * j / self.hd)

    def angles(self, n):
        return np.arange(n)[:, None] * self.inv_freq[None, :]  # [pos, hd/2]

    def rope(self, x, n_heads, sign=1.0):
        """x: [T, n_heads*hd], positions 0..T-1; interleaved pairs (2j, 2j+1) per head."""
        T = x.shape[0]
        a = self.angles(T) * sign
        c, s = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
        x = x.reshape(T, n_heads, self.hd // 2, 2)
        x0, x1 = x[..., 0], x[..., 1]
        out = np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
        return out.reshape(T, n_heads * self.hd)

    @staticmethod
    def rmsnorm(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g

    def forward(self, ids):
        """Prefill ids at positions 0..T-1; returns K (post-RoPE), V: [L, T, kvd], logits [T, vocab]."""
        T = len(ids)
        x = self.tok[np.asarray(ids)]
        Ks, Vs = [], []
        rep = self.nh // self.nkv
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for l in range(self.L):
            xb = self.rmsnorm(x, self.rms_att[l])
            q = self.rope(xb @ self.wq[l].T, self.nh)
            k = self.rope(xb @ self.wk[l].T, self.nkv)
            v = xb @ self.wv[l].T
            Ks.append(k)
            Vs.append(v)
            qh = q.reshape(T, self.nh, self.hd).transpose(1, 0, 2)
            kh = np.repeat(k.reshape(T, self.nkv, self.hd).transpose(1, 0, 2), rep, axis=0)
            vh = np.repeat(v.reshape(T, self.nkv, self.hd).transpose(1, 0, 2), rep, axis=0)
            att = qh @ kh.transpose(0, 2, 1) / np.sqrt(self.hd) + mask
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            o = (att @ vh).transpose(1, 0, 2).reshape(T, self.dim)
            x = x + o @ self.wo[l].T
            xb = self.rmsnorm(x, self.rms_ffn[l])
            h1, h3 = xb @ self.w1[l].T, xb @ self.w3[l].T
            x = x + (h1 / (1.0 + np.exp(-h1)) * h3) @ self.w2[l].T
        logits = self.rmsnorm(x, self.rms_final) @ self.wcls.T
        return np.stack(Ks), np.stack(Vs), logits


# ----------------------------------------------------------------------------- tokenizer
class Tokenizer:
    def __init__(self, path, vocab):
        raw = open(path, "rb").read()
        (self.max_len,) = struct.unpack_from("<i", raw, 0)
        off = 4
        self.pieces, self.scores = [], []
        for _ in range(vocab):
            score, n = struct.unpack_from("<fi", raw, off)
            off += 8
            self.pieces.append(raw[off:off + n])
            self.scores.append(score)
            off += n
        assert off == len(raw)
        self.ids = {}
        for i in range(vocab - 1, -1, -1):  # first id wins for duplicates
            self.ids[self.pieces[i]] = i

    def encode(self, text: bytes, bos=True):
        """As llama2.c encode / kdn's Tokenizer::Encode: dummy ' ', code points, byte fallback, best-score merges."""
        ids = [BOS] if bos else []
        if not text:
            return ids
        sp = self.ids.get(b" ", -1)
        if sp >= 0:
            ids.append(sp)
        i = 0
        while i < len(text):
            j = i + 1
            while j < len(text) and j - i < 4 and (text[j] & 0xC0) == 0x80:
                j += 1
            cp = text[i:j]
            t = self.ids.get(cp, -1)
            if t >= 0:
                ids.append(t)
            else:
                ids.extend(b + 3 for b in cp)
            i = j
        first = 1 if bos else 0
        while True:
            best_score, best_id, best_at = -1e30, -1, 0
            for k in range(first, len(ids) - 1):
                t = self.ids.get(self.pieces[ids[k]] + self.pieces[ids[k + 1]], -1)
                if t >= 0 and self.scores[t] > best_score:
                    best_score, best_id, best_at = self.scores[t], t, k
            if best_id < 0:
                break
            ids[best_at] = best_id
            del ids[best_at + 1]
        return ids


def tokenize_stories(tok, text: bytes):
    """As kdn's codec::TokenizeStories: paragraph by paragraph (blank-line separated), each after BOS."""
    out = []

    def flush(p):
        p = p.strip(b" \t\r\n")
        if p:
            out.extend(tok.encode(p, True))

    para = pos = 0
    while pos < len(text):
        nl = text.find(b"\n", pos)
        line_end = len(text) if nl < 0 else nl
        if not text[pos:line_end].strip(b" \t\r"):
            flush(text[para:pos])
            para = line_end
        pos = line_end + 1
    if para < len(text):
        flush(text[para:])
    return out


# ----------------------------------------------------------------------------- KV of a text
def text_kv(model, tok, path, cache):
    if os.path.exists(cache):
        z = np.load(cache)
        return z["k"], z["v"], int(z["n_tokens"])
    ids = tokenize_stories(tok, open(path, "rb").read())
    n_ctx = len(ids) // CTX
    K = np.empty((n_ctx, model.L, CTX, model.kvd))
    V = np.empty_like(K)
    for c in range(n_ctx):
        ctx = list(ids[c * CTX:(c + 1) * CTX])
        ctx[0] = BOS
        K[c], V[c], _ = model.forward(ctx)
    np.savez(cache, k=K, v=V, n_tokens=len(ids))
    return K, V, len(ids)


def unrope_keys(model, K):
    """K: [ctx, L, T, kvd] post-RoPE -> pre-RoPE (rotate back by each position's angle)."""
    out = np.empty_like(K)
    for c in range(K.shape[0]):
        for l in range(K.shape[1]):
            out[c, l] = model.rope(K[c, l], model.nkv, sign=-1.0)
    return out


# ----------------------------------------------------------------------------- analysis
def entropy_bits(sym):
    """Empirical (zeroth-order, per-component) entropy in bits of integer symbols, column-wise; returns [cols]."""
    H = np.empty(sym.shape[1])
    for j in range(sym.shape[1]):
        _, cnt = np.unique(sym[:, j], return_counts=True)
        p = cnt / cnt.sum()
        H[j] = -(p * np.log2(p)).sum()
    return H


def quantize(y, steps):
    """Uniform mid-tread quantizer per column; step 0 (or inf) => column dropped (reconstructed as 0 = the mean)."""
    sym = np.zeros(y.shape, dtype=np.int64)
    rec = np.zeros_like(y)
    for j, d in enumerate(steps):
        if np.isfinite(d) and d > 0:
            sym[:, j] = np.rint(y[:, j] / d).astype(np.int64)
            rec[:, j] = sym[:, j] * d
    return sym, rec


def waterfill_steps(var, theta):
    """Reverse water-filling at level theta: components above it get step sqrt(12 theta), others none."""
    return np.where(var > theta, np.sqrt(12.0 * theta), np.inf)


def match_theta(y_cal, var_cal, target_mse):
    """Bisect theta (log scale) so that the measured calibration MSE of the water-filled quantizer is target_mse."""
    lo, hi = 1e-12, float(var_cal.max()) * 4
    for _ in range(60):
        mid = np.sqrt(lo * hi)
        _, rec = quantize(y_cal, waterfill_steps(var_cal, mid))
        mse = np.mean((y_cal - rec) ** 2)
        if mse > target_mse:
            hi = mid
        else:
            lo = mid
    return np.sqrt(lo * hi)


def gm(x):
    return float(np.exp(np.mean(np.log(x))))


def rate_at_target(cal, held, blocks, target):
    """Per-channel water-filled (B) and KLT water-filled (K) rates on held-out at a given calibration-measured MSE."""
    mu = cal.mean(0)
    xc, xh = cal - mu, held - mu
    C = xc.T @ xc / len(xc)
    B = np.zeros((32, 32)); ev = np.zeros(32)
    for blk in blocks:
        w, U = np.linalg.eigh(C[np.ix_(blk, blk)]); o = np.argsort(w)[::-1]
        B[np.ix_(blk, blk)] = U[:, o]; ev[blk] = w[o]
    yc, yh = xc @ B, xh @ B
    vc = np.mean(xc ** 2, 0)
    symB, recB = quantize(xh, waterfill_steps(vc, match_theta(xc, vc, target)))
    symK, recK = quantize(yh, waterfill_steps(ev, match_theta(yc, ev, target)))
    return dict(bits_B=float(entropy_bits(symB).mean()), mse_B=float(np.mean((xh - recB) ** 2)),
                bits_K=float(entropy_bits(symK).mean()), mse_K=float(np.mean((yh - recK) ** 2)),
                var_kl_held=np.mean(yh ** 2, 0))


def analyse(cal, held, blocks):
    """cal, held: [N, 32] samples of one layer's K or V. blocks: list of column index lists, one PCA each
    (one block of 32 = per-layer KLT; four blocks of 8 = per-KV-head KLT).

    Everything is centered with the CALIBRATION mean (what a codec would store). 'var' below is the
    second moment about that mean (on held-out data this includes the mean shift, identical for both schemes).
    """
    mu = cal.mean(0)
    xc, xh = cal - mu, held - mu
    C = xc.T @ xc / len(xc)
    # Block-diagonal KLT basis
    B = np.zeros((32, 32))
    ev_cal = np.zeros(32)
    for blk in blocks:
        w, U = np.linalg.eigh(C[np.ix_(blk, blk)])
        order = np.argsort(w)[::-1]
        B[np.ix_(blk, blk)] = U[:, order]
        ev_cal[blk] = w[order]
    yc, yh = xc @ B, xh @ B  # components (per block, descending within block)
    var_ch_h = np.mean(xh ** 2, 0)     # per-channel, held-out
    var_kl_h = np.mean(yh ** 2, 0)     # KLT components, held-out, calibration basis
    var_ch_c = np.mean(xc ** 2, 0)
    var_kl_c = ev_cal.copy()
    r = {}
    # spectrum (per-layer KLT only meaningful as 'top k of 32'); fraction of held-out energy in the top-k
    # calibration components, and the calibration eigenvalue fractions
    if len(blocks) == 1:
        tot_c, tot_h = ev_cal.sum(), var_kl_h.sum()
        for k in (4, 8, 16):
            r[f"cal_top{k}"] = float(ev_cal[:k].sum() / tot_c)
            r[f"held_top{k}"] = float(var_kl_h[:k].sum() / tot_h)
        r["eig_cal"] = [float(e) for e in ev_cal]
    r["gain_db_held"] = 10 * np.log10(gm(var_ch_h) / gm(var_kl_h))
    r["gain_db_cal"] = 10 * np.log10(gm(var_ch_c) / gm(var_kl_c))
    r["gain_bits_held"] = r["gain_db_held"] / 6.02
    # ---- rate at equal MSE
    sig_c = np.sqrt(var_ch_c)  # per-channel sigma from calibration
    steps_A = 0.35 * sig_c
    symA, recA = quantize(xh, steps_A)
    mseA = float(np.mean((xh - recA) ** 2))
    _, recA_c = quantize(xc, steps_A)
    target = float(np.mean((xc - recA_c) ** 2))  # design target (calibration-measured)
    HA = entropy_bits(symA)
    # per-channel, water-filled (same step for all channels) at the same calibration MSE
    thB = match_theta(xc, var_ch_c, target)
    symB, recB = quantize(xh, waterfill_steps(var_ch_c, thB))
    HB = entropy_bits(symB)
    mseB = float(np.mean((xh - recB) ** 2))
    # KLT, water-filled at the same calibration MSE
    thK = match_theta(yc, var_kl_c, target)
    stK = waterfill_steps(var_kl_c, thK)
    symK, recK = quantize(yh, stK)
    HK = entropy_bits(symK)
    mseK = float(np.mean((yh - recK) ** 2))  # orthogonal: same MSE as in channel space
    r.update(
        target_mse_cal=target, theta_rel_delta2_12=thK / (np.mean(steps_A ** 2) / 12),
        mse_A=mseA, mse_B=mseB, mse_K=mseK,
        bits_A=float(HA.mean()), bits_B=float(HB.mean()), bits_K=float(HK.mean()),
        zero_bit_K=int(np.sum(~np.isfinite(stK))), zero_bit_B=int(np.sum(~np.isfinite(waterfill_steps(var_ch_c, thB)))),
        total_var_held=float(var_ch_h.sum()),
    )
    # equal-MSE correction at high rate: 0.5*log2(mse/mseA) bits per value
    r["bits_K_at_mseA"] = r["bits_K"] + 0.5 * np.log2(mseK / mseA)
    r["bits_B_at_mseA"] = r["bits_B"] + 0.5 * np.log2(mseB / mseA)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--main", default=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    ap.add_argument("--out", default="/tmp/klt-study")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    model = Model(os.path.join(a.main, "models/stories260K.bin"))
    tok = Tokenizer(os.path.join(a.main, "models/tok512.bin"), model.vocab)
    print(f"model: dim {model.dim} hidden {model.hidden} layers {model.L} heads {model.nh} kv_heads {model.nkv} "
          f"head_dim {model.hd} vocab {model.vocab} seq {model.seq} shared_cls {model.shared}")

    # ---- 1. validation against the reference KV
    ref_ids = [403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
               410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352,
               266, 268, 388, 426, 338, 391, 266, 267]  # tests/common/test_models.h kReferenceIds
    ids = [BOS] + ref_ids[:47]
    K, V, logits = model.forward(ids)
    greedy_ok = list(np.argmax(logits, -1)) == ref_ids
    val = {"greedy_ids_match": bool(greedy_ok)}
    for name, mine in (("k", K), ("v", V)):
        ref = np.fromfile(os.path.join(a.main, f"models/reference/kv260k.{name}.f32"), dtype="<f4").astype(np.float64)
        ref = ref.reshape(model.L, 48, model.kvd)
        err = np.abs(mine - ref)
        mx = np.abs(ref).max()
        rel_el = err / np.maximum(np.abs(ref), 0.01 * mx)
        val[name] = dict(max_abs_err=float(err.max()), max_abs_ref=float(mx), max_err_over_max_abs=float(err.max() / mx),
                         max_rel_elem_floor1pct=float(rel_el.max()))
    print("validation:", json.dumps(val, indent=1))

    # ---- 2. KV of the texts
    Kc, Vc, ntc = text_kv(model, tok, os.path.join(a.main, "bench/texts/stories.txt"), os.path.join(a.out, "kv_stories.npz"))
    Kh, Vh, nth = text_kv(model, tok, os.path.join(a.main, "bench/texts/heldout.txt"), os.path.join(a.out, "kv_heldout.npz"))
    print(f"calibration stories.txt: {ntc} tokens -> {Kc.shape[0]} contexts of {CTX}; "
          f"held-out heldout.txt: {nth} tokens -> {Kh.shape[0]} contexts  ({time.time() - t0:.0f}s)")
    Kc_u, Kh_u = unrope_keys(model, Kc), unrope_keys(model, Kh)

    # ---- 3. analysis
    one = [list(range(32))]
    heads = [list(range(h * 8, h * 8 + 8)) for h in range(4)]
    results = {}
    for skip0 in (False, True):
        p0 = 1 if skip0 else 0
        for l in range(model.L):
            for kind, cal, held in (("K", Kc, Kh), ("K_unroped", Kc_u, Kh_u), ("V", Vc, Vh)):
                c = cal[:, l, p0:].reshape(-1, 32)
                h = held[:, l, p0:].reshape(-1, 32)
                for bname, blocks in (("layer32", one), ("head8", heads)):
                    results[(skip0, l, kind, bname)] = analyse(c, h, blocks)
        for l in range(model.L):
            c = Kc[:, l, p0:].reshape(-1, 32); h = Kh[:, l, p0:].reshape(-1, 32)
            cu = Kc_u[:, l, p0:].reshape(-1, 32); hu = Kh_u[:, l, p0:].reshape(-1, 32)
            gm_ch_roped = gm(np.mean((h - c.mean(0)) ** 2, 0))
            for bname, blocks in (("layer32", one), ("head8", heads)):
                tgt = results[(skip0, l, "K", bname)]["target_mse_cal"]
                x = rate_at_target(cu, hu, blocks, tgt)
                x["gain_db_vs_roped_channels"] = 10 * np.log10(gm_ch_roped / gm(x.pop("var_kl_held")))
                results[(skip0, l, "K_unroped@roped_target", bname)] = x
        print(f"analysis skip_pos0={skip0} done ({time.time() - t0:.0f}s)")

    # ---- report
    lines = []
    P = lines.append
    for skip0 in (False, True):
        P(f"\n=== positions: {'1..255 (BOS position 0 excluded)' if skip0 else 'all 0..255'} ===")
        P("per-layer KLT (one 32x32 basis per layer and K/V), fit on stories.txt, measured on heldout.txt")
        P("layer kind       | cal top4  top8  top16 | held top8 top16 | gain dB held (cal) bits | "
          "H bits/val: A=chan.35s B=chan-wf K=KLT-wf | K/A    K/B    | mse A, B, K (held) | K@mseA zeroK")
        for l in range(model.L):
            for kind in ("K", "K_unroped", "V"):
                r = results[(skip0, l, kind, "layer32")]
                P(f"L{l} {kind:10s} | {r['cal_top4']:.4f} {r['cal_top8']:.4f} {r['cal_top16']:.4f} | "
                  f"{r['held_top8']:.4f} {r['held_top16']:.4f} | {r['gain_db_held']:6.3f} ({r['gain_db_cal']:6.3f}) "
                  f"{r['gain_bits_held']:.4f} | {r['bits_A']:.4f} {r['bits_B']:.4f} {r['bits_K']:.4f} | "
                  f"{r['bits_K'] / r['bits_A']:.4f} {r['bits_K'] / r['bits_B']:.4f} | "
                  f"{r['mse_A']:.4g} {r['mse_B']:.4g} {r['mse_K']:.4g} | {r['bits_K_at_mseA']:.4f} {r['zero_bit_K']}")
        P("per-KV-head KLT (four 8x8 bases per layer and K/V)")
        P("layer kind       | gain dB held (cal) bits | H bits/val A B K | K/A K/B | mse K | K@mseA zeroK")
        for l in range(model.L):
            for kind in ("K", "K_unroped", "V"):
                r = results[(skip0, l, kind, "head8")]
                P(f"L{l} {kind:10s} | {r['gain_db_held']:6.3f} ({r['gain_db_cal']:6.3f}) {r['gain_bits_held']:.4f} | "
                  f"{r['bits_A']:.4f} {r['bits_B']:.4f} {r['bits_K']:.4f} | {r['bits_K'] / r['bits_A']:.4f} "
                  f"{r['bits_K'] / r['bits_B']:.4f} | {r['mse_K']:.4g} | {r['bits_K_at_mseA']:.4f} {r['zero_bit_K']}")
        P("K with RoPE undone, coded at the roped-K scheme-A target MSE (same absolute MSE as the K rows; RoPE is orthogonal)")
        P("layer bases   | gain dB vs roped per-channel | bits B(unroped chan-wf) K(unroped KLT) | mse B, K (held) | vs roped K row: A, K")
        for l in range(model.L):
            for bname in ("layer32", "head8"):
                x = results[(skip0, l, "K_unroped@roped_target", bname)]; rr = results[(skip0, l, "K", bname)]
                P(f"L{l} {bname:8s} | {x['gain_db_vs_roped_channels']:6.3f} | {x['bits_B']:.4f} {x['bits_K']:.4f} | "
                  f"{x['mse_B']:.4g} {x['mse_K']:.4g} | {rr['bits_A']:.4f} {rr['bits_K']:.4f}")
        # totals over all 10 (layer, K|V) tensors: values are equally many in each, so plain means
        for kset, lab in ((("K", "V"), "K(roped)+V"), (("K_unroped", "V"), "K(unroped)+V")):
            for bname in ("layer32", "head8"):
                rs = [results[(skip0, l, k, bname)] for l in range(model.L) for k in kset]
                A = np.mean([r["bits_A"] for r in rs]); B = np.mean([r["bits_B"] for r in rs])
                Kb = np.mean([r["bits_K"] for r in rs]); Ka = np.mean([r["bits_K_at_mseA"] for r in rs])
                g = np.mean([r["gain_db_held"] for r in rs])
                P(f"ALL {lab:13s} {bname:7s}: mean gain {g:.3f} dB; bits/value A {A:.4f} B {B:.4f} K {Kb:.4f} "
                  f"(K at mse A {Ka:.4f}); K/A {Kb / A:.4f}  K/B {Kb / B:.4f}")
    L, kvd = model.L, model.kvd
    basis = L * 2 * (kvd * kvd + kvd) * 4
    chunk = L * 2 * CTX * kvd * 2
    P("\nK variance decomposition (all positions, held-out, about calibration means; dB = 10log10 of ratios):")
    P("layer | total var roped, unroped | dB: roped chan gm / unroped chan gm (unroping+mean) | unroped chan gm / unroped KLT gm (decorrelation) | sum")
    for l in range(model.L):
        c = Kc[:, l].reshape(-1, 32); h = Kh[:, l].reshape(-1, 32)
        cu = Kc_u[:, l].reshape(-1, 32); hu = Kh_u[:, l].reshape(-1, 32)
        vr = np.mean((h - c.mean(0)) ** 2, 0); vu = np.mean((hu - cu.mean(0)) ** 2, 0)
        d1 = 10 * np.log10(gm(vr) / gm(vu)); d2 = results[(False, l, "K_unroped", "layer32")]["gain_db_held"]
        mean_u = np.mean(hu, 0)
        P(f"L{l} | {vr.sum():.4f} {vu.sum():.4f} | {d1:.3f} | {d2:.3f} | {d1 + d2:.3f}   "
          f"(unroped held-out |mean|^2 {np.sum(mean_u ** 2):.4f}, roped |mean|^2 {np.sum(np.mean(h, 0) ** 2):.4f})")
    for bname in ("layer32", "head8"):
        rs = [results[(False, l, "K_unroped@roped_target", bname)] for l in range(model.L)]
        ra = [results[(False, l, "K", bname)] for l in range(model.L)]
        rv = [results[(False, l, "V", bname)] for l in range(model.L)]
        kb = np.mean([r["bits_K"] for r in rs]); a_ = np.mean([r["bits_A"] for r in ra] + [r["bits_A"] for r in rv])
        kv = np.mean([r["bits_K"] for r in rs] + [r["bits_K"] for r in rv])
        P(f"ALL (all positions) {bname}: K-unroped KLT at roped target {kb:.4f} bits/value (roped K per-channel A "
          f"{np.mean([r['bits_A'] for r in ra]):.4f}); K-unroped KLT + V KLT {kv:.4f} vs all per-channel A {a_:.4f}: ratio {kv / a_:.4f}")
    P(f"\nbasis: {L} layers x 2 x ({kvd}x{kvd} + {kvd}) floats = {basis} bytes f32 ({basis // 2} bytes f16); "
      f"one {CTX}-token f16 chunk = {chunk} bytes; basis/chunk = {basis / chunk:.4f} (f32), {basis / 2 / chunk:.4f} (f16)")
    hb = L * 2 * 4 * (8 * 8 + 8) * 4
    P(f"per-head bases: {L} x 2 x 4 x (8x8 + 8) floats = {hb} bytes f32 = {hb / chunk:.4f} of a chunk")
    P(f"\nvalidation: {json.dumps(val)}")
    P(f"elapsed {time.time() - t0:.0f}s")
    txt = "\n".join(lines)
    print(txt)
    open(os.path.join(a.out, "report.txt"), "w").write(txt + "\n")
    js = {f"{'skip0' if k[0] else 'all'}/L{k[1]}/{k[2]}/{k[3]}": {kk: (float(vv) if not isinstance(vv, list) else vv)
                                                               for kk, vv in v.items()} for k, v in results.items()}
    js["validation"] = val
    json.dump(js, open(os.path.join(a.out, "results.json"), "w"), indent=1)


if __name__ == "__main__":
    main()

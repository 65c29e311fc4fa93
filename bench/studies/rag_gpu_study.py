#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The GPU rows of `kdn bench rag` (docs/rag.md): the paper's RAG request at a served model's size.

The engine's side is measured here, kdn's side by `kdn bench gpu --shape llama-8b` (its delivery
of the knowledge's KV into device views, and its own blending work on the device), and the two
are COMPOSED into a TTFT: every composed record says so ("composed": true and what it adds up).
A forward pass's time does not depend on the weights' values, so the model is a randomly
initialised decoder of Llama-3.1-8B's shape (32 layers, hidden 4096, 32 query heads, 8 KV heads of
128, MLP 14336, vocabulary 128256, bf16), written here in plain PyTorch (no transformers).

Measured (CUDA events, median of --repeats after a warm-up), for a request of K knowledge tokens
and H tokens of history and question (the paper's 8192 + 2048):
  - in-context: the forward pass over all K + H tokens (the TTFT of full prefill);
  - knowledge cached: the forward pass over the H new tokens with K tokens' KV already in place
    (the engine's part of a TTFT when the knowledge's KV is delivered);
  - blend shape: the forward passes kdn's default blend makes (docs/blending.md): layer 0 over
    every token; at check layers 1 and 2 K and V alone for the tokens still running, the
    selection narrowing to 28% of the cached tokens (53% after layer 1); the selected and the new
    tokens run each layer whole, attending to all K + H;
  - a decode step with K + H tokens cached (the response delay adds --generate of them).
Composed with kdn's records (--kdn-json, the output of `kdn bench gpu --shape llama-8b`):
  - KDN with the knowledge cached = delivery of K tokens' KV (a tier: --tiers) + knowledge cached;
  - KDN blending = delivery + kdn's blending work on the device (blend_compose_device_ms) + the
    blend shape's forward passes;
  - warm = delivery of K + H tokens' KV + one decode step.
Cost per request: the delay in GPU-seconds at --gpu-usd-per-hour (stated in every record).

  python3 bench/studies/rag_gpu_study.py --kdn-json out/gpu_llama8b.json --out out/rag_gpu.json
  python3 bench/studies/rag_gpu_study.py --device cpu --small --out /tmp/rag_gpu.json   # a check of the code
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch

LLAMA_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256, theta=500000.0)
SMALL = dict(layers=4, hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, vocab=1000, theta=500000.0)
BLEND_RATIO = 0.28          # kdn's default: 28% of the cached tokens go on past check layers 1 and 2
KV_BYTES_PER_TOKEN_F16 = 32 * 2 * 8 * 128 * 2   # Llama-3.1-8B's KV per token in f16, as kdn bench gpu stores it


def attend(q, k, v, mask):
    """q [1, Hq, Tq, D], k/v [1, Hkv, Tk, D], mask [Tq, Tk] bool (True: attend) or None (causal, Tq == Tk)."""
    group = q.shape[1] // k.shape[1]
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        try:
            if mask is None:
                return sdpa(q, k, v, is_causal=True, enable_gqa=True)
            return sdpa(q, k, v, attn_mask=mask, enable_gqa=True)
        except TypeError:  # a torch without enable_gqa
            pass
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is None:
        mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


class Decoder:
    """A Llama-shaped decoder with random weights: only its forward passes' times are used."""

    def __init__(self, c, device, dtype):
        self.c = c
        g = torch.Generator(device=device).manual_seed(35)

        def w(*shape):
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0, 0.02, generator=g)

        hd, h = c["head_dim"], c["hidden"]
        self.emb = w(c["vocab"], h)
        self.head = w(h, c["vocab"])
        self.layers = [dict(q=w(h, c["heads"] * hd), k=w(h, c["kv_heads"] * hd), v=w(h, c["kv_heads"] * hd),
                            o=w(c["heads"] * hd, h), w1=w(h, c["ffn"]), w3=w(h, c["ffn"]), w2=w(c["ffn"], h),
                            n1=torch.ones(h, device=device, dtype=dtype), n2=torch.ones(h, device=device, dtype=dtype))
                       for _ in range(c["layers"])]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
        self.inv_freq = inv
        self.device, self.dtype = device, dtype

    def rope(self, x, pos):
        f = pos.float()[:, None] * self.inv_freq[None, :]
        cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    @staticmethod
    def norm(x, w):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def kv(self, L, x, pos):
        c, hd = self.c, self.c["head_dim"]
        hn = self.norm(x, L["n1"])
        k = (hn @ L["k"]).view(-1, c["kv_heads"], hd).transpose(0, 1)[None]
        v = (hn @ L["v"]).view(-1, c["kv_heads"], hd).transpose(0, 1)[None]
        return self.rope(k, pos), v

    def layer(self, L, x, pos, k_all, v_all, mask):
        """x [T, hidden] at positions pos; attends to k_all/v_all (which include its own K/V) under mask."""
        c, hd = self.c, self.c["head_dim"]
        hn = self.norm(x, L["n1"])
        q = self.rope((hn @ L["q"]).view(-1, c["heads"], hd).transpose(0, 1)[None], pos)
        a = attend(q, k_all, v_all, mask)[0].transpose(0, 1).reshape(x.shape[0], -1)
        x = x + a @ L["o"]
        hn = self.norm(x, L["n2"])
        return x + (torch.nn.functional.silu(hn @ L["w1"]) * (hn @ L["w3"])) @ L["w2"]

    def logits(self, x):
        return x[-1:] @ self.head

    def full(self, ids, kvs=None):
        """The whole prompt; each layer's K and V appended to kvs when given."""
        x = self.emb[ids]
        pos = torch.arange(ids.shape[0], device=self.device)
        for L in self.layers:
            k, v = self.kv(L, x, pos)
            if kvs is not None:
                kvs.append((k, v))
            x = self.layer(L, x, pos, k, v, None)
        return self.logits(x)

    def on_cache(self, ids, cache_k, cache_v):
        """The new tokens ids after cache_k/v ([layers] of [1, Hkv, K, D]) at positions K.."""
        K, T = cache_k[0].shape[2], ids.shape[0]
        x = self.emb[ids]
        pos = torch.arange(K, K + T, device=self.device)
        mask = torch.ones(T, K + T, dtype=torch.bool, device=self.device)
        mask[:, K:] = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        for i, L in enumerate(self.layers):
            k, v = self.kv(L, x, pos)
            x = self.layer(L, x, pos, torch.cat((cache_k[i], k), 2), torch.cat((cache_v[i], v), 2), mask)
        return self.logits(x)

    def blend_shape(self, ids, n_cached, cache_k, cache_v, ratio, check_layers=(1, 2)):
        """kdn's default blend's work over a prompt whose first n_cached tokens come from cache_k/v:
        layer 0 over every token; at each check layer K and V alone for the tokens still running,
        then the selection narrows (after check j of m: ratio^((j+1)/m) of the cached tokens,
        docs/blending.md) and the selected and new tokens run the whole layer; then they alone."""
        P = ids.shape[0]
        x = self.emb[ids]
        pos = torch.arange(P, device=self.device)
        L0 = self.layers[0]
        k, v = self.kv(L0, x, pos)
        x = self.layer(L0, x, pos, k, v, None)
        rows = pos  # the positions of x's rows: the tokens still running
        for i in range(1, len(self.layers)):
            L = self.layers[i]
            k = cache_k[i][:, :, :P].clone()
            v = cache_v[i][:, :, :P].clone()
            ks, vs = self.kv(L, x, rows)
            k[:, :, rows], v[:, :, rows] = ks, vs
            if i in check_layers:
                keep = ratio ** ((check_layers.index(i) + 1) / len(check_layers))
                cached = rows[rows < n_cached]
                n_sel = min(len(cached), int(round(keep * n_cached)))
                # Which rows does not change the time: an even spread.
                pick = torch.linspace(0, len(cached) - 1, n_sel, device=self.device).long()
                new_rows = torch.cat((cached[pick], rows[rows >= n_cached]))
                x = x[torch.searchsorted(rows, new_rows)]
                rows = new_rows
            mask = pos[None, :] <= rows[:, None]
            x = self.layer(L, x, rows, k, v, mask)
        return self.logits(x)


def self_check(c, device):
    """The timed passes compute what they stand for: on a small float32 model, the new tokens on the
    prefix's true KV give full prefill's logits, and so does the blend shape recomputing every token."""
    m = Decoder(c, device, torch.float32)
    K, H = 48, 16
    ids = torch.randint(0, c["vocab"], (K + H,), device=device)
    kvs = []
    full = m.full(ids, kvs)
    on = m.on_cache(ids[K:], [k[:, :, :K] for k, _ in kvs], [v[:, :, :K] for _, v in kvs])
    zeros = [torch.zeros_like(k) for k, _ in kvs]
    blend = m.blend_shape(ids, K, zeros, zeros, 1.0)
    for name, got in (("on_cache", on), ("blend_shape at ratio 1", blend)):
        err = (got - full).abs().max().item()
        if not err < 1e-4 * max(1.0, full.abs().max().item()):
            why = f"failed: {name} differs from full prefill by {err:.3g}"
            print(f"rag_gpu_study: self-check {why}", file=sys.stderr)
            return why
    print("rag_gpu_study: self-check passed (the KV-cached and blend-shaped passes reproduce full prefill)")
    return "passed"


def timer(device):
    if device.startswith("cuda"):
        def run(fn, repeats):
            fn()
            torch.cuda.synchronize()
            out = []
            for _ in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                torch.cuda.synchronize()
                out.append(a.elapsed_time(b))
            return statistics.median(out)
    else:
        def run(fn, repeats):
            fn()
            out = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(out)
    return run


def record(name, value, unit, params, baseline=None, baseline_value=None, composed=None):
    r = {"name": name, "value": value, "unit": unit, "projected": False}
    if composed is not None:
        r["composed"] = composed
    if baseline:
        r.update(baseline=baseline, baseline_value=baseline_value,
                 ratio=value / baseline_value if baseline_value else 0.0)
    r["params"] = params
    print(f"  {name:44s} {value:12.4f} {unit}" + (f"  vs {baseline} {baseline_value:.4f}  ratio {r['ratio']:.3f}"
                                                   if baseline else ""))
    return r


def kdn_delivery_gbps(records, prefix, tier, tokens):
    """GB/s of kdn's delivery from `tier` at the request size nearest `tokens` (and that size)."""
    best = None
    for r in records:
        n = r["name"]
        if not (n.startswith(prefix + "llama8b_") and n.endswith("_" + tier + "_gbps")):
            continue
        size = int(n[len(prefix + "llama8b_"):].split("_")[0])
        if best is None or abs(math.log(size / tokens)) < abs(math.log(best[1] / tokens)):
            best = (r["value"], size)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON records")
    ap.add_argument("--kdn-json", help="kdn bench gpu --shape llama-8b's records, for the composed rows")
    ap.add_argument("--kdn-prefix", default="gpu_", help="their records' prefix (emulated_ for --emulated)")
    ap.add_argument("--tiers", default="deliver_host_raw,deliver_host_kdn,deliver_disk_raw",
                    help="kdn's delivery scenarios to compose with")
    ap.add_argument("--knowledge", type=int, default=8192)
    ap.add_argument("--history", type=int, default=2048)
    ap.add_argument("--generate", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a small model (a check of this script, not a measurement)")
    ap.add_argument("--gpu-usd-per-hour", type=float, default=4.0,
                    help="the price of one GPU-hour (an assumption, stated in every record; default 4.0)")
    a = ap.parse_args()

    c = SMALL if a.small else LLAMA_8B
    dev = a.device
    check = self_check(SMALL, dev)  # recorded in every record; the GPU's minutes are few, so it does not stop the run
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    torch.manual_seed(35)
    gpu = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu (a check, not a measurement)"
    K, H = a.knowledge, a.history
    P = K + H
    m = Decoder(c, dev, dtype)
    ids = torch.randint(0, c["vocab"], (P,), device=dev)
    shape_kv = (1, c["kv_heads"], P + 1, c["head_dim"])
    cache_k = [torch.randn(shape_kv, device=dev, dtype=dtype) for _ in range(c["layers"])]
    cache_v = [torch.randn(shape_kv, device=dev, dtype=dtype) for _ in range(c["layers"])]
    run = timer(dev)
    params = dict(model="Llama-3.1-8B shape, random weights (a forward pass's time does not depend on them)"
                  if not a.small else "a small Llama-shaped model (--small: a check of the script)",
                  shape=c, dtype=str(dtype).replace("torch.", ""), gpu=gpu, torch=torch.__version__,
                  knowledge_tokens=K, history_tokens=H, generate=a.generate, repeats=a.repeats,
                  gpu_usd_per_hour=a.gpu_usd_per_hour, self_check=check, attention="scaled_dot_product_attention"
                  if hasattr(torch.nn.functional, "scaled_dot_product_attention") else "matmul + softmax")
    print(f"rag_gpu_study: {gpu}, {params['model']}, {K} + {H} tokens")
    with torch.inference_mode():
        full_ms = run(lambda: m.full(ids), a.repeats)
        cached_ms = run(lambda: m.on_cache(ids[K:], [x[:, :, :K] for x in cache_k], [x[:, :, :K] for x in cache_v]),
                        a.repeats)
        blend_ms = run(lambda: m.blend_shape(ids, K, cache_k, cache_v, BLEND_RATIO), a.repeats)
        step_ms = run(lambda: m.on_cache(ids[:1], [x[:, :, :P] for x in cache_k], [x[:, :, :P] for x in cache_v]),
                      a.repeats)
    recs = [record("rag_gpu_prefill_full_ms", full_ms, "ms", params),
            record("rag_gpu_prefill_on_knowledge_ms", cached_ms, "ms", params, "prefill_full", full_ms),
            record("rag_gpu_blend_forward_ms", blend_ms, "ms",
                   dict(params, blend=f"kdn's default: layer 0 whole; K/V passes at check layers 1 and 2, the "
                                      f"selection narrowing to {BLEND_RATIO:.0%} of the cached tokens; they and "
                                      "every new token through the rest"),
                   "prefill_full", full_ms),
            record("rag_gpu_decode_step_ms", step_ms, "ms", params)]
    decode = a.generate * step_ms

    def delay_cost(name, ttft, what, extra):
        delay = ttft + decode
        p = dict(params, composed_of=what, **extra)
        usd = delay / 3.6e6 * a.gpu_usd_per_hour
        base = full_ms + decode
        return [record(f"rag_gpu_{name}_ttft_ms", ttft, "ms", p, "in_context", full_ms, composed=True),
                record(f"rag_gpu_{name}_delay_ms", delay, "ms", p, "in_context", base, composed=True),
                record(f"rag_gpu_{name}_cost_usd", usd, "usd", p, "in_context", base / 3.6e6 * a.gpu_usd_per_hour,
                       composed=True)]

    recs += delay_cost("in_context", full_ms, "the study's forward pass over every token, then the decode steps", {})
    if a.kdn_json:
        with open(a.kdn_json) as f:
            kdn = json.load(f)
        compose = next((r for r in kdn if r["name"].startswith(a.kdn_prefix + "llama8b_")
                        and r["name"].endswith("_blend_compose_device_ms")), None)
        for tier in a.tiers.split(","):
            got = kdn_delivery_gbps(kdn, a.kdn_prefix, tier, K)
            whole = kdn_delivery_gbps(kdn, a.kdn_prefix, tier, P)
            if got is None or whole is None:
                print(f"rag_gpu_study: no {a.kdn_prefix}llama8b_*_{tier}_gbps record in {a.kdn_json}", file=sys.stderr)
                continue
            deliver_ms = K * KV_BYTES_PER_TOKEN_F16 / (got[0] * 1e9) * 1e3
            deliver_all_ms = P * KV_BYTES_PER_TOKEN_F16 / (whole[0] * 1e9) * 1e3
            src = dict(kdn_json=a.kdn_json, kdn_tier=tier, kdn_gbps=got[0], kdn_gbps_measured_at_tokens=got[1])
            recs += delay_cost(f"knowledge_cached_{tier}", deliver_ms + cached_ms,
                               f"kdn's delivery of {K} tokens' KV ({tier}, {got[0]:.1f} GB/s) + the study's forward "
                               f"pass over the {H} new tokens on them", src)
            if compose is not None:
                recs += delay_cost(f"blend_{tier}", deliver_ms + compose["value"] + blend_ms,
                                   f"kdn's delivery of the documents' {K} tokens ({tier}) + kdn's blending work on the "
                                   f"device ({compose['name']}: {compose['value']:.2f} ms) + the study's blend-shaped "
                                   "forward passes", dict(src, kdn_compose=compose["name"]))
            recs += delay_cost(f"warm_{tier}", deliver_all_ms + step_ms,
                               f"kdn's delivery of all {P} tokens' KV ({tier}, {whole[0]:.1f} GB/s at "
                               f"{whole[1]} tokens) + one token's forward pass",
                               dict(src, kdn_gbps=whole[0], kdn_gbps_measured_at_tokens=whole[1]))
    with open(a.out, "w") as f:
        json.dump(recs, f, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

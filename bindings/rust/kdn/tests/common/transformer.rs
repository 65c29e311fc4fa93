// SPDX-License-Identifier: Apache-2.0
//! The reference model's forward pass in plain Rust (models/stories260K.bin,
//! llama2.c's checkpoint format; the same math as kdn's
//! lab/model/transformer.cc), one layer at a time: what an engine gives
//! Model::blend as its layer callback. Checked against the committed
//! reference KV (tests/blend.rs), which an independent double-precision
//! forward pass computed.
#![allow(dead_code)]

use std::path::Path;

pub struct Transformer {
    pub dim: usize,
    pub hidden_dim: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    w: Vec<f32>,
    // Offsets into w.
    tok_emb: usize,
    rms_att: usize,
    wq: usize,
    wk: usize,
    wv: usize,
    wo: usize,
    rms_ffn: usize,
    w1: usize,
    w2: usize,
    w3: usize,
}

impl Transformer {
    pub fn load(path: &Path) -> Transformer {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let header: Vec<i32> =
            bytes[..28].chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let [dim, hidden_dim, layers, heads, kv_heads, vocab, _seq_len] =
            <[i32; 7]>::try_from(header).unwrap().map(|x| x.unsigned_abs() as usize);
        let w: Vec<f32> = bytes[28..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        let head_dim = dim / heads;
        let kvd = kv_heads * head_dim;
        let mut at = 0;
        let mut next = |n: usize| {
            let here = at;
            at += n;
            here
        };
        let tok_emb = next(vocab * dim);
        let rms_att = next(layers * dim);
        let wq = next(layers * dim * dim);
        let wk = next(layers * kvd * dim);
        let wv = next(layers * kvd * dim);
        let wo = next(layers * dim * dim);
        let rms_ffn = next(layers * dim);
        let w1 = next(layers * hidden_dim * dim);
        let w2 = next(layers * dim * hidden_dim);
        let w3 = next(layers * hidden_dim * dim);
        assert!(at <= w.len(), "{}: truncated", path.display());
        Transformer {
            dim,
            hidden_dim,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab,
            w,
            tok_emb,
            rms_att,
            wq,
            wk,
            wv,
            wo,
            rms_ffn,
            w1,
            w2,
            w3,
        }
    }

    /// models/stories260K.bin.
    pub fn reference() -> Transformer {
        Transformer::load(&super::models_dir().join("stories260K.bin"))
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// `out[j] = W[j] . x` for `m` rows of W of length x.len() at `w`.
    fn matmul(&self, w: usize, x: &[f32], out: &mut [f32]) {
        let k = x.len();
        for (j, o) in out.iter_mut().enumerate() {
            let row = &self.w[w + j * k..w + (j + 1) * k];
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    fn rms_norm(&self, x: &[f32], gain: usize) -> Vec<f32> {
        let ss = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + 1e-5;
        let inv = 1.0 / ss.sqrt();
        x.iter().enumerate().map(|(i, v)| self.w[gain + i] * (inv * v)).collect()
    }

    /// Rotates each head of `row` (interleaved pairs, theta 10000) to `pos`.
    fn rope(&self, row: &mut [f32], pos: i32) {
        let hd = self.head_dim;
        for head in row.chunks_mut(hd) {
            for j in 0..hd / 2 {
                let angle = f64::from(pos) * 10000f64.powf(-2.0 * j as f64 / hd as f64);
                let (c, s) = (angle.cos() as f32, angle.sin() as f32);
                let (a, b) = (head[2 * j], head[2 * j + 1]);
                head[2 * j] = a * c - b * s;
                head[2 * j + 1] = a * s + b * c;
            }
        }
    }

    /// At layer 0, the tokens' embeddings into `hidden`.
    fn embed(&self, n: usize, tokens: Option<&[i32]>, hidden: &mut [f32]) {
        let dim = self.dim;
        assert_eq!(hidden.len(), n * dim);
        if let Some(tokens) = tokens {
            for (i, &t) in tokens.iter().enumerate() {
                let e = self.tok_emb + t as usize * dim;
                hidden[i * dim..(i + 1) * dim].copy_from_slice(&self.w[e..e + dim]);
            }
        }
    }

    /// Position `pos`'s K (after RoPE) and V of layer `l` from its normed
    /// input `xb`: the one code both passes run, so they agree bit for bit.
    fn project_kv(&self, l: usize, pos: i32, xb: &[f32], k: &mut [f32], v: &mut [f32]) {
        let (dim, kvd) = (self.dim, self.kv_dim());
        let p = pos as usize * kvd;
        self.matmul(self.wk + l * kvd * dim, xb, &mut k[p..p + kvd]);
        self.rope(&mut k[p..p + kvd], pos);
        self.matmul(self.wv + l * kvd * dim, xb, &mut v[p..p + kvd]);
    }

    /// The KV pass of layer `l` (kdn_blend_options.kv_fn): the positions' K
    /// and V as [`layer`](Self::layer) writes them, without attention or the
    /// feed-forward; `hidden` is left as it came (the layer's input).
    pub fn kv_pass(
        &self,
        l: usize,
        positions: &[i32],
        tokens: Option<&[i32]>,
        hidden: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
    ) {
        let dim = self.dim;
        self.embed(positions.len(), tokens, hidden);
        for (i, &pos) in positions.iter().enumerate() {
            let xb = self.rms_norm(&hidden[i * dim..(i + 1) * dim], self.rms_att + l * dim);
            self.project_kv(l, pos, &xb, k, v);
        }
    }

    /// A KV pass's work per position over a whole layer's (kv_cost): the K
    /// and V projections over all the layer's multiply-adds per token
    /// (attention over the context left out: it only lowers the share).
    pub fn kv_cost(&self) -> f32 {
        let (dim, kvd, hid) = (self.dim, self.kv_dim(), self.hidden_dim);
        (2 * kvd * dim) as f32 / (2 * dim * dim + 2 * kvd * dim + 3 * dim * hid) as f32
    }

    /// Layer `l` for `positions` (ascending): `hidden` holds their rows (at
    /// layer 0 `tokens` gives them), `k` and `v` this layer's KV of the
    /// whole context, `[position][kv_dim]`. Writes the positions' K (after
    /// RoPE) and V, attends each causally, leaves the layer's output in
    /// `hidden`: the contract of kdn's blend callback.
    pub fn layer(
        &self,
        l: usize,
        positions: &[i32],
        tokens: Option<&[i32]>,
        hidden: &mut [f32],
        k: &mut [f32],
        v: &mut [f32],
    ) {
        let (dim, kvd, hd, hid) = (self.dim, self.kv_dim(), self.head_dim, self.hidden_dim);
        let n = positions.len();
        self.embed(n, tokens, hidden);
        let mut q = vec![0f32; n * dim];
        for (i, &pos) in positions.iter().enumerate() {
            let xb = self.rms_norm(&hidden[i * dim..(i + 1) * dim], self.rms_att + l * dim);
            let qi = &mut q[i * dim..(i + 1) * dim];
            self.matmul(self.wq + l * dim * dim, &xb, qi);
            self.rope(qi, pos);
            self.project_kv(l, pos, &xb, k, v);
        }
        let group = self.heads / self.kv_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        for (i, &pos) in positions.iter().enumerate() {
            let mut att = vec![0f32; dim];
            for h in 0..self.heads {
                let g = h / group;
                let qh = &q[i * dim + h * hd..i * dim + (h + 1) * hd];
                let scores: Vec<f32> = (0..=pos as usize)
                    .map(|t| {
                        qh.iter().zip(&k[t * kvd + g * hd..t * kvd + (g + 1) * hd]).map(|(a, b)| a * b).sum::<f32>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let inv = 1.0 / e.iter().sum::<f32>();
                let o = &mut att[h * hd..(h + 1) * hd];
                for (t, et) in e.iter().enumerate() {
                    let vt = &v[t * kvd + g * hd..t * kvd + (g + 1) * hd];
                    for d in 0..hd {
                        o[d] += et * inv * vt[d];
                    }
                }
            }
            let x = &mut hidden[i * dim..(i + 1) * dim];
            let mut tmp = vec![0f32; dim];
            self.matmul(self.wo + l * dim * dim, &att, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
            let xb = self.rms_norm(x, self.rms_ffn + l * dim);
            let (mut h1, mut h3) = (vec![0f32; hid], vec![0f32; hid]);
            self.matmul(self.w1 + l * hid * dim, &xb, &mut h1);
            self.matmul(self.w3 + l * hid * dim, &xb, &mut h3);
            for (a, b) in h1.iter_mut().zip(&h3) {
                *a = *a / (1.0 + (-*a).exp()) * b;
            }
            self.matmul(self.w2 + l * dim * hid, &h1, &mut tmp);
            x.iter_mut().zip(&tmp).for_each(|(a, b)| *a += b);
        }
    }

    /// The KV of `tokens` computed from position 0, canonical
    /// (`[layer][k|v][token][kv_dim]`), as kdn_knowledge_put takes it.
    pub fn prefill(&self, tokens: &[i32]) -> Vec<f32> {
        let (n, kvd) = (tokens.len(), self.kv_dim());
        let positions: Vec<i32> = (0..n as i32).collect();
        let mut hidden = vec![0f32; n * self.dim];
        let mut out = vec![0f32; self.layers * 2 * n * kvd];
        for l in 0..self.layers {
            let (k, v) = out[l * 2 * n * kvd..(l + 1) * 2 * n * kvd].split_at_mut(n * kvd);
            self.layer(l, &positions, (l == 0).then_some(tokens), &mut hidden, k, v);
        }
        out
    }
}

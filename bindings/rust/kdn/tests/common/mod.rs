// SPDX-License-Identifier: Apache-2.0
//! Shared by the integration tests: a small model's shape, KV with a
//! deterministic pattern (byte-exact round trips test the plumbing), and the
//! reference model's real KV.
#![allow(dead_code)]

pub mod at_rest;
pub mod transformer;

use kdn::{DType, Model, ModelSpec, Runtime, RuntimeOptions, TierConfig};
use std::path::PathBuf;

/// The reference model's shape (stories260K): 5 layers, 4 KV heads of 8.
pub const LAYERS: usize = 5;
pub const HEADS: usize = 4;
pub const DIM: usize = 8;
pub const ROW: usize = HEADS * DIM;
pub const CHUNK: u32 = 16;
pub const TOKENS: usize = 48;

pub fn spec(fingerprint: &str) -> ModelSpec {
    ModelSpec::new(LAYERS as u32, HEADS as u32, DIM as u32, DType::F32, fingerprint)
}

pub fn runtime() -> Runtime {
    Runtime::new(&RuntimeOptions::default().with_chunk_tokens(CHUNK).with_tier(TierConfig::host(16 << 20))).unwrap()
}

pub fn setup() -> (Runtime, Model) {
    let rt = runtime();
    let model = rt.model(&spec("test-model")).unwrap();
    (rt, model)
}

pub fn tokens(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| 7 + (i * 37) % 500).collect()
}

/// The value of element (layer, k|v, token, head, dim): unique in the test's KV.
pub fn value(layer: usize, kv: usize, token: usize, head: usize, dim: usize) -> f32 {
    (layer * 100_000 + kv * 50_000 + token * 100 + head * 10 + dim) as f32
}

/// The canonical layout [layer][k|v][token][head][dim] of `n` tokens.
pub fn canonical(n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(LAYERS * 2 * n * ROW);
    for l in 0..LAYERS {
        for kv in 0..2 {
            for t in 0..n {
                for h in 0..HEADS {
                    for d in 0..DIM {
                        out.push(value(l, kv, t, h, d));
                    }
                }
            }
        }
    }
    out
}

fn models_dir() -> PathBuf {
    std::env::var_os("KDN_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../models"))
}

/// The reference model's KV for BOS and its first 47 greedy tokens
/// (models/reference/kv260k.{k,v}.f32, [layer][position][head][dim]) and
/// those tokens (as examples/c lists them).
pub fn reference_kv() -> (Vec<i32>, Vec<f32>, Vec<f32>) {
    let tokens = vec![
        1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410,
        408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388,
        426, 338, 391, 266,
    ];
    let dir = models_dir().join("reference");
    (tokens, read_f32(&dir.join("kv260k.k.f32")), read_f32(&dir.join("kv260k.v.f32")))
}

/// The reference KV of [`reference_kv`] in the canonical layout
/// `[layer][k|v][position][head][dim]`.
pub fn reference_canonical() -> (Vec<i32>, Vec<f32>) {
    let (tokens, k, v) = reference_kv();
    let layer = tokens.len() * ROW;
    let kv = (0..LAYERS)
        .flat_map(|l| k[l * layer..(l + 1) * layer].iter().chain(&v[l * layer..(l + 1) * layer]))
        .copied()
        .collect();
    (tokens, kv)
}

pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

pub fn read_i32(path: &std::path::Path) -> Vec<i32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Polls `f` until it is true (5 s at most).
pub fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

// SPDX-License-Identifier: Apache-2.0
//! The Rust side of `kdn bench bindings`: a 32 MiB retrieve into a `Vec<u8>`
//! and a 256-token lookup, with the parameters every binding's bench uses
//! (notes: Llama-3-8B's KV shape, bf16, one chunk of 256 tokens). Prints one
//! line of JSON: {"retrieve_gbps": x, "lookup_us": y}.
//!
//! cargo run --release --offline --example bench -- --repeats N
use kdn::{DType, KvView, KvViewMut, ModelSpec, Runtime, RuntimeOptions, TierConfig};
use std::time::Instant;

const CHUNK_BYTES: usize = 32 << 20; // 256 tokens x 32 layers x 2 x 8 heads x 128 x 2 bytes

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> kdn::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let repeats: usize = match args.iter().position(|a| a == "--repeats") {
        Some(i) => args.get(i + 1).and_then(|n| n.parse().ok()).filter(|&n| n > 0).unwrap_or_else(|| {
            eprintln!("usage: bench [--repeats N]  (N >= 1)");
            std::process::exit(2)
        }),
        None => 20,
    };

    let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(256).with_tier(TierConfig::host(256 << 20)))?;
    let model = rt.model(&ModelSpec::new(32, 8, 128, DType::BF16, "bench-8b"))?;
    assert_eq!(model.kv_bytes_per_token() as usize * 256, CHUNK_BYTES);
    let tokens: Vec<i32> = (0..256).map(|i| i % 32000).collect();
    let src: Vec<u8> = (0..CHUNK_BYTES).map(|i| (i * 31 % 251) as u8).collect();
    let stored = model.store("bench", &tokens, &KvView::canonical(&src, DType::BF16))?;
    assert_eq!(stored.tokens, 256);

    let mut dst = vec![0u8; CHUNK_BYTES];
    let mut seconds = Vec::with_capacity(repeats);
    {
        let mut view = KvViewMut::canonical(&mut dst, DType::BF16);
        for i in 0..=repeats {
            let start = Instant::now();
            let got = model.retrieve("bench", &tokens, &mut view)?;
            let elapsed = start.elapsed().as_secs_f64();
            assert_eq!(got.tokens, 256);
            if i > 0 {
                seconds.push(elapsed); // the first is the warm-up
            }
        }
    }
    assert!(dst == src, "the retrieved KV differs from the stored KV");
    let retrieve_gbps = CHUNK_BYTES as f64 / median(seconds) / 1e9;

    const CALLS: usize = 20_000;
    let mut batches = Vec::with_capacity(5);
    for _ in 0..5 {
        let start = Instant::now();
        for _ in 0..CALLS {
            let found = model.lookup("bench", &tokens)?;
            debug_assert_eq!(found.cached_tokens, 256);
            std::hint::black_box(found);
        }
        batches.push(start.elapsed().as_secs_f64() * 1e6 / CALLS as f64);
    }
    assert_eq!(model.lookup("bench", &tokens)?.cached_tokens, 256);
    let lookup_us = median(batches);
    println!("{{\"retrieve_gbps\": {retrieve_gbps:.3}, \"lookup_us\": {lookup_us:.4}}}");
    Ok(())
}

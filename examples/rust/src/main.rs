// SPDX-License-Identifier: Apache-2.0
//! kdn from a Rust host program: keep the KV cache of a prompt, find it
//! again, read it back, check every byte, keep it as a knowledge item, print
//! the statistics. The KV is real: the reference model's (stories260K: 5
//! layers, 4 KV heads of 8 dims, f32), as `kdn generate --dump-kv PREFIX`
//! wrote it: PREFIX.k.f32 and .v.f32 ([layer][position][head][dim]) and
//! PREFIX.tokens.i32.
//!
//! Run, with pkg-config finding kdn (a build tree's `build/pkgconfig`, or an
//! installed kdn.pc); build.rs gives the binary a run path to libkdn:
//!   PKG_CONFIG_PATH=BUILD/pkgconfig cargo run -- PREFIX
use kdn::{DType, KvView, KvViewMut, ModelSpec, Request, Runtime, RuntimeOptions, TierConfig, ViewSpec};

const LAYERS: usize = 5;
const ROW: usize = 4 * 8; // one token's K (or V) in one layer: 4 heads of 8

fn read<T>(path: &str, from_le: fn([u8; 4]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    bytes.chunks_exact(4).map(|b| from_le([b[0], b[1], b[2], b[3]])).collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prefix = std::env::args().nth(1).ok_or("usage: kdn-example PREFIX (of kdn generate --dump-kv)")?;
    let tokens: Vec<i32> = read(&format!("{prefix}.tokens.i32"), i32::from_le_bytes);
    let mut kv: Vec<f32> = read(&format!("{prefix}.k.f32"), f32::from_le_bytes); // K file, then V file
    kv.extend(read(&format!("{prefix}.v.f32"), f32::from_le_bytes));
    let n = tokens.len();
    assert_eq!(kv.len(), 2 * LAYERS * n * ROW, "{prefix}: not 5 layers of 4 x 8 per token");
    println!("kdn {} (library); {} tokens of real KV from {prefix}", kdn::version(), n);

    let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(16).with_tier(TierConfig::host(16 << 20)))?;
    let model = rt.model(&ModelSpec::new(LAYERS as u32, 4, 8, DType::F32, "stories260K"))?;

    // Store the KV where it lies: layer l's K at l * n * ROW elements, its V one K file further.
    let engine =
        ViewSpec::canonical(DType::F32).with_strides((n * ROW) as i64, (LAYERS * n * ROW) as i64, ROW as i64, 8, 1);
    let stored = model.store("example", &tokens, &KvView::new(&kv, &engine)?)?;
    println!("stored: {} tokens cached", stored.tokens);

    // Look up the prompt and its first 40 tokens: only whole chunks count (32).
    let found = model.lookup_batch("example", &[Request::from(&tokens), Request::from(&tokens[..40])])?;
    let cached: Vec<u64> = found.into_iter().map(|r| r.map(|l| l.cached_tokens)).collect::<Result<_, _>>()?;
    println!("lookup of {} and 40 tokens: {:?} cached", n, cached);
    assert_eq!(cached, [n as u64, 32]);

    // Retrieve into a canonical buffer ([layer][k|v][token][head][dim]) and compare every byte.
    let mut canonical = vec![0f32; kv.len()];
    let got = model.retrieve("example", &tokens, &mut KvViewMut::canonical(&mut canonical, DType::F32))?;
    assert_eq!((got.tokens, got.lossy()), (n as u64, false));
    let layer = n * ROW;
    for l in 0..LAYERS {
        for (which, file_at) in [(0, l * layer), (1, (LAYERS + l) * layer)] {
            let at = (2 * l + which) * layer;
            let (got, want) = (&canonical[at..at + layer], &kv[file_at..file_at + layer]);
            assert!(kdn::as_bytes(got) == kdn::as_bytes(want), "layer {l} differs");
        }
    }
    println!("retrieved: {} tokens, all {} bytes equal to the files", got.tokens, kv.len() * 4);

    // The same KV as a knowledge item: put, list, fetch, compare.
    let docs = model.knowledge("example");
    docs.put("story", 1, b"Once upon a time", &tokens, &KvView::canonical(&canonical, DType::F32))?;
    for doc in docs.list()? {
        println!(
            "document {:?}: version {}, {} tokens in {} chunks",
            doc.doc_id, doc.version, doc.num_tokens, doc.chunks
        );
    }
    let (doc_tokens, doc_kv) = docs.fetch_to_vec("story")?;
    assert!(doc_tokens == tokens && doc_kv == kdn::as_bytes(&canonical), "the fetched document differs");
    println!("fetched \"story\": {} tokens, KV equal", doc_tokens.len());

    let s = rt.stats()?;
    println!("stats: {} lookups, {} stores, {} retrieves, {} chunk hits", s.lookups, s.stores, s.retrieves, s.hits);
    println!(
        "       {} tokens stored, {} served; {} chunks, {:.2} of {:.2} MiB",
        s.tokens_stored,
        s.tokens_served,
        s.chunks,
        mib(s.used_bytes),
        mib(s.capacity_bytes)
    );
    for (i, t) in rt.all_tier_stats()?.iter().enumerate() {
        let (name, codec, used, cap) = (&t.name, &t.codec, mib(t.used_bytes), mib(t.capacity_bytes));
        println!("tier {i}: {name} (codec {codec}): {} objects, {} hits, {used:.2} of {cap:.2} MiB", t.objects, t.hits);
    }
    println!("ok");
    Ok(())
}

// SPDX-License-Identifier: Apache-2.0
//! The editor callback: a Rust closure behind an `extern "C"` shim, run on
//! kdn's own mover thread. One that edits, one that fails, one that panics.

mod common;
use common::*;
use kdn::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const NS: &str = "edited";

/// A runtime with one chunk of 48 tokens (one edit), the editor given.
fn editor_runtime<F>(edit: F) -> (Runtime, Model)
where
    F: FnMut(&ChunkInfo, &mut [u8]) -> Result<bool> + Send + 'static,
{
    let rt = Runtime::with_editor(&RuntimeOptions::default().with_chunk_tokens(TOKENS as u32), edit).unwrap();
    let model = rt.model(&spec("editor-model")).unwrap();
    (rt, model)
}

fn retrieve(model: &Model) -> Vec<f32> {
    let mut out = vec![0f32; LAYERS * 2 * TOKENS * ROW];
    let r = model.retrieve(NS, &tokens(TOKENS), &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!(r.tokens, 48);
    out
}

#[test]
fn an_editor_rewrites_the_stored_chunk_on_the_mover_thread() {
    // (chunk, its bytes, the calling thread, its Rust name)
    type Call = (ChunkInfo, usize, std::thread::ThreadId, Option<String>);
    let seen: Arc<Mutex<Vec<Call>>> = Arc::default();
    let log = Arc::clone(&seen);
    let (rt, model) = editor_runtime(move |info, kv| {
        log.lock().unwrap().push((
            info.clone(),
            kv.len(),
            std::thread::current().id(),
            std::thread::current().name().map(String::from),
        ));
        // V of layer 0 plus one (canonical: layer 0's K, then its V).
        let f = as_f32_mut(kv).expect("f32 KV");
        let row = (info.num_kv_heads * info.head_dim) as usize;
        let v0 = info.num_tokens as usize * row;
        for x in &mut f[v0..2 * v0] {
            *x += 1.0;
        }
        Ok(true)
    });
    let kv = canonical(TOKENS);
    model.store(NS, &tokens(TOKENS), &KvView::canonical(&kv, DType::F32)).unwrap();
    assert!(eventually(|| rt.stats().unwrap().edits == 1));

    let (info, bytes, thread, name) = seen.lock().unwrap()[0].clone();
    assert_eq!((info.num_layers, info.num_kv_heads, info.head_dim, info.num_tokens), (5, 4, 8, 48));
    assert_eq!((info.dtype, info.first_position), (DType::F32, Some(0)));
    assert_eq!(info.model_fingerprint, model.fingerprint().unwrap());
    assert_eq!(bytes, 48 * model.kv_bytes_per_token() as usize);
    assert_ne!(thread, std::thread::current().id(), "called on kdn's thread");
    assert_eq!(name, None, "a thread Rust did not create has no Rust name");

    // The edited chunk replaces the stored one a moment after the edit counts.
    let mut want = kv.clone();
    for x in &mut want[TOKENS * ROW..2 * TOKENS * ROW] {
        *x += 1.0;
    }
    assert!(eventually(|| retrieve(&model) == want), "the retrieved KV carries the edit");
    assert!(rt.stats().unwrap().edited_served >= 1);
}

#[test]
fn test_bad_editor_error() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let (rt, model) = editor_runtime(move |_, kv| {
        counter.fetch_add(1, Ordering::SeqCst);
        kv.fill(0xAB); // scribbles, then fails: kdn keeps the chunk as it was
        Err(Error::new(Status::Unsupported, "this editor refuses"))
    });
    let kv = canonical(TOKENS);
    model.store(NS, &tokens(TOKENS), &KvView::canonical(&kv, DType::F32)).unwrap();
    assert!(eventually(|| calls.load(Ordering::SeqCst) == 1));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(rt.stats().unwrap().edits, 0);
    assert_eq!(retrieve(&model), kv);
    // The runtime keeps working.
    model.store(NS, &tokens(TOKENS + 48)[48..], &KvView::canonical(&kv, DType::F32)).unwrap();
    assert!(eventually(|| calls.load(Ordering::SeqCst) == 2));
}

#[test]
fn test_bad_editor_panic() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let (rt, model) = editor_runtime(move |_, kv| {
        counter.fetch_add(1, Ordering::SeqCst);
        kv[0] = 0xFF;
        panic!("an editor that panics (expected in this test)");
    });
    let kv = canonical(TOKENS);
    model.store(NS, &tokens(TOKENS), &KvView::canonical(&kv, DType::F32)).unwrap();
    assert!(eventually(|| calls.load(Ordering::SeqCst) == 1));
    std::thread::sleep(std::time::Duration::from_millis(50));
    // Caught at the boundary (KDN_ERR_INTERNAL): no abort, chunk unedited.
    assert_eq!(rt.stats().unwrap().edits, 0);
    assert_eq!(retrieve(&model), kv);
    // Called again for the next chunk (the closure's lock was poisoned, not lost).
    let other: Vec<i32> = tokens(TOKENS).iter().map(|t| t + 1000).collect();
    model.store(NS, &other, &KvView::canonical(&kv, DType::F32)).unwrap();
    assert!(eventually(|| calls.load(Ordering::SeqCst) == 2));
    assert_eq!(model.lookup(NS, &other).unwrap().cached_tokens, 48);
}

#[test]
fn the_editor_lives_as_long_as_the_models() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let (rt, model) = editor_runtime(move |_, _| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(false)
    });
    drop(rt); // the model keeps the runtime, and so the closure, alive
    model.store(NS, &tokens(TOKENS), &KvView::canonical(&canonical(TOKENS), DType::F32)).unwrap();
    assert!(eventually(|| calls.load(Ordering::SeqCst) == 1));
    drop(model);
    assert_eq!(Arc::strong_count(&calls), 1, "the closure is freed with the last handle");
}

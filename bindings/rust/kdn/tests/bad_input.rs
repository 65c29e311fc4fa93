// SPDX-License-Identifier: Apache-2.0
//! Bad input gives an `Err` (never a crash): the cases every binding tests
//! under the same names (plan section 7), and a few Rust-only ones. The
//! editor's two cases are in editor.rs; what the types rule out (a closed
//! handle used, retrieving into read-only memory) are `compile_fail`
//! doctests in the crate.

mod common;
use common::*;
use kdn::*;
use std::time::Duration;

const NS: &str = "bad";

fn assert_status<T: std::fmt::Debug>(r: Result<T>, status: Status) -> Error {
    let e = r.expect_err("an error");
    assert_eq!(e.status(), status, "{e}");
    e
}

#[test]
fn test_bad_small_buffer() {
    let (rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    // One token short, for a store and for a retrieve: refused before anything is touched.
    let short = &kv[..kv.len() - 1];
    let e = assert_status(model.store(NS, &tokens, &KvView::canonical(short, DType::F32)), Status::InvalidArgument);
    assert!(!e.message().is_empty() && e.is_caller_error());
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let mut out = vec![7f32; kv.len() - 1];
    assert_status(
        model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)),
        Status::InvalidArgument,
    );
    assert!(out.iter().all(|&x| x == 7.0), "nothing written");
    // Strides that reach past the slice.
    let spec = ViewSpec::canonical(DType::F32).with_strides(0, 0, (2 * ROW) as i64, DIM as i64, 1).with_layers(vec![0]);
    let mut one_layer = vec![0f32; 2 * TOKENS * ROW];
    assert_status(
        model.retrieve(NS, &tokens, &mut KvViewMut::new(&mut one_layer, &spec).unwrap()),
        Status::InvalidArgument,
    );
    // An async load into a buffer too small owns it and refuses it.
    assert_status(
        model.load_async(NS, &tokens, vec![0u8; 16], &ViewSpec::canonical(DType::F32)),
        Status::InvalidArgument,
    );
    assert_eq!(rt.stats().unwrap().retrieves, 0);
}

#[test]
fn test_bad_readonly_buffer() {
    // Retrieving into read-only memory does not compile (KvViewMut takes
    // `&mut`; see the compile_fail doctest of KvViewMut). A store reads a
    // shared slice and leaves it as it was.
    let (_rt, model) = setup();
    static KV: [f32; LAYERS * 2 * 16 * ROW] = [0.25; LAYERS * 2 * 16 * ROW];
    let tokens = tokens(16);
    assert_eq!(model.store(NS, &tokens, &KvView::canonical(&KV[..], DType::F32)).unwrap().tokens, 16);
    assert!(KV.iter().all(|&x| x == 0.25));
}

#[test]
fn test_bad_dtype() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    // f16 data (u16) for an f32 model, and an f32 slice that claims BF16.
    let half = vec![0u16; LAYERS * 2 * TOKENS * ROW * 2];
    assert_status(model.store(NS, &tokens, &KvView::canonical(&half, DType::F16)), Status::InvalidArgument);
    let kv = canonical(TOKENS);
    assert_status(model.store(NS, &tokens, &KvView::canonical(&kv, DType::BF16)), Status::InvalidArgument);
    assert_status(model.store(NS, &tokens, &KvView::canonical(&kv, DType::Unknown(77))), Status::InvalidArgument);
    // A model of an unknown dtype.
    let rt = runtime();
    let mut s = spec("x");
    s.dtype = DType::Unknown(9);
    assert_status(rt.model(&s), Status::InvalidArgument);
}

#[test]
fn test_bad_closed_handle() {
    // Using a closed handle does not compile (close and into_buffer take
    // the handle by value: compile_fail doctests of Runtime and Op). What
    // stays usable after a close does.
    let (rt, model) = setup();
    rt.close();
    let kv = canonical(TOKENS);
    assert_eq!(model.store(NS, &tokens(TOKENS), &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 48);
    let op = model.load_async(NS, &tokens(TOKENS), vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).unwrap();
    model.close(); // the op keeps the model's runtime alive
    let (r, loaded) = op.finish().unwrap();
    assert_eq!((r.tokens, loaded), (48, kv));
}

#[test]
fn test_bad_null_argument() {
    // Rust has no null references: the nearest are empty strings and slices.
    let (rt, model) = setup();
    let kv = canonical(TOKENS);
    let tokens = tokens(TOKENS);
    assert_status(model.store("", &tokens, &KvView::canonical(&kv, DType::F32)), Status::InvalidArgument);
    assert_status(model.lookup("", &tokens), Status::InvalidArgument);
    assert_status(model.lookup("x".repeat(4097), &tokens), Status::InvalidArgument);
    assert_status(rt.model(&spec("")), Status::InvalidArgument);
    assert_status(model.store_views(NS, &tokens, &[]), Status::InvalidArgument);
    assert_status(
        model.knowledge(NS).put("", 1, b"", &tokens, &KvView::canonical(&kv, DType::F32)),
        Status::InvalidArgument,
    );
    let empty = ModelSpec::new(0, 4, 8, DType::F32, "zero layers");
    assert_status(rt.model(&empty), Status::InvalidArgument);
}

#[test]
fn test_bad_negative_token() {
    let (_rt, model) = setup();
    let mut tokens = tokens(TOKENS);
    tokens[20] = -3;
    let kv = canonical(TOKENS);
    assert_status(model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)), Status::InvalidArgument);
    assert_status(model.lookup(NS, &tokens), Status::InvalidArgument);
    let mut out = vec![0f32; kv.len()];
    assert_status(
        model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)),
        Status::InvalidArgument,
    );
}

#[test]
fn test_bad_tier_config() {
    let bad = |tier: TierConfig| Runtime::new(&RuntimeOptions::default().with_tier(tier)).map(|_| ());
    assert_status(bad(TierConfig::host(0)), Status::InvalidArgument);
    assert_status(bad(TierConfig::host(1 << 20).with_codec("nope")), Status::InvalidArgument);
    assert_status(bad(TierConfig::host(1 << 20).with_codec("zstd:level=999")), Status::InvalidArgument);
    assert_status(
        bad(TierConfig { kind: TierKind::Unknown(42), ..TierConfig::host(1 << 20) }),
        Status::InvalidArgument,
    );
    assert_status(bad(TierConfig::host(1 << 20).with_policy(EvictionPolicy::Unknown(5))), Status::InvalidArgument);
    assert_status(bad(TierConfig { path: None, ..TierConfig::disk("/unused", 1 << 20) }), Status::InvalidArgument);
    assert_status(bad(TierConfig::remote("", "")), Status::InvalidArgument);
    let nine = RuntimeOptions { tiers: vec![TierConfig::host(1 << 20); 9], ..Default::default() };
    assert_status(Runtime::new(&nine), Status::InvalidArgument);
    assert_status(Runtime::new(&RuntimeOptions::default().with_chunk_tokens(0)), Status::InvalidArgument);
    assert_status(Runtime::new(&RuntimeOptions::default().with_worker_threads(65)), Status::InvalidArgument);
}

#[test]
fn test_bad_redis_address() {
    // Refused when the runtime is created; no server is contacted.
    let e = assert_status(
        Runtime::new(&RuntimeOptions::default().with_tier(TierConfig::redis("not-an-address", ""))),
        Status::InvalidArgument,
    );
    assert!(e.message().contains("not-an-address"), "{e}");
    assert!(e.is_caller_error());
}

#[test]
fn test_bad_redis_fields_on_host_tier() {
    let bad = |tier: TierConfig| Runtime::new(&RuntimeOptions::default().with_tier(tier)).map(|_| ());
    let e = assert_status(bad(TierConfig::host(1 << 20).with_user("kdn")), Status::InvalidArgument);
    assert!(e.message().contains("redis"), "{e}");
    assert_status(bad(TierConfig::host(1 << 20).with_ttl(Duration::from_secs(60))), Status::InvalidArgument);
    assert_status(bad(TierConfig::disk("/unused", 1 << 20).with_ttl(Duration::from_nanos(1))), Status::InvalidArgument);
}

#[test]
fn test_bad_report_prefill() {
    let (rt, model) = setup();
    let e = assert_status(model.report_prefill(0, Duration::from_millis(5)), Status::InvalidArgument);
    assert!(e.is_caller_error() && !e.message().is_empty(), "{e}");
    assert_status(model.report_prefill(16, Duration::ZERO), Status::InvalidArgument);
    // Over an hour per token: seconds taken for nanoseconds.
    assert_status(model.report_prefill(2, Duration::from_secs(2 * 3600 + 1)), Status::InvalidArgument);
    // More nanoseconds than a u64 holds: refused by the binding.
    assert_status(model.report_prefill(u64::MAX, Duration::MAX), Status::InvalidArgument);
    let s = rt.stats().unwrap();
    assert_eq!((s.prefill_tokens, s.prefill_ns), (0, 0), "a refused report counts nothing");
}

#[test]
fn test_bad_unknown_document() {
    let (_rt, model) = setup();
    let docs = model.knowledge(NS);
    let e = assert_status(docs.info("no-such-doc"), Status::NotFound);
    assert_eq!(e.family(), Family::Other);
    let mut buf = vec![0f32; LAYERS * 2 * TOKENS * ROW];
    assert_status(
        docs.fetch("no-such-doc", Some(&mut KvViewMut::canonical(&mut buf, DType::F32)), None),
        Status::NotFound,
    );
    assert_status(docs.fetch_to_vec("no-such-doc"), Status::NotFound);
    assert_status(docs.pin("no-such-doc", None), Status::NotFound);
    let long = "d".repeat(256);
    assert_status(docs.info(&long), Status::InvalidArgument);
    assert_status(
        docs.put(&long, 1, b"", &tokens(16), &KvView::canonical(&canonical(16), DType::F32)),
        Status::InvalidArgument,
    );
    assert_status(docs.expire("no-such-doc", Duration::from_secs(1)), Status::NotFound);
}

#[test]
fn test_bad_fetch_buffer_too_small() {
    let (_rt, model) = setup();
    let docs = model.knowledge(NS);
    let tokens = tokens(TOKENS);
    docs.put("story", 1, b"", &tokens, &KvView::canonical(&canonical(TOKENS), DType::F32)).unwrap();
    // Tokens: room for 47 of 48.
    let mut ids = vec![-1i32; 47];
    let e = assert_status(docs.fetch("story", None, Some(&mut ids)), Status::BufferTooSmall);
    assert_eq!((e.needed(), e.family()), (Some(48), Family::Caller));
    assert!(ids.iter().all(|&t| t == -1), "nothing written");
    // KV: a canonical buffer of 32 tokens.
    let mut kv = vec![0f32; LAYERS * 2 * 32 * ROW];
    let e = assert_status(
        docs.fetch("story", Some(&mut KvViewMut::canonical(&mut kv, DType::F32)), None),
        Status::BufferTooSmall,
    );
    assert_eq!(e.needed(), Some(48));
    assert!(kv.iter().all(|&x| x == 0.0));
    // Less than one token of room.
    let mut tiny = vec![0f32; 3];
    assert_status(
        docs.fetch("story", Some(&mut KvViewMut::canonical(&mut tiny, DType::F32)), None),
        Status::BufferTooSmall,
    );
    // Enough: the length alone.
    assert_eq!(docs.fetch("story", None, None).unwrap().tokens, 48);
}

#[test]
fn test_bad_batched_lookup() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&canonical(TOKENS), DType::F32)).unwrap();
    let negative = [1, -1, 2];
    let bad_hash = [0u8; 10];
    let partial_hash = [0u8; 12];
    let found = model
        .lookup_batch(
            NS,
            &[
                Request::from(&tokens),
                Request::from(&negative),
                Request::BlockHashes { hashes: &bad_hash, hash_bytes: 65, block_tokens: 16 },
                Request::from(&tokens[..32]),
                Request::BlockHashes { hashes: &partial_hash, hash_bytes: 8, block_tokens: 16 },
            ],
        )
        .unwrap();
    assert_eq!(found.len(), 5);
    assert_eq!(found[4].as_ref().unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(found[0].as_ref().unwrap().cached_tokens, 48);
    assert_eq!(found[1].as_ref().unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(found[2].as_ref().unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(found[3].as_ref().unwrap().cached_tokens, 32);
}

#[test]
fn test_bad_u32_token_id() {
    // Rust only: a u32 id above i32::MAX (the C ABI's ids are int32) is
    // refused before any C call, by every call that takes tokens.
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let mut ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    ids[20] = 1 << 31;
    let e = assert_status(model.lookup(NS, &ids), Status::InvalidArgument);
    assert!(e.is_caller_error() && e.message().contains("2147483648") && e.message().contains("at 20"), "{e}");
    assert_status(model.lookup(NS, &[u32::MAX]), Status::InvalidArgument);
    assert_status(model.store(NS, &ids, &KvView::canonical(&kv, DType::F32)), Status::InvalidArgument);
    let mut out = vec![0f32; kv.len()];
    assert_status(model.retrieve(NS, &ids, &mut KvViewMut::canonical(&mut out, DType::F32)), Status::InvalidArgument);
    assert!(out.iter().all(|&x| x == 0.0), "nothing written");
    assert_status(
        model.load_async(NS, &ids, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).map(|_| ()),
        Status::InvalidArgument,
    );
    assert_status(
        model.knowledge(NS).put("doc", 1, b"", &ids, &KvView::canonical(&kv, DType::F32)),
        Status::InvalidArgument,
    );
    assert_status(model.knowledge(NS).info("doc"), Status::NotFound);
    // In a batch the bad request fails alone, in its place.
    let found = model
        .lookup_batch(
            NS,
            &[Request::from(&ids), Request::from(&tokens), Request::from(&[u32::MAX]), Request::from(&ids[..16])],
        )
        .unwrap();
    assert_eq!(found.len(), 4);
    assert_eq!(found[0].as_ref().unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(found[1].as_ref().unwrap().cached_tokens, 48);
    assert_eq!(found[2].as_ref().unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(found[3].as_ref().unwrap().cached_tokens, 16);
    // Only bad requests: every one its error (and no C call, which refuses an empty batch).
    let found = model.lookup_batch(NS, &[Request::from(&ids)]).unwrap();
    assert_eq!(found[0].as_ref().unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn test_bad_salt_too_long() {
    // A salt is at most 4096 bytes (since 1.13): a longer one is refused by
    // every call that takes a request, storing and writing nothing; in a
    // batch it fails alone.
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let (most, over) = (vec![7u8; 4096], vec![7u8; 4097]);
    let too_long = Request::from(&tokens).with_salt(&over);
    assert_status(model.lookup(NS, too_long), Status::InvalidArgument);
    let e = assert_status(model.store(NS, too_long, &KvView::canonical(&kv, DType::F32)), Status::InvalidArgument);
    assert!(e.is_caller_error() && e.message().contains("salt"), "{e}");
    let mut out = vec![0f32; kv.len()];
    assert_status(
        model.retrieve(NS, too_long, &mut KvViewMut::canonical(&mut out, DType::F32)),
        Status::InvalidArgument,
    );
    assert_status(
        model.load_async(NS, too_long, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).map(|_| ()),
        Status::InvalidArgument,
    );
    assert_status(
        model.save_async(NS, too_long, kv.clone(), &ViewSpec::canonical(DType::F32)).map(|_| ()),
        Status::InvalidArgument,
    );
    // 4096 bytes is fine; the refused store left nothing.
    let at_most = Request::from(&tokens).with_salt(&most);
    assert_eq!(model.lookup(NS, at_most).unwrap().cached_tokens, 0);
    assert_eq!(model.store(NS, at_most, &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 48);
    let found = model.lookup_batch(NS, &[at_most, too_long, Request::from(&tokens)]).unwrap();
    assert_eq!(found[0].as_ref().unwrap().cached_tokens, 48);
    assert_eq!(found[1].as_ref().unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(found[2].as_ref().unwrap().cached_tokens, 0);
}

#[test]
fn test_bad_op_wait_after_close() {
    // Waiting on a finished (consumed) op does not compile: the compile_fail
    // doctest of Op. At run time: a cancelled op's waits say Cancelled, a
    // layer beyond the model is refused, and a save's layer_ready on a load.
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let op = model.load_async(NS, &tokens, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).unwrap();
    assert_status(op.wait_layer(LAYERS as u32, Some(Duration::from_secs(5))), Status::InvalidArgument);
    assert_status(op.layer_ready(0), Status::InvalidArgument);
    op.wait(None).unwrap();
    let save = model.save_async("other", &tokens, kv.clone(), &ViewSpec::canonical(DType::F32)).unwrap();
    assert_status(save.layer_ready(LAYERS as u32), Status::InvalidArgument);
    save.cancel().unwrap();
    for layer in 0..LAYERS as u32 {
        let _ = save.layer_ready(layer);
    }
    assert_status(save.wait(Some(Duration::from_secs(10))), Status::Cancelled);
    assert_status(save.wait(Some(Duration::ZERO)), Status::Cancelled);
}

#[test]
fn test_bad_view_bounds() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    // A paged table entry past the allocations (5 blocks each): num_blocks is filled from the slices.
    let layer = vec![0f32; 5 * 16 * ROW];
    let k: Vec<&[f32]> = vec![&layer; LAYERS];
    let spec = ViewSpec::paged(DType::F32, Layout::PagedNhd, 16, vec![0, 1, 5]);
    assert_status(model.store(NS, &tokens, &KvView::per_layer(&k, &k, &spec).unwrap()), Status::InvalidArgument);
    let spec = ViewSpec::paged(DType::F32, Layout::PagedNhd, 16, vec![0, -1, 2]);
    assert_status(model.store(NS, &tokens, &KvView::per_layer(&k, &k, &spec).unwrap()), Status::InvalidArgument);
    // A layer smaller than one block, a paged view over one buffer.
    let small = [0f32; 4];
    let spec = ViewSpec::paged(DType::F32, Layout::PagedHnd, 16, vec![0, 1, 2]);
    assert_status(
        model.store(NS, &tokens, &KvView::per_layer(&[&small[..]; LAYERS], &[&small[..]; LAYERS], &spec).unwrap()),
        Status::InvalidArgument,
    );
    assert_status(KvView::new(&kv, &spec).map(|_| ()), Status::InvalidArgument);
    // Per-layer allocations: fewer than the model's layers, K and V counts that differ, offsets past the buffer.
    let spec = ViewSpec::canonical(DType::F32).with_token_strides(ROW as i64, DIM as i64, 1);
    let two: Vec<&[f32]> = vec![&kv[..TOKENS * ROW]; 2];
    assert_status(model.store(NS, &tokens, &KvView::per_layer(&two, &two, &spec).unwrap()), Status::InvalidArgument);
    assert_status(KvView::per_layer(&two, &two[..1], &spec).map(|_| ()), Status::InvalidArgument);
    let offsets = spec.clone().with_layer_offsets(vec![0; LAYERS], vec![kv.len() * 4; LAYERS], 4);
    assert_status(KvView::new(&kv, &offsets).map(|_| ()), Status::InvalidArgument);
    // Layers: one twice, one missing, one beyond the model; an unknown layout.
    let twice = ViewSpec::canonical(DType::F32).with_layers(vec![0, 1, 1, 2, 3]);
    assert_status(model.store(NS, &tokens, &KvView::new(&kv, &twice).unwrap()), Status::InvalidArgument);
    let missing = ViewSpec::canonical(DType::F32).with_layers(vec![0, 1, 2, 3]);
    assert_status(model.store(NS, &tokens, &KvView::new(&kv, &missing).unwrap()), Status::InvalidArgument);
    let beyond = ViewSpec::canonical(DType::F32).with_layers(vec![0, 1, 2, 3, 9]);
    assert_status(model.store(NS, &tokens, &KvView::new(&kv, &beyond).unwrap()), Status::InvalidArgument);
    let unknown = ViewSpec { layout: Layout::Unknown(3), ..ViewSpec::canonical(DType::F32) };
    assert_status(KvView::new(&kv, &unknown).map(|_| ()), Status::InvalidArgument);
    let unknown = unknown.with_layer_offsets(vec![0; LAYERS], vec![0; LAYERS], 16 * ROW * 4);
    assert_status(model.store(NS, &tokens, &KvView::new(&kv, &unknown).unwrap()), Status::InvalidArgument);
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, 0, "nothing was stored");
}

#[test]
fn test_bad_status_codes() {
    assert_eq!(Status::from_code(0), None);
    assert_eq!(Status::from_code(-2), Some(Status::NotFound));
    assert_eq!(Status::from_code(-999), Some(Status::Unknown(-999)));
    assert_eq!(Status::Unknown(-999).family(), Family::Other);
    assert_eq!(Status::Unknown(-999).name(), "KDN_ERR_UNKNOWN");
    assert_eq!(Status::BufferTooSmall.name(), "KDN_ERR_BUFFER_TOO_SMALL");
    for code in -12..=-1 {
        let s = Status::from_code(code).unwrap();
        assert_eq!(s.code(), code);
        assert!(!matches!(s, Status::Unknown(_)), "{code}");
    }
    assert!(Error::new(Status::Busy, "x").is_retryable());
    assert!(Error::new(Status::Timeout, "x").is_retryable());
    assert!(Error::new(Status::Version, "x").is_caller_error());
    assert_eq!(Error::new(Status::Corrupt, "bad bytes").to_string(), "KDN_ERR_CORRUPT: bad bytes");
}

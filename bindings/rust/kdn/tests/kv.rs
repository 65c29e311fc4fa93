// SPDX-License-Identifier: Apache-2.0
//! Store, retrieve, lookup, async ops, knowledge items, statistics and tiers,
//! through every kind of KV view. KV with a unique value per element makes
//! each round trip byte-exact; `real_kv_*` uses the reference model's KV.

mod common;
use common::*;
use kdn::*;
use std::sync::Arc;
use std::time::Duration;

const NS: &str = "test";

#[test]
fn version_is_this_headers_or_newer() {
    assert!(version().starts_with("1."), "{}", version());
    assert!(version_number() >= HEADER_VERSION_NUMBER);
    assert_eq!(version_number() / 10000, HEADER_VERSION_NUMBER / 10000);
}

/// A latent (MLA) model: one vector per token and layer, `[layer][token][latent]`
/// in a canonical buffer; stored and retrieved bit for bit, apart from a K/V
/// model of the same bytes per token; an odd latent refused.
#[test]
fn latent_model_round_trip() {
    let (rt, _model) = setup();
    let latent = ModelSpec::latent(3, 8, 2, DType::F32, "rust-mla");
    assert_eq!(latent.cache_kind, CacheKind::Latent);
    let m = rt.model(&latent).unwrap();
    assert_eq!(m.kv_bytes_per_token(), 3 * 8 * 4);
    let same_bytes = rt.model(&ModelSpec::new(3, 1, 4, DType::F32, "rust-mla")).unwrap();
    let tokens = tokens(TOKENS);
    let data: Vec<f32> = (0..3 * TOKENS * 8).map(|i| i as f32 * 0.5).collect();
    let stored = m.store(NS, &tokens, &KvView::canonical(&data, DType::F32)).unwrap();
    assert_eq!(stored.tokens, TOKENS as u64);
    let mut out = vec![0f32; data.len()];
    let got = m.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!(got.tokens, TOKENS as u64);
    assert_eq!(as_bytes(&out), as_bytes(&data));
    assert_eq!(same_bytes.lookup(NS, &tokens).unwrap().cached_tokens, 0);
    let err = rt.model(&ModelSpec::latent(3, 7, 2, DType::F32, "x")).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
}

/// A sliding-window layer (since 1.12): loaded only where its last tokens
/// need it, the full layers whole; not the same model's identity without the
/// window; a bad state size refused.
#[test]
fn sliding_window_model() {
    let (rt, _model) = setup();
    let mut spec = ModelSpec::new(LAYERS as u32, HEADS as u32, DIM as u32, DType::F32, "rust-sliding");
    let plain = rt.model(&spec).unwrap();
    spec.layer_windows = vec![0; LAYERS];
    spec.layer_windows[0] = 8; // layer 0 attends to the last 8 tokens
    let m = rt.model(&spec).unwrap();
    let tokens = tokens(TOKENS);
    let kv: Vec<f32> = canonical(TOKENS).iter().map(|v| v + 1.0).collect();
    assert_eq!(m.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap().tokens, TOKENS as u64);
    assert_eq!(m.lookup(NS, &tokens).unwrap().cached_tokens, TOKENS as u64);
    assert_eq!(plain.lookup(NS, &tokens).unwrap().cached_tokens, 0);
    let mut out = vec![0f32; kv.len()];
    let got = m.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!(got.tokens, TOKENS as u64);
    // Canonical [layer][k|v][token][row]: layer 0 gets its window, the last
    // 8 tokens, only (nothing older is read or written).
    let window = TOKENS - 8;
    for l in 0..LAYERS {
        for kv_i in 0..2 {
            for t in 0..TOKENS {
                let at = ((l * 2 + kv_i) * TOKENS + t) * ROW;
                let want = if l == 0 && t < window { 0.0 } else { kv[at] };
                assert_eq!(out[at], want, "layer {l} kv {kv_i} token {t}");
            }
        }
    }
    spec.num_state_layers = 1;
    spec.state_bytes = 6;
    assert_eq!(rt.model(&spec).unwrap_err().status(), Status::InvalidArgument);
}

/// A model with two recurrent layers of 12 bytes of state each (since 1.12)
/// besides the test shape's attention layers.
fn recurrent_model(rt: &Runtime, fingerprint: &str) -> Model {
    let mut spec = spec(fingerprint);
    (spec.num_state_layers, spec.state_bytes) = (2, 12);
    rt.model(&spec).unwrap()
}

/// Recurrent layer `layer`'s state after `b` tokens, as this test's engine
/// has it: 12 bytes, distinct for every boundary and layer.
fn state_at(b: usize, layer: usize) -> [u8; 12] {
    std::array::from_fn(|i| (b * 3 + layer * 50 + i) as u8)
}

/// Element (l, k|v, t, h, d) of a canonical buffer of `n` tokens.
fn at(n: usize, l: usize, kv_i: usize, t: usize, h: usize, d: usize) -> usize {
    (((l * 2 + kv_i) * n + t) * HEADS + h) * DIM + d
}

/// Checks that `out`, a canonical buffer of `n` tokens that held `fill`,
/// has the test's KV for the first `prefix` tokens and `fill` after them.
fn assert_prefix_written(out: &[f32], n: usize, prefix: usize, fill: f32) {
    assert_eq!(out.len(), LAYERS * 2 * n * ROW);
    for l in 0..LAYERS {
        for kv_i in 0..2 {
            for t in 0..n {
                for h in 0..HEADS {
                    for d in 0..DIM {
                        let want = if t < prefix { value(l, kv_i, t, h, d) } else { fill };
                        let got = out[at(n, l, kv_i, t, h, d)];
                        assert_eq!(got.to_bits(), want.to_bits(), "layer {l} kv {kv_i} token {t} head {h} dim {d}");
                    }
                }
            }
        }
    }
}

/// Recurrent layers (since 1.12): the views carry their state. An engine
/// that stores at each chunk boundary of its prefill (16 and 32, each with
/// the state there) gets a hit at the last boundary within a request, its KV
/// and that boundary's state bit for bit; KV stored without its state is
/// no hit; a retrieve needs the state's memory; a state too short, a count
/// other than the model's, or a state for a model without recurrent layers
/// is refused by the binding before any C call.
#[test]
fn recurrent_state_travels_with_the_views() {
    let (rt, plain) = setup();
    let m = recurrent_model(&rt, "rust-recurrent");
    assert_eq!((m.num_state_layers(), m.state_bytes()), (2, 12));
    assert_eq!((plain.num_state_layers(), plain.state_bytes()), (0, 0));
    let tokens = tokens(TOKENS);
    for b in [16, 32] {
        let kv = canonical(b);
        let (s0, s1) = (state_at(b, 0), state_at(b, 1));
        let view = KvView::canonical(&kv, DType::F32).with_state(&[&s0[..], &s1[..]]);
        assert_eq!(m.store(NS, &tokens[..b], &view).unwrap().tokens, b as u64);
    }
    // A 40-token request sharing them: the last boundary with a snapshot, 32.
    assert_eq!(m.lookup(NS, &tokens[..40]).unwrap().cached_tokens, 32);
    assert_eq!(m.lookup(NS, &tokens).unwrap().cached_tokens, 32);
    assert_eq!(m.lookup(NS, &tokens[..31]).unwrap().cached_tokens, 16);
    assert_eq!(plain.lookup(NS, &tokens[..40]).unwrap().cached_tokens, 0); // another identity

    // The retrieve writes the KV of 32 tokens and the state at 32, nothing
    // past them; a state longer than state_bytes gets its first 12 bytes.
    let mut out = vec![-1f32; LAYERS * 2 * 40 * ROW];
    let (mut s0, mut s1) = ([0xEEu8; 12], [0xEEu8; 16]);
    let mut view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut s0[..], &mut s1[..]]);
    let got = m.retrieve(NS, &tokens[..40], &mut view).unwrap();
    assert_eq!((got.tokens, got.covered), (32, 32));
    assert_prefix_written(&out, 40, 32, -1.0);
    assert_eq!(s0, state_at(32, 0));
    assert_eq!(s1[..12], state_at(32, 1));
    assert_eq!(s1[12..], [0xEE; 4]);

    // 31 tokens: boundary 16 and its own state (in u32s: any element type).
    let mut out = vec![-1f32; LAYERS * 2 * 31 * ROW];
    let (mut s0, mut s1) = ([0u32; 3], [0u32; 3]);
    let mut view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut s0[..], &mut s1[..]]);
    assert_eq!(m.retrieve(NS, &tokens[..31], &mut view).unwrap().tokens, 16);
    assert_prefix_written(&out, 31, 16, -1.0);
    assert_eq!((as_bytes(&s0), as_bytes(&s1)), (&state_at(16, 0)[..], &state_at(16, 1)[..]));

    // KV stored without its state: stored, but no prefix counts.
    let kv = canonical(TOKENS);
    assert_eq!(m.store("nostate", &tokens, &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 0);
    assert_eq!(m.lookup("nostate", &tokens).unwrap().cached_tokens, 0);
    let mut out = vec![-1f32; kv.len()];
    let (mut s0, mut s1) = ([0xEEu8; 12], [0xEEu8; 12]);
    let mut view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut s0[..], &mut s1[..]]);
    assert_eq!(m.retrieve("nostate", &tokens, &mut view).unwrap().tokens, 0);
    assert_prefix_written(&out, TOKENS, 0, -1.0);
    assert_eq!((s0, s1), ([0xEE; 12], [0xEE; 12])); // a miss writes no state

    // A retrieve of a recurrent model without the state's memory: the library's InvalidArgument.
    let mut out = vec![-1f32; LAYERS * 2 * 40 * ROW];
    let err = m.retrieve(NS, &tokens[..40], &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("state"), "{}", err.message());
    assert!(out.iter().all(|&x| x == -1.0));

    // Refused by the binding, before C: a state shorter than state_bytes
    // (store and retrieve), another count, a model without recurrent layers.
    let kv48 = canonical(TOKENS);
    let (short, ok) = ([1u8; 11], state_at(48, 0));
    let view = KvView::canonical(&kv48, DType::F32).with_state(&[&ok[..], &short[..]]);
    let err = m.store("short", &tokens, &view).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(
        err.message().contains("recurrent state 1 is 11 bytes, shorter than the model's state_bytes (12)"),
        "{err}"
    );
    assert_eq!(m.lookup("short", &tokens[..16]).unwrap().cached_tokens, 0);
    let (mut s0, mut s1) = ([0u8; 12], [0u8; 4]);
    let mut view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut s0[..], &mut s1[..]]);
    let err = m.retrieve(NS, &tokens[..40], &mut view).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("recurrent state 1 is 4 bytes"), "{err}");
    assert!(out.iter().all(|&x| x == -1.0));
    let err = m.store("short", &tokens, &KvView::canonical(&kv48, DType::F32).with_state(&[&ok[..]])).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("carries 1 recurrent states; the model has 2 recurrent layers"), "{err}");
    let empty: &[&[u8]] = &[];
    let err = m.store("short", &tokens, &KvView::canonical(&kv48, DType::F32).with_state(empty)).unwrap_err();
    assert!(err.message().contains("carries 0 recurrent states"), "{err}");
    let err = plain.store(NS, &tokens, &KvView::canonical(&kv48, DType::F32).with_state(&[&ok[..]])).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("the model has 0 recurrent layers"), "{err}");
    assert_eq!(plain.lookup(NS, &tokens).unwrap().cached_tokens, 0);

    // Several views, each some layers: one carries the state (either one),
    // and a retrieve into several views gets it there.
    let kv = canonical(TOKENS);
    let (s0, s1) = (state_at(48, 0), state_at(48, 1));
    let split = 2 * 2 * TOKENS * ROW; // layers 0 and 1
    let layers = |l: Vec<u32>| ViewSpec::canonical(DType::F32).with_layers(l);
    let views = [
        KvView::new(&kv[..split], &layers(vec![0, 1])).unwrap(),
        KvView::new(&kv[split..], &layers(vec![2, 3, 4])).unwrap().with_state(&[&s0[..], &s1[..]]),
    ];
    assert_eq!(m.store_views("views", &tokens, &views).unwrap().tokens, 48);
    let mut out = vec![-1f32; kv.len()];
    let (mut g0, mut g1) = ([0u8; 12], [0u8; 12]);
    {
        let (a, b) = out.split_at_mut(split);
        let mut views = [
            KvViewMut::new(a, &layers(vec![0, 1])).unwrap().with_state(vec![&mut g0[..], &mut g1[..]]),
            KvViewMut::new(b, &layers(vec![2, 3, 4])).unwrap(),
        ];
        assert_eq!(m.retrieve_views("views", &tokens, &mut views).unwrap().tokens, 48);
    }
    assert_prefix_written(&out, TOKENS, TOKENS, -1.0);
    assert_eq!((g0, g1), (s0, s1));
}

/// The async ops carry the recurrent state too: a save owns it (stored
/// once every layer is ready), a load owns the memory it writes the
/// snapshot into, and both give it back; the state is kept bit for bit (a
/// NaN's payload, -0.0). A load without the state is refused by the
/// library, a short state by the binding. The unsafe variants take it in
/// their borrowed views.
#[test]
fn recurrent_state_in_async_ops() {
    let rt = runtime();
    let m = recurrent_model(&rt, "rust-recurrent-async");
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let spec = ViewSpec::canonical(DType::F32);
    let state: Vec<Vec<f32>> =
        vec![vec![f32::from_bits(0x7fc0_1234), -0.0, 1.5], vec![f32::MIN_POSITIVE, -3.25, f32::from_bits(1)]];
    let op = m.save_async_with_state(NS, &tokens, kv.clone(), &spec, state.clone()).unwrap();
    for layer in 0..LAYERS as u32 {
        op.layer_ready(layer).unwrap();
    }
    let (result, buffer, given) = op.finish_with_state().unwrap();
    assert_eq!(result.tokens, 48);
    assert_eq!(as_bytes(&buffer), as_bytes(&kv));
    assert_eq!(
        given.iter().map(|s| as_bytes(s).to_vec()).collect::<Vec<_>>(),
        state.iter().map(|s| as_bytes(s).to_vec()).collect::<Vec<_>>()
    );
    assert_eq!(m.lookup(NS, &tokens).unwrap().cached_tokens, 48);

    // Saved without the state: the KV is stored, but is no hit.
    let op = m.save_async("nostate", &tokens, kv.clone(), &spec).unwrap();
    for layer in 0..LAYERS as u32 {
        op.layer_ready(layer).unwrap();
    }
    op.finish().unwrap();
    assert_eq!(m.lookup("nostate", &tokens).unwrap().cached_tokens, 0);

    // The load writes the KV and the snapshot at 48 into the buffers it owns.
    let op = m.load_async_with_state(NS, &tokens, vec![-1f32; kv.len()], &spec, vec![vec![0f32; 3]; 2]).unwrap();
    let (result, loaded, got) = op.finish_with_state().unwrap();
    assert_eq!((result.tokens, result.covered), (48, 48));
    assert_eq!(as_bytes(&loaded), as_bytes(&kv));
    for (g, s) in got.iter().zip(&state) {
        assert_eq!(as_bytes(g), as_bytes(s));
    }
    // A 40-token request: the snapshot at 32 is missing (only 48 stored),
    // so nothing counts.
    let op = m
        .load_async_with_state(NS, &tokens[..40], vec![-1f32; LAYERS * 2 * 40 * ROW], &spec, vec![vec![7u8; 12]; 2])
        .unwrap();
    assert_eq!(op.wait(None).unwrap().tokens, 0);
    let (buffer, got) = op.into_buffers();
    assert!(buffer.iter().all(|&x| x == -1.0));
    assert_eq!(got, vec![vec![7u8; 12]; 2]);

    // A load without the state's memory: the library's InvalidArgument.
    let err = m.load_async(NS, &tokens, vec![0f32; kv.len()], &spec).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("state"), "{}", err.message());
    // A short state or another count: the binding's, before the op starts.
    let err = m
        .load_async_with_state(NS, &tokens, vec![0f32; kv.len()], &spec, vec![vec![0u8; 12], vec![0u8; 8]])
        .unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("recurrent state 1 is 8 bytes"), "{err}");
    let err = m.save_async_with_state("one", &tokens, kv.clone(), &spec, vec![vec![0u8; 12]]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("carries 1 recurrent states"), "{err}");
    // An op without a state gives none back.
    let op = m.save_async("plain-op", &tokens, kv.clone(), &spec).unwrap();
    assert_eq!(op.into_buffers().1, Vec::<Vec<u8>>::new());

    // The unsafe variants over borrowed memory, the state in the view.
    let (s0, s1) = (state_at(48, 0), state_at(48, 1));
    {
        let view = KvView::canonical(&kv, DType::F32).with_state(&[&s0[..], &s1[..]]);
        // SAFETY: kv, s0 and s1 outlive the op, consumed in this block.
        let op = unsafe { m.save_async_unchecked("borrowed", &tokens, std::slice::from_ref(&view)) }.unwrap();
        for layer in 0..LAYERS as u32 {
            op.layer_ready(layer).unwrap();
        }
        assert_eq!(op.finish().unwrap().0.tokens, 48);
    }
    let mut out = vec![-1f32; kv.len()];
    let (mut g0, mut g1) = ([0u8; 12], [0u8; 12]);
    {
        let view = KvViewMut::canonical(&mut out, DType::F32).with_state(vec![&mut g0[..], &mut g1[..]]);
        // SAFETY: out, g0 and g1 are borrowed by `view` and outlive the op, dropped in this block.
        let op = unsafe { m.load_async_unchecked("borrowed", &tokens, std::slice::from_ref(&view)) }.unwrap();
        assert_eq!(op.wait(None).unwrap().tokens, 48);
    }
    assert_eq!(as_bytes(&out), as_bytes(&kv));
    assert_eq!((g0, g1), (s0, s1));
}

#[test]
fn canonical_round_trip_and_prefixes() {
    let (_rt, model) = setup();
    assert_eq!(model.kv_bytes_per_token(), (LAYERS * 2 * ROW * 4) as u64);
    assert_ne!(model.fingerprint().unwrap(), [0u8; 32]);
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let stored = model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    assert_eq!((stored.tokens, stored.state, stored.status), (48, OpState::Done, None));

    let mut out = vec![0f32; kv.len()];
    let got = model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!((got.tokens, got.covered, got.lossy()), (48, 48, false));
    assert_eq!(as_bytes(&out), as_bytes(&kv));

    // 40 tokens: two whole chunks are found, written into a 40-token canonical buffer.
    let mut out40 = vec![0f32; LAYERS * 2 * 40 * ROW];
    let got = model.retrieve(NS, &tokens[..40], &mut KvViewMut::canonical(&mut out40, DType::F32)).unwrap();
    assert_eq!(got.tokens, 32);
    for l in 0..LAYERS {
        for kv_i in 0..2 {
            for t in 0..40 {
                let at = ((l * 2 + kv_i) * 40 + t) * ROW;
                let want = if t < 32 { value(l, kv_i, t, 0, 0) } else { 0.0 };
                assert_eq!(out40[at], want, "layer {l} kv {kv_i} token {t}");
            }
        }
    }

    // A miss is Ok with 0 tokens: another namespace, or other tokens.
    assert_eq!(
        model.retrieve("elsewhere", &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens,
        0
    );
    let other: Vec<i32> = tokens.iter().map(|t| t + 1).collect();
    assert_eq!(model.retrieve(NS, &other, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 0);
    assert_eq!(model.lookup(NS, &other).unwrap().cached_tokens, 0);
}

#[test]
fn lookups_single_and_batched() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&canonical(TOKENS), DType::F32)).unwrap();
    let one = model.lookup(NS, &tokens).unwrap();
    assert_eq!(one.cached_tokens, 48);
    assert_eq!(one.tier_tokens(), &[48]);
    let found = model
        .lookup_batch(NS, &[Request::from(&tokens), Request::from(&tokens[..40]), Request::from(&tokens[..15])])
        .unwrap();
    let cached: Vec<u64> = found.iter().map(|r| r.as_ref().unwrap().cached_tokens).collect();
    assert_eq!(cached, [48, 32, 0]);
    assert_eq!(model.lookup_batch(NS, &[]).unwrap().len(), 0);
}

#[test]
fn u32_token_ids_as_tokenizers_give_them() {
    // The same ids as u32 (what tokenizers give) name the same tokens as i32.
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    let kv = canonical(TOKENS);
    assert_eq!(model.store(NS, &ids[..32], &KvView::canonical(&canonical(32), DType::F32)).unwrap().tokens, 32);
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, 32);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    assert_eq!(model.lookup(NS, &ids).unwrap().cached_tokens, 48);
    assert_eq!(model.lookup(NS, Request::TokensU32(&ids[..40])).unwrap().cached_tokens, 32);
    let found = model.lookup_batch(NS, &[Request::from(&ids), Request::from(&tokens[..16])]).unwrap();
    assert_eq!(found.iter().map(|r| r.as_ref().unwrap().cached_tokens).collect::<Vec<_>>(), [48, 16]);
    let mut out = vec![0f32; kv.len()];
    assert_eq!(model.retrieve(NS, &ids, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 48);
    assert_eq!(out, kv);
    let op = model.load_async(NS, &ids, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).unwrap();
    let (result, loaded) = op.finish().unwrap();
    assert_eq!((result.tokens, &loaded), (48, &kv));
    // The largest id kdn takes, i32::MAX, passes as u32 too.
    let top = [u32::MAX >> 1; 16];
    assert_eq!(model.store(NS, &top, &KvView::canonical(&canonical(16), DType::F32)).unwrap().tokens, 16);
    assert_eq!(model.lookup(NS, &[i32::MAX; 16]).unwrap().cached_tokens, 16);
    // Knowledge items take u32 ids; they come back as the same i32s.
    let docs = model.knowledge(NS);
    docs.put("doc", 1, b"", &ids, &KvView::canonical(&kv, DType::F32)).unwrap();
    assert_eq!(docs.fetch_to_vec("doc").unwrap(), (tokens, kdn::as_bytes(&kv).to_vec()));
}

#[test]
fn block_hash_requests() {
    let (_rt, model) = setup();
    let hashes: Vec<u8> = (0..3u64).flat_map(|b| (0xfeed_0000 + b * 7919).to_le_bytes()).collect();
    let request = Request::BlockHashes { hashes: &hashes, hash_bytes: 8, block_tokens: 16 };
    let kv = canonical(TOKENS);
    assert_eq!(model.store(NS, request, &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 48);
    assert_eq!(model.lookup(NS, request).unwrap().cached_tokens, 48);
    let first_two = Request::BlockHashes { hashes: &hashes[..16], hash_bytes: 8, block_tokens: 16 };
    assert_eq!(model.lookup(NS, first_two).unwrap().cached_tokens, 32);
    let mut out = vec![0f32; kv.len()];
    assert_eq!(model.retrieve(NS, request, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 48);
    assert_eq!(out, kv);
}

/// A salt (since 1.13) enters every chunk key: KV stored with one is found
/// with the same salt only (never unsalted, never with another salt) and
/// comes back bit for bit; unsalted KV does not answer a salted request.
#[test]
fn salted_requests_hit_only_their_salt() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let salt = b"tenant-a/user-1".to_vec();
    let salted = Request::from(&tokens).with_salt(&salt);
    assert_eq!((salted.salt(), Request::from(&tokens).salt()), (Some(&salt[..]), None));
    assert_eq!(model.store(NS, salted, &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 48);

    let other = Request::from(&tokens).with_salt(b"tenant-a/user-2");
    let shorter = Request::from(&tokens).with_salt(&salt[..salt.len() - 1]);
    assert_eq!(model.lookup(NS, salted).unwrap().cached_tokens, 48);
    assert_eq!(model.lookup(NS, Request::from(&tokens[..40]).with_salt(&salt)).unwrap().cached_tokens, 32);
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, 0);
    assert_eq!(model.lookup(NS, other).unwrap().cached_tokens, 0);
    assert_eq!(model.lookup(NS, shorter).unwrap().cached_tokens, 0);
    let found = model.lookup_batch(NS, &[other, salted, Request::from(&tokens), salted.with_salt(b"")]).unwrap();
    assert_eq!(found.iter().map(|r| r.as_ref().unwrap().cached_tokens).collect::<Vec<_>>(), [0, 48, 0, 0]);

    // The same salt gets the KV back bit for bit; another salt, or none, 0 tokens and nothing written.
    let mut out = vec![0f32; kv.len()];
    let got = model.retrieve(NS, salted, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!((got.tokens, got.covered, got.lossy()), (48, 48, false));
    assert_eq!(as_bytes(&out), as_bytes(&kv));
    for miss in [other, shorter, Request::from(&tokens)] {
        let mut out = vec![0f32; kv.len()];
        let got = model.retrieve(NS, miss, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
        assert_eq!((got.tokens, got.covered), (0, 0), "{miss:?}");
        assert!(out.iter().all(|&x| x == 0.0), "nothing written for {miss:?}");
    }
    // With a TTFT target, salted first or last: the same load request.
    let target = Duration::from_secs(1);
    let load = Request::from(&tokens).with_ttft_target(target).with_salt(&salt);
    assert_eq!(load, salted.with_ttft_target(target));
    let mut out = vec![0f32; kv.len()];
    assert_eq!(model.retrieve(NS, load, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 48);
    assert_eq!(as_bytes(&out), as_bytes(&kv));

    // Unsalted KV does not answer a salted request; the same ids as u32 and
    // block hashes take a salt too.
    let plain: Vec<i32> = tokens.iter().map(|t| t + 1).collect();
    assert_eq!(model.store(NS, &plain, &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 48);
    assert_eq!(model.lookup(NS, &plain).unwrap().cached_tokens, 48);
    assert_eq!(model.lookup(NS, Request::from(&plain).with_salt(&salt)).unwrap().cached_tokens, 0);
    let ids: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    assert_eq!(model.lookup(NS, Request::from(&ids).with_salt(&salt)).unwrap().cached_tokens, 48);
    assert_eq!(model.lookup(NS, &ids).unwrap().cached_tokens, 0);
    let hashes: Vec<u8> = (0..3u64).flat_map(|b| (0x5a17_0000 + b * 7919).to_le_bytes()).collect();
    let by_hash = Request::BlockHashes { hashes: &hashes, hash_bytes: 8, block_tokens: 16 };
    assert_eq!(model.store(NS, by_hash.with_salt(&salt), &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 48);
    assert_eq!(model.lookup(NS, by_hash.with_salt(&salt)).unwrap().cached_tokens, 48);
    assert_eq!(model.lookup(NS, by_hash).unwrap().cached_tokens, 0);

    // A salt replaces the salt; an empty one is none. Debug shows its length only.
    assert_eq!(salted.with_salt(b"x").salt(), Some(&b"x"[..]));
    assert_eq!(salted.with_salt(&[]), Request::from(&tokens));
    let Request::Salted(s) = salted else { panic!("{salted:?} is salted") };
    assert_eq!((s.request(), s.salt()), (Request::from(&tokens), &salt[..]));
    let shown = format!("{salted:?}");
    assert!(shown.contains("salt_len: 15") && !shown.contains(&format!("{:?}", &salt[..])), "{shown}");
}

/// Async loads and saves take the salt (since 1.13); the op does not keep
/// it (kdn copies the request), so its memory may go while the op runs.
#[test]
fn salted_async_load_and_save() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let salt: Vec<u8> = (0..=255u8).collect(); // any bytes
    let op = model
        .save_async(NS, Request::from(&tokens).with_salt(&salt), kv.clone(), &ViewSpec::canonical(DType::F32))
        .unwrap();
    for layer in 0..LAYERS as u32 {
        op.layer_ready(layer).unwrap();
    }
    assert_eq!(op.finish().unwrap().0.tokens, 48);
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, 0);
    assert_eq!(model.lookup(NS, Request::from(&tokens).with_salt(&salt)).unwrap().cached_tokens, 48);

    let mut op_salt = salt.clone();
    let op = model
        .load_async(
            NS,
            Request::from(&tokens).with_salt(&op_salt),
            vec![0f32; kv.len()],
            &ViewSpec::canonical(DType::F32),
        )
        .unwrap();
    op_salt.fill(0);
    drop(op_salt);
    for layer in 0..LAYERS as u32 {
        op.wait_layer(layer, Some(Duration::from_secs(10))).unwrap();
    }
    let (result, loaded) = op.finish().unwrap();
    assert_eq!((result.tokens, result.covered, result.num_failed), (48, 48, 0));
    assert_eq!(as_bytes(&loaded), as_bytes(&kv));

    // Another salt, or none: a load of 0 tokens.
    for request in [Request::from(&tokens).with_salt(&salt[1..]), Request::from(&tokens)] {
        let op = model.load_async(NS, request, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).unwrap();
        let (result, loaded) = op.finish().unwrap();
        assert_eq!((result.tokens, loaded.iter().all(|&x| x == 0.0)), (0, true), "{request:?}");
    }

    // The unsafe op over borrowed memory, with a TTFT target as well.
    let mut out = vec![0f32; kv.len()];
    {
        let view = KvViewMut::canonical(&mut out, DType::F32);
        let request = Request::from(&tokens).with_salt(&salt).with_ttft_target(Duration::from_secs(1));
        // SAFETY: `out` is borrowed by `view` and outlives the op, consumed in this block.
        let op = unsafe { model.load_async_unchecked(NS, request, std::slice::from_ref(&view)) }.unwrap();
        assert_eq!(op.wait(None).unwrap().tokens, 48);
    }
    assert_eq!(as_bytes(&out), as_bytes(&kv));
}

/// The engine layout of examples/c: all K ([layer][token][head][dim]), then all V.
fn engine_layout(n: usize) -> (Vec<f32>, ViewSpec) {
    let mut buf = Vec::with_capacity(2 * LAYERS * n * ROW);
    for kv_i in 0..2 {
        for l in 0..LAYERS {
            for t in 0..n {
                for h in 0..HEADS {
                    for d in 0..DIM {
                        buf.push(value(l, kv_i, t, h, d));
                    }
                }
            }
        }
    }
    let spec = ViewSpec::canonical(DType::F32).with_strides(
        (n * ROW) as i64,
        (LAYERS * n * ROW) as i64,
        ROW as i64,
        DIM as i64,
        1,
    );
    (buf, spec)
}

#[test]
fn strided_store_and_retrieve() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let (engine, spec) = engine_layout(TOKENS);
    model.store(NS, &tokens, &KvView::new(&engine, &spec).unwrap()).unwrap();
    let mut out = vec![0f32; engine.len()];
    assert_eq!(model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 48);
    assert_eq!(out, canonical(TOKENS));
    let mut back = vec![0f32; engine.len()];
    assert_eq!(model.retrieve(NS, &tokens, &mut KvViewMut::new(&mut back, &spec).unwrap()).unwrap().tokens, 48);
    assert_eq!(back, engine);
}

#[test]
fn per_layer_allocations_with_transposed_v() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let t = TOKENS;
    // K per layer [token][head][dim]; V per layer [head][dim][token] (llama.cpp's transposed V).
    let k: Vec<Vec<f32>> =
        (0..LAYERS).map(|l| (0..t * ROW).map(|i| value(l, 0, i / ROW, i % ROW / DIM, i % DIM)).collect()).collect();
    let v: Vec<Vec<f32>> =
        (0..LAYERS).map(|l| (0..t * ROW).map(|i| value(l, 1, i % t, i / (DIM * t), i / t % DIM)).collect()).collect();
    let spec = ViewSpec::canonical(DType::F32).with_token_strides(ROW as i64, DIM as i64, 1).with_v_strides(
        1,
        (DIM * t) as i64,
        t as i64,
    );
    let kr: Vec<&[f32]> = k.iter().map(Vec::as_slice).collect();
    let vr: Vec<&[f32]> = v.iter().map(Vec::as_slice).collect();
    model.store(NS, &tokens, &KvView::per_layer(&kr, &vr, &spec).unwrap()).unwrap();

    let mut out = vec![0f32; LAYERS * 2 * t * ROW];
    model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!(out, canonical(t));

    let mut k2 = vec![vec![0f32; t * ROW]; LAYERS];
    let mut v2 = vec![vec![0f32; t * ROW]; LAYERS];
    {
        let mut view = KvViewMut::per_layer(
            k2.iter_mut().map(Vec::as_mut_slice).collect(),
            v2.iter_mut().map(Vec::as_mut_slice).collect(),
            &spec,
        )
        .unwrap();
        assert_eq!(model.retrieve(NS, &tokens, &mut view).unwrap().tokens, 48);
    }
    assert_eq!((k2, v2), (k, v));
}

/// Paged per-layer KV: `blocks` blocks of 16 tokens; token t in block table[t / 16].
fn paged(layout: Layout, table: &[i32], blocks: usize, kv_i: usize, l: usize, n: usize) -> Vec<f32> {
    let mut layer = vec![0f32; blocks * 16 * ROW];
    for t in 0..n {
        for h in 0..HEADS {
            for d in 0..DIM {
                let b = table[t / 16] as usize * 16 * ROW;
                let at = match layout {
                    Layout::PagedNhd => b + (t % 16) * ROW + h * DIM + d,
                    _ => b + h * 16 * DIM + (t % 16) * DIM + d,
                };
                layer[at] = value(l, kv_i, t, h, d);
            }
        }
    }
    layer
}

#[test]
fn paged_nhd_and_hnd_with_block_tables() {
    for layout in [Layout::PagedNhd, Layout::PagedHnd] {
        let (_rt, model) = setup();
        let tokens = tokens(TOKENS);
        let table = vec![4, 0, 2];
        let spec = ViewSpec::paged(DType::F32, layout, 16, table.clone());
        let k: Vec<Vec<f32>> = (0..LAYERS).map(|l| paged(layout, &table, 5, 0, l, TOKENS)).collect();
        let v: Vec<Vec<f32>> = (0..LAYERS).map(|l| paged(layout, &table, 5, 1, l, TOKENS)).collect();
        let kr: Vec<&[f32]> = k.iter().map(Vec::as_slice).collect();
        let vr: Vec<&[f32]> = v.iter().map(Vec::as_slice).collect();
        assert_eq!(model.store(NS, &tokens, &KvView::per_layer(&kr, &vr, &spec).unwrap()).unwrap().tokens, 48);

        let mut out = vec![0f32; LAYERS * 2 * TOKENS * ROW];
        model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
        assert_eq!(out, canonical(TOKENS), "{layout:?}");

        let mut k2 = vec![vec![0f32; 5 * 16 * ROW]; LAYERS];
        let mut v2 = vec![vec![0f32; 5 * 16 * ROW]; LAYERS];
        {
            let ks = k2.iter_mut().map(Vec::as_mut_slice).collect();
            let vs = v2.iter_mut().map(Vec::as_mut_slice).collect();
            let mut view = KvViewMut::per_layer(ks, vs, &spec).unwrap();
            assert_eq!(model.retrieve(NS, &tokens, &mut view).unwrap().tokens, 48);
        }
        assert_eq!((k2, v2), (k, v), "{layout:?}: blocks 1 and 3 stay zero, the others hold the KV");
    }
}

#[test]
fn several_views_each_holding_some_layers() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let split = 2 * 2 * TOKENS * ROW; // layers 0 and 1
    let views = [
        KvView::new(&kv[..split], &ViewSpec::canonical(DType::F32).with_layers(vec![0, 1])).unwrap(),
        KvView::new(&kv[split..], &ViewSpec::canonical(DType::F32).with_layers(vec![2, 3, 4])).unwrap(),
    ];
    assert_eq!(model.store_views(NS, &tokens, &views).unwrap().tokens, 48);
    let mut out = vec![0f32; kv.len()];
    {
        let (a, b) = out.split_at_mut(split);
        let mut views = [
            KvViewMut::new(a, &ViewSpec::canonical(DType::F32).with_layers(vec![0, 1])).unwrap(),
            KvViewMut::new(b, &ViewSpec::canonical(DType::F32).with_layers(vec![2, 3, 4])).unwrap(),
        ];
        assert_eq!(model.retrieve_views(NS, &tokens, &mut views).unwrap().tokens, 48);
    }
    assert_eq!(out, kv);
}

#[test]
fn async_load_layer_by_layer() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let op = model.load_async(NS, &tokens, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).unwrap();
    for layer in 0..LAYERS as u32 {
        op.wait_layer(layer, Some(Duration::from_secs(10))).unwrap();
    }
    let result = op.wait(Some(Duration::from_secs(10))).unwrap();
    assert_eq!((result.state, result.tokens, result.covered, result.num_failed), (OpState::Done, 48, 48, 0));
    assert_eq!(op.poll().unwrap(), OpState::Done);
    assert_eq!(op.failed_ranges().unwrap(), vec![]);
    assert_eq!(op.into_buffer(), kv);

    // A miss is a load of 0 tokens; the op is Send and can be waited on elsewhere.
    let op = model.load_async("elsewhere", &tokens, vec![0u8; kv.len() * 4], &ViewSpec::canonical(DType::F32)).unwrap();
    let (result, buffer) = std::thread::spawn(move || op.finish()).join().unwrap().unwrap();
    assert_eq!((result.tokens, buffer.iter().all(|&b| b == 0)), (0, true));
}

#[test]
fn async_load_into_per_layer_offsets_of_one_buffer() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    // Each layer's K and V at their canonical places, given as per-layer allocations.
    let layer_bytes = TOKENS * ROW * 4;
    let spec = ViewSpec::canonical(DType::F32).with_token_strides(ROW as i64, DIM as i64, 1).with_layer_offsets(
        (0..LAYERS).map(|l| 2 * l * layer_bytes).collect(),
        (0..LAYERS).map(|l| (2 * l + 1) * layer_bytes).collect(),
        layer_bytes,
    );
    let op = model.load_async(NS, &tokens, vec![0f32; kv.len()], &spec).unwrap();
    let (result, loaded) = op.finish().unwrap();
    assert_eq!((result.tokens, loaded), (48, kv));
}

#[test]
fn async_save_as_layers_become_ready() {
    let (rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    let op = model.save_async(NS, &tokens, kv.clone(), &ViewSpec::canonical(DType::F32)).unwrap();
    assert_eq!(op.poll().unwrap(), OpState::Pending);
    for layer in 0..LAYERS as u32 {
        op.layer_ready(layer).unwrap();
    }
    let (result, _buffer) = op.finish().unwrap();
    assert_eq!(result.tokens, 48);
    let mut out = vec![0f32; kv.len()];
    assert_eq!(model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 48);
    assert_eq!(out, kv);
    assert!(rt.stats().unwrap().stores >= 1);
}

#[test]
fn async_cancel_and_drop() {
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    // A save cancelled before its last layer ends cancelled (at that layer), storing nothing.
    let op = model.save_async(NS, &tokens, canonical(TOKENS), &ViewSpec::canonical(DType::F32)).unwrap();
    for layer in 0..LAYERS as u32 - 1 {
        op.layer_ready(layer).unwrap();
    }
    op.cancel().unwrap();
    op.cancel().unwrap(); // twice is fine
    op.layer_ready(LAYERS as u32 - 1).unwrap();
    assert_eq!(op.wait(Some(Duration::from_secs(10))).unwrap_err().status(), Status::Cancelled);
    assert_eq!(op.poll().unwrap(), OpState::Cancelled);
    assert_eq!(op.result().unwrap().status, Some(Status::Cancelled));
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, 0);
    // A load cancelled at once ends cancelled, or done when it finished first.
    model.store(NS, &tokens, &KvView::canonical(&canonical(TOKENS), DType::F32)).unwrap();
    let op =
        model.load_async(NS, &tokens, vec![0f32; LAYERS * 2 * TOKENS * ROW], &ViewSpec::canonical(DType::F32)).unwrap();
    op.cancel().unwrap();
    match op.wait(None) {
        Err(e) => assert_eq!((e.status(), op.poll().unwrap()), (Status::Cancelled, OpState::Cancelled)),
        Ok(r) => assert_eq!((r.tokens, op.into_buffer()), (48, canonical(TOKENS))),
    }
    // Dropping a pending op cancels it and waits for it, then frees the buffer.
    let op = model.save_async(NS, &tokens, canonical(TOKENS), &ViewSpec::canonical(DType::F32)).unwrap();
    op.layer_ready(0).unwrap();
    drop(op);
    // Timeout: the op goes on.
    let op = model.save_async(NS, &tokens, canonical(TOKENS), &ViewSpec::canonical(DType::F32)).unwrap();
    assert_eq!(op.wait(Some(Duration::from_millis(1))).unwrap_err().status(), Status::Timeout);
    let buffer = op.into_buffer();
    assert_eq!(buffer, canonical(TOKENS));
}

#[test]
fn knowledge_items() {
    let (_rt, model) = setup();
    let docs = model.knowledge(NS);
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    docs.put("story", 3, b"{\"title\": \"a story\"}", &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    docs.put("other", 1, b"", &tokens[..20], &KvView::canonical(&kv[..LAYERS * 2 * 20 * ROW], DType::F32)).unwrap();

    let info = docs.info("story").unwrap();
    assert_eq!(
        (info.doc_id.as_str(), info.version, info.num_tokens, info.pinned, info.expires_in),
        ("story", 3, 48, false, None)
    );
    assert_eq!((info.chunks, info.hits), (info.chunks_present, 0));
    let list = docs.list().unwrap();
    assert_eq!(list.iter().map(|d| d.doc_id.as_str()).collect::<Vec<_>>(), ["other", "story"]);
    assert!(model.knowledge("empty").list().unwrap().is_empty());

    docs.pin("story", None).unwrap();
    let pinned = docs.info("story").unwrap();
    assert_eq!((pinned.pinned, pinned.pin_expires_in), (true, None));
    docs.unpin("story").unwrap();
    assert!(!docs.info("story").unwrap().pinned);
    docs.pin("story", Some(Duration::from_secs(60))).unwrap();
    let left = docs.info("story").unwrap().pin_expires_in.expect("a pin with a TTL ends");
    assert!(left > Duration::from_secs(50) && left <= Duration::from_secs(60), "{left:?}");

    let (got_tokens, got_kv) = docs.fetch_to_vec("story").unwrap();
    assert_eq!(got_tokens, tokens);
    assert_eq!(got_kv, as_bytes(&kv));
    // Into the caller's buffers, with room to spare for the tokens.
    let mut buf = vec![0f32; kv.len()];
    let mut ids = vec![0i32; 64];
    let hits = docs.info("story").unwrap().hits;
    let r = docs.fetch("story", Some(&mut KvViewMut::canonical(&mut buf, DType::F32)), Some(&mut ids)).unwrap();
    assert_eq!((r.tokens, &ids[..48], &buf), (48, &tokens[..], &kv));
    // Each chunk fetched counts on the document (since 1.4).
    assert_eq!(docs.info("story").unwrap().hits, hits + u64::from(info.chunks));

    docs.expire("other", Duration::from_secs(3600)).unwrap();
    assert!(docs.info("other").unwrap().expires_in.unwrap() > Duration::from_secs(3500));
    docs.delete("other").unwrap();
    assert_eq!(docs.info("other").unwrap_err().status(), Status::NotFound);
    docs.expire("story", Duration::ZERO).unwrap();
    assert!(eventually(|| docs.info("story").is_err()));
}

#[test]
fn statistics_latency_and_tiers() {
    let (rt, model) = setup();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let mut out = vec![0f32; kv.len()];
    model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    model.lookup(NS, &tokens).unwrap();
    let s = rt.stats().unwrap();
    assert_eq!((s.stores, s.retrieves, s.lookups, s.hits), (1, 1, 1, 3));
    assert_eq!((s.tokens_stored, s.tokens_served, s.chunks), (48, 48, 3));
    assert_eq!((s.bytes_stored, s.bytes_served), (48 * model.kv_bytes_per_token(), 48 * model.kv_bytes_per_token()));
    assert_eq!(s.capacity_bytes, 16 << 20);
    assert!(s.used_bytes >= s.bytes_stored);
    for kind in [LatencyKind::Lookup, LatencyKind::Load, LatencyKind::Store] {
        let l = rt.latency(kind).unwrap();
        assert_eq!(l.count, 1, "{kind:?}");
        assert!(l.max_us >= l.p50_us && l.p50_us > 0.0, "{kind:?}: {l:?}");
    }
    assert_eq!(rt.tier_count().unwrap(), 1);
    let tiers = rt.all_tier_stats().unwrap();
    assert_eq!(tiers.len(), 1);
    let t = &tiers[0];
    assert_eq!((t.kind, t.objects, t.hits, t.capacity_bytes), (TierKind::Host, 3, 3, 16 << 20));
    assert!(!t.name.is_empty() && !t.codec.is_empty(), "{t:?}");
    assert_eq!(rt.tier_stats(1).unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn reported_prefills_price_the_loads() {
    let (rt, model) = setup();
    let tokens = tokens(TOKENS + 16);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens[..TOKENS], &KvView::canonical(&kv, DType::F32)).unwrap();
    // N tokens in T ns; T/N is not whole, so each load's price is rounded.
    const N: u64 = 24;
    const T: u64 = 1_000_003;
    model.report_prefill(N, Duration::from_nanos(T)).unwrap();
    let mut out = vec![0f32; LAYERS * 2 * (TOKENS + 16) * ROW];
    // A whole hit, then a request 16 tokens longer than what is cached.
    let full = model.retrieve(NS, &tokens[..TOKENS], &mut KvViewMut::canonical(&mut out[..kv.len()], DType::F32));
    assert_eq!(full.unwrap().tokens, TOKENS as u64);
    let part = model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!(part.tokens, TOKENS as u64);
    // A lookup is no load: counted apart.
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, TOKENS as u64);
    let s = rt.stats().unwrap();
    assert_eq!((s.lookup_tokens, s.lookup_hit_tokens), (TOKENS as u64 + 16, TOKENS as u64));
    assert_eq!((s.prefill_tokens, s.prefill_ns), (N, T));
    assert_eq!(s.tokens_served, 2 * TOKENS as u64);
    assert_eq!(s.tokens_requested, 2 * TOKENS as u64 + 16);
    assert!(s.tokens_requested >= s.tokens_served);
    let exact = u128::from(s.tokens_served) * u128::from(T) / u128::from(N);
    assert!(u128::from(s.ttft_saved_ns).abs_diff(exact) <= 2, "{} vs {exact} (two loads)", s.ttft_saved_ns);
    assert_eq!(s.tokens_served_unpriced, 0);
    assert!(s.delivery_ns > 0);
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn device_host_and_disk_tiers_with_codecs() {
    let dir = scratch_dir("disk-tier");
    let options = RuntimeOptions::default()
        .with_chunk_tokens(CHUNK)
        .with_worker_threads(2)
        .with_tier(TierConfig::device(8 << 20).with_write_through(true))
        .with_tier(
            TierConfig::host(8 << 20)
                .with_policy(EvictionPolicy::S3Fifo)
                .with_watermarks(0.9, 0.7)
                .with_write_through(true),
        )
        .with_tier(TierConfig::disk(&dir, 64 << 20).with_codec("zstd"));
    let rt = Runtime::new(&options).unwrap();
    let model = rt.model(&spec("tiers")).unwrap();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let tiers = rt.all_tier_stats().unwrap();
    assert_eq!(tiers.iter().map(|t| t.kind).collect::<Vec<_>>(), [TierKind::Device, TierKind::Host, TierKind::Disk]);
    assert!(tiers[2].codec.starts_with("zstd"), "{}", tiers[2].codec);
    // The watermarks (since 1.4): as set (f32), or kdn's defaults 0.95 / 0.85.
    let marks = tiers.iter().map(|t| (t.high_watermark, t.low_watermark)).collect::<Vec<_>>();
    assert_eq!(marks, [(0.95, 0.85), (f64::from(0.9f32), f64::from(0.7f32)), (0.95, 0.85)]);
    let held = || rt.all_tier_stats().unwrap().iter().map(|t| t.objects).collect::<Vec<_>>();
    assert!(eventually(|| held() == [3, 3, 3]), "every tier gets the chunks (write-through): {:?}", held());
    assert!(rt.tier_stats(2).unwrap().bytes_before_encoding > 0);
    assert_eq!(model.lookup(NS, &tokens).unwrap().tier_tokens(), &[48, 48, 48]);
    let mut out = vec![0f32; kv.len()];
    let r = model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!((r.tokens, r.lossy()), (48, false));
    assert_eq!(out, kv);
    drop(model);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lossy_codec_says_so() {
    let rt = Runtime::new(
        &RuntimeOptions::default().with_chunk_tokens(CHUNK).with_tier(TierConfig::host(16 << 20).with_codec("int8")),
    )
    .unwrap();
    let model = rt.model(&spec("lossy")).unwrap();
    let tokens = tokens(TOKENS);
    let kv: Vec<f32> = (0..LAYERS * 2 * TOKENS * ROW).map(|i| ((i % 97) as f32 - 48.0) / 16.0).collect();
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let mut out = vec![0f32; kv.len()];
    let r = model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!(r.tokens, 48);
    assert!(r.lossy());
    let worst = kv.iter().zip(&out).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 0.1, "int8 error {worst}");
    assert_eq!(rt.tier_stats(0).unwrap().codec, "int8");
}

#[test]
fn remote_tier_that_is_not_there_is_a_miss() {
    let options = RuntimeOptions::default()
        .with_chunk_tokens(CHUNK)
        .with_tier(TierConfig::host(1 << 20))
        .with_tier(TierConfig::remote("127.0.0.1:9", "no-token").with_timeout(Duration::from_millis(200)));
    let rt = Runtime::new(&options).unwrap();
    let model = rt.model(&spec("remote")).unwrap();
    let tokens = tokens(TOKENS);
    assert_eq!(model.lookup(NS, &tokens).unwrap().cached_tokens, 0);
    let mut out = vec![0f32; LAYERS * 2 * TOKENS * ROW];
    assert_eq!(model.retrieve(NS, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens, 0);
    let remote = rt.tier_stats(1).unwrap();
    assert_eq!((remote.kind, remote.high_watermark, remote.low_watermark), (TierKind::Remote, 0.0, 0.0));
}

#[test]
fn handles_are_shared_across_threads_and_outlive_the_runtime() {
    let (rt, model) = setup();
    drop(rt); // the model keeps the runtime alive
    let model = Arc::new(model);
    let kv = Arc::new(canonical(TOKENS));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (model, kv) = (Arc::clone(&model), Arc::clone(&kv));
            std::thread::spawn(move || {
                let ns = format!("thread-{i}");
                let tokens = tokens(TOKENS);
                model.store(&ns, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
                let mut out = vec![0f32; kv.len()];
                let r = model.retrieve(&ns, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
                assert_eq!((r.tokens, &out), (48, &*kv));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Stores a prompt's real KV through the engine layout of examples/c (K file
/// then V file), retrieves it canonically and compares every byte.
fn real_kv_round_trip(tokens: &[i32], k: &[f32], v: &[f32]) {
    let n = tokens.len();
    assert_eq!((k.len(), v.len()), (LAYERS * n * ROW, LAYERS * n * ROW));
    let (rt, model) = setup();
    let engine: Vec<f32> = k.iter().chain(v).copied().collect();
    let spec = ViewSpec::canonical(DType::F32).with_strides(
        (n * ROW) as i64,
        (LAYERS * n * ROW) as i64,
        ROW as i64,
        DIM as i64,
        1,
    );
    assert_eq!(model.store(NS, tokens, &KvView::new(&engine, &spec).unwrap()).unwrap().tokens, n as u64);
    let mut out = vec![0f32; engine.len()];
    let r = model.retrieve(NS, tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!((r.tokens, r.lossy()), (n as u64, false));
    for l in 0..LAYERS {
        let layer = n * ROW;
        assert_eq!(
            as_bytes(&out[2 * l * layer..(2 * l + 1) * layer]),
            as_bytes(&k[l * layer..(l + 1) * layer]),
            "K of layer {l}"
        );
        assert_eq!(
            as_bytes(&out[(2 * l + 1) * layer..(2 * l + 2) * layer]),
            as_bytes(&v[l * layer..(l + 1) * layer]),
            "V of layer {l}"
        );
    }
    assert_eq!(rt.stats().unwrap().tokens_served, n as u64);
}

#[test]
fn real_kv_of_the_reference_model_round_trips() {
    let (tokens, k, v) = reference_kv();
    real_kv_round_trip(&tokens, &k, &v);
}

#[test]
fn real_kv_dumped_by_kdn_generate_round_trips() {
    // ctest sets KDN_EXAMPLES_KV (the examples.kv fixture's prefix); outside
    // ctest, the committed reference KV is checked by the test above.
    let Some(prefix) = std::env::var_os("KDN_EXAMPLES_KV") else {
        eprintln!("KDN_EXAMPLES_KV is not set: nothing to read");
        return;
    };
    let prefix = prefix.to_string_lossy().into_owned();
    let tokens = read_i32(format!("{prefix}.tokens.i32").as_ref());
    let k = read_f32(format!("{prefix}.k.f32").as_ref());
    let v = read_f32(format!("{prefix}.v.f32").as_ref());
    assert_eq!(tokens.len(), 48);
    real_kv_round_trip(&tokens, &k, &v);
}

#[test]
fn a_load_reports_the_ranges_it_could_not_read() {
    // One disk tier; the middle chunk's file is damaged after the store: the
    // load gets the first chunk, and says which range failed.
    let dir = scratch_dir("damaged");
    let options = RuntimeOptions::default()
        .with_chunk_tokens(CHUNK)
        .with_tier(TierConfig::disk(&dir, 64 << 20).with_codec("raw"));
    let rt = Runtime::new(&options).unwrap();
    let model = rt.model(&spec("damaged")).unwrap();
    let tokens = tokens(TOKENS);
    let kv = canonical(TOKENS);
    model.store(NS, &tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    let files: Vec<_> = walk(&dir).into_iter().filter(|p| p.extension().is_some_and(|e| e == "kdn")).collect();
    assert_eq!(files.len(), 3, "one file per chunk: {files:?}");
    // Damage one chunk (which one, the hashed names do not say).
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&files[0], &bytes).unwrap();

    let op = model.load_async(NS, &tokens, vec![0f32; kv.len()], &ViewSpec::canonical(DType::F32)).unwrap();
    op.wait(Some(Duration::from_secs(10))).unwrap();
    let r = op.result().unwrap();
    let failed = op.failed_ranges().unwrap();
    assert_eq!((r.covered, r.num_failed, failed.len()), (48, 1, 1), "{r:?} {failed:?}");
    let bad = failed[0].clone();
    assert_eq!((bad.start % 16, bad.end - bad.start), (0, 16), "one chunk: {bad:?}");
    assert_eq!(r.tokens, 32, "the other chunks are written (recompute only the failed range)");
    let loaded = op.into_buffer();
    // Every chunk but the damaged one holds its KV.
    for l in 0..LAYERS {
        for kv_i in 0..2 {
            for t in 0..TOKENS {
                let at = ((l * 2 + kv_i) * TOKENS + t) * ROW;
                if !bad.contains(&(t as u64)) {
                    assert_eq!(loaded[at], value(l, kv_i, t, 0, 0), "layer {l} token {t}");
                }
            }
        }
    }
    assert_eq!(rt.stats().unwrap().corrupt_detected, 1);
    drop(model);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn async_ops_over_borrowed_paged_memory() {
    // An engine's own per-layer paged allocations (not owned by the op):
    // the unsafe variants, with the memory kept alive and untouched until
    // the op is gone.
    let (_rt, model) = setup();
    let tokens = tokens(TOKENS);
    let table = vec![2, 4, 0];
    let spec = ViewSpec::paged(DType::F32, Layout::PagedHnd, 16, table.clone());
    let k: Vec<Vec<f32>> = (0..LAYERS).map(|l| paged(Layout::PagedHnd, &table, 5, 0, l, TOKENS)).collect();
    let v: Vec<Vec<f32>> = (0..LAYERS).map(|l| paged(Layout::PagedHnd, &table, 5, 1, l, TOKENS)).collect();
    {
        let kr: Vec<&[f32]> = k.iter().map(Vec::as_slice).collect();
        let vr: Vec<&[f32]> = v.iter().map(Vec::as_slice).collect();
        let view = KvView::per_layer(&kr, &vr, &spec).unwrap();
        // SAFETY: k and v outlive the op, which is consumed below.
        let op = unsafe { model.save_async_unchecked(NS, &tokens, std::slice::from_ref(&view)) }.unwrap();
        for layer in (0..LAYERS as u32).rev() {
            op.layer_ready(layer).unwrap();
        }
        assert_eq!(op.finish().unwrap().0.tokens, 48);
    }
    let mut k2 = vec![vec![0f32; 5 * 16 * ROW]; LAYERS];
    let mut v2 = vec![vec![0f32; 5 * 16 * ROW]; LAYERS];
    {
        let ks = k2.iter_mut().map(Vec::as_mut_slice).collect();
        let vs = v2.iter_mut().map(Vec::as_mut_slice).collect();
        let view = KvViewMut::per_layer(ks, vs, &spec).unwrap();
        // SAFETY: k2 and v2 are borrowed by `view` and outlive the op, dropped in this block.
        let op = unsafe { model.load_async_unchecked(NS, &tokens, std::slice::from_ref(&view)) }.unwrap();
        op.wait_layer(LAYERS as u32 - 1, Some(Duration::from_secs(10))).unwrap();
        assert_eq!(op.wait(None).unwrap().tokens, 48);
    }
    assert_eq!((k2, v2), (k, v));
}

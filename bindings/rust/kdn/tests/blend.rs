// SPDX-License-Identifier: Apache-2.0
//! Blending (experimental): documents put with the reference model's real
//! KV, blended with its real forward pass behind the layer callback (the
//! Rust transformer of common/transformer.rs, checked here against the
//! committed reference KV). What the callback is asked for (layers,
//! positions, buffer lengths), that what it writes lands in the view, the
//! report, a failing and a panicking callback, device views (emulated
//! device), and bad input.

mod common;
use common::transformer::Transformer;
use common::*;
use kdn::*;
use std::cell::Cell;

const NS: &str = "blend";

fn runtime(device: DeviceMode) -> (Runtime, Model) {
    let options =
        RuntimeOptions::default().with_chunk_tokens(CHUNK).with_tier(TierConfig::host(16 << 20)).with_device(device);
    let rt = Runtime::new(&options).unwrap();
    let model = rt.model(&spec("stories260K")).unwrap();
    (rt, model)
}

/// Puts `tokens` as document `id`, its KV computed alone from position 0
/// (as kdn_knowledge_put takes it); returns that KV (canonical).
fn put(model: &Model, tf: &Transformer, id: &str, tokens: &[i32]) -> Vec<f32> {
    let kv = tf.prefill(tokens);
    model.knowledge(NS).put(id, 1, b"", tokens, &KvView::canonical(&kv, DType::F32)).unwrap();
    kv
}

/// Element (layer, k|v, position, e) of canonical KV of `n` positions.
fn at(n: usize, layer: usize, kv: usize, pos: usize) -> std::ops::Range<usize> {
    let start = ((layer * 2 + kv) * n + pos) * ROW;
    start..start + ROW
}

/// The largest difference over the largest magnitude.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    got.iter().zip(want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// The L2 norm of the difference over the L2 norm of `want`.
fn l2_error(got: &[f32], want: &[f32]) -> f64 {
    let sq = |x: f32| f64::from(x) * f64::from(x);
    let diff: f64 = got.iter().zip(want).map(|(a, b)| sq(a - b)).sum();
    (diff / want.iter().map(|&b| sq(b)).sum::<f64>()).sqrt()
}

/// One call of the layer callback, as it saw it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    layer: u32,
    positions: Vec<i32>,
    tokens: Option<Vec<i32>>,
    lengths: (usize, usize, usize, usize), // hidden, hidden_dim, k, v
    total: usize,
    /// The K and V rows it wrote for its positions.
    written: Vec<(Vec<f32>, Vec<f32>)>,
}

/// The reference model's layer forward pass as the callback, logging each call.
fn engine<'a>(tf: &'a Transformer, seen: &'a mut Vec<Seen>) -> impl FnMut(BlendLayer<'_>) -> Result<()> + 'a {
    move |c: BlendLayer<'_>| {
        tf.layer(c.layer as usize, c.positions, c.tokens, c.hidden, c.k, c.v);
        let written = c
            .positions
            .iter()
            .map(|&p| {
                let r = p as usize * ROW..(p as usize + 1) * ROW;
                (c.k[r.clone()].to_vec(), c.v[r].to_vec())
            })
            .collect();
        seen.push(Seen {
            layer: c.layer,
            positions: c.positions.to_vec(),
            tokens: c.tokens.map(<[i32]>::to_vec),
            lengths: (c.hidden.len(), c.hidden_dim, c.k.len(), c.v.len()),
            total: c.total,
            written,
        });
        Ok(())
    }
}

#[test]
fn the_rust_forward_pass_computes_the_reference_kv() {
    // The callback's engine is real: its prefill of the reference prompt is
    // the committed KV (computed in double precision elsewhere) to float32's
    // accuracy.
    let tf = Transformer::reference();
    assert_eq!((tf.layers, tf.kv_heads, tf.head_dim, tf.dim), (LAYERS, HEADS, DIM, 64));
    let (tokens, reference) = reference_canonical();
    let err = relative_error(&tf.prefill(&tokens), &reference);
    assert!(err < 1e-4, "relative error {err}");
}

#[test]
fn recomputing_every_position_is_the_full_prefill() {
    // BOS, then the rest of the reference prompt as a document computed
    // alone: with ratio 1 every cached position is recomputed at every layer,
    // so the blend is the whole prompt's prefill, bit for bit.
    let tf = Transformer::reference();
    let (tokens, reference) = reference_canonical();
    let (rt, model) = runtime(DeviceMode::Auto);
    put(&model, &tf, "story", &tokens[1..]);
    let n = tokens.len();
    let mut out = vec![-1f32; LAYERS * 2 * n * ROW];
    let mut seen = Vec::new();
    let report = model
        .blend(
            NS,
            &[Segment::tokens(&tokens[..1]), Segment::document("story")],
            &BlendOptions::new(tf.dim as u32).with_ratio(1.0),
            &mut KvViewMut::canonical(&mut out, DType::F32),
            engine(&tf, &mut seen),
        )
        .unwrap();
    let want =
        BlendReport { positions: 48, cached_positions: 47, fresh_positions: 1, selected: 47, recompute_fraction: 1.0 };
    assert_eq!(report, want);
    // One call per layer, in order, for every position; token ids at layer 0 only.
    assert_eq!(seen.iter().map(|s| s.layer).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    for s in &seen {
        assert_eq!(s.positions, (0..48).collect::<Vec<i32>>(), "layer {}", s.layer);
        assert_eq!(s.tokens.as_deref(), (s.layer == 0).then_some(&tokens[..]), "layer {}", s.layer);
        assert_eq!(s.lengths, (48 * tf.dim, tf.dim, 48 * ROW, 48 * ROW), "layer {}", s.layer);
        assert_eq!(s.total, 48);
    }
    assert_eq!(as_bytes(&out), as_bytes(&tf.prefill(&tokens)), "the blend is the prefill");
    assert!(relative_error(&out, &reference) < 1e-4);
    // The document's chunks served count on it.
    assert!(model.knowledge(NS).info("story").unwrap().hits > 0);
    drop(model);
    drop(rt);
}

#[test]
fn only_the_selected_positions_run_past_the_check_layer() {
    // Two documents in the opposite order of their text, then the query: the
    // C test's composition, with the reference model's tokens.
    let tf = Transformer::reference();
    let (tokens, _) = reference_canonical();
    let (_rt, model) = runtime(DeviceMode::Auto);
    let (bos, a, b, query) = (&tokens[..1], &tokens[1..20], &tokens[20..43], &tokens[43..]);
    let kv_a = put(&model, &tf, "doc-a", a);
    let kv_b = put(&model, &tf, "doc-b", b);
    let segments =
        [Segment::tokens(bos), Segment::document("doc-b"), Segment::document("doc-a"), Segment::tokens(query)];
    let context: Vec<i32> = [bos, b, a, query].concat();
    let n = context.len();
    let fresh: Vec<i32> = [0].into_iter().chain(43..48).collect();
    let doc_at = |pos: usize| -> Option<(&Vec<f32>, usize, usize)> {
        match pos {
            1..=23 => Some((&kv_b, 23, pos - 1)),
            24..=42 => Some((&kv_a, 19, pos - 24)),
            _ => None,
        }
    };

    // Ratio 0: the cached positions keep their placed KV; only the fresh
    // ones are computed, at every layer.
    let mut placed = vec![-1f32; LAYERS * 2 * n * ROW];
    let mut seen = Vec::new();
    let r0 = model
        .blend(
            NS,
            &segments,
            &BlendOptions::new(tf.dim as u32).with_ratio(0.0),
            &mut KvViewMut::canonical(&mut placed, DType::F32),
            engine(&tf, &mut seen),
        )
        .unwrap();
    assert_eq!((r0.positions, r0.cached_positions, r0.fresh_positions, r0.selected), (48, 42, 6, 0));
    assert!((r0.recompute_fraction - 6.0 / 48.0).abs() < 1e-12, "{}", r0.recompute_fraction);
    assert_eq!(seen.len(), LAYERS);
    for s in &seen {
        assert_eq!(s.positions, fresh, "layer {}", s.layer);
        let ids = fresh.iter().map(|&p| context[p as usize]).collect::<Vec<_>>();
        assert_eq!(s.tokens, (s.layer == 0).then_some(ids));
        assert_eq!(s.lengths, (6 * tf.dim, tf.dim, 48 * ROW, 48 * ROW));
        // What the callback wrote is what the view holds.
        for (&p, (k, v)) in s.positions.iter().zip(&s.written) {
            let l = s.layer as usize;
            assert_eq!(&placed[at(n, l, 0, p as usize)], &k[..], "K, layer {l} position {p}");
            assert_eq!(&placed[at(n, l, 1, p as usize)], &v[..], "V, layer {l} position {p}");
        }
    }
    // Each cached position holds its document's V as put (keys are rotated to the new positions).
    for l in 0..LAYERS {
        for pos in 1..43 {
            let (kv, len, i) = doc_at(pos).unwrap();
            assert_eq!(&placed[at(n, l, 1, pos)], &kv[at(len, l, 1, i)], "layer {l} position {pos}");
        }
    }

    // Ratio 0.25, check layer 1: every position through layers 0 and 1,
    // then the fresh ones and the 11 (25% of 42) cached ones whose keys
    // deviated most.
    let mut blended = vec![-1f32; LAYERS * 2 * n * ROW];
    let mut seen = Vec::new();
    let r = model
        .blend(
            NS,
            &segments,
            &BlendOptions::new(tf.dim as u32).with_ratio(0.25),
            &mut KvViewMut::canonical(&mut blended, DType::F32),
            engine(&tf, &mut seen),
        )
        .unwrap();
    assert_eq!((r.positions, r.cached_positions, r.fresh_positions, r.selected), (48, 42, 6, 11));
    assert!((r.recompute_fraction - (2.0 * 48.0 + 3.0 * 17.0) / 240.0).abs() < 1e-12, "{}", r.recompute_fraction);
    assert_eq!(seen.iter().map(|s| s.positions.len()).collect::<Vec<_>>(), [48, 48, 17, 17, 17]);
    let late = &seen[2].positions;
    assert!(seen[3..].iter().all(|s| &s.positions == late));
    assert!(fresh.iter().all(|p| late.contains(p)), "fresh positions always run: {late:?}");
    for s in &seen[2..] {
        let l = s.layer as usize;
        for pos in 0..n {
            let want = match s.positions.iter().position(|&p| p as usize == pos) {
                Some(i) => &s.written[i].1[..],
                None => {
                    let (kv, len, i) = doc_at(pos).expect("an unselected position is cached");
                    &kv[at(len, l, 1, i)]
                }
            };
            assert_eq!(&blended[at(n, l, 1, pos)], want, "V, layer {l} position {pos}");
        }
    }
    // Recomputing some of the positions brings the KV closer to the
    // context's full prefill than placing alone does (here 0.043 against
    // 0.062, relative L2).
    let full = tf.prefill(&context);
    let (e0, e25) = (l2_error(&placed, &full), l2_error(&blended, &full));
    assert!(e25 < 0.8 * e0, "ratio 0.25: {e25}, ratio 0: {e0}");
}

#[test]
fn a_failing_callback_stops_the_blend_with_its_status() {
    let tf = Transformer::reference();
    let (tokens, _) = reference_canonical();
    let (_rt, model) = runtime(DeviceMode::Auto);
    put(&model, &tf, "story", &tokens[1..]);
    let segments = [Segment::tokens(&tokens[..1]), Segment::document("story")];
    let options = BlendOptions::new(tf.dim as u32);
    let mut out = vec![-1f32; LAYERS * 2 * 48 * ROW];
    let calls = Cell::new(0);
    let e = model
        .blend(NS, &segments, &options, &mut KvViewMut::canonical(&mut out, DType::F32), |c| {
            calls.set(calls.get() + 1);
            if c.layer == 1 {
                return Err(Error::new(Status::Unavailable, "the engine's GPU is gone"));
            }
            tf.layer(c.layer as usize, c.positions, c.tokens, c.hidden, c.k, c.v);
            Ok(())
        })
        .unwrap_err();
    assert_eq!(e.status(), Status::Unavailable);
    assert!(e.message().contains("layer 1") && e.message().contains("the engine's GPU is gone"), "{e}");
    assert_eq!(calls.get(), 2);
    assert!(out.iter().all(|&x| x == -1.0), "nothing written");

    // A panic never crosses the C frame: caught, the blend stops, an Err.
    calls.set(0);
    let e = model
        .blend(NS, &segments, &options, &mut KvViewMut::canonical(&mut out, DType::F32), |c| {
            calls.set(calls.get() + 1);
            if c.layer == 2 {
                panic!("engine bug at {} positions", c.positions.len());
            }
            tf.layer(c.layer as usize, c.positions, c.tokens, c.hidden, c.k, c.v);
            Ok(())
        })
        .unwrap_err();
    assert_eq!(e.status(), Status::Internal);
    assert!(e.message().contains("panicked at layer 2") && e.message().contains("engine bug at"), "{e}");
    assert_eq!(calls.get(), 3);
    assert!(out.iter().all(|&x| x == -1.0), "nothing written");

    // The model is as it was: the next blend works.
    let mut seen = Vec::new();
    let r =
        model.blend(NS, &segments, &options, &mut KvViewMut::canonical(&mut out, DType::F32), engine(&tf, &mut seen));
    assert_eq!(r.unwrap().positions, 48);
    assert_ne!(out[0], -1.0);
}

#[test]
fn blends_into_device_views_as_into_host_views() {
    // The emulated device: host memory stands in for the GPU's; the blend
    // composes on the host, then writes the views through the device.
    let tf = Transformer::reference();
    let (tokens, _) = reference_canonical();
    let (_rt, model) = runtime(DeviceMode::Emulated);
    put(&model, &tf, "doc-a", &tokens[1..20]);
    put(&model, &tf, "doc-b", &tokens[20..43]);
    let segments = [Segment::document("doc-b"), Segment::document("doc-a"), Segment::tokens(&tokens[43..])];
    let options = BlendOptions::new(tf.dim as u32).with_ratio(0.25);
    let total = 23 + 19 + 5;
    let mut host = vec![-1f32; LAYERS * 2 * total * ROW];
    let mut device = host.clone();
    let mut seen = Vec::new();
    let r =
        model.blend(NS, &segments, &options, &mut KvViewMut::canonical(&mut host, DType::F32), engine(&tf, &mut seen));
    assert_eq!(r.unwrap().positions, total as u32);
    {
        let spec = ViewSpec::canonical(DType::F32).with_num_tokens(total as u64);
        // SAFETY: `device` is the emulated device's memory, its whole length,
        // borrowed by nothing else while the view lives.
        let mut view =
            unsafe { KvViewMut::from_device(device.as_mut_ptr().cast(), device.len() * 4, &spec, None) }.unwrap();
        let r = model.blend(NS, &segments, &options, &mut view, engine(&tf, &mut seen));
        assert_eq!(r.unwrap().positions, total as u32);
    }
    assert_ne!(host[0], -1.0);
    assert_eq!(as_bytes(&device), as_bytes(&host));

    // A runtime without a device refuses them, with nothing written.
    let (_rt, none) = runtime(DeviceMode::None);
    let mut untouched = vec![-1f32; LAYERS * 2 * 5 * ROW];
    let spec = ViewSpec::canonical(DType::F32).with_num_tokens(5);
    // SAFETY: as above.
    let mut view =
        unsafe { KvViewMut::from_device(untouched.as_mut_ptr().cast(), untouched.len() * 4, &spec, None) }.unwrap();
    let e =
        none.blend(NS, &[Segment::tokens(&tokens[43..])], &options, &mut view, |_| panic!("not called")).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
    assert!(e.message().contains("no device"), "{e}");
    drop(view);
    assert!(untouched.iter().all(|&x| x == -1.0));
}

#[test]
fn bad_blends_are_errors_before_any_callback() {
    let tf = Transformer::reference();
    let (tokens, _) = reference_canonical();
    let (_rt, model) = runtime(DeviceMode::Auto);
    put(&model, &tf, "story", &tokens[1..]);
    let options = BlendOptions::new(tf.dim as u32);
    let mut out = vec![-1f32; LAYERS * 2 * 48 * ROW];
    let mut blend = |segments: &[Segment<'_>], options: &BlendOptions, room: u64| {
        let spec = ViewSpec::canonical(DType::F32).with_num_tokens(room);
        let mut view = KvViewMut::new(&mut out, &spec).unwrap();
        model.blend(NS, segments, options, &mut view, |_| panic!("not called")).unwrap_err()
    };
    let story = [Segment::tokens(&tokens[..1]), Segment::document("story")];
    let e = blend(&[Segment::tokens(&tokens[..1]), Segment::document("no-such-doc")], &options, 48);
    assert_eq!(e.status(), Status::NotFound, "{e}");
    let e = blend(&story, &options, 47); // the context is 48 positions
    assert_eq!(e.status(), Status::BufferTooSmall, "{e}");
    let e = blend(&[Segment::tokens(&[1u32, u32::MAX])], &options, 48);
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("i32::MAX"), "{e}");
    assert_eq!(blend(&story, &BlendOptions::new(0), 48).status(), Status::InvalidArgument);
    assert_eq!(blend(&story, &options.clone().with_ratio(2.0), 48).status(), Status::InvalidArgument);
    assert_eq!(blend(&story, &options.clone().with_check_layers(vec![3, 1]), 48).status(), Status::InvalidArgument);
    assert_eq!(blend(&[], &options, 48).status(), Status::InvalidArgument);
    let e = model.blend("other-tenant", &story, &options, &mut KvViewMut::canonical(&mut out, DType::F32), |_| {
        panic!("not called")
    });
    assert_eq!(e.unwrap_err().status(), Status::NotFound);
    assert!(out.iter().all(|&x| x == -1.0), "nothing written");
}

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
    kv_only: bool,
    positions: Vec<i32>,
    tokens: Option<Vec<i32>>,
    lengths: (usize, usize, usize, usize), // hidden, hidden_dim, k, v
    total: usize,
    /// The K and V rows it wrote for its positions.
    written: Vec<(Vec<f32>, Vec<f32>)>,
}

/// The reference model's layer forward pass (or KV pass) as the callback, logging each call.
fn engine<'a>(tf: &'a Transformer, seen: &'a mut Vec<Seen>) -> impl FnMut(BlendLayer<'_>) -> Result<()> + 'a {
    move |c: BlendLayer<'_>| {
        if c.kv_only {
            tf.kv_pass(c.layer as usize, c.positions, c.tokens, c.hidden, c.k, c.v);
        } else {
            tf.layer(c.layer as usize, c.positions, c.tokens, c.hidden, c.k, c.v);
        }
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
            kv_only: c.kv_only,
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
    let want = BlendReport {
        positions: 48,
        cached_positions: 47,
        fresh_positions: 1,
        selected: 47,
        recompute_fraction: 1.0,
        anchored: 0,
        kv_passes: 0,
        ratio: 1.0,
        num_check_layers: 1, // CacheBlend's layer 1, without a KV pass
        gated: false,
        gate_kl_ratio: -1.0, // no gate
    };
    assert_eq!(report, want);
    assert!(seen.iter().all(|s| !s.kv_only), "no KV pass without BlendOptions::with_kv_pass");
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

/// The C test's composition (1.9's tests): documents a (19 tokens) and b
/// (23) of the reference prompt put alone, blended as BOS, b, a, the query
/// (48 positions, 42 cached, 6 fresh).
struct Composition {
    tf: Transformer,
    tokens: Vec<i32>,
    _rt: Runtime,
    model: Model,
}

impl Composition {
    fn new() -> Composition {
        let tf = Transformer::reference();
        let (tokens, _) = reference_canonical();
        let (rt, model) = runtime(DeviceMode::Auto);
        put(&model, &tf, "doc-a", &tokens[1..20]);
        put(&model, &tf, "doc-b", &tokens[20..43]);
        Composition { tf, tokens, _rt: rt, model }
    }

    fn segments(&self) -> [Segment<'_>; 4] {
        let t = &self.tokens;
        [Segment::tokens(&t[..1]), Segment::document("doc-b"), Segment::document("doc-a"), Segment::tokens(&t[43..])]
    }

    /// Blends the segments with `options`: the KV (canonical), the report, the calls.
    fn blend(&self, options: &BlendOptions) -> (Vec<f32>, BlendReport, Vec<Seen>) {
        let mut out = vec![-1f32; LAYERS * 2 * 48 * ROW];
        let mut seen = Vec::new();
        let report = self
            .model
            .blend(
                NS,
                &self.segments(),
                options,
                &mut KvViewMut::canonical(&mut out, DType::F32),
                engine(&self.tf, &mut seen),
            )
            .unwrap();
        (out, report, seen)
    }
}

#[test]
fn a_kv_pass_gives_the_same_kv_for_less_work() {
    // 1.9: with a KV pass a check layer computes only the K and V of the
    // cached tokens it may drop, selects on those keys, and runs the whole
    // layer for the selected and fresh ones: the KV of whole check layers,
    // bit for bit, for less work.
    let c = Composition::new();
    let dim = c.tf.dim as u32;
    let cost = c.tf.kv_cost();
    assert!(cost > 0.0 && cost < 0.5, "{cost}");
    // The defaults of the method with a KV pass: ratio 0.28 over check layers 1 and 2.
    let (by_pass, a, seen) = c.blend(&BlendOptions::new(dim).with_kv_pass(cost));
    assert_eq!((a.ratio, a.num_check_layers), (0.28, 2));
    assert_eq!((a.positions, a.cached_positions, a.fresh_positions, a.anchored), (48, 42, 6, 0));
    assert_eq!(a.selected, 12); // 42 x 0.28, rounded
    assert_eq!(a.kv_passes, 42 + 22); // 42 candidates at layer 1, 42 x 0.28^(1/2) = 22 at layer 2
                                      // Per layer: the KV pass of the candidates, then the whole layer for the kept and fresh ones.
    let calls: Vec<(u32, bool, usize)> = seen.iter().map(|s| (s.layer, s.kv_only, s.positions.len())).collect();
    assert_eq!(
        calls,
        [(0, false, 48), (1, true, 42), (1, false, 28), (2, true, 22), (2, false, 18), (3, false, 18), (4, false, 18)]
    );
    // The KV passes were asked for cached positions only, with the buffers of a whole layer.
    for s in seen.iter().filter(|s| s.kv_only) {
        assert!(s.positions.iter().all(|&p| (1..43).contains(&p)), "layer {}: {:?}", s.layer, s.positions);
        assert_eq!(
            (s.tokens.as_ref(), s.lengths),
            (None, (s.positions.len() * c.tf.dim, c.tf.dim, 48 * ROW, 48 * ROW))
        );
    }
    // The same blend with whole check layers: the same KV and selection, more work.
    let whole = BlendOptions::new(dim).with_ratio(0.28).with_check_layers(vec![1, 2]);
    let (by_layers, b, seen) = c.blend(&whole);
    assert!(seen.iter().all(|s| !s.kv_only));
    assert_eq!((b.kv_passes, b.selected, b.ratio, b.num_check_layers), (0, 12, 0.28, 2));
    assert_eq!(as_bytes(&by_pass), as_bytes(&by_layers), "the KV pass changed the KV");
    assert_ne!(by_pass[0], -1.0);
    // Work: whole rows 48 at layer 0, 6 fresh + 22 kept at layer 1, 6 + 12
    // at layers 2-4; 64 KV-pass rows at their cost; over 5 layers x 48.
    let want = (48.0 + 28.0 + 3.0 * 18.0 + f64::from(cost) * 64.0) / 240.0;
    assert!((a.recompute_fraction - want).abs() < 1e-6, "{} vs {want}", a.recompute_fraction);
    // Whole check layers: 48 rows at layers 0 and 1, 6 + 22 at layer 2, 6 + 12 at layers 3-4.
    assert!(
        (b.recompute_fraction - (48.0 + 48.0 + 28.0 + 2.0 * 18.0) / 240.0).abs() < 1e-12,
        "{}",
        b.recompute_fraction
    );
    assert!(a.recompute_fraction < b.recompute_fraction);
}

#[test]
fn the_default_ratio_is_the_methods() {
    // Ratio None is kdn.h's -1: 0.28 over check layers 1 and 2 with a KV
    // pass (above), CacheBlend's 0.15 at layer 1 without; the report says
    // which was used. An explicit ratio is used as given.
    let c = Composition::new();
    let dim = c.tf.dim as u32;
    let (_, r, seen) = c.blend(&BlendOptions::new(dim));
    assert_eq!((r.ratio, r.num_check_layers, r.selected, r.kv_passes), (0.15, 1, 6, 0)); // 42 x 0.15, rounded
    assert_eq!(seen.iter().map(|s| s.positions.len()).collect::<Vec<_>>(), [48, 48, 12, 12, 12]);
    let (_, r, _) = c.blend(&BlendOptions::new(dim).with_kv_pass(c.tf.kv_cost()));
    assert_eq!((r.ratio, r.num_check_layers, r.selected), (0.28, 2, 12));
    let (_, r, _) = c.blend(&BlendOptions::new(dim).with_ratio(0.5).with_kv_pass(c.tf.kv_cost()));
    assert_eq!((r.ratio, r.num_check_layers, r.selected), (0.5, 2, 21));
}

#[test]
fn the_gate_blends_only_a_method_measured_good_enough() {
    // 1.9: a calibration file records, for this model, the default method
    // with a KV pass (KL ratio 0.11) and CacheBlend's without (0.31). Under
    // the default bound 0.2 the first blends; the second is refused and the
    // whole context recomputed: the full prefill.
    let c = Composition::new();
    let dim = c.tf.dim as u32;
    let hex: String = c.model.fingerprint().unwrap().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex.len(), 64);
    let dir = std::env::temp_dir().join(format!("kdn-rust-gate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gate = dir.join("gate.txt");
    std::fs::write(
        &gate,
        format!(
            "# kdn blend calibrate (written by hand for this test)\n\
             {hex} ratio=0.28 checks=1,2 kv_pass=1 first=0 kl_ratio=0.11 top1=0.98 f=0.25 contexts=8\n\
             {hex} ratio=0.15 checks=1 kv_pass=0 first=0 kl_ratio=0.31 top1=0.95 f=0.3 contexts=8\n"
        ),
    )
    .unwrap();
    let kv_pass = BlendOptions::new(dim).with_kv_pass(c.tf.kv_cost());
    let (ungated, plain, _) = c.blend(&kv_pass);
    let (kv, r, seen) = c.blend(&kv_pass.clone().with_gate(&gate, 0.2));
    assert_eq!((r.gated, r.gate_kl_ratio), (false, 0.11));
    assert_eq!((r.ratio, r.num_check_layers, r.selected), (0.28, 2, 12));
    assert_eq!(BlendReport { gated: false, gate_kl_ratio: -1.0, ..r }, plain, "the blend the gate let through");
    assert_eq!(as_bytes(&kv), as_bytes(&ungated));
    assert!(seen.iter().any(|s| s.kv_only));

    // Without a KV pass: CacheBlend's method, 0.31 > 0.2: every position recomputed.
    let (kv, r, seen) = c.blend(&BlendOptions::new(dim).with_gate(gate.to_str().unwrap(), 0.2));
    assert_eq!((r.gated, r.gate_kl_ratio), (true, 0.31));
    assert_eq!((r.positions, r.cached_positions, r.fresh_positions, r.selected), (48, 42, 6, 42));
    assert_eq!(r.recompute_fraction, 1.0);
    assert!(seen.iter().all(|s| s.positions.len() == 48), "every position at every layer");
    let context: Vec<i32> = [&c.tokens[..1], &c.tokens[20..43], &c.tokens[1..20], &c.tokens[43..]].concat();
    assert_eq!(as_bytes(&kv), as_bytes(&c.tf.prefill(&context)), "gated: the full prefill");
    // A bound above its record lets it blend; a method the file lacks is gated, its ratio -1.
    let (_, r, _) = c.blend(&BlendOptions::new(dim).with_gate(&gate, 0.5));
    assert_eq!((r.gated, r.gate_kl_ratio, r.selected), (false, 0.31, 6));
    let (_, r, _) = c.blend(&BlendOptions::new(dim).with_ratio(0.5).with_gate(&gate, 0.5));
    assert_eq!((r.gated, r.gate_kl_ratio, r.selected), (true, -1.0, 42));

    // A missing file is bad input, before any callback.
    let mut out = vec![-1f32; LAYERS * 2 * 48 * ROW];
    let missing = BlendOptions::new(dim).with_gate(dir.join("no-such-gate.txt"), 0.2);
    let e = c
        .model
        .blend(NS, &c.segments(), &missing, &mut KvViewMut::canonical(&mut out, DType::F32), |_| panic!("not called"))
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(out.iter().all(|&x| x == -1.0), "nothing written");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn first_tokens_of_each_document_run_every_layer() {
    // first_tokens 3: each document's first 3 positions (its attention
    // sink, computed alone) are recomputed at every layer: 3 x 2 documents.
    let c = Composition::new();
    let (_, r, seen) = c.blend(&BlendOptions::new(c.tf.dim as u32).with_first_tokens(3));
    assert_eq!(r.anchored, 6);
    for s in &seen {
        for p in [1, 2, 3, 24, 25, 26] {
            assert!(s.positions.contains(&p), "layer {}: position {p} not recomputed", s.layer);
        }
    }
    let (_, r, _) = c.blend(&BlendOptions::new(c.tf.dim as u32));
    assert_eq!(r.anchored, 0);
}

#[test]
fn a_failing_kv_pass_stops_the_blend() {
    let c = Composition::new();
    let options = BlendOptions::new(c.tf.dim as u32).with_kv_pass(c.tf.kv_cost());
    let mut out = vec![-1f32; LAYERS * 2 * 48 * ROW];
    let e = c
        .model
        .blend(NS, &c.segments(), &options, &mut KvViewMut::canonical(&mut out, DType::F32), |l| {
            if l.kv_only {
                return Err(Error::new(Status::Unavailable, "no KV kernel"));
            }
            c.tf.layer(l.layer as usize, l.positions, l.tokens, l.hidden, l.k, l.v);
            Ok(())
        })
        .unwrap_err();
    assert_eq!(e.status(), Status::Unavailable);
    assert!(e.message().contains("KV pass (kv_fn) failed at layer 1") && e.message().contains("no KV kernel"), "{e}");
    let e = c
        .model
        .blend(NS, &c.segments(), &options, &mut KvViewMut::canonical(&mut out, DType::F32), |l| {
            assert!(!l.kv_only, "KV pass bug");
            c.tf.layer(l.layer as usize, l.positions, l.tokens, l.hidden, l.k, l.v);
            Ok(())
        })
        .unwrap_err();
    assert_eq!(e.status(), Status::Internal);
    assert!(e.message().contains("KV pass panicked at layer 1") && e.message().contains("KV pass bug"), "{e}");
    assert!(out.iter().all(|&x| x == -1.0), "nothing written");
}

#[test]
fn match_finds_the_documents_in_a_context() {
    // BOS, document b, 3 other tokens, document a, the query: b and a are
    // found where they are; the rest is for the engine to compute.
    let c = Composition::new();
    let t = &c.tokens;
    let context: Vec<i32> = [&t[..1], &t[20..43], &t[43..46], &t[1..20], &t[43..]].concat();
    assert_eq!(context.len(), 51);
    assert_eq!(c.model.match_tokens(NS, &context).unwrap(), vec![1..24, 27..46]);
    let as_u32: Vec<u32> = context.iter().map(|&x| x as u32).collect();
    assert_eq!(c.model.match_tokens(NS, &as_u32).unwrap(), vec![1..24, 27..46]);
    // Another namespace holds no documents; a context without them finds none.
    assert_eq!(c.model.match_tokens("other-tenant", &context).unwrap(), vec![]);
    assert_eq!(c.model.match_tokens(NS, &t[43..]).unwrap(), vec![]);
    // Bad input.
    let e = c.model.match_tokens(NS, &[] as &[i32]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = c.model.match_tokens(NS, &[1u32, u32::MAX]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.message().contains("i32::MAX"), "{e}");
    assert_eq!(c.model.match_tokens(NS, &[1, -5, 7]).unwrap_err().status(), Status::InvalidArgument);
    assert_eq!(c.model.match_tokens("", &context).unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn blending_by_text_is_blending_the_same_segments() {
    // kdn_kv_blend_tokens places what matching finds and computes the rest:
    // the same KV, bit for bit, and the same report as the documents given
    // as segments (with a KV pass, as the engine would run it).
    let c = Composition::new();
    let t = &c.tokens;
    let context: Vec<i32> = [&t[..1], &t[20..43], &t[43..46], &t[1..20], &t[43..]].concat();
    let n = context.len();
    let options = BlendOptions::new(c.tf.dim as u32).with_kv_pass(c.tf.kv_cost());
    let mut by_text = vec![-1f32; LAYERS * 2 * n * ROW];
    let mut seen = Vec::new();
    let rt = c
        .model
        .blend_tokens(
            NS,
            &context,
            &options,
            &mut KvViewMut::canonical(&mut by_text, DType::F32),
            engine(&c.tf, &mut seen),
        )
        .unwrap();
    assert_eq!((rt.positions, rt.cached_positions, rt.fresh_positions), (51, 42, 9));
    assert_eq!(seen[0].tokens.as_deref(), Some(&context[..]), "layer 0 computes every position of the context");
    let segments = [
        Segment::tokens(&t[..1]),
        Segment::document("doc-b"),
        Segment::tokens(&t[43..46]),
        Segment::document("doc-a"),
        Segment::tokens(&t[43..]),
    ];
    let mut by_segments = vec![-2f32; LAYERS * 2 * n * ROW];
    let mut seen = Vec::new();
    let rs = c
        .model
        .blend(
            NS,
            &segments,
            &options,
            &mut KvViewMut::canonical(&mut by_segments, DType::F32),
            engine(&c.tf, &mut seen),
        )
        .unwrap();
    assert_eq!(rt, rs);
    assert_eq!(as_bytes(&by_text), as_bytes(&by_segments));
    // A context of no document's tokens: all computed.
    let fresh = &t[43..];
    let mut out = vec![-1f32; LAYERS * 2 * fresh.len() * ROW];
    let r = c
        .model
        .blend_tokens(NS, fresh, &options, &mut KvViewMut::canonical(&mut out, DType::F32), engine(&c.tf, &mut seen))
        .unwrap();
    assert_eq!((r.positions, r.cached_positions, r.fresh_positions, r.selected), (5, 0, 5, 0));
    assert_eq!(as_bytes(&out), as_bytes(&c.tf.prefill(fresh)), "all computed: the prefill");
    // Bad input, before any callback: no tokens; a view of less room than the context.
    let mut blend = |tokens: &[i32], room: u64| {
        let spec = ViewSpec::canonical(DType::F32).with_num_tokens(room);
        let mut view = KvViewMut::new(&mut by_text, &spec).unwrap();
        c.model.blend_tokens(NS, tokens, &options, &mut view, |_| panic!("not called")).unwrap_err()
    };
    assert_eq!(blend(&[], 51).status(), Status::InvalidArgument);
    assert_ne!(blend(&context, 50).code(), 0);
    assert_eq!(as_bytes(&by_text), as_bytes(&by_segments), "nothing written");
}

#[test]
fn a_kv_pass_needs_its_cost() {
    // kdn refuses a kv_fn whose kv_cost is outside (0, 1]; the error is its
    // status and its message.
    let c = Composition::new();
    let mut out = vec![-1f32; LAYERS * 2 * 48 * ROW];
    for bad in [0.0, -0.5, 1.5, f32::NAN] {
        let options = BlendOptions::new(c.tf.dim as u32).with_kv_pass(bad);
        let e = c
            .model
            .blend(NS, &c.segments(), &options, &mut KvViewMut::canonical(&mut out, DType::F32), |_| {
                panic!("not called")
            })
            .unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{bad}");
        assert!(e.message().contains("with kv_fn, kv_cost") && e.message().contains("(0, 1]"), "{bad}: {e}");
        let e = c
            .model
            .blend_tokens(NS, &c.tokens, &options, &mut KvViewMut::canonical(&mut out, DType::F32), |_| {
                panic!("not called")
            })
            .unwrap_err();
        assert!(e.status() == Status::InvalidArgument && e.message().contains("kv_cost"), "{bad}: {e}");
    }
    assert!(out.iter().all(|&x| x == -1.0), "nothing written");
}

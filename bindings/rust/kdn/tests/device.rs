// SPDX-License-Identifier: Apache-2.0
//! KV views in device memory (C ABI 1.5) and the engine's CUDA stream (1.8),
//! on the emulated device (`DeviceMode::Emulated`: host memory stands in
//! for the GPU's and every device path runs its kernel's CPU path): the
//! reference model's real KV stored from a device view and retrieved into
//! another, against the host path, through every tier kind that takes part
//! (device tier, a disk tier raw and with a codec decoded on the device),
//! synchronously and through async ops; refusals where there is no device.

mod common;
use common::*;
use kdn::*;
use std::ffi::c_void;
use std::time::Duration;

const BLOCK: usize = 16;

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("device-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A runtime on the emulated device: a device tier written through to a
/// disk tier in `dir` with `codec`.
fn emulated(dir: &std::path::Path, codec: &str) -> Runtime {
    let options = RuntimeOptions::default()
        .with_chunk_tokens(CHUNK)
        .with_device(DeviceMode::Emulated)
        .with_tier(TierConfig::device(8 << 20).with_write_through(true))
        .with_tier(TierConfig::disk(dir, 64 << 20).with_codec(codec));
    Runtime::new(&options).unwrap()
}

/// An engine's paged KV cache: per layer, K and V allocations of `blocks`
/// blocks of 16 tokens, token t in block `table[t / 16]`, NHD or HND.
struct Paged {
    layout: Layout,
    table: Vec<i32>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Paged {
    fn new(layout: Layout, table: Vec<i32>, blocks: usize) -> Paged {
        let layer = vec![0f32; blocks * BLOCK * ROW];
        Paged { layout, table, k: vec![layer.clone(); LAYERS], v: vec![layer; LAYERS] }
    }
    fn at(&self, t: usize, h: usize, d: usize) -> usize {
        let b = self.table[t / BLOCK] as usize * BLOCK * ROW;
        match self.layout {
            Layout::PagedNhd => b + (t % BLOCK) * ROW + h * DIM + d,
            _ => b + h * BLOCK * DIM + (t % BLOCK) * DIM + d,
        }
    }
    /// Canonical KV of `n` tokens written in.
    fn holding(mut self, kv: &[f32], n: usize) -> Paged {
        for l in 0..LAYERS {
            for t in 0..n {
                for e in 0..ROW {
                    let at = self.at(t, e / DIM, e % DIM);
                    self.k[l][at] = kv[((2 * l) * n + t) * ROW + e];
                    self.v[l][at] = kv[((2 * l + 1) * n + t) * ROW + e];
                }
            }
        }
        self
    }
    /// Its first `n` tokens, canonical.
    fn to_canonical(&self, n: usize) -> Vec<f32> {
        let mut out = vec![0f32; LAYERS * 2 * n * ROW];
        for l in 0..LAYERS {
            for t in 0..n {
                for e in 0..ROW {
                    let at = self.at(t, e / DIM, e % DIM);
                    out[((2 * l) * n + t) * ROW + e] = self.k[l][at];
                    out[((2 * l + 1) * n + t) * ROW + e] = self.v[l][at];
                }
            }
        }
        out
    }
    fn spec(&self) -> ViewSpec {
        ViewSpec::paged(DType::F32, self.layout, BLOCK as u32, self.table.clone())
    }
    fn layer_bytes(&self) -> usize {
        self.k[0].len() * 4
    }
    /// A view of it as device memory kdn may read.
    ///
    /// # Safety
    /// The allocations must stay as they are while the view is used.
    unsafe fn device_view(&self, stream: Option<CudaStream>) -> KvView<'static> {
        let k: Vec<*const c_void> = self.k.iter().map(|a| a.as_ptr().cast()).collect();
        let v: Vec<*const c_void> = self.v.iter().map(|a| a.as_ptr().cast()).collect();
        unsafe { KvView::from_device_per_layer(&k, &v, self.layer_bytes(), &self.spec(), stream) }.unwrap()
    }
    /// A view of it as device memory kdn may write.
    ///
    /// # Safety
    /// The allocations must not be used otherwise while the view is used.
    unsafe fn device_view_mut(&mut self, stream: Option<CudaStream>) -> KvViewMut<'static> {
        let bytes = self.layer_bytes();
        let k: Vec<*mut c_void> = self.k.iter_mut().map(|a| a.as_mut_ptr().cast()).collect();
        let v: Vec<*mut c_void> = self.v.iter_mut().map(|a| a.as_mut_ptr().cast()).collect();
        unsafe { KvViewMut::from_device_per_layer(&k, &v, bytes, &self.spec(), stream) }.unwrap()
    }
}

/// The reference prompt's KV stored from a paged NHD device view and
/// retrieved into a paged HND device view, against the same KV stored from
/// and retrieved into host views; then again from a fresh runtime over the
/// same disk directory (the device tier empty: the disk's chunks, decoded
/// for the device).
fn device_path_is_the_host_path(codec: &str, lossy: bool) {
    let (tokens, reference) = reference_canonical();
    let n = tokens.len();
    let dir = scratch_dir(codec);
    // A stand-in stream handle: the emulated device never dereferences it.
    let mut marker = 0u8;
    let stream = CudaStream::from_raw((&mut marker as *mut u8).cast());
    let src = Paged::new(Layout::PagedNhd, vec![5, 3, 1], 6).holding(&reference, n);
    // `lossy`: whether the KV comes from the disk's codec (the device tier is raw).
    let host_path = |model: &Model, ns: &str, lossy: bool| {
        let mut out = vec![0f32; reference.len()];
        let r = model.retrieve(ns, &tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
        assert_eq!((r.tokens, r.lossy()), (n as u64, lossy));
        out
    };
    let device_path = |model: &Model, ns: &str, lossy: bool| {
        let mut dst = Paged::new(Layout::PagedHnd, vec![2, 0, 4], 5);
        {
            // SAFETY: dst's allocations are used by nothing else while the view lives.
            let mut view = unsafe { dst.device_view_mut(stream) };
            assert_eq!((view.memory(), view.cuda_stream()), (MemoryKind::Device, stream));
            let r = model.retrieve(ns, &tokens, &mut view).unwrap();
            assert_eq!((r.tokens, r.covered, r.lossy()), (n as u64, n as u64, lossy));
        }
        dst.to_canonical(n)
    };
    {
        let rt = emulated(&dir, codec);
        let model = rt.model(&spec("device")).unwrap();
        model.store("host", &tokens, &KvView::canonical(&reference, DType::F32)).unwrap();
        {
            // SAFETY: src outlives the view and is not written meanwhile.
            let view = unsafe { src.device_view(stream) };
            assert_eq!(model.store("device", &tokens, &view).unwrap().tokens, n as u64);
        }
        let held = || rt.all_tier_stats().unwrap().iter().map(|t| t.objects).collect::<Vec<_>>();
        assert!(eventually(|| held() == [6, 6]), "both tiers hold both copies: {:?}", held());
        let host = host_path(&model, "host", false);
        assert_eq!(as_bytes(&host), as_bytes(&reference), "the device tier is raw");
        assert_eq!(as_bytes(&device_path(&model, "device", false)), as_bytes(&host));
        assert_eq!(as_bytes(&device_path(&model, "host", false)), as_bytes(&host));
        // The tier measured its delivery into device views (1.7).
        assert!(rt.tier_stats(0).unwrap().device_delivery_ns_per_token > 0.0, "{:?}", rt.tier_stats(0));
    }
    // A fresh runtime: the device tier is empty, the disk holds the chunks
    // (encoded with `codec`), decoded into the device views.
    let rt = emulated(&dir, codec);
    let model = rt.model(&spec("device")).unwrap();
    let device = device_path(&model, "device", lossy);
    let host = host_path(&model, "host", lossy);
    assert_eq!(as_bytes(&device), as_bytes(&host), "{codec}: device and host decodes agree");
    if lossy {
        let worst = host.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let scale = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(worst > 0.0 && worst < 0.1 * scale, "{codec}: error {worst} of {scale}");
    } else {
        assert_eq!(as_bytes(&host), as_bytes(&reference));
    }
    assert_eq!(rt.tier_stats(1).unwrap().decode_failures, 0);
    drop(model);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_views_raw() {
    device_path_is_the_host_path("raw", false);
}

#[test]
fn device_views_decoded_on_the_device() {
    device_path_is_the_host_path("kdn", true);
}

#[test]
fn async_ops_over_device_views() {
    let (tokens, reference) = reference_canonical();
    let n = tokens.len();
    let dir = scratch_dir("async");
    let rt = emulated(&dir, "raw");
    let model = rt.model(&spec("device-async")).unwrap();
    let src = Paged::new(Layout::PagedNhd, vec![0, 1, 2], 3).holding(&reference, n);
    {
        // SAFETY: src outlives the op, consumed in this block, and is not written.
        let view = unsafe { src.device_view(None) };
        let op = unsafe { model.save_async_unchecked("ns", &tokens, std::slice::from_ref(&view)) }.unwrap();
        for layer in 0..LAYERS as u32 {
            op.layer_ready(layer).unwrap();
        }
        assert_eq!(op.finish().unwrap().0.tokens, n as u64);
    }
    let mut dst = Paged::new(Layout::PagedHnd, vec![2, 1, 0], 3);
    {
        // SAFETY: dst is used by nothing else until the op is consumed in this block.
        let view = unsafe { dst.device_view_mut(None) };
        let op = unsafe { model.load_async_unchecked("ns", &tokens, std::slice::from_ref(&view)) }.unwrap();
        for layer in 0..LAYERS as u32 {
            op.wait_layer(layer, Some(Duration::from_secs(10))).unwrap();
        }
        let r = op.wait(Some(Duration::from_secs(10))).unwrap();
        assert_eq!((r.state, r.tokens, r.num_failed), (OpState::Done, n as u64, 0));
    }
    assert_eq!(as_bytes(&dst.to_canonical(n)), as_bytes(&reference));
    drop(model);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_views_need_a_device() {
    let (tokens, reference) = reference_canonical();
    let none = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(CHUNK).with_device(DeviceMode::None)).unwrap();
    let model = none.model(&spec("no-device")).unwrap();
    let mut kv = reference.clone();
    let spec_c = ViewSpec::canonical(DType::F32);
    {
        // SAFETY: `kv` is borrowed by nothing else while the views live.
        let view = unsafe { KvView::from_device(kv.as_ptr().cast(), kv.len() * 4, &spec_c, None) }.unwrap();
        let e = model.store("ns", &tokens, &view).unwrap_err();
        assert_eq!(e.status(), Status::Unsupported);
        assert!(e.message().contains("no device"), "{e}");
        let mut out = unsafe { KvViewMut::from_device(kv.as_mut_ptr().cast(), kv.len() * 4, &spec_c, None) }.unwrap();
        assert_eq!(model.retrieve("ns", &tokens, &mut out).unwrap_err().status(), Status::Unsupported);
    }
    assert_eq!(as_bytes(&kv), as_bytes(&reference), "nothing touched");

    // The knowledge calls take no device views, even with a device.
    let rt = Runtime::new(&RuntimeOptions::default().with_device(DeviceMode::Emulated)).unwrap();
    let model = rt.model(&spec("emulated")).unwrap();
    // SAFETY: as above.
    let view = unsafe { KvView::from_device(kv.as_ptr().cast(), kv.len() * 4, &spec_c, None) }.unwrap();
    let e = model.knowledge("ns").put("doc", 1, b"", &tokens, &view).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported, "{e}");

    // Device modes and ordinals out of range.
    let bad = |options: RuntimeOptions| Runtime::new(&options).unwrap_err().status();
    assert_eq!(bad(RuntimeOptions::default().with_device(DeviceMode::Unknown(7))), Status::InvalidArgument);
    assert_eq!(
        bad(RuntimeOptions::default().with_device(DeviceMode::Emulated).with_device_ordinal(-1)),
        Status::InvalidArgument
    );
    assert_eq!(RuntimeOptions::default().device, DeviceMode::Auto);
    assert_eq!(DeviceMode::from_raw(2), DeviceMode::Emulated);
    assert_eq!((MemoryKind::Host.raw(), MemoryKind::Device.raw()), (0, 1));
    // Host views name no stream and are host memory.
    let host = KvView::canonical(&reference, DType::F32);
    assert_eq!((host.memory(), host.cuda_stream()), (MemoryKind::Host, None));
    assert_eq!(CudaStream::from_raw(std::ptr::null_mut()), None);
}

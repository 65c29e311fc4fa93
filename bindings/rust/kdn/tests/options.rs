// SPDX-License-Identifier: Apache-2.0
//! The runtime options, tier settings, request fields and statistics of C
//! ABI 1.5 to 1.8: the deployment's secret (1.8) sealing a disk tier's
//! chunks, loads never slower than prefill (1.7) and their statistics,
//! quality levels of remote tiers (1.6), TTFT targets on requests (1.6), the
//! cost-aware eviction policy (1.5). The KV is the reference model's.

mod common;
use common::*;
use kdn::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NS: &str = "options";

fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("options-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file of `bytes` with permissions `mode`.
fn file(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A runtime with one disk tier in `dir` (raw), the options given.
fn disk_runtime(dir: &Path, options: RuntimeOptions) -> Result<Runtime> {
    Runtime::new(
        &options.with_chunk_tokens(CHUNK).with_tier(TierConfig::disk(dir.join("tier"), 64 << 20).with_codec("raw")),
    )
}

/// Retrieves the reference prompt; the tokens written, and whether they are its KV.
fn retrieve(model: &Model, tokens: &[i32], reference: &[f32]) -> (u64, bool) {
    let mut out = vec![0f32; reference.len()];
    let r = model.retrieve(NS, tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    let n = r.tokens as usize;
    let same = (0..LAYERS * 2).all(|lk| {
        let (a, b) = (lk * tokens.len() * ROW, n * ROW);
        as_bytes(&out[a..a + b]) == as_bytes(&reference[a..a + b])
    });
    (r.tokens, same)
}

#[test]
fn a_secret_file_seals_the_disk_tier() {
    let (tokens, reference) = reference_canonical();
    let dir = scratch_dir("secret");
    let ours = file(&dir, "ours", b"secret-of-this-deployment-32-bytes-at-least", 0o600);
    let theirs = file(&dir, "theirs", b"secret-of-another-deployment-32-bytes-at-least", 0o600);
    let open = file(&dir, "open", b"secret-of-this-deployment-32-bytes-at-least", 0o644);
    let short = file(&dir, "short", b"too short", 0o600);
    let refused = |path: &Path| disk_runtime(&dir, RuntimeOptions::default().with_secret_file(path)).unwrap_err();
    for path in [&short, &open, &dir.join("missing")] {
        let e = refused(path);
        assert_eq!(e.status(), Status::InvalidArgument, "{}: {e}", path.display());
    }
    assert!(refused(&open).message().contains("chmod"), "{}", refused(&open));
    assert_eq!(refused(Path::new("")).status(), Status::InvalidArgument, "an empty path is no secret");

    // Stored under our secret; read back with it, without one, and with another's.
    let run = |secret: Option<&Path>, store: bool| -> (u64, bool, u64) {
        let options = RuntimeOptions::default();
        let rt = disk_runtime(&dir, secret.map_or(options.clone(), |s| options.with_secret_file(s))).unwrap();
        let model = rt.model(&spec("sealed")).unwrap();
        if store {
            model.store(NS, &tokens, &KvView::canonical(&reference, DType::F32)).unwrap();
        }
        let (got, same) = retrieve(&model, &tokens, &reference);
        (got, same, rt.tier_stats(0).unwrap().auth_failures)
    };
    assert_eq!(run(Some(&ours), true), (48, true, 0));
    assert_eq!(run(Some(&ours), false), (48, true, 0), "a fresh runtime with the same secret");
    assert_eq!(run(None, false), (48, true, 0), "without a secret, sealed chunks are read as they are");
    let (got, _, failures) = run(Some(&theirs), false);
    assert_eq!(got, 0, "another secret's chunks are misses");
    assert!(failures >= 1, "counted: {failures}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn loads_leave_tiers_slower_than_prefill_to_recompute() {
    let (tokens, reference) = reference_canonical();
    let dir = scratch_dir("slow");
    let zstd = |slower: bool| {
        let options = RuntimeOptions::default().with_chunk_tokens(CHUNK).with_load_slower_than_prefill(slower);
        Runtime::new(&options.with_tier(TierConfig::disk(&dir, 64 << 20).with_codec("zstd"))).unwrap()
    };
    assert!(!RuntimeOptions::default().load_slower_than_prefill);
    {
        let rt = zstd(false);
        let model = rt.model(&spec("slow")).unwrap();
        model.store(NS, &tokens, &KvView::canonical(&reference, DType::F32)).unwrap();
        // No prefill reported yet: loaded, and the tier's delivery measured.
        assert_eq!(retrieve(&model, &tokens, &reference), (48, true));
        let t = rt.tier_stats(0).unwrap();
        assert!(t.delivery_ns_per_token > 0.0, "{t:?}");
        assert_eq!((t.device_delivery_ns_per_token, t.recompute_chunks), (0.0, 0));
        // The engine prefills 100 times faster than the disk delivers.
        let per_token_ns = t.delivery_ns_per_token / 100.0 + 1.0;
        model.report_prefill(1_000_000, Duration::from_nanos((per_token_ns * 1e6) as u64)).unwrap();
        let op = model.load_async(NS, &tokens, vec![0f32; reference.len()], &ViewSpec::canonical(DType::F32)).unwrap();
        let r = op.wait(None).unwrap();
        assert_eq!((r.tokens, r.covered, r.num_failed), (0, 48, 1), "left to recompute: {r:?}");
        assert_eq!(op.failed_ranges().unwrap(), vec![0..48]);
        assert!(op.into_buffer().iter().all(|&x| x == 0.0), "nothing written");
        assert_eq!(rt.stats().unwrap().recompute_tokens, 48);
        assert_eq!(rt.tier_stats(0).unwrap().recompute_chunks, 3);
    }
    // The same directory, loading whatever the rates say.
    let rt = zstd(true);
    let model = rt.model(&spec("slow")).unwrap();
    model.report_prefill(1_000_000, Duration::from_millis(1)).unwrap(); // 1 ns per token
    assert_eq!(retrieve(&model, &tokens, &reference), (48, true));
    assert_eq!(retrieve(&model, &tokens, &reference), (48, true));
    assert_eq!(rt.stats().unwrap().recompute_tokens, 0);
    assert_eq!(rt.tier_stats(0).unwrap().recompute_chunks, 0);
    drop(model);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quality_levels_only_where_kdn_h_takes_them() {
    let with = |tier: TierConfig| {
        Runtime::new(&RuntimeOptions::default().with_tier(TierConfig::host(1 << 20)).with_tier(tier))
    };
    // A remote tier takes them (the node need not answer yet), spaces around a level included.
    let remote = || TierConfig::remote("127.0.0.1:9", "t").with_timeout(Duration::from_millis(100));
    let rt = with(remote().with_levels(["zstd", " kdn:hifi ", "kdn:balanced"])).unwrap();
    assert_eq!(rt.tier_stats(1).unwrap().kind, TierKind::Remote);
    drop(rt);
    // A host or disk tier does not; nor a codec beside them, an empty or unknown level.
    let refused = |tier: TierConfig, why: &str| {
        let e = with(tier).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{why}: {e}");
        e
    };
    let e = refused(TierConfig::host(1 << 20).with_levels(["zstd", "kdn:balanced"]), "host");
    assert!(e.message().contains("levels"), "{e}");
    let dir = scratch_dir("levels");
    refused(TierConfig::disk(&dir, 1 << 20).with_levels(["zstd"]), "disk");
    refused(remote().with_levels(["zstd", "kdn:balanced"]).with_codec("zstd"), "levels and a codec");
    refused(remote().with_levels(["zstd", "", "kdn:balanced"]), "an empty level");
    refused(remote().with_levels(["zstd", "no-such-codec"]), "an unknown codec");
    let e = refused(remote().with_levels(["zstd;kdn:hifi"]), "a ';' inside a level");
    assert!(e.message().contains("';'"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ttft_targets_reach_loads() {
    let (tokens, reference) = reference_canonical();
    let (rt, model) = setup();
    model.store(NS, &tokens, &KvView::canonical(&reference, DType::F32)).unwrap();
    // Tiers without quality levels serve the whole prefix whatever the target.
    let mut out = vec![0f32; reference.len()];
    let request = Request::from(&tokens).with_ttft_target(Duration::from_millis(20));
    assert_eq!(request.ttft_target, Duration::from_millis(20));
    let r = model.retrieve(NS, request, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap();
    assert_eq!((r.tokens, as_bytes(&out) == as_bytes(&reference)), (48, true));
    let op = model.load_async(NS, request, vec![0f32; reference.len()], &ViewSpec::canonical(DType::F32)).unwrap();
    let (r, loaded) = op.finish().unwrap();
    assert_eq!((r.tokens, as_bytes(&loaded) == as_bytes(&reference)), (48, true));
    // The target reaches C: over an hour is a unit mistake there.
    let absurd = Request::from(&tokens).with_ttft_target(Duration::from_secs(3601));
    let e = model.retrieve(NS, absurd, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = model.load_async(NS, absurd, vec![0f32; reference.len()], &ViewSpec::canonical(DType::F32)).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // A plain request has none.
    assert_eq!(LoadRequest::from(&tokens).ttft_target, Duration::ZERO);
    assert_eq!(rt.stats().unwrap().retrieves, 2);
}

/// Stores the reference prompt (3 chunks) in a host tier with room for
/// exactly that, then one more chunk of other tokens: one chunk of the prompt
/// is evicted. What is left of the prompt's cached prefix, and of the other.
fn after_eviction(policy: EvictionPolicy) -> (u64, u64) {
    let (tokens, reference) = reference_canonical();
    let other: Vec<i32> = tokens[..16].iter().map(|t| t + 1).collect();
    // The room three chunks take (whole pages, and their headers).
    let room = {
        let (rt, model) = setup();
        model.store(NS, &tokens, &KvView::canonical(&reference, DType::F32)).unwrap();
        rt.tier_stats(0).unwrap().used_bytes
    };
    let tier = TierConfig::host(room).with_policy(policy).with_watermarks(1.0, 1.0);
    let rt = Runtime::new(&RuntimeOptions::default().with_chunk_tokens(CHUNK).with_tier(tier)).unwrap();
    let model = rt.model(&spec("eviction")).unwrap();
    model.report_prefill(48, Duration::from_micros(480)).unwrap();
    assert_eq!(model.store(NS, &tokens, &KvView::canonical(&reference, DType::F32)).unwrap().tokens, 48);
    assert_eq!(
        model.store(NS, &other, &KvView::canonical(&reference[..LAYERS * 2 * 16 * ROW], DType::F32)).unwrap().tokens,
        16
    );
    assert_eq!(rt.tier_stats(0).unwrap().evictions, 1, "{policy:?}");
    (model.lookup(NS, &tokens).unwrap().cached_tokens, model.lookup(NS, &other).unwrap().cached_tokens)
}

#[test]
fn cost_aware_eviction_drops_a_requests_later_chunks_first() {
    // LRU drops the oldest chunk, the prompt's first: nothing of it is found
    // any more. Cost (1.5) drops its last chunk: 32 tokens are still found.
    assert_eq!(after_eviction(EvictionPolicy::Lru), (0, 16));
    assert_eq!(after_eviction(EvictionPolicy::Cost), (32, 16));
    assert_eq!(EvictionPolicy::from_raw(2), EvictionPolicy::Cost);
}

#[test]
fn the_library_is_this_crates_abi_or_newer() {
    assert_eq!(ABI_VERSION_NUMBER, 10900);
    assert!(version_number() >= ABI_VERSION_NUMBER, "{}", version());
    const { assert!(HEADER_VERSION_NUMBER >= ABI_VERSION_NUMBER) };
}

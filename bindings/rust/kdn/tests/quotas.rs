// SPDX-License-Identifier: Apache-2.0
//! Namespace quotas per tier (C ABI 1.13): `TierConfig::quota` and
//! `Runtime::quota_stats`, as capi.c.quotas checks them through C.

mod common;
use common::*;
use kdn::*;

/// The room one chunk of the fixture model takes in a memory tier: its KV
/// (5 layers, K and V, 16 tokens of 4 heads x 8 f32) in whole 4 KiB pages.
const CHUNK_HELD: u64 = ((LAYERS * 2 * CHUNK as usize * ROW * 4) as u64).div_ceil(4096) * 4096;

/// The namespace hash of "tenant-a", as chunk envelopes record it: SHA-256
/// of "kdn-namespace-v1" and the namespace, each after its length as a u64
/// LE (Python: `sha256(pack("<Q", 16) + b"kdn-namespace-v1" + pack("<Q", 8)
/// + b"tenant-a")`).
const TENANT_A_HASH: &str = "f01d7a6eff0c694ce7e80ec77988c949f83bd802b04e09312f572697a591d4bf";

/// One host tier with room for 20 chunks, full only at its capacity.
fn host_tier() -> TierConfig {
    TierConfig::host(20 * CHUNK_HELD).with_watermarks(1.0, 1.0)
}

fn quota_runtime(tier: TierConfig) -> Result<Runtime> {
    Runtime::new(&RuntimeOptions::default().with_chunk_tokens(CHUNK).with_tier(tier))
}

/// The one-chunk prompt number `i`: distinct for each `i`.
fn prompt(i: i32) -> Vec<i32> {
    let mut t = tokens(CHUNK as usize);
    t[1] = 1000 + i;
    t
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn a_tenant_over_its_quota_evicts_only_its_own_chunks() {
    assert_eq!(CHUNK_HELD, 20_480, "5 whole pages");
    let rt = quota_runtime(host_tier().quota("tenant-a", 4 * CHUNK_HELD)).unwrap();
    let model = rt.model(&spec("quotas")).unwrap();
    let kv = canonical(CHUNK as usize);
    for i in 0..10 {
        for ns in ["tenant-a", "tenant-b"] {
            assert_eq!(model.store(ns, &prompt(i), &KvView::canonical(&kv, DType::F32)).unwrap().tokens, 16);
        }
    }
    for i in 0..10 {
        let a = model.lookup("tenant-a", &prompt(i)).unwrap().cached_tokens;
        assert_eq!(a, if i >= 6 { 16 } else { 0 }, "tenant-a keeps its 4 newest: prompt {i}");
        assert_eq!(model.lookup("tenant-b", &prompt(i)).unwrap().cached_tokens, 16, "none of b's went: prompt {i}");
    }
    let stats = rt.quota_stats(0).unwrap();
    assert_eq!(stats.len(), 1, "one per quota given");
    let a = &stats[0];
    assert_eq!(hex(&a.ns_hash), TENANT_A_HASH);
    assert_eq!((a.quota_bytes, a.used_bytes), (4 * CHUNK_HELD, 4 * CHUNK_HELD));
    assert_eq!((a.objects, a.quota_evictions, a.room_evictions, a.refused), (4, 6, 0, 0));
    let tier = rt.tier_stats(0).unwrap();
    assert_eq!((tier.objects, tier.evictions), (14, 6), "only a's 6 left the tier");

    let e = rt.quota_stats(1).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "one tier only: {e}");
}

#[test]
fn quota_stats_come_in_the_order_given_and_a_tier_without_quotas_has_none() {
    let tier = host_tier().quota("tenant-b", 2 * CHUNK_HELD).quota("tenant-a", 3 * CHUNK_HELD);
    let rt = Runtime::new(
        &RuntimeOptions::default().with_chunk_tokens(CHUNK).with_tier(tier).with_tier(TierConfig::host(1 << 20)),
    )
    .unwrap();
    let stats = rt.quota_stats(0).unwrap();
    let got: Vec<_> = stats.iter().map(|q| q.quota_bytes).collect();
    assert_eq!(got, [2 * CHUNK_HELD, 3 * CHUNK_HELD]);
    assert_eq!(hex(&stats[1].ns_hash), TENANT_A_HASH);
    assert_eq!(stats[0].objects, 0);
    assert!(rt.quota_stats(1).unwrap().is_empty(), "the lower tier has none");
    assert!(runtime().quota_stats(0).unwrap().is_empty());
}

#[test]
fn bad_quotas_are_refused_with_their_reason() {
    let refused = |tier: TierConfig, reason: &str| {
        let e = quota_runtime(tier).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains(reason), "{reason:?} not in {e}");
    };
    refused(host_tier().quota("tenant-a", CHUNK_HELD).quota("tenant-a", 2 * CHUNK_HELD), "two quotas");
    refused(host_tier().quota("tenant-a", CHUNK_HELD).quota("", CHUNK_HELD), "quotas[1]");
    refused(TierConfig::remote("127.0.0.1:1", "t").quota("tenant-a", CHUNK_HELD), "kdnd");
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeQuotaStats;

/**
 * One namespace's quota in a tier, now (kdn_quota_stats, since 1.13; {@link
 * KdnRuntime#quotaStats}), all counts unsigned: {@code namespace} as its {@link
 * TierConfig#withQuota} gave it ("" should kdn report more quotas than were given), {@code
 * namespaceHash} kdn's hash of it as chunk envelopes record it, in 64 lowercase hex digits (SHA-256
 * of "kdn-namespace-v1" and the namespace's UTF-8 bytes, each after its length as a little-endian
 * u64; not the SHA-256 of the namespace alone); {@code quotaBytes}, the quota; {@code usedBytes} and
 * {@code objects}, what of its chunks the tier holds (counted as the tier counts its capacity: a
 * memory tier's whole 4 KiB pages, a disk tier's encoded bytes); {@code quotaEvictions}, its
 * chunks evicted to keep it within its quota (by its own puts); {@code roomEvictions}, its chunks
 * evicted for the tier's room (the tier full of quota'd chunks); {@code refused}, its puts the tier
 * refused (one chunk larger than the quota).
 */
public record QuotaStats(
    String namespace,
    String namespaceHash,
    long quotaBytes,
    long usedBytes,
    long objects,
    long quotaEvictions,
    long roomEvictions,
    long refused) {
  /** Reads {@code q} (owned by the list it came from, which the caller deletes). */
  static QuotaStats from(String namespace, NativeQuotaStats q) {
    return new QuotaStats(namespace, q.getNs_hash(), q.getQuota_bytes(), q.getUsed_bytes(), q.getObjects(),
        q.getQuota_evictions(), q.getRoom_evictions(), q.getRefused());
  }
}

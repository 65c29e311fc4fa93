// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeTierStats;

/**
 * One tier's counters (kdn_tier_stats), all unsigned: its kind, name and codec; hits, puts,
 * evictions, demotions and promotions; what it holds; encoding; I/O and remote calls. Since 1.4
 * the watermarks, fractions of capacity: a put that would cross {@code highWatermark} evicts first,
 * down to {@code lowWatermark}; 0 and 0 for a tier without them (remote, redis).
 *
 * <p>Since 1.7, how fast the tier delivers, measured on the loads it served (read, decode and copy
 * into the memory, per token of KV; a moving average; 0 until measured): {@code
 * deliveryNsPerToken} into host memory, {@code deviceDeliveryNsPerToken} into {@link DeviceMemory};
 * and {@code recomputeChunks}, its chunks loads left to recompute as slower than the engine's
 * prefill ({@link RuntimeOptions.Builder#loadSlowerThanPrefill}). Since 1.8, {@code authFailures}:
 * of {@code corruptDetected}, the chunks whose seal failed ({@link
 * RuntimeOptions.Builder#secretFile}: none, another secret's, or a MAC that does not match).
 */
public record TierStats(
    TierKind kind,
    String name,
    String codec,
    long hits,
    long misses,
    long puts,
    long putRefusals,
    long evictions,
    long demotionsIn,
    long promotionsIn,
    long bytesIn,
    long bytesOut,
    long objects,
    long usedBytes,
    long capacityBytes,
    long corruptDetected,
    long encodedChunks,
    long bytesBeforeEncoding,
    long bytesAfterEncoding,
    long encodeFailures,
    long decodeFailures,
    long ioErrors,
    long remoteCalls,
    long remoteFailedCalls,
    long remoteTimeouts,
    long writeQueueFull,
    long writeQueuedBytes,
    double highWatermark,
    double lowWatermark,
    double deliveryNsPerToken,
    double deviceDeliveryNsPerToken,
    long recomputeChunks,
    long authFailures) {
  static TierStats from(NativeTierStats t) {
    try {
      return new TierStats(TierKind.fromNative(t.getKind()), t.getName(), t.getCodec(), t.getHits(),
          t.getMisses(), t.getPuts(), t.getPut_refusals(), t.getEvictions(), t.getDemotions_in(),
          t.getPromotions_in(), t.getBytes_in(), t.getBytes_out(), t.getObjects(), t.getUsed_bytes(),
          t.getCapacity_bytes(), t.getCorrupt_detected(), t.getEncoded_chunks(),
          t.getBytes_before_encoding(), t.getBytes_after_encoding(), t.getEncode_failures(),
          t.getDecode_failures(), t.getIo_errors(), t.getRemote_calls(), t.getRemote_failed_calls(),
          t.getRemote_timeouts(), t.getWrite_queue_full(), t.getWrite_queued_bytes(), t.getHigh_watermark(),
          t.getLow_watermark(), t.getDelivery_ns_per_token(), t.getDevice_delivery_ns_per_token(),
          t.getRecompute_chunks(), t.getAuth_failures());
    } finally {
      t.delete();
    }
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeStats;

/**
 * A runtime's counters (kdn_stats), all unsigned: calls, hits and misses, tokens and bytes
 * stored and served, what the tiers hold now, evictions, leases, pins, editor activity.
 * {@code edits}: chunks an {@link Editor} rewrote; {@code editedServed}: such chunks served.
 *
 * <p>Since 1.4, time to first token: {@code tokensRequested}, the tokens loads asked for (the hit
 * rate is {@code tokensServed / tokensRequested}); {@code prefillTokens} and {@code prefillNs},
 * the prefills engines reported ({@link Model#reportPrefill}); {@code ttftSavedNs}, the prefill
 * time loads saved (each load's tokens served times its model's mean reported time per token);
 * {@code tokensServedUnpriced}, tokens served while their model had no report (not in {@code
 * ttftSavedNs}); {@code deliveryNs}, the time spent in loads, hits and misses; {@code
 * lookupTokens}, the tokens looked-up requests covered, and {@code lookupHitTokens}, of them the
 * leading tokens found cached ({@link LookupResult#cachedTokens()}).
 *
 * <p>Since 1.7, {@code recomputeTokens}: cached tokens loads left to recompute because their tiers
 * deliver slower than the engine prefills ({@link RuntimeOptions.Builder#loadSlowerThanPrefill}).
 */
public record Stats(
    long lookups,
    long retrieves,
    long stores,
    long hits,
    long misses,
    long tokensServed,
    long tokensStored,
    long bytesServed,
    long bytesStored,
    long chunks,
    long usedBytes,
    long capacityBytes,
    long evictions,
    long editedServed,
    long leasesActive,
    long pinsActive,
    long pinsForcedUnpin,
    long corruptDetected,
    long edits,
    long tokensRequested,
    long prefillTokens,
    long prefillNs,
    long ttftSavedNs,
    long tokensServedUnpriced,
    long deliveryNs,
    long lookupTokens,
    long lookupHitTokens,
    long recomputeTokens) {
  static Stats from(NativeStats s) {
    try {
      return new Stats(s.getLookups(), s.getRetrieves(), s.getStores(), s.getHits(), s.getMisses(),
          s.getTokens_served(), s.getTokens_stored(), s.getBytes_served(), s.getBytes_stored(),
          s.getChunks(), s.getUsed_bytes(), s.getCapacity_bytes(), s.getEvictions(), s.getEdited_served(),
          s.getLeases_active(), s.getPins_active(), s.getPins_forced_unpin(), s.getCorrupt_detected(),
          s.getEdits(), s.getTokens_requested(), s.getPrefill_tokens(), s.getPrefill_ns(), s.getTtft_saved_ns(),
          s.getTokens_served_unpriced(), s.getDelivery_ns(), s.getLookup_tokens(), s.getLookup_hit_tokens(),
          s.getRecompute_tokens());
    } finally {
      s.delete();
    }
  }
}

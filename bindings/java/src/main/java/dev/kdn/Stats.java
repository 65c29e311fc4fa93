package dev.kdn;

import dev.kdn.swig.NativeStats;

/**
 * A runtime's counters (kdn_stats), all unsigned: calls, hits and misses, tokens and bytes
 * stored and served, what the tiers hold now, evictions, leases, pins, editor activity.
 * {@code edits}: chunks an {@link Editor} rewrote; {@code editedServed}: such chunks served.
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
    long edits) {
  static Stats from(NativeStats s) {
    try {
      return new Stats(s.getLookups(), s.getRetrieves(), s.getStores(), s.getHits(), s.getMisses(),
          s.getTokens_served(), s.getTokens_stored(), s.getBytes_served(), s.getBytes_stored(),
          s.getChunks(), s.getUsed_bytes(), s.getCapacity_bytes(), s.getEvictions(), s.getEdited_served(),
          s.getLeases_active(), s.getPins_active(), s.getPins_forced_unpin(), s.getCorrupt_detected(),
          s.getEdits());
    } finally {
      s.delete();
    }
  }
}

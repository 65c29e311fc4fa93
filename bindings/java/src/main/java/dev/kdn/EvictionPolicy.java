// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** How a tier picks what to evict (kdn_eviction_policy). */
public enum EvictionPolicy {
  LRU(0),
  S3FIFO(1),
  /** Cost-aware (GreedyDual-Size-Frequency), since 1.5. */
  COST(2),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final EvictionPolicy[] VALUES = values();
  private final int value;

  EvictionPolicy(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static EvictionPolicy fromNative(int value) {
    for (EvictionPolicy v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

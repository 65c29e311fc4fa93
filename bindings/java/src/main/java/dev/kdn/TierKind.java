// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** A tier's kind (kdn_tier_kind). */
public enum TierKind {
  HOST(0),
  DEVICE(1),
  DISK(2),
  REMOTE(3),
  /** Redis, Redis Cluster or Valkey shared with other engines (since kdn 1.3). */
  REDIS(4),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final TierKind[] VALUES = values();
  private final int value;

  TierKind(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static TierKind fromNative(int value) {
    for (TierKind v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

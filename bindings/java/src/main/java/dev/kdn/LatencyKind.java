// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** Which calls a latency histogram covers (kdn_latency_kind). */
public enum LatencyKind {
  LOOKUP(0),
  LOAD(1),
  STORE(2),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final LatencyKind[] VALUES = values();
  private final int value;

  LatencyKind(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static LatencyKind fromNative(int value) {
    for (LatencyKind v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

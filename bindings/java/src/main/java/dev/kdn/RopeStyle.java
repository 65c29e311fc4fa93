// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** Which pairs of dimensions RoPE rotates (kdn_rope_style). */
public enum RopeStyle {
  INTERLEAVED(0),
  NEOX(1),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final RopeStyle[] VALUES = values();
  private final int value;

  RopeStyle(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static RopeStyle fromNative(int value) {
    for (RopeStyle v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

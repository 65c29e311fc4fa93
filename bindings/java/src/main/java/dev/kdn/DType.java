// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** The element type of a model's KV (kdn_dtype). */
public enum DType {
  F32(0, 4),
  F16(1, 2),
  /** bfloat16: in Java, the high 16 bits of a float ({@code Float.floatToRawIntBits(f) >>> 16}). */
  BF16(2, 2),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1, 0);

  private static final DType[] VALUES = values();
  private final int value;
  private final int bytes;

  DType(int value, int bytes) {
    this.value = value;
    this.bytes = bytes;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** Bytes per element (0 for {@link #UNKNOWN}). */
  public int bytes() {
    return bytes;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static DType fromNative(int value) {
    for (DType v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

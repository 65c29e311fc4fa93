// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** How a view's KV lies within a layer (kdn_kv_layout). */
public enum KvLayout {
  CONTIGUOUS(0),
  PAGED_NHD(1),
  PAGED_HND(2),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final KvLayout[] VALUES = values();
  private final int value;

  KvLayout(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static KvLayout fromNative(int value) {
    for (KvLayout v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

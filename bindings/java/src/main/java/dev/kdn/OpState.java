// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** Where an asynchronous load or save is (kdn_op_state). */
public enum OpState {
  PENDING(0),
  DONE(1),
  FAILED(2),
  CANCELLED(3),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final OpState[] VALUES = values();
  private final int value;

  OpState(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static OpState fromNative(int value) {
    for (OpState v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

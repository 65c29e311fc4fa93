// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * A kdn status (kdn_status): {@link #OK} or why a call failed. Calls that fail throw the
 * {@link KdnException} subclass for their status; a status also appears in the results that carry
 * one per item ({@link KvResult#status()}, {@link LookupResult#status()}).
 */
public enum Status {
  OK(0),
  INVALID_ARGUMENT(-1),
  NOT_FOUND(-2),
  BUSY(-3),
  UNAVAILABLE(-4),
  CORRUPT(-5),
  UNSUPPORTED(-6),
  NO_MEMORY(-7),
  INTERNAL(-8),
  TIMEOUT(-9),
  CANCELLED(-10),
  VERSION(-11),
  BUFFER_TOO_SMALL(-12),
  /** A code this binding does not know (from a newer kdn): see the exception's {@code code()}. */
  UNKNOWN(Integer.MIN_VALUE);

  private static final Status[] VALUES = values();
  private final int code;

  Status(int code) {
    this.code = code;
  }

  /** The value in kdn.h (0 or negative). */
  public int code() {
    return code;
  }

  /** The constant for a code of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static Status fromNative(int code) {
    for (Status s : VALUES) {
      if (s.code == code && s != UNKNOWN) return s;
    }
    return UNKNOWN;
  }
}

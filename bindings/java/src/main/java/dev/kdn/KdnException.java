// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import java.nio.charset.StandardCharsets;

/**
 * A kdn call failed: its {@link #status()} and kdn's message. Each status has its own subclass,
 * under two family bases: {@link CallerException} (the call itself was wrong: fix it) and
 * {@link RetryableException} (the same call may succeed later). A code this binding does not know
 * is a plain {@code KdnException} with status {@link Status#UNKNOWN} and the code in
 * {@link #code()}.
 *
 * <p>Not every failure is a {@code KdnException}: a closed handle is an {@link
 * IllegalStateException}, a null argument a {@link NullPointerException}, and a buffer kdn cannot use
 * (a heap or read-only {@code ByteBuffer}) an {@link IllegalArgumentException}, all before kdn is
 * called.
 */
public class KdnException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final int code;

  public KdnException(int code, String message) {
    super(message);
    this.code = code;
  }

  /** The status, {@link Status#UNKNOWN} for a code this binding does not know. */
  public Status status() {
    return Status.fromNative(code);
  }

  /** The status's value in kdn.h (negative). */
  public int code() {
    return code;
  }

  /** The exception for a status (used by the JNI layer; {@code message} is UTF-8). */
  static KdnException fromNative(int code, byte[] message, long needed) {
    KdnException e = of(code, new String(message, StandardCharsets.UTF_8), needed);
    // The trace starts at the native call, not here.
    StackTraceElement[] trace = e.getStackTrace();
    int skip = 0;
    while (skip < trace.length && trace[skip].getClassName().equals(KdnException.class.getName())) ++skip;
    e.setStackTrace(java.util.Arrays.copyOfRange(trace, skip, trace.length));
    return e;
  }

  /** The exception for a status; {@code needed} matters only for {@link Status#BUFFER_TOO_SMALL}. */
  public static KdnException of(int code, String message, long needed) {
    switch (Status.fromNative(code)) {
      case INVALID_ARGUMENT: return new InvalidArgumentException(message);
      case VERSION: return new VersionException(message);
      case BUFFER_TOO_SMALL: return new BufferTooSmallException(message, needed);
      case BUSY: return new BusyException(message);
      case UNAVAILABLE: return new UnavailableException(message);
      case TIMEOUT: return new KdnTimeoutException(message);
      case NOT_FOUND: return new NotFoundException(message);
      case CORRUPT: return new CorruptException(message);
      case UNSUPPORTED: return new UnsupportedException(message);
      case NO_MEMORY: return new NoMemoryException(message);
      case INTERNAL: return new InternalException(message);
      case CANCELLED: return new KdnCancelledException(message);
      default: return new KdnException(code, message);
    }
  }
}

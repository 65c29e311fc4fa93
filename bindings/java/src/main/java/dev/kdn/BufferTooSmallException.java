// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * KDN_ERR_BUFFER_TOO_SMALL: the caller's room was smaller than the result (a knowledge fetch);
 * {@link #needed()} says how much is needed, in tokens.
 */
public class BufferTooSmallException extends CallerException {
  private static final long serialVersionUID = 1L;
  private final long needed;

  public BufferTooSmallException(String message, long needed) {
    super(Status.BUFFER_TOO_SMALL.code(), message);
    this.needed = needed;
  }

  /** The room needed, in tokens (the document's length). */
  public long needed() {
    return needed;
  }
}

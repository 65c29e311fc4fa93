// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** The same call may succeed later (kdn was busy, a remote tier was unreachable or slow). */
public abstract class RetryableException extends KdnException {
  private static final long serialVersionUID = 1L;

  protected RetryableException(int code, String message) {
    super(code, message);
  }
}

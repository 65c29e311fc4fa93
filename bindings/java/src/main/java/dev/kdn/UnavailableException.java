// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_UNAVAILABLE: a remote tier or device cannot be reached now. */
public class UnavailableException extends RetryableException {
  private static final long serialVersionUID = 1L;

  public UnavailableException(String message) {
    super(Status.UNAVAILABLE.code(), message);
  }
}

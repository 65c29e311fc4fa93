// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_TIMEOUT: the time ran out (a remote call). */
public class TimeoutException extends RetryableException {
  private static final long serialVersionUID = 1L;

  public TimeoutException(String message) {
    super(Status.TIMEOUT.code(), message);
  }
}

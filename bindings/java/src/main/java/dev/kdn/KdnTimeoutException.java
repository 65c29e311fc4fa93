// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * KDN_ERR_TIMEOUT: the time ran out (a remote call). Prefixed: {@code import java.util.concurrent.*;}
 * brings {@link java.util.concurrent.TimeoutException} too.
 */
public class KdnTimeoutException extends RetryableException {
  private static final long serialVersionUID = 1L;

  public KdnTimeoutException(String message) {
    super(Status.TIMEOUT.code(), message);
  }
}

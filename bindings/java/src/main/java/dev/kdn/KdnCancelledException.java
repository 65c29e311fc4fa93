// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * KDN_ERR_CANCELLED: the operation was cancelled. Prefixed, like {@link KdnTimeoutException}: not to
 * be mistaken for {@link java.util.concurrent.CancellationException}.
 */
public class KdnCancelledException extends KdnException {
  private static final long serialVersionUID = 1L;

  public KdnCancelledException(String message) {
    super(Status.CANCELLED.code(), message);
  }
}

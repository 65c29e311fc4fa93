// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_CANCELLED: the operation was cancelled. */
public class CancelledException extends KdnException {
  private static final long serialVersionUID = 1L;

  public CancelledException(String message) {
    super(Status.CANCELLED.code(), message);
  }
}

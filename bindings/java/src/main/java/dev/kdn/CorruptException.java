// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_CORRUPT: stored data failed a check. */
public class CorruptException extends KdnException {
  private static final long serialVersionUID = 1L;

  public CorruptException(String message) {
    super(Status.CORRUPT.code(), message);
  }
}

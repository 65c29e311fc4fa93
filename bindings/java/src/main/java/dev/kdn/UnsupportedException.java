// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_UNSUPPORTED: not supported by this build or on this machine. */
public class UnsupportedException extends KdnException {
  private static final long serialVersionUID = 1L;

  public UnsupportedException(String message) {
    super(Status.UNSUPPORTED.code(), message);
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_BUSY: no room now (a full index or queue); retry later. */
public class BusyException extends RetryableException {
  private static final long serialVersionUID = 1L;

  public BusyException(String message) {
    super(Status.BUSY.code(), message);
  }
}

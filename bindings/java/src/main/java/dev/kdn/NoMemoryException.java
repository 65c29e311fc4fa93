// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_NO_MEMORY: kdn could not allocate. */
public class NoMemoryException extends KdnException {
  private static final long serialVersionUID = 1L;

  public NoMemoryException(String message) {
    super(Status.NO_MEMORY.code(), message);
  }
}

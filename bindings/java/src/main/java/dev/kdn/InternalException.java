// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_INTERNAL: a bug in kdn (or a callback that threw). */
public class InternalException extends KdnException {
  private static final long serialVersionUID = 1L;

  public InternalException(String message) {
    super(Status.INTERNAL.code(), message);
  }
}

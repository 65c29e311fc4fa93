// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_INVALID_ARGUMENT: a bad value (a size, a dtype, a name, a view that does not fit its buffer). */
public class InvalidArgumentException extends CallerException {
  private static final long serialVersionUID = 1L;

  public InvalidArgumentException(String message) {
    super(Status.INVALID_ARGUMENT.code(), message);
  }
}

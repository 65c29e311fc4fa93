// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** The call was wrong (an argument, a struct version, a buffer's size): retrying it unchanged fails again. */
public abstract class CallerException extends KdnException {
  private static final long serialVersionUID = 1L;

  protected CallerException(int code, String message) {
    super(code, message);
  }
}

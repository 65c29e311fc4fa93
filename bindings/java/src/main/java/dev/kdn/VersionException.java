// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_VERSION: a struct or feature this library does not know. */
public class VersionException extends CallerException {
  private static final long serialVersionUID = 1L;

  public VersionException(String message) {
    super(Status.VERSION.code(), message);
  }
}

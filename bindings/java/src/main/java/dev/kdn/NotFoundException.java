// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** KDN_ERR_NOT_FOUND: no such named object (a document). A KV miss is never this: it is 0 tokens. */
public class NotFoundException extends KdnException {
  private static final long serialVersionUID = 1L;

  public NotFoundException(String message) {
    super(Status.NOT_FOUND.code(), message);
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** A fetched knowledge item: the outcome and the document's tokens. */
public record FetchResult(KvResult result, int[] tokens) {
  public FetchResult {
    tokens = tokens.clone();
  }

  @Override
  public int[] tokens() {
    return tokens.clone();
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof FetchResult r && r.result.equals(result) && java.util.Arrays.equals(r.tokens, tokens);
  }

  @Override
  public int hashCode() {
    return 31 * result.hashCode() + java.util.Arrays.hashCode(tokens);
  }

  @Override
  public String toString() {
    return "FetchResult[" + result + ", " + tokens.length + " tokens]";
  }
}

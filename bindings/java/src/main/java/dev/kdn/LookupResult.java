// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * A lookup's answer (kdn_lookup_result): {@code cachedTokens}, the leading tokens of the request
 * kdn holds (in whole chunks), and per tier the leading tokens that tier alone holds. In a batched
 * lookup a bad request fails alone, in its own {@code status}.
 */
public record LookupResult(Status status, long cachedTokens, long[] tierTokens) {
  public LookupResult {
    tierTokens = tierTokens.clone();
  }

  @Override
  public long[] tierTokens() {
    return tierTokens.clone();
  }

  /** The leading tokens tier {@code tier} alone holds (0 for a tier it does not know). */
  public long tierTokens(int tier) {
    return tier >= 0 && tier < tierTokens.length ? tierTokens[tier] : 0;
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof LookupResult r && r.status == status && r.cachedTokens == cachedTokens
        && java.util.Arrays.equals(r.tierTokens, tierTokens);
  }

  @Override
  public int hashCode() {
    return java.util.Objects.hash(status, cachedTokens, java.util.Arrays.hashCode(tierTokens));
  }

  @Override
  public String toString() {
    return "LookupResult[status=" + status + ", cachedTokens=" + cachedTokens + ", tierTokens="
        + java.util.Arrays.toString(tierTokens) + "]";
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * The outcome of a store, retrieve, fetch or op (kdn_kv_result). {@code tokens}: the tokens
 * stored or loaded (0 on a miss, which is not an error); {@code covered}: the tokens the cache
 * covered; {@code numFailed}: tokens a load could not serve (see {@link Op#failedRanges()}).
 * Counts are unsigned.
 */
public record KvResult(OpState state, Status status, long tokens, long covered, long numFailed, int flags) {
  /** KDN_RESULT_LOSSY: some of the KV came through a lossy codec. */
  public static final int LOSSY = 0x1;

  public boolean lossy() {
    return (flags & LOSSY) != 0;
  }
}

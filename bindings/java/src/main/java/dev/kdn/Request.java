// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeRequest;
import java.time.Duration;
import java.time.temporal.ChronoUnit;
import java.util.Objects;

/**
 * The tokens of a KV call: token ids, or the engine's chained block hashes (kdn_request).
 * Immutable; the ids are copied in once, so one request serves any number of calls, from any
 * thread. Its native copy is freed by a {@link java.lang.ref.Cleaner} when the request is
 * unreachable (it holds memory only, like a direct buffer).
 *
 * <p>A request may carry a TTFT target ({@link #withTtftTarget}, since 1.6), which retrieves and
 * loads use.
 */
public final class Request {
  final NativeRequest handle;
  private final long size;
  private final boolean usesHashes;
  private final long ttftTargetUs;

  private Request(NativeRequest handle) {
    this.handle = handle;
    this.size = handle.size();
    this.usesHashes = handle.uses_hashes();
    this.ttftTargetUs = handle.ttft_target_us();
    Natives.CLEANER.register(this, handle::delete);
  }

  /** A request of token ids (copied). A negative id is refused by the call that uses it. */
  public static Request ofTokens(int... tokens) {
    Objects.requireNonNull(tokens, "tokens");
    NativeRequest r = new NativeRequest();
    try {
      r.set_tokens(tokens);
    } catch (RuntimeException e) {
      r.delete();
      throw e;
    }
    return new Request(r);
  }

  /** A request of the ids {@code tokens[from, to)} (copied). */
  public static Request ofTokens(int[] tokens, int from, int to) {
    Objects.requireNonNull(tokens, "tokens");
    Objects.checkFromToIndex(from, to, tokens.length);
    return ofTokens(java.util.Arrays.copyOfRange(tokens, from, to));
  }

  /**
   * A request of the engine's chained block hashes: {@code hashes} holds whole hashes of {@code
   * hashBytes} bytes each, one per block of {@code blockTokens} tokens (vLLM's and SGLang's prefix
   * hashes).
   */
  public static Request ofBlockHashes(byte[] hashes, int hashBytes, int blockTokens) {
    Objects.requireNonNull(hashes, "hashes");
    NativeRequest r = new NativeRequest();
    try {
      r.set_block_hashes(hashes, Integer.toUnsignedLong(hashBytes), Integer.toUnsignedLong(blockTokens));
    } catch (RuntimeException e) {
      r.delete();
      throw e;
    }
    return new Request(r);
  }

  /**
   * The same tokens with a TTFT target (since 1.6): the time from a {@link Model#retrieve} or {@link
   * Model#loadAsync} call within which the cached prefix's KV should be in place, the part of the
   * time to first token kdn answers for. Remote and redis tiers with quality levels ({@link
   * TierConfig#withLevels}) choose each chunk's level by it, and leave a chunk to recompute when
   * none arrives in time. Rounded up to whole microseconds; {@link Duration#ZERO}: none (the finest
   * level). Other calls ignore it.
   *
   * @throws IllegalArgumentException if {@code target} is negative
   */
  public Request withTtftTarget(Duration target) {
    if (Objects.requireNonNull(target, "target").isNegative()) {
      throw new IllegalArgumentException("a negative TTFT target: " + target);
    }
    long seconds = target.getSeconds();
    long micros = seconds > (Long.MAX_VALUE - 1_000_000) / 1_000_000 ? Long.MAX_VALUE
        : seconds * 1_000_000 + (target.getNano() + 999) / 1000;
    try {
      return new Request(handle.with_ttft_target_us(micros)); // the tokens copied too
    } finally {
      Natives.fence(this);
    }
  }

  /** The TTFT target ({@link Duration#ZERO}: none). */
  public Duration ttftTarget() {
    return Duration.of(ttftTargetUs, ChronoUnit.MICROS);
  }

  /** Tokens, or blocks for a request of block hashes. */
  public long size() {
    return size;
  }

  public boolean usesHashes() {
    return usesHashes;
  }

  @Override
  public String toString() {
    return "Request[" + size + (usesHashes ? " blocks" : " tokens")
        + (ttftTargetUs == 0 ? "" : ", TTFT target " + ttftTargetUs + " us") + "]";
  }
}

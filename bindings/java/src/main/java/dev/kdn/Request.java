// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeRequest;
import java.nio.charset.StandardCharsets;
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
 * loads use, and a salt ({@link #withSalt}, since 1.13), which every KV call of it uses.
 */
public final class Request {
  /** The longest salt kdn takes, in bytes ({@link #withSalt}). */
  public static final int MAX_SALT_BYTES = 4096;

  /** The libkdn version number that first takes a salt (1.13.0). */
  static final int SALT_VERSION = 11300;

  private static final byte[] NO_SALT = new byte[0];

  final NativeRequest handle;
  private final long size;
  private final boolean usesHashes;
  private final long ttftTargetUs;
  private final byte[] salt; // the native request's, never handed out

  private Request(NativeRequest handle, byte[] salt) {
    this.handle = handle;
    this.size = handle.size();
    this.usesHashes = handle.uses_hashes();
    this.ttftTargetUs = handle.ttft_target_us();
    this.salt = salt;
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
    return new Request(r, NO_SALT);
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
    return new Request(r, NO_SALT);
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
      return new Request(handle.with_ttft_target_us(micros), salt); // the tokens and salt copied too
    } finally {
      Natives.fence(this);
    }
  }

  /**
   * The same tokens with a salt (since 1.13; copied): it enters every chunk key of the request, as
   * vLLM's {@code cache_salt} enters its prefix hashes. A salted request hits only KV stored with
   * the same salt, and unsalted KV never answers it (nor it an unsalted one), so one user's cached
   * prefix gives another no hit and no timing signal. {@link Model#lookup}, {@link Model#store},
   * {@link Model#retrieve}, {@link Model#loadAsync} and {@link Model#saveAsync} use it; {@link
   * Model#knowledgePut} and {@link Model#match} ignore it (knowledge items are per namespace). kdn
   * hashes the salt into the keys and never stores it. An empty salt is none.
   *
   * @throws InvalidArgumentException if {@code salt} is longer than {@value #MAX_SALT_BYTES} bytes
   * @throws VersionException if the loaded libkdn is older than 1.13 (it would ignore the salt)
   */
  public Request withSalt(byte[] salt) {
    byte[] copy = Objects.requireNonNull(salt, "salt").clone();
    if (copy.length > MAX_SALT_BYTES) {
      throw new InvalidArgumentException("a salt of " + copy.length + " bytes; kdn takes at most " + MAX_SALT_BYTES);
    }
    if (copy.length != 0) checkSaltSupported(Kdn.versionNumber());
    NativeRequest r = handle.with_ttft_target_us(ttftTargetUs); // a copy: the tokens and the target
    try {
      r.set_salt(copy);
    } catch (RuntimeException e) {
      r.delete();
      throw e;
    } finally {
      Natives.fence(this);
    }
    return new Request(r, copy.length == 0 ? NO_SALT : copy);
  }

  /**
   * {@link #withSalt(byte[])} with the UTF-8 bytes of {@code salt} (vLLM's {@code cache_salt} is a
   * string); the same bytes from any language give the same keys.
   */
  public Request withSalt(String salt) {
    return withSalt(Objects.requireNonNull(salt, "salt").getBytes(StandardCharsets.UTF_8));
  }

  /** The salt (a copy; empty: none). */
  public byte[] salt() {
    return salt.clone();
  }

  /** Whether the request carries a salt. */
  public boolean hasSalt() {
    return salt.length != 0;
  }

  /**
   * Throws {@link VersionException} unless a library of version {@code number} (MAJOR * 10000 +
   * MINOR * 100 + PATCH) takes a salt: an older 1.x reads kdn_request only up to the fields it
   * knows, and would answer a salted request with unsalted KV.
   */
  static void checkSaltSupported(int number) {
    if (number >= SALT_VERSION) return;
    throw new VersionException("libkdn " + number / 10000 + "." + number / 100 % 100 + "." + number % 100
        + " does not take a request's salt (since 1.13); it would ignore it");
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
        + (ttftTargetUs == 0 ? "" : ", TTFT target " + ttftTargetUs + " us")
        + (salt.length == 0 ? "" : ", salted") + "]"; // never the salt itself
  }
}

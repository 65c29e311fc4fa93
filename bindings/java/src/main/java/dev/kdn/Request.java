// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeRequest;
import java.util.Objects;

/**
 * The tokens of a KV call: token ids, or the engine's chained block hashes (kdn_request).
 * Immutable; the ids are copied in once, so one request serves any number of calls, from any
 * thread. Its native copy is freed by a {@link java.lang.ref.Cleaner} when the request is
 * unreachable (it holds memory only, like a direct buffer).
 */
public final class Request {
  final NativeRequest handle;
  private final long size;
  private final boolean usesHashes;

  private Request(NativeRequest handle) {
    this.handle = handle;
    this.size = handle.size();
    this.usesHashes = handle.uses_hashes();
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

  /** Tokens, or blocks for a request of block hashes. */
  public long size() {
    return size;
  }

  public boolean usesHashes() {
    return usesHashes;
  }

  @Override
  public String toString() {
    return "Request[" + size + (usesHashes ? " blocks]" : " tokens]");
  }
}

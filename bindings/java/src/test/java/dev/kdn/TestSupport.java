// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static org.junit.jupiter.api.Assertions.fail;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.util.function.BooleanSupplier;

/** A small model and helpers shared by the tests. */
final class TestSupport {
  private TestSupport() {}

  static final int LAYERS = 2;
  static final int HEADS = 2;
  static final int HEAD_DIM = 4;
  static final int CHUNK = 4;
  /** f32: 2 layers x K,V x 2 heads x 4 dims x 4 bytes. */
  static final int BYTES_PER_TOKEN = 2 * LAYERS * HEADS * HEAD_DIM * 4;

  static ModelSpec spec() {
    return ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).dtype(DType.F32)
        .fingerprint("java-test").build();
  }

  static RuntimeOptions options() {
    return RuntimeOptions.builder().chunkTokens(CHUNK).tier(TierConfig.host(4 << 20)).build();
  }

  static int[] tokens(int n, int first) {
    int[] t = new int[n];
    for (int i = 0; i < n; ++i) t[i] = first + i;
    return t;
  }

  /** A canonical buffer of {@code tokens} tokens, element i = seed + i. */
  static ByteBuffer kv(int tokens, float seed) {
    ByteBuffer b = Kdn.allocate(tokens * BYTES_PER_TOKEN);
    FloatBuffer f = b.asFloatBuffer();
    for (int i = 0; i < f.capacity(); ++i) f.put(i, seed + i);
    return b;
  }

  static void waitUntil(String what, BooleanSupplier condition) {
    long deadline = System.nanoTime() + 10_000_000_000L;
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() > deadline) fail("timed out waiting for " + what);
      try {
        Thread.sleep(5);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        fail("interrupted");
      }
    }
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
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

  /**
   * The reference model's KV (stories260K: 5 layers, 4 KV heads of 8 dims, f32) for 48 positions
   * of a prompt, as the examples use it: what {@code kdn generate --dump-kv PREFIX} wrote (the
   * examples.kv ctest), PREFIX.k.f32 and PREFIX.v.f32 ([layer][position][head][dim]) and
   * PREFIX.tokens.i32. The ctest passes PREFIX as the system property kdn.test.kv.
   */
  record ReferenceKv(byte[] k, byte[] v, int[] tokens) {
    static final int LAYERS = 5;
    static final int HEADS = 4;
    static final int HEAD_DIM = 8;
    static final int POSITIONS = 48;
    static final int TOKEN_ELEMS = HEADS * HEAD_DIM;
    static final int LAYER_ELEMS = POSITIONS * TOKEN_ELEMS;
    static final int FILE_ELEMS = LAYERS * LAYER_ELEMS;
    /** K and V, all layers and positions. */
    static final int BYTES = 2 * FILE_ELEMS * 4;

    static ReferenceKv load() {
      String prefix = System.getProperty("kdn.test.kv");
      if (prefix == null || prefix.isEmpty()) {
        fail("-Dkdn.test.kv=PREFIX names the reference KV files (ctest's bindings.java.junit passes the examples')");
      }
      try {
        byte[] k = Files.readAllBytes(Path.of(prefix + ".k.f32"));
        byte[] v = Files.readAllBytes(Path.of(prefix + ".v.f32"));
        byte[] t = Files.readAllBytes(Path.of(prefix + ".tokens.i32"));
        if (k.length != 4 * FILE_ELEMS || v.length != 4 * FILE_ELEMS || t.length != 4 * POSITIONS) {
          fail("the reference KV files are not 48 positions of stories260K: " + prefix);
        }
        int[] tokens = new int[POSITIONS];
        ByteBuffer.wrap(t).order(ByteOrder.LITTLE_ENDIAN).asIntBuffer().get(tokens);
        return new ReferenceKv(k, v, tokens);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    static ModelSpec spec() {
      return ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).dtype(DType.F32)
          .fingerprint("stories260K").build();
    }

    /** The engine's layout, as the files lie: every layer's K, then every layer's V. */
    static KvView engineView() {
      return KvView.contiguous().strideLayer(LAYER_ELEMS).strideKv(FILE_ELEMS).strides(TOKEN_ELEMS, HEAD_DIM, 1)
          .build();
    }

    /** A direct buffer holding the K file, then the V file (for {@link #engineView()}). */
    ByteBuffer engine() {
      return Kdn.allocate(BYTES).put(k).put(v).clear();
    }

    /** The canonical layout [layer][k|v][position][head][dim] of the first {@code positions}. */
    ByteBuffer canonical(int positions) {
      return canonical(0, positions);
    }

    /** The canonical layout of positions [from, to). */
    ByteBuffer canonical(int from, int to) {
      int tokenBytes = TOKEN_ELEMS * 4;
      int layerBytes = POSITIONS * tokenBytes;
      int bytes = (to - from) * tokenBytes;
      ByteBuffer b = Kdn.allocate(2 * LAYERS * bytes);
      for (int l = 0; l < LAYERS; ++l) {
        b.put(k, l * layerBytes + from * tokenBytes, bytes);
        b.put(v, l * layerBytes + from * tokenBytes, bytes);
      }
      return b.clear();
    }
  }
}

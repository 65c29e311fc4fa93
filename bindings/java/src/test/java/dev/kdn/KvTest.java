// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class KvTest {
  private KdnRuntime rt;
  private Model m;

  @BeforeEach
  void open() {
    rt = KdnRuntime.create(options());
    m = rt.createModel(spec());
  }

  @AfterEach
  void close() {
    m.close();
    rt.close();
  }

  @Test
  void testStoreRetrieveCanonical() {
    Request req = Request.ofTokens(tokens(10, 7));
    ByteBuffer in = kv(10, 3);
    KvResult stored = m.store("ns", req, in);
    assertEquals(10, stored.tokens());
    ByteBuffer out = Kdn.allocate(10 * BYTES_PER_TOKEN);
    KvResult got = m.retrieve("ns", req, out);
    assertEquals(OpState.DONE, got.state());
    assertEquals(Status.OK, got.status());
    assertFalse(got.lossy());
    assertEquals(10, got.tokens());
    assertEquals(in, out);
    // A lookup counts whole chunks only (the first 8 tokens, of 10).
    assertEquals(8, m.lookup("ns", Request.ofTokens(tokens(9, 7))).cachedTokens());
  }

  // A latent (MLA) model: one vector per token and layer, [layer][token][latent] in the canonical
  // layout; stored and retrieved bit for bit, apart from a K/V model of the same bytes.
  @Test
  void testLatentModel() {
    ModelSpec latent = ModelSpec.builder().layers(3).latent(8, 2).fingerprint("java-mla").build();
    assertEquals(CacheKind.LATENT, latent.cacheKind());
    assertEquals(3L * 8 * 4, latent.kvBytesPerToken());
    ModelSpec sameBytes = ModelSpec.builder().layers(3).kvHeads(1).headDim(4).fingerprint("java-mla").build();
    try (Model lm = rt.createModel(latent); Model kv = rt.createModel(sameBytes)) {
      assertEquals(3L * 8 * 4, lm.kvBytesPerToken());
      Request req = Request.ofTokens(tokens(8, 40));
      ByteBuffer in = Kdn.allocate(8 * 3 * 8 * 4);
      for (int i = 0; i < 8 * 3 * 8; ++i) in.putFloat(i * 4, i * 0.5f);
      assertEquals(8, lm.store("ns", req, in).tokens());
      ByteBuffer out = Kdn.allocate(8 * 3 * 8 * 4);
      assertEquals(8, lm.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      assertEquals(0, kv.lookup("ns", req).cachedTokens());
    }
    ModelSpec odd = ModelSpec.builder().layers(3).latent(7, 2).fingerprint("x").build();
    assertThrows(InvalidArgumentException.class, () -> rt.createModel(odd));
  }

  // A sliding-window layer (since 1.12): loaded only where its last tokens need it; the full
  // layer whole; the model's identity is not the same model's without the window.
  @Test
  void testSlidingWindowModel() {
    ModelSpec sliding = ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).layerWindows(2, 0)
        .fingerprint("java-sliding").build();
    ModelSpec plain = ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM)
        .fingerprint("java-sliding").build();
    assertArrayEquals(new int[] {2, 0}, sliding.layerWindows());
    try (Model sm = rt.createModel(sliding); Model pm = rt.createModel(plain)) {
      Request req = Request.ofTokens(tokens(12, 90));
      ByteBuffer in = kv(12, 5);
      assertEquals(12, sm.store("ns", req, in).tokens());
      assertEquals(12, sm.lookup("ns", req).cachedTokens());
      assertEquals(0, pm.lookup("ns", req).cachedTokens());
      ByteBuffer out = Kdn.allocate(12 * BYTES_PER_TOKEN);
      assertEquals(12, sm.retrieve("ns", req, out).tokens());
      // Canonical [layer][k|v][token][head][dim]: layer 0 (window 2) gets its window, tokens 10
      // and 11, only (nothing older is read or written); layer 1, every token.
      int row = HEADS * HEAD_DIM;
      for (int l = 0; l < LAYERS; ++l) {
        for (int kvi = 0; kvi < 2; ++kvi) {
          for (int t = 0; t < 12; ++t) {
            int at = (((l * 2 + kvi) * 12) + t) * row * 4;
            float want = (l == 0 && t < 10) ? 0.0f : in.getFloat(at);
            assertEquals(want, out.getFloat(at), "layer " + l + " kv " + kvi + " token " + t);
          }
        }
      }
    }
    ModelSpec badState = ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).stateLayers(1, 6)
        .fingerprint("x").build();
    assertThrows(InvalidArgumentException.class, () -> rt.createModel(badState));
  }

  // A model with recurrent layers (since 1.12): their states travel with each call, and a prefix
  // counts only where the state at its end was stored. Chunks of 16 tokens.
  private static final int STATE_BYTES = 12;

  /** Canonical KV of the first {@code n} tokens of one sequence: a token's values do not depend on n. */
  private static ByteBuffer recurrentKv(int n) {
    ByteBuffer b = Kdn.allocate(n * BYTES_PER_TOKEN);
    int row = HEADS * HEAD_DIM;
    for (int l = 0; l < LAYERS; ++l) {
      for (int kvi = 0; kvi < 2; ++kvi) {
        for (int t = 0; t < n; ++t) {
          for (int e = 0; e < row; ++e) {
            b.putFloat(((((l * 2 + kvi) * n) + t) * row + e) * 4, l * 100000 + kvi * 10000 + t * 100 + e + 0.5f);
          }
        }
      }
    }
    return b;
  }

  private static ByteBuffer state(int first) {
    ByteBuffer b = Kdn.allocate(STATE_BYTES);
    for (int i = 0; i < STATE_BYTES; ++i) b.put(i, (byte) (first + i));
    return b;
  }

  private static List<ByteBuffer> emptyStates() {
    return List.of(Kdn.allocate(STATE_BYTES), Kdn.allocate(STATE_BYTES));
  }

  @Test
  void testRecurrentModel() {
    ModelSpec spec = ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).stateLayers(2, STATE_BYTES)
        .fingerprint("java-recurrent").build();
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(16).tier(TierConfig.host(4 << 20)).build();
    try (KdnRuntime r16 = KdnRuntime.create(options); Model rm = r16.createModel(spec)) {
      KvView view = KvView.canonical();
      List<ByteBuffer> at16 = List.of(state(1), state(50));
      List<ByteBuffer> at32 = List.of(state(100), state(150));
      assertEquals(16, rm.store("ns", Request.ofTokens(tokens(16, 0)), view, recurrentKv(16), at16).tokens());
      assertEquals(32, rm.store("ns", Request.ofTokens(tokens(32, 0)), view, recurrentKv(32), at32).tokens());
      // A request of 40 tokens sharing both: the snapshot at 32 is the last within it.
      Request req = Request.ofTokens(tokens(40, 0));
      assertEquals(32, rm.lookup("ns", req).cachedTokens());
      assertEquals(16, rm.lookup("ns", Request.ofTokens(tokens(24, 0))).cachedTokens());

      ByteBuffer out = Kdn.allocate(40 * BYTES_PER_TOKEN);
      for (int i = 0; i < 40 * BYTES_PER_TOKEN / 4; ++i) out.putFloat(i * 4, -1.0f);
      List<ByteBuffer> got = emptyStates();
      KvResult r = rm.retrieve("ns", req, view, out, got);
      assertEquals(32, r.tokens());
      assertEquals(at32, got); // bit for bit
      ByteBuffer want = recurrentKv(40);
      int row = HEADS * HEAD_DIM;
      for (int l = 0; l < LAYERS; ++l) {
        for (int kvi = 0; kvi < 2; ++kvi) {
          for (int t = 0; t < 40; ++t) {
            for (int e = 0; e < row; ++e) {
              int at = ((((l * 2 + kvi) * 40) + t) * row + e) * 4;
              // Bit for bit up to 32; nothing written past the prefix.
              assertEquals(t < 32 ? Float.floatToRawIntBits(want.getFloat(at)) : Float.floatToRawIntBits(-1.0f),
                  Float.floatToRawIntBits(out.getFloat(at)), "layer " + l + " kv " + kvi + " token " + t);
            }
          }
        }
      }
      List<ByteBuffer> got16 = emptyStates();
      assertEquals(16, rm.retrieve("ns", Request.ofTokens(tokens(24, 0)), view, Kdn.allocate(24 * BYTES_PER_TOKEN),
          got16).tokens());
      assertEquals(at16, got16);

      // KV stored without its state: no hit, and nothing written.
      Request bare = Request.ofTokens(tokens(32, 500));
      rm.store("ns", bare, view, recurrentKv(32));
      assertEquals(0, rm.lookup("ns", bare).cachedTokens());
      List<ByteBuffer> none = emptyStates();
      assertEquals(0, rm.retrieve("ns", bare, view, Kdn.allocate(32 * BYTES_PER_TOKEN), none).tokens());
      assertEquals(emptyStates(), none);

      // A retrieve or load of such a model needs the states (kdn's refusal).
      ByteBuffer out16 = Kdn.allocate(16 * BYTES_PER_TOKEN);
      Request req16 = Request.ofTokens(tokens(16, 0));
      assertThrows(InvalidArgumentException.class, () -> rm.retrieve("ns", req16, view, out16));
      assertThrows(InvalidArgumentException.class, () -> rm.loadAsync("ns", req16, view, out16));
      // A state shorter than stateBytes, for every call; one state per recurrent layer.
      List<ByteBuffer> shortState = List.of(Kdn.allocate(8), Kdn.allocate(STATE_BYTES));
      for (Runnable call : List.<Runnable>of(
          () -> rm.retrieve("ns", req16, view, out16, shortState),
          () -> rm.store("ns", req16, view, recurrentKv(16), shortState),
          () -> rm.loadAsync("ns", req16, view, out16, shortState),
          () -> rm.saveAsync("ns", req16, view, recurrentKv(16), shortState))) {
        InvalidArgumentException e = assertThrows(InvalidArgumentException.class, call::run);
        assertTrue(e.getMessage().contains("recurrent state 0 is 8 bytes, shorter than the model's state_bytes (12)"),
            e.getMessage());
      }
      InvalidArgumentException one = assertThrows(InvalidArgumentException.class,
          () -> rm.retrieve("ns", req16, view, out16, List.of(Kdn.allocate(STATE_BYTES))));
      assertTrue(one.getMessage().contains("passes 1 recurrent states, but the model has 2"), one.getMessage());
      for (int i = 0; i < 16 * BYTES_PER_TOKEN; ++i) assertEquals(0, out16.get(i)); // nothing written
      // Direct buffers, writable where kdn writes.
      assertThrows(IllegalArgumentException.class,
          () -> rm.retrieve("ns", req16, view, out16, List.of(Kdn.allocate(12), ByteBuffer.allocate(12))));
      assertThrows(IllegalArgumentException.class,
          () -> rm.retrieve("ns", req16, view, out16, List.of(Kdn.allocate(12), Kdn.allocate(12).asReadOnlyBuffer())));
      assertThrows(NullPointerException.class, () -> rm.retrieve("ns", req16, view, out16, null));
      // A store only reads them: read-only buffers are fine.
      assertEquals(16, rm.store("ns", req16, view, recurrentKv(16),
          List.of(state(1).asReadOnlyBuffer(), state(50).asReadOnlyBuffer())).tokens());
    }
    // A model without recurrent layers takes none.
    InvalidArgumentException plain = assertThrows(InvalidArgumentException.class,
        () -> m.store("ns", Request.ofTokens(tokens(4, 0)), KvView.canonical(), kv(4, 0), emptyStates()));
    assertTrue(plain.getMessage().contains("no recurrent layers"), plain.getMessage());
  }

  @Test
  void testRecurrentModelAsync() {
    ModelSpec spec = ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).stateLayers(1, STATE_BYTES)
        .fingerprint("java-recurrent-async").build();
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(16).tier(TierConfig.host(4 << 20)).build();
    try (KdnRuntime r16 = KdnRuntime.create(options); Model rm = r16.createModel(spec)) {
      Request req = Request.ofTokens(tokens(32, 70));
      List<ByteBuffer> saved = List.of(state(7));
      try (Op op = rm.saveAsync("ns", req, KvView.canonical(), recurrentKv(32), saved)) {
        assertEquals(saved, op.states());
        for (int l = 0; l < LAYERS; ++l) op.layerReady(l);
        assertTrue(op.await(java.time.Duration.ofSeconds(10)));
        assertEquals(32, op.result().tokens());
      }
      assertEquals(32, rm.lookup("ns", Request.ofTokens(tokens(40, 70))).cachedTokens());
      ByteBuffer out = Kdn.allocate(32 * BYTES_PER_TOKEN);
      List<ByteBuffer> got = List.of(Kdn.allocate(STATE_BYTES));
      try (Op op = rm.loadAsync("ns", req, KvView.canonical(), out, got)) {
        assertTrue(op.await(java.time.Duration.ofSeconds(10)));
        assertEquals(32, op.result().tokens());
        assertSame(out, op.buffer());
        assertSame(got.get(0), op.states().get(0));
      }
      assertEquals(recurrentKv(32), out);
      assertEquals(saved, got);
    }
  }

  @Test
  void testMissIsNotAnError() {
    Request req = Request.ofTokens(tokens(8, 500));
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    KvResult r = m.retrieve("ns", req, out);
    assertEquals(0, r.tokens());
    assertEquals(Status.OK, r.status());
    assertEquals(0, m.lookup("ns", req).cachedTokens());
    // Namespaces are separate.
    m.store("a", req, kv(8, 0));
    assertEquals(8, m.lookup("a", req).cachedTokens());
    assertEquals(0, m.lookup("b", req).cachedTokens());
  }

  @Test
  void testLookupSingleAndBatched() {
    int[] ids = tokens(12, 1);
    m.store("ns", Request.ofTokens(ids), kv(12, 0));
    LookupResult one = m.lookup("ns", Request.ofTokens(ids));
    assertEquals(Status.OK, one.status());
    assertEquals(12, one.cachedTokens());
    assertEquals(1, one.tierTokens().length);
    assertEquals(12, one.tierTokens(0));
    List<LookupResult> many = m.lookup("ns", List.of(Request.ofTokens(ids), Request.ofTokens(ids, 0, 6),
        Request.ofTokens(tokens(4, 900))));
    assertEquals(List.of(12L, 4L, 0L), many.stream().map(LookupResult::cachedTokens).toList());
    assertTrue(many.stream().allMatch(r -> r.status() == Status.OK));
    assertEquals(one, many.get(0));
  }

  @Test
  void testStridedView() {
    // The engine's layout: K of every layer, then V of every layer, each [layer][token][head][dim].
    int n = 8;
    int tokenElems = HEADS * HEAD_DIM;
    int fileElems = LAYERS * n * tokenElems;
    ByteBuffer engine = Kdn.allocate(2 * fileElems * 4);
    FloatBuffer e = engine.asFloatBuffer();
    for (int i = 0; i < 2 * fileElems; ++i) e.put(i, i);
    KvView view = KvView.contiguous().strideLayer((long) n * tokenElems).strideKv(fileElems)
        .strides(tokenElems, HEAD_DIM, 1).dtype(DType.F32).build();
    Request req = Request.ofTokens(tokens(n, 40));
    assertEquals(n, m.store("ns", req, view, engine).tokens());

    // Back in the canonical layout [layer][k|v][token][head][dim].
    ByteBuffer canon = Kdn.allocate(n * BYTES_PER_TOKEN);
    assertEquals(n, m.retrieve("ns", req, canon).tokens());
    FloatBuffer c = canon.asFloatBuffer();
    for (int layer = 0; layer < LAYERS; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int t = 0; t < n * tokenElems; ++t) {
          float want = kv * fileElems + layer * n * tokenElems + t;
          assertEquals(want, c.get((layer * 2 + kv) * n * tokenElems + t));
        }
      }
    }
    // And into the engine's layout again, through the same view.
    ByteBuffer again = Kdn.allocate(2 * fileElems * 4);
    assertEquals(n, m.retrieve("ns", req, view, again).tokens());
    assertEquals(engine, again);
  }

  @Test
  void testLayerOffsetsAndLayerSubsets() {
    int n = 4;
    int span = n * HEADS * HEAD_DIM; // one layer's K (or V)
    // Layer 1's KV first, then a gap, then layer 0's: offsets, not one stride.
    ByteBuffer buf = Kdn.allocate((4 * span + 16) * 4);
    FloatBuffer f = buf.asFloatBuffer();
    for (int i = 0; i < f.capacity(); ++i) f.put(i, i);
    KvView view = KvView.contiguous().strides(HEADS * HEAD_DIM, HEAD_DIM, 1).layerElements(span)
        .layerOffsets(2 * span + 16, 3 * span + 16).layerOffsets(0, span).build();
    Request req = Request.ofTokens(tokens(n, 70));
    assertEquals(n, m.store("ns", req, view, buf).tokens());
    ByteBuffer canon = Kdn.allocate(n * BYTES_PER_TOKEN);
    m.retrieve("ns", req, canon);
    FloatBuffer c = canon.asFloatBuffer();
    assertEquals(2 * span + 16, c.get(0)); // layer 0's K
    assertEquals(3 * span + 16, c.get(span)); // layer 0's V
    assertEquals(0, c.get(2 * span)); // layer 1's K
    assertEquals(span, c.get(3 * span)); // layer 1's V

    // The layers in another order: view layer 0 is model layer 1.
    KvView swapped = KvView.contiguous().strides(HEADS * HEAD_DIM, HEAD_DIM, 1).layerElements(span).layers(1, 0)
        .layerOffsets(0, span).layerOffsets(2 * span + 16, 3 * span + 16).build();
    ByteBuffer back = Kdn.allocate(buf.capacity());
    assertEquals(n, m.retrieve("ns", req, swapped, back).tokens());
    FloatBuffer k = back.asFloatBuffer();
    for (int i = 0; i < 4 * span + 16; ++i) {
      if (i < 2 * span || i >= 2 * span + 16) assertEquals(i, k.get(i), "element " + i);
    }
  }

  @Test
  void testPagedView() {
    for (KvLayout layout : new KvLayout[] {KvLayout.PAGED_NHD, KvLayout.PAGED_HND}) {
      int blockSize = 4;
      int numBlocks = 6;
      int blockElems = blockSize * HEADS * HEAD_DIM;
      int layerElems = numBlocks * blockElems;
      // vLLM-like: per layer a K cache and a V cache of numBlocks blocks; tokens in blocks 5 and 2.
      ByteBuffer cache = Kdn.allocate(2 * LAYERS * layerElems * 4);
      KvView.Builder b = KvView.paged(layout, blockSize, numBlocks).blockTable(5, 2);
      for (int l = 0; l < LAYERS; ++l) b.layerOffsets((2L * l) * layerElems, (2L * l + 1) * layerElems);
      KvView view = b.build();
      assertEquals(layout, view.layout());
      Request req = Request.ofTokens(tokens(8, layout == KvLayout.PAGED_NHD ? 300 : 400));
      ByteBuffer in = kv(8, 1);
      assertEquals(8, m.store("ns", req, in).tokens());
      assertEquals(8, m.retrieve("ns", req, view, cache).tokens());
      FloatBuffer c = cache.asFloatBuffer();
      FloatBuffer k = in.asFloatBuffer();
      // Layer 0's K, token 5 (block 2, slot 1), head 1, dim 3.
      int t = 5;
      int h = 1;
      int d = 3;
      float want = k.get(t * HEADS * HEAD_DIM + h * HEAD_DIM + d);
      int slot = t % blockSize;
      int at = layout == KvLayout.PAGED_NHD
          ? 2 * blockElems + slot * HEADS * HEAD_DIM + h * HEAD_DIM + d
          : 2 * blockElems + h * blockSize * HEAD_DIM + slot * HEAD_DIM + d;
      assertEquals(want, c.get(at), layout.toString());
      // Store from the pages under other tokens, retrieve canonically: the same KV.
      Request other = Request.ofTokens(tokens(8, 900 + layout.value() * 10));
      assertEquals(8, m.store("ns", other, view, cache).tokens());
      ByteBuffer back = Kdn.allocate(8 * BYTES_PER_TOKEN);
      assertEquals(8, m.retrieve("ns", other, back).tokens());
      assertEquals(in, back);
    }
  }

  @Test
  void testBlockHashes() {
    byte[] hashes = new byte[2 * 16];
    for (int i = 0; i < hashes.length; ++i) hashes[i] = (byte) (i * 37 + 1);
    Request req = Request.ofBlockHashes(hashes, 16, CHUNK);
    assertTrue(req.usesHashes());
    assertEquals(2, req.size());
    assertEquals(8, m.store("ns", req, kv(8, 2)).tokens());
    assertEquals(8, m.lookup("ns", req).cachedTokens());
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    assertEquals(8, m.retrieve("ns", req, out).tokens());
    assertEquals(kv(8, 2), out);
    assertThrows(InvalidArgumentException.class, () -> Request.ofBlockHashes(new byte[15], 16, CHUNK));
  }

  @Test
  void testSliceAndConcurrentCalls() throws Exception {
    // A slice passes a part of a buffer; many threads share one model.
    Request req = Request.ofTokens(tokens(8, 11));
    ByteBuffer big = Kdn.allocate(100 + 8 * BYTES_PER_TOKEN);
    ByteBuffer part = big.slice(100, 8 * BYTES_PER_TOKEN);
    part.put(kv(8, 5).rewind());
    assertEquals(8, m.store("ns", req, part).tokens());
    Thread[] threads = new Thread[4];
    Throwable[] failed = new Throwable[1];
    for (int i = 0; i < threads.length; ++i) {
      threads[i] = new Thread(() -> {
        try {
          ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
          for (int j = 0; j < 200; ++j) {
            assertEquals(8, m.retrieve("ns", req, out).tokens());
            assertEquals(8, m.lookup("ns", req).cachedTokens());
          }
          assertEquals(kv(8, 5), out);
        } catch (Throwable t) {
          failed[0] = t;
        }
      });
      threads[i].start();
    }
    for (Thread t : threads) t.join();
    assertNull(failed[0]);
  }
}

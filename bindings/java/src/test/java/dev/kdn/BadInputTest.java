// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Bad input gives a Java exception, never a crash: the list of plan14 section 7, with the same
 * test names in every binding (the editor that throws is EditorTest.testBadEditorThrows).
 */
class BadInputTest {
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
  void testBadSmallBuffer() {
    Request req = Request.ofTokens(tokens(8, 1));
    ByteBuffer small = Kdn.allocate(8 * BYTES_PER_TOKEN - 1);
    InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> m.store("ns", req, small));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertEquals(-1, e.code());
    assertFalse(e.getMessage().isEmpty());
    m.store("ns", req, kv(8, 0));
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN - 4);
    assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, out));
    // Nothing was written before the check.
    while (out.hasRemaining()) assertEquals(0, out.get());
    // A view whose offsets reach past the buffer is refused before kdn is called.
    KvView past = KvView.contiguous().layerElements(64).layerOffsets(0, 64).layerOffsets(128, 1 << 20).build();
    assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, past, Kdn.allocate(4096)));
  }

  @Test
  void testBadReadOnlyBuffer() {
    Request req = Request.ofTokens(tokens(8, 1));
    m.store("ns", req, kv(8, 0));
    ByteBuffer readOnly = Kdn.allocate(8 * BYTES_PER_TOKEN).asReadOnlyBuffer();
    assertThrows(IllegalArgumentException.class, () -> m.retrieve("ns", req, readOnly));
    assertThrows(IllegalArgumentException.class, () -> m.loadAsync("ns", req, KvView.canonical(), readOnly));
    assertThrows(IllegalArgumentException.class,
        () -> m.knowledgeFetch("ns", "doc", KvView.canonical(8), readOnly));
    // A read-only buffer is fine to store from.
    assertEquals(8, m.store("ns", Request.ofTokens(tokens(8, 50)), kv(8, 0).asReadOnlyBuffer()).tokens());
    // A heap buffer is never kdn's memory.
    ByteBuffer heap = ByteBuffer.allocate(8 * BYTES_PER_TOKEN);
    assertThrows(IllegalArgumentException.class, () -> m.store("ns", req, heap));
    assertThrows(IllegalArgumentException.class, () -> m.retrieve("ns", req, heap));
  }

  @Test
  void testBadDtype() {
    Request req = Request.ofTokens(tokens(8, 1));
    KvView f16 = KvView.contiguous().dtype(DType.F16).build();
    assertThrows(InvalidArgumentException.class, () -> m.store("ns", req, f16, kv(8, 0)));
    assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, f16, kv(8, 0)));
    // F16 model, an f32-sized buffer for half the tokens: the sizes are kdn's to check.
    try (Model half = rt.createModel(ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM)
        .dtype(DType.F16).fingerprint("half").build())) {
      assertEquals(BYTES_PER_TOKEN / 2, half.kvBytesPerToken());
      KvView f32 = KvView.contiguous().dtype(DType.F32).build();
      assertThrows(InvalidArgumentException.class, () -> half.store("ns", req, f32, kv(8, 0)));
      assertEquals(8, half.store("ns", req, KvView.contiguous().dtype(DType.F16).build(), kv(4, 0)).tokens());
    }
    assertThrows(InvalidArgumentException.class,
        () -> rt.createModel(ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(0).build()));
  }

  @Test
  void testBadClosedHandle() {
    Request req = Request.ofTokens(tokens(4, 1));
    KdnRuntime r = KdnRuntime.create(options());
    Model model = r.createModel(spec());
    model.close();
    IllegalStateException e = assertThrows(IllegalStateException.class, () -> model.lookup("ns", req));
    assertTrue(e.getMessage().contains("closed"), e.getMessage());
    assertThrows(IllegalStateException.class, () -> model.store("ns", req, kv(4, 0)));
    assertThrows(IllegalStateException.class, model::kvBytesPerToken);
    assertThrows(IllegalStateException.class, () -> model.reportPrefill(4, Duration.ofMillis(1)));
    r.close();
    assertThrows(IllegalStateException.class, r::stats);
    assertThrows(IllegalStateException.class, () -> r.createModel(spec()));
    assertTrue(r.isClosed());
    assertTrue(model.isClosed());
  }

  @Test
  void testBadNullArgument() {
    Request req = Request.ofTokens(tokens(4, 1));
    ByteBuffer b = kv(4, 0);
    assertThrows(NullPointerException.class, () -> KdnRuntime.create(null));
    assertThrows(NullPointerException.class, () -> KdnRuntime.create(options(), null));
    assertThrows(NullPointerException.class, () -> rt.createModel(null));
    assertThrows(NullPointerException.class, () -> m.store(null, req, b));
    assertThrows(NullPointerException.class, () -> m.store("ns", null, b));
    assertThrows(NullPointerException.class, () -> m.store("ns", req, null, b));
    assertThrows(NullPointerException.class, () -> m.store("ns", req, (ByteBuffer) null));
    assertThrows(NullPointerException.class, () -> m.lookup("ns", (Request) null));
    assertThrows(NullPointerException.class, () -> m.lookup("ns", Arrays.asList(req, null)));
    assertThrows(NullPointerException.class, () -> m.knowledgeInfo("ns", null));
    assertThrows(NullPointerException.class, () -> Request.ofTokens((int[]) null));
    assertThrows(NullPointerException.class, () -> TierConfig.host(1).withCodec(null));
    // An empty namespace is kdn's to refuse.
    assertThrows(InvalidArgumentException.class, () -> m.store("", req, b));
    assertThrows(InvalidArgumentException.class, () -> m.lookup("", req));
  }

  @Test
  void testBadNegativeToken() {
    Request req = Request.ofTokens(1, 2, -3, 4);
    assertThrows(InvalidArgumentException.class, () -> m.store("ns", req, kv(4, 0)));
    assertThrows(InvalidArgumentException.class, () -> m.lookup("ns", req));
  }

  @Test
  void testBadTierConfig() {
    assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(RuntimeOptions.builder().tier(TierConfig.host(0)).build()));
    KdnException e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(RuntimeOptions.builder().tier(TierConfig.host(1 << 20).withCodec("nope")).build()));
    assertTrue(e.getMessage().contains("nope"), e.getMessage());
    assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(RuntimeOptions.builder().chunkTokens(0).build()));
  }

  @Test
  void testBadRedisAddress() {
    // Refused when the runtime is created; no server is contacted.
    KdnException e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(RuntimeOptions.builder().tier(TierConfig.redis("not-an-address", "")).build()));
    assertTrue(e.getMessage().contains("not-an-address"), e.getMessage());
  }

  @Test
  void testBadRedisFieldsOnHostTier() {
    KdnException e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(RuntimeOptions.builder().tier(TierConfig.host(1 << 20).withUser("kdn")).build()));
    assertTrue(e.getMessage().contains("redis"), e.getMessage());
    assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(
        RuntimeOptions.builder().tier(TierConfig.host(1 << 20).withTtl(Duration.ofMinutes(1))).build()));
    assertThrows(IllegalArgumentException.class,
        () -> TierConfig.redis("127.0.0.1:1", "").withTtl(Duration.ofSeconds(-1)));
    // Sub-millisecond TTLs round up: never 0, which would mean "never expire".
    assertEquals(1, TierConfig.redis("127.0.0.1:1", "").withTtl(Duration.ofNanos(1)).ttl().toMillis());
  }

  @Test
  void testBadReportPrefill() {
    KdnException e = assertThrows(InvalidArgumentException.class, () -> m.reportPrefill(0, Duration.ofMillis(5)));
    assertFalse(e.getMessage().isEmpty());
    assertInstanceOf(CallerException.class, e);
    assertThrows(InvalidArgumentException.class, () -> m.reportPrefill(16, Duration.ZERO));
    assertThrows(InvalidArgumentException.class, () -> m.reportPrefill(16, Duration.ofNanos(-1)));
    // Over an hour per token: seconds taken for nanoseconds.
    assertThrows(InvalidArgumentException.class, () -> m.reportPrefill(2, Duration.ofSeconds(2 * 3600 + 1)));
    // Past 64-bit nanoseconds.
    assertThrows(InvalidArgumentException.class, () -> m.reportPrefill(1, Duration.ofDays(200 * 365)));
    assertThrows(NullPointerException.class, () -> m.reportPrefill(1, null));
    Stats s = rt.stats();
    assertEquals(0, s.prefillTokens());
    assertEquals(0, s.prefillNs());
  }

  @Test
  void testBadUnknownDoc() {
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    assertThrows(NotFoundException.class, () -> m.knowledgeFetch("kb", "nothing", KvView.canonical(8), out));
    assertThrows(NotFoundException.class, () -> m.knowledgeInfo("kb", "nothing"));
    String longId = "x".repeat(256);
    assertThrows(InvalidArgumentException.class,
        () -> m.knowledgePut("kb", longId, 1, "", Request.ofTokens(tokens(4, 1)), KvView.canonical(), kv(4, 0)));
    assertThrows(InvalidArgumentException.class, () -> m.knowledgeInfo("kb", longId));
  }

  @Test
  void testBadFetchTooSmall() {
    m.knowledgePut("kb", "doc", 1, "", Request.ofTokens(tokens(12, 1)), KvView.canonical(), kv(12, 0));
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    BufferTooSmallException e = assertThrows(BufferTooSmallException.class,
        () -> m.knowledgeFetch("kb", "doc", KvView.canonical(8), out));
    assertEquals(12, e.needed());
    assertEquals(Status.BUFFER_TOO_SMALL, e.status());
    assertInstanceOf(CallerException.class, e);
    while (out.hasRemaining()) assertEquals(0, out.get());
    // Room the view states but the buffer does not have.
    assertThrows(InvalidArgumentException.class, () -> m.knowledgeFetch("kb", "doc", KvView.canonical(12), out));
    ByteBuffer room = Kdn.allocate(12 * BYTES_PER_TOKEN);
    assertEquals(12, m.knowledgeFetch("kb", "doc", KvView.canonical(e.needed()), room).tokens().length);
  }

  @Test
  void testBadBatchOneBad() {
    m.store("ns", Request.ofTokens(tokens(8, 1)), kv(8, 0));
    List<LookupResult> r = m.lookup("ns",
        List.of(Request.ofTokens(tokens(8, 1)), Request.ofTokens(5, -1, 7), Request.ofTokens(tokens(4, 1))));
    assertEquals(3, r.size());
    assertEquals(Status.OK, r.get(0).status());
    assertEquals(8, r.get(0).cachedTokens());
    assertEquals(Status.INVALID_ARGUMENT, r.get(1).status());
    assertEquals(Status.OK, r.get(2).status());
    assertEquals(4, r.get(2).cachedTokens());
  }

  @Test
  void testBadOpAfterClose() {
    Op op = m.loadAsync("ns", Request.ofTokens(tokens(4, 1)), KvView.canonical(), Kdn.allocate(4 * BYTES_PER_TOKEN));
    op.close();
    assertThrows(IllegalStateException.class, () -> op.await(Duration.ofSeconds(1)));
    assertThrows(IllegalStateException.class, op::await);
    assertThrows(IllegalStateException.class, op::result);
    assertThrows(IllegalStateException.class, op::cancel);
    // A model closed under a running op: the op still ends.
    Model other = rt.createModel(spec());
    Op running = other.saveAsync("ns", Request.ofTokens(tokens(4, 9)), KvView.canonical(), kv(4, 0));
    other.close();
    running.cancel();
    for (int l = 0; l < LAYERS; ++l) running.layerReady(l);
    assertThrows(KdnCancelledException.class, () -> running.await(Duration.ofSeconds(10)));
    running.close();
  }

  /** A paged view of more blocks than the buffer holds, or so many that their bytes overflow. */
  @Test
  void testBadPagedBlockCount() {
    Request req = Request.ofTokens(tokens(8, 1));
    m.store("ns", req, kv(8, 0));
    int blockSize = 4;
    long blockElems = (long) blockSize * HEADS * HEAD_DIM;
    int numBlocks = 6;
    ByteBuffer cache = Kdn.allocate((int) (2 * LAYERS * numBlocks * blockElems * 4));
    // The most an unsigned count can say, a count whose bytes overflow 64 bits (to a small span
    // the offsets fit), one block past the buffer.
    long[] counts = {(1L << 62) / blockElems * 4 + 1, -1L, 2L * LAYERS * numBlocks + 1};
    for (KvLayout layout : new KvLayout[] {KvLayout.PAGED_NHD, KvLayout.PAGED_HND}) {
      for (long count : counts) {
        KvView.Builder b = KvView.paged(layout, blockSize, count).blockTable(5, 2);
        for (int l = 0; l < LAYERS; ++l) b.layerOffsets(0, 0);
        KvView view = b.build();
        String what = layout + ", " + Long.toUnsignedString(count) + " blocks";
        InvalidArgumentException e =
            assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, view, cache), what);
        assertTrue(e.getMessage().contains("blocks"), e.getMessage());
        assertThrows(InvalidArgumentException.class, () -> m.store("ns", req, view, cache), what);
        assertThrows(InvalidArgumentException.class, () -> m.loadAsync("ns", req, view, cache), what);
      }
    }
    while (cache.hasRemaining()) assertEquals(0, cache.get());
  }

  /** Layer offsets for fewer (or more) layers than the view names: refused, nothing read past them. */
  @Test
  void testBadLayerOffsetsMissLayers() {
    Request req = Request.ofTokens(tokens(4, 1));
    m.store("ns", req, kv(4, 0));
    int span = 4 * HEADS * HEAD_DIM;
    ByteBuffer buf = Kdn.allocate(4 * span * 4);
    KvView.Builder strided = KvView.contiguous().strides(HEADS * HEAD_DIM, HEAD_DIM, 1).layerElements(span);
    // The model has LAYERS (2) layers: one offset pair is not enough.
    KvView oneOfTwo = strided.layerOffsets(0, span).build();
    InvalidArgumentException e =
        assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, oneOfTwo, buf));
    assertTrue(e.getMessage().contains("layer offsets"), e.getMessage());
    assertThrows(InvalidArgumentException.class, () -> m.store("ns", req, oneOfTwo, buf));
    assertThrows(InvalidArgumentException.class, () -> m.saveAsync("ns", req, oneOfTwo, buf));
    // A view naming both layers with one pair, and one naming one layer with two.
    KvView named = KvView.contiguous().strides(HEADS * HEAD_DIM, HEAD_DIM, 1).layerElements(span).layers(0, 1)
        .layerOffsets(0, span).build();
    assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, named, buf));
    KvView extra = KvView.contiguous().strides(HEADS * HEAD_DIM, HEAD_DIM, 1).layerElements(span).layers(1)
        .layerOffsets(0, span).layerOffsets(2 * span, 3 * span).build();
    assertThrows(InvalidArgumentException.class, () -> m.retrieve("ns", req, extra, buf));
    while (buf.hasRemaining()) assertEquals(0, buf.get());
  }

  /** A knowledge fetch whose room (the view's numTokens) is larger than the buffer, up to 2^64-1. */
  @Test
  void testBadFetchRoomPastBuffer() {
    m.knowledgePut("kb", "doc", 1, "", Request.ofTokens(tokens(8, 1)), KvView.canonical(), kv(8, 0));
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    for (long room : new long[] {-1L, Long.MAX_VALUE, 1L << 40, 9}) {
      InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
          () -> m.knowledgeFetch("kb", "doc", KvView.canonical(room), out), Long.toUnsignedString(room));
      assertTrue(e.getMessage().contains("room"), e.getMessage());
    }
    while (out.hasRemaining()) assertEquals(0, out.get());
    assertEquals(8, m.knowledgeFetch("kb", "doc", KvView.canonical(8), out).tokens().length);
  }
}

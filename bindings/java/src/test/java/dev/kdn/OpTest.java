// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class OpTest {
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
  void testLoadAsync() {
    Request req = Request.ofTokens(tokens(8, 20));
    m.store("ns", req, kv(8, 9));
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    try (Op op = m.loadAsync("ns", req, KvView.canonical(), out)) {
      assertSame(out, op.buffer());
      for (int l = 0; l < LAYERS; ++l) assertTrue(op.awaitLayer(l, Duration.ofSeconds(10)));
      assertTrue(op.await(Duration.ofSeconds(10)));
      assertTrue(op.await(10, TimeUnit.SECONDS));
      op.await();
      assertEquals(OpState.DONE, op.poll());
      KvResult r = op.result();
      assertEquals(OpState.DONE, r.state());
      assertEquals(8, r.tokens());
      assertEquals(0, r.numFailed());
      assertTrue(op.failedRanges().isEmpty());
    }
    assertEquals(kv(8, 9), out);
  }

  @Test
  void testOpKeepsItsBuffer() {
    Request req = Request.ofTokens(tokens(8, 120));
    m.store("ns", req, kv(8, 6));
    // Nothing but the op references the buffer while it loads.
    try (Op op = m.loadAsync("ns", req, KvView.canonical(), Kdn.allocate(8 * BYTES_PER_TOKEN))) {
      for (int i = 0; i < 3; ++i) System.gc();
      op.await();
      assertEquals(kv(8, 6), op.buffer());
    }
    // Ops nobody closed: the Cleaner closes them (and only then lets their buffers go).
    for (int i = 0; i < 10; ++i) {
      m.saveAsync("ns", Request.ofTokens(tokens(8, 2000 + 8 * i)), KvView.canonical(), kv(8, i));
    }
    for (int i = 0; i < 3; ++i) System.gc();
    assertEquals(8, m.lookup("ns", req).cachedTokens());
  }

  @Test
  void testLoadAsyncMiss() {
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    try (Op op = m.loadAsync("ns", Request.ofTokens(tokens(8, 5000)), KvView.canonical(), out)) {
      op.await();
      assertEquals(0, op.result().tokens());
    }
  }

  @Test
  void testSaveAsync() {
    Request req = Request.ofTokens(tokens(8, 60));
    ByteBuffer in = kv(8, 4);
    try (Op op = m.saveAsync("ns", req, KvView.canonical(), in)) {
      for (int l = 0; l < LAYERS; ++l) op.layerReady(l);
      assertTrue(op.await(Duration.ofSeconds(10)));
      assertEquals(OpState.DONE, op.poll());
      assertEquals(8, op.result().tokens());
    }
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    assertEquals(8, m.retrieve("ns", req, out).tokens());
    assertEquals(in, out);
  }

  @Test
  void testCancel() {
    Request req = Request.ofTokens(tokens(8, 80));
    Op op = m.saveAsync("ns", req, KvView.canonical(), kv(8, 0));
    // Layer 1 is not ready yet: the save waits.
    op.layerReady(0);
    assertFalse(op.await(Duration.ofMillis(20)));
    assertEquals(OpState.PENDING, op.poll());
    // A save is cancelled at its next layer.
    op.cancel();
    op.cancel();
    op.layerReady(1);
    assertThrows(KdnCancelledException.class, () -> op.await(Duration.ofSeconds(10)));
    assertThrows(KdnCancelledException.class, () -> op.await(Duration.ZERO));
    assertEquals(OpState.CANCELLED, op.poll());
    KvResult r = op.result();
    assertEquals(OpState.CANCELLED, r.state());
    assertEquals(Status.CANCELLED, r.status());
    assertEquals(0, r.tokens());
    op.close();
    op.close();
    assertTrue(op.isClosed());
    assertEquals(0, m.lookup("ns", req).cachedTokens());
  }

  @Test
  void testCloseWhileRunning() {
    // Closing a running op cancels it and waits until kdn no longer touches the buffer.
    Op op = m.saveAsync("ns", Request.ofTokens(tokens(8, 90)), KvView.canonical(), kv(8, 0));
    op.close();
    assertThrows(IllegalStateException.class, op::poll);
  }

  /**
   * close() in one thread while another waits on the op (no time limit, or a layer): the wait ends
   * (the op cancelled, or the handle closed) and nothing crashes. A save that never gets its layers
   * stays pending, so the waits are in flight when close() runs.
   */
  @Test
  void testCloseWhileAnotherThreadWaits() throws Exception {
    for (int round = 0; round < 20; ++round) {
      Op op = round % 3 == 2
          ? m.loadAsync("ns", Request.ofTokens(tokens(8, 5000 + round)), KvView.canonical(), Kdn.allocate(8 * BYTES_PER_TOKEN))
          : m.saveAsync("ns", Request.ofTokens(tokens(8, 5000 + round)), KvView.canonical(), kv(8, 0));
      CountDownLatch started = new CountDownLatch(1);
      AtomicReference<Throwable> unexpected = new AtomicReference<>();
      int r = round;
      Thread waiter = new Thread(() -> {
        started.countDown();
        try {
          if (r % 3 == 2) {
            op.awaitLayer(0);
          } else {
            op.await();
          }
        } catch (IllegalStateException | KdnCancelledException ended) {
          // closed under the wait, or cancelled by close(): both are the wait ending
        } catch (Throwable e) {
          unexpected.compareAndSet(null, e);
        }
      });
      waiter.start();
      started.await();
      Thread.sleep(round % 5);
      op.close();
      waiter.join(10_000);
      assertFalse(waiter.isAlive(), "the wait ends once the op is closed");
      assertNull(unexpected.get());
      assertThrows(IllegalStateException.class, op::poll);
    }
    // The model still works.
    Request req = Request.ofTokens(tokens(4, 1));
    assertEquals(4, m.store("ns", req, kv(4, 0)).tokens());
  }

  /** Several threads poll and wait with time limits while the op is closed. */
  @Test
  void testCloseWhileThreadsPoll() throws Exception {
    Op op = m.saveAsync("ns", Request.ofTokens(tokens(8, 7000)), KvView.canonical(), kv(8, 0));
    CountDownLatch started = new CountDownLatch(3);
    AtomicReference<Throwable> unexpected = new AtomicReference<>();
    Thread[] threads = {
      KdnRuntimeTest.callUntilClosed(started, unexpected, op::poll),
      KdnRuntimeTest.callUntilClosed(started, unexpected, op::result),
      KdnRuntimeTest.callUntilClosed(started, unexpected, () -> {
        try {
          op.await(Duration.ofMillis(1));
        } catch (KdnCancelledException cancelled) {
          // close() cancels the op first
        }
      }),
    };
    started.await();
    Thread.sleep(5);
    op.close();
    for (Thread t : threads) {
      t.join(10_000);
      assertFalse(t.isAlive());
    }
    assertNull(unexpected.get());
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.swig.NativeStats;
import dev.kdn.swig.NativeTierStats;
import java.lang.reflect.Method;
import java.lang.reflect.RecordComponent;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class KdnRuntimeTest {
  @Test
  void testVersion() {
    assertTrue(Kdn.version().matches("\\d+\\.\\d+\\.\\d+"), Kdn.version());
    String[] p = Kdn.version().split("\\.");
    assertEquals(Integer.parseInt(p[0]) * 10000 + Integer.parseInt(p[1]) * 100 + Integer.parseInt(p[2]),
        Kdn.versionNumber());
    assertEquals("KDN_ERR_NOT_FOUND", Kdn.statusString(Status.NOT_FOUND.code()));
  }

  /** The binding covers C ABI 1.9: an older libkdn (or another major) is refused, saying which it needs. */
  @Test
  void testRequiredLibraryVersion() {
    assertEquals(1, Kdn.REQUIRED_MAJOR);
    assertEquals(9, Kdn.REQUIRED_MINOR);
    assertTrue(Kdn.versionNumber() >= 10900, Kdn.version()); // the library this run loaded
    Kdn.checkLibraryVersion(Kdn.versionNumber());
    Kdn.checkLibraryVersion(10900);
    Kdn.checkLibraryVersion(10903);
    Kdn.checkLibraryVersion(11200);
    VersionException old = assertThrows(VersionException.class, () -> Kdn.checkLibraryVersion(10802));
    assertTrue(old.getMessage().startsWith("libkdn 1.8.2 is not usable by this Java binding: it needs libkdn 1.9 or"
        + " a later 1.x (libkdn.so.1)"), old.getMessage());
    assertThrows(VersionException.class, () -> Kdn.checkLibraryVersion(10702));
    assertEquals(Status.VERSION, old.status());
    VersionException next = assertThrows(VersionException.class, () -> Kdn.checkLibraryVersion(20000));
    assertTrue(next.getMessage().startsWith("libkdn 2.0.0 "), next.getMessage());
  }

  @Test
  void testTiersAndStats(@TempDir Path dir) {
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(CHUNK)
        .tier(TierConfig.host(1 << 20).withPolicy(EvictionPolicy.S3FIFO).withWatermarks(0.9f, 0.8f))
        .tier(TierConfig.device(1 << 20))
        .tier(TierConfig.disk(dir.resolve("tier"), 8 << 20).withCodec("zstd").withWriteThrough(false))
        .build();
    assertEquals(3, options.tiers().size());
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(spec())) {
      assertEquals(3, rt.tierCount());
      List<TierStats> tiers = rt.tierStats();
      assertEquals(List.of(TierKind.HOST, TierKind.DEVICE, TierKind.DISK),
          tiers.stream().map(TierStats::kind).toList());
      assertEquals(1 << 20, tiers.get(0).capacityBytes());
      assertTrue(tiers.get(2).codec().startsWith("zstd"), tiers.get(2).codec());
      assertFalse(tiers.get(0).name().isEmpty());
      // The watermarks (since 1.4): as set (float), or kdn's defaults.
      assertEquals(0.9f, tiers.get(0).highWatermark());
      assertEquals(0.8f, tiers.get(0).lowWatermark());
      assertEquals(0.95, tiers.get(1).highWatermark());
      assertEquals(0.85, tiers.get(1).lowWatermark());

      Request req = Request.ofTokens(tokens(8, 100));
      assertEquals(8, m.store("ns", req, kv(8, 1)).tokens());
      m.lookup("ns", req);
      Stats s = rt.stats();
      assertEquals(1, s.stores());
      assertEquals(8, s.tokensStored());
      assertEquals(8L * BYTES_PER_TOKEN, s.bytesStored());
      assertEquals(1, s.lookups());
      assertTrue(s.capacityBytes() >= (2 << 20) + (8 << 20));
      assertEquals(1, rt.latency(LatencyKind.LOOKUP).count());
      assertEquals(1, rt.latency(LatencyKind.STORE).count());
      assertTrue(rt.latency(LatencyKind.STORE).maxUs() > 0);
      assertTrue(rt.tierStats(0).puts() >= 2);
    }
  }

  /** A reported prefill prices the tokens later loads serve (each load rounds to a ns). */
  @Test
  void testReportedPrefillPricesLoads() {
    try (KdnRuntime rt = KdnRuntime.create(options()); Model m = rt.createModel(spec())) {
      int[] ids = tokens(3 * CHUNK, 100);
      assertEquals(2 * CHUNK, m.store("ns", Request.ofTokens(ids, 0, 2 * CHUNK), kv(2 * CHUNK, 1)).tokens());
      long n = 24;
      long t = 1_000_003; // t / n is not a whole number of ns
      m.reportPrefill(n, Duration.ofNanos(t));
      // A whole hit, then a request a chunk longer than what is cached.
      for (int length : new int[] {2 * CHUNK, 3 * CHUNK}) {
        ByteBuffer out = Kdn.allocate(length * BYTES_PER_TOKEN);
        assertEquals(2 * CHUNK, m.retrieve("ns", Request.ofTokens(ids, 0, length), out).tokens());
      }
      // A lookup is no load: counted apart.
      assertEquals(2 * CHUNK, m.lookup("ns", Request.ofTokens(ids)).cachedTokens());
      Stats s = rt.stats();
      assertEquals(3 * CHUNK, s.lookupTokens());
      assertEquals(2 * CHUNK, s.lookupHitTokens());
      assertEquals(n, s.prefillTokens());
      assertEquals(t, s.prefillNs());
      assertEquals(4 * CHUNK, s.tokensServed());
      assertEquals(5 * CHUNK, s.tokensRequested());
      assertTrue(s.tokensRequested() >= s.tokensServed());
      long exact = s.tokensServed() * t / n;
      assertTrue(Math.abs(s.ttftSavedNs() - exact) <= 2, s.ttftSavedNs() + " vs " + exact + " (two loads)");
      assertEquals(0, s.tokensServedUnpriced());
      assertTrue(s.deliveryNs() > 0);
    }
  }

  @Test
  void testRemoteTierConfig() {
    TierConfig t = TierConfig.remote("127.0.0.1:1", "secret").withTimeout(java.time.Duration.ofMillis(50))
        .withTls("/nonexistent/ca.pem", "kdnd").withCodec("kdn");
    assertEquals(TierKind.REMOTE, t.kind());
    assertEquals(50, t.timeout().toMillis());
    assertEquals("secret", t.token());
    assertEquals("kdnd", t.tlsServerName());
  }

  @Test
  void testModelBasics() {
    try (KdnRuntime rt = KdnRuntime.create(options()); Model m = rt.createModel(spec())) {
      assertEquals(BYTES_PER_TOKEN, m.kvBytesPerToken());
      assertEquals(spec().kvBytesPerToken(), m.kvBytesPerToken());
      assertTrue(m.fingerprint().matches("[0-9a-f]{64}"), m.fingerprint());
      assertSame(rt, m.runtime());
      try (Model other = rt.createModel(ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM)
          .fingerprint("another").build())) {
        assertNotEquals(m.fingerprint(), other.fingerprint());
      }
    }
  }

  @Test
  void testCloseIsIdempotentAndOrderFree() {
    KdnRuntime rt = KdnRuntime.create(options());
    Model m = rt.createModel(spec());
    rt.close(); // the model keeps the native runtime alive
    assertTrue(rt.isClosed());
    Request req = Request.ofTokens(tokens(4, 1));
    assertEquals(4, m.store("ns", req, kv(4, 0)).tokens());
    assertEquals(4, m.lookup("ns", req).cachedTokens());
    m.close();
    m.close();
    rt.close();
    assertThrows(IllegalStateException.class, () -> m.lookup("ns", req));
    assertThrows(IllegalStateException.class, rt::stats);
  }

  @Test
  void testUnclosedHandlesAreCleaned() throws Exception {
    // Nobody closes these: the Cleaner does, and nothing crashes.
    for (int i = 0; i < 20; ++i) {
      KdnRuntime rt = KdnRuntime.create(options());
      Model m = rt.createModel(spec());
      m.store("ns", Request.ofTokens(tokens(4, 1)), kv(4, 0));
    }
    System.gc();
    Thread.sleep(50);
    try (KdnRuntime rt = KdnRuntime.create(options())) {
      assertEquals(0, rt.stats().stores());
    }
  }

  /** Creating a runtime with an editor leaves nothing behind when a step fails. */
  @Test
  void testCreateFailureLeavesNothingBehind() {
    List<Core> cores = new ArrayList<>();
    Supplier<Core> newCore = () -> {
      Core c = new Core(new EditorTest.AddOne());
      cores.add(c);
      return c;
    };
    // The native options fail (an OutOfMemoryError, say): no core, no native editor may be left.
    OutOfMemoryError oom = new OutOfMemoryError("no room for the options");
    assertSame(oom, assertThrows(OutOfMemoryError.class, () -> KdnRuntime.make(() -> {
      throw oom;
    }, newCore)));
    for (Core c : cores) assertTrue(c.isReleased(), "the editor made before the options failed is released");
    // kdn refuses the options: the core made for them is released.
    RuntimeOptions bad = RuntimeOptions.builder().tier(TierConfig.host(0)).build();
    assertThrows(InvalidArgumentException.class, () -> KdnRuntime.make(bad::toNative, newCore));
    assertFalse(cores.isEmpty());
    for (Core c : cores) assertTrue(c.isReleased());
    // And the good path keeps its core until the runtime is closed.
    KdnRuntime rt = KdnRuntime.make(options()::toNative, newCore);
    Core last = cores.get(cores.size() - 1);
    assertFalse(last.isReleased());
    rt.close();
    assertTrue(last.isReleased());
  }

  /**
   * Each Stats and TierStats component carries the native field of its own name: every native field
   * set to a distinct value, then each component compared with the field its name maps to
   * (usedBytes: getUsed_bytes). A reordered or missing argument in from() fails here.
   */
  @Test
  void testStatsFieldsByName() throws Exception {
    NativeStats ns = new NativeStats();
    Map<String, Object> want = fillDistinct(ns);
    assertFieldsByName(Stats.from(ns), want);
    NativeTierStats nt = new NativeTierStats();
    Map<String, Object> tierWant = fillDistinct(nt);
    assertFieldsByName(TierStats.from(nt), tierWant);
  }

  /** Sets every long field through its setter to a distinct value; strings to their name. */
  private static Map<String, Object> fillDistinct(Object nat) throws Exception {
    Map<String, Object> set = new HashMap<>();
    long next = 1001;
    for (Method m : nat.getClass().getMethods()) {
      if (!m.getName().startsWith("set") || m.getParameterCount() != 1) continue;
      String field = m.getName().substring(3);
      Class<?> type = m.getParameterTypes()[0];
      Object v;
      if (type == long.class) {
        v = next++;
      } else if (type == double.class) {
        v = (double) next++ / 4096; // the watermarks: fractions
      } else if (type == int.class) {
        v = TierKind.DISK.value(); // the only int: kind, an enum value
      } else if (type == String.class) {
        v = field + "-value";
      } else {
        fail("a native field of an unexpected type: " + m);
        return set;
      }
      m.invoke(nat, v);
      set.put(field, v);
    }
    return set;
  }

  private static void assertFieldsByName(Record r, Map<String, Object> nativeFields) throws Exception {
    RecordComponent[] components = r.getClass().getRecordComponents();
    assertEquals(nativeFields.size(), components.length, "one component per native field: " + nativeFields.keySet());
    for (RecordComponent c : components) {
      String field = c.getName().replaceAll("([A-Z])", "_$1").toLowerCase(Locale.ROOT);
      field = Character.toUpperCase(field.charAt(0)) + field.substring(1);
      assertTrue(nativeFields.containsKey(field), c.getName() + ": no native field " + field);
      Object got = c.getAccessor().invoke(r);
      Object expected = nativeFields.get(field);
      if (got instanceof TierKind k) got = k.value();
      assertEquals(expected, got, r.getClass().getSimpleName() + "." + c.getName());
    }
  }

  /** close() racing another thread's calls: they complete or throw IllegalStateException, nothing crashes. */
  @Test
  void testCloseWhileCallsRun() throws Exception {
    for (int round = 0; round < 20; ++round) {
      KdnRuntime rt = KdnRuntime.create(options());
      Model m = rt.createModel(spec());
      Request req = Request.ofTokens(tokens(8, 1));
      m.store("ns", req, kv(8, 0));
      CountDownLatch started = new CountDownLatch(2);
      AtomicReference<Throwable> unexpected = new AtomicReference<>();
      Thread lookups = callUntilClosed(started, unexpected, () -> m.lookup("ns", req));
      Thread stats = callUntilClosed(started, unexpected, () -> {
        rt.stats();
        rt.tierStats(0);
      });
      started.await();
      Thread.sleep(round % 4);
      if (round % 2 == 0) {
        rt.close();
        m.close();
      } else {
        m.close();
        rt.close();
      }
      lookups.join(10_000);
      stats.join(10_000);
      assertFalse(lookups.isAlive() || stats.isAlive(), "the calls end once the handles are closed");
      assertNull(unexpected.get());
    }
  }

  /** A thread that calls {@code call} until it throws IllegalStateException (its handle closed). */
  static Thread callUntilClosed(CountDownLatch started, AtomicReference<Throwable> unexpected, Runnable call) {
    Thread t = new Thread(() -> {
      started.countDown();
      try {
        while (true) call.run();
      } catch (IllegalStateException closed) {
        // the handle was closed: done
      } catch (Throwable e) {
        unexpected.compareAndSet(null, e);
      }
    });
    t.start();
    return t;
  }
}

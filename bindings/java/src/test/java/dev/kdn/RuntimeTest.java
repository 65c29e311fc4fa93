package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class RuntimeTest {
  @Test
  void testVersion() {
    assertTrue(Kdn.version().matches("\\d+\\.\\d+\\.\\d+"), Kdn.version());
    String[] p = Kdn.version().split("\\.");
    assertEquals(Integer.parseInt(p[0]) * 10000 + Integer.parseInt(p[1]) * 100 + Integer.parseInt(p[2]),
        Kdn.versionNumber());
    assertEquals("KDN_ERR_NOT_FOUND", Kdn.statusString(Status.NOT_FOUND.code()));
  }

  @Test
  void testTiersAndStats(@TempDir Path dir) {
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(CHUNK)
        .tier(TierConfig.host(1 << 20).withPolicy(EvictionPolicy.S3FIFO).withWatermarks(0.9f, 0.8f))
        .tier(TierConfig.device(1 << 20))
        .tier(TierConfig.disk(dir.resolve("tier"), 8 << 20).withCodec("zstd").withWriteThrough(false))
        .build();
    assertEquals(3, options.tiers().size());
    try (Runtime rt = Runtime.create(options); Model m = rt.createModel(spec())) {
      assertEquals(3, rt.tierCount());
      List<TierStats> tiers = rt.tierStats();
      assertEquals(List.of(TierKind.HOST, TierKind.DEVICE, TierKind.DISK),
          tiers.stream().map(TierStats::kind).toList());
      assertEquals(1 << 20, tiers.get(0).capacityBytes());
      assertTrue(tiers.get(2).codec().startsWith("zstd"), tiers.get(2).codec());
      assertFalse(tiers.get(0).name().isEmpty());

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
    try (Runtime rt = Runtime.create(options()); Model m = rt.createModel(spec())) {
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
    Runtime rt = Runtime.create(options());
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
      Runtime rt = Runtime.create(options());
      Model m = rt.createModel(spec());
      m.store("ns", Request.ofTokens(tokens(4, 1)), kv(4, 0));
    }
    System.gc();
    Thread.sleep(50);
    try (Runtime rt = Runtime.create(options())) {
      assertEquals(0, rt.stats().stores());
    }
  }
}

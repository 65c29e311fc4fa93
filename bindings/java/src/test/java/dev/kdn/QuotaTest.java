// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.swig.NativeQuotaStats;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HexFormat;
import java.util.List;
import org.junit.jupiter.api.Test;

/** A tier's namespace quotas (since 1.13): a namespace over its quota evicts only its own chunks. */
class QuotaTest {
  /** What a memory tier counts for one chunk: its KV bytes in whole 4 KiB pages (512 bytes: one). */
  static final long CHUNK_HELD = (CHUNK * BYTES_PER_TOKEN + 4095) / 4096 * 4096;

  /** A runtime of the test model's chunks over {@code tiers}, highest first. */
  private static RuntimeOptions runtimeOf(TierConfig... tiers) {
    RuntimeOptions.Builder b = RuntimeOptions.builder().chunkTokens(CHUNK);
    for (TierConfig t : tiers) b.tier(t);
    return b.build();
  }

  /** A host tier with room for 20 chunks, without watermarks (full is full). */
  private static TierConfig roomFor20() {
    return TierConfig.host(20 * CHUNK_HELD).withWatermarks(1.0f, 1.0f);
  }

  /** Prompt {@code i}: one chunk of tokens of its own. */
  private static Request prompt(int i) {
    return Request.ofTokens(tokens(CHUNK, 1000 + 100 * i));
  }

  /**
   * kdn's hash of a namespace, as chunk envelopes record it (core/keys/hash.cc's NamespaceHash):
   * SHA-256 of "kdn-namespace-v1" and the namespace's UTF-8 bytes, each after its length as a
   * little-endian u64; 64 lowercase hex digits.
   */
  static String namespaceHash(String namespace) throws Exception {
    MessageDigest d = MessageDigest.getInstance("SHA-256");
    for (byte[] s : new byte[][] {"kdn-namespace-v1".getBytes(StandardCharsets.US_ASCII),
             namespace.getBytes(StandardCharsets.UTF_8)}) {
      d.update(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(s.length).array());
      d.update(s);
    }
    return HexFormat.of().formatHex(d.digest());
  }

  @Test
  void testTenantOverItsQuotaEvictsOnlyItsOwnChunks() throws Exception {
    assertEquals(4096, CHUNK_HELD);
    TierConfig tier = roomFor20().withQuota("tenant-a", 4 * CHUNK_HELD);
    try (KdnRuntime rt = KdnRuntime.create(runtimeOf(tier)); Model m = rt.createModel(spec())) {
      for (int i = 0; i < 10; ++i) { // ten one-chunk prompts each
        assertEquals(CHUNK, m.store("tenant-a", prompt(i), kv(CHUNK, i)).tokens());
        assertEquals(CHUNK, m.store("tenant-b", prompt(i), kv(CHUNK, i)).tokens());
      }
      for (int i = 0; i < 10; ++i) {
        assertEquals(i >= 6 ? CHUNK : 0, m.lookup("tenant-a", prompt(i)).cachedTokens(), "tenant-a's prompt " + i);
        assertEquals(CHUNK, m.lookup("tenant-b", prompt(i)).cachedTokens(), "tenant-b's prompt " + i); // none went
      }
      List<QuotaStats> stats = rt.quotaStats(0);
      assertEquals(1, stats.size());
      QuotaStats a = stats.get(0);
      assertEquals("tenant-a", a.namespace());
      assertEquals(namespaceHash("tenant-a"), a.namespaceHash());
      assertEquals(4 * CHUNK_HELD, a.quotaBytes());
      assertEquals(4 * CHUNK_HELD, a.usedBytes());
      assertEquals(4, a.objects());
      assertEquals(6, a.quotaEvictions());
      assertEquals(0, a.roomEvictions());
      assertEquals(0, a.refused());
      assertEquals(14, rt.tierStats(0).objects()); // a's 4 and b's 10
      assertEquals(6, rt.tierStats(0).evictions());
      // A tier the runtime does not have.
      assertThrows(InvalidArgumentException.class, () -> rt.quotaStats(1));
      assertThrows(InvalidArgumentException.class, () -> rt.quotaStats(-1));
    }
  }

  @Test
  void testQuotasReportedInTheOrderGiven() throws Exception {
    TierConfig tier = roomFor20().withQuota("z", 2 * CHUNK_HELD).withQuota("a", 3 * CHUNK_HELD)
        .withQuota("ünï", 0); // 0: its chunks skip the tier (refused)
    try (KdnRuntime rt = KdnRuntime.create(runtimeOf(tier)); Model m = rt.createModel(spec())) {
      assertEquals(0, m.store("ünï", prompt(0), kv(CHUNK, 0)).tokens());
      assertEquals(0, m.lookup("ünï", prompt(0)).cachedTokens());
      List<QuotaStats> stats = rt.quotaStats(0);
      assertEquals(List.of("z", "a", "ünï"), stats.stream().map(QuotaStats::namespace).toList());
      for (QuotaStats s : stats) assertEquals(namespaceHash(s.namespace()), s.namespaceHash());
      assertEquals(List.of(2 * CHUNK_HELD, 3 * CHUNK_HELD, 0L), stats.stream().map(QuotaStats::quotaBytes).toList());
      assertEquals(1, stats.get(2).refused());
      assertEquals(0, stats.get(2).objects());
    }
    // A tier without quotas has none to report.
    try (KdnRuntime rt = KdnRuntime.create(runtimeOf(roomFor20().withQuota("a", CHUNK_HELD), TierConfig.host(1 << 20)))) {
      assertEquals(namespaceHash("a"), rt.quotaStats(0).get(0).namespaceHash());
      assertEquals(List.of(), rt.quotaStats(1));
    }
  }

  @Test
  void testBadQuotasRefusedAtCreate() {
    // Two quotas for one namespace.
    RuntimeOptions twice = runtimeOf(roomFor20().withQuota("tenant-a", CHUNK_HELD).withQuota("tenant-a", 2 * CHUNK_HELD));
    InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(twice));
    assertTrue(e.getMessage().contains("two quotas"), e.getMessage());
    // An empty namespace.
    RuntimeOptions empty = runtimeOf(roomFor20().withQuota("tenant-a", CHUNK_HELD).withQuota("", CHUNK_HELD));
    e = assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(empty));
    assertTrue(e.getMessage().contains("quotas[1]"), e.getMessage());
    // A remote tier: the kdnd applies its own.
    RuntimeOptions remote = RuntimeOptions.builder().chunkTokens(CHUNK)
        .tier(TierConfig.remote("127.0.0.1:1", "t").withQuota("tenant-a", CHUNK_HELD)).build();
    e = assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(remote));
    assertTrue(e.getMessage().contains("kdnd"), e.getMessage());
  }

  @Test
  void testTierConfigQuotas() {
    TierConfig plain = TierConfig.host(1 << 20);
    TierConfig one = plain.withQuota("tenant-a", 1 << 16);
    TierConfig two = one.withQuota("tenant-b", -1); // unsigned: 2^64 - 1
    assertEquals(List.of(), plain.quotas()); // each withQuota is a copy
    assertEquals(List.of(new TierConfig.Quota("tenant-a", 1 << 16)), one.quotas());
    assertEquals(List.of("tenant-a", "tenant-b"), two.quotas().stream().map(TierConfig.Quota::namespace).toList());
    assertThrows(UnsupportedOperationException.class, () -> two.quotas().add(new TierConfig.Quota("x", 1)));
    assertThrows(NullPointerException.class, () -> plain.withQuota(null, 1));
    assertTrue(two.toString().contains("quotas [tenant-a=65536, tenant-b=18446744073709551615]"), two.toString());
    assertFalse(plain.toString().contains("quotas"), plain.toString());
  }

  /** Quotas need libkdn 1.13: an older one is refused by name. */
  @Test
  void testQuotaVersion() {
    TierConfig.checkQuotaSupported(11300);
    TierConfig.checkQuotaSupported(11401);
    VersionException e = assertThrows(VersionException.class, () -> TierConfig.checkQuotaSupported(11205));
    assertTrue(e.getMessage().startsWith("libkdn 1.12.5 does not take a tier's quotas (since 1.13)"), e.getMessage());
  }

  /** Each QuotaStats component carries its own native field. */
  @Test
  void testQuotaStatsFromNative() {
    NativeQuotaStats n = new NativeQuotaStats();
    try {
      n.setNs_hash("ab".repeat(32));
      n.setQuota_bytes(1);
      n.setUsed_bytes(2);
      n.setObjects(3);
      n.setQuota_evictions(4);
      n.setRoom_evictions(5);
      n.setRefused(6);
      assertEquals(new QuotaStats("ns", "ab".repeat(32), 1, 2, 3, 4, 5, 6), QuotaStats.from("ns", n));
    } finally {
      n.delete();
    }
  }
}

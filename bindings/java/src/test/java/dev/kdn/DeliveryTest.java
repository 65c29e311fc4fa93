// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * How loads are delivered: never slower than prefill (1.7: loadSlowerThanPrefill, the recompute
 * counters, the tiers' measured delivery), TTFT targets and quality levels (1.6), the COST policy
 * (1.5).
 */
class DeliveryTest {
  private static final int TOKENS = 4 * CHUNK;

  /** A runtime whose only tier is a disk tier: every load reads and decodes. */
  private static RuntimeOptions diskOnly(Path dir, boolean loadSlower) {
    return RuntimeOptions.builder().chunkTokens(CHUNK).tier(TierConfig.disk(dir, 16 << 20))
        .loadSlowerThanPrefill(loadSlower).build();
  }

  /**
   * A first load measures the disk tier; then the engine reports a prefill far faster than any
   * read (1 ns for a million tokens): the next load leaves every cached chunk to recompute, and
   * says so in the result and the counters.
   */
  @Test
  void testSlowerThanPrefillIsLeftToRecompute(@TempDir Path dir) {
    try (KdnRuntime rt = KdnRuntime.create(diskOnly(dir, false)); Model m = rt.createModel(spec())) {
      assertEquals(0, rt.stats().recomputeTokens());
      Request req = Request.ofTokens(tokens(TOKENS, 10));
      ByteBuffer in = kv(TOKENS, 2);
      assertEquals(TOKENS, m.store("ns", req, in).tokens());
      ByteBuffer out = Kdn.allocate(TOKENS * BYTES_PER_TOKEN);
      assertEquals(TOKENS, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      TierStats disk = rt.tierStats(0);
      assertEquals(TierKind.DISK, disk.kind());
      assertTrue(disk.deliveryNsPerToken() > 0, disk.toString());
      assertEquals(0, disk.deviceDeliveryNsPerToken()); // no load into device memory yet
      assertEquals(0, disk.recomputeChunks());

      m.reportPrefill(1_000_000, Duration.ofNanos(1));
      KvResult left = m.retrieve("ns", req, Kdn.allocate(TOKENS * BYTES_PER_TOKEN));
      assertEquals(TOKENS, left.covered());
      assertEquals(0, left.tokens());
      assertEquals(TOKENS, rt.stats().recomputeTokens());
      assertEquals(TOKENS / CHUNK, rt.tierStats(0).recomputeChunks());
      // A load op reports them as a failed range.
      try (Op op = m.loadAsync("ns", req, KvView.canonical(), Kdn.allocate(TOKENS * BYTES_PER_TOKEN))) {
        op.await();
        assertEquals(0, op.result().tokens());
        assertEquals(List.of(new TokenRange(0, TOKENS)), op.failedRanges());
      }
      assertEquals(2 * TOKENS, rt.stats().recomputeTokens());
    }
  }

  /** loadSlowerThanPrefill(true): every cached chunk is loaded, however slow its tier. */
  @Test
  void testLoadSlowerThanPrefill(@TempDir Path dir) {
    RuntimeOptions options = diskOnly(dir, true);
    assertTrue(options.loadSlowerThanPrefill());
    assertFalse(RuntimeOptions.builder().build().loadSlowerThanPrefill());
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(spec())) {
      Request req = Request.ofTokens(tokens(TOKENS, 10));
      ByteBuffer in = kv(TOKENS, 2);
      m.store("ns", req, in);
      assertEquals(TOKENS, m.retrieve("ns", req, Kdn.allocate(TOKENS * BYTES_PER_TOKEN)).tokens());
      m.reportPrefill(1_000_000, Duration.ofNanos(1));
      ByteBuffer out = Kdn.allocate(TOKENS * BYTES_PER_TOKEN);
      assertEquals(TOKENS, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      assertEquals(0, rt.stats().recomputeTokens());
      assertEquals(0, rt.tierStats(0).recomputeChunks());
    }
  }

  @Test
  void testTtftTarget() {
    Request plain = Request.ofTokens(tokens(TOKENS, 10));
    assertEquals(Duration.ZERO, plain.ttftTarget());
    Request within = plain.withTtftTarget(Duration.ofMillis(50));
    assertEquals(Duration.ofMillis(50), within.ttftTarget());
    assertEquals(plain.size(), within.size());
    assertEquals(Duration.ZERO, plain.ttftTarget(), "a copy: the original keeps none");
    assertTrue(within.toString().contains("50000 us"), within.toString());
    // Rounded up to whole microseconds: a target under one is still a target.
    assertEquals(Duration.ofNanos(1000), plain.withTtftTarget(Duration.ofNanos(1)).ttftTarget());
    assertEquals(Duration.ofNanos(3000), plain.withTtftTarget(Duration.ofNanos(2001)).ttftTarget());
    assertEquals(Duration.ZERO, within.withTtftTarget(Duration.ZERO).ttftTarget());
    assertEquals(Duration.of(Long.MAX_VALUE, java.time.temporal.ChronoUnit.MICROS),
        plain.withTtftTarget(Duration.ofSeconds(Long.MAX_VALUE)).ttftTarget());
    assertThrows(IllegalArgumentException.class, () -> plain.withTtftTarget(Duration.ofMillis(-1)));
    assertThrows(NullPointerException.class, () -> plain.withTtftTarget(null));
    // Block hashes keep theirs too.
    Request hashes = Request.ofBlockHashes(new byte[16], 8, CHUNK).withTtftTarget(Duration.ofMillis(3));
    assertTrue(hashes.usesHashes());
    assertEquals(2, hashes.size());
    assertEquals(Duration.ofMillis(3), hashes.ttftTarget());

    // Tiers without quality levels deliver everything whatever the target; lookups and stores ignore it.
    try (KdnRuntime rt = KdnRuntime.create(options()); Model m = rt.createModel(spec())) {
      ByteBuffer in = kv(TOKENS, 5);
      assertEquals(TOKENS, m.store("ns", within, in).tokens());
      assertEquals(TOKENS, m.lookup("ns", within).cachedTokens());
      ByteBuffer out = Kdn.allocate(TOKENS * BYTES_PER_TOKEN);
      assertEquals(TOKENS, m.retrieve("ns", plain.withTtftTarget(Duration.ofNanos(1)), out).tokens());
      assertEquals(in, out);
      ByteBuffer loaded = Kdn.allocate(TOKENS * BYTES_PER_TOKEN);
      try (Op op = m.loadAsync("ns", within, KvView.canonical(), loaded)) {
        op.await();
        assertEquals(TOKENS, op.result().tokens());
      }
      assertEquals(in, loaded);
    }
  }

  /** Quality levels (1.6): remote and redis tiers only, without a codec, each level a codec. */
  @Test
  void testTierLevels() {
    TierConfig remote = TierConfig.remote("127.0.0.1:1", "token").withTimeout(Duration.ofMillis(50));
    TierConfig leveled = remote.withLevels("zstd", "kdn:hifi", "kdn:balanced");
    assertEquals(List.of("zstd", "kdn:hifi", "kdn:balanced"), leveled.levels());
    assertEquals(List.of(), remote.levels(), "with* makes a copy");
    assertEquals(List.of("zstd"), remote.withLevels(List.of("zstd")).levels());
    assertTrue(leveled.toString().contains("levels"), leveled.toString());
    assertThrows(IllegalArgumentException.class, () -> remote.withLevels("zstd;kdn"));
    assertThrows(NullPointerException.class, () -> remote.withLevels("zstd", null));
    // Well formed: the runtime is made (no node needs to answer yet).
    try (KdnRuntime rt = KdnRuntime.create(
        RuntimeOptions.builder().chunkTokens(CHUNK).tier(TierConfig.host(1 << 20)).tier(leveled).build())) {
      assertEquals(TierKind.REMOTE, rt.tierStats(1).kind());
    }
    // kdn refuses the rest.
    for (TierConfig bad : List.of(TierConfig.host(1 << 20).withLevels("zstd", "kdn:balanced"),
        leveled.withCodec("zstd"), remote.withLevels("zstd", ""), remote.withLevels("zstd", "no-such-codec"))) {
      RuntimeOptions options = RuntimeOptions.builder().tier(bad).build();
      assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(options), bad.toString());
    }
  }

  /** The cost-aware policy (1.5) is a policy like the others. */
  @Test
  void testCostPolicy() {
    assertEquals(EvictionPolicy.COST, EvictionPolicy.fromNative(2));
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(CHUNK)
        .tier(TierConfig.host(1 << 20).withPolicy(EvictionPolicy.COST)).build();
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(spec())) {
      Request req = Request.ofTokens(tokens(TOKENS, 1));
      assertEquals(TOKENS, m.store("ns", req, kv(TOKENS, 0)).tokens());
      assertEquals(TOKENS, m.lookup("ns", req).cachedTokens());
    }
  }
}

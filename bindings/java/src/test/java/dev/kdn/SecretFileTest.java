// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The deployment's secret (1.8): chunks of disk and redis tiers are sealed with it. */
class SecretFileTest {
  /** A file of {@code bytes} bytes (each from {@code seed}), readable by its owner only. */
  private static Path secret(Path dir, String name, int bytes, int seed) throws IOException {
    byte[] b = new byte[bytes];
    for (int i = 0; i < bytes; ++i) b[i] = (byte) (seed + 31 * i);
    Path p = Files.write(dir.resolve(name), b);
    Files.setPosixFilePermissions(p, PosixFilePermissions.fromString("rw-------"));
    return p;
  }

  private static RuntimeOptions sealedDisk(Path tier, Path secret) {
    return RuntimeOptions.builder().chunkTokens(CHUNK).tier(TierConfig.disk(tier, 16 << 20)).secretFile(secret)
        .build();
  }

  @Test
  void testBadSecretFile(@TempDir Path dir) throws IOException {
    Path tier = dir.resolve("tier");
    // Too short: 31 bytes, one under kdn's minimum.
    Path shortOne = secret(dir, "short", 31, 1);
    KdnException e = assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(sealedDisk(tier, shortOne)));
    assertFalse(e.getMessage().isEmpty());
    // Open to others.
    Path open = secret(dir, "open", 32, 1);
    Files.setPosixFilePermissions(open, PosixFilePermissions.fromString("rw-r--r--"));
    assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(sealedDisk(tier, open)));
    // Not there.
    assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(sealedDisk(tier, dir.resolve("none"))));
  }

  /**
   * A good secret: the runtime seals what it stores and reads it back; a runtime with another
   * secret on the same directory finds nothing it can trust (misses, counted as auth failures).
   */
  @Test
  void testSealedChunks(@TempDir Path dir) throws IOException {
    Path tier = dir.resolve("tier");
    Path mine = secret(dir, "mine", 32, 1);
    RuntimeOptions options = sealedDisk(tier, mine);
    assertEquals(mine.toString(), options.secretFile());
    assertEquals("", RuntimeOptions.builder().build().secretFile());
    Request req = Request.ofTokens(tokens(2 * CHUNK, 40));
    ByteBuffer in = kv(2 * CHUNK, 7);
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(spec())) {
      assertEquals(2 * CHUNK, m.store("ns", req, in).tokens());
      ByteBuffer out = Kdn.allocate(2 * CHUNK * BYTES_PER_TOKEN);
      assertEquals(2 * CHUNK, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      assertEquals(0, rt.tierStats(0).authFailures());
    }
    // The same secret, in another file, on the same directory: the chunks are there.
    Path copy = secret(dir, "copy", 32, 1);
    try (KdnRuntime rt = KdnRuntime.create(sealedDisk(tier, copy)); Model m = rt.createModel(spec())) {
      ByteBuffer out = Kdn.allocate(2 * CHUNK * BYTES_PER_TOKEN);
      assertEquals(2 * CHUNK, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
    }
    // Another secret: a miss, and each chunk read counted as an auth failure (and dropped).
    Path other = secret(dir, "other", 48, 2);
    try (KdnRuntime rt = KdnRuntime.create(sealedDisk(tier, other)); Model m = rt.createModel(spec())) {
      ByteBuffer out = Kdn.allocate(2 * CHUNK * BYTES_PER_TOKEN);
      assertEquals(0, m.retrieve("ns", req, out).tokens());
      assertEquals(Kdn.allocate(2 * CHUNK * BYTES_PER_TOKEN), out);
      TierStats disk = rt.tierStats(0);
      assertTrue(disk.authFailures() >= 1, disk.toString());
      assertTrue(disk.corruptDetected() >= disk.authFailures(), disk.toString());
    }
  }
}

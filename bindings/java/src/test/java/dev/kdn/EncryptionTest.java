// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.PosixFilePermissions;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Random;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Encryption at rest (1.14): with master keys, a disk tier's chunks are AES-256-GCM encrypted;
 * without them (or with another key) they are misses, counted as auth failures.
 */
class EncryptionTest {
  /** Tokens stored: several chunks. */
  private static final int TOKENS = 16 * CHUNK;
  /** The search's unit: one token's K or V in one layer (f32, 2 heads x 4 dims). */
  private static final int BLOCK = 32;

  /** A random master key: 64 hex digits. */
  private static String key(Random random) {
    byte[] b = new byte[32];
    random.nextBytes(b);
    return HexFormat.of().formatHex(b);
  }

  /** A key file, one line each, with the permissions {@code perms} ("rw-------"). */
  private static Path keyFile(Path dir, String name, String perms, String... lines) throws IOException {
    Path p = Files.writeString(dir.resolve(name), String.join("\n", lines) + "\n");
    Files.setPosixFilePermissions(p, PosixFilePermissions.fromString(perms));
    return p;
  }

  /** KV as a model makes it: normally distributed f32, no two elements alike. */
  private static ByteBuffer realKv(int tokens, long seed) {
    ByteBuffer b = Kdn.allocate(tokens * BYTES_PER_TOKEN);
    FloatBuffer f = b.asFloatBuffer();
    Random random = new Random(seed);
    for (int i = 0; i < f.capacity(); ++i) f.put(i, (float) (random.nextGaussian() * 1.7));
    return b;
  }

  private static RuntimeOptions.Builder disk(Path tier) {
    // "raw": the chunks' bytes as given (disk tiers default to zstd, which would hide them anyway).
    return RuntimeOptions.builder().chunkTokens(CHUNK).tier(TierConfig.disk(tier, 16 << 20).withCodec("raw"));
  }

  /** Every regular file under {@code dir}, read whole. */
  private static List<byte[]> files(Path dir) throws IOException {
    List<byte[]> out = new ArrayList<>();
    try (Stream<Path> all = Files.walk(dir)) {
      for (Path p : (Iterable<Path>) all.filter(Files::isRegularFile)::iterator) out.add(Files.readAllBytes(p));
    }
    return out;
  }

  /** How many of the {@value #BLOCK}-byte blocks of {@code kv} appear in a file under {@code dir}. */
  private static int blocksInClear(Path dir, ByteBuffer kv) throws IOException {
    byte[] in = new byte[kv.remaining()];
    kv.duplicate().get(in);
    List<byte[]> files = files(dir);
    int found = 0;
    for (int b = 0; b + BLOCK <= in.length; b += BLOCK) {
      if (contains(files, in, b)) ++found;
    }
    return found;
  }

  private static boolean contains(List<byte[]> files, byte[] in, int from) {
    for (byte[] f : files) {
      for (int i = 0; i + BLOCK <= f.length; ++i) {
        if (f[i] == in[from] && Arrays.equals(f, i, i + BLOCK, in, from, from + BLOCK)) return true;
      }
    }
    return false;
  }

  /** What {@code options}' runtime retrieves of {@code req}: tokens, the buffer, the disk's auth failures. */
  private record Read(long tokens, ByteBuffer out, long authFailures) {}

  private static Read read(RuntimeOptions options, Request req) {
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(spec())) {
      ByteBuffer out = Kdn.allocate(TOKENS * BYTES_PER_TOKEN);
      long got = m.retrieve("ns", req, out).tokens();
      return new Read(got, out, rt.tierStats(0).authFailures());
    }
  }

  private static void store(RuntimeOptions options, Request req, ByteBuffer kv) {
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(spec())) {
      assertEquals(TOKENS, m.store("ns", req, kv).tokens());
    }
  }

  @Test
  void testEncryptedDiskTier(@TempDir Path dir) throws IOException {
    Random random = new Random(14);
    String mine = key(random);
    Path keys = keyFile(dir, "keys", "rw-------", mine);
    Request req = Request.ofTokens(tokens(TOKENS, 7));
    ByteBuffer in = realKv(TOKENS, 3);
    int blocks = TOKENS * BYTES_PER_TOKEN / BLOCK;

    // Without keys the search finds every block of the KV in the tier's files: it works.
    Path plain = dir.resolve("plain");
    store(disk(plain).build(), req, in);
    assertEquals(blocks, blocksInClear(plain, in));

    // With them: stored, read back whole, and no block of it in the clear.
    Path tier = dir.resolve("tier");
    RuntimeOptions sealed = disk(tier).encryptionKeyFile(keys).build();
    assertEquals(keys.toString(), sealed.encryptionKeyFile());
    assertEquals("", sealed.encryptionKeyEnv());
    try (KdnRuntime rt = KdnRuntime.create(sealed); Model m = rt.createModel(spec())) {
      assertEquals(TOKENS, m.store("ns", req, in).tokens());
      ByteBuffer out = Kdn.allocate(TOKENS * BYTES_PER_TOKEN);
      assertEquals(TOKENS, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      assertEquals(0, rt.tierStats(0).authFailures());
    }
    assertTrue(files(tier).stream().mapToLong(f -> f.length).sum() >= (long) TOKENS * BYTES_PER_TOKEN);
    assertEquals(0, blocksInClear(tier, in));

    // Another runtime with the key, and one with a rotated ring (a new key first), read it whole.
    Read again = read(sealed, req);
    assertEquals(new Read(TOKENS, in, 0), again);
    Path rotated = keyFile(dir, "rotated", "rw-------", key(random), mine);
    assertEquals(new Read(TOKENS, in, 0), read(disk(tier).encryptionKeyFile(rotated).build(), req));

    // Without keys: nothing (the buffer untouched), each chunk read an auth failure (and dropped).
    Read none = read(disk(tier).build(), req);
    assertEquals(0, none.tokens());
    assertEquals(Kdn.allocate(TOKENS * BYTES_PER_TOKEN), none.out());
    assertTrue(none.authFailures() >= 1, none.toString());

    // Stored again: another key gets nothing either.
    store(sealed, req, in);
    Path other = keyFile(dir, "other", "rw-------", key(random));
    Read wrong = read(disk(tier).encryptionKeyFile(other).build(), req);
    assertEquals(0, wrong.tokens());
    assertEquals(Kdn.allocate(TOKENS * BYTES_PER_TOKEN), wrong.out());
    assertTrue(wrong.authFailures() >= 1, wrong.toString());
  }

  @Test
  void testBadKeySources(@TempDir Path dir) throws IOException {
    Random random = new Random(15);
    Path tier = dir.resolve("tier");
    assertEquals("", RuntimeOptions.builder().build().encryptionKeyFile());
    assertEquals("", RuntimeOptions.builder().build().encryptionKeyEnv());

    // Readable by others.
    Path open = keyFile(dir, "open", "rw-r--r--", key(random));
    KdnException e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(disk(tier).encryptionKeyFile(open).build()));
    assertTrue(e.getMessage().contains("others"), e.getMessage());

    // Both sources at once.
    Path good = keyFile(dir, "good", "rw-------", key(random));
    e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(disk(tier).encryptionKeyFile(good).encryptionKeyEnv("KDN_TEST_KEYS").build()));
    assertTrue(e.getMessage().contains("not both"), e.getMessage());

    // A variable that is not set (Java cannot set one in its own process: the variant that reads
    // the keys from a variable is tested in Python).
    String unset = "KDN_JAVA_TEST_UNSET_MASTER_KEYS";
    assertNull(System.getenv(unset));
    e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(disk(tier).encryptionKeyEnv(unset).build()));
    assertTrue(e.getMessage().contains(unset) && e.getMessage().contains("not set"), e.getMessage());

    // A line that is not a key (63 hex digits): refused, and the message does not repeat it.
    String shortKey = key(random).substring(1);
    Path bad = keyFile(dir, "bad", "rw-------", key(random), shortKey);
    e = assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(disk(tier).encryptionKeyFile(bad).build()));
    assertTrue(e.getMessage().contains("line 2"), e.getMessage());
    assertFalse(e.getMessage().contains(shortKey), e.getMessage());

    // Not there.
    assertThrows(InvalidArgumentException.class,
        () -> KdnRuntime.create(disk(tier).encryptionKeyFile(dir.resolve("none")).build()));
    assertThrows(NullPointerException.class, () -> RuntimeOptions.builder().encryptionKeyEnv(null));
  }

  /** Master keys need libkdn 1.14: an older one is refused by name, never ignored. */
  @Test
  void testEncryptionVersion() {
    RuntimeOptions.checkEncryptionSupported(11400);
    RuntimeOptions.checkEncryptionSupported(11501);
    VersionException e = assertThrows(VersionException.class, () -> RuntimeOptions.checkEncryptionSupported(11305));
    assertTrue(e.getMessage().startsWith("libkdn 1.13.5 does not take master keys"), e.getMessage());
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** A request's salt (since 1.13): it enters every chunk key, so KV answers only its own salt. */
class SaltTest {
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

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  @Test
  void testSaltedStoreAnswersOnlyItsSalt() {
    int[] ids = tokens(8, 100);
    Request plain = Request.ofTokens(ids);
    Request alice = plain.withSalt(bytes("alice"));
    Request bob = plain.withSalt(bytes("bob"));
    ByteBuffer in = kv(8, 11);
    assertEquals(8, m.store("ns", alice, in).tokens());

    assertEquals(0, m.lookup("ns", plain).cachedTokens());
    assertEquals(8, m.lookup("ns", alice).cachedTokens());
    assertEquals(8, m.lookup("ns", Request.ofTokens(ids).withSalt(bytes("alice"))).cachedTokens());
    assertEquals(0, m.lookup("ns", bob).cachedTokens());

    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    KvResult got = m.retrieve("ns", alice, out);
    assertEquals(Status.OK, got.status());
    assertEquals(8, got.tokens());
    assertEquals(in, out); // bit for bit

    ByteBuffer untouched = kv(8, -1);
    assertEquals(0, m.retrieve("ns", bob, untouched).tokens());
    assertEquals(kv(8, -1), untouched);
    assertEquals(0, m.retrieve("ns", plain, Kdn.allocate(8 * BYTES_PER_TOKEN)).tokens());

    // Nor does unsalted KV answer a salted request.
    Request other = Request.ofTokens(tokens(8, 500));
    assertEquals(8, m.store("ns", other, kv(8, 2)).tokens());
    assertEquals(8, m.lookup("ns", other).cachedTokens());
    assertEquals(0, m.lookup("ns", other.withSalt(bytes("alice"))).cachedTokens());

    // A batch lookup takes each request's salt.
    List<LookupResult> batch = m.lookup("ns", List.of(plain, alice, bob, other));
    assertEquals(List.of(0L, 8L, 0L, 8L), batch.stream().map(LookupResult::cachedTokens).toList());
  }

  @Test
  void testSaltedBlockHashes() {
    byte[] hashes = new byte[2 * 16];
    for (int i = 0; i < hashes.length; ++i) hashes[i] = (byte) (i * 7 + 1);
    Request plain = Request.ofBlockHashes(hashes, 16, CHUNK);
    Request salted = plain.withSalt(bytes("tenant-a"));
    assertTrue(salted.usesHashes());
    assertEquals(2, salted.size());
    ByteBuffer in = kv(2 * CHUNK, 5);
    assertEquals(2 * CHUNK, m.store("ns", salted, in).tokens());
    assertEquals(0, m.lookup("ns", plain).cachedTokens());
    assertEquals(2 * CHUNK, m.lookup("ns", salted).cachedTokens());
    ByteBuffer out = Kdn.allocate(2 * CHUNK * BYTES_PER_TOKEN);
    assertEquals(2 * CHUNK, m.retrieve("ns", salted, out).tokens());
    assertEquals(in, out);
  }

  @Test
  void testAsyncWithSalt() throws Exception {
    Request salted = Request.ofTokens(tokens(8, 300)).withSalt(bytes("s1"));
    ByteBuffer in = kv(8, 9);
    // A save with the salt: found by the salt only.
    try (Op op = m.saveAsync("ns", salted, KvView.canonical(), in)) {
      for (int l = 0; l < LAYERS; ++l) op.layerReady(l);
      assertTrue(op.await(Duration.ofSeconds(10)));
      assertEquals(8, op.result().tokens());
    }
    assertEquals(0, m.lookup("ns", Request.ofTokens(tokens(8, 300))).cachedTokens());
    assertEquals(8, m.lookup("ns", salted).cachedTokens());

    // A load with the salt, its request unreachable once the op started (kdn copied the salt).
    ByteBuffer out = Kdn.allocate(8 * BYTES_PER_TOKEN);
    try (Op op = m.loadAsync("ns", Request.ofTokens(tokens(8, 300)).withSalt("s1"), KvView.canonical(), out)) {
      for (int i = 0; i < 3; ++i) System.gc();
      assertTrue(op.await(Duration.ofSeconds(10)));
      assertEquals(8, op.result().tokens());
    }
    assertEquals(in, out);

    // A load with another salt finds nothing.
    Request other = salted.withSalt(bytes("s2"));
    try (Op op = m.loadAsync("ns", other, KvView.canonical(), Kdn.allocate(8 * BYTES_PER_TOKEN))) {
      assertTrue(op.await(Duration.ofSeconds(10)));
      assertEquals(0, op.result().tokens());
    }
  }

  @Test
  void testSaltLength() {
    Request req = Request.ofTokens(tokens(8, 700));
    InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
        () -> req.withSalt(new byte[Request.MAX_SALT_BYTES + 1]));
    assertEquals(Status.INVALID_ARGUMENT, e.status());
    assertTrue(e.getMessage().contains("4096"), e.getMessage());
    assertThrows(InvalidArgumentException.class, () -> req.withSalt("x".repeat(Request.MAX_SALT_BYTES + 1)));
    assertFalse(req.hasSalt()); // unchanged

    byte[] longest = new byte[Request.MAX_SALT_BYTES];
    longest[0] = 1;
    Request salted = req.withSalt(longest);
    assertEquals(8, m.store("ns", salted, kv(8, 1)).tokens());
    assertEquals(8, m.lookup("ns", salted).cachedTokens());
    assertEquals(0, m.lookup("ns", req).cachedTokens());
    longest[1] = 1; // the request holds its own copy
    assertEquals(8, m.lookup("ns", salted).cachedTokens());
    assertEquals(0, m.lookup("ns", req.withSalt(longest)).cachedTokens());
  }

  @Test
  void testSaltAccessors() {
    Request plain = Request.ofTokens(tokens(8, 900));
    assertFalse(plain.hasSalt());
    assertArrayEquals(new byte[0], plain.salt());

    Request salted = plain.withSalt("café");
    assertTrue(salted.hasSalt());
    assertArrayEquals(bytes("café"), salted.salt());
    salted.salt()[0] = 0; // a copy
    assertArrayEquals(bytes("café"), salted.salt());
    assertEquals(8, salted.size());
    assertFalse(plain.hasSalt()); // the original is unchanged

    // The String form is its UTF-8 bytes: the same keys.
    assertEquals(8, m.store("ns", salted, kv(8, 4)).tokens());
    assertEquals(8, m.lookup("ns", plain.withSalt(bytes("café"))).cachedTokens());

    // The TTFT target keeps the salt, and the salt keeps the target.
    Request both = salted.withTtftTarget(Duration.ofMillis(5));
    assertArrayEquals(bytes("café"), both.salt());
    assertEquals(8, m.lookup("ns", both).cachedTokens());
    Request resalted = plain.withTtftTarget(Duration.ofMillis(5)).withSalt("café");
    assertEquals(Duration.ofMillis(5), resalted.ttftTarget());
    assertEquals(8, m.lookup("ns", resalted).cachedTokens());

    // An empty salt is none.
    Request unsalted = salted.withSalt(new byte[0]);
    assertFalse(unsalted.hasSalt());
    assertEquals(0, m.lookup("ns", unsalted).cachedTokens());

    // toString says a request is salted, never the salt.
    assertTrue(salted.toString().contains("salted"), salted.toString());
    assertFalse(salted.toString().contains("caf"), salted.toString());
    assertFalse(plain.toString().contains("salted"), plain.toString());

    assertThrows(NullPointerException.class, () -> plain.withSalt((byte[]) null));
    assertThrows(NullPointerException.class, () -> plain.withSalt((String) null));
  }

  @Test
  void testSaltNeedsLibkdn113() {
    Request.checkSaltSupported(Kdn.versionNumber());
    Request.checkSaltSupported(11300);
    Request.checkSaltSupported(11401);
    VersionException e = assertThrows(VersionException.class, () -> Request.checkSaltSupported(11205));
    assertTrue(e.getMessage().contains("1.12.5"), e.getMessage());
  }
}

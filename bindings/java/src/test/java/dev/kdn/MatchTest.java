// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.TestSupport.ReferenceKv;
import java.util.Arrays;
import java.util.List;
import java.util.stream.IntStream;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * {@link Model#match} (kdn_kv_match, 1.9): where documents put with the knowledge API occur in a
 * context's tokens. The documents are pieces of the reference model's prompt (the examples' KV):
 * "intro" its first 19 tokens with their KV, "body" the next 23 with the prompt's KV at those
 * positions (matching reads tokens; the KV only has to be the model's).
 */
class MatchTest {
  private static final int CHUNK = 16;
  private static ReferenceKv ref;

  private KdnRuntime rt;
  private Model m;
  private int[] intro;
  private int[] body;

  @BeforeAll
  static void loadReference() {
    ref = ReferenceKv.load();
  }

  @BeforeEach
  void open() {
    rt = KdnRuntime.create(RuntimeOptions.builder().chunkTokens(CHUNK).tier(TierConfig.host(16 << 20)).build());
    m = rt.createModel(ReferenceKv.spec());
    intro = Arrays.copyOfRange(ref.tokens(), 0, 19);  // chunks of 16 and 3 tokens
    body = Arrays.copyOfRange(ref.tokens(), 19, 42);  // 16 and 7
    m.knowledgePut("kb", "intro", 1, "", Request.ofTokens(intro), KvView.canonical(), ref.canonical(0, 19));
    m.knowledgePut("kb", "body", 1, "", Request.ofTokens(body), KvView.canonical(), ref.canonical(19, 42));
  }

  @AfterEach
  void close() {
    m.close();
    rt.close();
  }

  /** Tokens of no document (the prompt's ids are 1 and 261..433). */
  private static int[] other(int n, int first) {
    return IntStream.range(first, first + n).toArray();
  }

  private static int[] concat(int[]... parts) {
    return Arrays.stream(parts).flatMapToInt(Arrays::stream).toArray();
  }

  @Test
  void testMatchFindsTheDocumentsInAContext() {
    // [5], body, 3 other tokens, intro, a 5-token question: 51 tokens.
    Request context = Request.ofTokens(concat(other(1, 5), body, other(3, 7), intro, other(5, 10)));
    assertEquals(51, context.size());
    assertEquals(List.of(new TokenRange(1, 24), new TokenRange(27, 46)), m.match("kb", context));
    // At any offset. The intro's short last chunk (its last 3 tokens, with
    // 16-token chunks) counts only right after its first chunk: alone, a few
    // tokens recur by chance. Its first chunk alone is found.
    assertEquals(List.of(),
        m.match("kb", Request.ofTokens(concat(other(2, 7), Arrays.copyOfRange(intro, 16, 19), other(1, 7)))));
    assertEquals(List.of(new TokenRange(0, 16)), m.match("kb", Request.ofTokens(intro, 0, 17)));
    // A context of no document, and another namespace, which holds none of them.
    assertEquals(List.of(), m.match("kb", Request.ofTokens(other(40, 5))));
    assertEquals(List.of(), m.match("other", context));
    // A document deleted is no longer found: its tokens are the engine's to compute.
    m.knowledgeDelete("kb", "body");
    assertEquals(List.of(new TokenRange(27, 46)), m.match("kb", context));
  }

  @Test
  void testBadArguments() {
    assertThrows(InvalidArgumentException.class, () -> m.match("kb", Request.ofTokens()));
    InvalidArgumentException negative =
        assertThrows(InvalidArgumentException.class, () -> m.match("kb", Request.ofTokens(1, -2, 3)));
    assertTrue(negative.getMessage().contains("negative id -2"), negative.getMessage());
    InvalidArgumentException hashes = assertThrows(InvalidArgumentException.class,
        () -> m.match("kb", Request.ofBlockHashes(new byte[64], 32, CHUNK)));
    assertTrue(hashes.getMessage().contains("block hashes"), hashes.getMessage());
    assertThrows(NullPointerException.class, () -> m.match(null, Request.ofTokens(intro)));
    assertThrows(NullPointerException.class, () -> m.match("kb", null));
    m.close();
    assertThrows(IllegalStateException.class, () -> m.match("kb", Request.ofTokens(intro)));
  }
}

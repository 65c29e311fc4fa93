// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

class KnowledgeTest {
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
  void testPutInfoListFetch() {
    int[] ids = tokens(10, 200);
    ByteBuffer in = kv(10, 7);
    m.knowledgePut("kb", "doc-b", 3, "{\"title\": \"b\"}", Request.ofTokens(ids), KvView.canonical(), in);
    m.knowledgePut("kb", "doc-a", 1, "", Request.ofTokens(tokens(4, 1)), KvView.canonical(), kv(4, 0));
    m.knowledgePut("kb", "ünï-🙂", 1, "", Request.ofTokens(tokens(4, 9)), KvView.canonical(), kv(4, 0));

    DocumentInfo info = m.knowledgeInfo("kb", "doc-b");
    assertEquals("doc-b", info.docId());
    assertEquals(3, info.version());
    assertEquals(10, info.numTokens());
    assertEquals(3, info.chunks());
    assertEquals(3, info.chunksPresent());
    assertFalse(info.pinned());
    assertEquals(-1, info.expiresInMs());
    assertEquals(0, info.hits());

    List<DocumentInfo> docs = m.knowledgeList("kb");
    assertEquals(List.of("doc-a", "doc-b", "ünï-🙂"), docs.stream().map(DocumentInfo::docId).toList());
    assertTrue(m.knowledgeList("other").isEmpty());
    assertEquals(4, m.knowledgeInfo("kb", "ünï-🙂").numTokens());

    ByteBuffer out = Kdn.allocate(16 * BYTES_PER_TOKEN);
    FetchResult f = m.knowledgeFetch("kb", "doc-b", KvView.canonical(16), out);
    assertArrayEquals(ids, f.tokens());
    assertEquals(10, f.result().tokens());
    assertEquals(3, m.knowledgeInfo("kb", "doc-b").hits()); // each chunk fetched (since 1.4)
    // The canonical layout for 16 tokens of room: layer 0's K is the first 10 tokens' K.
    int tokenElems = HEADS * HEAD_DIM;
    for (int i = 0; i < 10 * tokenElems; ++i) {
      assertEquals(in.asFloatBuffer().get(i), out.asFloatBuffer().get(i));
    }
  }

  @Test
  void testPinExpireDelete() {
    m.knowledgePut("kb", "doc", 1, "", Request.ofTokens(tokens(8, 1)), KvView.canonical(), kv(8, 0));
    m.knowledgePin("kb", "doc", Duration.ZERO);
    assertTrue(m.knowledgeInfo("kb", "doc").pinned());
    assertEquals(-1, m.knowledgeInfo("kb", "doc").pinExpiresInMs()); // until unpinned
    assertTrue(rt.stats().pinsActive() > 0);
    m.knowledgeUnpin("kb", "doc");
    assertFalse(m.knowledgeInfo("kb", "doc").pinned());
    m.knowledgePin("kb", "doc", Duration.ofMinutes(1)); // a pin with a TTL says when it ends (1.4)
    long pinLeft = m.knowledgeInfo("kb", "doc").pinExpiresInMs();
    assertTrue(pinLeft > 50_000 && pinLeft <= 60_000, Long.toString(pinLeft));
    m.knowledgeUnpin("kb", "doc");
    m.knowledgeExpire("kb", "doc", Duration.ofHours(1));
    long left = m.knowledgeInfo("kb", "doc").expiresInMs();
    assertTrue(left > 0 && left <= 3_600_000, Long.toString(left));
    m.knowledgeDelete("kb", "doc");
    assertThrows(NotFoundException.class, () -> m.knowledgeInfo("kb", "doc"));

    m.knowledgePut("kb", "soon", 1, "", Request.ofTokens(tokens(4, 1)), KvView.canonical(), kv(4, 0));
    m.knowledgeExpire("kb", "soon", Duration.ZERO);
    waitUntil("the expired document to go", () -> m.knowledgeList("kb").isEmpty());
  }
}

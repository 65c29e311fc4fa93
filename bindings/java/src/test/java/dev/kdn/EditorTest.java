// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static dev.kdn.TestSupport.*;
import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.swig.NativeChunkInfo;
import dev.kdn.swig.NativeEditor;
import dev.kdn.swig.NativeGuardedEditor;
import dev.kdn.swig.NativeModelSpec;
import dev.kdn.swig.NativeRuntime;
import dev.kdn.swig.NativeRuntimeOptions;
import java.lang.ref.WeakReference;
import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

class EditorTest {
  /** Adds 1 to every element of layer 0's V; remembers the chunks and threads it saw. */
  static final class AddOne implements Editor {
    final List<ChunkInfo> chunks = new CopyOnWriteArrayList<>();
    final List<Thread> threads = new CopyOnWriteArrayList<>();

    @Override
    public boolean edit(ChunkInfo chunk, ByteBuffer kv) {
      chunks.add(chunk);
      threads.add(Thread.currentThread());
      FloatBuffer f = kv.asFloatBuffer();
      int span = chunk.numTokens() * chunk.numKvHeads() * chunk.headDim(); // layer 0's K, then its V
      for (int i = span; i < 2 * span; ++i) f.put(i, f.get(i) + 1);
      return true;
    }
  }

  @Test
  void testEditorEditsOnTheMoverThread() {
    AddOne editor = new AddOne();
    try (KdnRuntime rt = KdnRuntime.create(options(), editor); Model m = rt.createModel(spec())) {
      Request req = Request.ofTokens(tokens(CHUNK, 33));
      ByteBuffer in = kv(CHUNK, 0);
      assertEquals(CHUNK, m.store("ns", req, in).tokens());
      waitUntil("the edit", () -> rt.stats().edits() >= 1);
      assertEquals(1, editor.chunks.size());
      ChunkInfo c = editor.chunks.get(0);
      assertEquals(new ChunkInfo(LAYERS, HEADS, HEAD_DIM, CHUNK, DType.F32, 0), c);
      Thread mover = editor.threads.get(0);
      assertNotSame(Thread.currentThread(), mover);
      assertTrue(mover.isDaemon(), "kdn's thread is attached as a daemon");
      assertEquals(kv(CHUNK, 0), in, "the caller's buffer is not edited");

      // The edited chunk replaces the stored one a moment after the edit counts.
      int span = CHUNK * HEADS * HEAD_DIM;
      ByteBuffer out = Kdn.allocate(CHUNK * BYTES_PER_TOKEN);
      waitUntil("the edited chunk", () -> {
        m.retrieve("ns", req, out);
        return out.asFloatBuffer().get(span) == in.asFloatBuffer().get(span) + 1;
      });
      FloatBuffer o = out.asFloatBuffer();
      FloatBuffer i = in.asFloatBuffer();
      for (int e = 0; e < o.capacity(); ++e) {
        float want = i.get(e) + (e >= span && e < 2 * span ? 1 : 0);
        assertEquals(want, o.get(e), "element " + e);
      }
      assertTrue(rt.stats().editedServed() >= 1);
      assertTrue(rt.editorFailure().isEmpty());
    }
  }

  @Test
  void testBadEditorThrows() {
    Editor throwing = (chunk, kv) -> {
      kv.putFloat(0, 1e9f); // a write before the throw must not stick
      throw new IllegalStateException("editor failed on purpose");
    };
    try (KdnRuntime rt = KdnRuntime.create(options(), throwing); Model m = rt.createModel(spec())) {
      Request req = Request.ofTokens(tokens(CHUNK, 44));
      ByteBuffer in = kv(CHUNK, 2);
      assertEquals(CHUNK, m.store("ns", req, in).tokens());
      waitUntil("the editor's failure", () -> rt.editorFailure().isPresent());
      Throwable t = rt.editorFailure().get();
      assertEquals("editor failed on purpose", t.getMessage());
      // The runtime goes on; the chunk is as stored, and no edit counted.
      assertEquals(0, rt.stats().edits());
      ByteBuffer out = Kdn.allocate(CHUNK * BYTES_PER_TOKEN);
      assertEquals(CHUNK, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      Request more = Request.ofTokens(tokens(CHUNK, 55));
      assertEquals(CHUNK, m.store("ns", more, in).tokens());
      assertEquals(CHUNK, m.lookup("ns", more).cachedTokens());
    }
  }

  @Test
  void testEditorManyChunksAndFailures() {
    // Every other chunk fails: the mover thread stays attached and keeps working.
    AtomicInteger calls = new AtomicInteger();
    Editor flaky = (chunk, kv) -> {
      if (calls.getAndIncrement() % 2 == 1) throw new ArithmeticException("odd chunk");
      kv.putFloat(0, -1);
      return true;
    };
    try (KdnRuntime rt = KdnRuntime.create(options(), flaky); Model m = rt.createModel(spec())) {
      for (int i = 0; i < 16; ++i) {
        m.store("ns", Request.ofTokens(tokens(8 * CHUNK, 1000 + 100 * i)), kv(8 * CHUNK, i));
      }
      waitUntil("128 edits tried, 64 done", () -> calls.get() == 128 && rt.stats().edits() == 64);
      assertInstanceOf(ArithmeticException.class, rt.editorFailure().orElseThrow());
    }
  }

  @Test
  void testEditorReturningFalseChangesNothing() {
    Editor untouched = (chunk, kv) -> false;
    try (KdnRuntime rt = KdnRuntime.create(options(), untouched); Model m = rt.createModel(spec())) {
      Request req = Request.ofTokens(tokens(CHUNK, 66));
      m.store("ns", req, kv(CHUNK, 1));
      ByteBuffer out = Kdn.allocate(CHUNK * BYTES_PER_TOKEN);
      assertEquals(CHUNK, m.retrieve("ns", req, out).tokens());
      assertEquals(kv(CHUNK, 1), out);
    }
  }

  @Test
  void testEditorOutlivesRuntimeHandle() {
    // The runtime is closed first and nothing references the editor but the binding: the
    // model's stores still reach it.
    KdnRuntime rt = KdnRuntime.create(options(), new AddOne());
    Model m = rt.createModel(spec());
    rt.close();
    System.gc();
    m.store("ns", Request.ofTokens(tokens(CHUNK, 77)), kv(CHUNK, 0));
    waitUntil("the edit", () -> {
      System.gc();
      return m.runtime().editorFailure().isEmpty() && edits(m) >= 1;
    });
    m.close();
  }

  /**
   * A director with no Java edit() to call (SWIG's plain NativeEditor): SWIG leaves an exception
   * pending on kdn's mover thread and returns false. The binding clears it and fails the edit: the
   * failure shows in editorFailure(), no edit counts, the chunk is as stored, and the thread goes
   * on calling the editor for the next chunks.
   */
  @Test
  void testBadEditorWithNoJavaMethod() {
    RuntimeOptions options = options();
    try (KdnRuntime rt = KdnRuntime.make(options::toNative, () -> new Core(new NativeEditor()));
        Model m = rt.createModel(spec())) {
      Request req = Request.ofTokens(tokens(CHUNK, 88));
      ByteBuffer in = kv(CHUNK, 3);
      assertEquals(CHUNK, m.store("ns", req, in).tokens());
      waitUntil("the failed edit", () -> rt.editorFailure().isPresent());
      Throwable t = rt.editorFailure().get();
      assertInstanceOf(IllegalStateException.class, t);
      assertTrue(t.getMessage().contains("no Java object"), t.getMessage());
      ByteBuffer out = Kdn.allocate(CHUNK * BYTES_PER_TOKEN);
      assertEquals(CHUNK, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
      // The mover thread was left clean: it edits (and fails) the next chunks the same way.
      m.store("ns", Request.ofTokens(tokens(3 * CHUNK, 500)), kv(3 * CHUNK, 0));
      waitUntil("four failed edits", () -> rt.editorFailure().get().getMessage().contains(" 4 time"));
      assertEquals(0, rt.stats().edits());
    }
  }

  /**
   * The director's Java object is gone (SWIG holds it weakly; here nothing else does): kdn's upcall
   * finds null. The guarded editor clears the exception SWIG left pending and fails the edit.
   */
  @Test
  void testBadEditorJavaObjectGone() {
    AtomicInteger calls = new AtomicInteger();
    NativeGuardedEditor guarded = guardUnreferenced(calls);
    NativeRuntimeOptions o = options().toNative();
    NativeModelSpec s = spec().toNative();
    NativeRuntime rt = new NativeRuntime(o, guarded);
    try (Model m = new Model(rt.create_model(s), spec(), null, new Core((Editor) null))) {
      // Collect the director: only SWIG's weak reference to it is left.
      waitUntil("the director to be collected", () -> {
        System.gc();
        return director.get() == null;
      });
      Request req = Request.ofTokens(tokens(2 * CHUNK, 600));
      ByteBuffer in = kv(2 * CHUNK, 5);
      assertEquals(2 * CHUNK, m.store("ns", req, in).tokens());
      waitUntil("two lost upcalls", () -> guarded.lost_calls() == 2);
      assertEquals(0, calls.get());
      assertEquals(0, rt.stats().getEdits());
      ByteBuffer out = Kdn.allocate(2 * CHUNK * BYTES_PER_TOKEN);
      assertEquals(2 * CHUNK, m.retrieve("ns", req, out).tokens());
      assertEquals(in, out);
    } finally {
      rt.close();
      rt.delete();
      s.delete();
      o.delete();
      guarded.delete(); // the collected director's C++ half stays: nothing can reach it
    }
  }

  private static WeakReference<NativeEditor> director = new WeakReference<>(null);

  /** A guarded director that only SWIG's weak reference (and {@link #director}) holds. */
  private static NativeGuardedEditor guardUnreferenced(AtomicInteger calls) {
    NativeEditor d = new NativeEditor() {
      @Override
      public boolean edit(NativeChunkInfo info, ByteBuffer kv) {
        calls.incrementAndGet();
        return true;
      }
    };
    director = new WeakReference<>(d);
    return new NativeGuardedEditor(d);
  }

  private static long edits(Model m) {
    // The runtime handle is closed; a second model of a fresh runtime cannot see these stats, so
    // look at what the editor left in the cache instead: layer 0's V plus one.
    ByteBuffer out = Kdn.allocate(CHUNK * BYTES_PER_TOKEN);
    m.retrieve("ns", Request.ofTokens(tokens(CHUNK, 77)), out);
    int span = CHUNK * HEADS * HEAD_DIM;
    return out.asFloatBuffer().get(span) == kv(CHUNK, 0).asFloatBuffer().get(span) + 1 ? 1 : 0;
  }
}

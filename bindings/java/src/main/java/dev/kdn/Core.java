// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeChunkInfo;
import dev.kdn.swig.NativeEditor;
import dev.kdn.swig.NativeGuardedEditor;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * What a runtime, its models and its ops share: the editor, which kdn may call until the last of
 * them is closed (kdn.h: the editor's user data outlives the runtime's handles). Each open handle
 * holds one reference; the last release deletes the native editor. SWIG's director holds its Java
 * object only weakly, so this is what keeps the editor alive.
 */
final class Core {
  /** The Java director (null without an editor). */
  private final NativeEditor director;
  /** What kdn calls: the director, guarded (kdn.i's GuardedEditor); null without an editor. */
  private final NativeGuardedEditor guarded;
  private final AtomicInteger refs = new AtomicInteger(1);

  Core(Editor editor) {
    this(editor == null ? null : new Bridge(editor));
  }

  /** Over any director: {@link Bridge} in the API, others in tests. */
  Core(NativeEditor director) {
    this.director = director;
    if (director == null) {
      guarded = null;
      return;
    }
    try {
      guarded = new NativeGuardedEditor(director);
    } catch (RuntimeException | Error e) {
      director.delete();
      throw e;
    }
  }

  /** The native editor kdn calls (null without one). */
  NativeEditor nativeEditor() {
    return guarded;
  }

  /**
   * The Java editor's last exception, else an {@link IllegalStateException} when kdn found no Java
   * object to call (kdn.i's GuardedEditor); null when neither happened.
   */
  Throwable editorFailure() {
    Throwable t = director instanceof Bridge b ? b.failure.get() : null;
    if (t != null || guarded == null) return t;
    long lost = guarded.lost_calls();
    return lost == 0 ? null
        : new IllegalStateException("kdn called the editor " + lost + " time(s) and found no Java object to call"
            + " (each chunk was left as it was)");
  }

  void acquire() {
    refs.incrementAndGet();
  }

  void release() {
    if (refs.decrementAndGet() == 0 && guarded != null) {
      guarded.delete();
      director.delete();
    }
  }

  /** Every reference was released (the native editor, if any, is deleted). */
  boolean isReleased() {
    return refs.get() == 0;
  }

  /** The director kdn's mover thread calls: the user's editor over kdn's memory. */
  static final class Bridge extends NativeEditor {
    private final Editor editor;
    final AtomicReference<Throwable> failure = new AtomicReference<>();

    Bridge(Editor editor) {
      this.editor = editor;
    }

    @Override
    public boolean edit(NativeChunkInfo info, ByteBuffer kv) {
      try {
        return editor.edit(Natives.chunkInfo(info), kv.order(ByteOrder.nativeOrder()));
      } catch (Throwable t) {
        // Kept for KdnRuntime.editorFailure(); thrown on, it becomes a failed status in C++ and the
        // chunk stays as it was.
        failure.set(t);
        throw t;
      }
    }
  }

  /**
   * A handle's native object. {@link #close()} closes it once (the handle's close, or the Cleaner
   * for a handle nobody closed) and drops the handle's reference; it may race a call another
   * thread is making on the handle (kdn_binding.hpp's guard makes that call wait or fail). The
   * Cleaner's {@link #run()} also deletes the native object: only then, since no thread can be
   * inside a call once the handle is unreachable (each call fences it), while one can be inside
   * a call when {@code close()} runs.
   */
  static final class Release implements Runnable {
    private final Runnable close;
    private final Runnable delete;
    private final Core core;
    @SuppressWarnings("unused") // kept reachable until the native object is closed
    private final Object keep;
    private final AtomicBoolean closed = new AtomicBoolean();

    Release(Runnable close, Runnable delete, Core core, Object keep) {
      this.close = close;
      this.delete = delete;
      this.core = core;
      this.keep = keep;
    }

    void close() {
      if (!closed.compareAndSet(false, true)) return;
      try {
        close.run();
      } finally {
        core.release();
      }
    }

    @Override
    public void run() {
      try {
        close();
      } finally {
        delete.run();
      }
    }
  }
}

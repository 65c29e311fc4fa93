package dev.kdn;

import dev.kdn.swig.NativeChunkInfo;
import dev.kdn.swig.NativeEditor;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

/**
 * What a runtime, its models and its ops share: the editor, which kdn may call until the last of
 * them is closed (kdn.h: the editor's user data outlives the runtime's handles). Each open handle
 * holds one reference; the last release deletes the native editor. SWIG's director holds its Java
 * object only weakly, so this is what keeps the editor alive.
 */
final class Core {
  private final Bridge editor;
  private final AtomicInteger refs = new AtomicInteger(1);

  Core(Editor editor) {
    this.editor = editor == null ? null : new Bridge(editor);
  }

  /** The native editor (null without one). */
  NativeEditor nativeEditor() {
    return editor;
  }

  Throwable editorFailure() {
    return editor == null ? null : editor.failure.get();
  }

  void acquire() {
    refs.incrementAndGet();
  }

  void release() {
    if (refs.decrementAndGet() == 0 && editor != null) editor.delete();
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
        // Kept for Runtime.editorFailure(); thrown on, it becomes a failed status in C++ and the
        // chunk stays as it was.
        failure.set(t);
        throw t;
      }
    }
  }

  /** A handle's release: closes and deletes its native object, then drops its reference. */
  static final class Release implements Runnable {
    private final Runnable close;
    private final Core core;
    @SuppressWarnings("unused") // kept reachable until the native object is closed
    private final Object keep;

    Release(Runnable close, Core core, Object keep) {
      this.close = close;
      this.core = core;
      this.keep = keep;
    }

    @Override
    public void run() {
      try {
        close.run();
      } finally {
        core.release();
      }
    }
  }
}

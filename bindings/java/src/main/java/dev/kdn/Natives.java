// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeChunkInfo;
import dev.kdn.swig.NativeDocumentInfo;
import dev.kdn.swig.NativeKvResult;
import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.ByteBuffer;
import java.util.Objects;

/** What the handles share: the Cleaner, argument checks, copies of native results. */
final class Natives {
  private Natives() {}

  /** Frees native objects nobody closed (a backstop for the handles; the only way for values). */
  static final Cleaner CLEANER = Cleaner.create();

  /**
   * Keeps a handle's or value's wrapper reachable until here: its Cleaner must not free the native
   * object while a native call uses it (the JIT may consider a wrapper dead once its native
   * pointer was read). Called in a finally block after each native call.
   */
  static void fence(Object a) {
    Reference.reachabilityFence(a);
  }

  static void fence(Object a, Object b) {
    Reference.reachabilityFence(a);
    Reference.reachabilityFence(b);
  }

  static void fence(Object a, Object b, Object c) {
    Reference.reachabilityFence(a);
    Reference.reachabilityFence(b);
    Reference.reachabilityFence(c);
  }

  /** A buffer kdn reads: direct (kdn uses it whole, from its address to its capacity). */
  static ByteBuffer readable(ByteBuffer kv) {
    Objects.requireNonNull(kv, "kv");
    if (!kv.isDirect()) {
      throw new IllegalArgumentException("kdn needs a direct ByteBuffer (ByteBuffer.allocateDirect or Kdn.allocate)");
    }
    return kv;
  }

  /** A buffer kdn writes: direct and not read-only. */
  static ByteBuffer writable(ByteBuffer kv) {
    readable(kv);
    if (kv.isReadOnly()) throw new IllegalArgumentException("kdn cannot write into a read-only ByteBuffer");
    return kv;
  }

  static KvView checkView(KvView view, ModelSpec spec) {
    Objects.requireNonNull(view, "view");
    if (view.dtype() != null && view.dtype() != spec.dtype()) {
      throw new InvalidArgumentException("the view's dtype " + view.dtype() + " is not the model's " + spec.dtype());
    }
    return view;
  }

  /** From the JNI layer's [state, status, tokens, covered, num_failed, flags]. */
  static KvResult kvResult(long[] r) {
    return new KvResult(OpState.fromNative((int) r[0]), Status.fromNative((int) r[1]), r[2], r[3], r[4], (int) r[5]);
  }

  /** A result kdn_binding.hpp keeps inside another (not deleted). */
  static KvResult kvResult(NativeKvResult r) {
    return new KvResult(OpState.fromNative(r.getState()), Status.fromNative(r.getStatus()), r.getTokens(),
        r.getCovered(), r.getNum_failed(), (int) r.getFlags());
  }

  /** From the JNI layer's [status, cached_tokens, num_tiers, tier_tokens...]. */
  static LookupResult lookupResult(long[] r) {
    return new LookupResult(Status.fromNative((int) r[0]), r[1], java.util.Arrays.copyOfRange(r, 3, 3 + (int) r[2]));
  }

  static DocumentInfo documentInfo(NativeDocumentInfo d) {
    try {
      return new DocumentInfo(d.getDoc_id(), d.getPinned(), d.getVersion(), d.getNum_tokens(), (int) d.getChunks(),
          (int) d.getChunks_present(), d.getExpires_in_ms(), d.getHits(),
          d.getPin_expires_in_ms());
    } finally {
      d.delete();
    }
  }

  /** Borrowed (the director's argument): not deleted. */
  static ChunkInfo chunkInfo(NativeChunkInfo c) {
    return new ChunkInfo((int) c.getNum_layers(), (int) c.getNum_kv_heads(), (int) c.getHead_dim(),
        (int) c.getNum_tokens(), DType.fromNative(c.getDtype()), c.getFirst_position());
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import java.nio.ByteBuffer;

/**
 * Rewrites each stored chunk's KV in place, after it is stored and before it reaches the lower
 * tiers (offline KV editing; experimental in kdn.h). Given to {@link KdnRuntime#create(RuntimeOptions,
 * Editor)}.
 *
 * <p>Called on the runtime's background mover thread (a thread the JVM did not create: the binding
 * attaches it as a daemon), one chunk at a time. {@code kv} is kdn's own memory, direct and in the
 * machine's byte order, in the canonical layout [layer][k|v][token][kv_head][head_dim]; it is valid
 * only during the call: never keep it. The editor must not call kdn (its calls fail there).
 *
 * <p>Return true when it changed the KV. An exception it throws leaves the chunk as it was and is
 * kept in {@link KdnRuntime#editorFailure()}; the runtime goes on.
 */
@FunctionalInterface
public interface Editor {
  boolean edit(ChunkInfo chunk, ByteBuffer kv);
}

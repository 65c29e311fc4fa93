// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeOp;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.TimeUnit;

/**
 * An asynchronous load or save (kdn_op), from {@link Model#loadAsync} or {@link Model#saveAsync}.
 * It keeps its {@code ByteBuffer} (or {@link DeviceMemory}) until it is closed: closing cancels it
 * if it still runs and waits until kdn no longer touches the memory.
 *
 * <p>The waits are {@code await} ({@code Object.wait} is final in Java): true when the op ended
 * (it throws the op's {@link KdnException} if it failed, {@link KdnCancelledException} if it was
 * cancelled), false when the time ran out first (the op goes on).
 *
 * <p>Thread-safe. {@link #close()} (idempotent, throws nothing) may race another thread's call, an
 * {@code await} for instance: that call returns, or throws {@link KdnCancelledException} or {@link
 * IllegalStateException}. A closed op's methods throw {@link IllegalStateException}.
 */
public final class Op implements AutoCloseable {
  private final NativeOp handle;
  private final ByteBuffer buffer;
  private final DeviceMemory device;
  private final List<ByteBuffer> states;
  private final Core.Release release;
  private volatile boolean closed;

  Op(NativeOp handle, ByteBuffer buffer, Core core) {
    this(handle, buffer, null, List.of(), core);
  }

  /** An op on a buffer and the recurrent layers' states (since 1.12), all kept until it is closed. */
  Op(NativeOp handle, ByteBuffer buffer, List<ByteBuffer> states, Core core) {
    this(handle, buffer, null, states, core);
  }

  Op(NativeOp handle, DeviceMemory device, Core core) {
    this(handle, device.buffer(), device, List.of(), core);
  }

  private Op(NativeOp handle, ByteBuffer buffer, DeviceMemory device, List<ByteBuffer> states, Core core) {
    this.handle = handle;
    this.buffer = buffer;
    this.device = device;
    this.states = states;
    core.acquire();
    // The release keeps the memory reachable until the native op is destroyed, even when nobody
    // closed the op and the Cleaner does (device memory: its native copy, and the buffer that
    // stands in for it on the emulated device; the recurrent states' buffers).
    Object memory = device != null ? device : buffer;
    this.release = new Core.Release(handle::close, handle::delete, core,
        states.isEmpty() ? memory : new Object[] {memory, states});
    Natives.CLEANER.register(this, release);
  }

  private NativeOp handle() {
    if (closed) throw new IllegalStateException("the op is closed");
    return handle;
  }

  /**
   * The buffer the op reads or writes; of an op on {@link DeviceMemory}, the buffer standing in for
   * it ({@link DeviceMemory#of(ByteBuffer)}), else null.
   */
  public ByteBuffer buffer() {
    return buffer;
  }

  /**
   * The recurrent layers' state buffers the op reads or writes (since 1.12; {@link
   * Model#loadAsync(String, Request, KvView, ByteBuffer, List)}), unmodifiable; empty for an op
   * without them.
   */
  public List<ByteBuffer> states() {
    return states;
  }

  /** The device memory the op reads or writes; null for an op on a buffer. */
  public DeviceMemory deviceMemory() {
    return device;
  }

  /** Save: model layer {@code layer} is final in the buffer (copied in the background). */
  public void layerReady(int layer) {
    try {
      handle().layer_ready(Integer.toUnsignedLong(layer));
    } finally {
      Natives.fence(this);
    }
  }

  /** Until the op ends; see the class comment. */
  public boolean await(Duration timeout) {
    try {
      return handle().await_ms(Model.millis(timeout));
    } finally {
      Natives.fence(this);
    }
  }

  public boolean await(long timeout, TimeUnit unit) {
    Objects.requireNonNull(unit, "unit");
    try {
      return handle().await_ms(unit.toMillis(timeout));
    } finally {
      Natives.fence(this);
    }
  }

  /** Until the op ends, with no time limit. */
  public void await() {
    try {
      handle().await_ms(-1);
    } finally {
      Natives.fence(this);
    }
  }

  /** Load: until model layer {@code layer} is written; false when the time ran out first. */
  public boolean awaitLayer(int layer, Duration timeout) {
    try {
      return handle().await_layer_ms(Integer.toUnsignedLong(layer), Model.millis(timeout));
    } finally {
      Natives.fence(this);
    }
  }

  /** Load: until model layer {@code layer} is written, with no time limit. */
  public void awaitLayer(int layer) {
    try {
      handle().await_layer_ms(Integer.toUnsignedLong(layer), -1);
    } finally {
      Natives.fence(this);
    }
  }

  public OpState poll() {
    try {
      return OpState.fromNative(handle().poll());
    } finally {
      Natives.fence(this);
    }
  }

  /** Asks the op to stop; it ends CANCELLED at its next layer unless it has ended already. */
  public void cancel() {
    try {
      handle().cancel();
    } finally {
      Natives.fence(this);
    }
  }

  /** The outcome so far (state PENDING while it runs). */
  public KvResult result() {
    try {
      return Natives.kvResult(handle().result());
    } finally {
      Natives.fence(this);
    }
  }

  /** A load's token ranges that could not be served (recompute only those). */
  public List<TokenRange> failedRanges() {
    NativeOp h = handle();
    try {
      synchronized (this) { // the native ranges are kept in the op until read
        int n = (int) h.failed_ranges();
        List<TokenRange> out = new ArrayList<>(n);
        for (int i = 0; i < n; ++i) out.add(new TokenRange(h.range_begin(i), h.range_end(i)));
        return out;
      }
    } finally {
      Natives.fence(this);
    }
  }

  public boolean isClosed() {
    return closed;
  }

  /** Cancels the op if it runs, waits until the buffer is free, frees the op (idempotent). */
  @Override
  public void close() {
    closed = true;
    release.close();
  }
}

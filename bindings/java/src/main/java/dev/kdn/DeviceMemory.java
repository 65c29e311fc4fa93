// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeMemory;
import dev.kdn.swig.kdn;
import java.nio.ByteBuffer;

/**
 * KV in the memory of a runtime's GPU (KDN_MEMORY_DEVICE, since 1.5), for {@link Model#store},
 * {@link Model#retrieve}, {@link Model#loadAsync} and {@link Model#saveAsync}: a device address
 * and the bytes reachable from it, which the caller vouches for (kdn bounds its accesses by them,
 * but cannot check them against the allocation), and optionally the engine's CUDA stream (since
 * 1.8). Immutable.
 *
 * <p>The runtime must have a device ({@link RuntimeOptions.Builder#device}): without one these calls
 * throw {@link UnsupportedException}. The memory must stay allocated for the call, and for an op
 * until it is closed. The {@link KvView} says where the layers, tokens and heads lie in it, as for
 * a buffer; loads write the views on the device (a device tier's chunks device to device, encoded
 * chunks decoded on the GPU), and the KV is in place when the call returns (an op: each layer when
 * {@link Op#awaitLayer} returns for it).
 *
 * <p>The stream (a {@code cudaStream_t} as a {@code long}; 0: none): kdn's work on the memory
 * starts after the work the stream held when the call was made, and what the engine queues on it
 * after the call returns (an op: after it ends) runs after kdn's writes. On the emulated device
 * ({@link DeviceMode#EMULATED}) any value is accepted and never used.
 *
 * <p>On the emulated device, device memory is host memory: {@link #of(ByteBuffer)} passes a direct
 * buffer as the "device" memory, and keeps the buffer reachable as long as this object is.
 *
 * <p>Its native copy is freed by a {@link java.lang.ref.Cleaner} (it holds memory only).
 */
public final class DeviceMemory {
  /** kdn_memory_kind's KDN_MEMORY_DEVICE. */
  private static final int KDN_MEMORY_DEVICE = 1;

  final NativeMemory handle;
  private final long address;
  private final long bytes;
  private final long cudaStream;
  /** The emulated device's memory ({@link #of(ByteBuffer)}), kept reachable; else null. */
  private final ByteBuffer buffer;

  private DeviceMemory(long address, long bytes, long cudaStream, ByteBuffer buffer) {
    this.address = address;
    this.bytes = bytes;
    this.cudaStream = cudaStream;
    this.buffer = buffer;
    NativeMemory n = new NativeMemory();
    n.setAddress(address);
    n.setBytes(bytes);
    n.setKind(KDN_MEMORY_DEVICE);
    n.setCuda_stream(cudaStream);
    this.handle = n;
    Natives.CLEANER.register(this, n::delete);
  }

  /**
   * Device memory at {@code address} ({@code CUdeviceptr}, a {@code torch.Tensor.data_ptr()}...),
   * of {@code bytes} bytes.
   *
   * @throws IllegalArgumentException if {@code address} is 0 or {@code bytes} is negative
   */
  public static DeviceMemory of(long address, long bytes) {
    if (address == 0) throw new IllegalArgumentException("the device address is 0");
    if (bytes < 0) throw new IllegalArgumentException("a negative size: " + bytes);
    return new DeviceMemory(address, bytes, 0, null);
  }

  /**
   * A direct buffer's memory as the device's, for a runtime whose device is {@link
   * DeviceMode#EMULATED} (host memory standing in for the GPU's): the whole buffer, from its address
   * to its capacity, as for a buffer passed to kdn directly. A runtime with a real GPU would read and
   * write it as GPU memory: do not.
   *
   * @throws IllegalArgumentException if the buffer is not direct
   */
  public static DeviceMemory of(ByteBuffer emulated) {
    Natives.readable(emulated);
    long at;
    try {
      at = kdn.direct_buffer_address(emulated);
    } finally {
      Natives.fence(emulated);
    }
    return new DeviceMemory(at, emulated.capacity(), 0, emulated);
  }

  /** The same memory with the engine's CUDA stream (a {@code cudaStream_t}; 0: none). */
  public DeviceMemory withCudaStream(long stream) {
    return new DeviceMemory(address, bytes, stream, buffer);
  }

  public long address() {
    return address;
  }

  public long bytes() {
    return bytes;
  }

  /** The engine's CUDA stream; 0: none. */
  public long cudaStream() {
    return cudaStream;
  }

  /** The buffer standing in for device memory ({@link #of(ByteBuffer)}); null for an address. */
  public ByteBuffer buffer() {
    return buffer;
  }

  /** Memory kdn writes: not a read-only buffer. */
  DeviceMemory writable() {
    if (buffer != null) Natives.writable(buffer);
    return this;
  }

  @Override
  public String toString() {
    return "DeviceMemory[0x" + Long.toHexString(address) + ", " + bytes + " bytes"
        + (cudaStream == 0 ? "" : ", stream 0x" + Long.toHexString(cudaStream)) + (buffer == null ? "" : ", emulated")
        + "]";
  }
}

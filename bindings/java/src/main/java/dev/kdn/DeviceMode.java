// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/**
 * The GPU a runtime delivers KV to (kdn_device_mode, since 1.5), for KV in device memory ({@link
 * DeviceMemory}) and device tiers; {@link RuntimeOptions.Builder#device}.
 */
public enum DeviceMode {
  /**
   * The CUDA device of {@link RuntimeOptions#deviceOrdinal()} when kdn was built with CUDA and the
   * machine has a usable GPU; otherwise none. The default.
   */
  AUTO(0),
  /** No device: calls on device memory throw {@link UnsupportedException}. */
  NONE(1),
  /**
   * Host memory stands in for the GPU's: {@link DeviceMemory} is host memory ({@link
   * DeviceMemory#of(java.nio.ByteBuffer)}), and every device path runs its kernels' CPU code, byte
   * for byte. For developing and testing an engine's GPU integration without a GPU.
   */
  EMULATED(2),
  /** The CUDA device of {@link RuntimeOptions#deviceOrdinal()}; {@link UnsupportedException} without one. */
  CUDA(3),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final DeviceMode[] VALUES = values();
  private final int value;

  DeviceMode(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static DeviceMode fromNative(int value) {
    for (DeviceMode v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

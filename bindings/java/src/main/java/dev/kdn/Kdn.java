// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.kdn;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * kdn's version and helpers.
 *
 * <p>The binding's JNI library ({@code libkdn_java.so}) is loaded with {@code
 * System.loadLibrary("kdn_java")}, so its directory must be on {@code java.library.path}; the
 * system property {@code kdn.jni.library} names the file instead. It finds {@code libkdn.so}
 * through its rpath or the system's library path.
 *
 * <p>Integers: every unsigned 64-bit value of kdn.h (sizes, counts, versions) is a Java {@code
 * long}, read as unsigned ({@link Long#toUnsignedString(long)}); none reaches 2^63 in practice.
 */
public final class Kdn {
  private Kdn() {}

  /**
   * The libkdn this binding needs: major version {@value #REQUIRED_MAJOR} (libkdn.so.1), minor
   * {@value #REQUIRED_MINOR} or later (the C ABI level it covers). {@link KdnRuntime#create} checks
   * the library it loaded.
   */
  public static final int REQUIRED_MAJOR = 1;

  /** See {@link #REQUIRED_MAJOR}. */
  public static final int REQUIRED_MINOR = 9;

  /**
   * Throws {@link VersionException} unless a library of version {@code number} (MAJOR * 10000 +
   * MINOR * 100 + PATCH) can serve this binding.
   */
  static void checkLibraryVersion(int number) {
    int major = number / 10000;
    int minor = number / 100 % 100;
    if (major == REQUIRED_MAJOR && minor >= REQUIRED_MINOR) return;
    throw new VersionException("libkdn " + major + "." + minor + "." + number % 100
        + " is not usable by this Java binding: it needs libkdn " + REQUIRED_MAJOR + "." + REQUIRED_MINOR
        + " or a later " + REQUIRED_MAJOR + ".x (libkdn.so." + REQUIRED_MAJOR + "); the library comes from kdn.jar,"
        + " -Dkdn.library.path or java.library.path (see dev.kdn.swig.LibraryLoader)");
  }

  /** The library's version, "MAJOR.MINOR.PATCH". */
  public static String version() {
    return kdn.version();
  }

  /** The library's version number, MAJOR * 10000 + MINOR * 100 + PATCH. */
  public static int versionNumber() {
    return (int) kdn.version_number();
  }

  /** kdn's name for a status code ("KDN_ERR_NOT_FOUND"; "KDN_ERR_UNKNOWN" for an unknown one). */
  public static String statusString(int code) {
    return kdn.status_string(code);
  }

  /**
   * A direct buffer of {@code bytes} bytes in the machine's byte order: memory kdn reads and writes
   * without a copy (see {@link Model#store}). {@code asFloatBuffer()} or {@code asShortBuffer()}
   * views it as f32 or f16/bf16 elements.
   */
  public static ByteBuffer allocate(int bytes) {
    return ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
  }
}

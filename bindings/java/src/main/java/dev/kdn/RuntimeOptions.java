// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeRuntimeOptions;
import dev.kdn.swig.NativeTierConfig;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Objects;

/**
 * How to create a runtime (kdn_runtime_options): immutable, built with {@link #builder()}.
 *
 * <pre>{@code
 * RuntimeOptions options = RuntimeOptions.builder().chunkTokens(16).tier(TierConfig.host(16 << 20)).build();
 * }</pre>
 */
public final class RuntimeOptions {
  /** The libkdn version number that first takes master keys for encryption at rest (1.14.0). */
  static final int ENCRYPTION_VERSION = 11400;

  private final int chunkTokens;
  private final long hostCapacityBytes;
  private final long hashSeed;
  private final int workerThreads;
  private final List<TierConfig> tiers;
  private final DeviceMode device;
  private final int deviceOrdinal;
  private final boolean loadSlowerThanPrefill;
  private final String secretFile;
  private final String encryptionKeyFile;
  private final String encryptionKeyEnv;

  private RuntimeOptions(Builder b) {
    chunkTokens = b.chunkTokens;
    hostCapacityBytes = b.hostCapacityBytes;
    hashSeed = b.hashSeed;
    workerThreads = b.workerThreads;
    tiers = Collections.unmodifiableList(new ArrayList<>(b.tiers));
    device = b.device;
    deviceOrdinal = b.deviceOrdinal;
    loadSlowerThanPrefill = b.loadSlowerThanPrefill;
    secretFile = b.secretFile;
    encryptionKeyFile = b.encryptionKeyFile;
    encryptionKeyEnv = b.encryptionKeyEnv;
  }

  /** kdn's defaults: chunks of 256 tokens, one host tier of 1 GiB. */
  public static Builder builder() {
    return new Builder();
  }

  public int chunkTokens() {
    return chunkTokens;
  }

  public long hostCapacityBytes() {
    return hostCapacityBytes;
  }

  public long hashSeed() {
    return hashSeed;
  }

  public int workerThreads() {
    return workerThreads;
  }

  /** The tiers, highest first (empty: one host tier of {@link #hostCapacityBytes()}). */
  public List<TierConfig> tiers() {
    return tiers;
  }

  /** The GPU KV is delivered to (since 1.5). */
  public DeviceMode device() {
    return device;
  }

  /** The CUDA device's ordinal (since 1.5). */
  public int deviceOrdinal() {
    return deviceOrdinal;
  }

  /** Whether loads read every cached chunk, however slowly its tier delivers (since 1.7). */
  public boolean loadSlowerThanPrefill() {
    return loadSlowerThanPrefill;
  }

  /** The file holding the deployment's secret (since 1.8); "" for none. */
  public String secretFile() {
    return secretFile;
  }

  /** The file holding the master keys for encryption at rest (since 1.14); "" for none. */
  public String encryptionKeyFile() {
    return encryptionKeyFile;
  }

  /**
   * The name of the environment variable holding the master keys for encryption at rest (since
   * 1.14); "" for none.
   */
  public String encryptionKeyEnv() {
    return encryptionKeyEnv;
  }

  /**
   * Throws {@link VersionException} unless a library of version {@code number} (MAJOR * 10000 +
   * MINOR * 100 + PATCH) takes master keys for encryption at rest (an older 1.x refuses runtime
   * options it does not know the end of, with a less helpful message).
   */
  static void checkEncryptionSupported(int number) {
    if (number >= ENCRYPTION_VERSION) return;
    throw new VersionException("libkdn " + number / 10000 + "." + number / 100 % 100 + "." + number % 100
        + " does not take master keys for encryption at rest (encryptionKeyFile, encryptionKeyEnv; since 1.14)");
  }

  /** A native copy; the caller deletes it. */
  NativeRuntimeOptions toNative() {
    if (!encryptionKeyFile.isEmpty() || !encryptionKeyEnv.isEmpty()) checkEncryptionSupported(Kdn.versionNumber());
    NativeRuntimeOptions n = new NativeRuntimeOptions();
    try {
      n.setChunk_tokens(Integer.toUnsignedLong(chunkTokens));
      n.setHost_capacity_bytes(hostCapacityBytes);
      n.setHash_seed(hashSeed);
      n.setWorker_threads(Integer.toUnsignedLong(workerThreads));
      n.setDevice(device.value());
      n.setDevice_ordinal(deviceOrdinal);
      n.setLoad_slower_than_prefill(loadSlowerThanPrefill);
      n.setSecret_file(secretFile);
      n.setEncryption_key_file(encryptionKeyFile);
      n.setEncryption_key_env(encryptionKeyEnv);
      for (TierConfig t : tiers) {
        NativeTierConfig nt = t.toNative();
        try {
          n.add_tier(nt);
        } finally {
          nt.delete();
        }
      }
    } catch (RuntimeException | Error e) {
      n.delete();
      throw e;
    }
    return n;
  }

  /** Builds {@link RuntimeOptions}; every setting has kdn's default. */
  public static final class Builder {
    private int chunkTokens = 256;
    private long hostCapacityBytes = 1L << 30;
    private long hashSeed;
    private int workerThreads;
    private final List<TierConfig> tiers = new ArrayList<>();
    private DeviceMode device = DeviceMode.AUTO;
    private int deviceOrdinal;
    private boolean loadSlowerThanPrefill;
    private String secretFile = "";
    private String encryptionKeyFile = "";
    private String encryptionKeyEnv = "";

    private Builder() {}

    /** Tokens per chunk, kdn's unit of storage (default 256). */
    public Builder chunkTokens(int tokens) {
      chunkTokens = tokens;
      return this;
    }

    /** The host tier's capacity when no tier is given (default 1 GiB). */
    public Builder hostCapacityBytes(long bytes) {
      hostCapacityBytes = bytes;
      return this;
    }

    /** Seed of the chunk hashes: engines that share KV must use the same (default 0). */
    public Builder hashSeed(long seed) {
      hashSeed = seed;
      return this;
    }

    /** Background threads (0: kdn picks). */
    public Builder workerThreads(int threads) {
      workerThreads = threads;
      return this;
    }

    /** Appends a tier (the first is the highest). */
    public Builder tier(TierConfig tier) {
      tiers.add(Objects.requireNonNull(tier, "tier"));
      return this;
    }

    /**
     * The GPU KV is delivered to, for {@link DeviceMemory} and device tiers (since 1.5; default
     * {@link DeviceMode#AUTO}). {@link DeviceMode#EMULATED} stands host memory in for the GPU's.
     *
     * @throws IllegalArgumentException for {@link DeviceMode#UNKNOWN}
     */
    public Builder device(DeviceMode mode) {
      if (Objects.requireNonNull(mode, "mode") == DeviceMode.UNKNOWN) {
        throw new IllegalArgumentException("no device mode UNKNOWN");
      }
      device = mode;
      return this;
    }

    /**
     * The CUDA device (default 0) for {@link DeviceMode#AUTO} and {@link DeviceMode#CUDA}. A negative
     * one is an {@link InvalidArgumentException} at {@link KdnRuntime#create}.
     */
    public Builder deviceOrdinal(int ordinal) {
      deviceOrdinal = ordinal;
      return this;
    }

    /**
     * Since 1.7, false (the default): once the engine has reported its prefill time ({@link
     * Model#reportPrefill}), a load leaves to recompute the cached chunks whose tier would deliver
     * them slower than the engine prefills them (the prefix it writes ends before them; {@link
     * Stats#recomputeTokens()}). True: load every cached chunk, however slow its tier.
     */
    public Builder loadSlowerThanPrefill(boolean load) {
      loadSlowerThanPrefill = load;
      return this;
    }

    /**
     * The file holding the deployment's secret (since 1.8): at least 32 bytes ({@code head -c 32
     * /dev/urandom}), readable by the service only. Every chunk a redis or disk tier stores is
     * sealed with it, and a chunk read back counts only if sealed with it (any other is a miss,
     * counted in {@link TierStats#authFailures()}); runtimes that share such a tier share the
     * secret. A file that cannot be read, is open to others or is too short is an {@link
     * InvalidArgumentException} at {@link KdnRuntime#create}.
     */
    public Builder secretFile(Path file) {
      return secretFile(Objects.requireNonNull(file, "file").toString());
    }

    /** As {@link #secretFile(Path)}; "" for none (the default). */
    public Builder secretFile(String file) {
      secretFile = Objects.requireNonNull(file, "file");
      return this;
    }

    /**
     * Encryption at rest (since 1.14): the file holding the master keys, readable by the service
     * only ({@code chmod 600}), one key per line as 64 hex digits ({@code openssl rand -hex 32}); the
     * first encrypts, every one decrypts (rotation: put the new key first, keep the old ones while
     * their chunks matter). Every chunk a disk, redis or remote tier sends out of the process is
     * then encrypted with AES-256-GCM, and one read back that does not decrypt (another key, no key,
     * damaged bytes) is a miss, counted in {@link TierStats#authFailures()}; runtimes that share
     * such a tier share the keys. At most one of this and {@link #encryptionKeyEnv}. A file that
     * cannot be read, is open to others or holds a line that is not a key, or both sources at once,
     * is an {@link InvalidArgumentException} at {@link KdnRuntime#create} (its message never holds
     * a key); a libkdn older than 1.14 a {@link VersionException}.
     */
    public Builder encryptionKeyFile(Path file) {
      return encryptionKeyFile(Objects.requireNonNull(file, "file").toString());
    }

    /** As {@link #encryptionKeyFile(Path)}; "" for none (the default). */
    public Builder encryptionKeyFile(String file) {
      encryptionKeyFile = Objects.requireNonNull(file, "file");
      return this;
    }

    /**
     * Encryption at rest (since 1.14), as {@link #encryptionKeyFile(Path)} but with the master keys
     * in the environment variable named {@code variable} (its name, not the keys; "" for none, the
     * default). A variable that is not set, or that holds a line that is not a key, is an {@link
     * InvalidArgumentException} at {@link KdnRuntime#create}.
     */
    public Builder encryptionKeyEnv(String variable) {
      encryptionKeyEnv = Objects.requireNonNull(variable, "variable");
      return this;
    }

    public RuntimeOptions build() {
      return new RuntimeOptions(this);
    }
  }
}

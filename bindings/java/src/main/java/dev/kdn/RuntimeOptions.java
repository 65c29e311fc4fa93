// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeRuntimeOptions;
import dev.kdn.swig.NativeTierConfig;
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
  private final int chunkTokens;
  private final long hostCapacityBytes;
  private final long hashSeed;
  private final int workerThreads;
  private final List<TierConfig> tiers;

  private RuntimeOptions(Builder b) {
    chunkTokens = b.chunkTokens;
    hostCapacityBytes = b.hostCapacityBytes;
    hashSeed = b.hashSeed;
    workerThreads = b.workerThreads;
    tiers = Collections.unmodifiableList(new ArrayList<>(b.tiers));
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

  /** A native copy; the caller deletes it. */
  NativeRuntimeOptions toNative() {
    NativeRuntimeOptions n = new NativeRuntimeOptions();
    try {
      n.setChunk_tokens(Integer.toUnsignedLong(chunkTokens));
      n.setHost_capacity_bytes(hostCapacityBytes);
      n.setHash_seed(hashSeed);
      n.setWorker_threads(Integer.toUnsignedLong(workerThreads));
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

    public RuntimeOptions build() {
      return new RuntimeOptions(this);
    }
  }
}

// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeEditor;
import dev.kdn.swig.NativeLatency;
import dev.kdn.swig.NativeModelSpec;
import dev.kdn.swig.NativeQuotaStatsList;
import dev.kdn.swig.NativeRuntime;
import dev.kdn.swig.NativeRuntimeOptions;
import java.lang.ref.Cleaner;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.function.Supplier;

/**
 * A kdn runtime (kdn_runtime): the tiers, the background threads, the statistics. Create it with
 * {@link #create}, make {@link Model}s from it, and close it:
 *
 * <pre>{@code
 * try (KdnRuntime rt = KdnRuntime.create(RuntimeOptions.builder().chunkTokens(16).build());
 *      Model model = rt.createModel(spec)) {
 *   ...
 * }
 * }</pre>
 *
 * <p>Named {@code KdnRuntime}, not {@code Runtime}: {@link java.lang.Runtime} is imported into
 * every file, and a {@code dev.kdn.Runtime} would make {@code Runtime} ambiguous under {@code import
 * dev.kdn.*;}.
 *
 * <p>Thread-safe: any method from any thread. {@link #close()} may race another thread's call: that
 * call completes or throws {@link IllegalStateException}, and later calls throw it. Closing is
 * idempotent and throws nothing; the native runtime lives on until its models and ops are closed
 * too. A runtime nobody closed is closed by a {@link Cleaner} (a backstop only), which also frees
 * the native object of a closed one.
 */
public final class KdnRuntime implements AutoCloseable {
  private final NativeRuntime handle;
  private final Core core;
  private final Core.Release release;
  private final List<TierConfig> tiers; // as created, for the quotas' namespaces
  private volatile boolean closed;

  private KdnRuntime(NativeRuntime handle, Core core, List<TierConfig> tiers) {
    this.handle = handle;
    this.core = core;
    this.tiers = tiers;
    this.release = new Core.Release(handle::close, handle::delete, core, null);
    Natives.CLEANER.register(this, release);
  }

  /**
   * A runtime; {@link InvalidArgumentException} for bad options (a tier of 0 bytes, an unknown
   * codec), {@link VersionException} when the libkdn loaded is older than this binding needs
   * ({@link Kdn#REQUIRED_MINOR}).
   */
  public static KdnRuntime create(RuntimeOptions options) {
    Objects.requireNonNull(options, "options");
    return make(options::toNative, () -> new Core((Editor) null), options.tiers());
  }

  /**
   * A runtime whose stored chunks {@code editor} rewrites (on the mover thread, see {@link Editor}).
   * The runtime keeps the editor until it, its models and its ops are all closed.
   */
  public static KdnRuntime create(RuntimeOptions options, Editor editor) {
    Objects.requireNonNull(options, "options");
    Objects.requireNonNull(editor, "editor");
    return make(options::toNative, () -> new Core(editor), options.tiers());
  }

  /**
   * The native options first, then the core (and its native editor), then the native runtime:
   * whichever step throws, what the earlier ones made is freed.
   */
  static KdnRuntime make(Supplier<NativeRuntimeOptions> nativeOptions, Supplier<Core> newCore) {
    return make(nativeOptions, newCore, List.of());
  }

  /** As above; {@code tiers} are the options' (their quotas name {@link QuotaStats#namespace}). */
  static KdnRuntime make(Supplier<NativeRuntimeOptions> nativeOptions, Supplier<Core> newCore,
      List<TierConfig> tiers) {
    Kdn.checkLibraryVersion(Kdn.versionNumber());
    NativeRuntimeOptions o = nativeOptions.get();
    try {
      Core core = newCore.get();
      NativeRuntime h;
      try {
        NativeEditor e = core.nativeEditor();
        h = e == null ? new NativeRuntime(o) : new NativeRuntime(o, e);
      } catch (RuntimeException | Error e) {
        core.release();
        throw e;
      }
      return new KdnRuntime(h, core, tiers);
    } finally {
      o.delete();
    }
  }

  NativeRuntime handle() {
    if (closed) throw new IllegalStateException("the runtime is closed");
    return handle;
  }

  /** A model of this runtime (close it too). */
  public Model createModel(ModelSpec spec) {
    Objects.requireNonNull(spec, "spec");
    NativeRuntime h = handle();
    NativeModelSpec s = spec.toNative();
    try {
      return new Model(h.create_model(s), spec, this, core);
    } finally {
      s.delete();
      Natives.fence(this);
    }
  }

  public Stats stats() {
    try {
      return Stats.from(handle().stats());
    } finally {
      Natives.fence(this);
    }
  }

  public Latency latency(LatencyKind kind) {
    Objects.requireNonNull(kind, "kind");
    if (kind == LatencyKind.UNKNOWN) throw new IllegalArgumentException("no latency of kind UNKNOWN");
    NativeLatency l;
    try {
      l = handle().latency(kind.value());
    } finally {
      Natives.fence(this);
    }
    try {
      return new Latency(l.getCount(), l.getMean_us(), l.getP50_us(), l.getP90_us(), l.getP99_us(), l.getMax_us());
    } finally {
      l.delete();
    }
  }

  public int tierCount() {
    try {
      return (int) handle().tier_count();
    } finally {
      Natives.fence(this);
    }
  }

  /** Tier {@code index}'s counters (0 is the highest tier). */
  public TierStats tierStats(int index) {
    try {
      return TierStats.from(handle().tier_stats(Integer.toUnsignedLong(index)));
    } finally {
      Natives.fence(this);
    }
  }

  /** Every tier's counters, highest first. */
  public List<TierStats> tierStats() {
    int n = tierCount();
    List<TierStats> out = new ArrayList<>(n);
    for (int i = 0; i < n; ++i) out.add(tierStats(i));
    return out;
  }

  /**
   * Tier {@code index}'s quotas (since 1.13; {@link TierConfig#withQuota}), in the order given: what
   * each namespace's chunks take of the tier and how many were evicted. Empty for a tier without
   * quotas. A chunk a disk tier held at start counts toward no quota until it is stored again.
   *
   * @throws InvalidArgumentException for a tier the runtime does not have
   * @throws VersionException if the loaded libkdn is older than 1.13
   */
  public List<QuotaStats> quotaStats(int index) {
    NativeQuotaStatsList list;
    try {
      list = handle().quota_stats(Integer.toUnsignedLong(index));
    } finally {
      Natives.fence(this);
    }
    try {
      List<TierConfig.Quota> given = index >= 0 && index < tiers.size() ? tiers.get(index).quotas() : List.of();
      List<QuotaStats> out = new ArrayList<>(list.size());
      for (int i = 0; i < list.size(); ++i) {
        // kdn reports the quotas in the order the tier config gave them.
        out.add(QuotaStats.from(i < given.size() ? given.get(i).namespace() : "", list.get(i)));
      }
      return List.copyOf(out);
    } finally {
      list.delete();
    }
  }

  /**
   * The last exception the editor threw (each left its chunk as it was), if any; else an {@link
   * IllegalStateException} if kdn found no Java editor to call (those edits failed, their chunks
   * left as they were).
   */
  public Optional<Throwable> editorFailure() {
    return Optional.ofNullable(core.editorFailure());
  }

  public boolean isClosed() {
    return closed;
  }

  /** Closes the runtime (idempotent; throws nothing). */
  @Override
  public void close() {
    closed = true;
    release.close();
  }
}

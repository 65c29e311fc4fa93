// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeTierConfig;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;

/**
 * One tier of a runtime (kdn_tier_config): immutable; start from {@link #host}, {@link #device},
 * {@link #disk}, {@link #remote} or {@link #redis} and change what differs from kdn's defaults
 * with the {@code with...} methods:
 *
 * <pre>{@code
 * TierConfig.disk(Path.of("/var/cache/kdn"), 64L << 30).withCodec("zstd").withPolicy(EvictionPolicy.S3FIFO)
 * TierConfig.host(16L << 30).withQuota("tenant-a", 4L << 30).withQuota("tenant-b", 8L << 30)
 * }</pre>
 */
public final class TierConfig implements Cloneable {
  /** The libkdn version number that first takes quotas (1.13.0). */
  static final int QUOTA_VERSION = 11300;

  /**
   * One namespace's quota in a tier ({@link #withQuota}): the most bytes of the tier its chunks may
   * take (unsigned; 0: its chunks skip the tier).
   */
  public record Quota(String namespace, long bytes) {
    public Quota {
      Objects.requireNonNull(namespace, "namespace");
    }

    @Override
    public String toString() {
      return namespace + "=" + Long.toUnsignedString(bytes);
    }
  }

  private TierKind kind;
  private long capacityBytes = 1L << 30;
  private String path = "";
  private EvictionPolicy policy = EvictionPolicy.LRU;
  private float highWatermark;
  private float lowWatermark;
  private boolean writeThrough;
  private String codec = "";
  private String address = "";
  private String token = "";
  private int timeoutMs;
  private String tlsCaFile = "";
  private String tlsServerName = "";
  private String user = "";
  private long ttlMs;
  private List<String> levels = List.of();
  private List<Quota> quotas = List.of();

  private TierConfig(TierKind kind) {
    this.kind = Objects.requireNonNull(kind, "kind");
  }

  /** Host memory of {@code capacityBytes} (unsigned; must not be 0). */
  public static TierConfig host(long capacityBytes) {
    return new TierConfig(TierKind.HOST).withCapacityBytes(capacityBytes);
  }

  /** GPU memory (host memory standing in for it without a GPU). */
  public static TierConfig device(long capacityBytes) {
    return new TierConfig(TierKind.DEVICE).withCapacityBytes(capacityBytes);
  }

  /** One file per chunk under {@code directory} (created if absent); lossless zstd by default. */
  public static TierConfig disk(Path directory, long capacityBytes) {
    return disk(Objects.requireNonNull(directory, "directory").toString(), capacityBytes);
  }

  /** One file per chunk under {@code directory} (created if absent); lossless zstd by default. */
  public static TierConfig disk(String directory, long capacityBytes) {
    TierConfig t = new TierConfig(TierKind.DISK).withCapacityBytes(capacityBytes);
    t.path = Objects.requireNonNull(directory, "directory");
    return t;
  }

  /**
   * A kdnd node shared with other engines: {@code address} is "host:port" or "unix:/path",
   * {@code token} a bearer token the node takes. Reads the node cannot answer in time are misses.
   */
  public static TierConfig remote(String address, String token) {
    TierConfig t = new TierConfig(TierKind.REMOTE);
    t.address = Objects.requireNonNull(address, "address");
    t.token = Objects.requireNonNull(token, "token");
    return t;
  }

  /**
   * Redis, Redis Cluster or Valkey shared with other engines (since kdn 1.3): {@code address} is
   * "host:port" of one node or more, comma-separated (of a cluster, any of its nodes); {@code
   * password} "" for no AUTH. Reads the server cannot answer in time are misses; a malformed
   * address or a refused AUTH is an {@link InvalidArgumentException} at {@link KdnRuntime#create}.
   */
  public static TierConfig redis(String address, String password) {
    TierConfig t = new TierConfig(TierKind.REDIS);
    t.address = Objects.requireNonNull(address, "address");
    t.token = Objects.requireNonNull(password, "password");
    return t;
  }

  private TierConfig copy() {
    try {
      return (TierConfig) super.clone();
    } catch (CloneNotSupportedException e) {
      throw new AssertionError(e);
    }
  }

  /** Capacity in bytes (unsigned; not used by remote and redis tiers). */
  public TierConfig withCapacityBytes(long bytes) {
    TierConfig t = copy();
    t.capacityBytes = bytes;
    return t;
  }

  public TierConfig withPolicy(EvictionPolicy policy) {
    TierConfig t = copy();
    t.policy = Objects.requireNonNull(policy, "policy");
    return t;
  }

  /**
   * A put that would cross {@code high} (a fraction of capacity) evicts down to {@code low}; 0 and
   * 0 are kdn's defaults, 0.95 and 0.85.
   */
  public TierConfig withWatermarks(float high, float low) {
    TierConfig t = copy();
    t.highWatermark = high;
    t.lowWatermark = low;
    return t;
  }

  /** New chunks are copied to the next tier too. */
  public TierConfig withWriteThrough(boolean writeThrough) {
    TierConfig t = copy();
    t.writeThrough = writeThrough;
    return t;
  }

  /**
   * How the tier stores chunks ("raw", "zstd", "fp8", "int8", "kivi2", "cachegen", "kdn",
   * "kdn:hifi", ...); "" is the tier's default. Unknown: {@link InvalidArgumentException} at
   * {@link KdnRuntime#create}.
   */
  public TierConfig withCodec(String codec) {
    TierConfig t = copy();
    t.codec = Objects.requireNonNull(codec, "codec");
    return t;
  }

  /** Remote, redis: the deadline of each call to the node (zero: kdn's default, 2 s). */
  public TierConfig withTimeout(Duration timeout) {
    TierConfig t = copy();
    t.timeoutMs = (int) Math.min(Integer.MAX_VALUE, Objects.requireNonNull(timeout, "timeout").toMillis());
    return t;
  }

  /** Remote over TLS: the PEM file of the certificates to trust, and the name the node's must carry. */
  public TierConfig withTls(String caFile, String serverName) {
    TierConfig t = copy();
    t.tlsCaFile = Objects.requireNonNull(caFile, "caFile");
    t.tlsServerName = Objects.requireNonNull(serverName, "serverName");
    return t;
  }

  /**
   * Redis: the ACL user of AUTH (needs a password; "": the password alone). Other kinds refuse a
   * user: {@link InvalidArgumentException} at {@link KdnRuntime#create}.
   */
  public TierConfig withUser(String user) {
    TierConfig t = copy();
    t.user = Objects.requireNonNull(user, "user");
    return t;
  }

  /**
   * Redis: the keys expire after {@code ttl}, rounded up to whole milliseconds (zero: never).
   * Other kinds refuse a TTL: {@link InvalidArgumentException} at {@link KdnRuntime#create}.
   *
   * @throws IllegalArgumentException if {@code ttl} is negative
   */
  public TierConfig withTtl(Duration ttl) {
    if (Objects.requireNonNull(ttl, "ttl").isNegative()) {
      throw new IllegalArgumentException("a negative TTL: " + ttl);
    }
    TierConfig t = copy();
    try {
      long ms = ttl.toMillis();
      t.ttlMs = Duration.ofMillis(ms).compareTo(ttl) < 0 ? ms + 1 : ms;
    } catch (ArithmeticException tooLong) {
      t.ttlMs = Long.MAX_VALUE;
    }
    return t;
  }

  /**
   * Remote, redis (since 1.6): quality levels, codec specs finest first ("zstd", "kdn:hifi",
   * "kdn:balanced"), at most 8, instead of one codec (leave {@link #withCodec} unset). Every chunk is
   * kept at each level; a load whose request has a TTFT target ({@link Request#withTtftTarget})
   * fetches each chunk at the finest level that arrives in time, at the link rate the runtime
   * measures, and leaves a chunk to recompute when none would. Loads without a target get the
   * finest level. None: one level, the codec. Other kinds, an empty or unknown level, or levels
   * with a codec: {@link InvalidArgumentException} at {@link KdnRuntime#create}.
   *
   * @throws IllegalArgumentException if a level contains ';' (kdn.h's separator)
   */
  public TierConfig withLevels(String... codecs) {
    return withLevels(Arrays.asList(Objects.requireNonNull(codecs, "codecs")));
  }

  /** As {@link #withLevels(String...)}. */
  public TierConfig withLevels(List<String> codecs) {
    List<String> copy = List.copyOf(Objects.requireNonNull(codecs, "codecs"));
    for (String c : copy) {
      if (c.indexOf(';') >= 0) throw new IllegalArgumentException("a level with a ';': \"" + c + "\"");
    }
    TierConfig t = copy();
    t.levels = copy;
    return t;
  }

  /**
   * Since 1.13, not for remote tiers: a quota for {@code namespace} (as the KV calls name it) in
   * this tier, appended to those already given: its chunks take at most {@code bytes} of the tier
   * (unsigned), counted as the tier counts its capacity (a memory tier's whole 4 KiB pages per
   * chunk, a disk tier's encoded bytes). Over it, a put of that namespace evicts the namespace's
   * own coldest chunks (by the tier's policy; demoted to the next tier as any victim), never
   * another namespace's; a chunk larger than the quota skips the tier (0: every chunk does). When
   * the tier itself is full, chunks of namespaces without a quota go first. {@link
   * KdnRuntime#quotaStats} reports each quota, in the order given. kdn checks the quotas at {@link
   * KdnRuntime#create}: two for one namespace, an empty namespace or one over 4096 bytes, or a
   * quota on a remote tier is an {@link InvalidArgumentException} there; a libkdn older than 1.13 a
   * {@link VersionException}.
   */
  public TierConfig withQuota(String namespace, long bytes) {
    Quota q = new Quota(namespace, bytes);
    TierConfig t = copy();
    List<Quota> all = new ArrayList<>(quotas);
    all.add(q);
    t.quotas = List.copyOf(all);
    return t;
  }

  public TierKind kind() {
    return kind;
  }

  public long capacityBytes() {
    return capacityBytes;
  }

  public String path() {
    return path;
  }

  public EvictionPolicy policy() {
    return policy;
  }

  public float highWatermark() {
    return highWatermark;
  }

  public float lowWatermark() {
    return lowWatermark;
  }

  public boolean writeThrough() {
    return writeThrough;
  }

  public String codec() {
    return codec;
  }

  public String address() {
    return address;
  }

  public String token() {
    return token;
  }

  public Duration timeout() {
    return Duration.ofMillis(timeoutMs);
  }

  public String tlsCaFile() {
    return tlsCaFile;
  }

  public String tlsServerName() {
    return tlsServerName;
  }

  public String user() {
    return user;
  }

  public Duration ttl() {
    return Duration.ofMillis(ttlMs);
  }

  /** The quality levels, finest first (empty: none). */
  public List<String> levels() {
    return levels;
  }

  /** The namespaces' quotas, in the order given (empty: none). */
  public List<Quota> quotas() {
    return quotas;
  }

  /**
   * Throws {@link VersionException} unless a library of version {@code number} (MAJOR * 10000 +
   * MINOR * 100 + PATCH) takes quotas (an older 1.x refuses a tier config it does not know the end
   * of, with a less helpful message).
   */
  static void checkQuotaSupported(int number) {
    if (number >= QUOTA_VERSION) return;
    throw new VersionException("libkdn " + number / 10000 + "." + number / 100 % 100 + "." + number % 100
        + " does not take a tier's quotas (since 1.13)");
  }

  /** A native copy; the caller deletes it. */
  NativeTierConfig toNative() {
    if (!quotas.isEmpty()) checkQuotaSupported(Kdn.versionNumber());
    NativeTierConfig n = new NativeTierConfig();
    n.setKind(kind.value());
    n.setCapacity_bytes(capacityBytes);
    n.setPath(path);
    n.setPolicy(policy.value());
    n.setHigh_watermark(highWatermark);
    n.setLow_watermark(lowWatermark);
    n.setWrite_through(writeThrough);
    n.setCodec(codec);
    n.setAddress(address);
    n.setToken(token);
    n.setTimeout_ms(timeoutMs);
    n.setTls_ca_file(tlsCaFile);
    n.setTls_server_name(tlsServerName);
    n.setUser(user);
    n.setTtl_ms(ttlMs);
    n.setLevels(String.join(";", levels));
    try {
      for (Quota q : quotas) n.add_quota(q.namespace(), q.bytes());
    } catch (RuntimeException | Error e) {
      n.delete();
      throw e;
    }
    return n;
  }

  @Override
  public String toString() {
    return "TierConfig[" + kind + ", " + Long.toUnsignedString(capacityBytes) + " bytes"
        + (path.isEmpty() ? "" : ", path " + path) + (codec.isEmpty() ? "" : ", codec " + codec)
        + (address.isEmpty() ? "" : ", address " + address) + (levels.isEmpty() ? "" : ", levels " + levels)
        + (quotas.isEmpty() ? "" : ", quotas " + quotas) + "]";
  }
}

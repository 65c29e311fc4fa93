// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeModelSpec;
import java.util.Objects;

/**
 * A model's KV shape and identity (kdn_model_spec): immutable, built with {@link #builder()}.
 * Models with the same spec (and fingerprint) share their cached KV.
 */
public final class ModelSpec {
  private final int numLayers;
  private final int numKvHeads;
  private final int headDim;
  private final DType dtype;
  private final float ropeTheta;
  private final RopeStyle ropeStyle;
  private final int rotaryDim;
  private final String fingerprint;
  private final CacheKind cacheKind;
  private final int latentDim;
  private final int latentRopeDim;
  private final int[] layerWindows;
  private final int numStateLayers;
  private final long stateBytes;

  private ModelSpec(Builder b) {
    numLayers = b.numLayers;
    numKvHeads = b.numKvHeads;
    headDim = b.headDim;
    dtype = b.dtype;
    ropeTheta = b.ropeTheta;
    ropeStyle = b.ropeStyle;
    rotaryDim = b.rotaryDim;
    fingerprint = b.fingerprint;
    cacheKind = b.cacheKind;
    latentDim = b.latentDim;
    latentRopeDim = b.latentRopeDim;
    layerWindows = b.layerWindows.clone();
    numStateLayers = b.numStateLayers;
    stateBytes = b.stateBytes;
  }

  public static Builder builder() {
    return new Builder();
  }

  public int numLayers() {
    return numLayers;
  }

  public int numKvHeads() {
    return numKvHeads;
  }

  public int headDim() {
    return headDim;
  }

  public DType dtype() {
    return dtype;
  }

  public float ropeTheta() {
    return ropeTheta;
  }

  public RopeStyle ropeStyle() {
    return ropeStyle;
  }

  public int rotaryDim() {
    return rotaryDim;
  }

  public String fingerprint() {
    return fingerprint;
  }

  /** Bytes of one token's KV over all layers (K and V). */
  /** What each layer caches per token (since 1.11): K and V heads, or one latent vector. */
  public CacheKind cacheKind() {
    return cacheKind;
  }

  /** A latent model's vector length (even); 0 for K and V heads. */
  public int latentDim() {
    return latentDim;
  }

  /** How many of the latent's last dims carry RoPE. */
  public int latentRopeDim() {
    return latentRopeDim;
  }

  /** Each layer's sliding window in tokens, 0 for full attention (since 1.12; empty: all full). */
  public int[] layerWindows() {
    return layerWindows.clone();
  }

  /** Recurrent layers (not counted in layers()), each with a state of stateBytes(). */
  public int numStateLayers() {
    return numStateLayers;
  }

  public long stateBytes() {
    return stateBytes;
  }

  public long kvBytesPerToken() {
    if (cacheKind == CacheKind.LATENT) return (long) numLayers * latentDim * dtype.bytes();
    return 2L * numLayers * numKvHeads * headDim * dtype.bytes();
  }

  /** A native copy; the caller deletes it. */
  NativeModelSpec toNative() {
    NativeModelSpec n = new NativeModelSpec();
    n.setNum_layers(Integer.toUnsignedLong(numLayers));
    n.setNum_kv_heads(Integer.toUnsignedLong(numKvHeads));
    n.setHead_dim(Integer.toUnsignedLong(headDim));
    n.setDtype(dtype.value());
    n.setRope_theta(ropeTheta);
    n.setRope_style(ropeStyle.value());
    n.setRotary_dim(Integer.toUnsignedLong(rotaryDim));
    n.setFingerprint(fingerprint);
    n.setCache_kind(cacheKind.value());
    n.setLatent_dim(Integer.toUnsignedLong(latentDim));
    n.setLatent_rope_dim(Integer.toUnsignedLong(latentRopeDim));
    for (int l = 0; l < layerWindows.length; ++l) {
      n.set_layer_window(l, Integer.toUnsignedLong(layerWindows[l]));
    }
    n.setNum_state_layers(Integer.toUnsignedLong(numStateLayers));
    n.setState_bytes(stateBytes);
    return n;
  }

  @Override
  public String toString() {
    return "ModelSpec[" + numLayers + " layers, " + numKvHeads + " kv heads, head_dim " + headDim + ", " + dtype
        + ", \"" + fingerprint + "\"]";
  }

  /** Builds a {@link ModelSpec}: the shape is required, the rest has kdn's defaults. */
  public static final class Builder {
    private int numLayers;
    private int numKvHeads;
    private int headDim;
    private DType dtype = DType.F32;
    private float ropeTheta = 10000.0f;
    private RopeStyle ropeStyle = RopeStyle.INTERLEAVED;
    private int rotaryDim;
    private String fingerprint = "";
    private CacheKind cacheKind = CacheKind.KV;
    private int latentDim;
    private int latentRopeDim;
    private int[] layerWindows = new int[0];
    private int numStateLayers;
    private long stateBytes;

    private Builder() {}

    /**
     * Layer groups (since 1.12, docs/model-kinds.md): {@code windows[l]} is layer l's sliding
     * window in tokens, 0 for full attention. A load then writes a sliding layer's window only, and
     * a lookup reports the prefix every group serves.
     */
    public Builder layerWindows(int... windows) {
      layerWindows = Objects.requireNonNull(windows, "windows").clone();
      return this;
    }

    /**
     * Recurrent layers (since 1.12), not counted in layers(), each with a state of {@code bytes} (a
     * multiple of 4). Their states travel with each call, as direct buffers ({@link
     * Model#store(String, Request, KvView, java.nio.ByteBuffer, java.util.List)} and the other calls
     * that take {@code states}); a prefix counts only where the state at its end was stored.
     */
    public Builder stateLayers(int layers, long bytes) {
      numStateLayers = layers;
      stateBytes = bytes;
      return this;
    }

    /**
     * A latent (MLA) model (since 1.11): each layer caches one vector of {@code dim} (even) per
     * token, its last {@code ropeDim} carrying RoPE; leave kvHeads and headDim at 0. Its buffers
     * hold [layer][token][latent] in the canonical layout.
     */
    public Builder latent(int dim, int ropeDim) {
      cacheKind = CacheKind.LATENT;
      latentDim = dim;
      latentRopeDim = ropeDim;
      return this;
    }

    public Builder layers(int layers) {
      numLayers = layers;
      return this;
    }

    public Builder kvHeads(int heads) {
      numKvHeads = heads;
      return this;
    }

    public Builder headDim(int dim) {
      headDim = dim;
      return this;
    }

    public Builder dtype(DType dtype) {
      this.dtype = Objects.requireNonNull(dtype, "dtype");
      return this;
    }

    public Builder ropeTheta(float theta) {
      ropeTheta = theta;
      return this;
    }

    public Builder ropeStyle(RopeStyle style) {
      ropeStyle = Objects.requireNonNull(style, "style");
      return this;
    }

    /** Dimensions RoPE rotates (0: all of head_dim). */
    public Builder rotaryDim(int dim) {
      rotaryDim = dim;
      return this;
    }

    /** The weights' identity (a name, a checksum): KV of different weights never mixes. */
    public Builder fingerprint(String fingerprint) {
      this.fingerprint = Objects.requireNonNull(fingerprint, "fingerprint");
      return this;
    }

    public ModelSpec build() {
      return new ModelSpec(this);
    }
  }
}

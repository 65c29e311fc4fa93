// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeKvView;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;

/**
 * Where a caller's KV lies in the {@code ByteBuffer} passed with each call (kdn_kv_view without
 * its pointers). Counts, strides and offsets are in elements, never bytes. Immutable; freed by a
 * {@link java.lang.ref.Cleaner} (it holds memory only).
 *
 * <ul>
 *   <li>{@link #canonical()}: [layer][k|v][token][kv_head][head_dim], the request's tokens.
 *   <li>{@link #contiguous()}: an engine's own strides (llama.cpp: layer j's K at j *
 *       strideLayer, its V strideKv further; a transposed V with {@code vStrides}), or per-layer
 *       offsets ({@link Builder#layerOffsets}) when layers are not one stride apart.
 *   <li>{@link #paged}: vLLM's block tables (NHD or HND), one K and V offset per layer.
 * </ul>
 */
public final class KvView {
  private static final KvView CANONICAL = contiguous().build();

  final NativeKvView handle;
  private final DType dtype;
  private final KvLayout layout;

  private KvView(NativeKvView handle, DType dtype, KvLayout layout) {
    this.handle = handle;
    this.dtype = dtype;
    this.layout = layout;
    Natives.CLEANER.register(this, handle::delete);
  }

  /** The canonical layout, exactly the request's tokens. */
  public static KvView canonical() {
    return CANONICAL;
  }

  /** The canonical layout with room for {@code numTokens} tokens (a knowledge fetch needs it). */
  public static KvView canonical(long numTokens) {
    return contiguous().numTokens(numTokens).build();
  }

  /** A contiguous view: with no strides set, the canonical layout. */
  public static Builder contiguous() {
    return new Builder(KvLayout.CONTIGUOUS);
  }

  /**
   * A paged view: per layer [numBlocks][blockSize][kvHeads][headDim] (NHD) or [numBlocks][kvHeads]
   * [blockSize][headDim] (HND), at the offsets {@link Builder#layerOffsets} gives, tokens in the
   * blocks {@link Builder#blockTable} names.
   */
  public static Builder paged(KvLayout layout, int blockSize, long numBlocks) {
    Objects.requireNonNull(layout, "layout");
    if (layout == KvLayout.CONTIGUOUS || layout == KvLayout.UNKNOWN) {
      throw new IllegalArgumentException("a paged view is PAGED_NHD or PAGED_HND, not " + layout);
    }
    Builder b = new Builder(layout);
    b.blockSize = blockSize;
    b.numBlocks = numBlocks;
    return b;
  }

  /** The dtype the view's buffer holds, checked against the model's; null: the model's. */
  public DType dtype() {
    return dtype;
  }

  public KvLayout layout() {
    return layout;
  }

  /** Builds a {@link KvView}. */
  public static final class Builder {
    private final KvLayout layout;
    private DType dtype;
    private long strideLayer;
    private long strideKv;
    private long strideToken;
    private long strideHead;
    private long strideDim;
    private long vStrideToken;
    private long vStrideHead;
    private long vStrideDim;
    private long numTokens;
    private long layerElements;
    private int blockSize;
    private long numBlocks;
    private long blockStride;
    private int[] layers = new int[0];
    private final List<long[]> offsets = new ArrayList<>();
    private int[] blockTable = new int[0];

    private Builder(KvLayout layout) {
      this.layout = layout;
    }

    /** The buffer's dtype: a call on a model of another dtype is an InvalidArgumentException. */
    public Builder dtype(DType dtype) {
      this.dtype = Objects.requireNonNull(dtype, "dtype");
      return this;
    }

    /** One allocation: layer j's K at j * {@code layer} elements, its V {@code kv} further. */
    public Builder strideLayer(long layer) {
      strideLayer = layer;
      return this;
    }

    public Builder strideKv(long kv) {
      strideKv = kv;
      return this;
    }

    /** Element (token, head, dim) at token * token + head * head + dim * dim. */
    public Builder strides(long token, long head, long dim) {
      strideToken = token;
      strideHead = head;
      strideDim = dim;
      return this;
    }

    /** V's own strides (llama.cpp's transposed V); unset: as K. */
    public Builder vStrides(long token, long head, long dim) {
      vStrideToken = token;
      vStrideHead = head;
      vStrideDim = dim;
      return this;
    }

    /** The room, in tokens (0: exactly the request's). */
    public Builder numTokens(long tokens) {
      numTokens = tokens;
      return this;
    }

    /** With layer offsets: the elements each layer's K (or V) may span from its offset. */
    public Builder layerElements(long elements) {
      layerElements = elements;
      return this;
    }

    /** Paged: elements between blocks (0: dense). */
    public Builder blockStride(long elements) {
      blockStride = elements;
      return this;
    }

    /** The model layers this view holds, in order (unset: all of them). */
    public Builder layers(int... modelLayers) {
      layers = Objects.requireNonNull(modelLayers, "modelLayers").clone();
      return this;
    }

    /** Appends a view layer's K and V offsets (elements from the buffer's start). */
    public Builder layerOffsets(long k, long v) {
      offsets.add(new long[] {k, v});
      return this;
    }

    /** Paged: the block of each group of blockSize tokens, in order. */
    public Builder blockTable(int... blocks) {
      blockTable = Objects.requireNonNull(blocks, "blocks").clone();
      return this;
    }

    public KvView build() {
      NativeKvView n = new NativeKvView();
      try {
        n.setLayout(layout.value());
        n.setStride_layer(strideLayer);
        n.setStride_kv(strideKv);
        n.setStride_token(strideToken);
        n.setStride_head(strideHead);
        n.setStride_dim(strideDim);
        n.setV_stride_token(vStrideToken);
        n.setV_stride_head(vStrideHead);
        n.setV_stride_dim(vStrideDim);
        n.setNum_tokens(numTokens);
        n.setLayer_elements(layerElements);
        n.setBlock_size(Integer.toUnsignedLong(blockSize));
        n.setNum_blocks(numBlocks);
        n.setBlock_stride(blockStride);
        for (int l : layers) n.add_layer(Integer.toUnsignedLong(l));
        for (long[] o : offsets) n.add_layer_offsets(o[0], o[1]);
        for (int b : blockTable) n.add_block(b);
      } catch (RuntimeException e) {
        n.delete();
        throw e;
      }
      return new KvView(n, dtype, layout);
    }
  }
}

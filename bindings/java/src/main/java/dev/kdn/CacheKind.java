// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

/** What each layer of a model caches per token (kdn_cache_kind, since 1.11; docs/model-kinds.md). */
public enum CacheKind {
  /** K and V heads. */
  KV(0),
  /** One latent vector of latentDim (MLA: DeepSeek-V2/V3, Kimi). */
  LATENT(1),
  /** A value this binding does not know (from a newer kdn); {@link #value()} is -1. */
  UNKNOWN(-1);

  private static final CacheKind[] VALUES = values();
  private final int value;

  CacheKind(int value) {
    this.value = value;
  }

  /** The value in kdn.h. */
  public int value() {
    return value;
  }

  /** The constant for a value of kdn.h; {@link #UNKNOWN} for one this binding does not know. */
  public static CacheKind fromNative(int value) {
    for (CacheKind v : VALUES) {
      if (v.value == value && v != UNKNOWN) return v;
    }
    return UNKNOWN;
  }
}

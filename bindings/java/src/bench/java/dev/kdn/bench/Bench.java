// SPDX-License-Identifier: Apache-2.0
package dev.kdn.bench;

import dev.kdn.DType;
import dev.kdn.Kdn;
import dev.kdn.KdnRuntime;
import dev.kdn.KvResult;
import dev.kdn.Model;
import dev.kdn.ModelSpec;
import dev.kdn.Request;
import dev.kdn.RuntimeOptions;
import dev.kdn.TierConfig;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.Locale;

/**
 * The Java side of {@code kdn bench bindings}: one 32 MiB chunk (Llama-3-8B's shape, 256 tokens of
 * bf16) retrieved into a direct ByteBuffer, and the lookup of its 256 tokens. Prints one line:
 * {"retrieve_gbps": x, "lookup_us": y}. Usage: bench [--repeats N] (default 10).
 */
public final class Bench {
  private static final int TOKENS = 256;
  private static final int BYTES = 32 << 20;
  private static final int LOOKUPS_PER_BATCH = 20000;

  private Bench() {}

  public static void main(String[] args) {
    int repeats = 10;
    for (int i = 0; i < args.length; ++i) {
      if (args[i].equals("--repeats") && i + 1 < args.length) {
        repeats = Integer.parseInt(args[++i]);
      } else {
        System.err.println("usage: bench [--repeats N]");
        System.exit(2);
      }
    }
    if (repeats < 1) repeats = 1;

    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(TOKENS).tier(TierConfig.host(256L << 20)).build();
    ModelSpec spec = ModelSpec.builder().layers(32).kvHeads(8).headDim(128).dtype(DType.BF16).fingerprint("bench-8b")
        .build();
    int[] ids = new int[TOKENS];
    for (int i = 0; i < TOKENS; ++i) ids[i] = i % 32000;

    try (KdnRuntime rt = KdnRuntime.create(options); Model model = rt.createModel(spec)) {
      if (model.kvBytesPerToken() * TOKENS != BYTES) throw new AssertionError("not 32 MiB of KV");
      Request request = Request.ofTokens(ids);
      ByteBuffer src = Kdn.allocate(BYTES);
      for (int i = 0; i < BYTES / 8; ++i) src.putLong(i * 8, 0x3f803f80_3f803f80L + i);
      if (model.store("bench", request, src).tokens() != TOKENS) throw new AssertionError("store");

      ByteBuffer dst = Kdn.allocate(BYTES);
      check(model.retrieve("bench", request, dst)); // warm-up
      if (!dst.equals(src)) throw new AssertionError("retrieved KV differs");
      double[] seconds = new double[repeats];
      for (int r = 0; r < repeats; ++r) {
        long t0 = System.nanoTime();
        KvResult res = model.retrieve("bench", request, dst);
        seconds[r] = (System.nanoTime() - t0) / 1e9;
        check(res);
      }
      double gbps = BYTES / median(seconds) / 1e9;

      // JIT warm-up of the lookup path (C2 compiles after ~10k calls), then 5 batches.
      for (int i = 0; i < 3 * LOOKUPS_PER_BATCH; ++i) lookup(model, request);
      double[] us = new double[5];
      for (int b = 0; b < us.length; ++b) {
        long t0 = System.nanoTime();
        for (int i = 0; i < LOOKUPS_PER_BATCH; ++i) lookup(model, request);
        us[b] = (System.nanoTime() - t0) / 1e3 / LOOKUPS_PER_BATCH;
      }
      System.out.printf(Locale.ROOT, "{\"retrieve_gbps\": %.4f, \"lookup_us\": %.4f}%n", gbps, median(us));
    }
  }

  private static void lookup(Model model, Request request) {
    if (model.lookup("bench", request).cachedTokens() != TOKENS) throw new AssertionError("lookup missed");
  }

  private static void check(KvResult r) {
    if (r.tokens() != TOKENS) throw new AssertionError("retrieve: " + r);
  }

  private static double median(double[] v) {
    double[] s = v.clone();
    Arrays.sort(s);
    int n = s.length;
    return n % 2 == 1 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  }
}

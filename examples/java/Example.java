// SPDX-License-Identifier: Apache-2.0
// kdn from Java: keep the KV cache of a prompt, find it again, read it back, check every byte,
// keep it as a knowledge item, move it through device memory on the emulated device, print the
// statistics. The KV is real: what `kdn generate --dump-kv
// PREFIX` wrote for 48 positions of the reference model (stories260K: 5 layers, 4 KV heads of 8
// dims, float32), PREFIX.k.f32 and .v.f32 ([layer][position][head][dim]) and PREFIX.tokens.i32.
//
// Run: java -cp <build>/bindings/java/kdn.jar Example.java PREFIX   (kdn.jar carries the native libraries)
import dev.kdn.*;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

public class Example {
  static final int LAYERS = 5, HEADS = 4, HEAD_DIM = 8, POSITIONS = 48;
  static final int TOKEN_ELEMS = HEADS * HEAD_DIM, FILE_ELEMS = LAYERS * POSITIONS * TOKEN_ELEMS;

  public static void main(String[] args) throws IOException {
    byte[] k = Files.readAllBytes(Path.of(args[0] + ".k.f32"));
    byte[] v = Files.readAllBytes(Path.of(args[0] + ".v.f32"));
    int[] prompt = new int[POSITIONS];
    ByteBuffer.wrap(Files.readAllBytes(Path.of(args[0] + ".tokens.i32"))).order(ByteOrder.LITTLE_ENDIAN)
        .asIntBuffer().get(prompt);
    check(k.length == 4 * FILE_ELEMS && v.length == 4 * FILE_ELEMS, "48 positions of KV");
    System.out.println("kdn " + Kdn.version());

    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(16).tier(TierConfig.host(16 << 20)).build();
    ModelSpec spec = ModelSpec.builder().layers(LAYERS).kvHeads(HEADS).headDim(HEAD_DIM).dtype(DType.F32)
        .fingerprint("stories260K").build();
    try (KdnRuntime rt = KdnRuntime.create(options); Model model = rt.createModel(spec)) {
      // The engine's KV where it lies: the K file, then the V file, in one direct buffer.
      ByteBuffer engine = Kdn.allocate(k.length + v.length).put(k).put(v);
      KvView strided = KvView.contiguous().strideLayer(POSITIONS * TOKEN_ELEMS).strideKv(FILE_ELEMS)
          .strides(TOKEN_ELEMS, HEAD_DIM, 1).build();
      Request request = Request.ofTokens(prompt);
      KvResult stored = model.store("example", request, strided, engine);
      System.out.printf("stored: %d tokens%n", stored.tokens());
      check(stored.tokens() == POSITIONS, "all 48 tokens stored");

      // The prompt, and its first 40 tokens, of which the two whole chunks (32 tokens) count.
      List<LookupResult> found = model.lookup("example", List.of(request, Request.ofTokens(prompt, 0, 40)));
      System.out.printf("lookup: %d and %d tokens cached%n", found.get(0).cachedTokens(), found.get(1).cachedTokens());
      check(found.get(0).cachedTokens() == 48 && found.get(1).cachedTokens() == 32, "48 and 32 cached");

      // Back in the canonical layout [layer][k|v][position][head][dim], compared with the files.
      ByteBuffer canonical = Kdn.allocate(k.length + v.length);
      check(model.retrieve("example", request, canonical).tokens() == POSITIONS, "48 tokens retrieved");
      checkCanonical(canonical, k, v);
      System.out.println("retrieved: every byte as generated");

      model.knowledgePut("example", "story", 1, "Once upon a time", request, strided, engine);
      for (DocumentInfo doc : model.knowledgeList("example")) {
        System.out.printf("document %s: version %d, %d tokens in %d chunks%n", doc.docId(), doc.version(),
            doc.numTokens(), doc.chunks());
      }
      ByteBuffer fetched = Kdn.allocate(k.length + v.length);
      FetchResult story = model.knowledgeFetch("example", "story", KvView.canonical(POSITIONS), fetched);
      check(java.util.Arrays.equals(story.tokens(), prompt), "the story's tokens");
      checkCanonical(fetched, k, v);
      System.out.println("fetched: the story, every byte as generated");

      // KV in a GPU's memory is a DeviceMemory: an address, its size and the engine's CUDA stream
      // (DeviceMemory.of(devicePtr, bytes).withCudaStream(stream)). Without a GPU, a runtime on the
      // emulated device takes direct buffers instead and runs every device path on the CPU: an
      // engine's GPU integration, tested anywhere.
      RuntimeOptions emulated = RuntimeOptions.builder().chunkTokens(16).device(DeviceMode.EMULATED)
          .tier(TierConfig.device(16 << 20)).build();
      try (KdnRuntime drt = KdnRuntime.create(emulated); Model dm = drt.createModel(spec)) {
        dm.store("example", request, strided, DeviceMemory.of(engine));
        ByteBuffer onDevice = Kdn.allocate(k.length + v.length);
        KvResult got = dm.retrieve("example", request, KvView.canonical(), DeviceMemory.of(onDevice));
        check(got.tokens() == POSITIONS && onDevice.equals(canonical), "the KV through device memory");
        System.out.printf("device memory (emulated): %d tokens stored and retrieved, equal to the host path%n",
            got.tokens());
      }

      Stats s = rt.stats();
      System.out.printf("stats: %d stores, %d lookups, %d retrieves, %d chunks, %.2f MiB used%n", s.stores(),
          s.lookups(), s.retrieves(), s.chunks(), s.usedBytes() / 1048576.0);
      for (TierStats t : rt.tierStats()) {
        System.out.printf("tier %s (%s): %d objects, %d hits, %d puts, %.2f of %.2f MiB%n", t.name(), t.kind(),
            t.objects(), t.hits(), t.puts(), t.usedBytes() / 1048576.0, t.capacityBytes() / 1048576.0);
      }
    }
  }

  // Layer l's K is the K file's layer l, its V the V file's.
  static void checkCanonical(ByteBuffer canonical, byte[] k, byte[] v) {
    int layerBytes = POSITIONS * TOKEN_ELEMS * 4;
    for (int l = 0; l < LAYERS; ++l) {
      check(canonical.slice(2 * l * layerBytes, layerBytes).equals(ByteBuffer.wrap(k, l * layerBytes, layerBytes)),
          "layer " + l + "'s K");
      check(canonical.slice((2 * l + 1) * layerBytes, layerBytes)
          .equals(ByteBuffer.wrap(v, l * layerBytes, layerBytes)), "layer " + l + "'s V");
    }
  }

  static void check(boolean ok, String what) {
    if (!ok) {
      System.err.println("check failed: " + what);
      System.exit(1);
    }
  }
}

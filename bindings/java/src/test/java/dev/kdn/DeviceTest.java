// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static org.junit.jupiter.api.Assertions.*;

import dev.kdn.TestSupport.ReferenceKv;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.time.Duration;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * KV in device memory (1.5) on the emulated device: host memory stands in for the GPU's (direct
 * buffers, by {@link DeviceMemory#of(ByteBuffer)}), and every device path runs its kernels' CPU
 * code. The KV is the reference model's (the examples' files).
 */
class DeviceTest {
  private static final int CHUNK = 16;
  /** A chunk of the reference model: 16 tokens x 5 layers x K,V x 4 heads x 8 dims x 4 bytes. */
  private static final long CHUNK_BYTES = (long) CHUNK * ReferenceKv.BYTES / ReferenceKv.POSITIONS;

  private static ReferenceKv ref;

  @BeforeAll
  static void loadReference() {
    ref = ReferenceKv.load();
  }

  /** The emulated device, a device tier with room for two chunks over a disk tier in {@code codec}. */
  private static RuntimeOptions deviceOverDisk(Path dir, String codec) {
    return RuntimeOptions.builder().chunkTokens(CHUNK).device(DeviceMode.EMULATED)
        .tier(TierConfig.device(2 * CHUNK_BYTES).withWatermarks(1.0f, 1.0f))
        .tier(TierConfig.disk(dir, 64 << 20).withCodec(codec)).build();
  }

  @Test
  void testDeviceMemoryRaw(@TempDir Path dir) {
    roundTrip(dir, "raw", false);
  }

  /** Chunks of a lossy codec: decoded on the device, as the host path decodes them, byte for byte. */
  @Test
  void testDeviceMemoryLossyCodec(@TempDir Path dir) {
    roundTrip(dir, "kdn", true);
  }

  /**
   * A store from device memory in the engine's layout, then a retrieve into device memory in the
   * canonical one, bit-identical with a retrieve into a buffer (lossless, with the files; lossy,
   * wherever both decoded: {@link #assertSameUnlessDemoted}); the same through a load op, and a
   * save op from device memory.
   */
  private static void roundTrip(Path dir, String codec, boolean lossy) {
    Request prompt = Request.ofTokens(ref.tokens());
    ByteBuffer engine = ref.engine();
    try (KdnRuntime rt = KdnRuntime.create(deviceOverDisk(dir, codec));
        Model m = rt.createModel(ReferenceKv.spec())) {
      // The engine's stream: never dereferenced on the emulated device.
      DeviceMemory source = DeviceMemory.of(engine).withCudaStream(0x5eed);
      assertEquals(0x5eed, source.cudaStream());
      assertSame(engine, source.buffer());
      assertEquals(ReferenceKv.BYTES, source.bytes());
      KvResult stored = m.store("device", prompt, ReferenceKv.engineView(), source);
      assertEquals(ReferenceKv.POSITIONS, stored.tokens());
      assertEquals(ref.engine(), engine, "a store reads only");
      // Three chunks, room for two: the first goes down to disk, in the codec.
      TestSupport.waitUntil("a chunk on disk", () -> rt.tierStats(1).objects() == 1);
      assertEquals(codec.equals("raw") ? 0 : 1, rt.tierStats(1).encodedChunks());

      ByteBuffer onDevice = Kdn.allocate(ReferenceKv.BYTES);
      KvResult got = m.retrieve("device", prompt, KvView.canonical(), DeviceMemory.of(onDevice));
      assertEquals(ReferenceKv.POSITIONS, got.tokens());
      assertEquals(ReferenceKv.POSITIONS, got.covered());
      assertEquals(lossy, got.lossy());
      ByteBuffer onHost = Kdn.allocate(ReferenceKv.BYTES);
      KvResult host = m.retrieve("device", prompt, onHost);
      assertEquals(ReferenceKv.POSITIONS, host.tokens());
      assertEquals(lossy, host.lossy());
      // The first chunk was on disk before either retrieve: decoded by both, on the device and on
      // the CPU (or promoted, decoded on the CPU), to the same bytes.
      assertEquals(lossy, !prefixOf(onDevice, CHUNK).equals(ref.canonical(CHUNK)), "lossy: decoded on the device");
      assertSameUnlessDemoted(onDevice, onHost, lossy, "the device path writes what the host path writes");
      assertEquals(!lossy, onHost.equals(ref.canonical(ReferenceKv.POSITIONS)), "lossless: the files' KV");

      // A load op into device memory, layer by layer.
      ByteBuffer loaded = Kdn.allocate(ReferenceKv.BYTES);
      DeviceMemory target = DeviceMemory.of(loaded);
      try (Op op = m.loadAsync("device", prompt, KvView.canonical(), target)) {
        assertSame(target, op.deviceMemory());
        assertSame(loaded, op.buffer());
        for (int l = 0; l < ReferenceKv.LAYERS; ++l) assertTrue(op.awaitLayer(l, Duration.ofSeconds(10)));
        assertTrue(op.await(Duration.ofSeconds(10)));
        assertEquals(ReferenceKv.POSITIONS, op.result().tokens());
        assertTrue(op.failedRanges().isEmpty());
      }
      assertSameUnlessDemoted(onHost, loaded, lossy, "a load op writes what a retrieve writes");

      // A save op from device memory, then back through the host path.
      try (Op op = m.saveAsync("device-2", prompt, ReferenceKv.engineView(), source)) {
        for (int l = 0; l < ReferenceKv.LAYERS; ++l) op.layerReady(l);
        assertTrue(op.await(Duration.ofSeconds(10)));
        assertEquals(ReferenceKv.POSITIONS, op.result().tokens());
      }
      ByteBuffer saved = Kdn.allocate(ReferenceKv.BYTES);
      assertEquals(ReferenceKv.POSITIONS, m.retrieve("device-2", prompt, saved).tokens());
      ByteBuffer savedOnDevice = Kdn.allocate(ReferenceKv.BYTES);
      assertEquals(ReferenceKv.POSITIONS,
          m.retrieve("device-2", prompt, KvView.canonical(), DeviceMemory.of(savedOnDevice)).tokens());
      assertSameUnlessDemoted(saved, savedOnDevice, lossy, "the device path writes what the host path writes");
      if (!lossy) assertEquals(ref.canonical(ReferenceKv.POSITIONS), saved);

      // Both kinds of delivery were measured (1.7), and nothing failed to decode.
      assertTrue(rt.tierStats().stream().anyMatch(t -> t.deliveryNsPerToken() > 0), rt.tierStats().toString());
      assertTrue(rt.tierStats().stream().anyMatch(t -> t.deviceDeliveryNsPerToken() > 0), rt.tierStats().toString());
      assertEquals(0, rt.tierStats(1).decodeFailures());
      assertEquals(0, rt.stats().recomputeTokens());
    }
  }

  /**
   * What two reads of the prompt (48 positions, canonical) have in common. Lossless, the same
   * bytes. Lossy, the same bytes but where the earlier read got a chunk exactly as stored and the
   * later one got it decoded: a read promotes the chunk it found on disk to the full device tier
   * in the background, which sends another chunk down to disk, encoded, and from then on its
   * encoding is all there is (whether that happens before the next read is timing). Every chunk
   * decoded is the one decode of its one encoding, on the device as on the CPU, byte for byte;
   * none comes back exact once decoded.
   */
  private static void assertSameUnlessDemoted(ByteBuffer earlier, ByteBuffer later, boolean lossy, String what) {
    if (!lossy) {
      assertEquals(earlier, later, what);
      return;
    }
    for (int first = 0; first < ReferenceKv.POSITIONS; first += CHUNK) {
      ByteBuffer a = positions(earlier, first, CHUNK), b = positions(later, first, CHUNK);
      ByteBuffer stored = ref.canonical(first, first + CHUNK);
      if (a.equals(stored)) continue;  // exact, then exact or (demoted between the reads) decoded
      assertEquals(a, b, what + ": the chunk at " + first + ", decoded, differs");
    }
  }

  /** A prefix of the prompt: a device retrieve writes the cached whole chunks, as a host one does. */
  @Test
  void testDeviceMemoryPrefix() {
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(CHUNK).device(DeviceMode.EMULATED)
        .tier(TierConfig.host(16 << 20)).build();
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(ReferenceKv.spec())) {
      int cached = 2 * CHUNK;
      Request first = Request.ofTokens(ref.tokens(), 0, cached);
      ByteBuffer canonicalPrefix = ref.canonical(cached);
      assertEquals(cached, m.store("device", first, KvView.canonical(), DeviceMemory.of(canonicalPrefix)).tokens());
      ByteBuffer out = Kdn.allocate(ReferenceKv.BYTES);
      KvResult got = m.retrieve("device", Request.ofTokens(ref.tokens()), KvView.canonical(), DeviceMemory.of(out));
      assertEquals(cached, got.tokens());
      assertEquals(cached, got.covered());
      assertEquals(canonicalPrefix, prefixOf(out, cached));
      // The positions past the prefix are the engine's to compute: untouched.
      ByteBuffer rest = suffixOf(out, cached);
      assertEquals(Kdn.allocate(rest.capacity()), rest);
      assertEquals(1, rt.stats().stores());
      assertEquals(1, rt.stats().retrieves());
      // Delivered into device memory, measured as such (1.7).
      TierStats host = rt.tierStats(0);
      assertTrue(host.deviceDeliveryNsPerToken() > 0, host.toString());
      assertEquals(0, host.deliveryNsPerToken(), host.toString());
    }
  }

  /** Of a canonical buffer of 48 positions, the canonical buffer of its first {@code positions}. */
  private static ByteBuffer prefixOf(ByteBuffer full, int positions) {
    return positions(full, 0, positions);
  }

  /** Of a canonical buffer of 48 positions, the canonical buffer of the positions from {@code first}. */
  private static ByteBuffer suffixOf(ByteBuffer full, int first) {
    return positions(full, first, ReferenceKv.POSITIONS - first);
  }

  private static ByteBuffer positions(ByteBuffer full, int first, int count) {
    int tokenBytes = ReferenceKv.TOKEN_ELEMS * 4;
    ByteBuffer out = Kdn.allocate(2 * ReferenceKv.LAYERS * count * tokenBytes);
    for (int half = 0; half < 2 * ReferenceKv.LAYERS; ++half) {
      out.put(full.slice((half * ReferenceKv.POSITIONS + first) * tokenBytes, count * tokenBytes));
    }
    return out.clear();
  }

  @Test
  void testDeviceMemoryWithoutDevice() {
    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(CHUNK).device(DeviceMode.NONE).build();
    assertEquals(DeviceMode.NONE, options.device());
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(ReferenceKv.spec())) {
      Request prompt = Request.ofTokens(ref.tokens());
      ByteBuffer engine = ref.engine();
      DeviceMemory memory = DeviceMemory.of(engine);
      assertThrows(UnsupportedException.class, () -> m.store("device", prompt, ReferenceKv.engineView(), memory));
      assertThrows(UnsupportedException.class, () -> m.retrieve("device", prompt, KvView.canonical(), memory));
      assertThrows(UnsupportedException.class, () -> m.loadAsync("device", prompt, KvView.canonical(), memory));
      assertThrows(UnsupportedException.class, () -> m.saveAsync("device", prompt, KvView.canonical(), memory));
      assertEquals(ref.engine(), engine, "nothing was touched");
      assertEquals(0, rt.stats().stores());
      // The host path is there as ever.
      assertEquals(ReferenceKv.POSITIONS, m.store("device", prompt, ReferenceKv.engineView(), engine).tokens());
    }
  }

  @Test
  void testBadDeviceMemory() {
    assertThrows(IllegalArgumentException.class, () -> DeviceMemory.of(0, 64));
    assertThrows(IllegalArgumentException.class, () -> DeviceMemory.of(4096, -1));
    assertThrows(IllegalArgumentException.class, () -> DeviceMemory.of(ByteBuffer.allocate(64)));
    assertThrows(NullPointerException.class, () -> DeviceMemory.of((ByteBuffer) null));
    DeviceMemory raw = DeviceMemory.of(0x7000_0000L, 1 << 20).withCudaStream(7);
    assertEquals(0x7000_0000L, raw.address());
    assertEquals(1 << 20, raw.bytes());
    assertEquals(7, raw.cudaStream());
    assertNull(raw.buffer());
    ByteBuffer direct = Kdn.allocate(64);
    assertNotEquals(0, DeviceMemory.of(direct).address());
    assertEquals(DeviceMemory.of(direct).address(), DeviceMemory.of(direct.slice(0, 64)).address());
    assertEquals(DeviceMemory.of(direct).address() + 16, DeviceMemory.of(direct.slice(16, 48)).address());

    RuntimeOptions options = RuntimeOptions.builder().chunkTokens(CHUNK).device(DeviceMode.EMULATED).build();
    try (KdnRuntime rt = KdnRuntime.create(options); Model m = rt.createModel(ReferenceKv.spec())) {
      Request prompt = Request.ofTokens(ref.tokens());
      m.store("device", prompt, ReferenceKv.engineView(), DeviceMemory.of(ref.engine()));
      // kdn writes a retrieve's memory: not a read-only buffer's.
      DeviceMemory readOnly = DeviceMemory.of(Kdn.allocate(ReferenceKv.BYTES).asReadOnlyBuffer());
      assertThrows(IllegalArgumentException.class, () -> m.retrieve("device", prompt, KvView.canonical(), readOnly));
      assertThrows(IllegalArgumentException.class, () -> m.loadAsync("device", prompt, KvView.canonical(), readOnly));
      // Too small for the request: kdn refuses it before touching anything.
      ByteBuffer small = Kdn.allocate(ReferenceKv.BYTES / 2);
      assertThrows(InvalidArgumentException.class,
          () -> m.retrieve("device", prompt, KvView.canonical(), DeviceMemory.of(small)));
      assertEquals(Kdn.allocate(ReferenceKv.BYTES / 2), small);
      assertThrows(NullPointerException.class, () -> m.store("device", prompt, KvView.canonical(), (DeviceMemory) null));
      assertThrows(NullPointerException.class,
          () -> m.store("device", prompt, null, DeviceMemory.of(ref.engine())));
    }
    // A closed model, as for buffers.
    KdnRuntime rt = KdnRuntime.create(options);
    Model closed = rt.createModel(ReferenceKv.spec());
    closed.close();
    rt.close();
    Request prompt = Request.ofTokens(ref.tokens());
    DeviceMemory memory = DeviceMemory.of(ref.engine());
    assertThrows(IllegalStateException.class, () -> closed.store("device", prompt, KvView.canonical(), memory));
    assertThrows(IllegalStateException.class, () -> closed.loadAsync("device", prompt, KvView.canonical(), memory));
  }

  @Test
  void testDeviceModes() {
    RuntimeOptions defaults = RuntimeOptions.builder().build();
    assertEquals(DeviceMode.AUTO, defaults.device());
    assertEquals(0, defaults.deviceOrdinal());
    assertThrows(IllegalArgumentException.class, () -> RuntimeOptions.builder().device(DeviceMode.UNKNOWN));
    // A negative ordinal is kdn's to refuse.
    RuntimeOptions negative = RuntimeOptions.builder().device(DeviceMode.EMULATED).deviceOrdinal(-1).build();
    assertEquals(-1, negative.deviceOrdinal());
    assertThrows(InvalidArgumentException.class, () -> KdnRuntime.create(negative));
    // AUTO: a GPU if there is one, else none; either way the runtime is made.
    try (KdnRuntime rt = KdnRuntime.create(RuntimeOptions.builder().device(DeviceMode.AUTO).build())) {
      assertFalse(rt.isClosed());
    }
    // CUDA: a GPU that is not there is UNSUPPORTED (no machine has device 4095).
    RuntimeOptions noSuchGpu = RuntimeOptions.builder().device(DeviceMode.CUDA).deviceOrdinal(4095).build();
    KdnException e = assertThrows(KdnException.class, () -> KdnRuntime.create(noSuchGpu));
    assertTrue(e instanceof UnsupportedException || e instanceof InvalidArgumentException, e.toString());
  }
}

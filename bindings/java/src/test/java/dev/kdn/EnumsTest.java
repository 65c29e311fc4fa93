// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import static org.junit.jupiter.api.Assertions.*;

import org.junit.jupiter.api.Test;

class EnumsTest {
  @Test
  void testEnumsAreOpen() {
    assertEquals(DType.BF16, DType.fromNative(2));
    assertEquals(DType.UNKNOWN, DType.fromNative(77));
    assertEquals(2, DType.F16.bytes());
    assertEquals(TierKind.REMOTE, TierKind.fromNative(3));
    assertEquals(TierKind.REDIS, TierKind.fromNative(4));
    assertEquals(TierKind.UNKNOWN, TierKind.fromNative(-1));
    assertEquals(EvictionPolicy.UNKNOWN, EvictionPolicy.fromNative(9));
    assertEquals(EvictionPolicy.COST, EvictionPolicy.fromNative(2));
    assertEquals(DeviceMode.AUTO, DeviceMode.fromNative(0));
    assertEquals(DeviceMode.NONE, DeviceMode.fromNative(1));
    assertEquals(DeviceMode.EMULATED, DeviceMode.fromNative(2));
    assertEquals(DeviceMode.CUDA, DeviceMode.fromNative(3));
    assertEquals(DeviceMode.UNKNOWN, DeviceMode.fromNative(4));
    assertEquals(DeviceMode.UNKNOWN, DeviceMode.fromNative(-1));
    assertEquals(KvLayout.PAGED_HND, KvLayout.fromNative(2));
    assertEquals(OpState.UNKNOWN, OpState.fromNative(4));
    assertEquals(LatencyKind.STORE, LatencyKind.fromNative(2));
    assertEquals(RopeStyle.NEOX, RopeStyle.fromNative(1));
    assertEquals(Status.UNKNOWN, Status.fromNative(-99));
    assertEquals(Status.BUFFER_TOO_SMALL, Status.fromNative(-12));
  }

  @Test
  void testExceptionPerStatus() {
    for (Status s : Status.values()) {
      if (s == Status.OK || s == Status.UNKNOWN) continue;
      KdnException e = KdnException.of(s.code(), "m", 5);
      assertEquals(s, e.status(), s.toString());
      assertEquals(s.code(), e.code());
      assertEquals("m", e.getMessage());
      assertNotEquals(KdnException.class, e.getClass(), "a class of its own for " + s);
      assertEquals(Kdn.statusString(s.code()), "KDN_ERR_" + s.name(), "kdn names it so too");
    }
    assertInstanceOf(RetryableException.class, KdnException.of(Status.BUSY.code(), "", 0));
    assertInstanceOf(RetryableException.class, KdnException.of(Status.UNAVAILABLE.code(), "", 0));
    assertInstanceOf(RetryableException.class, KdnException.of(Status.TIMEOUT.code(), "", 0));
    assertInstanceOf(CallerException.class, KdnException.of(Status.VERSION.code(), "", 0));
    assertEquals(5, ((BufferTooSmallException) KdnException.of(Status.BUFFER_TOO_SMALL.code(), "", 5)).needed());
    KdnException unknown = KdnException.of(-99, "new", 0);
    assertEquals(KdnException.class, unknown.getClass());
    assertEquals(Status.UNKNOWN, unknown.status());
    assertEquals(-99, unknown.code());
  }
}

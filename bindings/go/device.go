// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include "kdn_go.h"
*/
import "C"

import (
	"context"
	"strconv"
)

// DeviceMode is the GPU a runtime delivers KV to (RuntimeOptions.Device,
// since 1.5), for the calls on DeviceMemory and for device tiers.
type DeviceMode int32

const (
	// DeviceAuto: the CUDA device DeviceOrdinal when libkdn was built with
	// CUDA and the machine has a usable GPU; otherwise none.
	DeviceAuto DeviceMode = 0
	// DeviceNone: no device; the calls on DeviceMemory are ErrUnsupported
	// (a device tier is emulated in host memory).
	DeviceNone DeviceMode = 1
	// DeviceEmulated: host memory stands in for the GPU's, and every device
	// path runs the CPU path of its kernel, byte for byte: to develop and
	// test an engine's GPU integration on a machine without one.
	// DeviceMemory is then C-allocated host memory (HostBuffer.EmulatedDevice).
	DeviceEmulated DeviceMode = 2
	// DeviceCUDA: the CUDA device DeviceOrdinal; NewRuntime fails with
	// ErrUnsupported when there is none.
	DeviceCUDA DeviceMode = 3
)

func (d DeviceMode) String() string {
	switch d {
	case DeviceAuto:
		return "auto"
	case DeviceNone:
		return "none"
	case DeviceEmulated:
		return "emulated"
	case DeviceCUDA:
		return "cuda"
	}
	return "device(" + strconv.Itoa(int(d)) + ")"
}

// DeviceMemory is KV in the memory of the runtime's device (since 1.5):
// what StoreDevice, RetrieveDevice, LoadAsyncDevice and SaveAsyncDevice
// read or write, through the views, as the host calls do a []byte (the
// views' offsets and bounds are within Size bytes from Ptr).
//
// Ptr is an address that the caller vouches for: kdn reads and writes Size
// bytes from it on the device, during the call, or until an op is closed.
// It must never be Go memory (cgo forbids C from keeping a Go pointer, and
// the collector may move or free it): with a GPU, memory from cudaMalloc
// (or a framework's tensor); with DeviceEmulated, C-allocated host memory,
// such as a HostBuffer's (EmulatedDevice). The binding cannot check it, nor
// keep it alive: the caller keeps it valid until the call returns or the op
// is closed.
//
// The knowledge calls take host memory only, as kdn's do.
type DeviceMemory struct {
	Ptr  uintptr // the device address; 0 is refused
	Size int     // bytes reachable from Ptr; must be > 0
	// Stream is the engine's CUDA stream (a cudaStream_t; since 1.8), or 0:
	// kdn's work on the memory starts after the work queued on it when the
	// call was made, and what the engine queues on it after the call
	// returns (an op: after it ends) runs after kdn's writes. With
	// DeviceEmulated any value is accepted and never used.
	Stream uintptr

	buf *HostBuffer // EmulatedDevice's buffer, held while kdn uses it
}

// EmulatedDevice is the buffer as the device memory of a runtime created
// with DeviceEmulated, where host memory stands in for the GPU's (with a
// real device, host memory is not device memory: kdn would fail, or worse).
// The calls given it hold the buffer as LoadAsync does: they fail with
// ErrClosed once the buffer is closed, and an op keeps its memory until the
// op is closed.
func (b *HostBuffer) EmulatedDevice() DeviceMemory {
	return DeviceMemory{Ptr: uintptr(b.p), Size: b.n, buf: b}
}

func (d *DeviceMemory) check() error {
	if d.Ptr == 0 {
		return invalid("DeviceMemory.Ptr is 0")
	}
	if d.Size <= 0 {
		return invalid("DeviceMemory.Size must be > 0")
	}
	return nil
}

func (d *DeviceMemory) c() C.kdn_go_mem {
	return C.kdn_go_mem{device: C.uintptr_t(d.Ptr), stream: C.uintptr_t(d.Stream)}
}

func (m *Model) deviceCall(ctx context.Context, which C.int, ns string, req *Request, mem *DeviceMemory,
	views []KVView) (KVResult, error) {
	if err := ctxErr(ctx); err != nil {
		return KVResult{}, err
	}
	if err := mem.check(); err != nil {
		return KVResult{}, err
	}
	if !m.g.enter() {
		return KVResult{}, ErrClosed
	}
	defer m.g.leave()
	if mem.buf != nil {
		if !mem.buf.acquire() {
			return KVResult{}, ErrClosed
		}
		defer mem.buf.release()
	}
	return m.kv(which, ns, req, nil, mem.Size, mem.c(), views, nil)
}

// StoreDevice is Store from device memory (since 1.5): the views describe
// mem (none: the canonical layout in the model's dtype). ErrUnsupported
// when the runtime has no device (RuntimeOptions.Device).
func (m *Model) StoreDevice(ctx context.Context, ns string, req Request, mem DeviceMemory,
	views ...KVView) (KVResult, error) {
	return m.deviceCall(ctx, C.KDN_GO_STORE, ns, &req, &mem, views)
}

// RetrieveDevice is Retrieve into device memory (since 1.5): a device
// tier's chunks go device to device, encoded chunks of lower tiers are
// decoded on the device where their codec allows it. The KV is in place
// when it returns. ErrUnsupported when the runtime has no device.
func (m *Model) RetrieveDevice(ctx context.Context, ns string, req Request, mem DeviceMemory,
	views ...KVView) (KVResult, error) {
	return m.deviceCall(ctx, C.KDN_GO_RETRIEVE, ns, &req, &mem, views)
}

func (m *Model) deviceOp(which C.int, ns string, req *Request, mem *DeviceMemory, views []KVView) (*Op, error) {
	if err := mem.check(); err != nil {
		return nil, err
	}
	return m.startOp(which, ns, req, nil, mem.Size, mem.c(), mem.buf, views)
}

// LoadAsyncDevice is LoadAsync into device memory (since 1.5): layer by
// layer, in up to 8 steps of consecutive layers, each in place when
// WaitLayer returns for it. mem must stay valid until the op is closed.
func (m *Model) LoadAsyncDevice(ns string, req Request, mem DeviceMemory, views ...KVView) (*Op, error) {
	return m.deviceOp(C.KDN_GO_LOAD, ns, &req, &mem, views)
}

// SaveAsyncDevice is SaveAsync from device memory (since 1.5): call
// LayerReady once per model layer as it becomes final, then Wait. mem must
// stay valid until the op is closed.
func (m *Model) SaveAsyncDevice(ns string, req Request, mem DeviceMemory, views ...KVView) (*Op, error) {
	return m.deviceOp(C.KDN_GO_SAVE, ns, &req, &mem, views)
}

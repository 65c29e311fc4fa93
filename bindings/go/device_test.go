// SPDX-License-Identifier: Apache-2.0
package kdn

// KV in device memory (1.5, with a stream since 1.8) on the emulated
// device: host memory stands in for the GPU's, and every device path runs
// its kernels' CPU path. The "device" memory is C memory (a HostBuffer's):
// Go memory must never be given to kdn as device memory.

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// newBuf is a HostBuffer closed with the test.
func newBuf(t *testing.T, n int) *HostBuffer {
	t.Helper()
	b, err := NewHostBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// bufUsers is how many hold b: itself until closed, and each op using it.
func bufUsers(b *HostBuffer) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.users
}

// pagedView is a vLLM-like paged view of layout over one slab of 5 blocks
// per layer, the request's 3 blocks scattered; and the slab's size in bytes.
func pagedView(layout Layout) (KVView, int) {
	const blocks = 5
	layerElems := blocks * chunk * row
	view := KVView{DType: F32, Layout: layout, BlockSize: chunk, BlockTable: []int32{3, 0, 4}}
	for l := 0; l < layers; l++ {
		view.KOffsets = append(view.KOffsets, int64((2*l)*layerElems))
		view.VOffsets = append(view.VOffsets, int64((2*l+1)*layerElems))
	}
	return view, 2 * layers * layerElems * 4
}

// emulatedFixture is a runtime on the emulated device: a device tier with
// room for two chunks over a disk tier in codec, and the model.
func emulatedFixture(t *testing.T, codec string) fixture {
	t.Helper()
	device := DeviceTier(2 * chunk * uint64(layers*2*row*4))
	device.HighWatermark, device.LowWatermark = 1, 1
	disk := DiskTier(t.TempDir(), 16<<20)
	disk.Codec = codec
	return newFixture(t, &RuntimeOptions{ChunkTokens: chunk, Device: DeviceEmulated, Tiers: []TierConfig{device, disk}})
}

// Store from device memory, retrieve and load into device memory, save from
// it: the KV is bit-identical to the stored KV and to the host path's, in
// the canonical layout and in a paged one, with a chunk below the device
// tier (encoded with zstd, or raw).
func TestDeviceViewsEmulated(t *testing.T) {
	for _, codec := range []string{"raw", "zstd"} {
		t.Run(codec, func(t *testing.T) {
			f := emulatedFixture(t, codec)
			tokens, kv := testTokens(positions), canonical(positions, 7)
			src := newBuf(t, len(kv)*4)
			copy(src.Bytes(), Float32s(kv))
			mem := src.EmulatedDevice()
			mem.Stream = 0x1234 // a stand-in cudaStream_t: the emulated device never uses it
			res, err := f.m.StoreDevice(bg, ns, Tokens(tokens), mem)
			if err != nil || res.Tokens != positions || res.State != OpDone {
				t.Fatalf("StoreDevice = %+v, %v", res, err)
			}
			// Three chunks, room for two: the first goes down to the disk.
			waitFor(t, "a chunk on the disk tier", func() bool { ts, _ := f.rt.TierStats(1); return ts.Objects >= 1 })
			if ts, _ := f.rt.TierStats(1); (ts.EncodedChunks > 0) != (codec != "raw") {
				t.Fatalf("disk tier (%s): %d chunks encoded", codec, ts.EncodedChunks)
			}

			// Canonical, into device memory: the stored KV.
			dst := newBuf(t, len(kv)*4)
			res, err = f.m.RetrieveDevice(bg, ns, Tokens(tokens), dst.EmulatedDevice())
			if err != nil || res.Tokens != positions || res.Covered != positions || res.Lossy() {
				t.Fatalf("RetrieveDevice = %+v, %v", res, err)
			}
			if !bytes.Equal(dst.Bytes(), Float32s(kv)) {
				t.Fatal("the KV retrieved into device memory differs from the KV stored")
			}

			// Paged: the device path writes what the host path writes.
			for _, layout := range []Layout{LayoutPagedNHD, LayoutPagedHND} {
				view, size := pagedView(layout)
				devSlab, hostSlab := newBuf(t, size), make([]byte, size)
				dm := devSlab.EmulatedDevice()
				dm.Stream = 0x1234
				if res, err := f.m.RetrieveDevice(bg, ns, Tokens(tokens), dm, view); err != nil || res.Tokens != positions {
					t.Fatalf("%v: RetrieveDevice = %+v, %v", layout, res, err)
				}
				if res, err := f.m.Retrieve(bg, ns, Tokens(tokens), hostSlab, view); err != nil || res.Tokens != positions {
					t.Fatalf("%v: Retrieve = %+v, %v", layout, res, err)
				}
				if !bytes.Equal(devSlab.Bytes(), hostSlab) || bytes.Equal(hostSlab, make([]byte, size)) {
					t.Fatalf("%v: the device and host paths wrote different KV", layout)
				}
				// Stored from the paged device slab under other tokens: found again, canonical.
				other := testTokens(positions + 1)[1:]
				if res, err := f.m.StoreDevice(bg, ns+"-paged", Tokens(other), devSlab.EmulatedDevice(), view); err != nil ||
					res.Tokens != positions {
					t.Fatalf("%v: StoreDevice (paged) = %+v, %v", layout, res, err)
				}
				out := make([]float32, len(kv))
				if res, err := f.m.Retrieve(bg, ns+"-paged", Tokens(other), Float32s(out)); err != nil ||
					res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(kv)) {
					t.Fatalf("%v: paged device store, canonical retrieve: %+v, %v", layout, res, err)
				}
			}

			// The asynchronous ops: a load layer by layer into device memory,
			// whose buffer the op holds; a save from it.
			ctx, cancel := context.WithTimeout(bg, 30*time.Second)
			defer cancel()
			loadBuf := newBuf(t, len(kv)*4)
			load, err := f.m.LoadAsyncDevice(ns, Tokens(tokens), loadBuf.EmulatedDevice())
			if err != nil {
				t.Fatal(err)
			}
			got := loadBuf.Bytes()
			loadBuf.Close() // the op keeps the memory until it is closed
			for l := 0; l < layers; l++ {
				if err := load.WaitLayer(ctx, l); err != nil {
					t.Fatalf("WaitLayer(%d): %v", l, err)
				}
			}
			if err := load.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if res, err := load.Result(); err != nil || res.Tokens != positions || res.NumFailed != 0 {
				t.Fatalf("LoadAsyncDevice result = %+v, %v", res, err)
			}
			if !bytes.Equal(got, Float32s(kv)) {
				t.Fatal("the KV loaded into device memory differs from the KV stored")
			}
			load.Close()

			save, err := f.m.SaveAsyncDevice(ns+"-saved", Tokens(tokens), mem)
			if err != nil {
				t.Fatal(err)
			}
			for l := 0; l < layers; l++ {
				if err := save.LayerReady(l); err != nil {
					t.Fatalf("LayerReady(%d): %v", l, err)
				}
			}
			if err := save.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if res, err := save.Result(); err != nil || res.Tokens != positions {
				t.Fatalf("SaveAsyncDevice result = %+v, %v", res, err)
			}
			save.Close()
			out := make([]float32, len(kv))
			if res, err := f.m.Retrieve(bg, ns+"-saved", Tokens(tokens), Float32s(out)); err != nil ||
				res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(kv)) {
				t.Fatalf("Retrieve of the device save = %+v, %v", res, err)
			}

			// The device tier measured its delivery into device memory (1.7).
			if ts, err := f.rt.TierStats(0); err != nil || ts.Kind != TierDevice || ts.DeviceDeliveryNsPerToken <= 0 {
				t.Fatalf("device tier stats = %+v, %v", ts, err)
			}
		})
	}
}

// Device memory where the runtime has no device, bad device memory, and
// bad device modes.
func TestDeviceViewsRefused(t *testing.T) {
	f := newFixture(t, &RuntimeOptions{ChunkTokens: chunk, Device: DeviceNone})
	tokens, kv := testTokens(positions), canonical(positions, 2)
	buf := newBuf(t, len(kv)*4)
	copy(buf.Bytes(), Float32s(kv))
	mem := buf.EmulatedDevice()
	_, err := f.m.StoreDevice(bg, ns, Tokens(tokens), mem)
	wantStatus(t, "StoreDevice without a device", err, ErrUnsupported)
	_, err = f.m.RetrieveDevice(bg, ns, Tokens(tokens), mem)
	wantStatus(t, "RetrieveDevice without a device", err, ErrUnsupported)
	op, err := f.m.LoadAsyncDevice(ns, Tokens(tokens), mem)
	wantStatus(t, "LoadAsyncDevice without a device", err, ErrUnsupported)
	if op != nil {
		t.Fatal("a refused load gave an op")
	}
	if n := bufUsers(buf); n != 1 {
		t.Fatalf("a refused load left the buffer with %d users", n)
	}
	if !bytes.Equal(buf.Bytes(), Float32s(kv)) {
		t.Fatal("a refused call touched the memory")
	}
	if s, _ := f.rt.Stats(); s.Stores != 0 || s.Chunks != 0 {
		t.Fatalf("refused calls counted: %+v", s)
	}

	// Refused before kdn is called.
	for name, bad := range map[string]DeviceMemory{
		"no address": {Size: 64},
		"no size":    {Ptr: mem.Ptr},
	} {
		_, err := f.m.StoreDevice(bg, ns, Tokens(tokens), bad)
		wantStatus(t, "StoreDevice, "+name, err, ErrInvalidArgument)
		_, err = f.m.SaveAsyncDevice(ns, Tokens(tokens), bad)
		wantStatus(t, "SaveAsyncDevice, "+name, err, ErrInvalidArgument)
	}
	closed := newBuf(t, len(kv)*4)
	closedMem := closed.EmulatedDevice()
	closed.Close()
	if _, err := f.m.RetrieveDevice(bg, ns, Tokens(tokens), closedMem); err != ErrClosed {
		t.Fatalf("RetrieveDevice into a closed buffer = %v", err)
	}
	if op, err := f.m.LoadAsyncDevice(ns, Tokens(tokens), closedMem); err != ErrClosed || op != nil {
		t.Fatalf("LoadAsyncDevice into a closed buffer = %v, %v", op, err)
	}
	ended, cancel := context.WithCancel(bg)
	cancel()
	if _, err := f.m.StoreDevice(ended, ns, Tokens(tokens), mem); !errors.Is(err, context.Canceled) {
		t.Fatalf("StoreDevice with an ended context = %v", err)
	}

	// Device modes and ordinals kdn refuses.
	for name, opts := range map[string]*RuntimeOptions{
		"unknown mode":     {Device: 7},
		"negative ordinal": {Device: DeviceEmulated, DeviceOrdinal: -1},
	} {
		rt, err := NewRuntime(opts)
		wantStatus(t, name, err, ErrInvalidArgument)
		if rt != nil {
			t.Fatalf("%s: a runtime", name)
		}
	}
	// CUDA where there is none (a machine with a GPU skips this).
	if rt, err := NewRuntime(&RuntimeOptions{Device: DeviceCUDA}); err == nil {
		rt.Close()
		t.Log("DeviceCUDA: this machine has a GPU")
	} else {
		wantStatus(t, "DeviceCUDA without a GPU", err, ErrUnsupported)
	}
	if DeviceEmulated.String() != "emulated" || DeviceMode(9).String() != "device(9)" {
		t.Fatal("DeviceMode.String")
	}
}

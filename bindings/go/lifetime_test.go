// SPDX-License-Identifier: Apache-2.0
package kdn

// Regression tests of a review: a HostBuffer's memory under a live Bytes
// slice, empty Layers slices, the version checks, and durations in
// milliseconds.

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// dropHostBuffer makes a buffer of n bytes, lets use see it, drops it and
// collects until its finalizer ran; it returns whether that freed it.
func dropHostBuffer(t *testing.T, n int, use func(b *HostBuffer)) bool {
	t.Helper()
	done := make(chan bool, 1)
	func() {
		b, err := NewHostBuffer(n)
		if err != nil {
			t.Fatal(err)
		}
		p := b.p
		hostBufferFinalized.Store(func(q unsafe.Pointer, freed bool) {
			if q == p {
				done <- freed
			}
		})
		use(b)
	}()
	defer hostBufferFinalized.Store(func(unsafe.Pointer, bool) {})
	for deadline := time.Now().Add(10 * time.Second); ; {
		runtime.GC()
		select {
		case freed := <-done:
			return freed
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the dropped HostBuffer was not finalized")
		}
	}
}

// A slice from Bytes outlives its dropped HostBuffer: the finalizer must
// not free the memory under it. 4 MiB is above malloc's mmap threshold, so
// a free unmaps the memory and the reads below fault.
func TestHostBufferBytesOutliveBuffer(t *testing.T) {
	const n = 4 << 20
	var data []byte
	freed := dropHostBuffer(t, n, func(b *HostBuffer) {
		data = b.Bytes()
		for i := range data {
			data[i] = byte(i * 7)
		}
	})
	if freed {
		t.Fatal("the finalizer freed a HostBuffer whose Bytes slice is still in use")
	}
	for i := range data {
		if data[i] != byte(i*7) {
			t.Fatalf("byte %d of the Bytes slice changed after its HostBuffer was dropped", i)
		}
		data[i] = 0
	}
}

// The backstop still frees a dropped buffer of which no slice was taken.
func TestHostBufferFinalizerFreesUnexposed(t *testing.T) {
	if !dropHostBuffer(t, 1<<10, func(b *HostBuffer) {}) {
		t.Fatal("the finalizer kept a HostBuffer no slice refers to")
	}
	// Close then drop: nothing left for the finalizer (Close removes it).
	b, _ := NewHostBuffer(16)
	_ = b.Bytes()
	b.Close()
	if b.Bytes() != nil {
		t.Fatal("Bytes after Close")
	}
}

// An empty, non-nil Layers (and empty offsets) means every layer, as nil
// does; it used to send num_layers 0 with per-layer pointers unset.
func TestEmptyLayersMeanAll(t *testing.T) {
	f, tokens, kv := newFixture(t, nil), testTokens(positions), canonical(positions, 3)
	f.store(t, tokens, kv)
	perLayer := KVView{Layers: []uint32{}}
	for l := 0; l < layers; l++ {
		canonicalOffsets(&perLayer, l)
	}
	for _, c := range []struct {
		name string
		view KVView
	}{
		{"empty layers and offsets", KVView{Layers: []uint32{}, KOffsets: []int64{}, VOffsets: []int64{}}},
		{"empty layers, per-layer offsets", perLayer},
		{"empty layers, one allocation", KVView{Layers: []uint32{}}},
		{"empty layers and block table", KVView{Layers: []uint32{}, BlockTable: []int32{}}},
		{"nil layers, empty offsets", KVView{KOffsets: []int64{}, VOffsets: []int64{}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := make([]float32, len(kv))
			res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out), c.view)
			if err != nil || res.Tokens != positions {
				t.Fatalf("Retrieve = %+v, %v", res, err)
			}
			if !bytes.Equal(Float32s(out), Float32s(kv)) {
				t.Fatal("the retrieved KV differs")
			}
			if _, err := f.m.Store(bg, ns, Tokens(tokens), Float32s(kv), c.view); err != nil {
				t.Fatalf("Store: %v", err)
			}
		})
	}
	// Offsets for some layers only: still refused.
	_, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(kv), KVView{Layers: []uint32{}, KOffsets: []int64{0},
		VOffsets: []int64{positions * row}})
	wantStatus(t, "empty layers with one offset", err, ErrInvalidArgument)
}

func TestCheckLibraryVersion(t *testing.T) {
	need := uint32(BindingVersionMajor*10000 + BindingVersionMinor*100)
	for _, ok := range []uint32{need, need + 1, need + 100, need + 9999 - need%10000} {
		if err := checkLibraryVersion(ok); err != nil {
			t.Errorf("library %d: %v", ok, err)
		}
	}
	for _, bad := range []uint32{need - 1, need - 100, need + 10000, need - 10000, 0} {
		err := checkLibraryVersion(bad)
		if !errors.Is(err, ErrVersion) || !strings.Contains(err.Error(), "libkdn") {
			t.Errorf("library %d: %v, want ErrVersion naming libkdn", bad, err)
		}
	}
	// The library the tests run on passes, and so does creating a runtime.
	if err := checkLibraryVersion(VersionNumber()); err != nil {
		t.Fatal(err)
	}
	// NewRuntime refuses an older library (1.3: no kdn_model_report_prefill,
	// and its kdn_stats ends before tokens_requested), saying which it has
	// and which it needs.
	libraryVersionNumber = func() uint32 { return need - 100 }
	_, err := NewRuntime(nil)
	libraryVersionNumber = VersionNumber
	wantStatus(t, "NewRuntime on an older libkdn", err, ErrVersion)
	older := fmt.Sprintf("libkdn %d.%d.0 ", BindingVersionMajor, BindingVersionMinor-1)
	needs := fmt.Sprintf("needs libkdn %d.%d ", BindingVersionMajor, BindingVersionMinor)
	if !strings.Contains(err.Error(), older) || !strings.Contains(err.Error(), needs) {
		t.Fatalf("NewRuntime on an older libkdn: %q, want it to name %q and %q", err, older, needs)
	}
	if HeaderVersionMajor != BindingVersionMajor || HeaderVersionMinor < BindingVersionMinor {
		t.Fatalf("built with kdn.h %d.%d, for %d.%d", HeaderVersionMajor, HeaderVersionMinor,
			BindingVersionMajor, BindingVersionMinor)
	}
}

// The package builds with a kdn.h of a later minor version (1.4 appends
// fields and a function), and not with an older minor or another major.
func TestBuildsWithLaterMinorHeader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package three times")
	}
	header, err := os.ReadFile(filepath.Join("..", "..", "capi", "include", "kdn", "kdn.h"))
	if err != nil {
		t.Skipf("kdn.h is not beside the binding: %v", err)
	}
	build := func(major, minor int) (bool, string) {
		h := regexp.MustCompile(`(?m)^#define KDN_VERSION_MAJOR \d+$`).ReplaceAll(header,
			[]byte("#define KDN_VERSION_MAJOR "+strconv.Itoa(major)))
		h = regexp.MustCompile(`(?m)^#define KDN_VERSION_MINOR \d+$`).ReplaceAll(h,
			[]byte("#define KDN_VERSION_MINOR "+strconv.Itoa(minor)))
		dir := t.TempDir()
		if err := os.Mkdir(filepath.Join(dir, "kdn"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "kdn", "kdn.h"), h, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", ".")
		// CGO_CPPFLAGS: cgo puts them first, before pkg-config's -I of the
		// real kdn.h (CGO_CFLAGS come after it).
		cmd.Env = append(os.Environ(), "CGO_CPPFLAGS=-I"+dir+" "+os.Getenv("CGO_CPPFLAGS"))
		out, err := cmd.CombinedOutput()
		return err == nil, string(out)
	}
	if ok, out := build(BindingVersionMajor, BindingVersionMinor+1); !ok {
		t.Fatalf("kdn.h %d.%d: the build failed:\n%s", BindingVersionMajor, BindingVersionMinor+1, out)
	}
	// Refused by abi_check.go, not by something else.
	if ok, out := build(BindingVersionMajor, BindingVersionMinor-1); ok || !strings.Contains(out, "abi_check.go") {
		t.Fatalf("kdn.h %d.%d, older than the binding: not refused by abi_check.go:\n%s", BindingVersionMajor,
			BindingVersionMinor-1, out)
	}
	if ok, out := build(BindingVersionMajor+1, BindingVersionMinor); ok || !strings.Contains(out, "abi_check.go") {
		t.Fatalf("kdn.h %d.%d, another major version: not refused by abi_check.go:\n%s", BindingVersionMajor+1,
			BindingVersionMinor, out)
	}
}

func TestDurationMillis(t *testing.T) {
	const maxMs = int64(math.MaxInt64 / time.Millisecond) // the most whole ms a Duration holds
	for _, c := range []struct {
		d    time.Duration
		max  int64
		want int64
	}{
		{0, math.MaxInt64, 0},
		{time.Nanosecond, math.MaxInt64, 1},
		{999 * time.Microsecond, math.MaxInt64, 1},
		{time.Millisecond, math.MaxInt64, 1},
		{time.Millisecond + 1, math.MaxInt64, 2},
		{1500 * time.Millisecond, math.MaxInt64, 1500},
		{math.MaxInt64, math.MaxInt64, maxMs + 1},
		{math.MaxInt64, math.MaxUint32, math.MaxUint32},
		{(math.MaxUint32 + 1) * time.Millisecond, math.MaxUint32, math.MaxUint32},
		{-time.Nanosecond, math.MaxInt64, -1},
		{-time.Hour, math.MaxUint32, -1},
		{math.MinInt64, math.MaxInt64, -1},
	} {
		if got := millis(c.d, c.max); got != c.want {
			t.Errorf("millis(%v, %d) = %d, want %d", c.d, c.max, got, c.want)
		}
	}
	// And back: kdn's milliseconds past time.Duration's range saturate.
	for _, c := range []struct {
		ms   int64
		want time.Duration
	}{
		{-1, -1}, {0, 0}, {1500, 1500 * time.Millisecond},
		{maxMs, time.Duration(maxMs) * time.Millisecond},
		{maxMs + 1, math.MaxInt64}, {math.MaxInt64, math.MaxInt64}, {math.MinInt64, -1},
	} {
		if got := duration(c.ms); got != c.want {
			t.Errorf("duration(%d) = %v, want %v", c.ms, got, c.want)
		}
	}
}

// A tier's Timeout: a sub-millisecond one is not kdn's 0 (the 2 s
// default), a huge one does not wrap, a negative one is refused.
func TestTierTimeout(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint32
	}{
		{0, 0}, {time.Microsecond, 1}, {2 * time.Second, 2000}, {math.MaxInt64, math.MaxUint32},
		{(1 << 32) * time.Millisecond, math.MaxUint32},
	} {
		got, err := tierMillis("Timeout", c.d, math.MaxUint32)
		if err != nil || got != int64(c.want) {
			t.Errorf("tierMillis(Timeout, %v) = %d, %v, want %d", c.d, got, err, c.want)
		}
	}
	remote := RemoteTier("127.0.0.1:1", "token")
	remote.Timeout = time.Microsecond
	rt, err := NewRuntime(&RuntimeOptions{Tiers: []TierConfig{HostTier(1 << 20), remote}})
	if err != nil {
		t.Fatalf("a 1µs tier Timeout: %v", err)
	}
	rt.Close()
	remote.Timeout = -time.Second
	_, err = NewRuntime(&RuntimeOptions{Tiers: []TierConfig{HostTier(1 << 20), remote}})
	wantStatus(t, "a negative tier Timeout", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("a negative tier Timeout: %v", err)
	}
}

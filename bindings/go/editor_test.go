// SPDX-License-Identifier: Apache-2.0
package kdn

import (
	"bytes"
	"errors"
	"runtime/cgo"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// editorFixture is a runtime whose chunks are the whole 48 tokens (one
// chunk: one edit), with the editor, and a model; the KV is stored.
type editorFixture struct {
	fixture
	tokens []int32
	kv     []float32
	calls  *atomic.Int32
}

func newEditorFixture(t *testing.T, edit func(ChunkInfo, []byte) (bool, error)) editorFixture {
	t.Helper()
	calls := new(atomic.Int32)
	rt, err := NewRuntimeWithEditor(&RuntimeOptions{ChunkTokens: positions, HostCapacityBytes: 16 << 20},
		func(info ChunkInfo, kv []byte) (bool, error) {
			defer calls.Add(1)
			return edit(info, kv)
		})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		rt.Close()
	})
	f := editorFixture{fixture{rt, m}, testTokens(positions), canonical(positions, 1), calls}
	f.store(t, f.tokens, f.kv)
	return f
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestEditorEdits(t *testing.T) {
	var mu sync.Mutex
	var seen ChunkInfo
	var seenBytes int
	f := newEditorFixture(t, func(info ChunkInfo, kv []byte) (bool, error) {
		mu.Lock()
		seen, seenBytes = info, len(kv)
		mu.Unlock()
		v0 := AsFloat32s(kv)[int(info.NumTokens)*row:][:int(info.NumTokens)*row] // layer 0's V
		for i := range v0 {
			v0[i] += 1
		}
		return true, nil
	})
	waitFor(t, "the edit", func() bool { s, _ := f.rt.Stats(); return s.Edits >= 1 })
	mu.Lock()
	if seen.NumLayers != layers || seen.NumKVHeads != heads || seen.HeadDim != headDim || seen.NumTokens != positions ||
		seen.DType != F32 || seen.FirstPosition != 0 || seen.ModelFingerprint != f.m.Fingerprint() ||
		seenBytes != positions*int(f.m.KVBytesPerToken()) {
		t.Fatalf("the editor saw %+v and %d bytes", seen, seenBytes)
	}
	mu.Unlock()

	want := append([]float32(nil), f.kv...)
	for i := positions * row; i < 2*positions*row; i++ {
		want[i] += 1
	}
	out := make([]float32, len(f.kv))
	// The edited chunk replaces the stored one a moment after the edit counts.
	waitFor(t, "the edited chunk", func() bool {
		res, err := f.m.Retrieve(bg, ns, Tokens(f.tokens), Float32s(out))
		return err == nil && res.Tokens == positions && bytes.Equal(Float32s(out), Float32s(want))
	})
	if s, _ := f.rt.Stats(); s.EditedServed == 0 || s.Edits != 1 {
		t.Fatalf("Stats = %+v", s)
	}
	if f.calls.Load() != 1 {
		t.Fatalf("the editor ran %d times", f.calls.Load())
	}
}

// The editor's function stays alive while a model does, and is released
// with the last handle.
func TestEditorLifetime(t *testing.T) {
	var calls atomic.Int32
	rt, err := NewRuntimeWithEditor(&RuntimeOptions{ChunkTokens: positions, HostCapacityBytes: 16 << 20},
		func(ChunkInfo, []byte) (bool, error) { calls.Add(1); return false, nil })
	if err != nil {
		t.Fatal(err)
	}
	c := rt.core
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	rt.Close()
	if _, err := m.Store(bg, ns, Tokens(testTokens(positions)), Float32s(canonical(positions, 1))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the editor after the runtime's Close", func() bool { return calls.Load() == 1 })
	state := func() (cgo.Handle, int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.editor, c.refs
	}
	if h, refs := state(); h == 0 || refs != 1 {
		t.Fatalf("with a model alive: editor %v, refs %d", h, refs)
	}
	m.Close()
	if h, refs := state(); h != 0 || refs != 0 {
		t.Fatalf("after the last Close: editor %v, refs %d", h, refs)
	}
}

// Row 10 of the bad inputs: an editor that fails or panics. The chunk stays
// as stored, Stats.Edits does not move, the runtime goes on working.
func TestBadEditor(t *testing.T) {
	editors := map[string]func(ChunkInfo, []byte) (bool, error){
		"error": func(_ ChunkInfo, kv []byte) (bool, error) {
			for i := range kv {
				kv[i] = 0xff // scribbles, then fails: nothing of it may be kept
			}
			return true, errors.New("the editor failed")
		},
		"kdn error": func(ChunkInfo, []byte) (bool, error) { return true, ErrUnsupported },
		"panic": func(_ ChunkInfo, kv []byte) (bool, error) {
			kv[0] = 0xff
			panic("the editor panicked")
		},
		"index out of range": func(_ ChunkInfo, kv []byte) (bool, error) {
			_ = kv[len(kv)] // a runtime error panic
			return true, nil
		},
	}
	for name, edit := range editors {
		t.Run(name, func(t *testing.T) {
			f := newEditorFixture(t, edit)
			waitFor(t, "the editor call", func() bool { return f.calls.Load() >= 1 })
			time.Sleep(20 * time.Millisecond) // time for a (wrong) replacement to land
			out := make([]float32, len(f.kv))
			res, err := f.m.Retrieve(bg, ns, Tokens(f.tokens), Float32s(out))
			if err != nil || res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(f.kv)) {
				t.Fatalf("after a failed edit: %+v, %v, equal %v", res, err, bytes.Equal(Float32s(out), Float32s(f.kv)))
			}
			s, err := f.rt.Stats()
			if err != nil || s.Edits != 0 || s.EditedServed != 0 {
				t.Fatalf("Stats = %+v, %v", s, err)
			}
			// Still working: another store, edited (and failing) again.
			other := testTokens(positions + 1)[1:]
			if res, err := f.m.Store(bg, ns, Tokens(other), Float32s(f.kv)); err != nil || res.Tokens != positions {
				t.Fatalf("Store after a failed edit = %+v, %v", res, err)
			}
			waitFor(t, "the second editor call", func() bool { return f.calls.Load() >= 2 })
		})
	}
}

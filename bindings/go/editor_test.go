// SPDX-License-Identifier: Apache-2.0
package kdn

import (
	"bytes"
	"errors"
	"fmt"
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

// editorOp is what a test hands its editor: an op to close, and the buffer
// the op holds.
type editorOp struct {
	op  *Op
	buf *HostBuffer
}

// What the editor saw when it closed the op.
type editorClose struct {
	err      error         // Close's
	took     time.Duration // Close's
	pollErr  error         // a call on the op after its Close
	bufUsers int           // right after Close
}

// An editor closes an op it was handed through a closure while the op's
// load still runs: kdn_op_destroy only cancels there (it frees on a thread
// of its own), so Close must not free what kdn still uses. It returns at
// once, the op is closed, its buffer stays held until the load has ended
// and is freed then; the runtime goes on working, and every handle is
// released at the end. The load is another runtime's, waiting on a silent
// remote tier for its timeout (a store into the editor's own runtime would
// wait on that node first, and mark it down); kdn.h's rule is per thread,
// whatever the op's runtime. TestEditorClosesTheLastHandles closes an op of
// the editor's own runtime.
func TestEditorClosesARunningLoad(t *testing.T) {
	const timeout = time.Second
	slow, slowModel := silentRuntime(t, timeout)
	handed := make(chan editorOp, 1)
	closed := make(chan editorClose, 1)
	var calls atomic.Int32
	rt, err := NewRuntimeWithEditor(&RuntimeOptions{ChunkTokens: chunk, HostCapacityBytes: 16 << 20},
		func(ChunkInfo, []byte) (bool, error) {
			if calls.Add(1) != 1 {
				return false, nil
			}
			// The first chunk's edit waits for the op, and closes it.
			select {
			case h := <-handed:
				start := time.Now()
				err := h.op.Close()
				took := time.Since(start)
				_, pollErr := h.op.Poll()
				closed <- editorClose{err, took, pollErr, bufUsers(h.buf)}
			case <-time.After(30 * time.Second):
				closed <- editorClose{err: errors.New("no op was handed to the editor")}
			}
			return false, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{rt, m}
	tokens, kv := testTokens(positions), canonical(positions, 1)
	f.store(t, tokens, kv) // its first chunk's edit waits for the op

	buf, err := NewHostBuffer(len(kv) * 4)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	op, err := slowModel.LoadAsync(ns, Tokens(tokens), buf) // the silent node keeps it waiting
	if err != nil {
		t.Fatal(err)
	}
	buf.Close() // the op holds the memory
	if st, err := op.Poll(); err != nil || st != OpPending {
		t.Fatalf("the load before the editor closes it: %v, %v", st, err)
	}
	handed <- editorOp{op, buf}
	var got editorClose
	select {
	case got = <-closed:
	case <-time.After(60 * time.Second):
		t.Fatal("the editor did not return: Close deadlocked inside it")
	}
	if got.err != nil || got.took > timeout/2 {
		t.Fatalf("Close inside the editor: %v after %v (the load waits %v)", got.err, got.took, timeout)
	}
	if got.pollErr != ErrClosed {
		t.Fatalf("a call on the op closed inside the editor = %v, want ErrClosed", got.pollErr)
	}
	if got.bufUsers != 1 {
		t.Fatalf("right after Close inside the editor, the running load's buffer had %d users (freed under kdn)",
			got.bufUsers)
	}
	if err := op.Close(); err != nil { // a second Close, outside: nothing more
		t.Fatal(err)
	}

	// The runtime goes on working meanwhile: a retrieve, a store, its edits.
	out := make([]float32, len(kv))
	if res, err := m.Retrieve(bg, ns, Tokens(tokens), Float32s(out)); err != nil || res.Tokens != positions ||
		!bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatalf("Retrieve after the editor closed the op = %+v, %v", res, err)
	}
	f.store(t, testTokens(positions + 2)[2:], kv)
	waitFor(t, "the edits of both stores", func() bool { return calls.Load() == 6 })

	// The op's release waited for the load (on the node until its timeout),
	// then freed the buffer and let go of the load's runtime.
	waitFor(t, "the buffer's free", func() bool { return bufUsers(buf) == 0 })
	if freed := time.Since(start); freed < timeout-100*time.Millisecond {
		t.Fatalf("the buffer was freed %v after the load started, before the load could end (%v)", freed, timeout)
	}
	if n := remoteTimeouts(t, slow); n != 1 {
		t.Fatalf("the load's remote tier timed out %d times, want 1 (the load)", n)
	}
	refs := func(c *core) (cgo.Handle, int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.editor, c.refs
	}
	waitFor(t, "the op's release", func() bool { _, n := refs(slow.core); return n == 2 })
	m.Close()
	rt.Close()
	if h, n := refs(rt.core); h != 0 || n != 0 {
		t.Fatalf("after the last Close: editor %v, refs %d", h, n)
	}
}

// An editor closes the last handles, a save of its own runtime, the model
// and then the runtime: each Close returns at once; the releases, on
// goroutines, free the op and its buffer, and the runtime once the editor
// has returned (its mover thread is joined), and only then the editor's
// function, which the chunks still queued on the mover thread go through.
func TestEditorClosesTheLastHandles(t *testing.T) {
	type handles struct {
		fixture
		op *Op
	}
	handed := make(chan handles, 1)
	closed := make(chan [3]error, 1)
	var calls, edited atomic.Int32
	rt, err := NewRuntimeWithEditor(&RuntimeOptions{ChunkTokens: chunk, HostCapacityBytes: 16 << 20},
		func(ChunkInfo, []byte) (bool, error) {
			if calls.Add(1) == 1 {
				select {
				case h := <-handed:
					closed <- [3]error{h.op.Close(), h.m.Close(), h.rt.Close()}
				case <-time.After(30 * time.Second):
					closed <- [3]error{errors.New("no handles were handed to the editor")}
				}
			}
			edited.Add(1)
			return false, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	c := rt.core
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{rt, m}
	f.store(t, testTokens(positions), canonical(positions, 1)) // 3 chunks: 3 edits, the first waits
	// A save that waits for its layers, holding its buffer.
	buf, err := NewHostBuffer(positions * int(m.KVBytesPerToken()))
	if err != nil {
		t.Fatal(err)
	}
	op, err := m.SaveAsync(ns, Tokens(testTokens(positions + 1)[1:]), buf)
	if err != nil {
		t.Fatal(err)
	}
	buf.Close()
	handed <- handles{f, op}
	select {
	case errs := <-closed:
		if errs[0] != nil || errs[1] != nil || errs[2] != nil {
			t.Fatalf("Close inside the editor = %v", errs)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the editor did not return: Close deadlocked inside it")
	}
	if _, err := m.Lookup(bg, ns, Tokens(testTokens(positions))); err != ErrClosed {
		t.Fatalf("Lookup on a model closed inside the editor = %v", err)
	}
	if _, err := rt.Stats(); err != ErrClosed {
		t.Fatalf("Stats of a runtime closed inside the editor = %v", err)
	}
	if err := op.LayerReady(0); err != ErrClosed {
		t.Fatalf("LayerReady on an op closed inside the editor = %v", err)
	}
	waitFor(t, "the release of the runtime", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.refs == 0 && c.editor == 0
	})
	if n := bufUsers(buf); n != 0 {
		t.Fatalf("the save's buffer has %d users after the release", n)
	}
	if n := edited.Load(); n != 3 {
		t.Fatalf("the editor edited %d of the 3 chunks (its function was released too early)", n)
	}
}

// An editor closes a model while a store on it waits for the editor's own
// thread: the store pushes back on the mover's queue, full behind the
// editor. Close must not wait for the store there (it would wait for
// itself): it returns at once, the store finishes once the editor has
// returned, and the model is released after it.
func TestEditorClosesAModelInUse(t *testing.T) {
	const chunks = 400 // past the mover's queue of 256
	handed := make(chan *Model, 1)
	closed := make(chan error, 1)
	var calls atomic.Int32
	rt, err := NewRuntimeWithEditor(&RuntimeOptions{ChunkTokens: chunk, HostCapacityBytes: 64 << 20},
		func(ChunkInfo, []byte) (bool, error) {
			if calls.Add(1) == 1 {
				select {
				case m := <-handed:
					closed <- m.Close()
				case <-time.After(30 * time.Second):
					closed <- errors.New("no model was handed to the editor")
				}
			}
			return false, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	tokens := testTokens(chunks * chunk)
	kv := make([]byte, len(tokens)*int(m.KVBytesPerToken()))
	stored := make(chan error, 1)
	go func() {
		res, err := m.Store(bg, ns, Tokens(tokens), kv)
		if err == nil && res.Tokens != uint64(len(tokens)) {
			err = fmt.Errorf("the store kept %d of %d tokens", res.Tokens, len(tokens))
		}
		stored <- err
	}()
	waitFor(t, "the store to wait on the mover's queue", func() bool {
		s, _ := rt.Stats()
		return s.Chunks >= 256 && calls.Load() == 1
	})
	select {
	case err := <-stored:
		t.Fatalf("the store did not wait for the editor: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	handed <- m
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close inside the editor waited for a store that waits for the editor")
	}
	if err := <-stored; err != nil {
		t.Fatalf("the store in progress when its model was closed: %v", err)
	}
	if _, err := m.Lookup(bg, ns, Tokens(tokens)); err != ErrClosed {
		t.Fatalf("Lookup after Close = %v", err)
	}
	waitFor(t, "the model's release", func() bool {
		rt.core.mu.Lock()
		defer rt.core.mu.Unlock()
		return rt.core.refs == 1
	})
}

// SPDX-License-Identifier: Apache-2.0
package kdn

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A model with recurrent layers (since 1.12): two of them, 12 bytes of
// state each, beside the tests' attention layers, in chunks of 16.
const (
	stateLayers = 2
	stateBytes  = 12
)

func newRecurrentModel(t *testing.T) (*Runtime, *Model) {
	t.Helper()
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(16 << 20)}})
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	t.Cleanup(func() { rt.Close() })
	m, err := rt.NewModel(&ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim, DType: F32,
		Fingerprint: "go-recurrent", NumStateLayers: stateLayers, StateBytes: stateBytes})
	if err != nil {
		t.Fatalf("NewModel (recurrent): %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return rt, m
}

// kvValue is the KV element e of token p in layer l (kv 0: K, 1: V), the
// same for every request that holds token p.
func kvValue(l, kv, p, e int) float32 { return float32(1 + l*100000 + kv*50000 + p*100 + e) }

// recurrentKV is n tokens' KV in the canonical layout [layer][k|v][token][row].
func recurrentKV(n int) []float32 {
	kv := make([]float32, layers*2*n*row)
	for l := 0; l < layers; l++ {
		for k := 0; k < 2; k++ {
			for p := 0; p < n; p++ {
				for e := 0; e < row; e++ {
					kv[((l*2+k)*n+p)*row+e] = kvValue(l, k, p, e)
				}
			}
		}
	}
	return kv
}

// stateAt is recurrent layer l's state after token b-1: distinct per
// boundary and layer.
func stateAt(b, l int) []byte {
	s := make([]byte, stateBytes)
	for i := range s {
		s[i] = byte(b*5 + l*70 + i*3 + 1)
	}
	return s
}

func statesAt(b int) [][]byte {
	out := make([][]byte, stateLayers)
	for l := range out {
		out[l] = stateAt(b, l)
	}
	return out
}

// filledStates are fresh state buffers of one byte value each.
func filledStates(v byte) [][]byte {
	out := make([][]byte, stateLayers)
	for l := range out {
		out[l] = bytes.Repeat([]byte{v}, stateBytes)
	}
	return out
}

// checkPrefixKV says whether out (canonical, n tokens) holds the stored KV
// of tokens [0, prefix) and the sentinel after it.
func checkPrefixKV(t *testing.T, what string, out []float32, n, prefix int, sentinel float32) {
	t.Helper()
	for l := 0; l < layers; l++ {
		for k := 0; k < 2; k++ {
			for p := 0; p < n; p++ {
				for e := 0; e < row; e++ {
					want := sentinel
					if p < prefix {
						want = kvValue(l, k, p, e)
					}
					if got := out[((l*2+k)*n+p)*row+e]; got != want {
						t.Fatalf("%s: layer %d kv %d token %d elem %d = %v, want %v", what, l, k, p, e, got, want)
					}
				}
			}
		}
	}
}

func checkStates(t *testing.T, what string, got, want [][]byte) {
	t.Helper()
	for l := range want {
		if !bytes.Equal(got[l], want[l]) {
			t.Fatalf("%s: state %d = %v, want %v", what, l, got[l], want[l])
		}
	}
}

func sentinelKV(n int, v float32) []float32 {
	out := make([]float32, layers*2*n*row)
	for i := range out {
		out[i] = v
	}
	return out
}

// Store, Lookup and Retrieve carry the recurrent state: a prefix counts only
// where its snapshot is, and a retrieve writes the KV of that prefix and the
// snapshot at it, bit for bit; KV stored without its state is no hit.
func TestRecurrentStateStoreRetrieve(t *testing.T) {
	_, m := newRecurrentModel(t)
	const n = 40
	tokens := testTokens(n)
	kv32 := recurrentKV(32)

	// The prefix of 16 with its state in Go slices of their own (copied
	// for the call), that of 32 with its state inside the call's data (in
	// place): KV then the two states.
	res, err := m.Store(bg, ns, Tokens(tokens[:16]), Float32s(recurrentKV(16)), KVView{State: statesAt(16)})
	if err != nil || res.Tokens != 16 {
		t.Fatalf("Store of 16 = %+v, %v", res, err)
	}
	kvBytes := len(kv32) * 4
	data := append(append(append([]byte(nil), Float32s(kv32)...), stateAt(32, 0)...), stateAt(32, 1)...)
	in := [][]byte{data[kvBytes : kvBytes+stateBytes], data[kvBytes+stateBytes:]}
	res, err = m.Store(bg, ns, Tokens(tokens[:32]), data, KVView{State: in})
	if err != nil || res.Tokens != 32 {
		t.Fatalf("Store of 32 = %+v, %v", res, err)
	}
	// The 40 tokens' KV without a state: stored, but 40 has no snapshot.
	if _, err := m.Store(bg, ns, Tokens(tokens), Float32s(recurrentKV(n))); err != nil {
		t.Fatalf("Store of 40 without a state: %v", err)
	}
	if got, err := m.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != 32 {
		t.Fatalf("Lookup of 40 = %+v, %v, want 32 (the last snapshot)", got, err)
	}
	if got, err := m.Lookup(bg, ns, Tokens(tokens[:31])); err != nil || got.CachedTokens != 16 {
		t.Fatalf("Lookup of 31 = %+v, %v, want 16", got, err)
	}

	// Retrieve into separate state slices (copied back after the call).
	out := sentinelKV(n, -1)
	state := filledStates(0xEE)
	res, err = m.Retrieve(bg, ns, Tokens(tokens), Float32s(out), KVView{State: state})
	if err != nil || res.Tokens != 32 {
		t.Fatalf("Retrieve = %+v, %v, want 32 tokens", res, err)
	}
	checkPrefixKV(t, "Retrieve", out, n, 32, -1)
	checkStates(t, "Retrieve", state, statesAt(32))

	// A request of 20 tokens: the snapshot at 16.
	out20 := sentinelKV(20, -1)
	state = filledStates(0xEE)
	res, err = m.Retrieve(bg, ns, Tokens(tokens[:20]), Float32s(out20), KVView{State: state})
	if err != nil || res.Tokens != 16 {
		t.Fatalf("Retrieve of 20 = %+v, %v, want 16 tokens", res, err)
	}
	checkPrefixKV(t, "Retrieve of 20", out20, 20, 16, -1)
	checkStates(t, "Retrieve of 20", state, statesAt(16))

	// Retrieve with the state inside data, written in place, through two
	// views (per-layer offsets) with the state on the second.
	buf := make([]byte, len(out)*4+stateLayers*stateBytes)
	outBytes := buf[:len(out)*4]
	copy(outBytes, Float32s(sentinelKV(n, -1)))
	for i := len(outBytes); i < len(buf); i++ {
		buf[i] = 0xEE
	}
	state = [][]byte{buf[len(outBytes) : len(outBytes)+stateBytes], buf[len(outBytes)+stateBytes:]}
	var kOff, vOff [layers]int64
	for l := 0; l < layers; l++ {
		kOff[l], vOff[l] = int64((l*2)*n*row), int64((l*2+1)*n*row)
	}
	// Within a layer: [token][head][dim].
	res, err = m.Retrieve(bg, ns, Tokens(tokens), buf,
		KVView{Layers: []uint32{0, 1}, KOffsets: kOff[:2], VOffsets: vOff[:2],
			StrideToken: row, StrideHead: headDim, StrideDim: 1},
		KVView{Layers: []uint32{2, 3, 4}, KOffsets: kOff[2:], VOffsets: vOff[2:],
			StrideToken: row, StrideHead: headDim, StrideDim: 1, State: state})
	if err != nil || res.Tokens != 32 {
		t.Fatalf("Retrieve (two views, state in place) = %+v, %v", res, err)
	}
	got := make([]float32, len(out))
	copy(Float32s(got), outBytes)
	checkPrefixKV(t, "Retrieve (two views)", got, n, 32, -1)
	checkStates(t, "Retrieve (state in place)", state, statesAt(32))

	// KV stored without its state, under another namespace: no hit, and a
	// retrieve writes nothing (neither KV nor state).
	const other = "nostate"
	res, err = m.Store(bg, other, Tokens(tokens[:32]), Float32s(kv32))
	if err != nil || res.Tokens != 0 {
		t.Fatalf("Store without a state = %+v, %v, want 0 tokens cached", res, err)
	}
	if got, err := m.Lookup(bg, other, Tokens(tokens)); err != nil || got.CachedTokens != 0 {
		t.Fatalf("Lookup of KV stored without its state = %+v, %v, want 0", got, err)
	}
	out = sentinelKV(n, -1)
	state = filledStates(0xEE)
	res, err = m.Retrieve(bg, other, Tokens(tokens), Float32s(out), KVView{State: state})
	if err != nil || res.Tokens != 0 {
		t.Fatalf("Retrieve of KV stored without its state = %+v, %v, want 0", res, err)
	}
	checkPrefixKV(t, "Retrieve (no snapshot)", out, n, 0, -1)
	checkStates(t, "Retrieve (no snapshot)", state, filledStates(0xEE))
}

// LoadAsync and SaveAsync carry the state in their HostBuffer.
func TestRecurrentStateLoadSaveAsync(t *testing.T) {
	_, m := newRecurrentModel(t)
	const n = 40
	tokens := testTokens(n)
	kvBytes := layers * 2 * 32 * row * 4

	// Save the 32 tokens' KV and the state at 32, both in the buffer.
	save, err := NewHostBuffer(kvBytes + stateLayers*stateBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer save.Close()
	sb := save.Bytes()
	copy(sb, Float32s(recurrentKV(32)))
	copy(sb[kvBytes:], stateAt(32, 0))
	copy(sb[kvBytes+stateBytes:], stateAt(32, 1))
	op, err := m.SaveAsync(ns, Tokens(tokens[:32]), save,
		KVView{State: [][]byte{sb[kvBytes : kvBytes+stateBytes], sb[kvBytes+stateBytes:]}})
	if err != nil {
		t.Fatalf("SaveAsync: %v", err)
	}
	for l := 0; l < layers; l++ {
		if err := op.LayerReady(l); err != nil {
			t.Fatalf("LayerReady(%d): %v", l, err)
		}
	}
	if err := op.Wait(bg); err != nil {
		t.Fatalf("SaveAsync Wait: %v", err)
	}
	if res, err := op.Result(); err != nil || res.Tokens != 32 {
		t.Fatalf("SaveAsync result = %+v, %v", res, err)
	}
	op.Close()
	if got, err := m.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != 32 {
		t.Fatalf("Lookup after SaveAsync = %+v, %v, want 32", got, err)
	}

	// Load the 40-token request: the KV of 32 and the state at 32.
	outBytes := layers * 2 * n * row * 4
	load, err := NewHostBuffer(outBytes + stateLayers*stateBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer load.Close()
	lb := load.Bytes()
	copy(lb, Float32s(sentinelKV(n, -1)))
	for i := outBytes; i < len(lb); i++ {
		lb[i] = 0xEE
	}
	state := [][]byte{lb[outBytes : outBytes+stateBytes], lb[outBytes+stateBytes:]}
	op, err = m.LoadAsync(ns, Tokens(tokens), load, KVView{State: state})
	if err != nil {
		t.Fatalf("LoadAsync: %v", err)
	}
	if err := op.Wait(bg); err != nil {
		t.Fatalf("LoadAsync Wait: %v", err)
	}
	res, err := op.Result()
	if err != nil || res.Tokens != 32 || res.State != OpDone {
		t.Fatalf("LoadAsync result = %+v, %v, want 32 tokens", res, err)
	}
	op.Close()
	got := make([]float32, layers*2*n*row)
	copy(Float32s(got), lb[:outBytes])
	checkPrefixKV(t, "LoadAsync", got, n, 32, -1)
	checkStates(t, "LoadAsync", state, statesAt(32))

	// A load's state must be in its buffer: kdn writes it after the call.
	_, err = m.LoadAsync(ns, Tokens(tokens), load, KVView{State: filledStates(0)})
	wantStatus(t, "LoadAsync with the state outside its HostBuffer", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "HostBuffer") {
		t.Fatalf("LoadAsync with the state outside its HostBuffer: %q does not say where it must be", err)
	}
	_, err = m.SaveAsync(ns, Tokens(tokens[:32]), save, KVView{State: statesAt(32)})
	wantStatus(t, "SaveAsync with the state outside its HostBuffer", err, ErrInvalidArgument)
	// kdn's own rule: a load of such a model needs the state.
	_, err = m.LoadAsync(ns, Tokens(tokens), load)
	wantStatus(t, "LoadAsync without the state", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "state") {
		t.Fatalf("LoadAsync without the state: %q", err)
	}
}

// Every misuse of the state is refused with its reason; the binding's own
// checks come before kdn is called (their messages are the binding's).
func TestRecurrentStateRefused(t *testing.T) {
	_, m := newRecurrentModel(t)
	tokens := testTokens(32)
	kv := Float32s(recurrentKV(32))
	if _, err := m.Store(bg, ns, Tokens(tokens), kv, KVView{State: statesAt(32)}); err != nil {
		t.Fatalf("Store: %v", err)
	}
	out := make([]byte, len(kv))

	// kdn's rule: a retrieve of a recurrent model needs the state.
	_, err := m.Retrieve(bg, ns, Tokens(tokens), out)
	wantStatus(t, "Retrieve without the state", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "state") {
		t.Fatalf("Retrieve without the state: %q", err)
	}
	if !bytes.Equal(out, make([]byte, len(out))) {
		t.Fatal("Retrieve without the state wrote KV")
	}

	short := statesAt(32)
	short[1] = short[1][:stateBytes-1]
	long := statesAt(32)
	long[0] = append(long[0], 0)
	cases := []struct {
		name  string
		views []KVView
		say   string
	}{
		{"a state one byte short", []KVView{{State: short}}, "State[1] is 11 bytes"},
		{"a state one byte long", []KVView{{State: long}}, "State[0] is 13 bytes"},
		{"a nil state", []KVView{{State: [][]byte{stateAt(32, 0), nil}}}, "State[1] is 0 bytes"},
		{"one state for two layers", []KVView{{State: statesAt(32)[:1]}}, "has 1 slices"},
		{"three states for two layers", []KVView{{State: append(statesAt(32), stateAt(32, 0))}}, "has 3 slices"},
		{"the state in two views", []KVView{{Layers: []uint32{0, 1}, State: statesAt(32)},
			{Layers: []uint32{2, 3, 4}, State: statesAt(32)}}, "two views"},
	}
	for _, c := range cases {
		for _, call := range []string{"Store", "Retrieve"} {
			var err error
			if call == "Store" {
				_, err = m.Store(bg, "bad", Tokens(tokens), kv, c.views...)
			} else {
				_, err = m.Retrieve(bg, ns, Tokens(tokens), out, c.views...)
			}
			wantStatus(t, call+" with "+c.name, err, ErrInvalidArgument)
			if !strings.Contains(err.Error(), "KVView.State") || !strings.Contains(err.Error(), c.say) {
				t.Fatalf("%s with %s: %q, want the binding's message saying %q", call, c.name, err, c.say)
			}
		}
	}
	if got, err := m.Lookup(bg, "bad", Tokens(tokens)); err != nil || got.CachedTokens != 0 {
		t.Fatalf("a refused store stored: %+v, %v", got, err)
	}
	if !bytes.Equal(out, make([]byte, len(out))) {
		t.Fatal("a refused retrieve wrote KV")
	}
	buf, err := NewHostBuffer(len(kv) + stateLayers*stateBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	b := buf.Bytes()
	_, err = m.LoadAsync(ns, Tokens(tokens), buf, KVView{State: [][]byte{b[len(kv) : len(kv)+stateBytes],
		b[len(kv)+stateBytes : len(kv)+2*stateBytes-1]}})
	wantStatus(t, "LoadAsync with a short state", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "StateBytes = 12") {
		t.Fatalf("LoadAsync with a short state: %q", err)
	}

	// Calls that take no state: the device and knowledge calls.
	_, err = m.StoreDevice(bg, ns, Tokens(tokens), buf.EmulatedDevice(), KVView{State: statesAt(32)})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "KVView.State") {
		t.Fatalf("StoreDevice with a state: %v, want the binding's ErrUnsupported", err)
	}
	err = m.KnowledgePut(bg, ns, "doc", 1, "", tokens, kv, KVView{State: statesAt(32)})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "KVView.State") {
		t.Fatalf("KnowledgePut with a state: %v, want the binding's ErrUnsupported", err)
	}

	// A state for a model without recurrent layers.
	f := newFixture(t, nil)
	_, err = f.m.Store(bg, ns, Tokens(testTokens(positions)), Float32s(canonical(positions, 1)),
		KVView{State: [][]byte{make([]byte, 4)}})
	wantStatus(t, "a state for a model without recurrent layers", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "NumStateLayers is 0") {
		t.Fatalf("a state for a model without recurrent layers: %q", err)
	}
}

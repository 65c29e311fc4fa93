// SPDX-License-Identifier: Apache-2.0
package kdn

import (
	"bytes"
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// The shape the tests use: stories260K's (5 layers, 4 KV heads of 8
// dims, f32), 48 tokens in chunks of 16.
const (
	layers    = 5
	heads     = 4
	headDim   = 8
	positions = 48
	chunk     = 16
	row       = heads * headDim // one token's K (or V) in one layer, elements
	ns        = "test"
)

// bg is the context of the calls whose context a test is not about (a
// package-level name no test's own ctx shadows).
var bg = context.Background()

func testTokens(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(1 + (i*7919)%500)
	}
	return t
}

// canonical is deterministic KV for n tokens in the canonical layout.
func canonical(n int, seed float32) []float32 {
	kv := make([]float32, layers*2*n*row)
	for i := range kv {
		kv[i] = seed + float32(i%9973)*0.25
	}
	return kv
}

func testSpec() *ModelSpec {
	return &ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim, DType: F32, Fingerprint: "go-test"}
}

type fixture struct {
	rt *Runtime
	m  *Model
}

func newFixture(t *testing.T, opts *RuntimeOptions) fixture {
	t.Helper()
	if opts == nil {
		opts = &RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(16 << 20)}}
	}
	rt, err := NewRuntime(opts)
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	m, err := rt.NewModel(testSpec())
	if err != nil {
		rt.Close()
		t.Fatalf("NewModel: %v", err)
	}
	t.Cleanup(func() {
		m.Close()
		rt.Close()
	})
	return fixture{rt, m}
}

func (f fixture) store(t *testing.T, tokens []int32, kv []float32) {
	t.Helper()
	res, err := f.m.Store(bg, ns, Tokens(tokens), Float32s(kv))
	if err != nil {
		t.Fatalf("Store: %v", err)
	}
	if want := uint64(len(tokens) / chunk * chunk); res.Tokens < want {
		t.Fatalf("Store cached %d tokens, want at least %d", res.Tokens, want)
	}
}

func TestVersion(t *testing.T) {
	if VersionNumber()/10000 != HeaderVersionMajor || VersionNumber() < HeaderVersionMajor*10000+HeaderVersionMinor*100 {
		t.Fatalf("library %d is not the header's ABI %d.%d", VersionNumber(), HeaderVersionMajor, HeaderVersionMinor)
	}
	if v := Version(); v == "" || v[0] != '0'+HeaderVersionMajor {
		t.Fatalf("Version() = %q", v)
	}
}

func TestStoreLookupRetrieve(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 1)
	if got := f.m.KVBytesPerToken(); got != layers*2*row*4 {
		t.Fatalf("KVBytesPerToken = %d", got)
	}
	if f.m.Fingerprint() == ([32]byte{}) {
		t.Fatal("the model's fingerprint is zero")
	}
	f.store(t, tokens, kv)

	got, err := f.m.Lookup(bg, ns, Tokens(tokens))
	if err != nil || got.CachedTokens != positions || len(got.TierTokens) != 1 || got.TierTokens[0] != positions {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	got, err = f.m.Lookup(bg, ns, Tokens(tokens[:40]))
	if err != nil || got.CachedTokens != 32 {
		t.Fatalf("Lookup of 40 = %+v, %v (want the 2 whole chunks)", got, err)
	}

	out := make([]float32, len(kv))
	res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out))
	if err != nil || res.Tokens != positions || res.Covered != positions || res.State != OpDone || res.Lossy() {
		t.Fatalf("Retrieve = %+v, %v", res, err)
	}
	if !bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatal("the retrieved KV differs from the stored KV")
	}

	// A miss is a success with 0 tokens: another namespace, other tokens.
	res, err = f.m.Retrieve(bg, "someone-else", Tokens(tokens), Float32s(out))
	if err != nil || res.Tokens != 0 {
		t.Fatalf("Retrieve from another namespace = %+v, %v", res, err)
	}
	got, err = f.m.Lookup(bg, ns, Tokens(testTokens(positions)[1:]))
	if err != nil || got.CachedTokens != 0 {
		t.Fatalf("Lookup of other tokens = %+v, %v", got, err)
	}

	s, err := f.rt.Stats()
	if err != nil || s.Stores != 1 || s.TokensStored != positions || s.Chunks != 3 || s.TokensServed != positions {
		t.Fatalf("Stats = %+v, %v", s, err)
	}
	l, err := f.rt.Latency(LatencyLoad)
	if err != nil || l.Count != 2 || l.Max < l.P50 {
		t.Fatalf("Latency = %+v, %v", l, err)
	}
}

// A latent (MLA) model: one vector of LatentDim per token and layer, its
// buffers [layer][token][latent]; stored and retrieved bit for bit, apart
// from a K/V model of the same bytes per token; a bad spec refused.
func TestLatentModel(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(16 << 20)}})
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	defer rt.Close()
	const latent = 8
	m, err := rt.NewModel(&ModelSpec{NumLayers: layers, DType: F32, Fingerprint: "go-mla", CacheKind: CacheLatent,
		LatentDim: latent, LatentRopeDim: 2})
	if err != nil {
		t.Fatalf("NewModel (latent): %v", err)
	}
	defer m.Close()
	if got := m.KVBytesPerToken(); got != layers*latent*4 {
		t.Fatalf("KVBytesPerToken = %d, want %d", got, layers*latent*4)
	}
	kv, err := rt.NewModel(&ModelSpec{NumLayers: layers, NumKVHeads: 1, HeadDim: latent / 2, DType: F32,
		Fingerprint: "go-mla"})
	if err != nil {
		t.Fatalf("NewModel (K/V): %v", err)
	}
	defer kv.Close()
	tokens := testTokens(positions)
	data := make([]float32, layers*positions*latent)
	for i := range data {
		data[i] = float32(i) * 0.5
	}
	if res, err := m.Store(bg, ns, Tokens(tokens), Float32s(data)); err != nil || res.Tokens != positions {
		t.Fatalf("Store = %+v, %v", res, err)
	}
	out := make([]float32, len(data))
	if res, err := m.Retrieve(bg, ns, Tokens(tokens), Float32s(out)); err != nil || res.Tokens != positions {
		t.Fatalf("Retrieve = %+v, %v", res, err)
	}
	if !bytes.Equal(Float32s(out), Float32s(data)) {
		t.Fatal("the retrieved latents differ from the stored ones")
	}
	if got, err := kv.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != 0 {
		t.Fatalf("a K/V model of the same bytes sees the latent's KV: %+v, %v", got, err)
	}
	_, err = rt.NewModel(&ModelSpec{NumLayers: layers, DType: F32, Fingerprint: "x", CacheKind: CacheLatent, LatentDim: 7})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("an odd LatentDim: %v, want ErrInvalidArgument", err)
	}
}

// A model with a sliding-window layer (since 1.12): the window's layer is
// loaded only where its last tokens need it, the full layers whole; its
// identity is not the same model's without the window.
func TestSlidingWindowModel(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(16 << 20)}})
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	defer rt.Close()
	windows := make([]uint32, layers)
	windows[0] = 8 // layer 0 attends to the last 8 tokens
	m, err := rt.NewModel(&ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim, DType: F32,
		Fingerprint: "go-sliding", LayerWindows: windows})
	if err != nil {
		t.Fatalf("NewModel (sliding): %v", err)
	}
	defer m.Close()
	plain, err := rt.NewModel(&ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim, DType: F32,
		Fingerprint: "go-sliding"})
	if err != nil {
		t.Fatalf("NewModel (plain): %v", err)
	}
	defer plain.Close()
	tokens := testTokens(positions)
	data := make([]float32, layers*2*positions*row)
	for i := range data {
		data[i] = float32(i) + 1
	}
	if res, err := m.Store(bg, ns, Tokens(tokens), Float32s(data)); err != nil || res.Tokens != positions {
		t.Fatalf("Store = %+v, %v", res, err)
	}
	if got, err := m.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != positions {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	if got, err := plain.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != 0 {
		t.Fatalf("the model without its window sees the windowed model's KV: %+v, %v", got, err)
	}
	out := make([]float32, len(data))
	if res, err := m.Retrieve(bg, ns, Tokens(tokens), Float32s(out)); err != nil || res.Tokens != positions {
		t.Fatalf("Retrieve = %+v, %v", res, err)
	}
	// Canonical [layer][k|v][token][row]: layer 0 gets its window [40, 48)
	// only (nothing older is read or written); every other layer, every token.
	for l := 0; l < layers; l++ {
		for kv := 0; kv < 2; kv++ {
			for p := 0; p < positions; p++ {
				at := ((l*2+kv)*positions + p) * row
				want := data[at]
				if l == 0 && p < 40 {
					want = 0 // not loaded: outside the window
				}
				if out[at] != want {
					t.Fatalf("layer %d kv %d token %d: got %v, want %v", l, kv, p, out[at], want)
				}
			}
		}
	}
	_, err = rt.NewModel(&ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim, DType: F32,
		Fingerprint: "x", NumStateLayers: 1, StateBytes: 6})
	if !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("StateBytes not a multiple of 4: %v, want ErrInvalidArgument", err)
	}
}

// A reported prefill prices the tokens later loads serve: TTFTSaved is
// tokens served x the reported time per token (each load rounds to a ns).
func TestReportedPrefillPricesLoads(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions + chunk)
	kv := canonical(positions, 1)
	f.store(t, tokens[:positions], kv)
	// n tokens in d; d/n is not a whole number of ns.
	const n, d = 24, 1000003 * time.Nanosecond
	if err := f.m.ReportPrefill(n, d); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, layers*2*(positions+chunk)*row)
	// A whole hit, then a request a chunk longer than what is cached.
	for _, req := range [][]int32{tokens[:positions], tokens} {
		res, err := f.m.Retrieve(bg, ns, Tokens(req), Float32s(out[:layers*2*len(req)*row]))
		if err != nil || res.Tokens != positions {
			t.Fatalf("Retrieve of %d tokens = %+v, %v", len(req), res, err)
		}
	}
	// A lookup is no load: counted apart.
	if got, err := f.m.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != positions {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	s, err := f.rt.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.LookupTokens != positions+chunk || s.LookupHitTokens != positions {
		t.Fatalf("LookupTokens, LookupHitTokens = %d, %d", s.LookupTokens, s.LookupHitTokens)
	}
	if s.PrefillTokens != n || s.PrefillTime != d {
		t.Fatalf("PrefillTokens, PrefillTime = %d, %v, want %d, %v", s.PrefillTokens, s.PrefillTime, n, d)
	}
	if s.TokensServed != 2*positions || s.TokensRequested != 2*positions+chunk || s.TokensRequested < s.TokensServed {
		t.Fatalf("TokensServed, TokensRequested = %d, %d", s.TokensServed, s.TokensRequested)
	}
	exact := int64(s.TokensServed) * int64(d) / n
	if diff := int64(s.TTFTSaved) - exact; diff < -2 || diff > 2 {
		t.Fatalf("TTFTSaved = %d ns, want %d +- 2 (two loads)", int64(s.TTFTSaved), exact)
	}
	if s.TokensServedUnpriced != 0 || s.DeliveryTime <= 0 {
		t.Fatalf("TokensServedUnpriced, DeliveryTime = %d, %v", s.TokensServedUnpriced, s.DeliveryTime)
	}
}

// The engine's layout: K file then V file, [layer][token][head][dim] each
// (as the examples and llama.cpp hold it), described by strides.
func TestStridedView(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	file := layers * positions * row
	engine := make([]float32, 2*file)
	for i := range engine {
		engine[i] = float32(i) * 0.5
	}
	view := KVView{DType: F32, StrideLayer: positions * row, StrideKV: int64(file), StrideToken: row,
		StrideHead: headDim, StrideDim: 1}
	if _, err := f.m.Store(bg, ns, Tokens(tokens), Float32s(engine), view); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2*file)
	if res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out)); err != nil || res.Tokens != positions {
		t.Fatalf("Retrieve = %+v, %v", res, err)
	}
	for l := 0; l < layers; l++ {
		for kvi := 0; kvi < 2; kvi++ {
			want := engine[kvi*file+l*positions*row:][:positions*row]
			got := out[(2*l+kvi)*positions*row:][:positions*row]
			if !bytes.Equal(Float32s(want), Float32s(got)) {
				t.Fatalf("layer %d %c differs", l, "KV"[kvi])
			}
		}
	}
	// The same view back: into the engine's layout.
	back := make([]float32, 2*file)
	if res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(back), view); err != nil || res.Tokens != positions {
		t.Fatalf("Retrieve (strided) = %+v, %v", res, err)
	}
	if !bytes.Equal(Float32s(back), Float32s(engine)) {
		t.Fatal("the strided retrieve differs from the engine's KV")
	}
}

// Paged views (vLLM's layout) over one slab: per-layer offsets and a block
// table that scatters the 3 blocks of 16 tokens; NHD and HND.
func TestPagedView(t *testing.T) {
	for _, layout := range []Layout{LayoutPagedNHD, LayoutPagedHND} {
		f := newFixture(t, nil)
		tokens := testTokens(positions)
		kv := canonical(positions, 3)
		f.store(t, tokens, kv)

		const blocks = 5
		blockElems := chunk * row
		layerElems := blocks * blockElems
		slab := make([]float32, 2*layers*layerElems)
		view := KVView{DType: F32, Layout: layout, BlockSize: chunk, BlockTable: []int32{3, 0, 4}}
		for l := 0; l < layers; l++ {
			view.KOffsets = append(view.KOffsets, int64((2*l)*layerElems))
			view.VOffsets = append(view.VOffsets, int64((2*l+1)*layerElems))
		}
		res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(slab), view)
		if err != nil || res.Tokens != positions {
			t.Fatalf("%v: Retrieve = %+v, %v", layout, res, err)
		}
		for l := 0; l < layers; l++ {
			for kvi := 0; kvi < 2; kvi++ {
				base := int(view.KOffsets[l])
				if kvi == 1 {
					base = int(view.VOffsets[l])
				}
				for tok := 0; tok < positions; tok++ {
					block := int(view.BlockTable[tok/chunk])
					slot := tok % chunk
					for h := 0; h < heads; h++ {
						for d := 0; d < headDim; d++ {
							var at int
							if layout == LayoutPagedNHD {
								at = base + block*blockElems + (slot*heads+h)*headDim + d
							} else {
								at = base + block*blockElems + (h*chunk+slot)*headDim + d
							}
							want := kv[((2*l+kvi)*positions+tok)*row+h*headDim+d]
							if slab[at] != want {
								t.Fatalf("%v: layer %d %c token %d head %d dim %d: %v, want %v", layout, l,
									"KV"[kvi], tok, h, d, slab[at], want)
							}
						}
					}
				}
			}
		}
		// And stored from the paged slab, found again under other tokens.
		other := testTokens(positions + 1)[1:]
		if res, err := f.m.Store(bg, ns, Tokens(other), Float32s(slab), view); err != nil || res.Tokens != positions {
			t.Fatalf("%v: Store (paged) = %+v, %v", layout, res, err)
		}
		out := make([]float32, len(kv))
		if res, err := f.m.Retrieve(bg, ns, Tokens(other), Float32s(out)); err != nil || res.Tokens != positions ||
			!bytes.Equal(Float32s(out), Float32s(kv)) {
			t.Fatalf("%v: paged store, canonical retrieve: %+v, %v", layout, res, err)
		}
	}
}

// canonicalOffsets appends, to v's per-layer offsets, where each model
// layer's K and V start in the canonical layout of positions tokens, and
// sets its strides to token-major.
func canonicalOffsets(v *KVView, modelLayers ...int) {
	n := positions * row
	for _, l := range modelLayers {
		v.KOffsets = append(v.KOffsets, int64(2*l*n))
		v.VOffsets = append(v.VOffsets, int64((2*l+1)*n))
	}
	v.StrideToken, v.StrideHead, v.StrideDim = row, headDim, 1
}

// Two views over one slab: layers 0-1 and 2-4 (e.g. full and sliding
// attention), each with its own layer list.
func TestSeveralViews(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 5)
	f.store(t, tokens, kv)
	layerElems := positions * row
	slab := make([]float32, 2*layers*layerElems)
	var views [2]KVView
	for l := 0; l < layers; l++ {
		v := &views[0]
		if l >= 2 {
			v = &views[1]
		}
		v.Layers = append(v.Layers, uint32(l))
		canonicalOffsets(v, l)
	}
	if res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(slab), views[:]...); err != nil || res.Tokens != positions {
		t.Fatalf("Retrieve = %+v, %v", res, err)
	}
	// Per layer K then V, token-major: the canonical layout again.
	if !bytes.Equal(Float32s(slab), Float32s(kv)) {
		t.Fatal("two views: the retrieved KV differs")
	}
}

func TestBlockHashes(t *testing.T) {
	f := newFixture(t, nil)
	kv := canonical(positions, 7)
	hashes := make([]byte, 3*16)
	for i := range hashes {
		hashes[i] = byte(i*31 + 7)
	}
	req := Request{BlockHashes: hashes, HashBytes: 16, BlockTokens: chunk}
	if res, err := f.m.Store(bg, ns, req, Float32s(kv)); err != nil || res.Tokens != positions {
		t.Fatalf("Store by hashes = %+v, %v", res, err)
	}
	if got, err := f.m.Lookup(bg, ns, Request{BlockHashes: hashes[:32], HashBytes: 16, BlockTokens: chunk}); err != nil ||
		got.CachedTokens != 32 {
		t.Fatalf("Lookup by hashes = %+v, %v", got, err)
	}
	out := make([]float32, len(kv))
	if res, err := f.m.Retrieve(bg, ns, req, Float32s(out)); err != nil || res.Tokens != positions ||
		!bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatalf("Retrieve by hashes = %+v, %v", res, err)
	}
}

func TestLookupBatch(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	f.store(t, tokens, canonical(positions, 1))
	got, err := f.m.LookupBatch(bg, ns, []Request{Tokens(tokens), Tokens(tokens[:40]), Tokens(testTokens(8))})
	if err != nil || len(got) != 3 {
		t.Fatalf("LookupBatch = %v, %v", got, err)
	}
	for i, want := range []uint64{positions, 32, 0} {
		if got[i].Status != StatusOK || got[i].CachedTokens != want {
			t.Fatalf("request %d: %+v, want %d tokens", i, got[i], want)
		}
	}
	s, _ := f.rt.Stats()
	if s.Lookups != 3 {
		t.Fatalf("Stats.Lookups = %d, want 3", s.Lookups)
	}
}

func TestAsyncSaveLoad(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 9)
	src, err := NewHostBuffer(len(kv) * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	copy(src.Bytes(), Float32s(kv))
	save, err := f.m.SaveAsync(ns, Tokens(tokens), src)
	if err != nil {
		t.Fatal(err)
	}
	for l := 0; l < layers; l++ {
		if err := save.LayerReady(l); err != nil {
			t.Fatalf("LayerReady(%d): %v", l, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := save.Wait(ctx); err != nil {
		t.Fatalf("save Wait: %v", err)
	}
	if res, err := save.Result(); err != nil || res.State != OpDone || res.Tokens != positions {
		t.Fatalf("save Result = %+v, %v", res, err)
	}
	save.Close()

	dst, err := NewHostBuffer(len(kv) * 4)
	if err != nil {
		t.Fatal(err)
	}
	load, err := f.m.LoadAsync(ns, Tokens(tokens), dst)
	if err != nil {
		t.Fatal(err)
	}
	dst.Close() // the op keeps the memory until it is closed
	for l := 0; l < layers; l++ {
		if err := load.WaitLayer(ctx, l); err != nil {
			t.Fatalf("WaitLayer(%d): %v", l, err)
		}
	}
	if err := load.Wait(ctx); err != nil {
		t.Fatalf("load Wait: %v", err)
	}
	if st, err := load.Poll(); err != nil || st != OpDone {
		t.Fatalf("Poll = %v, %v", st, err)
	}
	res, err := load.Result()
	if err != nil || res.State != OpDone || res.Tokens != positions || res.Covered != positions || res.NumFailed != 0 {
		t.Fatalf("load Result = %+v, %v", res, err)
	}
	if r, err := load.FailedRanges(); err != nil || len(r) != 0 {
		t.Fatalf("FailedRanges = %v, %v", r, err)
	}
	if !bytes.Equal(load.buf.Bytes(), nil) {
		t.Fatal("a closed HostBuffer still gives its bytes")
	}
	got := unsafeBytes(load.buf)
	if !bytes.Equal(got, Float32s(kv)) {
		t.Fatal("the loaded KV differs from the saved KV")
	}
	load.Close()

	// A load of a miss: 0 tokens, done.
	buf, _ := NewHostBuffer(len(kv) * 4)
	defer buf.Close()
	miss, err := f.m.LoadAsync("nobody", Tokens(tokens), buf)
	if err != nil {
		t.Fatal(err)
	}
	defer miss.Close()
	if err := miss.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if res, _ := miss.Result(); res.Tokens != 0 || res.State != OpDone {
		t.Fatalf("load of a miss: %+v", res)
	}
}

func TestOpCancel(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	buf, _ := NewHostBuffer(int(f.m.KVBytesPerToken()) * positions)
	defer buf.Close()
	save, err := f.m.SaveAsync(ns, Tokens(tokens), buf)
	if err != nil {
		t.Fatal(err)
	}
	defer save.Close()
	// No layer is ready: a wait times out through the context, the op goes on.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if err := save.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a deadline = %v", err)
	}
	if st, _ := save.Poll(); st != OpPending {
		t.Fatalf("Poll = %v, want pending", st)
	}
	if err := save.Cancel(); err != nil {
		t.Fatal(err)
	}
	if err := save.Cancel(); err != nil { // twice is fine
		t.Fatal(err)
	}
	// A save ends cancelled at its next layer.
	for l := 0; l < layers; l++ {
		if err := save.LayerReady(l); err != nil {
			t.Fatalf("LayerReady(%d) after Cancel: %v", l, err)
		}
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	err = save.Wait(wctx)
	if !errors.Is(err, ErrCancelled) || IsRetryable(err) {
		t.Fatalf("Wait after Cancel = %v", err)
	}
	if res, _ := save.Result(); res.State != OpCancelled || res.Status != StatusCancelled || res.Tokens != 0 {
		t.Fatalf("Result = %+v", res)
	}
	if got, _ := f.m.Lookup(bg, ns, Tokens(tokens)); got.CachedTokens != 0 {
		t.Fatalf("a cancelled save stored %d tokens", got.CachedTokens)
	}
}

func TestKnowledge(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 11)
	if err := f.m.KnowledgePut(bg, ns, "doc-b", 2, `{"src":"b"}`, tokens[:32], Float32s(canonical(32, 2))); err != nil {
		t.Fatal(err)
	}
	if err := f.m.KnowledgePut(bg, ns, "doc-a", 7, "", tokens, Float32s(kv)); err != nil {
		t.Fatal(err)
	}
	info, err := f.m.KnowledgeInfo(ns, "doc-a")
	if err != nil || info.DocID != "doc-a" || info.Version != 7 || info.NumTokens != positions || info.Pinned ||
		info.ExpiresIn >= 0 || info.Chunks == 0 || info.ChunksPresent != info.Chunks || info.Hits != 0 {
		t.Fatalf("KnowledgeInfo = %+v, %v", info, err)
	}
	list, err := f.m.KnowledgeList(ns)
	if err != nil || len(list) != 2 || list[0].DocID != "doc-a" || list[1].DocID != "doc-b" || list[1].NumTokens != 32 {
		t.Fatalf("KnowledgeList = %+v, %v", list, err)
	}
	gotTokens := make([]int32, positions)
	out := make([]float32, len(kv))
	res, err := f.m.KnowledgeFetch(bg, ns, "doc-a", gotTokens, Float32s(out))
	if err != nil || res.Tokens != positions {
		t.Fatalf("KnowledgeFetch = %+v, %v", res, err)
	}
	for i := range tokens {
		if gotTokens[i] != tokens[i] {
			t.Fatalf("fetched token %d = %d, want %d", i, gotTokens[i], tokens[i])
		}
	}
	if !bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatal("the fetched KV differs from the put KV")
	}
	// Each chunk fetched counts on the document (since 1.4).
	if got, err := f.m.KnowledgeInfo(ns, "doc-a"); err != nil || got.Hits != uint64(info.Chunks) {
		t.Fatalf("KnowledgeInfo after a fetch = %+v, %v, want %d hits", got, err, info.Chunks)
	}
	// Tokens only.
	if res, err := f.m.KnowledgeFetch(bg, ns, "doc-b", gotTokens[:32], nil); err != nil || res.Tokens != 32 {
		t.Fatalf("KnowledgeFetch (tokens only) = %+v, %v", res, err)
	}

	if err := f.m.KnowledgePin(ns, "doc-a", 0); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.m.KnowledgeInfo(ns, "doc-a"); !info.Pinned || info.PinExpiresIn >= 0 {
		t.Fatalf("KnowledgeInfo after KnowledgePin(0) = %+v", info)
	}
	if s, _ := f.rt.Stats(); s.PinsActive == 0 {
		t.Fatal("Stats.PinsActive is 0 with a pinned document")
	}
	if err := f.m.KnowledgeUnpin(ns, "doc-a"); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.m.KnowledgeInfo(ns, "doc-a"); info.Pinned {
		t.Fatal("pinned after KnowledgeUnpin")
	}
	// A pin with a TTL says when it ends (since 1.4).
	if err := f.m.KnowledgePin(ns, "doc-b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.m.KnowledgeInfo(ns, "doc-b"); info.PinExpiresIn <= 50*time.Second ||
		info.PinExpiresIn > time.Minute {
		t.Fatalf("PinExpiresIn = %v after KnowledgePin(1m)", info.PinExpiresIn)
	}
	if err := f.m.KnowledgeExpire(ns, "doc-b", time.Hour); err != nil {
		t.Fatal(err)
	}
	if info, _ := f.m.KnowledgeInfo(ns, "doc-b"); info.ExpiresIn <= 0 || info.ExpiresIn > time.Hour {
		t.Fatalf("ExpiresIn = %v after KnowledgeExpire(1h)", info.ExpiresIn)
	}
	if err := f.m.KnowledgeDelete(ns, "doc-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.KnowledgeInfo(ns, "doc-a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("KnowledgeInfo after delete = %v", err)
	}
	if list, _ := f.m.KnowledgeList(ns); len(list) != 1 {
		t.Fatalf("KnowledgeList after delete = %+v", list)
	}
}

// Three tiers (host, device, disk with zstd), S3-FIFO, watermarks, write-through.
func TestTiers(t *testing.T) {
	dir := t.TempDir()
	host := HostTier(64 << 10)
	host.Policy = EvictS3FIFO
	host.HighWatermark, host.LowWatermark = 0.9, 0.5
	host.WriteThrough = true
	disk := DiskTier(dir, 16<<20)
	disk.Codec = "zstd"
	opts := &RuntimeOptions{ChunkTokens: chunk, HashSeed: 42, WorkerThreads: 1,
		Tiers: []TierConfig{host, DeviceTier(8 << 20), disk}}
	f := newFixture(t, opts)
	n, err := f.rt.TierCount()
	if err != nil || n != 3 {
		t.Fatalf("TierCount = %d, %v", n, err)
	}
	for i := 0; i < 4; i++ {
		toks := testTokens(positions + i)[i:]
		f.store(t, toks, canonical(positions, float32(i)))
	}
	kinds := []TierKind{TierHost, TierDevice, TierDisk}
	for i := 0; i < n; i++ {
		ts, err := f.rt.TierStats(i)
		if err != nil || ts.Kind != kinds[i] || ts.Name == "" || ts.CapacityBytes == 0 {
			t.Fatalf("TierStats(%d) = %+v, %v", i, ts, err)
		}
		if i == 2 && !strings.HasPrefix(ts.Codec, "zstd") {
			t.Fatalf("disk tier codec = %q", ts.Codec)
		}
		// The watermarks (since 1.4): as set (float32), or kdn's defaults.
		high, low := 0.95, 0.85
		if i == 0 {
			high, low = float64(float32(0.9)), float64(float32(0.5))
		}
		if ts.HighWatermark != high || ts.LowWatermark != low {
			t.Fatalf("TierStats(%d) watermarks = %v, %v, want %v, %v", i, ts.HighWatermark, ts.LowWatermark, high, low)
		}
	}
	if s, _ := f.rt.Stats(); s.Evictions == 0 {
		t.Fatalf("no evictions from a 64 KiB host tier holding %d bytes", 4*positions*f.m.KVBytesPerToken())
	}
	// Everything is still found below the host tier, byte for byte.
	out := make([]float32, layers*2*positions*row)
	res, err := f.m.Retrieve(bg, ns, Tokens(testTokens(positions)), Float32s(out))
	if err != nil || res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(canonical(positions, 0))) {
		t.Fatalf("Retrieve through the tiers = %+v, %v", res, err)
	}
	if _, err := f.rt.TierStats(3); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("TierStats(3) = %v", err)
	}
}

func TestLossyCodec(t *testing.T) {
	f := newFixture(t, &RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{{Kind: TierHost, CapacityBytes: 16 << 20, Codec: "int8"}}})
	tokens := testTokens(positions)
	kv := canonical(positions, 1)
	f.store(t, tokens, kv)
	out := make([]float32, len(kv))
	res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out))
	if err != nil || res.Tokens != positions || !res.Lossy() {
		t.Fatalf("Retrieve from int8 = %+v, %v", res, err)
	}
	var worst, peak float64
	for i := range kv {
		worst = math.Max(worst, math.Abs(float64(out[i]-kv[i])))
		peak = math.Max(peak, math.Abs(float64(kv[i])))
	}
	if worst > 0.02*peak || worst == 0 {
		t.Fatalf("int8 error %v", worst)
	}
	if ts, _ := f.rt.TierStats(0); ts.Codec != "int8" || ts.EncodedChunks == 0 {
		t.Fatalf("TierStats = %+v", ts)
	}
}

func TestCloseOrder(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, HostCapacityBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	// The model outlives its runtime's handle.
	if err := rt.Close(); err != nil {
		t.Fatal(err)
	}
	if err := rt.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	tokens := testTokens(positions)
	kv := canonical(positions, 1)
	if res, err := m.Store(bg, ns, Tokens(tokens), Float32s(kv)); err != nil || res.Tokens != positions {
		t.Fatalf("Store after the runtime's Close = %+v, %v", res, err)
	}
	if _, err := rt.Stats(); err != ErrClosed {
		t.Fatalf("Stats after Close = %v", err)
	}
	m.Close()
	m.Close()
}

func TestConcurrent(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 1)
	f.store(t, tokens, kv)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]float32, len(kv))
			for i := 0; i < 50; i++ {
				res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out))
				if err == nil && (res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(kv))) {
					err = errors.New("a concurrent retrieve differs")
				}
				if err == nil {
					_, err = f.m.Lookup(bg, ns, Tokens(tokens))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	e := &Error{Status: StatusBusy, Message: "full"}
	var err error = e
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrNotFound) || !IsRetryable(err) || IsCaller(err) {
		t.Fatal("ErrBusy: wrong matches")
	}
	if !errors.Is(err, ErrRetryable) || errors.Is(err, ErrCaller) {
		t.Fatal("ErrBusy: wrong family")
	}
	if err.Error() != "kdn: KDN_ERR_BUSY: full" {
		t.Fatalf("Error() = %q", err.Error())
	}
	unknown := &Error{Status: -77}
	if IsCaller(unknown) || IsRetryable(unknown) || unknown.Status.String() != "KDN_ERR_UNKNOWN(-77)" {
		t.Fatal("an unknown status is in a family")
	}
	if !IsCaller(ErrClosed) || StatusOf(ErrClosed) != StatusInvalidArgument || StatusOf(nil) != StatusOK {
		t.Fatal("ErrClosed is not a caller error")
	}
	for s, name := range statusNames {
		if cname := statusCName(s); cname != name {
			t.Fatalf("%d: %q here, %q in libkdn", s, name, cname)
		}
	}
}

// unsafeBytes is a HostBuffer's memory even after its Close (while an op still holds it).
func unsafeBytes(b *HostBuffer) []byte { return unsafe.Slice((*byte)(b.p), b.n) }

// More views and layers than the shims keep on their stack, and more
// requests: the heap paths of kdn_go.c.
func TestManyViewsAndRequests(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 13)
	f.store(t, tokens, kv)
	layerElems := positions * row
	views := make([]KVView, layers) // one view per layer: 5 > 4 on the stack
	for l := range views {
		views[l] = KVView{Layers: []uint32{uint32(l)}, KOffsets: []int64{int64(2 * l * layerElems)},
			VOffsets: []int64{int64((2*l + 1) * layerElems)}, StrideToken: row, StrideHead: headDim, StrideDim: 1}
	}
	out := make([]float32, len(kv))
	if res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out), views...); err != nil || res.Tokens != positions ||
		!bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatalf("five views: %+v, %v", res, err)
	}

	reqs := make([]Request, 40) // 40 > 16 on the stack
	for i := range reqs {
		reqs[i] = Tokens(tokens[:i+1])
	}
	got, err := f.m.LookupBatch(bg, ns, reqs)
	if err != nil || len(got) != len(reqs) {
		t.Fatalf("LookupBatch of 40 = %v, %v", len(got), err)
	}
	for i, r := range got {
		if want := uint64((i + 1) / chunk * chunk); r.Status != StatusOK || r.CachedTokens != want {
			t.Fatalf("request %d: %+v, want %d", i, r, want)
		}
	}

	// A model of 40 layers: 80 per-layer pointers (more than 64 on the stack).
	big, err := f.rt.NewModel(&ModelSpec{NumLayers: 40, NumKVHeads: 1, HeadDim: 4, DType: F32, Fingerprint: "deep"})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	deep := make([]float32, 40*2*chunk*4)
	for i := range deep {
		deep[i] = float32(i)
	}
	view := KVView{}
	for l := 0; l < 40; l++ { // the canonical layout, said per layer
		view.KOffsets = append(view.KOffsets, int64(2*l*chunk*4))
		view.VOffsets = append(view.VOffsets, int64((2*l+1)*chunk*4))
		view.StrideToken, view.StrideHead, view.StrideDim = 4, 4, 1
	}
	if res, err := big.Store(bg, ns, Tokens(tokens[:chunk]), Float32s(deep), view); err != nil || res.Tokens != chunk {
		t.Fatalf("Store, 40 layers = %+v, %v", res, err)
	}
	back := make([]float32, len(deep))
	if res, err := big.Retrieve(bg, ns, Tokens(tokens[:chunk]), Float32s(back)); err != nil || res.Tokens != chunk ||
		!bytes.Equal(Float32s(back), Float32s(deep)) {
		t.Fatalf("Retrieve, 40 layers = %+v, %v", res, err)
	}
}

// Close while other goroutines use the model: each call either works or
// gets ErrClosed; none reaches a destroyed handle.
func TestCloseWhileInUse(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, HostCapacityBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	tokens := testTokens(positions)
	kv := canonical(positions, 1)
	if _, err := m.Store(bg, ns, Tokens(tokens), Float32s(kv)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]float32, len(kv))
			for {
				_, err := m.Retrieve(bg, ns, Tokens(tokens), Float32s(out))
				if err == nil {
					_, err = m.Lookup(bg, ns, Tokens(tokens))
				}
				if err == ErrClosed {
					return
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	m.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// A forgotten runtime and model are closed by their finalizers, which also
// release the editor's handle.
func TestFinalizerBackstop(t *testing.T) {
	c := func() *core {
		rt, err := NewRuntimeWithEditor(nil, func(ChunkInfo, []byte) (bool, error) { return false, nil })
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rt.NewModel(testSpec()); err != nil {
			t.Fatal(err)
		}
		return rt.core
	}()
	released := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.refs == 0 && c.editor == 0
	}
	for deadline := time.Now().Add(10 * time.Second); !released(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the finalizers did not close the runtime and the model")
		}
		runtime.GC()
	}
}

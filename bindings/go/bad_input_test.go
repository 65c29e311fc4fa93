// SPDX-License-Identifier: Apache-2.0
package kdn

// The bad inputs every binding is tested with (the same rows, in the same
// order, in Go, Java, Python and Rust): each gives the language's error,
// never a crash. Row 10, the editor that fails or panics, is TestBadEditor
// in editor_test.go.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// wantStatus fails unless err is a *Error of that status with a message.
func wantStatus(t *testing.T, what string, err error, want error) {
	t.Helper()
	var e *Error
	if !errors.Is(err, want) || !errors.As(err, &e) || e.Message == "" {
		t.Fatalf("%s: %v, want %v with a message", what, err, want)
	}
}

// 1. A KV buffer smaller than tokens x bytes per token: refused before any write.
func TestBadSmallBuffer(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := canonical(positions, 1)
	f.store(t, tokens, kv)
	small := make([]byte, positions*int(f.m.KVBytesPerToken())-1)
	for i := range small {
		small[i] = 0xab
	}
	_, err := f.m.Retrieve(bg, ns, Tokens(tokens), small)
	wantStatus(t, "Retrieve into a short buffer", err, ErrInvalidArgument)
	if !IsCaller(err) || IsRetryable(err) {
		t.Fatal("a short buffer is not a caller error")
	}
	for i, b := range small {
		if b != 0xab {
			t.Fatalf("byte %d written by a refused retrieve", i)
		}
	}
	_, err = f.m.Store(bg, ns, Tokens(testTokens(positions + 1)[1:]), Float32s(kv[:len(kv)-1]))
	wantStatus(t, "Store from a short buffer", err, ErrInvalidArgument)
	// Per-layer offsets reaching past the slice are refused on the Go side.
	view := KVView{KOffsets: make([]int64, layers), VOffsets: make([]int64, layers)}
	view.VOffsets[layers-1] = int64(len(kv) + 1)
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(kv), view)
	wantStatus(t, "an offset past the slice", err, ErrInvalidArgument)
	paged := KVView{Layout: LayoutPagedNHD, BlockSize: chunk, BlockTable: []int32{0, 1, 2}, NumBlocks: 1000,
		KOffsets: make([]int64, layers), VOffsets: make([]int64, layers)}
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(kv), paged)
	wantStatus(t, "NumBlocks past the slice", err, ErrInvalidArgument)
	// A block table entry beyond the slab's blocks: kdn's own bound check.
	paged.NumBlocks = 0
	paged.BlockTable = []int32{0, 1, 1 << 20}
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(kv), paged)
	wantStatus(t, "a block beyond the slice", err, ErrInvalidArgument)
}

// 2. Retrieve into memory that cannot be written. Go has no read-only
// []byte (the type prevents it); the nearest is no memory at all.
func TestBadReadOnlyBuffer(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	f.store(t, tokens, canonical(positions, 1))
	_, err := f.m.Retrieve(bg, ns, Tokens(tokens), nil)
	wantStatus(t, "Retrieve into nil", err, ErrInvalidArgument)
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), []byte{})
	wantStatus(t, "Retrieve into an empty slice", err, ErrInvalidArgument)
}

// 3. A view whose dtype is not the model's; a model of an unknown dtype.
func TestBadDtype(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	half := make([]uint16, layers*2*positions*row)
	_, err := f.m.Store(bg, ns, Tokens(tokens), Uint16s(half), KVView{DType: F16})
	wantStatus(t, "an F16 view of an F32 model", err, ErrInvalidArgument)
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), Uint16s(half), KVView{DType: BF16})
	wantStatus(t, "a BF16 view of an F32 model", err, ErrInvalidArgument)
	spec := testSpec()
	spec.DType = 7
	_, err = f.rt.NewModel(spec)
	wantStatus(t, "a model of dtype 7", err, ErrInvalidArgument)
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), Uint16s(half), KVView{DType: 9, KOffsets: []int64{0}, VOffsets: []int64{0}})
	wantStatus(t, "per-layer offsets of an unknown dtype", err, ErrInvalidArgument)
}

// 4. A closed runtime, model, op or buffer: ErrClosed, without reaching C.
func TestBadClosedHandle(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, HostCapacityBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := NewHostBuffer(int(m.KVBytesPerToken()) * positions)
	m.Close()
	tokens := testTokens(positions)
	out := make([]byte, int(m.KVBytesPerToken())*positions)
	calls := map[string]error{}
	_, calls["Store"] = m.Store(bg, ns, Tokens(tokens), out)
	_, calls["Retrieve"] = m.Retrieve(bg, ns, Tokens(tokens), out)
	_, calls["Lookup"] = m.Lookup(bg, ns, Tokens(tokens))
	_, calls["LookupBatch"] = m.LookupBatch(bg, ns, []Request{Tokens(tokens)})
	_, calls["LoadAsync"] = m.LoadAsync(ns, Tokens(tokens), buf)
	calls["KnowledgePut"] = m.KnowledgePut(bg, ns, "d", 1, "", tokens, out)
	_, calls["KnowledgeFetch"] = m.KnowledgeFetch(bg, ns, "d", tokens, out)
	_, calls["KnowledgeList"] = m.KnowledgeList(ns)
	calls["KnowledgeDelete"] = m.KnowledgeDelete(ns, "d")
	_, calls["Match"] = m.Match(ns, tokens)
	calls["ReportPrefill"] = m.ReportPrefill(positions, time.Millisecond)
	rt.Close()
	_, calls["NewModel"] = rt.NewModel(testSpec())
	_, calls["Stats"] = rt.Stats()
	_, calls["TierStats"] = rt.TierStats(0)
	_, calls["Latency"] = rt.Latency(LatencyLookup)
	buf.Close()
	for name, err := range calls {
		if err != ErrClosed || !IsCaller(err) {
			t.Errorf("%s on a closed handle: %v, want ErrClosed", name, err)
		}
	}
	if buf.Bytes() != nil {
		t.Error("a closed HostBuffer gives bytes")
	}
	// Closing again is fine.
	if m.Close() != nil || rt.Close() != nil || buf.Close() != nil {
		t.Error("a second Close failed")
	}
}

// 5. nil spec, editor, buffer; empty namespace and fingerprint.
func TestBadNilArgument(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	out := make([]byte, int(f.m.KVBytesPerToken())*positions)
	_, err := f.rt.NewModel(nil)
	wantStatus(t, "NewModel(nil)", err, ErrInvalidArgument)
	_, err = f.rt.NewModel(&ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim})
	wantStatus(t, "an empty fingerprint", err, ErrInvalidArgument)
	_, err = NewRuntimeWithEditor(nil, nil)
	wantStatus(t, "a nil editor", err, ErrInvalidArgument)
	_, err = f.m.LoadAsync(ns, Tokens(tokens), nil)
	wantStatus(t, "LoadAsync into a nil HostBuffer", err, ErrInvalidArgument)
	_, err = f.m.Store(bg, "", Tokens(tokens), out)
	wantStatus(t, "Store to an empty namespace", err, ErrInvalidArgument)
	_, err = f.m.Lookup(bg, "", Tokens(tokens))
	wantStatus(t, "Lookup in an empty namespace", err, ErrInvalidArgument)
	_, err = f.m.LookupBatch(bg, "", []Request{Tokens(tokens)})
	wantStatus(t, "LookupBatch in an empty namespace", err, ErrInvalidArgument)
	_, err = f.m.Store(bg, ns, Request{}, out)
	wantStatus(t, "Store of no tokens", err, ErrInvalidArgument)
	_, err = f.m.Store(bg, ns, Tokens(tokens), out, KVView{Layout: LayoutPagedNHD})
	wantStatus(t, "a paged view without a block table", err, ErrInvalidArgument)
	_, err = NewHostBuffer(0)
	wantStatus(t, "NewHostBuffer(0)", err, ErrInvalidArgument)
}

// 6. A negative token id.
func TestBadNegativeToken(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	tokens[20] = -5
	out := make([]byte, int(f.m.KVBytesPerToken())*positions)
	_, err := f.m.Store(bg, ns, Tokens(tokens), out)
	wantStatus(t, "Store of a negative id", err, ErrInvalidArgument)
	_, err = f.m.Retrieve(bg, ns, Tokens(tokens), out)
	wantStatus(t, "Retrieve of a negative id", err, ErrInvalidArgument)
	_, err = f.m.Lookup(bg, ns, Tokens(tokens))
	wantStatus(t, "Lookup of a negative id", err, ErrInvalidArgument)
	err = f.m.KnowledgePut(bg, ns, "neg", 1, "", tokens, out)
	wantStatus(t, "KnowledgePut of a negative id", err, ErrInvalidArgument)
	_, err = f.m.Match(ns, tokens)
	wantStatus(t, "Match of a negative id", err, ErrInvalidArgument)
}

// 7. A tier of capacity 0, an unknown codec, an unknown kind, bad watermarks.
func TestBadTierConfig(t *testing.T) {
	bad := map[string]TierConfig{
		"capacity 0":     {Kind: TierHost},
		"codec nope":     {Kind: TierHost, CapacityBytes: 1 << 20, Codec: "nope"},
		"kind 9":         {Kind: 9, CapacityBytes: 1 << 20},
		"low above high": {Kind: TierHost, CapacityBytes: 1 << 20, HighWatermark: 0.5, LowWatermark: 0.9},
		"disk, no path":  {Kind: TierDisk, CapacityBytes: 1 << 20},
	}
	for name, tier := range bad {
		rt, err := NewRuntime(&RuntimeOptions{Tiers: []TierConfig{tier}})
		if rt != nil {
			rt.Close()
		}
		wantStatus(t, name, err, ErrInvalidArgument)
	}
	_, err := NewRuntime(&RuntimeOptions{ChunkTokens: 1 << 31})
	wantStatus(t, "chunk_tokens 2^31", err, ErrInvalidArgument)
	tiers := make([]TierConfig, MaxTiers+1)
	for i := range tiers {
		tiers[i] = HostTier(1 << 20)
	}
	_, err = NewRuntime(&RuntimeOptions{Tiers: tiers})
	wantStatus(t, "9 tiers", err, ErrInvalidArgument)
}

// A redis tier with a malformed address: refused by NewRuntime, naming it
// (no server is contacted).
func TestBadRedisAddress(t *testing.T) {
	rt, err := NewRuntime(&RuntimeOptions{Tiers: []TierConfig{RedisTier("not-an-address", "")}})
	if rt != nil {
		rt.Close()
	}
	wantStatus(t, "redis tier at not-an-address", err, ErrInvalidArgument)
	if !strings.Contains(err.Error(), "not-an-address") {
		t.Fatalf("redis tier at not-an-address: %v", err)
	}
}

// User and TTL are for redis tiers: a host tier refuses them, and a
// negative TTL is refused before kdn is called.
func TestBadRedisFieldsOnHostTier(t *testing.T) {
	user, ttl, negative := HostTier(1<<20), HostTier(1<<20), RedisTier("127.0.0.1:1", "")
	user.User = "kdn"
	ttl.TTL = time.Minute
	negative.TTL = -time.Second
	for _, c := range []struct {
		name string
		tier TierConfig
		says string
	}{{"User on a host tier", user, "redis"}, {"TTL on a host tier", ttl, "redis"}, {"a negative TTL", negative, "TTL"}} {
		rt, err := NewRuntime(&RuntimeOptions{Tiers: []TierConfig{c.tier}})
		if rt != nil {
			rt.Close()
		}
		wantStatus(t, c.name, err, ErrInvalidArgument)
		if !strings.Contains(err.Error(), c.says) {
			t.Fatalf("%s: %v, want it to say %q", c.name, err, c.says)
		}
	}
}

// A prefill report of 0 tokens, 0 (or negative) time, or over an hour per
// token: ErrInvalidArgument, and nothing counted.
func TestBadReportPrefill(t *testing.T) {
	f := newFixture(t, nil)
	for _, c := range []struct {
		name    string
		tokens  uint64
		elapsed time.Duration
	}{
		{"0 tokens", 0, 5 * time.Millisecond},
		{"0 time", 16, 0},
		{"a negative time", 16, -time.Millisecond},
		{"over an hour per token", 2, 2*time.Hour + time.Second},
	} {
		err := f.m.ReportPrefill(c.tokens, c.elapsed)
		wantStatus(t, "ReportPrefill of "+c.name, err, ErrInvalidArgument)
		if !IsCaller(err) {
			t.Fatalf("ReportPrefill of %s: %v is not a caller error", c.name, err)
		}
	}
	if s, err := f.rt.Stats(); err != nil || s.PrefillTokens != 0 || s.PrefillTime != 0 {
		t.Fatalf("Stats after refused reports = %+v, %v", s, err)
	}
}

// 8. An unknown document: ErrNotFound; a 256-byte doc_id: ErrInvalidArgument.
func TestBadUnknownDocument(t *testing.T) {
	f := newFixture(t, nil)
	out := make([]byte, int(f.m.KVBytesPerToken())*positions)
	tokens := make([]int32, positions)
	_, err := f.m.KnowledgeFetch(bg, ns, "nope", tokens, out)
	wantStatus(t, "KnowledgeFetch of an unknown document", err, ErrNotFound)
	if IsCaller(err) || IsRetryable(err) {
		t.Fatal("ErrNotFound is in a family")
	}
	_, err = f.m.KnowledgeInfo(ns, "nope")
	wantStatus(t, "KnowledgeInfo of an unknown document", err, ErrNotFound)
	long := strings.Repeat("x", 256)
	err = f.m.KnowledgePut(bg, ns, long, 1, "", testTokens(positions), Float32s(canonical(positions, 1)))
	wantStatus(t, "KnowledgePut of a 256-byte id", err, ErrInvalidArgument)
	_, err = f.m.KnowledgeFetch(bg, ns, long, tokens, out)
	wantStatus(t, "KnowledgeFetch of a 256-byte id", err, ErrInvalidArgument)
	err = f.m.KnowledgePut(bg, ns, "", 1, "", testTokens(positions), Float32s(canonical(positions, 1)))
	wantStatus(t, "KnowledgePut of an empty id", err, ErrInvalidArgument)
	err = f.m.KnowledgePin(ns, "d", -time.Second)
	wantStatus(t, "a negative TTL", err, ErrInvalidArgument)
}

// 9. KnowledgeFetch into too-small buffers: ErrBufferTooSmall carrying the
// document's length, nothing written.
func TestBadFetchTooSmall(t *testing.T) {
	f := newFixture(t, nil)
	kv := canonical(positions, 1)
	if err := f.m.KnowledgePut(bg, ns, "story", 1, "", testTokens(positions), Float32s(kv)); err != nil {
		t.Fatal(err)
	}
	bpt := int(f.m.KVBytesPerToken())
	cases := map[string]struct {
		tokens []int32
		data   []byte
	}{
		"tokens":    {make([]int32, positions-1), nil},
		"kv":        {make([]int32, positions), make([]byte, (positions-1)*bpt)},
		"both":      {make([]int32, 10), make([]byte, 10*bpt)},
		"under one": {nil, make([]byte, bpt-1)},
	}
	for name, c := range cases {
		_, err := f.m.KnowledgeFetch(bg, ns, "story", c.tokens, c.data)
		wantStatus(t, name, err, ErrBufferTooSmall)
		var e *Error
		errors.As(err, &e)
		if e.Needed != positions {
			t.Fatalf("%s: Needed = %d, want %d", name, e.Needed, positions)
		}
		for _, tok := range c.tokens {
			if tok != 0 {
				t.Fatalf("%s: a token was written", name)
			}
		}
		for _, b := range c.data {
			if b != 0 {
				t.Fatalf("%s: KV was written", name)
			}
		}
	}
}

// 11. A batched lookup with bad requests: their own statuses, no error.
func TestBadBatchedLookup(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	f.store(t, tokens, canonical(positions, 1))
	neg := append([]int32(nil), tokens...)
	neg[3] = -1
	got, err := f.m.LookupBatch(bg, ns, []Request{
		Tokens(tokens),
		Tokens(neg),
		{BlockHashes: make([]byte, 10), HashBytes: 100}, // hash_bytes above 64
		Tokens(tokens[:chunk]),
	})
	if err != nil || len(got) != 4 {
		t.Fatalf("LookupBatch = %v, %v", got, err)
	}
	if got[0].Status != StatusOK || got[0].CachedTokens != positions || got[3].Status != StatusOK ||
		got[3].CachedTokens != chunk {
		t.Fatalf("good requests: %+v, %+v", got[0], got[3])
	}
	for _, i := range []int{1, 2} {
		if got[i].Status != StatusInvalidArgument || !errors.Is(got[i].Err(), ErrInvalidArgument) || got[i].CachedTokens != 0 {
			t.Fatalf("bad request %d: %+v", i, got[i])
		}
	}
	// The single lookup of a bad request is an error.
	_, err = f.m.Lookup(bg, ns, Tokens(neg))
	wantStatus(t, "Lookup of a bad request", err, ErrInvalidArgument)
}

// 12. Wait after Close: ErrClosed; a context already cancelled: ctx.Err() at once.
func TestBadWaitAfterClose(t *testing.T) {
	f := newFixture(t, nil)
	buf, _ := NewHostBuffer(int(f.m.KVBytesPerToken()) * positions)
	defer buf.Close()
	op, err := f.m.SaveAsync(ns, Tokens(testTokens(positions)), buf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := op.Wait(ctx); err != context.Canceled {
		t.Fatalf("Wait with a cancelled context = %v", err)
	}
	if err := op.WaitLayer(ctx, 0); err != context.Canceled {
		t.Fatalf("WaitLayer with a cancelled context = %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("a cancelled context did not return at once")
	}
	if err := op.WaitLayer(context.Background(), 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("WaitLayer on a save = %v", err) // a save has no layers to wait for
	}
	if err := op.LayerReady(layers); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("LayerReady past the last layer = %v", err)
	}
	op.Close() // cancels the save: nothing stored
	op.Close()
	for name, err := range map[string]error{
		"Wait":         op.Wait(context.Background()),
		"WaitLayer":    op.WaitLayer(context.Background(), 0),
		"LayerReady":   op.LayerReady(0),
		"Cancel":       op.Cancel(),
		"Poll":         func() error { _, err := op.Poll(); return err }(),
		"Result":       func() error { _, err := op.Result(); return err }(),
		"FailedRanges": func() error { _, err := op.FailedRanges(); return err }(),
	} {
		if err != ErrClosed {
			t.Errorf("%s after Close = %v", name, err)
		}
	}
	if got, _ := f.m.Lookup(bg, ns, Tokens(testTokens(positions))); got.CachedTokens != 0 {
		t.Fatal("a closed save stored KV")
	}
}

// SPDX-License-Identifier: Apache-2.0
package kdn

// Salted requests (1.13, Request.Salt): a salt enters every chunk key, so
// KV stored with one salt answers only requests with that same salt.

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// saltLookup is the cached tokens of a lookup of tokens with salt (nil: none).
func saltLookup(t *testing.T, f fixture, tokens []int32, salt []byte) uint64 {
	t.Helper()
	got, err := f.m.Lookup(bg, ns, Request{Tokens: tokens, Salt: salt})
	if err != nil {
		t.Fatalf("Lookup with salt %q: %v", salt, err)
	}
	return got.CachedTokens
}

// A salted store is found by the same salt only: not by an unsalted
// request, nor by another salt; unsalted KV answers no salted request. A
// retrieve with the salt gives the KV back bit for bit, one with another
// salt gets 0 tokens. The caller's salt slice may be reused once a call
// returned.
func TestSaltSeparatesKV(t *testing.T) {
	f := newFixture(t, nil)
	tokens, kv := testTokens(positions), canonical(positions, 3)
	salt, other := []byte("user-a"), []byte("user-b")
	scratch := append([]byte(nil), salt...)
	res, err := f.m.Store(bg, ns, Request{Tokens: tokens, Salt: scratch}, Float32s(kv))
	if err != nil || res.Tokens != positions {
		t.Fatalf("salted Store = %+v, %v", res, err)
	}
	copy(scratch, "XXXXXX") // kdn hashed the salt during the call

	if n := saltLookup(t, f, tokens, nil); n != 0 {
		t.Fatalf("unsalted Lookup of salted KV: %d tokens, want 0", n)
	}
	if n := saltLookup(t, f, tokens, []byte{}); n != 0 {
		t.Fatalf("Lookup with an empty salt (none) of salted KV: %d tokens, want 0", n)
	}
	if n := saltLookup(t, f, tokens, salt); n != positions {
		t.Fatalf("Lookup with the same salt: %d tokens, want %d", n, positions)
	}
	if n := saltLookup(t, f, tokens[:40], salt); n != 32 {
		t.Fatalf("Lookup of 40 tokens with the same salt: %d tokens, want 32", n)
	}
	if n := saltLookup(t, f, tokens, other); n != 0 {
		t.Fatalf("Lookup with another salt: %d tokens, want 0", n)
	}
	if n := saltLookup(t, f, tokens, scratch); n != 0 {
		t.Fatalf("Lookup with the reused slice's new bytes: %d tokens, want 0", n)
	}
	// A lookup that a context can abandon runs over a copy of the salt.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := f.m.Lookup(ctx, ns, Request{Tokens: tokens, Salt: salt}); err != nil || got.CachedTokens != positions {
		t.Fatalf("Lookup with the salt and a context that can end = %+v, %v", got, err)
	}

	out := make([]float32, len(kv))
	res, err = f.m.Retrieve(bg, ns, Request{Tokens: tokens, Salt: salt}, Float32s(out))
	if err != nil || res.Tokens != positions || res.Covered != positions || res.Lossy() {
		t.Fatalf("Retrieve with the salt = %+v, %v", res, err)
	}
	if !bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatal("the KV retrieved with the salt differs from the KV stored")
	}
	for _, s := range [][]byte{other, nil} {
		res, err = f.m.Retrieve(bg, ns, Request{Tokens: tokens, Salt: s}, Float32s(out))
		if err != nil || res.Tokens != 0 || res.Covered != 0 {
			t.Fatalf("Retrieve with salt %q = %+v, %v (want a miss)", s, res, err)
		}
	}

	// Unsalted KV of other tokens answers unsalted requests only.
	plain := testTokens(positions + chunk)[chunk:]
	f.store(t, plain, canonical(positions, 5))
	if n := saltLookup(t, f, plain, nil); n != positions {
		t.Fatalf("unsalted Lookup of unsalted KV: %d tokens, want %d", n, positions)
	}
	if n := saltLookup(t, f, plain, salt); n != 0 {
		t.Fatalf("salted Lookup of unsalted KV: %d tokens, want 0", n)
	}

	// In a batch, each request with its own salt (flattened side by side).
	got, err := f.m.LookupBatch(ctx, ns, []Request{
		{Tokens: tokens, Salt: salt}, Tokens(tokens), {Tokens: tokens, Salt: other},
		{Tokens: plain}, {Tokens: plain, Salt: salt}, {Tokens: tokens[:40], Salt: salt},
	})
	if err != nil || len(got) != 6 {
		t.Fatalf("LookupBatch = %v, %v", got, err)
	}
	for i, want := range []uint64{positions, 0, 0, positions, 0, 32} {
		if got[i].Status != StatusOK || got[i].CachedTokens != want {
			t.Fatalf("LookupBatch request %d: %+v, want %d tokens", i, got[i], want)
		}
	}

	// Block hashes are salted the same way.
	hashes := make([]byte, 3*16)
	for i := range hashes {
		hashes[i] = byte(i*13 + 1)
	}
	hreq := Request{BlockHashes: hashes, HashBytes: 16, BlockTokens: chunk, Salt: salt}
	if res, err := f.m.Store(bg, ns, hreq, Float32s(kv)); err != nil || res.Tokens != positions {
		t.Fatalf("salted Store by hashes = %+v, %v", res, err)
	}
	for _, c := range []struct {
		salt []byte
		want uint64
	}{{salt, positions}, {nil, 0}, {other, 0}} {
		hreq.Salt = c.salt
		if got, err := f.m.Lookup(bg, ns, hreq); err != nil || got.CachedTokens != c.want {
			t.Fatalf("Lookup by hashes with salt %q = %+v, %v, want %d tokens", c.salt, got, err, c.want)
		}
	}
}

// An asynchronous save and load carry the salt: the salted save is loaded
// back bit for bit with the salt, and is a miss for another salt and for
// none. The salt slice may be reused as soon as the op started.
func TestSaltAsync(t *testing.T) {
	f := newFixture(t, nil)
	tokens, kv := testTokens(positions), canonical(positions, 11)
	salt := []byte("tenant-7/user-42")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	src := newBuf(t, len(kv)*4)
	copy(src.Bytes(), Float32s(kv))
	scratch := append([]byte(nil), salt...)
	save, err := f.m.SaveAsync(ns, Request{Tokens: tokens, Salt: scratch}, src)
	if err != nil {
		t.Fatal(err)
	}
	defer save.Close()
	copy(scratch, bytes.Repeat([]byte{'X'}, len(scratch))) // the op copied the request
	for l := 0; l < layers; l++ {
		if err := save.LayerReady(l); err != nil {
			t.Fatalf("LayerReady(%d): %v", l, err)
		}
	}
	if err := save.Wait(ctx); err != nil {
		t.Fatalf("save Wait: %v", err)
	}
	if res, err := save.Result(); err != nil || res.State != OpDone || res.Tokens != positions {
		t.Fatalf("salted save Result = %+v, %v", res, err)
	}
	if n := saltLookup(t, f, tokens, nil); n != 0 {
		t.Fatalf("unsalted Lookup of the salted save: %d tokens, want 0", n)
	}

	load := func(s []byte) (KVResult, []byte) {
		t.Helper()
		dst := newBuf(t, len(kv)*4)
		req := Request{Tokens: tokens, Salt: append([]byte(nil), s...)}
		op, err := f.m.LoadAsync(ns, req, dst)
		if err != nil {
			t.Fatalf("LoadAsync with salt %q: %v", s, err)
		}
		defer op.Close()
		for i := range req.Salt {
			req.Salt[i] = 0 // the op copied the request
		}
		if err := op.Wait(ctx); err != nil {
			t.Fatalf("load Wait with salt %q: %v", s, err)
		}
		res, err := op.Result()
		if err != nil {
			t.Fatalf("load Result with salt %q: %v", s, err)
		}
		return res, dst.Bytes()
	}
	res, got := load(salt)
	if res.State != OpDone || res.Tokens != positions || res.Covered != positions || res.NumFailed != 0 {
		t.Fatalf("LoadAsync with the salt: %+v", res)
	}
	if !bytes.Equal(got, Float32s(kv)) {
		t.Fatal("the KV loaded with the salt differs from the KV saved")
	}
	for _, s := range [][]byte{[]byte("tenant-7/user-43"), nil} {
		if res, _ := load(s); res.State != OpDone || res.Tokens != 0 || res.Covered != 0 {
			t.Fatalf("LoadAsync with salt %q: %+v, want a load of 0 tokens", s, res)
		}
	}
}

// Store and RetrieveDevice on the emulated device carry the salt too.
func TestSaltDeviceEmulated(t *testing.T) {
	f := emulatedFixture(t, "raw")
	tokens, kv := testTokens(positions), canonical(positions, 13)
	salt := []byte{0, 1, 2, 3, 0xff}
	src := newBuf(t, len(kv)*4)
	copy(src.Bytes(), Float32s(kv))
	if res, err := f.m.StoreDevice(bg, ns, Request{Tokens: tokens, Salt: salt}, src.EmulatedDevice()); err != nil ||
		res.Tokens != positions {
		t.Fatalf("salted StoreDevice = %+v, %v", res, err)
	}
	dst := newBuf(t, len(kv)*4)
	res, err := f.m.RetrieveDevice(bg, ns, Request{Tokens: tokens, Salt: salt}, dst.EmulatedDevice())
	if err != nil || res.Tokens != positions || !bytes.Equal(dst.Bytes(), Float32s(kv)) {
		t.Fatalf("RetrieveDevice with the salt = %+v, %v (or the KV differs)", res, err)
	}
	if res, err := f.m.RetrieveDevice(bg, ns, Tokens(tokens), dst.EmulatedDevice()); err != nil || res.Tokens != 0 {
		t.Fatalf("unsalted RetrieveDevice of salted KV = %+v, %v, want a miss", res, err)
	}
}

// A salt of MaxSaltBytes is taken; one byte more is ErrInvalidArgument from
// every call (in a batch, that request's own status), before anything is
// stored or written.
func TestSaltTooLong(t *testing.T) {
	f := newFixture(t, nil)
	tokens, kv := testTokens(positions), canonical(positions, 17)
	longest := bytes.Repeat([]byte{0xa5}, MaxSaltBytes)
	if res, err := f.m.Store(bg, ns, Request{Tokens: tokens, Salt: longest}, Float32s(kv)); err != nil ||
		res.Tokens != positions {
		t.Fatalf("Store with a salt of MaxSaltBytes = %+v, %v", res, err)
	}
	if n := saltLookup(t, f, tokens, longest); n != positions {
		t.Fatalf("Lookup with a salt of MaxSaltBytes: %d tokens, want %d", n, positions)
	}

	tooLong := Request{Tokens: tokens, Salt: append(longest, 0xa5)}
	_, err := f.m.Store(bg, ns, tooLong, Float32s(kv))
	wantStatus(t, "Store with a salt over MaxSaltBytes", err, ErrInvalidArgument)
	out := make([]float32, len(kv))
	_, err = f.m.Retrieve(bg, ns, tooLong, Float32s(out))
	wantStatus(t, "Retrieve with a salt over MaxSaltBytes", err, ErrInvalidArgument)
	if !bytes.Equal(Float32s(out), make([]byte, len(kv)*4)) {
		t.Fatal("a refused Retrieve wrote the memory")
	}
	_, err = f.m.Lookup(bg, ns, tooLong)
	wantStatus(t, "Lookup with a salt over MaxSaltBytes", err, ErrInvalidArgument)
	buf := newBuf(t, len(kv)*4)
	for name, start := range map[string]func(string, Request, *HostBuffer, ...KVView) (*Op, error){
		"LoadAsync": f.m.LoadAsync, "SaveAsync": f.m.SaveAsync,
	} {
		op, err := start(ns, tooLong, buf)
		wantStatus(t, name+" with a salt over MaxSaltBytes", err, ErrInvalidArgument)
		if op != nil {
			t.Fatalf("a refused %s gave an op", name)
		}
	}
	if n := bufUsers(buf); n != 1 {
		t.Fatalf("refused ops left the buffer with %d users", n)
	}

	// In a batch, kdn itself refuses that request alone.
	got, err := f.m.LookupBatch(bg, ns, []Request{{Tokens: tokens, Salt: longest}, tooLong, Tokens(tokens)})
	if err != nil || len(got) != 3 {
		t.Fatalf("LookupBatch = %v, %v", got, err)
	}
	if got[0].Status != StatusOK || got[0].CachedTokens != positions || got[2].Status != StatusOK ||
		got[2].CachedTokens != 0 {
		t.Fatalf("LookupBatch's good requests: %+v, %+v", got[0], got[2])
	}
	wantStatus(t, "LookupBatch's request with a salt over MaxSaltBytes", got[1].Err(), ErrInvalidArgument)

	if s, _ := f.rt.Stats(); s.Stores != 1 {
		t.Fatalf("Stats.Stores = %d, want only the store with a salt of MaxSaltBytes", s.Stores)
	}
}

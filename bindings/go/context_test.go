// SPDX-License-Identifier: Apache-2.0
package kdn

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// An ended context stops every call before it reaches kdn: nothing is
// stored, written or counted.
func TestContextEndedBeforeCall(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := Float32s(canonical(positions, 1))
	cancelled, cancel := context.WithCancel(bg)
	cancel()
	expired, cancel2 := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancel2()
	stats := func() Stats {
		t.Helper()
		s, err := f.rt.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		before := stats()
		if res, err := f.m.Store(c.ctx, ns, Tokens(tokens), kv); !errors.Is(err, c.want) || res != (KVResult{}) {
			t.Fatalf("Store with an ended context = %+v, %v, want %v", res, err, c.want)
		}
		if err := f.m.KnowledgePut(c.ctx, ns, "doc", 1, "", tokens, kv); !errors.Is(err, c.want) {
			t.Fatalf("KnowledgePut with an ended context = %v, want %v", err, c.want)
		}
		if after := stats(); after.Stores != before.Stores || after.TokensStored != before.TokensStored {
			t.Fatalf("an ended context still stored: %+v -> %+v", before, after)
		}
		if docs, err := f.m.KnowledgeList(ns); err != nil || len(docs) != 0 {
			t.Fatalf("an ended context still put a document: %v, %v", docs, err)
		}
		if got, err := f.m.Lookup(bg, ns, Tokens(tokens)); err != nil || got.CachedTokens != 0 {
			t.Fatalf("after a Store with an ended context: %+v, %v", got, err)
		}
	}

	// Now with something cached, the reads.
	if res, err := f.m.Store(bg, ns, Tokens(tokens), kv); err != nil || res.Tokens != positions {
		t.Fatalf("Store = %+v, %v", res, err)
	}
	if err := f.m.KnowledgePut(bg, ns, "doc", 1, "", tokens, kv); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		before := stats()
		out := make([]byte, len(kv))
		for i := range out {
			out[i] = 0xAB
		}
		untouched := func(what string) {
			t.Helper()
			for i, b := range out {
				if b != 0xAB {
					t.Fatalf("%s with an ended context wrote byte %d", what, i)
				}
			}
		}
		if res, err := f.m.Retrieve(c.ctx, ns, Tokens(tokens), out); !errors.Is(err, c.want) || res != (KVResult{}) {
			t.Fatalf("Retrieve with an ended context = %+v, %v, want %v", res, err, c.want)
		}
		untouched("Retrieve")
		docTokens := make([]int32, positions)
		if res, err := f.m.KnowledgeFetch(c.ctx, ns, "doc", docTokens, out); !errors.Is(err, c.want) || res != (KVResult{}) {
			t.Fatalf("KnowledgeFetch with an ended context = %+v, %v, want %v", res, err, c.want)
		}
		untouched("KnowledgeFetch")
		for _, id := range docTokens {
			if id != 0 {
				t.Fatal("KnowledgeFetch with an ended context wrote the tokens")
			}
		}
		if got, err := f.m.Lookup(c.ctx, ns, Tokens(tokens)); !errors.Is(err, c.want) || got.CachedTokens != 0 {
			t.Fatalf("Lookup with an ended context = %+v, %v, want %v", got, err, c.want)
		}
		if got, err := f.m.LookupBatch(c.ctx, ns, []Request{Tokens(tokens)}); !errors.Is(err, c.want) || got != nil {
			t.Fatalf("LookupBatch with an ended context = %+v, %v, want %v", got, err, c.want)
		}
		if after := stats(); after.Retrieves != before.Retrieves || after.Lookups != before.Lookups ||
			after.TokensServed != before.TokensServed || after.LookupTokens != before.LookupTokens {
			t.Fatalf("an ended context still reached kdn: %+v -> %+v", before, after)
		}
	}

	// A nil context is the caller's mistake, refused rather than a panic.
	var none context.Context
	_, err := f.m.Store(none, ns, Tokens(tokens), kv)
	wantStatus(t, "Store(nil ctx)", err, ErrInvalidArgument)
	_, err = f.m.Retrieve(none, ns, Tokens(tokens), kv)
	wantStatus(t, "Retrieve(nil ctx)", err, ErrInvalidArgument)
	_, err = f.m.Lookup(none, ns, Tokens(tokens))
	wantStatus(t, "Lookup(nil ctx)", err, ErrInvalidArgument)
	_, err = f.m.LookupBatch(none, ns, []Request{Tokens(tokens)})
	wantStatus(t, "LookupBatch(nil ctx)", err, ErrInvalidArgument)
	wantStatus(t, "KnowledgePut(nil ctx)", f.m.KnowledgePut(none, ns, "doc2", 1, "", tokens, kv), ErrInvalidArgument)
	_, err = f.m.KnowledgeFetch(none, ns, "doc", nil, nil)
	wantStatus(t, "KnowledgeFetch(nil ctx)", err, ErrInvalidArgument)
	buf, _ := NewHostBuffer(len(kv))
	defer buf.Close()
	op, err := f.m.LoadAsync(ns, Tokens(tokens), buf)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	wantStatus(t, "Op.Wait(nil ctx)", op.Wait(none), ErrInvalidArgument)
}

// Contexts that can end but have not: the calls work as with Background
// (the lookups then run on a goroutine of their own, over copies).
func TestContextLiveCalls(t *testing.T) {
	f := newFixture(t, nil)
	tokens := testTokens(positions)
	kv := Float32s(canonical(positions, 2))
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	if res, err := f.m.Store(ctx, ns, Tokens(tokens), kv); err != nil || res.Tokens != positions {
		t.Fatalf("Store = %+v, %v", res, err)
	}
	got, err := f.m.Lookup(ctx, ns, Tokens(tokens[:40]))
	if err != nil || got.CachedTokens != 32 || len(got.TierTokens) != 1 || got.TierTokens[0] != 32 {
		t.Fatalf("Lookup = %+v, %v", got, err)
	}
	batch, err := f.m.LookupBatch(ctx, ns, []Request{Tokens(tokens), {Tokens: []int32{-1}}, Tokens(tokens[:20])})
	if err != nil || len(batch) != 3 || batch[0].CachedTokens != positions || batch[2].CachedTokens != chunk ||
		!errors.Is(batch[1].Err(), ErrInvalidArgument) {
		t.Fatalf("LookupBatch = %+v, %v", batch, err)
	}
	// A bad request alone is an error of Lookup, also from its goroutine.
	_, err = f.m.Lookup(ctx, ns, Request{Tokens: []int32{-1}})
	wantStatus(t, "Lookup of a negative token", err, ErrInvalidArgument)
	out := make([]byte, len(kv))
	if res, err := f.m.Retrieve(ctx, ns, Tokens(tokens), out); err != nil || res.Tokens != positions {
		t.Fatalf("Retrieve = %+v, %v", res, err)
	}
	if string(out) != string(kv) {
		t.Fatal("the retrieved KV differs from the stored KV")
	}
	if err := f.m.KnowledgePut(ctx, ns, "doc", 1, "meta", tokens, kv); err != nil {
		t.Fatal(err)
	}
	docTokens := make([]int32, positions)
	if res, err := f.m.KnowledgeFetch(ctx, ns, "doc", docTokens, out); err != nil || res.Tokens != positions {
		t.Fatalf("KnowledgeFetch = %+v, %v", res, err)
	}
	f.m.Close()
	if _, err := f.m.Lookup(ctx, ns, Tokens(tokens)); err != ErrClosed {
		t.Fatalf("Lookup on a closed model = %v", err)
	}
	if _, err := f.m.LookupBatch(ctx, ns, []Request{Tokens(tokens)}); err != ErrClosed {
		t.Fatalf("LookupBatch on a closed model = %v", err)
	}
}

// silentNode is a kdnd that is not: it accepts connections and never
// answers, so a remote tier's call to it waits out the tier's Timeout.
func silentNode(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read or written
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// silentRuntime is a host tier over a remote tier at a silent node: a miss
// in the host tier asks the node, which keeps the caller waiting timeout.
func silentRuntime(t *testing.T, timeout time.Duration) (*Runtime, *Model) {
	t.Helper()
	remote := RemoteTier(silentNode(t), "token")
	remote.Timeout = timeout
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(16 << 20), remote}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := rt.NewModel(testSpec())
	if err != nil {
		rt.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); rt.Close() })
	return rt, m
}

func remoteTimeouts(t *testing.T, rt *Runtime) uint64 {
	t.Helper()
	s, err := rt.TierStats(1)
	if err != nil {
		t.Fatal(err)
	}
	return s.RemoteTimeouts
}

// A deadline that passes while a lookup waits on a remote tier returns at
// once; kdn's call, which cannot be interrupted, ends later, unobserved.
func TestContextDeadlineDuringLookup(t *testing.T) {
	const timeout = 3 * time.Second
	for _, batch := range []bool{false, true} {
		rt, m := silentRuntime(t, timeout)
		ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
		start := time.Now()
		var err error
		if batch {
			var got []LookupResult
			got, err = m.LookupBatch(ctx, ns, []Request{Tokens(testTokens(positions))})
			if got != nil {
				t.Fatalf("LookupBatch past its deadline gave results: %+v", got)
			}
		} else {
			var got LookupResult
			got, err = m.Lookup(ctx, ns, Tokens(testTokens(positions)))
			if got.CachedTokens != 0 || got.TierTokens != nil {
				t.Fatalf("Lookup past its deadline gave a result: %+v", got)
			}
		}
		elapsed := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("batch %v: a lookup whose deadline passed while a remote tier was silent = %v", batch, err)
		}
		if elapsed > timeout/2 {
			t.Fatalf("batch %v: the lookup returned %v after its 100ms deadline (the tier's timeout is %v)",
				batch, elapsed, timeout)
		}
		// The test is about a blocked call: kdn was still waiting on the node
		// when the lookup returned, and gives up only at the tier's Timeout.
		if n := remoteTimeouts(t, rt); n != 0 {
			t.Fatalf("batch %v: the remote tier had timed out already (%d) when the lookup returned", batch, n)
		}
		for remoteTimeouts(t, rt) == 0 {
			if time.Since(start) > timeout+10*time.Second {
				t.Fatalf("batch %v: the remote tier never timed out: the lookup did not wait on it", batch)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if waited := time.Since(start); waited < timeout-500*time.Millisecond {
			t.Fatalf("batch %v: kdn's call ended after %v, before the tier's timeout %v", batch, waited, timeout)
		}
	}
}

// A retrieve cannot be given up once kdn writes the caller's memory: a
// deadline that passes while it waits on a remote tier is not honoured
// until the call ends (at the tier's Timeout), and the result is returned.
func TestContextDeadlineDuringRetrieve(t *testing.T) {
	const timeout = time.Second
	rt, m := silentRuntime(t, timeout)
	ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer cancel()
	out := make([]byte, positions*int(m.KVBytesPerToken()))
	start := time.Now()
	res, err := m.Retrieve(ctx, ns, Tokens(testTokens(positions)), out)
	elapsed := time.Since(start)
	if err != nil || res.Tokens != 0 || res.State != OpDone {
		t.Fatalf("a retrieve from a silent remote tier = %+v, %v (a miss, not an error)", res, err)
	}
	if ctx.Err() == nil || elapsed < timeout-200*time.Millisecond {
		t.Fatalf("the retrieve returned after %v: it was not blocked past its deadline", elapsed)
	}
	if n := remoteTimeouts(t, rt); n == 0 {
		t.Fatal("the remote tier did not time out: the retrieve did not wait on it")
	}
}

// SPDX-License-Identifier: Apache-2.0
package kdn

// The options and statistics of ABI 1.5 to 1.8 (device views: device_test.go):
// the cost-aware eviction policy, quality levels, TTFT targets, loads that
// leave slow chunks to recompute, and the deployment's secret.

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A cost-aware host tier (1.5) keeps a request's first chunks and evicts
// its later ones (where LRU evicts the oldest, the first); everything is
// still served byte for byte, from the disk below.
func TestEvictCost(t *testing.T) {
	a, b := testTokens(positions), testTokens(positions + 1)[1:]
	for _, c := range []struct {
		policy   EvictionPolicy
		hostHasA uint64 // the leading tokens of A the host tier keeps
	}{{EvictLRU, 0}, {EvictCost, chunk}} {
		host := HostTier(4 * chunk * uint64(layers*2*row*4)) // room for 4 of the 6 chunks
		host.HighWatermark, host.LowWatermark = 1, 1
		host.Policy = c.policy
		f := newFixture(t, &RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{host, DiskTier(t.TempDir(), 16<<20)}})
		f.store(t, a, canonical(positions, 1))
		f.store(t, b, canonical(positions, 2))
		if s, err := f.rt.Stats(); err != nil || s.Evictions != 2 {
			t.Fatalf("policy %d: Stats = %+v, %v", c.policy, s, err)
		}
		got, err := f.m.Lookup(bg, ns, Tokens(a))
		if err != nil || got.CachedTokens != positions || got.TierTokens[0] != c.hostHasA {
			t.Fatalf("policy %d: Lookup of the first request = %+v, %v (want %d tokens in the host tier)", c.policy,
				got, err, c.hostHasA)
		}
		for i, req := range [][]int32{a, b} {
			out := make([]float32, layers*2*positions*row)
			res, err := f.m.Retrieve(bg, ns, Tokens(req), Float32s(out))
			want := canonical(positions, float32(i+1))
			if err != nil || res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(want)) {
				t.Fatalf("policy %d: Retrieve %d = %+v, %v", c.policy, i, res, err)
			}
		}
	}
}

// Quality levels (1.6): remote and redis tiers only, without a codec, each
// a codec; the Go side refuses a level that would split in two.
func TestTierLevels(t *testing.T) {
	remote := RemoteTier(silentNode(t), "token")
	remote.Timeout = 200 * time.Millisecond
	remote.Levels = []string{"zstd", "kdn:hifi", "kdn:balanced"}
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(1 << 20), remote}})
	if err != nil {
		t.Fatalf("a remote tier with three levels: %v", err)
	}
	ts, err := rt.TierStats(1)
	rt.Close()
	if err != nil || ts.Kind != TierRemote {
		t.Fatalf("TierStats of the leveled tier = %+v, %v", ts, err)
	}
	bad := map[string]func(*TierConfig){
		"levels on a host tier":    func(c *TierConfig) { *c = HostTier(1 << 20); c.Levels = remote.Levels },
		"levels and a codec":       func(c *TierConfig) { c.Codec = "zstd" },
		"an empty level":           func(c *TierConfig) { c.Levels = []string{"zstd", ""} },
		"two levels in one":        func(c *TierConfig) { c.Levels = []string{"zstd;kdn:hifi", "kdn:balanced"} },
		"a level that is no codec": func(c *TierConfig) { c.Levels = []string{"zstd", "no-such-codec"} },
		"nine levels": func(c *TierConfig) {
			c.Levels = nil
			for len(c.Levels) < 9 {
				c.Levels = append(c.Levels, "zstd")
			}
		},
	}
	for name, change := range bad {
		c := remote
		change(&c)
		rt, err := NewRuntime(&RuntimeOptions{Tiers: []TierConfig{HostTier(1 << 20), c}})
		wantStatus(t, name, err, ErrInvalidArgument)
		if rt != nil {
			t.Fatalf("%s: a runtime", name)
		}
	}
}

// A TTFT target (1.6) reaches kdn: a target without levels loads as usual;
// one over an hour is refused by kdn as a unit mistake, a negative one here.
func TestTTFTTarget(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want uint64
	}{{0, 0}, {1, 1}, {time.Microsecond, 1}, {time.Microsecond + 1, 2}, {time.Hour, 3600e6}, {-1, math.MaxUint64}} {
		if got := targetMicros(c.d); got != c.want {
			t.Fatalf("targetMicros(%v) = %d, want %d", c.d, got, c.want)
		}
	}
	f := newFixture(t, nil)
	tokens, kv := testTokens(positions), canonical(positions, 4)
	f.store(t, tokens, kv)
	req := Request{Tokens: tokens, TTFTTarget: 50 * time.Millisecond}
	out := make([]float32, len(kv))
	if res, err := f.m.Retrieve(bg, ns, req, Float32s(out)); err != nil || res.Tokens != positions ||
		!bytes.Equal(Float32s(out), Float32s(kv)) {
		t.Fatalf("Retrieve with a target = %+v, %v", res, err)
	}
	buf := newBuf(t, len(kv)*4)
	for _, d := range []time.Duration{time.Hour + time.Microsecond, -time.Millisecond} {
		req.TTFTTarget = d
		_, err := f.m.Retrieve(bg, ns, req, Float32s(out))
		wantStatus(t, "Retrieve with a target of "+d.String(), err, ErrInvalidArgument)
		op, err := f.m.LoadAsync(ns, req, buf)
		wantStatus(t, "LoadAsync with a target of "+d.String(), err, ErrInvalidArgument)
		if op != nil {
			t.Fatal("a refused load gave an op")
		}
		_, err = f.m.Lookup(bg, ns, req)
		wantStatus(t, "Lookup with a target of "+d.String(), err, ErrInvalidArgument)
		// In a batch, the request fails alone.
		got, err := f.m.LookupBatch(bg, ns, []Request{req, Tokens(tokens)})
		if err != nil || len(got) != 2 || got[0].Status != StatusInvalidArgument || got[1].CachedTokens != positions {
			t.Fatalf("LookupBatch with a target of %v = %+v, %v", d, got, err)
		}
	}
	if n := bufUsers(buf); n != 1 {
		t.Fatalf("refused loads left the buffer with %d users", n)
	}
}

// Never slower than prefill (1.7): a load measures its tier's delivery;
// once the engine reports a prefill 100x faster than that, a load leaves
// the disk's chunks to recompute (nothing written), counted in
// Stats.RecomputeTokens and TierStats.RecomputeChunks; with
// LoadSlowerThanPrefill it loads them whatever the rates.
func TestLoadSlowerThanPrefill(t *testing.T) {
	dir := t.TempDir()
	tokens, kv := testTokens(positions), canonical(positions, 6)
	open := func(loadSlower bool) fixture {
		disk := DiskTier(dir, 16<<20)
		disk.Codec = "zstd"
		rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{disk},
			LoadSlowerThanPrefill: loadSlower})
		if err != nil {
			t.Fatal(err)
		}
		m, err := rt.NewModel(testSpec())
		if err != nil {
			t.Fatal(err)
		}
		return fixture{rt, m}
	}
	f := open(false)
	f.store(t, tokens, kv)
	out := make([]float32, len(kv))
	if res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out)); err != nil || res.Tokens != positions {
		t.Fatalf("the first Retrieve (no report yet) = %+v, %v", res, err)
	}
	ts, err := f.rt.TierStats(0)
	if err != nil || ts.DeliveryNsPerToken <= 0 || ts.DeviceDeliveryNsPerToken != 0 || ts.RecomputeChunks != 0 {
		t.Fatalf("TierStats after a load = %+v, %v", ts, err)
	}
	// 1e6 tokens prefilled in this: 100x faster per token than the disk delivers.
	elapsed := time.Duration((ts.DeliveryNsPerToken/100 + 1) * 1e6)
	if err := f.m.ReportPrefill(1000000, elapsed); err != nil {
		t.Fatal(err)
	}
	out = make([]float32, len(kv))
	res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out))
	if err != nil || res.State != OpDone || res.Tokens != 0 || res.Covered != positions {
		t.Fatalf("Retrieve from a tier slower than prefill = %+v, %v", res, err)
	}
	if !bytes.Equal(Float32s(out), make([]byte, len(kv)*4)) {
		t.Fatal("a load left to recompute wrote KV")
	}
	// A load op says so in its failed ranges.
	buf := newBuf(t, len(kv)*4)
	op, err := f.m.LoadAsync(ns, Tokens(tokens), buf)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	if err := op.Wait(bg); err != nil {
		t.Fatal(err)
	}
	if res, err := op.Result(); err != nil || res.Tokens != 0 || res.Covered != positions || res.NumFailed != 1 {
		t.Fatalf("a load op from a tier slower than prefill = %+v, %v", res, err)
	}
	if r, err := op.FailedRanges(); err != nil || len(r) != 1 || r[0] != (TokenRange{0, positions}) {
		t.Fatalf("FailedRanges = %v, %v", r, err)
	}
	if s, _ := f.rt.Stats(); s.RecomputeTokens != 2*positions {
		t.Fatalf("Stats.RecomputeTokens = %d, want %d", s.RecomputeTokens, 2*positions)
	}
	if ts, _ := f.rt.TierStats(0); ts.RecomputeChunks != 2*positions/chunk {
		t.Fatalf("TierStats.RecomputeChunks = %d, want %d", ts.RecomputeChunks, 2*positions/chunk)
	}
	op.Close()
	f.m.Close()
	f.rt.Close()

	// The same directory, loading whatever the rates say.
	f = open(true)
	defer func() { f.m.Close(); f.rt.Close() }()
	if err := f.m.ReportPrefill(1000000, time.Millisecond); err != nil { // 1 ns per token
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		out = make([]float32, len(kv))
		res, err := f.m.Retrieve(bg, ns, Tokens(tokens), Float32s(out))
		if err != nil || res.Tokens != positions || !bytes.Equal(Float32s(out), Float32s(kv)) {
			t.Fatalf("Retrieve %d with LoadSlowerThanPrefill = %+v, %v", i, res, err)
		}
	}
	if s, _ := f.rt.Stats(); s.RecomputeTokens != 0 {
		t.Fatalf("Stats.RecomputeTokens = %d with LoadSlowerThanPrefill", s.RecomputeTokens)
	}
}

// The deployment's secret (1.8): files too short, open to others or missing
// are refused; runtimes with the same secret share a disk tier's chunks,
// one with another secret gets misses, counted in TierStats.AuthFailures.
func TestSecretFile(t *testing.T) {
	secrets := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(secrets, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		return path
	}
	ours := write("ours", "secret-of-this-deployment-32-bytes-at-least", 0o600)
	theirs := write("theirs", "secret-of-another-deployment-32-bytes-at-least", 0o600)
	for name, path := range map[string]string{
		"too short":      write("short", "too short", 0o600),
		"open to others": write("open", "secret-of-this-deployment-32-bytes-at-least", 0o644),
		"missing":        filepath.Join(secrets, "missing"),
	} {
		rt, err := NewRuntime(&RuntimeOptions{SecretFile: path})
		wantStatus(t, "a secret file "+name, err, ErrInvalidArgument)
		if rt != nil {
			t.Fatalf("a secret file %s: a runtime", name)
		}
	}

	dir := t.TempDir()
	tokens, kv := testTokens(positions), canonical(positions, 8)
	// run opens a runtime over the disk with the secret, stores or
	// retrieves, and returns the tokens and the disk's auth failures.
	run := func(secret string, store bool) (uint64, uint64) {
		rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, SecretFile: secret,
			Tiers: []TierConfig{DiskTier(dir, 16<<20)}})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Close()
		m, err := rt.NewModel(testSpec())
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		var res KVResult
		if store {
			res, err = m.Store(bg, ns, Tokens(tokens), Float32s(kv))
		} else {
			out := make([]float32, len(kv))
			res, err = m.Retrieve(context.Background(), ns, Tokens(tokens), Float32s(out))
			if err == nil && res.Tokens == positions && !bytes.Equal(Float32s(out), Float32s(kv)) {
				t.Fatal("the KV read with the secret differs")
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		ts, err := rt.TierStats(0)
		if err != nil {
			t.Fatal(err)
		}
		return res.Tokens, ts.AuthFailures
	}
	if n, _ := run(ours, true); n != positions {
		t.Fatalf("Store with the secret: %d tokens", n)
	}
	if n, failures := run(ours, false); n != positions || failures != 0 {
		t.Fatalf("Retrieve with the same secret: %d tokens, %d auth failures", n, failures)
	}
	if n, failures := run(theirs, false); n != 0 || failures == 0 {
		t.Fatalf("Retrieve with another secret: %d tokens, %d auth failures", n, failures)
	}
}

// SPDX-License-Identifier: Apache-2.0
package kdn

// Namespace quotas in a tier (1.13, TierConfig.Quotas): a namespace over
// its quota evicts only its own coldest chunks; Runtime.QuotaStats reports
// each quota's use; bad quota configs are refused.

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// chunkHeld is what one chunk of the test model takes of a host tier:
// its bytes in whole 4 KiB pages.
const chunkHeld = (chunk*layers*2*row*4 + 4095) / 4096 * 4096

// quotaOptions is one host tier of room for 20 chunks (no watermarks)
// holding quotas.
func quotaOptions(quotas ...Quota) *RuntimeOptions {
	tier := HostTier(20 * chunkHeld)
	tier.HighWatermark, tier.LowWatermark = 1, 1
	tier.Quotas = quotas
	return &RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{tier}}
}

// namespaceHash is kdn's hash of a namespace (core/keys, NamespaceHash):
// SHA-256 of a tag and the namespace, each after its length (u64, little
// endian).
func namespaceHash(ns string) [32]byte {
	h := sha256.New()
	for _, s := range []string{"kdn-namespace-v1", ns} {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d
}

// quotaPrompt is the i-th of distinct one-chunk prompts.
func quotaPrompt(i int) []int32 {
	tokens := testTokens(chunk)
	tokens[1] = int32(1000 + i)
	return tokens
}

// Ten one-chunk prompts in each of two tenants, one with a quota of 4
// chunks: it keeps its 4 newest, the other keeps all of its own; the
// stats count the 6 evictions as the quota's, none for the tier's room.
func TestQuotaEvictsOnlyItsOwnChunks(t *testing.T) {
	if chunkHeld != 20480 {
		t.Fatalf("a chunk holds %d bytes, want 20480 (5 pages of 16 tokens' 1280 bytes)", chunkHeld)
	}
	f := newFixture(t, quotaOptions(Quota{Namespace: "tenant-a", Bytes: 4 * chunkHeld}))
	kv := Float32s(canonical(chunk, 1))
	for i := 0; i < 10; i++ {
		for _, tenant := range []string{"tenant-a", "tenant-b"} {
			if res, err := f.m.Store(bg, tenant, Tokens(quotaPrompt(i)), kv); err != nil || res.Tokens != chunk {
				t.Fatalf("Store of prompt %d in %s = %+v, %v", i, tenant, res, err)
			}
		}
	}
	for i := 0; i < 10; i++ {
		want := map[string]uint64{"tenant-a": 0, "tenant-b": chunk}
		if i >= 6 {
			want["tenant-a"] = chunk
		}
		for tenant, w := range want {
			got, err := f.m.Lookup(bg, tenant, Tokens(quotaPrompt(i)))
			if err != nil || got.CachedTokens != w {
				t.Errorf("Lookup of prompt %d in %s = %+v, %v; want %d tokens", i, tenant, got, err, w)
			}
		}
	}

	qs, err := f.rt.QuotaStats(0)
	if err != nil || len(qs) != 1 {
		t.Fatalf("QuotaStats(0) = %+v, %v; want one quota", qs, err)
	}
	want := QuotaStats{Namespace: "tenant-a", NamespaceHash: namespaceHash("tenant-a"),
		QuotaBytes: 4 * chunkHeld, UsedBytes: 4 * chunkHeld, Objects: 4, QuotaEvictions: 6}
	if qs[0] != want {
		t.Fatalf("QuotaStats(0)[0] = %+v\nwant %+v", qs[0], want)
	}
	if ts, err := f.rt.TierStats(0); err != nil || ts.Objects != 14 || ts.Evictions != 6 {
		t.Fatalf("TierStats(0) = %+v, %v; want 14 objects (4 of a's, 10 of b's), 6 evictions", ts, err)
	}
	if _, err := f.rt.QuotaStats(1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("QuotaStats of a tier that is not there: %v, want ErrInvalidArgument", err)
	}
	if _, err := f.rt.QuotaStats(-1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("QuotaStats(-1): %v, want ErrInvalidArgument", err)
	}
}

// Quotas in the lower of two tiers: the stats of each tier are its own,
// named by the namespaces in the order given; a closed runtime has none.
func TestQuotaStatsPerTier(t *testing.T) {
	lower := HostTier(20 * chunkHeld)
	lower.Quotas = []Quota{{Namespace: "z", Bytes: 3 * chunkHeld}, {Namespace: "a", Bytes: chunkHeld}}
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{HostTier(20 * chunkHeld), lower}})
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	if qs, err := rt.QuotaStats(0); err != nil || len(qs) != 0 || qs == nil {
		t.Fatalf("QuotaStats of a tier without quotas = %#v, %v; want an empty slice", qs, err)
	}
	qs, err := rt.QuotaStats(1)
	if err != nil || len(qs) != 2 {
		t.Fatalf("QuotaStats(1) = %+v, %v; want two quotas", qs, err)
	}
	for i, w := range lower.Quotas {
		if qs[i].Namespace != w.Namespace || qs[i].NamespaceHash != namespaceHash(w.Namespace) ||
			qs[i].QuotaBytes != w.Bytes || qs[i].UsedBytes != 0 || qs[i].Objects != 0 {
			t.Errorf("QuotaStats(1)[%d] = %+v, want %+v's, unused", i, qs[i], w)
		}
	}
	rt.Close()
	if _, err := rt.QuotaStats(1); !errors.Is(err, ErrClosed) {
		t.Fatalf("QuotaStats after Close: %v, want ErrClosed", err)
	}
}

// A namespace twice, an empty namespace, quotas on a remote tier: refused
// by NewRuntime with kdn's reason.
func TestQuotaConfigsRefused(t *testing.T) {
	a := Quota{Namespace: "tenant-a", Bytes: 4 * chunkHeld}
	remote := RemoteTier("127.0.0.1:1", "t")
	remote.Quotas = []Quota{a}
	for _, c := range []struct {
		name string
		opts *RuntimeOptions
		why  string
	}{
		{"a namespace twice", quotaOptions(a, a), "two quotas"},
		{"an empty namespace", quotaOptions(a, Quota{Bytes: chunkHeld}), "quotas[1]"},
		{"a remote tier", &RuntimeOptions{ChunkTokens: chunk, Tiers: []TierConfig{remote}}, "kdnd"},
	} {
		rt, err := NewRuntime(c.opts)
		if err == nil {
			rt.Close()
			t.Errorf("%s: NewRuntime succeeded, want ErrInvalidArgument", c.name)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", c.name, err, c.why)
		}
	}
}

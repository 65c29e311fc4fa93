// SPDX-License-Identifier: Apache-2.0
package kdn

import "testing"

// go test -run - -bench . : the per-call cost of the binding's hot paths.
func benchModel(b *testing.B) (*Model, Request, []byte) {
	rt, err := NewRuntime(&RuntimeOptions{ChunkTokens: 256, Tiers: []TierConfig{HostTier(256 << 20)}})
	if err != nil {
		b.Fatal(err)
	}
	m, err := rt.NewModel(&ModelSpec{NumLayers: 32, NumKVHeads: 8, HeadDim: 128, DType: BF16, Fingerprint: "bench-8b"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close(); rt.Close() })
	tokens := make([]int32, 256)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	kv := make([]byte, 256*int(m.KVBytesPerToken()))
	if _, err := m.Store(bg, "bench", Tokens(tokens), kv); err != nil {
		b.Fatal(err)
	}
	return m, Tokens(tokens), kv
}

func BenchmarkLookup(b *testing.B) {
	m, req, _ := benchModel(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r, err := m.Lookup(bg, "bench", req); err != nil || r.CachedTokens != 256 {
			b.Fatal(r, err)
		}
	}
}

func BenchmarkRetrieve32MiB(b *testing.B) {
	m, req, kv := benchModel(b)
	b.SetBytes(int64(len(kv)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if r, err := m.Retrieve(bg, "bench", req, kv); err != nil || r.Tokens != 256 {
			b.Fatal(r, err)
		}
	}
}

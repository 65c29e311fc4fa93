// SPDX-License-Identifier: Apache-2.0
// The kdn example in Go: store the reference model's KV of a prompt (as
// `kdn generate --dump-kv PREFIX` wrote it), find it, read it back and check
// every byte, keep it as a knowledge item, move it through device memory on
// the emulated device, print the statistics.
// Run: go run . PREFIX (reads PREFIX.k.f32, PREFIX.v.f32, PREFIX.tokens.i32).
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"os"

	"kdn.dev/kdn"
)

const (
	layers, heads, headDim, positions = 5, 4, 8, 48
	row                               = heads * headDim // one token's K (or V) in one layer
	fileElems                         = layers * positions * row
	ns                                = "example"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) != 2 {
		log.Fatal("usage: example PREFIX")
	}
	read := func(ext string, size int) []byte {
		b, err := os.ReadFile(os.Args[1] + ext)
		check(err)
		expect(len(b) == size, os.Args[1]+ext+" holds the reference KV")
		return b
	}
	k, v, ids := read(".k.f32", 4*fileElems), read(".v.f32", 4*fileElems), read(".tokens.i32", 4*positions)
	tokens := make([]int32, len(ids)/4)
	binary.Read(bytes.NewReader(ids), binary.LittleEndian, tokens)
	fmt.Printf("kdn %s, %d tokens of KV\n", kdn.Version(), len(tokens))
	ctx := context.Background() // the calls that may wait on a remote tier take one

	rt, err := kdn.NewRuntime(&kdn.RuntimeOptions{ChunkTokens: 16, Tiers: []kdn.TierConfig{kdn.HostTier(16 << 20)}})
	check(err)
	defer rt.Close()
	m, err := rt.NewModel(&kdn.ModelSpec{NumLayers: layers, NumKVHeads: heads, HeadDim: headDim,
		DType: kdn.F32, Fingerprint: "stories260K"})
	check(err)
	defer m.Close()

	// Store from the engine's layout: the K file then the V file in one
	// slice, [layer][position][head][dim] each, described by strides.
	engine := append(k, v...)
	view := kdn.KVView{DType: kdn.F32, StrideLayer: positions * row, StrideKV: fileElems,
		StrideToken: row, StrideHead: headDim, StrideDim: 1}
	stored, err := m.Store(ctx, ns, kdn.Tokens(tokens), engine, view)
	check(err)
	fmt.Printf("stored: %d tokens cached\n", stored.Tokens)

	found, err := m.LookupBatch(ctx, ns, []kdn.Request{kdn.Tokens(tokens), kdn.Tokens(tokens[:40])})
	check(err)
	fmt.Printf("lookup: %d of 48 cached, %d of 40 (whole chunks only)\n", found[0].CachedTokens, found[1].CachedTokens)
	expect(found[0].CachedTokens == 48 && found[1].CachedTokens == 32, "lookups of 48 and 32 tokens")

	// Retrieve into the canonical layout [layer][k|v][position][head][dim].
	out := make([]byte, positions*int(m.KVBytesPerToken()))
	got, err := m.Retrieve(ctx, ns, kdn.Tokens(tokens), out)
	check(err)
	expect(got.Tokens == positions, "48 tokens retrieved")
	for l, n := 0, positions*row*4; l < layers; l++ { // layer l's K, then its V
		expect(bytes.Equal(out[2*l*n:][:n], k[l*n:][:n]) && bytes.Equal(out[(2*l+1)*n:][:n], v[l*n:][:n]),
			fmt.Sprintf("layer %d of the retrieved KV equals the files", l))
	}
	fmt.Printf("retrieved: %d tokens, all %d bytes equal to the files\n", got.Tokens, len(out))

	// The same KV as a knowledge item: put, list, fetch.
	check(m.KnowledgePut(ctx, ns, "story", 1, "Once upon a time", tokens, out))
	docs, err := m.KnowledgeList(ns)
	check(err)
	for _, d := range docs {
		fmt.Printf("document %q: version %d, %d tokens, %d chunks\n", d.DocID, d.Version, d.NumTokens, d.Chunks)
	}
	docTokens, docKV := make([]int32, positions), make([]byte, len(out))
	if _, err := m.KnowledgeFetch(ctx, ns, "story", docTokens, docKV); err != nil {
		log.Fatal(err)
	}
	expect(bytes.Equal(docKV, out) && fmt.Sprint(docTokens) == fmt.Sprint(tokens), "the fetched document equals the files")
	fmt.Println("fetched \"story\": tokens and KV equal")

	// KV in a GPU's memory is a kdn.DeviceMemory: an address (never Go
	// memory) and the engine's CUDA stream. Without a GPU, a runtime on the
	// emulated device takes C memory (a HostBuffer's) instead and runs every
	// device path on the CPU: an engine's GPU integration, tested anywhere.
	drt, err := kdn.NewRuntime(&kdn.RuntimeOptions{ChunkTokens: 16, Device: kdn.DeviceEmulated,
		Tiers: []kdn.TierConfig{kdn.DeviceTier(16 << 20)}})
	check(err)
	defer drt.Close()
	spec := m.Spec()
	dm, err := drt.NewModel(&spec)
	check(err)
	defer dm.Close()
	src, err := kdn.NewHostBuffer(len(engine))
	check(err)
	defer src.Close()
	copy(src.Bytes(), engine)
	_, err = dm.StoreDevice(ctx, ns, kdn.Tokens(tokens), src.EmulatedDevice(), view)
	check(err)
	dst, err := kdn.NewHostBuffer(len(out))
	check(err)
	defer dst.Close()
	got, err = dm.RetrieveDevice(ctx, ns, kdn.Tokens(tokens), dst.EmulatedDevice())
	check(err)
	expect(got.Tokens == positions && bytes.Equal(dst.Bytes(), out), "the KV through device memory equals the host path's")
	fmt.Printf("device memory (emulated): %d tokens stored and retrieved, equal to the host path\n", got.Tokens)

	s, _ := rt.Stats()
	fmt.Printf("stats: %d lookups, %d stores, %d retrieves, %d chunk hits, %d chunks held, %d tokens stored\n",
		s.Lookups, s.Stores, s.Retrieves, s.Hits, s.Chunks, s.TokensStored)
	n, _ := rt.TierCount()
	for i := 0; i < n; i++ {
		t, _ := rt.TierStats(i)
		fmt.Printf("tier %d: %s (codec %s): %d objects, %d hits, %d of %d bytes\n",
			i, t.Name, t.Codec, t.Objects, t.Hits, t.UsedBytes, t.CapacityBytes)
	}
	fmt.Println("ok")
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func expect(ok bool, what string) {
	if !ok {
		log.Fatalf("expected: %s", what)
	}
}

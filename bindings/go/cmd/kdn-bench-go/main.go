// SPDX-License-Identifier: Apache-2.0
// Command kdn-bench-go measures the Go binding's retrieve bandwidth and
// lookup latency with the parameters every binding's bench shares (kdn
// bench bindings runs it beside the same calls from C): a Llama-3-8B shape
// (32 layers, 8 KV heads of 128, bf16), one 256-token chunk of 32 MiB in a
// 256 MiB host tier, retrieved into a Go []byte; the 256-token lookup.
//
// It prints one line of JSON: {"retrieve_gbps": x, "lookup_us": y}.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"time"

	"kdn.dev/kdn"
)

const (
	chunkBytes    = 32 << 20
	lookupCalls   = 20000
	lookupBatches = 5
)

func median(v []float64) float64 {
	sort.Float64s(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

func main() {
	repeats := flag.Int("repeats", 10, "timed retrieves (the median is reported)")
	flag.Parse()
	if *repeats < 1 {
		fmt.Fprintln(os.Stderr, "kdn-bench-go: --repeats must be >= 1")
		os.Exit(2)
	}
	log.SetFlags(0)
	log.SetPrefix("kdn-bench-go: ")

	rt, err := kdn.NewRuntime(&kdn.RuntimeOptions{ChunkTokens: 256, Tiers: []kdn.TierConfig{kdn.HostTier(256 << 20)}})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	m, err := rt.NewModel(&kdn.ModelSpec{NumLayers: 32, NumKVHeads: 8, HeadDim: 128, DType: kdn.BF16,
		Fingerprint: "bench-8b"})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	ctx := context.Background() // never ends: the calls take their direct path
	tokens := make([]int32, 256)
	for i := range tokens {
		tokens[i] = int32(i % 32000)
	}
	req := kdn.Tokens(tokens)
	src := make([]uint16, chunkBytes/2)
	for i := range src {
		src[i] = uint16(i*2654435761>>16) | 0x3f00
	}
	if res, err := m.Store(ctx, "bench", req, kdn.Uint16s(src)); err != nil || res.Tokens != 256 {
		log.Fatalf("store: %+v, %v", res, err)
	}

	dst := make([]byte, chunkBytes)
	retrieve := func() float64 {
		start := time.Now()
		res, err := m.Retrieve(ctx, "bench", req, dst)
		secs := time.Since(start).Seconds()
		if err != nil || res.Tokens != 256 {
			log.Fatalf("retrieve: %+v, %v", res, err)
		}
		return secs
	}
	retrieve() // warm-up: faults the destination's pages in
	times := make([]float64, *repeats)
	for i := range times {
		times[i] = retrieve()
	}
	gbps := chunkBytes / median(times) / 1e9

	means := make([]float64, lookupBatches)
	for b := range means {
		start := time.Now()
		for i := 0; i < lookupCalls; i++ {
			if r, err := m.Lookup(ctx, "bench", req); err != nil || r.CachedTokens != 256 {
				log.Fatalf("lookup: %+v, %v", r, err)
			}
		}
		means[b] = time.Since(start).Seconds() / lookupCalls * 1e6
	}
	fmt.Printf("{\"retrieve_gbps\": %.3f, \"lookup_us\": %.4f}\n", gbps, median(means))
}

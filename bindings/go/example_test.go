// SPDX-License-Identifier: Apache-2.0
package kdn_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"kdn.dev/kdn"
)

// Store a prompt's KV, find it, read it back.
func Example() {
	ctx := context.Background() // in a server: the request's context
	rt, err := kdn.NewRuntime(&kdn.RuntimeOptions{ChunkTokens: 16, Tiers: []kdn.TierConfig{kdn.HostTier(16 << 20)}})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	m, err := rt.NewModel(&kdn.ModelSpec{NumLayers: 2, NumKVHeads: 2, HeadDim: 4, DType: kdn.F32, Fingerprint: "tiny"})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	kv := make([]float32, len(prompt)*int(m.KVBytesPerToken())/4) // canonical layout
	for i := range kv {
		kv[i] = float32(i)
	}
	stored, err := m.Store(ctx, "tenant", kdn.Tokens(prompt), kdn.Float32s(kv))
	if err != nil {
		log.Fatal(err)
	}
	found, err := m.Lookup(ctx, "tenant", kdn.Tokens(prompt))
	if err != nil {
		log.Fatal(err)
	}
	out := make([]float32, len(kv))
	got, err := m.Retrieve(ctx, "tenant", kdn.Tokens(prompt), kdn.Float32s(out))
	if err != nil {
		log.Fatal(err)
	}
	miss, _ := m.Retrieve(ctx, "other-tenant", kdn.Tokens(prompt), kdn.Float32s(out))
	fmt.Println("stored", stored.Tokens, "found", found.CachedTokens, "retrieved", got.Tokens, "miss", miss.Tokens)
	// Output: stored 40 found 40 retrieved 40 miss 0
}

// Errors carry kdn's status; compare them with errors.Is.
func ExampleError() {
	ctx := context.Background()
	rt, _ := kdn.NewRuntime(nil)
	defer rt.Close()
	m, _ := rt.NewModel(&kdn.ModelSpec{NumLayers: 1, NumKVHeads: 1, HeadDim: 8, DType: kdn.F32, Fingerprint: "x"})
	defer m.Close()
	_, err := m.KnowledgeFetch(ctx, "tenant", "no-such-doc", make([]int32, 8), nil)
	var e *kdn.Error
	fmt.Println(errors.Is(err, kdn.ErrNotFound), errors.As(err, &e) && e.Status == kdn.StatusNotFound, kdn.IsRetryable(err))
	m.Close()
	_, err = m.Lookup(ctx, "tenant", kdn.Tokens([]int32{1, 2, 3}))
	fmt.Println(err == kdn.ErrClosed)
	// Output:
	// true true false
	// true
}

// A context that has ended stops a call before it reaches kdn; a lookup
// also gives up on a remote tier that is slow to answer when ctx ends.
func ExampleModel_Lookup() {
	rt, _ := kdn.NewRuntime(nil)
	defer rt.Close()
	m, _ := rt.NewModel(&kdn.ModelSpec{NumLayers: 1, NumKVHeads: 1, HeadDim: 8, DType: kdn.F32, Fingerprint: "w"})
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	found, err := m.Lookup(ctx, "tenant", kdn.Tokens([]int32{1, 2, 3}))
	fmt.Println(found.CachedTokens, err)
	cancel()
	_, err = m.Lookup(ctx, "tenant", kdn.Tokens([]int32{1, 2, 3}))
	fmt.Println(errors.Is(err, context.Canceled))
	// Output:
	// 0 <nil>
	// true
}

// A layer-by-layer load into C memory, waited for with a context.
func ExampleModel_LoadAsync() {
	ctx := context.Background()
	rt, _ := kdn.NewRuntime(&kdn.RuntimeOptions{ChunkTokens: 16})
	defer rt.Close()
	m, _ := rt.NewModel(&kdn.ModelSpec{NumLayers: 4, NumKVHeads: 1, HeadDim: 8, DType: kdn.F32, Fingerprint: "y"})
	defer m.Close()
	tokens := make([]int32, 32)
	kv := make([]byte, len(tokens)*int(m.KVBytesPerToken()))
	if _, err := m.Store(ctx, "ns", kdn.Tokens(tokens), kv); err != nil {
		log.Fatal(err)
	}

	buf, _ := kdn.NewHostBuffer(len(kv))
	defer buf.Close()
	op, err := m.LoadAsync("ns", kdn.Tokens(tokens), buf)
	if err != nil {
		log.Fatal(err)
	}
	defer op.Close()
	for layer := 0; layer < 4; layer++ {
		if err := op.WaitLayer(ctx, layer); err != nil { // the engine computes this layer now
			log.Fatal(err)
		}
	}
	if err := op.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	res, _ := op.Result()
	fmt.Println(res.State, res.Tokens)
	// Output: done 32
}

// An editor rewrites each stored chunk in the background.
func ExampleNewRuntimeWithEditor() {
	edited := make(chan kdn.ChunkInfo, 1)
	rt, err := kdn.NewRuntimeWithEditor(&kdn.RuntimeOptions{ChunkTokens: 16},
		func(info kdn.ChunkInfo, kv []byte) (bool, error) {
			for i := range kv {
				kv[i] = 0 // e.g. drop this chunk's KV
			}
			edited <- info
			return true, nil
		})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	m, _ := rt.NewModel(&kdn.ModelSpec{NumLayers: 1, NumKVHeads: 1, HeadDim: 8, DType: kdn.F32, Fingerprint: "z"})
	defer m.Close()
	kv := make([]float32, 16*2*8)
	m.Store(context.Background(), "ns", kdn.Tokens(make([]int32, 16)), kdn.Float32s(kv))
	info := <-edited
	fmt.Println(info.NumTokens, info.FirstPosition)
	// Output: 16 0
}

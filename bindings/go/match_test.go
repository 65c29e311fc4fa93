// SPDX-License-Identifier: Apache-2.0
package kdn

// Match (kdn_kv_match, 1.9) on the reference model's real KV: documents put
// with the knowledge API are found where they occur in a context, at any
// offset, and in no other namespace; bad arguments are errors.

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// referenceTokens are BOS and the reference model's first 47 greedy tokens
// (models/reference's prompt, as examples/c lists them).
var referenceTokens = []int32{
	1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410,
	408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388,
	426, 338, 391, 266,
}

// referenceKV is the canonical KV ([layer][k|v][position][head][dim]) of
// positions [begin, end) of the reference prompt, read from
// models/reference/kv260k.{k,v}.f32 ([layer][position][head][dim]).
func referenceKV(t *testing.T, begin, end int) []float32 {
	t.Helper()
	dir := os.Getenv("KDN_MODELS")
	if dir == "" {
		dir = filepath.Join("..", "..", "models")
	}
	read := func(name string) []float32 {
		b, err := os.ReadFile(filepath.Join(dir, "reference", name))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != 4*layers*positions*row {
			t.Fatalf("%s: %d bytes, want the reference KV of %d positions", name, len(b), positions)
		}
		f := make([]float32, len(b)/4)
		for i := range f {
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return f
	}
	k, v := read("kv260k.k.f32"), read("kv260k.v.f32")
	n := end - begin
	out := make([]float32, 0, layers*2*n*row)
	for l := 0; l < layers; l++ {
		for _, kv := range [][]float32{k, v} {
			out = append(out, kv[(l*positions+begin)*row:(l*positions+end)*row]...)
		}
	}
	return out
}

func TestMatch(t *testing.T) {
	f := newFixture(t, nil)
	tok := referenceTokens
	// Two documents with the reference model's KV of those tokens: a (19
	// tokens: a chunk and a partial one) and b (23).
	if err := f.m.KnowledgePut(bg, ns, "doc-a", 1, "", tok[1:20], Float32s(referenceKV(t, 1, 20))); err != nil {
		t.Fatal(err)
	}
	if err := f.m.KnowledgePut(bg, ns, "doc-b", 1, "", tok[20:43], Float32s(referenceKV(t, 20, 43))); err != nil {
		t.Fatal(err)
	}
	// BOS, b, 3 other tokens, a, the query: b and a where they are.
	var context []int32
	for _, part := range [][]int32{tok[:1], tok[20:43], tok[43:46], tok[1:20], tok[43:]} {
		context = append(context, part...)
	}
	want := []TokenRange{{1, 24}, {27, 46}}
	got, err := f.m.Match(ns, context)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Match = %v, %v, want %v", got, err, want)
	}
	// The documents alone, and in the other order at other offsets.
	if got, err := f.m.Match(ns, tok[1:20]); err != nil || !reflect.DeepEqual(got, []TokenRange{{0, 19}}) {
		t.Fatalf("Match of doc-a alone = %v, %v", got, err)
	}
	var swapped []int32
	for _, part := range [][]int32{tok[1:20], tok[20:43]} {
		swapped = append(swapped, part...)
	}
	if got, err := f.m.Match(ns, swapped); err != nil || !reflect.DeepEqual(got, []TokenRange{{0, 19}, {19, 42}}) {
		t.Fatalf("Match of a then b = %v, %v", got, err)
	}
	// No document in another namespace; none in tokens of no document.
	if got, err := f.m.Match("other-tenant", context); err != nil || len(got) != 0 {
		t.Fatalf("Match in another namespace = %v, %v, want none", got, err)
	}
	if got, err := f.m.Match(ns, tok[43:]); err != nil || len(got) != 0 {
		t.Fatalf("Match of the query alone = %v, %v, want none", got, err)
	}
	// More ranges than the first guess of room: all of them.
	var many []int32
	for i := 0; i < 12; i++ {
		many = append(many, tok[1:20]...)
		many = append(many, tok[43:46]...)
	}
	got, err = f.m.Match(ns, many)
	if err != nil || len(got) != 12 {
		t.Fatalf("Match of doc-a 12 times = %d ranges, %v", len(got), err)
	}
	for i, r := range got {
		if begin := uint64(i * 22); r != (TokenRange{begin, begin + 19}) {
			t.Fatalf("range %d = %v, want [%d, %d)", i, r, begin, begin+19)
		}
	}
	// A deleted document is no longer found.
	if err := f.m.KnowledgeDelete(ns, "doc-b"); err != nil {
		t.Fatal(err)
	}
	if got, err := f.m.Match(ns, context); err != nil || !reflect.DeepEqual(got, []TokenRange{{27, 46}}) {
		t.Fatalf("Match after deleting doc-b = %v, %v", got, err)
	}
}

func TestBadMatch(t *testing.T) {
	f := newFixture(t, nil)
	tok := referenceTokens
	if err := f.m.KnowledgePut(bg, ns, "doc", 1, "", tok[:32], Float32s(referenceKV(t, 0, 32))); err != nil {
		t.Fatal(err)
	}
	_, err := f.m.Match(ns, nil)
	wantStatus(t, "Match of no tokens", err, ErrInvalidArgument)
	_, err = f.m.Match(ns, []int32{})
	wantStatus(t, "Match of an empty slice", err, ErrInvalidArgument)
	_, err = f.m.Match("", tok)
	wantStatus(t, "Match in an empty namespace", err, ErrInvalidArgument)
	bad := append([]int32(nil), tok...)
	bad[20] = -5
	_, err = f.m.Match(ns, bad)
	wantStatus(t, "Match of a negative id", err, ErrInvalidArgument)
	if e, ok := err.(*Error); !ok || e.Message == "" {
		t.Fatalf("Match of a negative id: %#v, want kdn's message", err)
	}
	// The model works on after them.
	if got, err := f.m.Match(ns, tok); err != nil || !reflect.DeepEqual(got, []TokenRange{{0, 32}}) {
		t.Fatalf("Match after bad calls = %v, %v", got, err)
	}
	f.m.Close()
	_, err = f.m.Match(ns, tok)
	if err != ErrClosed {
		t.Fatalf("Match on a closed model: %v, want ErrClosed", err)
	}
}

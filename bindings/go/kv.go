// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include <stdlib.h>
#include "kdn_go.h"
*/
import "C"

import (
	"context"
	"math"
	"strconv"
	"time"
	"unsafe"
)

// Request names the tokens a KV call is about: their ids from the start of
// the context, or the engine's own chained block hashes (HashBytes bytes
// per block of BlockTokens tokens) instead, and the salt (since 1.13) that
// keeps one user's cached KV from answering another's requests.
type Request struct {
	Tokens      []int32 // ids, each >= 0
	BlockHashes []byte  // len = blocks * HashBytes
	HashBytes   uint32  // 0: Tokens; else 1..64
	BlockTokens uint32  // tokens per engine block (chunk_tokens must be a multiple)
	// TTFTTarget (since 1.6), for Retrieve and LoadAsync (other calls
	// ignore it): the time from the call within which the cached prefix's
	// KV should be in place. Remote and redis tiers with quality levels
	// (TierConfig.Levels) choose each chunk's level by it, and leave a chunk
	// to recompute when none arrives in time. 0: no target (the finest
	// level). Rounded up to whole microseconds; negative or over an hour:
	// ErrInvalidArgument.
	TTFTTarget time.Duration
	// Salt (since 1.13; kdn_request.salt), as vLLM's cache_salt: bytes
	// that enter every chunk key of the request, so that a salted request
	// hits only KV stored with the same salt, and unsalted KV never answers
	// it (nor salted KV an unsalted one): one user's cached prefix gives
	// another no hit and no timing signal. Store, Retrieve, Lookup,
	// LookupBatch, LoadAsync, SaveAsync and the device calls take it;
	// knowledge items and Match are per namespace and have none. kdn hashes
	// it into the keys (never stores it) and copies it before the call
	// returns, an op's too: the slice may be reused at once. nil or empty:
	// none. At most MaxSaltBytes, else ErrInvalidArgument.
	Salt []byte
}

// MaxSaltBytes is the longest Request.Salt kdn takes.
const MaxSaltBytes = 4096

// Tokens is the request for these token ids.
func Tokens(ids []int32) Request { return Request{Tokens: ids} }

// c is the request for the shim, its arrays at these offsets in the call's
// flat arrays of tokens, hashes and salts.
func (q *Request) c(tokensOff, hashesOff, saltOff int) C.kdn_go_req {
	r := C.kdn_go_req{tokens_off: -1, hashes_off: -1, salt_off: -1, num_tokens: C.int64_t(len(q.Tokens)),
		hash_bytes: C.uint32_t(q.HashBytes), block_tokens: C.uint32_t(q.BlockTokens),
		ttft_target_us: C.uint64_t(targetMicros(q.TTFTTarget))}
	if len(q.Tokens) > 0 {
		r.tokens_off = C.int64_t(tokensOff)
	}
	if len(q.Salt) > 0 {
		r.salt_off, r.salt_len = C.int64_t(saltOff), C.int64_t(len(q.Salt))
	}
	if q.HashBytes > 0 {
		r.num_blocks = C.int64_t(len(q.BlockHashes) / int(q.HashBytes))
		if len(q.BlockHashes) > 0 {
			r.hashes_off = C.int64_t(hashesOff)
		}
	} else if len(q.BlockHashes) > 0 {
		r.hashes_off = C.int64_t(hashesOff) // kdn refuses hashes without HashBytes
		r.num_blocks = C.int64_t(len(q.BlockHashes))
	}
	return r
}

// targetMicros is a TTFTTarget in kdn's microseconds: a positive one rounded up
// (never 0, which means none); a negative one the largest, which kdn
// refuses (in a batched lookup, as that request's own status).
func targetMicros(d time.Duration) uint64 {
	switch {
	case d < 0:
		return math.MaxUint64
	case d%time.Microsecond != 0:
		return uint64(d/time.Microsecond) + 1
	}
	return uint64(d / time.Microsecond)
}

// check refuses on the Go side what kdn would refuse with a message that
// does not say why.
func (q *Request) check() error {
	if q.TTFTTarget < 0 {
		return invalid("Request.TTFTTarget is negative")
	}
	if len(q.Salt) > MaxSaltBytes {
		return invalid("Request.Salt is " + strconv.Itoa(len(q.Salt)) + " bytes; at most MaxSaltBytes (" +
			strconv.Itoa(MaxSaltBytes) + ")")
	}
	return nil
}

// Layout is how a view's layers are laid out.
type Layout int32

const (
	// LayoutContiguous: element (token, head, dim) at the strides (llama.cpp, canonical).
	LayoutContiguous Layout = 0
	// LayoutPagedNHD: per layer [blocks][block_size][kv_heads][head_dim] (vLLM).
	LayoutPagedNHD Layout = 1
	// LayoutPagedHND: per layer [blocks][kv_heads][block_size][head_dim].
	LayoutPagedHND Layout = 2
)

// KVView says where KV lies in the caller's memory: the []byte a call
// takes beside its views. All counts are in elements. The zero KVView is
// the canonical layout [layer][k|v][token][kv_head][head_dim] in F32.
//
// Where each layer starts, one of:
//   - one allocation (KOffsets nil, contiguous only): layer j's K at
//     j*StrideLayer, its V StrideKV further;
//   - per layer: KOffsets[j] and VOffsets[j], where layer j's K and V start
//     in the slice (required by the paged layouts). kdn's C ABI also takes
//     per-layer pointers into separate allocations; Go cannot pass those
//     (it cannot pin memory for C): put the layers in one slice.
//
// The bounds kdn checks (the slice's length, LayerElements, NumBlocks) are
// set from the slice when left 0, so a view can never reach past it.
type KVView struct {
	DType  DType    // must equal the model's
	Layout Layout   // contiguous or paged
	Layers []uint32 // view layer j is model layer Layers[j]; nil or empty: all, in order

	KOffsets, VOffsets []int64 // per layer; both nil or empty: one allocation

	StrideLayer, StrideKV                 int64  // one allocation
	StrideToken, StrideHead, StrideDim    int64  // contiguous; all 5 zero: canonical
	VStrideToken, VStrideHead, VStrideDim int64  // V's, when not all 0 (transposed V)
	NumTokens                             uint64 // room in tokens; 0: the request's
	LayerElements                         uint64 // per layer, contiguous: elements per layer; 0: up to the slice's end

	BlockSize   uint32  // paged: tokens per block
	BlockTable  []int32 // paged: token t in block BlockTable[t/BlockSize]
	NumBlocks   uint64  // paged: blocks per layer; 0: up to the slice's end
	BlockStride int64   // paged: elements between blocks; 0: dense

	// State (since 1.12; kdn_kv_view.state_layers): for a model with
	// recurrent layers (ModelSpec.NumStateLayers), one slice per recurrent
	// layer, each exactly ModelSpec.StateBytes long; one view of a call at
	// most carries it; nil or empty: none. Store and SaveAsync store the
	// state after the request's last token as the snapshot there (without
	// it the KV is stored all the same, but a prefix counts only where a
	// snapshot is). Retrieve and LoadAsync need it, and write the snapshot
	// at the prefix they return (nothing for a miss). For the canonical
	// layout with a state: KVView{DType: m.Spec().DType, State: state}.
	//
	// Store and Retrieve take any memory: state inside the call's data is
	// used in place, other state is copied through C memory for the call
	// (cgo forbids passing C an array of Go pointers). LoadAsync and
	// SaveAsync need it inside the op's HostBuffer (slices of its Bytes()),
	// since kdn reads or writes it until the op ends. The device calls and
	// the knowledge calls take none (kdn takes such a model through host
	// views only).
	State [][]byte
}

// KVResult is what a KV call did.
type KVResult struct {
	State     OpState
	Status    Status // StatusOK, StatusCancelled, or why it failed
	Tokens    uint64 // store: leading tokens cached after it; retrieve/load: tokens written; fetch: the document's length
	Covered   uint64 // retrieve/load: the cached prefix found at the start
	NumFailed uint64 // load: ranges of the prefix that could not be read
	Flags     uint32 // ResultLossy
}

// ResultLossy (KVResult.Flags): some KV written was decoded from a lossy
// codec: close to, not equal to, the KV stored.
const ResultLossy = 0x1

// Lossy says whether ResultLossy is set.
func (r KVResult) Lossy() bool { return r.Flags&ResultLossy != 0 }

func kvResult(r *C.kdn_kv_result) KVResult {
	return KVResult{State: OpState(r.state), Status: Status(r.status), Tokens: uint64(r.tokens),
		Covered: uint64(r.covered), NumFailed: uint64(r.num_failed), Flags: uint32(r.flags)}
}

// MaxTiers is the most tiers a runtime has (LookupResult.TierTokens).
const MaxTiers = 8

// LookupResult is one request's lookup.
type LookupResult struct {
	Status       Status   // this request's own status (a batched lookup's bad request fails alone)
	CachedTokens uint64   // leading tokens cached in some tier
	TierTokens   []uint64 // per tier: leading tokens that tier alone holds
}

// Err is the request's status as an error (nil when OK).
func (r LookupResult) Err() error {
	if r.Status == StatusOK {
		return nil
	}
	return &Error{Status: r.Status, Message: "this request of the lookup failed"}
}

func lookupResult(r *C.kdn_lookup_result) LookupResult {
	out := LookupResult{Status: Status(r.status), CachedTokens: uint64(r.cached_tokens)}
	n := int(r.num_tiers)
	if n > MaxTiers {
		n = MaxTiers
	}
	out.TierTokens = make([]uint64, n)
	for i := 0; i < n; i++ {
		out.TierTokens[i] = uint64(r.tier_tokens[i])
	}
	return out
}

// kvArgs are the views of one call, flattened for the shim: templates
// without pointers and the arrays they index into.
type kvArgs struct {
	tmpl    []C.kdn_kv_view
	aux     []C.kdn_go_view_aux
	layers  []uint32
	offsets []int64 // bytes
	table   []int32

	stateView int      // the view that carries the recurrent state (KVView.State); -1: none
	state     [][]byte // that view's State, checked
}

func (a *kvArgs) layersPtr() *C.uint32_t {
	if len(a.layers) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&a.layers[0]))
}

func (a *kvArgs) offsetsPtr() *C.int64_t {
	if len(a.offsets) == 0 {
		return nil
	}
	return (*C.int64_t)(unsafe.Pointer(&a.offsets[0]))
}

func (a *kvArgs) tmplPtr() (*C.kdn_kv_view, *C.kdn_go_view_aux) {
	if len(a.tmpl) == 0 {
		return nil, nil
	}
	return &a.tmpl[0], &a.aux[0]
}

// views turns the views over dataLen bytes into the shim's arguments; no
// views is the canonical layout in the model's dtype. The per-layer bounds
// are checked here, against the slice, since kdn cannot know it.
func (m *Model) views(views []KVView, dataLen int) (kvArgs, error) {
	a := kvArgs{stateView: -1}
	if len(views) == 0 {
		views = []KVView{{DType: m.spec.DType}}
	}
	if err := m.checkState(&a, views); err != nil {
		return a, err
	}
	a.tmpl = make([]C.kdn_kv_view, len(views))
	a.aux = make([]C.kdn_go_view_aux, len(views))
	single := len(views) == 1
	for i := range views {
		v := &views[i]
		t := &a.tmpl[i]
		x := &a.aux[i]
		C.kdn_kv_view_init(t, C.sizeof_kdn_kv_view)
		*x = C.kdn_go_view_aux{layers_off: -1, k_off: -1, v_off: -1, table_off: -1, state_off: -1}
		t.dtype = C.kdn_dtype(v.DType)
		t.layout = C.kdn_kv_layout(v.Layout)
		t.stride_layer, t.stride_kv = C.int64_t(v.StrideLayer), C.int64_t(v.StrideKV)
		t.stride_token, t.stride_head, t.stride_dim = C.int64_t(v.StrideToken), C.int64_t(v.StrideHead), C.int64_t(v.StrideDim)
		t.v_stride_token, t.v_stride_head, t.v_stride_dim = C.int64_t(v.VStrideToken), C.int64_t(v.VStrideHead), C.int64_t(v.VStrideDim)
		t.num_tokens = C.uint64_t(v.NumTokens)
		t.layer_elements = C.uint64_t(v.LayerElements)
		t.block_size = C.uint32_t(v.BlockSize)
		t.block_table_len = C.size_t(len(v.BlockTable))
		t.num_blocks = C.uint64_t(v.NumBlocks)
		t.block_stride = C.int64_t(v.BlockStride)
		// An empty slice is nil: kdn would read num_layers 0 as every
		// layer, with per-layer arrays sized for none.
		if len(v.Layers) > 0 {
			t.num_layers = C.size_t(len(v.Layers))
			x.layers_off = C.int64_t(len(a.layers))
			if single {
				a.layers = v.Layers
			} else {
				a.layers = append(a.layers, v.Layers...)
			}
		}
		if len(v.BlockTable) > 0 {
			x.table_off = C.int64_t(len(a.table))
			if single {
				a.table = v.BlockTable
			} else {
				a.table = append(a.table, v.BlockTable...)
			}
		}
		if len(v.KOffsets) == 0 && len(v.VOffsets) == 0 {
			continue
		}
		// Per layer: byte offsets, and the bounds of every layer.
		n := int(m.spec.NumLayers)
		if len(v.Layers) > 0 {
			n = len(v.Layers)
		}
		if len(v.KOffsets) != n || len(v.VOffsets) != n {
			return a, invalid("KVView: KOffsets and VOffsets need one offset per view layer")
		}
		es := int64(v.DType.Size())
		if es == 0 {
			return a, invalid("KVView: unknown dtype " + v.DType.String())
		}
		total := int64(dataLen) / es
		room := total
		x.k_off = C.int64_t(len(a.offsets))
		x.v_off = x.k_off + C.int64_t(n)
		x.num_ptrs = C.int64_t(n)
		for _, offs := range [2][]int64{v.KOffsets, v.VOffsets} {
			for _, o := range offs {
				if o < 0 || o > total {
					return a, invalid("KVView: a layer offset is outside the data")
				}
				if total-o < room {
					room = total - o
				}
			}
		}
		for _, offs := range [2][]int64{v.KOffsets, v.VOffsets} {
			for _, o := range offs {
				a.offsets = append(a.offsets, o*es)
			}
		}
		if v.Layout == LayoutContiguous {
			if room == 0 || v.LayerElements > uint64(room) {
				return a, invalid("KVView: LayerElements reach past the data")
			}
			if v.LayerElements == 0 {
				t.layer_elements = C.uint64_t(room)
			}
			continue
		}
		blockElems := int64(v.BlockSize) * int64(m.spec.NumKVHeads) * int64(m.spec.HeadDim)
		stride := v.BlockStride
		if stride == 0 {
			stride = blockElems
		}
		if blockElems <= 0 || stride <= 0 {
			return a, invalid("KVView: a paged view needs BlockSize > 0 and BlockStride >= 0")
		}
		var fit int64
		if room >= blockElems {
			fit = (room-blockElems)/stride + 1
		}
		if fit == 0 || v.NumBlocks > uint64(fit) {
			return a, invalid("KVView: NumBlocks reach past the data")
		}
		if v.NumBlocks == 0 {
			t.num_blocks = C.uint64_t(fit)
		}
	}
	return a, nil
}

// checkState finds the view that carries the recurrent state and checks
// it against the model's spec, before kdn is called.
func (m *Model) checkState(a *kvArgs, views []KVView) error {
	for i := range views {
		st := views[i].State
		if len(st) == 0 {
			continue
		}
		if m.spec.NumStateLayers == 0 {
			return invalid("KVView.State: the model has no recurrent layers (ModelSpec.NumStateLayers is 0)")
		}
		if a.stateView >= 0 {
			return invalid("KVView.State is given by two views (" + strconv.Itoa(a.stateView) + " and " +
				strconv.Itoa(i) + "); one view of a call carries the state")
		}
		if uint64(len(st)) != uint64(m.spec.NumStateLayers) {
			return invalid("KVView.State has " + strconv.Itoa(len(st)) + " slices; the model has " +
				strconv.FormatUint(uint64(m.spec.NumStateLayers), 10) + " recurrent layers (one slice each)")
		}
		for l, s := range st {
			if uint64(len(s)) != m.spec.StateBytes {
				return invalid("KVView.State[" + strconv.Itoa(l) + "] is " + strconv.Itoa(len(s)) +
					" bytes; a recurrent layer's state is ModelSpec.StateBytes = " +
					strconv.FormatUint(m.spec.StateBytes, 10))
			}
		}
		a.stateView, a.state = i, st
	}
	return nil
}

// How a call may reach the recurrent state (KVView.State).
const (
	stateNone  = iota // the call takes none: device and knowledge calls
	stateSync         // Store, Retrieve: in place inside data, else copied through C memory
	stateAsync        // LoadAsync, SaveAsync: inside the op's C memory only
)

// within gives s's offset in the n bytes at base, when s lies there.
func within(s []byte, base unsafe.Pointer, n int) (int64, bool) {
	if base == nil || len(s) == 0 {
		return 0, false
	}
	p, b := uintptr(unsafe.Pointer(&s[0])), uintptr(base)
	if p < b || p-b > uintptr(n) || uintptr(n)-(p-b) < uintptr(len(s)) {
		return 0, false
	}
	return int64(p - b), true
}

// placeState puts the byte offsets of the checked state into a (the view's
// aux and a.offsets), in the n bytes at data when every slice lies there;
// otherwise, for a synchronous call, in C memory it returns (freed by the
// caller) holding a copy of the state.
func (a *kvArgs) placeState(data unsafe.Pointer, n int, mode int) (unsafe.Pointer, error) {
	if a.stateView < 0 {
		return nil, nil
	}
	if mode == stateNone {
		return nil, &Error{Status: StatusUnsupported, Message: "KVView.State: this call takes no recurrent " +
			"state (kdn takes a model with recurrent layers through Store, Retrieve, LoadAsync and SaveAsync " +
			"on host memory only)"}
	}
	x := &a.aux[a.stateView]
	x.state_off = C.int64_t(len(a.offsets))
	x.num_state = C.int64_t(len(a.state))
	inside := true
	for _, s := range a.state {
		if _, ok := within(s, data, n); !ok {
			inside = false
			break
		}
	}
	if inside {
		for _, s := range a.state {
			off, _ := within(s, data, n)
			a.offsets = append(a.offsets, off)
		}
		return nil, nil
	}
	if mode == stateAsync {
		a.offsets = a.offsets[:int(x.state_off)]
		return nil, invalid("KVView.State: LoadAsync and SaveAsync need the state inside the op's " +
			"HostBuffer (slices of its Bytes()): kdn reads or writes it until the op ends")
	}
	size := len(a.state[0])
	scratch := C.malloc(C.size_t(len(a.state) * size))
	if scratch == nil {
		return nil, &Error{Status: StatusNoMemory, Message: "out of memory copying the recurrent state"}
	}
	c := unsafe.Slice((*byte)(scratch), len(a.state)*size)
	for l, s := range a.state {
		copy(c[l*size:], s)
		a.offsets = append(a.offsets, int64(l*size))
	}
	return scratch, nil
}

// kv makes a KV call of kind which over the n bytes at data (or, with
// mem.device set, at that device address; data is then nil), through the
// views. A load or save (data: C memory) starts the op it puts in *op.
func (m *Model) kv(which C.int, ns string, req *Request, data unsafe.Pointer, n int, mem C.kdn_go_mem,
	views []KVView, op **C.kdn_op) (KVResult, error) {
	if err := req.check(); err != nil {
		return KVResult{}, err
	}
	a, err := m.views(views, n)
	if err != nil {
		return KVResult{}, err
	}
	mode := stateSync
	if mem.device != 0 {
		mode = stateNone
	} else if op != nil {
		mode = stateAsync
	}
	scratch, err := a.placeState(data, n, mode)
	if err != nil {
		return KVResult{}, err
	}
	if scratch != nil {
		defer C.free(scratch)
	}
	tmpl, aux := a.tmplPtr()
	r := C.kdn_go_kv_call(which, m.m, strPtr(ns), C.size_t(len(ns)), req.c(0, 0, 0), int32sPtr(req.Tokens),
		(*C.uint8_t)(bytesPtr(req.BlockHashes)), (*C.uint8_t)(bytesPtr(req.Salt)), tmpl, aux, C.size_t(len(a.tmpl)),
		a.layersPtr(), a.offsetsPtr(), int32sPtr(a.table), data, C.size_t(n), scratch, mem, op)
	if scratch != nil && which == C.KDN_GO_RETRIEVE {
		// kdn wrote the snapshot at the prefix it returned (or left the
		// copy as it was): back to the caller's slices.
		size := len(a.state[0])
		c := unsafe.Slice((*byte)(scratch), len(a.state)*size)
		for l, s := range a.state {
			copy(s, c[l*size:(l+1)*size])
		}
	}
	return kvResult(&r.result), newError(r.status, r.msg)
}

func (m *Model) kvCall(ctx context.Context, which C.int, ns string, req *Request, data []byte,
	views []KVView) (KVResult, error) {
	if err := ctxErr(ctx); err != nil {
		return KVResult{}, err
	}
	if !m.g.enter() {
		return KVResult{}, ErrClosed
	}
	defer m.g.leave()
	return m.kv(which, ns, req, bytesPtr(data), len(data), C.kdn_go_mem{}, views, nil)
}

// ctxErr is why a call must not start: a nil ctx (a caller's mistake,
// refused rather than a panic) or one that has ended.
func ctxErr(ctx context.Context) error {
	if ctx == nil {
		return invalid("the context is nil (use context.Background())")
	}
	return ctx.Err()
}

// outcome is what a call of abandonable returned (Go 1.19 has no type
// declarations inside generic functions).
type outcome[T any] struct {
	v   T
	err error
}

// abandonable runs call on a goroutine of its own and returns its outcome,
// or ctx.Err() as soon as ctx ends first; the call then runs to its end
// unobserved. Only for calls without side effects whose arguments the
// caller cannot change under them (lookups of copied requests): kdn offers
// no way to interrupt them, and Go memory they read or write must stay
// theirs after the caller has returned.
func abandonable[T any](ctx context.Context, call func() (T, error)) (T, error) {
	done := make(chan outcome[T], 1) // buffered: an abandoned call's goroutine still ends
	go func() {
		v, err := call()
		done <- outcome[T]{v, err}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		select {
		case o := <-done: // both at once: the answer is worth more than the error
			return o.v, o.err
		default:
		}
		var zero T
		return zero, ctx.Err()
	}
}

// Store keeps the request's KV, read from data through the views (none:
// data is the canonical layout in the model's dtype). Chunks already cached
// are skipped; when not all fit, the longest prefix that fits is kept.
// The result's Tokens is the leading tokens cached after the call.
//
// A ctx that has ended returns ctx.Err() and stores nothing. Once started,
// the store is not interrupted by ctx: kdn reads data until it returns (Go
// cannot lend its memory to kdn's asynchronous save), and it waits for a
// remote or redis tier at most that tier's Timeout per call to it.
func (m *Model) Store(ctx context.Context, ns string, req Request, data []byte, views ...KVView) (KVResult, error) {
	return m.kvCall(ctx, C.KDN_GO_STORE, ns, &req, data, views)
}

// Retrieve writes the KV of the request's longest cached prefix into data
// through the views (none: the canonical layout). A miss is not an error:
// the result's Tokens is then 0.
//
// A ctx that has ended returns ctx.Err() and writes nothing. Once started,
// the retrieve is not interrupted by ctx, and returns its result even if
// ctx ended meanwhile: kdn writes data until it returns (Go cannot lend
// its memory to kdn's asynchronous load, which would go on writing after
// an early return), and it waits for a remote or redis tier at most that
// tier's Timeout per call to it. For a load that a context can give up
// on, use LoadAsync into a HostBuffer and Op.Wait(ctx) (the op itself
// notices Cancel only after its fetch, so its Close may still wait).
func (m *Model) Retrieve(ctx context.Context, ns string, req Request, data []byte, views ...KVView) (KVResult, error) {
	return m.kvCall(ctx, C.KDN_GO_RETRIEVE, ns, &req, data, views)
}

// Lookup says how many leading tokens of the request are cached, without
// side effects. A miss is not an error. A bad request is an error here;
// in LookupBatch it is the request's own Status.
//
// A ctx that has ended returns ctx.Err() without calling kdn. A lookup
// can wait on a remote or redis tier (up to that tier's Timeout), which
// kdn cannot interrupt: when ctx can end (its Done is not nil), the lookup
// runs on its own goroutine over a copy of the request, and Lookup returns
// ctx.Err() as soon as ctx ends; the abandoned lookup finishes in the
// background, and the model's Close waits for it.
func (m *Model) Lookup(ctx context.Context, ns string, req Request) (LookupResult, error) {
	if err := ctxErr(ctx); err != nil {
		return LookupResult{}, err
	}
	if ctx.Done() == nil {
		return m.lookup1(ns, &req)
	}
	// The caller may reuse its slices once Lookup returned early.
	req.Tokens = append([]int32(nil), req.Tokens...)
	req.BlockHashes = append([]byte(nil), req.BlockHashes...)
	req.Salt = append([]byte(nil), req.Salt...)
	return abandonable(ctx, func() (LookupResult, error) { return m.lookup1(ns, &req) })
}

func (m *Model) lookup1(ns string, req *Request) (LookupResult, error) {
	if !m.g.enter() {
		return LookupResult{}, ErrClosed
	}
	defer m.g.leave()
	if err := req.check(); err != nil {
		return LookupResult{}, err
	}
	r := C.kdn_go_lookup1(m.m, strPtr(ns), C.size_t(len(ns)), req.c(0, 0, 0), int32sPtr(req.Tokens),
		(*C.uint8_t)(bytesPtr(req.BlockHashes)), (*C.uint8_t)(bytesPtr(req.Salt)))
	if err := newError(r.status, r.msg); err != nil {
		return LookupResult{}, err
	}
	res := lookupResult(&r.result)
	if res.Status != StatusOK {
		return res, res.Err()
	}
	return res, nil
}

// LookupBatch looks up several requests at once. Each result carries its
// request's own status (a bad request fails alone); the error is only for
// a call that is wrong as a whole (a bad namespace, a closed model).
//
// ctx works as in Lookup: an ended ctx returns ctx.Err() without calling
// kdn, and one that ends during the lookup returns ctx.Err() at once
// (the requests are copied for the call in any case).
func (m *Model) LookupBatch(ctx context.Context, ns string, reqs []Request) ([]LookupResult, error) {
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	// Flattened (so copied) here, before the call may go on without us.
	var tokens []int32
	var hashes, salts []byte
	creqs := make([]C.kdn_go_req, len(reqs))
	for i := range reqs {
		creqs[i] = reqs[i].c(len(tokens), len(hashes), len(salts))
		tokens = append(tokens, reqs[i].Tokens...)
		hashes = append(hashes, reqs[i].BlockHashes...)
		salts = append(salts, reqs[i].Salt...)
	}
	call := func() ([]LookupResult, error) { return m.lookupBatch(ns, creqs, tokens, hashes, salts) }
	if ctx.Done() == nil {
		return call()
	}
	return abandonable(ctx, call)
}

func (m *Model) lookupBatch(ns string, creqs []C.kdn_go_req, tokens []int32,
	hashes, salts []byte) ([]LookupResult, error) {
	if !m.g.enter() {
		return nil, ErrClosed
	}
	defer m.g.leave()
	results := make([]C.kdn_lookup_result, len(creqs))
	var reqPtr *C.kdn_go_req
	var resPtr *C.kdn_lookup_result
	if len(creqs) > 0 {
		reqPtr, resPtr = &creqs[0], &results[0]
	}
	err := retError(C.kdn_go_lookup(m.m, strPtr(ns), C.size_t(len(ns)), reqPtr, C.size_t(len(creqs)),
		int32sPtr(tokens), (*C.uint8_t)(bytesPtr(hashes)), (*C.uint8_t)(bytesPtr(salts)), resPtr))
	if err != nil {
		return nil, err
	}
	out := make([]LookupResult, len(creqs))
	for i := range results {
		out[i] = lookupResult(&results[i])
	}
	return out, nil
}

// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include <stdlib.h>
#include "kdn_go.h"
*/
import "C"

import (
	"runtime"
	"time"
	"unsafe"
)

// RopeStyle is how a model pairs dimensions for rotary embeddings.
type RopeStyle int32

const (
	RopeInterleaved RopeStyle = 0 // pairs (2j, 2j+1): llama2.c, GPT-J, Meta Llama
	RopeNeox        RopeStyle = 1 // pairs (j, j + rotary_dim/2): HF Llama, NeoX
)

// CacheKind is what each layer of a model caches per token (since 1.11;
// docs/model-kinds.md).
type CacheKind int32

const (
	CacheKV     CacheKind = 0 // K and V, NumKVHeads x HeadDim each (the default)
	CacheLatent CacheKind = 1 // one latent vector of LatentDim (MLA: DeepSeek-V2/V3, Kimi)
)

// ModelSpec is the shape of a model's KV and what identifies its weights.
// KV is only ever returned to a model with the same spec and fingerprint.
type ModelSpec struct {
	NumLayers  uint32 // 1..4096
	NumKVHeads uint32 // 1..4096 (0 for a latent model)
	HeadDim    uint32 // 1..65536 (0 for a latent model)
	DType      DType
	RopeTheta  float32 // 0: 10000
	RopeStyle  RopeStyle
	RotaryDim  uint32 // 0: HeadDim
	// Fingerprint identifies weights, tokenizer, layout, TP rank and size,
	// adapters: anything that changes the KV. Must not be empty.
	Fingerprint string
	// CacheLatent: each layer caches one vector of LatentDim (even) per
	// token, its last LatentRopeDim dims carrying RoPE; a view then
	// describes that vector (its K side; no V). CacheKV: both 0.
	CacheKind     CacheKind
	LatentDim     uint32
	LatentRopeDim uint32
	// Since 1.12, layer groups (docs/model-kinds.md). LayerWindows: one per
	// layer, 0 = full attention, W > 0 = the layer attends to the last W
	// tokens (sliding window); nil: every layer full. A load then writes a
	// sliding layer's window only, and a lookup reports the prefix every
	// group serves. NumStateLayers / StateBytes: recurrent layers (not in
	// NumLayers) with a state of StateBytes each (a positive multiple of 4),
	// which a view carries in KVView.State (kdn_kv_view.state_layers): a
	// store keeps the state after its request's last token as the snapshot
	// there, a retrieve or load needs it and writes the snapshot at the
	// prefix it returns, and a prefix counts only where a snapshot is.
	// Such a model takes host views only, and no knowledge items.
	LayerWindows   []uint32
	NumStateLayers uint32
	StateBytes     uint64
}

// Model is a model registered with a runtime; every KV call goes through
// one. Safe for concurrent use.
type Model struct {
	g             guard
	m             *C.kdn_model
	core          *core
	spec          ModelSpec
	bytesPerToken uint64
	fingerprint   [32]byte
}

// NewModel registers a model with the runtime.
func (r *Runtime) NewModel(spec *ModelSpec) (*Model, error) {
	if spec == nil {
		return nil, invalid("NewModel: spec is nil")
	}
	if !r.g.enter() {
		return nil, ErrClosed
	}
	defer r.g.leave()
	var s C.kdn_model_spec
	if st := C.kdn_model_spec_init(&s, C.sizeof_kdn_model_spec); st != C.KDN_OK {
		return nil, newError(st, nil)
	}
	s.num_layers = C.uint32_t(spec.NumLayers)
	s.num_kv_heads = C.uint32_t(spec.NumKVHeads)
	s.head_dim = C.uint32_t(spec.HeadDim)
	s.dtype = C.kdn_dtype(spec.DType)
	if spec.RopeTheta != 0 {
		s.rope_theta = C.float(spec.RopeTheta)
	}
	s.rope_style = C.kdn_rope_style(spec.RopeStyle)
	s.rotary_dim = C.uint32_t(spec.RotaryDim)
	s.cache_kind = C.kdn_cache_kind(spec.CacheKind)
	s.latent_dim = C.uint32_t(spec.LatentDim)
	s.latent_rope_dim = C.uint32_t(spec.LatentRopeDim)
	if n := len(spec.LayerWindows); n > 0 {
		// C memory: a struct passed to C holds no Go pointer.
		w := (*C.uint32_t)(C.malloc(C.size_t(4 * n)))
		defer C.free(unsafe.Pointer(w))
		copy(unsafe.Slice(w, n), unsafe.Slice((*C.uint32_t)(unsafe.Pointer(&spec.LayerWindows[0])), n))
		s.layer_windows = w
	}
	s.num_state_layers = C.uint32_t(spec.NumStateLayers)
	s.state_bytes = C.uint64_t(spec.StateBytes)
	m := &Model{core: r.core, spec: *spec}
	var bpt C.uint64_t
	var cm *C.kdn_model
	var id [32]byte
	fp := spec.Fingerprint
	err := retError(C.kdn_go_model_create(r.rt, &s, strPtr(fp), C.size_t(len(fp)), &cm, &bpt,
		(*C.uint8_t)(unsafe.Pointer(&id[0]))))
	if err != nil {
		return nil, err
	}
	m.fingerprint = id
	m.m = cm
	m.bytesPerToken = uint64(bpt)
	r.core.acquire()
	runtime.SetFinalizer(m, (*Model).Close)
	return m, nil
}

// Spec is the spec the model was registered with.
func (m *Model) Spec() ModelSpec { return m.spec }

// KVBytesPerToken is layers x 2 x kv_heads x head_dim x the dtype's size.
func (m *Model) KVBytesPerToken() uint64 { return m.bytesPerToken }

// Fingerprint is the 32-byte identity kdn derived from the spec.
func (m *Model) Fingerprint() [32]byte { return m.fingerprint }

// ReportPrefill tells the runtime that the engine prefilled tokens tokens of
// this model in elapsed (wall time of the forward pass, as the engine
// measured it; since 1.4). Later loads price the tokens they serve at the
// model's mean prefill time per token (Stats.TTFTSaved). Report the
// prefills of the tokens a load did not serve, and full prefills, as they
// happen. ErrInvalidArgument when tokens or elapsed is 0 or negative, or
// the time is over an hour per token.
func (m *Model) ReportPrefill(tokens uint64, elapsed time.Duration) error {
	if !m.g.enter() {
		return ErrClosed
	}
	defer m.g.leave()
	if elapsed < 0 {
		return invalid("ReportPrefill: the elapsed time is negative")
	}
	return retError(C.kdn_go_model_report_prefill(m.m, C.uint64_t(tokens), C.uint64_t(elapsed)))
}

// Close releases the model; ops started from it stay usable. Idempotent.
// Inside an editor callback, Close returns at once and the release runs on
// a goroutine of its own (see Op.Close).
func (m *Model) Close() error {
	if m == nil {
		return nil
	}
	m.g.closeThen(func() {
		runtime.SetFinalizer(m, nil)
		C.kdn_model_destroy(m.m)
		m.m = nil
		m.core.release()
	})
	return nil
}

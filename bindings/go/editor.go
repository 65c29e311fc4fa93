// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include "kdn_go.h"
*/
import "C"

import (
	"errors"
	"runtime/cgo"
	"unsafe"
)

// ChunkInfo describes a stored chunk, as an editor sees it.
type ChunkInfo struct {
	NumLayers, NumKVHeads, HeadDim, NumTokens uint32
	DType                                     DType
	FirstPosition                             int64 // position of the chunk's first token; -1: position-free
	ModelFingerprint                          [32]byte
}

// Editor rewrites a chunk's KV after it is stored, before it reaches the
// lower tiers. kv is the chunk in the canonical layout
// [layer][k|v][token][kv_head][head_dim], C memory valid for the call only:
// edit it in place and return true. An error (its kdn status if it has
// one, else StatusInvalidArgument) or a panic (StatusInternal) leaves the
// chunk as it was. It runs on the runtime's mover thread, one chunk at a
// time, and must not call the runtime, its models or ops (they fail with
// ErrInvalidArgument there), except their Close: as kdn's destroy functions
// there, Close then returns at once and the release (an op's cancel and
// wait, the free of its memory; the runtime's, once the editor has
// returned) runs on a goroutine of its own. That holds for the editor's own
// goroutine only: a goroutine it starts and waits for is not inside it.
type Editor func(info ChunkInfo, kv []byte) (changed bool, err error)

// NewRuntimeWithEditor creates a runtime whose stored chunks go through
// edit. The function is kept until the runtime, its models and ops are all
// closed.
func NewRuntimeWithEditor(opts *RuntimeOptions, edit Editor) (*Runtime, error) {
	if edit == nil {
		return nil, invalid("NewRuntimeWithEditor: the editor is nil (use NewRuntime)")
	}
	return newRuntime(opts, edit)
}

//export kdnGoEdit
func kdnGoEdit(user C.uintptr_t, info *C.kdn_chunk_info, kv unsafe.Pointer, n C.size_t, changed *C.int) (status C.kdn_status) {
	defer func() {
		if recover() != nil {
			*changed = 0
			status = C.KDN_ERR_INTERNAL
		}
	}()
	edit := cgo.Handle(user).Value().(Editor)
	ci := ChunkInfo{NumLayers: uint32(info.num_layers), NumKVHeads: uint32(info.num_kv_heads),
		HeadDim: uint32(info.head_dim), NumTokens: uint32(info.num_tokens), DType: DType(info.dtype),
		FirstPosition: int64(info.first_position)}
	for i := range ci.ModelFingerprint {
		ci.ModelFingerprint[i] = byte(info.model_fingerprint[i])
	}
	var buf []byte
	if kv != nil && n > 0 {
		buf = unsafe.Slice((*byte)(kv), int(n))
	}
	ok, err := edit(ci, buf)
	if err != nil {
		*changed = 0
		var e *Error
		var s sentinel
		switch {
		case errors.As(err, &e) && e.Status < 0:
			return C.kdn_status(e.Status)
		case errors.As(err, &s) && s < 0:
			return C.kdn_status(s)
		}
		return C.KDN_ERR_INVALID_ARGUMENT
	}
	if ok {
		*changed = 1
	} else {
		*changed = 0
	}
	return C.KDN_OK
}

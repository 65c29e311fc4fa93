// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include <stdlib.h>
#include "kdn_go.h"
*/
import "C"

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"
)

// HostBuffer is memory allocated by C, for the asynchronous loads and
// saves: kdn keeps using their memory after the call returns, which Go
// memory cannot allow. Bytes gives it as a []byte (no copy).
//
// Lifetime: the memory is freed by Close (or, when ops still use it, by
// the Close of the last of them), never by the garbage collector while a
// slice of it may exist. A slice from Bytes is C memory, which Go's
// collector does not track: it stays valid until Close, whether or not the
// *HostBuffer is still reachable, and must not be used after Close. The
// finalizer is a backstop only for a buffer whose Bytes was never called
// (no slice of it can exist); a buffer dropped without Close after Bytes
// was called is never freed (a leak, not a use after free): Close it.
type HostBuffer struct {
	mu      sync.Mutex
	p       unsafe.Pointer
	n       int
	users   int  // the buffer itself (until Close) and each op using it
	closed  bool // Close was called
	exposed bool // Bytes handed out a slice of the memory
}

// NewHostBuffer allocates n zeroed bytes.
func NewHostBuffer(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, invalid("NewHostBuffer: the size must be > 0")
	}
	p := C.calloc(C.size_t(n), 1)
	if p == nil {
		return nil, &Error{Status: StatusNoMemory, Message: "NewHostBuffer: out of memory"}
	}
	b := &HostBuffer{p: p, n: n, users: 1}
	runtime.SetFinalizer(b, (*HostBuffer).finalize)
	return b, nil
}

// Bytes is the buffer's memory (nil once closed), as a slice of C memory:
// valid until Close (see HostBuffer), even if the *HostBuffer is dropped.
func (b *HostBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.exposed = true
	return unsafe.Slice((*byte)(b.p), b.n)
}

// Len is the buffer's size in bytes.
func (b *HostBuffer) Len() int { return b.n }

func (b *HostBuffer) acquire() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.users++
	return true
}

func (b *HostBuffer) release() {
	b.mu.Lock()
	b.users--
	last := b.users == 0
	b.mu.Unlock()
	if last {
		C.free(b.p)
	}
}

// Close releases the buffer: freed now, or when the last op using it is
// closed. Slices from Bytes must not be used after it. Idempotent.
func (b *HostBuffer) Close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	runtime.SetFinalizer(b, nil)
	b.release()
	return nil
}

// hostBufferFinalized, when set (by tests), is told of each HostBuffer the
// finalizer handled: its memory, and whether the finalizer freed it.
var hostBufferFinalized atomic.Value // of func(unsafe.Pointer, bool)

// finalize is the backstop for a buffer dropped without Close. No op holds
// it (an op keeps its buffer reachable), so it frees the memory unless a
// slice of it may still be in use.
func (b *HostBuffer) finalize() {
	b.mu.Lock()
	free := !b.exposed
	b.mu.Unlock()
	if free {
		b.Close()
	}
	if f, ok := hostBufferFinalized.Load().(func(unsafe.Pointer, bool)); ok {
		f(b.p, free)
	}
}

// OpState is where an operation is.
type OpState int32

const (
	OpPending   OpState = 0
	OpDone      OpState = 1
	OpFailed    OpState = 2
	OpCancelled OpState = 3
)

func (s OpState) String() string {
	switch s {
	case OpPending:
		return "pending"
	case OpDone:
		return "done"
	case OpFailed:
		return "failed"
	case OpCancelled:
		return "cancelled"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// TokenRange is the tokens [Begin, End).
type TokenRange struct{ Begin, End uint64 }

// Op is an asynchronous, layer-by-layer load or save. Safe for concurrent
// use. Close it when done: Close cancels it if it still runs and waits
// until kdn no longer uses its buffer.
type Op struct {
	g    guard
	op   *C.kdn_op
	core *core
	buf  *HostBuffer // nil: device memory the caller keeps valid
}

func (m *Model) async(which C.int, ns string, req *Request, buf *HostBuffer, views []KVView) (*Op, error) {
	if buf == nil {
		return nil, invalid("the HostBuffer is nil")
	}
	return m.startOp(which, ns, req, buf.p, buf.n, C.kdn_go_mem{}, buf, views)
}

// startOp starts a load or save over the n bytes at data (or at mem.device)
// and holds buf, when not nil, until the op is closed.
func (m *Model) startOp(which C.int, ns string, req *Request, data unsafe.Pointer, n int, mem C.kdn_go_mem,
	buf *HostBuffer, views []KVView) (*Op, error) {
	if !m.g.enter() {
		return nil, ErrClosed
	}
	defer m.g.leave()
	if buf != nil && !buf.acquire() {
		return nil, ErrClosed
	}
	var cop *C.kdn_op
	if _, err := m.kv(which, ns, req, data, n, mem, views, &cop); err != nil {
		if buf != nil {
			buf.release()
		}
		return nil, err
	}
	m.core.acquire()
	op := &Op{op: cop, core: m.core, buf: buf}
	runtime.SetFinalizer(op, (*Op).Close)
	return op, nil
}

// LoadAsync starts loading the request's cached prefix into buf through
// the views (none: canonical), layer by layer in the background. A miss is
// a load of 0 tokens. buf stays in use until the op is closed.
func (m *Model) LoadAsync(ns string, req Request, buf *HostBuffer, views ...KVView) (*Op, error) {
	return m.async(C.KDN_GO_LOAD, ns, &req, buf, views)
}

// SaveAsync starts a save of the request's KV from buf: call LayerReady
// once per model layer as it becomes final, then Wait.
func (m *Model) SaveAsync(ns string, req Request, buf *HostBuffer, views ...KVView) (*Op, error) {
	return m.async(C.KDN_GO_SAVE, ns, &req, buf, views)
}

// LayerReady says model layer `layer` is final in the buffer (saves).
func (o *Op) LayerReady(layer int) error {
	if !o.g.enter() {
		return ErrClosed
	}
	defer o.g.leave()
	if !fitsUint32(layer) {
		return invalid("LayerReady: layer out of range")
	}
	return retError(C.kdn_go_op_layer_ready(o.op, C.uint32_t(layer)))
}

// waitStep is how long one call into kdn waits before looking at ctx again
// (and letting a concurrent Close in).
const waitStepMs = 10

// wait repeats a timed wait until it ends or ctx does.
func (o *Op) wait(ctx context.Context, step func(op *C.kdn_op, ms C.int64_t) C.kdn_go_ret) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	ms := C.int64_t(waitStepMs)
	if ctx.Done() == nil {
		ms = 200
	}
	for {
		if !o.g.enter() {
			return ErrClosed
		}
		r := step(o.op, ms)
		o.g.leave()
		if r.status != C.KDN_ERR_TIMEOUT {
			return retError(r)
		}
		C.free(unsafe.Pointer(r.msg))
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Wait waits until the op ends and returns its own status (ErrCancelled
// when it was cancelled). When ctx ends first it returns ctx.Err() and
// the op goes on: Cancel it, or Wait again.
func (o *Op) Wait(ctx context.Context) error {
	return o.wait(ctx, func(op *C.kdn_op, ms C.int64_t) C.kdn_go_ret { return C.kdn_go_op_wait(op, ms) })
}

// WaitLayer waits until model layer `layer` is loaded (loads). When ctx
// ends first it returns ctx.Err() and the load goes on.
func (o *Op) WaitLayer(ctx context.Context, layer int) error {
	if !fitsUint32(layer) {
		return invalid("WaitLayer: layer out of range")
	}
	return o.wait(ctx, func(op *C.kdn_op, ms C.int64_t) C.kdn_go_ret {
		return C.kdn_go_op_wait_layer(op, C.uint32_t(layer), ms)
	})
}

// Poll is where the op is, without waiting.
func (o *Op) Poll() (OpState, error) {
	if !o.g.enter() {
		return 0, ErrClosed
	}
	defer o.g.leave()
	var s C.kdn_op_state
	if err := retError(C.kdn_go_op_poll(o.op, &s)); err != nil {
		return 0, err
	}
	return OpState(s), nil
}

// Cancel asks the op to stop: it ends OpCancelled at its next layer,
// unless it has ended already.
func (o *Op) Cancel() error {
	if !o.g.enter() {
		return ErrClosed
	}
	defer o.g.leave()
	return retError(C.kdn_go_op_cancel(o.op))
}

// Result is the op's outcome so far (State OpPending while it runs).
func (o *Op) Result() (KVResult, error) {
	if !o.g.enter() {
		return KVResult{}, ErrClosed
	}
	defer o.g.leave()
	r := C.kdn_go_op_result(o.op)
	return kvResult(&r.result), newError(r.status, r.msg)
}

// FailedRanges are the ranges of a load's prefix that could not be read
// (recompute only those).
func (o *Op) FailedRanges() ([]TokenRange, error) {
	if !o.g.enter() {
		return nil, ErrClosed
	}
	defer o.g.leave()
	for capacity := 8; ; {
		buf := make([]C.kdn_token_range, capacity)
		var n C.size_t
		if err := retError(C.kdn_go_op_failed_ranges(o.op, &buf[0], C.size_t(capacity), &n)); err != nil {
			return nil, err
		}
		if int(n) <= capacity {
			out := make([]TokenRange, int(n))
			for i := range out {
				out[i] = TokenRange{Begin: uint64(buf[i].begin), End: uint64(buf[i].end)}
			}
			return out, nil
		}
		capacity = int(n)
	}
}

// Close cancels the op if it still runs, waits until kdn no longer uses
// its memory, and frees it (a HostBuffer's memory, when the buffer was
// closed and this op was its last user). Idempotent.
//
// Inside an editor callback (on the runtime's mover thread) Close returns
// at once, as kdn.h's kdn_op_destroy does there: the op is closed (later
// calls get ErrClosed), and it is cancelled, waited for and freed on a
// goroutine of its own; its buffer stays in use until then.
func (o *Op) Close() error {
	if o == nil {
		return nil
	}
	o.g.closeThen(func() {
		runtime.SetFinalizer(o, nil)
		C.kdn_op_destroy(o.op)
		o.op = nil
		if o.buf != nil {
			o.buf.release()
		}
		o.core.release()
	})
	return nil
}

// SPDX-License-Identifier: Apache-2.0
// Package kdn is the Go binding of kdn, the KV-cache runtime: a runtime of
// storage tiers, models registered with it, and the calls that store, find
// and load a model's KV (synchronously, or layer by layer in the
// background), named knowledge items, and the runtime's statistics.
//
// It calls libkdn's C ABI (kdn/kdn.h) through cgo, and finds the header and
// the library with pkg-config (package kdn): an installed kdn.pc, or a build
// tree's kdn-uninstalled.pc, whose flags carry a run path to libkdn.so:
//
//	PKG_CONFIG_PATH=<kdn>/build/pkgconfig go test ./...
//
// # Contexts
//
// The calls that can wait on a remote or redis tier take a context.Context
// first. Every one of them returns ctx.Err() without calling kdn when ctx
// has ended already. Lookups (no side effects) also return ctx.Err() as
// soon as ctx ends while kdn works; Store, Retrieve and the knowledge calls
// cannot be given up once started (kdn reads or writes the caller's memory
// until it returns) and wait at most a tier's Timeout per call to it; Op's
// waits return ctx.Err() when ctx ends (the op goes on until Cancel).
//
// # Errors
//
// Every failure is a *Error carrying the kdn status and its message; compare
// with errors.Is against the sentinels (ErrNotFound, ErrBusy, ...) or ask the
// family (IsCaller, IsRetryable). A cache miss is not an error: lookups and
// retrieves succeed with 0 tokens. A batched lookup reports each request's
// own status in its result.
//
// # Resources
//
// Runtime, Model, Op and HostBuffer have Close, which is idempotent; a
// closed handle returns ErrClosed without reaching C. A finalizer closes a
// forgotten handle as a backstop only: close them yourself. A HostBuffer's
// finalizer never frees memory that a slice from its Bytes may still use:
// such a buffer is freed only by Close, after which its slices are invalid.
// Models and ops
// stay usable after their Runtime is closed (the C runtime lives on until
// the last of them is closed).
//
// # Memory
//
// KV goes between kdn and the caller's []byte without copies (Float32s and
// Uint16s view typed slices as bytes). The views (KVView) describe where
// each layer's K and V lie inside that one slice. Two things the C ABI
// allows cannot be said from Go, because Go 1.19 cannot pin memory for C:
// per-layer K and V in separate Go allocations (use one slice and the
// per-layer offsets KOffsets/VOffsets), and Go memory in an asynchronous
// load or save, which C keeps using after the call returns: those take a
// C-allocated HostBuffer.
//
// KV in a GPU's memory (since 1.5) is a DeviceMemory: an address the caller
// vouches for (never Go memory), given to StoreDevice, RetrieveDevice,
// LoadAsyncDevice and SaveAsyncDevice with the same views, and an optional
// CUDA stream (since 1.8). A runtime created with Device DeviceEmulated
// takes C-allocated host memory instead (HostBuffer.EmulatedDevice) and runs
// every device path on the CPU, for tests without a GPU.
//
// # Threads
//
// Runtime, Model and Op are safe for concurrent use (as kdn.h says of their
// handles). An editor (NewRuntimeWithEditor) runs on the runtime's mover
// thread, a thread Go did not create; it may Close handles, which then
// release them on a goroutine of their own (see Editor).
package kdn

/*
#cgo CFLAGS: -DKDN_EXPERIMENTAL
#cgo pkg-config: kdn
#include <stdlib.h>
#include "kdn_go.h"
*/
import "C"

import (
	"math"
	"reflect"
	"strconv"
	"unsafe"
)

// The version of kdn's ABI this package was written for. It builds with
// any kdn.h of that major version and at least that minor (abi_check.go),
// and NewRuntime refuses, with ErrVersion, a library of another major
// version or of an older minor (whose structs lack fields it uses).
const (
	BindingVersionMajor = 1
	// 14: RuntimeOptions.EncryptionKeyFile and EncryptionKeyEnv
	// (kdn_runtime_options.encryption_key_file, encryption_key_env);
	// 13: Request.Salt (kdn_request.salt), TierConfig.Quotas
	// (kdn_tier_config.quotas).
	BindingVersionMinor = 14
)

// The version of kdn.h this package was built with: BindingVersionMajor,
// and a minor of at least BindingVersionMinor.
const (
	HeaderVersionMajor = C.KDN_VERSION_MAJOR
	HeaderVersionMinor = C.KDN_VERSION_MINOR
	HeaderVersionPatch = C.KDN_VERSION_PATCH
)

// Version is the library's version, "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.kdn_version()) }

// VersionNumber is the library's version as MAJOR*10000 + MINOR*100 + PATCH.
func VersionNumber() uint32 { return uint32(C.kdn_version_number()) }

// libraryVersionNumber is VersionNumber (a variable for the tests).
var libraryVersionNumber = VersionNumber

// checkLibraryVersion says whether a library of version number (MAJOR*10000
// + MINOR*100 + PATCH) can serve this package: the same major version, and
// a minor no older than BindingVersionMinor.
func checkLibraryVersion(number uint32) error {
	major, minor := number/10000, number/100%100
	if major == BindingVersionMajor && minor >= BindingVersionMinor {
		return nil
	}
	v := func(n uint32) string { return strconv.Itoa(int(n)) }
	return &Error{Status: StatusVersion, Message: "libkdn " + v(major) + "." + v(minor) + "." + v(number%100) +
		" is not usable by this Go binding: it needs libkdn " + v(BindingVersionMajor) + "." +
		v(BindingVersionMinor) + " or a later " + v(BindingVersionMajor) + ".x (libkdn.so." + v(BindingVersionMajor) + ")"}
}

// DType is the element type of a model's KV.
type DType int32

const (
	F32  DType = 0
	F16  DType = 1
	BF16 DType = 2
)

// Size is the bytes of one element (0 for a type this package does not know).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case BF16:
		return "bf16"
	}
	return "dtype(" + strconv.Itoa(int(d)) + ")"
}

// Float32s views s as bytes (same memory, no copy).
func Float32s(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*4)
}

// Uint16s views s (F16 or BF16 elements) as bytes (same memory, no copy).
func Uint16s(s []uint16) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*2)
}

// AsFloat32s views b as float32s (same memory; b's length a multiple of 4
// and its start 4-byte aligned, as any []byte from make is).
func AsFloat32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// strPtr is s's bytes for a call (borrowed: C must not keep it).
func strPtr(s string) *C.char {
	if len(s) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer((*reflect.StringHeader)(unsafe.Pointer(&s)).Data))
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func int32sPtr(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&s[0]))
}

func fitsUint32(i int) bool { return i >= 0 && uint64(i) <= math.MaxUint32 }

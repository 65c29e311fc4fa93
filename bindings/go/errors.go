// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include <stdlib.h>
#include "kdn_go.h"
*/
import "C"

import (
	"errors"
	"strconv"
	"unsafe"
)

// Status is a kdn status code: StatusOK or a negative code. The list is
// open: a newer library may return a code this package does not name.
type Status int32

const (
	StatusOK              Status = 0
	StatusInvalidArgument Status = -1
	StatusNotFound        Status = -2
	StatusBusy            Status = -3
	StatusUnavailable     Status = -4
	StatusCorrupt         Status = -5
	StatusUnsupported     Status = -6
	StatusNoMemory        Status = -7
	StatusInternal        Status = -8
	StatusTimeout         Status = -9
	StatusCancelled       Status = -10
	StatusVersion         Status = -11
	StatusBufferTooSmall  Status = -12
)

var statusNames = map[Status]string{
	StatusOK:              "KDN_OK",
	StatusInvalidArgument: "KDN_ERR_INVALID_ARGUMENT",
	StatusNotFound:        "KDN_ERR_NOT_FOUND",
	StatusBusy:            "KDN_ERR_BUSY",
	StatusUnavailable:     "KDN_ERR_UNAVAILABLE",
	StatusCorrupt:         "KDN_ERR_CORRUPT",
	StatusUnsupported:     "KDN_ERR_UNSUPPORTED",
	StatusNoMemory:        "KDN_ERR_NO_MEMORY",
	StatusInternal:        "KDN_ERR_INTERNAL",
	StatusTimeout:         "KDN_ERR_TIMEOUT",
	StatusCancelled:       "KDN_ERR_CANCELLED",
	StatusVersion:         "KDN_ERR_VERSION",
	StatusBufferTooSmall:  "KDN_ERR_BUFFER_TOO_SMALL",
}

// String is the C name of the status ("KDN_ERR_NOT_FOUND").
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return "KDN_ERR_UNKNOWN(" + strconv.Itoa(int(s)) + ")"
}

// Caller says the call was wrong and retrying it unchanged cannot help:
// invalid argument, version, buffer too small.
func (s Status) Caller() bool {
	return s == StatusInvalidArgument || s == StatusVersion || s == StatusBufferTooSmall
}

// Retryable says the same call may succeed later: busy, unavailable, timeout.
func (s Status) Retryable() bool {
	return s == StatusBusy || s == StatusUnavailable || s == StatusTimeout
}

// Error is a failed kdn call: its status and kdn's message (for humans).
type Error struct {
	Status  Status
	Message string
	// Needed is, for StatusBufferTooSmall, the length the call needs
	// (KnowledgeFetch: the document's tokens); 0 otherwise.
	Needed uint64
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "kdn: " + e.Status.String()
	}
	return "kdn: " + e.Status.String() + ": " + e.Message
}

// Is matches the sentinel of e's status (errors.Is(err, kdn.ErrNotFound))
// and its family (ErrCaller, ErrRetryable).
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case sentinel:
		return Status(t) == e.Status
	case family:
		return (t == familyCaller && e.Status.Caller()) || (t == familyRetryable && e.Status.Retryable())
	}
	return false
}

type sentinel Status

func (s sentinel) Error() string { return "kdn: " + Status(s).String() }

type family int

const (
	familyCaller family = iota
	familyRetryable
)

func (f family) Error() string {
	if f == familyCaller {
		return "kdn: caller error"
	}
	return "kdn: retryable error"
}

// The sentinels: errors.Is(err, kdn.ErrNotFound) is true for any *Error
// with that status.
var (
	ErrInvalidArgument error = sentinel(StatusInvalidArgument)
	ErrNotFound        error = sentinel(StatusNotFound)
	ErrBusy            error = sentinel(StatusBusy)
	ErrUnavailable     error = sentinel(StatusUnavailable)
	ErrCorrupt         error = sentinel(StatusCorrupt)
	ErrUnsupported     error = sentinel(StatusUnsupported)
	ErrNoMemory        error = sentinel(StatusNoMemory)
	ErrInternal        error = sentinel(StatusInternal)
	ErrTimeout         error = sentinel(StatusTimeout)
	ErrCancelled       error = sentinel(StatusCancelled)
	ErrVersion         error = sentinel(StatusVersion)
	ErrBufferTooSmall  error = sentinel(StatusBufferTooSmall)

	// ErrCaller matches every error of the caller family (fix the call).
	ErrCaller error = familyCaller
	// ErrRetryable matches every error that may go away on retry.
	ErrRetryable error = familyRetryable
)

// ErrClosed is returned by any use of a closed Runtime, Model, Op or
// HostBuffer. It belongs to the caller family.
var ErrClosed = errors.New("kdn: use of a closed handle")

// IsCaller says err is the caller's mistake: invalid argument, version,
// buffer too small, or a closed handle.
func IsCaller(err error) bool { return errors.Is(err, ErrCaller) || errors.Is(err, ErrClosed) }

// IsRetryable says the same call may succeed later: busy, unavailable, timeout.
func IsRetryable(err error) bool { return errors.Is(err, ErrRetryable) }

// StatusOf is err's kdn status: StatusOK for nil, StatusInvalidArgument for
// ErrClosed or an error that is not kdn's, else the *Error's status.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	var s sentinel
	if errors.As(err, &s) {
		return Status(s)
	}
	return StatusInvalidArgument
}

// newError turns a shim's status and message into an error (nil for OK),
// freeing the message.
func newError(status C.kdn_status, msg *C.char) error {
	if msg != nil {
		defer C.free(unsafe.Pointer(msg))
	}
	if status == C.KDN_OK {
		return nil
	}
	e := &Error{Status: Status(status)}
	if msg != nil {
		e.Message = C.GoString(msg)
	}
	return e
}

func retError(r C.kdn_go_ret) error { return newError(r.status, r.msg) }

// invalid is an error found on the Go side, before calling kdn.
func invalid(msg string) error { return &Error{Status: StatusInvalidArgument, Message: msg} }

// statusCName is libkdn's own name of a status (the tests compare it with String).
func statusCName(s Status) string { return C.GoString(C.kdn_status_string(C.kdn_status(s))) }

// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include "kdn_go.h"
*/
import "C"

import (
	"context"
	"math"
	"time"
)

// DocumentInfo describes a knowledge item.
type DocumentInfo struct {
	DocID         string
	Pinned        bool
	Version       uint64
	NumTokens     uint64
	Chunks        uint32
	ChunksPresent uint32        // chunks some tier holds now
	ExpiresIn     time.Duration // negative: never
	Hits          uint64        // chunks of it served (fetches, blends) since this version was put (since 1.4)
	PinExpiresIn  time.Duration // pinned with a TTL: until the pin ends; negative: not pinned, or until unpinned (1.4)
}

func documentInfo(d *C.kdn_document_info) DocumentInfo {
	n := int(d.doc_id_len)
	if n > len(d.doc_id)-1 {
		n = len(d.doc_id) - 1
	}
	id := C.GoStringN(&d.doc_id[0], C.int(n))
	exp := duration(int64(d.expires_in_ms))
	return DocumentInfo{DocID: id, Pinned: d.pinned != 0, Version: uint64(d.version), NumTokens: uint64(d.num_tokens),
		Chunks: uint32(d.chunks), ChunksPresent: uint32(d.chunks_present), ExpiresIn: exp, Hits: uint64(d.hits),
		PinExpiresIn: duration(int64(d.pin_expires_in_ms))}
}

// KnowledgePut stores a document: its id (1..255 bytes), version, metadata,
// tokens and their KV computed from position 0, read from data through the
// views (none: canonical). It replaces an older version of the same id.
// ErrBusy when the runtime's document index is full.
//
// A ctx that has ended returns ctx.Err() and stores nothing; once started,
// the put is not interrupted by ctx (as Store: kdn reads data until it
// returns, waiting for a remote or redis tier at most its Timeout).
func (m *Model) KnowledgePut(ctx context.Context, ns, docID string, version uint64, metadata string, tokens []int32,
	data []byte, views ...KVView) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	if !m.g.enter() {
		return ErrClosed
	}
	defer m.g.leave()
	a, err := m.views(views, len(data))
	if err != nil {
		return err
	}
	if _, err := a.placeState(nil, 0, stateNone); err != nil {
		return err
	}
	tmpl, aux := a.tmplPtr()
	return retError(C.kdn_go_knowledge_put(m.m, strPtr(ns), C.size_t(len(ns)), strPtr(docID), C.size_t(len(docID)),
		C.uint64_t(version), strPtr(metadata), C.size_t(len(metadata)), int32sPtr(tokens), C.size_t(len(tokens)),
		tmpl, aux, C.size_t(len(a.tmpl)), a.layersPtr(), a.offsetsPtr(), int32sPtr(a.table), bytesPtr(data),
		C.size_t(len(data))))
}

// KnowledgeFetch reads a document's tokens into tokens (nil: none) and its
// KV into data through the views, under one snapshot of the document. With
// no views, data (nil: no KV) is the canonical layout for as many tokens
// as it holds. The result's Tokens is the document's length. When tokens or
// the views are shorter than the document nothing is written and the error
// is ErrBufferTooSmall, whose Needed is the document's length.
// ErrNotFound: no such document, or its KV is gone.
//
// A ctx that has ended returns ctx.Err() and writes nothing; once started,
// the fetch is not interrupted by ctx (as Retrieve: kdn writes data and
// tokens until it returns, waiting for a remote or redis tier at most its
// Timeout).
func (m *Model) KnowledgeFetch(ctx context.Context, ns, docID string, tokens []int32, data []byte,
	views ...KVView) (KVResult, error) {
	if err := ctxErr(ctx); err != nil {
		return KVResult{}, err
	}
	if !m.g.enter() {
		return KVResult{}, ErrClosed
	}
	defer m.g.leave()
	var a kvArgs
	if len(views) > 0 || data != nil {
		if len(views) == 0 {
			room := uint64(0)
			if m.bytesPerToken > 0 {
				room = uint64(len(data)) / m.bytesPerToken
			}
			if room == 0 { // kdn would read a view of 0 tokens as "the document's length"
				d, err := m.info(ns, docID)
				if err != nil {
					return KVResult{}, err
				}
				return KVResult{}, &Error{Status: StatusBufferTooSmall, Needed: d.NumTokens,
					Message: "KnowledgeFetch: data holds less than one token's KV"}
			}
			views = []KVView{{DType: m.spec.DType, NumTokens: room}}
		}
		var err error
		if a, err = m.views(views, len(data)); err != nil {
			return KVResult{}, err
		}
		if _, err = a.placeState(nil, 0, stateNone); err != nil {
			return KVResult{}, err
		}
	}
	tmpl, aux := a.tmplPtr()
	r := C.kdn_go_knowledge_fetch(m.m, strPtr(ns), C.size_t(len(ns)), strPtr(docID), C.size_t(len(docID)),
		int32sPtr(tokens), C.size_t(len(tokens)), tmpl, aux, C.size_t(len(a.tmpl)), a.layersPtr(), a.offsetsPtr(),
		int32sPtr(a.table), bytesPtr(data), C.size_t(len(data)))
	res := kvResult(&r.result)
	err := newError(r.status, r.msg)
	if e, ok := err.(*Error); ok && e.Status == StatusBufferTooSmall {
		e.Needed = res.Tokens
	}
	return res, err
}

// KnowledgeInfo describes one document. ErrNotFound: no such document.
func (m *Model) KnowledgeInfo(ns, docID string) (DocumentInfo, error) {
	if !m.g.enter() {
		return DocumentInfo{}, ErrClosed
	}
	defer m.g.leave()
	return m.info(ns, docID)
}

func (m *Model) info(ns, docID string) (DocumentInfo, error) {
	var d C.kdn_document_info
	if err := retError(C.kdn_go_knowledge_info(m.m, strPtr(ns), C.size_t(len(ns)), strPtr(docID),
		C.size_t(len(docID)), &d)); err != nil {
		return DocumentInfo{}, err
	}
	return documentInfo(&d), nil
}

// KnowledgeList lists the model's documents in the namespace, by id.
func (m *Model) KnowledgeList(ns string) ([]DocumentInfo, error) {
	if !m.g.enter() {
		return nil, ErrClosed
	}
	defer m.g.leave()
	for capacity := 16; ; {
		buf := make([]C.kdn_document_info, capacity)
		var n C.size_t
		if err := retError(C.kdn_go_knowledge_list(m.m, strPtr(ns), C.size_t(len(ns)), &buf[0],
			C.size_t(capacity), &n)); err != nil {
			return nil, err
		}
		if int(n) <= capacity {
			out := make([]DocumentInfo, int(n))
			for i := range out {
				out[i] = documentInfo(&buf[i])
			}
			return out, nil
		}
		capacity = int(n) // more documents than room: again, with room for all
	}
}

// Match finds where the chunks of the namespace's knowledge items
// (KnowledgePut) occur in a context's tokens, at any offset: the ranges
// [Begin, End) of tokens, ascending and not overlapping (consecutive chunks
// of one document that follow each other are one range). The tokens
// outside them are the ones the engine must compute. Each hit is confirmed
// by the chunk's content key, so a hash collision never matches. Since 1.9,
// kdn_kv_match, in kdn.h's experimental section (it may change in a minor
// release).
//
// Matching reads kdn's index, not the tiers: it never waits on a remote
// tier (so it takes no context), and a range whose chunks were evicted
// since is still reported. No tokens, or a negative id: ErrInvalidArgument.
func (m *Model) Match(ns string, tokens []int32) ([]TokenRange, error) {
	if !m.g.enter() {
		return nil, ErrClosed
	}
	defer m.g.leave()
	for capacity := 8; ; {
		buf := make([]C.kdn_token_range, capacity)
		var n C.size_t
		if err := retError(C.kdn_go_kv_match(m.m, strPtr(ns), C.size_t(len(ns)), int32sPtr(tokens),
			C.size_t(len(tokens)), &buf[0], C.size_t(capacity), &n)); err != nil {
			return nil, err
		}
		if int(n) <= capacity {
			out := make([]TokenRange, int(n))
			for i := range out {
				out[i] = TokenRange{Begin: uint64(buf[i].begin), End: uint64(buf[i].end)}
			}
			return out, nil
		}
		capacity = int(n) // more ranges than room (a put may add some meanwhile): again, with room for all
	}
}

// millis is d in whole milliseconds for kdn, where 0 means "no wait",
// "now", "until unpinned" or "the default": a positive d is rounded up (never
// to 0: 1ns..1ms is 1 ms) and capped at max; any negative d is -1 (kdn's
// "no limit" where negative has a meaning; callers refuse it elsewhere).
func millis(d time.Duration, max int64) int64 {
	if d < 0 {
		return -1
	}
	ms := int64(d / time.Millisecond)
	if d%time.Millisecond != 0 {
		ms++
	}
	if ms > max {
		return max
	}
	return ms
}

// duration is kdn's milliseconds as a Duration: negative ones -1, those
// past a Duration's range the longest Duration.
func duration(ms int64) time.Duration {
	switch {
	case ms < 0:
		return -1
	case ms > int64(math.MaxInt64/time.Millisecond):
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// KnowledgePin pins every chunk of the document for ttl (0: until
// unpinned; a positive ttl is rounded up to whole milliseconds).
func (m *Model) KnowledgePin(ns, docID string, ttl time.Duration) error {
	return m.admin(0, ns, docID, ttl)
}

// KnowledgeUnpin unpins the document.
func (m *Model) KnowledgeUnpin(ns, docID string) error { return m.admin(1, ns, docID, 0) }

// KnowledgeExpire deletes the document ttl from now (0: now; a positive
// ttl is rounded up to whole milliseconds).
func (m *Model) KnowledgeExpire(ns, docID string, ttl time.Duration) error {
	return m.admin(2, ns, docID, ttl)
}

// KnowledgeDelete removes the document's chunks from every tier (chunks
// another document shares stay).
func (m *Model) KnowledgeDelete(ns, docID string) error { return m.admin(3, ns, docID, 0) }

func (m *Model) admin(which C.int, ns, docID string, ttl time.Duration) error {
	if !m.g.enter() {
		return ErrClosed
	}
	defer m.g.leave()
	if ttl < 0 {
		return invalid("the TTL is negative")
	}
	return retError(C.kdn_go_knowledge_admin(which, m.m, strPtr(ns), C.size_t(len(ns)), strPtr(docID),
		C.size_t(len(docID)), C.int64_t(millis(ttl, math.MaxInt64))))
}

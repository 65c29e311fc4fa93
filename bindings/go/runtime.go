// SPDX-License-Identifier: Apache-2.0
package kdn

/*
#include <stdlib.h>
#include "kdn_go.h"
*/
import "C"

import (
	"math"
	"runtime"
	"runtime/cgo"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// TierKind is the kind of a storage tier.
type TierKind int32

const (
	TierHost   TierKind = 0 // host memory
	TierDevice TierKind = 1 // GPU memory (host memory standing in without a GPU)
	TierDisk   TierKind = 2 // one file per chunk, checksummed
	TierRemote TierKind = 3 // a kdnd node (since 1.1)
	TierRedis  TierKind = 4 // Redis, Redis Cluster or Valkey (since 1.3)
)

func (k TierKind) String() string {
	switch k {
	case TierHost:
		return "host"
	case TierDevice:
		return "device"
	case TierDisk:
		return "disk"
	case TierRemote:
		return "remote"
	case TierRedis:
		return "redis"
	}
	return "tier(" + strconv.Itoa(int(k)) + ")"
}

// EvictionPolicy is how a tier chooses what to evict.
type EvictionPolicy int32

const (
	EvictLRU    EvictionPolicy = 0
	EvictS3FIFO EvictionPolicy = 1 // scan-resistant
	EvictCost   EvictionPolicy = 2 // cost-aware, GreedyDual-Size-Frequency (since 1.5)
)

// TierConfig is one tier of a runtime. The zero value is not valid:
// CapacityBytes must be set (use HostTier, DiskTier, DeviceTier, RemoteTier,
// RedisTier).
type TierConfig struct {
	Kind          TierKind
	CapacityBytes uint64 // must not be 0
	Path          string // disk: the directory (created if absent)
	Policy        EvictionPolicy
	HighWatermark float32 // 0: 0.95
	LowWatermark  float32 // 0: 0.85
	WriteThrough  bool    // new chunks are copied to the next tier too
	// Codec is how the tier stores chunks ("raw", "zstd", "fp8", "int8",
	// "kivi2", "cachegen", "kdn", ...); empty: raw in memory, zstd on disk
	// and remote, "kdn:balanced" (lossy) on redis.
	Codec string
	// Remote tiers: the kdnd's "host:port" or "unix:/path", its bearer
	// token, the deadline of each call (0: 2 s; rounded up to whole
	// milliseconds, at most about 49 days; negative: ErrInvalidArgument),
	// and TLS.
	Address       string
	Token         string
	Timeout       time.Duration
	TLSCAFile     string
	TLSServerName string
	// Redis tiers (since 1.3) read Address ("host:port" of one node or
	// more, comma-separated; of a cluster, any of its nodes), Token (the
	// password; empty: no AUTH) and Timeout (each command's deadline), and:
	// User, the ACL user of AUTH (needs a password; empty: the password
	// alone), and TTL, after which the keys expire (0: never; rounded up to
	// whole milliseconds; negative: ErrInvalidArgument). Other kinds refuse
	// User and TTL (ErrInvalidArgument). A malformed address or a refused
	// AUTH fails NewRuntime; a server that is not there is missed until it
	// answers.
	User string
	TTL  time.Duration
	// Levels (since 1.6), for remote and redis tiers: quality levels, codec
	// specs finest first (say "zstd", "kdn:hifi", "kdn:balanced"), at most
	// 8; Codec must then be empty. Every chunk is kept at each level side by
	// side; a load whose request sets TTFTTarget fetches each chunk at the
	// finest level that arrives in time at the link rate the runtime
	// measures, and leaves a chunk to recompute when no level would. Loads
	// without a target get the finest level. Empty: one level, Codec. Other
	// kinds, a level that is empty or not a codec, or one holding ';':
	// ErrInvalidArgument.
	Levels []string
	// Quotas (since 1.13): namespaces' quotas in this tier, one per
	// namespace, at most 4096 (docs/security.md, "Quotas"). A namespace's
	// chunks take at most Bytes of the tier, counted as the tier counts its
	// capacity (a memory tier's whole 4 KiB pages per chunk, a disk tier's
	// encoded bytes). Over it, a store in that namespace evicts the
	// namespace's own coldest chunks (by Policy), never another's; a chunk
	// larger than its quota goes to the next tier. When the tier itself is
	// full, chunks of namespaces without a quota go first. Use and
	// evictions: Runtime.QuotaStats. Remote tiers take none (a kdnd applies
	// its own); a namespace twice, an empty one or one over 4096 bytes:
	// ErrInvalidArgument from NewRuntime.
	Quotas []Quota
}

// Quota is one namespace's quota in a tier (TierConfig.Quotas, since 1.13).
type Quota struct {
	Namespace string // as the KV calls name it
	Bytes     uint64 // the most bytes of the tier its chunks may take; 0: they skip the tier
}

// HostTier is a host-memory tier of capacity bytes.
func HostTier(capacity uint64) TierConfig { return TierConfig{Kind: TierHost, CapacityBytes: capacity} }

// DeviceTier is a device-memory tier of capacity bytes.
func DeviceTier(capacity uint64) TierConfig {
	return TierConfig{Kind: TierDevice, CapacityBytes: capacity}
}

// DiskTier is a tier of files under dir, of capacity bytes.
func DiskTier(dir string, capacity uint64) TierConfig {
	return TierConfig{Kind: TierDisk, CapacityBytes: capacity, Path: dir}
}

// RemoteTier is a kdnd node at address, reached with token.
func RemoteTier(address, token string) TierConfig {
	return TierConfig{Kind: TierRemote, CapacityBytes: 1 << 30, Address: address, Token: token}
}

// RedisTier is a Redis, Redis Cluster or Valkey at address ("host:port",
// comma-separated seeds), authenticated with password (empty: no AUTH).
func RedisTier(address, password string) TierConfig {
	return TierConfig{Kind: TierRedis, CapacityBytes: 1 << 30, Address: address, Token: password}
}

// tierMillis is a tier's Duration field as kdn's milliseconds: 0 stays 0
// (the default), a positive one is rounded up to whole milliseconds (so
// never 0) and capped at max (Timeout: the largest uint32, about 49 days);
// negative is refused, naming the field.
func tierMillis(field string, d time.Duration, max int64) (int64, error) {
	if d < 0 {
		return 0, invalid("TierConfig." + field + " is negative")
	}
	return millis(d, max), nil
}

// RuntimeOptions says how to create a runtime. Zero fields take kdn's
// defaults; a nil *RuntimeOptions is all defaults.
type RuntimeOptions struct {
	ChunkTokens       uint32 // tokens per stored chunk; 0: 256
	HostCapacityBytes uint64 // the host tier's capacity when Tiers is empty; 0: 1 GiB
	HashSeed          uint64 // runtimes that share KV must share the seed
	Tiers             []TierConfig
	WorkerThreads     uint32 // background loads and saves; 0: 2
	// The GPU the runtime delivers KV to (since 1.5): for DeviceMemory and
	// device tiers. DeviceOrdinal is the CUDA device (negative:
	// ErrInvalidArgument).
	Device        DeviceMode
	DeviceOrdinal int32
	// LoadSlowerThanPrefill (since 1.7): load every cached chunk, however
	// slow its tier. false (the default): never slower than prefill: once
	// the engine has reported its prefill time (Model.ReportPrefill), a load
	// leaves to recompute the cached chunks whose delivery, at the rate
	// measured for their tier (TierStats.DeliveryNsPerToken), would take
	// longer than prefilling them (its prefix ends before them; a load op
	// reports them in FailedRanges), counted in Stats.RecomputeTokens.
	LoadSlowerThanPrefill bool
	// SecretFile (since 1.8): a file holding the deployment's secret (at
	// least 32 bytes; readable by the service only). Every chunk a redis or
	// disk tier stores is sealed with it, and a chunk read back counts only
	// if sealed with it: any other is a miss, counted in
	// TierStats.AuthFailures. Runtimes that share such a tier share the
	// secret. Empty: none (a tier serves whatever its server or directory
	// holds). A file that cannot be read, is open to others or is too
	// short: ErrInvalidArgument.
	SecretFile string
	// Encryption at rest (since 1.14; docs/security.md): the master keys,
	// from a file (EncryptionKeyFile: readable by the service only, mode
	// 600 or 640) or from an environment variable (EncryptionKeyEnv: the
	// variable's name, not the keys), at most one of the two. One key per
	// line as 64 hex digits (`openssl rand -hex 32`): the first encrypts,
	// every one decrypts (to rotate, put the new key first and keep the old
	// ones while their chunks matter). With them, every chunk a disk, redis
	// or remote tier sends out of the process is encrypted with AES-256-GCM
	// under its namespace's key (HKDF-SHA256 of the master key) and
	// decrypted when read back; one that does not open (another key,
	// damaged or forged bytes) is a miss, counted in TierStats.AuthFailures.
	// Runtimes that share such a tier share the keys. Empty: none (an
	// encrypted chunk read back is such a miss). Both set, a source that
	// cannot be read or is open to others, an unset variable, or a line that
	// is not a key: ErrInvalidArgument from NewRuntime (its message never
	// holds a key).
	EncryptionKeyFile string
	EncryptionKeyEnv  string
}

// core is what a runtime's handles share: the C runtime is refcounted by
// its models and ops, and the editor must outlive the last of them.
type core struct {
	mu     sync.Mutex
	refs   int
	editor cgo.Handle // 0: none
}

func (c *core) acquire() {
	c.mu.Lock()
	c.refs++
	c.mu.Unlock()
}

func (c *core) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs--
	if c.refs == 0 && c.editor != 0 {
		c.editor.Delete()
		c.editor = 0
	}
}

// guard makes Close wait for the calls in progress and later calls fail
// with ErrClosed.
type guard struct {
	mu     sync.RWMutex // held shared by each call in progress
	closed atomic.Bool
}

func (g *guard) enter() bool {
	g.mu.RLock()
	if g.closed.Load() {
		g.mu.RUnlock()
		return false
	}
	return true
}

func (g *guard) leave() { g.mu.RUnlock() }

// closeThen marks the guard closed (later calls fail with ErrClosed), then
// waits for the calls in progress and runs release, which frees the handle;
// nothing when the guard was closed already.
//
// Inside an editor callback, the wait and release run on a goroutine of
// their own instead, and closeThen returns at once. There, on the runtime's
// mover thread, kdn's destroy functions only defer their work to a thread of
// their own (kdn.h, kdn_runtime_create_with_editor), and Go would not know
// when it is done: an op's buffer, or the editor's handle, could be freed
// while kdn still uses them. The goroutine runs on another thread (the mover
// thread stays locked to the callback), so the destroy there is an ordinary
// one: it waits for what it must (an op's load; the mover thread, which the
// callback's return frees), then release frees what Go holds. A call in
// progress that waits on the mover thread (a store pushing back on its
// queue) would deadlock a wait inside the callback; on the goroutine it
// simply ends once the callback has returned.
func (g *guard) closeThen(release func()) {
	if !g.closed.CompareAndSwap(false, true) {
		return
	}
	drainAndRelease := func() {
		g.mu.Lock() // the calls that entered before the mark have left
		g.mu.Unlock()
		release()
	}
	if C.kdn_go_in_editor() != 0 {
		go drainAndRelease()
		return
	}
	drainAndRelease()
}

// Runtime is a kdn runtime: the store and its tiers. Safe for concurrent
// use. Close it when done; its models and ops stay usable after.
type Runtime struct {
	g    guard
	rt   *C.kdn_runtime
	core *core
	// The namespaces of each tier's quotas, in the order given (for
	// QuotaStats.Namespace); nil: no tier has quotas.
	quotaNamespaces [][]string
}

// NewRuntime creates a runtime. ErrVersion when the libkdn loaded is not
// one this package can use (see BindingVersionMajor).
func NewRuntime(opts *RuntimeOptions) (*Runtime, error) { return newRuntime(opts, nil) }

func newRuntime(opts *RuntimeOptions, editor Editor) (*Runtime, error) {
	if err := checkLibraryVersion(libraryVersionNumber()); err != nil {
		return nil, err
	}
	var o C.kdn_runtime_options
	if err := newError(C.kdn_runtime_options_init(&o, C.sizeof_kdn_runtime_options), nil); err != nil {
		return nil, err
	}
	var free []unsafe.Pointer
	defer func() {
		for _, p := range free {
			C.free(p)
		}
	}()
	cstr := func(s string) (*C.char, C.size_t) {
		if s == "" {
			return nil, 0
		}
		p := C.CString(s)
		free = append(free, unsafe.Pointer(p))
		return p, C.size_t(len(s))
	}
	if opts != nil {
		if opts.ChunkTokens != 0 {
			o.chunk_tokens = C.uint32_t(opts.ChunkTokens)
		}
		if opts.HostCapacityBytes != 0 {
			o.host_capacity_bytes = C.uint64_t(opts.HostCapacityBytes)
		}
		o.hash_seed = C.uint64_t(opts.HashSeed)
		o.worker_threads = C.uint32_t(opts.WorkerThreads)
		o.device = C.kdn_device_mode(opts.Device)
		o.device_ordinal = C.int32_t(opts.DeviceOrdinal)
		if opts.LoadSlowerThanPrefill {
			o.load_slower_than_prefill = 1
		}
		o.secret_file, o.secret_file_len = cstr(opts.SecretFile)
		o.encryption_key_file, o.encryption_key_file_len = cstr(opts.EncryptionKeyFile)
		o.encryption_key_env, o.encryption_key_env_len = cstr(opts.EncryptionKeyEnv)
		if n := len(opts.Tiers); n > 0 {
			mem := C.calloc(C.size_t(n), C.sizeof_kdn_tier_config)
			if mem == nil {
				return nil, &Error{Status: StatusNoMemory, Message: "out of memory for the tier configs"}
			}
			free = append(free, mem)
			tiers := unsafe.Slice((*C.kdn_tier_config)(mem), n)
			for i, t := range opts.Tiers {
				c := &tiers[i]
				C.kdn_tier_config_init(c, C.sizeof_kdn_tier_config)
				c.kind = C.kdn_tier_kind(t.Kind)
				c.capacity_bytes = C.uint64_t(t.CapacityBytes)
				c.path, c.path_len = cstr(t.Path)
				c.policy = C.kdn_eviction_policy(t.Policy)
				c.high_watermark = C.float(t.HighWatermark)
				c.low_watermark = C.float(t.LowWatermark)
				if t.WriteThrough {
					c.write_through = 1
				}
				c.codec, c.codec_len = cstr(t.Codec)
				c.address, c.address_len = cstr(t.Address)
				c.token, c.token_len = cstr(t.Token)
				ms, err := tierMillis("Timeout", t.Timeout, math.MaxUint32)
				if err != nil {
					return nil, err
				}
				c.timeout_ms = C.uint32_t(ms)
				c.tls_ca_file, c.tls_ca_file_len = cstr(t.TLSCAFile)
				c.tls_server_name, c.tls_server_name_len = cstr(t.TLSServerName)
				c.user, c.user_len = cstr(t.User)
				ttl, err := tierMillis("TTL", t.TTL, math.MaxInt64)
				if err != nil {
					return nil, err
				}
				c.ttl_ms = C.uint64_t(ttl)
				if len(t.Levels) > 0 {
					for _, l := range t.Levels {
						if l == "" || strings.Contains(l, ";") {
							return nil, invalid("TierConfig.Levels: level " + strconv.Quote(l) +
								" is empty or holds ';' (give each level apart)")
						}
					}
					c.levels, c.levels_len = cstr(strings.Join(t.Levels, ";"))
				}
				if len(t.Quotas) > 0 {
					// C memory, freed once kdn_runtime_create has returned
					// (kdn copies the quotas).
					qmem := C.calloc(C.size_t(len(t.Quotas)), C.sizeof_kdn_quota)
					if qmem == nil {
						return nil, &Error{Status: StatusNoMemory, Message: "out of memory for the quotas"}
					}
					free = append(free, qmem)
					quotas := unsafe.Slice((*C.kdn_quota)(qmem), len(t.Quotas))
					for j, q := range t.Quotas {
						C.kdn_quota_init(&quotas[j], C.sizeof_kdn_quota)
						quotas[j].ns, quotas[j].ns_len = cstr(q.Namespace)
						quotas[j].bytes = C.uint64_t(q.Bytes)
					}
					c.quotas = (*C.kdn_quota)(qmem)
					c.num_quotas = C.size_t(len(t.Quotas))
				}
			}
			o.tiers = (*C.kdn_tier_config)(mem)
			o.num_tiers = C.size_t(n)
		}
	}
	c := &core{refs: 1}
	var handle C.uintptr_t
	if editor != nil {
		c.editor = cgo.NewHandle(editor)
		handle = C.uintptr_t(c.editor)
	}
	var rt *C.kdn_runtime
	if err := retError(C.kdn_go_runtime_create(&o, handle, &rt)); err != nil {
		c.release()
		return nil, err
	}
	r := &Runtime{rt: rt, core: c}
	if opts != nil {
		for i, t := range opts.Tiers {
			if len(t.Quotas) == 0 {
				continue
			}
			if r.quotaNamespaces == nil {
				r.quotaNamespaces = make([][]string, len(opts.Tiers))
			}
			for _, q := range t.Quotas {
				r.quotaNamespaces[i] = append(r.quotaNamespaces[i], q.Namespace)
			}
		}
	}
	runtime.SetFinalizer(r, (*Runtime).Close)
	return r, nil
}

// Close releases the runtime. Models and ops made from it stay usable; the
// store is freed with the last of them. Idempotent.
//
// Inside an editor callback, Close returns at once and the release runs on
// a goroutine of its own (see Op.Close).
func (r *Runtime) Close() error {
	if r == nil {
		return nil
	}
	r.g.closeThen(func() {
		runtime.SetFinalizer(r, nil)
		C.kdn_runtime_destroy(r.rt)
		r.rt = nil
		r.core.release()
	})
	return nil
}

// Stats is a runtime's counters.
type Stats struct {
	Lookups, Retrieves, Stores uint64
	Hits, Misses               uint64 // chunks served; loads that stopped short
	TokensServed, TokensStored uint64
	BytesServed, BytesStored   uint64
	Chunks                     uint64 // held now, all tiers
	UsedBytes, CapacityBytes   uint64
	Evictions                  uint64
	EditedServed               uint64 // chunks served that an editor had rewritten
	LeasesActive, PinsActive   uint64
	PinsForcedUnpin            uint64
	CorruptDetected            uint64
	Edits                      uint64 // chunks rewritten by an editor
	// Since 1.4: the hit rate is TokensServed / TokensRequested; the
	// prefills engines reported (Model.ReportPrefill); the prefill time
	// loads saved (each load's tokens served x its model's mean reported
	// prefill time per token then); tokens served while their model had no
	// report (not in TTFTSaved); time spent in loads, hits and misses; the
	// tokens looked-up requests covered, and of them the leading tokens
	// found cached (LookupResult.CachedTokens).
	TokensRequested      uint64
	PrefillTokens        uint64
	PrefillTime          time.Duration
	TTFTSaved            time.Duration
	TokensServedUnpriced uint64
	DeliveryTime         time.Duration
	LookupTokens         uint64
	LookupHitTokens      uint64
	// Since 1.7: cached tokens loads left to recompute, their tiers
	// delivering slower than the engine prefills
	// (RuntimeOptions.LoadSlowerThanPrefill).
	RecomputeTokens uint64
}

// Stats reads the runtime's counters.
func (r *Runtime) Stats() (Stats, error) {
	if !r.g.enter() {
		return Stats{}, ErrClosed
	}
	defer r.g.leave()
	var s C.kdn_stats
	if err := retError(C.kdn_go_stats(r.rt, &s)); err != nil {
		return Stats{}, err
	}
	return Stats{
		Lookups: uint64(s.lookups), Retrieves: uint64(s.retrieves), Stores: uint64(s.stores),
		Hits: uint64(s.hits), Misses: uint64(s.misses),
		TokensServed: uint64(s.tokens_served), TokensStored: uint64(s.tokens_stored),
		BytesServed: uint64(s.bytes_served), BytesStored: uint64(s.bytes_stored),
		Chunks: uint64(s.chunks), UsedBytes: uint64(s.used_bytes), CapacityBytes: uint64(s.capacity_bytes),
		Evictions: uint64(s.evictions), EditedServed: uint64(s.edited_served),
		LeasesActive: uint64(s.leases_active), PinsActive: uint64(s.pins_active),
		PinsForcedUnpin: uint64(s.pins_forced_unpin), CorruptDetected: uint64(s.corrupt_detected),
		Edits:           uint64(s.edits),
		TokensRequested: uint64(s.tokens_requested), PrefillTokens: uint64(s.prefill_tokens),
		PrefillTime: nanos(s.prefill_ns), TTFTSaved: nanos(s.ttft_saved_ns),
		TokensServedUnpriced: uint64(s.tokens_served_unpriced), DeliveryTime: nanos(s.delivery_ns),
		LookupTokens: uint64(s.lookup_tokens), LookupHitTokens: uint64(s.lookup_hit_tokens),
		RecomputeTokens: uint64(s.recompute_tokens),
	}, nil
}

// LatencyKind selects a latency distribution.
type LatencyKind int32

const (
	LatencyLookup LatencyKind = 0 // per looked-up request
	LatencyLoad   LatencyKind = 1 // retrieves and load ops
	LatencyStore  LatencyKind = 2 // stores and save ops
)

// Latency is a latency distribution.
type Latency struct {
	Count                    uint64
	Mean, P50, P90, P99, Max time.Duration
}

func micros(us C.double) time.Duration { return time.Duration(float64(us) * 1e3) }

// nanos is kdn's nanoseconds as a Duration; those past its range (292
// years) the longest Duration.
func nanos(ns C.uint64_t) time.Duration {
	if uint64(ns) > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(ns)
}

// Latency reads one of the runtime's latency distributions.
func (r *Runtime) Latency(kind LatencyKind) (Latency, error) {
	if !r.g.enter() {
		return Latency{}, ErrClosed
	}
	defer r.g.leave()
	var l C.kdn_latency
	if err := retError(C.kdn_go_latency(r.rt, C.kdn_latency_kind(kind), &l)); err != nil {
		return Latency{}, err
	}
	return Latency{Count: uint64(l.count), Mean: micros(l.mean_us), P50: micros(l.p50_us),
		P90: micros(l.p90_us), P99: micros(l.p99_us), Max: micros(l.max_us)}, nil
}

// TierStats is one tier's counters.
type TierStats struct {
	Kind                                      TierKind
	Name                                      string
	Codec                                     string
	Hits, Misses, Puts, PutRefusals           uint64
	Evictions, DemotionsIn, PromotionsIn      uint64
	BytesIn, BytesOut                         uint64
	Objects, UsedBytes, CapacityBytes         uint64
	CorruptDetected, EncodedChunks            uint64
	BytesBeforeEncoding                       uint64
	BytesAfterEncoding                        uint64
	EncodeFailures, DecodeFailures            uint64
	IOErrors                                  uint64 // since 1.2
	RemoteCalls, RemoteFailed, RemoteTimeouts uint64 // remote tiers (1.2); redis tiers: commands (1.3)
	WriteQueueFull, WriteQueuedBytes          uint64 // remote tiers, since 1.2
	// Fractions of capacity: a put that would cross HighWatermark evicts
	// first, down to LowWatermark (since 1.4); 0 and 0: none (remote, redis).
	HighWatermark, LowWatermark float64
	// Since 1.7: how fast this tier delivers, measured on the loads it
	// served (read, decode and copy into the views, per token; a moving
	// average), into host memory and into device memory; 0 until measured.
	// And its chunks loads left to recompute as slower than prefill.
	DeliveryNsPerToken, DeviceDeliveryNsPerToken float64
	RecomputeChunks                              uint64
	// Since 1.8: of CorruptDetected, the chunks whose seal failed (a
	// runtime with a SecretFile: none, another secret's, or a MAC that does
	// not match); since 1.14 also those that do not decrypt (a runtime
	// with EncryptionKeyFile or EncryptionKeyEnv: none, another key's, or
	// damaged or forged bytes; one without keys: any encrypted chunk).
	AuthFailures uint64
}

// TierCount is the number of tiers.
func (r *Runtime) TierCount() (int, error) {
	if !r.g.enter() {
		return 0, ErrClosed
	}
	defer r.g.leave()
	var n C.uint32_t
	if err := retError(C.kdn_go_tier_count(r.rt, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// TierStats reads tier index's counters (0 = the highest tier).
func (r *Runtime) TierStats(index int) (TierStats, error) {
	if !r.g.enter() {
		return TierStats{}, ErrClosed
	}
	defer r.g.leave()
	if !fitsUint32(index) {
		return TierStats{}, invalid("tier index out of range")
	}
	var t C.kdn_tier_stats
	if err := retError(C.kdn_go_tier_stats(r.rt, C.uint32_t(index), &t)); err != nil {
		return TierStats{}, err
	}
	return TierStats{
		Kind: TierKind(t.kind), Name: C.GoString(&t.name[0]), Codec: C.GoString(&t.codec[0]),
		Hits: uint64(t.hits), Misses: uint64(t.misses), Puts: uint64(t.puts), PutRefusals: uint64(t.put_refusals),
		Evictions: uint64(t.evictions), DemotionsIn: uint64(t.demotions_in), PromotionsIn: uint64(t.promotions_in),
		BytesIn: uint64(t.bytes_in), BytesOut: uint64(t.bytes_out),
		Objects: uint64(t.objects), UsedBytes: uint64(t.used_bytes), CapacityBytes: uint64(t.capacity_bytes),
		CorruptDetected: uint64(t.corrupt_detected), EncodedChunks: uint64(t.encoded_chunks),
		BytesBeforeEncoding: uint64(t.bytes_before_encoding), BytesAfterEncoding: uint64(t.bytes_after_encoding),
		EncodeFailures: uint64(t.encode_failures), DecodeFailures: uint64(t.decode_failures),
		IOErrors: uint64(t.io_errors), RemoteCalls: uint64(t.remote_calls),
		RemoteFailed: uint64(t.remote_failed_calls), RemoteTimeouts: uint64(t.remote_timeouts),
		WriteQueueFull: uint64(t.write_queue_full), WriteQueuedBytes: uint64(t.write_queued_bytes),
		HighWatermark: float64(t.high_watermark), LowWatermark: float64(t.low_watermark),
		DeliveryNsPerToken:       float64(t.delivery_ns_per_token),
		DeviceDeliveryNsPerToken: float64(t.device_delivery_ns_per_token),
		RecomputeChunks:          uint64(t.recompute_chunks), AuthFailures: uint64(t.auth_failures),
	}, nil
}

// QuotaStats is a namespace's use of its quota in a tier, now (since 1.13).
type QuotaStats struct {
	Namespace     string   // as TierConfig.Quotas gave it
	NamespaceHash [32]byte // kdn's hash of the namespace, as chunk envelopes record it
	QuotaBytes    uint64
	UsedBytes     uint64 // its chunks' bytes the tier holds
	Objects       uint64
	// Its chunks evicted to keep it within its quota (its own stores), and
	// evicted for the tier's room (the tier full of quota'd chunks).
	QuotaEvictions, RoomEvictions uint64
	Refused                       uint64 // its chunks refused here: one larger than its quota
}

// QuotaStats reads the quotas of tier index (0 = the highest tier), in the
// order TierConfig.Quotas gave them; none: an empty slice. A chunk a disk
// tier held at start counts toward no quota until it is stored again. An
// index out of range: ErrInvalidArgument.
func (r *Runtime) QuotaStats(index int) ([]QuotaStats, error) {
	if !r.g.enter() {
		return nil, ErrClosed
	}
	defer r.g.leave()
	if !fitsUint32(index) {
		return nil, invalid("tier index out of range")
	}
	var n C.size_t
	if err := retError(C.kdn_go_quota_stats(r.rt, C.uint32_t(index), nil, 0, &n)); err != nil {
		return nil, err
	}
	out := []QuotaStats{}
	if n == 0 {
		return out, nil
	}
	// Go memory without pointers; the quotas are fixed when the runtime is
	// created, so n is still their number.
	qs := make([]C.kdn_quota_stats, n)
	if err := retError(C.kdn_go_quota_stats(r.rt, C.uint32_t(index), &qs[0], n, &n)); err != nil {
		return nil, err
	}
	var names []string
	if index < len(r.quotaNamespaces) && len(r.quotaNamespaces[index]) == int(n) {
		names = r.quotaNamespaces[index]
	}
	for i, q := range qs[:n] {
		s := QuotaStats{QuotaBytes: uint64(q.quota_bytes), UsedBytes: uint64(q.used_bytes), Objects: uint64(q.objects),
			QuotaEvictions: uint64(q.quota_evictions), RoomEvictions: uint64(q.room_evictions), Refused: uint64(q.refused)}
		for j := range s.NamespaceHash {
			s.NamespaceHash[j] = byte(q.ns_hash[j])
		}
		if names != nil {
			s.Namespace = names[i]
		}
		out = append(out, s)
	}
	return out, nil
}

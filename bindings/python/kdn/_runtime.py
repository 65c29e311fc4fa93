# SPDX-License-Identifier: Apache-2.0
"""Runtime, Model, Op, Request, KvView and Editor: kdn's handles in Python.

Resources: Runtime, Model and Op are context managers with an idempotent
close(). A handle that is never closed is closed when it is collected, or at
interpreter exit (weakref.finalize), in the reverse order of creation; rely
on that only as a backstop. After close() every call raises ClosedError.
A close on kdn's mover thread (an editor that closes a handle, or drops its
last reference) is handed to a closer thread, which does it once the editor
has returned: kdn cannot destroy a runtime on its own mover thread, and a
model's or op's close waits. The handle reads as closed at once.

Threads: a Runtime, Model or Op may be used from many threads at once (as
kdn.h says); every call releases the GIL while kdn works. close() may come
from any thread, even while other threads are inside calls on the handle:
it waits until those calls have left (a wait on an op ends promptly and
raises ClosedError), and calls after it raise ClosedError. A close inside a
blend's layer callback is handed to the closer thread too (the blend holds
the model until it returns).
"""
import abc
import array
import atexit
import collections
import math
import os
import sys
import threading
import weakref

from . import kdn_swig as _s
from ._arrays import cuda_interface as _cuda_interface
from ._arrays import foreign as _foreign
from ._enums import CacheKind, DeviceMode, DType, Layout, LatencyKind, OpState, RopeScaling, SegmentKind, Status, TierKind
from ._errors import InvalidArgumentError, _from_native
from ._types import (BlendReport, ChunkInfo, DocumentInfo, FetchResult, KvResult, Latency, LookupResult, ModelSpec,
                     QuotaStats, Segment, Stats, Tier, TierStats)

__all__ = ["Runtime", "Model", "Op", "Request", "KvView", "Editor"]

# The extension raises the exception classes of _errors through this.
_s.kdn_py_set_error_factory(_from_native)

# Buffer formats (struct syntax) a model of each dtype takes; bytes of any
# kind fit every dtype. numpy has no bfloat16: BF16 KV travels as uint16.
_RAW_FORMATS = frozenset(("B", "b", "c"))
_FORMATS = {
    DType.F32: _RAW_FORMATS | {"f"},
    DType.F16: _RAW_FORMATS | {"e", "H", "h"},
    DType.BF16: _RAW_FORMATS | {"H", "h"},
}


_tuple_new = tuple.__new__
_OK = Status.OK


def _ms(timeout):
    """Seconds (None: no limit) as kdn's milliseconds (< 0: no limit)."""
    if timeout is None:
        return -1
    if timeout <= 0:
        return 0
    return int(math.ceil(timeout * 1000.0))


class Request:
    """The tokens of a KV call: token ids (copied in, so a Request can be
    built once and reused), or an engine's chained block hashes.

    Immutable: calls read it without the GIL, from any number of threads at
    once, so nothing may change it under them. Make another Request for
    other tokens.

    Every KV call also takes a plain sequence of ints or an int32 buffer
    (numpy int32 array, array('i')) in place of a Request.

    ttft_target_us (since 1.6): for retrieve and load_async, the time from
    the call within which the cached prefix's KV should be in place, in
    microseconds (0: none). Remote and redis tiers with quality levels
    (Tier levels) pick each chunk's level by it, and leave the chunks no
    level delivers in time to recompute. Other calls ignore it; over an hour
    is refused (InvalidArgumentError: a unit mistake).

    salt (since 1.13): bytes-like, or str (encoded UTF-8); None or empty:
    none. It enters every chunk key of the request, as vLLM's `cache_salt`
    does: a salted request hits only KV stored with the same salt, and
    unsalted KV never answers it (nor it an unsalted one), so one user's
    cached prefix gives another no hit and no timing signal. Lookups,
    stores, retrieves, load_async and save_async take it; the knowledge
    calls and blending ignore it. kdn refuses one over 4096 bytes at the
    call (InvalidArgumentError; in lookup_batch, that request's status).
    """

    __slots__ = ("_r", "_salt")

    def __init__(self, tokens=None, *, ttft_target_us=0, salt=None):
        self._r = _s.Request()
        self._salt = None
        if tokens is not None:
            self._r.set_tokens(tokens)
        if ttft_target_us:
            _set_target(self._r, ttft_target_us)
        if salt is not None:
            self._salt = _set_salt(self._r, salt)

    @classmethod
    def from_block_hashes(cls, hashes, hash_bytes, block_tokens, *, ttft_target_us=0, salt=None):
        """A request by the engine's block hashes: `hashes` is bytes-like,
        num_blocks * hash_bytes long; each block covers block_tokens tokens
        (the runtime's chunk_tokens must be a multiple of it)."""
        r = cls(ttft_target_us=ttft_target_us, salt=salt)
        r._r.set_block_hashes(hashes, hash_bytes, block_tokens)
        return r

    @property
    def uses_hashes(self):
        return self._r.uses_hashes()

    @property
    def ttft_target_us(self):
        return self._r.ttft_target_us()

    @property
    def salt(self):
        """The salt as bytes, or None (since 1.13)."""
        return self._salt

    def __len__(self):
        """Token ids, or block hashes."""
        return self._r.size()

    def __repr__(self):  # never the salt itself: it may be a secret
        salted = ", salted" if self._salt else ""
        return f"kdn.Request({len(self)} {'block hashes' if self.uses_hashes else 'tokens'}{salted})"


def _set_target(r, us):
    try:
        r.set_ttft_target_us(us)
    except (TypeError, OverflowError, ValueError) as e:
        raise InvalidArgumentError(f"ttft_target_us={us!r}: {e}") from e


def _set_salt(r, salt):
    """Sets a native request's salt: bytes-like, or str (UTF-8). Returns it
    as bytes, or None for none (None or empty)."""
    if isinstance(salt, str):
        try:
            salt = salt.encode("utf-8")
        except UnicodeError as e:
            raise InvalidArgumentError(f"salt: {e}") from e
    elif not isinstance(salt, bytes):
        try:  # any bytes-like object, copied (an int is no salt: bytes(5) would be zeros)
            salt = memoryview(salt).tobytes()
        except TypeError as e:
            raise InvalidArgumentError(f"salt must be bytes-like or str, not {type(salt).__name__}") from e
    r.set_salt(salt)
    return salt or None


def _request(tokens, ttft_target_us=None, salt=None):
    """The native request of a call: a Request's own (None: its own target
    and salt), or one made from token ids."""
    if type(tokens) is Request:
        if ttft_target_us is None and salt is None:
            return tokens._r
        r = tokens._r
        try:  # a copy: a Request is immutable (other threads may be reading it)
            r = r.with_ttft_target_us(r.ttft_target_us() if ttft_target_us is None else ttft_target_us)
        except (TypeError, OverflowError, ValueError) as e:
            raise InvalidArgumentError(f"ttft_target_us={ttft_target_us!r}: {e}") from e
        if salt is not None:
            _set_salt(r, salt)
        return r
    r = _s.Request()
    r.set_tokens(tokens)
    if ttft_target_us is not None:
        _set_target(r, ttft_target_us)
    if salt is not None:
        _set_salt(r, salt)
    return r


def _canonical_tokens(tokens, view):
    """What a 5-dimensional array must hold for the canonical view: False
    (the call has its own view), the request's token count, or None (block
    hashes: the count is the engine's)."""
    if view is not None:
        return False
    if type(tokens) is Request:
        return None if tokens.uses_hashes else len(tokens)
    try:
        return len(tokens)
    except TypeError:
        return None


class KvView:
    """Where the caller's KV lies in the buffer passed with each call
    (kdn_kv_view without its pointers). Counts and strides in elements.

    The default, KvView(), is the canonical layout
    [layer][k|v][token][kv_head][head_dim] for the request's tokens.

    Strided (one buffer, llama.cpp-like): layer j's K at j * stride_layer,
    its V stride_kv further; element (token, head, dim) at token *
    stride_token + head * stride_head + dim * stride_dim; V may have its
    own v_stride_* (transposed V).

    Per-layer offsets: layer_offsets=[(k_offset, v_offset), ...] (elements
    into the buffer) with layer_elements (what each layer may span); paged
    layouts always use them, with block_size, block_table and num_blocks
    (blocks per layer), block_stride (0: dense).

    layers: the model layers this view holds, in order (None: all).
    num_tokens: the room, in tokens (0: exactly the request's); a knowledge
    fetch needs it set.
    """

    _FIELDS = ("layout", "stride_layer", "stride_kv", "stride_token", "stride_head", "stride_dim", "v_stride_token",
               "v_stride_head", "v_stride_dim", "num_tokens", "layer_elements", "block_size", "num_blocks",
               "block_stride")
    __slots__ = ("_v", "_args")

    def __init__(self, *, layout=Layout.CONTIGUOUS, stride_layer=0, stride_kv=0, stride_token=0, stride_head=0,
                 stride_dim=0, v_stride_token=0, v_stride_head=0, v_stride_dim=0, num_tokens=0, layer_elements=0,
                 block_size=0, num_blocks=0, block_stride=0, layers=None, layer_offsets=None, block_table=None):
        v = _s.KvView()
        args = {}
        for name, value in (("layout", layout), ("stride_layer", stride_layer), ("stride_kv", stride_kv),
                            ("stride_token", stride_token), ("stride_head", stride_head), ("stride_dim", stride_dim),
                            ("v_stride_token", v_stride_token), ("v_stride_head", v_stride_head),
                            ("v_stride_dim", v_stride_dim), ("num_tokens", num_tokens),
                            ("layer_elements", layer_elements), ("block_size", block_size),
                            ("num_blocks", num_blocks), ("block_stride", block_stride)):
            if value:
                try:
                    setattr(v, name, int(value))
                except (TypeError, OverflowError, ValueError) as e:
                    raise InvalidArgumentError(f"KvView {name}={value!r}: {e}") from e
                args[name] = value
        try:
            for layer in layers or ():
                v.add_layer(int(layer))
            for k_off, v_off in layer_offsets or ():
                v.add_layer_offsets(int(k_off), int(v_off))
            for block in block_table if block_table is not None else ():
                v.add_block(int(block))
        except (TypeError, OverflowError, ValueError) as e:
            raise InvalidArgumentError(f"KvView: {e}") from e
        if layers:
            args["layers"] = list(layers)
        if layer_offsets:
            args["layer_offsets"] = [tuple(o) for o in layer_offsets]
        if block_table is not None and len(block_table):
            args["block_table"] = f"<{len(block_table)} blocks>"
        self._v = v
        self._args = args

    @classmethod
    def canonical(cls, num_tokens=0):
        """[layer][k|v][token][kv_head][head_dim] for num_tokens tokens (0:
        the request's)."""
        return cls(num_tokens=num_tokens)

    @classmethod
    def paged(cls, layout, block_size, block_table, layer_offsets, num_blocks, *, block_stride=0, layers=None,
              num_tokens=0):
        """A paged view (vLLM): each layer's K and V caches at their element
        offsets, num_blocks blocks of block_size tokens each; token t in
        block block_table[t // block_size]."""
        return cls(layout=layout, block_size=block_size, block_table=block_table, layer_offsets=layer_offsets,
                   num_blocks=num_blocks, block_stride=block_stride, layers=layers, num_tokens=num_tokens)

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self._args.items())
        return f"kdn.KvView({inner})"


_CANONICAL = None


def _view(view):
    global _CANONICAL
    if view is None:
        if _CANONICAL is None:
            _CANONICAL = KvView()
        return _CANONICAL._v
    if type(view) is not KvView:
        raise InvalidArgumentError(f"view must be a kdn.KvView, not {type(view).__name__}")
    return view._v


class Editor(abc.ABC):
    """An editor rewrites each stored chunk's KV in place (experimental in
    kdn.h). Subclass it, or pass any callable edit(info, kv) to Runtime.

    edit() runs on kdn's mover thread, one chunk at a time, holding the GIL.
    `info` is a ChunkInfo; `kv` a writable memoryview of a copy of the
    chunk's KV in the canonical layout [layer][k|v][token][kv_head][head_dim]
    (numpy.frombuffer(kv, numpy.float32) edits it in place). Return True when
    the KV was changed: the copy is written back into the chunk after the
    call. `kv` is released when edit() returns; an array made from it and
    kept stays valid, but is the copy's, never kdn's memory. An exception
    leaves the chunk as it was; it is reported through sys.unraisablehook
    and the runtime goes on. edit() must not call kdn (such calls fail with
    InvalidArgumentError).
    """

    @abc.abstractmethod
    def edit(self, info, kv):
        """Rewrites kv in place; returns True when it changed it."""

    def __call__(self, info, kv):
        return self.edit(info, kv)


class _EditorBridge(_s.Editor):
    """The SWIG director kdn calls: the chunk's tuple and memoryview in,
    the user's editor called with a ChunkInfo and a view of a copy.

    `kv` is kdn's memory, valid during this call only. Python cannot revoke
    an export once made (numpy.frombuffer(kv) kept by the editor would alias
    kdn's memory after the call), so the editor never sees it: it edits a
    bytearray, copied back into `kv` when it reports a change."""

    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def edit(self, info, kv):
        try:
            copy = bytearray(kv)
            view = memoryview(copy)
            try:
                changed = bool(self._fn(ChunkInfo(info[0], info[1], info[2], info[3], DType(info[4]), info[5]),
                                        view))
            finally:
                try:
                    view.release()
                except BufferError:
                    pass  # the editor kept an array of it: of the copy, which lives on with it
            if changed:
                kv[:] = copy
            return changed
        finally:
            kv.release()  # never exported: no view of kdn's memory outlives the call

    def __repr__(self):
        return f"<kdn editor {self._fn!r}>"


class _Core:
    """What the native runtime needs alive until the last handle made from
    it is closed: the editor. Runtime, Model and Op each hold one count."""

    __slots__ = ("editor", "count", "lock")

    def __init__(self, editor):
        self.editor = editor
        self.count = 1
        self.lock = threading.Lock()

    def acquire(self):
        with self.lock:
            self.count += 1

    def release(self):
        with self.lock:
            self.count -= 1
            done = self.count == 0
        if done:  # the native runtime is gone: nothing can call the editor now
            self.editor = None


def _close_now(handle, core, buffer):
    # Closing may wait for the mover thread (which may be running a Python
    # editor) and for calls in flight on other threads: the call releases
    # the GIL.
    handle.close()
    if buffer is not None:
        try:
            buffer.release()
        except BufferError:
            pass
    core.release()


class _Closer:
    """The thread that closes handles whose close came on kdn's mover thread
    (inside an editor): a runtime destroyed there would be destroyed on its
    own mover thread, and an op or model close could wait for that thread.
    Started on first use; drained at exit."""

    def __init__(self):
        self._cv = threading.Condition(threading.Lock())
        self._queue = collections.deque()
        self._running = 0
        self._thread = None

    def submit(self, handle, core, buffer):
        with self._cv:
            self._queue.append((handle, core, buffer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kdn-closer", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _run(self):
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                item = self._queue.popleft()
                self._running += 1
            try:
                _close_now(*item)
            except BaseException:  # a close does not raise; if it did, say so and go on
                sys.excepthook(*sys.exc_info())
            finally:
                del item
                with self._cv:
                    self._running -= 1
                    self._cv.notify_all()

    def drain(self, timeout=None):
        """Waits until every close handed over so far is done (True), or
        until `timeout` seconds pass (False)."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and not self._running, timeout)


_closer = _Closer()
atexit.register(_closer.drain, 60)


def _close_handle(handle, core, buffer=None):
    if _s.kdn_py_in_callback():  # in an editor or a blend's callback: close elsewhere, after it returns
        handle.refuse()  # calls after this close() raise ClosedError at once, as the class says
        _closer.submit(handle, core, buffer)
    else:
        _close_now(handle, core, buffer)


class _Handle:
    """What Runtime, Model and Op share: close() (idempotent; the finalizer
    of the native handle, so that also a collection closes it), closed, and
    the context manager."""

    def _track(self, handle, core, buffer=None):
        self._close = weakref.finalize(self, _close_handle, handle, core, buffer)

    def close(self):
        """Closes the handle (idempotent). See the class for what it waits for."""
        self._close()

    @property
    def closed(self):
        return not self._close.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Runtime(_Handle):
    """A kdn runtime: the store and its tiers (kdn_runtime). close() releases
    it: models and ops made from it stay usable; the store goes when the
    last of them is closed.

    >>> with kdn.Runtime(chunk_tokens=16, tiers=[kdn.Tier.host(16 << 20)]) as rt:
    ...     with rt.model(num_layers=5, num_kv_heads=4, head_dim=8, fingerprint="m") as m:
    ...         ...

    chunk_tokens: tokens per stored chunk (256). tiers: Tier configs,
    highest first (none: one host tier of host_capacity_bytes, 1 GiB).
    hash_seed: the seed of every key hash (runtimes that share KV share it).
    worker_threads: background loads and saves (0: 2). editor: a kdn.Editor
    or a callable edit(info, kv) -> bool, run on each stored chunk.

    device, device_ordinal (since 1.5): the GPU KV is delivered to, for GPU
    arrays (see Model) and device tiers: DeviceMode.AUTO (the CUDA device
    device_ordinal when kdn has CUDA and there is a GPU; else none),
    NONE (GPU arrays are refused: UnsupportedError), EMULATED (host memory
    stands in for the GPU's: a "GPU pointer" is a host address, and every
    device path runs its CPU code; for testing GPU integrations without
    one), CUDA (UnsupportedError without one).
    load_slower_than_prefill (since 1.7): False (the default): once the
    engine reported its prefill time (Model.report_prefill), a load leaves
    the cached chunks whose tier delivers slower than that to recompute
    (Stats.recompute_tokens); True: load them all, however slow.
    secret_file (since 1.8): a file holding the deployment's secret (32
    bytes or more, readable by the service only): chunks of redis and disk
    tiers are sealed with it, and only chunks sealed with it are read
    (others are misses: TierStats.auth_failures). A file that cannot be
    read, is open to others or is too short: InvalidArgumentError.
    encryption_key_file, encryption_key_env (since 1.14): encryption at
    rest, with master keys from a file (readable by the service only: chmod
    600) or from the environment variable so named (its name, not the
    keys), at most one of the two; one key per line as 64 hex digits
    (`openssl rand -hex 32`), the first encrypts, every one decrypts
    (rotation: the new key first, the old ones kept while their chunks
    matter). Every chunk a disk, redis or remote tier sends out of the
    process is then encrypted with AES-256-GCM, and one read back that does
    not decrypt (another key, none, damaged bytes) is a miss
    (TierStats.auth_failures); runtimes that share such a tier share the
    keys. A source that cannot be read, is open to others or holds a line
    that is not a key, a variable that is not set, or both at once:
    InvalidArgumentError (its message never holds a key); a libkdn before
    1.14: VersionError.
    """

    def __init__(self, *, chunk_tokens=256, tiers=None, host_capacity_bytes=1 << 30, hash_seed=0, worker_threads=0,
                 editor=None, device=DeviceMode.AUTO, device_ordinal=0, load_slower_than_prefill=False,
                 secret_file=None, encryption_key_file=None, encryption_key_env=None):
        o = _s.RuntimeOptions()
        try:
            o.chunk_tokens = chunk_tokens
            o.host_capacity_bytes = host_capacity_bytes
            o.hash_seed = hash_seed
            o.worker_threads = worker_threads
            o.device = int(device)
            o.device_ordinal = device_ordinal
            o.load_slower_than_prefill = bool(load_slower_than_prefill)
        except (TypeError, OverflowError, ValueError) as e:
            raise InvalidArgumentError(f"runtime options: {e}") from e
        if secret_file is not None:
            o.secret_file = _path(secret_file, "secret_file", "no secret")
        if encryption_key_file is not None:
            o.encryption_key_file = _path(encryption_key_file, "encryption_key_file", "no keys")
        if encryption_key_env is not None:
            if not isinstance(encryption_key_env, (str, bytes)):
                raise InvalidArgumentError(
                    f"encryption_key_env must be a variable's name (str), not {type(encryption_key_env).__name__}")
            if not encryption_key_env:
                raise InvalidArgumentError("encryption_key_env is empty (None: no keys)")
            o.encryption_key_env = os.fsencode(encryption_key_env)
        if isinstance(tiers, Tier):
            tiers = [tiers]
        quota_ns = []  # each tier's quotas' namespaces, in order (quota_stats names them)
        for tier in tiers or ():
            if not isinstance(tier, Tier):
                raise InvalidArgumentError(f"tiers must be kdn.Tier values, not {type(tier).__name__}")
            quotas = _quotas(tier.quotas)
            o.add_tier(_native_tier(tier, quotas))
            quota_ns.append(tuple(ns for ns, _ in quotas))
        bridge = None
        if editor is not None:
            if not callable(editor):
                raise InvalidArgumentError("editor must be a kdn.Editor or a callable edit(info, kv)")
            bridge = _EditorBridge(editor)
            self._h = _s.Runtime(o, bridge)
        else:
            self._h = _s.Runtime(o)
        self.chunk_tokens = chunk_tokens
        self.device = DeviceMode(int(device))
        self.device_ordinal = device_ordinal
        self._quota_ns = quota_ns
        self._core = _Core(bridge)
        self._track(self._h, self._core)

    def __repr__(self):
        return f"<kdn.Runtime chunk_tokens={self.chunk_tokens}{' closed' if self.closed else ''}>"

    def model(self, spec=None, /, **fields):
        """Registers a model: a ModelSpec, or its fields as keywords
        (num_layers, num_kv_heads, head_dim, dtype=DType.F32, fingerprint,
        rope_theta=10000, rope_style=RopeStyle.INTERLEAVED, rotary_dim=0,
        cache_kind=CacheKind.KV, latent_dim=0, latent_rope_dim=0,
        layer_windows=(), num_state_layers=0, state_bytes=0)."""
        if spec is None:
            if not fields:
                raise InvalidArgumentError("a model spec is required")
            try:
                spec = ModelSpec(**fields)
            except TypeError as e:
                raise InvalidArgumentError(f"model spec: {e}") from e
        elif fields or not isinstance(spec, ModelSpec):
            raise InvalidArgumentError("pass a kdn.ModelSpec or its fields as keywords")
        s = _s.ModelSpec()
        try:
            s.num_layers = spec.num_layers
            s.num_kv_heads = spec.num_kv_heads
            s.head_dim = spec.head_dim
            s.dtype = int(spec.dtype)
            s.rope_theta = spec.rope_theta
            s.rope_style = int(spec.rope_style)
            s.rotary_dim = spec.rotary_dim
            s.cache_kind = int(spec.cache_kind)
            s.latent_dim = spec.latent_dim
            s.latent_rope_dim = spec.latent_rope_dim
            for layer, window in enumerate(spec.layer_windows):
                s.set_layer_window(layer, window)
            s.num_state_layers = spec.num_state_layers
            s.state_bytes = spec.state_bytes
        except (TypeError, OverflowError) as e:
            raise InvalidArgumentError(f"model spec: {e}") from e
        s.fingerprint = spec.fingerprint
        return Model(self, self._h.create_model(s), spec)

    def stats(self):
        """The runtime's counters (a Stats)."""
        return Stats(*self._h.stats())

    def latency(self, kind=LatencyKind.LOAD):
        """The latency distribution of lookups, loads or stores (a Latency)."""
        return Latency._make(self._h.latency(int(kind)))

    @property
    def tier_count(self):
        return self._h.tier_count()

    def tier_stats(self, index=None):
        """Tier `index`'s counters (0 = highest), or a list of every tier's."""
        if index is None:
            return [self.tier_stats(i) for i in range(self._h.tier_count())]
        t = self._h.tier_stats(index)
        return TierStats(TierKind(t[0]), *t[1:])

    def quota_stats(self, index=0):
        """The quotas of tier `index` (since 1.13; Tier.quotas), a list of
        QuotaStats in the order the tier gave them (empty: none). A libkdn
        before 1.13: VersionError."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise InvalidArgumentError(f"tier index must be an int, not {type(index).__name__}")
        if not 0 <= index < 1 << 32:
            raise InvalidArgumentError(f"no tier {index}")
        names = self._quota_ns[index] if index < len(self._quota_ns) else ()
        return [QuotaStats(names[i] if i < len(names) else None, bytes.fromhex(q[0]), *q[1:])
                for i, q in enumerate(self._h.quota_stats(index))]


def _path(path, name, none):
    """A path argument (str, bytes or os.PathLike, not empty) as bytes."""
    try:
        text = os.fsdecode(path)
    except TypeError as e:
        raise InvalidArgumentError(f"{name} must be a path, not {type(path).__name__}") from e
    if not text:
        raise InvalidArgumentError(f"{name} is empty (None: {none})")
    return os.fsencode(text)


def _levels(levels):
    """Tier.levels: a ';'-separated string, or a list of codec specs."""
    if isinstance(levels, (str, bytes)):
        return levels
    try:
        parts = [p.decode() if isinstance(p, bytes) else p for p in levels]
    except TypeError as e:
        raise InvalidArgumentError(f"levels must be codec specs, not {levels!r}") from e
    for p in parts:
        if not isinstance(p, str) or ";" in p:
            raise InvalidArgumentError(f"levels: {p!r} is not one codec spec")
    return ";".join(parts)


def _quotas(quotas):
    """Tier.quotas as a list of (namespace, bytes): a mapping or pairs."""
    if isinstance(quotas, (str, bytes)):
        raise InvalidArgumentError(f"quotas must be {{namespace: bytes}} or (namespace, bytes) pairs, not {quotas!r}")
    try:
        pairs = list(quotas.items()) if hasattr(quotas, "items") else [tuple(p) for p in quotas]
    except TypeError as e:
        raise InvalidArgumentError(f"quotas must be {{namespace: bytes}} or (namespace, bytes) pairs: {e}") from e
    for p in pairs:
        if len(p) != 2 or not isinstance(p[0], (str, bytes)) or isinstance(p[1], bool) or not isinstance(p[1], int):
            raise InvalidArgumentError(f"quotas: {p!r} is not a (namespace, bytes) pair")
    return pairs


def _native_tier(tier, quotas=()):
    t = _s.TierConfig()
    try:
        t.kind = int(tier.kind)
        t.capacity_bytes = tier.capacity_bytes
        t.policy = int(tier.policy)
        t.high_watermark = tier.high_watermark
        t.low_watermark = tier.low_watermark
        t.write_through = bool(tier.write_through)
        t.timeout_ms = tier.timeout_ms
        t.ttl_ms = tier.ttl_ms
    except (TypeError, OverflowError) as e:
        raise InvalidArgumentError(f"tier {tier!r}: {e}") from e
    t.path = tier.path
    t.codec = tier.codec
    t.address = tier.address
    t.token = tier.token
    t.tls_ca_file = tier.tls_ca_file
    t.tls_server_name = tier.tls_server_name
    t.user = tier.user
    t.levels = _levels(tier.levels)
    try:
        for ns, limit in quotas:
            t.add_quota(ns, limit)
    except (TypeError, OverflowError) as e:
        raise InvalidArgumentError(f"tier {tier!r}: quotas: {e}") from e
    return t


class _Exports:
    """The buffers a call exported (the KV and the recurrent states):
    released together, when the call returns or its Op is closed."""

    __slots__ = ("_items",)

    def __init__(self, first):
        self._items = [first]

    def add(self, item):
        self._items.append(item)

    def release(self):
        for item in self._items:
            try:
                item.release()
            except BufferError:
                pass  # still exported further by its owner: it lives on with it
        self._items = []


def _state_views(states, writable):
    """The recurrent states of a call as C-contiguous memoryviews of their
    own (released with the call), one per recurrent layer: a sequence of
    buffers (list, tuple), or a buffer of 2 or more dimensions whose rows
    are the states (a numpy array (num_state_layers, n)). Their count and
    lengths are checked natively."""
    try:
        whole = memoryview(states)
    except TypeError:
        whole = None
    views = []
    try:
        if whole is not None:
            with whole:
                if whole.ndim < 2:
                    raise InvalidArgumentError("states: one buffer per recurrent layer, as a sequence ([state, ...]) "
                                               "or the rows of a 2-D array, not a single buffer")
                if not whole.c_contiguous:
                    raise InvalidArgumentError("states: a 2-D array of states must be C-contiguous")
                rows = whole.shape[0]
                with whole.cast("B") as flat:  # each row's slice keeps the buffer exported
                    step = flat.nbytes // rows if rows else 0
                    views = [flat[i * step:(i + 1) * step] for i in range(rows)]
        else:
            try:
                items = list(states)
            except TypeError as e:
                raise InvalidArgumentError(f"states must be a sequence of buffers, one per recurrent layer, not "
                                           f"{type(states).__name__}") from e
            for i, item in enumerate(items):
                try:
                    views.append(memoryview(item))
                except TypeError as e:
                    raise InvalidArgumentError(f"states[{i}] must be a buffer (bytearray, numpy array, memoryview), "
                                               f"not {type(item).__name__}") from e
        for i, mv in enumerate(views):
            if not mv.c_contiguous:
                raise InvalidArgumentError(f"states[{i}] must be C-contiguous")
            if writable and mv.readonly:
                raise InvalidArgumentError(f"states[{i}] is read-only: kdn writes the state into it (use a "
                                           f"bytearray or an array)")
    except BaseException:
        for mv in views:
            mv.release()
        raise
    return views


class Model(_Handle):
    """A model registered with a runtime (kdn_model); every KV call goes
    through one. Made by Runtime.model(). close() releases it.

    KV buffers: any object with the buffer protocol, used in place (numpy
    arrays, bytearray, memoryview, mmap), C-contiguous. Calls that write
    (retrieve, load_async, knowledge_fetch) need a writable one. A buffer
    with a typed format must match the model's dtype (float32 for F32;
    float16 or uint16 for F16; uint16 for BF16); bytes fit any.
    `tokens` is a Request, a sequence of ints or an int32 buffer.
    `ns` is the tenant namespace, str or bytes.
    `salt` (since 1.13; lookup, store, retrieve, load_async, save_async):
    the request's salt, bytes-like or str (see Request); None: the
    Request's own (plain tokens: none), b"": none.

    GPU arrays (since 1.5): store, retrieve, load_async, save_async and
    blend also take objects with __cuda_array_interface__ (torch and CuPy
    tensors on the GPU, numba arrays) and DLPack producers (__dlpack__ and
    __dlpack_device__: a CUDA tensor is device memory, a CPU one host
    memory), used in place, C-contiguous, with the same element types (and
    bfloat16 for BF16). Device memory must be the runtime's device's
    (Runtime(device=...)); a runtime without one refuses it
    (UnsupportedError). `stream` names the engine's CUDA stream (an int
    cudaStream_t, or a torch or CuPy stream): kdn's work on the memory
    starts after what the stream holds at the call, and what the engine
    queues on it after the call (an op: after it ends) sees kdn's writes.
    An array's own __cuda_array_interface__ stream is taken when the call
    names none; a DLPack producer is asked for its tensor on the call's
    stream (none named: the legacy default stream). With the canonical view
    (view=None), a 5-dimensional array must have the model's shape
    [layer][k|v][token][kv_head][head_dim] for the request's tokens.
    The knowledge calls take host buffers only (kdn refuses device memory
    for them).

    Recurrent layers (since 1.12, ModelSpec num_state_layers and
    state_bytes): store, retrieve, load_async and save_async take
    `states`, the recurrent layers' states, one buffer per recurrent layer
    in order (a list of bytearrays, numpy arrays or memoryviews, or a 2-D
    array whose rows are the states), each C-contiguous and at least
    state_bytes long (kdn reads or writes its first state_bytes; any
    element type), used in place and writable for retrieve and load_async.
    A store takes the state after the request's last token as the snapshot
    at that boundary; a retrieve or load writes the snapshot at the prefix
    it returns, and a lookup counts a prefix only where one is. A retrieve
    or load of such a model without states, a wrong count or a buffer too
    short: InvalidArgumentError. Host memory only (kdn refuses GPU memory
    for such a model).
    """

    def __init__(self, runtime, handle, spec):
        self._h = handle
        self._runtime = runtime
        self.spec = spec
        self._formats = _FORMATS.get(DType(spec.dtype), _RAW_FORMATS)
        self._writable = None
        self._lock = threading.Lock()
        runtime._core.acquire()
        self._track(handle, runtime._core)

    def __repr__(self):
        s = self.spec
        return (f"<kdn.Model {s.num_layers}x{s.num_kv_heads}x{s.head_dim} {DType(s.dtype).name}"
                f"{' closed' if self.closed else ''}>")

    @property
    def runtime(self):
        return self._runtime

    @property
    def kv_bytes_per_token(self):
        """Bytes of KV per token."""
        return self._h.kv_bytes_per_token()

    @property
    def fingerprint(self):
        """The 32-byte identity kdn derived from the spec, as 64 hex digits."""
        return self._h.fingerprint()

    def report_prefill(self, tokens, elapsed_ns):
        """Tells the runtime that the engine prefilled `tokens` tokens of this
        model in `elapsed_ns` nanoseconds (wall time of the forward pass, as
        the engine measured it; since 1.4). Later loads price the tokens
        they serve at the model's mean prefill time per token
        (Stats.ttft_saved_ns). Report the prefills of the tokens a load did
        not serve, and full prefills, as they happen. InvalidArgumentError
        when either is 0 (or negative), or the time is over an hour per
        token."""
        try:
            self._h.report_prefill(tokens, elapsed_ns)
        except (TypeError, OverflowError) as e:
            raise InvalidArgumentError(f"report_prefill({tokens!r}, {elapsed_ns!r}): {e}") from e

    def _kv(self, kv, writable):
        """The caller's buffer, checked: a memoryview over it."""
        try:
            mv = memoryview(kv)
        except TypeError as e:
            if hasattr(kv, "__cuda_array_interface__") or hasattr(kv, "__dlpack__"):
                raise InvalidArgumentError(f"the KV buffer must be host memory with the buffer protocol, not "
                                           f"{type(kv).__name__}: the knowledge calls take no GPU arrays") from e
            raise InvalidArgumentError(f"the KV buffer must support the buffer protocol, not {type(kv).__name__}") \
                from e
        return self._checked(mv, writable)

    def _checked(self, mv, writable):
        if writable and mv.readonly:
            raise InvalidArgumentError("the KV buffer is read-only: kdn writes into it (use a bytearray or an array)")
        fmt = mv.format
        if fmt[:1] in "@=<":
            fmt = fmt[1:]
        if fmt not in self._formats:
            raise InvalidArgumentError(
                f"a buffer of format {mv.format!r} for a {DType(self.spec.dtype).name} model "
                f"(use {'float32' if self.spec.dtype == DType.F32 else 'uint16'} elements, or bytes)")
        return mv

    def _memory(self, kv, writable, tokens, view, stream):
        """The KV memory of a call, checked: a memoryview over a buffer, or
        a _Foreign (a GPU array or a DLPack tensor: memory by address)."""
        cai = _cuda_interface(kv)
        if cai is None:
            try:
                mv = memoryview(kv)
            except TypeError:
                pass
            else:
                if stream is not None:
                    raise InvalidArgumentError(f"stream is for device memory, and {type(kv).__name__} is a host "
                                               f"buffer")
                return self._checked(mv, writable)
        f = _foreign(kv, self, writable, _canonical_tokens(tokens, view), stream, _s.Memory, cai=cai)
        if f is None:
            raise InvalidArgumentError(f"the KV memory must be a buffer (numpy array, bytearray, ...), an object with "
                                       f"__cuda_array_interface__ or a DLPack producer, not {type(kv).__name__}")
        return f

    # ---- Lookup, store, retrieve ----

    def lookup(self, ns, tokens, *, salt=None):
        """How many leading tokens are cached (a LookupResult), without side
        effects. A miss is cached_tokens 0, not an error; a bad request
        raises (in lookup_batch it fails alone, in its result's status)."""
        req = tokens._r if type(tokens) is Request and salt is None else _request(tokens, None, salt)
        t = self._h.lookup(ns, req)
        if t[0]:  # the one request's own status (kdn_kv_lookup is batched)
            raise _from_native(t[0], f"lookup: the request failed ({_s.status_string(t[0])})", False, 0)
        return _tuple_new(LookupResult, (_OK, t[1], t[2]))  # LookupResult(...) without its Python-level __new__

    def lookup_batch(self, ns, requests):
        """Lookups of many requests in one call: a list of LookupResult. A
        bad request fails alone, in its result's status (no exception).
        Each Request carries its own salt."""
        batch = _s.LookupBatch()
        for r in requests:
            batch.add(_request(r))
        self._h.lookup_batch(ns, batch)
        out = []
        for i in range(batch.size()):
            t = batch.result(i)
            out.append(LookupResult(Status(t[0]), t[1], t[2]))
        return out

    def store(self, ns, tokens, kv, view=None, *, salt=None, stream=None, states=None):
        """Stores the tokens' KV from `kv` (read only: bytes are fine).
        Chunks already cached are skipped; when not all fit, the longest
        prefix that fits is kept. Returns a KvResult (tokens: the leading
        tokens cached after the call).

        states (since 1.12, a model with recurrent layers): their state
        after the request's last token, one buffer per recurrent layer (see
        the class), kept as the snapshot at that boundary. A prefix counts
        for a lookup only where a snapshot is: store at each chunk boundary
        of a prefill to make each one a possible hit. None: the KV alone,
        which no lookup counts for such a model."""
        req = _request(tokens, None, salt)
        mem = self._memory(kv, False, tokens, view, stream)
        if states is not None:
            return self._with_states(mem, states, False, self._h.store_states, self._h.store_memory_states,
                                     (ns, req, _view(view)))
        if type(mem) is memoryview:
            return KvResult._native(self._h.store(ns, req, _view(view), mem))
        with mem:
            return KvResult._native(self._h.store_memory(ns, req, _view(view), mem.native))

    def retrieve(self, ns, tokens, kv, view=None, *, ttft_target_us=None, salt=None, stream=None, states=None):
        """Writes the KV of the longest cached prefix into `kv`. Returns a
        KvResult: tokens = its length, 0 on a miss (not an error).
        ttft_target_us: see Request (None: the Request's own, else 0).

        states (since 1.12): required for a model with recurrent layers
        (else kdn's InvalidArgumentError): writable buffers, one per
        recurrent layer (see the class), into which the state at the
        returned prefix is written (nothing on a miss). A prefix counts only
        where the state at its end was stored."""
        req = _request(tokens, ttft_target_us, salt)
        mem = self._memory(kv, True, tokens, view, stream)
        if states is not None:
            return self._with_states(mem, states, True, self._h.retrieve_states, self._h.retrieve_memory_states,
                                     (ns, req, _view(view)))
        if type(mem) is memoryview:
            return KvResult._native(self._h.retrieve(ns, req, _view(view), mem))
        with mem:
            return KvResult._native(self._h.retrieve_memory(ns, req, _view(view), mem.native))

    def load_async(self, ns, tokens, kv, view=None, *, ttft_target_us=None, salt=None, stream=None, states=None):
        """Starts loading the cached prefix into `kv` layer by layer in the
        background: an Op, which keeps `kv` exported (it cannot be resized
        or freed; a DLPack tensor: not given back to its producer) until it
        is closed. ttft_target_us: see Request. states (since 1.12): as for
        retrieve, written by the op; kept exported with `kv`."""
        req = _request(tokens, ttft_target_us, salt)
        mem = self._memory(kv, True, tokens, view, stream)
        if states is not None:
            return self._with_states(mem, states, True, self._h.load_async_states,
                                     self._h.load_async_memory_states, (ns, req, _view(view)), op=True)
        if type(mem) is memoryview:
            return Op(self, self._h.load_async(ns, req, _view(view), mem), mem)
        try:
            return Op(self, self._h.load_async_memory(ns, req, _view(view), mem.native), mem)
        except BaseException:
            mem.release()
            raise

    def save_async(self, ns, tokens, kv, view=None, *, salt=None, stream=None, states=None):
        """Starts a save from `kv`: call op.layer_ready(layer) once per model
        layer as it becomes final, then op.wait(). `kv` stays exported until
        the Op is closed. states (since 1.12): as for store, read when every
        layer is ready (they must hold the state after the request's last
        token by then); kept exported with `kv`."""
        req = _request(tokens, None, salt)
        mem = self._memory(kv, False, tokens, view, stream)
        if states is not None:
            return self._with_states(mem, states, False, self._h.save_async_states,
                                     self._h.save_async_memory_states, (ns, req, _view(view)), op=True)
        if type(mem) is memoryview:
            return Op(self, self._h.save_async(ns, req, _view(view), mem), mem)
        try:
            return Op(self, self._h.save_async_memory(ns, req, _view(view), mem.native), mem)
        except BaseException:
            mem.release()
            raise

    def _with_states(self, mem, states, writable, buffer_call, memory_call, args, op=False):
        """A KV call with the recurrent layers' states: `mem` is the KV
        (a memoryview, or a _Foreign by address), `args` (ns, request,
        view). The states stay exported for the call, an op's until it is
        closed (with the KV)."""
        exports = _Exports(mem)
        try:
            native = _s.StateLayers()
            add = native.add if writable else native.add_readonly
            for mv in _state_views(states, writable):
                exports.add(mv)
                add(mv)
            if type(mem) is memoryview:
                handle = buffer_call(*args, mem, native)
            else:
                handle = memory_call(*args, mem.native, native)
        except BaseException:
            exports.release()
            raise
        if op:
            return Op(self, handle, exports)
        exports.release()
        return KvResult._native(handle)

    # ---- Blending (experimental in kdn.h) ----

    def blend(self, ns, segments, kv, view=None, *, layer_fn, hidden_dim, ratio=None, threshold=None,
              check_layers=None, rope_scaling=RopeScaling.NONE, rope_factor=1.0, kv_fn=None, kv_cost=None,
              first_tokens=0, gate_file=None, max_kl_ratio=0.2, stream=None):
        """Composes a context from pieces whose KV was computed alone
        (CacheBlend; experimental in kdn.h): documents (knowledge items)
        are placed and their keys rotated to their new positions; at the
        check layers the cached tokens whose keys deviate most from a fresh
        computation are selected, and only those and the tokens computed
        now are recomputed in the later layers, by the engine, through
        `layer_fn`. Writes the whole context's KV into `kv` (a buffer or a
        GPU array, in the model's dtype); returns a BlendReport.

        segments: in order, each a kdn.Segment, a str (a document's doc_id)
        or a sequence of ints / int32 buffer (tokens computed now).
        view: None is the canonical layout with room for the tokens `kv`
        holds (a 5-dimensional array's third dimension, else its bytes /
        kv_bytes_per_token); a KvView with documents must state its room
        (num_tokens). A context longer than the room: BufferTooSmallError
        (nothing written).

        layer_fn(layer, positions, tokens, hidden, k, v): the engine's
        recompute of model layer `layer` for the positions (ascending) of
        the composed context, called on this thread, layer by layer in
        order, holding the GIL. positions: an int32 memoryview (count,);
        tokens: their ids at layer 0 (the engine embeds them), None after;
        hidden: a float32 memoryview (count, hidden_dim), the layer's input
        (unset at layer 0), to be overwritten with its output; k, v: float32
        memoryviews (total positions, kv_heads * head_dim) of this layer's
        KV: write the positions' K (after RoPE at their positions) and V,
        and attend each position causally over [0, its own] of them (a
        latent (MLA) model's: k is (total positions, latent_dim), each
        position's latent vector, and v is None).
        numpy.asarray(view) edits one in place. The views are of copies of
        kdn's buffers, written back when layer_fn returns, and released then
        (an array kept past the call is a stale copy's). An exception raised
        in layer_fn (any BaseException) stops the blend, which raises it.
        layer_fn may call kdn; a close it makes of this model is done once
        the blend has returned.

        kv_fn (since 1.9): the KV pass, called like layer_fn: layer `layer`'s
        K and V alone for the positions, written as layer_fn writes them,
        bit for bit, and nothing else (no attention; hidden is the layer's
        input, scratch after the call). With it a check layer costs, for the
        tokens it drops, only their K and V: the KV is the same as without
        it, the work less. kv_cost: its work per position over a whole
        layer's, in (0, 1] (required with kv_fn; counted into
        recompute_fraction). first_tokens (1.9): leading tokens of each
        document recomputed at every layer (where a document computed alone
        puts its attention sink; report.anchored counts them).

        gate_file (since 1.9): the accuracy gate, a file `kdn blend
        calibrate` wrote (a path; None: no gate). The blend runs only when
        it holds this model's record (by fingerprint) for the method the
        options resolve to (ratio, check layers, kv_fn or not, first_tokens)
        with a KL ratio at or below max_kl_ratio; otherwise every position
        is recomputed (the KV is the full prefill's) and report.gated is
        True. report.gate_kl_ratio: the record's KL ratio (-1: none). A file
        that cannot be read or parsed: InvalidArgumentError.

        hidden_dim: the engine's hidden width (required). ratio: fraction of
        cached tokens recomputed, in [0, 1]; None: the method's default
        (0.28 over check layers [1, 2] with kv_fn, 0.15 at check layer [1]
        without; report.ratio says which). threshold: select by key
        deviation >= threshold instead (None: by ratio); check_layers: the
        check layers, ascending (None: the method's, as for ratio; [0] for
        a one-layer model); rope_scaling, rope_factor: how the model scales
        RoPE (the spec gives theta, style and rotary_dim). NotFoundError when
        a document is unknown or its KV is gone from every tier; kdn's
        InvalidArgumentError (its message) for options it refuses.
        """
        segs = _s.BlendSegments()
        for i, seg in enumerate(segments):
            if isinstance(seg, Segment):
                kind, doc_id, ids = SegmentKind(seg.kind), seg.doc_id, seg.tokens
            elif isinstance(seg, str):
                kind, doc_id, ids = SegmentKind.DOCUMENT, seg, None
            elif isinstance(seg, (bytes, bytearray)):
                raise InvalidArgumentError(f"segment {i}: bytes are ambiguous: kdn.Segment.document(doc_id) or "
                                           f"kdn.Segment.of_tokens(ids)")
            else:
                kind, doc_id, ids = SegmentKind.TOKENS, None, seg
            if kind == SegmentKind.DOCUMENT:
                segs.add_document(doc_id)
            elif kind == SegmentKind.TOKENS:
                segs.add_tokens(ids)
            else:
                raise InvalidArgumentError(f"segment {i}: kind {kind!r}")
        o = _blend_options(layer_fn, hidden_dim, ratio, threshold, check_layers, rope_scaling, rope_factor, kv_fn,
                           kv_cost, first_tokens, gate_file, max_kl_ratio)
        mem = self._memory(kv, True, None, False, stream)  # (a view of its own: the shape is checked below)
        if type(mem) is memoryview:
            return BlendReport._make(_s.kdn_py_blend(self._h, ns, segs, o, self._blend_view(view, mem), mem,
                                                     layer_fn, kv_fn))
        with mem:
            return BlendReport._make(_s.kdn_py_blend_memory(self._h, ns, segs, o, self._blend_view(view, mem),
                                                            mem.native, layer_fn, kv_fn))

    def blend_tokens(self, ns, tokens, kv, view=None, *, layer_fn, hidden_dim, ratio=None, threshold=None,
                     check_layers=None, rope_scaling=RopeScaling.NONE, rope_factor=1.0, kv_fn=None, kv_cost=None,
                     first_tokens=0, gate_file=None, max_kl_ratio=0.2, stream=None):
        """blend() of the context given as its tokens (since 1.9,
        kdn_kv_blend_tokens; experimental in kdn.h): the ranges match()
        finds are placed from their documents' cached KV (a range whose
        document no longer holds those tokens there is computed instead),
        every other token is computed through layer_fn, and the blend
        recomputes what the options select, as blend() does with the same
        documents as segments. tokens: a kdn.Request of token ids, a
        sequence of ints or an int32 buffer. view: None is the canonical
        layout for the context (a 5-dimensional array's third dimension
        must be its length); a KvView's room (num_tokens) is 0 or at least
        the context. report.cached_positions says how much was placed. The
        other arguments are blend()'s."""
        o = _blend_options(layer_fn, hidden_dim, ratio, threshold, check_layers, rope_scaling, rope_factor, kv_fn,
                           kv_cost, first_tokens, gate_file, max_kl_ratio)
        context = _request(tokens)
        mem = self._memory(kv, True, tokens, view, stream)
        if type(mem) is memoryview:
            return BlendReport._make(_s.kdn_py_blend_tokens(self._h, ns, context, o, _view(view), mem, layer_fn,
                                                            kv_fn))
        with mem:
            return BlendReport._make(_s.kdn_py_blend_tokens_memory(self._h, ns, context, o, _view(view),
                                                                   mem.native, layer_fn, kv_fn))

    def match(self, ns, tokens):
        """Where this namespace's knowledge items occur in a context (since
        1.9, kdn_kv_match; experimental in kdn.h): the ranges [begin, end)
        of `tokens` (a kdn.Request of token ids, a sequence of ints or an
        int32 buffer) that are chunks of documents, found at any offset, as
        a list of (begin, end), ascending and not overlapping (consecutive
        chunks of one document are one range). The tokens outside them are
        the ones the engine must compute. Matching reads the index, not the
        tiers: blend_tokens() computes a range whose chunks were evicted
        since."""
        return self._h.match(ns, _request(tokens))

    def _blend_view(self, view, mem):
        """A blend's view: the caller's, or the canonical layout with room
        for the tokens the memory holds (a context with documents needs it
        stated)."""
        if view is not None:
            return _view(view)
        if len(mem.shape) == 5:
            room = mem.shape[2]
            _check_canonical_shape(mem.shape, self.spec, room)
        else:
            room = mem.nbytes // self.spec.kv_bytes_per_token
        return KvView(num_tokens=room)._v

    # ---- Knowledge items ----

    def knowledge_put(self, ns, doc_id, tokens, kv, view=None, *, version=0, metadata=b""):
        """Stores a document: its tokens and their KV computed from position
        0, under doc_id (1..255 bytes); replaces an older version."""
        self._h.knowledge_put(ns, doc_id, version, metadata, _request(tokens), _view(view), self._kv(kv, False))

    def knowledge_info(self, ns, doc_id):
        """A document's DocumentInfo (NotFoundError: no such document)."""
        return DocumentInfo._make(self._h.knowledge_info(ns, doc_id))

    def knowledge_list(self, ns):
        """Every document of this model and namespace, in doc_id order."""
        with self._lock:
            n = self._h.knowledge_list(ns)
            return [DocumentInfo._make(self._h.listed(i)) for i in range(n)]

    def knowledge_pin(self, ns, doc_id, ttl_ms=0):
        """Pins every chunk of the document for ttl_ms (0: until unpinned)."""
        self._h.knowledge_pin(ns, doc_id, ttl_ms)

    def knowledge_unpin(self, ns, doc_id):
        self._h.knowledge_unpin(ns, doc_id)

    def knowledge_expire(self, ns, doc_id, ttl_ms=0):
        """Deletes the document ttl_ms from now (0: now)."""
        self._h.knowledge_expire(ns, doc_id, ttl_ms)

    def knowledge_delete(self, ns, doc_id):
        """Removes the document's chunks from every tier."""
        self._h.knowledge_delete(ns, doc_id)

    def knowledge_fetch(self, ns, doc_id, kv, view):
        """The document's KV into `kv` at its own positions and its tokens,
        under one snapshot: a FetchResult. The view must state its room
        (KvView(num_tokens=...)); too little raises BufferTooSmallError
        whose `needed` is the document's length."""
        if view is None:
            raise InvalidArgumentError("knowledge_fetch needs a view that states its room (KvView(num_tokens=n))")
        result, tokens = self._h.knowledge_fetch(ns, doc_id, _view(view), self._kv(kv, True))
        ids = array.array("i")
        ids.frombytes(tokens)
        return FetchResult(KvResult._native(result), ids)


def _check_canonical_shape(shape, spec, tokens):
    if spec.cache_kind == CacheKind.LATENT:
        want = (spec.num_layers, tokens, spec.latent_dim)
        layout = "[layer][token][latent]"
    else:
        want = (spec.num_layers, 2, tokens, spec.num_kv_heads, spec.head_dim)
        layout = "[layer][k|v][token][kv_head][head_dim]"
    if tuple(shape) != want:
        raise InvalidArgumentError(f"the KV array has shape {tuple(shape)}, but the canonical layout "
                                   f"{layout} of this model is {want} (or pass a KvView)")


def _blend_options(layer_fn, hidden_dim, ratio, threshold, check_layers, rope_scaling, rope_factor, kv_fn, kv_cost,
                   first_tokens, gate_file, max_kl_ratio):
    """The native BlendOptions of blend() and blend_tokens(): what Python
    can tell is wrong is refused here; kdn checks the values."""
    if not callable(layer_fn):
        raise InvalidArgumentError("layer_fn must be callable")
    if kv_fn is not None and not callable(kv_fn):
        raise InvalidArgumentError("kv_fn must be callable (or None)")
    if kv_fn is None and kv_cost is not None:
        raise InvalidArgumentError("kv_cost is the cost of kv_fn's KV pass: pass kv_fn with it")
    o = _s.BlendOptions()
    try:
        o.ratio = -1.0 if ratio is None else ratio  # kdn.h: -1 is the method's default
        o.threshold = -1.0 if threshold is None else threshold
        o.hidden_dim = hidden_dim
        o.rope_scaling = int(rope_scaling)
        o.rope_factor = rope_factor
        o.kv_cost = 0.0 if kv_cost is None else kv_cost  # kdn refuses a kv_fn without its cost, saying so
        o.first_tokens = first_tokens
        for layer in check_layers or ():
            o.add_check_layer(int(layer))
        if gate_file is not None:
            o.gate_file = os.fsdecode(gate_file)
            if not o.gate_file:  # (the native options read an empty path as no gate)
                raise InvalidArgumentError("blend options: gate_file is an empty path")
        o.max_kl_ratio = max_kl_ratio
    except (TypeError, OverflowError, ValueError) as e:
        raise InvalidArgumentError(f"blend options: {e}") from e
    return o


class Op(_Handle):
    """An asynchronous load or save (kdn_op). It keeps the caller's buffer
    (and its recurrent states) exported until it is closed; close() cancels it if it still runs, ends
    the waits on it (they raise ClosedError), waits until kdn no longer
    touches the buffer, frees it and releases the buffer. Timeouts are in
    seconds (None: no limit)."""

    def __init__(self, model, handle, buffer):
        self._h = handle
        self._model = model
        self._lock = threading.Lock()
        core = model._runtime._core
        core.acquire()
        self._track(handle, core, buffer)

    def __repr__(self):
        return f"<kdn.Op{' closed' if self.closed else ''}>"

    def wait(self, timeout=None):
        """Until the op ends: True (it succeeded), or False when the time ran
        out first (it goes on). A failed or cancelled op raises its error
        (CancelledError, ...); a close from another thread meanwhile,
        ClosedError."""
        return self._h.wait(_ms(timeout))

    def wait_layer(self, layer, timeout=None):
        """A load: until model layer `layer` is written (True), or False when
        the time ran out first."""
        return self._h.wait_layer(layer, _ms(timeout))

    def poll(self):
        """Where the op is (an OpState), without waiting."""
        return OpState(self._h.poll())

    @property
    def done(self):
        return self.poll() != OpState.PENDING

    def cancel(self):
        """Asks the op to stop; it ends CANCELLED at its next layer unless it
        has ended already."""
        self._h.cancel()

    def layer_ready(self, layer):
        """A save: model layer `layer` is final in the buffer."""
        self._h.layer_ready(layer)

    def result(self):
        """The op's KvResult so far (state PENDING while it runs)."""
        return KvResult._native(self._h.result())

    def failed_ranges(self):
        """The token ranges [begin, end) of a load that could not be read."""
        with self._lock:
            n = self._h.failed_ranges()
            return [(self._h.range_begin(i), self._h.range_end(i)) for i in range(n)]

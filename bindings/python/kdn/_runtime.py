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
raises ClosedError), and calls after it raise ClosedError.
"""
import abc
import array
import atexit
import collections
import math
import sys
import threading
import weakref

from . import kdn_swig as _s
from ._enums import DType, Layout, LatencyKind, OpState, Status, TierKind
from ._errors import InvalidArgumentError, _from_native
from ._types import (ChunkInfo, DocumentInfo, FetchResult, KvResult, Latency, LookupResult, ModelSpec, Stats, Tier,
                     TierStats)

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
    """

    __slots__ = ("_r",)

    def __init__(self, tokens=None):
        self._r = _s.Request()
        if tokens is not None:
            self._r.set_tokens(tokens)

    @classmethod
    def from_block_hashes(cls, hashes, hash_bytes, block_tokens):
        """A request by the engine's block hashes: `hashes` is bytes-like,
        num_blocks * hash_bytes long; each block covers block_tokens tokens
        (the runtime's chunk_tokens must be a multiple of it)."""
        r = cls()
        r._r.set_block_hashes(hashes, hash_bytes, block_tokens)
        return r

    @property
    def uses_hashes(self):
        return self._r.uses_hashes()

    def __len__(self):
        """Token ids, or block hashes."""
        return self._r.size()

    def __repr__(self):
        return f"kdn.Request({len(self)} {'block hashes' if self.uses_hashes else 'tokens'})"


def _request(tokens):
    if type(tokens) is Request:
        return tokens._r
    r = _s.Request()
    r.set_tokens(tokens)
    return r


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
    if _s.in_editor():  # on kdn's mover thread: close elsewhere, after the editor returns
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
    """

    def __init__(self, *, chunk_tokens=256, tiers=None, host_capacity_bytes=1 << 30, hash_seed=0, worker_threads=0,
                 editor=None):
        o = _s.RuntimeOptions()
        try:
            o.chunk_tokens = chunk_tokens
            o.host_capacity_bytes = host_capacity_bytes
            o.hash_seed = hash_seed
            o.worker_threads = worker_threads
        except (TypeError, OverflowError) as e:
            raise InvalidArgumentError(f"runtime options: {e}") from e
        if isinstance(tiers, Tier):
            tiers = [tiers]
        for tier in tiers or ():
            if not isinstance(tier, Tier):
                raise InvalidArgumentError(f"tiers must be kdn.Tier values, not {type(tier).__name__}")
            o.add_tier(_native_tier(tier))
        bridge = None
        if editor is not None:
            if not callable(editor):
                raise InvalidArgumentError("editor must be a kdn.Editor or a callable edit(info, kv)")
            bridge = _EditorBridge(editor)
            self._h = _s.Runtime(o, bridge)
        else:
            self._h = _s.Runtime(o)
        self.chunk_tokens = chunk_tokens
        self._core = _Core(bridge)
        self._track(self._h, self._core)

    def __repr__(self):
        return f"<kdn.Runtime chunk_tokens={self.chunk_tokens}{' closed' if self.closed else ''}>"

    def model(self, spec=None, /, **fields):
        """Registers a model: a ModelSpec, or its fields as keywords
        (num_layers, num_kv_heads, head_dim, dtype=DType.F32, fingerprint,
        rope_theta=10000, rope_style=RopeStyle.INTERLEAVED, rotary_dim=0)."""
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


def _native_tier(tier):
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
    return t


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
            raise InvalidArgumentError(f"the KV buffer must support the buffer protocol, not {type(kv).__name__}") \
                from e
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

    # ---- Lookup, store, retrieve ----

    def lookup(self, ns, tokens):
        """How many leading tokens are cached (a LookupResult), without side
        effects. A miss is cached_tokens 0, not an error; a bad request
        raises (in lookup_batch it fails alone, in its result's status)."""
        t = self._h.lookup(ns, tokens._r if type(tokens) is Request else _request(tokens))
        if t[0]:  # the one request's own status (kdn_kv_lookup is batched)
            raise _from_native(t[0], f"lookup: the request failed ({_s.status_string(t[0])})", False, 0)
        return _tuple_new(LookupResult, (_OK, t[1], t[2]))  # LookupResult(...) without its Python-level __new__

    def lookup_batch(self, ns, requests):
        """Lookups of many requests in one call: a list of LookupResult. A
        bad request fails alone, in its result's status (no exception)."""
        batch = _s.LookupBatch()
        for r in requests:
            batch.add(_request(r))
        self._h.lookup_batch(ns, batch)
        out = []
        for i in range(batch.size()):
            t = batch.result(i)
            out.append(LookupResult(Status(t[0]), t[1], t[2]))
        return out

    def store(self, ns, tokens, kv, view=None):
        """Stores the tokens' KV from `kv` (read only: bytes are fine).
        Chunks already cached are skipped; when not all fit, the longest
        prefix that fits is kept. Returns a KvResult (tokens: the leading
        tokens cached after the call)."""
        return KvResult._native(self._h.store(ns, _request(tokens), _view(view), self._kv(kv, False)))

    def retrieve(self, ns, tokens, kv, view=None):
        """Writes the KV of the longest cached prefix into `kv`. Returns a
        KvResult: tokens = its length, 0 on a miss (not an error)."""
        return KvResult._native(self._h.retrieve(ns, _request(tokens), _view(view), self._kv(kv, True)))

    def load_async(self, ns, tokens, kv, view=None):
        """Starts loading the cached prefix into `kv` layer by layer in the
        background: an Op, which keeps `kv` exported (it cannot be resized
        or freed) until it is closed."""
        mv = self._kv(kv, True)
        return Op(self, self._h.load_async(ns, _request(tokens), _view(view), mv), mv)

    def save_async(self, ns, tokens, kv, view=None):
        """Starts a save from `kv`: call op.layer_ready(layer) once per model
        layer as it becomes final, then op.wait(). `kv` stays exported until
        the Op is closed."""
        mv = self._kv(kv, False)
        return Op(self, self._h.save_async(ns, _request(tokens), _view(view), mv), mv)

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


class Op(_Handle):
    """An asynchronous load or save (kdn_op). It keeps the caller's buffer
    exported until it is closed; close() cancels it if it still runs, ends
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

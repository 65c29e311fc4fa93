// SPDX-License-Identifier: Apache-2.0
package dev.kdn;

import dev.kdn.swig.NativeFetchResult;
import dev.kdn.swig.NativeKvView;
import dev.kdn.swig.NativeLookupBatch;
import dev.kdn.swig.NativeMemory;
import dev.kdn.swig.NativeModel;
import dev.kdn.swig.NativeRequest;
import dev.kdn.swig.NativeStateLayers;
import dev.kdn.swig.NativeTokenRanges;
import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Objects;
import java.util.function.UnaryOperator;

/**
 * A model of a {@link KdnRuntime} (kdn_model): stores, finds and loads KV of its shape, under a
 * namespace (a tenant: KV stored under one is never visible under another).
 *
 * <p>KV memory is a <b>direct</b> {@link ByteBuffer} (see {@link Kdn#allocate}), which kdn reads or
 * writes in place, without a copy, as a whole: from its address to its capacity, whatever its
 * position and limit ({@code slice()} passes a part). A heap buffer is an {@link
 * IllegalArgumentException}, and so is a read-only one where kdn writes. A {@link KvView} says
 * where the layers, tokens and heads lie in it; the canonical layout is
 * [layer][k|v][token][kv_head][head_dim]. Java cannot bound a buffer beyond 2 GiB, so one call
 * moves at most that much.
 *
 * <p>The KV calls also take GPU memory ({@link DeviceMemory}, since 1.5): an address, a size and
 * the engine's CUDA stream, on a runtime with a device ({@link RuntimeOptions.Builder#device}).
 * Knowledge items take buffers only.
 *
 * <p>A miss is not an error: a retrieve or load of nothing returns 0 tokens. Failures throw the
 * {@link KdnException} for their status; null arguments throw {@link NullPointerException}.
 *
 * <p>Thread-safe. {@link #close()} may race another thread's call: that call completes or throws
 * {@link IllegalStateException}. Closing is idempotent and throws nothing; a closed model's methods
 * throw {@link IllegalStateException}. A model nobody closed is closed by a {@link Cleaner} (a
 * backstop only).
 */
public final class Model implements AutoCloseable {
  private final NativeModel handle;
  private final ModelSpec spec;
  private final KdnRuntime runtime;
  private final Core core;
  private final Core.Release release;
  private final Object listLock = new Object();
  private volatile boolean closed;

  Model(NativeModel handle, ModelSpec spec, KdnRuntime runtime, Core core) {
    this.handle = handle;
    this.spec = spec;
    this.runtime = runtime;
    this.core = core;
    core.acquire();
    this.release = new Core.Release(handle::close, handle::delete, core, null);
    Natives.CLEANER.register(this, release);
  }

  private NativeModel handle() {
    if (closed) throw new IllegalStateException("the model is closed");
    return handle;
  }

  public ModelSpec spec() {
    return spec;
  }

  /** The runtime this model belongs to. */
  public KdnRuntime runtime() {
    return runtime;
  }

  /** Bytes of one token's KV, all layers, K and V. */
  public long kvBytesPerToken() {
    try {
      return handle().kv_bytes_per_token();
    } finally {
      Natives.fence(this);
    }
  }

  /** The 32-byte identity kdn derived from the spec, as 64 hex digits. */
  public String fingerprint() {
    try {
      return handle().fingerprint();
    } finally {
      Natives.fence(this);
    }
  }

  /**
   * Tells the runtime that the engine prefilled {@code tokens} tokens (unsigned) of this model in
   * {@code elapsed} (wall time of the forward pass, as the engine measured it; since 1.4). Later
   * loads price the tokens they serve at the model's mean prefill time per token ({@link
   * Stats#ttftSavedNs()}). Report the prefills of the tokens a load did not serve, and full
   * prefills, as they happen.
   *
   * @throws InvalidArgumentException when {@code tokens} or {@code elapsed} is 0, {@code elapsed}
   *     is negative or past 64-bit nanoseconds, or the time is over an hour per token
   */
  public void reportPrefill(long tokens, Duration elapsed) {
    Objects.requireNonNull(elapsed, "elapsed");
    if (elapsed.isNegative()) {
      throw new InvalidArgumentException("reportPrefill: the elapsed time " + elapsed + " is negative");
    }
    long nanos;
    try {
      nanos = elapsed.toNanos();
    } catch (ArithmeticException e) {
      throw new InvalidArgumentException("reportPrefill: " + elapsed + " does not fit in 64-bit nanoseconds");
    }
    try {
      handle().report_prefill(tokens, nanos);
    } finally {
      Natives.fence(this);
    }
  }

  // ---- Lookup, store, retrieve ----

  /**
   * How many leading tokens of the request are cached (no side effects). A bad request (a negative
   * token id) throws its {@link KdnException}, as every single call does.
   */
  public LookupResult lookup(String ns, Request request) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(request, "request");
    LookupResult r;
    try {
      r = Natives.lookupResult(handle().lookup(ns, request.handle));
    } finally {
      Natives.fence(this, request);
    }
    if (r.status() != Status.OK) {
      int code = r.status() == Status.UNKNOWN ? Status.INTERNAL.code() : r.status().code();
      throw KdnException.of(code, "lookup: kdn refused the request (" + Kdn.statusString(code) + ")", 0);
    }
    return r;
  }

  /** Lookups of many requests in one call; a bad request fails alone, in its result's status. */
  public List<LookupResult> lookup(String ns, List<Request> requests) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(requests, "requests");
    NativeModel h = handle();
    NativeLookupBatch batch = new NativeLookupBatch();
    try {
      for (Request r : requests) batch.add(Objects.requireNonNull(r, "request").handle);
      h.lookup_batch(ns, batch);
      List<LookupResult> out = new ArrayList<>(requests.size());
      for (int i = 0; i < requests.size(); ++i) out.add(Natives.lookupResult(batch.result(i)));
      return out;
    } finally {
      batch.delete();
      Natives.fence(this, requests);
    }
  }

  /** Stores the request's KV from {@code kv}, laid out as {@code view} says. */
  public KvResult store(String ns, Request request, KvView view, ByteBuffer kv) {
    return Natives.kvResult(kvCall(ns, request, view, kv, Natives::readable, NativeModel::store));
  }

  /** Stores the request's KV from {@code kv} in the canonical layout. */
  public KvResult store(String ns, Request request, ByteBuffer kv) {
    return store(ns, request, KvView.canonical(), kv);
  }

  /**
   * Loads the cached prefix of the request into {@code kv}, laid out as {@code view} says; {@code
   * tokens()} of the result says how many (0 on a miss), {@code covered()} the cached prefix found:
   * {@code tokens()} is shorter when a chunk could not be read, or (since 1.7) its tier delivers
   * slower than the engine prefills ({@link RuntimeOptions.Builder#loadSlowerThanPrefill}). The
   * request's TTFT target ({@link Request#withTtftTarget}) applies.
   */
  public KvResult retrieve(String ns, Request request, KvView view, ByteBuffer kv) {
    return Natives.kvResult(kvCall(ns, request, view, kv, Natives::writable, NativeModel::retrieve));
  }

  /** Loads the cached prefix of the request into {@code kv} in the canonical layout. */
  public KvResult retrieve(String ns, Request request, ByteBuffer kv) {
    return retrieve(ns, request, KvView.canonical(), kv);
  }

  /**
   * Starts loading the cached prefix layer by layer in the background. The op keeps {@code kv}
   * until it is closed; do not touch the buffer before the op ends. The request's TTFT target
   * ({@link Request#withTtftTarget}) applies; ranges left to recompute are in {@link
   * Op#failedRanges()}.
   */
  public Op loadAsync(String ns, Request request, KvView view, ByteBuffer kv) {
    return new Op(kvCall(ns, request, view, kv, Natives::writable, NativeModel::load_async), kv, core);
  }

  /**
   * Starts a save of the request's KV from {@code kv}: call {@link Op#layerReady} for each model
   * layer as it becomes final, then {@link Op#await()}. The op keeps {@code kv} until it is closed.
   */
  public Op saveAsync(String ns, Request request, KvView view, ByteBuffer kv) {
    return new Op(kvCall(ns, request, view, kv, Natives::readable, NativeModel::save_async), kv, core);
  }

  // ---- With the recurrent layers' states (since 1.12) ----

  /**
   * Stores the request's KV from {@code kv} and, for a model with recurrent layers ({@link
   * ModelSpec.Builder#stateLayers}), their state after the request's last token: one direct buffer
   * per recurrent layer in {@code states}, in order, each at least {@link ModelSpec#stateBytes()}
   * long (kdn reads its first stateBytes), kept as the snapshot at that boundary. A prefix counts
   * for a lookup only where a snapshot is: an engine that stores at each chunk boundary of its
   * prefill makes each one a possible hit. An empty list stores the KV alone (no hit counts it).
   *
   * @throws InvalidArgumentException when {@code states} does not hold one buffer per recurrent
   *     layer, a buffer is shorter than stateBytes, or the model has no recurrent layers
   */
  public KvResult store(String ns, Request request, KvView view, ByteBuffer kv, List<ByteBuffer> states) {
    return Natives.kvResult(statesCall(ns, request, view, kv, states, false, NativeModel::store_states));
  }

  /**
   * Loads the cached prefix of the request into {@code kv} and the recurrent layers' state at that
   * prefix into {@code states} (one writable direct buffer per recurrent layer, each at least
   * {@link ModelSpec#stateBytes()}; nothing is written on a miss). A prefix counts only where the
   * state at its end was stored. A model with recurrent layers needs them: {@link
   * #retrieve(String, Request, KvView, ByteBuffer)} of one is an {@link InvalidArgumentException}.
   */
  public KvResult retrieve(String ns, Request request, KvView view, ByteBuffer kv, List<ByteBuffer> states) {
    return Natives.kvResult(statesCall(ns, request, view, kv, states, true, NativeModel::retrieve_states));
  }

  /**
   * {@link #loadAsync(String, Request, KvView, ByteBuffer)} with the recurrent layers' states, as
   * {@link #retrieve(String, Request, KvView, ByteBuffer, List)} writes them. The op keeps {@code
   * kv} and the state buffers until it is closed; do not touch them before the op ends.
   */
  public Op loadAsync(String ns, Request request, KvView view, ByteBuffer kv, List<ByteBuffer> states) {
    List<ByteBuffer> kept = Collections.unmodifiableList(new ArrayList<>(Objects.requireNonNull(states, "states")));
    return new Op(statesCall(ns, request, view, kv, kept, true, NativeModel::load_async_states), kv,
        kept, core);
  }

  /**
   * {@link #saveAsync(String, Request, KvView, ByteBuffer)} with the recurrent layers' states, as
   * {@link #store(String, Request, KvView, ByteBuffer, List)} takes them: kdn reads them when every
   * layer is ready, so they must hold the state after the request's last token by then. The op
   * keeps {@code kv} and the state buffers until it is closed.
   */
  public Op saveAsync(String ns, Request request, KvView view, ByteBuffer kv, List<ByteBuffer> states) {
    List<ByteBuffer> kept = Collections.unmodifiableList(new ArrayList<>(Objects.requireNonNull(states, "states")));
    return new Op(statesCall(ns, request, view, kv, kept, false, NativeModel::save_async_states), kv,
        kept, core);
  }

  /** A native KV call with the recurrent states. */
  @FunctionalInterface
  private interface StatesCall<T> {
    T call(NativeModel model, String ns, NativeRequest request, NativeKvView view, ByteBuffer kv,
        NativeStateLayers states);
  }

  /**
   * {@link #kvCall} with the states ({@code writes}: kdn writes the KV and the states): each state
   * direct (and writable where kdn writes), passed whole (address to capacity), kept reachable for
   * the call; their count and lengths are checked against the spec natively, before kdn is called.
   */
  private <T> T statesCall(String ns, Request request, KvView view, ByteBuffer kv, List<ByteBuffer> states,
      boolean writes, StatesCall<T> call) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(request, "request");
    Objects.requireNonNull(states, "states");
    Natives.checkView(view, spec);
    NativeModel h = handle();
    ByteBuffer buffer = writes ? Natives.writable(kv) : Natives.readable(kv);
    NativeStateLayers nativeStates = new NativeStateLayers();
    try {
      for (int i = 0; i < states.size(); ++i) {
        ByteBuffer s = states.get(i);
        if (s == null) throw new NullPointerException("states[" + i + "]");
        if (!s.isDirect()) {
          throw new IllegalArgumentException("states[" + i + "]: kdn needs a direct ByteBuffer (Kdn.allocate)");
        }
        if (writes && s.isReadOnly()) {
          throw new IllegalArgumentException("states[" + i + "]: kdn cannot write into a read-only ByteBuffer");
        }
        nativeStates.add(s);
      }
      return call.call(h, ns, request.handle, view.handle, buffer, nativeStates);
    } finally {
      nativeStates.delete();
      Natives.fence(this, request, view);
      Natives.fence(kv, states);
    }
  }

  // ---- The same calls on device memory (since 1.5) ----

  /**
   * Stores the request's KV from device memory, laid out as {@code view} says; {@link
   * UnsupportedException} when the runtime has no device.
   */
  public KvResult store(String ns, Request request, KvView view, DeviceMemory kv) {
    return Natives.kvResult(deviceCall(ns, request, view, kv, false, NativeModel::store_memory));
  }

  /**
   * Loads the cached prefix of the request into device memory, laid out as {@code view} says
   * (written on the device; in place when the call returns); {@code tokens()} of the result says
   * how many.
   */
  public KvResult retrieve(String ns, Request request, KvView view, DeviceMemory kv) {
    return Natives.kvResult(deviceCall(ns, request, view, kv, true, NativeModel::retrieve_memory));
  }

  /**
   * Starts loading the cached prefix into device memory, layer by layer; each layer is in place
   * when {@link Op#awaitLayer} returns for it. The op keeps {@code kv} until it is closed; the
   * memory must stay allocated until then.
   */
  public Op loadAsync(String ns, Request request, KvView view, DeviceMemory kv) {
    return new Op(deviceCall(ns, request, view, kv, true, NativeModel::load_async_memory), kv, core);
  }

  /** Starts a save from device memory (see {@link #saveAsync(String, Request, KvView, ByteBuffer)}). */
  public Op saveAsync(String ns, Request request, KvView view, DeviceMemory kv) {
    return new Op(deviceCall(ns, request, view, kv, false, NativeModel::save_async_memory), kv, core);
  }

  /** A native KV call on memory by address. */
  @FunctionalInterface
  private interface MemoryCall<T> {
    T call(NativeModel model, String ns, NativeRequest request, NativeKvView view, NativeMemory memory);
  }

  /** {@link #kvCall} for device memory ({@code writes}: kdn writes it), with the same checks in order. */
  private <T> T deviceCall(String ns, Request request, KvView view, DeviceMemory kv, boolean writes,
      MemoryCall<T> call) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(request, "request");
    Objects.requireNonNull(kv, "kv");
    Natives.checkView(view, spec);
    NativeModel h = handle();
    if (writes) kv.writable();
    try {
      return call.call(h, ns, request.handle, view.handle, kv.handle);
    } finally {
      Natives.fence(this, request, view);
      Natives.fence(kv);
    }
  }

  /** A native KV call: store, retrieve, load_async or save_async. */
  @FunctionalInterface
  private interface KvCall<T> {
    T call(NativeModel model, String ns, NativeRequest request, NativeKvView view, ByteBuffer kv);
  }

  /**
   * What the KV calls share: the checks (null arguments, the view's dtype, the model open, the
   * buffer by {@code checkBuffer}, in that order), the call, the fence.
   */
  private <T> T kvCall(String ns, Request request, KvView view, ByteBuffer kv, UnaryOperator<ByteBuffer> checkBuffer,
      KvCall<T> call) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(request, "request");
    Natives.checkView(view, spec);
    try {
      return call.call(handle(), ns, request.handle, view.handle, checkBuffer.apply(kv));
    } finally {
      Natives.fence(this, request, view);
    }
  }

  // ---- Knowledge items ----

  /**
   * Stores a document: its tokens (ids, from position 0) and their KV; replaces an older version
   * of the same {@code docId} (1..255 bytes of UTF-8). {@code version} is unsigned. The request's
   * salt ({@link Request#withSalt}) is ignored: knowledge items are per namespace.
   */
  public void knowledgePut(String ns, String docId, long version, String metadata, Request tokens, KvView view,
      ByteBuffer kv) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    Objects.requireNonNull(metadata, "metadata");
    Objects.requireNonNull(tokens, "tokens");
    Natives.checkView(view, spec);
    try {
      handle().knowledge_put(ns, docId, version, metadata, tokens.handle, view.handle, Natives.readable(kv));
    } finally {
      Natives.fence(this, tokens, view);
    }
  }

  /** A document's information; {@link NotFoundException} if there is none. */
  public DocumentInfo knowledgeInfo(String ns, String docId) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    try {
      return Natives.documentInfo(handle().knowledge_info(ns, docId));
    } finally {
      Natives.fence(this);
    }
  }

  /** Every document of this model and namespace, in docId order. */
  public List<DocumentInfo> knowledgeList(String ns) {
    Objects.requireNonNull(ns, "ns");
    NativeModel h = handle();
    try {
      synchronized (listLock) { // the native list is kept in the model until read
        int n = (int) h.knowledge_list(ns);
        List<DocumentInfo> out = new ArrayList<>(n);
        for (int i = 0; i < n; ++i) out.add(Natives.documentInfo(h.listed(i)));
        return out;
      }
    } finally {
      Natives.fence(this);
    }
  }

  /** Pins every chunk of the document for {@code ttl} ({@link Duration#ZERO}: until unpinned). */
  public void knowledgePin(String ns, String docId, Duration ttl) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    try {
      handle().knowledge_pin(ns, docId, millis(ttl));
    } finally {
      Natives.fence(this);
    }
  }

  public void knowledgeUnpin(String ns, String docId) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    try {
      handle().knowledge_unpin(ns, docId);
    } finally {
      Natives.fence(this);
    }
  }

  /** The document is deleted {@code ttl} from now ({@link Duration#ZERO}: now). */
  public void knowledgeExpire(String ns, String docId, Duration ttl) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    try {
      handle().knowledge_expire(ns, docId, millis(ttl));
    } finally {
      Natives.fence(this);
    }
  }

  /** Removes the document's chunks from every tier (chunks another document shares stay). */
  public void knowledgeDelete(String ns, String docId) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    try {
      handle().knowledge_delete(ns, docId);
    } finally {
      Natives.fence(this);
    }
  }

  /**
   * The document's KV into {@code kv} at its own positions (the view must state its room, {@code
   * KvView.canonical(n)} for instance) and its tokens into the result. Too little room: {@link
   * BufferTooSmallException} with {@code needed()} the document's length.
   */
  public FetchResult knowledgeFetch(String ns, String docId, KvView view, ByteBuffer kv) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(docId, "docId");
    Natives.checkView(view, spec);
    NativeFetchResult f;
    try {
      f = handle().knowledge_fetch(ns, docId, view.handle, Natives.writable(kv));
    } finally {
      Natives.fence(this, view);
    }
    try {
      int n = (int) f.token_count();
      int[] tokens = new int[n];
      if (n > 0) {
        ByteBuffer b = ByteBuffer.allocateDirect(4 * n).order(ByteOrder.nativeOrder());
        f.copy_tokens(b);
        b.asIntBuffer().get(tokens);
      }
      KvResult result = Natives.kvResult(f.getResult());
      return new FetchResult(result, tokens);
    } finally {
      f.delete();
    }
  }

  /**
   * Where this namespace's knowledge items occur in a context (since 1.9; {@code kdn_kv_match},
   * experimental in kdn.h): the ranges [begin, end) of the request's tokens that are chunks of
   * documents put with {@link #knowledgePut}, found at any offset, ascending and not overlapping
   * (consecutive chunks of one document are one range). The tokens outside them are the ones the
   * engine must compute. Matching reads the index, not the tiers: a range whose chunks were evicted
   * since is still reported. Blending itself is not bound in Java (README). The request's salt is
   * ignored, as {@link #knowledgePut} ignores it.
   *
   * @throws InvalidArgumentException for a request of block hashes, or of no tokens
   */
  public List<TokenRange> match(String ns, Request context) {
    Objects.requireNonNull(ns, "ns");
    Objects.requireNonNull(context, "context");
    NativeTokenRanges ranges;
    try {
      ranges = handle().match(ns, context.handle);
    } finally {
      Natives.fence(this, context);
    }
    try {
      int n = (int) ranges.size();
      List<TokenRange> out = new ArrayList<>(n);
      for (int i = 0; i < n; ++i) out.add(new TokenRange(ranges.begin(i), ranges.end(i)));
      return out;
    } finally {
      ranges.delete();
    }
  }

  static long millis(Duration d) {
    Objects.requireNonNull(d, "ttl");
    try {
      return d.toMillis();
    } catch (ArithmeticException e) {
      return d.isNegative() ? Long.MIN_VALUE : Long.MAX_VALUE;
    }
  }

  public boolean isClosed() {
    return closed;
  }

  /** Closes the model (idempotent; throws nothing). */
  @Override
  public void close() {
    closed = true;
    release.close();
  }
}

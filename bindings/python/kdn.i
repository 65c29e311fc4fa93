// SPDX-License-Identifier: Apache-2.0
// The SWIG module under the Python package `kdn`: kdn_swig.py plus the
// extension _kdn_swig, over the C++ layer bindings/swig/kdn_binding.hpp.
// The package (kdn/*.py) is the API; this module is its private engine.
//
// What the typemaps below do:
// - (void *data, size_t bytes): any object with the buffer protocol
//   (numpy arrays, bytearray, memoryview, mmap), without a copy. It must be
//   C-contiguous; it must be writable, except for the calls that only read
//   it (store, save_async, knowledge_put), which take bytes too.
//   The recurrent states of a call (1.12, StateLayers::add) take the same
//   typemap: writable, except add_readonly (for store and save_async).
// - (const int32_t *tokens, size_t num_tokens): a buffer of 4-byte ints
//   without a copy (numpy int32, array('i')), or any sequence of ints.
// - (const char *hashes, size_t bytes), (const char *salt, size_t bytes):
//   any bytes-like object, copied in (the package encodes a str salt).
// - const std::string &: str (UTF-8) or bytes.
// - Results (KvResult, LookupResult, Stats, ...) come back as tuples, which
//   the package turns into its own named types: one C call per result.
// - kdn::binding::Error becomes the package's exception for its status, made
//   by a factory the package registers (kdn_py_set_error_factory); bad Python
//   arguments become its InvalidArgumentError the same way.
// - Editor is a director: kdn's mover thread calls a Python subclass's
//   edit(info_tuple, kv_memoryview) holding the GIL; an exception there is
//   reported through sys.unraisablehook and turned into a failed edit. The
//   memoryview is kdn's memory: the package's bridge alone sees it (the
//   user's editor gets a copy), and releases it before returning.
// - in_editor() runs with the GIL held (a finalizer asks it).
// - GPU arrays reach kdn as a kdn::binding::Memory (address, bytes, kind,
//   CUDA stream) that the package fills: it reads __cuda_array_interface__
//   and DLPack capsules itself (kdn/_arrays.py).
// - Blending: kdn_py_blend (and kdn_py_blend_tokens, 1.9) calls
//   Model::blend with a C++ BlendLayer over Python callables (below): the
//   layer callback and, optionally, the KV pass. It releases the GIL while
//   kdn works; each callback takes it again on the same thread. An
//   exception a callable raises fails the blend and is raised by
//   kdn_py_blend, as it was.
// - Model::match (1.9) returns its TokenRanges as a list of (begin, end).
// - Runtime::quota_stats (1.13) returns a list of tuples, one per quota.
//
// threads="1": every call releases the GIL while kdn works, so other Python
// threads run, and the mover thread can take the GIL to run an editor while
// this thread waits for it (close, a wait).
%module(package="kdn", directors="1", threads="1") kdn_swig

%{
#include "kdn_binding.hpp"

#include <cstring>
#include <exception>
#include <string>
#include <vector>

// The package's factory: (status, message, closed, needed) -> exception.
static PyObject *kdn_py_error_factory = NULL;

// Sets the Python error for a failed call (the GIL is held).
static void kdn_py_raise(int status, const char *message, bool closed, unsigned long long needed) {
  PyObject *text = PyUnicode_DecodeUTF8(message, (Py_ssize_t)std::strlen(message), "replace");
  if (text == NULL) return;
  if (kdn_py_error_factory == NULL) {
    PyErr_SetObject(PyExc_RuntimeError, text);
    Py_DECREF(text);
    return;
  }
  PyObject *exc = PyObject_CallFunction(kdn_py_error_factory, "iOiK", status, text, closed ? 1 : 0, needed);
  Py_DECREF(text);
  if (exc != NULL) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }  // else the factory's own error stays set
}

// A bad Python argument: the package's InvalidArgumentError, chained to the
// error Python raised (BufferError, TypeError, ...) when there is one.
static void kdn_py_invalid(const std::string &message) {
  PyObject *cause_type = NULL, *cause = NULL, *cause_tb = NULL;
  PyErr_Fetch(&cause_type, &cause, &cause_tb);
  std::string text = message;
  if (cause_type != NULL) {
    PyErr_NormalizeException(&cause_type, &cause, &cause_tb);
    PyObject *s = cause ? PyObject_Str(cause) : NULL;
    if (s != NULL) {
      const char *c = PyUnicode_AsUTF8(s);
      if (c != NULL) text += std::string(" (") + c + ")";
      Py_DECREF(s);
    }
    PyErr_Clear();
  }
  kdn_py_raise(KDN_ERR_INVALID_ARGUMENT, text.c_str(), false, 0);
  if (cause != NULL && PyErr_Occurred()) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL) PyException_SetCause(value, cause);  // steals cause
    else Py_DECREF(cause);
    cause = NULL;
    PyErr_Restore(type, value, tb);
  }
  Py_XDECREF(cause_type);
  Py_XDECREF(cause);
  Py_XDECREF(cause_tb);
}

// A buffer export held for one call: released on every way out of the
// wrapper (SWIG's locals are not initialised, and its fail path runs the
// cleanup of arguments not converted yet).
struct KdnPyBuffer {
  Py_buffer view;
  std::vector<int32_t> copy;  // tokens that were not an int32 buffer
  KdnPyBuffer() { view.obj = NULL; }
  ~KdnPyBuffer() {
    if (view.obj != NULL) PyBuffer_Release(&view);
  }
  KdnPyBuffer(const KdnPyBuffer &) = delete;
  KdnPyBuffer &operator=(const KdnPyBuffer &) = delete;
};

// The calls that only read the caller's KV: they take read-only buffers.
static bool kdn_py_reads_only(const char *symname) {
  return std::strcmp(symname, "Model_store") == 0 || std::strcmp(symname, "Model_save_async") == 0 ||
         std::strcmp(symname, "Model_knowledge_put") == 0 || std::strcmp(symname, "Model_store_states") == 0 ||
         std::strcmp(symname, "Model_save_async_states") == 0 ||
         std::strcmp(symname, "StateLayers_add_readonly") == 0;
}

// The caller's KV memory: a C-contiguous buffer, writable unless `readonly_ok`.
static bool kdn_py_get_buffer(PyObject *o, Py_buffer *view, bool readonly_ok, const char *what) {
  view->obj = NULL;
  const int flags = PyBUF_C_CONTIGUOUS | (readonly_ok ? 0 : PyBUF_WRITABLE);
  if (PyObject_GetBuffer(o, view, flags) == 0) return true;
  view->obj = NULL;
  kdn_py_invalid(std::string(what) + (readonly_ok ? " must be a C-contiguous buffer (bytes, bytearray, numpy array)"
                                                   : " must be a writable C-contiguous buffer (bytearray, numpy array)"));
  return false;
}

static bool kdn_py_kv_arg(PyObject *o, KdnPyBuffer *b, bool readonly_ok, void **data, size_t *bytes) {
  if (!kdn_py_get_buffer(o, &b->view, readonly_ok, "the KV buffer")) return false;
  *data = b->view.buf;
  *bytes = (size_t)b->view.len;
  return true;
}

static bool kdn_py_bytes_arg(PyObject *o, KdnPyBuffer *b, const char *what, const char **data, size_t *bytes) {
  if (!kdn_py_get_buffer(o, &b->view, true, what)) return false;
  *data = static_cast<const char *>(b->view.buf);
  *bytes = (size_t)b->view.len;
  return true;
}

// Token ids: a C-contiguous buffer of 4-byte ints is used in place; any
// other sequence of ints is copied into b->copy.
static bool kdn_py_tokens(PyObject *o, KdnPyBuffer *b, const int32_t **data, size_t *n) {
  Py_buffer *view = &b->view;
  std::vector<int32_t> *copy = &b->copy;
  if (PyObject_CheckBuffer(o)) {
    if (PyObject_GetBuffer(o, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
      const char *f = view->format ? view->format : "B";
      if (*f == '<' || *f == '=' || *f == '@') ++f;
      if (view->itemsize == 4 && (std::strcmp(f, "i") == 0 || std::strcmp(f, "l") == 0)) {
        *data = static_cast<const int32_t *>(view->buf);
        *n = (size_t)view->len / 4;
        return true;
      }
      const bool integral = f[0] != '\0' && f[1] == '\0' && std::strchr("bBhHiIlLqQ", f[0]) != NULL;
      PyBuffer_Release(view);
      view->obj = NULL;
      if (!integral) {
        kdn_py_invalid(std::string("tokens must be ints, not a buffer of format '") + f + "'");
        return false;
      }
    } else {
      PyErr_Clear();  // not contiguous: read it as a sequence
    }
  }
  PyObject *seq = PySequence_Fast(o, "tokens must be a sequence of ints or an int32 buffer");
  if (seq == NULL) {
    kdn_py_invalid("tokens must be a sequence of ints or an int32 buffer");
    return false;
  }
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  PyObject **items = PySequence_Fast_ITEMS(seq);
  copy->resize((size_t)count);
  for (Py_ssize_t i = 0; i < count; ++i) {
    const long long v = PyLong_AsLongLong(items[i]);
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      kdn_py_invalid("token " + std::to_string(i) + " is not an int");
      return false;
    }
    if (v < INT32_MIN || v > INT32_MAX) {
      Py_DECREF(seq);
      kdn_py_invalid("token " + std::to_string(i) + " = " + std::to_string(v) + " is out of the int32 range");
      return false;
    }
    (*copy)[(size_t)i] = (int32_t)v;
  }
  Py_DECREF(seq);
  *data = copy->data();
  *n = copy->size();
  return true;
}

// A string argument: str (as UTF-8) or bytes.
static bool kdn_py_string(PyObject *o, std::string *out, const char *name) {
  if (PyUnicode_Check(o)) {
    Py_ssize_t len = 0;
    const char *s = PyUnicode_AsUTF8AndSize(o, &len);
    if (s != NULL) {
      out->assign(s, (size_t)len);
      return true;
    }
    PyErr_Clear();  // lone surrogates: bytes that came back from kdn as text (surrogateescape)
    PyObject *raw = PyUnicode_AsEncodedString(o, "utf-8", "surrogateescape");
    if (raw == NULL) {
      kdn_py_invalid(std::string(name) + " is not valid text");
      return false;
    }
    out->assign(PyBytes_AS_STRING(raw), (size_t)PyBytes_GET_SIZE(raw));
    Py_DECREF(raw);
    return true;
  }
  if (PyBytes_Check(o)) {
    out->assign(PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o));
    return true;
  }
  kdn_py_invalid(std::string(name) + " must be str or bytes, not " + Py_TYPE(o)->tp_name);
  return false;
}

static PyObject *kdn_py_kv_result(const kdn::binding::KvResult &r) {
  return Py_BuildValue("(iiKKKI)", r.state, r.status, (unsigned long long)r.tokens, (unsigned long long)r.covered,
                       (unsigned long long)r.num_failed, (unsigned int)r.flags);
}

static PyObject *kdn_py_lookup_result(const kdn::binding::LookupResult &r) {
  const uint32_t tiers = r.num_tiers < KDN_MAX_TIERS ? r.num_tiers : KDN_MAX_TIERS;
  PyObject *per_tier = PyTuple_New(tiers);
  if (per_tier == NULL) return NULL;
  for (uint32_t i = 0; i < tiers; ++i) {
    PyTuple_SET_ITEM(per_tier, i, PyLong_FromUnsignedLongLong(r.tier_tokens_[i]));
  }
  return Py_BuildValue("(iKN)", r.status, (unsigned long long)r.cached_tokens, per_tier);
}

// Thrown by a wrapper's C++ code when a Python exception is already set.
struct KdnPyRaised {};

static PyObject *kdn_py_document_info(const kdn::binding::DocumentInfo &d) {
  // doc_id: text; bytes that are not UTF-8 survive a round trip (surrogateescape).
  PyObject *doc_id = PyUnicode_DecodeUTF8(d.doc_id.data(), (Py_ssize_t)d.doc_id.size(), "surrogateescape");
  if (doc_id == NULL) return NULL;
  return Py_BuildValue("(NOKKIILKL)", doc_id, d.pinned ? Py_True : Py_False,
                       (unsigned long long)d.version, (unsigned long long)d.num_tokens, (unsigned int)d.chunks,
                       (unsigned int)d.chunks_present, (long long)d.expires_in_ms, (unsigned long long)d.hits,
                       (long long)d.pin_expires_in_ms);
}
%}

%include <stdint.i>
%include <std_string.i>

// ---- Errors ------------------------------------------------------------------

%exception {
  try {
    $action
  } catch (const KdnPyRaised &) {
    SWIG_fail;  // a Python exception is set (a blend callback's)
  } catch (const kdn::binding::Error &e) {
    kdn_py_raise(e.status(), e.message().c_str(), e.closed(), e.needed());
    SWIG_fail;
  } catch (const std::bad_alloc &) {
    kdn_py_raise(KDN_ERR_NO_MEMORY, "out of memory", false, 0);
    SWIG_fail;
  } catch (const std::exception &e) {
    kdn_py_raise(KDN_ERR_INTERNAL, e.what(), false, 0);
    SWIG_fail;
  }
}

%nothread kdn::binding::in_editor;
%nothread kdn_py_set_error_factory;
%exception kdn_py_set_error_factory;
%inline %{
// The package's factory of exceptions (called with the GIL held).
void kdn_py_set_error_factory(PyObject *factory) {
  PyObject *old = kdn_py_error_factory;
  kdn_py_error_factory = NULL;
  if (factory != NULL && factory != Py_None) {
    Py_INCREF(factory);
    kdn_py_error_factory = factory;
  }
  Py_XDECREF(old);
}
%}

// ---- Arguments -----------------------------------------------------------------

// (SWIG renames a typemap's locals by text, and only once in a multi-argument
// typemap: each local below is named once, in one helper call.)
%typemap(in) (void *data, size_t bytes) (KdnPyBuffer kvbuf) {
  if (!kdn_py_kv_arg($input, &kvbuf, kdn_py_reads_only("$symname"), &$1, &$2)) SWIG_fail;
}

%typemap(in) (const int32_t *tokens, size_t num_tokens) (KdnPyBuffer tokbuf) {
  if (!kdn_py_tokens($input, &tokbuf, (const int32_t **)&$1, &$2)) SWIG_fail;
}

%typemap(in) (const char *hashes, size_t bytes) (KdnPyBuffer hashbuf) {
  if (!kdn_py_bytes_arg($input, &hashbuf, "the block hashes", (const char **)&$1, &$2)) SWIG_fail;
}

// 1.13: Request::set_salt.
%typemap(in) (const char *salt, size_t bytes) (KdnPyBuffer saltbuf) {
  if (!kdn_py_bytes_arg($input, &saltbuf, "the salt", (const char **)&$1, &$2)) SWIG_fail;
}

%typemap(in) const std::string & (std::string temp) {
  if (!kdn_py_string($input, &temp, "$1_name")) SWIG_fail;
  $1 = &temp;
}
%typemap(freearg) const std::string & "";
%typemap(typecheck, precedence=SWIG_TYPECHECK_STRING) const std::string & {
  $1 = PyUnicode_Check($input) || PyBytes_Check($input);
}

%typemap(in) PyObject *factory "$1 = $input;";

// ---- Results, as tuples ----------------------------------------------------------

%typemap(out) kdn::binding::KvResult {
  $result = kdn_py_kv_result($1);
  if ($result == NULL) SWIG_fail;
}
%typemap(out) kdn::binding::LookupResult {
  $result = kdn_py_lookup_result($1);
  if ($result == NULL) SWIG_fail;
}
%typemap(out) kdn::binding::DocumentInfo {
  $result = kdn_py_document_info($1);
  if ($result == NULL) SWIG_fail;
}
// (result, tokens as the bytes of int32s).
%typemap(out) kdn::binding::FetchResult {
  PyObject *kv = kdn_py_kv_result($1.result);
  $result = kv == NULL ? NULL
                       : Py_BuildValue("(Ny#)", kv, (const char *)$1.tokens_.data(),
                                       (Py_ssize_t)($1.tokens_.size() * sizeof(int32_t)));
  if ($result == NULL) SWIG_fail;
}
%typemap(out) kdn::binding::Stats {
  const kdn::binding::Stats &s = $1;
  $result = Py_BuildValue("(KKKKKKKKKKKKKKKKKKKKKKKKKKKK)", (unsigned long long)s.lookups, (unsigned long long)s.retrieves,
                          (unsigned long long)s.stores, (unsigned long long)s.hits, (unsigned long long)s.misses,
                          (unsigned long long)s.tokens_served, (unsigned long long)s.tokens_stored,
                          (unsigned long long)s.bytes_served, (unsigned long long)s.bytes_stored,
                          (unsigned long long)s.chunks, (unsigned long long)s.used_bytes,
                          (unsigned long long)s.capacity_bytes, (unsigned long long)s.evictions,
                          (unsigned long long)s.edited_served, (unsigned long long)s.leases_active,
                          (unsigned long long)s.pins_active, (unsigned long long)s.pins_forced_unpin,
                          (unsigned long long)s.corrupt_detected, (unsigned long long)s.edits,
                          (unsigned long long)s.tokens_requested, (unsigned long long)s.prefill_tokens,
                          (unsigned long long)s.prefill_ns, (unsigned long long)s.ttft_saved_ns,
                          (unsigned long long)s.tokens_served_unpriced, (unsigned long long)s.delivery_ns,
                          (unsigned long long)s.lookup_tokens, (unsigned long long)s.lookup_hit_tokens,
                          (unsigned long long)s.recompute_tokens);
  if ($result == NULL) SWIG_fail;
}
%typemap(out) kdn::binding::Latency {
  const kdn::binding::Latency &l = $1;
  $result = Py_BuildValue("(Kddddd)", (unsigned long long)l.count, l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.max_us);
  if ($result == NULL) SWIG_fail;
}
%typemap(out) kdn::binding::TierStats {
  const kdn::binding::TierStats &t = $1;
  const unsigned long long n[] = {t.hits, t.misses, t.puts, t.put_refusals, t.evictions, t.demotions_in,
                                  t.promotions_in, t.bytes_in, t.bytes_out, t.objects, t.used_bytes,
                                  t.capacity_bytes, t.corrupt_detected, t.encoded_chunks,
                                  t.bytes_before_encoding, t.bytes_after_encoding, t.encode_failures,
                                  t.decode_failures, t.io_errors, t.remote_calls, t.remote_failed_calls,
                                  t.remote_timeouts, t.write_queue_full, t.write_queued_bytes};
  const size_t count = sizeof n / sizeof n[0];
  // kind, name, codec, the counters, then the watermarks (1.4), the delivery
  // rates, recompute_chunks (1.7) and auth_failures (1.8).
  $result = PyTuple_New((Py_ssize_t)(3 + count + 6));
  if ($result == NULL) SWIG_fail;
  PyTuple_SET_ITEM($result, 0, PyLong_FromLong(t.kind));
  PyTuple_SET_ITEM($result, 1, PyUnicode_DecodeUTF8(t.name.data(), (Py_ssize_t)t.name.size(), "replace"));
  PyTuple_SET_ITEM($result, 2, PyUnicode_DecodeUTF8(t.codec.data(), (Py_ssize_t)t.codec.size(), "replace"));
  for (size_t i = 0; i < count; ++i) PyTuple_SET_ITEM($result, (Py_ssize_t)(3 + i), PyLong_FromUnsignedLongLong(n[i]));
  PyTuple_SET_ITEM($result, (Py_ssize_t)(3 + count), PyFloat_FromDouble(t.high_watermark));
  PyTuple_SET_ITEM($result, (Py_ssize_t)(4 + count), PyFloat_FromDouble(t.low_watermark));
  PyTuple_SET_ITEM($result, (Py_ssize_t)(5 + count), PyFloat_FromDouble(t.delivery_ns_per_token));
  PyTuple_SET_ITEM($result, (Py_ssize_t)(6 + count), PyFloat_FromDouble(t.device_delivery_ns_per_token));
  PyTuple_SET_ITEM($result, (Py_ssize_t)(7 + count), PyLong_FromUnsignedLongLong(t.recompute_chunks));
  PyTuple_SET_ITEM($result, (Py_ssize_t)(8 + count), PyLong_FromUnsignedLongLong(t.auth_failures));
}
// A tier's quotas (1.13) as a list of (ns_hash as hex, quota_bytes,
// used_bytes, objects, quota_evictions, room_evictions, refused).
%typemap(out) std::vector<kdn::binding::QuotaStats> {
  const std::vector<kdn::binding::QuotaStats> &quotas = $1;
  $result = PyList_New((Py_ssize_t)quotas.size());
  if ($result == NULL) SWIG_fail;
  for (size_t i = 0; i < quotas.size(); ++i) {
    const kdn::binding::QuotaStats &q = quotas[i];
    PyObject *hash = PyUnicode_FromStringAndSize(q.ns_hash.data(), (Py_ssize_t)q.ns_hash.size());
    PyObject *item = hash == NULL ? NULL : Py_BuildValue("(NKKKKKK)", hash,
                                   (unsigned long long)q.quota_bytes, (unsigned long long)q.used_bytes,
                                   (unsigned long long)q.objects, (unsigned long long)q.quota_evictions,
                                   (unsigned long long)q.room_evictions, (unsigned long long)q.refused);
    if (item == NULL) {
      Py_DECREF($result);
      $result = NULL;
      SWIG_fail;
    }
    PyList_SET_ITEM($result, (Py_ssize_t)i, item);
  }
}
// (positions, cached, fresh, selected, recompute_fraction, then 1.9's
// anchored, kv_passes, ratio, num_check_layers, gated, gate_kl_ratio).
%typemap(out) kdn::binding::BlendReport {
  const kdn::binding::BlendReport &r = $1;
  $result = Py_BuildValue("(IIIIdIIfIOf)", (unsigned int)r.positions, (unsigned int)r.cached_positions,
                          (unsigned int)r.fresh_positions, (unsigned int)r.selected, r.recompute_fraction,
                          (unsigned int)r.anchored, (unsigned int)r.kv_passes, r.ratio,
                          (unsigned int)r.num_check_layers, r.gated ? Py_True : Py_False, r.gate_kl_ratio);
  if ($result == NULL) SWIG_fail;
}
// Token ranges as a list of (begin, end).
%typemap(out) kdn::binding::TokenRanges {
  const kdn::binding::TokenRanges &ranges = $1;
  $result = PyList_New((Py_ssize_t)ranges.size());
  if ($result == NULL) SWIG_fail;
  for (size_t i = 0; i < ranges.size(); ++i) {
    PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)ranges.begin(i), (unsigned long long)ranges.end(i));
    if (pair == NULL) {
      Py_DECREF($result);
      $result = NULL;
      SWIG_fail;
    }
    PyList_SET_ITEM($result, (Py_ssize_t)i, pair);
  }
}

// ---- Handles -------------------------------------------------------------------------

%newobject kdn::binding::Runtime::create_model;
%newobject kdn::binding::Model::load_async;
%newobject kdn::binding::Model::save_async;
%newobject kdn::binding::Model::load_async_memory;
%newobject kdn::binding::Model::save_async_memory;
%newobject kdn::binding::Model::load_async_states;
%newobject kdn::binding::Model::save_async_states;
%newobject kdn::binding::Model::load_async_memory_states;
%newobject kdn::binding::Model::save_async_memory_states;

// Results travel as tuples (above) and errors as the package's exceptions:
// their C++ classes need no Python proxies. Neither do the layer's helpers.
%ignore kdn::binding::Error;
%ignore kdn::binding::KvResult;
%ignore kdn::binding::LookupResult;
%ignore kdn::binding::DocumentInfo;
%ignore kdn::binding::FetchResult;
%ignore kdn::binding::Stats;
%ignore kdn::binding::Latency;
%ignore kdn::binding::TierStats;
%ignore kdn::binding::QuotaStats;
%ignore kdn::binding::BlendReport;
%ignore kdn::binding::TokenRanges;
// Blending runs through kdn_py_blend below (the callback is a Python callable).
%ignore kdn::binding::BlendLayer;
%ignore kdn::binding::Model::blend;
%ignore kdn::binding::Model::blend_memory;
%ignore kdn::binding::Model::blend_tokens;
%ignore kdn::binding::Model::blend_tokens_memory;
%ignore kdn::binding::ChunkInfo;
%ignore kdn::binding::detail::Check;
%ignore kdn::binding::detail::Closed;
%ignore kdn::binding::detail::Invalid;
%ignore kdn::binding::detail::DtypeBytes;
%ignore kdn::binding::detail::Since;

// ---- The editor: a director -------------------------------------------------------------

%feature("director") kdn::binding::Editor;

// The chunk as a tuple (num_layers, num_kv_heads, head_dim, num_tokens, dtype,
// first_position), and its KV as a writable memoryview valid for the call.
%typemap(directorin) const kdn::binding::ChunkInfo & {
  $input = Py_BuildValue("(IIIIiL)", (unsigned int)$1.num_layers, (unsigned int)$1.num_kv_heads,
                         (unsigned int)$1.head_dim, (unsigned int)$1.num_tokens, $1.dtype,
                         (long long)$1.first_position);
}
%typemap(directorin) (void *kv, size_t kv_bytes) {
  $input = PyMemoryView_FromMemory((char *)$1, (Py_ssize_t)$2, PyBUF_WRITE);
}

// The editor raised: report it the way Python reports an exception nobody
// can catch (sys.unraisablehook), clear it, and fail this edit; the
// trampoline turns the C++ exception into a status and the runtime goes on.
%feature("director:except") {
  if ($error != NULL) {
    PyErr_WriteUnraisable(swig_get_self());
    throw kdn::binding::Error(KDN_ERR_INTERNAL, "the Python editor raised");
  }
}

// A recurrent state kdn only reads (a store's, a save's): read-only buffers
// (bytes) too. The package keeps its own export of each state for the call
// (an op: until it is closed); this call's export ends when it returns.
%extend kdn::binding::StateLayers {
  void add_readonly(void *data, size_t bytes) { $self->add(data, bytes); }
}

%include "kdn_binding.hpp"

// ---- Blending: the layer callback is a Python callable ---------------------------------

%{
// Layer callbacks running on this thread (inside kdn_py_blend).
static thread_local int kdn_py_callback_depth = 0;

// A memoryview of `base` (bytes or bytearray) as `fmt` elements, shaped
// (rows,) when cols < 0, else (rows, cols).
static PyObject *kdn_py_shaped(PyObject *base, const char *fmt, Py_ssize_t rows, Py_ssize_t cols) {
  PyObject *raw = PyMemoryView_FromObject(base);
  if (raw == NULL) return NULL;
  PyObject *shaped = cols < 0 ? PyObject_CallMethod(raw, "cast", "s(n)", fmt, rows)
                              : PyObject_CallMethod(raw, "cast", "s(nn)", fmt, rows, cols);
  Py_DECREF(raw);  // the cast view keeps the buffer
  return shaped;
}

// Ends a view handed to the callback: later use of it raises ValueError. A
// view the callback exported further (numpy.asarray of it, kept) stays
// valid: it is of a copy, never of kdn's memory.
static void kdn_py_release_view(PyObject *view) {
  if (view == NULL || view == Py_None) return;
  PyObject *r = PyObject_CallMethod(view, "release", NULL);
  if (r == NULL) PyErr_Clear();  // BufferError: still exported (by the callback)
  Py_XDECREF(r);
}

// Copies a bytearray handed to the callback back into kdn's buffer.
static bool kdn_py_copy_back(PyObject *from, void *to, size_t bytes) {
  if (PyByteArray_GET_SIZE(from) != (Py_ssize_t)bytes) {
    PyErr_SetString(PyExc_BufferError, "the layer callback resized a buffer kdn gave it");
    return false;
  }
  if (bytes) std::memcpy(to, PyByteArray_AS_STRING(from), bytes);
  return true;
}

// kdn's blend callbacks over Python callables
// fn(layer, positions, tokens, hidden, k, v): the layer's recompute, and
// (1.9, optional) the KV pass, with the same arguments. They run on the
// thread that called the blend, which released the GIL for kdn: a callback
// takes it again. The callable gets views of copies of kdn's buffers (as an
// editor does: a view Python cannot revoke must never be of kdn's memory),
// copied back when it returns; an exception it raises (any BaseException)
// is kept here for the caller to raise, and fails the blend.
class KdnPyBlendLayer : public kdn::binding::BlendLayer {
 public:
  // kv_fn: NULL (or None) when the engine has no KV pass.
  KdnPyBlendLayer(PyObject *fn, PyObject *kv_fn) : fn_(fn), kv_fn_(kv_fn == Py_None ? NULL : kv_fn) {}
  KdnPyBlendLayer(const KdnPyBlendLayer &) = delete;
  KdnPyBlendLayer &operator=(const KdnPyBlendLayer &) = delete;

  void layer(uint32_t layer, const int32_t *positions, const int32_t *tokens, size_t count, float *hidden,
             size_t hidden_len, uint32_t hidden_dim, float *k, float *v, size_t kv_len, size_t total) override {
    Run(fn_, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total);
  }
  bool has_kv_pass() const override { return kv_fn_ != NULL; }
  void kv_pass(uint32_t layer, const int32_t *positions, const int32_t *tokens, size_t count, float *hidden,
               size_t hidden_len, uint32_t hidden_dim, float *k, float *v, size_t kv_len, size_t total) override {
    Run(kv_fn_, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total);
  }

  // The callback's exception, owned (the caller restores it, with the GIL).
  PyObject *error_type = NULL, *error_value = NULL, *error_tb = NULL;

 private:
  void Run(PyObject *fn, uint32_t layer, const int32_t *positions, const int32_t *tokens, size_t count,
           float *hidden, size_t hidden_len, uint32_t hidden_dim, float *k, float *v, size_t kv_len, size_t total) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    ++kdn_py_callback_depth;
    const bool ok = error_type == NULL &&
                    Call(fn, layer, positions, tokens, count, hidden, hidden_len, hidden_dim, k, v, kv_len, total);
    if (!ok && error_type == NULL) PyErr_Fetch(&error_type, &error_value, &error_tb);
    --kdn_py_callback_depth;
    PyGILState_Release(gil);
    if (!ok) throw kdn::binding::Error(KDN_ERR_INTERNAL, "the Python blend callback raised");
  }

  bool Call(PyObject *fn, uint32_t layer, const int32_t *positions, const int32_t *tokens, size_t count,
            float *hidden, size_t hidden_len, uint32_t hidden_dim, float *k, float *v, size_t kv_len, size_t total) {
    const Py_ssize_t n = (Py_ssize_t)count;
    const Py_ssize_t kv_dim = total ? (Py_ssize_t)(kv_len / total) : 0;
    PyObject *bufs[5] = {
        PyBytes_FromStringAndSize((const char *)positions, n * 4),
        tokens ? PyBytes_FromStringAndSize((const char *)tokens, n * 4) : NULL,
        PyByteArray_FromStringAndSize((const char *)hidden, (Py_ssize_t)(hidden_len * sizeof(float))),
        PyByteArray_FromStringAndSize((const char *)k, (Py_ssize_t)(kv_len * sizeof(float))),
        // A latent (MLA) model's: k holds each position's latent, v is NULL (None).
        v ? PyByteArray_FromStringAndSize((const char *)v, (Py_ssize_t)(kv_len * sizeof(float))) : NULL};
    PyObject *views[5] = {NULL, NULL, NULL, NULL, NULL};
    bool ok = bufs[0] && (bufs[1] || !tokens) && bufs[2] && bufs[3] && (bufs[4] || !v);
    if (ok) {
      views[0] = kdn_py_shaped(bufs[0], "i", n, -1);
      views[1] = tokens ? kdn_py_shaped(bufs[1], "i", n, -1) : (Py_INCREF(Py_None), Py_None);
      views[2] = kdn_py_shaped(bufs[2], "f", n, (Py_ssize_t)hidden_dim);
      views[3] = kdn_py_shaped(bufs[3], "f", (Py_ssize_t)total, kv_dim);
      views[4] = v ? kdn_py_shaped(bufs[4], "f", (Py_ssize_t)total, kv_dim) : (Py_INCREF(Py_None), Py_None);
      ok = views[0] && views[1] && views[2] && views[3] && views[4];
    }
    PyObject *result = NULL;
    if (ok) {
      result = PyObject_CallFunction(fn, "IOOOOO", (unsigned int)layer, views[0], views[1], views[2], views[3],
                                     views[4]);
      ok = result != NULL;
    }
    // The callback's error (if any) stays set across the releases.
    PyObject *et = NULL, *ev = NULL, *etb = NULL;
    PyErr_Fetch(&et, &ev, &etb);
    for (PyObject *view : views) kdn_py_release_view(view);
    PyErr_Restore(et, ev, etb);
    if (ok) {
      ok = kdn_py_copy_back(bufs[2], hidden, hidden_len * sizeof(float)) &&
           kdn_py_copy_back(bufs[3], k, kv_len * sizeof(float)) &&
           (!v || kdn_py_copy_back(bufs[4], v, kv_len * sizeof(float)));
    }
    Py_XDECREF(result);
    for (PyObject *view : views) Py_XDECREF(view);
    for (PyObject *buf : bufs) Py_XDECREF(buf);
    return ok;
  }

  PyObject *fn_;     // borrowed: the caller's arguments, alive for the call
  PyObject *kv_fn_;
};

// A blend with the GIL released while kdn works (the callbacks take it
// again); a callback's exception, if one raised, is raised in the caller.
// Of the segments (kdn_kv_blend) or, without them, of the context's tokens
// (kdn_kv_blend_tokens).
static kdn::binding::BlendReport kdn_py_run_blend(kdn::binding::Model &model, const std::string &ns,
                                                  const kdn::binding::BlendSegments *segments,
                                                  const kdn::binding::Request *context,
                                                  const kdn::binding::BlendOptions &options,
                                                  const kdn::binding::KvView &view,
                                                  const kdn::binding::Memory &memory, PyObject *layer_fn,
                                                  PyObject *kv_fn) {
  if (!PyCallable_Check(layer_fn)) {
    kdn_py_invalid("layer_fn must be callable");
    throw KdnPyRaised();
  }
  if (kv_fn != Py_None && !PyCallable_Check(kv_fn)) {
    kdn_py_invalid("kv_fn must be callable (or None)");
    throw KdnPyRaised();
  }
  KdnPyBlendLayer layer(layer_fn, kv_fn);
  kdn::binding::BlendReport report;
  std::exception_ptr failure;
  PyThreadState *saved = PyEval_SaveThread();
  try {
    report = segments != NULL ? model.blend_memory(ns, *segments, options, view, memory, &layer)
                              : model.blend_tokens_memory(ns, *context, options, view, memory, &layer);
  } catch (...) {
    failure = std::current_exception();
  }
  PyEval_RestoreThread(saved);
  if (layer.error_type != NULL) {
    PyErr_Restore(layer.error_type, layer.error_value, layer.error_tb);
    throw KdnPyRaised();
  }
  if (failure) std::rethrow_exception(failure);
  return report;
}

static kdn::binding::Memory kdn_py_host(void *data, size_t bytes) {
  kdn::binding::Memory memory;
  memory.address = reinterpret_cast<uintptr_t>(data);
  memory.bytes = bytes;
  return memory;
}
%}

%typemap(in) PyObject *layer_fn "$1 = $input;";
%typemap(in) PyObject *kv_fn "$1 = $input;";
%nothread kdn_py_blend;
%nothread kdn_py_blend_memory;
%nothread kdn_py_blend_tokens;
%nothread kdn_py_blend_tokens_memory;
%nothread kdn_py_in_callback;
%inline %{
// Model::blend with Python callables as the layer callback and the KV pass
// (kv_fn: None for none), into a buffer (the (data, bytes) typemap) or
// memory by address.
kdn::binding::BlendReport kdn_py_blend(kdn::binding::Model &model, const std::string &ns,
                                       const kdn::binding::BlendSegments &segments,
                                       const kdn::binding::BlendOptions &options, const kdn::binding::KvView &view,
                                       void *data, size_t bytes, PyObject *layer_fn, PyObject *kv_fn) {
  return kdn_py_run_blend(model, ns, &segments, NULL, options, view, kdn_py_host(data, bytes), layer_fn, kv_fn);
}
kdn::binding::BlendReport kdn_py_blend_memory(kdn::binding::Model &model, const std::string &ns,
                                              const kdn::binding::BlendSegments &segments,
                                              const kdn::binding::BlendOptions &options,
                                              const kdn::binding::KvView &view, const kdn::binding::Memory &memory,
                                              PyObject *layer_fn, PyObject *kv_fn) {
  return kdn_py_run_blend(model, ns, &segments, NULL, options, view, memory, layer_fn, kv_fn);
}
// Model::blend_tokens (1.9): the context given as its tokens.
kdn::binding::BlendReport kdn_py_blend_tokens(kdn::binding::Model &model, const std::string &ns,
                                              const kdn::binding::Request &context,
                                              const kdn::binding::BlendOptions &options,
                                              const kdn::binding::KvView &view, void *data, size_t bytes,
                                              PyObject *layer_fn, PyObject *kv_fn) {
  return kdn_py_run_blend(model, ns, NULL, &context, options, view, kdn_py_host(data, bytes), layer_fn, kv_fn);
}
kdn::binding::BlendReport kdn_py_blend_tokens_memory(kdn::binding::Model &model, const std::string &ns,
                                                     const kdn::binding::Request &context,
                                                     const kdn::binding::BlendOptions &options,
                                                     const kdn::binding::KvView &view,
                                                     const kdn::binding::Memory &memory, PyObject *layer_fn,
                                                     PyObject *kv_fn) {
  return kdn_py_run_blend(model, ns, NULL, &context, options, view, memory, layer_fn, kv_fn);
}
// True inside an editor or a blend's layer callback on this thread: a close
// there is handed to another thread (it would wait for the call running it).
bool kdn_py_in_callback() { return kdn::binding::in_editor() || kdn_py_callback_depth > 0; }
%}

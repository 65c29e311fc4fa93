// SPDX-License-Identifier: Apache-2.0
// The Java module over bindings/swig/kdn_binding.hpp: the generated classes
// go to dev.kdn.swig (hidden behind the hand-written API in dev.kdn).
//
// What this file adds to SWIG's defaults:
// - KV memory is a direct ByteBuffer, passed to kdn without a copy: its
//   address and capacity become (void *data, size_t bytes). A heap buffer or
//   null is an IllegalArgumentException (dev.kdn checks read-only buffers).
// - Tokens are int[], hashes and salts byte[], copied for the call.
// - Strings travel as UTF-8 bytes (JNI's "modified UTF-8" differs for NUL
//   and characters outside the BMP, and namespaces and doc ids must be the
//   same bytes in every language).
// - uint64_t is long (unsigned; dev.kdn documents it), not BigInteger.
// - kdn::binding::Error becomes dev.kdn.KdnException's subclass for the
//   status (built by KdnException.fromNative), or IllegalStateException for
//   a closed handle.
// - Editor is a director: kdn's mover thread calls Java. The thread is
//   attached once as a daemon and detached when it ends.
// - No finalizers: dev.kdn frees every native object (close, or a Cleaner).
// - Recurrent states (1.12, kdn::binding::StateLayers) are direct
//   ByteBuffers too, one add() each, whole (address .. capacity).
// - Device memory (kdn::binding::Memory) is an address and a size as longs,
//   which the caller vouches for; direct_buffer_address gives a direct
//   buffer's, for the emulated device (host memory standing in for the GPU's).
// - Blending (experimental in kdn.h) is not wrapped: Java has no API for it
//   (its callbacks would run Java on the blending thread). Model::match
//   (kdn_kv_match, 1.9) is: a NativeTokenRanges that dev.kdn reads out.
// - A tier's quota stats (1.13, Runtime::quota_stats) are a std::vector
//   proxy, NativeQuotaStatsList, that dev.kdn reads out and deletes.
%module(directors="1") kdn

%begin %{
// Attach kdn's mover thread to the JVM once, as a daemon (it must not keep
// the JVM alive), named as the thread is, and detach it when it ends.
#define SWIG_JAVA_ATTACH_CURRENT_THREAD_AS_DAEMON
#define SWIG_JAVA_DETACH_ON_THREAD_END
#define SWIG_JAVA_USE_THREAD_NAME
%}

%{
#include "kdn_binding.hpp"

#include <atomic>
#include <new>
#include <stdexcept>

// A kdn::binding::Error as the Java exception for its status.
static void KdnJavaThrow(JNIEnv* jenv, const kdn::binding::Error& e) {
  if (jenv->ExceptionCheck()) return;
  if (e.closed()) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalStateException, e.message().c_str());
    return;
  }
  jclass cls = jenv->FindClass("dev/kdn/KdnException");
  if (cls == nullptr) return;  // NoClassDefFoundError is pending
  jmethodID of = jenv->GetStaticMethodID(cls, "fromNative", "(I[BJ)Ldev/kdn/KdnException;");
  if (of == nullptr) return;
  const std::string& m = e.message();
  jbyteArray bytes = jenv->NewByteArray(static_cast<jsize>(m.size()));
  if (bytes == nullptr) return;
  jenv->SetByteArrayRegion(bytes, 0, static_cast<jsize>(m.size()), reinterpret_cast<const jbyte*>(m.data()));
  jobject ex = jenv->CallStaticObjectMethod(cls, of, static_cast<jint>(e.status()), bytes,
                                            static_cast<jlong>(e.needed()));
  if (ex != nullptr && !jenv->ExceptionCheck()) jenv->Throw(static_cast<jthrowable>(ex));
}
%}

%exception {
  try {
    $action
  } catch (const kdn::binding::Error& e) {
    KdnJavaThrow(jenv, e);
    return $null;
  } catch (const std::bad_alloc&) {
    SWIG_JavaThrowException(jenv, SWIG_JavaOutOfMemoryError, "kdn: out of memory");
    return $null;
  } catch (const std::exception& e) {
    SWIG_JavaThrowException(jenv, SWIG_JavaRuntimeException, e.what());
    return $null;
  }
}

// The JNI class loads the library through LibraryLoader (src/main/java/dev/kdn/swig):
// -Dkdn.library.path=DIR, else the copies kdn.jar carries, else
// System.loadLibrary("kdn_java").
%pragma(java) jniclasscode=%{
  static {
    LibraryLoader.load();
  }
%}

// dev.kdn closes and deletes every native object itself.
%typemap(javafinalize) SWIGTYPE ""

%include <stdint.i>

// Unsigned 64-bit values as long (dev.kdn documents them as unsigned).
%apply long long { uint64_t };
%apply const long long & { const uint64_t & };

// ---- Strings: Java String <-> UTF-8 bytes ----------------------------------
namespace std {
%naturalvar string;
class string;
%typemap(jni) string, const string & "jbyteArray"
%typemap(jtype) string, const string & "byte[]"
%typemap(jstype) string, const string & "String"
%typemap(javain) string, const string & "$javainput.getBytes(java.nio.charset.StandardCharsets.UTF_8)"
%typemap(javaout) string, const string & {
    return new String($jnicall, java.nio.charset.StandardCharsets.UTF_8);
  }
%typemap(in) string %{
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "null string");
    return $null;
  }
  $1.resize(static_cast<size_t>(jenv->GetArrayLength($input)));
  if (!$1.empty()) {
    jenv->GetByteArrayRegion($input, 0, static_cast<jsize>($1.size()), reinterpret_cast<jbyte*>(&$1[0]));
  }
%}
%typemap(in) const string & ($*1_ltype temp) %{
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "null string");
    return $null;
  }
  temp.resize(static_cast<size_t>(jenv->GetArrayLength($input)));
  if (!temp.empty()) {
    jenv->GetByteArrayRegion($input, 0, static_cast<jsize>(temp.size()), reinterpret_cast<jbyte*>(&temp[0]));
  }
  $1 = &temp;
%}
%typemap(out) string %{
  $result = jenv->NewByteArray(static_cast<jsize>($1.size()));
  if ($result) {
    jenv->SetByteArrayRegion($result, 0, static_cast<jsize>($1.size()), reinterpret_cast<const jbyte*>($1.data()));
  }
%}
%typemap(out) const string & %{
  $result = jenv->NewByteArray(static_cast<jsize>($1->size()));
  if ($result) {
    jenv->SetByteArrayRegion($result, 0, static_cast<jsize>($1->size()), reinterpret_cast<const jbyte*>($1->data()));
  }
%}
}

// ---- KV memory: a direct ByteBuffer, whole (address .. capacity) ------------
%typemap(jni) (void* data, size_t bytes) "jobject"
%typemap(jtype) (void* data, size_t bytes) "java.nio.ByteBuffer"
%typemap(jstype) (void* data, size_t bytes) "java.nio.ByteBuffer"
%typemap(javain) (void* data, size_t bytes) "$javainput"
%typemap(in) (void* data, size_t bytes) %{
  $1 = $input ? jenv->GetDirectBufferAddress($input) : nullptr;
  if (!$1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "kdn needs a direct ByteBuffer");
    return $null;
  }
  $2 = static_cast<size_t>(jenv->GetDirectBufferCapacity($input));
%}

// ---- Tokens: int[]; block hashes: byte[] --------------------------------------
// Copied into a local vector (the Request copies them again; both are small). Not
// Get/ReleasePrimitiveArrayCritical: when the call throws, SWIG's wrapper returns
// from its catch block without running freearg, and it makes JNI calls (the
// exception) that are not allowed inside a critical region.
%typemap(jni) (const int32_t* tokens, size_t num_tokens) "jintArray"
%typemap(jtype) (const int32_t* tokens, size_t num_tokens) "int[]"
%typemap(jstype) (const int32_t* tokens, size_t num_tokens) "int[]"
%typemap(javain) (const int32_t* tokens, size_t num_tokens) "$javainput"
%typemap(in) (const int32_t* tokens, size_t num_tokens) (std::vector<int32_t> copy) %{
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "null tokens");
    return $null;
  }
  copy.resize(static_cast<size_t>(jenv->GetArrayLength($input)));
  if (!copy.empty()) jenv->GetIntArrayRegion($input, 0, static_cast<jsize>(copy.size()), copy.data());
  $1 = copy.data();
  $2 = copy.size();
%}
%typemap(jni) (const char* hashes, size_t bytes) "jbyteArray"
%typemap(jtype) (const char* hashes, size_t bytes) "byte[]"
%typemap(jstype) (const char* hashes, size_t bytes) "byte[]"
%typemap(javain) (const char* hashes, size_t bytes) "$javainput"
%typemap(in) (const char* hashes, size_t bytes) (std::vector<char> copy) %{
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "null hashes");
    return $null;
  }
  copy.resize(static_cast<size_t>(jenv->GetArrayLength($input)));
  if (!copy.empty()) {
    jenv->GetByteArrayRegion($input, 0, static_cast<jsize>(copy.size()), reinterpret_cast<jbyte*>(copy.data()));
  }
  $1 = copy.data();
  $2 = copy.size();
%}

// A request's salt (1.13, Request::set_salt): byte[], copied as the hashes are
// (dev.kdn.Request keeps its own copy and checks the length first).
%typemap(jni) (const char* salt, size_t bytes) "jbyteArray"
%typemap(jtype) (const char* salt, size_t bytes) "byte[]"
%typemap(jstype) (const char* salt, size_t bytes) "byte[]"
%typemap(javain) (const char* salt, size_t bytes) "$javainput"
%typemap(in) (const char* salt, size_t bytes) (std::vector<char> copy) %{
  if (!$input) {
    SWIG_JavaThrowException(jenv, SWIG_JavaNullPointerException, "null salt");
    return $null;
  }
  copy.resize(static_cast<size_t>(jenv->GetArrayLength($input)));
  if (!copy.empty()) {
    jenv->GetByteArrayRegion($input, 0, static_cast<jsize>(copy.size()), reinterpret_cast<jbyte*>(copy.data()));
  }
  $1 = copy.data();
  $2 = copy.size();
%}

// ---- The editor: kdn's memory as a direct ByteBuffer, for the call only -----
%feature("director") kdn::binding::Editor;
// A Java exception from edit(): dev.kdn keeps it (KdnRuntime.editorFailure()); here
// it is cleared and becomes a C++ exception, which kdn_binding.hpp's trampoline
// turns into KDN_ERR_INTERNAL (the chunk stays as it was). The local reference
// is deleted: kdn's thread stays attached and never returns to Java to free it.
%feature("director:except") kdn::binding::Editor::edit %{
  jthrowable $error = jenv->ExceptionOccurred();
  if ($error) {
    jenv->ExceptionClear();
    jenv->DeleteLocalRef($error);
    if (swigjobj) jenv->DeleteLocalRef(swigjobj);  // SWIG's name for the editor's Java object
    throw std::runtime_error("the Java editor threw (see KdnRuntime.editorFailure())");
  }
%}
// SWIG's director leaves a Java exception pending and returns false when it
// has no Java method to call: its Java object is gone (the weak reference SWIG
// keeps was collected) or never overrode edit(). kdn's mover thread would go
// on with it pending, and the edit would count as a success. GuardedEditor is
// what kdn calls instead: it forwards to the director, then clears such an
// exception and fails the edit (KDN_ERR_INTERNAL through the trampoline), so
// the thread is left clean; lost_calls() counts them (KdnRuntime.editorFailure()).
%{
namespace kdn_java {
class GuardedEditor : public kdn::binding::Editor {
 public:
  GuardedEditor(JNIEnv* jenv, kdn::binding::Editor* director) : director_(director) {
    if (director == nullptr) throw kdn::binding::Error(KDN_ERR_INVALID_ARGUMENT, "the editor is null");
    if (jenv->GetJavaVM(&vm_) != JNI_OK) throw std::runtime_error("kdn: no JavaVM for the editor");
  }
  bool edit(const kdn::binding::ChunkInfo& info, void* kv, size_t kv_bytes) override {
    const bool changed = director_->edit(info, kv, kv_bytes);
    JNIEnv* env = nullptr;
    if (vm_->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_6) == JNI_OK && env->ExceptionCheck()) {
      env->ExceptionClear();
      lost_calls_.fetch_add(1, std::memory_order_relaxed);
      throw std::runtime_error("kdn called the Java editor but found no Java object to call");
    }
    return changed;
  }
  uint64_t lost_calls() const { return lost_calls_.load(std::memory_order_relaxed); }

 private:
  kdn::binding::Editor* director_;
  JavaVM* vm_ = nullptr;
  std::atomic<uint64_t> lost_calls_{0};
};
}  // namespace kdn_java
%}
%typemap(in, numinputs=0) JNIEnv* jenv "$1 = jenv;"

%typemap(jni) (void* kv, size_t kv_bytes) "jobject"
%typemap(jtype) (void* kv, size_t kv_bytes) "java.nio.ByteBuffer"
%typemap(jstype) (void* kv, size_t kv_bytes) "java.nio.ByteBuffer"
%typemap(javain) (void* kv, size_t kv_bytes) "$javainput"
%typemap(javadirectorin) (void* kv, size_t kv_bytes) "$jniinput"
%typemap(directorin, descriptor="Ljava/nio/ByteBuffer;") (void* kv, size_t kv_bytes) %{
  $input = jenv->NewDirectByteBuffer($1, static_cast<jlong>($2));
  Swig::LocalRefGuard $1_refguard(jenv, $input);
%}
%typemap(in) (void* kv, size_t kv_bytes) %{
  $1 = $input ? jenv->GetDirectBufferAddress($input) : nullptr;
  if (!$1) {
    SWIG_JavaThrowException(jenv, SWIG_JavaIllegalArgumentException, "kdn needs a direct ByteBuffer");
    return $null;
  }
  $2 = static_cast<size_t>(jenv->GetDirectBufferCapacity($input));
%}

// ---- Results on the hot path: a long[] each, not a proxy to read field by field
// (one JNI call instead of five or six). dev.kdn.Natives unpacks them.
%typemap(jni) kdn::binding::LookupResult "jlongArray"
%typemap(jtype) kdn::binding::LookupResult "long[]"
%typemap(jstype) kdn::binding::LookupResult "long[]"
%typemap(javaout) kdn::binding::LookupResult {
    return $jnicall;
  }
// [status, cached_tokens, num_tiers, tier_tokens...]
%typemap(out) kdn::binding::LookupResult %{
  {
    jlong v[3 + KDN_MAX_TIERS];
    const uint32_t tiers = $1.num_tiers < KDN_MAX_TIERS ? $1.num_tiers : KDN_MAX_TIERS;
    v[0] = $1.status;
    v[1] = static_cast<jlong>($1.cached_tokens);
    v[2] = tiers;
    for (uint32_t i = 0; i < tiers; ++i) v[3 + i] = static_cast<jlong>($1.tier_tokens(i));
    $result = jenv->NewLongArray(static_cast<jsize>(3 + tiers));
    if ($result) jenv->SetLongArrayRegion($result, 0, static_cast<jsize>(3 + tiers), v);
  }
%}
%typemap(jni) kdn::binding::KvResult "jlongArray"
%typemap(jtype) kdn::binding::KvResult "long[]"
%typemap(jstype) kdn::binding::KvResult "long[]"
%typemap(javaout) kdn::binding::KvResult {
    return $jnicall;
  }
// [state, status, tokens, covered, num_failed, flags]
%typemap(out) kdn::binding::KvResult %{
  {
    const jlong v[6] = {$1.state, $1.status, static_cast<jlong>($1.tokens), static_cast<jlong>($1.covered),
                        static_cast<jlong>($1.num_failed), static_cast<jlong>($1.flags)};
    $result = jenv->NewLongArray(6);
    if ($result) jenv->SetLongArrayRegion($result, 0, 6, v);
  }
%}

// Handles the caller owns (dev.kdn closes and deletes them).
%newobject kdn::binding::Runtime::create_model;
%newobject kdn::binding::Model::load_async;
%newobject kdn::binding::Model::save_async;
%newobject kdn::binding::Model::load_async_memory;
%newobject kdn::binding::Model::save_async_memory;
%newobject kdn::binding::Model::load_async_states;
%newobject kdn::binding::Model::save_async_states;

// Java sees the errors as exceptions, never this class.
%ignore kdn::binding::Error;
%ignore kdn::binding::detail;
// Blending: C, Python and Rust only (bindings/java/README.md).
%ignore kdn::binding::BlendSegments;
%ignore kdn::binding::BlendOptions;
%ignore kdn::binding::BlendReport;
%ignore kdn::binding::BlendLayer;
%ignore kdn::binding::Model::blend;
%ignore kdn::binding::Model::blend_memory;
%ignore kdn::binding::Model::blend_tokens;
%ignore kdn::binding::Model::blend_tokens_memory;
// Recurrent states travel with host buffers only (kdn refuses device views
// of a model with recurrent layers): no DeviceMemory variants.
%ignore kdn::binding::Model::store_memory_states;
%ignore kdn::binding::Model::retrieve_memory_states;
%ignore kdn::binding::Model::load_async_memory_states;
%ignore kdn::binding::Model::save_async_memory_states;

// A tier's quotas (1.13, Runtime::quota_stats): a std::vector proxy that
// dev.kdn.KdnRuntime.quotaStats reads out into QuotaStats records and deletes.
// Instantiated here, before the header's quota_stats uses it (the struct
// declared ahead; the header defines it).
%include <std_vector.i>
%rename(NativeQuotaStats) kdn::binding::QuotaStats;
namespace kdn { namespace binding { struct QuotaStats; } }
%template(NativeQuotaStatsList) std::vector<kdn::binding::QuotaStats>;

// Native* in dev.kdn.swig, so dev.kdn's own names stay free.
%rename(NativeTierConfig) kdn::binding::TierConfig;
%rename(NativeRuntimeOptions) kdn::binding::RuntimeOptions;
%rename(NativeModelSpec) kdn::binding::ModelSpec;
%rename(NativeRequest) kdn::binding::Request;
%rename(NativeKvView) kdn::binding::KvView;
%rename(NativeMemory) kdn::binding::Memory;
%rename(NativeKvResult) kdn::binding::KvResult;
%rename(NativeLookupResult) kdn::binding::LookupResult;
%rename(NativeDocumentInfo) kdn::binding::DocumentInfo;
%rename(NativeFetchResult) kdn::binding::FetchResult;
%rename(NativeStats) kdn::binding::Stats;
%rename(NativeLatency) kdn::binding::Latency;
%rename(NativeTierStats) kdn::binding::TierStats;
%rename(NativeChunkInfo) kdn::binding::ChunkInfo;
%rename(NativeEditor) kdn::binding::Editor;
%rename(NativeRuntime) kdn::binding::Runtime;
%rename(NativeLookupBatch) kdn::binding::LookupBatch;
%rename(NativeModel) kdn::binding::Model;
%rename(NativeOp) kdn::binding::Op;
%rename(NativeTokenRanges) kdn::binding::TokenRanges;
%rename(NativeStateLayers) kdn::binding::StateLayers;
// Object.wait(long) is final in Java.
%rename(await_ms) kdn::binding::Op::wait;
%rename(await_layer_ms) kdn::binding::Op::wait_layer;

%include "kdn_binding.hpp"

// A direct buffer's address (the typemap above refuses any other buffer), for
// DeviceMemory.of(ByteBuffer): on the emulated device, host memory stands in
// for the GPU's. dev.kdn keeps the buffer reachable while the address is used.
%inline %{
namespace kdn_java {
inline uint64_t direct_buffer_address(void* data, size_t bytes) {
  (void)bytes;
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data));
}
}  // namespace kdn_java
%}

// The editor kdn calls (above); the Java side never calls edit() itself.
%rename(NativeGuardedEditor) kdn_java::GuardedEditor;
%ignore kdn_java::GuardedEditor::edit;
namespace kdn_java {
class GuardedEditor : public kdn::binding::Editor {
 public:
  GuardedEditor(JNIEnv* jenv, kdn::binding::Editor* director);
  bool edit(const kdn::binding::ChunkInfo& info, void* kv, size_t kv_bytes) override;
  uint64_t lost_calls() const;
};
}  // namespace kdn_java

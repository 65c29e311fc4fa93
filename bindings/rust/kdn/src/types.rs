// SPDX-License-Identifier: Apache-2.0
//! The ABI's enums (open: every one has an `Unknown` case for values this
//! crate does not know), the element types KV memory may hold, and versions.

use kdn_sys as sys;
use std::ffi::CStr;
use std::time::Duration;

macro_rules! open_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $raw:path,)* }) => {
        $(#[$doc])*
        ///
        /// Open: a value this crate does not know is `Unknown(raw)` (as an
        /// input, the library refuses it with [`Status::InvalidArgument`](crate::Status)).
        #[non_exhaustive]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
            /// A value this crate does not name.
            Unknown(u32),
        }
        impl $name {
            /// From the C value.
            pub fn from_raw(raw: u32) -> Self {
                match raw {
                    $(x if x == $raw => $name::$variant,)*
                    x => $name::Unknown(x),
                }
            }
            /// The C value.
            pub fn raw(self) -> u32 {
                match self {
                    $($name::$variant => $raw,)*
                    $name::Unknown(x) => x,
                }
            }
        }
    };
}

open_enum! {
    /// The element type of a model's KV.
    DType {
        /// 32-bit float.
        F32 = sys::kdn_dtype_KDN_DTYPE_F32,
        /// IEEE half (hold it in `u16`).
        F16 = sys::kdn_dtype_KDN_DTYPE_F16,
        /// bfloat16 (hold it in `u16`).
        BF16 = sys::kdn_dtype_KDN_DTYPE_BF16,
    }
}

impl DType {
    /// Bytes per element; `None` for an unknown dtype.
    pub fn size(self) -> Option<usize> {
        match self {
            DType::F32 => Some(4),
            DType::F16 | DType::BF16 => Some(2),
            DType::Unknown(_) => None,
        }
    }
}

open_enum! {
    /// The kind of a store tier.
    TierKind {
        /// Host memory (pinned when a GPU is present).
        Host = sys::kdn_tier_kind_KDN_TIER_HOST,
        /// GPU memory (host memory standing in for it without a GPU).
        Device = sys::kdn_tier_kind_KDN_TIER_DEVICE,
        /// One file per chunk in a directory, checksummed, crash-safe.
        Disk = sys::kdn_tier_kind_KDN_TIER_DISK,
        /// A kdnd node shared with other engines (since 1.1).
        Remote = sys::kdn_tier_kind_KDN_TIER_REMOTE,
        /// Redis, Redis Cluster or Valkey shared with other engines (since 1.3).
        Redis = sys::kdn_tier_kind_KDN_TIER_REDIS,
    }
}

open_enum! {
    /// How a tier chooses what to evict.
    EvictionPolicy {
        /// Least recently used.
        Lru = sys::kdn_eviction_policy_KDN_EVICT_LRU,
        /// Scan-resistant S3-FIFO.
        S3Fifo = sys::kdn_eviction_policy_KDN_EVICT_S3FIFO,
        /// Cost-aware GreedyDual-Size-Frequency (since 1.5).
        Cost = sys::kdn_eviction_policy_KDN_EVICT_COST,
    }
}

open_enum! {
    /// The GPU a runtime delivers KV to (`kdn_device_mode`, since 1.5), for
    /// KV views in device memory ([`KvViewMut::from_device`](crate::KvViewMut::from_device))
    /// and device tiers.
    DeviceMode {
        /// The CUDA device `device_ordinal` when this build has CUDA and the
        /// machine a usable GPU; otherwise none (device views are
        /// `Unsupported`, a device tier is emulated in host memory).
        Auto = sys::kdn_device_mode_KDN_DEVICE_AUTO,
        /// No device: device views are `Unsupported`.
        None = sys::kdn_device_mode_KDN_DEVICE_NONE,
        /// Host memory stands in for the GPU's: device views are host
        /// memory, and every device path runs its kernel's CPU path, byte
        /// for byte. For developing and testing a GPU integration without a GPU.
        Emulated = sys::kdn_device_mode_KDN_DEVICE_EMULATED,
        /// The CUDA device `device_ordinal`; [`Runtime::new`](crate::Runtime::new)
        /// fails with `Unsupported` when there is none.
        Cuda = sys::kdn_device_mode_KDN_DEVICE_CUDA,
    }
}

open_enum! {
    /// Where a KV view's memory is (`kdn_memory_kind`).
    MemoryKind {
        /// Host memory.
        Host = sys::kdn_memory_kind_KDN_MEMORY_HOST,
        /// GPU memory of the runtime's device (since 1.5; with
        /// [`DeviceMode::Emulated`], host memory standing in for it).
        Device = sys::kdn_memory_kind_KDN_MEMORY_DEVICE,
    }
}

open_enum! {
    /// How a blend re-positions RoPE keys beyond the model's own rotation
    /// (`kdn_rope_scaling`; experimental, [`Model::blend`](crate::Model::blend)).
    RopeScaling {
        /// The model spec's RoPE as it is.
        None = sys::kdn_rope_scaling_KDN_ROPE_SCALING_NONE,
        /// Positions divided by the factor.
        Linear = sys::kdn_rope_scaling_KDN_ROPE_SCALING_LINEAR,
        /// NTK-aware: theta x factor^(r / (r - 2)).
        Ntk = sys::kdn_rope_scaling_KDN_ROPE_SCALING_NTK,
    }
}

open_enum! {
    /// Which dimensions a model's rotary embedding pairs.
    RopeStyle {
        /// Pairs (2j, 2j+1): llama2.c, GPT-J, Meta Llama.
        Interleaved = sys::kdn_rope_style_KDN_ROPE_INTERLEAVED,
        /// Pairs (j, j + rotary_dim/2): HF Llama, NeoX.
        Neox = sys::kdn_rope_style_KDN_ROPE_NEOX,
    }
}

open_enum! {
    /// What each layer of a model caches per token (since 1.11; docs/model-kinds.md).
    CacheKind {
        /// K and V heads (MHA, GQA, MQA).
        Kv = sys::kdn_cache_kind_KDN_CACHE_KV,
        /// One latent vector of `latent_dim` (MLA: DeepSeek-V2/V3, Kimi).
        Latent = sys::kdn_cache_kind_KDN_CACHE_LATENT,
    }
}

open_enum! {
    /// How a KV view lays out one layer.
    Layout {
        /// Element (token, head, dim) at strides (llama.cpp, canonical).
        Contiguous = sys::kdn_kv_layout_KDN_LAYOUT_CONTIGUOUS,
        /// Per layer `[num_blocks][block_size][kv_heads][head_dim]` (vLLM).
        PagedNhd = sys::kdn_kv_layout_KDN_LAYOUT_PAGED_NHD,
        /// Per layer `[num_blocks][kv_heads][block_size][head_dim]`.
        PagedHnd = sys::kdn_kv_layout_KDN_LAYOUT_PAGED_HND,
    }
}

open_enum! {
    /// Where an operation is.
    OpState {
        /// Still running.
        Pending = sys::kdn_op_state_KDN_OP_PENDING,
        /// Ended well.
        Done = sys::kdn_op_state_KDN_OP_DONE,
        /// Ended with an error.
        Failed = sys::kdn_op_state_KDN_OP_FAILED,
        /// Ended cancelled.
        Cancelled = sys::kdn_op_state_KDN_OP_CANCELLED,
    }
}

open_enum! {
    /// Which latency distribution [`Runtime::latency`](crate::Runtime::latency) reads.
    LatencyKind {
        /// Per looked-up request.
        Lookup = sys::kdn_latency_kind_KDN_LATENCY_LOOKUP,
        /// Retrieves and load ops.
        Load = sys::kdn_latency_kind_KDN_LATENCY_LOAD,
        /// Stores and save ops.
        Store = sys::kdn_latency_kind_KDN_LATENCY_STORE,
    }
}

/// A plain element type KV memory may be seen as: every bit pattern is a
/// valid value and there is no padding, so kdn may write any bytes into it.
///
/// # Safety
/// Implement it only for such types (it is implemented for the integer
/// types and `f32`/`f64`).
pub unsafe trait Element: Copy + Send + Sync + 'static {}
unsafe impl Element for u8 {}
unsafe impl Element for i8 {}
unsafe impl Element for u16 {}
unsafe impl Element for i16 {}
unsafe impl Element for u32 {}
unsafe impl Element for i32 {}
unsafe impl Element for f32 {}
unsafe impl Element for u64 {}
unsafe impl Element for f64 {}

/// The library's version, `"MAJOR.MINOR.PATCH"`.
pub fn version() -> &'static str {
    // SAFETY: static storage, never NULL.
    unsafe { CStr::from_ptr(sys::kdn_version()) }.to_str().unwrap_or("?")
}

/// The library's version number, `MAJOR * 10000 + MINOR * 100 + PATCH`: a
/// feature added in 1.N is there when it is at least `10000 + 100 * N`.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::kdn_version_number() }
}

/// The version number of the header this crate was generated from.
pub const HEADER_VERSION_NUMBER: u32 =
    sys::KDN_VERSION_MAJOR * 10000 + sys::KDN_VERSION_MINOR * 100 + sys::KDN_VERSION_PATCH;

/// The C ABI this crate is written for, `MAJOR * 10000 + MINOR * 100`: 1.9
/// (1.8's device views and their stream, blending, `secret_file`, quality
/// levels and delivery rates; 1.9's KV pass, first tokens and blending by
/// text). [`Runtime::new`](crate::Runtime::new) refuses, with
/// [`Status::Version`](crate::Status::Version), a libkdn of another major
/// version or an older minor: its structs lack fields this crate sets, and
/// its statistics would read as 0.
pub const ABI_VERSION_NUMBER: u32 = 10900;

// kdn-sys must come from a kdn.h of this major version and at least this minor.
const _: () = assert!(
    sys::KDN_VERSION_MAJOR == ABI_VERSION_NUMBER / 10000 && HEADER_VERSION_NUMBER >= ABI_VERSION_NUMBER,
    "kdn-sys was generated from a kdn.h older than 1.9 (or of another major version)"
);

/// `Ok` when a libkdn of version `number` can serve this crate: the same
/// major version as [`ABI_VERSION_NUMBER`], at least its minor.
pub(crate) fn check_library_version(number: u32) -> crate::Result<()> {
    let (major, minor) = (number / 10000, number / 100 % 100);
    let (want_major, want_minor) = (ABI_VERSION_NUMBER / 10000, ABI_VERSION_NUMBER / 100 % 100);
    if major == want_major && minor >= want_minor {
        return Ok(());
    }
    Err(crate::Error::new(
        crate::Status::Version,
        format!(
            "libkdn {major}.{minor}.{} is not usable by the kdn crate: it needs libkdn {want_major}.{want_minor} or a \
             later {want_major}.x (libkdn.so.{want_major})",
            number % 100
        ),
    ))
}

/// `Ok` when a libkdn of version `number` has `feature`, which C ABI
/// `since` (`MAJOR * 10000 + MINOR * 100`) added; else `Status::Version`
/// naming the feature and both versions (for options whose fields an older
/// library would refuse only as unknown bytes).
pub(crate) fn check_library_feature(number: u32, since: u32, feature: &str) -> crate::Result<()> {
    if number >= since {
        return Ok(());
    }
    Err(crate::Error::new(
        crate::Status::Version,
        format!(
            "{feature} needs libkdn {}.{} or later; this is libkdn {}.{}.{}",
            since / 10000,
            since / 100 % 100,
            number / 10000,
            number / 100 % 100,
            number % 100
        ),
    ))
}

/// `d` in whole microseconds, rounded up (a non-zero duration never
/// becomes 0, which C reads as "none"), saturating.
pub(crate) fn micros_ceil(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000)).unwrap_or(u64::MAX)
}

/// A C struct as its `kdn_x_init(&s, sizeof s)` leaves it.
pub(crate) fn init<T>(f: unsafe extern "C" fn(*mut T, usize) -> sys::kdn_status) -> T {
    let mut value = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: the struct is plain data (all zeroes is valid) and the size is its own.
    let status = unsafe { f(value.as_mut_ptr(), std::mem::size_of::<T>()) };
    debug_assert_eq!(status, 0);
    unsafe { value.assume_init() }
}

/// (pointer, length) of a string or byte argument.
#[inline]
pub(crate) fn bytes(s: &[u8]) -> (*const std::os::raw::c_char, usize) {
    (s.as_ptr() as *const std::os::raw::c_char, s.len())
}

/// `d` in whole milliseconds, for the C ABI's `*_ms` fields and arguments:
/// rounded up, so that no non-zero duration becomes 0 (which C reads as the
/// default, never, or do not wait), and at most `max` (saturating).
pub(crate) fn millis_ceil(d: Duration, max: u64) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).min(max)
}

#[cfg(test)]
mod tests {
    use super::{check_library_feature, check_library_version, micros_ceil, millis_ceil};
    use std::time::Duration;

    #[test]
    fn micros_round_up_and_saturate() {
        assert_eq!(micros_ceil(Duration::ZERO), 0);
        assert_eq!(micros_ceil(Duration::from_nanos(1)), 1);
        assert_eq!(micros_ceil(Duration::from_nanos(1500)), 2);
        assert_eq!(micros_ceil(Duration::from_millis(50)), 50_000);
        assert_eq!(micros_ceil(Duration::MAX), u64::MAX);
    }

    #[test]
    fn library_versions_this_crate_takes() {
        for ok in [10900, 10901, 11000, 19999] {
            assert!(check_library_version(ok).is_ok(), "{ok}");
        }
        for (old, shown) in
            [(10800, "libkdn 1.8.0"), (10899, "libkdn 1.8.99"), (20000, "libkdn 2.0.0"), (800, "libkdn 0.8.0")]
        {
            let e = check_library_version(old).unwrap_err();
            assert_eq!(e.status(), crate::Status::Version, "{old}");
            assert!(e.message().starts_with(shown) && e.message().contains("needs libkdn 1.9"), "{e}");
        }
    }

    #[test]
    fn a_feature_of_a_later_minor_version_names_itself() {
        for ok in [11400, 11401, 11500] {
            assert!(check_library_feature(ok, 11400, "encryption at rest").is_ok(), "{ok}");
        }
        let e = check_library_feature(11302, 11400, "encryption at rest").unwrap_err();
        assert_eq!(e.status(), crate::Status::Version);
        assert_eq!(e.message(), "encryption at rest needs libkdn 1.14 or later; this is libkdn 1.13.2");
    }

    #[test]
    fn millis_round_up_and_saturate() {
        assert_eq!(millis_ceil(Duration::ZERO, u64::MAX), 0);
        assert_eq!(millis_ceil(Duration::from_nanos(1), u64::MAX), 1);
        assert_eq!(millis_ceil(Duration::from_micros(1500), u64::MAX), 2);
        assert_eq!(millis_ceil(Duration::from_millis(2000), u64::MAX), 2000);
        assert_eq!(millis_ceil(Duration::from_secs(3) + Duration::from_nanos(1), u64::MAX), 3001);
        assert_eq!(millis_ceil(Duration::from_millis(u64::from(u32::MAX) + 1), u32::MAX.into()), u64::from(u32::MAX));
        assert_eq!(millis_ceil(Duration::MAX, u64::MAX), u64::MAX);
        assert_eq!(millis_ceil(Duration::MAX, i64::MAX as u64), i64::MAX as u64);
    }
}

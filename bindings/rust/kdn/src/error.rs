// SPDX-License-Identifier: Apache-2.0
//! Errors: every failed kdn call is an [`Error`] carrying its [`Status`] and
//! the library's message for it.

use kdn_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// A kdn status code other than `KDN_OK`.
///
/// The list is open: a newer library may return a code this crate does not
/// name, which arrives as [`Status::Unknown`]. Match with a wildcard arm.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// A bad handle, pointer, size, count or value: fix the call.
    InvalidArgument,
    /// A named object (a document) does not exist, or its KV left every tier.
    /// Never a cache miss: a miss succeeds with 0 tokens.
    NotFound,
    /// Overloaded or full for now: retry later.
    Busy,
    /// A remote peer is unreachable: reconnect.
    Unavailable,
    /// Stored or received bytes failed a check.
    Corrupt,
    /// Valid, but not supported by this build or version.
    Unsupported,
    /// Out of memory.
    NoMemory,
    /// A bug in kdn (or a panic in an editor callback).
    Internal,
    /// A wait ran out of time; the operation goes on.
    Timeout,
    /// The operation was cancelled.
    Cancelled,
    /// A struct version this library cannot accept.
    Version,
    /// An output buffer is too small; [`Error::needed`] says how much is needed.
    BufferTooSmall,
    /// A negative code this crate does not know (from a newer library).
    Unknown(i32),
}

/// What a caller can do about an error: the three families of `kdn.h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// The call was wrong: `InvalidArgument`, `Version`, `BufferTooSmall`.
    Caller,
    /// Try again later: `Busy`, `Unavailable`, `Timeout`.
    Retryable,
    /// Everything else, including unknown codes.
    Other,
}

impl Status {
    /// The status of a C code; `None` for `KDN_OK` (and any non-negative code).
    pub fn from_code(code: i32) -> Option<Status> {
        Some(match code {
            c if c >= 0 => return None,
            sys::kdn_status_code_KDN_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::kdn_status_code_KDN_ERR_NOT_FOUND => Status::NotFound,
            sys::kdn_status_code_KDN_ERR_BUSY => Status::Busy,
            sys::kdn_status_code_KDN_ERR_UNAVAILABLE => Status::Unavailable,
            sys::kdn_status_code_KDN_ERR_CORRUPT => Status::Corrupt,
            sys::kdn_status_code_KDN_ERR_UNSUPPORTED => Status::Unsupported,
            sys::kdn_status_code_KDN_ERR_NO_MEMORY => Status::NoMemory,
            sys::kdn_status_code_KDN_ERR_INTERNAL => Status::Internal,
            sys::kdn_status_code_KDN_ERR_TIMEOUT => Status::Timeout,
            sys::kdn_status_code_KDN_ERR_CANCELLED => Status::Cancelled,
            sys::kdn_status_code_KDN_ERR_VERSION => Status::Version,
            sys::kdn_status_code_KDN_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            c => Status::Unknown(c),
        })
    }

    /// The C code (`KDN_ERR_*`).
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::kdn_status_code_KDN_ERR_INVALID_ARGUMENT,
            Status::NotFound => sys::kdn_status_code_KDN_ERR_NOT_FOUND,
            Status::Busy => sys::kdn_status_code_KDN_ERR_BUSY,
            Status::Unavailable => sys::kdn_status_code_KDN_ERR_UNAVAILABLE,
            Status::Corrupt => sys::kdn_status_code_KDN_ERR_CORRUPT,
            Status::Unsupported => sys::kdn_status_code_KDN_ERR_UNSUPPORTED,
            Status::NoMemory => sys::kdn_status_code_KDN_ERR_NO_MEMORY,
            Status::Internal => sys::kdn_status_code_KDN_ERR_INTERNAL,
            Status::Timeout => sys::kdn_status_code_KDN_ERR_TIMEOUT,
            Status::Cancelled => sys::kdn_status_code_KDN_ERR_CANCELLED,
            Status::Version => sys::kdn_status_code_KDN_ERR_VERSION,
            Status::BufferTooSmall => sys::kdn_status_code_KDN_ERR_BUFFER_TOO_SMALL,
            Status::Unknown(c) => c,
        }
    }

    /// The library's static name of the code (`"KDN_ERR_NOT_FOUND"`,
    /// `"KDN_ERR_UNKNOWN"` for a code it does not know).
    pub fn name(self) -> &'static str {
        // SAFETY: kdn_status_string never returns NULL; the string is static.
        unsafe { CStr::from_ptr(sys::kdn_status_string(self.code())) }.to_str().unwrap_or("KDN_ERR_UNKNOWN")
    }

    /// The family: whether to fix the call, retry, or give up.
    pub fn family(self) -> Family {
        match self {
            Status::InvalidArgument | Status::Version | Status::BufferTooSmall => Family::Caller,
            Status::Busy | Status::Unavailable | Status::Timeout => Family::Retryable,
            _ => Family::Other,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Status::Unknown(c) => write!(f, "KDN_ERR_UNKNOWN({c})"),
            s => f.write_str(s.name()),
        }
    }
}

/// A failed kdn call: its status and the library's message (for humans;
/// match on [`Error::status`], never on the text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
    needed: Option<u64>,
}

/// `Result<T, kdn::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with a status and a message; for editor callbacks to return,
    /// and for tests.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into(), needed: None }
    }

    /// The status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The library's message (`kdn_last_error_message()` right after the call).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The C code of the status.
    pub fn code(&self) -> i32 {
        self.status.code()
    }

    /// For [`Status::BufferTooSmall`]: how many are needed (tokens, for a
    /// knowledge fetch: the document's length).
    pub fn needed(&self) -> Option<u64> {
        self.needed
    }

    /// The status's family.
    pub fn family(&self) -> Family {
        self.status.family()
    }

    /// Whether the call itself was wrong (invalid argument, version, buffer too small).
    pub fn is_caller_error(&self) -> bool {
        self.family() == Family::Caller
    }

    /// Whether trying again later may succeed (busy, unavailable, timeout).
    pub fn is_retryable(&self) -> bool {
        self.family() == Family::Retryable
    }

    pub(crate) fn with_needed(mut self, needed: u64) -> Error {
        self.needed = Some(needed);
        self
    }

    /// The error of a failed C call: reads this thread's last error message,
    /// so call it right after the call, on the same thread.
    pub(crate) fn last(code: i32) -> Error {
        // SAFETY: never NULL, valid until the next kdn call on this thread.
        let message = unsafe { CStr::from_ptr(sys::kdn_last_error_message()) }.to_string_lossy().into_owned();
        Error::new(Status::from_code(code).unwrap_or(Status::Unknown(code)), message)
    }

    /// An argument the binding refuses before calling C.
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `Ok(())` for `KDN_OK`, else the error with this thread's message.
#[inline]
pub(crate) fn check(code: i32) -> Result<()> {
    if code >= 0 {
        Ok(())
    } else {
        Err(Error::last(code))
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The build script linked a libkdn that runs: this test binary calls it, so
//! it starts only if the loader finds libkdn through the run path the build
//! script gave (the ctests run it without LD_LIBRARY_PATH), and the library
//! is the header's major version, this release or a newer one.
use std::ffi::CStr;

#[test]
fn linked_library_is_this_headers_major_version() {
    // SAFETY: no arguments; kdn_version's string is static.
    let (number, text) = unsafe { (kdn_sys::kdn_version_number(), CStr::from_ptr(kdn_sys::kdn_version())) };
    assert_eq!(number / 10000, kdn_sys::KDN_VERSION_MAJOR, "{text:?}");
    assert!(
        number >= kdn_sys::KDN_VERSION_NUMBER,
        "{number} is older than the header's {}",
        kdn_sys::KDN_VERSION_NUMBER
    );
    let text = text.to_str().unwrap();
    assert!(text.starts_with(&format!("{}.", number / 10000)), "{text}");
}

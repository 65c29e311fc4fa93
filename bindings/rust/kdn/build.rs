// SPDX-License-Identifier: Apache-2.0
//! kdn-sys's run path (a `rustc-link-arg`) does not reach this crate's tests,
//! examples and doctests: emit it again from kdn-sys's links metadata
//! `lib_dir`. (It does not reach the binaries of crates that depend on kdn
//! either, nor does this metadata: they need their own build.rs, README.)
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KDN_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_KDN_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

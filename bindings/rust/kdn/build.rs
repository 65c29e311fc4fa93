// SPDX-License-Identifier: Apache-2.0
//! kdn-sys's rpath (a `rustc-link-arg`) does not reach this crate's tests,
//! examples and doctests: emit it again from kdn-sys's `lib_dir`.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_KDN_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_KDN_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

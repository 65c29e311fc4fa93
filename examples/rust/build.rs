// SPDX-License-Identifier: Apache-2.0
//! Puts libkdn's directory in this binary's run path (RUNPATH), so that it
//! runs without LD_LIBRARY_PATH. kdn-sys found libkdn (pkg-config, or
//! KDN_LIB_DIR) and published the directory as links metadata, which cargo
//! gives to the build scripts of its direct dependents only (hence kdn-sys
//! in Cargo.toml); no cargo mechanism carries a dependency's link arguments
//! to a binary.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(dir) = std::env::var("DEP_KDN_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

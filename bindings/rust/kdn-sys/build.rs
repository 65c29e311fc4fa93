// SPDX-License-Identifier: Apache-2.0
//! Links libkdn, and compiles tests/layout.c (the C compiler's view of every
//! struct, for the layout test) with the system's C compiler: no cc crate.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KDN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=KDN_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=tests/layout.c");
    println!("cargo:rustc-link-lib=dylib=kdn");
    if let Ok(dir) = env::var("KDN_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        // For the crates that depend on this one (DEP_KDN_LIB_DIR): a
        // link-arg does not reach them, so they emit the rpath again.
        println!("cargo:lib_dir={dir}");
    }

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let include =
        env::var("KDN_INCLUDE_DIR").map(PathBuf::from).unwrap_or_else(|_| manifest.join("../../../capi/include"));
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let object = out.join("layout.o");
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let ar = env::var("AR").unwrap_or_else(|_| "ar".into());
    run(Command::new(&cc)
        .args(["-std=c11", "-c"])
        .arg(manifest.join("tests/layout.c"))
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(&object));
    run(Command::new(&ar).arg("crs").arg(out.join("libkdn_layout.a")).arg(&object));
    println!("cargo:rustc-link-search=native={}", out.display());
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

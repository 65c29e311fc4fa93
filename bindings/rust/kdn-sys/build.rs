// SPDX-License-Identifier: Apache-2.0
//! Finds libkdn and kdn.h, links libkdn, and compiles tests/layout.c (the C
//! compiler's view of every struct, for the layout test) with the system's C
//! compiler: no cc or pkg-config crate.
//!
//! Where libkdn is, in this order:
//! - `KDN_LIB_DIR` (and `KDN_INCLUDE_DIR`) when set: overrides, pkg-config is
//!   not asked for what they give;
//! - `pkg-config --libs kdn` (the `PKG_CONFIG` command, default `pkg-config`):
//!   a kdn build tree with `PKG_CONFIG_PATH=<build>/pkgconfig`, or an
//!   installed `kdn.pc`;
//! - else the linker's default path, with a warning.
//!
//! Each directory libkdn is linked from becomes a run path of this crate's
//! own tests (`rustc-link-arg`). Cargo gives no crate's link args to another
//! crate, so the first one is also published as links metadata: crates that
//! depend on kdn-sys directly read it as `DEP_KDN_LIB_DIR` and put it in their
//! binaries' run path (kdn's build.rs, examples/rust/build.rs).
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    for var in [
        "KDN_LIB_DIR",
        "KDN_INCLUDE_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=tests/layout.c");

    let lib_dir = env_dir("KDN_LIB_DIR");
    let include_dir = env_dir("KDN_INCLUDE_DIR");
    let found = if lib_dir.is_some() && include_dir.is_some() {
        Found::default()
    } else {
        match pkg_config(&["--libs", "--cflags-only-I", "kdn"]) {
            Ok(flags) => Found::parse(&flags),
            Err(why) => {
                if lib_dir.is_none() {
                    println!(
                        "cargo:warning=kdn-sys: pkg-config found no kdn ({why}); linking -lkdn from the linker's \
                         default path. Set PKG_CONFIG_PATH=<kdn build>/pkgconfig or <prefix>/lib/pkgconfig, or \
                         KDN_LIB_DIR."
                    );
                }
                Found::default()
            }
        }
    };
    let (lib_dirs, libs) = match lib_dir {
        Some(dir) => (vec![dir], vec!["kdn".to_string()]),
        None if found.libs.is_empty() => (found.lib_dirs, vec!["kdn".to_string()]),
        None => (found.lib_dirs, found.libs),
    };

    for dir in &lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    for lib in &libs {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    if let Some(dir) = lib_dirs.first() {
        println!("cargo:lib_dir={}", dir.display());
    }

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    // Without an override or pkg-config: this crate inside a kdn checkout.
    let include = include_dir.or(found.include).unwrap_or_else(|| manifest.join("../../../capi/include"));
    println!("cargo:include={}", include.display());
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

/// What `pkg-config --libs --cflags-only-I kdn` says.
#[derive(Default)]
struct Found {
    lib_dirs: Vec<PathBuf>,
    libs: Vec<String>,
    include: Option<PathBuf>,
}

impl Found {
    fn parse(flags: &str) -> Found {
        let mut found = Found::default();
        for flag in flags.split_whitespace() {
            if let Some(dir) = flag.strip_prefix("-L") {
                found.lib_dirs.push(PathBuf::from(dir));
            } else if let Some(lib) = flag.strip_prefix("-l") {
                found.libs.push(lib.to_string());
            } else if let Some(dir) = flag.strip_prefix("-I") {
                found.include.get_or_insert(PathBuf::from(dir));
            }
            // -Wl,-rpath,<libdir> names the -L directories again: each gets a run path below.
        }
        found
    }
}

/// A variable naming a directory; unset and empty are the same.
fn env_dir(var: &str) -> Option<PathBuf> {
    env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// pkg-config's output for `args`, or why there is none.
fn pkg_config(args: &[&str]) -> Result<String, String> {
    let cmd = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    let out = Command::new(&cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        // Its first line ("Package kdn was not found in the pkg-config search path.").
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("{cmd}: {}", stderr.lines().next().unwrap_or("failed")));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{cmd}: {e}"))
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

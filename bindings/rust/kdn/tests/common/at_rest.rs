// SPDX-License-Identifier: Apache-2.0
//! Encryption at rest (C ABI 1.14), shared by tests/encryption.rs and
//! tests/encryption_env.rs: master keys, key files, a runtime with one disk
//! tier, and a search of the tier's files for KV in the clear.

use super::{spec, CHUNK, LAYERS, ROW};
use kdn::{as_bytes, DType, KvView, KvViewMut, Result, Runtime, RuntimeOptions, TierConfig};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Two master keys, 64 hex digits each (`openssl rand -hex 32`).
pub const KEY_A: &str = "5f0e3c9a2b7d4e81f6a0c3d2b9e8f7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0";
pub const KEY_B: &str = "0123456789abcdef0fedcba9876543210123456789abcdef0fedcba987654321";

/// The namespace the tests store under.
pub const NS: &str = "at-rest";

/// A fresh directory of this test binary's.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("at-rest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A file `name` in `dir` of `text` with permissions `mode`.
pub fn text_file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A key file (mode 0600) of `keys`, one per line.
pub fn key_file(dir: &Path, name: &str, keys: &[&str]) -> PathBuf {
    text_file(dir, name, &(keys.join("\n") + "\n"), 0o600)
}

/// The disk tier's directory under `dir`.
pub fn tier_dir(dir: &Path) -> PathBuf {
    dir.join("tier")
}

/// A runtime with one disk tier in `tier_dir(dir)`, the options given. Its
/// codec is raw, so that KV in the clear would be found in its files as it is
/// (zstd would hide it without any key).
pub fn disk_runtime(dir: &Path, options: RuntimeOptions) -> Result<Runtime> {
    Runtime::new(
        &options.with_chunk_tokens(CHUNK).with_tier(TierConfig::disk(tier_dir(dir), 64 << 20).with_codec("raw")),
    )
}

/// Stores `kv` (canonical, `tokens.len()` tokens) in a runtime on `dir`;
/// the tokens stored. The runtime is dropped before this returns: every
/// chunk is in the tier's files.
pub fn store(dir: &Path, options: RuntimeOptions, tokens: &[i32], kv: &[f32]) -> u64 {
    let rt = disk_runtime(dir, options).unwrap();
    let model = rt.model(&spec("at-rest")).unwrap();
    model.store(NS, tokens, &KvView::canonical(kv, DType::F32)).unwrap().tokens
}

/// What a runtime on `dir` with `options` retrieves of `tokens`: the tokens
/// written, whether those are `kv`'s bit for bit (and the rest of the output
/// untouched), and its disk tier's `auth_failures`.
pub fn retrieve(dir: &Path, options: RuntimeOptions, tokens: &[i32], kv: &[f32]) -> (u64, bool, u64) {
    let rt = disk_runtime(dir, options).unwrap();
    let model = rt.model(&spec("at-rest")).unwrap();
    let mut out = vec![0f32; kv.len()];
    let got = model.retrieve(NS, tokens, &mut KvViewMut::canonical(&mut out, DType::F32)).unwrap().tokens;
    let n = got as usize;
    let same = (0..LAYERS * 2).all(|lk| {
        let row = lk * tokens.len() * ROW;
        let (written, rest) = (row..row + n * ROW, row + n * ROW..row + tokens.len() * ROW);
        as_bytes(&out[written.clone()]) == as_bytes(&kv[written]) && out[rest].iter().all(|&x| x == 0.0)
    });
    (got, same, rt.tier_stats(0).unwrap().auth_failures)
}

/// Every file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Of the 32-byte blocks of `kv` (at offsets 0, 32, ...: one head's 8
/// dimensions of one token, whatever layout a chunk file keeps), how many
/// some file of the tier on `dir` holds, at any offset; and how many there
/// are.
pub fn blocks_in_the_clear(dir: &Path, kv: &[f32]) -> (usize, usize) {
    let mut paths = Vec::new();
    files(&tier_dir(dir), &mut paths);
    assert!(!paths.is_empty(), "the tier wrote no file under {}", tier_dir(dir).display());
    let mut windows: HashSet<&[u8]> = HashSet::new();
    let contents: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    for bytes in &contents {
        windows.extend(bytes.windows(32));
    }
    let blocks = as_bytes(kv).chunks_exact(32);
    let total = blocks.len();
    (blocks.filter(|b| windows.contains(b)).count(), total)
}

// SPDX-License-Identifier: Apache-2.0
//! Encryption at rest (C ABI 1.14) with master keys from a file:
//! `RuntimeOptions::encryption_key_file`. A disk tier's chunks are
//! AES-256-GCM encrypted: read back whole with the key, none of the KV in
//! the tier's files, misses (counted in `auth_failures`) without the key or
//! with another; bad key sources refused with their reason. The keys from
//! an environment variable: tests/encryption_env.rs. The KV is the reference
//! model's.

mod common;
use common::at_rest::*;
use common::*;
use kdn::*;
use std::path::Path;

#[test]
fn an_encrypted_disk_tier_gives_the_kv_back_whole_and_holds_none_of_it_in_the_clear() {
    let (tokens, reference) = reference_canonical();
    let dir = scratch_dir("round-trip");
    let keys = key_file(&dir, "keys", &[KEY_A]);
    let with_keys = || RuntimeOptions::default().with_encryption_key_file(&keys);
    assert_eq!(with_keys().encryption_key_file.as_deref(), Some(keys.as_path()));
    assert_eq!(store(&dir, with_keys(), &tokens, &reference), 48);
    // A fresh runtime on the same directory: the chunks come from the files.
    assert_eq!(retrieve(&dir, with_keys(), &tokens, &reference), (48, true, 0));
    let (found, blocks) = blocks_in_the_clear(&dir, &reference);
    assert_eq!(blocks, LAYERS * 2 * 48 * HEADS, "one block per head of each token's K and V");
    assert_eq!(found, 0, "{found} of the {blocks} 32-byte blocks of the KV are in the tier's files");

    // The same search finds every block in the files of a tier without keys.
    let clear = scratch_dir("round-trip-clear");
    assert_eq!(store(&clear, RuntimeOptions::default(), &tokens, &reference), 48);
    assert_eq!(retrieve(&clear, RuntimeOptions::default(), &tokens, &reference), (48, true, 0));
    assert_eq!(blocks_in_the_clear(&clear, &reference), (blocks, blocks), "without keys the KV is in the clear");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&clear);
}

#[test]
fn without_the_key_or_with_another_encrypted_chunks_are_misses() {
    let (tokens, reference) = reference_canonical();
    let dir = scratch_dir("misses");
    let ours = key_file(&dir, "ours", &[KEY_A]);
    let theirs = key_file(&dir, "theirs", &[KEY_B]);
    // Each reader on a tier of its own (one that fails to decrypt a chunk
    // may drop it), stored under our key.
    for (name, reader) in [
        ("no-keys", RuntimeOptions::default()),
        ("another-key", RuntimeOptions::default().with_encryption_key_file(&theirs)),
    ] {
        let tier = dir.join(name);
        assert_eq!(store(&tier, RuntimeOptions::default().with_encryption_key_file(&ours), &tokens, &reference), 48);
        let (got, untouched, auth_failures) = retrieve(&tier, reader, &tokens, &reference);
        assert_eq!((got, untouched), (0, true), "{name}: a miss, nothing written");
        assert!(auth_failures >= 1, "{name}: counted, {auth_failures}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_first_key_encrypts_and_every_key_decrypts() {
    let (tokens, reference) = reference_canonical();
    let dir = scratch_dir("rotation");
    let old = key_file(&dir, "old", &[KEY_A]);
    let rotated = key_file(&dir, "rotated", &[KEY_B, KEY_A]);
    let new = key_file(&dir, "new", &[KEY_B]);
    let with = |keys: &Path| RuntimeOptions::default().with_encryption_key_file(keys);
    // Chunks of the old key, read with the new key first and the old one kept.
    assert_eq!(store(&dir, with(&old), &tokens, &reference), 48);
    assert_eq!(retrieve(&dir, with(&rotated), &tokens, &reference), (48, true, 0));
    // Chunks stored after the rotation are the new key's: it alone reads them.
    let (other, other_kv): (Vec<i32>, Vec<f32>) = (tokens.iter().map(|t| t + 1).collect(), reference.clone());
    assert_eq!(store(&dir, with(&rotated), &other, &other_kv), 48);
    assert_eq!(retrieve(&dir, with(&new), &other, &other_kv), (48, true, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_key_sources_are_refused_with_their_reason() {
    let dir = scratch_dir("refused");
    let good = key_file(&dir, "good", &[KEY_A]);
    let refused = |options: RuntimeOptions, reason: &str| {
        let e = disk_runtime(&dir, options).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{reason}: {e}");
        assert!(e.message().contains(reason), "{reason:?} not in {e}");
        assert!(!e.message().contains(KEY_A) && !e.message().contains(&KEY_B[..63]), "the message holds a key: {e}");
        e
    };
    let file = |path: &Path| RuntimeOptions::default().with_encryption_key_file(path);

    // A key file others may read: 0644.
    let open = text_file(&dir, "open", &format!("{KEY_A}\n"), 0o644);
    refused(file(&open), "chmod 600");
    // Both sources at once.
    let both = file(&good).with_encryption_key_env("KDN_RUST_TEST_KEYS_UNSET");
    refused(both, "not both");
    // A missing file, a line that is not a key (after a good one), no key.
    refused(file(&dir.join("missing")), "cannot open");
    let bad = text_file(&dir, "bad", &format!("{KEY_A}\n{}\n", &KEY_B[..63]), 0o600);
    refused(file(&bad), "line 2 is not a key");
    refused(file(&text_file(&dir, "empty", "", 0o600)), "holds no key");
    // What the crate refuses before C: an empty path, which C would read as
    // no keys at all, and a NUL, where C would end the path.
    refused(file(Path::new("")), "encryption_key_file is an empty path");
    refused(file(Path::new("/tmp/keys\0x")), "holds '\\0'");
    // A variable that is not set; names that cannot be a variable's.
    refused(RuntimeOptions::default().with_encryption_key_env("KDN_RUST_TEST_KEYS_UNSET"), "is not set");
    refused(RuntimeOptions::default().with_encryption_key_env(""), "encryption_key_env is an empty name");
    refused(RuntimeOptions::default().with_encryption_key_env("KDN=KEYS"), "holds '='");
    // The good file works.
    assert!(disk_runtime(&dir, file(&good)).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

// SPDX-License-Identifier: Apache-2.0
//! Encryption at rest (C ABI 1.14) with master keys from an environment
//! variable: `RuntimeOptions::encryption_key_env` names it. One test in a
//! binary of its own: `std::env::set_var` must not race another test's
//! thread reading the environment (libkdn's `getenv` takes no Rust lock).

mod common;
use common::at_rest::*;
use common::*;
use kdn::*;

const VARIABLE: &str = "KDN_RUST_TEST_MASTER_KEYS";

#[test]
fn keys_from_an_environment_variable_encrypt_as_the_same_keys_from_a_file() {
    let (tokens, reference) = reference_canonical();
    let dir = scratch_dir("env");
    std::env::set_var(VARIABLE, format!("{KEY_A}\n"));
    let from_env = || RuntimeOptions::default().with_encryption_key_env(VARIABLE);
    assert_eq!(from_env().encryption_key_env.as_deref(), Some(std::ffi::OsStr::new(VARIABLE)));
    assert_eq!(store(&dir, from_env(), &tokens, &reference), 48);
    assert_eq!(retrieve(&dir, from_env(), &tokens, &reference), (48, true, 0));
    let (found, blocks) = blocks_in_the_clear(&dir, &reference);
    assert_eq!(found, 0, "{found} of the {blocks} 32-byte blocks of the KV are in the tier's files");
    // The same key from a file reads them; no key does not.
    let file = key_file(&dir, "keys", &[KEY_A]);
    assert_eq!(
        retrieve(&dir, RuntimeOptions::default().with_encryption_key_file(&file), &tokens, &reference),
        (48, true, 0)
    );
    let (got, untouched, auth_failures) = retrieve(&dir, RuntimeOptions::default(), &tokens, &reference);
    assert_eq!((got, untouched), (0, true));
    assert!(auth_failures >= 1, "{auth_failures}");

    // The variable's value is read when the runtime is created: one that is
    // not a key is refused, and its message does not show the value.
    std::env::set_var(VARIABLE, "not-a-key");
    let e = disk_runtime(&dir, from_env()).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains(VARIABLE) && !e.message().contains("not-a-key"), "{e}");
    std::env::remove_var(VARIABLE);
    let e = disk_runtime(&dir, from_env()).unwrap_err();
    assert!(e.message().contains("is not set"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

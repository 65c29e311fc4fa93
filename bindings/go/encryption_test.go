// SPDX-License-Identifier: Apache-2.0
package kdn

// Encryption at rest (ABI 1.14): RuntimeOptions.EncryptionKeyFile and
// EncryptionKeyEnv. A disk tier's files hold no KV in the clear, the KV
// comes back whole with the keys, and a runtime without them or with other
// keys gets misses, counted in TierStats.AuthFailures; bad sources are
// refused with a message that says why.

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two master keys, as `openssl rand -hex 32` prints them.
const (
	keyA = "8f1c2a7e4b9d03f6a5e8c1b27d4f90e3a6b5c8d1e2f3a4b5c6d7e8f901a2b3c4"
	keyB = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

// keyFile writes a master key file (content as given) of that mode,
// whatever the umask, and returns its path.
func keyFile(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// plaintextBlocks counts the 32-byte blocks of plain (cut at 32-byte steps)
// that occur anywhere in the regular files under dir, of total blocks.
func plaintextBlocks(t *testing.T, plain []byte, dir string) (found, total int) {
	t.Helper()
	var files [][]byte
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		files = append(files, b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no files under %s", dir)
	}
	const block = 32
	for at := 0; at+block <= len(plain); at += block {
		total++
		for _, f := range files {
			if bytes.Contains(f, plain[at:at+block]) {
				found++
				break
			}
		}
	}
	return found, total
}

// atRest opens runtimes over one raw disk tier (raw: without keys the KV
// lies in its files as it is, so a search for it finds it).
type atRest struct {
	t      *testing.T
	dir    string
	tokens []int32
	kv     []float32
}

func newAtRest(t *testing.T) *atRest {
	return &atRest{t: t, dir: t.TempDir(), tokens: testTokens(positions), kv: canonical(positions, 3)}
}

// run opens a runtime over the disk with opts' keys, stores or retrieves
// the KV, and returns the tokens and the disk tier's auth failures. A
// retrieve of every token must give the KV bit for bit.
func (a *atRest) run(opts RuntimeOptions, store bool) (tokens, authFailures uint64) {
	t := a.t
	t.Helper()
	disk := DiskTier(a.dir, 16<<20)
	disk.Codec = "raw"
	opts.ChunkTokens, opts.Tiers = chunk, []TierConfig{disk}
	rt, err := NewRuntime(&opts)
	if err != nil {
		t.Fatalf("NewRuntime: %v", err)
	}
	defer rt.Close()
	m, err := rt.NewModel(testSpec())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var res KVResult
	if store {
		res, err = m.Store(bg, ns, Tokens(a.tokens), Float32s(a.kv))
	} else {
		out := make([]float32, len(a.kv))
		res, err = m.Retrieve(bg, ns, Tokens(a.tokens), Float32s(out))
		if err == nil && res.Tokens == positions && !bytes.Equal(Float32s(out), Float32s(a.kv)) {
			t.Fatal("the KV read back differs from the KV stored")
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	ts, err := rt.TierStats(0)
	if err != nil {
		t.Fatal(err)
	}
	if ts.Kind != TierDisk {
		t.Fatalf("tier 0 is %v, not the disk", ts.Kind)
	}
	return res.Tokens, ts.AuthFailures
}

// A disk tier written with a key file holds none of the KV in the clear
// (where one written without keys holds all of it), and gives it back bit
// for bit to a runtime with the key.
func TestEncryptionKeyFileDisk(t *testing.T) {
	keys := keyFile(t, keyA+"\n", 0o600)
	plain := Float32s(canonical(positions, 3))

	// The search works: without keys, every block of the KV is in the files.
	clear := newAtRest(t)
	if n, _ := clear.run(RuntimeOptions{}, true); n != positions {
		t.Fatalf("Store without keys: %d tokens", n)
	}
	found, total := plaintextBlocks(t, plain, clear.dir)
	if total < 100 || found != total {
		t.Fatalf("without keys, %d of the %d blocks of the KV found in the disk's files (want all)", found, total)
	}

	sealed := newAtRest(t)
	if n, failures := sealed.run(RuntimeOptions{EncryptionKeyFile: keys}, true); n != positions || failures != 0 {
		t.Fatalf("Store with the key file: %d tokens, %d auth failures", n, failures)
	}
	if found, total := plaintextBlocks(t, plain, sealed.dir); found != 0 {
		t.Fatalf("with the key file, %d of the %d blocks of the KV found in the clear in the disk's files",
			found, total)
	}
	// A fresh runtime with the key reads it whole (run checks the bytes).
	if n, failures := sealed.run(RuntimeOptions{EncryptionKeyFile: keys}, false); n != positions || failures != 0 {
		t.Fatalf("Retrieve with the key file: %d tokens, %d auth failures", n, failures)
	}
	// Rotation: a ring whose new key comes first still reads the old key's
	// chunks.
	rotated := keyFile(t, keyB+"\n"+keyA+"\n", 0o600)
	if n, failures := sealed.run(RuntimeOptions{EncryptionKeyFile: rotated}, false); n != positions ||
		failures != 0 {
		t.Fatalf("Retrieve with a ring holding the key second: %d tokens, %d auth failures", n, failures)
	}
}

// A runtime without the key, or with another one, gets a miss counted in
// TierStats.AuthFailures. Each on a disk of its own: a chunk that does not
// open is dropped.
func TestEncryptionWrongKey(t *testing.T) {
	keys := keyFile(t, keyA+"\n", 0o600)
	for name, opts := range map[string]RuntimeOptions{
		"no keys":     {},
		"another key": {EncryptionKeyFile: keyFile(t, keyB+"\n", 0o600)},
	} {
		a := newAtRest(t)
		if n, _ := a.run(RuntimeOptions{EncryptionKeyFile: keys}, true); n != positions {
			t.Fatalf("%s: Store with the key file: %d tokens", name, n)
		}
		if n, failures := a.run(opts, false); n != 0 || failures < 1 {
			t.Fatalf("Retrieve with %s: %d tokens, %d auth failures (want 0 tokens, at least 1 failure)", name, n,
				failures)
		}
	}
}

// EncryptionKeyEnv names a variable holding the keys (set here with
// os.Setenv, through t.Setenv): the same keys as a file's read the same
// chunks.
func TestEncryptionKeyEnv(t *testing.T) {
	const variable = "KDN_GO_TEST_MASTER_KEYS"
	t.Setenv(variable, keyA)
	a := newAtRest(t)
	if n, failures := a.run(RuntimeOptions{EncryptionKeyEnv: variable}, true); n != positions || failures != 0 {
		t.Fatalf("Store with the key variable: %d tokens, %d auth failures", n, failures)
	}
	if found, total := plaintextBlocks(t, Float32s(a.kv), a.dir); found != 0 {
		t.Fatalf("with the key variable, %d of the %d blocks of the KV found in the clear", found, total)
	}
	if n, failures := a.run(RuntimeOptions{EncryptionKeyEnv: variable}, false); n != positions || failures != 0 {
		t.Fatalf("Retrieve with the key variable: %d tokens, %d auth failures", n, failures)
	}
	if n, failures := a.run(RuntimeOptions{EncryptionKeyFile: keyFile(t, keyA+"\n", 0o600)}, false); n != positions ||
		failures != 0 {
		t.Fatalf("Retrieve with the same key from a file: %d tokens, %d auth failures", n, failures)
	}
	// The variable holds another key now: a miss.
	t.Setenv(variable, keyB)
	if n, failures := a.run(RuntimeOptions{EncryptionKeyEnv: variable}, false); n != 0 || failures < 1 {
		t.Fatalf("Retrieve with another key in the variable: %d tokens, %d auth failures", n, failures)
	}
}

// Bad sources: ErrInvalidArgument from NewRuntime, whose message says why
// (and never holds a key).
func TestEncryptionBadSources(t *testing.T) {
	const variable = "KDN_GO_TEST_MASTER_KEYS"
	t.Setenv(variable, keyA)
	good := keyFile(t, keyA+"\n", 0o600)
	for _, c := range []struct {
		name string
		opts RuntimeOptions
		why  string // in the message
	}{
		{"a key file open to others (0644)", RuntimeOptions{EncryptionKeyFile: keyFile(t, keyA+"\n", 0o644)},
			"may be read or written by others"},
		{"a key file and a key variable at once", RuntimeOptions{EncryptionKeyFile: good, EncryptionKeyEnv: variable},
			"not both"},
		{"a missing key file", RuntimeOptions{EncryptionKeyFile: filepath.Join(t.TempDir(), "missing")},
			"cannot open"},
		{"a key file whose line is not a key", RuntimeOptions{EncryptionKeyFile: keyFile(t, "not-a-key\n", 0o600)},
			"is not a key"},
		{"an unset key variable", RuntimeOptions{EncryptionKeyEnv: "KDN_GO_TEST_NO_SUCH_VARIABLE"},
			"is not set"},
	} {
		opts := c.opts
		opts.Tiers = []TierConfig{DiskTier(t.TempDir(), 16<<20)}
		rt, err := NewRuntime(&opts)
		wantStatus(t, c.name, err, ErrInvalidArgument)
		if rt != nil {
			t.Fatalf("%s: a runtime", c.name)
		}
		if msg := err.Error(); !strings.Contains(msg, c.why) || strings.Contains(strings.ToLower(msg), keyA) {
			t.Fatalf("%s: %q, want a message saying %q (and no key)", c.name, msg, c.why)
		}
	}
}

// A libkdn older than 1.14 (without encryption_key_file and _env) is
// refused with ErrVersion, naming the version it has and the one needed,
// before the keys could be ignored.
func TestEncryptionNeedsLibkdn114(t *testing.T) {
	if BindingVersionMajor != 1 || BindingVersionMinor < 14 {
		t.Fatalf("the binding is for libkdn %d.%d; EncryptionKeyFile needs 1.14", BindingVersionMajor,
			BindingVersionMinor)
	}
	keys := keyFile(t, keyA+"\n", 0o600)
	libraryVersionNumber = func() uint32 { return 11302 } // 1.13.2
	defer func() { libraryVersionNumber = VersionNumber }()
	rt, err := NewRuntime(&RuntimeOptions{EncryptionKeyFile: keys})
	if rt != nil {
		rt.Close()
	}
	wantStatus(t, "EncryptionKeyFile on libkdn 1.13", err, ErrVersion)
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Message, "libkdn 1.13.2 ") ||
		!strings.Contains(e.Message, fmt.Sprintf("needs libkdn 1.%d ", BindingVersionMinor)) {
		t.Fatalf("EncryptionKeyFile on libkdn 1.13: %v, want a message naming 1.13.2 and what it needs", err)
	}
}

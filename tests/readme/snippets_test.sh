#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# readme.snippets: runs every block of README.md marked `<!-- snippet: NAME -->`
# (the fenced sh block on the next line) exactly as written, as a newcomer
# would paste it after `scripts/setup`: from the repository root, in a fresh
# shell whose environment is a new empty HOME, a PATH of the system's
# directories and the toolchains' (cargo's, when rustup put it in a home of
# its own, with RUSTUP_HOME and CARGO_HOME naming it), and TMPDIR. Nothing
# else: no LD_LIBRARY_PATH, PKG_CONFIG_PATH, PYTHONPATH, CGO_* or KDN_*.
# The bindings' READMEs carry their language's block too: it must be the
# same text as README.md's.
#
#   snippets_test.sh SOURCE_DIR [NAME...]     (default: every snippet)
set -uo pipefail
src=$1; shift
cd "$src" || exit 1
fail=0
say() { echo "snippets: $*"; }

# NAME -> its block, from a markdown file (awk: the fenced block after the marker).
extract() {  # file name
  awk -v want="$2" '
    $0 ~ "^<!-- snippet: " want " -->$" { armed = 1; next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }
    armed && !inside && NF { exit }' "$1"
}
names() { sed -n 's/^<!-- snippet: \([a-z0-9-]*\) -->$/\1/p' "$1"; }

mapfile -t all < <(names README.md)
[ ${#all[@]} -gt 0 ] || { say "no snippets in README.md"; exit 1; }
want=("$@")
[ ${#want[@]} -eq 0 ] && want=("${all[@]}")

# The bindings' copies.
for lang in go java python rust; do
  readme=bindings/$lang/README.md
  [ -f "$readme" ] || continue
  if names "$readme" | grep -qx "$lang"; then
    if [ "$(extract "$readme" "$lang")" != "$(extract README.md "$lang")" ]; then
      say "FAIL: $readme's '$lang' snippet differs from README.md's"
      diff <(extract README.md "$lang") <(extract "$readme" "$lang")
      fail=1
    fi
  fi
done

# The toolchains, where this machine has them.
path=/usr/local/bin:/usr/bin:/bin
extra_env=()
if cargo=$(command -v cargo); then
  dir=$(dirname "$cargo")
  case ":$path:" in *":$dir:"*) ;; *) path=$path:$dir ;; esac
  home=${HOME:-/root}
  if [ -z "${RUSTUP_HOME:-}" ] && [ -d "$home/.rustup" ]; then extra_env+=("RUSTUP_HOME=$home/.rustup"); fi
  [ -n "${RUSTUP_HOME:-}" ] && extra_env+=("RUSTUP_HOME=$RUSTUP_HOME")
  if [ -z "${CARGO_HOME:-}" ] && [ -d "$home/.cargo" ]; then extra_env+=("CARGO_HOME=$home/.cargo"); fi
  [ -n "${CARGO_HOME:-}" ] && extra_env+=("CARGO_HOME=$CARGO_HOME")
fi

for name in "${want[@]}"; do
  block=$(extract README.md "$name")
  [ -n "$block" ] || { say "FAIL: no snippet '$name' in README.md"; fail=1; continue; }
  scratch=$(mktemp -d)
  mkdir -p "$scratch/home" "$scratch/tmp"
  say "---- $name (HOME=$scratch/home) ----"
  start=$(date +%s)
  env -i HOME="$scratch/home" PATH="$path" TMPDIR="$scratch/tmp" "${extra_env[@]}" \
    timeout 900 bash -euo pipefail -c "$block" 2>&1
  rc=$?
  say "$name: exit $rc after $(( $(date +%s) - start )) s"
  [ "$rc" = 0 ] || { say "FAIL: $name"; fail=1; }
  chmod -R u+w "$scratch" 2>/dev/null; rm -rf "$scratch"
done
[ "$fail" = 0 ] && say "passed: ${want[*]}"
exit "$fail"

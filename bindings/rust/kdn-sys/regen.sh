#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Regenerates kdn-sys from capi/include/kdn/kdn.h: src/bindings.rs (bindgen,
# with the experimental section) and the layout test's two tables,
# tests/layout.c and tests/layout.rs (gen_layout.py). The output is committed.
#
#   regen.sh            rewrite the crate's own files
#   regen.sh DIR        write them under DIR instead (DIR/src, DIR/tests)
#   regen.sh --check    regenerate into a temporary directory and fail if
#                       anything differs from the committed files (ctest
#                       bindings.rust.bindgen_current)
#
# Needs Debian's bindgen 0.60.1 (package bindgen, with libclang1-14 and
# libclang-common-14-dev), rustfmt (bindgen formats its output with it, with
# bindgen-rustfmt.toml) and /usr/bin/python3. Another bindgen version writes
# different text: the check says so first.
set -eu
crate=$(cd "$(dirname "$0")" && pwd)
header="$crate/../../../capi/include/kdn/kdn.h"
bindgen=${BINDGEN:-bindgen}

if [ "${1:-}" = "--check" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  committed=$(head -n 1 "$crate/src/bindings.rs")
  installed=$("$bindgen" --version)
  sh "$crate/regen.sh" "$tmp"
  status=0
  for f in src/bindings.rs tests/layout.c tests/layout.rs; do
    if ! cmp -s "$crate/$f" "$tmp/$f"; then
      echo "kdn-sys: $f is not what regen.sh generates from kdn.h now:" >>"$tmp/report"
      diff -u "$crate/$f" "$tmp/$f" | head -n 60 >>"$tmp/report" || true
      status=1
    fi
  done
  if [ $status -ne 0 ]; then
    case "$committed" in
      *"rust-bindgen ${installed#bindgen }"*) ;;
      *) echo "kdn-sys: BINDGEN VERSION: the committed src/bindings.rs says '$committed', the installed one is '$installed'."
         echo "  A different bindgen writes different text: use bindgen 0.60.1 (Debian 12), or commit its output after review." ;;
    esac
    cat "$tmp/report"
    echo "kdn-sys: run bindings/rust/kdn-sys/regen.sh and commit the result"
  else
    echo "kdn-sys: bindings.rs, layout.c and layout.rs are current ($installed)"
  fi
  exit $status
fi

out=${1:-$crate}
mkdir -p "$out/src" "$out/tests"
"$bindgen" --size_t-is-usize --allowlist-function 'kdn_.*' --allowlist-type 'kdn_.*' --allowlist-var 'KDN_.*' \
  --rustfmt-configuration-file "$crate/bindgen-rustfmt.toml" "$header" -o "$out/src/bindings.rs" -- -DKDN_EXPERIMENTAL
/usr/bin/python3 "$crate/gen_layout.py" "$out/src/bindings.rs" "$out/tests"

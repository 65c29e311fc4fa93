#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every source file kdn holds says its licence in its first lines (an
# SPDX-License-Identifier), and the licence files are there: a file added
# without the header fails here, not at a release.
set -euo pipefail
cd "$1"
for f in LICENSE NOTICE THIRD_PARTY_NOTICES.md models/LICENSE; do
  [ -s "$f" ] || { echo "missing: $f"; exit 1; }
done
grep -q "Apache License" LICENSE || { echo "LICENSE is not the Apache License"; exit 1; }
if ! git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "not a git checkout: the file list comes from git"; exit 0
fi
missing=0
while IFS= read -r f; do
  case "$f" in
    # Generated files (regen.sh compares them byte for byte) and the frozen 1.0 header.
    models/*|fuzz/corpus/*|*.rs.lock|*/bindings.rs|bindings/rust/kdn-sys/tests/layout.*|tests/capi/abi/kdn_v1.h) continue ;;
  esac
  case "$f" in
    *.cc|*.h|*.c|*.cu|*.cuh|*.hpp|*.java|*.rs|*.go|*.i|*.py|*.sh|*.cmake|*.capnp|*CMakeLists.txt|scripts/*|.ci/run|fuzz/run) ;;
    *) continue ;;
  esac
  [ -f "$f" ] || continue
  if ! head -n 3 "$f" | grep -q "SPDX-License-Identifier: Apache-2.0"; then
    echo "no SPDX-License-Identifier in the first lines of $f"
    missing=$((missing + 1))
  fi
done < <(git ls-files)
[ "$missing" -eq 0 ] || { echo "$missing files without the licence header"; exit 1; }
echo "every source file carries its SPDX-License-Identifier"

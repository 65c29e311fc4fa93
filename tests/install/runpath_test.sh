#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install.runpaths: the run paths (RUNPATH / RPATH) of what kdn installs have
# no empty and no relative entry: the loader reads either as a directory
# relative to where the program runs, so a kdnd or an engine started in a
# directory someone else can write to would load their libcapnp, libzstd ...
# ($ORIGIN, the file's own directory, is fine.)
#   runpath_test.sh READELF FILE...
set -uo pipefail
readelf=$1; shift
fail=0
for f in "$@"; do
  paths=$("$readelf" -d "$f" | sed -n 's/.*(R\(UN\)\{0,1\}PATH).*\[\(.*\)\]$/\2/p')
  echo "$f: ${paths:-(none)}"
  [ -z "$paths" ] && continue
  IFS=: read -r -a entries <<< "$paths"
  # A trailing ':' leaves no element for read: count the separators too.
  [ "${paths: -1}" = ":" ] && entries+=("")
  for e in "${entries[@]}"; do
    case $e in
      /* | '$ORIGIN' | '$ORIGIN/'*) ;;
      *) echo "FAIL: $f has the run path entry '$e' (empty or relative) in [$paths]"; fail=1 ;;
    esac
  done
done
exit "$fail"

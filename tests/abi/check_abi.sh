#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ABI check of libkdn.so: abidw (Debian's abigail-tools) describes the
# library's ABI, its exported functions and every type they reach, from its
# DWARF (build with -g: RelWithDebInfo or Debug), and abidiff compares that
# with the committed baseline, tests/abi/libkdn.abi (the ABI of 1.0).
#
#   tests/abi/check_abi.sh [LIB]                  check LIB (default: build/libkdn.so)
#   tests/abi/check_abi.sh --update [LIB]         rewrite the baseline from LIB
#   tests/abi/check_abi.sh --baseline FILE [LIB]  check against FILE instead
#
# It passes when abidiff sees no change (its exit 0) or only changes (exit 4)
# that kdn.h's rules allow: new functions, fields appended to a struct, new
# enumerators. It fails on what libabigail calls incompatible (bit 8 of its
# exit: a function removed, ...), and on changes that libabigail calls mere
# "changes" but that break a caller built against the baseline: a field
# moved, removed or retyped; a struct that shrank; an enumerator's value
# changed; a parameter added, removed or retyped; a return type changed; the
# SONAME changed. The experimental section of kdn.h is left out (kdn.abignore).
# An intended change of that kind means a new major version: review the
# report, then --update. Compatible additions pass; --update when releasing
# them, so that they are frozen too.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
baseline=$here/libkdn.abi
suppressions=$here/kdn.abignore
update=0
while [ $# -gt 0 ]; do
  case $1 in
    --update) update=1; shift ;;
    --baseline) baseline=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "check_abi: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
lib=${1:-$root/build/libkdn.so}

fail() { echo "check_abi: FAIL: $*" >&2; exit 1; }

for tool in abidw abidiff readelf; do
  command -v "$tool" > /dev/null ||
    fail "$tool is missing: install Debian's abigail-tools and binutils (scripts/setup does)"
done
[ -f "$lib" ] || fail "$lib: no such library (build it first)"
sections=$(readelf -S "$lib") || fail "readelf -S $lib failed"
grep -q '\.debug_info' <<< "$sections" ||
  fail "$lib has no debug information: abidw would see symbols only (build with -g: RelWithDebInfo)"

work=$(mktemp -d "${TMPDIR:-/tmp}/kdn-abi.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT

# --exported-interfaces-only: the kdn_* functions and the types they reach;
# --headers-dir + --drop-private-types: handles stay opaque (kdn_runtime is
# defined in capi/src/shim.h; its layout is no part of the ABI). No paths of this
# machine, no DT_NEEDED (CUDA and CPU-only builds have the same ABI).
current=$work/current.abi
abidw --no-corpus-path --no-comp-dir-path --short-locs --no-elf-needed \
  --headers-dir "$root/capi/include/kdn" --drop-private-types --exported-interfaces-only \
  --out-file "$current" "$lib" > "$work/abidw.log" 2>&1 ||
  { cat "$work/abidw.log" >&2; fail "abidw $lib failed"; }
functions=$(grep -c '<function-decl name=' "$current")

if [ "$update" = 1 ]; then
  cp "$current" "$baseline"
  echo "check_abi: wrote $baseline from $lib ($functions functions; the experimental ones are ignored by the check)"
  exit 0
fi

[ -f "$baseline" ] || fail "no baseline $baseline: write it with tests/abi/check_abi.sh --update $lib"

abidiff --suppressions "$suppressions" "$baseline" "$current" > "$work/report" 2>&1
rc=$?
report() { echo "---- abidiff $baseline (baseline) $lib"; cat "$work/report"; echo "----"; }

if [ $((rc & 3)) -ne 0 ]; then
  report
  fail "abidiff did not run (exit $rc)"
fi
if [ $((rc & 8)) -ne 0 ]; then
  report
  fail "incompatible ABI change (abidiff exit $rc): a caller built against the baseline breaks"
fi
if [ $((rc & 4)) -ne 0 ]; then
  # Changes libabigail does not call incompatible, but kdn.h's rules forbid.
  # A member that is a pointer to a struct that grew (appended fields) is
  # reported as a "data member change" whose only change is in the pointed
  # to type; that type's own change is checked where the report lists it.
  # Exempt only a lone change of that kind.
  member_changes=$(awk '
    /data members? changes?:/ { if ($0 ~ /[^0-9]1 data member change:/) pending = $0; else print; next }
    pending != "" && NF > 0 {
      if ($0 ~ /type of .*\*.* changed:$/) { pointer = 1; next }
      if (pointer && $0 ~ /in pointed to type/) { pending = ""; pointer = 0; next }
      print pending; pending = ""; pointer = 0
    }
    END { if (pending != "") print pending }' "$work/report")
  broken=$(grep -E -e 'offset changed' -e 'deletion' \
                   -e 'enumerators? changes?:' -e 'was (added|removed)' -e 'return type changed' \
                   -e "parameter [0-9]+ of type .* changed:\$" -e 'entity changed' -e 'name changed' \
                   -e 'SONAME changed' -e 'architecture changed' "$work/report")
  shrunk=$(grep -E 'type size changed from [0-9]+ to [0-9]+' "$work/report" |
           awk '{ for (i = 1; i < NF; ++i) if ($i == "from") { if ($(i + 3) + 0 < $(i + 1) + 0) print; break } }')
  broken=$(printf '%s\n%s' "$broken" "$member_changes" | sed '/^$/d')
  if [ -n "$broken$shrunk" ]; then
    report
    printf '%s\n' "$broken" "$shrunk" | sed '/^$/d; s/^ */  /'
    fail "ABI change that breaks callers built against the baseline (above); kdn.h allows only new functions, fields appended to a struct and new enumerators"
  fi
  report
  echo "check_abi: compatible additions only ($functions functions); refresh the baseline (--update) when they are released"
  exit 0
fi
echo "check_abi: $lib matches the baseline ($functions functions)"
exit 0

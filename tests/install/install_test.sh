#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# install.example: installs the build into a fresh prefix and uses it as a
# user would. Checks that the install holds the C ABI and nothing else
# (kdn.h, libkdn.so with SONAME libkdn.so.<major>, kdn.pc, the CMake
# package), that the library needs nothing of the build tree, that kdn.pc and
# the package's version file say the right things, then builds examples/c
# against the installed tree both ways, (a) CMake's find_package(kdn 1) and
# (b) cc $(pkg-config --cflags --libs kdn), and runs both programs.
#
#   install_test.sh BUILD_DIR SOURCE_DIR VERSION LIBDIR GENERATOR CC MODELS_DIR [SANITIZER_FLAGS]
#
# SANITIZER_FLAGS: the flags the build's libkdn.so was instrumented with
# (ASan + UBSan, or TSan): the examples are compiled and linked with them
# too, so that the sanitizer's runtime comes first, as it must.
# Exit status: 0 passed; 1 failed; 77 the reference KV is missing (the
# examples could not run; a failure with KDN_REQUIRE_MODELS=1).
set -euo pipefail

if [ $# -lt 7 ]; then
  sed -n '10p' "$0" >&2
  exit 2
fi
build=$1 src=$2 version=$3 libdir=$4 generator=$5 cc=$6 models=$7 san=${8:-}
major=${version%%.*}

say() { echo "install_test: $*"; }
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/kdn-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
lib=$prefix/$libdir

say "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "cmake --install failed"; }

# ---- What is installed: the C ABI, all of it, and nothing else ----------
expected=$(printf '%s\n' "include/kdn/kdn.h" "$libdir/libkdn.so" "$libdir/libkdn.so.$major" \
             "$libdir/libkdn.so.$version" "$libdir/pkgconfig/kdn.pc" "$libdir/cmake/kdn/kdnConfig.cmake" \
             "$libdir/cmake/kdn/kdnConfigVersion.cmake" "$libdir/cmake/kdn/kdnTargets.cmake" \
             "share/doc/kdn/LICENSE" "share/doc/kdn/NOTICE" "share/doc/kdn/THIRD_PARTY_NOTICES.md" | sort)
installed=$(cd "$prefix" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)
# kdnTargets-<config>.cmake: one per build type.
installed_core=$(echo "$installed" | grep -v -E "^$libdir/cmake/kdn/kdnTargets-[a-z]+\.cmake\$" || true)
if [ "$installed_core" != "$expected" ]; then
  echo "installed:"; echo "$installed" | sed 's/^/  /'
  echo "expected:"; echo "$expected" | sed 's/^/  /'
  fail "the install is not exactly the C ABI (header, libkdn.so, kdn.pc, CMake package) and its licence"
fi
grep -q -E "^$libdir/cmake/kdn/kdnTargets-[a-z]+\.cmake\$" <<< "$installed" ||
  fail "no kdnTargets-<config>.cmake"
cmp -s "$src/capi/include/kdn/kdn.h" "$prefix/include/kdn/kdn.h" || fail "the installed kdn.h is not capi/include/kdn/kdn.h"
[ "$(readlink "$lib/libkdn.so")" = "libkdn.so.$major" ] || fail "libkdn.so does not point to libkdn.so.$major"
[ "$(readlink "$lib/libkdn.so.$major")" = "libkdn.so.$version" ] ||
  fail "libkdn.so.$major does not point to libkdn.so.$version"
[ -f "$lib/libkdn.so.$version" ] && [ ! -L "$lib/libkdn.so.$version" ] || fail "libkdn.so.$version is not a file"

# ---- The library: its SONAME; nothing of the build or source tree --------
dynamic=$(readelf -d "$lib/libkdn.so.$version")
soname=$(echo "$dynamic" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libkdn.so.$major" ] || fail "SONAME is '$soname', not libkdn.so.$major"
runpath=$(grep -E '\((RPATH|RUNPATH)\)' <<< "$dynamic" || true)
if grep -q -F -e "$build" -e "$src" <<< "$runpath"; then
  echo "$runpath"
  fail "the installed libkdn.so has a run path into the build or source tree"
fi
bash "$src/tests/install/runpath_test.sh" readelf "$lib/libkdn.so.$version" ||
  fail "the installed libkdn.so has an empty or relative run path entry"
deps=$(env -u LD_LIBRARY_PATH ldd "$lib/libkdn.so.$version")
if grep -q -F -e "not found" -e "$build" -e "$src" <<< "$deps"; then
  echo "$deps"
  fail "the installed libkdn.so needs a library it cannot find, or one of the build tree"
fi
say "SONAME $soname; its libraries all resolve outside the build tree"

# ---- kdn.pc ----------------------------------------------------------------
export PKG_CONFIG_PATH=$lib/pkgconfig
pc() { pkg-config "$@" kdn || fail "pkg-config $* kdn failed"; }
[ "$(pc --variable=prefix)" = "$prefix" ] || fail "kdn.pc: prefix is '$(pc --variable=prefix)', not $prefix"
[ "$(pc --modversion)" = "$version" ] || fail "kdn.pc: Version is '$(pc --modversion)', not $version"
cflags=$(pc --cflags | sed "s/ *$//")
libs=$(pc --libs | sed "s/ *$//")
[ "$cflags" = "-I$prefix/include" ] || fail "pkg-config --cflags kdn: '$cflags', not -I$prefix/include"
# A prefix outside /usr gets a run path, so that a program linked with these
# flags runs without LD_LIBRARY_PATH.
[ "$libs" = "-L$lib -Wl,-rpath,$lib -lkdn" ] || fail "pkg-config --libs kdn: '$libs', not -L$lib -Wl,-rpath,$lib -lkdn"
say "kdn.pc: $version, $cflags $libs"

# ---- The CMake package's version rule: SameMajorVersion ------------------
next_major=$((major + 1))
minor=$(echo "$version" | cut -d. -f2)
cat > "$work/version_rule.cmake" <<EOF
foreach(request "$major" "$major.0" "$version" "$next_major" "$next_major.0" "$major.$((minor + 1))")
  set(PACKAGE_FIND_VERSION "\${request}")
  string(REPLACE "." ";" parts "\${request}.0.0")
  list(GET parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET parts 2 PACKAGE_FIND_VERSION_PATCH)
  set(PACKAGE_FIND_VERSION_COUNT 3)
  unset(PACKAGE_VERSION_COMPATIBLE)
  include("$lib/cmake/kdn/kdnConfigVersion.cmake")
  message("\${request} \${PACKAGE_VERSION_COMPATIBLE}")
endforeach()
EOF
rule=$(cmake -P "$work/version_rule.cmake" 2>&1 | tr '\n' ' ')
want="$major TRUE $major.0 TRUE $version TRUE $next_major FALSE $next_major.0 FALSE $major.$((minor + 1)) FALSE "
[ "$rule" = "$want" ] || fail "kdnConfigVersion.cmake: requested -> compatible is '$rule', not '$want'"
say "kdnConfigVersion.cmake: $version satisfies $major and $major.0, not $next_major nor $major.$((minor + 1))"

# ---- (a) CMake: find_package(kdn 1 REQUIRED), kdn::kdn --------------------
cmake_args=(-S "$src/examples/c" -B "$work/cmake-build" -G "$generator" -DCMAKE_C_COMPILER="$cc"
            -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo)
[ -n "$san" ] && cmake_args+=(-DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san")
say "(a) cmake ${cmake_args[*]}"
cmake "${cmake_args[@]}" > "$work/cmake.log" 2>&1 || { cat "$work/cmake.log"; fail "configuring examples/c failed"; }
cmake --build "$work/cmake-build" > "$work/build.log" 2>&1 || { cat "$work/build.log"; fail "building examples/c failed"; }
kdn_dir=$(sed -n 's/^kdn_DIR:[A-Z]*=//p' "$work/cmake-build/CMakeCache.txt")
[ "$kdn_dir" = "$lib/cmake/kdn" ] || fail "find_package(kdn) found '$kdn_dir', not $lib/cmake/kdn"
example_cmake=$work/cmake-build/kdn_example

# ---- (b) pkg-config and the C compiler alone ------------------------------
# $san and the pkg-config flags are lists of words.
# shellcheck disable=SC2086
say "(b) $cc -std=c99 -Wall -Wextra -pedantic -Werror $san main.c $cflags $libs"
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -pedantic -Werror $san "$src/examples/c/main.c" $cflags $libs \
  -o "$work/kdn_example_pc" || fail "building examples/c/main.c with pkg-config's flags failed"
example_pc=$work/kdn_example_pc

# ---- Run both: (a) through the run path CMake gave it, (b) kdn.pc's ----------
# (grep reads a variable, never a pipe: with pipefail, grep -q ending the
# pipe early would make a match look like a failure.)
resolves_to_prefix() {  # binary, environment...
  local binary=$1 loads; shift
  loads=$(env -u LD_LIBRARY_PATH "$@" ldd "$binary") || { echo "$loads"; fail "ldd $binary failed"; }
  grep -q -F "libkdn.so.$major => $lib/libkdn.so.$major" <<< "$loads" ||
    { echo "$loads"; fail "$binary does not load $lib/libkdn.so.$major"; }
}
resolves_to_prefix "$example_cmake"
resolves_to_prefix "$example_pc"

skipped=0
run() {  # name, binary, environment...
  local name=$1 binary=$2 rc=0; shift 2
  say "run $name: $binary $models"
  env -u LD_LIBRARY_PATH "$@" "$binary" "$models" || rc=$?
  case $rc in
    0) ;;
    77) skipped=1 ;;
    *) fail "$name: the example exited $rc" ;;
  esac
}
run "(a) find_package" "$example_cmake"
run "(b) pkg-config" "$example_pc"
if [ "$skipped" = 1 ]; then
  [ "${KDN_REQUIRE_MODELS:-0}" = 1 ] && fail "the reference KV is missing under $models (KDN_REQUIRE_MODELS=1)"
  say "SKIPPED running the examples: the reference KV is missing under $models"
  exit 77
fi
say "passed: installed, and examples/c built both ways and ran"

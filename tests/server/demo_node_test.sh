#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kdnd.demo_node: `kdn demo --remote --node ADDRESS --token-file F --namespace NS`
# against a kdnd started here, as an operator's would be: the two engines
# share the KV through it; a token that does not grant the namespace gets no
# KV and the demo says so (exit 1); a missing token file is an error (exit 2).
#   demo_node_test.sh KDN KDND
set -euo pipefail
kdn=$1 kdnd=$2
dir=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$kdnd" token new --file "$dir/team.token" > /dev/null
"$kdnd" token new --file "$dir/other.token" > /dev/null
cat > "$dir/kdnd.toml" <<TOML
[server]
listen = ["unix:$dir/kdnd.sock"]
[[tier]]
kind = "host"
capacity = "256MiB"
[[token]]
token_file = "team.token"
namespaces = ["team"]
[[token]]
token_file = "other.token"
namespaces = ["other"]
TOML
chmod 600 "$dir/kdnd.toml"
"$kdnd" --config "$dir/kdnd.toml" --ready-file "$dir/ready" & pid=$!
for _ in $(seq 600); do [ -s "$dir/ready" ] && break; sleep 0.1; done
[ -s "$dir/ready" ] || fail "kdnd did not start"

demo() { "$kdn" demo --remote --node "unix:$dir/kdnd.sock" --repeats 1 --steps 8 "$@" 2>&1; }
rc=0; out=$(demo --token-file "$dir/team.token" --namespace team) || rc=$?
echo "$out"
[ "$rc" = 0 ] || fail "the demo against the node exited $rc"
grep -q "identical continuations, KV shared through kdnd" <<< "$out" || fail "no shared KV"
grep -q "unix:$dir/kdnd.sock, namespace team" <<< "$out" || fail "it did not say which node and namespace"
if grep -q "kdnd, pid" <<< "$out"; then fail "it started a kdnd of its own"; fi

rc=0; out=$(demo --token-file "$dir/other.token" --namespace team) || rc=$?
echo "$out"
[ "$rc" = 1 ] || fail "a token without the namespace: exit $rc, not 1"
grep -q "got no KV from kdnd (does the token grant namespace team?)" <<< "$out" || fail "no reason given"

rc=0; out=$(demo --token-file "$dir/missing.token" --namespace team) || rc=$?
echo "$out"
[ "$rc" = 2 ] || fail "a missing token file: exit $rc, not 2"
grep -q "no token in $dir/missing.token" <<< "$out" || fail "no reason given"

rc=0; out=$("$kdn" demo --remote --node "unix:$dir/kdnd.sock" 2>&1) || rc=$?
[ "$rc" != 0 ] && grep -q "token-file" <<< "$out" || fail "--node without --token-file: exit $rc: $out"
echo "passed"
